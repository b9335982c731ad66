/*
 * Description: shmipc_stream_forward, received bytes sent on without a copy: an echo, a header
 * read first, a proxy between two streams of a session, the copying cases (part of a slice,
 * fallback data, another session) and the failures that move nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc_helpers.h"
#include "shmipc.h"
#include "ipc/session.h"

/* Larger than the default largest slice (128 KiB - 20), so a message spans slices. */
#define BIG (300u * 1024u)

static shmipc_config *config_new(void)
{
    shmipc_config *cfg;
    assert_int_equal(shmipc_config_new(&cfg), 0);
    assert_int_equal(shmipc_config_set_buffer_capacity(cfg, 8u << 20), 0);
    assert_int_equal(shmipc_config_set_memmap_type(cfg, SHMIPC_MEMMAP_MEMFD), 0);
    assert_int_equal(shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_READ, 10000), 0);
    return cfg;
}

struct fixture {
    shmipc_config *cfg;
    struct ipc_pair p;
};

static int pair_setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    char address[128];
    assert_non_null(f);
    f->cfg = config_new();
    ipc_pick_address(address, sizeof address, "forward");
    ipc_pair_open(&f->p, address, f->cfg, f->cfg);
    *state = f;
    return 0;
}

static int pair_teardown(void **state)
{
    struct fixture *f = *state;
    ipc_pair_close(&f->p);
    shmipc_config_free(f->cfg);
    free(f);
    return 0;
}

/* Every slice is back in the shared lists once both sides trimmed their caches. */
static void assert_all_returned(struct ipc_pair *p)
{
    shmipc__session_trim(p->client);
    shmipc__session_trim(p->server);
    assert_int_equal(shmipc__buffer_all_returned(&p->client->bm), 1);
}

static void fill(uint8_t *buf, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = (uint8_t)(i * 31u + seed);
}

/* Offsets of a stream's unsent segments and received chunks in the buffer, for comparisons. */
static ptrdiff_t seg_at(const shmipc_session *s, const shmipc_stream *st, uint32_t i)
{
    return st->segs[i].data - s->bm.base;
}

/* Reads exactly `n` bytes from `st`, compares them with `want` and releases them. */
static void expect_bytes(shmipc_stream *st, const uint8_t *want, size_t n)
{
    const void *p;
    assert_int_equal(shmipc_stream_read_exact_bytes(st, n, &p, 0), 0);
    assert_memory_equal(p, want, n);
    assert_int_equal(shmipc_stream_release(st), 0);
}

/* Opens a client stream, sends `len` bytes of `msg`, and accepts the stream on the server. */
static void open_and_send(struct ipc_pair *p, shmipc_stream **cs, shmipc_stream **ss,
                          const uint8_t *msg, size_t len)
{
    assert_int_equal(shmipc_session_open_stream(p->client, cs), 0);
    assert_int_equal(shmipc_stream_write(*cs, msg, len), 0);
    assert_int_equal(shmipc_stream_flush(*cs), 0);
    assert_int_equal(shmipc_session_accept_stream(p->server, IPC_WAIT_MS, ss), 0);
}

/* The server echoes a message without reading it: its slices go back as they are. */
static void echo_moves_slices(void **state)
{
    struct fixture *f = *state;
    struct ipc_pair *p = &f->p;
    shmipc_stream *cs, *ss;
    void *w;
    const void *r;
    size_t n;
    uint8_t msg[5000];
    fill(msg, sizeof msg, 1);
    assert_int_equal(shmipc_session_open_stream(p->client, &cs), 0);
    assert_int_equal(shmipc_stream_reserve(cs, sizeof msg, &w), 0);
    ptrdiff_t written_at = (uint8_t *)w - p->client->bm.base;
    memcpy(w, msg, sizeof msg);
    assert_int_equal(shmipc_stream_commit(cs, sizeof msg), 0);
    assert_int_equal(shmipc_stream_flush(cs), 0);
    assert_int_equal(shmipc_session_accept_stream(p->server, IPC_WAIT_MS, &ss), 0);

    assert_int_equal(shmipc_stream_forward(ss, ss, sizeof msg, 0), 0);
    assert_int_equal(shmipc_stream_available(ss), 0);
    assert_int_equal(ss->nsegs, 1);
    assert_int_equal(seg_at(p->server, ss, 0), written_at);
    assert_int_equal(shmipc_stream_flush(ss), 0);

    /* The client reads its own bytes where it wrote them. */
    assert_int_equal(shmipc_stream_read_chunk(cs, 0, &r, &n, 0), 0);
    assert_int_equal(n, sizeof msg);
    assert_int_equal((const uint8_t *)r - p->client->bm.base, written_at);
    assert_memory_equal(r, msg, sizeof msg);
    assert_int_equal(shmipc_stream_release(cs), 0);
    shmipc_stream_close(cs);
    shmipc_stream_close(ss);
    assert_all_returned(p);
}

/* A message over several slices moves slice by slice, in order, and arrives whole. */
static void echo_of_a_chain(void **state)
{
    struct fixture *f = *state;
    struct ipc_pair *p = &f->p;
    shmipc_stream *cs, *ss;
    uint8_t *msg = malloc(BIG);
    assert_non_null(msg);
    fill(msg, BIG, 2);
    open_and_send(p, &cs, &ss, msg, BIG);
    assert_int_equal(shmipc_stream_forward(ss, ss, BIG, 0), 0);
    assert_true(ss->nsegs >= 3);
    for (uint32_t i = 0; i < ss->nsegs; i++)
        assert_true(ss->segs[i].slice != SHMIPC__HEAP_CHUNK);
    assert_int_equal(ss->send_len, BIG);
    assert_int_equal(shmipc_stream_flush(ss), 0);
    expect_bytes(cs, msg, BIG);
    /* Twice more, so slices that went round once go round again. */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(shmipc_stream_write(cs, msg, BIG), 0);
        assert_int_equal(shmipc_stream_flush(cs), 0);
        assert_int_equal(shmipc_stream_forward(ss, ss, BIG, 0), 0);
        assert_int_equal(shmipc_stream_flush(ss), 0);
        expect_bytes(cs, msg, BIG);
    }
    shmipc_stream_close(cs);
    shmipc_stream_close(ss);
    free(msg);
    assert_all_returned(p);
}

/*
 * Bytes read and not released go first: a server that read the length moves the whole
 * message; after a release, only what follows moves, from the middle of its slice.
 */
static void read_bytes_go_first(void **state)
{
    struct fixture *f = *state;
    struct ipc_pair *p = &f->p;
    shmipc_stream *cs, *ss;
    const void *r;
    uint8_t msg[1000];
    fill(msg, sizeof msg, 3);
    open_and_send(p, &cs, &ss, msg, sizeof msg);
    assert_int_equal(shmipc_stream_read_exact_bytes(ss, 4, &r, 0), 0);
    ptrdiff_t at = (const uint8_t *)r - p->server->bm.base;
    assert_int_equal(shmipc_stream_forward(ss, ss, sizeof msg - 4, 0), 0);
    assert_int_equal(ss->nsegs, 1);
    assert_int_equal(seg_at(p->server, ss, 0), at);
    assert_int_equal(shmipc_stream_flush(ss), 0);
    expect_bytes(cs, msg, sizeof msg);

    /* Released first: the rest of the slice moves, starting 4 bytes in (the slice's start). */
    assert_int_equal(shmipc_stream_write(cs, msg, sizeof msg), 0);
    assert_int_equal(shmipc_stream_flush(cs), 0);
    assert_int_equal(shmipc_stream_read_exact_bytes(ss, 4, &r, 0), 0);
    at = (const uint8_t *)r - p->server->bm.base;
    assert_int_equal(shmipc_stream_release(ss), 0);
    assert_int_equal(shmipc_stream_forward(ss, ss, sizeof msg - 4, 0), 0);
    assert_int_equal(ss->nsegs, 1);
    assert_int_equal(seg_at(p->server, ss, 0), at + 4);
    assert_int_equal(shmipc_stream_flush(ss), 0);
    assert_int_equal(shmipc_stream_read_exact_bytes(cs, sizeof msg - 4, &r, 0), 0);
    assert_int_equal((const uint8_t *)r - p->client->bm.base, at + 4);
    assert_memory_equal(r, msg + 4, sizeof msg - 4);
    assert_int_equal(shmipc_stream_release(cs), 0);

    /* n = 0 moves only what was read: here part of a slice, which is copied. */
    assert_int_equal(shmipc_stream_write(cs, "abcdefghij", 10), 0);
    assert_int_equal(shmipc_stream_flush(cs), 0);
    size_t n;
    assert_int_equal(shmipc_stream_read_chunk(ss, 3, &r, &n, 0), 0);
    assert_int_equal(n, 3);
    assert_int_equal(shmipc_stream_forward(ss, ss, 0, 0), 0);
    assert_int_equal(shmipc_stream_available(ss), 7);
    assert_int_equal(ss->send_len, 3);
    assert_int_equal(shmipc_stream_flush(ss), 0);
    expect_bytes(cs, (const uint8_t *)"abc", 3);
    /* What was not read is still there, and forward(0) with nothing read sends nothing. */
    assert_int_equal(shmipc_stream_forward(ss, ss, 0, 0), 0);
    assert_int_equal(ss->send_len, 0);
    expect_bytes(ss, (const uint8_t *)"defghij", 7);
    shmipc_stream_close(cs);
    shmipc_stream_close(ss);
    assert_all_returned(p);
}

/* Fewer bytes than a slice holds: they are copied; the slice stays with the rest. */
static void part_of_a_slice_is_copied(void **state)
{
    struct fixture *f = *state;
    struct ipc_pair *p = &f->p;
    shmipc_stream *cs, *ss;
    const void *r;
    open_and_send(p, &cs, &ss, (const uint8_t *)"0123456789", 10);
    assert_int_equal(shmipc_stream_forward(ss, ss, 4, 0), 0);
    assert_int_equal(shmipc_stream_available(ss), 6);
    assert_int_equal(ss->send_len, 4);
    assert_int_equal(shmipc_stream_write(ss, "+", 1), 0); /* writes go after the bytes moved */
    assert_int_equal(shmipc_stream_flush(ss), 0);
    expect_bytes(cs, (const uint8_t *)"0123+", 5);
    /* The rest reads as before, from where it was received. */
    assert_int_equal(shmipc_stream_read_exact_bytes(ss, 6, &r, 0), 0);
    assert_memory_equal(r, "456789", 6);
    /* Then it moves whole: the slice it lies in goes on, starting 4 bytes in. */
    assert_int_equal(shmipc_stream_forward(ss, ss, 0, 0), 0);
    assert_int_equal(ss->nsegs, 1);
    assert_int_equal(seg_at(p->server, ss, 0), (const uint8_t *)r - p->server->bm.base);
    assert_int_equal(shmipc_stream_flush(ss), 0);
    expect_bytes(cs, (const uint8_t *)"456789", 6);
    shmipc_stream_close(cs);
    shmipc_stream_close(ss);
    assert_all_returned(p);
}

/* A proxy: bytes from one stream of a session go out on another, without a copy. */
static void between_streams_of_a_session(void **state)
{
    struct fixture *f = *state;
    struct ipc_pair *p = &f->p;
    shmipc_stream *ca, *sa, *cb, *sb;
    uint8_t msg[20000];
    fill(msg, sizeof msg, 4);
    open_and_send(p, &ca, &sa, msg, sizeof msg);
    open_and_send(p, &cb, &sb, (const uint8_t *)"b", 1);
    expect_bytes(sb, (const uint8_t *)"b", 1);
    assert_int_equal(shmipc_stream_forward(sb, sa, sizeof msg, 0), 0);
    assert_int_equal(shmipc_stream_available(sa), 0);
    assert_true(sb->nsegs >= 1 && sb->segs[0].slice != SHMIPC__HEAP_CHUNK);
    assert_int_equal(shmipc_stream_flush(sb), 0);
    expect_bytes(cb, msg, sizeof msg);
    assert_int_equal(shmipc_stream_available(ca), 0);
    shmipc_stream_close(ca);
    shmipc_stream_close(sa);
    shmipc_stream_close(cb);
    shmipc_stream_close(sb);
    assert_all_returned(p);
}

/* To a stream of another session the bytes are copied; both buffers get every slice back. */
static void to_another_session_copies(void **state)
{
    struct fixture *f = *state;
    struct ipc_pair *p = &f->p, q;
    shmipc_stream *cs, *ss, *cq, *sq;
    char address[128];
    uint8_t *msg = malloc(BIG);
    assert_non_null(msg);
    fill(msg, BIG, 5);
    ipc_pick_address(address, sizeof address, "forward-other");
    ipc_pair_open(&q, address, f->cfg, f->cfg);
    open_and_send(&q, &cq, &sq, (const uint8_t *)"q", 1);
    expect_bytes(sq, (const uint8_t *)"q", 1);
    open_and_send(p, &cs, &ss, msg, BIG);
    assert_int_equal(shmipc_stream_forward(sq, ss, BIG, 0), 0);
    for (uint32_t i = 0; i < sq->nsegs; i++) {
        ptrdiff_t at = seg_at(q.server, sq, i);
        assert_true(at >= 0 && (size_t)at < q.server->bm.size);
    }
    assert_int_equal(shmipc_stream_flush(sq), 0);
    expect_bytes(cq, msg, BIG);
    shmipc_stream_close(cs);
    shmipc_stream_close(ss);
    shmipc_stream_close(cq);
    shmipc_stream_close(sq);
    assert_all_returned(p);
    assert_all_returned(&q);
    ipc_pair_close(&q);
    free(msg);
}

/* Data that came over the socket (fallback) is copied, and goes back the same way. */
static void fallback_data_is_copied(void **state)
{
    (void)state;
    shmipc_config *cfg = config_new();
    struct ipc_pair p;
    char address[128];
    shmipc_stream *cs, *ss;
    /* One 524268-byte slice, which is never handed out: everything falls back. */
    assert_int_equal(shmipc_config_set_buffer_capacity(cfg, 1u << 20), 0);
    assert_int_equal(shmipc_config_parse_slice_classes(cfg, "524268:100"), 0);
    ipc_pick_address(address, sizeof address, "forward-fallback");
    ipc_pair_open(&p, address, cfg, cfg);
    open_and_send(&p, &cs, &ss, (const uint8_t *)"over the socket", 15);
    assert_int_equal(shmipc_stream_forward(ss, ss, 15, 0), 0);
    assert_int_equal(ss->nsegs, 1);
    assert_int_equal(ss->segs[0].slice, SHMIPC__HEAP_CHUNK);
    assert_int_equal(shmipc_stream_flush(ss), 0);
    expect_bytes(cs, (const uint8_t *)"over the socket", 15);
    assert_int_equal(p.server->fallback_held, 0);
    /* Part of a heap copy: forwarded in part, then read in part and released, then the rest. */
    const void *r;
    size_t n;
    assert_int_equal(shmipc_stream_write(cs, "0123456789", 10), 0);
    assert_int_equal(shmipc_stream_flush(cs), 0);
    assert_int_equal(shmipc_stream_forward(ss, ss, 4, 0), 0);
    assert_int_equal(shmipc_stream_read_chunk(ss, 3, &r, &n, 0), 0);
    assert_memory_equal(r, "456", 3);
    assert_int_equal(shmipc_stream_release(ss), 0);
    assert_int_equal(p.server->fallback_held, 3 + SHMIPC__FALLBACK_CHUNK_COST);
    expect_bytes(ss, (const uint8_t *)"789", 3);
    assert_int_equal(p.server->fallback_held, 0);
    assert_int_equal(shmipc_stream_flush(ss), 0);
    expect_bytes(cs, (const uint8_t *)"0123", 4);
    shmipc_stream_close(cs);
    shmipc_stream_close(ss);
    ipc_pair_close(&p);
    shmipc_config_free(cfg);
}

/* Too few bytes: nothing moves, whether it would wait, times out or the stream ended. */
static void failures_move_nothing(void **state)
{
    struct fixture *f = *state;
    struct ipc_pair *p = &f->p;
    shmipc_stream *cs, *ss;
    open_and_send(p, &cs, &ss, (const uint8_t *)"12345", 5);
    assert_int_equal(shmipc_stream_forward(ss, ss, 6, SHMIPC_NONBLOCK), SHMIPC_EAGAIN);
    assert_int_equal(shmipc_stream_set_timeout(ss, SHMIPC_TIMEOUT_READ, 50), 0);
    assert_int_equal(shmipc_stream_forward(ss, ss, 6, 0), SHMIPC_ETIMEDOUT);
    assert_int_equal(shmipc_stream_available(ss), 5);
    assert_int_equal(ss->send_len, 0);
    shmipc_stream_close(cs);
    assert_int_equal(shmipc_stream_forward(ss, ss, 6, 0), SHMIPC_EEOF);
    assert_int_equal(shmipc_stream_available(ss), 5);
    /* The bytes that are there still move; the flush then finds the peer gone. */
    assert_int_equal(shmipc_stream_forward(ss, ss, 5, 0), 0);
    assert_int_equal(shmipc_stream_flush(ss), SHMIPC_EEOF);
    shmipc_stream_close(ss);
    assert_all_returned(p);
}

/* When the session has ended, nothing moves and the delivered bytes stay readable. */
static void ended_session_refuses(void **state)
{
    struct fixture *f = *state;
    struct ipc_pair *p = &f->p;
    shmipc_stream *cs, *ss;
    const void *r;
    open_and_send(p, &cs, &ss, (const uint8_t *)"kept", 4);
    shmipc_session_close(p->client); /* a hard close: the server sees the socket end */
    p->client = NULL;
    assert_int_equal(shmipc_stream_read_exact_bytes(ss, 5, &r, 0), SHMIPC_ECONNRESET);
    assert_int_equal(shmipc_stream_forward(ss, ss, 4, 0), SHMIPC_ECONNRESET);
    assert_int_equal(shmipc_stream_available(ss), 4);
    assert_int_equal(ss->send_len, 0);
    assert_int_equal(shmipc_stream_read_exact_bytes(ss, 4, &r, 0), 0);
    assert_memory_equal(r, "kept", 4);
    shmipc_stream_close(cs);
    shmipc_stream_close(ss);
}

/*
 * Random sequences against a model: the client sends messages (several per flush, up to
 * 300 KB), the server reads pieces (read_chunk with a limit, read_exact_bytes), releases,
 * and forwards what it read plus a random count to its own stream or to a second stream,
 * with writes before and after. After every step the server's unread count matches the
 * model, every echo matches byte for byte, and at the end every slice is back. `classes`
 * NULL: the default slice classes; "524268:100": every message falls back to the socket,
 * so heap copies are read, trimmed and forwarded instead.
 */
#define RANDOM_MSG_MAX 300000u

struct model {
    uint8_t *unread; /* bytes sent to the server and not consumed, from `head` */
    size_t head, tail;
    uint8_t *held; /* read and not released */
    size_t nheld;
    uint8_t *out; /* what a forward should send */
    unsigned rng;
    size_t max_msg; /* largest message; over the socket a step's messages must fit its buffer */
};

static unsigned rnd(struct model *m, unsigned n)
{
    m->rng = m->rng * 1103515245u + 12345u;
    return (m->rng >> 8) % n;
}

static void model_send(struct model *m, struct ipc_pair *p, shmipc_stream *cs, shmipc_stream *ss)
{
    static uint8_t msg[RANDOM_MSG_MAX];
    for (int k = 1 + (int)rnd(m, 3); k > 0; k--) {
        size_t len = rnd(m, 4) == 0 ? 1 + rnd(m, (unsigned)m->max_msg) : 1 + rnd(m, 2000);
        for (size_t i = 0; i < len; i++)
            msg[i] = (uint8_t)rnd(m, 256);
        assert_int_equal(shmipc_stream_write(cs, msg, len), 0);
        if (rnd(m, 2))
            assert_int_equal(shmipc_stream_flush(cs), 0);
        memcpy(m->unread + m->tail, msg, len);
        m->tail += len;
    }
    assert_int_equal(shmipc_stream_flush(cs), 0);
    /* Wait until the server has it all (the model counts what it will read). */
    for (int i = 0; i < 100000 && shmipc_stream_available(ss) < m->tail - m->head; i++)
        shmipc_session_process(p->server);
}

static void model_read(struct model *m, shmipc_stream *ss, int exact)
{
    size_t avail = m->tail - m->head, n, max = rnd(m, 2) ? 0 : 1 + rnd(m, 3000);
    const void *r;
    if (exact) {
        n = rnd(m, 5) == 0 ? avail : 1 + rnd(m, avail < 5000 ? (unsigned)avail : 5000);
        assert_int_equal(shmipc_stream_read_exact_bytes(ss, n, &r, 0), 0);
    } else {
        assert_int_equal(shmipc_stream_read_chunk(ss, max, &r, &n, 0), 0);
        assert_true(n > 0 && n <= avail && (max == 0 || n <= max));
    }
    assert_memory_equal(r, m->unread + m->head, n);
    memcpy(m->held + m->nheld, r, n);
    m->nheld += n;
    m->head += n;
}

static void model_forward(struct model *m, shmipc_stream *ss, shmipc_stream *dst,
                          shmipc_stream *peer)
{
    size_t avail = m->tail - m->head, len = 0;
    size_t n = rnd(m, 3) == 0 ? 0 : rnd(m, 3) == 0 ? avail : rnd(m, (unsigned)avail + 1);
    if (rnd(m, 3) == 0) {
        assert_int_equal(shmipc_stream_write(dst, "pre", 3), 0);
        memcpy(m->out, "pre", 3);
        len = 3;
    }
    assert_int_equal(shmipc_stream_forward(dst, ss, n, 0), 0);
    memcpy(m->out + len, m->held, m->nheld);
    len += m->nheld;
    memcpy(m->out + len, m->unread + m->head, n);
    len += n;
    m->head += n;
    m->nheld = 0;
    if (rnd(m, 3) == 0) {
        assert_int_equal(shmipc_stream_write(dst, "post", 4), 0);
        memcpy(m->out + len, "post", 4);
        len += 4;
    }
    assert_int_equal(dst->send_len, len);
    if (len > 0) {
        assert_int_equal(shmipc_stream_flush(dst), 0);
        expect_bytes(peer, m->out, len);
    }
}

static void random_sequence(const char *classes, unsigned seed, int steps)
{
    shmipc_config *cfg = config_new();
    struct ipc_pair p;
    char address[128];
    shmipc_stream *cs, *ss, *cb, *sb;
    struct model m = {.rng = seed, .max_msg = classes == NULL ? RANDOM_MSG_MAX : 20000};
    /* At most 3 messages of under 300000 bytes per step, all kept by the model. */
    size_t cap = (size_t)steps * 900000u + 8;
    m.unread = malloc(cap);
    m.held = malloc(cap);
    m.out = malloc(cap);
    assert_true(m.unread && m.held && m.out);
    if (classes != NULL) {
        assert_int_equal(shmipc_config_set_buffer_capacity(cfg, 1u << 20), 0);
        assert_int_equal(shmipc_config_parse_slice_classes(cfg, classes), 0);
    }
    ipc_pick_address(address, sizeof address, "forward-random");
    ipc_pair_open(&p, address, cfg, cfg);
    /* Both opened first: once a message falls back, the session refuses new streams. */
    assert_int_equal(shmipc_session_open_stream(p.client, &cs), 0);
    assert_int_equal(shmipc_session_open_stream(p.client, &cb), 0);
    ipc_send_text(cs, "a");
    ipc_send_text(cb, "b");
    assert_int_equal(shmipc_session_accept_stream(p.server, IPC_WAIT_MS, &ss), 0);
    assert_int_equal(shmipc_session_accept_stream(p.server, IPC_WAIT_MS, &sb), 0);
    expect_bytes(ss, (const uint8_t *)"a", 1);
    expect_bytes(sb, (const uint8_t *)"b", 1);
    for (int step = 0; step < steps; step++) {
        assert_int_equal(shmipc_stream_available(ss), m.tail - m.head);
        unsigned op = m.tail == m.head ? 0 : rnd(&m, 10);
        if (op == 0)
            model_send(&m, &p, cs, ss);
        else if (op <= 4)
            model_read(&m, ss, op > 2);
        else if (op == 5) {
            assert_int_equal(shmipc_stream_release(ss), 0);
            m.nheld = 0;
        } else if (rnd(&m, 2))
            model_forward(&m, ss, ss, cs);
        else
            model_forward(&m, ss, sb, cb);
    }
    assert_int_equal(shmipc_stream_release(ss), 0);
    shmipc_stream_close(cs);
    shmipc_stream_close(ss);
    shmipc_stream_close(cb);
    shmipc_stream_close(sb);
    assert_int_equal(p.server->fallback_held, 0);
    assert_all_returned(&p);
    ipc_pair_close(&p);
    shmipc_config_free(cfg);
    free(m.unread);
    free(m.held);
    free(m.out);
}

static void random_sequences_match_the_model(void **state)
{
    (void)state;
    for (unsigned seed = 1; seed <= 6; seed++)
        random_sequence(NULL, seed, 150);
}

static void random_sequences_over_the_socket(void **state)
{
    (void)state;
    for (unsigned seed = 1; seed <= 3; seed++)
        random_sequence("524268:100", seed, 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(echo_moves_slices, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(echo_of_a_chain, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(read_bytes_go_first, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(part_of_a_slice_is_copied, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(between_streams_of_a_session, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(to_another_session_copies, pair_setup, pair_teardown),
        cmocka_unit_test(fallback_data_is_copied),
        cmocka_unit_test_setup_teardown(failures_move_nothing, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(ended_session_refuses, pair_setup, pair_teardown),
        cmocka_unit_test(random_sequences_match_the_model),
        cmocka_unit_test(random_sequences_over_the_socket),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
