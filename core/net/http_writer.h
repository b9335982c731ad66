/*
 * HTTP/1.1 response writing, without sockets: status line and headers into caller memory,
 * bodies referenced in place, everything as iovecs so that a head and its body - or all the
 * responses of a pipelined batch - leave in one vectored write.
 *
 * Nothing is allocated. A body is never copied unless it is small (a batch copies bodies up
 * to copy_max bytes behind their head, so small responses become one contiguous run, and
 * consecutive runs merge into one iovec); a large body (1 MiB) is one iovec pointing at the
 * caller's memory, which must stay valid and unchanged until the batch has been written.
 */
#ifndef SHMIPC_CORE_NET_HTTP_WRITER_H
#define SHMIPC_CORE_NET_HTTP_WRITER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include <time.h>

#include "net/http_parser.h"

/* An IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT") is always 29 bytes. */
#define SHMIPC__HTTP_DATE_LEN 29
/* "Date: " + IMF-fixdate + CRLF. */
#define SHMIPC__HTTP_DATE_LINE_LEN (6 + SHMIPC__HTTP_DATE_LEN + 2)

/*
 * The Date header of one event loop, formatted at most once per second: refresh it once per
 * loop turn with time(NULL) and every response of the turn copies the same bytes. One per
 * loop thread, no locking.
 */
struct shmipc__http_date {
    int64_t second;                            /* the time() the text shows */
    char line[SHMIPC__HTTP_DATE_LINE_LEN + 1]; /* "Date: ...\r\n", NUL-terminated */
};

/* Formats `now` into `d`. */
void shmipc__http_date_init(struct shmipc__http_date *d, time_t now);

/* Reformats `d` when `now` is another second than the one it shows. Returns 1 when it did. */
int shmipc__http_date_refresh(struct shmipc__http_date *d, time_t now);

/* The IMF-fixdate inside the line (SHMIPC__HTTP_DATE_LEN bytes, not NUL-terminated). */
static inline const char *shmipc__http_date_text(const struct shmipc__http_date *d)
{
    return d->line + 6;
}

/* The standard reason phrase of `status` (RFC 9110 §15), or "" for a code it does not name. */
const char *shmipc__http_reason(int status);

/* One extra response header. Name: a token; value: no CR, LF, NUL or other CTL but HTAB. */
struct shmipc__http_header_out {
    const char *name;
    const char *value;
    uint32_t name_len;
    uint32_t value_len;
};

/* Response flags. */
#define SHMIPC__HTTP_RESP_CLOSE  1u /* "Connection: close"; the connection closes afterwards */
#define SHMIPC__HTTP_RESP_HEAD   2u /* answer to HEAD: the body's Content-Length, no body */
#define SHMIPC__HTTP_RESP_STREAM 4u /* body of unknown length: chunked (or until close) */
#define SHMIPC__HTTP_RESP_HTTP10 8u /* the request was HTTP/1.0 */

/*
 * A response to write. The writer emits, in this order: the status line, Date, Server (when
 * the batch names one), Content-Type, the extra headers, Content-Length (sized bodies) or
 * Transfer-Encoding: chunked (STREAM to HTTP/1.1), Connection (close when closing,
 * keep-alive for a persistent HTTP/1.0 connection), then the empty line. 1xx, 204 and 304
 * responses carry neither framing header nor body. A STREAM response to HTTP/1.0 has no
 * framing and closes the connection: its body ends with it.
 */
struct shmipc__http_response {
    uint16_t status;          /* 100-999 */
    uint16_t flags;           /* SHMIPC__HTTP_RESP_* */
    const char *content_type; /* NUL-terminated, or NULL for none */
    const struct shmipc__http_header_out *headers;
    uint32_t nheaders;
    const void *body; /* may be NULL with body_len > 0 for HEAD */
    size_t body_len;
};

/*
 * A 200 response with the flags that `req` implies: HEAD, CLOSE when the request does not
 * keep the connection alive, HTTP10 for HTTP/1.0. `req` may be NULL (HTTP/1.1 keep-alive).
 */
void shmipc__http_response_init(struct shmipc__http_response *r,
                                const struct shmipc__http_request *req);

/*
 * The canned error response for `status` (400, 404, 405, 413, 414, 417, 431, 500, 501, 505,
 * or any other code): text/plain body "<status> <reason>\n" in static memory, CLOSE set.
 * The HEAD and HTTP10 flags already in `r` are kept; initialise `r` (or zero it) first.
 */
void shmipc__http_response_error(struct shmipc__http_response *r, int status);

/* Whether the connection must close once `r` has been written. */
static inline int shmipc__http_response_closes(const struct shmipc__http_response *r)
{
    return (r->flags & SHMIPC__HTTP_RESP_CLOSE) ||
           (r->flags & (SHMIPC__HTTP_RESP_STREAM | SHMIPC__HTTP_RESP_HTTP10)) ==
               (SHMIPC__HTTP_RESP_STREAM | SHMIPC__HTTP_RESP_HTTP10);
}

/* 1 when the header can be written as given: a token for a name, no CR, LF or other control
 * byte but tab in the value (shmipc__http_write_head()'s check). */
int shmipc__http_header_valid(const struct shmipc__http_header_out *h);

/*
 * Writes the head of `r` (status line to the empty line) into out[0..cap). `server` is the
 * Server header's value or NULL. Returns the head's length, SHMIPC_ENOSPC when it does not
 * fit, or SHMIPC_EINVAL for a status outside 100-999 or a header that would break the
 * message (a name that is not a token, a CR or LF in a value).
 */
int shmipc__http_write_head(char *out, size_t cap, const struct shmipc__http_response *r,
                            const struct shmipc__http_date *date, const char *server);

/*
 * The response as iovecs, [head, body]: the head is written into head[0..cap) and the body is
 * referenced, not copied. Returns the number of iovecs used (1 when there is no body to send,
 * as for HEAD, 204, 304 or an empty body; 2 otherwise) or a write_head error.
 */
int shmipc__http_response_iov(const struct shmipc__http_response *r,
                              const struct shmipc__http_date *date, const char *server, char *head,
                              size_t cap, struct iovec iov[2]);

/* Longest chunk head: 16 hex digits and CRLF. */
#define SHMIPC__HTTP_CHUNK_HEAD_MAX 18
/* The last chunk of a chunked body, with no trailers. */
#define SHMIPC__HTTP_LAST_CHUNK "0\r\n\r\n"

/*
 * Writes the head of a chunk of `len` (> 0) bytes, "<hex>\r\n", into `out`; returns its length.
 * The chunk is then the data followed by "\r\n".
 */
size_t shmipc__http_chunk_head(char out[SHMIPC__HTTP_CHUNK_HEAD_MAX], uint64_t len);

/*
 * Responses gathered for one vectored write: iovecs in caller memory, heads (and small
 * bodies, and chunk framing) in a caller-provided arena. One per connection or per loop;
 * not thread safe. Every add either appends completely or leaves the batch unchanged.
 */
struct shmipc__http_batch {
    struct iovec *iov;
    uint32_t niov;
    uint32_t iov_cap;
    char *arena;
    size_t used;
    size_t cap;
    size_t bytes;                         /* total bytes the iovecs hold */
    uint32_t copy_max;                    /* bodies up to this size are copied (default 1024) */
    const struct shmipc__http_date *date; /* read at each add */
    const char *server;                   /* Server header value, or NULL (default) */
};

/* Default copy_max: below this, one memcpy is cheaper than one more iovec. */
#define SHMIPC__HTTP_COPY_MAX 1024u

/* Prepares an empty batch over the caller's arrays; `date` must outlive it. */
void shmipc__http_batch_init(struct shmipc__http_batch *b, struct iovec *iov, uint32_t iov_cap,
                             char *arena, size_t arena_cap, const struct shmipc__http_date *date);

/* Empties the batch once its bytes were written. */
void shmipc__http_batch_reset(struct shmipc__http_batch *b);

/*
 * Appends a complete response (head, then body unless it is not sent). Returns 0,
 * SHMIPC_ENOSPC when the arena or the iovec array is full (the batch is unchanged: write it,
 * reset, retry), or SHMIPC_EINVAL as shmipc__http_write_head().
 */
int shmipc__http_batch_add(struct shmipc__http_batch *b, const struct shmipc__http_response *r);

/* Appends the canned error response for `status` (Connection: close). */
int shmipc__http_batch_add_error(struct shmipc__http_batch *b, int status);

/* Appends the interim "HTTP/1.1 100 Continue" response. */
int shmipc__http_batch_add_continue(struct shmipc__http_batch *b);

/*
 * Appends `len` bytes of the body of the STREAM response `r` (added before): framed as one
 * chunk for HTTP/1.1, raw for HTTP/1.0, nothing for HEAD or when len is 0 (an empty chunk
 * would end the body). `data` must stay valid until the batch is written unless it is copied.
 */
int shmipc__http_batch_add_chunk(struct shmipc__http_batch *b,
                                 const struct shmipc__http_response *r, const void *data,
                                 size_t len);

/* Ends the body of the STREAM response `r`: the last chunk (nothing for HTTP/1.0 or HEAD). */
int shmipc__http_batch_add_last_chunk(struct shmipc__http_batch *b,
                                      const struct shmipc__http_response *r);

#endif
