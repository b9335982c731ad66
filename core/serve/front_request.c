/*
 * The front: a request's life. The route handler (encode, claim or queue, defer), the send,
 * reading the response and answering the client, the deadline timer, cancel and ABORT, and the
 * mapping of failures to statuses.
 * May call: front_session.c (claim, requeue, pump, a session down, refresh), the serve frame
 * codec, the server's deferral and response API.
 */
#include "serve/front_int.h"

#include "common/error.h"
#include "common/log.h"
#include "net/http_parser.h"
#include "net/http_writer.h"
#include "net/ws_handshake.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* ---- small helpers ---- */

void shmipc__front_kick(struct fthread *t)
{
    if (!shmipc__timer_active(&t->kick) && shmipc__timer_start(&t->kick, 0) < 0)
        SHMIPC__LOG(SHMIPC__LOG_ERROR, "front: cannot start a timer: %s", shmipc__detail());
}

/*
 * The end of a turn in which requests were flushed without waking their workers. Every fsess
 * a request is flushed to is in t->sess until it is unlinked and freed (fs_unlink), when its
 * session closes: none is missed.
 */
void shmipc__front_on_wake(struct shmipc__timer *timer)
{
    struct fthread *t = timer->data;
    for (unsigned i = 0; i < t->nsess; i++) {
        struct fsess *fs = t->sess[i];
        if (fs->wake_owed) {
            fs->wake_owed = 0;
            if (fs->s != NULL)
                (void)shmipc__session_wake_owed(fs->s); /* a failure ends the session: seen */
        }
    }
}

/* Flushes r's stream, its worker woken at the end of the turn (shmipc__front_on_wake). */
static int flush_deferred(struct freq *r)
{
    struct fthread *t = r->t;
    int rc = shmipc__stream_flush_deferred(r->st);
    if (!r->fs->wake_owed) {
        r->fs->wake_owed = 1;
        if (!shmipc__timer_active(&t->wake_timer) && shmipc__timer_start(&t->wake_timer, 0) < 0) {
            /* No timer: wake now rather than never. */
            r->fs->wake_owed = 0;
            (void)shmipc__session_wake_owed(r->fs->s);
        }
    }
    return rc;
}

/* A held-bytes peak of the stats, raised to `now` if that is more. */
static void peak_raise(atomic_ullong *peak, unsigned long long now)
{
    unsigned long long p = atomic_load(peak);
    while (now > p && !atomic_compare_exchange_weak(peak, &p, now)) {
    }
}

/* Adds n to a held-bytes counter of the stats, and its peak follows. */
static void stat_add(atomic_ullong *v, atomic_ullong *peak, uint64_t n)
{
    peak_raise(peak, atomic_fetch_add(v, n) + n);
}

/*
 * The gather budget (docs/serve.md, "Request bodies"): a small body is read whole into memory
 * taken at its head, before a worker is claimed. Each connection could make the front hold
 * 64 KiB that way (a head with Content-Length: 65536 and a body that trickles in): 200 MB for
 * 3,000 connections (an attack review). gather_take() takes `n` bytes of the budget, or says
 * 0 when that would pass it: the body then streams to a worker as a larger one does (the
 * front keeps at most a piece of it). gather_done() gives them back once the body is whole,
 * or the request ends first.
 */
static int gather_take(struct shmipc__front *f, uint64_t n)
{
    unsigned long long now = atomic_fetch_add(&f->gathered, n) + n;
    if (now > f->gather_max) {
        atomic_fetch_sub(&f->gathered, n);
        return 0;
    }
    peak_raise(&f->gathered_peak, now);
    return 1;
}

static void gather_done(struct freq *r)
{
    if (!r->gathering)
        return;
    r->gathering = 0;
    atomic_fetch_sub(&r->t->f->gathered, r->body_cap);
}

void shmipc__front_req_free(struct freq *r)
{
    if (r->wsx != NULL)
        shmipc__front_ws_detach(r);
    shmipc__timer_stop(&r->timer);
    if (r->st != NULL)
        shmipc__stream_close_handle(r->st);
    gather_done(r);
    free(r->head);
    free(r->out);
    free(r->body_copy);
    if (r->up_buf != NULL)
        atomic_fetch_sub(&r->t->f->up_kept, r->up_buf_len);
    free(r->up_buf);
    if (r->rbody != NULL)
        atomic_fetch_sub(&r->t->f->buffered, r->rlen);
    free(r->rbody);
    free(r->le_blob);
    free(r);
}

/* ---- the access log ---- */

static uint64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void shmipc__front_on_log_timer(struct shmipc__timer *timer)
{
    struct fthread *t = timer->data;
    shmipc__access_buf_flush(&t->alog);
}

/* The body bytes the client gets with `status` and a body of `len`: none for HEAD, 1xx, 204
 * and 304 (nginx's $body_bytes_sent). */
static uint64_t body_sent(int is_head, unsigned status, size_t len)
{
    return is_head || status < 200 || status == 204 || status == 304 ? 0 : len;
}

/* The body of the answer the server itself makes for `status` (504, 500). */
static size_t server_body_len(int status)
{
    struct shmipc__http_response tmp;
    memset(&tmp, 0, sizeof tmp);
    shmipc__http_response_error(&tmp, status);
    return tmp.body_len;
}

/* One line into the thread's buffer; the flush timer runs while lines wait. */
static void log_line(struct fthread *t, shmipc__access_entry *e, uint64_t t0_us, unsigned status,
                     uint64_t bytes, const struct fsess *fs)
{
    uint64_t now = mono_us();
    e->status = status;
    e->bytes = bytes;
    e->duration_us = now > t0_us ? now - t0_us : 0;
    e->worker = fs != NULL ? fs->w->addr : NULL;
    e->worker_len = fs != NULL ? strlen(fs->w->addr) : 0;
    if (shmipc__access_buf_add(&t->alog, e) && !shmipc__timer_active(&t->alog_timer) &&
        shmipc__timer_start(&t->alog_timer, SHMIPC__ACCESS_FLUSH_MS) < 0)
        shmipc__access_buf_flush(&t->alog); /* no timer: written now rather than late */
}

/* The deferred request's line, once: `status` and the body it carried. */
static void req_log(struct freq *r, unsigned status, size_t body_len)
{
    if (r->le_blob == NULL || r->logged)
        return;
    r->logged = 1;
    log_line(r->t, &r->le, r->le_t0_us, status, body_sent(r->is_head, status, body_len), r->fs);
}

/* A streamed response's line, once, when it ends (END, or cut): the status its head sent,
 * also when the body was cut after it (nginx logs the status it sent), and the body bytes the
 * client was sent. */
static void stream_log(struct freq *r, uint64_t sent)
{
    req_log(r, r->rstatus, (size_t)sent);
}

/* Response bytes the front now holds more of (the stats' buffered and its peak). */
static void held_add(struct shmipc__front *f, size_t n)
{
    stat_add(&f->buffered, &f->buffered_peak, n);
}

/*
 * The worker is free again: the request is done with it. Other threads' waiting requests are
 * told through their eventfds when this thread has fewer waiting than all threads together.
 */
static void release_worker(struct fthread *t, struct fsess *fs, struct freq *r)
{
    struct shmipc__front *f = t->f;
    shmipc__front_fs_detach(fs, r);
    shmipc__front_kick(t);
    if (atomic_load(&f->queued) > atomic_load(&t->nwait)) {
        uint64_t one = 1;
        pthread_mutex_lock(&f->mu);
        for (unsigned i = 0; i < MAX_THREADS; i++) {
            struct fthread *o = f->threads[i];
            if (o != NULL && o != t && atomic_load(&o->nwait) > 0 &&
                write(o->efd, &one, sizeof one) < 0 && errno != EAGAIN)
                SHMIPC__LOG(SHMIPC__LOG_ERROR, "front: eventfd write: %s", strerror(errno));
        }
        pthread_mutex_unlock(&f->mu);
    }
}

/* The exchange is over (or given up): the stream closes, the worker is free. */
void shmipc__front_req_done(struct freq *r)
{
    struct fsess *fs = r->fs;
    if (fs != NULL && shmipc__front_fs_has(fs, r))
        release_worker(r->t, fs, r);
    shmipc__front_req_free(r);
}

/* As shmipc__front_req_done(), and a retired session closes once idle. Not from shmipc__front_fs_down(). */
static void req_finish(struct freq *r)
{
    struct fsess *fs = r->fs;
    shmipc__front_req_done(r);
    if (fs != NULL && (fs->retired || fs->stopping) && fs->nact == 0 && fs->s != NULL)
        shmipc__front_fs_down(fs, 0);
}

/* Answers the client with a canned status (502, 500, ...) when the deferral is still ours. */
void shmipc__front_answer_status(struct freq *r, int status)
{
    static const char *const text[] = {"Bad Gateway\n", "Internal Server Error\n",
                                       "Payload Too Large\n", "Service Unavailable\n"};
    const char *b = status == 502   ? text[0]
                    : status == 413 ? text[2]
                    : status == 503 ? text[3]
                                    : text[1];
    if (!r->live)
        return;
    r->live = 0;
    if (status == 502 && r->fs != NULL)
        atomic_fetch_add(&r->fs->w->failures, 1);
    if (r->streaming) {
        /* The head is out: the client can only see the body cut short, never a wrong one;
         * its line says the head's status (no 502 went out) and what was sent before the cut. */
        stream_log(r, shmipc__server_stream_sent(r->ticket));
        (void)shmipc__server_stream_abort(r->ticket);
        return;
    }
    req_log(r, (unsigned)status, strlen(b));
    (void)shmipc__server_complete(r->ticket, status, "text/plain", NULL, 0, b, strlen(b), NULL,
                                  NULL);
}

/* Sends an ABORT now (returns 0), or says the session's queue is full (1), or fails. */
static int send_abort(struct freq *r, uint32_t reason)
{
    uint8_t h[SHMIPC__SF_HDR_SIZE];
    shmipc_session *s = r->fs->s;
    if (s == NULL || r->st == NULL)
        return 0;
    if (!shmipc__session_can_send(s))
        return 1;
    if (shmipc__sf_encode_header(h, SHMIPC__SF_ABORT, 0, reason) < 0)
        return SHMIPC_EINVAL;
    /* Behind an upload's BODY frames in shared memory: there too, or later (1) when it is
     * full (the worker frees slices as it reads); a stream already on the socket stays there. */
    struct iovec iov = {h, sizeof h};
    int rc = r->st->fallback ? shmipc__stream_write(r->st, h, sizeof h)
                             : shmipc__stream_write_shm(r->st, &iov, 1);
    if (rc == SHMIPC_ENOSHM)
        return 1;
    if (rc == 0)
        rc = shmipc__stream_flush(r->st);
    if (rc == 0 && !r->st->fallback)
        r->abort_mark = shmipc__session_sent(s);
    /* The worker closed its stream already (it ended the exchange): nothing to abort. */
    return rc == SHMIPC_EEOF ? 0 : rc;
}

/*
 * The front gives the exchange up: the client is answered `status` (0: not at all, the
 * deferral ended already), the worker gets ABORT `reason`, and what it still sends is read
 * and dropped until its stream ends, at most SHMIPC__FRONT_DRAIN_MS.
 */
static void req_abort(struct freq *r, int status, uint32_t reason)
{
    if (status != 0)
        shmipc__front_answer_status(r, status);
    r->live = 0;
    r->uploading = 0; /* nothing more of the body goes (the server hands none after this) */
    /* The piece kept for the worker never goes now: free it at once, not at the drain's end. */
    if (r->up_buf != NULL)
        atomic_fetch_sub(&r->t->f->up_kept, r->up_buf_len);
    free(r->up_buf);
    r->up_buf = NULL;
    r->up_buf_len = r->up_left = 0;
    r->up_src = NULL;
    r->state = RQ_DRAINING;
    r->aborted_for = reason;
    r->drain_until = shmipc__loop_now_ms(r->t->loop) + SHMIPC__FRONT_DRAIN_MS;
    /* A kept session's worker is gone (fs_keep_relaying): no ABORT to send (its failure
     * would take the session down with the other responses still relaying from it); the
     * drain reads what is left of this one and ends it alone. */
    int rc = r->fs != NULL && r->fs->kept ? 0 : send_abort(r, reason);
    if (rc < 0) {
        shmipc__front_fs_down(r->fs, rc);
        return;
    }
    r->abort_reason = rc == 1 ? reason : 0;
    /* What is here already, the worker's close included, brings no new readiness: it is read
     * on the next turn of the loop (req_timer), or a worker that closed at once would stay
     * busy for the whole drain. Not now: the request may end there, and the callers (the
     * cancel callback inside a stream_head()/stream_body() call, req_read's END) go on
     * using it. */
    shmipc__timer_start(&r->timer, 0);
}

/*
 * The drain after the front's ABORT ran out without the worker's close. Past the request's
 * deadline, a worker that has not taken the ABORT from its queue (or never had room for it)
 * in all that time ran nothing of its session's since before the deadline: its app holds its
 * only thread, or its event loop, or the process is stopped. It is hung (as gunicorn's
 * --timeout finds a worker); shmipc-serve kills and restarts it. A worker that took the
 * ABORT and is only slow to close, or a client that left, says nothing of the kind.
 */
static void drain_ran_out(struct freq *r)
{
    struct fsess *fs = r->fs;
    if (r->aborted_for != SHMIPC__SF_ABORT_TIMEOUT || fs == NULL || fs->s == NULL || fs->kept)
        return;
    if (r->abort_reason == 0 &&
        (r->abort_mark == 0 || shmipc__session_peer_took(fs->s, r->abort_mark)))
        return;
    shmipc__front_worker_hung(fs->t->f, fs->w);
}

/* ---- sending a request ---- */

static int write_frame_hdr(shmipc_stream *st, unsigned type, size_t len)
{
    uint8_t h[SHMIPC__SF_HDR_SIZE];
    int rc = shmipc__sf_encode_header(h, type, len, 0);
    return rc < 0 ? rc : shmipc__stream_write(st, h, sizeof h);
}

static void keep_for_resend(struct freq *r);

/* ---- streamed uploads (docs/serve.md, "Streamed uploads") ---- */

/* The REQUEST_HEAD frame (encoded whole in r->out) into shared memory. */
static int upload_frame_raw(struct freq *r)
{
    struct iovec iov = {r->out, r->out_len};
    return shmipc__stream_write_shm(r->st, &iov, 1);
}

/*
 * Asked for TAKEN and not taken yet: the body bytes that may go before TAKEN, out of `n`
 * (0: none now). Only what the front keeps goes first (SHMIPC__FRONT_RETRY_BODY in all,
 * upload_copy), so that a stopping worker's refusal (ABORT SHUTDOWN without TAKEN) sends the
 * whole request to another worker (rewound: shmipc__front_upload_rewind) instead of a 503;
 * the rest waits for TAKEN (req_read starts the request's timer). A copy that failed
 * (no_retry) cannot be resent anyway: nothing is held back then. Without TAKEN asked, all of
 * `n` goes.
 */
static size_t upload_room(const struct freq *r, size_t n)
{
    if (!r->want_taken || r->taken || r->no_retry)
        return n;
    size_t room = SHMIPC__FRONT_RETRY_BODY - r->body_len;
    return n < room ? n : room;
}

/* One frame of an upload into the stream's shared memory: 0, SHMIPC_ENOSHM (nothing added:
 * not now), or the stream's failure. */
static int upload_frame(struct freq *r, unsigned type, const void *p, size_t n)
{
    uint8_t h[SHMIPC__SF_HDR_SIZE];
    int rc = shmipc__sf_encode_header(h, type, n, 0);
    if (rc < 0)
        return rc;
    struct iovec iov[2] = {{h, sizeof h}, {(void *)(uintptr_t)p, n}};
    return shmipc__stream_write_shm(r->st, iov, n > 0 ? 2 : 1);
}

/* The body bytes still to go are now the `n` bytes at `b` (malloc'ed, the request's): the
 * piece kept before is freed, the stats' count of kept bytes follows. */
static void up_buf_replace(struct freq *r, uint8_t *b, size_t n)
{
    struct shmipc__front *f = r->t->f;
    if (r->up_buf != NULL)
        atomic_fetch_sub(&f->up_kept, r->up_buf_len);
    free(r->up_buf);
    r->up_buf = b;
    r->up_buf_len = n;
    r->up_src = b;
    r->up_left = n;
    stat_add(&f->up_kept, &f->up_kept_peak, n);
}

/* The copy of what the stream could not take (the server's piece is lent for the call only). */
static int upload_keep(struct freq *r)
{
    if (r->up_left == 0 || r->up_src == r->up_buf)
        return 0;
    uint8_t *b = malloc(r->up_left);
    if (b == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "front: a piece of a request body");
    memcpy(b, r->up_src, r->up_left);
    up_buf_replace(r, b, r->up_left);
    return 0;
}

/*
 * An upload whose stream died before a flush reached a live worker goes again from its head
 * (shmipc__front_requeue): the body bytes already framed for that stream (kept in body_copy
 * while its first message was unflushed, at most SHMIPC__FRONT_RETRY_BODY) go first again,
 * then what was kept after them. Without this the next worker got the head and END only: an
 * empty body, and the app answered 200. 0, or SHMIPC_ENOMEM (the request untouched).
 */
int shmipc__front_upload_rewind(struct freq *r)
{
    if (!r->uploading || r->body_len == 0)
        return 0;
    size_t n = r->body_len + r->up_left;
    uint8_t *b = malloc(n);
    if (b == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "front: a request body to send again");
    memcpy(b, r->body_copy, r->body_len);
    if (r->up_left > 0)
        memcpy(b + r->body_len, r->up_src, r->up_left);
    up_buf_replace(r, b, n);
    free(r->body_copy);
    r->body_copy = NULL;
    r->body = NULL;
    r->body_len = 0;
    return 0;
}

/*
 * The request's first message was flushed: where it stands in the session's queue, so that a
 * session that ends before its worker popped it (a worker that died just before, unseen yet)
 * sends it to another worker instead of answering 502 (shmipc__front_req_refused). Over the
 * socket (fallback) nothing tells: 0.
 */
static void mark_sent(struct freq *r)
{
    r->sent_mark =
        __atomic_load_n(&r->st->fallback, __ATOMIC_RELAXED) ? 0 : shmipc__session_sent(r->fs->s);
}

/* The kept body is dropped: the request can no longer be resent. */
static void forget_body(struct freq *r)
{
    free(r->body_copy);
    r->body_copy = NULL;
    r->body = NULL;
    r->body_len = 0;
    r->no_retry = 1;
}

/*
 * Body bytes that go in the head's message (a body that came whole with its head) are kept,
 * up to SHMIPC__FRONT_RETRY_BODY, as a whole body is (keep_for_resend): a stopping worker's
 * refusal sends the request to another. Any later byte: the body is the worker's alone, the
 * request is never resent.
 */
static void upload_copy(struct freq *r, const uint8_t *p, size_t n)
{
    if (p != NULL && (!r->up_flushed || (r->want_taken && !r->taken)) && !r->no_retry &&
        n <= SHMIPC__FRONT_RETRY_BODY && r->body_len <= SHMIPC__FRONT_RETRY_BODY - n) {
        char *b = realloc(r->body_copy, r->body_len + n);
        if (b != NULL) {
            memcpy(b + r->body_len, p, n);
            r->body_copy = b;
            r->body = b;
            r->body_len += n;
            return;
        }
    }
    forget_body(r);
}

/*
 * The worker closed its stream mid-body (it answered early, or gave up): nothing more of the
 * body goes (what the server still hands is held there), what it sent is read from the loop:
 * its answer, or the stream's end (502). The session lives on.
 */
static void upload_stop(struct freq *r)
{
    if (r->up_buf != NULL)
        atomic_fetch_sub(&r->t->f->up_kept, r->up_buf_len);
    free(r->up_buf);
    r->up_buf = NULL;
    r->up_buf_len = r->up_left = 0;
    r->up_src = NULL;
    r->up_dirty = 0;
    r->uploading = 0;
    r->no_retry = 1;
    free(r->body_copy);
    r->body_copy = NULL;
    r->body = NULL;
    r->body_len = 0;
    shmipc__timer_start(&r->timer, 0);
}

/*
 * Moves what the front holds of an uploading request into its stream: the head, the kept body
 * bytes in BODY frames, END once the body ended; flushes now (`flush_now`, END, or when shared
 * memory ran out: the worker frees slices as it reads what was flushed), else from a 0 ms
 * timer, so that what one turn of the loop brings goes as one message (a small body that came
 * with its head: head, body and END together). What the session cannot take now waits on the
 * request's timer (RETRY_MS; never a wait in the loop, never the socket). Once nothing is
 * kept, a body the server holds for us is resumed. Returns 0; 1 when the request may be gone
 * (the resume ran the server's callbacks); or a failure of the stream, the request untouched.
 */
static int upload_push(struct freq *r, int flush_now)
{
    int rc = 0, wait = 0;
    if (!r->up_head && (rc = upload_frame_raw(r)) == 0) {
        r->up_head = 1;
        r->up_dirty = 1;
    }
    while (rc == 0 && r->up_left > 0) {
        size_t n = upload_room(r, r->up_left > UPLOAD_FRAME ? UPLOAD_FRAME : r->up_left);
        if (n == 0)
            break; /* the rest after TAKEN */
        if ((rc = upload_frame(r, SHMIPC__SF_BODY, r->up_src, n)) == 0) {
            upload_copy(r, r->up_src, n);
            r->up_src += n;
            r->up_left -= n;
            r->up_dirty = 1;
        }
    }
    if (rc == 0 && r->up_ended && !r->up_end_out && r->up_left == 0 &&
        (rc = upload_frame(r, SHMIPC__SF_END, NULL, 0)) == 0) {
        r->up_end_out = 1;
        r->up_dirty = 1;
    }
    if (rc == SHMIPC_ENOSHM) {
        wait = 1;
        rc = 0;
    }
    if (rc < 0)
        return rc;
    if (r->up_dirty && (flush_now || wait || r->up_end_out)) {
        if (shmipc__session_can_send(r->fs->s)) {
            if ((rc = shmipc__stream_flush(r->st)) == SHMIPC_EEOF) {
                upload_stop(r);
                return 0;
            }
            if (rc < 0)
                return rc;
            r->up_dirty = 0;
            if (!r->up_flushed && !r->up_end_out && r->body_len > 0 && !r->want_taken)
                upload_copy(r, NULL, 0); /* the body goes on past its first message */
            if (!r->up_flushed)
                mark_sent(r);
            r->up_flushed = 1;
        } else {
            wait = 1;
        }
    }
    if (r->up_left == 0 && r->up_buf != NULL) {
        atomic_fetch_sub(&r->t->f->up_kept, r->up_buf_len);
        free(r->up_buf);
        r->up_buf = NULL;
        r->up_buf_len = 0;
        r->up_src = NULL;
    }
    if (wait)
        return shmipc__timer_start(&r->timer, RETRY_MS);
    if (r->up_dirty) {
        if (!shmipc__timer_active(&r->timer))
            return shmipc__timer_start(&r->timer, 0);
        return 0;
    }
    if (r->up_end_out) {
        r->uploading = 0; /* all of it went: an ACTIVE request like any other */
        return 0;
    }
    if (r->up_held && r->up_left == 0) {
        r->up_held = 0;
        /* The server hands what it buffered over now (on_body, on_end), or cancels. */
        (void)shmipc__server_upload_resume(r->ticket);
        return 1;
    }
    return 0;
}

/*
 * Body bytes still kept when the server hands the next piece: rewound for another worker
 * (shmipc__front_upload_rewind) while the server held nothing back, as after a refusal before
 * TAKEN of a body that comes slowly. The piece goes behind them, in one copy with them: it
 * used to replace them, and the next worker got the body without its first bytes. 0, or
 * SHMIPC_ENOMEM (nothing changed).
 */
static int upload_join(struct freq *r, const void *piece, size_t len)
{
    uint8_t *b = malloc(r->up_left + len);
    if (b == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "front: a piece of a request body");
    memcpy(b, r->up_src, r->up_left);
    memcpy(b + r->up_left, piece, len);
    up_buf_replace(r, b, r->up_left + len);
    return 0;
}

/* A waiting request leaves its thread's queue. */
static void req_unqueue(struct freq *r)
{
    struct fthread *t = r->t;
    struct freq **pp = &t->qhead, *prev = NULL;
    while (*pp != r) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    *pp = r->next;
    if (t->qtail == r)
        t->qtail = prev;
    atomic_fetch_sub(&t->nwait, 1);
    atomic_fetch_sub(&t->f->queued, 1);
}

/* What the front could not keep of a body (out of memory): 503. A waiting request ends here
 * (no worker has any of it, and req_abort would look for its session); one in flight is
 * given up as usual. */
static void upload_give_up(struct freq *r)
{
    if (r->state == RQ_QUEUED) {
        shmipc__front_answer_status(r, 503);
        req_unqueue(r);
        shmipc__front_req_free(r);
        return;
    }
    req_abort(r, 503, SHMIPC__SF_ABORT_CLIENT_GONE);
}

/* The server's next piece of the body (lent for the call): into the stream, or kept (1: the
 * server holds the rest of the body until upload_push resumes it). */
static int on_body(void *data, const void *piece, size_t len)
{
    struct freq *r = data;
    int rc;
    if (!r->uploading || (r->state != RQ_QUEUED && r->state != RQ_ACTIVE))
        return 1; /* given up (cannot happen: the server hands nothing after the answer) */
    if (r->up_left == 0) {
        r->up_src = piece;
        r->up_left = len;
    } else if (upload_join(r, piece, len) < 0) {
        upload_give_up(r);
        return 1;
    }
    if (r->state == RQ_ACTIVE && (rc = upload_push(r, 0)) < 0) {
        /*
         * The session goes down: a 502, or, not taken yet, the request goes to another worker
         * (shmipc__front_requeue). What is left of the lent piece is kept for that worker and
         * the rest of the body held for its resume (upload_push), as when the session is
         * full; without the copy a requeued upload read the server's freed piece, and without
         * the hold nobody resumed the body. Out of memory, the body cannot go whole anywhere:
         * lost (never resent). `r` may be gone after fs_down.
         */
        int hold = r->up_left > 0 && upload_keep(r) == 0;
        if (r->up_left > 0 && !hold) {
            r->up_left = 0;
            r->up_src = NULL;
            r->up_lost = 1;
        }
        r->up_held = (uint8_t)hold;
        shmipc__front_fs_down(r->fs, rc);
        return hold;
    }
    if (r->up_left == 0)
        return 0;
    if (upload_keep(r) < 0) {
        upload_give_up(r);
        return 1;
    }
    r->up_held = 1;
    return 1;
}

/* The body ended whole: END follows what is kept. */
static void on_body_end(void *data)
{
    struct freq *r = data;
    r->up_ended = 1;
    r->up_held = 0; /* the server has nothing more to resume */
    if (r->uploading && r->state == RQ_ACTIVE) {
        int rc = upload_push(r, 1);
        if (rc < 0)
            shmipc__front_fs_down(r->fs, rc);
    }
}

/* The request's body in its own copy (the server's is gone once the handler returned): 0, or
 * SHMIPC_ENOMEM. */
int shmipc__front_req_own_body(struct freq *r)
{
    if (r->body_len > 0 && r->body_copy == NULL) {
        if ((r->body_copy = malloc(r->body_len)) == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "front: a body copy");
        memcpy(r->body_copy, r->body, r->body_len);
        r->body = r->body_copy;
    }
    return 0;
}

/*
 * The session cannot take the request now (its queue or, for a small request, its shared
 * memory is full): sent again from the request's timer (SENDING), 1, 2, 4 ... 16 ms apart
 * while it cannot (the deadline bounds the wait), with its body in its own copy.
 */
static int send_later(struct freq *r)
{
    if (shmipc__front_req_own_body(r) < 0)
        return SHMIPC_ENOMEM;
    r->state = RQ_SENDING;
    atomic_fetch_add(&r->t->f->send_waits, 1);
    uint64_t ms = (uint64_t)RETRY_MS << (r->send_tries < 4 ? r->send_tries : 4);
    if (r->send_tries < UINT8_MAX)
        r->send_tries++;
    return shmipc__timer_start(&r->timer, ms);
}

/*
 * Sends the whole request as one message: REQUEST_HEAD, the body in BODY frames of at most
 * 1 MiB, END. With the session's queue full it waits on the request's timer (SENDING); so
 * does a request of at most SHM_ONLY_MAX bytes with its shared memory full.
 */
int shmipc__front_req_send(struct freq *r)
{
    struct fsess *fs = r->fs;
    int rc = 0;
    if (r->st == NULL && (rc = shmipc__session_open_stream(fs->s, &r->st)) < 0)
        return rc;
    if (r->uploading) {
        r->state = RQ_ACTIVE;
        rc = upload_push(r, 0);
        return rc > 0 ? 0 : rc;
    }
    if (!shmipc__session_can_send(fs->s))
        return send_later(r);
    if (r->out_len + r->body_len <= SHM_ONLY_MAX) {
        /*
         * Into shared memory only, or not now: a session whose memory the worker's answers
         * fill (clients that read slowly; several at once on a concurrent worker) would send
         * it over the socket, and shmipc then refuses the session's new streams for 30 s
         * (SHMIPC_EUNHEALTHY), which took the session down with every request on it. A
         * larger request (a huge head; a body over SHMIPC__FRONT_RETRY_BODY streams as an
         * upload, shared memory only too) may need more than the whole buffer: the old way.
         */
        uint8_t bh[SHMIPC__SF_HDR_SIZE], eh[SHMIPC__SF_HDR_SIZE];
        struct iovec iov[4];
        size_t n = 0;
        iov[n++] = (struct iovec){r->out, r->out_len};
        if (r->body_len > 0) {
            (void)shmipc__sf_encode_header(bh, SHMIPC__SF_BODY, r->body_len, 0);
            iov[n++] = (struct iovec){bh, sizeof bh};
            iov[n++] = (struct iovec){(void *)r->body, r->body_len};
        }
        (void)shmipc__sf_encode_header(eh, SHMIPC__SF_END, 0, 0);
        iov[n++] = (struct iovec){eh, sizeof eh};
        if ((rc = shmipc__stream_write_shm(r->st, iov, n)) == SHMIPC_ENOSHM)
            return send_later(r);
    } else {
        rc = shmipc__stream_write(r->st, r->out, r->out_len);
        for (size_t off = 0; rc == 0 && off < r->body_len;) {
            size_t n = r->body_len - off;
            n = n > SHMIPC__SF_MAX_CHUNK ? SHMIPC__SF_MAX_CHUNK : n;
            rc = write_frame_hdr(r->st, SHMIPC__SF_BODY, n);
            if (rc == 0)
                rc = shmipc__stream_write(r->st, r->body + off, n);
            off += n;
        }
        if (rc == 0)
            rc = write_frame_hdr(r->st, SHMIPC__SF_END, 0);
    }
    if (rc == 0)
        rc = flush_deferred(r);
    if (rc < 0)
        return rc;
    mark_sent(r);
    r->state = RQ_ACTIVE;
    keep_for_resend(r);
    return 0;
}

/*
 * Sent: the head (r->out) and a body of at most SHMIPC__FRONT_RETRY_BODY bytes stay until the
 * worker's first frame, so a stopping worker's refusal can send them to another; a larger
 * body is let go (the server's copy is gone once the handler returned) and never resent.
 */
static void keep_for_resend(struct freq *r)
{
    if (r->body_len == 0)
        return;
    if (r->body_len <= SHMIPC__FRONT_RETRY_BODY &&
        (r->body_copy != NULL || (r->body_copy = malloc(r->body_len)) != NULL)) {
        if (r->body != r->body_copy)
            memcpy(r->body_copy, r->body, r->body_len);
        r->body = r->body_copy;
        return;
    }
    /* Also the copy a queued request had: not kept while the worker runs it. */
    free(r->body_copy);
    r->body_copy = NULL;
    r->no_retry = 1;
    r->body = NULL;
    r->body_len = 0;
}

/* The worker answered: what a resend needed goes. */
static void forget_request(struct freq *r)
{
    free(r->out);
    r->out = NULL;
    forget_body(r);
}

/*
 * Whether a refused request (ABORT SHUTDOWN: the worker did not process it) goes to another
 * worker: nothing of an answer came, the client still waits, the front holds the whole
 * request, and fewer than SHMIPC__FRONT_RETRIES workers refused it. Counted when it does.
 */
static int may_resend(struct freq *r)
{
    /* An upload is resent only when its whole body went with the head (kept, not uploading
     * any more), or none of it went, or, asked for TAKEN, what went is kept (upload_room). */
    if (!r->live || r->got_head || r->taken || r->streaming || r->no_retry || r->out == NULL ||
        r->retries >= SHMIPC__FRONT_RETRIES || (r->uploading && r->body_len > 0 && !r->want_taken))
        return 0;
    r->retries++;
    atomic_fetch_add(&r->t->f->retried, 1);
    SHMIPC__LOG(SHMIPC__LOG_DEBUG, "front: worker %s is stopping: its request goes to another",
                r->fs != NULL ? r->fs->w->addr : "?");
    return 1;
}

/*
 * The session ended under a request (shmipc__front_fs_down): whether the worker never took
 * it, and it may go to another worker. Never taken: its flush was still waiting (SENDING);
 * or the worker's last word, not read yet, was ABORT SHUTDOWN before any answer; or, asked
 * for TAKEN, the worker sent nothing at all for it (its TAKEN, had it sent one before it
 * ended, would be there: what a session received is read out of it before it is closed); or,
 * when the session ended because the worker left (`peer_left`: its end was read, not one of
 * ours), the worker never popped its message from the queue (it died before; sent_mark). A
 * session the front ends itself (a timeout, a protocol error) leaves the worker alive, and it
 * takes what the queue holds when it sees the end: those requests may run, so they are not
 * resent.
 * Reads one frame header at most; the request is given up either way.
 */
int shmipc__front_req_refused(struct freq *r, int peer_left)
{
    const void *p;
    struct shmipc__sf_frame fh;
    if (r->state == RQ_SENDING)
        return may_resend(r);
    if (r->state != RQ_ACTIVE || r->st == NULL || r->have_hdr || r->got_head || r->taken)
        return 0;
    if (shmipc__stream_read_exact(r->st, SHMIPC__SF_HDR_SIZE, &p, SHMIPC_NONBLOCK) < 0)
        return (r->want_taken || (peer_left && r->fs != NULL && r->fs->s != NULL &&
                                  !shmipc__session_peer_took(r->fs->s, r->sent_mark))) &&
               may_resend(r);
    int rc = shmipc__sf_decode_header(p, SHMIPC__SF_HDR_SIZE, &fh);
    shmipc__stream_release(r->st);
    if (rc >= 0 && fh.type == SHMIPC__SF_TAKEN)
        r->taken = 1; /* whatever follows: the worker may have acted on it */
    return !r->taken && rc >= 0 && fh.type == SHMIPC__SF_ABORT &&
           fh.arg == SHMIPC__SF_ABORT_SHUTDOWN && may_resend(r);
}

/*
 * A request the worker never took goes to another worker, and its session takes no more: it
 * closes (reconnecting later unless retired) once the requests still in flight on it have
 * ended, so that one the worker is finishing (pipelined, a stopping worker's last) is not cut.
 */
static void requeue_elsewhere(struct freq *r)
{
    struct fsess *fs = r->fs;
    fs->stopping = 1;
    if (shmipc__front_requeue(r->t, r) < 0) { /* its body could not be kept: on no queue */
        shmipc__front_answer_status(r, 503);
        shmipc__front_req_done(r);
    }
    if (fs->nact == 0 && fs->s != NULL)
        shmipc__front_fs_down(fs, 0);
}

/* ---- reading the response ---- */

static int hdr_is(const struct shmipc__sf_field *fd, const char *name)
{
    size_t n = strlen(name);
    return fd->name_len == n && strncasecmp((const char *)fd->name, name, n) == 0;
}

/*
 * The worker's RESPONSE_HEAD as the server takes it: the fields but the framing ones (the
 * front's, docs/serve.md "RESPONSE_HEAD"), the first Content-Type apart (*ctype, malloc'd),
 * Connection: close for the CLOSE flag. 0, or -1 for a head the front cannot relay.
 */
static int head_fields(const struct freq *r, struct shmipc__sf_frame *fr,
                       struct shmipc__http_header_out *h, uint32_t *nout, char **ctype)
{
    struct shmipc__sf_field fd;
    uint32_t n = 0;
    *ctype = NULL;
    if (shmipc__sf_decode(r->head, r->head_len, fr) <= 0)
        return -1;
    struct shmipc__sf_fields it = fr->u.resp.fields;
    while (shmipc__sf_fields_next(&it, &fd)) {
        if (hdr_is(&fd, "Content-Length") || hdr_is(&fd, "Transfer-Encoding") ||
            hdr_is(&fd, "Connection") || hdr_is(&fd, "Date") || hdr_is(&fd, "Server") ||
            hdr_is(&fd, "Keep-Alive"))
            continue;
        if (hdr_is(&fd, "Content-Type")) {
            if (*ctype != NULL)
                continue;
            if ((*ctype = malloc(fd.value_len + 1u)) == NULL)
                return -1;
            memcpy(*ctype, fd.value, fd.value_len);
            (*ctype)[fd.value_len] = '\0';
            continue;
        }
        if (n == SHMIPC__SERVER_MAX_RESP_HEADERS)
            return -1; /* more than the server takes from a handler */
        h[n++] = (struct shmipc__http_header_out){(const char *)fd.name, (const char *)fd.value,
                                                  fd.name_len, fd.value_len};
    }
    if (fr->u.resp.flags & SHMIPC__SF_RESP_CLOSE) {
        if (n == SHMIPC__SERVER_MAX_RESP_HEADERS)
            return -1;
        h[n++] = (struct shmipc__http_header_out){"Connection", "close", 10, 5};
    }
    *nout = n;
    return 0;
}

/* Whether the response carries a body: not for HEAD, 204 and 304, whatever its length says. */
static int has_body(const struct freq *r, const struct shmipc__sf_frame *fr)
{
    return !r->is_head && fr->u.resp.status != 204 && fr->u.resp.status != 304;
}

static int stream_start(struct freq *r);
static void stream_end(struct freq *r);

/* The worker's END: the response goes to the client. */
static void req_answer(struct freq *r)
{
    struct shmipc__sf_frame fr;
    struct shmipc__http_header_out h[SHMIPC__SERVER_MAX_RESP_HEADERS + 1];
    char *ctype = NULL;
    uint32_t n = 0;
    int rc;

    if (head_fields(r, &fr, h, &n, &ctype) < 0)
        goto bad;
    if (r->is_head && fr.u.resp.status != 204 && fr.u.resp.status != 304 &&
        (!(fr.u.resp.flags & SHMIPC__SF_RESP_CONTENT_LENGTH) || fr.u.resp.content_length > 0)) {
        /* HEAD: the client gets the head GET would have, and no body: the worker's
         * Content-Length, or none when GET's body has no length (chunked); a whole answer
         * would say "Content-Length: 0", the length of the body it has (RFC 9110 8.6 allows
         * only GET's). */
        free(ctype);
        if (stream_start(r) == 0)
            stream_end(r);
        return;
    }
    /* The body must add up to the worker's own length, but for HEAD, 204 and 304, which
     * carry none. */
    if ((fr.u.resp.flags & SHMIPC__SF_RESP_CONTENT_LENGTH) && has_body(r, &fr) &&
        fr.u.resp.content_length != r->rlen)
        goto bad;
    uint8_t *body = r->rbody;
    size_t len = r->rlen;
    if (body != NULL) /* the server holds it from here on */
        atomic_fetch_sub(&r->t->f->buffered, len);
    r->rbody = NULL;
    r->live = 0;
    /* Counted first: the client may see the answer before complete() returns. */
    atomic_fetch_add(&r->fs->w->served, 1);
    rc = shmipc__server_complete(r->ticket, fr.u.resp.status, ctype, h, n, body, len,
                                 body != NULL ? free : NULL, body);
    free(ctype);
    if (rc == 0)
        req_log(r, fr.u.resp.status, len);
    if (rc == SHMIPC_EINVAL) {
        /* A field the server refuses (a control byte in a value, a status it does not send). */
        atomic_fetch_sub(&r->fs->w->served, 1);
        r->live = 1;
        shmipc__front_answer_status(r, 502);
        return;
    }
    return;
bad:
    free(ctype);
    shmipc__front_answer_status(r, 502);
}

/* Appends a BODY payload; 0, or 1 when the response is over max_response. */
static int body_append(struct freq *r, const void *p, size_t n)
{
    if (r->rlen + n > r->t->f->max_response)
        return 1;
    if (r->rlen + n > r->rcap) {
        /* A body in one piece, the usual, takes its own size: a first buffer of 4 KiB for a
         * small body was a large-bin malloc (and a fastbin consolidation) per request. */
        size_t cap = r->rcap ? r->rcap : n;
        while (cap < r->rlen + n)
            cap *= 2;
        if (cap > r->t->f->max_response)
            cap = r->t->f->max_response;
        uint8_t *nb = realloc(r->rbody, cap);
        if (nb == NULL)
            return 1;
        r->rbody = nb;
        r->rcap = cap;
    }
    memcpy(r->rbody + r->rlen, p, n);
    r->rlen += n;
    held_add(r->t->f, n);
    return 0;
}

/* ---- streamed responses (docs/serve.md, "Streamed responses") ----
 *
 * A response whose END is not here by the time its stream has nothing more to read (or whose
 * body reaches the mark) is streamed: its head goes to the server (stream_head), every BODY
 * frame after it is a piece queued on the client connection (stream_body), END ends it.
 * The next BODY frame is read only while the connection holds less than the mark and the
 * frame fits max_response beside what it holds: a slow client stops the worker through its
 * stream, and the front holds at most max(mark, one frame) bytes per connection. */

static size_t stream_mark(const struct shmipc__front *f)
{
    return f->max_response < STREAM_MARK ? (size_t)f->max_response : STREAM_MARK;
}

/* A piece's memory: counted in the stats' buffered while the server holds it. */
struct fpiece {
    struct shmipc__front *f;
    size_t n;
    uint8_t data[];
};

static void piece_release(void *p)
{
    struct fpiece *pc = p;
    atomic_fetch_sub(&pc->f->buffered, pc->n);
    free(pc);
}

/* A copy of `n` body bytes (NULL: out of memory), made before the stream's bytes are
 * released. */
static struct fpiece *piece_new(struct freq *r, const void *p, size_t n)
{
    struct fpiece *pc = malloc(sizeof *pc + n);
    if (pc != NULL) {
        pc->f = r->t->f;
        pc->n = n;
        memcpy(pc->data, p, n);
        held_add(pc->f, n);
    }
    return pc;
}

/* Queues a piece on the client connection: 0, or -1 when the stream was given up. */
static int stream_give(struct freq *r, struct fpiece *pc)
{
    if (pc == NULL) {
        req_abort(r, 502, SHMIPC__SF_ABORT_WORKER_ERROR);
        return -1;
    }
    size_t n = pc->n;
    if (n == 0) {
        piece_release(pc);
        return 0;
    }
    if (r->rwant != SHMIPC__SERVER_STREAM_UNSIZED && n > r->rwant - r->rtotal) {
        piece_release(pc);
        req_abort(r, 502, SHMIPC__SF_ABORT_PROTOCOL); /* more than its own Content-Length */
        return -1;
    }
    r->rtotal += n;
    if (shmipc__server_stream_body(r->ticket, pc->data, n, piece_release, pc) < 0) {
        req_abort(r, 502, SHMIPC__SF_ABORT_PROTOCOL);
        return -1;
    }
    return r->state == RQ_ACTIVE ? 0 : -1; /* the piece's send closed it: cancelled */
}

/* The server sent some of the connection's queue: a held-back stream reads again, from the
 * loop (the server must not be called back from here). */
static void stream_drained(void *data)
{
    struct freq *r = data;
    if (r->wait_drain && r->state == RQ_ACTIVE) {
        r->wait_drain = 0;
        shmipc__timer_start(&r->timer, 0);
    }
}

/* The head goes to the client now, with the body read so far. 0, or -1: given up. */
static int stream_start(struct freq *r)
{
    struct shmipc__sf_frame fr;
    struct shmipc__http_header_out h[SHMIPC__SERVER_MAX_RESP_HEADERS + 1];
    char *ctype = NULL;
    uint32_t n = 0;
    if (head_fields(r, &fr, h, &n, &ctype) < 0) {
        free(ctype);
        req_abort(r, 502, SHMIPC__SF_ABORT_PROTOCOL);
        return -1;
    }
    r->rwant = SHMIPC__SERVER_STREAM_UNSIZED;
    if (!r->solo && r->fs != NULL) { /* a response that streams may last: nothing more behind it */
        r->solo = 1;
        atomic_fetch_add(&r->fs->w->solo, 1);
    }
    if (fr.u.resp.flags & SHMIPC__SF_RESP_CONTENT_LENGTH) {
        r->rwant = fr.u.resp.content_length;
        if (has_body(r, &fr) && r->rlen > r->rwant) {
            free(ctype);
            req_abort(r, 502, SHMIPC__SF_ABORT_PROTOCOL);
            return -1;
        }
    }
    int rc = shmipc__server_stream_head(r->ticket, fr.u.resp.status, ctype, h, n, r->rwant,
                                        stream_mark(r->t->f), stream_drained, r);
    free(ctype);
    if (rc < 0) { /* a field the server refuses: nothing was sent yet */
        req_abort(r, 502, SHMIPC__SF_ABORT_PROTOCOL);
        return -1;
    }
    if (r->state != RQ_ACTIVE) /* the head closed the connection: cancelled (on_cancel) */
        return -1;
    r->streaming = 1;
    r->rstatus = fr.u.resp.status;
    if (!has_body(r, &fr))
        r->rwant = SHMIPC__SERVER_STREAM_UNSIZED; /* nothing is sent: nothing to count */
    uint8_t *body = r->rbody;
    size_t len = r->rlen;
    r->rbody = NULL;
    r->rlen = r->rcap = 0;
    if (body == NULL)
        return 0;
    struct fpiece *pc = piece_new(r, body, len);
    atomic_fetch_sub(&r->t->f->buffered, len);
    free(body);
    return stream_give(r, pc);
}

/* The worker's END of a streamed response. */
static void stream_end(struct freq *r)
{
    r->live = 0;
    if (r->rwant != SHMIPC__SERVER_STREAM_UNSIZED && r->rtotal != r->rwant) {
        stream_log(r, shmipc__server_stream_sent(r->ticket));
        (void)shmipc__server_stream_abort(r->ticket); /* short: the client sees it cut */
        atomic_fetch_add(&r->fs->w->failures, 1);
        return;
    }
    /* All of it is given: the server sends it unless the client leaves first (the line is
     * written now, with the whole body, not when the last byte has left). */
    stream_log(r, r->rtotal);
    atomic_fetch_add(&r->fs->w->served, 1);
    if (shmipc__server_stream_end(r->ticket) < 0)
        atomic_fetch_sub(&r->fs->w->served, 1);
}

/*
 * Whether the next BODY frame, of `len` bytes, waits (1) because the connection holds the
 * mark, or would go over max_response beside what it holds; -1: a frame max_response cannot
 * take at all (given up); 0: read it.
 */
static int stream_hold(struct freq *r, size_t len)
{
    struct shmipc__front *f = r->t->f;
    /* The frame's header is copied (r->hdr): its bytes go before anything may give up. */
    shmipc__stream_release(r->st);
    size_t held = r->streaming ? shmipc__server_stream_queued(r->ticket) : r->rlen;
    if (held == 0 && len > f->max_response) {
        /* A response already streaming is cut (answer_status); one that is not is 502. */
        req_abort(r, 502, SHMIPC__SF_ABORT_TOO_LARGE);
        return -1;
    }
    if (!r->streaming) {
        /* Gathered whole while it fits the mark; past it the response is streamed. */
        if (held + len <= stream_mark(f) && held + len <= f->max_response)
            return 0;
        if (stream_start(r) < 0)
            return -1;
        held = shmipc__server_stream_queued(r->ticket);
    }
    if (held > 0 && (held >= stream_mark(f) || held + len > f->max_response)) {
        r->wait_drain = 1;
        return 1;
    }
    return 0;
}

/* DRAINING: drop what comes until the worker's stream ends. */
void shmipc__front_req_drain(struct freq *r)
{
    for (;;) {
        const void *p;
        size_t n;
        int rc = shmipc__stream_read_chunk(r->st, 0, &p, &n, SHMIPC_NONBLOCK);
        if (rc == SHMIPC_EAGAIN)
            return;
        if (rc < 0) { /* SHMIPC_EEOF: the worker closed its stream; or the session failed */
            req_finish(r);
            return;
        }
        shmipc__stream_release(r->st);
    }
}

/* ACTIVE: reads whole frames as they come. */
void shmipc__front_req_read(struct freq *r)
{
    for (;;) {
        const void *p;
        int rc;
        if (!r->have_hdr) {
            rc = shmipc__stream_read_exact(r->st, SHMIPC__SF_HDR_SIZE, &p, SHMIPC_NONBLOCK);
            if (rc == SHMIPC_EAGAIN)
                goto idle;
            if (rc < 0)
                goto ended;
            memcpy(r->hdr, p, sizeof r->hdr);
            if (shmipc__sf_decode_header(r->hdr, sizeof r->hdr, &r->fh) < 0) {
                shmipc__stream_release(r->st);
                goto protocol;
            }
            r->have_hdr = 1;
        }
        uint32_t len = r->fh.length;
        p = NULL;
        if (r->fh.type == SHMIPC__SF_BODY && r->got_head && (rc = stream_hold(r, len)) != 0)
            return; /* held back until the client took some (1), or given up (-1) */
        if (len > 0) {
            rc = shmipc__stream_read_exact(r->st, len, &p, SHMIPC_NONBLOCK);
            if (rc == SHMIPC_EAGAIN)
                goto idle;
            if (rc < 0)
                goto ended;
        }
        r->have_hdr = 0;
        switch (r->fh.type) {
        case SHMIPC__SF_TAKEN:
            /* Only asked for, once, and before anything else of the worker's. */
            shmipc__stream_release(r->st);
            if (!r->want_taken || r->taken || r->got_head)
                goto protocol;
            r->taken = 1;
            if (r->uploading) { /* the body held back for TAKEN goes on (upload_room) */
                forget_body(r);
                shmipc__timer_start(&r->timer, 0);
            }
            break;
        case SHMIPC__SF_RESPONSE_HEAD: {
            struct shmipc__sf_frame fr;
            uint8_t *copy = malloc(SHMIPC__SF_HDR_SIZE + (size_t)len);
            if (copy == NULL)
                goto protocol;
            memcpy(copy, r->hdr, SHMIPC__SF_HDR_SIZE);
            memcpy(copy + SHMIPC__SF_HDR_SIZE, p, len);
            shmipc__stream_release(r->st);
            long drc =
                r->got_head ? 0 : shmipc__sf_decode(copy, SHMIPC__SF_HDR_SIZE + (size_t)len, &fr);
            if (drc < 0) /* the worker's bug, said once per request: the client gets 502 */
                SHMIPC__LOG(SHMIPC__LOG_WARN,
                            "front: worker %s: a response head that does not decode: %s",
                            r->fs != NULL ? r->fs->w->addr : "?", shmipc__detail());
            if (drc <= 0 ||
                (fr.u.resp.status == 101 && !r->ws)) { /* a 101 answers no upgrade sent */
                free(copy);
                goto protocol;
            }
            if (fr.u.resp.status == 101) { /* the upgrade accepted: front_ws.c from here */
                shmipc__front_ws_accept(r, copy, SHMIPC__SF_HDR_SIZE + (size_t)len);
                return;
            }
            if (fr.u.resp.status < 200) { /* interim: the final head follows */
                free(copy);
                /* The worker is processing it: a refusal after this is no longer "not
                 * processed", and the request is never resent. */
                forget_request(r);
                break;
            }
            r->head = copy;
            r->head_len = SHMIPC__SF_HDR_SIZE + (size_t)len;
            r->got_head = 1;
            forget_request(r);
            break;
        }
        case SHMIPC__SF_BODY:
            if (!r->got_head) {
                shmipc__stream_release(r->st);
                goto protocol;
            }
            if (r->streaming) {
                struct fpiece *pc = piece_new(r, p, len);
                shmipc__stream_release(r->st);
                if (stream_give(r, pc) < 0)
                    return;
                break;
            }
            rc = body_append(r, p, len);
            shmipc__stream_release(r->st);
            if (rc) {
                req_abort(r, 502, SHMIPC__SF_ABORT_TOO_LARGE);
                return;
            }
            break;
        case SHMIPC__SF_END:
            shmipc__stream_release(r->st);
            if (!r->got_head)
                goto protocol;
            if (r->streaming)
                stream_end(r);
            else
                req_answer(r);
            req_finish(r);
            return;
        case SHMIPC__SF_ABORT: {
            uint32_t why = r->fh.arg;
            shmipc__stream_release(r->st);
            if (why == SHMIPC__SF_ABORT_SHUTDOWN && may_resend(r)) {
                /* A stopping worker refused it unprocessed: another worker gets it. */
                requeue_elsewhere(r);
                return;
            }
            /* The worker ended the exchange: nothing more comes, its close follows. */
            shmipc__front_answer_status(r, why == SHMIPC__SF_ABORT_WORKER_ERROR ? 500
                                           : why == SHMIPC__SF_ABORT_TOO_LARGE  ? 413
                                           : why == SHMIPC__SF_ABORT_SHUTDOWN   ? 503
                                                                                : 502);
            req_finish(r);
            return;
        }
        default: /* WS_* on an HTTP request, REQUEST_HEAD from a worker */
            shmipc__stream_release(r->st);
            goto protocol;
        }
    }
idle:
    /* Nothing more to read now: a response with some body but no END yet is streamed (the
     * client sees it come); a head alone waits for its body or its end. */
    if (r->got_head && !r->streaming && r->rlen > 0)
        (void)stream_start(r);
    return;
ended:
    /* The stream or the session ended mid-request. */
    if (shmipc__session_status(r->fs->s) < 0) {
        shmipc__front_fs_down(r->fs, shmipc__session_status(r->fs->s));
        return;
    }
    /* Closed by a worker that had not taken it (one dying closes its streams before its
     * session): another worker gets it. */
    if (r->want_taken && !r->taken && !r->have_hdr && !r->got_head && may_resend(r)) {
        requeue_elsewhere(r);
        return;
    }
    shmipc__front_answer_status(r, 502);
    req_finish(r);
    return;
protocol:
    req_abort(r, 502, SHMIPC__SF_ABORT_PROTOCOL);
}

static void req_timer(struct shmipc__timer *timer)
{
    struct freq *r = timer->data;
    if (r->state == RQ_WS) {
        shmipc__front_ws_timer(r);
        return;
    }
    if (r->state == RQ_ACTIVE) {
        if (r->uploading) { /* a flush, or what the session could not take before */
            int rc = upload_push(r, 1);
            if (rc < 0)
                shmipc__front_fs_down(r->fs, rc);
            if (rc != 0)
                return;
        }
        /* A held-back stream may read again (stream_drained). */
        shmipc__front_req_read(r);
        return;
    }
    if (r->state == RQ_SENDING) {
        int rc = shmipc__front_req_send(r);
        if (rc < 0)
            shmipc__front_fs_down(r->fs, rc);
        return;
    }
    if (r->state != RQ_DRAINING)
        return;
    if (shmipc__loop_now_ms(r->t->loop) >= r->drain_until) {
        drain_ran_out(r);
        req_finish(r);
        return;
    }
    if (r->abort_reason != 0) {
        int rc = send_abort(r, r->abort_reason);
        if (rc < 0) {
            shmipc__front_fs_down(r->fs, rc);
            return;
        }
        r->abort_reason = rc == 1 ? r->abort_reason : 0;
    }
    uint64_t now = shmipc__loop_now_ms(r->t->loop);
    uint64_t wait = now < r->drain_until ? r->drain_until - now : 0;
    if (r->abort_reason != 0) {
        /* The session is full: a worker that reads nothing frees nothing, so the retries back
         * off (1, 2, 4 ... 64 ms) rather than wake the loop every millisecond of the drain. */
        uint64_t backoff = (uint64_t)RETRY_MS << (r->abort_tries < 6 ? r->abort_tries : 6);
        r->abort_tries++;
        atomic_fetch_add(&r->t->f->abort_retries, 1);
        if (backoff > ABORT_BACKOFF_MAX_MS)
            backoff = ABORT_BACKOFF_MAX_MS;
        wait = backoff < wait ? backoff : wait; /* and never past the drain's end */
    }
    shmipc__timer_start(timer, wait);
    shmipc__front_req_drain(r);
}

/* The server ends the deferral: the client left, the deadline passed, the handler failed. */
static void on_cancel(void *data, int reason)
{
    struct freq *r = data;
    struct fthread *t = r->t;
    struct shmipc__front *f = t->f;
    r->live = 0;
    /* Streaming: the head went out, the body is cut (the line says the head's status and what
     * was sent). Else what the server answers now: 504 or 500, or nothing when the client left
     * (nginx's 499). */
    if (r->streaming)
        stream_log(r, shmipc__server_stream_sent(r->ticket));
    int status = reason == SHMIPC__SERVER_CANCEL_TIMEOUT       ? 504
                 : reason == SHMIPC__SERVER_CANCEL_CLIENT_GONE ? 499
                 : reason == SHMIPC__SERVER_CANCEL_TOO_LARGE   ? 413
                 : reason == SHMIPC__SERVER_CANCEL_BAD_BODY    ? 400
                                                               : 500;
    req_log(r, (unsigned)status, status == 499 ? 0 : server_body_len(status));
    if (reason == SHMIPC__SERVER_CANCEL_TIMEOUT)
        atomic_fetch_add(&f->timeouts, 1);
    else if (reason == SHMIPC__SERVER_CANCEL_CLIENT_GONE)
        atomic_fetch_add(&f->client_gone, 1);
    if (r->state == RQ_QUEUED) {
        req_unqueue(r);
        shmipc__front_req_free(r);
        return;
    }
    if (r->state == RQ_BODY) { /* a small body still coming: nothing went anywhere */
        shmipc__front_req_free(r);
        return;
    }
    if (r->state == RQ_SENDING) { /* nothing reached the worker */
        req_finish(r);
        return;
    }
    /* A body over the limit is TOO_LARGE; one whose framing broke (400) ends the request as a
     * client gone would: the worker sees no more of it. */
    if (r->state == RQ_ACTIVE)
        req_abort(r, 0,
                  reason == SHMIPC__SERVER_CANCEL_TIMEOUT     ? SHMIPC__SF_ABORT_TIMEOUT
                  : reason == SHMIPC__SERVER_CANCEL_TOO_LARGE ? SHMIPC__SF_ABORT_TOO_LARGE
                                                              : SHMIPC__SF_ABORT_CLIENT_GONE);
}

/* ---- the route handler ---- */

/*
 * Claims a free worker and sends the request to it, or queues it (its body copied) behind
 * this thread's waiting requests. 0, or 503 when the wait queue is full or memory is short
 * (the request is then on no queue and no worker).
 */
static int dispatch(struct freq *r)
{
    struct fthread *t = r->t;
    struct shmipc__front *f = t->f;
    struct fsess *fs = t->qhead == NULL ? shmipc__front_claim(t, r) : NULL;
    if (fs != NULL) {
        r->state = RQ_ACTIVE;
        shmipc__front_fs_attach(fs, r);
        int rc = shmipc__front_req_send(r);
        if (rc < 0 && shmipc__front_requeue_head(t, r, rc) < 0)
            return 503;
        return 0;
    }
    if (atomic_fetch_add(&f->queued, 1) >= f->queue_max) {
        atomic_fetch_sub(&f->queued, 1);
        atomic_fetch_add(&f->rejected, 1);
        return 503;
    }
    if (shmipc__front_req_own_body(r) < 0) {
        atomic_fetch_sub(&f->queued, 1);
        return 503;
    }
    r->state = RQ_QUEUED;
    if (t->qtail != NULL)
        t->qtail->next = r;
    else
        t->qhead = r;
    t->qtail = r;
    atomic_fetch_add(&t->nwait, 1);
    /* A worker freed by another thread before nwait went up is found by this shmipc__front_pump. */
    shmipc__front_kick(t);
    return 0;
}

/* RQ_BODY: the next piece of a small body, copied (it fits: the server holds it to its
 * Content-Length). */
static int on_small_body(void *data, const void *piece, size_t len)
{
    struct freq *r = data;
    if (r->state != RQ_BODY || len > r->body_cap - r->body_len)
        return 1; /* cannot happen */
    memcpy(r->body_copy + r->body_len, piece, len);
    r->body_len += len;
    return 0;
}

/* RQ_BODY: the small body is whole: the request goes to a worker (or waits for one). */
static void on_small_end(void *data)
{
    static const char busy[] = "Service Unavailable\n";
    static const struct shmipc__http_header_out retry = {"Retry-After", "1", 11, 1};
    struct freq *r = data;
    if (r->state != RQ_BODY)
        return;
    gather_done(r); /* whole: the memory is the request's, as any body that came whole */
    if (dispatch(r) == 0)
        return;
    /* The wait queue is full: 503, as for a request without a body. */
    r->live = 0;
    req_log(r, 503, sizeof busy - 1);
    (void)shmipc__server_complete(r->ticket, 503, "text/plain", &retry, 1, busy, sizeof busy - 1,
                                  NULL, NULL);
    shmipc__front_req_free(r);
}

static void sf_addr(const struct sockaddr_storage *ss, struct shmipc__sf_addr *out)
{
    memset(out, 0, sizeof *out);
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        out->family = SHMIPC__SF_AF_INET;
        out->port = ntohs(a->sin_port);
        memcpy(out->addr, &a->sin_addr, 4);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        out->family = SHMIPC__SF_AF_INET6;
        out->port = ntohs(a->sin6_port);
        memcpy(out->addr, &a->sin6_addr, 16);
    } else if (ss->ss_family == AF_UNIX) {
        out->family = SHMIPC__SF_AF_UNIX;
    }
}

/* The request as the access log takes it, before any answer (on the handler's stack). */
struct lcap {
    int on;
    shmipc__access_entry e;
    uint64_t t0_us;
    char remote[INET6_ADDRSTRLEN];
};

/* The first field named `name` (the referer, the user agent). */
static void find_field(const struct shmipc__http_request *hr, const char *name, const char **v,
                       size_t *len)
{
    size_t n = strlen(name);
    for (uint32_t i = 0; i < hr->nfields; i++) {
        const struct shmipc__http_field *fd = &hr->fields[i];
        if (fd->name.len == n && strncasecmp(hr->base + fd->name.off, name, n) == 0) {
            *v = hr->base + fd->value.off;
            *len = fd->value.len;
            return;
        }
    }
}

static void log_capture(struct lcap *c, const shmipc_http_request *req,
                        const struct sockaddr_storage *peer)
{
    const struct shmipc__http_request *hr = req->r;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    memset(&c->e, 0, sizeof c->e);
    c->on = 1;
    c->t0_us = mono_us();
    c->e.time_sec = (int64_t)now.tv_sec;
    c->e.time_nsec = now.tv_nsec;
    c->e.version_minor = hr->minor;
    c->e.method = hr->base + hr->name.off;
    c->e.method_len = hr->name.len;
    c->e.target = hr->base + hr->target.off;
    c->e.target_len = hr->target.len;
    find_field(hr, "Referer", &c->e.referer, &c->e.referer_len);
    find_field(hr, "User-Agent", &c->e.user_agent, &c->e.user_agent_len);
    const void *a = NULL;
    if (peer->ss_family == AF_INET)
        a = &((const struct sockaddr_in *)peer)->sin_addr;
    else if (peer->ss_family == AF_INET6)
        a = &((const struct sockaddr_in6 *)peer)->sin6_addr;
    if (a != NULL && inet_ntop(peer->ss_family, a, c->remote, sizeof c->remote) != NULL)
        c->e.remote = c->remote;
    else if (peer->ss_family == AF_UNIX)
        c->e.remote = "unix:";
    c->e.remote_len = c->e.remote != NULL ? strlen(c->e.remote) : 0;
}

/* The entry's strings into the request's own copy (one allocation). */
static int log_keep(struct freq *r, const struct lcap *c)
{
    const shmipc__access_entry *e = &c->e;
    size_t n = e->remote_len + e->method_len + e->target_len + e->referer_len + e->user_agent_len;
    if ((r->le_blob = malloc(n + 1)) == NULL)
        return -1;
    r->le = *e;
    char *p = r->le_blob;
#define KEEP(field)                                                                                \
    if (e->field != NULL) {                                                                        \
        memcpy(p, e->field, e->field##_len);                                                       \
        r->le.field = p;                                                                           \
        p += e->field##_len;                                                                       \
    }
    KEEP(remote)
    KEEP(method)
    KEEP(target)
    KEEP(referer)
    KEEP(user_agent)
#undef KEEP
    r->le_t0_us = c->t0_us;
    return 0;
}

static int direct(struct fthread *t, struct lcap *lc, const shmipc_http_request *req,
                  shmipc_http_response *res, int status, const char *retry_after)
{
    static const char *const text[] = {"Bad Gateway\n", "Service Unavailable\n",
                                       "Request Header Fields Too Large\n",
                                       "Internal Server Error\n", "URI Too Long\n"};
    const char *b = status == 502   ? text[0]
                    : status == 503 ? text[1]
                    : status == 431 ? text[2]
                    : status == 414 ? text[4]
                                    : text[3];
    if (t != NULL && lc != NULL && lc->on)
        log_line(
            t, &lc->e, lc->t0_us, (unsigned)status,
            body_sent((req->r->flags & SHMIPC__HTTP_IS_HEAD) != 0, (unsigned)status, strlen(b)),
            NULL);
    res->r->status = (uint16_t)status;
    if (retry_after != NULL &&
        shmipc__http_response_add_header(res, "Retry-After", retry_after) < 0)
        return -1;
    if (shmipc__http_response_add_header(res, "Content-Type", "text/plain") < 0)
        return -1;
    return shmipc__http_response_body(res, b, strlen(b), NULL, NULL, 0);
}

int shmipc__front_handler(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    struct shmipc__front *f = ud;
    struct shmipc__server_where where;
    struct shmipc__sf_addr peer, local;
    struct freq *r;
    struct fthread *t;
    struct lcap lc;
    long n;
    int rc;
    /* The deadline in force now, at the head (set_deadline may change it meanwhile:
     * the worker can have the request before it is deferred below). */
    uint32_t deadline = atomic_load(&f->deadline_ms);

    if (shmipc__server_where(res, &where) < 0 || where.index >= MAX_THREADS ||
        (t = f->threads[where.index]) == NULL)
        return direct(NULL, NULL, req, res, 500, NULL);
    int up = shmipc__ws_is_upgrade(req->r);
    if (up && shmipc__front_ws_refuse(req, res)) /* not a valid handshake: its 400 or 426 */
        return 0;
    shmipc__front_refresh(t, 0);
    sf_addr(where.peer, &peer); /* the connection's, asked once per connection */
    sf_addr(where.local, &local);
    lc.on = 0;
    if (f->alog != NULL)
        log_capture(&lc, req, where.peer);
    n = shmipc__sf_encode_http_request(t->scratch, SCRATCH, req->r, &peer, &local,
                                       up ? SHMIPC__SF_REQ_UPGRADE : 0);
    /* Over the protocol's limits (docs/serve.md, "Limits"): the target's is 414's, the rest
     * of the head's 431's. */
    if (n < 0)
        return direct(t, &lc, req, res,
                      n != SHMIPC_EMSGSIZE                         ? 500
                      : req->r->target.len > SHMIPC__SF_MAX_TARGET ? 414
                                                                   : 431,
                      NULL);
    if ((r = calloc(1, sizeof *r)) == NULL || (r->out = malloc((size_t)n)) == NULL ||
        (lc.on && log_keep(r, &lc) < 0)) {
        if (r != NULL)
            free(r->out);
        free(r);
        return direct(t, &lc, req, res, 503, "1");
    }
    memcpy(r->out, t->scratch, (size_t)n);
    r->out_len = (size_t)n;
    r->t = t;
    r->is_head = (req->r->flags & SHMIPC__HTTP_IS_HEAD) != 0;
    r->ws = (uint8_t)up;
    r->body = req->body;
    r->body_len = req->body_len;
    shmipc__timer_init(t->loop, &r->timer, req_timer, r);
    /* At the head of a request with a body (the route runs at head): the body streams. */
    r->uploading = req->body == NULL && req->body_len == 0 &&
                   (req->r->body_kind == SHMIPC__HTTP_BODY_CHUNKED ||
                    (req->r->body_kind == SHMIPC__HTTP_BODY_LENGTH && req->r->content_length > 0));
    /* A small sized body is gathered first (RQ_BODY), then sent whole, as one message, and
     * kept for a resend; a larger or chunked one streams to a worker claimed now. */
    int gather = r->uploading && req->r->body_kind == SHMIPC__HTTP_BODY_LENGTH &&
                 req->r->content_length <= SHMIPC__FRONT_RETRY_BODY &&
                 gather_take(f, req->r->content_length);
    if (gather) {
        r->uploading = 0;
        r->state = RQ_BODY;
        r->gathering = 1;
        r->body_cap = (size_t)req->r->content_length;
        if ((r->body_copy = malloc(r->body_cap)) == NULL) {
            shmipc__front_req_free(r);
            return direct(t, &lc, req, res, 503, "1");
        }
        r->body = r->body_copy;
    }

    if (!gather && (rc = dispatch(r)) != 0) {
        shmipc__front_req_free(r);
        return direct(t, &lc, req, res, rc, "1");
    }
    /* An upgrade has no body (ws_refuse answered one that had: 400). */
    if (up) {
        rc = shmipc__server_ws_defer(res, req, deadline, on_cancel, r, &r->ticket);
    } else {
        rc = shmipc__server_defer(res, deadline, on_cancel, r, &r->ticket);
        if (rc == 0 && gather)
            rc = shmipc__server_upload(res, on_small_body, on_small_end, r);
        else if (rc == 0 && r->uploading &&
                 (rc = shmipc__server_upload(res, on_body, on_body_end, r)) == 0)
            atomic_fetch_add(&f->uploads, 1);
    }
    if (rc < 0) { /* cannot happen in a route handler; the request is given up */
        on_cancel(r, SHMIPC__SERVER_CANCEL_ERROR); /* logs its 500 */
        return direct(t, NULL, req, res, 500, NULL);
    }
    r->live = 1;
    return 0;
}

/* For front_ws.c: the same ends as an HTTP exchange's. */
void shmipc__front_req_abort(struct freq *r, int status, uint32_t reason)
{
    req_abort(r, status, reason);
}

void shmipc__front_req_finish(struct freq *r)
{
    req_finish(r);
}

/* A WebSocket's access log line, at its end: 101 (nginx logs a WebSocket when it ends). */
void shmipc__front_req_log_ws(struct freq *r)
{
    req_log(r, 101, 0);
}
