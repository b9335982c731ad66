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

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
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

/* ---- Item 4: close or shutdown while another thread blocks ---- */

/* A thread blocked in accept_stream (forever) on a server session. */
struct blocked_accept {
    shmipc_session *s;
    pthread_t thread;
    int rc;
    int started;
};

static void *accept_main(void *arg)
{
    struct blocked_accept *b = arg;
    shmipc_stream *st = NULL;
    __atomic_store_n(&b->started, 1, __ATOMIC_RELEASE);
    b->rc = shmipc_session_accept_stream(b->s, SHMIPC_WAIT_FOREVER, &st);
    if (b->rc == 0)
        shmipc_stream_close(st);
    return NULL;
}

static void start_blocked_accept(struct blocked_accept *b, shmipc_session *s)
{
    memset(b, 0, sizeof *b);
    b->s = s;
    assert_int_equal(pthread_create(&b->thread, NULL, accept_main, b), 0);
    while (!__atomic_load_n(&b->started, __ATOMIC_ACQUIRE))
        sleep_ms(1);
    sleep_ms(2); /* into the wait, most of the time */
}

/*
 * Regression (issue 19.4): closing a session while another thread is blocked in accept_stream
 * freed the session under it (heap-use-after-free under ASan). The blocked call must wake with
 * SHMIPC_ECLOSED and the session be freed when it leaves.
 */
static void close_while_accept_blocks(void **state)
{
    (void)state;
    shmipc_config *cfg = small_config();
    for (int i = 0; i < 100; i++) {
        struct ipc_pair p;
        struct blocked_accept b;
        pair_open(&p, cfg);
        start_blocked_accept(&b, p.server);
        shmipc_session_close(p.server);
        pthread_join(b.thread, NULL);
        assert_int_equal(b.rc, SHMIPC_ECLOSED);
        shmipc_session_close(p.client);
        shmipc_listener_close(p.l);
    }
    shmipc_config_free(cfg);
}

/* Which wakeup the threaded cases run with: each waits in a different place. */
enum mode { MODE_V3 = 0, MODE_V4_EVENTFD = 1, MODE_V4_POLLING = 2, MODE_COUNT = 3 };

static shmipc_config *mode_config(int mode)
{
    shmipc_config *cfg = small_config();
    if (mode == MODE_V4_EVENTFD)
        assert_int_equal(shmipc_config_with_v4_eventfd(cfg), 0);
    else if (mode == MODE_V4_POLLING)
        assert_int_equal(shmipc_config_with_v4_event_queue_polling(cfg, 1000), 0);
    return cfg;
}

/* shutdown wakes a blocked accept; later calls fail; shutdown twice is fine; close frees. */
static void shutdown_wakes_accept(void **state)
{
    (void)state;
    for (int mode = 0; mode < MODE_COUNT; mode++) {
        shmipc_config *cfg = mode_config(mode);
        for (int i = 0; i < 20; i++) {
            struct ipc_pair p;
            struct blocked_accept b;
            shmipc_stream *st;
            pair_open(&p, cfg);
            start_blocked_accept(&b, p.server);
            assert_int_equal(shmipc_session_shutdown(p.server), 0);
            pthread_join(b.thread, NULL);
            assert_int_equal(b.rc, SHMIPC_ECLOSED);
            assert_int_equal(shmipc_session_shutdown(p.server), 0);
            assert_int_equal(shmipc_session_status(p.server), SHMIPC_ECLOSED);
            assert_int_equal(shmipc_session_accept_stream(p.server, 0, &st), SHMIPC_ECLOSED);
            assert_int_equal(shmipc_session_accept_stream(p.server, 100, &st), SHMIPC_ECLOSED);
            assert_int_equal(shmipc_session_process(p.server), SHMIPC_ECLOSED);
            /* The peer saw the end. */
            assert_int_equal(shmipc_session_open_stream(p.client, &st), 0);
            assert_int_equal(shmipc_stream_read_chunk(st, 0, &(const void *){0}, &(size_t){0}, 0),
                             SHMIPC_ECONNRESET);
            shmipc_stream_close(st);
            shmipc_session_close(p.server);
            shmipc_session_close(p.client);
            shmipc_listener_close(p.l);
        }
        shmipc_config_free(cfg);
    }
    assert_int_equal(shmipc_session_shutdown(NULL), SHMIPC_EINVAL);
    assert_int_equal(shmipc_stream_shutdown(NULL), SHMIPC_EINVAL);
}

/* A thread blocked in a read of one stream (forever). */
enum read_kind { READ_CHUNK = 0, READ_EXACT = 1, READ_FORWARD = 2, READ_KINDS = 3 };

struct blocked_read {
    shmipc_stream *st, *dst;
    int kind;
    pthread_t thread;
    int rc;
    int started;
};

static void *read_main(void *arg)
{
    struct blocked_read *b = arg;
    const void *ptr;
    size_t len;
    __atomic_store_n(&b->started, 1, __ATOMIC_RELEASE);
    if (b->kind == READ_CHUNK)
        b->rc = shmipc_stream_read_chunk(b->st, 0, &ptr, &len, 0);
    else if (b->kind == READ_EXACT)
        b->rc = shmipc_stream_read_exact_bytes(b->st, 1000, &ptr, 0);
    else
        b->rc = shmipc_stream_forward(b->dst, b->st, 1000, 0);
    return NULL;
}

static void start_blocked_read(struct blocked_read *b, shmipc_stream *st, shmipc_stream *dst,
                               int kind)
{
    memset(b, 0, sizeof *b);
    b->st = st;
    b->dst = dst;
    b->kind = kind;
    assert_int_equal(shmipc_stream_set_timeout_ms(st, SHMIPC_TIMEOUT_READ, 0), 0);
    assert_int_equal(pthread_create(&b->thread, NULL, read_main, b), 0);
    while (!__atomic_load_n(&b->started, __ATOMIC_ACQUIRE))
        sleep_ms(1);
    sleep_ms(2);
}

/* A client stream and its server end, with a first byte read and released. */
static void stream_pair(struct ipc_pair *p, shmipc_stream **cs, shmipc_stream **ss)
{
    assert_int_equal(shmipc_session_open_stream(p->client, cs), 0);
    ipc_send_text(*cs, "0");
    assert_int_equal(shmipc_session_accept_stream(p->server, IPC_WAIT_MS, ss), 0);
    ipc_expect_text(*ss, "0");
}

/*
 * shmipc_stream_shutdown wakes a read blocked forever on that stream, alone (the reader is the
 * session's processor, asleep in poll or epoll_wait: only the kick wakes it) and next to a
 * reader of another stream, which goes on; the session lives on.
 */
static void stream_shutdown_wakes_reads(void **state)
{
    (void)state;
    for (int mode = 0; mode < MODE_COUNT; mode++) {
        shmipc_config *cfg = mode_config(mode);
        struct ipc_pair p;
        pair_open(&p, cfg);
        for (int i = 0; i < 10 * READ_KINDS; i++) {
            shmipc_stream *cs, *ss, *cs2, *ss2;
            struct blocked_read b, other;
            const void *ptr;
            size_t len;
            stream_pair(&p, &cs, &ss);
            stream_pair(&p, &cs2, &ss2);
            int with_other = i % 2;
            if (with_other)
                start_blocked_read(&other, ss2, NULL, READ_EXACT);
            start_blocked_read(&b, ss, ss, i % READ_KINDS);
            assert_int_equal(shmipc_stream_shutdown(ss), 0);
            pthread_join(b.thread, NULL);
            assert_int_equal(b.rc, SHMIPC_ECLOSED);
            assert_int_equal(shmipc_stream_shutdown(ss), 0);
            assert_int_equal(shmipc_stream_read_chunk(ss, 0, &ptr, &len, SHMIPC_NONBLOCK),
                             SHMIPC_ECLOSED);
            assert_int_equal(shmipc_stream_write(ss, "x", 1), SHMIPC_ECLOSED);
            assert_int_equal(shmipc_stream_flush(ss), SHMIPC_ECLOSED);
            assert_int_equal(shmipc_stream_release(ss), 0);
            assert_int_equal(shmipc_session_status(p.server), 0);
            if (with_other) {
                /* The other stream's reader was not disturbed and still gets its bytes. */
                char msg[1000];
                memset(msg, 'a' + i % 26, sizeof msg);
                assert_int_equal(shmipc_stream_write(cs2, msg, sizeof msg), 0);
                assert_int_equal(shmipc_stream_flush(cs2), 0);
                pthread_join(other.thread, NULL);
                assert_int_equal(other.rc, 0);
            }
            shmipc_stream_close(ss);
            shmipc_stream_close(ss2);
            shmipc_stream_close(cs);
            shmipc_stream_close(cs2);
        }
        ipc_pair_close(&p);
        shmipc_config_free(cfg);
    }
}

/*
 * Closing a stream while another thread is blocked reading it: the read wakes with
 * SHMIPC_ECLOSED and the stream is freed when it leaves (ASan sees any use after free, and
 * LeakSanitizer a stream nobody freed). The peer is told.
 */
static void stream_close_while_read_blocks(void **state)
{
    (void)state;
    shmipc_config *cfg = small_config();
    struct ipc_pair p;
    pair_open(&p, cfg);
    for (int i = 0; i < 100; i++) {
        shmipc_stream *cs, *ss;
        struct blocked_read b;
        const void *ptr;
        size_t len;
        stream_pair(&p, &cs, &ss);
        start_blocked_read(&b, ss, ss, i % READ_KINDS);
        shmipc_stream_close(ss);
        pthread_join(b.thread, NULL);
        assert_int_equal(b.rc, SHMIPC_ECLOSED);
        assert_int_equal(shmipc_stream_read_chunk(cs, 0, &ptr, &len, 0), SHMIPC_EEOF);
        shmipc_stream_close(cs);
    }
    ipc_pair_close(&p);
    shmipc_config_free(cfg);
}

/* Closing the session while a stream read blocks: the read wakes, the stream stays valid. */
static void session_close_while_read_blocks(void **state)
{
    (void)state;
    shmipc_config *cfg = small_config();
    for (int i = 0; i < 50; i++) {
        struct ipc_pair p;
        shmipc_stream *cs, *ss;
        struct blocked_read b;
        pair_open(&p, cfg);
        stream_pair(&p, &cs, &ss);
        start_blocked_read(&b, ss, ss, i % READ_KINDS);
        if (i % 2)
            assert_int_equal(shmipc_session_shutdown(p.server), 0);
        shmipc_session_close(p.server);
        pthread_join(b.thread, NULL);
        assert_int_equal(b.rc, SHMIPC_ECLOSED);
        assert_int_equal(shmipc_stream_write(ss, "x", 1), SHMIPC_ECLOSED);
        shmipc_stream_close(ss);
        shmipc_stream_close(cs);
        shmipc_session_close(p.client);
        shmipc_listener_close(p.l);
    }
    shmipc_config_free(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(commit_zero_without_reserve_is_einval),
        cmocka_unit_test(close_while_accept_blocks),
        cmocka_unit_test(shutdown_wakes_accept),
        cmocka_unit_test(stream_shutdown_wakes_reads),
        cmocka_unit_test(stream_close_while_read_blocks),
        cmocka_unit_test(session_close_while_read_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
