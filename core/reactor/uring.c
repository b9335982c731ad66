/*
 * The io_uring backend: completions, not readiness. A listener has one multishot accept armed;
 * a connection has one multishot receive that picks its buffers from a ring of provided
 * buffers, each handed back to the kernel as soon as on_data returns; sends are SEND or
 * SENDMSG SQEs, one in flight per connection so that bytes keep their order, continued from
 * the completion when the socket took less. Every loop turn makes one io_uring_enter that
 * submits what the previous turn's callbacks queued and waits, with the first timer's
 * deadline as the wait timeout.
 *
 * Batched waits: when at least BATCH_MIN_ACTIVE connections received in the last window
 * (about a millisecond), the wait asks the kernel for as many completions as there are such
 * connections, plus the completions of the sends it submits, and lets it hold them back up
 * to batch_us (the MIN_TIMEOUT wait of kernel 6.12; before that, the wait's timeout is cut to
 * batch_us instead). Under load one wakeup then carries many requests instead of about one.
 * A batched wait that gathers little (clients that send rarely) pauses batching for a while.
 * A lone client, or a few, is never held back. docs/reactor.md has the measurements.
 *
 * Sockets stay blocking (O_NONBLOCK cleared on fds we did not accept ourselves): on an
 * O_NONBLOCK file io_uring returns -EAGAIN instead of arming its internal poll, which would
 * turn completions back into readiness.
 *
 * user_data is either a connection's address with OP_SEND in its low bits (a send must find
 * its connection even after close, to complete its callback), or op | fd << 4 | generation
 * << 36, looked up in the slot table so that a completion for a closed, maybe reused, fd is
 * recognised as stale (its buffer is still recycled).
 *
 * No SQE ever names a closed fd: conns and listeners are closed by an IORING_OP_CLOSE queued
 * behind their last SQE, never by close() while SQEs naming the fd wait in the SQ
 * (close_after_sqes() says why).
 */
#include "reactor/backend.h"

#include "common/error.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum {
    OP_RECV = 1,
    OP_ACCEPT,
    OP_POLL,
    OP_SEND,
    OP_IGNORE,
};
/*
 * liburing maps and unmaps rings with raw system calls that TSan does not see, so a ring
 * mapped where another thread's freed ring was looks like a race with the old ring's writes
 * (issue 18, item 7: test_reactor's workers_count_and_failures, a worker whose setup failed
 * freeing its ring while another worker created one at the same address; 2 runs in 300
 * under load). No ring is shared: the kernel orders the unmap before the new map. Under TSan,
 * mapping and unmapping hold one lock, which TSan does see: a ring that lands where a freed
 * one was is mapped in a critical section after the one that unmapped it, and so after every
 * write to the old ring. (A release after the unmap and an acquire after the map, as here
 * before, missed a map that ran between the other thread's unmap and its release.) Not
 * compiled otherwise: rings are created and freed once per loop.
 */
#if defined(__SANITIZE_THREAD__)
static pthread_mutex_t ring_lifetimes = PTHREAD_MUTEX_INITIALIZER;
#define RING_MAP_BEGIN() pthread_mutex_lock(&ring_lifetimes)
#define RING_MAP_END()   pthread_mutex_unlock(&ring_lifetimes)
#else
#define RING_MAP_BEGIN() ((void)0)
#define RING_MAP_END()   ((void)0)
#endif

#define OP_MASK  UINT64_C(15)
#define BGID     0
#define SEND_MAX (1u << 30) /* an SQE length is 32 bits; larger sends continue */

#ifndef IORING_FEAT_MIN_TIMEOUT
#define IORING_FEAT_MIN_TIMEOUT (1U << 15) /* kernel 6.12; liburing 2.3's headers predate it */
#endif
#define WINDOW_NS            UINT64_C(1000000) /* the activity window of batched waits */
#define BATCH_MAX            256u              /* completions a batched wait asks for, at most */
#define BATCH_MIN_ACTIVE     16u               /* busy conns below which a wait is never batched */
#define BATCH_MIN_YIELD      4u /* completions a batched wait must gather to go on batching */
#define BATCH_BACKOFF_MAX_MS 64u
/* The comparison of batched and plain waits (batch_choice): each tried this long, then the
 * cheaper kept this long; a trial with fewer completions than this says nothing. */
#define TRIAL_NS         UINT64_C(20000000)
#define HOLD_NS          UINT64_C(1000000000)
#define TRIAL_MIN_EVENTS 200u

struct uring_state {
    struct io_uring ring;
    int ring_ok;
    int enabled;
    struct io_uring_buf_ring *br;
    size_t br_bytes;
    unsigned char *bufs;
    size_t bufs_bytes;
    unsigned buf_size;
    unsigned nbufs;
    /* fds to close once every SQE queued so far is submitted (close_after_sqes()'s
     * fallback when no SQE is free for the IORING_OP_CLOSE). */
    int *late_fds;
    unsigned late_n, late_cap;
    /* Conns resumed after a pause, served at the next poll (conn->ready_next). */
    struct shmipc__conn *resumed_head, *resumed_tail;
    int ring_registered; /* enter through ring.enter_ring_fd */
    int min_timeout;     /* the kernel holds completions back (IORING_FEAT_MIN_TIMEOUT) */
    /* Batched waits: sends queued since the last enter, and the activity windows. */
    unsigned sends_queued;
    uint64_t window_start_ns;
    unsigned window;          /* the current window's number, stamped on conns (rx_window) */
    unsigned window_active;   /* conns that received in the current window */
    unsigned last_active;     /* and in the previous one */
    uint64_t last_rx_ns;      /* the turn that last delivered a receive */
    unsigned window_receives; /* receives dispatched in the current window */
    unsigned window_batched;  /* batched waits made in it */
    uint64_t batch_resume_ns;
    uint64_t batch_failed_ns; /* when a batched wait last gathered too little */
    unsigned batch_backoff_ms;
    /* The comparison: its phase, when the phase ends, the CPU clock and completion count at
     * its start, the plain trial's cost (ns per completion; 0: not measured), the choice. */
    int ctl;
    uint64_t ctl_start, ctl_until, ctl_cpu0, ctl_events0;
    /* The plain trial's CPU per completion and completions per second. */
    double cost_plain, rate_plain;
    int ctl_batch;
};

enum { CTL_START, CTL_TRY_PLAIN, CTL_TRY_BATCH, CTL_HOLD };

static struct uring_state *state(struct shmipc__loop *loop)
{
    return loop->be_state;
}

static uint64_t ud_io(const struct shmipc__io *io, unsigned op)
{
    return (uint64_t)io->gen << 36 | (uint64_t)(uint32_t)io->fd << 4 | op;
}

static struct io_uring_sqe *get_sqe(struct shmipc__loop *loop)
{
    struct uring_state *s = state(loop);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
    /* Only a turn that queues more than ring_entries SQEs pays this extra enter. */
    if (sqe == NULL && s->enabled) {
        loop->stats.submits++;
        if (io_uring_submit(&s->ring) >= 0)
            sqe = io_uring_get_sqe(&s->ring);
        /* Those sends' completions may be consumed this turn: count fewer, not more, so that
         * a batched wait never asks for completions that cannot come. */
        s->sends_queued = 0;
    }
    if (sqe == NULL)
        shmipc__fail(SHMIPC_ENOMEM, "io_uring: submission queue full (%u entries)",
                     loop->ring_entries);
    return sqe;
}

static void recycle(struct uring_state *s, unsigned bid)
{
    io_uring_buf_ring_add(s->br, s->bufs + (size_t)bid * s->buf_size, s->buf_size,
                          (unsigned short)bid, io_uring_buf_ring_mask(s->nbufs), 0);
    io_uring_buf_ring_advance(s->br, 1);
}

static int set_blocking(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || ((fl & O_NONBLOCK) != 0 && fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0))
        return shmipc__fail_errno(errno, "fcntl(%d, ~O_NONBLOCK)", fd);
    return 0;
}

static int arm_recv(struct shmipc__loop *loop, struct shmipc__conn *c)
{
    struct io_uring_sqe *sqe = get_sqe(loop);
    if (sqe == NULL)
        return SHMIPC_ENOMEM;
    io_uring_prep_recv_multishot(sqe, c->io.fd, NULL, 0, 0);
    sqe->flags |= IOSQE_BUFFER_SELECT;
    sqe->buf_group = BGID;
    io_uring_sqe_set_data64(sqe, ud_io(&c->io, OP_RECV));
    c->rx_armed = 1;
    return 0;
}

static int arm_accept(struct shmipc__loop *loop, struct shmipc__acceptor *l)
{
    struct io_uring_sqe *sqe = get_sqe(loop);
    if (sqe == NULL)
        return SHMIPC_ENOMEM;
    io_uring_prep_multishot_accept(sqe, l->io.fd, NULL, NULL, SOCK_CLOEXEC);
    io_uring_sqe_set_data64(sqe, ud_io(&l->io, OP_ACCEPT));
    l->armed = 1;
    return 0;
}

static int arm_poll(struct shmipc__loop *loop, struct shmipc__watch *w)
{
    struct io_uring_sqe *sqe = get_sqe(loop);
    unsigned mask = 0;
    if (sqe == NULL)
        return SHMIPC_ENOMEM;
    if ((w->events & SHMIPC__WATCH_READ) != 0)
        mask |= POLLIN;
    if ((w->events & SHMIPC__WATCH_WRITE) != 0)
        mask |= POLLOUT;
    io_uring_prep_poll_multishot(sqe, w->io.fd, mask);
    io_uring_sqe_set_data64(sqe, ud_io(&w->io, OP_POLL));
    return 0;
}

static void cancel(struct shmipc__loop *loop, uint64_t ud)
{
    struct io_uring_sqe *sqe = get_sqe(loop);
    if (sqe == NULL) {
        SHMIPC__LOG(SHMIPC__LOG_ERROR, "reactor: cannot cancel: %s", shmipc__detail());
        return;
    }
    io_uring_prep_cancel64(sqe, ud, IORING_ASYNC_CANCEL_ALL);
    io_uring_sqe_set_data64(sqe, OP_IGNORE);
    sqe->flags |= IOSQE_CQE_SKIP_SUCCESS;
}

/*
 * Closes the fd of a conn or listener being deleted, after every SQE already queued for it.
 *
 * An SQE names a bare fd number, which the kernel resolves to a file only when it submits
 * the SQE, at the next enter. The fd table is the process's, shared by every worker: once
 * close() frees the number, another worker's accept takes it at once, and a send or receive
 * SQE still waiting in this loop's SQ then writes this conn's response to that worker's new
 * client, or reads that client's request (issue 18: 410 of 32,462 checked responses went to
 * the wrong client in 1.5 s, test_server_xtalk). So the close is an SQE itself, queued behind
 * the conn's last SQE (its sends, its receive, their cancels): the kernel issues SQEs in
 * order, each earlier one takes its own reference to the file as it is issued (unlinked, not
 * IOSQE_ASYNC: inline, within the submitting enter), and the CLOSE after them only drops the
 * table's. The number cannot be reused before those SQEs hold the file, and a request still
 * in flight keeps the socket itself alive, as before.
 *
 * Cost: none per request, and per connection one SQE in place of the close() system call
 * (the close rides on the enter that the loop makes anyway; IOSQE_CQE_SKIP_SUCCESS posts no
 * completion). The alternatives: submitting before close() costs an extra enter per closed
 * connection; fixed (registered) files would make every SQE safe by construction but need a
 * table update per accept (or the kernel's direct-descriptor accept, which hands the fd to
 * no one else: TCP_NODELAY and shutdown() on it would need SQEs too).
 *
 * When no SQE can be had (the SQ full and its submission failing), the fd waits in late_fds
 * and is closed once an enter has submitted everything queued before it.
 *
 * This rests on every SQE naming a conn's fd being issued inline by the enter that submits
 * it. Do not add IOSQE_ASYNC, IOSQE_IO_DRAIN or links to the send, receive, accept or poll
 * SQEs, nor set up the ring with SQPOLL, without revisiting it: an SQE punted to io-wq or
 * deferred by a drain resolves its fd later, after the CLOSE may have run.
 */
static void close_after_sqes(struct shmipc__loop *loop, int fd)
{
    struct uring_state *s = state(loop);
    struct io_uring_sqe *sqe = get_sqe(loop);
    if (sqe != NULL) {
        io_uring_prep_close(sqe, fd);
        io_uring_sqe_set_data64(sqe, OP_IGNORE);
        sqe->flags |= IOSQE_CQE_SKIP_SUCCESS;
        return;
    }
    if (s->late_n == s->late_cap) {
        unsigned cap = s->late_cap ? s->late_cap * 2 : 16;
        int *grown = realloc(s->late_fds, cap * sizeof *grown);
        if (grown == NULL) {
            /* A leaked fd is better than a response sent to a stranger: it stays open. */
            SHMIPC__LOG(SHMIPC__LOG_ERROR, "reactor: fd %d left open: no memory to close it", fd);
            return;
        }
        s->late_fds = grown;
        s->late_cap = cap;
    }
    s->late_fds[s->late_n++] = fd;
}

/* Closes the late fds once the kernel has taken every SQE queued before them. */
static void close_late(struct uring_state *s)
{
    if (s->late_n == 0 ||
        s->ring.sq.sqe_tail != __atomic_load_n(s->ring.sq.khead, __ATOMIC_ACQUIRE))
        return;
    for (unsigned i = 0; i < s->late_n; i++)
        close(s->late_fds[i]);
    s->late_n = 0;
}

static void ur_send(struct shmipc__loop *loop, struct shmipc__conn *c)
{
    const struct shmipc__send_req *r = c->tx_head;
    struct io_uring_sqe *sqe;
    struct iovec *iov = c->tx_iov;
    size_t bytes = 0;
    int k;
    if (c->tx_busy || c->io.closed || r == NULL)
        return;
    if (r->next == NULL || r->n - r->idx >= SHMIPC__CONN_TX_IOV) {
        /* A lone request (or a long one) goes from its own iovec array, however long: a
         * batch of pipelined responses leaves in one SENDMSG. */
        iov = r->iov + r->idx;
        k = r->n - r->idx;
        for (int i = 0; i < k; i++)
            bytes += iov[i].iov_len;
    } else {
        /* Several short requests are coalesced into the connection's array. */
        k = shmipc__reactor_gather(c, c->tx_iov, SHMIPC__CONN_TX_IOV, &bytes);
    }
    sqe = get_sqe(loop);
    if (sqe == NULL) {
        shmipc__reactor_send_failed(c, SHMIPC_ENOMEM);
        return;
    }
    if (k == 1) {
        if (bytes > SEND_MAX)
            bytes = SEND_MAX;
        io_uring_prep_send(sqe, c->io.fd, iov[0].iov_base, bytes, MSG_NOSIGNAL);
    } else {
        memset(&c->msg, 0, sizeof c->msg);
        c->msg.msg_iov = iov;
        c->msg.msg_iovlen = (size_t)k;
        io_uring_prep_sendmsg(sqe, c->io.fd, &c->msg, MSG_NOSIGNAL);
    }
    io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)c | OP_SEND);
    state(loop)->sends_queued++;
    c->tx_flight = bytes;
    c->tx_busy = 1;
    c->io.refs++;
}

static void send_done(struct shmipc__loop *loop, struct shmipc__conn *c, int res)
{
    c->tx_busy = 0;
    shmipc__reactor_unref(&c->io);
    if (c->io.closed)
        shmipc__reactor_send_failed(c, SHMIPC_ECLOSED);
    else if (res >= 0) {
        if ((size_t)res < c->tx_flight)
            loop->stats.send_partial++;
        shmipc__reactor_sent(c, (size_t)res);
        ur_send(loop, c);
    } else if (res == -EINTR || res == -EAGAIN) {
        ur_send(loop, c);
    } else {
        shmipc__reactor_send_failed(c, shmipc__code_from_errno(-res));
    }
}

/* The receive of a paused conn ended: an end of input waits for the resume, anything
 * else (the cancel, -ENOBUFS) is re-armed by the resume. */
static void recv_ended_paused(struct shmipc__conn *c, int res)
{
    if (res == 0 || (res < 0 && res != -ECANCELED && res != -ENOBUFS && res != -EINTR)) {
        c->held_end = 1;
        c->held_status = res == 0 ? 0 : shmipc__code_from_errno(-res);
    }
}

static void recv_done(struct shmipc__loop *loop, struct shmipc__conn *c,
                      const struct io_uring_cqe *cqe)
{
    struct uring_state *s = state(loop);
    int res = cqe->res;
    if ((cqe->flags & IORING_CQE_F_BUFFER) != 0) {
        unsigned bid = cqe->flags >> IORING_CQE_BUFFER_SHIFT;
        const unsigned char *data = s->bufs + (size_t)bid * s->buf_size;
        if (c != NULL && res > 0 && (c->rd_paused || c->held_len > 0) && !c->rd_done) {
            /* Completed before the cancel took effect (bounded by what the kernel posted
             * meanwhile), or behind bytes held so: kept in order, and the buffer goes back
             * to the ring now. */
            if (shmipc__reactor_hold(c, data, (size_t)res) < 0) {
                c->held_end = 1;
                c->held_status = SHMIPC_ENOMEM;
            }
        } else if (c != NULL && res > 0) {
            s->last_rx_ns = loop->now_ns;
            s->window_receives++;
            if (c->rx_window != s->window) {
                c->rx_window = s->window;
                s->window_active++;
            }
            shmipc__reactor_data(c, data, (size_t)res);
        }
        recycle(s, bid);
    }
    if (c == NULL || (cqe->flags & IORING_CQE_F_MORE) != 0)
        return;
    c->rx_armed = 0;
    c->rx_cancel = 0;
    if (c->rd_done || c->io.closed)
        return;
    if (c->rd_paused || c->held_len > 0) {
        /* Held bytes go first: the resumed list delivers them, then the end or a new
         * receive. */
        recv_ended_paused(c, res);
        return;
    }
    /* Cancelled by a pause that a resume has undone since: receive again. */
    if (res == -ECANCELED) {
        if (arm_recv(loop, c) < 0)
            shmipc__reactor_end(c, SHMIPC_ENOMEM);
        return;
    }
    /* The kernel ended the multishot receive without an end of input: it ran out of
     * provided buffers (they are back by the next enter) or stopped for its own reasons. */
    if (res > 0 || res == -ENOBUFS || res == -EINTR) {
        if (res == -ENOBUFS)
            loop->stats.enobufs++;
        loop->stats.recv_rearm++;
        if (arm_recv(loop, c) < 0)
            shmipc__reactor_end(c, SHMIPC_ENOMEM);
        return;
    }
    shmipc__reactor_end(c, res == 0 ? 0 : shmipc__code_from_errno(-res));
}

static void accept_done(struct shmipc__loop *loop, struct shmipc__acceptor *l,
                        const struct io_uring_cqe *cqe)
{
    int paused = 0;
    if (l == NULL) {
        /* Accepted just before the listener was closed: nobody wants it. */
        if (cqe->res >= 0)
            close(cqe->res);
        return;
    }
    if (cqe->res >= 0)
        shmipc__reactor_accepted(l, cqe->res);
    else
        paused = shmipc__reactor_accept_error(l, -cqe->res);
    if (l->io.closed || (cqe->flags & IORING_CQE_F_MORE) != 0)
        return;
    l->armed = 0;
    if (!paused && arm_accept(loop, l) < 0)
        SHMIPC__LOG(SHMIPC__LOG_ERROR, "reactor: accept on fd %d: %s", l->io.fd, shmipc__detail());
}

static void poll_done(struct shmipc__loop *loop, struct shmipc__watch *w,
                      const struct io_uring_cqe *cqe)
{
    unsigned ev = 0;
    if (w == NULL)
        return;
    if (cqe->res < 0) {
        SHMIPC__LOG(SHMIPC__LOG_ERROR, "reactor: watch on fd %d: %s", w->io.fd,
                    strerror(-cqe->res));
        return;
    }
    if ((cqe->res & (POLLIN | POLLHUP | POLLERR)) != 0)
        ev |= SHMIPC__WATCH_READ;
    if ((cqe->res & (POLLOUT | POLLHUP | POLLERR)) != 0)
        ev |= SHMIPC__WATCH_WRITE;
    shmipc__reactor_watch_ready(w, ev);
    if (!w->io.closed && (cqe->flags & IORING_CQE_F_MORE) == 0 && arm_poll(loop, w) < 0)
        SHMIPC__LOG(SHMIPC__LOG_ERROR, "reactor: %s", shmipc__detail());
}

static void handle(struct shmipc__loop *loop, const struct io_uring_cqe *cqe)
{
    uint64_t ud = cqe->user_data;
    unsigned op = (unsigned)(ud & OP_MASK);
    struct shmipc__io *io;
    if (op == OP_SEND) {
        send_done(loop, (struct shmipc__conn *)(uintptr_t)(ud & ~OP_MASK), cqe->res);
        return;
    }
    if (op == OP_IGNORE)
        return;
    io = shmipc__reactor_lookup(loop, (int)(uint32_t)(ud >> 4), (uint32_t)(ud >> 36));
    switch (op) {
    case OP_RECV:
        recv_done(loop,
                  io != NULL && io->kind == SHMIPC__IO_CONN ? (struct shmipc__conn *)io : NULL,
                  cqe);
        break;
    case OP_ACCEPT:
        accept_done(loop,
                    io != NULL && io->kind == SHMIPC__IO_ACCEPTOR ? (struct shmipc__acceptor *)io
                                                                  : NULL,
                    cqe);
        break;
    default:
        poll_done(loop,
                  io != NULL && io->kind == SHMIPC__IO_WATCH ? (struct shmipc__watch *)io : NULL,
                  cqe);
        break;
    }
}

static void ur_read_pause(struct shmipc__loop *loop, struct shmipc__conn *c)
{
    /* A multishot receive cannot be suspended, only cancelled; what it completes before the
     * cancel runs is held (recv_done). */
    if (c->rx_armed && !c->rx_cancel) {
        cancel(loop, ud_io(&c->io, OP_RECV));
        c->rx_cancel = 1;
    }
}

static void ur_read_resume(struct shmipc__loop *loop, struct shmipc__conn *c)
{
    struct uring_state *s = state(loop);
    /* A receive still armed (its cancel not yet completed) is re-armed by its last
     * completion; otherwise the resumed list delivers what is held and arms a new one. */
    if (c->in_ready || (c->rx_armed && c->held_len == 0 && !c->held_end))
        return;
    c->in_ready = 1;
    c->io.refs++;
    c->ready_next = NULL;
    if (s->resumed_tail != NULL)
        s->resumed_tail->ready_next = c;
    else
        s->resumed_head = c;
    s->resumed_tail = c;
}

static int run_resumed(struct shmipc__loop *loop)
{
    struct uring_state *s = state(loop);
    struct shmipc__conn *c = s->resumed_head;
    int n = 0;
    s->resumed_head = s->resumed_tail = NULL;
    while (c != NULL) {
        struct shmipc__conn *next = c->ready_next;
        c->in_ready = 0;
        shmipc__reactor_unref(&c->io);
        if (!c->io.closed && !c->rd_paused) {
            shmipc__reactor_deliver_held(c);
            if (!c->io.closed && !c->rd_done && !c->rd_paused && !c->rx_armed &&
                arm_recv(loop, c) < 0)
                shmipc__reactor_end(c, SHMIPC_ENOMEM);
            n++;
        }
        c = next;
    }
    return n;
}

static uint64_t thread_cpu_ns(const struct shmipc__loop *loop)
{
    struct timespec ts;
    if (loop->test_cpu_ns != NULL)
        return loop->test_cpu_ns(loop);
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void ctl_phase(struct shmipc__loop *loop, struct uring_state *s, int phase, uint64_t len)
{
    s->ctl = phase;
    s->ctl_start = loop->now_ns;
    s->ctl_until = loop->now_ns + len;
    s->ctl_cpu0 = thread_cpu_ns(loop);
    s->ctl_events0 = loop->stats.events;
}

/* Completions per second since the phase began. */
static double ctl_rate(const struct shmipc__loop *loop, const struct uring_state *s)
{
    uint64_t ns = loop->now_ns - s->ctl_start;
    return ns > 0 ? (double)(loop->stats.events - s->ctl_events0) * 1e9 / (double)ns : 0;
}

/* The loop thread's CPU ns per completion since the phase began; 0 with too few. */
static double ctl_cost(const struct shmipc__loop *loop, const struct uring_state *s)
{
    uint64_t events = loop->stats.events - s->ctl_events0;
    uint64_t cpu = thread_cpu_ns(loop);
    /* 0 is a failed clock read (at either end): not measured. */
    if (events < TRIAL_MIN_EVENTS || s->ctl_cpu0 == 0 || cpu <= s->ctl_cpu0)
        return 0;
    return (double)(cpu - s->ctl_cpu0) / (double)events;
}

/*
 * Whether a wait under batching load should be batched. Whether batching pays depends on
 * the machine (the cost of a wakeup against that of the timer a batched wait arms) and on
 * how many requests a plain wait already finds: so the loop measures. Under load, plain waits
 * for TRIAL_NS, then batched ones for TRIAL_NS, each timed by the thread's CPU clock per
 * completion. Batching is kept for HOLD_NS when the thread was busy at least half the plain
 * trial (below that, CPU is not what is short, and the latency batching adds is not worth
 * it), batching cost at least 10 % less per completion, and the completions kept coming at
 * 97 % of the plain trial's rate or more (clients that wait for their answers send less when
 * answers are held back: on a loaded host, where a 50 µs timer fires late, a closed loop
 * lost 16 % of its requests); else plain waits are. Then the comparison runs again. Load
 * that stops ends a trial unjudged.
 */
static int batch_choice(struct shmipc__loop *loop, struct uring_state *s)
{
    double cost;
    int busy;
    if (loop->batch_always)
        return 1;
    switch (s->ctl) {
    case CTL_START:
        ctl_phase(loop, s, CTL_TRY_PLAIN, TRIAL_NS);
        return 0;
    case CTL_TRY_PLAIN:
        if (loop->now_ns < s->ctl_until)
            return 0;
        s->cost_plain = ctl_cost(loop, s);
        s->rate_plain = ctl_rate(loop, s);
        ctl_phase(loop, s, CTL_TRY_BATCH, TRIAL_NS);
        return 1;
    case CTL_TRY_BATCH:
        if (loop->now_ns < s->ctl_until)
            return 1;
        cost = ctl_cost(loop, s);
        /* The plain trial's busy share: CPU per completion x completions per second. */
        busy = s->cost_plain * s->rate_plain / 1e9 >= 0.5;
        /* A fake CPU clock (tests) comes with real time, whose rate a test cannot steer. */
        s->ctl_batch = busy && s->cost_plain > 0 && cost > 0 && cost < s->cost_plain * 0.9 &&
                       (loop->test_cpu_ns != NULL || ctl_rate(loop, s) >= s->rate_plain * 0.97);
        loop->stats.batch_trials++;
        loop->stats.batch_idle += (uint64_t)!busy;
        loop->stats.batch_chosen += (uint64_t)s->ctl_batch;
        ctl_phase(loop, s, CTL_HOLD, HOLD_NS);
        return s->ctl_batch;
    default:
        if (loop->now_ns < s->ctl_until)
            return s->ctl_batch;
        s->ctl = CTL_START;
        return batch_choice(loop, s);
    }
}

/*
 * At the end of a window with batched waits: the receives it dispatched per batched wait. A
 * batched wait that gathers fewer than BATCH_MIN_YIELD cost its timer and its clients'
 * latency for little (clients that send rarely, or too few of them to keep requests in flight
 * while the others wait), so batching pauses: for 1 ms, twice as long after each such window
 * in a row (within a second of the last), up to BATCH_BACKOFF_MAX_MS. Counted per window, not
 * per wait: the kernel may post part of what a wait gathered only at the next enter.
 */
static void batch_judge(struct shmipc__loop *loop, struct uring_state *s)
{
    if (s->window_receives >= BATCH_MIN_YIELD * s->window_batched) {
        s->batch_backoff_ms = 1;
        return;
    }
    loop->stats.batch_backoffs++;
    if (loop->now_ns - s->batch_failed_ns > UINT64_C(1000000000))
        s->batch_backoff_ms = 1;
    s->batch_failed_ns = loop->now_ns;
    s->batch_resume_ns = loop->now_ns + (uint64_t)s->batch_backoff_ms * 1000000;
    if (s->batch_backoff_ms < BATCH_BACKOFF_MAX_MS)
        s->batch_backoff_ms *= 2;
}

/*
 * How many receive completions the next wait may gather: the conns that received in this
 * window or the previous one, when there are at least BATCH_MIN_ACTIVE of them and batching
 * has not been paying too little lately; else 0, a plain wait for one completion.
 */
static unsigned batch_target(struct shmipc__loop *loop, struct uring_state *s)
{
    uint64_t age = loop->now_ns - s->window_start_ns;
    unsigned active;
    if (age >= WINDOW_NS) {
        if (s->window_batched > 0)
            batch_judge(loop, s);
        s->window_batched = 0;
        s->window_receives = 0;
        /* The window's conns count for the next one too while traffic goes on (a receive
         * less than a window ago), however long the turns in between took. */
        s->last_active = loop->now_ns - s->last_rx_ns < WINDOW_NS ? s->window_active : 0;
        s->window_active = 0;
        s->window++;
        s->window_start_ns = loop->now_ns;
    }
    active = s->window_active > s->last_active ? s->window_active : s->last_active;
    if (loop->batch_us == 0 || active < BATCH_MIN_ACTIVE) {
        if (s->ctl == CTL_TRY_PLAIN || s->ctl == CTL_TRY_BATCH)
            s->ctl = CTL_START; /* the load went: a trial would compare unlike loads */
        return 0;
    }
    if (!batch_choice(loop, s) || loop->now_ns < s->batch_resume_ns)
        return 0;
    return active < BATCH_MAX ? active : BATCH_MAX;
}

/*
 * io_uring_submit_and_wait_timeout() with a wait for more than one completion and the
 * kernel's minimum timeout, which liburing 2.3 cannot ask for: publishes the queued SQEs as
 * liburing does, then makes the one enter. Returns what the enter returns, or -errno.
 */
static int submit_and_wait(struct shmipc__loop *loop, struct uring_state *s, int64_t timeout_ns)
{
    struct io_uring_sq *sq = &s->ring.sq;
    struct io_uring_getevents_arg arg;
    struct __kernel_timespec ts;
    unsigned flags = IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG;
    unsigned wait_nr = 1, target = batch_target(loop, s), submit;
    int64_t batch_ns = (int64_t)loop->batch_us * 1000;
    long rc;

    if (sq->sqe_head != sq->sqe_tail) {
        sq->sqe_head = sq->sqe_tail;
        __atomic_store_n(sq->ktail, sq->sqe_tail, __ATOMIC_RELEASE);
    }
    submit = sq->sqe_tail - __atomic_load_n(sq->khead, __ATOMIC_ACQUIRE);
    memset(&arg, 0, sizeof arg);
    arg.sigmask_sz = _NSIG / 8;
    /* Completions already in the CQ (left by the previous turn's budget) are served now. */
    if (target > 0 && timeout_ns != 0 && io_uring_cq_ready(&s->ring) == 0) {
        /* The sends complete as they are submitted, mostly: their completions do not count
         * toward the batch. A send that waits for socket space instead makes the batch one
         * short, which the time bound covers. */
        wait_nr = s->sends_queued + target;
        s->window_batched++;
        if (timeout_ns > 0 && timeout_ns <= batch_ns)
            ; /* the first timer ends the wait before batch_us would */
        else if (s->min_timeout)
            arg.pad = loop->batch_us; /* min_wait_usec in kernel 6.12's layout */
        else
            timeout_ns = batch_ns;
        loop->stats.batched++;
    }
    s->sends_queued = 0;
    if (timeout_ns >= 0) {
        ts.tv_sec = timeout_ns / 1000000000;
        ts.tv_nsec = timeout_ns % 1000000000;
        arg.ts = (uint64_t)(uintptr_t)&ts;
    }
    if (s->ring_registered)
        flags |= IORING_ENTER_REGISTERED_RING;
    rc = syscall(__NR_io_uring_enter, s->ring_registered ? s->ring.enter_ring_fd : s->ring.ring_fd,
                 submit, wait_nr, flags, &arg, sizeof arg);
    return rc < 0 ? -errno : (int)rc;
}

static int ur_poll(struct shmipc__loop *loop, int64_t timeout_ns)
{
    struct uring_state *s = state(loop);
    struct io_uring_cqe *cqe;
    int n = 0;
    int resumed = 0;
    int rc;

    if (s->resumed_head != NULL) {
        /* Before waiting: a resumed conn's held bytes must not wait for unrelated events,
         * and its new receive goes out with this enter. */
        resumed = run_resumed(loop);
        timeout_ns = 0;
    }

    if (!s->enabled) {
        /* The ring was created disabled so that the thread that runs the loop, not the one
         * that created it, becomes its single issuer. Debian's liburing 2.3 declares
         * io_uring_enable_rings() but does not export it, hence the raw system call. */
        if (syscall(__NR_io_uring_register, s->ring.ring_fd, IORING_REGISTER_ENABLE_RINGS, NULL,
                    0) < 0)
            return shmipc__fail_errno(errno, "io_uring_register(ENABLE_RINGS)");
        s->enabled = 1;
        /* Saves the fd lookup on every enter; optional, so a failure only costs that. */
        s->ring_registered = io_uring_register_ring_fd(&s->ring) == 1;
        if (!s->ring_registered)
            SHMIPC__LOG(SHMIPC__LOG_DEBUG, "reactor: io_uring_register_ring_fd failed");
    }
    /* Completions left by the previous turn's budget are served without entering, unless
     * there is something to submit. */
    if (io_uring_cq_ready(&s->ring) == 0 || io_uring_sq_ready(&s->ring) > 0) {
        loop->stats.waits++;
        rc = submit_and_wait(loop, s, timeout_ns);
        if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EBUSY && rc != -EAGAIN)
            return shmipc__fail_errno(-rc, "io_uring_enter");
        close_late(s);
        /* The turn's clock was read before the wait: callbacks start timers from it. */
        if (timeout_ns != 0) {
            uint64_t before = loop->now_ns;
            loop->now_ns = shmipc__reactor_now_ns(loop);
            /* A trial that slept through a window saw the load stop: it starts again. */
            if (loop->now_ns - before >= WINDOW_NS &&
                (s->ctl == CTL_TRY_PLAIN || s->ctl == CTL_TRY_BATCH))
                s->ctl = CTL_START;
        }
    }
    while (n < (int)loop->max_events && io_uring_peek_cqe(&s->ring, &cqe) == 0) {
        /* Copied and consumed first, so a callback that submits cannot run the CQ over. */
        struct io_uring_cqe c = *cqe;
        io_uring_cqe_seen(&s->ring, cqe);
        handle(loop, &c);
        n++;
    }
    loop->stats.events += (uint64_t)n;
    return n + resumed;
}

static int ur_add(struct shmipc__loop *loop, struct shmipc__io *io, int fresh)
{
    int rc = 0;
    switch (io->kind) {
    case SHMIPC__IO_CONN:
        if (!fresh)
            rc = set_blocking(io->fd);
        return rc < 0 ? rc : arm_recv(loop, (struct shmipc__conn *)io);
    case SHMIPC__IO_ACCEPTOR: {
        struct shmipc__acceptor *l = (struct shmipc__acceptor *)io;
        if (l->armed)
            return 0;
        rc = set_blocking(io->fd);
        return rc < 0 ? rc : arm_accept(loop, l);
    }
    default:
        return arm_poll(loop, (struct shmipc__watch *)io);
    }
}

static void ur_del(struct shmipc__loop *loop, struct shmipc__io *io)
{
    /* Requests are cancelled by user_data, not by fd; the fd is closed by an SQE behind
     * them (close_after_sqes()). The kernel keeps its own reference to the socket until the
     * cancellations run at the next enter, and only then does the peer see the FIN. A
     * watch's fd stays its owner's: its poll SQE is cancelled, and a poll moves no data. */
    switch (io->kind) {
    case SHMIPC__IO_CONN: {
        struct shmipc__conn *c = (struct shmipc__conn *)io;
        cancel(loop, ud_io(io, OP_RECV));
        if (c->tx_busy)
            cancel(loop, (uint64_t)(uintptr_t)c | OP_SEND);
        close_after_sqes(loop, io->fd);
        break;
    }
    case SHMIPC__IO_ACCEPTOR:
        if (((struct shmipc__acceptor *)io)->armed)
            cancel(loop, ud_io(io, OP_ACCEPT));
        close_after_sqes(loop, io->fd);
        break;
    default:
        cancel(loop, ud_io(io, OP_POLL));
        break;
    }
}

/*
 * At teardown: the CLOSE SQEs that no enter submitted (a loop freed off its thread, or one
 * that never ran) are done here, since nothing will submit the SQEs before them either.
 */
static void close_unsubmitted(struct uring_state *s)
{
    struct io_uring_sq *sq = &s->ring.sq;
    for (unsigned i = __atomic_load_n(sq->khead, __ATOMIC_ACQUIRE); i != sq->sqe_tail; i++) {
        const struct io_uring_sqe *sqe = &sq->sqes[i & sq->ring_mask];
        if (sqe->opcode == IORING_OP_CLOSE)
            close(sqe->fd);
    }
    sq->sqe_head = sq->sqe_tail = __atomic_load_n(sq->khead, __ATOMIC_ACQUIRE);
    for (unsigned i = 0; i < s->late_n; i++)
        close(s->late_fds[i]);
    s->late_n = 0;
}

static void ur_destroy(struct shmipc__loop *loop)
{
    struct uring_state *s = state(loop);
    if (s == NULL)
        return;
    for (struct shmipc__conn *c = s->resumed_head; c != NULL; c = c->ready_next)
        shmipc__reactor_unref(&c->io);
    if (s->ring_ok) {
        close_unsubmitted(s);
        RING_MAP_BEGIN();
        io_uring_queue_exit(&s->ring);
        RING_MAP_END();
    }
    if (s->br != NULL)
        munmap(s->br, s->br_bytes);
    if (s->bufs != NULL)
        munmap(s->bufs, s->bufs_bytes);
    free(s->late_fds);
    free(s);
    loop->be_state = NULL;
}

/* Set-up failures carry their errno to the caller, which decides about the epoll fallback. */
static int setup_failed(int *setup_errno, int err, const char *what)
{
    *setup_errno = err;
    if (err == ENOSYS || err == EOPNOTSUPP)
        return shmipc__fail(SHMIPC_ENOTSUP, "%s: %s", what, strerror(err));
    return shmipc__fail_errno(err, "%s", what);
}

/* liburing 2.3 has no io_uring_setup_buf_ring(); this is what it does. */
static int setup_buf_ring(struct shmipc__loop *loop, struct uring_state *s, int *setup_errno)
{
    struct io_uring_buf_reg reg;
    int rc;
    s->nbufs = loop->recv_buf_count;
    s->buf_size = (unsigned)loop->recv_buf_size;
    s->br_bytes = s->nbufs * sizeof(struct io_uring_buf);
    s->br = mmap(NULL, s->br_bytes, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
    if (s->br == MAP_FAILED) {
        s->br = NULL;
        return setup_failed(setup_errno, errno, "io_uring: buffer ring");
    }
    s->bufs_bytes = (size_t)s->nbufs * s->buf_size;
    s->bufs = mmap(NULL, s->bufs_bytes, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
    if (s->bufs == MAP_FAILED) {
        s->bufs = NULL;
        return setup_failed(setup_errno, errno, "io_uring: receive buffers");
    }
    memset(&reg, 0, sizeof reg);
    reg.ring_addr = (uint64_t)(uintptr_t)s->br;
    reg.ring_entries = s->nbufs;
    reg.bgid = BGID;
    rc = io_uring_register_buf_ring(&s->ring, &reg, 0);
    if (rc < 0)
        return setup_failed(setup_errno, rc == -EINVAL ? EOPNOTSUPP : -rc,
                            "io_uring_register_buf_ring (kernel 5.19+)");
    io_uring_buf_ring_init(s->br);
    for (unsigned i = 0; i < s->nbufs; i++)
        io_uring_buf_ring_add(s->br, s->bufs + (size_t)i * s->buf_size, s->buf_size,
                              (unsigned short)i, io_uring_buf_ring_mask(s->nbufs), (int)i);
    io_uring_buf_ring_advance(s->br, (int)s->nbufs);
    return 0;
}

static int ur_init(struct shmipc__loop *loop, int *setup_errno)
{
    struct uring_state *s = NULL;
    struct io_uring_params p;
    struct io_uring_probe *probe = NULL;
    int rc;

    if (loop->test_uring_setup_errno > 0)
        return setup_failed(setup_errno, loop->test_uring_setup_errno,
                            "io_uring_queue_init (test hook)");
    s = calloc(1, sizeof *s);
    if (s == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "io_uring backend");
    loop->be_state = s;
    /* One issuer with deferred task work: completions are processed only inside our own
     * enter, never by interrupting the thread, which is the intended mode for one ring per
     * thread. Kernels before 6.1 refuse these flags and get a plain ring. */
    memset(&p, 0, sizeof p);
    p.flags = IORING_SETUP_SUBMIT_ALL | IORING_SETUP_CQSIZE | IORING_SETUP_CLAMP |
              IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_R_DISABLED;
    p.cq_entries = loop->ring_entries * 4;
    RING_MAP_BEGIN();
    rc = io_uring_queue_init_params(loop->ring_entries, &s->ring, &p);
    if (rc == -EINVAL) {
        memset(&p, 0, sizeof p);
        p.flags = IORING_SETUP_CQSIZE | IORING_SETUP_CLAMP;
        p.cq_entries = loop->ring_entries * 4;
        rc = io_uring_queue_init_params(loop->ring_entries, &s->ring, &p);
    }
    RING_MAP_END();
    if (rc < 0) {
        rc = setup_failed(setup_errno, -rc, "io_uring_queue_init");
        goto err;
    }
    s->ring_ok = 1;
    s->enabled = (p.flags & IORING_SETUP_R_DISABLED) == 0;
    s->min_timeout = (p.features & IORING_FEAT_MIN_TIMEOUT) != 0;
    s->window = 1; /* a new conn's rx_window is 0: its first receive counts */
    s->batch_backoff_ms = 1;
    if ((p.features & IORING_FEAT_EXT_ARG) == 0 || (p.features & IORING_FEAT_NODROP) == 0) {
        rc = setup_failed(setup_errno, EOPNOTSUPP, "io_uring: kernel lacks EXT_ARG/NODROP");
        goto err;
    }
    /* Multishot receive (6.0) cannot be probed; SEND_ZC arrived in the same release. */
    probe = io_uring_get_probe_ring(&s->ring);
    if (probe == NULL || !io_uring_opcode_supported(probe, IORING_OP_SEND_ZC)) {
        rc = setup_failed(setup_errno, EOPNOTSUPP,
                          "io_uring: kernel older than 6.0 (no multishot receive)");
        goto err;
    }
    rc = setup_buf_ring(loop, s, setup_errno);
    if (rc < 0)
        goto err;
    io_uring_free_probe(probe);
    return 0;
err:
    if (probe != NULL)
        io_uring_free_probe(probe);
    ur_destroy(loop);
    return rc;
}

const struct shmipc__backend shmipc__backend_uring = {
    .name = "io_uring",
    .init = ur_init,
    .destroy = ur_destroy,
    .add = ur_add,
    .del = ur_del,
    .send = ur_send,
    .read_pause = ur_read_pause,
    .read_resume = ur_read_resume,
    .poll = ur_poll,
};
