/* One server-side WebSocket connection without sockets; see ws_conn.h. */
#include "net/ws_conn.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "net/ws_codec.h"
#include "shmipc.h"

/* What the payload of the current frame is for. */
enum frame_kind {
    K_SKIP = 0, /* ignored (data after this side sent close, or with the peer gone) */
    K_CONTROL,  /* gathered in c->ctrl, handled at its end */
    K_DIRECT,   /* a whole message, whole in the caller's buffer: delivered in place */
    K_BUFFER,   /* appended to the reassembly buffer */
};

#define NO_PONG SIZE_MAX

int shmipc__ws_limits_resolve(struct shmipc__ws_limits *out, const struct shmipc__ws_limits *in)
{
    struct shmipc__ws_limits l;
    if (in)
        l = *in;
    else
        memset(&l, 0, sizeof l);
    if (!l.max_message)
        l.max_message = SHMIPC__WS_DEFAULT_MAX_MESSAGE;
    if (!l.max_frame)
        l.max_frame = l.max_message;
    if (!l.tx_high_water)
        l.tx_high_water = SHMIPC__WS_DEFAULT_TX_HIGH_WATER;
    if (!l.tx_limit)
        l.tx_limit = l.tx_high_water > SHMIPC__WS_DEFAULT_TX_LIMIT ? l.tx_high_water
                                                                   : SHMIPC__WS_DEFAULT_TX_LIMIT;
    if (!l.buffer_keep)
        l.buffer_keep = SHMIPC__WS_DEFAULT_BUFFER_KEEP;
    if (l.max_message > SHMIPC__WS_LIMIT_MAX_MESSAGE)
        return shmipc__fail(SHMIPC_EINVAL, "websocket max_message: %llu is above %llu",
                            (unsigned long long)l.max_message,
                            (unsigned long long)SHMIPC__WS_LIMIT_MAX_MESSAGE);
    if (l.max_frame > l.max_message)
        return shmipc__fail(SHMIPC_EINVAL, "websocket max_frame: %llu is above max_message (%llu)",
                            (unsigned long long)l.max_frame, (unsigned long long)l.max_message);
    if (l.tx_limit < l.tx_high_water)
        return shmipc__fail(SHMIPC_EINVAL, "websocket tx_limit: %zu is below tx_high_water (%zu)",
                            l.tx_limit, l.tx_high_water);
    *out = l;
    return 0;
}

void shmipc__ws_conn_init(struct shmipc__ws_conn *c, const struct shmipc__ws_limits *limits,
                          const struct shmipc__ws_callbacks *cbs, void *user_data)
{
    memset(c, 0, sizeof *c);
    shmipc__ws_parser_init(&c->parser, SHMIPC__WS_SERVER, limits->max_frame);
    /* Payloads are unmasked where they go (on_data), in the copy out of the caller's buffer
     * when they are copied, not in a pass of their own before it. */
    c->parser.keep_masked = 1;
    c->limits = limits;
    c->cbs = cbs;
    c->user_data = user_data;
    c->pong_at = NO_PONG;
    c->state = SHMIPC__WS_OPEN;
    c->utf8 = SHMIPC__UTF8_ACCEPT;
}

/*
 * Large buffers a thread keeps for its next large message. A connection lets go of buffers
 * above buffer_keep after each message, so that idle connections hold little; but freeing and
 * allocating a 1 MiB buffer per message has glibc give the pages back and the next message
 * fault them in again (hundreds of page faults per round trip once two such messages are in
 * flight). The thread's spares, at most SPARE_COUNT buffers and SPARE_BYTES bytes, absorb that;
 * they are freed when the thread exits.
 */
#define SPARE_COUNT 8
#define SPARE_BYTES ((size_t)64 << 20)

struct spares {
    unsigned n;
    size_t bytes;
    struct {
        char *p;
        size_t cap;
    } b[SPARE_COUNT];
};

static pthread_key_t spare_key;
static pthread_once_t spare_once = PTHREAD_ONCE_INIT;
static int spare_key_ok;

static void spares_free(void *arg)
{
    struct spares *s = arg;
    for (unsigned i = 0; i < s->n; i++)
        free(s->b[i].p);
    free(s);
}

static void spare_key_init(void)
{
    spare_key_ok = pthread_key_create(&spare_key, spares_free) == 0;
}

/* This thread's spares; created when `create` is set. NULL when there are none. */
static struct spares *spares_of_thread(int create)
{
    pthread_once(&spare_once, spare_key_init);
    if (!spare_key_ok)
        return NULL;
    struct spares *s = pthread_getspecific(spare_key);
    if (s == NULL && create && (s = calloc(1, sizeof *s)) != NULL &&
        pthread_setspecific(spare_key, s) != 0) {
        free(s);
        s = NULL;
    }
    return s;
}

/* Takes the smallest spare of at least `need` bytes, or returns NULL. */
static char *spare_take(size_t need, size_t *cap)
{
    struct spares *s = spares_of_thread(0);
    unsigned best = SPARE_COUNT;
    for (unsigned i = 0; s != NULL && i < s->n; i++)
        if (s->b[i].cap >= need && (best == SPARE_COUNT || s->b[i].cap < s->b[best].cap))
            best = i;
    if (best == SPARE_COUNT)
        return NULL;
    char *p = s->b[best].p;
    *cap = s->b[best].cap;
    s->bytes -= *cap;
    s->b[best] = s->b[--s->n];
    return p;
}

/* Lets go of a buffer: a large one becomes a spare while there is room, the rest is freed. */
static void release(char *p, size_t cap, size_t keep)
{
    struct spares *s;
    if (p != NULL && cap > keep && (s = spares_of_thread(1)) != NULL && s->n < SPARE_COUNT &&
        s->bytes + cap <= SPARE_BYTES) {
        s->b[s->n].p = p;
        s->b[s->n].cap = cap;
        s->n++;
        s->bytes += cap;
        return;
    }
    free(p);
}

/*
 * Grows `*p` (holding `len` bytes, `*cap` allocated) to at least `need` bytes (`want` when it
 * reallocates): from a spare when `want` is large and one fits, else by realloc. Returns 0, or
 * -1 with *p unchanged.
 */
static int grow(char **p, size_t *cap, size_t len, size_t need, size_t want, size_t keep)
{
    size_t got;
    /* Spares only serve large buffers: a small message must not take a big one. */
    char *q = want > keep ? spare_take(need, &got) : NULL;
    if (q != NULL) {
        if (len)
            memcpy(q, *p, len);
        release(*p, *cap, keep);
    } else if ((q = realloc(*p, want)) != NULL) {
        got = want;
    } else {
        return -1;
    }
    *p = q;
    *cap = got;
    return 0;
}

static void buf_free(struct shmipc__ws_buf *b, size_t keep)
{
    release(b->p, b->cap, keep);
    memset(b, 0, sizeof *b);
}

static void msg_free(struct shmipc__ws_conn *c)
{
    release(c->msg, c->msg_cap, c->limits->buffer_keep);
    c->msg = NULL;
    c->msg_cap = 0;
}

void shmipc__ws_conn_destroy(struct shmipc__ws_conn *c)
{
    size_t keep = c->limits != NULL ? c->limits->buffer_keep : SIZE_MAX;
    buf_free(&c->flight, keep);
    buf_free(&c->pending, keep);
    release(c->msg, c->msg_cap, keep);
    c->msg = NULL;
    c->msg_len = c->msg_cap = 0;
}

void shmipc__ws_conn_trim(struct shmipc__ws_conn *c)
{
    if (c->flight.len == c->flight.off)
        buf_free(&c->flight, c->limits->buffer_keep);
    if (c->pending.len == 0)
        buf_free(&c->pending, c->limits->buffer_keep);
    if (c->msg_len == 0)
        msg_free(c);
}

/* ---------------------------------------------------------------------------------------- */
/* Output */

/* Appends iov[0..n) but its first `skip` bytes to the pending buffer. Returns 0 or
 * SHMIPC_ENOMEM. */
static int queue_iov(struct shmipc__ws_conn *c, const struct iovec *iov, int n, size_t skip)
{
    struct shmipc__ws_buf *b = &c->pending;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (iov[i].iov_len > SIZE_MAX - total)
            return shmipc__fail(SHMIPC_ENOMEM, "websocket: output queue overflow");
        total += iov[i].iov_len;
    }
    if (total - skip > SIZE_MAX - b->len)
        return shmipc__fail(SHMIPC_ENOMEM, "websocket: output queue overflow");
    size_t need = b->len + (total - skip);
    if (need > b->cap) {
        size_t cap = b->cap * 2 > need ? b->cap * 2 : need;
        if (cap < 256)
            cap = 256;
        if (grow(&b->p, &b->cap, b->len, need, cap, c->limits->buffer_keep) < 0)
            return shmipc__fail(SHMIPC_ENOMEM, "websocket: cannot grow the output queue to %zu",
                                cap);
    }
    for (int i = 0; i < n; i++) {
        size_t k = iov[i].iov_len;
        if (skip >= k) {
            skip -= k;
            continue;
        }
        memcpy(b->p + b->len, (const char *)iov[i].iov_base + skip, k - skip);
        b->len += k - skip;
        skip = 0;
    }
    c->pong_at = NO_PONG;
    return 0;
}

/* Appends a frame (head and payload) to the pending buffer. Returns 0 or SHMIPC_ENOMEM. */
static int queue_frame(struct shmipc__ws_conn *c, unsigned opcode, const void *payload, size_t len)
{
    uint8_t head[SHMIPC__WS_HEAD_MAX];
    struct iovec iov[2];
    int n = shmipc__ws_frame_iov(head, opcode, payload, len, iov);
    return queue_iov(c, iov, n, 0);
}

/*
 * Sends a data frame: straight from the caller's memory when the queue is empty and the owner
 * can write now (write_now), so that a large message is not copied; what the socket does not
 * take at once is queued (copied), since `payload` is the caller's again on return.
 */
static int send_frame(struct shmipc__ws_conn *c, unsigned opcode, const void *payload, size_t len)
{
    if (len < SHMIPC__WS_WRITE_NOW_MIN || c->cbs->write_now == NULL ||
        shmipc__ws_conn_tx_queued(c) != 0)
        return queue_frame(c, opcode, payload, len);
    uint8_t head[SHMIPC__WS_HEAD_MAX];
    struct iovec iov[2];
    int n = shmipc__ws_frame_iov(head, opcode, payload, len, iov);
    size_t total = iov[0].iov_len + len;
    size_t done = c->cbs->write_now(c->user_data, iov, n);
    if (done >= total)
        return 0;
    return queue_iov(c, iov, n, done);
}

size_t shmipc__ws_conn_tx_peek(struct shmipc__ws_conn *c, const char **data)
{
    if (c->flight.off == c->flight.len) {
        if (c->pending.len == 0) {
            *data = NULL;
            return 0;
        }
        /* The handed-out buffer is empty: the pending one takes its place. */
        struct shmipc__ws_buf t = c->flight;
        c->flight = c->pending;
        c->pending = t;
        c->pending.off = c->pending.len = 0;
        c->pong_at = NO_PONG;
    }
    *data = c->flight.p + c->flight.off;
    return c->flight.len - c->flight.off;
}

int shmipc__ws_conn_tx_sent(struct shmipc__ws_conn *c, size_t n)
{
    struct shmipc__ws_buf *b = &c->flight;
    if (n > b->len - b->off)
        n = b->len - b->off;
    b->off += n;
    if (b->off == b->len) {
        b->off = b->len = 0;
        if (b->cap > c->limits->buffer_keep)
            buf_free(b, c->limits->buffer_keep);
    }
    if (c->paused && shmipc__ws_conn_tx_queued(c) <= c->limits->tx_high_water / 2) {
        c->paused = 0;
        return 1;
    }
    return 0;
}

/* Queues the pong answering a ping. Past the high-water mark an unsent pong at the tail of
 * the queue is replaced rather than joined by another, so a ping flood from a client that
 * does not read grows nothing (RFC 6455 §5.5.3 allows answering only the latest ping). */
static int queue_pong(struct shmipc__ws_conn *c, const char *payload, size_t len)
{
    size_t at = c->pending.len;
    if (c->pong_at != NO_PONG && shmipc__ws_conn_tx_queued(c) >= c->limits->tx_high_water)
        at = c->pong_at;
    c->pending.len = at;
    int rc = queue_frame(c, SHMIPC__WS_OP_PONG, payload, len);
    if (rc == 0)
        c->pong_at = at;
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Input */

/* Ends the connection: the close frame when none was sent yet, on_close, CLOSED. */
static int fail(struct shmipc__ws_conn *c, unsigned code, const char *why)
{
    (void)shmipc__fail(SHMIPC_EPROTO, "websocket: %s (close %u)", why, code);
    if (c->state == SHMIPC__WS_OPEN && !c->gone) {
        char payload[2] = {(char)(code >> 8), (char)code};
        (void)queue_frame(c, SHMIPC__WS_OP_CLOSE, payload, 2);
    }
    c->state = SHMIPC__WS_CLOSED;
    if (c->cbs->on_close)
        c->cbs->on_close(c->user_data, code, why, strlen(why));
    return -1;
}

static int deliver(struct shmipc__ws_conn *c, unsigned opcode, const char *data, size_t len)
{
    c->msg_opcode = 0;
    int rc = c->cbs->on_message(c->user_data, opcode, data, len);
    if (rc < 0 && c->state != SHMIPC__WS_CLOSED)
        return fail(c, SHMIPC__WS_CLOSE_INTERNAL, "the application failed on a message");
    return 0;
}

/* Decides what the frame's payload is for; fails on a frame out of sequence or too large. */
static int on_head(struct shmipc__ws_conn *c, const struct shmipc__ws_frame *f, size_t avail)
{
    if (c->state == SHMIPC__WS_CLOSING || c->gone) {
        /* Only the peer's close frame matters now. */
        c->kind = f->opcode == SHMIPC__WS_OP_CLOSE ? K_CONTROL : K_SKIP;
        c->ctrl_len = 0;
        return 0;
    }
    if (shmipc__ws_is_control(f->opcode)) {
        c->kind = K_CONTROL;
        c->ctrl_len = 0;
        return 0;
    }
    if (f->opcode == SHMIPC__WS_OP_CONT) {
        if (!c->msg_opcode)
            return fail(c, SHMIPC__WS_CLOSE_PROTOCOL, "continuation frame without a message");
    } else {
        if (c->msg_opcode)
            return fail(c, SHMIPC__WS_CLOSE_PROTOCOL,
                        "new message before the fragmented one ended");
        c->msg_opcode = f->opcode;
        c->msg_total = 0;
        c->utf8 = SHMIPC__UTF8_ACCEPT;
    }
    if (f->len > c->limits->max_message - c->msg_total)
        return fail(c, SHMIPC__WS_CLOSE_TOO_BIG, "message larger than the maximum");
    c->msg_total += f->len;
    c->msg_fin = f->fin;
    /* A whole message whose payload is all here: deliver it where it lies. */
    c->kind = f->fin && f->opcode != SHMIPC__WS_OP_CONT && f->len <= avail ? K_DIRECT : K_BUFFER;
    return 0;
}

/* Makes room for `n` more message bytes: doubling (so a message costs O(log n) allocations,
 * never one per frame), never beyond max_message, and for the final frame never beyond the
 * message's declared end. Capacity follows the bytes that arrived, not a declared length. */
static int msg_reserve(struct shmipc__ws_conn *c, size_t n)
{
    size_t need = c->msg_len + n;
    if (need <= c->msg_cap)
        return 0;
    size_t cap = c->msg_cap * 2 > need ? c->msg_cap * 2 : need;
    if (cap < 256)
        cap = 256;
    uint64_t bound = c->msg_fin ? c->msg_total : c->limits->max_message;
    if (cap > bound)
        cap = (size_t)bound;
    if (grow(&c->msg, &c->msg_cap, c->msg_len, need, cap, c->limits->buffer_keep) < 0)
        return shmipc__fail(SHMIPC_ENOMEM, "websocket: cannot grow a message to %zu bytes", cap);
    return 0;
}

/* Checks text bytes just added to the message (fail fast, see msg_append()). */
static int msg_check_text(struct shmipc__ws_conn *c, const char *data, size_t len)
{
    if (c->msg_opcode != SHMIPC__WS_OP_TEXT)
        return 0;
    c->utf8 = shmipc__utf8_validate(c->utf8, data, len, NULL);
    if (c->utf8 == SHMIPC__UTF8_REJECT)
        return fail(c, SHMIPC__WS_CLOSE_INVALID_DATA, "text message is not valid UTF-8");
    return 0;
}

static void msg_reset(struct shmipc__ws_conn *c)
{
    c->msg_len = 0;
    c->msg_total = 0;
    if (c->msg_cap > c->limits->buffer_keep)
        msg_free(c);
}

static int on_close_frame(struct shmipc__ws_conn *c)
{
    unsigned code = 0;
    const char *reason = "";
    size_t rlen = 0;
    if (c->ctrl_len == 1)
        return fail(c, SHMIPC__WS_CLOSE_PROTOCOL, "close frame with a 1-byte payload");
    if (c->ctrl_len >= 2) {
        code = (unsigned)(uint8_t)c->ctrl[0] << 8 | (uint8_t)c->ctrl[1];
        if (!shmipc__ws_close_code_valid(code))
            return fail(c, SHMIPC__WS_CLOSE_PROTOCOL, "invalid close code");
        reason = c->ctrl + 2;
        rlen = c->ctrl_len - 2u;
        if (!shmipc__utf8_valid(reason, rlen))
            return fail(c, SHMIPC__WS_CLOSE_INVALID_DATA, "close reason is not valid UTF-8");
    }
    if (c->state == SHMIPC__WS_OPEN && !c->gone) {
        /* Echo the code (RFC 6455 §5.5.1), 1000 for a close without one. */
        unsigned echo = code ? code : SHMIPC__WS_CLOSE_NORMAL;
        char payload[2] = {(char)(echo >> 8), (char)echo};
        (void)queue_frame(c, SHMIPC__WS_OP_CLOSE, payload, 2);
    }
    c->state = SHMIPC__WS_CLOSED;
    if (c->cbs->on_close)
        c->cbs->on_close(c->user_data, code ? code : SHMIPC__WS_CLOSE_NO_STATUS, reason, rlen);
    return -1;
}

static int on_control(struct shmipc__ws_conn *c, unsigned opcode)
{
    if (opcode == SHMIPC__WS_OP_CLOSE)
        return on_close_frame(c);
    if (c->gone) /* a ping or pong that was arriving when the peer was found gone */
        return 0;
    switch (opcode) {
    case SHMIPC__WS_OP_PING:
        if (queue_pong(c, c->ctrl, c->ctrl_len) != 0)
            return fail(c, SHMIPC__WS_CLOSE_INTERNAL, "cannot queue a pong");
        if (c->cbs->on_ping)
            c->cbs->on_ping(c->user_data, c->ctrl, c->ctrl_len);
        return 0;
    default: /* the parser lets no other control opcode through */
        if (c->cbs->on_pong)
            c->cbs->on_pong(c->user_data, c->ctrl, c->ctrl_len);
        return 0;
    }
}

/* Unmasks payload bytes in place (event offset `offset` of the current frame). */
static void unmask(const struct shmipc__ws_frame *f, char *data, size_t len, uint64_t offset)
{
    if (f->masked)
        shmipc__ws_mask(data, len, f->key, offset);
}

/* Copies payload bytes into the message, unmasking them on the way (one pass), and checks
 * text as it lands. Fails fast: a byte that can never be valid UTF-8 fails here, not at the
 * message's end. */
static int msg_append(struct shmipc__ws_conn *c, const struct shmipc__ws_frame *f, const char *data,
                      size_t len, uint64_t offset)
{
    if (len == 0)
        return 0;
    if (msg_reserve(c, len) != 0)
        return fail(c, SHMIPC__WS_CLOSE_INTERNAL, "out of memory for a message");
    char *dst = c->msg + c->msg_len;
    if (f->masked)
        shmipc__ws_mask_copy(dst, data, len, f->key, offset);
    else
        memcpy(dst, data, len);
    c->msg_len += len;
    return msg_check_text(c, dst, len);
}

/*
 * Reads the rest of the current frame's payload straight from the socket into the message
 * (read_now), unmasking each piece in place while it is in cache: a large message is then
 * not copied at all in user space. Room grows only once the bytes read have filled it
 * (doubling, as msg_reserve()), so capacity still follows the bytes that arrived. Stops when
 * the socket has nothing more now, or after SHMIPC__WS_READ_NOW_BUDGET bytes so that one fast
 * sender does not hold the loop (the owner's next receive goes through process(), which
 * comes back here). Returns 0, or -1 when the connection failed.
 */
static int read_direct(struct shmipc__ws_conn *c, const struct shmipc__ws_frame *f)
{
    uint64_t left;
    size_t budget = SHMIPC__WS_READ_NOW_BUDGET;
    while ((left = shmipc__ws_parser_left(&c->parser)) > 0 && budget > 0) {
        if (c->msg_cap == c->msg_len) {
            size_t more = c->msg_len < 256 ? 256 : c->msg_len;
            if (msg_reserve(c, left < more ? (size_t)left : more) != 0)
                return fail(c, SHMIPC__WS_CLOSE_INTERNAL, "out of memory for a message");
        }
        size_t want = c->msg_cap - c->msg_len;
        if (want > left)
            want = (size_t)left;
        if (want > SHMIPC__WS_READ_NOW_CHUNK)
            want = SHMIPC__WS_READ_NOW_CHUNK;
        if (want > budget)
            want = budget;
        char *dst = c->msg + c->msg_len;
        size_t got = c->cbs->read_now(c->user_data, dst, want);
        if (got == 0)
            return 0;
        if (got > want)
            return fail(c, SHMIPC__WS_CLOSE_INTERNAL, "read_now returned more than asked");
        unmask(f, dst, got, f->len - left);
        (void)shmipc__ws_parser_consumed(&c->parser, got);
        c->msg_len += got;
        if (msg_check_text(c, dst, got) != 0)
            return -1;
        if (got < want)
            return 0;
        budget -= got;
    }
    return 0;
}

/* A piece of a message that is reassembled; delivers the message at its end. */
static int on_buffered(struct shmipc__ws_conn *c, const struct shmipc__ws_event *ev)
{
    int text = c->msg_opcode == SHMIPC__WS_OP_TEXT;
    if (msg_append(c, &ev->frame, ev->data, ev->len, ev->offset) != 0)
        return -1;
    int last = ev->last;
    if (!last && c->cbs->read_now != NULL &&
        shmipc__ws_parser_left(&c->parser) >= SHMIPC__WS_READ_NOW_MIN) {
        if (read_direct(c, &ev->frame) != 0)
            return -1;
        last = shmipc__ws_parser_left(&c->parser) == 0;
    }
    if (!(last && c->msg_fin))
        return 0;
    if (text && c->utf8 != SHMIPC__UTF8_ACCEPT)
        return fail(c, SHMIPC__WS_CLOSE_INVALID_DATA, "text message ends inside a character");
    int rc = deliver(c, c->msg_opcode, c->msg, c->msg_len);
    msg_reset(c);
    return rc;
}

static int on_data(struct shmipc__ws_conn *c, const struct shmipc__ws_event *ev)
{
    int text = c->msg_opcode == SHMIPC__WS_OP_TEXT;
    switch (c->kind) {
    case K_CONTROL:
        /* the parser bounds it to 125 */
        if (ev->frame.masked)
            shmipc__ws_mask_copy(c->ctrl + c->ctrl_len, ev->data, ev->len, ev->frame.key,
                                 ev->offset);
        else
            memcpy(c->ctrl + c->ctrl_len, ev->data, ev->len);
        c->ctrl_len = (uint8_t)(c->ctrl_len + ev->len);
        return ev->last ? on_control(c, ev->frame.opcode) : 0;
    case K_DIRECT:
        unmask(&ev->frame, ev->data, ev->len, ev->offset);
        if (text && !shmipc__utf8_valid(ev->data, ev->len))
            return fail(c, SHMIPC__WS_CLOSE_INVALID_DATA, "text message is not valid UTF-8");
        return deliver(c, c->msg_opcode, ev->data, ev->len);
    case K_BUFFER:
        return on_buffered(c, ev);
    default:
        return 0;
    }
}

int shmipc__ws_conn_process(struct shmipc__ws_conn *c, char *buf, size_t len)
{
    if (c->busy)
        return shmipc__fail(SHMIPC_EBUSY, "websocket: process called from a callback");
    if (c->state == SHMIPC__WS_CLOSED)
        return SHMIPC__WS_CONN_CLOSE;
    c->busy = 1;
    size_t pos = 0;
    struct shmipc__ws_event ev;
    /* With no bytes nothing can happen: an empty payload is reported with its header. */
    while (len > 0 && c->state != SHMIPC__WS_CLOSED) {
        pos += shmipc__ws_parse(&c->parser, buf + pos, len - pos, &ev);
        if (ev.kind == SHMIPC__WS_EV_NONE)
            break;
        if (ev.kind == SHMIPC__WS_EV_ERROR)
            (void)fail(c, ev.code, ev.why);
        else if (ev.kind == SHMIPC__WS_EV_HEAD)
            (void)on_head(c, &ev.frame, len - pos);
        else
            (void)on_data(c, &ev);
    }
    c->busy = 0;
    if (c->state == SHMIPC__WS_CLOSED)
        return SHMIPC__WS_CONN_CLOSE;
    if (!c->gone && shmipc__ws_conn_tx_queued(c) >= c->limits->tx_high_water) {
        c->paused = 1;
        return SHMIPC__WS_CONN_PAUSE;
    }
    return SHMIPC__WS_CONN_MORE;
}

void shmipc__ws_conn_peer_gone(struct shmipc__ws_conn *c)
{
    if (c->busy)
        return;
    c->gone = 1;
    /* A message being reassembled is dropped with the rest of its frames (on_head skips them
     * from now on); a control frame being gathered is seen to its end, for a close. */
    if (c->kind == K_DIRECT || c->kind == K_BUFFER)
        c->kind = K_SKIP;
}

void shmipc__ws_conn_eof(struct shmipc__ws_conn *c)
{
    if (c->busy || c->state == SHMIPC__WS_CLOSED)
        return;
    c->state = SHMIPC__WS_CLOSED;
    static const char why[] = "the connection ended without a close frame";
    if (c->cbs->on_close)
        c->cbs->on_close(c->user_data, SHMIPC__WS_CLOSE_ABNORMAL, why, sizeof why - 1);
}

/* ---------------------------------------------------------------------------------------- */
/* Sending */

/* Whether the application may queue a frame now. */
static int can_send(const struct shmipc__ws_conn *c)
{
    if (c->state != SHMIPC__WS_OPEN || c->gone)
        return shmipc__fail(SHMIPC_ECLOSED, "websocket: the connection is closing or closed");
    if (shmipc__ws_conn_tx_queued(c) >= c->limits->tx_limit)
        return shmipc__fail(SHMIPC_EAGAIN, "websocket: %zu bytes are queued (tx_limit %zu)",
                            shmipc__ws_conn_tx_queued(c), c->limits->tx_limit);
    return 0;
}

int shmipc__ws_conn_send(struct shmipc__ws_conn *c, unsigned opcode, const void *data, size_t len,
                         unsigned flags)
{
    if (opcode != SHMIPC__WS_OP_TEXT && opcode != SHMIPC__WS_OP_BINARY)
        return shmipc__fail(SHMIPC_EINVAL, "websocket send: opcode %u is not text or binary",
                            opcode);
    if (opcode == SHMIPC__WS_OP_TEXT && !(flags & SHMIPC__WS_SEND_TRUSTED) &&
        !shmipc__utf8_valid(data, len))
        return shmipc__fail(SHMIPC_EINVAL, "websocket send: text is not valid UTF-8");
    int rc = can_send(c);
    return rc ? rc : send_frame(c, opcode, data, len);
}

int shmipc__ws_conn_ping(struct shmipc__ws_conn *c, const void *data, size_t len)
{
    if (len > SHMIPC__WS_CONTROL_MAX)
        return shmipc__fail(SHMIPC_EINVAL, "websocket ping: %zu bytes is above 125", len);
    int rc = can_send(c);
    return rc ? rc : queue_frame(c, SHMIPC__WS_OP_PING, data, len);
}

int shmipc__ws_conn_pong(struct shmipc__ws_conn *c, const void *data, size_t len)
{
    if (len > SHMIPC__WS_CONTROL_MAX)
        return shmipc__fail(SHMIPC_EINVAL, "websocket pong: %zu bytes is above 125", len);
    int rc = can_send(c);
    return rc ? rc : queue_frame(c, SHMIPC__WS_OP_PONG, data, len);
}

int shmipc__ws_conn_close(struct shmipc__ws_conn *c, unsigned code, const char *reason,
                          size_t reason_len)
{
    if (c->state != SHMIPC__WS_OPEN || c->gone)
        return shmipc__fail(SHMIPC_ECLOSED, "websocket close: the connection is closing or closed");
    if (code && !shmipc__ws_close_code_valid(code))
        return shmipc__fail(SHMIPC_EINVAL, "websocket close: %u is not a close code to send", code);
    if (reason_len && (!code || !shmipc__utf8_valid(reason, reason_len)))
        return shmipc__fail(SHMIPC_EINVAL, "websocket close: the reason needs a code and UTF-8");
    char payload[SHMIPC__WS_CONTROL_MAX];
    size_t n = shmipc__ws_close_payload(payload, code, reason, reason_len);
    int rc = queue_frame(c, SHMIPC__WS_OP_CLOSE, payload, n);
    if (rc == 0)
        c->state = SHMIPC__WS_CLOSING;
    return rc;
}
