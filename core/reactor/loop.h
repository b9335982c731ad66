/*
 * The reactor: one event loop per worker thread, completion style, so that io_uring and epoll
 * fit behind the same calls. Nothing outside core/reactor/ knows which backend runs; see
 * docs/reactor.md for what each backend does per request.
 *
 * Threading: a loop belongs to one thread. It is bound to the thread that created it until a
 * thread calls shmipc__loop_run() or shmipc__loop_run_once(), which binds it to that thread
 * (an io_uring loop then stays bound to it for good). Every function below must be called on
 * the owning thread, except shmipc__loop_stop(). Calls that return int refuse a foreign thread
 * with SHMIPC_EBUSY. Callbacks run on the owning thread, from inside run/run_once, never from
 * inside the call that caused them.
 */
#ifndef SHMIPC_CORE_REACTOR_LOOP_H
#define SHMIPC_CORE_REACTOR_LOOP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "common/unixsock.h"

struct shmipc__loop;
struct shmipc__conn;
struct shmipc__acceptor;
struct shmipc__watch;
struct shmipc__timer;

/** Which backend a loop runs on. */
enum shmipc__backend_kind {
    SHMIPC__BACKEND_DEFAULT = 0, /**< SHMIPC_REACTOR_BACKEND, or auto when unset */
    SHMIPC__BACKEND_AUTO,        /**< io_uring, or epoll when io_uring cannot be set up */
    SHMIPC__BACKEND_IO_URING,    /**< io_uring or fail */
    SHMIPC__BACKEND_EPOLL,
};

/** How the epoll backend waits for input (io_uring ignores it). */
enum shmipc__rx_mode {
    SHMIPC__RX_DEFAULT = 0, /**< SHMIPC_RX_EPOLL, or persistent when unset */
    SHMIPC__RX_PERSISTENT,  /**< registered once, edge-triggered, never re-armed */
    SHMIPC__RX_ONESHOT,     /**< EPOLLONESHOT, re-armed with EPOLL_CTL_MOD after each read */
};

/** Loop options; zero means the default for every field. */
struct shmipc__loop_opts {
    enum shmipc__backend_kind backend; /**< overrides SHMIPC_REACTOR_BACKEND */
    enum shmipc__rx_mode rx_epoll;     /**< overrides SHMIPC_RX_EPOLL */
    size_t recv_buf_size;              /**< bytes per receive buffer; default 16 KiB */
    unsigned recv_buf_count;           /**< io_uring provided buffers, a power of two; 256 */
    unsigned max_events;               /**< events or completions dispatched per turn; 256 */
    unsigned reads_per_event;          /**< epoll reads of one conn per turn; 16 */
    unsigned ring_entries;             /**< io_uring submission queue size; 1024 */
    /** io_uring batched waits: how long (µs) a wait may hold back completions to gather those
     *  of other busy connections; 0: SHMIPC_REACTOR_BATCH_US, else 50; negative: off. */
    int batch_us;
    /** io_uring batched waits: 0 measures now and then the loop thread's CPU time per
     *  completion with and without batching and keeps the cheaper; 1 batches whenever the
     *  load allows (tests, measurements). */
    int batch_always;
    /** Test hook: the loop thread's CPU time in ns, instead of CLOCK_THREAD_CPUTIME_ID. */
    uint64_t (*test_cpu_ns)(const struct shmipc__loop *loop);
    /** Test hook: the loop's monotonic clock in ns (loop->now_ns, read at each turn and
     *  after each wait), instead of CLOCK_MONOTONIC; lets a test pace the batched waits'
     *  windows and trials by its own measure (completions) rather than by the scheduler. */
    uint64_t (*test_clock_ns)(const struct shmipc__loop *loop);
    /** Test hook: when > 0, io_uring set-up fails with this errno (EPERM, ENOSYS, ...). */
    int test_uring_setup_errno;
};

/** Counters, for tests and for docs/reactor.md's per-request figures. */
struct shmipc__loop_stats {
    uint64_t turns;      /**< loop turns (run_once calls, or iterations of run) */
    uint64_t waits;      /**< epoll_wait or io_uring_enter calls made to wait */
    uint64_t submits;    /**< io_uring_enter calls made only because the SQ was full */
    uint64_t epoll_ctl;  /**< epoll_ctl calls made by the epoll backend */
    uint64_t events;     /**< events or completions dispatched */
    uint64_t stale;      /**< events ignored because their fd was closed (and maybe reused) */
    uint64_t recv_rearm; /**< io_uring multishot receives armed again after the kernel ended them */
    uint64_t enobufs;    /**< io_uring receives that found the provided-buffer ring empty */
    uint64_t send_partial; /**< sends the socket did not take whole at the first try */
    /** epoll conns carried to the next turn by the per-turn read budget (or resumed after a
     *  pause) */
    uint64_t deferred;
    uint64_t held;           /**< io_uring receives completed after a pause, held for the resume */
    uint64_t batched;        /**< io_uring waits that asked for a batch of completions */
    uint64_t batch_backoffs; /**< batched waits that gathered too little; batching paused */
    uint64_t batch_trials;   /**< comparisons of CPU per completion, batched against plain */
    uint64_t batch_chosen;   /**< those that batching won */
    uint64_t batch_idle;     /**< those lost because the loop was busy under half the time */
};

/**
 * Creates a loop. `opts` may be NULL. Reads SHMIPC_REACTOR_BACKEND, SHMIPC_RX_EPOLL and
 * SHMIPC_REACTOR_BATCH_US for the fields left at DEFAULT (zero); an unknown value is refused
 * with SHMIPC_EINVAL naming the variable.
 * An explicit io_uring request fails when io_uring cannot be set up (SHMIPC_EACCES for EPERM,
 * SHMIPC_ENOTSUP for ENOSYS or a kernel without the features used, SHMIPC_ENOMEM).
 */
int shmipc__loop_new(const struct shmipc__loop_opts *opts, struct shmipc__loop **out);

/**
 * Closes every handle still open (pending send callbacks run with SHMIPC_ECLOSED), then frees
 * the loop. NULL is a no-op. Must not be called from a callback.
 */
void shmipc__loop_free(struct shmipc__loop *loop);

/** "io_uring" or "epoll". Static storage. */
const char *shmipc__loop_backend_name(const struct shmipc__loop *loop);

/**
 * Runs turns until shmipc__loop_stop(). A stop requested before the call (and not yet
 * consumed by a run) makes it return at once. Returns 0, or a negative code when waiting fails.
 */
int shmipc__loop_run(struct shmipc__loop *loop);

/**
 * One turn: waits up to `timeout_ms` (-1: until something happens; 0: not at all) and
 * dispatches what is ready, at most `max_events` events plus due timers and send callbacks.
 * Returns the number of callbacks and events handled, or a negative code. A batched io_uring
 * wait (SHMIPC_REACTOR_BATCH_US) may end after its window with nothing handled (0), even with
 * -1: callers loop.
 */
int shmipc__loop_run_once(struct shmipc__loop *loop, int timeout_ms);

/** Asks shmipc__loop_run() to return. Thread safe and async-signal safe; never blocks. */
void shmipc__loop_stop(struct shmipc__loop *loop);

/** The loop's clock: CLOCK_MONOTONIC in milliseconds, sampled once per turn. */
uint64_t shmipc__loop_now_ms(const struct shmipc__loop *loop);

/** Copies the counters. */
void shmipc__loop_stats(const struct shmipc__loop *loop, struct shmipc__loop_stats *out);

/** Connections, acceptors and watches open on the loop (its internal wakeup not counted). */
unsigned shmipc__loop_handles(const struct shmipc__loop *loop);

/* ------------------------------------------------------------------------------------ */
/* Timers                                                                               */
/* ------------------------------------------------------------------------------------ */

typedef void (*shmipc__timer_cb)(struct shmipc__timer *timer);

/**
 * A one-shot timer, embedded in its owner's struct (no allocation per start). Fields are
 * private. Timers with the same deadline fire in the order they were started.
 */
struct shmipc__timer {
    struct shmipc__loop *loop;
    shmipc__timer_cb cb;
    void *data;
    uint64_t deadline_ns;
    uint64_t seq;
    size_t heap_index; /* SIZE_MAX while not pending */
};

/** Prepares a timer; `data` is for the callback (timer->data). */
void shmipc__timer_init(struct shmipc__loop *loop, struct shmipc__timer *timer, shmipc__timer_cb cb,
                        void *data);

/**
 * (Re)starts the timer to fire once, `timeout_ms` after the loop's clock: the turn's time when
 * called from a callback (so timers started together keep their order), the current time
 * otherwise. Allocates only when the heap grows (SHMIPC_ENOMEM).
 */
int shmipc__timer_start(struct shmipc__timer *timer, uint64_t timeout_ms);

/** Cancels the timer; a stopped or fired timer is left alone. The callback will not run. */
void shmipc__timer_stop(struct shmipc__timer *timer);

/** 1 while the timer is pending, else 0. */
int shmipc__timer_active(const struct shmipc__timer *timer);

/* ------------------------------------------------------------------------------------ */
/* Connections                                                                          */
/* ------------------------------------------------------------------------------------ */

/** What a connection reports. Both are required. */
struct shmipc__conn_cbs {
    /**
     * Bytes received, len > 0. `data` is valid only during the call (the buffer is reused). It
     * is the loop's own memory, so the callee may also write into it (the WebSocket layer
     * unmasks payloads in place there).
     */
    void (*on_data)(struct shmipc__conn *conn, const void *data, size_t len);
    /**
     * No more input: 0 for the peer's FIN, a negative code when the connection failed. Called
     * once; the connection stays open (for sending, after a FIN) until shmipc__conn_close().
     */
    void (*on_end)(struct shmipc__conn *conn, int status);
    /**
     * Optional (NULL: not asked). While reading is paused (shmipc__conn_pause_read()), the
     * peer ended its input or reset the connection, possibly behind input not read yet: for
     * an owner that must not wait for its resume to learn that the peer left (a request whose
     * answer is still being computed). At most once per pause, from the loop; on_end still
     * follows in order once reading resumes.
     */
    void (*on_hup)(struct shmipc__conn *conn);
};

/**
 * Send completion: `status` 0 when every byte was handed to the kernel, else a negative code
 * (SHMIPC_ECLOSED when the connection was closed first). From then on the caller's buffers
 * are its own again. Called exactly once for each accepted send.
 */
typedef void (*shmipc__send_cb)(struct shmipc__conn *conn, int status, void *data);

/**
 * Takes ownership of a connected stream socket (closed by shmipc__conn_close(), also on
 * failure here) and starts receiving. The loop adjusts O_NONBLOCK as its backend needs.
 */
int shmipc__conn_open(struct shmipc__loop *loop, int fd, const struct shmipc__conn_cbs *cbs,
                      void *data, struct shmipc__conn **out);

void *shmipc__conn_data(const struct shmipc__conn *conn);
void shmipc__conn_set_data(struct shmipc__conn *conn, void *data);
int shmipc__conn_fd(const struct shmipc__conn *conn);
struct shmipc__loop *shmipc__conn_loop(const struct shmipc__conn *conn);

/** Bytes accepted by send/sendv that the kernel has not taken yet (for back-pressure). */
size_t shmipc__conn_pending(const struct shmipc__conn *conn);

/**
 * Queues `len` bytes; they leave in order after what was queued before. `buf` must stay
 * valid until `cb` (which may be NULL for static buffers) runs. Returns 0 when accepted, or a
 * negative code (the connection already failed or was shut down); `cb` then never runs.
 */
int shmipc__conn_send(struct shmipc__conn *conn, const void *buf, size_t len, shmipc__send_cb cb,
                      void *data);

/**
 * Vectored send of `n` (1..1024) buffers. The iovec array is copied; the buffers it points to
 * must stay valid until `cb`. Large bodies are sent from the caller's memory, not copied.
 */
int shmipc__conn_sendv(struct shmipc__conn *conn, const struct iovec *iov, int n,
                       shmipc__send_cb cb, void *data);

/**
 * Writes what the socket takes of iov[0..n) now, without blocking and without queuing, when
 * nothing of this connection is queued or in flight (else, and on any failure, 0): the
 * caller's memory is its own again on return. Returns the bytes written. For an owner that
 * must copy what it cannot send at once anyway (the WebSocket send), to copy only the rest.
 */
size_t shmipc__conn_write_now(struct shmipc__conn *conn, const struct iovec *iov, int n);
/**
 * Receives up to `len` bytes into `buf` now, without blocking, when the backend can do so
 * without reordering input (epoll; io_uring never: its completions may hold earlier bytes)
 * and reading is not paused or ended. Returns the bytes read: 0 when none are ready, and
 * also at the end of input or on a failure, which the loop's own next read then reports.
 * For an owner that knows where the next bytes go (a large WebSocket payload).
 */
size_t shmipc__conn_read_now(struct shmipc__conn *conn, void *buf, size_t len);
/**
 * Stops reading the connection: no on_data and no on_end until shmipc__conn_resume_read().
 * The socket's receive buffer then fills and TCP flow control stops the peer, which is how an
 * owner whose output backs up (a peer that sends but does not read) keeps its memory bounded.
 * Bytes the kernel had already completed are held and delivered first on resume. epoll makes
 * no system call for either (the registration stays as it is); io_uring cancels the
 * connection's multishot receive and arms a new one on resume. Idempotent; returns 0, or
 * SHMIPC_EBUSY from a foreign thread.
 */
int shmipc__conn_pause_read(struct shmipc__conn *conn);

/**
 * Reads again after shmipc__conn_pause_read(). What is waiting (held bytes, the socket's
 * buffer, an end of input) is delivered from the loop in a later dispatch, never inside this
 * call. Idempotent; returns 0, or SHMIPC_EBUSY from a foreign thread.
 */
int shmipc__conn_resume_read(struct shmipc__conn *conn);

/** 1 while reading is paused, else 0. */
int shmipc__conn_read_paused(const struct shmipc__conn *conn);

/**
 * Half-close: once everything queued has been sent, shutdown(SHUT_WR) sends a FIN. Input keeps
 * arriving through on_data, so the owner can drain it and close on on_end; closing with unread
 * input would make the kernel answer with a reset instead of the FIN. Further sends fail.
 */
int shmipc__conn_shutdown(struct shmipc__conn *conn);

/**
 * Closes the connection and its socket. No callback of this connection runs afterwards
 * except the send callbacks still due, which get SHMIPC_ECLOSED. The handle is invalid after
 * the call. epoll closes the fd now; io_uring closes it at the loop's next wait, behind the
 * SQEs that still name it, so that its number cannot be reused under them (the fd must not
 * be touched meanwhile).
 */
void shmipc__conn_close(struct shmipc__conn *conn);

/* ------------------------------------------------------------------------------------ */
/* Acceptors: a listening socket that the loop accepts on                              */
/* ------------------------------------------------------------------------------------ */

/**
 * A new connection, already receiving with the acceptor's callbacks and its `data` as the
 * connection's data. The callback may replace the data, or close the connection.
 */
typedef void (*shmipc__accept_cb)(struct shmipc__acceptor *acceptor, struct shmipc__conn *conn,
                                  void *data);

/**
 * Takes ownership of a listening stream socket (closed by shmipc__acceptor_close(), also on
 * failure here) and accepts on it: multishot accept on io_uring, accept4 until EAGAIN on an
 * edge-triggered registration on epoll. New connections use `cbs` (copied).
 */
int shmipc__acceptor_open(struct shmipc__loop *loop, int fd, const struct shmipc__conn_cbs *cbs,
                          shmipc__accept_cb on_accept, void *data, struct shmipc__acceptor **out);

/** Stops accepting and closes the socket (on io_uring at the next wait, as a conn's).
 * Connections already accepted stay open. */
void shmipc__acceptor_close(struct shmipc__acceptor *acceptor);

/* ------------------------------------------------------------------------------------ */
/* Readiness watches (eventfds, the shmipc session socket)                              */
/* ------------------------------------------------------------------------------------ */

enum {
    SHMIPC__WATCH_READ = 1,
    SHMIPC__WATCH_WRITE = 2,
};

/**
 * Readiness callback, edge style on both backends: it runs after the fd becomes ready, and
 * the callback must consume until EAGAIN (read an eventfd once) or it may not run again.
 * `events` holds SHMIPC__WATCH_* bits.
 */
typedef void (*shmipc__watch_cb)(struct shmipc__watch *watch, int fd, unsigned events, void *data);

/** Watches a non-blocking fd that stays the caller's (the watch never closes it). */
int shmipc__watch_new(struct shmipc__loop *loop, int fd, unsigned events, shmipc__watch_cb cb,
                      void *data, struct shmipc__watch **out);

/** Stops watching; the callback will not run again. The fd may be closed right after. */
void shmipc__watch_free(struct shmipc__watch *watch);

/* ------------------------------------------------------------------------------------ */
/* Sockets and shared-nothing workers (sock.c)                                          */
/* ------------------------------------------------------------------------------------ */

/**
 * A listening TCP socket on `host` (numeric IPv4 or IPv6; NULL for 0.0.0.0) and `port` (0 for
 * an ephemeral port), with SO_REUSEADDR, and SO_REUSEPORT when `reuseport` is non-zero.
 */
int shmipc__tcp_listen(const char *host, uint16_t port, int backlog, int reuseport, int *out_fd);

/**
 * Test seam, NULL in production: when set, shmipc__workers_start() calls it between the
 * probe that checks a fixed port free and the workers' binds, so that a test can bind a
 * foreign listener in that window and check that the check after the binds catches it.
 */
extern void (*shmipc__sock_after_probe_hook)(const char *host, uint16_t port);

/** The local port of a bound socket, or a negative code. */
int shmipc__sock_port(int fd);

/** Whether `host` names a unix socket: "unix:/path" (or any path) or "unix:@name" (abstract). */
int shmipc__is_unix_host(const char *host);

/** 0 when "unix:..." names a socket shmipc__unix_listen() can make, else its error. */
int shmipc__unix_host_check(const char *host);

/**
 * A listening unix socket on "unix:PATH" or "unix:@NAME" (abstract, no file). A PATH that
 * exists is replaced only when it is a socket nothing accepts on (a stale file left by a dead
 * server); a live socket is SHMIPC_EADDRINUSE; anything else there (a regular file, a symbolic
 * link, a directory, a FIFO) is SHMIPC_EEXIST and left as it is. The file is created with the
 * process's umask. A name longer than sun_path holds is SHMIPC_ENAMETOOLONG; an empty one
 * SHMIPC_EINVAL. The file appears only once the socket listens. `file` records what was made,
 * for shmipc__unix_unlink().
 */
int shmipc__unix_listen(const char *host, int backlog, int *out_fd, struct shmipc__unix_file *file);

/* shmipc__unix_unlink() (common/unixsock.h) removes the file, if the path still holds it. */

/** SHMIPC_WORKERS, or the number of online CPUs when unset. Refuses values outside 1..1024. */
int shmipc__workers_default(unsigned *out);

struct shmipc__workers;

struct shmipc__workers_opts {
    unsigned count;                       /**< 0: shmipc__workers_default() */
    const struct shmipc__loop_opts *loop; /**< for every worker's loop; NULL for defaults */
    /** as for shmipc__tcp_listen(), or "unix:PATH" / "unix:@NAME": one socket (port 0),
     * accepted on by every worker, its file removed by shmipc__workers_free() */
    const char *host;
    uint16_t port; /**< 0: one ephemeral port shared by all workers */
    int backlog;   /**< 0: SOMAXCONN */
    /**
     * 0: a fixed port must be free, else SHMIPC_EADDRINUSE (the workers still share it among
     * themselves); 1: join whatever SO_REUSEPORT group of the same user listens there, i.e.
     * share the port with another process on purpose.
     */
    int share_port;
    /**
     * Runs on each worker thread, before its loop runs, with the worker's own loop and its own
     * SO_REUSEPORT listening socket, whose ownership passes to the callee (typically to
     * shmipc__acceptor_open()). A negative return fails shmipc__workers_start().
     */
    int (*setup)(struct shmipc__loop *loop, int listen_fd, unsigned index, void *data);
    /** Runs on each worker thread after its loop stopped, before the loop is freed; optional. */
    void (*teardown)(struct shmipc__loop *loop, unsigned index, void *data);
    void *data;
};

/**
 * Starts the workers: one thread, one loop and one listening socket each; a connection is
 * accepted, served and closed by one worker and never crosses threads. Returns once every
 * setup has run.
 */
int shmipc__workers_start(const struct shmipc__workers_opts *opts, struct shmipc__workers **out);

/** The port every worker listens on. */
uint16_t shmipc__workers_port(const struct shmipc__workers *workers);

/** The number of worker threads. */
unsigned shmipc__workers_count(const struct shmipc__workers *workers);

/** Stops every loop, joins the threads and frees. NULL is a no-op. */
void shmipc__workers_free(struct shmipc__workers *workers);

#endif
