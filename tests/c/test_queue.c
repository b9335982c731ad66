/* Description: the IO queue pair: Go's queue files byte for byte, ring semantics, the working
 * flag handshake, hostile heads, tails and caps, and a million elements between two threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shmipc.h"
#include "shm/queue.h"
#include "guarded_shm.h"
#include "shm_vectors.h"

/* A formatted pair seen by both peers. */
struct pair {
    struct guarded g;
    struct shmipc__queue_pair client, server;
    size_t half;
};

static void pair_new(struct pair *p, uint32_t cap)
{
    guarded_new(&p->g, shmipc__queue_pair_size(cap));
    p->half = p->g.size / 2;
    assert_int_equal(
        shmipc__queue_pair_format(&p->client, p->g.base, p->g.size, cap, SHMIPC__QUEUE_LEGACY), 0);
    assert_int_equal(shmipc__queue_pair_attach(&p->server, p->g.base, p->g.size,
                                               SHMIPC__QUEUE_LEGACY, SHMIPC__QUEUE_SERVER),
                     0);
}

/* x86-64 legacy offsets: head i64 @4, tail i64 @12, workingFlag u32 @20. */
#define HEAD 4
#define TAIL 12
#define FLAG 20

static void queue_file_matches_go(void **state)
{
    const struct shmv_layout *v = *state;
    struct guarded g;
    struct shmipc__queue_pair qp;
    guarded_new(&g, v->queue_file_size);
    assert_int_equal(shmipc__queue_pair_size(v->queue_cap), v->queue_file_size);
    /* Dirty memory proves the format writes every byte. */
    memset(g.base, 0xa5, g.size);
    assert_int_equal(
        shmipc__queue_pair_format(&qp, g.base, g.size, v->queue_cap, SHMIPC__QUEUE_LEGACY), 0);
    for (int i = 0; i < 2; i++)
        assert_memory_equal(g.base + v->halves[i].base, v->halves[i].raw, 24);
    assert_int_equal(v->halves[1].base, g.size / 2);
    /* Everything but the two cap fields is zero. */
    for (size_t i = 0; i < g.size; i++)
        if (i % (g.size / 2) >= 4)
            assert_int_equal(g.base[i], 0);
    /* The client sends on the first half; the server maps the same bytes the other way. */
    assert_ptr_equal(qp.send.hdr, g.base);
    assert_ptr_equal(qp.recv.hdr, g.base + g.size / 2);
    assert_int_equal(qp.send.cap, v->queue_cap);
    struct shmipc__queue_pair peer;
    assert_int_equal(shmipc__queue_pair_attach(&peer, g.base, g.size, SHMIPC__QUEUE_LEGACY,
                                               SHMIPC__QUEUE_SERVER),
                     0);
    assert_ptr_equal(peer.send.hdr, g.base + g.size / 2);
    assert_ptr_equal(peer.recv.hdr, g.base);
    assert_int_equal(peer.recv.cap, v->queue_cap);
    guarded_free(&g);
}

/* The close element of each echo capture, put on a fresh queue after one data element. */
static void elements_match_go(void **state)
{
    (void)state;
    for (size_t i = 0; i < SHMV_NEXCHANGES; i++) {
        const struct shmv_exchange *v = &shmv_exchanges[i];
        struct pair p;
        struct shmipc__queue_elem got;
        pair_new(&p, v->queue_cap);
        const struct shmv_elem *req = &v->request.elem, *rep = &v->reply.elem;
        const struct shmv_elem *cls = &v->close_elem;
        struct shmipc__queue_elem e = {req->seq_id, req->offset, req->status};
        assert_int_equal(shmipc__queue_put(&p.client.send, &e), 0);
        assert_memory_equal(p.g.base + req->file_offset, req->raw, 12);
        e = (struct shmipc__queue_elem){rep->seq_id, rep->offset, rep->status};
        assert_int_equal(shmipc__queue_put(&p.server.send, &e), 0);
        assert_memory_equal(p.g.base + rep->file_offset, rep->raw, 12);
        e = (struct shmipc__queue_elem){cls->seq_id, cls->offset, cls->status};
        assert_int_equal(shmipc__queue_put(&p.client.send, &e), 0);
        assert_memory_equal(p.g.base + cls->file_offset, cls->raw, 12);
        assert_int_equal(shmipc__queue_pop(&p.server.recv, &got), 0);
        assert_int_equal(got.offset, req->offset);
        assert_int_equal(shmipc__queue_pop(&p.server.recv, &got), 0);
        assert_int_equal(got.status, 1);
        assert_int_equal(shmipc__queue_pop(&p.client.recv, &got), 0);
        assert_int_equal(got.offset, rep->offset);
        /* Both rings drained; head = tail = 2 and 1, flags untouched. */
        assert_memory_equal(p.g.base + v->close_drained.base, v->close_drained.raw, 24);
        assert_memory_equal(p.g.base + v->reply.after_drained.base, v->reply.after_drained.raw, 24);
        guarded_free(&p.g);
    }
}

static void ring_wraps_in_order(void **state)
{
    (void)state;
    struct pair p;
    struct shmipc__queue_elem e, got;
    pair_new(&p, 16);
    for (uint32_t i = 0; i < 1000; i++) {
        /* Keep the ring partly full so the slots wrap at every fill level. */
        e = (struct shmipc__queue_elem){i, i * 3u, i & 1};
        assert_int_equal(shmipc__queue_put(&p.client.send, &e), 0);
        size_t slot = 24 + 12 * (i % 16);
        assert_int_equal(get32(p.g.base, slot), i);
        assert_int_equal(get32(p.g.base, slot + 4), i * 3u);
        assert_int_equal(get32(p.g.base, slot + 8), i & 1);
        assert_int_equal(get64(p.g.base, TAIL), (int64_t)i + 1);
        if (i >= 7) {
            assert_int_equal(shmipc__queue_size(&p.server.recv), 8);
            assert_int_equal(shmipc__queue_pop(&p.server.recv, &got), 0);
            assert_int_equal(got.seq_id, i - 7);
            assert_int_equal(got.offset, (i - 7) * 3u);
            assert_int_equal(got.status, (i - 7) & 1);
            assert_int_equal(get64(p.g.base, HEAD), (int64_t)i - 6);
        }
    }
    /* The other ring is untouched. */
    assert_int_equal(get64(p.g.base, p.half + HEAD), 0);
    assert_int_equal(get64(p.g.base, p.half + TAIL), 0);
    guarded_free(&p.g);
}

static void full_and_empty(void **state)
{
    (void)state;
    struct pair p;
    struct shmipc__queue_elem e = {2, 44, 0}, got;
    pair_new(&p, 16);
    assert_int_equal(shmipc__queue_pop(&p.client.recv, &got), SHMIPC_EAGAIN);
    for (int i = 0; i < 16; i++)
        assert_int_equal(shmipc__queue_put(&p.server.send, &e), 0);
    assert_int_equal(shmipc__queue_size(&p.client.recv), 16);
    assert_int_equal(shmipc__queue_put(&p.server.send, &e), SHMIPC_EQUEUEFULL);
    assert_int_equal(get64(p.g.base, p.half + TAIL), 16);
    for (int i = 0; i < 16; i++)
        assert_int_equal(shmipc__queue_pop(&p.client.recv, &got), 0);
    assert_int_equal(shmipc__queue_pop(&p.client.recv, &got), SHMIPC_EAGAIN);
    assert_int_equal(shmipc__queue_size(&p.client.recv), 0);
    guarded_free(&p.g);
}

static void working_flag_handshake(void **state)
{
    (void)state;
    struct pair p;
    struct shmipc__queue_elem e = {2, 44, 0}, got;
    pair_new(&p, 16);
    /* Only the producer that flips 0 -> 1 sends a Polling. */
    assert_int_equal(shmipc__queue_put(&p.client.send, &e), 0);
    assert_int_equal(shmipc__queue_mark_working(&p.client.send), 1);
    assert_int_equal(get32(p.g.base, FLAG), 1);
    assert_int_equal(shmipc__queue_put(&p.client.send, &e), 0);
    assert_int_equal(shmipc__queue_mark_working(&p.client.send), 0);
    /* The consumer drains; an element arriving before it clears the flag makes it loop. */
    assert_int_equal(shmipc__queue_pop(&p.server.recv, &got), 0);
    assert_int_equal(shmipc__queue_pop(&p.server.recv, &got), 0);
    assert_int_equal(shmipc__queue_put(&p.client.send, &e), 0);
    assert_int_equal(shmipc__queue_mark_working(&p.client.send), 0);
    assert_int_equal(shmipc__queue_mark_not_working(&p.server.recv), 1);
    assert_int_equal(get32(p.g.base, FLAG), 1);
    assert_int_equal(shmipc__queue_pop(&p.server.recv, &got), 0);
    assert_int_equal(shmipc__queue_mark_not_working(&p.server.recv), 0);
    assert_int_equal(get32(p.g.base, FLAG), 0);
    /* The server's send ring has its own flag in the second half. */
    assert_int_equal(shmipc__queue_mark_working(&p.server.send), 1);
    assert_int_equal(get32(p.g.base, p.half + FLAG), 1);
    assert_int_equal(get32(p.g.base, FLAG), 0);
    guarded_free(&p.g);
}

/* ------------------------------------------------------------------------------------ */
/* Hostile queues                                                                       */
/* ------------------------------------------------------------------------------------ */

static void attach_refuses_bad_caps(void **state)
{
    (void)state;
    struct pair p;
    struct shmipc__queue_pair qp;
    pair_new(&p, 16);
    uint8_t *b = p.g.base;
    const size_t sz = p.g.size, half = p.half;

    put32(b, half, 17); /* halves disagree */
    assert_int_equal(shmipc__queue_pair_attach(&qp, b, sz, SHMIPC__QUEUE_LEGACY, 1), SHMIPC_EPROTO);
    assert_non_null(strstr(shmipc_error_detail(), "disagree"));
    put32(b, 0, 17); /* agree, but not with the size */
    assert_int_equal(shmipc__queue_pair_attach(&qp, b, sz, SHMIPC__QUEUE_LEGACY, 1), SHMIPC_EPROTO);
    put32(b, 0, UINT32_MAX);
    put32(b, half, UINT32_MAX);
    assert_int_equal(shmipc__queue_pair_attach(&qp, b, sz, SHMIPC__QUEUE_LEGACY, 1), SHMIPC_EPROTO);
    put32(b, 0, 0);
    put32(b, half, 0);
    assert_int_equal(shmipc__queue_pair_attach(&qp, b, sz, SHMIPC__QUEUE_LEGACY, 1), SHMIPC_EPROTO);
    put32(b, 0, 16);
    put32(b, half, 16);
    assert_int_equal(shmipc__queue_pair_attach(&qp, b, sz, SHMIPC__QUEUE_LEGACY, 1), 0);
    /* Sizes that cannot be a pair; a layout or role that does not exist. */
    assert_int_equal(shmipc__queue_pair_attach(&qp, b, sz - 4, SHMIPC__QUEUE_LEGACY, 1),
                     SHMIPC_EPROTO);
    assert_int_equal(shmipc__queue_pair_attach(&qp, b, sz - 1, SHMIPC__QUEUE_LEGACY, 1),
                     SHMIPC_EPROTO);
    assert_int_equal(shmipc__queue_pair_attach(&qp, b, 40, SHMIPC__QUEUE_LEGACY, 1), SHMIPC_EPROTO);
    assert_int_equal(
        shmipc__queue_pair_attach(&qp, b, (size_t)UINT32_MAX + 1, SHMIPC__QUEUE_LEGACY, 1),
        SHMIPC_EPROTO);
    assert_int_equal(shmipc__queue_pair_attach(&qp, b, sz, 7, 1), SHMIPC_ENOTSUP);
    assert_int_equal(shmipc__queue_pair_attach(&qp, b, sz, SHMIPC__QUEUE_LEGACY, 5), SHMIPC_EINVAL);
    guarded_free(&p.g);
}

static void counters_across_cache_lines_are_refused(void **state)
{
    (void)state;
    struct guarded g;
    struct shmipc__queue_pair qp;
    /* cap 8 puts the second head at byte 124, cap 2 the second tail at 60: both cross 64. */
    static const uint32_t caps[] = {8, 2, 24, 18};
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
        size_t size = shmipc__queue_pair_size(caps[i]);
        guarded_new(&g, size);
        assert_int_equal(
            shmipc__queue_pair_format(&qp, g.base, size, caps[i], SHMIPC__QUEUE_LEGACY),
            SHMIPC_ENOTSUP);
        put32(g.base, 0, caps[i]);
        put32(g.base, size / 2, caps[i]);
        assert_int_equal(shmipc__queue_pair_attach(&qp, g.base, size, SHMIPC__QUEUE_LEGACY, 1),
                         SHMIPC_ENOTSUP);
        assert_non_null(strstr(shmipc_error_detail(), "split lock"));
        guarded_free(&g);
    }
    /* Format checks its arguments. */
    guarded_new(&g, 64);
    assert_int_equal(shmipc__queue_pair_format(&qp, g.base, 64, 0, SHMIPC__QUEUE_LEGACY),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc__queue_pair_format(&qp, g.base, 64, 1, SHMIPC__QUEUE_LEGACY),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc__queue_pair_format(&qp, g.base, 64, UINT32_MAX, SHMIPC__QUEUE_LEGACY),
                     SHMIPC_EINVAL);
    guarded_free(&g);
    assert_int_equal(shmipc__queue_pair_size(1), 72);
    assert_int_equal(shmipc__queue_pair_size(8192), 196656);
}

static void impossible_heads_and_tails_are_refused(void **state)
{
    (void)state;
    struct pair p;
    struct shmipc__queue_elem e = {2, 44, 0}, got;
    static const struct {
        int64_t head, tail;
    } bad[] = {
        {0, 17},                /* more than cap apart */
        {5, 3},                 /* head past tail */
        {INT64_MIN, INT64_MAX}, /* as far apart as can be */
        {-1, 16},               /* 17 apart across zero */
    };
    pair_new(&p, 16);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        put64(p.g.base, HEAD, bad[i].head);
        put64(p.g.base, TAIL, bad[i].tail);
        assert_int_equal(shmipc__queue_pop(&p.server.recv, &got), SHMIPC_EPROTO);
        assert_non_null(strstr(shmipc_error_detail(), "corrupt queue"));
        assert_int_equal(shmipc__queue_put(&p.client.send, &e), SHMIPC_EPROTO);
        assert_int_equal(shmipc__queue_size(&p.server.recv), SHMIPC_EPROTO);
        assert_int_equal(shmipc__queue_mark_not_working(&p.server.recv), SHMIPC_EPROTO);
        /* Nothing moved. */
        assert_int_equal(get64(p.g.base, HEAD), bad[i].head);
        assert_int_equal(get64(p.g.base, TAIL), bad[i].tail);
    }
    /* Odd but consistent counters index the ring without leaving it. */
    put64(p.g.base, HEAD, -3);
    put64(p.g.base, TAIL, -3);
    for (int i = 0; i < 40; i++) {
        e.seq_id = (uint32_t)i;
        assert_int_equal(shmipc__queue_put(&p.client.send, &e), 0);
        assert_int_equal(shmipc__queue_pop(&p.server.recv, &got), 0);
        assert_int_equal(got.seq_id, (uint32_t)i);
    }
    put64(p.g.base, HEAD, INT64_MAX);
    put64(p.g.base, TAIL, INT64_MAX);
    assert_int_equal(shmipc__queue_put(&p.client.send, &e), 0);
    assert_int_equal(get64(p.g.base, TAIL), INT64_MIN);
    assert_int_equal(shmipc__queue_pop(&p.server.recv, &got), 0);
    assert_int_equal(got.seq_id, e.seq_id);
    guarded_free(&p.g);
}

/* ------------------------------------------------------------------------------------ */
/* Two threads                                                                          */
/* ------------------------------------------------------------------------------------ */

#define ELEMENTS 1000000u

struct spsc {
    struct shmipc__queue *send, *recv;
    int wake[2]; /* stands in for the Polling message on the socket */
    uint32_t received;
    int out_of_order;
    int lost_wakeup;
};

/* The consumer side of §2.7: sleep until woken, drain, clear the flag, re-check. */
static void *consumer(void *arg)
{
    struct spsc *s = arg;
    struct shmipc__queue_elem e;
    while (s->received < ELEMENTS) {
        struct pollfd pfd = {.fd = s->wake[0], .events = POLLIN};
        if (poll(&pfd, 1, 10000) != 1) {
            s->lost_wakeup = 1;
            return NULL;
        }
        char buf[64];
        while (read(s->wake[0], buf, sizeof buf) > 0)
            ;
        int again;
        do {
            int rc;
            while ((rc = shmipc__queue_pop(s->recv, &e)) == 0) {
                if (e.seq_id != s->received || e.offset != ~s->received)
                    s->out_of_order++;
                s->received++;
            }
            if (rc != SHMIPC_EAGAIN)
                s->out_of_order++;
            again = shmipc__queue_mark_not_working(s->recv);
        } while (again == 1);
        if (again < 0)
            s->out_of_order++;
    }
    return NULL;
}

static void a_million_elements_in_order(void **state)
{
    (void)state;
    struct pair p;
    struct spsc s = {0};
    pthread_t t;
    unsigned long wakeups = 0;
    pair_new(&p, 16);
    s.send = &p.client.send;
    s.recv = &p.server.recv;
    assert_int_equal(pipe2(s.wake, O_NONBLOCK | O_CLOEXEC), 0);
    assert_int_equal(pthread_create(&t, NULL, consumer, &s), 0);
    for (uint32_t i = 0; i < ELEMENTS; i++) {
        struct shmipc__queue_elem e = {i, ~i, 0};
        int rc;
        while ((rc = shmipc__queue_put(s.send, &e)) == SHMIPC_EQUEUEFULL)
            sched_yield();
        assert_int_equal(rc, 0);
        if (shmipc__queue_mark_working(s.send) == 1) {
            wakeups++;
            char one = 1;
            while (write(s.wake[1], &one, 1) != 1)
                sched_yield();
        }
    }
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(s.lost_wakeup, 0);
    assert_int_equal(s.out_of_order, 0);
    assert_int_equal(s.received, ELEMENTS);
    assert_in_range(wakeups, 1, ELEMENTS);
    assert_int_equal(get64(p.g.base, HEAD), ELEMENTS);
    assert_int_equal(get64(p.g.base, TAIL), ELEMENTS);
    close(s.wake[0]);
    close(s.wake[1]);
    guarded_free(&p.g);
}

int main(void)
{
    struct CMUnitTest tests[32];
    size_t n = 0;
    for (size_t i = 0; i < SHMV_NLAYOUTS; i++)
        tests[n++] = (struct CMUnitTest){.name = shmv_layouts[i].name,
                                         .test_func = queue_file_matches_go,
                                         .initial_state = (void *)(uintptr_t)&shmv_layouts[i]};
    const struct CMUnitTest fixed[] = {
        cmocka_unit_test(elements_match_go),
        cmocka_unit_test(ring_wraps_in_order),
        cmocka_unit_test(full_and_empty),
        cmocka_unit_test(working_flag_handshake),
        cmocka_unit_test(attach_refuses_bad_caps),
        cmocka_unit_test(counters_across_cache_lines_are_refused),
        cmocka_unit_test(impossible_heads_and_tails_are_refused),
        cmocka_unit_test(a_million_elements_in_order),
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        tests[n++] = fixed[i];
    return _cmocka_run_group_tests("queue", tests, n, NULL, NULL);
}
