/* Description: the HTTP/1.1 request parser and body decoder: fields, limits, framing, splits. */
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

/* ---------------------------------------------------------------------------------------- */
/* A growable string for rendering results, so one assertion compares (and prints) it all. */

struct sbuf {
    char *p;
    size_t n, cap;
};

static void sb_put(struct sbuf *s, const char *d, size_t n)
{
    if (s->n + n + 1 > s->cap) {
        s->cap = (s->n + n + 1) * 2;
        s->p = realloc(s->p, s->cap);
        assert_non_null(s->p);
    }
    memcpy(s->p + s->n, d, n);
    s->n += n;
    s->p[s->n] = 0;
}

static void sb_printf(struct sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *s, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    sb_put(s, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* Bytes with anything outside printable ASCII escaped, so renders stay readable. */
static void sb_escaped(struct sbuf *s, const char *d, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)d[i];
        if (c >= 0x20 && c < 0x7f && c != '\\')
            sb_put(s, (const char *)&c, 1);
        else
            sb_printf(s, "\\x%02x", c);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* A driver that behaves like a connection: it keeps exactly the unconsumed bytes in a heap
 * buffer of exactly that size (so ASan sees any read past them), appends each piece, parses
 * every complete request, and renders what the parser reported. */

static void render_request(struct sbuf *s, const struct shmipc__http_parser *p, const char *body,
                           size_t body_len)
{
    const struct shmipc__http_request *r = &p->req;
    sb_put(s, "[", 1);
    sb_escaped(s, shmipc__http_at(r, r->name), r->name.len);
    sb_put(s, " ", 1);
    sb_escaped(s, shmipc__http_at(r, r->target), r->target.len);
    sb_printf(s, " 1.%u path=", r->minor);
    sb_escaped(s, shmipc__http_at(r, r->path), r->path.len);
    sb_printf(s, " method=%u flags=0x%x body_kind=%u cl=%llu head=%u\n", r->method, r->flags,
              r->body_kind, (unsigned long long)r->content_length, r->head_len);
    for (uint32_t i = 0; i < r->nfields; i++) {
        sb_escaped(s, shmipc__http_at(r, r->fields[i].name), r->fields[i].name.len);
        sb_put(s, ": <", 3);
        sb_escaped(s, shmipc__http_at(r, r->fields[i].value), r->fields[i].value.len);
        sb_put(s, ">\n", 2);
    }
    sb_printf(s, "body(%zu)=", body_len);
    sb_escaped(s, body, body_len);
    sb_put(s, "\n", 1);
    for (uint32_t i = r->nfields; i < r->nfields + r->ntrailers; i++) {
        sb_put(s, "trailer ", 8);
        sb_escaped(s, body + r->fields[i].name.off, r->fields[i].name.len);
        sb_put(s, ": <", 3);
        sb_escaped(s, body + r->fields[i].value.off, r->fields[i].value.len);
        sb_put(s, ">\n", 2);
    }
    sb_put(s, "]\n", 2);
}

static void keep_exact(char **buf, size_t len)
{
    if (len == 0) {
        free(*buf);
        *buf = NULL;
        return;
    }
    char *n = malloc(len);
    assert_non_null(n);
    memcpy(n, *buf, len);
    free(*buf);
    *buf = n; /* a fresh block each time: the buffer moves between calls, as it may */
}

/*
 * Feeds data[0..n) in pieces ending at cuts[0..ncuts) (then the rest) and returns the
 * rendering of every request, then "status N" on an error or "incomplete" when bytes are left.
 */
static char *drive(const char *data, size_t n, const size_t *cuts, size_t ncuts,
                   const struct shmipc__http_limits *in)
{
    struct shmipc__http_limits lim;
    assert_int_equal(shmipc__http_limits_resolve(&lim, in), 0);
    struct shmipc__http_field *fields = calloc(lim.max_headers, sizeof *fields);
    struct shmipc__http_parser p;
    shmipc__http_parser_init(&p, &lim, fields);
    struct sbuf out = {0};
    char *buf = NULL;
    size_t len = 0, fed = 0, head = 0;
    int in_body = 0;
    for (size_t k = 0; k <= ncuts; k++) {
        size_t end = k < ncuts ? cuts[k] : n;
        char *grown = malloc(len + (end - fed) + 1);
        assert_non_null(grown);
        if (len)
            memcpy(grown, buf, len);
        memcpy(grown + len, data + fed, end - fed);
        free(buf);
        buf = grown;
        len += end - fed;
        fed = end;
        keep_exact(&buf, len);
        for (;;) {
            if (!in_body) {
                if (len == 0)
                    break;
                int rc = shmipc__http_parse_head(&p, buf, len);
                if (rc == 0)
                    break;
                if (rc < 0) {
                    assert_int_equal(rc, SHMIPC_EPROTO);
                    sb_printf(&out, "status %u", p.status);
                    goto done;
                }
                head = (size_t)rc;
                in_body = 1;
            }
            size_t blen = len - head;
            int rc = shmipc__http_body_decode(&p, buf + head, &blen);
            len = head + blen;
            keep_exact(&buf, len);
            if (rc == 0)
                break;
            if (rc < 0) {
                assert_int_equal(rc, SHMIPC_EPROTO);
                sb_printf(&out, "status %u", p.status);
                goto done;
            }
            p.req.base = buf; /* the buffer moved since the head completed */
            render_request(&out, &p, buf + head, shmipc__http_body_len(&p));
            size_t used = head + shmipc__http_body_wire(&p);
            memmove(buf, buf + used, len - used);
            len -= used;
            keep_exact(&buf, len);
            in_body = 0;
        }
    }
    if (in_body || len)
        sb_put(&out, "incomplete", 10);
done:
    free(buf);
    free(fields);
    if (!out.p)
        sb_put(&out, "", 0);
    return out.p;
}

static char *drive_whole(const char *data, size_t n, const struct shmipc__http_limits *lim)
{
    return drive(data, n, NULL, 0, lim);
}

/* Every two-piece split and the one-byte drip give the same rendering as one piece. */
static void assert_split_invariant(const char *data, size_t n,
                                   const struct shmipc__http_limits *lim)
{
    char *whole = drive_whole(data, n, lim);
    for (size_t i = 1; i < n; i++) {
        char *split = drive(data, n, &i, 1, lim);
        if (strcmp(whole, split) != 0)
            print_message("split at byte %zu of %zu differs\n", i, n);
        assert_string_equal(split, whole);
        free(split);
    }
    size_t *drip = malloc(n * sizeof *drip);
    for (size_t i = 0; i < n; i++)
        drip[i] = i + 1;
    char *dripped = drive(data, n, drip, n, lim);
    assert_string_equal(dripped, whole);
    free(dripped);
    free(drip);
    free(whole);
}

/* The status a request gets from a whole-buffer parse (0 when it parses). */
static int status_of(const char *data, size_t n, const struct shmipc__http_limits *lim)
{
    char *r = drive_whole(data, n, lim);
    int status = 0;
    if (strncmp(r, "status ", 7) == 0)
        status = atoi(r + 7);
    else if (strstr(r, "status ") || strstr(r, "incomplete"))
        status = -1;
    free(r);
    return status;
}

#define S(lit) lit, sizeof(lit) - 1

/* A parser with its limits and fields, as a connection holds them. */
struct parser_setup {
    struct shmipc__http_limits lim;
    struct shmipc__http_field fields[64];
    struct shmipc__http_parser p;
};

/* Resolves `in` (NULL: the defaults) and returns a parser ready for its first request. */
static struct shmipc__http_parser *parser_setup(struct parser_setup *ps,
                                                const struct shmipc__http_limits *in)
{
    assert_int_equal(shmipc__http_limits_resolve(&ps->lim, in), 0);
    assert_in_range(ps->lim.max_headers, 1, sizeof ps->fields / sizeof ps->fields[0]);
    shmipc__http_parser_init(&ps->p, &ps->lim, ps->fields);
    return &ps->p;
}

/* ---------------------------------------------------------------------------------------- */

static void limits_resolve_defaults_and_bounds(void **state)
{
    (void)state;
    struct shmipc__http_limits l, in = {0};
    assert_int_equal(shmipc__http_limits_resolve(&l, NULL), 0);
    assert_int_equal(l.max_request_line, 8192);
    assert_int_equal(l.max_head_bytes, 16384);
    assert_int_equal(l.max_headers, 64);
    assert_int_equal(l.max_chunk_line, 1024);
    assert_int_equal(l.max_body, 1u << 20);
    assert_int_equal(l.flags, 0);
    in.max_headers = 8;
    assert_int_equal(shmipc__http_limits_resolve(&l, &in), 0);
    assert_int_equal(l.max_headers, 8);
    assert_int_equal(l.max_head_bytes, 16384);
    in.max_headers = SHMIPC__HTTP_LIMIT_MAX_HEADERS + 1;
    assert_int_equal(shmipc__http_limits_resolve(&l, &in), SHMIPC_EINVAL);
    assert_non_null(strstr(shmipc_error_detail(), "max_headers"));
    in.max_headers = 0;
    in.max_body = SHMIPC__HTTP_LIMIT_MAX_BODY + 1;
    assert_int_equal(shmipc__http_limits_resolve(&l, &in), SHMIPC_EINVAL);
    assert_non_null(strstr(shmipc_error_detail(), "max_body"));
    in.max_body = 0;
    in.max_head_bytes = SHMIPC__HTTP_LIMIT_MAX_HEAD_BYTES + 1;
    assert_int_equal(shmipc__http_limits_resolve(&l, &in), SHMIPC_EINVAL);
    assert_non_null(strstr(shmipc_error_detail(), "max_head_bytes"));
    in.max_head_bytes = 0;
    in.flags = 2;
    assert_int_equal(shmipc__http_limits_resolve(&l, &in), SHMIPC_EINVAL);
    assert_non_null(strstr(shmipc_error_detail(), "flags"));
}

static void simple_get(void **state)
{
    (void)state;
    static const char req[] = "GET /a/b?x=1 HTTP/1.1\r\nHost: example.com\r\n"
                              "User-Agent:  curl/8 \t\r\nAccept: */*\r\n\r\n";
    struct parser_setup ps;
    struct shmipc__http_parser *p = parser_setup(&ps, NULL);
    int rc = shmipc__http_parse_head(p, req, sizeof req - 1);
    assert_int_equal(rc, sizeof req - 1);
    const struct shmipc__http_request *r = &p->req;
    assert_ptr_equal(r->base, req);
    assert_int_equal(r->method, SHMIPC__HTTP_GET);
    assert_int_equal(r->minor, 1);
    assert_int_equal(r->flags, SHMIPC__HTTP_KEEP_ALIVE);
    assert_int_equal(r->body_kind, SHMIPC__HTTP_BODY_NONE);
    assert_int_equal(r->nfields, 3);
    assert_memory_equal(shmipc__http_at(r, r->target), "/a/b?x=1", 8);
    assert_int_equal(r->path.len, 4);
    assert_memory_equal(shmipc__http_at(r, r->path), "/a/b", 4);
    assert_int_equal(r->host.len, 11);
    assert_memory_equal(shmipc__http_at(r, r->host), "example.com", 11);
    /* OWS around the value is not part of it. */
    assert_int_equal(r->fields[1].value.len, 6);
    assert_memory_equal(shmipc__http_at(r, r->fields[1].value), "curl/8", 6);
    assert_int_equal(shmipc__http_find_header(r, "user-agent", 10, 0), 1);
    assert_int_equal(shmipc__http_find_header(r, "ACCEPT", 6, 0), 2);
    assert_int_equal(shmipc__http_find_header(r, "accept", 6, 3), -1);
    assert_int_equal(shmipc__http_find_header(r, "cookie", 6, 0), -1);
    /* No body: the decoder is done at once, and the next request can start. */
    size_t blen = 0;
    assert_int_equal(shmipc__http_body_decode(p, (char *)req + rc, &blen), 1);
    assert_int_equal(shmipc__http_body_len(p), 0);
    assert_int_equal(shmipc__http_body_wire(p), 0);
}

static void methods_are_recognised(void **state)
{
    (void)state;
    static const char *const names[] = {"GET",     "HEAD",  "POST",  "PUT",    "DELETE",
                                        "OPTIONS", "PATCH", "TRACE", "CONNECT"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char req[128];
        const char *target = strcmp(names[i], "CONNECT") == 0 ? "example.com:443" : "/";
        int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: h\r\n\r\n", names[i], target);
        struct shmipc__http_limits lim;
        shmipc__http_limits_resolve(&lim, NULL);
        struct shmipc__http_field fields[64];
        struct shmipc__http_parser p;
        shmipc__http_parser_init(&p, &lim, fields);
        assert_int_equal(shmipc__http_parse_head(&p, req, (size_t)n), n);
        assert_int_equal(p.req.method, i + 1);
        assert_string_equal(shmipc__http_method_name(p.req.method), names[i]);
        assert_int_equal(p.req.flags & SHMIPC__HTTP_UNKNOWN_METHOD, 0);
        assert_int_equal(!!(p.req.flags & SHMIPC__HTTP_IS_HEAD), i == 1);
    }
    /* Any other token is a method too, flagged; methods are case-sensitive. */
    static const char *const others[] = {"get", "PROPFIND", "M-SEARCH", "X!#$%&'*+-.^_`|~"};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        char req[128];
        int n = snprintf(req, sizeof req, "%s / HTTP/1.1\r\nHost: h\r\n\r\n", others[i]);
        struct shmipc__http_limits lim;
        shmipc__http_limits_resolve(&lim, NULL);
        struct shmipc__http_field fields[64];
        struct shmipc__http_parser p;
        shmipc__http_parser_init(&p, &lim, fields);
        assert_int_equal(shmipc__http_parse_head(&p, req, (size_t)n), n);
        assert_int_equal(p.req.method, SHMIPC__HTTP_OTHER);
        assert_int_equal(p.req.flags & SHMIPC__HTTP_UNKNOWN_METHOD, SHMIPC__HTTP_UNKNOWN_METHOD);
        assert_int_equal(p.req.name.len, strlen(others[i]));
    }
    assert_null(shmipc__http_method_name(SHMIPC__HTTP_OTHER));
    assert_null(shmipc__http_method_name(99));
}

/* One request per row and the status it gets (0: parses). */
struct status_case {
    const char *name;
    const char *req;
    size_t len; /* requests may hold NUL bytes */
    int status;
};

#define T(name, lit, status)                                                                       \
    {                                                                                              \
        name, lit, sizeof(lit) - 1, status                                                         \
    }

static void check_statuses(const struct status_case *cases, size_t n,
                           const struct shmipc__http_limits *lim)
{
    for (size_t i = 0; i < n; i++) {
        char want[160], got[160];
        int status = status_of(cases[i].req, cases[i].len, lim);
        snprintf(want, sizeof want, "%s: %d", cases[i].name, cases[i].status);
        snprintf(got, sizeof got, "%s: %d", cases[i].name, status);
        assert_string_equal(got, want);
    }
}

static void request_line_validation(void **state)
{
    (void)state;
    static const struct status_case cases[] = {
        T("http/1.0", "GET / HTTP/1.0\r\n\r\n", 0),
        T("http/1.1", "GET / HTTP/1.1\r\nHost: h\r\n\r\n", 0),
        T("http/1.2", "GET / HTTP/1.2\r\nHost: h\r\n\r\n", 0),
        T("http/1.9", "GET / HTTP/1.9\r\nHost: h\r\n\r\n", 0),
        T("http/1.2 without Host", "GET / HTTP/1.2\r\n\r\n", 400),
        T("http/3.0", "GET / HTTP/3.0\r\nHost: h\r\n\r\n", 505),
        T("http/2.0", "GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505),
        T("http/0.9", "GET / HTTP/0.9\r\n\r\n", 400),
        T("http/9.9", "GET / HTTP/9.9\r\n\r\n", 505),
        T("http/10.0", "GET / HTTP/10.0\r\nHost: h\r\n\r\n", 505),
        T("http/2 without minor", "GET / HTTP/2\r\nHost: h\r\n\r\n", 505),
        T("http/01.1", "GET / HTTP/01.1\r\nHost: h\r\n\r\n", 400),
        T("http/1.01", "GET / HTTP/1.01\r\nHost: h\r\n\r\n", 0),
        T("http/1.00 is 1.0", "GET / HTTP/1.00\r\n\r\n", 0),
        T("http/1.999", "GET / HTTP/1.999\r\nHost: h\r\n\r\n", 0),
        T("http/1.0001", "GET / HTTP/1.0001\r\nHost: h\r\n\r\n", 0),
        T("http/1.1000", "GET / HTTP/1.1000\r\nHost: h\r\n\r\n", 400),
        T("http/1.999999999999", "GET / HTTP/1.999999999999\r\nHost: h\r\n\r\n", 400),
        T("http/1.", "GET / HTTP/1.\r\nHost: h\r\n\r\n", 400),
        T("http/ alone", "GET / HTTP/\r\nHost: h\r\n\r\n", 400),
        T("lowercase version", "GET / http/1.1\r\nHost: h\r\n\r\n", 400),
        T("two-digit minor", "GET / HTTP/1.10\r\nHost: h\r\n\r\n", 0),
        T("no minor", "GET / HTTP/1\r\nHost: h\r\n\r\n", 400),
        T("no version", "GET /\r\n\r\n", 400),
        T("version with letter", "GET / HTTP/1.x\r\n\r\n", 400),
        T("space after version", "GET / HTTP/1.1 \r\nHost: h\r\n\r\n", 400),
        T("two spaces", "GET  / HTTP/1.1\r\nHost: h\r\n\r\n", 400),
        T("tab separator", "GET\t/ HTTP/1.1\r\nHost: h\r\n\r\n", 400),
        T("leading space", " GET / HTTP/1.1\r\nHost: h\r\n\r\n", 400),
        T("method with slash", "GE/T / HTTP/1.1\r\nHost: h\r\n\r\n", 400),
        T("method with NUL", "GE\0T / HTTP/1.1\r\nHost: h\r\n\r\n", 400),
        T("NUL in target", "GET /a\0b HTTP/1.1\r\nHost: h\r\n\r\n", 400),
        T("DEL in target", "GET /a\x7f HTTP/1.1\r\nHost: h\r\n\r\n", 400),
        T("obs-text in target", "GET /\xc3\xa9 HTTP/1.1\r\nHost: h\r\n\r\n", 400),
        T("bare CR in line", "GET /\r HTTP/1.1\r\nHost: h\r\n\r\n", 400),
        T("bare CR line end", "GET / HTTP/1.1\rHost: h\r\n\r\n", 400),
        T("bare LF line end", "GET / HTTP/1.1\nHost: h\r\n\r\n", 400),
        T("empty lines first", "\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n", 0),
        T("bare LF empty line first", "\nGET / HTTP/1.1\r\nHost: h\r\n\r\n", 400),
        T("asterisk OPTIONS", "OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n", 0),
        T("asterisk GET", "GET * HTTP/1.1\r\nHost: h\r\n\r\n", 400),
        T("absolute-form", "GET http://h/x?y HTTP/1.1\r\nHost: h\r\n\r\n", 0),
        T("absolute-form no path", "GET http://h HTTP/1.1\r\nHost: h\r\n\r\n", 0),
        T("relative target", "GET a/b HTTP/1.1\r\nHost: h\r\n\r\n", 400),
        T("scheme with digit first", "GET 1http://h/ HTTP/1.1\r\nHost: h\r\n\r\n", 400),
        T("authority outside CONNECT", "GET h:80 HTTP/1.1\r\nHost: h\r\n\r\n", 0),
        T("CONNECT authority", "CONNECT h:443 HTTP/1.1\r\nHost: h\r\n\r\n", 0),
        T("CONNECT origin-form", "CONNECT / HTTP/1.1\r\nHost: h\r\n\r\n", 400),
        T("CONNECT without port", "CONNECT h HTTP/1.1\r\nHost: h\r\n\r\n", 400),
        T("CONNECT port not digits", "CONNECT h:x HTTP/1.1\r\nHost: h\r\n\r\n", 400),
    };
    check_statuses(cases, sizeof cases / sizeof cases[0], NULL);
    /* "h:80" reads as absolute-form with scheme "h" and path "80"; no special case. */
}

static void field_validation(void **state)
{
    (void)state;
    static const struct status_case cases[] = {
        T("obs-fold", "GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n", 400),
        T("obs-fold tab", "GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n\tb\r\n\r\n", 400),
        T("space before first field", "GET / HTTP/1.1\r\n Host: h\r\n\r\n", 400),
        T("space before colon", "GET / HTTP/1.1\r\nHost : h\r\n\r\n", 400),
        T("tab before colon", "GET / HTTP/1.1\r\nHost\t: h\r\n\r\n", 400),
        T("no colon", "GET / HTTP/1.1\r\nHost: h\r\nX\r\n\r\n", 400),
        T("empty name", "GET / HTTP/1.1\r\nHost: h\r\n: v\r\n\r\n", 400),
        T("name with slash", "GET / HTTP/1.1\r\nHost: h\r\nX/Y: v\r\n\r\n", 400),
        T("name with NUL", "GET / HTTP/1.1\r\nHost: h\r\nX\0: v\r\n\r\n", 400),
        T("NUL in value", "GET / HTTP/1.1\r\nHost: h\r\nX: a\0b\r\n\r\n", 400),
        T("DEL in value", "GET / HTTP/1.1\r\nHost: h\r\nX: a\x7f\r\n\r\n", 400),
        T("CTL in value", "GET / HTTP/1.1\r\nHost: h\r\nX: a\x01\r\n\r\n", 400),
        T("bare CR in value", "GET / HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n", 400),
        T("CR CR LF", "GET / HTTP/1.1\r\nHost: h\r\nX: a\r\r\n\r\n", 400),
        T("bare LF field end", "GET / HTTP/1.1\r\nHost: h\nX: a\r\n\r\n", 400),
        T("bare LF head end", "GET / HTTP/1.1\r\nHost: h\r\n\n", 400),
        T("obs-text in value", "GET / HTTP/1.1\r\nHost: h\r\nX: \x80\xff\r\n\r\n", 0),
        T("empty value", "GET / HTTP/1.1\r\nHost: h\r\nX:\r\n\r\n", 0),
        T("tabs in value", "GET / HTTP/1.1\r\nHost: h\r\nX:\ta\tb\t\r\n\r\n", 0),
        T("missing Host", "GET / HTTP/1.1\r\n\r\n", 400),
        T("two Host", "GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 400),
        T("Host with slash", "GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400),
        T("Host with space", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400),
        T("Host with userinfo", "GET / HTTP/1.1\r\nHost: u@a\r\n\r\n", 400),
        T("Host empty", "GET / HTTP/1.1\r\nHost:\r\n\r\n", 0),
        T("Host IPv6 and port", "GET / HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n", 0),
        T("HOST upper case", "GET / HTTP/1.1\r\nHOST: a\r\n\r\n", 0),
        T("no Host in 1.0", "GET / HTTP/1.0\r\n\r\n", 0),
    };
    check_statuses(cases, sizeof cases / sizeof cases[0], NULL);
}

static void framing_validation(void **state)
{
    (void)state;
    static const struct status_case cases[] = {
        T("CL", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc", 0),
        T("CL leading zeros", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 003\r\n\r\nabc", 0),
        T("CL zero", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n", 0),
        T("CL same twice",
          "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n"
          "Content-Length: 3\r\n\r\nabc",
          0),
        T("CL same list", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3 , 3\r\n\r\nabc", 0),
        T("CL differ",
          "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n"
          "Content-Length: 4\r\n\r\nabcd",
          400),
        T("CL list differ", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3,4\r\n\r\nabc", 400),
        T("CL empty", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length:\r\n\r\n", 400),
        T("CL empty element", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3,\r\n\r\nabc", 400),
        T("CL negative", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n", 400),
        T("CL plus", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +1\r\n\r\na", 400),
        T("CL hex", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0x1\r\n\r\na", 400),
        T("CL inner space", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1 1\r\n\r\na", 400),
        T("CL overflow",
          "POST / HTTP/1.1\r\nHost: h\r\n"
          "Content-Length: 99999999999999999999\r\n\r\n",
          413),
        T("CL 2^64",
          "POST / HTTP/1.1\r\nHost: h\r\n"
          "Content-Length: 18446744073709551616\r\n\r\n",
          413),
        T("CL 2^64 then 0",
          "POST / HTTP/1.1\r\nHost: h\r\n"
          "Content-Length: 18446744073709551616\r\nContent-Length: 0\r\n\r\n",
          400),
        T("CL overflow twice",
          "POST / HTTP/1.1\r\nHost: h\r\n"
          "Content-Length: 99999999999999999999, 99999999999999999999\r\n\r\n",
          413),
        T("TE chunked", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
          0),
        T("TE Chunked case",
          "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: ChUnKeD\r\n\r\n"
          "0\r\n\r\n",
          0),
        T("TE empty elements",
          "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: , chunked ,\r\n\r\n"
          "0\r\n\r\n",
          0),
        T("TE and CL",
          "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
          "Content-Length: 5\r\n\r\n0\r\n\r\n",
          400),
        T("CL and TE",
          "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n"
          "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
          400),
        T("TE gzip chunked",
          "POST / HTTP/1.1\r\nHost: h\r\n"
          "Transfer-Encoding: gzip, chunked\r\n\r\n",
          501),
        T("TE two fields",
          "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n"
          "Transfer-Encoding: chunked\r\n\r\n",
          501),
        T("TE chunked gzip",
          "POST / HTTP/1.1\r\nHost: h\r\n"
          "Transfer-Encoding: chunked, gzip\r\n\r\n",
          400),
        T("TE gzip only", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n", 400),
        T("TE chunked twice",
          "POST / HTTP/1.1\r\nHost: h\r\n"
          "Transfer-Encoding: chunked, chunked\r\n\r\n",
          400),
        T("TE empty", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:\r\n\r\n", 400),
        T("TE chunked params",
          "POST / HTTP/1.1\r\nHost: h\r\n"
          "Transfer-Encoding: chunked;x=1\r\n\r\n",
          400),
        T("TE unknown with params",
          "POST / HTTP/1.1\r\nHost: h\r\n"
          "Transfer-Encoding: foo;q=\"a,b\", chunked\r\n\r\n",
          501),
        T("TE not a token", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chun ked\r\n\r\n",
          400),
        T("TE unterminated quote",
          "POST / HTTP/1.1\r\nHost: h\r\n"
          "Transfer-Encoding: foo;q=\"a, chunked\r\n\r\n",
          400),
        T("TE in 1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        T("Expect 100-continue",
          "POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-Continue\r\n"
          "Content-Length: 1\r\n\r\na",
          0),
        T("Expect other", "POST / HTTP/1.1\r\nHost: h\r\nExpect: 200-ok\r\n\r\n", 417),
        T("Expect list with other",
          "POST / HTTP/1.1\r\nHost: h\r\n"
          "Expect: 100-continue, x\r\n\r\n",
          417),
        T("Expect ignored in 1.0", "POST / HTTP/1.0\r\nExpect: 200-ok\r\n\r\n", 0),
        T("Connection not tokens", "GET / HTTP/1.1\r\nHost: h\r\nConnection: a b\r\n\r\n", 400),
    };
    check_statuses(cases, sizeof cases / sizeof cases[0], NULL);
}

/* Keep-alive: version default, then Connection tokens (a list, any case, any field). */
/* Values and targets are checked a word at a time; a bad byte is found at any position. */
static void every_byte_position_is_checked(void **state)
{
    (void)state;
    static const struct {
        unsigned char byte;
        int in_value; /* status with the byte in a field value */
        int in_target;
    } bytes[] = {
        {0x00, 400, 400}, {0x01, 400, 400}, {0x09, 0, 400},   {0x1f, 400, 400},
        {0x20, 0, 400},   {0x7e, 0, 0},     {0x7f, 400, 400}, {0x80, 0, 400},
        {0xff, 0, 400},   {'\r', 400, 400}, {'a', 0, 0},
    };
    char req[128];
    for (size_t k = 0; k < sizeof bytes / sizeof bytes[0]; k++) {
        for (size_t pos = 0; pos < 24; pos++) {
            /* "X: " + 24 value bytes, the k-th kind at pos (not first or last: OWS rules). */
            int n = snprintf(req, sizeof req, "GET /%s HTTP/1.1\r\nHost: h\r\nX: %s\r\n\r\n",
                             "abcdefghijklmnopqrstuvwx", "abcdefghijklmnopqrstuvwx");
            char *target = req + 5, *value = strstr(req, "X: ") + 3;
            char want[64], got[64];
            if (pos > 0 && pos < 23) {
                value[pos] = (char)bytes[k].byte;
                snprintf(want, sizeof want, "value 0x%02x at %zu: %d", bytes[k].byte, pos,
                         bytes[k].in_value);
                snprintf(got, sizeof got, "value 0x%02x at %zu: %d", bytes[k].byte, pos,
                         status_of(req, (size_t)n, NULL));
                assert_string_equal(got, want);
                value[pos] = 'v';
            }
            target[pos] = (char)bytes[k].byte;
            int status = status_of(req, (size_t)n, NULL);
            /* A space splits the line: the rest no longer reads as a version. */
            snprintf(want, sizeof want, "target 0x%02x at %zu: %d", bytes[k].byte, pos,
                     bytes[k].in_target);
            snprintf(got, sizeof got, "target 0x%02x at %zu: %d", bytes[k].byte, pos, status);
            assert_string_equal(got, want);
        }
    }
}

static void connection_semantics(void **state)
{
    (void)state;
    static const struct {
        const char *req;
        uint32_t flags;
    } cases[] = {
        {"GET / HTTP/1.1\r\nHost: h\r\n\r\n", SHMIPC__HTTP_KEEP_ALIVE},
        {"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", 0},
        {"GET / HTTP/1.1\r\nHost: h\r\nConnection: foo, CLOSE\r\n\r\n", 0},
        {"GET / HTTP/1.1\r\nHost: h\r\nConnection: foo\r\nConnection: Close\r\n\r\n", 0},
        {"GET / HTTP/1.1\r\nHost: h\r\nConnection: closed\r\n\r\n", SHMIPC__HTTP_KEEP_ALIVE},
        {"GET / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive\r\n\r\n", SHMIPC__HTTP_KEEP_ALIVE},
        {"GET / HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\n\r\n",
         SHMIPC__HTTP_KEEP_ALIVE | SHMIPC__HTTP_CONN_UPGRADE},
        {"GET / HTTP/1.0\r\n\r\n", 0},
        {"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", SHMIPC__HTTP_KEEP_ALIVE},
        {"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", SHMIPC__HTTP_KEEP_ALIVE},
        {"GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n", 0},
        {"HEAD / HTTP/1.0\r\n\r\n", SHMIPC__HTTP_IS_HEAD},
        {"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n",
         SHMIPC__HTTP_KEEP_ALIVE | SHMIPC__HTTP_EXPECT_CONTINUE},
        {"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct parser_setup ps;
        struct shmipc__http_parser *p = parser_setup(&ps, NULL);
        size_t n = strlen(cases[i].req);
        assert_int_equal(shmipc__http_parse_head(p, cases[i].req, n), n);
        assert_int_equal(p->req.flags, cases[i].flags);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Limits at their exact boundary: the limit passes, one byte (or field) more fails. */

static char *request_with_target(size_t target_len, size_t *n)
{
    /* "GET /aaa HTTP/1.1\r\n" is target_len + 15 bytes; then Host and the empty line. */
    char *r = malloc(target_len + 64);
    size_t k = 0;
    memcpy(r, "GET ", 4);
    k = 4;
    r[k++] = '/';
    memset(r + k, 'a', target_len - 1);
    k += target_len - 1;
    memcpy(r + k, " HTTP/1.1\r\nHost: h\r\n\r\n", 22);
    *n = k + 22;
    return r;
}

/* A request with a target of `target_len` bytes gets `status` (0: it parses). */
static void expect_target_status(size_t target_len, int status)
{
    size_t n;
    char *r = request_with_target(target_len, &n);
    assert_int_equal(status_of(r, n, NULL), status);
    free(r);
}

static void request_line_limit_boundary(void **state)
{
    (void)state;
    size_t n;
    /* 8192 bytes with CRLF: 4 + target + 11 = 8192. */
    expect_target_status(8192 - 15, 0);
    expect_target_status(8192 - 15 + 1, 414);
    /* Detected as soon as the limit is passed, without waiting for the LF. */
    char *r = request_with_target(20000, &n);
    /* 8192 bytes without an LF: the line is at least 8193 bytes long already. */
    assert_int_equal(status_of(r, 8192, NULL), 414);
    assert_int_equal(status_of(r, 8191, NULL), -1);
    free(r);
    /* A method that fills the line is 501; garbage is 400. */
    char *m = malloc(9000);
    memset(m, 'M', 9000);
    assert_int_equal(status_of(m, 9000, NULL), 501);
    m[100] = '\x01';
    assert_int_equal(status_of(m, 9000, NULL), 400);
    free(m);
}

static char *request_with_padding(size_t value_len, size_t nextra, size_t *n)
{
    /* "GET / HTTP/1.1\r\n" (16) "Host: h\r\n" (9) ["X: y\r\n" (6) * nextra]
     * "P: <value>\r\n" (5 + value_len) "\r\n" (2). */
    char *r = malloc(64 + 6 * nextra + value_len);
    size_t k = 0;
    memcpy(r, "GET / HTTP/1.1\r\nHost: h\r\n", 25);
    k = 25;
    for (size_t i = 0; i < nextra; i++, k += 6)
        memcpy(r + k, "X: y\r\n", 6);
    memcpy(r + k, "P: ", 3);
    k += 3;
    memset(r + k, 'v', value_len);
    k += value_len;
    memcpy(r + k, "\r\n\r\n", 4);
    *n = k + 4;
    return r;
}

/* request_with_padding(value_len, nextra) gets `status` under `lim` (0: it parses). */
static void expect_padded_status(size_t value_len, size_t nextra,
                                 const struct shmipc__http_limits *lim, int status)
{
    size_t n;
    char *r = request_with_padding(value_len, nextra, &n);
    assert_int_equal(status_of(r, n, lim), status);
    free(r);
}

static void head_bytes_limit_boundary(void **state)
{
    (void)state;
    size_t n;
    char *r = request_with_padding(16384 - 32, 0, &n);
    assert_int_equal(n, 16384);
    free(r);
    expect_padded_status(16384 - 32, 0, NULL, 0);
    expect_padded_status(16384 - 32 + 1, 0, NULL, 431);
    /* Without waiting for the rest. */
    r = request_with_padding(100000, 0, &n);
    assert_int_equal(status_of(r, 16384, NULL), 431);
    assert_int_equal(status_of(r, 16383, NULL), -1);
    free(r);
    /* The limit is configurable. */
    struct shmipc__http_limits lim = {.max_head_bytes = 100};
    expect_padded_status(100 - 32, 0, &lim, 0);
    expect_padded_status(100 - 32 + 1, 0, &lim, 431);
}

static void header_count_limit_boundary(void **state)
{
    (void)state;
    /* Host + 62 X + P = 64 fields. */
    expect_padded_status(1, 62, NULL, 0);
    expect_padded_status(1, 63, NULL, 431);
    struct shmipc__http_limits lim = {.max_headers = 3};
    expect_padded_status(1, 1, &lim, 0);
    expect_padded_status(1, 2, &lim, 431);
}

static void body_limit_boundary(void **state)
{
    (void)state;
    struct shmipc__http_limits lim = {.max_body = 10};
    assert_int_equal(
        status_of(S("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n0123456789"), &lim),
        0);
    assert_int_equal(
        status_of(S("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\n0123456789a"), &lim),
        413);
    assert_int_equal(status_of(S("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 "5\r\n01234\r\n5\r\n56789\r\n0\r\n\r\n"),
                               &lim),
                     0);
    assert_int_equal(status_of(S("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 "5\r\n01234\r\n6\r\n56789a\r\n0\r\n\r\n"),
                               &lim),
                     413);
    /* The default, 1 MiB (1048576 bytes), with a body of exactly that size. */
    static const char at[] = "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1048576\r\n\r\n";
    static const char over[] = "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1048577\r\n\r\n";
    size_t body = 1u << 20, h = sizeof at - 1;
    char *r = malloc(h + body);
    assert_non_null(r);
    memset(r, 'b', h + body); /* (filling r + h alone trips a GCC 12 UBSan false positive) */
    memcpy(r, at, h);
    assert_int_equal(status_of(r, h + body, NULL), 0);
    memcpy(r, over, h);
    assert_int_equal(status_of(r, h, NULL), 413);
    free(r);
}

static void chunked_body_with_extensions_and_trailers(void **state)
{
    (void)state;
    static const char req[] = "POST /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                              "5;name=value;flag\r\nhello\r\n"
                              "1 ; q=\"a;b\\\"c\"\r\n,\r\n"
                              "00006\r\n world\r\n"
                              "0\r\nX-Checksum: abc\r\nX-Other:  1 \r\n\r\n";
    char *got = drive_whole(S(req), NULL);
    assert_string_equal(got, "[POST /up 1.1 path=/up method=3 flags=0x1 body_kind=2 cl=0 head=58\n"
                             "Host: <h>\n"
                             "Transfer-Encoding: <chunked>\n"
                             "body(12)=hello, world\n"
                             "trailer X-Checksum: <abc>\n"
                             "trailer X-Other: <1>\n"
                             "]\n");
    free(got);
    assert_split_invariant(S(req), NULL);
}

static void chunked_body_errors(void **state)
{
    (void)state;
#define CH "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
    static const struct status_case cases[] = {
        T("size overflow", CH "ffffffffffffffffff\r\n", 413),
        T("size overflow long", CH "10000000000000000000000000000000\r\n", 413),
        T("size beyond limit", CH "100001\r\n", 413),
        T("size at limit", CH "100000\r\n", -1),
        T("many zeros", CH "0000000000000000000000000000001\r\na\r\n0\r\n\r\n", 0),
        T("upper hex", CH "A\r\n0123456789\r\n0\r\n\r\n", 0),
        T("no size", CH ";x\r\n", 400),
        T("size not hex", CH "g\r\n", 400),
        T("negative size", CH "-1\r\n", 400),
        T("space after size", CH "1 \r\na\r\n0\r\n\r\n", 400),
        T("BWS before ext", CH "1 ;x\r\na\r\n0\r\n\r\n", 0),
        T("ext without name", CH "1;\r\na\r\n0\r\n\r\n", 400),
        T("ext value empty", CH "1;x=\r\na\r\n0\r\n\r\n", 400),
        T("ext quoted", CH "1;x=\"a b\"\r\na\r\n0\r\n\r\n", 0),
        T("ext open quote", CH "1;x=\"a\r\na\r\n0\r\n\r\n", 400),
        T("ext CTL", CH "1;x=\x01\r\na\r\n0\r\n\r\n", 400),
        T("ext NUL in quote", CH "1;x=\"\0\"\r\na\r\n0\r\n\r\n", 400),
        T("data too long", CH "1\r\nab\r\n0\r\n\r\n", 400),
        T("data without CRLF", CH "1\r\na0\r\n\r\n", 400),
        T("data then bare CR", CH "1\r\na\r0\r\n\r\n", 400),
        T("data then bare LF", CH "1\r\na\n0\r\n\r\n", 400),
        T("size bare LF", CH "1\na\r\n0\r\n\r\n", 400),
        T("bare CR in size line", CH "1\r;x\r\na\r\n0\r\n\r\n", 400),
        T("trailer obs-fold", CH "0\r\nX: a\r\n b\r\n\r\n", 400),
        T("trailer space before colon", CH "0\r\nX : a\r\n\r\n", 400),
        T("trailer NUL", CH "0\r\nX: \0\r\n\r\n", 400),
        T("trailer bare LF end", CH "0\r\nX: a\r\n\n", 400),
        T("last chunk no CRLF", CH "0\r\n", -1),
        T("incomplete data", CH "5\r\nab", -1),
    };
#undef CH
    check_statuses(cases, sizeof cases / sizeof cases[0], NULL);
    struct shmipc__http_limits lim = {.max_chunk_line = 8, .max_headers = 2};
    /* max_chunk_line counts the CRLF: "1;abcd\r\n" is 8. Host + TE fill max_headers = 2, so a
     * trailer is one field too many. */
    assert_int_equal(status_of(S("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 "1;abcd\r\na\r\n0\r\n\r\n"),
                               &lim),
                     0);
    assert_int_equal(status_of(S("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 "1;abcde\r\na\r\n0\r\n\r\n"),
                               &lim),
                     400);
    assert_int_equal(status_of(S("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 "1;abcdefghijklmnop"),
                               &lim),
                     400);
    assert_int_equal(status_of(S("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 "0\r\nX: 1\r\n\r\n"),
                               &lim),
                     431);
    /* The trailer section is bounded by max_head_bytes. */
    struct shmipc__http_limits small = {.max_head_bytes = 80};
    assert_int_equal(status_of(S("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 "0\r\nX: 0123456789012345678901234567890123456789"
                                 "0123456789012345678901234567890123456789\r\n\r\n"),
                               &small),
                     431);
}

static void lenient_lf(void **state)
{
    (void)state;
    struct shmipc__http_limits lim = {.flags = SHMIPC__HTTP_LENIENT_LF};
    static const char req[] = "\nPOST / HTTP/1.1\nHost: h\r\nTransfer-Encoding: chunked\n\n"
                              "3\nabc\n0\nX: 1\n\n";
    char *got = drive_whole(S(req), &lim);
    assert_string_equal(got, "[POST / 1.1 path=/ method=3 flags=0x1 body_kind=2 cl=0 head=54\n"
                             "Host: <h>\n"
                             "Transfer-Encoding: <chunked>\n"
                             "body(3)=abc\n"
                             "trailer X: <1>\n"
                             "]\n");
    free(got);
    assert_split_invariant(S(req), &lim);
    /* A bare CR stays an error. */
    assert_int_equal(status_of(S("GET / HTTP/1.1\r\rHost: h\n\n"), &lim), 400);
    assert_int_equal(status_of(S("GET / HTTP/1.1\nHost: h\r\r\n\n"), &lim), 400);
}

static void content_length_body_and_pipelining(void **state)
{
    (void)state;
    static const char req[] = "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
                              "GET /b HTTP/1.1\r\nHost: h\r\n\r\n"
                              "PUT /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                              "2\r\nhi\r\n0\r\n\r\n"
                              "\r\nDELETE /d HTTP/1.0\r\nContent-Length: 1\r\n\r\nx";
    char *got = drive_whole(S(req), NULL);
    assert_string_equal(got, "[POST /a 1.1 path=/a method=3 flags=0x1 body_kind=1 cl=5 head=48\n"
                             "Host: <h>\n"
                             "Content-Length: <5>\n"
                             "body(5)=hello\n"
                             "]\n"
                             "[GET /b 1.1 path=/b method=1 flags=0x1 body_kind=0 cl=0 head=28\n"
                             "Host: <h>\n"
                             "body(0)=\n"
                             "]\n"
                             "[PUT /c 1.1 path=/c method=4 flags=0x1 body_kind=2 cl=0 head=56\n"
                             "Host: <h>\n"
                             "Transfer-Encoding: <chunked>\n"
                             "body(2)=hi\n"
                             "]\n"
                             "[DELETE /d 1.0 path=/d method=5 flags=0x0 body_kind=1 cl=1 head=43\n"
                             "Content-Length: <1>\n"
                             "body(1)=x\n"
                             "]\n");
    free(got);
    assert_split_invariant(S(req), NULL);
}

static void every_split_of_requests(void **state)
{
    (void)state;
    static const char *const reqs[] = {
        "GET / HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\nConnection: keep-alive\r\n\r\n",
        "HEAD /x?y HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n",
        "GET / HTTP/1.1\r\nHost : h\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        "GET / HTTP/2.0\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n",
        "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r0\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
        "GET / HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof reqs / sizeof reqs[0]; i++)
        assert_split_invariant(reqs[i], strlen(reqs[i]), NULL);
    /* With small limits too, so that limit errors fire mid-line in some splits. */
    struct shmipc__http_limits lim = {.max_request_line = 20, .max_head_bytes = 48};
    static const char *const limited[] = {
        "GET /0123456789012 HTTP/1.1\r\nHost: h\r\n\r\n",
        "GET /01234567890123 HTTP/1.1\r\nHost: h\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: h\r\nX: 012345678901\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: h\r\nX: 0123456789012\r\n\r\n",
        "\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof limited / sizeof limited[0]; i++)
        assert_split_invariant(limited[i], strlen(limited[i]), &lim);
}

/* A body larger than any buffer, streamed through a small window with body_take(). */
static void streaming_a_large_chunked_body(void **state)
{
    (void)state;
    struct shmipc__http_limits in = {.max_body = 1u << 24};
    struct parser_setup ps;
    struct shmipc__http_parser *p = parser_setup(&ps, &in);
    /* The wire: a head, then 1000 chunks of 1000 bytes, then a trailer. */
    struct sbuf wire = {0};
    sb_printf(&wire, "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n");
    size_t head = wire.n;
    char chunk[1000];
    for (int c = 0; c < 1000; c++) {
        for (size_t i = 0; i < sizeof chunk; i++)
            chunk[i] = (char)('a' + (c + i) % 26);
        sb_printf(&wire, "3e8;c=%d\r\n", c);
        sb_put(&wire, chunk, sizeof chunk);
        sb_put(&wire, "\r\n", 2);
    }
    sb_printf(&wire, "0\r\nDone: yes\r\n\r\n");
    assert_int_equal(shmipc__http_parse_head(p, wire.p, head), (int)head);

    /* A 4 KiB window fed 777 bytes at a time; decoded bytes are checked and dropped. */
    char window[4096];
    size_t wlen = 0, fed = head, seen = 0;
    int rc = 0;
    while (rc == 0) {
        size_t k = wire.n - fed < 777 ? wire.n - fed : 777;
        assert_true(wlen + k <= sizeof window);
        memcpy(window + wlen, wire.p + fed, k);
        wlen += k;
        fed += k;
        rc = shmipc__http_body_decode(p, window, &wlen);
        assert_true(rc >= 0);
        size_t got = shmipc__http_body_len(p);
        for (size_t i = 0; i < got; i++, seen++)
            assert_int_equal(window[i], 'a' + (seen / 1000 + seen % 1000) % 26);
        if (rc == 0) {
            size_t n = shmipc__http_body_take(p);
            assert_int_equal(n, got);
            memmove(window, window + n, wlen - n);
            wlen -= n;
        }
    }
    assert_int_equal(seen, 1000 * 1000);
    assert_int_equal(fed, wire.n);
    assert_int_equal(p->req.ntrailers, 1);
    const struct shmipc__http_field *t = &p->req.fields[p->req.nfields];
    assert_memory_equal(window + t->name.off, "Done", 4);
    assert_memory_equal(window + t->value.off, "yes", 3);
    /* Taking after the end moves the trailer offsets with the bytes. */
    size_t n = shmipc__http_body_take(p);
    memmove(window, window + n, wlen - n);
    assert_memory_equal(window + t->name.off, "Done", 4);
    assert_memory_equal(window + t->value.off, "yes", 3);
    free(wire.p);
}

/* While a chunked body is incomplete the decoder squeezes the framing out. */
static void chunked_decoding_compacts_in_place(void **state)
{
    (void)state;
    struct parser_setup ps;
    struct shmipc__http_parser *p = parser_setup(&ps, NULL);
    static const char head[] = "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";
    assert_int_equal(shmipc__http_parse_head(p, head, sizeof head - 1), sizeof head - 1);
    char buf[64];
    memcpy(buf, "3;x=y\r\nabc\r\n4\r\nde", 17);
    size_t len = 17;
    assert_int_equal(shmipc__http_body_decode(p, buf, &len), 0);
    assert_int_equal(len, 5);
    assert_int_equal(shmipc__http_body_len(p), 5);
    assert_memory_equal(buf, "abcde", 5);
    memcpy(buf + len, "fg\r\n0\r", 6);
    len += 6;
    assert_int_equal(shmipc__http_body_decode(p, buf, &len), 0);
    assert_memory_equal(buf, "abcdefg", 7);
    /* "fg" joined the data, the CRLF went, and the partial size line "0\r" moved down. */
    assert_int_equal(len, 9);
    assert_memory_equal(buf + 7, "0\r", 2);
    memcpy(buf + len, "\n\r\n", 3);
    len += 3;
    assert_int_equal(shmipc__http_body_decode(p, buf, &len), 1);
    assert_int_equal(shmipc__http_body_len(p), 7);
    assert_int_equal(shmipc__http_body_wire(p), 12);
}

static void failed_parser_stays_failed(void **state)
{
    (void)state;
    struct parser_setup ps;
    struct shmipc__http_parser *p = parser_setup(&ps, NULL);
    static const char bad[] = "GET / HTTP/1.1\r\nHost : h\r\n\r\n";
    assert_int_equal(shmipc__http_parse_head(p, S(bad)), SHMIPC_EPROTO);
    assert_int_equal(p->status, 400);
    assert_non_null(strstr(shmipc_error_detail(), "colon"));
    static const char good[] = "GET / HTTP/1.1\r\nHost: h\r\n\r\n";
    assert_int_equal(shmipc__http_parse_head(p, S(good)), SHMIPC_EPROTO);
    assert_int_equal(p->status, 400);
    size_t len = 0;
    assert_int_equal(shmipc__http_body_decode(p, NULL, &len), SHMIPC_EPROTO);
}

static void misuse_is_refused(void **state)
{
    (void)state;
    struct parser_setup ps;
    struct shmipc__http_parser *p = parser_setup(&ps, NULL);
    static const char req[] = "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n";
    assert_int_equal(shmipc__http_parse_head(p, S(req)), sizeof req - 1);
    /* A body is pending: the next head must wait. */
    assert_int_equal(shmipc__http_parse_head(p, S(req)), SHMIPC_EINVAL);
    char body[2] = {'o', 'k'};
    size_t len = 2;
    assert_int_equal(shmipc__http_body_decode(p, body, &len), 1);
    /* And a body cannot be decoded in the middle of a head. */
    assert_int_equal(shmipc__http_parse_head(p, "GET / HT", 8), 0);
    len = 0;
    assert_int_equal(shmipc__http_body_decode(p, body, &len), SHMIPC_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(limits_resolve_defaults_and_bounds),
        cmocka_unit_test(simple_get),
        cmocka_unit_test(methods_are_recognised),
        cmocka_unit_test(request_line_validation),
        cmocka_unit_test(field_validation),
        cmocka_unit_test(framing_validation),
        cmocka_unit_test(every_byte_position_is_checked),
        cmocka_unit_test(connection_semantics),
        cmocka_unit_test(request_line_limit_boundary),
        cmocka_unit_test(head_bytes_limit_boundary),
        cmocka_unit_test(header_count_limit_boundary),
        cmocka_unit_test(body_limit_boundary),
        cmocka_unit_test(chunked_body_with_extensions_and_trailers),
        cmocka_unit_test(chunked_body_errors),
        cmocka_unit_test(lenient_lf),
        cmocka_unit_test(content_length_body_and_pipelining),
        cmocka_unit_test(every_split_of_requests),
        cmocka_unit_test(streaming_a_large_chunked_body),
        cmocka_unit_test(chunked_decoding_compacts_in_place),
        cmocka_unit_test(failed_parser_stays_failed),
        cmocka_unit_test(misuse_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
