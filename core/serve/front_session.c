/*
 * The front: a reactor thread's sessions to the workers (connect on the thread's connector,
 * back-off, readiness watch, down, taking up a new set) and its queue of waiting requests (claim a free worker, requeue,
 * pump, the kick timer and the nudge eventfd).
 * May call: front_request.c (send, read, drain, answer, done), the IPC session and the loop.
 */
#include "serve/front_int.h"

#include "common/error.h"
#include "common/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- sessions ---- */

static void fs_hello_read(struct fsess *fs);

static void fs_ready_turn(struct fsess *fs)
{
    int rc;
    /* The watch is edge-triggered: one turn takes all that is there, reading the socket until
     * it would block, since a worker's last frames and its session's end may come as one edge
     * and a short read takes only the frames (the end would then wait for a request's
     * deadline). What arrives after the turn fires the watch again. */
    rc = shmipc__session_process(fs->s);
    if (rc < 0) {
        shmipc__front_fs_down(fs, rc);
        return;
    }
    /* Each request in flight reads what came for it. A read may end requests (this one, or
     * all of them when the session goes down) and a freed worker may take another: each is
     * looked up again before it is read, and one attached meanwhile waits for the next turn. */
    if (fs->hello != NULL)
        fs_hello_read(fs);
    struct freq *snap[SHMIPC__FRONT_MAX_CONCURRENCY];
    unsigned n = fs->nact;
    memcpy(snap, fs->act, n * sizeof snap[0]);
    for (unsigned i = 0; i < n; i++) {
        struct freq *r = snap[i];
        if (!shmipc__front_fs_has(fs, r))
            continue;
        if (r->state == RQ_ACTIVE)
            shmipc__front_req_read(r);
        else if (r->state == RQ_DRAINING)
            shmipc__front_req_drain(r);
        else if (r->state == RQ_WS)
            (void)shmipc__front_ws_read(r);
    }
}

/* The session's descriptor fired. A read in the turn may close the session and unlink its
 * fsess (a retired one whose last request ended, or went down): it is freed after the turn,
 * which still looks at it. */
static void fs_ready(struct shmipc__watch *watch, int fd, unsigned events, void *data)
{
    struct fsess *fs = data;
    (void)watch;
    (void)fd;
    (void)events;
    fs->in_ready = 1;
    fs_ready_turn(fs);
    fs->in_ready = 0;
    if (fs->gone)
        shmipc__front_fs_free(fs);
}

/* ---- the requests in flight on a session ---- */

int shmipc__front_fs_has(const struct fsess *fs, const struct freq *r)
{
    for (unsigned i = 0; i < fs->nact; i++)
        if (fs->act[i] == r)
            return 1;
    return 0;
}

/*
 * `r` goes on `fs` (claimed: it holds one of w->busy). Its REQUEST_HEAD asks for TAKEN on a
 * session that granted it, and not on another (a request requeued from one may go to any).
 */
void shmipc__front_fs_attach(struct fsess *fs, struct freq *r)
{
    fs->act[fs->nact++] = r;
    r->fs = fs;
    r->taken = 0;
    /* TAKEN decides what a pipelined request behind others may become: asked for when the
     * front pipelines (a concurrent worker runs what it is sent at once); and when a streamed
     * upload may go on past what the front keeps of its body (upload_room): a stopping
     * worker's refusal before TAKEN then sends it elsewhere whole. */
    r->want_taken = fs->taken_ok && (fs->t->f->pipeline > 1 || r->uploading);
    if (r->out != NULL) { /* the arg's low byte holds the request flags */
        if (r->want_taken)
            r->out[8] |= (uint8_t)SHMIPC__SF_REQ_TAKEN_WANTED;
        else
            r->out[8] &= (uint8_t)~SHMIPC__SF_REQ_TAKEN_WANTED;
    }
    r->solo = r->uploading || r->ws;
    if (r->solo)
        atomic_fetch_add(&fs->w->solo, 1);
}

/* `r`'s share of its worker given back: one request less in flight (and a solo one less). */
static void worker_share_drop(struct fsess *fs, struct freq *r)
{
    if (r->solo)
        atomic_fetch_sub(&fs->w->solo, 1);
    r->solo = 0;
    atomic_fetch_sub(&fs->w->busy, 1);
}

/* `r` leaves `fs`, and the worker has one request less in flight. */
void shmipc__front_fs_detach(struct fsess *fs, struct freq *r)
{
    for (unsigned i = 0; i < fs->nact; i++) {
        if (fs->act[i] != r)
            continue;
        memmove(&fs->act[i], &fs->act[i + 1], (fs->nact - i - 1) * sizeof fs->act[0]);
        fs->nact--;
        if (!fs->kept) /* a kept session's requests gave theirs back when it was kept */
            worker_share_drop(fs, r);
        return;
    }
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
    if (fs->in_ready)
        fs->gone = 1; /* fs_ready frees it after its turn */
    else
        shmipc__front_fs_free(fs);
}

/* Frees an fsess: its worker has one reference less (set_locked frees a retired one at 0). */
void shmipc__front_fs_free(struct fsess *fs)
{
    atomic_fetch_sub(&fs->w->refs, 1);
    free(fs);
}

/*
 * The HELLO exchange (docs/serve.md, "HELLO and TAKEN"): offered as the session comes up, the
 * answer read as it comes, on the loop like a response; until it does, the session carries
 * one request at a time. A worker that does not know HELLO answers ABORT PROTOCOL (or closes
 * the stream): no feature. A failure to offer it only means one request at a time.
 */
static void fs_hello_start(struct fsess *fs)
{
    uint8_t out[SHMIPC__SF_HDR_SIZE + SHMIPC__SF_HELLO_SIZE];
    fs->taken_ok = 0;
    fs->conc = 1;
    if (!fs->t->f->hello) /* one request at a time: nothing to ask */
        return;
    (void)shmipc__sf_encode_hello(out, sizeof out, SHMIPC__SF_FEAT_TAKEN, 0);
    if (shmipc__session_open_stream(fs->s, &fs->hello) < 0)
        return;
    if (shmipc__stream_write(fs->hello, out, sizeof out) < 0 ||
        shmipc__stream_flush(fs->hello) < 0) {
        shmipc__stream_close_handle(fs->hello);
        fs->hello = NULL;
    }
}

static void fs_hello_end(struct fsess *fs)
{
    if (fs->hello != NULL)
        shmipc__stream_close_handle(fs->hello);
    fs->hello = NULL;
}

/*
 * The worker's answer, once it is there whole: 20 bytes (a HELLO, or the start of anything
 * else), or what came before the stream ended, when that is shorter (an ABORT without a
 * reason). ABORT SHUTDOWN is a stopping worker's: the session takes nothing more, and goes
 * down now if nothing is in flight on it (else once that ended), to be opened again after the
 * back-off. Anything else means "no feature".
 */
static void fs_hello_read(struct fsess *fs)
{
    const void *p;
    struct shmipc__sf_frame f;
    size_t have = SHMIPC__SF_HDR_SIZE + SHMIPC__SF_HELLO_SIZE;
    int rc = shmipc__stream_read_exact(fs->hello, have, &p, SHMIPC_NONBLOCK), stopping = 0;
    if (rc == SHMIPC_EAGAIN)
        return;
    if (rc == SHMIPC_EEOF && (have = shmipc__stream_available(fs->hello)) >= SHMIPC__SF_HDR_SIZE)
        rc = shmipc__stream_read_exact(fs->hello, have, &p, SHMIPC_NONBLOCK);
    if (rc >= 0) {
        int hello = shmipc__sf_decode(p, have, &f) > 0 && f.type == SHMIPC__SF_HELLO;
        uint32_t grant = hello ? f.u.hello.features : 0;
        uint32_t conc = hello ? f.u.hello.concurrency : 0;
        stopping = !hello && shmipc__sf_decode_header(p, have, &f) == (int)SHMIPC__SF_HDR_SIZE &&
                   f.type == SHMIPC__SF_ABORT && f.arg == SHMIPC__SF_ABORT_SHUTDOWN;
        shmipc__stream_release(fs->hello);
        if (hello && (grant & ~SHMIPC__SF_FEAT_TAKEN)) {
            SHMIPC__LOG(SHMIPC__LOG_WARN, "front: worker %s granted features not offered (0x%x)",
                        fs->w->addr, grant);
        } else if (hello) {
            if (grant & SHMIPC__SF_FEAT_TAKEN) {
                fs->taken_ok = 1;
                atomic_fetch_add(&fs->w->taken, 1);
            }
            /* 0 says nothing: one at a time. More than the front's bound counts as the bound. */
            fs->conc = conc == 0                              ? 1
                       : conc > SHMIPC__FRONT_MAX_CONCURRENCY ? SHMIPC__FRONT_MAX_CONCURRENCY
                                                              : conc;
            atomic_store(&fs->w->conc, fs->conc);
        }
        rc = hello ? 0 : -1;
    }
    if (stopping)
        SHMIPC__LOG(SHMIPC__LOG_DEBUG,
                    "front: worker %s is stopping: its new session takes nothing", fs->w->addr);
    else if (rc < 0)
        SHMIPC__LOG(SHMIPC__LOG_INFO, "front: worker %s does not know HELLO: one request at a time",
                    fs->w->addr);
    fs_hello_end(fs);
    if (!stopping)
        fs->hello_refusals = 0;
    else if (fs->hello_refusals < 7)
        fs->hello_refusals++;
    if (stopping) {
        fs->stopping = 1;
        if (fs->nact == 0 && fs->s != NULL)
            shmipc__front_fs_down(fs, 0);
    }
    shmipc__front_kick(fs->t); /* waiting requests may go to it now (uploads waited for this) */
}

/* What a connect gave: the session watched and the worker up, or a retry after the back-off. */
static void fs_connected(struct fsess *fs, shmipc_session *s, int rc)
{
    struct fthread *t = fs->t;
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
    /* Only fs_ready processes it, and then reads every request: a request's read that
     * processed it could deliver another's data unseen (the watch's edge spent with it). */
    shmipc__session_set_loop_driven(s);
    fs->s = s;
    fs->backoff_ms = 0;
    fs->held_since = 0; /* the last session's stall is not this one's */
    fs_hello_start(fs);
    atomic_fetch_add(&fs->w->sessions, 1);
    shmipc__front_kick(t);
}

/* ---- the connector (struct fconnector) ---- */

static void *connector_main(void *arg)
{
    struct fthread *t = arg;
    struct fconnector *c = &t->conn;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (c->todo == NULL && !c->stop) {
            c->idle++;
            pthread_cond_wait(&c->cv, &c->mu);
            c->idle--;
        }
        if (c->stop)
            break;
        struct fsess *fs = c->todo;
        if ((c->todo = fs->cnext) == NULL)
            c->todo_tail = NULL;
        c->pending--;
        pthread_mutex_unlock(&c->mu);
        shmipc_session *s = NULL;
        int rc = shmipc__session_connect(fs->w->addr, shmipc__front_ipc_for(t->f, fs->w->addr), &s);
        pthread_mutex_lock(&c->mu);
        fs->got = rc == 0 ? s : NULL;
        fs->got_rc = rc;
        fs->cnext = c->done;
        c->done = fs;
        uint64_t one = 1;
        /* EAGAIN: the counter is full, a nudge is pending anyway */
        if (write(t->efd, &one, sizeof one) < 0 && errno != EAGAIN)
            SHMIPC__LOG(SHMIPC__LOG_WARN, "front: connector: eventfd: %s", strerror(errno));
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

void shmipc__front_connector_init(struct fthread *t)
{
    pthread_mutex_init(&t->conn.mu, NULL);
    pthread_cond_init(&t->conn.cv, NULL);
}

/* Stops and joins the connector's threads (the connects in flight end within connect_ms,
 * twice that when a V4 probe falls back to legacy) and closes the sessions whose results the
 * loop never took. The fsess stay for the caller to free. */
void shmipc__front_connector_stop(struct fthread *t)
{
    struct fconnector *c = &t->conn;
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    for (unsigned i = 0; i < c->nth; i++)
        pthread_join(c->th[i], NULL);
    c->nth = 0;
    for (struct fsess *fs = c->done; fs != NULL; fs = fs->cnext)
        if (fs->got != NULL)
            shmipc__session_close(fs->got);
    c->done = c->todo = c->todo_tail = NULL;
    c->pending = 0;
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
}

/* Hands the connect to the connector, on a thread of its own unless one is idle; 0, or an
 * error (no connector thread could start). */
static int connector_post(struct fthread *t, struct fsess *fs)
{
    struct fconnector *c = &t->conn;
    int rc = 0;
    pthread_mutex_lock(&c->mu);
    /* An idle thread counts until it wakes: one signalled already is not idle for this one. */
    if (c->idle < c->pending + 1 && c->nth < CONNECTORS_MAX) {
        int e = pthread_create(&c->th[c->nth], NULL, connector_main, t);
        if (e == 0)
            c->nth++;
        else if (c->nth == 0)
            rc = shmipc__fail_errno(e, "front: the connector thread");
        else /* the connects queue on the threads there are */
            SHMIPC__LOG(SHMIPC__LOG_WARN, "front: another connector thread: %s", strerror(e));
    }
    if (rc == 0) {
        c->pending++;
        fs->cnext = NULL;
        if (c->todo_tail != NULL)
            c->todo_tail->cnext = fs;
        else
            c->todo = fs;
        c->todo_tail = fs;
        fs->connecting = 1;
        pthread_cond_signal(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* The connector's results, taken on the loop: a worker that left the set meanwhile gets its
 * session closed and its fsess freed. */
static void connector_collect(struct fthread *t)
{
    struct fconnector *c = &t->conn;
    pthread_mutex_lock(&c->mu);
    struct fsess *d = c->done;
    c->done = NULL;
    pthread_mutex_unlock(&c->mu);
    while (d != NULL) {
        struct fsess *fs = d;
        d = fs->cnext;
        fs->connecting = 0;
        if (fs->retired) {
            if (fs->got != NULL)
                shmipc__session_close(fs->got);
            fs->got = NULL;
            fs_unlink(fs);
            continue;
        }
        shmipc_session *s = fs->got;
        fs->got = NULL;
        fs_connected(fs, s, fs->got_rc);
    }
}

/* Connects `fs`: on the connector once the loop runs (now == 0), else here (the thread's
 * start, before the loop serves anything). */
static void fs_connect(struct fsess *fs, int now)
{
    shmipc_session *s = NULL;
    int rc;
    if (fs->connecting)
        return;
    if (!now) {
        if ((rc = connector_post(fs->t, fs)) == 0)
            return;
    } else {
        rc = shmipc__session_connect(fs->w->addr, shmipc__front_ipc_for(fs->t->f, fs->w->addr), &s);
    }
    fs_connected(fs, s, rc);
}

static void fs_timer(struct shmipc__timer *timer)
{
    struct fsess *fs = timer->data;
    if (fs->s == NULL && !fs->retired) {
        fs_connect(fs, 0);
    } else if (fs->s != NULL && fs->down_due && !fs->down) {
        shmipc__front_fs_down(fs, fs->down_rc); /* shmipc__front_requeue_head's */
    } else if (fs->s != NULL && fs->retired && fs->nact == 0 && !fs->down) {
        shmipc__front_fs_down(fs, 0); /* a replaced session with nothing in flight */
    }
}

/* A new fsess for worker `w` on thread `t`, in its list, not connected yet; NULL when out of
 * memory. */
static struct fsess *fs_add(struct fthread *t, struct fworker *w)
{
    if (t->nsess == t->cap) {
        unsigned cap = t->cap ? t->cap * 2 : 8;
        struct fsess **ns = realloc(t->sess, cap * sizeof *ns);
        if (ns == NULL)
            return NULL;
        t->sess = ns;
        t->cap = cap;
    }
    struct fsess *fs = calloc(1, sizeof *fs);
    if (fs == NULL)
        return NULL;
    fs->t = t;
    fs->w = w;
    atomic_fetch_add(&w->refs, 1);
    shmipc__timer_init(t->loop, &fs->timer, fs_timer, fs);
    t->sess[t->nsess++] = fs;
    return fs;
}

/*
 * The session ended (rc < 0), or a retired one closes (rc 0): each request in flight on it,
 * oldest first, goes to another worker when the worker never took it (a refusal still unread
 * in its stream, ABORT SHUTDOWN; or, on a session that granted TAKEN, no TAKEN came:
 * shmipc__front_req_refused), else it is answered 502; the worker freed. The session
 * reconnects after the back-off unless retired.
 */
/* At most this many replaced sessions of one worker drain on a thread (fs_replace, fs_may_keep). */
#define FRONT_MAX_REPLACED 2

/* A response streaming to the client with bytes the worker sent still unread here. */
static int relaying(const struct freq *r)
{
    return r->state == RQ_ACTIVE && r->live && r->streaming && !r->ws && r->st != NULL &&
           shmipc__stream_available(r->st) > 0;
}

/* Replaced sessions of fs's worker that still drain on fs's thread. */
static unsigned draining_of(const struct fsess *fs)
{
    const struct fthread *t = fs->t;
    unsigned n = 0;
    for (unsigned i = 0; i < t->nsess; i++)
        n += t->sess[i]->replaced && t->sess[i]->w == fs->w;
    return n;
}

/*
 * Whether the session's end may leave its streaming responses to finish: it ended because the
 * worker left (its exit, graceful or not: what it sent before is whole) or stopped, not for a
 * fault of ours or a hostile frame; and fewer than FRONT_MAX_REPLACED sessions of its worker
 * drain on this thread (each holds its shared memory).
 */
static int fs_may_keep(struct fsess *fs, int rc)
{
    if (fs->kept)
        return 1; /* already kept: the requests with bytes left go on, the others end */
    if (fs->s == NULL || fs->replaced || (rc != 0 && rc != SHMIPC_ECONNRESET && rc != SHMIPC_EPIPE))
        return 0;
    return draining_of(fs) < FRONT_MAX_REPLACED;
}

/*
 * The worker's session ended while responses it wrote whole (or up to where it died) sit in
 * the session's shared memory for clients that read them slower: a worker replaced after
 * --max-requests, stopped by a reload, or one that crashed after writing. They used to be cut
 * at the session's end (a 20 MB response cut at 4 MB; an attack review). The session stays
 * open for them as a replaced one (retired, takes nothing more, closed when its last request
 * ends: req_finish), nothing watches it any more (nothing more comes), and a new session
 * takes the worker's place on this thread. Each kept request reads on as its client drains;
 * at the end of what the worker sent, its END completes it, or the session's end cuts it as
 * before. 0, or < 0 when no new session could be made (the caller cuts them).
 */
static int fs_keep_relaying(struct fsess *fs)
{
    struct fthread *t = fs->t;
    struct fsess *nfs = NULL;
    if (fs->kept)
        return 0;
    if (!fs->retired && (nfs = fs_add(t, fs->w)) == NULL)
        return SHMIPC_ENOMEM;
    /* The worker has these requests no more: its new session takes requests at once. */
    for (unsigned i = 0; i < fs->nact; i++)
        worker_share_drop(fs, fs->act[i]);
    fs->kept = 1;
    fs->replaced = 1;
    fs->retired = 1;
    fs->stopping = 1;
    shmipc__watch_free(fs->watch);
    fs->watch = NULL;
    SHMIPC__LOG(SHMIPC__LOG_INFO,
                "front: worker %s: its session ended with response(s) still streaming; they go "
                "on from what it sent",
                fs->w->addr);
    if (nfs != NULL)
        fs_connect(nfs, 0);
    return 0;
}

void shmipc__front_fs_down(struct fsess *fs, int rc)
{
    if (fs->down) /* from a read below: this call decides */
        return;
    fs->down = 1;
    /* Taken down from outside fs_ready (an open or a write failed) while the worker may still
     * have sent something: its reads never process the session (loop_driven), so process it
     * once here, or a TAKEN still in the queue would be missed and a request the worker took
     * sent to another. An ended session's error is what rc says already. */
    if (fs->s != NULL)
        (void)shmipc__session_process(fs->s);
    /* First what the worker sent before it ended: a response it finished is relayed, a TAKEN
     * it sent is seen (a read that meets the end leaves the request here). A WebSocket's
     * messages and close the same (what its client takes now, the mark's bound): a worker that
     * sends its last message and its close, then exits, has its client get them, not a 1011
     * instead (`ws_worker_frames_before_its_end_reach_client`). */
    struct freq *snap[SHMIPC__FRONT_MAX_CONCURRENCY];
    unsigned n = fs->nact;
    memcpy(snap, fs->act, n * sizeof snap[0]);
    for (unsigned i = 0; i < n; i++) {
        if (!shmipc__front_fs_has(fs, snap[i]))
            continue;
        if (snap[i]->state == RQ_ACTIVE)
            shmipc__front_req_read(snap[i]);
        else if (snap[i]->state == RQ_WS)
            (void)shmipc__front_ws_read(snap[i]);
    }
    /* Responses streaming to a client that reads slower than the worker wrote keep what the
     * worker sent (fs_keep_relaying); the others end here. */
    int keep = 0;
    for (unsigned i = 0; i < fs->nact; i++)
        keep |= relaying(fs->act[i]);
    keep = keep && fs_may_keep(fs, rc) && fs_keep_relaying(fs) == 0;
    /* The worker ended the session (its end read from the socket), not the front. */
    int peer_left = rc == SHMIPC_ECONNRESET || rc == SHMIPC_EPIPE;
    unsigned kept = 0;
    while (fs->nact > kept) {
        struct freq *r = fs->act[kept];
        if (keep && relaying(r)) {
            kept++;
            continue;
        }
        if (!(shmipc__front_req_refused(r, peer_left) && shmipc__front_requeue(fs->t, r) == 0)) {
            shmipc__front_answer_status(r, 502);
            shmipc__front_req_done(r);
        }
        if (fs->nact > kept && fs->act[kept] == r) /* never twice: it leaves whatever happened */
            shmipc__front_fs_detach(fs, r);
    }
    fs->down = 0;
    fs->down_due = 0;
    if (kept > 0)
        return;
    if (fs->s == NULL)
        return;
    fs_hello_end(fs);
    fs->stopping = 0;
    if (fs->taken_ok)
        atomic_fetch_sub(&fs->w->taken, 1);
    fs->taken_ok = 0;
    fs->conc = 1; /* the next session's HELLO says again */
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
    uint32_t refused = SHMIPC__FRONT_BACKOFF_MIN_MS << fs->hello_refusals;
    if (refused > fs->backoff_ms)
        fs->backoff_ms =
            refused < SHMIPC__FRONT_BACKOFF_MAX_MS ? refused : SHMIPC__FRONT_BACKOFF_MAX_MS;
    shmipc__timer_start(&fs->timer, fs->backoff_ms);
}

/* Takes up a new set of workers (set_workers) when the generation moved. */
void shmipc__front_refresh(struct fthread *t, int connect_now)
{
    struct shmipc__front *f = t->f;
    struct fworker *set[SHMIPC__FRONT_MAX_WORKERS] = {NULL};
    unsigned n;
    if (atomic_load(&f->gen) == t->gen)
        return;
    struct fsess *added[SHMIPC__FRONT_MAX_WORKERS];
    unsigned nadded = 0;
    /* Under mu: a worker of the set is referenced (fs_add) before a set change can free it. */
    pthread_mutex_lock(&f->mu);
    n = f->nset;
    memcpy(set, f->set, n * sizeof set[0]);
    t->gen = atomic_load(&f->gen);
    for (unsigned i = 0; i < t->nsess; i++) {
        struct fsess *fs = t->sess[i];
        fs->retired = 1;
        for (unsigned j = 0; j < n && !fs->replaced; j++)
            fs->retired &= fs->w != set[j];
    }
    for (unsigned j = 0; j < n; j++) {
        unsigned i = 0;
        while (i < t->nsess && (t->sess[i]->w != set[j] || t->sess[i]->replaced))
            i++;
        if (i < t->nsess)
            continue;
        struct fsess *fs = fs_add(t, set[j]);
        if (fs != NULL)
            added[nadded++] = fs;
    }
    pthread_mutex_unlock(&f->mu);
    for (unsigned k = 0; k < nadded; k++) {
        if (connect_now)
            fs_connect(added[k], 1);
        else
            shmipc__timer_start(&added[k]->timer, 0);
    }
    /* Retired sessions close now when idle, else when their request ends. */
    for (unsigned i = 0; i < t->nsess;) {
        struct fsess *fs = t->sess[i];
        if (fs->retired && fs->nact == 0 && !fs->connecting) {
            if (fs->s != NULL)
                shmipc__front_fs_down(fs, 0);
            else
                fs_unlink(fs);
            continue;
        }
        i++;
    }
}

/* Whether `r` may wait in a worker's queue behind others: the front holds it whole (no body
 * still to stream, a body it may resend), and it is no WebSocket. */
static int pipelinable(const struct freq *r)
{
    return !r->uploading && !r->ws && !r->no_retry;
}

void shmipc__front_worker_hung(struct shmipc__front *f, struct fworker *w)
{
    if (atomic_exchange(&w->hung, 1) != 0)
        return;
    SHMIPC__LOG(SHMIPC__LOG_WARN,
                "front: worker %s is hung: it took nothing of its session for the %u ms after "
                "a request's deadline and ABORT",
                w->addr, SHMIPC__FRONT_DRAIN_MS);
    if (f->on_hung != NULL)
        f->on_hung(f->hung_data, w->addr);
}

/* A worker that has held what this session sent it this long without taking any of it (a
 * stopped or wedged process, an app that keeps its event loop busy) is passed over while
 * another worker can take the request (docs/serve.md, "Choosing a worker"). */
#define STALL_MS 200
/* How often the queue is run again while a request waits only because its worker is stalled. */
#define STALL_RETRY_MS 50
/* Added to a stalled worker's rank: any worker that is not stalled ranks before it. */
#define STALLED_RANK (1 << 20)

/*
 * Whether fs's worker sits on elements of this session's queue: some it has not taken, and it
 * took none since the first claim that saw them, STALL_MS or more ago. Claims are the only
 * looks, so the clock may start late, never early. `now` is the loop's time of this turn (ms).
 * held_since keeps now + 1, so that 0 stays "nothing held" whatever the clock reads. The
 * popped count is the worker's to write: a lying worker only decides whether it is passed
 * over itself.
 */
static int fs_stalled(struct fsess *fs, uint64_t now)
{
    uint64_t put = shmipc__session_sent(fs->s), pop = shmipc__session_popped(fs->s);
    if (pop >= put) {
        fs->held_since = 0; /* nothing held */
        return 0;
    }
    if (fs->held_since == 0 || pop != fs->held_pop) {
        fs->held_since = now + 1; /* held from now, or it took some since the last look */
        fs->held_pop = pop;
        return 0;
    }
    return now + 1 - fs->held_since >= STALL_MS;
}

/*
 * A worker this thread has a session to, claimed for `r` (one more of w->busy); NULL when
 * none. Each worker that can take `r` has a rank: the requests in flight to it (w->busy),
 * behind every other if it is stalled (fs_stalled). A free worker ranks first; a concurrent
 * worker (HELLO concurrency over 1) can take any request below its concurrency (it runs an
 * upload or a WebSocket beside the others); when `r` may wait behind others, a worker whose
 * session granted TAKEN can take it below the front's pipeline with nothing in flight that
 * holds it whole (an upload, a WebSocket). The lowest rank wins, ties in round-robin order;
 * a stalled worker only when every live worker is stalled (else NULL: the request waits in
 * the thread's queue for a worker that runs). An upload takes no session whose HELLO is still
 * unanswered.
 */
struct fsess *shmipc__front_claim(struct fthread *t, const struct freq *r)
{
    int may_wait = t->f->pipeline > 1 && pipelinable(r);
    uint64_t now = shmipc__loop_now_ms(t->loop);
    /* A claim lost to another thread between the look and the claim looks again, twice. */
    for (int attempt = 0; attempt < 3; attempt++) {
        struct fsess *best = NULL;
        int best_rank = 0, best_bar = 0, running = 0;
        unsigned best_k = 0;
        for (unsigned k = 0; k < t->nsess; k++) {
            struct fsess *fs = t->sess[(t->rr + k) % t->nsess];
            if (fs->s == NULL || fs->retired || fs->stopping)
                continue;
            int stalled = fs_stalled(fs, now);
            running |= !stalled; /* a live worker that runs, whether it can take r or not */
            if (fs->nact == SHMIPC__FRONT_MAX_CONCURRENCY)
                continue;
            /* An upload waits for the session's HELLO answer: granted TAKEN, its body is held
             * back until TAKEN (upload_room), so a stopping worker's refusal resends it
             * whole. */
            if (r->uploading && fs->hello != NULL)
                continue;
            int n = atomic_load(&fs->w->busy), bar;
            if (fs->conc > 1)
                bar = (int)fs->conc;
            else if (n == 0)
                bar = 1;
            else if (may_wait && fs->taken_ok && fs->nact < SHMIPC__FRONT_MAX_PIPELINE &&
                     atomic_load(&fs->w->solo) == 0)
                bar = (int)t->f->pipeline;
            else
                continue;
            if (n >= bar)
                continue;
            int rank = n + (stalled ? STALLED_RANK : 0);
            if (best == NULL || rank < best_rank) {
                best = fs;
                best_rank = rank;
                best_bar = bar;
                best_k = k;
                if (rank == 0)
                    break; /* free and not stalled: none ranks before it */
            }
        }
        if (best == NULL)
            return NULL;
        /* A stalled worker only when no live worker runs: the request rather waits for one
         * that does than joins those of one that does not. Nothing tells the loop when the
         * stalled one takes again (only a worker that frees a request kicks the queue), so
         * the queue is run again every STALL_RETRY_MS while that is all it waits for. */
        if (best_rank >= STALLED_RANK && running) {
            if (!shmipc__timer_active(&t->stall_timer) &&
                shmipc__timer_start(&t->stall_timer, STALL_RETRY_MS) < 0)
                SHMIPC__LOG(SHMIPC__LOG_ERROR, "front: cannot start a timer: %s", shmipc__detail());
            return NULL;
        }
        /* Claimed only while still below its bar (another thread may have claimed it
         * meanwhile); a pipelined claim only while nothing in flight holds it whole. */
        int n = atomic_load(&best->w->busy);
        while (n < best_bar && (n == 0 || best->conc > 1 || atomic_load(&best->w->solo) == 0)) {
            if (atomic_compare_exchange_weak(&best->w->busy, &n, n + 1)) {
                t->rr = (t->rr + best_k + 1) % t->nsess;
                return best;
            }
        }
    }
    return NULL;
}

/*
 * Back to the head of this thread's queue, away from its worker (freed) and its stream
 * (closed): a request no live worker has seen, or one a stopping worker refused. 0, or
 * SHMIPC_ENOMEM (the body could not be kept; the request is then on no queue).
 */
int shmipc__front_requeue(struct fthread *t, struct freq *r)
{
    struct fsess *fs = r->fs;
    if (fs != NULL)
        shmipc__front_fs_detach(fs, r);
    r->fs = NULL;
    if (r->st != NULL) {
        shmipc__stream_close_handle(r->st);
        r->st = NULL;
    }
    shmipc__timer_stop(&r->timer);
    /* Part of an upload's body went and was not kept (past its first message, or too big to
     * keep): it cannot go again; the caller answers it (502). */
    if (r->uploading && ((r->up_head && r->no_retry) || r->up_lost))
        return shmipc__fail(SHMIPC_ECONNRESET, "front: part of the request body went to a worker "
                                               "that ended, and was not kept");
    if (shmipc__front_upload_rewind(r) < 0)
        return SHMIPC_ENOMEM;
    r->have_hdr = 0;
    r->send_tries = 0;
    r->sent_mark = 0;
    /* An upload goes again from its head: only one whose body bytes never went comes here
     * (no_retry), what the server hands meanwhile is kept until a worker is claimed. */
    r->up_head = r->up_end_out = r->up_dirty = r->up_flushed = 0;
    if (shmipc__front_req_own_body(r) < 0)
        return SHMIPC_ENOMEM;
    r->state = RQ_QUEUED;
    r->next = t->qhead;
    t->qhead = r;
    if (t->qtail == NULL)
        t->qtail = r;
    atomic_fetch_add(&t->nwait, 1);
    atomic_fetch_add(&t->f->queued, 1);
    shmipc__front_kick(t);
    return 0;
}

/*
 * SHMIPC_EUNHEALTHY from open_stream: the session's shared memory ran out and data went over
 * its socket (ours, or the worker's FallbackData), and shmipc refuses its new streams for
 * 30 s. Its requests in flight are fine, and taking it down cut them all (502, bodies cut
 * short). So `fs` keeps them and takes nothing more (retired, as a worker's that left the
 * set: closed once they ended), and a new fsess connects a new session to the same worker at
 * once for what comes next, as shmipc-go's session manager replaces an unhealthy session.
 * `fs` stays what it was for every caller and request that holds it. At most
 * FRONT_MAX_REPLACED replaced sessions per worker and thread drain at once (each holds its
 * shared memory: a client that keeps a WebSocket open and makes each new session unhealthy
 * must not multiply them). 0, or < 0: the caller takes the session down instead.
 */
static int fs_replace(struct fsess *fs)
{
    struct fthread *t = fs->t;
    if (fs->s == NULL || fs->down || fs->retired)
        return SHMIPC_EINVAL;
    if (draining_of(fs) >= FRONT_MAX_REPLACED)
        return SHMIPC_EBUSY;
    struct fsess *nfs = fs_add(t, fs->w);
    if (nfs == NULL)
        return SHMIPC_ENOMEM;
    fs->replaced = 1;
    fs->retired = 1;
    atomic_fetch_add(&t->f->replaced, 1);
    SHMIPC__LOG(SHMIPC__LOG_INFO,
                "front: worker %s: a session refuses new streams (its shared memory ran out); a "
                "new one takes them, the %u request(s) in flight stay on the old one",
                fs->w->addr, fs->nact);
    fs_connect(nfs, 0);
    /* Closed from the loop: the caller may still hold fs. Should the timer fail, it closes
     * with the worker set's next change, or the thread. */
    if (fs->nact == 0 && shmipc__timer_start(&fs->timer, 0) < 0)
        SHMIPC__LOG(SHMIPC__LOG_ERROR, "front: worker %s: a replaced session stays open: %s",
                    fs->w->addr, shmipc__errname(SHMIPC_ENOMEM));
    return 0;
}

/*
 * The session failed under a request before its worker answered anything, as a worker that
 * died before the front noticed: nothing of it reached a live worker (a dead session's
 * messages are never read), so it goes back to the head of this thread's queue rather than
 * being answered 502, as nginx retries the next upstream when nothing was sent. The session
 * goes down (rc < 0), or closes (rc 0: its worker is stopping). 0, or SHMIPC_ENOMEM.
 */
int shmipc__front_requeue_head(struct fthread *t, struct freq *r, int rc)
{
    struct fsess *fs = r->fs;
    int ret = shmipc__front_requeue(t, r);
    /* Queued first, run later (the kick is a timer): the pump never claims this session,
     * which is replaced, or stopping until its timer takes it down. */
    if (rc == SHMIPC_EUNHEALTHY && fs_replace(fs) == 0)
        return ret;
    /*
     * Not taken down here: a dispatch can run inside another request's answer on the same
     * session (the server serves a client's next pipelined request as one completes, from
     * the session's turn), and the session's end would answer and free that request under
     * it. Nothing more goes to it (stopping); its timer takes it down on the loop's next
     * turn. Should the timer fail, it closes once its requests in flight ended.
     */
    if (fs->s != NULL && !fs->down && !fs->down_due) {
        fs->stopping = 1;
        fs->down_due = 1;
        fs->down_rc = rc;
        if (shmipc__timer_start(&fs->timer, 0) < 0)
            fs->down_due = 0;
    }
    return ret;
}

/* Starts waiting requests while workers are free. From the loop only (it may answer 502). */
void shmipc__front_pump(struct fthread *t)
{
    struct shmipc__front *f = t->f;
    shmipc__front_refresh(t, 0);
    while (t->qhead != NULL) {
        struct fsess *fs = shmipc__front_claim(t, t->qhead);
        if (fs == NULL)
            return;
        struct freq *r = t->qhead;
        t->qhead = r->next;
        if (t->qhead == NULL)
            t->qtail = NULL;
        r->next = NULL;
        atomic_fetch_sub(&t->nwait, 1);
        atomic_fetch_sub(&f->queued, 1);
        r->state = RQ_ACTIVE;
        shmipc__front_fs_attach(fs, r);
        int rc = shmipc__front_req_send(r);
        if (rc < 0 && shmipc__front_requeue_head(t, r, rc) < 0) {
            /* Part of its body went with the dead stream and was not kept: 502, as nginx
             * answers a request it cannot send again to the next upstream. */
            shmipc__front_answer_status(r, 502);
            shmipc__front_req_done(r);
        }
    }
}

void shmipc__front_on_kick(struct shmipc__timer *timer)
{
    shmipc__front_pump(timer->data);
}

void shmipc__front_on_nudge(struct shmipc__watch *watch, int fd, unsigned events, void *data)
{
    uint64_t v;
    (void)watch;
    (void)events;
    while (read(fd, &v, sizeof v) > 0) {
    }
    connector_collect(data);
    shmipc__front_pump(data);
}
