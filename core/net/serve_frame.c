/* The shmipc-serve front<->worker framing; see serve_frame.h and docs/serve.md. */
#include "net/serve_frame.h"

#include <inttypes.h>
#include <string.h>

#include "common/error.h"
#include "net/http_parser.h"
#include "net/ws_codec.h"
#include "net/ws_frame.h"

/* Offsets in the header and in the head payloads (docs/serve.md, "Frames"). */
#define REQ_FIXED  60u
#define RESP_FIXED 16u

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p)
{
    return get32(p) | (uint64_t)get32(p + 4) << 32;
}
static void put16(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v)
{
    put16(p, v);
    put16(p + 2, v >> 16);
}
static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

const char *shmipc__sf_type_name(unsigned type)
{
    static const char *const names[] = {
        NULL,      "REQUEST_HEAD", "BODY",    "END",      "RESPONSE_HEAD", "ABORT",
        "WS_DATA", "WS_PING",      "WS_PONG", "WS_CLOSE", "HELLO",         "TAKEN",
    };
    return type >= 1 && type <= SHMIPC__SF_TYPE_MAX ? names[type] : "?";
}

/* tchar of RFC 9110 §5.6.2. */
static int is_tchar(uint8_t c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return 1;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static int token_ok(const uint8_t *p, size_t n)
{
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!is_tchar(p[i]))
            return 0;
    return 1;
}

/* A request target: visible ASCII and obs-text, no space or control (RFC 9112 §3.2). */
static int target_ok(const uint8_t *p, size_t n)
{
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (p[i] <= 0x20 || p[i] == 0x7F)
            return 0;
    return 1;
}

/* A field value: HTAB, SP, VCHAR, obs-text; no leading or trailing whitespace (§5.5). */
static int value_ok(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((p[i] < 0x20 && p[i] != '\t') || p[i] == 0x7F)
            return 0;
    return n == 0 || (p[0] != ' ' && p[0] != '\t' && p[n - 1] != ' ' && p[n - 1] != '\t');
}

/* Per type: the largest payload, and whether the arg must be zero. */
static int check_header(unsigned type, uint64_t length, uint32_t arg)
{
    switch (type) {
    case SHMIPC__SF_REQUEST_HEAD:
        if (arg & ~SHMIPC__SF_REQ_FLAGS)
            return shmipc__fail(SHMIPC_EPROTO, "serve frame: unknown request flags 0x%x", arg);
        if (length < REQ_FIXED)
            return shmipc__fail(SHMIPC_EPROTO, "serve frame: request head too short");
        if (length > SHMIPC__SF_MAX_HEAD)
            return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: request head over the limit");
        return 0;
    case SHMIPC__SF_RESPONSE_HEAD:
        if (arg & ~SHMIPC__SF_RESP_FLAGS)
            return shmipc__fail(SHMIPC_EPROTO, "serve frame: unknown response flags 0x%x", arg);
        if (length < RESP_FIXED)
            return shmipc__fail(SHMIPC_EPROTO, "serve frame: response head too short");
        if (length > SHMIPC__SF_MAX_HEAD)
            return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: response head over the limit");
        return 0;
    case SHMIPC__SF_BODY:
        if (arg != 0)
            return shmipc__fail(SHMIPC_EPROTO, "serve frame: BODY arg is not 0");
        if (length == 0)
            return shmipc__fail(SHMIPC_EPROTO, "serve frame: empty BODY");
        if (length > SHMIPC__SF_MAX_CHUNK)
            return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: BODY over the chunk limit");
        return 0;
    case SHMIPC__SF_END:
        if (arg != 0 || length != 0)
            return shmipc__fail(SHMIPC_EPROTO, "serve frame: END with an arg or a payload");
        return 0;
    case SHMIPC__SF_ABORT:
        if (arg == 0 || arg > SHMIPC__SF_ABORT_MAX)
            return shmipc__fail(SHMIPC_EPROTO, "serve frame: unknown ABORT reason %u", arg);
        if (length > SHMIPC__SF_MAX_ABORT_TEXT)
            return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: ABORT text over the limit");
        return 0;
    case SHMIPC__SF_WS_DATA: {
        unsigned op = arg & 0xFFu;
        if ((arg & ~(SHMIPC__SF_WS_FIN | 0xFFu)) || op > SHMIPC__SF_WS_BINARY)
            return shmipc__fail(SHMIPC_EPROTO, "serve frame: bad WS_DATA arg 0x%x", arg);
        if (length > SHMIPC__SF_MAX_CHUNK)
            return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: WS_DATA over the chunk limit");
        return 0;
    }
    case SHMIPC__SF_WS_PING:
    case SHMIPC__SF_WS_PONG:
        if (arg != 0)
            return shmipc__fail(SHMIPC_EPROTO, "serve frame: ping/pong arg is not 0");
        if (length > SHMIPC__SF_MAX_CONTROL)
            return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: ping/pong over 125 bytes");
        return 0;
    case SHMIPC__SF_WS_CLOSE:
        if (arg != 0)
            return shmipc__fail(SHMIPC_EPROTO, "serve frame: WS_CLOSE arg is not 0");
        if (length == 1)
            return shmipc__fail(SHMIPC_EPROTO, "serve frame: WS_CLOSE of 1 byte");
        if (length > 2u + SHMIPC__SF_MAX_CLOSE_REASON)
            return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: WS_CLOSE over 125 bytes");
        return 0;
    case SHMIPC__SF_HELLO:
        if (arg != 0 || length != SHMIPC__SF_HELLO_SIZE)
            return shmipc__fail(SHMIPC_EPROTO, "serve frame: HELLO with an arg or not 8 bytes");
        return 0;
    case SHMIPC__SF_TAKEN:
        if (arg != 0 || length != 0)
            return shmipc__fail(SHMIPC_EPROTO, "serve frame: TAKEN with an arg or a payload");
        return 0;
    default:
        return shmipc__fail(SHMIPC_EPROTO, "serve frame: unknown type %u", type);
    }
}

int shmipc__sf_decode_header(const void *buf, size_t len, struct shmipc__sf_frame *f)
{
    const uint8_t *p = buf;
    /* Check what the bytes present say, so a bad magic fails at once, not after 12 bytes. */
    if (len >= 1 && p[0] != (SHMIPC__SF_MAGIC & 0xFF))
        return shmipc__fail(SHMIPC_EPROTO, "serve frame: bad magic");
    if (len >= 2 && p[1] != (SHMIPC__SF_MAGIC >> 8))
        return shmipc__fail(SHMIPC_EPROTO, "serve frame: bad magic");
    if (len >= 3 && p[2] != SHMIPC__SF_VERSION)
        return shmipc__fail(SHMIPC_EPROTO, "serve frame: version %u is not 1", p[2]);
    if (len >= 4 && (p[3] == 0 || p[3] > SHMIPC__SF_TYPE_MAX))
        return shmipc__fail(SHMIPC_EPROTO, "serve frame: unknown type %u", p[3]);
    if (len < SHMIPC__SF_HDR_SIZE)
        return 0;
    memset(f, 0, sizeof(*f));
    f->type = p[3];
    f->length = get32(p + 4);
    f->arg = get32(p + 8);
    int rc = check_header(f->type, f->length, f->arg);
    return rc < 0 ? rc : (int)SHMIPC__SF_HDR_SIZE;
}

static int decode_addr(const uint8_t *p, struct shmipc__sf_addr *a)
{
    a->family = p[0];
    a->port = get16(p + 2);
    memcpy(a->addr, p + 4, 16);
    if (p[1] != 0)
        return shmipc__fail(SHMIPC_EPROTO, "serve frame: address padding is not 0");
    size_t used = 0;
    switch (a->family) {
    case SHMIPC__SF_AF_INET:
        used = 4;
        break;
    case SHMIPC__SF_AF_INET6:
        used = 16;
        break;
    case SHMIPC__SF_AF_NONE:
    case SHMIPC__SF_AF_UNIX:
        if (a->port != 0)
            return shmipc__fail(SHMIPC_EPROTO, "serve frame: port without an IP address");
        break;
    default:
        return shmipc__fail(SHMIPC_EPROTO, "serve frame: address family %u", a->family);
    }
    for (size_t i = used; i < 16; i++)
        if (a->addr[i] != 0)
            return shmipc__fail(SHMIPC_EPROTO, "serve frame: address bytes past the family's");
    return 0;
}

/*
 * Checks the n fields at p within [p, end): each u16 name_len, u16 value_len, name, value.
 * They must fill the payload exactly.
 */
static int decode_fields(const uint8_t *p, const uint8_t *end, uint16_t n)
{
    if (n > SHMIPC__SF_MAX_HEADERS)
        return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: %u header fields", n);
    for (uint16_t i = 0; i < n; i++) {
        if (end - p < 4)
            return shmipc__fail(SHMIPC_EPROTO, "serve frame: field %u past the payload", i);
        size_t nl = get16(p), vl = get16(p + 2);
        p += 4;
        if (nl > SHMIPC__SF_MAX_NAME || vl > SHMIPC__SF_MAX_VALUE)
            return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: field %u over the limit", i);
        if ((size_t)(end - p) < nl + vl)
            return shmipc__fail(SHMIPC_EPROTO, "serve frame: field %u past the payload", i);
        if (!token_ok(p, nl) || !value_ok(p + nl, vl))
            return shmipc__fail(SHMIPC_EPROTO, "serve frame: field %u is malformed", i);
        p += nl + vl;
    }
    if (p != end)
        return shmipc__fail(SHMIPC_EPROTO, "serve frame: bytes after the last field");
    return 0;
}

static int decode_request(const uint8_t *p, uint32_t len, struct shmipc__sf_frame *f)
{
    struct shmipc__sf_request *r = &f->u.req;
    const uint8_t *end = p + len;
    r->flags = f->arg;
    if (p[0] != 1 || p[1] > 1 || p[2] > 1 || p[3] != 0 || get16(p + 10) != 0)
        return shmipc__fail(SHMIPC_EPROTO, "serve frame: bad request version/scheme");
    r->version_minor = p[1];
    r->scheme = p[2];
    r->method_len = get16(p + 4);
    r->target_len = get16(p + 6);
    r->nfields = get16(p + 8);
    r->content_length = get64(p + 12);
    if (!(r->flags & SHMIPC__SF_REQ_CONTENT_LENGTH) && r->content_length != 0)
        return shmipc__fail(SHMIPC_EPROTO, "serve frame: content length without its flag");
    /* The front's HTTP parser gives at most 2^63 - 1, the bound of a RESPONSE_HEAD too: a
     * larger length is no request a client sent. Before, the workers took up to 2^64 - 1 (the
     * Lua worker's req.content_length, a signed integer, read 2^64 - 1 as -1). */
    if (r->content_length > (uint64_t)INT64_MAX)
        return shmipc__fail(SHMIPC_EPROTO, "serve frame: content length %" PRIu64 " over 2^63 - 1",
                            r->content_length);
    if ((r->flags & SHMIPC__SF_REQ_CONTENT_LENGTH) && (r->flags & SHMIPC__SF_REQ_CHUNKED))
        return shmipc__fail(SHMIPC_EPROTO, "serve frame: both content length and chunked");
    if ((r->flags & (SHMIPC__SF_REQ_CONTENT_LENGTH | SHMIPC__SF_REQ_CHUNKED)) &&
        !(r->flags & SHMIPC__SF_REQ_HAS_BODY) && r->content_length != 0)
        return shmipc__fail(SHMIPC_EPROTO, "serve frame: a body length without has-body");
    int rc = decode_addr(p + 20, &r->peer);
    if (rc == 0)
        rc = decode_addr(p + 40, &r->local);
    if (rc < 0)
        return rc;
    if (r->method_len > SHMIPC__SF_MAX_METHOD || r->target_len > SHMIPC__SF_MAX_TARGET)
        return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: method or target over the limit");
    const uint8_t *q = p + REQ_FIXED;
    if ((size_t)(end - q) < (size_t)r->method_len + r->target_len)
        return shmipc__fail(SHMIPC_EPROTO, "serve frame: method/target past the payload");
    r->method = q;
    r->target = q + r->method_len;
    if (!token_ok(r->method, r->method_len) || !target_ok(r->target, r->target_len))
        return shmipc__fail(SHMIPC_EPROTO, "serve frame: malformed method or target");
    q += r->method_len + r->target_len;
    rc = decode_fields(q, end, r->nfields);
    r->fields.p = q;
    r->fields.left = r->nfields;
    return rc;
}

static int decode_response(const uint8_t *p, uint32_t len, struct shmipc__sf_frame *f)
{
    struct shmipc__sf_response *r = &f->u.resp;
    r->flags = f->arg;
    r->status = get16(p);
    r->nfields = get16(p + 2);
    r->content_length = get64(p + 8);
    if (r->status < 100 || r->status > 599 || get32(p + 4) != 0)
        return shmipc__fail(SHMIPC_EPROTO, "serve frame: status %u", r->status);
    if (!(r->flags & SHMIPC__SF_RESP_CONTENT_LENGTH) && r->content_length != 0)
        return shmipc__fail(SHMIPC_EPROTO, "serve frame: content length without its flag");
    /* The HTTP server sends at most 2^63 - 1 (19 digits), and the front's largest 64-bit
     * value means "no length": a worker's length past it is no length a client could get. */
    if (r->content_length > (uint64_t)INT64_MAX)
        return shmipc__fail(SHMIPC_EPROTO, "serve frame: content length %" PRIu64 " over 2^63 - 1",
                            r->content_length);
    int rc = decode_fields(p + RESP_FIXED, p + len, r->nfields);
    r->fields.p = p + RESP_FIXED;
    r->fields.left = r->nfields;
    return rc;
}

long shmipc__sf_decode(const void *buf, size_t len, struct shmipc__sf_frame *f)
{
    int rc = shmipc__sf_decode_header(buf, len, f);
    if (rc <= 0)
        return rc;
    /* length is at most SHMIPC__SF_MAX_HEAD or _CHUNK here: no overflow. */
    if (len - SHMIPC__SF_HDR_SIZE < f->length)
        return 0;
    const uint8_t *p = (const uint8_t *)buf + SHMIPC__SF_HDR_SIZE;
    f->payload = p;
    switch (f->type) {
    case SHMIPC__SF_REQUEST_HEAD:
        rc = decode_request(p, f->length, f);
        break;
    case SHMIPC__SF_RESPONSE_HEAD:
        rc = decode_response(p, f->length, f);
        break;
    case SHMIPC__SF_HELLO:
        f->u.hello.features = get32(p);
        f->u.hello.concurrency = get32(p + 4);
        break;
    case SHMIPC__SF_WS_CLOSE:
        if (f->length >= 2) {
            f->u.close.code = get16(p);
            f->u.close.reason = p + 2;
            f->u.close.reason_len = (uint16_t)(f->length - 2);
            if (!shmipc__ws_close_code_valid(f->u.close.code))
                rc = shmipc__fail(SHMIPC_EPROTO, "serve frame: close code %u", f->u.close.code);
            else if (!shmipc__utf8_valid(f->u.close.reason, f->u.close.reason_len))
                rc = shmipc__fail(SHMIPC_EPROTO, "serve frame: close reason is not UTF-8");
        }
        break;
    default:
        break;
    }
    if (rc < 0)
        return rc;
    return (long)SHMIPC__SF_HDR_SIZE + f->length;
}

int shmipc__sf_fields_next(struct shmipc__sf_fields *it, struct shmipc__sf_field *out)
{
    if (it->left == 0)
        return 0;
    out->name_len = get16(it->p);
    out->value_len = get16(it->p + 2);
    out->name = it->p + 4;
    out->value = out->name + out->name_len;
    it->p = out->value + out->value_len;
    it->left--;
    return 1;
}

static void put_header(uint8_t *p, unsigned type, uint32_t length, uint32_t arg)
{
    put16(p, SHMIPC__SF_MAGIC);
    p[2] = SHMIPC__SF_VERSION;
    p[3] = (uint8_t)type;
    put32(p + 4, length);
    put32(p + 8, arg);
}

/* The encoded size of n fields, or 0 with *rc set when one is refused. */
static size_t fields_size(const struct shmipc__sf_field *fl, size_t n, int *rc)
{
    size_t total = 0;
    *rc = 0;
    if (n > SHMIPC__SF_MAX_HEADERS) {
        *rc = shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: %zu header fields", n);
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (fl[i].name_len > SHMIPC__SF_MAX_NAME || fl[i].value_len > SHMIPC__SF_MAX_VALUE) {
            *rc = shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: field %zu over the limit", i);
            return 0;
        }
        if (!token_ok(fl[i].name, fl[i].name_len) || !value_ok(fl[i].value, fl[i].value_len)) {
            *rc = shmipc__fail(SHMIPC_EINVAL, "serve frame: field %zu is malformed", i);
            return 0;
        }
        total += 4u + fl[i].name_len + fl[i].value_len;
    }
    return total;
}

static uint8_t *put_fields(uint8_t *p, const struct shmipc__sf_field *fl, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        put16(p, fl[i].name_len);
        put16(p + 2, fl[i].value_len);
        p += 4;
        if (fl[i].name_len)
            memcpy(p, fl[i].name, fl[i].name_len);
        p += fl[i].name_len;
        if (fl[i].value_len)
            memcpy(p, fl[i].value, fl[i].value_len);
        p += fl[i].value_len;
    }
    return p;
}

static void put_addr(uint8_t *p, const struct shmipc__sf_addr *a)
{
    p[0] = a->family;
    p[1] = 0;
    put16(p + 2, a->port);
    memcpy(p + 4, a->addr, 16);
}

long shmipc__sf_encode_request_head(void *out, size_t cap, const struct shmipc__sf_request *r,
                                    const struct shmipc__sf_field *fields)
{
    int rc;
    size_t fsz = fields_size(fields, r->nfields, &rc);
    if (rc < 0)
        return rc;
    size_t len = REQ_FIXED + r->method_len + r->target_len + fsz;
    if (r->method_len > SHMIPC__SF_MAX_METHOD || r->target_len > SHMIPC__SF_MAX_TARGET ||
        len > SHMIPC__SF_MAX_HEAD)
        return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: request head over the limit");
    if (cap < SHMIPC__SF_HDR_SIZE + len)
        return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: %zu bytes do not hold the head", cap);
    uint8_t *p = out;
    put_header(p, SHMIPC__SF_REQUEST_HEAD, (uint32_t)len, r->flags);
    p += SHMIPC__SF_HDR_SIZE;
    memset(p, 0, REQ_FIXED);
    p[0] = 1;
    p[1] = r->version_minor;
    p[2] = r->scheme;
    put16(p + 4, r->method_len);
    put16(p + 6, r->target_len);
    put16(p + 8, r->nfields);
    put64(p + 12, r->content_length);
    put_addr(p + 20, &r->peer);
    put_addr(p + 40, &r->local);
    memcpy(p + REQ_FIXED, r->method, r->method_len);
    if (r->target_len)
        memcpy(p + REQ_FIXED + r->method_len, r->target, r->target_len);
    put_fields(p + REQ_FIXED + r->method_len + r->target_len, fields, r->nfields);
    /* One set of rules: what the decoder refuses, the encoder does not write. */
    struct shmipc__sf_frame f;
    if (shmipc__sf_decode(out, SHMIPC__SF_HDR_SIZE + len, &f) < 0)
        return SHMIPC_EINVAL;
    return (long)(SHMIPC__SF_HDR_SIZE + len);
}

long shmipc__sf_encode_response_head(void *out, size_t cap, const struct shmipc__sf_response *r,
                                     const struct shmipc__sf_field *fields)
{
    int rc;
    size_t fsz = fields_size(fields, r->nfields, &rc);
    if (rc < 0)
        return rc;
    size_t len = RESP_FIXED + fsz;
    if (len > SHMIPC__SF_MAX_HEAD)
        return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: response head over the limit");
    if (cap < SHMIPC__SF_HDR_SIZE + len)
        return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: %zu bytes do not hold the head", cap);
    uint8_t *p = out;
    put_header(p, SHMIPC__SF_RESPONSE_HEAD, (uint32_t)len, r->flags);
    p += SHMIPC__SF_HDR_SIZE;
    memset(p, 0, RESP_FIXED);
    put16(p, r->status);
    put16(p + 2, r->nfields);
    put64(p + 8, r->content_length);
    put_fields(p + RESP_FIXED, fields, r->nfields);
    struct shmipc__sf_frame f;
    if (shmipc__sf_decode(out, SHMIPC__SF_HDR_SIZE + len, &f) < 0)
        return SHMIPC_EINVAL;
    return (long)(SHMIPC__SF_HDR_SIZE + len);
}

int shmipc__sf_encode_header(uint8_t out[SHMIPC__SF_HDR_SIZE], unsigned type, size_t length,
                             uint32_t arg)
{
    if (type == SHMIPC__SF_REQUEST_HEAD || type == SHMIPC__SF_RESPONSE_HEAD)
        return shmipc__fail(SHMIPC_EINVAL, "serve frame: heads have their own encoders");
    if (length > UINT32_MAX)
        return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: %zu-byte payload", length);
    int rc = check_header(type, length, arg);
    if (rc < 0)
        return rc == SHMIPC_EPROTO ? SHMIPC_EINVAL : rc;
    put_header(out, type, (uint32_t)length, arg);
    return (int)SHMIPC__SF_HDR_SIZE;
}

long shmipc__sf_encode_iov(struct iovec iov[2], uint8_t hdr[SHMIPC__SF_HDR_SIZE], unsigned type,
                           uint32_t arg, const void *data, size_t n)
{
    if (type == SHMIPC__SF_WS_CLOSE && n >= 2) {
        const uint8_t *p = data;
        if (!shmipc__ws_close_code_valid(get16(p)) || !shmipc__utf8_valid(p + 2, n - 2))
            return shmipc__fail(SHMIPC_EINVAL, "serve frame: bad close code or reason");
    }
    int rc = shmipc__sf_encode_header(hdr, type, n, arg);
    if (rc < 0)
        return rc;
    iov[0].iov_base = hdr;
    iov[0].iov_len = SHMIPC__SF_HDR_SIZE;
    iov[1].iov_base = (void *)(uintptr_t)data;
    iov[1].iov_len = n;
    return (long)(SHMIPC__SF_HDR_SIZE + n);
}

long shmipc__sf_encode_ws_close(void *out, size_t cap, uint16_t code, const void *reason,
                                size_t reason_len)
{
    size_t len = code == 0 ? 0 : 2 + reason_len;
    if (code == 0 && reason_len != 0)
        return shmipc__fail(SHMIPC_EINVAL, "serve frame: a close reason without a code");
    if (reason_len > SHMIPC__SF_MAX_CLOSE_REASON)
        return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: close reason over 123 bytes");
    if (code != 0 &&
        (!shmipc__ws_close_code_valid(code) || !shmipc__utf8_valid(reason, reason_len)))
        return shmipc__fail(SHMIPC_EINVAL, "serve frame: bad close code or reason");
    if (cap < SHMIPC__SF_HDR_SIZE + len)
        return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: %zu bytes do not hold the close", cap);
    uint8_t *p = out;
    put_header(p, SHMIPC__SF_WS_CLOSE, (uint32_t)len, 0);
    if (code != 0) {
        put16(p + SHMIPC__SF_HDR_SIZE, code);
        if (reason_len)
            memcpy(p + SHMIPC__SF_HDR_SIZE + 2, reason, reason_len);
    }
    return (long)(SHMIPC__SF_HDR_SIZE + len);
}

static int field_named(const char *base, const struct shmipc__http_field *f, const char *lower)
{
    size_t n = strlen(lower);
    if (f->name.len != n)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = base[f->name.off + i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c + 32);
        if (c != lower[i])
            return 0;
    }
    return 1;
}

long shmipc__sf_encode_http_request(void *out, size_t cap, const struct shmipc__http_request *req,
                                    const struct shmipc__sf_addr *peer,
                                    const struct shmipc__sf_addr *local, uint32_t extra)
{
    static const struct shmipc__sf_addr none;
    struct shmipc__sf_field fields[SHMIPC__SF_MAX_HEADERS];
    struct shmipc__sf_request r;
    const char *b = req->base;
    if (extra & ~SHMIPC__SF_REQ_UPGRADE)
        return shmipc__fail(SHMIPC_EINVAL, "serve frame: extra flags %#x", extra);
    if (req->nfields > SHMIPC__SF_MAX_HEADERS)
        return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: %u header fields", req->nfields);
    memset(&r, 0, sizeof r);
    r.flags = extra;
    if (req->flags & SHMIPC__HTTP_KEEP_ALIVE)
        r.flags |= SHMIPC__SF_REQ_KEEP_ALIVE;
    if (req->flags & SHMIPC__HTTP_EXPECT_CONTINUE)
        r.flags |= SHMIPC__SF_REQ_EXPECT_CONTINUE;
    if (req->body_kind == SHMIPC__HTTP_BODY_CHUNKED) {
        r.flags |= SHMIPC__SF_REQ_HAS_BODY | SHMIPC__SF_REQ_CHUNKED;
    } else if (req->body_kind == SHMIPC__HTTP_BODY_LENGTH && req->content_length > 0) {
        r.flags |= SHMIPC__SF_REQ_HAS_BODY | SHMIPC__SF_REQ_CONTENT_LENGTH;
        r.content_length = req->content_length;
    }
    r.version_minor = req->minor ? 1 : 0;
    r.peer = peer != NULL ? *peer : none;
    r.local = local != NULL ? *local : none;
    r.method = (const uint8_t *)b + req->name.off;
    r.method_len = (uint16_t)(req->name.len <= SHMIPC__SF_MAX_METHOD ? req->name.len : 0);
    r.target = (const uint8_t *)b + req->target.off;
    if (req->name.len > SHMIPC__SF_MAX_METHOD || req->target.len > SHMIPC__SF_MAX_TARGET)
        return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: method or target over the limit");
    r.target_len = (uint16_t)req->target.len;
    for (uint32_t i = 0; i < req->nfields; i++) {
        const struct shmipc__http_field *f = &req->fields[i];
        if (f->name.len > SHMIPC__SF_MAX_NAME || f->value.len > SHMIPC__SF_MAX_VALUE)
            return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: header field %u over the limit", i);
        /* "Content-Length: 0": the worker sees CONTENT_LENGTH "0", as the client sent. */
        if (req->body_kind == SHMIPC__HTTP_BODY_NONE && field_named(b, f, "content-length"))
            r.flags |= SHMIPC__SF_REQ_CONTENT_LENGTH;
        fields[i].name = (const uint8_t *)b + f->name.off;
        fields[i].name_len = (uint16_t)f->name.len;
        fields[i].value = (const uint8_t *)b + f->value.off;
        fields[i].value_len = (uint16_t)f->value.len;
    }
    r.nfields = (uint16_t)req->nfields;
    return shmipc__sf_encode_request_head(out, cap, &r, fields);
}

long shmipc__sf_encode_hello(void *out, size_t cap, uint32_t features, uint32_t concurrency)
{
    if (cap < SHMIPC__SF_HDR_SIZE + SHMIPC__SF_HELLO_SIZE)
        return shmipc__fail(SHMIPC_EMSGSIZE, "serve frame: %zu bytes do not hold a HELLO", cap);
    uint8_t *p = out;
    put_header(p, SHMIPC__SF_HELLO, SHMIPC__SF_HELLO_SIZE, 0);
    put32(p + SHMIPC__SF_HDR_SIZE, features);
    put32(p + SHMIPC__SF_HDR_SIZE + 4, concurrency);
    return (long)(SHMIPC__SF_HDR_SIZE + SHMIPC__SF_HELLO_SIZE);
}
