/* Description: the config builder: defaults, every setter's good and bad values, details. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <limits.h>
#include <string.h>

#include "shmipc.h"
#include "ipc/config.h"

/* This file calls the deprecated functions on purpose: their old meaning is part of the ABI
 * until they go (CHANGELOG.md). */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

static int setup(void **state)
{
    shmipc_config *cfg = NULL;
    if (shmipc_config_new(&cfg) != 0)
        return -1;
    *state = cfg;
    return 0;
}

static int teardown(void **state)
{
    shmipc_config_free(*state);
    return 0;
}

/* Asserts that `rc` is `code` and that the detail mentions `field`. */
#define assert_refused(rc, code, field)                                                            \
    do {                                                                                           \
        assert_int_equal((rc), (code));                                                            \
        assert_non_null(strstr(shmipc_error_detail(), (field)));                                   \
    } while (0)

static void defaults_match_reference(void **state)
{
    shmipc_config *cfg = *state;
    shmipc_slice_class c[4];
    assert_int_equal(shmipc_config_get_memmap_type(cfg), SHMIPC_MEMMAP_MEMFD);
    assert_int_equal(shmipc_config_get_buffer_capacity(cfg), 32u << 20);
    assert_int_equal(shmipc_config_get_queue_capacity(cfg), 8192);
    assert_string_equal(shmipc_config_get_path_prefix(cfg), "/dev/shm/shmipc");
    assert_int_equal(shmipc_config_get_slice_classes(cfg, c, 4), 3);
    assert_int_equal(c[0].size, 8172);
    assert_int_equal(c[0].percent, 50);
    assert_int_equal(c[1].size, 32748);
    assert_int_equal(c[1].percent, 30);
    assert_int_equal(c[2].size, 131052);
    assert_int_equal(c[2].percent, 20);
    assert_int_equal(shmipc_config_get_timeout_ms(cfg, SHMIPC_TIMEOUT_INITIALIZE), 1000);
    assert_int_equal(shmipc_config_get_timeout_ms(cfg, SHMIPC_TIMEOUT_CONNECTION_WRITE), 10000);
    assert_int_equal(shmipc_config_get_timeout_ms(cfg, SHMIPC_TIMEOUT_READ), 0);
    assert_int_equal(shmipc_config_get_timeout_ms(cfg, SHMIPC_TIMEOUT_WRITE), 0);
    assert_int_equal(shmipc_config_get_protocol(cfg), SHMIPC_PROTOCOL_LEGACY);
    assert_int_equal(shmipc_config_get_fallback(cfg), 0);
    assert_int_equal(shmipc_config_get_wakeup(cfg), SHMIPC_WAKEUP_SOCKET);
    assert_int_equal(shmipc_config_validate(cfg), 0);
}

static void default_layout_matches_go_dump(void **state)
{
    /* Reference §2.5: a 32 MiB Go buffer holds 2047, 307 and 51 slices. */
    shmipc_config *cfg = *state;
    assert_int_equal(shmipc__slices_per_class(cfg->buffer_capacity, 3, cfg->classes[0]), 2047);
    assert_int_equal(shmipc__slices_per_class(cfg->buffer_capacity, 3, cfg->classes[1]), 307);
    assert_int_equal(shmipc__slices_per_class(cfg->buffer_capacity, 3, cfg->classes[2]), 51);
}

static void buffer_capacity(void **state)
{
    shmipc_config *cfg = *state;
    assert_int_equal(shmipc_config_set_buffer_capacity(cfg, 1u << 30), 0);
    assert_int_equal(shmipc_config_get_buffer_capacity(cfg), 1u << 30);
    assert_refused(shmipc_config_set_buffer_capacity(cfg, (1u << 20) - 1), SHMIPC_EINVAL,
                   "buffer_capacity");
    assert_refused(shmipc_config_set_buffer_capacity(cfg, 0), SHMIPC_EINVAL, "buffer_capacity");
    assert_refused(shmipc_config_set_buffer_capacity(cfg, 1ull << 32), SHMIPC_EINVAL,
                   "buffer_capacity");
    assert_int_equal(shmipc_config_get_buffer_capacity(cfg), 1u << 30);
    /* 1 MiB holds the default classes, 20 % of it still fits one 128 KiB slice. */
    assert_int_equal(shmipc_config_set_buffer_capacity(cfg, 1u << 20), 0);
}

static void buffer_capacity_must_hold_every_class(void **state)
{
    shmipc_config *cfg = *state;
    shmipc_slice_class big[] = {{4096, 50}, {600000, 50}};
    assert_int_equal(shmipc_config_set_buffer_capacity(cfg, 4u << 20), 0);
    assert_int_equal(shmipc_config_set_slice_classes(cfg, big, 2), 0);
    /* At 1 MiB, half the region cannot hold one 600000-byte slice. */
    assert_refused(shmipc_config_set_buffer_capacity(cfg, 1u << 20), SHMIPC_EINVAL,
                   "buffer_capacity");
    assert_int_equal(shmipc_config_get_buffer_capacity(cfg), 4u << 20);
}

static void queue_capacity(void **state)
{
    shmipc_config *cfg = *state;
    static const uint32_t good[] = {1, 16, 64, 1024, 8192, 65535, 65536, 1u << 24};
    static const uint32_t split[] = {8, 24, 2, 18, 65544};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        assert_int_equal(shmipc_config_set_queue_capacity(cfg, good[i]), 0);
        assert_int_equal(shmipc_config_get_queue_capacity(cfg), good[i]);
    }
    assert_refused(shmipc_config_set_queue_capacity(cfg, 0), SHMIPC_EINVAL, "queue_capacity");
    assert_refused(shmipc_config_set_queue_capacity(cfg, (1u << 24) + 16), SHMIPC_EINVAL,
                   "queue_capacity");
    for (size_t i = 0; i < sizeof split / sizeof split[0]; i++)
        assert_refused(shmipc_config_set_queue_capacity(cfg, split[i]), SHMIPC_EINVAL,
                       "split lock");
    assert_int_equal(shmipc_config_get_queue_capacity(cfg), 1u << 24);
}

static void slice_classes_sorted_and_checked(void **state)
{
    shmipc_config *cfg = *state;
    shmipc_slice_class desc[] = {{16364, 40}, {4076, 60}};
    shmipc_slice_class got[2];
    assert_int_equal(shmipc_config_set_buffer_capacity(cfg, 1u << 20), 0);
    assert_int_equal(shmipc_config_set_slice_classes(cfg, desc, 2), 0);
    assert_int_equal(shmipc_config_get_slice_classes(cfg, got, 2), 2);
    assert_int_equal(got[0].size, 4076);
    assert_int_equal(got[0].percent, 60);
    assert_int_equal(got[1].size, 16364);
    /* The counts of the captured layout-small-1m vector. */
    assert_int_equal(shmipc__slices_per_class(1u << 20, 2, got[0]), 153);
    assert_int_equal(shmipc__slices_per_class(1u << 20, 2, got[1]), 25);
    assert_int_equal(shmipc_config_get_slice_classes(cfg, NULL, 0), 2);
}

static void slice_classes_refused(void **state)
{
    shmipc_config *cfg = *state;
    shmipc_slice_class sum90[] = {{4096, 40}, {8192, 50}};
    shmipc_slice_class sum110[] = {{4096, 60}, {8192, 50}};
    shmipc_slice_class zero_size[] = {{0, 100}};
    shmipc_slice_class odd_size[] = {{4097, 100}};
    shmipc_slice_class zero_pct[] = {{4096, 0}, {8192, 100}};
    shmipc_slice_class dup[] = {{4096, 50}, {4096, 50}};
    shmipc_slice_class too_big[] = {{(32u << 20) + 4, 100}};
    shmipc_slice_class many[SHMIPC_MAX_SLICE_CLASSES + 1];
    for (size_t i = 0; i < SHMIPC_MAX_SLICE_CLASSES + 1; i++)
        many[i] = (shmipc_slice_class){(uint32_t)(64 + i), 1};
    assert_refused(shmipc_config_set_slice_classes(cfg, sum90, 2), SHMIPC_EINVAL, "sum to 90");
    assert_refused(shmipc_config_set_slice_classes(cfg, sum110, 2), SHMIPC_EINVAL, "sum to 110");
    assert_refused(shmipc_config_set_slice_classes(cfg, zero_size, 1), SHMIPC_EINVAL, "size 0");
    assert_refused(shmipc_config_set_slice_classes(cfg, odd_size, 1), SHMIPC_EINVAL,
                   "multiple of 4");
    assert_refused(shmipc_config_set_slice_classes(cfg, zero_pct, 2), SHMIPC_EINVAL, "percent 0");
    assert_refused(shmipc_config_set_slice_classes(cfg, dup, 2), SHMIPC_EINVAL, "twice");
    assert_refused(shmipc_config_set_slice_classes(cfg, too_big, 1), SHMIPC_EINVAL,
                   "larger than buffer_capacity");
    assert_refused(shmipc_config_set_slice_classes(cfg, many, SHMIPC_MAX_SLICE_CLASSES + 1),
                   SHMIPC_EINVAL, "slice_classes");
    assert_refused(shmipc_config_set_slice_classes(cfg, NULL, 1), SHMIPC_EINVAL, "slice_classes");
    assert_refused(shmipc_config_set_slice_classes(cfg, sum90, 0), SHMIPC_EINVAL, "slice_classes");
    assert_int_equal(cfg->nclasses, 3);
    assert_int_equal(cfg->classes[0].size, 8172);
}

static void slice_class_with_one_slice_is_allowed(void **state)
{
    /* The exchange-fallback vector: 1 MiB with one 524268-byte class, a single slice. */
    shmipc_config *cfg = *state;
    assert_int_equal(shmipc_config_set_buffer_capacity(cfg, 1u << 20), 0);
    assert_int_equal(shmipc_config_parse_slice_classes(cfg, "524268:100"), 0);
    assert_int_equal(shmipc__slices_per_class(1u << 20, 1, cfg->classes[0]), 1);
}

static void parse_slice_classes(void **state)
{
    shmipc_config *cfg = *state;
    shmipc_slice_class got[3];
    assert_int_equal(shmipc_config_parse_slice_classes(cfg, " 131052:20, 8172 : 50,32748:30"), 0);
    assert_int_equal(shmipc_config_get_slice_classes(cfg, got, 3), 3);
    assert_int_equal(got[0].size, 8172);
    assert_int_equal(got[2].size, 131052);
    static const char *bad[] = {"",          "4096",     "4096:",           ":100",
                                "4096:100,", "4096;100", "4096:100 8192:0", "99999999999:100",
                                "-1:100",    "4096:1e2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_refused(shmipc_config_parse_slice_classes(cfg, bad[i]), SHMIPC_EINVAL,
                       "slice_classes");
    assert_refused(shmipc_config_parse_slice_classes(cfg, NULL), SHMIPC_EINVAL, "slice_classes");
    assert_int_equal(shmipc_config_get_slice_classes(cfg, got, 3), 3);
}

static void memmap_type(void **state)
{
    shmipc_config *cfg = *state;
    assert_int_equal(shmipc_config_set_memmap_type(cfg, SHMIPC_MEMMAP_DEVSHM), 0);
    assert_int_equal(shmipc_config_get_memmap_type(cfg), SHMIPC_MEMMAP_DEVSHM);
    assert_refused(shmipc_config_set_memmap_type(cfg, 2), SHMIPC_EINVAL, "memmap_type");
    assert_refused(shmipc_config_set_memmap_type(cfg, -1), SHMIPC_EINVAL, "memmap_type");
    assert_int_equal(shmipc_config_get_memmap_type(cfg), SHMIPC_MEMMAP_DEVSHM);
}

static void path_prefix(void **state)
{
    shmipc_config *cfg = *state;
    char long_prefix[SHMIPC_MAX_PATH_PREFIX + 2];
    memset(long_prefix, 'a', sizeof long_prefix - 1);
    long_prefix[0] = '/';
    long_prefix[sizeof long_prefix - 1] = '\0';
    assert_int_equal(shmipc_config_set_path_prefix(cfg, "/dev/shm/myapp"), 0);
    assert_string_equal(shmipc_config_get_path_prefix(cfg), "/dev/shm/myapp");
    assert_refused(shmipc_config_set_path_prefix(cfg, ""), SHMIPC_EINVAL, "path_prefix");
    assert_refused(shmipc_config_set_path_prefix(cfg, NULL), SHMIPC_EINVAL, "path_prefix");
    assert_refused(shmipc_config_set_path_prefix(cfg, "a\nb"), SHMIPC_EINVAL, "path_prefix");
    assert_refused(shmipc_config_set_path_prefix(cfg, long_prefix), SHMIPC_ENAMETOOLONG,
                   "path_prefix");
    long_prefix[SHMIPC_MAX_PATH_PREFIX] = '\0';
    assert_int_equal(shmipc_config_set_path_prefix(cfg, long_prefix), 0);
    /* memfd names are labels, so a relative prefix is fine there but not with files. */
    assert_int_equal(shmipc_config_set_path_prefix(cfg, "label"), 0);
    assert_refused(shmipc_config_set_memmap_type(cfg, SHMIPC_MEMMAP_DEVSHM), SHMIPC_EINVAL,
                   "path_prefix");
    assert_int_equal(shmipc_config_set_path_prefix(cfg, "/dev/shm/x"), 0);
    assert_int_equal(shmipc_config_set_memmap_type(cfg, SHMIPC_MEMMAP_DEVSHM), 0);
    assert_refused(shmipc_config_set_path_prefix(cfg, "label"), SHMIPC_EINVAL, "absolute");
    assert_string_equal(shmipc_config_get_path_prefix(cfg), "/dev/shm/x");
}

static void timeouts(void **state)
{
    shmipc_config *cfg = *state;
    assert_int_equal(shmipc_config_set_timeout_ms(cfg, SHMIPC_TIMEOUT_READ, 1500), 0);
    assert_int_equal(shmipc_config_get_timeout_ms(cfg, SHMIPC_TIMEOUT_READ), 1500);
    assert_int_equal(shmipc_config_set_timeout_ms(cfg, SHMIPC_TIMEOUT_WRITE, 0), 0);
    assert_int_equal(shmipc_config_set_timeout_ms(cfg, SHMIPC_TIMEOUT_WRITE, UINT32_MAX), 0);
    assert_int_equal(shmipc_config_set_timeout_ms(cfg, SHMIPC_TIMEOUT_INITIALIZE, 50), 0);
    assert_refused(shmipc_config_set_timeout_ms(cfg, SHMIPC_TIMEOUT_INITIALIZE, 0), SHMIPC_EINVAL,
                   "initialize_timeout");
    assert_refused(shmipc_config_set_timeout_ms(cfg, SHMIPC_TIMEOUT_CONNECTION_WRITE, 3600001),
                   SHMIPC_EINVAL, "connection_write_timeout");
    assert_refused(shmipc_config_set_timeout_ms(cfg, 4, 10), SHMIPC_EINVAL, "timeout");
    assert_refused(shmipc_config_set_timeout_ms(cfg, -1, 10), SHMIPC_EINVAL, "timeout");
    assert_int_equal(shmipc_config_get_timeout_ms(cfg, SHMIPC_TIMEOUT_INITIALIZE), 50);
    assert_int_equal(shmipc_config_get_timeout_ms(cfg, 9), -1);
}

/* The rule of every timeout: negative waits forever (any negative), 0 does not wait. */
static void timeouts_follow_one_rule(void **state)
{
    static const int forever[] = {-1, -2, INT_MIN};
    shmipc_config *cfg = *state;
    int v = 42;
    assert_int_equal(shmipc_config_get_timeout(cfg, SHMIPC_TIMEOUT_READ, &v), 0);
    assert_int_equal(v, SHMIPC_WAIT_FOREVER); /* the default */
    assert_int_equal(shmipc_config_get_timeout(cfg, SHMIPC_TIMEOUT_INITIALIZE, &v), 0);
    assert_int_equal(v, 1000);
    for (size_t i = 0; i < sizeof forever / sizeof forever[0]; i++) {
        for (int which = SHMIPC_TIMEOUT_INITIALIZE; which <= SHMIPC_TIMEOUT_WRITE; which++) {
            assert_int_equal(shmipc_config_set_timeout(cfg, which, forever[i]), 0);
            assert_int_equal(shmipc_config_get_timeout(cfg, which, &v), 0);
            assert_int_equal(v, SHMIPC_WAIT_FOREVER);
            assert_int_equal(shmipc_config_get_timeout_ms(cfg, which), 0); /* old: 0 = forever */
        }
    }
    /* 0: no wait for reads and writes; refused for the handshake ones. */
    assert_int_equal(shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_READ, 0), 0);
    assert_int_equal(shmipc_config_get_timeout(cfg, SHMIPC_TIMEOUT_READ, &v), 0);
    assert_int_equal(v, 0);
    assert_refused(shmipc_config_get_timeout_ms(cfg, SHMIPC_TIMEOUT_READ), -1, "do not wait");
    assert_int_equal(shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_WRITE, 1), 0);
    assert_int_equal(shmipc_config_get_timeout(cfg, SHMIPC_TIMEOUT_WRITE, &v), 0);
    assert_int_equal(v, 1);
    assert_int_equal(shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_WRITE, INT_MAX), 0);
    assert_refused(shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_INITIALIZE, 0), SHMIPC_EINVAL,
                   "cannot take no time");
    assert_refused(shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_CONNECTION_WRITE, 0),
                   SHMIPC_EINVAL, "connection_write_timeout");
    assert_refused(shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_INITIALIZE, 3600001),
                   SHMIPC_EINVAL, "initialize_timeout");
    assert_refused(shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_INITIALIZE, INT_MAX),
                   SHMIPC_EINVAL, "initialize_timeout");
    assert_int_equal(shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_INITIALIZE, 3600000), 0);
    assert_refused(shmipc_config_set_timeout(cfg, 4, 10), SHMIPC_EINVAL, "timeout");
    assert_refused(shmipc_config_set_timeout(cfg, -1, 10), SHMIPC_EINVAL, "timeout");
    assert_refused(shmipc_config_set_timeout(NULL, 0, 10), SHMIPC_EINVAL, "NULL");
    assert_refused(shmipc_config_get_timeout(cfg, 4, &v), SHMIPC_EINVAL, "timeout");
    assert_refused(shmipc_config_get_timeout(cfg, 0, NULL), SHMIPC_EINVAL, "NULL");
    assert_refused(shmipc_config_get_timeout(NULL, 0, &v), SHMIPC_EINVAL, "NULL");
    /* The deprecated setter keeps its meaning: 0 is forever, up to UINT32_MAX ms is taken. */
    assert_int_equal(shmipc_config_set_timeout_ms(cfg, SHMIPC_TIMEOUT_READ, 0), 0);
    assert_int_equal(shmipc_config_get_timeout(cfg, SHMIPC_TIMEOUT_READ, &v), 0);
    assert_int_equal(v, SHMIPC_WAIT_FOREVER);
    assert_int_equal(shmipc_config_set_timeout_ms(cfg, SHMIPC_TIMEOUT_READ, UINT32_MAX), 0);
    assert_int_equal(shmipc_config_get_timeout(cfg, SHMIPC_TIMEOUT_READ, &v), 0);
    assert_int_equal(v, INT_MAX);
    assert_int_equal(shmipc_config_get_timeout_ms(cfg, SHMIPC_TIMEOUT_READ), UINT32_MAX);
}

static void protocol_and_wakeup(void **state)
{
    shmipc_config *cfg = *state;
    assert_refused(shmipc_config_set_wakeup(cfg, SHMIPC_WAKEUP_EVENTFD, 0), SHMIPC_EINVAL,
                   "need protocol V4");
    assert_refused(shmipc_config_set_protocol(cfg, 3, 0), SHMIPC_EINVAL, "protocol");
    assert_refused(shmipc_config_set_protocol(cfg, SHMIPC_PROTOCOL_V4, 2), SHMIPC_EINVAL,
                   "fallback");
    assert_refused(shmipc_config_set_protocol(cfg, SHMIPC_PROTOCOL_LEGACY, 1), SHMIPC_EINVAL,
                   "fallback");
    assert_int_equal(shmipc_config_set_protocol(cfg, SHMIPC_PROTOCOL_V4, 0), 0);
    assert_int_equal(shmipc_config_get_fallback(cfg), 0);
    assert_int_equal(shmipc_config_set_wakeup(cfg, SHMIPC_WAKEUP_POLLING, 100), 0);
    assert_int_equal(shmipc_config_get_polling_interval_us(cfg), 100);
    assert_refused(shmipc_config_set_wakeup(cfg, SHMIPC_WAKEUP_POLLING, 0), SHMIPC_EINVAL,
                   "polling_interval_us");
    assert_refused(shmipc_config_set_wakeup(cfg, SHMIPC_WAKEUP_POLLING, 1000001), SHMIPC_EINVAL,
                   "polling_interval_us");
    assert_refused(shmipc_config_set_wakeup(cfg, SHMIPC_WAKEUP_EVENTFD, 5), SHMIPC_EINVAL,
                   "polling_interval_us");
    assert_refused(shmipc_config_set_wakeup(cfg, 7, 0), SHMIPC_EINVAL, "wakeup");
    assert_int_equal(shmipc_config_get_wakeup(cfg), SHMIPC_WAKEUP_POLLING);
    /* Going back to legacy drops the V4-only wakeup. */
    assert_int_equal(shmipc_config_set_protocol(cfg, SHMIPC_PROTOCOL_LEGACY, 0), 0);
    assert_int_equal(shmipc_config_get_wakeup(cfg), SHMIPC_WAKEUP_SOCKET);
    assert_int_equal(shmipc_config_get_polling_interval_us(cfg), 0);
}

static void eventfd_needs_memfd(void **state)
{
    shmipc_config *cfg = *state;
    assert_int_equal(shmipc_config_set_memmap_type(cfg, SHMIPC_MEMMAP_DEVSHM), 0);
    assert_int_equal(shmipc_config_set_protocol(cfg, SHMIPC_PROTOCOL_V4, 1), 0);
    assert_refused(shmipc_config_set_wakeup(cfg, SHMIPC_WAKEUP_EVENTFD, 0), SHMIPC_EINVAL, "memfd");
    /* The helper switches to memfd itself, as the Rust helper does. */
    assert_int_equal(shmipc_config_with_v4_eventfd(cfg), 0);
    assert_int_equal(shmipc_config_get_memmap_type(cfg), SHMIPC_MEMMAP_MEMFD);
    assert_refused(shmipc_config_set_memmap_type(cfg, SHMIPC_MEMMAP_DEVSHM), SHMIPC_EINVAL,
                   "eventfd");
}

static void v4_helpers(void **state)
{
    shmipc_config *cfg = *state;
    assert_int_equal(shmipc_config_with_v4(cfg), 0);
    assert_int_equal(shmipc_config_get_protocol(cfg), SHMIPC_PROTOCOL_V4);
    assert_int_equal(shmipc_config_get_fallback(cfg), 1);
    assert_int_equal(shmipc_config_get_wakeup(cfg), SHMIPC_WAKEUP_SOCKET);
    assert_int_equal(shmipc_config_with_v4_eventfd(cfg), 0);
    assert_int_equal(shmipc_config_get_wakeup(cfg), SHMIPC_WAKEUP_EVENTFD);
    assert_int_equal(shmipc_config_with_v4_event_queue_polling(cfg, 250), 0);
    assert_int_equal(shmipc_config_get_wakeup(cfg), SHMIPC_WAKEUP_POLLING);
    assert_int_equal(shmipc_config_get_polling_interval_us(cfg), 250);
    assert_refused(shmipc_config_with_v4_event_queue_polling(cfg, 0), SHMIPC_EINVAL,
                   "polling_interval_us");
    assert_int_equal(shmipc_config_get_polling_interval_us(cfg), 250);
    assert_int_equal(shmipc_config_validate(cfg), 0);
}

static void clone_is_independent(void **state)
{
    shmipc_config *cfg = *state, *copy = NULL;
    assert_int_equal(shmipc_config_set_queue_capacity(cfg, 1024), 0);
    assert_int_equal(shmipc_config_clone(cfg, &copy), 0);
    assert_int_equal(shmipc_config_set_queue_capacity(cfg, 64), 0);
    assert_int_equal(shmipc_config_get_queue_capacity(copy), 1024);
    shmipc_config_free(copy);
    assert_refused(shmipc_config_clone(NULL, &copy), SHMIPC_EINVAL, "config");
    assert_refused(shmipc_config_clone(cfg, NULL), SHMIPC_EINVAL, "out");
}

static void validate_catches_hand_edited_structs(void **state)
{
    shmipc_config *cfg = *state;
    cfg->classes[0].percent = 10;
    assert_refused(shmipc_config_validate(cfg), SHMIPC_EINVAL, "slice_classes");
    cfg->classes[0].percent = 50;
    cfg->buffer_capacity = 1000;
    assert_refused(shmipc_config_validate(cfg), SHMIPC_EINVAL, "buffer_capacity");
}

/* The spin cap: 0 never spins, 100000 µs the most, the default from SHMIPC_SPIN_US or 50. */
static void spin_us(void **state)
{
    shmipc_config *cfg = *state;
    if (getenv("SHMIPC_SPIN_US") == NULL)
        assert_int_equal(shmipc_config_get_spin_us(cfg), 50);
    assert_int_equal(shmipc_config_set_spin_us(cfg, 0), 0);
    assert_int_equal(shmipc_config_get_spin_us(cfg), 0);
    assert_int_equal(shmipc_config_set_spin_us(cfg, 100000), 0);
    assert_int_equal(shmipc_config_get_spin_us(cfg), 100000);
    assert_refused(shmipc_config_set_spin_us(cfg, 100001), SHMIPC_EINVAL, "spin_us");
    /* A negative number through the unsigned parameter is huge: refused too. */
    assert_refused(shmipc_config_set_spin_us(cfg, (uint32_t)-1), SHMIPC_EINVAL, "spin_us");
    assert_int_equal(shmipc_config_get_spin_us(cfg), 100000);
    shmipc_config *copy = NULL;
    assert_int_equal(shmipc_config_clone(cfg, &copy), 0);
    assert_int_equal(shmipc_config_get_spin_us(copy), 100000);
    shmipc_config_free(copy);
    assert_refused(shmipc_config_set_spin_us(NULL, 1), SHMIPC_EINVAL, "spin_us");
    assert_int_equal(shmipc_config_get_spin_us(NULL), 0);
}

static void null_config(void **state)
{
    (void)state;
    assert_refused(shmipc_config_new(NULL), SHMIPC_EINVAL, "out");
    assert_refused(shmipc_config_set_queue_capacity(NULL, 16), SHMIPC_EINVAL, "queue_capacity");
    assert_refused(shmipc_config_validate(NULL), SHMIPC_EINVAL, "config");
    assert_int_equal(shmipc_config_get_queue_capacity(NULL), 0);
    assert_null(shmipc_config_get_path_prefix(NULL));
    shmipc_config_free(NULL);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(defaults_match_reference),
        T(default_layout_matches_go_dump),
        T(buffer_capacity),
        T(buffer_capacity_must_hold_every_class),
        T(queue_capacity),
        T(slice_classes_sorted_and_checked),
        T(slice_classes_refused),
        T(slice_class_with_one_slice_is_allowed),
        T(parse_slice_classes),
        T(memmap_type),
        T(path_prefix),
        T(timeouts),
        T(timeouts_follow_one_rule),
        T(protocol_and_wakeup),
        T(eventfd_needs_memfd),
        T(v4_helpers),
        T(clone_is_independent),
        T(validate_catches_hand_edited_structs),
        T(spin_us),
        T(null_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
