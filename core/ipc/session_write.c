/*
 * Writing: write, reserve/commit into shared-memory segments, flush (queue elements and the
 * wakeup), the fallback over the socket when shared memory is short, and StreamClose.
 *
 * May call: shm/, ipc/proto, ipc/sockio, the slice cache, the stream state machine and the
 * session's error through session_int.h.
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

struct shmipc__segment *shmipc__stream_add_segment(shmipc_stream *st)
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

/* memory_wait: the longest sleep between two looks at the free lists. */
#define MEMORY_WAIT_MAX_NS (1000ull * 1000ull)

/*
 * What the peer sent meanwhile (its close of a stream, the session's end) is taken in here
 * when no other thread reads the session, without waiting: a writer that waits for memory, or
 * sends over the socket, would otherwise go on writing to a stream the peer has closed. Not
 * on a loop-driven session: its loop processes it, and news taken here would give it no edge.
 * `passing` (a fallback flush, not a wait): nor on a session whose descriptor was handed to
 * an event loop (shmipc_session_fileno()), for the same reason; such a writer learns of the
 * close from the loop's next turn.
 */
static void see_peer_news(shmipc_session *s, int passing)
{
    shmipc__session_lock(s);
    if (!s->processing && !s->loop_driven && !(passing && s->watched)) {
        s->processing = 1;
        (void)shmipc__session_process_locked(s);
        s->processing = 0;
        pthread_cond_broadcast(&s->cond);
    }
    shmipc__session_unlock(s);
}

/*
 * memory_wait: shared memory is exhausted, and the peer frees slices as it reads (it sends no
 * wakeup for that): sleeps a little, 20 µs doubling to 1 ms, unless the wait must end (the
 * session ended, the stream was shut or closed by the peer, the write timeout passed).
 */
static int wait_for_memory(shmipc_stream *st, uint64_t deadline, uint64_t *nap_ns)
{
    shmipc_session *s = st->s;
    if (shmipc__session_err(s))
        return shmipc__session_ended(s);
    if (shmipc__stream_is_shut(st))
        return shmipc__stream_shut_error(st);
    if (__atomic_load_n(&st->state, __ATOMIC_RELAXED) == SHMIPC__STREAM_PEER_CLOSED)
        return shmipc__fail(SHMIPC_EEOF, "stream %u: the peer closed the stream", st->id);
    if (deadline != 0 && shmipc__now_ns() >= deadline)
        return shmipc__fail(SHMIPC_ETIMEDOUT,
                            "stream %u: write timed out waiting for shared memory (memory_wait)",
                            st->id);
    struct timespec ts = {0, (long)*nap_ns};
    nanosleep(&ts, NULL);
    *nap_ns = *nap_ns * 2 > MEMORY_WAIT_MAX_NS ? MEMORY_WAIT_MAX_NS : *nap_ns * 2;
    see_peer_news(s, 0);
    return 0;
}

/* write_bytes()'s modes: a memory_wait write may wait for a slice; a shared-memory-only
 * write (shmipc__stream_write_shm) fails rather than taking the heap. */
#define GROW_MAY_WAIT 1
#define GROW_SHM_ONLY 2

/*
 * Appends a segment of at least `want` bytes: a slice, or heap memory when none is free (the
 * fallback), or, with memory_wait and GROW_MAY_WAIT, a slice once the peer freed one; with
 * GROW_SHM_ONLY, SHMIPC_ENOSHM instead of the heap.
 */
static int grow_send_buffer(shmipc_stream *st, size_t want, int contiguous, int mode)
{
    int may_wait = mode & GROW_MAY_WAIT;
    shmipc_session *s = st->s;
    uint32_t max = shmipc__buffer_max_slice(&s->bm);
    struct shmipc__segment *seg = shmipc__stream_add_segment(st);
    if (seg == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "stream %u: out of memory", st->id);
    if (!__atomic_load_n(&st->fallback, __ATOMIC_RELAXED) && !(contiguous && want > max)) {
        struct shmipc__slice sl;
        uint32_t ask = (uint32_t)(want > max ? max : want);
        uint64_t deadline = 0, nap_ns = 20000;
        int rc;
        for (int round = 0;; round++) {
            rc = shmipc__session_cache_get(s, ask, &sl);
            if (rc != 0)
                rc = shmipc__buffer_alloc(&s->bm, ask, &sl);
            /* A copying write can use any slice: take the largest one still free. */
            if (rc == SHMIPC_ENOSHM && !contiguous)
                rc = shmipc__buffer_alloc_many(&s->bm, want, &sl, 1) == 1 ? 0 : SHMIPC_ENOSHM;
            if (rc != SHMIPC_ENOSHM || !may_wait || !s->cfg.memory_wait)
                break;
            if (round == 0)
                deadline = shmipc__wait_deadline(st->write_timeout_ms);
            if ((rc = wait_for_memory(st, deadline, &nap_ns)) < 0) {
                st->nsegs--;
                return rc;
            }
        }
        if (rc == 0) {
            *seg = (struct shmipc__segment){sl.data, sl.cap, 0, sl.offset};
            return 0;
        }
        if (rc != SHMIPC_ENOSHM) {
            st->nsegs--;
            return rc;
        }
    }
    if (mode & GROW_SHM_ONLY) {
        st->nsegs--;
        return SHMIPC_ENOSHM; /* no detail: an expected answer, asked again later */
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
 * A send that found the peer's end closed (SHMIPC_ECONNRESET: EPIPE, ECONNRESET, ENOTCONN):
 * what the peer put in the queue and on the socket before it left is still its word, as when
 * a read finds its end (take_recv_locked): a shmipc-serve worker's last answer, then its exit.
 * It is taken first, so its streams end as it ended them and their data stays readable; the
 * caller then ends the session, which ends with what that turn found (the peer's end), or with
 * `rc`. Not while another thread processes the session: it finds the end itself. Returns `rc`,
 * its detail kept. Under mu (and send_mu or not).
 */
static int take_peers_word_locked(shmipc_session *s, int rc)
{
    if (rc == SHMIPC_ECONNRESET && shmipc__session_err(s) == 0 && !s->processing) {
        char why[256];
        snprintf(why, sizeof why, "%s", shmipc__detail());
        s->processing = 1;
        (void)shmipc__session_process_fds_locked(s, SHMIPC__SOCKET_DRAIN);
        s->processing = 0;
        rc = shmipc__fail(rc, "%s", why);
    }
    return rc;
}

/* Ends the session for `rc` (the session's own cause when it ended already: a damaged mapping
 * wins) and returns that cause. Without mu. */
static int fail_session(shmipc_session *s, int rc)
{
    shmipc__session_lock(s);
    rc = take_peers_word_locked(s, rc);
    rc = shmipc__session_fail_locked(s, rc);
    shmipc__session_unlock(s);
    return rc;
}

/*
 * A free list that handed out a slice in our hands (shmipc__buffer_alloc's SHMIPC_EPROTO):
 * the shared lists cannot be trusted any more, so the session ends. Without mu.
 */
int shmipc__session_end_on_bad_list(shmipc_session *s, int rc)
{
    if (rc != SHMIPC_EPROTO)
        return rc;
    return fail_session(s, rc);
}

static int write_bytes(shmipc_stream *st, const void *buf, size_t len, int mode);

/* shmipc__stream_write() for a caller that may hold mu (forward): see end_on_bad_list. Never
 * waits for shared memory. */
int shmipc__stream_write_bytes(shmipc_stream *st, const void *buf, size_t len)
{
    return write_bytes(st, buf, len, 0);
}

static int write_bytes(shmipc_stream *st, const void *buf, size_t len, int mode)
{
    const uint8_t *p = buf;
    if (shmipc__session_err(st->s))
        return shmipc__session_ended(st->s);
    st->reserved_len = 0;
    while (len > 0) {
        struct shmipc__segment *seg = st->nsegs ? &st->segs[st->nsegs - 1] : NULL;
        if (seg == NULL || seg->used == seg->cap) {
            int rc = grow_send_buffer(st, len, 0, mode);
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

/* Takes back what a failed write copied: the segments it added, the bytes it appended. */
static void unwrite(shmipc_stream *st, uint32_t nsegs, uint32_t used, uint64_t send_len)
{
    shmipc_session *s = st->s;
    while (st->nsegs > nsegs) {
        struct shmipc__segment *seg = &st->segs[--st->nsegs];
        if (seg->slice == SHMIPC__HEAP_CHUNK)
            free(seg->data);
        else
            shmipc__buffer_free(&s->bm, seg->slice);
    }
    if (nsegs > 0)
        st->segs[nsegs - 1].used = used;
    st->send_len = send_len;
}

int shmipc__stream_write(shmipc_stream *st, const void *buf, size_t len)
{
    uint32_t nsegs = st->nsegs, used = nsegs ? st->segs[nsegs - 1].used : 0;
    uint64_t send_len = st->send_len;
    int rc = write_bytes(st, buf, len, GROW_MAY_WAIT);
    /* A write that fails adds nothing (with memory_wait it may have copied part of its data
     * before the wait for the rest ran out); a session that ended frees everything anyway. */
    if (rc < 0 && !shmipc__session_err(st->s))
        unwrite(st, nsegs, used, send_len);
    return shmipc__session_end_on_bad_list(st->s, rc);
}

int shmipc__stream_write_shm(shmipc_stream *st, const struct iovec *iov, size_t n)
{
    uint32_t nsegs = st->nsegs, used = nsegs ? st->segs[nsegs - 1].used : 0;
    uint64_t send_len = st->send_len;
    int rc = 0;
    /* A stream on the socket sends every later message there too: nothing fits "now". */
    if (__atomic_load_n(&st->fallback, __ATOMIC_RELAXED))
        return SHMIPC_ENOSHM;
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = write_bytes(st, iov[i].iov_base, iov[i].iov_len, GROW_SHM_ONLY);
    /* All or nothing: a frame's header never goes without its payload. */
    if (rc < 0 && !shmipc__session_err(st->s))
        unwrite(st, nsegs, used, send_len);
    return shmipc__session_end_on_bad_list(st->s, rc);
}

int shmipc__stream_reserve(shmipc_stream *st, size_t n, void **ptr)
{
    /* The earlier window is gone whatever happens: commit must not reach a stale one. */
    st->reserved_len = 0;
    if (shmipc__session_err(st->s))
        return shmipc__session_ended(st->s);
    if (n == 0)
        return shmipc__fail(SHMIPC_EINVAL, "reserve: 0 bytes, need at least 1");
    /*
     * A window is one slice: one larger than the largest slice class could only live on the
     * heap and would move the stream to the socket for good, a cost the caller did not ask
     * for. It is refused and nothing changes; write() splits any size across slices. (A window
     * that fits a class but finds shared memory exhausted still takes the heap, as in Go.)
     */
    uint32_t max = shmipc__buffer_max_slice(&st->s->bm);
    if (n > max)
        return shmipc__fail(SHMIPC_EMSGSIZE,
                            "reserve: %zu bytes, but the largest slice holds %u (write() splits "
                            "larger data across slices)",
                            n, max);
    /* A window that may have to go out as fallback data holds at most one message's payload. */
    if (n > SHMIPC__MAX_MESSAGE - SHMIPC__FALLBACK_HEADER_SIZE)
        return shmipc__fail(SHMIPC_EMSGSIZE, "reserve: %zu bytes, at most %u", n,
                            SHMIPC__MAX_MESSAGE - SHMIPC__FALLBACK_HEADER_SIZE);
    struct shmipc__segment *seg = st->nsegs ? &st->segs[st->nsegs - 1] : NULL;
    if (seg == NULL || seg->cap - seg->used < n) {
        int rc = grow_send_buffer(st, n, 1, GROW_MAY_WAIT);
        if (rc < 0)
            return shmipc__session_end_on_bad_list(st->s, rc);
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

/*
 * Writes one whole control message to the socket. Under send_mu. A message cut part-way
 * (timeout, or an error after the first bytes) would make the peer misread every frame after
 * it, so that ends the session. So does a timeout before the first byte: the peer read nothing
 * for the whole connection write timeout, and left up, the session would make every later
 * wakeup and close wait that long again, one after another (serve()'s thread, for every
 * session it drives). Go's shmipc ends a session on any failed write too.
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
    if (rc < 0 && sent > 0)
        rc = fail_session(s, shmipc__fail(rc,
                                          "socket: a %zu-byte control message was cut after %zu "
                                          "bytes (%s); a half-written frame would poison the "
                                          "socket, so the session ends",
                                          len, sent, shmipc__errname(rc)));
    else if (rc == SHMIPC_ETIMEDOUT)
        rc = fail_session(
            s, shmipc__fail(rc,
                            "socket: the peer read nothing for the connection write timeout "
                            "(a %zu-byte control message could not start), so the session ends",
                            len));
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
                       shmipc__wait_deadline(s->cfg.timeout_ms[SHMIPC_TIMEOUT_CONNECTION_WRITE]));
}

/* Puts an element, retrying a full queue as the reference does. Under send_mu. */
static int put_element(shmipc_stream *st, const struct shmipc__queue_elem *e)
{
    shmipc_session *s = st->s;
    int rc = shmipc__queue_put(&s->qp.send, e);
    if (rc != SHMIPC_EQUEUEFULL)
        return rc;
    /* Only a full queue needs the clock: a put that succeeds (nearly all) reads none. */
    uint64_t deadline = shmipc__wait_deadline(st->write_timeout_ms);
    for (int i = 0; rc == SHMIPC_EQUEUEFULL && i < QUEUE_FULL_RETRIES; i++) {
        uint64_t now = shmipc__now_ns();
        if (deadline != 0 && now >= deadline)
            return shmipc__fail(SHMIPC_ETIMEDOUT, "stream %u: write timed out, queue full", st->id);
        if (shmipc__session_err(s))
            return shmipc__session_ended(s);
        if (shmipc__stream_is_shut(st))
            return shmipc__stream_shut_error(st);
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
        shmipc__session_lock(s);
        int reader = !s->processing;
        if (reader)
            s->processing = 1;
        shmipc__session_unlock(s);
        /* Watch for input only when no other thread is reading it, or we would spin. */
        struct pollfd pfd = {.fd = s->fd, .events = POLLOUT | (reader ? POLLIN : 0)};
        int rc = poll(&pfd, 1, shmipc__remaining_ms(deadline));
        shmipc__session_lock(s);
        if (reader) {
            if (rc > 0 && (pfd.revents & POLLIN))
                shmipc__session_process_locked(s);
            s->processing = 0;
            pthread_cond_broadcast(&s->cond);
        }
        /* Under mu, so a plain read (gcc 12 with ASan misreports the atomic load here as a
         * stringop overflow). */
        int err = s->err;
        shmipc__session_unlock(s);
        if (err)
            return shmipc__session_ended(s);
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
    uint32_t i = 0, off = 0, len = 0;
    size_t sent = 0;       /* bytes of the message being written */
    size_t flush_sent = 0; /* bytes of the messages before it, all gone out */
    int rc = 0;
    pthread_mutex_lock(&s->send_mu);
    /*
     * The timeout runs from here: time spent waiting for another writer (a long fallback
     * flush of another stream) says nothing of the peer, and a timeout ends the session.
     */
    uint64_t deadline = shmipc__wait_deadline(s->cfg.timeout_ms[SHMIPC_TIMEOUT_CONNECTION_WRITE]);
    /* One message per at most SHMIPC__MAX_MESSAGE bytes, so any peer can take it. */
    while (rc == 0 && i < st->nsegs) {
        /* Between two messages the socket is whole: a close the peer sent meanwhile (read
         * now if nobody else reads) ends the write here, as it would on shared memory. */
        flush_sent += sent;
        sent = 0;
        see_peer_news(s, 1);
        if (shmipc__session_err(s)) {
            rc = shmipc__session_ended(s);
            break;
        }
        if (__atomic_load_n(&st->state, __ATOMIC_RELAXED) == SHMIPC__STREAM_PEER_CLOSED) {
            rc = shmipc__fail(SHMIPC_EEOF, "stream %u: the peer closed the stream", st->id);
            break;
        }
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
        len = total;
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
    shmipc__session_lock(s);
    s->unhealthy_until_ns = shmipc__now_ns() + BREAKER_NS;
    /* The peer gone: what it sent before is taken first, as for a wakeup (fail_session). */
    rc = take_peers_word_locked(s, rc);
    /*
     * Bytes of this message went out and the rest cannot follow: the peer would read the
     * next frame as the rest of this one, on the socket every stream shares. Nothing can
     * resync it, so the session ends (before send_mu is let go: no frame follows the half).
     * After whole messages of the flush went out, the stream would go on with a gap (the
     * caller cannot tell what arrived), so the session ends as well. A timeout before the
     * first byte of the flush ends it too: the peer read nothing for the whole connection
     * write timeout, and every later write would wait that long again (write_frame). The
     * peer's close, seen between two messages, ends only the stream: nothing more of it is
     * read.
     */
    if (rc < 0 && shmipc__session_err(s) == 0 && sent == 0 && flush_sent > 0 && rc != SHMIPC_EEOF)
        rc = shmipc__session_fail_locked(
            s, shmipc__fail(rc,
                            "stream %u: fallback write failed after %zu bytes of a %llu-byte "
                            "flush (%s); the rest would leave a gap in the stream, so the "
                            "session ends",
                            st->id, flush_sent, (unsigned long long)st->send_len,
                            shmipc__errname(rc)));
    else if (rc < 0 && shmipc__session_err(s) == 0 && sent > 0)
        rc = shmipc__session_fail_locked(
            s, shmipc__fail(rc,
                            "stream %u: fallback write failed after %zu bytes of a "
                            "%llu-byte message (%s); a half-written frame would "
                            "poison the socket, so the session ends",
                            st->id, sent, (unsigned long long)len + SHMIPC__FALLBACK_HEADER_SIZE,
                            shmipc__errname(rc)));
    else if (rc == SHMIPC_ETIMEDOUT && shmipc__session_err(s) == 0)
        rc = shmipc__session_fail_locked(
            s, shmipc__fail(rc,
                            "stream %u: the peer read nothing for the connection write timeout "
                            "(fallback data could not start), so the session ends",
                            st->id));
    else if (rc < 0 && rc != SHMIPC_ETIMEDOUT && rc != SHMIPC_EEOF)
        rc = shmipc__session_fail_locked(s, rc); /* the session's cause (a damaged mapping wins) */
    shmipc__session_unlock(s);
    pthread_mutex_unlock(&s->send_mu);
    shmipc__stream_set_fallback(st);
    shmipc__session_free_segments(s, st);
    return rc;
}

static int flush(shmipc_stream *st, int close_after, int defer);

int shmipc__stream_flush(shmipc_stream *st)
{
    return flush(st, 0, 0);
}

int shmipc__stream_flush_close(shmipc_stream *st)
{
    return flush(st, 1, 0);
}

int shmipc__stream_flush_deferred(shmipc_stream *st)
{
    return flush(st, 0, 1);
}

int shmipc__session_wake_owed(shmipc_session *s)
{
    int rc = 0;
    pthread_mutex_lock(&s->send_mu);
    if (s->wake_owed) {
        s->wake_owed = 0;
        rc = wake_peer(s);
    }
    pthread_mutex_unlock(&s->send_mu);
    if (rc < 0)
        rc = fail_session(s, rc);
    return rc;
}

static int flush(shmipc_stream *st, int close_after, int defer)
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
    if (shmipc__session_err(s)) {
        shmipc__session_free_segments(s, st);
        return shmipc__session_ended(s);
    }
    if (__atomic_load_n(&st->state, __ATOMIC_RELAXED) == SHMIPC__STREAM_PEER_CLOSED) {
        shmipc__session_free_segments(s, st);
        return shmipc__fail(SHMIPC_EEOF, "stream %u: the peer closed the stream", st->id);
    }
    /* The payload went into memory the peer may have truncated (shm/guard.h). */
    if (shmipc__session_memory_damaged(s)) {
        shmipc__session_free_segments(s, st);
        return shmipc__session_check_memory(s);
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
         * hand-out). Should the put fail, shmipc__session_free_segments() pushes them back unmarked.
         */
        for (uint32_t i = 0; i < n; i++)
            shmipc__held_drop(&s->bm, s->held, st->segs[i].slice);
        pthread_mutex_lock(&s->send_mu);
        rc = put_element(st, &e);
        if (rc == 0) {
            st->nsegs = 0; /* the slices are the peer's now */
            st->send_len = 0;
            /* The close element right behind the data: one wakeup for both. A full queue
             * leaves the close to shmipc__stream_close (StreamClose on the socket). */
            struct shmipc__queue_elem c = {st->id, 0, 1};
            if (close_after && shmipc__queue_put(&s->qp.send, &c) == 0)
                st->close_sent = 1;
            if (defer) {
                s->wake_owed = 1;
            } else {
                s->wake_owed = 0; /* this wakeup is the one owed as well */
                rc = wake_peer(s);
            }
        }
        pthread_mutex_unlock(&s->send_mu);
        if (rc < 0 && rc != SHMIPC_EQUEUEFULL && rc != SHMIPC_ETIMEDOUT)
            rc = fail_session(s, rc);
    }
    shmipc__session_free_segments(s, st);
    /* The chain and its element went into memory that may have been truncated meanwhile. */
    if (rc == 0 && shmipc__session_memory_damaged(s))
        rc = shmipc__session_check_memory(s);
    return rc;
}

/*
 * Tells the peer the stream is closed: a queue element, or StreamClose when it is full.
 *
 * A close after the peer's own (we have read its close element) wakes nobody: the peer
 * removed the stream when it closed it, and ignores this element (docs/protocol.md, "Closing a
 * stream"), which it takes with its next wakeup. Waking it for that costs it a wakeup and a
 * turn for nothing, once per exchange of a request-reply peer that closes first (shmipc-serve's
 * workers). Such elements are left in the queue only while it is at most half full, so they
 * never crowd out a message; a close that finds it fuller wakes the peer as usual.
 */
void shmipc__stream_send_close(shmipc_stream *st)
{
    shmipc_session *s = st->s;
    struct shmipc__queue_elem e = {st->id, 0, 1};
    int second = __atomic_load_n(&st->state, __ATOMIC_RELAXED) == SHMIPC__STREAM_PEER_CLOSED;
    int rc;
    pthread_mutex_lock(&s->send_mu);
    if (shmipc__queue_put(&s->qp.send, &e) == 0) {
        int n = second ? shmipc__queue_size(&s->qp.send) : 0;
        rc = second && n >= 0 && (uint32_t)n <= s->qp.send.cap / 2 ? 0 : wake_peer(s);
    } else {
        uint8_t msg[12];
        shmipc__encode_stream_close(msg, s->wire, st->id);
        /* The timeout runs from here, not from before the wait for send_mu (send_fallback). */
        rc = write_frame(s, msg, sizeof msg,
                         shmipc__wait_deadline(s->cfg.timeout_ms[SHMIPC_TIMEOUT_CONNECTION_WRITE]));
    }
    pthread_mutex_unlock(&s->send_mu);
    if (rc < 0)
        SHMIPC__LOG(SHMIPC__LOG_DEBUG, "stream %u: close not delivered: %s", st->id,
                    shmipc__detail());
}
