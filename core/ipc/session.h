/*
 * Sessions and streams: the objects behind the public shmipc_session and shmipc_stream.
 *
 * Locking. `mu` guards the stream table, every stream's receive state, the accept queue and
 * the event-processing role; `cond` is broadcast whenever any of them changes. `send_mu`
 * serialises producers on the send queue and writes to the socket. No thread holds `mu`
 * while it waits for the socket. The order is `send_mu`, then `mu` (a fallback write takes
 * `mu` to read the session while it holds `send_mu`); nobody takes `send_mu` under `mu`.
 *
 * Processing. There is no library thread. A thread that must wait (a read, an accept)
 * becomes the session's processor when nobody else is: it polls the socket without `mu`,
 * then takes `mu` and handles every event; the others wait on `cond` (leader/follower).
 *
 * Lifetime. The user's session handle and every stream hold a reference; the mapping and the
 * socket are released with the last one, so zero-copy pointers outlive a hard close.
 */
#ifndef SHMIPC_CORE_IPC_SESSION_H
#define SHMIPC_CORE_IPC_SESSION_H

#include "shmipc.h"

#include "common/proc.h"
#include "ipc/config.h"
#include "shm/buffer.h"
#include "shm/mapping.h"
#include "shm/queue.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/uio.h>

enum shmipc__role { SHMIPC__CLIENT = 0, SHMIPC__SERVER = 1 };

enum shmipc__stream_state {
    SHMIPC__STREAM_OPEN = 0,
    SHMIPC__STREAM_PEER_CLOSED = 1, /* the peer closed: reads drain, then end */
};

/*
 * A session keeps back at most 1/SHMIPC__SLICE_CACHE_SHARE of each list's slices for reuse,
 * and at most SHMIPC__SLICE_CACHE_MAX (see shmipc_session.cache), and only while the shared
 * free list keeps at least that share for the peer.
 */
#define SHMIPC__SLICE_CACHE_SHARE 4
#define SHMIPC__SLICE_CACHE_MAX   1024
/* Slices of a list kept without credit (allocations of our own in that list). */
#define SHMIPC__SLICE_CACHE_FREE 16

/* What a fallback chunk costs beyond its bytes: the copy's malloc header and its chunk entry. */
#define SHMIPC__FALLBACK_CHUNK_COST 64u

/* Stream ids carried in a "no slice" chunk: data that came over the socket, on the heap. */
#define SHMIPC__HEAP_CHUNK UINT32_MAX

/* A piece of received data: part of one slice, or a heap copy of fallback data. */
struct shmipc__chunk {
    uint8_t *data;
    uint32_t len;
    uint32_t slice; /* offset of the slice header to free, or SHMIPC__HEAP_CHUNK */
    uint32_t head;  /* bytes trimmed off the front (a heap copy is freed at data - head) */
};

/* A piece of the send buffer: one held slice, or heap memory when shared memory ran out. */
struct shmipc__segment {
    uint8_t *data;
    uint32_t cap;
    uint32_t used;
    uint32_t slice; /* offset, or SHMIPC__HEAP_CHUNK */
};

struct shmipc_stream {
    struct shmipc_session *s;
    struct shmipc_stream *next_in_bucket;
    uint32_t id;
    uint8_t state; /* written under mu, read by the writer without it: atomic accesses there */
    /* Data goes over the socket for good. Set by the writer and by the receive path (under mu,
     * on another thread), read by the writer without mu: atomic loads and stores only. */
    uint8_t fallback;
    uint8_t in_table;   /* still in the session's table (not closed locally) */
    uint8_t close_sent; /* the close element went with the last flush (flush and close) */
    /*
     * Calls in flight on the handle (low bits) and the SHMIPC__STREAM_SHUT/_CLOSING marks,
     * atomic: shutdown and close may come from another thread while a call blocks, and the
     * last call to leave a closing stream frees it (shmipc__stream_enter/leave).
     */
    uint32_t inuse;
    /* Receive side, under s->mu. chunks[0..read_index) were read and wait for release. */
    struct shmipc__chunk *chunks;
    uint32_t nchunks, chunk_cap, read_index, read_offset;
    uint64_t unread;
    /* Send side, owned by the thread using the stream. */
    struct shmipc__segment *segs;
    uint32_t nsegs, seg_cap;
    uint32_t reserved_len;   /* size of the window handed out by reserve, 0 if none */
    int32_t read_timeout_ms; /* -1: forever, 0: do not wait */
    uint64_t send_len;
    /* The copy read_exact_bytes makes when bytes span slices. */
    uint8_t *scratch;
    uint32_t scratch_cap;
    int32_t write_timeout_ms; /* -1: forever, 0: do not wait */
};

/*
 * A timeout as a stream keeps it: -1 forever, 0 no wait, else ms up to INT32_MAX (24 days; the
 * deprecated setters take up to UINT32_MAX, which is clamped).
 */
static inline int32_t shmipc__stream_timeout(int64_t ms)
{
    return ms < 0 ? -1 : ms > INT32_MAX ? INT32_MAX : (int32_t)ms;
}

/* shmipc_stream.inuse: the count of calls in flight is the low bits. */
#define SHMIPC__STREAM_BUSY_MASK 0x3fffffffu
#define SHMIPC__STREAM_SHUT      0x40000000u /* shut down: every call but release and close fails */
#define SHMIPC__STREAM_CLOSING   0x80000000u /* closed by the user: freed when no call is in flight */

struct shmipc_session {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    pthread_mutex_t send_mu;
    /* A deferred flush put an element without waking the peer: shmipc__session_wake_owed()
     * sends that wakeup. Under send_mu. */
    uint8_t wake_owed;
    int refs; /* under mu */
    /*
     * Called once the session is freed, with no lock held (shmipc__session_on_free): what
     * made the session (a session manager's pool) learns it is gone.
     */
    void (*on_free)(void *arg);
    void *on_free_arg;
    /*
     * The process that made the session (common/proc.h). In another one (a fork() child), its
     * streams' and its own close release only that process's copies: nothing is sent, no shared
     * memory is written, the socket is not shut down, no file is removed, no lock is taken.
     */
    pid_t pid;
    int fd;
    int role;
    uint8_t version; /* 2, 3 or 4 */
    uint8_t wire;    /* the header version byte: 2, 3, or 0 for V4 */
    int wakeup;      /* SHMIPC_WAKEUP_*: socket for legacy */
    uint32_t interval_us;
    int efd_send, efd_recv; /* eventfd wakeups (V4), else -1 */
    int event_fd;           /* what fileno() returns: the socket, or an epoll fd (V4) */
    int timer_fd;           /* polling mode: fires every interval for event loops, else -1 */
    int kick_fd;            /* eventfd a stream shutdown writes to wake the processor, or -1 */
    int processing;         /* a thread is reading the socket (under mu) */
    /* Processed only by its owner's event loop when its descriptor fires (set once, before
     * use; shmipc__session_set_loop_driven): a non-blocking read or accept never processes,
     * so no data for another stream lands where the loop would not look for it. */
    uint8_t loop_driven;
    /* shmipc_session_fileno() was asked (under mu): an event loop may watch the descriptor, so
     * a writer does not take the peer's news in passing (the loop would get no edge for it). */
    uint8_t watched;
    unsigned spin_fails;  /* spins in a row that found nothing, at most 6 (under mu) */
    unsigned spin_skip;   /* waits left that sleep without spinning (under mu) */
    uint64_t spin_gap_ns; /* moving average of the waits for data, for the spin budget (mu) */
    uint64_t rx_elems;    /* queue elements taken, ever (mu) */
    /* An event loop's spin that found nothing, judged at its next spin (mu): when it began and
     * gave up, and rx_elems then. */
    uint64_t loop_spin_began, loop_spin_gave_up, loop_spin_rx;
    unsigned spin_unread;  /* spins in a row that found work and skipped the socket (mu) */
    uint64_t drained_ns;   /* when the receive queue was last drained (mu) */
    unsigned queue_closes; /* close elements taken from the queue, ever (mu) */
    /*
     * Closes taken from the queue and not yet applied: a turn applies them once it has read
     * the socket after taking them, so FallbackData sent before a close (even one that opens
     * its stream) comes first (session_recv.c). Under mu.
     */
    uint32_t *closes_due;
    uint32_t nclose_due, close_due_cap;
    int err; /* 0, or the code that ended the session: stored under mu, atomically; read with session_err() */
    char why[192]; /* the detail of the failure that ended it */
    struct shmipc_config cfg;

    struct shmipc__mapping buffer_map, queue_map;
    struct shmipc__buffer bm;
    struct shmipc__queue_pair qp;
    char buffer_path[SHMIPC__SHM_NAME_MAX];
    char queue_path[SHMIPC__SHM_NAME_MAX];
    int unlink_files; /* /dev/shm files to remove when the session is released */

    uint32_t next_stream_id;
    uint64_t unhealthy_until_ns;

    /*
     * Stream table: chained hash on id, power-of-two buckets. The peer picks the ids, so they
     * are hashed with a secret of this session (hash_seed, random): with a fixed hash it could
     * pick ids that all share one bucket and make every lookup walk all its streams.
     */
    struct shmipc_stream **buckets;
    uint32_t nbuckets, nstreams, hash_seed;

    /*
     * Heap bytes of fallback data that streams hold (under mu), each chunk charged
     * SHMIPC__FALLBACK_CHUNK_COST more for its bookkeeping; capped by max_fallback_unread.
     */
    uint64_t fallback_held;

    /*
     * The slices in this session's hands, a bit per slice of bm (shmipc__held_new(), set up
     * with the session and shared with bm.held; atomic bit operations, no lock): popped by us
     * and not yet sent (being written, reserved, forwarded), received and not yet freed, or
     * kept in the slice cache. A slice announced while its bit is set ends the session, so a
     * hostile peer that erases the walker's mark in shared memory still cannot make us keep one
     * slice twice (and the slice chunks are bounded to one per slice); a pop that hands out a
     * slice whose bit is set ends it too (ABA on the free list's head: see list_pop()).
     */
    uint64_t *held;

    /* Server: streams the peer opened that nobody accepted yet (max_pending_streams at most). */
    struct shmipc_stream **accept_q;
    uint32_t accept_head, accept_len, accept_cap;

    /*
     * Slices we were done with, kept back from the shared free lists (LIFO, up to a quarter of
     * each list) to be written again while still hot in the CPU caches. The reference's free
     * lists are FIFO, so every message would otherwise go to the coldest slice of the list: with
     * more messages in flight than the cache holds, throughput fell to a third. A slice goes
     * back to the shared list instead when that list runs low, so a peer that allocates from
     * it (a Go peer knows nothing of our cache) is not starved, and when we do not write in
     * that size ourselves (credit: a slice is kept only against one we asked for, beyond a
     * few), so a class we only receive is not hoarded. Under cache_mu.
     */
    pthread_mutex_t cache_mu;
    struct {
        uint32_t n, max;
        uint32_t credit; /* slices of the list we asked for to write, not yet kept back */
        uint32_t room;   /* entries allocated in off, grown on demand up to max */
        uint32_t *off;
    } cache[SHMIPC__BM_MAX_LISTS];

    /* Bytes read from the socket and not yet parsed. */
    uint8_t *rbuf;
    size_t rlen, rcap;

    /*
     * Ids of streams that got data or an end since the last look, kept only while a
     * listener serves the session with callbacks (track_ready); duplicates are harmless.
     */
    int track_ready;
    uint32_t *ready;
    uint32_t nready, ready_cap;
};

/* Client: connect and handshake. */
int shmipc__session_connect(const char *address, const shmipc_config *cfg, shmipc_session **out);

/* Server: wraps an accepted socket and runs the handshake (which may take `fd`). */
int shmipc__session_accept_fd(int fd, const shmipc_config *cfg, shmipc_session **out);

int shmipc__session_open_stream(shmipc_session *s, shmipc_stream **out);
int shmipc__session_accept_stream(shmipc_session *s, int timeout_ms, shmipc_stream **out);
/*
 * Takes a stream that processing already found (0), with no I/O: SHMIPC_EAGAIN when there is
 * none, or the code that ended the session. For a loop that has just processed the session.
 */
int shmipc__session_accept_queued(shmipc_session *s, shmipc_stream **out);
int shmipc__session_process(shmipc_session *s);
/*
 * Before an event loop sleeps on the session's descriptor: spins on the receive queue for
 * the adaptive budget and processes what came. 1 when it processed something, 0 when not
 * (sleep), or the code that ended the session.
 */
int shmipc__session_spin(shmipc_session *s);
/* Serving with callbacks: start tracking ready streams, and take the ids noted so far. */
void shmipc__session_track_ready(shmipc_session *s);
uint32_t shmipc__session_take_ready(shmipc_session *s, uint32_t **ids, uint32_t *cap);
/*
 * The user's handle on stream `id`, or NULL when it is not (or no longer) handed out or the user
 * closed it. A stream returned is counted in as a call in flight (a close from another thread
 * meanwhile leaves its free to us): release it with shmipc__stream_leave().
 */
shmipc_stream *shmipc__session_handed_out(shmipc_session *s, uint32_t id);
void shmipc__session_close(shmipc_session *s);
/*
 * Asks for fn(arg) once the session is freed: after its close and the close of every stream
 * that holds it, on whichever thread drops the last reference, with no lock held. Set once,
 * right after the session is made, before any other thread can see it.
 */
void shmipc__session_on_free(shmipc_session *s, void (*fn)(void *arg), void *arg);
/* Ends the session with SHMIPC_ECLOSED and wakes every waiter; the handle stays valid. */
int shmipc__session_shutdown(shmipc_session *s);
/* Gives every slice the session keeps back for reuse to the shared free lists. */
void shmipc__session_trim(shmipc_session *s);

/*
 * 1 when the SIGBUS guard hit the session's buffer or queue mapping (the peer shrank the file
 * under it; shm/guard.h): the session must end.
 */
static inline int shmipc__session_memory_damaged(const shmipc_session *s)
{
    return shmipc__mapping_damaged(&s->buffer_map) || shmipc__mapping_damaged(&s->queue_map);
}

/* 1 in a process other than the one that made the session: a fork() child (common/proc.h). */
static inline int shmipc__session_foreign(const shmipc_session *s)
{
    return shmipc__foreign(s->pid);
}

/* 0 while the session lives, else the code that ended it (shmipc_session_status()). */
static inline int shmipc__session_status(const shmipc_session *s)
{
    return __atomic_load_n(&s->err, __ATOMIC_ACQUIRE);
}

/* What shmipc_session_fileno() returns: the fd that polls readable when there is news. */
static inline int shmipc__session_fileno(const shmipc_session *s)
{
    return s->event_fd;
}

/*
 * 1 when the send queue has room for an element now, else 0: for an event loop that is the
 * session's only sender, a flush then puts its element without the full-queue wait (up to
 * 100 ms) that a loop thread must not take; at 0 it retries later instead.
 */
static inline int shmipc__session_can_send(const shmipc_session *s)
{
    int n = shmipc__queue_size(&s->qp.send);
    return n >= 0 && (uint32_t)n < s->qp.send.cap;
}

/*
 * What the peer took of our queue: shmipc__session_sent() after a flush marks its message
 * (the elements put so far, its own included); shmipc__session_peer_took(s, mark) is 1 once
 * the peer popped that element, 0 while it still waits in the queue. After the peer died, an
 * element it never popped was never read: a request in it may go to another peer. The count
 * is the peer's to write: a lying peer only changes which of its requests go elsewhere.
 * For a stream on the socket (fallback) nothing tells: use 0 as the mark, and "took".
 */
static inline uint64_t shmipc__session_sent(const shmipc_session *s)
{
    return shmipc__queue_put_count(&s->qp.send);
}

/* The elements the peer popped from our queue so far (its count: it may lie). */
static inline uint64_t shmipc__session_popped(const shmipc_session *s)
{
    return shmipc__queue_popped_count(&s->qp.send);
}

static inline int shmipc__session_peer_took(const shmipc_session *s, uint64_t mark)
{
    return mark == 0 || shmipc__session_popped(s) >= mark;
}

int shmipc__stream_write(shmipc_stream *st, const void *buf, size_t len);
/*
 * shmipc__stream_write() of `n` buffers into shared memory only, all or nothing, for an event
 * loop that must neither block nor put bulk data on the socket (the front's uploads): 0 when
 * every byte was copied into slices (the flush then hands them over without the fallback),
 * SHMIPC_ENOSHM when the free slices cannot hold them now or the stream is already on the
 * socket (nothing is added; try again once the peer freed slices), or what write() fails
 * with. Never waits, whatever memory_wait says.
 */
int shmipc__stream_write_shm(shmipc_stream *st, const struct iovec *iov, size_t n);
int shmipc__stream_reserve(shmipc_stream *st, size_t n, void **ptr);
int shmipc__stream_commit(shmipc_stream *st, size_t n);
int shmipc__stream_flush(shmipc_stream *st);
/* Flushes, and puts the close element right behind the data: one wakeup for both. The
 * stream must then be closed (shmipc__stream_close sends no second close). */
int shmipc__stream_flush_close(shmipc_stream *st);
/*
 * shmipc__stream_flush() that does not wake the peer: the wakeup it would have sent is owed by
 * the session until shmipc__session_wake_owed(), which the caller must call soon (an event
 * loop: at the end of its turn), so that one wakeup carries every message of the turn. Until
 * then a sleeping peer does not see the message. For a caller that flushes many streams of one
 * session in a burst (the front of shmipc-serve); nothing else may rely on it.
 */
int shmipc__stream_flush_deferred(shmipc_stream *st);
/* Sends the wakeup that deferred flushes owe, if any (and the peer is not working already):
 * 0, or the error that ended the session. */
int shmipc__session_wake_owed(shmipc_session *s);
int shmipc__stream_read_chunk(shmipc_stream *st, size_t max, const void **ptr, size_t *len,
                              int flags);
int shmipc__stream_read_exact(shmipc_stream *st, size_t n, const void **ptr, int flags);
size_t shmipc__stream_available(shmipc_stream *st);

/*
 * The session is processed only by its owner's event loop (shmipc__session_process() when its
 * descriptor fires), which then reads every stream: SHMIPC_NONBLOCK reads and accept_stream(0)
 * take only what that processing delivered, never processing themselves. Without it, a
 * non-blocking read of one stream that finds too little may process the session (when the last
 * processing is over 50 µs old) and deliver another stream's data that the loop was not told
 * of: the descriptor's readiness was consumed with it, and that stream's reader would wait for
 * an edge that never comes. Set once, right after the session is made, before any use.
 */
void shmipc__session_set_loop_driven(shmipc_session *s);
/* shmipc_session_fileno() was asked: see `watched`. */
void shmipc__session_set_watched(shmipc_session *s);
int shmipc__stream_release(shmipc_stream *st);
int shmipc__stream_forward(shmipc_stream *dst, shmipc_stream *src, size_t n, int flags);
void shmipc__stream_close(shmipc_stream *st);

/*
 * A call on the user's handle begins: 0, or SHMIPC_ECLOSED after a shutdown or close
 * (`even_shut` lets release through a shutdown), or SHMIPC_EBUSY when too many threads are in
 * it. Every 0 is paired with shmipc__stream_leave(), which frees a stream closed meanwhile.
 */
int shmipc__stream_enter(shmipc_stream *st, int even_shut);
void shmipc__stream_leave(shmipc_stream *st);
/* Wakes the stream's blocked calls, which fail with SHMIPC_ECLOSED, as do later ones. */
int shmipc__stream_shutdown(shmipc_stream *st);
/* The user's close: shutdown, then free now or when the last call in flight leaves. */
void shmipc__stream_close_handle(shmipc_stream *st);
/*
 * 1 if a stream given back to a session manager's pool may be handed out again (the next user
 * finds it as new), else 0. Takes the session's lock: see session_stream.c for the lock order.
 */
int shmipc__stream_reusable(shmipc_stream *st);

/* Handshakes (handshake.c): fill the session's shared memory and version. */
int shmipc__handshake_client(shmipc_session *s, uint64_t deadline);
int shmipc__handshake_server(shmipc_session *s, uint64_t deadline);

#endif
