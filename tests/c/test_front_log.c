/*
 * The front's access log (core/serve/access_log.h, docs/serve.md "The access log"): one line
 * per finished request, whatever its outcome (200, HEAD, 502, 503, 504, 499, 414), the exact
 * line of each; JSON escaping of hostile targets and user agents; many concurrent requests
 * over 2 reactor threads giving one whole line each, none torn; reopen after a rename; a log
 * that cannot be written (/dev/full) counted, serving going on. Both reactor backends.
 *
 * The application workers are threads of this process speaking the protocol (docs/serve.md),
 * all joined before a case ends (no thread outlives the case's state, which is static).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "shmipc.h"
#include "shmipc_serve.h"
#include "serve/access_log.h"
#include "serve/front.h"

#include "front_harness.h"

/* ---- an application worker: "/die..." ends its session, "/hang..." waits for the ABORT,
 * anything else is a 200 whose body is the target ---- */

#define MAX_SESS 16

struct logw {
    char addr[96];
    shmipc_listener *l;
    pthread_t acceptor;
    atomic_int stop;
    atomic_int requests;
    atomic_int go_die; /* "/bigdie": the client has some of the body, the worker may die */
    pthread_mutex_t mu;
    shmipc_session *sess[MAX_SESS];
    pthread_t sthreads[MAX_SESS];
    int nsess;
};

struct logsarg {
    struct logw *w;
    shmipc_session *s;
};

/* "/big/<n>": a 200 of n bytes ('x', Content-Length) in 64 KiB BODY frames, each flushed (the
 * front streams it); "/bigdie/<n>": no length, and the worker's session ends at half the body,
 * once the client got some of it (go_die; up to 10 s). */
static void stream_big(struct logw *w, shmipc_stream *st, shmipc_session *s, uint64_t total,
                       int dies)
{
    const size_t frame = 65536;
    uint8_t head[256], h[12];
    uint8_t *buf = malloc(frame);
    shmipc_serve_response r = {.size = sizeof r, .status = 200};
    memset(buf, 'x', frame);
    if (!dies) {
        r.flags = SHMIPC_SERVE_RESP_CONTENT_LENGTH;
        r.content_length = total;
    }
    int64_t hn = shmipc_serve_encode_response_head(head, sizeof head, &r, NULL, 0);
    shmipc_stream_set_timeout(st, SHMIPC_TIMEOUT_WRITE, 30000);
    if (hn <= 0 || shmipc_stream_write(st, head, (size_t)hn) < 0 || shmipc_stream_flush(st) < 0)
        goto out;
    for (uint64_t off = 0; off < total;) {
        if (dies && off >= total / 2) {
            uint64_t end = mono_ms() + 10000;
            while (!atomic_load(&w->go_die) && mono_ms() < end)
                sleep_ms(1);
            shmipc_session_shutdown(s);
            goto out;
        }
        size_t n = total - off < frame ? (size_t)(total - off) : frame;
        shmipc_serve_encode_header(h, 12, SHMIPC_SERVE_BODY, n, 0);
        if (shmipc_stream_write(st, h, 12) < 0 || shmipc_stream_write(st, buf, n) < 0 ||
            shmipc_stream_flush(st) < 0)
            goto out;
        off += n;
    }
    shmipc_serve_encode_header(h, 12, SHMIPC_SERVE_END, 0, 0);
    shmipc_stream_write(st, h, 12);
    shmipc_stream_flush(st);
out:
    free(buf);
}

static void serve_stream(struct logw *w, shmipc_stream *st, shmipc_session *s)
{
    uint8_t *buf = NULL, head[256], h[12];
    size_t n;
    char *target = NULL;
    size_t tlen;
    shmipc_serve_frame f;
    shmipc_stream_set_timeout(st, SHMIPC_TIMEOUT_READ, 5000);
    if (read_frame(st, &buf, &n, &f) < 0 || f.type != SHMIPC_SERVE_REQUEST_HEAD)
        goto out;
    shmipc_serve_request rq = {.size = sizeof rq};
    assert_true(shmipc_serve_decode_request(buf, n, &rq) > 0);
    int is_head = rq.method_len == 4 && memcmp(rq.method, "HEAD", 4) == 0;
    tlen = rq.target_len;
    target = malloc(tlen + 1);
    memcpy(target, rq.target, tlen);
    target[tlen] = '\0';
    free(buf);
    buf = NULL;
    for (;;) { /* the body (dropped), then END */
        if (read_frame(st, &buf, &n, &f) < 0)
            goto out;
        free(buf);
        buf = NULL;
        if (f.type == SHMIPC_SERVE_END)
            break;
    }
    atomic_fetch_add(&w->requests, 1);
    unsigned long long big = 0;
    if (sscanf(target, "/big/%llu", &big) == 1 || sscanf(target, "/bigdie/%llu", &big) == 1) {
        stream_big(w, st, s, big, target[4] == 'd');
        goto out;
    }
    if (tlen >= 4 && memcmp(target, "/die", 4) == 0) {
        shmipc_session_shutdown(s);
        goto out;
    }
    if (tlen >= 5 && memcmp(target, "/hang", 5) == 0) {
        while (read_frame(st, &buf, &n, &f) == 0) { /* until the ABORT or the end */
            free(buf);
            buf = NULL;
            if (f.type == SHMIPC_SERVE_ABORT)
                break;
        }
        goto out;
    }
    shmipc_serve_response r = {.size = sizeof r, .status = 200};
    r.flags = SHMIPC_SERVE_RESP_CONTENT_LENGTH;
    r.content_length = tlen;
    int64_t hn = shmipc_serve_encode_response_head(head, sizeof head, &r, NULL, 0);
    assert_true(hn > 0);
    shmipc_stream_write(st, head, (size_t)hn);
    if (!is_head) {
        shmipc_serve_encode_header(h, 12, SHMIPC_SERVE_BODY, tlen, 0);
        shmipc_stream_write(st, h, 12);
        shmipc_stream_write(st, target, tlen);
    }
    shmipc_serve_encode_header(h, 12, SHMIPC_SERVE_END, 0, 0);
    shmipc_stream_write(st, h, 12);
    shmipc_stream_flush(st);
out:
    free(buf);
    free(target);
    shmipc_stream_close(st);
}

static void *session_main(void *arg)
{
    struct logsarg *a = arg;
    while (!atomic_load(&a->w->stop)) {
        shmipc_stream *st;
        int rc = shmipc_session_accept_stream(a->s, 50, &st);
        if (rc == SHMIPC_ETIMEDOUT || rc == SHMIPC_EAGAIN)
            continue;
        if (rc < 0)
            break;
        serve_stream(a->w, st, a->s);
    }
    free(a);
    return NULL;
}

static void *acceptor_main(void *arg)
{
    struct logw *w = arg;
    while (!atomic_load(&w->stop)) {
        shmipc_session *s;
        if (shmipc_listener_accept(w->l, 50, &s) < 0)
            continue;
        pthread_mutex_lock(&w->mu);
        if (w->nsess == MAX_SESS) {
            pthread_mutex_unlock(&w->mu);
            shmipc_session_close(s);
            continue;
        }
        struct logsarg *a = malloc(sizeof *a);
        a->w = w;
        a->s = s;
        w->sess[w->nsess] = s;
        pthread_create(&w->sthreads[w->nsess], NULL, session_main, a);
        w->nsess++;
        pthread_mutex_unlock(&w->mu);
    }
    return NULL;
}

static int logw_seq;

static void logw_start(struct logw *w)
{
    memset(w, 0, sizeof *w);
    snprintf(w->addr, sizeof w->addr, "unix:@shmipc-front-log-%d-%d", (int)getpid(), logw_seq++);
    pthread_mutex_init(&w->mu, NULL);
    listener_patient(w->addr, &w->l);
    pthread_create(&w->acceptor, NULL, acceptor_main, w);
}

static void logw_stop(struct logw *w)
{
    atomic_store(&w->stop, 1);
    pthread_join(w->acceptor, NULL);
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < w->nsess; i++)
        shmipc_session_shutdown(w->sess[i]);
    pthread_mutex_unlock(&w->mu);
    for (int i = 0; i < w->nsess; i++) {
        pthread_join(w->sthreads[i], NULL);
        shmipc_session_close(w->sess[i]);
    }
    shmipc_listener_close(w->l);
    pthread_mutex_destroy(&w->mu);
}

/* ---- the front with its log ---- */

struct lfx {
    shmipc_server *srv;
    struct shmipc__front *f;
    struct shmipc__access_log *log;
    char path[128];
    int port;
};

static void lfx_start(struct lfx *x, struct logw **ws, unsigned n, unsigned threads, int format,
                      const char *path, const struct shmipc__front_opts *o)
{
    shmipc_server_config *cfg;
    const char *addrs[8];
    struct shmipc__front_opts opts = o ? *o : (struct shmipc__front_opts){0};
    for (unsigned i = 0; i < n; i++)
        addrs[i] = ws[i]->addr;
    if (path != NULL) {
        snprintf(x->path, sizeof x->path, "%s", path);
    } else {
        snprintf(x->path, sizeof x->path, "/tmp/shmipc-front-log-%d-%d.log", (int)getpid(),
                 logw_seq++);
        unlink(x->path);
    }
    CHECK(shmipc__access_log_open(x->path, format, &x->log));
    opts.workers = addrs;
    opts.nworkers = n;
    opts.access_log = x->log;
    if (opts.connect_ms == 0)
        opts.connect_ms = HANDSHAKE_MS;
    CHECK(shmipc__front_new(&opts, &x->f));
    CHECK(shmipc_server_config_new(&cfg));
    CHECK(shmipc_server_config_set_address(cfg, "127.0.0.1"));
    CHECK(shmipc_server_config_set_port(cfg, 0));
    CHECK(shmipc_server_config_set_workers(cfg, threads));
    CHECK(shmipc_server_config_set_backend(cfg, suite_backend));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_STOP, 3000));
    /* Above the protocol's target limit (16384), so that the front's own 414 can be seen. */
    CHECK(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_REQUEST_LINE, 32768));
    CHECK(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_HEAD_BYTES, 1 << 20));
    CHECK(shmipc_server_new(cfg, &x->srv));
    shmipc_server_config_free(cfg);
    CHECK(shmipc__front_attach(x->f, x->srv, "/*"));
    CHECK(shmipc_server_start(x->srv));
    x->port = shmipc_server_port(x->srv);
}

static void lfx_stop(struct lfx *x)
{
    shmipc_server_close(x->srv);
    shmipc__front_free(x->f);
    shmipc__access_log_free(x->log);
}

/* The whole file, NUL-terminated. */
static char *slurp(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) {
        *len = 0;
        return calloc(1, 1);
    }
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    *len = fread(b, 1, (size_t)n, fp);
    b[*len] = '\0';
    fclose(fp);
    return b;
}

static size_t count_lines(const char *b, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += b[i] == '\n';
    return c;
}

/* Waits until the file holds `want` lines (the threads' flush timer writes them within
 * 100 ms), up to 10 s; returns the file. */
static char *wait_lines(const char *path, size_t want, size_t *len)
{
    uint64_t end = mono_ms() + 10000;
    for (;;) {
        char *b = slurp(path, len);
        size_t c = count_lines(b, *len);
        if (c >= want || mono_ms() > end) {
            if (c != want)
                fail_msg("%s: %zu lines, want %zu:\n%.2000s", path, c, want, b);
            return b;
        }
        free(b);
        sleep_ms(10);
    }
}

/* ---- an HTTP client ---- */

/* Sends `raw` on a new connection and reads the answer: its status and the body length its
 * Content-Length says (-1 when the connection ended first). */
static int exchange(int port, const char *raw, size_t rawlen, long *body_len)
{
    static _Thread_local char buf[1 << 16];
    size_t len = 0;
    int fd = tcp_connect(port);
    send_all(fd, raw, rawlen);
    char *end = NULL;
    while (end == NULL && len + 1 < sizeof buf) {
        ssize_t k = recv(fd, buf + len, sizeof buf - 1 - len, 0);
        if (k <= 0)
            break;
        len += (size_t)k;
        buf[len] = '\0';
        end = strstr(buf, "\r\n\r\n");
    }
    close(fd);
    if (end == NULL)
        return -1;
    const char *cl = strcasestr(buf, "\r\nContent-Length: ");
    *body_len = cl != NULL && cl < end ? strtol(cl + 18, NULL, 10) : 0;
    return atoi(buf + 9);
}

/* Sends `raw` on a new connection and reads until the server closes it: the status, and in
 * *body the bytes after the head. `latch` (or NULL) is set once some body came. */
static int exchange_all(int port, const char *raw, size_t rawlen, uint64_t *body, atomic_int *latch)
{
    static char buf[1 << 16];
    char head[4096];
    size_t hl = 0, hend = 0;
    int fd = tcp_connect(port);
    send_all(fd, raw, rawlen);
    *body = 0;
    for (;;) {
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k <= 0)
            break;
        if (hend == 0) { /* still in the head */
            size_t take = (size_t)k < sizeof head - 1 - hl ? (size_t)k : sizeof head - 1 - hl;
            memcpy(head + hl, buf, take);
            head[hl + take] = '\0';
            char *e = strstr(head, "\r\n\r\n");
            if (e != NULL) {
                hend = (size_t)(e - head) + 4;
                *body += (size_t)k - (hend - hl);
            }
            hl += take;
        } else {
            *body += (size_t)k;
        }
        if (latch != NULL && *body > 0)
            atomic_store(latch, 1);
    }
    close(fd);
    return hend != 0 ? atoi(head + 9) : -1;
}

static int get(int port, const char *method, const char *target, long *body_len)
{
    size_t n = strlen(method) + strlen(target) + 64;
    char *req = malloc(n);
    int k = snprintf(req, n, "%s %s HTTP/1.1\r\nHost: t\r\n\r\n", method, target);
    int status = exchange(port, req, (size_t)k, body_len);
    free(req);
    return status;
}

/* "127.0.0.1 - - [dd/Mon/yyyy:hh:mm:ss +0000] " then `rest`: the time's shape is checked. */
static void assert_clf(const char *line, const char *rest)
{
    static const char pre[] = "127.0.0.1 - - [";
    assert_memory_equal(line, pre, sizeof pre - 1);
    const char *t = line + sizeof pre - 1;
    assert_true(strlen(t) > 28);
    assert_memory_equal(t + 20, " +0000] ", 8);
    assert_true(t[2] == '/' && t[6] == '/' && t[11] == ':');
    if (strcmp(t + 28, rest) != 0)
        fail_msg("line\n  %s\nwant its end\n  %s", line, rest);
}

/* The `i`th line of b (0-based), copied. */
static char *line_at(const char *b, size_t i)
{
    for (; i > 0; i--)
        b = strchr(b, '\n') + 1;
    const char *e = strchr(b, '\n');
    char *l = malloc((size_t)(e - b) + 2);
    memcpy(l, b, (size_t)(e - b) + 1);
    l[e - b + 1] = '\0';
    return l;
}

/* ---- tests ---- */

/* Every outcome the front answers gets its exact line, with the bytes the client's
 * Content-Length announced: 200, HEAD (0 bytes), 502 (the worker's session ended), 504 (the
 * deadline), 503 (the queue is full), 499 (the client left), 414 (over the protocol's target
 * limit, the front's own answer). */
static void every_outcome_common(void **state)
{
    static struct logw w;
    struct logw *ws[] = {&w};
    static struct lfx x;
    struct shmipc__front_opts o = {.deadline_ms = 1000, .queue_max = 1};
    long bl = 0;
    char want[256], *l;
    size_t len;
    (void)state;
    logw_start(&w);
    lfx_start(&x, ws, 1, 1, SHMIPC__ACCESS_COMMON, NULL, &o);

    assert_int_equal(get(x.port, "GET", "/ok?a=1", &bl), 200);
    assert_int_equal(bl, 7);
    char *b = wait_lines(x.path, 1, &len);
    assert_clf(b, "\"GET /ok?a=1 HTTP/1.1\" 200 7\n");
    free(b);

    assert_int_equal(get(x.port, "HEAD", "/head", &bl), 200);
    b = wait_lines(x.path, 2, &len);
    l = line_at(b, 1);
    assert_clf(l, "\"HEAD /head HTTP/1.1\" 200 0\n");
    free(l);
    free(b);

    assert_int_equal(get(x.port, "GET", "/die", &bl), 502);
    b = wait_lines(x.path, 3, &len);
    l = line_at(b, 2);
    snprintf(want, sizeof want, "\"GET /die HTTP/1.1\" 502 %ld\n", bl);
    assert_clf(l, want);
    free(l);
    free(b);

    assert_int_equal(get(x.port, "GET", "/hang", &bl), 504);
    b = wait_lines(x.path, 4, &len);
    l = line_at(b, 3);
    assert_true(bl > 0);
    snprintf(want, sizeof want, "\"GET /hang HTTP/1.1\" 504 %ld\n", bl);
    assert_clf(l, want);
    free(l);
    free(b);

    /* 503: one request holds the worker, one waits in the queue of 1, the third is refused
     * at once. Then the first client leaves (499) and the queued request has the worker. */
    int before = atomic_load(&w.requests);
    int fd1 = tcp_connect(x.port), fd2;
    send_all(fd1, "GET /hang1 HTTP/1.1\r\nHost: t\r\n\r\n", 32);
    uint64_t end = mono_ms() + 5000;
    while (atomic_load(&w.requests) == before && mono_ms() < end)
        sleep_ms(2);
    fd2 = tcp_connect(x.port);
    send_all(fd2, "GET /queued HTTP/1.1\r\nHost: t\r\n\r\n", 33);
    static struct shmipc__front_stats fst;
    do {
        sleep_ms(2);
        CHECK(shmipc__front_stats(x.f, &fst));
    } while (fst.queued == 0 && mono_ms() < end);
    assert_int_equal(fst.queued, 1);
    assert_int_equal(get(x.port, "GET", "/refused", &bl), 503);
    b = wait_lines(x.path, 5, &len);
    l = line_at(b, 4);
    snprintf(want, sizeof want, "\"GET /refused HTTP/1.1\" 503 %ld\n", bl);
    assert_clf(l, want);
    free(l);
    free(b);
    close(fd1);
    b = wait_lines(x.path, 7, &len);
    l = line_at(b, 5);
    assert_clf(l, "\"GET /hang1 HTTP/1.1\" 499 0\n");
    free(l);
    l = line_at(b, 6);
    assert_clf(l, "\"GET /queued HTTP/1.1\" 200 7\n");
    free(l);
    free(b);
    close(fd2);

    /* 414: a target over the protocol's limit (16384) is the front's own answer; its line is
     * longer than a thread's buffer and goes out alone. */
    size_t tl = 20000;
    char *target = malloc(tl + 1);
    target[0] = '/';
    memset(target + 1, 'a', tl - 1);
    target[tl] = '\0';
    assert_int_equal(get(x.port, "GET", target, &bl), 414);
    b = wait_lines(x.path, 8, &len);
    l = line_at(b, 7);
    char *w414 = malloc(tl + 64);
    snprintf(w414, tl + 64, "\"GET %s HTTP/1.1\" 414 %ld\n", target, bl);
    assert_clf(l, w414);
    free(w414);
    free(l);
    free(b);
    free(target);
    uint64_t lines, errors;
    shmipc__access_log_counts(x.log, &lines, &errors);
    assert_int_equal(lines, 8);
    assert_int_equal(errors, 0);
    lfx_stop(&x);
    logw_stop(&w);
    unlink(x.path);
}

/* The status and bytes at the end of a common line. */
static void clf_tail(const char *line, int *status, unsigned long long *bytes)
{
    const char *q = strrchr(line, '"');
    assert_non_null(q);
    assert_int_equal(sscanf(q + 1, " %d %llu", status, bytes), 2);
}

/* A streamed response (docs/serve.md, "Streamed responses") has one line, when it ends: a 200
 * of several MiB with the exact bytes of its body; one cut by the worker's death with the 200
 * its head sent and no more than the client got before the cut, and no second (502) line. */
static void stream_one_line(void **state)
{
    static struct logw w;
    struct logw *ws[] = {&w};
    static struct lfx x;
    const unsigned long long total = (5ull << 20) + 123;
    char req[160], want[256], *l;
    uint64_t got = 0;
    size_t len;
    int status;
    unsigned long long bytes;
    long bl = 0;
    (void)state;
    logw_start(&w);
    lfx_start(&x, ws, 1, 1, SHMIPC__ACCESS_COMMON, NULL, NULL);

    int k = snprintf(req, sizeof req,
                     "GET /big/%llu HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", total);
    assert_int_equal(exchange_all(x.port, req, (size_t)k, &got, NULL), 200);
    assert_int_equal(got, total);
    char *b = wait_lines(x.path, 1, &len);
    snprintf(want, sizeof want, "\"GET /big/%llu HTTP/1.1\" 200 %llu\n", total, total);
    assert_clf(b, want);
    free(b);

    /* HTTP/1.0 and no length: close-delimited, the close comes early. */
    k = snprintf(req, sizeof req, "GET /bigdie/%llu HTTP/1.0\r\n\r\n", total);
    assert_int_equal(exchange_all(x.port, req, (size_t)k, &got, &w.go_die), 200);
    assert_true(got > 0 && got < total);
    /* A request after it: its line comes after any the cut response could still add. */
    status = get(x.port, "GET", "/after", &bl);
    b = wait_lines(x.path, 3, &len);
    l = line_at(b, 1);
    snprintf(want, sizeof want, "\"GET /bigdie/%llu HTTP/1.0\" ", total);
    assert_non_null(strstr(l, want));
    clf_tail(l, &status, &bytes);
    assert_int_equal(status, 200);
    assert_true(bytes <= got);
    free(l);
    l = line_at(b, 2);
    assert_non_null(strstr(l, "\"GET /after HTTP/1.1\" "));
    free(l);
    free(b);

    /* The client leaves after 4 MiB of 64: one line (not a 499), the 200 its head sent and
     * the body bytes written before the close (the server's count, read in its cancel
     * callback; 0 without it). */
    int fd = tcp_connect(x.port);
    static const char big[] = "GET /big/67108864 HTTP/1.1\r\nHost: t\r\n\r\n";
    send_all(fd, big, sizeof big - 1);
    static char sink[1 << 16];
    got = 0;
    while (got < (4u << 20)) {
        ssize_t n = recv(fd, sink, sizeof sink, 0);
        assert_true(n > 0);
        got += (uint64_t)n;
    }
    struct linger lg = {1, 0}; /* a reset: the server sees the client gone at once */
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
    get(x.port, "GET", "/after2", &bl);
    b = wait_lines(x.path, 5, &len);
    l = line_at(b, 3);
    assert_non_null(strstr(l, "\"GET /big/67108864 HTTP/1.1\" "));
    clf_tail(l, &status, &bytes);
    assert_int_equal(status, 200);
    /* Written to the socket, as nginx counts: what the client read (less the head, under 512
     * bytes), more when the kernel's buffers held some, less a batch in flight whose write was
     * not yet confirmed (at most the mark and a frame, under 1 MiB); less than the whole. */
    if (bytes + 512 + (1u << 20) < got || bytes >= (64ull << 20))
        fail_msg("logged %llu bytes, the client got %llu", bytes, (unsigned long long)got);
    free(l);
    l = line_at(b, 4);
    assert_non_null(strstr(l, "\"GET /after2 HTTP/1.1\" "));
    free(l);
    free(b);
    lfx_stop(&x);
    logw_stop(&w);
    unlink(x.path);
}

/* JSON: a hostile target and user agent (quotes, backslash, a tab, bytes that are not
 * UTF-8) stay inside their strings; every line is one object with the worker's address. */
static void json_hostile(void **state)
{
    static struct logw w;
    struct logw *ws[] = {&w};
    static struct lfx x;
    long bl = 0;
    size_t len;
    (void)state;
    logw_start(&w);
    lfx_start(&x, ws, 1, 1, SHMIPC__ACCESS_JSON, NULL, NULL);
    static const char req[] = "GET /q\"x\\y%00 HTTP/1.1\r\nHost: t\r\n"
                              "User-Agent: a\"b\\c\td\xff\xc3\xa9\xc0\xaf\r\n"
                              "Referer: http://r/\"}\r\n\r\n";
    int st = exchange(x.port, req, sizeof req - 1, &bl);
    char *b = wait_lines(x.path, 1, &len);
    if (st == 200) {
        assert_non_null(strstr(b, "\"method\":\"GET\",\"target\":\"/q\\\"x\\\\y%00\","));
        assert_non_null(strstr(b, "\"status\":200,\"bytes\":9,"));
        assert_non_null(strstr(b, "\"referer\":\"http://r/\\\"}\","));
        assert_non_null(
            strstr(b, "\"user_agent\":\"a\\\"b\\\\c\\u0009d\\ufffd\xc3\xa9\\ufffd\\ufffd\","));
        char want[160];
        snprintf(want, sizeof want, "\"worker\":\"%s\"}\n", w.addr);
        assert_non_null(strstr(b, want));
    } else {
        fail_msg("the server refused the hostile request: %d", st);
    }
    assert_true(b[0] == '{');
    assert_non_null(strstr(b, "\"remote\":\"127.0.0.1\""));
    for (char *p = b; *p != '\0'; p++)
        assert_true((unsigned char)*p >= 0x20 || *p == '\n');
    free(b);
    /* a 502 has its line too */
    assert_int_equal(get(x.port, "GET", "/die", &bl), 502);
    b = wait_lines(x.path, 2, &len);
    assert_non_null(strstr(b, "\"status\":502,"));
    free(b);
    lfx_stop(&x);
    logw_stop(&w);
    unlink(x.path);
}

/* Many clients over 2 reactor threads and 2 workers, long targets so that the threads'
 * buffers fill and write at the same time: one whole line per request, each target exactly
 * once, no line torn or mixed. */
#define NCLIENTS 6
#define PER      30
#define TLEN     1500

struct cl {
    int port, id;
    atomic_int *ok;
};

static void *client_main(void *arg)
{
    struct cl *c = arg;
    char *target = malloc(TLEN + 1);
    for (int i = 0; i < PER; i++) {
        int k = snprintf(target, TLEN + 1, "/c/%d/%d/", c->id, i);
        memset(target + k, 'a' + (c->id + i) % 26, TLEN - (size_t)k);
        target[TLEN] = '\0';
        long bl = 0;
        if (get(c->port, "GET", target, &bl) == 200 && bl == TLEN)
            atomic_fetch_add(c->ok, 1);
    }
    free(target);
    return NULL;
}

static void concurrent_lines_whole(void **state)
{
    static struct logw w0, w1;
    struct logw *ws[] = {&w0, &w1};
    static struct lfx x;
    pthread_t th[NCLIENTS];
    struct cl c[NCLIENTS];
    atomic_int ok = 0;
    size_t len;
    (void)state;
    logw_start(&w0);
    logw_start(&w1);
    lfx_start(&x, ws, 2, 2, SHMIPC__ACCESS_COMMON, NULL, NULL);
    for (int i = 0; i < NCLIENTS; i++) {
        c[i] = (struct cl){x.port, i, &ok};
        pthread_create(&th[i], NULL, client_main, &c[i]);
    }
    for (int i = 0; i < NCLIENTS; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&ok), NCLIENTS * PER);
    char *b = wait_lines(x.path, NCLIENTS * PER, &len);
    static unsigned char seen[NCLIENTS][PER];
    memset(seen, 0, sizeof seen);
    char *p = b;
    for (int n = 0; n < NCLIENTS * PER; n++) {
        char *e = strchr(p, '\n');
        *e = '\0';
        int id, i, k = 0;
        const char *q = strstr(p, "\"GET /c/");
        assert_non_null(q);
        assert_int_equal(sscanf(q, "\"GET /c/%d/%d/%n", &id, &i, &k), 2);
        assert_true(id >= 0 && id < NCLIENTS && i >= 0 && i < PER);
        /* the rest of the target is one letter, then the line's end: nothing else inside */
        char want[64];
        snprintf(want, sizeof want, " HTTP/1.1\" 200 %d", TLEN);
        size_t pad = TLEN - (size_t)(k - 5);
        for (size_t j = 0; j < pad; j++)
            assert_int_equal(q[k + j], 'a' + (id + i) % 26);
        assert_string_equal(q + k + pad, want);
        assert_memory_equal(p, "127.0.0.1 - - [", 15);
        assert_int_equal(seen[id][i], 0);
        seen[id][i] = 1;
        p = e + 1;
    }
    assert_int_equal(*p, '\0');
    free(b);
    lfx_stop(&x);
    logw_stop(&w0);
    logw_stop(&w1);
    unlink(x.path);
}

/* logrotate: the file is renamed, reopen puts a new one at the path; the line before goes to
 * the old file, the line after to the new one. */
static void reopen_after_rename(void **state)
{
    static struct logw w;
    struct logw *ws[] = {&w};
    static struct lfx x;
    long bl;
    size_t len;
    char old[160];
    (void)state;
    logw_start(&w);
    lfx_start(&x, ws, 1, 1, SHMIPC__ACCESS_COMMON, NULL, NULL);
    assert_int_equal(get(x.port, "GET", "/before", &bl), 200);
    free(wait_lines(x.path, 1, &len));
    snprintf(old, sizeof old, "%s.1", x.path);
    assert_int_equal(rename(x.path, old), 0);
    CHECK(shmipc__access_log_reopen(x.log));
    assert_int_equal(get(x.port, "GET", "/after", &bl), 200);
    char *b = wait_lines(x.path, 1, &len);
    assert_clf(b, "\"GET /after HTTP/1.1\" 200 6\n");
    free(b);
    b = wait_lines(old, 1, &len);
    assert_clf(b, "\"GET /before HTTP/1.1\" 200 7\n");
    free(b);
    /* a path that cannot be opened again: the old file stays */
    assert_int_equal(unlink(x.path), 0);
    assert_int_equal(mkdir(x.path, 0700), 0);
    assert_true(shmipc__access_log_reopen(x.log) < 0);
    assert_int_equal(get(x.port, "GET", "/still", &bl), 200);
    lfx_stop(&x);
    logw_stop(&w);
    rmdir(x.path);
    unlink(old);
}

/* A log that cannot take a line (/dev/full: ENOSPC): counted as errors, and every request is
 * still answered. */
static void write_error_counted(void **state)
{
    static struct logw w;
    struct logw *ws[] = {&w};
    static struct lfx x;
    long bl;
    (void)state;
    logw_start(&w);
    lfx_start(&x, ws, 1, 1, SHMIPC__ACCESS_JSON, "/dev/full", NULL);
    for (int i = 0; i < 5; i++)
        assert_int_equal(get(x.port, "GET", "/ok", &bl), 200);
    uint64_t lines = 0, errors = 0, end = mono_ms() + 5000;
    while (errors == 0 && mono_ms() < end) {
        sleep_ms(10);
        shmipc__access_log_counts(x.log, &lines, &errors);
    }
    assert_true(errors > 0);
    assert_int_equal(lines, 0);
    lfx_stop(&x);
    logw_stop(&w);
}

/* The log's own contract: bad arguments, an unopenable path, a long line alone. */
static void log_api(void **state)
{
    struct shmipc__access_log *log = (void *)1;
    (void)state;
    assert_int_equal(shmipc__access_log_open(NULL, SHMIPC__ACCESS_COMMON, &log), SHMIPC_EINVAL);
    assert_null(log);
    assert_int_equal(shmipc__access_log_open("/tmp/x", 0, &log), SHMIPC_EINVAL);
    assert_int_equal(shmipc__access_log_open("", SHMIPC__ACCESS_COMMON, &log), SHMIPC_EINVAL);
    assert_true(shmipc__access_log_open("/nonexistent-dir/x.log", SHMIPC__ACCESS_COMMON, &log) < 0);
    assert_int_equal(shmipc__access_log_reopen(NULL), SHMIPC_EINVAL);
    shmipc__access_log_free(NULL);
    /* stdout: reopen is nothing */
    CHECK(shmipc__access_log_open("-", SHMIPC__ACCESS_COMMON, &log));
    assert_int_equal(shmipc__access_log_reopen(log), 0);
    shmipc__access_log_free(log);
}

/* A pipe nobody reads, given a line longer than PIPE_BUF: the non-blocking write takes the
 * pipe's room of it, then the rest is dropped. The next line must still start a line of its
 * own, not end the cut one (a client's long target would otherwise prefix another's entry). */
static void cut_line_then_whole_line(void **state)
{
    int fds[2];
    char path[64];
    static char target[3 * PIPE_BUF], got[4 * PIPE_BUF];
    struct shmipc__access_log *log = NULL;
    struct shmipc__access_buf b;
    (void)state;
    assert_int_equal(pipe(fds), 0);
    assert_true(fcntl(fds[0], F_SETPIPE_SZ, 4096) > 0);
    snprintf(path, sizeof path, "/proc/self/fd/%d", fds[1]);
    CHECK(shmipc__access_log_open(path, SHMIPC__ACCESS_COMMON, &log));
    CHECK(shmipc__access_buf_init(&b, log));
    memset(target, 'x', sizeof target);
    target[0] = '/';
    shmipc__access_entry e = {0};
    e.remote = "127.0.0.1";
    e.remote_len = 9;
    e.method = "GET";
    e.method_len = 3;
    e.target = target;
    e.target_len = sizeof target;
    e.version_minor = 1;
    e.status = 200;
    shmipc__access_buf_add(&b, &e);
    shmipc__access_buf_flush(&b); /* the pipe takes 4096 bytes of it; the rest is dropped */
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    ssize_t n = 0, k;
    while ((k = read(fds[0], got, sizeof got)) > 0)
        n += k;
    assert_true(n > 0 && n < (ssize_t)sizeof target);
    e.target = "/short";
    e.target_len = 6;
    shmipc__access_buf_add(&b, &e);
    shmipc__access_buf_flush(&b);
    n = read(fds[0], got, sizeof got - 1);
    assert_true(n > 0);
    got[n] = 0;
    /* the short line begins a line: what comes before it in the pipe is a newline */
    char *at = strstr(got, "127.0.0.1 - - [");
    assert_non_null(at);
    assert_true(at > got && at[-1] == '\n');
    assert_non_null(strstr(at, "\"GET /short HTTP/1.1\" 200"));
    shmipc__access_buf_free(&b);
    shmipc__access_log_free(log);
    close(fds[0]);
    close(fds[1]);
}

#define LOG_TESTS                                                                                  \
    cmocka_unit_test(every_outcome_common), cmocka_unit_test(json_hostile),                        \
        cmocka_unit_test(concurrent_lines_whole), cmocka_unit_test(reopen_after_rename),           \
        cmocka_unit_test(write_error_counted), cmocka_unit_test(stream_one_line)

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(log_api),
                                       cmocka_unit_test(cut_line_then_whole_line), LOG_TESTS};
    const struct CMUnitTest tests_uring[] = {LOG_TESTS};
    int rc;
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    unsetenv("SHMIPC_REACTOR_BACKEND");
    suite_backend = SHMIPC_BACKEND_EPOLL;
    rc = cmocka_run_group_tests_name("front_log_epoll", tests, NULL, NULL);
    suite_backend = SHMIPC_BACKEND_AUTO; /* io_uring where the kernel has it */
    rc |= cmocka_run_group_tests_name("front_log_uring", tests_uring, NULL, NULL);
    return rc != 0;
}
