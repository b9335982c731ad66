/*
 * shmipc-bench: figures for libshmipc, measured the way ../shared/reference/bench-method.md
 * asks: medians of interleaved rounds, every figure beside a peer measured in the same run,
 * the environment printed beside the figures, JSON for bench/plot.py.
 *
 * `shmipc-bench ipc` is a ping-pong over shmipc V3 (memfd), shmipc V2 (/dev/shm files), shmipc
 * V4 with each of its wakeups (socket, eventfd, event-queue polling), a unix domain socket and
 * TCP loopback. A message is a big-endian u32 length and the payload. The
 * client writes every payload byte (straight into shared memory with reserve/commit for
 * shmipc, into its own buffer before write() for sockets) and sums every byte of the echo;
 * the echo server copies every byte it receives into its reply. Two shapes: one stream with
 * every round trip timed (and the CPU time of client and server per round trip), and N streams
 * kept in flight by one client thread.
 *
 * Like a user's program it sees only the public header and links libshmipc.so.
 *
 * Usage: shmipc-bench ipc [options]   (shmipc-bench ipc --help lists them)
 */
#include <shmipc.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SHMIPC_BENCH_BUILDTYPE
#define SHMIPC_BENCH_BUILDTYPE "unknown"
#endif

#define MAX_SIZES  32
#define MAX_COUNTS 16
#define MAX_ROUNDS 15
#define MAX_SIZE   (64u << 20)
#define HDR        4u
/* Messages start at one of this many offsets into the pattern, so consecutive ones differ. */
#define PATTERN_SLACK 64u
/* No blocking call of the client waits longer than this for the echo server (--timeout). */
static int io_timeout_ms = 30000;

/* --echo copy: the shmipc echo copies each payload into new slices instead of forwarding. */
static int echo_copy;
#define HANDSHAKE_MS 10000

/* The default run order. The V4 transports differ only in the wakeup the client asks for. */
enum transport { T_V3, T_V2, T_V4, T_V4E, T_V4P, T_UDS, T_TCP, T_COUNT };
static const char *const transport_name[T_COUNT] = {
    "shmipc-v3", "shmipc-v2", "shmipc-v4", "shmipc-v4-eventfd", "shmipc-v4-polling", "uds", "tcp"};
/* What --transports takes (the full names above are accepted too). */
static const char *const transport_arg[T_COUNT] = {"v3",         "v2",  "v4", "v4-eventfd",
                                                   "v4-polling", "uds", "tcp"};

static int is_shmipc(int t)
{
    return t <= T_V4P;
}

/* The protocol version and wakeup (enum shmipc_wakeup) a transport must negotiate. */
static int want_version(int t)
{
    return t == T_V2 ? 2 : t == T_V3 ? 3 : 4;
}

static int want_wakeup(int t)
{
    return t == T_V4E   ? SHMIPC_WAKEUP_EVENTFD
           : t == T_V4P ? SHMIPC_WAKEUP_POLLING
                        : SHMIPC_WAKEUP_SOCKET;
}

static const char *wakeup_name(int w)
{
    return w == SHMIPC_WAKEUP_EVENTFD   ? "eventfd"
           : w == SHMIPC_WAKEUP_POLLING ? "polling"
           : w == SHMIPC_WAKEUP_SOCKET  ? "socket"
                                        : "unknown";
}

/* ------------------------------------------------------------------------------------ */
/* Options                                                                              */
/* ------------------------------------------------------------------------------------ */

#define DEFAULT_SIZES   "64,512,1K,4K,16K,64K,256K,1M,4M"
#define DEFAULT_STREAMS "1,8,64,200"
/*
 * Each class holds a power-of-two payload plus its 4-byte length, so every benchmark message
 * up to 1 MiB fits one slice and a 4 MiB one is a chain of four 1 MiB slices. 512 MiB leaves
 * room for the largest batch in flight in both directions (--max-inflight, 64 MiB) at once.
 */
#define DEFAULT_SLICES "16388:10,65540:15,262148:25,1048580:50"
#define DEFAULT_BUFFER (512ull << 20)
#define DEFAULT_QUEUE  8192u
/* The V4 event-queue polling interval the v4-polling transport asks for (--polling-us). */
#define DEFAULT_POLLING_US 50u

struct opts {
    size_t sizes[MAX_SIZES];
    int nsizes;
    int counts[MAX_COUNTS]; /* stream counts of the parallel shape */
    int ncounts;
    int transports[T_COUNT]; /* in run order */
    int ntransports;
    int rounds;
    int samples_max, samples_min; /* one-stream round trips per size: clamp(bytes / size) */
    uint64_t sample_bytes;
    int duration_ms, warmup_ms; /* per parallel cell */
    uint64_t max_inflight;      /* cap on streams x size in the parallel shape */
    uint64_t buffer;
    char slices[256];
    uint32_t queue;
    uint32_t polling_us;
    int spin_us; /* the spin cap of both peers' configs; -1: the library's default */
    int idle_ms; /* CPU of each transport's idle session measured over this long; 0: not */
    int pin;
    int quick;
    int warm; /* warm the shmipc sessions up before the rounds */
    const char *json_path, *md_path;
    const char *connect_addr, *serve_addr;
    int serve_sessions;
    char command[2048];
};

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: shmipc-bench ipc [options]\n"
        "\n"
        "Ping-pong over shmipc V3 (memfd), shmipc V2 (/dev/shm files), shmipc V4 (socket,\n"
        "eventfd and event-queue polling wakeups), a unix socket and TCP loopback; every\n"
        "payload byte is written by the client and read back (checksummed). One stream also\n"
        "reports the CPU time of the client and of the echo server per round trip.\n"
        "\n"
        "  --sizes LIST        payload sizes, e.g. 64,4K,1M (default " DEFAULT_SIZES ")\n"
        "  --streams LIST      streams in flight for the parallel shape (default " DEFAULT_STREAMS
        ")\n"
        "  --transports LIST   any of v3,v2,v4,v4-eventfd,v4-polling,uds,tcp, run in this\n"
        "                      order (default all of them; with --connect: v3,v2)\n"
        "  --rounds N          interleaved rounds; figures are their median (default 3)\n"
        "  --samples N         most timed round trips per size, one stream (default 5000)\n"
        "  --min-samples N     fewest timed round trips per size (default 200)\n"
        "  --sample-bytes B    one-stream round trips per size = B / size, clamped (64M)\n"
        "  --duration MS       timed part of each parallel cell (default 200)\n"
        "  --warmup MS         untimed warm-up of each parallel cell (default 30)\n"
        "  --max-inflight B    cap on streams x size per batch; larger counts are reduced\n"
        "                      (default 64M)\n"
        "  --buffer B          shmipc buffer capacity (default 512M)\n"
        "  --slices SPEC       shmipc slice classes (default " DEFAULT_SLICES ")\n"
        "  --queue N           shmipc queue capacity (default 8192)\n"
        "  --polling-us N      V4 polling interval of v4-polling, in µs (default 50)\n"
        "  --spin-us N         spin cap of the shmipc client and echo server, 0..100000 µs\n"
        "                      (0: never spin; default: the library's, SHMIPC_SPIN_US or 20)\n"
        "  --idle-ms MS        after the rounds, the CPU of both processes over MS of quiet\n"
        "                      after each transport's last message (default 2000; 0: skip)\n"
        "  --no-pin            do not pin the client and server to CPUs (by default the\n"
        "                      echo server and the client run on two different CPUs)\n"
        "  --no-warmup         skip the untimed pass over every slice of a new session\n"
        "  --echo MODE         how the shmipc echo server answers: forward (default; the\n"
        "                      received slices go back untouched, as the socket echo sends\n"
        "                      back the buffer it received into) or copy (the payload is\n"
        "                      copied into new slices)\n"
        "  --timeout MS        longest wait of the client for an echo (default 30000)\n"
        "  --quick             a short run (about 30 s) for smoke tests\n"
        "  --json FILE         JSON results (default bench-ipc.json)\n"
        "  --md FILE           markdown tables (default bench-ipc.md)\n"
        "  --connect ADDR      only the client, against an external echo server\n"
        "                      (shmipc transports only; ADDR as in shmipc.h, unix:/path)\n"
        "  --serve ADDR        only the echo server (shmipc listener), until killed\n"
        "  --sessions N        with --serve: exit after N sessions have ended\n");
}

/* Parses "64", "4K", "4KiB", "1M", "1MiB", "64B" (K and M are binary). */
static int parse_bytes(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s)
        return -1;
    uint64_t mult = 1;
    if (*end == 'k' || *end == 'K')
        mult = 1024, end++;
    else if (*end == 'm' || *end == 'M')
        mult = 1024 * 1024, end++;
    else if (*end == 'g' || *end == 'G')
        mult = 1024ull * 1024 * 1024, end++;
    if (mult > 1 && strcmp(end, "iB") == 0)
        end += 2;
    else if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0' || v > UINT64_MAX / mult)
        return -1;
    *out = v * mult;
    return 0;
}

/* Splits a comma-separated list and calls `each` on every item; -1 on the first failure. */
static int parse_list(const char *list, int (*each)(const char *, void *), void *arg)
{
    char buf[512];
    if (strlen(list) >= sizeof buf)
        return -1;
    strcpy(buf, list);
    char *save = NULL;
    int n = 0;
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        if (each(tok, arg) < 0)
            return -1;
        n++;
    }
    return n > 0 ? 0 : -1;
}

static int add_size(const char *tok, void *arg)
{
    struct opts *o = arg;
    uint64_t v;
    if (parse_bytes(tok, &v) < 0 || v == 0 || v > MAX_SIZE || o->nsizes == MAX_SIZES) {
        fprintf(stderr, "shmipc-bench: --sizes: bad size '%s' (1 B .. 64 MiB, at most %d)\n", tok,
                MAX_SIZES);
        return -1;
    }
    o->sizes[o->nsizes++] = (size_t)v;
    return 0;
}

static int add_count(const char *tok, void *arg)
{
    struct opts *o = arg;
    char *end;
    long v = strtol(tok, &end, 10);
    if (*end != '\0' || v < 1 || v > 100000 || o->ncounts == MAX_COUNTS) {
        fprintf(stderr, "shmipc-bench: --streams: bad count '%s' (1..100000, at most %d)\n", tok,
                MAX_COUNTS);
        return -1;
    }
    o->counts[o->ncounts++] = (int)v;
    return 0;
}

static int add_transport(const char *tok, void *arg)
{
    struct opts *o = arg;
    int t = strcmp(tok, "unix") == 0 ? T_UDS : -1;
    for (int k = 0; t < 0 && k < T_COUNT; k++)
        if (strcmp(tok, transport_arg[k]) == 0 || strcmp(tok, transport_name[k]) == 0)
            t = k;
    for (int i = 0; t >= 0 && i < o->ntransports; i++)
        if (o->transports[i] == t)
            t = -1;
    if (t < 0) {
        fprintf(stderr,
                "shmipc-bench: --transports: bad or repeated '%s' "
                "(v3,v2,v4,v4-eventfd,v4-polling,uds,tcp)\n",
                tok);
        return -1;
    }
    o->transports[o->ntransports++] = t;
    return 0;
}

static int parse_int(const char *name, const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "shmipc-bench: %s: '%s' is not in %ld..%ld\n", name, s, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_size_opt(const char *name, const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (parse_bytes(s, out) < 0 || *out < lo || *out > hi) {
        fprintf(stderr, "shmipc-bench: %s: bad size '%s'\n", name, s);
        return -1;
    }
    return 0;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
    int quick_seen = 0, samples = -1, min_samples = -1, duration = -1, warmup = -1;
    uint64_t sample_bytes = 0, buffer = 0, max_inflight = 0;
    memset(o, 0, sizeof *o);
    o->rounds = 3;
    o->queue = DEFAULT_QUEUE;
    o->polling_us = DEFAULT_POLLING_US;
    o->spin_us = -1;
    o->idle_ms = -1;
    o->pin = 1;
    o->warm = 1;
    o->json_path = "bench-ipc.json";
    o->md_path = "bench-ipc.md";
    snprintf(o->slices, sizeof o->slices, "%s", DEFAULT_SLICES);
    size_t used = 0;
    for (int i = 0; i < argc; i++) {
        int n = snprintf(o->command + used, sizeof o->command - used, "%s%s", i ? " " : "",
                         i == 0 ? "shmipc-bench" : argv[i]);
        if (n < 0 || (size_t)n >= sizeof o->command - used)
            break;
        used += (size_t)n;
    }
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1, rc = 0;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--quick") == 0) {
            quick_seen = 1;
            takes = 0;
        } else if (strcmp(a, "--no-pin") == 0) {
            o->pin = 0;
            takes = 0;
        } else if (strcmp(a, "--no-warmup") == 0) {
            o->warm = 0;
            takes = 0;
        } else if (v == NULL) {
            fprintf(stderr, "shmipc-bench: %s needs a value (see --help)\n", a);
            return -1;
        } else if (strcmp(a, "--sizes") == 0) {
            o->nsizes = 0;
            rc = parse_list(v, add_size, o);
        } else if (strcmp(a, "--streams") == 0) {
            o->ncounts = 0;
            rc = parse_list(v, add_count, o);
        } else if (strcmp(a, "--transports") == 0) {
            o->ntransports = 0;
            rc = parse_list(v, add_transport, o);
        } else if (strcmp(a, "--echo") == 0) {
            if (strcmp(v, "copy") == 0 || strcmp(v, "forward") == 0) {
                echo_copy = strcmp(v, "copy") == 0;
            } else {
                fprintf(stderr, "shmipc-bench: --echo: %s is neither forward nor copy\n", v);
                rc = -1;
            }
        } else if (strcmp(a, "--timeout") == 0) {
            rc = parse_int(a, v, 1, 3600000, &io_timeout_ms);
        } else if (strcmp(a, "--rounds") == 0) {
            rc = parse_int(a, v, 1, MAX_ROUNDS, &o->rounds);
        } else if (strcmp(a, "--samples") == 0) {
            rc = parse_int(a, v, 1, 10000000, &samples);
        } else if (strcmp(a, "--min-samples") == 0) {
            rc = parse_int(a, v, 1, 10000000, &min_samples);
        } else if (strcmp(a, "--sample-bytes") == 0) {
            rc = parse_size_opt(a, v, 1, UINT64_MAX / 2, &sample_bytes);
        } else if (strcmp(a, "--duration") == 0) {
            rc = parse_int(a, v, 1, 3600000, &duration);
        } else if (strcmp(a, "--warmup") == 0) {
            rc = parse_int(a, v, 0, 3600000, &warmup);
        } else if (strcmp(a, "--max-inflight") == 0) {
            rc = parse_size_opt(a, v, 1, UINT64_MAX / 2, &max_inflight);
        } else if (strcmp(a, "--buffer") == 0) {
            rc = parse_size_opt(a, v, SHMIPC_MIN_BUFFER_CAPACITY, UINT32_MAX, &buffer);
        } else if (strcmp(a, "--slices") == 0) {
            if (strlen(v) >= sizeof o->slices)
                rc = -1;
            else
                snprintf(o->slices, sizeof o->slices, "%s", v);
        } else if (strcmp(a, "--queue") == 0) {
            int q;
            rc = parse_int(a, v, 1, (long)SHMIPC_MAX_QUEUE_CAPACITY, &q);
            o->queue = (uint32_t)q;
        } else if (strcmp(a, "--spin-us") == 0) {
            rc = parse_int(a, v, 0, 100000, &o->spin_us);
        } else if (strcmp(a, "--idle-ms") == 0) {
            rc = parse_int(a, v, 0, 60000, &o->idle_ms);
        } else if (strcmp(a, "--polling-us") == 0) {
            int us;
            rc = parse_int(a, v, SHMIPC_MIN_POLLING_INTERVAL_US, SHMIPC_MAX_POLLING_INTERVAL_US,
                           &us);
            o->polling_us = (uint32_t)us;
        } else if (strcmp(a, "--json") == 0) {
            o->json_path = v;
        } else if (strcmp(a, "--md") == 0) {
            o->md_path = v;
        } else if (strcmp(a, "--connect") == 0) {
            o->connect_addr = v;
        } else if (strcmp(a, "--serve") == 0) {
            o->serve_addr = v;
        } else if (strcmp(a, "--sessions") == 0) {
            rc = parse_int(a, v, 1, 1000000000, &o->serve_sessions);
        } else {
            fprintf(stderr, "shmipc-bench: unknown option %s (see --help)\n", a);
            return -1;
        }
        if (rc < 0)
            return -1;
        i += takes;
    }
    if (o->nsizes == 0 && parse_list(DEFAULT_SIZES, add_size, o) < 0)
        return -1;
    if (o->ncounts == 0 && parse_list(DEFAULT_STREAMS, add_count, o) < 0)
        return -1;
    if (o->ntransports == 0) {
        /* An external server is most likely a legacy one (no public Go peer speaks V4). */
        for (int t = 0; t < T_COUNT; t++)
            if (!o->connect_addr || t == T_V3 || t == T_V2)
                o->transports[o->ntransports++] = t;
    }
    if (o->connect_addr && o->serve_addr) {
        fprintf(stderr, "shmipc-bench: --connect and --serve exclude each other\n");
        return -1;
    }
    for (int i = 0; o->connect_addr && i < o->ntransports; i++) {
        if (!is_shmipc(o->transports[i])) {
            fprintf(stderr, "shmipc-bench: --connect runs the shmipc transports only "
                            "(v3,v2,v4,v4-eventfd,v4-polling)\n");
            return -1;
        }
    }
    o->quick = quick_seen;
    if (o->idle_ms < 0)
        o->idle_ms = quick_seen ? 200 : 2000;
    o->samples_max = quick_seen ? 500 : 5000;
    o->samples_min = quick_seen ? 30 : 200;
    o->sample_bytes = quick_seen ? (4ull << 20) : (64ull << 20);
    o->duration_ms = quick_seen ? 20 : 200;
    o->warmup_ms = quick_seen ? 5 : 30;
    if (samples > 0)
        o->samples_max = samples;
    if (min_samples > 0)
        o->samples_min = min_samples;
    if (o->samples_min > o->samples_max)
        o->samples_min = o->samples_max;
    if (sample_bytes > 0)
        o->sample_bytes = sample_bytes;
    if (duration > 0)
        o->duration_ms = duration;
    if (warmup >= 0)
        o->warmup_ms = warmup;
    /* A quick run warms a smaller buffer up; it carries less in flight to fit. */
    o->buffer = buffer ? buffer : quick_seen ? DEFAULT_BUFFER / 8 : DEFAULT_BUFFER;
    o->max_inflight = max_inflight ? max_inflight : quick_seen ? (4ull << 20) : (64ull << 20);
    return 0;
}

/* ------------------------------------------------------------------------------------ */
/* Small helpers                                                                        */
/* ------------------------------------------------------------------------------------ */

static volatile sig_atomic_t interrupted;
static pid_t server_pid = -1;
/* The local echo server's CPU-time clock (clock_getcpuclockid), when the kernel gives it. */
static clockid_t server_clock;
static int server_clock_ok;

static uint64_t now_ns(void)
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
static uint64_t client_cpu_ns(void)
{
    return clock_ns(CLOCK_PROCESS_CPUTIME_ID);
}

/*
 * CPU time the local echo server (a forked child) has used, user and system: its CPU-time
 * clock, read from here, to the nanosecond; where the kernel refuses that, utime + stime
 * from /proc/PID/stat (in clock ticks, usually 10 ms). UINT64_MAX without a local server.
 */
static uint64_t server_cpu_ns(void)
{
    if (server_pid <= 0)
        return UINT64_MAX;
    if (server_clock_ok) {
        uint64_t v = clock_ns(server_clock);
        if (v != UINT64_MAX)
            return v;
    }
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)server_pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return UINT64_MAX;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* Fields after the command, which ends at the last ')': state is field 3, utime 14. */
    char *p = strrchr(buf, ')');
    unsigned long long ut, st;
    if (p == NULL ||
        sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return UINT64_MAX;
    long hz = sysconf(_SC_CLK_TCK);
    return (ut + st) * (1000000000ull / (uint64_t)(hz > 0 ? hz : 100));
}

static const char *errname(int rc)
{
    const char *n = shmipc_errname(rc);
    return n != NULL ? n : "unknown code";
}

/* Reports a failed shmipc call with its error name and detail; returns -1. */
static int shm_fail(const char *what, int rc)
{
    fprintf(stderr, "shmipc-bench: %s: %s (%s, %d)\n", what, shmipc_error_detail(), errname(rc),
            rc);
    return -1;
}

/* Reports a failed system call with errno; returns -1. */
static int sys_fail(const char *what)
{
    int err = errno;
    fprintf(stderr, "shmipc-bench: %s: %s\n", what,
            err == EAGAIN ? "timed out waiting for the peer" : strerror(err));
    return -1;
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint32_t get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static size_t min_size(size_t a, size_t b)
{
    return a < b ? a : b;
}

/*
 * The sum of the bytes. It ignores positions, so it is the same however the echo was cut
 * into chunks. Eight bytes at a time: the words are split into four 16-bit lanes that can
 * take 128 words of two bytes each before they could carry.
 */
static uint64_t byte_sum(const uint8_t *p, size_t n)
{
    const uint64_t lo = 0x00ff00ff00ff00ffull;
    uint64_t total = 0;
    while (n >= 8) {
        size_t words = n / 8 > 128 ? 128 : n / 8;
        uint64_t acc = 0;
        for (size_t i = 0; i < words; i++) {
            uint64_t w;
            memcpy(&w, p + 8 * i, 8);
            acc += (w & lo) + ((w >> 8) & lo);
        }
        total += (acc & 0xffff) + ((acc >> 16) & 0xffff) + ((acc >> 32) & 0xffff) + (acc >> 48);
        p += 8 * words;
        n -= 8 * words;
    }
    while (n-- > 0)
        total += *p++;
    return total;
}

/* The bytes messages are copied from, and the sum of every message each size can carry. */
static uint8_t *pattern;
static uint64_t expected_sum[MAX_SIZES][PATTERN_SLACK];

/* `max` is the largest message beside --sizes: the session warm-up's. */
static int pattern_init(const struct opts *o, size_t max)
{
    for (int i = 0; i < o->nsizes; i++)
        if (o->sizes[i] > max)
            max = o->sizes[i];
    if ((pattern = malloc(max + PATTERN_SLACK)) == NULL)
        return sys_fail("pattern: malloc");
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < max + PATTERN_SLACK; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        pattern[i] = (uint8_t)x;
    }
    for (int i = 0; i < o->nsizes; i++)
        for (unsigned k = 0; k < PATTERN_SLACK; k++)
            expected_sum[i][k] = byte_sum(pattern + k, o->sizes[i]);
    return 0;
}

static void fmt_size(char *buf, size_t cap, uint64_t v)
{
    if (v >= (1u << 20) && v % (1u << 20) == 0)
        snprintf(buf, cap, "%" PRIu64 " MiB", v >> 20);
    else if (v >= 1024 && v % 1024 == 0)
        snprintf(buf, cap, "%" PRIu64 " KiB", v >> 10);
    else
        snprintf(buf, cap, "%" PRIu64 " B", v);
}

/* ------------------------------------------------------------------------------------ */
/* Environment and pinning                                                              */
/* ------------------------------------------------------------------------------------ */

struct env {
    char kernel[400];
    char cpu_model[256];
    long cpus;
    int pinned, client_cpu, server_cpu;
    char pinning[200];
    char load_start[64], load_end[64]; /* /proc/loadavg: how busy the machine was */
};

static void read_loadavg(char *buf, size_t cap)
{
    FILE *f = fopen("/proc/loadavg", "r");
    snprintf(buf, cap, "unknown");
    if (f == NULL)
        return;
    double a, b, c;
    if (fscanf(f, "%lf %lf %lf", &a, &b, &c) == 3)
        snprintf(buf, cap, "%.2f %.2f %.2f", a, b, c);
    fclose(f);
}

static void env_probe(struct env *e, int want_pin)
{
    struct utsname u;
    memset(e, 0, sizeof *e);
    if (uname(&u) == 0)
        snprintf(e->kernel, sizeof e->kernel, "%s %s %s %s", u.sysname, u.release, u.version,
                 u.machine);
    snprintf(e->cpu_model, sizeof e->cpu_model, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f != NULL) {
        char line[512];
        while (fgets(line, sizeof line, f) != NULL) {
            char *colon = strchr(line, ':');
            if (strncmp(line, "model name", 10) == 0 && colon != NULL) {
                colon += 1 + (colon[1] == ' ');
                colon[strcspn(colon, "\n")] = '\0';
                snprintf(e->cpu_model, sizeof e->cpu_model, "%s", colon);
                break;
            }
        }
        fclose(f);
    }
    e->cpus = sysconf(_SC_NPROCESSORS_ONLN);
    read_loadavg(e->load_start, sizeof e->load_start);
    cpu_set_t set;
    int found = 0;
    if (want_pin && sched_getaffinity(0, sizeof set, &set) == 0) {
        for (int c = 0; c < CPU_SETSIZE && found < 2; c++) {
            if (!CPU_ISSET(c, &set))
                continue;
            if (found++ == 0)
                e->client_cpu = c;
            else
                e->server_cpu = c;
        }
    }
    e->pinned = found >= 2;
}

static int pin_to(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        return sys_fail("sched_setaffinity");
    return 0;
}

/* ------------------------------------------------------------------------------------ */
/* shmipc configuration                                                                 */
/* ------------------------------------------------------------------------------------ */

/*
 * The config of shmipc transport `t`: V2 is the legacy protocol over /dev/shm files, V3 over
 * memfd, and the V4 transports use the public helpers a user would (which turn fallback on;
 * client_open() refuses a session that fell back). The echo server uses T_V3's config: the
 * default server accepts V2, V3 and V4 and offers both optional V4 wakeups.
 */
static int make_config(const struct opts *o, int t, shmipc_config **out)
{
    shmipc_config *cfg = NULL;
    char prefix[64];
    int rc;
    /* One prefix per run: a run's leftovers in /dev/shm are easy to find and remove. */
    snprintf(prefix, sizeof prefix, "/dev/shm/shmipc-bench-%ld", (long)getpid());
    if ((rc = shmipc_config_new(&cfg)) < 0)
        return shm_fail("config_new", rc);
    if ((rc = shmipc_config_set_memmap_type(cfg, t == T_V2 ? SHMIPC_MEMMAP_DEVSHM
                                                           : SHMIPC_MEMMAP_MEMFD)) < 0) {
        shm_fail("config: memmap type", rc);
        goto err;
    }
    rc = t == T_V4    ? shmipc_config_with_v4(cfg)
         : t == T_V4E ? shmipc_config_with_v4_eventfd(cfg)
         : t == T_V4P ? shmipc_config_with_v4_event_queue_polling(cfg, o->polling_us)
                      : 0;
    if (rc < 0) {
        shm_fail("config: V4", rc);
        goto err;
    }
    if ((rc = shmipc_config_set_path_prefix(cfg, prefix)) < 0) {
        shm_fail("config: path prefix", rc);
        goto err;
    }
    /* The capacity first, so that large slice classes find room when they are checked. */
    if ((rc = shmipc_config_set_buffer_capacity(cfg, o->buffer)) < 0) {
        shm_fail("config: --buffer", rc);
        goto err;
    }
    if ((rc = shmipc_config_parse_slice_classes(cfg, o->slices)) < 0) {
        shm_fail("config: --slices", rc);
        goto err;
    }
    if ((rc = shmipc_config_set_queue_capacity(cfg, o->queue)) < 0) {
        shm_fail("config: --queue", rc);
        goto err;
    }
    if (o->spin_us >= 0 && (rc = shmipc_config_set_spin_us(cfg, (uint32_t)o->spin_us)) < 0) {
        shm_fail("config: --spin-us", rc);
        goto err;
    }
    /* A hung peer ends the run with an error instead of hanging it. */
    if ((rc = shmipc_config_set_timeout_ms(cfg, SHMIPC_TIMEOUT_READ, (uint32_t)io_timeout_ms)) <
        0) {
        shm_fail("config: read timeout", rc);
        goto err;
    }
    /* The client lays out a large buffer during the handshake: give it more than 1 s. */
    if ((rc = shmipc_config_set_timeout_ms(cfg, SHMIPC_TIMEOUT_INITIALIZE, HANDSHAKE_MS)) < 0) {
        shm_fail("config: initialize timeout", rc);
        goto err;
    }
    if ((rc = shmipc_config_validate(cfg)) < 0) {
        shm_fail("config", rc);
        goto err;
    }
    *out = cfg;
    return 0;
err:
    shmipc_config_free(cfg);
    return -1;
}

/* The largest slice class: the largest window reserve can hand out in shared memory. */
static int largest_slice(const shmipc_config *cfg, uint32_t *out)
{
    shmipc_slice_class c[SHMIPC_MAX_SLICE_CLASSES];
    int n = shmipc_config_get_slice_classes(cfg, c, SHMIPC_MAX_SLICE_CLASSES);
    if (n <= 0)
        return shm_fail("config: slice classes", n < 0 ? n : SHMIPC_EINVAL);
    *out = c[n - 1].size;
    return 0;
}

/* ------------------------------------------------------------------------------------ */
/* The echo server                                                                      */
/* ------------------------------------------------------------------------------------ */

/*
 * One thread serves everything: the shmipc listener and its sessions (each session's
 * streams multiplexed over one descriptor), and the unix and TCP echo connections, all in
 * one poll() set.
 */
struct sstream {
    shmipc_stream *st;
    uint8_t hdr[HDR];
    uint32_t hdr_got; /* bytes of the current message's length read so far */
    uint64_t left;    /* payload bytes of the current message still to echo */
    uint64_t last_ns; /* when it last had data */
};

/* How sstream_serve() decides to read a stream. */
enum probe {
    PROBE_NONE,  /* only when bytes are available */
    PROBE_ALL,   /* once anyway: finds streams the peer closed */
    PROBE_STALE, /* once anyway when the stream has been quiet for STALE_NS */
};
/* A stream quiet this long is probed for a close that came among other events. */
#define STALE_NS (50ull * 1000000u)

struct ssession {
    shmipc_session *s;
    struct sstream *streams;
    int n, cap;
    int polling; /* negotiated V4 event-queue polling: its descriptor fires every interval */
    int pi;      /* its entry in this turn's poll() set, or -1 */
};

struct sconn {
    int fd;
    uint8_t *buf;
    size_t cap, have; /* bytes read and not yet echoed */
    size_t msg;       /* length of the message being written back, 0 while reading */
    size_t sent;
};

/*
 * The control socket of the local server (ctl_fd) carries one-byte commands from the
 * benchmark, each acknowledged with 'A': 'P' watch polling sessions, 'p' stop watching them.
 * Its end (EOF) stops the server. A polling session's descriptor fires every interval
 * whether or not the session carries anything, so while other transports are measured the
 * server leaves it out of poll(): its timer would otherwise wake the server every interval,
 * taking CPU from the measured transport and adding to its server CPU time. What watching an
 * idle polling session costs is measured on its own (idle_server_cpu()).
 */
struct server {
    shmipc_listener *l;
    int uds_fd, tcp_fd, ctl_fd;
    int watch_polling;
    struct ssession *sess;
    int nsess, sess_cap;
    struct sconn *conns;
    int nconns, conns_cap;
    int sessions_done, sessions_limit;
    int last; /* the session that had news last turn (spun on before poll()), or -1 */
};

static volatile sig_atomic_t server_stop;

static void server_on_signal(int sig)
{
    (void)sig;
    server_stop = 1;
}

static int grow(void **arr, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return 0;
    int n = *cap ? *cap * 2 : 16;
    while (n < need)
        n *= 2;
    void *p = realloc(*arr, (size_t)n * elem);
    if (p == NULL)
        return -1;
    *arr = p;
    *cap = n;
    return 0;
}

static void sstream_close(struct ssession *ss, int i)
{
    shmipc_stream_close(ss->streams[i].st);
    ss->streams[i] = ss->streams[--ss->n];
}

static void ssession_end(struct server *sv, int i)
{
    sv->last = -1;
    struct ssession *ss = &sv->sess[i];
    while (ss->n > 0)
        sstream_close(ss, ss->n - 1);
    free(ss->streams);
    shmipc_session_close(ss->s);
    sv->sess[i] = sv->sess[--sv->nsess];
    sv->sessions_done++;
}

/*
 * Reads the next bytes of a message's length. Copying echo: the length goes into the reply
 * when it is complete. Forwarding echo: it stays read and not released, so the forward of
 * the payload takes it along (an empty payload is forwarded at once).
 */
static int sstream_header(struct sstream *x)
{
    const void *p;
    size_t n;
    int rc = shmipc_stream_read_chunk(x->st, HDR - x->hdr_got, &p, &n, SHMIPC_NONBLOCK);
    if (rc < 0)
        return rc;
    memcpy(x->hdr + x->hdr_got, p, n);
    x->hdr_got += (uint32_t)n;
    if (x->hdr_got < HDR)
        return 0;
    x->left = get_be32(x->hdr);
    if (echo_copy) {
        if ((rc = shmipc_stream_write(x->st, x->hdr, HDR)) < 0)
            return rc;
        return shmipc_stream_release(x->st);
    }
    return x->left == 0 ? shmipc_stream_forward(x->st, x->st, 0, 0) : 0;
}

/* Copying echo: one chunk of payload is copied into the reply and released. */
static int sstream_copy(struct sstream *x)
{
    const void *p;
    size_t n;
    int rc = shmipc_stream_read_chunk(x->st, (size_t)x->left, &p, &n, SHMIPC_NONBLOCK);
    if (rc < 0 || (rc = shmipc_stream_write(x->st, p, n)) < 0)
        return rc;
    x->left -= n;
    return shmipc_stream_release(x->st);
}

/*
 * Forwarding echo: the payload received so far (with the length before it) goes into the
 * reply as the slices it arrived in. With nothing available it asks for one byte, which is
 * how a probe sees the stream's end.
 */
static int sstream_forward(struct sstream *x, size_t avail)
{
    size_t n = avail == 0 ? 1 : avail < x->left ? avail : (size_t)x->left;
    int rc = shmipc_stream_forward(x->st, x->st, n, SHMIPC_NONBLOCK);
    if (rc == 0)
        x->left -= n;
    return rc;
}

/*
 * Echoes what one stream has received, message by message, and flushes the reply when its
 * message is complete; reads stop at message ends, so a pipelining client works too. The
 * payload is forwarded (its slices go back untouched, as a socket echo sends back the buffer
 * it received into) or, with --echo copy, copied into new slices.
 *
 * Only streams with bytes available are read: a non-blocking read of an empty stream makes
 * the library try the socket (a recv() system call). `probe` reads once anyway, which is
 * how a stream the peer has closed is seen (EEOF), without a system call.
 *
 * Returns the number of reads made, or -1 when the stream is done (closed or failed).
 */
static int sstream_serve(struct sstream *x, int probe, uint64_t now)
{
    int chunks = 0;
    if (probe == PROBE_STALE)
        probe = now - x->last_ns >= STALE_NS;
    for (;;) {
        size_t avail = shmipc_stream_available(x->st);
        if (!probe && avail == 0)
            break;
        probe = 0;
        int rc = x->hdr_got < HDR ? sstream_header(x)
                 : echo_copy      ? sstream_copy(x)
                                  : sstream_forward(x, avail);
        if (rc == SHMIPC_EAGAIN)
            break;
        if (rc == SHMIPC_EEOF)
            return -1;
        if (rc < 0) {
            shm_fail("server: echo", rc);
            return -1;
        }
        chunks++;
        if (x->hdr_got == HDR && x->left == 0) {
            x->hdr_got = 0;
            if ((rc = shmipc_stream_flush(x->st)) < 0) {
                if (rc != SHMIPC_EEOF)
                    shm_fail("server: flush", rc);
                return -1;
            }
        }
    }
    if (chunks > 0)
        x->last_ns = now;
    return chunks;
}

/* Serves every stream of a session, reading empty ones as `probe` (enum probe) says. */
static int ssession_serve_all(struct ssession *ss, int probe, uint64_t now)
{
    int total = 0;
    for (int i = ss->n - 1; i >= 0; i--) {
        int rc = sstream_serve(&ss->streams[i], probe, now);
        if (rc < 0)
            sstream_close(ss, i);
        else
            total += rc;
    }
    return total;
}

/*
 * Takes the new streams and echoes what every stream has, reading empty streams as `probe`
 * says. The library reads the socket not only in process() but also inside a non-blocking
 * accept or read that finds nothing, and whatever that delivers (new streams, data) raises
 * no further poll() event: so every such call is followed by another accept and serve.
 * Returns the chunks served, or -1 when the session ended.
 */
static int ssession_pump(struct ssession *ss, uint64_t now, int probe)
{
    /* Known streams first: their replies leave before the accept below reads the socket. */
    int served = ssession_serve_all(ss, PROBE_NONE, now);
    for (;;) {
        shmipc_stream *st;
        int rc;
        /* The accept that finds no stream reads the socket once more (recv). */
        while ((rc = shmipc_session_accept_stream(ss->s, 0, &st)) == 0) {
            if (grow((void **)&ss->streams, &ss->cap, ss->n + 1, sizeof *ss->streams) < 0) {
                shmipc_stream_close(st);
                fprintf(stderr, "shmipc-bench: server: out of memory\n");
                return -1;
            }
            ss->streams[ss->n++] = (struct sstream){.st = st, .last_ns = now};
        }
        if (rc != SHMIPC_EAGAIN) {
            if (rc != SHMIPC_ECONNRESET && rc != SHMIPC_ECLOSED)
                shm_fail("server: accept stream", rc);
            return -1;
        }
        served += ssession_serve_all(ss, PROBE_NONE, now);
        if (probe == PROBE_NONE)
            return served;
        /* Probing reads may read the socket: go round once more for what they delivered. */
        served += ssession_serve_all(ss, probe, now);
        probe = PROBE_NONE;
    }
}

/*
 * After shmipc_session_process() or shmipc_session_spin() returned rc: take new streams,
 * echo. -1 when the session ended.
 */
static int ssession_took(struct ssession *ss, uint64_t now, int rc)
{
    if (rc < 0) {
        if (rc != SHMIPC_ECONNRESET && rc != SHMIPC_ECLOSED)
            shm_fail("server: session", rc);
        return -1;
    }
    if (rc == 0)
        return 0;
    if ((rc = ssession_pump(ss, now, PROBE_NONE)) != 0)
        return rc < 0 ? -1 : 0;
    /* Events but no data: streams were closed (or opened empty); probing finds the closed. */
    return ssession_pump(ss, now, PROBE_ALL) < 0 ? -1 : 0;
}

/* The session's descriptor fired: process, take new streams, echo. -1 when it ended. */
static int ssession_ready(struct ssession *ss, uint64_t now)
{
    return ssession_took(ss, now, shmipc_session_process(ss->s));
}

static void sconn_close(struct server *sv, int i)
{
    close(sv->conns[i].fd);
    free(sv->conns[i].buf);
    sv->conns[i] = sv->conns[--sv->nconns];
}

/* Writes back what can be written; 1 while more remains, 0 when done, -1 on failure. */
static int sconn_flush(struct sconn *c)
{
    while (c->sent < c->msg) {
        ssize_t w = write(c->fd, c->buf + c->sent, c->msg - c->sent);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                return 1;
            return -1;
        }
        c->sent += (size_t)w;
    }
    /* A pipelining client may have sent part of the next message already: keep it. */
    memmove(c->buf, c->buf + c->msg, c->have - c->msg);
    c->have -= c->msg;
    c->msg = c->sent = 0;
    return 0;
}

/* Starts echoing when a whole message is in the buffer; grows the buffer for a large one. */
static int sconn_check(struct sconn *c)
{
    while (c->msg == 0 && c->have >= HDR) {
        size_t need = HDR + get_be32(c->buf);
        if (need > c->cap) {
            void *p = realloc(c->buf, need);
            if (p == NULL)
                return -1;
            c->buf = p;
            c->cap = need;
        }
        if (c->have < need)
            return 0;
        c->msg = need;
        c->sent = 0;
        int rc = sconn_flush(c);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* The connection fired: read (until a short read) or write back. -1 when it is done. */
static int sconn_ready(struct sconn *c, short revents)
{
    if (c->msg > 0) {
        if (!(revents & (POLLOUT | POLLERR | POLLHUP)))
            return 0;
        int rc = sconn_flush(c);
        return rc < 0 ? -1 : sconn_check(c) < 0 ? -1 : 0;
    }
    for (;;) {
        size_t room = c->cap - c->have;
        ssize_t r = read(c->fd, c->buf + c->have, room);
        if (r == 0)
            return -1;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN ? 0 : -1;
        }
        c->have += (size_t)r;
        size_t before = c->have;
        if (sconn_check(c) < 0)
            return -1;
        /*
         * Read on only while a message is incomplete and the read filled the buffer: a short
         * read drained the socket, and poll() says when more comes.
         */
        if ((size_t)r < room || c->msg > 0 || c->have != before)
            return 0;
    }
}

static void accept_conns(struct server *sv, int lfd, int tcp)
{
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                sys_fail("server: accept");
            return;
        }
        int one = 1;
        if (tcp && setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
            sys_fail("server: TCP_NODELAY");
        uint8_t *buf = malloc(64 * 1024 + HDR);
        if (buf == NULL ||
            grow((void **)&sv->conns, &sv->conns_cap, sv->nconns + 1, sizeof *sv->conns) < 0) {
            free(buf);
            close(fd);
            fprintf(stderr, "shmipc-bench: server: out of memory\n");
            return;
        }
        sv->conns[sv->nconns++] = (struct sconn){.fd = fd, .buf = buf, .cap = 64 * 1024 + HDR};
    }
}

static void accept_sessions(struct server *sv)
{
    for (;;) {
        shmipc_session *s;
        int rc = shmipc_listener_accept(sv->l, 0, &s);
        if (rc == SHMIPC_EAGAIN)
            return;
        if (rc < 0) {
            shm_fail("server: accept session", rc);
            return;
        }
        if (grow((void **)&sv->sess, &sv->sess_cap, sv->nsess + 1, sizeof *sv->sess) < 0) {
            shmipc_session_close(s);
            fprintf(stderr, "shmipc-bench: server: out of memory\n");
            return;
        }
        sv->sess[sv->nsess++] = (struct ssession){
            .s = s, .polling = shmipc_session_wakeup(s, NULL) == SHMIPC_WAKEUP_POLLING};
    }
}

/* Reads and acknowledges the benchmark's commands; 1 when it closed its end (or failed). */
static int server_command(struct server *sv)
{
    char cmd[16];
    ssize_t n = read(sv->ctl_fd, cmd, sizeof cmd);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return 0;
    if (n <= 0)
        return 1;
    for (ssize_t i = 0; i < n; i++) {
        if (cmd[i] == 'P' || cmd[i] == 'p')
            sv->watch_polling = cmd[i] == 'P';
        if (write(sv->ctl_fd, "A", 1) != 1)
            return 1;
    }
    return 0;
}

static int server_loop(struct server *sv)
{
    struct pollfd *pfd = NULL;
    int pcap = 0, status = 0;
    uint64_t last_sweep = now_ns();
    while (!server_stop) {
        if (sv->sessions_limit > 0 && sv->sessions_done >= sv->sessions_limit)
            break;
        if (grow((void **)&pfd, &pcap, 4 + sv->nsess + sv->nconns, sizeof *pfd) < 0) {
            fprintf(stderr, "shmipc-bench: server: out of memory\n");
            status = -1;
            break;
        }
        int k = 0, i_ctl = -1, i_l = -1, i_uds = -1, i_tcp = -1;
        if (sv->ctl_fd >= 0)
            i_ctl = k, pfd[k++] = (struct pollfd){.fd = sv->ctl_fd, .events = POLLIN};
        if (sv->l != NULL)
            i_l = k,
            pfd[k++] = (struct pollfd){.fd = shmipc_listener_fileno(sv->l), .events = POLLIN};
        if (sv->uds_fd >= 0)
            i_uds = k, pfd[k++] = (struct pollfd){.fd = sv->uds_fd, .events = POLLIN};
        if (sv->tcp_fd >= 0)
            i_tcp = k, pfd[k++] = (struct pollfd){.fd = sv->tcp_fd, .events = POLLIN};
        int ns = sv->nsess;
        for (int i = 0; i < ns; i++) {
            struct ssession *ss = &sv->sess[i];
            ss->pi = -1;
            if (ss->polling && !sv->watch_polling && sv->ctl_fd >= 0)
                continue;
            ss->pi = k;
            pfd[k++] = (struct pollfd){.fd = shmipc_session_fileno(ss->s), .events = POLLIN};
        }
        int c0 = k, nc = sv->nconns;
        for (int i = 0; i < nc; i++)
            pfd[k++] = (struct pollfd){.fd = sv->conns[i].fd,
                                       .events = sv->conns[i].msg > 0 ? POLLOUT : POLLIN};
        /*
         * Before sleeping, spin on the session that had news last (shmipc_session_spin): a
         * client in a ping-pong sends its next request within the spin, with no wakeup.
         */
        int spun = 0;
        if (sv->last >= 0 && !sv->sess[sv->last].polling) {
            int li = sv->last, src = shmipc_session_spin(sv->sess[li].s);
            if (src != 0) {
                /* Served; the poll below only looks (so other descriptors are not starved). */
                spun = 1;
                if (ssession_took(&sv->sess[li], now_ns(), src) < 0) {
                    ssession_end(sv, li);
                    continue; /* the pollfd set no longer matches the sessions */
                }
            }
        }
        int rc = poll(pfd, (nfds_t)k, spun ? 0 : sv->nsess > 0 ? (int)(STALE_NS / 1000000u) : 1000);
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            status = sys_fail("server: poll");
            break;
        }
        uint64_t now = now_ns();
        if (rc > 0 && i_ctl >= 0 && pfd[i_ctl].revents && server_command(sv) != 0)
            break; /* the benchmark closed its end: the run is over */
        /* Backwards, so that removing entry i (swapping in the last) keeps i-1..0 in place. */
        for (int i = rc > 0 ? ns - 1 : -1; i >= 0; i--) {
            int pi = sv->sess[i].pi;
            if (pi >= 0 && pfd[pi].revents) {
                sv->last = i;
                if (ssession_ready(&sv->sess[i], now) < 0)
                    ssession_end(sv, i);
            }
        }
        for (int i = rc > 0 ? nc - 1 : -1; i >= 0; i--)
            if (pfd[c0 + i].revents) {
                sv->last = -1; /* a socket peer is the busy one: no spinning on a session */
                if (sconn_ready(&sv->conns[i], pfd[c0 + i].revents) < 0)
                    sconn_close(sv, i);
            }
        if (rc > 0 && i_l >= 0 && pfd[i_l].revents)
            accept_sessions(sv);
        if (rc > 0 && i_uds >= 0 && pfd[i_uds].revents)
            accept_conns(sv, sv->uds_fd, 0);
        if (rc > 0 && i_tcp >= 0 && pfd[i_tcp].revents)
            accept_conns(sv, sv->tcp_fd, 1);
        if (now - last_sweep >= STALE_NS) {
            /* Streams quiet for a while may have been closed among other events: look. */
            for (int i = sv->nsess - 1; i >= 0; i--)
                if (ssession_pump(&sv->sess[i], now, PROBE_STALE) < 0)
                    ssession_end(sv, i);
            last_sweep = now;
        }
    }
    free(pfd);
    while (sv->nsess > 0)
        ssession_end(sv, sv->nsess - 1);
    while (sv->nconns > 0)
        sconn_close(sv, sv->nconns - 1);
    return status;
}

static void server_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = server_on_signal; /* no SA_RESTART: poll() returns EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* --serve ADDR: only the shmipc echo server, until killed or --sessions have ended. */
static int serve_main(const struct opts *o)
{
    struct env e;
    shmipc_config *cfg = NULL;
    struct server sv = {.uds_fd = -1, .tcp_fd = -1, .ctl_fd = -1, .last = -1};
    int rc;
    server_signals();
    env_probe(&e, o->pin);
    if (e.pinned && pin_to(e.server_cpu) < 0)
        return 1;
    if (make_config(o, T_V3, &cfg) < 0)
        return 1;
    if ((rc = shmipc_listener_new(o->serve_addr, cfg, &sv.l)) < 0) {
        shmipc_config_free(cfg);
        return shm_fail("listen", rc) < 0 ? 1 : 0;
    }
    sv.sessions_limit = o->serve_sessions;
    printf("shmipc-bench: echo server (shmipc %s) listening on %s, V2, V3 and V4; %s\n",
           shmipc_version_string(), o->serve_addr,
           e.pinned ? "pinned to the second allowed CPU" : "not pinned");
    if (e.pinned)
        printf("shmipc-bench: server on CPU %d; pin the client elsewhere (taskset -c %d)\n",
               e.server_cpu, e.client_cpu);
    fflush(stdout);
    rc = server_loop(&sv);
    shmipc_listener_close(sv.l);
    shmipc_config_free(cfg);
    printf("shmipc-bench: served %d session(s)\n", sv.sessions_done);
    return rc < 0 ? 1 : 0;
}

/* ------------------------------------------------------------------------------------ */
/* The local server process                                                             */
/* ------------------------------------------------------------------------------------ */

struct local {
    char dir[64];
    char shm_addr[128];
    char uds_path[96]; /* fits sockaddr_un.sun_path */
    uint16_t tcp_port;
    int ctl_fd;
    int watching; /* the server watches polling sessions (see struct server) */
};

static int listen_unix(const char *path)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return sys_fail("unix socket");
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, SOMAXCONN) != 0) {
        sys_fail(path);
        close(fd);
        return -1;
    }
    return fd;
}

static int listen_tcp(uint16_t *port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int one = 1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return sys_fail("tcp socket");
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, SOMAXCONN) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        sys_fail("tcp 127.0.0.1");
        close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

static void server_child(const struct opts *o, const struct env *e, const struct local *lc, int ctl,
                         int uds_fd, int tcp_fd, pid_t parent)
{
    struct server sv = {.uds_fd = uds_fd, .tcp_fd = tcp_fd, .ctl_fd = ctl, .last = -1};
    shmipc_config *cfg = NULL;
    int rc, status = 1;
    server_signals();
    /* The server must not outlive the benchmark, whatever ends it. */
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent)
        _exit(1);
    if (e->pinned && pin_to(e->server_cpu) < 0)
        _exit(1);
    fcntl(uds_fd, F_SETFL, O_NONBLOCK);
    fcntl(tcp_fd, F_SETFL, O_NONBLOCK);
    if (make_config(o, T_V3, &cfg) < 0)
        _exit(1);
    if ((rc = shmipc_listener_new(lc->shm_addr, cfg, &sv.l)) < 0) {
        shm_fail("server: listen", rc);
        _exit(1);
    }
    if (write(ctl, "R", 1) == 1 && server_loop(&sv) == 0)
        status = 0;
    shmipc_listener_close(sv.l);
    shmipc_config_free(cfg);
    close(uds_fd);
    close(tcp_fd);
    fflush(stderr);
    _exit(status);
}

/* Forks the echo server, pinned to the second CPU, and waits until it listens. */
static int server_start(const struct opts *o, const struct env *e, struct local *lc)
{
    int ctl[2], uds_fd = -1, tcp_fd = -1;
    char ready;
    snprintf(lc->dir, sizeof lc->dir, "/tmp/shmipc-bench-XXXXXX");
    lc->ctl_fd = -1;
    if (mkdtemp(lc->dir) == NULL) {
        lc->dir[0] = '\0';
        return sys_fail("mkdtemp /tmp/shmipc-bench-XXXXXX");
    }
    snprintf(lc->shm_addr, sizeof lc->shm_addr, "unix:%s/shmipc.sock", lc->dir);
    snprintf(lc->uds_path, sizeof lc->uds_path, "%s/uds.sock", lc->dir);
    if ((uds_fd = listen_unix(lc->uds_path)) < 0 || (tcp_fd = listen_tcp(&lc->tcp_port)) < 0)
        goto err;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctl) != 0) {
        sys_fail("socketpair");
        goto err;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        sys_fail("fork");
        close(ctl[0]);
        close(ctl[1]);
        goto err;
    }
    if (pid == 0) {
        close(ctl[0]);
        server_child(o, e, lc, ctl[1], uds_fd, tcp_fd, parent);
    }
    server_pid = pid;
    server_clock_ok = clock_getcpuclockid(pid, &server_clock) == 0;
    close(ctl[1]);
    close(uds_fd);
    close(tcp_fd);
    lc->ctl_fd = ctl[0];
    struct pollfd p = {.fd = lc->ctl_fd, .events = POLLIN};
    if (poll(&p, 1, 10000) != 1 || read(lc->ctl_fd, &ready, 1) != 1 || ready != 'R') {
        fprintf(stderr, "shmipc-bench: the echo server did not start\n");
        return -1;
    }
    return 0;
err:
    if (uds_fd >= 0)
        close(uds_fd);
    if (tcp_fd >= 0)
        close(tcp_fd);
    return -1;
}

/*
 * Tells the local server to watch polling sessions or to leave them out of poll() (see
 * struct server), and waits for its acknowledgement. A no-op without a local server.
 */
static int server_watch_polling(struct local *lc, int on)
{
    char c = on ? 'P' : 'p', ack;
    if (lc->ctl_fd < 0 || lc->watching == on)
        return 0;
    if (write(lc->ctl_fd, &c, 1) != 1)
        return sys_fail("server control socket");
    struct pollfd p = {.fd = lc->ctl_fd, .events = POLLIN};
    if (poll(&p, 1, HANDSHAKE_MS) != 1 || read(lc->ctl_fd, &ack, 1) != 1 || ack != 'A') {
        fprintf(stderr, "shmipc-bench: the echo server did not acknowledge a command\n");
        return -1;
    }
    lc->watching = on;
    return 0;
}

/* Stops the server (closing the control socket tells it to) and reaps it; -1 if it failed. */
static int server_stop_and_reap(struct local *lc)
{
    int status = 0, rc = 0;
    if (lc->ctl_fd >= 0)
        close(lc->ctl_fd);
    lc->ctl_fd = -1;
    if (server_pid > 0) {
        uint64_t deadline = now_ns() + 5000000000ull;
        pid_t r;
        while ((r = waitpid(server_pid, &status, WNOHANG)) == 0 && now_ns() < deadline) {
            struct timespec ts = {0, 5000000};
            nanosleep(&ts, NULL);
        }
        if (r == 0) {
            fprintf(stderr, "shmipc-bench: the echo server did not stop; killing it\n");
            kill(server_pid, SIGKILL);
            waitpid(server_pid, &status, 0);
            rc = -1;
        } else if (r < 0) {
            rc = sys_fail("waitpid");
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "shmipc-bench: the echo server failed (%s %d)\n",
                    WIFEXITED(status) ? "exit status" : "signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            rc = -1;
        }
        server_pid = -1;
    }
    if (lc->dir[0] != '\0') {
        unlink(lc->uds_path);
        /* The listener removes its socket file: one a clean exit left behind is a bug. */
        if (unlink(lc->shm_addr + 5) == 0 && rc == 0)
            fprintf(stderr, "shmipc-bench: note: %s was left behind by the listener\n",
                    lc->shm_addr + 5);
        if (rmdir(lc->dir) != 0)
            sys_fail(lc->dir);
        lc->dir[0] = '\0';
    }
    return rc;
}

/* Removes what this run left in /dev/shm, saying so: a clean run leaves nothing. */
static int devshm_check(void)
{
    char prefix[64];
    int left = 0;
    snprintf(prefix, sizeof prefix, "shmipc-bench-%ld", (long)getpid());
    DIR *d = opendir("/dev/shm");
    if (d == NULL)
        return 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strncmp(de->d_name, prefix, strlen(prefix)) != 0)
            continue;
        char path[512];
        snprintf(path, sizeof path, "/dev/shm/%s", de->d_name);
        fprintf(stderr, "shmipc-bench: left behind in /dev/shm, removing: %s\n", path);
        unlink(path);
        left++;
    }
    closedir(d);
    return left;
}

/* ------------------------------------------------------------------------------------ */
/* The client                                                                           */
/* ------------------------------------------------------------------------------------ */

/* One transport's client side for one round: an shmipc session, or where to connect. */
struct client {
    int t;
    shmipc_session *sess;
    uint32_t window; /* largest reserve window: the largest slice class */
    double connect_secs;
    int version, wakeup; /* what the session negotiated */
    uint32_t interval_us;
    const char *uds_path;
    uint16_t tcp_port;
};

/* One stream or connection. */
struct chan {
    shmipc_stream *st;
    int fd;
    uint8_t *buf; /* sockets: the message written, then the echo read */
};

/*
 * Connects transport t. A shmipc session must have negotiated exactly what the transport
 * stands for (protocol version, V4 wakeup, polling interval): the V4 helpers turn fallback
 * on, and a session that fell back to V3 silently would be reported under the wrong name.
 */
static int client_open(struct client *c, int t, const char *shm_addr,
                       shmipc_config *const cfg[T_COUNT], const struct local *lc,
                       const struct opts *o)
{
    memset(c, 0, sizeof *c);
    c->t = t;
    if (is_shmipc(t)) {
        const shmipc_config *cf = cfg[t];
        char what[64];
        snprintf(what, sizeof what, "%s: connect", transport_name[t]);
        uint64_t t0 = now_ns();
        int rc = shmipc_session_connect(shm_addr, cf, &c->sess);
        if (rc < 0)
            return shm_fail(what, rc);
        c->connect_secs = (double)(now_ns() - t0) / 1e9;
        c->version = shmipc_session_version(c->sess);
        c->wakeup = shmipc_session_wakeup(c->sess, &c->interval_us);
        int ok = c->version == want_version(t) && c->wakeup == want_wakeup(t) &&
                 (t != T_V4P || c->interval_us == o->polling_us);
        if (!ok) {
            fprintf(stderr, "shmipc-bench: %s: the session negotiated protocol V%d with %s wakeups",
                    transport_name[t], c->version, wakeup_name(c->wakeup));
            if (c->wakeup == SHMIPC_WAKEUP_POLLING)
                fprintf(stderr, " every %" PRIu32 " µs", c->interval_us);
            fprintf(stderr, ", not V%d with %s wakeups", want_version(t),
                    wakeup_name(want_wakeup(t)));
            if (t == T_V4P)
                fprintf(stderr, " every %" PRIu32 " µs", o->polling_us);
            fprintf(stderr, ": not reporting a session that fell back or was downgraded\n");
            return -1;
        }
        return largest_slice(cf, &c->window);
    }
    c->uds_path = lc->uds_path;
    c->tcp_port = lc->tcp_port;
    return 0;
}

static void client_close(struct client *c)
{
    shmipc_session_close(c->sess);
    c->sess = NULL;
}

static int sock_connect(const struct client *c)
{
    struct timeval tv = {io_timeout_ms / 1000, io_timeout_ms % 1000 * 1000};
    int one = 1, fd;
    if (c->t == T_UDS) {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof a.sun_path, "%s", c->uds_path);
        if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
            return sys_fail("unix socket");
        if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            sys_fail(c->uds_path);
            close(fd);
            return -1;
        }
    } else {
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons(c->tcp_port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if ((fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
            return sys_fail("tcp socket");
        if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) {
            sys_fail("tcp 127.0.0.1");
            close(fd);
            return -1;
        }
    }
    /* A hung server ends the run with an error instead of hanging it. */
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) {
        sys_fail("socket timeouts");
        close(fd);
        return -1;
    }
    return fd;
}

static void chans_close(const struct client *c, struct chan *ch, int n)
{
    for (int i = 0; i < n; i++) {
        if (is_shmipc(c->t))
            shmipc_stream_close(ch[i].st);
        else if (ch[i].fd >= 0)
            close(ch[i].fd);
        free(ch[i].buf);
    }
    free(ch);
}

/* Opens n streams (shmipc) or connections (sockets) for messages of `size` bytes. */
static struct chan *chans_open(const struct client *c, int n, size_t size)
{
    struct chan *ch = calloc((size_t)n, sizeof *ch);
    if (ch == NULL) {
        fprintf(stderr, "shmipc-bench: out of memory\n");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        ch[i].fd = -1;
    for (int i = 0; i < n; i++) {
        if (is_shmipc(c->t)) {
            int rc = shmipc_session_open_stream(c->sess, &ch[i].st);
            if (rc < 0) {
                shm_fail("open stream", rc);
                if (rc == SHMIPC_EUNHEALTHY)
                    fprintf(stderr, "shmipc-bench: shared memory ran out and data went over the "
                                    "socket: give a larger --buffer or a smaller --max-inflight\n");
                chans_close(c, ch, i);
                return NULL;
            }
        } else if ((ch[i].fd = sock_connect(c)) < 0 || (ch[i].buf = malloc(HDR + size)) == NULL) {
            if (ch[i].fd >= 0)
                fprintf(stderr, "shmipc-bench: out of memory\n");
            chans_close(c, ch, i + 1);
            return NULL;
        }
    }
    return ch;
}

/*
 * Sends message `seq` of `size` bytes. shmipc: the length and the payload are written
 * straight into shared memory through reserve/commit, in windows no larger than a slice,
 * then flushed. Sockets: the same bytes are written into the connection's buffer, then
 * write().
 */
static int chan_send(const struct client *c, struct chan *ch, size_t size, uint64_t seq)
{
    const uint8_t *src = pattern + seq % PATTERN_SLACK;
    if (is_shmipc(c->t)) {
        size_t done = 0, n = min_size(HDR + size, c->window);
        void *p;
        int rc = shmipc_stream_reserve(ch->st, n, &p);
        if (rc < 0)
            return shm_fail("reserve", rc);
        put_be32(p, (uint32_t)size);
        memcpy((uint8_t *)p + HDR, src, n - HDR);
        if ((rc = shmipc_stream_commit(ch->st, n)) < 0)
            return shm_fail("commit", rc);
        done = n - HDR;
        while (done < size) {
            n = min_size(size - done, c->window);
            if ((rc = shmipc_stream_reserve(ch->st, n, &p)) < 0)
                return shm_fail("reserve", rc);
            memcpy(p, src + done, n);
            if ((rc = shmipc_stream_commit(ch->st, n)) < 0)
                return shm_fail("commit", rc);
            done += n;
        }
        if ((rc = shmipc_stream_flush(ch->st)) < 0)
            return shm_fail("flush", rc);
        return 0;
    }
    put_be32(ch->buf, (uint32_t)size);
    memcpy(ch->buf + HDR, src, size);
    const uint8_t *p = ch->buf;
    size_t left = HDR + size;
    while (left > 0) {
        ssize_t w = write(ch->fd, p, left);
        if (w < 0) {
            if (errno == EINTR && !interrupted)
                continue;
            return sys_fail("write");
        }
        p += w;
        left -= (size_t)w;
    }
    return 0;
}

static int check_echo(const uint8_t *hdr, size_t size, uint64_t sum, uint64_t want)
{
    if (get_be32(hdr) != size) {
        fprintf(stderr, "shmipc-bench: echo framing: length %" PRIu32 ", expected %zu\n",
                get_be32(hdr), size);
        return -1;
    }
    if (sum != want) {
        fprintf(stderr,
                "shmipc-bench: echo of %zu bytes is corrupt: sum %" PRIu64 ", expected %" PRIu64
                "\n",
                size, sum, want);
        return -1;
    }
    return 0;
}

/* An echo whose bytes differ from the message sent (in order, not only in sum). */
static int echo_differs(size_t size)
{
    fprintf(stderr, "shmipc-bench: echo of %zu bytes differs from the message sent\n", size);
    return -1;
}

/*
 * Reads the echo of a message, summing every payload byte of every chunk read; with `msg`
 * (the untimed warm-ups) also compares every byte with the message sent, so an echo put
 * together in the wrong order fails too.
 */
static int chan_recv(const struct client *c, struct chan *ch, size_t size, uint64_t want,
                     const uint8_t *msg)
{
    size_t total = HDR + size, got = 0;
    uint8_t hdr[HDR];
    uint64_t sum = 0;
    if (is_shmipc(c->t)) {
        while (got < total) {
            const void *p;
            size_t n;
            int rc = shmipc_stream_read_chunk(ch->st, total - got, &p, &n, 0);
            if (rc < 0)
                return shm_fail("read", rc);
            const uint8_t *b = p;
            while (got < HDR && n > 0) {
                hdr[got++] = *b++;
                n--;
            }
            if (msg != NULL && n > 0 && memcmp(b, msg + (got - HDR), n) != 0)
                return echo_differs(size);
            sum += byte_sum(b, n);
            got += n;
        }
        int rc = shmipc_stream_release(ch->st);
        if (rc < 0)
            return shm_fail("release", rc);
        return check_echo(hdr, size, sum, want);
    }
    while (got < total) {
        ssize_t r = read(ch->fd, ch->buf + got, total - got);
        if (r < 0) {
            if (errno == EINTR && !interrupted)
                continue;
            return sys_fail("read");
        }
        if (r == 0) {
            fprintf(stderr, "shmipc-bench: read: the echo server closed the connection\n");
            return -1;
        }
        size_t from = got < HDR ? HDR : got;
        got += (size_t)r;
        if (got > from)
            sum += byte_sum(ch->buf + from, got - from);
    }
    if (msg != NULL && memcmp(ch->buf + HDR, msg, size) != 0)
        return echo_differs(size);
    return check_echo(ch->buf, size, sum, want);
}

/* `sums` holds the sum of a message of `size` bytes at each pattern offset. */
static int round_trip(const struct client *c, struct chan *ch, size_t size, uint64_t seq,
                      const uint64_t *sums, int verify)
{
    if (chan_send(c, ch, size, seq) < 0)
        return -1;
    return chan_recv(c, ch, size, sums[seq % PATTERN_SLACK],
                     verify ? pattern + seq % PATTERN_SLACK : NULL);
}

/* ------------------------------------------------------------------------------------ */
/* The two shapes                                                                       */
/* ------------------------------------------------------------------------------------ */

/*
 * A one-stream cell's figures: the latency percentiles, then the CPU time per round trip of
 * the client, of the echo server and of both (µs; negative where the server's CPU time is
 * not known: an external server), then the wall time per round trip (the mean).
 */
enum { P50, P90, P99, P999, PMAX, NPCT, CPU_CLIENT = NPCT, CPU_SERVER, CPU_TOTAL, WALL_MEAN, NVAL };
static const char *const pct_key[NPCT] = {"p50", "p90", "p99", "p99_9", "max"};
static const unsigned pct_permille[NPCT] = {500, 900, 990, 999, 1000};

struct lat_cell {
    double us[NVAL];
    int samples;
    int done;
};

struct par_cell {
    double rtps, mibps, secs;
    long batches;
    int done;
};

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int samples_for(const struct opts *o, size_t size)
{
    uint64_t n = o->sample_bytes / size;
    if (n > (uint64_t)o->samples_max)
        n = (uint64_t)o->samples_max;
    if (n < (uint64_t)o->samples_min)
        n = (uint64_t)o->samples_min;
    return (int)n;
}

static int warmup_for(int samples)
{
    return samples / 10 > 20 ? samples / 10 : 20;
}

/* Shape (a): one stream, closed loop, every round trip timed. */
static int run_latency(const struct opts *o, const struct client *c, int si, struct lat_cell *out)
{
    size_t size = o->sizes[si];
    int samples = samples_for(o, size), warm = warmup_for(samples), rc = -1;
    uint64_t *t = malloc((size_t)samples * sizeof *t), seq = 0;
    struct chan *ch = t != NULL ? chans_open(c, 1, size) : NULL;
    if (ch == NULL)
        goto out;
    for (int i = 0; i < warm; i++)
        if (interrupted || round_trip(c, ch, size, seq++, expected_sum[si], 1) < 0)
            goto out;
    /* CPU time around the timed loop: the server's read first and last, so that the system
     * call that reads it is not counted as the client's. */
    uint64_t s0 = server_cpu_ns(), c0 = client_cpu_ns(), w0 = now_ns();
    for (int i = 0; i < samples; i++) {
        uint64_t t0 = now_ns();
        if (interrupted || round_trip(c, ch, size, seq++, expected_sum[si], 0) < 0)
            goto out;
        t[i] = now_ns() - t0;
    }
    uint64_t w1 = now_ns(), c1 = client_cpu_ns(), s1 = server_cpu_ns();
    out->us[CPU_CLIENT] = (double)(c1 - c0) / 1000.0 / samples;
    out->us[CPU_SERVER] = s0 == UINT64_MAX || s1 == UINT64_MAX || s1 < s0
                              ? -1.0
                              : (double)(s1 - s0) / 1000.0 / samples;
    out->us[CPU_TOTAL] = out->us[CPU_SERVER] < 0 ? -1.0 : out->us[CPU_CLIENT] + out->us[CPU_SERVER];
    out->us[WALL_MEAN] = (double)(w1 - w0) / 1000.0 / samples;
    qsort(t, (size_t)samples, sizeof *t, cmp_u64);
    for (int p = 0; p < NPCT; p++) {
        size_t k = ((size_t)samples * pct_permille[p] + 999) / 1000;
        out->us[p] = (double)t[(k ? k : 1) - 1] / 1000.0;
    }
    out->samples = samples;
    out->done = 1;
    rc = 0;
out:
    if (ch != NULL)
        chans_close(c, ch, 1);
    free(t);
    return rc;
}

/* Writes one message to each of the n streams, then reads the n echoes (`verify`: byte by byte). */
static int batch(const struct client *c, struct chan *ch, int n, size_t size, uint64_t *seq,
                 const uint64_t *sums, int verify)
{
    for (int i = 0; i < n; i++)
        if (chan_send(c, &ch[i], size, *seq + (uint64_t)i) < 0)
            return -1;
    for (int i = 0; i < n; i++) {
        uint64_t k = (*seq + (uint64_t)i) % PATTERN_SLACK;
        if (chan_recv(c, &ch[i], size, sums[k], verify ? pattern + k : NULL) < 0)
            return -1;
    }
    *seq += (uint64_t)n;
    return 0;
}

/* Streams actually used for `count` requested at `size`: at most --max-inflight per batch. */
static int effective_streams(const struct opts *o, size_t size, int count)
{
    uint64_t cap = o->max_inflight / size;
    if (cap < 1)
        cap = 1;
    return (uint64_t)count > cap ? (int)cap : count;
}

/* Shape (b): n streams in flight for --duration ms after --warmup ms. */
static int run_parallel(const struct opts *o, const struct client *c, int si, int n,
                        struct par_cell *out)
{
    size_t size = o->sizes[si];
    uint64_t seq = 0;
    long batches = 0;
    int rc = -1;
    struct chan *ch = chans_open(c, n, size);
    if (ch == NULL)
        return -1;
    /* At least one untimed batch: the first touches of memory and connections stay out. */
    uint64_t end = now_ns() + (uint64_t)o->warmup_ms * 1000000u;
    do {
        if (interrupted || batch(c, ch, n, size, &seq, expected_sum[si], 1) < 0)
            goto out;
    } while (now_ns() < end);
    uint64_t t0 = now_ns();
    end = t0 + (uint64_t)o->duration_ms * 1000000u;
    uint64_t t1;
    do {
        if (interrupted || batch(c, ch, n, size, &seq, expected_sum[si], 0) < 0)
            goto out;
        batches++;
        t1 = now_ns();
    } while (t1 < end || batches < 3);
    out->secs = (double)(t1 - t0) / 1e9;
    out->batches = batches;
    out->rtps = (double)batches * n / out->secs;
    out->mibps = 2.0 * (double)size * out->rtps / (1024.0 * 1024.0);
    out->done = 1;
    rc = 0;
out:
    chans_close(c, ch, n);
    return rc;
}

/* What a session negotiated, and what its untimed warm-up cost. */
struct warm {
    int opened;
    int version, wakeup;
    uint32_t interval_us;
    double connect_secs; /* the handshake, which lays the buffer out */
    uint64_t round_trips;
    double secs;
};
static struct warm warm_info[T_COUNT];

/*
 * What watching one idle V4 polling session costs the echo server: its CPU time over a quiet
 * spell, as a fraction of one CPU, with the polling session watched and without (the baseline:
 * every other session idle). -1 when not measured.
 */
static double idle_watched = -1, idle_unwatched = -1;
static int idle_ms;

/*
 * Uses every slice of a session's buffer once, untimed. The free lists are FIFO, as in the
 * reference, so a session walks through every slice of a class before it reuses one, and
 * that first walk takes a page fault on every page it touches, in each process. The figures
 * are of the steady state after it; what the walk cost is printed beside them.
 *
 * Each peer also keeps a few slices it is done with (up to 8 per class, at most 1/16 of the
 * class) and writes its next message into them, so a batch no larger than that never reaches
 * the free list: the walk keeps a quarter of a class's slices in flight (at most 64 streams),
 * which drives it through the list. With 8 streams it stayed in the kept slices, and the
 * first 64-stream cells paid the page faults instead (50-90 ms per batch instead of ~1.5).
 */
static int session_warm(const struct opts *o, const struct client *c, const shmipc_config *cfg)
{
    shmipc_slice_class cls[SHMIPC_MAX_SLICE_CLASSES];
    uint64_t sums[PATTERN_SLACK], t0 = now_ns(), total = 0;
    int n = shmipc_config_get_slice_classes(cfg, cls, SHMIPC_MAX_SLICE_CLASSES);
    if (n <= 0)
        return shm_fail("config: slice classes", n < 0 ? n : SHMIPC_EINVAL);
    for (int i = 0; i < n; i++) {
        if (cls[i].size <= HDR)
            continue;
        /* A message that fills one slice of the class; requests alone cover all of them. */
        size_t size = cls[i].size - HDR;
        uint64_t slices = o->buffer * cls[i].percent / 100 / cls[i].size + 1, seq = 0;
        int streams = slices / 4 > 64 ? 64 : slices / 4 < 1 ? 1 : (int)(slices / 4);
        for (unsigned k = 0; k < PATTERN_SLACK; k++)
            sums[k] = byte_sum(pattern + k, size);
        struct chan *ch = chans_open(c, streams, size);
        if (ch == NULL)
            return -1;
        /*
         * A batch of N takes N slices in each direction, at most min(8, slices / 16) of each
         * from the kept ones: at least 1.5 N from the free list, so `slices` round trips walk
         * the whole list.
         */
        while (seq < slices) {
            if (interrupted || batch(c, ch, streams, size, &seq, sums, 1) < 0) {
                chans_close(c, ch, streams);
                fprintf(stderr, "shmipc-bench: %s: session warm-up failed\n", transport_name[c->t]);
                return -1;
            }
        }
        chans_close(c, ch, streams);
        total += seq;
    }
    warm_info[c->t].round_trips = total;
    warm_info[c->t].secs = (double)(now_ns() - t0) / 1e9;
    return 0;
}

/* The largest slice class of a config: the warm-up sends messages that fill it. */
static size_t warm_max_size(const shmipc_config *cfg)
{
    uint32_t w;
    return largest_slice(cfg, &w) == 0 && w > HDR ? w - HDR : 0;
}

/* ------------------------------------------------------------------------------------ */
/* Results                                                                              */
/* ------------------------------------------------------------------------------------ */

struct results {
    const struct opts *o;
    int rounds_done;
    struct lat_cell *lat;           /* [size][transport][round] */
    struct par_cell *par;           /* [size][count][transport][round] */
    int eff[MAX_SIZES][MAX_COUNTS]; /* streams used; 0 when it repeats an earlier count */
    int has[T_COUNT];
};

static struct lat_cell *lat_at(struct results *r, int si, int t, int round)
{
    return &r->lat[((size_t)si * T_COUNT + (size_t)t) * MAX_ROUNDS + (size_t)round];
}

static struct par_cell *par_at(struct results *r, int si, int ci, int t, int round)
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
static double lat_median(struct results *r, int si, int t, int p)
{
    double v[MAX_ROUNDS];
    int n = 0;
    for (int k = 0; k < r->rounds_done; k++)
        if (lat_at(r, si, t, k)->done)
            v[n++] = lat_at(r, si, t, k)->us[p];
    return median(v, n);
}

static double par_median(struct results *r, int si, int ci, int t, int mib)
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

static void fmt_us(char *buf, size_t cap, double us)
{
    if (us < 100)
        snprintf(buf, cap, "%.2f", us);
    else if (us < 1000)
        snprintf(buf, cap, "%.1f", us);
    else
        snprintf(buf, cap, "%.0f", us);
}

static void write_env(FILE *f, const struct opts *o, const struct env *e, int markdown)
{
    const char *b = markdown ? "- " : "";
    fprintf(f, "%sshmipc: %s (build %s, gcc %s)\n", b, shmipc_version_string(),
            SHMIPC_BENCH_BUILDTYPE, __VERSION__);
    fprintf(f, "%skernel: %s\n", b, e->kernel);
    fprintf(f, "%scpu: %s, %ld CPUs online\n", b, e->cpu_model, e->cpus);
    fprintf(f, "%spinning: %s\n", b, e->pinning);
    fprintf(f, "%sload average (1, 5, 15 min): %s at the start", b, e->load_start);
    if (e->load_end[0] != '\0')
        fprintf(f, ", %s at the end", e->load_end);
    fprintf(f, "\n");
    fprintf(f,
            "%sshmipc config: buffer %" PRIu64 " MiB, slice classes %s, queue capacity %" PRIu32
            ", read timeout %d ms; V4 polling interval %" PRIu32 " µs (--polling-us)\n",
            b, o->buffer >> 20, o->slices, o->queue, io_timeout_ms, o->polling_us);
    fprintf(f,
            "%sone stream: round trips per size = clamp(%" PRIu64
            " MiB / size, %d, %d), after an untimed warm-up of a tenth (at least 20)\n",
            b, o->sample_bytes >> 20, o->samples_min, o->samples_max);
    fprintf(f,
            "%sparallel: %d ms timed after %d ms warm-up per cell; streams x size capped at "
            "%" PRIu64 " MiB per batch (--max-inflight)\n",
            b, o->duration_ms, o->warmup_ms, o->max_inflight >> 20);
    fprintf(f, "%srounds: %d, interleaved cell by cell in the order", b, o->rounds);
    for (int i = 0; i < o->ntransports; i++)
        fprintf(f, "%s %s", i ? "," : "", transport_name[o->transports[i]]);
    fprintf(f, "; figures are medians of the rounds\n");
    if (o->warm)
        fprintf(f,
                "%sshmipc sessions: one per transport for the whole run; before the rounds "
                "an untimed warm-up uses every slice once (the free lists are FIFO)\n",
                b);
    else
        fprintf(f,
                "%sshmipc sessions: one per transport for the whole run, not warmed up "
                "(--no-warmup)\n",
                b);
    for (int t = 0; t < T_COUNT; t++) {
        const struct warm *w = &warm_info[t];
        if (!w->opened)
            continue;
        fprintf(f, "%s%s session: negotiated V%d with %s wakeups", b, transport_name[t], w->version,
                wakeup_name(w->wakeup));
        if (w->wakeup == SHMIPC_WAKEUP_POLLING)
            fprintf(f, " every %" PRIu32 " µs", w->interval_us);
        fprintf(f, "; connect %.3f s", w->connect_secs);
        if (w->round_trips > 0)
            fprintf(f, "; warm-up %" PRIu64 " round trips in %.2f s", w->round_trips, w->secs);
        fprintf(f, "\n");
    }
    fprintf(f,
            "%sCPU time per one-stream round trip: client = this process "
            "(CLOCK_PROCESS_CPUTIME_ID), server = %s, each read around the timed loop and "
            "divided by its round trips\n",
            b,
            o->connect_addr   ? "not known (an external server)"
            : server_clock_ok ? "the echo server child (its CPU-time clock, clock_getcpuclockid)"
                              : "the echo server child (utime + stime from /proc/PID/stat)");
    if (!o->connect_addr && (o->ntransports > 1 || o->transports[0] == T_V4P))
        fprintf(f,
                "%sthe echo server watches a V4 polling session's descriptor (a timer that "
                "fires every interval) only during that transport's cells\n",
                b);
    if (idle_watched >= 0)
        fprintf(f,
                "%sidle echo server, every session quiet, over %d ms: %.1f%% of a CPU with the "
                "V4 polling session watched, %.1f%% without it\n",
                b, idle_ms, 100 * idle_watched, 100 * idle_unwatched);
    if (o->connect_addr)
        fprintf(f, "%sclient only, against the external echo server at %s\n", b, o->connect_addr);
    else
        fprintf(f,
                "%secho server: %s; the socket echoes send back the buffer they received "
                "into\n",
                b,
                echo_copy ? "shmipc copies each payload into new slices (--echo copy)"
                          : "shmipc forwards each payload's slices back untouched "
                            "(shmipc_stream_forward; --echo copy to copy them)");
    fprintf(f, "%scommand: `%s`\n", b, o->command);
}

/* Ratio of a transport's figure to the unix socket's, as " (0.93x)", or "" without UDS. */
static void fmt_ratio(char *buf, size_t cap, double v, double uds)
{
    if (uds > 0 && v > 0)
        snprintf(buf, cap, " (%.2fx)", v / uds);
    else
        buf[0] = '\0';
}

static void write_tables(FILE *f, struct results *r)
{
    const struct opts *o = r->o;
    char sz[32], a[32], q[32];
    int uds = r->has[T_UDS];
    fprintf(f, "\n### One stream, closed loop: round-trip latency in µs (median of %d rounds)\n\n",
            r->rounds_done);
    if (uds)
        fprintf(f, "In parentheses: the figure divided by the unix socket's at the same size "
                   "(below 1 is faster).\n\n");
    fprintf(f, "| size | transport | samples | p50 | p90 | p99 | p99.9 | max |\n");
    fprintf(f, "|---:|---|---:|---:|---:|---:|---:|---:|\n");
    for (int si = 0; si < o->nsizes; si++) {
        fmt_size(sz, sizeof sz, o->sizes[si]);
        for (int i = 0; i < o->ntransports; i++) {
            int t = o->transports[i];
            fprintf(f, "| %s | %s | %d |", sz, transport_name[t], samples_for(o, o->sizes[si]));
            for (int p = 0; p < NPCT; p++) {
                double v = lat_median(r, si, t, p);
                fmt_us(a, sizeof a, v);
                if (t != T_UDS && uds)
                    fmt_ratio(q, sizeof q, v, lat_median(r, si, T_UDS, p));
                else
                    q[0] = '\0';
                fprintf(f, " %s%s |", a, q);
            }
            fprintf(f, "\n");
        }
    }
    fprintf(f,
            "\n### One stream: CPU time per round trip in µs (median of %d rounds)\n\n"
            "Client: the benchmark process; server: the echo server; total: both. Wall: the "
            "mean round trip of the same loop; total / wall is how many CPUs the ping-pong "
            "kept busy.",
            r->rounds_done);
    if (uds)
        fprintf(f, " In parentheses: the total divided by the unix socket's at the same size.");
    fprintf(f, "\n\n| size | transport | wall | client | server | total | total / wall |\n");
    fprintf(f, "|---:|---|---:|---:|---:|---:|---:|\n");
    for (int si = 0; si < o->nsizes; si++) {
        fmt_size(sz, sizeof sz, o->sizes[si]);
        for (int i = 0; i < o->ntransports; i++) {
            int t = o->transports[i];
            double wall = lat_median(r, si, t, WALL_MEAN), cl = lat_median(r, si, t, CPU_CLIENT),
                   sv = lat_median(r, si, t, CPU_SERVER), tot = lat_median(r, si, t, CPU_TOTAL);
            fmt_us(a, sizeof a, wall);
            fprintf(f, "| %s | %s | %s |", sz, transport_name[t], a);
            fmt_us(a, sizeof a, cl);
            fprintf(f, " %s |", a);
            if (sv < 0) {
                fprintf(f, " n/a | n/a | n/a |\n");
                continue;
            }
            fmt_us(a, sizeof a, sv);
            fprintf(f, " %s |", a);
            fmt_us(a, sizeof a, tot);
            if (t != T_UDS && uds)
                fmt_ratio(q, sizeof q, tot, lat_median(r, si, T_UDS, CPU_TOTAL));
            else
                q[0] = '\0';
            fprintf(f, " %s%s | %.2f |\n", a, q, wall > 0 ? tot / wall : 0.0);
        }
    }
    fprintf(f,
            "\n### N streams in flight: MiB/s (2 x payload x round trips / s; median of %d "
            "rounds)\n\n",
            r->rounds_done);
    fprintf(f,
            "One client thread writes a message to each of N streams (connections), then "
            "reads the N echoes, for %d ms per cell. Round trips per second are MiB/s x 2^20 / "
            "(2 x size); the JSON has them.",
            o->duration_ms);
    if (uds)
        fprintf(f, " In parentheses: throughput divided by the unix socket's (above 1 is "
                   "faster).");
    fprintf(f, "\n\n| size | streams |");
    for (int i = 0; i < o->ntransports; i++)
        fprintf(f, " %s |", transport_name[o->transports[i]]);
    fprintf(f, "\n|---:|---:|");
    for (int i = 0; i < o->ntransports; i++)
        fprintf(f, "---:|");
    fprintf(f, "\n");
    for (int si = 0; si < o->nsizes; si++) {
        fmt_size(sz, sizeof sz, o->sizes[si]);
        for (int ci = 0; ci < o->ncounts; ci++) {
            int n = r->eff[si][ci];
            if (n == 0)
                continue;
            if (n < o->counts[ci])
                fprintf(f, "| %s | %d (of %d) |", sz, n, o->counts[ci]);
            else
                fprintf(f, "| %s | %d |", sz, n);
            for (int i = 0; i < o->ntransports; i++) {
                int t = o->transports[i];
                double v = par_median(r, si, ci, t, 1), u = par_median(r, si, ci, T_UDS, 1);
                if (t != T_UDS && uds && u > 0)
                    fprintf(f, " %.1f (%.2fx) |", v, v / u);
                else
                    fprintf(f, " %.1f |", v);
            }
            fprintf(f, "\n");
        }
    }
}

/*
 * The bar of issue 3 (the IPC core, legacy protocol): one-stream p50 at 64 B no worse than
 * the unix socket; at 64 KiB and above, parallel throughput at least twice the unix socket's.
 * Judged on V3 and V2. Returns 1 met, 0 not met, -1 when this run did not measure what the
 * bar needs.
 */
static int write_bar(FILE *f, struct results *r, int markdown)
{
    const struct opts *o = r->o;
    int met = 1, measured = 0, si64 = -1;
    char sz[32];
    if (!r->has[T_UDS] || (!r->has[T_V3] && !r->has[T_V2]))
        return -1;
    for (int si = 0; si < o->nsizes; si++)
        if (o->sizes[si] == 64)
            si64 = si;
    fprintf(f, "\n### The bar (issue 3)\n\n");
    for (int t = T_V3; t <= T_V2; t++) {
        if (!r->has[t])
            continue;
        if (si64 >= 0) {
            double v = lat_median(r, si64, t, P50), u = lat_median(r, si64, T_UDS, P50);
            int ok = v <= u;
            met &= ok;
            measured = 1;
            fprintf(f, "%s%s one-stream p50 at 64 B: %.2f µs vs UDS %.2f µs (%.2fx): %s\n",
                    markdown ? "- " : "", transport_name[t], v, u, v / u, ok ? "met" : "NOT met");
        }
        int cells = 0, ok_cells = 0;
        double worst = 1e300;
        int worst_si = -1, worst_n = 0;
        for (int si = 0; si < o->nsizes; si++) {
            if (o->sizes[si] < 65536)
                continue;
            for (int ci = 0; ci < o->ncounts; ci++) {
                if (r->eff[si][ci] == 0)
                    continue;
                double u = par_median(r, si, ci, T_UDS, 1);
                double ratio = u > 0 ? par_median(r, si, ci, t, 1) / u : 0;
                cells++;
                ok_cells += ratio >= 2.0;
                if (ratio < worst) {
                    worst = ratio;
                    worst_si = si;
                    worst_n = r->eff[si][ci];
                }
            }
        }
        if (cells > 0) {
            measured = 1;
            met &= ok_cells == cells;
            fmt_size(sz, sizeof sz, o->sizes[worst_si]);
            fprintf(f,
                    "%s%s parallel throughput at 64 KiB and above: %d of %d cells at 2x UDS or "
                    "more; lowest %.2fx (%s, %d streams): %s\n",
                    markdown ? "- " : "", transport_name[t], ok_cells, cells, worst, sz, worst_n,
                    ok_cells == cells ? "met" : "NOT met");
        }
    }
    if (!measured)
        return -1;
    fprintf(f, "%sbar: %s\n", markdown ? "- " : "", met ? "met" : "NOT met");
    return met;
}

/* The index of the 64 B size, or -1. */
static int size64(const struct opts *o)
{
    for (int si = 0; si < o->nsizes; si++)
        if (o->sizes[si] == 64)
            return si;
    return -1;
}

/*
 * The bar of issue 4 (protocol V4): V4 eventfd one-stream p50 at 64 B below both legacy V3
 * and the unix socket in the same run. The other V4 modes are listed beside it (they are not
 * part of the bar). Returns 1 met, 0 not met, -1 when this run did not measure it.
 */
static int write_bar4(FILE *f, struct results *r, int markdown)
{
    const struct opts *o = r->o;
    int si = size64(o);
    const char *b = markdown ? "- " : "";
    fprintf(f, "\n### The bar (issue 4)\n\n");
    if (si < 0 || !r->has[T_V4E] || !r->has[T_V3] || !r->has[T_UDS]) {
        fprintf(f,
                "%snot measured: the bar needs 64 B and the transports v4-eventfd, v3 and "
                "uds in one run\n",
                b);
        return -1;
    }
    double v3 = lat_median(r, si, T_V3, P50), u = lat_median(r, si, T_UDS, P50);
    int met = 0;
    for (int t = T_V4; t <= T_V4P; t++) {
        if (!r->has[t])
            continue;
        double v = lat_median(r, si, t, P50);
        double cpu = lat_median(r, si, t, CPU_TOTAL), cpu3 = lat_median(r, si, T_V3, CPU_TOTAL),
               cpuu = lat_median(r, si, T_UDS, CPU_TOTAL);
        int ok = v < v3 && v < u;
        fprintf(f,
                "%s%s one-stream p50 at 64 B: %.2f µs vs V3 %.2f µs (%.2fx) and UDS %.2f µs "
                "(%.2fx)",
                b, transport_name[t], v, v3, v / v3, u, v / u);
        if (cpu >= 0 && cpu3 > 0 && cpuu > 0)
            fprintf(f, "; CPU per round trip %.2f µs vs V3 %.2f and UDS %.2f", cpu, cpu3, cpuu);
        if (t == T_V4E) {
            met = ok;
            fprintf(f, ": %s\n", ok ? "met" : "NOT met");
        } else {
            fprintf(f, " (%s both; not part of the bar)\n", ok ? "below" : "not below");
        }
    }
    fprintf(f, "%sbar: %s\n", b, met ? "met" : "NOT met");
    return met;
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

/* CPU time per round trip, µs; the server's (and so the total) null when not known. */
static void json_cpu(FILE *f, double client, double server, double total)
{
    fprintf(f, "{\"client\": %.3f, \"server\": ", client);
    if (server >= 0)
        fprintf(f, "%.3f, \"total\": %.3f}", server, total);
    else
        fprintf(f, "null, \"total\": null}");
}

/*
 * What an idle session costs, per transport: one round trip, then the CPU time of both
 * processes over idle_ms of quiet (as a share of one CPU). The other sessions have been quiet
 * since the rounds, so the window holds what this transport's last message leaves behind: a
 * spin of at most the budget, then sleep. -1 when not measured.
 */
static double idle_share[T_COUNT][2]; /* [t][0] client, [t][1] server */
static int idle_window_ms;

static int measure_idle_after(const struct opts *o, const struct client *c)
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

static void write_idle(FILE *f, const struct opts *o, int markdown)
{
    if (idle_window_ms <= 0)
        return;
    fprintf(f,
            "\n### Idle: CPU over %d ms after each transport's last message (%% of one CPU)\n\n"
            "One 64 B round trip (the first size), then nothing: a waiter spins at most its "
            "budget (--spin-us: %s), then sleeps.\n\n",
            idle_window_ms, o->spin_us >= 0 ? "set" : "the default");
    fprintf(f, "| transport | client | server | total |\n|---|---:|---:|---:|\n");
    for (int i = 0; i < o->ntransports; i++) {
        int t = o->transports[i];
        double cl = idle_share[t][0], sv = idle_share[t][1];
        if (cl < 0)
            continue;
        fprintf(f, "| %s | %.3f%% | %s%.3f%% | %.3f%% |\n", transport_name[t], 100 * cl,
                sv < 0 ? "n/a " : "", 100 * (sv < 0 ? 0 : sv), 100 * (cl + (sv < 0 ? 0 : sv)));
    }
    (void)markdown;
}

/*
 * The memcpy floor of a large round trip: a payload is copied once into shared memory by the
 * client and read once on the way back (the echo forwards the slices untouched), so a round
 * trip cannot beat two passes over its bytes. Measured once, 1 MiB between two buffers that
 * stay in cache as they would in the benchmark's loop; the median of 64 copies.
 */
static double memcpy_gibps = -1;

static void measure_memcpy(void)
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

static void write_memcpy_floor(FILE *f, struct results *r)
{
    const struct opts *o = r->o;
    int si = -1;
    for (int i = 0; i < o->nsizes; i++)
        if (o->sizes[i] == (1u << 20))
            si = i;
    if (si < 0 || memcpy_gibps <= 0)
        return;
    /* Two passes over 1 MiB (the write into shared memory and the read of the echo). */
    double floor_us = 2.0 * (double)(1u << 20) / (memcpy_gibps * (double)(1u << 30)) * 1e6;
    fprintf(f,
            "\n### 1 MiB round trip against the memcpy floor\n\nmemcpy: %.2f GiB/s (1 MiB, "
            "median of 64); floor of a round trip = 2 x 1 MiB = %.1f µs\n\n",
            memcpy_gibps, floor_us);
    fprintf(f, "| transport | p50 | p50 / floor |\n|---|---:|---:|\n");
    for (int i = 0; i < o->ntransports; i++) {
        int t = o->transports[i];
        double p50 = lat_median(r, si, t, P50);
        if (p50 > 0)
            fprintf(f, "| %s | %.1f µs | %.2fx |\n", transport_name[t], p50, p50 / floor_us);
    }
}

static int write_json(const char *path, struct results *r, const struct env *e)
{
    const struct opts *o = r->o;
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return sys_fail(path);
    fprintf(f, "{\n  \"bench\": \"ipc\",\n  \"shmipc_version\": ");
    json_str(f, shmipc_version_string());
    fprintf(f, ",\n  \"command\": ");
    json_str(f, o->command);
    fprintf(f, ",\n  \"echo\": \"%s\"", echo_copy ? "copy" : "forward");
    fprintf(f, ",\n  \"env\": {\"kernel\": ");
    json_str(f, e->kernel);
    fprintf(f, ", \"cpu_model\": ");
    json_str(f, e->cpu_model);
    fprintf(f, ", \"cpus\": %ld, \"pinned\": %s, \"pinning\": ", e->cpus,
            e->pinned ? "true" : "false");
    json_str(f, e->pinning);
    fprintf(f, ", \"loadavg_start\": ");
    json_str(f, e->load_start);
    fprintf(f, ", \"loadavg_end\": ");
    json_str(f, e->load_end);
    fprintf(f, ", \"buildtype\": ");
    json_str(f, SHMIPC_BENCH_BUILDTYPE);
    fprintf(f, ", \"compiler\": ");
    json_str(f, "gcc " __VERSION__);
    fprintf(f, ", \"server_cpu_source\": ");
    json_str(f, o->connect_addr   ? "none"
                : server_clock_ok ? "clock_getcpuclockid"
                                  : "/proc/PID/stat");
    fprintf(f, ", \"idle_server_cpu\": ");
    if (idle_watched >= 0)
        fprintf(f,
                "{\"ms\": %d, \"polling_session_watched\": %.4f, "
                "\"polling_session_not_watched\": %.4f}",
                idle_ms, idle_watched, idle_unwatched);
    else
        fprintf(f, "null");
    /* Every shmipc session: what it negotiated and what its warm-up cost. */
    fprintf(f, ", \"warmup\": {");
    for (int t = 0, k = 0; t < T_COUNT; t++) {
        const struct warm *w = &warm_info[t];
        if (!w->opened)
            continue;
        fprintf(f,
                "%s\"%s\": {\"version\": %d, \"wakeup\": \"%s\", \"polling_interval_us\": %" PRIu32
                ", \"connect_seconds\": %.4f, \"round_trips\": %" PRIu64 ", \"seconds\": %.3f}",
                k++ ? ", " : "", transport_name[t], w->version, wakeup_name(w->wakeup),
                w->interval_us, w->connect_secs, w->round_trips, w->secs);
    }
    fprintf(f, "}");
    fprintf(f,
            "},\n  \"config\": {\"buffer_capacity\": %" PRIu64 ", \"slice_classes\": ", o->buffer);
    json_str(f, o->slices);
    fprintf(f,
            ", \"queue_capacity\": %" PRIu32 ", \"rounds\": %d, \"samples_max\": %d, "
            "\"samples_min\": %d, \"sample_bytes\": %" PRIu64 ", \"duration_ms\": %d, "
            "\"warmup_ms\": %d, \"max_inflight\": %" PRIu64 ", \"polling_interval_us\": %" PRIu32
            ", \"quick\": %s, \"connect\": ",
            o->queue, r->rounds_done, o->samples_max, o->samples_min, o->sample_bytes,
            o->duration_ms, o->warmup_ms, o->max_inflight, o->polling_us,
            o->quick ? "true" : "false");
    if (o->connect_addr)
        json_str(f, o->connect_addr);
    else
        fprintf(f, "null");
    fprintf(f, "},\n  \"transports\": [");
    for (int i = 0; i < o->ntransports; i++)
        fprintf(f, "%s\"%s\"", i ? ", " : "", transport_name[o->transports[i]]);
    fprintf(f, "],\n  \"latency\": [");
    int first = 1;
    for (int si = 0; si < o->nsizes; si++) {
        for (int i = 0; i < o->ntransports; i++) {
            int t = o->transports[i];
            fprintf(f, "%s\n    {\"size\": %zu, \"transport\": \"%s\", \"samples\": %d",
                    first ? "" : ",", o->sizes[si], transport_name[t],
                    samples_for(o, o->sizes[si]));
            first = 0;
            for (int p = 0; p < NPCT; p++)
                fprintf(f, ", \"%s_us\": %.3f", pct_key[p], lat_median(r, si, t, p));
            fprintf(f, ", \"wall_us_mean\": %.3f, \"cpu_us_per_rt\": ",
                    lat_median(r, si, t, WALL_MEAN));
            json_cpu(f, lat_median(r, si, t, CPU_CLIENT), lat_median(r, si, t, CPU_SERVER),
                     lat_median(r, si, t, CPU_TOTAL));
            fprintf(f, ", \"ratio_to_uds\": ");
            if (t != T_UDS && r->has[T_UDS]) {
                fprintf(f, "{");
                for (int p = 0; p < NPCT; p++)
                    fprintf(f, "%s\"%s\": %.4f", p ? ", " : "", pct_key[p],
                            lat_median(r, si, t, p) / lat_median(r, si, T_UDS, p));
                double c = lat_median(r, si, t, CPU_TOTAL),
                       cu = lat_median(r, si, T_UDS, CPU_TOTAL);
                if (c >= 0 && cu > 0)
                    fprintf(f, ", \"cpu_total\": %.4f", c / cu);
                fprintf(f, "}");
            } else {
                fprintf(f, "null");
            }
            fprintf(f, ", \"rounds\": [");
            for (int k = 0; k < r->rounds_done; k++) {
                struct lat_cell *lc = lat_at(r, si, t, k);
                fprintf(f, "%s{", k ? ", " : "");
                for (int p = 0; p < NPCT; p++)
                    fprintf(f, "%s\"%s_us\": %.3f", p ? ", " : "", pct_key[p], lc->us[p]);
                fprintf(f, ", \"wall_us_mean\": %.3f, \"cpu_us_per_rt\": ", lc->us[WALL_MEAN]);
                json_cpu(f, lc->us[CPU_CLIENT], lc->us[CPU_SERVER], lc->us[CPU_TOTAL]);
                fprintf(f, "}");
            }
            fprintf(f, "]}");
        }
    }
    fprintf(f, "\n  ],\n  \"parallel\": [");
    first = 1;
    for (int si = 0; si < o->nsizes; si++) {
        for (int ci = 0; ci < o->ncounts; ci++) {
            if (r->eff[si][ci] == 0)
                continue;
            for (int i = 0; i < o->ntransports; i++) {
                int t = o->transports[i];
                double mib = par_median(r, si, ci, t, 1);
                fprintf(f,
                        "%s\n    {\"size\": %zu, \"streams\": %d, \"streams_requested\": %d, "
                        "\"transport\": \"%s\", \"rt_per_s\": %.1f, \"mib_per_s\": %.2f, "
                        "\"ratio_to_uds\": ",
                        first ? "" : ",", o->sizes[si], r->eff[si][ci], o->counts[ci],
                        transport_name[t], par_median(r, si, ci, t, 0), mib);
                first = 0;
                if (t != T_UDS && r->has[T_UDS])
                    fprintf(f, "%.4f", mib / par_median(r, si, ci, T_UDS, 1));
                else
                    fprintf(f, "null");
                fprintf(f, ", \"rounds\": [");
                for (int k = 0; k < r->rounds_done; k++) {
                    struct par_cell *pc = par_at(r, si, ci, t, k);
                    fprintf(f,
                            "%s{\"rt_per_s\": %.1f, \"mib_per_s\": %.2f, \"batches\": %ld, "
                            "\"seconds\": %.4f}",
                            k ? ", " : "", pc->rtps, pc->mibps, pc->batches, pc->secs);
                }
                fprintf(f, "]}");
            }
        }
    }
    fprintf(f, "\n  ],\n  \"bar\": ");
    FILE *devnull = fopen("/dev/null", "w");
    int bar = devnull != NULL ? write_bar(devnull, r, 0) : -1;
    if (devnull != NULL)
        fclose(devnull);
    fprintf(f, "%s", bar < 0 ? "null" : bar ? "\"met\"" : "\"not met\"");
    /* Issue 4: V4 eventfd one-stream p50 at 64 B below both V3 and the unix socket. */
    devnull = fopen("/dev/null", "w");
    bar = devnull != NULL ? write_bar4(devnull, r, 0) : -1;
    if (devnull != NULL)
        fclose(devnull);
    fprintf(f, ",\n  \"bar_issue_4\": ");
    int si = size64(o);
    if (bar < 0)
        fprintf(f, "null");
    else
        fprintf(f,
                "{\"verdict\": \"%s\", \"v4_eventfd_p50_us\": %.3f, \"v3_p50_us\": %.3f, "
                "\"uds_p50_us\": %.3f}",
                bar ? "met" : "not met", lat_median(r, si, T_V4E, P50),
                lat_median(r, si, T_V3, P50), lat_median(r, si, T_UDS, P50));
    fprintf(f, ",\n  \"spin_us\": %d,\n  \"idle_ms\": %d,\n  \"idle_cpu_share\": {", o->spin_us,
            idle_window_ms);
    int none = 1;
    for (int i = 0; i < o->ntransports; i++) {
        int t = o->transports[i];
        if (idle_share[t][0] < 0)
            continue;
        fprintf(f, "%s\n    \"%s\": {\"client\": %.5f, \"server\": %.5f}", none ? "" : ",",
                transport_name[t], idle_share[t][0], idle_share[t][1]);
        none = 0;
    }
    fprintf(f, "%s},\n  \"memcpy_gibps\": %.3f\n}\n", none ? "" : "\n  ", memcpy_gibps);
    if (fclose(f) != 0)
        return sys_fail(path);
    return 0;
}

static int write_md(const char *path, struct results *r, const struct opts *o, const struct env *e)
{
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return sys_fail(path);
    fprintf(f, "## shmipc-bench ipc\n\n");
    write_env(f, o, e, 1);
    write_tables(f, r);
    write_idle(f, o, 1);
    write_memcpy_floor(f, r);
    write_bar(f, r, 1);
    write_bar4(f, r, 1);
    if (fclose(f) != 0)
        return sys_fail(path);
    return 0;
}

/* ------------------------------------------------------------------------------------ */
/* The run                                                                              */
/* ------------------------------------------------------------------------------------ */

static void client_on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
    /* Ending the server makes every blocked call of the client fail and clean up. */
    if (server_pid > 0)
        kill(server_pid, SIGTERM);
}

/*
 * One round: every cell once, each cell on every transport in turn. The echo server watches
 * the V4 polling session only during its own cells (see struct server).
 */
static int run_round(const struct opts *o, struct results *r, int round, const struct client *cl,
                     struct local *lc)
{
    for (int si = 0; si < o->nsizes; si++) {
        for (int i = 0; i < o->ntransports; i++) {
            if (server_watch_polling(lc, o->transports[i] == T_V4P) < 0)
                return -1;
            if (run_latency(o, &cl[i], si, lat_at(r, si, o->transports[i], round)) < 0) {
                fprintf(stderr, "shmipc-bench: one stream, %zu B, %s: failed\n", o->sizes[si],
                        transport_name[o->transports[i]]);
                return -1;
            }
        }
    }
    for (int si = 0; si < o->nsizes; si++) {
        for (int ci = 0; ci < o->ncounts; ci++) {
            int n = r->eff[si][ci];
            for (int i = 0; n > 0 && i < o->ntransports; i++) {
                if (server_watch_polling(lc, o->transports[i] == T_V4P) < 0)
                    return -1;
                if (run_parallel(o, &cl[i], si, n, par_at(r, si, ci, o->transports[i], round)) <
                    0) {
                    fprintf(stderr, "shmipc-bench: %d streams, %zu B, %s: failed\n", n,
                            o->sizes[si], transport_name[o->transports[i]]);
                    return -1;
                }
            }
        }
    }
    return server_watch_polling(lc, 0);
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
static int measure_idle(const struct opts *o, struct local *lc)
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

static int ipc_main(const struct opts *o)
{
    struct env e;
    struct local lc = {.ctl_fd = -1};
    struct results r = {.o = o};
    shmipc_config *cfg[T_COUNT] = {NULL};
    struct client cl[T_COUNT];
    int status = 1, opened = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = client_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    env_probe(&e, o->pin);
    if (o->connect_addr && e.pinned)
        snprintf(e.pinning, sizeof e.pinning,
                 "client on CPU %d (sched_setaffinity); the external server is not pinned by "
                 "shmipc-bench",
                 e.client_cpu);
    else if (e.pinned)
        snprintf(e.pinning, sizeof e.pinning,
                 "echo server (forked child) on CPU %d, client on CPU %d (sched_setaffinity)",
                 e.server_cpu, e.client_cpu);
    else
        snprintf(e.pinning, sizeof e.pinning, "not pinned (%s)",
                 o->pin ? "fewer than 2 CPUs allowed" : "--no-pin");
    for (int si = 0; si < o->nsizes; si++) {
        if (HDR + o->sizes[si] > o->buffer / 4) {
            fprintf(stderr,
                    "shmipc-bench: %zu B messages need a buffer of 4x their size "
                    "(--buffer)\n",
                    o->sizes[si]);
            return 1;
        }
        for (int ci = 0; ci < o->ncounts; ci++) {
            int n = effective_streams(o, o->sizes[si], o->counts[ci]);
            r.eff[si][ci] = n;
            for (int cj = 0; cj < ci; cj++)
                if (r.eff[si][cj] == n)
                    r.eff[si][ci] = 0; /* the same cell as an earlier count: run it once */
        }
    }
    for (int i = 0; i < o->ntransports; i++)
        r.has[o->transports[i]] = 1;
    r.lat = calloc((size_t)o->nsizes * T_COUNT * MAX_ROUNDS, sizeof *r.lat);
    r.par = calloc((size_t)o->nsizes * MAX_COUNTS * T_COUNT * MAX_ROUNDS, sizeof *r.par);
    if (r.lat == NULL || r.par == NULL) {
        fprintf(stderr, "shmipc-bench: out of memory\n");
        goto out;
    }
    size_t warm_max = 0;
    for (int i = 0; i < o->ntransports; i++) {
        int t = o->transports[i];
        if (!is_shmipc(t))
            continue;
        if (make_config(o, t, &cfg[t]) < 0)
            goto out;
        if (warm_max_size(cfg[t]) > warm_max)
            warm_max = warm_max_size(cfg[t]);
    }
    if (pattern_init(o, warm_max) < 0)
        goto out;

    if (e.pinned && pin_to(e.client_cpu) < 0)
        goto out;
    if (!o->connect_addr && server_start(o, &e, &lc) < 0)
        goto out;
    printf("shmipc-bench ipc\n");
    write_env(stdout, o, &e, 0);
    fflush(stdout);
    const char *addr = o->connect_addr ? o->connect_addr : lc.shm_addr;
    uint64_t t_start = now_ns();
    /* One session per shmipc transport for the whole run, warmed up before the rounds. */
    for (; opened < o->ntransports; opened++) {
        struct client *c = &cl[opened];
        /* The server must see a polling session's handshake and its warm-up. */
        if (server_watch_polling(&lc, o->transports[opened] == T_V4P) < 0)
            goto out;
        if (client_open(c, o->transports[opened], addr, cfg, &lc, o) < 0) {
            client_close(c);
            goto out;
        }
        if (is_shmipc(c->t)) {
            struct warm *w = &warm_info[c->t];
            w->opened = 1;
            w->version = c->version;
            w->wakeup = c->wakeup;
            w->interval_us = c->interval_us;
            w->connect_secs = c->connect_secs;
            printf("%s session: negotiated V%d with %s wakeups", transport_name[c->t], c->version,
                   wakeup_name(c->wakeup));
            if (c->wakeup == SHMIPC_WAKEUP_POLLING)
                printf(" every %" PRIu32 " µs", c->interval_us);
            printf("; connect %.3f s\n", c->connect_secs);
            fflush(stdout);
        }
        if (is_shmipc(c->t) && o->warm) {
            if (session_warm(o, c, cfg[c->t]) < 0) {
                opened++;
                goto out;
            }
            printf("%s session: warm-up (untimed) %" PRIu64 " round trips in %.2f s\n",
                   transport_name[c->t], warm_info[c->t].round_trips, warm_info[c->t].secs);
            fflush(stdout);
        }
    }
    if (server_watch_polling(&lc, 0) < 0)
        goto out;
    if (warm_info[T_V4P].opened && !o->connect_addr && measure_idle(o, &lc) < 0)
        goto out;
    for (int k = 0; k < o->rounds; k++) {
        uint64_t t0 = now_ns();
        if (run_round(o, &r, k, cl, &lc) < 0)
            goto out;
        r.rounds_done++;
        fprintf(stderr, "shmipc-bench: round %d of %d done in %.1f s\n", k + 1, o->rounds,
                (double)(now_ns() - t0) / 1e9);
    }
    for (int t = 0; t < T_COUNT; t++)
        idle_share[t][0] = idle_share[t][1] = -1;
    idle_window_ms = o->idle_ms;
    for (int i = 0; i < opened && o->idle_ms > 0 && !o->connect_addr; i++) {
        if (measure_idle_after(o, &cl[i]) < 0)
            goto out;
        fprintf(stderr, "shmipc-bench: %s idle for %d ms measured\n", transport_name[cl[i].t],
                o->idle_ms);
    }
    measure_memcpy();
    read_loadavg(e.load_end, sizeof e.load_end);
    write_tables(stdout, &r);
    write_idle(stdout, o, 0);
    write_memcpy_floor(stdout, &r);
    write_bar(stdout, &r, 0);
    write_bar4(stdout, &r, 0);
    printf("\nrun time: %.1f s; load average %s at the start, %s at the end\n",
           (double)(now_ns() - t_start) / 1e9, e.load_start, e.load_end);
    if (write_json(o->json_path, &r, &e) < 0 || write_md(o->md_path, &r, o, &e) < 0)
        goto out;
    printf("wrote %s and %s\n", o->json_path, o->md_path);
    status = 0;
out:
    fflush(stdout);
    while (opened-- > 0)
        client_close(&cl[opened]);
    if (!o->connect_addr && server_stop_and_reap(&lc) < 0)
        status = 1;
    if (devshm_check() > 0)
        status = 1;
    for (int t = 0; t < T_COUNT; t++)
        shmipc_config_free(cfg[t]);
    free(r.lat);
    free(r.par);
    free(pattern);
    if (interrupted) {
        fprintf(stderr, "shmipc-bench: interrupted\n");
        status = 130;
    }
    return status;
}

int main(int argc, char **argv)
{
    struct opts o;
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "ipc") != 0) {
        fprintf(stderr, "shmipc-bench: unknown benchmark '%s' (there is: ipc)\n", argv[1]);
        return 2;
    }
    if (parse_opts(argc, argv, &o) < 0)
        return 2;
    if (o.serve_addr)
        return serve_main(&o);
    return ipc_main(&o);
}
