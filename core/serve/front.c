/*
 * The front's dispatch to application workers: see front.h, front_int.h and docs/serve.md,
 * "The front". Owns the front object (new, attach, set_workers, stats, free), its set of
 * workers, and the per-thread hooks the server runs on each reactor thread (a thread's state
 * set up and torn down).
 * May call: front_session.c (refresh, the kick and nudge callbacks), front_request.c (the
 * route handler, freeing a request), the server's hooks and routes.
 */
#include "serve/front_int.h"

#include "common/error.h"
#include "ipc/config.h"
#include "ipc/sockio.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

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
    shmipc__timer_init(loop, &t->kick, shmipc__front_on_kick, t);
    shmipc__timer_init(loop, &t->stall_timer, shmipc__front_on_kick, t);
    shmipc__timer_init(loop, &t->alog_timer, shmipc__front_on_log_timer, t);
    shmipc__timer_init(loop, &t->wake_timer, shmipc__front_on_wake, t);
    if (f->alog != NULL && (rc = shmipc__access_buf_init(&t->alog, f->alog)) < 0) {
        free(t->scratch);
        free(t);
        return rc;
    }
    shmipc__front_connector_init(t);
    t->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->efd < 0) {
        rc = shmipc__fail_errno(errno, "front: eventfd");
        goto fail;
    }
    if ((rc = shmipc__watch_new(loop, t->efd, SHMIPC__WATCH_READ, shmipc__front_on_nudge, t,
                                &t->ewatch)) < 0)
        goto fail;
    pthread_mutex_lock(&f->mu);
    f->threads[index] = t;
    pthread_mutex_unlock(&f->mu);
    /* The loop serves nothing yet: the first connects may take their time here. */
    shmipc__front_refresh(t, 1);
    return 0;
fail:
    shmipc__front_connector_stop(t);
    if (t->efd >= 0)
        close(t->efd);
    shmipc__access_buf_free(&t->alog);
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
    /* Nor its connector; the results it had are closed (their fsess are freed below). */
    shmipc__front_connector_stop(t);
    /* The server closed its connections: every deferral was cancelled, so nothing is queued
     * and what is left is draining. */
    while (t->qhead != NULL) {
        struct freq *r = t->qhead;
        t->qhead = r->next;
        atomic_fetch_sub(&f->queued, 1);
        shmipc__front_req_free(r);
    }
    for (unsigned i = 0; i < t->nsess; i++) {
        struct fsess *fs = t->sess[i];
        while (fs->nact > 0) {
            struct freq *r = fs->act[0];
            shmipc__front_fs_detach(fs, r);
            shmipc__front_req_free(r);
        }
        shmipc__timer_stop(&fs->timer);
        if (fs->hello != NULL)
            shmipc__stream_close_handle(fs->hello);
        if (fs->s != NULL) {
            shmipc__watch_free(fs->watch);
            shmipc__session_close(fs->s);
            atomic_fetch_sub(&fs->w->sessions, 1);
        }
        shmipc__front_fs_free(fs);
    }
    free(t->sess);
    shmipc__timer_stop(&t->kick);
    shmipc__timer_stop(&t->stall_timer);
    shmipc__timer_stop(&t->wake_timer);
    /* Every request was logged as the server cancelled it: the last lines go out now. */
    shmipc__timer_stop(&t->alog_timer);
    shmipc__access_buf_free(&t->alog);
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
    /*
     * Retired workers that no session of any thread points at any more are freed: shmipc-serve
     * names every start of a worker anew, so the list grew by one per restart for the front's
     * life (and the stats walked it under mu). A thread takes up a set, and references its
     * workers, under mu (shmipc__front_refresh), so one freed here is in no thread's hands.
     */
    for (struct fworker **pw = &f->all; *pw != NULL;) {
        struct fworker *w = *pw;
        if (!atomic_load(&w->current) && atomic_load(&w->refs) == 0) {
            *pw = w->next;
            free(w);
            continue;
        }
        pw = &w->next;
    }
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

static int deadline_ok(uint32_t ms)
{
    return ms <= SHMIPC__FRONT_MAX_DEADLINE || ms == SHMIPC__FRONT_NO_DEADLINE;
}

/* What the server's deferral takes for the option: it takes 0 as "no deadline". */
static uint32_t deadline_of(uint32_t ms)
{
    return ms == SHMIPC__FRONT_NO_DEADLINE ? 0 : ms ? ms : SHMIPC__FRONT_DEFAULT_DEADLINE;
}

int shmipc__front_new(const struct shmipc__front_opts *opts, struct shmipc__front **out)
{
    struct shmipc__front *f;
    int rc;
    if (opts == NULL || out == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "front_new: NULL");
    if ((rc = check_addrs(opts->workers, opts->nworkers)) < 0)
        return rc;
    if (!deadline_ok(opts->deadline_ms) || opts->connect_ms > 3600000u ||
        opts->max_response > SHMIPC__FRONT_LIMIT_RESPONSE ||
        (opts->queue_max > (1u << 24) && opts->queue_max != SHMIPC__FRONT_NO_QUEUE) ||
        opts->gather_max > SHMIPC__FRONT_LIMIT_GATHER ||
        opts->pipeline > SHMIPC__FRONT_MAX_PIPELINE || opts->hello > 1)
        return shmipc__fail(SHMIPC_ERANGE, "front_new: a deadline, timeout or limit too large");
    if ((f = calloc(1, sizeof *f)) == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "front_new");
    f->queue_max = opts->queue_max == SHMIPC__FRONT_NO_QUEUE ? 0
                   : opts->queue_max                         ? opts->queue_max
                                                             : SHMIPC__FRONT_DEFAULT_QUEUE;
    atomic_init(&f->deadline_ms, deadline_of(opts->deadline_ms));
    f->connect_ms = opts->connect_ms ? opts->connect_ms : SHMIPC__FRONT_DEFAULT_CONNECT;
    f->pipeline = opts->pipeline ? opts->pipeline : SHMIPC__FRONT_DEFAULT_PIPELINE;
    f->hello = opts->hello || f->pipeline > 1;
    f->max_response = opts->max_response ? opts->max_response : SHMIPC__FRONT_DEFAULT_RESPONSE;
    f->gather_max = opts->gather_max ? opts->gather_max : SHMIPC__FRONT_DEFAULT_GATHER;
    f->alog = opts->access_log;
    f->on_hung = opts->on_hung;
    f->hung_data = opts->hung_data;
    pthread_mutex_init(&f->mu, NULL);
    rc = opts->ipc != NULL ? shmipc__config_clone(opts->ipc, &f->ipc) : shmipc__config_new(&f->ipc);
    if (rc == 0) {
        /* A connect's handshake is bounded by connect_ms (it runs on a reactor thread's
         * connector; the first ones on the thread before its loop serves). */
        f->ipc->timeout_ms[SHMIPC_TIMEOUT_INITIALIZE] = f->connect_ms;
        /* Its writes run on reactor threads: never wait for shared memory (fall back). */
        f->ipc->memory_wait = 0;
        /* Workers are ours: unless the config names uids, a worker's unix socket must have
         * been made by our own uid. A process of another uid that took a worker's abstract
         * name (between a crash and the restart, say) is refused before any shared memory is
         * made, so no client's request reaches it. TCP carries no uid: f->ipc stays as given
         * for TCP workers. */
        rc = shmipc__config_clone(f->ipc, &f->ipc_unix);
        if (rc == 0 && f->ipc_unix->npeer_uids == 0) {
            uint32_t me = (uint32_t)geteuid();
            rc = shmipc__config_set_peer_uids(f->ipc_unix, &me, 1);
        }
    }
    if (rc == 0) {
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
    rc = shmipc__server_route(srv, NULL, pattern, shmipc__front_handler, f, NULL, 0, NULL, NULL, 0);
    /* A request with a body reaches the handler at its head: the body streams to the worker
     * as it arrives (docs/serve.md, "Streamed uploads"). */
    if (rc == 0)
        rc = shmipc__server_route_at_head(srv, NULL, pattern);
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

int shmipc__front_set_deadline(struct shmipc__front *f, uint32_t deadline_ms)
{
    if (f == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "front_set_deadline: NULL");
    if (!deadline_ok(deadline_ms))
        return shmipc__fail(SHMIPC_ERANGE, "front_set_deadline: %" PRIu32 " ms (at most %u)",
                            deadline_ms, SHMIPC__FRONT_MAX_DEADLINE);
    atomic_store(&f->deadline_ms, deadline_of(deadline_ms));
    return 0;
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
    out->retried = atomic_load(&f->retried);
    out->abort_retries = atomic_load(&f->abort_retries);
    out->send_waits = atomic_load(&f->send_waits);
    out->replaced = atomic_load(&f->replaced);
    out->buffered = atomic_load(&f->buffered);
    out->buffered_peak = atomic_load(&f->buffered_peak);
    out->uploads = atomic_load(&f->uploads);
    out->upload_kept = atomic_load(&f->up_kept);
    out->upload_kept_peak = atomic_load(&f->up_kept_peak);
    out->gathered = atomic_load(&f->gathered);
    out->gathered_peak = atomic_load(&f->gathered_peak);
    pthread_mutex_lock(&f->mu);
    for (struct fworker *w = f->all; w != NULL; w = w->next)
        out->known++;
    struct fworker *next_all = f->all;
    for (int pass = 0; pass < 2; pass++) {
        for (unsigned i = 0; i < (pass == 0 ? f->nset : 0xffffffffu); i++) {
            struct fworker *w;
            if (pass == 0) {
                w = f->set[i];
            } else {
                /* retired workers still holding sessions, from the list of all (one walk) */
                w = next_all;
                if (w == NULL)
                    break;
                next_all = w->next;
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
            ws->taken = atomic_load(&w->taken);
            ws->concurrency = atomic_load(&w->conc);
            if (ws->concurrency == 0)
                ws->concurrency = 1;
            ws->served = atomic_load(&w->served);
            ws->failures = atomic_load(&w->failures);
            ws->hung = (unsigned)atomic_load(&w->hung);
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
    if (f->ipc_unix != NULL)
        shmipc__config_free(f->ipc_unix);
    pthread_mutex_destroy(&f->mu);
    free(f);
}
