#include "shm/buffer.h"

#include "common/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Field offsets inside the buffer header, a list header and a slice header. */
#define BM_LIST_NUM   0u
#define BM_USED_LEN   4u
#define LIST_SIZE     0u
#define LIST_CAP      4u
#define LIST_HEAD     8u
#define LIST_TAIL     12u
#define LIST_SLICE_SZ 16u
#define SLICE_CAP     0u
#define SLICE_SIZE    4u
#define SLICE_START   8u
#define SLICE_NEXT    12u
#define SLICE_FLAGS   16u
/* Where the creator and the mapper count their slices in use (see struct shmipc__buffer). */
#define COUNTER_CREATOR 20u
#define COUNTER_MAPPER  24u

/*
 * A free-list push only loses its tail CAS to another push, which finishes in a few
 * instructions; this many failures in a row means the tail is being scribbled on.
 */
#define PUSH_RETRIES 1000000

/* Offsets of slices never exceed UINT32_MAX - 20, so this is never one. */
#define NO_MARK UINT32_MAX

/*
 * Every field is naturally aligned: the mapping is page aligned, list headers and slices
 * start at multiples of 4 because slice sizes are multiples of 4, and the only 16-bit field
 * (listNum) is at offset 0.
 */
static uint32_t *u32_at(const struct shmipc__buffer *bm, uint32_t off)
{
    return (uint32_t *)(void *)(bm->base + off);
}

static int32_t *i32_at(const struct shmipc__buffer *bm, uint32_t off)
{
    return (int32_t *)(void *)(bm->base + off);
}

static uint8_t *flags_at(const struct shmipc__buffer *bm, uint32_t slice)
{
    /* Only the low byte of the flags word is ever written, by every implementation. */
    return bm->base + slice + SLICE_FLAGS;
}

/*
 * ThreadSanitizer and the hand-off of a slice. A slice goes from one thread of ours to another
 * through the peer: one writes it and hands it over (a flush), the peer reads it and pushes it
 * back, another pops it and writes it again. The queue's and the list's acquire/release order
 * the two writes; but when the peer is this same process (the tests run front and worker,
 * client and server, in one) it maps the region at another address, and TSan, which keys its
 * synchronization by address, sees no edge through it and reports the second write as a race
 * with the first. So under TSan a slice that leaves our hands releases its header's address
 * and one that comes into them (a pop, a received chain) acquires it: the edge the peer
 * carries, made visible to the tool. Nothing at all in other builds.
 */
#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define SLICE_LEAVES(bm, off) __tsan_release((bm)->base + (off))
#define SLICE_COMES(bm, off)  __tsan_acquire((bm)->base + (off))
#else
#define SLICE_LEAVES(bm, off) ((void)0)
#define SLICE_COMES(bm, off)  ((void)0)
#endif

/* True when `rel` (relative to the region of `l`) is the header of one of its slices. */
static int rel_is_slice(const struct shmipc__buffer_list *l, uint32_t rel)
{
    return rel < l->region_len && rel % l->stride == 0;
}

/* The list holding the slice at absolute `off`, or -1 when `off` is not a slice boundary. */
static int list_of(const struct shmipc__buffer *bm, uint32_t off)
{
    uint32_t lo = 0, hi = bm->nlists;
    /* Lists lie back to back in ascending address order: binary search their regions. */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        const struct shmipc__buffer_list *l = &bm->lists[mid];
        if (off < l->region)
            hi = mid;
        else if (off - l->region >= l->region_len)
            lo = mid + 1;
        else
            return rel_is_slice(l, off - l->region) ? (int)mid : -1;
    }
    return -1;
}

static void fill_slice(const struct shmipc__buffer *bm, uint32_t list, uint32_t off,
                       struct shmipc__slice *out)
{
    out->offset = off;
    out->list = list;
    out->cap = bm->lists[list].slice_size;
    out->data = bm->base + off + SHMIPC__BM_SLICE_HEADER_SIZE;
}

static void sort_classes(shmipc_slice_class *c, uint32_t n)
{
    for (uint32_t i = 1; i < n; i++) {
        shmipc_slice_class v = c[i];
        uint32_t j = i;
        for (; j > 0 && c[j - 1].size > v.size; j--)
            c[j] = c[j - 1];
        c[j] = v;
    }
}

/* Checks the slice size of list `i` against the rules and its predecessor's `prev`. */
static int check_slice_size(uint32_t i, uint32_t slice_size, uint32_t prev, int code)
{
    if (slice_size == 0)
        return shmipc__fail(code, "buffer list %u: slice size 0", i);
    if (slice_size % 4 != 0)
        return shmipc__fail(SHMIPC_ENOTSUP,
                            "buffer list %u: slice size %u is not a multiple of 4, which would "
                            "leave shared counters unaligned",
                            i, slice_size);
    if (i > 0 && slice_size <= prev)
        return shmipc__fail(code,
                            "buffer list %u: slice size %u after %u; sizes must be distinct and "
                            "ascending",
                            i, slice_size, prev);
    return 0;
}

int shmipc__buffer_format(struct shmipc__buffer *out, void *base, size_t size,
                          const shmipc_slice_class *classes, uint32_t n)
{
    /* Built aside and copied out on success, so a failure leaves `out` untouched. */
    struct shmipc__buffer tmp, *bm = &tmp;
    shmipc_slice_class c[SHMIPC__BM_MAX_LISTS];
    uint64_t percent = 0;
    uint64_t overhead = (uint64_t)SHMIPC__BM_LIST_HEADER_SIZE * n + SHMIPC__BM_HEADER_SIZE;

    if (n == 0 || n > SHMIPC__BM_MAX_LISTS)
        return shmipc__fail(SHMIPC_EINVAL, "buffer: %u slice classes, expected 1..%u", n,
                            SHMIPC__BM_MAX_LISTS);
    if (size > UINT32_MAX || size <= overhead)
        return shmipc__fail(SHMIPC_EINVAL, "buffer: %zu bytes cannot hold %u lists", size, n);
    memcpy(c, classes, n * sizeof c[0]);
    sort_classes(c, n);

    memset(bm, 0, sizeof *bm);
    bm->base = base;
    bm->size = (uint32_t)size;
    bm->counter_at = COUNTER_CREATOR;
    bm->nlists = n;

    uint64_t region_cap = size - overhead;
    uint32_t off = SHMIPC__BM_HEADER_SIZE;
    for (uint32_t i = 0; i < n; i++) {
        int rc = check_slice_size(i, c[i].size, i > 0 ? c[i - 1].size : 0, SHMIPC_EINVAL);
        if (rc < 0)
            return rc;
        percent += c[i].percent;
        if (percent > 100)
            return shmipc__fail(SHMIPC_EINVAL, "buffer: slice class percents sum to over 100");
        uint64_t stride = (uint64_t)c[i].size + SHMIPC__BM_SLICE_HEADER_SIZE;
        /* The reference truncates the class's share to 32 bits before dividing. */
        uint64_t num = (uint32_t)(region_cap * c[i].percent / 100) / stride;
        if (num == 0)
            return shmipc__fail(SHMIPC_EINVAL,
                                "buffer: slice class %u:%u gets no slice in %zu bytes", c[i].size,
                                c[i].percent, size);
        /* Fits: the shares add up to at most region_cap, which fits in 32 bits. */
        struct shmipc__buffer_list *l = &bm->lists[i];
        l->offset = off;
        l->region = off + SHMIPC__BM_LIST_HEADER_SIZE;
        l->cap = (uint32_t)num;
        l->slice_size = c[i].size;
        l->stride = (uint32_t)stride;
        l->region_len = (uint32_t)(num * stride);
        l->first = bm->total_slices;
        bm->total_slices += l->cap;
        off = l->region + l->region_len;
    }

    uint8_t *b = base;
    uint16_t list_num = (uint16_t)n;
    memcpy(b + BM_LIST_NUM, &list_num, sizeof list_num);
    memset(b + BM_LIST_NUM + 2, 0, 2); /* reserved */
    *u32_at(bm, BM_USED_LEN) = off - SHMIPC__BM_HEADER_SIZE;
    for (uint32_t i = 0; i < n; i++) {
        const struct shmipc__buffer_list *l = &bm->lists[i];
        memset(b + l->offset, 0, SHMIPC__BM_LIST_HEADER_SIZE);
        *i32_at(bm, l->offset + LIST_SIZE) = (int32_t)l->cap;
        *u32_at(bm, l->offset + LIST_CAP) = l->cap;
        *u32_at(bm, l->offset + LIST_HEAD) = 0;
        *u32_at(bm, l->offset + LIST_TAIL) = (l->cap - 1) * l->stride;
        *u32_at(bm, l->offset + LIST_SLICE_SZ) = l->slice_size;
        /* Every slice links to the next by relative offset; the last one has no next. */
        for (uint32_t k = 0; k < l->cap; k++) {
            uint32_t rel = k * l->stride;
            uint32_t s = l->region + rel;
            int last = k + 1 == l->cap;
            *u32_at(bm, s + SLICE_CAP) = l->slice_size;
            *u32_at(bm, s + SLICE_SIZE) = 0;
            *u32_at(bm, s + SLICE_START) = 0;
            *u32_at(bm, s + SLICE_NEXT) = last ? 0 : rel + l->stride;
            *u32_at(bm, s + SLICE_FLAGS) = last ? 0 : SHMIPC__BM_FLAG_HAS_NEXT;
        }
    }
    /*
     * No fence is needed to publish the layout: the peer learns of the mapping through the
     * handshake on the socket, and the system calls in between order every store before it.
     */
    *out = tmp;
    return 0;
}

int shmipc__buffer_attach(struct shmipc__buffer *out, void *base, size_t size)
{
    /* Built aside and copied out on success, so a failure leaves `out` untouched. */
    struct shmipc__buffer tmp, *bm = &tmp;
    memset(bm, 0, sizeof *bm);
    if (size > UINT32_MAX)
        return shmipc__fail(SHMIPC_EPROTO, "buffer: mapping of %zu bytes is over 4 GiB", size);
    if (size < SHMIPC__BM_HEADER_SIZE)
        return shmipc__fail(SHMIPC_EPROTO, "buffer: mapping of %zu bytes has no header", size);
    bm->base = base;
    bm->size = (uint32_t)size;
    bm->counter_at = COUNTER_MAPPER;

    uint16_t list_num =
        __atomic_load_n((uint16_t *)(void *)(bm->base + BM_LIST_NUM), __ATOMIC_ACQUIRE);
    uint32_t used = __atomic_load_n(u32_at(bm, BM_USED_LEN), __ATOMIC_RELAXED);
    if (list_num == 0 || list_num > SHMIPC__BM_MAX_LISTS)
        return shmipc__fail(SHMIPC_EPROTO, "buffer: listNum %u, expected 1..%u", list_num,
                            SHMIPC__BM_MAX_LISTS);
    if (used > size - SHMIPC__BM_HEADER_SIZE)
        return shmipc__fail(SHMIPC_EPROTO, "buffer: usedLen %u does not fit a %zu-byte mapping",
                            used, size);

    /* Lists lie back to back from offset 8 and must all end within 8 + usedLen. */
    uint64_t end = (uint64_t)SHMIPC__BM_HEADER_SIZE + used;
    uint64_t off = SHMIPC__BM_HEADER_SIZE;
    for (uint32_t i = 0; i < list_num; i++) {
        if (off + SHMIPC__BM_LIST_HEADER_SIZE > end)
            return shmipc__fail(SHMIPC_EPROTO,
                                "buffer list %u: header at %llu runs past usedLen %u", i,
                                (unsigned long long)off, used);
        uint32_t cap = __atomic_load_n(u32_at(bm, (uint32_t)off + LIST_CAP), __ATOMIC_RELAXED);
        uint32_t slice_size =
            __atomic_load_n(u32_at(bm, (uint32_t)off + LIST_SLICE_SZ), __ATOMIC_RELAXED);
        int rc =
            check_slice_size(i, slice_size, i > 0 ? bm->lists[i - 1].slice_size : 0, SHMIPC_EPROTO);
        if (rc < 0)
            return rc;
        if (cap == 0)
            return shmipc__fail(SHMIPC_EPROTO, "buffer list %u: no slices", i);
        uint64_t stride = (uint64_t)slice_size + SHMIPC__BM_SLICE_HEADER_SIZE;
        uint64_t room = end - off - SHMIPC__BM_LIST_HEADER_SIZE;
        /* Divide rather than multiply: cap * stride can exceed even 64 bits. */
        if (cap > room / stride)
            return shmipc__fail(SHMIPC_EPROTO,
                                "buffer list %u: %u slices of %u bytes run past usedLen %u", i, cap,
                                slice_size, used);
        struct shmipc__buffer_list *l = &bm->lists[i];
        l->offset = (uint32_t)off;
        l->region = (uint32_t)off + SHMIPC__BM_LIST_HEADER_SIZE;
        l->cap = cap;
        l->slice_size = slice_size;
        l->stride = (uint32_t)stride;
        l->region_len = (uint32_t)(cap * stride);
        /* Fits: cap * stride <= the mapping (< 4 GiB) and stride >= 20. */
        l->first = bm->total_slices;
        bm->total_slices += cap;
        bm->nlists = i + 1;
        off = (uint64_t)l->region + l->region_len;
    }
    *out = tmp;
    return 0;
}

/* The number of the slice at `off` of list `li`, across lists. */
static uint32_t slice_index(const struct shmipc__buffer *bm, uint32_t li, uint32_t off)
{
    const struct shmipc__buffer_list *l = &bm->lists[li];
    return l->first + (off - l->region) / l->stride;
}

/* Marks the slice at `off` of list `li` ours in bm->held: -1 when it was marked already. */
static int mark_held(const struct shmipc__buffer *bm, uint32_t li, uint32_t off)
{
    if (bm->held == NULL)
        return 0;
    uint32_t i = slice_index(bm, li, off);
    uint64_t bit = UINT64_C(1) << (i % 64);
    /* Relaxed: the list's own acquire/release order the pushes and pops of one slice. */
    return (__atomic_fetch_or(&bm->held[i / 64], bit, __ATOMIC_RELAXED) & bit) ? -1 : 0;
}

/* The pop of §2.6. Returns 0 with `out` filled, SHMIPC_ENOSHM, or SHMIPC_EPROTO.
 *
 * ABA: the CAS on `head` is untagged, and ABA is NOT impossible. Between our load of head (= A)
 * with A.next (= B) and the CAS, other poppers (in this process or in the peer: §2.6, both
 * processes pop from the same lists) could pop A, pop every slice after it up to the tail, while
 * A is recycled to the tail and becomes head again; the CAS would then install the stale B,
 * which may be in use, and a later pop would hand B out a second time. That needs at least a
 * whole list's worth of pops and pushes inside a window of a few instructions, i.e. this thread
 * preempted there: rare but possible. A tag cannot be added: head is a 32-bit field of the
 * shared layout and shmipc-go pops it with the same untagged CAS, so a tag in our process would
 * not protect against theirs and a wider field would break the wire format. A hostile peer can
 * produce the same state by writing head directly.
 *
 * So it is detected instead (issue 19, item 6d). The owner's bitmap bm->held has a bit for
 * every slice in its hands: set here by the pop that takes it, set by the chain walk for a slice
 * received, kept while the slice waits in the session's cache, is reserved, written or forwarded,
 * and cleared only when the slice leaves our hands (handed to the peer at flush, or pushed back
 * by shmipc__buffer_free()). The pop sets the bit with one atomic fetch-or after its CAS: a bit
 * already set means the list handed out a slice that we (another thread of this process, or a
 * reader of ours) hold, and the pop fails with SHMIPC_EPROTO, the slice untouched, and the
 * session ends. A slice the peer holds carries no bit of ours, so a double hand-out into the
 * peer's hands goes unseen here; its own checks are the peer's business. Besides, rel_is_slice()
 * checks every offset we follow, so a corrupted list fails with SHMIPC_EPROTO instead of
 * addressing outside the region. */
static int list_pop(struct shmipc__buffer *bm, uint32_t li, struct shmipc__slice *out)
{
    const struct shmipc__buffer_list *l = &bm->lists[li];
    int32_t *free_count = i32_at(bm, l->offset + LIST_SIZE);
    uint32_t *head = u32_at(bm, l->offset + LIST_HEAD);
    int corrupt_next = 0;
    int rc;

    uint32_t old = __atomic_load_n(head, __ATOMIC_ACQUIRE);
    if (__atomic_sub_fetch(free_count, 1, __ATOMIC_ACQ_REL) <= 0) {
        rc = shmipc__fail(SHMIPC_ENOSHM, "buffer list %u: no free slice", li);
        goto undo;
    }
    for (int i = 0; i < SHMIPC__BM_POP_RETRIES; i++) {
        if (!rel_is_slice(l, old)) {
            rc = shmipc__fail(SHMIPC_EPROTO, "buffer list %u: free-list head %u is not a slice", li,
                              old);
            goto undo;
        }
        uint32_t s = l->region + old;
        /* Acquire pairs with the release that set hasNext after writing next (push). */
        uint8_t flags = __atomic_load_n(flags_at(bm, s), __ATOMIC_ACQUIRE);
        if (flags & SHMIPC__BM_FLAG_HAS_NEXT) {
            uint32_t next = __atomic_load_n(u32_at(bm, s + SLICE_NEXT), __ATOMIC_RELAXED);
            /*
             * A bad next may be a race: the head slice was popped and rewritten as part of a
             * chain after we loaded head. Only a bad next that persists is corruption.
             */
            if (!rel_is_slice(l, next)) {
                corrupt_next = 1;
            } else if (__atomic_compare_exchange_n(head, &old, next, 0, __ATOMIC_ACQ_REL,
                                                   __ATOMIC_ACQUIRE)) {
                if (mark_held(bm, li, s) < 0) {
                    /* Someone's slice: not ours to write, not ours to push back. */
                    return shmipc__fail(SHMIPC_EPROTO,
                                        "buffer list %u: free-list pop handed out slice %u, which "
                                        "this process holds: a slice handed out twice (ABA on the "
                                        "untagged head, or a peer that rewrote the list)",
                                        li, s);
                }
                SLICE_COMES(bm, s);
                __atomic_store_n(flags_at(bm, s), (uint8_t)SHMIPC__BM_FLAG_IN_USE,
                                 __ATOMIC_RELAXED);
                __atomic_add_fetch(i32_at(bm, l->offset + bm->counter_at), 1, __ATOMIC_RELAXED);
                fill_slice(bm, li, s, out);
                return 0;
            } else {
                corrupt_next = 0;
                continue; /* the failed CAS loaded the current head into `old` */
            }
        } else if (__atomic_load_n(free_count, __ATOMIC_ACQUIRE) <= 1) {
            /* Head is the last free slice, which stays in the list so that push and pop
             * never touch the same node. */
            rc = shmipc__fail(SHMIPC_ENOSHM, "buffer list %u: no free slice", li);
            goto undo;
        } else {
            corrupt_next = 0;
        }
        old = __atomic_load_n(head, __ATOMIC_ACQUIRE);
    }
    if (corrupt_next)
        rc = shmipc__fail(SHMIPC_EPROTO, "buffer list %u: free slice %u links to a non-slice", li,
                          old);
    else
        rc = shmipc__fail(SHMIPC_ENOSHM, "buffer list %u: lost %d races for a free slice", li,
                          SHMIPC__BM_POP_RETRIES);
undo:
    __atomic_add_fetch(free_count, 1, __ATOMIC_ACQ_REL);
    return rc;
}

/* The push of §2.6 for the slice at `rel` in list `li`. */
static int list_push(struct shmipc__buffer *bm, uint32_t li, uint32_t rel)
{
    const struct shmipc__buffer_list *l = &bm->lists[li];
    uint32_t *tail = u32_at(bm, l->offset + LIST_TAIL);
    uint32_t s = l->region + rel;

    __atomic_store_n(u32_at(bm, s + SLICE_SIZE), 0, __ATOMIC_RELAXED);
    __atomic_store_n(u32_at(bm, s + SLICE_START), 0, __ATOMIC_RELAXED);
    __atomic_store_n(flags_at(bm, s), 0, __ATOMIC_RELAXED);
    uint32_t old = __atomic_load_n(tail, __ATOMIC_ACQUIRE);
    for (long i = 0; i < PUSH_RETRIES; i++) {
        if (!rel_is_slice(l, old))
            return shmipc__fail(SHMIPC_EPROTO, "buffer list %u: free-list tail %u is not a slice",
                                li, old);
        if (old == rel)
            return shmipc__fail(SHMIPC_EINVAL,
                                "buffer list %u: slice %u is already the free-list tail (double "
                                "free)",
                                li, s);
        if (__atomic_compare_exchange_n(tail, &old, rel, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            uint32_t t = l->region + old;
            __atomic_store_n(u32_at(bm, t + SLICE_NEXT), rel, __ATOMIC_RELAXED);
            /* Release: a pop that sees hasNext also sees next and our reset above. */
            __atomic_fetch_or(flags_at(bm, t), (uint8_t)SHMIPC__BM_FLAG_HAS_NEXT, __ATOMIC_RELEASE);
            __atomic_add_fetch(i32_at(bm, l->offset + LIST_SIZE), 1, __ATOMIC_RELEASE);
            __atomic_sub_fetch(i32_at(bm, l->offset + bm->counter_at), 1, __ATOMIC_RELAXED);
            return 0;
        }
    }
    return shmipc__fail(SHMIPC_EPROTO, "buffer list %u: free-list tail never settled", li);
}

int shmipc__buffer_alloc(struct shmipc__buffer *bm, uint32_t want, struct shmipc__slice *out)
{
    for (uint32_t i = 0; i < bm->nlists; i++) {
        if (want > bm->lists[i].slice_size)
            continue;
        int rc = list_pop(bm, i, out);
        if (rc != SHMIPC_ENOSHM)
            return rc;
    }
    return shmipc__fail(SHMIPC_ENOSHM, "buffer: no free slice of %u bytes or more", want);
}

int shmipc__buffer_alloc_many(struct shmipc__buffer *bm, uint64_t want, struct shmipc__slice *out,
                              size_t max)
{
    size_t n = 0;
    uint64_t got = 0;
    for (uint32_t i = bm->nlists; i-- > 0 && got < want && n < max;) {
        while (got < want && n < max) {
            int rc = list_pop(bm, i, &out[n]);
            if (rc == SHMIPC_ENOSHM)
                break;
            if (rc < 0) {
                /* Keep the pop's detail: the frees below may record their own. */
                char why[256];
                snprintf(why, sizeof why, "%s", shmipc__detail());
                while (n > 0)
                    shmipc__buffer_free(bm, out[--n].offset);
                return shmipc__fail(rc, "%s", why);
            }
            got += out[n++].cap;
        }
    }
    return (int)n;
}

int shmipc__buffer_slice_at(const struct shmipc__buffer *bm, uint32_t offset,
                            struct shmipc__slice *out)
{
    int li = list_of(bm, offset);
    if (li < 0)
        return shmipc__fail(SHMIPC_EINVAL, "buffer: offset %u is not a slice", offset);
    fill_slice(bm, (uint32_t)li, offset, out);
    return 0;
}

uint64_t *shmipc__held_new(const struct shmipc__buffer *bm)
{
    return calloc(((size_t)bm->total_slices + 63) / 64 + 1, sizeof(uint64_t));
}

void shmipc__held_drop(const struct shmipc__buffer *bm, uint64_t *held, uint32_t offset)
{
    int li = list_of(bm, offset);
    if (li < 0)
        return;
    SLICE_LEAVES(bm, offset);
    if (held == NULL)
        return;
    uint32_t i = slice_index(bm, (uint32_t)li, offset);
    __atomic_fetch_and(&held[i / 64], ~(UINT64_C(1) << (i % 64)), __ATOMIC_RELAXED);
}

uint32_t shmipc__held_count(const struct shmipc__buffer *bm, const uint64_t *held)
{
    uint32_t n = 0;
    for (uint32_t i = 0; held != NULL && i < bm->total_slices; i++)
        n += (__atomic_load_n(&held[i / 64], __ATOMIC_RELAXED) >> (i % 64)) & 1;
    return n;
}

int shmipc__buffer_free(struct shmipc__buffer *bm, uint32_t offset)
{
    int li = list_of(bm, offset);
    if (li < 0)
        return shmipc__fail(SHMIPC_EINVAL, "buffer: cannot free offset %u, not a slice", offset);
    /* Before the push: once in the list, the slice may be popped (and marked) at once. */
    shmipc__held_drop(bm, bm->held, offset);
    return list_push(bm, (uint32_t)li, offset - bm->lists[li].region);
}

int shmipc__buffer_slice_set(const struct shmipc__buffer *bm, const struct shmipc__slice *s,
                             uint32_t start, uint32_t size)
{
    if ((uint64_t)start + size > s->cap)
        return shmipc__fail(SHMIPC_EINVAL, "slice %u: start %u + size %u exceeds its %u bytes",
                            s->offset, start, size, s->cap);
    __atomic_store_n(u32_at(bm, s->offset + SLICE_SIZE), size, __ATOMIC_RELAXED);
    __atomic_store_n(u32_at(bm, s->offset + SLICE_START), start, __ATOMIC_RELAXED);
    return 0;
}

int shmipc__buffer_slice_claim(const struct shmipc__buffer *bm, const struct shmipc__slice *s)
{
    __atomic_store_n(u32_at(bm, s->offset + SLICE_SIZE), 0, __ATOMIC_RELAXED);
    __atomic_store_n(u32_at(bm, s->offset + SLICE_START), 0, __ATOMIC_RELAXED);
    __atomic_store_n(u32_at(bm, s->offset + SLICE_NEXT), 0, __ATOMIC_RELAXED);
    __atomic_store_n(flags_at(bm, s->offset), (uint8_t)SHMIPC__BM_FLAG_IN_USE, __ATOMIC_RELAXED);
    return 0;
}

int shmipc__buffer_slice_link(const struct shmipc__buffer *bm, const struct shmipc__slice *s,
                              uint32_t next)
{
    if (list_of(bm, next) < 0)
        return shmipc__fail(SHMIPC_EINVAL, "slice %u: link target %u is not a slice", s->offset,
                            next);
    __atomic_store_n(u32_at(bm, s->offset + SLICE_NEXT), next, __ATOMIC_RELAXED);
    __atomic_fetch_or(flags_at(bm, s->offset), (uint8_t)SHMIPC__BM_FLAG_HAS_NEXT, __ATOMIC_RELAXED);
    return 0;
}

int shmipc__buffer_slice_header(const struct shmipc__buffer *bm, uint32_t offset,
                                struct shmipc__slice_header *out)
{
    if (list_of(bm, offset) < 0)
        return shmipc__fail(SHMIPC_EINVAL, "buffer: offset %u is not a slice", offset);
    out->cap = __atomic_load_n(u32_at(bm, offset + SLICE_CAP), __ATOMIC_RELAXED);
    out->size = __atomic_load_n(u32_at(bm, offset + SLICE_SIZE), __ATOMIC_RELAXED);
    out->start = __atomic_load_n(u32_at(bm, offset + SLICE_START), __ATOMIC_RELAXED);
    out->next = __atomic_load_n(u32_at(bm, offset + SLICE_NEXT), __ATOMIC_RELAXED);
    out->flags = __atomic_load_n(u32_at(bm, offset + SLICE_FLAGS), __ATOMIC_RELAXED);
    return 0;
}

int32_t shmipc__buffer_list_free(const struct shmipc__buffer *bm, uint32_t list)
{
    if (list >= bm->nlists)
        return -1;
    return __atomic_load_n(i32_at(bm, bm->lists[list].offset + LIST_SIZE), __ATOMIC_ACQUIRE);
}

int shmipc__buffer_all_returned(const struct shmipc__buffer *bm)
{
    for (uint32_t i = 0; i < bm->nlists; i++)
        if (shmipc__buffer_list_free(bm, i) != (int32_t)bm->lists[i].cap)
            return 0;
    return 1;
}

uint32_t shmipc__buffer_max_slice(const struct shmipc__buffer *bm)
{
    return bm->nlists > 0 ? bm->lists[bm->nlists - 1].slice_size : 0;
}

void shmipc__chain_begin(struct shmipc__chain *c, const struct shmipc__buffer *bm, uint32_t offset)
{
    c->bm = bm;
    c->next = offset;
    c->more = 1;
    c->steps = 0;
    c->mark = NO_MARK;
    c->power = 1;
    c->window = 1;
    c->held = NULL;
}

int shmipc__chain_next(struct shmipc__chain *c, struct shmipc__chain_slice *out)
{
    const struct shmipc__buffer *bm = c->bm;
    if (!c->more)
        return 0;
    uint32_t off = c->next;
    if (c->steps >= bm->total_slices)
        return shmipc__fail(SHMIPC_EPROTO, "chain: more links than the %u slices of the buffer",
                            bm->total_slices);
    /*
     * Brent's cycle detection, the backstop for slices freed during the walk: remember the
     * offset seen at each power-of-two step and stop when the walk comes back to it.
     */
    if (off == c->mark)
        return shmipc__fail(SHMIPC_EPROTO, "chain: slice %u comes round again (cyclic chain)", off);
    if (c->window == c->power) {
        c->mark = off;
        c->power *= 2;
        c->window = 0;
    }
    c->window++;
    int li = list_of(bm, off);
    if (li < 0)
        return shmipc__fail(SHMIPC_EPROTO, "chain: link %u points at %u, which is not a slice",
                            c->steps, off);
    /* Read every field once; the peer may change them while we look. */
    uint32_t flags = __atomic_load_n(flags_at(bm, off), __ATOMIC_ACQUIRE);
    uint32_t size = __atomic_load_n(u32_at(bm, off + SLICE_SIZE), __ATOMIC_RELAXED);
    uint32_t start = __atomic_load_n(u32_at(bm, off + SLICE_START), __ATOMIC_RELAXED);
    uint32_t next = __atomic_load_n(u32_at(bm, off + SLICE_NEXT), __ATOMIC_RELAXED);
    uint32_t cap = bm->lists[li].slice_size;
    uint32_t index = slice_index(bm, (uint32_t)li, off);
    uint64_t bit = UINT64_C(1) << (index % 64);
    if (c->held != NULL && (__atomic_load_n(&c->held[index / 64], __ATOMIC_RELAXED) & bit))
        return shmipc__fail(SHMIPC_EPROTO,
                            "chain: link %u names slice %u, which this receiver already holds "
                            "(announced again: a slice in two chains)",
                            c->steps, off);
    if (size == SHMIPC__BM_CLAIMED)
        return shmipc__fail(SHMIPC_EPROTO,
                            "chain: slice %u was already taken by this receiver (a cyclic chain, "
                            "or a slice in two chains)",
                            off);
    if ((uint64_t)start + size > cap)
        return shmipc__fail(SHMIPC_EPROTO,
                            "chain: slice %u has start %u + size %u beyond its %u bytes", off,
                            start, size, cap);
    /*
     * Test and set in one step: a pop of this process takes the slice with the same fetch-or
     * (list_pop), so when the peer announces a slice a free list is handing us at the same
     * moment, exactly one of the two sees the other's bit. The load above only gives the
     * common case its own message.
     */
    if (c->held != NULL && (__atomic_fetch_or(&c->held[index / 64], bit, __ATOMIC_RELAXED) & bit))
        return shmipc__fail(SHMIPC_EPROTO,
                            "chain: link %u names slice %u, which this process took from a free "
                            "list meanwhile (a slice handed out twice)",
                            c->steps, off);
    SLICE_COMES(bm, off);
    __atomic_store_n(u32_at(bm, off + SLICE_SIZE), SHMIPC__BM_CLAIMED, __ATOMIC_RELAXED);
    out->index = index;
    out->offset = off;
    out->list = (uint32_t)li;
    out->start = start;
    out->size = size;
    out->flags = flags;
    out->bytes = bm->base + off + SHMIPC__BM_SLICE_HEADER_SIZE + start;
    c->more = (flags & SHMIPC__BM_FLAG_HAS_NEXT) != 0;
    c->next = next;
    c->steps++;
    return 1;
}

int shmipc__buffer_free_chain(struct shmipc__buffer *bm, uint32_t offset, uint64_t *held)
{
    struct shmipc__chain c;
    struct shmipc__chain_slice s;
    uint32_t local[64], *claimed = local, cap = 64, n = 0, freed = 0;
    int rc;
    char why[256] = "";

    /*
     * Claim the whole chain first, noting in our own memory each slice the walk claimed:
     * freeing as we go would clear the marks that catch a cycle. Then free exactly those.
     * Following the links in shared memory a second time would let the peer relink the chain
     * in between, into a slice we hold from an earlier message (its mark is ours too).
     */
    shmipc__chain_begin(&c, bm, offset);
    c.held = held;
    while ((rc = shmipc__chain_next(&c, &s)) > 0) {
        if (n == cap) {
            uint32_t *more = malloc((size_t)cap * 2 * sizeof *more);
            if (more == NULL) {
                /* Out of memory: the walk stops here; this slice is ours too, so it goes back. */
                shmipc__held_drop(bm, held, s.offset);
                (void)list_push(bm, s.list, s.offset - bm->lists[s.list].region);
                rc = shmipc__fail(SHMIPC_ENOMEM, "chain at %u: out of memory", offset);
                break;
            }
            memcpy(more, claimed, (size_t)n * sizeof *more);
            if (claimed != local)
                free(claimed);
            claimed = more;
            cap *= 2;
        }
        claimed[n++] = s.offset;
    }
    if (rc < 0)
        snprintf(why, sizeof why, "%s", shmipc__detail());

    for (uint32_t i = 0; i < n; i++) {
        uint32_t off = claimed[i];
        int li = list_of(bm, off);
        /* With `held` the walk returned each slice once, whatever the peer wrote over the
         * marks. Without it a peer that erased and rewrote a mark may have had a slice
         * returned twice (see shmipc__chain_next): free it once, while it carries our mark. */
        if (li < 0 || (held == NULL && __atomic_load_n(u32_at(bm, off + SLICE_SIZE),
                                                       __ATOMIC_RELAXED) != SHMIPC__BM_CLAIMED))
            continue;
        /* The walk marked it held; it leaves our hands now. */
        shmipc__held_drop(bm, held, off);
        int frc = list_push(bm, (uint32_t)li, off - bm->lists[li].region);
        if (frc < 0) {
            rc = frc;
            snprintf(why, sizeof why, "%s", shmipc__detail());
            break;
        }
        freed++;
    }
    if (claimed != local)
        free(claimed);
    if (rc < 0)
        return shmipc__fail(rc, "%s", why);
    if (freed != n)
        return shmipc__fail(SHMIPC_EPROTO, "chain at %u changed while it was being freed", offset);
    return (int)n;
}
