/*
 * What the data-driven fixture tests (test_http_fixtures, test_ws_fixtures) share: growable
 * byte strings, the escape language of tests/http/README.md, and a main() that makes each
 * fixture file of a directory its own cmocka test.
 *
 * Header-only (static inline), included after <cmocka.h>'s prerequisites like cmocka.h.
 */
#ifndef SHMIPC_TESTS_FIXTURE_READER_H
#define SHMIPC_TESTS_FIXTURE_READER_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

/* ---- Byte strings ---- */

/* A growable byte string, NUL-terminated after its n bytes once anything was put. */
struct fx_bytes {
    char *p;
    size_t n, cap;
};

static inline void fx_put(struct fx_bytes *b, const void *d, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    if (n)
        memcpy(b->p + b->n, d, n);
    b->n += n;
    b->p[b->n] = 0;
}

static inline void fx_put_byte(struct fx_bytes *b, unsigned v)
{
    char c = (char)v;
    fx_put(b, &c, 1);
}

/* ---- The escapes of tests/http/README.md ---- */

/*
 * Decodes the escaped text [s, e) onto `out`: \r \n \t \0 \xHH, \*N{text} (text repeated N
 * times), and a backslash before any character of `literal` (such as "\\{}") for that
 * character. With `stop` not 0, decoding ends at the first unescaped `stop` and returns where
 * it is (NULL if there is none); with `stop` 0 it returns e. NULL on a bad escape.
 */
static inline const char *fx_decode(const char *s, const char *e, char stop, const char *literal,
                                    struct fx_bytes *out)
{
    while (s < e) {
        if (stop && *s == stop)
            return s;
        if (*s != '\\') {
            fx_put(out, s++, 1);
            continue;
        }
        if (++s == e)
            return NULL;
        char c = *s++;
        switch (c) {
        case 'r':
            fx_put(out, "\r", 1);
            break;
        case 'n':
            fx_put(out, "\n", 1);
            break;
        case 't':
            fx_put(out, "\t", 1);
            break;
        case '0':
            fx_put(out, "", 1);
            break;
        case 'x': {
            if (e - s < 2)
                return NULL;
            char hex[3] = {s[0], s[1], 0}, *end;
            long v = strtol(hex, &end, 16);
            if (*end)
                return NULL;
            fx_put_byte(out, (unsigned)v);
            s += 2;
            break;
        }
        case '*': {
            /* \*N{text}: text (escapes allowed, braces escaped) repeated N times. */
            char *end;
            unsigned long count = strtoul(s, &end, 10);
            if (end == s || end >= e || *end != '{')
                return NULL;
            const char *body = end + 1, *q = body;
            while (q < e && *q != '}')
                q += *q == '\\' ? 2 : 1;
            if (q >= e)
                return NULL;
            struct fx_bytes once = {0};
            fx_put(&once, "", 0);
            if (fx_decode(body, q, 0, literal, &once) == NULL) {
                free(once.p);
                return NULL;
            }
            for (unsigned long k = 0; k < count; k++)
                fx_put(out, once.p, once.n);
            free(once.p);
            s = q + 1;
            break;
        }
        default:
            if (c == 0 || strchr(literal, c) == NULL)
                return NULL;
            fx_put(out, &c, 1);
            break;
        }
    }
    return stop ? NULL : s;
}

/* ---- One cmocka test per fixture file ---- */

static inline int fx__by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names in `dir` that end in `suffix` (and are longer than it), sorted; -1 if unreadable. */
static inline ssize_t fx__list(const char *dir, const char *suffix, char ***names)
{
    size_t n = 0, slen = strlen(suffix);
    DIR *d = opendir(dir);
    *names = NULL;
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len <= slen || strcmp(e->d_name + len - slen, suffix) != 0)
            continue;
        *names = realloc(*names, (n + 1) * sizeof **names);
        (*names)[n++] = strdup(e->d_name);
    }
    closedir(d);
    if (n > 0)
        qsort(*names, n, sizeof **names, fx__by_name);
    return (ssize_t)n;
}

/*
 * Runs `fixed` (nfixed tests), then `run` once per file of `dir` ending in `suffix`, as a test
 * named after the file whose state is the file's path. No such file is a failure. Returns
 * the number of failures, as cmocka's runners do (1 if `dir` cannot be read).
 */
static inline int fx_run_files(const char *group, const char *dir, const char *suffix,
                               const struct CMUnitTest *fixed, size_t nfixed,
                               CMUnitTestFunction run)
{
    char **names;
    ssize_t got = fx__list(dir, suffix, &names);
    if (got < 0) {
        fprintf(stderr, "test_%s: cannot open %s\n", group, dir);
        return 1;
    }
    size_t n = (size_t)got;
    struct CMUnitTest *tests = calloc(nfixed + n, sizeof *tests);
    char **paths = calloc(n ? n : 1, sizeof *paths);
    if (nfixed)
        memcpy(tests, fixed, nfixed * sizeof *fixed);
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(dir) + strlen(names[i]) + 2;
        paths[i] = malloc(len);
        snprintf(paths[i], len, "%s/%s", dir, names[i]);
        tests[nfixed + i].name = names[i];
        tests[nfixed + i].test_func = run;
        tests[nfixed + i].initial_state = paths[i];
    }
    int failed = n == 0 ? 1 : 0;
    if (n == 0)
        fprintf(stderr, "test_%s: no %s file in %s\n", group, suffix, dir);
    failed += _cmocka_run_group_tests(group, tests, nfixed + n, NULL, NULL);
    for (size_t i = 0; i < n; i++) {
        free(paths[i]);
        free(names[i]);
    }
    free(paths);
    free(names);
    free(tests);
    return failed;
}

#endif
