/* Description: shmipc-serve's front (core/serve/front.c) streaming responses end to end on
 * epoll and io_uring (docs/serve.md, "Streamed responses"): chunked, sized and close-delimited
 * framing exact to the byte, pipelining and keep-alive after a streamed body, backpressure to
 * the worker (a slow client holds the worker back; the front holds at most the mark and a
 * frame), a worker dying mid-body, the client leaving mid-body, the deadline between two
 * pieces, and cross-talk over 2 workers and 2 reactor threads.
 *
 * The harness is test_front.c's (copied): every case keeps its workers, front and client
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

static int suite_backend = SHMIPC_BACKEND_EPOLL;

#define CHECK(call)                                                                                \
    do {                                                                                           \
        int check_rc_ = (call);                                                                    \
        if (check_rc_ < 0)                                                                         \
            fail_msg("%s: %s: %s", #call, shmipc_errname(check_rc_), shmipc_error_detail());       \
    } while (0)

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The cap on any wait for an event: long, so that a loaded machine under a sanitizer never
 * overruns it; a passing run never waits it out. */
#define WAIT_MS 30000

/* Every counter a case waits on is bumped with bump(), which wakes the waiters. */
static pthread_mutex_t ev_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ev_cv = PTHREAD_COND_INITIALIZER;

static void bump(atomic_int *v)
{
    atomic_fetch_add(v, 1);
    pthread_mutex_lock(&ev_mu);
    pthread_cond_broadcast(&ev_cv);
    pthread_mutex_unlock(&ev_mu);
}

/* Waits on cv (a CLOCK_REALTIME condition variable) for at most `ms`. */
static void cv_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, unsigned ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(cv, mu, &ts);
}

static int wait_for(atomic_int *v, int want, unsigned ms)
{
    uint64_t end = mono_ms() + ms;
    pthread_mutex_lock(&ev_mu);
    while (atomic_load(v) < want && mono_ms() < end)
        cv_wait_ms(&ev_cv, &ev_mu, 50);
    pthread_mutex_unlock(&ev_mu);
    return atomic_load(v) >= want;
}

/* ---- application workers: threads of this process ---- */

enum mode {
    M_ECHO = 0, /* 200, body = target ":" body, X-Worker: name */
    M_HOLD,     /* M_ECHO once the test opens the worker's hold latch */
    M_DIE,      /* reads the request, then every session of the worker ends */
    M_BAD,      /* answers a frame with a bad magic */
    M_HUGE,     /* a body of 1 MiB in 64 KiB frames, no Content-Length */
    M_MID_END,  /* RESPONSE_HEAD, then closes its stream */
    M_HANG,     /* never answers; waits for the front's ABORT */
    M_STALL,    /* never reads the stream at all until the test opens release_stall */
};

struct appw {
    char name[16];
    char addr[96];
    shmipc_listener *l;
    pthread_t acceptor;
    int started;
    atomic_int stop;
    atomic_int mode;
    /* latches, set under mu and signalled on cv */
    atomic_int hold_open;
    atomic_int release_stall;
    atomic_int freeze;     /* session threads touch nothing (the queue to it stays full) */
    int parked;            /* session threads waiting out a freeze (under mu) */
    atomic_int bad;        /* what a worker thread found wrong (it cannot assert) */
    atomic_int requests;   /* request heads read */
    atomic_int aborts[8];  /* ABORT reasons the front sent */
    atomic_int concurrent; /* streams being served now */
    atomic_int max_concurrent;
    atomic_int streamed; /* stream_mode bodies sent whole */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    shmipc_session *sess[16];
    pthread_t sthreads[16];
    int nsess;
};

struct sarg {
    struct appw *w;
    shmipc_session *s;
};

static int read_frame(shmipc_stream *st, uint8_t **buf, size_t *len, shmipc_serve_frame *f)
{
    const void *p;
    uint8_t h[12];
    int rc = shmipc_stream_read_exact_bytes(st, 12, &p, 0);
    if (rc < 0)
        return rc;
    memcpy(h, p, 12);
    f->size = sizeof *f;
    if (shmipc_serve_decode_header(h, 12, f) != 12)
        return SHMIPC_EPROTO;
    *len = 12 + f->length;
    *buf = malloc(*len);
    memcpy(*buf, h, 12);
    if (f->length > 0) {
        rc = shmipc_stream_read_exact_bytes(st, f->length, &p, 0);
        if (rc < 0) {
            free(*buf);
            return rc;
        }
        memcpy(*buf + 12, p, f->length);
    }
    shmipc_stream_release(st);
    f->size = sizeof *f;
    return shmipc_serve_decode(*buf, *len, f) == (int64_t)*len ? 0 : SHMIPC_EPROTO;
}

/* Reads until the front's ABORT (counted) or the stream's end, up to WAIT_MS. */
static void wait_abort(struct appw *w, shmipc_stream *st)
{
    shmipc_stream_set_timeout(st, SHMIPC_TIMEOUT_READ, WAIT_MS);
    for (;;) {
        uint8_t *b;
        size_t n;
        shmipc_serve_frame f;
        if (read_frame(st, &b, &n, &f) < 0)
            return;
        free(b);
        if (f.type == SHMIPC_SERVE_ABORT) {
            bump(&w->aborts[f.arg & 7]);
            return;
        }
    }
}

static void send_frames(struct appw *w, shmipc_stream *st, int status, const char *name,
                        const void *body, size_t len, int with_length, int is_head)
{
    uint8_t head[512], h[12];
    shmipc_serve_field fields[2] = {
        {(const uint8_t *)"Content-Type", (const uint8_t *)"text/plain", 12, 10},
        {(const uint8_t *)"X-Worker", (const uint8_t *)name, 8, (uint32_t)strlen(name)},
    };
    shmipc_serve_response r = {.size = sizeof r, .status = (uint16_t)status};
    if (with_length) {
        r.flags = SHMIPC_SERVE_RESP_CONTENT_LENGTH;
        r.content_length = len;
    }
    int64_t n = shmipc_serve_encode_response_head(head, sizeof head, &r, fields, 2);
    if (n <= 0) {
        bump(&w->bad);
        return;
    }
    shmipc_stream_write(st, head, (size_t)n);
    if (len > 0 && !is_head) { /* HEAD: the length, no body */
        shmipc_serve_encode_header(h, 12, SHMIPC_SERVE_BODY, len, 0);
        shmipc_stream_write(st, h, 12);
        shmipc_stream_write(st, body, len);
    }
    shmipc_serve_encode_header(h, 12, SHMIPC_SERVE_END, 0, 0);
    shmipc_stream_write(st, h, 12);
    /* The front may hand this worker its next request once END is out: this one is over. */
    atomic_fetch_sub(&w->concurrent, 1);
    shmipc_stream_flush(st);
}

static void kill_sessions(struct appw *w)
{
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < w->nsess; i++)
        shmipc_session_shutdown(w->sess[i]);
    pthread_mutex_unlock(&w->mu);
}

/* Waits until *flag is set (under w->mu, signalled on w->cv) or the worker stops. */
static void latch_wait(struct appw *w, atomic_int *flag)
{
    pthread_mutex_lock(&w->mu);
    while (!atomic_load(flag) && !atomic_load(&w->stop))
        cv_wait_ms(&w->cv, &w->mu, 1000);
    pthread_mutex_unlock(&w->mu);
}

static void latch_set(struct appw *w, atomic_int *flag, int v)
{
    pthread_mutex_lock(&w->mu);
    atomic_store(flag, v);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Byte i of the streamed body number `seed`: unique enough per body and offset that a
 * piece sent to the wrong client, twice, or out of order is seen. */
static uint8_t gen_byte(unsigned seed, uint64_t i)
{
    return (uint8_t)(seed * 131u + i * 7u + (i >> 12) + (i >> 20) * 3u);
}

/*
 * "/stream/<total>/<frame>/<cl>/<seed>/<how>": a 200 whose body (gen_byte) comes in BODY
 * frames of <frame> bytes, flushed one by one (the session's queue pushes back); with a
 * Content-Length when <cl> is 1. <how>: 'e' END at the end; 'd' the worker dies at half;
 * 's' stalls at half until the front's ABORT; any: an ABORT from the front stops it.
 */
static void stream_mode(struct appw *w, shmipc_stream *st, const char *target, int is_head)
{
    unsigned long long total = 0, frame = 0, off = 0;
    int cl = 0;
    unsigned seed = 0;
    char how = 'e';
    uint8_t head[256], h[12];
    if (sscanf(target, "/stream/%llu/%llu/%d/%u/%c", &total, &frame, &cl, &seed, &how) != 5 ||
        frame == 0 || frame > (1u << 20)) {
        atomic_fetch_sub(&w->concurrent, 1);
        return;
    }
    shmipc_serve_field ct = {(const uint8_t *)"Content-Type", (const uint8_t *)"application/x-t",
                             12, 15};
    shmipc_serve_response r = {.size = sizeof r, .status = 200};
    if (cl) {
        r.flags = SHMIPC_SERVE_RESP_CONTENT_LENGTH;
        r.content_length = total;
    }
    int64_t hn = shmipc_serve_encode_response_head(head, sizeof head, &r, &ct, 1);
    shmipc_stream_set_timeout(st, SHMIPC_TIMEOUT_WRITE, 60000);
    if (hn <= 0 || shmipc_stream_write(st, head, (size_t)hn) < 0 || shmipc_stream_flush(st) < 0) {
        atomic_fetch_sub(&w->concurrent, 1);
        return;
    }
    uint8_t *buf = malloc((size_t)frame);
    while (off < total && !is_head) {
        const void *p;
        if (how == 'd' && off >= total / 2) {
            kill_sessions(w);
            goto done;
        }
        if (how == 's' && off >= total / 2) {
            wait_abort(w, st);
            goto done;
        }
        int rc = shmipc_stream_read_exact_bytes(st, 12, &p, SHMIPC_NONBLOCK);
        if (rc != SHMIPC_EAGAIN) { /* the front's ABORT (it gave up), or the stream ended */
            if (rc == 0) {
                shmipc_serve_frame f = {.size = sizeof f};
                memcpy(h, p, 12);
                shmipc_stream_release(st);
                if (shmipc_serve_decode_header(h, 12, &f) == 12 && f.type == SHMIPC_SERVE_ABORT)
                    bump(&w->aborts[f.arg & 7]);
            }
            goto done;
        }
        size_t n = total - off < frame ? (size_t)(total - off) : (size_t)frame;
        for (size_t k = 0; k < n; k++)
            buf[k] = gen_byte(seed, off + k);
        shmipc_serve_encode_header(h, 12, SHMIPC_SERVE_BODY, n, 0);
        if (shmipc_stream_write(st, h, 12) < 0 || shmipc_stream_write(st, buf, n) < 0 ||
            shmipc_stream_flush(st) < 0)
            goto done;
        off += n;
    }
    shmipc_serve_encode_header(h, 12, SHMIPC_SERVE_END, 0, 0);
    shmipc_stream_write(st, h, 12);
    bump(&w->streamed);
    /* As send_frames: the front may hand this worker its next request once END is out. */
    atomic_fetch_sub(&w->concurrent, 1);
    shmipc_stream_flush(st);
    free(buf);
    return;
done:
    atomic_fetch_sub(&w->concurrent, 1);
    free(buf);
}

static void serve_stream(struct appw *w, shmipc_stream *st)
{
    uint8_t *buf = NULL, *out = NULL;
    size_t n, blen = 0, tlen = 0;
    char target[256];
    shmipc_serve_frame f;
    uint8_t *body = malloc(1 << 20);

    if (atomic_load(&w->mode) == M_STALL)
        latch_wait(w, &w->release_stall);
    shmipc_stream_set_timeout(st, SHMIPC_TIMEOUT_READ, WAIT_MS);
    if (read_frame(st, &buf, &n, &f) < 0)
        goto out;
    if (f.type == SHMIPC_SERVE_ABORT) /* a late ABORT for an exchange that ended here */
        goto out;
    shmipc_serve_request rq = {.size = sizeof rq};
    if (f.type != SHMIPC_SERVE_REQUEST_HEAD || shmipc_serve_decode_request(buf, n, &rq) <= 0) {
        bump(&w->bad);
        goto out;
    }
    int is_head = rq.method_len == 4 && memcmp(rq.method, "HEAD", 4) == 0;
    tlen = rq.target_len < sizeof target ? rq.target_len : sizeof target - 1;
    memcpy(target, rq.target, tlen);
    free(buf);
    buf = NULL;
    bump(&w->requests);
    for (;;) { /* the body, then END */
        if (read_frame(st, &buf, &n, &f) < 0)
            goto out;
        if (f.type == SHMIPC_SERVE_END)
            break;
        if (f.type != SHMIPC_SERVE_BODY || blen + f.length > (1u << 20)) {
            bump(&w->bad);
            goto out;
        }
        memcpy(body + blen, f.payload, f.length);
        blen += f.length;
        free(buf);
        buf = NULL;
    }
    int c = atomic_fetch_add(&w->concurrent, 1) + 1;
    int m = atomic_load(&w->max_concurrent);
    while (c > m && !atomic_compare_exchange_weak(&w->max_concurrent, &m, c)) {
    }
    /* "/hang..." hangs in any mode, waiting for the front's ABORT */
    if (tlen >= 9 && memcmp(target, "/badclose", 9) == 0) { /* a bad frame, then its close */
        uint8_t bad[12] = {'X', 'X', 1, 4, 0, 0, 0, 0, 0, 0, 0, 0};
        shmipc_stream_write(st, bad, sizeof bad);
        shmipc_stream_flush(st);
        atomic_fetch_sub(&w->concurrent, 1);
        goto out;
    }
    if (tlen >= 8 && (memcmp(target, "/bighead", 8) == 0 || memcmp(target, "/ctlhead", 8) == 0)) {
        /* A head the server's batch cannot hold (20 KB of headers), a Content-Length of 10, the
         * body (not for HEAD), END, and the close: all of it there before the front reads. */
        static uint8_t head[24576], big[10000];
        uint8_t h[12];
        memset(big, 'b', sizeof big);
        /* two of 10 KB: a value may have 16 KB (SHMIPC__SF_MAX_VALUE), a batch's heads 16 KB */
        shmipc_serve_field fd[2] = {{(const uint8_t *)"X-Big1", big, 6, sizeof big},
                                    {(const uint8_t *)"X-Big2", big, 6, sizeof big}};
        uint32_t nfd = 2;
        if (target[1] == 'c') { /* "/ctlhead": a small header the server refuses (a control byte) */
            fd[0] = (shmipc_serve_field){(const uint8_t *)"X-Ctl", (const uint8_t *)"a\001b", 5, 3};
            nfd = 1;
        }
        shmipc_serve_response rs = {.size = sizeof rs,
                                    .status = 200,
                                    .flags = SHMIPC_SERVE_RESP_CONTENT_LENGTH,
                                    .content_length = 10};
        int64_t hn = shmipc_serve_encode_response_head(head, sizeof head, &rs, fd, nfd);
        if (hn > 0) {
            shmipc_stream_write(st, head, (size_t)hn);
            if (!is_head) {
                shmipc_serve_encode_header(h, 12, SHMIPC_SERVE_BODY, 10, 0);
                shmipc_stream_write(st, h, 12);
                shmipc_stream_write(st, "0123456789", 10);
            }
            shmipc_serve_encode_header(h, 12, SHMIPC_SERVE_END, 0, 0);
            shmipc_stream_write(st, h, 12);
        }
        atomic_fetch_sub(&w->concurrent, 1);
        shmipc_stream_flush(st);
        goto out;
    }
    if (tlen >= 8 && memcmp(target, "/stream/", 8) == 0) {
        target[tlen] = '\0';
        stream_mode(w, st, target, is_head); /* counted out there */
        goto out;
    }
    switch (tlen >= 5 && memcmp(target, "/hang", 5) == 0 ? M_HANG : atomic_load(&w->mode)) {
    case M_HOLD:
        latch_wait(w, &w->hold_open);
        /* fall through */
    case M_ECHO:
        out = malloc(tlen + 1 + blen);
        memcpy(out, target, tlen);
        out[tlen] = ':';
        memcpy(out + tlen + 1, body, blen);
        send_frames(w, st, 200, w->name, out, tlen + 1 + blen, 1, is_head);
        goto out; /* counted out by send_frames */
    case M_DIE:
        kill_sessions(w);
        break;
    case M_BAD: {
        uint8_t bad[12] = {'X', 'X', 1, 4, 0, 0, 0, 0, 0, 0, 0, 0};
        shmipc_stream_write(st, bad, sizeof bad);
        shmipc_stream_flush(st);
        wait_abort(w, st);
        break;
    }
    case M_HUGE: {
        uint8_t head[256], h[12];
        static uint8_t chunk[1 << 16];
        shmipc_serve_response r = {.size = sizeof r, .status = 200};
        int64_t hn = shmipc_serve_encode_response_head(head, sizeof head, &r, NULL, 0);
        shmipc_stream_write(st, head, (size_t)hn);
        shmipc_stream_flush(st);
        for (int i = 0; i < 16; i++) {
            shmipc_serve_encode_header(h, 12, SHMIPC_SERVE_BODY, sizeof chunk, 0);
            shmipc_stream_write(st, h, 12);
            shmipc_stream_write(st, chunk, sizeof chunk);
            if (shmipc_stream_flush(st) < 0)
                break;
        }
        wait_abort(w, st);
        break;
    }
    case M_MID_END: {
        uint8_t head[256];
        shmipc_serve_response r = {.size = sizeof r, .status = 200};
        int64_t hn = shmipc_serve_encode_response_head(head, sizeof head, &r, NULL, 0);
        shmipc_stream_write(st, head, (size_t)hn);
        shmipc_stream_flush(st);
        break; /* the close ends the stream mid-response */
    }
    case M_HANG:
    case M_STALL: /* the front gave up meanwhile: its ABORT follows the request */
        wait_abort(w, st);
        break;
    }
    atomic_fetch_sub(&w->concurrent, 1);
out:
    free(body);
    free(buf);
    free(out);
    shmipc_stream_close(st);
}

static void *session_main(void *arg)
{
    struct sarg *a = arg;
    while (!atomic_load(&a->w->stop)) {
        shmipc_stream *st;
        if (atomic_load(&a->w->freeze)) {
            pthread_mutex_lock(&a->w->mu);
            a->w->parked++;
            pthread_cond_broadcast(&a->w->cv);
            while (atomic_load(&a->w->freeze) && !atomic_load(&a->w->stop))
                cv_wait_ms(&a->w->cv, &a->w->mu, 1000);
            a->w->parked--;
            pthread_mutex_unlock(&a->w->mu);
            continue;
        }
        int rc = shmipc_session_accept_stream(a->s, 50, &st);
        if (rc == SHMIPC_ETIMEDOUT || rc == SHMIPC_EAGAIN)
            continue;
        if (rc < 0)
            break;
        serve_stream(a->w, st);
    }
    free(a);
    return NULL;
}

static void *acceptor_main(void *arg)
{
    struct appw *w = arg;
    while (!atomic_load(&w->stop)) {
        shmipc_session *s;
        int rc = shmipc_listener_accept(w->l, 50, &s);
        if (rc < 0)
            continue;
        pthread_mutex_lock(&w->mu);
        if (w->nsess == 16) {
            pthread_mutex_unlock(&w->mu);
            shmipc_session_close(s);
            continue;
        }
        struct sarg *a = malloc(sizeof *a);
        a->w = w;
        a->s = s;
        w->sess[w->nsess] = s;
        pthread_create(&w->sthreads[w->nsess], NULL, session_main, a);
        w->nsess++;
        pthread_mutex_unlock(&w->mu);
    }
    return NULL;
}

static int appw_seq;

static void appw_start(struct appw *w, const char *name, const char *addr)
{
    if (name != NULL) {
        memset(w, 0, sizeof *w);
        snprintf(w->name, sizeof w->name, "%s", name);
        if (addr != NULL)
            snprintf(w->addr, sizeof w->addr, "%s", addr);
        else
            snprintf(w->addr, sizeof w->addr, "unix:@shmipc-front-test-%d-%d", (int)getpid(),
                     appw_seq++);
        pthread_mutex_init(&w->mu, NULL);
        pthread_cond_init(&w->cv, NULL);
    }
    atomic_store(&w->stop, 0);
    CHECK(shmipc_listener_new(w->addr, NULL, &w->l));
    assert_int_equal(pthread_create(&w->acceptor, NULL, acceptor_main, w), 0);
    w->started = 1;
}

/* Stops it as a process exit would: every session ends, the listener goes. */
static void appw_stop(struct appw *w)
{
    if (!w->started)
        return;
    w->started = 0;
    latch_set(w, &w->stop, 1); /* wakes latches and frozen session threads */
    pthread_join(w->acceptor, NULL);
    kill_sessions(w);
    for (int i = 0; i < w->nsess; i++) {
        pthread_join(w->sthreads[i], NULL);
        shmipc_session_close(w->sess[i]);
    }
    w->nsess = 0;
    shmipc_listener_close(w->l);
    w->l = NULL;
}

/* ---- the front under test ---- */

struct fx {
    shmipc_server *srv;
    struct shmipc__front *f;
    int port;
};

static int h_static(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    (void)ud;
    return shmipc_http_response_body(res, "static", 6);
}

static void fx_start(struct fx *x, struct appw **ws, unsigned n, unsigned threads,
                     const struct shmipc__front_opts *o)
{
    shmipc_server_config *cfg;
    const char *addrs[8];
    struct shmipc__front_opts opts = o ? *o : (struct shmipc__front_opts){0};
    for (unsigned i = 0; i < n; i++)
        addrs[i] = ws[i]->addr;
    opts.workers = addrs;
    opts.nworkers = n;
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
    CHECK(shmipc_server_route(x->srv, "GET", "/static", h_static, NULL, NULL));
    CHECK(shmipc__front_attach(x->f, x->srv, "/*"));
    CHECK(shmipc_server_start(x->srv));
    x->port = shmipc_server_port(x->srv);
}

static void fx_stop(struct fx *x)
{
    if (x->srv != NULL)
        shmipc_server_close(x->srv);
    x->srv = NULL;
    shmipc__front_free(x->f);
    x->f = NULL;
}

/* ---- an HTTP client ---- */

/* -1 on failure: client threads call it too, and they must not assert. */
static int tcp_connect_try(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct timeval tv = {WAIT_MS / 1000, 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int tcp_connect(int port)
{
    int fd = tcp_connect_try(port);
    assert_true(fd >= 0);
    return fd;
}

/* 0, or -1 when the connection failed (client threads, which must not assert). */
static int send_all_try(int fd, const void *p, size_t n)
{
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0)
            return -1;
        p = (const char *)p + k;
        n -= (size_t)k;
    }
    return 0;
}

static void send_all(int fd, const void *p, size_t n)
{
    assert_int_equal(send_all_try(fd, p, n), 0);
}

/* A reader that keeps what it read past a response for the next one. */
struct rd {
    int fd;
    char buf[1 << 17];
    size_t len;
};

struct resp {
    int status;
    char head[4096];
    char *body;
    size_t body_len;
};

/* Reads one response (Content-Length framing; none after a HEAD); status -1 when the
 * connection ended first. */
static void read_resp_x(struct rd *r, struct resp *p, int head)
{
    char *end;
    p->status = -1;
    p->body = NULL;
    p->body_len = 0;
    for (;;) {
        r->buf[r->len] = '\0';
        if ((end = strstr(r->buf, "\r\n\r\n")) != NULL)
            break;
        ssize_t k = recv(r->fd, r->buf + r->len, sizeof r->buf - 1 - r->len, 0);
        if (k <= 0)
            return;
        r->len += (size_t)k;
    }
    size_t hl = (size_t)(end - r->buf) + 4;
    if (hl >= sizeof p->head)
        return; /* status -1: no assertion, client threads read too */
    memcpy(p->head, r->buf, hl);
    p->head[hl] = '\0';
    p->status = atoi(r->buf + 9);
    const char *cl = strcasestr(p->head, "\r\nContent-Length: ");
    size_t blen = cl && !head ? strtoul(cl + 18, NULL, 10) : 0;
    while (r->len < hl + blen) {
        ssize_t k = recv(r->fd, r->buf + r->len, sizeof r->buf - 1 - r->len, 0);
        if (k <= 0) {
            p->status = -1;
            return;
        }
        r->len += (size_t)k;
    }
    p->body = malloc(blen + 1);
    memcpy(p->body, r->buf + hl, blen);
    p->body[blen] = '\0';
    p->body_len = blen;
    memmove(r->buf, r->buf + hl + blen, r->len - hl - blen);
    r->len -= hl + blen;
}

static void read_resp(struct rd *r, struct resp *p)
{
    read_resp_x(r, p, 0);
}

static void rd_open(struct rd *r, int port)
{
    r->fd = tcp_connect(port);
    r->len = 0;
}

/* For client threads: 0, or -1 when the connect failed. */
static int rd_open_try(struct rd *r, int port)
{
    r->fd = tcp_connect_try(port);
    r->len = 0;
    return r->fd >= 0 ? 0 : -1;
}

/* One request on a new connection. */
static int request(int port, const char *method, const char *target, const char *body,
                   struct resp *p)
{
    struct rd *r = malloc(sizeof *r);
    char req[1024];
    size_t bl = body ? strlen(body) : 0;
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: t\r\nContent-Length: %zu\r\n\r\n%s",
                     method, target, bl, body ? body : "");
    rd_open(r, port);
    send_all(r->fd, req, (size_t)n);
    read_resp(r, p);
    close(r->fd);
    free(r);
    return p->status;
}

static void resp_free(struct resp *p)
{
    free(p->body);
    p->body = NULL;
}

/* ---- reading streamed bodies ---- */

/* More bytes into r->buf, at most `max` (0: as many as fit), after `slow_us`; 0 at the end. */
static ssize_t rd_more(struct rd *r, size_t max, unsigned slow_us)
{
    size_t room = sizeof r->buf - 1 - r->len;
    if (slow_us)
        usleep(slow_us);
    if (max != 0 && max < room)
        room = max;
    ssize_t k = recv(r->fd, r->buf + r->len, room, 0);
    if (k > 0)
        r->len += (size_t)k;
    return k > 0 ? k : 0;
}

static void rd_drop(struct rd *r, size_t n)
{
    memmove(r->buf, r->buf + n, r->len - n);
    r->len -= n;
}

struct sbody {
    uint64_t got; /* body bytes read */
    int complete; /* the framing ended where it should */
    int bad;      /* a byte that is not gen_byte's, or broken framing */
    int chunked;
};

/* Checks and drops up to `n` body bytes from the front of r->buf; returns how many. */
static size_t take_body(struct rd *r, struct sbody *b, unsigned seed, size_t n)
{
    if (n > r->len)
        n = r->len;
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)r->buf[i] != gen_byte(seed, b->got + i))
            b->bad = 1;
    b->got += n;
    rd_drop(r, n);
    return n;
}

/*
 * Reads the body of a response whose head read_resp_x(..., 1) read: chunked (every chunk
 * head and CRLF checked, to the last chunk) or Content-Length. Reads `max` bytes at a time
 * after `slow_us` (a slow client). What follows the body stays in r->buf.
 */
static void read_stream_body(struct rd *r, const struct resp *p, unsigned seed, size_t max,
                             unsigned slow_us, struct sbody *b)
{
    const char *cl = strcasestr(p->head, "\r\nContent-Length: ");
    memset(b, 0, sizeof *b);
    b->chunked = strcasestr(p->head, "\r\nTransfer-Encoding: chunked\r\n") != NULL;
    if (!b->chunked) {
        uint64_t want = cl ? strtoull(cl + 18, NULL, 10) : UINT64_MAX;
        while (b->got < want) {
            if (r->len == 0 && rd_more(r, max, slow_us) == 0)
                return;
            take_body(r, b, seed, want - b->got < r->len ? (size_t)(want - b->got) : r->len);
        }
        b->complete = 1;
        return;
    }
    if (cl != NULL) /* both framings */
        b->bad = 1;
    for (;;) {
        char *eol;
        r->buf[r->len] = '\0';
        while ((eol = strstr(r->buf, "\r\n")) == NULL) {
            if (r->len > 32 || rd_more(r, max, slow_us) == 0) {
                b->bad |= r->len > 32;
                return;
            }
            r->buf[r->len] = '\0';
        }
        char *end;
        unsigned long long size = strtoull(r->buf, &end, 16);
        if (end == r->buf || end != eol) {
            b->bad = 1;
            return;
        }
        rd_drop(r, (size_t)(eol - r->buf) + 2);
        uint64_t left = size;
        while (left > 0) {
            if (r->len == 0 && rd_more(r, max, slow_us) == 0)
                return;
            left -= take_body(r, b, seed, left < r->len ? (size_t)left : r->len);
        }
        while (r->len < 2)
            if (rd_more(r, max, slow_us) == 0)
                return;
        if (r->buf[0] != '\r' || r->buf[1] != '\n') {
            b->bad = 1;
            return;
        }
        rd_drop(r, 2);
        if (size == 0) { /* the last chunk, no trailers */
            b->complete = 1;
            return;
        }
    }
}

/* Sends a GET for a streamed body on r and reads it. Returns the status (-1: none). */
static int get_stream(struct rd *r, const char *target, unsigned seed, size_t max, unsigned slow_us,
                      struct sbody *b)
{
    char req[512];
    struct resp p;
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: t\r\n\r\n", target);
    memset(b, 0, sizeof *b);
    if (send_all_try(r->fd, req, (size_t)n) < 0)
        return -1;
    read_resp_x(r, &p, 1);
    if (p.status > 0)
        read_stream_body(r, &p, seed, max, slow_us, b);
    resp_free(&p);
    return p.status;
}

/* Whether the peer closed the connection (what it still sent is drained), within 5 s. */
static int peer_closed(int fd)
{
    char tmp[65536];
    struct timeval tv = {0, 200000};
    uint64_t end = mono_ms() + 5000;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (mono_ms() < end) {
        ssize_t k = recv(fd, tmp, sizeof tmp, 0);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return 1;
    }
    return 0;
}

/* A client thread reading one streamed body (it never asserts: the case checks its result). */
struct sbg {
    int port;
    char target[128];
    unsigned seed;
    unsigned slow_us;
    int status;
    struct sbody b;
    pthread_t th;
    int running; /* started, not joined */
};

static void *sbg_main(void *arg)
{
    struct sbg *a = arg;
    struct rd *r = malloc(sizeof *r);
    a->status = -1;
    if (r != NULL && rd_open_try(r, a->port) == 0) {
        a->status = get_stream(r, a->target, a->seed, 65536, a->slow_us, &a->b);
        close(r->fd);
    }
    free(r);
    return NULL;
}

static void sbg_start(struct sbg *a)
{
    assert_int_equal(pthread_create(&a->th, NULL, sbg_main, a), 0);
    a->running = 1;
}

static void sbg_join(struct sbg *a)
{
    if (!a->running)
        return;
    a->running = 0;
    pthread_join(a->th, NULL);
}

struct xt {
    int port;
    int id;
    int n;
    atomic_int *mismatches;
    atomic_int *ok;
    atomic_int *stop; /* the teardown's */
};

struct bg {
    int port;
    const char *target;
    struct resp p;
    pthread_t th;
    int running; /* started, not joined */
};

struct load {
    int port;
    atomic_int stop;
    atomic_int bad, ok, after_c, after_old;
    atomic_int switched;
};

/* One case's state, on the heap: the teardown stops and joins all of it, also after a failed
 * assertion longjmped out of the case. */
struct tc {
    struct appw w[3];
    struct fx x;
    struct bg bg[3];
    struct xt xt[8];
    struct load load;
    pthread_t th[8]; /* client threads (xtalk_client, load_main) */
    int nth;
    atomic_int stop_clients;
    atomic_int mism, ok;
    struct sbg sbg[6];
};

static int tc_setup(void **state)
{
    struct tc *t = calloc(1, sizeof *t);
    *state = t;
    return t != NULL ? 0 : -1;
}

static void bg_join(struct bg *b)
{
    if (!b->running)
        return;
    b->running = 0;
    pthread_join(b->th, NULL);
}

static int tc_teardown(void **state)
{
    struct tc *t = *state;
    int bad = 0;
    atomic_store(&t->stop_clients, 1);
    atomic_store(&t->load.stop, 1);
    for (int i = 0; i < 3; i++) {
        if (!t->w[i].started)
            continue;
        latch_set(&t->w[i], &t->w[i].hold_open, 1);
        latch_set(&t->w[i], &t->w[i].release_stall, 1);
        latch_set(&t->w[i], &t->w[i].freeze, 0);
    }
    fx_stop(&t->x); /* closes every client connection: client threads end */
    for (int i = 0; i < 3; i++) {
        bg_join(&t->bg[i]);
        resp_free(&t->bg[i].p);
    }
    for (int i = 0; i < t->nth; i++)
        pthread_join(t->th[i], NULL);
    for (int i = 0; i < 6; i++)
        sbg_join(&t->sbg[i]);
    for (int i = 0; i < 3; i++) {
        appw_stop(&t->w[i]);
        bad += atomic_load(&t->w[i].bad);
    }
    free(t);
    if (bad != 0) {
        print_error("the application workers saw %d unexpected frames\n", bad);
        return -1;
    }
    return 0;
}

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
    struct appw *w = &t->w[0];
    struct appw *ws[] = {w};
    struct fx *x = &t->x;
    struct rd *r = malloc(sizeof *r);
    struct sbody b;
    struct resp p;
    static struct shmipc__front_stats st;
    int small = 65536;
    appw_start(w, "w0", NULL);
    fx_start(x, ws, 1, 1, NULL);
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
    struct appw *w = &t->w[0];
    struct appw *ws[] = {w};
    struct fx *x = &t->x;
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    struct sbody b;
    appw_start(w, "w0", NULL);
    fx_start(x, ws, 1, 1, NULL);
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
    struct appw *w = &t->w[0];
    struct appw *ws[] = {w};
    struct fx *x = &t->x;
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    struct sbody b;
    appw_start(w, "w0", NULL);
    fx_start(x, ws, 1, 1, NULL);
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

/* The client leaves mid-body (a reset, then a FIN): ABORT CLIENT_GONE reaches the worker,
 * which is free for the next request; the front holds nothing of it afterwards. */
static void stream_client_gone(void **state)
{
    struct tc *t = *state;
    struct appw *w = &t->w[0];
    struct appw *ws[] = {w};
    struct fx *x = &t->x;
    struct rd *r = malloc(sizeof *r);
    struct resp p;
    static struct shmipc__front_stats st;
    appw_start(w, "w0", NULL);
    fx_start(x, ws, 1, 1, NULL);
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
    struct appw *ws[] = {w};
    struct fx *x = &t->x;
    struct shmipc__front_opts o = {.deadline_ms = 1000};
    struct rd *r = malloc(sizeof *r);
    struct sbody b;
    struct resp p;
    appw_start(w, "w0", NULL);
    fx_start(x, ws, 1, 1, &o);
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
    struct appw *w = &t->w[0];
    struct appw *ws[] = {w};
    struct fx *x = &t->x;
    struct resp p;
    static struct shmipc__front_stats st;
    appw_start(w, "w0", NULL);
    fx_start(x, ws, 1, 1, NULL);
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
        T(stream_worker_dies), T(stream_client_gone), T(stream_deadline_mid_body),                 \
        T(stream_cross_talk), T(stream_head_unwritable_frees_request_in_use)

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
