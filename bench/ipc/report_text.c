/*
 * shmipc-bench ipc, text reports: the environment, the markdown tables printed and written by
 * --md, the idle and memcpy-floor tables, and the bars of issues 3 and 4.
 */
#include "ipc_bench.h"

static void fmt_us(char *buf, size_t cap, double us)
{
    if (us < 100)
        snprintf(buf, cap, "%.2f", us);
    else if (us < 1000)
        snprintf(buf, cap, "%.1f", us);
    else
        snprintf(buf, cap, "%.0f", us);
}

void write_env(FILE *f, const struct opts *o, const struct env *e, int markdown)
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
            "(CLOCK_PROCESS_CPUTIME_ID), server = %s, read once the server sleeps (a running "
            "process's clock read from another lags), each read around the timed loop and 128 "
            "untimed round trips before it, and divided by all of them\n",
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

void write_tables(FILE *f, struct results *r)
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
int write_bar(FILE *f, struct results *r, int markdown)
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
int size64(const struct opts *o)
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
int write_bar4(FILE *f, struct results *r, int markdown)
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

void write_idle(FILE *f, const struct opts *o, int markdown)
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

void write_memcpy_floor(FILE *f, struct results *r)
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

void write_wake_floor(FILE *f, struct results *r)
{
    const struct opts *o = r->o;
    char size[32];
    if (wake_floor_us <= 0 || o->nsizes == 0)
        return;
    fmt_size(size, sizeof size, o->sizes[0]);
    fprintf(f,
            "\n### Small round trips against the wakeup floor\n\nTwo processes pinned as above "
            "pass a token through two eventfds with blocking reads: two cross-process wakeups "
            "and no payload take %.2f µs a round trip (median of 2000). A transport whose "
            "waiters sleep cannot go below it; spinning skips the wakeups.\n\n",
            wake_floor_us);
    fprintf(f, "| transport | %s p50 | p50 / wakeup floor |\n|---|---:|---:|\n", size);
    for (int i = 0; i < o->ntransports; i++) {
        int t = o->transports[i];
        double p50 = lat_median(r, 0, t, P50);
        if (p50 > 0)
            fprintf(f, "| %s | %.2f µs | %.2fx |\n", transport_name[t], p50, p50 / wake_floor_us);
    }
}

/*
 * The smallest size's one-stream round trips against the spin floor (measure_spin_floor):
 * what is left above it is ours (the protocol, the locks, the bookkeeping, the benchmark's
 * checks), not the machine's.
 */
void write_spin_floor(FILE *f, struct results *r)
{
    const struct opts *o = r->o;
    char size[32];
    if (spin_floor_us[P50] <= 0 || o->nsizes == 0)
        return;
    fmt_size(size, sizeof size, o->sizes[0]);
    fprintf(f,
            "\n### Small round trips against the spin floor\n\nTwo processes pinned as above "
            "ping-pong a %u B message through one shared mapping, each spinning (pause in the "
            "loop) on the other's sequence word (release store, acquire loads): no library, "
            "no system call. Round trip over %d samples: p50 %.2f µs, p99 %.2f µs, p99.9 "
            "%.2f µs. No transport can beat it; on a VM its tail is mostly the hypervisor.\n\n",
            SPIN_FLOOR_SIZE, spin_floor_samples, spin_floor_us[P50], spin_floor_us[P99],
            spin_floor_us[P999]);
    fprintf(f,
            "| transport | %s p50 | p99 | p99.9 | p50 / spin floor | p99 / spin floor |\n"
            "|---|---:|---:|---:|---:|---:|\n",
            size);
    for (int i = 0; i < o->ntransports; i++) {
        int t = o->transports[i];
        double p50 = lat_median(r, 0, t, P50), p99 = lat_median(r, 0, t, P99);
        if (p50 > 0)
            fprintf(f, "| %s | %.2f µs | %.2f µs | %.2f µs | %.2fx | %.2fx |\n", transport_name[t],
                    p50, p99, lat_median(r, 0, t, P999), p50 / spin_floor_us[P50],
                    p99 / spin_floor_us[P99]);
    }
}

int write_md(const char *path, struct results *r, const struct opts *o, const struct env *e)
{
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return sys_fail(path);
    fprintf(f, "## shmipc-bench ipc\n\n");
    write_env(f, o, e, 1);
    write_tables(f, r);
    write_idle(f, o, 1);
    write_memcpy_floor(f, r);
    write_wake_floor(f, r);
    write_spin_floor(f, r);
    write_bar(f, r, 1);
    write_bar4(f, r, 1);
    if (fclose(f) != 0)
        return sys_fail(path);
    return 0;
}
