/*
 * Description: the WebSocket layer's parts: SHA-1 (FIPS 180 vectors), base64 (RFC 4648),
 * Sec-WebSocket-Accept (RFC 6455's example), the UTF-8 DFA (every edge case of Autobahn's 6.x
 * family, cross-checked against a plain decoder), masking, the frame parser and writers, and
 * the connection behaviours that byte fixtures cannot show (zero-copy delivery, backpressure,
 * bounded memory, the close handshake started by the application).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shmipc.h"
#include "net/http_parser.h"
#include "net/ws_codec.h"
#include "net/ws_conn.h"
#include "net/ws_frame.h"
#include "net/ws_handshake.h"

static void hex(const uint8_t *d, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

/* A small deterministic generator (xorshift), so failures reproduce. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* ---------------------------------------------------------------------------------------- */
/* SHA-1 */

static void sha1_hex(const void *d, size_t n, char out[41])
{
    uint8_t digest[SHMIPC__SHA1_LEN];
    shmipc__sha1(d, n, digest);
    hex(digest, sizeof digest, out);
}

/* FIPS 180-2 appendix A and the NIST example vectors. */
static void sha1_fips_vectors(void **state)
{
    (void)state;
    char h[41];
    sha1_hex("abc", 3, h);
    assert_string_equal(h, "a9993e364706816aba3e25717850c26c9cd0d89d");
    sha1_hex("", 0, h);
    assert_string_equal(h, "da39a3ee5e6b4b0d3255bfef95601890afd80709");
    static const char two_blocks[] = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha1_hex(two_blocks, sizeof two_blocks - 1, h);
    assert_string_equal(h, "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
    static const char long_msg[] = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmn"
                                   "hijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    sha1_hex(long_msg, sizeof long_msg - 1, h);
    assert_string_equal(h, "a49b2446a02c645bf419f995b67091253a04a259");

    /* One million 'a', fed in uneven pieces. */
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    struct shmipc__sha1 s;
    shmipc__sha1_init(&s);
    size_t at = 0, step = 1;
    while (at < 1000000) {
        size_t n = step < 1000000 - at ? step : 1000000 - at;
        shmipc__sha1_update(&s, a + at, n);
        at += n;
        step = step * 3 % 1021 + 1;
    }
    uint8_t digest[SHMIPC__SHA1_LEN];
    shmipc__sha1_final(&s, digest);
    hex(digest, sizeof digest, h);
    assert_string_equal(h, "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
    free(a);
}

/* Every message length across the padding boundaries, whole and byte by byte. */
static void sha1_pieces_match_whole(void **state)
{
    (void)state;
    uint8_t msg[200];
    for (size_t i = 0; i < sizeof msg; i++)
        msg[i] = (uint8_t)(i * 7 + 1);
    for (size_t n = 0; n <= sizeof msg; n++) {
        uint8_t whole[SHMIPC__SHA1_LEN], bytes[SHMIPC__SHA1_LEN];
        shmipc__sha1(msg, n, whole);
        struct shmipc__sha1 s;
        shmipc__sha1_init(&s);
        for (size_t i = 0; i < n; i++)
            shmipc__sha1_update(&s, msg + i, 1);
        shmipc__sha1_final(&s, bytes);
        assert_memory_equal(whole, bytes, sizeof whole);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* base64 */

static void base64_rfc4648_vectors(void **state)
{
    (void)state;
    static const char *const plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    static const char *const coded[] = {"",         "Zg==",     "Zm8=",    "Zm9v",
                                        "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (size_t i = 0; i < 7; i++) {
        char out[16];
        size_t n = shmipc__base64_encode(plain[i], strlen(plain[i]), out);
        assert_int_equal(n, strlen(coded[i]));
        assert_int_equal(n, SHMIPC__BASE64_LEN(strlen(plain[i])));
        assert_string_equal(out, coded[i]);
        uint8_t back[16];
        long m = shmipc__base64_decode(coded[i], strlen(coded[i]), back, sizeof back);
        assert_int_equal(m, (long)strlen(plain[i]));
        assert_memory_equal(back, plain[i], (size_t)m);
    }
    /* Every byte value survives a round trip. */
    uint8_t all[256], back[256];
    char text[SHMIPC__BASE64_LEN(256) + 1];
    for (int i = 0; i < 256; i++)
        all[i] = (uint8_t)i;
    size_t n = shmipc__base64_encode(all, 256, text);
    assert_int_equal(shmipc__base64_decode(text, n, back, sizeof back), 256);
    assert_memory_equal(all, back, 256);
}

static void base64_decode_is_strict(void **state)
{
    (void)state;
    uint8_t out[32];
    static const char *const bad[] = {
        "Zg=",      /* length not a multiple of 4 */
        "Zg==Zg==", /* padding in the middle */
        "Z===",     /* three pads */
        "Zh==",     /* non-canonical: dropped bits set */
        "Zm9=",     /* non-canonical with one pad */
        "Zm 9",     /* whitespace */
        "Zm9*",     /* not the alphabet */
        "Zm=v",     /* a character after padding */
        "Z=g=",     /* pads not at the end */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(shmipc__base64_decode(bad[i], strlen(bad[i]), out, sizeof out), -1);
    /* Too small an output buffer. */
    assert_int_equal(shmipc__base64_decode("Zm9vYmFy", 8, out, 5), -1);
}

/* RFC 6455 §1.3 and §4.2.2. */
static void accept_rfc6455_example(void **state)
{
    (void)state;
    char accept[SHMIPC__WS_ACCEPT_LEN + 1];
    shmipc__ws_accept("dGhlIHNhbXBsZSBub25jZQ==", 24, accept);
    assert_string_equal(accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
}

/* ---------------------------------------------------------------------------------------- */
/* UTF-8 */

/* A plain decoder, written for clarity: the reference the DFA is checked against. */
static int reference_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t b = s[i];
        uint32_t cp, min;
        size_t len;
        if (b < 0x80) {
            i++;
            continue;
        } else if ((b & 0xe0) == 0xc0) {
            len = 2, cp = b & 0x1f, min = 0x80;
        } else if ((b & 0xf0) == 0xe0) {
            len = 3, cp = b & 0x0f, min = 0x800;
        } else if ((b & 0xf8) == 0xf0) {
            len = 4, cp = b & 0x07, min = 0x10000;
        } else {
            return 0;
        }
        if (n - i < len)
            return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += len;
    }
    return 1;
}

struct utf8_case {
    const char *s;
    int valid;
};

/* The sequences of Markus Kuhn's UTF-8 decoder stress test that Autobahn's 6.x cases send. */
static const struct utf8_case utf8_cases[] = {
    {"hello\x24world", 1},
    {"hello\xc2\xa2world", 1},
    {"hello\xe2\x82\xacworld", 1},
    {"hello\xf0\xa4\xad\xa2world", 1},
    {"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5", 1},
    /* first and last of each length */
    {"\xc2\x80", 1},
    {"\xe0\xa0\x80", 1},
    {"\xf0\x90\x80\x80", 1},
    {"\x7f", 1},
    {"\xdf\xbf", 1},
    {"\xef\xbf\xbf", 1},
    {"\xf4\x8f\xbf\xbf", 1},
    {"\xf8\x88\x80\x80\x80", 0},
    {"\xfc\x84\x80\x80\x80\x80", 0},
    {"\xf7\xbf\xbf\xbf", 0},
    {"\xfb\xbf\xbf\xbf\xbf", 0},
    {"\xfd\xbf\xbf\xbf\xbf\xbf", 0},
    /* other boundaries */
    {"\xed\x9f\xbf", 1},
    {"\xee\x80\x80", 1},
    {"\xef\xbf\xbd", 1},
    {"\xf4\x90\x80\x80", 0},
    /* unexpected continuation bytes */
    {"\x80", 0},
    {"\xbf", 0},
    {"\x80\xbf", 0},
    {"\x80\xbf\x80\xbf\x80\xbf", 0},
    /* lonely start bytes */
    {"\xc0\x20", 0},
    {"\xdf\x20", 0},
    {"\xe0\x20", 0},
    {"\xf0\x20", 0},
    {"\xf8\x20", 0},
    {"\xfc\x20", 0},
    /* last continuation byte missing */
    {"\xc0", 0},
    {"\xe0\x80", 0},
    {"\xf0\x80\x80", 0},
    {"\xdf", 0},
    {"\xef\xbf", 0},
    {"\xf7\xbf\xbf", 0},
    /* impossible bytes */
    {"\xfe", 0},
    {"\xff", 0},
    {"\xfe\xfe\xff\xff", 0},
    /* overlong forms */
    {"\xc0\xaf", 0},
    {"\xe0\x80\xaf", 0},
    {"\xf0\x80\x80\xaf", 0},
    {"\xc1\xbf", 0},
    {"\xe0\x9f\xbf", 0},
    {"\xf0\x8f\xbf\xbf", 0},
    {"\xc0\x80", 0},
    {"\xe0\x80\x80", 0},
    {"\xf0\x80\x80\x80", 0},
    /* single and paired UTF-16 surrogates */
    {"\xed\xa0\x80", 0},
    {"\xed\xad\xbf", 0},
    {"\xed\xae\x80", 0},
    {"\xed\xaf\xbf", 0},
    {"\xed\xb0\x80", 0},
    {"\xed\xbe\x80", 0},
    {"\xed\xbf\xbf", 0},
    {"\xed\xa0\x80\xed\xb0\x80", 0},
    {"\xed\xaf\xbf\xed\xbf\xbf", 0},
    /* noncharacters are valid UTF-8 */
    {"\xef\xbf\xbe", 1},
    {"\xef\xbf\xbf", 1},
    {"\xef\xb7\x90", 1},
    {"\xf4\x8f\xbf\xbe", 1},
    /* above U+10FFFF */
    {"\xf5\x80\x80\x80", 0},
    {"\xf4\x90\x80\x80", 0},
    {"\xf7\xbf\xbf\xbf", 0},
};

static void utf8_stress_cases(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof utf8_cases / sizeof utf8_cases[0]; i++) {
        const struct utf8_case *c = &utf8_cases[i];
        size_t n = strlen(c->s);
        if (shmipc__utf8_valid(c->s, n) != c->valid)
            print_message("case %zu\n", i);
        assert_int_equal(shmipc__utf8_valid(c->s, n), c->valid);
        assert_int_equal(reference_valid((const uint8_t *)c->s, n), c->valid);
        /* Fed a byte at a time, the verdict is the same. */
        uint32_t st = SHMIPC__UTF8_ACCEPT;
        for (size_t k = 0; k < n; k++)
            st = shmipc__utf8_validate(st, c->s + k, 1, NULL);
        assert_int_equal(st == SHMIPC__UTF8_ACCEPT, c->valid);
    }
    /* U+0000 is valid. */
    assert_true(shmipc__utf8_valid("\0", 1));
}

/* Fail fast: the validator stops at the first byte that can never be valid, and says which. */
static void utf8_fails_at_the_first_impossible_byte(void **state)
{
    (void)state;
    size_t bad = 99;
    /* Autobahn 6.4.x: "κόσμε" then ED A0 80 (a surrogate) then "edited". */
    static const char s[] = "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80\x65\x64";
    assert_int_equal(shmipc__utf8_validate(SHMIPC__UTF8_ACCEPT, s, sizeof s - 1, &bad),
                     SHMIPC__UTF8_REJECT);
    assert_int_equal(bad, 12); /* A0 after ED: the byte that makes it impossible */
    /* The prefix up to ED is still incomplete, not invalid. */
    uint32_t st = shmipc__utf8_validate(SHMIPC__UTF8_ACCEPT, s, 12, NULL);
    assert_true(st != SHMIPC__UTF8_ACCEPT && st != SHMIPC__UTF8_REJECT);
    /* A truncated sequence at the end is incomplete, rejected only by the final check. */
    st = shmipc__utf8_validate(SHMIPC__UTF8_ACCEPT, "ab\xf0\x9f\x98", 5, NULL);
    assert_true(st != SHMIPC__UTF8_ACCEPT && st != SHMIPC__UTF8_REJECT);
    assert_false(shmipc__utf8_valid("ab\xf0\x9f\x98", 5));
    assert_true(shmipc__utf8_valid("ab\xf0\x9f\x98\x80", 6));
    /* A long ASCII run before the error: the word-at-a-time skip reports the right byte. */
    char longer[100];
    memset(longer, 'x', sizeof longer);
    longer[77] = (char)0xc1;
    assert_int_equal(shmipc__utf8_validate(SHMIPC__UTF8_ACCEPT, longer, sizeof longer, &bad),
                     SHMIPC__UTF8_REJECT);
    assert_int_equal(bad, 77);
    /* REJECT is absorbing. */
    assert_int_equal(shmipc__utf8_validate(SHMIPC__UTF8_REJECT, "a", 1, NULL), SHMIPC__UTF8_REJECT);
}

/* Every 1-, 2- and 3-byte string, and 4-byte strings over boundary bytes, agree with the
 * reference decoder. */
static void utf8_agrees_with_reference(void **state)
{
    (void)state;
    uint8_t s[4];
    for (unsigned a = 0; a < 256; a++) {
        s[0] = (uint8_t)a;
        assert_int_equal(shmipc__utf8_valid(s, 1), reference_valid(s, 1));
        for (unsigned b = 0; b < 256; b++) {
            s[1] = (uint8_t)b;
            assert_int_equal(shmipc__utf8_valid(s, 2), reference_valid(s, 2));
            if (a < 0xe0 || a > 0xf4)
                continue; /* 3-byte strings that do not start a 3- or 4-byte sequence */
            for (unsigned c = 0; c < 256; c++) {
                s[2] = (uint8_t)c;
                if (shmipc__utf8_valid(s, 3) != reference_valid(s, 3))
                    fail_msg("%02x %02x %02x", a, b, c);
            }
        }
    }
    static const uint8_t edge[] = {0x00, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xff};
    for (unsigned a = 0xf0; a <= 0xff; a++)
        for (size_t i = 0; i < sizeof edge; i++)
            for (size_t j = 0; j < sizeof edge; j++)
                for (size_t k = 0; k < sizeof edge; k++) {
                    uint8_t t[4] = {(uint8_t)a, edge[i], edge[j], edge[k]};
                    assert_int_equal(shmipc__utf8_valid(t, 4), reference_valid(t, 4));
                }
}

/* Every code point encodes to valid UTF-8 except the surrogates. */
static void utf8_every_code_point(void **state)
{
    (void)state;
    for (uint32_t cp = 0; cp <= 0x10ffff; cp++) {
        uint8_t s[4];
        size_t n;
        if (cp < 0x80) {
            s[0] = (uint8_t)cp, n = 1;
        } else if (cp < 0x800) {
            s[0] = (uint8_t)(0xc0 | cp >> 6), s[1] = (uint8_t)(0x80 | (cp & 0x3f)), n = 2;
        } else if (cp < 0x10000) {
            s[0] = (uint8_t)(0xe0 | cp >> 12), s[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
            s[2] = (uint8_t)(0x80 | (cp & 0x3f)), n = 3;
        } else {
            s[0] = (uint8_t)(0xf0 | cp >> 18), s[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
            s[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f)), s[3] = (uint8_t)(0x80 | (cp & 0x3f));
            n = 4;
        }
        int want = !(cp >= 0xd800 && cp <= 0xdfff);
        if (shmipc__utf8_valid(s, n) != want)
            fail_msg("U+%04X", cp);
    }
}

/* A valid text split at every point validates the same, the state carried across. */
static void utf8_incremental_split(void **state)
{
    (void)state;
    static const char s[] = "ascii \xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5 and "
                            "\xf0\x9f\x98\x80 emoji, more ascii to cross a word boundary";
    size_t n = sizeof s - 1;
    for (size_t cut = 0; cut <= n; cut++) {
        uint32_t st = shmipc__utf8_validate(SHMIPC__UTF8_ACCEPT, s, cut, NULL);
        assert_int_not_equal(st, SHMIPC__UTF8_REJECT);
        st = shmipc__utf8_validate(st, s + cut, n - cut, NULL);
        assert_int_equal(st, SHMIPC__UTF8_ACCEPT);
    }
}

static void utf8_truncate_at_boundary(void **state)
{
    (void)state;
    static const char s[] = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"; /* a é € 😀 */
    assert_int_equal(shmipc__utf8_truncate(s, 10, 100), 10);
    assert_int_equal(shmipc__utf8_truncate(s, 10, 10), 10);
    assert_int_equal(shmipc__utf8_truncate(s, 10, 9), 6);
    assert_int_equal(shmipc__utf8_truncate(s, 10, 6), 6);
    assert_int_equal(shmipc__utf8_truncate(s, 10, 5), 3);
    assert_int_equal(shmipc__utf8_truncate(s, 10, 2), 1);
    assert_int_equal(shmipc__utf8_truncate(s, 10, 0), 0);
}

/* ---------------------------------------------------------------------------------------- */
/* Masking and frames */

static void mask_every_offset_and_length(void **state)
{
    (void)state;
    static const uint8_t key[4] = {0x11, 0x22, 0x44, 0x88};
    uint8_t data[80], want[80], copy[80];
    for (uint64_t off = 0; off < 8; off++)
        for (size_t len = 0; len <= sizeof data; len++) {
            for (size_t i = 0; i < len; i++)
                data[i] = want[i] = (uint8_t)rnd();
            for (size_t i = 0; i < len; i++)
                want[i] ^= key[(off + i) & 3];
            shmipc__ws_mask_copy(copy, data, len, key, off);
            shmipc__ws_mask(data, len, key, off);
            assert_memory_equal(data, want, len);
            assert_memory_equal(copy, want, len);
        }
}

/* The fused unmask-copy against a byte-wise reference: every source and destination alignment
 * (0..7), every key rotation, lengths 0..70 and a few longer ones (the word loop starts once
 * the destination is aligned, from 64 bytes); the bytes around the destination stay as they
 * were, and the source is not changed. */
static void mask_copy_every_alignment(void **state)
{
    (void)state;
    static const uint8_t key[4] = {0x5a, 0xc3, 0x0f, 0x96};
    static const size_t longer[] = {127, 128, 129, 255, 1000, 4099};
    enum { MAX = 4099, PAD = 16 };
    uint8_t *src = malloc(MAX + PAD), *dst = malloc(MAX + 2 * PAD), *want = malloc(MAX),
            *orig = malloc(MAX);
    for (size_t li = 0; li < 71 + sizeof longer / sizeof longer[0]; li++) {
        size_t len = li < 71 ? li : longer[li - 71];
        for (size_t sa = 0; sa < 8; sa++)
            for (size_t da = 0; da < 8; da++)
                for (uint64_t off = 0; off < 8; off++) {
                    uint8_t *s = src + sa, *d = dst + PAD + da;
                    for (size_t i = 0; i < len; i++)
                        s[i] = orig[i] = (uint8_t)rnd();
                    for (size_t i = 0; i < len; i++)
                        want[i] = (uint8_t)(s[i] ^ key[(off + i) & 3]);
                    memset(dst, 0xee, MAX + 2 * PAD);
                    shmipc__ws_mask_copy(d, s, len, key, off);
                    assert_memory_equal(d, want, len);
                    assert_memory_equal(s, orig, len);
                    for (size_t i = 0; i < PAD + da; i++)
                        assert_int_equal(dst[i], 0xee);
                    for (size_t i = PAD + da + len; i < MAX + 2 * PAD; i++)
                        assert_int_equal(dst[i], 0xee);
                }
    }
    free(src);
    free(dst);
    free(want);
    free(orig);
}

static void frame_head_lengths(void **state)
{
    (void)state;
    uint8_t h[SHMIPC__WS_HEAD_MAX];
    assert_int_equal(shmipc__ws_frame_head(h, 1, SHMIPC__WS_OP_TEXT, 0), 2);
    assert_int_equal(h[0], 0x81);
    assert_int_equal(h[1], 0);
    assert_int_equal(shmipc__ws_frame_head(h, 1, SHMIPC__WS_OP_BINARY, 125), 2);
    assert_int_equal(h[1], 125);
    assert_int_equal(shmipc__ws_frame_head(h, 0, SHMIPC__WS_OP_TEXT, 126), 4);
    assert_memory_equal(h, "\x01\x7e\x00\x7e", 4);
    assert_int_equal(shmipc__ws_frame_head(h, 1, SHMIPC__WS_OP_BINARY, 65535), 4);
    assert_memory_equal(h, "\x82\x7e\xff\xff", 4);
    assert_int_equal(shmipc__ws_frame_head(h, 1, SHMIPC__WS_OP_BINARY, 65536), 10);
    assert_memory_equal(h, "\x82\x7f\x00\x00\x00\x00\x00\x01\x00\x00", 10);
    assert_int_equal(shmipc__ws_frame_head(h, 1, SHMIPC__WS_OP_CONT, SHMIPC__WS_LEN_MAX), 10);
    assert_memory_equal(h, "\x80\x7f\x7f\xff\xff\xff\xff\xff\xff\xff", 10);
    static const uint8_t key[4] = {1, 2, 3, 4};
    assert_int_equal(shmipc__ws_frame_head_masked(h, 1, SHMIPC__WS_OP_TEXT, 5, key), 6);
    assert_memory_equal(h, "\x81\x85\x01\x02\x03\x04", 6);
    assert_int_equal(shmipc__ws_frame_head_masked(h, 1, SHMIPC__WS_OP_TEXT, 70000, key), 14);
    assert_memory_equal(h, "\x81\xff\x00\x00\x00\x00\x00\x01\x11\x70\x01\x02\x03\x04", 14);
}

static void frame_iov_references_the_payload(void **state)
{
    (void)state;
    uint8_t head[SHMIPC__WS_HEAD_MAX];
    struct iovec iov[2];
    static char payload[300];
    assert_int_equal(shmipc__ws_frame_iov(head, SHMIPC__WS_OP_BINARY, payload, 300, iov), 2);
    assert_ptr_equal(iov[0].iov_base, head);
    assert_int_equal(iov[0].iov_len, 4);
    assert_ptr_equal(iov[1].iov_base, payload);
    assert_int_equal(iov[1].iov_len, 300);
    assert_int_equal(shmipc__ws_frame_iov(head, SHMIPC__WS_OP_TEXT, NULL, 0, iov), 1);
    assert_int_equal(iov[0].iov_len, 2);
}

static void close_payload_cuts_reason_at_a_character(void **state)
{
    (void)state;
    char out[SHMIPC__WS_CONTROL_MAX];
    assert_int_equal(shmipc__ws_close_payload(out, 0, "ignored", 7), 0);
    assert_int_equal(shmipc__ws_close_payload(out, 1000, NULL, 0), 2);
    assert_memory_equal(out, "\x03\xe8", 2);
    assert_int_equal(shmipc__ws_close_payload(out, 4000, "bye", 3), 5);
    assert_memory_equal(out,
                        "\x0f\xa0"
                        "bye",
                        5);
    /* 70 two-byte characters (140 bytes): 61 of them fit in 123 bytes, not 61.5. */
    char reason[140];
    for (int i = 0; i < 70; i++)
        memcpy(reason + 2 * i, "\xc3\xa9", 2);
    size_t n = shmipc__ws_close_payload(out, 1001, reason, sizeof reason);
    assert_int_equal(n, 2 + 122);
    assert_true(shmipc__utf8_valid(out + 2, n - 2));
    /* 123 one-byte characters fit exactly. */
    memset(reason, 'r', sizeof reason);
    assert_int_equal(shmipc__ws_close_payload(out, 1001, reason, 123), 125);
    assert_int_equal(shmipc__ws_close_payload(out, 1001, reason, 124), 125);
}

static void control_frames(void **state)
{
    (void)state;
    char out[SHMIPC__WS_CONTROL_FRAME_MAX];
    assert_int_equal(shmipc__ws_control_frame(out, SHMIPC__WS_OP_PONG, "hi", 2, NULL), 4);
    assert_memory_equal(out, "\x8a\x02hi", 4);
    static const uint8_t key[4] = {0x37, 0xfa, 0x21, 0x3d};
    /* RFC 6455 §5.7: a masked ping "Hello". */
    assert_int_equal(shmipc__ws_control_frame(out, SHMIPC__WS_OP_PING, "Hello", 5, key), 11);
    assert_memory_equal(out, "\x89\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58", 11);
    char big[126] = {0};
    assert_int_equal(shmipc__ws_control_frame(out, SHMIPC__WS_OP_PING, big, 126, NULL), 0);
    assert_int_equal(shmipc__ws_control_frame(out, SHMIPC__WS_OP_TEXT, "x", 1, NULL), 0);
    assert_int_equal(shmipc__ws_control_frame(out, SHMIPC__WS_OP_CLOSE, big, 125, key), 131);
}

static void close_codes(void **state)
{
    (void)state;
    static const unsigned valid[] = {1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010,
                                     1011, 1012, 1013, 1014, 3000, 3999, 4000, 4999};
    static const unsigned invalid[] = {0,    999,  1004, 1005, 1006, 1015, 1016,
                                       1100, 2000, 2999, 5000, 9999, 65535};
    for (size_t i = 0; i < sizeof valid / sizeof valid[0]; i++)
        assert_true(shmipc__ws_close_code_valid(valid[i]));
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++)
        assert_false(shmipc__ws_close_code_valid(invalid[i]));
}

/* The client parser reads what the server writer wrote, in pieces, payload unmasked; and
 * the server parser unmasks a client frame split anywhere. */
static void parser_round_trips_in_pieces(void **state)
{
    (void)state;
    static const size_t sizes[] = {0, 1, 7, 125, 126, 127, 1000, 65535, 65536, 70001};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t len = sizes[si];
        for (int masked = 0; masked < 2; masked++) {
            uint8_t key[4] = {(uint8_t)rnd(), (uint8_t)rnd(), (uint8_t)rnd(), (uint8_t)rnd()};
            char *payload = malloc(len + 1), *wire = malloc(len + SHMIPC__WS_HEAD_MAX);
            for (size_t i = 0; i < len; i++)
                payload[i] = (char)rnd();
            uint8_t head[SHMIPC__WS_HEAD_MAX];
            size_t hl = masked
                            ? shmipc__ws_frame_head_masked(head, 1, SHMIPC__WS_OP_BINARY, len, key)
                            : shmipc__ws_frame_head(head, 1, SHMIPC__WS_OP_BINARY, len);
            memcpy(wire, head, hl);
            if (masked)
                shmipc__ws_mask_copy(wire + hl, payload, len, key, 0);
            else
                memcpy(wire + hl, payload, len);
            size_t total = hl + len;
            for (int trial = 0; trial < 20; trial++) {
                char *copy = malloc(total);
                memcpy(copy, wire, total);
                struct shmipc__ws_parser p;
                shmipc__ws_parser_init(&p, masked ? SHMIPC__WS_SERVER : SHMIPC__WS_CLIENT, 0);
                size_t at = 0, got = 0;
                int heads = 0, lasts = 0;
                while (at < total || (heads && !lasts)) {
                    size_t piece = trial == 0 ? total - at : 1 + rnd() % 300;
                    if (piece > total - at)
                        piece = total - at;
                    size_t end = at + piece, pos = at;
                    struct shmipc__ws_event ev;
                    for (;;) {
                        pos += shmipc__ws_parse(&p, copy + pos, end - pos, &ev);
                        if (ev.kind == SHMIPC__WS_EV_NONE)
                            break;
                        assert_int_not_equal(ev.kind, SHMIPC__WS_EV_ERROR);
                        if (ev.kind == SHMIPC__WS_EV_HEAD) {
                            heads++;
                            assert_int_equal(ev.frame.len, len);
                            assert_int_equal(ev.frame.masked, masked);
                            continue;
                        }
                        assert_int_equal(ev.offset, got);
                        assert_memory_equal(ev.data, payload + got, ev.len);
                        got += ev.len;
                        lasts += ev.last;
                    }
                    assert_int_equal(pos, end);
                    at = end;
                }
                assert_int_equal(heads, 1);
                assert_int_equal(lasts, 1);
                assert_int_equal(got, len);
                free(copy);
            }
            free(payload);
            free(wire);
        }
    }
}

/* One event for a frame given whole: the parser reports its header, then all of its payload. */
static void parser_frame_whole_is_one_data_event(void **state)
{
    (void)state;
    char wire[] = "\x81\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58";
    struct shmipc__ws_parser p;
    struct shmipc__ws_event ev;
    shmipc__ws_parser_init(&p, SHMIPC__WS_SERVER, 0);
    assert_int_equal(shmipc__ws_parse(&p, wire, 11, &ev), 6);
    assert_int_equal(ev.kind, SHMIPC__WS_EV_HEAD);
    assert_int_equal(ev.frame.opcode, SHMIPC__WS_OP_TEXT);
    assert_true(ev.frame.fin);
    assert_int_equal(shmipc__ws_parse(&p, wire + 6, 5, &ev), 5);
    assert_int_equal(ev.kind, SHMIPC__WS_EV_DATA);
    assert_true(ev.last);
    assert_ptr_equal(ev.data, wire + 6);
    assert_memory_equal(ev.data, "Hello", 5);
    assert_int_equal(shmipc__ws_parse(&p, wire + 11, 0, &ev), 0);
    assert_int_equal(ev.kind, SHMIPC__WS_EV_NONE);
    /* An empty payload: a DATA event of length 0 that uses no byte. */
    char empty[] = "\x89\x80\x01\x02\x03\x04";
    assert_int_equal(shmipc__ws_parse(&p, empty, 6, &ev), 6);
    assert_int_equal(ev.kind, SHMIPC__WS_EV_HEAD);
    assert_int_equal(shmipc__ws_parse(&p, empty + 6, 0, &ev), 0);
    assert_int_equal(ev.kind, SHMIPC__WS_EV_DATA);
    assert_true(ev.last);
    assert_int_equal(ev.len, 0);
}

static int parse_error(enum shmipc__ws_role role, uint64_t max_frame, const char *bytes, size_t n)
{
    char *copy = malloc(n);
    memcpy(copy, bytes, n);
    struct shmipc__ws_parser p;
    struct shmipc__ws_event ev;
    shmipc__ws_parser_init(&p, role, max_frame);
    size_t pos = 0;
    int code = 0;
    for (;;) {
        pos += shmipc__ws_parse(&p, copy + pos, n - pos, &ev);
        if (ev.kind == SHMIPC__WS_EV_ERROR) {
            code = ev.code;
            /* Failed for good. */
            assert_int_equal(shmipc__ws_parse(&p, copy, n, &ev), 0);
            assert_int_equal(ev.kind, SHMIPC__WS_EV_ERROR);
            break;
        }
        if (ev.kind == SHMIPC__WS_EV_NONE)
            break;
    }
    free(copy);
    return code;
}

static void parser_header_errors(void **state)
{
    (void)state;
    const enum shmipc__ws_role S = SHMIPC__WS_SERVER, C = SHMIPC__WS_CLIENT;
    /* RSV1, RSV2, RSV3 */
    assert_int_equal(parse_error(S, 0, "\xc1", 1), 1002);
    assert_int_equal(parse_error(S, 0, "\xa1", 1), 1002);
    assert_int_equal(parse_error(S, 0, "\x91", 1), 1002);
    /* reserved opcodes, failing on the first byte */
    for (unsigned op = 3; op <= 15; op++) {
        if (op >= 8 && op <= 10)
            continue;
        char b = (char)(0x80 | op);
        assert_int_equal(parse_error(S, 0, &b, 1), 1002);
    }
    /* a fragmented ping */
    assert_int_equal(parse_error(S, 0, "\x09", 1), 1002);
    /* unmasked from a client; masked from a server */
    assert_int_equal(parse_error(S, 0, "\x81\x05", 2), 1002);
    assert_int_equal(parse_error(C, 0, "\x81\x85", 2), 1002);
    assert_int_equal(parse_error(C, 0, "\x81\x05hello", 7), 0);
    /* a 126-byte ping */
    assert_int_equal(parse_error(S, 0, "\x89\xfe\x00\x7e", 4), 1002);
    /* non-minimal lengths */
    assert_int_equal(parse_error(S, 0, "\x82\xfe\x00\x7d\x01\x02\x03\x04", 8), 1002);
    assert_int_equal(
        parse_error(S, 0, "\x82\xff\x00\x00\x00\x00\x00\x00\xff\xff\x01\x02\x03\x04", 14), 1002);
    /* the 64-bit length's top bit */
    assert_int_equal(
        parse_error(S, 0, "\x82\xff\x80\x00\x00\x00\x00\x00\x00\x00\x01\x02\x03\x04", 14), 1002);
    /* the largest length is fine when max_frame allows it (the payload never comes) */
    assert_int_equal(
        parse_error(S, 0, "\x82\xff\x7f\xff\xff\xff\xff\xff\xff\xff\x01\x02\x03\x04", 14), 0);
    /* over max_frame: 1009 from the header alone */
    assert_int_equal(parse_error(S, 100, "\x82\xe5\x01\x02\x03\x04", 6), 1009);
    assert_int_equal(parse_error(S, 101, "\x82\xe5\x01\x02\x03\x04", 6), 0);
}

/* ---------------------------------------------------------------------------------------- */
/* The connection */

struct app {
    struct shmipc__ws_conn conn;
    struct shmipc__ws_limits limits;
    int echo;
    int fail_messages;    /* on_message returns an error */
    int close_on_message; /* on_message closes with 4000 */
    int reenter;          /* on_message calls process() */
    unsigned messages;
    size_t bytes;
    const char *last_data; /* where the last message was delivered from */
    size_t last_len;
    unsigned pings, pongs, closes, close_code;
    int reenter_rc;
};

static int app_message(void *ud, unsigned opcode, const char *data, size_t len)
{
    struct app *a = ud;
    a->messages++;
    a->bytes += len;
    a->last_data = data;
    a->last_len = len;
    if (a->reenter) {
        char b[1] = {0};
        a->reenter_rc = shmipc__ws_conn_process(&a->conn, b, 1);
    }
    if (a->close_on_message)
        assert_int_equal(shmipc__ws_conn_close(&a->conn, 4000, "done", 4), 0);
    if (a->echo)
        (void)shmipc__ws_conn_send(&a->conn, opcode, data, len, SHMIPC__WS_SEND_TRUSTED);
    return a->fail_messages ? SHMIPC_EIO : 0;
}

static void app_ping(void *ud, const char *d, size_t n)
{
    (void)d;
    (void)n;
    ((struct app *)ud)->pings++;
}

static void app_pong(void *ud, const char *d, size_t n)
{
    (void)d;
    (void)n;
    ((struct app *)ud)->pongs++;
}

static void app_close(void *ud, unsigned code, const char *reason, size_t len)
{
    struct app *a = ud;
    (void)reason;
    (void)len;
    a->closes++;
    a->close_code = code;
}

static const struct shmipc__ws_callbacks app_cbs = {
    .on_message = app_message, .on_ping = app_ping, .on_pong = app_pong, .on_close = app_close};

static struct app *app_new(const struct shmipc__ws_limits *in)
{
    struct app *a = calloc(1, sizeof *a);
    assert_int_equal(shmipc__ws_limits_resolve(&a->limits, in), 0);
    shmipc__ws_conn_init(&a->conn, &a->limits, &app_cbs, a);
    return a;
}

static void app_free(struct app *a)
{
    shmipc__ws_conn_destroy(&a->conn);
    free(a);
}

/* Appends one masked client frame to *w (grown with realloc). */
static void client_frame(char **w, size_t *n, int fin, unsigned op, const void *data, size_t len)
{
    static const uint8_t key[4] = {0xa1, 0xb2, 0xc3, 0xd4};
    uint8_t head[SHMIPC__WS_HEAD_MAX];
    size_t hl = shmipc__ws_frame_head_masked(head, fin, op, len, key);
    *w = realloc(*w, *n + hl + len);
    memcpy(*w + *n, head, hl);
    shmipc__ws_mask_copy(*w + *n + hl, data, len, key, 0);
    *n += hl + len;
}

/* Takes all queued output; returns its length (and its bytes in *out when not NULL). */
static size_t drain(struct shmipc__ws_conn *c, char **out)
{
    size_t total = 0;
    const char *p;
    size_t n;
    while ((n = shmipc__ws_conn_tx_peek(c, &p)) > 0) {
        if (out) {
            *out = realloc(*out, total + n);
            memcpy(*out + total, p, n);
        }
        total += n;
        shmipc__ws_conn_tx_sent(c, n);
    }
    return total;
}

/* A message whole in one receive is delivered from the receive buffer; one that arrives in
 * pieces (or fragmented) from the reassembly buffer, which is then released. */
static void whole_message_is_delivered_in_place(void **state)
{
    (void)state;
    struct app *a = app_new(NULL);
    char *w = NULL, *payload = malloc(100000);
    size_t n = 0;
    memset(payload, 'p', 100000);
    client_frame(&w, &n, 1, SHMIPC__WS_OP_BINARY, payload, 100000);
    assert_int_equal(shmipc__ws_conn_process(&a->conn, w, n), SHMIPC__WS_CONN_MORE);
    assert_int_equal(a->messages, 1);
    assert_true(a->last_data >= w && a->last_data + a->last_len <= w + n);
    assert_null(a->conn.msg); /* no reassembly buffer was needed */

    /* The same frame in two receives goes through the reassembly buffer. */
    free(w);
    w = NULL;
    n = 0;
    client_frame(&w, &n, 1, SHMIPC__WS_OP_BINARY, payload, 100000);
    assert_int_equal(shmipc__ws_conn_process(&a->conn, w, 5000), SHMIPC__WS_CONN_MORE);
    assert_non_null(a->conn.msg);
    assert_true(a->conn.msg_cap >= 5000 - 14 && a->conn.msg_cap <= 2 * 5000);
    assert_int_equal(shmipc__ws_conn_process(&a->conn, w + 5000, n - 5000), SHMIPC__WS_CONN_MORE);
    assert_int_equal(a->messages, 2);
    assert_int_equal(a->last_len, 100000);
    assert_false(a->last_data >= w && a->last_data < w + n);
    /* Larger than buffer_keep: released once delivered. */
    assert_null(a->conn.msg);
    assert_int_equal(a->conn.msg_cap, 0);
    free(w);
    free(payload);
    app_free(a);
}

/* The reassembly buffer follows the bytes that arrived, never a declared length: a header
 * announcing 16 MiB followed by 10 bytes costs 256 bytes, not 16 MiB. */
/* ---------------------------------------------------------------------------------------- */
/* The connection with the owner's read_now and write_now */

/*
 * A socket as the connection sees it through read_now: `bytes` is the client's stream, `pos`
 * what was taken (by process() or read_now), `avail` what has arrived so far. Messages are
 * kept, to compare.
 */
struct io_app {
    struct shmipc__ws_conn conn;
    struct shmipc__ws_limits limits;
    const char *bytes;
    size_t pos, avail;
    unsigned read_calls, reads;
    int read_all;    /* read_now returns all it is asked for while bytes have arrived */
    size_t cap_seen; /* the largest reassembly capacity seen inside read_now */
    char *msgs[8];
    size_t msg_lens[8];
    unsigned opcodes[8];
    unsigned messages, closes, close_code;
    /* write_now: takes at most write_take bytes (SIZE_MAX: all) into `wire` */
    size_t write_take;
    unsigned write_calls;
    char *wire;
    size_t wire_len;
};

static int io_message(void *ud, unsigned opcode, const char *data, size_t len)
{
    struct io_app *a = ud;
    assert_true(a->messages < 8);
    a->msgs[a->messages] = malloc(len + 1);
    memcpy(a->msgs[a->messages], data, len);
    a->msg_lens[a->messages] = len;
    a->opcodes[a->messages] = opcode;
    a->messages++;
    return 0;
}

static void io_close(void *ud, unsigned code, const char *reason, size_t len)
{
    struct io_app *a = ud;
    (void)reason;
    (void)len;
    a->closes++;
    a->close_code = code;
}

/* Returns a random share of what asked and arrived: often less than asked, sometimes none. */
static size_t io_read_now(void *ud, void *buf, size_t len)
{
    struct io_app *a = ud;
    a->read_calls++;
    if (a->conn.msg_cap > a->cap_seen)
        a->cap_seen = a->conn.msg_cap;
    size_t n = a->avail - a->pos;
    if (n > len)
        n = len;
    if (n > 0 && !a->read_all && rnd() % 4 != 0)
        n = 1 + (size_t)(rnd() % n);
    memcpy(buf, a->bytes + a->pos, n);
    a->pos += n;
    a->reads += n > 0;
    return n;
}

static size_t io_write_now(void *ud, const struct iovec *iov, int n)
{
    struct io_app *a = ud;
    size_t done = 0;
    a->write_calls++;
    for (int i = 0; i < n && done < a->write_take; i++) {
        size_t k = iov[i].iov_len;
        if (k > a->write_take - done)
            k = a->write_take - done;
        a->wire = realloc(a->wire, a->wire_len + k);
        memcpy(a->wire + a->wire_len, iov[i].iov_base, k);
        a->wire_len += k;
        done += k;
    }
    return done;
}

static const struct shmipc__ws_callbacks io_cbs = {
    .on_message = io_message,
    .on_close = io_close,
    .write_now = io_write_now,
    .read_now = io_read_now,
};

static struct io_app *io_app_new(void)
{
    struct io_app *a = calloc(1, sizeof *a);
    assert_int_equal(shmipc__ws_limits_resolve(&a->limits, NULL), 0);
    shmipc__ws_conn_init(&a->conn, &a->limits, &io_cbs, a);
    return a;
}

static void io_app_free(struct io_app *a)
{
    shmipc__ws_conn_destroy(&a->conn);
    for (unsigned i = 0; i < a->messages; i++)
        free(a->msgs[i]);
    free(a->wire);
    free(a);
}

/*
 * Feeds the stream as the server would: bytes arrive in random amounts; each receive (at most
 * 16 KiB) goes to process() from a buffer of its own, poisoned afterwards; read_now takes
 * what it can meanwhile. Stops at the end or once the connection closed.
 */
static void io_feed(struct io_app *a, size_t total)
{
    char *rx = malloc(16384);
    while (a->pos < total && shmipc__ws_conn_state(&a->conn) != SHMIPC__WS_CLOSED) {
        a->avail += 1 + (size_t)(rnd() % 40000);
        if (a->avail > total)
            a->avail = total;
        while (a->pos < a->avail && shmipc__ws_conn_state(&a->conn) != SHMIPC__WS_CLOSED) {
            size_t n = a->avail - a->pos;
            if (n > 16384)
                n = 16384;
            if (rnd() % 2)
                n = 1 + (size_t)(rnd() % n);
            memcpy(rx, a->bytes + a->pos, n);
            a->pos += n;
            (void)shmipc__ws_conn_process(&a->conn, rx, n);
            memset(rx, 0xdd, n);
        }
    }
    free(rx);
}

/* read_now is asked for the rest of a frame whose header declares 1 MiB, of which 20 000
 * bytes arrive: the buffer follows what arrived (doubling), not the declared length. */
static void *declared_but_not_sent(void *stream)
{
    struct io_app *a = io_app_new();
    const char *w = stream;
    a->bytes = w;
    a->avail = 20000;
    char *rx = malloc(16384);
    memcpy(rx, w, 16384);
    a->pos = 16384;
    assert_int_equal(shmipc__ws_conn_process(&a->conn, rx, 16384), SHMIPC__WS_CONN_MORE);
    while (a->pos < a->avail) {
        size_t k = a->avail - a->pos;
        memcpy(rx, w + a->pos, k);
        a->pos += k;
        assert_int_equal(shmipc__ws_conn_process(&a->conn, rx, k), SHMIPC__WS_CONN_MORE);
    }
    assert_true(a->read_calls > 0);
    assert_int_equal(a->messages, 0);
    assert_int_equal(a->conn.msg_len, 20000 - 14);
    assert_true(a->conn.msg_cap <= 2 * 20000);
    free(rx);
    io_app_free(a);
    return NULL;
}

/* Large payloads land straight in the message across many partial reads (a binary message,
 * text with characters split between reads, a fragmented message), each message whole and
 * in order; the reassembly buffer grows only with bytes that arrived. */
static void message_read_directly_in_pieces(void **state)
{
    (void)state;
    size_t big = (1u << 20) + 3, tlen = 100000, frag = 50000;
    char *bin = malloc(big), *text = malloc(tlen), *f1 = malloc(frag), *w = NULL;
    size_t n = 0;
    for (size_t i = 0; i < big; i++)
        bin[i] = (char)rnd();
    for (size_t i = 0; i < tlen; i++) /* "a", then U+20AC (3 bytes) 33333 times */
        text[i] = i == 0 ? 'a' : "\xe2\x82\xac"[(i - 1) % 3];
    for (size_t i = 0; i < frag; i++)
        f1[i] = (char)rnd();
    for (int round = 0; round < 20; round++) {
        struct io_app *a = io_app_new();
        free(w);
        w = NULL;
        n = 0;
        client_frame(&w, &n, 1, SHMIPC__WS_OP_BINARY, bin, big);
        client_frame(&w, &n, 1, SHMIPC__WS_OP_TEXT, text, tlen);
        client_frame(&w, &n, 0, SHMIPC__WS_OP_BINARY, f1, frag);
        client_frame(&w, &n, 1, SHMIPC__WS_OP_CONT, f1, frag);
        client_frame(&w, &n, 1, SHMIPC__WS_OP_BINARY, "tail", 4);
        a->bytes = w;
        io_feed(a, n);
        assert_int_equal(a->pos, n);
        assert_int_equal(a->closes, 0);
        assert_int_equal(a->messages, 4);
        assert_int_equal(a->msg_lens[0], big);
        assert_memory_equal(a->msgs[0], bin, big);
        assert_int_equal(a->opcodes[1], SHMIPC__WS_OP_TEXT);
        assert_int_equal(a->msg_lens[1], tlen);
        assert_memory_equal(a->msgs[1], text, tlen);
        assert_int_equal(a->msg_lens[2], 2 * frag);
        assert_memory_equal(a->msgs[2], f1, frag);
        assert_memory_equal(a->msgs[2] + frag, f1, frag);
        assert_int_equal(a->msg_lens[3], 4);
        assert_memory_equal(a->msgs[3], "tail", 4);
        assert_true(a->reads > 10); /* the direct path was taken, in many pieces */
        assert_true(a->cap_seen <= big);
        io_app_free(a);
    }

    /* A header that declares 1 MiB and 20 000 bytes of it, in a thread of its own (with no
     * spare buffers from the rounds above). */
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, declared_but_not_sent, w), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    free(w);
    free(bin);
    free(text);
    free(f1);
}

/* Invalid UTF-8 that arrives through read_now fails the text message (1007) at once. */
static void direct_read_checks_text(void **state)
{
    (void)state;
    size_t len = 70000;
    char *text = malloc(len), *w = NULL;
    size_t n = 0;
    memset(text, 'x', len);
    text[40000] = (char)0xff;
    client_frame(&w, &n, 1, SHMIPC__WS_OP_TEXT, text, len);
    struct io_app *a = io_app_new();
    a->bytes = w;
    a->avail = n; /* everything is in the socket: read_now takes it */
    char rx[16384];
    memcpy(rx, w, sizeof rx);
    a->pos = sizeof rx;
    int v = shmipc__ws_conn_process(&a->conn, rx, sizeof rx);
    for (int i = 0; i < 1000 && v != SHMIPC__WS_CONN_CLOSE && a->pos < n; i++) {
        size_t k = n - a->pos < sizeof rx ? n - a->pos : sizeof rx;
        memcpy(rx, w + a->pos, k);
        a->pos += k;
        v = shmipc__ws_conn_process(&a->conn, rx, k);
    }
    assert_int_equal(v, SHMIPC__WS_CONN_CLOSE);
    assert_int_equal(a->closes, 1);
    assert_int_equal(a->close_code, SHMIPC__WS_CLOSE_INVALID_DATA);
    assert_int_equal(a->messages, 0);
    assert_true(a->reads > 0);
    assert_true(a->pos < n); /* failed before the end of the frame */
    io_app_free(a);
    free(text);
    free(w);
}

/* One process() call reads at most SHMIPC__WS_READ_NOW_BUDGET through read_now, however much
 * is waiting; the next receive carries on. */
static void direct_read_is_bounded_per_call(void **state)
{
    (void)state;
    size_t len = 3u << 20;
    char *payload = malloc(len), *w = NULL, rx[16384];
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        payload[i] = (char)rnd();
    client_frame(&w, &n, 1, SHMIPC__WS_OP_BINARY, payload, len);
    struct io_app *a = io_app_new();
    a->bytes = w;
    a->avail = n;
    a->read_all = 1;
    unsigned calls = 0;
    while (a->pos < n && a->messages == 0) {
        size_t before = a->pos, k = n - a->pos < sizeof rx ? n - a->pos : sizeof rx;
        memcpy(rx, w + a->pos, k);
        a->pos += k;
        assert_int_equal(shmipc__ws_conn_process(&a->conn, rx, k), SHMIPC__WS_CONN_MORE);
        assert_true(a->pos - before <= k + SHMIPC__WS_READ_NOW_BUDGET);
        calls++;
    }
    assert_int_equal(a->messages, 1);
    assert_int_equal(a->msg_lens[0], len);
    assert_memory_equal(a->msgs[0], payload, len);
    assert_true(calls >= 3);
    io_app_free(a);
    free(payload);
    free(w);
}

/* write_now: a large message leaves from the caller's memory; what the socket does not take
 * at once (nothing, part of the head, part of the payload) is queued, copied, so the caller
 * may reuse its buffer; small messages, and any while output is queued, are queued in order. */
static void send_writes_now_and_queues_the_rest(void **state)
{
    (void)state;
    enum { LEN = 10000 };
    static const size_t takes[] = {0, 1, 2, 3, 4, 5, 1000, LEN + 3, LEN + 4, SIZE_MAX};
    char *payload = malloc(LEN);
    uint8_t head[SHMIPC__WS_HEAD_MAX];
    size_t hl = shmipc__ws_frame_head(head, 1, SHMIPC__WS_OP_BINARY, LEN);
    assert_int_equal(hl, 4);
    for (size_t t = 0; t < sizeof takes / sizeof takes[0]; t++) {
        struct io_app *a = io_app_new();
        char *queued = NULL;
        for (size_t i = 0; i < LEN; i++)
            payload[i] = (char)rnd();
        char *expect = malloc(hl + LEN);
        memcpy(expect, head, hl);
        memcpy(expect + hl, payload, LEN);
        a->write_take = takes[t];
        assert_int_equal(shmipc__ws_conn_send(&a->conn, SHMIPC__WS_OP_BINARY, payload, LEN, 0), 0);
        assert_int_equal(a->write_calls, 1);
        size_t taken = takes[t] < hl + LEN ? takes[t] : hl + LEN;
        assert_int_equal(a->wire_len, taken);
        assert_int_equal(shmipc__ws_conn_tx_queued(&a->conn), hl + LEN - taken);
        memset(payload, 0, LEN); /* the caller's again */
        size_t q = drain(&a->conn, &queued);
        assert_int_equal(q, hl + LEN - taken);
        if (taken)
            assert_memory_equal(a->wire, expect, taken);
        if (q)
            assert_memory_equal(queued, expect + taken, q);
        free(queued);
        free(expect);
        io_app_free(a);
    }

    /* Below SHMIPC__WS_WRITE_NOW_MIN, and behind queued output: queued, in order. */
    struct io_app *a = io_app_new();
    a->write_take = SIZE_MAX;
    memset(payload, 'q', LEN);
    assert_int_equal(shmipc__ws_conn_send(&a->conn, SHMIPC__WS_OP_BINARY, payload, 100, 0), 0);
    assert_int_equal(a->write_calls, 0);
    assert_int_equal(shmipc__ws_conn_send(&a->conn, SHMIPC__WS_OP_BINARY, payload, LEN, 0), 0);
    assert_int_equal(a->write_calls, 0);
    char *queued = NULL;
    assert_int_equal(drain(&a->conn, &queued), 2 + 100 + hl + LEN);
    assert_int_equal((uint8_t)queued[0], 0x82);
    assert_int_equal((uint8_t)queued[102], 0x82);
    free(queued);
    /* With the queue empty again, the next one goes at once. */
    assert_int_equal(shmipc__ws_conn_send(&a->conn, SHMIPC__WS_OP_BINARY, payload, LEN, 0), 0);
    assert_int_equal(a->write_calls, 1);
    assert_int_equal(shmipc__ws_conn_tx_queued(&a->conn), 0);
    io_app_free(a);
    free(payload);
}

static void declared_length_allocates_nothing(void **state)
{
    (void)state;
    struct app *a = app_new(NULL);
    char w[] = "\x82\xff\x00\x00\x00\x00\x01\x00\x00\x00\x01\x02\x03\x04"
               "0123456789";
    assert_int_equal(shmipc__ws_conn_process(&a->conn, w, sizeof w - 1), SHMIPC__WS_CONN_MORE);
    assert_true(a->conn.msg_cap <= 256);
    app_free(a);

    /* The largest 64-bit length: 1009 from the header, nothing allocated. */
    a = app_new(NULL);
    char huge[] = "\x82\xff\x7f\xff\xff\xff\xff\xff\xff\xff\x01\x02\x03\x04";
    assert_int_equal(shmipc__ws_conn_process(&a->conn, huge, sizeof huge - 1),
                     SHMIPC__WS_CONN_CLOSE);
    assert_int_equal(a->close_code, 1009);
    assert_null(a->conn.msg);
    char *out = NULL;
    assert_int_equal(drain(&a->conn, &out), 4);
    assert_memory_equal(out, "\x88\x02\x03\xf1", 4);
    free(out);
    app_free(a);
}

/* Fragments of many small frames cost O(log n) allocations: the capacity doubles. */
static void fragments_grow_geometrically(void **state)
{
    (void)state;
    struct app *a = app_new(NULL);
    char *w = NULL;
    size_t n = 0;
    client_frame(&w, &n, 0, SHMIPC__WS_OP_TEXT, "x", 1);
    for (int i = 0; i < 5000; i++)
        client_frame(&w, &n, 0, SHMIPC__WS_OP_CONT, "yy", 2);
    client_frame(&w, &n, 1, SHMIPC__WS_OP_CONT, "z", 1);
    size_t reallocs = 0, cap = 0;
    for (size_t at = 0; at < n; at += 8) {
        size_t piece = n - at < 8 ? n - at : 8;
        assert_int_equal(shmipc__ws_conn_process(&a->conn, w + at, piece), SHMIPC__WS_CONN_MORE);
        if (a->conn.msg_cap != cap) {
            reallocs++;
            cap = a->conn.msg_cap;
        }
    }
    assert_int_equal(a->messages, 1);
    assert_int_equal(a->last_len, 10002);
    assert_true(reallocs <= 10);
    free(w);
    app_free(a);
}

/* Backpressure: the echo of a client that does not read makes process() say PAUSE at the
 * high-water mark, and tx_sent() says resume once the queue has drained to half of it. */
static void pause_and_resume_at_the_marks(void **state)
{
    (void)state;
    struct shmipc__ws_limits lim = {.tx_high_water = 1000};
    struct app *a = app_new(&lim);
    a->echo = 1;
    char payload[300];
    memset(payload, 'e', sizeof payload);
    int v = SHMIPC__WS_CONN_MORE, sent = 0;
    while (v == SHMIPC__WS_CONN_MORE) {
        char *w = NULL;
        size_t n = 0;
        client_frame(&w, &n, 1, SHMIPC__WS_OP_BINARY, payload, sizeof payload);
        v = shmipc__ws_conn_process(&a->conn, w, n);
        free(w);
        sent++;
    }
    assert_int_equal(v, SHMIPC__WS_CONN_PAUSE);
    assert_int_equal(sent, 4); /* 4 x 304 bytes queued >= 1000 */
    assert_int_equal(shmipc__ws_conn_tx_queued(&a->conn), 4 * 304);
    const char *p;
    size_t n = shmipc__ws_conn_tx_peek(&a->conn, &p);
    assert_int_equal(n, 4 * 304);
    /* Drained to 616: not yet; to 500 or less: resume. */
    assert_int_equal(shmipc__ws_conn_tx_sent(&a->conn, 600), 0);
    assert_int_equal(shmipc__ws_conn_tx_sent(&a->conn, 116), 1);
    assert_int_equal(shmipc__ws_conn_tx_sent(&a->conn, 10), 0); /* said once */
    drain(&a->conn, NULL);
    app_free(a);
}

/* A ping flood from a client that does not read, fed past PAUSE: the queue stays bounded
 * because a pong at the tail is replaced rather than joined. */
static void ping_flood_is_bounded(void **state)
{
    (void)state;
    struct shmipc__ws_limits lim = {.tx_high_water = 4096};
    struct app *a = app_new(&lim);
    char *w = NULL;
    size_t n = 0;
    char body[125];
    memset(body, 'p', sizeof body);
    for (int i = 0; i < 2000; i++)
        client_frame(&w, &n, 1, SHMIPC__WS_OP_PING, body, sizeof body);
    char *copy = malloc(n);
    memcpy(copy, w, n);
    assert_int_equal(shmipc__ws_conn_process(&a->conn, copy, n), SHMIPC__WS_CONN_PAUSE);
    assert_int_equal(a->pings, 2000);
    assert_true(shmipc__ws_conn_tx_queued(&a->conn) <= 4096 + 127);
    /* Pieces, with output peeked (in flight) but never sent: still bounded. */
    for (int k = 0; k < 10; k++) {
        const char *p;
        (void)shmipc__ws_conn_tx_peek(&a->conn, &p);
        memcpy(copy, w, n);
        assert_true(shmipc__ws_conn_process(&a->conn, copy, n) >= 0);
        assert_true(shmipc__ws_conn_tx_queued(&a->conn) <= 2 * (4096 + 127));
    }
    /* The queue holds whole pongs, each answering a ping. */
    char *out = NULL;
    size_t total = drain(&a->conn, &out);
    assert_int_equal(total % 127, 0);
    for (size_t i = 0; i < total; i += 127)
        assert_memory_equal(out + i, "\x8a\x7dppp", 5);
    free(out);
    free(copy);
    free(w);
    app_free(a);
}

/* Sends are refused at tx_limit; pongs are not queued beyond a pong. */
static void send_refused_at_tx_limit(void **state)
{
    (void)state;
    struct shmipc__ws_limits lim = {.tx_high_water = 1000, .tx_limit = 2000};
    struct app *a = app_new(&lim);
    char data[700] = {0};
    assert_int_equal(shmipc__ws_conn_send(&a->conn, SHMIPC__WS_OP_BINARY, data, 700, 0), 0);
    assert_int_equal(shmipc__ws_conn_send(&a->conn, SHMIPC__WS_OP_BINARY, data, 700, 0), 0);
    assert_int_equal(shmipc__ws_conn_send(&a->conn, SHMIPC__WS_OP_BINARY, data, 700, 0), 0);
    assert_int_equal(shmipc__ws_conn_send(&a->conn, SHMIPC__WS_OP_BINARY, data, 700, 0),
                     SHMIPC_EAGAIN);
    assert_int_equal(shmipc__ws_conn_ping(&a->conn, "x", 1), SHMIPC_EAGAIN);
    drain(&a->conn, NULL);
    assert_int_equal(shmipc__ws_conn_send(&a->conn, SHMIPC__WS_OP_BINARY, data, 700, 0), 0);
    /* Misuse. */
    assert_int_equal(shmipc__ws_conn_send(&a->conn, SHMIPC__WS_OP_PING, data, 1, 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc__ws_conn_send(&a->conn, SHMIPC__WS_OP_TEXT, "\xff", 1, 0),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc__ws_conn_ping(&a->conn, data, 126), SHMIPC_EINVAL);
    app_free(a);
}

/* Peeked bytes stay put while more output is queued (an asynchronous send may hold them). */
static void peeked_bytes_stay_put(void **state)
{
    (void)state;
    struct app *a = app_new(NULL);
    assert_int_equal(shmipc__ws_conn_send(&a->conn, SHMIPC__WS_OP_TEXT, "first", 5, 0), 0);
    const char *p;
    size_t n = shmipc__ws_conn_tx_peek(&a->conn, &p);
    assert_int_equal(n, 7);
    char big[5000];
    memset(big, 'b', sizeof big);
    for (int i = 0; i < 20; i++)
        assert_int_equal(shmipc__ws_conn_send(&a->conn, SHMIPC__WS_OP_BINARY, big, 5000, 0), 0);
    const char *q;
    assert_int_equal(shmipc__ws_conn_tx_peek(&a->conn, &q), 7);
    assert_ptr_equal(p, q);
    assert_memory_equal(p,
                        "\x81\x05"
                        "first",
                        7);
    assert_int_equal(shmipc__ws_conn_tx_queued(&a->conn), 7 + 20 * 5004);
    shmipc__ws_conn_tx_sent(&a->conn, 3);
    assert_int_equal(shmipc__ws_conn_tx_peek(&a->conn, &q), 4);
    assert_ptr_equal(q, p + 3);
    shmipc__ws_conn_tx_sent(&a->conn, 4);
    assert_int_equal(shmipc__ws_conn_tx_peek(&a->conn, &q), 20 * 5004);
    shmipc__ws_conn_tx_sent(&a->conn, 20 * 5004);
    /* Idle: large buffers were released, trim releases the rest. */
    assert_true(a->conn.flight.cap <= a->limits.buffer_keep);
    shmipc__ws_conn_trim(&a->conn);
    assert_null(a->conn.flight.p);
    assert_null(a->conn.pending.p);
    assert_null(a->conn.msg);
    app_free(a);
}

/* The application closes: data and pings are ignored until the peer's close ends it all. */
static void application_close_waits_for_the_peer(void **state)
{
    (void)state;
    struct app *a = app_new(NULL);
    assert_int_equal(shmipc__ws_conn_close(&a->conn, 1001, "going", 5), 0);
    assert_int_equal(shmipc__ws_conn_state(&a->conn), SHMIPC__WS_CLOSING);
    assert_int_equal(shmipc__ws_conn_close(&a->conn, 1000, NULL, 0), SHMIPC_ECLOSED);
    assert_int_equal(shmipc__ws_conn_send(&a->conn, SHMIPC__WS_OP_TEXT, "x", 1, 0), SHMIPC_ECLOSED);
    char *out = NULL;
    assert_int_equal(drain(&a->conn, &out), 9);
    assert_memory_equal(out, "\x88\x07\x03\xe9going", 9);
    char *w = NULL;
    size_t n = 0;
    client_frame(&w, &n, 1, SHMIPC__WS_OP_TEXT, "ignored", 7);
    client_frame(&w, &n, 1, SHMIPC__WS_OP_PING, "no pong", 7);
    client_frame(&w, &n, 0, SHMIPC__WS_OP_BINARY, "frag", 4);
    assert_int_equal(shmipc__ws_conn_process(&a->conn, w, n), SHMIPC__WS_CONN_MORE);
    assert_int_equal(a->messages, 0);
    assert_int_equal(drain(&a->conn, NULL), 0);
    free(w);
    w = NULL;
    n = 0;
    client_frame(&w, &n, 1, SHMIPC__WS_OP_CLOSE, "\x03\xe9", 2);
    assert_int_equal(shmipc__ws_conn_process(&a->conn, w, n), SHMIPC__WS_CONN_CLOSE);
    assert_int_equal(a->closes, 1);
    assert_int_equal(a->close_code, 1001);
    assert_int_equal(drain(&a->conn, NULL), 0); /* no second close frame */
    shmipc__ws_conn_eof(&a->conn);              /* already closed: no callback */
    assert_int_equal(a->closes, 1);
    /* Invalid arguments. */
    struct app *b = app_new(NULL);
    assert_int_equal(shmipc__ws_conn_close(&b->conn, 1005, NULL, 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc__ws_conn_close(&b->conn, 0, "why", 3), SHMIPC_EINVAL);
    assert_int_equal(shmipc__ws_conn_close(&b->conn, 1000, "\xc0", 1), SHMIPC_EINVAL);
    assert_int_equal(shmipc__ws_conn_close(&b->conn, 0, NULL, 0), 0);
    assert_int_equal(drain(&b->conn, &out), 2);
    assert_memory_equal(out, "\x88\x00", 2);
    free(out);
    free(w);
    app_free(b);
    app_free(a);
}

/* The input ends without a close frame: on_close(1006), once. */
static void eof_reports_abnormal_closure(void **state)
{
    (void)state;
    struct app *a = app_new(NULL);
    shmipc__ws_conn_eof(&a->conn);
    assert_int_equal(a->closes, 1);
    assert_int_equal(a->close_code, 1006);
    shmipc__ws_conn_eof(&a->conn);
    assert_int_equal(a->closes, 1);
    char b[2] = {(char)0x81, 0};
    assert_int_equal(shmipc__ws_conn_process(&a->conn, b, 2), SHMIPC__WS_CONN_CLOSE);
    app_free(a);
}

/*
 * The peer is gone with input unread (a reset behind its close frame, shmipc__ws_conn_peer_gone):
 * what is left is looked through for the close frame alone. The message being reassembled and
 * the messages after it are dropped, a ping gets no pong, nothing can be queued, a queue above
 * the high-water mark does not PAUSE, and a close frame split anywhere (its first bytes fed
 * before the call) is reported with its code and reason, unanswered. Before, the owner could
 * only call eof() and the close was a 1006. Then eof() does nothing.
 */
static void peer_gone_reads_only_the_close_frame(void **state)
{
    (void)state;
    struct shmipc__ws_limits lim = {.tx_high_water = 64};
    struct app *a = app_new(&lim);
    char big[100] = {0};
    char *w = NULL;
    size_t n = 0;
    /* Output above the mark, as a server that paused the peer has. */
    assert_int_equal(shmipc__ws_conn_send(&a->conn, SHMIPC__WS_OP_BINARY, big, sizeof big, 0), 0);
    client_frame(&w, &n, 0, SHMIPC__WS_OP_TEXT, "part", 4);
    client_frame(&w, &n, 1, SHMIPC__WS_OP_CLOSE, "\x0f\xa1\x62ye", 5); /* 4001 "bye" */
    size_t split = n - 4; /* inside the close frame's payload */
    assert_int_equal(shmipc__ws_conn_process(&a->conn, w, split), SHMIPC__WS_CONN_PAUSE);
    shmipc__ws_conn_peer_gone(&a->conn);
    shmipc__ws_conn_peer_gone(&a->conn); /* idempotent */
    assert_int_equal(shmipc__ws_conn_send(&a->conn, SHMIPC__WS_OP_TEXT, "x", 1, 0), SHMIPC_ECLOSED);
    assert_int_equal(shmipc__ws_conn_ping(&a->conn, "x", 1), SHMIPC_ECLOSED);
    assert_int_equal(shmipc__ws_conn_close(&a->conn, 1000, NULL, 0), SHMIPC_ECLOSED);
    size_t queued = shmipc__ws_conn_tx_queued(&a->conn);
    assert_int_equal(shmipc__ws_conn_process(&a->conn, w + split, n - split),
                     SHMIPC__WS_CONN_CLOSE);
    assert_int_equal(a->messages, 0);
    assert_int_equal(a->closes, 1);
    assert_int_equal(a->close_code, 4001);
    assert_int_equal(shmipc__ws_conn_tx_queued(&a->conn), queued); /* no answer queued */
    shmipc__ws_conn_eof(&a->conn);
    assert_int_equal(a->closes, 1);
    app_free(a);

    /* Gone between frames: a continuation, a message, a ping, then the close without a code
     * (1005); no PAUSE though the queue is above the mark. */
    a = app_new(&lim);
    assert_int_equal(shmipc__ws_conn_send(&a->conn, SHMIPC__WS_OP_BINARY, big, sizeof big, 0), 0);
    free(w);
    w = NULL;
    n = 0;
    client_frame(&w, &n, 0, SHMIPC__WS_OP_TEXT, "frag", 4);
    assert_int_equal(shmipc__ws_conn_process(&a->conn, w, n), SHMIPC__WS_CONN_PAUSE);
    shmipc__ws_conn_peer_gone(&a->conn);
    queued = shmipc__ws_conn_tx_queued(&a->conn);
    n = 0;
    client_frame(&w, &n, 1, SHMIPC__WS_OP_CONT, "ment", 4);
    client_frame(&w, &n, 1, SHMIPC__WS_OP_BINARY, "msg", 3);
    client_frame(&w, &n, 1, SHMIPC__WS_OP_PING, "p", 1);
    assert_int_equal(shmipc__ws_conn_process(&a->conn, w, n), SHMIPC__WS_CONN_MORE);
    assert_int_equal(a->messages + a->pings + a->closes, 0);
    assert_int_equal(shmipc__ws_conn_tx_queued(&a->conn), queued);
    n = 0;
    client_frame(&w, &n, 1, SHMIPC__WS_OP_CLOSE, "", 0);
    assert_int_equal(shmipc__ws_conn_process(&a->conn, w, n), SHMIPC__WS_CONN_CLOSE);
    assert_int_equal(a->closes, 1);
    assert_int_equal(a->close_code, 1005);
    assert_int_equal(shmipc__ws_conn_tx_queued(&a->conn), queued);
    app_free(a);

    /* No close frame in what is left: eof() says 1006. */
    a = app_new(NULL);
    shmipc__ws_conn_peer_gone(&a->conn);
    n = 0;
    client_frame(&w, &n, 1, SHMIPC__WS_OP_TEXT, "late", 4);
    assert_int_equal(shmipc__ws_conn_process(&a->conn, w, n), SHMIPC__WS_CONN_MORE);
    shmipc__ws_conn_eof(&a->conn);
    assert_int_equal(a->messages, 0);
    assert_int_equal(a->closes, 1);
    assert_int_equal(a->close_code, 1006);
    app_free(a);
    free(w);
}

/* Callbacks: an application error is a 1011; closing from on_message; no re-entry. */
static void callbacks_may_close_but_not_reenter(void **state)
{
    (void)state;
    char *w = NULL, *out = NULL;
    size_t n = 0;
    client_frame(&w, &n, 1, SHMIPC__WS_OP_TEXT, "one", 3);
    client_frame(&w, &n, 1, SHMIPC__WS_OP_TEXT, "two", 3);

    struct app *a = app_new(NULL);
    a->fail_messages = 1;
    char *copy = malloc(n);
    memcpy(copy, w, n);
    assert_int_equal(shmipc__ws_conn_process(&a->conn, copy, n), SHMIPC__WS_CONN_CLOSE);
    assert_int_equal(a->messages, 1);
    assert_int_equal(a->close_code, 1011);
    assert_int_equal(drain(&a->conn, &out), 4);
    assert_memory_equal(out, "\x88\x02\x03\xf3", 4);
    app_free(a);

    a = app_new(NULL);
    a->close_on_message = 1;
    a->echo = 1; /* refused: the close went first */
    memcpy(copy, w, n);
    assert_int_equal(shmipc__ws_conn_process(&a->conn, copy, n), SHMIPC__WS_CONN_MORE);
    assert_int_equal(a->messages, 1); /* "two" came after the close: ignored */
    assert_int_equal(shmipc__ws_conn_state(&a->conn), SHMIPC__WS_CLOSING);
    assert_int_equal(drain(&a->conn, &out), 8);
    assert_memory_equal(out,
                        "\x88\x06\x0f\xa0"
                        "done",
                        8);
    app_free(a);

    a = app_new(NULL);
    a->reenter = 1;
    memcpy(copy, w, n);
    assert_int_equal(shmipc__ws_conn_process(&a->conn, copy, n), SHMIPC__WS_CONN_MORE);
    assert_int_equal(a->reenter_rc, SHMIPC_EBUSY);
    assert_int_equal(a->messages, 2);
    app_free(a);
    free(copy);
    free(out);
    free(w);
}

static void limits_resolve(void **state)
{
    (void)state;
    struct shmipc__ws_limits l;
    assert_int_equal(shmipc__ws_limits_resolve(&l, NULL), 0);
    assert_int_equal(l.max_message, 16u << 20);
    assert_int_equal(l.max_frame, 16u << 20);
    assert_int_equal(l.tx_high_water, 1u << 20);
    assert_int_equal(l.tx_limit, 16u << 20);
    assert_int_equal(l.buffer_keep, 1024);
    struct shmipc__ws_limits in = {.max_message = 1000};
    assert_int_equal(shmipc__ws_limits_resolve(&l, &in), 0);
    assert_int_equal(l.max_frame, 1000);
    in = (struct shmipc__ws_limits){.max_message = 1000, .max_frame = 1001};
    assert_int_equal(shmipc__ws_limits_resolve(&l, &in), SHMIPC_EINVAL);
    in = (struct shmipc__ws_limits){.max_message = (1ull << 30) + 1};
    assert_int_equal(shmipc__ws_limits_resolve(&l, &in), SHMIPC_EINVAL);
    in = (struct shmipc__ws_limits){.tx_high_water = 100, .tx_limit = 99};
    assert_int_equal(shmipc__ws_limits_resolve(&l, &in), SHMIPC_EINVAL);
    in = (struct shmipc__ws_limits){.tx_high_water = 64u << 20};
    assert_int_equal(shmipc__ws_limits_resolve(&l, &in), 0);
    assert_int_equal(l.tx_limit, 64u << 20);
}

/* The connection struct stays small: what an idle connection costs before any buffer. */
static void idle_connection_is_small(void **state)
{
    (void)state;
    print_message("sizeof(struct shmipc__ws_conn) = %zu\n", sizeof(struct shmipc__ws_conn));
    assert_true(sizeof(struct shmipc__ws_conn) <= 384);
}

/* ---------------------------------------------------------------------------------------- */
/* Handshake pieces the fixtures do not reach */

static void handshake_is_upgrade_and_response_struct(void **state)
{
    (void)state;
    static const char req_text[] = "GET /chat HTTP/1.1\r\nHost: h\r\nupgrade: h2c, WebSocket\r\n"
                                   "connection: keep-alive, Upgrade\r\n"
                                   "sec-websocket-version: 13\r\n"
                                   "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                                   "Sec-WebSocket-Protocol: a, b\r\n"
                                   "Sec-WebSocket-Protocol: c\r\n\r\n";
    struct shmipc__http_limits lim;
    shmipc__http_limits_resolve(&lim, NULL);
    struct shmipc__http_field fields[64];
    struct shmipc__http_parser p;
    shmipc__http_parser_init(&p, &lim, fields);
    assert_int_equal(shmipc__http_parse_head(&p, req_text, sizeof req_text - 1),
                     (int)sizeof req_text - 1);
    assert_true(shmipc__ws_is_upgrade(&p.req));
    static const char *const protocols[] = {"x", "c", "a"};
    struct shmipc__ws_handshake hs;
    assert_int_equal(shmipc__ws_handshake_check(&hs, &p.req, protocols, 3), 0);
    assert_int_equal(hs.protocol, 1); /* "c": the server's first preference the client offers */
    struct shmipc__http_response resp;
    shmipc__ws_handshake_response(&hs, &resp);
    assert_int_equal(resp.status, 101);
    assert_int_equal(resp.nheaders, 4);
    assert_string_equal(resp.headers[2].value, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    assert_string_equal(resp.headers[3].value, "c");
    assert_int_equal(shmipc__http_response_closes(&resp), 0);
    /* No list given: no subprotocol. */
    assert_int_equal(shmipc__ws_handshake_check(&hs, &p.req, NULL, 0), 0);
    assert_int_equal(hs.protocol, -1);
    /* Too small an output. */
    char out[40];
    assert_int_equal(shmipc__ws_handshake_write(&hs, out, sizeof out, NULL, NULL), SHMIPC_ENOSPC);

    static const char plain[] = "GET / HTTP/1.1\r\nHost: h\r\n\r\n";
    shmipc__http_parser_init(&p, &lim, fields);
    assert_true(shmipc__http_parse_head(&p, plain, sizeof plain - 1) > 0);
    assert_false(shmipc__ws_is_upgrade(&p.req));
    assert_int_equal(shmipc__ws_handshake_check(&hs, &p.req, NULL, 0), SHMIPC_EPROTO);
    assert_int_equal(hs.status, 400);
    shmipc__ws_handshake_response(&hs, &resp);
    assert_true(shmipc__http_response_closes(&resp));
}

int main(void)
{
    static const struct CMUnitTest tests[] = {
        cmocka_unit_test(sha1_fips_vectors),
        cmocka_unit_test(sha1_pieces_match_whole),
        cmocka_unit_test(base64_rfc4648_vectors),
        cmocka_unit_test(base64_decode_is_strict),
        cmocka_unit_test(accept_rfc6455_example),
        cmocka_unit_test(utf8_stress_cases),
        cmocka_unit_test(utf8_fails_at_the_first_impossible_byte),
        cmocka_unit_test(utf8_agrees_with_reference),
        cmocka_unit_test(utf8_every_code_point),
        cmocka_unit_test(utf8_incremental_split),
        cmocka_unit_test(utf8_truncate_at_boundary),
        cmocka_unit_test(mask_every_offset_and_length),
        cmocka_unit_test(mask_copy_every_alignment),
        cmocka_unit_test(frame_head_lengths),
        cmocka_unit_test(frame_iov_references_the_payload),
        cmocka_unit_test(close_payload_cuts_reason_at_a_character),
        cmocka_unit_test(control_frames),
        cmocka_unit_test(close_codes),
        cmocka_unit_test(parser_round_trips_in_pieces),
        cmocka_unit_test(parser_frame_whole_is_one_data_event),
        cmocka_unit_test(parser_header_errors),
        cmocka_unit_test(whole_message_is_delivered_in_place),
        cmocka_unit_test(message_read_directly_in_pieces),
        cmocka_unit_test(direct_read_checks_text),
        cmocka_unit_test(direct_read_is_bounded_per_call),
        cmocka_unit_test(send_writes_now_and_queues_the_rest),
        cmocka_unit_test(declared_length_allocates_nothing),
        cmocka_unit_test(fragments_grow_geometrically),
        cmocka_unit_test(pause_and_resume_at_the_marks),
        cmocka_unit_test(ping_flood_is_bounded),
        cmocka_unit_test(send_refused_at_tx_limit),
        cmocka_unit_test(peeked_bytes_stay_put),
        cmocka_unit_test(application_close_waits_for_the_peer),
        cmocka_unit_test(eof_reports_abnormal_closure),
        cmocka_unit_test(peer_gone_reads_only_the_close_frame),
        cmocka_unit_test(callbacks_may_close_but_not_reenter),
        cmocka_unit_test(limits_resolve),
        cmocka_unit_test(idle_connection_is_small),
        cmocka_unit_test(handshake_is_upgrade_and_response_struct),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
