/*
 * Description: WebSocket (RFC 6455) fixtures, the .ws files of tests/ws: an upgrade request
 * and/or client frames in, the exact server bytes out, plus the messages delivered and the
 * close code reported. Every case is also fed split at every byte.
 *
 * Each fixture file is its own cmocka test, found at run time; tests/ws/README.md gives the
 * format. Usage: test_ws_fixtures [FIXTURE_DIR] (default: the source tree's tests/ws).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture_reader.h"
#include "shmipc.h"
#include "net/http_parser.h"
#include "net/ws_conn.h"
#include "net/ws_handshake.h"

/* The fixtures sit beside the vectors in the source tree. */
#define FIXTURE_DIR SHMIPC_VECTORS_DIR "/../ws"

/* The masking key of client frames unless a line says otherwise (RFC 6455 §5.7's). */
static const uint8_t default_key[4] = {0x37, 0xfa, 0x21, 0x3d};

/* ---------------------------------------------------------------------------------------- */
/* Byte strings */

/* Hex rendering for assertion messages, 32 bytes a line; long runs of one byte collapsed. */
static char *render(const char *d, size_t n)
{
    struct fx_bytes r = {0};
    fx_put(&r, "", 0);
    for (size_t i = 0; i < n;) {
        size_t run = 1;
        while (i + run < n && d[i + run] == d[i])
            run++;
        char tmp[48];
        if (run >= 8) {
            fx_put(&r, tmp, (size_t)snprintf(tmp, sizeof tmp, "[%02x x%zu]", (uint8_t)d[i], run));
            i += run;
        } else {
            fx_put(&r, tmp, (size_t)snprintf(tmp, sizeof tmp, "%02x", (uint8_t)d[i]));
            i++;
        }
        fx_put(&r, i % 32 == 0 ? "\n" : " ", 1);
    }
    return r.p;
}

static void assert_bytes_equal(const char *what, const struct fx_bytes *got,
                               const struct fx_bytes *want)
{
    if (got->n == want->n && memcmp(got->p, want->p, got->n) == 0)
        return;
    char *g = render(got->p, got->n), *w = render(want->p, want->n);
    print_message("%s: got %zu bytes, want %zu\n", what, got->n, want->n);
    assert_string_equal(g, w);
    free(g);
    free(w);
}

/* ---------------------------------------------------------------------------------------- */
/* The fixture language (tests/ws/README.md) */

struct fixture {
    const char *path;
    struct shmipc__ws_limits limits;
    int split;          /* feed split at every byte too (default 1) */
    int closed;         /* expected final state: 1, 0, or -1 unchecked */
    int close_code;     /* expected on_close code; 0 none; -1 unchecked */
    int echo;           /* the application echoes every message (default 1) */
    unsigned app_close; /* the application closes with this code before any input */
    int app_closes;
    char protocols[8][32];
    size_t nprotocols;
    int has_request, has_response, has_out, has_messages;
    struct fx_bytes request, response; /* the upgrade, when the case has one */
    struct fx_bytes in, out;
    struct fx_bytes messages; /* records of record_message() */
    size_t *starts;           /* where each `in` frame starts */
    size_t nstarts;
};

static void fixture_free(struct fixture *f)
{
    free(f->starts);
    free(f->request.p);
    free(f->response.p);
    free(f->in.p);
    free(f->out.p);
    free(f->messages.p);
}

/* Decodes the tests/http escapes of [s, e) into `out` (see tests/ws/README.md), with \\ \{ \}
 * and \" for those characters. Stops at an unescaped `stop` when it is not 0. */
static const char *decode(const char *s, const char *e, char stop, struct fx_bytes *out)
{
    return fx_decode(s, e, stop, "\\{}\"", out);
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decodes hex digits (spaces allowed between bytes) from [s, e). Returns 0 or -1. */
static int decode_hex(const char *s, const char *e, struct fx_bytes *out)
{
    while (s < e) {
        if (*s == ' ' || *s == '\t') {
            s++;
            continue;
        }
        if (e - s < 2 || hex_value(s[0]) < 0 || hex_value(s[1]) < 0)
            return -1;
        fx_put_byte(out, (unsigned)(hex_value(s[0]) << 4 | hex_value(s[1])));
        s += 2;
    }
    return 0;
}

static const char *skip_space(const char *s, const char *e)
{
    while (s < e && (*s == ' ' || *s == '\t'))
        s++;
    return s;
}

/* The next space-separated word of [*s, e) outside quotes: [*a, *z). Returns 0 at the end. */
static int word(const char **s, const char *e, const char **a, const char **z)
{
    *s = skip_space(*s, e);
    if (*s == e)
        return 0;
    *a = *s;
    while (*s < e && **s != ' ' && **s != '\t')
        (*s)++;
    *z = *s;
    return 1;
}

static int word_is(const char *a, const char *z, const char *lit)
{
    return (size_t)(z - a) == strlen(lit) && memcmp(a, lit, (size_t)(z - a)) == 0;
}

/*
 * Parses payload parts from [s, e): "quoted escapes" and hex:DIGITS, concatenated. Returns 0
 * or -1.
 */
static int payload(const char *s, const char *e, struct fx_bytes *out)
{
    for (;;) {
        s = skip_space(s, e);
        if (s == e)
            return 0;
        if (*s == '"') {
            const char *q = decode(s + 1, e, '"', out);
            if (!q)
                return -1;
            s = q + 1;
        } else if (e - s > 4 && memcmp(s, "hex:", 4) == 0) {
            const char *q = s + 4;
            while (q < e && *q != ' ' && *q != '\t')
                q++;
            if (decode_hex(s + 4, q, out) != 0)
                return -1;
            s = q;
        } else {
            return -1;
        }
    }
}

static int opcode_of(const char *a, const char *z)
{
    static const struct {
        const char *name;
        int op;
    } ops[] = {{"cont", 0}, {"text", 1}, {"binary", 2}, {"close", 8}, {"ping", 9}, {"pong", 10}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (word_is(a, z, ops[i].name))
            return ops[i].op;
    if (z - a >= 3 && memcmp(a, "op", 2) == 0) {
        char buf[8] = {0};
        if (z - a - 2 > 6)
            return -1;
        memcpy(buf, a + 2, (size_t)(z - a - 2));
        char *end;
        long v = strtol(buf, &end, 10);
        if (*end == 0 && v >= 0 && v <= 15)
            return (int)v;
    }
    return -1;
}

/*
 * One frame line: `op [attrs] [payload]` or `raw HEX`. Encoded here by hand, independently
 * of the library's writers. `client` makes frames masked unless `nomask`.
 */
static int frame_line(const char *s, const char *e, int client, struct fx_bytes *out)
{
    const char *a, *z;
    if (!word(&s, e, &a, &z))
        return 0;
    if (word_is(a, z, "raw"))
        return decode_hex(s, e, out);
    int op = opcode_of(a, z);
    if (op < 0)
        return -1;
    int fin = 1, rsv = 0, masked = client, code = -1, form = 0;
    long long declared = -1;
    uint8_t key[4];
    memcpy(key, default_key, 4);
    for (;;) {
        const char *save = s;
        if (!word(&s, e, &a, &z))
            break;
        if (*a == '"' || (z - a > 4 && memcmp(a, "hex:", 4) == 0)) {
            s = save;
            break;
        }
        if (word_is(a, z, "more")) {
            fin = 0;
        } else if (word_is(a, z, "nomask")) {
            masked = 0;
        } else if (word_is(a, z, "len16")) {
            form = 16;
        } else if (word_is(a, z, "len64")) {
            form = 64;
        } else if (z - a > 4 && memcmp(a, "rsv=", 4) == 0) {
            rsv = (int)strtol(a + 4, NULL, 10);
        } else if (z - a > 4 && memcmp(a, "len=", 4) == 0) {
            declared = strtoll(a + 4, NULL, 10);
        } else if (z - a > 5 && memcmp(a, "code=", 5) == 0) {
            code = (int)strtol(a + 5, NULL, 10);
        } else if (z - a == 13 && memcmp(a, "mask=", 5) == 0) {
            struct fx_bytes k = {0};
            if (decode_hex(a + 5, z, &k) != 0 || k.n != 4) {
                free(k.p);
                return -1;
            }
            memcpy(key, k.p, 4);
            masked = 1;
            free(k.p);
        } else {
            return -1;
        }
    }
    struct fx_bytes body = {0};
    fx_put(&body, "", 0);
    if (code >= 0) {
        fx_put_byte(&body, (unsigned)code >> 8);
        fx_put_byte(&body, (unsigned)code & 0xff);
    }
    if (payload(s, e, &body) != 0) {
        free(body.p);
        return -1;
    }
    uint64_t len = declared >= 0 ? (uint64_t)declared : body.n;
    fx_put_byte(out, (unsigned)((fin ? 0x80 : 0) | rsv << 4 | op));
    unsigned m = masked ? 0x80 : 0;
    if (form == 0 && len < 126) {
        fx_put_byte(out, m | (unsigned)len);
    } else if (form != 64 && len <= 0xffff) {
        fx_put_byte(out, m | 126);
        fx_put_byte(out, (unsigned)(len >> 8));
        fx_put_byte(out, (unsigned)len & 0xff);
    } else {
        fx_put_byte(out, m | 127);
        for (int i = 7; i >= 0; i--)
            fx_put_byte(out, (unsigned)(len >> (8 * i)) & 0xff);
    }
    if (masked) {
        fx_put(out, key, 4);
        for (size_t i = 0; i < body.n; i++)
            body.p[i] = (char)(body.p[i] ^ key[i & 3]);
    }
    fx_put(out, body.p, body.n);
    free(body.p);
    return 0;
}

/* FNV-1a: messages are recorded as opcode, length and hash, so a 1 MiB message is not kept. */
static uint64_t fnv1a(const void *d, size_t n)
{
    const uint8_t *p = d;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Appends a message record: opcode, then length and hash in hex, so a mismatch reads well. */
static void record_message(struct fx_bytes *b, unsigned opcode, const void *data, size_t len)
{
    char line[80];
    int n = snprintf(line, sizeof line, "%s %zu bytes, hash %016llx; ",
                     opcode == 1 ? "text" : "binary", len, (unsigned long long)fnv1a(data, len));
    fx_put(b, line, (size_t)n);
}

/* A `messages` line: `text PAYLOAD` or `binary PAYLOAD`. */
static int message_line(const char *s, const char *e, struct fx_bytes *out)
{
    const char *a, *z;
    if (!word(&s, e, &a, &z))
        return 0;
    int op = word_is(a, z, "text") ? 1 : word_is(a, z, "binary") ? 2 : -1;
    if (op < 0)
        return -1;
    struct fx_bytes body = {0};
    fx_put(&body, "", 0);
    if (payload(s, e, &body) != 0) {
        free(body.p);
        return -1;
    }
    record_message(out, (unsigned)op, body.p, body.n);
    free(body.p);
    return 0;
}

static int option(struct fixture *f, const char *key, const char *value)
{
    char *end;
    unsigned long long v = strtoull(value, &end, 10);
    int number = end != value && *end == 0;
    int yes = strcmp(value, "yes") == 0, no = strcmp(value, "no") == 0;
    if (strcmp(key, "max_message") == 0 && number)
        f->limits.max_message = v;
    else if (strcmp(key, "max_frame") == 0 && number)
        f->limits.max_frame = v;
    else if (strcmp(key, "tx_high_water") == 0 && number)
        f->limits.tx_high_water = (size_t)v;
    else if (strcmp(key, "split") == 0 && (yes || no))
        f->split = yes;
    else if (strcmp(key, "closed") == 0 && (yes || no))
        f->closed = yes;
    else if (strcmp(key, "echo") == 0 && (yes || no))
        f->echo = yes;
    else if (strcmp(key, "close") == 0 && number)
        f->close_code = (int)v;
    else if (strcmp(key, "close") == 0 && strcmp(value, "none") == 0)
        f->close_code = 0;
    else if (strcmp(key, "app_close") == 0 && number) {
        f->app_close = (unsigned)v;
        f->app_closes = 1;
    } else if (strcmp(key, "protocols") == 0) {
        char copy[256];
        snprintf(copy, sizeof copy, "%s", value);
        for (char *save, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (f->nprotocols == 8)
                return -1;
            snprintf(f->protocols[f->nprotocols++], sizeof f->protocols[0], "%s", t);
        }
    } else {
        return -1;
    }
    return 0;
}

/* Reads a fixture file; fails the test with the file and line on a format error. */
static void fixture_load(const char *path, struct fixture *f)
{
    memset(f, 0, sizeof *f);
    f->path = path;
    f->split = 1;
    f->closed = -1;
    f->close_code = -1;
    f->echo = 1;
    fx_put(&f->in, "", 0);
    fx_put(&f->out, "", 0);
    fx_put(&f->messages, "", 0);
    fx_put(&f->request, "", 0);
    fx_put(&f->response, "", 0);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        fail_msg("cannot open %s", path);
    enum { NONE, DESCRIPTION, OPTIONS, REQUEST, RESPONSE, IN, OUT, MESSAGES } section = NONE;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    unsigned lineno = 0;
    while ((n = getline(&line, &cap, fp)) >= 0) {
        lineno++;
        if (n > 0 && line[n - 1] == '\n')
            line[--n] = 0;
        if (strncmp(line, "=== ", 4) == 0) {
            static const char *const names[] = {"",         "description", "options", "request",
                                                "response", "in",          "out",     "messages"};
            section = NONE;
            for (int i = 1; i < 8; i++)
                if (strcmp(line + 4, names[i]) == 0)
                    section = i;
            if (section == NONE)
                fail_msg("%s:%u: unknown section \"%s\"", path, lineno, line + 4);
            f->has_request |= section == REQUEST;
            f->has_response |= section == RESPONSE;
            f->has_out |= section == OUT;
            f->has_messages |= section == MESSAGES;
            continue;
        }
        const char *s = line, *e = line + n;
        int blank = skip_space(s, e) == e || *skip_space(s, e) == '#';
        int rc = 0;
        switch (section) {
        case NONE:
            if (!blank)
                fail_msg("%s:%u: text before the first section", path, lineno);
            break;
        case DESCRIPTION:
            break;
        case OPTIONS: {
            if (blank)
                break;
            char key[64], value[256];
            if (sscanf(line, "%63s %255s", key, value) != 2 || option(f, key, value) != 0)
                fail_msg("%s:%u: bad option \"%s\"", path, lineno, line);
            break;
        }
        case REQUEST:
        case RESPONSE:
            if (decode(s, e, 0, section == REQUEST ? &f->request : &f->response) == NULL)
                fail_msg("%s:%u: bad escape", path, lineno);
            break;
        case IN:
        case OUT: {
            if (blank)
                break;
            /* "*N line": the frame line N times. */
            unsigned long times = 1;
            s = skip_space(s, e);
            if (*s == '*') {
                char *end;
                times = strtoul(s + 1, &end, 10);
                if (end == s + 1 || (*end != ' ' && *end != '\t'))
                    fail_msg("%s:%u: bad repeat", path, lineno);
                s = end;
            }
            for (unsigned long k = 0; k < times && rc == 0; k++) {
                if (section == IN) {
                    f->starts = realloc(f->starts, (f->nstarts + 1) * sizeof *f->starts);
                    f->starts[f->nstarts++] = f->in.n;
                }
                rc = frame_line(s, e, section == IN, section == IN ? &f->in : &f->out);
            }
            break;
        }
        case MESSAGES:
            if (!blank)
                rc = message_line(s, e, &f->messages);
            break;
        }
        if (rc != 0)
            fail_msg("%s:%u: bad line \"%s\"", path, lineno, line);
    }
    free(line);
    fclose(fp);
    if (!f->has_out && !f->has_response)
        fail_msg("%s: needs an out (or response) section", path);
    if (f->has_request != f->has_response)
        fail_msg("%s: request and response go together", path);
}

/* ---------------------------------------------------------------------------------------- */
/* The loopback: a connection whose socket is two byte strings. Every receive is copied into
 * a heap block of exactly its size, freed right after the call, so AddressSanitizer reports
 * any read past it and any pointer kept into it. The output and message buffers are reused
 * from run to run. */

struct loopback {
    struct shmipc__ws_limits limits;
    struct shmipc__ws_conn conn;
    int live; /* conn was initialised */
    struct fx_bytes out;
    struct fx_bytes messages;
    int echo;
    int verdict;
    int closes; /* on_close calls */
    unsigned close_code;
    size_t drain_step; /* bytes reported sent per tx_sent() call; 0 for all */
};

static int on_message(void *ud, unsigned opcode, const char *data, size_t len)
{
    struct loopback *lb = ud;
    record_message(&lb->messages, opcode, data, len);
    if (lb->echo)
        assert_int_equal(shmipc__ws_conn_send(&lb->conn, opcode, data, len, 0), 0);
    return 0;
}

static void on_close(void *ud, unsigned code, const char *reason, size_t len)
{
    struct loopback *lb = ud;
    (void)reason;
    (void)len;
    lb->closes++;
    lb->close_code = code;
}

static const struct shmipc__ws_callbacks callbacks = {
    .on_message = on_message,
    .on_close = on_close,
};

static void lb_drain(struct loopback *lb)
{
    const char *p;
    size_t n;
    while ((n = shmipc__ws_conn_tx_peek(&lb->conn, &p)) > 0) {
        size_t take = lb->drain_step && lb->drain_step < n ? lb->drain_step : n;
        fx_put(&lb->out, p, take);
        (void)shmipc__ws_conn_tx_sent(&lb->conn, take);
    }
    assert_int_equal(shmipc__ws_conn_tx_queued(&lb->conn), 0);
}

/* A fresh connection for one run of `f`. */
static void lb_reset(struct loopback *lb, const struct fixture *f, size_t drain_step)
{
    if (lb->live)
        shmipc__ws_conn_destroy(&lb->conn);
    assert_int_equal(shmipc__ws_limits_resolve(&lb->limits, &f->limits), 0);
    shmipc__ws_conn_init(&lb->conn, &lb->limits, &callbacks, lb);
    lb->live = 1;
    lb->echo = f->echo;
    lb->drain_step = drain_step;
    lb->verdict = SHMIPC__WS_CONN_MORE;
    lb->closes = 0;
    lb->close_code = 0;
    lb->out.n = 0;
    lb->messages.n = 0;
    fx_put(&lb->out, "", 0);
    fx_put(&lb->messages, "", 0);
    if (f->app_closes)
        assert_int_equal(shmipc__ws_conn_close(&lb->conn, f->app_close, NULL, 0), 0);
    lb_drain(lb);
}

static void lb_feed(struct loopback *lb, const char *data, size_t n)
{
    char *rx = malloc(n ? n : 1);
    assert_non_null(rx);
    memcpy(rx, data, n);
    int v = shmipc__ws_conn_process(&lb->conn, rx, n);
    free(rx);
    assert_true(v >= 0);
    if (lb->verdict == SHMIPC__WS_CONN_CLOSE)
        assert_int_equal(v, SHMIPC__WS_CONN_CLOSE); /* closed stays closed */
    lb->verdict = v;
    lb_drain(lb);
}

static void lb_free(struct loopback *lb)
{
    if (lb->live)
        shmipc__ws_conn_destroy(&lb->conn);
    free(lb->out.p);
    free(lb->messages.p);
}

/* Runs the input of `f` cut at the offsets given and checks every outcome. */
static void run_pieces(struct loopback *lb, const struct fixture *f, const size_t *cuts,
                       size_t ncuts, size_t drain_step, const char *how)
{
    lb_reset(lb, f, drain_step);
    size_t from = 0;
    for (size_t k = 0; k < ncuts; k++) {
        lb_feed(lb, f->in.p + from, cuts[k] - from);
        from = cuts[k];
    }
    lb_feed(lb, f->in.p + from, f->in.n - from);

    if (lb->out.n != f->out.n || memcmp(lb->out.p, f->out.p, f->out.n) != 0) {
        print_message("%s: fed %s\n", f->path, how);
        assert_bytes_equal("output", &lb->out, &f->out);
    }
    if (f->has_messages && (lb->messages.n != f->messages.n ||
                            memcmp(lb->messages.p, f->messages.p, f->messages.n) != 0)) {
        print_message("%s: fed %s: the messages differ\n", f->path, how);
        assert_string_equal(lb->messages.p, f->messages.p);
    }
    if (f->closed >= 0) {
        int closed = lb->verdict == SHMIPC__WS_CONN_CLOSE;
        if (closed != f->closed)
            print_message("%s: fed %s: the connection is %s\n", f->path, how,
                          closed ? "closed" : "open");
        assert_int_equal(closed, f->closed);
        assert_int_equal(closed, shmipc__ws_conn_state(&lb->conn) == SHMIPC__WS_CLOSED);
    }
    if (f->close_code >= 0) {
        if (lb->closes != (f->close_code != 0) || lb->close_code != (unsigned)f->close_code)
            print_message("%s: fed %s: on_close %d times, code %u\n", f->path, how, lb->closes,
                          lb->close_code);
        assert_int_equal(lb->closes, f->close_code != 0);
        if (f->close_code)
            assert_int_equal(lb->close_code, f->close_code);
    }
    assert_true(lb->closes <= 1);
}

static int by_offset(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

/*
 * The split points to try (sorted, distinct, in 1..n-1): every one for inputs up to 4 KiB.
 * Beyond, where payload bytes are many and alike, the positions where a split can matter:
 * the first and last `edge` bytes, the first 16 bytes of up to `frames` frames (their headers
 * and the first payload bytes), 16 consecutive positions in the middle (every phase of the
 * word-at-a-time unmasking), and `spread` positions evenly between.
 */
static size_t split_points(const struct fixture *f, size_t *out)
{
    size_t n = f->in.n, k = 0;
    if (n <= 4096) {
        for (size_t i = 1; i < n; i++)
            out[k++] = i;
        return k;
    }
    int big = n > (256u << 10);
    size_t edge = big ? 4 : 32, frames = big ? 2 : 16, spread = big ? 4 : 16;
    for (size_t i = 1; i <= edge; i++) {
        out[k++] = i;
        out[k++] = n - i;
    }
    size_t every = f->nstarts > frames ? f->nstarts / frames : 1;
    for (size_t j = 0; j < f->nstarts; j += every)
        for (size_t d = 0; d < 16; d++)
            out[k++] = f->starts[j] + d;
    for (size_t d = 0; d < 16; d++)
        out[k++] = n / 2 + d;
    for (size_t j = 1; j <= spread; j++)
        out[k++] = n * j / (spread + 1);
    qsort(out, k, sizeof *out, by_offset);
    size_t m = 0;
    for (size_t i = 0; i < k; i++)
        if (out[i] > 0 && out[i] < n && (m == 0 || out[m - 1] != out[i]))
            out[m++] = out[i];
    return m;
}

/* The handshake of a case: parses the request, checks it, writes the response. */
static void handshake(const struct fixture *f, struct fx_bytes *resp)
{
    struct shmipc__http_limits lim;
    assert_int_equal(shmipc__http_limits_resolve(&lim, NULL), 0);
    struct shmipc__http_field *fields = calloc(lim.max_headers, sizeof *fields);
    struct shmipc__http_parser p;
    shmipc__http_parser_init(&p, &lim, fields);
    int rc = shmipc__http_parse_head(&p, f->request.p, f->request.n);
    if (rc <= 0)
        fail_msg("%s: the request does not parse (%d, status %u)", f->path, rc, p.status);
    assert_int_equal((size_t)rc, f->request.n);
    const char *protocols[8];
    for (size_t i = 0; i < f->nprotocols; i++)
        protocols[i] = f->protocols[i];
    struct shmipc__ws_handshake hs;
    int ok = shmipc__ws_handshake_check(&hs, &p.req, protocols, f->nprotocols);
    assert_true(ok == 0 || ok == SHMIPC_EPROTO);
    assert_int_equal(ok == 0, hs.status == 101);
    char out[2048];
    int n = shmipc__ws_handshake_write(&hs, out, sizeof out, NULL, NULL);
    assert_true(n > 0);
    fx_put(resp, out, (size_t)n);
    assert_bytes_equal("handshake response", resp, &f->response);
    free(fields);
}

static void run_fixture(void **state)
{
    const char *path = *state;
    struct fixture f;
    fixture_load(path, &f);
    struct fx_bytes resp = {0};
    fx_put(&resp, "", 0);
    if (f.has_request)
        handshake(&f, &resp);
    if (!f.has_request || f.has_out) {
        struct loopback lb = {0};
        run_pieces(&lb, &f, NULL, 0, 0, "whole");
        size_t n = f.in.n;
        if (f.split && n > 1) {
            size_t *cuts = malloc((n + 16 * f.nstarts + 1024) * sizeof *cuts);
            assert_non_null(cuts);
            size_t k = split_points(&f, cuts);
            for (size_t i = 0; i < k; i++) {
                char how[64];
                snprintf(how, sizeof how, "in two pieces split at byte %zu", cuts[i]);
                run_pieces(&lb, &f, &cuts[i], 1, 0, how);
            }
            /* A drip: one byte per receive (1 KiB for inputs over 64 KiB), the output taken
             * as many bytes at a time. */
            size_t step = n > (64u << 10) ? 1024 : 1, m = 0;
            for (size_t i = step; i < n; i += step)
                cuts[m++] = i;
            run_pieces(&lb, &f, cuts, m, step, "in small pieces");
            free(cuts);
        }
        lb_free(&lb);
    }
    free(resp.p);
    fixture_free(&f);
}

/* ---------------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    /* The large cases allocate and free megabytes per run; without this glibc returns the
     * heap top to the kernel every time and the page faults dominate the run time. */
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    const char *dir = argc > 1 ? argv[1] : FIXTURE_DIR;
    return fx_run_files("ws_fixtures", dir, ".ws", NULL, 0, run_fixture);
}
