/*
 * shmipc-bench ipc, JSON report (--json), the input of bench/plot.py.
 */
#include "ipc_bench.h"

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
int write_json(const char *path, struct results *r, const struct env *e)
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
    fprintf(f, "%s},\n  \"memcpy_gibps\": %.3f,\n  \"wake_floor_us\": %.3f,\n", none ? "" : "\n  ",
            memcpy_gibps, wake_floor_us);
    /* The spin floor (measure_spin_floor): null when it could not be measured. */
    fprintf(f, "  \"spin_floor\": ");
    if (spin_floor_us[P50] > 0) {
        fprintf(f, "{\"size\": %u, \"samples\": %d", SPIN_FLOOR_SIZE, spin_floor_samples);
        for (int p = 0; p < NPCT; p++)
            fprintf(f, ", \"%s_us\": %.3f", pct_key[p], spin_floor_us[p]);
        fprintf(f, "}\n}\n");
    } else {
        fprintf(f, "null\n}\n");
    }
    if (fclose(f) != 0)
        return sys_fail(path);
    return 0;
}
