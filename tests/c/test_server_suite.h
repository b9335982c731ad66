/*
 * The HTTP server tests that every backend must pass, over real sockets on 127.0.0.1 and an
 * ephemeral port: test_server_epoll.c and test_server_uring.c set suite_backend and run
 * SERVER_TESTS. The server runs shmipc_server_run() on a thread of its own; the test thread
 * is the client, with blocking sockets and 5 s timeouts.
 */
#ifndef TEST_SERVER_SUITE_H
#define TEST_SERVER_SUITE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "shmipc.h"
#include "net/server.h"

static int suite_backend = SHMIPC_BACKEND_EPOLL;

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        int check_rc_ = (call);                                                                    \
        if (check_rc_ < 0)                                                                         \
            fail_msg("%s: %s: %s", #call, shmipc_errname(check_rc_), shmipc_error_detail());       \
    } while (0)

/* ---- the server under test ---- */

#define BIG_LEN (1u << 20)

static unsigned char *big_body;
static atomic_int big_releases;
static atomic_int destroys;

static int h_hello(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    (void)ud;
    CHECK(shmipc_http_response_add_header(res, "Content-Type", "text/plain"));
    CHECK(shmipc_http_response_add_header(res, "X-Test", "yes"));
    return shmipc_http_response_body(res, "hi", 2);
}

static int h_echo(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    size_t len;
    const char *body = shmipc_http_request_body(req, &len);
    (void)ud;
    CHECK(shmipc_http_response_add_header(res, "Content-Type", "application/octet-stream"));
    CHECK(shmipc_http_response_body(res, body, len));
    return shmipc_http_response_end(res);
}

static void big_release(void *ud)
{
    assert_ptr_equal(ud, big_body);
    atomic_fetch_add(&big_releases, 1);
}

static int h_big(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    (void)ud;
    return shmipc_http_response_body_borrow(res, big_body, BIG_LEN, big_body, big_release);
}

/* "/items/<id>?<query>" -> "<id>|<query>" */
static int h_item(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    char out[256];
    size_t wl, ql;
    const char *w = shmipc_http_request_wildcard(req, &wl);
    const char *q = shmipc_http_request_query(req, &ql);
    int n = snprintf(out, sizeof out, "%.*s|%.*s", (int)wl, w, (int)ql, q ? q : "");
    (void)ud;
    return shmipc_http_response_body(res, out, (size_t)n);
}

static int h_fail(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    (void)ud;
    CHECK(shmipc_http_response_body(res, "dropped", 7));
    return SHMIPC_EIO;
}

static int h_close(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    (void)ud;
    CHECK(shmipc_http_response_add_header(res, "Connection", "close"));
    CHECK(shmipc_http_response_set_status(res, 202));
    return shmipc_http_response_body(res, "bye", 3);
}

/* Content-Length from a handler: refused but on an answer to HEAD, where it is GET's length
 * (a wrong one counted in head_length_errors, which the test checks). */
static atomic_int head_length_errors;

static int h_head_length(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    static const char *const bad[] = {"",   "12a", "-1",   "+1",
                                      " 1", "1 ",  "0x10", "123456789012345678901"};
    size_t mlen;
    const char *method = shmipc_http_request_method(req, &mlen);
    (void)ud;
    if (mlen != 4 || memcmp(method, "HEAD", 4) != 0) {
        if (shmipc_http_response_add_header(res, "Content-Length", "3") != SHMIPC_EINVAL)
            atomic_fetch_add(&head_length_errors, 1);
        return shmipc_http_response_body(res, "get", 3);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (shmipc_http_response_add_header(res, "Content-Length", bad[i]) != SHMIPC_EINVAL)
            atomic_fetch_add(&head_length_errors, 1);
    if (shmipc_http_response_body(res, "before", 6) != 0 ||
        shmipc_http_response_add_header(res, "Content-Length", "1234567") != 0 ||
        shmipc_http_response_add_header(res, "content-length", "1234567") != SHMIPC_EINVAL)
        atomic_fetch_add(&head_length_errors, 1);
    /* A body set afterwards is released, not sent, and the length stays. */
    if (shmipc_http_response_body(res, "after", 5) != 0)
        atomic_fetch_add(&head_length_errors, 1);
    return shmipc_http_response_body_borrow(res, big_body, BIG_LEN, big_body, big_release);
}

/* "ip:port ip:port", the client's and the listener's address; a misuse counted in addr_errors. */
static atomic_int addr_errors;

static int h_addr(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    struct sockaddr_storage peer, local;
    struct sockaddr_in tiny;
    socklen_t plen = sizeof peer, llen = sizeof local, tlen = 2;
    char ph[INET6_ADDRSTRLEN] = "?", lh[INET6_ADDRSTRLEN] = "?", out[128];
    (void)ud;
    if (shmipc_http_request_peer(NULL, (struct sockaddr *)&peer, &plen) != SHMIPC_EINVAL ||
        shmipc_http_request_peer(req, NULL, &plen) != SHMIPC_EINVAL ||
        shmipc_http_request_local(req, (struct sockaddr *)&local, NULL) != SHMIPC_EINVAL)
        atomic_fetch_add(&addr_errors, 1);
    /* Too little room: truncated, as getpeername() truncates, and the whole length told. */
    if (shmipc_http_request_peer(req, (struct sockaddr *)&tiny, &tlen) != 0 ||
        tlen != sizeof(struct sockaddr_in))
        atomic_fetch_add(&addr_errors, 1);
    CHECK(shmipc_http_request_peer(req, (struct sockaddr *)&peer, &plen));
    CHECK(shmipc_http_request_local(req, (struct sockaddr *)&local, &llen));
    if (peer.ss_family != AF_INET || local.ss_family != AF_INET || plen != sizeof tiny ||
        llen != sizeof tiny)
        atomic_fetch_add(&addr_errors, 1);
    const struct sockaddr_in *p4 = (const struct sockaddr_in *)&peer;
    const struct sockaddr_in *l4 = (const struct sockaddr_in *)&local;
    inet_ntop(AF_INET, &p4->sin_addr, ph, sizeof ph);
    inet_ntop(AF_INET, &l4->sin_addr, lh, sizeof lh);
    int n =
        snprintf(out, sizeof out, "%s:%u %s:%u", ph, ntohs(p4->sin_port), lh, ntohs(l4->sin_port));
    return shmipc_http_response_body(res, out, (size_t)n);
}

static void count_destroy(void *ud)
{
    (void)ud;
    atomic_fetch_add(&destroys, 1);
}

struct srv {
    shmipc_server *s;
    pthread_t thread;
    int port;
    int run_rc;
    atomic_int returned;
};

static void *run_thread(void *arg)
{
    struct srv *t = arg;
    t->run_rc = shmipc_server_run(t->s);
    atomic_store(&t->returned, 1);
    return NULL;
}

/* Options of a test server; zero fields keep the defaults. */
struct srv_opts {
    unsigned workers;
    uint32_t header_ms, keepalive_ms, stop_ms;
    /* Set with shmipc_server_config_set_timeout() when *_set (0 and negative included). */
    int keepalive_set, keepalive, stop_set, stop, header_set, header;
    int backend; /* 0: suite_backend */
    uint64_t max_body;
    uint64_t keepalive_requests;      /* SHMIPC_SERVER_LIMIT_KEEPALIVE_REQUESTS when nonzero */
    void (*routes)(shmipc_server *s); /* more routes, before the start */
};

static void srv_start(struct srv *t, const struct srv_opts *o)
{
    static const struct srv_opts none;
    shmipc_server_config *cfg;
    if (o == NULL)
        o = &none;
    memset(t, 0, sizeof *t);
    if (big_body == NULL) {
        big_body = malloc(BIG_LEN);
        assert_non_null(big_body);
        for (size_t i = 0; i < BIG_LEN; i++)
            big_body[i] = (unsigned char)(i * 7 + i / 4096);
    }
    CHECK(shmipc_server_config_new(&cfg));
    CHECK(shmipc_server_config_set_port(cfg, 0));
    CHECK(shmipc_server_config_set_workers(cfg, o->workers ? o->workers : 1));
    CHECK(shmipc_server_config_set_backend(cfg, o->backend ? o->backend : suite_backend));
    if (o->header_ms)
        CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_HEADER, o->header_ms));
    if (o->keepalive_ms)
        CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_KEEPALIVE,
                                               o->keepalive_ms));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_STOP,
                                           o->stop_ms ? o->stop_ms : 2000));
    if (o->keepalive_set)
        CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_KEEPALIVE, o->keepalive));
    if (o->stop_set)
        CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_STOP, o->stop));
    if (o->header_set)
        CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_HEADER, o->header));
    if (o->max_body)
        CHECK(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_BODY, o->max_body));
    if (o->keepalive_requests)
        CHECK(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_KEEPALIVE_REQUESTS,
                                             o->keepalive_requests));
    CHECK(shmipc_server_new(cfg, &t->s));
    shmipc_server_config_free(cfg);
    CHECK(shmipc_server_static(t->s, NULL, "/", 200, "text/plain", "Hello, World!", 13));
    CHECK(shmipc_server_route(t->s, "GET", "/hello", h_hello, NULL, count_destroy));
    CHECK(shmipc_server_route(t->s, "POST", "/echo", h_echo, NULL, NULL));
    CHECK(shmipc_server_route(t->s, "PUT", "/echo", h_echo, NULL, NULL));
    CHECK(shmipc_server_route(t->s, "GET", "/big", h_big, NULL, NULL));
    CHECK(shmipc_server_route(t->s, "GET", "/items/*", h_item, NULL, NULL));
    CHECK(shmipc_server_route(t->s, NULL, "/fail", h_fail, NULL, NULL));
    CHECK(shmipc_server_route(t->s, "GET", "/close", h_close, NULL, NULL));
    CHECK(shmipc_server_route(t->s, "GET", "/head-length", h_head_length, NULL, NULL));
    CHECK(shmipc_server_route(t->s, "GET", "/addr", h_addr, NULL, NULL));
    if (o->routes != NULL)
        o->routes(t->s);
    CHECK(shmipc_server_start(t->s));
    t->port = shmipc_server_port(t->s);
    assert_true(t->port > 0);
    assert_string_equal(shmipc_server_backend(t->s),
                        suite_backend == SHMIPC_BACKEND_IO_URING ? "io_uring" : "epoll");
    atomic_init(&t->returned, 0);
    assert_int_equal(pthread_create(&t->thread, NULL, run_thread, t), 0);
}

/* Stops, waits for run() and frees; returns the counters of the run. */
static struct shmipc__server_stats srv_stop(struct srv *t)
{
    struct shmipc__server_stats st;
    int destroyed = atomic_load(&destroys);
    assert_int_equal(shmipc_server_stop(t->s), 0);
    assert_int_equal(pthread_join(t->thread, NULL), 0);
    assert_int_equal(t->run_rc, 0);
    shmipc__server_stats(t->s, &st);
    shmipc_server_close(t->s);
    assert_int_equal(atomic_load(&destroys), destroyed + 1);
    return st;
}

/* ---- the client ---- */

static int client_connect(int port, int rcvbuf)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct timeval tv = {.tv_sec = 5};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    if (rcvbuf > 0)
        assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf), 0);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sin, sizeof sin) != 0)
        fail_msg("connect: %s", strerror(errno));
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv), 0);
    return fd;
}

static void send_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            fail_msg("send: %s", strerror(errno));
        p += n;
        len -= (size_t)n;
    }
}

static void send_str(int fd, const char *s)
{
    send_all(fd, s, strlen(s));
}

/* A buffered reader, so that pipelined responses can be taken one by one. */
struct rd {
    int fd;
    char *buf;
    size_t len, cap;
};

struct resp {
    int status;
    char head[8192];
    char *body;
    size_t body_len;
};

static void rd_init(struct rd *r, int fd)
{
    memset(r, 0, sizeof *r);
    r->fd = fd;
}

static void rd_free(struct rd *r)
{
    free(r->buf);
    r->buf = NULL;
}

/* Reads more; returns the byte count, 0 at EOF, or -errno. */
static ssize_t rd_fill(struct rd *r)
{
    ssize_t n;
    if (r->cap - r->len < 65536) {
        r->cap = r->cap ? r->cap * 2 : 131072;
        r->buf = realloc(r->buf, r->cap);
        assert_non_null(r->buf);
    }
    do
        n = read(r->fd, r->buf + r->len, r->cap - r->len);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    r->len += (size_t)n;
    return n;
}

static void rd_take(struct rd *r, size_t n)
{
    memmove(r->buf, r->buf + n, r->len - n);
    r->len -= n;
}

/* The value of header `name` in resp->head, copied into out; 0 when absent. */
static int resp_header(const struct resp *p, const char *name, char *out, size_t cap)
{
    size_t nlen = strlen(name);
    for (const char *line = strstr(p->head, "\r\n"); line != NULL && line[2] != '\r';
         line = strstr(line + 2, "\r\n")) {
        const char *l = line + 2;
        if (strncasecmp(l, name, nlen) == 0 && l[nlen] == ':') {
            const char *v = l + nlen + 1;
            const char *e = strstr(v, "\r\n");
            while (*v == ' ')
                v++;
            snprintf(out, cap, "%.*s", (int)(e - v), v);
            return 1;
        }
    }
    return 0;
}

/* Reads one response; `no_body` for the answer to HEAD. The body stays valid until rd_free
 * or the next read (it is copied into p->body, which the caller frees). */
static void read_response(struct rd *r, struct resp *p, int no_body)
{
    char *end;
    char v[64];
    size_t head_len;
    memset(p, 0, sizeof *p);
    for (;;) {
        end = r->len ? memmem(r->buf, r->len, "\r\n\r\n", 4) : NULL;
        if (end != NULL)
            break;
        ssize_t n = rd_fill(r);
        if (n <= 0)
            fail_msg("response head: read %zd (%s) with %zu bytes buffered", n,
                     n < 0 ? strerror((int)-n) : "EOF", r->len);
    }
    head_len = (size_t)(end - r->buf) + 4;
    assert_true(head_len < sizeof p->head);
    memcpy(p->head, r->buf, head_len);
    p->head[head_len] = '\0';
    rd_take(r, head_len);
    assert_int_equal(sscanf(p->head, "HTTP/1.1 %d", &p->status), 1);
    if (no_body || p->status < 200 || p->status == 204 || p->status == 304)
        return;
    assert_true(resp_header(p, "Content-Length", v, sizeof v));
    p->body_len = strtoul(v, NULL, 10);
    p->body = malloc(p->body_len + 1);
    assert_non_null(p->body);
    while (r->len < p->body_len) {
        ssize_t n = rd_fill(r);
        if (n <= 0)
            fail_msg("response body: read %zd with %zu of %zu bytes", n, r->len, p->body_len);
    }
    memcpy(p->body, r->buf, p->body_len);
    p->body[p->body_len] = '\0';
    rd_take(r, p->body_len);
}

/* After the last response: the peer's FIN (read returns 0), not a reset. */
static void expect_eof(struct rd *r)
{
    ssize_t n;
    assert_int_equal(r->len, 0);
    n = rd_fill(r);
    if (n != 0)
        fail_msg("expected EOF, read returned %zd (%s)", n, n < 0 ? strerror((int)-n) : "data");
}

/* A client connection to `port` with its reader (the socket is r->fd). */
static void rd_open(struct rd *r, int port)
{
    rd_init(r, client_connect(port, 0));
}

/* Frees the reader and closes its connection. */
static void rd_close(struct rd *r)
{
    rd_free(r);
    close(r->fd);
}

/* Sends `request` on the connection of `r` and reads the response (caller frees body). */
static void exchange(struct rd *r, const char *request, struct resp *p)
{
    send_str(r->fd, request);
    read_response(r, p, 0);
}

/* Sends `request` and checks the response's status and, unless NULL, its body. */
static void expect_response(struct rd *r, const char *request, int status, const char *body)
{
    struct resp p;
    exchange(r, request, &p);
    assert_int_equal(p.status, status);
    if (body != NULL)
        assert_string_equal(p.body, body);
    free(p.body);
}

/* One request on a fresh connection; returns the response (caller frees body). */
static void get_once(int port, const char *request, struct resp *p)
{
    struct rd r;
    rd_open(&r, port);
    exchange(&r, request, p);
    rd_close(&r);
}

/* Fails unless response `p` has header `name` with the value `want`. */
static void assert_header(const struct resp *p, const char *name, const char *want)
{
    char v[128];
    if (!resp_header(p, name, v, sizeof v))
        fail_msg("no %s header in:\n%s", name, p->head);
    assert_string_equal(v, want);
}

/* 500 client and 500 server sockets in one process need more than the usual 1024 fds. */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 4096 && rl.rlim_max >= 4096) {
        rl.rlim_cur = 4096;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* ---- tests ---- */

/* Static responses, handlers, HEAD, prefix routes and queries, response headers. */
static void routes_and_static(void **state)
{
    struct srv t;
    struct rd r;
    struct resp p;
    char v[128];
    (void)state;

    srv_start(&t, NULL);
    rd_open(&r, t.port);
    exchange(&r, "GET / HTTP/1.1\r\nHost: t\r\n\r\n", &p);
    assert_int_equal(p.status, 200);
    assert_string_equal(p.body, "Hello, World!");
    assert_header(&p, "Content-Type", "text/plain");
    assert_header(&p, "Server", "shmipc");
    assert_true(resp_header(&p, "Date", v, sizeof v));
    assert_int_equal(strlen(v), 29);
    assert_false(resp_header(&p, "Connection", v, sizeof v));
    free(p.body);

    send_str(r.fd, "HEAD / HTTP/1.1\r\nHost: t\r\n\r\n");
    read_response(&r, &p, 1);
    assert_int_equal(p.status, 200);
    assert_header(&p, "Content-Length", "13");

    exchange(&r, "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n", &p);
    assert_string_equal(p.body, "hi");
    assert_header(&p, "X-Test", "yes");
    free(p.body);

    expect_response(&r, "GET /items/42?color=blue HTTP/1.1\r\nHost: t\r\n\r\n", 200,
                    "42|color=blue");

    expect_response(&r, "GET /items/ HTTP/1.1\r\nHost: t\r\n\r\n", 200, "|");

    expect_response(&r, "PUT /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello", 200,
                    "hello");
    rd_close(&r);
    srv_stop(&t);
}

/* 404 and 501 keep the connection; 405 names the allowed methods. */
static void not_found_and_not_allowed(void **state)
{
    struct srv t;
    struct rd r;
    struct resp p;
    char v[128];
    (void)state;

    srv_start(&t, NULL);
    rd_open(&r, t.port);
    exchange(&r, "GET /nope HTTP/1.1\r\nHost: t\r\n\r\n", &p);
    assert_int_equal(p.status, 404);
    assert_false(resp_header(&p, "Connection", v, sizeof v));
    free(p.body);
    expect_response(&r, "GET /items HTTP/1.1\r\nHost: t\r\n\r\n", 404,
                    NULL); /* "/items/\*" does not match "/items" */
    exchange(&r, "DELETE / HTTP/1.1\r\nHost: t\r\n\r\n", &p);
    assert_int_equal(p.status, 405);
    assert_header(&p, "Allow", "GET, HEAD");
    free(p.body);
    exchange(&r, "GET /echo HTTP/1.1\r\nHost: t\r\n\r\n", &p);
    assert_int_equal(p.status, 405);
    assert_header(&p, "Allow", "POST, PUT");
    free(p.body);
    expect_response(&r, "BREW / HTTP/1.1\r\nHost: t\r\n\r\n", 501, NULL);
    expect_response(&r, "GET / HTTP/1.1\r\nHost: t\r\n\r\n", 200, NULL);
    rd_close(&r);
    srv_stop(&t);
}

/* Rounds of 16 pipelined requests in one write over one connection, answered in order. */
static void keepalive_pipelining(void **state)
{
    struct srv t;
    struct rd r;
    struct resp p;
    char req[16 * 64];
    (void)state;

    srv_start(&t, NULL);
    rd_open(&r, t.port);
    for (int round = 0; round < 20; round++) {
        size_t n = 0;
        for (int i = 0; i < 16; i++)
            n += (size_t)snprintf(req + n, sizeof req - n,
                                  "GET /items/%d HTTP/1.1\r\nHost: t\r\n\r\n", round * 16 + i);
        send_all(r.fd, req, n);
        for (int i = 0; i < 16; i++) {
            char want[32];
            read_response(&r, &p, 0);
            assert_int_equal(p.status, 200);
            snprintf(want, sizeof want, "%d|", round * 16 + i);
            assert_string_equal(p.body, want);
            free(p.body);
        }
    }
    rd_close(&r);
    struct shmipc__server_stats st = srv_stop(&t);
    assert_int_equal(st.requests, 320);
    assert_int_equal(st.connections, 1);
}

/* Connection: close from the client and from a handler; each ends with a FIN. */
static void connection_close(void **state)
{
    struct srv t;
    struct rd r;
    struct resp p;
    (void)state;

    srv_start(&t, NULL);
    rd_open(&r, t.port);
    exchange(&r, "GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", &p);
    assert_int_equal(p.status, 200);
    assert_header(&p, "Connection", "close");
    free(p.body);
    expect_eof(&r);
    rd_close(&r);

    rd_open(&r, t.port);
    exchange(&r, "GET /close HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\n", &p);
    assert_int_equal(p.status, 202);
    assert_string_equal(p.body, "bye");
    assert_header(&p, "Connection", "close");
    free(p.body);
    expect_eof(&r); /* the pipelined request after it is not answered */
    rd_close(&r);
    srv_stop(&t);
}

/* HTTP/1.0 closes by default and keeps alive when asked to. */
static void http10(void **state)
{
    struct srv t;
    struct rd r;
    struct resp p;
    (void)state;

    srv_start(&t, NULL);
    rd_open(&r, t.port);
    exchange(&r, "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &p);
    assert_header(&p, "Connection", "keep-alive");
    free(p.body);
    exchange(&r, "GET / HTTP/1.0\r\n\r\n", &p);
    assert_int_equal(p.status, 200);
    assert_string_equal(p.body, "Hello, World!");
    assert_header(&p, "Connection", "close");
    free(p.body);
    expect_eof(&r);
    rd_close(&r);
    srv_stop(&t);
}

/* A chunked request body, sent in pieces, is decoded and echoed. */
static void chunked_echo(void **state)
{
    struct srv t;
    struct rd r;
    (void)state;

    srv_start(&t, NULL);
    rd_open(&r, t.port);
    send_str(r.fd, "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel");
    usleep(20000);
    send_str(r.fd, "lo\r\n7\r\n, world\r\n");
    usleep(20000);
    expect_response(&r, "0\r\n\r\n", 200, "hello, world");
    rd_close(&r);
    srv_stop(&t);
}

/* Expect: 100-continue gets the interim response before the body is sent. */
static void expect_continue(void **state)
{
    struct srv t;
    struct rd r;
    struct resp p;
    (void)state;

    srv_start(&t, NULL);
    rd_open(&r, t.port);
    send_str(r.fd,
             "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n");
    read_response(&r, &p, 1);
    assert_int_equal(p.status, 100);
    expect_response(&r, "12345", 200, "12345");
    rd_close(&r);
    srv_stop(&t);
}

/* A 1 MiB borrowed body reaches a slow reader intact while another client is served; the
 * body is released once. */
static void big_body_slow_reader(void **state)
{
    struct srv t;
    struct rd r;
    struct resp p;
    size_t got = 0;
    int slow;
    (void)state;

    atomic_store(&big_releases, 0);
    srv_start(&t, NULL);
    slow = client_connect(t.port, 4096);
    send_str(slow, "GET /big HTTP/1.1\r\nHost: t\r\n\r\n");
    /* Read the head only, then let the server wait on the full socket. */
    rd_init(&r, slow);
    usleep(50000);
    get_once(t.port, "GET / HTTP/1.1\r\nHost: t\r\n\r\n", &p);
    assert_string_equal(p.body, "Hello, World!");
    free(p.body);
    read_response(&r, &p, 1);
    assert_int_equal(p.status, 200);
    while (got < BIG_LEN) {
        char buf[8192];
        size_t take = r.len;
        if (take > 0) {
            if (take > BIG_LEN - got)
                take = BIG_LEN - got;
            assert_memory_equal(r.buf, big_body + got, take);
            rd_take(&r, take);
            got += take;
            continue;
        }
        ssize_t n = read(slow, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        assert_true(n > 0);
        assert_memory_equal(buf, big_body + got, (size_t)n);
        got += (size_t)n;
        if (got % (128u << 10) < 8192)
            usleep(2000);
    }
    /* The connection is still usable. */
    expect_response(&r, "GET / HTTP/1.1\r\nHost: t\r\n\r\n", 200, "Hello, World!");
    rd_close(&r);
    srv_stop(&t);
    assert_int_equal(atomic_load(&big_releases), 1);
}

/* After a closing answer the server shuts down its side and drains what the client still
 * sends: the client reads the answer and then EOF, never ECONNRESET. Also for a 400. */
static void half_close_fin(void **state)
{
    static char junk[256 << 10];
    struct srv t;
    struct rd r;
    struct resp p;
    (void)state;

    memset(junk, 'j', sizeof junk);
    srv_start(&t, NULL);
    rd_open(&r, t.port);
    send_str(r.fd, "GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    send_all(r.fd, junk, sizeof junk);
    read_response(&r, &p, 0);
    assert_int_equal(p.status, 200);
    free(p.body);
    usleep(50000); /* let the junk reach the server after its shutdown */
    expect_eof(&r);
    rd_close(&r);

    rd_open(&r, t.port);
    send_str(r.fd, "GET / HTTP/1.1\r\nHost: t\r\nBad Header: x\r\n\r\n");
    send_all(r.fd, junk, 65536);
    read_response(&r, &p, 0);
    assert_int_equal(p.status, 400);
    free(p.body);
    usleep(50000);
    expect_eof(&r);
    rd_close(&r);
    srv_stop(&t);
}

/* The parser's limits become 413 and 431; a failing handler 500 with close. */
static void limits_and_failures(void **state)
{
    struct srv_opts o = {.max_body = 1000};
    struct srv t;
    struct resp p;
    char *big;
    (void)state;

    srv_start(&t, &o);
    get_once(t.port, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1001\r\n\r\n", &p);
    assert_int_equal(p.status, 413);
    free(p.body);
    big = malloc(20000);
    assert_non_null(big);
    memset(big, 'a', 20000);
    memcpy(big, "GET / HTTP/1.1\r\nHost: t\r\nX: ", 28);
    memcpy(big + 19996, "\r\n\r\n", 4);
    big[19999] = '\n';
    {
        struct rd r;
        rd_open(&r, t.port);
        send_all(r.fd, big, 20000);
        read_response(&r, &p, 0);
        assert_int_equal(p.status, 431);
        free(p.body);
        rd_close(&r);
    }
    free(big);
    get_once(t.port, "GET /fail HTTP/1.1\r\nHost: t\r\n\r\n", &p);
    assert_int_equal(p.status, 500);
    assert_string_equal(p.body, "500 Internal Server Error\n");
    free(p.body);
    srv_stop(&t);
}

/* A client that trickles its head is closed after the header timeout, while another client
 * is served meanwhile. */
static void header_timeout_slowloris(void **state)
{
    struct srv_opts o = {.header_ms = 300};
    const char *head = "GET / HTTP/1.1\r\nHost: t\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    struct srv t;
    struct resp p;
    uint64_t start, closed_at = 0;
    int slow;
    (void)state;

    srv_start(&t, &o);
    slow = client_connect(t.port, 0);
    start = mono_ms();
    for (size_t i = 0; head[i] != '\0' && mono_ms() - start < 3000; i++) {
        struct pollfd pf = {.fd = slow, .events = POLLIN};
        if (send(slow, head + i, 1, MSG_NOSIGNAL) != 1 || poll(&pf, 1, 50) > 0) {
            closed_at = mono_ms();
            break;
        }
        /* Meanwhile the server answers others. */
        get_once(t.port, "GET / HTTP/1.1\r\nHost: t\r\n\r\n", &p);
        assert_int_equal(p.status, 200);
        free(p.body);
    }
    if (closed_at == 0) {
        char c;
        assert_true(read(slow, &c, 1) <= 0);
        closed_at = mono_ms();
    }
    print_message("slowloris closed after %llu ms\n", (unsigned long long)(closed_at - start));
    assert_true(closed_at - start >= 250);
    assert_true(closed_at - start < 2000);
    close(slow);
    struct shmipc__server_stats st = srv_stop(&t);
    assert_true(st.timeouts >= 1);
}

/*
 * Regression: the first request's header timeout runs from accept (docs/http.md, "Timeouts"),
 * but its first byte started it again, so a client that waited almost the whole timeout
 * before its first byte had it twice.
 */
static void first_header_timeout_from_accept(void **state)
{
    struct srv_opts o = {.header_ms = 2000};
    struct srv t;
    struct pollfd pf;
    uint64_t start, closed_at;
    char c;
    int fd;
    (void)state;

    srv_start(&t, &o);
    fd = client_connect(t.port, 0);
    start = mono_ms();
    usleep(1800 * 1000);
    send_all(fd, "G", 1);
    /* Then a byte every 100 ms, a head that never ends. */
    for (;;) {
        pf = (struct pollfd){.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 100) > 0 || mono_ms() - start > 5000)
            break;
        if (send(fd, "E", 1, MSG_NOSIGNAL) != 1)
            break;
    }
    assert_true(read(fd, &c, 1) <= 0);
    closed_at = mono_ms();
    print_message("a head begun at 1800 ms closed after %llu ms\n",
                  (unsigned long long)(closed_at - start));
    assert_true(closed_at - start >= 1900);
    if (closed_at - start >= 3300)
        fail_msg("the header timeout (2000 ms from accept) closed the head only after %llu ms",
                 (unsigned long long)(closed_at - start));
    close(fd);
    struct shmipc__server_stats st = srv_stop(&t);
    assert_true(st.timeouts >= 1);
}

/* An idle keep-alive connection is closed (FIN) after the keep-alive timeout. */
static void keepalive_timeout(void **state)
{
    struct srv_opts o = {.keepalive_ms = 200};
    struct srv t;
    struct rd r;
    struct resp p;
    uint64_t start;
    (void)state;

    srv_start(&t, &o);
    rd_open(&r, t.port);
    exchange(&r, "GET / HTTP/1.1\r\nHost: t\r\n\r\n", &p);
    free(p.body);
    start = mono_ms();
    expect_eof(&r);
    assert_true(mono_ms() - start >= 150);
    assert_true(mono_ms() - start < 2000);
    rd_close(&r);
    srv_stop(&t);
}

/* A graceful stop: new connections are refused, an idle keep-alive connection gets a FIN,
 * and a request in flight (head half sent) is still answered, with Connection: close. */
static void graceful_stop(void **state)
{
    struct srv t;
    struct rd ri, rb;
    struct resp p;
    struct sockaddr_in sin = {.sin_family = AF_INET};
    int fd;
    (void)state;

    /* A long stop timeout: a slow (sanitized, loaded) run must not reach it. */
    struct srv_opts o = {.stop_ms = 20000};
    srv_start(&t, &o);
    rd_open(&ri, t.port);
    exchange(&ri, "GET / HTTP/1.1\r\nHost: t\r\n\r\n", &p);
    free(p.body);
    rd_open(&rb, t.port);
    send_str(rb.fd, "GET /hello HTTP/1.1\r\nHost: t\r\n");
    usleep(200000); /* the half head reaches the server before the stop */
    assert_int_equal(shmipc_server_stop(t.s), 0);
    expect_eof(&ri); /* the idle connection is closed first */
    sin.sin_port = htons((uint16_t)t.port);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* On io_uring the kernel drops its last reference to the listener when the worker's next
     * enter runs the cancellation of its accept, which may follow the FIN above. */
    for (uint64_t until = mono_ms() + 5000;; usleep(10000)) {
        int rc;
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        rc = connect(fd, (struct sockaddr *)&sin, sizeof sin);
        close(fd);
        if (rc < 0) {
            assert_int_equal(errno, ECONNREFUSED);
            break;
        }
        assert_true(mono_ms() < until);
    }
    assert_int_equal(atomic_load(&t.returned), 0); /* still waiting for the busy one */
    exchange(&rb, "\r\n", &p);
    assert_int_equal(p.status, 200);
    assert_string_equal(p.body, "hi");
    assert_header(&p, "Connection", "close");
    free(p.body);
    expect_eof(&rb);
    rd_close(&rb);
    rd_close(&ri);
    assert_int_equal(pthread_join(t.thread, NULL), 0);
    assert_int_equal(t.run_rc, 0);
    shmipc_server_close(t.s);
}

/* A handler that holds its worker until the test lets it go (bounded: 10 s). */
static atomic_int slow_entered, slow_release;

static int h_slow(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    (void)ud;
    atomic_store(&slow_entered, 1);
    for (uint64_t until = mono_ms() + 10000; !atomic_load(&slow_release) && mono_ms() < until;)
        usleep(2000);
    return shmipc_http_response_body(res, "slow", 4);
}

static void add_slow_route(shmipc_server *s)
{
    CHECK(shmipc_server_route(s, "GET", "/slow", h_slow, NULL, NULL));
}

/*
 * A stop that comes while a handler runs: its answer is the connection's last, so it says
 * Connection: close (nginx's keepalive test "connection close on exit"). It went out as
 * keep-alive and the FIN came after it: a client that sent its next request in between lost
 * it. The request pipelined behind it is not answered.
 */
static void stop_during_handler_answer_says_close(void **state)
{
    struct srv_opts o = {.stop_ms = 20000, .routes = add_slow_route};
    struct srv t;
    struct rd r;
    struct resp p;
    (void)state;

    atomic_store(&slow_entered, 0);
    atomic_store(&slow_release, 0);
    srv_start(&t, &o);
    rd_open(&r, t.port);
    send_str(r.fd, "GET /slow HTTP/1.1\r\nHost: t\r\n\r\nGET /hello HTTP/1.1\r\nHost: t\r\n\r\n");
    for (uint64_t until = mono_ms() + 5000; !atomic_load(&slow_entered); usleep(1000))
        assert_true(mono_ms() < until);
    assert_int_equal(shmipc_server_stop(t.s), 0);
    usleep(100000); /* run() has begun the stop: it waits for the worker */
    atomic_store(&slow_release, 1);
    read_response(&r, &p, 0);
    assert_int_equal(p.status, 200);
    assert_string_equal(p.body, "slow");
    assert_header(&p, "Connection", "close");
    free(p.body);
    expect_eof(&r);
    rd_close(&r);
    assert_int_equal(pthread_join(t.thread, NULL), 0);
    assert_int_equal(t.run_rc, 0);
    shmipc_server_close(t.s);
}

/*
 * A keep-alive timeout of 0 turns keep-alive off, as nginx's keepalive_timeout 0: every
 * response (static, handler, 404) carries Connection: close and the connection ends after
 * it, even with a second request pipelined behind the first. (The old setter refused 0.)
 */
static void keepalive_zero_closes_after_each_response(void **state)
{
    static const char *const targets[] = {"/", "/hello", "/nowhere"};
    static const int statuses[] = {200, 200, 404};
    struct srv_opts o = {.keepalive_set = 1, .keepalive = 0};
    struct srv t;
    struct rd r;
    struct resp p;
    char req[128];
    (void)state;

    srv_start(&t, &o);
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        rd_open(&r, t.port);
        snprintf(req, sizeof req,
                 "GET %s HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\n", targets[i]);
        exchange(&r, req, &p);
        assert_int_equal(p.status, statuses[i]);
        assert_header(&p, "Connection", "close");
        free(p.body);
        expect_eof(&r); /* the pipelined second request is not answered */
        rd_close(&r);
    }
    struct shmipc__server_stats st = srv_stop(&t);
    assert_int_equal(st.requests, 3);
}

/*
 * A negative keep-alive timeout: idle connections do not time out (they are still served after
 * a pause longer than a short keep-alive would allow), and a negative stop timeout waits for a
 * request in flight: run() is still waiting after a while, and the request is answered.
 */
static void negative_keepalive_and_stop_wait(void **state)
{
    struct srv_opts o = {.keepalive_set = 1, .keepalive = -2, .stop_set = 1, .stop = INT_MIN};
    struct srv t;
    struct rd r, rb;
    struct resp p;
    (void)state;

    srv_start(&t, &o);
    rd_open(&r, t.port);
    exchange(&r, "GET / HTTP/1.1\r\nHost: t\r\n\r\n", &p);
    free(p.body);
    usleep(300 * 1000);
    exchange(&r, "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n", &p);
    assert_int_equal(p.status, 200);
    free(p.body);
    rd_open(&rb, t.port);
    send_str(rb.fd, "GET /hello HTTP/1.1\r\nHost: t\r\n");
    usleep(200000); /* the half head reaches the server before the stop */
    assert_int_equal(shmipc_server_stop(t.s), 0);
    expect_eof(&r); /* the idle one is closed at once, as in every graceful stop */
    usleep(500 * 1000);
    assert_int_equal(atomic_load(&t.returned), 0); /* still waiting for the busy one */
    exchange(&rb, "\r\n", &p);
    assert_int_equal(p.status, 200);
    assert_header(&p, "Connection", "close");
    free(p.body);
    expect_eof(&rb);
    rd_close(&rb);
    rd_close(&r);
    assert_int_equal(pthread_join(t.thread, NULL), 0);
    assert_int_equal(t.run_rc, 0);
    shmipc_server_close(t.s);
}

/*
 * Regression: the body of a connection's first request was timed by the header timeout,
 * restarted at each read, instead of the keep-alive timeout that bounds every other body that
 * stops arriving (docs/http.md, "Timeouts"). A first upload that paused longer than the header
 * timeout was cut, and with the header timeout off ("never") a first request whose body
 * stopped arriving held its connection forever.
 */
static void first_request_body_stall_uses_keepalive_timeout(void **state)
{
    struct srv t;
    struct rd r;
    struct resp p;
    uint64_t start;
    (void)state;

    /* A pause past the header timeout but well within the keep-alive timeout is no stall. */
    struct srv_opts pause = {.header_ms = 200, .keepalive_ms = 5000};
    srv_start(&t, &pause);
    rd_open(&r, t.port);
    send_str(r.fd, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nab");
    usleep(700 * 1000);
    exchange(&r, "cd", &p);
    assert_int_equal(p.status, 200);
    assert_string_equal(p.body, "abcd");
    free(p.body);
    rd_close(&r);
    srv_stop(&t);

    /* The header timeout off: a first body that stops arriving is still given up, after the
     * keep-alive timeout, as the second request's body is. */
    struct srv_opts never = {.header_set = 1, .header = -1, .keepalive_ms = 300};
    srv_start(&t, &never);
    for (int second = 0; second <= 1; second++) {
        rd_open(&r, t.port);
        if (second)
            expect_response(&r, "GET / HTTP/1.1\r\nHost: t\r\n\r\n", 200, "Hello, World!");
        send_str(r.fd, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nab");
        start = mono_ms();
        expect_eof(&r); /* the client's 5 s receive timeout fails it when nothing comes */
        print_message("request %d: a stalled body closed after %llu ms\n", second + 1,
                      (unsigned long long)(mono_ms() - start));
        assert_true(mono_ms() - start >= 250);
        rd_close(&r);
    }
    struct shmipc__server_stats st = srv_stop(&t);
    assert_true(st.timeouts >= 2);
}

/* 500 connections open at once, each served twice (two workers). */
static void many_connections(void **state)
{
    enum { N = 500 };
    struct srv_opts o = {.workers = 2};
    struct srv t;
    struct resp p;
    struct rd *r = calloc(N, sizeof *r);
    (void)state;

    assert_non_null(r);
    srv_start(&t, &o);
    for (int i = 0; i < N; i++)
        rd_open(&r[i], t.port);
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++) {
            char req[64];
            snprintf(req, sizeof req, "GET /items/%d HTTP/1.1\r\nHost: t\r\n\r\n", i);
            send_str(r[i].fd, req);
        }
        for (int i = 0; i < N; i++) {
            char want[16];
            read_response(&r[i], &p, 0);
            snprintf(want, sizeof want, "%d|", i);
            assert_string_equal(p.body, want);
            free(p.body);
        }
    }
    for (int i = 0; i < N; i++)
        rd_close(&r[i]);
    free(r);
    struct shmipc__server_stats st = srv_stop(&t);
    assert_int_equal(st.connections, N);
    assert_int_equal(st.requests, 2 * N);
}

/*
 * keepalive_requests (nginx's): the N-th response on a connection carries Connection: close
 * and the connection ends after it. Requests pipelined past the limit in the same write are
 * not answered; one request at a time, the N-th ends the connection as well. The default is
 * 1000: a client that keeps one connection forever, or floods it with pipelined requests,
 * cannot hold a worker's connection past that.
 */
static void keepalive_requests_limit(void **state)
{
    struct srv_opts o = {.keepalive_requests = 3};
    struct srv t;
    struct rd r;
    struct resp p;
    char v[64];
    (void)state;

    srv_start(&t, &o);
    /* One at a time: the first two keep the connection, the third closes it. */
    rd_open(&r, t.port);
    for (int i = 1; i <= 3; i++) {
        exchange(&r, "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n", &p);
        assert_int_equal(p.status, 200);
        if (i < 3)
            assert_false(resp_header(&p, "Connection", v, sizeof v));
        else
            assert_header(&p, "Connection", "close");
        free(p.body);
    }
    expect_eof(&r);
    rd_close(&r);
    /* Five pipelined in one write: three answered, the third says close, then EOF. */
    rd_open(&r, t.port);
    {
        char req[512] = "";
        for (int i = 0; i < 5; i++)
            strcat(req, "GET / HTTP/1.1\r\nHost: t\r\n\r\n");
        send_str(r.fd, req);
    }
    for (int i = 1; i <= 3; i++) {
        read_response(&r, &p, 0);
        assert_int_equal(p.status, 200);
        assert_int_equal(resp_header(&p, "Connection", v, sizeof v), i == 3);
        free(p.body);
    }
    expect_eof(&r);
    rd_close(&r);
    struct shmipc__server_stats st = srv_stop(&t);
    assert_int_equal(st.requests, 6);
}

/* The default limit is 1000: 1005 requests pipelined in one write get 1000 answers, the last
 * with Connection: close, then EOF. */
static void keepalive_requests_default(void **state)
{
    static const char one[] = "GET / HTTP/1.1\r\nHost: t\r\n\r\n";
    const size_t n = 1005, len = sizeof one - 1;
    struct srv t;
    struct rd r;
    struct resp p;
    char v[64];
    char *req = malloc(n * len);
    (void)state;

    assert_non_null(req);
    for (size_t i = 0; i < n; i++)
        memcpy(req + i * len, one, len);
    srv_start(&t, NULL);
    rd_open(&r, t.port);
    send_all(r.fd, req, n * len);
    free(req);
    for (int i = 1; i <= 1000; i++) {
        read_response(&r, &p, 0);
        assert_int_equal(p.status, 200);
        if (resp_header(&p, "Connection", v, sizeof v) != (i == 1000))
            fail_msg("response %d: Connection header %s", i, i == 1000 ? "missing" : "early");
        free(p.body);
    }
    expect_eof(&r);
    rd_close(&r);
    struct shmipc__server_stats st = srv_stop(&t);
    assert_int_equal(st.requests, 1000);
}

/* ---- a stop that lands between run()'s check of the stop flag and its start ---- */

static atomic_int window_starts, window_closing;

static void window_stop(struct shmipc_server *s)
{
    assert_int_equal(shmipc_server_stop(s), 0);
}

static int window_seen(struct shmipc__loop *loop, unsigned index, unsigned nworkers, void *data)
{
    struct shmipc_server *s = data;
    (void)loop;
    (void)index;
    (void)nworkers;
    atomic_store(&window_closing, atomic_load(&s->closing));
    atomic_fetch_add(&window_starts, 1);
    return 0;
}

/*
 * stop() lands after run() checked the stop flag and before it started the server (forced by
 * the test seam shmipc__server_run_window). The start used to clear the `closing` flag the
 * stop had set, so the workers ran as if no stop was asked (keep-alive answers, WebSocket
 * upgrades accepted) until run's wakeup: they must start closing. run() returns, and the next
 * run() serves normally (the stop was used up).
 */
static void stop_between_run_check_and_start(void **state)
{
    shmipc_server_config *cfg;
    struct srv t;
    (void)state;
    memset(&t, 0, sizeof t);
    CHECK(shmipc_server_config_new(&cfg));
    CHECK(shmipc_server_config_set_port(cfg, 0));
    CHECK(shmipc_server_config_set_workers(cfg, 1));
    CHECK(shmipc_server_config_set_backend(cfg, suite_backend));
    CHECK(shmipc_server_new(cfg, &t.s));
    shmipc_server_config_free(cfg);
    CHECK(shmipc_server_static(t.s, NULL, "/", 200, "text/plain", "Hello, World!", 13));
    CHECK(shmipc__server_thread_hooks(t.s, window_seen, NULL, t.s));
    atomic_store(&window_starts, 0);
    atomic_store(&window_closing, -1);
    shmipc__server_run_window = window_stop;
    atomic_init(&t.returned, 0);
    assert_int_equal(pthread_create(&t.thread, NULL, run_thread, &t), 0);
    uint64_t end = mono_ms() + 10000;
    while (!atomic_load(&t.returned) && mono_ms() < end)
        usleep(1000);
    shmipc__server_run_window = NULL;
    if (!atomic_load(&t.returned))
        fail_msg("run() did not return after a stop in its start window");
    assert_int_equal(pthread_join(t.thread, NULL), 0);
    assert_int_equal(t.run_rc, 0);
    assert_int_equal(atomic_load(&window_starts), 1);
    assert_int_equal(atomic_load(&window_closing), 1);
    /* The next start serves with keep-alive, and its run stops when asked. */
    CHECK(shmipc_server_start(t.s));
    assert_int_equal(atomic_load(&window_starts), 2);
    assert_int_equal(atomic_load(&window_closing), 0);
    t.port = shmipc_server_port(t.s);
    atomic_init(&t.returned, 0);
    assert_int_equal(pthread_create(&t.thread, NULL, run_thread, &t), 0);
    {
        struct rd r;
        struct resp p;
        char v[64];
        rd_open(&r, t.port);
        exchange(&r, "GET / HTTP/1.1\r\nHost: t\r\n\r\n", &p);
        assert_int_equal(p.status, 200);
        assert_false(resp_header(&p, "Connection", v, sizeof v));
        free(p.body);
        rd_close(&r);
    }
    assert_int_equal(shmipc_server_stop(t.s), 0);
    assert_int_equal(pthread_join(t.thread, NULL), 0);
    assert_int_equal(t.run_rc, 0);
    shmipc_server_close(t.s);
}

/*
 * stop() called twice while run() runs (a signal handler and the application, say), the second
 * while run() is stopping: both are for that run. The second used to stay pending, so the next
 * run() returned at once without serving. The next run now runs until its own stop.
 */
static void second_stop_is_for_the_same_run(void **state)
{
    struct srv t;
    (void)state;
    struct resp p;
    srv_start(&t, NULL);
    get_once(t.port, "GET / HTTP/1.1\r\nHost: t\r\n\r\n", &p);
    assert_int_equal(p.status, 200);
    free(p.body);
    /* A request in progress keeps the graceful stop waiting: the second stop lands while run()
     * is stopping, after it took the first. */
    struct rd r;
    rd_open(&r, t.port);
    send_str(r.fd, "GET / HTTP/1.1\r\n");
    usleep(50000);
    assert_int_equal(shmipc_server_stop(t.s), 0);
    usleep(100000);
    assert_false(atomic_load(&t.returned));
    assert_int_equal(shmipc_server_stop(t.s), 0);
    send_str(r.fd, "Host: t\r\n\r\n");
    read_response(&r, &p, 0);
    assert_int_equal(p.status, 200);
    assert_header(&p, "Connection", "close");
    free(p.body);
    rd_close(&r);
    assert_int_equal(pthread_join(t.thread, NULL), 0);
    assert_int_equal(t.run_rc, 0);
    /* Run again: it starts the server itself and serves. */
    atomic_init(&t.returned, 0);
    assert_int_equal(pthread_create(&t.thread, NULL, run_thread, &t), 0);
    usleep(200000);
    if (atomic_load(&t.returned))
        fail_msg("the next run() returned at once: the earlier run's second stop was kept");
    assert_int_equal(shmipc_server_stop(t.s), 0);
    assert_int_equal(pthread_join(t.thread, NULL), 0);
    assert_int_equal(t.run_rc, 0);
    shmipc_server_close(t.s);
}

/* An answer to HEAD may say GET's Content-Length itself (as Werkzeug answers HEAD); the
 * header is refused on any other answer, and so is a value that is not 1 to 19 digits. */
static void head_answer_says_gets_length(void **state)
{
    struct srv t;
    struct rd r;
    struct resp p;
    (void)state;
    atomic_store(&head_length_errors, 0);
    int released = atomic_load(&big_releases);
    srv_start(&t, NULL);
    rd_open(&r, t.port);
    /* Pipelined: a body byte after the HEAD answer would spoil the next status line. */
    send_str(r.fd, "HEAD /head-length HTTP/1.1\r\nHost: t\r\n\r\n"
                   "GET /head-length HTTP/1.1\r\nHost: t\r\n\r\n");
    read_response(&r, &p, 1);
    assert_int_equal(p.status, 200);
    assert_header(&p, "Content-Length", "1234567");
    read_response(&r, &p, 0);
    assert_int_equal(p.status, 200);
    assert_string_equal(p.body, "get");
    free(p.body);
    rd_close(&r);
    srv_stop(&t);
    assert_int_equal(atomic_load(&head_length_errors), 0);
    assert_int_equal(atomic_load(&big_releases), released + 1); /* the borrowed body's */
}

/* shmipc_http_request_peer/_local: the client's own port and the server's, per connection. */
static void request_addresses(void **state)
{
    struct srv t;
    (void)state;
    atomic_store(&addr_errors, 0);
    srv_start(&t, NULL);
    for (int i = 0; i < 2; i++) { /* two connections: each its own port */
        struct rd r;
        struct resp p;
        struct sockaddr_in me;
        socklen_t len = sizeof me;
        char want[128];
        rd_open(&r, t.port);
        assert_int_equal(getsockname(r.fd, (struct sockaddr *)&me, &len), 0);
        snprintf(want, sizeof want, "127.0.0.1:%u 127.0.0.1:%d", ntohs(me.sin_port), t.port);
        for (int k = 0; k < 2; k++) { /* a second request asks the connection's cache */
            exchange(&r, "GET /addr HTTP/1.1\r\nHost: t\r\n\r\n", &p);
            assert_int_equal(p.status, 200);
            assert_string_equal(p.body, want);
            free(p.body);
        }
        rd_close(&r);
    }
    srv_stop(&t);
    assert_int_equal(atomic_load(&addr_errors), 0);
}

#define SERVER_TESTS                                                                               \
    cmocka_unit_test(routes_and_static), cmocka_unit_test(not_found_and_not_allowed),              \
        cmocka_unit_test(keepalive_pipelining), cmocka_unit_test(connection_close),                \
        cmocka_unit_test(http10), cmocka_unit_test(chunked_echo),                                  \
        cmocka_unit_test(expect_continue), cmocka_unit_test(big_body_slow_reader),                 \
        cmocka_unit_test(half_close_fin), cmocka_unit_test(limits_and_failures),                   \
        cmocka_unit_test(header_timeout_slowloris), cmocka_unit_test(keepalive_timeout),           \
        cmocka_unit_test(graceful_stop), cmocka_unit_test(stop_during_handler_answer_says_close),  \
        cmocka_unit_test(many_connections),                                                        \
        cmocka_unit_test(keepalive_zero_closes_after_each_response),                               \
        cmocka_unit_test(negative_keepalive_and_stop_wait),                                        \
        cmocka_unit_test(first_request_body_stall_uses_keepalive_timeout),                         \
        cmocka_unit_test(first_header_timeout_from_accept),                                        \
        cmocka_unit_test(keepalive_requests_limit), cmocka_unit_test(keepalive_requests_default),  \
        cmocka_unit_test(stop_between_run_check_and_start),                                        \
        cmocka_unit_test(second_stop_is_for_the_same_run),                                         \
        cmocka_unit_test(head_answer_says_gets_length), cmocka_unit_test(request_addresses)

#endif
