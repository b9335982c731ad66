/*
 * Description: the SIGBUS guard (core/shm/guard.h). A peer that shrinks the memfd or the
 * /dev/shm file under our mapping ends that session with SHMIPC_EPROTO instead of killing the
 * process; a SIGBUS anywhere else still reaches the handler installed before ours, or the
 * default action. The process-wide parts run in re-executed children, so each starts with the
 * signal dispositions it checks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/proc.h"
#include "ipc_helpers.h"
#include "shm/guard.h"
#include "shm/mapping.h"
#include "shmipc.h"

static char address[128];
static char self_exe[4096];

/* ---------------------------------------------------------------------------------------- */
/* The guard alone                                                                          */
/* ---------------------------------------------------------------------------------------- */

static void test_truncated_mapping_reads_zeros(void **state)
{
    (void)state;
    struct shmipc__mapping m;
    shmipc__mapping_init(&m);
    assert_int_equal(shmipc__mapping_create_memfd(&m, "/sigbus-test", 1u << 20), 0);
    assert_true(shmipc__guard_active());
    volatile uint8_t *p = m.base;
    memset(m.base, 0xa5, m.size);
    assert_int_equal(shmipc__mapping_damaged(&m), 0);
    /* What a hostile peer holding the fd can do: the pages past 4 KiB are gone. */
    assert_int_equal(ftruncate(m.fd, 4096), 0);
    assert_int_equal(p[512 * 1024], 0); /* would be SIGBUS */
    assert_int_equal(shmipc__mapping_damaged(&m), 1);
    /* The whole mapping is private zeros now, the first page too, and writable. */
    assert_int_equal(p[0], 0);
    p[100] = 7;
    assert_int_equal(p[100], 7);
    shmipc__mapping_unmap(&m);
}

static void *touch_far_page(void *arg)
{
    volatile uint8_t *p = arg;
    return (void *)(uintptr_t)p[512 * 1024];
}

/*
 * A library thread (a reactor worker, a listener's handshake) starts with the process signals
 * blocked (common/proc.h) but the faults open: a truncation it touches reaches the guard. With
 * SIGBUS blocked too, as handshake threads had it, Linux killed the whole process instead.
 */
static void test_library_thread_reaches_the_guard(void **state)
{
    (void)state;
    struct shmipc__mapping m;
    pthread_t t;
    sigset_t old;
    void *seen;
    shmipc__mapping_init(&m);
    assert_int_equal(shmipc__mapping_create_memfd(&m, "/sigbus-thread", 1u << 20), 0);
    memset(m.base, 0xa5, m.size);
    assert_int_equal(ftruncate(m.fd, 4096), 0);
    shmipc__thread_signals_block(&old);
    int rc = pthread_create(&t, NULL, touch_far_page, m.base);
    shmipc__thread_signals_restore(&old);
    assert_int_equal(rc, 0);
    assert_int_equal(pthread_join(t, &seen), 0);
    assert_int_equal((uintptr_t)seen, 0);
    assert_int_equal(shmipc__mapping_damaged(&m), 1);
    shmipc__mapping_unmap(&m);
}

static void test_intact_mapping_is_not_damaged(void **state)
{
    (void)state;
    struct shmipc__mapping m;
    shmipc__mapping_init(&m);
    assert_int_equal(shmipc__mapping_create_memfd(&m, "/sigbus-intact", 65536), 0);
    memset(m.base, 1, m.size);
    assert_int_equal(shmipc__mapping_damaged(&m), 0);
    shmipc__mapping_unmap(&m);
    assert_int_equal(shmipc__mapping_damaged(&m), 0); /* an empty mapping never is */
}

/*
 * Child modes (argv[1]), run in a fresh process by run_child():
 *   default: the guard is installed over the default disposition; a SIGBUS on memory it does
 *            not guard must still kill the process with SIGBUS.
 *   chain:   a handler installed before the guard must still receive a SIGBUS on memory the
 *            guard does not guard (it longjmps out and the child exits 0).
 *   off:     SHMIPC_SIGBUS_GUARD=0 keeps the handler away: the guarded mapping kills.
 */
static sigjmp_buf chain_jump;

static void chain_handler(int sig)
{
    (void)sig;
    siglongjmp(chain_jump, 1);
}

/* A mapping of a memfd the guard does not know, then shrunk: the next read is a SIGBUS. */
static volatile uint8_t *unguarded_truncated(void)
{
    int fd = memfd_create("sigbus-unguarded", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, 1 << 16) != 0)
        _exit(90);
    uint8_t *p = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED || ftruncate(fd, 0) != 0)
        _exit(91);
    return p;
}

/*
 * A handler like Python's faulthandler: it restores the handler it replaced (ours) and
 * re-raises, expecting the default action to follow.
 */
static struct sigaction reraise_prev;

static void reraise_handler(int sig)
{
    sigaction(SIGBUS, &reraise_prev, NULL);
    raise(sig);
}

/* Probes `p` from `depth` frames down; returns 1 when the probe's handler jumped back. */
static sigjmp_buf probe_jump;

static void probe_handler(int sig)
{
    (void)sig;
    siglongjmp(probe_jump, 1);
}

static int __attribute__((noinline)) probe(volatile uint8_t *p, int depth)
{
    volatile char pad[256];
    pad[0] = (char)depth;
    if (depth > 0)
        return probe(p, depth - 1) + pad[0] * 0;
    if (sigsetjmp(probe_jump, 1) != 0)
        return 1;
    return p[100] * 0;
}

static int child_more(const char *mode, struct shmipc__mapping *m)
{
    struct shmipc__mapping second;
    shmipc__mapping_init(&second);
    if (strcmp(mode, "reraise") == 0) {
        /* Guard first, then the re-raising handler, then a second mapping: ours in front. */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = reraise_handler;
        if (sigaction(SIGBUS, &sa, &reraise_prev) != 0 ||
            shmipc__mapping_create_memfd(&second, "/sigbus-second", 65536) < 0)
            return 97;
        alarm(10);                              /* a loop would end here, with SIGALRM */
        return unguarded_truncated()[100] + 98; /* dies here, of SIGBUS, once */
    }
    if (strcmp(mode, "longjmp") == 0) {
        /* An earlier handler that longjmps out, probed twice, the second time deeper. */
        volatile uint8_t *p = unguarded_truncated();
        return probe(p, 0) == 1 && probe(p, 8) == 1 ? 0 : 99;
    }
    if (strcmp(mode, "ignored") == 0) {
        /* SIGBUS was ignored before the guard: one sent with kill() still is. */
        kill(getpid(), SIGBUS);
        return 0;
    }
    (void)m;
    return 100;
}

static int child_main(const char *mode)
{
    struct shmipc__mapping m;
    shmipc__mapping_init(&m);
    if (strcmp(mode, "chain") == 0 || strcmp(mode, "longjmp") == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = strcmp(mode, "chain") == 0 ? chain_handler : probe_handler;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, NULL) != 0)
            return 92;
    }
    /* The first mapping installs the guard. */
    if (shmipc__mapping_create_memfd(&m, "/sigbus-child", 65536) < 0)
        return 93;
    if (strcmp(mode, "off") == 0) {
        if (shmipc__guard_active() || ftruncate(m.fd, 0) != 0)
            return 94;
        return ((volatile uint8_t *)m.base)[8192]; /* dies here */
    }
    if (strcmp(mode, "ignored") == 0)
        signal(SIGBUS, SIG_IGN); /* after the first mapping: it becomes ours to chain to */
    if (strcmp(mode, "ignored") == 0 &&
        shmipc__mapping_create_memfd(&(struct shmipc__mapping){0}, "/sigbus-ign", 4096) < 0)
        return 96;
    if (!shmipc__guard_active())
        return 95;
    if (strcmp(mode, "default") != 0 && strcmp(mode, "chain") != 0)
        return child_more(mode, &m);
    volatile uint8_t *p = unguarded_truncated();
    if (strcmp(mode, "chain") == 0 && sigsetjmp(chain_jump, 1) != 0)
        return 0;       /* the earlier handler ran */
    return p[100] + 96; /* dies here (default), or jumps back above (chain) */
}

/* Runs this program in child mode `mode`; returns its wait status. */
static int run_child(const char *mode, const char *guard_knob)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (guard_knob != NULL)
            setenv("SHMIPC_SIGBUS_GUARD", guard_knob, 1);
        /* A sanitizer's own report of the SIGBUS is not what this checks. */
        setenv("ASAN_OPTIONS", "handle_sigbus=0:detect_leaks=0", 1);
        setenv("TSAN_OPTIONS", "handle_sigbus=0", 1);
        execl(self_exe, self_exe, "--child", mode, (char *)NULL);
        _exit(127);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}

static void test_unguarded_sigbus_still_kills(void **state)
{
    (void)state;
    int status = run_child("default", NULL);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGBUS);
}

static void test_earlier_handler_is_chained(void **state)
{
    (void)state;
    int status = run_child("chain", NULL);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_reraising_handler_does_not_loop(void **state)
{
    (void)state;
    int status = run_child("reraise", NULL);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGBUS);
}

static void test_longjmp_handler_chained_again_deeper(void **state)
{
    (void)state;
    int status = run_child("longjmp", NULL);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_ignored_sigbus_stays_ignored(void **state)
{
    (void)state;
    int status = run_child("ignored", NULL);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_knob_turns_the_guard_off(void **state)
{
    (void)state;
    int status = run_child("off", "0");
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGBUS);
}

/* ---------------------------------------------------------------------------------------- */
/* Sessions whose peer truncates the memory                                                 */
/* ---------------------------------------------------------------------------------------- */

/* The fd (of this process) whose memfd name contains `part`, or -1. */
static int memfd_named(const char *part)
{
    char link[300], target[512];
    int found = -1;
    DIR *d = opendir("/proc/self/fd");
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL && found < 0;) {
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n <= 0)
            continue;
        target[n] = '\0';
        if (strstr(target, "/memfd:") != NULL && strstr(target, part) != NULL)
            found = atoi(e->d_name);
    }
    if (d != NULL)
        closedir(d);
    return found;
}

/* The file under /dev/shm whose name starts with `prefix`'s base name and contains `part`. */
static void devshm_named(const char *prefix, const char *part, char *out, size_t cap)
{
    const char *base = strrchr(prefix, '/') + 1;
    DIR *d = opendir("/dev/shm");
    out[0] = '\0';
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL && out[0] == '\0';)
        if (strncmp(e->d_name, base, strlen(base)) == 0 && strstr(e->d_name, part) != NULL)
            snprintf(out, cap, "/dev/shm/%s", e->d_name);
    if (d != NULL)
        closedir(d);
}

/* Shrinks the peer's memory: the memfd named `part` (V3) or the file `prefix`...`part` (V2). */
static void truncate_memory(int memmap, const char *prefix, const char *part)
{
    if (memmap == SHMIPC_MEMMAP_MEMFD) {
        int fd = memfd_named(part);
        assert_true(fd >= 0);
        assert_int_equal(ftruncate(fd, 0), 0);
        return;
    }
    char path[512];
    devshm_named(prefix, part, path, sizeof path);
    assert_true(path[0] != '\0');
    assert_int_equal(truncate(path, 0), 0);
}

struct pair {
    shmipc_config *cfg;
    shmipc_listener *l;
    shmipc_session *client, *server;
    shmipc_stream *cs, *ss;
    char prefix[128];
    char address[160];
};

/* A client and a server session of this process, with one stream that has carried a message. */
static void pair_open(struct pair *p, int memmap)
{
    const void *data;
    memset(p, 0, sizeof *p);
    snprintf(p->prefix, sizeof p->prefix, "/dev/shm/shmipc-sigbus-%ld-%d", (long)getpid(), memmap);
    static int pairs;
    snprintf(p->address, sizeof p->address, "%s-%d", address, ++pairs);
    assert_int_equal(shmipc_config_new(&p->cfg), 0);
    assert_int_equal(shmipc_config_set_buffer_capacity(p->cfg, 1u << 20), 0);
    assert_int_equal(shmipc_config_set_path_prefix(p->cfg, p->prefix), 0);
    assert_int_equal(shmipc_config_set_memmap_type(p->cfg, memmap), 0);
    assert_int_equal(shmipc_listener_new(p->address, NULL, &p->l), 0);
    ipc_connect_accept(p->l, p->address, p->cfg, &p->client, &p->server);
    assert_int_equal(shmipc_session_version(p->client), memmap == SHMIPC_MEMMAP_MEMFD ? 3 : 2);
    assert_int_equal(shmipc_session_open_stream(p->client, &p->cs), 0);
    assert_int_equal(shmipc_stream_write(p->cs, "ping", 4), 0);
    assert_int_equal(shmipc_stream_flush(p->cs), 0);
    assert_int_equal(shmipc_session_accept_stream(p->server, 5000, &p->ss), 0);
    assert_int_equal(shmipc_stream_read_exact_bytes(p->ss, 4, &data, 0), 0);
    assert_memory_equal(data, "ping", 4);
    assert_int_equal(shmipc_stream_release(p->ss), 0);
}

static void pair_close(struct pair *p)
{
    shmipc_stream_close(p->cs);
    shmipc_stream_close(p->ss);
    shmipc_session_close(p->client);
    shmipc_session_close(p->server);
    shmipc_listener_close(p->l);
    shmipc_config_free(p->cfg);
}

static void assert_truncation_error(int rc)
{
    assert_int_equal(rc, SHMIPC_EPROTO);
    assert_non_null(strstr(shmipc_error_detail(), "shrank"));
}

/* The writer fills slices of a truncated buffer: its flush ends its session. */
static void writer_sees_truncation(int memmap)
{
    static uint8_t big[256 * 1024];
    const void *data;
    struct pair p;
    struct ipc_held held = ipc_held_now();
    pair_open(&p, memmap);
    truncate_memory(memmap, p.prefix, "_buffer");
    memset(big, 0x5a, sizeof big);
    int rc = shmipc_stream_write(p.cs, big, sizeof big);
    if (rc == 0)
        rc = shmipc_stream_flush(p.cs);
    assert_truncation_error(rc);
    /* The session is over for every later call, and the peer learns it from the socket. */
    rc = shmipc_stream_write(p.cs, "x", 1);
    assert_int_not_equal(rc == 0 ? shmipc_stream_flush(p.cs) : rc, 0);
    rc = shmipc_stream_read_exact_bytes(p.ss, 1, &data, 0);
    assert_true(rc == SHMIPC_ECONNRESET || rc == SHMIPC_EEOF || rc == SHMIPC_EPROTO);
    pair_close(&p);
    ipc_assert_held(&held);
}

/* The reader drains a truncated queue: its read ends its session. */
static void reader_sees_truncation(int memmap)
{
    const void *data;
    struct pair p;
    struct ipc_held held = ipc_held_now();
    pair_open(&p, memmap);
    assert_int_equal(shmipc_stream_write(p.cs, "pong", 4), 0);
    assert_int_equal(shmipc_stream_flush(p.cs), 0);
    truncate_memory(memmap, p.prefix, "_queue_");
    assert_truncation_error(shmipc_stream_read_exact_bytes(p.ss, 4, &data, 0));
    assert_int_equal(shmipc_session_accept_stream(p.server, 0, &(shmipc_stream *){NULL}),
                     SHMIPC_EPROTO);
    pair_close(&p);
    ipc_assert_held(&held);
}

static void test_v3_writer_sees_truncated_buffer(void **state)
{
    (void)state;
    writer_sees_truncation(SHMIPC_MEMMAP_MEMFD);
}

static void test_v3_reader_sees_truncated_queue(void **state)
{
    (void)state;
    reader_sees_truncation(SHMIPC_MEMMAP_MEMFD);
}

static void test_v2_writer_sees_truncated_buffer(void **state)
{
    (void)state;
    writer_sees_truncation(SHMIPC_MEMMAP_DEVSHM);
}

static void test_v2_reader_sees_truncated_queue(void **state)
{
    (void)state;
    reader_sees_truncation(SHMIPC_MEMMAP_DEVSHM);
}

struct blocked_read {
    shmipc_stream *st;
    int rc;
    char detail[256];
};

static void *blocked_read_main(void *arg)
{
    struct blocked_read *b = arg;
    const void *data;
    b->rc = shmipc_stream_read_exact_bytes(b->st, 10, &data, 0);
    snprintf(b->detail, sizeof b->detail, "%s", shmipc_error_detail());
    return NULL;
}

/*
 * The fault happens outside the library (the application touches bytes it was handed): the
 * guard shuts the session's socket, so a reader asleep in the library wakes with the cause.
 */
static void test_blocked_reader_wakes_on_outside_fault(void **state)
{
    (void)state;
    const void *data;
    struct pair p;
    pthread_t t;
    pair_open(&p, SHMIPC_MEMMAP_MEMFD);
    assert_int_equal(shmipc_stream_write(p.cs, "held", 4), 0);
    assert_int_equal(shmipc_stream_flush(p.cs), 0);
    assert_int_equal(shmipc_stream_read_exact_bytes(p.ss, 4, &data, 0), 0);
    /* The server holds those bytes and waits for more on the same stream. */
    struct blocked_read b = {.st = p.ss, .rc = 1};
    assert_int_equal(pthread_create(&t, NULL, blocked_read_main, &b), 0);
    usleep(100 * 1000); /* the server's reader is asleep in the library */
    truncate_memory(SHMIPC_MEMMAP_MEMFD, p.prefix, "_buffer");
    assert_int_equal(*(const volatile uint8_t *)data, 0); /* the held bytes: zeros now */
    uint64_t start = ipc_now_ms();
    pthread_join(t, NULL);
    assert_true(ipc_now_ms() - start < 3000);
    assert_int_equal(b.rc, SHMIPC_EPROTO);
    assert_non_null(strstr(b.detail, "shrank"));
    pair_close(&p);
}

/* Only the data pages go (the first page with the list headers stays): the read says so. */
static void test_partial_truncation_fails_the_read(void **state)
{
    (void)state;
    static uint8_t big[30000]; /* one slice of the 64 KiB class, past the first page */
    const void *data;
    struct pair p;
    pair_open(&p, SHMIPC_MEMMAP_MEMFD);
    memset(big, 0x33, sizeof big);
    assert_int_equal(shmipc_stream_write(p.cs, big, sizeof big), 0);
    assert_int_equal(shmipc_stream_flush(p.cs), 0);
    int fd = memfd_named("_buffer");
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 4096), 0);
    assert_truncation_error(shmipc_stream_read_exact_bytes(p.ss, sizeof big, &data, 0));
    pair_close(&p);
}

/*
 * Truncation at a random moment while both sides stream: a client thread sends messages and
 * checks their echoes, a server thread echoes, and the memory goes (buffer or queue, to 0 or
 * to one page) wherever they are. Both must end with an error within the read timeout's
 * reach, never crash or hang, and leave nothing behind. An echo that reads as zeros is the
 * documented race (bytes already handed out); the next call must then fail.
 */
#define STRESS_MSG 20000

struct streamer {
    shmipc_stream *st;
    int client;
    int rc;
    int rounds; /* echoes completed */
};

static void *stream_main(void *arg)
{
    struct streamer *x = arg;
    static __thread uint8_t msg[STRESS_MSG];
    const void *data;
    memset(msg, 0x5c, sizeof msg);
    for (;;) {
        if (x->client) {
            if ((x->rc = shmipc_stream_write(x->st, msg, sizeof msg)) < 0 ||
                (x->rc = shmipc_stream_flush(x->st)) < 0 ||
                (x->rc = shmipc_stream_read_exact_bytes(x->st, sizeof msg, &data, 0)) < 0)
                return NULL;
            (void)memcmp(data, msg, sizeof msg); /* zeros after a late truncation: allowed */
        } else {
            if ((x->rc = shmipc_stream_read_exact_bytes(x->st, sizeof msg, &data, 0)) < 0 ||
                (x->rc = shmipc_stream_write(x->st, data, sizeof msg)) < 0 ||
                (x->rc = shmipc_stream_flush(x->st)) < 0)
                return NULL;
        }
        if ((x->rc = shmipc_stream_release(x->st)) < 0)
            return NULL;
        __atomic_fetch_add(&x->rounds, 1, __ATOMIC_RELAXED);
    }
}

static void join_within(pthread_t t, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    assert_int_equal(pthread_timedjoin_np(t, NULL, &ts), 0); /* else: a hang */
}

static void test_truncation_at_random_moments(void **state)
{
    (void)state;
    struct ipc_held held = ipc_held_now();
    unsigned seed = (unsigned)getpid();
    long exchanged = 0;
    for (int round = 0; round < 40; round++) {
        struct pair p;
        pthread_t tc, ts;
        int memmap = round % 4 < 2 ? SHMIPC_MEMMAP_MEMFD : SHMIPC_MEMMAP_DEVSHM;
        pair_open(&p, memmap);
        struct streamer c = {.st = p.cs, .client = 1}, sv = {.st = p.ss, .client = 0};
        assert_int_equal(pthread_create(&ts, NULL, stream_main, &sv), 0);
        assert_int_equal(pthread_create(&tc, NULL, stream_main, &c), 0);
        /*
         * The truncation must hit a session at work: wait for its first echo (under TSan on
         * a busy machine the threads can take longer to start than the random delay below).
         */
        for (int i = 0; i < 5000 && __atomic_load_n(&c.rounds, __ATOMIC_RELAXED) == 0; i++)
            usleep(1000);
        assert_true(__atomic_load_n(&c.rounds, __ATOMIC_RELAXED) > 0);
        usleep((useconds_t)(rand_r(&seed) % 3000));
        const char *part = round % 2 ? "_queue_" : "_buffer";
        if (memmap == SHMIPC_MEMMAP_MEMFD) {
            int fd = memfd_named(part);
            assert_true(fd >= 0);
            assert_int_equal(ftruncate(fd, rand_r(&seed) % 2 ? 0 : 4096), 0);
        } else {
            truncate_memory(memmap, p.prefix, part);
        }
        join_within(tc, 5000);
        join_within(ts, 5000);
        /* One side, at least, saw the truncation itself; the other may only see its peer go. */
        assert_true(c.rc == SHMIPC_EPROTO || sv.rc == SHMIPC_EPROTO);
        assert_true(c.rc == SHMIPC_EPROTO || c.rc == SHMIPC_ECONNRESET || c.rc == SHMIPC_EEOF);
        assert_true(sv.rc == SHMIPC_EPROTO || sv.rc == SHMIPC_ECONNRESET || sv.rc == SHMIPC_EEOF);
        exchanged += c.rounds;
        pair_close(&p);
    }
    assert_true(exchanged >= 40); /* every truncation hit a session that had exchanged data */
    ipc_assert_held(&held);
}

/* Other sessions of the process go on working after one was hit. */
static void test_other_sessions_unaffected(void **state)
{
    (void)state;
    const void *data;
    struct pair hit, other;
    pair_open(&other, SHMIPC_MEMMAP_MEMFD);
    pair_open(&hit, SHMIPC_MEMMAP_DEVSHM);
    truncate_memory(SHMIPC_MEMMAP_DEVSHM, hit.prefix, "_queue_");
    int rc = shmipc_stream_write(hit.cs, "dead", 4);
    assert_int_not_equal(rc == 0 ? shmipc_stream_flush(hit.cs) : rc, 0);
    assert_int_equal(shmipc_stream_write(other.cs, "live", 4), 0);
    assert_int_equal(shmipc_stream_flush(other.cs), 0);
    assert_int_equal(shmipc_stream_read_exact_bytes(other.ss, 4, &data, 0), 0);
    assert_memory_equal(data, "live", 4);
    pair_close(&hit);
    pair_close(&other);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--child") == 0)
        return child_main(argv[2]);
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    if (n <= 0)
        return 1;
    self_exe[n] = '\0';
    snprintf(address, sizeof address, "unix:/tmp/shmipc-test-sigbus-%ld.sock", (long)getpid());
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_truncated_mapping_reads_zeros),
        cmocka_unit_test(test_intact_mapping_is_not_damaged),
        cmocka_unit_test(test_library_thread_reaches_the_guard),
        cmocka_unit_test(test_unguarded_sigbus_still_kills),
        cmocka_unit_test(test_earlier_handler_is_chained),
        cmocka_unit_test(test_reraising_handler_does_not_loop),
        cmocka_unit_test(test_longjmp_handler_chained_again_deeper),
        cmocka_unit_test(test_ignored_sigbus_stays_ignored),
        cmocka_unit_test(test_knob_turns_the_guard_off),
        cmocka_unit_test(test_v3_writer_sees_truncated_buffer),
        cmocka_unit_test(test_v3_reader_sees_truncated_queue),
        cmocka_unit_test(test_v2_writer_sees_truncated_buffer),
        cmocka_unit_test(test_v2_reader_sees_truncated_queue),
        cmocka_unit_test(test_other_sessions_unaffected),
        cmocka_unit_test(test_blocked_reader_wakes_on_outside_fault),
        cmocka_unit_test(test_partial_truncation_fails_the_read),
        cmocka_unit_test(test_truncation_at_random_moments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
