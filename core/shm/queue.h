/*
 * The IO queue pair (reference §2.7): two single-producer single-consumer rings of 12-byte
 * elements in one shared mapping. The client sends on the first half and receives on the
 * second; the server the other way round. A producer wakes its consumer only when it flips
 * the consumer's working flag from 0 to 1, so a busy consumer costs the producer no syscall.
 *
 * The peer writes the other end of every ring, so head, tail and cap are read once and
 * checked: an impossible fill level is SHMIPC_EPROTO, never an access outside the mapping.
 */
#ifndef SHMIPC_CORE_SHM_QUEUE_H
#define SHMIPC_CORE_SHM_QUEUE_H

#include <stddef.h>
#include <stdint.h>

#define SHMIPC__QUEUE_HEADER_SIZE 24u
#define SHMIPC__QUEUE_ELEM_SIZE   12u
/* Largest cap whose pair still fits the 32-bit sizes of the protocol. */
#define SHMIPC__QUEUE_MAX_CAP                                                                      \
    ((UINT32_MAX / 2 - SHMIPC__QUEUE_HEADER_SIZE) / SHMIPC__QUEUE_ELEM_SIZE)

/*
 * Header layouts. LEGACY is the reference's: cap u32 @0, head i64 @4, tail i64 @12,
 * workingFlag u32 @20 on x86-64 (captured in tests/vectors), and cap @0, workingFlag @4,
 * head @8, tail @16 on arm64 (from the Go source). A V4 layout with aligned, separated
 * counters will be added as a second value; the element format stays the same.
 */
enum shmipc__queue_layout {
    SHMIPC__QUEUE_LEGACY = 0,
    /*
     * Ours, for V4 (docs/protocol.md): each half starts with a 256-byte header, cap u32 @0,
     * the tag "SQ4\0" @4, head i64 @64, tail i64 @128, workingFlag u32 @192, each on its own
     * cache line; elements follow at 256; a half is rounded up to a multiple of 64 bytes.
     */
    SHMIPC__QUEUE_V4 = 1,
};

#define SHMIPC__QUEUE_V4_HEADER_SIZE 256u
#define SHMIPC__QUEUE_V4_TAG         0x00345153u /* "SQ4\0" little-endian */

/* Which half this process sends on: the client the first, the server the second. */
enum shmipc__queue_role {
    SHMIPC__QUEUE_CLIENT = 0,
    SHMIPC__QUEUE_SERVER = 1,
};

/* One element: stream id, absolute slice offset (0 for a close), status (0 data, 1 closed). */
struct shmipc__queue_elem {
    uint32_t seq_id;
    uint32_t offset;
    uint32_t status;
};

/* One ring as this process sees it; `cap` was validated once and is never re-read. */
struct shmipc__queue {
    uint8_t *hdr;
    uint32_t cap;
    uint32_t head_at;
    uint32_t tail_at;
    uint32_t flag_at;
    uint32_t elems_at;
    uint64_t next_tail; /* the tail our last put wrote: only an address hint (prefetch) */
};

struct shmipc__queue_pair {
    struct shmipc__queue send;
    struct shmipc__queue recv;
    int layout;
};

/* Bytes of a legacy pair of rings of `cap` elements: 2 * (24 + 12 * cap). */
/*
 * Asks for the cache line at p to write it. x86: PREFETCHW (a NOP on CPUs without it): the
 * line comes exclusive in one transfer, where a load followed by a store would fetch it shared
 * and then upgrade it, a second transfer that the next fence or locked instruction waits for.
 * A hint: it never faults.
 */
static inline void shmipc__prefetch_for_write(const void *p)
{
#if defined(__x86_64__)
    __asm__ volatile("prefetchw %0" : : "m"(*(const char *)p));
#else
    __builtin_prefetch(p, 1, 3);
#endif
}

/* Asks for the line of the element a pop would read next (a hint for a spinning consumer). */
void shmipc__queue_prefetch_next(const struct shmipc__queue *q);

uint64_t shmipc__queue_pair_size(uint32_t cap);

/* Bytes of a pair of rings of `cap` elements in `layout`. */
uint64_t shmipc__queue_pair_size_for(uint32_t cap, int layout);

/*
 * Client: zero-fills `base` (`size` bytes, which must equal shmipc__queue_pair_size(cap)),
 * writes `cap` in both halves and attaches as the client. Caps whose counters would cross a
 * 64-byte line (split locks, which can be fatal) are refused with SHMIPC_ENOTSUP.
 */
int shmipc__queue_pair_format(struct shmipc__queue_pair *qp, void *base, size_t size, uint32_t cap,
                              int layout);

/*
 * Attaches to a pair the peer formatted: both halves must carry the same nonzero cap with
 * 2 * (24 + 12 * cap) == size (SHMIPC_EPROTO otherwise), and the layout must not put a
 * counter across a cache line (SHMIPC_ENOTSUP). `role` picks the send half.
 */
int shmipc__queue_pair_attach(struct shmipc__queue_pair *qp, void *base, size_t size, int layout,
                              int role);

/*
 * Producer: appends `e`. SHMIPC_EQUEUEFULL when the ring holds cap elements, SHMIPC_EPROTO
 * when head and tail are impossible. One producer thread per ring at a time (the caller
 * serialises, as the reference does with a process-local mutex).
 */
int shmipc__queue_put(struct shmipc__queue *q, const struct shmipc__queue_elem *e);

/*
 * Consumer: takes the oldest element into `e`. SHMIPC_EAGAIN when the ring is empty,
 * SHMIPC_EPROTO when head and tail are impossible (head past tail, or more than cap apart).
 * One consumer thread per ring at a time.
 */
int shmipc__queue_pop(struct shmipc__queue *q, struct shmipc__queue_elem *e);

/* Elements in the ring (0..cap), or SHMIPC_EPROTO. */
int shmipc__queue_size(const struct shmipc__queue *q);

/* The elements put (tail) and popped (head) so far, as the shared counters say now. */
uint64_t shmipc__queue_put_count(const struct shmipc__queue *q);
uint64_t shmipc__queue_popped_count(const struct shmipc__queue *q);

/*
 * Producer, after a put: flips the consumer's working flag 0 -> 1. Returns 1 when it did, and
 * only then must the producer wake the consumer (one Polling message); 0 when the consumer
 * was already working or woken.
 */
int shmipc__queue_mark_working(struct shmipc__queue *q);

/*
 * Consumer, after draining: clears the working flag, then looks again. Returns 0 when the
 * ring is still empty (the flag stays 0: the next put wakes us), 1 when elements arrived in
 * between (the flag is 1 again and the caller must drain once more), or SHMIPC_EPROTO.
 */
int shmipc__queue_mark_not_working(struct shmipc__queue *q);

#endif
