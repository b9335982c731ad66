/*
 * shmipc-serve's options, config file and --check (options.h, docs/serve.md "Configuration").
 *
 * One table describes every option: the command line and the config file go through the same
 * setter, so a key means exactly what its flag means and is checked the same way. Values are
 * parsed strictly (digits only, no sign, range checked before any overflow) and every error
 * names where it came from.
 */
#include "options.h"

#include "shmipc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
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

static const struct opt opts[] = {
    {"app", T_STR, F_APP, 0, 0, 1},
    {"wsgi", T_KIND, SHMIPC__SERVE_WSGI, 0, 0, 1},
    {"asgi", T_KIND, SHMIPC__SERVE_ASGI, 0, 0, 1},
    {"lua", T_KINDAPP, SHMIPC__SERVE_LUA, 0, 0, 1},
    {"c", T_KINDAPP, SHMIPC__SERVE_C, 0, 0, 1},
    {"listen", T_LISTEN, F_LISTEN, 0, 0, 1},
    {"workers", T_UINT, F_WORKERS, 1, 1024, 1},
    {"threads", T_UINT, F_THREADS, 1, SHMIPC__SERVE_MAX_THREADS, 1},
    {"max-requests", T_UINT, F_MAX_REQUESTS, 0, SHMIPC__SERVE_MAX_MAX_REQUESTS, 1},
    {"timeout", T_SECONDS, F_TIMEOUT, 0, SHMIPC__SERVE_MAX_SECONDS_MS, 1},
    {"queue", T_UINT, F_QUEUE, 0, SHMIPC__SERVE_MAX_QUEUE, 1},
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

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* A value for a message: printable ASCII ('?' for other bytes), cut with "..." to fit cap. */
static const char *shown(const char *v, char *buf, size_t cap)
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

/* host:port, [v6]:port or unix:PATH: the shape only (--check resolves it). */
static int check_listen(const char *v, char *why, size_t cap)
{
    if (strncmp(v, "unix:", 5) == 0) {
        if (v[5] == '\0') {
            snprintf(why, cap, "unix: needs a path");
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
            snprintf(why, cap, "expected HOST:PORT, [IPv6]:PORT or unix:PATH");
            return -1;
        }
        if (memchr(v, ':', (size_t)(colon - v)) != NULL) {
            snprintf(why, cap, "an IPv6 address goes in brackets: [::1]:8000");
            return -1;
        }
    }
    uint64_t port;
    if (parse_uint(colon + 1, 1, 65535, &port) != 0) {
        snprintf(why, cap, "the port must be 1 .. 65535");
        return -1;
    }
    for (const char *p = v; p < colon; p++)
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f) {
            snprintf(why, cap, "the host has a space or control byte");
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
        set_err(err, errlen, "%s: the value is longer than %u bytes", where,
                SHMIPC__SERVE_MAX_VALUE);
        return SHMIPC_EINVAL;
    }
    if (v != NULL && (op->type == T_STR || op->type == T_KINDAPP || op->type == T_LISTEN) &&
        v[0] == '\0') {
        set_err(err, errlen, "%s: the value is empty", where);
        return SHMIPC_EINVAL;
    }
    switch (op->type) {
    case T_FLAG:
    case T_KIND: {
        int on = 1;
        if (v != NULL && (on = parse_bool(v)) < 0) {
            set_err(err, errlen, "%s: '%s' is not true or false", where, shown(v, sb, sizeof sb));
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
            set_err(err, errlen, "%s: the application kind was already set by %s", where,
                    ps->kind_by);
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
            set_err(err, errlen, "%s: the application kind was already set by %s", where,
                    ps->kind_by);
            return SHMIPC_EINVAL;
        }
        if (ps->app_src == src) {
            set_err(err, errlen, "%s: the application was already given as APP", where);
            return SHMIPC_EINVAL;
        }
        if (op->arg == SHMIPC__SERVE_C) {
            const char *c = strrchr(v, ':');
            if (c == NULL || c == v || c[1] == '\0') {
                set_err(err, errlen, "%s: '%s' is not LIB.so:symbol", where,
                        shown(v, sb, sizeof sb));
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
                set_err(err, errlen, "%s: the application was already given by --%s", where,
                        shmipc__serve_kind_name(o->kind));
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
            set_err(err, errlen, "%s: '%s': %s", where, shown(v, sb, sizeof sb), why);
            return SHMIPC_EINVAL;
        }
        return set_str(&o->listen, v);
    case T_FORMAT:
        if (strcmp(v, "common") == 0)
            o->access_log_format = SHMIPC__ACCESS_COMMON;
        else if (strcmp(v, "json") == 0)
            o->access_log_format = SHMIPC__ACCESS_JSON;
        else {
            set_err(err, errlen, "%s: '%s' is not common or json", where, shown(v, sb, sizeof sb));
            return SHMIPC_EINVAL;
        }
        return 0;
    case T_UINT: {
        int r = parse_uint(v, op->min, op->max, &n);
        if (r == -1) {
            set_err(err, errlen, "%s: '%s' is not a number (digits only)", where,
                    shown(v, sb, sizeof sb));
            return SHMIPC_EINVAL;
        }
        if (r != 0) {
            set_err(err, errlen, "%s: '%s' is out of range (%llu .. %llu)", where,
                    shown(v, sb, sizeof sb), (unsigned long long)op->min,
                    (unsigned long long)op->max);
            return SHMIPC_EINVAL;
        }
        if (op->arg == F_WORKERS)
            o->workers = (unsigned)n;
        else if (op->arg == F_THREADS)
            o->threads = (unsigned)n;
        else if (op->arg == F_QUEUE)
            o->queue = (unsigned)n;
        else
            o->max_requests = n;
        return 0;
    }
    case T_SECONDS: {
        int r = parse_seconds(v, op->min, op->max, &n);
        if (r == -1 || r == -3) {
            set_err(err, errlen, "%s: '%s' is not a number of seconds (like 30 or 2.5, %s)", where,
                    shown(v, sb, sizeof sb),
                    r == -3 ? "at most 3 decimals" : "digits and one point");
            return SHMIPC_EINVAL;
        }
        if (r != 0) {
            set_err(err, errlen, "%s: '%s' is out of range (%g .. %g seconds)", where,
                    shown(v, sb, sizeof sb), (double)op->min / 1000.0, (double)op->max / 1000.0);
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
    shown(path, pathbuf, sizeof pathbuf);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        set_err(err, errlen, "%s: cannot open: %s", pathbuf, strerror(errno));
        return SHMIPC_EINVAL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        set_err(err, errlen, "%s: not a regular file", pathbuf);
        close(fd);
        return SHMIPC_EINVAL;
    }
    char *buf = malloc(SHMIPC__SERVE_MAX_FILE + 1);
    if (buf == NULL) {
        close(fd);
        return SHMIPC_ENOMEM;
    }
    size_t len = 0;
    for (;;) {
        ssize_t k = read(fd, buf + len, SHMIPC__SERVE_MAX_FILE + 1 - len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            set_err(err, errlen, "%s: cannot read: %s", pathbuf, strerror(errno));
            free(buf);
            close(fd);
            return SHMIPC_EINVAL;
        }
        if (k == 0)
            break;
        len += (size_t)k;
        if (len > SHMIPC__SERVE_MAX_FILE) {
            set_err(err, errlen, "%s: larger than %u bytes", pathbuf, SHMIPC__SERVE_MAX_FILE);
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
            set_err(err, errlen, "%s:%u: the line is longer than %u bytes", pathbuf, lineno,
                    SHMIPC__SERVE_MAX_LINE);
            rc = SHMIPC_EINVAL;
            break;
        }
        if (memchr(line, '\0', ll) != NULL) {
            set_err(err, errlen, "%s:%u: a NUL byte", pathbuf, lineno);
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
            set_err(err, errlen, "%s:%u: expected 'key = value'", pathbuf, lineno);
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
            set_err(err, errlen, "%s:%u: a value without a key", pathbuf, lineno);
            rc = SHMIPC_EINVAL;
            break;
        }
        const struct opt *op = find_opt(key, strlen(key));
        if (op == NULL || !op->file_ok) {
            char kb[80];
            set_err(err, errlen,
                    op == NULL ? "%s:%u: unknown key '%s' (keys are the long option names, "
                                 "without --)"
                               : "%s:%u: '%s' is a command-line option only",
                    pathbuf, lineno, shown(key, kb, sizeof kb));
            rc = SHMIPC_EINVAL;
            break;
        }
        size_t idx = (size_t)(op - opts);
        if (seen[idx] != 0) {
            set_err(err, errlen, "%s:%u: '%s' again (first set on line %u)", pathbuf, lineno,
                    op->name, seen[idx]);
            rc = SHMIPC_EINVAL;
            break;
        }
        seen[idx] = lineno;
        if (*val == '\0') {
            set_err(err, errlen, "%s:%u: '%s' has no value", pathbuf, lineno, op->name);
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
    set_err(err, errlen, "%s", "");
    if (o == NULL || path == NULL) {
        set_err(err, errlen, "no options or no path");
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

static int validate_final(shmipc__serve_options *o, char *err, size_t errlen)
{
    char sb[80];
    if (o->help || o->version)
        return 0;
    if (o->app == NULL) {
        set_err(err, errlen,
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
            set_err(err, errlen, "APP '%s' is not module:callable (like myapp:app)",
                    shown(o->app, sb, sizeof sb));
            return SHMIPC_EINVAL;
        }
    }
    return 0;
}

int shmipc__serve_options_parse(shmipc__serve_options *o, int argc, char *const *argv, char *err,
                                size_t errlen)
{
    char sb[80], where[96];
    set_err(err, errlen, "%s", "");
    if (o == NULL || argc < 0 || (argc > 0 && argv == NULL)) {
        set_err(err, errlen, "no options or no arguments");
        return SHMIPC_EINVAL;
    }
    struct parse_state ps = {0};
    /* First the config file, wherever --config is on the line, so that flags override it. */
    const char *config = NULL;
    for (int i = 1; i < argc; i++) {
        const char *iv;
        if (argv[i] == NULL)
            break;
        if (strcmp(argv[i], "--") == 0)
            break;
        const struct opt *op = cli_opt(argv[i], &iv);
        if (op == NULL || op->arg != F_CONFIG || op->type != T_STR)
            continue;
        if (iv == NULL) {
            if (i + 1 >= argc || argv[i + 1] == NULL) {
                set_err(err, errlen, "--config needs a value");
                return SHMIPC_EINVAL;
            }
            iv = argv[++i];
        }
        if (config != NULL) {
            set_err(err, errlen, "--config given twice");
            return SHMIPC_EINVAL;
        }
        config = iv;
    }
    if (config != NULL) {
        if (config[0] == '\0') {
            set_err(err, errlen, "--config: the value is empty");
            return SHMIPC_EINVAL;
        }
        int rc = load_file(o, &ps, config, err, errlen);
        if (rc != 0)
            return rc;
    }
    int only_positional = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *iv;
        if (a == NULL)
            break;
        int rc;
        if (!only_positional && strcmp(a, "--") == 0) {
            only_positional = 1;
            continue;
        }
        if (only_positional || a[0] != '-' || a[1] == '\0') {
            if (ps.app_src == 2) {
                set_err(err, errlen, "unexpected argument '%s' (APP was '%s')",
                        shown(a, sb, sizeof sb), o->app);
                return SHMIPC_EINVAL;
            }
            rc = apply(o, &ps, find_opt("app", 3), a, 2, "APP", err, errlen);
            if (rc != 0)
                return rc;
            continue;
        }
        const struct opt *op = cli_opt(a, &iv);
        if (op == NULL) {
            set_err(err, errlen, "unknown option '%s' (see --help)", shown(a, sb, sizeof sb));
            return SHMIPC_EINVAL;
        }
        snprintf(where, sizeof where, "--%s", op->name);
        if (op->type == T_FLAG || op->type == T_KIND) {
            if (iv != NULL) {
                set_err(err, errlen, "%s takes no value", where);
                return SHMIPC_EINVAL;
            }
        } else if (iv == NULL) {
            if (i + 1 >= argc || argv[i + 1] == NULL) {
                set_err(err, errlen, "%s needs a value", where);
                return SHMIPC_EINVAL;
            }
            iv = argv[++i];
        }
        if (op->arg == F_CONFIG && op->type == T_STR) {
            if ((rc = set_str(&o->config, iv)) != 0)
                return rc;
            continue;
        }
        rc = apply(o, &ps, op, iv, 2, where, err, errlen);
        if (rc != 0)
            return rc;
    }
    return validate_final(o, err, errlen);
}

void shmipc__serve_argv_free(char **argv)
{
    if (argv == NULL)
        return;
    for (size_t i = 0; argv[i] != NULL; i++)
        free(argv[i]);
    free(argv);
}

static int no_worker_yet(const shmipc__serve_options *o, char *err, size_t errlen)
{
    set_err(err, errlen,
            "--%s: %s workers are not available yet; only WSGI (--wsgi, the default) and ASGI "
            "(--asgi) apps can be served today (docs/serve.md)",
            shmipc__serve_kind_name(o->kind), o->kind == SHMIPC__SERVE_LUA ? "Lua" : "C");
    return SHMIPC_ENOTSUP;
}

int shmipc__serve_worker_argv(const shmipc__serve_options *o, char ***argvp, char *err,
                              size_t errlen)
{
    if (argvp != NULL)
        *argvp = NULL;
    if (o == NULL || argvp == NULL || o->app == NULL || o->python == NULL) {
        set_err(err, errlen, "no options or no application");
        return SHMIPC_EINVAL;
    }
    if (o->kind != SHMIPC__SERVE_WSGI && o->kind != SHMIPC__SERVE_ASGI)
        return no_worker_yet(o, err, errlen);
    char maxreq[32], ppid[32];
    snprintf(maxreq, sizeof maxreq, "%llu", (unsigned long long)o->max_requests);
    /* The worker ends itself when this process dies, even by SIGKILL (worker.py). */
    snprintf(ppid, sizeof ppid, "%ld", (long)getpid());
    const char *t[12] = {o->python,   "-m",        "shmipc.serve.worker", o->app,
                         "--address", "{address}", "--parent-pid",        ppid};
    size_t n = 8;
    if (o->kind == SHMIPC__SERVE_ASGI)
        t[n++] = "--asgi";
    if (o->max_requests) {
        t[n++] = "--max-requests";
        t[n++] = maxreq;
    }
    char **v = calloc(n + 1, sizeof *v);
    if (v == NULL)
        return SHMIPC_ENOMEM;
    for (size_t i = 0; i < n; i++)
        if ((v[i] = strdup(t[i])) == NULL) {
            shmipc__serve_argv_free(v);
            return SHMIPC_ENOMEM;
        }
    *argvp = v;
    return 0;
}

/* ---- --check ------------------------------------------------------------------------------ */

/* The program as posix_spawnp finds it: a path with '/', else each PATH entry. */
static int find_program(const char *prog, char *const *envp)
{
    if (strchr(prog, '/') != NULL)
        return access(prog, X_OK);
    const char *path = NULL;
    for (char *const *e = envp; e != NULL && *e != NULL; e++)
        if (strncmp(*e, "PATH=", 5) == 0)
            path = *e + 5;
    if (path == NULL)
        path = "/usr/local/bin:/usr/bin:/bin";
    char buf[PATH_MAX];
    while (*path != '\0') {
        const char *c = strchr(path, ':');
        size_t len = c != NULL ? (size_t)(c - path) : strlen(path);
        if (len > 0 && len + strlen(prog) + 2 < sizeof buf) {
            memcpy(buf, path, len);
            buf[len] = '/';
            strcpy(buf + len + 1, prog);
            if (access(buf, X_OK) == 0)
                return 0;
        }
        path += len + (c != NULL);
    }
    return -1;
}

/* Imports APP with the interpreter, as the worker's load_app would. */
static const char import_check[] = "import sys\n"
                                   "try:\n"
                                   "    from shmipc.serve.worker import load_app\n"
                                   "    load_app(sys.argv[1])\n"
                                   "except BaseException as e:\n"
                                   "    print(f'{type(e).__name__}: {e}', file=sys.stderr)\n"
                                   "    sys.exit(2)\n";

static int check_import(const shmipc__serve_options *o, char *const *envp, uint32_t timeout_ms,
                        char *err, size_t errlen)
{
    char sb[80];
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        set_err(err, errlen, "cannot check APP: %s", strerror(errno));
        return SHMIPC_EINVAL;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
    posix_spawn_file_actions_adddup2(&fa, pfd[1], 2);
    if (o->chdir_to != NULL)
        posix_spawn_file_actions_addchdir_np(&fa, o->chdir_to);
    const char *argv[] = {o->python, "-c", import_check, o->app, NULL};
    pid_t pid;
    int e = posix_spawnp(&pid, o->python, &fa, NULL, (char *const *)argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    close(pfd[1]);
    if (e != 0) {
        close(pfd[0]);
        set_err(err, errlen, "--python %s: cannot run: %s", shown(o->python, sb, sizeof sb),
                strerror(e));
        return SHMIPC_EINVAL;
    }
    char out[400];
    size_t got = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int timed_out = 0;
    for (;;) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        int64_t left = (int64_t)timeout_ms -
                       ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        int r = poll(&p, 1, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            timed_out = r == 0;
            break;
        }
        char tmp[512];
        ssize_t k = read(pfd[0], tmp, sizeof tmp);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        /* Keep the last bytes: the exception line is printed last. */
        size_t kk = (size_t)k, room = sizeof out - 1;
        if (kk >= room) {
            memcpy(out, tmp + kk - room, room);
            got = room;
        } else {
            if (got + kk > room) {
                size_t drop = got + kk - room;
                memmove(out, out + drop, got - drop);
                got -= drop;
            }
            memcpy(out + got, tmp, kk);
            got += kk;
        }
    }
    close(pfd[0]);
    if (timed_out)
        kill(pid, SIGKILL);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    out[got] = '\0';
    while (got > 0 && (out[got - 1] == '\n' || out[got - 1] == '\r'))
        out[--got] = '\0';
    const char *last = strrchr(out, '\n');
    last = last != NULL ? last + 1 : out;
    if (timed_out) {
        set_err(err, errlen, "APP %s: importing it took longer than %.1f s",
                shown(o->app, sb, sizeof sb), timeout_ms / 1000.0);
        return SHMIPC_EINVAL;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char lb[200];
        size_t n = 0;
        for (const char *p = last; *p != '\0' && n + 1 < sizeof lb; p++)
            lb[n++] = (unsigned char)*p >= 0x20 ? *p : '?';
        lb[n] = '\0';
        set_err(err, errlen, "APP %s cannot be loaded by %s: %s", shown(o->app, sb, sizeof sb),
                o->python, n ? lb : "the interpreter failed");
        return SHMIPC_EINVAL;
    }
    return 0;
}

int shmipc__serve_check(const shmipc__serve_options *o, char *const *envp, uint32_t timeout_ms,
                        char *err, size_t errlen)
{
    char sb[80];
    set_err(err, errlen, "%s", "");
    if (o == NULL) {
        set_err(err, errlen, "no options");
        return SHMIPC_EINVAL;
    }
    if (envp == NULL)
        envp = environ;
    if (timeout_ms == 0)
        timeout_ms = 30000;
    if (validate_final((shmipc__serve_options *)o, err, errlen) != 0)
        return SHMIPC_EINVAL;
    if (o->app == NULL) {
        set_err(err, errlen, "no application");
        return SHMIPC_EINVAL;
    }
    if (o->kind != SHMIPC__SERVE_WSGI && o->kind != SHMIPC__SERVE_ASGI) {
        no_worker_yet(o, err, errlen);
        return SHMIPC_EINVAL;
    }
    struct stat st;
    if (o->chdir_to != NULL && (stat(o->chdir_to, &st) != 0 || !S_ISDIR(st.st_mode))) {
        set_err(err, errlen, "--chdir %s: not a directory", shown(o->chdir_to, sb, sizeof sb));
        return SHMIPC_EINVAL;
    }
    if (find_program(o->python, envp) != 0) {
        set_err(err, errlen, "--python %s: not found or not executable",
                shown(o->python, sb, sizeof sb));
        return SHMIPC_EINVAL;
    }
    if (strncmp(o->listen, "unix:", 5) == 0) {
        /* The socket's directory must exist (the file is created at start). */
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", o->listen + 5);
        char *slash = strrchr(dir, '/');
        if (slash != NULL) {
            *slash = '\0';
            if (dir[0] != '\0' && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
                set_err(err, errlen, "--listen %s: the directory does not exist",
                        shown(o->listen, sb, sizeof sb));
                return SHMIPC_EINVAL;
            }
        }
    } else {
        char host[300];
        const char *colon = strrchr(o->listen, ':');
        size_t hl = (size_t)(colon - o->listen);
        const char *h = o->listen;
        if (h[0] == '[') {
            h++;
            hl -= 2;
        }
        if (hl >= sizeof host) {
            set_err(err, errlen, "--listen: the host is too long");
            return SHMIPC_EINVAL;
        }
        memcpy(host, h, hl);
        host[hl] = '\0';
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_PASSIVE;
        int g = getaddrinfo(host, colon + 1, &hints, &res);
        if (g != 0) {
            set_err(err, errlen, "--listen %s: %s", shown(o->listen, sb, sizeof sb),
                    gai_strerror(g));
            return SHMIPC_EINVAL;
        }
        freeaddrinfo(res);
    }
    if (o->access_log != NULL && strcmp(o->access_log, "-") != 0) {
        /* Writable where it is, or creatable in its directory; nothing is created here. */
        if (access(o->access_log, F_OK) == 0) {
            if (stat(o->access_log, &st) != 0 || S_ISDIR(st.st_mode) ||
                access(o->access_log, W_OK) != 0) {
                set_err(err, errlen, "--access-log %s: cannot be written",
                        shown(o->access_log, sb, sizeof sb));
                return SHMIPC_EINVAL;
            }
        } else {
            char dir[PATH_MAX];
            snprintf(dir, sizeof dir, "%s", o->access_log);
            char *slash = strrchr(dir, '/');
            const char *d = ".";
            if (slash != NULL) {
                *slash = '\0';
                d = dir[0] != '\0' ? dir : "/";
            }
            if (access(d, W_OK) != 0) {
                set_err(err, errlen, "--access-log %s: its directory cannot be written",
                        shown(o->access_log, sb, sizeof sb));
                return SHMIPC_EINVAL;
            }
        }
    }
    return check_import(o, envp, timeout_ms, err, errlen);
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
           "  --lua FILE               a Lua handler module (not available yet)\n"
           "  --c LIB.so:symbol        a C handler in a shared object (not available yet)\n"
           "  --listen ADDR            HOST:PORT, [IPv6]:PORT or unix:PATH (127.0.0.1:8000)\n"
           "  --workers N              worker processes, 1 .. 1024 (1)\n"
           "  --threads N              the front's reactor threads, 1 .. 256 (1)\n"
           "  --max-requests N         a worker is replaced after N requests (0: never)\n"
           "  --timeout S              request deadline in seconds, then 504 (60; 0: none)\n"
           "  --queue N                requests waiting for a free worker, then 503 (1024)\n"
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
           "Signals: SIGTERM/SIGINT stop gracefully, SIGHUP reloads the workers, SIGUSR1 prints\n"
           "the workers' states to stderr.\n";
}

/* ---- the access log ----------------------------------------------------------------------- */

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
