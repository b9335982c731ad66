/* SHA-1, base64 and the UTF-8 validator of the WebSocket layer; see ws_codec.h. */
#include "net/ws_codec.h"

#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* SHA-1 (FIPS 180-4 §6.1) */

static uint32_t rol(uint32_t x, unsigned n)
{
    return (x << n) | (x >> (32 - n));
}

static uint32_t load_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void store_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* One 512-bit block. The message schedule is kept as a 16-word ring. */
static void sha1_block(uint32_t h[5], const uint8_t *block)
{
    uint32_t w[16];
    for (int t = 0; t < 16; t++)
        w[t] = load_be32(block + 4 * t);
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int t = 0; t < 80; t++) {
        if (t >= 16)
            w[t & 15] = rol(w[(t - 3) & 15] ^ w[(t - 8) & 15] ^ w[(t - 14) & 15] ^ w[t & 15], 1);
        uint32_t f, k;
        if (t < 20) {
            f = (b & c) | (~b & d);
            k = 0x5a827999u;
        } else if (t < 40) {
            f = b ^ c ^ d;
            k = 0x6ed9eba1u;
        } else if (t < 60) {
            f = (b & c) | (b & d) | (c & d);
            k = 0x8f1bbcdcu;
        } else {
            f = b ^ c ^ d;
            k = 0xca62c1d6u;
        }
        uint32_t tmp = rol(a, 5) + f + e + k + w[t & 15];
        e = d;
        d = c;
        c = rol(b, 30);
        b = a;
        a = tmp;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
}

void shmipc__sha1_init(struct shmipc__sha1 *s)
{
    s->h[0] = 0x67452301u;
    s->h[1] = 0xefcdab89u;
    s->h[2] = 0x98badcfeu;
    s->h[3] = 0x10325476u;
    s->h[4] = 0xc3d2e1f0u;
    s->bytes = 0;
}

void shmipc__sha1_update(struct shmipc__sha1 *s, const void *data, size_t len)
{
    const uint8_t *p = data;
    size_t have = (size_t)(s->bytes & 63);
    s->bytes += len;
    if (have) {
        size_t take = 64 - have < len ? 64 - have : len;
        memcpy(s->block + have, p, take);
        p += take;
        len -= take;
        if (have + take < 64)
            return;
        sha1_block(s->h, s->block);
    }
    for (; len >= 64; p += 64, len -= 64)
        sha1_block(s->h, p);
    if (len)
        memcpy(s->block, p, len);
}

void shmipc__sha1_final(struct shmipc__sha1 *s, uint8_t out[SHMIPC__SHA1_LEN])
{
    uint64_t bits = s->bytes * 8;
    size_t have = (size_t)(s->bytes & 63);
    s->block[have++] = 0x80;
    if (have > 56) {
        memset(s->block + have, 0, 64 - have);
        sha1_block(s->h, s->block);
        have = 0;
    }
    memset(s->block + have, 0, 56 - have);
    for (int i = 0; i < 8; i++)
        s->block[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    sha1_block(s->h, s->block);
    for (int i = 0; i < 5; i++)
        store_be32(out + 4 * i, s->h[i]);
}

void shmipc__sha1(const void *data, size_t len, uint8_t out[SHMIPC__SHA1_LEN])
{
    struct shmipc__sha1 s;
    shmipc__sha1_init(&s);
    shmipc__sha1_update(&s, data, len);
    shmipc__sha1_final(&s, out);
}

/* ---------------------------------------------------------------------------------------- */
/* base64 (RFC 4648 §4) */

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t shmipc__base64_encode(const void *in, size_t len, char *out)
{
    const uint8_t *p = in;
    size_t o = 0, i = 0;
    for (; i + 3 <= len; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        out[o++] = b64[v >> 18];
        out[o++] = b64[(v >> 12) & 63];
        out[o++] = b64[(v >> 6) & 63];
        out[o++] = b64[v & 63];
    }
    if (len - i == 1) {
        uint32_t v = (uint32_t)p[i] << 16;
        out[o++] = b64[v >> 18];
        out[o++] = b64[(v >> 12) & 63];
        out[o++] = '=';
        out[o++] = '=';
    } else if (len - i == 2) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
        out[o++] = b64[v >> 18];
        out[o++] = b64[(v >> 12) & 63];
        out[o++] = b64[(v >> 6) & 63];
        out[o++] = '=';
    }
    out[o] = '\0';
    return o;
}

/* The 6-bit value of a base64 character, or -1. */
static int b64_value(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

long shmipc__base64_decode(const char *in, size_t len, uint8_t *out, size_t cap)
{
    if (len % 4)
        return -1;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        int last = i + 4 == len;
        int v[4], pad = 0;
        for (int k = 0; k < 4; k++) {
            if (in[i + k] == '=' && last && k >= 2) {
                v[k] = 0;
                pad++;
                continue;
            }
            if (pad) /* a character after padding */
                return -1;
            v[k] = b64_value(in[i + k]);
            if (v[k] < 0)
                return -1;
        }
        if (pad == 2 && in[i + 2] != '=')
            return -1; /* "x=y=" is not padding */
        /* Canonical form: the bits the padding drops must be zero. */
        if ((pad == 1 && (v[2] & 3)) || (pad == 2 && (v[1] & 15)))
            return -1;
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | v[3];
        size_t n = 3 - (size_t)pad;
        if (cap - o < n)
            return -1;
        out[o++] = (uint8_t)(w >> 16);
        if (n > 1)
            out[o++] = (uint8_t)(w >> 8);
        if (n > 2)
            out[o++] = (uint8_t)w;
    }
    return (long)o;
}

/* ---------------------------------------------------------------------------------------- */
/* UTF-8 (RFC 3629 §4) */

/*
 * Byte classes: which bytes may follow which is decided by 12 classes, the columns of the
 * transition table.
 *   0: 00..7F   1: 80..8F   2: 90..9F   3: A0..BF   (ASCII, then continuation bytes)
 *   4: C2..DF   5: E0   6: E1..EC, EE..EF   7: ED   8: F0   9: F1..F3   10: F4
 *  11: C0, C1, F5..FF (never valid)
 * The continuation classes are split where the second byte of a sequence is restricted:
 * after E0 only A0..BF (no overlongs), after ED only 80..9F (no surrogates), after F0 only
 * 90..BF (no overlongs), after F4 only 80..8F (nothing above U+10FFFF).
 */
static const uint8_t utf8_class[256] = {
    [0x00 ... 0x7f] = 0,  [0x80 ... 0x8f] = 1,  [0x90 ... 0x9f] = 2, [0xa0 ... 0xbf] = 3,
    [0xc0 ... 0xc1] = 11, [0xc2 ... 0xdf] = 4,  [0xe0] = 5,          [0xe1 ... 0xec] = 6,
    [0xed] = 7,           [0xee ... 0xef] = 6,  [0xf0] = 8,          [0xf1 ... 0xf3] = 9,
    [0xf4] = 10,          [0xf5 ... 0xff] = 11,
};

/* States, the rows: */
enum {
    U_ACCEPT = SHMIPC__UTF8_ACCEPT, /* between code points */
    U_REJECT = SHMIPC__UTF8_REJECT, /* invalid, for good */
    U_NEED1,                        /* one continuation byte (80..BF) left */
    U_NEED2,                        /* two left, the next any of 80..BF */
    U_NEED3,                        /* three left, the next any of 80..BF */
    U_E0,                           /* after E0: A0..BF, then one more */
    U_ED,                           /* after ED: 80..9F, then one more */
    U_F0,                           /* after F0: 90..BF, then two more */
    U_F4,                           /* after F4: 80..8F, then two more */
    U_STATES
};

#define A  U_ACCEPT
#define R  U_REJECT
#define N1 U_NEED1
#define N2 U_NEED2
#define N3 U_NEED3
static const uint8_t utf8_next[U_STATES][12] = {
    /* Columns: byte classes 0-11. */
    [U_ACCEPT] = {A, R, R, R, N1, U_E0, N2, U_ED, U_F0, N3, U_F4, R},
    [U_REJECT] = {R, R, R, R, R, R, R, R, R, R, R, R},
    [U_NEED1] = {R, A, A, A, R, R, R, R, R, R, R, R},
    [U_NEED2] = {R, N1, N1, N1, R, R, R, R, R, R, R, R},
    [U_NEED3] = {R, N2, N2, N2, R, R, R, R, R, R, R, R},
    [U_E0] = {R, R, R, N1, R, R, R, R, R, R, R, R},
    [U_ED] = {R, N1, N1, R, R, R, R, R, R, R, R, R},
    [U_F0] = {R, R, N2, N2, R, R, R, R, R, R, R, R},
    [U_F4] = {R, N2, R, R, R, R, R, R, R, R, R, R},
};
#undef A
#undef R
#undef N1
#undef N2
#undef N3

uint32_t shmipc__utf8_validate(uint32_t state, const void *s, size_t len, size_t *bad)
{
    const uint8_t *p = s;
    size_t i = 0;
    if (state >= U_STATES)
        state = U_REJECT; /* not a state this validator returned */
    while (i < len) {
        if (state == U_ACCEPT) {
            /* Between code points, skip ASCII a word at a time. */
            while (len - i >= 8) {
                uint64_t w;
                memcpy(&w, p + i, 8);
                if (w & 0x8080808080808080ull)
                    break;
                i += 8;
            }
            while (i < len && p[i] < 0x80)
                i++;
            if (i == len)
                break;
        }
        state = utf8_next[state][utf8_class[p[i]]];
        if (state == U_REJECT) {
            if (bad)
                *bad = i;
            return U_REJECT;
        }
        i++;
    }
    return state;
}

size_t shmipc__utf8_truncate(const void *s, size_t len, size_t max)
{
    const uint8_t *p = s;
    if (len <= max)
        return len;
    size_t n = max;
    /* p[n] is the first byte cut off; if it continues a code point, cut before its start. */
    while (n > 0 && (p[n] & 0xc0) == 0x80)
        n--;
    return n;
}
