/*
 * The HTTP/1.1 server: the reactor's workers (core/reactor/loop.h) joined to the socket-free
 * connection driver (net/http_conn.h). Each worker thread owns a loop, a listening socket,
 * its connections and their buffers; nothing is shared between workers but the server's
 * read-only route table. See docs/http.md.
 *
 * The public types shmipc_server_config, shmipc_server, shmipc_http_request and
 * shmipc_http_response are defined here; bindings/server.c exports the calls.
 */
#ifndef SHMIPC_CORE_NET_SERVER_H
#define SHMIPC_CORE_NET_SERVER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "shmipc.h"
#include "net/http_conn.h"
#include "net/http_parser.h"
#include "net/http_writer.h"
#include "net/ws_conn.h"
#include "reactor/loop.h"

#define SHMIPC__SERVER_DEFAULT_PORT         8080
#define SHMIPC__SERVER_DEFAULT_HEADER_MS    10000u
#define SHMIPC__SERVER_DEFAULT_KEEPALIVE_MS 60000u
#define SHMIPC__SERVER_DEFAULT_STOP_MS      5000u
#define SHMIPC__SERVER_MAX_TIMEOUT_MS       3600000u
#define SHMIPC__SERVER_MAX_PIPELINE         1024u
#define SHMIPC__SERVER_DEFAULT_KA_REQUESTS  1000u
#define SHMIPC__SERVER_MAX_KA_REQUESTS      4294967295ull
#define SHMIPC__SERVER_MAX_BODY             (1ull << 30)
/* Bytes per receive buffer of the server's loops: 16 KiB and a WebSocket frame head, rounded
 * to a cache line. */
#define SHMIPC__SERVER_RECV_BUF ((16u << 10) + 64u)
/* What a handler may add to one response. */
#define SHMIPC__SERVER_MAX_RESP_HEADERS  32u
#define SHMIPC__SERVER_RESP_HEADER_BYTES 4096u

struct shmipc_server_config {
    char address[SHMIPC_SERVER_MAX_ADDRESS + 1];
    uint16_t port;
    unsigned workers; /* 0: SHMIPC_WORKERS or the CPUs */
    int backend;      /* enum shmipc_backend */
    /* Meaningful when timeout_set (else the variable, then the default), by the API's rule:
     * -1 is never (no header deadline, no idle timeout, wait forever to stop, no ping, no idle
     * close), 0 is no keep-alive or an immediate stop. The WebSocket ones are -1 unless set. */
    int64_t timeout_ms[5];
    uint8_t timeout_set[5];
    struct shmipc__http_limits limits; /* 0 fields: defaults */
    uint32_t pipeline;                 /* 0: SHMIPC__HTTP_CONN_BUDGET */
    char server_name[SHMIPC_SERVER_MAX_NAME + 1];
    uint64_t ws_max_message;     /* 0: SHMIPC__WS_DEFAULT_MAX_MESSAGE */
    uint64_t ws_tx_high_water;   /* 0: SHMIPC__WS_DEFAULT_TX_HIGH_WATER */
    uint64_t ws_tx_limit;        /* 0: SHMIPC__WS_DEFAULT_TX_LIMIT (or the high-water mark) */
    uint8_t reuse_port;          /* 1: share the port with other processes (shmipc__workers_opts) */
    uint8_t reuse_port_set;      /* 0: SHMIPC_HTTP_REUSEPORT decides at shmipc__server_new() */
    uint32_t keepalive_requests; /* 0: SHMIPC_HTTP_KEEPALIVE_REQUESTS, else the default */
};

/* A route or a static response. */
struct shmipc__route {
    char *method; /* NULL: any method */
    size_t method_len;
    char *path; /* without the trailing '*' of a prefix route */
    size_t path_len;
    int prefix;
    shmipc_http_handler fn; /* NULL for a static response */
    void *user_data;
    shmipc_destroy_cb destroy;
    int at_head; /* shmipc__server_route_at_head(): runs at the head of a request with a body */
    uint16_t status;
    char *content_type;
    char *body;
    size_t body_len;
};

/* A WebSocket route (shmipc_server_websocket()). */
struct shmipc__ws_route {
    char *path; /* without the trailing '*' of a prefix route */
    size_t path_len;
    int prefix;
    char **protocols; /* the offered subprotocols, in order of preference */
    size_t nprotocols;
    shmipc_ws_open_cb on_open;
    shmipc_ws_message_cb on_message;
    shmipc_ws_close_cb on_close;
    void *user_data;
    shmipc_destroy_cb destroy;
};

struct shmipc__server_ws_cbs;

/*
 * One WebSocket connection: the protocol state (net/ws_conn.h) and what the server needs to
 * drive it. Allocated at the upgrade, freed with its TCP connection.
 */
struct shmipc_ws {
    struct shmipc__ws_conn c;
    const struct shmipc__ws_route *route;
    void *conn;              /* struct server_conn */
    void *data;              /* the application's (shmipc_ws_set_data()) */
    const char *subprotocol; /* the route's string, or NULL */
    size_t flight;           /* peeked bytes handed to the reactor, while `sending` */
    /* Timers (server.c, "WebSocket timers"): loop milliseconds, taken when the timer fires. */
    uint64_t rx_at;    /* input was last seen: the ping and idle timers */
    uint64_t ping_at;  /* the last automatic ping */
    uint64_t tx_at;    /* output progress was last seen, while `sending` (stall timer) */
    uint64_t close_at; /* the application's close gives up waiting at this time; 0: none */
    uint64_t tx_done;  /* bytes of completed sends */
    int64_t tx_mark;   /* write progress when tx_at was taken (see ws_progress()) */
    uint8_t rx_seen;   /* input since the timer last looked */
    uint8_t tx_seen;   /* output progress (a send started or completed) since then */
    uint8_t sending;
    uint8_t reported; /* on_close ran */
    /* An upgrade accepted later (shmipc__server_ws_accept()): its callbacks, in `own`. */
    const struct shmipc__server_ws_cbs *cbs; /* NULL for a WebSocket route's connection */
    struct shmipc__ws_route own;
    size_t drain_mark; /* on_drain once fewer bytes are queued; 0: not asked */
    uint8_t held;      /* shmipc__ws_hold(): the owner stopped reading the client */
    uint8_t hup;       /* the client left while the layer's pause stopped reading (on_hup) */
    /* The peer is gone (or takes nothing) with input unread: it is read for its close frame
     * alone until end_at or LINGER_BYTES (server_ws.c, ws_read_last()). */
    uint8_t ending;
    uint64_t end_at; /* loop ms: the read for the close frame gives up (1006) */
    size_t end_read; /* bytes read meanwhile */
};

/* Counters summed over the workers of the last run, for tests and the benchmark. */
struct shmipc__server_stats {
    struct shmipc__loop_stats loop; /* summed over the workers' loops */
    uint64_t connections;           /* accepted */
    uint64_t requests;              /* answered by a route, a static response, 404/405/501 */
    uint64_t timeouts;              /* closed by a timer: header, keep-alive, WebSocket ones */
    uint64_t ws_upgrades;           /* WebSocket connections accepted */
    uint64_t ws_pauses;             /* times a WebSocket connection stopped reading (PAUSE) */
    uint64_t ws_tx_max;             /* most bytes queued on one WebSocket connection */
    uint64_t ws_pings;              /* automatic pings sent (SHMIPC_SERVER_TIMEOUT_WS_PING) */
    uint64_t ws_idle_closes;        /* WebSockets failed by the idle timeout */
    uint64_t ws_stall_closes;       /* WebSockets whose output made no progress (keep-alive) */
    uint64_t uploads;               /* request bodies taken in pieces (shmipc__server_upload) */
    uint64_t upload_bytes;          /* their decoded bytes handed to the owners */
    uint64_t upload_rx_max;         /* most bytes one connection held while streaming a body */
};

struct shmipc__server_worker;

/* shmipc__server_thread_hooks(), below. */
typedef int (*shmipc__server_thread_fn)(struct shmipc__loop *loop, unsigned index,
                                        unsigned nworkers, void *data);

struct shmipc_server {
    struct shmipc_server_config cfg;
    struct shmipc__http_limits limits; /* resolved */
    /* header_ms: -1 no header deadline; idle_ms (keep-alive): -1 never, 0 no keep-alive;
     * stop_ms: -1 waits for requests in flight forever, 0 closes at once. stall_ms bounds a body
     * that stops arriving and output the peer stops reading: the keep-alive timeout when it is
     * positive, else its default (turning keep-alive off must not let a peer stall forever). */
    int64_t header_ms, idle_ms, stop_ms;
    uint32_t stall_ms, pipeline;
    uint32_t keepalive_requests;     /* requests a connection serves before it closes (resolved) */
    uint32_t ws_ping_ms, ws_idle_ms; /* 0: never */
    size_t rx_max;                   /* most unprocessed bytes a connection may hold */
    struct shmipc__loop_opts loop_opts;
    const char *server_name; /* NULL: no Server header */

    struct shmipc__route *routes;
    size_t nroutes, routes_cap;
    unsigned at_head_routes; /* routes marked by shmipc__server_route_at_head() */
    struct shmipc__ws_route *ws_routes;
    size_t nws_routes, ws_routes_cap;
    struct shmipc__ws_limits ws_limits; /* resolved */

    struct shmipc__workers *workers;
    struct shmipc__server_worker *w;
    unsigned nworkers;
    uint16_t port;
    const char *backend_name;
    struct shmipc__server_stats stats;

    int stop_fd; /* an eventfd that shmipc_server_stop() writes */
    atomic_int stop_requested;
    /* A stop was asked (shmipc_server_stop() or the free): from then on every answer closes its
     * connection, also one whose handler was running when the stop came (shmipc__server_stopping). */
    atomic_int closing;
    atomic_int running; /* shmipc_server_run() is in progress */

    shmipc__server_thread_fn thread_start, thread_end; /* shmipc__server_thread_hooks() */
    void *thread_data;
};

/* The request and response handles a handler sees (on the worker's stack). */
struct shmipc_http_request {
    const struct shmipc__http_request *r;
    const char *body;
    size_t body_len;
    uint32_t wild_off, wild_len; /* offsets from r->base */
    void *conn;                  /* struct server_conn: its addresses */
};

struct shmipc_http_response {
    struct shmipc__http_response *r;
    struct shmipc__server_worker *w;
    void *conn; /* struct server_conn, for borrowed and large bodies */
    int ended;
    int deferred; /* shmipc__server_defer() was called */
    int has_type;
    int head_length; /* an answer to HEAD said GET's Content-Length (r->body_len) */
};

int shmipc__server_config_new(struct shmipc_server_config **out);
int shmipc__server_config_set_address(struct shmipc_server_config *cfg, const char *address);
int shmipc__server_config_set_timeout_ms(struct shmipc_server_config *cfg, int which, uint32_t ms);
int shmipc__server_config_set_timeout(struct shmipc_server_config *cfg, int which, int timeout_ms);
int shmipc__server_config_set_limit(struct shmipc_server_config *cfg, int which, uint64_t value);
int shmipc__server_config_set_server_name(struct shmipc_server_config *cfg, const char *name);

int shmipc__server_new(const struct shmipc_server_config *cfg, struct shmipc_server **out);
int shmipc__server_route(struct shmipc_server *s, const char *method, const char *path,
                         shmipc_http_handler fn, void *user_data, shmipc_destroy_cb destroy,
                         int status, const char *content_type, const void *body, size_t len);
int shmipc__server_start(struct shmipc_server *s);
int shmipc__server_run(struct shmipc_server *s);
int shmipc__server_stop(struct shmipc_server *s);
void shmipc__server_free(struct shmipc_server *s);

int shmipc__server_websocket(struct shmipc_server *s, const char *path, const char *subprotocols,
                             shmipc_ws_open_cb on_open, shmipc_ws_message_cb on_message,
                             shmipc_ws_close_cb on_close, void *user_data,
                             shmipc_destroy_cb destroy);

/* The calls of bindings/ws.c; each checks that it runs on the connection's worker thread. */
int shmipc__ws_send(struct shmipc_ws *ws, int kind, const void *data, size_t len);
int shmipc__ws_ping(struct shmipc_ws *ws, const void *data, size_t len);
int shmipc__ws_close(struct shmipc_ws *ws, int code, const char *reason);

/*
 * Deferred requests (docs/serve.md, "The front"), for a layer that answers requests elsewhere
 * (core/serve/): a route handler calls shmipc__server_defer() and returns 0; the answer comes
 * later from shmipc__server_complete() on the connection's worker thread, with the ticket defer
 * gave. Until then the connection is DEFERRED. When the deferral ends otherwise, `cancel` runs
 * once, on the worker thread, with a reason below; after it (or after complete) the ticket is
 * stale and complete refuses it. `cancel` must not call back into the server.
 */
enum {
    SHMIPC__SERVER_CANCEL_CLIENT_GONE = 1, /* the client closed, reset, or stopped reading */
    SHMIPC__SERVER_CANCEL_TIMEOUT = 2,     /* the request's deadline passed: the client got 504 */
    SHMIPC__SERVER_CANCEL_ERROR = 3,       /* the handler failed after deferring: 500 */
    SHMIPC__SERVER_CANCEL_TOO_LARGE = 4,   /* a streamed body went over max_body: 413 */
    SHMIPC__SERVER_CANCEL_BAD_BODY = 5,    /* a streamed body's framing was invalid: 400 */
};
typedef void (*shmipc__server_cancel_fn)(void *data, int reason);

struct server_conn;
struct shmipc__server_ticket {
    struct server_conn *sc; /* pooled: stays valid memory while the worker runs */
    uint32_t gen;
};

int shmipc__server_defer(struct shmipc_http_response *res, uint32_t timeout_ms,
                         shmipc__server_cancel_fn cancel, void *data,
                         struct shmipc__server_ticket *out);
/*
 * The answer to a deferred request, on the connection's worker thread. `headers` and
 * `content_type` are copied before this returns; `body` is referenced until it was sent, then
 * release(user_data) runs (also when the answer cannot be used: a stale ticket, an error);
 * without `release` the body is copied too.
 * Returns 0, SHMIPC_ECLOSED for a stale ticket (the deferral was cancelled or completed), or
 * SHMIPC_EINVAL (off the worker thread, a status outside 200-999, a header the handler API
 * refuses too: a control byte, a name that is no token, Content-Length, Transfer-Encoding,
 * Date, Server, a Connection other than "close", a second Content-Type); the deferral stays
 * live after EINVAL. Completing from inside a route handler is allowed: the answer is sent
 * once that handler returned.
 */
int shmipc__server_complete(struct shmipc__server_ticket t, int status, const char *content_type,
                            const struct shmipc__http_header_out *headers, uint32_t nheaders,
                            const void *body, size_t body_len, shmipc_destroy_cb release,
                            void *user_data);

/*
 * The server's own error answer (the canned body of `status`, Connection: close) to a
 * deferred request, on the connection's worker thread; allocates nothing. 0, SHMIPC_ECLOSED
 * for a stale ticket, SHMIPC_EINVAL as complete().
 */
int shmipc__server_complete_error(struct shmipc__server_ticket t, int status);

/*
 * A streamed answer to a deferred request (docs/serve.md, "Streamed responses"), on the
 * connection's worker thread, instead of shmipc__server_complete(): stream_head() gives the
 * head (checked and copied as complete() does; `length` is the body's Content-Length, or
 * SHMIPC__SERVER_STREAM_UNSIZED: chunked for HTTP/1.1, close-delimited for HTTP/1.0), then
 * stream_body() queues pieces (referenced until sent, then release(user_data); copied without
 * `release`), then stream_end() (the last chunk; keep-alive goes on) or stream_abort() (the
 * connection closes: the client sees a truncated response, never a wrong one). HEAD, 204 and
 * 304 send no body, whatever is queued. The deferral's cancel stays armed until the end:
 * the client leaving, a send timeout (the client stops reading) or the deadline (the
 * deferral's timeout, between two pieces while fewer than `mark` bytes are queued) close the
 * connection and cancel it. `drain` runs (on the worker thread, after a send completed; it
 * must not call back into the server) each time queued bytes were sent and fewer than
 * `mark` are left: the caller reads its source again then. A sized body that gets more
 * bytes than `length`, or ends short of it, is aborted.
 * Returns 0, SHMIPC_ECLOSED for a stale ticket, SHMIPC_EINVAL as complete() (or a call out
 * of order), SHMIPC_ENOMEM; stream_body() releases the piece on failure.
 */
#define SHMIPC__SERVER_STREAM_UNSIZED UINT64_MAX
typedef void (*shmipc__server_drain_fn)(void *data);
int shmipc__server_stream_head(struct shmipc__server_ticket t, int status, const char *content_type,
                               const struct shmipc__http_header_out *headers, uint32_t nheaders,
                               uint64_t length, size_t mark, shmipc__server_drain_fn drain,
                               void *drain_data);
int shmipc__server_stream_body(struct shmipc__server_ticket t, const void *data, size_t len,
                               shmipc_destroy_cb release, void *user_data);
int shmipc__server_stream_end(struct shmipc__server_ticket t);
int shmipc__server_stream_abort(struct shmipc__server_ticket t);
/* Bytes of the stream queued on the connection and not yet written (0 for a stale ticket). */
size_t shmipc__server_stream_queued(struct shmipc__server_ticket t);
/* Body bytes of the stream the client was sent (given, less what is queued or in flight):
 * for the access log of a stream that ends now. Also inside the deferral's cancel callback,
 * where the ticket is already stale; 0 otherwise for a stale ticket. */
uint64_t shmipc__server_stream_sent(struct shmipc__server_ticket t);

/*
 * Deferred WebSocket upgrades (docs/http.md, "Deferred WebSocket upgrades"), for a layer that
 * lets another process decide (core/serve/front_ws.c). In a route handler,
 * shmipc__server_ws_defer() validates `req` as a WebSocket handshake (the checks of
 * ws_handshake.h, and no "Connection: close"): an invalid one fills the response with its
 * 400 or 426 (Connection: close) and returns SHMIPC_EPROTO, and the handler returns 0 to send
 * it; a valid one is deferred as shmipc__server_defer() does (same ticket, timeout, cancel).
 * Then, on the connection's worker thread, either shmipc__server_ws_accept() answers 101
 * (Upgrade, Connection and the server's Sec-WebSocket-Accept, then `headers`, e.g.
 * Sec-WebSocket-Protocol: one the client offered, the caller's to check) and the connection
 * speaks WebSocket with `cbs` (on the worker thread, the first calls possibly from inside
 * ws_accept: frames the client sent behind its handshake; *out is set before them and is the
 * connection, valid until on_close returned), or shmipc__server_complete() / stream_head() refuses it with any other
 * status as a normal response, with Connection: close. The client leaving while deferred
 * cancels with CLIENT_GONE, the timeout with TIMEOUT (504), as for any deferral.
 * ws_accept returns 0; SHMIPC_ECLOSED for a stale ticket; SHMIPC_EINVAL for a deferral that
 * was not an upgrade's, a header complete() refuses or one of the handshake's own (Upgrade,
 * Connection, Sec-WebSocket-Accept), more than SHMIPC__SERVER_MAX_RESP_HEADERS - 3 headers,
 * cbs without on_message and on_close (the deferral stays live after EINVAL);
 * SHMIPC_EPIPE when the server is stopping (the client got 503, the deferral ended);
 * SHMIPC_ENOMEM.
 *
 * After the accept: the server's WebSocket timers apply (ping, idle, stall); on_close comes
 * once (1006 for a client gone without a close frame); shmipc__ws_send/ping/close send.
 * Backpressure for an owner that relays: shmipc__ws_queued() is the bytes queued towards the
 * client; shmipc__ws_drain_at(ws, mark) asks for one on_drain once fewer than `mark` are
 * queued (at once, from the call, if already so: returns 1 then, and no on_drain comes);
 * shmipc__ws_hold(ws, 1) stops reading the client (messages of input already read still
 * come), shmipc__ws_hold(ws, 0) reads again. None of the callbacks may free the server.
 */
struct shmipc__server_ws_cbs {
    shmipc_ws_message_cb on_message;
    void (*on_ping)(struct shmipc_ws *ws, const void *data, size_t len, void *user_data);
    void (*on_pong)(struct shmipc_ws *ws, const void *data, size_t len, void *user_data);
    shmipc_ws_close_cb on_close;
    void (*on_drain)(struct shmipc_ws *ws, void *user_data);
};
int shmipc__server_ws_defer(struct shmipc_http_response *res, const struct shmipc_http_request *req,
                            uint32_t timeout_ms, shmipc__server_cancel_fn cancel, void *data,
                            struct shmipc__server_ticket *out);
int shmipc__server_ws_accept(struct shmipc__server_ticket t,
                             const struct shmipc__http_header_out *headers, uint32_t nheaders,
                             const struct shmipc__server_ws_cbs *cbs, void *user_data,
                             struct shmipc_ws **out);
/* An unsolicited pong (the front relays a worker's WS_PONG). */
int shmipc__ws_pong(struct shmipc_ws *ws, const void *data, size_t len);
size_t shmipc__ws_queued(const struct shmipc_ws *ws);
int shmipc__ws_drain_at(struct shmipc_ws *ws, size_t mark);
int shmipc__ws_hold(struct shmipc_ws *ws, int hold);

/*
 * Streamed request bodies (docs/http.md, "Streamed request bodies"), for a layer that forwards
 * a body as it arrives (core/serve/). shmipc__server_route_at_head() marks a registered handler
 * route (same method and path) to run at the head of a request with a body (body NULL,
 * body_len 0), before any body byte is read. There the handler defers
 * (shmipc__server_defer()) and calls shmipc__server_upload(): from then on, on the worker
 * thread, on_body() gets the decoded body (chunked framing, extensions and trailers removed) in
 * pieces as the client's bytes arrive (the memory is lent for the call), and on_end() once the
 * body ended whole. on_body() returning nonzero holds the body: no more pieces, and the socket
 * is no longer read past a bounded buffer (RX_PAUSE), until shmipc__server_upload_resume().
 * Both may call complete() or the stream_*() calls. A body above max_body (413) or with invalid
 * framing (400) cancels the deferral (SHMIPC__SERVER_CANCEL_TOO_LARGE / _BAD_BODY) and answers
 * that status with a close, or closes when the answer has started. The deadline of the
 * deferral covers the body (a client that stops sending gets 504, CANCEL_TIMEOUT), and so
 * does the stall (keep-alive) timeout between two reads of a body not held (CANCEL_TIMEOUT,
 * closed without an answer); a client that leaves mid-body cancels it (CLIENT_GONE). An answer given before the body's end is sent
 * with "Connection: close" and the connection closes after it (lingering, the rest of the
 * body is drained, never parsed as a request); a body read to its end keeps keep-alive.
 * A handler that answers at the head without deferring closes the connection the same way.
 * Returns 0, SHMIPC_EINVAL (not in a deferring at-head handler), SHMIPC_ENOENT (no such route),
 * SHMIPC_EBUSY (the server runs), SHMIPC_ECLOSED (resume of a stale ticket).
 */
typedef int (*shmipc__server_body_fn)(void *data, const void *piece, size_t len);
typedef void (*shmipc__server_body_end_fn)(void *data);
int shmipc__server_route_at_head(struct shmipc_server *s, const char *method, const char *path);
int shmipc__server_upload(struct shmipc_http_response *res, shmipc__server_body_fn on_body,
                          shmipc__server_body_end_fn on_end, void *data);
int shmipc__server_upload_resume(struct shmipc__server_ticket t);

/* Where a route handler runs: its worker thread (index of nworkers) and loop, the client
 * connection's socket, and its peer and local addresses (ss_family AF_UNSPEC when the kernel
 * could not say, e.g. the peer already reset; asked once per connection, not per request). */
struct shmipc__server_where {
    unsigned index, nworkers;
    struct shmipc__loop *loop;
    int fd;
    const struct sockaddr_storage *peer, *local;
};
int shmipc__server_where(const struct shmipc_http_response *res, struct shmipc__server_where *out);

/*
 * The request's client (`local` 0) or listener (`local` 1) address, as getpeername() /
 * getsockname() (shmipc_http_request_peer/_local): at most *len bytes into addr, *len its
 * length. 0, or SHMIPC_ECONNRESET when the kernel could not tell. The handler's thread.
 */
int shmipc__server_request_addr(const struct shmipc_http_request *req, int local,
                                struct sockaddr *addr, socklen_t *len);

/*
 * Per worker thread hooks for a layer that keeps state in the workers' loops (core/serve/):
 * `start` runs on each worker thread before its loop runs (a negative return fails the start),
 * `end` on it after its connections are gone (the graceful stop ran), before the loop is
 * freed. One registration per server, before it starts: SHMIPC_EBUSY otherwise.
 */
int shmipc__server_thread_hooks(struct shmipc_server *s, shmipc__server_thread_fn start,
                                shmipc__server_thread_fn end, void *data);

/* A test seam: when set, shmipc__server_run() calls it right after its check of the stop flag,
 * before it starts the server (a stop that lands there must still stop it). NULL in
 * production. */
extern void (*shmipc__server_run_window)(struct shmipc_server *s);

/* The counters of the last run (all zero before a run ended). Not while running. */
void shmipc__server_stats(const struct shmipc_server *s, struct shmipc__server_stats *out);

/*
 * The checks of a response header set by an application (shmipc_http_response_add_header(),
 * shmipc_http_pending_add_header()): a token name, a value without control bytes, none of the
 * server's own fields; *kind says what the field is to the server. Content-Length, 1 to 19
 * ASCII digits, is LENGTH (*length its value): the callers take it on an answer to HEAD only,
 * where it is the length of GET's body (RFC 9110 8.6). 0 or SHMIPC_EINVAL.
 */
enum {
    SHMIPC__HEADER_PLAIN = 0,
    SHMIPC__HEADER_TYPE = 1,
    SHMIPC__HEADER_CLOSE = 2,
    SHMIPC__HEADER_LENGTH = 3
};
int shmipc__http_header_check(const char *name, const char *value, int *kind, uint64_t *length);
int shmipc__http_response_add_header(struct shmipc_http_response *res, const char *name,
                                     const char *value);
int shmipc__http_response_body(struct shmipc_http_response *res, const void *data, size_t len,
                               void *user_data, shmipc_destroy_cb release, int borrow);

/*
 * Answers from any thread (server_post.c; the public shmipc_http_response_defer() and
 * shmipc_http_pending_*, documented in shmipc.h). A handler defers its request and gets a
 * handle; the owner of the handle fills in the answer on any thread and sends it, which queues
 * the handle on the worker's post box and wakes the worker (an eventfd in its loop); the
 * worker answers the request with shmipc__server_complete(). `end` runs once, on the worker
 * thread, when the request stops waiting (reasons: SHMIPC__PENDING_*).
 */
enum {
    SHMIPC__PENDING_SENT = 0,
    SHMIPC__PENDING_CLIENT_GONE = 1,
    SHMIPC__PENDING_TIMEOUT = 2,
    SHMIPC__PENDING_FAILED = 3,
    SHMIPC__PENDING_ABANDONED = 4,
};
struct shmipc__pending;
typedef void (*shmipc__pending_end_fn)(void *data, int reason);
int shmipc__pending_new(struct shmipc_http_response *res, int timeout_ms,
                        shmipc__pending_end_fn end, void *data, struct shmipc__pending **out);
int shmipc__pending_set_status(struct shmipc__pending *p, int status);
int shmipc__pending_add_header(struct shmipc__pending *p, const char *name, const char *value);
int shmipc__pending_body(struct shmipc__pending *p, const void *data, size_t len, void *user_data,
                         shmipc_destroy_cb release, int borrow);
int shmipc__pending_send(struct shmipc__pending *p);
int shmipc__pending_waiting(const struct shmipc__pending *p);
void shmipc__pending_free(struct shmipc__pending *p);

#endif
