/*
 * shmipc-serve's access-log formatter (options.h, docs/serve.md "Configuration"): one request's
 * entry as a line of the common log format (nginx's escaping) or a JSON object. Pure: it
 * formats into the caller's buffer and does no I/O.
 */
#include "options.h"

#include "shmipc.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

size_t shmipc__access_format_bound(const shmipc__access_entry *e)
{
    if (e == NULL)
        return 0;
    /* JSON's \u00XX is 6 bytes for one, U+FFFD 3; CLF's \xHH 4. Plus the fixed text. */
    return 6 * (e->remote_len + e->method_len + e->target_len + e->referer_len +
                e->user_agent_len) +
           512;
}

struct out {
    char *p;
    size_t n, cap;
    int over;
};

static void put(struct out *o, const char *s, size_t n)
{
    if (o->over || n > o->cap - o->n - 1) {
        o->over = 1;
        return;
    }
    memcpy(o->p + o->n, s, n);
    o->n += n;
}

static void putf(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(struct out *o, const char *fmt, ...)
{
    char b[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof b) {
        o->over = 1;
        return;
    }
    put(o, b, (size_t)n);
}

/* nginx's access-log escaping: '"', '\\', bytes below 0x20 and from 0x7F as \xHH. */
static void put_clf(struct out *o, const char *s, size_t n)
{
    if (s == NULL) {
        put(o, "-", 1);
        return;
    }
    static const char hex[] = "0123456789ABCDEF";
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\' || c < 0x20 || c >= 0x7f) {
            char b[4] = {'\\', 'x', hex[c >> 4], hex[c & 15]};
            put(o, b, 4);
        } else {
            put(o, (const char *)&c, 1);
        }
    }
}

/* The length of a valid UTF-8 sequence at s (RFC 3629: no overlongs, no surrogates, at most
 * U+10FFFF), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        return n >= 2 && (s[1] & 0xc0) == 0x80 ? 2 : 0;
    if (c >= 0xe0 && c <= 0xef) {
        if (n < 3 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80)
            return 0;
        if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] > 0x9f))
            return 0;
        return 3;
    }
    if (c >= 0xf0 && c <= 0xf4) {
        if (n < 4 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80 || (s[3] & 0xc0) != 0x80)
            return 0;
        if ((c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] > 0x8f))
            return 0;
        return 4;
    }
    return 0;
}

static void put_json_str(struct out *o, const char *s, size_t n)
{
    if (s == NULL) {
        put(o, "null", 4);
        return;
    }
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    put(o, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned char c = u[i];
        if (c == '"' || c == '\\') {
            char b[2] = {'\\', (char)c};
            put(o, b, 2);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            char b[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            put(o, b, 6);
            i++;
        } else {
            size_t l = utf8_len(u + i, n - i);
            if (l == 0) {
                put(o, "\\ufffd", 6);
                i++;
            } else {
                put(o, s + i, l);
                i += l;
            }
        }
    }
    put(o, "\"", 1);
}

int shmipc__access_format(int format, const shmipc__access_entry *e, char *out, size_t cap)
{
    if (e == NULL || out == NULL || cap == 0 ||
        (format != SHMIPC__ACCESS_COMMON && format != SHMIPC__ACCESS_JSON))
        return SHMIPC_EINVAL;
    struct out o = {out, 0, cap, 0};
    time_t t = (time_t)e->time_sec;
    struct tm tm;
    if (gmtime_r(&t, &tm) == NULL)
        memset(&tm, 0, sizeof tm);
    const char *remote = e->remote;
    size_t remote_len = e->remote_len;
    if (format == SHMIPC__ACCESS_COMMON) {
        static const char *const mon[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                          "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
        put_clf(&o, remote, remote_len);
        putf(&o, " - - [%02d/%s/%04d:%02d:%02d:%02d +0000] \"", tm.tm_mday,
             mon[tm.tm_mon >= 0 && tm.tm_mon < 12 ? tm.tm_mon : 0], tm.tm_year + 1900, tm.tm_hour,
             tm.tm_min, tm.tm_sec);
        put_clf(&o, e->method, e->method_len);
        put(&o, " ", 1);
        put_clf(&o, e->target, e->target_len);
        putf(&o, " HTTP/1.%u\" %u %llu\n", e->version_minor, e->status,
             (unsigned long long)e->bytes);
    } else {
        putf(&o,
             "{\"time\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"remote\":", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             (e->time_nsec >= 0 && e->time_nsec < 1000000000L ? e->time_nsec : 0) / 1000000L);
        put_json_str(&o, remote, remote_len);
        put(&o, ",\"method\":", 10);
        put_json_str(&o, e->method, e->method_len);
        put(&o, ",\"target\":", 10);
        put_json_str(&o, e->target, e->target_len);
        putf(&o, ",\"protocol\":\"HTTP/1.%u\",\"status\":%u,\"bytes\":%llu,\"duration_us\":%llu",
             e->version_minor, e->status, (unsigned long long)e->bytes,
             (unsigned long long)e->duration_us);
        put(&o, ",\"referer\":", 11);
        put_json_str(&o, e->referer, e->referer_len);
        put(&o, ",\"user_agent\":", 14);
        put_json_str(&o, e->user_agent, e->user_agent_len);
        put(&o, "}\n", 2);
    }
    if (o.over)
        return SHMIPC_EMSGSIZE;
    out[o.n] = '\0';
    return (int)o.n;
}
