/*
 * The front of shmipc-serve (docs/serve.md, "The front"): a route handler on the HTTP server
 * that hands each matching request to an application worker process over a shmipc stream
 * (the protocol of docs/serve.md, net/serve_frame.h) and answers the client with the worker's
 * response, through the server's deferred responses (net/server.h).
 *
 * Each reactor worker thread of the server owns one shmipc session to every application
 * worker, created on that thread and watched in its loop; nothing blocks the loop but the
 * connect (and its handshake) of a session, bounded by the connect timeout. An application
 * worker serves one request at a time: an atomic busy flag per worker, claimed by
 * compare-and-swap, hands it to one request of one thread. A request that finds no worker free
 * waits in its thread's FIFO (one atomic total over the threads: the 503 limit); a thread that
 * frees a worker while others have requests waiting nudges them through their eventfds.
 *
 * Failure mapping (docs/serve.md, "The front"): the worker's session ends or the stream ends
 * mid-request: 502, the session reconnects with a back-off; the wait queue is full: 503 with
 * `Retry-After: 1`; the request's deadline: 504 (the server's) and ABORT TIMEOUT to the
 * worker; the client leaves: ABORT CLIENT_GONE; a bad frame: 502 and ABORT PROTOCOL; a
 * BODY frame over max_response: 502 and ABORT TOO_LARGE. A response whose END does not come
 * with it is streamed (docs/serve.md, "Streamed responses"): a failure after its head went
 * out closes the client connection, the body cut short. After an ABORT of the front's the
 * worker stays busy until its stream ends (its close), at most SHMIPC__FRONT_DRAIN_MS.
 *
 * Threading: new, attach and free on one thread, attach before the server starts, free after
 * the server stopped (its threads' state goes with the server's stop) or was freed;
 * set_workers, set_deadline and stats from any thread.
 */
#ifndef SHMIPC_CORE_SERVE_FRONT_H
#define SHMIPC_CORE_SERVE_FRONT_H

#include <stddef.h>
#include <stdint.h>

#include "shmipc.h"

struct shmipc_server;
struct shmipc__front;

#define SHMIPC__FRONT_MAX_WORKERS      64u         /* application workers in one set */
#define SHMIPC__FRONT_MAX_ADDRESS      107u        /* bytes of a worker's shmipc address */
#define SHMIPC__FRONT_DEFAULT_QUEUE    1024u       /* requests waiting for a worker, in all */
#define SHMIPC__FRONT_NO_QUEUE         UINT32_MAX  /* queue_max: no request waits */
#define SHMIPC__FRONT_DEFAULT_DEADLINE 30000u      /* ms per request, from its arrival */
#define SHMIPC__FRONT_NO_DEADLINE      UINT32_MAX  /* deadline_ms: requests wait for ever */
#define SHMIPC__FRONT_MAX_DEADLINE     3600000u    /* ms, the most a finite deadline can be */
#define SHMIPC__FRONT_DEFAULT_CONNECT  1000u       /* ms for a session's connect and handshake */
#define SHMIPC__FRONT_DEFAULT_RESPONSE (64u << 20) /* bytes of a response body */
/* Requests in flight per worker whose sessions granted TAKEN (docs/serve.md, "HELLO and
 * TAKEN"): 1 is one at a time; the most is SHMIPC__FRONT_MAX_PIPELINE. */
#define SHMIPC__FRONT_DEFAULT_PIPELINE 1u
#define SHMIPC__FRONT_MAX_PIPELINE     16u
/* Requests in flight on one session, and to a worker whose HELLO answered a concurrency above 1
 * (docs/serve.md, "HELLO and TAKEN"): a larger answer counts as this; 0 (not said) as 1. */
#define SHMIPC__FRONT_MAX_CONCURRENCY 256u
#define SHMIPC__FRONT_LIMIT_RESPONSE  (1ull << 32) /* most max_response may be */
#define SHMIPC__FRONT_DRAIN_MS        5000u        /* after the front's ABORT, at most */
#define SHMIPC__FRONT_BACKOFF_MIN_MS  20u          /* first reconnect after a session ended */
#define SHMIPC__FRONT_BACKOFF_MAX_MS  2000u        /* the back-off doubles up to this */
/* A request a stopping worker refused (ABORT SHUTDOWN: not processed) goes to another worker
 * at most this many times, and only when the front still holds its body: a body of at most
 * SHMIPC__FRONT_RETRY_BODY bytes is kept until the worker's first answer for that. The bound
 * only ends a loop among workers that all refuse: workers recycled every few requests under
 * load (--max-requests 5) refused some requests 4 times in a row, as each new worker took its
 * few and refused the rest (4 was the bound: a 503 for about one upload in 100). */
#define SHMIPC__FRONT_RETRIES    16u
#define SHMIPC__FRONT_RETRY_BODY (64u << 10)
/* Small bodies (a Content-Length of at most SHMIPC__FRONT_RETRY_BODY) are read whole before a
 * worker is claimed, in memory the front takes at the head: at most this many bytes of them
 * at once over all connections; past it, a body is streamed to a worker as a larger one. */
#define SHMIPC__FRONT_DEFAULT_GATHER (16u << 20)
#define SHMIPC__FRONT_LIMIT_GATHER   (1ull << 40)

struct shmipc__front_opts {
    const char *const *workers; /* shmipc addresses of the application workers */
    unsigned nworkers;          /* 1..SHMIPC__FRONT_MAX_WORKERS */
    uint32_t queue_max;         /* 0: the default; waiting requests in all, or NO_QUEUE */
    uint32_t deadline_ms;       /* 0: the default; up to 3600000, or SHMIPC__FRONT_NO_DEADLINE */
    uint32_t connect_ms;        /* 0: the default; up to 3600000 */
    uint64_t max_response;      /* 0: the default; response bytes held at once, up to the limit */
    uint64_t gather_max;        /* 0: the default; small bodies read whole at once, all clients */
    uint32_t pipeline;          /* 0: the default; requests in flight per TAKEN worker, 1..16 */
    /* Offer HELLO on every session, also with a pipeline of 1: a worker that answers a
     * concurrency above 1 then gets up to that many requests at once (its own accept decides
     * the order). Only for workers that know HELLO; a pipeline over 1 offers it anyway. */
    uint8_t hello;
    /* The sessions' config (copied); NULL: defaults. Without peer uids, the front's own uid
     * is the list: a worker socket made by another uid is refused. */
    const shmipc_config *ipc;
    /* One line per finished request (serve/access_log.h), written from each reactor thread's
     * buffer; NULL: none. Borrowed: it outlives the front. */
    struct shmipc__access_log *access_log;
    /* Called at most once per worker, on a reactor thread, when the worker is found hung: a
     * request past its deadline whose ABORT it had not taken (nor found room for) when the
     * drain after it ran out (SHMIPC__FRONT_DRAIN_MS): nothing of its session ran since, its
     * only thread held by the app or the process stopped. shmipc-serve kills and restarts it
     * (docs/serve.md, "Hung workers"). NULL: the front only counts it (stats `hung`). */
    void (*on_hung)(void *data, const char *address);
    void *hung_data;
};

enum {
    SHMIPC__FRONT_WORKER_DOWN = 0,    /* no thread has a session to it */
    SHMIPC__FRONT_WORKER_UP = 1,      /* some thread has a session to it */
    SHMIPC__FRONT_WORKER_RETIRED = 2, /* not in the current set; sessions close once idle */
};

struct shmipc__front_worker_stats {
    char address[SHMIPC__FRONT_MAX_ADDRESS + 1];
    int state;            /* SHMIPC__FRONT_WORKER_* */
    unsigned sessions;    /* live sessions to it: one per thread, and replaced ones draining */
    unsigned in_flight;   /* requests in flight to it: at most its concurrency, or the pipeline */
    unsigned taken;       /* of its sessions, those whose HELLO granted TAKEN */
    unsigned concurrency; /* what its last HELLO answered (capped), 1 before any answer */
    uint64_t served;      /* responses relayed */
    uint64_t failures;    /* 502s: session ended, stream ended, bad frame, too large */
    unsigned hung;        /* 1 once found hung (opts.on_hung) */
};

struct shmipc__front_stats {
    unsigned queued;           /* requests waiting for a worker now */
    unsigned nworkers;         /* entries below: the current set, then retired ones still open */
    unsigned known;            /* worker records the front holds: the set and retired ones some
                                * session still points at */
    uint64_t rejected;         /* 503s (queue full) */
    uint64_t timeouts;         /* requests cancelled by their deadline (504; a WebSocket: 1011) */
    uint64_t client_gone;      /* requests cancelled because the client left */
    uint64_t retried;          /* requests a stopping worker refused, given to another worker */
    uint64_t abort_retries;    /* tries of an ABORT the worker's full session could not take */
    uint64_t send_waits;       /* times a request found its session's queue or memory full */
    uint64_t replaced;         /* sessions replaced as they refused new streams (EUNHEALTHY) */
    uint64_t buffered;         /* response bytes the front holds now (read, not yet sent) */
    uint64_t buffered_peak;    /* the most it held at once */
    uint64_t uploads;          /* request bodies streamed to a worker as they arrived */
    uint64_t upload_kept;      /* request body bytes the front holds now (a piece per request) */
    uint64_t upload_kept_peak; /* the most it held at once */
    uint64_t gathered;         /* small request bodies the front reads whole now (bytes taken) */
    uint64_t gathered_peak;    /* the most at once: at most gather_max */
    struct shmipc__front_worker_stats w[2 * SHMIPC__FRONT_MAX_WORKERS];
};

/* SHMIPC_EINVAL / SHMIPC_ERANGE for bad options, SHMIPC_ENOMEM. */
int shmipc__front_new(const struct shmipc__front_opts *opts, struct shmipc__front **out);

/*
 * Routes every request matching `pattern` (a shmipc_server_route path, any method) to the
 * workers, and hooks the server's worker threads. Once per front and per server, before the
 * server starts (SHMIPC_EBUSY otherwise).
 */
int shmipc__front_attach(struct shmipc__front *f, struct shmipc_server *srv, const char *pattern);

/*
 * Replaces the set of workers (a reload): new requests go to the new set; a request in flight
 * on a worker left out finishes there, and its sessions close once idle. Addresses in both
 * sets keep their sessions. Thread safe.
 */
int shmipc__front_set_workers(struct shmipc__front *f, const char *const *addrs, unsigned n);

/*
 * Replaces the requests' deadline (a reload; deadline_ms of the options: 0 the default, up to
 * 3600000, or SHMIPC__FRONT_NO_DEADLINE): a request has the deadline in force when its handler
 * ran (at its head), so requests already there keep theirs. SHMIPC_EINVAL for NULL, SHMIPC_ERANGE past
 * the bound. Thread safe.
 */
int shmipc__front_set_deadline(struct shmipc__front *f, uint32_t deadline_ms);

/* Counters and worker states. Thread safe. */
int shmipc__front_stats(struct shmipc__front *f, struct shmipc__front_stats *out);

/* After the server stopped or was freed. NULL is a no-op. */
void shmipc__front_free(struct shmipc__front *f);

#endif
