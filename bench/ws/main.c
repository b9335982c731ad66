/*
 * shmipc-bench-ws: the WebSocket benchmark of issue 6 (docs/benchmarks.md, "WebSocket"), as
 * ../shared/reference/bench-method.md asks: medians of interleaved rounds, every figure beside
 * its peers measured in the same run, the environment printed beside the figures, JSON for
 * bench/plot.py.
 *
 * A closed-loop client in C: N connections, one message in flight on each, binary messages in
 * masked frames, every round trip timed (CLOCK_MONOTONIC, from the first byte written to the
 * last byte of the echo read) and every echoed byte compared with what was sent. Each
 * connection runs an untimed warm-up, then at least --samples timed round trips; a connection
 * that has its samples keeps the load up (untimed) until every connection has its own. A cell
 * is split into --rounds parts run server after server (interleaved), and its percentiles are
 * over the samples of all of them. Three
 * servers, each its own process pinned to one CPU (the client is pinned to another):
 *
 *   tcp   the floor: `shmipc-bench-ws tcp-echo PORT`, a minimal epoll echo of bytes. The
 *         client sends it the same masked frames, so the bytes on the wire are the same.
 *   ours  examples/c/ws_echo, one worker (--workers), each backend asked for (--backends).
 *   node  the npm `ws` package (installed with npm into --npm-dir at run time), an echo
 *         server on one Node.js thread. Left out, with a note, when node or npm is missing.
 *
 * `--idle N` instead holds N idle WebSocket connections on each server and reports what they
 * cost the server process (VmRSS and RssAnon deltas per connection).
 *
 *   shmipc-bench-ws [options]            (shmipc-bench-ws --help lists them)
 *   shmipc-bench-ws tcp-echo PORT        (the floor server; runs until SIGTERM)
 *
 * It sees only the public header, as a user's program would.
 *
 * This file holds the options, the run and the shared state of the run. Beside it, each
 * named after what it holds: tcp_echo.c, servers.c, client.c, cell.c, idle.c, report_text.c,
 * report_json.c, common.c, and ws_bench.h, the internal header they share.
 */
#include "ws_bench.h"

struct ws_opts opt;

char self_exe[4096], ws_echo_path[4096], tmpdir[256];
char node_version[64] = "", ws_version[64] = "";

static void usage(FILE *f)
{
    fprintf(f,
            "usage: shmipc-bench-ws [options]\n"
            "       shmipc-bench-ws tcp-echo PORT\n"
            "\n"
            "Closed-loop WebSocket echo latency (one message in flight per connection, masked\n"
            "binary frames, every echo checked) against a bare TCP echo, examples/c/ws_echo and\n"
            "the npm `ws` package; then the memory of idle connections on each.\n"
            "\n"
            "  --sizes LIST        payloads (default 64,16K,1M)\n"
            "  --conns LIST        connections for payloads below --large (default 1,64,256,1024)\n"
            "  --large-conns LIST  connections for payloads of --large and above (default 1,8,64)\n"
            "  --large SIZE        where --large-conns starts (default 1M)\n"
            "  --targets LIST      any of tcp,ours,ours-epoll,ours-io_uring,node, run in this\n"
            "                      order (default tcp,ours-io_uring,ours-epoll,node)\n"
            "  --rounds N          interleaved rounds; figures are their median (default 3)\n"
            "  --samples N         fewest timed round trips per connection (default 100)\n"
            "  --cell-rts N        timed round trips per cell, spread over its connections,\n"
            "                      when that is more than --samples each (default 20000)\n"
            "  --cell-bytes B      ... but at most B / payload of them (default 512M)\n"
            "  --warmup N          untimed round trips per connection first (default: a tenth\n"
            "                      of its samples, at least 10)\n"
            "  --workers N         workers of ws_echo (default 1)\n"
            "  --ws-echo PATH      the ws_echo example (default: next to this program's build)\n"
            "  --path P            the WebSocket path of ws_echo (default /)\n"
            "  --npm-dir DIR       where npm installs `ws` (default /tmp/shmipc-bench-ws-npm)\n"
            "  --server-cpu N      CPU of the servers (default 0; -1: not pinned)\n"
            "  --client-cpu N      CPU of the client (default 1; -1: not pinned)\n"
            "  --idle-conns N      idle connections measured after the latency run (default\n"
            "                      10000; 0: none)\n"
            "  --idle N            only the idle measurement, with N connections\n"
            "  --quick             a smoke run: 64 B and 16 KiB over 1 and 8 connections, 100\n"
            "                      round trips each, tcp and ours, 100 idle connections\n"
            "  --json FILE         JSON results (default bench-ws.json)\n"
            "  --md FILE           markdown tables (default bench-ws.md)\n");
}

static int add_target(const char *name)
{
    struct {
        const char *name;
        enum kind kind;
        const char *backend;
    } known[] = {{"tcp", K_TCP, ""},
                 {"ours", K_OURS, ""},
                 {"ours-epoll", K_OURS, "epoll"},
                 {"ours-io_uring", K_OURS, "io_uring"},
                 {"node", K_NODE, ""}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(name, known[i].name) == 0 && opt.ntargets < MAX_TARGETS) {
            snprintf(opt.targets[opt.ntargets++], 32, "%s", name);
            return 0;
        }
    return -1;
}

static int parse_int(const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

static void parse_opts(int argc, char **argv)
{
    opt.nsizes = parse_list("64,16K,1M", opt.sizes, 1, MAX_PAYLOAD);
    opt.nconns = parse_list("1,64,256,1024", opt.conns, 1, 100000);
    opt.nconns_large = parse_list("1,8,64", opt.conns_large, 1, 100000);
    opt.large = 1u << 20;
    opt.rounds = 3;
    opt.samples = 100;
    opt.cell_rts = 20000;
    opt.cell_bytes = 512u << 20;
    opt.warmup = -1;
    opt.workers = 1;
    opt.ws_path = "/";
    opt.npm_dir = "/tmp/shmipc-bench-ws-npm";
    opt.server_cpu = 0;
    opt.client_cpu = 1;
    opt.idle = 10000;
    opt.json = "bench-ws.json";
    opt.md = "bench-ws.md";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--quick") == 0) {
            opt.quick = 1;
            continue;
        } else if (v == NULL) {
            bad = 1;
        } else if (strcmp(a, "--sizes") == 0) {
            bad = (opt.nsizes = parse_list(v, opt.sizes, 1, MAX_PAYLOAD)) < 0;
        } else if (strcmp(a, "--conns") == 0) {
            bad = (opt.nconns = parse_list(v, opt.conns, 1, 100000)) < 0;
        } else if (strcmp(a, "--large-conns") == 0) {
            bad = (opt.nconns_large = parse_list(v, opt.conns_large, 1, 100000)) < 0;
        } else if (strcmp(a, "--large") == 0) {
            bad = parse_bytes(v, &opt.large) < 0;
        } else if (strcmp(a, "--targets") == 0) {
            char buf[256], *save = NULL;
            snprintf(buf, sizeof buf, "%s", v);
            opt.ntargets = 0;
            for (char *t = strtok_r(buf, ",", &save); t != NULL && !bad;
                 t = strtok_r(NULL, ",", &save))
                bad = add_target(t) < 0;
        } else if (strcmp(a, "--rounds") == 0) {
            bad = parse_int(v, 1, MAX_ROUNDS, &opt.rounds) < 0;
        } else if (strcmp(a, "--samples") == 0) {
            bad = parse_int(v, 1, 10000000, &opt.samples) < 0;
        } else if (strcmp(a, "--cell-rts") == 0) {
            bad = parse_bytes(v, &opt.cell_rts) < 0;
        } else if (strcmp(a, "--cell-bytes") == 0) {
            bad = parse_bytes(v, &opt.cell_bytes) < 0;
        } else if (strcmp(a, "--warmup") == 0) {
            bad = parse_int(v, 0, 10000000, &opt.warmup) < 0;
        } else if (strcmp(a, "--workers") == 0) {
            bad = parse_int(v, 1, 1024, &opt.workers) < 0;
        } else if (strcmp(a, "--ws-echo") == 0) {
            opt.ws_echo = v;
        } else if (strcmp(a, "--path") == 0) {
            opt.ws_path = v;
        } else if (strcmp(a, "--npm-dir") == 0) {
            opt.npm_dir = v;
        } else if (strcmp(a, "--server-cpu") == 0) {
            bad = parse_int(v, -1, 4095, &opt.server_cpu) < 0;
        } else if (strcmp(a, "--client-cpu") == 0) {
            bad = parse_int(v, -1, 4095, &opt.client_cpu) < 0;
        } else if (strcmp(a, "--idle-conns") == 0) {
            bad = parse_int(v, 0, 1000000, &opt.idle) < 0;
        } else if (strcmp(a, "--idle") == 0) {
            bad = parse_int(v, 1, 1000000, &opt.idle) < 0;
            opt.idle_only = 1;
        } else if (strcmp(a, "--json") == 0) {
            opt.json = v;
        } else if (strcmp(a, "--md") == 0) {
            opt.md = v;
        } else {
            bad = 1;
        }
        if (bad) {
            fprintf(stderr, "shmipc-bench-ws: bad option %s%s%s\n", a, v ? " " : "", v ? v : "");
            usage(stderr);
            exit(2);
        }
        i++;
    }
    if (opt.quick) {
        opt.nsizes = parse_list("64,16K", opt.sizes, 1, MAX_PAYLOAD);
        opt.nconns = parse_list("1,8", opt.conns, 1, 100000);
        opt.rounds = 1;
        opt.samples = 100;
        opt.cell_rts = 0;
        opt.warmup = 10;
        if (!opt.idle_only)
            opt.idle = 100;
        if (opt.ntargets == 0) {
            add_target("tcp");
            add_target("ours");
        }
    }
    if (opt.ntargets == 0) {
        add_target("tcp");
        add_target("ours-io_uring");
        add_target("ours-epoll");
        add_target("node");
    }
}

struct target targets[MAX_TARGETS];
int ntargets;

/* the cells in run order */
struct plan plan[MAX_LIST * MAX_LIST * 2];
int nplan;

struct cell med[MAX_TARGETS][MAX_LIST * MAX_LIST * 2];
struct idle_result idle[MAX_TARGETS];
int idle_done[MAX_TARGETS];

int find_target(enum kind k)
{
    for (int t = 0; t < ntargets; t++)
        if (targets[t].kind == k)
            return t;
    return -1;
}

int find_cell(size_t size, int conns)
{
    for (int p = 0; p < nplan; p++)
        if (plan[p].size == size && plan[p].conns == conns)
            return p;
    return -1;
}
int main(int argc, char **argv)
{
    char env[1024], command[2048] = "shmipc-bench-ws", line[512];
    time_t started = time(NULL);
    double load0 = loadavg(), load1;
    FILE *f;
    int have_node = 0;

    if (argc == 3 && strcmp(argv[1], "tcp-echo") == 0)
        return tcp_echo(atoi(argv[2]));
    parse_opts(argc, argv);
    for (int i = 1; i < argc; i++) {
        size_t n = strlen(command);
        snprintf(command + n, sizeof command - n, " %s", argv[i]);
    }
    if (readlink("/proc/self/exe", self_exe, sizeof self_exe - 1) < 0)
        die("readlink /proc/self/exe: %s", strerror(errno));
    if (opt.ws_echo != NULL) {
        snprintf(ws_echo_path, sizeof ws_echo_path, "%s", opt.ws_echo);
    } else {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", self_exe);
        *strrchr(dir, '/') = '\0';
        snprintf(ws_echo_path, sizeof ws_echo_path, "%.4000s/../examples/c/ws_echo", dir);
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_stop_signal);
    signal(SIGTERM, on_stop_signal);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/shmipc-bench-ws.XXXXXX");
    if (mkdtemp(tmpdir) == NULL)
        die("mkdtemp: %s", strerror(errno));
    for (int i = 0; i < opt.ntargets; i++) {
        struct target *t = &targets[ntargets];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "%s", opt.targets[i]);
        t->kind = strcmp(t->name, "tcp") == 0    ? K_TCP
                  : strcmp(t->name, "node") == 0 ? K_NODE
                                                 : K_OURS;
        if (t->kind == K_OURS) {
            const char *dash = strchr(t->name, '-');
            snprintf(t->backend, sizeof t->backend, "%s", dash ? dash + 1 : "");
            if (access(ws_echo_path, X_OK) != 0)
                die("%s: %s (build examples/c/ws_echo, or say where it is with --ws-echo)",
                    ws_echo_path, strerror(errno));
        }
        if (t->kind == K_NODE && !have_node && node_prepare() < 0)
            continue;
        have_node |= t->kind == K_NODE;
        ntargets++;
    }
    pattern = malloc(MAX_PAYLOAD + NFRAMES * 61);
    if (pattern == NULL)
        die("out of memory");
    for (size_t i = 0; i < MAX_PAYLOAD + NFRAMES * 61; i++)
        pattern[i] = (uint8_t)rnd();
    pin(opt.client_cpu);

    if (!opt.idle_only) {
        /* The cells: each connection count, then each payload that runs with it. */
        uint64_t all[2 * MAX_LIST];
        int nall = 0;
        for (int i = 0; i < opt.nconns; i++)
            all[nall++] = opt.conns[i];
        for (int i = 0; i < opt.nconns_large; i++) {
            int dup = 0;
            for (int j = 0; j < nall; j++)
                dup |= all[j] == opt.conns_large[i];
            if (!dup)
                all[nall++] = opt.conns_large[i];
        }
        qsort(all, (size_t)nall, sizeof all[0], cmp_u64);
        for (int i = 0; i < nall; i++)
            for (int s = 0; s < opt.nsizes; s++) {
                const uint64_t *list = opt.sizes[s] >= opt.large ? opt.conns_large : opt.conns;
                int nlist = opt.sizes[s] >= opt.large ? opt.nconns_large : opt.nconns;
                for (int j = 0; j < nlist; j++)
                    if (list[j] == all[i]) {
                        plan[nplan].size = opt.sizes[s];
                        plan[nplan++].conns = (int)all[i];
                    }
            }
        env_line(env, sizeof env, load0, load0);
        printf("# shmipc-bench-ws: %s\n# %d cells x %d servers x %d rounds\n", env, nplan, ntargets,
               opt.rounds);
        fflush(stdout);
        for (int t = 0; t < ntargets; t++)
            start_target(&targets[t]);
        /* Every server's connections of a count are opened together and stay open while the
         * count's cells run. Rounds are interleaved inside a cell: each server in turn runs a
         * part of the cell's round trips, so that other work on the machine spreads over all
         * of them; the figures are over the samples of every round. */
        for (int p = 0; p < nplan;) {
            int n = plan[p].conns, end = p;
            struct conn *cs[MAX_TARGETS];
            while (end < nplan && plan[end].conns == n)
                end++;
            for (int t = 0; t < ntargets; t++)
                cs[t] = conns_open(&targets[t], n);
            for (; p < end; p++) {
                int timed = samples_for(plan[p].size, n);
                int each = (timed + opt.rounds - 1) / opt.rounds;
                int warm = opt.warmup >= 0 ? opt.warmup : each / 10 > 5 ? each / 10 : 5;
                long per_round = (long)n * each;
                struct pass ps[MAX_TARGETS][MAX_ROUNDS];
                uint64_t *lat[MAX_TARGETS];
                char sz[32];
                fmt_size(sz, sizeof sz, plan[p].size);
                for (int t = 0; t < ntargets; t++)
                    if ((lat[t] = malloc((size_t)per_round * (size_t)opt.rounds *
                                         sizeof *lat[t])) == NULL)
                        die("out of memory");
                for (int r = 0; r < opt.rounds; r++)
                    for (int t = 0; t < ntargets; t++) {
                        uint64_t *part = lat[t] + (size_t)r * (size_t)per_round;
                        run_pass(&targets[t], cs[t], n, plan[p].size, each, warm, part, &ps[t][r]);
                        qsort(part, (size_t)per_round, sizeof *part, cmp_u64);
                        printf("round %d  %-14s %8s x %-5d p50 %9.1f  p99 %9.1f  max %9.1f µs  "
                               "%8.1f MiB/s\n",
                               r + 1, targets[t].name, sz, n, percentile_us(part, per_round, 0.5),
                               percentile_us(part, per_round, 0.99),
                               (double)part[per_round - 1] / 1000.0,
                               2.0 * (double)plan[p].size * (double)ps[t][r].completed /
                                   ((double)ps[t][r].ns / 1e9) / (1024.0 * 1024.0));
                        fflush(stdout);
                    }
                for (int t = 0; t < ntargets; t++) {
                    cell_sum(&med[t][p], lat[t], per_round, ps[t], plan[p].size);
                    free(lat[t]);
                }
            }
            for (int t = 0; t < ntargets; t++)
                conns_close(&targets[t], cs[t], n);
        }
        for (int t = 0; t < ntargets; t++)
            stop_target(&targets[t]);
    }
    if (opt.idle > 0) {
        for (int t = 0; t < ntargets; t++) {
            /* In the quick run only our server: the smoke test is about the program. */
            if (opt.quick && targets[t].kind != K_OURS)
                continue;
            idle_measure(&targets[t], opt.idle, &idle[t]);
            idle_done[t] = 1;
            printf("idle     %-14s %d connections: VmRSS %ld -> %ld -> %ld KiB (%.0f bytes "
                   "each after a message)\n",
                   targets[t].name, opt.idle, idle[t].before.vmrss_kib, idle[t].open.vmrss_kib,
                   idle[t].used.vmrss_kib,
                   per_conn(idle[t].used.vmrss_kib, idle[t].before.vmrss_kib, opt.idle));
            fflush(stdout);
        }
    }
    load1 = loadavg();
    env_line(env, sizeof env, load0, load1);
    write_json(env, command, started, load0, load1);
    f = fopen(opt.md, "w");
    if (f == NULL)
        die("%s: %s", opt.md, strerror(errno));
    write_md(f, env);
    if (fclose(f) != 0)
        die("%s: %s", opt.md, strerror(errno));
    printf("\n");
    f = fopen(opt.md, "r");
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        fputs(line, stdout);
    if (f != NULL)
        fclose(f);
    {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0)
            fprintf(stderr, "shmipc-bench-ws: could not remove %s\n", tmpdir);
    }
    printf("\nwrote %s and %s in %lld s\n", opt.json, opt.md, (long long)(time(NULL) - started));
    return 0;
}
