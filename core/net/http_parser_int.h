/*
 * Private to the HTTP request parser's two files: http_parser.c (the head) and http_body.c
 * (the body decoder). The character classes, the parser's states, its failure path and the
 * two grammar pieces the body decoder reuses. Nothing else includes it; the rest of the
 * library uses http_parser.h.
 */
#ifndef SHMIPC_CORE_NET_HTTP_PARSER_INT_H
#define SHMIPC_CORE_NET_HTTP_PARSER_INT_H

#include "net/http_parser.h"

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "shmipc.h"

/* Character classes, one bit each (RFC 9110 §5.6.2, §5.5, §5.6.4; RFC 3986 for hosts). */
enum {
    C_TCHAR = 0x01,  /* token character */
    C_FIELD = 0x02,  /* may appear in a field value: VCHAR, obs-text, SP, HTAB */
    C_TARGET = 0x04, /* may appear in a request target: 0x21-0x7E */
    C_HEX = 0x08,    /* HEXDIG */
    C_HOST = 0x10,   /* unreserved, sub-delims, ":", "[", "]", "%" */
    C_QDTEXT = 0x20, /* may appear unescaped in a quoted-string */
    C_OWS = 0x40,    /* SP or HTAB */
};

/* One entry per byte value (http_parser.c). */
extern const uint8_t shmipc__http_cls[256];
#define IS(c, k) ((shmipc__http_cls[(unsigned char)(c)] & (k)) != 0)

enum parser_state {
    P_IDLE = 0, /* between requests: the next call starts a new one */
    P_REQLINE,  /* reading the request line (or the empty lines before it) */
    P_FIELDS,   /* reading field lines */
    P_BODY,     /* the head is done; the body decoder runs */
    P_FAILED,   /* a status was reported; the connection must close */
};

enum body_state {
    B_LENGTH = 0, /* Content-Length bytes remain */
    B_SIZE,       /* reading a chunk-size line */
    B_DATA,       /* chunk data remains */
    B_DATA_END,   /* the CRLF after chunk data */
    B_TRAILER,    /* reading trailer field lines */
    B_DONE,
};

/* Marks the parser failed with `status`; every later call reports the same status. */
static inline int fail(struct shmipc__http_parser *p, int status, const char *what)
{
    p->status = (uint16_t)status;
    p->state = P_FAILED;
    return shmipc__fail(SHMIPC_EPROTO, "http %d: %s", status, what);
}

static inline unsigned char lower(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') ? (unsigned char)(c + 32) : c;
}

/*
 * Validates `*( BWS ";" BWS name [ BWS "=" BWS ( token / quoted-string ) ] )` in [i, e): the
 * grammar of chunk extensions and of transfer-coding parameters. Returns 1 when valid.
 */
int shmipc__http_valid_params(const char *b, size_t i, size_t e);
/*
 * `field-name ":" OWS field-value OWS` in [s, e), stored as the next entry of the field array
 * (offsets from `b`). `trailer` says which count grows. Returns 0, or fail()'s code.
 */
int shmipc__http_field_line(struct shmipc__http_parser *p, const char *b, size_t s, size_t e,
                            int trailer);

#endif
