/*
 * HTTP/1.1 request parsing (RFC 9112), without sockets: a strict, incremental request-head
 * parser (http_parser.c) and a body decoder for Content-Length and chunked bodies
 * (http_body.c).
 *
 * The parser is fed the connection's receive buffer. Bytes may arrive split at any point
 * (inside a CRLF, inside a chunk size); each call resumes where the last one stopped: no byte
 * is searched for a line end twice, and a line is validated once, when it is whole.
 * Nothing is allocated: the parser, the request it reports and the caller-provided field
 * array live as long as the connection, and a request is a set of offsets into the buffer.
 *
 * Buffer contract. The caller keeps the unconsumed bytes of the request at the start of the
 * buffer it passes (`buf[0]` is the first byte of the request, or of the body for the body
 * decoder) and only appends between calls. The buffer may move between calls (realloc, or a
 * memmove that drops consumed bytes), because the parser stores offsets, not pointers.
 *
 * Choices where RFC 9112 allows several (see also docs in tests/http/README.md):
 * - Line ends are CRLF. A bare LF is a 400 unless SHMIPC__HTTP_LENIENT_LF is set (then it
 *   ends a line everywhere: request line, fields, chunk lines, after chunk data). A bare CR
 *   anywhere is always a 400.
 * - Empty lines before the request line are skipped (§2.2 SHOULD); they count toward
 *   max_head_bytes.
 * - The request line is exactly `method SP target SP HTTP/x.y`: one SP each, no other
 *   whitespace. Target bytes must be visible ASCII (0x21-0x7E); `*` only with OPTIONS;
 *   authority-form only with (and required by) CONNECT; origin- and absolute-form otherwise.
 * - HTTP/1.2 to HTTP/1.9 are served as HTTP/1.1 (RFC 9112 §2.6), as nginx does; any other
 *   major version (0.x, 2.0, 3.0, ...) gets 505; a version that is not exactly
 *   HTTP/DIGIT.DIGIT (HTTP/1.10, HTTP/1, http/1.1) is a 400.
 * - Host: exactly one on HTTP/1.1 (none or two: 400), and only host[:port] characters.
 * - obs-fold and whitespace between the request line and the first field are rejected (400),
 *   as is whitespace between a field name and its colon.
 * - Content-Length: digits only; the same value repeated (as separate fields or as a list)
 *   is accepted, different values are a 400; a value above max_body, however many digits,
 *   is a 413 (no overflow: the number is not carried past the limit).
 * - Transfer-Encoding: the final coding must be chunked (else 400), chunked at most once
 *   (else 400), any other coding is 501 since none is implemented; with Content-Length it is
 *   a 400; in an HTTP/1.0 request it is a 400 (§6.1 says the framing is faulty).
 * - Expect: 100-continue (case-insensitive) is flagged; any other expectation is a 417.
 *   Expect is ignored in HTTP/1.0 requests (RFC 9110 §10.1.1).
 * - Every error closes the connection: after a non-zero status the parser stays failed.
 *
 * Checks are made in a fixed order, so the status does not depend on how the bytes were
 * split: lines in order; for a line, its length limits before its content; after the head,
 * Host (400), framing (400, then 501), Expect (417), then the body limit (413).
 */
#ifndef SHMIPC_CORE_NET_HTTP_PARSER_H
#define SHMIPC_CORE_NET_HTTP_PARSER_H

#include <stddef.h>
#include <stdint.h>

/* Defaults for a zero field of struct shmipc__http_limits. */
#define SHMIPC__HTTP_DEFAULT_MAX_REQUEST_LINE 8192u
#define SHMIPC__HTTP_DEFAULT_MAX_HEAD_BYTES   16384u
#define SHMIPC__HTTP_DEFAULT_MAX_HEADERS      64u
#define SHMIPC__HTTP_DEFAULT_MAX_CHUNK_LINE   1024u
#define SHMIPC__HTTP_DEFAULT_MAX_BODY         (1u << 20)
/* The largest values a limit may take (offsets are 32-bit; bodies stay far from overflow). */
#define SHMIPC__HTTP_LIMIT_MAX_HEAD_BYTES (64u << 20)
#define SHMIPC__HTTP_LIMIT_MAX_HEADERS    4096u
#define SHMIPC__HTTP_LIMIT_MAX_BODY       (1ull << 60)

/* Limit flags. */
#define SHMIPC__HTTP_LENIENT_LF 1u /* accept a bare LF as a line end (default: 400) */

/*
 * Every limit of the parser. Zero means the default; shmipc__http_limits_resolve() fills them
 * in. Line and head lengths count their CRLF. Exceeding a limit answers:
 * - max_request_line (default 8192): 414 once the method is read, 501 while the method is
 *   still a token, 400 otherwise;
 * - max_head_bytes (16384): 431 - request line, fields and the empty line, from the first
 *   byte of the request (leading empty lines included); also bounds a trailer section;
 * - max_headers (64): 431 - the size of the field array; trailers share it with the headers;
 * - max_chunk_line (1024): 400 - a chunk-size line with its extensions;
 * - max_body (1 MiB): 413 - the decoded body, whether declared or chunked.
 */
struct shmipc__http_limits {
    uint32_t max_request_line;
    uint32_t max_head_bytes;
    uint32_t max_headers;
    uint32_t max_chunk_line;
    uint64_t max_body;
    uint32_t flags; /* SHMIPC__HTTP_LENIENT_LF */
};

/*
 * Copies `in` (NULL for all defaults) to `out` with each zero replaced by its default.
 * Returns 0, or SHMIPC_EINVAL with a detail naming the field when a value is above its
 * SHMIPC__HTTP_LIMIT_* bound or a flag is unknown.
 */
int shmipc__http_limits_resolve(struct shmipc__http_limits *out,
                                const struct shmipc__http_limits *in);

/* Methods; SHMIPC__HTTP_OTHER is any other token (flagged with SHMIPC__HTTP_UNKNOWN_METHOD). */
enum shmipc__http_method {
    SHMIPC__HTTP_OTHER = 0,
    SHMIPC__HTTP_GET,
    SHMIPC__HTTP_HEAD,
    SHMIPC__HTTP_POST,
    SHMIPC__HTTP_PUT,
    SHMIPC__HTTP_DELETE,
    SHMIPC__HTTP_OPTIONS,
    SHMIPC__HTTP_PATCH,
    SHMIPC__HTTP_TRACE,
    SHMIPC__HTTP_CONNECT,
};

/* How the request's body is framed. */
enum shmipc__http_body_kind {
    SHMIPC__HTTP_BODY_NONE = 0,    /* no body (no framing field, or Content-Length: 0) */
    SHMIPC__HTTP_BODY_LENGTH = 1,  /* Content-Length bytes */
    SHMIPC__HTTP_BODY_CHUNKED = 2, /* Transfer-Encoding: chunked */
};

/* Request flags (struct shmipc__http_request.flags). */
#define SHMIPC__HTTP_KEEP_ALIVE      (1u << 0) /* the connection may serve another request */
#define SHMIPC__HTTP_EXPECT_CONTINUE (1u << 1) /* "Expect: 100-continue" (HTTP/1.1 only) */
#define SHMIPC__HTTP_UNKNOWN_METHOD  (1u << 2) /* a method token outside the enum */
#define SHMIPC__HTTP_IS_HEAD         (1u << 3) /* HEAD: the response carries no body */
#define SHMIPC__HTTP_CONN_UPGRADE    (1u << 4) /* Connection lists "upgrade" */

/* A byte range, as an offset from the base the range belongs to. */
struct shmipc__http_slice {
    uint32_t off;
    uint32_t len;
};

/* One field line: name (as received; compare case-insensitively) and value without OWS. */
struct shmipc__http_field {
    struct shmipc__http_slice name;
    struct shmipc__http_slice value;
};

/*
 * A parsed request head. Slices of the head are offsets from `base`, the buffer passed to
 * the call that completed the head; trailers (fields[nfields .. nfields + ntrailers)) are
 * offsets from the body buffer passed to shmipc__http_body_decode(). Valid until the next
 * shmipc__http_parse_head() call on the same parser. If the buffer moved while the body was
 * read, point `base` at the request's first byte again before using the slices.
 */
struct shmipc__http_request {
    const char *base;
    uint32_t head_len;              /* bytes of the head, leading empty lines included */
    uint32_t flags;                 /* SHMIPC__HTTP_* request flags */
    uint8_t method;                 /* enum shmipc__http_method */
    uint8_t minor;                  /* 0 for HTTP/1.0, 1 for every other HTTP/1.x */
    uint8_t body_kind;              /* enum shmipc__http_body_kind */
    struct shmipc__http_slice name; /* the method token */
    struct shmipc__http_slice target;
    struct shmipc__http_slice path; /* the path of the target, without the query */
    struct shmipc__http_slice host; /* the Host value (empty when absent) */
    uint64_t content_length;        /* SHMIPC__HTTP_BODY_LENGTH: the declared length */
    struct shmipc__http_field *fields;
    uint32_t nfields;
    uint32_t ntrailers;
};

/*
 * Per-connection parser state. Initialise once with shmipc__http_parser_init(); it then
 * parses every request of the connection, one after another. Not thread safe: one owner.
 */
struct shmipc__http_parser {
    const struct shmipc__http_limits *limits;
    struct shmipc__http_field *fields; /* limits->max_headers entries, the caller's */
    uint32_t fields_cap;
    uint16_t status; /* the HTTP status to answer once a call failed; 0 otherwise */
    uint8_t state;
    uint8_t bstate;
    /* Head in progress: offsets from the request's first byte. */
    uint32_t line;  /* start of the line being read */
    uint32_t scan;  /* bytes already searched for its LF */
    uint32_t facts; /* what the fields said so far (internal bits) */
    uint32_t te_codings;
    uint64_t cl_value;
    /* Body in progress: offsets from the body's first byte. */
    size_t in;            /* wire bytes decoded */
    size_t out;           /* decoded bytes, at the front of the body buffer */
    size_t bline;         /* start of the chunk or trailer line being read */
    size_t bscan;         /* bytes already searched for its LF */
    size_t trailer_start; /* where the trailer section began */
    uint64_t remaining;   /* bytes left in the body (length) or in the chunk */
    uint64_t total;       /* decoded bytes so far, for max_body */
    struct shmipc__http_request req;
};

/*
 * Prepares `p` for a connection. `limits` must be resolved and outlive the parser; `fields`
 * (room for limits->max_headers entries, owned by the caller) receives headers and trailers.
 */
void shmipc__http_parser_init(struct shmipc__http_parser *p,
                              const struct shmipc__http_limits *limits,
                              struct shmipc__http_field *fields);

/*
 * Parses the request head at buf[0..len). Returns the head's length (> 0) when it is
 * complete and p->req describes it; 0 when more bytes are needed (call again with the same
 * first byte and more bytes after it); SHMIPC_EPROTO when the request is invalid, with
 * p->status holding the status to answer (400, 413, 414, 417, 431, 501 or 505) and a detail
 * (shmipc_error_detail()); SHMIPC_EINVAL when called while a body is still being decoded.
 * After a complete head, decode the body (if any) with shmipc__http_body_decode() from
 * buf + head length; the next request then starts after the body (pipelining).
 */
int shmipc__http_parse_head(struct shmipc__http_parser *p, const char *buf, size_t len);

/*
 * Decodes body bytes at buf[0..*len) in place: the decoded bytes gather at the front of
 * `buf`, so a complete body is the contiguous range buf[0 .. shmipc__http_body_len(p)). While
 * a chunked body is incomplete, the framing bytes already decoded are squeezed out (the
 * undecoded tail moves down and *len shrinks), so a buffer of max_body plus one chunk line
 * (plus the trailer section) holds any accepted body. Returns 1 when the body (and its
 * trailers) is complete: shmipc__http_body_wire(p) bytes of buf belong to it and the next
 * request starts there; 0 when more bytes are needed (append after buf[*len - 1] and call
 * again); SHMIPC_EPROTO with p->status (400, 413 or 431) when the body is invalid.
 * With no body, returns 1 at once.
 */
int shmipc__http_body_decode(struct shmipc__http_parser *p, char *buf, size_t *len);

/* Whether a request's body is still being decoded (or failed): the head was parsed, the body
 * has not ended. */
int shmipc__http_body_pending(const struct shmipc__http_parser *p);

/* The decoded bytes at the front of the body buffer. */
static inline size_t shmipc__http_body_len(const struct shmipc__http_parser *p)
{
    return p->out;
}

/* After a complete body: the body's bytes in the (compacted) body buffer. */
static inline size_t shmipc__http_body_wire(const struct shmipc__http_parser *p)
{
    return p->in;
}

/*
 * For bodies too large to hold: the caller has used the decoded bytes buf[0..n) and now drops
 * them from the front of the body buffer (memmove of buf[n..*len) to buf[0]), where n is the
 * return value. Offsets kept by the decoder (trailers included) move with them.
 */
size_t shmipc__http_body_take(struct shmipc__http_parser *p);

/* The method's name ("GET"), or NULL for SHMIPC__HTTP_OTHER. */
const char *shmipc__http_method_name(int method);

/*
 * The index of the first header (not trailer) named `name` (case-insensitive, `name_len`
 * bytes) at or after `from`, or -1.
 */
int shmipc__http_find_header(const struct shmipc__http_request *req, const char *name,
                             size_t name_len, uint32_t from);

/* Pointer to a head slice of `req`. */
static inline const char *shmipc__http_at(const struct shmipc__http_request *req,
                                          struct shmipc__http_slice s)
{
    return req->base + s.off;
}

#endif
