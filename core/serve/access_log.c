/*
 * The access log of shmipc-serve's front (access_log.h, docs/serve.md "The access log"): the
 * formatter of one request's line (the common log format with nginx's escaping, or a JSON
 * object), pure; then the log file (open, reopen, counts) and a thread's buffer of whole lines.
 * May call: libc only (and common/ for the error details).
 */
#include "serve/access_log.h"

#include "common/error.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

size_t shmipc__access_format_bound(const shmipc__access_entry *e)
{
    if (e == NULL)
        return 0;
    /* JSON's \u00XX is 6 bytes for one, U+FFFD 3; CLF's \xHH 4. Plus the fixed text. */
    return 6 * (e->remote_len + e->method_len + e->target_len + e->referer_len + e->user_agent_len +
                e->worker_len) +
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
        put(&o, ",\"worker\":", 10);
        put_json_str(&o, e->worker, e->worker_len);
        put(&o, "}\n", 2);
    }
    if (o.over)
        return SHMIPC_EMSGSIZE;
    out[o.n] = '\0';
    return (int)o.n;
}

/* ---- the log file ------------------------------------------------------------------------ */

struct shmipc__access_log {
    int fd;               /* the same number for the log's life: reopen dup2()s over it */
    int own;              /* fd is ours (not stdout) */
    int format;           /* enum shmipc__access_format_kind */
    atomic_int pipe_like; /* not a regular file: whole lines in writes of at most PIPE_BUF */
    /* A pipe, FIFO or terminal is written through a description of its own, O_NONBLOCK (the
     * shared one keeps its flags); a socket with send(MSG_DONTWAIT). -1: none (a socket or a
     * file). Its number, once set, is the log's for good: reopen dup3()s over it. */
    atomic_int nb;
    atomic_int stalled; /* no room last time: the next writes do not wait until there is */
    atomic_int cut;     /* a write dropped the end of a line: the next begins with '\n' */
    char *path;         /* NULL for stdout */
    atomic_ullong lines, errors;
};

/*
 * O_NONBLOCK for the open only: a FIFO nobody reads is ENXIO at once. Its open() waited for a
 * reader, and shmipc-serve's SIGUSR2 reopen, on the thread that reads the signals, then read
 * no SIGTERM until one came (test_serve_cli.py test_reopen_onto_a_fifo_nobody_reads). The
 * description is blocking again afterwards, as it was (pipes are written through their own).
 */
static int open_path(const char *path)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0666);
    int fl = fd >= 0 ? fcntl(fd, F_GETFL) : 0;
    if (fl >= 0 && (fl & O_NONBLOCK))
        (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

static int is_pipe_like(int fd)
{
    struct stat st;
    return fstat(fd, &st) != 0 || !S_ISREG(st.st_mode);
}

/* A non-blocking description of what fd names (a pipe, a FIFO, a terminal), or -1. */
static int open_nonblocking(int fd)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    return open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
}

int shmipc__access_log_open(const char *path, int format, struct shmipc__access_log **out)
{
    if (out != NULL)
        *out = NULL;
    if (path == NULL || path[0] == '\0' || out == NULL ||
        (format != SHMIPC__ACCESS_COMMON && format != SHMIPC__ACCESS_JSON))
        return shmipc__fail(SHMIPC_EINVAL, "access log: no path, or a bad format");
    struct shmipc__access_log *log = calloc(1, sizeof *log);
    if (log == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "access log");
    log->format = format;
    if (strcmp(path, "-") == 0) {
        log->fd = STDOUT_FILENO;
    } else {
        if ((log->path = strdup(path)) == NULL) {
            free(log);
            return shmipc__fail(SHMIPC_ENOMEM, "access log");
        }
        if ((log->fd = open_path(path)) < 0) {
            int e = errno;
            free(log->path);
            free(log);
            return shmipc__fail_errno(e, "access log %s", path);
        }
        log->own = 1;
    }
    atomic_store(&log->pipe_like, is_pipe_like(log->fd));
    atomic_store(&log->nb, atomic_load(&log->pipe_like) ? open_nonblocking(log->fd) : -1);
    *out = log;
    return 0;
}

int shmipc__access_log_reopen(struct shmipc__access_log *log)
{
    if (log == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "access log reopen: NULL");
    if (!log->own)
        return 0;
    int fd = open_path(log->path);
    if (fd < 0)
        return shmipc__fail_errno(errno, "access log %s", log->path);
    /* One atomic step: a write at this moment goes to the old file or the new one, never to
     * a closed or reused descriptor; close-on-exec stays set (the supervisor spawns workers
     * from another thread). */
    int rc = 0;
    if (dup3(fd, log->fd, O_CLOEXEC) < 0) {
        rc = shmipc__fail_errno(errno, "access log %s: dup3", log->path);
    } else {
        int piped = is_pipe_like(log->fd), nb = atomic_load(&log->nb);
        if (piped || nb >= 0) {
            /* The non-blocking description follows the file (a FIFO at the path now); when
             * none can be had, the new file itself, as blocking as before. */
            int n2 = piped ? open_nonblocking(log->fd) : -1;
            if (nb >= 0) {
                dup3(n2 >= 0 ? n2 : log->fd, nb, O_CLOEXEC);
                if (n2 >= 0)
                    close(n2);
            } else {
                atomic_store(&log->nb, n2);
            }
        }
        atomic_store(&log->pipe_like, piped);
        atomic_store(&log->stalled, 0);
        atomic_store(&log->cut, 0);
    }
    close(fd);
    return rc;
}

void shmipc__access_log_counts(struct shmipc__access_log *log, uint64_t *lines, uint64_t *errors)
{
    if (lines != NULL)
        *lines = log != NULL ? atomic_load(&log->lines) : 0;
    if (errors != NULL)
        *errors = log != NULL ? atomic_load(&log->errors) : 0;
}

void shmipc__access_log_free(struct shmipc__access_log *log)
{
    if (log == NULL)
        return;
    if (log->own)
        close(log->fd);
    if (atomic_load(&log->nb) >= 0)
        close(atomic_load(&log->nb));
    free(log->path);
    free(log);
}

/* One write() of whole lines, the rest written on (a short write to a file: disk full). */
static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* How long a write to a pipe, socket or terminal waits for room before its lines are dropped
 * (counted as write errors): as shmipc-serve's own output (serve/sup_int.h OUT_WAIT_MS). */
#define LOG_WAIT_MS 20

static ssize_t write_nonblocking(struct shmipc__access_log *log, const char *p, size_t n)
{
    int nb = atomic_load(&log->nb);
    if (nb >= 0)
        return write(nb, p, n);
    ssize_t k = send(log->fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k < 0 && errno == ENOTSOCK)
        return write(log->fd, p, n); /* no description of its own could be had */
    return k;
}

/*
 * Lines to a pipe, socket or terminal, never blocking for long: a log reader that stalls (or
 * `--access-log -` into a pipe nobody reads) held every thread that flushed lines in write(),
 * so the server stopped answering and its stop never ended. A write without room waits
 * LOG_WAIT_MS for it, then the lines are dropped; once a write found no room the next ones do
 * not wait until one succeeds.
 */
static int write_piped_part(struct shmipc__access_log *log, const char *p, size_t n)
{
    const char *start = p;
    while (n > 0) {
        ssize_t k = write_nonblocking(log, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (atomic_load(&log->stalled))
                break;
            struct pollfd pf = {.fd = log->fd, .events = POLLOUT};
            int r = poll(&pf, 1, LOG_WAIT_MS);
            if (r > 0 && (pf.revents & POLLOUT)) {
                k = write_nonblocking(log, p, n);
                if (k < 0 && errno == EINTR)
                    continue;
            }
            if (k < 0) {
                atomic_store(&log->stalled, 1);
                break;
            }
        }
        if (k <= 0)
            break;
        atomic_store(&log->stalled, 0);
        p += k;
        n -= (size_t)k;
    }
    if (n == 0)
        return 0;
    if (p > start && p[-1] != '\n')
        atomic_store(&log->cut, 1);
    return -1;
}

/*
 * A line longer than PIPE_BUF (a long target), or any line to a terminal, may be taken in part
 * before the room runs out and the rest is dropped: the line is then left open, and the next
 * write would go on with it, a client's target in front of another's entry. So such a cut is
 * remembered and the next write first ends it with a newline (its lines are dropped when even
 * that byte finds no room).
 */
static int write_piped(struct shmipc__access_log *log, const char *p, size_t n)
{
    if (atomic_exchange(&log->cut, 0) && write_piped_part(log, "\n", 1) < 0) {
        atomic_store(&log->cut, 1);
        return -1;
    }
    return write_piped_part(log, p, n);
}

static unsigned count_lines(const char *p, size_t n)
{
    unsigned c = 0;
    for (const char *e = p + n; (p = memchr(p, '\n', (size_t)(e - p))) != NULL; p++)
        c++;
    return c;
}

/* Whole lines p[0..n) to the log: one write to a file, writes of at most PIPE_BUF of whole
 * lines (a longer line alone) to anything else. */
static void log_write(struct shmipc__access_log *log, const char *p, size_t n)
{
    int piped = atomic_load(&log->pipe_like);
    while (n > 0) {
        size_t k = n;
        if (piped && k > PIPE_BUF) {
            const char *cut = NULL;
            for (const char *q = p; (q = memchr(q, '\n', (size_t)(p + PIPE_BUF - q))) != NULL; q++)
                cut = q;
            if (cut == NULL) /* one line longer than PIPE_BUF: alone */
                cut = memchr(p, '\n', n);
            k = cut != NULL ? (size_t)(cut - p) + 1 : n;
        }
        if ((piped ? write_piped(log, p, k) : write_all(log->fd, p, k)) == 0)
            atomic_fetch_add(&log->lines, count_lines(p, k));
        else
            atomic_fetch_add(&log->errors, 1);
        p += k;
        n -= k;
    }
}

/* ---- a thread's buffer -------------------------------------------------------------------- */

int shmipc__access_buf_init(struct shmipc__access_buf *b, struct shmipc__access_log *log)
{
    memset(b, 0, sizeof *b);
    if ((b->p = malloc(SHMIPC__ACCESS_BUF)) == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "access log buffer");
    b->log = log;
    b->cap = SHMIPC__ACCESS_BUF;
    return 0;
}

void shmipc__access_buf_flush(struct shmipc__access_buf *b)
{
    if (b->n > 0 && b->log != NULL)
        log_write(b->log, b->p, b->n);
    b->n = 0;
}

int shmipc__access_buf_add(struct shmipc__access_buf *b, const shmipc__access_entry *e)
{
    if (b->p == NULL || b->log == NULL)
        return 0;
    size_t need = shmipc__access_format_bound(e) + 1;
    if (need > b->cap - b->n)
        shmipc__access_buf_flush(b);
    if (need > b->cap) { /* a line longer than the buffer (a long target): alone */
        char *big = malloc(need);
        int n = big != NULL ? shmipc__access_format(b->log->format, e, big, need) : -1;
        if (n > 0)
            log_write(b->log, big, (size_t)n);
        else
            atomic_fetch_add(&b->log->errors, 1);
        free(big);
        return 0;
    }
    int n = shmipc__access_format(b->log->format, e, b->p + b->n, b->cap - b->n);
    if (n > 0) {
        b->n += (size_t)n;
    }
    return b->n > 0;
}

void shmipc__access_buf_free(struct shmipc__access_buf *b)
{
    shmipc__access_buf_flush(b);
    free(b->p);
    memset(b, 0, sizeof *b);
}
