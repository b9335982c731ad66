/*
 * shmipc-bench-ws, the JSON report (--json), the input of bench/plot.py.
 */
#include "ws_bench.h"

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        if ((unsigned char)*s >= 0x20)
            fputc(*s, f);
    }
    fputc('"', f);
}

void write_json(const char *env, const char *command, time_t started, double load0, double load1)
{
    int tcp = find_target(K_TCP), node = find_target(K_NODE), first = 1;
    FILE *f = fopen(opt.json, "w");
    struct utsname un;
    if (f == NULL)
        die("%s: %s", opt.json, strerror(errno));
    uname(&un);
    fprintf(f, "{\n  \"bench\": \"ws\",\n  \"env\": {\"summary\": ");
    json_str(f, env);
    fprintf(f, ", \"kernel\": ");
    json_str(f, un.release);
    fprintf(f,
            ", \"cpus\": %ld, \"server_cpu\": %d, \"client_cpu\": %d, \"loadavg\": [%.2f, %.2f], "
            "\"started\": %lld, \"libshmipc\": ",
            sysconf(_SC_NPROCESSORS_ONLN), opt.server_cpu, opt.client_cpu, load0, load1,
            (long long)started);
    json_str(f, shmipc_version_string());
    fprintf(f, ", \"buildtype\": ");
    json_str(f, SHMIPC_BENCH_BUILDTYPE);
    fprintf(f, ", \"node\": ");
    json_str(f, node_version);
    fprintf(f, ", \"npm_ws\": ");
    json_str(f, ws_version);
    fprintf(f, "},\n  \"command\": ");
    json_str(f, command);
    fprintf(f,
            ",\n  \"config\": {\"rounds\": %d, \"samples_min\": %d, \"cell_rts\": %" PRIu64
            ", \"cell_bytes\": %" PRIu64 ", \"warmup\": %d, \"workers\": %d},\n",
            opt.rounds, opt.samples, opt.cell_rts, opt.cell_bytes, opt.warmup, opt.workers);
    fprintf(f, "  \"targets\": [");
    for (int t = 0; t < ntargets; t++) {
        fprintf(f, "%s", t ? ", " : "");
        json_str(f, targets[t].name);
    }
    fprintf(f, "],\n  \"latency\": [\n");
    for (int p = 0; p < nplan; p++)
        for (int t = 0; t < ntargets; t++) {
            const struct cell *m = &med[t][p];
            fprintf(f,
                    "%s    {\"server\": \"%s\", \"size\": %zu, \"conns\": %d, \"samples\": %ld, "
                    "\"p50_us\": %.2f, \"p90_us\": %.2f, \"p99_us\": %.2f, \"p999_us\": %.2f, "
                    "\"max_us\": %.2f, \"rt_per_s\": %.0f, \"mib_per_s\": %.1f, "
                    "\"server_cpu_us_per_rt\": %.3f, \"p50_vs_tcp\": %.3f, \"p50_vs_node\": %.3f, "
                    "\"p50_rounds_us\": [",
                    first ? "" : ",\n", targets[t].name, plan[p].size, plan[p].conns, m->samples,
                    m->p[0], m->p[1], m->p[2], m->p[3], m->p[4], m->rt_per_s, m->mib_per_s,
                    m->server_cpu_us, tcp >= 0 ? m->p[0] / med[tcp][p].p[0] : 0,
                    node >= 0 ? m->p[0] / med[node][p].p[0] : 0);
            for (int r = 0; r < opt.rounds; r++)
                fprintf(f, "%s%.2f", r ? ", " : "", m->p50_round[r]);
            fprintf(f, "]}");
            first = 0;
        }
    fprintf(f, "\n  ],\n  \"idle\": [\n");
    first = 1;
    for (int t = 0; t < ntargets; t++) {
        const struct idle_result *r = &idle[t];
        if (!idle_done[t])
            continue;
        fprintf(f,
                "%s    {\"server\": \"%s\", \"conns\": %d, \"open_ms\": %.0f, "
                "\"vmrss_kib\": [%ld, %ld, %ld], \"rssanon_kib\": [%ld, %ld, %ld], "
                "\"heap_kib\": [%ld, %ld, %ld], \"rss_bytes_per_conn\": %.0f, "
                "\"rss_bytes_per_conn_after_message\": %.0f, \"anon_bytes_per_conn\": %.0f, "
                "\"anon_bytes_per_conn_after_message\": %.0f}",
                first ? "" : ",\n", targets[t].name, r->conns, r->open_ms, r->before.vmrss_kib,
                r->open.vmrss_kib, r->used.vmrss_kib, r->before.rssanon_kib, r->open.rssanon_kib,
                r->used.rssanon_kib, r->before.heap_kib, r->open.heap_kib, r->used.heap_kib,
                per_conn(r->open.vmrss_kib, r->before.vmrss_kib, r->conns),
                per_conn(r->used.vmrss_kib, r->before.vmrss_kib, r->conns),
                per_conn(r->open.rssanon_kib, r->before.rssanon_kib, r->conns),
                per_conn(r->used.rssanon_kib, r->before.rssanon_kib, r->conns));
        first = 0;
    }
    fprintf(f, "\n  ],\n  \"bar\": [\n");
    first = 1;
    for (int t = 0; t < ntargets; t++) {
        struct bar b;
        if (targets[t].kind != K_OURS || nplan == 0)
            continue;
        bar_eval(t, &b);
        fprintf(f,
                "%s    {\"server\": \"%s\", \"p50_64b_within_1_15x_tcp\": %s, "
                "\"worst_64b_vs_tcp\": %.3f, \"p50_below_node\": %s, \"worst_vs_node\": %.3f, "
                "\"p50_1mib_within_1_3x_tcp\": %s, \"worst_1mib_vs_tcp\": %.3f, "
                "\"p50_16k_1024_within_2x_of_64\": %s, \"p50_16k_1024_over_64\": %.3f}",
                first ? "" : ",\n", targets[t].name,
                b.tcp64 < 0 ? "null"
                : b.tcp64   ? "true"
                            : "false",
                b.worst_tcp64,
                b.node < 0 ? "null"
                : b.node   ? "true"
                           : "false",
                b.worst_node,
                b.tcp1m < 0 ? "null"
                : b.tcp1m   ? "true"
                            : "false",
                b.worst_tcp1m,
                b.scale < 0 ? "null"
                : b.scale   ? "true"
                            : "false",
                b.scale_ratio);
        first = 0;
    }
    fprintf(f, "\n  ]\n}\n");
    if (fclose(f) != 0)
        die("%s: %s", opt.json, strerror(errno));
}
