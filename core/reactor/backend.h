/*
 * Private to core/reactor/: the loop's internals and the backend interface. As in redis `ae`,
 * shared code calls the backend through a handful of functions and never asks which backend
 * it is; epoll.c and uring.c each implement the interface once.
 */
#ifndef SHMIPC_CORE_REACTOR_BACKEND_H
#define SHMIPC_CORE_REACTOR_BACKEND_H

#include "reactor/loop.h"

#include <stdatomic.h>
#include <stdint.h>
#include <sys/socket.h>

enum shmipc__io_kind {
    SHMIPC__IO_CONN = 1,
    SHMIPC__IO_ACCEPTOR,
    SHMIPC__IO_WATCH,
};

/*
 * Generations are 28 bits so that io_uring's user_data holds an op (4 bits), the fd (32) and
 * the generation; epoll's data.u64 holds the fd and the generation.
 */
#define SHMIPC__GEN_BITS 28
#define SHMIPC__GEN_MASK ((UINT32_C(1) << SHMIPC__GEN_BITS) - 1)

/* The part every handle starts with; the slot table maps an fd to it. */
struct shmipc__io {
    int fd;
    uint32_t gen;
    uint8_t kind;
    uint8_t closed;
    /* Reasons the memory must outlive a close: SQEs carrying its address, send callbacks
     * still due, a place on the epoll backend's ready list. */
    unsigned refs;
    struct shmipc__io *closing_next;
};

/* One send or sendv, from the loop's pool. Its iovec array is ours, advanced in place: inline
 * up to SHMIPC__REQ_INLINE_IOV buffers (header and body), from the loop's pool of arrays up to
 * SHMIPC__REQ_POOL_IOV (a batch of pipelined responses), from the heap beyond. */
#define SHMIPC__REQ_INLINE_IOV 4
#define SHMIPC__REQ_POOL_IOV   64
struct shmipc__send_req {
    struct shmipc__send_req *next;
    struct shmipc__conn *conn;
    shmipc__send_cb cb;
    void *data;
    struct iovec *iov; /* inline_iov, a pooled array or a heap array, by n */
    int idx;           /* first iovec not yet sent in full */
    int n;
    int status;
    struct iovec inline_iov[SHMIPC__REQ_INLINE_IOV];
};

#define SHMIPC__CONN_TX_IOV 8

struct shmipc__conn {
    struct shmipc__io io;
    struct shmipc__loop *loop;
    struct shmipc__conn_cbs cbs;
    void *data;
    struct shmipc__send_req *tx_head, *tx_tail;
    size_t tx_bytes;
    int tx_error;         /* why sends are refused now (shut down, failed), or 0 */
    uint8_t rd_done;      /* on_end was delivered (or the conn is closed) */
    uint8_t shut_pending; /* shutdown(SHUT_WR) once the queue is empty */
    uint8_t tx_blocked;   /* epoll: the socket said EAGAIN; wait for EPOLLOUT */
    uint8_t tx_busy;      /* io_uring: a send SQE is in flight */
    uint8_t in_ready;     /* epoll: on the ready list (read budget exhausted) */
    uint8_t rd_hup;       /* epoll: the peer's FIN was signalled; read until 0 */
    uint8_t rd_paused;    /* shmipc__conn_pause_read(): no on_data/on_end until resumed */
    uint8_t rx_armed;     /* io_uring: a multishot receive is in the kernel (or the SQ) */
    uint8_t rx_cancel;    /* io_uring: a cancel of that receive is on its way */
    uint8_t held_end;     /* io_uring: the input ended while paused; held_status says how */
    uint8_t hup_told;     /* on_hup was called during this pause */
    uint8_t hup_armed;    /* io_uring: a poll for the peer's hangup (while paused) is armed */
    int held_status;
    unsigned rx_window; /* io_uring: the activity window it last received in (batched waits) */
    /* io_uring: bytes that completed after a pause, delivered first on resume. */
    char *held;
    size_t held_len, held_cap;
    /* epoll: the ready list (read budget exhausted, or resumed); io_uring: the resumed list. */
    struct shmipc__conn *ready_next;
    /* io_uring: the in-flight SENDMSG's header, and its iovecs when short requests are
     * coalesced; stable until the completion. */
    struct msghdr msg;
    struct iovec tx_iov[SHMIPC__CONN_TX_IOV];
    size_t tx_flight; /* io_uring: bytes of the send in flight */
} __attribute__((aligned(16)));

struct shmipc__acceptor {
    struct shmipc__io io;
    struct shmipc__loop *loop;
    struct shmipc__conn_cbs cbs;
    shmipc__accept_cb on_accept;
    void *data;
    struct shmipc__timer retry; /* accepting again after EMFILE, or after the budget ran out */
    uint8_t armed;              /* epoll: registered; io_uring: a multishot accept is armed */
};

struct shmipc__watch {
    struct shmipc__io io;
    struct shmipc__loop *loop;
    unsigned events;
    shmipc__watch_cb cb;
    void *data;
};

/* A fixed-size object pool: chunks allocated once, objects recycled through a free list. */
struct shmipc__objpool {
    size_t size;
    unsigned per_chunk;
    void *free;
    void *chunks;
};

struct shmipc__slot {
    struct shmipc__io *io;
    uint32_t gen;
};

struct shmipc__backend {
    const char *name;
    /* Sets up loop->be_state. Returns 0 or a negative code with shmipc__fail() detail; the
     * errno behind an io_uring set-up failure goes to *setup_errno for the auto fallback. */
    int (*init)(struct shmipc__loop *loop, int *setup_errno);
    void (*destroy)(struct shmipc__loop *loop);
    /* Starts a handle: receiving on a conn, accepting on a listener, watching. `fresh` means
     * the fd came from this backend's own accept, already in the mode it wants. */
    int (*add)(struct shmipc__loop *loop, struct shmipc__io *io, int fresh);
    /* Stops a handle; closes the fd of conns and listeners (watch fds stay open). */
    void (*del)(struct shmipc__loop *loop, struct shmipc__io *io);
    /* Hands the conn's send queue to the kernel (now, or at the next wait). */
    void (*send)(struct shmipc__loop *loop, struct shmipc__conn *conn);
    /* Input of the conn stops (conn->rd_paused was just set) or starts again (just cleared).
     * Resuming delivers what is waiting from a later turn, never inside the call. */
    void (*read_pause)(struct shmipc__loop *loop, struct shmipc__conn *conn);
    void (*read_resume)(struct shmipc__loop *loop, struct shmipc__conn *conn);
    /* Optional: a non-blocking receive into the caller's memory, for shmipc__conn_read_now().
     * Only a backend whose received bytes never wait outside the socket (epoll: they are
     * delivered from the call that read them) can offer it without reordering input; io_uring
     * leaves it NULL, since completions already in its queue may hold earlier bytes. */
    size_t (*read_now)(struct shmipc__loop *loop, struct shmipc__conn *conn, void *buf, size_t len);
    /* Waits up to timeout_ns (-1: no limit) and dispatches at most max_events. Returns the
     * number dispatched or a negative code. */
    int (*poll)(struct shmipc__loop *loop, int64_t timeout_ns);
};

extern const struct shmipc__backend shmipc__backend_epoll;
extern const struct shmipc__backend shmipc__backend_uring;

struct shmipc__loop {
    const struct shmipc__backend *be;
    void *be_state;

    struct shmipc__slot *slots;
    size_t nslots;
    unsigned handles;

    size_t recv_buf_size;
    unsigned recv_buf_count;
    unsigned max_events;
    unsigned reads_per_event;
    unsigned ring_entries;
    unsigned batch_us; /* 0: no batched waits */
    int batch_always;
    uint64_t (*test_cpu_ns)(const struct shmipc__loop *loop);
    uint64_t (*test_clock_ns)(const struct shmipc__loop *loop); /* NULL: CLOCK_MONOTONIC */
    enum shmipc__rx_mode rx_mode;
    int test_uring_setup_errno;

    uint64_t now_ns;
    int in_turn;
    struct shmipc__timer **heap;
    size_t heap_len, heap_cap;
    uint64_t timer_seq;

    struct shmipc__objpool conn_pool;
    struct shmipc__objpool req_pool;
    struct shmipc__objpool iov_pool;
    struct shmipc__send_req *done_head, *done_tail;
    struct shmipc__io *closing;

    int wake_fd;
    struct shmipc__watch *wake;
    atomic_int stop;
    atomic_uintptr_t owner;

    struct shmipc__loop_stats stats;
};

/* ---- shared code the backends call (loop.c, conn.c, timer.c) ---- */

/* The handle registered for fd with generation gen, or NULL (counted as stale). */
struct shmipc__io *shmipc__reactor_lookup(struct shmipc__loop *loop, int fd, uint32_t gen);

/* A backend accepted fd on listener l. */
void shmipc__reactor_accepted(struct shmipc__acceptor *l, int fd);

/* Accepting failed with errno err; the listener retries later. Returns 1 when the backend
 * should stop accepting until the retry timer calls add() again. */
int shmipc__reactor_accept_error(struct shmipc__acceptor *l, int err);

/* Received bytes, the peer's FIN (status 0) or a receive error (negative code). */
void shmipc__reactor_data(struct shmipc__conn *c, const void *data, size_t len);
void shmipc__reactor_end(struct shmipc__conn *c, int status);
/* The peer hung up while reading is paused: on_hup, once, if the owner asked for it. */
void shmipc__reactor_paused_hup(struct shmipc__conn *c);
/* io_uring: keeps bytes that completed while the conn was paused (SHMIPC_ENOMEM), and hands
 * them (then a held end of input) to the owner once it is not paused. */
int shmipc__reactor_hold(struct shmipc__conn *c, const void *data, size_t len);
void shmipc__reactor_deliver_held(struct shmipc__conn *c);

/* Fills iov with the unsent part of the queue; returns the count and the total in *bytes. */
int shmipc__reactor_gather(const struct shmipc__conn *c, struct iovec *iov, int max, size_t *bytes);

/* The kernel took n bytes from the front of the queue. */
void shmipc__reactor_sent(struct shmipc__conn *c, size_t n);

/* Sending failed: every queued send completes with `code`, and later sends are refused. */
void shmipc__reactor_send_failed(struct shmipc__conn *c, int code);

/* Readiness of a watch. */
void shmipc__reactor_watch_ready(struct shmipc__watch *w, unsigned events);

/* Releases one reference taken by a backend (conn->io.refs). */
static inline void shmipc__reactor_unref(struct shmipc__io *io)
{
    io->refs--;
}

/* Timers (timer.c). */
int64_t shmipc__timers_next_ns(struct shmipc__loop *loop);
int shmipc__timers_run(struct shmipc__loop *loop);
void shmipc__timers_free(struct shmipc__loop *loop);

/* The slot table (loop.c): register gives io the fd's next generation. */
int shmipc__reactor_register(struct shmipc__loop *loop, struct shmipc__io *io);
void shmipc__reactor_unregister(struct shmipc__loop *loop, struct shmipc__io *io);

/* Pools (loop.c). */
void *shmipc__objpool_get(struct shmipc__objpool *p);
void shmipc__objpool_put(struct shmipc__objpool *p, void *obj);

/* Conn internals (conn.c) used by loop.c. */
int shmipc__reactor_run_done(struct shmipc__loop *loop);
void shmipc__reactor_reclaim(struct shmipc__loop *loop);
/* After the backend is gone: completes every send still queued and frees every handle. */
void shmipc__reactor_force_reclaim(struct shmipc__loop *loop);
void shmipc__reactor_close_io(struct shmipc__io *io);

int shmipc__reactor_on_thread(const struct shmipc__loop *loop);
uint64_t shmipc__reactor_clock_ns(void);
/* The loop's clock: shmipc__reactor_clock_ns(), or the test's (loop_opts.test_clock_ns). */
uint64_t shmipc__reactor_now_ns(const struct shmipc__loop *loop);

#endif
