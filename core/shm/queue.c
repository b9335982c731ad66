#include "shm/queue.h"

#include "shmipc.h"
#include "common/error.h"

#include <string.h>

/*
 * Legacy offsets of head, tail and workingFlag. On x86-64 the reference puts the i64 head and
 * tail at 4 and 12: 4-aligned, not 8-aligned. x86 performs atomic operations on such fields
 * correctly as long as they stay within one cache line, which format and attach check, so
 * the __atomic builtins below are used on those int64_t pointers as they are.
 */
#if defined(__x86_64__)
#define LEGACY_HEAD 4u
#define LEGACY_TAIL 12u
#define LEGACY_FLAG 20u
#elif defined(__aarch64__)
#define LEGACY_HEAD 8u
#define LEGACY_TAIL 16u
#define LEGACY_FLAG 4u
#else
/* cppcheck-suppress preprocessorErrorDirective */
#error "the legacy shmipc queue layout is defined only for x86-64 and arm64"
#endif

_Static_assert(sizeof(int64_t) == 8 && sizeof(struct shmipc__queue_elem) == 12,
               "the queue header and element sizes are part of the wire format");
_Static_assert(LEGACY_TAIL + 8 <= SHMIPC__QUEUE_HEADER_SIZE &&
                   LEGACY_FLAG + 4 <= SHMIPC__QUEUE_HEADER_SIZE,
               "legacy counters lie inside the 24-byte header");

/* Bytes of one half. */
static uint64_t half_size(uint32_t cap, int layout)
{
    if (layout == SHMIPC__QUEUE_V4)
        return (SHMIPC__QUEUE_V4_HEADER_SIZE + (uint64_t)SHMIPC__QUEUE_ELEM_SIZE * cap + 63) / 64 *
               64;
    return SHMIPC__QUEUE_HEADER_SIZE + (uint64_t)SHMIPC__QUEUE_ELEM_SIZE * cap;
}

uint64_t shmipc__queue_pair_size(uint32_t cap)
{
    return 2 * half_size(cap, SHMIPC__QUEUE_LEGACY);
}

uint64_t shmipc__queue_pair_size_for(uint32_t cap, int layout)
{
    return 2 * half_size(cap, layout);
}

static int64_t *i64_at(const struct shmipc__queue *q, uint32_t off)
{
    return (int64_t *)(void *)(q->hdr + off);
}

static uint32_t *u32_at(const struct shmipc__queue *q, uint32_t off)
{
    return (uint32_t *)(void *)(q->hdr + off);
}

/*
 * True when an 8-byte counter at `off` in the (page-aligned) mapping can be used atomically:
 * x86 only needs it within one 64-byte line (else a split lock: slow, and fatal under
 * split_lock_detect=fatal); arm64 needs natural alignment.
 */
static int counter_ok(uint64_t off)
{
#if defined(__x86_64__)
    return off % 64 + 8 <= 64;
#else
    return off % 8 == 0;
#endif
}

/* Points `q` at the half starting `half_off` bytes into `base`. */
static void set_half(struct shmipc__queue *q, uint8_t *base, uint64_t half_off, uint32_t cap,
                     int layout)
{
    q->hdr = base + half_off;
    q->cap = cap;
    if (layout == SHMIPC__QUEUE_V4) {
        q->head_at = 64;
        q->tail_at = 128;
        q->flag_at = 192;
        q->elems_at = SHMIPC__QUEUE_V4_HEADER_SIZE;
    } else {
        q->head_at = LEGACY_HEAD;
        q->tail_at = LEGACY_TAIL;
        q->flag_at = LEGACY_FLAG;
        q->elems_at = SHMIPC__QUEUE_HEADER_SIZE;
    }
}

/* Checks the layout, the cap and the mapping size, then points both rings into `base`. */
static int set_pair(struct shmipc__queue_pair *qp, void *base, size_t size, uint32_t cap,
                    int layout, int role)
{
    if (layout != SHMIPC__QUEUE_LEGACY && layout != SHMIPC__QUEUE_V4)
        return shmipc__fail(SHMIPC_ENOTSUP, "queue: layout %d is not implemented", layout);
    if (role != SHMIPC__QUEUE_CLIENT && role != SHMIPC__QUEUE_SERVER)
        return shmipc__fail(SHMIPC_EINVAL, "queue: role %d", role);
    uint64_t half = half_size(cap, layout);
    if (cap == 0 || cap > SHMIPC__QUEUE_MAX_CAP || 2 * half != size)
        return shmipc__fail(SHMIPC_EPROTO,
                            "queue: cap %u does not match a %zu-byte mapping (expected %llu)", cap,
                            size, (unsigned long long)(2 * half));
    if (layout == SHMIPC__QUEUE_LEGACY &&
        (!counter_ok(half + LEGACY_HEAD) || !counter_ok(half + LEGACY_TAIL)))
        return shmipc__fail(SHMIPC_ENOTSUP,
                            "queue: cap %u misplaces a counter of the second half (split lock "
                            "or misalignment); use a multiple of 16",
                            cap);
    uint8_t *b = base;
    int client = role == SHMIPC__QUEUE_CLIENT;
    set_half(&qp->send, b, client ? 0 : half, cap, layout);
    set_half(&qp->recv, b, client ? half : 0, cap, layout);
    qp->layout = layout;
    return 0;
}

int shmipc__queue_pair_format(struct shmipc__queue_pair *qp, void *base, size_t size, uint32_t cap,
                              int layout)
{
    memset(qp, 0, sizeof *qp);
    if (cap == 0 || cap > SHMIPC__QUEUE_MAX_CAP || shmipc__queue_pair_size_for(cap, layout) != size)
        return shmipc__fail(SHMIPC_EINVAL, "queue: %zu bytes for cap %u, expected %llu", size, cap,
                            (unsigned long long)shmipc__queue_pair_size_for(cap, layout));
    int rc = set_pair(qp, base, size, cap, layout, SHMIPC__QUEUE_CLIENT);
    if (rc < 0)
        return rc;
    memset(base, 0, size);
    memcpy(qp->send.hdr, &cap, sizeof cap);
    memcpy(qp->recv.hdr, &cap, sizeof cap);
    if (layout == SHMIPC__QUEUE_V4) {
        uint32_t tag = SHMIPC__QUEUE_V4_TAG;
        memcpy(qp->send.hdr + 4, &tag, sizeof tag);
        memcpy(qp->recv.hdr + 4, &tag, sizeof tag);
    }
    /* The handshake's system calls order these stores before the peer can see the mapping. */
    return 0;
}

int shmipc__queue_pair_attach(struct shmipc__queue_pair *qp, void *base, size_t size, int layout,
                              int role)
{
    memset(qp, 0, sizeof *qp);
    if (size < 2 * SHMIPC__QUEUE_HEADER_SIZE || size % 2 != 0 || size > UINT32_MAX)
        return shmipc__fail(SHMIPC_EPROTO, "queue: a %zu-byte mapping cannot hold a queue pair",
                            size);
    uint8_t *b = base;
    uint32_t cap0 = __atomic_load_n((uint32_t *)(void *)b, __ATOMIC_ACQUIRE);
    uint32_t cap1 = __atomic_load_n((uint32_t *)(void *)(b + size / 2), __ATOMIC_ACQUIRE);
    if (cap0 != cap1)
        return shmipc__fail(SHMIPC_EPROTO, "queue: the halves disagree on cap (%u and %u)", cap0,
                            cap1);
    if (layout == SHMIPC__QUEUE_V4) {
        uint32_t t0 = __atomic_load_n((uint32_t *)(void *)(b + 4), __ATOMIC_ACQUIRE);
        uint32_t t1 = __atomic_load_n((uint32_t *)(void *)(b + size / 2 + 4), __ATOMIC_ACQUIRE);
        if (t0 != SHMIPC__QUEUE_V4_TAG || t1 != SHMIPC__QUEUE_V4_TAG)
            return shmipc__fail(SHMIPC_EPROTO, "queue: not a V4 queue pair (tags %#x, %#x)", t0,
                                t1);
    }
    return set_pair(qp, base, size, cap0, layout, role);
}

/*
 * Fill level from a head and a tail read once each. Unsigned arithmetic keeps hostile values
 * defined: head past tail wraps to a huge count, which fails the bound like any other.
 */
static int fill_level(const struct shmipc__queue *q, int64_t head, int64_t tail, uint64_t *out)
{
    uint64_t n = (uint64_t)tail - (uint64_t)head;
    if (n > q->cap)
        return shmipc__fail(SHMIPC_EPROTO, "corrupt queue: head %lld, tail %lld, cap %u",
                            (long long)head, (long long)tail, q->cap);
    *out = n;
    return 0;
}

static uint32_t *elem_at(const struct shmipc__queue *q, int64_t index)
{
    uint64_t slot = (uint64_t)index % q->cap;
    return u32_at(q, q->elems_at + (uint32_t)slot * SHMIPC__QUEUE_ELEM_SIZE);
}

int shmipc__queue_put(struct shmipc__queue *q, const struct shmipc__queue_elem *e)
{
    uint64_t n = 0;
    /*
     * The lines this put writes (tail, and the element at the tail our last put left) and,
     * apart, the ones it reads (head, and the flag the wakeup reads after its fence), asked for
     * at once: the consumer wrote or read each of them since our last put, so each is a
     * transfer from its CPU, and these run side by side instead of one after the other.
     * Hints only: nothing below trusts them (a tail the peer moved is read as before).
     */
    shmipc__prefetch_for_write(q->hdr + q->tail_at);
    shmipc__prefetch_for_write(elem_at(q, (int64_t)q->next_tail));
    if (q->head_at / 64 != q->tail_at / 64) {
        __builtin_prefetch(q->hdr + q->head_at);
        __builtin_prefetch(q->hdr + q->flag_at);
    }
    int64_t tail = __atomic_load_n(i64_at(q, q->tail_at), __ATOMIC_RELAXED);
    /* Acquire: the consumer has finished reading every slot up to head. */
    int64_t head = __atomic_load_n(i64_at(q, q->head_at), __ATOMIC_ACQUIRE);
    int rc = fill_level(q, head, tail, &n);
    if (rc < 0)
        return rc;
    if (n == q->cap)
        return shmipc__fail(SHMIPC_EQUEUEFULL, "queue: all %u elements are in use", q->cap);
    uint32_t *slot = elem_at(q, tail);
    __atomic_store_n(&slot[0], e->seq_id, __ATOMIC_RELAXED);
    __atomic_store_n(&slot[1], e->offset, __ATOMIC_RELAXED);
    __atomic_store_n(&slot[2], e->status, __ATOMIC_RELAXED);
    /* Release: the consumer that sees the new tail sees the element. */
    __atomic_store_n(i64_at(q, q->tail_at), (int64_t)((uint64_t)tail + 1), __ATOMIC_RELEASE);
    q->next_tail = (uint64_t)tail + 1;
    return 0;
}

int shmipc__queue_pop(struct shmipc__queue *q, struct shmipc__queue_elem *e)
{
    uint64_t n = 0;
    int64_t tail = __atomic_load_n(i64_at(q, q->tail_at), __ATOMIC_ACQUIRE);
    int64_t head = __atomic_load_n(i64_at(q, q->head_at), __ATOMIC_RELAXED);
    int rc = fill_level(q, head, tail, &n);
    if (rc < 0)
        return rc;
    if (n == 0)
        return SHMIPC_EAGAIN;
    const uint32_t *slot = elem_at(q, head);
    e->seq_id = __atomic_load_n(&slot[0], __ATOMIC_RELAXED);
    e->offset = __atomic_load_n(&slot[1], __ATOMIC_RELAXED);
    e->status = __atomic_load_n(&slot[2], __ATOMIC_RELAXED);
    /* Release: the producer may reuse the slot only after we have read it. */
    __atomic_store_n(i64_at(q, q->head_at), (int64_t)((uint64_t)head + 1), __ATOMIC_RELEASE);
    return 0;
}

void shmipc__queue_prefetch_next(const struct shmipc__queue *q)
{
    int64_t head = __atomic_load_n(i64_at(q, q->head_at), __ATOMIC_RELAXED);
    __builtin_prefetch(elem_at(q, head));
}

uint64_t shmipc__queue_put_count(const struct shmipc__queue *q)
{
    return (uint64_t)__atomic_load_n(i64_at(q, q->tail_at), __ATOMIC_RELAXED);
}

uint64_t shmipc__queue_popped_count(const struct shmipc__queue *q)
{
    return (uint64_t)__atomic_load_n(i64_at(q, q->head_at), __ATOMIC_ACQUIRE);
}

int shmipc__queue_size(const struct shmipc__queue *q)
{
    uint64_t n = 0;
    int64_t tail = __atomic_load_n(i64_at(q, q->tail_at), __ATOMIC_ACQUIRE);
    int64_t head = __atomic_load_n(i64_at(q, q->head_at), __ATOMIC_ACQUIRE);
    int rc = fill_level(q, head, tail, &n);
    return rc < 0 ? rc : (int)n;
}

/*
 * A full fence. ThreadSanitizer does not model fences (GCC refuses them under -fsanitize=thread);
 * every access they order here is atomic, so without them it still has nothing to report.
 */
#if defined(__SANITIZE_THREAD__)
#define FULL_FENCE() ((void)0)
#else
#define FULL_FENCE() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#endif

int shmipc__queue_mark_working(struct shmipc__queue *q)
{
    uint32_t idle = 0;
    /*
     * With the fence in mark_not_working this is Dekker's pattern: either the consumer sees
     * our new tail when it re-checks, or we see its cleared flag here. Never neither.
     */
    FULL_FENCE();
    /*
     * A plain look first. While the consumer works (or spins) the flag stays 1, and a CAS
     * would fail all the same, but only after taking the flag's cache line from the spinning
     * consumer (a locked RMW needs the line exclusive even when it fails); in the legacy
     * layout that line also holds head and tail, which the consumer is spinning on. The load
     * reads the same value the failed CAS would, after the same fence (docs/protocol.md 6.6).
     */
    if (__atomic_load_n(u32_at(q, q->flag_at), __ATOMIC_SEQ_CST) != 0)
        return 0;
    return __atomic_compare_exchange_n(u32_at(q, q->flag_at), &idle, 1, 0, __ATOMIC_SEQ_CST,
                                       __ATOMIC_RELAXED);
}

int shmipc__queue_mark_not_working(struct shmipc__queue *q)
{
    __atomic_store_n(u32_at(q, q->flag_at), 0, __ATOMIC_SEQ_CST);
    FULL_FENCE();
    int n = shmipc__queue_size(q);
    if (n <= 0)
        return n;
    __atomic_store_n(u32_at(q, q->flag_at), 1, __ATOMIC_SEQ_CST);
    return 1;
}
