/* Description: the buffer manager: Go's layouts and exchanges byte for byte, alloc/free
 * policy, hostile layouts, lists and chains, and concurrent alloc/free across threads and
 * processes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shmipc.h"
#include "shm/buffer.h"
#include "shm/queue.h"
#include "guarded_shm.h"
#include "shm_vectors.h"

static void to_classes(shmipc_slice_class *out, const struct shmv_class *in, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        out[i] = (shmipc_slice_class){in[i].size, in[i].percent};
}

/* A small buffer used by the policy and hostile tests: 31 slices of 1004, 7 of 4076. */
#define SMALL_SIZE 65536u
static const shmipc_slice_class small_classes[] = {{4076, 50}, {1004, 50}};

static void small_new(struct guarded *g, struct shmipc__buffer *bm)
{
    guarded_new(g, SMALL_SIZE);
    assert_int_equal(shmipc__buffer_format(bm, g->base, g->size, small_classes, 2), 0);
    assert_int_equal(bm->lists[0].cap, 31);
    assert_int_equal(bm->lists[1].cap, 7);
}

/* ------------------------------------------------------------------------------------ */
/* Layouts                                                                              */
/* ------------------------------------------------------------------------------------ */

static void layout_matches_go(void **state)
{
    const struct shmv_layout *v = *state;
    struct guarded g;
    struct shmipc__buffer bm, peer;
    shmipc_slice_class classes[4];
    struct shmipc__slice_header h;

    guarded_new(&g, v->buffer_cap);
    to_classes(classes, v->classes, v->nclasses);
    assert_int_equal(shmipc__buffer_format(&bm, g.base, g.size, classes, v->nclasses), 0);
    assert_memory_equal(g.base, v->header_raw, 8);
    assert_int_equal(bm.nlists, v->nlists);
    uint32_t total = 0;
    for (uint32_t i = 0; i < v->nlists; i++) {
        const struct shmv_list *l = &v->lists[i];
        const struct shmipc__buffer_list *ours = &bm.lists[i];
        assert_int_equal(ours->offset, l->offset);
        assert_int_equal(ours->region, l->region_offset);
        assert_int_equal(ours->cap, l->cap);
        assert_int_equal(ours->slice_size, l->slice_size);
        assert_int_equal(ours->stride, l->stride);
        assert_memory_equal(g.base + l->offset, l->raw, 36);
        for (uint32_t k = 0; k < l->nfirst; k++)
            assert_memory_equal(g.base + l->first[k].offset, l->first[k].raw, 20);
        assert_memory_equal(g.base + l->last.offset, l->last.raw, 20);
        /* The capture checked every slice against the initial formula; so do we. */
        for (uint32_t k = 0; k < l->cap; k++) {
            int last = k + 1 == l->cap;
            assert_int_equal(shmipc__buffer_slice_header(&bm, l->region_offset + k * l->stride, &h),
                             0);
            assert_int_equal(h.cap, l->slice_size);
            assert_int_equal(h.size, 0);
            assert_int_equal(h.start, 0);
            assert_int_equal(h.next, last ? 0 : (k + 1) * l->stride);
            assert_int_equal(h.flags, last ? 0 : SHMIPC__BM_FLAG_HAS_NEXT);
        }
        assert_int_equal(shmipc__buffer_list_free(&bm, i), (int32_t)l->cap);
        total += l->cap;
    }
    const struct shmipc__buffer_list *last = &bm.lists[bm.nlists - 1];
    assert_int_equal(last->region + last->region_len, v->end_of_last_list);
    assert_int_equal(bm.total_slices, total);
    for (size_t i = v->end_of_last_list; i < g.size; i++)
        assert_int_equal(g.base[i], 0);

    /* The server's reading of the same bytes agrees, with its own counter slot. */
    assert_int_equal(shmipc__buffer_attach(&peer, g.base, g.size), 0);
    assert_int_equal(peer.nlists, bm.nlists);
    assert_int_equal(peer.total_slices, bm.total_slices);
    assert_memory_equal(peer.lists, bm.lists, sizeof bm.lists[0] * bm.nlists);
    assert_int_equal(bm.counter_at, 20);
    assert_int_equal(peer.counter_at, 24);
    assert_int_equal(shmipc__buffer_all_returned(&peer), 1);
    guarded_free(&g);
}

static const struct shmv_layout *layout_named(const char *name)
{
    for (size_t i = 0; i < SHMV_NLAYOUTS; i++)
        if (strcmp(shmv_layouts[i].name, name) == 0)
            return &shmv_layouts[i];
    fail_msg("no layout vector %s", name);
    return NULL;
}

/* The fallback vector's buffer has one slice, which pop never hands out. */
static void single_slice_list_never_hands_out(void **state)
{
    (void)state;
    const struct shmv_layout *v = layout_named("exchange-fallback");
    struct guarded g;
    struct shmipc__buffer bm;
    struct shmipc__slice s;
    shmipc_slice_class classes[4];
    guarded_new(&g, v->buffer_cap);
    to_classes(classes, v->classes, v->nclasses);
    assert_int_equal(shmipc__buffer_format(&bm, g.base, g.size, classes, v->nclasses), 0);
    assert_int_equal(shmipc__buffer_alloc(&bm, 1, &s), SHMIPC_ENOSHM);
    assert_int_equal(shmipc__buffer_alloc_many(&bm, 1u << 20, &s, 1), 0);
    assert_memory_equal(g.base + v->lists[0].offset, v->lists[0].raw, 36);
    guarded_free(&g);
}

static void format_refuses_bad_classes(void **state)
{
    (void)state;
    struct guarded g;
    struct shmipc__buffer bm;
    static const shmipc_slice_class dup[] = {{1004, 50}, {1004, 50}};
    static const shmipc_slice_class odd[] = {{1005, 100}};
    static const shmipc_slice_class zero[] = {{0, 100}};
    static const shmipc_slice_class over[] = {{1004, 60}, {4076, 60}};
    static const shmipc_slice_class huge_pct[] = {{1004, 0xffffffffu}, {4076, 2}};
    static const shmipc_slice_class none[] = {{1u << 20, 100}};
    guarded_new(&g, SMALL_SIZE);
    assert_int_equal(shmipc__buffer_format(&bm, g.base, g.size, dup, 2), SHMIPC_EINVAL);
    assert_int_equal(shmipc__buffer_format(&bm, g.base, g.size, odd, 1), SHMIPC_ENOTSUP);
    assert_int_equal(shmipc__buffer_format(&bm, g.base, g.size, zero, 1), SHMIPC_EINVAL);
    assert_int_equal(shmipc__buffer_format(&bm, g.base, g.size, over, 2), SHMIPC_EINVAL);
    assert_int_equal(shmipc__buffer_format(&bm, g.base, g.size, huge_pct, 2), SHMIPC_EINVAL);
    assert_int_equal(shmipc__buffer_format(&bm, g.base, g.size, none, 1), SHMIPC_EINVAL);
    assert_int_equal(shmipc__buffer_format(&bm, g.base, g.size, small_classes, 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc__buffer_format(&bm, g.base, 40, small_classes, 1), SHMIPC_EINVAL);
    assert_non_null(strstr(shmipc_error_detail(), "cannot hold"));
    guarded_free(&g);
}

/* ------------------------------------------------------------------------------------ */
/* Exchanges replayed from the captures                                                 */
/* ------------------------------------------------------------------------------------ */

/* The echo peers' stream: u32 big-endian payload length, then payload[i] = (i*7) & 0xff. */
static uint8_t *stream_new(uint32_t payload_len)
{
    uint8_t *s = malloc((size_t)payload_len + 4);
    assert_non_null(s);
    s[0] = (uint8_t)(payload_len >> 24);
    s[1] = (uint8_t)(payload_len >> 16);
    s[2] = (uint8_t)(payload_len >> 8);
    s[3] = (uint8_t)payload_len;
    for (uint32_t i = 0; i < payload_len; i++)
        s[4 + i] = (uint8_t)((i * 7) & 0xff);
    return s;
}

/* Sender: one alloc per captured chain slice, data copied in, sizes set, slices linked. */
static void write_chain(struct shmipc__buffer *bm, const struct shmv_stage *st,
                        const uint8_t *stream, uint32_t len)
{
    struct shmipc__slice s, prev = {0};
    uint32_t pos = 0;
    for (uint32_t i = 0; i < st->nchain; i++) {
        const struct shmv_slice *c = &st->chain[i];
        assert_int_equal(shmipc__buffer_alloc(bm, c->data_len, &s), 0);
        assert_int_equal(s.offset, c->offset);
        assert_int_equal(s.list, c->list_index);
        assert_in_range(c->data_len, 0, len - pos);
        memcpy(s.data, stream + pos, c->data_len);
        pos += c->data_len;
        assert_int_equal(shmipc__buffer_slice_set(bm, &s, 0, c->data_len), 0);
        if (i > 0)
            assert_int_equal(shmipc__buffer_slice_link(bm, &prev, s.offset), 0);
        prev = s;
    }
    assert_int_equal(pos, len);
    for (uint32_t i = 0; i < st->nchain; i++)
        assert_memory_equal(bm->base + st->chain[i].offset, st->chain[i].raw, 20);
}

/*
 * Receiver: walks the chain and checks every slice and every byte against the capture. The
 * offsets are kept, as a stream keeps its unread slices, to be freed later.
 */
static void read_chain(const struct shmipc__buffer *bm, uint32_t offset,
                       const struct shmv_stage *st, const uint8_t *stream, uint32_t len,
                       uint32_t *offsets)
{
    struct shmipc__chain c;
    struct shmipc__chain_slice s;
    uint32_t pos = 0, n = 0;
    int rc;
    shmipc__chain_begin(&c, bm, offset);
    while ((rc = shmipc__chain_next(&c, &s)) == 1) {
        assert_in_range(n, 0, st->nchain - 1);
        const struct shmv_slice *v = &st->chain[n];
        offsets[n++] = s.offset;
        assert_int_equal(s.offset, v->offset);
        assert_int_equal(s.list, v->list_index);
        assert_int_equal(s.start, 0);
        assert_int_equal(s.size, v->data_len);
        assert_memory_equal(s.bytes, v->data_head, v->head_len);
        assert_memory_equal(s.bytes + s.size - v->tail_len, v->data_tail, v->tail_len);
        if (v->data != NULL)
            assert_memory_equal(s.bytes, v->data, v->full_len);
        assert_memory_equal(s.bytes, stream + pos, s.size);
        pos += s.size;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(n, st->nchain);
    assert_int_equal(pos, len);
}

static void free_all(struct shmipc__buffer *bm, const uint32_t *offsets, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(shmipc__buffer_free(bm, offsets[i]), 0);
}

/* Frees s[0..n), each of which must be a slice in use. */
static void free_slices(struct shmipc__buffer *bm, const struct shmipc__slice *s, int n)
{
    for (int i = 0; i < n; i++)
        assert_int_equal(shmipc__buffer_free(bm, s[i].offset), 0);
}

static void assert_lists(const uint8_t *base, const struct shmv_list_header *l, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        assert_memory_equal(base + l[i].offset, l[i].raw, 36);
}

static void assert_slices(const uint8_t *base, const struct shmv_slice *s, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        assert_memory_equal(base + s[i].offset, s[i].raw, 20);
}

static void assert_elem(const uint8_t *q, const struct shmv_elem *v,
                        const struct shmipc__queue_elem *e)
{
    assert_int_equal(e->seq_id, v->seq_id);
    assert_int_equal(e->offset, v->offset);
    assert_int_equal(e->status, v->status);
    assert_memory_equal(q + v->file_offset, v->raw, 12);
}

/* Both peers of a session over one buffer and one queue pair. */
struct session {
    struct guarded buf, q;
    struct shmipc__buffer client, server;
    struct shmipc__queue_pair cq, sq;
};

static void session_new(struct session *s, uint32_t buffer_cap, const struct shmv_class *classes,
                        uint32_t nclasses, uint32_t queue_cap)
{
    shmipc_slice_class c[4];
    to_classes(c, classes, nclasses);
    guarded_new(&s->buf, buffer_cap);
    guarded_new(&s->q, shmipc__queue_pair_size(queue_cap));
    assert_int_equal(shmipc__buffer_format(&s->client, s->buf.base, s->buf.size, c, nclasses), 0);
    assert_int_equal(
        shmipc__queue_pair_format(&s->cq, s->q.base, s->q.size, queue_cap, SHMIPC__QUEUE_LEGACY),
        0);
    assert_int_equal(shmipc__buffer_attach(&s->server, s->buf.base, s->buf.size), 0);
    assert_int_equal(shmipc__queue_pair_attach(&s->sq, s->q.base, s->q.size, SHMIPC__QUEUE_LEGACY,
                                               SHMIPC__QUEUE_SERVER),
                     0);
}

static void session_free(struct session *s)
{
    guarded_free(&s->q);
    guarded_free(&s->buf);
}

/*
 * Puts `e` on `send` and raises the working flag (it was down, so a Polling goes out), as the
 * Go peer did: the element is the vector's, and so is the queue header after, unless NULL.
 */
static void put_as_go(const struct session *s, struct shmipc__queue *send,
                      const struct shmipc__queue_elem *e, const struct shmv_elem *elem,
                      const struct shmv_qheader *after_put)
{
    assert_int_equal(shmipc__queue_put(send, e), 0);
    assert_int_equal(shmipc__queue_mark_working(send), 1);
    assert_elem(s->q.base, elem, e);
    if (after_put != NULL)
        assert_memory_equal(s->q.base + after_put->base, after_put->raw, 24);
}

/* Takes `e`, the only element, off `recv` and lowers the flag; the header is the vector's. */
static void drain_as_go(const struct session *s, struct shmipc__queue *recv,
                        const struct shmipc__queue_elem *e, const struct shmv_qheader *drained)
{
    struct shmipc__queue_elem got;
    assert_int_equal(shmipc__queue_pop(recv, &got), 0);
    assert_memory_equal(&got, e, sizeof *e);
    assert_int_equal(shmipc__queue_pop(recv, &got), SHMIPC_EAGAIN);
    assert_int_equal(shmipc__queue_mark_not_working(recv), 0);
    assert_memory_equal(s->q.base + drained->base, drained->raw, 24);
}

/*
 * One echo round trip as the Go peers ran it: the client allocs and sends the request; the
 * server reads it, allocs its reply, recycles the request and sends the reply; the client
 * reads and recycles the reply, then closes the stream.
 */
static void exchange_echo(void **state)
{
    const struct shmv_exchange *v = *state;
    struct session s;
    struct shmipc__queue_elem e;
    uint32_t held[4];
    uint8_t *stream = stream_new(v->payload_len);
    assert_int_equal(v->stream_len, v->payload_len + 4);
    session_new(&s, v->buffer_cap, v->classes, v->nclasses, v->queue_cap);

    /* Client: request chain, element, one Polling (the CAS succeeds). */
    write_chain(&s.client, &v->request, stream, v->stream_len);
    assert_lists(s.buf.base, v->request.lists, v->request.nlists);
    e = (struct shmipc__queue_elem){v->stream_id, v->request.chain[0].offset, 0};
    put_as_go(&s, &s.cq.send, &e, &v->request.elem, &v->request.after_put);

    /* Server: drain, stop working, read the request. */
    drain_as_go(&s, &s.sq.recv, &e, &v->request.after_drained);
    read_chain(&s.server, e.offset, &v->request, stream, v->stream_len, held);

    /* Server: reply chain, then the request goes back (counted at +24), then the element. */
    write_chain(&s.server, &v->reply, stream, v->stream_len);
    free_all(&s.server, held, v->request.nchain);
    assert_lists(s.buf.base, v->reply.lists, v->reply.nlists);
    assert_slices(s.buf.base, v->reply.tracked, v->reply.ntracked);
    e = (struct shmipc__queue_elem){v->stream_id, v->reply.chain[0].offset, 0};
    put_as_go(&s, &s.sq.send, &e, &v->reply.elem, &v->reply.after_put);

    /* Client: drain, read and recycle the reply. */
    drain_as_go(&s, &s.cq.recv, &e, &v->reply.after_drained);
    read_chain(&s.client, e.offset, &v->reply, stream, v->stream_len, held);
    free_all(&s.client, held, v->reply.nchain);
    assert_lists(s.buf.base, v->final_lists, v->nfinal_lists);
    assert_slices(s.buf.base, v->final_tracked, v->nfinal_tracked);
    for (int i = 0; i < 2; i++)
        assert_memory_equal(s.q.base + v->final_queue[i].base, v->final_queue[i].raw, 24);

    /* Client closes the stream: {id, 0, 1}; the server drains it. */
    e = (struct shmipc__queue_elem){v->stream_id, 0, 1};
    put_as_go(&s, &s.cq.send, &e, &v->close_elem, NULL);
    drain_as_go(&s, &s.sq.recv, &e, &v->close_drained);

    assert_int_equal(shmipc__buffer_all_returned(&s.client), 1);
    assert_int_equal(shmipc__buffer_all_returned(&s.server), 1);
    session_free(&s);
    free(stream);
}

/*
 * Queue cap 1: the data element fills the queue, the close element does not fit. The server
 * then consumes the data element, allocs a reply slice, recycles the request and, its flush
 * failing, the reply: its counter at +24 ends at -1 while the client's at +20 stays 1.
 */
static void exchange_streamclose_queue_full(void **state)
{
    (void)state;
    const struct shmv_queue_full *v = &shmv_queue_full;
    struct session s;
    struct shmipc__slice req, rep;
    struct shmipc__queue_elem e, got;
    session_new(&s, v->buffer_cap, v->classes, v->nclasses, v->queue_cap);
    assert_int_equal(s.q.size, v->queue_file_size);

    assert_int_equal(shmipc__buffer_alloc(&s.client, 4, &req), 0);
    assert_int_equal(req.offset, v->data_elem.offset);
    e = (struct shmipc__queue_elem){v->data_elem.seq_id, req.offset, 0};
    assert_int_equal(shmipc__queue_put(&s.cq.send, &e), 0);
    assert_int_equal(shmipc__queue_mark_working(&s.cq.send), 1);
    assert_elem(s.q.base, &v->data_elem, &e);
    assert_memory_equal(s.q.base + v->full.base, v->full.raw, 24);
    e = (struct shmipc__queue_elem){v->data_elem.seq_id, 0, 1};
    assert_int_equal(shmipc__queue_put(&s.cq.send, &e), SHMIPC_EQUEUEFULL);
    assert_int_equal(shmipc__queue_mark_working(&s.cq.send), 0);
    assert_memory_equal(s.q.base + v->after_close_call.base, v->after_close_call.raw, 24);

    assert_int_equal(shmipc__queue_pop(&s.sq.recv, &got), 0);
    assert_int_equal(got.offset, req.offset);
    assert_int_equal(shmipc__queue_mark_not_working(&s.sq.recv), 0);
    assert_int_equal(shmipc__buffer_alloc(&s.server, 4, &rep), 0);
    assert_int_equal(shmipc__buffer_free(&s.server, got.offset), 0);
    assert_int_equal(shmipc__buffer_free(&s.server, rep.offset), 0);
    for (int i = 0; i < 2; i++)
        assert_memory_equal(s.q.base + v->after_queue[i].base, v->after_queue[i].raw, 24);
    assert_lists(s.buf.base, v->after_lists, v->nafter_lists);
    assert_int_equal(geti32(s.buf.base, s.client.lists[0].offset + 20), 1);
    assert_int_equal(geti32(s.buf.base, s.client.lists[0].offset + 24), -1);
    session_free(&s);
}

/* ------------------------------------------------------------------------------------ */
/* Allocation policy                                                                    */
/* ------------------------------------------------------------------------------------ */

static void alloc_picks_smallest_fitting_list(void **state)
{
    (void)state;
    struct guarded g;
    struct shmipc__buffer bm;
    struct shmipc__slice s[4];
    small_new(&g, &bm);
    assert_int_equal(shmipc__buffer_alloc(&bm, 0, &s[0]), 0);
    assert_int_equal(s[0].list, 0);
    assert_int_equal(shmipc__buffer_alloc(&bm, 1004, &s[1]), 0);
    assert_int_equal(s[1].list, 0);
    assert_int_equal(s[1].cap, 1004);
    assert_int_equal(shmipc__buffer_alloc(&bm, 1005, &s[2]), 0);
    assert_int_equal(s[2].list, 1);
    assert_int_equal(shmipc__buffer_alloc(&bm, 4076, &s[3]), 0);
    assert_int_equal(s[3].list, 1);
    assert_int_equal(s[3].cap, 4076);
    assert_ptr_equal(s[3].data, g.base + s[3].offset + 20);
    assert_int_equal(shmipc__buffer_alloc(&bm, 4077, &s[0]), SHMIPC_ENOSHM);
    assert_int_equal(shmipc__buffer_max_slice(&bm), 4076);
    /* Popped slices are in use, keep their stale next, and count at +20. */
    struct shmipc__slice_header h;
    assert_int_equal(shmipc__buffer_slice_header(&bm, s[1].offset, &h), 0);
    assert_int_equal(h.flags, SHMIPC__BM_FLAG_IN_USE);
    assert_int_equal(h.next, 2 * bm.lists[0].stride);
    assert_int_equal(geti32(g.base, bm.lists[0].offset + 20), 2);
    assert_int_equal(geti32(g.base, bm.lists[1].offset + 20), 2);
    free_slices(&bm, s, 4);
    assert_int_equal(geti32(g.base, bm.lists[0].offset + 20), 0);
    assert_int_equal(shmipc__buffer_all_returned(&bm), 1);
    guarded_free(&g);
}

static void alloc_keeps_last_slice_and_spills_to_larger_lists(void **state)
{
    (void)state;
    struct guarded g;
    struct shmipc__buffer bm;
    struct shmipc__slice s[40];
    int n = 0;
    small_new(&g, &bm);
    /* 31 small slices, of which 30 are handed out; then the 6 of 7 large ones. */
    for (; n < 30; n++) {
        assert_int_equal(shmipc__buffer_alloc(&bm, 1, &s[n]), 0);
        assert_int_equal(s[n].list, 0);
    }
    assert_int_equal(shmipc__buffer_list_free(&bm, 0), 1);
    for (; n < 36; n++) {
        assert_int_equal(shmipc__buffer_alloc(&bm, 1, &s[n]), 0);
        assert_int_equal(s[n].list, 1);
    }
    assert_int_equal(shmipc__buffer_alloc(&bm, 1, &s[n]), SHMIPC_ENOSHM);
    assert_int_equal(shmipc__buffer_list_free(&bm, 0), 1);
    assert_int_equal(shmipc__buffer_list_free(&bm, 1), 1);
    assert_int_equal(shmipc__buffer_all_returned(&bm), 0);
    /* Freed slices are reusable at once. */
    assert_int_equal(shmipc__buffer_free(&bm, s[0].offset), 0);
    assert_int_equal(shmipc__buffer_alloc(&bm, 1, &s[0]), 0);
    assert_int_equal(s[0].list, 0);
    while (n-- > 0)
        assert_int_equal(shmipc__buffer_free(&bm, s[n].offset), 0);
    assert_int_equal(shmipc__buffer_all_returned(&bm), 1);
    assert_int_equal(shmipc__buffer_list_free(&bm, 2), -1);
    guarded_free(&g);
}

static void alloc_many_is_greedy_from_the_largest_list(void **state)
{
    (void)state;
    struct guarded g;
    struct shmipc__buffer bm;
    struct shmipc__slice s[64];
    small_new(&g, &bm);
    assert_int_equal(shmipc__buffer_alloc_many(&bm, 3 * 4076 + 1, s, 64), 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(s[i].list, 1);
        assert_int_equal(shmipc__buffer_free(&bm, s[i].offset), 0);
    }
    /* More than the buffer holds: everything but the last slice of each list. */
    int n = shmipc__buffer_alloc_many(&bm, 1u << 20, s, 64);
    assert_int_equal(n, 36);
    assert_int_equal(s[0].list, 1);
    assert_int_equal(s[35].list, 0);
    free_slices(&bm, s, n);
    /* `max` bounds the count. */
    assert_int_equal(shmipc__buffer_alloc_many(&bm, 1u << 20, s, 3), 3);
    free_slices(&bm, s, 3);
    assert_int_equal(shmipc__buffer_alloc_many(&bm, 0, s, 3), 0);
    assert_int_equal(shmipc__buffer_all_returned(&bm), 1);
    guarded_free(&g);
}

static void slice_set_and_link_check_their_arguments(void **state)
{
    (void)state;
    struct guarded g;
    struct shmipc__buffer bm;
    struct shmipc__slice a, b, c;
    small_new(&g, &bm);
    assert_int_equal(shmipc__buffer_alloc(&bm, 1, &a), 0);
    assert_int_equal(shmipc__buffer_alloc(&bm, 1, &b), 0);
    assert_int_equal(shmipc__buffer_slice_set(&bm, &a, 4, 1000), 0);
    assert_int_equal(shmipc__buffer_slice_set(&bm, &a, 5, 1000), SHMIPC_EINVAL);
    assert_int_equal(shmipc__buffer_slice_set(&bm, &a, UINT32_MAX, 2), SHMIPC_EINVAL);
    assert_int_equal(shmipc__buffer_slice_link(&bm, &a, b.offset + 4), SHMIPC_EINVAL);
    assert_int_equal(shmipc__buffer_slice_link(&bm, &a, b.offset), 0);
    assert_int_equal(shmipc__buffer_slice_at(&bm, b.offset, &c), 0);
    assert_int_equal(c.offset, b.offset);
    assert_int_equal(c.list, b.list);
    assert_int_equal(c.cap, b.cap);
    assert_ptr_equal(c.data, b.data);
    assert_int_equal(shmipc__buffer_slice_at(&bm, b.offset + 20, &c), SHMIPC_EINVAL);
    assert_int_equal(shmipc__buffer_free(&bm, b.offset), 0);
    assert_int_equal(shmipc__buffer_free(&bm, a.offset), 0);
    guarded_free(&g);
}

/* ------------------------------------------------------------------------------------ */
/* Hostile layouts                                                                      */
/* ------------------------------------------------------------------------------------ */

/* Formats the small buffer, applies `corrupt`, and expects attach to fail with `code`. */
static void attach_refuses(uint32_t off, uint32_t value, int width, int code)
{
    struct guarded g;
    struct shmipc__buffer bm, peer;
    small_new(&g, &bm);
    if (width == 2) {
        uint16_t v = (uint16_t)value;
        memcpy(g.base + off, &v, 2);
    } else {
        put32(g.base, off, value);
    }
    assert_int_equal(shmipc__buffer_attach(&peer, g.base, g.size), code);
    guarded_free(&g);
}

static void attach_refuses_corrupt_layouts(void **state)
{
    (void)state;
    /* Offsets in the small buffer: list 0 at 8, list 1 at 8 + 36 + 31 * 1024 = 31788. */
    const uint32_t l0 = 8, l1 = 31788;
    attach_refuses(0, 0, 2, SHMIPC_EPROTO);                 /* listNum 0 */
    attach_refuses(0, 33, 2, SHMIPC_EPROTO);                /* listNum over the maximum */
    attach_refuses(0, 3, 2, SHMIPC_EPROTO);                 /* a third list past usedLen */
    attach_refuses(4, SMALL_SIZE - 7, 4, SHMIPC_EPROTO);    /* usedLen past the mapping */
    attach_refuses(4, UINT32_MAX, 4, SHMIPC_EPROTO);        /* usedLen wraps */
    attach_refuses(4, 100, 4, SHMIPC_EPROTO);               /* lists run past usedLen */
    attach_refuses(l0 + 4, 0, 4, SHMIPC_EPROTO);            /* empty list */
    attach_refuses(l0 + 4, 30, 4, SHMIPC_EPROTO);           /* list 1 looked for too early */
    attach_refuses(l0 + 4, 32, 4, SHMIPC_EPROTO);           /* list 0 overlapping list 1 */
    attach_refuses(l0 + 4, UINT32_MAX, 4, SHMIPC_EPROTO);   /* cap * stride overflows */
    attach_refuses(l0 + 16, 0, 4, SHMIPC_EPROTO);           /* zero slice size */
    attach_refuses(l0 + 16, 1005, 4, SHMIPC_ENOTSUP);       /* unaligned slice size */
    attach_refuses(l0 + 16, 0xfffffffcu, 4, SHMIPC_EPROTO); /* slices larger than the map */
    attach_refuses(l1 + 16, 1004, 4, SHMIPC_EPROTO);        /* duplicate slice size */
    attach_refuses(l1 + 16, 1000, 4, SHMIPC_EPROTO);        /* descending slice sizes */
    attach_refuses(l1 + 4, 0x40000000u, 4, SHMIPC_EPROTO);  /* list 1 past the end */

    /* cap * stride overflowing 64 bits: the largest aligned slice size and slice count. */
    struct guarded g;
    struct shmipc__buffer bm, peer;
    small_new(&g, &bm);
    put32(g.base, l0 + 4, UINT32_MAX);
    put32(g.base, l0 + 16, 0xfffffffcu);
    assert_int_equal(shmipc__buffer_attach(&peer, g.base, g.size), SHMIPC_EPROTO);
    /* Mappings too small for a header, or too large for 32-bit offsets. */
    assert_int_equal(shmipc__buffer_attach(&peer, g.base, 4), SHMIPC_EPROTO);
    assert_int_equal(shmipc__buffer_attach(&peer, g.base, (size_t)UINT32_MAX + 1), SHMIPC_EPROTO);
    guarded_free(&g);
}

static void corrupt_free_list_head_is_refused(void **state)
{
    (void)state;
    struct guarded g;
    struct shmipc__buffer bm;
    struct shmipc__slice s;
    static const uint32_t bad_heads[] = {3, 1024 * 31, 1024 * 31 + 1024, UINT32_MAX, 1020};
    small_new(&g, &bm);
    const uint32_t head = bm.lists[0].offset + 8;
    for (size_t i = 0; i < sizeof bad_heads / sizeof bad_heads[0]; i++) {
        put32(g.base, head, bad_heads[i]);
        assert_int_equal(shmipc__buffer_alloc(&bm, 1, &s), SHMIPC_EPROTO);
        assert_non_null(strstr(shmipc_error_detail(), "head"));
        assert_int_equal(shmipc__buffer_list_free(&bm, 0), 31);
    }
    /* A head slice whose next is not a slice, every time we look. */
    put32(g.base, head, 0);
    put32(g.base, bm.lists[0].region + 12, 5);
    assert_int_equal(shmipc__buffer_alloc(&bm, 1, &s), SHMIPC_EPROTO);
    assert_non_null(strstr(shmipc_error_detail(), "non-slice"));
    put32(g.base, bm.lists[0].region + 12, 31 * 1024);
    assert_int_equal(shmipc__buffer_alloc(&bm, 1, &s), SHMIPC_EPROTO);
    assert_int_equal(shmipc__buffer_list_free(&bm, 0), 31);
    /* Repaired, the list works again. */
    put32(g.base, bm.lists[0].region + 12, 1024);
    assert_int_equal(shmipc__buffer_alloc(&bm, 1, &s), 0);
    assert_int_equal(shmipc__buffer_free(&bm, s.offset), 0);
    guarded_free(&g);
}

static void corrupt_free_list_tail_is_refused(void **state)
{
    (void)state;
    struct guarded g;
    struct shmipc__buffer bm;
    struct shmipc__slice s;
    small_new(&g, &bm);
    assert_int_equal(shmipc__buffer_alloc(&bm, 1, &s), 0);
    const uint32_t tail = bm.lists[0].offset + 12;
    put32(g.base, tail, 0xfffffff0u);
    assert_int_equal(shmipc__buffer_free(&bm, s.offset), SHMIPC_EPROTO);
    put32(g.base, tail, 1025);
    assert_int_equal(shmipc__buffer_free(&bm, s.offset), SHMIPC_EPROTO);
    /* The slice being freed is already the tail: a double free. */
    put32(g.base, tail, s.offset - bm.lists[0].region);
    assert_int_equal(shmipc__buffer_free(&bm, s.offset), SHMIPC_EINVAL);
    assert_non_null(strstr(shmipc_error_detail(), "double free"));
    guarded_free(&g);
}

static void free_refuses_offsets_that_are_not_slices(void **state)
{
    (void)state;
    struct guarded g;
    struct shmipc__buffer bm;
    small_new(&g, &bm);
    const uint32_t r0 = bm.lists[0].region, r1 = bm.lists[1].region;
    const uint32_t bad[] = {0,
                            4,
                            8,
                            r0 - 4,
                            r0 + 1,
                            r0 + 20,
                            r0 + 1020,
                            bm.lists[1].offset,
                            r1 - 36,
                            r1 + 4096 * 7,
                            r1 + 4096 * 7 - 20,
                            SMALL_SIZE,
                            SMALL_SIZE - 20,
                            UINT32_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(shmipc__buffer_free(&bm, bad[i]), SHMIPC_EINVAL);
        struct shmipc__slice_header h;
        assert_int_equal(shmipc__buffer_slice_header(&bm, bad[i], &h), SHMIPC_EINVAL);
    }
    assert_int_equal(shmipc__buffer_all_returned(&bm), 1);
    guarded_free(&g);
}

/* ------------------------------------------------------------------------------------ */
/* Hostile chains                                                                       */
/* ------------------------------------------------------------------------------------ */

/* Writes a chain slice header directly, as a (possibly hostile) peer would. */
static void poke_slice(uint8_t *base, uint32_t off, uint32_t cap, uint32_t size, uint32_t start,
                       uint32_t next, uint32_t flags)
{
    put32(base, off, cap);
    put32(base, off + 4, size);
    put32(base, off + 8, start);
    put32(base, off + 12, next);
    put32(base, off + 16, flags);
}

/* Walks from `offset`; returns the final code and stores how many slices were visited. */
static int walk(const struct shmipc__buffer *bm, uint32_t offset, uint32_t *visited)
{
    struct shmipc__chain c;
    struct shmipc__chain_slice s;
    int rc;
    *visited = 0;
    shmipc__chain_begin(&c, bm, offset);
    while ((rc = shmipc__chain_next(&c, &s)) == 1)
        (*visited)++;
    return rc;
}

static void chain_offsets_must_be_slices(void **state)
{
    (void)state;
    struct guarded g;
    struct shmipc__buffer bm;
    uint32_t n;
    small_new(&g, &bm);
    const uint32_t r0 = bm.lists[0].region;
    const uint32_t bad[] = {0, 8, r0 + 1, r0 + 20, bm.lists[1].offset, SMALL_SIZE - 20, UINT32_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(walk(&bm, bad[i], &n), SHMIPC_EPROTO);
        assert_int_equal(n, 0);
    }
    /* A good first slice whose link is misaligned, or into a list header. */
    poke_slice(g.base, r0, 1004, 10, 0, r0 + 1024 + 4, 3);
    assert_int_equal(walk(&bm, r0, &n), SHMIPC_EPROTO);
    assert_int_equal(n, 1);
    poke_slice(g.base, r0, 1004, 10, 0, bm.lists[1].offset, 3);
    assert_int_equal(walk(&bm, r0, &n), SHMIPC_EPROTO);
    assert_int_equal(n, 1);
    /* Without hasNext the stale next is never followed. */
    poke_slice(g.base, r0, 1004, 10, 0, UINT32_MAX, SHMIPC__BM_FLAG_IN_USE);
    assert_int_equal(walk(&bm, r0, &n), 0);
    assert_int_equal(n, 1);
    /* A chain may cross lists. */
    poke_slice(g.base, r0, 1004, 10, 0, bm.lists[1].region, 3);
    poke_slice(g.base, bm.lists[1].region, 4076, 4076, 0, 0, 2);
    assert_int_equal(walk(&bm, r0, &n), 0);
    assert_int_equal(n, 2);
    guarded_free(&g);
}

static void chain_sizes_are_judged_by_the_list(void **state)
{
    (void)state;
    struct guarded g;
    struct shmipc__buffer bm;
    uint32_t n;
    small_new(&g, &bm);
    const uint32_t s = bm.lists[0].region;
    struct {
        uint32_t cap, size, start;
        int rc;
    } cases[] = {
        {1004, 1004, 0, 0},                   /* full */
        {1004, 1005, 0, SHMIPC_EPROTO},       /* size > cap */
        {1004, 1, 1004, SHMIPC_EPROTO},       /* start at the end */
        {1004, 2, UINT32_MAX, SHMIPC_EPROTO}, /* start + size wraps */
        {1004, UINT32_MAX, 1, SHMIPC_EPROTO}, /* size + start wraps */
        {UINT32_MAX, 5000, 0, SHMIPC_EPROTO}, /* the header's cap lies upward */
        {4, 1004, 0, 0},                      /* the header's cap lies downward */
        {1004, 0, 0, 0},                      /* empty */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        poke_slice(g.base, s, cases[i].cap, cases[i].size, cases[i].start, 0, 2);
        assert_int_equal(walk(&bm, s, &n), cases[i].rc);
        assert_int_equal(n, cases[i].rc == 0 ? 1 : 0);
    }
    guarded_free(&g);
}

static void walks_claim_their_slices(void **state)
{
    (void)state;
    struct guarded g;
    struct shmipc__buffer bm;
    struct shmipc__slice a, b;
    struct shmipc__slice_header h;
    uint32_t n;
    small_new(&g, &bm);
    assert_int_equal(shmipc__buffer_alloc(&bm, 1, &a), 0);
    assert_int_equal(shmipc__buffer_alloc(&bm, 1, &b), 0);
    assert_int_equal(shmipc__buffer_slice_set(&bm, &a, 0, 10), 0);
    assert_int_equal(shmipc__buffer_slice_set(&bm, &b, 2, 20), 0);
    assert_int_equal(shmipc__buffer_slice_link(&bm, &a, b.offset), 0);
    assert_int_equal(walk(&bm, a.offset, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(shmipc__buffer_slice_header(&bm, b.offset, &h), 0);
    assert_int_equal(h.size, SHMIPC__BM_CLAIMED);
    assert_int_equal(h.start, 2);
    /* A second walk, or a chain that reuses a claimed slice, is refused. */
    assert_int_equal(walk(&bm, a.offset, &n), SHMIPC_EPROTO);
    assert_int_equal(n, 0);
    assert_non_null(strstr(shmipc_error_detail(), "already taken"));
    /* Freeing resets the mark. */
    assert_int_equal(shmipc__buffer_free(&bm, a.offset), 0);
    assert_int_equal(shmipc__buffer_free(&bm, b.offset), 0);
    assert_int_equal(shmipc__buffer_slice_header(&bm, b.offset, &h), 0);
    assert_int_equal(h.size, 0);
    assert_int_equal(shmipc__buffer_all_returned(&bm), 1);
    guarded_free(&g);
}

static void cyclic_chains_end_with_an_error(void **state)
{
    (void)state;
    struct guarded g;
    struct shmipc__buffer bm;
    uint32_t n;
    small_new(&g, &bm);
    const uint32_t r0 = bm.lists[0].region, st = bm.lists[0].stride;
    const uint32_t a = r0, b = r0 + st, c = r0 + 2 * st, d = r0 + 3 * st;

    /* a -> a */
    poke_slice(g.base, a, 1004, 1, 0, a, 3);
    assert_int_equal(walk(&bm, a, &n), SHMIPC_EPROTO);
    assert_int_equal(n, 1);
    assert_non_null(strstr(shmipc_error_detail(), "cyclic"));
    /* a -> b -> a */
    poke_slice(g.base, a, 1004, 1, 0, b, 3);
    poke_slice(g.base, b, 1004, 1, 0, a, 3);
    assert_int_equal(walk(&bm, a, &n), SHMIPC_EPROTO);
    assert_int_equal(n, 2);
    /* a -> b -> c -> b: the cycle does not include the start. */
    poke_slice(g.base, a, 1004, 1, 0, b, 3);
    poke_slice(g.base, b, 1004, 1, 0, c, 3);
    poke_slice(g.base, c, 1004, 1, 0, b, 3);
    assert_int_equal(walk(&bm, a, &n), SHMIPC_EPROTO);
    assert_int_equal(n, 3);
    /* Two chains sharing a slice: d -> b after a -> b was taken. */
    poke_slice(g.base, a, 1004, 1, 0, b, 3);
    poke_slice(g.base, b, 1004, 1, 0, 0, 2);
    poke_slice(g.base, d, 1004, 1, 0, b, 3);
    assert_int_equal(walk(&bm, a, &n), 0);
    assert_int_equal(walk(&bm, d, &n), SHMIPC_EPROTO);
    assert_int_equal(n, 1);

    /* Every slice of the buffer in one ring: each is returned once, then the error. */
    uint32_t all[38], k = 0;
    for (uint32_t li = 0; li < bm.nlists; li++)
        for (uint32_t i = 0; i < bm.lists[li].cap; i++)
            all[k++] = bm.lists[li].region + i * bm.lists[li].stride;
    assert_int_equal(k, bm.total_slices);
    for (int from = 0; from < 2; from++) {
        for (uint32_t i = 0; i < k; i++)
            poke_slice(g.base, all[i], 0, 1, 0, all[(i + 1) % k], 3);
        assert_int_equal(walk(&bm, all[from * k / 2], &n), SHMIPC_EPROTO);
        assert_int_equal(n, k);
    }

    /* Freeing a cyclic chain stops at the repeat: each slice is freed once. */
    guarded_free(&g);
    small_new(&g, &bm);
    struct shmipc__slice x, y;
    assert_int_equal(shmipc__buffer_alloc(&bm, 1, &x), 0);
    assert_int_equal(shmipc__buffer_alloc(&bm, 1, &y), 0);
    assert_int_equal(shmipc__buffer_slice_link(&bm, &x, y.offset), 0);
    assert_int_equal(shmipc__buffer_slice_link(&bm, &y, x.offset), 0);
    assert_int_equal(shmipc__buffer_free_chain(&bm, x.offset, NULL), SHMIPC_EPROTO);
    assert_int_equal(shmipc__buffer_all_returned(&bm), 1);
    /* A broken chain has its sound prefix freed. */
    struct shmipc__slice z;
    assert_int_equal(shmipc__buffer_alloc(&bm, 1, &x), 0);
    assert_int_equal(shmipc__buffer_alloc(&bm, 1, &y), 0);
    assert_int_equal(shmipc__buffer_slice_link(&bm, &x, y.offset), 0);
    poke_slice(g.base, y.offset, 1004, 0, 0, y.offset + 4, 3);
    assert_int_equal(shmipc__buffer_free_chain(&bm, x.offset, NULL), SHMIPC_EPROTO);
    assert_non_null(strstr(shmipc_error_detail(), "not a slice"));
    assert_int_equal(shmipc__buffer_all_returned(&bm), 1);
    /* A caller that frees during the walk hides the claim marks; Brent still stops it. */
    assert_int_equal(shmipc__buffer_alloc(&bm, 1, &x), 0);
    assert_int_equal(shmipc__buffer_alloc(&bm, 1, &y), 0);
    assert_int_equal(shmipc__buffer_alloc(&bm, 1, &z), 0);
    assert_int_equal(shmipc__buffer_slice_link(&bm, &x, y.offset), 0);
    assert_int_equal(shmipc__buffer_slice_link(&bm, &y, z.offset), 0);
    assert_int_equal(shmipc__buffer_slice_link(&bm, &z, x.offset), 0);
    struct shmipc__chain ch;
    struct shmipc__chain_slice cs;
    int rc;
    n = 0;
    shmipc__chain_begin(&ch, &bm, x.offset);
    while ((rc = shmipc__chain_next(&ch, &cs)) == 1) {
        n++;
        shmipc__buffer_free(&bm, cs.offset);
    }
    assert_int_equal(rc, SHMIPC_EPROTO);
    assert_in_range(n, 3, 6);
    /* The double frees above broke this buffer's free list: start again. */
    guarded_free(&g);
    small_new(&g, &bm);
    /* A sound chain is freed whole. */
    assert_int_equal(shmipc__buffer_alloc(&bm, 1, &x), 0);
    assert_int_equal(shmipc__buffer_alloc(&bm, 2000, &y), 0);
    assert_int_equal(shmipc__buffer_slice_link(&bm, &x, y.offset), 0);
    assert_int_equal(shmipc__buffer_free_chain(&bm, x.offset, NULL), 2);
    assert_int_equal(shmipc__buffer_all_returned(&bm), 1);
    guarded_free(&g);
}

/*
 * The receiver's record of held slices: the walk refuses a slice whose bit is set even when
 * the peer erased the shared mark, numbers slices across lists, and free_chain clears the bits
 * of what it frees and never frees a held slice.
 */
static void held_slices_are_refused_with_the_mark_erased(void **state)
{
    (void)state;
    struct guarded g;
    struct shmipc__buffer bm;
    struct shmipc__slice x, y;
    struct shmipc__chain ch;
    struct shmipc__chain_slice cs;
    small_new(&g, &bm);
    uint64_t *held = shmipc__held_new(&bm);
    assert_non_null(held);
    assert_true(bm.nlists >= 2);
    assert_int_equal(bm.lists[1].first, bm.lists[0].cap);
    assert_int_equal(shmipc__buffer_alloc(&bm, 1, &x), 0);
    assert_int_equal(shmipc__buffer_alloc(&bm, 2000, &y), 0);
    assert_int_equal(x.list, 0);
    assert_int_equal(y.list, bm.nlists - 1);
    shmipc__chain_begin(&ch, &bm, x.offset);
    ch.held = held;
    assert_int_equal(shmipc__chain_next(&ch, &cs), 1);
    assert_int_equal(cs.index, (x.offset - bm.lists[0].region) / bm.lists[0].stride);
    assert_int_equal(shmipc__held_count(&bm, held), 1);
    /* The peer writes an ordinary size over our mark and sends x again, alone or linked. */
    assert_int_equal(shmipc__buffer_slice_set(&bm, &x, 0, 1), 0);
    shmipc__chain_begin(&ch, &bm, x.offset);
    ch.held = held;
    assert_int_equal(shmipc__chain_next(&ch, &cs), SHMIPC_EPROTO);
    assert_non_null(strstr(shmipc_error_detail(), "already holds"));
    assert_int_equal(shmipc__buffer_slice_link(&bm, &y, x.offset), 0);
    assert_int_equal(shmipc__buffer_free_chain(&bm, y.offset, held), SHMIPC_EPROTO);
    /* y was freed and forgotten; x, still ours, was neither freed nor forgotten. */
    assert_int_equal(shmipc__held_count(&bm, held), 1);
    assert_int_equal(shmipc__buffer_list_free(&bm, y.list), (int32_t)bm.lists[y.list].cap);
    assert_int_equal(shmipc__buffer_list_free(&bm, 0), (int32_t)bm.lists[0].cap - 1);
    /* Once we let x go, it may come again. */
    shmipc__held_drop(&bm, held, x.offset);
    shmipc__held_drop(&bm, held, 12345); /* not a slice: ignored */
    assert_int_equal(shmipc__held_count(&bm, held), 0);
    assert_int_equal(shmipc__buffer_slice_set(&bm, &x, 0, 1), 0);
    assert_int_equal(shmipc__buffer_free_chain(&bm, x.offset, held), 1);
    assert_int_equal(shmipc__buffer_all_returned(&bm), 1);
    free(held);
    guarded_free(&g);
}

/*
 * free_chain must free only what its own walk claimed. A hostile peer that rewrites a link
 * between the walk and the freeing (here: b's next flips between c and a, a slice we still
 * hold from an earlier message, its shared mark CLAIMED) used to have the freeing pass follow
 * it into a: our slice went to the free list and its held bit was cleared while a stream
 * still read it. The race is run many times; a bounded number of rounds.
 */
struct link_flipper {
    uint32_t *next;      /* b's next field in the buffer */
    uint32_t a, c;       /* the two targets */
    int phase;           /* 1: flip; 2: stop (atomics) */
    unsigned long flips; /* atomic */
};

static void *flip_link(void *arg)
{
    struct link_flipper *f = arg;
    for (unsigned long i = 0; __atomic_load_n(&f->phase, __ATOMIC_ACQUIRE) == 1; i++) {
        __atomic_store_n(f->next, (i & 1) ? f->a : f->c, __ATOMIC_RELAXED);
        __atomic_add_fetch(&f->flips, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

static void free_chain_frees_only_what_its_walk_claimed(void **state)
{
    (void)state;
    unsigned bad = 0, rounds = 0;
    uint64_t t0 = (uint64_t)time(NULL);
    for (; rounds < 4000 && bad == 0 && (uint64_t)time(NULL) - t0 < 20; rounds++) {
        struct guarded g;
        struct shmipc__buffer bm;
        struct shmipc__slice a, b, c;
        struct shmipc__chain ch;
        struct shmipc__chain_slice cs;
        struct link_flipper f;
        pthread_t t;
        small_new(&g, &bm);
        uint64_t *held = shmipc__held_new(&bm);
        assert_non_null(held);
        /* a: received earlier and still held (claimed, its bit set). */
        assert_int_equal(shmipc__buffer_alloc(&bm, 1, &a), 0);
        shmipc__chain_begin(&ch, &bm, a.offset);
        ch.held = held;
        assert_int_equal(shmipc__chain_next(&ch, &cs), 1);
        /* b -> c: a message for a stream nobody reads, freed whole. */
        assert_int_equal(shmipc__buffer_alloc(&bm, 1, &b), 0);
        assert_int_equal(shmipc__buffer_alloc(&bm, 1, &c), 0);
        assert_int_equal(shmipc__buffer_slice_link(&bm, &b, c.offset), 0);
        f = (struct link_flipper){(uint32_t *)(void *)(bm.base + b.offset + 12), a.offset, c.offset,
                                  1, 0};
        assert_int_equal(pthread_create(&t, NULL, flip_link, &f), 0);
        while (__atomic_load_n(&f.flips, __ATOMIC_ACQUIRE) < 2)
            sched_yield();
        (void)shmipc__buffer_free_chain(&bm, b.offset, held);
        __atomic_store_n(&f.phase, 2, __ATOMIC_RELEASE);
        assert_int_equal(pthread_join(t, NULL), 0);
        /* a is ours whatever the peer did: still marked held, never on a free list. */
        if (shmipc__held_count(&bm, held) != 1 ||
            __atomic_load_n((uint32_t *)(void *)(bm.base + a.offset + 4), __ATOMIC_RELAXED) !=
                SHMIPC__BM_CLAIMED)
            bad++;
        free(held);
        guarded_free(&g);
    }
    if (bad != 0)
        fail_msg("round %u: free_chain freed slice a, held from an earlier message, after the "
                 "peer relinked the chain to it",
                 rounds);
}

/* ------------------------------------------------------------------------------------ */
/* Concurrency                                                                          */
/* ------------------------------------------------------------------------------------ */

#define HANDOFF_ROUNDS 200000
#define RING           64

/* A process-local ring carrying offsets from the allocating thread to the freeing one. */
struct handoff {
    struct shmipc__buffer *bm;
    uint32_t ring[RING];
    uint64_t head, tail; /* atomics */
    uint8_t held[64];    /* slices currently out, indexed by slice number in list 0 */
    int failures;
};

static void *free_side(void *arg)
{
    struct handoff *h = arg;
    for (uint64_t done = 0; done < HANDOFF_ROUNDS;) {
        uint64_t tail = __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE);
        if (h->head == tail) {
            sched_yield();
            continue;
        }
        uint32_t off = h->ring[h->head % RING];
        __atomic_store_n(&h->head, h->head + 1, __ATOMIC_RELEASE);
        uint32_t idx = (off - h->bm->lists[0].region) / h->bm->lists[0].stride;
        if (!__atomic_exchange_n(&h->held[idx], 0, __ATOMIC_ACQ_REL))
            h->failures++;
        if (shmipc__buffer_free(h->bm, off) != 0)
            h->failures++;
        done++;
    }
    return NULL;
}

static void one_allocator_one_freer_across_threads(void **state)
{
    (void)state;
    struct guarded g;
    struct shmipc__buffer bm;
    static const shmipc_slice_class one[] = {{1004, 100}};
    struct handoff *h = calloc(1, sizeof *h);
    pthread_t t;
    assert_non_null(h);
    guarded_new(&g, 32768);
    assert_int_equal(shmipc__buffer_format(&bm, g.base, g.size, one, 1), 0);
    const int32_t start = shmipc__buffer_list_free(&bm, 0);
    assert_in_range(bm.lists[0].cap, 8, 64);
    h->bm = &bm;
    assert_int_equal(pthread_create(&t, NULL, free_side, h), 0);
    for (uint64_t n = 0; n < HANDOFF_ROUNDS;) {
        struct shmipc__slice s;
        if (__atomic_load_n(&h->head, __ATOMIC_ACQUIRE) + RING == h->tail) {
            sched_yield();
            continue;
        }
        int rc = shmipc__buffer_alloc(&bm, 1, &s);
        if (rc == SHMIPC_ENOSHM) {
            sched_yield();
            continue;
        }
        assert_int_equal(rc, 0);
        /* No slice may be handed out twice. */
        uint32_t idx = (s.offset - bm.lists[0].region) / bm.lists[0].stride;
        assert_int_equal(__atomic_exchange_n(&h->held[idx], 1, __ATOMIC_ACQ_REL), 0);
        h->ring[h->tail % RING] = s.offset;
        __atomic_store_n(&h->tail, h->tail + 1, __ATOMIC_RELEASE);
        n++;
    }
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(h->failures, 0);
    assert_int_equal(shmipc__buffer_list_free(&bm, 0), start);
    assert_int_equal(geti32(g.base, bm.lists[0].offset + 20), 0);
    free(h);
    guarded_free(&g);
}

#define FORK_ROUNDS 50000

/*
 * Two processes over one shared mapping, as in a session: the child maps the buffer (its
 * counter is +24) and allocs; the parent, which formatted it, frees what the child sends it.
 */
static void child_allocs_parent_frees(void **state)
{
    (void)state;
    struct guarded g;
    struct shmipc__buffer bm;
    static const shmipc_slice_class one[] = {{1004, 100}};
    int fds[2];
    guarded_new(&g, 32768);
    assert_int_equal(shmipc__buffer_format(&bm, g.base, g.size, one, 1), 0);
    const int32_t start = shmipc__buffer_list_free(&bm, 0);
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct shmipc__buffer peer;
        close(fds[0]);
        if (shmipc__buffer_attach(&peer, g.base, g.size) != 0)
            _exit(2);
        for (int n = 0; n < FORK_ROUNDS;) {
            struct shmipc__slice s;
            int rc = shmipc__buffer_alloc(&peer, 1, &s);
            if (rc == SHMIPC_ENOSHM) {
                sched_yield();
                continue;
            }
            if (rc != 0 || write(fds[1], &s.offset, sizeof s.offset) != sizeof s.offset)
                _exit(3);
            n++;
        }
        close(fds[1]);
        _exit(0);
    }
    close(fds[1]);
    uint32_t off;
    int freed = 0;
    while (read(fds[0], &off, sizeof off) == sizeof off) {
        assert_int_equal(shmipc__buffer_free(&bm, off), 0);
        freed++;
    }
    close(fds[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(freed, FORK_ROUNDS);
    assert_int_equal(shmipc__buffer_list_free(&bm, 0), start);
    /* Each side counted its own operations in its own slot. */
    assert_int_equal(geti32(g.base, bm.lists[0].offset + 24), FORK_ROUNDS);
    assert_int_equal(geti32(g.base, bm.lists[0].offset + 20), -FORK_ROUNDS);
    assert_int_equal(get32(g.base, bm.lists[0].offset + 4), bm.lists[0].cap);
    guarded_free(&g);
}

int main(void)
{
    struct CMUnitTest tests[32];
    size_t n = 0;
    for (size_t i = 0; i < SHMV_NLAYOUTS; i++)
        tests[n++] = (struct CMUnitTest){.name = shmv_layouts[i].name,
                                         .test_func = layout_matches_go,
                                         .initial_state = (void *)(uintptr_t)&shmv_layouts[i]};
    for (size_t i = 0; i < SHMV_NEXCHANGES; i++)
        tests[n++] = (struct CMUnitTest){.name = shmv_exchanges[i].name,
                                         .test_func = exchange_echo,
                                         .initial_state = (void *)(uintptr_t)&shmv_exchanges[i]};
    const struct CMUnitTest fixed[] = {
        cmocka_unit_test(exchange_streamclose_queue_full),
        cmocka_unit_test(single_slice_list_never_hands_out),
        cmocka_unit_test(format_refuses_bad_classes),
        cmocka_unit_test(alloc_picks_smallest_fitting_list),
        cmocka_unit_test(alloc_keeps_last_slice_and_spills_to_larger_lists),
        cmocka_unit_test(alloc_many_is_greedy_from_the_largest_list),
        cmocka_unit_test(slice_set_and_link_check_their_arguments),
        cmocka_unit_test(attach_refuses_corrupt_layouts),
        cmocka_unit_test(corrupt_free_list_head_is_refused),
        cmocka_unit_test(corrupt_free_list_tail_is_refused),
        cmocka_unit_test(free_refuses_offsets_that_are_not_slices),
        cmocka_unit_test(chain_offsets_must_be_slices),
        cmocka_unit_test(chain_sizes_are_judged_by_the_list),
        cmocka_unit_test(walks_claim_their_slices),
        cmocka_unit_test(cyclic_chains_end_with_an_error),
        cmocka_unit_test(held_slices_are_refused_with_the_mark_erased),
        cmocka_unit_test(free_chain_frees_only_what_its_walk_claimed),
        cmocka_unit_test(one_allocator_one_freer_across_threads),
        cmocka_unit_test(child_allocs_parent_frees),
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        tests[n++] = fixed[i];
    return _cmocka_run_group_tests("buffer", tests, n, NULL, NULL);
}
