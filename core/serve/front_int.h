/*
 * Internal to the front's files (front.c, front_session.c, front_request.c, front_ws.c): the front's
 * structs and the calls between those files. Nothing outside core/serve/front*.c includes
 * this; the rest of the library uses front.h.
 *
 * Per reactor thread (struct fthread): a session to every application worker (struct fsess,
 * watched in the thread's loop), a FIFO of requests waiting for a worker, an eventfd other
 * threads write when they free a worker this thread may want, and a "kick" timer that runs
 * the FIFO from the loop (never from inside a route handler or a cancel callback, where the
 * server must not be called back).
 *
 * A request (struct freq) is QUEUED, SENDING (a worker claimed, its session's queue full: the
 * flush is retried on a 1 ms timer rather than waiting inside the loop), ACTIVE (sent; the
 * response is read as the session becomes readable) or DRAINING (the front sent ABORT, or the
 * client's deferral ended: what the worker still sends is discarded until its stream ends).
 * The worker's busy flag is held from the claim until the request is freed.
 *
 * A request with a body runs the handler at its head (shmipc__server_route_at_head): the body
 * streams (`uploading`): the server hands it over in pieces (on_body, on_end), each goes into
 * the stream as BODY frames in shared memory only (shmipc__stream_write_shm) and is flushed
 * when the session's queue has a slot. What the session cannot take now, and what comes while
 * the request waits for a worker (QUEUED), is kept (one piece at most: the server is told to
 * hold the body) and retried on the request's timer; then the server resumes the body.
 */
#ifndef SHMIPC_CORE_SERVE_FRONT_INT_H
#define SHMIPC_CORE_SERVE_FRONT_INT_H

#include "serve/front.h"

#include "serve/access_log.h"

#include "ipc/session.h"
#include "ipc/sockio.h"
#include "net/serve_frame.h"
#include "net/server.h"
#include "reactor/loop.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define MAX_THREADS          1024u /* shmipc__workers_default()'s limit */
#define RETRY_MS             1u    /* a full session queue is retried this often */
#define ABORT_BACKOFF_MAX_MS 64u   /* a drain's ABORT that cannot go: retried at most this late */
/* A request (head and whole body) of at most this many bytes goes into shared memory only,
 * waiting while it is full: far below the smallest buffer (SHMIPC_MIN_BUFFER_CAPACITY). */
#define SHM_ONLY_MAX (256u << 10)
#define UPLOAD_FRAME (64u << 10) /* most body bytes in one BODY frame of an upload */
#define SCRATCH      (SHMIPC__SF_HDR_SIZE + SHMIPC__SF_MAX_HEAD)
/* Response bytes queued on a client connection at which the front stops reading the worker's
 * stream (docs/serve.md, "Streamed responses"); max_response lowers it. */
#define STREAM_MARK (256u << 10)

struct fworker {
    struct fworker *next; /* the workers of the set, and retired ones still referenced */
    /* fsess pointing at it, over all threads: added under the front's mu (fs_add from
     * refresh), dropped when an fsess is freed (fs_free). A retired worker that no fsess
     * points at is freed at the next set change (set_locked, under mu). */
    atomic_uint refs;
    char addr[SHMIPC__FRONT_MAX_ADDRESS + 1];
    atomic_int busy;        /* requests in flight to it (over all threads' sessions) */
    atomic_int solo;        /* of those, ones nothing may be pipelined behind (upload, WS) */
    atomic_uint taken;      /* sessions whose HELLO granted TAKEN */
    atomic_uint conc;       /* its last HELLO's concurrency (1..MAX_CONCURRENCY), 0: none yet */
    atomic_uint sessions;   /* live sessions to it (a thread's replaced ones, draining, too) */
    atomic_int current;     /* in the current set */
    atomic_ullong served;   /* responses relayed */
    atomic_ullong failures; /* 502s */
    atomic_int hung;        /* found hung (shmipc__front_worker_hung): once per worker */
};

struct fthread;
struct freq;

struct fsess {
    struct fthread *t;
    struct fworker *w;
    shmipc_session *s; /* NULL while down */
    struct shmipc__watch *watch;
    /* The requests in flight on this session, oldest first, each holding one of w->busy:
     * one at a time, up to the front's pipeline on a session that granted TAKEN, or up to the
     * concurrency its worker answered. */
    struct freq *act[SHMIPC__FRONT_MAX_CONCURRENCY];
    unsigned nact;
    uint8_t taken_ok;     /* its HELLO granted TAKEN (docs/serve.md, "HELLO and TAKEN") */
    unsigned conc;        /* its HELLO's concurrency, capped; 1 until (and without) one */
    shmipc_stream *hello; /* the HELLO's stream until the worker's answer came */
    uint8_t down;         /* shmipc__front_fs_down() is deciding its requests' fate */
    uint8_t stopping;     /* its worker refused or dropped a request it never took: nothing
                           * more goes to it; it closes once its requests in flight ended */
    int retired;          /* w left the set, or replaced: closed once idle */
    uint8_t kept;         /* its worker left; kept for responses still relaying (their share
                           * of w->busy and w->solo given back: the worker has them no more) */
    uint8_t replaced;     /* its session's breaker opened: a new fsess took its worker's
                           * place (shmipc__front_requeue_head); retired for good */
    uint8_t in_ready;     /* fs_ready's turn runs: an unlink leaves the free to it */
    uint8_t down_due;     /* its timer takes it down with down_rc (requeue_head) */
    int down_rc;
    uint8_t gone;      /* unlinked during that turn */
    uint8_t wake_owed; /* a deferred flush: its worker is woken at the end of the turn */
    /* fs_stalled (shmipc__front_claim): since when (loop ms + 1) its worker has held
     * elements of the session's queue without taking one (0: nothing held at the last look),
     * and the worker's popped count then. */
    uint64_t held_since;
    uint64_t held_pop;
    uint32_t backoff_ms;
    /* HELLOs in a row its worker answered ABORT SHUTDOWN (fs_hello_read), at most 7: each
     * doubles the reconnect's back-off, so a worker that keeps refusing new sessions (a broken
     * one; ours stop accepting) is not reconnected to every 20 ms. */
    uint8_t hello_refusals;
    struct shmipc__timer timer; /* reconnect */
    /* A connect the thread's connector runs: the fsess stays linked (never freed) until the
     * loop takes its result; got/got_rc/cnext are the connector's, under its mutex. */
    uint8_t connecting;
    shmipc_session *got;
    int got_rc;
    struct fsess *cnext;
};

/*
 * A reactor thread's connector: threads that run the blocking connect and handshake to a
 * worker (bounded by connect_ms), so that a worker alive but not answering (stopped, swapped
 * out) never stops the loop. Results go on `done` and the loop is nudged through its eventfd.
 * A thread is started when a connect is posted and none is idle (up to CONNECTORS_MAX), so a
 * frozen worker's handshake never holds up another worker's connect; they stay until the
 * reactor thread ends, where they are joined.
 */
#define CONNECTORS_MAX SHMIPC__FRONT_MAX_WORKERS
struct fconnector {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th[CONNECTORS_MAX];
    unsigned nth;     /* threads started */
    unsigned idle;    /* threads waiting for a connect */
    unsigned pending; /* connects on `todo` */
    int stop;
    struct fsess *todo, *todo_tail, *done;
};

struct fthread {
    struct shmipc__front *f;
    unsigned index;
    struct shmipc__loop *loop;
    int efd;
    struct shmipc__watch *ewatch;
    struct shmipc__timer kick;
    /* Runs the FIFO again while a request waits only because the worker that could take it
     * is stalled (shmipc__front_claim): no "worker freed" comes when that worker starts
     * taking again. */
    struct shmipc__timer stall_timer;
    unsigned gen;
    struct fsess **sess;
    unsigned nsess, cap, rr;
    struct freq *qhead, *qtail;
    atomic_uint nwait;
    uint8_t *scratch;
    struct shmipc__access_buf alog;  /* when the front logs: this thread's lines */
    struct shmipc__timer alog_timer; /* writes them out at most SHMIPC__ACCESS_FLUSH_MS late */
    /* Wakes, at the end of the turn, the workers whose requests this turn flushed (deferred:
     * one wakeup of a worker for all of them, instead of one that preempts the front at each
     * request when both share a CPU). */
    struct shmipc__timer wake_timer;
    struct fconnector conn;
};

/* RQ_BODY: a small body (Content-Length up to SHMIPC__FRONT_RETRY_BODY) is gathered whole
 * before the request claims a worker, as a body that came with its head always was. */
/* RQ_WS: a WebSocket after the worker's 101 (front_ws.c): frames both ways until the close. */
enum { RQ_QUEUED = 1, RQ_SENDING, RQ_ACTIVE, RQ_DRAINING, RQ_BODY, RQ_WS };

struct fws;

struct freq {
    struct freq *next;
    struct fthread *t;
    struct fsess *fs;
    shmipc_stream *st;
    struct shmipc__server_ticket ticket;
    uint8_t live; /* the deferral is ours to answer */
    uint8_t state;
    uint8_t have_hdr, got_head;
    uint8_t is_head;       /* a HEAD request: the worker sends no body, whatever its length says */
    uint8_t streaming;     /* the response's head went to the server: BODY frames follow it */
    uint8_t wait_drain;    /* streaming, held back: the connection has the mark queued */
    uint8_t retries;       /* times a stopping worker refused it (ABORT SHUTDOWN) */
    uint8_t no_retry;      /* its body is gone (over SHMIPC__FRONT_RETRY_BODY): never resent */
    uint8_t uploading;     /* its body streams from the server (on_body / on_end) */
    uint8_t up_head;       /* uploading: the REQUEST_HEAD is in the stream */
    uint8_t up_ended;      /* uploading: the body ended (on_end): END follows what is kept */
    uint8_t up_end_out;    /* uploading: END is in the stream */
    uint8_t up_dirty;      /* uploading: bytes written to the stream, not yet flushed */
    uint8_t up_held;       /* on_body returned 1: the server waits for upload_resume */
    uint8_t up_flushed;    /* uploading: the first message (the head's) went */
    uint8_t up_lost;       /* uploading: body bytes the front could not keep: never resent */
    const uint8_t *up_src; /* body bytes not yet in the stream: the server's piece, or up_buf */
    size_t up_left;
    uint8_t *up_buf; /* the copy of what the stream could not take (one piece at most) */
    size_t up_buf_len;
    uint8_t ws;            /* a WebSocket handshake (REQUEST_HEAD with UPGRADE) */
    uint8_t want_taken;    /* sent with TAKEN_WANTED: the worker says TAKEN before it runs it */
    uint64_t sent_mark;    /* shmipc__session_sent() after its first message, 0: not known */
    uint8_t gathering;     /* RQ_BODY: body_cap bytes of the gather budget are its */
    uint8_t taken;         /* its TAKEN came: never resent (the worker may have acted on it) */
    uint8_t solo;          /* counted in w->solo: nothing is pipelined behind it */
    struct fws *wsx;       /* after the 101: the relay's state (front_ws.c) */
    uint64_t rtotal;       /* body bytes streamed */
    unsigned rstatus;      /* streaming: the status its head sent (the access log's) */
    uint64_t rwant;        /* the worker's Content-Length, or SHMIPC__SERVER_STREAM_UNSIZED */
    uint32_t abort_reason; /* an ABORT still to send, 0: none */
    uint32_t aborted_for;  /* the reason of the front's ABORT, once given up (req_abort) */
    uint64_t abort_mark;   /* shmipc__session_sent() after the ABORT went (0: none, or socket) */
    uint8_t abort_tries;   /* times it could not go yet (its retry backs off) */
    uint8_t send_tries;    /* SENDING: times the session could not take it yet (backs off) */
    uint64_t drain_until;  /* loop ms */
    uint8_t hdr[SHMIPC__SF_HDR_SIZE];
    struct shmipc__sf_frame fh;
    uint8_t *head; /* the RESPONSE_HEAD frame */
    size_t head_len;
    uint8_t *out; /* the REQUEST_HEAD frame, kept until the worker's first frame (a resend) */
    size_t out_len;
    const char *body;
    size_t body_len;
    size_t body_cap; /* RQ_BODY: the body's Content-Length */
    char *body_copy; /* a queued or sent request's body (the server's buffer is gone by then) */
    uint8_t *rbody;
    size_t rlen, rcap;
    struct shmipc__timer timer;
    /* The access log's entry (when the front logs): the strings copied into le_blob, since
     * the server's request is gone once the handler returned; logged once. */
    shmipc__access_entry le;
    char *le_blob;
    uint64_t le_t0_us;
    uint8_t logged;
};

struct shmipc__front {
    uint32_t queue_max, connect_ms, pipeline;
    uint8_t hello; /* HELLO offered on every session (opts.hello, or a pipeline over 1) */
    _Atomic uint32_t deadline_ms; /* 0: none (the server's deferral); set_deadline changes it */
    uint64_t max_response;
    shmipc_config *ipc;
    shmipc_config *ipc_unix; /* ipc with our own uid as the peer uids unless ipc names some */
    struct shmipc_server *srv;
    pthread_mutex_t mu; /* all, set, nset, threads[] (for nudges) */
    struct fworker *all;
    struct fworker *set[SHMIPC__FRONT_MAX_WORKERS];
    unsigned nset;
    atomic_uint gen;
    atomic_uint queued;
    atomic_ullong rejected, timeouts, client_gone, retried, abort_retries, send_waits, replaced;
    atomic_ullong buffered, buffered_peak; /* response bytes the front holds (stats) */
    atomic_ullong uploads;                 /* request bodies streamed to a worker (stats) */
    atomic_ullong up_kept, up_kept_peak;   /* request body bytes the front holds (stats) */
    atomic_ullong gathered, gathered_peak; /* small bodies read whole (gather_take) */
    uint64_t gather_max;
    struct shmipc__access_log *alog; /* borrowed; NULL: no access log */
    void (*on_hung)(void *data, const char *address);
    void *hung_data;
    struct fthread *threads[MAX_THREADS];
};

/* front_request.c: a request's life */
void shmipc__front_kick(struct fthread *t);
void shmipc__front_req_free(struct freq *r);
int shmipc__front_req_own_body(struct freq *r);
int shmipc__front_upload_rewind(struct freq *r);
void shmipc__front_req_done(struct freq *r);
void shmipc__front_answer_status(struct freq *r, int status);
int shmipc__front_req_send(struct freq *r);
int shmipc__front_req_refused(struct freq *r, int peer_left);
void shmipc__front_fs_free(struct fsess *fs);
void shmipc__front_req_drain(struct freq *r);
void shmipc__front_req_read(struct freq *r);
int shmipc__front_handler(shmipc_http_request *req, shmipc_http_response *res, void *ud);
void shmipc__front_on_log_timer(struct shmipc__timer *timer);

/* front_request.c, for front_ws.c */
void shmipc__front_req_abort(struct freq *r, int status, uint32_t reason);
void shmipc__front_req_finish(struct freq *r);
void shmipc__front_req_log_ws(struct freq *r);

/* front_ws.c: WebSocket connections through the front */
int shmipc__front_ws_refuse(shmipc_http_request *req, shmipc_http_response *res);
void shmipc__front_ws_accept(struct freq *r, uint8_t *head, size_t head_len);
int shmipc__front_ws_read(struct freq *r);
void shmipc__front_ws_timer(struct freq *r);
void shmipc__front_ws_detach(struct freq *r);

/* front_session.c: a thread's sessions and its queue */
void shmipc__front_fs_down(struct fsess *fs, int rc);
void shmipc__front_refresh(struct fthread *t, int connect_now);
void shmipc__front_connector_init(struct fthread *t);
void shmipc__front_connector_stop(struct fthread *t);
struct fsess *shmipc__front_claim(struct fthread *t, const struct freq *r);
void shmipc__front_fs_attach(struct fsess *fs, struct freq *r);
/* The config of a session to the worker at `addr`: ipc_unix for a unix socket, ipc for TCP. */
static inline const shmipc_config *shmipc__front_ipc_for(const struct shmipc__front *f,
                                                         const char *addr)
{
    return shmipc__addr_is_unix(addr) ? f->ipc_unix : f->ipc;
}

int shmipc__front_fs_has(const struct fsess *fs, const struct freq *r);
void shmipc__front_fs_detach(struct fsess *fs, struct freq *r);
int shmipc__front_requeue_head(struct fthread *t, struct freq *r, int rc);
/* `w` was found hung (front_request.c drain_ran_out): logged, counted, and opts.on_hung
 * called, once per worker. */
void shmipc__front_worker_hung(struct shmipc__front *f, struct fworker *w);
int shmipc__front_requeue(struct fthread *t, struct freq *r);
void shmipc__front_pump(struct fthread *t);
void shmipc__front_on_kick(struct shmipc__timer *timer);
void shmipc__front_on_wake(struct shmipc__timer *timer);
void shmipc__front_on_nudge(struct shmipc__watch *watch, int fd, unsigned events, void *data);

#endif
