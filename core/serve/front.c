/*
 * The front's dispatch to application workers: see front.h and docs/serve.md, "The front".
 *
 * Per reactor thread (struct fthread): a session to every application worker (struct fsess,
 * watched in the thread's loop), a FIFO of requests waiting for a worker, an eventfd other
 * threads write when they free a worker this thread may want, and a "kick" timer that runs
 * the FIFO from the loop (never from inside a route handler or a cancel callback, where the
 * server must not be called back).
 *
 * A request (struct freq) is QUEUED, SENDING (a worker claimed, its session's queue full: the
 * flush is retried on a 1 ms timer rather than waiting inside the loop), ACTIVE (sent; the
 * response is read as the session becomes readable) or DRAINING (the front sent ABORT, or the
 * client's deferral ended: what the worker still sends is discarded until its stream ends).
 * The worker's busy flag is held from the claim until the request is freed.
 */
#include "serve/front.h"

#include "common/error.h"
#include "common/log.h"
#include "ipc/config.h"
#include "ipc/session.h"
#include "net/http_parser.h"
#include "net/serve_frame.h"
#include "net/server.h"
#include "reactor/loop.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_THREADS 1024u /* shmipc__workers_default()'s limit */
#define RETRY_MS    1u    /* a full session queue is retried this often */
#define SCRATCH     (SHMIPC__SF_HDR_SIZE + SHMIPC__SF_MAX_HEAD)

struct fworker {
    struct fworker *next; /* every worker the front ever had: freed with the front */
    char addr[SHMIPC__FRONT_MAX_ADDRESS + 1];
    atomic_int busy;        /* claimed by one request */
    atomic_uint sessions;   /* threads with a live session to it */
    atomic_int current;     /* in the current set */
    atomic_ullong served;   /* responses relayed */
    atomic_ullong failures; /* 502s */
};

struct fthread;
struct freq;

struct fsess {
    struct fthread *t;
    struct fworker *w;
    shmipc_session *s; /* NULL while down */
    struct shmipc__watch *watch;
    struct freq *active; /* the request it serves, holding w->busy */
    int retired;         /* w left the set: closed once idle */
    uint32_t backoff_ms;
    struct shmipc__timer timer; /* reconnect */
};

struct fthread {
    struct shmipc__front *f;
    unsigned index;
    struct shmipc__loop *loop;
    int efd;
    struct shmipc__watch *ewatch;
    struct shmipc__timer kick;
    unsigned gen;
    struct fsess **sess;
    unsigned nsess, cap, rr;
    struct freq *qhead, *qtail;
    atomic_uint nwait;
    uint8_t *scratch;
};

enum { RQ_QUEUED = 1, RQ_SENDING, RQ_ACTIVE, RQ_DRAINING };

struct freq {
    struct freq *next;
    struct fthread *t;
    struct fsess *fs;
    shmipc_stream *st;
    struct shmipc__server_ticket ticket;
    uint8_t live; /* the deferral is ours to answer */
    uint8_t state;
    uint8_t have_hdr, got_head;
    uint8_t is_head;       /* a HEAD request: the worker sends no body, whatever its length says */
    uint32_t abort_reason; /* an ABORT still to send, 0: none */
    uint64_t drain_until;  /* loop ms */
    uint8_t hdr[SHMIPC__SF_HDR_SIZE];
    struct shmipc__sf_frame fh;
    uint8_t *head; /* the RESPONSE_HEAD frame */
    size_t head_len;
    uint8_t *out; /* the REQUEST_HEAD frame */
    size_t out_len;
    const char *body;
    size_t body_len;
    char *body_copy; /* a queued request's body (the server's buffer is gone by then) */
    uint8_t *rbody;
    size_t rlen, rcap;
    struct shmipc__timer timer;
};

struct shmipc__front {
    uint32_t queue_max, deadline_ms, connect_ms;
    uint64_t max_response;
    shmipc_config *ipc;
    struct shmipc_server *srv;
    pthread_mutex_t mu; /* all, set, nset, threads[] (for nudges) */
    struct fworker *all;
    struct fworker *set[SHMIPC__FRONT_MAX_WORKERS];
    unsigned nset;
    atomic_uint gen;
    atomic_uint queued;
    atomic_ullong rejected, timeouts, client_gone;
    struct fthread *threads[MAX_THREADS];
};

static void fs_down(struct fsess *fs, int rc);
static void pump(struct fthread *t);
static void req_drain(struct freq *r);

/* ---- small helpers ---- */

static void kick(struct fthread *t)
{
    if (!shmipc__timer_active(&t->kick) && shmipc__timer_start(&t->kick, 0) < 0)
        SHMIPC__LOG(SHMIPC__LOG_ERROR, "front: cannot start a timer: %s", shmipc__detail());
}

static void req_free(struct freq *r)
{
    shmipc__timer_stop(&r->timer);
    if (r->st != NULL)
        shmipc__stream_close_handle(r->st);
    free(r->head);
    free(r->out);
    free(r->body_copy);
    free(r->rbody);
    free(r);
}

/*
 * The worker is free again: the request is done with it. Other threads' waiting requests are
 * told through their eventfds when this thread has fewer waiting than all threads together.
 */
static void release_worker(struct fthread *t, struct fsess *fs)
{
    struct shmipc__front *f = t->f;
    fs->active = NULL;
    atomic_store(&fs->w->busy, 0);
    kick(t);
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
static void req_done(struct freq *r)
{
    struct fsess *fs = r->fs;
    if (fs != NULL && fs->active == r)
        release_worker(r->t, fs);
    req_free(r);
}

/* As req_done(), and a retired session closes once idle. Not from fs_down(). */
static void req_finish(struct freq *r)
{
    struct fsess *fs = r->fs;
    req_done(r);
    if (fs != NULL && fs->retired && fs->active == NULL && fs->s != NULL)
        fs_down(fs, 0);
}

/* Answers the client with a canned status (502, 500, ...) when the deferral is still ours. */
static void answer_status(struct freq *r, int status)
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
    int rc = shmipc__stream_write(r->st, h, sizeof h);
    if (rc == 0)
        rc = shmipc__stream_flush(r->st);
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
        answer_status(r, status);
    r->live = 0;
    r->state = RQ_DRAINING;
    r->drain_until = shmipc__loop_now_ms(r->t->loop) + SHMIPC__FRONT_DRAIN_MS;
    int rc = send_abort(r, reason);
    if (rc < 0) {
        fs_down(r->fs, rc);
        return;
    }
    r->abort_reason = rc == 1 ? reason : 0;
    shmipc__timer_start(&r->timer, r->abort_reason ? RETRY_MS : SHMIPC__FRONT_DRAIN_MS);
    /* What is here already, the worker's close included, brings no new readiness: read it
     * now, or a worker that closed at once would stay busy for the whole drain. */
    req_drain(r);
}

/* ---- sending a request ---- */

static int write_frame_hdr(shmipc_stream *st, unsigned type, size_t len)
{
    uint8_t h[SHMIPC__SF_HDR_SIZE];
    int rc = shmipc__sf_encode_header(h, type, len, 0);
    return rc < 0 ? rc : shmipc__stream_write(st, h, sizeof h);
}

/*
 * Sends the whole request as one message: REQUEST_HEAD, the body in BODY frames of at most
 * 1 MiB, END. With the session's queue full it waits on the request's timer (SENDING).
 */
static int req_send(struct freq *r)
{
    struct fsess *fs = r->fs;
    int rc = 0;
    if (r->st == NULL && (rc = shmipc__session_open_stream(fs->s, &r->st)) < 0)
        return rc;
    if (!shmipc__session_can_send(fs->s)) {
        /* The server's copy of the body is gone once the handler returned. */
        if (r->body_len > 0 && r->body_copy == NULL) {
            if ((r->body_copy = malloc(r->body_len)) == NULL)
                return shmipc__fail(SHMIPC_ENOMEM, "front: a body copy");
            memcpy(r->body_copy, r->body, r->body_len);
            r->body = r->body_copy;
        }
        r->state = RQ_SENDING;
        return shmipc__timer_start(&r->timer, RETRY_MS);
    }
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
    if (rc == 0)
        rc = shmipc__stream_flush(r->st);
    if (rc < 0)
        return rc;
    r->state = RQ_ACTIVE;
    free(r->out);
    r->out = NULL;
    free(r->body_copy);
    r->body_copy = NULL;
    r->body = NULL;
    r->body_len = 0;
    return 0;
}

/* ---- reading the response ---- */

static int hdr_is(const struct shmipc__sf_field *fd, const char *name)
{
    size_t n = strlen(name);
    return fd->name_len == n && strncasecmp((const char *)fd->name, name, n) == 0;
}

/* The worker's END: the response goes to the client. */
static void req_answer(struct freq *r)
{
    struct shmipc__sf_frame fr;
    struct shmipc__http_header_out h[SHMIPC__SERVER_MAX_RESP_HEADERS + 1];
    struct shmipc__sf_field fd;
    char *ctype = NULL;
    uint32_t n = 0;
    int rc = SHMIPC_EPROTO;

    if (shmipc__sf_decode(r->head, r->head_len, &fr) <= 0)
        goto bad;
    /* The body must add up to the worker's own length, but for HEAD, 204 and 304, which
     * carry none. */
    if ((fr.u.resp.flags & SHMIPC__SF_RESP_CONTENT_LENGTH) && !r->is_head &&
        fr.u.resp.status != 204 && fr.u.resp.status != 304 && fr.u.resp.content_length != r->rlen)
        goto bad;
    struct shmipc__sf_fields it = fr.u.resp.fields;
    while (shmipc__sf_fields_next(&it, &fd)) {
        /* The framing fields are the front's (docs/serve.md, "RESPONSE_HEAD"). */
        if (hdr_is(&fd, "Content-Length") || hdr_is(&fd, "Transfer-Encoding") ||
            hdr_is(&fd, "Connection") || hdr_is(&fd, "Date") || hdr_is(&fd, "Server") ||
            hdr_is(&fd, "Keep-Alive"))
            continue;
        if (hdr_is(&fd, "Content-Type")) {
            if (ctype != NULL)
                continue;
            if ((ctype = malloc(fd.value_len + 1u)) == NULL)
                goto bad;
            memcpy(ctype, fd.value, fd.value_len);
            ctype[fd.value_len] = '\0';
            continue;
        }
        if (n == SHMIPC__SERVER_MAX_RESP_HEADERS)
            goto bad; /* more than the server takes from a handler */
        h[n++] = (struct shmipc__http_header_out){(const char *)fd.name, (const char *)fd.value,
                                                  fd.name_len, fd.value_len};
    }
    if (fr.u.resp.flags & SHMIPC__SF_RESP_CLOSE) {
        if (n == SHMIPC__SERVER_MAX_RESP_HEADERS)
            goto bad;
        h[n++] = (struct shmipc__http_header_out){"Connection", "close", 10, 5};
    }
    uint8_t *body = r->rbody;
    size_t len = r->rlen;
    r->rbody = NULL;
    r->live = 0;
    /* Counted first: the client may see the answer before complete() returns. */
    atomic_fetch_add(&r->fs->w->served, 1);
    rc = shmipc__server_complete(r->ticket, fr.u.resp.status, ctype, h, n, body, len,
                                 body != NULL ? free : NULL, body);
    free(ctype);
    if (rc == SHMIPC_EINVAL) {
        /* A field the server refuses (a control byte in a value, a status it does not send). */
        atomic_fetch_sub(&r->fs->w->served, 1);
        r->live = 1;
        answer_status(r, 502);
        return;
    }
    return;
bad:
    free(ctype);
    (void)rc;
    answer_status(r, 502);
}

/* Appends a BODY payload; 0, or 1 when the response is over max_response. */
static int body_append(struct freq *r, const void *p, size_t n)
{
    if (r->rlen + n > r->t->f->max_response)
        return 1;
    if (r->rlen + n > r->rcap) {
        size_t cap = r->rcap ? r->rcap : 4096;
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
    return 0;
}

/* DRAINING: drop what comes until the worker's stream ends. */
static void req_drain(struct freq *r)
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
static void req_read(struct freq *r)
{
    for (;;) {
        const void *p;
        int rc;
        if (!r->have_hdr) {
            rc = shmipc__stream_read_exact(r->st, SHMIPC__SF_HDR_SIZE, &p, SHMIPC_NONBLOCK);
            if (rc == SHMIPC_EAGAIN)
                return;
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
        if (len > 0) {
            rc = shmipc__stream_read_exact(r->st, len, &p, SHMIPC_NONBLOCK);
            if (rc == SHMIPC_EAGAIN)
                return;
            if (rc < 0)
                goto ended;
        }
        r->have_hdr = 0;
        switch (r->fh.type) {
        case SHMIPC__SF_RESPONSE_HEAD: {
            struct shmipc__sf_frame fr;
            uint8_t *copy = malloc(SHMIPC__SF_HDR_SIZE + (size_t)len);
            if (copy == NULL)
                goto protocol;
            memcpy(copy, r->hdr, SHMIPC__SF_HDR_SIZE);
            memcpy(copy + SHMIPC__SF_HDR_SIZE, p, len);
            shmipc__stream_release(r->st);
            if (r->got_head ||
                shmipc__sf_decode(copy, SHMIPC__SF_HDR_SIZE + (size_t)len, &fr) <= 0 ||
                fr.u.resp.status == 101) { /* a 101 answers no upgrade the front sent */
                free(copy);
                goto protocol;
            }
            if (fr.u.resp.status < 200) { /* interim: the final head follows */
                free(copy);
                break;
            }
            r->head = copy;
            r->head_len = SHMIPC__SF_HDR_SIZE + (size_t)len;
            r->got_head = 1;
            break;
        }
        case SHMIPC__SF_BODY:
            if (!r->got_head) {
                shmipc__stream_release(r->st);
                goto protocol;
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
            req_answer(r);
            req_finish(r);
            return;
        case SHMIPC__SF_ABORT: {
            uint32_t why = r->fh.arg;
            shmipc__stream_release(r->st);
            /* The worker ended the exchange: nothing more comes, its close follows. */
            answer_status(r, why == SHMIPC__SF_ABORT_WORKER_ERROR ? 500
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
ended:
    /* The stream or the session ended mid-request. */
    if (shmipc__session_status(r->fs->s) < 0) {
        fs_down(r->fs, shmipc__session_status(r->fs->s));
        return;
    }
    answer_status(r, 502);
    req_finish(r);
    return;
protocol:
    req_abort(r, 502, SHMIPC__SF_ABORT_PROTOCOL);
}

static void req_timer(struct shmipc__timer *timer)
{
    struct freq *r = timer->data;
    if (r->state == RQ_SENDING) {
        int rc = req_send(r);
        if (rc < 0)
            fs_down(r->fs, rc);
        return;
    }
    if (r->state != RQ_DRAINING)
        return;
    if (shmipc__loop_now_ms(r->t->loop) >= r->drain_until) {
        req_finish(r);
        return;
    }
    if (r->abort_reason != 0) {
        int rc = send_abort(r, r->abort_reason);
        if (rc < 0) {
            fs_down(r->fs, rc);
            return;
        }
        r->abort_reason = rc == 1 ? r->abort_reason : 0;
    }
    uint64_t now = shmipc__loop_now_ms(r->t->loop);
    shmipc__timer_start(timer, r->abort_reason ? RETRY_MS : r->drain_until - now);
    req_drain(r);
}

/* The server ends the deferral: the client left, the deadline passed, the handler failed. */
static void on_cancel(void *data, int reason)
{
    struct freq *r = data;
    struct fthread *t = r->t;
    struct shmipc__front *f = t->f;
    r->live = 0;
    if (reason == SHMIPC__SERVER_CANCEL_TIMEOUT)
        atomic_fetch_add(&f->timeouts, 1);
    else if (reason == SHMIPC__SERVER_CANCEL_CLIENT_GONE)
        atomic_fetch_add(&f->client_gone, 1);
    if (r->state == RQ_QUEUED) {
        struct freq **pp = &t->qhead, *prev = NULL;
        while (*pp != r) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        *pp = r->next;
        if (t->qtail == r)
            t->qtail = prev;
        atomic_fetch_sub(&t->nwait, 1);
        atomic_fetch_sub(&f->queued, 1);
        req_free(r);
        return;
    }
    if (r->state == RQ_SENDING) { /* nothing reached the worker */
        req_finish(r);
        return;
    }
    if (r->state == RQ_ACTIVE)
        req_abort(r, 0,
                  reason == SHMIPC__SERVER_CANCEL_TIMEOUT ? SHMIPC__SF_ABORT_TIMEOUT
                                                          : SHMIPC__SF_ABORT_CLIENT_GONE);
}

/* ---- sessions ---- */

static void fs_ready(struct shmipc__watch *watch, int fd, unsigned events, void *data)
{
    struct fsess *fs = data;
    int rc;
    (void)watch;
    (void)fd;
    (void)events;
    while ((rc = shmipc__session_process(fs->s)) > 0) {
    }
    if (rc < 0) {
        fs_down(fs, rc);
        return;
    }
    struct freq *r = fs->active;
    if (r == NULL)
        return;
    if (r->state == RQ_ACTIVE)
        req_read(r);
    else if (r->state == RQ_DRAINING)
        req_drain(r);
}

static void fs_unlink(struct fsess *fs)
{
    struct fthread *t = fs->t;
    for (unsigned i = 0; i < t->nsess; i++) {
        if (t->sess[i] == fs) {
            t->sess[i] = t->sess[--t->nsess];
            break;
        }
    }
    shmipc__timer_stop(&fs->timer);
    free(fs);
}

static void fs_connect(struct fsess *fs)
{
    struct fthread *t = fs->t;
    shmipc_session *s = NULL;
    int rc = shmipc__session_connect(fs->w->addr, t->f->ipc, &s);
    if (rc == 0)
        rc = shmipc__watch_new(t->loop, shmipc__session_fileno(s), SHMIPC__WATCH_READ, fs_ready, fs,
                               &fs->watch);
    if (rc < 0) {
        if (s != NULL)
            shmipc__session_close(s);
        fs->backoff_ms = fs->backoff_ms == 0 ? SHMIPC__FRONT_BACKOFF_MIN_MS : fs->backoff_ms * 2;
        if (fs->backoff_ms > SHMIPC__FRONT_BACKOFF_MAX_MS)
            fs->backoff_ms = SHMIPC__FRONT_BACKOFF_MAX_MS;
        SHMIPC__LOG(SHMIPC__LOG_DEBUG, "front: worker %s: %s; again in %u ms", fs->w->addr,
                    shmipc__errname(rc), fs->backoff_ms);
        shmipc__timer_start(&fs->timer, fs->backoff_ms);
        return;
    }
    fs->s = s;
    fs->backoff_ms = 0;
    atomic_fetch_add(&fs->w->sessions, 1);
    kick(t);
}

static void fs_timer(struct shmipc__timer *timer)
{
    struct fsess *fs = timer->data;
    if (fs->s == NULL && !fs->retired)
        fs_connect(fs);
}

/*
 * The session ended (rc < 0), or a retired one closes (rc 0): its request is answered 502,
 * the worker freed; it reconnects after the back-off unless retired.
 */
static void fs_down(struct fsess *fs, int rc)
{
    struct freq *r = fs->active;
    if (r != NULL) {
        answer_status(r, 502);
        req_done(r);
    }
    if (fs->s == NULL)
        return;
    if (rc < 0)
        SHMIPC__LOG(SHMIPC__LOG_WARN, "front: worker %s: session ended (%s)", fs->w->addr,
                    shmipc__errname(rc));
    shmipc__watch_free(fs->watch);
    fs->watch = NULL;
    shmipc__session_close(fs->s);
    fs->s = NULL;
    atomic_fetch_sub(&fs->w->sessions, 1);
    if (fs->retired) {
        fs_unlink(fs);
        return;
    }
    fs->backoff_ms = fs->backoff_ms == 0 ? SHMIPC__FRONT_BACKOFF_MIN_MS : fs->backoff_ms;
    shmipc__timer_start(&fs->timer, fs->backoff_ms);
}

/* Takes up a new set of workers (set_workers) when the generation moved. */
static void refresh(struct fthread *t, int connect_now)
{
    struct shmipc__front *f = t->f;
    struct fworker *set[SHMIPC__FRONT_MAX_WORKERS] = {NULL};
    unsigned n;
    if (atomic_load(&f->gen) == t->gen)
        return;
    pthread_mutex_lock(&f->mu);
    n = f->nset;
    memcpy(set, f->set, n * sizeof set[0]);
    t->gen = atomic_load(&f->gen);
    pthread_mutex_unlock(&f->mu);
    for (unsigned i = 0; i < t->nsess; i++) {
        struct fsess *fs = t->sess[i];
        fs->retired = 1;
        for (unsigned j = 0; j < n; j++)
            fs->retired &= fs->w != set[j];
    }
    for (unsigned j = 0; j < n; j++) {
        unsigned i = 0;
        while (i < t->nsess && t->sess[i]->w != set[j])
            i++;
        if (i < t->nsess)
            continue;
        if (t->nsess == t->cap) {
            unsigned cap = t->cap ? t->cap * 2 : 8;
            struct fsess **ns = realloc(t->sess, cap * sizeof *ns);
            if (ns == NULL)
                continue;
            t->sess = ns;
            t->cap = cap;
        }
        struct fsess *fs = calloc(1, sizeof *fs);
        if (fs == NULL)
            continue;
        fs->t = t;
        fs->w = set[j];
        shmipc__timer_init(t->loop, &fs->timer, fs_timer, fs);
        t->sess[t->nsess++] = fs;
        if (connect_now)
            fs_connect(fs);
        else
            shmipc__timer_start(&fs->timer, 0);
    }
    /* Retired sessions close now when idle, else when their request ends. */
    for (unsigned i = 0; i < t->nsess;) {
        struct fsess *fs = t->sess[i];
        if (fs->retired && fs->active == NULL) {
            if (fs->s != NULL)
                fs_down(fs, 0);
            else
                fs_unlink(fs);
            continue;
        }
        i++;
    }
}

/* A free worker this thread has a session to, claimed; NULL when none. */
static struct fsess *claim(struct fthread *t)
{
    for (unsigned k = 0; k < t->nsess; k++) {
        struct fsess *fs = t->sess[(t->rr + k) % t->nsess];
        int zero = 0;
        if (fs->s == NULL || fs->retired || fs->active != NULL)
            continue;
        if (atomic_compare_exchange_strong(&fs->w->busy, &zero, 1)) {
            t->rr = (t->rr + k + 1) % t->nsess;
            return fs;
        }
    }
    return NULL;
}

/*
 * The session failed under a request before its worker answered anything, as a worker that
 * died before the front noticed: nothing of it reached a live worker (a dead session's
 * messages are never read), so it goes back to the head of this thread's queue rather than
 * being answered 502, as nginx retries the next upstream when nothing was sent. The session
 * goes down. 0, or SHMIPC_ENOMEM (the body could not be kept).
 */
static int requeue_head(struct fthread *t, struct freq *r, int rc)
{
    struct fsess *fs = r->fs;
    fs->active = NULL;
    atomic_store(&fs->w->busy, 0);
    if (r->st != NULL) {
        shmipc__stream_close_handle(r->st);
        r->st = NULL;
    }
    r->fs = NULL;
    fs_down(fs, rc);
    if (r->body_len > 0 && r->body_copy == NULL) {
        if ((r->body_copy = malloc(r->body_len)) == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "front: a body copy");
        memcpy(r->body_copy, r->body, r->body_len);
        r->body = r->body_copy;
    }
    r->state = RQ_QUEUED;
    r->next = t->qhead;
    t->qhead = r;
    if (t->qtail == NULL)
        t->qtail = r;
    atomic_fetch_add(&t->nwait, 1);
    atomic_fetch_add(&t->f->queued, 1);
    kick(t);
    return 0;
}

/* Starts waiting requests while workers are free. From the loop only (it may answer 502). */
static void pump(struct fthread *t)
{
    struct shmipc__front *f = t->f;
    refresh(t, 0);
    while (t->qhead != NULL) {
        struct fsess *fs = claim(t);
        if (fs == NULL)
            return;
        struct freq *r = t->qhead;
        t->qhead = r->next;
        if (t->qhead == NULL)
            t->qtail = NULL;
        r->next = NULL;
        atomic_fetch_sub(&t->nwait, 1);
        atomic_fetch_sub(&f->queued, 1);
        r->fs = fs;
        fs->active = r;
        r->state = RQ_ACTIVE;
        int rc = req_send(r);
        if (rc < 0)
            (void)requeue_head(t, r, rc); /* the body is a copy already */
    }
}

static void on_kick(struct shmipc__timer *timer)
{
    pump(timer->data);
}

static void on_nudge(struct shmipc__watch *watch, int fd, unsigned events, void *data)
{
    uint64_t v;
    (void)watch;
    (void)events;
    while (read(fd, &v, sizeof v) > 0) {
    }
    pump(data);
}

/* ---- the route handler ---- */

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

static int direct(shmipc_http_response *res, int status, const char *retry_after)
{
    static const char *const text[] = {"Bad Gateway\n", "Service Unavailable\n",
                                       "Request Header Fields Too Large\n",
                                       "Internal Server Error\n", "URI Too Long\n"};
    const char *b = status == 502   ? text[0]
                    : status == 503 ? text[1]
                    : status == 431 ? text[2]
                    : status == 414 ? text[4]
                                    : text[3];
    res->r->status = (uint16_t)status;
    if (retry_after != NULL &&
        shmipc__http_response_add_header(res, "Retry-After", retry_after) < 0)
        return -1;
    if (shmipc__http_response_add_header(res, "Content-Type", "text/plain") < 0)
        return -1;
    return shmipc__http_response_body(res, b, strlen(b), NULL, NULL, 0);
}

static int front_handler(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    struct shmipc__front *f = ud;
    struct shmipc__server_where where;
    struct sockaddr_storage peer_ss, local_ss;
    struct shmipc__sf_addr peer, local;
    socklen_t sl;
    struct freq *r;
    struct fthread *t;
    long n;
    int rc;

    if (shmipc__server_where(res, &where) < 0 || where.index >= MAX_THREADS ||
        (t = f->threads[where.index]) == NULL)
        return direct(res, 500, NULL);
    refresh(t, 0);
    memset(&peer_ss, 0, sizeof peer_ss);
    memset(&local_ss, 0, sizeof local_ss);
    sl = sizeof peer_ss;
    if (getpeername(where.fd, (struct sockaddr *)&peer_ss, &sl) < 0)
        peer_ss.ss_family = AF_UNSPEC;
    sl = sizeof local_ss;
    if (getsockname(where.fd, (struct sockaddr *)&local_ss, &sl) < 0)
        local_ss.ss_family = AF_UNSPEC;
    sf_addr(&peer_ss, &peer);
    sf_addr(&local_ss, &local);
    n = shmipc__sf_encode_http_request(t->scratch, SCRATCH, req->r, &peer, &local, 0);
    /* Over the protocol's limits (docs/serve.md, "Limits"): the target's is 414's, the rest
     * of the head's 431's. */
    if (n < 0)
        return direct(res,
                      n != SHMIPC_EMSGSIZE                         ? 500
                      : req->r->target.len > SHMIPC__SF_MAX_TARGET ? 414
                                                                   : 431,
                      NULL);
    if ((r = calloc(1, sizeof *r)) == NULL || (r->out = malloc((size_t)n)) == NULL) {
        free(r);
        return direct(res, 503, "1");
    }
    memcpy(r->out, t->scratch, (size_t)n);
    r->out_len = (size_t)n;
    r->t = t;
    r->is_head = (req->r->flags & SHMIPC__HTTP_IS_HEAD) != 0;
    r->body = req->body;
    r->body_len = req->body_len;
    shmipc__timer_init(t->loop, &r->timer, req_timer, r);

    struct fsess *fs = t->qhead == NULL ? claim(t) : NULL;
    if (fs != NULL) {
        r->fs = fs;
        fs->active = r;
        r->state = RQ_ACTIVE;
        rc = req_send(r);
        if (rc < 0 && requeue_head(t, r, rc) < 0) {
            req_free(r);
            return direct(res, 503, "1");
        }
    } else {
        if (atomic_fetch_add(&f->queued, 1) >= f->queue_max) {
            atomic_fetch_sub(&f->queued, 1);
            atomic_fetch_add(&f->rejected, 1);
            req_free(r);
            return direct(res, 503, "1");
        }
        if (r->body_len > 0) {
            if ((r->body_copy = malloc(r->body_len)) == NULL) {
                atomic_fetch_sub(&f->queued, 1);
                req_free(r);
                return direct(res, 503, "1");
            }
            memcpy(r->body_copy, r->body, r->body_len);
            r->body = r->body_copy;
        }
        r->state = RQ_QUEUED;
        if (t->qtail != NULL)
            t->qtail->next = r;
        else
            t->qhead = r;
        t->qtail = r;
        atomic_fetch_add(&t->nwait, 1);
        /* A worker freed by another thread before nwait went up is found by this pump. */
        kick(t);
    }
    rc = shmipc__server_defer(res, f->deadline_ms, on_cancel, r, &r->ticket);
    if (rc < 0) { /* cannot happen in a route handler; the request is given up */
        on_cancel(r, SHMIPC__SERVER_CANCEL_ERROR);
        return direct(res, 500, NULL);
    }
    r->live = 1;
    return 0;
}

/* ---- the server's worker threads ---- */

static int thread_start(struct shmipc__loop *loop, unsigned index, unsigned nworkers, void *data)
{
    struct shmipc__front *f = data;
    struct fthread *t;
    int rc;
    (void)nworkers;
    if (index >= MAX_THREADS)
        return shmipc__fail(SHMIPC_EINVAL, "front: worker thread %u of at most %u", index,
                            MAX_THREADS);
    if ((t = calloc(1, sizeof *t)) == NULL || (t->scratch = malloc(SCRATCH)) == NULL) {
        if (t != NULL)
            free(t);
        return shmipc__fail(SHMIPC_ENOMEM, "front: thread state");
    }
    t->f = f;
    t->index = index;
    t->loop = loop;
    t->gen = atomic_load(&f->gen) - 1u;
    shmipc__timer_init(loop, &t->kick, on_kick, t);
    t->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->efd < 0) {
        rc = shmipc__fail_errno(errno, "front: eventfd");
        goto fail;
    }
    if ((rc = shmipc__watch_new(loop, t->efd, SHMIPC__WATCH_READ, on_nudge, t, &t->ewatch)) < 0)
        goto fail;
    pthread_mutex_lock(&f->mu);
    f->threads[index] = t;
    pthread_mutex_unlock(&f->mu);
    /* The loop serves nothing yet: the first connects may take their time here. */
    refresh(t, 1);
    return 0;
fail:
    if (t->efd >= 0)
        close(t->efd);
    free(t->scratch);
    free(t);
    return rc;
}

static int thread_end(struct shmipc__loop *loop, unsigned index, unsigned nworkers, void *data)
{
    struct shmipc__front *f = data;
    struct fthread *t = index < MAX_THREADS ? f->threads[index] : NULL;
    (void)loop;
    (void)nworkers;
    if (t == NULL)
        return 0;
    pthread_mutex_lock(&f->mu);
    f->threads[index] = NULL; /* no nudge writes its eventfd from now on */
    pthread_mutex_unlock(&f->mu);
    /* The server closed its connections: every deferral was cancelled, so nothing is queued
     * and what is left is draining. */
    while (t->qhead != NULL) {
        struct freq *r = t->qhead;
        t->qhead = r->next;
        atomic_fetch_sub(&f->queued, 1);
        req_free(r);
    }
    for (unsigned i = 0; i < t->nsess; i++) {
        struct fsess *fs = t->sess[i];
        if (fs->active != NULL) {
            struct freq *r = fs->active;
            fs->active = NULL;
            atomic_store(&fs->w->busy, 0);
            req_free(r);
        }
        shmipc__timer_stop(&fs->timer);
        if (fs->s != NULL) {
            shmipc__watch_free(fs->watch);
            shmipc__session_close(fs->s);
            atomic_fetch_sub(&fs->w->sessions, 1);
        }
        free(fs);
    }
    free(t->sess);
    shmipc__timer_stop(&t->kick);
    shmipc__watch_free(t->ewatch);
    close(t->efd);
    free(t->scratch);
    free(t);
    return 0;
}

/* ---- the front ---- */

/* Builds the set from addresses, reusing the workers of the same address. Under mu. */
static int set_locked(struct shmipc__front *f, const char *const *addrs, unsigned n)
{
    struct fworker *set[SHMIPC__FRONT_MAX_WORKERS] = {NULL};
    for (unsigned i = 0; i < n; i++) {
        struct fworker *w = f->all;
        while (w != NULL && strcmp(w->addr, addrs[i]) != 0)
            w = w->next;
        if (w == NULL) {
            if ((w = calloc(1, sizeof *w)) == NULL)
                return shmipc__fail(SHMIPC_ENOMEM, "front: worker");
            memcpy(w->addr, addrs[i], strlen(addrs[i]) + 1);
            w->next = f->all;
            f->all = w;
        }
        set[i] = w;
    }
    for (unsigned i = 0; i < f->nset; i++)
        atomic_store(&f->set[i]->current, 0);
    for (unsigned i = 0; i < n; i++)
        atomic_store(&set[i]->current, 1);
    memcpy(f->set, set, n * sizeof set[0]);
    f->nset = n;
    atomic_fetch_add(&f->gen, 1);
    return 0;
}

static int check_addrs(const char *const *addrs, unsigned n)
{
    if (addrs == NULL || n == 0 || n > SHMIPC__FRONT_MAX_WORKERS)
        return shmipc__fail(SHMIPC_EINVAL, "front: %u workers, 1..%u", n,
                            SHMIPC__FRONT_MAX_WORKERS);
    for (unsigned i = 0; i < n; i++) {
        if (addrs[i] == NULL || addrs[i][0] == '\0' || strlen(addrs[i]) > SHMIPC__FRONT_MAX_ADDRESS)
            return shmipc__fail(SHMIPC_EINVAL, "front: worker address %u is empty or too long", i);
        for (unsigned j = 0; j < i; j++)
            if (strcmp(addrs[i], addrs[j]) == 0)
                return shmipc__fail(SHMIPC_EINVAL, "front: worker address %s twice", addrs[i]);
    }
    return 0;
}

int shmipc__front_new(const struct shmipc__front_opts *opts, struct shmipc__front **out)
{
    struct shmipc__front *f;
    int rc;
    if (opts == NULL || out == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "front_new: NULL");
    if ((rc = check_addrs(opts->workers, opts->nworkers)) < 0)
        return rc;
    if ((opts->deadline_ms > 3600000u && opts->deadline_ms != SHMIPC__FRONT_NO_DEADLINE) ||
        opts->connect_ms > 3600000u || opts->max_response > SHMIPC__FRONT_LIMIT_RESPONSE ||
        opts->queue_max > (1u << 24))
        return shmipc__fail(SHMIPC_ERANGE, "front_new: a deadline, timeout or limit too large");
    if ((f = calloc(1, sizeof *f)) == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "front_new");
    f->queue_max = opts->queue_max ? opts->queue_max : SHMIPC__FRONT_DEFAULT_QUEUE;
    /* The server's deferral takes 0 as "no deadline". */
    f->deadline_ms = opts->deadline_ms == SHMIPC__FRONT_NO_DEADLINE ? 0
                     : opts->deadline_ms                            ? opts->deadline_ms
                                         : SHMIPC__FRONT_DEFAULT_DEADLINE;
    f->connect_ms = opts->connect_ms ? opts->connect_ms : SHMIPC__FRONT_DEFAULT_CONNECT;
    f->max_response = opts->max_response ? opts->max_response : SHMIPC__FRONT_DEFAULT_RESPONSE;
    pthread_mutex_init(&f->mu, NULL);
    rc = opts->ipc != NULL ? shmipc__config_clone(opts->ipc, &f->ipc) : shmipc__config_new(&f->ipc);
    if (rc == 0) {
        /* The connect runs on a reactor thread: its handshake is bounded by connect_ms. */
        f->ipc->timeout_ms[SHMIPC_TIMEOUT_INITIALIZE] = f->connect_ms;
        pthread_mutex_lock(&f->mu);
        rc = set_locked(f, opts->workers, opts->nworkers);
        pthread_mutex_unlock(&f->mu);
    }
    if (rc < 0) {
        shmipc__front_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

int shmipc__front_attach(struct shmipc__front *f, struct shmipc_server *srv, const char *pattern)
{
    int rc;
    if (f == NULL || srv == NULL || pattern == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "front_attach: NULL");
    if (f->srv != NULL)
        return shmipc__fail(SHMIPC_EBUSY, "front_attach: attached already");
    if ((rc = shmipc__server_thread_hooks(srv, thread_start, thread_end, f)) < 0)
        return rc;
    rc = shmipc__server_route(srv, NULL, pattern, front_handler, f, NULL, 0, NULL, NULL, 0);
    if (rc < 0) {
        srv->thread_start = srv->thread_end = NULL;
        srv->thread_data = NULL;
        return rc;
    }
    f->srv = srv;
    return 0;
}

int shmipc__front_set_workers(struct shmipc__front *f, const char *const *addrs, unsigned n)
{
    int rc;
    if (f == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "front_set_workers: NULL");
    if ((rc = check_addrs(addrs, n)) < 0)
        return rc;
    pthread_mutex_lock(&f->mu);
    rc = set_locked(f, addrs, n);
    /* Every thread takes the new set up now, so that idle old sessions close. */
    for (unsigned i = 0; rc == 0 && i < MAX_THREADS; i++) {
        uint64_t one = 1;
        if (f->threads[i] != NULL && write(f->threads[i]->efd, &one, sizeof one) < 0 &&
            errno != EAGAIN)
            rc = shmipc__fail_errno(errno, "front_set_workers: eventfd");
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

int shmipc__front_stats(struct shmipc__front *f, struct shmipc__front_stats *out)
{
    if (f == NULL || out == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "front_stats: NULL");
    memset(out, 0, sizeof *out);
    out->queued = atomic_load(&f->queued);
    out->rejected = atomic_load(&f->rejected);
    out->timeouts = atomic_load(&f->timeouts);
    out->client_gone = atomic_load(&f->client_gone);
    pthread_mutex_lock(&f->mu);
    for (int pass = 0; pass < 2; pass++) {
        for (unsigned i = 0; i < (pass == 0 ? f->nset : 0xffffffffu); i++) {
            struct fworker *w;
            if (pass == 0) {
                w = f->set[i];
            } else {
                /* retired workers still holding sessions, from the list of all */
                w = f->all;
                for (unsigned k = 0; w != NULL && k < i; k++)
                    w = w->next;
                if (w == NULL)
                    break;
                if (atomic_load(&w->current) || atomic_load(&w->sessions) == 0)
                    continue;
            }
            if (out->nworkers == 2 * SHMIPC__FRONT_MAX_WORKERS)
                break;
            struct shmipc__front_worker_stats *ws = &out->w[out->nworkers++];
            memcpy(ws->address, w->addr, sizeof ws->address);
            ws->sessions = atomic_load(&w->sessions);
            ws->state = !atomic_load(&w->current) ? SHMIPC__FRONT_WORKER_RETIRED
                        : ws->sessions > 0        ? SHMIPC__FRONT_WORKER_UP
                                                  : SHMIPC__FRONT_WORKER_DOWN;
            ws->in_flight = (unsigned)atomic_load(&w->busy);
            ws->served = atomic_load(&w->served);
            ws->failures = atomic_load(&w->failures);
        }
    }
    pthread_mutex_unlock(&f->mu);
    return 0;
}

void shmipc__front_free(struct shmipc__front *f)
{
    if (f == NULL)
        return;
    while (f->all != NULL) {
        struct fworker *w = f->all;
        f->all = w->next;
        free(w);
    }
    if (f->ipc != NULL)
        shmipc__config_free(f->ipc);
    pthread_mutex_destroy(&f->mu);
    free(f);
}
