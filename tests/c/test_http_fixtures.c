/*
 * Description: byte-exact HTTP/1.1 fixtures (the .http files of tests/http) through an in-memory loopback
 * connection: request bytes in, response bytes out, every case also split at every byte.
 *
 * Each fixture file is its own cmocka test, found at run time; tests/http/README.md gives the
 * format. Usage: test_http_fixtures [FIXTURE_DIR] (default: the source tree's tests/http).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture_reader.h"
#include "shmipc.h"
#include "net/http_conn.h"

/* The fixtures sit beside the vectors in the source tree. */
#define FIXTURE_DIR SHMIPC_VECTORS_DIR "/../http"

/* Every fixture's Date: 1994-11-06 08:49:37 UTC. */
#define FIXED_TIME ((time_t)784111777)

/* ---------------------------------------------------------------------------------------- */
/* Byte strings */

/* Readable rendering for assertion messages: escapes, and a real newline after each LF. */
static char *render(const char *d, size_t n)
{
    struct fx_bytes r = {0};
    fx_put(&r, "", 0);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)d[i];
        char tmp[8];
        if (c == '\r')
            fx_put(&r, "\\r", 2);
        else if (c == '\n')
            fx_put(&r, "\\n\n", 3);
        else if (c == '\\')
            fx_put(&r, "\\\\", 2);
        else if (c >= 0x20 && c < 0x7f)
            fx_put(&r, &c, 1);
        else
            fx_put(&r, tmp, (size_t)snprintf(tmp, sizeof tmp, "\\x%02x", c));
    }
    return r.p;
}

static void assert_bytes_equal(const char *got, size_t got_n, const char *want, size_t want_n)
{
    char *g = render(got, got_n), *w = render(want, want_n);
    assert_string_equal(g, w);
    free(g);
    free(w);
}

/* ---------------------------------------------------------------------------------------- */
/* The handler of every fixture: a small routing table. */

static const struct shmipc__http_header_out allow_get[] = {{"Allow", "GET, HEAD", 5, 9}};
static const struct shmipc__http_header_out allow_all[] = {
    {"Allow", "GET, HEAD, POST, OPTIONS", 5, 24}};

static int path_is(const struct shmipc__http_request *req, const char *path)
{
    size_t n = strlen(path);
    return req->path.len == n && memcmp(shmipc__http_at(req, req->path), path, n) == 0;
}

/*
 * "/" answers GET and HEAD with "Hello, World!" (405 otherwise); "/echo" returns the body;
 * "/close" answers and closes; "/fail" makes the handler fail (500); "OPTIONS *" is a 204;
 * an unknown method is a 501 and every other path a 404 (canned).
 */
static int fixture_handler(void *user_data, const struct shmipc__http_request *req,
                           const char *body, size_t body_len, struct shmipc__http_response *resp)
{
    (void)user_data;
    if (req->flags & SHMIPC__HTTP_UNKNOWN_METHOD) {
        shmipc__http_response_error(resp, 501);
    } else if (path_is(req, "/")) {
        if (req->method != SHMIPC__HTTP_GET && req->method != SHMIPC__HTTP_HEAD) {
            shmipc__http_response_error(resp, 405);
            resp->headers = allow_get;
            resp->nheaders = 1;
            return 0;
        }
        resp->content_type = "text/plain";
        resp->body = "Hello, World!";
        resp->body_len = 13;
    } else if (path_is(req, "/echo")) {
        resp->content_type = "application/octet-stream";
        resp->body = body;
        resp->body_len = body_len;
    } else if (path_is(req, "/close")) {
        resp->flags |= SHMIPC__HTTP_RESP_CLOSE;
        resp->body = "bye";
        resp->body_len = 3;
    } else if (path_is(req, "/fail")) {
        return SHMIPC_EIO;
    } else if (path_is(req, "*") && req->method == SHMIPC__HTTP_OPTIONS) {
        resp->status = 204;
        resp->headers = allow_all;
        resp->nheaders = 1;
    } else {
        shmipc__http_response_error(resp, 404);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* The loopback: a connection whose socket is two byte strings. The receive buffer is a heap
 * block of exactly the unconsumed bytes, reallocated on every change, so ASan reports any
 * read past them and the buffer moves between calls as a real one may. */

struct loopback {
    struct shmipc__http_limits limits;
    struct shmipc__http_field *fields;
    struct shmipc__http_conn conn;
    struct shmipc__http_date date;
    struct iovec iov[64];
    char arena[1 << 16];
    struct shmipc__http_batch batch;
    char *rx;
    size_t rx_len;
    unsigned budget;
    int closed;
    unsigned writes; /* vectored writes issued, one per process() call with output */
    struct fx_bytes out;
};

static void rx_exact(struct loopback *lb)
{
    char *n = lb->rx_len ? malloc(lb->rx_len) : NULL;
    if (lb->rx_len)
        memcpy(n, lb->rx, lb->rx_len);
    free(lb->rx);
    lb->rx = n;
}

static struct loopback *lb_new(const struct shmipc__http_limits *limits, unsigned budget)
{
    struct loopback *lb = calloc(1, sizeof *lb);
    assert_non_null(lb);
    assert_int_equal(shmipc__http_limits_resolve(&lb->limits, limits), 0);
    lb->fields = calloc(lb->limits.max_headers, sizeof *lb->fields);
    shmipc__http_conn_init(&lb->conn, &lb->limits, lb->fields, fixture_handler, NULL);
    shmipc__http_date_init(&lb->date, FIXED_TIME);
    shmipc__http_batch_init(&lb->batch, lb->iov, 64, lb->arena, sizeof lb->arena, &lb->date);
    lb->budget = budget;
    fx_put(&lb->out, "", 0);
    return lb;
}

static void lb_free(struct loopback *lb)
{
    free(lb->rx);
    free(lb->fields);
    free(lb->out.p);
    free(lb);
}

/* Delivers n bytes as one receive, then runs the connection until it wants more. */
static void lb_feed(struct loopback *lb, const char *data, size_t n)
{
    if (lb->closed)
        return; /* after a close the peer's bytes are drained unread */
    char *grown = malloc(lb->rx_len + n + 1);
    assert_non_null(grown);
    if (lb->rx_len)
        memcpy(grown, lb->rx, lb->rx_len);
    memcpy(grown + lb->rx_len, data, n);
    free(lb->rx);
    lb->rx = grown;
    lb->rx_len += n;
    rx_exact(lb);
    for (;;) {
        size_t consumed = 0;
        int v = shmipc__http_conn_process(&lb->conn, lb->rx, &lb->rx_len, &consumed, &lb->batch,
                                          lb->budget);
        assert_true(v >= 0);
        assert_true(consumed <= lb->rx_len);
        /* "Write" the batch before touching the buffer its iovecs may point into. */
        if (lb->batch.niov)
            lb->writes++;
        size_t before = lb->out.n;
        for (uint32_t i = 0; i < lb->batch.niov; i++)
            fx_put(&lb->out, lb->iov[i].iov_base, lb->iov[i].iov_len);
        assert_int_equal(lb->out.n - before, lb->batch.bytes);
        shmipc__http_batch_reset(&lb->batch);
        if (consumed) {
            memmove(lb->rx, lb->rx + consumed, lb->rx_len - consumed);
            lb->rx_len -= consumed;
        }
        rx_exact(lb);
        if (v == SHMIPC__HTTP_CONN_CLOSE) {
            lb->closed = 1;
            return;
        }
        if (v == SHMIPC__HTTP_CONN_MORE)
            return;
        /* YIELD must make progress: output or consumed bytes. */
        assert_true(consumed > 0 || lb->out.n > before);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Fixture files */

struct fixture {
    struct shmipc__http_limits limits;
    struct fx_bytes requests[8]; /* one per "=== request" section: one receive each */
    size_t nrequests;
    struct fx_bytes response;
    int split;  /* also feed the request split at every byte (default 1) */
    int closed; /* expected connection state at the end: 1, 0, or -1 unchecked */
    unsigned budget;
};

static void fixture_free(struct fixture *f)
{
    for (size_t i = 0; i < f->nrequests; i++)
        free(f->requests[i].p);
    free(f->response.p);
}

static int option(struct fixture *f, const char *key, const char *value)
{
    char *end;
    unsigned long long v = strtoull(value, &end, 10);
    int number = end != value && *end == 0;
    int yes = strcmp(value, "yes") == 0, no = strcmp(value, "no") == 0;
    if (strcmp(key, "max_request_line") == 0 && number)
        f->limits.max_request_line = (uint32_t)v;
    else if (strcmp(key, "max_head_bytes") == 0 && number)
        f->limits.max_head_bytes = (uint32_t)v;
    else if (strcmp(key, "max_headers") == 0 && number)
        f->limits.max_headers = (uint32_t)v;
    else if (strcmp(key, "max_chunk_line") == 0 && number)
        f->limits.max_chunk_line = (uint32_t)v;
    else if (strcmp(key, "max_body") == 0 && number)
        f->limits.max_body = v;
    else if (strcmp(key, "lenient_lf") == 0 && (yes || no))
        f->limits.flags = yes ? SHMIPC__HTTP_LENIENT_LF : 0;
    else if (strcmp(key, "split") == 0 && (yes || no))
        f->split = yes;
    else if (strcmp(key, "closed") == 0 && (yes || no))
        f->closed = yes;
    else if (strcmp(key, "budget") == 0 && number)
        f->budget = (unsigned)v;
    else
        return -1;
    return 0;
}

/* Reads a fixture file; fails the test with the file and line on a format error. */
static void fixture_load(const char *path, struct fixture *f)
{
    memset(f, 0, sizeof *f);
    f->split = 1;
    f->closed = -1;
    FILE *fp = fopen(path, "rb");
    if (!fp)
        fail_msg("cannot open %s", path);
    enum { NONE, DESCRIPTION, OPTIONS, REQUEST, RESPONSE } section = NONE;
    int have_response = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    unsigned lineno = 0;
    while ((n = getline(&line, &cap, fp)) >= 0) {
        lineno++;
        if (n > 0 && line[n - 1] == '\n')
            line[--n] = 0;
        if (strncmp(line, "=== ", 4) == 0) {
            const char *name = line + 4;
            if (strcmp(name, "description") == 0) {
                section = DESCRIPTION;
            } else if (strcmp(name, "options") == 0) {
                section = OPTIONS;
            } else if (strcmp(name, "request") == 0) {
                if (f->nrequests == sizeof f->requests / sizeof f->requests[0])
                    fail_msg("%s:%u: too many request sections", path, lineno);
                section = REQUEST;
                fx_put(&f->requests[f->nrequests++], "", 0);
            } else if (strcmp(name, "response") == 0) {
                section = RESPONSE;
                have_response = 1;
                fx_put(&f->response, "", 0);
            } else {
                fail_msg("%s:%u: unknown section \"%s\"", path, lineno, name);
            }
            continue;
        }
        switch (section) {
        case NONE:
            if (n > 0 && line[0] != '#')
                fail_msg("%s:%u: text before the first section", path, lineno);
            break;
        case DESCRIPTION:
            break;
        case OPTIONS: {
            if (n == 0 || line[0] == '#')
                break;
            char key[64], value[64];
            if (sscanf(line, "%63s %63s", key, value) != 2 || option(f, key, value) != 0)
                fail_msg("%s:%u: bad option \"%s\"", path, lineno, line);
            break;
        }
        case REQUEST:
        case RESPONSE: {
            struct fx_bytes *b = section == REQUEST ? &f->requests[f->nrequests - 1] : &f->response;
            if (fx_decode(line, line + n, 0, "\\{}", b) == NULL)
                fail_msg("%s:%u: bad escape", path, lineno);
            break;
        }
        }
    }
    free(line);
    fclose(fp);
    if (f->nrequests == 0 || !have_response)
        fail_msg("%s: needs a request and a response section", path);
}

/* Runs the requests of `f`, each cut at the offsets given (for the single request), and
 * checks the output and the final connection state. */
static void run_pieces(const struct fixture *f, const size_t *cuts, size_t ncuts, const char *how)
{
    struct loopback *lb = lb_new(&f->limits, f->budget);
    for (size_t r = 0; r < f->nrequests; r++) {
        const struct fx_bytes *req = &f->requests[r];
        size_t from = 0;
        for (size_t k = 0; f->nrequests == 1 && k < ncuts; k++) {
            lb_feed(lb, req->p + from, cuts[k] - from);
            from = cuts[k];
        }
        lb_feed(lb, req->p + from, req->n - from);
    }
    if (lb->out.n != f->response.n || memcmp(lb->out.p, f->response.p, lb->out.n) != 0)
        print_message("fed %s\n", how);
    assert_bytes_equal(lb->out.p, lb->out.n, f->response.p, f->response.n);
    if (f->closed >= 0) {
        if (lb->closed != f->closed)
            print_message("fed %s: the connection is %s\n", how, lb->closed ? "closed" : "open");
        assert_int_equal(lb->closed, f->closed);
    }
    lb_free(lb);
}

static void run_fixture(void **state)
{
    const char *path = *state;
    struct fixture f;
    fixture_load(path, &f);
    run_pieces(&f, NULL, 0, "whole");
    if (f.split && f.nrequests == 1) {
        size_t n = f.requests[0].n;
        /* Every split point; for long requests, the first and last 512 and a stride between. */
        for (size_t i = 1; i < n; i++) {
            if (n > 4096 && i > 512 && i + 512 < n && i % 97)
                continue;
            char how[64];
            snprintf(how, sizeof how, "in two pieces split at byte %zu", i);
            run_pieces(&f, &i, 1, how);
        }
        size_t *drip = malloc((n ? n : 1) * sizeof *drip);
        for (size_t i = 0; i < n; i++)
            drip[i] = i + 1;
        run_pieces(&f, drip, n, "one byte at a time");
        free(drip);
    }
    fixture_free(&f);
}

/* ---------------------------------------------------------------------------------------- */
/* Behaviour of the connection that fixtures cannot express. */

static void budget_yields_and_one_write_per_batch(void **state)
{
    (void)state;
    struct fx_bytes reqs = {0};
    for (int i = 0; i < 40; i++)
        fx_put(&reqs, "GET / HTTP/1.1\r\nHost: h\r\n\r\n", 27);
    struct loopback *lb = lb_new(NULL, 16);
    lb_feed(lb, reqs.p, reqs.n);
    /* 40 pipelined requests with a budget of 16: three turns, one vectored write each. */
    assert_int_equal(lb->writes, 3);
    assert_false(lb->closed);
    static const char one[] = "HTTP/1.1 200 OK\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
                              "Content-Type: text/plain\r\nContent-Length: 13\r\n\r\nHello, World!";
    assert_int_equal(lb->out.n, 40 * (sizeof one - 1));
    for (int i = 0; i < 40; i++)
        assert_memory_equal(lb->out.p + i * (sizeof one - 1), one, sizeof one - 1);
    lb_free(lb);
    free(reqs.p);
}

static void a_full_batch_yields(void **state)
{
    (void)state;
    struct loopback *lb = lb_new(NULL, 1000);
    /* Room for fewer responses than requests: the connection yields, the owner writes. */
    shmipc__http_batch_init(&lb->batch, lb->iov, 64, lb->arena, 4096 + 200, &lb->date);
    struct fx_bytes reqs = {0};
    for (int i = 0; i < 10; i++)
        fx_put(&reqs, "GET / HTTP/1.1\r\nHost: h\r\n\r\n", 27);
    lb_feed(lb, reqs.p, reqs.n);
    assert_int_equal(lb->writes, 5); /* two responses fit above the reserve per turn */
    assert_int_equal(lb->out.n, 10 * 115u);
    lb_free(lb);
    free(reqs.p);
}

/* A connection of fixture_handler and a batch of 8 iovecs, driven by hand. */
struct bare_conn {
    struct shmipc__http_limits lim;
    struct shmipc__http_field fields[64];
    struct shmipc__http_conn c;
    struct iovec iov[8];
    char arena[8192];
    struct shmipc__http_batch b;
};

/* Resolves the limits `in` (NULL: the defaults) and sets up the connection and the batch. */
static void bare_conn_init(struct bare_conn *bc, const struct shmipc__http_limits *in)
{
    assert_int_equal(shmipc__http_limits_resolve(&bc->lim, in), 0);
    assert_in_range(bc->lim.max_headers, 1, sizeof bc->fields / sizeof bc->fields[0]);
    shmipc__http_conn_init(&bc->c, &bc->lim, bc->fields, fixture_handler, NULL);
    shmipc__http_batch_init(&bc->b, bc->iov, 8, bc->arena, sizeof bc->arena, NULL);
}

static void closed_connection_consumes_everything(void **state)
{
    (void)state;
    struct bare_conn bc;
    bare_conn_init(&bc, NULL);
    char rx[] = "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\nGET / HTTP/1.1\r\n";
    size_t len = sizeof rx - 1, consumed;
    assert_int_equal(shmipc__http_conn_process(&bc.c, rx, &len, &consumed, &bc.b, 0),
                     SHMIPC__HTTP_CONN_CLOSE);
    assert_int_equal(consumed, len);
    shmipc__http_batch_reset(&bc.b);
    assert_int_equal(shmipc__http_conn_process(&bc.c, rx, &len, &consumed, &bc.b, 0),
                     SHMIPC__HTTP_CONN_CLOSE);
    assert_int_equal(consumed, len);
    assert_int_equal(bc.b.niov, 0);
}

/* Defers GET/HEAD /defer (the shmipc-serve front's handler does), answers "ok" otherwise. */
static int deferring_handler(void *ud, const struct shmipc__http_request *req, const char *body,
                             size_t body_len, struct shmipc__http_response *resp)
{
    (void)ud;
    (void)body;
    (void)body_len;
    if (req->path.len == 6 && memcmp(req->base + req->path.off, "/defer", 6) == 0)
        return SHMIPC__HTTP_DEFER;
    resp->body = "ok";
    resp->body_len = 2;
    return 0;
}

static size_t batch_text(const struct shmipc__http_batch *b, char *out, size_t cap)
{
    size_t n = 0;
    for (unsigned i = 0; i < b->niov; i++) {
        assert_true(n + b->iov[i].iov_len < cap);
        memcpy(out + n, b->iov[i].iov_base, b->iov[i].iov_len);
        n += b->iov[i].iov_len;
    }
    out[n] = '\0';
    return n;
}

/* A deferred request holds the pipeline: the answers before it go, nothing behind it is
 * parsed until complete(), which keeps what the request implied (HEAD, HTTP/1.0's close)
 * whatever the owner set, and answers 500 for an answer without a status. */
static void deferred_request_holds_the_pipeline(void **state)
{
    (void)state;
    struct bare_conn bc;
    char text[8192];
    bare_conn_init(&bc, NULL);
    bc.c.handler = deferring_handler;
    char rx[] = "GET /a HTTP/1.1\r\nHost: h\r\n\r\n"
                "HEAD /defer HTTP/1.0\r\n\r\n"
                "GET /b HTTP/1.1\r\nHost: h\r\n\r\n";
    size_t first_two = strlen("GET /a HTTP/1.1\r\nHost: h\r\n\r\nHEAD /defer HTTP/1.0\r\n\r\n");
    size_t len = sizeof rx - 1, consumed;
    assert_int_equal(shmipc__http_conn_process(&bc.c, rx, &len, &consumed, &bc.b, 0),
                     SHMIPC__HTTP_CONN_DEFER);
    assert_int_equal(consumed, first_two);
    assert_true(shmipc__http_conn_deferred(&bc.c));
    batch_text(&bc.b, text, sizeof text);
    assert_non_null(strstr(text, "\r\n\r\nok"));
    assert_null(strstr(strstr(text, "\r\n\r\nok") + 6, "\r\n\r\nok")); /* only /a's */
    /* Deferred: nothing more is answered, nothing consumed. */
    shmipc__http_batch_reset(&bc.b);
    char *rest = rx + first_two;
    size_t rlen = len - first_two;
    assert_int_equal(shmipc__http_conn_process(&bc.c, rest, &rlen, &consumed, &bc.b, 0),
                     SHMIPC__HTTP_CONN_DEFER);
    assert_int_equal(consumed, 0);
    assert_int_equal(bc.b.niov, 0);
    /* The owner's answer, with its own flags: HEAD and HTTP/1.0's close are kept. */
    bc.c.deferred.status = 201;
    bc.c.deferred.flags = 0;
    bc.c.deferred.body = "xyz";
    bc.c.deferred.body_len = 3;
    assert_int_equal(shmipc__http_conn_complete(&bc.c, &bc.b), 1);
    batch_text(&bc.b, text, sizeof text);
    assert_true(strncmp(text, "HTTP/1.0 201 ", 13) == 0 || strncmp(text, "HTTP/1.1 201 ", 13) == 0);
    assert_non_null(strstr(text, "Content-Length: 3\r\n"));
    assert_null(strstr(text, "xyz")); /* HEAD: no body */
    assert_false(shmipc__http_conn_deferred(&bc.c));
    assert_int_equal(shmipc__http_conn_complete(&bc.c, &bc.b), SHMIPC_EINVAL);

    /* Keep-alive: after complete() the pipelined request behind is answered; an answer
     * without a status becomes a 500 that closes. */
    bare_conn_init(&bc, NULL);
    bc.c.handler = deferring_handler;
    char rx2[] = "GET /defer HTTP/1.1\r\nHost: h\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\n";
    len = sizeof rx2 - 1;
    assert_int_equal(shmipc__http_conn_process(&bc.c, rx2, &len, &consumed, &bc.b, 0),
                     SHMIPC__HTTP_CONN_DEFER);
    assert_int_equal(bc.b.niov, 0);
    bc.c.deferred.status = 200;
    bc.c.deferred.body = "done";
    bc.c.deferred.body_len = 4;
    assert_int_equal(shmipc__http_conn_complete(&bc.c, &bc.b), 0);
    char *rest2 = rx2 + consumed;
    size_t rlen2 = len - consumed;
    assert_int_equal(shmipc__http_conn_process(&bc.c, rest2, &rlen2, &consumed, &bc.b, 0),
                     SHMIPC__HTTP_CONN_MORE);
    batch_text(&bc.b, text, sizeof text);
    char *done = strstr(text, "\r\n\r\ndone"), *ok = strstr(text, "\r\n\r\nok");
    assert_true(done != NULL && ok != NULL && done < ok);

    bare_conn_init(&bc, NULL);
    bc.c.handler = deferring_handler;
    len = sizeof rx2 - 1;
    assert_int_equal(shmipc__http_conn_process(&bc.c, rx2, &len, &consumed, &bc.b, 0),
                     SHMIPC__HTTP_CONN_DEFER);
    bc.c.deferred.status = 0; /* no answer: a 500 that closes */
    assert_int_equal(shmipc__http_conn_complete(&bc.c, &bc.b), 1);
    batch_text(&bc.b, text, sizeof text);
    assert_true(strncmp(text, "HTTP/1.1 500 ", 13) == 0);
}

/* The echo of a 1 MiB body leaves as [head, body] with the body referenced in place. */
static void large_echo_is_not_copied(void **state)
{
    (void)state;
    struct shmipc__http_limits in = {.max_body = 1u << 20};
    struct bare_conn bc;
    bare_conn_init(&bc, &in);
    static const char head[] = "POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 1048576\r\n\r\n";
    size_t len = sizeof head - 1 + (1u << 20), consumed;
    char *rx = malloc(len);
    memcpy(rx, head, sizeof head - 1);
    memset(rx + sizeof head - 1, 'z', 1u << 20);
    assert_int_equal(shmipc__http_conn_process(&bc.c, rx, &len, &consumed, &bc.b, 0),
                     SHMIPC__HTTP_CONN_MORE);
    assert_int_equal(consumed, len);
    assert_int_equal(bc.b.niov, 2);
    assert_ptr_equal(bc.iov[1].iov_base, rx + sizeof head - 1);
    assert_int_equal(bc.iov[1].iov_len, 1u << 20);
    free(rx);
}

/* ---------------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    static const struct CMUnitTest fixed[] = {
        cmocka_unit_test(budget_yields_and_one_write_per_batch),
        cmocka_unit_test(a_full_batch_yields),
        cmocka_unit_test(closed_connection_consumes_everything),
        cmocka_unit_test(large_echo_is_not_copied),
        cmocka_unit_test(deferred_request_holds_the_pipeline),
    };
    return fx_run_files("http_fixtures", argc > 1 ? argv[1] : FIXTURE_DIR, ".http", fixed,
                        sizeof fixed / sizeof fixed[0], run_fixture);
}
