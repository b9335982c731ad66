/*
 * Close-delimited responses (issue 18, item 2), the tests every backend must pass:
 * test_server_close_epoll.c and test_server_close_uring.c set close_backend and run
 * CLOSE_TESTS. A response the server has started is sent whole, then the connection closes
 * with a bounded lingering close; a peer's half-close (FIN) right after its request does not
 * cut the answer short, a slow reader is bounded by the send timeout only, a reader that
 * stops is cut off by it. Each test runs with 1 and with 2 workers. Servers listen on
 * 127.0.0.1 and an ephemeral port; every loop is bounded in count and time.
 */
#ifndef TEST_SERVER_CLOSE_SUITE_H
#define TEST_SERVER_CLOSE_SUITE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "shmipc.h"
#include "net/server.h"

static int close_backend = SHMIPC_BACKEND_EPOLL;

#define CHECK(call)                                                                                \
    do {                                                                                           \
        int check_rc_ = (call);                                                                    \
        if (check_rc_ < 0)                                                                         \
            fail_msg("%s: %s: %s", #call, shmipc_errname(check_rc_), shmipc_error_detail());       \
    } while (0)

#define HUGE_LEN (8u << 20) /* the close-delimited large response */
#define REPEAT   40u        /* short connections per case and worker count */

static unsigned char *huge_body;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int h_small(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    (void)ud;
    return shmipc_http_response_body(res, "small answer", 12);
}

static int h_huge(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    (void)ud;
    return shmipc_http_response_body_borrow(res, huge_body, HUGE_LEN, NULL, NULL);
}

static int h_broken(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    (void)res;
    (void)ud;
    return SHMIPC_EIO; /* a handler failure: 500 */
}

struct csrv {
    shmipc_server *s;
    pthread_t thread;
    int port;
    int run_rc;
};

static void *csrv_run(void *arg)
{
    struct csrv *t = arg;
    t->run_rc = shmipc_server_run(t->s);
    return NULL;
}

/* keepalive_ms is also the send timeout (0: the default). */
static void csrv_start(struct csrv *t, unsigned workers, uint32_t keepalive_ms)
{
    shmipc_server_config *cfg;
    memset(t, 0, sizeof *t);
    if (huge_body == NULL) {
        huge_body = malloc(HUGE_LEN);
        assert_non_null(huge_body);
        for (size_t i = 0; i < HUGE_LEN; i++)
            huge_body[i] = (unsigned char)(i * 13 + i / 65536);
    }
    CHECK(shmipc_server_config_new(&cfg));
    CHECK(shmipc_server_config_set_port(cfg, 0));
    CHECK(shmipc_server_config_set_workers(cfg, workers));
    CHECK(shmipc_server_config_set_backend(cfg, close_backend));
    if (keepalive_ms != 0)
        CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_KEEPALIVE, keepalive_ms));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_STOP, 2000));
    CHECK(shmipc_server_new(cfg, &t->s));
    shmipc_server_config_free(cfg);
    CHECK(shmipc_server_route(t->s, "GET", "/small", h_small, NULL, NULL));
    CHECK(shmipc_server_route(t->s, "GET", "/huge", h_huge, NULL, NULL));
    CHECK(shmipc_server_route(t->s, "GET", "/broken", h_broken, NULL, NULL));
    CHECK(shmipc_server_static(t->s, "GET", "/static", 200, "text/plain", "static body", 11));
    CHECK(shmipc_server_start(t->s));
    t->port = shmipc_server_port(t->s);
    assert_true(t->port > 0);
    assert_int_equal(pthread_create(&t->thread, NULL, csrv_run, t), 0);
}

static struct shmipc__server_stats csrv_stop(struct csrv *t)
{
    struct shmipc__server_stats st;
    assert_int_equal(shmipc_server_stop(t->s), 0);
    assert_int_equal(pthread_join(t->thread, NULL), 0);
    assert_int_equal(t->run_rc, 0);
    shmipc__server_stats(t->s, &st);
    shmipc_server_close(t->s);
    return st;
}

static int cconnect(int port, int rcvbuf)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct timeval tv = {.tv_sec = 10};
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

static void csend(int fd, const char *s)
{
    size_t len = strlen(s);
    while (len > 0) {
        ssize_t n = send(fd, s, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            fail_msg("send: %s", strerror(errno));
        s += n;
        len -= (size_t)n;
    }
}

/* Everything until EOF (or an error: *err = errno), `chunk` bytes a read, `pause_ms` between
 * reads. The caller frees the result. */
static char *read_all(int fd, size_t chunk, unsigned pause_ms, size_t *len, int *err)
{
    size_t cap = 1u << 16, n = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    *err = 0;
    for (;;) {
        ssize_t k;
        if (cap - n < chunk) {
            cap = cap * 2 > n + chunk ? cap * 2 : n + chunk;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
        k = read(fd, buf + n, chunk);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            *err = errno;
            break;
        }
        if (k == 0)
            break;
        n += (size_t)k;
        if (pause_ms != 0)
            sleep_ms(pause_ms);
    }
    *len = n;
    return buf;
}

/* One whole response, then EOF: the status, and the body (pointing into buf) checked
 * against Content-Length. Returns the head's length. */
static size_t check_whole(const char *buf, size_t len, int err, int status, const char *what,
                          unsigned i)
{
    char line[16];
    const char *end, *cl;
    size_t head, body;
    if (err != 0)
        fail_msg("%s #%u: read failed (%s) after %zu bytes", what, i, strerror(err), len);
    if (len == 0)
        fail_msg("%s #%u: no response at all (EOF first)", what, i);
    end = memmem(buf, len, "\r\n\r\n", 4);
    if (end == NULL)
        fail_msg("%s #%u: response cut short in its head (%zu bytes)", what, i, len);
    head = (size_t)(end - buf) + 4;
    snprintf(line, sizeof line, " %d ", status);
    if (memmem(buf, head, line, strlen(line)) == NULL)
        fail_msg("%s #%u: expected status %d: %.*s", what, i, status, 40, buf);
    cl = memmem(buf, head, "Content-Length: ", 16);
    if (cl == NULL)
        cl = memmem(buf, head, "content-length: ", 16);
    assert_non_null(cl);
    body = (size_t)strtoull(cl + 16, NULL, 10);
    if (len != head + body)
        fail_msg("%s #%u: %zu bytes then EOF, expected %zu + %zu", what, i, len, head, body);
    return head;
}

struct close_case {
    const char *name;
    const char *request;
    int status;
};

static const struct close_case close_cases[] = {
    {"Connection: close", "GET /small HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 200},
    {"HTTP/1.0", "GET /small HTTP/1.0\r\n\r\n", 200},
    {"static HTTP/1.0", "GET /static HTTP/1.0\r\n\r\n", 200},
    {"400 malformed", "GARBAGE\r\n\r\n", 400},
    {"400 bad header", "GET /small HTTP/1.1\r\nHost x\r\n\r\n", 400},
    {"404 close", "GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404},
    {"404 keep-alive", "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", 404},
    {"500 handler failure", "GET /broken HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 500},
    {"500 keep-alive", "GET /broken HTTP/1.1\r\nHost: x\r\n\r\n", 500},
};

/*
 * Regression (issue 18, item 2): the client half-closes (shutdown(SHUT_WR)) right after its
 * request; the peer's FIN arrived while the answer was queued and the connection was closed
 * at once, dropping the answer (io_uring: 2-4 of 5 never arrived).
 */
static void half_close_after_request_loses_response(void **state)
{
    (void)state;
    for (unsigned workers = 1; workers <= 2; workers++) {
        struct csrv t;
        csrv_start(&t, workers, 0);
        for (size_t c = 0; c < sizeof close_cases / sizeof close_cases[0]; c++)
            for (unsigned i = 0; i < REPEAT; i++) {
                int fd = cconnect(t.port, 0), err;
                size_t len;
                char *buf;
                csend(fd, close_cases[c].request);
                assert_int_equal(shutdown(fd, SHUT_WR), 0);
                buf = read_all(fd, 65536, 0, &len, &err);
                check_whole(buf, len, err, close_cases[c].status, close_cases[c].name, i);
                free(buf);
                close(fd);
            }
        csrv_stop(&t);
    }
}

/* The same answers without the half-close: the client reads to EOF. */
static void close_delimited_whole_then_eof(void **state)
{
    (void)state;
    for (unsigned workers = 1; workers <= 2; workers++) {
        struct csrv t;
        csrv_start(&t, workers, 0);
        for (size_t c = 0; c < sizeof close_cases / sizeof close_cases[0]; c++) {
            int keep = strstr(close_cases[c].name, "keep-alive") != NULL;
            if (keep)
                continue; /* the connection stays open: nothing close-delimited */
            for (unsigned i = 0; i < REPEAT / 4; i++) {
                int fd = cconnect(t.port, 0), err;
                size_t len;
                char *buf;
                csend(fd, close_cases[c].request);
                buf = read_all(fd, 65536, 0, &len, &err);
                check_whole(buf, len, err, close_cases[c].status, close_cases[c].name, i);
                free(buf);
                close(fd);
            }
        }
        csrv_stop(&t);
    }
}

static void check_huge(const char *buf, size_t len, int err, const char *what)
{
    size_t head = check_whole(buf, len, err, 200, what, 0);
    assert_int_equal(len - head, HUGE_LEN);
    if (memcmp(buf + head, huge_body, HUGE_LEN) != 0)
        fail_msg("%s: the body's bytes differ", what);
}

/* 8 MiB, close-delimited, read as fast as the client can; with and without a half-close. */
static void huge_close_delimited_fast_reader(void **state)
{
    (void)state;
    for (unsigned workers = 1; workers <= 2; workers++) {
        struct csrv t;
        csrv_start(&t, workers, 0);
        for (int half = 0; half <= 1; half++)
            for (int v10 = 0; v10 <= 1; v10++) {
                int fd = cconnect(t.port, 0), err;
                size_t len;
                char *buf;
                csend(fd, v10 ? "GET /huge HTTP/1.0\r\n\r\n"
                              : "GET /huge HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                if (half)
                    assert_int_equal(shutdown(fd, SHUT_WR), 0);
                buf = read_all(fd, 1u << 20, 0, &len, &err);
                check_huge(buf, len, err, "8 MiB, fast reader");
                free(buf);
                close(fd);
            }
        csrv_stop(&t);
    }
}

/*
 * Regression (issue 18, item 2): 8 MiB read slowly (16 KiB every 8 ms, about 4 s with a small
 * receive buffer). The linger timer started when the answer was queued and closed the
 * connection 2 s later, mid-response; a slow reader is bounded by the send timeout only.
 */
static void huge_close_delimited_slow_reader_truncated(void **state)
{
    (void)state;
    for (unsigned workers = 1; workers <= 2; workers++) {
        struct csrv t;
        csrv_start(&t, workers, 0);
        for (int half = 0; half <= 1; half++) {
            int fd = cconnect(t.port, 16384), err;
            size_t len;
            char *buf;
            csend(fd, "GET /huge HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            if (half)
                assert_int_equal(shutdown(fd, SHUT_WR), 0);
            buf = read_all(fd, 16384, 8, &len, &err);
            check_huge(buf, len, err,
                       half ? "8 MiB, slow reader, half-closed" : "8 MiB, slow reader");
            free(buf);
            close(fd);
        }
        csrv_stop(&t);
    }
}

/* A reader that stops reading entirely is cut off by the send timeout (300 ms here, with no
 * progress), and the server goes on serving others. */
static void stalled_reader_cut_by_send_timeout(void **state)
{
    (void)state;
    for (unsigned workers = 1; workers <= 2; workers++) {
        struct csrv t;
        struct shmipc__server_stats st;
        int fd, fd2, err;
        size_t len;
        char *buf;
        uint64_t t0;
        csrv_start(&t, workers, 300);
        fd = cconnect(t.port, 16384);
        csend(fd, "GET /huge HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        sleep_ms(1500); /* five send timeouts without reading a byte */
        /* Meanwhile another client is served. */
        fd2 = cconnect(t.port, 0);
        csend(fd2, "GET /small HTTP/1.0\r\n\r\n");
        buf = read_all(fd2, 65536, 0, &len, &err);
        check_whole(buf, len, err, 200, "a client beside the stalled one", 0);
        free(buf);
        close(fd2);
        /* What was in the socket buffers arrives, then the end; never all 8 MiB. */
        t0 = now_ms();
        buf = read_all(fd, 1u << 20, 0, &len, &err);
        assert_true(err == 0 || err == ECONNRESET);
        assert_true(len < HUGE_LEN);
        assert_true(now_ms() - t0 < 9000);
        free(buf);
        close(fd);
        st = csrv_stop(&t);
        assert_true(st.timeouts >= 1);
    }
}

/*
 * A reader that takes nothing while it trickles the body of a pipelined request is cut off by
 * the send timeout too: bytes it sends are not progress of the response (they used to push
 * the deadline on, holding the connection and its 8 MiB response for as long as the body
 * lasted).
 */
static void stalled_reader_trickling_body_cut_by_send_timeout(void **state)
{
    (void)state;
    for (unsigned workers = 1; workers <= 2; workers++) {
        struct csrv t;
        int fd, cut = 0;
        uint64_t t0;
        csrv_start(&t, workers, 300);
        fd = cconnect(t.port, 16384);
        csend(fd, "GET /huge HTTP/1.1\r\nHost: x\r\n\r\n"
                  "POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nab");
        t0 = now_ms();
        /* One body byte every 100 ms, never reading: at most 4 s. */
        while (now_ms() - t0 < 4000) {
            sleep_ms(100);
            if (send(fd, "x", 1, MSG_NOSIGNAL) != 1) {
                assert_true(errno == EPIPE || errno == ECONNRESET);
                cut = 1;
                break;
            }
        }
        if (!cut)
            fail_msg("workers %u: a stalled reader trickling a body kept its connection for "
                     "%llu ms (send timeout 300 ms)",
                     workers, (unsigned long long)(now_ms() - t0));
        close(fd);
        csrv_stop(&t);
    }
}

/*
 * While the last response is going out, input nobody will answer is not read and thrown away
 * without end: a client that does not read but sends as fast as it can would keep a worker
 * receiving at full speed for as long as the send timeout is extended. The server stops
 * reading (TCP pushes back) until the response has left; the lingering close then drains a
 * bounded amount. Here the client manages at most socket buffers' worth in 2 s.
 */
static void closing_connection_does_not_swallow_unbounded_input(void **state)
{
    (void)state;
    static char junk[1u << 16];
    for (unsigned workers = 1; workers <= 2; workers++) {
        struct csrv t;
        int fd;
        size_t pushed = 0;
        uint64_t t0;
        csrv_start(&t, workers, 0);
        fd = cconnect(t.port, 16384);
        csend(fd, "GET /huge HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        t0 = now_ms();
        while (now_ms() - t0 < 2000 && pushed < (256u << 20)) {
            ssize_t n = send(fd, junk, sizeof junk, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0)
                pushed += (size_t)n;
            else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                sleep_ms(5);
            else
                break;
        }
        if (pushed > (32u << 20))
            fail_msg("workers %u: a closing connection took %zu bytes of input in 2 s", workers,
                     pushed);
        close(fd);
        csrv_stop(&t);
    }
}

#define PIPE_PAD 4000u /* an X-Pad header per pipelined request */
#define PIPE_COUNT                                                                                 \
    800u /* about 3.2 MB pipelined: more than rx_max (1.1 MiB), and than the 2 MiB buffer it may grow to */

struct pipe_writer {
    int fd;
    char *bytes;
    size_t len;
    int err;
};

static void *pipe_write(void *arg)
{
    struct pipe_writer *pw = arg;
    size_t off = 0;
    while (off < pw->len) {
        ssize_t n = send(pw->fd, pw->bytes + off, pw->len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            pw->err = n < 0 ? errno : EPIPE;
            break;
        }
        off += (size_t)n;
    }
    return NULL;
}

/*
 * Regression: more than rx_max bytes pipelined behind a request whose 8 MiB response the
 * client reads slowly. The server kept buffering the input while it wrote the response and,
 * past rx_max, closed the connection at once, cutting the started response short. It stops
 * reading instead (TCP pushes back, as nginx), reads again once the response has left, and
 * answers every pipelined request.
 */
static void pipelined_flood_behind_large_response_cut_it(void **state)
{
    (void)state;
    static const char head[] = "GET /huge HTTP/1.1\r\nHost: x\r\n\r\n";
    size_t one = 0;
    struct pipe_writer pw = {0};
    char pad[PIPE_PAD + 1];
    memset(pad, 'p', PIPE_PAD);
    pad[PIPE_PAD] = '\0';
    pw.bytes = malloc(sizeof head + (size_t)PIPE_COUNT * (PIPE_PAD + 128));
    assert_non_null(pw.bytes);
    memcpy(pw.bytes, head, sizeof head - 1);
    pw.len = sizeof head - 1;
    for (unsigned i = 0; i < PIPE_COUNT; i++) {
        int n = sprintf(pw.bytes + pw.len, "GET /small HTTP/1.1\r\nHost: x\r\nX-Pad: %s\r\n%s\r\n",
                        pad, i + 1 == PIPE_COUNT ? "Connection: close\r\n" : "");
        if (i == 0)
            one = (size_t)n;
        pw.len += (size_t)n;
    }
    assert_true(pw.len - one > (1u << 20) + (64u << 10));
    for (unsigned workers = 1; workers <= 2; workers++) {
        struct csrv t;
        pthread_t th;
        size_t len, head_len, cl;
        int err;
        const char *end, *p;
        char *buf;
        unsigned smalls = 0;
        csrv_start(&t, workers, 0);
        pw.fd = cconnect(t.port, 16384);
        pw.err = 0;
        assert_int_equal(pthread_create(&th, NULL, pipe_write, &pw), 0);
        buf = read_all(pw.fd, 16384, 1, &len, &err);
        assert_int_equal(pthread_join(th, NULL), 0);
        if (err != 0)
            fail_msg("workers %u: read failed (%s) after %zu bytes", workers, strerror(err), len);
        end = memmem(buf, len, "\r\n\r\n", 4);
        if (end == NULL)
            fail_msg("workers %u: no response head (%zu bytes)", workers, len);
        head_len = (size_t)(end - buf) + 4;
        p = memmem(buf, head_len, "Content-Length: ", 16);
        assert_non_null(p);
        cl = (size_t)strtoull(p + 16, NULL, 10);
        assert_int_equal(cl, HUGE_LEN);
        if (len < head_len + HUGE_LEN)
            fail_msg("workers %u: the 8 MiB response was cut short: %zu of %u body bytes", workers,
                     len - head_len, HUGE_LEN);
        if (memcmp(buf + head_len, huge_body, HUGE_LEN) != 0)
            fail_msg("workers %u: the body's bytes differ", workers);
        if (pw.err != 0)
            fail_msg("workers %u: the pipelined requests were not all taken: %s", workers,
                     strerror(pw.err));
        for (p = buf + head_len + HUGE_LEN; p < buf + len;) {
            const char *e = memmem(p, (size_t)(buf + len - p), "\r\n\r\nsmall answer", 16);
            if (e == NULL)
                break;
            smalls++;
            p = e + 16;
        }
        if (smalls != PIPE_COUNT || p != buf + len)
            fail_msg("workers %u: %u of %u pipelined answers, %zu bytes left over", workers, smalls,
                     PIPE_COUNT, (size_t)(buf + len - p));
        free(buf);
        close(pw.fd);
        csrv_stop(&t);
    }
    free(pw.bytes);
}

/* Requests pipelined behind one that closes the connection are not answered. */
static void pipelined_after_close_not_answered(void **state)
{
    static const char *const reqs[] = {
        "GET /small HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        "GET /small HTTP/1.1\r\nHost: x\r\n\r\nGET /static HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /small HTTP/1.0\r\n\r\nGET /small HTTP/1.1\r\nHost: x\r\n\r\n",
        "GARBAGE\r\n\r\nGET /small HTTP/1.1\r\nHost: x\r\n\r\n",
    };
    static const int status[] = {200, 200, 400};
    (void)state;
    for (unsigned workers = 1; workers <= 2; workers++) {
        struct csrv t;
        csrv_start(&t, workers, 0);
        for (size_t r = 0; r < 3; r++)
            for (int half = 0; half <= 1; half++)
                for (unsigned i = 0; i < REPEAT / 4; i++) {
                    int fd = cconnect(t.port, 0), err;
                    size_t len;
                    char *buf;
                    csend(fd, reqs[r]);
                    if (half)
                        assert_int_equal(shutdown(fd, SHUT_WR), 0);
                    buf = read_all(fd, 65536, 0, &len, &err);
                    /* check_whole: exactly one response's bytes, then EOF. */
                    check_whole(buf, len, err, status[r], "pipelined behind a close", i);
                    free(buf);
                    close(fd);
                }
        csrv_stop(&t);
    }
}

/* A peer that resets mid-response ends it; the server stays healthy. */
static void reset_mid_response_ends_it(void **state)
{
    (void)state;
    for (unsigned workers = 1; workers <= 2; workers++) {
        struct csrv t;
        csrv_start(&t, workers, 0);
        for (unsigned i = 0; i < 4; i++) {
            struct linger lg = {.l_onoff = 1, .l_linger = 0};
            int fd = cconnect(t.port, 16384), err;
            size_t len;
            char *buf;
            char tmp[4096];
            csend(fd, "GET /huge HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            assert_true(read(fd, tmp, sizeof tmp) > 0);
            assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg), 0);
            close(fd); /* RST */
            fd = cconnect(t.port, 0);
            csend(fd, "GET /small HTTP/1.0\r\n\r\n");
            buf = read_all(fd, 65536, 0, &len, &err);
            check_whole(buf, len, err, 200, "after a reset", i);
            free(buf);
            close(fd);
        }
        csrv_stop(&t);
    }
}

#define CLOSE_TESTS                                                                                \
    cmocka_unit_test(half_close_after_request_loses_response),                                     \
        cmocka_unit_test(close_delimited_whole_then_eof),                                          \
        cmocka_unit_test(huge_close_delimited_fast_reader),                                        \
        cmocka_unit_test(huge_close_delimited_slow_reader_truncated),                              \
        cmocka_unit_test(stalled_reader_cut_by_send_timeout),                                      \
        cmocka_unit_test(stalled_reader_trickling_body_cut_by_send_timeout),                       \
        cmocka_unit_test(closing_connection_does_not_swallow_unbounded_input),                     \
        cmocka_unit_test(pipelined_flood_behind_large_response_cut_it),                            \
        cmocka_unit_test(pipelined_after_close_not_answered),                                      \
        cmocka_unit_test(reset_mid_response_ends_it)

#endif
