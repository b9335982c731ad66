/* Description: the error model: every code has a name and a message, details are per thread. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "shmipc.h"
#include "common/error.h"

static const struct {
    int code;
    const char *name;
} all_codes[] = {
#define ROW(name, value, msg) {SHMIPC_##name, "SHMIPC_" #name},
    SHMIPC_ERRNO_MAP(ROW)
#undef ROW
};
#define NCODES (sizeof all_codes / sizeof all_codes[0])

static void every_code_is_negative_named_and_described(void **state)
{
    (void)state;
    for (size_t i = 0; i < NCODES; i++) {
        assert_true(all_codes[i].code < 0);
        assert_string_equal(shmipc_errname(all_codes[i].code), all_codes[i].name);
        assert_string_not_equal(shmipc_strerror(all_codes[i].code), "unknown error");
    }
}

static void codes_are_distinct(void **state)
{
    (void)state;
    for (size_t i = 0; i < NCODES; i++)
        for (size_t j = i + 1; j < NCODES; j++)
            assert_int_not_equal(all_codes[i].code, all_codes[j].code);
}

static void posix_codes_are_negated_errno(void **state)
{
    (void)state;
    assert_int_equal(SHMIPC_EINVAL, -EINVAL);
    assert_int_equal(SHMIPC_ETIMEDOUT, -ETIMEDOUT);
    assert_int_equal(SHMIPC_ECONNRESET, -ECONNRESET);
    assert_int_equal(SHMIPC_EAGAIN, -EAGAIN);
    assert_int_equal(SHMIPC_EPROTO, -EPROTO);
    assert_true(SHMIPC_ECLOSED <= -4000);
}

static void unknown_codes(void **state)
{
    (void)state;
    assert_null(shmipc_errname(0));
    assert_null(shmipc_errname(1));
    assert_null(shmipc_errname(-3999));
    assert_string_equal(shmipc_strerror(12345), "unknown error");
    assert_string_equal(shmipc_strerror(0), "unknown error");
}

static void errno_mapping(void **state)
{
    (void)state;
    assert_int_equal(shmipc__code_from_errno(EINVAL), SHMIPC_EINVAL);
    assert_int_equal(shmipc__code_from_errno(EPIPE), SHMIPC_ECONNRESET);
    assert_int_equal(shmipc__code_from_errno(EPERM), SHMIPC_EACCES);
    assert_int_equal(shmipc__code_from_errno(ENFILE), SHMIPC_EMFILE);
    assert_int_equal(shmipc__code_from_errno(EXDEV), SHMIPC_EIO);
}

static void fail_records_detail(void **state)
{
    (void)state;
    assert_int_equal(shmipc__fail(SHMIPC_EPROTO, "header: magic %#x", 0x1234), SHMIPC_EPROTO);
    assert_string_equal(shmipc_error_detail(), "header: magic 0x1234");
    assert_int_equal(shmipc__fail_errno(ENOENT, "open %s", "/x"), SHMIPC_ENOENT);
    assert_string_equal(shmipc_error_detail(), "open /x: No such file or directory");
}

static void *other_thread(void *arg)
{
    (void)arg;
    /* A fresh thread has seen no failure, whatever the main thread recorded. */
    return (void *)(uintptr_t)(shmipc_error_detail()[0] == '\0');
}

static void detail_is_per_thread(void **state)
{
    (void)state;
    pthread_t t;
    void *fresh = NULL;
    shmipc__fail(SHMIPC_EINVAL, "main thread detail");
    assert_int_equal(pthread_create(&t, NULL, other_thread, NULL), 0);
    assert_int_equal(pthread_join(t, &fresh), 0);
    assert_true((uintptr_t)fresh);
    assert_string_equal(shmipc_error_detail(), "main thread detail");
}

static void long_detail_is_truncated_not_overflowed(void **state)
{
    (void)state;
    char big[2000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    shmipc__fail(SHMIPC_EINVAL, "%s", big);
    assert_true(strlen(shmipc_error_detail()) < sizeof big);
    assert_true(strlen(shmipc_error_detail()) > 100);
}

/* The copy that replaces vsnprintf for a message without conversions: whole, and bounded. */
#define Y10  "yyyyyyyyyy"
#define Y100 Y10 Y10 Y10 Y10 Y10 Y10 Y10 Y10 Y10 Y10
static void constant_detail_is_copied_whole_and_bounded(void **state)
{
    (void)state;
    assert_int_equal(shmipc__fail(SHMIPC_ETIMEDOUT, "accept_stream: no new stream"),
                     SHMIPC_ETIMEDOUT);
    assert_string_equal(shmipc_error_detail(), "accept_stream: no new stream");
    /* "%%" is a conversion: still formatted. */
    shmipc__fail(SHMIPC_EINVAL, "100%% full");
    assert_string_equal(shmipc_error_detail(), "100% full");
    shmipc__fail(SHMIPC_EINVAL, "x");
    assert_string_equal(shmipc_error_detail(), "x");
    /* 600 bytes: longer than the detail buffer, cut to it as vsnprintf would. */
    shmipc__fail(SHMIPC_EINVAL, Y100 Y100 Y100 Y100 Y100 Y100);
    size_t n = strlen(shmipc_error_detail());
    assert_true(n > 100 && n < 600);
    assert_true(strspn(shmipc_error_detail(), "y") == n);
}

/* The stream detail written without vsnprintf (an event loop's non-blocking read finds "no
 * data yet" once per message): the same text as "stream %u: %s" gives, for every id width. */
static void stream_detail_is_what_printf_gives(void **state)
{
    (void)state;
    static const uint32_t ids[] = {0, 1, 9, 10, 99, 100, 4096, 65535, 1000000000, 4294967295u};
    char want[600];
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        assert_int_equal(shmipc__fail_stream(SHMIPC_EAGAIN, ids[i], "no data yet"), SHMIPC_EAGAIN);
        snprintf(want, sizeof want, "stream %u: no data yet", ids[i]);
        assert_string_equal(shmipc_error_detail(), want);
    }
    /* Bounded as vsnprintf is: a message longer than the buffer is cut, not overflowed. */
    shmipc__fail_stream(SHMIPC_EINVAL, 4294967295u, Y100 Y100 Y100 Y100 Y100 Y100);
    size_t n = strlen(shmipc_error_detail());
    assert_int_equal(n, 511); /* the buffer, less its NUL */
    assert_memory_equal(shmipc_error_detail(), "stream 4294967295: yyy", 22);
    assert_true(strspn(shmipc_error_detail() + 19, "y") == n - 19);
    shmipc__fail_stream(SHMIPC_EINVAL, 7, "");
    assert_string_equal(shmipc_error_detail(), "stream 7: ");
}

static void version(void **state)
{
    (void)state;
    char expect[32];
    assert_int_equal(shmipc_version(), SHMIPC_VERSION_HEX);
    snprintf(expect, sizeof expect, "%d.%d.%d", SHMIPC_VERSION_MAJOR, SHMIPC_VERSION_MINOR,
             SHMIPC_VERSION_PATCH);
    assert_string_equal(shmipc_version_string(), expect);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_code_is_negative_named_and_described),
        cmocka_unit_test(codes_are_distinct),
        cmocka_unit_test(posix_codes_are_negated_errno),
        cmocka_unit_test(unknown_codes),
        cmocka_unit_test(errno_mapping),
        cmocka_unit_test(fail_records_detail),
        cmocka_unit_test(detail_is_per_thread),
        cmocka_unit_test(long_detail_is_truncated_not_overflowed),
        cmocka_unit_test(constant_detail_is_copied_whole_and_bounded),
        cmocka_unit_test(stream_detail_is_what_printf_gives),
        cmocka_unit_test(version),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
