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
 */
#include <shmipc.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SHMIPC_BENCH_BUILDTYPE
#define SHMIPC_BENCH_BUILDTYPE "unknown"
#endif

#define MAX_LIST    8
#define MAX_TARGETS 6
#define MAX_ROUNDS  9
#define MAX_PAYLOAD (64u << 20)
/* Frames kept ready per cell; consecutive messages use the next one, so no two in a row are
 * the same bytes (other payload offset, other mask key). */
#define NFRAMES 4
/* Connections opened (connect + upgrade) before their responses are awaited. */
#define OPEN_BATCH 256
/* The longest the client waits without any progress before it calls a server stalled. */
#define STALL_MS 20000
/* RFC 6455's example key and its accept value: every upgrade of the client sends this key. */
#define WS_KEY    "dGhlIHNhbXBsZSBub25jZQ=="
#define WS_ACCEPT "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="

static const char node_script[] =
    "// Written by shmipc-bench-ws: an echo server on the npm `ws` package.\n"
    "const { WebSocketServer } = require('ws');\n"
    "const wss = new WebSocketServer({ host: '127.0.0.1', port: Number(process.argv[2]),\n"
    "  backlog: 4096, perMessageDeflate: false, clientTracking: false,\n"
    "  maxPayload: 64 * 1024 * 1024 });\n"
    "wss.on('connection', (ws) => {\n"
    "  ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary }));\n"
    "  ws.on('error', () => {});\n"
    "});\n"
    "process.on('SIGTERM', () => process.exit(0));\n";

/* ---------------------------------------------------------------------------------------- */
/* Small helpers */

static pid_t children[MAX_TARGETS * 2];
static int nchildren;

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
static void on_stop_signal(int sig)
{
    for (int i = 0; i < nchildren; i++)
        if (children[i] > 0)
            kill(children[i], SIGTERM);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void die(const char *fmt, ...)
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

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static int have(const char *prog)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", prog);
    return system(cmd) == 0;
}

static void pin(int cpu)
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
static int parse_bytes(const char *s, uint64_t *out)
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
static int parse_list(const char *s, uint64_t *out, uint64_t lo, uint64_t hi)
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

static void fmt_size(char *buf, size_t cap, uint64_t v)
{
    if (v >= (1u << 20) && v % (1u << 20) == 0)
        snprintf(buf, cap, "%" PRIu64 " MiB", v >> 20);
    else if (v >= 1024 && v % 1024 == 0)
        snprintf(buf, cap, "%" PRIu64 " KiB", v >> 10);
    else
        snprintf(buf, cap, "%" PRIu64 " B", v);
}

static double loadavg(void)
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

static int free_port(void)
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

static int set_nonblock(int fd, int on)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return -1;
    return fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}

/* ---------------------------------------------------------------------------------------- */
/* tcp-echo: the floor. One thread, level-triggered epoll, echoes whatever arrives; a
 * connection holds memory only while the peer is not reading (what write() did not take). */

struct echo_conn {
    uint8_t *pending;
    size_t len, off;
};

static volatile sig_atomic_t echo_stop;

static void echo_on_term(int sig)
{
    (void)sig;
    echo_stop = 1;
}

static void echo_close(int ep, struct echo_conn **tab, int fd)
{
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    if (tab[fd] != NULL) {
        free(tab[fd]->pending);
        free(tab[fd]);
        tab[fd] = NULL;
    }
}

static int tcp_echo(int port)
{
    static uint8_t buf[256 << 10];
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct epoll_event ev = {.events = EPOLLIN}, evs[256];
    struct echo_conn **tab;
    int one = 1, lfd, ep;
    long maxfd = sysconf(_SC_OPEN_MAX);
    if (maxfd < 1024)
        maxfd = 1024;
    tab = calloc((size_t)maxfd, sizeof *tab);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (tab == NULL || lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(lfd, (struct sockaddr *)&sin, sizeof sin) < 0 || listen(lfd, 4096) < 0) {
        fprintf(stderr, "tcp-echo: port %d: %s\n", port, strerror(errno));
        return 1;
    }
    ep = epoll_create1(EPOLL_CLOEXEC);
    ev.data.fd = lfd;
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev) < 0) {
        fprintf(stderr, "tcp-echo: epoll: %s\n", strerror(errno));
        return 1;
    }
    signal(SIGTERM, echo_on_term);
    signal(SIGINT, echo_on_term);
    signal(SIGPIPE, SIG_IGN);
    while (!echo_stop) {
        int n = epoll_wait(ep, evs, 256, -1);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == lfd) {
                int c;
                while ((c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    struct epoll_event ce = {.events = EPOLLIN, .data.fd = c};
                    if (c >= maxfd) {
                        close(c);
                        continue;
                    }
                    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce);
                }
                continue;
            }
            if (tab[fd] != NULL) { /* flushing what the peer did not take yet */
                struct echo_conn *c = tab[fd];
                ssize_t w = write(fd, c->pending + c->off, c->len - c->off);
                if (w < 0 && errno != EAGAIN) {
                    echo_close(ep, tab, fd);
                    continue;
                }
                c->off += w > 0 ? (size_t)w : 0;
                if (c->off == c->len) {
                    struct epoll_event ce = {.events = EPOLLIN, .data.fd = fd};
                    free(c->pending);
                    free(c);
                    tab[fd] = NULL;
                    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ce);
                }
                continue;
            }
            ssize_t r = read(fd, buf, sizeof buf);
            if (r <= 0) {
                if (r == 0 || errno != EAGAIN)
                    echo_close(ep, tab, fd);
                continue;
            }
            ssize_t w = write(fd, buf, (size_t)r);
            if (w < 0 && errno != EAGAIN) {
                echo_close(ep, tab, fd);
                continue;
            }
            if (w < 0)
                w = 0;
            if (w < r) { /* keep the rest; stop reading until it is gone */
                struct echo_conn *c = malloc(sizeof *c);
                struct epoll_event ce = {.events = EPOLLOUT, .data.fd = fd};
                if (c == NULL || (c->pending = malloc((size_t)(r - w))) == NULL) {
                    free(c);
                    echo_close(ep, tab, fd);
                    continue;
                }
                memcpy(c->pending, buf + w, (size_t)(r - w));
                c->len = (size_t)(r - w);
                c->off = 0;
                tab[fd] = c;
                epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ce);
            }
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Options */

enum kind { K_TCP, K_OURS, K_NODE };

struct target {
    char name[32]; /* "tcp", "ours", "ours-epoll", "ours-io_uring", "node" */
    enum kind kind;
    char backend[16]; /* ours: what --backend asks for, "" for the example's default */
    pid_t pid;
    int port;
};

static struct {
    uint64_t sizes[MAX_LIST], conns[MAX_LIST], conns_large[MAX_LIST];
    int nsizes, nconns, nconns_large;
    uint64_t large; /* sizes from here use conns_large */
    int rounds;
    int samples; /* fewest timed round trips per connection */
    uint64_t cell_rts, cell_bytes;
    int warmup; /* untimed round trips per connection; -1: a tenth of the samples, >= 10 */
    char targets[MAX_TARGETS][32];
    int ntargets;
    int workers;
    const char *ws_echo, *ws_path, *npm_dir;
    int server_cpu, client_cpu;
    int idle;      /* connections of the idle measurement; 0: none */
    int idle_only; /* --idle given: only the idle measurement */
    int quick;
    const char *json, *md;
} opt;

static char self_exe[4096], ws_echo_path[4096], tmpdir[256];
static char node_version[64] = "", ws_version[64] = "";

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

/* ---------------------------------------------------------------------------------------- */
/* Servers */

/* Runs argv pinned to the server CPU with stdout into /dev/null; returns its pid. */
static pid_t spawn(char *const argv[], const char *node_path)
{
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        /* And should the client die anyway, the server goes with it. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        pin(opt.server_cpu);
        if (null >= 0)
            dup2(null, 1);
        if (node_path != NULL)
            setenv("NODE_PATH", node_path, 1);
        execvp(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    children[nchildren++] = pid;
    return pid;
}

static int tcp_connect(int port)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sin, sizeof sin) < 0) {
        close(fd);
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void start_target(struct target *t)
{
    char port[16], workers[16], script[300], node_path[600];
    t->port = free_port();
    snprintf(port, sizeof port, "%d", t->port);
    snprintf(workers, sizeof workers, "%d", opt.workers);
    if (t->kind == K_TCP) {
        char *argv[] = {self_exe, "tcp-echo", port, NULL};
        t->pid = spawn(argv, NULL);
    } else if (t->kind == K_OURS) {
        char *argv[] = {ws_echo_path, port, "--workers", workers, "--backend", t->backend, NULL};
        if (t->backend[0] == '\0')
            argv[4] = NULL;
        t->pid = spawn(argv, NULL);
    } else {
        char *argv[] = {"node", script, port, NULL};
        snprintf(script, sizeof script, "%s/ws_echo.js", tmpdir);
        snprintf(node_path, sizeof node_path, "%s/node_modules", opt.npm_dir);
        t->pid = spawn(argv, node_path);
    }
    for (int i = 0; i < 500; i++) {
        int fd = tcp_connect(t->port), status;
        if (fd >= 0) {
            close(fd);
            return;
        }
        if (waitpid(t->pid, &status, WNOHANG) == t->pid) {
            for (int k = 0; k < nchildren; k++)
                if (children[k] == t->pid)
                    children[k] = 0;
            die("the %s server exited before it listened on port %d", t->name, t->port);
        }
        sleep_ms(20);
    }
    die("the %s server did not listen on port %d within 10 s", t->name, t->port);
}

static void stop_target(struct target *t)
{
    if (t->pid <= 0)
        return;
    kill(t->pid, SIGTERM);
    for (int i = 0; i < 250 && waitpid(t->pid, NULL, WNOHANG) == 0; i++)
        sleep_ms(20);
    if (waitpid(t->pid, NULL, WNOHANG) == 0) {
        fprintf(stderr, "shmipc-bench-ws: %s did not stop within 5 s of SIGTERM; killed\n",
                t->name);
        kill(t->pid, SIGKILL);
        waitpid(t->pid, NULL, 0);
    }
    for (int k = 0; k < nchildren; k++)
        if (children[k] == t->pid)
            children[k] = 0;
    t->pid = 0;
}

/* CPU time (user + system, all threads) of a server process, in ns. */
static uint64_t server_cpu_ns(pid_t pid)
{
    clockid_t clk;
    struct timespec ts;
    if (clock_getcpuclockid(pid, &clk) == 0 && clock_gettime(clk, &ts) == 0)
        return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    return 0;
}

/* Installs `ws` into opt.npm_dir (once: a later run reuses it) and writes the echo script;
 * 0, or -1 with a note when Node.js cannot be measured. */
static int node_prepare(void)
{
    char path[700], cmd[1600], line[256];
    FILE *f;
    if (!have("node") || !have("npm")) {
        fprintf(stderr, "shmipc-bench-ws: node or npm not found: the Node.js `ws` peer is left "
                        "out (Debian: apt-get install nodejs npm)\n");
        return -1;
    }
    snprintf(path, sizeof path, "%s/node_modules/ws/package.json", opt.npm_dir);
    if (access(path, R_OK) != 0) {
        fprintf(stderr, "shmipc-bench-ws: npm install ws into %s\n", opt.npm_dir);
        snprintf(cmd, sizeof cmd,
                 "mkdir -p '%s' && cd '%s' && npm install --no-audit --no-fund --no-save "
                 "--loglevel=error --cache '%s/npm-cache' ws@8 >&2",
                 opt.npm_dir, opt.npm_dir, opt.npm_dir);
        if (system(cmd) != 0 || access(path, R_OK) != 0) {
            fprintf(stderr, "shmipc-bench-ws: npm install ws failed: the Node.js `ws` peer is "
                            "left out\n");
            return -1;
        }
    }
    f = fopen(path, "r");
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, " \"version\": \"%63[^\"]\"", ws_version) == 1)
            break;
    if (f != NULL)
        fclose(f);
    f = popen("node --version", "r");
    if (f != NULL) {
        if (fgets(node_version, sizeof node_version, f) == NULL)
            node_version[0] = '\0';
        node_version[strcspn(node_version, "\n")] = '\0';
        pclose(f);
    }
    snprintf(path, sizeof path, "%s/ws_echo.js", tmpdir);
    f = fopen(path, "w");
    if (f == NULL || fputs(node_script, f) < 0 || fclose(f) != 0)
        die("%s: %s", path, strerror(errno));
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Client connections */

struct conn {
    int fd;
    int k;          /* the frame in flight */
    size_t sent;    /* its bytes written */
    int want_out;   /* EPOLLOUT is on */
    int in_flight;  /* a message is out, its echo not all back */
    uint8_t *rx;    /* what arrived of the echo */
    size_t rx_have; /* bytes in rx */
    size_t rx_pos;  /* frames parsed (WebSocket) */
    size_t got;     /* payload bytes of the echo checked (WebSocket) */
    uint64_t t0;    /* when the message's first byte was written */
    int done;       /* round trips completed in this cell */
};

/* The frames of one cell: the same payload at different offsets of a random pattern, each
 * masked with its own key, as a browser would send them. */
struct frames {
    size_t size, frame_len, hdr;
    uint8_t *payload[NFRAMES]; /* what the echo must carry (WebSocket) */
    uint8_t *frame[NFRAMES];   /* the bytes on the wire (what the TCP echo returns) */
};

static uint8_t *pattern;
static uint64_t rng = 0x9e3779b97f4a7c15u;

static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static size_t ws_head(uint8_t *p, size_t len, int opcode, int masked)
{
    size_t n = 2;
    p[0] = (uint8_t)(0x80 | opcode);
    if (len < 126) {
        p[1] = (uint8_t)len;
    } else if (len <= 0xffff) {
        p[1] = 126;
        p[2] = (uint8_t)(len >> 8);
        p[3] = (uint8_t)len;
        n = 4;
    } else {
        p[1] = 127;
        for (int i = 0; i < 8; i++)
            p[2 + i] = (uint8_t)((uint64_t)len >> (56 - 8 * i));
        n = 10;
    }
    if (masked)
        p[1] |= 0x80;
    return n;
}

/* A masked client frame of `len` bytes of `data` into `out` (room for len + 14); its length. */
static size_t ws_client_frame(uint8_t *out, int opcode, const uint8_t *data, size_t len)
{
    size_t h = ws_head(out, len, opcode, 1);
    uint32_t key = rnd();
    uint8_t *m = out + h;
    memcpy(m, &key, 4);
    for (size_t i = 0; i < len; i++)
        m[4 + i] = data[i] ^ m[i & 3];
    return h + 4 + len;
}

static void frames_make(struct frames *fr, size_t size)
{
    memset(fr, 0, sizeof *fr);
    fr->size = size;
    for (int k = 0; k < NFRAMES; k++) {
        fr->payload[k] = pattern + (size_t)k * 61;
        fr->frame[k] = malloc(size + 14);
        if (fr->frame[k] == NULL)
            die("out of memory");
        fr->frame_len = ws_client_frame(fr->frame[k], 2, fr->payload[k], size);
    }
    fr->hdr = fr->frame_len - size - 4;
}

static void frames_free(struct frames *fr)
{
    for (int k = 0; k < NFRAMES; k++)
        free(fr->frame[k]);
}

/* Reads an upgrade response on a blocking socket; 0 when it is a 101 with our accept value. */
static int upgrade_response(int fd, char *resp, size_t cap)
{
    size_t n = 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    resp[0] = '\0';
    while (n + 1 < cap) {
        ssize_t r;
        if (poll(&p, 1, STALL_MS) <= 0)
            return -1;
        r = read(fd, resp + n, cap - 1 - n);
        if (r <= 0)
            return -1;
        n += (size_t)r;
        resp[n] = '\0';
        if (strstr(resp, "\r\n\r\n") != NULL)
            break;
    }
    resp[n] = '\0';
    if (strncmp(resp, "HTTP/1.1 101", 12) != 0 || strstr(resp, WS_ACCEPT) == NULL)
        return -1;
    /* Nothing may follow the head: the server speaks only when spoken to. */
    return strstr(resp, "\r\n\r\n")[4] == '\0' ? 0 : -1;
}

/* Opens n connections to t (upgraded to WebSocket unless t is the TCP echo), non-blocking. */
static struct conn *conns_open(const struct target *t, int n)
{
    struct conn *c = calloc((size_t)n, sizeof *c);
    char req[512], resp[1024];
    int len = snprintf(req, sizeof req,
                       "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\n"
                       "Connection: Upgrade\r\nSec-WebSocket-Key: " WS_KEY "\r\n"
                       "Sec-WebSocket-Version: 13\r\n\r\n",
                       opt.ws_path, t->port);
    if (c == NULL)
        die("out of memory");
    for (int b = 0; b < n; b += OPEN_BATCH) {
        int e = b + OPEN_BATCH < n ? b + OPEN_BATCH : n;
        for (int i = b; i < e; i++) {
            c[i].fd = tcp_connect(t->port);
            if (c[i].fd < 0)
                die("%s: connection %d of %d: connect: %s", t->name, i + 1, n, strerror(errno));
            if (t->kind != K_TCP && write(c[i].fd, req, (size_t)len) != len)
                die("%s: connection %d: upgrade request: %s", t->name, i + 1, strerror(errno));
        }
        for (int i = b; i < e; i++) {
            if (t->kind != K_TCP && upgrade_response(c[i].fd, resp, sizeof resp) < 0)
                die("%s: connection %d of %d: no valid 101 response:\n%s", t->name, i + 1, n, resp);
            set_nonblock(c[i].fd, 1);
        }
    }
    return c;
}

/* Closes them: WebSocket connections with a close handshake (1000), waiting for the server to
 * end the TCP connection first, so that TIME_WAIT stays on its side. */
static void conns_close(const struct target *t, struct conn *c, int n)
{
    uint8_t fr[32], body[2] = {0x03, 0xe8};
    size_t flen = ws_client_frame(fr, 8, body, 2);
    for (int b = 0; b < n; b += OPEN_BATCH) {
        int e = b + OPEN_BATCH < n ? b + OPEN_BATCH : n;
        if (t->kind != K_TCP) {
            for (int i = b; i < e; i++) {
                set_nonblock(c[i].fd, 0);
                if (write(c[i].fd, fr, flen) != (ssize_t)flen)
                    die("%s: close frame: %s", t->name, strerror(errno));
            }
            for (int i = b; i < e; i++) {
                struct pollfd p = {.fd = c[i].fd, .events = POLLIN};
                uint8_t buf[256];
                ssize_t r = 1;
                while (r > 0 && poll(&p, 1, 5000) > 0)
                    r = read(c[i].fd, buf, sizeof buf);
                if (r != 0)
                    fprintf(stderr,
                            "shmipc-bench-ws: %s: connection %d not closed by the "
                            "server within 5 s of the close handshake\n",
                            t->name, i + 1);
            }
        }
        for (int i = b; i < e; i++) {
            close(c[i].fd);
            free(c[i].rx);
        }
    }
    free(c);
}

/* ---------------------------------------------------------------------------------------- */
/* One cell: n connections in a closed loop */

struct cell {
    double p[5]; /* p50, p90, p99, p99.9, max in µs, over the samples of every round */
    double p50_round[MAX_ROUNDS];
    double rt_per_s, mib_per_s;
    double server_cpu_us; /* server CPU time per round trip */
    long samples;
};

/* What one pass (one round of a cell on one server) measured. */
struct pass {
    long completed;  /* round trips, warm-up and tail included */
    uint64_t ns;     /* wall time */
    uint64_t cpu_ns; /* the server's CPU time */
};

struct loop {
    const struct target *t;
    struct frames *fr;
    struct conn *c;
    int n, ep;
    int warm, timed;
    uint64_t *lat; /* n x timed */
    int stopping;  /* no new messages: drain */
    long completed, in_flight;
};

static void conn_arm(struct loop *l, int i, int out)
{
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0u), .data.u32 = (uint32_t)i};
    if (l->c[i].want_out != out) {
        l->c[i].want_out = out;
        if (epoll_ctl(l->ep, EPOLL_CTL_MOD, l->c[i].fd, &ev) < 0)
            die("epoll_ctl: %s", strerror(errno));
    }
}

static void conn_write(struct loop *l, int i)
{
    struct conn *c = &l->c[i];
    const uint8_t *f = l->fr->frame[c->k];
    while (c->sent < l->fr->frame_len) {
        ssize_t w = write(c->fd, f + c->sent, l->fr->frame_len - c->sent);
        if (w < 0) {
            if (errno == EAGAIN)
                break;
            die("%s: write: %s", l->t->name, strerror(errno));
        }
        c->sent += (size_t)w;
    }
    conn_arm(l, i, c->sent < l->fr->frame_len);
}

static void conn_send(struct loop *l, int i)
{
    struct conn *c = &l->c[i];
    c->k = (c->k + 1) % NFRAMES;
    c->sent = 0;
    c->rx_have = c->rx_pos = c->got = 0;
    c->in_flight = 1;
    l->in_flight++;
    c->t0 = now_ns();
    conn_write(l, i);
}

static void mismatch(const struct loop *l, int i, const char *what, size_t off)
{
    die("%s: connection %d, %zu-byte message: %s at byte %zu", l->t->name, i + 1, l->fr->size, what,
        off);
}

/* Checks the WebSocket frames that arrived; 1 when the whole echo is in. */
static int ws_parse(struct loop *l, int i)
{
    struct conn *c = &l->c[i];
    for (;;) {
        const uint8_t *p = c->rx + c->rx_pos;
        size_t avail = c->rx_have - c->rx_pos, h = 2;
        uint64_t len;
        if (avail < 2)
            break;
        len = p[1] & 0x7f;
        if (p[1] & 0x80)
            mismatch(l, i, "a masked server frame", c->got);
        if (len == 126)
            h = 4;
        else if (len == 127)
            h = 10;
        if (avail < h)
            break;
        if (h == 4)
            len = (uint64_t)p[2] << 8 | p[3];
        else if (h == 10)
            for (int b = 0; b < 8; b++)
                len = b ? len << 8 | p[2 + b] : p[2];
        if (len > l->fr->size + 125 || avail - h < len) {
            if (len > l->fr->size + 125)
                mismatch(l, i, "a frame longer than the message", c->got);
            break;
        }
        int op = p[0] & 0x0f, fin = p[0] & 0x80;
        if (op == 8)
            mismatch(l, i, "a close frame from the server", c->got);
        if (op == 2 || op == 0) {
            if (c->got + len > l->fr->size || (op == 2) != (c->got == 0))
                mismatch(l, i, "frames that do not make up the message", c->got);
            if (memcmp(p + h, l->fr->payload[c->k] + c->got, len) != 0)
                mismatch(l, i, "echoed bytes that differ", c->got);
            c->got += len;
        } else if (op != 10) { /* pongs are ignored; nothing else is expected */
            mismatch(l, i, "an unexpected opcode", c->got);
        }
        c->rx_pos += h + len;
        if ((op == 2 || op == 0) && fin) {
            if (c->got != l->fr->size)
                mismatch(l, i, "a short message", c->got);
            if (c->rx_pos != c->rx_have)
                mismatch(l, i, "bytes after the echo", c->rx_pos);
            return 1;
        }
    }
    if (c->rx_pos > 0) { /* keep only the frame not yet whole */
        memmove(c->rx, c->rx + c->rx_pos, c->rx_have - c->rx_pos);
        c->rx_have -= c->rx_pos;
        c->rx_pos = 0;
    }
    return 0;
}

static void conn_read(struct loop *l, int i)
{
    struct conn *c = &l->c[i];
    size_t cap = l->fr->size + 14 + 128;
    for (;;) {
        ssize_t r;
        if (c->rx_have == cap)
            mismatch(l, i, "more bytes than the echo", c->rx_have);
        r = read(c->fd, c->rx + c->rx_have, cap - c->rx_have);
        if (r == 0)
            die("%s: connection %d closed by the server", l->t->name, i + 1);
        if (r < 0) {
            if (errno == EAGAIN)
                return;
            die("%s: read: %s", l->t->name, strerror(errno));
        }
        if (!c->in_flight)
            mismatch(l, i, "bytes with no message in flight", 0);
        c->rx_have += (size_t)r;
        int whole;
        if (l->t->kind == K_TCP) {
            if (c->rx_have > l->fr->frame_len)
                mismatch(l, i, "more bytes than were sent", l->fr->frame_len);
            whole = c->rx_have == l->fr->frame_len;
        } else {
            whole = ws_parse(l, i);
        }
        if (!whole)
            continue;
        uint64_t t1 = now_ns();
        if (l->t->kind == K_TCP && memcmp(c->rx, l->fr->frame[c->k], c->rx_have) != 0)
            mismatch(l, i, "echoed bytes that differ", 0);
        if (c->done >= l->warm && c->done < l->warm + l->timed)
            l->lat[(size_t)i * (size_t)l->timed + (size_t)(c->done - l->warm)] = t1 - c->t0;
        c->done++;
        c->in_flight = 0;
        l->in_flight--;
        l->completed++;
        if (!l->stopping)
            conn_send(l, i);
        return;
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int samples_for(uint64_t size, int n)
{
    uint64_t total = opt.cell_rts, by_bytes = opt.cell_bytes / size;
    if (by_bytes < total)
        total = by_bytes;
    uint64_t each = (total + (uint64_t)n - 1) / (uint64_t)n;
    return each > (uint64_t)opt.samples ? (int)each : opt.samples;
}

/* Runs `warm` untimed and then `timed` timed round trips on each of the n connections; the
 * latencies go to lat (n x timed, in ns). */
static void run_pass(const struct target *t, struct conn *c, int n, size_t size, int timed,
                     int warm, uint64_t *lat, struct pass *out)
{
    struct frames fr;
    struct loop l = {.t = t, .fr = &fr, .c = c, .n = n};
    struct epoll_event evs[256];
    uint64_t t_start, t_end, cpu0, cpu1, last_progress;
    long last_completed = 0;
    int behind;
    frames_make(&fr, size);
    l.timed = timed;
    l.warm = warm;
    l.lat = lat;
    l.ep = epoll_create1(EPOLL_CLOEXEC);
    if (l.ep < 0)
        die("cell set-up: %s", strerror(errno));
    for (int i = 0; i < n; i++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        free(c[i].rx);
        c[i].rx = malloc(size + 14 + 128);
        c[i].done = 0;
        c[i].want_out = 0;
        if (c[i].rx == NULL || epoll_ctl(l.ep, EPOLL_CTL_ADD, c[i].fd, &ev) < 0)
            die("cell set-up: %s", strerror(errno));
    }
    cpu0 = server_cpu_ns(t->pid);
    t_start = last_progress = now_ns();
    for (int i = 0; i < n; i++)
        conn_send(&l, i);
    behind = n;
    while (l.in_flight > 0) {
        int k = epoll_wait(l.ep, evs, 256, 1000);
        if (k < 0 && errno != EINTR)
            die("epoll_wait: %s", strerror(errno));
        for (int e = 0; e < k; e++) {
            int i = (int)evs[e].data.u32;
            if (evs[e].events & EPOLLOUT)
                conn_write(&l, i);
            if (evs[e].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
                int before = c[i].done;
                conn_read(&l, i);
                if (before < l.warm + l.timed && c[i].done >= l.warm + l.timed)
                    behind--;
            }
        }
        if (behind == 0)
            l.stopping = 1;
        if (l.completed != last_completed) {
            last_completed = l.completed;
            last_progress = now_ns();
        } else if (now_ns() - last_progress > (uint64_t)STALL_MS * 1000000u) {
            die("%s: no echo for %d s with %ld of %d connections waiting (%zu-byte messages)",
                t->name, STALL_MS / 1000, l.in_flight, n, size);
        }
    }
    t_end = now_ns();
    cpu1 = server_cpu_ns(t->pid);
    close(l.ep);
    out->completed = l.completed;
    out->ns = t_end - t_start;
    out->cpu_ns = cpu0 && cpu1 ? cpu1 - cpu0 : 0;
    frames_free(&fr);
}

/* ---------------------------------------------------------------------------------------- */
/* Idle connections: what N of them cost the server process */

struct memstat {
    long vmrss_kib, rssanon_kib, heap_kib;
};

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

struct idle_result {
    int conns;
    struct memstat before, open, used;
    double open_ms;
};

/* One echo of 64 bytes on every connection (which wakes whatever state a first message
 * allocates), one batch at a time. */
static void idle_touch(const struct target *t, struct conn *c, int n)
{
    uint64_t lat[OPEN_BATCH];
    struct pass pass;
    for (int b = 0; b < n; b += OPEN_BATCH)
        run_pass(t, c + b, b + OPEN_BATCH < n ? OPEN_BATCH : n - b, 64, 1, 0, lat, &pass);
}

static void idle_measure(struct target *t, int n, struct idle_result *r)
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

static double per_conn(long after_kib, long before_kib, int n)
{
    return (double)(after_kib - before_kib) * 1024.0 / (double)n;
}

/* ---------------------------------------------------------------------------------------- */
/* Output */

static struct target targets[MAX_TARGETS];
static int ntargets;

struct plan { /* the cells in run order */
    size_t size;
    int conns;
} plan[MAX_LIST * MAX_LIST * 2];
static int nplan;

static struct cell med[MAX_TARGETS][MAX_LIST * MAX_LIST * 2];
static struct idle_result idle[MAX_TARGETS];
static int idle_done[MAX_TARGETS];

static double percentile_us(const uint64_t *sorted, long n, double q)
{
    long r = (long)ceil(q * (double)n) - 1;
    return (double)sorted[r < 0 ? 0 : r] / 1000.0;
}

/* One cell of one server from its passes: percentiles over the samples of all rounds, each
 * round's own p50 beside them, rates over the time of all passes. */
static void cell_sum(struct cell *m, uint64_t *lat, long per_round, const struct pass *ps,
                     size_t size)
{
    long completed = 0;
    uint64_t ns = 0, cpu = 0;
    const double q[4] = {0.50, 0.90, 0.99, 0.999};
    for (int r = 0; r < opt.rounds; r++) {
        uint64_t *part = lat + (size_t)r * (size_t)per_round;
        qsort(part, (size_t)per_round, sizeof *part, cmp_u64);
        m->p50_round[r] = percentile_us(part, per_round, 0.5);
        completed += ps[r].completed;
        ns += ps[r].ns;
        cpu += ps[r].cpu_ns;
    }
    m->samples = per_round * opt.rounds;
    qsort(lat, (size_t)m->samples, sizeof *lat, cmp_u64);
    for (int j = 0; j < 4; j++)
        m->p[j] = percentile_us(lat, m->samples, q[j]);
    m->p[4] = (double)lat[m->samples - 1] / 1000.0;
    m->rt_per_s = (double)completed / ((double)ns / 1e9);
    m->mib_per_s = 2.0 * (double)size * m->rt_per_s / (1024.0 * 1024.0);
    m->server_cpu_us = cpu ? (double)cpu / 1000.0 / (double)completed : 0;
}

static int find_target(enum kind k)
{
    for (int t = 0; t < ntargets; t++)
        if (targets[t].kind == k)
            return t;
    return -1;
}

static int find_cell(size_t size, int conns)
{
    for (int p = 0; p < nplan; p++)
        if (plan[p].size == size && plan[p].conns == conns)
            return p;
    return -1;
}

/* The bar of issue 6, for one of our targets; -1 when a peer or cell it needs was not run. */
struct bar {
    int tcp64, node, tcp1m, scale;
    double worst_tcp64, worst_node, worst_tcp1m, scale_ratio;
};

static void bar_eval(int t, struct bar *b)
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

static void env_line(char *buf, size_t cap, double load0, double load1)
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

static void write_json(const char *env, const char *command, time_t started, double load0,
                       double load1)
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

static void write_md(FILE *f, const char *env)
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

/* ---------------------------------------------------------------------------------------- */

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
