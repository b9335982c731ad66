/*
 * Reading: read_chunk and read_exact (zero-copy chunks, a scratch copy across chunks),
 * release (slices back to the peer or the cache), and forward (received chunks moved to
 * another stream's send side without a copy).
 *
 * May call: shm/, the wait engine, the session's error and chunk freeing, and the write
 * room's segments (forward) through session_int.h.
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

static int wait_readable_locked(shmipc_stream *st, uint64_t need, int flags)
{
    shmipc_session *s = st->s;
    /* Set at the first wait: data already there (and a non-blocking look) reads no clock. */
    uint64_t deadline = 0;
    int waited = 0, rc;
    for (;;) {
        /* Set before shmipc__stream_shutdown() takes mu to wake us: no wakeup is lost. */
        if (shmipc__stream_is_shut(st))
            return shmipc__stream_shut_error(st);
        /* Delivered data stays readable after the session ends, unless it may be zeros now. */
        if ((rc = shmipc__session_check_memory_locked(s)) < 0)
            return rc;
        if (st->unread >= need)
            return 0;
        if (st->state == SHMIPC__STREAM_PEER_CLOSED)
            return shmipc__fail(SHMIPC_EEOF, "stream %u: the peer closed the stream", st->id);
        if (shmipc__session_err(s))
            return shmipc__session_ended(s);
        if (flags & SHMIPC_NONBLOCK) {
            if (!s->processing && !s->loop_driven && !shmipc__session_fresh_locked(s)) {
                s->processing = 1;
                rc = shmipc__session_process_locked(s);
                s->processing = 0;
                /* Progress, or the end: the top looks again, so a stream close taken in
                 * the turn that ended the session is EOF, not the session's end. */
                if (rc != 0)
                    continue;
            }
            if (st->unread >= need)
                return 0;
            return shmipc__session_err(s)
                       ? shmipc__session_ended(s)
                       : shmipc__fail_stream(SHMIPC_EAGAIN, st->id, "no data yet");
        }
        if (!waited) {
            deadline = shmipc__wait_deadline(st->read_timeout_ms);
            waited = 1;
        }
        if ((rc = shmipc__session_wait_locked(s, deadline)) < 0) {
            if (rc == SHMIPC_ETIMEDOUT)
                return shmipc__fail(SHMIPC_ETIMEDOUT, "stream %u: read timed out", st->id);
            /*
             * The turn that ended the session may have delivered our data first (the peer
             * wrote, closed and left; one turn reads it all): the loop's top hands that out,
             * then reports the end.
             */
            if (shmipc__session_err(s))
                continue;
            return rc;
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
    return shmipc__session_check_memory_locked(s);
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
    shmipc__session_lock(s);
    int rc = wait_readable_locked(st, 1, flags);
    if (rc == 0) {
        settle_locked(st);
        struct shmipc__chunk *c = &st->chunks[st->read_index];
        size_t n = c->len - st->read_offset;
        if (max != 0 && n > max)
            n = max;
        if ((rc = probe_locked(s, c->data + st->read_offset + n - 1)) < 0) {
            shmipc__session_unlock(s);
            return rc;
        }
        *ptr = c->data + st->read_offset;
        *len = n;
        st->read_offset += (uint32_t)n;
        st->unread -= n;
        settle_locked(st);
    }
    shmipc__session_unlock(s);
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
    shmipc__session_lock(s);
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
            rc = shmipc__session_check_memory_locked(s); /* the copy may have read zeros */
    }
    shmipc__session_unlock(s);
    return rc;
}

size_t shmipc__stream_available(shmipc_stream *st)
{
    shmipc__session_lock(st->s);
    size_t n = (size_t)st->unread;
    shmipc__session_unlock(st->s);
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
    shmipc__session_lock(s);
    settle_locked(st);
    uint32_t done = st->read_index;
    shmipc__session_free_chunks(s, st, 0, done);
    drop_chunks_locked(st, done);
    /* A slice read in part stays; its read bytes are behind us (forward no longer sends them). */
    if (st->nchunks > 0 && st->read_offset > 0) {
        trim_chunk_locked(s, &st->chunks[0], st->read_offset);
        st->read_offset = 0;
    }
    shmipc__session_unlock(s);
    drop_scratch(st);
    return 0;
}

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
        struct shmipc__segment *seg = shmipc__stream_add_segment(dst);
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
    int rc = c->len > 0 ? shmipc__stream_write_bytes(dst, c->data, c->len) : 0;
    if (rc == 0)
        shmipc__session_free_chunks(s, src, i, i + 1);
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
        if ((rc = shmipc__stream_write_bytes(dst, c->data, (size_t)want)) < 0)
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
    if (shmipc__session_err(dst->s))
        return shmipc__session_ended(dst->s);
    int bad_list = 0;
    dst->reserved_len = 0;
    shmipc__session_lock(s);
    int rc = n > 0 ? wait_readable_locked(src, n, flags) : shmipc__session_check_memory_locked(s);
    if (rc == 0) {
        uint64_t done = read_unreleased_locked(src), moved;
        rc = forward_locked(dst, src, done + n, &moved);
        bad_list = rc == SHMIPC_EPROTO;
        /* What moved is consumed; a failure leaves the rest where it was. */
        src->unread -= moved > done ? moved - done : 0;
        seek_locked(src, moved < done ? done - moved : 0);
        /* A copy may have read zeros from a truncated mapping (shm/guard.h). */
        if (rc == 0)
            rc = shmipc__session_check_memory_locked(s);
        /* Only dst's pops fail with EPROTO in forward_locked: a bad list ends dst's session. */
        else if (bad_list && dst->s == s)
            rc = shmipc__session_fail_locked(s, rc);
    }
    shmipc__session_unlock(s);
    if (rc == 0)
        drop_scratch(src);
    if (bad_list && dst->s != s)
        rc = shmipc__session_end_on_bad_list(dst->s, rc);
    return rc;
}
