/*
 * The small codecs a WebSocket server needs, written here so that the library depends on no
 * crypto package: SHA-1 (FIPS 180-4, used only for Sec-WebSocket-Accept, where its weakness
 * does not matter), base64 (RFC 4648 §4, the padded standard alphabet) and a UTF-8 validator
 * (RFC 3629) built as a byte-class DFA in the manner of Bjoern Hoehrmann's decoder, so that
 * text can be validated incrementally, a fragment at a time, and rejected at the first byte
 * that can never be part of valid UTF-8.
 *
 * Nothing here allocates, and everything is safe to call from any thread.
 */
#ifndef SHMIPC_CORE_NET_WS_CODEC_H
#define SHMIPC_CORE_NET_WS_CODEC_H

#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------------------------------- */
/* SHA-1 */

#define SHMIPC__SHA1_LEN 20

/* A running digest. Initialise with shmipc__sha1_init(). */
struct shmipc__sha1 {
    uint32_t h[5];
    uint64_t bytes;    /* message bytes hashed so far */
    uint8_t block[64]; /* a partial block */
};

void shmipc__sha1_init(struct shmipc__sha1 *s);

/* Hashes `len` more bytes; bytes may be fed in any number of calls. */
void shmipc__sha1_update(struct shmipc__sha1 *s, const void *data, size_t len);

/* Pads, writes the digest into `out` and leaves `s` to be initialised again. */
void shmipc__sha1_final(struct shmipc__sha1 *s, uint8_t out[SHMIPC__SHA1_LEN]);

/* The digest of one buffer. */
void shmipc__sha1(const void *data, size_t len, uint8_t out[SHMIPC__SHA1_LEN]);

/* ---------------------------------------------------------------------------------------- */
/* base64 */

/* Characters that encode `n` bytes (with padding), not counting a NUL. */
#define SHMIPC__BASE64_LEN(n) ((((n) + 2) / 3) * 4)

/* Encodes in[0..len) with padding into `out` and NUL-terminates it; returns the length. */
size_t shmipc__base64_encode(const void *in, size_t len, char *out);

/*
 * Decodes the padded base64 text in[0..len) into out[0..cap). Strict: the length must be a
 * multiple of 4, padding only at the end, no whitespace, and the unused bits of the last
 * character must be zero (the canonical encoding). Returns the number of bytes decoded, or -1
 * for invalid text or when `cap` is too small.
 */
long shmipc__base64_decode(const char *in, size_t len, uint8_t *out, size_t cap);

/* ---------------------------------------------------------------------------------------- */
/* UTF-8 */

/*
 * Validator states. ACCEPT is the only state in which a text may end; REJECT is absorbing:
 * once reached, no continuation can make the text valid. The other values are internal
 * (a code point is incomplete).
 */
#define SHMIPC__UTF8_ACCEPT 0u
#define SHMIPC__UTF8_REJECT 1u

/*
 * Advances the validator over s[0..len) from `state` and returns the new state. Stops at the
 * first byte that makes the text invalid and returns SHMIPC__UTF8_REJECT; when `bad` is not
 * NULL it then receives that byte's index. ASCII runs are checked 8 bytes at a time.
 * Rejects overlong forms, surrogates (U+D800..U+DFFF), code points above U+10FFFF, and bytes
 * C0, C1, F5..FF; accepts U+0000 and the noncharacters (they are valid UTF-8).
 */
uint32_t shmipc__utf8_validate(uint32_t state, const void *s, size_t len, size_t *bad);

/* Whether s[0..len) is complete, valid UTF-8. */
static inline int shmipc__utf8_valid(const void *s, size_t len)
{
    return shmipc__utf8_validate(SHMIPC__UTF8_ACCEPT, s, len, NULL) == SHMIPC__UTF8_ACCEPT;
}

/*
 * The longest prefix of s[0..len), at most `max` bytes, that ends on a code point boundary.
 * `s` must be valid UTF-8 up to `len`; used to truncate a text without splitting a character.
 */
size_t shmipc__utf8_truncate(const void *s, size_t len, size_t max);

#endif
