/*
 * session_int.h - what the session_*.c files share and nobody else sees: the session's
 * tunables, the lock helpers, and the shmipc__ functions one room calls in another.
 *
 * The rooms (reference §3; the locking and processing rules are in session.h):
 *   session.c         session life: alloc, start, connect/accept, error, memory checks, destroy
 *   session_cache.c   the slice cache (slices kept back from the free list for reuse)
 *   session_stream.c  the stream table and THE stream state machine (every state change)
 *   session_recv.c    receive dispatch: queue elements and socket messages to streams
 *   session_wait.c    the wait engine: spin (budgets, spin_turn_locked), then sleep
 *   session_read.c    read, release and forward (zero-copy chunks of received data)
 *   session_write.c   write, reserve/commit, flush, fallback over the socket, StreamClose
 * Only these files include this header.
 */
#ifndef SHMIPC_CORE_IPC_SESSION_INT_H
#define SHMIPC_CORE_IPC_SESSION_INT_H

#include "ipc/session.h"

#include "common/log.h"

#include <pthread.h>
#include <stdint.h>

#define FIRST_CLIENT_STREAM_ID 2u
#define BREAKER_NS             (30ull * 1000000000ull)
#define QUEUE_FULL_RETRIES     10
#define QUEUE_FULL_WAIT_NS     (10ull * 1000000ull)
#define FALLBACK_MIN_HEAP      4096u
#define RBUF_INITIAL           4096u
/* Chunks an idle stream may keep allocated; beyond this the array is freed when drained. */
#define IDLE_CHUNK_CAP 4u

static inline void shmipc__session_lock(shmipc_session *s)
{
    pthread_mutex_lock(&s->mu);
    shmipc__log_defer_begin();
}

static inline void shmipc__session_unlock(shmipc_session *s)
{
    pthread_mutex_unlock(&s->mu);
    shmipc__log_defer_end();
}

/* The session's error: written once, under mu, with an atomic store (fail_locked); read
 * through here with or without mu (the write path checks it without the lock). */
static inline int shmipc__session_err(const shmipc_session *s)
{
    return __atomic_load_n(&s->err, __ATOMIC_ACQUIRE);
}

/* session.c */
void shmipc__session_free_chunks(shmipc_session *s, shmipc_stream *st, uint32_t from, uint32_t to);
void shmipc__session_free_segments(shmipc_session *s, shmipc_stream *st);
void shmipc__stream_free_memory(shmipc_stream *st);
/* Frees the stream and its heap data, giving nothing back to shared memory (a fork child). */
void shmipc__stream_free_local(shmipc_stream *st);
void shmipc__session_release(shmipc_session *s);
int shmipc__session_fail_locked(shmipc_session *s, int code);
int shmipc__session_ended(shmipc_session *s);
int shmipc__session_check_memory_locked(shmipc_session *s);
int shmipc__session_check_memory(shmipc_session *s);

/* session_cache.c */
void shmipc__session_cache_init(shmipc_session *s);
int shmipc__session_cache_put(shmipc_session *s, uint32_t off);
int shmipc__session_cache_get(shmipc_session *s, uint32_t want, struct shmipc__slice *out);

/* session_stream.c */
shmipc_stream *shmipc__session_lookup_locked(shmipc_session *s, uint32_t id);
int shmipc__session_insert_locked(shmipc_session *s, shmipc_stream *st);
shmipc_stream *shmipc__stream_new(shmipc_session *s, uint32_t id);
void shmipc__stream_peer_closed_locked(shmipc_session *s, uint32_t id);
int shmipc__stream_shut_error(const shmipc_stream *st);
int shmipc__stream_is_shut(const shmipc_stream *st);
void shmipc__stream_set_fallback(shmipc_stream *st);

/* session_recv.c */
void shmipc__session_note_ready_locked(shmipc_session *s, uint32_t id);
int shmipc__session_drain_queue_locked(shmipc_session *s, int *events);
/*
 * Applies the closes taken from the queue (the streams read their end), once the socket was
 * read after they were taken. Under mu.
 */
void shmipc__session_apply_closes_locked(shmipc_session *s);
int shmipc__session_finish_turn_locked(shmipc_session *s, int rc, int events);
/* socket_ready: 0 (the socket has nothing), 1 (read it; a short read is the end of it), or
 * SHMIPC__SOCKET_DRAIN (read it until it would block, so that a close behind data is seen). */
#define SHMIPC__SOCKET_DRAIN 2
int shmipc__session_process_fds_locked(shmipc_session *s, int socket_ready);
int shmipc__session_process_locked(shmipc_session *s);
/* As shmipc__session_process_locked(), reading the socket until it would block. */
int shmipc__session_process_all_locked(shmipc_session *s);

/* session_wait.c */
int shmipc__session_wait_set_locked(shmipc_session *s, int timeout_ms, int *socket);
int shmipc__session_wait_locked(shmipc_session *s, uint64_t deadline);

/* session_write.c */
struct shmipc__segment *shmipc__stream_add_segment(shmipc_stream *st);
int shmipc__session_end_on_bad_list(shmipc_session *s, int rc);
int shmipc__stream_write_bytes(shmipc_stream *st, const void *buf, size_t len);
void shmipc__stream_send_close(shmipc_stream *st);

/*
 * Whether a non-blocking look (accept_stream with timeout 0, a SHMIPC_NONBLOCK read) may skip
 * processing: the queue was drained less than SHMIPC__FRESH_NS ago and nothing came since (the
 * queue is empty and the peer sent no wakeup). What only the socket carries is then seen by the
 * next look after that window, or by process() on the descriptor's readiness. Under mu.
 */
int shmipc__session_fresh_locked(shmipc_session *s);

#endif
