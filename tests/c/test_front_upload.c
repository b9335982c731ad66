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
    struct appw *ws[] = {w};
    struct fx *x = &t->x;
    static struct shmipc__front_stats st;
    shmipc_config *ipc;
    /* The smallest shared buffer: 64 MiB go through 1 MiB as the worker frees it. */
    CHECK(shmipc_config_new(&ipc));
    CHECK(shmipc_config_set_buffer_capacity(ipc, SHMIPC_MIN_BUFFER_CAPACITY));
    struct shmipc__front_opts o = {.ipc = ipc};
    x->max_body = 128u << 20;
    appw_start(w, "w0", NULL);
    fx_start(x, ws, 1, 1, &o);
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
    struct appw *ws[] = {w};
    struct fx *x = &t->x;
    static const size_t sizes[] = {1, 7, 4093, 65537, 3, 131071, 2, 16384, 999};
    x->max_body = 4u << 20;
    appw_start(w, "w0", NULL);
    fx_start(x, ws, 1, 1, NULL);
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
    struct appw *ws[] = {w};
    struct fx *x = &t->x;
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    static const size_t sizes[] = {32768};
    appw_start(w, "w0", NULL);
    fx_start(x, ws, 1, 1, NULL);
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
    struct appw *ws[] = {w};
    struct fx *x = &t->x;
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    static const size_t sizes[] = {50000};
    appw_start(w, "w0", NULL);
    fx_start(x, ws, 1, 1, NULL);
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
    struct appw *ws[] = {w};
    struct fx *x = &t->x;
    struct shmipc__front_opts o = {.deadline_ms = 500};
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    appw_start(w, "w0", NULL);
    fx_start(x, ws, 1, 1, &o);
    rd_open(r, x->port);
    send_head(r->fd, "/up/hash", 1u << 20, 0, NULL);
    assert_int_equal(send_body(r->fd, 1, 1u << 20, 200000, 0, NULL, 0, NULL), 0);
    read_resp(r, &p);
    assert_int_equal(p.status, 504);
    resp_free(&p);
    close(r->fd);
    free(r);
    assert_true(wait_for(&w->aborts[SHMIPC_SERVE_ABORT_TIMEOUT], 1, WAIT_MS));
    upload_hashed(x->port, 2, 300000, 0, NULL, 0);
    assert_int_equal(atomic_load(&w->bad), 0);
}

/* The client leaves mid-body, with a FIN and with a reset: the worker gets ABORT CLIENT_GONE
 * each time and is free for the next request (one worker: the next upload proves it). */
static void upload_client_gone_frees_worker(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct appw *ws[] = {w};
    struct fx *x = &t->x;
    appw_start(w, "w0", NULL);
    fx_start(x, ws, 1, 1, NULL);
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
    struct appw *ws[] = {w};
    struct fx *x = &t->x;
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    x->max_body = 8u << 20;
    appw_start(w, "w0", NULL);
    fx_start(x, ws, 1, 1, NULL);
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
    struct appw *w = &t->w[0];
    struct appw *ws[] = {w};
    struct fx *x = &t->x;
    appw_start(w, "w0", NULL);
    fx_start(x, ws, 1, 1, NULL);
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

/* An upload client thread (it never asserts). */
struct up {
    int port;
    unsigned seed;
    uint64_t total;
    int status;
    char body[64];
    uint64_t hash;
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
    if (send_all_try(r->fd, head, (size_t)n) == 0 &&
        send_body(r->fd, u->seed, u->total, u->total, 0, NULL, 0, &u->hash) == 0) {
        read_resp(r, &p);
        u->status = p.status;
        if (p.body != NULL)
            snprintf(u->body, sizeof u->body, "%s", p.body);
        resp_free(&p);
    }
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

#define T(f) cmocka_unit_test_setup_teardown(f, tc_setup, tc_teardown)
#define UPLOAD_TESTS                                                                               \
    T(upload_64m_content_length), T(upload_chunked_odd_sizes), T(upload_chunked_over_limit_413),   \
        T(upload_bad_chunk_framing_400), T(upload_client_stalls_504),                              \
        T(upload_client_gone_frees_worker), T(upload_early_answer_closes),                         \
        T(upload_expect_100_continue), T(upload_refused_after_body_not_resent),                    \
        T(upload_queued_waits_for_worker), T(upload_shared_memory_full_holds_then_resumes),        \
        T(upload_cross_talk)

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
