/* Description: the test harness of the front's C tests (test_front.c, test_front_stream.c,
 * test_front_upload.c, test_front_ws.c, ...): application workers that are C threads of the test
 * process (a shmipc listener and the public frame codec, shmipc_serve.h) with a mode per worker
 * and per target, the front under test on 127.0.0.1 (or a unix address), an HTTP client, readers
 * of streamed bodies, and a case's heap state (struct tc) that a cmocka teardown stops and
 * joins, also when an assertion fails mid-case.
 *
 * Threads other than the case's own never assert (a cmocka failure off the test's thread
 * longjmps across threads); they count what went wrong (appw.bad, a -1 status) and the case or
 * the teardown fails. Waits are on events (a condition variable every counter bump signals,
 * latches the test opens); the only timed limits are generous caps on those waits and the
 * deadlines under test. */
#ifndef SHMIPC_TESTS_FRONT_HARNESS_H
#define SHMIPC_TESTS_FRONT_HARNESS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "shmipc.h"
#include "shmipc_serve.h"
#include "net/server.h"
#include "serve/front.h"

/* The reactor backend of the front under test: each test's main sets it per cmocka group. */
extern int suite_backend;

#define CHECK(call)                                                                                \
    do {                                                                                           \
        int check_rc_ = (call);                                                                    \
        if (check_rc_ < 0)                                                                         \
            fail_msg("%s: %s: %s", #call, shmipc_errname(check_rc_), shmipc_error_detail());       \
    } while (0)

/* The cap on any wait for an event: long, so that a loaded machine under a sanitizer never
 * overruns it; a passing run never waits it out. */
#define WAIT_MS 30000
/* A session's handshake, on both sides (the library's default is 1000 ms). */
#define HANDSHAKE_MS 10000

enum mode {
    M_ECHO = 0,     /* 200, body = target ":" body, X-Worker: name */
    M_HOLD,         /* M_ECHO once the test opens the worker's hold latch */
    M_DIE,          /* reads the request, then every session of the worker ends */
    M_BAD,          /* answers a frame with a bad magic */
    M_HUGE,         /* a body of 1 MiB in 64 KiB frames, no Content-Length */
    M_MID_END,      /* RESPONSE_HEAD, then closes its stream */
    M_HANG,         /* never answers; waits for the front's ABORT */
    M_STALL,        /* never reads the stream at all until the test opens release_stall */
    M_REFUSE,       /* reads the request, answers ABORT SHUTDOWN (a stopping worker), waits */
    M_REFUSE_CLOSE, /* as M_REFUSE, then every session of the worker ends at once */
    M_HEAD_REFUSE,  /* RESPONSE_HEAD, then ABORT SHUTDOWN: too late to go elsewhere */
    M_103_REFUSE,   /* an interim 103 head, then ABORT SHUTDOWN: processed, not resent */
    M_LENGTH,       /* RESPONSE_HEAD with CONTENT_LENGTH appw.length (any u64, written raw),
                     * then one body byte (none to HEAD) and END */
};

/* How a worker answers the front's HELLO (appw.taken). */
enum taken_mode {
    TAKEN_NONE = 0,      /* ABORT PROTOCOL, as a worker of an earlier revision */
    TAKEN_GRANT,         /* grants TAKEN, concurrency 1, and sends it first when asked */
    TAKEN_GRANT_ALL,     /* grants every feature bit, also those not offered */
    TAKEN_ANSWER_BODY,   /* answers with a BODY frame of HELLO's size */
    TAKEN_STOPPING,      /* ABORT SHUTDOWN with a reason, as a stopping Python worker answers */
    TAKEN_STOPPING_BARE, /* ABORT SHUTDOWN alone (12 bytes), as a stopping C or Lua worker */
};

/* Sessions a worker accepts over its life; it closes those past it at once. */
#define APPW_MAX_SESSIONS 64

struct appw {
    char name[16];
    char addr[96];
    shmipc_listener *l;
    pthread_t acceptor;
    int started;
    atomic_int stop;
    atomic_int mode;
    /* latches, set under mu and signalled on cv */
    atomic_int hold_open;
    atomic_int release_stall;
    atomic_int die_after_answer; /* M_HOLD/M_ECHO: this many answers end every session at once */
    atomic_int sessions_ended;   /* session threads that saw their session end */
    atomic_int hold_accept;      /* the acceptor takes no connection: a worker that is frozen */
    atomic_int accept_parked;    /* turns the acceptor spent held (appw_hold_accept waits on it) */
    atomic_int freeze;           /* session threads touch nothing (the queue to it stays full) */
    int parked;                  /* session threads waiting out a freeze (under mu) */
    atomic_int bad;              /* what a worker thread found wrong (it cannot assert) */
    atomic_int requests;         /* request heads read */
    atomic_int refused;          /* requests answered ABORT SHUTDOWN */
    atomic_int aborts[8];        /* ABORT reasons the front sent */
    atomic_int concurrent;       /* streams being served now */
    atomic_int max_concurrent;
    /* HELLO and TAKEN (docs/serve.md): enum taken_mode. Targets "/taken-twice",
     * "/taken-unasked" and "/taken-late" send TAKEN where the protocol forbids it. */
    atomic_int taken;
    atomic_int hellos;        /* HELLOs answered */
    atomic_uint conc;         /* the concurrency a granting HELLO answers (0: 1); over 1 each stream
                          * is served on a thread of its own */
    atomic_int sthreads_live; /* those stream threads still running */
    atomic_int takens;        /* TAKENs sent */
    atomic_int holding;       /* requests waiting on hold_open (M_HOLD) */
    atomic_int streamed;      /* stream_mode bodies sent whole */
    _Atomic uint64_t length;  /* M_LENGTH's content_length */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    shmipc_session *sess[APPW_MAX_SESSIONS];
    pthread_t sthreads[APPW_MAX_SESSIONS];
    int nsess;
    /* ms the acceptor waits between taking a session from the listener (its handshake done:
     * the front uses it already) and holding it in sess[] (kill_sessions reaches it from
     * then): a worker slow to take its new session in, as on a loaded host. */
    atomic_uint accept_lag_ms;
    int flags; /* its sessions' config: appw_start_x */
};

struct fx {
    shmipc_server *srv;
    struct shmipc__front *f;
    int port;
    const char *listen;     /* the server's address; NULL: 127.0.0.1 */
    uint64_t max_body;      /* the server's body limit; 0: its default */
    uint64_t ws_send_limit; /* the server's WebSocket send mark and limit; 0: the defaults */
};

/* A reader that keeps what it read past a response for the next one. */
struct rd {
    int fd;
    char buf[1 << 17];
    size_t len;
};

struct resp {
    int status;
    char head[4096];
    char *body;
    size_t body_len;
};

struct sbody {
    uint64_t got; /* body bytes read */
    int complete; /* the framing ended where it should */
    int bad;      /* a byte that is not gen_byte's, or broken framing */
    int chunked;
};

/* A client thread reading one streamed body (it never asserts: the case checks its result). */
struct sbg {
    int port;
    char target[128];
    unsigned seed;
    unsigned slow_us;
    int rcvbuf;     /* the client's receive buffer, set before its connect (0: the default) */
    atomic_int *go; /* reads its response only once *go is set (NULL: at once) */
    int status;
    struct sbody b;
    pthread_t th;
    int running; /* started, not joined */
};

struct xt {
    int port;
    int id;
    int n;
    atomic_int *mismatches;
    atomic_int *ok;
    atomic_int *stop; /* the teardown's */
};

struct bg {
    int port;
    const char *target;
    const char *method; /* NULL: GET */
    struct resp p;
    pthread_t th;
    int running; /* started, not joined */
};

struct load {
    int port;
    atomic_int stop;
    atomic_int bad, ok, after_c, after_old;
    atomic_int switched;
};

/* One case's state, on the heap: the teardown stops and joins all of it, also after a failed
 * assertion longjmped out of the case. */
struct tc {
    struct appw w[3];
    struct fx x;
    struct bg bg[48];
    struct xt xt[8];
    struct load load;
    struct sbg sbg[6];
    pthread_t th[8]; /* client threads (xtalk_client, load_main) */
    int nth;
    atomic_int stop_clients;
    atomic_int
        go; /* the latch of struct sbg.go for a case's streamed GETs (the teardown opens it) */
    atomic_int mism, ok;
};

/* Starts workers w0.. (n of t->w) and the front on them (one thread, options o or NULL). */
struct fx *tc_front(struct tc *t, unsigned n, const struct shmipc__front_opts *o);
uint64_t mono_ms(void);
void sleep_ms(unsigned ms);
/* Every counter a case waits on is bumped with bump(), which wakes the waiters of wait_for(). */
void bump(atomic_int *v);
void cv_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, unsigned ms);
int wait_for(atomic_int *v, int want, unsigned ms);

/* ---- application workers ---- */
/* Serves a WebSocket handshake's stream (REQUEST_HEAD with UPGRADE, and END, read) when set:
 * test_front_ws.c's worker side. It writes everything on `st`, and counts itself out of
 * w->concurrent before its last frame (as send_frames does: the front may hand the worker its
 * next stream once it has that frame); serve_stream closes `st`. */
extern void (*front_ws_serve)(struct appw *w, shmipc_stream *st, const char *target);

int read_frame(shmipc_stream *st, uint8_t **buf, size_t *len, shmipc_serve_frame *f);
void wait_abort(struct appw *w, shmipc_stream *st);
void send_frames(struct appw *w, shmipc_stream *st, int status, const char *name, const void *body,
                 size_t len, int with_length, int is_head);
/* Ends every session the worker holds (sess[]): not one its acceptor has yet to take from the
 * listener, which the front may be using already (appw_wait_sessions). */
void kill_sessions(struct appw *w);
/* Waits up to WAIT_MS until the worker holds `n` sessions (its acceptor took them in). */
int appw_wait_sessions(struct appw *w, int n);
void latch_wait(struct appw *w, atomic_int *flag);
void latch_set(struct appw *w, atomic_int *flag, int v);
uint8_t gen_byte(unsigned seed, uint64_t i);
#define FNV_INIT 0xcbf29ce484222325ull
uint64_t fnv1a(uint64_t h, const void *p, size_t n);
void appw_start(struct appw *w, const char *name, const char *addr);
/* appw_start_x's flags, for the worker's sessions. APPW_MEMORY_WAIT: they wait for shared
 * memory when it is full (as the workers of shmipc-serve do) instead of sending over the
 * socket. APPW_NO_SPIN: they never spin before they sleep (spin_us 0), so that on a V3 session
 * nothing but the front's wake-up (a Polling message) shows them a request it queued. */
#define APPW_MEMORY_WAIT 1
#define APPW_NO_SPIN     2
/* As appw_start, with `flags`; a restart (name NULL) keeps them. */
void appw_start_x(struct appw *w, const char *name, const char *addr, int flags);
void appw_stop(struct appw *w);
/* Freezes the worker's acceptor: once it returns, no connection is accepted and no handshake
 * starts until hold_accept is 0 again (latch_set); connects wait in the listen backlog, as to
 * a stopped process. Setting hold_accept alone is not enough: an accept call in progress
 * (50 ms) would still take a connect, and the listener would finish its handshake on a thread
 * of its own, leaving a session up that nobody serves. */
void appw_hold_accept(struct appw *w);

/* ---- the front under test ---- */
/* A listener at `addr` whose handshake waits HANDSHAKE_MS. */
void listener_patient(const char *addr, shmipc_listener **out);
/* As listener_patient, its sessions configured by `flags` (APPW_MEMORY_WAIT, APPW_NO_SPIN). */
void listener_patient_x(const char *addr, int flags, shmipc_listener **out);
void fx_start(struct fx *x, struct appw **ws, unsigned n, unsigned threads,
              const struct shmipc__front_opts *o);
void fx_stop(struct fx *x);
int wait_sessions(struct fx *x, const char *addr, unsigned n);
int wait_taken(struct fx *x, unsigned i, unsigned n);
int wait_parked(struct appw *w);
int wait_queued(struct fx *x, unsigned n);

/* ---- an HTTP client ---- */
int tcp_connect_try(int port);
/* As tcp_connect_try, with the receive buffer set before the connect (`rcvbuf` 0: the
 * default). Set after it, a small buffer shrinks the window the handshake offered, and the
 * peer's data past it waits on TCP's retransmission back-off (seconds), not on the reader. */
int tcp_connect_rcvbuf(int port, int rcvbuf);
int tcp_connect(int port);
int send_all_try(int fd, const void *p, size_t n);
void send_all(int fd, const void *p, size_t n);
void read_resp_x(struct rd *r, struct resp *p, int head);
void read_resp(struct rd *r, struct resp *p);
void rd_open(struct rd *r, int port);
int rd_open_try(struct rd *r, int port);
int request(int port, const char *method, const char *target, const char *body, struct resp *p);
void resp_free(struct resp *p);
int peer_closed(int fd);

/* ---- reading streamed bodies ---- */
ssize_t rd_more(struct rd *r, size_t max, unsigned slow_us);
void rd_drop(struct rd *r, size_t n);
size_t take_body(struct rd *r, struct sbody *b, unsigned seed, size_t n);
void read_stream_body(struct rd *r, const struct resp *p, unsigned seed, size_t max,
                      unsigned slow_us, struct sbody *b);
int get_stream(struct rd *r, const char *target, unsigned seed, size_t max, unsigned slow_us,
               struct sbody *b);
/* As get_stream, reading only once *go is set (go NULL: at once; -1 when WAIT_MS passes). */
int get_stream_x(struct rd *r, const char *target, unsigned seed, size_t max, unsigned slow_us,
                 atomic_int *go, struct sbody *b);
void sbg_start(struct sbg *a);
void sbg_join(struct sbg *a);

/* ---- a case's state ---- */
int tc_setup(void **state);
void bg_join(struct bg *b);
int tc_teardown(void **state);

#endif
