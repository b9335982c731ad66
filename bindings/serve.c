/*
 * Exported shmipc-serve frame codec (shmipc_serve.h): argument checks, then the core codec
 * (core/net/serve_frame.c), which owns the protocol's rules. The public structs are the ABI
 * (fixed-width, sized); the core's are free to change, so each call converts between them.
 */
#include "shmipc_serve.h"

#include <string.h>

#include "common/error.h"
#include "net/serve_frame.h"

/* The public constants are the core's, spelled for users: a drift would be a wire break. */
_Static_assert(SHMIPC_SERVE_HDR_SIZE == SHMIPC__SF_HDR_SIZE, "header size");
_Static_assert(SHMIPC_SERVE_MAX_HEAD == SHMIPC__SF_MAX_HEAD, "max head");
_Static_assert(SHMIPC_SERVE_MAX_HEADERS == SHMIPC__SF_MAX_HEADERS, "max headers");
_Static_assert(SHMIPC_SERVE_MAX_NAME == SHMIPC__SF_MAX_NAME, "max name");
_Static_assert(SHMIPC_SERVE_MAX_VALUE == SHMIPC__SF_MAX_VALUE, "max value");
_Static_assert(SHMIPC_SERVE_MAX_METHOD == SHMIPC__SF_MAX_METHOD, "max method");
_Static_assert(SHMIPC_SERVE_MAX_TARGET == SHMIPC__SF_MAX_TARGET, "max target");
_Static_assert(SHMIPC_SERVE_MAX_CHUNK == SHMIPC__SF_MAX_CHUNK, "max chunk");
_Static_assert(SHMIPC_SERVE_MAX_CONTROL == SHMIPC__SF_MAX_CONTROL, "max control");
_Static_assert(SHMIPC_SERVE_MAX_CLOSE_REASON == SHMIPC__SF_MAX_CLOSE_REASON, "max reason");
_Static_assert(SHMIPC_SERVE_MAX_ABORT_TEXT == SHMIPC__SF_MAX_ABORT_TEXT, "max abort text");
_Static_assert((int)SHMIPC_SERVE_REQUEST_HEAD == (int)SHMIPC__SF_REQUEST_HEAD &&
                   (int)SHMIPC_SERVE_BODY == (int)SHMIPC__SF_BODY &&
                   (int)SHMIPC_SERVE_END == (int)SHMIPC__SF_END &&
                   (int)SHMIPC_SERVE_RESPONSE_HEAD == (int)SHMIPC__SF_RESPONSE_HEAD &&
                   (int)SHMIPC_SERVE_ABORT == (int)SHMIPC__SF_ABORT &&
                   (int)SHMIPC_SERVE_WS_DATA == (int)SHMIPC__SF_WS_DATA &&
                   (int)SHMIPC_SERVE_WS_PING == (int)SHMIPC__SF_WS_PING &&
                   (int)SHMIPC_SERVE_WS_PONG == (int)SHMIPC__SF_WS_PONG &&
                   (int)SHMIPC_SERVE_WS_CLOSE == (int)SHMIPC__SF_WS_CLOSE &&
                   (int)SHMIPC_SERVE_HELLO == (int)SHMIPC__SF_HELLO &&
                   (int)SHMIPC_SERVE_TAKEN == (int)SHMIPC__SF_TAKEN,
               "frame types");
_Static_assert(SHMIPC_SERVE_REQ_KEEP_ALIVE == SHMIPC__SF_REQ_KEEP_ALIVE &&
                   SHMIPC_SERVE_REQ_UPGRADE == SHMIPC__SF_REQ_UPGRADE &&
                   SHMIPC_SERVE_REQ_HAS_BODY == SHMIPC__SF_REQ_HAS_BODY &&
                   SHMIPC_SERVE_REQ_CHUNKED == SHMIPC__SF_REQ_CHUNKED &&
                   SHMIPC_SERVE_REQ_CONTENT_LENGTH == SHMIPC__SF_REQ_CONTENT_LENGTH &&
                   SHMIPC_SERVE_REQ_EXPECT_CONTINUE == SHMIPC__SF_REQ_EXPECT_CONTINUE &&
                   SHMIPC_SERVE_REQ_TAKEN_WANTED == SHMIPC__SF_REQ_TAKEN_WANTED &&
                   SHMIPC_SERVE_HELLO_SIZE == SHMIPC__SF_HELLO_SIZE &&
                   SHMIPC_SERVE_FEAT_TAKEN == SHMIPC__SF_FEAT_TAKEN &&
                   SHMIPC_SERVE_RESP_CONTENT_LENGTH == SHMIPC__SF_RESP_CONTENT_LENGTH &&
                   SHMIPC_SERVE_RESP_CLOSE == SHMIPC__SF_RESP_CLOSE,
               "flags");
_Static_assert(SHMIPC_SERVE_WS_TEXT == SHMIPC__SF_WS_TEXT &&
                   SHMIPC_SERVE_WS_BINARY == SHMIPC__SF_WS_BINARY &&
                   SHMIPC_SERVE_WS_FIN == SHMIPC__SF_WS_FIN,
               "ws arg");
_Static_assert(SHMIPC_SERVE_ABORT_CLIENT_GONE == SHMIPC__SF_ABORT_CLIENT_GONE &&
                   SHMIPC_SERVE_ABORT_SHUTDOWN == SHMIPC__SF_ABORT_SHUTDOWN,
               "abort reasons");
_Static_assert(SHMIPC_SERVE_AF_INET == SHMIPC__SF_AF_INET &&
                   SHMIPC_SERVE_AF_INET6 == SHMIPC__SF_AF_INET6 &&
                   SHMIPC_SERVE_AF_UNIX == SHMIPC__SF_AF_UNIX,
               "address families");

/* The public structs are @sized: a caller built against an older header hands a smaller
 * size. This library needs at least the first version's fields. */
#define SIZED_OK(p, type) ((p)->size >= sizeof(type))

SHMIPC_API const char *shmipc_serve_type_name(uint32_t type)
{
    return shmipc__sf_type_name(type);
}

static void frame_out(shmipc_serve_frame *f, const struct shmipc__sf_frame *in)
{
    size_t size = f->size;
    memset(f, 0, sizeof *f);
    f->size = size;
    f->type = in->type;
    f->length = in->length;
    f->arg = in->arg;
    f->payload = in->payload;
    if (in->type == SHMIPC__SF_WS_CLOSE && in->payload != NULL) {
        f->close_code = in->u.close.code;
        f->close_reason = in->u.close.reason;
        f->close_reason_len = in->u.close.reason_len;
    }
}

SHMIPC_API int shmipc_serve_decode_header(const void *buf, size_t len, shmipc_serve_frame *f)
{
    if (buf == NULL || f == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "serve_decode_header: %s is NULL",
                            buf == NULL ? "buf" : "f");
    if (!SIZED_OK(f, shmipc_serve_frame))
        return shmipc__fail(SHMIPC_EINVAL, "serve_decode_header: f->size %zu is too small",
                            f->size);
    struct shmipc__sf_frame in;
    int rc = shmipc__sf_decode_header(buf, len, &in);
    if (rc > 0) {
        in.payload = NULL;
        frame_out(f, &in);
    }
    return rc;
}

SHMIPC_API int64_t shmipc_serve_decode(const void *buf, size_t len, shmipc_serve_frame *f)
{
    if (buf == NULL || f == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "serve_decode: %s is NULL", buf == NULL ? "buf" : "f");
    if (!SIZED_OK(f, shmipc_serve_frame))
        return shmipc__fail(SHMIPC_EINVAL, "serve_decode: f->size %zu is too small", f->size);
    struct shmipc__sf_frame in;
    long rc = shmipc__sf_decode(buf, len, &in);
    if (rc > 0)
        frame_out(f, &in);
    return rc;
}

static void addr_out(shmipc_serve_addr *a, const struct shmipc__sf_addr *in)
{
    memset(a, 0, sizeof *a);
    a->family = in->family;
    a->port = in->port;
    memcpy(a->addr, in->addr, sizeof a->addr);
}

static void fields_out(shmipc_serve_fields *it, const struct shmipc__sf_fields *in)
{
    it->next = in->p;
    it->left = in->left;
    it->reserved = 0;
}

SHMIPC_API int64_t shmipc_serve_decode_request(const void *buf, size_t len, shmipc_serve_request *r)
{
    if (buf == NULL || r == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "serve_decode_request: %s is NULL",
                            buf == NULL ? "buf" : "r");
    if (!SIZED_OK(r, shmipc_serve_request))
        return shmipc__fail(SHMIPC_EINVAL, "serve_decode_request: r->size %zu is too small",
                            r->size);
    struct shmipc__sf_frame in;
    long rc = shmipc__sf_decode(buf, len, &in);
    if (rc <= 0)
        return rc;
    if (in.type != SHMIPC__SF_REQUEST_HEAD)
        return shmipc__fail(SHMIPC_EPROTO, "serve_decode_request: a %s frame",
                            shmipc__sf_type_name(in.type));
    const struct shmipc__sf_request *q = &in.u.req;
    size_t size = r->size;
    memset(r, 0, sizeof *r);
    r->size = size;
    r->flags = q->flags;
    r->version_minor = q->version_minor;
    r->scheme = q->scheme;
    r->content_length = q->content_length;
    addr_out(&r->peer, &q->peer);
    addr_out(&r->local, &q->local);
    r->method = q->method;
    r->method_len = q->method_len;
    r->target = q->target;
    r->target_len = q->target_len;
    r->nfields = q->nfields;
    fields_out(&r->fields, &q->fields);
    return rc;
}

SHMIPC_API int64_t shmipc_serve_decode_response(const void *buf, size_t len,
                                                shmipc_serve_response *r)
{
    if (buf == NULL || r == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "serve_decode_response: %s is NULL",
                            buf == NULL ? "buf" : "r");
    if (!SIZED_OK(r, shmipc_serve_response))
        return shmipc__fail(SHMIPC_EINVAL, "serve_decode_response: r->size %zu is too small",
                            r->size);
    struct shmipc__sf_frame in;
    long rc = shmipc__sf_decode(buf, len, &in);
    if (rc <= 0)
        return rc;
    if (in.type != SHMIPC__SF_RESPONSE_HEAD)
        return shmipc__fail(SHMIPC_EPROTO, "serve_decode_response: a %s frame",
                            shmipc__sf_type_name(in.type));
    size_t size = r->size;
    memset(r, 0, sizeof *r);
    r->size = size;
    r->flags = in.u.resp.flags;
    r->status = in.u.resp.status;
    r->content_length = in.u.resp.content_length;
    r->nfields = in.u.resp.nfields;
    fields_out(&r->fields, &in.u.resp.fields);
    return rc;
}

SHMIPC_API int shmipc_serve_fields_next(shmipc_serve_fields *it, shmipc_serve_field *out)
{
    if (it == NULL || out == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "serve_fields_next: %s is NULL",
                            it == NULL ? "it" : "out");
    if (it->left == 0 || it->next == NULL)
        return 0;
    /* The iterator walks a head the decoder validated; left is at most SHMIPC_SERVE_MAX_HEADERS
     * there, so a larger one was not made by a decoder. */
    if (it->left > SHMIPC_SERVE_MAX_HEADERS)
        return shmipc__fail(SHMIPC_EINVAL, "serve_fields_next: %u fields left", it->left);
    struct shmipc__sf_fields in = {.p = it->next, .left = (uint16_t)it->left};
    struct shmipc__sf_field fld;
    if (!shmipc__sf_fields_next(&in, &fld))
        return 0;
    it->next = in.p;
    it->left = in.left;
    out->name = fld.name;
    out->value = fld.value;
    out->name_len = fld.name_len;
    out->value_len = fld.value_len;
    return 1;
}

/* The caller's fields as the core's, checked against the limits the core's 16-bit lengths
 * would otherwise truncate. */
static int fields_in(const char *what, struct shmipc__sf_field *dst, const shmipc_serve_field *src,
                     size_t n)
{
    if (n > SHMIPC_SERVE_MAX_HEADERS)
        return shmipc__fail(SHMIPC_EMSGSIZE, "%s: %zu header fields, at most %u", what, n,
                            SHMIPC_SERVE_MAX_HEADERS);
    if (n > 0 && src == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "%s: fields is NULL", what);
    for (size_t i = 0; i < n; i++) {
        if (src[i].name_len > SHMIPC_SERVE_MAX_NAME || src[i].value_len > SHMIPC_SERVE_MAX_VALUE)
            return shmipc__fail(SHMIPC_EMSGSIZE, "%s: field %zu is over the limit", what, i);
        if ((src[i].name == NULL && src[i].name_len > 0) ||
            (src[i].value == NULL && src[i].value_len > 0))
            return shmipc__fail(SHMIPC_EINVAL, "%s: field %zu has a NULL name or value", what, i);
        dst[i].name = src[i].name;
        dst[i].value = src[i].value;
        dst[i].name_len = (uint16_t)src[i].name_len;
        dst[i].value_len = (uint16_t)src[i].value_len;
    }
    return 0;
}

static void addr_in(struct shmipc__sf_addr *dst, const shmipc_serve_addr *src)
{
    memset(dst, 0, sizeof *dst);
    dst->family = src->family;
    dst->port = src->port;
    memcpy(dst->addr, src->addr, sizeof dst->addr);
}

SHMIPC_API int64_t shmipc_serve_encode_request_head(void *out, size_t cap,
                                                    const shmipc_serve_request *r,
                                                    const shmipc_serve_field *fields,
                                                    size_t nfields)
{
    static const char what[] = "serve_encode_request_head";
    if (out == NULL || r == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "%s: %s is NULL", what, out == NULL ? "out" : "r");
    if (!SIZED_OK(r, shmipc_serve_request))
        return shmipc__fail(SHMIPC_EINVAL, "%s: r->size %zu is too small", what, r->size);
    if (r->method == NULL || r->target == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "%s: method or target is NULL", what);
    if (r->method_len > SHMIPC_SERVE_MAX_METHOD || r->target_len > SHMIPC_SERVE_MAX_TARGET)
        return shmipc__fail(SHMIPC_EMSGSIZE, "%s: method or target over the limit", what);
    struct shmipc__sf_field fl[SHMIPC_SERVE_MAX_HEADERS];
    int rc = fields_in(what, fl, fields, nfields);
    if (rc < 0)
        return rc;
    struct shmipc__sf_request q = {
        .flags = r->flags,
        .version_minor = r->version_minor,
        .scheme = r->scheme,
        .content_length = r->content_length,
        .method = r->method,
        .target = r->target,
        .method_len = (uint16_t)r->method_len,
        .target_len = (uint16_t)r->target_len,
        .nfields = (uint16_t)nfields,
    };
    addr_in(&q.peer, &r->peer);
    addr_in(&q.local, &r->local);
    return shmipc__sf_encode_request_head(out, cap, &q, fl);
}

SHMIPC_API int64_t shmipc_serve_encode_response_head(void *out, size_t cap,
                                                     const shmipc_serve_response *r,
                                                     const shmipc_serve_field *fields,
                                                     size_t nfields)
{
    static const char what[] = "serve_encode_response_head";
    if (out == NULL || r == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "%s: %s is NULL", what, out == NULL ? "out" : "r");
    if (!SIZED_OK(r, shmipc_serve_response))
        return shmipc__fail(SHMIPC_EINVAL, "%s: r->size %zu is too small", what, r->size);
    struct shmipc__sf_field fl[SHMIPC_SERVE_MAX_HEADERS];
    int rc = fields_in(what, fl, fields, nfields);
    if (rc < 0)
        return rc;
    struct shmipc__sf_response q = {
        .flags = r->flags,
        .status = r->status,
        .content_length = r->content_length,
        .nfields = (uint16_t)nfields,
    };
    return shmipc__sf_encode_response_head(out, cap, &q, fl);
}

SHMIPC_API int shmipc_serve_encode_header(void *out, size_t cap, uint32_t type, size_t length,
                                          uint32_t arg)
{
    if (out == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "serve_encode_header: out is NULL");
    if (cap < SHMIPC_SERVE_HDR_SIZE)
        return shmipc__fail(SHMIPC_EMSGSIZE, "serve_encode_header: %zu bytes hold no header", cap);
    return shmipc__sf_encode_header(out, type, length, arg);
}

SHMIPC_API int64_t shmipc_serve_encode_frame(void *out, size_t cap, uint32_t type, uint32_t arg,
                                             const void *payload, size_t len)
{
    if (out == NULL || (payload == NULL && len > 0))
        return shmipc__fail(SHMIPC_EINVAL, "serve_encode_frame: %s is NULL",
                            out == NULL ? "out" : "payload");
    struct iovec iov[2];
    uint8_t hdr[SHMIPC__SF_HDR_SIZE];
    long rc = shmipc__sf_encode_iov(iov, hdr, type, arg, payload != NULL ? payload : "", len);
    if (rc < 0)
        return rc;
    if (cap < (size_t)rc)
        return shmipc__fail(SHMIPC_EMSGSIZE, "serve_encode_frame: %zu bytes do not hold %ld", cap,
                            rc);
    memcpy(out, hdr, sizeof hdr);
    if (len > 0)
        memcpy((uint8_t *)out + sizeof hdr, payload, len);
    return rc;
}

SHMIPC_API int64_t shmipc_serve_encode_ws_close(void *out, size_t cap, uint32_t code,
                                                const void *reason, size_t reason_len)
{
    if (out == NULL || (reason == NULL && reason_len > 0))
        return shmipc__fail(SHMIPC_EINVAL, "serve_encode_ws_close: %s is NULL",
                            out == NULL ? "out" : "reason");
    if (code > UINT16_MAX)
        return shmipc__fail(SHMIPC_EINVAL, "serve_encode_ws_close: code %u is not 16-bit", code);
    return shmipc__sf_encode_ws_close(out, cap, (uint16_t)code, reason != NULL ? reason : "",
                                      reason_len);
}
