/*
 * The buffer manager (reference §2.2-2.6): a header, then lists of fixed-size slices, all in
 * one shared mapping that the client lays out and both peers allocate from and recycle into.
 *
 * Everything in the mapping is written by the peer too and is treated as hostile: each field
 * is read once into a local, validated, then used, and nothing outside the mapping is ever
 * touched. The geometry (list offsets, slice counts and sizes) is read once, by format or
 * attach, into the process-local struct below and never read from shared memory again.
 *
 * Offsets are byte offsets from the start of the mapping ("offsetInShmBuf"), as carried in
 * queue elements and chain links.
 */
#ifndef SHMIPC_CORE_SHM_BUFFER_H
#define SHMIPC_CORE_SHM_BUFFER_H

#include "shmipc.h"

#include <stddef.h>
#include <stdint.h>

/* The layout constants of the reference (go:buffer_manager.go). */
#define SHMIPC__BM_HEADER_SIZE       8u
#define SHMIPC__BM_LIST_HEADER_SIZE  36u
#define SHMIPC__BM_SLICE_HEADER_SIZE 20u
/* Most lists a buffer may declare; the same bound as the config's slice classes. */
#define SHMIPC__BM_MAX_LISTS SHMIPC_MAX_SLICE_CLASSES
/* Slice flag bits (low byte of the flags word). */
#define SHMIPC__BM_FLAG_HAS_NEXT 1u
#define SHMIPC__BM_FLAG_IN_USE   2u
/* Free-list pop gives up after this many lost races, as the reference does. */
#define SHMIPC__BM_POP_RETRIES 200

/* A list's geometry, copied out of shared memory once. */
struct shmipc__buffer_list {
    uint32_t offset;     /* the 36-byte list header */
    uint32_t region;     /* the first slice header: offset + 36 */
    uint32_t cap;        /* slices in the list */
    uint32_t slice_size; /* data bytes per slice ("capPerBuffer") */
    uint32_t stride;     /* slice_size + 20 */
    uint32_t region_len; /* cap * stride */
    uint32_t first;      /* number of its first slice among all slices of the buffer */
};

/* A process's view of one buffer mapping. Plain data: no cleanup is needed. */
struct shmipc__buffer {
    uint8_t *base;
    uint32_t size;
    /*
     * Where this process counts its slices in use in each list header: the reference's
     * creator (client) uses +20, its mapper (server) +24. Monitoring only; mirrored as is.
     */
    uint32_t counter_at;
    uint32_t nlists; /* ascending by slice_size */
    uint32_t total_slices;
    struct shmipc__buffer_list lists[SHMIPC__BM_MAX_LISTS];
    /*
     * The owner's record of the slices in its hands (shmipc__held_new()), or NULL: when set,
     * every pop marks the slice it takes, a pop that finds the mark already there fails with
     * SHMIPC_EPROTO (the list handed out a slice in use: ABA on the untagged head CAS, or a
     * hostile peer), and shmipc__buffer_free() clears the mark before the push.
     */
    uint64_t *held;
};

/* A slice this process holds. */
struct shmipc__slice {
    uint32_t offset; /* of the slice header */
    uint32_t list;   /* index into lists[] */
    uint32_t cap;    /* data bytes it holds: its list's slice_size */
    uint8_t *data;   /* first data byte, base + offset + 20 */
};

/* A snapshot of a slice header, field by field, for inspection. */
struct shmipc__slice_header {
    uint32_t cap;
    uint32_t size;
    uint32_t start;
    uint32_t next;
    uint32_t flags;
};

/*
 * Client: lays out a fresh buffer in `base` (`size` bytes, zero-filled by the kernel) exactly
 * as the reference does: classes sorted ascending (the input order does not matter), slice
 * counts by the formula of §2.3, free lists linked in address order, counters zero. Every
 * class must get at least one slice; percents sum to at most 100; slice sizes are nonzero,
 * distinct and multiples of 4 (so every shared counter stays aligned). Fills `out` as the
 * creator (counter at +20); on failure `out` is untouched.
 */
int shmipc__buffer_format(struct shmipc__buffer *out, void *base, size_t size,
                          const shmipc_slice_class *classes, uint32_t n);

/*
 * Server: reads and validates the layout a peer wrote in `base` and fills `out` as the mapper
 * (counter at +24); on failure `out` is untouched. Refuses (SHMIPC_EPROTO) a header or list that does not fit the mapping, zero or
 * more than SHMIPC__BM_MAX_LISTS lists, empty lists, zero slice sizes, slice sizes that are
 * not strictly ascending (lists are identified by slice size), and (SHMIPC_ENOTSUP) slice
 * sizes that are not multiples of 4.
 */
int shmipc__buffer_attach(struct shmipc__buffer *out, void *base, size_t size);

/*
 * Takes one slice able to hold `want` bytes: from the smallest list whose slices are large
 * enough, else from larger lists. The last free slice of a list is never handed out. The
 * slice's flags become "in use", its size/start/next are left as they were (next is stale).
 * SHMIPC_ENOSHM when no list can serve `want` (also when `want` exceeds the largest slice),
 * SHMIPC_EPROTO when a free list in shared memory is corrupt, or (with bm->held) when the
 * list handed out a slice marked there: the slice is then left as it is, still its owner's.
 * Thread safe with other allocs and frees in this and the peer process.
 */
int shmipc__buffer_alloc(struct shmipc__buffer *bm, uint32_t want, struct shmipc__slice *out);

/*
 * Takes slices greedily from the largest list down until their capacities add up to `want`
 * or `max` slices are held: the reference's allocation for a write larger than any slice.
 * Returns the number of slices stored in `out` (0 when none was free; the total may fall
 * short of `want`), or SHMIPC_EPROTO after freeing what it took.
 */
int shmipc__buffer_alloc_many(struct shmipc__buffer *bm, uint64_t want, struct shmipc__slice *out,
                              size_t max);

/*
 * Returns the slice whose header is at `offset` to its free list (the push of §2.6): size,
 * start and flags are reset, next is left stale; its mark in bm->held is cleared first. `offset` must be exactly a slice boundary
 * of some list (SHMIPC_EINVAL otherwise); SHMIPC_EPROTO when the free list is corrupt.
 */
int shmipc__buffer_free(struct shmipc__buffer *bm, uint32_t offset);

/*
 * A process's record of the slices in its hands (received and not yet freed, and, set as
 * bm->held, popped and not yet sent or freed): one bit per slice of the buffer, numbered
 * across lists (list.first + index in the list), kept in process memory where the peer cannot
 * reach it. shmipc__held_new() allocates it zeroed for `bm`'s layout (NULL when out of
 * memory); free it with free(). The number of a slice is computed from its offset, so every
 * operation is O(1). Bits are set and cleared with atomic operations: one word holds the bits
 * of 64 slices, which threads under different locks (a session's receive path and its slice
 * cache) may change at once.
 */
uint64_t *shmipc__held_new(const struct shmipc__buffer *bm);

/* Forgets the slice at `offset` (it was freed, or handed back to the peer). Any offset is safe. */
void shmipc__held_drop(const struct shmipc__buffer *bm, uint64_t *held, uint32_t offset);

/* Number of slices marked in `held`, for tests and checks: O(slices). */
uint32_t shmipc__held_count(const struct shmipc__buffer *bm, const uint64_t *held);

/* Resolves `offset` to a slice: SHMIPC_EINVAL unless it is exactly a slice boundary. */
int shmipc__buffer_slice_at(const struct shmipc__buffer *bm, uint32_t offset,
                            struct shmipc__slice *out);

/* Writes a held slice's start and size: SHMIPC_EINVAL unless start + size <= its cap. */
int shmipc__buffer_slice_set(const struct shmipc__buffer *bm, const struct shmipc__slice *s,
                             uint32_t start, uint32_t size);

/*
 * Makes a slice this process holds (one it received, not yet freed) look freshly allocated:
 * size, start and next 0, flags "in use" only. For reusing a received slice to send, as the
 * reference's ReleaseReadAndReuse does, without a trip through the free list.
 */
int shmipc__buffer_slice_claim(const struct shmipc__buffer *bm, const struct shmipc__slice *s);

/*
 * Chains a held slice to the one at absolute offset `next` (hasNext set, inUse kept), as a
 * writer does before it hands the chain to the peer. SHMIPC_EINVAL unless `next` is a slice.
 */
int shmipc__buffer_slice_link(const struct shmipc__buffer *bm, const struct shmipc__slice *s,
                              uint32_t next);

/* Reads the header of the slice at `offset` (any slice boundary); SHMIPC_EINVAL otherwise. */
int shmipc__buffer_slice_header(const struct shmipc__buffer *bm, uint32_t offset,
                                struct shmipc__slice_header *out);

/* Free slices in list `list` right now (the shared "size" field); -1 for a bad index. */
int32_t shmipc__buffer_list_free(const struct shmipc__buffer *bm, uint32_t list);

/* 1 when every list's free count equals its slice count (all slices are back), else 0. */
int shmipc__buffer_all_returned(const struct shmipc__buffer *bm);

/* Data bytes of the largest slice. */
uint32_t shmipc__buffer_max_slice(const struct shmipc__buffer *bm);

/*
 * A walk along a chain the peer wrote and handed to this process: follow `next` (absolute)
 * while hasNext. Each step reads the slice header once and validates it before anything is
 * returned; the walk ends with SHMIPC_EPROTO on an offset that is not a slice, a start/size
 * beyond the slice (judged by its list's slice size, never by the header's own cap), a slice
 * visited before, or more links than the buffer has slices.
 *
 * The walk claims each slice it returns: the slices now belong to the receiver, which keeps
 * start and size in the returned struct, so the shared size field is overwritten with
 * SHMIPC__BM_CLAIMED (an impossible size). A cycle, or a second chain reusing a slice, is
 * thereby caught before any slice is returned twice, with no memory per slice. Writers set
 * the size of every slice they send, and a free resets it, so no peer ever reads the mark.
 *
 * Consequently a chain is walked once, and its slices should be freed after the walk has
 * ended: a free resets the mark, so a slice freed during the walk can come round again. For
 * that case the walk also runs Brent's cycle detection, which stops a cycle within about
 * twice its length (a few slices may then have been returned twice), and the walk never
 * exceeds the buffer's slice count.
 *
 * The mark is in shared memory, so a hostile peer can erase it after we took a slice and
 * announce the slice again. A receiver that keeps slices therefore also sets `held` (see
 * shmipc__held_new()) after chain_begin: the walk then refuses, with SHMIPC_EPROTO, a slice
 * whose bit is set ("already holds"), and sets the bit of every slice it returns. The caller
 * clears a bit (shmipc__held_drop()) when it frees the slice or hands it back to the peer.
 */
#define SHMIPC__BM_CLAIMED UINT32_MAX

struct shmipc__chain {
    const struct shmipc__buffer *bm;
    uint32_t next;   /* offset of the next slice to visit */
    uint32_t more;   /* 1 while a slice remains to visit */
    uint32_t steps;  /* slices visited */
    uint32_t mark;   /* Brent: the offset later steps are compared with */
    uint32_t power;  /* Brent: steps before the mark moves on */
    uint32_t window; /* Brent: steps since the mark moved */
    uint64_t *held;  /* the receiver's record of slices it holds, or NULL (chain_begin) */
};

/* One validated link of a chain. */
struct shmipc__chain_slice {
    uint32_t offset; /* of the slice header */
    uint32_t list;
    uint32_t start;
    uint32_t size;
    uint32_t flags;
    uint32_t index; /* the slice's number across lists (bit in `held`) */
    uint8_t *bytes; /* the `size` valid bytes: base + offset + 20 + start */
};

/* Starts a walk at the slice whose header is at `offset`. */
void shmipc__chain_begin(struct shmipc__chain *c, const struct shmipc__buffer *bm, uint32_t offset);

/* Visits the next slice: 1 with `out` filled, 0 at the end, or SHMIPC_EPROTO. */
int shmipc__chain_next(struct shmipc__chain *c, struct shmipc__chain_slice *out);

/*
 * Walks and frees every slice of the chain at `offset`, as a receiver does with a message it
 * will not deliver. Returns the number of slices freed, or a negative code; a broken chain
 * has its sound prefix freed before the error is returned. With `held` (may be NULL), a slice
 * the receiver holds ends the walk there as in shmipc__chain_next(), and is not freed.
 */
int shmipc__buffer_free_chain(struct shmipc__buffer *bm, uint32_t offset, uint64_t *held);

#endif
