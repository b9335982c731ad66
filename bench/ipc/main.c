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
 * This file holds the run and the options. Beside it, each named after what it holds:
 * transport_shmipc.c and transport_socket.c (the transports), echo_server.c, client.c,
 * shapes.c, stats.c, report_text.c and report_json.c, common.c (helpers, environment,
 * pinning), and ipc_bench.h, the internal header they share.
 *
 * Usage: shmipc-bench ipc [options]   (shmipc-bench ipc --help lists them)
 */
#include "ipc_bench.h"

/* No blocking call of the client waits longer than this for the echo server (--timeout). */
int io_timeout_ms = 30000;

/* --echo copy: the shmipc echo copies each payload into new slices instead of forwarding. */
int echo_copy;

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
    measure_wake_floor(&e);
    measure_spin_floor(o, &e);
    read_loadavg(e.load_end, sizeof e.load_end);
    write_tables(stdout, &r);
    write_idle(stdout, o, 0);
    write_memcpy_floor(stdout, &r);
    write_wake_floor(stdout, &r);
    write_spin_floor(stdout, &r);
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
