/*
 * The HTTP/1.1 body decoder (http_parser.h: shmipc__http_body_decode, shmipc__http_body_take):
 * Content-Length bodies counted through, chunked bodies decoded in place (the chunk framing
 * squeezed out), chunk-size lines and extensions checked, and the trailer section, whose
 * lines are field lines as in the head. Owns the parser's body state (bstate, in, out, bline,
 * bscan, remaining, total, trailer_start). May call: http_parser.c's shared pieces
 * (http_parser_int.h), common/ (errors).
 */
#include "net/http_parser_int.h"

#include <string.h>

/* Drops the chunk framing already decoded: moves the undecoded tail down to the data. */
static void squeeze(struct shmipc__http_parser *p, char *buf, size_t *len)
{
    if (p->out == p->in)
        return;
    size_t d = p->in - p->out;
    memmove(buf + p->out, buf + p->in, *len - p->in);
    *len -= d;
    p->in -= d;
    if (p->bstate == B_SIZE) { /* the only squeezing state whose line offsets are live */
        p->bline -= d;
        p->bscan -= d;
    }
}

/* `chunk-size [ chunk-ext ]` in [s, e). */
static int chunk_size_line(struct shmipc__http_parser *p, const char *b, size_t s, size_t e)
{
    uint64_t v = 0;
    int huge = 0;
    size_t i = s;
    for (; i < e && IS(b[i], C_HEX); i++) {
        /* Below 2^59 a digit more cannot overflow; above, the chunk is past any limit. */
        if (v >= (1ull << 59)) {
            huge = 1;
            continue;
        }
        unsigned char c = lower((unsigned char)b[i]);
        v = v * 16 + (uint64_t)(c <= '9' ? c - '0' : c - 'a' + 10);
    }
    if (i == s)
        return fail(p, 400, "chunk size is not hexadecimal");
    if (!shmipc__http_valid_params(b, i, e))
        return fail(p, 400, "invalid chunk extension");
    if (huge || v > p->limits->max_body - p->total)
        return fail(p, 413, "chunked body above max_body");
    p->remaining = v;
    p->total += v;
    return 0;
}

int shmipc__http_body_decode(struct shmipc__http_parser *p, char *buf, size_t *len)
{
    const struct shmipc__http_limits *lim = p->limits;
    size_t n = *len;
    if (p->state == P_FAILED)
        return shmipc__fail(SHMIPC_EPROTO, "http %d: the connection already failed", p->status);
    if (p->state == P_IDLE)
        return 1;
    if (p->state != P_BODY)
        return shmipc__fail(SHMIPC_EINVAL, "http: no request head to decode a body for");
    for (;;) {
        switch (p->bstate) {
        case B_LENGTH: {
            size_t k = n - p->in;
            if (k > p->remaining)
                k = (size_t)p->remaining;
            p->in += k;
            p->out += k;
            p->remaining -= k;
            if (p->remaining)
                return 0;
            p->bstate = B_DONE;
            break;
        }
        case B_DATA: {
            size_t k = n - p->in;
            if (k > p->remaining)
                k = (size_t)p->remaining;
            if (p->out != p->in)
                memmove(buf + p->out, buf + p->in, k);
            p->in += k;
            p->out += k;
            p->remaining -= k;
            if (p->remaining) {
                squeeze(p, buf, len);
                return 0;
            }
            p->bstate = B_DATA_END;
            p->bline = p->bscan = p->in;
            break;
        }
        case B_DATA_END: {
            /* Exactly CRLF (or LF when lenient) after the data, split anywhere. */
            size_t k = n - p->in;
            if (k >= 1 && buf[p->in] == '\n' && (lim->flags & SHMIPC__HTTP_LENIENT_LF)) {
                p->in += 1;
            } else if (k >= 1 && buf[p->in] != '\r') {
                return fail(p, 400, "chunk data not followed by CRLF");
            } else if (k < 2) {
                squeeze(p, buf, len);
                return 0;
            } else if (buf[p->in + 1] != '\n') {
                return fail(p, 400, "chunk data not followed by CRLF");
            } else {
                p->in += 2;
            }
            p->bstate = B_SIZE;
            p->bline = p->bscan = p->in;
            break;
        }
        case B_SIZE:
        case B_TRAILER: {
            int trailer = p->bstate == B_TRAILER;
            size_t end =
                trailer ? p->trailer_start + lim->max_head_bytes : p->bline + lim->max_chunk_line;
            size_t stop = n < end ? n : end;
            const char *lf = NULL;
            if (p->bscan < stop)
                lf = memchr(buf + p->bscan, '\n', stop - p->bscan);
            if (!lf) {
                if (n >= end)
                    return trailer ? fail(p, 431, "trailer section larger than max_head_bytes")
                                   : fail(p, 400, "chunk line longer than max_chunk_line");
                p->bscan = n;
                if (!trailer)
                    squeeze(p, buf, len);
                return 0;
            }
            size_t line = p->bline, f = (size_t)(lf - buf), ce = f;
            if (f > line && buf[f - 1] == '\r')
                ce = f - 1;
            else if (!(lim->flags & SHMIPC__HTTP_LENIENT_LF))
                return fail(p, 400, "a line ends with a bare LF");
            p->bline = p->bscan = p->in = f + 1;
            int rc;
            if (!trailer) {
                if ((rc = chunk_size_line(p, buf, line, ce)) != 0)
                    return rc;
                if (p->remaining) {
                    p->bstate = B_DATA;
                } else {
                    p->bstate = B_TRAILER;
                    p->trailer_start = p->in;
                }
            } else if (ce == line) {
                p->bstate = B_DONE;
            } else if (f + 1 > UINT32_MAX) {
                return fail(p, 431, "trailers beyond 4 GiB of buffered body");
            } else if ((rc = shmipc__http_field_line(p, buf, line, ce, 1)) != 0) {
                return rc;
            }
            break;
        }
        case B_DONE:
        default:
            p->state = P_IDLE;
            return 1;
        }
    }
}

size_t shmipc__http_body_take(struct shmipc__http_parser *p)
{
    size_t n = p->out;
    if (n == 0)
        return 0;
    /* Live offsets are all at or after `out`: line offsets while a line is read, the trailer
     * section and its fields once the last chunk was seen. */
    p->out = 0;
    p->in -= n;
    if (p->bstate == B_SIZE || p->bstate == B_TRAILER) {
        p->bline -= n;
        p->bscan -= n;
    }
    if (p->req.body_kind == SHMIPC__HTTP_BODY_CHUNKED &&
        (p->bstate == B_TRAILER || p->bstate == B_DONE)) {
        p->trailer_start -= n;
        struct shmipc__http_request *r = &p->req;
        for (uint32_t i = r->nfields; i < r->nfields + r->ntrailers; i++) {
            p->fields[i].name.off -= (uint32_t)n;
            p->fields[i].value.off -= (uint32_t)n;
        }
    }
    return n;
}

int shmipc__http_body_pending(const struct shmipc__http_parser *p)
{
    return p->state == P_BODY || p->state == P_FAILED;
}
