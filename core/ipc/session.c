/*
 * Sessions (reference §3): a session's life. Allocation, start after the handshake
 * (connect, accept on an fd, the fallback to the legacy protocol), the session's error
 * (fail_locked: the one place it is set), the shared-memory checks, the references and
 * destroy. See session.h for locking and processing.
 *
 * May call: common/, shm/, ipc/proto, ipc/sockio, ipc/v4probe, and the other session rooms
 * through session_int.h.
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
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static int session_alloc(const shmipc_config *cfg, int role, shmipc_session **out)
{
    shmipc_session *s = calloc(1, sizeof *s);
    pthread_condattr_t ca;
    if (s == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "session: out of memory");
    s->fd = -1;
    s->efd_send = s->efd_recv = s->event_fd = s->timer_fd = s->kick_fd = -1;
    s->wakeup = SHMIPC_WAKEUP_SOCKET;
    s->role = role;
    s->refs = 1;
    s->pid = shmipc__pid();
    s->next_stream_id = FIRST_CLIENT_STREAM_ID;
    /* The stream table's secret (session.h). Without entropy yet, something a peer cannot see. */
    if (getrandom(&s->hash_seed, sizeof s->hash_seed, GRND_NONBLOCK) != sizeof s->hash_seed)
        s->hash_seed =
            (uint32_t)(shmipc__now_ns() ^ (uint64_t)(uintptr_t)s ^ ((uint64_t)(uintptr_t)s >> 32));
    shmipc__mapping_init(&s->buffer_map);
    shmipc__mapping_init(&s->queue_map);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->send_mu, NULL);
    pthread_mutex_init(&s->cache_mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cond, &ca);
    pthread_condattr_destroy(&ca);
    if (cfg != NULL) {
        s->cfg = *cfg;
    } else {
        shmipc_config *def;
        int rc = shmipc__config_new(&def);
        if (rc < 0) {
            free(s);
            return rc;
        }
        s->cfg = *def;
        shmipc__config_free(def);
    }
    *out = s;
    return 0;
}

void shmipc__session_free_chunks(shmipc_session *s, shmipc_stream *st, uint32_t from, uint32_t to)
{
    for (uint32_t i = from; i < to; i++) {
        struct shmipc__chunk *c = &st->chunks[i];
        if (c->slice == SHMIPC__HEAP_CHUNK) {
            s->fallback_held -= c->len + SHMIPC__FALLBACK_CHUNK_COST;
            free(c->data - c->head);
            continue;
        }
        /*
         * Give slices back while the buffer is in use; a dead session discards it. A slice
         * kept in the cache is still ours: it stays marked held, so neither the peer can
         * announce it nor a pop hand it out while it waits there. A freed one is unmarked by
         * the free, before the push: unmarking after it could erase the mark of a thread
         * that popped it meanwhile.
         */
        if (shmipc__session_err(s) == 0 || s->role == SHMIPC__CLIENT)
            (void)shmipc__session_cache_put(s, c->slice);
        else
            shmipc__held_drop(&s->bm, s->held, c->slice);
    }
}

void shmipc__session_free_segments(shmipc_session *s, shmipc_stream *st)
{
    for (uint32_t i = 0; i < st->nsegs; i++) {
        if (st->segs[i].slice == SHMIPC__HEAP_CHUNK)
            free(st->segs[i].data);
        else
            shmipc__buffer_free(&s->bm, st->segs[i].slice);
    }
    st->nsegs = 0;
    st->send_len = 0;
    st->reserved_len = 0;
}

void shmipc__stream_free_memory(shmipc_stream *st)
{
    free(st->chunks);
    free(st->segs);
    free(st->scratch);
    free(st);
}

/*
 * The fork rule (common/proc.h): in a process that did not make the session, a stream's received
 * data is let go of without a word to shared memory: the slices are the maker's to give back
 * (a copy of the maker's slice cache and held marks is all this process has), heap copies are
 * this process's own.
 */
void shmipc__stream_free_local(shmipc_stream *st)
{
    for (uint32_t i = 0; i < st->nchunks; i++)
        if (st->chunks[i].slice == SHMIPC__HEAP_CHUNK)
            free(st->chunks[i].data - st->chunks[i].head);
    for (uint32_t i = 0; i < st->nsegs; i++)
        if (st->segs[i].slice == SHMIPC__HEAP_CHUNK)
            free(st->segs[i].data);
    shmipc__stream_free_memory(st);
}

static void session_destroy(shmipc_session *s)
{
    int foreign = shmipc__session_foreign(s);
    /* Streams left here were never handed out: the peer opened them, nobody accepted them. */
    for (uint32_t b = 0; b < s->nbuckets; b++) {
        shmipc_stream *st = s->buckets[b];
        while (st != NULL) {
            shmipc_stream *next = st->next_in_bucket;
            if (foreign) {
                shmipc__stream_free_local(st);
            } else {
                shmipc__session_free_chunks(s, st, 0, st->nchunks);
                shmipc__stream_free_memory(st);
            }
            st = next;
        }
    }
    /* Kept slices go back: a server's peer may go on using its buffer for a while. (Not from a
     * fork child: the slices it has copies of are its parent's, which keeps or frees them.) */
    if (s->bm.base != NULL && !foreign)
        shmipc__session_trim(s);
    for (uint32_t l = 0; l < SHMIPC__BM_MAX_LISTS; l++)
        free(s->cache[l].off);
    s->bm.held = NULL;
    free(s->held);
    free(s->buckets);
    free(s->accept_q);
    free(s->ready);
    free(s->closes_due);
    free(s->rbuf);
    /* Only the very files that were mapped: a name the peer swapped since stays. And only by
     * the process that made the session: a fork child's copy leaves them to its parent. */
    if (s->unlink_files && !foreign) {
        shmipc__mapping_remove(&s->buffer_map);
        shmipc__mapping_remove(&s->queue_map);
    }
    shmipc__mapping_unmap(&s->buffer_map);
    shmipc__mapping_unmap(&s->queue_map);
    if (s->event_fd >= 0 && s->event_fd != s->fd)
        close(s->event_fd);
    if (s->timer_fd >= 0)
        close(s->timer_fd);
    if (s->kick_fd >= 0)
        close(s->kick_fd);
    if (s->efd_send >= 0)
        close(s->efd_send);
    if (s->efd_recv >= 0)
        close(s->efd_recv);
    if (s->fd >= 0)
        close(s->fd);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->send_mu);
    pthread_mutex_destroy(&s->cache_mu);
    void (*on_free)(void *) = s->on_free;
    void *arg = s->on_free_arg;
    free(s);
    if (on_free != NULL)
        on_free(arg);
}

void shmipc__session_on_free(shmipc_session *s, void (*fn)(void *arg), void *arg)
{
    s->on_free = fn;
    s->on_free_arg = arg;
}

void shmipc__session_release(shmipc_session *s)
{
    /*
     * In a fork child without the lock (common/proc.h). mu is taken bare, not by
     * shmipc__session_lock(): nothing logs while the count drops, so no record waits for it.
     */
    if (shmipc__unref(s->pid, &s->mu, &s->refs))
        session_destroy(s);
}

/* Ends the session with `code` (first cause wins) and wakes every waiter. Under mu. */
int shmipc__session_fail_locked(shmipc_session *s, int code)
{
    if (shmipc__session_err(s) == 0) {
        /*
         * A damaged mapping explains whatever else failed: the SIGBUS guard shut the socket
         * down, so a send or recv that meets that must not hide the cause.
         */
        if (shmipc__session_memory_damaged(s))
            code = shmipc__fail(SHMIPC_EPROTO,
                                "shared memory %s: the file shrank under the mapping (SIGBUS "
                                "caught); the peer truncated it",
                                shmipc__mapping_damaged(&s->buffer_map) ? s->buffer_path
                                                                        : s->queue_path);
        /* Atomic: shmipc_session_status() reads it without the lock (why is read under it). */
        snprintf(s->why, sizeof s->why, "%s", shmipc__detail());
        __atomic_store_n(&s->err, code, __ATOMIC_RELEASE);
        SHMIPC__LOG(code == SHMIPC_ECLOSED ? SHMIPC__LOG_DEBUG : SHMIPC__LOG_INFO,
                    "session %s ended: %s (%s)", s->buffer_path, shmipc__errname(code),
                    shmipc__detail());
        /*
         * Wakes a processor blocked in poll() and shows the peer the end at once. Not in a fork
         * child: the socket is shared with the parent, whose session the peer would see end.
         */
        if (s->fd >= 0 && !shmipc__session_foreign(s))
            shutdown(s->fd, SHUT_RDWR);
        for (uint32_t b = 0; s->track_ready && b < s->nbuckets; b++)
            for (shmipc_stream *st = s->buckets[b]; st != NULL; st = st->next_in_bucket)
                shmipc__session_note_ready_locked(s, st->id);
        pthread_cond_broadcast(&s->cond);
    }
    return shmipc__session_err(s);
}

/* The session's end as a fresh failure detail, for calls made after it ended. */
int shmipc__session_ended(shmipc_session *s)
{
    if (shmipc__session_err(s) == SHMIPC_ECLOSED) /* closed or shut down locally */
        return shmipc__fail(SHMIPC_ECLOSED, "%s", s->why);
    return shmipc__fail(shmipc__session_err(s), "session ended: %s", s->why);
}

/*
 * The SIGBUS guard's verdict (shm/guard.h): when the peer shrank a file under one of our
 * mappings, its pages are private zeros now, nothing more can be exchanged, and data already
 * delivered from it may read as zeros. Ends the session then. Under mu.
 */
int shmipc__session_check_memory_locked(shmipc_session *s)
{
    if (!shmipc__session_memory_damaged(s))
        return 0;
    shmipc__session_fail_locked(s, SHMIPC_EPROTO); /* which names the damage */
    return shmipc__session_ended(s);
}

/* shmipc__session_check_memory_locked() for a caller that does not hold mu. */
int shmipc__session_check_memory(shmipc_session *s)
{
    shmipc__session_lock(s);
    int rc = shmipc__session_check_memory_locked(s);
    shmipc__session_unlock(s);
    return rc;
}

/*
 * What an event loop watches. Legacy and V4 socket wakeups: the socket. V4 eventfd wakeups:
 * an epoll set of the socket and our receive eventfd. V4 polling: the socket and a timerfd
 * that fires every negotiated interval, because then nothing else says the queue has work.
 */
static int setup_event_fd(shmipc_session *s)
{
    int extra = s->wakeup == SHMIPC_WAKEUP_EVENTFD ? s->efd_recv : -1;
    if (s->wakeup == SHMIPC_WAKEUP_SOCKET) {
        s->event_fd = s->fd;
        return 0;
    }
    if (s->wakeup == SHMIPC_WAKEUP_POLLING) {
        struct itimerspec its = {{0, (long)s->interval_us * 1000},
                                 {0, (long)s->interval_us * 1000}};
        if (s->interval_us >= 1000000)
            its.it_interval = its.it_value = (struct timespec){1, 0};
        if ((s->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK)) < 0 ||
            timerfd_settime(s->timer_fd, 0, &its, NULL) < 0)
            return shmipc__fail_errno(errno, "session: timerfd");
        extra = s->timer_fd;
    }
    if ((s->event_fd = epoll_create1(EPOLL_CLOEXEC)) < 0)
        return shmipc__fail_errno(errno, "session: epoll_create1");
    /*
     * The wakeup eventfd is edge-triggered and never read: one epoll_wait on the set says
     * which fired, and its counter may grow unread (it saturates only after 2^64 - 2 wakeups,
     * and a saturated write means "pending" anyway). A periodic timerfd must be read to
     * re-arm, so the timer stays level-triggered and is read when it fires.
     */
    struct epoll_event a = {.events = EPOLLIN, .data.fd = s->fd};
    struct epoll_event b = {.events = EPOLLIN | (extra == s->efd_recv ? EPOLLET : 0u),
                            .data.fd = extra};
    /* A stream shutdown's kick wakes a processor in epoll_wait; it is read when it fires. */
    struct epoll_event k = {.events = EPOLLIN, .data.fd = s->kick_fd};
    if (epoll_ctl(s->event_fd, EPOLL_CTL_ADD, s->fd, &a) < 0 ||
        epoll_ctl(s->event_fd, EPOLL_CTL_ADD, extra, &b) < 0 ||
        epoll_ctl(s->event_fd, EPOLL_CTL_ADD, s->kick_fd, &k) < 0)
        return shmipc__fail_errno(errno, "session: epoll_ctl");
    return 0;
}

static int session_start(shmipc_session *s, int client)
{
    uint64_t deadline = shmipc__wait_deadline(s->cfg.timeout_ms[SHMIPC_TIMEOUT_INITIALIZE]);
    int rc = client ? shmipc__handshake_client(s, deadline) : shmipc__handshake_server(s, deadline);
    if (rc < 0)
        return rc;
    s->nbuckets = 16;
    s->buckets = calloc(s->nbuckets, sizeof *s->buckets);
    if (s->buckets == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "session: out of memory");
    /*
     * What wakes a processor that waits for the socket (or the epoll set) when a stream is shut
     * down from another thread: nothing else would, the session itself goes on.
     */
    if ((s->kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
        return shmipc__fail_errno(errno, "session: eventfd");
    if ((rc = setup_event_fd(s)) < 0)
        return rc;
    /* A SIGBUS in our mappings (shm/guard.h) shuts the socket: every waiter wakes and sees it. */
    shmipc__mapping_set_wake_fd(&s->buffer_map, s->fd);
    shmipc__mapping_set_wake_fd(&s->queue_map, s->fd);
    shmipc__session_cache_init(s);
    /* From the first pop on: a pop that hands out a slice in our hands ends the session. */
    if ((s->held = shmipc__held_new(&s->bm)) == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "session: out of memory for the slice record");
    s->bm.held = s->held;
    /*
     * From here on every read and write says MSG_DONTWAIT unless it means to block: a blocking
     * socket lets a waiting processor sleep in recv() itself, one system call instead of two.
     */
    int flags = fcntl(s->fd, F_GETFL);
    if (flags < 0 || fcntl(s->fd, F_SETFL, flags & ~O_NONBLOCK) < 0)
        return shmipc__fail_errno(errno, "session: fcntl");
    SHMIPC__LOG(SHMIPC__LOG_DEBUG, "session %s up: %s, version %u, wakeup %d", s->buffer_path,
                client ? "client" : "server", s->version, s->wakeup);
    return 0;
}

/* One connection attempt with the protocol `cfg` asks for. */
static int connect_once(const struct shmipc__addr *addr, const shmipc_config *cfg,
                        shmipc_session **out)
{
    shmipc_session *s;
    int rc;
    if ((rc = session_alloc(cfg, SHMIPC__CLIENT, &s)) < 0)
        return rc;
    if (s->cfg.memmap_type == SHMIPC_MEMMAP_MEMFD && addr->family != AF_UNIX) {
        session_destroy(s);
        return shmipc__fail(SHMIPC_EINVAL, "connect %s: memfd needs a unix socket", addr->text);
    }
    rc = shmipc__sock_connect(addr,
                              shmipc__wait_deadline(s->cfg.timeout_ms[SHMIPC_TIMEOUT_INITIALIZE]));
    if (rc < 0) {
        session_destroy(s);
        return rc;
    }
    s->fd = rc;
    if ((rc = session_start(s, 1)) < 0) {
        session_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

/*
 * Failures of V4 set-up "on the network or protocol level", after which a client with
 * fallback retries legacy: the peer hung up or reset (a legacy server does so on version 0),
 * said nothing in time, or answered something that is not V4. Never an explicit rejection.
 */
static int fallback_allowed(int rc)
{
    return rc == SHMIPC_ECONNRESET || rc == SHMIPC_ETIMEDOUT || rc == SHMIPC_EPROTO ||
           rc == SHMIPC_EVERSION || rc == SHMIPC_EIO;
}

int shmipc__session_connect(const char *address, const shmipc_config *cfg, shmipc_session **out)
{
    struct shmipc__addr addr;
    int rc;
    if (cfg != NULL && (rc = shmipc__config_validate(cfg)) < 0)
        return rc;
    if ((rc = shmipc__addr_parse(address, &addr)) < 0)
        return rc;
    int probe = cfg != NULL && cfg->protocol == SHMIPC_PROTOCOL_V4 && cfg->fallback;
    /* A peer that fell back lately speaks only V2/V3: skip the V4 probe (docs/interop.md). */
    int known = probe && shmipc__v4_legacy_known(address);
    rc = known ? SHMIPC_EVERSION : connect_once(&addr, cfg, out);
    if (rc == 0 && probe && (*out)->version == 4)
        shmipc__v4_legacy_forget(address);
    if (rc < 0 && probe && fallback_allowed(rc)) {
        struct shmipc_config legacy = *cfg;
        if (!known)
            SHMIPC__LOG(SHMIPC__LOG_INFO, "connect %s: V4 set-up failed (%s: %s); retrying legacy",
                        address, shmipc__errname(rc), shmipc__detail());
        legacy.protocol = SHMIPC_PROTOCOL_LEGACY;
        legacy.fallback = 0;
        legacy.wakeup = SHMIPC_WAKEUP_SOCKET;
        legacy.polling_interval_us = 0;
        rc = connect_once(&addr, &legacy, out);
        if (rc == 0 && !known)
            shmipc__v4_legacy_remember(address);
    }
    return rc;
}

int shmipc__session_accept_fd(int fd, const shmipc_config *cfg, shmipc_session **out)
{
    shmipc_session *s;
    int rc = session_alloc(cfg, SHMIPC__SERVER, &s);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    s->fd = fd;
    if ((rc = session_start(s, 0)) < 0) {
        session_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

void shmipc__session_close(shmipc_session *s)
{
    /* A fork child's copy: released here, the parent's session untouched (common/proc.h). */
    if (shmipc__session_foreign(s)) {
        shmipc__session_release(s);
        return;
    }
    shmipc__session_lock(s);
    shmipc__session_fail_locked(s, shmipc__fail(SHMIPC_ECLOSED, "session: closed locally"));
    shmipc__session_unlock(s);
    /* Calls still in flight hold references of their own: the last one out frees it. */
    shmipc__session_release(s);
}

/*
 * Ending the session wakes every waiter: shmipc__session_fail_locked() shuts the socket down (a processor in
 * poll or epoll_wait wakes) and broadcasts `cond` (the others). A session that ended already
 * keeps its cause.
 */
int shmipc__session_shutdown(shmipc_session *s)
{
    shmipc__session_lock(s);
    if (shmipc__session_err(s) == 0)
        shmipc__session_fail_locked(s, shmipc__fail(SHMIPC_ECLOSED, "session: shut down locally"));
    shmipc__session_unlock(s);
    return 0;
}

void shmipc__session_track_ready(shmipc_session *s)
{
    shmipc__session_lock(s);
    s->track_ready = 1;
    shmipc__session_unlock(s);
}

/* Swaps the caller's id array with the session's, so no copy and no allocation per turn. */
uint32_t shmipc__session_take_ready(shmipc_session *s, uint32_t **ids, uint32_t *cap)
{
    shmipc__session_lock(s);
    uint32_t n = s->nready;
    uint32_t *mine = *ids, mine_cap = *cap;
    *ids = s->ready;
    *cap = s->ready_cap;
    s->ready = mine;
    s->ready_cap = mine_cap;
    s->nready = 0;
    shmipc__session_unlock(s);
    return n;
}

void shmipc__session_set_watched(shmipc_session *s)
{
    shmipc__session_lock(s);
    s->watched = 1;
    shmipc__session_unlock(s);
}

void shmipc__session_set_loop_driven(shmipc_session *s)
{
    shmipc__session_lock(s);
    s->loop_driven = 1;
    shmipc__session_unlock(s);
}
