/*
 * Internal to the HTTP server's files (server.c, server_config.c, server_conn.c,
 * server_defer.c, server_route.c, server_worker.c, server_ws.c): the worker and connection structs and the calls between those
 * files. Nothing outside core/net/server*.c includes this; the rest of the library uses
 * server.h.
 */
#ifndef SHMIPC_CORE_NET_SERVER_INT_H
#define SHMIPC_CORE_NET_SERVER_INT_H

#include "net/server.h"

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "net/conn_state.h"
#include "net/ws_codec.h"
#include "net/ws_handshake.h"

#include <pthread.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define RX_STD       8192u      /* pooled receive buffers; larger requests get their own */
#define RX_PAUSE     65536u     /* unanswered input held while a batch is sent; then no reads */
#define TX_IOV       64u        /* iovecs of a batch; the reactor takes up to 64 without malloc */
#define TX_ARENA     16384u     /* heads (and small bodies) of a batch */
#define HEAD_RESERVE 6144u      /* a head with 4 KiB of handler headers, plus a copied body */
#define LINGER_MS    2000u      /* how long a half-closed connection waits for the peer's FIN */
#define LINGER_BYTES (1u << 20) /* how much input a lingering close drains before closing */
#define POOL_KEEP    1024u      /* free buffers a worker keeps per list */
#define WS_CLOSE_MS  2000u      /* how long the application's close waits for the peer's */

/* A batch's iovecs and arena, held by a connection while its batch is built and sent. */
struct txbuf {
    struct txbuf *next;
    struct iovec iov[TX_IOV];
    char arena[TX_ARENA];
};

/* A piece of a streamed answer's body (shmipc__server_stream_body): queued, then in the batch
 * in flight, then released. */
struct spiece {
    struct spiece *next;
    const char *data;
    size_t len;
    shmipc_destroy_cb fn; /* NULL: the data was copied right behind this node */
    void *user_data;
};

/* Something to free or call once the batch in flight has been written. */
struct release {
    struct release *next;
    shmipc_destroy_cb fn; /* NULL: the body was copied right behind this node */
    void *user_data;
};

struct server_conn {
    struct server_conn *prev, *next; /* the worker's list, for a graceful stop */
    struct shmipc__server_worker *w;
    struct shmipc__conn *conn;
    struct shmipc__http_conn http;
    struct shmipc__timer timer;
    uint64_t deadline; /* loop ms when the connection times out; 0: none */
    uint64_t timer_at; /* when the timer fires, while active */
    size_t tx_mark;    /* the reactor's pending bytes when the send timer last saw progress */
    size_t drained;    /* input dropped while lingering */
    uint8_t state;     /* enum shmipc__cs_state: the lifecycle (conn_state.h) */
    uint8_t inflight;  /* an HTTP batch is being sent (WRITING, CLOSING, or the 101's) */
    uint8_t peer_done; /* the peer's FIN arrived */
    uint8_t rx_end;    /* the reactor ended the input (on_end: a FIN or a failure) */
    uint8_t in_head;   /* a head is partly here: the header deadline runs */
    uint8_t fresh;     /* no request yet: the header timeout covers the first */
    uint32_t nreq;     /* requests handled on this connection (keepalive_requests) */
    char *rx;
    size_t rx_len, rx_cap;
    size_t rx_done;   /* bytes at the front that the batch in flight may point into */
    char *rx_retired; /* an older buffer the batch in flight points into */
    struct txbuf *tx;
    struct shmipc__http_batch batch;
    struct release *releases;
    struct shmipc_ws *ws; /* set by an accepted upgrade */
    /* A deferred request: see shmipc__server_defer(). */
    uint32_t defer_gen;      /* bumped when a deferral ends: older tickets are stale */
    uint8_t defer_on;        /* a deferral is live (set in the handler, before DEFERRED) */
    uint8_t answered;        /* complete() or the deadline filled http.deferred in */
    uint64_t defer_deadline; /* loop ms of the request's deadline (504); 0: none */
    uint32_t defer_ms;       /* its timeout */
    shmipc__server_cancel_fn on_cancel;
    void *cancel_data;
    struct release *answer_rel; /* the answer's memory, moved to `releases` when batched */
    /* A deferred WebSocket upgrade (shmipc__server_ws_defer): the handshake's answer key, kept
     * because the request's bytes are dropped while it waits. */
    uint8_t ws_defer;
    char ws_accept[SHMIPC__WS_ACCEPT_LEN + 1];
    /* A streamed answer (server_defer.c, shmipc__server_stream_head): DEFERRED until it ends. */
    uint8_t streaming;     /* the head was given */
    uint8_t stream_end;    /* STREAM_ENDED or STREAM_ABORTED once the owner said so */
    uint8_t head_sent;     /* the head is in a batch */
    uint8_t last_sent;     /* the end (last chunk) is in the batch in flight */
    uint8_t stream_closes; /* the connection closes after the body */
    uint8_t in_cancel;     /* the deferral's cancel callback runs */
    struct shmipc__http_response stream_resp; /* what the pieces are framed with */
    uint64_t stream_len;                      /* Content-Length, or SHMIPC__SERVER_STREAM_UNSIZED */
    uint64_t stream_given;                    /* body bytes the owner gave */
    uint32_t stream_ms;                /* the deferral's timeout: between two pieces (0: none) */
    uint64_t stream_at;                /* loop ms when the owner's next piece is late; 0: none */
    uint64_t send_at;                  /* loop ms when the batch in flight must have moved */
    size_t stream_mark;                /* queued bytes at which the owner is held back */
    size_t sq_bytes;                   /* queued or in flight, not yet written */
    struct spiece *sq_head, **sq_tail; /* not yet in a batch */
    struct spiece *sq_sent;            /* in the batch in flight */
    shmipc__server_drain_fn on_drain;
    void *drain_data;
    /* The client's and the local address, asked of the kernel once per connection, on the
     * first shmipc__server_where() that wants them (the front names both in every request
     * head). The memset at accept forgets them: a pooled connection never hands its last
     * client's address to the next. */
    uint8_t addrs_known;
    struct sockaddr_storage peer_addr, local_addr;
    socklen_t peer_len, local_len;
    /* A streamed request body (shmipc__server_upload): pieces go to the owner while DEFERRED. */
    uint8_t up_on;   /* the owner takes the body; cleared at its end or the deferral's */
    uint8_t up_held; /* the owner asked for no more pieces until upload_resume() */
    uint8_t in_pump; /* upload_pump() runs: answers wait for the timer */
    uint64_t up_at;  /* loop ms when a body that stopped arriving is given up (the stall timeout) */
    shmipc__server_body_fn on_body;
    shmipc__server_body_end_fn on_body_end;
    void *up_data;
    struct shmipc__http_field fields[]; /* limits.max_headers */
};

struct shmipc__server_worker {
    struct shmipc_server *srv;
    unsigned index;
    struct shmipc__loop *loop;
    struct shmipc__acceptor *acceptor;
    struct shmipc__http_date date;
    struct shmipc__timer date_timer;
    struct server_conn *conns;
    unsigned nconns;
    int draining; /* the worker's teardown has begun (its thread only) */
    /* A route handler is running: its response lives in the scratch below, which an answer
     * sent from inside it (complete() for another connection) would overwrite. */
    unsigned in_handler;
    /* Free lists. */
    struct server_conn *free_conns;
    char *free_rx;
    unsigned nfree_rx;
    struct txbuf *free_tx;
    unsigned nfree_tx;
    /* A handler's response: headers and small bodies live here until the batch copies them. */
    struct shmipc__http_header_out hdrs[SHMIPC__SERVER_MAX_RESP_HEADERS];
    char hbytes[SHMIPC__SERVER_RESP_HEADER_BYTES];
    size_t hused;
    char body[SHMIPC__HTTP_COPY_MAX];
    char allow[256];
    struct shmipc__ws_handshake hs; /* an upgrade's response points here until batched */
    pthread_t thread;
    struct shmipc__server_stats stats;
    struct shmipc__postbox *post; /* answers from other threads (server_post.c); lazily */
};

/* server_conn.c: the connection lifecycle */
void shmipc__server_conn_set_deadline(struct server_conn *sc, uint64_t deadline);
uint64_t shmipc__server_conn_after(const struct server_conn *sc, uint32_t ms);
void shmipc__server_conn_close(struct server_conn *sc);
void shmipc__server_conn_linger(struct server_conn *sc);
void shmipc__server_conn_event(struct server_conn *sc, int ev, const void *data, size_t len);
/* The acceptor's callbacks (server_worker.c opens the acceptor with them). */
extern const struct shmipc__conn_cbs shmipc__server_conn_cbs;
void shmipc__server_conn_accept(struct shmipc__acceptor *a, struct shmipc__conn *c, void *data);

/* server_worker.c: the workers and their pools */
int shmipc__server_worker_setup(struct shmipc__loop *loop, int listen_fd, unsigned index,
                                void *data);
void shmipc__server_worker_teardown(struct shmipc__loop *loop, unsigned index, void *data);
void shmipc__server_worker_free_pools(struct shmipc__server_worker *w);
char *shmipc__server_rx_get(struct shmipc__server_worker *w);
void shmipc__server_rx_put(struct shmipc__server_worker *w, char *b, size_t cap);
struct txbuf *shmipc__server_tx_get(struct shmipc__server_worker *w);
void shmipc__server_tx_put(struct shmipc__server_worker *w, struct txbuf *t);

/* The server is going away: a stop was asked (maybe while a handler of this worker ran, before
 * its teardown began) or the teardown drains. Answers then close their connections and new
 * WebSockets are refused, as nginx does once it is exiting. */
static inline int shmipc__server_stopping(const struct shmipc__server_worker *w)
{
    return w->draining || atomic_load_explicit(&w->srv->closing, memory_order_relaxed);
}

/* Whether the answer in progress ends keep-alive: a stop (above), a keep-alive timeout of 0
 * (nginx's keepalive_timeout 0), or the connection's last request by keepalive_requests. */
static inline int shmipc__server_keep_off(const struct server_conn *sc)
{
    return shmipc__server_stopping(sc->w) || sc->w->srv->idle_ms == 0 ||
           sc->nreq >= sc->w->srv->keepalive_requests;
}

/* server_defer.c: deferred requests (the calls themselves are in server.h) */
enum { STREAM_ENDED = 1, STREAM_ABORTED = 2 };
void shmipc__server_defer_cancel(struct server_conn *sc, int reason);
void shmipc__server_stream_free(struct server_conn *sc);
void shmipc__server_upload_pump(struct server_conn *sc);

/* server_post.c: the worker's post box, closed by its teardown once its connections are gone
 * (answers sent later are refused) */
void shmipc__server_post_close(struct shmipc__server_worker *w);

/* server_route.c: request dispatch and routes */
int shmipc__server_at_head(void *user_data, const struct shmipc__http_request *req);
int shmipc__server_handle(void *user_data, const struct shmipc__http_request *req, const char *body,
                          size_t body_len, struct shmipc__http_response *resp);
void shmipc__server_canned(struct shmipc__http_response *resp, int status);
void shmipc__server_ws_route_free(struct shmipc__ws_route *rt);

/* server_ws.c: the WebSocket glue */
int shmipc__server_ws_upgrade(struct server_conn *sc, const struct shmipc__ws_route *wsr,
                              const struct shmipc__http_request *req, const char *body,
                              size_t body_len, struct shmipc__http_response *resp);
void shmipc__server_ws_arm(struct server_conn *sc);
void shmipc__server_ws_flush(struct server_conn *sc);
void shmipc__server_ws_input(struct server_conn *sc, char *data, size_t len);
void shmipc__server_ws_timeout(struct server_conn *sc);
void shmipc__server_ws_peer_gone(struct server_conn *sc);
void shmipc__server_ws_error(struct server_conn *sc);
struct shmipc_ws *shmipc__server_ws_new(struct server_conn *sc,
                                        const struct shmipc__server_ws_cbs *cbs, void *user_data);

#endif
