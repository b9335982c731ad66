/*
 * shmipc-bench ipc, the two shapes: one stream with every round trip timed, and N streams in
 * flight; and the untimed warm-up of a new shmipc session.
 */
#include "ipc_bench.h"

int samples_for(const struct opts *o, size_t size)
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

/* Untimed round trips between the server's first CPU reading and the timed loop. */
#define RESETTLE 128

/* Shape (a): one stream, closed loop, every round trip timed. */
int run_latency(const struct opts *o, const struct client *c, int si, struct lat_cell *out)
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
    /*
     * CPU time around the timed loop: the server's read first and last, so that the system
     * call that reads it is not counted as the client's, each once the server sleeps (see
     * server_cpu_settled_ns). Its wake-up after the first read is paid by RESETTLE untimed
     * round trips, in which the spins of both sides adapt again; their CPU and time are
     * counted, and the sums are divided by all the round trips they cover.
     */
    uint64_t s0 = server_cpu_settled_ns(), c0 = client_cpu_ns(), w0 = now_ns();
    for (int i = 0; i < RESETTLE; i++)
        if (interrupted || round_trip(c, ch, size, seq++, expected_sum[si], 1) < 0)
            goto out;
    for (int i = 0; i < samples; i++) {
        uint64_t t0 = now_ns();
        if (interrupted || round_trip(c, ch, size, seq++, expected_sum[si], 0) < 0)
            goto out;
        t[i] = now_ns() - t0;
    }
    uint64_t w1 = now_ns(), c1 = client_cpu_ns(), s1 = server_cpu_settled_ns();
    double trips = (double)samples + RESETTLE;
    out->us[CPU_CLIENT] = (double)(c1 - c0) / 1000.0 / trips;
    out->us[CPU_SERVER] =
        s0 == UINT64_MAX || s1 == UINT64_MAX || s1 < s0 ? -1.0 : (double)(s1 - s0) / 1000.0 / trips;
    out->us[CPU_TOTAL] = out->us[CPU_SERVER] < 0 ? -1.0 : out->us[CPU_CLIENT] + out->us[CPU_SERVER];
    out->us[WALL_MEAN] = (double)(w1 - w0) / 1000.0 / trips;
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
int effective_streams(const struct opts *o, size_t size, int count)
{
    uint64_t cap = o->max_inflight / size;
    if (cap < 1)
        cap = 1;
    return (uint64_t)count > cap ? (int)cap : count;
}

/* Shape (b): n streams in flight for --duration ms after --warmup ms. */
int run_parallel(const struct opts *o, const struct client *c, int si, int n, struct par_cell *out)
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

struct warm warm_info[T_COUNT];

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
int session_warm(const struct opts *o, const struct client *c, const shmipc_config *cfg)
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
size_t warm_max_size(const shmipc_config *cfg)
{
    uint32_t w;
    return largest_slice(cfg, &w) == 0 && w > HDR ? w - HDR : 0;
}
