/*
 * Description: the spin/wakeup handshake under stress. Two threads exchange bursts of numbered
 * messages over one stream; before each wait each side picks at random how it waits: a
 * blocking read (spins with the config's cap, then sleeps), an event loop that spins first
 * (shmipc_session_spin, then poll on fileno), or one that only sleeps (poll, no spin); a side
 * with no event loop picks between a blocking read and non-blocking reads with pauses; the
 * caps differ per side (0 .. 50 µs), and random delays (mostly none, a busy few µs, rarely a sleep) sit
 * between the messages. A wakeup lost between a spin giving up and the peer's put shows up as
 * a wait that reaches its timeout; a message lost or reordered as a wrong number. Bounded by
 * count and by time (docs/protocol.md 6.6).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ipc_helpers.h"
#include "shmipc.h"

/* Messages each way per test, and the time bound of one test (whichever comes first). */
#define STRESS_MESSAGES 1000000u
#define STRESS_SECONDS  2u /* x 8 cases: 16 s */
/* The longest any one wait may take before the test calls it a lost wakeup. */
#define WAIT_LIMIT_MS 5000
#define MAX_BURST     8u

struct side {
    const char *name;
    shmipc_session *s;
    shmipc_stream *st;
    uint64_t sent, received;
    unsigned seed;
    int failed;
    char why[256];
    uint64_t waits[4]; /* by mode */
    /* Blocking and non-blocking reads only, never the descriptor (an application with no
     * event loop): the waits of a blocking read and the turns of a non-blocking one. */
    int no_loop;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static unsigned rnd(struct side *sd, unsigned n)
{
    return (unsigned)rand_r(&sd->seed) % n;
}

static void fail_side(struct side *sd, const char *fmt, ...)
{
    va_list ap;
    if (sd->failed)
        return;
    sd->failed = 1;
    va_start(ap, fmt);
    vsnprintf(sd->why, sizeof sd->why, fmt, ap);
    va_end(ap);
}

/* Between messages: mostly nothing, sometimes a busy few µs, rarely a real sleep. */
static void random_delay(struct side *sd)
{
    unsigned r = rnd(sd, 1000);
    if (r < 800)
        return;
    if (r < 995) {
        uint64_t end = now_ns() + 250u * (1 + rnd(sd, 40)); /* 0.25 .. 10 µs */
        while (now_ns() < end)
            ;
        return;
    }
    struct timespec ts = {0, 20000 + (long)rnd(sd, 200000)}; /* 20 .. 220 µs */
    nanosleep(&ts, NULL);
}

static int send_seq(struct side *sd)
{
    uint64_t v = sd->sent;
    int rc = shmipc_stream_write(sd->st, &v, sizeof v);
    if (rc == 0)
        rc = shmipc_stream_flush(sd->st);
    if (rc < 0) {
        fail_side(sd, "%s: send %llu: %s (%s)", sd->name, (unsigned long long)v, shmipc_errname(rc),
                  shmipc_error_detail());
        return -1;
    }
    sd->sent++;
    return 0;
}

/* Reads `n` bytes without blocking, polling with short pauses until WAIT_LIMIT_MS. */
static int read_polling(struct side *sd, size_t n, const void **p)
{
    uint64_t deadline = now_ns() + (uint64_t)WAIT_LIMIT_MS * 1000000u;
    for (;;) {
        int rc = shmipc_stream_read_exact_bytes(sd->st, n, p, SHMIPC_NONBLOCK);
        if (rc != SHMIPC_EAGAIN)
            return rc;
        if (now_ns() >= deadline) {
            fail_side(sd, "%s: non-blocking reads found no message %llu for %d ms: lost", sd->name,
                      (unsigned long long)sd->received, WAIT_LIMIT_MS);
            return rc;
        }
        if (rnd(sd, 4) == 0)
            sched_yield();
        else
            random_delay(sd);
    }
}

/* Takes one number (mode 3: by non-blocking reads) and checks it is the next one. */
static int take_seq_mode(struct side *sd, unsigned mode)
{
    const void *p;
    uint64_t v;
    int rc = mode == 3 ? read_polling(sd, sizeof v, &p)
                       : shmipc_stream_read_exact_bytes(sd->st, sizeof v, &p, 0);
    if (rc < 0) {
        fail_side(sd, "%s: read after %llu: %s (%s)", sd->name, (unsigned long long)sd->received,
                  shmipc_errname(rc), shmipc_error_detail());
        return -1;
    }
    memcpy(&v, p, sizeof v);
    shmipc_stream_release(sd->st);
    if (v != sd->received) {
        fail_side(sd, "%s: got message %llu, expected %llu (lost or reordered)", sd->name,
                  (unsigned long long)v, (unsigned long long)sd->received);
        return -1;
    }
    sd->received++;
    return 0;
}

static int take_seq(struct side *sd)
{
    return take_seq_mode(sd, 0);
}

/* How the next wait goes: 0 a blocking read (40%), 1 spin then poll (40%), 2 poll only; a
 * side with no loop: 0 (60%), 3 non-blocking reads with pauses (40%). */
static unsigned wait_mode(struct side *sd)
{
    unsigned r = rnd(sd, 10);
    if (sd->no_loop)
        return r < 6 ? 0 : 3;
    return r < 4 ? 0 : r < 8 ? 1 : 2;
}

/*
 * Waits for the next number in a randomly chosen mode and takes it. A wait that reaches
 * WAIT_LIMIT_MS is a lost wakeup: the peer has sent it (the exchange is lockstep per burst).
 */
static int recv_seq(struct side *sd)
{
    unsigned mode = wait_mode(sd);
    sd->waits[mode]++;
    if (mode == 0 || mode == 3 || shmipc_stream_available(sd->st) >= sizeof(uint64_t))
        return take_seq_mode(sd, mode); /* blocking: the read timeout (WAIT_LIMIT_MS) bounds it */
    uint64_t deadline = now_ns() + (uint64_t)WAIT_LIMIT_MS * 1000000u;
    struct pollfd pfd = {.fd = shmipc_session_fileno(sd->s), .events = POLLIN};
    while (shmipc_stream_available(sd->st) < sizeof(uint64_t)) {
        int rc;
        if (mode == 1 && (rc = shmipc_session_spin(sd->s)) != 0) {
            if (rc < 0) {
                fail_side(sd, "%s: spin: %s", sd->name, shmipc_errname(rc));
                return -1;
            }
            continue;
        }
        uint64_t now = now_ns();
        if (now >= deadline) {
            fail_side(sd, "%s: waited %d ms for message %llu in mode %u: a lost wakeup", sd->name,
                      WAIT_LIMIT_MS, (unsigned long long)sd->received, mode);
            return -1;
        }
        int left = (int)((deadline - now) / 1000000u) + 1;
        if (poll(&pfd, 1, left) < 0)
            continue; /* EINTR */
        if ((rc = shmipc_session_process(sd->s)) < 0) {
            fail_side(sd, "%s: process: %s", sd->name, shmipc_errname(rc));
            return -1;
        }
    }
    return take_seq(sd);
}

struct run {
    struct side client, server;
    uint64_t until_ns;
};

/*
 * Client: a burst of 1..8 numbers, then the server's echo of each. It stops after
 * STRESS_MESSAGES or STRESS_SECONDS, telling the server with a burst of length 0: the burst
 * length precedes each burst as a message of its own.
 */
static void *client_main(void *arg)
{
    struct run *r = arg;
    struct side *sd = &r->client;
    while (!sd->failed) {
        int done = sd->sent >= STRESS_MESSAGES || now_ns() >= r->until_ns;
        unsigned n = done ? 0 : 1 + rnd(sd, MAX_BURST);
        uint64_t hdr = n;
        int rc = shmipc_stream_write(sd->st, &hdr, sizeof hdr);
        if (rc == 0)
            rc = shmipc_stream_flush(sd->st);
        if (rc < 0) {
            fail_side(sd, "client: burst header: %s", shmipc_errname(rc));
            break;
        }
        if (n == 0)
            break;
        for (unsigned i = 0; i < n && !sd->failed; i++) {
            random_delay(sd);
            send_seq(sd);
        }
        for (unsigned i = 0; i < n && !sd->failed; i++)
            recv_seq(sd);
    }
    return NULL;
}

/* Server: reads a burst header, then each number, echoing each as it comes. */
static void *server_main(void *arg)
{
    struct run *r = arg;
    struct side *sd = &r->server;
    while (!sd->failed) {
        /* The header is read with the same random waits, but is not a numbered message. */
        uint64_t want = sd->received;
        const void *p;
        uint64_t n;
        int rc = 1; /* 1: not read yet */
        if (shmipc_stream_available(sd->st) < sizeof n) {
            /* Wait for the 8 bytes in a random mode, as recv_seq() (mode 0: the read blocks). */
            unsigned mode = wait_mode(sd);
            struct pollfd pfd = {.fd = -1, .events = POLLIN};
            if (mode == 1 || mode == 2)
                pfd.fd = shmipc_session_fileno(sd->s);
            uint64_t deadline = now_ns() + (uint64_t)WAIT_LIMIT_MS * 1000000u;
            if (mode == 3)
                rc = read_polling(sd, sizeof n, &p);
            while ((mode == 1 || mode == 2) && shmipc_stream_available(sd->st) < sizeof n &&
                   !sd->failed) {
                if (mode == 1 && shmipc_session_spin(sd->s) > 0)
                    continue;
                uint64_t now = now_ns();
                if (now >= deadline)
                    fail_side(sd, "server: waited %d ms for a burst header: a lost wakeup",
                              WAIT_LIMIT_MS);
                else if (poll(&pfd, 1, (int)((deadline - now) / 1000000u) + 1) >= 0 &&
                         shmipc_session_process(sd->s) < 0)
                    fail_side(sd, "server: process failed");
            }
        }
        if (sd->failed)
            break;
        if (rc == 1)
            rc = shmipc_stream_read_exact_bytes(sd->st, sizeof n, &p, 0);
        if (rc < 0) {
            fail_side(sd, "server: burst header after %llu: %s (%s)", (unsigned long long)want,
                      shmipc_errname(rc), shmipc_error_detail());
            break;
        }
        memcpy(&n, p, sizeof n);
        shmipc_stream_release(sd->st);
        if (n == 0)
            break;
        if (n > MAX_BURST) {
            fail_side(sd, "server: burst of %llu", (unsigned long long)n);
            break;
        }
        for (uint64_t i = 0; i < n && !sd->failed; i++) {
            if (recv_seq(sd) < 0)
                break;
            random_delay(sd);
            send_seq(sd);
        }
    }
    return NULL;
}

/* Sets a read timeout that bounds every blocking read, and the side's spin cap. */
static shmipc_config *stress_config(int eventfd, uint32_t spin_us)
{
    shmipc_config *cfg;
    assert_int_equal(shmipc_config_new(&cfg), 0);
    assert_int_equal(shmipc_config_set_buffer_capacity(cfg, 4u << 20), 0);
    assert_int_equal(shmipc_config_set_queue_capacity(cfg, 1024), 0);
    assert_int_equal(shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_READ, WAIT_LIMIT_MS), 0);
    /* 10 s, as the other threaded suites: under TSan beside another CI run the default second
     * was overrun once (handshake timed out in v3_more_spinners_than_cpus). */
    assert_int_equal(shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_INITIALIZE, 10000), 0);
    assert_int_equal(shmipc_config_set_spin_us(cfg, spin_us), 0);
    if (eventfd) {
        assert_int_equal(shmipc_config_with_v4_eventfd(cfg), 0);
        /* V4 or nothing: with the fallback, a handshake slower than the V4 probe's 250 ms
         * (SHMIPC_V4_PROBE_TIMEOUT_MS; two CI runs side by side) came back on V3, and the
         * version check below failed (0x3 != 0x4, once). */
        assert_int_equal(shmipc_config_set_protocol(cfg, SHMIPC_PROTOCOL_V4, 0), 0);
    }
    return cfg;
}

#define MAX_PAIRS 3

/*
 * `npairs` pairs at once, each with its client and server thread: with more than one, more
 * threads spin than the machine has CPUs (2 here), and the spinners yield instead of pausing.
 */
static void stress(int eventfd, uint32_t client_spin, uint32_t server_spin, unsigned seed,
                   int npairs, int no_loop)
{
    char address[128];
    struct ipc_pair p[MAX_PAIRS];
    struct run r[MAX_PAIRS];
    pthread_t ct[MAX_PAIRS], st[MAX_PAIRS];
    memset(r, 0, sizeof r);
    shmipc_config *scfg = stress_config(eventfd, server_spin);
    shmipc_config *ccfg = stress_config(eventfd, client_spin);
    for (int k = 0; k < npairs; k++) {
        ipc_pick_address(address, sizeof address, "spin-stress");
        ipc_pair_open(&p[k], address, scfg, ccfg);
        assert_int_equal(shmipc_session_version(p[k].client), eventfd ? 4 : 3);
        r[k].client = (struct side){
            .name = "client", .s = p[k].client, .seed = seed + 100u * k, .no_loop = no_loop & 1};
        r[k].server = (struct side){.name = "server",
                                    .s = p[k].server,
                                    .seed = seed * 7 + 1 + k,
                                    .no_loop = (no_loop & 2) != 0};
        assert_int_equal(shmipc_session_open_stream(p[k].client, &r[k].client.st), 0);
        ipc_send_text(r[k].client.st, "go");
        assert_int_equal(shmipc_session_accept_stream(p[k].server, IPC_WAIT_MS, &r[k].server.st),
                         0);
        ipc_expect_text(r[k].server.st, "go");
    }
    uint64_t t0 = now_ns();
    for (int k = 0; k < npairs; k++) {
        r[k].until_ns = t0 + (uint64_t)STRESS_SECONDS * 1000000000u;
        assert_int_equal(pthread_create(&st[k], NULL, server_main, &r[k]), 0);
        assert_int_equal(pthread_create(&ct[k], NULL, client_main, &r[k]), 0);
    }
    for (int k = 0; k < npairs; k++) {
        pthread_join(ct[k], NULL);
        if (r[k].client.failed)
            shmipc_session_shutdown(p[k].server); /* it may wait for a burst that never comes */
        pthread_join(st[k], NULL);
    }
    double secs = (double)(now_ns() - t0) / 1e9;
    for (int k = 0; k < npairs; k++) {
        struct run *q = &r[k];
        printf("# %s, spin caps %u/%u µs, pair %d of %d: %llu messages each way in %.2f s; waits "
               "by mode (blocking, spin+poll, poll, non-blocking reads) client %llu/%llu/%llu/%llu "
               "server %llu/%llu/%llu/%llu\n",
               eventfd ? "V4 eventfd" : "V3", client_spin, server_spin, k + 1, npairs,
               (unsigned long long)q->client.sent, secs, (unsigned long long)q->client.waits[0],
               (unsigned long long)q->client.waits[1], (unsigned long long)q->client.waits[2],
               (unsigned long long)q->client.waits[3], (unsigned long long)q->server.waits[0],
               (unsigned long long)q->server.waits[1], (unsigned long long)q->server.waits[2],
               (unsigned long long)q->server.waits[3]);
        if (q->client.failed)
            fail_msg("pair %d: %s", k + 1, q->client.why);
        if (q->server.failed)
            fail_msg("pair %d: %s", k + 1, q->server.why);
        assert_int_equal(q->client.sent, q->server.received);
        assert_int_equal(q->server.sent, q->client.received);
        assert_int_equal(q->client.sent, q->client.received);
        assert_true(q->client.sent > 0);
        shmipc_stream_close(q->client.st);
        shmipc_stream_close(q->server.st);
        ipc_pair_close(&p[k]);
    }
    shmipc_config_free(scfg);
    shmipc_config_free(ccfg);
}

static void v3_both_spin_and_sleep(void **state)
{
    (void)state;
    stress(0, 50, 50, 1, 1, 0);
}

static void v3_only_the_server_spins(void **state)
{
    (void)state;
    stress(0, 0, 20, 2, 1, 0);
}

static void v4_eventfd_both_spin_and_sleep(void **state)
{
    (void)state;
    stress(1, 50, 50, 3, 1, 0);
}

/* Three pairs at once: six threads spinning on two CPUs yield to each other. */
static void v3_more_spinners_than_cpus(void **state)
{
    (void)state;
    stress(0, 100, 100, 5, 3, 0);
}

/*
 * No event loop on either side (V3, then V4 eventfd), or on the client only: blocking reads
 * and non-blocking reads with random pauses, which must find what the peer put meanwhile.
 */
static void v3_no_event_loop(void **state)
{
    (void)state;
    stress(0, 50, 50, 6, 1, 3);
}

static void v4_eventfd_no_event_loop(void **state)
{
    (void)state;
    stress(1, 50, 50, 7, 1, 3);
}

static void v3_blocking_client_loop_server(void **state)
{
    (void)state;
    stress(0, 50, 20, 8, 1, 1);
}

static void v4_eventfd_short_caps(void **state)
{
    (void)state;
    stress(1, 2, 5, 4, 1, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(v3_both_spin_and_sleep),
        cmocka_unit_test(v3_only_the_server_spins),
        cmocka_unit_test(v4_eventfd_both_spin_and_sleep),
        cmocka_unit_test(v4_eventfd_short_caps),
        cmocka_unit_test(v3_more_spinners_than_cpus),
        cmocka_unit_test(v3_no_event_loop),
        cmocka_unit_test(v4_eventfd_no_event_loop),
        cmocka_unit_test(v3_blocking_client_loop_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
