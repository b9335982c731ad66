/*
 * shmipc-bench-ws, idle connections: what N of them cost the server process (VmRSS, RssAnon,
 * heap).
 */
#include "ws_bench.h"

static void mem_read(pid_t pid, struct memstat *m)
{
    char path[128], line[512];
    FILE *f;
    int in_heap = 0;
    memset(m, 0, sizeof *m);
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        sscanf(line, "VmRSS: %ld", &m->vmrss_kib);
        sscanf(line, "RssAnon: %ld", &m->rssanon_kib);
    }
    if (f != NULL)
        fclose(f);
    /* The main arena's [heap]; a worker thread's malloc arena is an anonymous mapping, which
     * RssAnon counts. A mapping's first line starts with its (lower-case hex) address, its
     * fields with a capital letter. */
    snprintf(path, sizeof path, "/proc/%d/smaps", (int)pid);
    f = fopen(path, "r");
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        long kib;
        if ((line[0] >= '0' && line[0] <= '9') || (line[0] >= 'a' && line[0] <= 'f'))
            in_heap = strstr(line, "[heap]") != NULL;
        else if (in_heap && sscanf(line, "Rss: %ld", &kib) == 1)
            m->heap_kib += kib;
    }
    if (f != NULL)
        fclose(f);
}

/* One echo of 64 bytes on every connection (which wakes whatever state a first message
 * allocates), one batch at a time. */
static void idle_touch(const struct target *t, struct conn *c, int n)
{
    uint64_t lat[OPEN_BATCH];
    struct pass pass;
    for (int b = 0; b < n; b += OPEN_BATCH)
        run_pass(t, c + b, b + OPEN_BATCH < n ? OPEN_BATCH : n - b, 64, 1, 0, lat, &pass);
}

void idle_measure(struct target *t, int n, struct idle_result *r)
{
    struct conn *c;
    uint64_t t0;
    memset(r, 0, sizeof *r);
    r->conns = n;
    start_target(t);
    sleep_ms(300);
    mem_read(t->pid, &r->before);
    t0 = now_ns();
    c = conns_open(t, n);
    r->open_ms = (double)(now_ns() - t0) / 1e6;
    sleep_ms(500);
    mem_read(t->pid, &r->open);
    idle_touch(t, c, n);
    sleep_ms(500);
    mem_read(t->pid, &r->used);
    conns_close(t, c, n);
    stop_target(t);
}

double per_conn(long after_kib, long before_kib, int n)
{
    return (double)(after_kib - before_kib) * 1024.0 / (double)n;
}
