/*
 * shmipc-load-http: holds many keep-alive HTTP connections to the server and serves them all,
 * then runs a slowloris attack against it while timing ordinary requests. A load test, not a
 * benchmark: it checks every answer and exits 1 on any failure; the times it prints are
 * measurements, never asserted.
 *
 *   shmipc-load-http [--mode http|ws] [--conns N] [--rounds R] [--slow M] [--normal K]
 *                    [--header-timeout-ms MS] [--workers W] [--backend auto|io_uring|epoll]
 *
 * 1. A child process runs the server (GET /n/\* answers the wildcard as its body; the header
 *    timeout is MS; keep-alive 120 s), so its memory can be read from /proc/PID/status.
 * 2. N connections are opened and kept; R rounds send one request on every connection, in
 *    turn (all sent, then all read), and check each answer's status and body. The server's
 *    RSS before and after gives the memory per connection.
 * 3. K of those connections time sequential requests (the baseline). Then M slowloris
 *    connections open and send one byte of a request head per second each; the K connections
 *    keep timing requests. Every slow connection must be closed by the server between MS
 *    and MS + 2 s after it opened, with nothing answered to it.
 * 4. A last round on all N connections checks that every one still works.
 *
 * With --mode ws the connections are upgraded to WebSocket (route /ws, an echo) first, each
 * round sends a masked text frame "<conn>.<round>" and checks its echo, and there is no
 * slowloris step.
 *
 * It sees only the public header, as a user's program would. Traffic stays on 127.0.0.1.
 */
#include <shmipc.h>

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct options {
    int conns, rounds, slow, normal, header_ms, workers, backend;
    int ws; /* --mode ws: WebSocket connections (upgrade, then echoed text messages) */
};

static int ws_mode;

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "load: " __VA_ARGS__);                                                 \
            fputc('\n', stderr);                                                                   \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* ---------------------------------------------------------------------------------------- */
/* The server (child process)                                                               */
/* ---------------------------------------------------------------------------------------- */

static shmipc_server *served;

static void on_term(int sig)
{
    (void)sig;
    shmipc_server_stop(served);
}

static int echo_wildcard(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    size_t len;
    const char *w = shmipc_http_request_wildcard(req, &len);
    (void)ud;
    return shmipc_http_response_body(res, w, len);
}

/* Echoes every WebSocket message back as it came. */
static void ws_echo(shmipc_ws *ws, int kind, const void *data, size_t len, void *ud)
{
    (void)ud;
    if (shmipc_ws_send(ws, kind, data, len) < 0)
        shmipc_ws_close(ws, 1013, "send queue full");
}

static _Noreturn void run_server(const struct options *o, int port_fd)
{
    shmipc_server_config *cfg;
    int port;
    if (shmipc_server_config_new(&cfg) != 0 || shmipc_server_config_set_port(cfg, 0) != 0 ||
        shmipc_server_config_set_workers(cfg, (unsigned)o->workers) != 0 ||
        shmipc_server_config_set_backend(cfg, o->backend) != 0 ||
        shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_HEADER, (int)o->header_ms) !=
            0 ||
        shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_KEEPALIVE, 120000) != 0 ||
        /* The normal clients time thousands of requests on each of their connections, which
         * they never reopen: no keepalive_requests limit (as the HTTP benchmark's). */
        shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_KEEPALIVE_REQUESTS, 4294967295u) !=
            0 ||
        shmipc_server_new(cfg, &served) != 0 ||
        shmipc_server_route(served, "GET", "/n/*", echo_wildcard, NULL, NULL) != 0 ||
        shmipc_server_websocket(served, "/ws", NULL, NULL, ws_echo, NULL, NULL, NULL) != 0 ||
        shmipc_server_start(served) != 0 || (port = shmipc_server_port(served)) <= 0) {
        fprintf(stderr, "load: server: %s\n", shmipc_error_detail());
        _exit(1);
    }
    shmipc_server_config_free(cfg);
    signal(SIGTERM, on_term);
    char line[64];
    int n = snprintf(line, sizeof line, "%d %s\n", port, shmipc_server_backend(served));
    if (write(port_fd, line, (size_t)n) != n)
        _exit(1);
    close(port_fd);
    int rc = shmipc_server_run(served);
    shmipc_server_close(served);
    _exit(rc == 0 ? 0 : 1);
}

/* The resident set of process `pid`, in KiB. */
static long rss_kib(pid_t pid)
{
    char path[64], line[256];
    long kib = -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    if (f != NULL)
        fclose(f);
    return kib;
}

/* ---------------------------------------------------------------------------------------- */
/* Clients                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static int connect_to(int port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct timeval tv = {10, 0};
    int one = 1;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    /* Nothing here waits forever: a lost answer is a failure after 10 s, not a hang. */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        int err = errno;
        close(fd);
        return -err;
    }
    return fd;
}

/* A request: GET /n/<conn>.<round>, or in WebSocket mode a masked text frame "<conn>.<round>". */
static int send_request(int fd, int conn, int round)
{
    char req[128];
    int n;
    if (ws_mode) {
        static const uint8_t key[4] = {0x37, 0xfa, 0x21, 0x3d};
        char text[32];
        int len = snprintf(text, sizeof text, "%d.%d", conn, round);
        req[0] = (char)0x81; /* FIN, text */
        req[1] = (char)(0x80 | len);
        memcpy(req + 2, key, 4);
        for (int i = 0; i < len; i++)
            req[6 + i] = (char)(text[i] ^ key[i % 4]);
        n = 6 + len;
    } else {
        n = snprintf(req, sizeof req, "GET /n/%d.%d HTTP/1.1\r\nHost: load\r\n\r\n", conn, round);
    }
    return send(fd, req, (size_t)n, MSG_NOSIGNAL) == n ? 0 : -1;
}

static int read_ws_message(int fd, int conn, int round);

/* Reads one response and checks it is 200 with body "<conn>.<round>". 0, or -1 (reported). */
static int read_response(int fd, int conn, int round)
{
    char buf[2048], want[32];
    size_t got = 0;
    long clen = -1;
    char *body = NULL;
    if (ws_mode && round >= 0)
        return read_ws_message(fd, conn, round);
    snprintf(want, sizeof want, "%d.%d", conn, round);
    for (;;) {
        ssize_t n = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (n <= 0) {
            CHECK(0, "connection %d, round %d: %s", conn, round,
                  n == 0 ? "closed by the server" : strerror(errno));
            return -1;
        }
        got += (size_t)n;
        buf[got] = '\0';
        if (body == NULL && (body = strstr(buf, "\r\n\r\n")) != NULL) {
            body += 4;
            char *cl = strcasestr(buf, "\r\nContent-Length:");
            clen = cl != NULL ? strtol(cl + 17, NULL, 10) : -1;
        }
        if (body != NULL &&
            (round < 0 || (clen >= 0 && (size_t)(body - buf) + (size_t)clen <= got)))
            break;
        if (got == sizeof buf - 1) {
            CHECK(0, "connection %d, round %d: response too long", conn, round);
            return -1;
        }
    }
    if (round < 0) { /* the answer to a WebSocket upgrade */
        if (strncmp(buf, "HTTP/1.1 101 ", 13) != 0 || body != buf + got) {
            CHECK(0, "connection %d: upgrade answered \"%.60s\"", conn, buf);
            return -1;
        }
        return 0;
    }
    if (strncmp(buf, "HTTP/1.1 200 ", 13) != 0 || (size_t)clen != strlen(want) ||
        memcmp(body, want, (size_t)clen) != 0 || (size_t)(body - buf) + (size_t)clen != got) {
        CHECK(0, "connection %d, round %d: unexpected response \"%.60s\"", conn, round, buf);
        return -1;
    }
    return 0;
}

/* Reads exactly n bytes (the socket has a receive timeout). */
static int read_full(int fd, void *buf, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t r = recv(fd, (char *)buf + got, n - got, 0);
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

/* Reads one unmasked text frame from the server and checks it says "<conn>.<round>". */
static int read_ws_message(int fd, int conn, int round)
{
    uint8_t head[2];
    char body[128], want[32];
    int n = snprintf(want, sizeof want, "%d.%d", conn, round);
    if (read_full(fd, head, 2) < 0 || head[0] != 0x81 || head[1] != n ||
        read_full(fd, body, (size_t)n) < 0 || memcmp(body, want, (size_t)n) != 0) {
        CHECK(0, "connection %d, round %d: bad or missing WebSocket echo", conn, round);
        return -1;
    }
    return 0;
}

/* Upgrades every connection to WebSocket (all requests sent, then all answers read). */
static int upgrade_all(const int *fds, int n)
{
    static const char upgrade[] = "GET /ws HTTP/1.1\r\nHost: load\r\nUpgrade: websocket\r\n"
                                  "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                                  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (send(fds[i], upgrade, sizeof upgrade - 1, MSG_NOSIGNAL) != sizeof upgrade - 1) {
            CHECK(0, "connection %d: upgrade: %s", i, strerror(errno));
            bad++;
        }
    /* Each failed read costs the 10 s receive timeout: give up after a few. */
    for (int i = 0; i < n && bad < 5; i++)
        bad += read_response(fds[i], i, -1) < 0;
    return bad;
}

/* One request on every connection (all sent first, then all read); returns the failures. */
static int round_robin(const int *fds, int n, int round)
{
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (send_request(fds[i], i, round) < 0) {
            CHECK(0, "connection %d, round %d: send: %s", i, round, strerror(errno));
            bad++;
        }
    for (int i = 0; i < n && bad < 5; i++)
        bad += read_response(fds[i], i, round) < 0;
    return bad;
}

static int compare_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

struct latencies {
    uint64_t *us;
    size_t n, cap;
};

/* One timed request on normal connection `i` (of the first K). */
static void timed_request(const int *fds, int i, int round, struct latencies *l)
{
    uint64_t t0 = now_us();
    if (send_request(fds[i], i, round) < 0 || read_response(fds[i], i, round) < 0)
        return;
    if (l->n < l->cap)
        l->us[l->n++] = now_us() - t0;
}

static void report_latencies(const char *what, struct latencies *l)
{
    if (l->n == 0) {
        printf("%s: no requests\n", what);
        return;
    }
    qsort(l->us, l->n, sizeof *l->us, compare_u64);
    printf("%s: %zu requests, latency p50 %.3f ms, p99 %.3f ms, max %.3f ms\n", what, l->n,
           (double)l->us[l->n / 2] / 1000.0, (double)l->us[l->n * 99 / 100] / 1000.0,
           (double)l->us[l->n - 1] / 1000.0);
}

/* ---------------------------------------------------------------------------------------- */
/* Slowloris                                                                                */
/* ---------------------------------------------------------------------------------------- */

static const char slow_head[] =
    "GET /n/slow HTTP/1.1\r\nHost: load\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaa"
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    "\r\n\r\n";

static void slowloris(const struct options *o, int port, const int *fds, int round)
{
    int m = o->slow, open_n = 0, answered = 0, early = 0, late = 0;
    int *slow = calloc((size_t)m, sizeof *slow);
    uint64_t *opened = calloc((size_t)m, sizeof *opened), *closed = calloc((size_t)m, 8);
    struct pollfd *pfd = calloc((size_t)m, sizeof *pfd);
    struct latencies during = {calloc(1000000, 8), 0, 1000000};
    if (slow == NULL || opened == NULL || closed == NULL || pfd == NULL || during.us == NULL) {
        CHECK(0, "slowloris: out of memory");
        return;
    }
    for (int i = 0; i < m; i++) {
        slow[i] = connect_to(port);
        CHECK(slow[i] >= 0, "slow connection %d: connect: %s", i, strerror(-slow[i]));
        opened[i] = now_us();
        open_n += slow[i] >= 0;
    }
    uint64_t start = now_us(), next_tick = start,
             stop = start + (uint64_t)o->header_ms * 1000 + 3000000;
    uint64_t next_look = start;
    size_t sent = 0;
    int k = 0;
    while (open_n > 0 && now_us() < stop) {
        if (now_us() >= next_tick) {
            /* One more byte of the head on each slow connection still open. */
            for (int i = 0; i < m; i++)
                if (slow[i] >= 0 && closed[i] == 0)
                    (void)send(slow[i], slow_head + sent % (sizeof slow_head - 1), 1,
                               MSG_NOSIGNAL | MSG_DONTWAIT);
            sent++;
            next_tick += 1000000;
        }
        /* Every 10 ms, see which slow connections the server closed (a poll over all of
         * them per request would make this loop, not the server, the bottleneck). */
        int look = now_us() >= next_look;
        if (look)
            next_look = now_us() + 10000;
        for (int i = 0; look && i < m; i++)
            pfd[i] = (struct pollfd){.fd = slow[i] >= 0 && closed[i] == 0 ? slow[i] : -1,
                                     .events = POLLIN | POLLRDHUP};
        if (look && poll(pfd, (nfds_t)m, 0) > 0) {
            for (int i = 0; i < m; i++) {
                if (pfd[i].revents == 0)
                    continue;
                char b[256];
                ssize_t n = recv(slow[i], b, sizeof b, MSG_DONTWAIT);
                if (n > 0) {
                    answered++;
                    continue;
                }
                if (n < 0 && errno == EAGAIN)
                    continue;
                closed[i] = now_us();
                open_n--;
            }
        }
        /* Meanwhile, ordinary clients keep asking, one request at a time, timed. */
        timed_request(fds, k, round, &during);
        k = (k + 1) % o->normal;
    }
    uint64_t first = UINT64_MAX, last = 0;
    for (int i = 0; i < m; i++) {
        if (slow[i] < 0)
            continue;
        if (closed[i] == 0) {
            late++;
            continue;
        }
        uint64_t after = closed[i] - opened[i];
        first = after < first ? after : first;
        last = after > last ? after : last;
        if (after + 100000 < (uint64_t)o->header_ms * 1000)
            early++;
        if (after > (uint64_t)o->header_ms * 1000 + 2000000)
            late++;
    }
    printf("slowloris: %d connections, 1 byte/s each, header timeout %d ms: closed by the server "
           "after %.2f..%.2f s; %d early, %d late or never, %d answered\n",
           m, o->header_ms, first == UINT64_MAX ? 0.0 : (double)first / 1e6, (double)last / 1e6,
           early, late, answered);
    CHECK(early == 0 && late == 0 && answered == 0,
          "slowloris: %d closed early, %d late or never, %d answered", early, late, answered);
    report_latencies("normal clients during the attack", &during);
    for (int i = 0; i < m; i++)
        if (slow[i] >= 0)
            close(slow[i]);
    free(during.us);
    free(pfd);
    free(closed);
    free(opened);
    free(slow);
}

/* ---------------------------------------------------------------------------------------- */

static int parse_args(int argc, char **argv, struct options *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL)
            return -1;
        i++;
        if (strcmp(a, "--conns") == 0)
            o->conns = atoi(v);
        else if (strcmp(a, "--rounds") == 0)
            o->rounds = atoi(v);
        else if (strcmp(a, "--slow") == 0)
            o->slow = atoi(v);
        else if (strcmp(a, "--normal") == 0)
            o->normal = atoi(v);
        else if (strcmp(a, "--header-timeout-ms") == 0)
            o->header_ms = atoi(v);
        else if (strcmp(a, "--mode") == 0 && (strcmp(v, "http") == 0 || strcmp(v, "ws") == 0))
            o->ws = strcmp(v, "ws") == 0;
        else if (strcmp(a, "--workers") == 0)
            o->workers = atoi(v);
        else if (strcmp(a, "--backend") == 0)
            o->backend = strcmp(v, "io_uring") == 0 ? SHMIPC_BACKEND_IO_URING
                         : strcmp(v, "epoll") == 0  ? SHMIPC_BACKEND_EPOLL
                         : strcmp(v, "auto") == 0   ? SHMIPC_BACKEND_AUTO
                                                    : -1;
        else
            return -1;
    }
    if (o->conns < 1 || o->rounds < 1 || o->slow < 0 || o->normal < 1 || o->normal > o->conns ||
        o->header_ms < 1 || o->workers < 1 || o->backend < 0)
        return -1;
    return 0;
}

int main(int argc, char **argv)
{
    struct options o = {.conns = 10000,
                        .rounds = 3,
                        .slow = 500,
                        .normal = 20,
                        .header_ms = 3000,
                        .workers = 1,
                        .backend = SHMIPC_BACKEND_AUTO};
    if (parse_args(argc, argv, &o) < 0) {
        fprintf(stderr,
                "usage: %s [--mode http|ws] [--conns N] [--rounds R] [--slow M] "
                "[--normal K] [--header-timeout-ms MS] [--workers W] "
                "[--backend auto|io_uring|epoll]\n",
                argv[0]);
        return 2;
    }
    /* Each side holds N + M sockets: raise the soft limit as far as the hard one allows. */
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < (rlim_t)(o.conns + o.slow + 64)) {
        printf("load: the fd limit %llu is below the %d connections asked for: skipped\n",
               (unsigned long long)rl.rlim_cur, o.conns + o.slow);
        return 77;
    }
    signal(SIGPIPE, SIG_IGN);
    ws_mode = o.ws;

    int pipefd[2];
    if (pipe(pipefd) != 0)
        return 1;
    pid_t server = fork();
    if (server == 0) {
        close(pipefd[0]);
        run_server(&o, pipefd[1]);
    }
    close(pipefd[1]);
    char line[64] = {0}, backend[16] = "?";
    int port = 0;
    if (read(pipefd[0], line, sizeof line - 1) <= 0 ||
        sscanf(line, "%d %15s", &port, backend) < 1) {
        fprintf(stderr, "load: the server did not start\n");
        return 1;
    }
    close(pipefd[0]);
    long rss0 = rss_kib(server);

    int *fds = calloc((size_t)o.conns, sizeof *fds);
    if (fds == NULL) {
        kill(server, SIGTERM);
        return 1;
    }
    uint64_t t0 = now_us();
    int opened = 0;
    for (int i = 0; i < o.conns; i++) {
        fds[i] = connect_to(port);
        if (fds[i] < 0) {
            CHECK(0, "connection %d: connect: %s", i, strerror(-fds[i]));
            break;
        }
        opened++;
    }
    printf("load: %d connections opened in %.2f s (server: %s, %d worker%s)\n", opened,
           (double)(now_us() - t0) / 1e6, backend, o.workers, o.workers > 1 ? "s" : "");
    if (opened < o.conns)
        goto out;
    if (o.ws) {
        t0 = now_us();
        int bad = upgrade_all(fds, o.conns);
        printf("upgrade: %d connections upgraded to WebSocket, %d bad, %.2f s\n", o.conns - bad,
               bad, (double)(now_us() - t0) / 1e6);
        if (bad != 0)
            goto out;
    }

    for (int r = 0; r < o.rounds; r++) {
        t0 = now_us();
        int bad = round_robin(fds, o.conns, r);
        printf("round %d: %d requests on %d connections, %d bad, %.2f s\n", r, o.conns, o.conns,
               bad, (double)(now_us() - t0) / 1e6);
    }
    long rss1 = rss_kib(server);
    printf("server RSS: %ld KiB before, %ld KiB with %d connections: %.2f KiB per connection\n",
           rss0, rss1, o.conns, (double)(rss1 - rss0) / o.conns);

    struct latencies before = {calloc(1000000, 8), 0, 1000000};
    uint64_t until = now_us() + 2000000;
    for (int k = 0; now_us() < until; k = (k + 1) % o.normal)
        timed_request(fds, k, o.rounds, &before);
    report_latencies(o.ws ? "timed messages, one connection at a time"
                          : "normal clients before the attack",
                     &before);
    free(before.us);
    if (o.slow > 0 && !o.ws)
        slowloris(&o, port, fds, o.rounds + 1);

    t0 = now_us();
    int bad = round_robin(fds, o.conns, o.rounds + 2);
    printf("final round: %d connections still served, %d bad, %.2f s\n", o.conns - bad, bad,
           (double)(now_us() - t0) / 1e6);
out:
    for (int i = 0; i < opened; i++)
        close(fds[i]);
    free(fds);
    kill(server, SIGTERM);
    int status;
    waitpid(server, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the server exited with status %#x",
          status);
    printf("load: %s (%d failures)\n", failures == 0 ? "passed" : "FAILED", failures);
    return failures == 0 ? 0 : 1;
}
