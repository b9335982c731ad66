/*
 * Sessions and streams (reference §3): stream multiplexing over the queue pair, the socket's
 * control messages after the handshake, fallback over the socket, and the leader/follower
 * event processing described in session.h.
 */
#include "ipc/session.h"

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

#define FIRST_CLIENT_STREAM_ID 2u
#define BREAKER_NS             (30ull * 1000000000ull)
#define QUEUE_FULL_RETRIES     10
#define QUEUE_FULL_WAIT_NS     (10ull * 1000000ull)
#define FALLBACK_MIN_HEAP      4096u
#define RBUF_INITIAL           4096u
/* Chunks an idle stream may keep allocated; beyond this the array is freed when drained. */
#define IDLE_CHUNK_CAP 4u

static void note_ready_locked(shmipc_session *s, uint32_t id);
static int process_locked(shmipc_session *s);

static void lock(shmipc_session *s)
{
    pthread_mutex_lock(&s->mu);
    shmipc__log_defer_begin();
}

static void unlock(shmipc_session *s)
{
    pthread_mutex_unlock(&s->mu);
    shmipc__log_defer_end();
}

/* ------------------------------------------------------------------------------------ */
/* Session life                                                                         */
/* ------------------------------------------------------------------------------------ */

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
    s->next_stream_id = FIRST_CLIENT_STREAM_ID;
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

/* ------------------------------------------------------------------------------------ */
/* The slice cache                                                                      */
/* ------------------------------------------------------------------------------------ */

/*
 * Sizes the cache once the buffer is known: up to a quarter of each list (at most
 * SHMIPC__SLICE_CACHE_MAX), so that a whole window of messages in flight comes back to slices
 * that are still hot. The arrays grow as slices come back, so an idle session holds none.
 */
static void cache_init(shmipc_session *s)
{
    for (uint32_t l = 0; l < s->bm.nlists; l++) {
        uint32_t max = s->bm.lists[l].cap / SHMIPC__SLICE_CACHE_SHARE;
        s->cache[l].max = max > SHMIPC__SLICE_CACHE_MAX ? SHMIPC__SLICE_CACHE_MAX : max;
    }
}

/* Room for one more entry in list l's cache. Under cache_mu. */
static int cache_room_locked(shmipc_session *s, uint32_t l)
{
    if (s->cache[l].n < s->cache[l].room)
        return 1;
    if (s->cache[l].room >= s->cache[l].max)
        return 0;
    uint32_t room = s->cache[l].room ? s->cache[l].room * 2 : 16;
    if (room > s->cache[l].max)
        room = s->cache[l].max;
    uint32_t *off = realloc(s->cache[l].off, room * sizeof *off);
    if (off == NULL)
        return 0;
    s->cache[l].off = off;
    s->cache[l].room = room;
    return 1;
}

/*
 * We are done with the slice at `off`: keep it for our next write (1; it stays marked ours in
 * held), or free it (0; shmipc__buffer_free() clears the mark before the push).
 */
static int cache_put(shmipc_session *s, uint32_t off)
{
    struct shmipc__slice sl;
    if (shmipc__buffer_slice_at(&s->bm, off, &sl) == 0) {
        uint32_t l = sl.list;
        int32_t shared = shmipc__buffer_list_free(&s->bm, l);
        pthread_mutex_lock(&s->cache_mu);
        int wanted = s->cache[l].credit > 0 || s->cache[l].n < SHMIPC__SLICE_CACHE_FREE;
        uint32_t reserve = s->bm.lists[l].cap / SHMIPC__SLICE_CACHE_SHARE; /* the peer's */
        if (wanted && shared >= 0 && (uint32_t)shared >= reserve && cache_room_locked(s, l)) {
            s->cache[l].off[s->cache[l].n++] = off;
            if (s->cache[l].credit > 0)
                s->cache[l].credit--;
            pthread_mutex_unlock(&s->cache_mu);
            return 1;
        }
        pthread_mutex_unlock(&s->cache_mu);
    }
    shmipc__buffer_free(&s->bm, off);
    return 0;
}

/* A kept slice of the smallest list that holds `want` bytes, most recently used first. */
static int cache_get(shmipc_session *s, uint32_t want, struct shmipc__slice *out)
{
    uint32_t l = 0, off = 0;
    while (l < s->bm.nlists && s->bm.lists[l].slice_size < want)
        l++;
    if (l == s->bm.nlists)
        return SHMIPC_ENOSHM;
    pthread_mutex_lock(&s->cache_mu);
    if (s->cache[l].n > 0) {
        /* Still ours, still marked in held, until the flush hands it to the peer. */
        off = s->cache[l].off[--s->cache[l].n];
    }
    /* We are about to write a slice of this size: one more we may keep when it comes back. */
    if (s->cache[l].credit < s->cache[l].max)
        s->cache[l].credit++;
    pthread_mutex_unlock(&s->cache_mu);
    if (off == 0 || shmipc__buffer_slice_at(&s->bm, off, out) < 0)
        return SHMIPC_ENOSHM;
    return shmipc__buffer_slice_claim(&s->bm, out);
}

void shmipc__session_trim(shmipc_session *s)
{
    pthread_mutex_lock(&s->cache_mu);
    for (uint32_t l = 0; l < s->bm.nlists; l++)
        while (s->cache[l].n > 0) {
            uint32_t off = s->cache[l].off[--s->cache[l].n];
            shmipc__buffer_free(&s->bm, off); /* clears its mark in held first */
        }
    pthread_mutex_unlock(&s->cache_mu);
}

/* The session's error: written once, under mu, with an atomic store (fail_locked); read
 * through here with or without mu (the write path checks it without the lock). */
static inline int session_err(const shmipc_session *s)
{
    return __atomic_load_n(&s->err, __ATOMIC_ACQUIRE);
}

static void free_chunks(shmipc_session *s, shmipc_stream *st, uint32_t from, uint32_t to)
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
        if (session_err(s) == 0 || s->role == SHMIPC__CLIENT)
            (void)cache_put(s, c->slice);
        else
            shmipc__held_drop(&s->bm, s->held, c->slice);
    }
}

static void free_segments(shmipc_session *s, shmipc_stream *st)
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

static void stream_free_memory(shmipc_stream *st)
{
    free(st->chunks);
    free(st->segs);
    free(st->scratch);
    free(st);
}

static void session_destroy(shmipc_session *s)
{
    /* Streams left here were never handed out: the peer opened them, nobody accepted them. */
    for (uint32_t b = 0; b < s->nbuckets; b++) {
        shmipc_stream *st = s->buckets[b];
        while (st != NULL) {
            shmipc_stream *next = st->next_in_bucket;
            free_chunks(s, st, 0, st->nchunks);
            stream_free_memory(st);
            st = next;
        }
    }
    /* Kept slices go back: a server's peer may go on using its buffer for a while. */
    if (s->bm.base != NULL)
        shmipc__session_trim(s);
    for (uint32_t l = 0; l < SHMIPC__BM_MAX_LISTS; l++)
        free(s->cache[l].off);
    s->bm.held = NULL;
    free(s->held);
    free(s->buckets);
    free(s->accept_q);
    free(s->ready);
    free(s->rbuf);
    /* Only the very files that were mapped: a name the peer swapped since stays. */
    if (s->unlink_files) {
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
    free(s);
}

static void session_release(shmipc_session *s)
{
    lock(s);
    int last = --s->refs == 0;
    unlock(s);
    if (last)
        session_destroy(s);
}

/* Ends the session with `code` (first cause wins) and wakes every waiter. Under mu. */
static int fail_locked(shmipc_session *s, int code)
{
    if (session_err(s) == 0) {
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
        /* Wakes a processor blocked in poll() and shows the peer the end at once. */
        if (s->fd >= 0)
            shutdown(s->fd, SHUT_RDWR);
        for (uint32_t b = 0; s->track_ready && b < s->nbuckets; b++)
            for (shmipc_stream *st = s->buckets[b]; st != NULL; st = st->next_in_bucket)
                note_ready_locked(s, st->id);
        pthread_cond_broadcast(&s->cond);
    }
    return session_err(s);
}

/* The session's end as a fresh failure detail, for calls made after it ended. */
static int ended(shmipc_session *s)
{
    if (session_err(s) == SHMIPC_ECLOSED) /* closed or shut down locally */
        return shmipc__fail(SHMIPC_ECLOSED, "%s", s->why);
    return shmipc__fail(session_err(s), "session ended: %s", s->why);
}

/*
 * The SIGBUS guard's verdict (shm/guard.h): when the peer shrank a file under one of our
 * mappings, its pages are private zeros now, nothing more can be exchanged, and data already
 * delivered from it may read as zeros. Ends the session then. Under mu.
 */
static int check_memory_locked(shmipc_session *s)
{
    if (!shmipc__session_memory_damaged(s))
        return 0;
    fail_locked(s, SHMIPC_EPROTO); /* which names the damage */
    return ended(s);
}

/* check_memory_locked() for a caller that does not hold mu. */
static int check_memory(shmipc_session *s)
{
    lock(s);
    int rc = check_memory_locked(s);
    unlock(s);
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
    uint64_t deadline = shmipc__deadline_ms(s->cfg.timeout_ms[SHMIPC_TIMEOUT_INITIALIZE]);
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
    cache_init(s);
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
                              shmipc__deadline_ms(s->cfg.timeout_ms[SHMIPC_TIMEOUT_INITIALIZE]));
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
    lock(s);
    fail_locked(s, shmipc__fail(SHMIPC_ECLOSED, "session: closed locally"));
    unlock(s);
    /* Calls still in flight hold references of their own: the last one out frees it. */
    session_release(s);
}

/*
 * Ending the session wakes every waiter: fail_locked() shuts the socket down (a processor in
 * poll or epoll_wait wakes) and broadcasts `cond` (the others). A session that ended already
 * keeps its cause.
 */
int shmipc__session_shutdown(shmipc_session *s)
{
    lock(s);
    if (session_err(s) == 0)
        fail_locked(s, shmipc__fail(SHMIPC_ECLOSED, "session: shut down locally"));
    unlock(s);
    return 0;
}

/* ------------------------------------------------------------------------------------ */
/* Stream table                                                                         */
/* ------------------------------------------------------------------------------------ */

static uint32_t bucket_of(const shmipc_session *s, uint32_t id)
{
    return (id * 2654435761u) & (s->nbuckets - 1);
}

static shmipc_stream *lookup_locked(shmipc_session *s, uint32_t id)
{
    shmipc_stream *st = s->buckets[bucket_of(s, id)];
    while (st != NULL && st->id != id)
        st = st->next_in_bucket;
    return st;
}

static int insert_locked(shmipc_session *s, shmipc_stream *st)
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
                uint32_t h = (it->id * 2654435761u) & (n - 1);
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

static shmipc_stream *stream_new(shmipc_session *s, uint32_t id)
{
    shmipc_stream *st = calloc(1, sizeof *st);
    if (st == NULL)
        return NULL;
    st->s = s;
    st->id = id;
    st->read_timeout_ms = s->cfg.timeout_ms[SHMIPC_TIMEOUT_READ];
    st->write_timeout_ms = s->cfg.timeout_ms[SHMIPC_TIMEOUT_WRITE];
    return st;
}

/* ------------------------------------------------------------------------------------ */
/* Receiving                                                                            */
/* ------------------------------------------------------------------------------------ */

/* Remembers that stream `id` has news, for a listener serving with callbacks. Under mu. */
static void note_ready_locked(shmipc_session *s, uint32_t id)
{
    if (!s->track_ready)
        return;
    if (s->nready > 0 && s->ready[s->nready - 1] == id)
        return;
    if (s->nready == s->ready_cap) {
        uint32_t n = s->ready_cap ? s->ready_cap * 2 : 64;
        void *p = realloc(s->ready, n * sizeof *s->ready);
        if (p == NULL)
            return; /* the stream is still served: its next message notes it again */
        s->ready = p;
        s->ready_cap = n;
    }
    s->ready[s->nready++] = id;
}

static int push_chunk_locked(shmipc_session *s, shmipc_stream *st, uint8_t *data, uint32_t len,
                             uint32_t slice)
{
    if (st->nchunks == st->chunk_cap) {
        uint32_t n = st->chunk_cap ? st->chunk_cap * 2 : IDLE_CHUNK_CAP;
        void *p = realloc(st->chunks, n * sizeof *st->chunks);
        if (p == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "stream %u: out of memory", st->id);
        st->chunks = p;
        st->chunk_cap = n;
    }
    st->chunks[st->nchunks++] = (struct shmipc__chunk){data, len, slice, 0};
    st->unread += len;
    note_ready_locked(s, st->id);
    return 0;
}

/* The stream for a data message with id `id`: a known one, or a new one on the server. */
static int stream_for_data_locked(shmipc_session *s, uint32_t id, shmipc_stream **out)
{
    shmipc_stream *st = lookup_locked(s, id);
    if (st == NULL && s->role == SHMIPC__SERVER) {
        int rc;
        uint32_t max = shmipc__config_get_max_pending_streams(&s->cfg);
        /*
         * Each stream costs us heap; a peer that opens them faster than they are accepted
         * would grow it without end. Go blocks its reader here, which stalls the session
         * anyway; we end it with a reason instead.
         */
        if (s->accept_len >= max)
            return shmipc__fail(SHMIPC_EPROTO,
                                "session: the peer opened stream %u with %u streams not yet "
                                "accepted (max_pending_streams is %u)",
                                id, s->accept_len, max);
        if (s->accept_len == s->accept_cap) {
            uint32_t n = s->accept_cap ? s->accept_cap * 2 : 16;
            shmipc_stream **q = malloc(n * sizeof *q);
            if (q == NULL)
                return shmipc__fail(SHMIPC_ENOMEM, "session: out of memory for new streams");
            for (uint32_t i = 0; i < s->accept_len; i++)
                q[i] = s->accept_q[(s->accept_head + i) % (s->accept_cap ? s->accept_cap : 1)];
            free(s->accept_q);
            s->accept_q = q;
            s->accept_cap = n;
            s->accept_head = 0;
        }
        if ((st = stream_new(s, id)) == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "session: out of memory for a new stream");
        if ((rc = insert_locked(s, st)) < 0) {
            free(st);
            return rc;
        }
        s->accept_q[(s->accept_head + s->accept_len++) % s->accept_cap] = st;
    }
    *out = st;
    return 0;
}

/* Delivers the chain at `offset` to stream `id`, or frees it when nobody can take it. */
static int deliver_chain_locked(shmipc_session *s, uint32_t id, uint32_t offset)
{
    shmipc_stream *st;
    struct shmipc__chain walk;
    struct shmipc__chain_slice sl;
    int rc = stream_for_data_locked(s, id, &st);
    if (rc < 0)
        return rc;
    if (st == NULL) {
        rc = shmipc__buffer_free_chain(&s->bm, offset, s->held);
        return rc < 0 ? rc : 0;
    }
    shmipc__chain_begin(&walk, &s->bm, offset);
    walk.held = s->held;
    while ((rc = shmipc__chain_next(&walk, &sl)) == 1) {
        /*
         * Empty slices become empty chunks that reads skip (Go skips them too). They are not
         * freed during the walk: the walker marks the slices it visits to catch a slice seen
         * twice, and a free would erase the mark.
         */
        if ((rc = push_chunk_locked(s, st, sl.bytes, sl.size, sl.offset)) < 0)
            return rc;
    }
    return rc;
}

static void peer_closed_locked(shmipc_session *s, uint32_t id)
{
    shmipc_stream *st = lookup_locked(s, id);
    /* The peer closing a stream we closed already (or never knew) is normal: ignore it. */
    if (st != NULL) {
        /* Atomic: the writer's flush reads it without mu. */
        __atomic_store_n(&st->state, (uint8_t)SHMIPC__STREAM_PEER_CLOSED, __ATOMIC_RELAXED);
        note_ready_locked(s, id);
    }
}

static int handle_element_locked(shmipc_session *s, const struct shmipc__queue_elem *e)
{
    switch (e->status & 0xff) {
    case 0:
        return deliver_chain_locked(s, e->seq_id, e->offset);
    case 1:
        peer_closed_locked(s, e->seq_id);
        return 0;
    default:
        return shmipc__fail(SHMIPC_EPROTO, "queue: element for stream %u with status %u", e->seq_id,
                            e->status);
    }
}

/* Handles a Polling message: drain, clear the working flag, drain again if needed. */
static int drain_queue_locked(shmipc_session *s, int *events)
{
    struct shmipc__queue_elem e;
    int rc;
    for (;;) {
        while ((rc = shmipc__queue_pop(&s->qp.recv, &e)) == 0) {
            if ((rc = handle_element_locked(s, &e)) < 0)
                return rc;
            (*events)++;
        }
        if (rc != SHMIPC_EAGAIN)
            return rc;
        rc = shmipc__queue_mark_not_working(&s->qp.recv);
        if (rc <= 0)
            return rc;
    }
}

static int handle_fallback_locked(shmipc_session *s, const struct shmipc__msg *m)
{
    shmipc_stream *st;
    int rc;
    s->unhealthy_until_ns = shmipc__now_ns() + BREAKER_NS;
    if ((m->u.fallback.status & 0xff) == 1) {
        peer_closed_locked(s, m->u.fallback.stream_id);
        return 0;
    }
    if ((rc = stream_for_data_locked(s, m->u.fallback.stream_id, &st)) < 0)
        return rc;
    if (st == NULL || m->u.fallback.len == 0)
        return 0;
    __atomic_store_n(&st->fallback, 1, __ATOMIC_RELAXED);
    /*
     * Fallback data lives on our heap until it is read and released. The socket is shared by
     * every stream, so we cannot push back on one: a peer that sends more than we hold ends
     * the session.
     */
    uint64_t max = shmipc__config_get_max_fallback_unread(&s->cfg);
    if (s->fallback_held + m->u.fallback.len + SHMIPC__FALLBACK_CHUNK_COST > max)
        return shmipc__fail(SHMIPC_EPROTO,
                            "stream %u: %u bytes of fallback data on top of %llu held unread "
                            "would pass max_fallback_unread (%llu bytes)",
                            st->id, m->u.fallback.len, (unsigned long long)s->fallback_held,
                            (unsigned long long)max);
    uint8_t *copy = malloc(m->u.fallback.len);
    if (copy == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "stream %u: out of memory for fallback data", st->id);
    memcpy(copy, m->u.fallback.data, m->u.fallback.len);
    if ((rc = push_chunk_locked(s, st, copy, m->u.fallback.len, SHMIPC__HEAP_CHUNK)) < 0)
        free(copy);
    else
        s->fallback_held += m->u.fallback.len + SHMIPC__FALLBACK_CHUNK_COST;
    return rc;
}

static int handle_message_locked(shmipc_session *s, const struct shmipc__msg *m, int *events)
{
    int rc;
    switch (m->h.type) {
    case SHMIPC__MSG_POLLING:
        return drain_queue_locked(s, events);
    /*
     * The peer put everything it sent before this message into the queue first, and may not
     * have woken us for it (its working flag was set). Drain the queue before handling it, or
     * a fallback message or a close would overtake the data queued ahead of it.
     */
    case SHMIPC__MSG_STREAM_CLOSE:
        (*events)++;
        rc = drain_queue_locked(s, events);
        if (rc == 0)
            peer_closed_locked(s, m->u.stream_close.stream_id);
        return rc;
    case SHMIPC__MSG_FALLBACK_DATA:
        (*events)++;
        rc = drain_queue_locked(s, events);
        return rc < 0 ? rc : handle_fallback_locked(s, m);
    case SHMIPC__MSG_HOT_RESTART:
    case SHMIPC__MSG_HOT_RESTART_ACK:
        /* A Go server restarting hot: we keep this session until it ends (docs/protocol.md). */
        SHMIPC__LOG(SHMIPC__LOG_INFO, "session %s: peer sent %s (epoch %llu); ignored",
                    s->buffer_path, shmipc__msg_type_name(m->h.type),
                    (unsigned long long)m->u.hot_restart.epoch);
        return 0;
    default:
        return shmipc__fail(SHMIPC_EPROTO, "session: unexpected %s after the handshake",
                            shmipc__msg_type_name(m->h.type));
    }
}

/*
 * Reads what the socket holds and handles every complete message. Under mu, by the one
 * processing thread. Returns the number of events or the code that ended the session.
 */
/*
 * V4 eventfd and polling modes: the queue may have work without any socket message. Clear the
 * eventfd or timerfd (one read resets either) and drain. Under mu.
 */
/*
 * V4 eventfd and polling sessions: one epoll_wait on the session's set, waiting up to
 * `timeout_ms` (-1: forever). Returns how many fds fired (0 when none), *socket set when the
 * socket did, or -errno. Waits with mu released when `timeout_ms` is not 0.
 */
static int wait_set_locked(shmipc_session *s, int timeout_ms, int *socket)
{
    struct epoll_event ev[2];
    if (timeout_ms != 0)
        unlock(s);
    int n = epoll_wait(s->event_fd, ev, 2, timeout_ms);
    int err = errno;
    if (timeout_ms != 0)
        lock(s);
    *socket = 0;
    for (int i = 0; i < n; i++) {
        uint64_t ticks;
        if (ev[i].data.fd == s->fd)
            *socket = 1;
        else if (ev[i].data.fd == s->timer_fd || ev[i].data.fd == s->kick_fd)
            (void)!read(ev[i].data.fd, &ticks, sizeof ticks);
    }
    return n < 0 ? -err : n;
}

/* Makes room for at least RBUF_INITIAL more bytes in the socket read buffer. Under mu. */
static int grow_rbuf_locked(shmipc_session *s)
{
    if (s->rcap - s->rlen >= RBUF_INITIAL)
        return 0;
    size_t n = s->rcap ? s->rcap * 2 : RBUF_INITIAL * 4;
    if (n > SHMIPC__MAX_MESSAGE + RBUF_INITIAL * 4)
        n = SHMIPC__MAX_MESSAGE + RBUF_INITIAL * 4;
    if (n > s->rcap) {
        void *p = realloc(s->rbuf, n);
        if (p == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "session: out of memory");
        s->rbuf = p;
        s->rcap = n;
    }
    return 0;
}

/*
 * Takes the result of one recv into the read buffer (`n` bytes, `err` its errno): handles every
 * complete message. Returns 1 when the socket may hold more (the read filled the buffer), 0
 * when it is drained, or a negative code that ends the session. Under mu.
 */
static int take_recv_locked(shmipc_session *s, ssize_t n, int err, size_t space, int *events)
{
    int rc;
    if (n == 0) {
        /*
         * A peer that closes its streams and then its session at once may leave close
         * elements (and data) in the queue without a wakeup: take them first, so its streams
         * end as it ended them, then end the session.
         */
        if ((rc = drain_queue_locked(s, events)) < 0)
            return rc;
        return shmipc__fail(SHMIPC_ECONNRESET, "session: the peer closed the connection");
    }
    if (n < 0) {
        if (err == EAGAIN || err == EINTR)
            return 0;
        if (err == ECONNRESET)
            return shmipc__fail(SHMIPC_ECONNRESET, "session: connection reset by peer");
        return shmipc__fail_errno(err, "session: recv");
    }
    s->rlen += (size_t)n;
    size_t off = 0;
    struct shmipc__msg m;
    while ((rc = shmipc__msg_parse(s->rbuf + off, s->rlen - off, &m, s->version == 4)) > 0) {
        off += (size_t)rc;
        if ((rc = handle_message_locked(s, &m, events)) < 0)
            break;
    }
    memmove(s->rbuf, s->rbuf + off, s->rlen - off);
    s->rlen -= off;
    if (rc < 0)
        return rc;
    /* A short read drained the socket: poll says when there is more, no need to ask. */
    return (size_t)n == space;
}

/* Ends the processing turn: wake the waiters if anything happened, or end the session. */
static int finish_turn_locked(shmipc_session *s, int rc, int events)
{
    if (events > 0)
        pthread_cond_broadcast(&s->cond);
    if (rc < 0)
        return fail_locked(s, rc); /* a damaged mapping wins over the socket error it caused */
    return events;
}

/*
 * Reads what the socket holds and handles every complete message, then (V4 eventfd and
 * polling sessions) takes what the queue holds. `socket_ready` 0 says the caller knows the
 * socket has nothing (only a wakeup fd fired), which spares a recv. The socket goes first:
 * a FallbackData or StreamClose the peer sent before putting more elements must not be
 * overtaken by them (its handler drains the elements put before it).
 */
static int process_fds_locked(shmipc_session *s, int socket_ready)
{
    int events = 0, rc = 0;
    if (session_err(s))
        return session_err(s);
    if ((rc = check_memory_locked(s)) < 0)
        return rc;
    while (rc >= 0 && socket_ready) {
        if ((rc = grow_rbuf_locked(s)) < 0)
            break;
        size_t space = s->rcap - s->rlen;
        ssize_t n = recv(s->fd, s->rbuf + s->rlen, space, MSG_DONTWAIT);
        rc = take_recv_locked(s, n, errno, space, &events);
        socket_ready = rc == 1 || (n < 0 && errno == EINTR);
    }
    if (rc >= 0 && s->wakeup != SHMIPC_WAKEUP_SOCKET)
        rc = drain_queue_locked(s, &events);
    if (rc >= 0 && (rc = check_memory_locked(s)) < 0)
        return rc;
    return finish_turn_locked(s, rc, events);
}

/* Processes without waiting. V4 eventfd and polling sessions ask the set whether to recv. */
static int process_locked(shmipc_session *s)
{
    int socket = 1;
    if (s->wakeup != SHMIPC_WAKEUP_SOCKET) {
        int rc = wait_set_locked(s, 0, &socket);
        if (rc < 0 && rc != -EINTR)
            return fail_locked(s, shmipc__fail_errno(-rc, "session: epoll_wait"));
        socket = rc < 0 || socket;
    }
    return process_fds_locked(s, socket);
}

/*
 * Waits for something to happen, by processing the socket when no other thread does or by
 * waiting for the thread that does. Under mu. Returns 0 (look again), SHMIPC_ETIMEDOUT, or
 * the code that ended the session.
 */
/*
 * How long the processor may sleep: until the deadline (NULL: forever), and in polling mode
 * no longer than the negotiated interval, after which it drains the queue.
 */
static struct timespec *wait_span(const shmipc_session *s, uint64_t deadline)
{
    static _Thread_local struct timespec ts;
    uint64_t span = UINT64_MAX;
    if (deadline != 0) {
        uint64_t now = shmipc__now_ns();
        span = deadline > now ? deadline - now : 0;
    }
    if (s->wakeup == SHMIPC_WAKEUP_POLLING && span > (uint64_t)s->interval_us * 1000u)
        span = (uint64_t)s->interval_us * 1000u;
    if (span == UINT64_MAX)
        return NULL;
    ts.tv_sec = (time_t)(span / 1000000000u);
    ts.tv_nsec = (long)(span % 1000000000u);
    return &ts;
}

/* wait_span() in milliseconds for epoll_wait, rounded up; -1 for no limit. */
static int span_ms(const shmipc_session *s, uint64_t deadline)
{
    const struct timespec *ts = wait_span(s, deadline);
    if (ts == NULL)
        return -1;
    uint64_t ms = (uint64_t)ts->tv_sec * 1000u + ((uint64_t)ts->tv_nsec + 999999u) / 1000000u;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

/*
 * The spin cap of a new config: SHMIPC_SPIN_US (read once per process), 50 µs by default.
 * Caps below one cross-process wakeup (13-15 µs on a quiet VM, more under load) leave both
 * peers asleep; 20 µs sat at that edge under load, 50 µs clears it (docs/benchmarks.md).
 */
uint32_t shmipc__spin_default_us(void)
{
    static uint32_t cached = UINT32_MAX;
    uint32_t v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v == UINT32_MAX) {
        const char *env = shmipc__getenv("SHMIPC_SPIN_US");
        long us = env != NULL ? strtol(env, NULL, 10) : 50;
        v = us < 0 ? 0 : (uint32_t)(us > (long)SHMIPC__SPIN_US_MAX ? SHMIPC__SPIN_US_MAX : us);
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* The most a waiting processor spins before it sleeps: the config's spin_us. */
static uint64_t spin_ns(const shmipc_session *s)
{
    return (uint64_t)s->cfg.spin_us * 1000u;
}

/* The least budget of an adaptive spin: below this a spin is not worth setting the flag. */
#define SPIN_MIN_NS 2000u

/*
 * This wait's spin budget: twice the recent average wait for data (so most waits like the
 * recent ones end inside the spin), at least SPIN_MIN_NS, at most the cap. A session starts
 * at the cap. A peer that answers in 1 µs makes a failed spin cost a few µs, not the whole
 * cap; one that answers in 15 µs keeps a 30 µs budget (if the cap allows). Under mu.
 */
static uint64_t spin_budget(const shmipc_session *s)
{
    uint64_t cap = spin_ns(s);
    if (s->spin_gap_ns == 0)
        return cap;
    uint64_t b = 2 * s->spin_gap_ns;
    if (b < SPIN_MIN_NS)
        b = SPIN_MIN_NS;
    return b < cap ? b : cap;
}

/*
 * Feeds one observed wait for data (from the start of a wait to the data, in the spin or
 * after the sleep that followed it) into the average, 1/8 weight. A sample is clipped at
 * twice the cap: an idle minute must not keep the budget at the cap for the next hundred
 * waits once traffic resumes (the cap already covers anything longer). Under mu.
 */
static void spin_observe(shmipc_session *s, uint64_t gap)
{
    uint64_t cap = spin_ns(s);
    if (gap > 2 * cap)
        gap = 2 * cap;
    s->spin_gap_ns = s->spin_gap_ns == 0 ? gap : s->spin_gap_ns - s->spin_gap_ns / 8 + gap / 8;
    if (s->spin_gap_ns == 0)
        s->spin_gap_ns = 1;
}

/*
 * Whether the machine has a second CPU: on one, spinning only delays the peer. (Not this
 * thread's affinity: a process pinned to one CPU may well have its peer pinned to another.)
 */
static long online_cpus(void)
{
    static long cpus;
    long n = __atomic_load_n(&cpus, __ATOMIC_RELAXED);
    if (n == 0) {
        n = sysconf(_SC_NPROCESSORS_ONLN);
        n = n > 0 ? n : 2;
        __atomic_store_n(&cpus, n, __ATOMIC_RELAXED);
    }
    return n;
}

static int have_two_cpus(void)
{
    return online_cpus() != 1;
}

/*
 * Threads of this process spinning right now. With more of them than CPUs, a spinner that
 * pauses keeps a CPU from a thread that may be the one about to produce what another
 * spinner waits for: they yield instead (sched_yield), which lets any runnable thread in.
 */
static int spinners;

/*
 * Whether this wait spins first. Not while recent spins came up empty: on a loaded machine
 * the peer is not running when we wait for it, and a spin burns the CPU it needs. Each
 * failure in a row doubles the number of waits that skip the spin (1, 3, 7 .. 63); one
 * success restores spinning on every wait. Under mu.
 */
static int spin_now(shmipc_session *s)
{
    if (spin_ns(s) == 0 || !have_two_cpus())
        return 0;
    if (s->spin_skip > 0) {
        s->spin_skip--;
        return 0;
    }
    return 1;
}

/* Records how a spin went, for spin_now(). Under mu. */
static void spin_done(shmipc_session *s, int found)
{
    if (found) {
        s->spin_fails = 0;
        return;
    }
    if (s->spin_fails < 6)
        s->spin_fails++;
    s->spin_skip = (1u << s->spin_fails) - 1;
}

/*
 * After a spin that found nothing and the sleep that followed (`began`: when the spin
 * started; `gave_up`: when it ended): the spin counts as a failure only when the peer took
 * much longer than the cap (more than 4x), so a peer that answers just after the spin ends
 * keeps spinning on, with a budget grown to the wait it took.
 */
static void spin_judge(shmipc_session *s, uint64_t began, uint64_t gave_up)
{
    if (gave_up == 0)
        return;
    uint64_t now = shmipc__now_ns();
    spin_observe(s, now - began);
    spin_done(s, now - gave_up < 4 * spin_ns(s));
}

/*
 * One step of a spin loop: the CPU's pause hint, which frees the pipeline for the sibling
 * hyperthread and keeps the loop from flooding the memory system with reads. Nothing where
 * there is no such hint.
 */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("isb" ::: "memory");
#endif
}

/*
 * Spins from `start` for up to `budget` ns (and never past `deadline`) with our receive
 * queue's working flag set, watching the queue. Returns 1 when elements arrived, 0 when the
 * spin gave up with the flag cleared again and the queue found empty. The caller holds the
 * processing role.
 */
static int spin_for_work(shmipc_session *s, uint64_t start, uint64_t budget, uint64_t deadline)
{
    uint32_t *flag = (uint32_t *)(void *)(s->qp.recv.hdr + s->qp.recv.flag_at);
    uint64_t end = start + budget;
    int found = 0;
    if (deadline != 0 && deadline < end)
        end = deadline;
    /*
     * Set before the first look (seq_cst, as the producer's CAS): a put after this sees the
     * flag and sends no wakeup, and we see its element in the loop or in the final look.
     */
    __atomic_store_n(flag, 1, __ATOMIC_SEQ_CST);
    int crowd = __atomic_add_fetch(&spinners, 1, __ATOMIC_RELAXED) > online_cpus();
    for (unsigned i = 0;; i++) {
        if (shmipc__queue_size(&s->qp.recv) != 0) {
            found = 1;
            break;
        }
        if ((i & 63) == 63) {
            if (shmipc__now_ns() >= end)
                break;
            crowd = __atomic_load_n(&spinners, __ATOMIC_RELAXED) > online_cpus();
        }
        if (crowd)
            sched_yield();
        else
            cpu_relax();
    }
    __atomic_sub_fetch(&spinners, 1, __ATOMIC_RELAXED);
    if (found)
        return 1;
    /* Clear and look again: a put that saw the flag set sent no wakeup. */
    return shmipc__queue_mark_not_working(&s->qp.recv) != 0;
}

/*
 * One spin turn, when no other thread processes and spinning is on for this wait: before
 * sleeping, spin a little with our working flag set. A peer that answers within the spin
 * sees the flag and sends no wakeup, and we take its message with no system call on either
 * side. Then the flag is cleared and the queue looked at once more (the consumer's usual
 * Dekker step), so no wakeup is lost when the spin gives up. Under mu (dropped while
 * spinning). Returns 1 when elements arrived and were processed, 0 when nothing came (with
 * *gave_up set to when the spin ended, if it ran), or the code that ended the session.
 */
static int spin_turn_locked(shmipc_session *s, uint64_t deadline, uint64_t *began,
                            uint64_t *gave_up)
{
    if (s->processing || s->wakeup == SHMIPC_WAKEUP_POLLING || session_err(s) || !spin_now(s))
        return 0;
    s->processing = 1;
    uint64_t budget = spin_budget(s);
    *began = shmipc__now_ns();
    unlock(s);
    int found = spin_for_work(s, *began, budget, deadline);
    lock(s);
    int rc = 0, events = 0;
    if (found) {
        spin_observe(s, shmipc__now_ns() - *began);
        spin_done(s, 1);
        /*
         * Drain, then read the socket once without waiting: wakeups the peer sent before it
         * saw our flag would otherwise pile up unread until its writes block.
         */
        if (session_err(s) == 0) {
            rc = finish_turn_locked(s, drain_queue_locked(s, &events), events);
            if (rc >= 0)
                rc = process_locked(s);
        }
    } else {
        *gave_up = shmipc__now_ns();
    }
    s->processing = 0;
    if (!found)
        return 0;
    pthread_cond_broadcast(&s->cond);
    return rc < 0 ? rc : 1;
}

static int wait_locked(shmipc_session *s, uint64_t deadline)
{
    if (session_err(s))
        return session_err(s);
    /* Events for other streams end a wait too; the caller's deadline holds across them. */
    if (deadline != 0 && shmipc__now_ns() >= deadline)
        return shmipc__fail(SHMIPC_ETIMEDOUT, "timed out");
    uint64_t began = 0, gave_up = 0; /* when a spin started, and when it found nothing */
    int rc = spin_turn_locked(s, deadline, &began, &gave_up);
    if (rc != 0)
        return rc < 0 ? rc : 0;
    if (session_err(s))
        return session_err(s);
    if (!s->processing) {
        s->processing = 1;
        int socket = 0, err = 0;
        if (s->wakeup == SHMIPC_WAKEUP_SOCKET) {
            /*
             * Not a blocking recv even without a deadline (one system call less): a stream
             * shut down from another thread must be able to wake us through kick_fd.
             */
            unlock(s);
            struct pollfd p[2] = {{.fd = s->fd, .events = POLLIN},
                                  {.fd = s->kick_fd, .events = POLLIN}};
            rc = ppoll(p, 2, wait_span(s, deadline), NULL);
            err = errno;
            lock(s);
            socket = rc > 0 && p[0].revents != 0;
            if (rc > 0 && p[1].revents != 0) {
                uint64_t kicks;
                (void)!read(s->kick_fd, &kicks, sizeof kicks);
            }
        } else if ((rc = wait_set_locked(s, span_ms(s, deadline), &socket)) < 0) {
            err = -rc;
            rc = -1;
        }
        /* In polling mode a quiet interval is the cue to look at the queue. */
        int poll_due = rc == 0 && s->wakeup == SHMIPC_WAKEUP_POLLING &&
                       (deadline == 0 || shmipc__now_ns() < deadline);
        if (rc > 0 || poll_due)
            rc = process_fds_locked(s, socket);
        else if (rc == 0)
            rc = shmipc__fail(SHMIPC_ETIMEDOUT, "timed out");
        else if (err == EINTR)
            rc = shmipc__fail(SHMIPC_EINTR, "interrupted by a signal");
        else
            rc = fail_locked(s, shmipc__fail_errno(err, "session: poll"));
        spin_judge(s, began, gave_up);
        s->processing = 0;
        pthread_cond_broadcast(&s->cond);
        return rc < 0 ? rc : 0;
    }
    if (deadline == 0) {
        pthread_cond_wait(&s->cond, &s->mu);
        return 0;
    }
    struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000u),
                          .tv_nsec = (long)(deadline % 1000000000u)};
    if (pthread_cond_timedwait(&s->cond, &s->mu, &ts) == ETIMEDOUT)
        return shmipc__fail(SHMIPC_ETIMEDOUT, "timed out");
    return 0;
}

int shmipc__session_spin(shmipc_session *s)
{
    uint64_t began = 0, gave_up = 0;
    lock(s);
    s->refs++; /* as process: a close meanwhile frees the session when we leave */
    int rc = session_err(s) ? session_err(s) : spin_turn_locked(s, 0, &began, &gave_up);
    if (rc == 0 && gave_up != 0) {
        /*
         * The caller sleeps on fileno() now; what it sleeps through is not seen here, so the
         * failure counts at once (the sleep's length would need the next call's clock).
         */
        spin_observe(s, gave_up - began);
        spin_done(s, 0);
    }
    if (rc < 0)
        rc = ended(s);
    unlock(s);
    session_release(s);
    return rc;
}

int shmipc__session_process(shmipc_session *s)
{
    int rc = 0;
    lock(s);
    s->refs++; /* as accept_stream: a close meanwhile frees the session when we leave */
    if (!s->processing) {
        s->processing = 1;
        rc = process_locked(s);
        s->processing = 0;
        pthread_cond_broadcast(&s->cond);
    } else if (session_err(s)) {
        rc = session_err(s);
    }
    if (rc < 0)
        rc = ended(s);
    unlock(s);
    session_release(s);
    return rc;
}

void shmipc__session_track_ready(shmipc_session *s)
{
    lock(s);
    s->track_ready = 1;
    unlock(s);
}

/* Swaps the caller's id array with the session's, so no copy and no allocation per turn. */
uint32_t shmipc__session_take_ready(shmipc_session *s, uint32_t **ids, uint32_t *cap)
{
    lock(s);
    uint32_t n = s->nready;
    uint32_t *mine = *ids, mine_cap = *cap;
    *ids = s->ready;
    *cap = s->ready_cap;
    s->ready = mine;
    s->ready_cap = mine_cap;
    s->nready = 0;
    unlock(s);
    return n;
}

shmipc_stream *shmipc__session_handed_out(shmipc_session *s, uint32_t id)
{
    lock(s);
    shmipc_stream *st = lookup_locked(s, id);
    /* Streams still waiting in the accept queue are not the user's yet. */
    for (uint32_t i = 0; st != NULL && i < s->accept_len; i++)
        if (s->accept_q[(s->accept_head + i) % s->accept_cap] == st)
            st = NULL;
    unlock(s);
    return st;
}

/* ------------------------------------------------------------------------------------ */
/* Opening and accepting                                                                */
/* ------------------------------------------------------------------------------------ */

int shmipc__session_open_stream(shmipc_session *s, shmipc_stream **out)
{
    int rc = 0;
    if (s->role != SHMIPC__CLIENT)
        return shmipc__fail(SHMIPC_ENOTSUP, "open_stream: only clients open streams");
    lock(s);
    if (session_err(s)) {
        rc = ended(s);
    } else if (shmipc__now_ns() < s->unhealthy_until_ns) {
        rc = shmipc__fail(SHMIPC_EUNHEALTHY,
                          "open_stream: shared memory ran out and data went over the socket; "
                          "new streams are refused for 30 s");
    } else {
        uint32_t tries = 0;
        /* Ids are never reused while in use; at u32 wrap-around skip the ones still open. */
        while (lookup_locked(s, s->next_stream_id) != NULL || s->next_stream_id < 2) {
            s->next_stream_id++;
            if (++tries == 0)
                break;
        }
        shmipc_stream *st = NULL;
        if (s->nstreams >= UINT32_MAX - 2)
            rc = shmipc__fail(SHMIPC_ESTREAMS, "open_stream: every stream id is in use");
        else if ((st = stream_new(s, s->next_stream_id++)) == NULL)
            rc = shmipc__fail(SHMIPC_ENOMEM, "open_stream: out of memory");
        else if ((rc = insert_locked(s, st)) < 0)
            free(st);
        else {
            s->refs++;
            *out = st;
        }
    }
    unlock(s);
    return rc;
}

int shmipc__session_accept_stream(shmipc_session *s, int timeout_ms, shmipc_stream **out)
{
    int rc = 0;
    uint64_t deadline = timeout_ms > 0 ? shmipc__deadline_ms((uint64_t)timeout_ms) : 0;
    if (s->role != SHMIPC__SERVER)
        return shmipc__fail(SHMIPC_ENOTSUP, "accept_stream: only servers accept streams");
    lock(s);
    s->refs++; /* a close from another thread meanwhile frees the session when we leave */
    for (;;) {
        if (s->accept_len > 0) {
            *out = s->accept_q[s->accept_head];
            s->accept_head = (s->accept_head + 1) % s->accept_cap;
            s->accept_len--;
            s->refs++;
            rc = 0;
            break;
        }
        if (session_err(s)) {
            rc = ended(s);
            break;
        }
        if (timeout_ms == 0) {
            if (!s->processing) {
                s->processing = 1;
                rc = process_locked(s);
                s->processing = 0;
                if (rc >= 0 && s->accept_len > 0)
                    continue;
            }
            rc = session_err(s) ? ended(s)
                                : shmipc__fail(SHMIPC_EAGAIN, "accept_stream: no new stream");
            break;
        }
        if ((rc = wait_locked(s, deadline)) < 0) {
            if (rc == session_err(s))
                rc = ended(s);
            break;
        }
    }
    unlock(s);
    session_release(s);
    return rc;
}

/* ------------------------------------------------------------------------------------ */
/* Reading                                                                              */
/* ------------------------------------------------------------------------------------ */

/*
 * Waits until the stream has `need` unread bytes or can have no more. Under mu. Returns 0
 * when the bytes are there, SHMIPC_EEOF, SHMIPC_EAGAIN (non-blocking), SHMIPC_ETIMEDOUT, or
 * the code that ended the session.
 */
static int stream_shut_error(const shmipc_stream *st)
{
    return shmipc__fail(SHMIPC_ECLOSED, "stream %u: shut down locally", st->id);
}

static int stream_is_shut(const shmipc_stream *st)
{
    return (__atomic_load_n(&st->inuse, __ATOMIC_ACQUIRE) & SHMIPC__STREAM_SHUT) != 0;
}

static int wait_readable_locked(shmipc_stream *st, uint64_t need, int flags)
{
    shmipc_session *s = st->s;
    uint64_t deadline = shmipc__deadline_ms(st->read_timeout_ms);
    int rc;
    for (;;) {
        /* Set before shmipc__stream_shutdown() takes mu to wake us: no wakeup is lost. */
        if (stream_is_shut(st))
            return stream_shut_error(st);
        /* Delivered data stays readable after the session ends, unless it may be zeros now. */
        if ((rc = check_memory_locked(s)) < 0)
            return rc;
        if (st->unread >= need)
            return 0;
        if (st->state == SHMIPC__STREAM_PEER_CLOSED)
            return shmipc__fail(SHMIPC_EEOF, "stream %u: the peer closed the stream", st->id);
        if (session_err(s))
            return ended(s);
        if (flags & SHMIPC_NONBLOCK) {
            if (!s->processing) {
                s->processing = 1;
                rc = process_locked(s);
                s->processing = 0;
                if (rc > 0)
                    continue;
            }
            if (st->unread >= need)
                return 0;
            return session_err(s) ? ended(s)
                                  : shmipc__fail(SHMIPC_EAGAIN, "stream %u: no data yet", st->id);
        }
        if ((rc = wait_locked(s, deadline)) < 0) {
            if (rc == SHMIPC_ETIMEDOUT)
                return shmipc__fail(SHMIPC_ETIMEDOUT, "stream %u: read timed out", st->id);
            return session_err(s) ? ended(s) : rc;
        }
    }
}

/*
 * Reads the last byte of a range about to be handed out, then looks at the SIGBUS guard's
 * mark. A truncation takes a suffix of the file, so when that byte is still there the whole
 * range is; when it is not, the read faults, the guard swaps zeros in, and we say so now
 * rather than on the next call. Under mu.
 */
static int probe_locked(shmipc_session *s, const uint8_t *last)
{
    (void)*(const volatile uint8_t *)last;
    return check_memory_locked(s);
}

/* Skips chunks that were read to their end. Under mu. */
static void settle_locked(shmipc_stream *st)
{
    while (st->read_index < st->nchunks && st->read_offset == st->chunks[st->read_index].len) {
        st->read_index++;
        st->read_offset = 0;
    }
}

int shmipc__stream_read_chunk(shmipc_stream *st, size_t max, const void **ptr, size_t *len,
                              int flags)
{
    shmipc_session *s = st->s;
    lock(s);
    int rc = wait_readable_locked(st, 1, flags);
    if (rc == 0) {
        settle_locked(st);
        struct shmipc__chunk *c = &st->chunks[st->read_index];
        size_t n = c->len - st->read_offset;
        if (max != 0 && n > max)
            n = max;
        if ((rc = probe_locked(s, c->data + st->read_offset + n - 1)) < 0) {
            unlock(s);
            return rc;
        }
        *ptr = c->data + st->read_offset;
        *len = n;
        st->read_offset += (uint32_t)n;
        st->unread -= n;
        settle_locked(st);
    }
    unlock(s);
    return rc;
}

/* Grows the read scratch to `n` bytes; on failure the old buffer is kept (not leaked). */
static int grow_scratch(shmipc_stream *st, size_t n)
{
    uint8_t *p = realloc(st->scratch, n);
    if (p == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "stream %u: out of memory for %zu bytes", st->id, n);
    st->scratch = p;
    st->scratch_cap = (uint32_t)n;
    return 0;
}

int shmipc__stream_read_exact(shmipc_stream *st, size_t n, const void **ptr, int flags)
{
    shmipc_session *s = st->s;
    if (n == 0) {
        *ptr = st->scratch;
        return 0;
    }
    if (n > UINT32_MAX)
        return shmipc__fail(SHMIPC_EINVAL, "read_exact_bytes: %zu bytes, at most %u", n,
                            UINT32_MAX);
    lock(s);
    int rc = wait_readable_locked(st, n, flags), copied = 0;
    if (rc == 0) {
        settle_locked(st);
        struct shmipc__chunk *c = &st->chunks[st->read_index];
        if (c->len - st->read_offset >= n) {
            if ((rc = probe_locked(s, c->data + st->read_offset + n - 1)) == 0) {
                *ptr = c->data + st->read_offset;
                st->read_offset += (uint32_t)n;
            }
        } else if (n > st->scratch_cap && (rc = grow_scratch(st, n)) < 0) {
            /* The old scratch and its capacity stay as they were: nothing leaks. */
        } else {
            /* The bytes span slices: the one case that copies. */
            size_t done = 0;
            while (done < n) {
                c = &st->chunks[st->read_index];
                size_t take = c->len - st->read_offset;
                if (take > n - done)
                    take = n - done;
                memcpy(st->scratch + done, c->data + st->read_offset, take);
                done += take;
                st->read_offset += (uint32_t)take;
                settle_locked(st);
            }
            *ptr = st->scratch;
            copied = 1;
        }
        if (rc == 0) {
            st->unread -= n;
            settle_locked(st);
        }
        if (copied)
            rc = check_memory_locked(s); /* the copy may have read zeros */
    }
    unlock(s);
    return rc;
}

size_t shmipc__stream_available(shmipc_stream *st)
{
    lock(st->s);
    size_t n = (size_t)st->unread;
    unlock(st->s);
    return n;
}

/*
 * Cuts `k` bytes (done with) off the front of a chunk; the rest stays. A heap copy's bytes no
 * longer count as held. Under mu.
 */
static void trim_chunk_locked(shmipc_session *s, struct shmipc__chunk *c, uint32_t k)
{
    c->data += k;
    c->len -= k;
    c->head += k;
    if (c->slice == SHMIPC__HEAP_CHUNK)
        s->fallback_held -= k;
}

/*
 * Drops the first `done` chunks (freed or handed on already); reading goes on from the first
 * chunk left (callers that read into it set read_offset). Under mu.
 */
static void drop_chunks_locked(shmipc_stream *st, uint32_t done)
{
    /* A stream that never received has no array: memmove(NULL, ...) is undefined even for 0. */
    if (done > 0)
        memmove(st->chunks, st->chunks + done, (st->nchunks - done) * sizeof *st->chunks);
    st->nchunks -= done;
    st->read_index = 0;
    if (st->nchunks == 0 && st->chunk_cap > IDLE_CHUNK_CAP) {
        free(st->chunks);
        st->chunks = NULL;
        st->chunk_cap = 0;
    }
}

/* Everything read was given back or sent on: an idle stream keeps no copy buffer either. */
static void drop_scratch(shmipc_stream *st)
{
    free(st->scratch);
    st->scratch = NULL;
    st->scratch_cap = 0;
}

int shmipc__stream_release(shmipc_stream *st)
{
    shmipc_session *s = st->s;
    lock(s);
    settle_locked(st);
    uint32_t done = st->read_index;
    free_chunks(s, st, 0, done);
    drop_chunks_locked(st, done);
    /* A slice read in part stays; its read bytes are behind us (forward no longer sends them). */
    if (st->nchunks > 0 && st->read_offset > 0) {
        trim_chunk_locked(s, &st->chunks[0], st->read_offset);
        st->read_offset = 0;
    }
    unlock(s);
    drop_scratch(st);
    return 0;
}

/* ------------------------------------------------------------------------------------ */
/* Writing                                                                              */
/* ------------------------------------------------------------------------------------ */

static struct shmipc__segment *add_segment(shmipc_stream *st)
{
    if (st->nsegs == st->seg_cap) {
        uint32_t n = st->seg_cap ? st->seg_cap * 2 : 4;
        void *p = realloc(st->segs, n * sizeof *st->segs);
        if (p == NULL)
            return NULL;
        st->segs = p;
        st->seg_cap = n;
    }
    return &st->segs[st->nsegs++];
}

/* Appends a segment of at least `want` bytes: a slice, or heap memory when none is free. */
static int grow_send_buffer(shmipc_stream *st, size_t want, int contiguous)
{
    shmipc_session *s = st->s;
    uint32_t max = shmipc__buffer_max_slice(&s->bm);
    struct shmipc__segment *seg = add_segment(st);
    if (seg == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "stream %u: out of memory", st->id);
    if (!__atomic_load_n(&st->fallback, __ATOMIC_RELAXED) && !(contiguous && want > max)) {
        struct shmipc__slice sl;
        uint32_t ask = (uint32_t)(want > max ? max : want);
        int rc = cache_get(s, ask, &sl);
        if (rc != 0)
            rc = shmipc__buffer_alloc(&s->bm, ask, &sl);
        /* A copying write can use any slice: take the largest one still free. */
        if (rc == SHMIPC_ENOSHM && !contiguous)
            rc = shmipc__buffer_alloc_many(&s->bm, want, &sl, 1) == 1 ? 0 : SHMIPC_ENOSHM;
        if (rc == 0) {
            *seg = (struct shmipc__segment){sl.data, sl.cap, 0, sl.offset};
            return 0;
        }
        if (rc != SHMIPC_ENOSHM) {
            st->nsegs--;
            return rc;
        }
    }
    /* Shared memory is exhausted (or the window is larger than any slice): use the heap. */
    size_t cap = want < FALLBACK_MIN_HEAP ? FALLBACK_MIN_HEAP : want;
    if (cap > SHMIPC__MAX_MESSAGE - SHMIPC__FALLBACK_HEADER_SIZE)
        cap = want;
    if (cap > UINT32_MAX || (seg->data = malloc(cap)) == NULL) {
        st->nsegs--;
        return shmipc__fail(SHMIPC_ENOMEM, "stream %u: out of memory for %zu bytes", st->id, cap);
    }
    seg->cap = (uint32_t)cap;
    seg->used = 0;
    seg->slice = SHMIPC__HEAP_CHUNK;
    return 0;
}

/*
 * A free list that handed out a slice in our hands (shmipc__buffer_alloc's SHMIPC_EPROTO):
 * the shared lists cannot be trusted any more, so the session ends. Without mu.
 */
static int end_on_bad_list(shmipc_session *s, int rc)
{
    if (rc != SHMIPC_EPROTO)
        return rc;
    lock(s);
    rc = fail_locked(s, rc);
    unlock(s);
    return rc;
}

/* shmipc__stream_write() for a caller that may hold mu (forward): see end_on_bad_list. */
static int write_bytes(shmipc_stream *st, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    if (session_err(st->s))
        return ended(st->s);
    st->reserved_len = 0;
    while (len > 0) {
        struct shmipc__segment *seg = st->nsegs ? &st->segs[st->nsegs - 1] : NULL;
        if (seg == NULL || seg->used == seg->cap) {
            int rc = grow_send_buffer(st, len, 0);
            if (rc < 0)
                return rc;
            continue;
        }
        size_t n = seg->cap - seg->used;
        if (n > len)
            n = len;
        memcpy(seg->data + seg->used, p, n);
        seg->used += (uint32_t)n;
        st->send_len += n;
        p += n;
        len -= n;
    }
    return 0;
}

int shmipc__stream_write(shmipc_stream *st, const void *buf, size_t len)
{
    return end_on_bad_list(st->s, write_bytes(st, buf, len));
}

int shmipc__stream_reserve(shmipc_stream *st, size_t n, void **ptr)
{
    /* The earlier window is gone whatever happens: commit must not reach a stale one. */
    st->reserved_len = 0;
    if (session_err(st->s))
        return ended(st->s);
    if (n == 0)
        return shmipc__fail(SHMIPC_EINVAL, "reserve: 0 bytes, need at least 1");
    /*
     * A window larger than a slice lives on the heap and goes out as fallback data: no more
     * than one message's payload, which any peer takes. A larger one would only allocate
     * gigabytes that no flush could send.
     */
    if (n > SHMIPC__MAX_MESSAGE - SHMIPC__FALLBACK_HEADER_SIZE)
        return shmipc__fail(SHMIPC_EMSGSIZE, "reserve: %zu bytes, at most %u", n,
                            SHMIPC__MAX_MESSAGE - SHMIPC__FALLBACK_HEADER_SIZE);
    struct shmipc__segment *seg = st->nsegs ? &st->segs[st->nsegs - 1] : NULL;
    if (seg == NULL || seg->cap - seg->used < n) {
        int rc = grow_send_buffer(st, n, 1);
        if (rc < 0)
            return end_on_bad_list(st->s, rc);
        seg = &st->segs[st->nsegs - 1];
    }
    st->reserved_len = (uint32_t)n;
    *ptr = seg->data + seg->used;
    return 0;
}

int shmipc__stream_commit(shmipc_stream *st, size_t n)
{
    /*
     * reserved_len is 0 exactly when no window is open (reserve takes at least 1 byte): after
     * a commit, write, flush, forward or a failed reserve, and on a fresh stream, whose send
     * buffer may have no segment at all. Committing then is a misuse, even of 0 bytes.
     */
    if (st->reserved_len == 0)
        return shmipc__fail(SHMIPC_EINVAL, "commit: no window is reserved (reserve first)");
    if (n > st->reserved_len)
        return shmipc__fail(SHMIPC_EINVAL, "commit: %zu bytes, but %u were reserved", n,
                            st->reserved_len);
    st->segs[st->nsegs - 1].used += (uint32_t)n;
    st->send_len += n;
    st->reserved_len = 0;
    return 0;
}

/* ------------------------------------------------------------------------------------ */
/* Forwarding                                                                           */
/* ------------------------------------------------------------------------------------ */

/*
 * Moves a whole received chunk of src onto dst's send buffer: a slice of dst's own session
 * becomes one of its segments as it is (the slice header is rewritten at flush); anything
 * else is copied and freed. Under src's mu.
 */
static int forward_chunk_locked(shmipc_stream *dst, shmipc_stream *src, uint32_t i)
{
    shmipc_session *s = src->s;
    struct shmipc__chunk *c = &src->chunks[i];
    struct shmipc__slice sl;
    if (c->slice != SHMIPC__HEAP_CHUNK && dst->s == s && c->len > 0) {
        struct shmipc__segment *seg = add_segment(dst);
        if (seg == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "stream %u: out of memory", dst->id);
        int rc = shmipc__buffer_slice_at(&s->bm, c->slice, &sl);
        if (rc == 0)
            rc = shmipc__buffer_slice_claim(&s->bm, &sl);
        if (rc < 0) {
            dst->nsegs--;
            return rc;
        }
        *seg = (struct shmipc__segment){c->data, c->len, c->len, c->slice};
        dst->send_len += c->len;
        /* Ours to send now: it stays marked in held until the flush hands it to the peer. */
        return 0;
    }
    int rc = c->len > 0 ? write_bytes(dst, c->data, c->len) : 0;
    if (rc == 0)
        free_chunks(s, src, i, i + 1);
    return rc;
}

/*
 * Moves src's first `total` bytes (from the oldest byte not released) onto dst's send
 * buffer. Stops at the first failure with everything consistent: what moved is in dst, the
 * rest is still src's. Returns the bytes moved in *moved. Under src's mu.
 */
static int forward_locked(shmipc_stream *dst, shmipc_stream *src, uint64_t total, uint64_t *moved)
{
    uint32_t i = 0;
    int rc = 0;
    *moved = 0;
    while (i < src->nchunks && *moved < total) {
        struct shmipc__chunk *c = &src->chunks[i];
        uint64_t want = total - *moved;
        if (c->len <= want) {
            if ((rc = forward_chunk_locked(dst, src, i)) < 0)
                break;
            *moved += c->len;
            i++;
            continue;
        }
        /* The bytes end inside this chunk: copy them; the chunk keeps the rest. */
        if ((rc = write_bytes(dst, c->data, (size_t)want)) < 0)
            break;
        trim_chunk_locked(src->s, c, (uint32_t)want);
        *moved += want;
    }
    drop_chunks_locked(src, i);
    return rc;
}

/* Bytes of src read and not yet released: what release would give back. Under mu. */
static uint64_t read_unreleased_locked(const shmipc_stream *st)
{
    uint64_t n = st->read_index < st->nchunks ? st->read_offset : 0;
    for (uint32_t i = 0; i < st->read_index; i++)
        n += st->chunks[i].len;
    return n;
}

/* Puts src's read position `pos` bytes after its first chunk's start. Under mu. */
static void seek_locked(shmipc_stream *st, uint64_t pos)
{
    st->read_index = 0;
    st->read_offset = 0;
    while (pos > 0 && st->read_index < st->nchunks) {
        uint32_t len = st->chunks[st->read_index].len;
        if (pos < len) {
            st->read_offset = (uint32_t)pos;
            return;
        }
        pos -= len;
        st->read_index++;
    }
}

int shmipc__stream_forward(shmipc_stream *dst, shmipc_stream *src, size_t n, int flags)
{
    shmipc_session *s = src->s;
    if (session_err(dst->s))
        return ended(dst->s);
    int bad_list = 0;
    dst->reserved_len = 0;
    lock(s);
    int rc = n > 0 ? wait_readable_locked(src, n, flags) : check_memory_locked(s);
    if (rc == 0) {
        uint64_t done = read_unreleased_locked(src), moved;
        rc = forward_locked(dst, src, done + n, &moved);
        bad_list = rc == SHMIPC_EPROTO;
        /* What moved is consumed; a failure leaves the rest where it was. */
        src->unread -= moved > done ? moved - done : 0;
        seek_locked(src, moved < done ? done - moved : 0);
        /* A copy may have read zeros from a truncated mapping (shm/guard.h). */
        if (rc == 0)
            rc = check_memory_locked(s);
        /* Only dst's pops fail with EPROTO in forward_locked: a bad list ends dst's session. */
        else if (bad_list && dst->s == s)
            rc = fail_locked(s, rc);
    }
    unlock(s);
    if (rc == 0)
        drop_scratch(src);
    if (bad_list && dst->s != s)
        rc = end_on_bad_list(dst->s, rc);
    return rc;
}

/*
 * Writes one whole control message to the socket. Under send_mu. A message cut part-way
 * (timeout, or an error after the first bytes) would make the peer misread every frame after
 * it, so that ends the session; one that never started leaves the socket whole.
 */
static int write_frame(shmipc_session *s, const uint8_t *msg, size_t len, uint64_t deadline)
{
    size_t sent = 0;
    int rc = 0;
    while (sent < len) {
        ssize_t n = send(s->fd, msg + sent, len - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            sent += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            if ((rc = shmipc__fd_wait(s->fd, POLLOUT, deadline)) < 0)
                break;
            continue;
        }
        rc = n < 0 && (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN)
                 ? shmipc__fail(SHMIPC_ECONNRESET, "socket: peer is gone (write)")
                 : shmipc__fail_errno(errno, "socket: send");
        break;
    }
    if (rc < 0 && sent > 0) {
        lock(s);
        rc = fail_locked(s, shmipc__fail(rc,
                                         "socket: a %zu-byte control message was cut after %zu "
                                         "bytes (%s); a half-written frame would poison the "
                                         "socket, so the session ends",
                                         len, sent, shmipc__errname(rc)));
        unlock(s);
    }
    return rc;
}

/* Sends the wakeup after a put, when the peer was not working already. Under send_mu. */
static int wake_peer(shmipc_session *s)
{
    /* Polling mode: the peer looks at the queue every interval; no wakeup at all. */
    if (s->wakeup == SHMIPC_WAKEUP_POLLING || shmipc__queue_mark_working(&s->qp.send) != 1)
        return 0;
    if (s->wakeup == SHMIPC_WAKEUP_EVENTFD) {
        uint64_t one = 1;
        /* EAGAIN means the counter is saturated: the peer has a wakeup pending anyway. */
        if (write(s->efd_send, &one, sizeof one) < 0 && errno != EAGAIN)
            return shmipc__fail_errno(errno, "session: eventfd wakeup");
        return 0;
    }
    uint8_t msg[SHMIPC__HEADER_SIZE];
    shmipc__encode_simple(msg, s->wire, SHMIPC__MSG_POLLING);
    return write_frame(s, msg, sizeof msg,
                       shmipc__deadline_ms(s->cfg.timeout_ms[SHMIPC_TIMEOUT_CONNECTION_WRITE]));
}

/* Puts an element, retrying a full queue as the reference does. Under send_mu. */
static int put_element(shmipc_stream *st, const struct shmipc__queue_elem *e)
{
    shmipc_session *s = st->s;
    uint64_t deadline = shmipc__deadline_ms(st->write_timeout_ms);
    int rc = shmipc__queue_put(&s->qp.send, e);
    for (int i = 0; rc == SHMIPC_EQUEUEFULL && i < QUEUE_FULL_RETRIES; i++) {
        uint64_t now = shmipc__now_ns();
        if (deadline != 0 && now >= deadline)
            return shmipc__fail(SHMIPC_ETIMEDOUT, "stream %u: write timed out, queue full", st->id);
        if (session_err(s))
            return ended(s);
        if (stream_is_shut(st))
            return stream_shut_error(st);
        struct timespec ts = {0, (long)QUEUE_FULL_WAIT_NS};
        nanosleep(&ts, NULL);
        rc = shmipc__queue_put(&s->qp.send, e);
    }
    if (rc == SHMIPC_EQUEUEFULL)
        return shmipc__fail(SHMIPC_EQUEUEFULL, "stream %u: the peer's queue stayed full", st->id);
    return rc;
}

/*
 * Writes fallback data to the socket. While the socket is full it reads what the peer sends:
 * a peer that is itself blocked writing fallback data to us would otherwise never drain its
 * end, and both sides would wait for each other until the write timeout.
 */
static int fallback_write(shmipc_session *s, const uint8_t *p, size_t len, uint64_t deadline,
                          size_t *sent)
{
    while (len > 0) {
        ssize_t n = send(s->fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            *sent += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN)
            return errno == EPIPE || errno == ECONNRESET
                       ? shmipc__fail(SHMIPC_ECONNRESET, "socket: peer is gone (write)")
                       : shmipc__fail_errno(errno, "socket: send");
        lock(s);
        int reader = !s->processing;
        if (reader)
            s->processing = 1;
        unlock(s);
        /* Watch for input only when no other thread is reading it, or we would spin. */
        struct pollfd pfd = {.fd = s->fd, .events = POLLOUT | (reader ? POLLIN : 0)};
        int rc = poll(&pfd, 1, shmipc__remaining_ms(deadline));
        lock(s);
        if (reader) {
            if (rc > 0 && (pfd.revents & POLLIN))
                process_locked(s);
            s->processing = 0;
            pthread_cond_broadcast(&s->cond);
        }
        /* Under mu, so a plain read (gcc 12 with ASan misreports the atomic load here as a
         * stringop overflow). */
        int err = s->err;
        unlock(s);
        if (err)
            return ended(s);
        if (rc == 0)
            return shmipc__fail(SHMIPC_ETIMEDOUT, "socket: timed out writing fallback data");
        if (rc < 0 && errno != EINTR)
            return shmipc__fail_errno(errno, "socket: poll");
    }
    return 0;
}

static int send_fallback(shmipc_stream *st)
{
    shmipc_session *s = st->s;
    uint64_t deadline = shmipc__deadline_ms(s->cfg.timeout_ms[SHMIPC_TIMEOUT_CONNECTION_WRITE]);
    uint32_t i = 0, off = 0;
    size_t sent = 0;
    int rc = 0;
    pthread_mutex_lock(&s->send_mu);
    /* One message per at most SHMIPC__MAX_MESSAGE bytes, so any peer can take it. */
    while (rc == 0 && i < st->nsegs) {
        uint32_t room = SHMIPC__MAX_MESSAGE - SHMIPC__FALLBACK_HEADER_SIZE, total = 0;
        uint32_t j = i, joff = off;
        while (j < st->nsegs && total < room) {
            uint32_t take = st->segs[j].used - joff;
            if (take > room - total) {
                take = room - total;
                joff += take;
            } else {
                j++;
                joff = 0;
            }
            total += take;
        }
        uint8_t head[SHMIPC__FALLBACK_HEADER_SIZE];
        shmipc__encode_fallback_head(head, s->wire, st->id, 0, total);
        rc = fallback_write(s, head, sizeof head, deadline, &sent);
        while (rc == 0 && total > 0) {
            uint32_t take = st->segs[i].used - off;
            if (take > total)
                take = total;
            rc = fallback_write(s, st->segs[i].data + off, take, deadline, &sent);
            total -= take;
            off += take;
            if (off == st->segs[i].used) {
                i++;
                off = 0;
            }
        }
    }
    lock(s);
    s->unhealthy_until_ns = shmipc__now_ns() + BREAKER_NS;
    /*
     * Bytes of this message went out and the rest cannot follow: the peer would read the
     * next frame as the rest of this one, on the socket every stream shares. Nothing can
     * resync it, so the session ends (before send_mu is let go: no frame follows the half).
     * A timeout before the first byte leaves the socket whole and the session alive.
     */
    if (rc < 0 && session_err(s) == 0 && sent > 0)
        rc = fail_locked(s, shmipc__fail(rc,
                                         "stream %u: fallback write failed after %zu bytes of a "
                                         "%llu-byte message (%s); a half-written frame would "
                                         "poison the socket, so the session ends",
                                         st->id, sent, (unsigned long long)st->send_len,
                                         shmipc__errname(rc)));
    else if (rc < 0 && rc != SHMIPC_ETIMEDOUT)
        rc = fail_locked(s, rc); /* the session's cause (a damaged mapping wins) */
    unlock(s);
    pthread_mutex_unlock(&s->send_mu);
    __atomic_store_n(&st->fallback, 1, __ATOMIC_RELAXED);
    free_segments(s, st);
    return rc;
}

int shmipc__stream_flush(shmipc_stream *st)
{
    shmipc_session *s = st->s;
    int rc = 0, heap = 0;
    uint32_t n = 0;
    st->reserved_len = 0;
    /* Drop segments that hold nothing (a reserve that was never committed). */
    for (uint32_t i = 0; i < st->nsegs; i++) {
        if (st->segs[i].used == 0) {
            if (st->segs[i].slice == SHMIPC__HEAP_CHUNK)
                free(st->segs[i].data);
            else
                shmipc__buffer_free(&s->bm, st->segs[i].slice);
            continue;
        }
        heap |= st->segs[i].slice == SHMIPC__HEAP_CHUNK;
        st->segs[n++] = st->segs[i];
    }
    st->nsegs = n;
    if (st->send_len == 0)
        return 0;
    if (session_err(s)) {
        free_segments(s, st);
        return ended(s);
    }
    if (__atomic_load_n(&st->state, __ATOMIC_RELAXED) == SHMIPC__STREAM_PEER_CLOSED) {
        free_segments(s, st);
        return shmipc__fail(SHMIPC_EEOF, "stream %u: the peer closed the stream", st->id);
    }
    /* The payload went into memory the peer may have truncated (shm/guard.h). */
    if (shmipc__session_memory_damaged(s)) {
        free_segments(s, st);
        return check_memory(s);
    }
    int fell_back = __atomic_load_n(&st->fallback, __ATOMIC_RELAXED);
    if (heap || fell_back) {
        /* Warn once per stream: after the first fallback every message takes the socket. */
        SHMIPC__LOG(fell_back ? SHMIPC__LOG_DEBUG : SHMIPC__LOG_WARN,
                    "stream %u: %llu bytes go over the socket (fallback)%s", st->id,
                    (unsigned long long)st->send_len,
                    fell_back ? "" : "; the stream stays on the socket from now on");
        return send_fallback(st);
    }
    /* Hand the chain to the peer: sizes, links, then one queue element for its head. */
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        struct shmipc__slice sl;
        rc = shmipc__buffer_slice_at(&s->bm, st->segs[i].slice, &sl);
        /* A forwarded slice's bytes may start past its beginning. */
        if (rc == 0)
            rc = shmipc__buffer_slice_set(&s->bm, &sl, (uint32_t)(st->segs[i].data - sl.data),
                                          st->segs[i].used);
        if (rc == 0 && i + 1 < n)
            rc = shmipc__buffer_slice_link(&s->bm, &sl, st->segs[i + 1].slice);
    }
    if (rc == 0) {
        struct shmipc__queue_elem e = {st->id, st->segs[0].slice, 0};
        /*
         * The chain leaves our hands with the element: unmark it before the peer can see it,
         * free it and have it popped again (by us: a mark left behind would read as a double
         * hand-out). Should the put fail, free_segments() pushes them back unmarked.
         */
        for (uint32_t i = 0; i < n; i++)
            shmipc__held_drop(&s->bm, s->held, st->segs[i].slice);
        pthread_mutex_lock(&s->send_mu);
        rc = put_element(st, &e);
        if (rc == 0) {
            st->nsegs = 0; /* the slices are the peer's now */
            st->send_len = 0;
            rc = wake_peer(s);
        }
        pthread_mutex_unlock(&s->send_mu);
        if (rc < 0 && rc != SHMIPC_EQUEUEFULL && rc != SHMIPC_ETIMEDOUT) {
            lock(s);
            rc = fail_locked(s, rc); /* the session's cause (a damaged mapping wins) */
            unlock(s);
        }
    }
    free_segments(s, st);
    /* The chain and its element went into memory that may have been truncated meanwhile. */
    if (rc == 0 && shmipc__session_memory_damaged(s))
        rc = check_memory(s);
    return rc;
}

/* ------------------------------------------------------------------------------------ */
/* Closing                                                                              */
/* ------------------------------------------------------------------------------------ */

/* Tells the peer the stream is closed: a queue element, or StreamClose when it is full. */
static void send_close(shmipc_stream *st)
{
    shmipc_session *s = st->s;
    struct shmipc__queue_elem e = {st->id, 0, 1};
    uint64_t deadline = shmipc__deadline_ms(s->cfg.timeout_ms[SHMIPC_TIMEOUT_CONNECTION_WRITE]);
    int rc;
    pthread_mutex_lock(&s->send_mu);
    if (shmipc__queue_put(&s->qp.send, &e) == 0) {
        rc = wake_peer(s);
    } else {
        uint8_t msg[12];
        shmipc__encode_stream_close(msg, s->wire, st->id);
        rc = write_frame(s, msg, sizeof msg, deadline);
    }
    pthread_mutex_unlock(&s->send_mu);
    if (rc < 0)
        SHMIPC__LOG(SHMIPC__LOG_DEBUG, "stream %u: close not delivered: %s", st->id,
                    shmipc__detail());
}

void shmipc__stream_close(shmipc_stream *st)
{
    shmipc_session *s = st->s;
    if (session_err(s) == 0)
        send_close(st);
    free_segments(s, st);
    lock(s);
    if (st->in_table)
        remove_locked(s, st);
    free_chunks(s, st, 0, st->nchunks);
    unlock(s);
    stream_free_memory(st);
    session_release(s);
}

/* ------------------------------------------------------------------------------------ */
/* Shutdown and close from another thread                                               */
/* ------------------------------------------------------------------------------------ */

int shmipc__stream_enter(shmipc_stream *st, int even_shut)
{
    uint32_t v = __atomic_load_n(&st->inuse, __ATOMIC_RELAXED);
    uint32_t refuse = SHMIPC__STREAM_CLOSING | (even_shut ? 0 : SHMIPC__STREAM_SHUT);
    do {
        if (v & refuse)
            return v & SHMIPC__STREAM_CLOSING
                       ? shmipc__fail(SHMIPC_ECLOSED, "stream %u: closed", st->id)
                       : stream_shut_error(st);
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
    /* Counted in, so that a close from another thread meanwhile frees nothing under us. */
    __atomic_add_fetch(&st->inuse, 1, __ATOMIC_ACQ_REL);
    __atomic_fetch_or(&st->inuse, SHMIPC__STREAM_SHUT, __ATOMIC_ACQ_REL);
    lock(s);
    if (s->processing && s->kick_fd >= 0) {
        uint64_t one = 1;
        /* EAGAIN: the counter is saturated, a kick is pending anyway. */
        (void)!write(s->kick_fd, &one, sizeof one);
    }
    pthread_cond_broadcast(&s->cond);
    unlock(s);
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
    lock(s);
    int ok = st->state == SHMIPC__STREAM_OPEN &&
             !__atomic_load_n(&st->fallback, __ATOMIC_RELAXED) && st->unread == 0 &&
             st->nchunks == 0 && st->send_len == 0 && st->nsegs == 0 &&
             (__atomic_load_n(&st->inuse, __ATOMIC_ACQUIRE) & SHMIPC__STREAM_SHUT) == 0 &&
             session_err(s) == 0;
    unlock(s);
    return ok;
}

void shmipc__stream_close_handle(shmipc_stream *st)
{
    /*
     * Counted in as a call of its own, so that a call in flight that leaves meanwhile cannot
     * free the stream under the wakeup; the last one out (maybe this one) frees it.
     */
    __atomic_add_fetch(&st->inuse, 1, __ATOMIC_ACQ_REL);
    __atomic_fetch_or(&st->inuse, SHMIPC__STREAM_CLOSING | SHMIPC__STREAM_SHUT, __ATOMIC_ACQ_REL);
    shmipc__stream_shutdown(st);
    shmipc__stream_leave(st);
}
