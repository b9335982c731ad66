/*
 * Description: a free-list pop that hands out a slice already in use (ABA on the untagged head
 * CAS, or a hostile peer) ends the session with SHMIPC_EPROTO; legal sequences under load never
 * trip the check (issue 19, item 6d).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ipc_helpers.h"
#include "shmipc.h"
#include "common/clock.h"
#include "ipc/session.h"

static char address[128];

static shmipc_config *small_config(void)
{
    shmipc_config *cfg;
    assert_int_equal(shmipc_config_new(&cfg), 0);
    /* Few slices, so that slices are recycled and shared memory runs out (fallback). */
    assert_int_equal(shmipc_config_set_buffer_capacity(cfg, 1u << 20), 0);
    assert_int_equal(shmipc_config_parse_slice_classes(cfg, "1024:30,8192:70"), 0);
    assert_int_equal(shmipc_config_set_queue_capacity(cfg, 1024), 0);
    assert_int_equal(shmipc_config_set_memmap_type(cfg, SHMIPC_MEMMAP_MEMFD), 0);
    assert_int_equal(shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_READ, 20000), 0);
    return cfg;
}

static void pair_open(struct ipc_pair *p, const shmipc_config *cfg)
{
    ipc_pick_address(address, sizeof address, "aba");
    ipc_pair_open(p, address, cfg, cfg);
}

/*
 * What an ABA race on the head CAS leaves behind, written as a hostile peer would: the head of
 * the free list of the slice at `off` names that slice, which links (hasNext) to the old head.
 * The next pop from that list hands it out, though it is in use.
 */
static void push_as_head(struct shmipc__buffer *bm, uint32_t off)
{
    struct shmipc__slice sl;
    assert_int_equal(shmipc__buffer_slice_at(bm, off, &sl), 0);
    const struct shmipc__buffer_list *l = &bm->lists[sl.list];
    uint32_t *head = (uint32_t *)(void *)(bm->base + l->offset + 8);
    uint32_t old = __atomic_load_n(head, __ATOMIC_ACQUIRE);
    uint32_t rel = off - l->region;
    memcpy(bm->base + off + 12, &old, 4);
    __atomic_fetch_or(bm->base + off + 16, (uint8_t)1, __ATOMIC_RELEASE);
    __atomic_store_n(head, rel, __ATOMIC_RELEASE);
}

/* The write that would take the slice fails, the session ends, the slice keeps its bytes. */
static void expect_double_hand_out(shmipc_session *s, shmipc_stream *st, uint32_t off,
                                   const uint8_t *kept, size_t n)
{
    uint8_t other[100];
    memset(other, 'X', sizeof other);
    /* Our cache would serve the write without a pop: empty it (into the lists' tails). */
    shmipc__session_trim(s);
    int rc = shmipc_stream_write(st, other, sizeof other);
    if (rc == 0)
        rc = shmipc_stream_flush(st);
    if (rc != SHMIPC_EPROTO)
        fail_msg("the write over a slice in use returned %d, not SHMIPC_EPROTO (%s)", rc,
                 shmipc_error_detail());
    if (strstr(shmipc_error_detail(), "handed out twice") == NULL)
        fail_msg("detail \"%s\" lacks \"handed out twice\"", shmipc_error_detail());
    assert_int_equal(shmipc_session_status(s), SHMIPC_EPROTO);
    /* The other stream's bytes are where they were. */
    assert_memory_equal(s->bm.base + off + SHMIPC__BM_SLICE_HEADER_SIZE, kept, n);
    /* The session refuses more writes. */
    assert_int_equal(shmipc_stream_write(st, other, 1), SHMIPC_EPROTO);
}

/* Regression: a pop handing out a slice we wrote and have not sent yet. */
static void pop_of_a_slice_we_are_writing_ends_the_session(void **state)
{
    (void)state;
    shmipc_config *cfg = small_config();
    struct ipc_pair p;
    shmipc_stream *a, *b;
    uint8_t mine[100];
    memset(mine, 'A', sizeof mine);
    pair_open(&p, cfg);
    assert_int_equal(shmipc_session_open_stream(p.client, &a), 0);
    assert_int_equal(shmipc_session_open_stream(p.client, &b), 0);
    assert_int_equal(shmipc_stream_write(a, mine, sizeof mine), 0);
    assert_int_equal(a->nsegs, 1);
    uint32_t off = a->segs[0].slice;
    push_as_head(&p.client->bm, off);
    expect_double_hand_out(p.client, b, off, mine, sizeof mine);
    assert_int_equal(shmipc_stream_flush(a), SHMIPC_EPROTO);
    shmipc_stream_close(a);
    shmipc_stream_close(b);
    ipc_pair_close(&p);
    shmipc_config_free(cfg);
}

/* A second stream from the client, accepted by the server: the server cannot open streams. */
static shmipc_stream *second_server_stream(struct ipc_pair *p, shmipc_stream **client_side)
{
    shmipc_stream *st;
    assert_int_equal(shmipc_session_open_stream(p->client, client_side), 0);
    ipc_send_text(*client_side, "second");
    assert_int_equal(shmipc_session_accept_stream(p->server, IPC_WAIT_MS, &st), 0);
    ipc_expect_text(st, "second");
    return st;
}

/* Regression: a pop handing out a slice the peer sent us that we have not read yet. */
static void pop_of_a_slice_we_hold_for_reading_ends_the_session(void **state)
{
    (void)state;
    shmipc_config *cfg = small_config();
    struct ipc_pair p;
    shmipc_stream *cs, *ss, *other, *cother;
    uint8_t msg[100];
    memset(msg, 'R', sizeof msg);
    pair_open(&p, cfg);
    other = second_server_stream(&p, &cother);
    assert_int_equal(shmipc_session_open_stream(p.client, &cs), 0);
    assert_int_equal(shmipc_stream_write(cs, msg, sizeof msg), 0);
    assert_int_equal(shmipc_stream_flush(cs), 0);
    assert_int_equal(shmipc_session_accept_stream(p.server, IPC_WAIT_MS, &ss), 0);
    /* Read, not released: the slice is still ours. */
    const void *ptr;
    size_t n;
    assert_int_equal(shmipc_stream_read_chunk(ss, 0, &ptr, &n, 0), 0);
    assert_int_equal(n, sizeof msg);
    uint32_t off = ss->chunks[0].slice;
    push_as_head(&p.server->bm, off);
    expect_double_hand_out(p.server, other, off, msg, sizeof msg);
    shmipc_stream_close(other);
    shmipc_stream_close(ss);
    shmipc_stream_close(cs);
    shmipc_stream_close(cother);
    ipc_pair_close(&p);
    shmipc_config_free(cfg);
}

/*
 * Regression: a slice read, released and kept in our cache, then taken from the cache for a
 * write (still ours until sent), handed out again by a pop for another write.
 */
static void pop_of_a_slice_taken_from_our_cache_ends_the_session(void **state)
{
    (void)state;
    shmipc_config *cfg = small_config();
    struct ipc_pair p;
    shmipc_stream *cs, *ss, *other, *cother;
    const void *ptr;
    uint8_t msg[100], mine[100];
    memset(msg, 'R', sizeof msg);
    memset(mine, 'C', sizeof mine);
    pair_open(&p, cfg);
    other = second_server_stream(&p, &cother);
    assert_int_equal(shmipc_session_open_stream(p.client, &cs), 0);
    assert_int_equal(shmipc_stream_write(cs, msg, sizeof msg), 0);
    assert_int_equal(shmipc_stream_flush(cs), 0);
    assert_int_equal(shmipc_session_accept_stream(p.server, IPC_WAIT_MS, &ss), 0);
    assert_int_equal(shmipc_stream_read_exact_bytes(ss, sizeof msg, &ptr, 0), 0);
    uint32_t off = ss->chunks[0].slice;
    assert_int_equal(shmipc_stream_release(ss), 0);
    assert_true(p.server->cache[0].n >= 1);
    /* The write takes the cached slice: legal, and it stays ours until it is sent. */
    assert_int_equal(shmipc_stream_write(ss, mine, sizeof mine), 0);
    assert_int_equal(ss->segs[0].slice, off);
    push_as_head(&p.server->bm, off);
    expect_double_hand_out(p.server, other, off, mine, sizeof mine);
    shmipc_stream_close(other);
    shmipc_stream_close(ss);
    shmipc_stream_close(cs);
    shmipc_stream_close(cother);
    ipc_pair_close(&p);
    shmipc_config_free(cfg);
}

/* ---- Load: legal sequences never trip the check ---- */

#define THREADS    3
#define STREAMS    4
#define RUN_MS     1500
#define MAX_ROUNDS 100000

static const uint32_t sizes[] = {1, 60, 1000, 1100, 5000, 9000, 20000, 70000};
/*
 * More than the whole buffer of small_config(): the write runs out of shared memory part-way
 * and the stream falls back to the socket for good. Sent once, as the first message of the
 * first stream of each thread: that stream then goes on over the socket, the others stay on
 * shared memory.
 */
#define HUGE 1200000u

struct load {
    shmipc_stream *client[THREADS][STREAMS], *server[THREADS][STREAMS];
    pthread_t ct[THREADS], st[THREADS];
    int crc[THREADS], src[THREADS];
    char cwhy[THREADS][256], swhy[THREADS][256];
    long rounds[THREADS];
    int fell_back[THREADS];
};

struct worker {
    struct load *ld;
    int t;
};

static uint8_t pattern(int t, int j, uint32_t seq, uint32_t k)
{
    return (uint8_t)(t * 31 + j * 7 + seq * 13 + k);
}

static int fill_message(uint8_t *buf, int t, int j, uint32_t seq, uint32_t len)
{
    memcpy(buf, &len, 4);
    memcpy(buf + 4, &seq, 4);
    for (uint32_t k = 0; k < len; k++)
        buf[8 + k] = pattern(t, j, seq, k);
    return 0;
}

static void *client_main(void *arg)
{
    struct worker *w = arg;
    struct load *ld = w->ld;
    int t = w->t, rc = 0;
    uint8_t *buf = malloc(8 + HUGE);
    uint64_t end = 0;
    uint32_t seq = 0;
    long r = 0;
    for (; rc == 0 && r < MAX_ROUNDS && (r <= 1 || shmipc__now_ns() < end); r++) {
        /* The huge first message is slow under sanitizers: the timed part starts after it. */
        if (r == 1)
            end = shmipc__now_ns() + (uint64_t)RUN_MS * 1000000;
        for (int j = 0; rc == 0 && j < STREAMS; j++, seq++) {
            shmipc_stream *st = ld->client[t][j];
            uint32_t len = sizes[(seq + (uint32_t)j) % (sizeof sizes / sizeof sizes[0])];
            if (j == 0 && r == 0)
                len = HUGE;
            const void *ptr;
            fill_message(buf, t, j, seq, len);
            /* Alternate one write and a reserve/commit, as applications do. */
            if (seq % 2 == 0 || len + 8 > 8192) {
                rc = shmipc_stream_write(st, buf, 8 + len);
            } else {
                void *win;
                rc = shmipc_stream_reserve(st, 8 + len, &win);
                if (rc == 0) {
                    memcpy(win, buf, 8 + len);
                    rc = shmipc_stream_commit(st, 8 + len);
                }
            }
            if (rc == 0)
                rc = shmipc_stream_flush(st);
            if (rc == 0)
                rc = shmipc_stream_read_exact_bytes(st, 8 + len, &ptr, 0);
            if (rc == 0 && memcmp(ptr, buf, 8 + len) != 0) {
                snprintf(ld->cwhy[t], sizeof ld->cwhy[t], "stream %d/%d seq %u: echo differs", t, j,
                         seq);
                rc = -1000;
            }
            if (rc == 0)
                rc = shmipc_stream_release(st);
        }
    }
    /* A last message on every stream, closed with its echo still to come. */
    for (int j = 0; rc == 0 && j < STREAMS; j++, seq++) {
        fill_message(buf, t, j, seq, 5000);
        rc = shmipc_stream_write(ld->client[t][j], buf, 8 + 5000);
        if (rc == 0)
            rc = shmipc_stream_flush(ld->client[t][j]);
        ld->fell_back[t] += __atomic_load_n(&ld->client[t][j]->fallback, __ATOMIC_RELAXED);
        shmipc_stream_close(ld->client[t][j]);
        ld->client[t][j] = NULL;
    }
    if (rc < 0 && rc != -1000)
        snprintf(ld->cwhy[t], sizeof ld->cwhy[t], "%s: %s", shmipc_errname(rc),
                 shmipc_error_detail());
    ld->rounds[t] = r;
    ld->crc[t] = rc;
    free(buf);
    return NULL;
}

/* Echoes each message back: by forwarding the slices (even seq) or by copying them (odd). */
static void *server_main(void *arg)
{
    struct worker *w = arg;
    struct load *ld = w->ld;
    int t = w->t, rc = 0, open = STREAMS;
    int done[STREAMS] = {0};
    uint8_t *copy = malloc(8 + HUGE);
    while (rc == 0 && open > 0) {
        for (int j = 0; rc == 0 && j < STREAMS; j++) {
            shmipc_stream *st = ld->server[t][j];
            const void *ptr;
            uint32_t len, seq;
            if (done[j])
                continue;
            rc = shmipc_stream_read_exact_bytes(st, 8, &ptr, 0);
            if (rc == SHMIPC_EEOF) {
                done[j] = 1;
                open--;
                rc = 0;
                continue;
            }
            if (rc < 0)
                break;
            memcpy(&len, ptr, 4);
            memcpy(&seq, (const uint8_t *)ptr + 4, 4);
            if (seq % 2 == 0) {
                rc = shmipc_stream_forward(st, st, len, 0);
            } else {
                memcpy(copy, ptr, 8);
                rc = shmipc_stream_read_exact_bytes(st, len, &ptr, 0);
                if (rc == 0) {
                    memcpy(copy + 8, ptr, len);
                    rc = shmipc_stream_release(st);
                }
                if (rc == 0)
                    rc = shmipc_stream_write(st, copy, 8 + len);
            }
            if (rc == 0)
                rc = shmipc_stream_flush(st);
            /* The client closes each stream after its last message, echo or not. */
            if (rc == SHMIPC_EEOF)
                rc = 0;
        }
    }
    if (rc < 0)
        snprintf(ld->swhy[t], sizeof ld->swhy[t], "%s: %s", shmipc_errname(rc),
                 shmipc_error_detail());
    ld->src[t] = rc;
    free(copy);
    return NULL;
}

static void legal_load_never_reports_a_double_hand_out(void **state)
{
    (void)state;
#if defined(__SANITIZE_THREAD__)
    /*
     * Not under TSan: both ends of this pair live in this process, each with its own mapping
     * of the same memfds, and a slice goes from one server thread to another only through the
     * client's mapping (server writes it, the client frees it and pops it again, the server
     * reads it). TSan keys memory by address, so it sees no happens-before through the other
     * mapping and reported about one run in ten a race between write_bytes and probe_locked
     * on the server's slice that the queue's release/acquire pair orders (review of issue
     * 19 item 6d). The plain and ASan builds run it; the TSan build keeps the single-thread
     * cases above and test_spin_stress / test_session for the session's own locking.
     */
    skip();
#endif
    shmipc_config *cfg = small_config();
    struct ipc_pair p;
    struct load *ld = calloc(1, sizeof *ld);
    struct worker w[THREADS];
    assert_non_null(ld);
    pair_open(&p, cfg);
    /* Every stream up front: after a fallback the session refuses new streams for a while. */
    for (int t = 0; t < THREADS; t++)
        for (int j = 0; j < STREAMS; j++) {
            uint32_t hello[2] = {(uint32_t)t, (uint32_t)j};
            assert_int_equal(shmipc_session_open_stream(p.client, &ld->client[t][j]), 0);
            assert_int_equal(shmipc_stream_write(ld->client[t][j], hello, sizeof hello), 0);
            assert_int_equal(shmipc_stream_flush(ld->client[t][j]), 0);
        }
    for (int i = 0; i < THREADS * STREAMS; i++) {
        shmipc_stream *st;
        const void *ptr;
        uint32_t hello[2];
        assert_int_equal(shmipc_session_accept_stream(p.server, IPC_WAIT_MS, &st), 0);
        assert_int_equal(shmipc_stream_read_exact_bytes(st, sizeof hello, &ptr, 0), 0);
        memcpy(hello, ptr, sizeof hello);
        assert_int_equal(shmipc_stream_release(st), 0);
        assert_true(hello[0] < THREADS && hello[1] < STREAMS);
        assert_null(ld->server[hello[0]][hello[1]]);
        ld->server[hello[0]][hello[1]] = st;
    }
    for (int t = 0; t < THREADS; t++) {
        w[t] = (struct worker){ld, t};
        assert_int_equal(pthread_create(&ld->st[t], NULL, server_main, &w[t]), 0);
        assert_int_equal(pthread_create(&ld->ct[t], NULL, client_main, &w[t]), 0);
    }
    long rounds = 0;
    for (int t = 0; t < THREADS; t++) {
        pthread_join(ld->ct[t], NULL);
        pthread_join(ld->st[t], NULL);
        rounds += ld->rounds[t];
    }
    for (int t = 0; t < THREADS; t++) {
        if (ld->crc[t] != 0)
            fail_msg("client thread %d: %d %s", t, ld->crc[t], ld->cwhy[t]);
        if (ld->src[t] != 0)
            fail_msg("server thread %d: %d %s", t, ld->src[t], ld->swhy[t]);
    }
    assert_true(rounds > 0);
    /* The first stream of each client thread went over the socket (fallback); another one may
     * have too, when a moment of exhaustion met one of its writes. */
    for (int t = 0; t < THREADS; t++)
        assert_true(ld->fell_back[t] >= 1);
    assert_int_equal(shmipc_session_status(p.client), 0);
    assert_int_equal(shmipc_session_status(p.server), 0);
    for (int t = 0; t < THREADS; t++)
        for (int j = 0; j < STREAMS; j++)
            shmipc_stream_close(ld->server[t][j]);
    print_message("%ld rounds of %d messages\n", rounds, STREAMS);
    ipc_pair_close(&p);
    shmipc_config_free(cfg);
    free(ld);
}

/* ---- The walk and a pop racing for one slice ---- */

#define RACE_ROUNDS 200000
/* And at most this long: under TSan on a loaded machine 200,000 rounds of spin barriers took
 * 105 s and more (a CI timeout); 17 in 200,000 rounds took both before the fix. */
#define RACE_NS (UINT64_C(4) * 1000000000)

struct race {
    struct shmipc__buffer bm;
    uint64_t *held;
    uint32_t off; /* the free list's head this round: popped by one, announced to the other */
    int pop_rc, walk_rc;
    uint32_t popped;
    unsigned round;   /* both threads start round r when it reaches r (spin barrier) */
    unsigned arrived; /* threads done with the current round */
    int done;         /* no round after the current one */
};

/* 1 when round n starts, 0 when the walker stopped before it. */
static int race_wait_round(struct race *r, unsigned n)
{
    while (__atomic_load_n(&r->round, __ATOMIC_ACQUIRE) != n)
        if (__atomic_load_n(&r->done, __ATOMIC_ACQUIRE))
            return 0;
    return 1;
}

/* One delay per round, so that the two threads' critical instructions meet at every skew. */
static void race_skew(unsigned n)
{
    for (volatile unsigned i = 0; i < n % 97; i++)
        ;
}

static void *race_popper(void *arg)
{
    struct race *r = arg;
    for (unsigned n = 1; race_wait_round(r, n); n++) {
        if (n % 2)
            race_skew(n);
        struct shmipc__slice sl;
        r->pop_rc = shmipc__buffer_alloc(&r->bm, 1, &sl);
        r->popped = r->pop_rc == 0 ? sl.offset : 0;
        __atomic_add_fetch(&r->arrived, 1, __ATOMIC_ACQ_REL);
    }
    return NULL;
}

/*
 * Regression: the receive walk tested a slice's bit in `held` and set it later, so a pop that
 * took the same slice in between (ABA in the peer's pop left it at the head of a free list
 * while the peer announced it to us) went unseen: the slice was both in our writer's hands and
 * in a stream's chunks. Test and set are one atomic step on both sides now: one of the two
 * always fails with SHMIPC_EPROTO.
 */
static void walk_and_pop_of_one_slice_never_both_take_it(void **state)
{
    (void)state;
    static const shmipc_slice_class classes[] = {{64, 100}};
    size_t size = 64 * 1024;
    void *base = aligned_alloc(4096, size);
    struct race *r = calloc(1, sizeof *r);
    pthread_t t;
    unsigned both = 0, n;
    uint64_t end = shmipc__now_ns() + RACE_NS;
    assert_non_null(base);
    assert_non_null(r);
    assert_int_equal(shmipc__buffer_format(&r->bm, base, size, classes, 1), 0);
    assert_non_null(r->held = shmipc__held_new(&r->bm));
    r->bm.held = r->held;
    const struct shmipc__buffer_list *l = &r->bm.lists[0];
    assert_int_equal(pthread_create(&t, NULL, race_popper, r), 0);
    for (n = 1; n <= RACE_ROUNDS && (n <= 1000 || shmipc__now_ns() < end); n++) {
        uint32_t head =
            __atomic_load_n((uint32_t *)(void *)(r->bm.base + l->offset + 8), __ATOMIC_ACQUIRE);
        r->off = l->region + head;
        __atomic_store_n(&r->round, n, __ATOMIC_RELEASE);
        if (n % 2 == 0)
            race_skew(n);
        struct shmipc__chain c;
        struct shmipc__chain_slice cs;
        shmipc__chain_begin(&c, &r->bm, r->off);
        c.held = r->held;
        r->walk_rc = shmipc__chain_next(&c, &cs);
        while (__atomic_load_n(&r->arrived, __ATOMIC_ACQUIRE) != n)
            ;
        assert_true(r->pop_rc == 0 || r->pop_rc == SHMIPC_EPROTO);
        assert_true(r->pop_rc != 0 || r->popped == r->off);
        if (r->pop_rc == 0 && r->walk_rc == 1)
            both++;
        /* Whoever took it, the slice goes back; the round's state is cleared for the next. */
        shmipc__held_drop(&r->bm, r->held, r->off);
        assert_int_equal(shmipc__buffer_free(&r->bm, r->off), 0);
        assert_int_equal(shmipc__held_count(&r->bm, r->held), 0);
    }
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    free(r->held);
    free(r);
    free(base);
    print_message("%u rounds\n", n - 1);
    if (both != 0)
        fail_msg("%u of %u rounds: the walk and a pop both took one slice", both, n - 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pop_of_a_slice_we_are_writing_ends_the_session),
        cmocka_unit_test(pop_of_a_slice_we_hold_for_reading_ends_the_session),
        cmocka_unit_test(pop_of_a_slice_taken_from_our_cache_ends_the_session),
        cmocka_unit_test(legal_load_never_reports_a_double_hand_out),
        cmocka_unit_test(walk_and_pop_of_one_slice_never_both_take_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
