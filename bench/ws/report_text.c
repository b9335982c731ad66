/*
 * shmipc-bench-ws, the text report: the bar of issue 6, the environment line and the markdown
 * tables (printed and written by --md).
 */
#include "ws_bench.h"

void bar_eval(int t, struct bar *b)
{
    int tcp = find_target(K_TCP), node = find_target(K_NODE);
    int seen64 = 0, seen1m = 0;
    int p64 = find_cell(16384, 64), p1024 = find_cell(16384, 1024);
    memset(b, 0, sizeof *b);
    b->tcp64 = b->tcp1m = b->node = 1;
    for (int p = 0; p < nplan; p++) {
        double ours = med[t][p].p[0];
        if (tcp >= 0 && plan[p].size == 64) {
            double r = ours / med[tcp][p].p[0];
            seen64 = 1;
            if (r > b->worst_tcp64)
                b->worst_tcp64 = r;
            if (r > 1.15)
                b->tcp64 = 0;
        }
        if (tcp >= 0 && plan[p].size == (1u << 20)) {
            double r = ours / med[tcp][p].p[0];
            seen1m = 1;
            if (r > b->worst_tcp1m)
                b->worst_tcp1m = r;
            if (r > 1.3)
                b->tcp1m = 0;
        }
        if (node >= 0) {
            double r = ours / med[node][p].p[0];
            if (r > b->worst_node)
                b->worst_node = r;
            if (r >= 1.0)
                b->node = 0;
        }
    }
    if (!seen64)
        b->tcp64 = -1;
    if (!seen1m)
        b->tcp1m = -1;
    if (node < 0)
        b->node = -1;
    if (p64 >= 0 && p1024 >= 0) {
        b->scale_ratio = med[t][p1024].p[0] / med[t][p64].p[0];
        b->scale = b->scale_ratio <= 2.0;
    } else {
        b->scale = -1;
    }
}

static const char *verdict(int v)
{
    return v < 0 ? "not measured" : v ? "met" : "**not met**";
}

static void fmt_ratio(char *buf, size_t cap, double v)
{
    if (v > 0)
        snprintf(buf, cap, "%.2fx", v);
    else
        snprintf(buf, cap, "-");
}

void env_line(char *buf, size_t cap, double load0, double load1)
{
    struct utsname un;
    char cpu_model[200] = "unknown", line[512];
    FILE *f = fopen("/proc/cpuinfo", "r");
    uname(&un);
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, "model name", 10) == 0) {
            char *p = strchr(line, ':');
            snprintf(cpu_model, sizeof cpu_model, "%.190s", p ? p + 2 : line);
            cpu_model[strcspn(cpu_model, "\n")] = '\0';
            break;
        }
    if (f != NULL)
        fclose(f);
    snprintf(buf, cap,
             "Kernel %s, %s, %ld CPUs; servers pinned to CPU %d, the client to CPU %d; "
             "libshmipc %s (%s); load average %.2f at the start, %.2f at the end",
             un.release, cpu_model, sysconf(_SC_NPROCESSORS_ONLN), opt.server_cpu, opt.client_cpu,
             shmipc_version_string(), SHMIPC_BENCH_BUILDTYPE, load0, load1);
}

void write_md(FILE *f, const char *env)
{
    int tcp = find_target(K_TCP), node = find_target(K_NODE);
    fprintf(f, "%s.\n", env);
    if (node >= 0)
        fprintf(f, "Node.js %s, npm `ws` %s.\n", node_version, ws_version);
    if (nplan > 0) {
        fprintf(f,
                "\nClosed loop, one binary message in flight per connection, masked frames; "
                "round-trip latency in µs over the samples of %d rounds interleaved "
                "server by server inside each cell (p50 by round: the lowest and highest "
                "round's p50); MiB/s = 2 x payload x round trips / s; server CPU = µs of the "
                "server's CPU time per round trip.\n\n",
                opt.rounds);
        fprintf(f, "| payload | conns | server | samples | p50 | p90 | p99 | p99.9 | max | p50 by "
                   "round | MiB/s | server CPU | p50 / tcp | p50 / node |\n"
                   "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for (int p = 0; p < nplan; p++)
            for (int t = 0; t < ntargets; t++) {
                const struct cell *m = &med[t][p];
                char sz[32], rt[16] = "", rn[16] = "";
                double lo = m->p50_round[0], hi = m->p50_round[0];
                for (int r = 1; r < opt.rounds; r++) {
                    lo = m->p50_round[r] < lo ? m->p50_round[r] : lo;
                    hi = m->p50_round[r] > hi ? m->p50_round[r] : hi;
                }
                fmt_size(sz, sizeof sz, plan[p].size);
                if (tcp >= 0 && t != tcp)
                    fmt_ratio(rt, sizeof rt, m->p[0] / med[tcp][p].p[0]);
                if (node >= 0 && t != node)
                    fmt_ratio(rn, sizeof rn, m->p[0] / med[node][p].p[0]);
                fprintf(
                    f,
                    "| %s | %d | %s | %ld | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f-%.1f | %.1f "
                    "| %.2f | %s | %s |\n",
                    sz, plan[p].conns, targets[t].name, m->samples, m->p[0], m->p[1], m->p[2],
                    m->p[3], m->p[4], lo, hi, m->mib_per_s, m->server_cpu_us, rt, rn);
            }
        for (int t = 0; t < ntargets; t++) {
            struct bar b;
            if (targets[t].kind != K_OURS)
                continue;
            bar_eval(t, &b);
            fprintf(f,
                    "\nBar of issue 6 for `%s`: 64 B p50 within 1.15x of tcp at every "
                    "connection count: %s (worst %.2fx); p50 below node at every cell: %s "
                    "(worst %.2fx); 1 MiB p50 within 1.3x of tcp: %s (worst %.2fx); 16 KiB "
                    "x 1024 p50 at most 2x its 64-connection p50: %s (%.2fx).\n",
                    targets[t].name, verdict(b.tcp64), b.worst_tcp64, verdict(b.node), b.worst_node,
                    verdict(b.tcp1m), b.worst_tcp1m, verdict(b.scale), b.scale_ratio);
        }
        /* The peers' own 1024/64 ratio: what a closed loop does to any saturated server. */
        int p64 = find_cell(16384, 64), p1024 = find_cell(16384, 1024);
        if (p64 >= 0 && p1024 >= 0) {
            fprintf(f, "\nThe same 16 KiB p50 ratio, 1024 over 64 connections, for the peers:");
            for (int t = 0; t < ntargets; t++)
                if (targets[t].kind != K_OURS)
                    fprintf(f, " %s %.2fx;", targets[t].name,
                            med[t][p1024].p[0] / med[t][p64].p[0]);
            fprintf(f, " once a server is saturated, 1024 messages in flight take about 16x as "
                       "long to serve as 64.\n");
        }
    }
    int any = 0;
    for (int t = 0; t < ntargets; t++)
        any |= idle_done[t];
    if (!any)
        return;
    fprintf(f, "\nIdle connections: the server's VmRSS and RssAnon (`/proc/PID/status`) before, "
               "after opening the connections (upgrade only), and after one 64-byte echo on "
               "each; bytes per connection are the deltas divided by the connections. Kernel "
               "socket memory is not in these figures.\n\n"
               "| server | conns | VmRSS before KiB | after open | after a message | RssAnon "
               "before KiB | after open | after a message | bytes/conn (RSS, open) | "
               "bytes/conn (RSS, after a message) | bytes/conn (anon, after a message) |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int t = 0; t < ntargets; t++) {
        const struct idle_result *r = &idle[t];
        if (!idle_done[t])
            continue;
        fprintf(f, "| %s | %d | %ld | %ld | %ld | %ld | %ld | %ld | %.0f | %.0f | %.0f |\n",
                targets[t].name, r->conns, r->before.vmrss_kib, r->open.vmrss_kib,
                r->used.vmrss_kib, r->before.rssanon_kib, r->open.rssanon_kib, r->used.rssanon_kib,
                per_conn(r->open.vmrss_kib, r->before.vmrss_kib, r->conns),
                per_conn(r->used.vmrss_kib, r->before.vmrss_kib, r->conns),
                per_conn(r->used.rssanon_kib, r->before.rssanon_kib, r->conns));
    }
    for (int t = 0; t < ntargets; t++) {
        const struct idle_result *r = &idle[t];
        double worst;
        if (!idle_done[t] || targets[t].kind != K_OURS)
            continue;
        worst = per_conn(r->used.vmrss_kib, r->before.vmrss_kib, r->conns);
        if (per_conn(r->open.vmrss_kib, r->before.vmrss_kib, r->conns) > worst)
            worst = per_conn(r->open.vmrss_kib, r->before.vmrss_kib, r->conns);
        fprintf(f,
                "\nBar of issue 6 for `%s`: %d idle connections under 8 KiB (8192 bytes) "
                "each: %s (%.0f bytes per connection, RSS, the larger of the two states).\n",
                targets[t].name, r->conns, worst < 8192 ? "met" : "**not met**", worst);
    }
}
