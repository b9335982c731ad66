/*
 * The front<->worker framing of shmipc-serve (docs/serve.md, "Protocol"): one shmipc stream
 * per request (per connection for WebSocket) carries frames of a 12-byte little-endian header
 * and a payload. Heads (request, response) are self-contained frames; bodies and WebSocket
 * data travel in their own frames, so the front can write a 12-byte header and forward the
 * body's slices behind it without a copy.
 *
 * Nothing here allocates or touches a socket. Decoders read only inside [buf, buf + len),
 * return 0 for "need more bytes" (every strict prefix of a valid frame gives 0), the frame's
 * size when it is whole and valid, or a negative SHMIPC_E* code: SHMIPC_EPROTO for a
 * malformed frame, SHMIPC_EMSGSIZE for one over a limit. A receiver fails the stream on
 * either (docs/serve.md, "Bad frames"). Encoders check the same rules, so they cannot write
 * a frame the decoder refuses.
 */
#ifndef SHMIPC_CORE_NET_SERVE_FRAME_H
#define SHMIPC_CORE_NET_SERVE_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define SHMIPC__SF_MAGIC    0x5653u /* bytes 'S' 'V' */
#define SHMIPC__SF_VERSION  1u
#define SHMIPC__SF_HDR_SIZE 12u

/* Limits (docs/serve.md, "Limits"). */
#define SHMIPC__SF_MAX_HEAD         65536u     /* payload of a request or response head */
#define SHMIPC__SF_MAX_HEADERS      128u       /* header fields in one head */
#define SHMIPC__SF_MAX_NAME         256u       /* bytes of one header name */
#define SHMIPC__SF_MAX_VALUE        16384u     /* bytes of one header value */
#define SHMIPC__SF_MAX_METHOD       32u        /* bytes of the method */
#define SHMIPC__SF_MAX_TARGET       16384u     /* bytes of the request target */
#define SHMIPC__SF_MAX_CHUNK        (1u << 20) /* payload of a BODY or WS_DATA frame */
#define SHMIPC__SF_MAX_CONTROL      125u       /* payload of a WS ping or pong (RFC 6455) */
#define SHMIPC__SF_MAX_CLOSE_REASON 123u       /* bytes of a WS close reason */
#define SHMIPC__SF_MAX_ABORT_TEXT   1024u      /* bytes of an ABORT message */

enum shmipc__sf_type {
    SHMIPC__SF_REQUEST_HEAD = 1,  /* front -> worker */
    SHMIPC__SF_BODY = 2,          /* both: one body chunk */
    SHMIPC__SF_END = 3,           /* both: end of the body (of the response: request done) */
    SHMIPC__SF_RESPONSE_HEAD = 4, /* worker -> front */
    SHMIPC__SF_ABORT = 5,         /* both: the stream ends abnormally */
    SHMIPC__SF_WS_DATA = 6,       /* both: text/binary message data, fragmented by FIN */
    SHMIPC__SF_WS_PING = 7,       /* both */
    SHMIPC__SF_WS_PONG = 8,       /* both */
    SHMIPC__SF_WS_CLOSE = 9,      /* both */
    SHMIPC__SF_HELLO = 10,        /* both: the features of a session, on a stream of its own */
    SHMIPC__SF_TAKEN = 11,        /* worker -> front: the worker has taken the request */
    SHMIPC__SF_TYPE_MAX = 11,
};

/* REQUEST_HEAD flags (header field arg). */
#define SHMIPC__SF_REQ_KEEP_ALIVE      0x01u
#define SHMIPC__SF_REQ_UPGRADE         0x02u /* a WebSocket upgrade the front has validated */
#define SHMIPC__SF_REQ_HAS_BODY        0x04u
#define SHMIPC__SF_REQ_CHUNKED         0x08u
#define SHMIPC__SF_REQ_CONTENT_LENGTH  0x10u /* content_length is meaningful */
#define SHMIPC__SF_REQ_EXPECT_CONTINUE 0x20u
#define SHMIPC__SF_REQ_TAKEN_WANTED    0x40u /* answer TAKEN before running the application */
#define SHMIPC__SF_REQ_FLAGS           0x7Fu

/* HELLO: its payload is u32 features, u32 concurrency (docs/serve.md, "HELLO and TAKEN"). */
#define SHMIPC__SF_HELLO_SIZE 8u
#define SHMIPC__SF_FEAT_TAKEN 0x01u /* the worker answers TAKEN_WANTED with TAKEN */
#define SHMIPC__SF_FEATS      0x01u /* the features this version knows */

/* RESPONSE_HEAD flags. */
#define SHMIPC__SF_RESP_CONTENT_LENGTH 0x01u
#define SHMIPC__SF_RESP_CLOSE          0x02u /* close the client connection after this response */
#define SHMIPC__SF_RESP_FLAGS          0x03u

/* WS_DATA arg: the opcode of the message in the low byte, FIN in bit 8. */
#define SHMIPC__SF_WS_CONT   0u
#define SHMIPC__SF_WS_TEXT   1u
#define SHMIPC__SF_WS_BINARY 2u
#define SHMIPC__SF_WS_FIN    0x100u

/* ABORT reasons (the arg). */
enum shmipc__sf_abort {
    SHMIPC__SF_ABORT_CLIENT_GONE = 1,
    SHMIPC__SF_ABORT_WORKER_ERROR = 2,
    SHMIPC__SF_ABORT_TIMEOUT = 3,
    SHMIPC__SF_ABORT_PROTOCOL = 4,
    SHMIPC__SF_ABORT_TOO_LARGE = 5,
    SHMIPC__SF_ABORT_SHUTDOWN = 6,
    SHMIPC__SF_ABORT_MAX = 6,
};

/* Address families of struct shmipc__sf_addr. */
#define SHMIPC__SF_AF_NONE   0u
#define SHMIPC__SF_AF_INET   1u
#define SHMIPC__SF_AF_INET6  2u
#define SHMIPC__SF_AF_UNIX   3u
#define SHMIPC__SF_ADDR_SIZE 20u

struct shmipc__sf_addr {
    uint8_t family;
    uint16_t port;    /* host order here, little-endian on the wire */
    uint8_t addr[16]; /* network order: 4 bytes for INET, 16 for INET6, zero otherwise */
};

struct shmipc__sf_field {
    const uint8_t *name, *value;
    uint16_t name_len, value_len;
};

/* The header fields of a decoded head, already validated: walk them with _fields_next. */
struct shmipc__sf_fields {
    const uint8_t *p; /* next field */
    uint16_t left;    /* fields not yet walked */
};

struct shmipc__sf_request {
    uint32_t flags;
    uint8_t version_minor; /* HTTP/1.<minor>: 0 or 1 */
    uint8_t scheme;        /* 0: http (1: https, reserved) */
    uint64_t content_length;
    struct shmipc__sf_addr peer, local;
    const uint8_t *method, *target;
    uint16_t method_len, target_len;
    uint16_t nfields;
    struct shmipc__sf_fields fields; /* decoder output */
};

struct shmipc__sf_response {
    uint32_t flags;
    uint16_t status;
    uint64_t content_length;
    uint16_t nfields;
    struct shmipc__sf_fields fields; /* decoder output */
};

/* A decoded frame; pointers point into the decoded buffer. */
struct shmipc__sf_frame {
    uint8_t type;
    uint32_t length; /* payload bytes */
    uint32_t arg;
    const uint8_t *payload;
    union {
        struct shmipc__sf_request req;
        struct shmipc__sf_response resp;
        struct {
            uint32_t features;    /* SHMIPC__SF_FEAT_*; bits unknown here are kept */
            uint32_t concurrency; /* requests the worker runs at once; 0: not said */
        } hello;
        struct {
            uint16_t code; /* 0: no code (then no reason) */
            const uint8_t *reason;
            uint16_t reason_len;
        } close;
    } u;
};

const char *shmipc__sf_type_name(unsigned type);

/*
 * Decodes and checks a frame header: magic, version, type, arg and the payload length
 * against the type's limits. Returns SHMIPC__SF_HDR_SIZE, 0 (fewer than 12 bytes), or
 * SHMIPC_EPROTO/SHMIPC_EMSGSIZE. Enough to forward a BODY or WS_DATA payload as slices.
 */
int shmipc__sf_decode_header(const void *buf, size_t len, struct shmipc__sf_frame *f);

/*
 * Decodes one whole frame from the start of buf. Returns its size (header + payload), 0 when
 * buf holds only a prefix of it, or SHMIPC_EPROTO/SHMIPC_EMSGSIZE.
 */
long shmipc__sf_decode(const void *buf, size_t len, struct shmipc__sf_frame *f);

/* The next field of a decoded head; 0 when there is none left. */
int shmipc__sf_fields_next(struct shmipc__sf_fields *it, struct shmipc__sf_field *out);

/*
 * Encoders write into out (cap bytes) and return the bytes written, SHMIPC_EMSGSIZE when
 * cap is too small or a limit is exceeded, or SHMIPC_EINVAL for a field the decoder would
 * refuse. Heads take their fields from `fields` (nfields of them).
 */
long shmipc__sf_encode_request_head(void *out, size_t cap, const struct shmipc__sf_request *r,
                                    const struct shmipc__sf_field *fields);
long shmipc__sf_encode_response_head(void *out, size_t cap, const struct shmipc__sf_response *r,
                                     const struct shmipc__sf_field *fields);

/*
 * The header of a frame whose payload goes separately (BODY, WS_DATA, WS_PING, WS_PONG,
 * END, ABORT): writes 12 bytes. Returns 12, SHMIPC_EINVAL or SHMIPC_EMSGSIZE, checking what
 * decode_header checks. The payload is the caller's to send (or forward) behind it.
 */
int shmipc__sf_encode_header(uint8_t out[SHMIPC__SF_HDR_SIZE], unsigned type, size_t length,
                             uint32_t arg);

/* A whole HELLO frame (20 bytes) into out. Returns 20 or SHMIPC_EMSGSIZE (cap too small). */
long shmipc__sf_encode_hello(void *out, size_t cap, uint32_t features, uint32_t concurrency);

/*
 * A header and its payload as two iovecs (iov[0] = hdr, iov[1] = data), for writev-style
 * senders. Payload checks as the decoder's (text of ABORT is not checked for UTF-8).
 * Returns 12 + n or an error from encode_header (or SHMIPC_EPROTO for a payload the decoder
 * would refuse).
 */
long shmipc__sf_encode_iov(struct iovec iov[2], uint8_t hdr[SHMIPC__SF_HDR_SIZE], unsigned type,
                           uint32_t arg, const void *data, size_t n);

struct shmipc__http_request;

/*
 * The front's REQUEST_HEAD for a request its HTTP parser accepted (net/http_parser.h): the
 * method, target and header fields as received (trailers are not sent), HTTP/1.<minor>, and
 * the flags the request implies: KEEP_ALIVE, HAS_BODY, CHUNKED, CONTENT_LENGTH (also for a
 * "Content-Length: 0"), EXPECT_CONTINUE; `extra` adds UPGRADE for a handshake the front has
 * validated. `req->base` must point at the request's first byte. Returns the frame's size,
 * SHMIPC_EMSGSIZE when it does not fit cap or the protocol's limits (the front then answers
 * 431, or 414 for the target), or SHMIPC_EINVAL.
 */
long shmipc__sf_encode_http_request(void *out, size_t cap, const struct shmipc__http_request *req,
                                    const struct shmipc__sf_addr *peer,
                                    const struct shmipc__sf_addr *local, uint32_t extra);

/* A WS_CLOSE frame: code 0 sends none (and no reason). */
long shmipc__sf_encode_ws_close(void *out, size_t cap, uint16_t code, const void *reason,
                                size_t reason_len);

#endif
