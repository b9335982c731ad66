/*
 * The slice cache: slices a stream gave back, kept per session for the next reserve
 * instead of going through the shared free list (see shmipc_session.cache in session.h).
 *
 * May call: shm/buffer. Called by session.c (slices given back) and the write room (reserve).
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
 * Sizes the cache once the buffer is known: up to a quarter of each list (at most
 * SHMIPC__SLICE_CACHE_MAX), so that a whole window of messages in flight comes back to slices
 * that are still hot. The arrays grow as slices come back, so an idle session holds none.
 */
void shmipc__session_cache_init(shmipc_session *s)
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
int shmipc__session_cache_put(shmipc_session *s, uint32_t off)
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
int shmipc__session_cache_get(shmipc_session *s, uint32_t want, struct shmipc__slice *out)
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
