/*
 * shmipc-bench-ws, small helpers: the server children and their cleanup on a signal, clocks,
 * CPU pinning, parsing and printing sizes, the load average, free ports.
 */
#include "ws_bench.h"

/* ---------------------------------------------------------------------------------------- */
/* Small helpers */

pid_t children[MAX_TARGETS * 2];
int nchildren;

static void stop_children(void)
{
    for (int i = 0; i < nchildren; i++)
        if (children[i] > 0) {
            kill(children[i], SIGTERM);
            waitpid(children[i], NULL, 0);
            children[i] = 0;
        }
    nchildren = 0;
}

/* SIGINT or SIGTERM to the client: no server outlives the run. */
void on_stop_signal(int sig)
{
    for (int i = 0; i < nchildren; i++)
        if (children[i] > 0)
            kill(children[i], SIGTERM);
    signal(sig, SIG_DFL);
    raise(sig);
}

void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "shmipc-bench-ws: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    stop_children();
    exit(1);
}

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

int have(const char *prog)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", prog);
    return system(cmd) == 0;
}

void pin(int cpu)
{
    cpu_set_t set;
    if (cpu < 0)
        return;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) < 0)
        fprintf(stderr, "shmipc-bench-ws: sched_setaffinity(%d): %s\n", cpu, strerror(errno));
}

/* Parses "64", "16K", "16KiB", "1M", "1MiB" (K and M are binary). */
int parse_bytes(const char *s, uint64_t *out)
{
    char *end;
    uint64_t mult = 1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s)
        return -1;
    if (*end == 'k' || *end == 'K')
        mult = 1024, end++;
    else if (*end == 'm' || *end == 'M')
        mult = 1024 * 1024, end++;
    if (mult > 1 && strcmp(end, "iB") == 0)
        end += 2;
    else if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0' || v > UINT64_MAX / mult)
        return -1;
    *out = v * mult;
    return 0;
}

/* A comma-separated list of sizes or counts; -1 on a bad or empty list. */
int parse_list(const char *s, uint64_t *out, uint64_t lo, uint64_t hi)
{
    char buf[256], *save = NULL;
    int n = 0;
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        if (n == MAX_LIST || parse_bytes(tok, &out[n]) < 0 || out[n] < lo || out[n] > hi)
            return -1;
        n++;
    }
    return n > 0 ? n : -1;
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

double loadavg(void)
{
    double v = 0;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f != NULL) {
        if (fscanf(f, "%lf", &v) != 1)
            v = 0;
        fclose(f);
    }
    return v;
}

int free_port(void)
{
    struct sockaddr_in sin = {.sin_family = AF_INET};
    socklen_t len = sizeof sin;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sin, sizeof sin) < 0 ||
        getsockname(fd, (struct sockaddr *)&sin, &len) < 0)
        die("free port: %s", strerror(errno));
    close(fd);
    return ntohs(sin.sin_port);
}

int set_nonblock(int fd, int on)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return -1;
    return fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}
