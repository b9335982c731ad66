/*
 * shmipc-bench ipc, the transports' names and what each must negotiate, the small helpers (errors,
 * big-endian lengths, byte sums, the payload pattern) and the environment probe and CPU
 * pinning.
 */
#include "ipc_bench.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

const char *const transport_name[T_COUNT] = {
    "shmipc-v3", "shmipc-v2", "shmipc-v4", "shmipc-v4-eventfd", "shmipc-v4-polling", "uds", "tcp"};
/* What --transports takes (the full names above are accepted too). */
const char *const transport_arg[T_COUNT] = {"v3",         "v2",  "v4", "v4-eventfd",
                                            "v4-polling", "uds", "tcp"};

int is_shmipc(int t)
{
    return t <= T_V4P;
}

/* The protocol version and wakeup (enum shmipc_wakeup) a transport must negotiate. */
int want_version(int t)
{
    return t == T_V2 ? 2 : t == T_V3 ? 3 : 4;
}

int want_wakeup(int t)
{
    return t == T_V4E   ? SHMIPC_WAKEUP_EVENTFD
           : t == T_V4P ? SHMIPC_WAKEUP_POLLING
                        : SHMIPC_WAKEUP_SOCKET;
}

const char *wakeup_name(int w)
{
    return w == SHMIPC_WAKEUP_EVENTFD   ? "eventfd"
           : w == SHMIPC_WAKEUP_POLLING ? "polling"
           : w == SHMIPC_WAKEUP_SOCKET  ? "socket"
                                        : "unknown";
}
/* ------------------------------------------------------------------------------------ */
/* Small helpers                                                                        */
/* ------------------------------------------------------------------------------------ */

volatile sig_atomic_t interrupted;
pid_t server_pid = -1;
static const char *errname(int rc)
{
    const char *n = shmipc_errname(rc);
    return n != NULL ? n : "unknown code";
}

/* Reports a failed shmipc call with its error name and detail; returns -1. */
int shm_fail(const char *what, int rc)
{
    fprintf(stderr, "shmipc-bench: %s: %s (%s, %d)\n", what, shmipc_error_detail(), errname(rc),
            rc);
    return -1;
}

/* Reports a failed system call with errno; returns -1. */
int sys_fail(const char *what)
{
    int err = errno;
    fprintf(stderr, "shmipc-bench: %s: %s\n", what,
            err == EAGAIN ? "timed out waiting for the peer" : strerror(err));
    return -1;
}

void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

uint32_t get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

size_t min_size(size_t a, size_t b)
{
    return a < b ? a : b;
}

/*
 * The sum of the bytes. It ignores positions, so it is the same however the echo was cut
 * into chunks. It is the reader's pass over the payload, so it runs at the speed of a read:
 * with SSE2 (every x86-64), PSADBW sums 16 bytes into a 64-bit lane per instruction (a 1 MiB
 * pass took 92 us as the word loop below and 21 us this way, with memcpy at 15 us per MiB,
 * so the 1 MiB round trip was mostly this checksum). Elsewhere, and for the tail, eight bytes
 * at a time: the words are split into four 16-bit lanes that can take 128 words of two bytes
 * each before they could carry.
 */
uint64_t byte_sum(const uint8_t *p, size_t n)
{
    const uint64_t lo = 0x00ff00ff00ff00ffull;
    uint64_t total = 0;
#if defined(__SSE2__)
    __m128i zero = _mm_setzero_si128(), acc0 = zero, acc1 = zero;
    while (n >= 32) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)p);
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(p + 16));
        acc0 = _mm_add_epi64(acc0, _mm_sad_epu8(a, zero));
        acc1 = _mm_add_epi64(acc1, _mm_sad_epu8(b, zero));
        p += 32;
        n -= 32;
    }
    uint64_t lanes[2];
    _mm_storeu_si128((__m128i *)(void *)lanes, _mm_add_epi64(acc0, acc1));
    total = lanes[0] + lanes[1];
#endif
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
uint8_t *pattern;
uint64_t expected_sum[MAX_SIZES][PATTERN_SLACK];

/* `max` is the largest message beside --sizes: the session warm-up's. */
int pattern_init(const struct opts *o, size_t max)
{
    for (int i = 0; i < o->nsizes; i++)
        if (o->sizes[i] > max)
            max = o->sizes[i];
    if (max < SPIN_FLOOR_SIZE) /* the spin floor's messages come from it too */
        max = SPIN_FLOOR_SIZE;
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

void fmt_size(char *buf, size_t cap, uint64_t v)
{
    if (v >= (1u << 20) && v % (1u << 20) == 0)
        snprintf(buf, cap, "%" PRIu64 " MiB", v >> 20);
    else if (v >= 1024 && v % 1024 == 0)
        snprintf(buf, cap, "%" PRIu64 " KiB", v >> 10);
    else
        snprintf(buf, cap, "%" PRIu64 " B", v);
}

void read_loadavg(char *buf, size_t cap)
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

void env_probe(struct env *e, int want_pin)
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

int pin_to(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        return sys_fail("sched_setaffinity");
    return 0;
}
