/*
 * What the shared-memory layout tests (test_buffer, test_queue) share: guarded shared memory
 * and loads and stores of fields at byte offsets into it.
 *
 * Header-only (static inline), included after <cmocka.h>'s prerequisites like cmocka.h.
 */
#ifndef SHMIPC_TESTS_GUARDED_SHM_H
#define SHMIPC_TESTS_GUARDED_SHM_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/*
 * Zeroed shared memory of exactly `size` bytes that ends at an inaccessible page and starts
 * after one: a read or write outside it faults, in the plain build as well as under ASan
 * (which does not watch mmap'd memory). MAP_SHARED so a forked child shares it.
 */
struct guarded {
    uint8_t *map;
    size_t maplen;
    uint8_t *base;
    size_t size;
};

static inline void guarded_new(struct guarded *g, size_t size)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t body = (size + pg - 1) / pg * pg;
    assert_int_equal(size % 8, 0); /* keeps every field of the layout aligned */
    g->maplen = body + 2 * pg;
    g->map = mmap(NULL, g->maplen, PROT_NONE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(g->map != MAP_FAILED);
    assert_int_equal(mprotect(g->map + pg, body, PROT_READ | PROT_WRITE), 0);
    g->base = g->map + pg + (body - size);
    g->size = size;
}

static inline void guarded_free(struct guarded *g)
{
    munmap(g->map, g->maplen);
}

/* Fields at byte offsets, in the host's byte order, as the layouts store them. */

static inline void put32(uint8_t *base, size_t off, uint32_t v)
{
    memcpy(base + off, &v, sizeof v);
}

static inline uint32_t get32(const uint8_t *base, size_t off)
{
    uint32_t v;
    memcpy(&v, base + off, sizeof v);
    return v;
}

static inline int32_t geti32(const uint8_t *base, size_t off)
{
    int32_t v;
    memcpy(&v, base + off, sizeof v);
    return v;
}

static inline void put64(uint8_t *base, size_t off, int64_t v)
{
    memcpy(base + off, &v, sizeof v);
}

static inline int64_t get64(const uint8_t *base, size_t off)
{
    int64_t v;
    memcpy(&v, base + off, sizeof v);
    return v;
}

#endif
