/*
 * shmipc-bench-http: the HTTP/1.1 benchmark of docs/http.md ("Benchmark"), as
 * ../shared/reference/bench-method.md describes it. It drives wrk against this library's server
 * (its own `serve` mode: GET / -> "Hello, World!" as a static response, one worker) on each
 * backend - io_uring, epoll (persistent registration), epoll one-shot - and against nginx
 * (one worker, `return 200 "Hello, World!"`), all in the same run: connections 64, 256, 512,
 * keep-alive and pipelined (depth 16, a wrk Lua script), rounds interleaved (ours, nginx,
 * ours, ...), medians reported. The servers are pinned to one CPU and wrk (-t1) to another.
 * Figures: req/s, p50/p99 latency, and the server's CPU seconds per 100k requests from
 * /proc/PID/stat (utime + stime, nginx's workers included), the honest figure when wrk is the
 * limit on two cores. Then strace counts the system calls per request of each backend.
 *
 *   shmipc-bench-http [--quick] [--rounds N] [--duration S] [--warmup S] [--conns LIST]
 *                     [--depths LIST] [--targets LIST] [--server-cpu N] [--client-cpu N]
 *                     [--path /|/static-10k|/handler-10k] [--no-strace] [--json FILE] [--md FILE]
 *
 * --path picks what wrk asks for: "/" (the default, 13 bytes), or a 10 KiB body as a static
 * route (/static-10k) or from a handler (/handler-10k); nginx serves the same bodies.
 *   shmipc-bench-http serve BACKEND      (the target: prints "port N", runs until SIGTERM)
 *
 * Needs wrk and nginx (Debian: apt-get install wrk nginx-light) and strace for the syscall
 * table. It sees only the public header, as a user's program would.
 */
#include <shmipc.h>

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#define MAX_LIST    8
#define MAX_TARGETS 5
#define MAX_ROUNDS  15

/* ---------------------------------------------------------------------------------------- */
/* serve: the target server */

static shmipc_server *served;

/* The 10 KiB body of /static-10k (a static route) and /handler-10k (a handler route that
 * answers the same bytes): a larger static response once took batched waits that held it
 * (issue 18, item 8), which "/" did not show. */
#define BODY_10K_LEN 10240
static char body_10k[BODY_10K_LEN];

static void fill_body_10k(void)
{
    for (size_t i = 0; i < sizeof body_10k; i++)
        body_10k[i] = (char)('a' + i % 26);
}

static int h_body_10k(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    (void)ud;
    if (shmipc_http_response_add_header(res, "Content-Type", "text/plain") < 0)
        return -1;
    return shmipc_http_response_body_borrow(res, body_10k, sizeof body_10k, NULL, NULL);
}

static void on_term(int sig)
{
    (void)sig;
    shmipc_server_stop(served);
}

static int backend_value(const char *name)
{
    if (strcmp(name, "io_uring") == 0 || strcmp(name, "io_uring-nobatch") == 0)
        return SHMIPC_BACKEND_IO_URING;
    if (strcmp(name, "epoll") == 0)
        return SHMIPC_BACKEND_EPOLL;
    if (strcmp(name, "epoll-oneshot") == 0)
        return SHMIPC_BACKEND_EPOLL_ONESHOT;
    return -1;
}

static int serve(const char *backend)
{
    shmipc_server_config *cfg;
    int rc;
    if (backend_value(backend) < 0) {
        fprintf(stderr, "serve: unknown backend %s\n", backend);
        return 2;
    }
    fill_body_10k();
    /* The same-run comparison for batched waits (docs/reactor.md): io_uring with them off. */
    if (strcmp(backend, "io_uring-nobatch") == 0 && setenv("SHMIPC_REACTOR_BATCH_US", "0", 1) != 0)
        return 1;
    if ((rc = shmipc_server_config_new(&cfg)) < 0 ||
        (rc = shmipc_server_config_set_port(cfg, 0)) < 0 ||
        (rc = shmipc_server_config_set_workers(cfg, 1)) < 0 ||
        (rc = shmipc_server_config_set_backend(cfg, backend_value(backend))) < 0 ||
        /* As nginx's keepalive_requests below: the driver's connections are never closed. */
        (rc = shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_KEEPALIVE_REQUESTS,
                                             4294967295u)) < 0 ||
        (rc = shmipc_server_new(cfg, &served)) < 0 ||
        (rc = shmipc_server_static(served, "GET", "/", 200, "text/plain", "Hello, World!", 13)) <
            0 ||
        (rc = shmipc_server_static(served, "GET", "/static-10k", 200, "text/plain", body_10k,
                                   sizeof body_10k)) < 0 ||
        (rc = shmipc_server_route(served, "GET", "/handler-10k", h_body_10k, NULL, NULL)) < 0 ||
        (rc = shmipc_server_start(served)) < 0) {
        fprintf(stderr, "serve: %s: %s\n", shmipc_errname(rc), shmipc_error_detail());
        return 1;
    }
    shmipc_server_config_free(cfg);
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    printf("port %d %s\n", shmipc_server_port(served), shmipc_server_backend(served));
    fflush(stdout);
    rc = shmipc_server_run(served);
    shmipc_server_close(served);
    return rc < 0;
}

/* ---------------------------------------------------------------------------------------- */
/* The driver */

struct target {
    char name[32]; /* "io_uring", "io_uring-nobatch", "epoll", "epoll-oneshot", "nginx" */
    pid_t pid;
    int port;
};

struct sample {
    double rps, p50_ms, p99_ms, cpu_per_100k;
    long requests;
    long errors;
};

static struct {
    int quick;
    int rounds;
    int duration, warmup;
    int conns[MAX_LIST], nconns;
    int depths[MAX_LIST], ndepths;
    char targets[MAX_TARGETS][32];
    int ntargets;
    int server_cpu, client_cpu;
    int strace;
    int open_loop_us; /* > 0: the open-loop client, a request per connection every this many µs */
    const char *path; /* what wrk asks for: "/", "/static-10k" or "/handler-10k" */
    const char *json, *md;
} opt;

static char tmpdir[256];

/* The 1-minute load average: on a shared machine, what else ran meanwhile. */
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
static char self_exe[4096];

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "shmipc-bench-http: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static int parse_list(const char *s, int *out)
{
    int n = 0;
    while (*s && n < MAX_LIST) {
        out[n++] = atoi(s);
        s = strchr(s, ',');
        if (s == NULL)
            break;
        s++;
    }
    return n;
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
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) < 0)
        perror("sched_setaffinity");
}

static int free_port(void)
{
    struct sockaddr_in sin = {.sin_family = AF_INET};
    socklen_t len = sizeof sin;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sin, sizeof sin) < 0 ||
        getsockname(fd, (struct sockaddr *)&sin, &len) < 0)
        die("free port: %s", strerror(errno));
    close(fd);
    return ntohs(sin.sin_port);
}

/* Runs argv pinned to `cpu` (-1: not pinned) with stdout into `out` (NULL: inherited). */
static pid_t spawn(char *const argv[], int cpu, int out_fd)
{
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        if (cpu >= 0)
            pin(cpu);
        if (out_fd >= 0) {
            dup2(out_fd, 1);
            close(out_fd);
        }
        execvp(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

/* Starts our server for one backend; it prints its port. `wrapper` (strace) may be NULL. */
static void start_ours(struct target *t, char *const *wrapper, int nwrap)
{
    char *argv[32];
    int p[2], n = 0;
    char line[128];
    FILE *f;
    for (int i = 0; i < nwrap; i++)
        argv[n++] = wrapper[i];
    argv[n++] = self_exe;
    argv[n++] = "serve";
    argv[n++] = t->name;
    argv[n] = NULL;
    if (pipe(p) < 0)
        die("pipe: %s", strerror(errno));
    t->pid = spawn(argv, opt.server_cpu, p[1]);
    close(p[1]);
    f = fdopen(p[0], "r");
    if (f == NULL || fgets(line, sizeof line, f) == NULL || sscanf(line, "port %d", &t->port) != 1)
        die("the %s server did not start", t->name);
    fclose(f);
}

static void start_nginx(struct target *t)
{
    char path[512], conf[2048];
    char *argv[] = {"nginx", "-p", tmpdir, "-c", path, "-e", "stderr", NULL};
    FILE *f;
    t->port = free_port();
    snprintf(path, sizeof path, "%s/nginx.conf", tmpdir);
    /* As bench-method.md says, plus what 512 connections on one worker need
     * (worker_connections) and what keeps nginx from closing keep-alive connections after
     * its default 1000 requests (keepalive_requests), which would cost it reconnects. */
    snprintf(conf, sizeof conf,
             "worker_processes 1;\ndaemon off;\npid %s/nginx.pid;\nerror_log stderr;\n"
             "events { worker_connections 4096; }\n"
             "http {\n  access_log off;\n  keepalive_requests 100000000;\n"
             "  server {\n    listen 127.0.0.1:%d;\n"
             "    location / { return 200 \"Hello, World!\"; }\n"
             "    location = /static-10k { default_type text/plain; alias %s/body-10k; }\n"
             "    location = /handler-10k { default_type text/plain; alias %s/body-10k; }\n"
             "  }\n}\n",
             tmpdir, t->port, tmpdir, tmpdir);
    /* nginx takes no 10 KiB literal in `return`: it serves the same bytes from a file, which
     * its worker (user nobody) must be able to read. */
    if (chmod(tmpdir, 0755) != 0)
        die("chmod %s: %s", tmpdir, strerror(errno));
    snprintf(path, sizeof path, "%s/body-10k", tmpdir);
    f = fopen(path, "w");
    if (f == NULL || fwrite(body_10k, 1, sizeof body_10k, f) != sizeof body_10k || fclose(f) != 0)
        die("%s: %s", path, strerror(errno));
    snprintf(path, sizeof path, "%s/nginx.conf", tmpdir);
    f = fopen(path, "w");
    if (f == NULL || fputs(conf, f) < 0 || fclose(f) != 0)
        die("%s: %s", path, strerror(errno));
    t->pid = spawn(argv, opt.server_cpu, -1);
    for (int i = 0; i < 100; i++) {
        struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)t->port)};
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, (struct sockaddr *)&sin, sizeof sin) == 0) {
            close(fd);
            return;
        }
        close(fd);
        usleep(20000);
    }
    die("nginx did not start");
}

static void stop_target(struct target *t)
{
    int status;
    if (t->pid <= 0)
        return;
    kill(t->pid, strcmp(t->name, "nginx") == 0 ? SIGQUIT : SIGTERM);
    waitpid(t->pid, &status, 0);
    t->pid = 0;
}

/* utime + stime of a process and its children (nginx's workers), in clock ticks. */
static long long cpu_ticks(pid_t pid)
{
    char path[128], buf[4096];
    long long total = 0;
    FILE *f;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    if (f != NULL) {
        if (fgets(buf, sizeof buf, f) != NULL) {
            char *p = strrchr(buf, ')');
            unsigned long long ut = 0, st = 0;
            /* Fields after the name: state is field 3; utime and stime are 14 and 15. */
            if (p != NULL && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
                                    &ut, &st) == 2)
                total += (long long)(ut + st);
        }
        fclose(f);
    }
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
    f = fopen(path, "r");
    if (f != NULL) {
        int child;
        while (fscanf(f, "%d", &child) == 1)
            total += cpu_ticks(child);
        fclose(f);
    }
    return total;
}

static double to_ms(double v, const char *unit)
{
    if (strcmp(unit, "us") == 0)
        return v / 1000;
    if (strcmp(unit, "s") == 0)
        return v * 1000;
    return v;
}

/* Runs wrk; fills `s` (latency and counts) when `s` is not NULL. */
static void run_wrk(const struct target *t, int conns, int depth, int seconds, struct sample *s)
{
    char c[16], d[16], url[64], dep[16], script[300];
    char *argv[16];
    int n = 0, p[2];
    char line[512];
    FILE *f;
    int status;
    snprintf(c, sizeof c, "-c%d", conns);
    snprintf(d, sizeof d, "-d%ds", seconds);
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", t->port, opt.path);
    snprintf(dep, sizeof dep, "%d", depth);
    snprintf(script, sizeof script, "%s/pipeline.lua", tmpdir);
    argv[n++] = "wrk";
    argv[n++] = "-t1";
    argv[n++] = c;
    argv[n++] = d;
    argv[n++] = "--latency";
    if (depth > 1) {
        argv[n++] = "-s";
        argv[n++] = script;
    }
    argv[n++] = url;
    if (depth > 1) {
        argv[n++] = "--";
        argv[n++] = dep;
    }
    argv[n] = NULL;
    if (pipe(p) < 0)
        die("pipe: %s", strerror(errno));
    pid_t pid = spawn(argv, opt.client_cpu, p[1]);
    close(p[1]);
    f = fdopen(p[0], "r");
    if (s != NULL)
        memset(s, 0, sizeof *s);
    while (fgets(line, sizeof line, f) != NULL) {
        double v;
        char unit[8];
        long a, b, cc, dd;
        if (s == NULL)
            continue;
        if (sscanf(line, " 50%% %lf%7s", &v, unit) == 2)
            s->p50_ms = to_ms(v, unit);
        else if (sscanf(line, " 99%% %lf%7s", &v, unit) == 2)
            s->p99_ms = to_ms(v, unit);
        else if (sscanf(line, " %ld requests in", &a) == 1)
            s->requests = a;
        else if (sscanf(line, "Requests/sec: %lf", &v) == 1)
            s->rps = v;
        else if (sscanf(line, " Socket errors: connect %ld, read %ld, write %ld, timeout %ld", &a,
                        &b, &cc, &dd) == 4)
            s->errors += a + b + cc + dd;
        else if (sscanf(line, " Non-2xx or 3xx responses: %ld", &a) == 1)
            s->errors += a;
    }
    fclose(f);
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        die("wrk failed against %s", t->name);
}

/* ---------------------------------------------------------------------------------------- */
/* The open-loop client (--open-loop): wrk sends a connection's next request when the answer
 * to the previous one has come, so a server that waits to gather requests slows its own load
 * down. Here each connection sends `GET /` every `period` µs from a random start, whatever the
 * answers do (a request due while the previous one is unanswered is skipped and counted), and
 * the latency of every request is kept. */

#define OL_REQUEST "GET / HTTP/1.1\r\nHost: bench\r\n\r\n"

struct ol_conn {
    int fd;
    int busy;         /* a request is unanswered */
    uint64_t next_ns; /* when the next request is due */
    uint64_t sent_ns; /* when the unanswered one went */
    char buf[512];    /* the answer so far */
    size_t len;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The length of the whole answer at the start of `buf`, or 0 while it is incomplete. */
static size_t ol_answer_len(const char *buf, size_t len)
{
    const char *end = memmem(buf, len, "\r\n\r\n", 4);
    const char *cl;
    size_t head, body;
    if (end == NULL)
        return 0;
    head = (size_t)(end - buf) + 4;
    cl = memmem(buf, head, "Content-Length: ", 16);
    body = cl != NULL ? strtoul(cl + 16, NULL, 10) : 0;
    return len >= head + body ? head + body : 0;
}

/* Reads what arrived on `c`; returns -1 on an error or an answer nobody asked for. */
static int ol_read(struct ol_conn *c, uint64_t *lat, size_t *nlat, size_t cap)
{
    for (;;) {
        size_t n;
        ssize_t r = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len, MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EINTR))
            return 0;
        if (r <= 0)
            return -1;
        c->len += (size_t)r;
        while ((n = ol_answer_len(c->buf, c->len)) > 0) {
            if (!c->busy || strncmp(c->buf, "HTTP/1.1 200", 12) != 0)
                return -1;
            c->busy = 0;
            if (*nlat < cap)
                lat[(*nlat)++] = now_ns() - c->sent_ns;
            memmove(c->buf, c->buf + n, c->len - n);
            c->len -= n;
        }
        if (c->len == sizeof c->buf)
            return -1;
    }
}

/* Runs the open-loop client for `seconds` (results in `s`, NULL: a warm-up). Pinned, in a
 * child process, so that it has the client CPU to itself as wrk would. */
static void ol_client(int port, int conns, int seconds, struct sample *s)
{
    struct ol_conn *cs = calloc((size_t)conns, sizeof *cs);
    size_t cap = (size_t)conns * (size_t)seconds * (1000000u / (size_t)opt.open_loop_us + 1) + 1;
    uint64_t *lat = malloc(cap * sizeof *lat);
    uint64_t period = (uint64_t)opt.open_loop_us * 1000, start, end;
    size_t nlat = 0;
    long skipped = 0, errors = 0;
    int ep = epoll_create1(0);
    if (cs == NULL || lat == NULL || ep < 0)
        die("open loop: out of memory");
    srand48((long)getpid());
    start = now_ns();
    for (int i = 0; i < conns; i++) {
        struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        int one = 1;
        sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        cs[i].fd = socket(AF_INET, SOCK_STREAM, 0);
        if (cs[i].fd < 0 || connect(cs[i].fd, (struct sockaddr *)&sin, sizeof sin) < 0)
            die("open loop: connect: %s", strerror(errno));
        setsockopt(cs[i].fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (epoll_ctl(ep, EPOLL_CTL_ADD, cs[i].fd, &ev) < 0)
            die("open loop: epoll_ctl: %s", strerror(errno));
        cs[i].next_ns = start + (uint64_t)(drand48() * (double)period);
    }
    end = start + (uint64_t)seconds * 1000000000u;
    for (uint64_t t = now_ns(); t < end; t = now_ns()) {
        struct epoll_event evs[256];
        uint64_t soonest = t + 1000000;
        int k;
        for (int i = 0; i < conns; i++) {
            struct ol_conn *c = &cs[i];
            if (c->next_ns <= t) {
                if (c->busy) {
                    skipped++;
                } else if (send(c->fd, OL_REQUEST, sizeof OL_REQUEST - 1, MSG_NOSIGNAL) ==
                           (ssize_t)(sizeof OL_REQUEST - 1)) {
                    c->busy = 1;
                    c->sent_ns = t;
                } else {
                    errors++;
                }
                c->next_ns += period;
            }
            if (c->next_ns < soonest)
                soonest = c->next_ns;
        }
        k = epoll_wait(ep, evs, 256, soonest > t ? (int)((soonest - t) / 1000000) : 0);
        for (int j = 0; j < k; j++)
            if (ol_read(&cs[evs[j].data.u32], lat, &nlat, cap) < 0)
                die("open loop: connection %u: a bad or missing answer", evs[j].data.u32);
    }
    for (int i = 0; i < conns; i++)
        close(cs[i].fd);
    close(ep);
    if (s != NULL) {
        qsort(lat, nlat, sizeof *lat, cmp_u64);
        s->requests = (long)nlat;
        s->rps = (double)nlat / seconds;
        s->p50_ms = nlat ? (double)lat[nlat / 2] / 1e6 : 0;
        s->p99_ms = nlat ? (double)lat[nlat * 99 / 100] / 1e6 : 0;
        s->errors = errors;
        if (skipped > 0)
            fprintf(stderr, "open loop: %ld requests skipped (the previous one unanswered)\n",
                    skipped);
    }
    free(cs);
    free(lat);
}

/* ol_client in a child pinned to the client CPU; the sample comes back through a pipe. */
static void run_open_loop(const struct target *t, int conns, int seconds, struct sample *s)
{
    struct sample got;
    int p[2], status;
    pid_t pid;
    if (pipe(p) < 0)
        die("pipe: %s", strerror(errno));
    pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        close(p[0]);
        pin(opt.client_cpu);
        memset(&got, 0, sizeof got);
        ol_client(t->port, conns, seconds, &got);
        _exit(write(p[1], &got, sizeof got) == (ssize_t)sizeof got ? 0 : 1);
    }
    close(p[1]);
    if (read(p[0], &got, sizeof got) != (ssize_t)sizeof got)
        memset(&got, 0, sizeof got);
    close(p[0]);
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        die("the open-loop client failed against %s", t->name);
    if (s != NULL)
        *s = got;
}

static void measure(const struct target *t, int conns, int depth, struct sample *s)
{
    long long t0, t1;
    long hz = sysconf(_SC_CLK_TCK);
    if (opt.open_loop_us > 0) {
        if (opt.warmup > 0)
            run_open_loop(t, conns, opt.warmup, NULL);
        t0 = cpu_ticks(t->pid);
        run_open_loop(t, conns, opt.duration, s);
    } else {
        if (opt.warmup > 0)
            run_wrk(t, conns, depth, opt.warmup, NULL);
        t0 = cpu_ticks(t->pid);
        run_wrk(t, conns, depth, opt.duration, s);
    }
    t1 = cpu_ticks(t->pid);
    s->cpu_per_100k =
        s->requests > 0 ? (double)(t1 - t0) / (double)hz / (double)s->requests * 1e5 : 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of the non-zero values (0 when there are none): wrk 4.1 sometimes prints its
 * 99th percentile as "0.00us" under heavy pipelining, which means "not measured". */
static double median(double *v, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        if (v[i] > 0)
            v[k++] = v[i];
    if (k == 0)
        return 0;
    qsort(v, (size_t)k, sizeof *v, cmp_double);
    return k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
}

/*
 * The median over rounds of target i's figure divided by the peer's in the same round (0:
 * req/s, 1: CPU per request). Each round measures the targets one after the other, seconds
 * apart, so a shared machine whose speed drifts over minutes moves both sides of a ratio
 * together; a ratio of medians taken from different rounds would not cancel it.
 */
static double paired_ratio(struct sample (*samples)[MAX_LIST][MAX_LIST][MAX_ROUNDS], int i,
                           int peer, int d, int c, int cpu)
{
    double v[MAX_ROUNDS];
    int n = 0;
    for (int r = 0; r < opt.rounds; r++) {
        const struct sample *a = &samples[i][d][c][r], *b = &samples[peer][d][c][r];
        double x = cpu ? a->cpu_per_100k : a->rps, y = cpu ? b->cpu_per_100k : b->rps;
        if (x > 0 && y > 0)
            v[n++] = x / y;
    }
    return median(v, n);
}

/* A latency for the table: "n/a" when wrk did not report it. */
static const char *ms(double v, char *buf, size_t cap)
{
    if (v <= 0)
        return "n/a";
    snprintf(buf, cap, "%.3f", v);
    return buf;
}

/* ---------------------------------------------------------------------------------------- */
/* strace: system calls per request */

struct syscalls {
    char target[32];
    long requests;
    long epoll_ctl, epoll_wait, io_uring_enter, reads, sends;
};

static void strace_count(const char *name, struct syscalls *out)
{
    char file[512];
    char *wrap[] = {"strace", "-f", "-c", "-o", file, NULL};
    struct target t;
    struct sample s;
    char line[512];
    FILE *f;
    memset(&t, 0, sizeof t);
    memset(out, 0, sizeof *out);
    snprintf(t.name, sizeof t.name, "%s", name);
    snprintf(out->target, sizeof out->target, "%s", name);
    snprintf(file, sizeof file, "%s/strace-%s.txt", tmpdir, name);
    start_ours(&t, wrap, 5);
    run_wrk(&t, 64, 1, opt.quick ? 1 : 3, &s);
    /* strace ignores SIGTERM while it traces: stop the server, then strace ends with it. */
    {
        char path[128];
        int child = 0, status;
        snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)t.pid, (int)t.pid);
        f = fopen(path, "r");
        if (f != NULL) {
            if (fscanf(f, "%d", &child) != 1)
                child = 0;
            fclose(f);
        }
        kill(child > 0 ? child : t.pid, SIGTERM);
        waitpid(t.pid, &status, 0);
    }
    out->requests = s.requests;
    f = fopen(file, "r");
    if (f == NULL)
        return;
    while (fgets(line, sizeof line, f) != NULL) {
        double pct, secs;
        long usecs, calls;
        char sc[64];
        if (sscanf(line, " %lf %lf %ld %ld %*s %63s", &pct, &secs, &usecs, &calls, sc) != 5 &&
            sscanf(line, " %lf %lf %ld %ld %63s", &pct, &secs, &usecs, &calls, sc) != 5)
            continue;
        if (strcmp(sc, "epoll_ctl") == 0)
            out->epoll_ctl = calls;
        else if (strcmp(sc, "epoll_wait") == 0)
            out->epoll_wait = calls;
        else if (strcmp(sc, "io_uring_enter") == 0)
            out->io_uring_enter = calls;
        /* recv() is recvfrom and send() sendto under strace; count every way in and out. */
        else if (strcmp(sc, "read") == 0 || strcmp(sc, "recvfrom") == 0 ||
                 strcmp(sc, "recvmsg") == 0 || strcmp(sc, "readv") == 0)
            out->reads += calls;
        else if (strcmp(sc, "sendmsg") == 0 || strcmp(sc, "sendto") == 0 ||
                 strcmp(sc, "write") == 0 || strcmp(sc, "writev") == 0)
            out->sends += calls;
    }
    fclose(f);
}

/* ---------------------------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr, "usage: shmipc-bench-http [--quick] [--rounds N] [--duration S] [--warmup S]\n"
                    "         [--conns 64,256,512] [--depths 1,16] "
                    "[--targets io_uring,io_uring-nobatch,epoll,epoll-oneshot,nginx]\n"
                    "         [--server-cpu 0] [--client-cpu 1] [--no-strace] [--json F] [--md F]\n"
                    "         [--open-loop PERIOD_US] [--path /|/static-10k|/handler-10k]\n"
                    "       shmipc-bench-http serve BACKEND\n");
    exit(2);
}

int main(int argc, char **argv)
{
    static struct sample samples[MAX_TARGETS][MAX_LIST][MAX_LIST][MAX_ROUNDS];
    struct target targets[MAX_TARGETS];
    struct syscalls sys[3];
    int nsys = 0;
    struct utsname un;
    char cpu_model[256] = "unknown", line[512];
    FILE *f, *json = NULL, *md = NULL;
    time_t started = time(NULL);
    double load_start = loadavg(), load_end;

    if (argc == 3 && strcmp(argv[1], "serve") == 0)
        return serve(argv[2]);
    opt.rounds = 3;
    opt.duration = 5;
    opt.warmup = 2;
    opt.nconns = parse_list("64,256,512", opt.conns);
    opt.ndepths = parse_list("1,16", opt.depths);
    opt.server_cpu = 0;
    opt.client_cpu = 1;
    opt.strace = 1;
    opt.json = "bench-http.json";
    opt.path = "/";
    opt.md = "bench-http.md";
    {
        const char *def[] = {"io_uring", "nginx", "epoll", "epoll-oneshot"};
        for (int i = 0; i < 4; i++)
            snprintf(opt.targets[opt.ntargets++], 32, "%s", def[i]);
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quick") == 0) {
            opt.quick = 1;
            opt.rounds = 1;
            opt.duration = 1;
            opt.warmup = 0;
            opt.nconns = parse_list("64", opt.conns);
        } else if (strcmp(a, "--no-strace") == 0) {
            opt.strace = 0;
        } else if (v == NULL) {
            usage();
        } else if (strcmp(a, "--rounds") == 0) {
            opt.rounds = atoi(v), i++;
        } else if (strcmp(a, "--duration") == 0) {
            opt.duration = atoi(v), i++;
        } else if (strcmp(a, "--warmup") == 0) {
            opt.warmup = atoi(v), i++;
        } else if (strcmp(a, "--conns") == 0) {
            opt.nconns = parse_list(v, opt.conns), i++;
        } else if (strcmp(a, "--depths") == 0) {
            opt.ndepths = parse_list(v, opt.depths), i++;
        } else if (strcmp(a, "--server-cpu") == 0) {
            opt.server_cpu = atoi(v), i++;
        } else if (strcmp(a, "--client-cpu") == 0) {
            opt.client_cpu = atoi(v), i++;
        } else if (strcmp(a, "--json") == 0) {
            opt.json = v, i++;
        } else if (strcmp(a, "--md") == 0) {
            opt.md = v, i++;
        } else if (strcmp(a, "--path") == 0) {
            opt.path = v, i++;
        } else if (strcmp(a, "--open-loop") == 0) {
            opt.open_loop_us = atoi(v), i++;
        } else if (strcmp(a, "--targets") == 0) {
            char buf[256], *save = NULL;
            snprintf(buf, sizeof buf, "%s", v);
            opt.ntargets = 0;
            for (char *tok = strtok_r(buf, ",", &save); tok && opt.ntargets < MAX_TARGETS;
                 tok = strtok_r(NULL, ",", &save))
                snprintf(opt.targets[opt.ntargets++], 32, "%s", tok);
            i++;
        } else {
            usage();
        }
    }
    if (opt.rounds < 1 || opt.rounds > MAX_ROUNDS || opt.duration < 1 || opt.nconns < 1 ||
        opt.ndepths < 1 || opt.ntargets < 1 || opt.open_loop_us < 0 ||
        (opt.open_loop_us > 0 && (opt.open_loop_us < 100 || opt.open_loop_us > 10000000)) ||
        (strcmp(opt.path, "/") != 0 && strcmp(opt.path, "/static-10k") != 0 &&
         strcmp(opt.path, "/handler-10k") != 0) ||
        (opt.open_loop_us > 0 && strcmp(opt.path, "/") != 0))
        usage();
    fill_body_10k();
    if (opt.open_loop_us > 0) {
        /* The open-loop client sends one request at a time per connection, with its own
         * clock: no pipelining, no wrk, no strace run (that one drives wrk). */
        opt.ndepths = parse_list("1", opt.depths);
        opt.strace = 0;
    }
    if (readlink("/proc/self/exe", self_exe, sizeof self_exe - 1) < 0)
        die("readlink /proc/self/exe: %s", strerror(errno));
    if (opt.open_loop_us == 0 && !have("wrk"))
        die("wrk not found (Debian: apt-get install wrk)");
    for (int i = 0; i < opt.ntargets; i++)
        if (strcmp(opt.targets[i], "nginx") == 0 && !have("nginx"))
            die("nginx not found (Debian: apt-get install nginx-light), or leave it out with "
                "--targets");
    if (opt.strace && !have("strace")) {
        fprintf(stderr, "shmipc-bench-http: strace not found; no syscall table\n");
        opt.strace = 0;
    }
    signal(SIGPIPE, SIG_IGN);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/shmipc-bench-http.XXXXXX");
    if (mkdtemp(tmpdir) == NULL)
        die("mkdtemp: %s", strerror(errno));
    {
        char path[300];
        snprintf(path, sizeof path, "%s/pipeline.lua", tmpdir);
        f = fopen(path, "w");
        if (f == NULL)
            die("%s: %s", path, strerror(errno));
        /* wrk's pipelining script, as TechEmpower's: `depth` requests in one write. */
        fputs("init = function(args)\n"
              "  local depth = tonumber(args[1]) or 16\n"
              "  local r = {}\n"
              "  for i = 1, depth do r[i] = wrk.format(nil) end\n"
              "  req = table.concat(r)\n"
              "end\n"
              "request = function() return req end\n",
              f);
        fclose(f);
    }
    uname(&un);
    f = fopen("/proc/cpuinfo", "r");
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, "model name", 10) == 0) {
            char *p = strchr(line, ':');
            snprintf(cpu_model, sizeof cpu_model, "%.200s", p ? p + 2 : line);
            cpu_model[strcspn(cpu_model, "\n")] = '\0';
            break;
        }
    if (f != NULL)
        fclose(f);
    printf("# shmipc-bench-http: kernel %s, %s, %ld CPUs; servers on CPU %d, wrk -t1 on CPU %d\n"
           "# rounds %d, %d s per run after a %d s warm-up; libshmipc %s; GET %s\n",
           un.release, cpu_model, sysconf(_SC_NPROCESSORS_ONLN), opt.server_cpu, opt.client_cpu,
           opt.rounds, opt.duration, opt.warmup, shmipc_version_string(), opt.path);

    memset(targets, 0, sizeof targets);
    for (int i = 0; i < opt.ntargets; i++) {
        snprintf(targets[i].name, sizeof targets[i].name, "%s", opt.targets[i]);
        if (strcmp(targets[i].name, "nginx") == 0)
            start_nginx(&targets[i]);
        else if (backend_value(targets[i].name) >= 0)
            start_ours(&targets[i], NULL, 0);
        else
            die("unknown target %s", targets[i].name);
    }

    for (int r = 0; r < opt.rounds; r++)
        for (int d = 0; d < opt.ndepths; d++)
            for (int c = 0; c < opt.nconns; c++)
                for (int i = 0; i < opt.ntargets; i++) {
                    struct sample *s = &samples[i][d][c][r];
                    measure(&targets[i], opt.conns[c], opt.depths[d], s);
                    printf("round %d  %-14s c=%-4d depth=%-2d  %10.0f req/s  p50 %7.3f ms  p99 "
                           "%7.3f ms  %6.3f CPU s/100k%s\n",
                           r + 1, targets[i].name, opt.conns[c], opt.depths[d], s->rps, s->p50_ms,
                           s->p99_ms, s->cpu_per_100k, s->errors ? "  ERRORS" : "");
                    fflush(stdout);
                }
    load_end = loadavg();
    for (int i = 0; i < opt.ntargets; i++)
        stop_target(&targets[i]);
    if (opt.strace) {
        const char *names[] = {"epoll", "epoll-oneshot", "io_uring"};
        for (int i = 0; i < 3; i++)
            strace_count(names[i], &sys[nsys++]);
    }

    json = fopen(opt.json, "w");
    md = fopen(opt.md, "w");
    if (json == NULL || md == NULL)
        die("cannot write %s / %s", opt.json, opt.md);
    fprintf(json,
            "{\n  \"bench\": \"http\",\n  \"kernel\": \"%s\",\n  \"cpu\": \"%s\",\n  \"cpus\": "
            "%ld,\n  \"server_cpu\": %d,\n  \"client_cpu\": %d,\n  \"rounds\": %d,\n  "
            "\"duration_s\": %d,\n  \"warmup_s\": %d,\n  \"open_loop_period_us\": %d,\n  "
            "\"started\": %lld,\n  \"loadavg\": [%.2f, %.2f],\n  \"path\": \"%s\",\n  "
            "\"results\": [\n",
            un.release, cpu_model, sysconf(_SC_NPROCESSORS_ONLN), opt.server_cpu, opt.client_cpu,
            opt.rounds, opt.duration, opt.warmup, opt.open_loop_us, (long long)started, load_start,
            load_end, opt.path);
    if (strcmp(opt.path, "/") != 0)
        fprintf(md, "wrk asks for `%s` (a 10 KiB body).\n\n", opt.path);
    if (opt.open_loop_us > 0)
        fprintf(md,
                "Open loop: each connection sends `GET /` every %d µs from a random start, "
                "whatever the answers do (the client is this program, not wrk); req/s is the "
                "rate answered, p50/p99 the latency of every request.\n\n",
                opt.open_loop_us);
    fprintf(
        md,
        "Kernel %s, %s, %ld CPUs; servers (one worker each) pinned to CPU %d, the client "
        "(`wrk -t1`) to "
        "CPU %d. Medians of %d interleaved round(s), %d s each after a %d s warm-up. CPU = "
        "server CPU seconds (utime+stime) per 100k requests. Ratios are ours / nginx in the same "
        "round, median over rounds. Load "
        "average %.2f at the start, %.2f at the end (other work on the machine).\n\n"
        "| conns | depth | server | req/s | p50 ms | p99 ms | CPU s/100k | req/s vs nginx | "
        "CPU vs nginx | errors |\n|---|---|---|---|---|---|---|---|---|---|\n",
        un.release, cpu_model, sysconf(_SC_NPROCESSORS_ONLN), opt.server_cpu, opt.client_cpu,
        opt.rounds, opt.duration, opt.warmup, load_start, load_end);
    int nginx = -1, first = 1;
    /* The bar, per target: met at every level (1), missed somewhere (0). */
    int bar_rps[MAX_TARGETS], bar_cpu[MAX_TARGETS];
    for (int i = 0; i < MAX_TARGETS; i++)
        bar_rps[i] = bar_cpu[i] = 1;
    for (int i = 0; i < opt.ntargets; i++)
        if (strcmp(targets[i].name, "nginx") == 0)
            nginx = i;
    for (int d = 0; d < opt.ndepths; d++)
        for (int c = 0; c < opt.nconns; c++) {
            double med[MAX_TARGETS][4];
            long errors[MAX_TARGETS] = {0};
            for (int i = 0; i < opt.ntargets; i++) {
                double v[4][MAX_ROUNDS];
                for (int r = 0; r < opt.rounds; r++) {
                    const struct sample *s = &samples[i][d][c][r];
                    v[0][r] = s->rps;
                    v[1][r] = s->p50_ms;
                    v[2][r] = s->p99_ms;
                    v[3][r] = s->cpu_per_100k;
                    errors[i] += s->errors;
                }
                for (int k = 0; k < 4; k++)
                    med[i][k] = median(v[k], opt.rounds);
            }
            for (int i = 0; i < opt.ntargets; i++) {
                double rr = 0, cr = 0;
                if (nginx >= 0 && i != nginx) {
                    rr = paired_ratio(samples, i, nginx, d, c, 0);
                    cr = paired_ratio(samples, i, nginx, d, c, 1);
                }
                fprintf(json,
                        "%s    {\"server\": \"%s\", \"conns\": %d, \"depth\": %d, \"rps\": %.0f, "
                        "\"p50_ms\": %.3f, \"p99_ms\": %.3f, \"cpu_s_per_100k\": %.4f, "
                        "\"errors\": %ld}",
                        first ? "" : ",\n", targets[i].name, opt.conns[c], opt.depths[d], med[i][0],
                        med[i][1], med[i][2], med[i][3], errors[i]);
                first = 0;
                char b50[32], b99[32];
                if (nginx >= 0 && i != nginx)
                    fprintf(md, "| %d | %d | %s | %.0f | %s | %s | %.3f | %.2fx | %.2fx | %ld |\n",
                            opt.conns[c], opt.depths[d], targets[i].name, med[i][0],
                            ms(med[i][1], b50, sizeof b50), ms(med[i][2], b99, sizeof b99),
                            med[i][3], rr, cr, errors[i]);
                else
                    fprintf(md, "| %d | %d | %s | %.0f | %s | %s | %.3f | | | %ld |\n",
                            opt.conns[c], opt.depths[d], targets[i].name, med[i][0],
                            ms(med[i][1], b50, sizeof b50), ms(med[i][2], b99, sizeof b99),
                            med[i][3], errors[i]);
                if (rr < 1.0)
                    bar_rps[i] = 0;
                if (cr > 0.7)
                    bar_cpu[i] = 0;
            }
        }
    fprintf(json, "\n  ],\n  \"syscalls\": [\n");
    if (nsys > 0)
        fprintf(md,
                "\nSystem calls of the server per request (`strace -f -c`, wrk -c64 "
                "keep-alive, set-up and teardown included):\n\n"
                "| server | requests | epoll_ctl | epoll_wait | io_uring_enter | reads | sends | "
                "epoll_ctl per request |\n|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < nsys; i++) {
        const struct syscalls *y = &sys[i];
        double per = y->requests ? (double)y->epoll_ctl / (double)y->requests : 0;
        fprintf(json,
                "%s    {\"server\": \"%s\", \"requests\": %ld, \"epoll_ctl\": %ld, "
                "\"epoll_wait\": %ld, \"io_uring_enter\": %ld, \"reads\": %ld, \"sends\": %ld}",
                i ? ",\n" : "", y->target, y->requests, y->epoll_ctl, y->epoll_wait,
                y->io_uring_enter, y->reads, y->sends);
        fprintf(md, "| %s | %ld | %ld | %ld | %ld | %ld | %ld | %.4f |\n", y->target, y->requests,
                y->epoll_ctl, y->epoll_wait, y->io_uring_enter, y->reads, y->sends, per);
    }
    /* The bar is about the backends we ship (io_uring, the default where the kernel allows
     * it, and persistent epoll), one line each; not the one-shot mode or the comparison runs. */
    fprintf(json, "\n  ],\n  \"bar\": {");
    first = 1;
    for (int i = 0; i < opt.ntargets && nginx >= 0 && opt.open_loop_us == 0; i++) {
        if (strcmp(targets[i].name, "io_uring") != 0 && strcmp(targets[i].name, "epoll") != 0)
            continue;
        fprintf(json, "%s\"%s\": {\"rps_at_least_nginx\": %s, \"cpu_at_most_0_7\": %s}",
                first ? "" : ", ", targets[i].name, bar_rps[i] ? "true" : "false",
                bar_cpu[i] ? "true" : "false");
        fprintf(md,
                "%s%s against nginx at every level: req/s >= nginx: **%s**; CPU per request "
                "<= 0.7x nginx: **%s**.\n",
                first ? "\nBar. " : "", targets[i].name, bar_rps[i] ? "met" : "not met",
                bar_cpu[i] ? "met" : "not met");
        first = 0;
    }
    fprintf(json, "}\n}\n");
    fclose(json);
    fclose(md);
    printf("\n");
    f = fopen(opt.md, "r");
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        fputs(line, stdout);
    if (f != NULL)
        fclose(f);
    {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
        if (system(cmd) != 0)
            fprintf(stderr, "shmipc-bench-http: could not remove %s\n", tmpdir);
    }
    printf("\nwrote %s and %s in %lld s\n", opt.json, opt.md, (long long)(time(NULL) - started));
    return 0;
}
