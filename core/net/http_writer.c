/* The HTTP/1.1 response writer; see http_writer.h. */
#include "net/http_writer.h"

#include <string.h>

#include "common/error.h"
#include "shmipc.h"

/* ---------------------------------------------------------------------------------------- */
/* Date */

static void put2(char *p, unsigned v)
{
    p[0] = (char)('0' + v / 10 % 10);
    p[1] = (char)('0' + v % 10);
}

void shmipc__http_date_init(struct shmipc__http_date *d, time_t now)
{
    static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    struct tm tm;
    if (!gmtime_r(&now, &tm)) {
        time_t zero = 0;
        gmtime_r(&zero, &tm);
    }
    unsigned year = tm.tm_year + 1900 < 0 ? 0u : (unsigned)(tm.tm_year + 1900) % 10000u;
    /* "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n" */
    char *p = d->line;
    memcpy(p, "Date: ", 6);
    memcpy(p + 6, days[tm.tm_wday % 7], 3);
    memcpy(p + 9, ", ", 2);
    put2(p + 11, (unsigned)tm.tm_mday);
    p[13] = ' ';
    memcpy(p + 14, months[tm.tm_mon % 12], 3);
    p[17] = ' ';
    put2(p + 18, year / 100);
    put2(p + 20, year % 100);
    p[22] = ' ';
    put2(p + 23, (unsigned)tm.tm_hour);
    p[25] = ':';
    put2(p + 26, (unsigned)tm.tm_min);
    p[28] = ':';
    put2(p + 29, (unsigned)tm.tm_sec);
    memcpy(p + 31, " GMT\r\n", 7); /* with the NUL */
    d->second = (int64_t)now;
}

int shmipc__http_date_refresh(struct shmipc__http_date *d, time_t now)
{
    if ((int64_t)now == d->second)
        return 0;
    shmipc__http_date_init(d, now);
    return 1;
}

/* ---------------------------------------------------------------------------------------- */
/* Status codes */

/* Every status code with a standard reason phrase (RFC 9110 §15), in ascending order. */
#define HTTP_STATUSES(X)                                                                           \
    X(100, "Continue")                                                                             \
    X(101, "Switching Protocols")                                                                  \
    X(200, "OK")                                                                                   \
    X(201, "Created")                                                                              \
    X(202, "Accepted")                                                                             \
    X(203, "Non-Authoritative Information")                                                        \
    X(204, "No Content")                                                                           \
    X(205, "Reset Content")                                                                        \
    X(206, "Partial Content")                                                                      \
    X(300, "Multiple Choices")                                                                     \
    X(301, "Moved Permanently")                                                                    \
    X(302, "Found")                                                                                \
    X(303, "See Other")                                                                            \
    X(304, "Not Modified")                                                                         \
    X(307, "Temporary Redirect")                                                                   \
    X(308, "Permanent Redirect")                                                                   \
    X(400, "Bad Request")                                                                          \
    X(401, "Unauthorized")                                                                         \
    X(402, "Payment Required")                                                                     \
    X(403, "Forbidden")                                                                            \
    X(404, "Not Found")                                                                            \
    X(405, "Method Not Allowed")                                                                   \
    X(406, "Not Acceptable")                                                                       \
    X(407, "Proxy Authentication Required")                                                        \
    X(408, "Request Timeout")                                                                      \
    X(409, "Conflict")                                                                             \
    X(410, "Gone")                                                                                 \
    X(411, "Length Required")                                                                      \
    X(412, "Precondition Failed")                                                                  \
    X(413, "Content Too Large")                                                                    \
    X(414, "URI Too Long")                                                                         \
    X(415, "Unsupported Media Type")                                                               \
    X(416, "Range Not Satisfiable")                                                                \
    X(417, "Expectation Failed")                                                                   \
    X(421, "Misdirected Request")                                                                  \
    X(422, "Unprocessable Content")                                                                \
    X(426, "Upgrade Required")                                                                     \
    X(428, "Precondition Required")                                                                \
    X(429, "Too Many Requests")                                                                    \
    X(431, "Request Header Fields Too Large")                                                      \
    X(500, "Internal Server Error")                                                                \
    X(501, "Not Implemented")                                                                      \
    X(502, "Bad Gateway")                                                                          \
    X(503, "Service Unavailable")                                                                  \
    X(504, "Gateway Timeout")                                                                      \
    X(505, "HTTP Version Not Supported")

/*
 * Each entry is the canned error body, "<status> <reason>\n"; the reason phrase is the text
 * between the code and the newline, so one table serves status lines and error bodies.
 */
static const struct {
    uint16_t status;
    uint8_t len;
    const char *text;
} statuses[] = {
#define ROW(code, reason) {code, sizeof(#code " " reason "\n") - 1, #code " " reason "\n"},
    HTTP_STATUSES(ROW)
#undef ROW
};

static int status_index(int status)
{
    size_t lo = 0, hi = sizeof statuses / sizeof statuses[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (statuses[mid].status == status)
            return (int)mid;
        if (statuses[mid].status < status)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/* The reason phrase of `status` as a pointer and a length (not NUL-terminated). */
static const char *reason(int status, size_t *len)
{
    int i = status_index(status);
    if (i < 0) {
        *len = 0;
        return "";
    }
    *len = statuses[i].len - 5u;
    return statuses[i].text + 4;
}

const char *shmipc__http_reason(int status)
{
    static const char *const phrases[] = {
#define PHRASE(code, reason) [code - 100] = reason,
        HTTP_STATUSES(PHRASE)
#undef PHRASE
    };
    if (status < 100 || status >= 100 + (int)(sizeof phrases / sizeof phrases[0]) ||
        !phrases[status - 100])
        return "";
    return phrases[status - 100];
}

/* ---------------------------------------------------------------------------------------- */
/* Responses */

void shmipc__http_response_init(struct shmipc__http_response *r,
                                const struct shmipc__http_request *req)
{
    memset(r, 0, sizeof *r);
    r->status = 200;
    if (!req)
        return;
    if (req->flags & SHMIPC__HTTP_IS_HEAD)
        r->flags |= SHMIPC__HTTP_RESP_HEAD;
    if (!(req->flags & SHMIPC__HTTP_KEEP_ALIVE))
        r->flags |= SHMIPC__HTTP_RESP_CLOSE;
    if (req->minor == 0)
        r->flags |= SHMIPC__HTTP_RESP_HTTP10;
}

void shmipc__http_response_error(struct shmipc__http_response *r, int status)
{
    /* What the request implied stays: HEAD gets no body, HTTP/1.0 no keep-alive header. */
    uint16_t keep = r->flags & (SHMIPC__HTTP_RESP_HTTP10 | SHMIPC__HTTP_RESP_HEAD);
    memset(r, 0, sizeof *r);
    r->status = (uint16_t)status;
    r->flags = (uint16_t)(keep | SHMIPC__HTTP_RESP_CLOSE);
    r->content_type = "text/plain; charset=utf-8";
    int i = status_index(status);
    if (i >= 0) {
        r->body = statuses[i].text;
        r->body_len = statuses[i].len;
    }
}

/* 1xx, 204 and 304 have no content (RFC 9110 §6.4.1) and no framing header. */
static int no_content(int status)
{
    return status < 200 || status == 204 || status == 304;
}

/* Whether the body bytes of `r` go on the wire after its head. */
static int sends_body(const struct shmipc__http_response *r)
{
    return !(r->flags & (SHMIPC__HTTP_RESP_HEAD | SHMIPC__HTTP_RESP_STREAM)) &&
           !no_content(r->status) && r->body_len > 0;
}

static int is_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

static int valid_name(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!is_tchar((unsigned char)s[i]))
            return 0;
    return 1;
}

static int valid_value(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return 0;
    }
    return 1;
}

int shmipc__http_header_valid(const struct shmipc__http_header_out *h)
{
    return valid_name(h->name, h->name_len) && valid_value(h->value, h->value_len);
}

/* A bounded writer: appends until the end, then only remembers that it ran out. */
struct out {
    char *p;
    char *end;
    int full;
};

static void put(struct out *o, const void *s, size_t n)
{
    if (o->full || (size_t)(o->end - o->p) < n) {
        o->full = 1;
        return;
    }
    memcpy(o->p, s, n);
    o->p += n;
}

#define PUTS(o, lit) put((o), lit, sizeof(lit) - 1)

static void put_header(struct out *o, const char *name, size_t nlen, const char *value, size_t vlen)
{
    put(o, name, nlen);
    PUTS(o, ": ");
    put(o, value, vlen);
    PUTS(o, "\r\n");
}

static void put_u64(struct out *o, uint64_t v)
{
    char digits[20];
    size_t n = 0;
    do {
        digits[sizeof digits - 1 - n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    put(o, digits + sizeof digits - n, n);
}

int shmipc__http_write_head(char *out, size_t cap, const struct shmipc__http_response *r,
                            const struct shmipc__http_date *date, const char *server)
{
    if (r->status < 100 || r->status > 999)
        return shmipc__fail(SHMIPC_EINVAL, "http response: status %u is outside 100-999",
                            r->status);
    if (r->content_type && !valid_value(r->content_type, strlen(r->content_type)))
        return shmipc__fail(SHMIPC_EINVAL, "http response: Content-Type has a control byte");
    if (server && !valid_value(server, strlen(server)))
        return shmipc__fail(SHMIPC_EINVAL, "http response: Server has a control byte");
    for (uint32_t i = 0; i < r->nheaders; i++) {
        const struct shmipc__http_header_out *h = &r->headers[i];
        if (!valid_name(h->name, h->name_len))
            return shmipc__fail(SHMIPC_EINVAL, "http response: header %u: name is not a token", i);
        if (!valid_value(h->value, h->value_len))
            return shmipc__fail(SHMIPC_EINVAL, "http response: header %u: value has a control byte",
                                i);
    }

    struct out o = {out, out + cap, 0};
    char code[4] = {(char)('0' + r->status / 100), (char)('0' + r->status / 10 % 10),
                    (char)('0' + r->status % 10), ' '};
    size_t rlen;
    const char *rs = reason(r->status, &rlen);
    PUTS(&o, "HTTP/1.1 ");
    put(&o, code, 4);
    put(&o, rs, rlen);
    PUTS(&o, "\r\n");
    if (date)
        put(&o, date->line, SHMIPC__HTTP_DATE_LINE_LEN);
    if (server)
        put_header(&o, "Server", 6, server, strlen(server));
    if (r->content_type)
        put_header(&o, "Content-Type", 12, r->content_type, strlen(r->content_type));
    for (uint32_t i = 0; i < r->nheaders; i++)
        put_header(&o, r->headers[i].name, r->headers[i].name_len, r->headers[i].value,
                   r->headers[i].value_len);
    if (!no_content(r->status)) {
        if (!(r->flags & SHMIPC__HTTP_RESP_STREAM)) {
            PUTS(&o, "Content-Length: ");
            put_u64(&o, r->body_len);
            PUTS(&o, "\r\n");
        } else if (!(r->flags & SHMIPC__HTTP_RESP_HTTP10)) {
            PUTS(&o, "Transfer-Encoding: chunked\r\n");
        }
    }
    if (shmipc__http_response_closes(r))
        PUTS(&o, "Connection: close\r\n");
    else if (r->flags & SHMIPC__HTTP_RESP_HTTP10)
        PUTS(&o, "Connection: keep-alive\r\n");
    PUTS(&o, "\r\n");
    if (o.full)
        return shmipc__fail(SHMIPC_ENOSPC, "http response: the head needs more than %zu bytes",
                            cap);
    return (int)(o.p - out);
}

int shmipc__http_response_iov(const struct shmipc__http_response *r,
                              const struct shmipc__http_date *date, const char *server, char *head,
                              size_t cap, struct iovec iov[2])
{
    int n = shmipc__http_write_head(head, cap, r, date, server);
    if (n < 0)
        return n;
    iov[0].iov_base = head;
    iov[0].iov_len = (size_t)n;
    if (!sends_body(r))
        return 1;
    iov[1].iov_base = (void *)(uintptr_t)r->body;
    iov[1].iov_len = r->body_len;
    return 2;
}

size_t shmipc__http_chunk_head(char out[SHMIPC__HTTP_CHUNK_HEAD_MAX], uint64_t len)
{
    static const char hex[] = "0123456789abcdef";
    char digits[16];
    size_t n = 0;
    do {
        digits[sizeof digits - 1 - n++] = hex[len & 15];
        len >>= 4;
    } while (len);
    memcpy(out, digits + sizeof digits - n, n);
    out[n] = '\r';
    out[n + 1] = '\n';
    return n + 2;
}

/* ---------------------------------------------------------------------------------------- */
/* Batches */

void shmipc__http_batch_init(struct shmipc__http_batch *b, struct iovec *iov, uint32_t iov_cap,
                             char *arena, size_t arena_cap, const struct shmipc__http_date *date)
{
    memset(b, 0, sizeof *b);
    b->iov = iov;
    b->iov_cap = iov_cap;
    b->arena = arena;
    b->cap = arena_cap;
    b->date = date;
    b->copy_max = SHMIPC__HTTP_COPY_MAX;
}

void shmipc__http_batch_reset(struct shmipc__http_batch *b)
{
    b->niov = 0;
    b->used = 0;
    b->bytes = 0;
}

/* Appends [p, p+n) as an iovec, extending the last one when the bytes follow it in memory. */
static void push(struct shmipc__http_batch *b, const void *p, size_t n)
{
    if (n == 0)
        return;
    struct iovec *last = b->niov ? &b->iov[b->niov - 1] : NULL;
    if (last && (const char *)last->iov_base + last->iov_len == (const char *)p) {
        last->iov_len += n;
    } else {
        b->iov[b->niov].iov_base = (void *)(uintptr_t)p;
        b->iov[b->niov].iov_len = n;
        b->niov++;
    }
    b->bytes += n;
}

/* Whether `n` more arena bytes and `iovs` more iovecs fit. */
static int room(const struct shmipc__http_batch *b, size_t n, uint32_t iovs)
{
    return b->cap - b->used >= n && b->iov_cap - b->niov >= iovs;
}

static int full(const struct shmipc__http_batch *b)
{
    return shmipc__fail(SHMIPC_ENOSPC, "http batch: full (%u of %u iovecs, %zu of %zu bytes)",
                        b->niov, b->iov_cap, b->used, b->cap);
}

int shmipc__http_batch_add(struct shmipc__http_batch *b, const struct shmipc__http_response *r)
{
    char *head = b->arena + b->used;
    int n = shmipc__http_write_head(head, b->cap - b->used, r, b->date, b->server);
    if (n < 0)
        return n;
    size_t body = sends_body(r) ? r->body_len : 0;
    int copy = body && body <= b->copy_max && body <= b->cap - b->used - (size_t)n;
    if (!room(b, (size_t)n, copy || !body ? 1 : 2))
        return full(b);
    if (copy) {
        memcpy(head + n, r->body, body);
        n += (int)body;
    }
    push(b, head, (size_t)n);
    b->used += (size_t)n;
    if (body && !copy)
        push(b, r->body, body);
    return 0;
}

int shmipc__http_batch_add_error(struct shmipc__http_batch *b, int status)
{
    struct shmipc__http_response r;
    memset(&r, 0, sizeof r);
    shmipc__http_response_error(&r, status);
    return shmipc__http_batch_add(b, &r);
}

int shmipc__http_batch_add_continue(struct shmipc__http_batch *b)
{
    static const char line[] = "HTTP/1.1 100 Continue\r\n\r\n";
    if (!room(b, sizeof line - 1, 1))
        return full(b);
    memcpy(b->arena + b->used, line, sizeof line - 1);
    push(b, b->arena + b->used, sizeof line - 1);
    b->used += sizeof line - 1;
    return 0;
}

int shmipc__http_batch_add_chunk(struct shmipc__http_batch *b,
                                 const struct shmipc__http_response *r, const void *data,
                                 size_t len)
{
    if (len == 0 || (r->flags & SHMIPC__HTTP_RESP_HEAD) || no_content(r->status))
        return 0;
    int raw = (r->flags & SHMIPC__HTTP_RESP_HTTP10) != 0;
    size_t frame = raw ? 0 : SHMIPC__HTTP_CHUNK_HEAD_MAX + 2;
    int copy = len <= b->copy_max && b->cap - b->used >= frame + len;
    if (!room(b, frame + (copy ? len : 0), copy ? 1 : 3))
        return full(b);
    char *p = b->arena + b->used;
    size_t n = raw ? 0 : shmipc__http_chunk_head(p, len);
    if (copy) {
        memcpy(p + n, data, len);
        n += len;
    } else {
        push(b, p, n);
        b->used += n;
        push(b, data, len);
        p = b->arena + b->used;
        n = 0;
    }
    if (!raw) {
        memcpy(p + n, "\r\n", 2);
        n += 2;
    }
    push(b, p, n);
    b->used += n;
    return 0;
}

int shmipc__http_batch_add_last_chunk(struct shmipc__http_batch *b,
                                      const struct shmipc__http_response *r)
{
    if (r->flags & (SHMIPC__HTTP_RESP_HEAD | SHMIPC__HTTP_RESP_HTTP10) || no_content(r->status))
        return 0;
    size_t n = sizeof SHMIPC__HTTP_LAST_CHUNK - 1;
    if (!room(b, n, 1))
        return full(b);
    memcpy(b->arena + b->used, SHMIPC__HTTP_LAST_CHUNK, n);
    push(b, b->arena + b->used, n);
    b->used += n;
    return 0;
}
