/*
 * shmipc-serve's options (options.h, docs/serve.md "Configuration"): the option table, the
 * command line, the config file, the defaults and --help. The worker command and --check are in
 * check.c, the access-log formatter in access_log.c.
 *
 * One table describes every option: the command line and the config file go through the same
 * setter, so a key means exactly what its flag means and is checked the same way. Values are
 * parsed strictly (digits only, no sign, range checked before any overflow) and every error
 * names where it came from.
 */
#include "options.h"
#include "options_int.h"

#include "shmipc.h"
#include "serve/front.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

enum opt_type {
    T_FLAG,    /* no value on the command line; true/false in the file */
    T_KIND,    /* --wsgi, --asgi: a flag that sets the kind */
    T_KINDAPP, /* --lua FILE, --c LIB.so:symbol: the kind and the app */
    T_STR,
    T_UINT,
    T_SECONDS,
    T_FORMAT,
    T_LISTEN,
};

struct opt {
    const char *name;
    int type;
    int arg; /* T_KIND/T_KINDAPP: the kind; T_UINT/T_SECONDS: a field id */
    uint64_t min, max;
    int file_ok; /* allowed as a config file key */
};

enum field {
    F_APP = 1,
    F_LISTEN,
    F_WORKERS,
    F_THREADS,
    F_MAX_REQUESTS,
    F_TIMEOUT,
    F_QUEUE,
    F_PIPELINE,
    F_CONCURRENCY,
    F_GRACEFUL,
    F_ACCESS_LOG,
    F_FORMAT,
    F_PYTHON,
    F_CHDIR,
    F_CONFIG,
    F_CHECK,
    F_HELP,
    F_VERSION,
};

_Static_assert(SHMIPC__SERVE_MAX_TIMEOUT_MS <= SHMIPC__FRONT_MAX_DEADLINE,
               "every --timeout the options take is a deadline the front takes");

static const struct opt opts[] = {
    {"app", T_STR, F_APP, 0, 0, 1},
    {"wsgi", T_KIND, SHMIPC__SERVE_WSGI, 0, 0, 1},
    {"asgi", T_KIND, SHMIPC__SERVE_ASGI, 0, 0, 1},
    {"lua", T_KINDAPP, SHMIPC__SERVE_LUA, 0, 0, 1},
    {"c", T_KINDAPP, SHMIPC__SERVE_C, 0, 0, 1},
    {"listen", T_LISTEN, F_LISTEN, 0, 0, 1},
    {"workers", T_UINT, F_WORKERS, 1, SHMIPC__FRONT_MAX_WORKERS, 1},
    {"threads", T_UINT, F_THREADS, 1, SHMIPC__SERVE_MAX_THREADS, 1},
    {"max-requests", T_UINT, F_MAX_REQUESTS, 0, SHMIPC__SERVE_MAX_MAX_REQUESTS, 1},
    {"timeout", T_SECONDS, F_TIMEOUT, 0, SHMIPC__SERVE_MAX_TIMEOUT_MS, 1},
    {"queue", T_UINT, F_QUEUE, 0, SHMIPC__SERVE_MAX_QUEUE, 1},
    {"pipeline", T_UINT, F_PIPELINE, 1, SHMIPC__FRONT_MAX_PIPELINE, 1},
    {"concurrency", T_UINT, F_CONCURRENCY, 1, SHMIPC__FRONT_MAX_CONCURRENCY, 1},
    {"graceful-timeout", T_SECONDS, F_GRACEFUL, 1, SHMIPC__SERVE_MAX_SECONDS_MS, 1},
    {"access-log", T_STR, F_ACCESS_LOG, 0, 0, 1},
    {"access-log-format", T_FORMAT, F_FORMAT, 0, 0, 1},
    {"python", T_STR, F_PYTHON, 0, 0, 1},
    {"chdir", T_STR, F_CHDIR, 0, 0, 1},
    {"config", T_STR, F_CONFIG, 0, 0, 0},
    {"check", T_FLAG, F_CHECK, 0, 0, 0},
    {"help", T_FLAG, F_HELP, 0, 0, 0},
    {"version", T_FLAG, F_VERSION, 0, 0, 0},
};
#define NOPTS (sizeof opts / sizeof opts[0])

/* Where the application and its kind came from, so that the command line overrides the file
 * and two kinds in one source are an error. */
struct parse_state {
    int kind_src;        /* 0 none, 1 file, 2 command line */
    int app_src;         /* 0, 1, 2: app given by APP/app (not by --lua/--c) */
    int kapp_src;        /* the kind's own app (--lua FILE, --c LIB) */
    const char *kind_by; /* the flag that set the kind, for messages */
};

void shmipc__serve_set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

const char *shmipc__serve_shown(const char *v, char *buf, size_t cap)
{
    size_t n = 0;
    for (const char *p = v; *p != '\0'; p++) {
        unsigned char c = (unsigned char)*p;
        if (n + 4 >= cap) {
            memcpy(buf + n, "...", 3);
            n += 3;
            break;
        }
        buf[n++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    buf[n] = '\0';
    return buf;
}

const char *shmipc__serve_kind_name(int kind)
{
    switch (kind) {
    case SHMIPC__SERVE_WSGI:
        return "wsgi";
    case SHMIPC__SERVE_ASGI:
        return "asgi";
    case SHMIPC__SERVE_LUA:
        return "lua";
    case SHMIPC__SERVE_C:
        return "c";
    default:
        return "?";
    }
}

int shmipc__serve_options_init(shmipc__serve_options *o)
{
    if (o == NULL)
        return SHMIPC_EINVAL;
    memset(o, 0, sizeof *o);
    o->kind = SHMIPC__SERVE_WSGI;
    o->workers = 1;
    o->threads = 1;
    o->timeout_ms = 60000;
    o->queue = 1024;
    o->pipeline = SHMIPC__FRONT_DEFAULT_PIPELINE;
    o->graceful_timeout_ms = 30000;
    o->access_log_format = SHMIPC__ACCESS_COMMON;
    o->listen = strdup("127.0.0.1:8000");
    o->python = strdup("python3");
    if (o->listen == NULL || o->python == NULL) {
        shmipc__serve_options_free(o);
        return SHMIPC_ENOMEM;
    }
    return 0;
}

void shmipc__serve_options_free(shmipc__serve_options *o)
{
    if (o == NULL)
        return;
    free(o->app);
    free(o->listen);
    free(o->access_log);
    free(o->python);
    free(o->chdir_to);
    free(o->config);
    o->app = o->listen = o->access_log = o->python = o->chdir_to = o->config = NULL;
}

static const struct opt *find_opt(const char *name, size_t len)
{
    for (size_t i = 0; i < NOPTS; i++)
        if (strlen(opts[i].name) == len && memcmp(opts[i].name, name, len) == 0)
            return &opts[i];
    return NULL;
}

/* Digits only, at most max; no sign, no space, no 0x. */
static int parse_uint(const char *v, uint64_t min, uint64_t max, uint64_t *out)
{
    uint64_t n = 0;
    if (*v == '\0')
        return -1;
    for (const char *p = v; *p != '\0'; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        unsigned d = (unsigned)(*p - '0');
        if (n > (max - d) / 10)
            return -2; /* over max, before it could overflow */
        n = n * 10 + d;
    }
    if (n < min)
        return -2;
    *out = n;
    return 0;
}

/* Seconds with up to 3 decimals ("30", "2.5", "0.001") to milliseconds, min..max ms. */
static int parse_seconds(const char *v, uint64_t min, uint64_t max, uint64_t *out)
{
    uint64_t ms = 0;
    const char *p = v;
    if (*p < '0' || *p > '9')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (ms > (max / 1000 + 1))
            return -2;
        ms = ms * 10 + (uint64_t)(*p - '0');
    }
    ms *= 1000;
    if (*p == '.') {
        p++;
        uint64_t scale = 100;
        if (*p < '0' || *p > '9')
            return -1;
        for (; *p >= '0' && *p <= '9'; p++) {
            if (scale == 0)
                return -3; /* finer than a millisecond */
            ms += (uint64_t)(*p - '0') * scale;
            scale /= 10;
        }
    }
    if (*p != '\0')
        return -1;
    if (ms < min || ms > max)
        return -2;
    *out = ms;
    return 0;
}

static int parse_bool(const char *v)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < 4; i++) {
        if (strcmp(v, yes[i]) == 0)
            return 1;
        if (strcmp(v, no[i]) == 0)
            return 0;
    }
    return -1;
}

/* IPv4:port, [IPv6]:port or unix:PATH: the host numeric, as the HTTP server binds only those
 * (shmipc_server_config_set_address); --check looks at the unix socket's directory. */
static int check_listen(const char *v, char *why, size_t cap)
{
    if (strncmp(v, "unix:", 5) == 0) {
        if (v[5] == '\0' || (v[5] == '@' && v[6] == '\0')) {
            snprintf(why, cap, "unix: needs a path (or @ and a name)");
            return -1;
        }
        if (strlen(v + 5) >= 108) {
            snprintf(why, cap, "the unix socket path is longer than 107 bytes");
            return -1;
        }
        return 0;
    }
    const char *colon;
    if (v[0] == '[') {
        const char *close = strchr(v, ']');
        if (close == NULL || close == v + 1 || close[1] != ':') {
            snprintf(why, cap, "expected [IPv6]:PORT");
            return -1;
        }
        colon = close + 1;
    } else {
        colon = strrchr(v, ':');
        if (colon == NULL || colon == v) {
            snprintf(why, cap, "expected HOST:PORT (a numeric IPv4), [IPv6]:PORT or unix:PATH");
            return -1;
        }
        if (memchr(v, ':', (size_t)(colon - v)) != NULL) {
            snprintf(why, cap, "an IPv6 address goes in brackets: [::1]:8000");
            return -1;
        }
    }
    uint64_t port;
    /* 0: the kernel picks the port; main.c's "listening on" line says which. */
    if (parse_uint(colon + 1, 0, 65535, &port) != 0) {
        snprintf(why, cap, "the port must be 0 .. 65535 (0: the kernel picks one)");
        return -1;
    }
    for (const char *p = v; p < colon; p++)
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f) {
            snprintf(why, cap, "the host has a space or control byte");
            return -1;
        }
    /* The host as main.c's set_listen hands it to the server: without its brackets. */
    char host[INET6_ADDRSTRLEN];
    const char *h = v[0] == '[' ? v + 1 : v;
    size_t hl = (size_t)((v[0] == '[' ? colon - 1 : colon) - h);
    unsigned char addr[sizeof(struct in6_addr)];
    if (hl >= sizeof host) {
        snprintf(why, cap, "the host is not a numeric IPv4 or IPv6 address (no names)");
        return -1;
    }
    memcpy(host, h, hl);
    host[hl] = '\0';
    if (inet_pton(AF_INET, host, addr) != 1 && inet_pton(AF_INET6, host, addr) != 1) {
        snprintf(why, cap, "the host is not a numeric IPv4 or IPv6 address (no names)");
        return -1;
    }
    return 0;
}

static int set_str(char **field, const char *v)
{
    char *c = strdup(v);
    if (c == NULL)
        return SHMIPC_ENOMEM;
    free(*field);
    *field = c;
    return 0;
}

/*
 * Applies one option. `where` prefixes errors ("--workers" or "FILE:LINE: workers"); src is
 * 1 for the file, 2 for the command line. v is NULL for a flag given without a value.
 */
static int apply(shmipc__serve_options *o, struct parse_state *ps, const struct opt *op,
                 const char *v, int src, const char *where, char *err, size_t errlen)
{
    char sb[80], why[96];
    uint64_t n = 0;
    if (v != NULL && strlen(v) > SHMIPC__SERVE_MAX_VALUE) {
        shmipc__serve_set_err(err, errlen, "%s: the value is longer than %u bytes", where,
                              SHMIPC__SERVE_MAX_VALUE);
        return SHMIPC_EINVAL;
    }
    if (v != NULL && (op->type == T_STR || op->type == T_KINDAPP || op->type == T_LISTEN) &&
        v[0] == '\0') {
        shmipc__serve_set_err(err, errlen, "%s: the value is empty", where);
        return SHMIPC_EINVAL;
    }
    switch (op->type) {
    case T_FLAG:
    case T_KIND: {
        int on = 1;
        if (v != NULL && (on = parse_bool(v)) < 0) {
            shmipc__serve_set_err(err, errlen, "%s: '%s' is not true or false", where,
                                  shmipc__serve_shown(v, sb, sizeof sb));
            return SHMIPC_EINVAL;
        }
        if (op->type == T_FLAG) {
            int *f = op->arg == F_CHECK ? &o->check : op->arg == F_HELP ? &o->help : &o->version;
            *f = on;
            return 0;
        }
        if (!on)
            return 0; /* "asgi = false": nothing chosen */
        if (ps->kind_src == src && o->kind != op->arg) {
            shmipc__serve_set_err(err, errlen, "%s: the application kind was already set by %s",
                                  where, ps->kind_by);
            return SHMIPC_EINVAL;
        }
        if (ps->kind_src < src && ps->kapp_src != 0) {
            /* The command line's --asgi replaces the file's "lua = FILE" with its app. */
            free(o->app);
            o->app = NULL;
            ps->kapp_src = 0;
        }
        o->kind = op->arg;
        ps->kind_src = src;
        ps->kind_by = op->name;
        return 0;
    }
    case T_KINDAPP:
        if (ps->kind_src == src && o->kind != op->arg) {
            shmipc__serve_set_err(err, errlen, "%s: the application kind was already set by %s",
                                  where, ps->kind_by);
            return SHMIPC_EINVAL;
        }
        if (ps->app_src == src) {
            shmipc__serve_set_err(err, errlen, "%s: the application was already given as APP",
                                  where);
            return SHMIPC_EINVAL;
        }
        if (op->arg == SHMIPC__SERVE_C || op->arg == SHMIPC__SERVE_LUA) {
            /* LIB.so[:SYMBOL], MODULE[:FUNCTION]: the worker resolves the name. */
            const char *c = strrchr(v, ':');
            if (v[0] == ':' || (c != NULL && c[1] == '\0')) {
                shmipc__serve_set_err(
                    err, errlen, "%s: '%s' is not %s", where, shmipc__serve_shown(v, sb, sizeof sb),
                    op->arg == SHMIPC__SERVE_C ? "LIB.so[:SYMBOL]" : "MODULE[:FUNCTION]");
                return SHMIPC_EINVAL;
            }
        }
        if (set_str(&o->app, v) != 0)
            return SHMIPC_ENOMEM;
        o->kind = op->arg;
        ps->kind_src = src;
        ps->kind_by = op->name;
        ps->kapp_src = src;
        ps->app_src = 0;
        return 0;
    case T_STR:
        switch (op->arg) {
        case F_APP:
            if (ps->kapp_src == src) {
                shmipc__serve_set_err(err, errlen, "%s: the application was already given by --%s",
                                      where, shmipc__serve_kind_name(o->kind));
                return SHMIPC_EINVAL;
            }
            if (ps->kapp_src != 0 && ps->kapp_src < src && ps->kind_src <= ps->kapp_src) {
                /* APP on the command line over the file's "lua = FILE": back to the default
                 * kind unless the command line names one. */
                o->kind = SHMIPC__SERVE_WSGI;
                ps->kind_src = 0;
            }
            ps->kapp_src = 0;
            ps->app_src = src;
            return set_str(&o->app, v);
        case F_ACCESS_LOG:
            return set_str(&o->access_log, v);
        case F_PYTHON:
            return set_str(&o->python, v);
        case F_CHDIR:
            return set_str(&o->chdir_to, v);
        case F_CONFIG:
            return set_str(&o->config, v);
        }
        return SHMIPC_EINVAL;
    case T_LISTEN:
        if (check_listen(v, why, sizeof why) != 0) {
            shmipc__serve_set_err(err, errlen, "%s: '%s': %s", where,
                                  shmipc__serve_shown(v, sb, sizeof sb), why);
            return SHMIPC_EINVAL;
        }
        return set_str(&o->listen, v);
    case T_FORMAT:
        if (strcmp(v, "common") == 0)
            o->access_log_format = SHMIPC__ACCESS_COMMON;
        else if (strcmp(v, "json") == 0)
            o->access_log_format = SHMIPC__ACCESS_JSON;
        else {
            shmipc__serve_set_err(err, errlen, "%s: '%s' is not common or json", where,
                                  shmipc__serve_shown(v, sb, sizeof sb));
            return SHMIPC_EINVAL;
        }
        return 0;
    case T_UINT: {
        int r = parse_uint(v, op->min, op->max, &n);
        if (r == -1) {
            shmipc__serve_set_err(err, errlen, "%s: '%s' is not a number (digits only)", where,
                                  shmipc__serve_shown(v, sb, sizeof sb));
            return SHMIPC_EINVAL;
        }
        if (r != 0) {
            shmipc__serve_set_err(err, errlen, "%s: '%s' is out of range (%llu .. %llu)", where,
                                  shmipc__serve_shown(v, sb, sizeof sb),
                                  (unsigned long long)op->min, (unsigned long long)op->max);
            return SHMIPC_EINVAL;
        }
        if (op->arg == F_WORKERS)
            o->workers = (unsigned)n;
        else if (op->arg == F_THREADS)
            o->threads = (unsigned)n;
        else if (op->arg == F_QUEUE)
            o->queue = (unsigned)n;
        else if (op->arg == F_PIPELINE)
            o->pipeline = (unsigned)n;
        else if (op->arg == F_CONCURRENCY)
            o->concurrency = (unsigned)n;
        else
            o->max_requests = n;
        return 0;
    }
    case T_SECONDS: {
        int r = parse_seconds(v, op->min, op->max, &n);
        if (r == -1 || r == -3) {
            shmipc__serve_set_err(err, errlen,
                                  "%s: '%s' is not a number of seconds (like 30 or 2.5, %s)", where,
                                  shmipc__serve_shown(v, sb, sizeof sb),
                                  r == -3 ? "at most 3 decimals" : "digits and one point");
            return SHMIPC_EINVAL;
        }
        if (r != 0) {
            shmipc__serve_set_err(err, errlen, "%s: '%s' is out of range (%g .. %g seconds)", where,
                                  shmipc__serve_shown(v, sb, sizeof sb), (double)op->min / 1000.0,
                                  (double)op->max / 1000.0);
            return SHMIPC_EINVAL;
        }
        if (op->arg == F_TIMEOUT)
            o->timeout_ms = (uint32_t)n;
        else
            o->graceful_timeout_ms = (uint32_t)n;
        return 0;
    }
    }
    return SHMIPC_EINVAL;
}

static int load_file(shmipc__serve_options *o, struct parse_state *ps, const char *path, char *err,
                     size_t errlen)
{
    char pathbuf[256];
    shmipc__serve_shown(path, pathbuf, sizeof pathbuf);
    /* O_NONBLOCK: open() of a FIFO without a writer would wait for one (a FIFO is refused as
     * not a regular file below); reads of a regular file ignore it. O_NOCTTY: a terminal named
     * by mistake does not become the controlling one. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        shmipc__serve_set_err(err, errlen, "%s: cannot open: %s", pathbuf, strerror(errno));
        return SHMIPC_EINVAL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        shmipc__serve_set_err(err, errlen, "%s: not a regular file", pathbuf);
        close(fd);
        return SHMIPC_EINVAL;
    }
    /* Room for the file as fstat() sizes it and the NUL the last line gets, or more as it
     * reads (a file in /proc says 0): up to one byte past the limit, which refuses it. */
    size_t cap = st.st_size < (off_t)SHMIPC__SERVE_MAX_FILE ? (size_t)st.st_size + 1
                                                            : SHMIPC__SERVE_MAX_FILE + 1;
    char *buf = malloc(cap);
    if (buf == NULL) {
        close(fd);
        return SHMIPC_ENOMEM;
    }
    size_t len = 0;
    for (;;) {
        if (len == cap) {
            size_t more =
                cap > (SHMIPC__SERVE_MAX_FILE + 1) / 2 ? SHMIPC__SERVE_MAX_FILE + 1 : 2 * cap;
            char *grown = realloc(buf, more);
            if (grown == NULL) {
                free(buf);
                close(fd);
                return SHMIPC_ENOMEM;
            }
            buf = grown;
            cap = more;
        }
        ssize_t k = read(fd, buf + len, cap - len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            shmipc__serve_set_err(err, errlen, "%s: cannot read: %s", pathbuf, strerror(errno));
            free(buf);
            close(fd);
            return SHMIPC_EINVAL;
        }
        if (k == 0)
            break;
        len += (size_t)k;
        if (len > SHMIPC__SERVE_MAX_FILE) {
            shmipc__serve_set_err(err, errlen, "%s: larger than %u bytes", pathbuf,
                                  SHMIPC__SERVE_MAX_FILE);
            free(buf);
            close(fd);
            return SHMIPC_EINVAL;
        }
    }
    close(fd);
    /* Which keys were set, and on which line, for duplicates. */
    unsigned seen[NOPTS] = {0};
    int rc = 0;
    unsigned lineno = 0;
    char where[320];
    for (size_t pos = 0; pos < len && rc == 0;) {
        lineno++;
        char *line = buf + pos;
        char *nl = memchr(line, '\n', len - pos);
        size_t ll = nl != NULL ? (size_t)(nl - line) : len - pos;
        pos += ll + (nl != NULL);
        if (ll > SHMIPC__SERVE_MAX_LINE) {
            shmipc__serve_set_err(err, errlen, "%s:%u: the line is longer than %u bytes", pathbuf,
                                  lineno, SHMIPC__SERVE_MAX_LINE);
            rc = SHMIPC_EINVAL;
            break;
        }
        if (memchr(line, '\0', ll) != NULL) {
            shmipc__serve_set_err(err, errlen, "%s:%u: a NUL byte", pathbuf, lineno);
            rc = SHMIPC_EINVAL;
            break;
        }
        line[ll] = '\0';
        /* Trim spaces, tabs and a CR (files written on Windows). */
        while (*line == ' ' || *line == '\t')
            line++, ll--;
        while (ll > 0 && (line[ll - 1] == ' ' || line[ll - 1] == '\t' || line[ll - 1] == '\r'))
            line[--ll] = '\0';
        if (ll == 0 || line[0] == '#')
            continue;
        char *eq = strchr(line, '=');
        if (eq == NULL) {
            shmipc__serve_set_err(err, errlen, "%s:%u: expected 'key = value'", pathbuf, lineno);
            rc = SHMIPC_EINVAL;
            break;
        }
        char *key = line, *kend = eq, *val = eq + 1;
        while (kend > key && (kend[-1] == ' ' || kend[-1] == '\t'))
            kend--;
        *kend = '\0';
        while (*val == ' ' || *val == '\t')
            val++;
        if (*key == '\0') {
            shmipc__serve_set_err(err, errlen, "%s:%u: a value without a key", pathbuf, lineno);
            rc = SHMIPC_EINVAL;
            break;
        }
        const struct opt *op = find_opt(key, strlen(key));
        if (op == NULL || !op->file_ok) {
            char kb[80];
            shmipc__serve_set_err(err, errlen,
                                  op == NULL
                                      ? "%s:%u: unknown key '%s' (keys are the long option names, "
                                        "without --)"
                                      : "%s:%u: '%s' is a command-line option only",
                                  pathbuf, lineno, shmipc__serve_shown(key, kb, sizeof kb));
            rc = SHMIPC_EINVAL;
            break;
        }
        size_t idx = (size_t)(op - opts);
        if (seen[idx] != 0) {
            shmipc__serve_set_err(err, errlen, "%s:%u: '%s' again (first set on line %u)", pathbuf,
                                  lineno, op->name, seen[idx]);
            rc = SHMIPC_EINVAL;
            break;
        }
        seen[idx] = lineno;
        if (*val == '\0') {
            shmipc__serve_set_err(err, errlen, "%s:%u: '%s' has no value", pathbuf, lineno,
                                  op->name);
            rc = SHMIPC_EINVAL;
            break;
        }
        snprintf(where, sizeof where, "%s:%u: %s", pathbuf, lineno, op->name);
        rc = apply(o, ps, op, val, 1, where, err, errlen);
    }
    free(buf);
    return rc;
}

int shmipc__serve_options_load_file(shmipc__serve_options *o, const char *path, char *err,
                                    size_t errlen)
{
    shmipc__serve_set_err(err, errlen, "%s", "");
    if (o == NULL || path == NULL) {
        shmipc__serve_set_err(err, errlen, "no options or no path");
        return SHMIPC_EINVAL;
    }
    struct parse_state ps = {0};
    int rc = load_file(o, &ps, path, err, errlen);
    if (rc == 0)
        rc = set_str(&o->config, path);
    return rc;
}

/* The name of a command-line argument "--name" or "--name=value"; NULL for others. */
static const struct opt *cli_opt(const char *a, const char **inline_val)
{
    *inline_val = NULL;
    if (a[0] != '-' || a[1] != '-' || a[2] == '\0')
        return NULL;
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t len = eq != NULL ? (size_t)(eq - name) : strlen(name);
    if (eq != NULL)
        *inline_val = eq + 1;
    return find_opt(name, len);
}

/* --config is read before the other flags, and stored rather than applied. */
static int is_config(const struct opt *op)
{
    return op->type == T_STR && op->arg == F_CONFIG;
}

/*
 * The command line, one argument at a time, as the parser reads it: a "--" ends the flags
 * unless it is a flag's value, and a flag that takes a value and has no "=value" takes the
 * next argument, whatever it looks like. The --config scan and the parser both walk argv with
 * this, so they cannot disagree on which argument is a flag and which is a value.
 */
struct arg_iter {
    int argc;
    char *const *argv;
    int i;               /* the next argument */
    int only_positional; /* a "--" was seen */
    /* What arg_next returned: the argument as given, its option and the option's value. */
    const char *a;
    const struct opt *op;
    const char *v;
};

enum arg_kind {
    ARG_END,        /* no more arguments: argc reached, or a NULL */
    ARG_POSITIONAL, /* a: an APP */
    ARG_UNKNOWN,    /* a: "-x", "--bogus" */
    ARG_NO_VALUE,   /* op: takes a value, and no argument is left for it */
    ARG_OPTION,     /* op, and v: its value, or NULL for a flag given without "=value" */
};

static enum arg_kind arg_next(struct arg_iter *it)
{
    for (;;) {
        if (it->i >= it->argc || it->argv[it->i] == NULL)
            return ARG_END;
        it->a = it->argv[it->i++];
        if (it->only_positional || strcmp(it->a, "--") != 0)
            break;
        it->only_positional = 1;
    }
    it->op = NULL;
    it->v = NULL;
    if (it->only_positional || it->a[0] != '-' || it->a[1] == '\0')
        return ARG_POSITIONAL;
    it->op = cli_opt(it->a, &it->v);
    if (it->op == NULL)
        return ARG_UNKNOWN;
    if (it->op->type == T_FLAG || it->op->type == T_KIND || it->v != NULL)
        return ARG_OPTION;
    if (it->i >= it->argc || it->argv[it->i] == NULL)
        return ARG_NO_VALUE;
    it->v = it->argv[it->i++];
    return ARG_OPTION;
}

int shmipc__serve_validate(shmipc__serve_options *o, char *err, size_t errlen)
{
    char sb[80];
    if (o->help || o->version)
        return 0;
    if (o->app == NULL) {
        shmipc__serve_set_err(
            err, errlen,
            "no application: give APP (module:callable), --lua FILE or --c LIB.so:symbol "
            "(see --help)");
        return SHMIPC_EINVAL;
    }
    if (o->kind == SHMIPC__SERVE_WSGI || o->kind == SHMIPC__SERVE_ASGI) {
        /* module:callable, dotted names of identifiers. */
        const char *c = strchr(o->app, ':');
        int ok = c != NULL && c != o->app && c[1] != '\0' && strchr(c + 1, ':') == NULL;
        for (const char *p = o->app; ok && *p != '\0'; p++) {
            unsigned char ch = (unsigned char)*p;
            ok = ch == ':' || ch == '.' || ch == '_' || (ch >= '0' && ch <= '9') ||
                 (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch >= 0x80;
            if (ok && ch == '.' &&
                (p == o->app || p[-1] == '.' || p[-1] == ':' || p[1] == '.' || p[1] == ':' ||
                 p[1] == '\0'))
                ok = 0;
        }
        if (!ok) {
            shmipc__serve_set_err(err, errlen, "APP '%s' is not module:callable (like myapp:app)",
                                  shmipc__serve_shown(o->app, sb, sizeof sb));
            return SHMIPC_EINVAL;
        }
    }
    /* Only the ASGI worker runs requests side by side; the others run one at a time. */
    if (o->concurrency != 0 && o->kind != SHMIPC__SERVE_ASGI) {
        shmipc__serve_set_err(err, errlen,
                              "--concurrency is for --asgi apps (a %s worker runs one request at "
                              "a time; see --pipeline and --workers)",
                              shmipc__serve_kind_name(o->kind));
        return SHMIPC_EINVAL;
    }
    return 0;
}

int shmipc__serve_options_parse(shmipc__serve_options *o, int argc, char *const *argv, char *err,
                                size_t errlen)
{
    char sb[80], where[96];
    shmipc__serve_set_err(err, errlen, "%s", "");
    if (o == NULL || argc < 0 || (argc > 0 && argv == NULL)) {
        shmipc__serve_set_err(err, errlen, "no options or no arguments");
        return SHMIPC_EINVAL;
    }
    struct parse_state ps = {0};
    struct arg_iter it = {.argc = argc, .argv = argv, .i = 1};
    enum arg_kind k;
    /* First the config file, wherever --config is on the line, so that flags override it. The
     * scan reads the arguments as the loop below does: another flag's value ("--python
     * --config=x") is not a flag, and a "--" that is a value does not end the flags. */
    const char *config = NULL;
    while ((k = arg_next(&it)) != ARG_END) {
        if (k == ARG_NO_VALUE && is_config(it.op)) {
            shmipc__serve_set_err(err, errlen, "--config needs a value");
            return SHMIPC_EINVAL;
        }
        if (k != ARG_OPTION || !is_config(it.op))
            continue; /* the loop below refuses what is wrong with it */
        if (config != NULL) {
            shmipc__serve_set_err(err, errlen, "--config given twice");
            return SHMIPC_EINVAL;
        }
        config = it.v;
    }
    if (config != NULL) {
        if (config[0] == '\0') {
            shmipc__serve_set_err(err, errlen, "--config: the value is empty");
            return SHMIPC_EINVAL;
        }
        int rc = load_file(o, &ps, config, err, errlen);
        if (rc != 0)
            return rc;
    }
    it = (struct arg_iter){.argc = argc, .argv = argv, .i = 1};
    while ((k = arg_next(&it)) != ARG_END) {
        int rc;
        if (k == ARG_POSITIONAL) {
            if (ps.app_src == 2) {
                char ab[80];
                shmipc__serve_set_err(err, errlen, "unexpected argument '%s' (APP was '%s')",
                                      shmipc__serve_shown(it.a, sb, sizeof sb),
                                      shmipc__serve_shown(o->app, ab, sizeof ab));
                return SHMIPC_EINVAL;
            }
            rc = apply(o, &ps, find_opt("app", 3), it.a, 2, "APP", err, errlen);
            if (rc != 0)
                return rc;
            continue;
        }
        if (k == ARG_UNKNOWN) {
            shmipc__serve_set_err(err, errlen, "unknown option '%s' (see --help)",
                                  shmipc__serve_shown(it.a, sb, sizeof sb));
            return SHMIPC_EINVAL;
        }
        snprintf(where, sizeof where, "--%s", it.op->name);
        if (k == ARG_NO_VALUE) {
            shmipc__serve_set_err(err, errlen, "%s needs a value", where);
            return SHMIPC_EINVAL;
        }
        if ((it.op->type == T_FLAG || it.op->type == T_KIND) && it.v != NULL) {
            shmipc__serve_set_err(err, errlen, "%s takes no value", where);
            return SHMIPC_EINVAL;
        }
        if (is_config(it.op)) {
            if ((rc = set_str(&o->config, it.v)) != 0)
                return rc;
            continue;
        }
        rc = apply(o, &ps, it.op, it.v, 2, where, err, errlen);
        if (rc != 0)
            return rc;
    }
    return shmipc__serve_validate(o, err, errlen);
}

const char *shmipc__serve_usage(void)
{
    return "usage: shmipc-serve [options] APP\n"
           "\n"
           "Serves APP over HTTP/1.1 from supervised worker processes (docs/serve.md).\n"
           "\n"
           "  APP                      the application: module:callable for --wsgi/--asgi\n"
           "  --wsgi                   APP is a WSGI app (the default)\n"
           "  --asgi                   APP is an ASGI 3 app (http and lifespan)\n"
           "  --lua MODULE[:FUNCTION]  a Lua handler module (or FILE.lua), in shmipc-serve-worker\n"
           "  --c LIB.so[:SYMBOL]      a C handler in a shared object (SYMBOL: "
           "shmipc_serve_handle)\n"
           "  --listen ADDR            IPv4:PORT, [IPv6]:PORT or unix:PATH (127.0.0.1:8000);\n"
           "                           PORT 0: the kernel picks one, the 'listening on' line "
           "says it\n"
           "  --workers N              worker processes, 1 .. 64 (1)\n"
           "  --threads N              the front's reactor threads, 1 .. 256 (1)\n"
           "  --max-requests N         a worker is replaced after N requests (0: never)\n"
           "  --timeout S              request deadline in seconds, then 504; 0 .. 3600 (60; 0: "
           "none)\n"
           "  --queue N                requests waiting for a free worker, then 503 (1024)\n"
           "  --pipeline N             requests in flight per worker when all are busy, 1 .. 16 "
           "(1)\n"
           "  --concurrency N          --asgi: requests and WebSockets each worker runs at once "
           "on its loop, 1 .. 256 (64)\n"
           "  --graceful-timeout S     SIGTERM to SIGKILL on stop and reload (30)\n"
           "  --access-log PATH|-      log each request to PATH or stdout (none)\n"
           "  --access-log-format F    common or json (common)\n"
           "  --python PATH            the interpreter of Python workers (python3)\n"
           "  --chdir DIR              the workers' directory, where APP is imported from\n"
           "  --config FILE            read options from FILE first ('key = value' lines)\n"
           "  --check                  validate the options and APP, then exit 0 or 2\n"
           "  --help                   this text\n"
           "  --version                the version\n"
           "\n"
           "Signals: SIGTERM/SIGINT/SIGQUIT stop gracefully, SIGHUP reloads the workers, SIGUSR1\n"
           "prints the workers' states to stderr, SIGUSR2 reopens the access log.\n";
}
