/* Description: shmipc-serve's front (core/serve/front.c) streaming request bodies (uploads)
 * to its workers on epoll and io_uring (docs/serve.md, "Streamed uploads"): a 64 MiB
 * Content-Length body hashed by the worker with the front's memory bounded, chunked bodies of
 * odd chunk sizes, a chunked body over the limit (413, ABORT TOO_LARGE), a client that stalls
 * (504, ABORT TIMEOUT) or leaves mid-body (ABORT CLIENT_GONE, the worker free again), a worker
 * that answers before the body's end (the connection closes after the answer), Expect:
 * 100-continue, a stopping worker's refusal of a body already streamed (503, never resent),
 * a body waiting in the queue for a worker, and cross-talk of unique bodies over 2 workers and
 * 2 reactor threads.
 *
 * The harness is front_harness.c (its workers' "/up/..." targets read a body frame by frame).
 * Threads other than the case's own never assert; they store what they saw and the case
 * checks it after joining them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "shmipc.h"
#include "shmipc_serve.h"
#include "net/server.h"
#include "serve/front.h"

#include "front_harness.h"

/* What the front may hold of one upload: one piece the session could not take (a read of the
 * server's, at most its receive buffer's worth). Far below any body here. */
#define KEPT_MAX (1u << 20)

/* The body of `total` bytes (gen_byte(seed, i)) in pieces: Content-Length framing in 64 KiB
 * sends, or chunked with chunk sizes cycling through `sizes`. Its FNV-1a into *hash. Stops
 * after `upto` bytes (a client that stalls or leaves; the last chunk is then not sent).
 * 0, or -1 when a send failed (the server closed). */
static int send_body(int fd, unsigned seed, uint64_t total, uint64_t upto, int chunked,
                     const size_t *sizes, size_t nsizes, uint64_t *hash)
{
    static const size_t one = 64u << 10;
    size_t cap = one;
    for (size_t i = 0; i < nsizes; i++)
        cap = sizes[i] > cap ? sizes[i] : cap;
    uint8_t *b = malloc(cap + 32);
    uint64_t h = FNV_INIT;
    int rc = 0;
    size_t k = 0;
    for (uint64_t off = 0; rc == 0 && off < upto;) {
        size_t n = chunked ? sizes[k++ % nsizes] : one;
        if (n > upto - off)
            n = (size_t)(upto - off);
        for (size_t i = 0; i < n; i++)
            b[i] = gen_byte(seed, off + i);
        h = fnv1a(h, b, n);
        if (chunked) {
            char line[32];
            int ln = snprintf(line, sizeof line, "%zx\r\n", n);
            rc = send_all_try(fd, line, (size_t)ln);
            if (rc == 0)
                rc = send_all_try(fd, b, n);
            if (rc == 0)
                rc = send_all_try(fd, "\r\n", 2);
        } else {
            rc = send_all_try(fd, b, n);
        }
        off += n;
    }
    if (rc == 0 && chunked && upto == total)
        rc = send_all_try(fd, "0\r\n\r\n", 5);
    free(b);
    if (hash != NULL)
        *hash = h;
    (void)total;
    return rc;
}

static void send_head(int fd, const char *target, uint64_t total, int chunked, const char *extra)
{
    char head[512];
    int n = chunked
                ? snprintf(head, sizeof head,
                           "POST %s HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n%s\r\n",
                           target, extra ? extra : "")
                : snprintf(head, sizeof head,
                           "POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %" PRIu64 "\r\n%s\r\n",
                           target, total, extra ? extra : "");
    send_all(fd, head, (size_t)n);
}

/* What "/up/hash" answers for the body. */
static void hash_text(char *out, size_t cap, uint64_t total, uint64_t h)
{
    snprintf(out, cap, "%" PRIu64 ":%016" PRIx64, total, h);
}

/* One whole upload to "/up/hash" on a new connection; the answer must be the body's hash. */
static void upload_hashed(int port, unsigned seed, uint64_t total, int chunked, const size_t *sizes,
                          size_t nsizes)
{
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    uint64_t h;
    char want[64];
    rd_open(r, port);
    send_head(r->fd, "/up/hash", total, chunked, NULL);
    assert_int_equal(send_body(r->fd, seed, total, total, chunked, sizes, nsizes, &h), 0);
    read_resp(r, &p);
    assert_int_equal(p.status, 200);
    hash_text(want, sizeof want, total, h);
    assert_string_equal(p.body, want);
    resp_free(&p);
    close(r->fd);
    free(r);
}

/*
 * 64 MiB with a Content-Length to a worker that hashes it: the hash matches, and the front
 * never held more than one piece of it (its kept peak), so the body went through as the
 * worker read it, not into the front's memory. A small body (gathered whole) and a body of
 * 64 KiB + 1 (streamed) go the same way.
 */
static void upload_64m_content_length(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct fx *x = &t->x;
    static struct shmipc__front_stats st;
    shmipc_config *ipc;
    /* The smallest shared buffer: 64 MiB go through 1 MiB as the worker frees it. */
    CHECK(shmipc_config_new(&ipc));
    CHECK(shmipc_config_set_buffer_capacity(ipc, SHMIPC_MIN_BUFFER_CAPACITY));
    struct shmipc__front_opts o = {.ipc = ipc};
    x->max_body = 128u << 20;
    tc_front(t, 1, &o);
    shmipc_config_free(ipc); /* the front keeps a copy */
    upload_hashed(x->port, 7, 64u << 20, 0, NULL, 0);
    upload_hashed(x->port, 8, 100, 0, NULL, 0);
    upload_hashed(x->port, 9, SHMIPC__FRONT_RETRY_BODY + 1, 0, NULL, 0);
    CHECK(shmipc__front_stats(x->f, &st));
    print_message("front: %" PRIu64 " uploads, kept at most %" PRIu64 " bytes\n", st.uploads,
                  st.upload_kept_peak);
    assert_int_equal(st.uploads, 2); /* the small one was gathered */
    assert_int_equal(st.upload_kept, 0);
    if (st.upload_kept_peak > KEPT_MAX)
        fail_msg("the front held %" PRIu64 " bytes of an upload", st.upload_kept_peak);
    assert_int_equal(atomic_load(&w->bad), 0);
}

/* Chunked bodies with odd chunk sizes (1 byte to 128 KiB - 1), and an empty one: decoded
 * exactly (the worker's hash), the length unknown to the worker until END. */
static void upload_chunked_odd_sizes(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct fx *x = &t->x;
    static const size_t sizes[] = {1, 7, 4093, 65537, 3, 131071, 2, 16384, 999};
    x->max_body = 4u << 20;
    tc_front(t, 1, NULL);
    upload_hashed(x->port, 3, (3u << 20) / 2 + 17, 1, sizes, sizeof sizes / sizeof sizes[0]);
    upload_hashed(x->port, 4, 5, 1, sizes, sizeof sizes / sizeof sizes[0]);
    upload_hashed(x->port, 5, 0, 1, sizes, sizeof sizes / sizeof sizes[0]);
    assert_int_equal(atomic_load(&w->bad), 0);
}

/* A chunked body past the server's body limit (1 MiB): 413 with a close, and the worker,
 * which had part of it, gets ABORT TOO_LARGE and is free for the next request. */
static void upload_chunked_over_limit_413(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct fx *x = &t->x;
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    static const size_t sizes[] = {32768};
    tc_front(t, 1, NULL);
    rd_open(r, x->port);
    send_head(r->fd, "/up/hash", 0, 1, NULL);
    (void)send_body(r->fd, 1, 2u << 20, 2u << 20, 1, sizes, 1, NULL); /* may fail: closed */
    read_resp(r, &p);
    assert_int_equal(p.status, 413);
    assert_non_null(strcasestr(p.head, "Connection: close"));
    resp_free(&p);
    close(r->fd);
    free(r);
    assert_true(wait_for(&w->aborts[SHMIPC_SERVE_ABORT_TOO_LARGE], 1, WAIT_MS));
    upload_hashed(x->port, 2, 300000, 0, NULL, 0);
    assert_int_equal(atomic_load(&w->bad), 0);
}

/* Chunk framing that breaks mid-body (a size line that is no hex number) after 200 KB went
 * to the worker: 400 with a close, and the worker gets ABORT CLIENT_GONE (the body ends
 * there) and serves the next request. */
static void upload_bad_chunk_framing_400(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct fx *x = &t->x;
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    static const size_t sizes[] = {50000};
    tc_front(t, 1, NULL);
    rd_open(r, x->port);
    send_head(r->fd, "/up/hash", 0, 1, NULL);
    assert_int_equal(send_body(r->fd, 1, 1u << 20, 200000, 1, sizes, 1, NULL), 0);
    assert_true(wait_for(&w->requests, 1, WAIT_MS));
    send_all(r->fd, "zz\r\n", 4);
    read_resp(r, &p);
    assert_int_equal(p.status, 400);
    assert_non_null(strcasestr(p.head, "Connection: close"));
    resp_free(&p);
    close(r->fd);
    free(r);
    assert_true(wait_for(&w->aborts[SHMIPC_SERVE_ABORT_CLIENT_GONE], 1, WAIT_MS));
    upload_hashed(x->port, 2, 300000, 1, sizes, 1);
    assert_int_equal(atomic_load(&w->bad), 0);
}

/* A client that stops sending mid-body: 504 at the deadline, the worker gets ABORT TIMEOUT
 * and serves the next request. */
static void upload_client_stalls_504(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct fx *x = &t->x;
    struct shmipc__front_opts o = {.deadline_ms = 500};
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    tc_front(t, 1, &o);
    rd_open(r, x->port);
    send_head(r->fd, "/up/hash", 1u << 20, 0, NULL);
    assert_int_equal(send_body(r->fd, 1, 1u << 20, 200000, 0, NULL, 0, NULL), 0);
    read_resp(r, &p);
    assert_int_equal(p.status, 504);
    resp_free(&p);
    close(r->fd);
    free(r);
    assert_true(wait_for(&w->aborts[SHMIPC_SERVE_ABORT_TIMEOUT], 1, WAIT_MS));
    /* The next upload has no deadline: TSan on a loaded machine takes 300 ms and more for it
     * (a 504 there failed CI). */
    CHECK(shmipc__front_set_deadline(x->f, SHMIPC__FRONT_NO_DEADLINE));
    upload_hashed(x->port, 2, 300000, 0, NULL, 0);
    assert_int_equal(atomic_load(&w->bad), 0);
}

/* The client leaves mid-body, with a FIN and with a reset: the worker gets ABORT CLIENT_GONE
 * each time and is free for the next request (one worker: the next upload proves it). */
static void upload_client_gone_frees_worker(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct fx *x = &t->x;
    tc_front(t, 1, NULL);
    for (int i = 0; i < 2; i++) {
        int fd = tcp_connect(x->port);
        send_head(fd, "/up/hash", 1u << 20, i, NULL);
        static const size_t sizes[] = {10000};
        assert_int_equal(send_body(fd, 1, 1u << 20, 200000, i, sizes, 1, NULL), 0);
        assert_true(wait_for(&w->requests, 1 + 2 * i, WAIT_MS));
        if (i == 1) {
            struct linger lg = {1, 0};
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        }
        close(fd);
        assert_true(wait_for(&w->aborts[SHMIPC_SERVE_ABORT_CLIENT_GONE], i + 1, WAIT_MS));
        upload_hashed(x->port, 2, 300000, 0, NULL, 0);
    }
    static struct shmipc__front_stats st;
    CHECK(shmipc__front_stats(x->f, &st));
    assert_int_equal(st.client_gone, 2);
    assert_int_equal(st.upload_kept, 0);
    assert_int_equal(atomic_load(&w->bad), 0);
}

/* The worker answers after the first piece of a 4 MiB body (and reads on, or closes its
 * stream at once): the client gets the answer with Connection: close, then the close; the
 * worker is free for the next request, its session never ended (before: the front's flush
 * into the closed stream took the session down, a failure counted). */
static void upload_early_answer_closes(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct fx *x = &t->x;
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    x->max_body = 8u << 20;
    tc_front(t, 1, NULL);
    static struct shmipc__front_stats st;
    for (int i = 0; i < 12; i++) {
        rd_open(r, x->port);
        if (i == 3) /* the protocol-abiding rounds are over */
            assert_int_equal(atomic_load(&w->bad), 0);
        send_head(r->fd, i >= 3 ? "/up/early-close" : "/up/early", 4u << 20, 0, NULL);
        assert_int_equal(send_body(r->fd, 1, 4u << 20, 300000, 0, NULL, 0, NULL), 0);
        read_resp(r, &p);
        assert_int_equal(p.status, 200);
        assert_string_equal(p.body, "early");
        assert_non_null(strcasestr(p.head, "Connection: close"));
        resp_free(&p);
        assert_true(peer_closed(r->fd));
        close(r->fd);
        upload_hashed(x->port, 2, 300000, 0, NULL, 0);
    }
    free(r);
    CHECK(shmipc__front_stats(x->f, &st));
    assert_int_equal(st.w[0].failures, 0);
    pthread_mutex_lock(&w->mu);
    int nsess = w->nsess;
    pthread_mutex_unlock(&w->mu);
    assert_int_equal(nsess, 1); /* the one session the front opened: it never ended */
    /* "early-close" breaks the protocol (a side closes only once the exchange is over for
     * both): BODY frames the front sent before it saw the close may reach the worker as a new
     * stream (docs/serve.md), which it counts as bad; the earlier rounds had none. */
    atomic_store(&w->bad, 0);
}

/* Expect: 100-continue: the 100 comes before any body byte was sent, for a streamed body
 * and for a small (gathered) one; then the body and the answer. */
static void upload_expect_100_continue(void **state)
{
    struct tc *t = *state;
    struct fx *x = &t->x;
    tc_front(t, 1, NULL);
    static const uint64_t sizes[] = {300000, 100};
    for (int i = 0; i < 2; i++) {
        struct rd *r = malloc(sizeof *r);
        struct resp p;
        uint64_t h;
        char want[64];
        rd_open(r, x->port);
        send_head(r->fd, "/up/hash", sizes[i], 0, "Expect: 100-continue\r\n");
        read_resp(r, &p);
        assert_int_equal(p.status, 100);
        resp_free(&p);
        assert_int_equal(send_body(r->fd, 6, sizes[i], sizes[i], 0, NULL, 0, &h), 0);
        read_resp(r, &p);
        assert_int_equal(p.status, 200);
        hash_text(want, sizeof want, sizes[i], h);
        assert_string_equal(p.body, want);
        resp_free(&p);
        close(r->fd);
        free(r);
    }
}

/* Both workers stopping: a body that already streamed to the first (200 KB, over what the
 * front keeps) is refused once and answered 503 (the worker's ABORT SHUTDOWN: not processed,
 * the client may retry), never resent: its bytes are gone. */
static void upload_refused_after_body_not_resent(void **state)
{
    struct tc *t = *state;
    struct appw *w0 = &t->w[0];
    struct appw *w1 = &t->w[1];
    struct appw *ws[] = {w0, w1};
    struct fx *x = &t->x;
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    static struct shmipc__front_stats st;
    appw_start(w0, "w0", NULL);
    appw_start(w1, "w1", NULL);
    atomic_store(&w0->mode, M_REFUSE);
    atomic_store(&w1->mode, M_REFUSE);
    fx_start(x, ws, 2, 1, NULL);
    assert_true(wait_sessions(x, w0->addr, 1));
    assert_true(wait_sessions(x, w1->addr, 1));
    rd_open(r, x->port);
    send_head(r->fd, "/r", 200000, 0, NULL);
    assert_int_equal(send_body(r->fd, 1, 200000, 200000, 0, NULL, 0, NULL), 0);
    read_resp(r, &p);
    assert_int_equal(p.status, 503);
    resp_free(&p);
    close(r->fd);
    free(r);
    assert_int_equal(atomic_load(&w0->refused) + atomic_load(&w1->refused), 1);
    CHECK(shmipc__front_stats(x->f, &st));
    assert_int_equal(st.retried, 0);
    assert_int_equal(atomic_load(&w0->bad) + atomic_load(&w1->bad), 0);
}

/*
 * Workers that grant TAKEN (HELLO): the front asks it of a streamed upload and holds its body
 * past SHMIPC__FRONT_RETRY_BODY until TAKEN comes, so a stopping worker's refusal (ABORT
 * SHUTDOWN before TAKEN, as at a reload) sends the whole request to another worker: 100 KB
 * bodies (Content-Length; chunked, the head first and the body 20 ms later) reach w1 whole
 * (echoed),
 * w0 refuses some, none is a 503 (the old code answered each refused one 503). With both
 * refusing: SHMIPC__FRONT_RETRIES + 1 refusals, then 503, never looping.
 */
static void upload_refused_before_taken_goes_to_another_worker(void **state)
{
    struct tc *t = *state;
    struct appw *w0 = &t->w[0];
    struct appw *w1 = &t->w[1];
    struct appw *ws[] = {w0, w1};
    struct fx *x = &t->x;
    struct resp p;
    static struct shmipc__front_stats st;
    static const size_t odd[] = {1000, 7, 30000, 64u << 10};
    struct shmipc__front_opts o = {.hello = 1};
    appw_start(w0, "w0", NULL);
    appw_start(w1, "w1", NULL);
    atomic_store(&w0->taken, TAKEN_GRANT);
    atomic_store(&w1->taken, TAKEN_GRANT);
    atomic_store(&w0->mode, M_REFUSE);
    fx_start(x, ws, 2, 1, &o);
    assert_true(wait_taken(x, 0, 1));
    assert_true(wait_taken(x, 1, 1));
    for (unsigned i = 0; i < 8; i++) {
        struct rd *r = malloc(sizeof *r);
        uint64_t h, total = 100000 + i;
        int chunked = i & 1;
        rd_open(r, x->port);
        send_head(r->fd, "/r", total, chunked, NULL); /* echoed: "/r:" and the body */
        if (chunked)
            sleep_ms(20); /* the head's message went alone */
        assert_int_equal(send_body(r->fd, 100 + i, total, total, chunked, chunked ? odd : NULL,
                                   chunked ? 4 : 0, &h),
                         0);
        read_resp(r, &p);
        assert_int_equal(p.status, 200);
        assert_int_equal(p.body_len, 3 + total);
        assert_memory_equal(p.body, "/r:", 3);
        assert_true(fnv1a(FNV_INIT, p.body + 3, total) == h);
        assert_non_null(strcasestr(p.head, "X-Worker: w1"));
        resp_free(&p);
        close(r->fd);
        free(r);
    }
    int refused = atomic_load(&w0->refused);
    assert_true(refused >= 1);
    CHECK(shmipc__front_stats(x->f, &st));
    assert_int_equal(st.retried, (uint64_t)refused);
    assert_int_equal(st.w[0].failures + st.w[1].failures, 0);
    assert_int_equal(atomic_load(&w1->takens), 8);
    /* everyone stopping: refused by each as often as the front retries, then 503 */
    atomic_store(&w1->mode, M_REFUSE);
    struct rd *r = malloc(sizeof *r);
    rd_open(r, x->port);
    send_head(r->fd, "/r", 100000, 0, NULL);
    assert_int_equal(send_body(r->fd, 9, 100000, 100000, 0, NULL, 0, NULL), 0);
    read_resp(r, &p);
    assert_int_equal(p.status, 503);
    resp_free(&p);
    close(r->fd);
    free(r);
    assert_true(wait_for(&w1->refused, 1, WAIT_MS));
    assert_int_equal(atomic_load(&w0->refused) + atomic_load(&w1->refused),
                     refused + SHMIPC__FRONT_RETRIES + 1);
    assert_int_equal(atomic_load(&w0->bad) + atomic_load(&w1->bad), 0);
}

/*
 * A stopping worker answers a new session's HELLO with ABORT SHUTDOWN (with a reason, as the
 * Python workers do, or bare, as the C and Lua workers): that session takes nothing more. 100
 * KB uploads all go to the other worker, whole, and w0 reads none. (The front took such a
 * worker for one that does not know HELLO and sent it uploads without TAKEN, which its refusal
 * after the body could not resend: 503, seen under --max-requests recycling.)
 */
static void stopping_worker_hello_gets_no_upload(void **state)
{
    struct tc *t = *state;
    struct appw *w0 = &t->w[0];
    struct appw *w1 = &t->w[1];
    struct appw *ws[] = {w0, w1};
    struct fx *x = &t->x;
    struct resp p;
    struct shmipc__front_opts o = {.hello = 1};
    for (int bare = 0; bare < 2; bare++) {
        appw_start(w0, "w0", NULL);
        appw_start(w1, "w1", NULL);
        atomic_store(&w0->taken, bare ? TAKEN_STOPPING_BARE : TAKEN_STOPPING);
        atomic_store(&w1->taken, TAKEN_GRANT);
        atomic_store(&w0->mode, M_REFUSE);
        fx_start(x, ws, 2, 1, &o);
        assert_true(wait_taken(x, 1, 1));
        assert_true(wait_for(&w0->hellos, 1, WAIT_MS));
        sleep_ms(100); /* the front reads the answer */
        for (unsigned i = 0; i < 6; i++) {
            struct rd *r = malloc(sizeof *r);
            uint64_t h, total = 100000 + i;
            rd_open(r, x->port);
            send_head(r->fd, "/r", total, 0, NULL);
            assert_int_equal(send_body(r->fd, 200 + i, total, total, 0, NULL, 0, &h), 0);
            read_resp(r, &p);
            assert_int_equal(p.status, 200);
            assert_int_equal(p.body_len, 3 + total);
            assert_true(fnv1a(FNV_INIT, p.body + 3, total) == h);
            assert_non_null(strcasestr(p.head, "X-Worker: w1"));
            resp_free(&p);
            close(r->fd);
            free(r);
        }
        assert_int_equal(atomic_load(&w0->requests), 0);
        /* The session went down at the answer, and the front opened it again, each time
         * later (20 ms doubling per refusal): a handful of HELLOs in a second, not 50. */
        assert_true(wait_for(&w0->hellos, 2, WAIT_MS));
        int hellos = atomic_load(&w0->hellos);
        sleep_ms(1000);
        if (atomic_load(&w0->hellos) - hellos > 4)
            fail_msg("%d HELLOs in a second", atomic_load(&w0->hellos) - hellos);
        assert_int_equal(atomic_load(&w0->bad) + atomic_load(&w1->bad), 0);
        fx_stop(x);
        appw_stop(w0);
        appw_stop(w1);
    }
}

/*
 * A refusal before TAKEN while the body is still coming and the server holds none of it (the
 * client sent 1000 bytes, then paused): the request waits in the queue (the other worker is
 * busy, the refusing one cannot reconnect), and the client's next bytes come meanwhile. They
 * must go after the rewound first 1000 (upload_rewind), not replace them: the other worker
 * echoes the whole body.
 */
static void upload_refused_then_more_body_while_queued(void **state)
{
    enum { TOTAL = 100000, FIRST = 1000, PIECE = 9000 };
    struct tc *t = *state;
    struct appw *ws[] = {&t->w[0], &t->w[1]};
    struct fx *x = &t->x;
    struct resp p;
    struct shmipc__front_opts o = {.hello = 1};
    static uint8_t body[TOTAL];
    char line[32];
    for (unsigned i = 0; i < 2; i++) {
        appw_start(ws[i], i ? "w1" : "w0", NULL);
        atomic_store(&ws[i]->taken, TAKEN_GRANT);
        atomic_store(&ws[i]->mode, M_HOLD);
    }
    fx_start(x, ws, 2, 1, &o);
    assert_true(wait_taken(x, 0, 1));
    assert_true(wait_taken(x, 1, 1));
    /* A GET holds one worker (b); the other (a) refuses what it is asked to take. */
    int g = tcp_connect(x->port);
    send_all(g, "GET /first HTTP/1.1\r\nHost: t\r\n\r\n", 33);
    uint64_t end = mono_ms() + WAIT_MS;
    while (atomic_load(&ws[0]->holding) + atomic_load(&ws[1]->holding) == 0 && mono_ms() < end)
        sleep_ms(1);
    struct appw *b = atomic_load(&ws[0]->holding) ? ws[0] : ws[1];
    struct appw *a = b == ws[0] ? ws[1] : ws[0];
    atomic_store(&a->mode, M_REFUSE);
    appw_hold_accept(a); /* its session, once refused, does not come back */
    for (size_t i = 0; i < TOTAL; i++)
        body[i] = gen_byte(77, i);
    struct rd *r = malloc(sizeof *r);
    rd_open(r, x->port);
    send_head(r->fd, "/r", 0, 1, NULL);
    int ln = snprintf(line, sizeof line, "%x\r\n", FIRST);
    send_all(r->fd, line, (size_t)ln);
    send_all(r->fd, body, FIRST);
    send_all(r->fd, "\r\n", 2);
    assert_true(wait_for(&a->refused, 1, WAIT_MS));
    assert_true(wait_queued(x, 1));
    for (size_t off = FIRST; off < TOTAL; off += PIECE) {
        size_t n = TOTAL - off < PIECE ? TOTAL - off : PIECE;
        ln = snprintf(line, sizeof line, "%zx\r\n", n);
        send_all(r->fd, line, (size_t)ln);
        send_all(r->fd, body + off, n);
        send_all(r->fd, "\r\n", 2);
    }
    send_all(r->fd, "0\r\n\r\n", 5);
    sleep_ms(100); /* the server hands the front what came while the request is queued */
    latch_set(b, &b->hold_open, 1);
    read_resp(r, &p);
    assert_int_equal(p.status, 200);
    assert_non_null(strcasestr(p.head, b == ws[0] ? "X-Worker: w0" : "X-Worker: w1"));
    if (p.body_len != 3 + TOTAL || memcmp(p.body, "/r:", 3) != 0 ||
        memcmp(p.body + 3, body, TOTAL) != 0)
        fail_msg("the echo is %zu bytes, want %d (the body lost or reordered bytes)", p.body_len,
                 3 + TOTAL);
    resp_free(&p);
    close(r->fd);
    free(r);
    close(g);
    assert_int_equal(atomic_load(&a->refused), 1);
    assert_int_equal(atomic_load(&ws[0]->bad) + atomic_load(&ws[1]->bad), 0);
}

/* An upload client thread (it never asserts). */
struct up {
    int port;
    unsigned seed;
    uint64_t total;
    int status;
    char body[64];
    uint64_t hash;
    int send_failed; /* the client could not send all of it (the front answered first) */
    pthread_t th;
};

static void *up_main(void *arg)
{
    struct up *u = arg;
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    char head[128];
    u->status = -1;
    if (rd_open_try(r, u->port) < 0) {
        free(r);
        return NULL;
    }
    int n = snprintf(head, sizeof head,
                     "POST /up/hash HTTP/1.1\r\nHost: t\r\nContent-Length: %" PRIu64 "\r\n\r\n",
                     u->total);
    /* An answer that came before the body's end (502, 504, 503) is read as well. */
    u->send_failed = send_all_try(r->fd, head, (size_t)n) != 0 ||
                     send_body(r->fd, u->seed, u->total, u->total, 0, NULL, 0, &u->hash) != 0;
    read_resp(r, &p);
    u->status = p.status;
    if (p.body != NULL)
        snprintf(u->body, sizeof u->body, "%s", p.body);
    resp_free(&p);
    close(r->fd);
    free(r);
    return NULL;
}

/* No worker free (one, held by a latch): a 4 MiB upload waits in the queue with at most one
 * piece of it kept (the server stops reading the client meanwhile), then streams once the
 * worker is free; its hash matches. */
static void upload_queued_waits_for_worker(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct appw *ws[] = {w};
    struct fx *x = &t->x;
    static struct shmipc__front_stats st;
    struct up u = {.seed = 11, .total = 4u << 20};
    char want[64];
    x->max_body = 8u << 20;
    appw_start(w, "w0", NULL);
    atomic_store(&w->mode, M_HOLD);
    fx_start(x, ws, 1, 1, NULL);
    assert_true(wait_sessions(x, w->addr, 1));
    /* The first request holds the only worker. */
    int fd = tcp_connect(x->port);
    send_all(fd, "GET /first HTTP/1.1\r\nHost: t\r\n\r\n", 33);
    assert_true(wait_for(&w->requests, 1, WAIT_MS));
    u.port = x->port;
    assert_int_equal(pthread_create(&u.th, NULL, up_main, &u), 0);
    assert_true(wait_queued(x, 1));
    sleep_ms(300); /* the client sends what the server takes meanwhile */
    CHECK(shmipc__front_stats(x->f, &st));
    uint64_t kept = st.upload_kept;
    latch_set(w, &w->hold_open, 1);
    pthread_join(u.th, NULL);
    close(fd);
    if (kept == 0 || kept > KEPT_MAX)
        fail_msg("the front kept %" PRIu64 " bytes of a queued upload", kept);
    assert_int_equal(u.status, 200);
    hash_text(want, sizeof want, u.total, u.hash);
    assert_string_equal(u.body, want);
    CHECK(shmipc__front_stats(x->f, &st));
    assert_int_equal(st.upload_kept, 0);
    if (st.upload_kept_peak > KEPT_MAX)
        fail_msg("the front held %" PRIu64 " bytes of an upload", st.upload_kept_peak);
    assert_int_equal(atomic_load(&w->bad), 0);
}

/*
 * Regression (an attack review): a queued chunked upload handed to a session whose worker
 * exited right after its answer (the front had not seen the session end yet) failed at its
 * flush and went back to the queue; the next worker got its head and END without its body,
 * whose bytes had been framed for the dead stream, and the app answered 200 with an empty
 * body. Rounds, as the front sees the end before or after it hands the upload over; each
 * body is unique and must come back whole.
 */
static void upload_requeued_from_a_dead_session_keeps_its_body(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct appw *ws[] = {w};
    struct fx *x = &t->x;
    appw_start(w, "w0", NULL);
    fx_start(x, ws, 1, 1, NULL);
    for (int round = 0; round < 30; round++) {
        assert_true(wait_sessions(x, w->addr, 1));
        latch_set(w, &w->hold_open, 0);
        atomic_store(&w->mode, M_HOLD);
        int held = atomic_load(&w->holding);
        struct rd *a = malloc(sizeof *a), *b = malloc(sizeof *b);
        struct resp pa, pb;
        rd_open(a, x->port);
        send_all(a->fd, "GET /first HTTP/1.1\r\nHost: t\r\n\r\n", 33);
        assert_true(wait_for(&w->holding, held + 1, WAIT_MS));
        char body[64], req[256], want[96];
        int bl = snprintf(body, sizeof body, "round-%d-%08x", round, (unsigned)rand());
        int n = snprintf(req, sizeof req,
                         "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                         "%x\r\n%s\r\n0\r\n\r\n",
                         bl, body);
        rd_open(b, x->port);
        send_all(b->fd, req, (size_t)n);
        assert_true(wait_queued(x, 1));
        atomic_store(&w->die_after_answer, 1);
        atomic_store(&w->mode, M_ECHO);
        latch_set(w, &w->hold_open, 1);
        read_resp(a, &pa);
        assert_int_equal(pa.status, 200);
        read_resp(b, &pb);
        snprintf(want, sizeof want, "/echo:%s", body);
        if (pb.status != 200 || pb.body_len != strlen(want) || memcmp(pb.body, want, pb.body_len))
            fail_msg("round %d: %d \"%.*s\", want 200 \"%s\"", round, pb.status, (int)pb.body_len,
                     pb.body, want);
        resp_free(&pa);
        resp_free(&pb);
        close(a->fd);
        close(b->fd);
        free(a);
        free(b);
    }
    assert_int_equal(atomic_load(&w->bad), 0);
}

/*
 * The gather budget (an attack review: each connection could make the front take 64 KiB at
 * once by sending a head with Content-Length: 65536 and trickling its body): 16 clients each
 * send such a head and 100 bytes, with a budget of 4 bodies. The front holds at most the
 * budget of them whole; the others stream to the worker (uploads), one at a time. Then every
 * body ends, and each answer is its own body's hash.
 */
static void upload_small_bodies_within_the_gather_budget(void **state)
{
    enum { N = 16, LEN = 65536, PART = 100 };
    struct tc *t = *state;
    struct fx *x = &t->x;
    static struct shmipc__front_stats st;
    struct rd *r[N];
    uint64_t h[N];
    struct shmipc__front_opts o = {.gather_max = 4 * LEN};
    x->max_body = 1u << 20;
    tc_front(t, 1, &o);
    for (int i = 0; i < N; i++) {
        r[i] = malloc(sizeof *r[i]);
        rd_open(r[i], x->port);
        send_head(r[i]->fd, "/up/hash", LEN, 0, NULL);
        assert_int_equal(send_body(r[i]->fd, 100u + (unsigned)i, LEN, PART, 0, NULL, 0, NULL), 0);
    }
    uint64_t end = mono_ms() + WAIT_MS;
    do {
        sleep_ms(20);
        CHECK(shmipc__front_stats(x->f, &st));
    } while (st.gathered < 4 * LEN && mono_ms() < end);
    assert_int_equal(st.gathered, 4 * LEN);
    assert_true(st.gathered_peak <= 4 * LEN);
    sleep_ms(200); /* the rest have streamed or queued by now */
    CHECK(shmipc__front_stats(x->f, &st));
    assert_true(st.uploads >= N - 4);
    assert_true(st.upload_kept_peak <= KEPT_MAX);
    static uint8_t body[LEN];
    for (int i = 0; i < N; i++) {
        /* The rest of each body; the hash is the whole body's. */
        for (size_t k = 0; k < LEN; k++)
            body[k] = gen_byte(100u + (unsigned)i, k);
        h[i] = fnv1a(FNV_INIT, body, LEN);
        send_all(r[i]->fd, body + PART, LEN - PART);
    }
    for (int i = 0; i < N; i++) {
        struct resp p;
        char want[64];
        read_resp(r[i], &p);
        assert_int_equal(p.status, 200);
        hash_text(want, sizeof want, LEN, h[i]);
        assert_string_equal(p.body, want);
        resp_free(&p);
        close(r[i]->fd);
        free(r[i]);
    }
    CHECK(shmipc__front_stats(x->f, &st));
    assert_int_equal(st.gathered, 0);
    assert_true(st.gathered_peak <= 4 * LEN);
}

/* Wait until the front keeps part of an upload (stats), at most WAIT_MS. */
static int wait_kept(struct fx *x)
{
    static struct shmipc__front_stats st;
    uint64_t end = mono_ms() + WAIT_MS;
    while (mono_ms() < end) {
        CHECK(shmipc__front_stats(x->f, &st));
        if (st.upload_kept > 0)
            return 1;
        sleep_ms(5);
    }
    return 0;
}

/* The worker reads nothing while a 4 MiB upload fills its 1 MiB shared buffer: the front
 * keeps one piece (never the socket, never a wait in its loop: another request is served
 * meanwhile), and once the worker reads, the body goes on from where it stopped; its hash
 * matches. */
static void upload_shared_memory_full_holds_then_resumes(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct appw *w1 = &t->w[1];
    struct appw *ws[] = {w, w1};
    struct fx *x = &t->x;
    static struct shmipc__front_stats st;
    struct up u = {.seed = 12, .total = 4u << 20};
    struct resp p;
    char want[64];
    shmipc_config *ipc;
    CHECK(shmipc_config_new(&ipc));
    CHECK(shmipc_config_set_buffer_capacity(ipc, SHMIPC_MIN_BUFFER_CAPACITY));
    struct shmipc__front_opts o = {.ipc = ipc};
    x->max_body = 8u << 20;
    appw_start(w, "w0", NULL);
    appw_start(w1, "w1", NULL);
    atomic_store(&w->mode, M_STALL);
    atomic_store(&w1->mode, M_STALL);
    fx_start(x, ws, 2, 1, &o);
    shmipc_config_free(ipc);
    assert_true(wait_sessions(x, w->addr, 1));
    assert_true(wait_sessions(x, w1->addr, 1));
    u.port = x->port;
    assert_int_equal(pthread_create(&u.th, NULL, up_main, &u), 0);
    int kept = wait_kept(x);
    /* The loop is not stuck on the full buffer. */
    assert_int_equal(request(x->port, "GET", "/static", NULL, &p), 200);
    resp_free(&p);
    latch_set(w, &w->release_stall, 1);
    latch_set(w1, &w1->release_stall, 1);
    pthread_join(u.th, NULL);
    assert_true(kept);
    assert_int_equal(u.status, 200);
    hash_text(want, sizeof want, u.total, u.hash);
    assert_string_equal(u.body, want);
    CHECK(shmipc__front_stats(x->f, &st));
    assert_int_equal(st.upload_kept, 0);
    if (st.upload_kept_peak > KEPT_MAX)
        fail_msg("the front held %" PRIu64 " bytes of an upload", st.upload_kept_peak);
    assert_int_equal(atomic_load(&w->bad) + atomic_load(&w1->bad), 0);
}

/* A cross-talk client: uploads unique bodies to "/up/echo" and checks the echo byte by byte. */
struct xc {
    int port, id;
    atomic_int *mism, *ok;
    pthread_t th;
};

#define XT_CLIENTS 16
#define XT_ROUNDS  3

static void *xc_main(void *arg)
{
    struct xc *c = arg;
    static const size_t sizes[] = {4093, 1, 65536, 777};
    for (int i = 0; i < XT_ROUNDS; i++) {
        unsigned seed = (unsigned)(c->id * 131 + i * 7 + 1);
        uint64_t total = i == 0 ? (1u << 20) + (uint64_t)c->id * 1000u
                                : (uint64_t)c->id * 3001u + (uint64_t)i * 70001u + 1u;
        int chunked = (c->id + i) % 2;
        struct rd *r = malloc(sizeof *r);
        struct resp p;
        struct sbody sb;
        char head[160];
        int bad = 1;
        if (rd_open_try(r, c->port) == 0) {
            int n = chunked ? snprintf(head, sizeof head,
                                       "POST /up/echo HTTP/1.1\r\nHost: t\r\n"
                                       "Transfer-Encoding: chunked\r\n\r\n")
                            : snprintf(head, sizeof head,
                                       "POST /up/echo HTTP/1.1\r\nHost: t\r\n"
                                       "Content-Length: %" PRIu64 "\r\n\r\n",
                                       total);
            if (send_all_try(r->fd, head, (size_t)n) == 0 &&
                send_body(r->fd, seed, total, total, chunked, sizes, 4, NULL) == 0) {
                read_resp_x(r, &p, 1);
                if (p.status == 200) {
                    read_stream_body(r, &p, seed, 0, 0, &sb);
                    bad = !sb.complete || sb.bad || sb.got != total;
                }
                resp_free(&p);
            }
            close(r->fd);
        }
        free(r);
        atomic_fetch_add(bad ? c->mism : c->ok, 1);
    }
    return NULL;
}

/* 16 clients x 3 unique bodies (one of each client's over 1 MiB, half of them chunked) over
 * 2 workers and 2 reactor threads, echoed back: every byte where it belongs, and no worker
 * ever served two at once. */
static void upload_cross_talk(void **state)
{
    struct tc *t = *state;
    struct appw *w0 = &t->w[0];
    struct appw *w1 = &t->w[1];
    struct appw *ws[] = {w0, w1};
    struct fx *x = &t->x;
    static struct xc c[XT_CLIENTS];
    static struct shmipc__front_stats st;
    x->max_body = 4u << 20;
    appw_start(w0, "w0", NULL);
    appw_start(w1, "w1", NULL);
    fx_start(x, ws, 2, 2, NULL);
    atomic_store(&t->mism, 0);
    atomic_store(&t->ok, 0);
    for (int i = 0; i < XT_CLIENTS; i++) {
        c[i] = (struct xc){.port = x->port, .id = i, .mism = &t->mism, .ok = &t->ok};
        assert_int_equal(pthread_create(&c[i].th, NULL, xc_main, &c[i]), 0);
    }
    for (int i = 0; i < XT_CLIENTS; i++)
        pthread_join(c[i].th, NULL);
    assert_int_equal(atomic_load(&t->mism), 0);
    assert_int_equal(atomic_load(&t->ok), XT_CLIENTS * XT_ROUNDS);
    assert_true(atomic_load(&w0->max_concurrent) <= 1);
    assert_true(atomic_load(&w1->max_concurrent) <= 1);
    assert_int_equal(atomic_load(&w0->bad) + atomic_load(&w1->bad), 0);
    CHECK(shmipc__front_stats(x->f, &st));
    assert_int_equal(st.upload_kept, 0);
}

/* ---- an attacker's review (s22): lying clients, dying workers, lifecycles ---- */

/* Appends `n` bytes of body number `seed` from offset `off` to b (at *len), hashing them. */
static void put_body(char *b, size_t *len, unsigned seed, uint64_t off, size_t n, uint64_t *h)
{
    for (size_t i = 0; i < n; i++)
        b[*len + i] = (char)gen_byte(seed, off + i);
    *h = fnv1a(*h, b + *len, n);
    *len += n;
}

static void put_str(char *b, size_t *len, const char *str)
{
    size_t n = strlen(str);
    memcpy(b + *len, str, n);
    *len += n;
}

/* One write carries a chunked upload (chunk extensions, trailers), a streamed Content-Length
 * upload (over the 64 KiB gather), a GET and a small gathered upload: four answers in order,
 * each body whole (nothing of one body leaks into the next request). */
static void upload_pipelined_after_bodies(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct fx *x = &t->x;
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    char want[64], line[64];
    size_t len = 0;
    uint64_t h1 = FNV_INIT, h2 = FNV_INIT, h3 = FNV_INIT;
    char *b = malloc(1u << 20);
    tc_front(t, 1, NULL);
    put_str(b, &len, "POST /up/hash HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
    static const size_t sizes[] = {1, 7, 4096, 70000, 3};
    uint64_t off = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        snprintf(line, sizeof line, "%zx%s\r\n", sizes[i], i == 1 ? ";name=\"v;x\"" : "");
        put_str(b, &len, line);
        put_body(b, &len, 31, off, sizes[i], &h1);
        put_str(b, &len, "\r\n");
        off += sizes[i];
    }
    put_str(b, &len, "0\r\nX-Trailer: 1\r\nX-Other: two\r\n\r\n");
    put_str(b, &len, "POST /up/hash HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n");
    put_body(b, &len, 32, 0, 100000, &h2);
    put_str(b, &len, "GET /static HTTP/1.1\r\nHost: t\r\n\r\n");
    put_str(b, &len, "POST /up/hash HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n");
    put_body(b, &len, 33, 0, 10, &h3);
    rd_open(r, x->port);
    send_all(r->fd, b, len);
    read_resp(r, &p);
    assert_int_equal(p.status, 200);
    hash_text(want, sizeof want, off, h1);
    assert_string_equal(p.body, want);
    resp_free(&p);
    read_resp(r, &p);
    assert_int_equal(p.status, 200);
    hash_text(want, sizeof want, 100000, h2);
    assert_string_equal(p.body, want);
    resp_free(&p);
    read_resp(r, &p);
    assert_int_equal(p.status, 200);
    assert_string_equal(p.body, "static");
    resp_free(&p);
    read_resp(r, &p);
    assert_int_equal(p.status, 200);
    hash_text(want, sizeof want, 10, h3);
    assert_string_equal(p.body, want);
    resp_free(&p);
    close(r->fd);
    free(r);
    free(b);
    assert_int_equal(atomic_load(&w->bad), 0);
}

/* A chunked upload (an extension, a trailer) cut after every one of its bytes, the client
 * gone with a FIN (then with a reset at a few places): each request that reached the worker
 * ends with ABORT CLIENT_GONE, never an END (a cut body is never passed off as whole), the
 * front keeps nothing, the worker is free after each. */
static void upload_cut_at_every_byte(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct fx *x = &t->x;
    static struct shmipc__front_stats st;
    char b[512];
    size_t len = 0;
    uint64_t h = FNV_INIT;
    tc_front(t, 1, NULL);
    put_str(b, &len, "POST /up/hash HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
    size_t head_len = len;
    put_str(b, &len, "5;e=1\r\n");
    put_body(b, &len, 41, 0, 5, &h);
    put_str(b, &len, "\r\n11\r\n");
    put_body(b, &len, 41, 5, 17, &h);
    put_str(b, &len, "\r\n0\r\nX-T: 1\r\n\r\n");
    int reached = 0;
    for (size_t cut = 1; cut < len; cut++) {
        int fd = tcp_connect(x->port);
        send_all(fd, b, cut);
        if (cut >= head_len) {
            reached++;
            /* the head reached the worker before the client leaves (else it may be cut
             * before its route ran: nothing to abort) */
            assert_true(wait_for(&w->requests, reached, WAIT_MS));
        }
        close(fd);
        assert_true(wait_for(&w->aborts[SHMIPC_SERVE_ABORT_CLIENT_GONE], reached, WAIT_MS));
    }
    /* resets, at the head's end, mid-chunk and just before the end */
    size_t rst[] = {head_len, head_len + 9, len - 1};
    for (size_t i = 0; i < 3; i++) {
        int fd = tcp_connect(x->port);
        send_all(fd, b, rst[i]);
        assert_true(wait_for(&w->requests, reached + 1, WAIT_MS));
        reached++;
        struct linger lg = {1, 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        close(fd);
        assert_true(wait_for(&w->aborts[SHMIPC_SERVE_ABORT_CLIENT_GONE], reached, WAIT_MS));
    }
    /* Content-Length bodies that stop short: a gathered one (100 bytes, 50 sent) never reaches
     * the worker; a streamed one (70000) cut at the frame's edge and one byte short is aborted */
    static char cl[70000];
    int fd = tcp_connect(x->port);
    send_head(fd, "/up/hash", 100, 0, NULL);
    send_all(fd, cl, 50);
    close(fd);
    size_t cuts[] = {0, 65535, 65536, 65537, 69999};
    for (size_t i = 0; i < 5; i++) {
        fd = tcp_connect(x->port);
        send_head(fd, "/up/hash", 70000, 0, NULL);
        send_all(fd, cl, cuts[i]);
        assert_true(wait_for(&w->requests, reached + 1, WAIT_MS));
        reached++;
        close(fd);
        assert_true(wait_for(&w->aborts[SHMIPC_SERVE_ABORT_CLIENT_GONE], reached, WAIT_MS));
    }
    /* the whole of it still goes */
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    char want[64];
    rd_open(r, x->port);
    send_all(r->fd, b, len);
    read_resp(r, &p);
    assert_int_equal(p.status, 200);
    hash_text(want, sizeof want, 22, h);
    assert_string_equal(p.body, want);
    resp_free(&p);
    close(r->fd);
    free(r);
    CHECK(shmipc__front_stats(x->f, &st));
    assert_int_equal(st.upload_kept, 0);
    assert_int_equal(atomic_load(&w->bad), 0);
    assert_int_equal(atomic_load(&w->aborts[SHMIPC_SERVE_ABORT_CLIENT_GONE]), reached);
    assert_int_equal(atomic_load(&w->requests), reached + 1); /* the gathered cut never went */
}

/* The worker answers early while the client's pipelined GET already follows the whole body
 * in the same write: either the body was still coming at the answer (Connection: close, the
 * close, the GET never answered: what follows is drained, never parsed), or it had come
 * whole (kept alive: the GET answered next, nothing else). */
static void upload_early_answer_then_pipelined_request(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct fx *x = &t->x;
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    char *b = malloc(256u << 10);
    size_t len = 0;
    uint64_t h = FNV_INIT;
    tc_front(t, 1, NULL);
    put_str(b, &len, "POST /up/early HTTP/1.1\r\nHost: t\r\nContent-Length: 200000\r\n\r\n");
    put_body(b, &len, 51, 0, 200000, &h);
    put_str(b, &len, "GET /static HTTP/1.1\r\nHost: t\r\n\r\n");
    rd_open(r, x->port);
    send_all(r->fd, b, len);
    read_resp(r, &p);
    assert_int_equal(p.status, 200);
    assert_string_equal(p.body, "early");
    if (strcasestr(p.head, "Connection: close") == NULL) {
        /* The whole body had come (the server read it to its end): the GET is the next
         * request, answered on the same connection, as nginx does. */
        resp_free(&p);
        read_resp(r, &p);
        assert_int_equal(p.status, 200);
        assert_string_equal(p.body, "static");
    } else {
        /* Cut off (the body was pending at the answer): the GET is drained, never answered. */
        assert_true(peer_closed(r->fd));
    }
    resp_free(&p);
    assert_int_equal(r->len, 0); /* nothing after the answers */
    close(r->fd);
    free(r);
    free(b);
    assert_int_equal(atomic_load(&w->bad), 0);
}

/* Resend safety for chunked bodies, both workers stopping: a small chunked body that came
 * whole with its head went in one message and is kept, so a refusal sends it to the other
 * worker (retried); one whose bytes came after the head went on its own is never resent. */
static void upload_chunked_resent_only_when_whole_in_first_message(void **state)
{
    struct tc *t = *state;
    struct appw *w0 = &t->w[0];
    struct appw *w1 = &t->w[1];
    struct appw *ws[] = {w0, w1};
    struct fx *x = &t->x;
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    static struct shmipc__front_stats st;
    static const char head[] = "POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
    static const char body[] = "5\r\nhello\r\n0\r\n\r\n";
    appw_start(w0, "w0", NULL);
    appw_start(w1, "w1", NULL);
    atomic_store(&w0->mode, M_REFUSE);
    atomic_store(&w1->mode, M_REFUSE);
    fx_start(x, ws, 2, 1, NULL);
    assert_true(wait_sessions(x, w0->addr, 1));
    assert_true(wait_sessions(x, w1->addr, 1));
    /* whole in the first message: refused by one, resent to the other, refused again */
    char one[256];
    snprintf(one, sizeof one, "%s%s", head, body);
    rd_open(r, x->port);
    send_all(r->fd, one, strlen(one));
    read_resp(r, &p);
    assert_int_equal(p.status, 503);
    resp_free(&p);
    close(r->fd);
    CHECK(shmipc__front_stats(x->f, &st));
    assert_true(st.retried >= 1);
    uint64_t retried = st.retried;
    assert_true(wait_for(&w0->refused, 1, WAIT_MS));
    assert_true(wait_for(&w1->refused, 1, WAIT_MS));
    int refused = atomic_load(&w0->refused) + atomic_load(&w1->refused);
    /* the head alone first, the body 100 ms later: never resent */
    rd_open(r, x->port);
    send_all(r->fd, head, strlen(head));
    sleep_ms(100);
    send_all(r->fd, body, strlen(body));
    read_resp(r, &p);
    assert_int_equal(p.status, 503);
    resp_free(&p);
    close(r->fd);
    free(r);
    CHECK(shmipc__front_stats(x->f, &st));
    assert_int_equal(st.retried, retried);
    assert_int_equal(atomic_load(&w0->refused) + atomic_load(&w1->refused), refused + 1);
    assert_int_equal(atomic_load(&w0->bad) + atomic_load(&w1->bad), 0);
}

/* A 4 MiB upload held by a stalled worker (1 MiB shared buffer): the front keeps one piece.
 * Sets it up on t->w[0] (and the case's opts; its acceptor lags `accept_lag_ms`), returns
 * with the piece kept. */
static void held_upload(struct tc *t, struct up *u, uint32_t deadline_ms, unsigned nw,
                        unsigned accept_lag_ms)
{
    struct appw *ws[] = {&t->w[0], &t->w[1]};
    struct fx *x = &t->x;
    shmipc_config *ipc;
    CHECK(shmipc_config_new(&ipc));
    CHECK(shmipc_config_set_buffer_capacity(ipc, SHMIPC_MIN_BUFFER_CAPACITY));
    struct shmipc__front_opts o = {.ipc = ipc, .deadline_ms = deadline_ms};
    x->max_body = 8u << 20;
    appw_start(&t->w[0], "w0", NULL);
    atomic_store(&t->w[0].mode, M_STALL);
    atomic_store(&t->w[0].accept_lag_ms, accept_lag_ms);
    if (nw > 1)
        appw_start(&t->w[1], "w1", NULL);
    fx_start(x, ws, 1, 1, &o);
    shmipc_config_free(ipc);
    assert_true(wait_sessions(x, t->w[0].addr, 1));
    /* And the worker holds it: the front uses a session as soon as its handshake is done,
     * maybe before the worker's acceptor took it in, and kill_sessions would miss that one
     * (the upload then waited for its deadline: a 504, not the 502). */
    assert_true(appw_wait_sessions(&t->w[0], 1));
    u->port = x->port;
    assert_int_equal(pthread_create(&u->th, NULL, up_main, u), 0);
    assert_true(wait_kept(x));
}

/* Wait until the front keeps nothing of an upload. */
static void wait_unkept(struct fx *x)
{
    static struct shmipc__front_stats st;
    uint64_t end = mono_ms() + WAIT_MS;
    do {
        CHECK(shmipc__front_stats(x->f, &st));
        if (st.upload_kept == 0)
            return;
        sleep_ms(5);
    } while (mono_ms() < end);
    fail_msg("the front still keeps %" PRIu64 " bytes of an upload", st.upload_kept);
}

/* The worker's session dies while the front keeps a piece of its upload: 502 (the client may
 * have been cut off sending), the piece freed, the next upload whole. The worker's acceptor
 * lags 200 ms, so the upload fills its session before the worker holds it: what a loaded
 * host did now and then, when the case killed nothing and got a 504 (held_upload waits). */
static void upload_session_dies_while_piece_kept(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct up u = {.seed = 61, .total = 4u << 20};
    held_upload(t, &u, 0, 1, 200);
    kill_sessions(w);
    pthread_join(u.th, NULL);
    if (!(u.status == 502 || (u.status == -1 && u.send_failed)))
        fail_msg("status %d (send failed %d)", u.status, u.send_failed);
    wait_unkept(&t->x);
    atomic_store(&w->mode, M_ECHO);
    latch_set(w, &w->release_stall, 1);
    assert_true(wait_sessions(&t->x, w->addr, 1));
    upload_hashed(t->x.port, 62, 300000, 0, NULL, 0);
    assert_int_equal(atomic_load(&w->bad), 0);
}

/* The deadline passes while the front keeps a piece (the worker reads nothing): 504, the
 * piece freed, the worker told ABORT TIMEOUT once it reads (behind the body it was sent),
 * free again after. */
static void upload_deadline_while_piece_kept(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct up u = {.seed = 63, .total = 4u << 20};
    held_upload(t, &u, 3000, 1, 0); /* long enough for the piece to be kept under load */
    pthread_join(u.th, NULL);
    if (!(u.status == 504 || (u.status == -1 && u.send_failed)))
        fail_msg("status %d (send failed %d)", u.status, u.send_failed);
    wait_unkept(&t->x);
    latch_set(w, &w->release_stall, 1);
    if (!wait_for(&w->aborts[SHMIPC_SERVE_ABORT_TIMEOUT], 1, WAIT_MS))
        fail_msg("no ABORT TIMEOUT: status %d send_failed %d requests %d aborts %d %d %d %d %d "
                 "bad %d",
                 u.status, u.send_failed, atomic_load(&w->requests), atomic_load(&w->aborts[0]),
                 atomic_load(&w->aborts[1]), atomic_load(&w->aborts[2]), atomic_load(&w->aborts[3]),
                 atomic_load(&w->aborts[4]), atomic_load(&w->bad));
    CHECK(shmipc__front_set_deadline(t->x.f, SHMIPC__FRONT_NO_DEADLINE)); /* as stalls_504 */
    upload_hashed(t->x.port, 64, 300000, 0, NULL, 0);
    assert_int_equal(atomic_load(&w->bad), 0);
}

/* The worker is retired (set_workers) while the front keeps a piece of its upload: the upload
 * finishes there, whole; then its session closes and new requests go to the new set. */
static void upload_worker_retired_mid_upload(void **state)
{
    struct tc *t = *state;
    struct appw *w0 = &t->w[0];
    struct appw *w1 = &t->w[1];
    struct fx *x = &t->x;
    struct up u = {.seed = 65, .total = 4u << 20};
    struct resp p;
    char want[64];
    static struct shmipc__front_stats st;
    held_upload(t, &u, 0, 2, 0);
    const char *addrs[] = {w1->addr};
    CHECK(shmipc__front_set_workers(x->f, addrs, 1));
    assert_true(wait_sessions(x, w1->addr, 1));
    latch_set(w0, &w0->release_stall, 1);
    pthread_join(u.th, NULL);
    assert_int_equal(u.status, 200);
    hash_text(want, sizeof want, u.total, u.hash);
    assert_string_equal(u.body, want);
    assert_int_equal(request(x->port, "GET", "/after", NULL, &p), 200);
    assert_non_null(strstr(p.head, "X-Worker: w1"));
    resp_free(&p);
    uint64_t end = mono_ms() + WAIT_MS;
    unsigned left = 1;
    while (left > 0 && mono_ms() < end) {
        CHECK(shmipc__front_stats(x->f, &st));
        left = 0;
        for (unsigned i = 0; i < st.nworkers; i++)
            if (strcmp(st.w[i].address, w0->addr) == 0)
                left = st.w[i].sessions;
        if (left > 0)
            sleep_ms(5);
    }
    assert_int_equal(left, 0); /* the retired worker's session closed once idle */
    assert_int_equal(st.upload_kept, 0);
    assert_int_equal(atomic_load(&w0->bad) + atomic_load(&w1->bad), 0);
}

/* The front and its server stop while the front keeps a piece of an upload: the client is
 * answered or closed, nothing crashes or leaks (ASan), the stalled worker sees the stream
 * end once it reads. */
static void upload_front_stopped_mid_upload(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct up u = {.seed = 67, .total = 4u << 20};
    held_upload(t, &u, 0, 1, 0);
    fx_stop(&t->x);
    pthread_join(u.th, NULL);
    if (u.status != -1 && u.status != 503)
        fail_msg("status %d", u.status);
    latch_set(w, &w->release_stall, 1);
    assert_int_equal(atomic_load(&w->bad), 0);
}

#define T(f) cmocka_unit_test_setup_teardown(f, tc_setup, tc_teardown)
#define UPLOAD_TESTS                                                                               \
    T(upload_64m_content_length), T(upload_chunked_odd_sizes), T(upload_chunked_over_limit_413),   \
        T(upload_bad_chunk_framing_400), T(upload_client_stalls_504),                              \
        T(upload_client_gone_frees_worker), T(upload_early_answer_closes),                         \
        T(upload_expect_100_continue), T(upload_refused_after_body_not_resent),                    \
        T(upload_refused_before_taken_goes_to_another_worker),                                     \
        T(stopping_worker_hello_gets_no_upload), T(upload_refused_then_more_body_while_queued),    \
        T(upload_queued_waits_for_worker), T(upload_requeued_from_a_dead_session_keeps_its_body),  \
        T(upload_small_bodies_within_the_gather_budget),                                           \
        T(upload_shared_memory_full_holds_then_resumes), T(upload_cross_talk),                     \
        T(upload_pipelined_after_bodies), T(upload_cut_at_every_byte),                             \
        T(upload_early_answer_then_pipelined_request),                                             \
        T(upload_chunked_resent_only_when_whole_in_first_message),                                 \
        T(upload_session_dies_while_piece_kept), T(upload_deadline_while_piece_kept),              \
        T(upload_worker_retired_mid_upload), T(upload_front_stopped_mid_upload)

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {UPLOAD_TESTS};
    int rc;
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    unsetenv("SHMIPC_REACTOR_BACKEND");
    suite_backend = SHMIPC_BACKEND_EPOLL;
    rc = cmocka_run_group_tests_name("front_upload_epoll", tests, NULL, NULL);
    suite_backend = SHMIPC_BACKEND_AUTO; /* io_uring where the kernel has it */
    rc |= cmocka_run_group_tests_name("front_upload_uring", tests, NULL, NULL);
    return rc != 0;
}
