/*
 * Receive dispatch: what the processor does with an event. Queue elements (data chains,
 * closes) and socket messages (fallback data, StreamClose, errors) go to their streams; a
 * data message for an unknown id opens a stream on the server. Under mu throughout.
 *
 * May call: shm/, ipc/proto, ipc/sockio, the stream table and state machine and the
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

/* Remembers that stream `id` has news, for a listener serving with callbacks. Under mu. */
void shmipc__session_note_ready_locked(shmipc_session *s, uint32_t id)
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
    shmipc__session_note_ready_locked(s, st->id);
    return 0;
}

/* The stream for a data message with id `id`: a known one, or a new one on the server. */
static int stream_for_data_locked(shmipc_session *s, uint32_t id, shmipc_stream **out)
{
    shmipc_stream *st = shmipc__session_lookup_locked(s, id);
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
        if ((st = shmipc__stream_new(s, id)) == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "session: out of memory for a new stream");
        if ((rc = shmipc__session_insert_locked(s, st)) < 0) {
            free(st);
            return rc;
        }
        s->accept_q[(s->accept_head + s->accept_len++) % s->accept_cap] = st;
    }
    *out = st;
    return 0;
}

/* Close elements one turn may keep waiting (at least: a queue's capacity may be more). */
#define MAX_CLOSES_DUE (1u << 20)

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

/*
 * A close element: the peer may have written FallbackData for the stream (even the message
 * that opens it here) just before it put the close, after our last recv. The close waits
 * until the turn has read the socket again (shmipc__session_apply_closes_locked); applied at
 * once it would end the stream before that data, or be dropped for an id not known yet.
 */
static int close_due_locked(shmipc_session *s, uint32_t id)
{
    /*
     * Each close waits on our heap until the turn reads the socket, and a turn drains until the
     * queue is empty: a peer that refills it as fast as we take would grow the list without
     * end (and keep the turn going). One turn of an honest peer brings at most a queue's worth
     * of closes unless it keeps the queue from ever emptying; past the larger of that and
     * 2^20 (4 MiB here) the session ends.
     */
    uint32_t max = s->qp.recv.cap > MAX_CLOSES_DUE ? s->qp.recv.cap : MAX_CLOSES_DUE;
    if (s->nclose_due >= max)
        return shmipc__fail(SHMIPC_EPROTO,
                            "session: the peer put more than %u close elements in one turn, the "
                            "queue never empty (at most the larger of its capacity and %u)",
                            max, MAX_CLOSES_DUE);
    s->queue_closes++;
    if (s->nclose_due == s->close_due_cap) {
        uint32_t n = s->close_due_cap ? s->close_due_cap * 2 : 16;
        void *p = realloc(s->closes_due, n * sizeof *s->closes_due);
        if (p == NULL) {
            shmipc__stream_peer_closed_locked(s, id); /* at once, as best we can */
            return 0;
        }
        s->closes_due = p;
        s->close_due_cap = n;
    }
    s->closes_due[s->nclose_due++] = id;
    return 0;
}

void shmipc__session_apply_closes_locked(shmipc_session *s)
{
    for (uint32_t i = 0; i < s->nclose_due; i++)
        shmipc__stream_peer_closed_locked(s, s->closes_due[i]);
    s->nclose_due = 0;
}

static int handle_element_locked(shmipc_session *s, const struct shmipc__queue_elem *e)
{
    switch (e->status & 0xff) {
    case 0:
        return deliver_chain_locked(s, e->seq_id, e->offset);
    case 1:
        return close_due_locked(s, e->seq_id);
    default:
        return shmipc__fail(SHMIPC_EPROTO, "queue: element for stream %u with status %u", e->seq_id,
                            e->status);
    }
}

/* Handles a Polling message: drain, clear the working flag, drain again if needed. */
int shmipc__session_drain_queue_locked(shmipc_session *s, int *events)
{
    struct shmipc__queue_elem e;
    int rc;
    for (;;) {
        while ((rc = shmipc__queue_pop(&s->qp.recv, &e)) == 0) {
            /*
             * The slice's header and the first bytes after it were written by the peer's CPU:
             * ask for them now, together. The walk reads the header first, and the reader's
             * bytes sit at an address read from it (start), so without the hint each is a
             * cache miss after the other. A hint: it never faults, and checks nothing (the
             * walk does).
             */
            if ((uint64_t)e.offset + 128 <= s->bm.size) {
                shmipc__prefetch_for_write(s->bm.base + e.offset); /* the claim mark */
                __builtin_prefetch(s->bm.base + e.offset + 64);
                __builtin_prefetch(s->bm.base + e.offset + 127);
            }
            if ((rc = handle_element_locked(s, &e)) < 0)
                return rc;
            (*events)++;
            s->rx_elems++;
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
        shmipc__stream_peer_closed_locked(s, m->u.fallback.stream_id);
        return 0;
    }
    if ((rc = stream_for_data_locked(s, m->u.fallback.stream_id, &st)) < 0)
        return rc;
    if (st == NULL || m->u.fallback.len == 0)
        return 0;
    shmipc__stream_set_fallback(st);
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
        return shmipc__session_drain_queue_locked(s, events);
    /*
     * The peer put everything it sent before this message into the queue first, and may not
     * have woken us for it (its working flag was set). Drain the queue before handling it, or
     * a fallback message or a close would overtake the data queued ahead of it.
     */
    case SHMIPC__MSG_STREAM_CLOSE:
        (*events)++;
        rc = shmipc__session_drain_queue_locked(s, events);
        if (rc == 0)
            shmipc__stream_peer_closed_locked(s, m->u.stream_close.stream_id);
        return rc;
    case SHMIPC__MSG_FALLBACK_DATA:
        (*events)++;
        rc = shmipc__session_drain_queue_locked(s, events);
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
    if (n == 0 || (n < 0 && err == ECONNRESET)) {
        /*
         * A peer that closes its streams and then its session at once may leave close
         * elements (and data) in the queue without a wakeup; one that died with our bytes
         * unread in its socket resets it, and what it put in the queue before is still its
         * word (a shmipc-serve worker's TAKEN: the front must not resend a request the worker
         * took). Take them first, so its streams end as it ended them, then end the session.
         */
        if ((rc = shmipc__session_drain_queue_locked(s, events)) < 0)
            return rc;
        return shmipc__fail(SHMIPC_ECONNRESET, n == 0 ? "session: the peer closed the connection"
                                                      : "session: connection reset by peer");
    }
    if (n < 0) {
        if (err == EAGAIN || err == EINTR)
            return 0;
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
int shmipc__session_finish_turn_locked(shmipc_session *s, int rc, int events)
{
    if (events > 0)
        pthread_cond_broadcast(&s->cond);
    if (rc < 0)
        return shmipc__session_fail_locked(
            s, rc); /* a damaged mapping wins over the socket error it caused */
    return events;
}

/*
 * Reads what the socket holds and handles every complete message, then (V4 eventfd and
 * polling sessions) takes what the queue holds. `socket_ready` 0 says the caller knows the
 * socket has nothing (only a wakeup fd fired), which spares a recv. The socket goes first:
 * a FallbackData or StreamClose the peer sent before putting more elements must not be
 * overtaken by them (its handler drains the elements put before it).
 */
int shmipc__session_process_fds_locked(shmipc_session *s, int socket_ready)
{
    int events = 0, rc = 0, all = socket_ready == SHMIPC__SOCKET_DRAIN;
    if (shmipc__session_err(s))
        return shmipc__session_err(s);
    if ((rc = shmipc__session_check_memory_locked(s)) < 0)
        return rc;
    for (;;) {
        unsigned closes = s->queue_closes;
        while (rc >= 0 && socket_ready) {
            if ((rc = grow_rbuf_locked(s)) < 0)
                break;
            size_t space = s->rcap - s->rlen;
            ssize_t n = recv(s->fd, s->rbuf + s->rlen, space, MSG_DONTWAIT);
            int err = n < 0 ? errno : 0;
            rc = take_recv_locked(s, n, err, space, &events);
            /* A short read took what was there, but not a close that came with it: that
             * shows only in the next recv. Only `all` asks for it (an edge-triggered caller
             * sees no other edge for it). */
            socket_ready = rc == 1 || err == EINTR || (all && rc >= 0 && n > 0);
        }
        if (rc >= 0 && s->wakeup != SHMIPC_WAKEUP_SOCKET)
            rc = shmipc__session_drain_queue_locked(s, &events);
        /*
         * A close taken from the queue may have been put after our recv, behind FallbackData
         * the peer had finished writing before it (a stream on the socket closes with a queue
         * element): read the socket again, in this turn, and only then apply the closes.
         */
        if (rc < 0 || s->queue_closes == closes)
            break;
        socket_ready = 1;
    }
    shmipc__session_apply_closes_locked(s);
    if (rc >= 0 && (rc = shmipc__session_check_memory_locked(s)) < 0)
        return rc;
    if (rc >= 0)
        s->drained_ns = shmipc__now_ns();
    return shmipc__session_finish_turn_locked(s, rc, events);
}

/*
 * Processes without waiting. V4 eventfd and polling sessions ask the set whether to recv.
 * `all` reads the socket until it would block (or ends): what an edge-triggered watcher of
 * shmipc_session_fileno() needs, since a peer's data and its close may come as one edge and a
 * short read takes only the data. Callers that wait level-triggered stop at a short read and
 * spare that recv.
 */
static int process_now_locked(shmipc_session *s, int all)
{
    int socket = 1;
    if (s->wakeup != SHMIPC_WAKEUP_SOCKET) {
        int rc = shmipc__session_wait_set_locked(s, 0, &socket);
        if (rc < 0 && rc != -EINTR)
            return shmipc__session_fail_locked(s, shmipc__fail_errno(-rc, "session: epoll_wait"));
        socket = rc < 0 || socket;
    }
    return shmipc__session_process_fds_locked(s, socket && all ? SHMIPC__SOCKET_DRAIN : socket);
}

int shmipc__session_process_locked(shmipc_session *s)
{
    return process_now_locked(s, 0);
}

int shmipc__session_process_all_locked(shmipc_session *s)
{
    return process_now_locked(s, 1);
}
