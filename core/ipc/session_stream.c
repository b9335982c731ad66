/*
 * Streams: the stream table (id -> stream, under mu), opening and accepting streams, and
 * the stream lifecycle. Every change of a stream's state is made in this file:
 *
 *   st->state (receive side, under mu; read by the writer with an atomic load)
 *     OPEN --------(the peer's close: queue element or StreamClose)--------> PEER_CLOSED
 *       shmipc__stream_peer_closed_locked(); no way back.
 *   st->fallback (the send/receive path, atomic)
 *     shared memory --(fallback data received, or a flush that fell back)--> socket, for good
 *       shmipc__stream_set_fallback(); no way back.
 *   st->inuse marks (the user's handle, atomic; any thread)
 *     live --shmipc__stream_shutdown()--> SHUT --shmipc__stream_close_handle()--> CLOSING
 *       (close_handle sets SHUT and CLOSING at once); CLOSING frees the stream when the last
 *       call in flight leaves (shmipc__stream_leave -> shmipc__stream_close).
 *   in the table (in_table) from stream_new/insert until shmipc__stream_close removes it.
 *
 * May call: common/, the session room (references, error), the wait engine (accept) and the
 * write room (send_close) through session_int.h.
 */
#include "ipc/session_int.h"

#include "common/clock.h"
#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "ipc/proto.h"
#include "ipc/sockio.h"
#include "ipc/v4probe.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/*
 * The bucket of `id` among `n`: the id mixed with the session's secret by MurmurHash3's
 * finalizer, whose every output bit depends on every input bit. (Knuth's id * 2654435761 kept
 * only low bits, which depend only on the id's low bits: ids k << 20 all shared bucket 0.)
 */
static uint32_t hash_bucket(uint32_t seed, uint32_t id, uint32_t n)
{
    uint32_t h = id ^ seed;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h & (n - 1);
}

static uint32_t bucket_of(const shmipc_session *s, uint32_t id)
{
    return hash_bucket(s->hash_seed, id, s->nbuckets);
}

shmipc_stream *shmipc__session_lookup_locked(shmipc_session *s, uint32_t id)
{
    shmipc_stream *st = s->buckets[bucket_of(s, id)];
    while (st != NULL && st->id != id)
        st = st->next_in_bucket;
    return st;
}

int shmipc__session_insert_locked(shmipc_session *s, shmipc_stream *st)
{
    if (s->nstreams + 1 > s->nbuckets / 4 * 3) {
        uint32_t n = s->nbuckets * 2;
        shmipc_stream **nb = calloc(n, sizeof *nb);
        if (nb == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "session: out of memory for the stream table");
        for (uint32_t b = 0; b < s->nbuckets; b++) {
            shmipc_stream *it = s->buckets[b];
            while (it != NULL) {
                shmipc_stream *next = it->next_in_bucket;
                uint32_t h = hash_bucket(s->hash_seed, it->id, n);
                it->next_in_bucket = nb[h];
                nb[h] = it;
                it = next;
            }
        }
        free(s->buckets);
        s->buckets = nb;
        s->nbuckets = n;
    }
    uint32_t h = bucket_of(s, st->id);
    st->next_in_bucket = s->buckets[h];
    s->buckets[h] = st;
    st->in_table = 1;
    s->nstreams++;
    return 0;
}

static void remove_locked(shmipc_session *s, shmipc_stream *st)
{
    shmipc_stream **p = &s->buckets[bucket_of(s, st->id)];
    while (*p != NULL && *p != st)
        p = &(*p)->next_in_bucket;
    if (*p == st) {
        *p = st->next_in_bucket;
        s->nstreams--;
    }
    st->in_table = 0;
}

shmipc_stream *shmipc__stream_new(shmipc_session *s, uint32_t id)
{
    shmipc_stream *st = calloc(1, sizeof *st);
    if (st == NULL)
        return NULL;
    st->s = s;
    st->id = id;
    st->read_timeout_ms = shmipc__stream_timeout(s->cfg.timeout_ms[SHMIPC_TIMEOUT_READ]);
    st->write_timeout_ms = shmipc__stream_timeout(s->cfg.timeout_ms[SHMIPC_TIMEOUT_WRITE]);
    return st;
}

/* OPEN -> PEER_CLOSED: the peer closed stream `id`. Under mu (receive dispatch). */
void shmipc__stream_peer_closed_locked(shmipc_session *s, uint32_t id)
{
    shmipc_stream *st = shmipc__session_lookup_locked(s, id);
    /* The peer closing a stream we closed already (or never knew) is normal: ignore it. */
    if (st != NULL) {
        /* Atomic: the writer's flush reads it without mu. */
        __atomic_store_n(&st->state, (uint8_t)SHMIPC__STREAM_PEER_CLOSED, __ATOMIC_RELAXED);
        shmipc__session_note_ready_locked(s, id);
    }
}

/*
 * Shared memory -> socket, for good: fallback data arrived for the stream (receive dispatch,
 * under mu), or a flush found shared memory short and sent over the socket (the writer).
 * Atomic: the writer and the pool's reuse check read it without mu.
 */
void shmipc__stream_set_fallback(shmipc_stream *st)
{
    __atomic_store_n(&st->fallback, 1, __ATOMIC_RELAXED);
}

shmipc_stream *shmipc__session_handed_out(shmipc_session *s, uint32_t id)
{
    shmipc__session_lock(s);
    shmipc_stream *st = shmipc__session_lookup_locked(s, id);
    /* Streams still waiting in the accept queue are not the user's yet. */
    for (uint32_t i = 0; st != NULL && i < s->accept_len; i++)
        if (s->accept_q[(s->accept_head + i) % s->accept_cap] == st)
            st = NULL;
    /*
     * Counted in under mu, while the table still holds it (its free comes after its removal,
     * under mu): the holder may close it on another thread while the caller's callback runs,
     * and the stream must outlive that callback (calls on it then fail with SHMIPC_ECLOSED).
     * One the user closed already is skipped: its holder has let it go.
     */
    if (st != NULL) {
        uint32_t v = __atomic_load_n(&st->inuse, __ATOMIC_RELAXED);
        do {
            if (v & SHMIPC__STREAM_CLOSING) {
                st = NULL;
                break;
            }
        } while (!__atomic_compare_exchange_n(&st->inuse, &v, v + 1, 1, __ATOMIC_ACQ_REL,
                                              __ATOMIC_RELAXED));
    }
    shmipc__session_unlock(s);
    return st;
}

int shmipc__session_open_stream(shmipc_session *s, shmipc_stream **out)
{
    int rc = 0;
    if (s->role != SHMIPC__CLIENT)
        return shmipc__fail(SHMIPC_ENOTSUP, "open_stream: only clients open streams");
    shmipc__session_lock(s);
    if (shmipc__session_err(s)) {
        rc = shmipc__session_ended(s);
    } else if (shmipc__now_ns() < s->unhealthy_until_ns) {
        rc = shmipc__fail(SHMIPC_EUNHEALTHY,
                          "open_stream: shared memory ran out and data went over the socket; "
                          "new streams are refused for 30 s");
    } else {
        uint32_t tries = 0;
        /* Ids are never reused while in use; at u32 wrap-around skip the ones still open. */
        while (shmipc__session_lookup_locked(s, s->next_stream_id) != NULL ||
               s->next_stream_id < 2) {
            s->next_stream_id++;
            if (++tries == 0)
                break;
        }
        shmipc_stream *st = NULL;
        if (s->nstreams >= UINT32_MAX - 2)
            rc = shmipc__fail(SHMIPC_ESTREAMS, "open_stream: every stream id is in use");
        else if ((st = shmipc__stream_new(s, s->next_stream_id++)) == NULL)
            rc = shmipc__fail(SHMIPC_ENOMEM, "open_stream: out of memory");
        else if ((rc = shmipc__session_insert_locked(s, st)) < 0)
            free(st);
        else {
            s->refs++;
            *out = st;
        }
    }
    shmipc__session_unlock(s);
    return rc;
}

/* Pops the oldest stream the peer opened, handing it out; 0 when there was none. Under mu. */
static int pop_accepted_locked(shmipc_session *s, shmipc_stream **out)
{
    if (s->accept_len == 0)
        return 0;
    *out = s->accept_q[s->accept_head];
    s->accept_head = (s->accept_head + 1) % s->accept_cap;
    s->accept_len--;
    s->refs++;
    return 1;
}

int shmipc__session_accept_queued(shmipc_session *s, shmipc_stream **out)
{
    int rc = SHMIPC_EAGAIN;
    if (s->role != SHMIPC__SERVER)
        return shmipc__fail(SHMIPC_ENOTSUP, "accept_stream: only servers accept streams");
    shmipc__session_lock(s);
    /*
     * Under mu, so a plain read: gcc 12 with ASan misreports the atomic load of
     * shmipc__session_err() here as a stringop overflow (-Werror broke the ASan build).
     */
    if (pop_accepted_locked(s, out))
        rc = 0;
    else if (s->err)
        rc = shmipc__session_ended(s);
    shmipc__session_unlock(s);
    return rc;
}

int shmipc__session_accept_stream(shmipc_session *s, int timeout_ms, shmipc_stream **out)
{
    int rc = 0;
    uint64_t deadline = timeout_ms > 0 ? shmipc__deadline_ms((uint64_t)timeout_ms) : 0;
    if (s->role != SHMIPC__SERVER)
        return shmipc__fail(SHMIPC_ENOTSUP, "accept_stream: only servers accept streams");
    shmipc__session_lock(s);
    s->refs++; /* a close from another thread meanwhile frees the session when we leave */
    for (;;) {
        if (pop_accepted_locked(s, out)) {
            rc = 0;
            break;
        }
        if (shmipc__session_err(s)) {
            rc = shmipc__session_ended(s);
            break;
        }
        if (timeout_ms == 0) {
            if (!s->processing && !s->loop_driven && !shmipc__session_fresh_locked(s)) {
                s->processing = 1;
                rc = shmipc__session_process_locked(s);
                s->processing = 0;
                if (rc >= 0 && s->accept_len > 0)
                    continue;
            }
            rc = shmipc__session_err(s)
                     ? shmipc__session_ended(s)
                     : shmipc__fail(SHMIPC_EAGAIN, "accept_stream: no new stream");
            break;
        }
        if ((rc = shmipc__session_wait_locked(s, deadline)) < 0) {
            if (rc == shmipc__session_err(s))
                rc = shmipc__session_ended(s);
            break;
        }
    }
    shmipc__session_unlock(s);
    shmipc__session_release(s);
    return rc;
}

/*
 * Waits until the stream has `need` unread bytes or can have no more. Under mu. Returns 0
 * when the bytes are there, SHMIPC_EEOF, SHMIPC_EAGAIN (non-blocking), SHMIPC_ETIMEDOUT, or
 * the code that ended the session.
 */
int shmipc__stream_shut_error(const shmipc_stream *st)
{
    return shmipc__fail(SHMIPC_ECLOSED, "stream %u: shut down locally", st->id);
}

int shmipc__stream_is_shut(const shmipc_stream *st)
{
    return (__atomic_load_n(&st->inuse, __ATOMIC_ACQUIRE) & SHMIPC__STREAM_SHUT) != 0;
}

void shmipc__stream_close(shmipc_stream *st)
{
    shmipc_session *s = st->s;
    if (shmipc__session_err(s) == 0 && !st->close_sent)
        shmipc__stream_send_close(st);
    shmipc__session_free_segments(s, st);
    shmipc__session_lock(s);
    if (st->in_table)
        remove_locked(s, st);
    shmipc__session_free_chunks(s, st, 0, st->nchunks);
    shmipc__session_unlock(s);
    shmipc__stream_free_memory(st);
    shmipc__session_release(s);
}

int shmipc__stream_enter(shmipc_stream *st, int even_shut)
{
    uint32_t v = __atomic_load_n(&st->inuse, __ATOMIC_RELAXED);
    uint32_t refuse = SHMIPC__STREAM_CLOSING | (even_shut ? 0 : SHMIPC__STREAM_SHUT);
    do {
        if (v & refuse)
            return v & SHMIPC__STREAM_CLOSING
                       ? shmipc__fail(SHMIPC_ECLOSED, "stream %u: closed", st->id)
                       : shmipc__stream_shut_error(st);
        /*
         * Far below the marks: close_handle and every shutdown count in without this check
         * (a byte-wide count carried into the marks with 62 calls in flight and a close).
         */
        if ((v & SHMIPC__STREAM_BUSY_MASK) >= SHMIPC__STREAM_BUSY_MASK - 1)
            return shmipc__fail(SHMIPC_EBUSY, "stream %u: too many threads in it", st->id);
    } while (
        !__atomic_compare_exchange_n(&st->inuse, &v, v + 1, 1, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED));
    return 0;
}

void shmipc__stream_leave(shmipc_stream *st)
{
    uint32_t v = __atomic_sub_fetch(&st->inuse, 1, __ATOMIC_ACQ_REL);
    /* The close came while we were in: it left the stream to the last call out. */
    if ((v & SHMIPC__STREAM_BUSY_MASK) == 0 && (v & SHMIPC__STREAM_CLOSING))
        shmipc__stream_close(st);
}

/*
 * Marks the stream shut, then wakes its waiters: a follower on `cond` by the broadcast, a
 * processor in poll or epoll_wait by the kick (it reads the kick and looks again). The mark
 * is set before mu is taken, and waiters look at it under mu before they wait, so none misses
 * it. Any thread, any number of times.
 */
int shmipc__stream_shutdown(shmipc_stream *st)
{
    shmipc_session *s = st->s;
    /* A fork child's copy: marked, and nothing woken (the kick eventfd is the parent's too). */
    if (shmipc__session_foreign(s)) {
        __atomic_fetch_or(&st->inuse, SHMIPC__STREAM_SHUT, __ATOMIC_ACQ_REL);
        return 0;
    }
    /* Counted in, so that a close from another thread meanwhile frees nothing under us. */
    __atomic_add_fetch(&st->inuse, 1, __ATOMIC_ACQ_REL);
    __atomic_fetch_or(&st->inuse, SHMIPC__STREAM_SHUT, __ATOMIC_ACQ_REL);
    shmipc__session_lock(s);
    if (s->processing && s->kick_fd >= 0) {
        uint64_t one = 1;
        /* EAGAIN: the counter is saturated, a kick is pending anyway. */
        (void)!write(s->kick_fd, &one, sizeof one);
    }
    pthread_cond_broadcast(&s->cond);
    shmipc__session_unlock(s);
    shmipc__stream_leave(st);
    return 0;
}

/*
 * The receive path writes the fields looked at here (state, fallback, unread, nchunks) under mu
 * on whichever thread processes the session, so they are read under mu too. Lock order: the
 * session manager calls this holding its own lock (manager's lock, then mu); nothing that holds
 * mu takes the manager's lock (the session does not know the manager, and log lines under either
 * lock reach the sink after both are dropped). The send side (send_len, nsegs) belongs to the
 * thread giving the stream back. A stream the peer closed (state), with data left (unread,
 * nchunks), on the socket for good (fallback), shut down, or whose session ended is refused.
 */
int shmipc__stream_reusable(shmipc_stream *st)
{
    shmipc_session *s = st->s;
    shmipc__session_lock(s);
    int ok = st->state == SHMIPC__STREAM_OPEN &&
             !__atomic_load_n(&st->fallback, __ATOMIC_RELAXED) && st->unread == 0 &&
             st->nchunks == 0 && st->send_len == 0 && st->nsegs == 0 &&
             (__atomic_load_n(&st->inuse, __ATOMIC_ACQUIRE) & SHMIPC__STREAM_SHUT) == 0 &&
             shmipc__session_err(s) == 0;
    shmipc__session_unlock(s);
    return ok;
}

void shmipc__stream_close_handle(shmipc_stream *st)
{
    /*
     * A fork child's copy of its parent's stream (common/proc.h): no close element, no slice
     * given back, no lock; out of the copy of the table and freed at once. A call the parent
     * had in flight on it at the fork has no thread here, so its count is not waited for.
     */
    if (shmipc__session_foreign(st->s)) {
        shmipc_session *s = st->s;
        if (st->in_table)
            remove_locked(s, st); /* the child's copy of the table; no lock (fork rule) */
        shmipc__stream_free_local(st);
        shmipc__session_release(s);
        return;
    }
    /*
     * Counted in as a call of its own, so that a call in flight that leaves meanwhile cannot
     * free the stream under the wakeup; the last one out (maybe this one) frees it.
     */
    __atomic_add_fetch(&st->inuse, 1, __ATOMIC_ACQ_REL);
    __atomic_fetch_or(&st->inuse, SHMIPC__STREAM_CLOSING | SHMIPC__STREAM_SHUT, __ATOMIC_ACQ_REL);
    shmipc__stream_shutdown(st);
    shmipc__stream_leave(st);
}
