/*
 * shmipc_serve.h - the frame codec of shmipc-serve's front<->worker protocol (docs/serve.md,
 * "Protocol"), for workers in any language: the Python worker, Lua handler workers, C handlers.
 *
 * One shmipc stream per request (per connection for WebSocket) carries frames of a 12-byte
 * little-endian header and a payload. Heads (REQUEST_HEAD, RESPONSE_HEAD) are whole frames;
 * bodies and WebSocket data travel in their own frames, so a sender can write a 12-byte header
 * and the payload behind it without a copy.
 *
 * Nothing here allocates, blocks or touches a socket; every function is thread safe. Decoders
 * read only inside [buf, buf + len) and return 0 for "need more bytes" (every strict prefix of
 * a valid frame gives 0), the frame's size when it is whole and valid, or a negative SHMIPC_E*
 * code: SHMIPC_EPROTO for a malformed frame, SHMIPC_EMSGSIZE for one over a limit,
 * SHMIPC_EINVAL for a bad argument. A receiver fails the stream on any of them (docs/serve.md,
 * "Bad frames"). Encoders check the same rules, so they cannot write a frame the decoder
 * refuses. Include it after (or instead of) shmipc.h, which it includes; it is installed beside
 * it. See docs/api.md, "shmipc-serve frames".
 */
#ifndef SHMIPC_SERVE_H
#define SHMIPC_SERVE_H

#include "shmipc.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Bytes of a frame header. */
#define SHMIPC_SERVE_HDR_SIZE 12u

/* Limits (docs/serve.md, "Limits"). */
#define SHMIPC_SERVE_MAX_HEAD         65536u     /**< payload of a request or response head */
#define SHMIPC_SERVE_MAX_HEADERS      128u       /**< header fields in one head */
#define SHMIPC_SERVE_MAX_NAME         256u       /**< bytes of one header name */
#define SHMIPC_SERVE_MAX_VALUE        16384u     /**< bytes of one header value */
#define SHMIPC_SERVE_MAX_METHOD       32u        /**< bytes of the method */
#define SHMIPC_SERVE_MAX_TARGET       16384u     /**< bytes of the request target */
#define SHMIPC_SERVE_MAX_CHUNK        (1u << 20) /**< payload of a BODY or WS_DATA frame */
#define SHMIPC_SERVE_MAX_CONTROL      125u       /**< payload of a WS ping or pong */
#define SHMIPC_SERVE_MAX_CLOSE_REASON 123u       /**< bytes of a WS close reason */
#define SHMIPC_SERVE_MAX_ABORT_TEXT   1024u      /**< bytes of an ABORT message */

/** Frame types. Values are only appended. */
enum shmipc_serve_type {
    SHMIPC_SERVE_REQUEST_HEAD = 1,  /**< front -> worker */
    SHMIPC_SERVE_BODY = 2,          /**< both: one body chunk */
    SHMIPC_SERVE_END = 3,           /**< both: end of the body (of the response: request done) */
    SHMIPC_SERVE_RESPONSE_HEAD = 4, /**< worker -> front */
    SHMIPC_SERVE_ABORT = 5,         /**< both: the stream ends abnormally; arg is the reason */
    SHMIPC_SERVE_WS_DATA = 6,       /**< both: text/binary message data, fragmented by FIN */
    SHMIPC_SERVE_WS_PING = 7,       /**< both */
    SHMIPC_SERVE_WS_PONG = 8,       /**< both */
    SHMIPC_SERVE_WS_CLOSE = 9,      /**< both */
    SHMIPC_SERVE_HELLO = 10,        /**< both: a session's features, on a stream of its own */
    SHMIPC_SERVE_TAKEN = 11,        /**< worker -> front: the worker has taken the request */
};

/* REQUEST_HEAD flags (shmipc_serve_request.flags, the frame's arg). */
#define SHMIPC_SERVE_REQ_KEEP_ALIVE      0x01u
#define SHMIPC_SERVE_REQ_UPGRADE         0x02u /**< a WebSocket upgrade the front validated */
#define SHMIPC_SERVE_REQ_HAS_BODY        0x04u
#define SHMIPC_SERVE_REQ_CHUNKED         0x08u
#define SHMIPC_SERVE_REQ_CONTENT_LENGTH  0x10u /**< content_length is meaningful */
#define SHMIPC_SERVE_REQ_EXPECT_CONTINUE 0x20u
#define SHMIPC_SERVE_REQ_TAKEN_WANTED    0x40u /**< answer TAKEN before running the app */

/* HELLO: its 8-byte payload is u32 features, u32 concurrency (little-endian). */
#define SHMIPC_SERVE_HELLO_SIZE 8u
#define SHMIPC_SERVE_FEAT_TAKEN 0x01u /**< the worker answers TAKEN_WANTED with TAKEN */

/* RESPONSE_HEAD flags (shmipc_serve_response.flags, the frame's arg). */
#define SHMIPC_SERVE_RESP_CONTENT_LENGTH 0x01u
#define SHMIPC_SERVE_RESP_CLOSE          0x02u /**< close the client connection after it */

/* WS_DATA arg: the opcode of the message in the low byte, FIN in bit 8. */
#define SHMIPC_SERVE_WS_CONT   0u
#define SHMIPC_SERVE_WS_TEXT   1u
#define SHMIPC_SERVE_WS_BINARY 2u
#define SHMIPC_SERVE_WS_FIN    0x100u

/* ABORT reasons (the frame's arg). */
#define SHMIPC_SERVE_ABORT_CLIENT_GONE  1u
#define SHMIPC_SERVE_ABORT_WORKER_ERROR 2u
#define SHMIPC_SERVE_ABORT_TIMEOUT      3u
#define SHMIPC_SERVE_ABORT_PROTOCOL     4u
#define SHMIPC_SERVE_ABORT_TOO_LARGE    5u
#define SHMIPC_SERVE_ABORT_SHUTDOWN     6u

/* Address families of shmipc_serve_addr. */
#define SHMIPC_SERVE_AF_NONE  0u
#define SHMIPC_SERVE_AF_INET  1u
#define SHMIPC_SERVE_AF_INET6 2u
#define SHMIPC_SERVE_AF_UNIX  3u

/** A client's or listener's address in a REQUEST_HEAD. A value type: never grows. */
typedef struct shmipc_serve_addr {
    uint8_t family;   /**< SHMIPC_SERVE_AF_* */
    uint8_t reserved; /**< 0 */
    uint16_t port;    /**< host order */
    uint8_t addr[16]; /**< network order: 4 bytes for INET, 16 for INET6, zero otherwise */
} shmipc_serve_addr;

/** One header field; the bytes are the frame's (decoded) or the caller's (encoded). */
typedef struct shmipc_serve_field {
    const uint8_t *name;
    const uint8_t *value;
    uint32_t name_len;  /**< 1..SHMIPC_SERVE_MAX_NAME */
    uint32_t value_len; /**< 0..SHMIPC_SERVE_MAX_VALUE */
} shmipc_serve_field;

/**
 * The header fields of a decoded head, already validated: walk a copy with
 * shmipc_serve_fields_next(). Points into the decoded buffer. A value type: never grows.
 */
typedef struct shmipc_serve_fields {
    const uint8_t *next; /**< the next field's bytes */
    uint32_t left;       /**< fields not yet walked */
    uint32_t reserved;
} shmipc_serve_fields;

/**
 * A REQUEST_HEAD: what shmipc_serve_decode_request() fills and
 * shmipc_serve_encode_request_head() reads (it ignores nfields and fields). @sized: set
 * `size` to sizeof(shmipc_serve_request) before either call; it only grows at the end.
 */
typedef struct shmipc_serve_request {
    size_t size;                /**< sizeof(shmipc_serve_request), set by the caller */
    uint32_t flags;             /**< SHMIPC_SERVE_REQ_* */
    uint8_t version_minor;      /**< HTTP/1.<minor>: 0 or 1 */
    uint8_t scheme;             /**< 0: http; 1: https (reserved) */
    uint16_t reserved;          /**< 0 */
    uint64_t content_length;    /**< with SHMIPC_SERVE_REQ_CONTENT_LENGTH; at most 2^63 - 1 */
    shmipc_serve_addr peer;     /**< the client */
    shmipc_serve_addr local;    /**< the listener */
    const uint8_t *method;      /**< not NUL-terminated */
    const uint8_t *target;      /**< as received: origin, absolute, authority or "*" form */
    uint32_t method_len;        /**< 1..SHMIPC_SERVE_MAX_METHOD */
    uint32_t target_len;        /**< 1..SHMIPC_SERVE_MAX_TARGET */
    uint32_t nfields;           /**< decoded: the number of header fields */
    uint32_t reserved2;         /**< 0 */
    shmipc_serve_fields fields; /**< decoded: the header fields */
} shmipc_serve_request;

/**
 * A RESPONSE_HEAD: what shmipc_serve_decode_response() fills and
 * shmipc_serve_encode_response_head() reads (it ignores nfields and fields). @sized: set
 * `size` to sizeof(shmipc_serve_response) before either call; it only grows at the end.
 */
typedef struct shmipc_serve_response {
    size_t size;                /**< sizeof(shmipc_serve_response), set by the caller */
    uint32_t flags;             /**< SHMIPC_SERVE_RESP_* */
    uint16_t status;            /**< 100..599 */
    uint16_t reserved;          /**< 0 */
    uint64_t content_length;    /**< with SHMIPC_SERVE_RESP_CONTENT_LENGTH; at most 2^63 - 1 */
    uint32_t nfields;           /**< decoded: the number of header fields */
    uint32_t reserved2;         /**< 0 */
    shmipc_serve_fields fields; /**< decoded: the header fields */
} shmipc_serve_response;

/**
 * A decoded frame of any type; payload points into the decoded buffer. For WS_CLOSE,
 * close_code (0: none) and close_reason. @sized: set `size` to sizeof(shmipc_serve_frame)
 * before decoding; it only grows at the end.
 */
typedef struct shmipc_serve_frame {
    size_t size;                 /**< sizeof(shmipc_serve_frame), set by the caller */
    uint32_t type;               /**< enum shmipc_serve_type */
    uint32_t length;             /**< payload bytes */
    uint32_t arg;                /**< flags of a head, WS_DATA opcode | FIN, ABORT reason */
    uint16_t close_code;         /**< WS_CLOSE: the code, 0 when none */
    uint16_t reserved;           /**< 0 */
    const uint8_t *payload;      /**< NULL from shmipc_serve_decode_header() */
    const uint8_t *close_reason; /**< WS_CLOSE: UTF-8, not NUL-terminated */
    uint32_t close_reason_len;   /**< 0..SHMIPC_SERVE_MAX_CLOSE_REASON */
    uint32_t reserved2;          /**< 0 */
} shmipc_serve_frame;

/** "REQUEST_HEAD", "BODY", ... for a frame type; "?" for any other value. Thread safe. */
SHMIPC_API const char *shmipc_serve_type_name(uint32_t type);

/**
 * Decodes and checks a frame header: magic, version, type, arg and the payload length against
 * the type's limits; fills type, length and arg of *f (payload NULL). Enough to forward a BODY
 * or WS_DATA payload as it arrives. Returns SHMIPC_SERVE_HDR_SIZE, 0 with fewer than 12 bytes,
 * SHMIPC_EPROTO or SHMIPC_EMSGSIZE, or SHMIPC_EINVAL (buf or f NULL, f->size too small).
 */
SHMIPC_API int shmipc_serve_decode_header(const void *buf, size_t len, shmipc_serve_frame *f);

/**
 * Decodes one whole frame from the start of buf, checking its payload (heads field by field,
 * WS_CLOSE's code and UTF-8 reason). Returns its size (header + payload), 0 when buf holds only
 * a prefix of it, or a negative code as decode_header.
 */
SHMIPC_API int64_t shmipc_serve_decode(const void *buf, size_t len, shmipc_serve_frame *f);

/**
 * Decodes one whole REQUEST_HEAD frame from the start of buf into *r (pointers into buf).
 * Returns as shmipc_serve_decode(); a valid frame of another type is SHMIPC_EPROTO.
 */
SHMIPC_API int64_t shmipc_serve_decode_request(const void *buf, size_t len,
                                               shmipc_serve_request *r);

/** As shmipc_serve_decode_request(), for a RESPONSE_HEAD frame. */
SHMIPC_API int64_t shmipc_serve_decode_response(const void *buf, size_t len,
                                                shmipc_serve_response *r);

/**
 * The next field of a decoded head (it advances *it). Returns 1 and fills *out, 0 when no
 * field is left, or SHMIPC_EINVAL for NULL.
 */
SHMIPC_API int shmipc_serve_fields_next(shmipc_serve_fields *it, shmipc_serve_field *out);

/**
 * Writes a whole REQUEST_HEAD frame into out (cap bytes) with the nfields fields (fields may be
 * NULL when nfields is 0). Returns the bytes written; SHMIPC_EMSGSIZE when cap is too small or
 * a limit is exceeded (SHMIPC_SERVE_HDR_SIZE + SHMIPC_SERVE_MAX_HEAD bytes always suffice);
 * SHMIPC_EINVAL for NULL, r->size too small, or a field the decoder would refuse.
 */
SHMIPC_API int64_t shmipc_serve_encode_request_head(void *out, size_t cap,
                                                    const shmipc_serve_request *r,
                                                    const shmipc_serve_field *fields,
                                                    size_t nfields);

/** As shmipc_serve_encode_request_head(), for a RESPONSE_HEAD. */
SHMIPC_API int64_t shmipc_serve_encode_response_head(void *out, size_t cap,
                                                     const shmipc_serve_response *r,
                                                     const shmipc_serve_field *fields,
                                                     size_t nfields);

/**
 * The 12-byte header of a frame whose payload the caller sends behind it (BODY, END, ABORT,
 * WS_DATA, WS_PING, WS_PONG, WS_CLOSE), into out (cap >= 12). Returns 12, SHMIPC_EINVAL (NULL,
 * a head type, a bad arg) or SHMIPC_EMSGSIZE (cap, or length over the type's limit).
 */
SHMIPC_API int shmipc_serve_encode_header(void *out, size_t cap, uint32_t type, size_t length,
                                          uint32_t arg);

/**
 * A whole frame of one of the types of encode_header, header and payload copied into out.
 * Checks the payload as the decoder does (WS_CLOSE's code and reason; an ABORT text is not
 * checked for UTF-8). payload may be NULL when len is 0. Returns 12 + len or a negative code.
 */
SHMIPC_API int64_t shmipc_serve_encode_frame(void *out, size_t cap, uint32_t type, uint32_t arg,
                                             const void *payload, size_t len);

/**
 * A WS_CLOSE frame: code 0 sends none (then no reason). Returns its size, SHMIPC_EINVAL (a
 * reserved code, a reason that is not UTF-8 or has no code) or SHMIPC_EMSGSIZE.
 */
SHMIPC_API int64_t shmipc_serve_encode_ws_close(void *out, size_t cap, uint32_t code,
                                                const void *reason, size_t reason_len);

/* ---- Handlers: serving requests in a worker ------------------------------------------------ */

/*
 * A worker (docs/serve.md, "The C worker") serves each request stream the front opens with
 * shmipc_serve_handle_stream(), which reads and checks the REQUEST_HEAD, calls the handler, and
 * answers for it what the protocol asks: END after the response, a complete 500 when the
 * handler fails before its response head, ABORT WORKER_ERROR after it, ABORT PROTOCOL for a bad
 * frame from the front, and the drains of "ABORT". The handler gets the decoded head with
 * shmipc_serve_exchange_request(), reads the body and writes the response with
 * shmipc_serve_read(), shmipc_serve_respond() and shmipc_serve_write() on the exchange `x`,
 * which is valid during the call only, on the calling thread.
 */
typedef struct shmipc_serve_exchange shmipc_serve_exchange;

/**
 * A request handler: 0 when the response is complete (its head sent with
 * shmipc_serve_respond(), its body with shmipc_serve_write()), a negative value when it failed:
 * before the head the client gets a 500, after it a truncated response (ABORT WORKER_ERROR).
 * Returning 0 without a response, or with fewer body bytes than the head's content_length, is
 * a failure too. `shmipc-serve --c LIB.so:SYMBOL` resolves SYMBOL (by default
 * "shmipc_serve_handle") to a function of this type; `user_data` is then NULL.
 */
typedef int (*shmipc_serve_handler)(shmipc_serve_exchange *x, void *user_data);

/* What shmipc_serve_handle_stream() returns: how the exchange ended. */
#define SHMIPC_SERVE_OUTCOME_OK       0 /**< the handler answered */
#define SHMIPC_SERVE_OUTCOME_LATE     1 /**< the stream held only a late ABORT: not a request */
#define SHMIPC_SERVE_OUTCOME_ERROR    2 /**< the handler failed: 500 or ABORT WORKER_ERROR sent */
#define SHMIPC_SERVE_OUTCOME_ABORTED  3 /**< the front aborted, or its stream or session ended */
#define SHMIPC_SERVE_OUTCOME_PROTOCOL 4 /**< the front sent a bad frame: ABORT PROTOCOL sent */
#define SHMIPC_SERVE_OUTCOME_HELLO    5 /**< the front's HELLO, answered: not a request */

/**
 * Serves the one request of stream `st` (a stream a front opened on a worker's session) with
 * `handler`, then closes `st` (always). Blocks while the handler runs and while it waits for
 * the front's frames (the stream's read timeout; 5 s in all for the stream's first frame, the
 * REQUEST_HEAD, after which the stream's read timeout is as it was; 5 s for the text of the
 * front's ABORT; 5 s after an END or ABORT of its own; a signal that interrupts a wait does not end it: the wait goes on once the
 * signal handler ran). Returns a
 * SHMIPC_SERVE_OUTCOME_* value, or SHMIPC_EINVAL (st or handler NULL; st is then closed if
 * not NULL) or SHMIPC_ENOMEM.
 */
SHMIPC_API int shmipc_serve_handle_stream(shmipc_stream *st, shmipc_serve_handler handler,
                                          void *user_data);

/**
 * The request's decoded REQUEST_HEAD (method, target, fields, peer, flags, content_length;
 * pointers into a buffer the exchange owns), valid until the handler returns; NULL for NULL.
 */
SHMIPC_API const shmipc_serve_request *shmipc_serve_exchange_request(shmipc_serve_exchange *x);

/**
 * Reads up to `cap` bytes of the request body into `buf`, waiting for the front's next BODY
 * frame as needed. Returns the bytes read (> 0), 0 at the body's end (at once for a request
 * without a body), SHMIPC_ECONNRESET when the front aborted the request or its stream ended
 * (the handler should return; nothing more is sent), SHMIPC_EPROTO for a bad frame, or
 * SHMIPC_EINVAL (NULL, cap 0, after shmipc_serve_ws_accept(): shmipc_serve_ws_recv() reads a
 * WebSocket).
 */
SHMIPC_API int64_t shmipc_serve_read(shmipc_serve_exchange *x, void *buf, size_t cap);

/**
 * Sends the response head: r->status (200..599: interim responses are not available to
 * handlers, and a WebSocket's 101 is shmipc_serve_ws_accept()), r->flags (SHMIPC_SERVE_RESP_CONTENT_LENGTH with r->content_length,
 * SHMIPC_SERVE_RESP_CLOSE) and the fields (the front owns the framing fields, docs/serve.md).
 * Without CONTENT_LENGTH the front frames the body itself. Once per request. Returns 0,
 * SHMIPC_EINVAL (a second head, a bad status or field, r->size too small), SHMIPC_EMSGSIZE,
 * or SHMIPC_ECONNRESET / SHMIPC_EPROTO as shmipc_serve_read().
 */
SHMIPC_API int shmipc_serve_respond(shmipc_serve_exchange *x, const shmipc_serve_response *r,
                                    const shmipc_serve_field *fields, size_t nfields);

/**
 * Sends `len` body bytes (any size: split into BODY frames of at most 1 MiB), after
 * shmipc_serve_respond(). For HEAD, 204 and 304 the bytes are dropped (no body is sent).
 * Looks, without waiting, for an ABORT from the front first. Returns 0, SHMIPC_EINVAL (no head
 * yet, NULL data with len > 0, or more bytes than the head's content_length: the response is
 * then aborted), or SHMIPC_ECONNRESET / SHMIPC_EPROTO as shmipc_serve_read().
 */
SHMIPC_API int shmipc_serve_write(shmipc_serve_exchange *x, const void *data, size_t len);

/* ---- WebSocket in a handler (docs/serve.md, "WebSocket in the C and Lua workers") ---------- */

/* shmipc_serve_ws_send() opcodes besides SHMIPC_SERVE_WS_TEXT and _BINARY: RFC 6455's. */
#define SHMIPC_SERVE_WS_PING_OP 9u  /**< a ping the front sends the client (payload <= 125) */
#define SHMIPC_SERVE_WS_PONG_OP 10u /**< an unsolicited pong to the client (payload <= 125) */

/**
 * Accepts the request's WebSocket upgrade (its flags have SHMIPC_SERVE_REQ_UPGRADE), in place
 * of shmipc_serve_respond(): RESPONSE_HEAD 101 with `fields` and END. `subprotocol` (NULL for
 * none) must be one the client offered in Sec-WebSocket-Protocol, and is sent as that field;
 * the handler's hop-by-hop and Sec-WebSocket-* fields are dropped (the handshake's fields are
 * the front's). Refusing is any shmipc_serve_respond() instead (e.g. 403). The request's END
 * (and any body) is read first, within 5 s in all. Returns 0, SHMIPC_EINVAL (not an upgrade,
 * a head sent already, a subprotocol not offered, a bad field), SHMIPC_EMSGSIZE,
 * SHMIPC_ETIMEDOUT (no END from the front within the 5 s: the stream is given up, as for
 * SHMIPC_ECONNRESET), SHMIPC_ECONNRESET or SHMIPC_EPROTO as shmipc_serve_read().
 */
SHMIPC_API int shmipc_serve_ws_accept(shmipc_serve_exchange *x, const char *subprotocol,
                                      const shmipc_serve_field *fields, size_t nfields);

/**
 * Receives up to `cap` bytes of the client's current message into `buf` (a message comes in
 * any number of pieces; pings and pongs are the front's and skipped). *flags gets the
 * message's opcode (SHMIPC_SERVE_WS_TEXT, its UTF-8 checked by the front, or _BINARY), with
 * SHMIPC_SERVE_WS_FIN on the piece that ends it. Waits at most `timeout_ms` (-1: no limit;
 * 0: only what arrived) for a frame; a frame whose header came is then read (each read of its
 * payload waits up to 5 s). Returns the bytes (0 for an empty piece), SHMIPC_ETIMEDOUT,
 * SHMIPC_ECLOSED once the front's close came (answered already, echoing its code, unless the
 * handler had closed; also when the front closed the stream right behind it),
 * SHMIPC_ECONNRESET when the client went away (1006), SHMIPC_EPROTO for
 * a bad frame, SHMIPC_EINVAL (NULL, cap 0, not accepted). shmipc_serve_ws_closed() tells the
 * code. After shmipc_serve_shutdown() it sends the close 1001 and waits (at most 5 s) for the
 * front's answer, dropping messages meanwhile.
 */
SHMIPC_API int64_t shmipc_serve_ws_recv(shmipc_serve_exchange *x, void *buf, size_t cap,
                                        uint32_t *flags, int timeout_ms);

/**
 * Sends one whole message: SHMIPC_SERVE_WS_TEXT (UTF-8, checked) or _BINARY, split into
 * WS_DATA frames of at most SHMIPC_SERVE_MAX_CHUNK bytes; or SHMIPC_SERVE_WS_PING_OP /
 * _PONG_OP (at most 125 bytes). Returns 0, SHMIPC_EINVAL (not accepted, after the handler's
 * own close, a bad opcode, text that is not UTF-8, a ping over 125 bytes, NULL data with len
 * > 0), SHMIPC_ECLOSED (the front's close came, or the worker is going away: 1001 sent) or
 * SHMIPC_ECONNRESET (the client went away).
 */
SHMIPC_API int shmipc_serve_ws_send(shmipc_serve_exchange *x, uint32_t opcode, const void *data,
                                    size_t len);

/**
 * Closes the WebSocket: WS_CLOSE with `code` (0: none; else 1000-1003, 1007-1014 or
 * 3000-4999) and a UTF-8 reason of at most 123 bytes. Once. Messages the client sent before
 * its answer still come from shmipc_serve_ws_recv(), then SHMIPC_ECLOSED. A handler that
 * returns with the socket open closes it 1000 (1011 when it returns a negative value), and the
 * worker waits at most 5 s for the front's answer. Returns 0, SHMIPC_EINVAL (not accepted,
 * closed already, a bad code or reason), SHMIPC_ECLOSED or SHMIPC_ECONNRESET.
 */
SHMIPC_API int shmipc_serve_ws_close(shmipc_serve_exchange *x, uint32_t code, const void *reason,
                                     size_t reason_len);

/**
 * How the client closed: the front's close code (1005 when its close had none; also when a
 * send failed on the stream the front closed right behind that close), 1006 when the client
 * went away without one (ABORT, the stream's end), or 0 while neither happened;
 * *reason_len (when not NULL) gets the length of the close reason, of which at most `cap`
 * bytes are copied into `reason` (NULL with cap 0: none). -1 for NULL x.
 */
SHMIPC_API int32_t shmipc_serve_ws_closed(shmipc_serve_exchange *x, void *reason, size_t cap,
                                          size_t *reason_len);

/**
 * Tells every WebSocket of the process that the worker is stopping: a shmipc_serve_ws_recv()
 * waiting now or later closes its socket 1001 (going away) and returns once the front answered;
 * a shmipc_serve_ws_send() sends the 1001 instead of its message and returns SHMIPC_ECLOSED.
 * Async-signal safe (one atomic store), for a SIGTERM handler; there is no undoing it.
 */
SHMIPC_API void shmipc_serve_shutdown(void);

#ifdef __cplusplus
}
#endif

#endif /* SHMIPC_SERVE_H */
