/* Description: shmipc-serve's front (core/serve/front.c) streaming responses end to end on
 * epoll and io_uring (docs/serve.md, "Streamed responses"): chunked, sized and close-delimited
 * framing exact to the byte, pipelining and keep-alive after a streamed body, backpressure to
 * the worker (a slow client holds the worker back; the front holds at most the mark and a
 * frame), a worker dying mid-body, the client leaving mid-body, the deadline between two
 * pieces, and cross-talk over 2 workers and 2 reactor threads.
 *
 * The harness is front_harness.c: every case keeps its workers, front and client
 * threads in heap state (struct tc) that a cmocka teardown stops and joins, also when an
 * assertion fails mid-case. Threads other than the case's own never assert; they count what
 * went wrong (appw.bad, a -1 status) and the case or the teardown fails. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "shmipc.h"
#include "shmipc_serve.h"
#include "net/server.h"
#include "serve/front.h"

#include "front_harness.h"

/* ---- streamed responses ---- */

/* The per-connection bound of docs/serve.md, "Streamed responses": under the mark, plus the
 * one BODY frame read while under it. */
#define HELD_MAX ((256u << 10) + (1u << 20))

/*
 * 64 MiB in 1 MiB frames to a client that reads 16 KiB at a time with a small receive
 * buffer: the body arrives exact in chunked framing, and the front never holds more than the
 * mark and a frame (its buffered peak), so the slow client held the worker back through its
 * stream rather than filling the front's memory.
 */
static void stream_64m_slow_client(void **state)
{
    struct tc *t = *state;
    struct fx *x = &t->x;
    struct rd *r = malloc(sizeof *r);
    struct sbody b;
    struct resp p;
    static struct shmipc__front_stats st;
    int small = 65536;
    tc_front(t, 1, NULL);
    rd_open(r, x->port);
    setsockopt(r->fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    assert_int_equal(get_stream(r, "/stream/67108864/1048576/0/7/e", 7, 16384, 20, &b), 200);
    assert_true(b.chunked);
    assert_false(b.bad);
    assert_true(b.complete);
    assert_int_equal(b.got, 64u << 20);
    CHECK(shmipc__front_stats(x->f, &st));
    assert_true(st.buffered_peak > 0);
    assert_true(st.buffered_peak <= HELD_MAX);
    assert_int_equal(st.w[0].served, 1);
    /* keep-alive after it */
    send_all(r->fd, "GET /again HTTP/1.1\r\nHost: t\r\n\r\n", 32);
    read_resp(r, &p);
    assert_int_equal(p.status, 200);
    assert_string_equal(p.body, "/again:");
    resp_free(&p);
    CHECK(shmipc__front_stats(x->f, &st));
    assert_int_equal(st.buffered, 0);
    close(r->fd);
    free(r);
}

/* A worker that gives a Content-Length: the client gets that length, no chunks; requests
 * pipelined behind the streamed response are answered after it, in order; a HEAD gets the
 * length and no body. */
static void stream_sized_then_pipelined(void **state)
{
    struct tc *t = *state;
    struct fx *x = &t->x;
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    struct sbody b;
    tc_front(t, 1, NULL);
    rd_open(r, x->port);
    const char *reqs = "GET /stream/3000001/65536/1/9/e HTTP/1.1\r\nHost: t\r\n\r\n"
                       "GET /stream/700000/100000/0/11/e HTTP/1.1\r\nHost: t\r\n\r\n"
                       "POST /p3 HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nb3";
    send_all(r->fd, reqs, strlen(reqs));
    read_resp_x(r, &p, 1);
    assert_int_equal(p.status, 200);
    assert_non_null(strstr(p.head, "\r\nContent-Length: 3000001\r\n"));
    assert_non_null(strstr(p.head, "\r\nContent-Type: application/x-t\r\n"));
    read_stream_body(r, &p, 9, 0, 0, &b);
    resp_free(&p);
    assert_false(b.chunked);
    assert_false(b.bad);
    assert_true(b.complete);
    assert_int_equal(b.got, 3000001);
    read_resp_x(r, &p, 1);
    assert_int_equal(p.status, 200);
    read_stream_body(r, &p, 11, 0, 0, &b);
    resp_free(&p);
    assert_true(b.chunked && b.complete && !b.bad);
    assert_int_equal(b.got, 700000);
    read_resp(r, &p);
    assert_int_equal(p.status, 200);
    assert_string_equal(p.body, "/p3:b3");
    resp_free(&p);
    /* HEAD: the worker's length, no body; the connection goes on */
    const char *hd = "HEAD /stream/5000/1000/1/1/e HTTP/1.1\r\nHost: t\r\n\r\n";
    send_all(r->fd, hd, strlen(hd));
    read_resp_x(r, &p, 1);
    assert_int_equal(p.status, 200);
    assert_non_null(strstr(p.head, "\r\nContent-Length: 5000\r\n"));
    resp_free(&p);
    send_all(r->fd, "GET /after HTTP/1.1\r\nHost: t\r\n\r\n", 32);
    read_resp(r, &p);
    assert_int_equal(p.status, 200);
    assert_string_equal(p.body, "/after:");
    resp_free(&p);
    close(r->fd);
    free(r);
}

/* HTTP/1.0 and no length from the worker: the body is delimited by the close (no chunks,
 * Connection: close), exact to its last byte. */
static void stream_http10_close_delimited(void **state)
{
    struct tc *t = *state;
    struct fx *x = &t->x;
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    struct sbody b;
    tc_front(t, 1, NULL);
    rd_open(r, x->port);
    const char *req = "GET /stream/900000/65536/0/8/e HTTP/1.0\r\n\r\n";
    send_all(r->fd, req, strlen(req));
    read_resp_x(r, &p, 1);
    assert_int_equal(p.status, 200);
    assert_null(strcasestr(p.head, "\r\nContent-Length:"));
    assert_null(strcasestr(p.head, "\r\nTransfer-Encoding:"));
    assert_non_null(strcasestr(p.head, "\r\nConnection: close\r\n"));
    read_stream_body(r, &p, 8, 0, 0, &b); /* until the close */
    resp_free(&p);
    assert_false(b.bad);
    assert_int_equal(b.got, 900000);
    close(r->fd);
    free(r);
}

/* A worker dies mid-body: that client's connection closes with the body cut short (never a
 * wrong end: no last chunk), while a stream on another connection, from the other worker,
 * goes on whole; the front serves on. */
static void stream_worker_dies(void **state)
{
    struct tc *t = *state;
    struct appw *ws[] = {&t->w[0], &t->w[1]};
    struct fx *x = &t->x;
    struct sbg *other = &t->sbg[0];
    struct rd *r = malloc(sizeof *r);
    struct sbody b;
    struct resp p;
    appw_start(ws[0], "w0", NULL);
    appw_start(ws[1], "w1", NULL);
    fx_start(x, ws, 2, 1, NULL);
    *other = (struct sbg){.port = x->port, .seed = 21, .slow_us = 200};
    snprintf(other->target, sizeof other->target, "/stream/16777216/262144/0/21/e");
    sbg_start(other);
    assert_true(wait_for(&ws[0]->requests, 1, WAIT_MS) || wait_for(&ws[1]->requests, 1, WAIT_MS));
    rd_open(r, x->port);
    assert_int_equal(get_stream(r, "/stream/8388608/65536/0/5/d", 5, 0, 0, &b), 200);
    assert_false(b.bad);
    assert_false(b.complete);
    assert_true(b.got < 8388608);
    assert_true(peer_closed(r->fd));
    close(r->fd);
    free(r);
    sbg_join(other);
    assert_int_equal(other->status, 200);
    assert_false(other->b.bad);
    assert_true(other->b.complete);
    assert_int_equal(other->b.got, 16777216);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(request(x->port, "GET", "/later", NULL, &p), 200);
        assert_string_equal(p.body, "/later:");
        resp_free(&p);
    }
}

/*
 * Regression (an attack review): a worker that exits right after writing a whole response
 * (--max-requests, a reload) while its client reads slowly: the response sat in the session's
 * shared memory, and the session's end cut it (4 of 20 MB). It now arrives whole, and the
 * worker's next session serves on. The client starts reading only once the worker's session
 * ended.
 */
static void stream_worker_exits_after_writing_it_all(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct fx *x = &t->x;
    struct rd *r = malloc(sizeof *r);
    struct sbody b;
    struct resp p;
    int small = 65536;
    tc_front(t, 1, NULL);
    for (int round = 0; round < 2; round++) {
        int ended = atomic_load(&w->sessions_ended);
        rd_open(r, x->port);
        setsockopt(r->fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
        const char *get = "GET /stream/8388608/262144/0/9/x HTTP/1.1\r\nHost: t\r\n\r\n";
        send_all(r->fd, get, strlen(get));
        assert_true(wait_for(&w->sessions_ended, ended + 1, WAIT_MS));
        /* While the response is kept for the slow client, the worker's next session serves
         * at once: the kept request holds the worker no more. */
        assert_int_equal(request(x->port, "GET", "/later", NULL, &p), 200);
        assert_string_equal(p.body, "/later:");
        resp_free(&p);
        if (round == 0) {
            read_resp_x(r, &p, 1);
            assert_int_equal(p.status, 200);
            memset(&b, 0, sizeof b);
            read_stream_body(r, &p, 9, 16384, 0, &b);
            resp_free(&p);
            assert_false(b.bad);
            assert_true(b.complete);
            assert_int_equal(b.got, 8388608);
        } else {
            /* The slow client leaves: its kept response ends alone, the front serves on. */
            struct linger lg = {1, 0};
            setsockopt(r->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        }
        close(r->fd);
    }
    free(r);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(request(x->port, "GET", "/later", NULL, &p), 200);
        assert_string_equal(p.body, "/later:");
        resp_free(&p);
    }
}

/* The client leaves mid-body (a reset, then a FIN): ABORT CLIENT_GONE reaches the worker,
 * which is free for the next request; the front holds nothing of it afterwards. */
static void stream_client_gone(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct fx *x = &t->x;
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    static struct shmipc__front_stats st;
    tc_front(t, 1, NULL);
    for (int round = 0; round < 2; round++) {
        rd_open(r, x->port);
        const char *req = "GET /stream/1073741824/65536/0/3/e HTTP/1.1\r\nHost: t\r\n\r\n";
        send_all(r->fd, req, strlen(req));
        read_resp_x(r, &p, 1);
        assert_int_equal(p.status, 200);
        resp_free(&p);
        while (r->len < 100000)
            assert_true(rd_more(r, 0, 0) > 0);
        if (round == 0) {
            struct linger lg = {1, 0};
            setsockopt(r->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        } else {
            shutdown(r->fd, SHUT_WR);
        }
        close(r->fd);
        assert_true(wait_for(&w->aborts[SHMIPC_SERVE_ABORT_CLIENT_GONE], round + 1, WAIT_MS));
        assert_int_equal(request(x->port, "GET", "/after", NULL, &p), 200);
        assert_string_equal(p.body, "/after:");
        resp_free(&p);
    }
    free(r);
    CHECK(shmipc__front_stats(x->f, &st));
    assert_int_equal(st.buffered, 0);
    assert_int_equal(st.client_gone, 2);
    assert_int_equal(atomic_load(&w->streamed), 0);
}

/* The worker stops sending mid-body: after the deadline (between two pieces) the client's
 * connection closes with the body cut short and the worker gets ABORT TIMEOUT. A slow client
 * holding the worker back for longer than the deadline is no timeout. */
static void stream_deadline_mid_body(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct fx *x = &t->x;
    struct shmipc__front_opts o = {.deadline_ms = 1000};
    struct rd *r = malloc(sizeof *r);
    struct sbody b;
    struct resp p;
    tc_front(t, 1, &o);
    rd_open(r, x->port);
    uint64_t t0 = mono_ms();
    assert_int_equal(get_stream(r, "/stream/2000000/50000/0/4/s", 4, 0, 0, &b), 200);
    assert_false(b.bad);
    assert_false(b.complete);
    assert_int_equal(b.got, 1000000);
    assert_true(mono_ms() - t0 >= 900);
    assert_true(peer_closed(r->fd));
    close(r->fd);
    assert_true(wait_for(&w->aborts[SHMIPC_SERVE_ABORT_TIMEOUT], 1, WAIT_MS));
    /* a client slower than the deadline in all, but reading: served whole */
    rd_open(r, x->port);
    assert_int_equal(get_stream(r, "/stream/4000000/65536/0/6/e", 6, 8192, 3000, &b), 200);
    assert_true(b.complete && !b.bad);
    assert_int_equal(b.got, 4000000);
    close(r->fd);
    free(r);
    assert_int_equal(request(x->port, "GET", "/after", NULL, &p), 200);
    resp_free(&p);
}

/* 2 workers, 2 reactor threads, 6 clients x 4 streamed bodies of their own (sizes, frames,
 * framing and seeds differ): every body exact, no worker serving two at once. */
static void stream_cross_talk(void **state)
{
    struct tc *t = *state;
    struct appw *ws[] = {&t->w[0], &t->w[1]};
    struct fx *x = &t->x;
    struct sbg *a = t->sbg;
    static struct shmipc__front_stats st;
    appw_start(ws[0], "w0", NULL);
    appw_start(ws[1], "w1", NULL);
    fx_start(x, ws, 2, 2, NULL);
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < 6; i++) {
            unsigned seed = (unsigned)(round * 6 + i + 100);
            a[i] = (struct sbg){.port = x->port, .seed = seed, .slow_us = (seed % 3) * 100};
            snprintf(a[i].target, sizeof a[i].target, "/stream/%u/%u/%u/%u/e",
                     100000u + seed * 37171u % 3000000u, 4096u << (seed % 9), seed % 2, seed);
            sbg_start(&a[i]);
        }
        for (int i = 0; i < 6; i++) {
            sbg_join(&a[i]);
            unsigned size = 100000u + a[i].seed * 37171u % 3000000u;
            assert_int_equal(a[i].status, 200);
            assert_false(a[i].b.bad);
            assert_true(a[i].b.complete);
            assert_int_equal(a[i].b.got, size);
            assert_int_equal(a[i].b.chunked, a[i].seed % 2 == 0);
        }
    }
    assert_int_equal(atomic_load(&ws[0]->max_concurrent), 1);
    assert_int_equal(atomic_load(&ws[1]->max_concurrent), 1);
    /* counted after the worker's END: the clients may have read it first */
    uint64_t end = mono_ms() + WAIT_MS;
    int total;
    while ((total = atomic_load(&ws[0]->streamed) + atomic_load(&ws[1]->streamed)) < 24 &&
           mono_ms() < end)
        sleep_ms(2);
    assert_int_equal(total, 24);
    CHECK(shmipc__front_stats(x->f, &st));
    assert_true(st.buffered_peak <= 2 * HELD_MAX); /* two reactor threads */
}

/*
 * A streamed head the server cannot write (bigger than its batch) closes the client's
 * connection from inside shmipc__server_stream_head(): the front's cancel callback runs
 * there, gives the exchange up and, the worker's stream having ended already, frees the
 * request, which stream_start() then went on using (HEAD with a Content-Length is always
 * streamed). A head the server refuses (a control byte) gave up and freed the request inside
 * req_answer(), which req_read() then freed again. Nothing may crash; the front keeps serving.
 */
static void stream_head_unwritable_frees_request_in_use(void **state)
{
    struct tc *t = *state;
    struct fx *x = &t->x;
    struct resp p;
    static struct shmipc__front_stats st;
    tc_front(t, 1, NULL);
    for (int round = 0; round < 12; round++) {
        struct rd *r = calloc(1, sizeof *r);
        static const char *const reqs[] = {"GET /bighead HTTP/1.1\r\nHost: t\r\n\r\n",
                                           "HEAD /bighead HTTP/1.1\r\nHost: t\r\n\r\n",
                                           "HEAD /ctlhead HTTP/1.1\r\nHost: t\r\n\r\n"};
        const char *req = reqs[round % 3];
        rd_open(r, x->port);
        send_all(r->fd, req, strlen(req));
        /* no head fits: whatever comes (a 502, or the close), nothing of the 20 KB header */
        struct timeval tv = {2, 0};
        setsockopt(r->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        (void)rd_more(r, 0, 0);
        assert_null(strstr(r->buf, "bbbbbbbb"));
        close(r->fd);
        free(r);
        assert_int_equal(request(x->port, "GET", "/after", NULL, &p), 200);
        assert_string_equal(p.body, "/after:");
        resp_free(&p);
    }
    CHECK(shmipc__front_stats(x->f, &st));
    assert_int_equal(st.buffered, 0);
}

#define T(f) cmocka_unit_test_setup_teardown(f, tc_setup, tc_teardown)
#define STREAM_TESTS                                                                               \
    T(stream_64m_slow_client), T(stream_sized_then_pipelined), T(stream_http10_close_delimited),   \
        T(stream_worker_dies), T(stream_worker_exits_after_writing_it_all), T(stream_client_gone), \
        T(stream_deadline_mid_body), T(stream_cross_talk),                                         \
        T(stream_head_unwritable_frees_request_in_use)

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {STREAM_TESTS};
    int rc;
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    unsetenv("SHMIPC_REACTOR_BACKEND");
    suite_backend = SHMIPC_BACKEND_EPOLL;
    rc = cmocka_run_group_tests_name("front_stream_epoll", tests, NULL, NULL);
    suite_backend = SHMIPC_BACKEND_AUTO; /* io_uring where the kernel has it */
    rc |= cmocka_run_group_tests_name("front_stream_uring", tests, NULL, NULL);
    return rc != 0;
}
