/*
 * The WebSocket server over real TCP sockets, shared by test_ws_server_epoll.c and
 * test_ws_server_uring.c: each sets suite_backend and runs the fixtures and WS_SERVER_TESTS.
 *
 * Every tests/ws fixture (tests/ws/README.md; the cmocka test is named after the file, so after
 * the Autobahn case it mirrors) runs through a server started for it, whose WebSocket route
 * echoes as the fixture's application does: the upgrade request (the fixture's, or a plain
 * one) and the client frames go in over a socket, and the exact bytes that come back must be
 * the fixture's response (without its Date line) and its frames; the messages the application
 * got and the code on_close reported must be the fixture's. Small inputs are sent a second
 * time one byte per write after the request. The fixture reader is test_ws_fixtures.c's,
 * included below, so both tests read the cases the same way.
 *
 * The rest are the behaviours only a server has: a client that sends but never reads (the
 * server stops reading it and its queue stays bounded), an application that sends to a client
 * that does not read (SHMIPC_EAGAIN at the limit), HTTP routes beside WebSocket routes, the
 * application's refusal (403), a graceful stop (1001), and the timeouts with short values: a
 * paused client whose output makes no progress (keep-alive: 1006), automatic pings that keep
 * an answering client open past the idle timeout, a silent client failed by it (1006), both
 * off by default; the public ping/idle timeouts and send-queue limits' validation; and a
 * client that sends its close frame and closes or resets its socket right behind it, while
 * the server reads it, is paused or holds it: on_close gets the frame's code.
 */
#ifndef TEST_WS_SERVER_SUITE_H
#define TEST_WS_SERVER_SUITE_H

/* The fixture language: parsing, frame encoding and message records. Its main() is renamed
 * and never called. */
#define main ws_fixtures_main
#include "test_ws_fixtures.c"
#include "sock_sent.h"
#undef main

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "net/server.h"
#include "reactor/loop.h"

static int suite_backend = SHMIPC_BACKEND_EPOLL;

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ < 0)                                                                               \
            fail_msg("%s: %s: %s", #call, shmipc_errname(rc_), shmipc_error_detail());             \
    } while (0)

/* Waits until `cond` holds; fails after 10 s. */
#define WAIT_UNTIL(cond)                                                                           \
    do {                                                                                           \
        uint64_t wait_end_ = mono_ms() + 10000;                                                    \
        while (!(cond)) {                                                                          \
            if (mono_ms() > wait_end_)                                                             \
                fail_msg("timed out waiting for %s", #cond);                                       \
            usleep(1000);                                                                          \
        }                                                                                          \
    } while (0)

/* ---------------------------------------------------------------------------------------- */
/* The application: what the fixtures' echo does, recorded for the test thread */

struct app {
    int echo;
    unsigned app_close; /* 0: none */
    int refuse;         /* on_open refuses */
    pthread_mutex_t mu;
    struct fx_bytes messages; /* record_message() records */
    atomic_int opens, closes, close_code, send_errors;
    char reason[128];
    /* The flood route: on each message, 256 KiB messages until the queue refuses. */
    atomic_int flood_sent, flood_refused;
};

static int app_open(shmipc_ws *ws, const shmipc_http_request *req, void *user_data)
{
    struct app *a = user_data;
    (void)req;
    if (a->refuse)
        return -1;
    atomic_fetch_add(&a->opens, 1);
    if (a->app_close != 0 && shmipc_ws_close(ws, (int)a->app_close, NULL) != 0)
        atomic_fetch_add(&a->send_errors, 1);
    return 0;
}

static void app_message(shmipc_ws *ws, int kind, const void *data, size_t len, void *user_data)
{
    struct app *a = user_data;
    pthread_mutex_lock(&a->mu);
    record_message(&a->messages, (unsigned)kind, data, len);
    pthread_mutex_unlock(&a->mu);
    if (a->echo && shmipc_ws_send(ws, kind, data, len) != 0)
        atomic_fetch_add(&a->send_errors, 1);
}

static void app_close_cb(shmipc_ws *ws, int code, const char *reason, size_t len, void *user_data)
{
    struct app *a = user_data;
    (void)ws;
    snprintf(a->reason, sizeof a->reason, "%.*s", (int)len, reason);
    atomic_store(&a->close_code, code);
    atomic_fetch_add(&a->closes, 1);
}

static unsigned char flood_block[256 << 10];

static void flood_message(shmipc_ws *ws, int kind, const void *data, size_t len, void *user_data)
{
    struct app *a = user_data;
    int rc;
    (void)kind;
    (void)data;
    (void)len;
    while ((rc = shmipc_ws_send(ws, SHMIPC_WS_BINARY, flood_block, sizeof flood_block)) == 0)
        atomic_fetch_add(&a->flood_sent, 1);
    if (rc == SHMIPC_EAGAIN)
        atomic_fetch_add(&a->flood_refused, 1);
    else
        atomic_fetch_add(&a->send_errors, 1);
}

static void app_reset(struct app *a)
{
    pthread_mutex_lock(&a->mu);
    a->messages.n = 0;
    fx_put(&a->messages, "", 0);
    pthread_mutex_unlock(&a->mu);
    atomic_store(&a->opens, 0);
    atomic_store(&a->closes, 0);
    atomic_store(&a->close_code, 0);
    atomic_store(&a->send_errors, 0);
}

static void app_init(struct app *a)
{
    memset(a, 0, sizeof *a);
    a->echo = 1;
    pthread_mutex_init(&a->mu, NULL);
    app_reset(a);
}

static void app_free(struct app *a)
{
    free(a->messages.p);
    pthread_mutex_destroy(&a->mu);
}

/* ---------------------------------------------------------------------------------------- */
/* A server on its own thread */

struct srv {
    shmipc_server *s;
    pthread_t thread;
    int port;
    int run_rc;
};

static void *run_thread(void *arg)
{
    struct srv *t = arg;
    t->run_rc = shmipc_server_run(t->s);
    return NULL;
}

/* Server settings beyond the defaults, through the public setters; zero leaves one alone. */
struct srv_opts {
    uint32_t keepalive_ms, header_ms, ws_ping_ms, ws_idle_ms;
    uint64_t high_water, send_limit;
    int stop_forever; /* a negative stop timeout: wait for requests however long they take */
};

/*
 * Creates the server: one worker, no Server header; `limits` (may be NULL) as the fixture's,
 * `o` (may be NULL) for the timeouts and send queue marks.
 */
static void srv_new_opts(struct srv *t, const struct shmipc__ws_limits *limits,
                         const struct srv_opts *o)
{
    shmipc_server_config *cfg;
    struct srv_opts none = {0};
    if (o == NULL)
        o = &none;
    memset(t, 0, sizeof *t);
    CHECK(shmipc_server_config_new(&cfg));
    CHECK(shmipc_server_config_set_port(cfg, 0));
    CHECK(shmipc_server_config_set_workers(cfg, 1));
    CHECK(shmipc_server_config_set_backend(cfg, suite_backend));
    CHECK(shmipc_server_config_set_server_name(cfg, NULL));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_STOP,
                                           o->stop_forever ? -1 : 2000));
    if (o->keepalive_ms != 0)
        CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_KEEPALIVE,
                                               o->keepalive_ms));
    if (o->header_ms != 0)
        CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_HEADER, o->header_ms));
    /* 0 in the options: never, which the setter spells negative. */
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_PING,
                                           o->ws_ping_ms ? (int)o->ws_ping_ms : -1));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_IDLE,
                                           o->ws_idle_ms ? (int)o->ws_idle_ms : -1));
    if (o->high_water != 0)
        CHECK(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_WS_SEND_HIGH_WATER,
                                             o->high_water));
    if (o->send_limit != 0)
        CHECK(
            shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_WS_SEND_LIMIT, o->send_limit));
    if (limits != NULL && limits->max_message != 0)
        CHECK(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_WS_MESSAGE,
                                             limits->max_message));
    if (limits != NULL && limits->tx_high_water != 0)
        CHECK(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_WS_SEND_HIGH_WATER,
                                             limits->tx_high_water));
    CHECK(shmipc_server_new(cfg, &t->s));
    shmipc_server_config_free(cfg);
    /* The public settings reached the connections' limits. */
    if (o->high_water != 0)
        assert_int_equal(t->s->ws_limits.tx_high_water, o->high_water);
    if (o->send_limit != 0)
        assert_int_equal(t->s->ws_limits.tx_limit, o->send_limit);
    if (limits != NULL) {
        if (limits->max_message != 0)
            assert_int_equal(t->s->ws_limits.max_message, limits->max_message);
        if (limits->tx_high_water != 0)
            assert_int_equal(t->s->ws_limits.tx_high_water, limits->tx_high_water);
        /* max_frame alone has no public setter: a fixture that sets it is applied here. */
        if (limits->max_frame != 0)
            assert_int_equal(shmipc__ws_limits_resolve(&t->s->ws_limits, limits), 0);
    }
}

static void srv_new(struct srv *t, const struct shmipc__ws_limits *limits)
{
    srv_new_opts(t, limits, NULL);
}

static void srv_run(struct srv *t)
{
    CHECK(shmipc_server_start(t->s));
    t->port = shmipc_server_port(t->s);
    assert_true(t->port > 0);
    assert_string_equal(shmipc_server_backend(t->s),
                        suite_backend == SHMIPC_BACKEND_IO_URING ? "io_uring" : "epoll");
    assert_int_equal(pthread_create(&t->thread, NULL, run_thread, t), 0);
}

static struct shmipc__server_stats srv_stop(struct srv *t)
{
    struct shmipc__server_stats st;
    assert_int_equal(shmipc_server_stop(t->s), 0);
    assert_int_equal(pthread_join(t->thread, NULL), 0);
    assert_int_equal(t->run_rc, 0);
    shmipc__server_stats(t->s, &st);
    shmipc_server_close(t->s);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* The client */

static int client_connect(int port)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int one = 1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sin, sizeof sin) != 0)
        fail_msg("connect: %s", strerror(errno));
    assert_int_equal(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one), 0);
    assert_int_equal(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
    return fd;
}

/* Where the response head ends in `b` (just past its blank line), or 0. */
static size_t head_end(const struct fx_bytes *b)
{
    for (size_t i = 3; i < b->n; i++)
        if (memcmp(b->p + i - 3, "\r\n\r\n", 4) == 0)
            return i + 1;
    return 0;
}

/*
 * Writes `out` (in pieces of `piece` bytes after the first `first` bytes; 0: as it goes) and
 * reads at the same time, as a client that reads while it sends, until the server closes
 * (until_eof) or `want` bytes followed the response head and 100 ms passed with nothing more.
 * Returns what came.
 */
static void exchange(int fd, const struct fx_bytes *out, size_t first, size_t piece, int until_eof,
                     size_t want, struct fx_bytes *got)
{
    uint64_t end = mono_ms() + 20000, quiet_since = 0;
    size_t sent = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN | (sent < out->n ? POLLOUT : 0)};
        size_t h = head_end(got);
        if (!until_eof && h > 0 && got->n - h >= want && sent == out->n) {
            if (quiet_since == 0)
                quiet_since = mono_ms();
            else if (mono_ms() - quiet_since > 100)
                return;
        }
        if (mono_ms() > end)
            fail_msg("exchange: timed out with %zu of %zu bytes sent, %zu received", sent, out->n,
                     got->n);
        int n = poll(&p, 1, 10);
        if (n < 0 && errno == EINTR)
            continue;
        assert_true(n >= 0);
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            char buf[65536];
            ssize_t r = read(fd, buf, sizeof buf);
            if (r > 0) {
                fx_put(got, buf, (size_t)r);
                quiet_since = 0;
            } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
                if (!until_eof)
                    fail_msg("exchange: the server closed (%s) after %zu bytes",
                             r == 0 ? "EOF" : strerror(errno), got->n);
                return;
            }
        }
        if ((p.revents & POLLOUT) && sent < out->n) {
            size_t n_out = out->n - sent;
            if (piece > 0 && sent >= first && n_out > piece)
                n_out = piece;
            else if (piece > 0 && sent < first)
                n_out = first - sent;
            ssize_t w = send(fd, out->p + sent, n_out, MSG_NOSIGNAL);
            if (w > 0)
                sent += (size_t)w;
            else if (w < 0 && errno != EAGAIN && errno != EINTR) {
                /* A server that failed the connection may reset it mid-send. */
                if (until_eof)
                    sent = out->n;
                else
                    fail_msg("exchange: send: %s", strerror(errno));
            }
        }
    }
}

/* The response without its Date line (the only header that changes from run to run). */
static void strip_date(struct fx_bytes *b)
{
    char *d = memmem(b->p, b->n, "\r\nDate: ", 8);
    size_t h = head_end(b);
    if (d == NULL || (size_t)(d - b->p) >= h)
        return;
    char *e = memmem(d + 2, b->n - (size_t)(d + 2 - b->p), "\r\n", 2);
    assert_non_null(e);
    memmove(d, e, b->n - (size_t)(e - b->p));
    b->n -= (size_t)(e - d);
    b->p[b->n] = 0;
}

static const char default_request[] = "GET /chat HTTP/1.1\r\n"
                                      "Host: server.example.com\r\n"
                                      "Upgrade: websocket\r\n"
                                      "Connection: Upgrade\r\n"
                                      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                                      "Sec-WebSocket-Version: 13\r\n"
                                      "\r\n";

/* ---------------------------------------------------------------------------------------- */
/* The fixtures over a socket */

/* One connection of a fixture: the bytes in `piece`-byte writes after the request (0: all in
 * one go, the frames in the request's packet). */
static void fixture_connection(const struct fixture *f, struct srv *t, struct app *a, size_t piece,
                               const char *how)
{
    struct fx_bytes out = {0}, got = {0};
    size_t req_len;
    int accepted, until_eof;
    fx_put(&out, "", 0);
    fx_put(&got, "", 0);
    if (f->has_request)
        fx_put(&out, f->request.p, f->request.n);
    else
        fx_put(&out, default_request, sizeof default_request - 1);
    req_len = out.n;
    /* A server reads a declared body as HTTP before it answers the request (0.2.13): the
     * client sends it. */
    const char *cl = strcasestr(out.p, "\r\nContent-Length: ");
    if (cl != NULL && !f->has_out)
        for (long k = strtol(cl + 18, NULL, 10); k > 0; k--)
            fx_put(&out, "x", 1);
    fx_put(&out, f->in.p, f->in.n);
    /* A handshake-only case ends with the head (101) or the connection (errors). */
    accepted = !f->has_response || memcmp(f->response.p, "HTTP/1.1 101 ", 13) == 0;
    until_eof = !accepted || f->closed == 1;

    int fd = client_connect(t->port);
    exchange(fd, &out, req_len, piece, until_eof, f->has_out ? f->out.n : 0, &got);
    int closes_before = atomic_load(&a->closes);
    close(fd);

    strip_date(&got);
    size_t h = head_end(&got);
    if (h == 0)
        fail_msg("%s (%s): no response head in %zu bytes", f->path, how, got.n);
    struct fx_bytes head = {0}, frames = {0};
    fx_put(&head, got.p, h);
    fx_put(&frames, got.p + h, got.n - h);
    if (f->has_response) {
        if (!f->has_out)
            assert_bytes_equal("response", &got, &f->response);
        else
            assert_bytes_equal("response head", &head, &f->response);
    } else if (memcmp(head.p, "HTTP/1.1 101 Switching Protocols\r\n", 34) != 0) {
        fail_msg("%s (%s): not a 101: %s", f->path, how, head.p);
    }
    if (accepted && (f->has_out || !f->has_response)) {
        if (frames.n != f->out.n || memcmp(frames.p, f->out.p, f->out.n) != 0) {
            print_message("%s: sent %s\n", f->path, how);
            assert_bytes_equal("frames", &frames, &f->out);
        }
    }

    /* on_close runs once for an accepted connection; a connection the fixture leaves open
     * ends with the client's drop (1006), and not before. */
    if (accepted) {
        WAIT_UNTIL(atomic_load(&a->closes) == 1);
        if (f->closed == 1 && f->close_code > 0)
            assert_int_equal(atomic_load(&a->close_code), f->close_code);
        if (f->closed == 0) {
            assert_int_equal(closes_before, 0);
            assert_int_equal(atomic_load(&a->close_code), 1006);
        }
        assert_int_equal(atomic_load(&a->opens), 1);
    } else {
        usleep(1000);
        assert_int_equal(atomic_load(&a->opens), 0);
        assert_int_equal(atomic_load(&a->closes), 0);
    }
    if (f->has_messages) {
        pthread_mutex_lock(&a->mu);
        if (a->messages.n != f->messages.n ||
            memcmp(a->messages.p, f->messages.p, f->messages.n) != 0) {
            print_message("%s: sent %s: the messages differ\n", f->path, how);
            assert_string_equal(a->messages.p, f->messages.p);
        }
        pthread_mutex_unlock(&a->mu);
    }
    assert_int_equal(atomic_load(&a->send_errors), 0);
    app_reset(a);
    free(head.p);
    free(frames.p);
    free(out.p);
    free(got.p);
}

static void server_fixture(void **state)
{
    const char *path = *state;
    struct fixture f;
    struct srv t;
    struct app a;
    char protocols[300] = "";
    fixture_load(path, &f);
    app_init(&a);
    a.echo = f.echo;
    a.app_close = f.app_closes ? f.app_close : 0;
    srv_new(&t, &f.limits);
    for (size_t i = 0; i < f.nprotocols; i++) {
        if (i > 0)
            strcat(protocols, ",");
        strcat(protocols, f.protocols[i]);
    }
    CHECK(shmipc_server_websocket(t.s, "/chat", f.nprotocols ? protocols : NULL, app_open,
                                  app_message, app_close_cb, &a, NULL));
    srv_run(&t);
    fixture_connection(&f, &t, &a, 0, "in one write with the request");
    if (f.split && f.in.n > 1 && f.in.n <= 2048)
        fixture_connection(&f, &t, &a, 1, "one byte per write after the request");
    srv_stop(&t);
    app_free(&a);
    fixture_free(&f);
}

/* ---------------------------------------------------------------------------------------- */
/* Server behaviours */

/* A masked client frame (key 0: the payload goes as it is, which the server unmasks alike). */
static void client_frame(struct fx_bytes *b, unsigned op, const void *data, size_t len)
{
    static const char key[4] = {0x11, 0x22, 0x33, 0x44};
    fx_put_byte(b, 0x80 | op);
    if (len < 126) {
        fx_put_byte(b, 0x80 | (unsigned)len);
    } else if (len <= 0xffff) {
        fx_put_byte(b, 0x80 | 126);
        fx_put_byte(b, (unsigned)(len >> 8));
        fx_put_byte(b, (unsigned)len & 0xff);
    } else {
        fx_put_byte(b, 0x80 | 127);
        for (int i = 7; i >= 0; i--)
            fx_put_byte(b, (unsigned)((uint64_t)len >> (8 * i)) & 0xff);
    }
    fx_put(b, key, 4);
    size_t at = b->n;
    fx_put(b, data, len);
    for (size_t i = 0; i < len; i++)
        b->p[at + i] ^= key[i & 3];
}

/* Connects and upgrades on `path`; returns the socket (non-blocking) with the 101 read. */
static int ws_connect(int port, const char *path)
{
    char req[512];
    struct fx_bytes got = {0}, none = {0};
    int fd = client_connect(port);
    int n = snprintf(req, sizeof req,
                     "GET %s HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     "Sec-WebSocket-Version: 13\r\n\r\n",
                     path);
    fx_put(&got, "", 0);
    fx_put(&none, req, (size_t)n);
    assert_int_equal(send(fd, none.p, none.n, MSG_NOSIGNAL), (ssize_t)none.n);
    /* Up to the end of the head only: a server that pings may follow it with frames soon. */
    uint64_t end = mono_ms() + 10000;
    while (head_end(&got) == 0) {
        ssize_t r = read(fd, req, 1);
        if (r == 1)
            fx_put(&got, req, 1);
        else if (r == 0 || (errno != EAGAIN && errno != EINTR))
            fail_msg("ws_connect: the server closed after %zu bytes", got.n);
        else
            usleep(200);
        assert_true(mono_ms() < end);
    }
    assert_int_equal(memcmp(got.p, "HTTP/1.1 101 ", 13), 0);
    assert_int_equal(got.n, head_end(&got));
    free(got.p);
    free(none.p);
    return fd;
}

/* Reads server frames from `buf` (a stream) and checks each is an unmasked binary frame whose
 * payload continues the pattern; returns the payload bytes checked. */
static size_t check_echo_stream(const struct fx_bytes *got, size_t *pos, size_t msg_len)
{
    size_t checked = 0;
    while (got->n - *pos >= 4 + msg_len) {
        const unsigned char *h = (const unsigned char *)got->p + *pos;
        assert_int_equal(h[0], 0x82);
        assert_int_equal(h[1], 126);
        assert_int_equal((size_t)h[2] << 8 | h[3], msg_len);
        *pos += 4 + msg_len;
        checked += msg_len;
    }
    return checked;
}

/*
 * Autobahn family 9's cousin: a client sends 1 KiB messages to the echo and never reads. The
 * server's queue reaches its high-water mark, it stops reading, TCP stops the client: the
 * client's writes block while the server holds about tx_high_water bytes, whatever the client
 * tried to send. Then the client reads, and every echo arrives, in order. An idle timeout of
 * 100 ms does not fire meanwhile: while paused, the silence is the server's own.
 */
static void backpressure_client_never_reads(void **state)
{
    struct srv t;
    struct app a;
    struct fx_bytes msgs = {0}, got = {0};
    unsigned char payload[1024];
    size_t sent = 0, pos = 0, echoed = 0, limit = 256u << 20;
    struct shmipc__server_stats st;
    (void)state;

    /* An idle timeout shorter than the 300 ms the client stays blocked: it does not count
     * while the server itself is not reading. */
    struct srv_opts o = {.ws_idle_ms = 100};
    app_init(&a);
    srv_new_opts(&t, NULL, &o);
    const size_t high_water = t.s->ws_limits.tx_high_water;
    CHECK(shmipc_server_websocket(t.s, "/echo", NULL, NULL, app_message, NULL, &a, NULL));
    srv_run(&t);
    int fd = ws_connect(t.port, "/echo");
    memset(payload, 'x', sizeof payload);
    fx_put(&msgs, "", 0);
    for (int i = 0; i < 64; i++)
        client_frame(&msgs, 2, payload, sizeof payload);
    /* Send until the writes have blocked for 300 ms (the server stopped reading). */
    uint64_t blocked_since = 0;
    while (sent < limit) {
        ssize_t w = send(fd, msgs.p + sent % msgs.n, msgs.n - sent % msgs.n, MSG_NOSIGNAL);
        if (w > 0) {
            sent += (size_t)w;
            blocked_since = 0;
            continue;
        }
        assert_true(errno == EAGAIN || errno == EINTR);
        if (blocked_since == 0)
            blocked_since = mono_ms();
        else if (mono_ms() - blocked_since > 300)
            break;
        usleep(1000);
    }
    assert_true(sent < limit);
    print_message("%s: the client sent %zu bytes before the server stopped reading it\n",
                  suite_backend == SHMIPC_BACKEND_IO_URING ? "io_uring" : "epoll", sent);
    /* Finish on a frame boundary, then read every echo while sending the rest. */
    size_t frame = msgs.n / 64;
    struct fx_bytes tail = {0};
    fx_put(&tail, "", 0);
    fx_put(&tail, msgs.p + sent % frame, (frame - sent % frame) % frame);
    client_frame(&tail, 8, "\x03\xe8", 2);
    size_t total = (sent + tail.n - 8) / frame * sizeof payload;
    fx_put(&got, "", 0);
    exchange(fd, &tail, 0, 0, 1, 0, &got);
    close(fd);
    echoed = check_echo_stream(&got, &pos, sizeof payload);
    assert_int_equal(echoed, total);
    assert_int_equal(got.n - pos, 4); /* the close echo */
    st = srv_stop(&t);
    print_message("server: %llu pauses; at most %llu bytes queued (high water %zu)\n",
                  (unsigned long long)st.ws_pauses, (unsigned long long)st.ws_tx_max, high_water);
    /* The client got more than the mark's worth into the server before it blocked: without
     * backpressure the queue would have held it. */
    assert_true(sent > high_water);
    assert_true(st.ws_pauses >= 1);
    /* PAUSE comes after the receive that crossed the mark, and what the reactor holds for a
     * paused connection comes back a receive at a time: the queue stays within a few receive
     * buffers of the mark. */
    assert_true(st.ws_tx_max < high_water + (64u << 10));
    assert_int_equal(atomic_load(&a.send_errors), 0);
    assert_int_equal(st.ws_idle_closes, 0);
    free(msgs.p);
    free(tail.p);
    free(got.p);
    app_free(&a);
}

/*
 * The application sends 256 KiB messages to a client that does not read until a send is
 * refused: SHMIPC_EAGAIN at the send queue's limit, and the queue never beyond it. Then the
 * client reads it all, with the keep-alive timeout (the stall timer) at 1 s.
 */
static void backpressure_application_flood(void **state)
{
    struct srv t;
    struct app a;
    struct fx_bytes hello = {0}, got = {0}, none = {0};
    struct shmipc__server_stats st;
    size_t pos = 0;
    (void)state;

    /* A keep-alive timeout of 1 s: a client that reads is never taken for stalled. */
    struct srv_opts o = {.keepalive_ms = 1000};
    app_init(&a);
    srv_new_opts(&t, NULL, &o);
    const size_t tx_limit = t.s->ws_limits.tx_limit;
    CHECK(shmipc_server_websocket(t.s, "/flood", NULL, NULL, flood_message, NULL, &a, NULL));
    srv_run(&t);
    int fd = ws_connect(t.port, "/flood");
    fx_put(&hello, "", 0);
    client_frame(&hello, 1, "go", 2);
    assert_int_equal(send(fd, hello.p, hello.n, MSG_NOSIGNAL), (ssize_t)hello.n);
    WAIT_UNTIL(atomic_load(&a.flood_refused) + atomic_load(&a.send_errors) > 0);
    assert_int_equal(atomic_load(&a.send_errors), 0);
    int flooded = atomic_load(&a.flood_sent);
    assert_true((size_t)flooded * sizeof flood_block >= tx_limit);
    /* Read it all: every message arrives whole. */
    fx_put(&got, "", 0);
    fx_put(&none, "", 0);
    uint64_t end = mono_ms() + 20000;
    size_t want = (size_t)flooded * (10 + sizeof flood_block);
    while (got.n < want) {
        char buf[65536];
        ssize_t r = read(fd, buf, sizeof buf);
        if (r > 0)
            fx_put(&got, buf, (size_t)r);
        else if (r == 0)
            fail_msg("EOF after %zu bytes", got.n);
        else
            usleep(500);
        assert_true(mono_ms() < end);
    }
    for (int i = 0; i < flooded; i++) {
        const unsigned char *h = (const unsigned char *)got.p + pos;
        assert_int_equal(h[0], 0x82);
        assert_int_equal(h[1], 127);
        pos += 10 + sizeof flood_block;
    }
    close(fd);
    st = srv_stop(&t);
    print_message("flood: %d messages of 256 KiB queued before SHMIPC_EAGAIN; at most %llu bytes "
                  "queued (limit %zu)\n",
                  flooded, (unsigned long long)st.ws_tx_max, tx_limit);
    assert_true(st.ws_tx_max <= tx_limit + sizeof flood_block + 14);
    assert_int_equal(st.ws_stall_closes, 0);
    free(hello.p);
    free(got.p);
    free(none.p);
    app_free(&a);
}

static int h_plain(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    (void)ud;
    return shmipc_http_response_body(res, "plain", 5);
}

/* Sends `req` on a fresh connection and returns the whole response (the server closes). */
static void http_once(int port, const char *req, struct fx_bytes *got)
{
    struct fx_bytes out = {0};
    int fd = client_connect(port);
    fx_put(&out, req, strlen(req));
    fx_put(got, "", 0);
    exchange(fd, &out, 0, 0, 1, 0, got);
    close(fd);
    free(out.p);
}

/*
 * Routing (family 0): a GET route on a WebSocket path keeps answering plain GETs; other
 * requests there are handshakes (400); a prefix WebSocket route; the application's refusal is
 * a 403; a path with no route is a 404. HTTP keeps working on the other paths.
 */
static void upgrade_routing(void **state)
{
    struct srv t;
    struct app a, refuse;
    struct fx_bytes got = {0};
    (void)state;
    app_init(&a);
    app_init(&refuse);
    refuse.refuse = 1;
    srv_new(&t, NULL);
    CHECK(shmipc_server_route(t.s, "GET", "/both", h_plain, NULL, NULL));
    CHECK(
        shmipc_server_websocket(t.s, "/both", NULL, app_open, app_message, app_close_cb, &a, NULL));
    CHECK(shmipc_server_websocket(t.s, "/rooms/*", "a,b", app_open, app_message, app_close_cb, &a,
                                  NULL));
    CHECK(shmipc_server_websocket(t.s, "/no", NULL, app_open, app_message, app_close_cb, &refuse,
                                  NULL));
    assert_int_equal(
        shmipc_server_websocket(t.s, "/both", NULL, NULL, app_message, NULL, NULL, NULL),
        SHMIPC_EEXIST);
    assert_int_equal(
        shmipc_server_websocket(t.s, "/bad", "a,,b", NULL, app_message, NULL, NULL, NULL),
        SHMIPC_EINVAL);
    assert_int_equal(
        shmipc_server_websocket(t.s, "nope", NULL, NULL, app_message, NULL, NULL, NULL),
        SHMIPC_EINVAL);
    srv_run(&t);

    http_once(t.port, "GET /both HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", &got);
    assert_non_null(strstr(got.p, "HTTP/1.1 200 OK\r\n"));
    assert_non_null(strstr(got.p, "\r\n\r\nplain"));
    got.n = 0;
    http_once(t.port, "POST /both HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", &got);
    assert_non_null(strstr(got.p, "HTTP/1.1 400 Bad Request\r\n"));
    got.n = 0;
    http_once(t.port,
              "GET /rooms/7 HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n\r\n",
              &got);
    assert_non_null(strstr(got.p, "HTTP/1.1 426 Upgrade Required\r\n"));
    assert_non_null(strstr(got.p, "Sec-WebSocket-Version: 13\r\n"));
    got.n = 0;
    http_once(t.port,
              "GET /no HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
              &got);
    assert_non_null(strstr(got.p, "HTTP/1.1 403 Forbidden\r\n"));
    got.n = 0;
    http_once(t.port, "GET /nothing HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", &got);
    assert_non_null(strstr(got.p, "HTTP/1.1 404 "));

    /* The prefix route upgrades, with the subprotocol the client offers. */
    struct fx_bytes out = {0};
    fx_put(&out, "", 0);
    const char *up =
        "GET /rooms/blue HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Protocol: b\r\n\r\n";
    fx_put(&out, up, strlen(up));
    client_frame(&out, 1, "hi", 2);
    client_frame(&out, 8, "\x03\xe8", 2);
    got.n = 0;
    int fd = client_connect(t.port);
    exchange(fd, &out, 0, 0, 1, 0, &got);
    close(fd);
    assert_non_null(strstr(got.p, "HTTP/1.1 101 Switching Protocols\r\n"));
    assert_non_null(strstr(got.p, "Sec-WebSocket-Protocol: b\r\n"));
    size_t h = head_end(&got);
    assert_int_equal(got.n - h, 8);
    assert_memory_equal(got.p + h, "\x81\x02hi\x88\x02\x03\xe8", 8);
    WAIT_UNTIL(atomic_load(&a.closes) == 1);
    assert_int_equal(atomic_load(&a.close_code), 1000);
    assert_int_equal(atomic_load(&refuse.opens), 0);
    assert_int_equal(atomic_load(&refuse.closes), 0);
    struct shmipc__server_stats st = srv_stop(&t);
    assert_int_equal(st.ws_upgrades, 1);
    free(out.p);
    free(got.p);
    app_free(&a);
    app_free(&refuse);
}

/* Starts a server (options O, may be NULL) with app A on /ws, opens a WebSocket, stops the
 * server and reads the stop's close frame (1001) within 5 s. Returns the client's socket. */
static int ws_open_then_stop(struct srv *t, struct app *a, const struct srv_opts *o)
{
    struct fx_bytes got = {0};
    app_init(a);
    srv_new_opts(t, NULL, o);
    CHECK(shmipc_server_websocket(t->s, "/ws", NULL, app_open, app_message, app_close_cb, a, NULL));
    srv_run(t);
    int fd = ws_connect(t->port, "/ws");
    WAIT_UNTIL(atomic_load(&a->opens) == 1);
    assert_int_equal(shmipc_server_stop(t->s), 0);
    fx_put(&got, "", 0);
    uint64_t end = mono_ms() + 5000;
    while (got.n < 4) {
        char buf[16];
        ssize_t r = read(fd, buf, sizeof buf);
        if (r > 0)
            fx_put(&got, buf, (size_t)r);
        else
            usleep(500);
        assert_true(mono_ms() < end);
    }
    assert_memory_equal(got.p, "\x88\x02\x03\xe9", 4);
    free(got.p);
    return fd;
}

/* A graceful stop sends open WebSockets a close frame with 1001; the client's answer ends
 * them (on_close with 1001). */
static void stop_sends_going_away(void **state)
{
    struct srv t;
    struct app a;
    struct fx_bytes answer = {0};
    (void)state;
    int fd = ws_open_then_stop(&t, &a, NULL);
    uint64_t end = mono_ms() + 5000;
    fx_put(&answer, "", 0);
    client_frame(&answer, 8, "\x03\xe9", 2);
    assert_int_equal(send(fd, answer.p, answer.n, MSG_NOSIGNAL), (ssize_t)answer.n);
    /* The server closes first: its FIN, then ours. */
    for (;;) {
        char buf[16];
        ssize_t r = read(fd, buf, sizeof buf);
        if (r == 0)
            break;
        assert_true(r < 0 && (errno == EAGAIN || errno == EINTR));
        assert_true(mono_ms() < end);
        usleep(500);
    }
    close(fd);
    assert_int_equal(pthread_join(t.thread, NULL), 0);
    assert_int_equal(t.run_rc, 0);
    assert_int_equal(atomic_load(&a.closes), 1);
    assert_int_equal(atomic_load(&a.close_code), 1001);
    shmipc_server_close(t.s);
    free(answer.p);
    app_free(&a);
}

/* ---------------------------------------------------------------------------------------- */
/* Timeouts and the public limits */

/*
 * Issue 1: a client sends to the echo and never reads, so the server pauses it; its output
 * then makes no progress, and after the keep-alive timeout (300 ms here) the server closes it
 * (on_close 1006) and frees what was queued. The high-water mark is set through the public
 * limit (64 KiB), and the connection must have been paused first.
 */
static void stall_paused_reader_closed(void **state)
{
    struct srv t;
    struct app a;
    struct srv_opts o = {.keepalive_ms = 300, .high_water = 64u << 10, .send_limit = 256u << 10};
    struct fx_bytes msgs = {0};
    unsigned char payload[1024];
    size_t sent = 0;
    uint64_t blocked_since = 0, closed_at;
    struct shmipc__server_stats st;
    (void)state;

    app_init(&a);
    srv_new_opts(&t, NULL, &o);
    CHECK(
        shmipc_server_websocket(t.s, "/echo", NULL, app_open, app_message, app_close_cb, &a, NULL));
    srv_run(&t);
    int fd = ws_connect(t.port, "/echo");
    memset(payload, 'x', sizeof payload);
    fx_put(&msgs, "", 0);
    for (int i = 0; i < 64; i++)
        client_frame(&msgs, 2, payload, sizeof payload);
    /* Send until the writes have blocked for 50 ms: the server stopped reading. */
    for (;;) {
        ssize_t w = send(fd, msgs.p + sent % msgs.n, msgs.n - sent % msgs.n, MSG_NOSIGNAL);
        if (w > 0) {
            sent += (size_t)w;
            blocked_since = 0;
            continue;
        }
        if (w < 0 && (errno == EPIPE || errno == ECONNRESET))
            break; /* already closed: checked below */
        assert_true(errno == EAGAIN || errno == EINTR);
        if (blocked_since == 0)
            blocked_since = mono_ms();
        else if (mono_ms() - blocked_since > 50)
            break;
        assert_true(sent < (256u << 20));
        usleep(1000);
    }
    WAIT_UNTIL(atomic_load(&a.closes) == 1);
    closed_at = mono_ms();
    assert_int_equal(atomic_load(&a.close_code), 1006);
    /* Not before the keep-alive timeout after the client blocked (the last progress was no
     * later than that), and not long after two of them (the timer's granularity). */
    assert_true(blocked_since != 0);
    print_message("%s: closed %llu ms after the client's writes blocked (keep-alive 300 ms)\n",
                  suite_backend == SHMIPC_BACKEND_IO_URING ? "io_uring" : "epoll",
                  (unsigned long long)(closed_at - blocked_since));
    assert_true(closed_at - blocked_since < 5000);
    close(fd);
    st = srv_stop(&t);
    assert_true(st.ws_pauses >= 1);
    assert_int_equal(st.ws_stall_closes, 1);
    assert_int_equal(st.ws_idle_closes, 0);
    assert_true(st.ws_tx_max < o.high_water + (64u << 10) + (16u << 10));
    free(msgs.p);
    app_free(&a);
}

/*
 * Regression: a WebSocket handshake pipelined behind a large response, from a client that
 * reads nothing. The 101 leaves in the same batch as that response, and once it is queued the
 * connection is a WebSocket, whose send timeout ran only for its own frames: the HTTP batch
 * still in flight had none (the HTTP timers end at the upgrade), so with the ping and idle
 * timeouts off (the default) the connection and the response's memory were held until the
 * server stopped, instead of failing (1006) after the keep-alive timeout without progress.
 */
static void stall_before_pipelined_upgrade_closed(void **state)
{
    enum { BIG = 16u << 20 };
    struct srv t;
    struct app a;
    struct srv_opts o = {.keepalive_ms = 300};
    char *big = calloc(1, BIG);
    char req[512];
    int rcv = 4096;
    (void)state;
    assert_non_null(big);

    app_init(&a);
    srv_new_opts(&t, NULL, &o);
    CHECK(shmipc_server_static(t.s, "GET", "/big", 200, "application/octet-stream", big, BIG));
    CHECK(
        shmipc_server_websocket(t.s, "/echo", NULL, app_open, app_message, app_close_cb, &a, NULL));
    srv_run(&t);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)t.port)};
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv), 0);
    if (connect(fd, (struct sockaddr *)&sin, sizeof sin) != 0)
        fail_msg("connect: %s", strerror(errno));
    int n =
        snprintf(req, sizeof req,
                 "GET /big HTTP/1.1\r\nHost: a\r\n\r\n"
                 "GET /echo HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 "Sec-WebSocket-Version: 13\r\n\r\n");
    assert_int_equal(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
    /* Nothing is read: the server's send timeout (300 ms without progress) must end it. */
    WAIT_UNTIL(atomic_load(&a.opens) == 1);
    uint64_t end = mono_ms() + 5000;
    while (atomic_load(&a.closes) == 0 && mono_ms() < end)
        usleep(1000);
    if (atomic_load(&a.closes) == 0)
        fail_msg("a client that reads nothing still held its upgraded connection after 5 s");
    assert_int_equal(atomic_load(&a.close_code), 1006);
    close(fd);
    struct shmipc__server_stats st = srv_stop(&t);
    assert_int_equal(st.ws_stall_closes, 1);
    free(big);
    app_free(&a);
}

/*
 * Reads what the server sends for `ms` (or until it closes): answers each ping with a pong
 * when `answer`, counts pings and other frames. Returns 1 when the server closed.
 */
static int idle_client(int fd, int answer, uint64_t ms, int *pings, int *others)
{
    struct fx_bytes in = {0};
    uint64_t end = mono_ms() + ms;
    int closed = 0;
    fx_put(&in, "", 0);
    while (mono_ms() < end && !closed) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        char buf[4096];
        if (poll(&p, 1, 5) <= 0)
            continue;
        ssize_t r = read(fd, buf, sizeof buf);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
            closed = 1;
            break;
        }
        if (r > 0)
            fx_put(&in, buf, (size_t)r);
        /* Server frames: unmasked, and here all short (control frames). */
        while (in.n >= 2 && in.n >= 2 + (size_t)(in.p[1] & 0x7f)) {
            unsigned op = (unsigned char)in.p[0] & 0x0f, len = (unsigned char)in.p[1] & 0x7f;
            assert_true(len < 126);
            if (op == 9) {
                (*pings)++;
                if (answer) {
                    struct fx_bytes pong = {0};
                    fx_put(&pong, "", 0);
                    client_frame(&pong, 10, in.p + 2, len);
                    assert_int_equal(send(fd, pong.p, pong.n, MSG_NOSIGNAL), (ssize_t)pong.n);
                    free(pong.p);
                }
            } else {
                (*others)++;
            }
            memmove(in.p, in.p + 2 + len, in.n - 2 - len);
            in.n -= 2 + len;
        }
    }
    free(in.p);
    return closed;
}

/* Ends an open connection with a close handshake (1000) and checks the echo and on_close. */
static void close_politely(int fd, struct app *a)
{
    struct fx_bytes out = {0}, got = {0};
    fx_put(&out, "", 0);
    fx_put(&got, "", 0);
    client_frame(&out, 8, "\x03\xe8", 2);
    exchange(fd, &out, 0, 0, 1, 0, &got);
    assert_int_equal(got.n, 4);
    assert_memory_equal(got.p, "\x88\x02\x03\xe8", 4);
    WAIT_UNTIL(atomic_load(&a->closes) == 1);
    assert_int_equal(atomic_load(&a->close_code), 1000);
    free(out.p);
    free(got.p);
}

/*
 * Issue 2: with a ping every 100 ms of silence and an idle timeout of 500 ms, a client that
 * answers the pings is still open after 1.5 s (three idle timeouts), pinged all along.
 */
static void idle_pong_keeps_open(void **state)
{
    struct srv t;
    struct app a;
    struct srv_opts o = {.ws_ping_ms = 100, .ws_idle_ms = 500};
    int pings = 0, others = 0;
    (void)state;
    app_init(&a);
    srv_new_opts(&t, NULL, &o);
    CHECK(shmipc_server_websocket(t.s, "/ws", NULL, app_open, app_message, app_close_cb, &a, NULL));
    srv_run(&t);
    int fd = ws_connect(t.port, "/ws");
    assert_int_equal(idle_client(fd, 1, 1500, &pings, &others), 0);
    assert_int_equal(atomic_load(&a.closes), 0);
    assert_int_equal(others, 0);
    /* A ping one to two intervals after each pong: 7 to 15 in 1.5 s on a quiet machine. */
    assert_true(pings >= 4);
    close_politely(fd, &a);
    close(fd);
    struct shmipc__server_stats st = srv_stop(&t);
    assert_int_equal(st.ws_idle_closes, 0);
    assert_int_equal(st.ws_pings, (uint64_t)pings);
    app_free(&a);
}

/*
 * Issue 2: a client that does not answer the pings is failed after the idle timeout (on_close
 * 1006, the TCP connection closed without a close frame); with only an idle timeout set no
 * ping is sent and the silent client is failed alike.
 */
static void idle_silent_client_closed(void **state)
{
    static const struct srv_opts opts[] = {{.ws_ping_ms = 100, .ws_idle_ms = 400},
                                           {.ws_idle_ms = 300}};
    (void)state;
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        struct srv t;
        struct app a;
        int pings = 0, others = 0;
        app_init(&a);
        srv_new_opts(&t, NULL, &opts[i]);
        CHECK(shmipc_server_websocket(t.s, "/ws", NULL, app_open, app_message, app_close_cb, &a,
                                      NULL));
        srv_run(&t);
        int fd = ws_connect(t.port, "/ws");
        uint64_t start = mono_ms();
        assert_int_equal(idle_client(fd, 0, 5000, &pings, &others), 1);
        uint64_t took = mono_ms() - start;
        WAIT_UNTIL(atomic_load(&a.closes) == 1);
        assert_int_equal(atomic_load(&a.close_code), 1006);
        assert_int_equal(others, 0); /* no close frame */
        print_message("ping %u, idle %u: closed after %llu ms, %d pings\n", opts[i].ws_ping_ms,
                      opts[i].ws_idle_ms, (unsigned long long)took, pings);
        assert_true(took + 20 >= opts[i].ws_idle_ms);
        if (opts[i].ws_ping_ms != 0)
            assert_true(pings >= 1 && pings <= 5);
        else
            assert_int_equal(pings, 0);
        close(fd);
        struct shmipc__server_stats st = srv_stop(&t);
        assert_int_equal(st.ws_idle_closes, 1);
        assert_int_equal(st.ws_pings, (uint64_t)pings);
        app_free(&a);
    }
}

/*
 * Issue 2: with the ping and idle timeouts at 0 (the default) a silent connection gets
 * nothing and stays open, even with the HTTP header and keep-alive timeouts at 100 ms (they
 * end at the upgrade).
 */
static void idle_timeouts_off(void **state)
{
    struct srv t;
    struct app a;
    struct srv_opts o = {.keepalive_ms = 100, .header_ms = 100};
    int pings = 0, others = 0;
    (void)state;
    app_init(&a);
    srv_new_opts(&t, NULL, &o);
    CHECK(shmipc_server_websocket(t.s, "/ws", NULL, app_open, app_message, app_close_cb, &a, NULL));
    srv_run(&t);
    int fd = ws_connect(t.port, "/ws");
    assert_int_equal(idle_client(fd, 1, 600, &pings, &others), 0);
    assert_int_equal(pings, 0);
    assert_int_equal(others, 0);
    assert_int_equal(atomic_load(&a.closes), 0);
    close_politely(fd, &a);
    close(fd);
    struct shmipc__server_stats st = srv_stop(&t);
    assert_int_equal(st.ws_pings, 0);
    assert_int_equal(st.ws_idle_closes + st.ws_stall_closes + st.timeouts, 0);
    app_free(&a);
}

#define REFUSED(call)                                                                              \
    do {                                                                                           \
        assert_int_equal((call), SHMIPC_EINVAL);                                                   \
        assert_true(strlen(shmipc_error_detail()) > 0);                                            \
    } while (0)

/* The new timeouts and limits: numbering, ranges, and the checks between them. */
static void config_ws_timeouts_and_limits(void **state)
{
    shmipc_server_config *cfg;
    shmipc_server *s;
    (void)state;
    /* Appended to the enums: the earlier values keep their numbers. */
    assert_int_equal(SHMIPC_SERVER_TIMEOUT_STOP, 2);
    assert_int_equal(SHMIPC_SERVER_TIMEOUT_WS_PING, 3);
    assert_int_equal(SHMIPC_SERVER_TIMEOUT_WS_IDLE, 4);
    assert_int_equal(SHMIPC_SERVER_LIMIT_WS_MESSAGE, 5);
    assert_int_equal(SHMIPC_SERVER_LIMIT_WS_SEND_HIGH_WATER, 6);
    assert_int_equal(SHMIPC_SERVER_LIMIT_WS_SEND_LIMIT, 7);
    assert_int_equal(SHMIPC_SERVER_LIMIT_KEEPALIVE_REQUESTS, 8);

    CHECK(shmipc_server_config_new(&cfg));
    /* Defaults: no ping, no idle timeout, 1 MiB and 16 MiB. */
    CHECK(shmipc_server_new(cfg, &s));
    assert_int_equal(s->ws_ping_ms, 0);
    assert_int_equal(s->ws_idle_ms, 0);
    assert_int_equal(s->ws_limits.tx_high_water, 1u << 20);
    assert_int_equal(s->ws_limits.tx_limit, 16u << 20);
    shmipc_server_close(s);

    REFUSED(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_PING, 3600001));
    assert_non_null(strstr(shmipc_error_detail(), "ws_ping_timeout"));
    REFUSED(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_IDLE, 3600001));
    assert_non_null(strstr(shmipc_error_detail(), "ws_idle_timeout"));
    REFUSED(shmipc_server_config_set_timeout(cfg, 5, 1000));
    REFUSED(shmipc_server_config_set_timeout(cfg, -1, 1000));
    /* The ping must come before the idle timeout, whichever is set first. */
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_IDLE, 1000));
    REFUSED(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_PING, 1000));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_PING, 999));
    REFUSED(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_IDLE, 999));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_IDLE, -1));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_PING, 3600000));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_PING, -1));
    /* Never is negative: 0 (no wait) means nothing for a ping or an idle timeout. */
    REFUSED(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_PING, 0));
    REFUSED(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_IDLE, 0));
    REFUSED(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_HEADER, 0));

    REFUSED(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_WS_SEND_HIGH_WATER,
                                           (1ull << 30) + 1));
    assert_non_null(strstr(shmipc_error_detail(), "ws_send_high_water"));
    REFUSED(
        shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_WS_SEND_LIMIT, (1ull << 30) + 1));
    REFUSED(shmipc_server_config_set_limit(cfg, 9, 1));
    /* A limit below the (default) high-water mark. */
    REFUSED(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_WS_SEND_LIMIT, 512u << 10));
    assert_non_null(strstr(shmipc_error_detail(), "ws_send_limit"));
    CHECK(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_WS_SEND_HIGH_WATER, 64u << 10));
    CHECK(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_WS_SEND_LIMIT, 256u << 10));
    REFUSED(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_WS_SEND_HIGH_WATER,
                                           (256u << 10) + 1));
    CHECK(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_WS_SEND_HIGH_WATER, 256u << 10));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_PING, 20000));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_IDLE, 60000));
    CHECK(shmipc_server_new(cfg, &s));
    assert_int_equal(s->ws_limits.tx_high_water, 256u << 10);
    assert_int_equal(s->ws_limits.tx_limit, 256u << 10);
    assert_int_equal(s->ws_ping_ms, 20000);
    assert_int_equal(s->ws_idle_ms, 60000);
    shmipc_server_close(s);
    /* 0 restores a default; a high-water mark above 16 MiB lifts the default limit with it. */
    CHECK(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_WS_SEND_LIMIT, 0));
    CHECK(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_WS_SEND_HIGH_WATER, 32u << 20));
    CHECK(shmipc_server_new(cfg, &s));
    assert_int_equal(s->ws_limits.tx_high_water, 32u << 20);
    assert_int_equal(s->ws_limits.tx_limit, 32u << 20);
    shmipc_server_close(s);
    shmipc_server_config_free(cfg);
}

/* ---------------------------------------------------------------------------------------- */
/* Deferred upgrades (shmipc__server_ws_defer / _ws_accept, docs/http.md): a route handler
 * defers a valid handshake and a timer on the connection's loop answers it later, as the
 * front does when its worker answers. */

enum { D_ACCEPT = 0, D_REFUSE = 1 };

struct dapp {
    int mode;
    uint32_t delay_ms;
    struct shmipc__timer timer;
    struct shmipc__server_ticket ticket;
    shmipc_ws *ws;
    atomic_int defer_rc, deferred, fired, accept_rc, bad_rc, cancel_reason;
    atomic_int close_code, messages, pings, late_send_rc;
};

static void d_message(shmipc_ws *ws, int kind, const void *data, size_t len, void *user_data)
{
    struct dapp *d = user_data;
    atomic_fetch_add(&d->messages, 1);
    (void)shmipc__ws_send(ws, kind, data, len);
}

static void d_ping(shmipc_ws *ws, const void *data, size_t len, void *user_data)
{
    struct dapp *d = user_data;
    (void)ws;
    (void)data;
    (void)len;
    atomic_fetch_add(&d->pings, 1);
}

static void d_close(shmipc_ws *ws, int code, const char *reason, size_t len, void *user_data)
{
    struct dapp *d = user_data;
    (void)ws;
    (void)reason;
    (void)len;
    atomic_store(&d->close_code, code);
}

static const struct shmipc__server_ws_cbs d_cbs = {
    .on_message = d_message, .on_ping = d_ping, .on_close = d_close};

static void d_cancel(void *data, int reason)
{
    struct dapp *d = data;
    atomic_store(&d->cancel_reason, reason);
}

static void d_fire(struct shmipc__timer *tm)
{
    struct dapp *d = tm->data;
    int rc;
    if (d->mode == D_REFUSE) {
        rc = shmipc__server_complete(d->ticket, 403, "text/plain", NULL, 0, "refused", 7, NULL,
                                     NULL);
    } else {
        /* The handshake's own fields are the server's: refused, and the deferral stays. */
        struct shmipc__http_header_out bad = {"Connection", "close", 10, 5};
        struct shmipc__http_header_out proto = {"Sec-WebSocket-Protocol", "chat", 22, 4};
        atomic_store(&d->bad_rc, shmipc__server_ws_accept(d->ticket, &bad, 1, &d_cbs, d, &d->ws));
        rc = shmipc__server_ws_accept(d->ticket, &proto, 1, &d_cbs, d, &d->ws);
        /* Sent at once: it follows the 101 on the wire. */
        if (rc == 0)
            atomic_store(&d->late_send_rc, shmipc__ws_send(d->ws, SHMIPC_WS_TEXT, "hello", 5));
    }
    atomic_store(&d->accept_rc, rc);
    atomic_store(&d->fired, 1);
}

static int h_defer(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    struct dapp *d = ud;
    struct shmipc__server_where wh;
    int rc = shmipc__server_ws_defer(res, req, 5000, d_cancel, d, &d->ticket);
    atomic_store(&d->defer_rc, rc);
    if (rc == SHMIPC_EPROTO)
        return 0; /* the 400/426 is the response */
    if (rc < 0 || (rc = shmipc__server_where(res, &wh)) < 0)
        return rc;
    atomic_store(&d->deferred, 1);
    shmipc__timer_init(wh.loop, &d->timer, d_fire, d);
    return shmipc__timer_start(&d->timer, d->delay_ms);
}

static void dapp_init(struct dapp *d, int mode, uint32_t delay_ms)
{
    memset(d, 0, sizeof *d);
    d->mode = mode;
    d->delay_ms = delay_ms;
    atomic_store(&d->accept_rc, 1);
    atomic_store(&d->late_send_rc, 1);
}

static void d_srv(struct srv *t, struct dapp *d)
{
    srv_new(t, NULL);
    CHECK(shmipc_server_route(t->s, "GET", "/front", h_defer, d, NULL));
    srv_run(t);
}

static const char d_request[] =
    "GET /front HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n"
    "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    "Sec-WebSocket-Protocol: x, chat\r\nSec-WebSocket-Version: 13\r\n\r\n";

/* Reads exactly n bytes (10 s at most). */
static void read_exact(int fd, void *buf, size_t n)
{
    size_t got = 0;
    uint64_t end = mono_ms() + 10000;
    while (got < n) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        assert_true(mono_ms() < end);
        (void)poll(&p, 1, 10);
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r > 0)
            got += (size_t)r;
        else if (r == 0 || (errno != EAGAIN && errno != EINTR))
            fail_msg("read_exact: closed after %zu of %zu bytes", got, n);
    }
}

/* Reads one unmasked server frame: its first byte, its payload (malloc'd) and length. */
static unsigned read_frame(int fd, char **payload, size_t *len)
{
    unsigned char h[2], ext[8];
    uint64_t n;
    read_exact(fd, h, 2);
    assert_int_equal(h[1] & 0x80, 0);
    n = h[1] & 0x7f;
    if (n == 126) {
        read_exact(fd, ext, 2);
        n = (uint64_t)ext[0] << 8 | ext[1];
    } else if (n == 127) {
        read_exact(fd, ext, 8);
        n = 0;
        for (int i = 0; i < 8; i++)
            n = n << 8 | ext[i];
    }
    *payload = malloc(n + 1);
    assert_non_null(*payload);
    read_exact(fd, *payload, (size_t)n);
    *len = (size_t)n;
    return h[0];
}

/* Sends the handshake and reads the response head into `head`; returns the socket. */
static int d_handshake(int port, const char *request, struct fx_bytes *head)
{
    char c;
    int fd = client_connect(port);
    assert_int_equal(send(fd, request, strlen(request), MSG_NOSIGNAL), (ssize_t)strlen(request));
    fx_put(head, "", 0);
    while (head_end(head) == 0) {
        read_exact(fd, &c, 1);
        fx_put(head, &c, 1);
    }
    fx_put_byte(head, 0);
    head->n--;
    return fd;
}

static void expect_frame(int fd, unsigned first, const void *data, size_t len)
{
    char *p;
    size_t n;
    assert_int_equal(read_frame(fd, &p, &n), first);
    assert_int_equal(n, len);
    assert_memory_equal(p, data, len);
    free(p);
}

/* Accepted after a delay: the server's accept key and the owner's subprotocol, the owner's
 * first message right behind the 101, echoes both ways (a message of several frames' worth),
 * a ping answered by the server and reported, the client's close echoed and reported. The
 * owner's header that names the handshake's own field was refused without ending the
 * deferral. */
static void deferred_upgrade_accept_after_delay(void **state)
{
    struct srv t;
    struct dapp d;
    struct fx_bytes head = {0}, out = {0};
    static char big[300000];
    (void)state;
    dapp_init(&d, D_ACCEPT, 150);
    d_srv(&t, &d);
    uint64_t t0 = mono_ms();
    int fd = d_handshake(t.port, d_request, &head);
    assert_true(mono_ms() - t0 >= 100); /* the answer waited for the owner */
    assert_int_equal(memcmp(head.p, "HTTP/1.1 101 Switching Protocols\r\n", 34), 0);
    assert_non_null(strstr(head.p, "\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"));
    assert_non_null(strstr(head.p, "\r\nUpgrade: websocket\r\n"));
    assert_non_null(strstr(head.p, "\r\nConnection: Upgrade\r\n"));
    assert_non_null(strstr(head.p, "\r\nSec-WebSocket-Protocol: chat\r\n"));
    assert_null(strstr(head.p, "Content-Length"));
    assert_null(strstr(head.p, "close"));
    WAIT_UNTIL(atomic_load(&d.fired)); /* the 101 may leave before the timer's call returns */
    assert_int_equal(atomic_load(&d.bad_rc), SHMIPC_EINVAL);
    assert_int_equal(atomic_load(&d.accept_rc), 0);
    assert_int_equal(atomic_load(&d.late_send_rc), 0);
    expect_frame(fd, 0x81, "hello", 5);

    client_frame(&out, 0x1, "abc", 3);
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (char)(i * 7 + i / 251);
    client_frame(&out, 0x2, big, sizeof big);
    client_frame(&out, 0x9, "p", 1);
    assert_int_equal(send(fd, out.p, out.n, MSG_NOSIGNAL), (ssize_t)out.n);
    expect_frame(fd, 0x81, "abc", 3);
    expect_frame(fd, 0x82, big, sizeof big);
    expect_frame(fd, 0x8A, "p", 1);
    out.n = 0;
    client_frame(&out, 0x8,
                 "\x03\xe8"
                 "bye",
                 5);
    assert_int_equal(send(fd, out.p, out.n, MSG_NOSIGNAL), (ssize_t)out.n);
    expect_frame(fd, 0x88, "\x03\xe8", 2);
    WAIT_UNTIL(atomic_load(&d.close_code) != 0);
    assert_int_equal(atomic_load(&d.close_code), 1000);
    assert_int_equal(atomic_load(&d.messages), 2);
    assert_int_equal(atomic_load(&d.pings), 1);
    assert_int_equal(atomic_load(&d.cancel_reason), 0);
    close(fd);
    struct shmipc__server_stats st = srv_stop(&t);
    assert_int_equal(st.ws_upgrades, 1);
    free(head.p);
    free(out.p);
}

/* Refused with a 403: a normal response with the owner's body, Connection: close, then the
 * connection ends (frames a client sent behind its head are never read as a request). */
static void deferred_upgrade_refused_403(void **state)
{
    struct srv t;
    struct dapp d;
    struct fx_bytes out = {0}, got = {0};
    (void)state;
    dapp_init(&d, D_REFUSE, 50);
    d_srv(&t, &d);
    int fd = client_connect(t.port);
    fx_put(&out, d_request, strlen(d_request));
    fx_put(&out, "GET /front HTTP/1.1\r\nHost: a\r\n\r\n", 32);
    fx_put(&got, "", 0);
    exchange(fd, &out, 0, 0, 1, 0, &got);
    fx_put_byte(&got, 0);
    assert_int_equal(memcmp(got.p, "HTTP/1.1 403 Forbidden\r\n", 24), 0);
    assert_non_null(strstr(got.p, "\r\nConnection: close\r\n"));
    assert_non_null(strstr(got.p, "\r\n\r\nrefused"));
    assert_int_equal(strstr(got.p, "HTTP/1.1 "), got.p);
    assert_null(strstr(got.p + 1, "HTTP/1.1 ")); /* one response only */
    WAIT_UNTIL(atomic_load(&d.fired));
    assert_int_equal(atomic_load(&d.accept_rc), 0);
    assert_int_equal(atomic_load(&d.close_code), 0);
    close(fd);
    struct shmipc__server_stats st = srv_stop(&t);
    assert_int_equal(st.ws_upgrades, 0);
    free(out.p);
    free(got.p);
}

/* The client leaves while deferred: the deferral is cancelled (CLIENT_GONE), and the owner's
 * later accept is refused as stale; no WebSocket callback ever runs. */
static void deferred_upgrade_client_gone(void **state)
{
    struct srv t;
    struct dapp d;
    (void)state;
    for (int reset = 0; reset < 2; reset++) {
        dapp_init(&d, D_ACCEPT, 1000); /* the client's close comes well before */
        d_srv(&t, &d);
        int fd = client_connect(t.port);
        assert_int_equal(send(fd, d_request, strlen(d_request), MSG_NOSIGNAL),
                         (ssize_t)strlen(d_request));
        WAIT_UNTIL(atomic_load(&d.deferred));
        if (reset) {
            struct linger lg = {1, 0};
            assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg), 0);
        }
        close(fd);
        WAIT_UNTIL(atomic_load(&d.cancel_reason) != 0);
        WAIT_UNTIL(atomic_load(&d.fired));
        assert_int_equal(atomic_load(&d.cancel_reason), SHMIPC__SERVER_CANCEL_CLIENT_GONE);
        assert_int_equal(atomic_load(&d.accept_rc), SHMIPC_ECLOSED);
        assert_int_equal(atomic_load(&d.close_code), 0);
        assert_int_equal(atomic_load(&d.messages), 0);
        struct shmipc__server_stats st = srv_stop(&t);
        assert_int_equal(st.ws_upgrades, 0);
    }
}

/* The server stops while an upgrade is deferred: the owner's later accept is refused
 * (SHMIPC_EPIPE) and the client gets 503 with Connection: close, not a WebSocket the stop
 * would only cut. */
static void deferred_upgrade_accept_while_stopping(void **state)
{
    struct srv t;
    struct dapp d;
    struct fx_bytes out = {0}, got = {0};
    (void)state;
    dapp_init(&d, D_ACCEPT, 300);
    d_srv(&t, &d);
    int fd = client_connect(t.port);
    fx_put(&out, d_request, strlen(d_request));
    assert_int_equal(send(fd, out.p, out.n, MSG_NOSIGNAL), (ssize_t)out.n);
    WAIT_UNTIL(atomic_load(&d.deferred));
    assert_int_equal(shmipc_server_stop(t.s), 0); /* the stop begins; run returns later */
    out.n = 0;
    fx_put(&got, "", 0);
    exchange(fd, &out, 0, 0, 1, 0, &got);
    fx_put_byte(&got, 0);
    assert_int_equal(memcmp(got.p, "HTTP/1.1 503 ", 13), 0);
    assert_non_null(strstr(got.p, "\r\nConnection: close\r\n"));
    WAIT_UNTIL(atomic_load(&d.fired));
    assert_int_equal(atomic_load(&d.accept_rc), SHMIPC_EPIPE);
    assert_int_equal(atomic_load(&d.close_code), 0);
    close(fd);
    struct shmipc__server_stats st = srv_stop(&t);
    assert_int_equal(st.ws_upgrades, 0);
    free(out.p);
    free(got.p);
}

/* An invalid handshake is not deferred: ws_defer answers its 426 or 400 itself. */
static void deferred_upgrade_bad_handshake(void **state)
{
    struct srv t;
    struct dapp d;
    struct fx_bytes got = {0};
    (void)state;
    dapp_init(&d, D_ACCEPT, 10);
    d_srv(&t, &d);
    http_once(t.port,
              "GET /front HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n\r\n",
              &got);
    assert_int_equal(memcmp(got.p, "HTTP/1.1 426 ", 13), 0);
    assert_int_equal(atomic_load(&d.defer_rc), SHMIPC_EPROTO);
    got.n = 0;
    http_once(t.port,
              "GET /front HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n"
              "Connection: Upgrade, close\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
              "Sec-WebSocket-Version: 13\r\n\r\n",
              &got);
    assert_int_equal(memcmp(got.p, "HTTP/1.1 400 ", 13), 0);
    assert_int_equal(atomic_load(&d.deferred), 0);
    srv_stop(&t);
    free(got.p);
}

/*
 * Regression: an upgrade accepted just before a stop, whose 101 waits for the batch in flight
 * before it (a large answer pipelined ahead of the handshake) while the stop reaches the
 * connection. The 101 then went out with "Connection: close" beside "Connection: Upgrade",
 * the connection closed behind it, and the owner's first message never left: the accepted
 * WebSocket only got the stop's end (1006). It now opens and is told to go away (1001), as
 * the stop tells every WebSocket, its queued message first.
 */
static void deferred_upgrade_accepted_before_stop_goes_away(void **state)
{
    enum { BIG = 4u << 20 };
    struct srv t;
    struct dapp d;
    struct fx_bytes head = {0};
    char *big = calloc(1, BIG);
    char *buf = malloc(BIG);
    char c, req[512];
    int rcv = 4096;
    (void)state;
    assert_non_null(big);
    assert_non_null(buf);
    dapp_init(&d, D_ACCEPT, 0);
    srv_new(&t, NULL);
    CHECK(shmipc_server_static(t.s, "GET", "/big", 200, "application/octet-stream", big, BIG));
    CHECK(shmipc_server_route(t.s, "GET", "/front", h_defer, &d, NULL));
    srv_run(&t);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)t.port)};
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv), 0);
    if (connect(fd, (struct sockaddr *)&sin, sizeof sin) != 0)
        fail_msg("connect: %s", strerror(errno));
    int n = snprintf(req, sizeof req, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n%s", d_request);
    assert_int_equal(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
    /* Accepted while the big answer is still on its way (the client reads nothing yet). */
    WAIT_UNTIL(atomic_load(&d.fired));
    assert_int_equal(atomic_load(&d.accept_rc), 0);
    assert_int_equal(shmipc_server_stop(t.s), 0);
    usleep(200 * 1000); /* the stop reaches the connection while the batch is in flight */
    fx_put(&head, "", 0);
    while (head_end(&head) == 0) {
        read_exact(fd, &c, 1);
        fx_put(&head, &c, 1);
    }
    assert_int_equal(memcmp(head.p, "HTTP/1.1 200 ", 13), 0);
    read_exact(fd, buf, BIG);
    head.n = 0;
    while (head_end(&head) == 0) {
        read_exact(fd, &c, 1);
        fx_put(&head, &c, 1);
    }
    fx_put_byte(&head, 0);
    assert_int_equal(memcmp(head.p, "HTTP/1.1 101 ", 13), 0);
    if (strstr(head.p, "Connection: close") != NULL)
        fail_msg("the 101 closes the connection:\n%s", head.p);
    expect_frame(fd, 0x81, "hello", 5);
    expect_frame(fd, 0x88, "\x03\xe9", 2); /* 1001, going away */
    close(fd);
    srv_stop(&t);
    assert_int_equal(atomic_load(&d.late_send_rc), 0);
    free(head.p);
    free(buf);
    free(big);
}

/* ---------------------------------------------------------------------------------------- */
/* A held WebSocket (shmipc__ws_hold) whose client leaves */

static atomic_int held_count;

/* On the message "hold", the owner stops reading the client (as the front does when its
 * worker's queue is full). */
static void hold_message(shmipc_ws *ws, int kind, const void *data, size_t len, void *user_data)
{
    struct app *a = user_data;
    app_message(ws, kind, data, len, user_data);
    (void)a;
    if (len == 4 && memcmp(data, "hold", 4) == 0 && shmipc__ws_hold(ws, 1) == 0)
        atomic_fetch_add(&held_count, 1);
}

/*
 * The client of a held WebSocket leaves, with a FIN or a reset, behind a message the server
 * has not read: the server hears it while held (the reactor's on_hup), closes the connection
 * and tells on_close 1006 at once, not when the hold would end (it never does here). Before,
 * nothing came until the server stopped. Both ways, then the server still serves.
 */
static void held_client_leaves_is_noticed(void **state)
{
    struct srv t;
    struct app a;
    (void)state;
    app_init(&a);
    a.echo = 0;
    srv_new(&t, NULL);
    CHECK(
        shmipc_server_websocket(t.s, "/ws", NULL, app_open, hold_message, app_close_cb, &a, NULL));
    srv_run(&t);
    for (int reset = 0; reset < 2; reset++) {
        struct fx_bytes out = {0};
        app_reset(&a);
        atomic_store(&held_count, 0);
        int fd = ws_connect(t.port, "/ws");
        WAIT_UNTIL(atomic_load(&a.opens) == 1);
        fx_put(&out, "", 0);
        client_frame(&out, 2, "hold", 4);
        assert_int_equal(send(fd, out.p, out.n, MSG_NOSIGNAL), (ssize_t)out.n);
        WAIT_UNTIL(atomic_load(&held_count) == 1);
        /* A message the held server does not read, then the client goes. */
        out.n = 0;
        client_frame(&out, 2, "unread", 6);
        assert_int_equal(send(fd, out.p, out.n, MSG_NOSIGNAL), (ssize_t)out.n);
        usleep(20000);
        if (reset) {
            struct linger lg = {.l_onoff = 1, .l_linger = 0};
            assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg), 0);
        }
        close(fd);
        uint64_t end = mono_ms() + 3000;
        while (atomic_load(&a.closes) == 0 && mono_ms() < end)
            usleep(1000);
        if (atomic_load(&a.closes) != 1)
            fail_msg("%s: on_close did not come within 3 s of the held client leaving",
                     reset ? "reset" : "FIN");
        assert_int_equal(atomic_load(&a.close_code), 1006);
        free(out.p);
    }
    /* The server goes on serving. */
    app_reset(&a);
    int fd = ws_connect(t.port, "/ws");
    WAIT_UNTIL(atomic_load(&a.opens) == 1);
    close_politely(fd, &a);
    close(fd);
    struct shmipc__server_stats st = srv_stop(&t);
    assert_int_equal(st.ws_upgrades, 3);
    app_free(&a);
}

/* The WebSocket the next test holds, and HTTP routes that act on it on the worker thread. */
static shmipc_ws *hup_ws;

static int hup_open(shmipc_ws *ws, const shmipc_http_request *req, void *user_data)
{
    hup_ws = ws;
    return app_open(ws, req, user_data);
}

static int h_ws_paused(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    (void)ud;
    return shmipc_http_response_body(res, hup_ws != NULL && hup_ws->c.paused ? "1" : "0", 1);
}

static int h_ws_hold(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    (void)ud;
    int rc = hup_ws != NULL ? shmipc__ws_hold(hup_ws, 1) : -1;
    return shmipc_http_response_body(res, rc == 0 ? "1" : "0", 1);
}

/* One GET on a fresh connection; returns the body's first byte. */
static char http_get_byte(int port, const char *path)
{
    char req[128];
    struct fx_bytes got = {0};
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", path);
    http_once(port, req, &got);
    size_t end = head_end(&got);
    assert_true(end > 0 && got.n > end);
    char c = got.p[end];
    free(got.p);
    return c;
}

/*
 * The client leaves (FIN) while the server itself paused reading it (backpressure: its one
 * message made the application queue more than the high-water mark for it), and only then does
 * the owner hold the connection. The hangup was reported (on_hup) before the hold, once per
 * pause: the hold must still end the connection (on_close 1006), though the client then reads
 * everything and the layer's pause would end (the hold keeps reading off, so the FIN would
 * never be read).
 */
static void hold_after_paused_hangup_is_noticed(void **state)
{
    struct srv t;
    struct app a;
    struct srv_opts o = {.high_water = 64u << 10, .send_limit = 1u << 20};
    struct fx_bytes msg = {0};
    (void)state;

    app_init(&a);
    hup_ws = NULL;
    srv_new_opts(&t, NULL, &o);
    CHECK(shmipc_server_websocket(t.s, "/flood", NULL, hup_open, flood_message, app_close_cb, &a,
                                  NULL));
    CHECK(shmipc_server_route(t.s, "GET", "/paused", h_ws_paused, NULL, NULL));
    CHECK(shmipc_server_route(t.s, "GET", "/hold", h_ws_hold, NULL, NULL));
    srv_run(&t);
    int fd = ws_connect(t.port, "/flood");
    WAIT_UNTIL(atomic_load(&a.opens) == 1);
    fx_put(&msg, "", 0);
    client_frame(&msg, 2, "go", 2);
    assert_int_equal(send(fd, msg.p, msg.n, MSG_NOSIGNAL), (ssize_t)msg.n);
    WAIT_UNTIL(atomic_load(&a.flood_refused) == 1);
    {
        uint64_t end = mono_ms() + 5000;
        while (http_get_byte(t.port, "/paused") != '1') {
            assert_true(mono_ms() < end);
            usleep(2000);
        }
    }
    assert_int_equal(shutdown(fd, SHUT_WR), 0);
    usleep(100000); /* the hangup is seen while paused, not yet held */
    assert_int_equal(http_get_byte(t.port, "/hold"), '1');
    /* The client reads what it can (the flood), so the layer's own pause would end. */
    uint64_t end = mono_ms() + 3000;
    while (atomic_load(&a.closes) == 0 && mono_ms() < end) {
        char buf[65536];
        ssize_t r = read(fd, buf, sizeof buf);
        if (r <= 0)
            usleep(1000);
    }
    if (atomic_load(&a.closes) != 1)
        fail_msg("on_close did not come within 3 s of the hold of a client gone");
    assert_int_equal(atomic_load(&a.close_code), 1006);
    close(fd);
    hup_ws = NULL;
    (void)srv_stop(&t);
    free(msg.p);
    app_free(&a);
}

/*
 * A graceful stop with a negative stop timeout (wait for requests in flight however long they
 * take) and a client that never answers the stop's close frame (1001): the server's close waits
 * 2 s for the answer, as the application's close does, then fails the connection (1006). It
 * used to wait for the client forever, so run() never returned.
 */
static void stop_close_unanswered_is_bounded(void **state)
{
    struct srv t;
    struct app a;
    struct srv_opts o = {.stop_forever = 1};
    (void)state;
    int fd = ws_open_then_stop(&t, &a, &o);
    /* No answer: on_close (1006) within a few seconds, and run() returns. */
    uint64_t end = mono_ms() + 6000;
    while (atomic_load(&a.closes) == 0 && mono_ms() < end)
        usleep(1000);
    int closed = atomic_load(&a.closes);
    close(fd); /* lets an old server go on */
    if (closed != 1)
        fail_msg("the stop's close frame was not given up on within 6 s");
    assert_int_equal(pthread_join(t.thread, NULL), 0);
    assert_int_equal(t.run_rc, 0);
    assert_int_equal(atomic_load(&a.close_code), 1006);
    shmipc_server_close(t.s);
    app_free(&a);
}

/* ---------------------------------------------------------------------------------------- */
/* The client's close frame, with its TCP connection gone right behind it */

/*
 * On "big" the application sends one BIG_LEN message, far above the high-water mark: the
 * server then stops reading the client (PAUSE) until it takes it, which it never does here;
 * on "bigclose" it also closes (4000) behind it. Every other message is only counted.
 */
#define BIG_LEN (8u << 20)
static unsigned char big_block[BIG_LEN];
static atomic_int big_sent, big_msgs;

static void big_message(shmipc_ws *ws, int kind, const void *data, size_t len, void *user_data)
{
    struct app *a = user_data;
    (void)kind;
    atomic_fetch_add(&big_msgs, 1);
    if (len < 3 || memcmp(data, "big", 3) != 0)
        return;
    if (shmipc_ws_send(ws, SHMIPC_WS_BINARY, big_block, BIG_LEN) != 0 ||
        (len == 8 && shmipc_ws_close(ws, 4000, "app") != 0))
        atomic_fetch_add(&a->send_errors, 1);
    atomic_fetch_add(&big_sent, 1);
}

enum gone_how { GONE_FIN, GONE_CLOSE, GONE_RST };

struct gone_case {
    const char *name;
    const char *first; /* a message sent first ("big", "bigclose"), or NULL */
    int split;         /* the close frame in two writes, 20 ms apart */
    int hold;          /* the owner holds the input first (shmipc__ws_hold, as the front does) */
    enum gone_how how;
};

/* The WebSocket hold_route holds on the message "hold". */
static void big_or_hold_message(shmipc_ws *ws, int kind, const void *data, size_t len,
                                void *user_data)
{
    big_message(ws, kind, data, len, user_data);
    if (len == 4 && memcmp(data, "hold", 4) == 0 && shmipc__ws_hold(ws, 1) == 0)
        atomic_fetch_add(&held_count, 1);
}

/*
 * One connection of the cases below: the first message if any (and the server's reaction to it
 * seen), a text message, then the close frame 4001 "bye", then the client is gone: FIN
 * (shutdown(SHUT_WR): it never reads again), close() (a FIN, or a reset when the server's
 * message waits unread in its socket) or a reset (SO_LINGER 0). on_close must report 4001 and
 * its reason, within a few seconds; the text message is not delivered when the server was not
 * reading (paused or held): the client is gone, its input is looked through for the close
 * frame alone.
 */
static void gone_case_run(struct srv *t, struct app *a, const struct gone_case *gc)
{
    struct fx_bytes out = {0};
    app_reset(a);
    atomic_store(&big_sent, 0);
    atomic_store(&big_msgs, 0);
    atomic_store(&held_count, 0);
    int fd = ws_connect(t->port, "/ws");
    WAIT_UNTIL(atomic_load(&a->opens) == 1);
    fx_put(&out, "", 0);
    if (gc->first != NULL) {
        client_frame(&out, 1, gc->first, strlen(gc->first));
        assert_int_equal(send(fd, out.p, out.n, MSG_NOSIGNAL), (ssize_t)out.n);
        if (gc->hold)
            WAIT_UNTIL(atomic_load(&held_count) == 1);
        else
            WAIT_UNTIL(atomic_load(&big_sent) == 1);
        out.n = 0;
    }
    client_frame(&out, 1, "unread?", 7);
    size_t close_at = out.n;
    client_frame(&out, 8, "\x0f\xa1\x62ye", 5); /* 4001 "bye" */
    if (gc->split) {
        size_t cut = close_at + 3;
        assert_int_equal(send(fd, out.p, cut, MSG_NOSIGNAL), (ssize_t)cut);
        usleep(20000);
        assert_int_equal(send(fd, out.p + cut, out.n - cut, MSG_NOSIGNAL), (ssize_t)(out.n - cut));
    } else {
        assert_int_equal(send(fd, out.p, out.n, MSG_NOSIGNAL), (ssize_t)out.n);
    }
    /* The frame left the client: a reset drops what its kernel has not sent (sock_sent.h). */
    assert_int_equal(sock_wait_sent(fd, 5000), 0);
    if (gc->how == GONE_FIN) {
        assert_int_equal(shutdown(fd, SHUT_WR), 0);
    } else {
        if (gc->how == GONE_RST) {
            struct linger lg = {.l_onoff = 1, .l_linger = 0};
            assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg), 0);
        }
        close(fd);
        fd = -1;
    }
    uint64_t end = mono_ms() + 6000;
    while (atomic_load(&a->closes) == 0 && mono_ms() < end)
        usleep(1000);
    if (fd >= 0)
        close(fd);
    if (atomic_load(&a->closes) != 1)
        fail_msg("%s (%s): no on_close within 6 s", gc->name,
                 suite_backend == SHMIPC_BACKEND_IO_URING ? "io_uring" : "epoll");
    if (atomic_load(&a->close_code) != 4001 || strcmp(a->reason, "bye") != 0)
        fail_msg("%s (%s): on_close %d \"%s\", not the client's 4001 \"bye\"", gc->name,
                 suite_backend == SHMIPC_BACKEND_IO_URING ? "io_uring" : "epoll",
                 atomic_load(&a->close_code), a->reason);
    /* One message: the text when the server was reading; else the first, the text behind it
     * only looked through for the close frame. */
    assert_int_equal(atomic_load(&big_msgs), 1);
    assert_int_equal(atomic_load(&a->send_errors), 0);
    free(out.p);
}

/* Runs `cases` against one server (keep-alive, the stall timeout, at `keepalive_ms`), then
 * checks that it still serves; returns the server's count of pauses. */
static uint64_t gone_cases(const struct gone_case *cases, size_t n, uint32_t keepalive_ms)
{
    struct srv t;
    struct app a;
    struct srv_opts o = {.keepalive_ms = keepalive_ms};
    memset(big_block, 'b', BIG_LEN);
    app_init(&a);
    a.echo = 0;
    srv_new_opts(&t, NULL, &o);
    CHECK(shmipc_server_websocket(t.s, "/ws", NULL, app_open, big_or_hold_message, app_close_cb, &a,
                                  NULL));
    srv_run(&t);
    size_t ran = 0;
    for (size_t i = 0; i < n; i++) {
        gone_case_run(&t, &a, &cases[i]);
        ran++;
    }
    app_reset(&a);
    int fd = ws_connect(t.port, "/ws");
    WAIT_UNTIL(atomic_load(&a.opens) == 1);
    close_politely(fd, &a);
    close(fd);
    struct shmipc__server_stats st = srv_stop(&t);
    assert_int_equal(st.ws_upgrades, ran + 1);
    app_free(&a);
    return st.ws_pauses;
}

/*
 * RFC 6455 §7.1.5 / §7.4.1: a close frame received is the close's code, even when the client's
 * TCP connection ends right behind it; 1006 is only for a close without one. The frame whole
 * or split, then a FIN, close() or a reset, while the server reads (in one receive with the
 * FIN or not), and while the server itself stopped reading the client because its large
 * message waits unread (PAUSE): then close() is a reset (the client had unread bytes) and the
 * server's send fails, or the FIN is heard while paused and the stall timeout (keep-alive,
 * 300 ms here) gives the client up. In those the server reported 1006 without reading the
 * frame (bug: a send failure closed at once; the stall closed at once).
 */
static void close_frame_then_gone_reports_its_code(void **state)
{
    static const struct gone_case cases[] = {
        {"reading, FIN", NULL, 0, 0, GONE_FIN},
        {"reading, close()", NULL, 0, 0, GONE_CLOSE},
        {"reading, reset", NULL, 0, 0, GONE_RST},
        {"reading, split, FIN", NULL, 1, 0, GONE_FIN},
        {"reading, split, close()", NULL, 1, 0, GONE_CLOSE},
        {"paused, close()", "big", 0, 0, GONE_CLOSE},
        {"paused, reset", "big", 0, 0, GONE_RST},
        {"paused, split, close()", "big", 1, 0, GONE_CLOSE},
        {"paused, FIN, stalled", "big", 0, 0, GONE_FIN},
    };
    (void)state;
    uint64_t pauses = gone_cases(cases, sizeof cases / sizeof cases[0], 300);
    assert_true(pauses >= 4); /* the paused cases were */
}

/*
 * The client's close crosses the application's (4000, queued behind its large message while the
 * server does not read the client), and the client is gone at once: on_close reports the
 * client's 4001, from the frame that waited behind the pause; with a FIN the application's close
 * timer (2 s) gives up on the answer and finds it there. It reported 1006 (a reset: the failed
 * send; a FIN: the timer closed at once).
 */
static void crossed_closes_then_gone_report_the_peers_code(void **state)
{
    static const struct gone_case cases[] = {
        {"crossed, reset", "bigclose", 0, 0, GONE_RST},
        {"crossed, FIN, close timer", "bigclose", 0, 0, GONE_FIN},
    };
    (void)state;
    uint64_t pauses = gone_cases(cases, sizeof cases / sizeof cases[0], 0);
    assert_true(pauses >= 2);
}

/*
 * The owner holds the client's input (as the front does while its worker's queue is full),
 * then the client sends a message and its close frame and goes (FIN or reset): the server hears
 * it while held and reports the close frame's 4001 (the message behind the hold is not
 * delivered). It reported 1006 without reading the input behind the hold.
 */
static void held_close_frame_then_gone_reports_its_code(void **state)
{
    static const struct gone_case cases[] = {
        {"held, FIN", "hold", 0, 1, GONE_FIN},
        {"held, reset", "hold", 0, 1, GONE_RST},
        {"held, split, close()", "hold", 1, 1, GONE_CLOSE},
    };
    (void)state;
    (void)gone_cases(cases, sizeof cases / sizeof cases[0], 0);
}

#define WS_SERVER_TESTS                                                                            \
    cmocka_unit_test(backpressure_client_never_reads),                                             \
        cmocka_unit_test(backpressure_application_flood), cmocka_unit_test(upgrade_routing),       \
        cmocka_unit_test(stop_sends_going_away), cmocka_unit_test(stall_paused_reader_closed),     \
        cmocka_unit_test(idle_pong_keeps_open), cmocka_unit_test(idle_silent_client_closed),       \
        cmocka_unit_test(idle_timeouts_off), cmocka_unit_test(config_ws_timeouts_and_limits),      \
        cmocka_unit_test(deferred_upgrade_accept_after_delay),                                     \
        cmocka_unit_test(deferred_upgrade_refused_403),                                            \
        cmocka_unit_test(deferred_upgrade_client_gone),                                            \
        cmocka_unit_test(deferred_upgrade_bad_handshake),                                          \
        cmocka_unit_test(deferred_upgrade_accept_while_stopping),                                  \
        cmocka_unit_test(stall_before_pipelined_upgrade_closed),                                   \
        cmocka_unit_test(deferred_upgrade_accepted_before_stop_goes_away),                         \
        cmocka_unit_test(held_client_leaves_is_noticed),                                           \
        cmocka_unit_test(hold_after_paused_hangup_is_noticed),                                     \
        cmocka_unit_test(stop_close_unanswered_is_bounded),                                        \
        cmocka_unit_test(close_frame_then_gone_reports_its_code),                                  \
        cmocka_unit_test(crossed_closes_then_gone_report_the_peers_code),                          \
        cmocka_unit_test(held_close_frame_then_gone_reports_its_code)

/* Runs the behaviours, then the fixtures (FIXTURE_DIR, or argv[1]). */
static int ws_server_main(int argc, char **argv, const char *name)
{
    const struct CMUnitTest tests[] = {WS_SERVER_TESTS};
    char group[64];
    int failed;
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    snprintf(group, sizeof group, "%s", name);
    failed = _cmocka_run_group_tests(group, tests, sizeof tests / sizeof tests[0], NULL, NULL);
    snprintf(group, sizeof group, "%s fixtures", name);
    failed += fx_run_files(group, argc > 1 ? argv[1] : FIXTURE_DIR, ".ws", NULL, 0, server_fixture);
    return failed != 0;
}

#endif
