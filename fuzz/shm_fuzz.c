/*
 * Fuzz target: the shared IO queue and the buffer manager's slice lists and chain walker
 * (core/shm/queue.c, core/shm/buffer.c) over shared memory that a hostile peer controls.
 *
 * Input: byte 0 is the mode. Bit 0 clear: the buffer and the queue pair are laid out
 * properly (as a client formats them) and the peer's hostility comes from the operations;
 * set: bytes 1-2 and 3-4 give the sizes of a buffer and a queue mapping whose every byte
 * follows from the input. Bit 1 picks the V4 queue layout, bit 2 the server's half. Bit 3
 * makes this process keep what it receives, as a session does: chains are walked with the
 * receiver's record of held slices (shmipc__held_new) and their slices kept until released,
 * and a walk may start at a slice we keep (a peer announcing it again, maybe after erasing
 * the walker's mark in shared memory). Oracle: no walk ever hands us a slice we keep. The rest
 * is a list of operations: the peer writing any 32-bit value anywhere in either mapping (or
 * allocating and sending chains by the rules), interleaved with what this process does (allocate, free, link, send, receive and walk the
 * chains it receives, free them). Mappings are heap blocks of the exact size, so any access
 * outside them is caught. The oracles, beyond the sanitizers: every slice and chain link
 * handed out lies inside the buffer, a chain walk ends within the buffer's slice count, and
 * a ring yields at most `cap` elements between two writes of the peer.
 */
#include "shm/buffer.h"
#include "shm/queue.h"

#include "shmipc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define TEMPLATE_BUFFER 2048u
#define TEMPLATE_CAP    16u
#define MAX_HELD        64u
#define MAX_OPS         512u
#define MAX_KEPT        64u

struct input {
    const uint8_t *p;
    size_t n;
};

static uint32_t take(struct input *in, unsigned bytes)
{
    uint32_t v = 0;
    for (unsigned i = 0; i < bytes; i++) {
        v = v << 8 | (in->n ? *in->p : 0);
        if (in->n) {
            in->p++;
            in->n--;
        }
    }
    return v;
}

struct state {
    uint8_t *buf, *qmem;
    size_t buf_len, q_len;
    int have_bm, have_q;
    struct shmipc__buffer bm, peer; /* our view, and the peer's (the creator's) */
    int have_peer;
    struct shmipc__queue_pair qp, peer_qp; /* ours, and the peer's (the other role) */
    int have_peer_q;
    uint32_t held[MAX_HELD];
    uint32_t nheld;
    int keep;                /* mode bit 3 */
    uint64_t *rec;           /* the receiver's record of the slices it holds */
    uint32_t kept[MAX_KEPT]; /* received slices we hold, as a session's chunks do */
    uint32_t nkept;
    uint32_t sink; /* keeps the reads of received bytes */
};

/* A slice handed to us must lie inside the buffer, data included. */
static void check_slice(const struct state *s, const struct shmipc__slice *sl)
{
    if (sl->data < s->buf || (uint64_t)(sl->data - s->buf) + sl->cap > s->buf_len ||
        sl->offset + (uint64_t)SHMIPC__BM_SLICE_HEADER_SIZE + sl->cap > s->buf_len ||
        sl->list >= s->bm.nlists)
        abort();
}

static void hold(struct state *s, uint32_t off)
{
    if (s->nheld < MAX_HELD)
        s->held[s->nheld++] = off;
    else
        (void)shmipc__buffer_free(&s->bm, off);
}

/* Lets go of the kept slice `i`: freed and forgotten, as a session's release does. */
static void release_kept(struct state *s, uint32_t i)
{
    shmipc__held_drop(&s->bm, s->rec, s->kept[i]);
    (void)shmipc__buffer_free(&s->bm, s->kept[i]);
    s->kept[i] = s->kept[--s->nkept];
}

/* Keeps a slice a walk handed us; it must not be one we keep already. */
static void keep_slice(struct state *s, uint32_t off)
{
    for (uint32_t i = 0; i < s->nkept; i++)
        if (s->kept[i] == off)
            abort(); /* the record let a slice we hold through twice */
    if (s->nkept == MAX_KEPT)
        release_kept(s, 0);
    s->kept[s->nkept++] = off;
}

/*
 * Walks a chain as a receiver does, reading every byte it is given, then frees it; or, in
 * keep mode, keeps its slices with the receiver's record, as a session does.
 */
static void receive_chain(struct state *s, uint32_t off, int free_after)
{
    struct shmipc__chain c;
    struct shmipc__chain_slice cs;
    uint32_t steps = 0;
    int rc;
    shmipc__chain_begin(&c, &s->bm, off);
    if (s->keep)
        c.held = s->rec;
    while ((rc = shmipc__chain_next(&c, &cs)) > 0) {
        if (++steps > s->bm.total_slices)
            abort();
        if (cs.bytes < s->buf || (uint64_t)(cs.bytes - s->buf) + cs.size > s->buf_len ||
            cs.list >= s->bm.nlists || cs.index >= s->bm.total_slices)
            abort();
        for (uint32_t i = 0; i < cs.size; i++)
            s->sink += cs.bytes[i];
        if (s->keep)
            keep_slice(s, cs.offset);
    }
    if (rc != 0 && rc != SHMIPC_EPROTO)
        abort();
    if (free_after && !s->keep) {
        int n = shmipc__buffer_free_chain(&s->bm, off, NULL);
        if (n > (int)s->bm.total_slices)
            abort();
    }
}

static void op(struct state *s, struct input *in)
{
    struct shmipc__slice sl, many[16];
    struct shmipc__queue_elem e;
    struct shmipc__slice_header sh;
    uint32_t code = take(in, 1), a, b;
    switch (code % 15) {
    case 0: /* the peer writes the buffer */
    case 1: /* the peer writes the queue */ {
        uint8_t *mem = code % 15 == 0 ? s->buf : s->qmem;
        size_t len = code % 15 == 0 ? s->buf_len : s->q_len;
        a = take(in, 2);
        b = take(in, 4);
        if (len >= 4) {
            size_t at = (a % (len / 4)) * 4;
            memcpy(mem + at, &b, 4);
        }
        break;
    }
    case 2: /* we allocate */
        if (s->have_bm && shmipc__buffer_alloc(&s->bm, take(in, 2), &sl) == 0) {
            check_slice(s, &sl);
            hold(s, sl.offset);
        }
        break;
    case 3: /* we free a slice we hold */
        a = take(in, 1);
        if (s->have_bm && s->keep && s->nkept > 0 && (a & 0x80)) {
            release_kept(s, a % s->nkept);
        } else if (s->have_bm && s->nheld > 0) {
            a %= s->nheld;
            (void)shmipc__buffer_free(&s->bm, s->held[a]);
            s->held[a] = s->held[--s->nheld];
        }
        break;
    case 4: /* we free an offset the peer gave us */
        a = take(in, 4);
        if (s->have_bm)
            (void)shmipc__buffer_free(&s->bm, a);
        break;
    case 5: /* we walk (and maybe free) a chain at an offset the peer gave us */
        a = take(in, 4);
        b = take(in, 1);
        if (s->have_bm && s->keep && (b & 4) && s->nkept)
            receive_chain(s, s->kept[a % s->nkept], b & 1); /* announced again */
        else if (s->have_bm)
            receive_chain(s, (b & 2) && s->nheld ? s->held[a % s->nheld] : a, b & 1);
        break;
    case 6: /* we send on our ring */
        e.seq_id = take(in, 1);
        e.offset = s->nheld ? s->held[take(in, 1) % s->nheld] : take(in, 4);
        e.status = take(in, 1) & 1;
        if (s->have_q && shmipc__queue_put(&s->qp.send, &e) == 0)
            (void)shmipc__queue_mark_working(&s->qp.send);
        break;
    case 7: /* we drain our receive ring, as a session does on a wakeup */
        if (s->have_q) {
            uint32_t got = 0;
            while (shmipc__queue_pop(&s->qp.recv, &e) == 0) {
                if (++got > s->qp.recv.cap)
                    abort();
                if (s->have_bm && e.offset != 0 && e.status == 0)
                    receive_chain(s, e.offset, 1);
            }
            (void)shmipc__queue_mark_not_working(&s->qp.recv);
        }
        break;
    case 8: /* sizes and flags */
        if (s->have_q) {
            int n = shmipc__queue_size(&s->qp.recv);
            if (n > (int)s->qp.recv.cap || shmipc__queue_size(&s->qp.send) > (int)s->qp.send.cap)
                abort();
            (void)n;
            (void)shmipc__queue_mark_working(&s->qp.recv);
        }
        break;
    case 9: /* a large write: many slices */
        a = take(in, 3);
        b = take(in, 1) % 16 + 1;
        if (s->have_bm) {
            int n = shmipc__buffer_alloc_many(&s->bm, a, many, b);
            if (n > (int)b)
                abort();
            for (int i = 0; i < n; i++) {
                check_slice(s, &many[i]);
                hold(s, many[i].offset);
            }
        }
        break;
    case 10: /* we build a chain: link one held slice to another, set start and size */
        a = take(in, 1);
        b = take(in, 1);
        if (s->have_bm && s->nheld > 0 &&
            shmipc__buffer_slice_at(&s->bm, s->held[a % s->nheld], &sl) == 0) {
            check_slice(s, &sl);
            (void)shmipc__buffer_slice_link(&s->bm, &sl, s->held[b % s->nheld]);
            (void)shmipc__buffer_slice_set(&s->bm, &sl, take(in, 2), take(in, 2));
            if (b & 0x80)
                (void)shmipc__buffer_slice_claim(&s->bm, &sl);
        }
        break;
    case 11: /* inspection, as the tests and the session do */
        a = take(in, 4);
        if (s->have_bm) {
            (void)shmipc__buffer_slice_header(&s->bm, a, &sh);
            (void)shmipc__buffer_list_free(&s->bm, a % (s->bm.nlists + 1));
            (void)shmipc__buffer_all_returned(&s->bm);
            if (shmipc__buffer_max_slice(&s->bm) == 0)
                abort();
        }
        break;
    case 12: /* the peer allocates and frees by the rules too */
        a = take(in, 2);
        if (s->have_peer && shmipc__buffer_alloc(&s->peer, a, &sl) == 0 && (a & 1))
            (void)shmipc__buffer_free(&s->peer, sl.offset);
        break;
    case 13: /* the peer sends a chain of up to four slices by the rules */
        a = take(in, 1) % 4 + 1;
        b = take(in, 2);
        if (s->have_peer && s->have_peer_q) {
            struct shmipc__slice prev = {0};
            uint32_t first = 0;
            for (uint32_t i = 0; i < a && shmipc__buffer_alloc(&s->peer, b, &sl) == 0; i++) {
                (void)shmipc__buffer_slice_set(&s->peer, &sl, 0, b < sl.cap ? b : sl.cap);
                if (i == 0)
                    first = sl.offset;
                else
                    (void)shmipc__buffer_slice_link(&s->peer, &prev, sl.offset);
                prev = sl;
            }
            e.seq_id = 1;
            e.offset = first;
            e.status = first == 0;
            if (shmipc__queue_put(&s->peer_qp.send, &e) == 0)
                (void)shmipc__queue_mark_working(&s->peer_qp.send);
        }
        break;
    default: /* we re-read the layout, as a server does when it maps the buffer */
        if (s->have_bm && shmipc__buffer_attach(&s->peer, s->buf, s->buf_len) == 0)
            s->have_peer = 1;
        break;
    }
}

/* Where the bytes read from received chains end up, so the reads are not optimised away. */
static volatile uint32_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const shmipc_slice_class classes[] = {{32, 50}, {128, 50}};
    struct state s;
    struct input in = {data, size};
    memset(&s, 0, sizeof s);
    uint32_t mode = take(&in, 1);
    int layout = mode & 2 ? SHMIPC__QUEUE_V4 : SHMIPC__QUEUE_LEGACY;
    int role = mode & 4 ? SHMIPC__QUEUE_SERVER : SHMIPC__QUEUE_CLIENT;
    if (mode & 1) {
        uint32_t b = take(&in, 2), q = take(&in, 2);
        s.buf_len = b % (in.n + 1);
        s.q_len = q % (in.n - s.buf_len + 1);
    } else {
        s.buf_len = TEMPLATE_BUFFER;
        s.q_len = shmipc__queue_pair_size_for(TEMPLATE_CAP, layout);
    }
    s.buf = malloc(s.buf_len ? s.buf_len : 1);
    s.qmem = malloc(s.q_len ? s.q_len : 1);
    if (s.buf == NULL || s.qmem == NULL)
        abort();
    if (mode & 1) {
        memcpy(s.buf, in.p, s.buf_len);
        memcpy(s.qmem, in.p + s.buf_len, s.q_len);
        in.p += s.buf_len + s.q_len;
        in.n -= s.buf_len + s.q_len;
        s.have_bm = shmipc__buffer_attach(&s.bm, s.buf, s.buf_len) == 0;
        s.have_q = shmipc__queue_pair_attach(&s.qp, s.qmem, s.q_len, layout, role) == 0;
        s.have_peer_q = shmipc__queue_pair_attach(&s.peer_qp, s.qmem, s.q_len, layout, !role) == 0;
    } else {
        memset(s.buf, 0, s.buf_len);
        if (shmipc__buffer_format(&s.peer, s.buf, s.buf_len, classes, 2) < 0 ||
            shmipc__queue_pair_format(&s.qp, s.qmem, s.q_len, TEMPLATE_CAP, layout) < 0)
            abort();
        s.have_peer = 1;
        s.have_bm = shmipc__buffer_attach(&s.bm, s.buf, s.buf_len) == 0;
        s.have_q = shmipc__queue_pair_attach(&s.qp, s.qmem, s.q_len, layout, role) == 0;
        s.have_peer_q = shmipc__queue_pair_attach(&s.peer_qp, s.qmem, s.q_len, layout, !role) == 0;
        if (!s.have_bm || !s.have_q || !s.have_peer_q)
            abort(); /* what format wrote, attach must accept */
    }
    s.keep = (mode & 8) != 0;
    if (s.have_bm && s.keep && (s.rec = shmipc__held_new(&s.bm)) == NULL)
        abort();
    if (s.have_bm &&
        (s.bm.total_slices == 0 || s.bm.nlists == 0 ||
         s.bm.lists[s.bm.nlists - 1].region + (uint64_t)s.bm.lists[s.bm.nlists - 1].region_len >
             s.buf_len))
        abort();
    for (unsigned i = 0; i < MAX_OPS && in.n > 0; i++)
        op(&s, &in);
    /* Every kept slice is still in the record; nothing else is. */
    if (s.rec != NULL && shmipc__held_count(&s.bm, s.rec) < s.nkept)
        abort();
    free(s.rec);
    free(s.buf);
    free(s.qmem);
    sink = s.sink;
    return 0;
}
