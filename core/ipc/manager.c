#include "ipc/manager.h"

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "ipc/session.h"

#include <stdlib.h>
#include <string.h>

/* The reference moves to the next session every 32 calls (sessionRoundRobinThreshold). */
#define ROUND_ROBIN 32u

static void drop_pool(struct shmipc__pool *p)
{
    for (uint32_t i = 0; i < p->nidle; i++)
        shmipc__stream_close_handle(p->idle[i]);
    p->nidle = 0;
    if (p->s != NULL)
        shmipc__session_close(p->s);
    p->s = NULL;
}

static int pool_connect(shmipc_session_manager *m, struct shmipc__pool *p);

int shmipc__manager_new(const char *address, const shmipc_config *cfg, shmipc_session_manager **out)
{
    shmipc_config *def = NULL;
    int rc;
    if (cfg == NULL) {
        if ((rc = shmipc__config_new(&def)) < 0)
            return rc;
        cfg = def;
    }
    if ((rc = shmipc__config_validate(cfg)) < 0) {
        shmipc__config_free(def);
        return rc;
    }
    if (strlen(address) >= sizeof((shmipc_session_manager *)0)->address) {
        shmipc__config_free(def);
        return shmipc__fail(SHMIPC_ENAMETOOLONG, "session_manager: address too long");
    }
    size_t size = sizeof(shmipc_session_manager) + cfg->session_num * sizeof(struct shmipc__pool);
    shmipc_session_manager *m = calloc(1, size);
    if (m == NULL) {
        shmipc__config_free(def);
        return shmipc__fail(SHMIPC_ENOMEM, "session_manager: out of memory");
    }
    m->cfg = *cfg;
    shmipc__config_free(def);
    strcpy(m->address, address);
    pthread_mutex_init(&m->mu, NULL);
    pthread_mutex_init(&m->life_mu, NULL);
    m->refs = 1;
    m->pid = shmipc__pid();
    m->npools = m->cfg.session_num;
    for (uint32_t i = 0; i < m->npools; i++) {
        struct shmipc__pool *p = &m->pools[i];
        p->idle = calloc(m->cfg.max_stream_num, sizeof *p->idle);
        if (p->idle == NULL) {
            rc = shmipc__fail(SHMIPC_ENOMEM, "session_manager: out of memory");
            goto err;
        }
        /* As the reference does, every session must come up for the manager to exist. */
        if ((rc = pool_connect(m, p)) < 0)
            goto err;
    }
    *out = m;
    return 0;
err:
    shmipc__manager_close(m);
    return rc;
}

/* The manager's lock. Lines logged under it (a reconnect, a connect that fails) reach the
 * sink after it is dropped: no sink runs under a library lock (shmipc_set_log_sink). */
static void mgr_lock(shmipc_session_manager *m)
{
    pthread_mutex_lock(&m->mu);
    shmipc__log_defer_begin();
}

static void mgr_unlock(shmipc_session_manager *m)
{
    pthread_mutex_unlock(&m->mu);
    shmipc__log_defer_end();
}

static void manager_destroy(shmipc_session_manager *m)
{
    for (uint32_t i = 0; i < m->npools; i++) {
        drop_pool(&m->pools[i]);
        free(m->pools[i].idle);
    }
    pthread_mutex_destroy(&m->mu);
    pthread_mutex_destroy(&m->life_mu);
    free(m);
}

/*
 * A call begins: counted in, so that a close from another thread meanwhile (which the user may
 * make while workers still take and give back streams) frees nothing under it. SHMIPC_ECLOSED
 * once the close has begun.
 */
static int manager_enter(shmipc_session_manager *m)
{
    /* A fork child's copy: the sessions are the parent's, and nothing may be sent on them. */
    if (shmipc__foreign(m->pid))
        return shmipc__fail(SHMIPC_ECLOSED,
                            "session_manager %s: made by process %d (an object inherited "
                            "across fork is only closed in another process)",
                            m->address, (int)m->pid);
    pthread_mutex_lock(&m->life_mu);
    int closing = __atomic_load_n(&m->closing, __ATOMIC_ACQUIRE);
    if (!closing)
        m->refs++;
    pthread_mutex_unlock(&m->life_mu);
    return closing ? shmipc__fail(SHMIPC_ECLOSED, "session_manager %s: closed", m->address) : 0;
}

static void manager_leave(shmipc_session_manager *m)
{
    /* In a fork child without the lock (common/proc.h). */
    if (shmipc__unref(m->pid, &m->life_mu, &m->refs))
        manager_destroy(m);
}

/* A pool's session was freed (shmipc__session_on_free): its reference on the manager goes. */
static void session_gone(void *m)
{
    manager_leave(m);
}

/*
 * Connects the session of pool `p`. The session holds a reference on the manager until it is
 * freed, which is after its close (by the manager) and after the close of every stream taken
 * from it: a stream still out keeps the manager's memory, so that put_back after the manager's
 * close finds it (and closes the stream) instead of freed memory.
 */
static int pool_connect(shmipc_session_manager *m, struct shmipc__pool *p)
{
    int rc = shmipc__session_connect(m->address, &m->cfg, &p->s);
    if (rc < 0) {
        p->s = NULL;
        return rc;
    }
    pthread_mutex_lock(&m->life_mu);
    m->refs++;
    pthread_mutex_unlock(&m->life_mu);
    shmipc__session_on_free(p->s, session_gone, m);
    return 0;
}

/* Replaces a dead session, at most once per rebuild interval after a failure. Under mu. */
static int revive_locked(shmipc_session_manager *m, struct shmipc__pool *p)
{
    uint64_t now = shmipc__now_ns();
    int rc;
    if (p->s != NULL && shmipc__session_status(p->s) == 0)
        return 0;
    if (p->s != NULL) {
        SHMIPC__LOG(SHMIPC__LOG_INFO, "session_manager %s: session ended (%s), reconnecting",
                    m->address, shmipc__errname(shmipc__session_status(p->s)));
        drop_pool(p);
    }
    if (now < m->next_attempt_ns)
        return shmipc__fail(m->last_err, "session_manager %s: reconnecting failed recently (%s)",
                            m->address, shmipc__strerror(m->last_err));
    if ((rc = pool_connect(m, p)) < 0) {
        m->last_err = rc;
        m->next_attempt_ns = now + (uint64_t)m->cfg.rebuild_interval_ms * 1000000u;
        return rc;
    }
    return 0;
}

int shmipc__manager_get_stream(shmipc_session_manager *m, shmipc_stream **out)
{
    int rc;
    *out = NULL;
    if ((rc = manager_enter(m)) < 0)
        return rc;
    mgr_lock(m);
    struct shmipc__pool *p = &m->pools[(m->calls++ / ROUND_ROBIN) % m->npools];
    /* The close dropped the pools (or is about to): no reconnect after it. */
    if (__atomic_load_n(&m->closing, __ATOMIC_ACQUIRE))
        rc = shmipc__fail(SHMIPC_ECLOSED, "session_manager %s: closed", m->address);
    else if ((rc = revive_locked(m, p)) == 0) {
        /*
         * The peer may have closed a stream (or the session may have ended) while it sat in the
         * pool: such a stream is closed and the next one tried, or a new one opened. The check
         * takes the session's lock under ours (lock order: shmipc__stream_reusable()).
         */
        while (*out == NULL && p->nidle > 0) {
            shmipc_stream *st = p->idle[--p->nidle];
            if (shmipc__stream_reusable(st))
                *out = st;
            else
                shmipc__stream_close_handle(st);
        }
        if (*out == NULL)
            rc = shmipc__session_open_stream(p->s, out);
    }
    mgr_unlock(m);
    manager_leave(m);
    return rc;
}

void shmipc__manager_put_back(shmipc_session_manager *m, shmipc_stream *st)
{
    /* A stream shut down is of no use to the next taker: it fails every call. */
    /*
     * Nor is a manager being closed any more: nothing is pooled after its pools went. The
     * stream's session keeps the manager until the close below (pool_connect), so this holds
     * also after the close returned; that close may free it.
     */
    if ((__atomic_load_n(&st->inuse, __ATOMIC_ACQUIRE) & SHMIPC__STREAM_SHUT) ||
        manager_enter(m) < 0) {
        shmipc__stream_close_handle(st);
        return;
    }
    mgr_lock(m);
    struct shmipc__pool *p = NULL;
    for (uint32_t i = 0; i < m->npools && !__atomic_load_n(&m->closing, __ATOMIC_ACQUIRE); i++)
        if (m->pools[i].s == st->s)
            p = &m->pools[i];
    /* The session's lock is taken under ours (lock order: shmipc__stream_reusable()). */
    int ok = p != NULL && p->nidle < m->cfg.max_stream_num && shmipc__stream_reusable(st);
    if (ok) {
        st->read_timeout_ms = shmipc__stream_timeout(m->cfg.timeout_ms[SHMIPC_TIMEOUT_READ]);
        st->write_timeout_ms = shmipc__stream_timeout(m->cfg.timeout_ms[SHMIPC_TIMEOUT_WRITE]);
        p->idle[p->nidle++] = st;
    }
    mgr_unlock(m);
    if (!ok)
        shmipc__stream_close_handle(st);
    manager_leave(m);
}

/*
 * Closing while other threads are in get_stream or put_back (a pool shared by workers, closed
 * by the main thread): it used to free the manager under them, a reconnect in flight among
 * them (a use after free, and a destroyed lock held). Now new calls are refused, the sessions
 * are closed at once (or after a reconnect in flight: it holds mu), and the last reference to
 * leave frees the manager: the user's handle (dropped here), each call in flight, and each
 * session not yet freed (pool_connect), which a stream taken from the pool keeps. So a stream
 * given back after the close, even one whose call began after it, finds the manager and is
 * closed. A second close while the manager lives drops nothing more.
 */
void shmipc__manager_close(shmipc_session_manager *m)
{
    /*
     * A fork child's copy (common/proc.h): no lock (a reconnect in a parent thread may have held
     * mu at the fork, for good in the child). The pools' streams and sessions are the parent's,
     * so their closes release the child's copies only.
     */
    if (shmipc__foreign(m->pid)) {
        if (m->closing)
            return;
        m->closing = 1;
        for (uint32_t i = 0; i < m->npools; i++)
            drop_pool(&m->pools[i]);
        manager_leave(m);
        return;
    }
    pthread_mutex_lock(&m->life_mu);
    int again = __atomic_exchange_n(&m->closing, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&m->life_mu);
    if (again)
        return;
    mgr_lock(m);
    for (uint32_t i = 0; i < m->npools; i++)
        drop_pool(&m->pools[i]);
    mgr_unlock(m);
    manager_leave(m);
}
