/* Description: the HTTP/1.1 response writer: heads, iovecs, Date cache, chunks, batches. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shmipc.h"
#include "net/http_writer.h"

/* 1994-11-06 08:49:37 UTC, the date of RFC 9110's examples. */
#define FIXED_TIME ((time_t)784111777)

/* The bytes of the iovecs, concatenated and NUL-terminated; the caller frees. */
static char *flatten(const struct iovec *iov, size_t n, size_t *total)
{
    size_t len = 0;
    for (size_t i = 0; i < n; i++)
        len += iov[i].iov_len;
    char *s = malloc(len + 1);
    assert_non_null(s);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(s + k, iov[i].iov_base, iov[i].iov_len);
        k += iov[i].iov_len;
    }
    s[len] = 0;
    if (total)
        *total = len;
    return s;
}

static void date_is_imf_fixdate_and_cached_per_second(void **state)
{
    (void)state;
    struct shmipc__http_date d;
    shmipc__http_date_init(&d, FIXED_TIME);
    assert_string_equal(d.line, "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n");
    assert_int_equal(strlen(d.line), SHMIPC__HTTP_DATE_LINE_LEN);
    assert_memory_equal(shmipc__http_date_text(&d), "Sun, 06 Nov 1994 08:49:37 GMT",
                        SHMIPC__HTTP_DATE_LEN);
    assert_int_equal(shmipc__http_date_refresh(&d, FIXED_TIME), 0);
    assert_int_equal(shmipc__http_date_refresh(&d, FIXED_TIME + 1), 1);
    assert_string_equal(d.line, "Date: Sun, 06 Nov 1994 08:49:38 GMT\r\n");
    assert_int_equal(shmipc__http_date_refresh(&d, FIXED_TIME + 1), 0);
    shmipc__http_date_init(&d, 0);
    assert_string_equal(d.line, "Date: Thu, 01 Jan 1970 00:00:00 GMT\r\n");
    shmipc__http_date_init(&d, 951782400); /* a leap day */
    assert_string_equal(d.line, "Date: Tue, 29 Feb 2000 00:00:00 GMT\r\n");
    shmipc__http_date_init(&d, 4102444799); /* the last second of 2099 */
    assert_string_equal(d.line, "Date: Thu, 31 Dec 2099 23:59:59 GMT\r\n");
}

static void reason_phrases(void **state)
{
    (void)state;
    static const struct {
        int status;
        const char *reason;
    } cases[] = {
        {100, "Continue"},
        {200, "OK"},
        {204, "No Content"},
        {304, "Not Modified"},
        {400, "Bad Request"},
        {404, "Not Found"},
        {405, "Method Not Allowed"},
        {413, "Content Too Large"},
        {414, "URI Too Long"},
        {417, "Expectation Failed"},
        {431, "Request Header Fields Too Large"},
        {500, "Internal Server Error"},
        {501, "Not Implemented"},
        {505, "HTTP Version Not Supported"},
        {299, ""},
        {99, ""},
        {1000, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_string_equal(shmipc__http_reason(cases[i].status), cases[i].reason);
}

static void head_and_body_as_two_iovecs(void **state)
{
    (void)state;
    struct shmipc__http_date d;
    shmipc__http_date_init(&d, FIXED_TIME);
    struct shmipc__http_response r;
    shmipc__http_response_init(&r, NULL);
    static const struct shmipc__http_header_out extra[] = {
        {"X-A", "1", 3, 1},
        {"Cache-Control", "no-store", 13, 8},
    };
    r.content_type = "text/plain";
    r.headers = extra;
    r.nheaders = 2;
    r.body = "Hello, World!";
    r.body_len = 13;
    char head[256];
    struct iovec iov[2];
    assert_int_equal(shmipc__http_response_iov(&r, &d, "shmipc", head, sizeof head, iov), 2);
    assert_ptr_equal(iov[0].iov_base, head);
    assert_ptr_equal(iov[1].iov_base, r.body); /* referenced, not copied */
    char *s = flatten(iov, 2, NULL);
    assert_string_equal(s, "HTTP/1.1 200 OK\r\n"
                           "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
                           "Server: shmipc\r\n"
                           "Content-Type: text/plain\r\n"
                           "X-A: 1\r\n"
                           "Cache-Control: no-store\r\n"
                           "Content-Length: 13\r\n"
                           "\r\n"
                           "Hello, World!");
    free(s);
    /* The head alone, exactly sized buffers: one byte short is ENOSPC. */
    int n = shmipc__http_write_head(head, sizeof head, &r, &d, NULL);
    assert_true(n > 0);
    char *exact = malloc((size_t)n);
    assert_int_equal(shmipc__http_write_head(exact, (size_t)n, &r, &d, NULL), n);
    assert_int_equal(shmipc__http_write_head(exact, (size_t)n - 1, &r, &d, NULL), SHMIPC_ENOSPC);
    free(exact);
}

static void framing_by_status_method_and_version(void **state)
{
    (void)state;
    static const struct {
        uint16_t status;
        uint16_t flags;
        size_t body_len;
        int niov;
        const char *head;
    } cases[] = {
        {200, 0, 5, 2, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"},
        {200, 0, 0, 1, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"},
        {200, SHMIPC__HTTP_RESP_HEAD, 5, 1, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"},
        {200, SHMIPC__HTTP_RESP_CLOSE, 5, 2,
         "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\n"},
        {200, SHMIPC__HTTP_RESP_HTTP10, 5, 2,
         "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\n"},
        {200, SHMIPC__HTTP_RESP_HTTP10 | SHMIPC__HTTP_RESP_CLOSE, 5, 2,
         "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\n"},
        {200, SHMIPC__HTTP_RESP_STREAM, 0, 1,
         "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"},
        {200, SHMIPC__HTTP_RESP_STREAM | SHMIPC__HTTP_RESP_HTTP10, 0, 1,
         "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"},
        {204, 0, 5, 1, "HTTP/1.1 204 No Content\r\n\r\n"},
        {304, 0, 5, 1, "HTTP/1.1 304 Not Modified\r\n\r\n"},
        {101, 0, 0, 1, "HTTP/1.1 101 Switching Protocols\r\n\r\n"},
        {299, 0, 0, 1, "HTTP/1.1 299 \r\nContent-Length: 0\r\n\r\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct shmipc__http_response r;
        shmipc__http_response_init(&r, NULL);
        r.status = cases[i].status;
        r.flags = cases[i].flags;
        r.body = "hello";
        r.body_len = cases[i].body_len;
        char head[256];
        struct iovec iov[2];
        assert_int_equal(shmipc__http_response_iov(&r, NULL, NULL, head, sizeof head, iov),
                         cases[i].niov);
        assert_int_equal(iov[0].iov_len, strlen(cases[i].head));
        assert_memory_equal(iov[0].iov_base, cases[i].head, iov[0].iov_len);
    }
}

static void response_from_request_flags(void **state)
{
    (void)state;
    struct shmipc__http_request req;
    memset(&req, 0, sizeof req);
    struct shmipc__http_response r;
    req.minor = 1;
    req.flags = SHMIPC__HTTP_KEEP_ALIVE;
    shmipc__http_response_init(&r, &req);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.flags, 0);
    assert_false(shmipc__http_response_closes(&r));
    req.flags = SHMIPC__HTTP_IS_HEAD;
    shmipc__http_response_init(&r, &req);
    assert_int_equal(r.flags, SHMIPC__HTTP_RESP_HEAD | SHMIPC__HTTP_RESP_CLOSE);
    assert_true(shmipc__http_response_closes(&r));
    req.minor = 0;
    req.flags = SHMIPC__HTTP_KEEP_ALIVE;
    shmipc__http_response_init(&r, &req);
    assert_int_equal(r.flags, SHMIPC__HTTP_RESP_HTTP10);
    assert_false(shmipc__http_response_closes(&r));
    r.flags |= SHMIPC__HTTP_RESP_STREAM; /* HTTP/1.0 has no chunked: the close ends the body */
    assert_true(shmipc__http_response_closes(&r));
}

static void invalid_responses_are_refused(void **state)
{
    (void)state;
    char head[256];
    struct shmipc__http_response r;
    shmipc__http_response_init(&r, NULL);
    r.status = 99;
    assert_int_equal(shmipc__http_write_head(head, sizeof head, &r, NULL, NULL), SHMIPC_EINVAL);
    r.status = 1000;
    assert_int_equal(shmipc__http_write_head(head, sizeof head, &r, NULL, NULL), SHMIPC_EINVAL);
    r.status = 200;
    struct shmipc__http_header_out h = {"X", "a\r\nSet-Cookie: x", 1, 16};
    r.headers = &h;
    r.nheaders = 1;
    assert_int_equal(shmipc__http_write_head(head, sizeof head, &r, NULL, NULL), SHMIPC_EINVAL);
    assert_non_null(strstr(shmipc_error_detail(), "header 0"));
    h.value_len = 1;
    h.name = "X Y";
    h.name_len = 3;
    assert_int_equal(shmipc__http_write_head(head, sizeof head, &r, NULL, NULL), SHMIPC_EINVAL);
    h.name = "";
    h.name_len = 0;
    assert_int_equal(shmipc__http_write_head(head, sizeof head, &r, NULL, NULL), SHMIPC_EINVAL);
    r.nheaders = 0;
    r.content_type = "text/html\n";
    assert_int_equal(shmipc__http_write_head(head, sizeof head, &r, NULL, NULL), SHMIPC_EINVAL);
    r.content_type = NULL;
    assert_true(shmipc__http_write_head(head, sizeof head, &r, NULL, "shmipc/0.1 (test)") > 0);
    assert_int_equal(shmipc__http_write_head(head, sizeof head, &r, NULL, "a\x01"), SHMIPC_EINVAL);
}

static void canned_errors(void **state)
{
    (void)state;
    static const int codes[] = {400, 404, 405, 413, 414, 417, 431, 500, 501, 505};
    struct shmipc__http_date d;
    shmipc__http_date_init(&d, FIXED_TIME);
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        struct iovec iov[4];
        char arena[512];
        struct shmipc__http_batch b;
        shmipc__http_batch_init(&b, iov, 4, arena, sizeof arena, &d);
        assert_int_equal(shmipc__http_batch_add_error(&b, codes[i]), 0);
        char *got = flatten(iov, b.niov, NULL);
        char body[64], want[512];
        snprintf(body, sizeof body, "%d %s\n", codes[i], shmipc__http_reason(codes[i]));
        snprintf(want, sizeof want,
                 "HTTP/1.1 %d %s\r\n"
                 "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
                 "Content-Type: text/plain; charset=utf-8\r\n"
                 "Content-Length: %zu\r\n"
                 "Connection: close\r\n"
                 "\r\n%s",
                 codes[i], shmipc__http_reason(codes[i]), strlen(body), body);
        assert_string_equal(got, want);
        free(got);
    }
    /* HTTP10 and HEAD are kept; a code without a phrase gets an empty body. */
    struct shmipc__http_response r;
    memset(&r, 0, sizeof r);
    r.flags = SHMIPC__HTTP_RESP_HTTP10 | SHMIPC__HTTP_RESP_HEAD;
    shmipc__http_response_error(&r, 499);
    assert_int_equal(r.flags,
                     SHMIPC__HTTP_RESP_HTTP10 | SHMIPC__HTTP_RESP_HEAD | SHMIPC__HTTP_RESP_CLOSE);
    assert_int_equal(r.body_len, 0);
}

static void chunk_heads(void **state)
{
    (void)state;
    char out[SHMIPC__HTTP_CHUNK_HEAD_MAX];
    assert_int_equal(shmipc__http_chunk_head(out, 1), 3);
    assert_memory_equal(out, "1\r\n", 3);
    assert_int_equal(shmipc__http_chunk_head(out, 0x1000), 6);
    assert_memory_equal(out, "1000\r\n", 6);
    assert_int_equal(shmipc__http_chunk_head(out, 0xabcdef), 8);
    assert_memory_equal(out, "abcdef\r\n", 8);
    assert_int_equal(shmipc__http_chunk_head(out, UINT64_MAX), 18);
    assert_memory_equal(out, "ffffffffffffffff\r\n", 18);
}

static void streamed_bodies(void **state)
{
    (void)state;
    struct iovec iov[16];
    char arena[1024];
    struct shmipc__http_batch b;
    shmipc__http_batch_init(&b, iov, 16, arena, sizeof arena, NULL);
    b.copy_max = 4;
    struct shmipc__http_response r;
    shmipc__http_response_init(&r, NULL);
    r.flags = SHMIPC__HTTP_RESP_STREAM;
    assert_int_equal(shmipc__http_batch_add(&b, &r), 0);
    assert_int_equal(shmipc__http_batch_add_chunk(&b, &r, "abc", 3), 0); /* copied */
    assert_int_equal(shmipc__http_batch_add_chunk(&b, &r, "", 0), 0);    /* nothing */
    static const char big[] = "0123456789abcdef0123";
    assert_int_equal(shmipc__http_batch_add_chunk(&b, &r, big, 20), 0); /* referenced */
    assert_int_equal(shmipc__http_batch_add_last_chunk(&b, &r), 0);
    size_t total;
    char *got = flatten(iov, b.niov, &total);
    assert_string_equal(got, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                             "3\r\nabc\r\n14\r\n0123456789abcdef0123\r\n0\r\n\r\n");
    assert_int_equal(total, b.bytes);
    /* Arena runs merge: head + copied chunk + next chunk head are one iovec, then the big
     * data, then its CRLF and the last chunk. */
    assert_int_equal(b.niov, 3);
    assert_ptr_equal(iov[1].iov_base, big);
    free(got);

    /* HTTP/1.0: raw bytes, no last chunk, and the connection closes. */
    shmipc__http_batch_reset(&b);
    r.flags = SHMIPC__HTTP_RESP_STREAM | SHMIPC__HTTP_RESP_HTTP10;
    assert_int_equal(shmipc__http_batch_add(&b, &r), 0);
    assert_int_equal(shmipc__http_batch_add_chunk(&b, &r, "abc", 3), 0);
    assert_int_equal(shmipc__http_batch_add_chunk(&b, &r, big, 20), 0);
    assert_int_equal(shmipc__http_batch_add_last_chunk(&b, &r), 0);
    got = flatten(iov, b.niov, NULL);
    assert_string_equal(got, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
                             "abc0123456789abcdef0123");
    free(got);

    /* HEAD: the head only. */
    shmipc__http_batch_reset(&b);
    r.flags = SHMIPC__HTTP_RESP_STREAM | SHMIPC__HTTP_RESP_HEAD;
    assert_int_equal(shmipc__http_batch_add(&b, &r), 0);
    assert_int_equal(shmipc__http_batch_add_chunk(&b, &r, "abc", 3), 0);
    assert_int_equal(shmipc__http_batch_add_last_chunk(&b, &r), 0);
    got = flatten(iov, b.niov, NULL);
    assert_string_equal(got, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
    free(got);
}

/* Pipelined responses: small bodies copied, heads merged, a 1 MiB body referenced. */
static void batch_of_pipelined_responses(void **state)
{
    (void)state;
    struct shmipc__http_date d;
    shmipc__http_date_init(&d, FIXED_TIME);
    struct iovec iov[8];
    char arena[2048];
    struct shmipc__http_batch b;
    shmipc__http_batch_init(&b, iov, 8, arena, sizeof arena, &d);
    size_t big_len = 1u << 20;
    char *big = malloc(big_len);
    memset(big, 'x', big_len);
    struct shmipc__http_response r;
    shmipc__http_response_init(&r, NULL);
    r.body = "Hello, World!";
    r.body_len = 13;
    assert_int_equal(shmipc__http_batch_add(&b, &r), 0);
    assert_int_equal(shmipc__http_batch_add(&b, &r), 0);
    assert_int_equal(b.niov, 1); /* two responses, one contiguous run */
    r.body = big;
    r.body_len = big_len;
    assert_int_equal(shmipc__http_batch_add(&b, &r), 0);
    assert_int_equal(b.niov, 2); /* its head joined the run; the body is referenced */
    assert_ptr_equal(iov[1].iov_base, big);
    assert_int_equal(iov[1].iov_len, big_len);
    r.flags = SHMIPC__HTTP_RESP_HEAD;
    assert_int_equal(shmipc__http_batch_add(&b, &r), 0);
    assert_int_equal(shmipc__http_batch_add_continue(&b), 0);
    assert_int_equal(b.niov, 3);
    size_t total;
    char *got = flatten(iov, b.niov, &total);
    assert_int_equal(total, b.bytes);
    static const char one[] = "HTTP/1.1 200 OK\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
                              "Content-Length: 13\r\n\r\nHello, World!";
    assert_memory_equal(got, one, sizeof one - 1);
    assert_memory_equal(got + sizeof one - 1, one, sizeof one - 1);
    static const char head_big[] = "HTTP/1.1 200 OK\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
                                   "Content-Length: 1048576\r\n\r\n";
    size_t k = 2 * (sizeof one - 1);
    assert_memory_equal(got + k, head_big, sizeof head_big - 1);
    k += sizeof head_big - 1 + big_len;
    assert_string_equal(got + k, "HTTP/1.1 200 OK\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
                                 "Content-Length: 1048576\r\n\r\n"
                                 "HTTP/1.1 100 Continue\r\n\r\n");
    free(got);
    free(big);
}

static void full_batches_are_left_unchanged(void **state)
{
    (void)state;
    struct iovec iov[2];
    char arena[64];
    struct shmipc__http_batch b;
    shmipc__http_batch_init(&b, iov, 2, arena, sizeof arena, NULL);
    b.copy_max = 0;
    struct shmipc__http_response r;
    shmipc__http_response_init(&r, NULL);
    r.body = "hello";
    r.body_len = 5;
    assert_int_equal(shmipc__http_batch_add(&b, &r), 0); /* head + body: 2 iovecs */
    size_t used = b.used, bytes = b.bytes;
    assert_int_equal(shmipc__http_batch_add(&b, &r), SHMIPC_ENOSPC);
    assert_int_equal(shmipc__http_batch_add_continue(&b), SHMIPC_ENOSPC);
    assert_int_equal(b.niov, 2);
    assert_int_equal(b.used, used);
    assert_int_equal(b.bytes, bytes);
    shmipc__http_batch_reset(&b);
    assert_int_equal(b.niov, 0);
    assert_int_equal(b.used, 0);
    /* An arena too small for the head. */
    struct shmipc__http_header_out h = {"X-Long", "0123456789012345678901234567890123456789", 6,
                                        40};
    r.headers = &h;
    r.nheaders = 1;
    assert_int_equal(shmipc__http_batch_add(&b, &r), SHMIPC_ENOSPC);
    assert_int_equal(b.niov, 0);
    assert_int_equal(b.used, 0);
    /* A chunk whose framing does not fit. */
    r.nheaders = 0;
    r.flags = SHMIPC__HTTP_RESP_STREAM;
    r.body_len = 0;
    assert_int_equal(shmipc__http_batch_add(&b, &r), 0);
    assert_int_equal(shmipc__http_batch_add_chunk(&b, &r, "abcdef", 6), SHMIPC_ENOSPC);
    assert_int_equal(b.niov, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(date_is_imf_fixdate_and_cached_per_second),
        cmocka_unit_test(reason_phrases),
        cmocka_unit_test(head_and_body_as_two_iovecs),
        cmocka_unit_test(framing_by_status_method_and_version),
        cmocka_unit_test(response_from_request_flags),
        cmocka_unit_test(invalid_responses_are_refused),
        cmocka_unit_test(canned_errors),
        cmocka_unit_test(chunk_heads),
        cmocka_unit_test(streamed_bodies),
        cmocka_unit_test(batch_of_pipelined_responses),
        cmocka_unit_test(full_batches_are_left_unchanged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
