/*
 * Timers: a binary min-heap of caller-embedded timers ordered by (deadline, start order). A
 * restart costs O(log n) and allocates only when the heap outgrows its array, so the idle and
 * header timeouts of HTTP connections, restarted per request, allocate nothing. The backends
 * wait no longer than the first deadline: epoll_wait's timeout, or the wait timeout of the one
 * io_uring_enter per turn.
 */
#include "reactor/backend.h"

#include "common/error.h"

#include <stdlib.h>

#define NOT_PENDING SIZE_MAX

static int before(const struct shmipc__timer *a, const struct shmipc__timer *b)
{
    return a->deadline_ns < b->deadline_ns || (a->deadline_ns == b->deadline_ns && a->seq < b->seq);
}

static void place(struct shmipc__loop *loop, size_t i, struct shmipc__timer *t)
{
    loop->heap[i] = t;
    t->heap_index = i;
}

static void sift_up(struct shmipc__loop *loop, size_t i)
{
    struct shmipc__timer *t = loop->heap[i];
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!before(t, loop->heap[parent]))
            break;
        place(loop, i, loop->heap[parent]);
        i = parent;
    }
    place(loop, i, t);
}

static void sift_down(struct shmipc__loop *loop, size_t i)
{
    struct shmipc__timer *t = loop->heap[i];
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= loop->heap_len)
            break;
        if (child + 1 < loop->heap_len && before(loop->heap[child + 1], loop->heap[child]))
            child++;
        if (!before(loop->heap[child], t))
            break;
        place(loop, i, loop->heap[child]);
        i = child;
    }
    place(loop, i, t);
}

static void heap_remove(struct shmipc__loop *loop, struct shmipc__timer *t)
{
    size_t i = t->heap_index;
    struct shmipc__timer *last = loop->heap[--loop->heap_len];
    t->heap_index = NOT_PENDING;
    if (last == t)
        return;
    place(loop, i, last);
    if (i > 0 && before(last, loop->heap[(i - 1) / 2]))
        sift_up(loop, i);
    else
        sift_down(loop, i);
}

void shmipc__timer_init(struct shmipc__loop *loop, struct shmipc__timer *timer, shmipc__timer_cb cb,
                        void *data)
{
    timer->loop = loop;
    timer->cb = cb;
    timer->data = data;
    timer->deadline_ns = 0;
    timer->seq = 0;
    timer->heap_index = NOT_PENDING;
}

int shmipc__timer_start(struct shmipc__timer *timer, uint64_t timeout_ms)
{
    struct shmipc__loop *loop = timer->loop;
    if (!shmipc__reactor_on_thread(loop))
        return shmipc__fail(SHMIPC_EBUSY,
                            "timer_start: called from a thread that does not own the loop");
    if (timeout_ms > UINT64_MAX / 2000000)
        return shmipc__fail(SHMIPC_ERANGE, "timer_start: %llu ms is too far away",
                            (unsigned long long)timeout_ms);
    if (timer->heap_index != NOT_PENDING)
        heap_remove(loop, timer);
    if (loop->heap_len == loop->heap_cap) {
        size_t cap = loop->heap_cap != 0 ? loop->heap_cap * 2 : 64;
        struct shmipc__timer **grown = realloc(loop->heap, cap * sizeof *grown);
        if (grown == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "timer_start: heap of %zu timers", cap);
        loop->heap = grown;
        loop->heap_cap = cap;
    }
    /* Inside a turn the turn's clock is used, so timers started together stay in order;
     * outside one (set-up before running) the clock may be stale and is read afresh. */
    if (!loop->in_turn)
        loop->now_ns = shmipc__reactor_now_ns(loop);
    timer->deadline_ns = loop->now_ns + timeout_ms * 1000000;
    timer->seq = loop->timer_seq++;
    loop->heap[loop->heap_len] = timer;
    sift_up(loop, loop->heap_len++);
    return 0;
}

void shmipc__timer_stop(struct shmipc__timer *timer)
{
    if (timer->heap_index != NOT_PENDING)
        heap_remove(timer->loop, timer);
}

int shmipc__timer_active(const struct shmipc__timer *timer)
{
    return timer->heap_index != NOT_PENDING;
}

int64_t shmipc__timers_next_ns(struct shmipc__loop *loop)
{
    uint64_t deadline;
    if (loop->heap_len == 0)
        return -1;
    deadline = loop->heap[0]->deadline_ns;
    return deadline > loop->now_ns ? (int64_t)(deadline - loop->now_ns) : 0;
}

int shmipc__timers_run(struct shmipc__loop *loop)
{
    /* Timers started by these callbacks wait for the next turn, even with a zero timeout, so
     * that a timer restarting itself cannot hold the loop here. */
    uint64_t limit = loop->timer_seq;
    int n = 0;
    while (loop->heap_len > 0) {
        struct shmipc__timer *t = loop->heap[0];
        if (t->deadline_ns > loop->now_ns || t->seq >= limit)
            break;
        heap_remove(loop, t);
        t->cb(t);
        n++;
    }
    return n;
}

void shmipc__timers_free(struct shmipc__loop *loop)
{
    for (size_t i = 0; i < loop->heap_len; i++)
        loop->heap[i]->heap_index = NOT_PENDING;
    free(loop->heap);
    loop->heap = NULL;
    loop->heap_len = loop->heap_cap = 0;
}
