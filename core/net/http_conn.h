/*
 * One HTTP/1.1 connection's protocol logic without sockets: bytes in, responses out.
 *
 * The owner (the server's connection, or the in-memory loopback of the tests) receives
 * bytes into its buffer and calls shmipc__http_conn_process(), which parses every complete
 * request there (pipelining), decodes bodies, answers "Expect: 100-continue", calls the
 * handler, and appends the responses to a batch that the owner then writes with one
 * vectored write. Errors become canned responses followed by a close. Nothing is allocated.
 *
 * Per call the owner learns how many bytes to drop from the front of its buffer and what to
 * do next (read more, call again after writing, or close). The iovecs of the batch may point
 * into the receive buffer (a handler may answer with request bytes, as an echo does) and
 * into handler memory, so the owner writes the batch out before it drops, moves or
 * overwrites buffer bytes.
 */
#ifndef SHMIPC_CORE_NET_HTTP_CONN_H
#define SHMIPC_CORE_NET_HTTP_CONN_H

#include <stddef.h>
#include <stdint.h>

#include "net/http_parser.h"
#include "net/http_writer.h"

/*
 * Answers one request. `resp` arrives prepared by shmipc__http_response_init(req); the
 * handler sets at least the status and the body. `body` is the decoded request body
 * (body_len bytes, in the receive buffer). The header array and content type are copied
 * into the batch right after the handler returns, so they must outlive its call (static or
 * user_data memory, not its stack); the body is referenced until the batch has been
 * written. STREAM responses are not supported here. Returns 0, or a negative code to
 * answer 500 and close, or SHMIPC__HTTP_DEFER: the answer comes later (an application worker
 * computes it, docs/serve.md); the request's bytes may be dropped once the handler returns, so
 * it takes what it needs (the shmipc-serve front copies the request to its worker).
 */
#define SHMIPC__HTTP_DEFER 1
typedef int (*shmipc__http_handler_fn)(void *user_data, const struct shmipc__http_request *req,
                                       const char *body, size_t body_len,
                                       struct shmipc__http_response *resp);

/* What the owner does after shmipc__http_conn_process(). */
enum shmipc__http_conn_verdict {
    SHMIPC__HTTP_CONN_MORE = 0,  /* write the batch; read more bytes, then call again */
    SHMIPC__HTTP_CONN_YIELD = 1, /* write the batch; call again without reading (budget or
                                    batch room ran out with bytes left) */
    SHMIPC__HTTP_CONN_CLOSE = 2, /* write the batch, then shutdown(SHUT_WR) and drain input */
    SHMIPC__HTTP_CONN_DEFER = 3, /* write the batch (the answers before the deferred request);
                                    answer nothing more until shmipc__http_conn_complete() */
};

/* Requests answered per call when the caller passes a budget of 0. */
#define SHMIPC__HTTP_CONN_BUDGET 16u
/* Arena bytes a batch must have free before a request is parsed (one response head). */
#define SHMIPC__HTTP_CONN_HEAD_RESERVE 4096u
/* Iovecs a batch must have free before a request is parsed (100 Continue, head, body). */
#define SHMIPC__HTTP_CONN_IOV_RESERVE 3u

/* Per-connection state. Plain data: no cleanup is needed. One owner thread. */
struct shmipc__http_conn {
    struct shmipc__http_parser parser;
    shmipc__http_handler_fn handler;
    void *user_data;
    uint32_t head_len;     /* of the request whose body is being read */
    uint32_t head_reserve; /* SHMIPC__HTTP_CONN_HEAD_RESERVE unless changed after init */
    uint8_t phase;
    /* The deferred request's response, prepared from it (HEAD, HTTP/1.0, keep-alive) while
     * phase is deferred; the owner fills it in before shmipc__http_conn_complete(). */
    struct shmipc__http_response deferred;
    uint16_t deferred_flags; /* what the request implied, kept whatever the owner sets */
    /*
     * Streamed request bodies: when set, at_head() is asked about each request head with a
     * body; a true answer runs the handler at the head (body NULL, body_len 0) instead of after
     * the whole body. A handler that then defers and sets `upload` takes the body in pieces
     * from the owner (shmipc__http_conn_upload()); any other answer closes the connection
     * after it (the body is never read as a next request).
     */
    int (*at_head)(void *user_data, const struct shmipc__http_request *req);
    uint8_t upload; /* set by the handler that took the body (cleared at every head) */
};

/*
 * Prepares a connection. `limits` (resolved) and `fields` (limits->max_headers entries) are the
 * caller's and outlive the connection; they are as for shmipc__http_parser_init().
 */
void shmipc__http_conn_init(struct shmipc__http_conn *c, const struct shmipc__http_limits *limits,
                            struct shmipc__http_field *fields, shmipc__http_handler_fn handler,
                            void *user_data);

/*
 * Runs the protocol over rx[0..*len), answering at most `budget` requests (0: the default).
 * The buffer must start where the previous call's consumed bytes ended. Chunked bodies are
 * decoded in place, so *len may shrink. On return *consumed bytes at the front of rx are
 * finished with: once the batch has been written, drop them and keep the rest at the front.
 * Returns a verdict (enum shmipc__http_conn_verdict); after CLOSE every call returns CLOSE
 * and consumes everything.
 */
int shmipc__http_conn_process(struct shmipc__http_conn *c, char *rx, size_t *len, size_t *consumed,
                              struct shmipc__http_batch *out, unsigned budget);

/* Whether a deferred request waits for its answer (process() then returns DEFER at once and
 * consumes nothing: pipelined input stays in the owner's buffer). */
int shmipc__http_conn_deferred(const struct shmipc__http_conn *c);

/*
 * Ends the deferral: queues c->deferred (filled in by the owner; a status of 0 or a response
 * the batch refuses becomes a 500) into `out`. Returns 1 when the connection closes after it
 * (then later process() calls return CLOSE), else 0: call process() for pipelined input.
 */
int shmipc__http_conn_complete(struct shmipc__http_conn *c, struct shmipc__http_batch *out);

/*
 * A streamed answer to the deferred request (the owner filled c->deferred in, with
 * SHMIPC__HTTP_RESP_STREAM when its length is unknown, else body_len as the length): queues
 * its head into `out` and sets *body_resp to the response the body's pieces are added with
 * (shmipc__http_batch_add_chunk, add_last_chunk: chunks, or raw bytes for a sized body or
 * HTTP/1.0, nothing for HEAD, 204, 304). Returns 1 when the connection closes after the body,
 * 0 when it stays open, or a batch error. The deferral lasts until stream_done().
 */
int shmipc__http_conn_stream_head(struct shmipc__http_conn *c, struct shmipc__http_batch *out,
                                  struct shmipc__http_response *body_resp);
/*
 * A deferred request whose body is taken in pieces (at_head, upload): decodes the body bytes
 * at buf[0..*len) in place. The decoded bytes are buf[0..*piece); the caller uses them, then
 * drops *drop bytes from the front of buf (the piece and, at the end, the body's last framing;
 * *len already excludes the framing squeezed out). Returns 1 when the body ended (what is left
 * after the drop is the next request), 0 when more bytes are needed, SHMIPC_EPROTO with
 * *status (400, 413, 431) when the body is invalid or above max_body.
 */
int shmipc__http_conn_upload(struct shmipc__http_conn *c, char *buf, size_t *len, size_t *piece,
                             size_t *drop, int *status);
/* Whether the request's body has not been read to its end (a streamed body answered early):
 * the connection must close after the answer. */
int shmipc__http_conn_body_pending(const struct shmipc__http_conn *c);

/* The streamed body was sent whole: process() goes on (or closes when `closes`). */
void shmipc__http_conn_stream_done(struct shmipc__http_conn *c, int closes);

#endif
