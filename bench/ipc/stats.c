/*
 * shmipc-bench ipc, statistics: clocks and CPU accounting (client and echo server), percentiles
 * and the medians of the rounds, the idle CPU of each transport and of a watched V4 polling
 * session, and the memcpy floor.
 */
#include "ipc_bench.h"

/* The local echo server's CPU-time clock (clock_getcpuclockid), when the kernel gives it. */
clockid_t server_clock;
int server_clock_ok;

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t clock_ns(clockid_t clk)
{
    struct timespec ts;
    if (clock_gettime(clk, &ts) != 0)
        return UINT64_MAX;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* CPU time this process (the client: one thread) has used, user and system. */
uint64_t client_cpu_ns(void)
{
    return clock_ns(CLOCK_PROCESS_CPUTIME_ID);
}

/* The echo server's state letter from /proc/PID/stat ('R' running, 'S' asleep...); 0 if
 * unknown. */
/* The fields of the echo server's /proc/PID/stat after its command (which ends at the last
 * ')'), from the state (field 3) on, into buf; NULL if unreadable. */
static const char *server_stat(char *buf, size_t cap)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)server_pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    return p != NULL && p[1] == ' ' ? p + 2 : NULL;
}

static char server_state(void)
{
    char buf[1024];
    const char *p = server_stat(buf, sizeof buf);
    return p != NULL ? p[0] : 0;
}

/*
 * The echo server's CPU time once it has gone to sleep (its spin given up; at most 200 ms).
 * Its CPU-time clock, read from another process, counts a running process's time only up to
 * the scheduler's last update of it: a server that spins without a break was read, on this
 * VM, as having used no CPU at all (0.00 µs a round trip in short runs). A process that went
 * to sleep was updated when it did.
 */
uint64_t server_cpu_settled_ns(void)
{
    if (server_pid <= 0)
        return UINT64_MAX;
    uint64_t end = now_ns() + 200 * 1000000ull;
    struct timespec nap = {0, 100000};
    while (server_state() == 'R' && now_ns() < end)
        nanosleep(&nap, NULL);
    return server_cpu_ns();
}

/*
 * CPU time the local echo server (a forked child) has used, user and system: its CPU-time
 * clock, read from here, to the nanosecond; where the kernel refuses that, utime + stime
 * from /proc/PID/stat (in clock ticks, usually 10 ms). UINT64_MAX without a local server.
 */
uint64_t server_cpu_ns(void)
{
    if (server_pid <= 0)
        return UINT64_MAX;
    if (server_clock_ok) {
        uint64_t v = clock_ns(server_clock);
        if (v != UINT64_MAX)
            return v;
    }
    char buf[1024];
    const char *p = server_stat(buf, sizeof buf);
    unsigned long long ut, st;
    /* From the state (field 3) on: utime is field 14, stime 15. */
    if (p == NULL ||
        sscanf(p, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return UINT64_MAX;
    long hz = sysconf(_SC_CLK_TCK);
    return (ut + st) * (1000000000ull / (uint64_t)(hz > 0 ? hz : 100));
}

const char *const pct_key[NPCT] = {"p50", "p90", "p99", "p99_9", "max"};
const unsigned pct_permille[NPCT] = {500, 900, 990, 999, 1000};

int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/*
 * What watching one idle V4 polling session costs the echo server: its CPU time over a quiet
 * spell, as a fraction of one CPU, with the polling session watched and without (the baseline:
 * every other session idle). -1 when not measured.
 */
double idle_watched = -1, idle_unwatched = -1;
int idle_ms;

struct lat_cell *lat_at(struct results *r, int si, int t, int round)
{
    return &r->lat[((size_t)si * T_COUNT + (size_t)t) * MAX_ROUNDS + (size_t)round];
}

struct par_cell *par_at(struct results *r, int si, int ci, int t, int round)
{
    return &r->par[(((size_t)si * MAX_COUNTS + (size_t)ci) * T_COUNT + (size_t)t) * MAX_ROUNDS +
                   (size_t)round];
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    if (n == 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Median over the rounds of one latency figure; 0 when no round measured it. */
double lat_median(struct results *r, int si, int t, int p)
{
    double v[MAX_ROUNDS];
    int n = 0;
    for (int k = 0; k < r->rounds_done; k++)
        if (lat_at(r, si, t, k)->done)
            v[n++] = lat_at(r, si, t, k)->us[p];
    return median(v, n);
}

double par_median(struct results *r, int si, int ci, int t, int mib)
{
    double v[MAX_ROUNDS];
    int n = 0;
    for (int k = 0; k < r->rounds_done; k++) {
        struct par_cell *pc = par_at(r, si, ci, t, k);
        if (pc->done)
            v[n++] = mib ? pc->mibps : pc->rtps;
    }
    return median(v, n);
}

/*
 * What an idle session costs, per transport: one round trip, then the CPU time of both
 * processes over idle_ms of quiet (as a share of one CPU). The other sessions have been quiet
 * since the rounds, so the window holds what this transport's last message leaves behind: a
 * spin of at most the budget, then sleep. -1 when not measured.
 */
double idle_share[T_COUNT][2]; /* [t][0] client, [t][1] server */
int idle_window_ms;

int measure_idle_after(const struct opts *o, const struct client *c)
{
    size_t size = o->sizes[0];
    struct chan *ch = chans_open(c, 1, size);
    if (ch == NULL)
        return -1;
    if (round_trip(c, ch, size, 0, expected_sum[0], 1) < 0) {
        chans_close(c, ch, 1);
        return -1;
    }
    uint64_t c0 = client_cpu_ns(), s0 = server_cpu_ns(), t0 = now_ns();
    struct timespec ts = {o->idle_ms / 1000, (long)(o->idle_ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !interrupted)
        ;
    uint64_t s1 = server_cpu_ns(), c1 = client_cpu_ns(), t1 = now_ns();
    chans_close(c, ch, 1);
    double span = (double)(t1 - t0);
    idle_share[c->t][0] = (double)(c1 - c0) / span;
    idle_share[c->t][1] =
        s0 == UINT64_MAX || s1 == UINT64_MAX || s1 < s0 ? -1.0 : (double)(s1 - s0) / span;
    return 0;
}

/*
 * The memcpy floor of a large round trip: a payload is copied once into shared memory by the
 * client and read once on the way back (the echo forwards the slices untouched), so a round
 * trip cannot beat two passes over its bytes. Measured once, 1 MiB between two buffers that
 * stay in cache as they would in the benchmark's loop; the median of 64 copies.
 */
double memcpy_gibps = -1;

void measure_memcpy(void)
{
    const size_t n = 1u << 20;
    uint8_t *a = malloc(n), *b = malloc(n);
    uint64_t t[64];
    if (a == NULL || b == NULL) {
        free(a);
        free(b);
        return;
    }
    memset(a, 1, n);
    memset(b, 2, n);
    for (int i = 0; i < 64; i++) {
        uint64_t t0 = now_ns();
        memcpy(i & 1 ? a : b, i & 1 ? b : a, n);
        __asm__ __volatile__("" ::"r"(a), "r"(b) : "memory");
        t[i] = now_ns() - t0;
    }
    qsort(t, 64, sizeof t[0], cmp_u64);
    if (t[32] > 0)
        memcpy_gibps = (double)n / (double)t[32] * 1e9 / (double)(1u << 30);
    free(a);
    free(b);
}

/*
 * The wakeup floor of a small round trip without spinning: two processes, pinned as the
 * client and the echo server are, pass a token back and forth through two eventfds with
 * blocking reads, so a round trip is exactly two cross-process wakeups and four system calls,
 * with no payload and no protocol. A transport whose waiters sleep cannot beat it; only
 * spinning (no wakeup at all) does. The median of 2000 round trips after 200 of warm-up.
 */
double wake_floor_us = -1;

void measure_wake_floor(const struct env *e)
{
    enum { WARM = 200, N = 2000 };
    int ping = eventfd(0, EFD_CLOEXEC), pong = eventfd(0, EFD_CLOEXEC);
    uint64_t *t = malloc(N * sizeof *t);
    pid_t pid = -1;
    int done = 0;
    if (ping < 0 || pong < 0 || t == NULL)
        goto out;
    if ((pid = fork()) == 0) {
        uint64_t v;
        if (e->pinned && pin_to(e->server_cpu) < 0)
            _exit(1);
        for (int i = 0; i < WARM + N; i++)
            if (read(ping, &v, sizeof v) != sizeof v || write(pong, &v, sizeof v) != sizeof v)
                _exit(1);
        _exit(0);
    }
    if (pid < 0)
        goto out;
    for (int i = 0; i < WARM + N; i++) {
        uint64_t v = 1, t0 = now_ns();
        if (write(ping, &v, sizeof v) != sizeof v || read(pong, &v, sizeof v) != sizeof v)
            goto out;
        if (i >= WARM)
            t[i - WARM] = now_ns() - t0;
    }
    done = 1;
    qsort(t, N, sizeof t[0], cmp_u64);
    wake_floor_us = (double)t[N / 2] / 1e3;
out:
    if (pid > 0) {
        if (!done)
            kill(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    if (ping >= 0)
        close(ping);
    if (pong >= 0)
        close(pong);
    free(t);
}

/*
 * The spin floor of a small round trip: two processes, pinned as the client and the echo
 * server are, ping-pong a 64 B message through one shared mapping, each spinning (with the
 * CPU's pause hint) on the other's sequence word: the client writes the payload and stores
 * the sequence with release, the echo waits for it with acquire loads, copies the payload to
 * its own line and publishes it the same way. No library, no system call, no lock: what two
 * cache-line transfers between the two CPUs cost, plus the copies. Over as many round trips
 * as the 64 B one-stream cell (a tenth of that, at least 20, before as warm-up). On a VM the
 * tail is mostly the hypervisor taking a vCPU away.
 */
double spin_floor_us[NPCT] = {-1, -1, -1, -1, -1};
int spin_floor_samples;

/* One direction of the ping-pong, alone on its cache lines. */
struct spin_line {
    _Alignas(64) uint64_t seq;
    uint8_t payload[SPIN_FLOOR_SIZE];
};

static inline void spin_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("isb" ::: "memory");
#endif
}

/*
 * Waits until *seq is `want` (acquire). Gives up after SPIN_FLOOR_GIVE_UP_NS, looking at the
 * clock every 1024 turns only, so that the loop is a load and a pause. Returns 0 or -1.
 */
#define SPIN_FLOOR_GIVE_UP_NS (5ull * 1000000000u)
static int spin_until(const uint64_t *seq, uint64_t want)
{
    uint64_t t0 = 0;
    for (unsigned i = 1;; i++) {
        if (__atomic_load_n(seq, __ATOMIC_ACQUIRE) == want)
            return 0;
        if ((i & 1023) == 0) {
            uint64_t now = now_ns();
            if (t0 == 0)
                t0 = now;
            else if (now - t0 > SPIN_FLOOR_GIVE_UP_NS || interrupted)
                return -1;
        }
        spin_pause();
    }
}

void measure_spin_floor(const struct opts *o, const struct env *e)
{
    int samples = samples_for(o, SPIN_FLOOR_SIZE);
    int warm = samples / 10 > 20 ? samples / 10 : 20;
    struct spin_line *ln =
        mmap(NULL, 2 * sizeof *ln, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    uint64_t *t = malloc((size_t)samples * sizeof *t);
    pid_t pid = -1;
    int done = 0;
    if (ln == MAP_FAILED || t == NULL)
        goto out;
    struct spin_line *ping = &ln[0], *pong = &ln[1];
    if ((pid = fork()) == 0) {
        if (e->pinned && pin_to(e->server_cpu) < 0)
            _exit(1);
        for (uint64_t i = 1; i <= (uint64_t)(warm + samples); i++) {
            if (spin_until(&ping->seq, i) < 0)
                _exit(1);
            memcpy(pong->payload, ping->payload, SPIN_FLOOR_SIZE);
            __atomic_store_n(&pong->seq, i, __ATOMIC_RELEASE);
        }
        _exit(0);
    }
    if (pid < 0)
        goto out;
    for (uint64_t i = 1; i <= (uint64_t)(warm + samples); i++) {
        /* Consecutive messages differ, as the benchmark's do. */
        const uint8_t *msg = pattern + i % PATTERN_SLACK;
        uint64_t t0 = now_ns();
        memcpy(ping->payload, msg, SPIN_FLOOR_SIZE);
        __atomic_store_n(&ping->seq, i, __ATOMIC_RELEASE);
        if (spin_until(&pong->seq, i) < 0)
            goto out;
        int same = memcmp(pong->payload, msg, SPIN_FLOOR_SIZE) == 0;
        uint64_t t1 = now_ns();
        if (!same) {
            fprintf(stderr, "shmipc-bench: spin floor: the echo differs from the message\n");
            goto out;
        }
        if (i > (uint64_t)warm)
            t[i - 1 - (uint64_t)warm] = t1 - t0;
    }
    done = 1;
    qsort(t, (size_t)samples, sizeof *t, cmp_u64);
    for (int p = 0; p < NPCT; p++) {
        size_t k = ((size_t)samples * pct_permille[p] + 999) / 1000;
        spin_floor_us[p] = (double)t[(k ? k : 1) - 1] / 1000.0;
    }
    spin_floor_samples = samples;
out:
    if (pid > 0) {
        if (!done)
            kill(pid, SIGKILL);
        int st = 0;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
        if (done && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
            spin_floor_us[P50] = -1;
            spin_floor_samples = 0;
        }
    }
    if (ln != MAP_FAILED)
        munmap(ln, 2 * sizeof *ln);
    free(t);
}

/* The echo server's CPU time over `ms` of quiet, as a fraction of one CPU; -1 if unknown. */
static double idle_server_share(int ms)
{
    uint64_t s0 = server_cpu_ns(), t0 = now_ns();
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !interrupted)
        ;
    uint64_t s1 = server_cpu_ns(), t1 = now_ns();
    if (s0 == UINT64_MAX || s1 == UINT64_MAX || s1 < s0 || t1 <= t0)
        return -1;
    return (double)(s1 - s0) / (double)(t1 - t0);
}

/*
 * What an idle V4 polling session costs the server: its CPU share while every session is
 * quiet, with the polling session watched (its timer firing every interval) and without.
 */
int measure_idle(const struct opts *o, struct local *lc)
{
    idle_ms = o->quick ? 200 : 1000;
    if (server_watch_polling(lc, 0) < 0)
        return -1;
    /* Let the server finish with the warm-up's streams (it probes quiet ones every 50 ms). */
    idle_server_share(2 * (int)(STALE_NS / 1000000u));
    double off = idle_server_share(idle_ms);
    if (server_watch_polling(lc, 1) < 0)
        return -1;
    double on = idle_server_share(idle_ms);
    if (server_watch_polling(lc, 0) < 0)
        return -1;
    if (on >= 0 && off >= 0) {
        idle_watched = on;
        idle_unwatched = off;
        printf("idle echo server over %d ms: %.1f%% of a CPU with the V4 polling session "
               "watched (every %" PRIu32 " µs), %.1f%% without\n",
               idle_ms, 100 * on, o->polling_us, 100 * off);
    }
    return 0;
}
