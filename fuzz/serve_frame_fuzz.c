/*
 * Fuzz target: the shmipc-serve front<->worker framing (core/net/serve_frame.c).
 *
 * Input: a stream of frames as a front or a worker sends them. The oracles, beyond the
 * sanitizers: a decoded frame never claims more bytes than it was given and its fields lie
 * inside it; every shorter prefix of a valid frame is "need more" (0); re-encoding a decoded
 * frame gives the same bytes; errors are only SHMIPC_EPROTO or SHMIPC_EMSGSIZE. The public
 * codec (shmipc_serve.h) decodes every frame as the core does and re-encodes it to the same
 * bytes.
 */
#include "net/serve_frame.h"
#include "shmipc_serve.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shmipc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Room for the largest frame: a BODY or WS_DATA chunk (1 MiB) is larger than a head. */
_Static_assert(SHMIPC__SF_MAX_CHUNK >= SHMIPC__SF_MAX_HEAD, "the largest payload");
static uint8_t out[SHMIPC__SF_HDR_SIZE + SHMIPC__SF_MAX_CHUNK];
static struct shmipc__sf_field fields[SHMIPC__SF_MAX_HEADERS];

/* Walks the fields of a head, checks they lie in [p, end), and copies them for re-encoding. */
static void walk(struct shmipc__sf_fields it, uint16_t n, const uint8_t *p, const uint8_t *end)
{
    struct shmipc__sf_field f;
    uint16_t k = 0;
    while (shmipc__sf_fields_next(&it, &f)) {
        if (k >= n || f.name < p || f.value + f.value_len > end || f.name + f.name_len != f.value)
            abort();
        fields[k++] = f;
    }
    if (k != n)
        abort();
}

static void check_round_trip(const uint8_t *buf, long n, struct shmipc__sf_frame *f)
{
    long m = 0;
    switch (f->type) {
    case SHMIPC__SF_REQUEST_HEAD:
        walk(f->u.req.fields, f->u.req.nfields, buf, buf + n);
        m = shmipc__sf_encode_request_head(out, sizeof(out), &f->u.req, fields);
        break;
    case SHMIPC__SF_RESPONSE_HEAD:
        walk(f->u.resp.fields, f->u.resp.nfields, buf, buf + n);
        m = shmipc__sf_encode_response_head(out, sizeof(out), &f->u.resp, fields);
        break;
    default: {
        struct iovec iov[2];
        m = shmipc__sf_encode_iov(iov, out, f->type, f->arg, f->payload, f->length);
        if (m > 0 && (iov[1].iov_base != f->payload || iov[1].iov_len != f->length))
            abort();
        if (m > 0 && f->length)
            memcpy(out + SHMIPC__SF_HDR_SIZE, f->payload, f->length);
        break;
    }
    }
    if (m != n || memcmp(out, buf, (size_t)n) != 0)
        abort();
}

static shmipc_serve_field pub_fields[SHMIPC_SERVE_MAX_HEADERS];

static uint32_t pub_walk(shmipc_serve_fields it, uint32_t n)
{
    shmipc_serve_field f;
    uint32_t k = 0;
    int rc;
    while ((rc = shmipc_serve_fields_next(&it, &f)) == 1) {
        if (k >= n || f.name != fields[k].name || f.name_len != fields[k].name_len ||
            f.value != fields[k].value || f.value_len != fields[k].value_len)
            abort();
        pub_fields[k++] = f;
    }
    if (rc != 0 || k != n)
        abort();
    return k;
}

/* The public codec over a frame the core decoded as f (fields[] holds its fields). */
static void check_public(const uint8_t *buf, long n, const struct shmipc__sf_frame *f)
{
    shmipc_serve_frame pf = {.size = sizeof pf};
    if (shmipc_serve_decode(buf, (size_t)n, &pf) != n || pf.type != f->type ||
        pf.length != f->length || pf.arg != f->arg || pf.payload != f->payload)
        abort();
    int64_t m;
    if (f->type == SHMIPC__SF_REQUEST_HEAD) {
        shmipc_serve_request r = {.size = sizeof r};
        if (shmipc_serve_decode_request(buf, (size_t)n, &r) != n)
            abort();
        uint32_t k = pub_walk(r.fields, r.nfields);
        m = shmipc_serve_encode_request_head(out, sizeof(out), &r, pub_fields, k);
    } else if (f->type == SHMIPC__SF_RESPONSE_HEAD) {
        shmipc_serve_response r = {.size = sizeof r};
        if (shmipc_serve_decode_response(buf, (size_t)n, &r) != n)
            abort();
        uint32_t k = pub_walk(r.fields, r.nfields);
        m = shmipc_serve_encode_response_head(out, sizeof(out), &r, pub_fields, k);
    } else {
        shmipc_serve_request r = {.size = sizeof r};
        if (shmipc_serve_decode_request(buf, (size_t)n, &r) != SHMIPC_EPROTO)
            abort();
        m = shmipc_serve_encode_frame(out, sizeof(out), pf.type, pf.arg, pf.payload, pf.length);
    }
    if (m != n || memcmp(out, buf, (size_t)n) != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t at = 0;
    while (at < size) {
        struct shmipc__sf_frame f;
        long n = shmipc__sf_decode(data + at, size - at, &f);
        if (n == 0)
            break;
        if (n < 0) {
            if (n != SHMIPC_EPROTO && n != SHMIPC_EMSGSIZE)
                abort();
            break;
        }
        if ((size_t)n > size - at || f.length + SHMIPC__SF_HDR_SIZE != (size_t)n)
            abort();
        if (f.payload != data + at + SHMIPC__SF_HDR_SIZE)
            abort();
        struct shmipc__sf_frame h;
        if (shmipc__sf_decode_header(data + at, SHMIPC__SF_HDR_SIZE, &h) !=
                (int)SHMIPC__SF_HDR_SIZE ||
            h.type != f.type || h.length != f.length || h.arg != f.arg)
            abort();
        check_round_trip(data + at, n, &f);
        check_public(data + at, n, &f);
        /* Prefixes: a few lengths, each an exact heap copy so a read past it is caught. */
        size_t cuts[] = {0, 1, 4, 11, 12, (size_t)n / 2, (size_t)n - 1};
        for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
            if (cuts[i] >= (size_t)n)
                continue;
            uint8_t *c = malloc(cuts[i] ? cuts[i] : 1);
            if (c == NULL)
                return 0;
            memcpy(c, data + at, cuts[i]);
            struct shmipc__sf_frame g;
            if (shmipc__sf_decode(c, cuts[i], &g) != 0)
                abort();
            free(c);
        }
        at += (size_t)n;
    }
    return 0;
}
