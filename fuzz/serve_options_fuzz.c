/*
 * Fuzz target: shmipc-serve's options (serve/options.c, docs/serve.md "Configuration"): the
 * config file parser, the command-line parser and the final validation.
 *
 * Input: a mode byte, then
 *   mode & 3 == 0: a config file, read with shmipc__serve_options_load_file, then validated;
 *   mode & 3 == 1: arguments separated by NUL bytes, parsed as shmipc-serve's argv[1..];
 *   mode & 3 == 2: a 2-byte big-endian length, that many bytes of config file, then arguments
 *                  as above, with "--config FILE" put before them (3: after them).
 * Mode bits 2-3 pick the error buffer's size (512, 96, 8, 1 bytes), allocated to that size.
 *
 * The parser opens nothing but the config file it is given (there are no include directives,
 * and `config` is not a key of the file). So that the fuzzer cannot make it open any other
 * path, every value of a "--config" argument ("--config V", "--config=V", wherever it stands)
 * is replaced by one of three paths, all in this process's /proc/self/fd: the config file (a
 * memfd, /proc/self/fd/N), a name that is not there (/proc/self/fd/none), or that directory.
 * Nothing is created on disk.
 *
 * The oracles, beyond the sanitizers (leaks included): the result is 0, SHMIPC_EINVAL or
 * SHMIPC_ENOMEM; the error buffer is NUL-terminated within its size, empty on success and
 * non-empty, printable ASCII on failure; parsing the same input again gives the same result,
 * message and options; reading a file with load_file and validating gives what the command
 * line "--config FILE" gives; a parsed result is within every documented range; and the config
 * file was opened exactly when the parsed options name it (inotify counts the opens).
 */
#include "options_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <unistd.h>

#include "serve/front.h"
#include "shmipc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_ARGS 1024

static int ready, memfd = -1, watch = -1;
static char file_path[64];
static const char missing_path[] = "/proc/self/fd/none", fd_dir[] = "/proc/self/fd";

static void init(void)
{
    ready = 1;
    memfd = memfd_create("serve_options_fuzz", MFD_CLOEXEC);
    if (memfd < 0)
        abort();
    snprintf(file_path, sizeof file_path, "/proc/self/fd/%d", memfd);
    /* Without inotify the open-count oracle is skipped, nothing else. */
    watch = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (watch >= 0 && inotify_add_watch(watch, file_path, IN_OPEN) < 0) {
        close(watch);
        watch = -1;
    }
}

static void set_file(const uint8_t *p, size_t n)
{
    if (ftruncate(memfd, 0) != 0 || (n > 0 && pwrite(memfd, p, n, 0) != (ssize_t)n))
        abort();
}

/* The opens of the config file since the last call; -1 without inotify. */
static int opens(void)
{
    if (watch < 0)
        return -1;
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    int count = 0;
    ssize_t k;
    while ((k = read(watch, buf, sizeof buf)) > 0)
        for (ssize_t off = 0; off < k;) {
            const struct inotify_event *e = (const struct inotify_event *)(buf + off);
            if (e->mask & IN_OPEN)
                count++;
            off += (ssize_t)(sizeof *e + e->len);
        }
    return count;
}

/* One of the sandbox's paths for a --config value, picked by the value's first byte. */
static const char *sandbox_path(const char *v)
{
    switch ((unsigned char)v[0] % 4) {
    case 0:
        return missing_path;
    case 1:
        return fd_dir;
    default:
        return file_path;
    }
}

static int same_str(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

static int same_options(const shmipc__serve_options *a, const shmipc__serve_options *b)
{
    return a->kind == b->kind && a->workers == b->workers && a->threads == b->threads &&
           a->max_requests == b->max_requests && a->timeout_ms == b->timeout_ms &&
           a->queue == b->queue && a->pipeline == b->pipeline && a->concurrency == b->concurrency &&
           a->graceful_timeout_ms == b->graceful_timeout_ms &&
           a->access_log_format == b->access_log_format && a->check == b->check &&
           a->help == b->help && a->version == b->version && same_str(a->app, b->app) &&
           same_str(a->listen, b->listen) && same_str(a->access_log, b->access_log) &&
           same_str(a->python, b->python) && same_str(a->chdir_to, b->chdir_to) &&
           same_str(a->config, b->config);
}

static void check_str(const char *s, int required)
{
    if (s == NULL) {
        if (required)
            abort();
        return;
    }
    if (s[0] == '\0' || strlen(s) > SHMIPC__SERVE_MAX_VALUE)
        abort();
}

/* What any successfully read options satisfy (docs/serve.md, the table of options). */
static void check_ranges(const shmipc__serve_options *o)
{
    if (o->kind < SHMIPC__SERVE_WSGI || o->kind > SHMIPC__SERVE_C)
        abort();
    if (o->workers < 1 || o->workers > SHMIPC__FRONT_MAX_WORKERS || o->threads < 1 ||
        o->threads > SHMIPC__SERVE_MAX_THREADS || o->queue > SHMIPC__SERVE_MAX_QUEUE ||
        o->pipeline < 1 || o->pipeline > SHMIPC__FRONT_MAX_PIPELINE ||
        o->concurrency > SHMIPC__FRONT_MAX_CONCURRENCY ||
        o->max_requests > SHMIPC__SERVE_MAX_MAX_REQUESTS ||
        o->timeout_ms > SHMIPC__SERVE_MAX_TIMEOUT_MS || o->graceful_timeout_ms < 1 ||
        o->graceful_timeout_ms > SHMIPC__SERVE_MAX_SECONDS_MS)
        abort();
    if (o->access_log_format != SHMIPC__ACCESS_COMMON &&
        o->access_log_format != SHMIPC__ACCESS_JSON)
        abort();
    if ((o->check | o->help | o->version) & ~1)
        abort();
    check_str(o->app, 0);
    check_str(o->listen, 1);
    check_str(o->python, 1);
    check_str(o->access_log, 0);
    check_str(o->chdir_to, 0);
    check_str(o->config, 0);
}

/* What validate's success promises. */
static void check_valid(const shmipc__serve_options *o)
{
    if (o->help || o->version)
        return;
    if (o->app == NULL)
        abort();
    if ((o->kind == SHMIPC__SERVE_WSGI || o->kind == SHMIPC__SERVE_ASGI) &&
        strchr(o->app, ':') == NULL)
        abort();
    if (o->concurrency != 0 && o->kind != SHMIPC__SERVE_ASGI)
        abort();
}

static void check_err(int rc, const char *err, size_t errlen)
{
    if (rc != 0 && rc != SHMIPC_EINVAL && rc != SHMIPC_ENOMEM)
        abort();
    size_t n = strnlen(err, errlen);
    if (n == errlen)
        abort(); /* not terminated */
    if (rc == 0 && n != 0)
        abort();
    if (rc == SHMIPC_EINVAL && errlen > 1 && n == 0)
        abort();
    /* Hostile bytes are shown as '?', never echoed raw (a terminal would run escapes). */
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)err[i] < 0x20 || (unsigned char)err[i] >= 0x7f)
            abort();
}

struct result {
    int rc;
    int opens;
    shmipc__serve_options o;
    char *err;
};

static void run_parse(struct result *r, int argc, char **argv, size_t errlen)
{
    r->err = malloc(errlen);
    if (r->err == NULL || shmipc__serve_options_init(&r->o) != 0)
        abort();
    opens();
    r->rc = shmipc__serve_options_parse(&r->o, argc, argv, r->err, errlen);
    r->opens = opens();
    check_err(r->rc, r->err, errlen);
    if (r->rc == 0) {
        check_ranges(&r->o);
        check_valid(&r->o);
        /* The config file was read exactly when the options name it. */
        int named = r->o.config != NULL;
        if (named && strcmp(r->o.config, file_path) != 0)
            abort(); /* the missing file or the directory cannot have been read */
        if (r->opens >= 0 && r->opens != named)
            abort();
    }
}

static void free_result(struct result *r)
{
    shmipc__serve_options_free(&r->o);
    free(r->err);
}

static void same_result(const struct result *a, const struct result *b)
{
    if (a->rc != b->rc || strcmp(a->err, b->err) != 0 || a->opens != b->opens)
        abort();
    if (a->rc == 0 && !same_options(&a->o, &b->o))
        abort();
}

/* Mode 0: load_file, then validate; the same as the command line "--config FILE". */
static void fuzz_file(size_t errlen)
{
    shmipc__serve_options o;
    char *err = malloc(errlen);
    if (err == NULL || shmipc__serve_options_init(&o) != 0)
        abort();
    opens();
    int rc = shmipc__serve_options_load_file(&o, file_path, err, errlen);
    if (opens() == 0)
        abort();
    check_err(rc, err, errlen);
    if (rc == 0) {
        check_ranges(&o);
        if (o.config == NULL || strcmp(o.config, file_path) != 0)
            abort();
        rc = shmipc__serve_validate(&o, err, errlen);
        check_err(rc, err, errlen);
        if (rc == 0)
            check_valid(&o);
    }

    char *argv[] = {"shmipc-serve", "--config", file_path, NULL};
    struct result r;
    run_parse(&r, 3, argv, errlen);
    if (r.rc != rc || strcmp(r.err, err) != 0 || (rc == 0 && !same_options(&r.o, &o)))
        abort();
    free_result(&r);
    shmipc__serve_options_free(&o);
    free(err);
}

/* Modes 1 and 2: the arguments in `p`, "--config FILE" added before or after them if `file`. */
static void fuzz_argv(const uint8_t *p, size_t n, int file, int file_last, size_t errlen)
{
    /* A NUL-terminated copy: every NUL ends an argument. */
    char *copy = malloc(n + 1);
    char **argv = malloc((MAX_ARGS + 4) * sizeof *argv);
    if (copy == NULL || argv == NULL)
        abort();
    if (n > 0)
        memcpy(copy, p, n);
    copy[n] = '\0';
    int argc = 0;
    argv[argc++] = "shmipc-serve";
    if (file && !file_last) {
        argv[argc++] = "--config";
        argv[argc++] = file_path;
    }
    for (size_t i = 0; n > 0 && i <= n && argc < MAX_ARGS + 1;) {
        argv[argc++] = copy + i;
        i += strlen(copy + i) + 1;
    }
    if (file && file_last) {
        argv[argc++] = "--config";
        argv[argc++] = file_path;
    }
    argv[argc] = NULL;
    /* The sandbox: no value of --config is the fuzzer's. */
    char *inline_vals[MAX_ARGS + 4];
    int ninline = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc && argv[i + 1] != file_path) {
            argv[i + 1] = (char *)sandbox_path(argv[i + 1]);
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            const char *v = sandbox_path(argv[i] + 9);
            size_t len = 9 + strlen(v) + 1;
            char *a = malloc(len);
            if (a == NULL)
                abort();
            snprintf(a, len, "--config=%s", v);
            argv[i] = inline_vals[ninline++] = a;
        }
    }

    struct result a, b;
    run_parse(&a, argc, argv, errlen);
    run_parse(&b, argc, argv, errlen);
    same_result(&a, &b);
    if (a.rc == 0) {
        /* Validate again: the same answer, nothing changed. */
        char *err = malloc(errlen);
        if (err == NULL || shmipc__serve_validate(&a.o, err, errlen) != 0 ||
            !same_options(&a.o, &b.o))
            abort();
        free(err);
    }
    free_result(&a);
    free_result(&b);
    for (int i = 0; i < ninline; i++)
        free(inline_vals[i]);
    free(argv);
    free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const size_t errlens[4] = {SHMIPC__SERVE_ERR_SIZE, 96, 8, 1};
    if (!ready)
        init();
    if (size < 1)
        return 0;
    uint8_t mode = data[0];
    size_t errlen = errlens[(mode >> 2) & 3];
    data++, size--;
    switch (mode & 3) {
    case 0:
        set_file(data, size);
        fuzz_file(errlen);
        break;
    case 1:
        set_file(NULL, 0);
        fuzz_argv(data, size, 0, 0, errlen);
        break;
    default: {
        size_t flen = size >= 2 ? (size_t)data[0] << 8 | data[1] : 0;
        size_t skip = size >= 2 ? 2 : size;
        if (flen > size - skip)
            flen = size - skip;
        set_file(data + skip, flen);
        fuzz_argv(data + skip + flen, size - skip - flen, 1, (mode & 3) == 3, errlen);
        break;
    }
    }
    return 0;
}
