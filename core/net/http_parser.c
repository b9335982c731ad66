/*
 * The HTTP/1.1 request parser: the head (the body decoder is http_body.c); see http_parser.h
 * for the contract and the choices made where RFC 9112 leaves room.
 *
 * The head is read line by line: memchr finds the LF, searching only bytes not searched
 * before and never past the limit that the line could still meet, so a client that sends a
 * huge head costs one bounded scan. A complete line is then validated in one pass with the
 * character classes below.
 *
 * This file owns the head: the character classes, the request line, the field lines and what
 * they mean for framing (Content-Length, Transfer-Encoding, Connection, Expect, Host). The
 * body and its chunked framing are decoded in http_body.c, which shares the classes, the
 * failure path and the field-line parser (for trailers) through http_parser_int.h.
 * May call: common/ (errors).
 */
#include "net/http_parser_int.h"

#include <string.h>

#include "common/error.h"
#include "shmipc.h"

/* Generated from the definitions in http_parser_int.h; one row per 16 byte values. */
const uint8_t shmipc__http_cls[256] = {
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x62, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x62, 0x37, 0x06, 0x27, 0x37, 0x37, 0x37, 0x37, 0x36, 0x36, 0x37, 0x37, 0x36, 0x37, 0x37, 0x26,
    0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x36, 0x36, 0x26, 0x36, 0x26, 0x26,
    0x26, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37,
    0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x36, 0x06, 0x36, 0x27, 0x37,
    0x27, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37,
    0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x26, 0x27, 0x26, 0x37, 0x00,
    0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22,
    0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22,
    0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22,
    0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22,
    0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22,
    0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22,
    0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22,
    0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22,
};

/*
 * Eight bytes at a time for the long runs (field values, targets): a word passes when no
 * byte is below `lo` or is DEL (and, with `ascii`, none has its high bit). A word that does
 * not pass is judged byte by byte with the table, so the shortcut never decides a rejection.
 */
static int plain8(const char *p, uint64_t lo, int ascii)
{
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    uint64_t x, del;
    memcpy(&x, p, 8);
    del = x ^ (ones * 0x7f);
    uint64_t bad = ((x - ones * lo) & ~x) | ((del - ones) & ~del);
    if (ascii)
        bad |= x;
    return (bad & highs) == 0;
}

/* What the fields of the head said (parser.facts). */
enum {
    F_HOST = 1u << 0,
    F_CL = 1u << 1,
    F_CL_HUGE = 1u << 2,
    F_TE = 1u << 3,
    F_TE_CHUNKED = 1u << 4,      /* chunked was seen */
    F_TE_CHUNKED_LAST = 1u << 5, /* the last coding so far is chunked */
    F_TE_CHUNKED_TWICE = 1u << 6,
    F_TE_OTHER = 1u << 7,
    F_CONN_CLOSE = 1u << 8,
    F_CONN_KEEP = 1u << 9,
    F_CONN_UPGRADE = 1u << 10,
    F_EXPECT_CONTINUE = 1u << 11,
    F_EXPECT_OTHER = 1u << 12,
};

int shmipc__http_limits_resolve(struct shmipc__http_limits *out,
                                const struct shmipc__http_limits *in)
{
    struct shmipc__http_limits l = {0};
    if (in)
        l = *in;
    if (l.max_request_line == 0)
        l.max_request_line = SHMIPC__HTTP_DEFAULT_MAX_REQUEST_LINE;
    if (l.max_head_bytes == 0)
        l.max_head_bytes = SHMIPC__HTTP_DEFAULT_MAX_HEAD_BYTES;
    if (l.max_headers == 0)
        l.max_headers = SHMIPC__HTTP_DEFAULT_MAX_HEADERS;
    if (l.max_chunk_line == 0)
        l.max_chunk_line = SHMIPC__HTTP_DEFAULT_MAX_CHUNK_LINE;
    if (l.max_body == 0)
        l.max_body = SHMIPC__HTTP_DEFAULT_MAX_BODY;
    if (l.max_request_line > SHMIPC__HTTP_LIMIT_MAX_HEAD_BYTES)
        return shmipc__fail(SHMIPC_EINVAL, "max_request_line: %u is above %u", l.max_request_line,
                            SHMIPC__HTTP_LIMIT_MAX_HEAD_BYTES);
    if (l.max_head_bytes > SHMIPC__HTTP_LIMIT_MAX_HEAD_BYTES)
        return shmipc__fail(SHMIPC_EINVAL, "max_head_bytes: %u is above %u", l.max_head_bytes,
                            SHMIPC__HTTP_LIMIT_MAX_HEAD_BYTES);
    if (l.max_chunk_line > SHMIPC__HTTP_LIMIT_MAX_HEAD_BYTES)
        return shmipc__fail(SHMIPC_EINVAL, "max_chunk_line: %u is above %u", l.max_chunk_line,
                            SHMIPC__HTTP_LIMIT_MAX_HEAD_BYTES);
    if (l.max_headers > SHMIPC__HTTP_LIMIT_MAX_HEADERS)
        return shmipc__fail(SHMIPC_EINVAL, "max_headers: %u is above %u", l.max_headers,
                            SHMIPC__HTTP_LIMIT_MAX_HEADERS);
    if (l.max_body > SHMIPC__HTTP_LIMIT_MAX_BODY)
        return shmipc__fail(SHMIPC_EINVAL, "max_body: %llu is above %llu",
                            (unsigned long long)l.max_body,
                            (unsigned long long)SHMIPC__HTTP_LIMIT_MAX_BODY);
    if (l.flags & ~SHMIPC__HTTP_LENIENT_LF)
        return shmipc__fail(SHMIPC_EINVAL, "flags: unknown bits 0x%x", l.flags);
    *out = l;
    return 0;
}

void shmipc__http_parser_init(struct shmipc__http_parser *p,
                              const struct shmipc__http_limits *limits,
                              struct shmipc__http_field *fields)
{
    memset(p, 0, sizeof *p);
    p->limits = limits;
    p->fields = fields;
    p->fields_cap = limits->max_headers;
    p->state = P_IDLE;
}

/* Case-insensitive comparison of s[0..n) with the lower-case literal `lit` of length n. */
static int ieq(const char *s, size_t n, const char *lit, size_t lit_len)
{
    if (n != lit_len)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (lower((unsigned char)s[i]) != (unsigned char)lit[i])
            return 0;
    return 1;
}

#define IEQ(s, n, lit) ieq((s), (n), lit, sizeof(lit) - 1)

static struct shmipc__http_slice slice(size_t off, size_t len)
{
    struct shmipc__http_slice s = {(uint32_t)off, (uint32_t)len};
    return s;
}

static int method_id(const char *m, size_t n)
{
    switch (n) {
    case 3:
        if (memcmp(m, "GET", 3) == 0)
            return SHMIPC__HTTP_GET;
        if (memcmp(m, "PUT", 3) == 0)
            return SHMIPC__HTTP_PUT;
        break;
    case 4:
        if (memcmp(m, "HEAD", 4) == 0)
            return SHMIPC__HTTP_HEAD;
        if (memcmp(m, "POST", 4) == 0)
            return SHMIPC__HTTP_POST;
        break;
    case 5:
        if (memcmp(m, "PATCH", 5) == 0)
            return SHMIPC__HTTP_PATCH;
        if (memcmp(m, "TRACE", 5) == 0)
            return SHMIPC__HTTP_TRACE;
        break;
    case 6:
        if (memcmp(m, "DELETE", 6) == 0)
            return SHMIPC__HTTP_DELETE;
        break;
    case 7:
        if (memcmp(m, "OPTIONS", 7) == 0)
            return SHMIPC__HTTP_OPTIONS;
        if (memcmp(m, "CONNECT", 7) == 0)
            return SHMIPC__HTTP_CONNECT;
        break;
    default:
        break;
    }
    return SHMIPC__HTTP_OTHER;
}

const char *shmipc__http_method_name(int method)
{
    static const char *const names[] = {NULL,     "GET",     "HEAD",  "POST",  "PUT",
                                        "DELETE", "OPTIONS", "PATCH", "TRACE", "CONNECT"};
    if (method > 0 && method < (int)(sizeof names / sizeof names[0]))
        return names[method];
    return NULL;
}

int shmipc__http_find_header(const struct shmipc__http_request *req, const char *name,
                             size_t name_len, uint32_t from)
{
    for (uint32_t i = from; i < req->nfields; i++) {
        const struct shmipc__http_field *f = &req->fields[i];
        if (f->name.len != name_len)
            continue;
        const char *s = req->base + f->name.off;
        size_t k = 0;
        while (k < name_len && lower((unsigned char)s[k]) == lower((unsigned char)name[k]))
            k++;
        if (k == name_len)
            return (int)i;
    }
    return -1;
}

/*
 * Validates `*( BWS ";" BWS name [ BWS "=" BWS ( token / quoted-string ) ] )` in [i, e): the
 * grammar of chunk extensions and of transfer-coding parameters. Returns 1 when valid.
 */
int shmipc__http_valid_params(const char *b, size_t i, size_t e)
{
    while (i < e) {
        while (i < e && IS(b[i], C_OWS))
            i++;
        if (i == e || b[i] != ';')
            return 0;
        i++;
        while (i < e && IS(b[i], C_OWS))
            i++;
        size_t n = i;
        while (i < e && IS(b[i], C_TCHAR))
            i++;
        if (i == n)
            return 0;
        size_t j = i;
        while (j < e && IS(b[j], C_OWS))
            j++;
        if (j == e || b[j] != '=')
            continue; /* a name without a value; the loop wants ";" next */
        i = j + 1;
        while (i < e && IS(b[i], C_OWS))
            i++;
        if (i < e && b[i] == '"') {
            for (i++;; i++) {
                if (i == e)
                    return 0;
                if (b[i] == '"')
                    break;
                if (b[i] == '\\') {
                    if (++i == e || !(IS(b[i], C_FIELD)))
                        return 0;
                } else if (!IS(b[i], C_QDTEXT)) {
                    return 0;
                }
            }
            i++;
        } else {
            size_t v = i;
            while (i < e && IS(b[i], C_TCHAR))
                i++;
            if (i == v)
                return 0;
        }
    }
    return 1;
}

/*
 * The next non-empty element of a comma-separated list in [*i, e), trimmed of OWS, honouring
 * quoted strings (RFC 9110 §5.6.1: empty elements are ignored). Returns 1 with [*s, *t), 0 at
 * the end of the list, -1 for an unterminated quoted string.
 */
static int next_element(const char *b, size_t *i, size_t e, size_t *s, size_t *t)
{
    while (*i < e) {
        size_t j = *i;
        int quoted = 0;
        for (; j < e; j++) {
            if (quoted) {
                if (b[j] == '\\')
                    j++;
                else if (b[j] == '"')
                    quoted = 0;
            } else if (b[j] == '"') {
                quoted = 1;
            } else if (b[j] == ',') {
                break;
            }
        }
        if (quoted || j > e)
            return -1;
        size_t a = *i, z = j;
        *i = j < e ? j + 1 : e;
        while (a < z && IS(b[a], C_OWS))
            a++;
        while (z > a && IS(b[z - 1], C_OWS))
            z--;
        if (a < z) {
            *s = a;
            *t = z;
            return 1;
        }
    }
    return 0;
}

/* The request target's form and path ([s, e) of the line is the target). */
static int target_form(struct shmipc__http_parser *p, const char *b, size_t s, size_t e)
{
    struct shmipc__http_request *r = &p->req;
    size_t i;
    if (r->method == SHMIPC__HTTP_CONNECT) {
        /* authority-form: host ":" port, nothing else (RFC 9112 §3.2.3). */
        size_t colon = e;
        for (i = s; i < e; i++) {
            if (!IS(b[i], C_HOST) || b[i] == '%')
                return fail(p, 400, "CONNECT needs an authority-form target (host:port)");
            if (b[i] == ':')
                colon = i;
        }
        if (colon == e || colon == s || colon + 1 == e)
            return fail(p, 400, "CONNECT needs an authority-form target (host:port)");
        for (i = colon + 1; i < e; i++)
            if (b[i] < '0' || b[i] > '9')
                return fail(p, 400, "CONNECT needs an authority-form target (host:port)");
        r->path = slice(e, 0);
        return 0;
    }
    if (e - s == 1 && b[s] == '*') {
        if (r->method != SHMIPC__HTTP_OPTIONS)
            return fail(p, 400, "asterisk-form target outside OPTIONS");
        r->path = slice(s, 1);
        return 0;
    }
    size_t path = s;
    if (b[s] != '/') {
        /* absolute-form: scheme ":" hier-part; the path follows an authority, if any. */
        i = s;
        if (!((b[i] >= 'a' && b[i] <= 'z') || (b[i] >= 'A' && b[i] <= 'Z')))
            return fail(p, 400, "request target is neither origin- nor absolute-form");
        while (i < e && (IS(b[i], C_HEX) || (b[i] >= 'a' && b[i] <= 'z') ||
                         (b[i] >= 'A' && b[i] <= 'Z') || b[i] == '+' || b[i] == '-' || b[i] == '.'))
            i++;
        if (i == e || b[i] != ':')
            return fail(p, 400, "request target is neither origin- nor absolute-form");
        i++;
        if (e - i >= 2 && b[i] == '/' && b[i + 1] == '/') {
            i += 2;
            while (i < e && b[i] != '/' && b[i] != '?' && b[i] != '#')
                i++;
        }
        path = i;
    }
    for (i = path; i < e && b[i] != '?'; i++)
        ;
    r->path = slice(path, i - path);
    return 0;
}

/* `method SP request-target SP HTTP-version` in [s, e). */
static int request_line(struct shmipc__http_parser *p, const char *b, size_t s, size_t e)
{
    struct shmipc__http_request *r = &p->req;
    size_t i = s;
    while (i < e && IS(b[i], C_TCHAR))
        i++;
    if (i == s || i == e || b[i] != ' ')
        return fail(p, 400, "request line: the method is not a token followed by one space");
    r->name = slice(s, i - s);
    r->method = (uint8_t)method_id(b + s, i - s);
    if (r->method == SHMIPC__HTTP_OTHER)
        r->flags |= SHMIPC__HTTP_UNKNOWN_METHOD;
    else if (r->method == SHMIPC__HTTP_HEAD)
        r->flags |= SHMIPC__HTTP_IS_HEAD;
    size_t t = ++i;
    while (e - i >= 8 && plain8(b + i, 0x21, 1))
        i += 8;
    while (i < e && IS(b[i], C_TARGET))
        i++;
    if (i == t || i == e || b[i] != ' ')
        return fail(p, 400, "request line: the target is not visible ASCII followed by one space");
    r->target = slice(t, i - t);
    size_t te = i++;
    /* The version, checked as nginx 1.22 does (ngx_http_parse_request_line), where RFC 9112's
     * HTTP/DIGIT.DIGIT is silent on what to answer: a major starts with 1-9 (HTTP/0.9, HTTP/01.1:
     * 400); a major above 1, seen at its first digit too big (HTTP/2, HTTP/10.0), is 505; the
     * minor is one or more digits whose value stays below 1000 (a digit added to a value above
     * 99 is 400), so HTTP/1.10 and HTTP/1.01 are HTTP/1.x. */
    if (e - i < 5 || memcmp(b + i, "HTTP/", 5) != 0)
        return fail(p, 400, "request line: the version does not start with HTTP/");
    i += 5;
    if (i == e || b[i] < '1' || b[i] > '9')
        return fail(p, 400, "request line: the version's major is not a digit 1-9");
    if (b[i] != '1')
        return fail(p, 505, "request line: only HTTP/1.x is supported");
    i++;
    if (i < e && b[i] >= '0' && b[i] <= '9')
        return fail(p, 505, "request line: only HTTP/1.x is supported");
    if (i == e || b[i] != '.' || ++i == e)
        return fail(p, 400, "request line: the version is not HTTP/1.DIGITS");
    unsigned minor = 0;
    for (; i < e; i++) {
        if (b[i] < '0' || b[i] > '9')
            return fail(p, 400, "request line: the version is not HTTP/1.DIGITS");
        if (minor > 99)
            return fail(p, 400, "request line: the minor is above 999");
        minor = minor * 10 + (unsigned)(b[i] - '0');
    }
    /* RFC 9112 §2.6: a 1.x above the highest minor implemented is answered as that one, so
     * every HTTP/1.x other than 1.0 is parsed, framed and answered exactly as HTTP/1.1. */
    r->minor = minor == 0 ? 0 : 1;
    return target_form(p, b, t, te);
}

/* The status for a request line that did not end within max_request_line bytes at `s`. */
static int request_line_too_long(struct shmipc__http_parser *p, const char *b, size_t s)
{
    size_t n = p->limits->max_request_line;
    for (size_t i = s; i < s + n; i++) {
        if (b[i] == ' ' && i > s)
            return fail(p, 414, "request line longer than max_request_line");
        if (!IS(b[i], C_TCHAR))
            return fail(p, 400, "request line: the method is not a token");
    }
    return fail(p, 501, "method longer than max_request_line");
}

static int content_length(struct shmipc__http_parser *p, const char *b, size_t s, size_t e)
{
    /* Strict list: elements of digits separated by commas; no empty element. */
    size_t i = s;
    for (;;) {
        while (i < e && IS(b[i], C_OWS))
            i++;
        size_t d = i;
        uint64_t v = 0;
        int huge = 0;
        for (; i < e && b[i] >= '0' && b[i] <= '9'; i++) {
            /* Stop carrying the number once it is past any body limit: no overflow. */
            if (v > SHMIPC__HTTP_LIMIT_MAX_BODY)
                huge = 1;
            else
                v = v * 10 + (uint64_t)(b[i] - '0');
        }
        if (v > SHMIPC__HTTP_LIMIT_MAX_BODY)
            huge = 1;
        if (i == d)
            return fail(p, 400, "Content-Length is not a number");
        while (i < e && IS(b[i], C_OWS))
            i++;
        if (i < e && b[i] != ',')
            return fail(p, 400, "Content-Length is not a number");
        if (p->facts & F_CL) {
            int was_huge = (p->facts & F_CL_HUGE) != 0;
            if (was_huge != huge || (!huge && v != p->cl_value))
                return fail(p, 400, "Content-Length values differ");
        }
        p->facts |= F_CL | (huge ? F_CL_HUGE : 0u);
        p->cl_value = v;
        if (i == e)
            return 0;
        i++; /* the comma */
    }
}

static int transfer_encoding(struct shmipc__http_parser *p, const char *b, size_t s, size_t e)
{
    size_t i = s, a, z;
    int rc;
    p->facts |= F_TE;
    while ((rc = next_element(b, &i, e, &a, &z)) == 1) {
        size_t n = a;
        while (n < z && IS(b[n], C_TCHAR))
            n++;
        if (n == a || !shmipc__http_valid_params(b, n, z))
            return fail(p, 400, "Transfer-Encoding is not a list of codings");
        p->te_codings++;
        if (IEQ(b + a, n - a, "chunked")) {
            if (n != z)
                return fail(p, 400, "chunked takes no parameters");
            if (p->facts & F_TE_CHUNKED)
                p->facts |= F_TE_CHUNKED_TWICE;
            p->facts |= F_TE_CHUNKED | F_TE_CHUNKED_LAST;
        } else {
            p->facts = (p->facts | F_TE_OTHER) & ~(uint32_t)F_TE_CHUNKED_LAST;
        }
    }
    if (rc < 0)
        return fail(p, 400, "Transfer-Encoding is not a list of codings");
    return 0;
}

static int connection(struct shmipc__http_parser *p, const char *b, size_t s, size_t e)
{
    size_t i = s, a, z;
    int rc;
    while ((rc = next_element(b, &i, e, &a, &z)) == 1) {
        for (size_t k = a; k < z; k++)
            if (!IS(b[k], C_TCHAR))
                return fail(p, 400, "Connection is not a list of tokens");
        if (IEQ(b + a, z - a, "close"))
            p->facts |= F_CONN_CLOSE;
        else if (IEQ(b + a, z - a, "keep-alive"))
            p->facts |= F_CONN_KEEP;
        else if (IEQ(b + a, z - a, "upgrade"))
            p->facts |= F_CONN_UPGRADE;
    }
    if (rc < 0)
        return fail(p, 400, "Connection is not a list of tokens");
    return 0;
}

static int expect(struct shmipc__http_parser *p, const char *b, size_t s, size_t e)
{
    size_t i = s, a, z;
    int rc;
    while ((rc = next_element(b, &i, e, &a, &z)) == 1) {
        if (IEQ(b + a, z - a, "100-continue"))
            p->facts |= F_EXPECT_CONTINUE;
        else
            p->facts |= F_EXPECT_OTHER;
    }
    if (rc < 0)
        p->facts |= F_EXPECT_OTHER;
    return 0;
}

/* The fields whose meaning the parser needs (names are tokens, already validated). */
static int known_field(struct shmipc__http_parser *p, const char *b, struct shmipc__http_field f)
{
    const char *name = b + f.name.off;
    size_t vs = f.value.off, ve = (size_t)f.value.off + f.value.len;
    switch (f.name.len) {
    case 4:
        if (IEQ(name, 4, "host")) {
            if (p->facts & F_HOST)
                return fail(p, 400, "more than one Host field");
            for (size_t i = vs; i < ve; i++)
                if (!IS(b[i], C_HOST))
                    return fail(p, 400, "Host is not a valid host[:port]");
            p->facts |= F_HOST;
            p->req.host = f.value;
        }
        return 0;
    case 6:
        return IEQ(name, 6, "expect") ? expect(p, b, vs, ve) : 0;
    case 10:
        return IEQ(name, 10, "connection") ? connection(p, b, vs, ve) : 0;
    case 14:
        return IEQ(name, 14, "content-length") ? content_length(p, b, vs, ve) : 0;
    case 17:
        return IEQ(name, 17, "transfer-encoding") ? transfer_encoding(p, b, vs, ve) : 0;
    default:
        return 0;
    }
}

/*
 * `field-name ":" OWS field-value OWS` in [s, e), stored as the next entry of the field array
 * (offsets from `b`). `trailer` says which count grows.
 */
int shmipc__http_field_line(struct shmipc__http_parser *p, const char *b, size_t s, size_t e,
                            int trailer)
{
    struct shmipc__http_request *r = &p->req;
    if (IS(b[s], C_OWS))
        return fail(p, 400, "obs-fold: a field line starts with whitespace");
    if (r->nfields + r->ntrailers >= p->fields_cap)
        return fail(p, 431, "more fields than max_headers");
    size_t i = s;
    while (i < e && IS(b[i], C_TCHAR))
        i++;
    if (i == e || b[i] != ':') {
        if (i < e && IS(b[i], C_OWS))
            return fail(p, 400, "whitespace between a field name and the colon");
        return fail(p, 400, "a field name is not a token followed by a colon");
    }
    if (i == s)
        return fail(p, 400, "empty field name");
    struct shmipc__http_field f;
    f.name = slice(s, i - s);
    for (i++; i < e && IS(b[i], C_OWS); i++)
        ;
    size_t v = i;
    while (e - i >= 8 && plain8(b + i, 0x20, 0))
        i += 8;
    for (; i < e; i++)
        if (!IS(b[i], C_FIELD))
            return fail(p, 400, "invalid byte in a field value (CTL, DEL, NUL or bare CR)");
    while (e > v && IS(b[e - 1], C_OWS))
        e--;
    f.value = slice(v, e - v);
    p->fields[r->nfields + r->ntrailers] = f;
    if (trailer) {
        r->ntrailers++;
        return 0;
    }
    r->nfields++;
    return known_field(p, b, f);
}

/* The empty line ended the head at `end`: cross-field checks, then the request is ready. */
static int end_of_head(struct shmipc__http_parser *p, const char *b, size_t end)
{
    struct shmipc__http_request *r = &p->req;
    uint32_t facts = p->facts;
    r->base = b;
    r->head_len = (uint32_t)end;
    if (r->minor == 1 && !(facts & F_HOST))
        return fail(p, 400, "HTTP/1.1 request without Host");
    if (facts & F_TE) {
        if (r->minor == 0)
            return fail(p, 400, "Transfer-Encoding in an HTTP/1.0 request");
        if (facts & F_CL)
            return fail(p, 400, "both Transfer-Encoding and Content-Length");
        if (!(facts & F_TE_CHUNKED_LAST))
            return fail(p, 400, "chunked is not the final transfer coding");
        if (facts & F_TE_CHUNKED_TWICE)
            return fail(p, 400, "chunked applied twice");
        if (facts & F_TE_OTHER)
            return fail(p, 501, "transfer coding other than chunked");
        r->body_kind = SHMIPC__HTTP_BODY_CHUNKED;
    } else if (facts & F_CL) {
        r->content_length = p->cl_value;
        r->body_kind = p->cl_value ? SHMIPC__HTTP_BODY_LENGTH : SHMIPC__HTTP_BODY_NONE;
    }
    if (r->minor == 1) {
        if (facts & F_EXPECT_OTHER)
            return fail(p, 417, "an expectation other than 100-continue");
        if (facts & F_EXPECT_CONTINUE)
            r->flags |= SHMIPC__HTTP_EXPECT_CONTINUE;
    }
    if ((facts & F_CL) && ((facts & F_CL_HUGE) || p->cl_value > p->limits->max_body))
        return fail(p, 413, "Content-Length above max_body");
    if (r->minor == 1 ? !(facts & F_CONN_CLOSE)
                      : (facts & (F_CONN_KEEP | F_CONN_CLOSE)) == F_CONN_KEEP)
        r->flags |= SHMIPC__HTTP_KEEP_ALIVE;
    if (facts & F_CONN_UPGRADE)
        r->flags |= SHMIPC__HTTP_CONN_UPGRADE;

    p->in = p->out = p->bline = p->bscan = p->trailer_start = 0;
    p->total = 0;
    if (r->body_kind == SHMIPC__HTTP_BODY_NONE) {
        p->bstate = B_DONE;
        p->state = P_IDLE;
    } else {
        p->bstate = r->body_kind == SHMIPC__HTTP_BODY_LENGTH ? B_LENGTH : B_SIZE;
        p->remaining = r->content_length;
        p->state = P_BODY;
    }
    return (int)end;
}

static void start_request(struct shmipc__http_parser *p)
{
    memset(&p->req, 0, sizeof p->req);
    p->req.fields = p->fields;
    p->line = p->scan = 0;
    p->facts = 0;
    p->te_codings = 0;
    p->cl_value = 0;
    p->in = p->out = 0;
    p->state = P_REQLINE;
}

int shmipc__http_parse_head(struct shmipc__http_parser *p, const char *buf, size_t len)
{
    const struct shmipc__http_limits *lim = p->limits;
    if (p->state == P_FAILED)
        return shmipc__fail(SHMIPC_EPROTO, "http %d: the connection already failed", p->status);
    if (p->state == P_BODY)
        return shmipc__fail(SHMIPC_EINVAL, "http: a body is still being decoded");
    if (p->state == P_IDLE)
        start_request(p);
    for (;;) {
        size_t line = p->line;
        /* The LF must come before `end`, or a limit is exceeded whatever follows. */
        size_t end = lim->max_head_bytes;
        int line_limit = 0;
        if (p->state == P_REQLINE && line + lim->max_request_line <= end) {
            end = line + lim->max_request_line;
            line_limit = 1;
        }
        size_t stop = len < end ? len : end;
        const char *lf = NULL;
        if (p->scan < stop)
            lf = memchr(buf + p->scan, '\n', stop - p->scan);
        if (!lf) {
            if (len >= end) {
                if (line_limit)
                    return request_line_too_long(p, buf, line);
                return fail(p, 431, "request head larger than max_head_bytes");
            }
            p->scan = (uint32_t)len;
            return 0;
        }
        size_t f = (size_t)(lf - buf), ce = f;
        if (f > line && buf[f - 1] == '\r')
            ce = f - 1;
        else if (!(lim->flags & SHMIPC__HTTP_LENIENT_LF))
            return fail(p, 400, "a line ends with a bare LF");
        p->line = p->scan = (uint32_t)(f + 1);
        int rc;
        if (p->state == P_REQLINE) {
            if (ce == line)
                continue; /* an empty line before the request line (RFC 9112 §2.2) */
            if ((rc = request_line(p, buf, line, ce)) != 0)
                return rc;
            p->state = P_FIELDS;
        } else if (ce == line) {
            return end_of_head(p, buf, f + 1);
        } else if ((rc = shmipc__http_field_line(p, buf, line, ce, 0)) != 0) {
            return rc;
        }
    }
}
