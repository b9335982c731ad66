/*
 * Description: sessions, streams and serve() stressed as a careless multi-threaded user does:
 * many threads opening and closing streams on one session with unique payloads checked byte by
 * byte (no cross-talk between streams), sessions and streams shut down or closed while calls
 * block in them (each wakes with a documented error, none hangs), and serve() handing streams
 * to worker threads that close them while serve calls on_data. Bounded in count and in time,
 * for runs under ASan and TSan.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ipc_helpers.h"
#include "shmipc.h"

/* Each case stops at whichever comes first: its count, or this much time. */
#define CASE_MS 4000u
/* The most any thread may take to wake once the thing it blocks on was ended. */
#define WAKE_S 10

static char address[128];

static shmipc_config *stress_config(int memory_wait, int v4)
{
    shmipc_config *cfg;
    assert_int_equal(shmipc_config_new(&cfg), 0);
    assert_int_equal(shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_INITIALIZE, 10000), 0);
    assert_int_equal(shmipc_config_set_buffer_capacity(cfg, 1u << 20), 0);
    assert_int_equal(shmipc_config_set_memory_wait(cfg, memory_wait), 0);
    if (v4) {
        assert_int_equal(shmipc_config_set_protocol(cfg, SHMIPC_PROTOCOL_V4, 0), 0);
        assert_int_equal(shmipc_config_set_wakeup(cfg, SHMIPC_WAKEUP_EVENTFD, 0), 0);
    }
    return cfg;
}

/* Joins `t` within WAKE_S seconds, or fails the case (a call that never woke). */
static void *join_in_time(pthread_t t, const char *what)
{
    struct timespec ts;
    void *ret = NULL;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += WAKE_S;
    if (pthread_timedjoin_np(t, &ret, &ts) != 0)
        fail_msg("%s did not wake within %d s", what, WAKE_S);
    return ret;
}

/* The bytes of message `seed`, the same on both sides. */
static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (uint8_t)x;
    }
}

/* ---- Many threads, one session, unique payloads ---- */

#define XT_CLIENTS 6
#define XT_SERVERS 4
#define XT_MAX     20000u

struct xtalk {
    shmipc_session *client, *server;
    uint64_t end_ms;
    int stop_clients, stop_servers; /* atomic */
    int bad, done, per_client;      /* atomic */
};

/* Reads exactly n bytes into buf, chunk by chunk; the count read. */
static size_t read_all(shmipc_stream *st, uint8_t *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        const void *p;
        size_t len;
        if (shmipc_stream_read_chunk(st, n - got, &p, &len, 0) != 0)
            break;
        memcpy(buf + got, p, len);
        got += len;
        shmipc_stream_release(st);
    }
    return got;
}

/* Accepts streams and echoes each one message (8-byte header: seed, length; then payload). */
static void *xt_server_main(void *arg)
{
    struct xtalk *x = arg;
    uint8_t *buf = malloc(XT_MAX), *want = malloc(XT_MAX);
    while (!__atomic_load_n(&x->stop_servers, __ATOMIC_ACQUIRE)) {
        shmipc_stream *st;
        const void *p;
        uint32_t h[2];
        int rc = shmipc_session_accept_stream(x->server, 50, &st);
        if (rc == SHMIPC_ETIMEDOUT)
            continue;
        if (rc != 0)
            break;
        if (shmipc_stream_read_exact_bytes(st, 8, &p, 0) == 0) {
            memcpy(h, p, 8);
            shmipc_stream_release(st);
            if (h[1] <= XT_MAX && read_all(st, buf, h[1]) == h[1]) {
                fill(want, h[1], h[0]);
                if (memcmp(want, buf, h[1]) != 0)
                    __atomic_add_fetch(&x->bad, 1, __ATOMIC_RELAXED);
                shmipc_stream_write(st, h, 8);
                shmipc_stream_write(st, buf, h[1]);
                shmipc_stream_flush(st);
            } else {
                __atomic_add_fetch(&x->bad, 1, __ATOMIC_RELAXED);
            }
        }
        shmipc_stream_close(st);
    }
    free(buf);
    free(want);
    return NULL;
}

static void *xt_client_main(void *arg)
{
    struct xtalk *x = arg;
    static int next_id;
    uint32_t id = (uint32_t)__atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
    unsigned r = id;
    uint8_t *out = malloc(XT_MAX), *in = malloc(XT_MAX);
    for (uint32_t k = 0; (int)k < x->per_client && ipc_now_ms() < x->end_ms; k++) {
        shmipc_stream *st;
        const void *p;
        uint32_t seed = id * 1000003u + k, n = (uint32_t)rand_r(&r) % XT_MAX, h[2] = {seed, n};
        if (shmipc_session_open_stream(x->client, &st) != 0) {
            usleep(1000); /* the fallback breaker: new streams refused for a while */
            continue;
        }
        fill(out, n, seed);
        shmipc_stream_write(st, h, 8);
        shmipc_stream_write(st, out, n);
        if (shmipc_stream_flush(st) == 0 && shmipc_stream_read_exact_bytes(st, 8, &p, 0) == 0) {
            uint32_t back[2];
            memcpy(back, p, 8);
            shmipc_stream_release(st);
            if (back[0] != seed || back[1] != n || read_all(st, in, n) != n ||
                memcmp(in, out, n) != 0)
                __atomic_add_fetch(&x->bad, 1, __ATOMIC_RELAXED);
            else
                __atomic_add_fetch(&x->done, 1, __ATOMIC_RELAXED);
        } else {
            __atomic_add_fetch(&x->bad, 1, __ATOMIC_RELAXED);
        }
        /* Both ways of closing: a plain close, and the flush-and-close of a last reply. */
        if (k % 3 == 0)
            shmipc_stream_flush_close(st);
        else
            shmipc_stream_close(st);
    }
    free(out);
    free(in);
    return NULL;
}

static void many_threads_one_session(int memory_wait, int v4)
{
    shmipc_config *cfg = stress_config(memory_wait, v4);
    struct ipc_pair p;
    struct xtalk x = {.per_client = 200};
    pthread_t srv[XT_SERVERS], cli[XT_CLIENTS];
    ipc_pick_address(address, sizeof address, "lifecycle-xtalk");
    ipc_pair_open(&p, address, cfg, cfg);
    x.client = p.client;
    x.server = p.server;
    x.end_ms = ipc_now_ms() + CASE_MS;
    for (int i = 0; i < XT_SERVERS; i++)
        assert_int_equal(pthread_create(&srv[i], NULL, xt_server_main, &x), 0);
    for (int i = 0; i < XT_CLIENTS; i++)
        assert_int_equal(pthread_create(&cli[i], NULL, xt_client_main, &x), 0);
    for (int i = 0; i < XT_CLIENTS; i++)
        pthread_join(cli[i], NULL);
    __atomic_store_n(&x.stop_servers, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < XT_SERVERS; i++)
        join_in_time(srv[i], "an accepting server thread");
    print_message("%d messages echoed\n", x.done);
    assert_int_equal(x.bad, 0);
    assert_true(x.done > 0);
    assert_int_equal(shmipc_session_status(p.client), 0);
    assert_int_equal(shmipc_session_status(p.server), 0);
    ipc_pair_close(&p);
    shmipc_config_free(cfg);
}

/* Streams opened and closed by many threads on one session: every byte comes back as sent. */
static void unique_payloads_no_cross_talk_v3(void **state)
{
    (void)state;
    many_threads_one_session(0, 0);
}

static void unique_payloads_no_cross_talk_memory_wait(void **state)
{
    (void)state;
    many_threads_one_session(1, 0);
}

static void unique_payloads_no_cross_talk_v4_eventfd(void **state)
{
    (void)state;
    many_threads_one_session(0, 1);
}

/* ---- Ending what calls block in ---- */

struct blocked {
    shmipc_session *client, *server;
    shmipc_stream *cs[4], *ss[4];
    int accept_rc;
    char accept_why[256]; /* the accept thread's error detail (the detail is per thread) */
};

static void *bl_accept(void *arg)
{
    struct blocked *b = arg;
    shmipc_stream *st;
    int rc;
    while ((rc = shmipc_session_accept_stream(b->server, -1, &st)) == 0)
        shmipc_stream_close(st);
    b->accept_rc = rc;
    snprintf(b->accept_why, sizeof b->accept_why, "%s", shmipc_error_detail());
    return NULL;
}

static void *bl_read_chunk(void *arg)
{
    shmipc_stream *st = arg;
    const void *p;
    size_t n;
    int rc;
    while ((rc = shmipc_stream_read_chunk(st, 0, &p, &n, 0)) == 0)
        shmipc_stream_release(st);
    return (void *)(intptr_t)rc;
}

static void *bl_read_exact(void *arg)
{
    shmipc_stream *st = arg;
    const void *p;
    int rc;
    while ((rc = shmipc_stream_read_exact_bytes(st, 100000, &p, 0)) == 0)
        shmipc_stream_release(st);
    return (void *)(intptr_t)rc;
}

/*
 * What a writer sends to a peer that never reads, at most: more than the buffer (1 MiB), well
 * under the 128 MiB of fallback data a session holds unread (max_fallback_unread).
 */
#define BL_WRITE_MAX (16u << 20)

/*
 * Writes until shared memory is full and the flush waits (memory_wait). On fallback the
 * receiving session reads the socket into its heap for as long as the writer goes on, so no
 * flush waits: the writer stops at BL_WRITE_MAX and waits in a read instead. Unbounded, it
 * reached max_fallback_unread when this thread ran 100 ms before the case ended the session
 * (a loaded machine), and the peer's session ended with EPROTO, as documented.
 */
static void *bl_write(void *arg)
{
    static const uint8_t buf[65536];
    shmipc_stream *st = arg;
    const void *p;
    size_t n, sent = 0;
    int rc;
    while ((rc = shmipc_stream_write(st, buf, sizeof buf)) == 0 &&
           (rc = shmipc_stream_flush(st)) == 0)
        if ((sent += sizeof buf) >= BL_WRITE_MAX) {
            while ((rc = shmipc_stream_read_chunk(st, 0, &p, &n, 0)) == 0)
                shmipc_stream_release(st);
            break;
        }
    return (void *)(intptr_t)rc;
}

static int documented_end(int rc)
{
    return rc == SHMIPC_ECLOSED || rc == SHMIPC_ECONNRESET || rc == SHMIPC_EEOF;
}

static void end_while_calls_block(int memory_wait)
{
    shmipc_config *cfg = stress_config(memory_wait, 0);
    assert_int_equal(shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_READ, -1), 0);
    assert_int_equal(shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_WRITE, -1), 0);
    shmipc_listener *l;
    unsigned seed = 7;
    uint64_t end = ipc_now_ms() + CASE_MS;
    ipc_pick_address(address, sizeof address, "lifecycle-blocked");
    assert_int_equal(shmipc_listener_new(address, cfg, &l), 0);
    for (int it = 0; it < 60 && ipc_now_ms() < end; it++) {
        struct blocked b = {0};
        pthread_t t[7];
        const char *what[7] = {"accept_stream",    "server read_chunk", "server read_exact",
                               "client flush",     "client read_chunk", "server flush",
                               "client read_exact"};
        int closed_client = 0, closed_server = 0, mode = it % 6;
        ipc_connect_accept(l, address, cfg, &b.client, &b.server);
        for (int i = 0; i < 4; i++) {
            assert_int_equal(shmipc_session_open_stream(b.client, &b.cs[i]), 0);
            ipc_send_text(b.cs[i], "x");
            assert_int_equal(shmipc_session_accept_stream(b.server, IPC_WAIT_MS, &b.ss[i]), 0);
            ipc_expect_text(b.ss[i], "x");
        }
        assert_int_equal(pthread_create(&t[0], NULL, bl_accept, &b), 0);
        assert_int_equal(pthread_create(&t[1], NULL, bl_read_chunk, b.ss[0]), 0);
        assert_int_equal(pthread_create(&t[2], NULL, bl_read_exact, b.ss[1]), 0);
        /* Nobody reads ss[2] and cs[3]'s peer writes: memory runs out, the flush waits. */
        assert_int_equal(pthread_create(&t[3], NULL, bl_write, b.cs[2]), 0);
        assert_int_equal(pthread_create(&t[4], NULL, bl_read_chunk, b.cs[0]), 0);
        assert_int_equal(pthread_create(&t[5], NULL, bl_write, b.ss[3]), 0);
        assert_int_equal(pthread_create(&t[6], NULL, bl_read_exact, b.cs[3]), 0);
        usleep((useconds_t)(rand_r(&seed) % 3000));
        switch (mode) {
        case 0:
            shmipc_session_close(b.client);
            closed_client = 1;
            break;
        case 1:
            shmipc_session_close(b.server);
            closed_server = 1;
            break;
        case 2:
            shmipc_session_shutdown(b.client);
            shmipc_session_shutdown(b.server);
            break;
        case 3:
            for (int i = 0; i < 4; i++)
                shmipc_stream_shutdown(b.cs[i]);
            shmipc_session_close(b.server);
            closed_server = 1;
            break;
        case 4:
            for (int i = 0; i < 4; i++)
                shmipc_stream_shutdown(b.ss[i]);
            shmipc_session_shutdown(b.client);
            break;
        default:
            shmipc_session_close(b.client);
            shmipc_session_close(b.server);
            closed_client = closed_server = 1;
            break;
        }
        for (int i = 0; i < 7; i++) {
            int rc = (int)(intptr_t)join_in_time(t[i], what[i]);
            if (i == 0)
                rc = b.accept_rc;
            if (!documented_end(rc))
                fail_msg("iteration %d (mode %d): %s ended with %d (%s)", it, mode, what[i], rc,
                         i == 0 ? b.accept_why : "the detail is the thread's");
        }
        for (int i = 0; i < 4; i++) {
            shmipc_stream_close(b.cs[i]);
            shmipc_stream_close(b.ss[i]);
        }
        if (!closed_client)
            shmipc_session_close(b.client);
        if (!closed_server)
            shmipc_session_close(b.server);
    }
    shmipc_listener_close(l);
    shmipc_config_free(cfg);
}

/* Session and stream ends while accept, reads and flushes block: all wake, none hangs. */
static void blocked_calls_wake_fallback(void **state)
{
    (void)state;
    end_while_calls_block(0);
}

static void blocked_calls_wake_memory_wait(void **state)
{
    (void)state;
    end_while_calls_block(1);
}

/* ---- serve() handing streams to workers ---- */

#define SW_QUEUE 4096

struct served_work {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    shmipc_listener *l;
    shmipc_stream *q[SW_QUEUE];
    unsigned head, tail;
    int stop;
    int calls; /* on_data calls (atomic) */
    int bad;   /* atomic */
    uint64_t end_ms;
};

static void sw_on_stream(shmipc_stream *st, void *ud)
{
    struct served_work *w = ud;
    pthread_mutex_lock(&w->mu);
    if (w->tail - w->head < SW_QUEUE) {
        w->q[w->tail++ % SW_QUEUE] = st;
        st = NULL;
    }
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->mu);
    shmipc_stream_close(st); /* no room: refused */
}

/* A worker may be closing the stream right now: on_data only looks at its id. */
static void sw_on_data(shmipc_stream *st, void *ud)
{
    struct served_work *w = ud;
    if (shmipc_stream_id(st) == 0)
        __atomic_add_fetch(&w->bad, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&w->calls, 1, __ATOMIC_RELAXED);
}

/* Echoes 16-byte messages on its stream with blocking calls until it ends, then closes it. */
static void *sw_worker(void *arg)
{
    struct served_work *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (w->head == w->tail && !w->stop)
            pthread_cond_wait(&w->cond, &w->mu);
        if (w->head == w->tail) {
            pthread_mutex_unlock(&w->mu);
            return NULL;
        }
        shmipc_stream *st = w->q[w->head++ % SW_QUEUE];
        pthread_mutex_unlock(&w->mu);
        const void *p;
        uint8_t m[16];
        while (shmipc_stream_read_exact_bytes(st, 16, &p, 0) == 0) {
            memcpy(m, p, 16);
            shmipc_stream_release(st);
            if (shmipc_stream_write(st, m, 16) != 0 || shmipc_stream_flush(st) != 0)
                break;
        }
        shmipc_stream_close(st);
    }
}

static void *sw_serve(void *arg)
{
    struct served_work *w = arg;
    return (void *)(intptr_t)shmipc_listener_serve(w->l, sw_on_stream, sw_on_data, w, NULL);
}

static void *sw_client(void *arg)
{
    struct served_work *w = arg;
    static int next_id;
    uint32_t id = (uint32_t)__atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
    shmipc_session *s;
    shmipc_config *cfg = stress_config(0, 0);
    shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_READ, 5000);
    int rc = shmipc_session_connect(address, cfg, &s);
    shmipc_config_free(cfg);
    if (rc != 0)
        return NULL;
    for (uint32_t k = 0; k < 300 && ipc_now_ms() < w->end_ms; k++) {
        shmipc_stream *st;
        if (shmipc_session_open_stream(s, &st) != 0)
            break;
        int ok = 1;
        for (uint32_t r = 0; r < 3 && ok; r++) {
            uint32_t m[4] = {id, k, r, id ^ k ^ r};
            const void *p;
            ok = shmipc_stream_write(st, m, 16) == 0 && shmipc_stream_flush(st) == 0 &&
                 shmipc_stream_read_exact_bytes(st, 16, &p, 0) == 0;
            if (ok && memcmp(p, m, 16) != 0)
                __atomic_add_fetch(&w->bad, 1, __ATOMIC_RELAXED);
            if (ok)
                shmipc_stream_release(st);
        }
        shmipc_stream_close(st);
        if (!ok)
            break; /* serve ended */
    }
    shmipc_session_close(s);
    return NULL;
}

/*
 * serve() hands each stream to a worker thread, which reads and writes it with blocking calls
 * and closes it on another thread while serve may be calling on_data for it (which only reads
 * its id: under ASan a stream freed under on_data shows). The listener is stopped or shut
 * down mid-way; every thread ends, every echo is the client's own message.
 */
static void serve_hands_streams_to_closing_workers(void **state)
{
    (void)state;
    shmipc_config *cfg = stress_config(0, 0);
    for (int round = 0; round < 4; round++) {
        struct served_work w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
        pthread_t sv, wk[4], cl[4];
        ipc_pick_address(address, sizeof address, "lifecycle-serve");
        assert_int_equal(shmipc_listener_new(address, cfg, &w.l), 0);
        w.end_ms = ipc_now_ms() + CASE_MS;
        assert_int_equal(pthread_create(&sv, NULL, sw_serve, &w), 0);
        for (int i = 0; i < 4; i++)
            assert_int_equal(pthread_create(&wk[i], NULL, sw_worker, &w), 0);
        for (int i = 0; i < 4; i++)
            assert_int_equal(pthread_create(&cl[i], NULL, sw_client, &w), 0);
        usleep(200000u + (unsigned)round * 100000u);
        if (round % 2)
            assert_int_equal(shmipc_listener_shutdown(w.l), 0);
        else
            assert_int_equal(shmipc_listener_stop(w.l), 0);
        int rc = (int)(intptr_t)join_in_time(sv, "serve");
        assert_int_equal(rc, round % 2 ? SHMIPC_ECLOSED : 0);
        for (int i = 0; i < 4; i++)
            join_in_time(cl[i], "a client");
        pthread_mutex_lock(&w.mu);
        w.stop = 1;
        pthread_cond_broadcast(&w.cond);
        pthread_mutex_unlock(&w.mu);
        for (int i = 0; i < 4; i++)
            join_in_time(wk[i], "a worker");
        print_message("round %d: %d on_data calls\n", round, w.calls);
        assert_int_equal(w.bad, 0);
        shmipc_listener_close(w.l);
    }
    shmipc_config_free(cfg);
}

int main(int argc, char **argv)
{
    /* One test by name: test_x NAME (shell pattern), for repeated runs under a sanitizer. */
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(unique_payloads_no_cross_talk_v3),
        cmocka_unit_test(unique_payloads_no_cross_talk_memory_wait),
        cmocka_unit_test(unique_payloads_no_cross_talk_v4_eventfd),
        cmocka_unit_test(blocked_calls_wake_fallback),
        cmocka_unit_test(blocked_calls_wake_memory_wait),
        cmocka_unit_test(serve_hands_streams_to_closing_workers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
