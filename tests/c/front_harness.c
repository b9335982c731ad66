/* Description: the front's C test harness (front_harness.h says what it holds). */
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

#include "front_harness.h"

int suite_backend = SHMIPC_BACKEND_EPOLL;

/* What a worker's session thread serves. */
struct sarg {
    struct appw *w;
    shmipc_session *s;
};

uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Every counter a case waits on is bumped with bump(), which wakes the waiters. */
static pthread_mutex_t ev_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ev_cv = PTHREAD_COND_INITIALIZER;

void bump(atomic_int *v)
{
    atomic_fetch_add(v, 1);
    pthread_mutex_lock(&ev_mu);
    pthread_cond_broadcast(&ev_cv);
    pthread_mutex_unlock(&ev_mu);
}

/* Waits on cv (a CLOCK_REALTIME condition variable) for at most `ms`. */
void cv_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, unsigned ms)
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

int wait_for(atomic_int *v, int want, unsigned ms)
{
    uint64_t end = mono_ms() + ms;
    pthread_mutex_lock(&ev_mu);
    while (atomic_load(v) < want && mono_ms() < end)
        cv_wait_ms(&ev_cv, &ev_mu, 50);
    pthread_mutex_unlock(&ev_mu);
    return atomic_load(v) >= want;
}

int read_frame(shmipc_stream *st, uint8_t **buf, size_t *len, shmipc_serve_frame *f)
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
void wait_abort(struct appw *w, shmipc_stream *st)
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

void send_frames(struct appw *w, shmipc_stream *st, int status, const char *name, const void *body,
                 size_t len, int with_length, int is_head)
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

void kill_sessions(struct appw *w)
{
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < w->nsess; i++)
        shmipc_session_shutdown(w->sess[i]);
    pthread_mutex_unlock(&w->mu);
}

int appw_wait_sessions(struct appw *w, int n)
{
    uint64_t end = mono_ms() + WAIT_MS;
    pthread_mutex_lock(&w->mu);
    while (w->nsess < n && mono_ms() < end)
        cv_wait_ms(&w->cv, &w->mu, 50);
    int held = w->nsess >= n;
    pthread_mutex_unlock(&w->mu);
    return held;
}

/* Waits until *flag is set (under w->mu, signalled on w->cv) or the worker stops. */
void latch_wait(struct appw *w, atomic_int *flag)
{
    pthread_mutex_lock(&w->mu);
    while (!atomic_load(flag) && !atomic_load(&w->stop))
        cv_wait_ms(&w->cv, &w->mu, 1000);
    pthread_mutex_unlock(&w->mu);
}

void latch_set(struct appw *w, atomic_int *flag, int v)
{
    pthread_mutex_lock(&w->mu);
    atomic_store(flag, v);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Byte i of the streamed body number `seed`: unique enough per body and offset that a
 * piece sent to the wrong client, twice, or out of order is seen. */
uint8_t gen_byte(unsigned seed, uint64_t i)
{
    return (uint8_t)(seed * 131u + i * 7u + (i >> 12) + (i >> 20) * 3u);
}

/*
 * "/stream/<total>/<frame>/<cl>/<seed>/<how>": a 200 whose body (gen_byte) comes in BODY
 * frames of <frame> bytes, flushed one by one (the session's queue pushes back); with a
 * Content-Length when <cl> is 1. <how>: 'e' END at the end; 'd' the worker dies at half;
 * 'x' END, then the worker's sessions end at once (a worker that exits after its answer:
 * --max-requests, a reload); 's' stalls at half until the front's ABORT; any: an ABORT from
 * the front stops it.
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
    if (how == 'x')
        kill_sessions(w);
    return;
done:
    atomic_fetch_sub(&w->concurrent, 1);
    free(buf);
}

/* FNV-1a, 64 bits: what "/up/hash" answers of a body (fnv1a(FNV_INIT, ...) chained). */
uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/*
 * "/up/<op>" (test_front_upload.c): a worker that reads a streamed request body frame by
 * frame. "hash": to END, then 200 "<length>:<fnv1a hex>"; "echo": to END (at most 8 MiB),
 * then 200 with the body back in 256 KiB frames and its Content-Length; "early": the first
 * BODY frame, then 200 "early" at once, and the stream is read on until it ends;
 * "early-close": the same, then the stream closes at once. An ABORT
 * of the front's mid-body is counted (aborts[]) and ends the exchange.
 */
static void upload_mode(struct appw *w, shmipc_stream *st, const char *target, size_t tlen)
{
    uint64_t h = FNV_INIT, total = 0;
    uint8_t *echo = NULL, *buf = NULL, hd[12];
    size_t n, cap = 0;
    shmipc_serve_frame f;
    int early = tlen >= 9 && memcmp(target, "/up/early", 9) == 0;
    int close_early = tlen == 15 && memcmp(target, "/up/early-close", 15) == 0;
    int is_echo = tlen == 8 && memcmp(target, "/up/echo", 8) == 0;
    atomic_fetch_add(&w->concurrent, 1);
    for (;;) {
        if (read_frame(st, &buf, &n, &f) < 0)
            goto done;
        if (f.type == SHMIPC_SERVE_END) {
            free(buf);
            buf = NULL;
            break;
        }
        if (f.type == SHMIPC_SERVE_ABORT) {
            bump(&w->aborts[f.arg & 7]);
            goto done;
        }
        if (f.type != SHMIPC_SERVE_BODY) {
            bump(&w->bad);
            goto done;
        }
        h = fnv1a(h, f.payload, f.length);
        if (is_echo) {
            if (total + f.length > (8u << 20)) {
                bump(&w->bad);
                goto done;
            }
            if (total + f.length > cap) {
                cap = cap ? cap * 2 : (64u << 10);
                while (cap < total + f.length)
                    cap *= 2;
                echo = realloc(echo, cap);
            }
            memcpy(echo + total, f.payload, f.length);
        }
        total += f.length;
        free(buf);
        buf = NULL;
        if (early) { /* answered before the body's end; the rest is read and dropped */
            send_frames(w, st, 200, w->name, "early", 5, 1, 0);
            while (!close_early && read_frame(st, &buf, &n, &f) == 0) {
                free(buf);
                buf = NULL;
            }
            free(echo);
            return;
        }
    }
    if (is_echo) {
        shmipc_serve_response r = {.size = sizeof r,
                                   .status = 200,
                                   .flags = SHMIPC_SERVE_RESP_CONTENT_LENGTH,
                                   .content_length = total};
        uint8_t head[128];
        int64_t hn = shmipc_serve_encode_response_head(head, sizeof head, &r, NULL, 0);
        shmipc_stream_set_timeout(st, SHMIPC_TIMEOUT_WRITE, WAIT_MS);
        if (hn <= 0 || shmipc_stream_write(st, head, (size_t)hn) < 0) {
            bump(&w->bad);
            goto done;
        }
        for (uint64_t off = 0; off < total;) {
            size_t k = total - off < (256u << 10) ? (size_t)(total - off) : (256u << 10);
            shmipc_serve_encode_header(hd, 12, SHMIPC_SERVE_BODY, k, 0);
            if (shmipc_stream_write(st, hd, 12) < 0 || shmipc_stream_write(st, echo + off, k) < 0 ||
                shmipc_stream_flush(st) < 0)
                goto done;
            off += k;
        }
        shmipc_serve_encode_header(hd, 12, SHMIPC_SERVE_END, 0, 0);
        shmipc_stream_write(st, hd, 12);
        atomic_fetch_sub(&w->concurrent, 1);
        shmipc_stream_flush(st);
        free(echo);
        return;
    }
    char text[64];
    int tn = snprintf(text, sizeof text, "%llu:%016llx", (unsigned long long)total,
                      (unsigned long long)h);
    send_frames(w, st, 200, w->name, text, (size_t)tn, 1, 0);
    free(echo);
    return;
done:
    atomic_fetch_sub(&w->concurrent, 1);
    free(buf);
    free(echo);
}

void (*front_ws_serve)(struct appw *w, shmipc_stream *st, const char *target);

/* ABORT SHUTDOWN: a stopping worker's "not processed" (M_HEAD_REFUSE and M_103_REFUSE after
 * a head of theirs: too late), then it waits for the front's end of the stream, or (M_REFUSE_
 * CLOSE) ends every session at once. */
static void refuse(struct appw *w, shmipc_stream *st, int mode)
{
    uint8_t h[12], head[256];
    if (mode == M_HEAD_REFUSE || mode == M_103_REFUSE) {
        shmipc_serve_response r = {.size = sizeof r, .status = mode == M_103_REFUSE ? 103 : 200};
        int64_t hn = shmipc_serve_encode_response_head(head, sizeof head, &r, NULL, 0);
        shmipc_stream_write(st, head, (size_t)hn);
    }
    shmipc_serve_encode_header(h, 12, SHMIPC_SERVE_ABORT, 0, SHMIPC_SERVE_ABORT_SHUTDOWN);
    shmipc_stream_write(st, h, 12);
    bump(&w->refused); /* before the front can see it: the test's count is exact then */
    shmipc_stream_flush(st);
    if (mode == M_REFUSE_CLOSE)
        kill_sessions(w);
    else
        wait_abort(w, st); /* until the front closes its side */
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
    if (f.type == SHMIPC_SERVE_HELLO) {
        uint8_t a[SHMIPC_SERVE_HDR_SIZE + SHMIPC_SERVE_HELLO_SIZE] = {0};
        int64_t an;
        bump(&w->hellos);
        int tk = atomic_load(&w->taken);
        if (tk == TAKEN_GRANT || tk == TAKEN_GRANT_ALL) {
            shmipc_serve_encode_header(a, sizeof a, SHMIPC_SERVE_HELLO, 8, 0);
            /* all: every feature bit, also those the front did not offer */
            a[12] =
                (uint8_t)(tk == TAKEN_GRANT_ALL ? 0xff : f.payload[0] & SHMIPC_SERVE_FEAT_TAKEN);
            a[13] = a[14] = a[15] = (uint8_t)(tk == TAKEN_GRANT_ALL ? 0xff : 0);
            uint32_t conc = atomic_load(&w->conc);
            conc = conc ? conc : 1;
            for (int i = 0; i < 4; i++)
                a[16 + i] = (uint8_t)(conc >> (8 * i));
            an = (int64_t)sizeof a;
        } else if (tk == TAKEN_ANSWER_BODY) { /* a frame of another type, of HELLO's size */
            an = shmipc_serve_encode_frame(a, sizeof a, SHMIPC_SERVE_BODY, 0,
                                           (const uint8_t *)"\x01\0\0\0\x01\0\0\0", 8);
        } else if (tk == TAKEN_STOPPING || tk == TAKEN_STOPPING_BARE) {
            static const char why[] = "the worker is stopping"; /* longer than a HELLO */
            uint8_t l[SHMIPC_SERVE_HDR_SIZE + sizeof why];
            int64_t ln = shmipc_serve_encode_frame(l, sizeof l, SHMIPC_SERVE_ABORT,
                                                   SHMIPC_SERVE_ABORT_SHUTDOWN, why,
                                                   tk == TAKEN_STOPPING ? sizeof why - 1 : 0);
            shmipc_stream_write(st, l, (size_t)ln);
            shmipc_stream_flush(st);
            goto out;
        } else { /* what a worker that does not know HELLO answers */
            an = shmipc_serve_encode_frame(a, sizeof a, SHMIPC_SERVE_ABORT,
                                           SHMIPC_SERVE_ABORT_PROTOCOL, NULL, 0);
        }
        shmipc_stream_write(st, a, (size_t)an);
        shmipc_stream_flush(st);
        goto out;
    }
    shmipc_serve_request rq = {.size = sizeof rq};
    if (f.type != SHMIPC_SERVE_REQUEST_HEAD || shmipc_serve_decode_request(buf, n, &rq) <= 0) {
        bump(&w->bad);
        goto out;
    }
    /* Hostile TAKENs, by target: a second one, one never asked for, one after the head. */
#define RQ_IS_PREFIX(lit)                                                                          \
    (rq.target_len >= sizeof(lit) - 1 && memcmp(rq.target, lit, sizeof(lit) - 1) == 0)
#define RQ_IS(lit) (rq.target_len == sizeof(lit) - 1 && RQ_IS_PREFIX(lit))
    int wanted = (rq.flags & SHMIPC_SERVE_REQ_TAKEN_WANTED) != 0;
    if (wanted && atomic_load(&w->taken) != TAKEN_GRANT) /* asked, never granted */
        bump(&w->bad);
    /* Asked for TAKEN, a stopping worker refuses before it, as the real ones do: the head
     * read, the body not ("/refuse..." in any mode). */
    int refusing = RQ_IS_PREFIX("/refuse") ? M_REFUSE : atomic_load(&w->mode);
    if (wanted && (refusing == M_REFUSE || refusing == M_REFUSE_CLOSE)) {
        bump(&w->requests);
        refuse(w, st, refusing);
        goto out;
    }
    if ((wanted && !RQ_IS("/taken-late")) || RQ_IS("/taken-unasked")) {
        uint8_t tk[SHMIPC_SERVE_HDR_SIZE];
        shmipc_serve_encode_header(tk, sizeof tk, SHMIPC_SERVE_TAKEN, 0, 0);
        if (shmipc_stream_write(st, tk, sizeof tk) < 0 ||
            (RQ_IS("/taken-twice") && shmipc_stream_write(st, tk, sizeof tk) < 0) ||
            shmipc_stream_flush(st) < 0)
            goto out; /* not said taken: not served (the front gives it to another) */
        bump(&w->takens);
        if (RQ_IS("/taken-twice") || RQ_IS("/taken-unasked")) { /* then the front's ABORT */
            bump(&w->requests);
            wait_abort(w, st);
            goto out;
        }
    }
    if (RQ_IS("/taken-late")) { /* the head, then TAKEN, then END */
        uint8_t head[256], h[SHMIPC_SERVE_HDR_SIZE];
        shmipc_serve_response rs = {.size = sizeof rs, .status = 200};
        int64_t hn = shmipc_serve_encode_response_head(head, sizeof head, &rs, NULL, 0);
        bump(&w->requests);
        shmipc_stream_write(st, head, (size_t)hn);
        shmipc_serve_encode_header(h, sizeof h, SHMIPC_SERVE_TAKEN, 0, 0);
        shmipc_stream_write(st, h, sizeof h);
        shmipc_serve_encode_header(h, sizeof h, SHMIPC_SERVE_END, 0, 0);
        shmipc_stream_write(st, h, sizeof h);
        shmipc_stream_flush(st);
        wait_abort(w, st);
        goto out;
    }
#undef RQ_IS
#undef RQ_IS_PREFIX
    int is_head = rq.method_len == 4 && memcmp(rq.method, "HEAD", 4) == 0;
    tlen = rq.target_len < sizeof target ? rq.target_len : sizeof target - 1;
    memcpy(target, rq.target, tlen);
    shmipc_serve_addr peer = rq.peer, local = rq.local;
    free(buf);
    buf = NULL;
    bump(&w->requests);
    if (tlen >= 4 && memcmp(target, "/up/", 4) == 0) {
        upload_mode(w, st, target, tlen);
        goto out;
    }
    for (;;) { /* the body, then END */
        if (read_frame(st, &buf, &n, &f) < 0)
            goto out;
        if (f.type == SHMIPC_SERVE_END)
            break;
        if (f.type == SHMIPC_SERVE_ABORT) { /* the front gave an upload up mid-body */
            bump(&w->aborts[f.arg & 7]);
            goto out;
        }
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
    if ((rq.flags & SHMIPC_SERVE_REQ_UPGRADE) && front_ws_serve != NULL) {
        target[tlen] = '\0';
        front_ws_serve(w, st, target); /* counts itself out of w->concurrent */
        goto out;
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
    /* "/refuse..." is refused (ABORT SHUTDOWN) in any mode */
    switch (tlen >= 5 && memcmp(target, "/hang", 5) == 0     ? M_HANG
            : tlen >= 7 && memcmp(target, "/refuse", 7) == 0 ? M_REFUSE
                                                             : atomic_load(&w->mode)) {
    case M_HOLD:
        bump(&w->holding);
        latch_wait(w, &w->hold_open);
        /* fall through */
    case M_ECHO:
        if (tlen >= 5 && memcmp(target, "/peer", 5) == 0) { /* the addresses it was handed */
            char a[128];
            int k =
                snprintf(a, sizeof a, "%.*s:p=%u.%u.%u l=%u.%u.%u", (int)tlen, target, peer.family,
                         peer.port, peer.addr[0], local.family, local.port, local.addr[0]);
            send_frames(w, st, 200, w->name, a, (size_t)k, 1, is_head);
            goto out;
        }
        out = malloc(tlen + 1 + blen);
        memcpy(out, target, tlen);
        out[tlen] = ':';
        memcpy(out + tlen + 1, body, blen);
        send_frames(w, st, 200, w->name, out, tlen + 1 + blen, 1, is_head);
        /* A worker that exits right after its answer: the front may hand the freed session
         * another request before it sees the session end. */
        if (atomic_load(&w->die_after_answer) > 0 && atomic_fetch_sub(&w->die_after_answer, 1) > 0)
            kill_sessions(w);
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
    case M_LENGTH: {
        /* Encoded with a length of 1, then the length written over it: the encoder checks
         * what it encodes, and a worker of another make (or a buggy one) need not. */
        uint8_t head[256], h[12];
        shmipc_serve_response r = {.size = sizeof r,
                                   .status = 200,
                                   .flags = SHMIPC_SERVE_RESP_CONTENT_LENGTH,
                                   .content_length = 1};
        int64_t hn = shmipc_serve_encode_response_head(head, sizeof head, &r, NULL, 0);
        uint64_t v = atomic_load(&w->length);
        for (int i = 0; i < 8; i++)
            head[12 + 8 + i] = (uint8_t)(v >> (8 * i));
        shmipc_stream_write(st, head, (size_t)hn);
        shmipc_stream_flush(st);
        if (!is_head) {
            shmipc_serve_encode_header(h, 12, SHMIPC_SERVE_BODY, 1, 0);
            shmipc_stream_write(st, h, 12);
            shmipc_stream_write(st, "x", 1);
        }
        shmipc_serve_encode_header(h, 12, SHMIPC_SERVE_END, 0, 0);
        shmipc_stream_write(st, h, 12);
        shmipc_stream_flush(st);
        wait_abort(w, st);
        break;
    }
    case M_HEAD_REFUSE:
    case M_103_REFUSE:
    case M_REFUSE:
    case M_REFUSE_CLOSE:
        refuse(w, st, atomic_load(&w->mode));
        break;
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

struct starg {
    struct appw *w;
    shmipc_stream *st;
};

/* A concurrent worker's stream (appw.conc over 1): served beside the others. */
static void *stream_main(void *arg)
{
    struct starg *a = arg;
    struct appw *w = a->w;
    serve_stream(w, a->st);
    free(a);
    atomic_fetch_sub(&w->sthreads_live, 1);
    return NULL;
}

static void serve_concurrently(struct appw *w, shmipc_stream *st)
{
    struct starg *a = malloc(sizeof *a);
    pthread_t th;
    pthread_attr_t at;
    assert_non_null(a);
    a->w = w;
    a->st = st;
    atomic_fetch_add(&w->sthreads_live, 1);
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &at, stream_main, a) != 0) {
        atomic_fetch_sub(&w->sthreads_live, 1);
        free(a);
        serve_stream(w, st);
    }
    pthread_attr_destroy(&at);
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
        if (atomic_load(&a->w->conc) > 1)
            serve_concurrently(a->w, st);
        else
            serve_stream(a->w, st);
    }
    if (!atomic_load(&a->w->stop))
        bump(&a->w->sessions_ended);
    free(a);
    return NULL;
}

static void *acceptor_main(void *arg)
{
    struct appw *w = arg;
    while (!atomic_load(&w->stop)) {
        shmipc_session *s;
        if (atomic_load(&w->hold_accept)) { /* connects wait in the listen backlog */
            bump(&w->accept_parked);
            sleep_ms(5);
            continue;
        }
        int rc = shmipc_listener_accept(w->l, 50, &s);
        if (rc < 0)
            continue;
        unsigned lag = atomic_load(&w->accept_lag_ms);
        if (lag > 0)
            sleep_ms(lag);
        pthread_mutex_lock(&w->mu);
        if (w->nsess == APPW_MAX_SESSIONS) {
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
        pthread_cond_broadcast(&w->cv); /* appw_wait_sessions */
        pthread_mutex_unlock(&w->mu);
    }
    return NULL;
}

/* Numbers every worker's address in the process: a worker never reuses another's. */
static int appw_seq;

void appw_start(struct appw *w, const char *name, const char *addr)
{
    appw_start_x(w, name, addr, 0);
}

void appw_start_x(struct appw *w, const char *name, const char *addr, int flags)
{
    if (name != NULL) {
        memset(w, 0, sizeof *w);
        w->flags = flags;
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
    listener_patient_x(w->addr, w->flags, &w->l);
    assert_int_equal(pthread_create(&w->acceptor, NULL, acceptor_main, w), 0);
    w->started = 1;
}

void appw_hold_accept(struct appw *w)
{
    atomic_store(&w->hold_accept, 1);
    int seen = atomic_load(&w->accept_parked);
    assert_true(wait_for(&w->accept_parked, seen + 1, WAIT_MS));
}

/* Stops it as a process exit would: every session ends, the listener goes. */
void appw_stop(struct appw *w)
{
    if (!w->started)
        return;
    w->started = 0;
    latch_set(w, &w->stop, 1); /* wakes latches and frozen session threads */
    pthread_join(w->acceptor, NULL);
    kill_sessions(w);
    for (int i = 0; i < w->nsess; i++) {
        pthread_join(w->sthreads[i], NULL);
    }
    /* Stream threads end with their sessions' end (or their holds' release by `stop`). */
    for (uint64_t end = mono_ms() + 10000; atomic_load(&w->sthreads_live) > 0 && mono_ms() < end;)
        sleep_ms(1);
    assert_int_equal(atomic_load(&w->sthreads_live), 0);
    for (int i = 0; i < w->nsess; i++)
        shmipc_session_close(w->sess[i]);
    w->nsess = 0;
    shmipc_listener_close(w->l);
    w->l = NULL;
}

static int h_static(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    (void)ud;
    return shmipc_http_response_body(res, "static", 6);
}

/* Holds the reactor thread for 500 ms: what the workers send meanwhile is all there, with
 * their sessions' ends, at the loop's next turn. */
static int h_sleep(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    (void)ud;
    sleep_ms(500);
    return shmipc_http_response_body(res, "slept", 5);
}

/* The handshake's 1 s default is short for TSan on a loaded machine (a session took up to
 * 400 ms to come up in CI); a shutdown ends a handshake under way at once. */
void listener_patient(const char *addr, shmipc_listener **out)
{
    listener_patient_x(addr, 0, out);
}

void listener_patient_x(const char *addr, int flags, shmipc_listener **out)
{
    shmipc_config *cfg;
    CHECK(shmipc_config_new(&cfg));
    CHECK(shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_INITIALIZE, HANDSHAKE_MS));
    CHECK(shmipc_config_set_memory_wait(cfg, (flags & APPW_MEMORY_WAIT) != 0));
    if (flags & APPW_NO_SPIN)
        CHECK(shmipc_config_set_spin_us(cfg, 0));
    CHECK(shmipc_listener_new(addr, cfg, out));
    shmipc_config_free(cfg);
}

void fx_start(struct fx *x, struct appw **ws, unsigned n, unsigned threads,
              const struct shmipc__front_opts *o)
{
    shmipc_server_config *cfg;
    const char *addrs[8];
    struct shmipc__front_opts opts = o ? *o : (struct shmipc__front_opts){0};
    for (unsigned i = 0; i < n; i++)
        addrs[i] = ws[i]->addr;
    opts.workers = addrs;
    opts.nworkers = n;
    if (opts.connect_ms == 0) /* as the workers' listeners; a case can set its own */
        opts.connect_ms = HANDSHAKE_MS;
    CHECK(shmipc__front_new(&opts, &x->f));
    CHECK(shmipc_server_config_new(&cfg));
    CHECK(shmipc_server_config_set_address(cfg, x->listen != NULL ? x->listen : "127.0.0.1"));
    CHECK(shmipc_server_config_set_port(cfg, 0));
    CHECK(shmipc_server_config_set_workers(cfg, threads));
    CHECK(shmipc_server_config_set_backend(cfg, suite_backend));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_STOP, 3000));
    /* Above the protocol's target limit (16384), so that the front's own 414 can be seen. */
    CHECK(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_REQUEST_LINE, 32768));
    CHECK(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_HEAD_BYTES, 1 << 20));
    if (x->max_body > 0)
        CHECK(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_BODY, x->max_body));
    if (x->ws_send_limit > 0) {
        CHECK(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_WS_SEND_HIGH_WATER,
                                             x->ws_send_limit));
        CHECK(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_WS_SEND_LIMIT,
                                             x->ws_send_limit));
    }
    CHECK(shmipc_server_new(cfg, &x->srv));
    shmipc_server_config_free(cfg);
    CHECK(shmipc_server_route(x->srv, "GET", "/static", h_static, NULL, NULL));
    CHECK(shmipc_server_route(x->srv, "GET", "/sleep500", h_sleep, NULL, NULL));
    CHECK(shmipc__front_attach(x->f, x->srv, "/*"));
    CHECK(shmipc_server_start(x->srv));
    x->port = x->listen != NULL ? 0 : shmipc_server_port(x->srv);
}

void fx_stop(struct fx *x)
{
    if (x->srv != NULL)
        shmipc_server_close(x->srv);
    x->srv = NULL;
    shmipc__front_free(x->f);
    x->f = NULL;
}

/* -1 on failure: client threads call it too, and they must not assert. */
int tcp_connect_try(int port)
{
    return tcp_connect_rcvbuf(port, 0);
}

int tcp_connect_rcvbuf(int port, int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct timeval tv = {WAIT_MS / 1000, 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (rcvbuf > 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int tcp_connect(int port)
{
    int fd = tcp_connect_try(port);
    assert_true(fd >= 0);
    return fd;
}

/* 0, or -1 when the connection failed (client threads, which must not assert). */
int send_all_try(int fd, const void *p, size_t n)
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

void send_all(int fd, const void *p, size_t n)
{
    assert_int_equal(send_all_try(fd, p, n), 0);
}

/* Reads one response (Content-Length framing; none after a HEAD); status -1 when the
 * connection ended first. */
void read_resp_x(struct rd *r, struct resp *p, int head)
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

void read_resp(struct rd *r, struct resp *p)
{
    read_resp_x(r, p, 0);
}

void rd_open(struct rd *r, int port)
{
    r->fd = tcp_connect(port);
    r->len = 0;
}

/* For client threads: 0, or -1 when the connect failed. */
int rd_open_try(struct rd *r, int port)
{
    r->fd = tcp_connect_try(port);
    r->len = 0;
    return r->fd >= 0 ? 0 : -1;
}

/* One request on a new connection. */
int request(int port, const char *method, const char *target, const char *body, struct resp *p)
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

void resp_free(struct resp *p)
{
    free(p->body);
    p->body = NULL;
}

/* Waits until `n` sessions to the worker are up (state UP), up to WAIT_MS. */
int wait_sessions(struct fx *x, const char *addr, unsigned n)
{
    static struct shmipc__front_stats st;
    uint64_t end = mono_ms() + WAIT_MS;
    while (mono_ms() < end) {
        CHECK(shmipc__front_stats(x->f, &st));
        for (unsigned i = 0; i < st.nworkers; i++)
            if (strcmp(st.w[i].address, addr) == 0 && st.w[i].sessions >= n)
                return 1;
        sleep_ms(5);
    }
    return 0;
}

/* Waits up to WAIT_MS until n of worker i's sessions (the stats' order) granted TAKEN. */
int wait_taken(struct fx *x, unsigned i, unsigned n)
{
    static struct shmipc__front_stats st;
    uint64_t end = mono_ms() + WAIT_MS;
    do {
        CHECK(shmipc__front_stats(x->f, &st));
        if (st.w[i].taken >= n)
            return 1;
        sleep_ms(1);
    } while (mono_ms() < end);
    return 0;
}

/* More bytes into r->buf, at most `max` (0: as many as fit), after `slow_us`; 0 at the end. */
ssize_t rd_more(struct rd *r, size_t max, unsigned slow_us)
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

void rd_drop(struct rd *r, size_t n)
{
    memmove(r->buf, r->buf + n, r->len - n);
    r->len -= n;
}

/* Checks and drops up to `n` body bytes from the front of r->buf; returns how many. */
size_t take_body(struct rd *r, struct sbody *b, unsigned seed, size_t n)
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
void read_stream_body(struct rd *r, const struct resp *p, unsigned seed, size_t max,
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
int get_stream(struct rd *r, const char *target, unsigned seed, size_t max, unsigned slow_us,
               struct sbody *b)
{
    return get_stream_x(r, target, seed, max, slow_us, NULL, b);
}

int get_stream_x(struct rd *r, const char *target, unsigned seed, size_t max, unsigned slow_us,
                 atomic_int *go, struct sbody *b)
{
    char req[512];
    struct resp p;
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: t\r\n\r\n", target);
    memset(b, 0, sizeof *b);
    if (send_all_try(r->fd, req, (size_t)n) < 0)
        return -1;
    for (uint64_t end = mono_ms() + WAIT_MS; go != NULL && !atomic_load(go);) {
        if (mono_ms() >= end)
            return -1;
        sleep_ms(1);
    }
    read_resp_x(r, &p, 1);
    if (p.status > 0)
        read_stream_body(r, &p, seed, max, slow_us, b);
    resp_free(&p);
    return p.status;
}

/* Whether the peer closed the connection (what it still sent is drained), within 5 s. */
int peer_closed(int fd)
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

static void *sbg_main(void *arg)
{
    struct sbg *a = arg;
    struct rd *r = malloc(sizeof *r);
    a->status = -1;
    if (r != NULL && (r->len = 0, r->fd = tcp_connect_rcvbuf(a->port, a->rcvbuf)) >= 0) {
        a->status = get_stream_x(r, a->target, a->seed, 65536, a->slow_us, a->go, &a->b);
        close(r->fd);
    }
    free(r);
    return NULL;
}

void sbg_start(struct sbg *a)
{
    assert_int_equal(pthread_create(&a->th, NULL, sbg_main, a), 0);
    a->running = 1;
}

void sbg_join(struct sbg *a)
{
    if (!a->running)
        return;
    a->running = 0;
    pthread_join(a->th, NULL);
}

/* The usual start of a case: workers w0.. (`n` of t->w, in echo mode) and the front on them,
 * one reactor thread, options `o` (NULL: the defaults), each worker with a session up before
 * it returns (else a first request queues while a slow machine still connects, and a short
 * deadline answers it there, before any worker saw it). Returns the front's fixture. */
struct fx *tc_front(struct tc *t, unsigned n, const struct shmipc__front_opts *o)
{
    struct appw *ws[3];
    char name[8];
    for (unsigned i = 0; i < n && i < 3; i++) {
        snprintf(name, sizeof name, "w%u", i);
        appw_start(&t->w[i], name, NULL);
        ws[i] = &t->w[i];
    }
    fx_start(&t->x, ws, n < 3 ? n : 3, 1, o);
    for (unsigned i = 0; i < n && i < 3; i++)
        if (!wait_sessions(&t->x, t->w[i].addr, 1))
            fail_msg("worker %u: no session within %d ms", i, WAIT_MS);
    return &t->x;
}

int tc_setup(void **state)
{
    struct tc *t = calloc(1, sizeof *t);
    *state = t;
    return t != NULL ? 0 : -1;
}

void bg_join(struct bg *b)
{
    if (!b->running)
        return;
    b->running = 0;
    pthread_join(b->th, NULL);
}

int tc_teardown(void **state)
{
    struct tc *t = *state;
    int bad = 0;
    atomic_store(&t->stop_clients, 1);
    atomic_store(&t->load.stop, 1);
    atomic_store(&t->go, 1); /* streamed GETs waiting to read read (and end: the front closes) */
    for (int i = 0; i < 3; i++) {
        if (!t->w[i].started)
            continue;
        latch_set(&t->w[i], &t->w[i].hold_open, 1);
        latch_set(&t->w[i], &t->w[i].release_stall, 1);
        latch_set(&t->w[i], &t->w[i].freeze, 0);
        atomic_store(&t->w[i].hold_accept, 0);
    }
    fx_stop(&t->x); /* closes every client connection: client threads end */
    for (size_t i = 0; i < sizeof t->bg / sizeof t->bg[0]; i++) {
        bg_join(&t->bg[i]);
        resp_free(&t->bg[i].p);
    }
    for (int i = 0; i < t->nth; i++)
        pthread_join(t->th[i], NULL);
    for (size_t i = 0; i < sizeof t->sbg / sizeof t->sbg[0]; i++)
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

/* Waits until every session thread of `w` is parked by its freeze latch, up to WAIT_MS. */
int wait_parked(struct appw *w)
{
    uint64_t end = mono_ms() + WAIT_MS;
    pthread_mutex_lock(&w->mu);
    while ((w->nsess == 0 || w->parked < w->nsess) && mono_ms() < end)
        cv_wait_ms(&w->cv, &w->mu, 50);
    int ok = w->nsess > 0 && w->parked == w->nsess;
    pthread_mutex_unlock(&w->mu);
    return ok;
}

/* Waits until `n` requests wait in the front's queue (the front has no event for it: polled),
 * up to WAIT_MS; whether exactly `n` do. */
int wait_queued(struct fx *x, unsigned n)
{
    static struct shmipc__front_stats st;
    uint64_t end = mono_ms() + WAIT_MS;
    do {
        CHECK(shmipc__front_stats(x->f, &st));
        if (st.queued >= n)
            return st.queued == n;
        sleep_ms(1);
    } while (mono_ms() < end);
    return 0;
}
