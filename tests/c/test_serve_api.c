/*
 * The public shmipc-serve frame codec (bindings/shmipc_serve.h, docs/api.md "shmipc-serve
 * frames"), through the public header only: round trips of heads and body/WS frames, every
 * prefix "need more", every single-byte change a clean answer, limits at 0, 1, max and max+1
 * (also past the core's 16-bit lengths), NULL and too-small sized structs, short buffers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "shmipc_serve.h"

#define CAP (SHMIPC_SERVE_HDR_SIZE + SHMIPC_SERVE_MAX_HEAD)

#define FLD(n, v)                                                                                  \
    {                                                                                              \
        (const uint8_t *)(n), (const uint8_t *)(v), sizeof(n) - 1, sizeof(v) - 1                   \
    }

static const shmipc_serve_field sample_fields[] = {
    FLD("Host", "example.com"),
    FLD("Cookie", "a=1"),
    FLD("X-Empty", ""),
};

static shmipc_serve_request sample_request(void)
{
    shmipc_serve_request r = {.size = sizeof r};
    r.flags =
        SHMIPC_SERVE_REQ_KEEP_ALIVE | SHMIPC_SERVE_REQ_HAS_BODY | SHMIPC_SERVE_REQ_CONTENT_LENGTH;
    r.version_minor = 1;
    r.content_length = 1ull << 40;
    r.peer.family = SHMIPC_SERVE_AF_INET;
    r.peer.port = 54321;
    memcpy(r.peer.addr, "\x7f\x00\x00\x01", 4);
    r.local.family = SHMIPC_SERVE_AF_INET6;
    r.local.port = 8080;
    r.local.addr[15] = 1;
    r.method = (const uint8_t *)"POST";
    r.method_len = 4;
    r.target = (const uint8_t *)"/a/b?c=d";
    r.target_len = 8;
    return r;
}

static int64_t encode_sample(uint8_t *buf, size_t cap)
{
    shmipc_serve_request r = sample_request();
    return shmipc_serve_encode_request_head(buf, cap, &r, sample_fields, 3);
}

static void test_request_round_trip(void **state)
{
    (void)state;
    uint8_t *buf = malloc(CAP);
    assert_non_null(buf);
    int64_t n = encode_sample(buf, CAP);
    assert_true(n > (int64_t)SHMIPC_SERVE_HDR_SIZE);
    /* a caller with a newer (larger) struct: its size is kept, the known fields filled */
    struct {
        shmipc_serve_request r;
        uint64_t newer;
    } big;
    memset(&big, 0xAB, sizeof big);
    big.r.size = sizeof big;
    assert_int_equal(shmipc_serve_decode_request(buf, (size_t)n, &big.r), n);
    shmipc_serve_request *r = &big.r;
    assert_int_equal(r->size, sizeof big);
    assert_int_equal(r->flags, SHMIPC_SERVE_REQ_KEEP_ALIVE | SHMIPC_SERVE_REQ_HAS_BODY |
                                   SHMIPC_SERVE_REQ_CONTENT_LENGTH);
    assert_int_equal(r->version_minor, 1);
    assert_int_equal(r->content_length, 1ull << 40);
    assert_int_equal(r->peer.family, SHMIPC_SERVE_AF_INET);
    assert_int_equal(r->peer.port, 54321);
    assert_memory_equal(r->peer.addr, "\x7f\x00\x00\x01", 4);
    assert_int_equal(r->local.family, SHMIPC_SERVE_AF_INET6);
    assert_int_equal(r->local.port, 8080);
    assert_int_equal(r->local.addr[15], 1);
    assert_int_equal(r->method_len, 4);
    assert_memory_equal(r->method, "POST", 4);
    assert_int_equal(r->target_len, 8);
    assert_memory_equal(r->target, "/a/b?c=d", 8);
    assert_true(r->method >= buf && r->target + r->target_len <= buf + n);
    assert_int_equal(r->nfields, 3);
    shmipc_serve_fields it = r->fields;
    shmipc_serve_field f;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(shmipc_serve_fields_next(&it, &f), 1);
        assert_int_equal(f.name_len, sample_fields[i].name_len);
        assert_memory_equal(f.name, sample_fields[i].name, f.name_len);
        assert_int_equal(f.value_len, sample_fields[i].value_len);
        if (f.value_len)
            assert_memory_equal(f.value, sample_fields[i].value, f.value_len);
    }
    assert_int_equal(shmipc_serve_fields_next(&it, &f), 0);
    assert_int_equal(shmipc_serve_fields_next(&it, &f), 0);

    /* the generic decoder sees the same frame; the response decoder refuses it */
    shmipc_serve_frame fr = {.size = sizeof fr};
    assert_int_equal(shmipc_serve_decode(buf, (size_t)n, &fr), n);
    assert_int_equal(fr.type, SHMIPC_SERVE_REQUEST_HEAD);
    assert_int_equal(fr.length, (uint32_t)n - SHMIPC_SERVE_HDR_SIZE);
    assert_ptr_equal(fr.payload, buf + SHMIPC_SERVE_HDR_SIZE);
    shmipc_serve_response resp = {.size = sizeof resp};
    assert_int_equal(shmipc_serve_decode_response(buf, (size_t)n, &resp), SHMIPC_EPROTO);

    /* bytes after the frame are the next frame's: the size is this one's */
    assert_int_equal(shmipc_serve_decode_request(buf, CAP, r), n);
    /* every strict prefix is "need more", the header's too */
    for (int64_t len = 0; len < n; len++) {
        shmipc_serve_request q = {.size = sizeof q};
        assert_int_equal(shmipc_serve_decode_request(buf, (size_t)len, &q), 0);
        shmipc_serve_frame h = {.size = sizeof h};
        assert_int_equal(shmipc_serve_decode_header(buf, (size_t)len, &h),
                         len < (int64_t)SHMIPC_SERVE_HDR_SIZE ? 0 : (int)SHMIPC_SERVE_HDR_SIZE);
    }
    /* the exact size fits, one byte less does not */
    assert_int_equal(encode_sample(buf, (size_t)n), n);
    assert_int_equal(encode_sample(buf, (size_t)n - 1), SHMIPC_EMSGSIZE);
    assert_int_equal(encode_sample(buf, 0), SHMIPC_EMSGSIZE);
    free(buf);
}

/* Every single-byte change of a valid head decodes cleanly or fails cleanly, and a decoded
 * view never points outside the buffer. */
static void test_request_mutations(void **state)
{
    (void)state;
    uint8_t good[512], buf[512];
    int64_t n = encode_sample(good, sizeof good);
    assert_true(n > 0 && n <= (int64_t)sizeof good);
    static const uint8_t deltas[] = {0x01, 0x80, 0xFF};
    for (int64_t i = 0; i < n; i++)
        for (size_t d = 0; d < sizeof deltas; d++) {
            memcpy(buf, good, (size_t)n);
            buf[i] ^= deltas[d];
            shmipc_serve_request r = {.size = sizeof r};
            int64_t rc = shmipc_serve_decode_request(buf, (size_t)n, &r);
            assert_true(rc == 0 || rc == n || rc == SHMIPC_EPROTO || rc == SHMIPC_EMSGSIZE);
            if (rc != n)
                continue;
            assert_true(r.method >= buf && r.method + r.method_len <= buf + n);
            assert_true(r.target >= buf && r.target + r.target_len <= buf + n);
            shmipc_serve_fields it = r.fields;
            shmipc_serve_field f;
            uint32_t count = 0;
            while (shmipc_serve_fields_next(&it, &f) == 1) {
                assert_true(f.name >= buf && f.name + f.name_len <= buf + n);
                assert_true(f.value >= buf && f.value + f.value_len <= buf + n);
                count++;
            }
            assert_int_equal(count, r.nfields);
        }
    /* a header claiming the largest length, for every type */
    for (uint32_t type = 0; type <= 10; type++) {
        uint8_t h[SHMIPC_SERVE_HDR_SIZE];
        memcpy(h, good, sizeof h);
        h[2] = (uint8_t)type;
        memset(h + 4, 0xFF, 4);
        shmipc_serve_frame f = {.size = sizeof f};
        int rc = shmipc_serve_decode_header(h, sizeof h, &f);
        assert_true(rc == SHMIPC_EPROTO || rc == SHMIPC_EMSGSIZE);
    }
}

static void test_response_round_trip(void **state)
{
    (void)state;
    uint8_t buf[256];
    shmipc_serve_response r = {.size = sizeof r,
                               .flags = SHMIPC_SERVE_RESP_CONTENT_LENGTH,
                               .status = 404,
                               .content_length = 9};
    shmipc_serve_field f1[] = {FLD("Content-Type", "text/plain")};
    int64_t n = shmipc_serve_encode_response_head(buf, sizeof buf, &r, f1, 1);
    assert_true(n > 0);
    shmipc_serve_response d = {.size = sizeof d};
    assert_int_equal(shmipc_serve_decode_response(buf, (size_t)n, &d), n);
    assert_int_equal(d.status, 404);
    assert_int_equal(d.flags, SHMIPC_SERVE_RESP_CONTENT_LENGTH);
    assert_int_equal(d.content_length, 9);
    assert_int_equal(d.nfields, 1);
    shmipc_serve_field f;
    assert_int_equal(shmipc_serve_fields_next(&d.fields, &f), 1);
    assert_memory_equal(f.name, "Content-Type", 12);
    assert_int_equal(shmipc_serve_fields_next(&d.fields, &f), 0);
    shmipc_serve_request q = {.size = sizeof q};
    assert_int_equal(shmipc_serve_decode_request(buf, (size_t)n, &q), SHMIPC_EPROTO);
    /* no fields: NULL is fine with 0 */
    assert_true(shmipc_serve_encode_response_head(buf, sizeof buf, &r, NULL, 0) > 0);
    /* status and flags the decoder refuses */
    r.status = 99;
    assert_int_equal(shmipc_serve_encode_response_head(buf, sizeof buf, &r, NULL, 0),
                     SHMIPC_EINVAL);
    r.status = 200;
    r.flags = 0x80;
    assert_int_equal(shmipc_serve_encode_response_head(buf, sizeof buf, &r, NULL, 0),
                     SHMIPC_EINVAL);
}

/* Field and head limits at 0, 1, max and max+1, and past the 16-bit lengths of the wire. */
static void test_limits(void **state)
{
    (void)state;
    uint8_t *buf = malloc(CAP);
    uint8_t *big = malloc(70000);
    assert_non_null(buf);
    assert_non_null(big);
    memset(big, 'a', 70000);
    shmipc_serve_request r = sample_request();
    shmipc_serve_field f = {(const uint8_t *)"X", big, 1, 0};

    f.value_len = SHMIPC_SERVE_MAX_VALUE;
    assert_true(shmipc_serve_encode_request_head(buf, CAP, &r, &f, 1) > 0);
    f.value_len = SHMIPC_SERVE_MAX_VALUE + 1;
    assert_int_equal(shmipc_serve_encode_request_head(buf, CAP, &r, &f, 1), SHMIPC_EMSGSIZE);
    /* 65537 would wrap to 1 in a 16-bit length */
    f.value_len = 65537;
    assert_int_equal(shmipc_serve_encode_request_head(buf, CAP, &r, &f, 1), SHMIPC_EMSGSIZE);
    f.value_len = 1;
    f.name = big;
    f.name_len = SHMIPC_SERVE_MAX_NAME;
    assert_true(shmipc_serve_encode_request_head(buf, CAP, &r, &f, 1) > 0);
    f.name_len = SHMIPC_SERVE_MAX_NAME + 1;
    assert_int_equal(shmipc_serve_encode_request_head(buf, CAP, &r, &f, 1), SHMIPC_EMSGSIZE);
    f.name_len = 0; /* an empty name is not a token */
    assert_int_equal(shmipc_serve_encode_request_head(buf, CAP, &r, &f, 1), SHMIPC_EINVAL);
    f.name_len = 1;
    f.name = NULL;
    assert_int_equal(shmipc_serve_encode_request_head(buf, CAP, &r, &f, 1), SHMIPC_EINVAL);

    shmipc_serve_field many[SHMIPC_SERVE_MAX_HEADERS + 1];
    for (size_t i = 0; i < SHMIPC_SERVE_MAX_HEADERS + 1; i++)
        many[i] = (shmipc_serve_field)FLD("X-A", "b");
    int64_t n = shmipc_serve_encode_request_head(buf, CAP, &r, many, SHMIPC_SERVE_MAX_HEADERS);
    assert_true(n > 0);
    shmipc_serve_request d = {.size = sizeof d};
    assert_int_equal(shmipc_serve_decode_request(buf, (size_t)n, &d), n);
    assert_int_equal(d.nfields, SHMIPC_SERVE_MAX_HEADERS);
    assert_int_equal(
        shmipc_serve_encode_request_head(buf, CAP, &r, many, SHMIPC_SERVE_MAX_HEADERS + 1),
        SHMIPC_EMSGSIZE);
    assert_int_equal(shmipc_serve_encode_request_head(buf, CAP, &r, many, SIZE_MAX),
                     SHMIPC_EMSGSIZE);
    assert_int_equal(shmipc_serve_encode_request_head(buf, CAP, &r, NULL, 1), SHMIPC_EINVAL);

    r.method = big;
    r.method_len = 0;
    assert_int_equal(shmipc_serve_encode_request_head(buf, CAP, &r, NULL, 0), SHMIPC_EINVAL);
    r.method_len = 1;
    assert_true(shmipc_serve_encode_request_head(buf, CAP, &r, NULL, 0) > 0);
    r.method_len = SHMIPC_SERVE_MAX_METHOD;
    assert_true(shmipc_serve_encode_request_head(buf, CAP, &r, NULL, 0) > 0);
    r.method_len = SHMIPC_SERVE_MAX_METHOD + 1;
    assert_int_equal(shmipc_serve_encode_request_head(buf, CAP, &r, NULL, 0), SHMIPC_EMSGSIZE);
    r = sample_request();
    big[0] = '/';
    r.target = big;
    r.target_len = SHMIPC_SERVE_MAX_TARGET;
    assert_true(shmipc_serve_encode_request_head(buf, CAP, &r, NULL, 0) > 0);
    r.target_len = SHMIPC_SERVE_MAX_TARGET + 1;
    assert_int_equal(shmipc_serve_encode_request_head(buf, CAP, &r, NULL, 0), SHMIPC_EMSGSIZE);
    r.target_len = 65536 + 1; /* 1 in 16 bits */
    assert_int_equal(shmipc_serve_encode_request_head(buf, CAP, &r, NULL, 0), SHMIPC_EMSGSIZE);
    free(big);
    free(buf);
}

static void test_body_and_ws_frames(void **state)
{
    (void)state;
    uint8_t *buf = malloc(SHMIPC_SERVE_HDR_SIZE + SHMIPC_SERVE_MAX_CHUNK + 1);
    uint8_t *data = calloc(1, SHMIPC_SERVE_MAX_CHUNK + 1);
    assert_non_null(buf);
    assert_non_null(data);
    size_t cap = SHMIPC_SERVE_HDR_SIZE + SHMIPC_SERVE_MAX_CHUNK + 1;
    shmipc_serve_frame f = {.size = sizeof f};

    assert_int_equal(shmipc_serve_encode_frame(buf, cap, SHMIPC_SERVE_BODY, 0, "hello", 5), 17);
    assert_int_equal(shmipc_serve_decode(buf, 17, &f), 17);
    assert_int_equal(f.type, SHMIPC_SERVE_BODY);
    assert_int_equal(f.length, 5);
    assert_memory_equal(f.payload, "hello", 5);
    assert_int_equal(shmipc_serve_decode_header(buf, 12, &f), 12);
    assert_int_equal(f.length, 5);
    assert_null(f.payload);
    /* 0, 1, max, max+1 payload bytes */
    assert_int_equal(shmipc_serve_encode_frame(buf, cap, SHMIPC_SERVE_END, 0, NULL, 0), 12);
    assert_int_equal(shmipc_serve_encode_frame(buf, cap, SHMIPC_SERVE_BODY, 0, data, 1), 13);
    assert_int_equal(
        shmipc_serve_encode_frame(buf, cap, SHMIPC_SERVE_BODY, 0, data, SHMIPC_SERVE_MAX_CHUNK),
        (int64_t)(SHMIPC_SERVE_HDR_SIZE + SHMIPC_SERVE_MAX_CHUNK));
    assert_int_equal(
        shmipc_serve_encode_frame(buf, cap, SHMIPC_SERVE_BODY, 0, data, SHMIPC_SERVE_MAX_CHUNK + 1),
        SHMIPC_EMSGSIZE);
    assert_int_equal(shmipc_serve_encode_frame(buf, cap, SHMIPC_SERVE_WS_PING, 0, data,
                                               SHMIPC_SERVE_MAX_CONTROL),
                     (int64_t)(SHMIPC_SERVE_HDR_SIZE + SHMIPC_SERVE_MAX_CONTROL));
    assert_int_equal(shmipc_serve_encode_frame(buf, cap, SHMIPC_SERVE_WS_PING, 0, data,
                                               SHMIPC_SERVE_MAX_CONTROL + 1),
                     SHMIPC_EMSGSIZE);
    /* the output buffer: exact fits, one short does not */
    assert_int_equal(shmipc_serve_encode_frame(buf, 17, SHMIPC_SERVE_BODY, 0, "hello", 5), 17);
    assert_int_equal(shmipc_serve_encode_frame(buf, 16, SHMIPC_SERVE_BODY, 0, "hello", 5),
                     SHMIPC_EMSGSIZE);
    /* heads have their own encoders; unknown types and bad args are refused */
    assert_int_equal(shmipc_serve_encode_frame(buf, cap, SHMIPC_SERVE_REQUEST_HEAD, 0, NULL, 0),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_encode_frame(buf, cap, 0, 0, NULL, 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_encode_frame(buf, cap, 10, 0, NULL, 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_encode_frame(buf, cap, SHMIPC_SERVE_ABORT, 0, NULL, 0),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_encode_frame(buf, cap, SHMIPC_SERVE_WS_DATA,
                                               SHMIPC_SERVE_WS_TEXT | SHMIPC_SERVE_WS_FIN, "hi", 2),
                     14);
    assert_int_equal(shmipc_serve_decode(buf, 14, &f), 14);
    assert_int_equal(f.arg, SHMIPC_SERVE_WS_TEXT | SHMIPC_SERVE_WS_FIN);
    /* a WS_CLOSE payload is checked: 1005 may not be sent */
    assert_int_equal(shmipc_serve_encode_frame(buf, cap, SHMIPC_SERVE_WS_CLOSE, 0, "\xed\x03", 2),
                     SHMIPC_EINVAL);

    /* encode_header: 11, 12 bytes of room; a length past the type's limit */
    assert_int_equal(shmipc_serve_encode_header(buf, 11, SHMIPC_SERVE_BODY, 5, 0), SHMIPC_EMSGSIZE);
    assert_int_equal(shmipc_serve_encode_header(buf, 12, SHMIPC_SERVE_BODY, 5, 0), 12);
    assert_int_equal(shmipc_serve_decode_header(buf, 12, &f), 12);
    assert_int_equal(f.length, 5);
    assert_int_equal(shmipc_serve_decode(buf, 12, &f), 0); /* the payload is still to come */
    assert_int_equal(
        shmipc_serve_encode_header(buf, 12, SHMIPC_SERVE_BODY, SHMIPC_SERVE_MAX_CHUNK + 1, 0),
        SHMIPC_EMSGSIZE);
    assert_int_equal(shmipc_serve_encode_header(buf, 12, SHMIPC_SERVE_BODY, SIZE_MAX, 0),
                     SHMIPC_EMSGSIZE);
    assert_int_equal(shmipc_serve_encode_header(buf, 12, SHMIPC_SERVE_RESPONSE_HEAD, 0, 0),
                     SHMIPC_EINVAL);
    free(data);
    free(buf);
}

static void test_ws_close(void **state)
{
    (void)state;
    uint8_t buf[SHMIPC_SERVE_HDR_SIZE + 2 + SHMIPC_SERVE_MAX_CLOSE_REASON + 1];
    char reason[SHMIPC_SERVE_MAX_CLOSE_REASON + 1];
    memset(reason, 'r', sizeof reason);
    shmipc_serve_frame f = {.size = sizeof f};

    int64_t n = shmipc_serve_encode_ws_close(buf, sizeof buf, 1000, "bye", 3);
    assert_int_equal(n, 17);
    assert_int_equal(shmipc_serve_decode(buf, (size_t)n, &f), n);
    assert_int_equal(f.type, SHMIPC_SERVE_WS_CLOSE);
    assert_int_equal(f.close_code, 1000);
    assert_int_equal(f.close_reason_len, 3);
    assert_memory_equal(f.close_reason, "bye", 3);
    assert_int_equal(shmipc_serve_encode_ws_close(buf, sizeof buf, 0, NULL, 0), 12);
    assert_int_equal(shmipc_serve_decode(buf, 12, &f), 12);
    assert_int_equal(f.close_code, 0);
    assert_int_equal(f.close_reason_len, 0);
    assert_int_equal(shmipc_serve_encode_ws_close(buf, sizeof buf, 0, "x", 1), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_encode_ws_close(buf, sizeof buf, 1005, NULL, 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_encode_ws_close(buf, sizeof buf, 1000 + 65536, NULL, 0),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_encode_ws_close(buf, sizeof buf, 1000, "\xff", 1), SHMIPC_EINVAL);
    assert_int_equal(
        shmipc_serve_encode_ws_close(buf, sizeof buf, 1000, reason, SHMIPC_SERVE_MAX_CLOSE_REASON),
        (int64_t)(SHMIPC_SERVE_HDR_SIZE + 2 + SHMIPC_SERVE_MAX_CLOSE_REASON));
    assert_int_equal(shmipc_serve_encode_ws_close(buf, sizeof buf, 1000, reason,
                                                  SHMIPC_SERVE_MAX_CLOSE_REASON + 1),
                     SHMIPC_EMSGSIZE);
    assert_int_equal(shmipc_serve_encode_ws_close(buf, 13, 1000, NULL, 0), SHMIPC_EMSGSIZE);
}

/* NULL for every pointer, and sized structs smaller than this header's. */
static void test_misuse(void **state)
{
    (void)state;
    uint8_t buf[256];
    int64_t n = encode_sample(buf, sizeof buf);
    assert_true(n > 0);
    shmipc_serve_frame f = {.size = sizeof f};
    shmipc_serve_request r = sample_request();
    shmipc_serve_response resp = {.size = sizeof resp, .status = 200};
    shmipc_serve_fields it = {0};
    shmipc_serve_field fld;

    assert_int_equal(shmipc_serve_decode_header(NULL, 12, &f), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_decode_header(buf, 12, NULL), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_decode(NULL, 0, &f), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_decode(buf, (size_t)n, NULL), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_decode_request(NULL, (size_t)n, &r), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_decode_request(buf, (size_t)n, NULL), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_decode_response(NULL, (size_t)n, &resp), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_decode_response(buf, (size_t)n, NULL), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_fields_next(NULL, &fld), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_fields_next(&it, NULL), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_fields_next(&it, &fld), 0);
    it.left = SHMIPC_SERVE_MAX_HEADERS + 1; /* not made by a decoder */
    it.next = buf;
    assert_int_equal(shmipc_serve_fields_next(&it, &fld), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_encode_request_head(NULL, sizeof buf, &r, NULL, 0),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_encode_request_head(buf, sizeof buf, NULL, NULL, 0),
                     SHMIPC_EINVAL);
    r.method = NULL;
    assert_int_equal(shmipc_serve_encode_request_head(buf, sizeof buf, &r, NULL, 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_encode_response_head(NULL, sizeof buf, &resp, NULL, 0),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_encode_response_head(buf, sizeof buf, NULL, NULL, 0),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_encode_header(NULL, 12, SHMIPC_SERVE_END, 0, 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_encode_frame(NULL, 12, SHMIPC_SERVE_END, 0, NULL, 0),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_encode_frame(buf, sizeof buf, SHMIPC_SERVE_BODY, 0, NULL, 1),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_encode_ws_close(NULL, 64, 1000, NULL, 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_encode_ws_close(buf, sizeof buf, 1000, NULL, 1), SHMIPC_EINVAL);

    /* sized structs: 0 and one byte short are refused, nothing written */
    size_t sizes[] = {0, sizeof f - 1};
    for (size_t i = 0; i < 2; i++) {
        shmipc_serve_frame sf;
        memset(&sf, 0x5A, sizeof sf);
        sf.size = sizes[i];
        assert_int_equal(shmipc_serve_decode(buf, (size_t)n, &sf), SHMIPC_EINVAL);
        assert_int_equal(shmipc_serve_decode_header(buf, (size_t)n, &sf), SHMIPC_EINVAL);
        assert_int_equal(sf.type, 0x5A5A5A5Au);
        shmipc_serve_request sr = sample_request();
        sr.size = i == 0 ? 0 : sizeof sr - 1;
        assert_int_equal(shmipc_serve_decode_request(buf, (size_t)n, &sr), SHMIPC_EINVAL);
        sr = sample_request();
        sr.size = i == 0 ? 0 : sizeof sr - 1;
        assert_int_equal(shmipc_serve_encode_request_head(buf + 128, 128, &sr, NULL, 0),
                         SHMIPC_EINVAL);
        shmipc_serve_response sp = {.size = i == 0 ? 0 : sizeof sp - 1, .status = 200};
        assert_int_equal(shmipc_serve_decode_response(buf, (size_t)n, &sp), SHMIPC_EINVAL);
        assert_int_equal(shmipc_serve_encode_response_head(buf + 128, 128, &sp, NULL, 0),
                         SHMIPC_EINVAL);
    }
    /* the error detail says which argument */
    assert_int_equal(shmipc_serve_decode(buf, (size_t)n, NULL), SHMIPC_EINVAL);
    assert_non_null(strstr(shmipc_error_detail(), "f is NULL"));
}

static void test_type_names(void **state)
{
    (void)state;
    assert_string_equal(shmipc_serve_type_name(0), "?");
    assert_string_equal(shmipc_serve_type_name(SHMIPC_SERVE_REQUEST_HEAD), "REQUEST_HEAD");
    assert_string_equal(shmipc_serve_type_name(SHMIPC_SERVE_RESPONSE_HEAD), "RESPONSE_HEAD");
    assert_string_equal(shmipc_serve_type_name(SHMIPC_SERVE_WS_CLOSE), "WS_CLOSE");
    assert_string_equal(shmipc_serve_type_name(SHMIPC_SERVE_HELLO), "HELLO");
    assert_string_equal(shmipc_serve_type_name(SHMIPC_SERVE_TAKEN), "TAKEN");
    assert_string_equal(shmipc_serve_type_name(SHMIPC_SERVE_TAKEN + 1), "?");
    assert_string_equal(shmipc_serve_type_name(UINT32_MAX), "?");
    assert_string_equal(shmipc_serve_type_name(0x100 + SHMIPC_SERVE_BODY), "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_round_trip),
        cmocka_unit_test(test_request_mutations),
        cmocka_unit_test(test_response_round_trip),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_body_and_ws_frames),
        cmocka_unit_test(test_ws_close),
        cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_type_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
