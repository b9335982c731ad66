/*
 * Description: chaos: a peer process is killed with SIGKILL at a random point (in its
 * handshake, or while streaming echoes) many times, for each role the survivor plays (server,
 * client) and each protocol (V2, V3, V4 eventfd, V4 polling). The survivor must notice within
 * a bound, never hang, keep its other session working, and end each round with the fds,
 * shared-memory mappings, /dev/shm files and heap bytes it started with.
 *
 * The peer arms a POSIX timer that delivers SIGKILL to itself, so the kill lands at a random
 * instruction whatever the survivor is doing at that moment. SHMIPC_CHAOS_ITERATIONS sets the
 * kills per role and protocol (default 200; 25 under a sanitizer, whose fork is slow).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ipc_helpers.h"
#include "shmipc.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DEFAULT_ITERATIONS 25
#else
#define DEFAULT_ITERATIONS 200
#endif

/* How long after the peer died the survivor may take to see it: the initialize timeout, and
 * as much again for a loaded machine. */
#define INIT_TIMEOUT_MS 1000
#define BOUND_MS        (2 * INIT_TIMEOUT_MS)
#define MAX_MESSAGE     20000

enum proto { P_V2, P_V3, P_V4_EVENTFD, P_V4_POLLING, P_COUNT };
static const char *const proto_names[] = {"V2", "V3", "V4 eventfd", "V4 polling"};

static int iterations = DEFAULT_ITERATIONS;
static char shm_prefix[64]; /* the file-name prefix under /dev/shm of every session here */
static uint64_t rng = 88172645463325252ull;

static uint64_t next_random(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* A quiet log sink: failed handshakes with dying peers are expected here by the thousand. */
static void quiet_sink(int level, const char *line)
{
    (void)level;
    (void)line;
}

static shmipc_config *make_config(enum proto p)
{
    shmipc_config *cfg;
    char prefix[96];
    snprintf(prefix, sizeof prefix, "/dev/shm/%s", shm_prefix);
    assert_int_equal(shmipc_config_new(&cfg), 0);
    assert_int_equal(shmipc_config_set_buffer_capacity(cfg, 1u << 20), 0);
    assert_int_equal(shmipc_config_set_queue_capacity(cfg, 1024), 0);
    assert_int_equal(shmipc_config_set_path_prefix(cfg, prefix), 0);
    assert_int_equal(shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_INITIALIZE, INIT_TIMEOUT_MS), 0);
    switch (p) {
    case P_V2:
        assert_int_equal(shmipc_config_set_memmap_type(cfg, SHMIPC_MEMMAP_DEVSHM), 0);
        break;
    case P_V3:
        break;
    case P_V4_EVENTFD:
        assert_int_equal(shmipc_config_with_v4_eventfd(cfg), 0);
        break;
    case P_V4_POLLING:
        assert_int_equal(shmipc_config_with_v4_event_queue_polling(cfg, 1000), 0);
        break;
    default:
        fail();
    }
    return cfg;
}

/* ------------------------------------------------------------------------------------ */
/* What the survivor holds                                                              */
/* ------------------------------------------------------------------------------------ */

struct resources {
    int fds;
    int maps;
    int files;
    size_t heap;
};

/*
 * /dev/shm files of this test whose names contain `infix` (NULL: all of them). With
 * `remove`, they are deleted (the leftovers of a peer killed before it handed them over).
 */
static int count_files(const char *infix, int remove)
{
    char path[512];
    int n = 0;
    DIR *d = opendir("/dev/shm");
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, shm_prefix, strlen(shm_prefix)) != 0)
            continue;
        if (infix != NULL && strstr(e->d_name + strlen(shm_prefix), infix) == NULL)
            continue;
        n++;
        snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
        if (remove)
            unlink(path);
    }
    if (d != NULL)
        closedir(d);
    return n;
}

static size_t heap_bytes(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

static struct resources take_resources(void)
{
    struct resources r = {ipc_count_fds(), ipc_count_shm_maps(), count_files(NULL, 0), 0};
    r.heap = heap_bytes();
    return r;
}

/* Takes and closes every session the listener has queued (none when l is NULL). */
static void drain_listener(shmipc_listener *l)
{
    shmipc_session *s;
    while (l != NULL && shmipc_listener_accept(l, 0, &s) == 0)
        shmipc_session_close(s);
}

static int same_resources(const struct resources *a, const struct resources *b)
{
    return a->fds == b->fds && a->maps == b->maps && a->files == b->files && a->heap == b->heap;
}

/*
 * The baseline, once nothing moves any more: a handshake thread of the listener may still
 * hold the socket of a peer that just died (taking and closing what it queued).
 */
static struct resources settled_resources(shmipc_listener *l)
{
    struct resources a = take_resources(), b;
    for (int t = 0; t < 100; t++) {
        drain_listener(l);
        usleep(10000);
        b = take_resources();
        if (same_resources(&a, &b))
            return b;
        a = b;
    }
    return a;
}

/* Each count at most the baseline's. */
static int no_more_resources(const struct resources *a, const struct resources *base)
{
    return a->fds <= base->fds && a->maps <= base->maps && a->files <= base->files &&
           a->heap <= base->heap;
}

/*
 * Handshakes run on the listener's threads: one may still be noticing its dead peer, or have
 * queued the session of a peer that died just after it. Give them up to a second, taking
 * (and closing) what they queued, before comparing. A count below the baseline is no leak:
 * the baseline caught such a handshake still going (a warm-up round's session, two fds of a V4
 * polling one, released later on a loaded machine); the baseline is lowered to it, so a leak
 * is still counted from what the process really holds at rest.
 */
static void check_resources(struct resources *base, shmipc_listener *l, const char *what, int i)
{
    struct resources now = take_resources();
    for (int t = 0; t < 1000 && !same_resources(&now, base); t++) {
        drain_listener(l);
        usleep(1000);
        now = take_resources();
    }
    if (!same_resources(&now, base) && no_more_resources(&now, base)) {
        *base = now;
        return;
    }
    if (!same_resources(&now, base)) {
        print_error("%s, kill %d: fds %d -> %d, shm maps %d -> %d, /dev/shm files %d -> %d, "
                    "heap %zu -> %zu\n",
                    what, i, base->fds, now.fds, base->maps, now.maps, base->files, now.files,
                    base->heap, now.heap);
        fail();
    }
}

/* ------------------------------------------------------------------------------------ */
/* The peer (a child process that dies by its own timer)                                */
/* ------------------------------------------------------------------------------------ */

static void die_after(uint64_t delay_us)
{
    timer_t t;
    struct sigevent ev = {.sigev_notify = SIGEV_SIGNAL, .sigev_signo = SIGKILL};
    struct itimerspec its = {
        .it_value = {(time_t)(delay_us / 1000000), (long)(delay_us % 1000000) * 1000}};
    if (delay_us == 0)
        its.it_value.tv_nsec = 1;
    if (timer_create(CLOCK_MONOTONIC, &ev, &t) != 0 || timer_settime(t, 0, &its, NULL) != 0)
        _exit(3);
}

/* Waits for the SIGKILL: every peer dies of it, whatever happened before. */
static _Noreturn void await_death(void)
{
    for (;;)
        pause();
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(seed + i * 31);
}

/* Reads exactly n bytes of echo and compares them with what fill(seed) wrote. */
static int read_echo(shmipc_stream *st, size_t n, uint32_t seed)
{
    uint8_t want[MAX_MESSAGE];
    fill(want, n, seed);
    size_t got = 0;
    while (got < n) {
        const void *p;
        size_t len;
        int rc = shmipc_stream_read_chunk(st, n - got, &p, &len, 0);
        if (rc < 0)
            return rc;
        if (memcmp(p, want + got, len) != 0)
            return SHMIPC_EPROTO;
        got += len;
    }
    return shmipc_stream_release(st);
}

static _Noreturn void peer_client(const char *address, const shmipc_config *cfg)
{
    shmipc_session *s;
    shmipc_stream *st;
    static uint8_t buf[MAX_MESSAGE];
    if (shmipc_session_connect(address, cfg, &s) != 0 || shmipc_session_open_stream(s, &st) != 0)
        await_death();
    for (uint32_t seed = 1;; seed++) {
        size_t n = 1 + seed * 7919 % MAX_MESSAGE;
        fill(buf, n, seed);
        if (shmipc_stream_write(st, buf, n) != 0 || shmipc_stream_flush(st) != 0 ||
            read_echo(st, n, seed) != 0)
            await_death();
    }
}

static _Noreturn void peer_server(const char *address, const shmipc_config *cfg)
{
    shmipc_listener *l;
    shmipc_session *s;
    shmipc_stream *st;
    if (shmipc_listener_new(address, cfg, &l) != 0 ||
        shmipc_listener_accept(l, SHMIPC_WAIT_FOREVER, &s) != 0 ||
        shmipc_session_accept_stream(s, SHMIPC_WAIT_FOREVER, &st) != 0)
        await_death();
    for (;;) {
        const void *p;
        size_t len;
        if (shmipc_stream_read_chunk(st, 0, &p, &len, 0) != 0 ||
            shmipc_stream_write(st, p, len) != 0 || shmipc_stream_release(st) != 0 ||
            shmipc_stream_flush(st) != 0)
            await_death();
    }
}

/*
 * How long a peer takes from fork to a session the survivor sees, as a moving average: on a
 * loaded machine it ranges from 1 to 30 ms, and the kills must land on both sides of it.
 */
static uint64_t setup_us = 5000;

static void note_setup(uint64_t us)
{
    setup_us = (setup_us * 7 + us) / 8;
}

/* A kill time uniform over two setup times: about half in the set-up, half streaming. */
static uint64_t random_delay_us(void)
{
    uint64_t span = 2 * setup_us < 100000 ? 2 * setup_us : 100000;
    return next_random() / 16 % (span + 1);
}

static pid_t spawn_peer(int server, const char *address, const shmipc_config *cfg, uint64_t delay)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* Nothing of the survivor's: its sessions must see only their own peers go. */
        close_range(3, ~0u, 0);
        die_after(delay);
        if (server)
            peer_server(address, cfg);
        peer_client(address, cfg);
    }
    return pid;
}

/* ------------------------------------------------------------------------------------ */
/* The survivor                                                                         */
/* ------------------------------------------------------------------------------------ */

struct stats {
    int sessions;        /* handshakes that completed on the survivor's side */
    int echoes;          /* messages echoed before the kill */
    int orphans;         /* /dev/shm files of a peer killed before it handed them over */
    uint64_t max_notice; /* longest time from the peer's death to the survivor seeing it */
    int ends[8];         /* how sessions ended: by code, see note_end() */
};

static const int end_codes[] = {SHMIPC_ECONNRESET, SHMIPC_EEOF,  SHMIPC_EPROTO, SHMIPC_EQUEUEFULL,
                                SHMIPC_ETIMEDOUT,  SHMIPC_EPIPE, SHMIPC_ECLOSED};

/* Counts the code that ended a session; codes not listed go to the last slot. */
static void note_end(struct stats *st, int rc)
{
    size_t i = 0;
    while (i < sizeof end_codes / sizeof end_codes[0] && end_codes[i] != rc)
        i++;
    st->ends[i]++;
}

/* Reaps the peer once it is gone; 1 when it is (it must have died of SIGKILL). */
static int reap(pid_t pid, int *reaped, uint64_t *when)
{
    int status;
    if (*reaped)
        return 1;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == 0)
        return 0;
    assert_int_equal(r, pid);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
        print_error("peer %d ended with status %#x, not by SIGKILL\n", (int)pid, status);
        fail();
    }
    *reaped = 1;
    *when = ipc_now_us();
    return 1;
}

/*
 * A session with the peer ended with `rc`. The peer dies `delay` after its timer started, which
 * was after `forked`: a session that ends before then was ended by the survivor's own fault.
 */
static void note_notice(struct stats *st, uint64_t forked, uint64_t delay, int rc)
{
    uint64_t now = ipc_now_us();
    if (now < forked + delay) {
        print_error("a session ended with %s (%s) %llu us before its peer was killed\n",
                    shmipc_errname(rc), shmipc_error_detail(),
                    (unsigned long long)(forked + delay - now));
        fail();
    }
    if (now - (forked + delay) > st->max_notice)
        st->max_notice = now - (forked + delay);
}

static void check_not_hung(int reaped, uint64_t reaped_at, const char *what)
{
    if (reaped && ipc_now_us() - reaped_at > (uint64_t)BOUND_MS * 1000) {
        print_error("%s: the survivor still waits %d ms after its peer died\n", what, BOUND_MS);
        fail();
    }
}

/* One kill with the survivor as the server, on listener `l`. */
static void server_round(shmipc_listener *l, const char *address, const shmipc_config *cfg,
                         struct stats *stats)
{
    shmipc_session *s = NULL;
    shmipc_stream *st = NULL;
    uint64_t reaped_at = 0;
    int reaped = 0, accepted = 0;
    char infix[32];
    /* The last peer's handshake may still be failing on a listener thread: let it end, so
     * that what this round accepts is this round's peer. */
    (void)settled_resources(l);
    uint64_t delay = random_delay_us(), forked = ipc_now_us();
    pid_t pid = spawn_peer(0, address, cfg, delay);
    for (;;) {
        reap(pid, &reaped, &reaped_at);
        check_not_hung(reaped && s != NULL, reaped_at, "server");
        if (s == NULL) {
            int rc = shmipc_listener_accept(l, reaped ? 0 : 5, &s);
            if (rc == 0) {
                accepted = 1;
                stats->sessions++;
                note_setup(ipc_now_us() - forked);
                continue;
            }
            if (reaped)
                break; /* gone, and no client of it is left in the backlog */
            continue;
        }
        int rc;
        if (st == NULL) {
            rc = shmipc_session_accept_stream(s, 5, &st);
            if (rc == 0)
                rc = shmipc_stream_set_timeout(st, SHMIPC_TIMEOUT_READ, 5);
        } else {
            const void *p;
            size_t len;
            rc = shmipc_stream_read_chunk(st, 0, &p, &len, 0);
            if (rc == 0) {
                if ((rc = shmipc_stream_write(st, p, len)) == 0)
                    rc = shmipc_stream_release(st);
                if (rc == 0 && (rc = shmipc_stream_flush(st)) == 0)
                    stats->echoes++;
            }
        }
        if (rc == SHMIPC_ETIMEDOUT || rc == SHMIPC_EAGAIN || rc >= 0)
            continue;
        /* The peer is gone (or broke the protocol while dying): close, then reap. */
        note_notice(stats, forked, delay, rc);
        note_end(stats, rc);
        shmipc_stream_close(st);
        shmipc_session_close(s);
        st = NULL;
        s = NULL;
    }
    /*
     * A V2 client names its files after its pid. Once a handshake completed, the survivor
     * owns them and must have removed them; otherwise the dead peer left them behind and no
     * one can know of them.
     */
    snprintf(infix, sizeof infix, "_%d_", (int)pid);
    int left = count_files(infix, !accepted);
    /* The session accepted may be an earlier peer's: this one's handshake (a listener
     * thread) may still be failing, and removes its files when it has. */
    for (int t = 0; accepted && left != 0 && t < 1000; t++) {
        drain_listener(l);
        usleep(1000);
        left = count_files(infix, 0);
    }
    /*
     * Still there: with handshakes on listener threads the session accepted in this round
     * may have been an earlier peer's, and this peer died inside its own handshake, leaving
     * files no one can know of. Counted (and removed) as orphans; fds, mappings and heap are
     * still checked after every kill.
     */
    if (left != 0)
        left = count_files(infix, 1);
    stats->orphans += left;
}

/* One kill with the survivor as the client of a peer listening at `address`. */
static void client_round(const char *address, const shmipc_config *cfg, struct stats *stats)
{
    static uint8_t buf[MAX_MESSAGE];
    shmipc_session *s = NULL;
    shmipc_stream *st = NULL;
    uint64_t reaped_at = 0, delay = random_delay_us(), forked = ipc_now_us();
    int reaped = 0, rc = 0;
    pid_t pid = spawn_peer(1, address, cfg, delay);
    while (!reap(pid, &reaped, &reaped_at)) {
        if (shmipc_session_connect(address, cfg, &s) == 0)
            break;
        usleep(200); /* not listening yet, or died in the handshake */
    }
    if (s != NULL) {
        stats->sessions++;
        note_setup(ipc_now_us() - forked);
        rc = shmipc_session_open_stream(s, &st);
        if (rc == 0)
            rc = shmipc_stream_set_timeout(st, SHMIPC_TIMEOUT_READ, 5);
        for (uint32_t seed = (uint32_t)next_random(); rc == 0; seed++) {
            size_t n = 1 + seed % MAX_MESSAGE, got = 0;
            fill(buf, n, seed);
            if ((rc = shmipc_stream_write(st, buf, n)) < 0 || (rc = shmipc_stream_flush(st)) < 0)
                break;
            /* The echo may take a while or never come: wait in short reads, watching for a hang. */
            while (rc == 0 && got < n) {
                const void *p;
                size_t len;
                reap(pid, &reaped, &reaped_at);
                check_not_hung(reaped, reaped_at, "client");
                rc = shmipc_stream_read_chunk(st, n - got, &p, &len, 0);
                if (rc == SHMIPC_ETIMEDOUT) {
                    rc = 0;
                    continue;
                }
                if (rc == 0 && memcmp(p, buf + got, len) != 0) {
                    print_error("client: the echo differs from what was sent\n");
                    fail();
                }
                got += rc == 0 ? len : 0;
            }
            if (rc == 0 && (rc = shmipc_stream_release(st)) == 0)
                stats->echoes++;
        }
        note_notice(stats, forked, delay, rc);
        note_end(stats, rc);
        shmipc_stream_close(st);
        shmipc_session_close(s);
    }
    int status;
    if (!reaped) {
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    }
}

/* ------------------------------------------------------------------------------------ */
/* The witness: another session of the survivor, checked after every kill              */
/* ------------------------------------------------------------------------------------ */

struct witness {
    shmipc_session *client; /* our client session to our own listener */
    shmipc_session *server; /* the listener's side of it */
};

static void witness_open(struct witness *w, shmipc_listener *l, const char *address,
                         const shmipc_config *cfg)
{
    ipc_connect_accept(l, address, cfg, &w->client, &w->server);
}

/* One message there and back, on a new stream; both ends are ours, so no thread is needed. */
static void witness_check(struct witness *w, int i)
{
    char msg[32];
    shmipc_stream *c, *s;
    snprintf(msg, sizeof msg, "witness %08d", i);
    assert_int_equal(shmipc_session_status(w->client), 0);
    assert_int_equal(shmipc_session_status(w->server), 0);
    assert_int_equal(shmipc_session_open_stream(w->client, &c), 0);
    ipc_send_text(c, msg);
    assert_int_equal(shmipc_session_accept_stream(w->server, 5000, &s), 0);
    assert_int_equal(shmipc_stream_set_timeout(s, SHMIPC_TIMEOUT_READ, 5000), 0);
    assert_int_equal(shmipc_stream_set_timeout(c, SHMIPC_TIMEOUT_READ, 5000), 0);
    ipc_expect_text(s, msg);
    ipc_send_text(s, msg);
    ipc_expect_text(c, msg);
    shmipc_stream_close(c);
    shmipc_stream_close(s);
    /* Let each side hear of the other's close, so no stream lingers into the next round. */
    shmipc_session_process(w->server);
    shmipc_session_process(w->client);
}

static void witness_close(struct witness *w)
{
    shmipc_session_close(w->client);
    shmipc_session_close(w->server);
}

/* ------------------------------------------------------------------------------------ */
/* Tests                                                                                */
/* ------------------------------------------------------------------------------------ */

static void run(enum proto p, int survivor_is_server)
{
#if defined(__SANITIZE_THREAD__)
    /*
     * There the peer is a listener, which starts handshake threads in a child forked from a
     * threaded process; TSan's runtime does not survive that reliably ("dup thread with used
     * id"), so the child dies of TSan, not of its SIGKILL. The plain and ASan builds run it.
     */
    if (!survivor_is_server)
        skip();
#endif
    char address[128], peer_address[128], what[64];
    shmipc_config *cfg = make_config(p);
    shmipc_listener *l;
    struct witness w = {0};
    struct stats stats = {0};
    struct resources base = {0};
    snprintf(what, sizeof what, "%s, survivor %s", proto_names[p],
             survivor_is_server ? "server" : "client");
    snprintf(address, sizeof address, "unix:@shmipc-chaos-%d-%d", (int)getpid(), (int)p);
    assert_int_equal(shmipc_listener_new(address, cfg, &l), 0);
    witness_open(&w, l, address, cfg);
    uint64_t start = ipc_now_us();
    for (int i = -3; i < iterations; i++) {
        snprintf(peer_address, sizeof peer_address, "unix:@shmipc-chaos-peer-%d-%d", (int)getpid(),
                 i);
        if (survivor_is_server)
            server_round(l, address, cfg, &stats);
        else
            client_round(peer_address, cfg, &stats);
        witness_check(&w, i);
        /* Three rounds warm up what is allocated once (stdio, the thread's error buffer). */
        if (i == -1)
            base = settled_resources(survivor_is_server ? l : NULL);
        else if (i >= 0)
            check_resources(&base, survivor_is_server ? l : NULL, what, i);
    }
    uint64_t took = ipc_now_us() - start;
    print_message("chaos %-10s survivor %-6s: %d kills in %.1f s, %d sessions up before the "
                  "kill, %d echoes, longest notice %.1f ms, %d orphaned peer files; ends:",
                  proto_names[p], survivor_is_server ? "server" : "client", iterations,
                  (double)took / 1e6, stats.sessions, stats.echoes,
                  (double)stats.max_notice / 1000.0, stats.orphans);
    for (size_t k = 0; k <= sizeof end_codes / sizeof end_codes[0]; k++)
        if (stats.ends[k] != 0)
            print_message(" %s %d",
                          k < sizeof end_codes / sizeof end_codes[0] ? shmipc_errname(end_codes[k])
                                                                     : "other",
                          stats.ends[k]);
    print_message("\n");
    witness_close(&w);
    shmipc_listener_close(l);
    shmipc_config_free(cfg);
}

/* A test's state: the protocol, and the role the survivor plays. */
struct chaos_case {
    enum proto p;
    int survivor_is_server;
};

static void run_case(void **state)
{
    const struct chaos_case *c = *state;
    run(c->p, c->survivor_is_server);
}

/* Registers run(p, survivor_is_server) as the test `name`. */
#define chaos_test(name, p, survivor_is_server)                                                    \
    {                                                                                              \
#name, run_case, NULL, NULL, &(struct chaos_case)                                          \
        {                                                                                          \
            p, survivor_is_server                                                                  \
        }                                                                                          \
    }

int main(int argc, char **argv)
{
    (void)argc;
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    /*
     * mallinfo2() counts chunks parked in the per-thread cache as in use, so a freed block can
     * look like a leak. Without the cache its figure is exact: run again without it.
     */
    const char *tunables = getenv("GLIBC_TUNABLES");
    if (tunables == NULL || strstr(tunables, "glibc.malloc.tcache_count=0") == NULL) {
        char value[512];
        snprintf(value, sizeof value, "%s%sglibc.malloc.tcache_count=0",
                 tunables != NULL ? tunables : "", tunables != NULL ? ":" : "");
        setenv("GLIBC_TUNABLES", value, 1);
        execv("/proc/self/exe", argv);
        perror("test_chaos: execv");
        return 1;
    }
#else
    (void)argv;
#endif
    const char *env = getenv("SHMIPC_CHAOS_ITERATIONS");
    if (env != NULL && atoi(env) > 0)
        iterations = atoi(env);
    snprintf(shm_prefix, sizeof shm_prefix, "shmipc-chaos-%d", (int)getpid());
    rng ^= (uint64_t)getpid() << 32 ^ ipc_now_us();
    signal(SIGPIPE, SIG_IGN);
    shmipc_set_log_sink(quiet_sink);
    const struct CMUnitTest tests[] = {
        chaos_test(test_v2_server, P_V2, 1),
        chaos_test(test_v2_client, P_V2, 0),
        chaos_test(test_v3_server, P_V3, 1),
        chaos_test(test_v3_client, P_V3, 0),
        chaos_test(test_v4_eventfd_server, P_V4_EVENTFD, 1),
        chaos_test(test_v4_eventfd_client, P_V4_EVENTFD, 0),
        chaos_test(test_v4_polling_server, P_V4_POLLING, 1),
        chaos_test(test_v4_polling_client, P_V4_POLLING, 0),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
