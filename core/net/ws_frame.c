/* WebSocket frame parser and writers; see ws_frame.h. */
#include "net/ws_frame.h"

#include <string.h>

#include "net/ws_codec.h"

int shmipc__ws_close_code_valid(unsigned code)
{
    return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) ||
           (code >= 3000 && code <= 4999);
}

/* ---------------------------------------------------------------------------------------- */
/* Masking */

/* The key as 8 bytes, rotated so that byte 0 applies to payload offset `offset`. */
static uint64_t key64(const uint8_t key[4], uint64_t offset, uint8_t k[8])
{
    for (unsigned i = 0; i < 8; i++)
        k[i] = key[(offset + i) & 3];
    uint64_t m;
    memcpy(&m, k, 8);
    return m;
}

void shmipc__ws_mask_copy(void *dst, const void *src, size_t len, const uint8_t key[4],
                          uint64_t offset)
{
    uint8_t *d = dst, k[8];
    const uint8_t *s = src;
    size_t i = 0;
    /* Bytes one at a time until the destination is word-aligned (for copies long enough to
     * gain from it); the key is then rotated to the payload offset reached there, so the
     * words XOR with the mask as it lines up with them and no second pass is needed. */
    if (len >= 64)
        for (; ((uintptr_t)(d + i) & 7) != 0; i++)
            d[i] = s[i] ^ key[(offset + i) & 3];
    uint64_t m = key64(key, offset + i, k);
    const uint8_t *sp = s + i;
    uint8_t *dp = d + i;
    size_t n = len - i, j = 0;
    for (; n - j >= 32; j += 32) {
        uint64_t w[4];
        memcpy(w, sp + j, 32);
        w[0] ^= m;
        w[1] ^= m;
        w[2] ^= m;
        w[3] ^= m;
        memcpy(dp + j, w, 32);
    }
    for (; n - j >= 8; j += 8) {
        uint64_t w;
        memcpy(&w, sp + j, 8);
        w ^= m;
        memcpy(dp + j, &w, 8);
    }
    for (; j < n; j++)
        dp[j] = sp[j] ^ k[j & 7];
}

/* In place is the copy onto itself: each block is read whole before it is written. */
void shmipc__ws_mask(void *data, size_t len, const uint8_t key[4], uint64_t offset)
{
    shmipc__ws_mask_copy(data, data, len, key, offset);
}

/* ---------------------------------------------------------------------------------------- */
/* Parser */

enum parser_state {
    P_HEAD = 0, /* gathering a header */
    P_PAYLOAD,  /* the header was reported; walking the payload */
    P_ERROR,    /* a frame was invalid */
};

void shmipc__ws_parser_init(struct shmipc__ws_parser *p, enum shmipc__ws_role role,
                            uint64_t max_frame)
{
    memset(p, 0, sizeof *p);
    p->role = (uint8_t)role;
    p->max_frame = max_frame ? max_frame : SHMIPC__WS_LEN_MAX;
    p->state = P_HEAD;
    p->need = 2;
}

uint64_t shmipc__ws_parser_left(const struct shmipc__ws_parser *p)
{
    return p->state == P_PAYLOAD ? p->frame.len - p->done : 0;
}

int shmipc__ws_parser_consumed(struct shmipc__ws_parser *p, uint64_t n)
{
    if (p->state != P_PAYLOAD || n > p->frame.len - p->done)
        return -1;
    p->done += n;
    if (p->done == p->frame.len) {
        p->state = P_HEAD;
        p->have = 0;
        p->need = 2;
    }
    return 0;
}

static size_t fail(struct shmipc__ws_parser *p, struct shmipc__ws_event *ev, uint16_t code,
                   const char *why, size_t used)
{
    p->state = P_ERROR;
    p->code = code;
    ev->kind = SHMIPC__WS_EV_ERROR;
    ev->code = code;
    ev->why = why;
    return used;
}

/* Checks the first byte of a header. Returns NULL or what is wrong with it. */
static const char *check_byte0(uint8_t b)
{
    unsigned op = b & 0x0f;
    if (b & 0x70)
        return "RSV bits set without a negotiated extension";
    if (!(op <= SHMIPC__WS_OP_BINARY || (op >= SHMIPC__WS_OP_CLOSE && op <= SHMIPC__WS_OP_PONG)))
        return "reserved opcode";
    if (shmipc__ws_is_control(op) && !(b & 0x80))
        return "fragmented control frame";
    return NULL;
}

/* Checks the second byte against the first. Returns NULL or what is wrong. */
static const char *check_byte1(const struct shmipc__ws_parser *p, uint8_t b0, uint8_t b1)
{
    int masked = (b1 & 0x80) != 0;
    if (p->role == SHMIPC__WS_SERVER && !masked)
        return "unmasked frame from a client";
    if (p->role == SHMIPC__WS_CLIENT && masked)
        return "masked frame from a server";
    if (shmipc__ws_is_control(b0 & 0x0f) && (b1 & 0x7f) > SHMIPC__WS_CONTROL_MAX)
        return "control frame longer than 125 bytes";
    return NULL;
}

size_t shmipc__ws_parse(struct shmipc__ws_parser *p, char *buf, size_t len,
                        struct shmipc__ws_event *ev)
{
    ev->kind = SHMIPC__WS_EV_NONE;
    ev->last = 0;
    ev->len = 0;
    if (p->state == P_ERROR)
        return fail(p, ev, p->code, "the connection already failed", 0);

    if (p->state == P_PAYLOAD) {
        uint64_t left = p->frame.len - p->done;
        size_t n = len < left ? len : (size_t)left;
        if (n == 0 && left > 0)
            return 0;
        if (p->frame.masked && !p->keep_masked)
            shmipc__ws_mask(buf, n, p->frame.key, p->done);
        ev->kind = SHMIPC__WS_EV_DATA;
        ev->data = buf;
        ev->len = n;
        ev->offset = p->done;
        ev->last = n == left;
        ev->frame = p->frame;
        p->done += n;
        if (ev->last) {
            p->state = P_HEAD;
            p->have = 0;
            p->need = 2;
        }
        return n;
    }

    size_t used = 0;
    while (p->have < p->need) {
        if (used == len)
            return used;
        uint8_t b = (uint8_t)buf[used++];
        p->head[p->have++] = b;
        const char *why = NULL;
        if (p->have == 1) {
            why = check_byte0(b);
        } else if (p->have == 2) {
            why = check_byte1(p, p->head[0], b);
            unsigned len7 = b & 0x7f;
            p->need = (uint8_t)(2 + (len7 == 126 ? 2 : len7 == 127 ? 8 : 0) + (b & 0x80 ? 4 : 0));
        }
        if (why)
            return fail(p, ev, SHMIPC__WS_CLOSE_PROTOCOL, why, used);
    }

    /* The header is whole. */
    struct shmipc__ws_frame *f = &p->frame;
    const uint8_t *h = p->head;
    unsigned len7 = h[1] & 0x7f, at = 2;
    f->fin = (h[0] & 0x80) != 0;
    f->rsv = (h[0] >> 4) & 7;
    f->opcode = h[0] & 0x0f;
    f->masked = (h[1] & 0x80) != 0;
    if (len7 == 126) {
        f->len = (uint64_t)h[2] << 8 | h[3];
        at = 4;
        if (f->len < 126)
            return fail(p, ev, SHMIPC__WS_CLOSE_PROTOCOL, "16-bit length below 126", used);
    } else if (len7 == 127) {
        f->len = 0;
        for (unsigned i = 0; i < 8; i++)
            f->len = f->len << 8 | h[2 + i];
        at = 10;
        if (f->len >> 63)
            return fail(p, ev, SHMIPC__WS_CLOSE_PROTOCOL, "64-bit length with its top bit set",
                        used);
        if (f->len <= 0xffff)
            return fail(p, ev, SHMIPC__WS_CLOSE_PROTOCOL, "64-bit length below 65536", used);
    } else {
        f->len = len7;
    }
    if (f->masked)
        memcpy(f->key, h + at, 4);
    else
        memset(f->key, 0, 4);
    if (f->len > p->max_frame)
        return fail(p, ev, SHMIPC__WS_CLOSE_TOO_BIG, "frame larger than the maximum", used);
    p->state = P_PAYLOAD;
    p->done = 0;
    ev->kind = SHMIPC__WS_EV_HEAD;
    ev->frame = *f;
    return used;
}

/* ---------------------------------------------------------------------------------------- */
/* Writers */

size_t shmipc__ws_frame_head(uint8_t head[SHMIPC__WS_HEAD_MAX], int fin, unsigned opcode,
                             uint64_t len)
{
    head[0] = (uint8_t)((fin ? 0x80 : 0) | (opcode & 0x0f));
    if (len < 126) {
        head[1] = (uint8_t)len;
        return 2;
    }
    if (len <= 0xffff) {
        head[1] = 126;
        head[2] = (uint8_t)(len >> 8);
        head[3] = (uint8_t)len;
        return 4;
    }
    head[1] = 127;
    for (unsigned i = 0; i < 8; i++)
        head[2 + i] = (uint8_t)(len >> (56 - 8 * i));
    return 10;
}

size_t shmipc__ws_frame_head_masked(uint8_t head[SHMIPC__WS_HEAD_MAX], int fin, unsigned opcode,
                                    uint64_t len, const uint8_t key[4])
{
    size_t n = shmipc__ws_frame_head(head, fin, opcode, len);
    head[1] |= 0x80;
    memcpy(head + n, key, 4);
    return n + 4;
}

int shmipc__ws_frame_iov(uint8_t head[SHMIPC__WS_HEAD_MAX], unsigned opcode, const void *payload,
                         size_t len, struct iovec iov[2])
{
    iov[0].iov_base = head;
    iov[0].iov_len = shmipc__ws_frame_head(head, 1, opcode, len);
    if (len == 0)
        return 1;
    iov[1].iov_base = (void *)(uintptr_t)payload;
    iov[1].iov_len = len;
    return 2;
}

size_t shmipc__ws_close_payload(char out[SHMIPC__WS_CONTROL_MAX], unsigned code, const char *reason,
                                size_t reason_len)
{
    if (code == 0)
        return 0;
    out[0] = (char)(code >> 8);
    out[1] = (char)code;
    size_t n = reason ? shmipc__utf8_truncate(reason, reason_len, SHMIPC__WS_REASON_MAX) : 0;
    if (n)
        memcpy(out + 2, reason, n);
    return 2 + n;
}

size_t shmipc__ws_control_frame(char out[SHMIPC__WS_CONTROL_FRAME_MAX], unsigned opcode,
                                const void *payload, size_t len, const uint8_t *key)
{
    if (opcode < SHMIPC__WS_OP_CLOSE || opcode > SHMIPC__WS_OP_PONG || len > SHMIPC__WS_CONTROL_MAX)
        return 0;
    uint8_t head[SHMIPC__WS_HEAD_MAX];
    size_t n = key ? shmipc__ws_frame_head_masked(head, 1, opcode, len, key)
                   : shmipc__ws_frame_head(head, 1, opcode, len);
    memcpy(out, head, n);
    if (len && key)
        shmipc__ws_mask_copy(out + n, payload, len, key, 0);
    else if (len)
        memcpy(out + n, payload, len);
    return n + len;
}
