/*
 * serve_hello.c - a C handler for shmipc-serve (docs/serve.md, "The C worker"):
 *
 *   shmipc-serve --c ./libserve_hello.so --workers 2          (symbol shmipc_serve_handle)
 *
 * GET / answers "Hello, world!\n". Any request with a body gets it back (an echo, streamed
 * through a 64 KiB buffer). The other paths show the failure mapping, and the tests
 * (tests/python/test_serve_native_worker.py) use them:
 *   /big?N         N bytes of a repeated pattern, written in 100000-byte pieces, no length
 *   /fail          returns an error before the head: the client gets a 500
 *   /fail-after    sends a head and part of the body, then fails: the client sees a truncated
 *                  response (ABORT WORKER_ERROR)
 *   /short         declares Content-Length 10 and writes 3 bytes: also ABORT WORKER_ERROR
 *   /long          declares Content-Length 2 and writes 3 bytes: the write fails, ABORT too
 *   /nothing       returns 0 without a response: a 500
 *   /204           204 No Content (its body bytes are dropped)
 *   /slow?MS       sleeps MS milliseconds first, then answers with the pid
 *   /crash         kills the worker process (the front answers 502, the supervisor restarts)
 *   /headers       answers the request's header fields, one "name: value" line each
 *   /ws            a WebSocket upgrade: accepted, every message echoed until the client
 *                  closes (its close is answered by the library); any other upgrade: 403
 */
#include <shmipc_serve.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FIELD(n, v)                                                                                \
    {                                                                                              \
        (const uint8_t *)(n), (const uint8_t *)(v), sizeof(n) - 1, sizeof(v) - 1                   \
    }

/* Whether the target's path is p; the query after '?' into q (NUL-terminated: the target is
 * not, it points into the frame). */
static int path_is(const shmipc_serve_request *r, const char *p, char (*q)[64])
{
    size_t n = strlen(p);
    (*q)[0] = '\0';
    if (r->target_len < n || memcmp(r->target, p, n) != 0)
        return 0;
    if (r->target_len == n)
        return 1;
    if (r->target[n] != '?')
        return 0;
    size_t ql = r->target_len - n - 1 < sizeof *q - 1 ? r->target_len - n - 1 : sizeof *q - 1;
    memcpy(*q, r->target + n + 1, ql);
    (*q)[ql] = '\0';
    return 1;
}

static int respond(shmipc_serve_exchange *x, unsigned status, int64_t length)
{
    static const shmipc_serve_field ct = FIELD("Content-Type", "text/plain");
    shmipc_serve_response r = {.size = sizeof r, .status = (uint16_t)status};
    if (length >= 0) {
        r.flags = SHMIPC_SERVE_RESP_CONTENT_LENGTH;
        r.content_length = (uint64_t)length;
    }
    return shmipc_serve_respond(x, &r, &ct, 1);
}

/* The echo: the request's body back, streamed (chunked to the client when its length is
 * unknown). */
static int echo(shmipc_serve_exchange *x, const shmipc_serve_request *req)
{
    static char buf[65536];
    int64_t len = req->flags & SHMIPC_SERVE_REQ_CONTENT_LENGTH ? (int64_t)req->content_length : -1;
    int rc = respond(x, 200, len);
    int64_t n = 0;
    while (rc == 0 && (n = shmipc_serve_read(x, buf, sizeof buf)) > 0)
        rc = shmipc_serve_write(x, buf, (size_t)n);
    return rc < 0 ? rc : (int)(n < 0 ? n : 0);
}

/* A WebSocket echo (docs/serve.md, "WebSocket in the C and Lua workers"): each message is
 * gathered whole from its pieces, then sent back as one message of its kind. */
static int ws_echo(shmipc_serve_exchange *x)
{
    int rc = shmipc_serve_ws_accept(x, NULL, NULL, 0);
    size_t len = 0, cap = 0;
    char *msg = NULL;
    while (rc == 0) {
        if (cap - len < 65536) {
            char *m = cap < (64u << 20) ? realloc(msg, cap + (1u << 20)) : NULL;
            if (m == NULL) { /* a message over 64 MiB (or no memory): too big */
                rc = shmipc_serve_ws_close(x, 1009, NULL, 0);
                break;
            }
            msg = m;
            cap += 1u << 20;
        }
        uint32_t flags;
        int64_t n = shmipc_serve_ws_recv(x, msg + len, cap - len, &flags, -1);
        if (n == SHMIPC_ECLOSED || n == SHMIPC_ECONNRESET) {
            rc = 0; /* the client closed (answered already) or went away */
            break;
        }
        if (n < 0) {
            rc = (int)n;
            break;
        }
        len += (size_t)n;
        if (flags & SHMIPC_SERVE_WS_FIN) {
            rc = shmipc_serve_ws_send(x, flags & 0xFFu, msg, len);
            len = 0;
            if (rc == SHMIPC_ECLOSED || rc == SHMIPC_ECONNRESET)
                rc = 0;
        }
    }
    free(msg);
    return rc;
}

int shmipc_serve_handle(shmipc_serve_exchange *x, void *user_data)
{
    (void)user_data;
    const shmipc_serve_request *req = shmipc_serve_exchange_request(x);
    char q[64];
    char line[512];
    if (req->flags & SHMIPC_SERVE_REQ_UPGRADE) {
        if (path_is(req, "/ws", &q))
            return ws_echo(x);
        int rc = respond(x, 403, 0);
        return rc < 0 ? rc : shmipc_serve_write(x, "", 0);
    }
    if (path_is(req, "/early", &q)) { /* answers without reading the request's body */
        int rc = respond(x, 200, 2);
        return rc < 0 ? rc : shmipc_serve_write(x, "ok", 2);
    }
    if (req->flags & SHMIPC_SERVE_REQ_HAS_BODY)
        return echo(x, req);
    if (path_is(req, "/", &q)) {
        static const char hello[] = "Hello, world!\n";
        int rc = respond(x, 200, sizeof hello - 1);
        return rc < 0 ? rc : shmipc_serve_write(x, hello, sizeof hello - 1);
    }
    if (path_is(req, "/big", &q)) {
        static char piece[100000];
        size_t total = strtoull(q, NULL, 10), sent = 0;
        for (size_t i = 0; i < sizeof piece; i++)
            piece[i] = (char)('a' + i % 26);
        int rc = respond(x, 200, -1);
        while (rc == 0 && sent < total) {
            size_t n = total - sent < sizeof piece ? total - sent : sizeof piece;
            rc = shmipc_serve_write(x, piece, n); /* piece i starts at offset 0 mod 26 */
            sent += n;
        }
        return rc;
    }
    if (path_is(req, "/fail", &q))
        return -1;
    if (path_is(req, "/fail-after", &q)) {
        if (respond(x, 200, 100) < 0 || shmipc_serve_write(x, "partial", 7) < 0)
            return -1;
        return -1;
    }
    if (path_is(req, "/short", &q)) {
        int rc = respond(x, 200, 10);
        return rc < 0 ? rc : shmipc_serve_write(x, "abc", 3);
    }
    if (path_is(req, "/long", &q)) { /* more than its length: refused, and the response aborted */
        int rc = respond(x, 200, 2);
        return rc < 0 ? rc : shmipc_serve_write(x, "abc", 3);
    }
    if (path_is(req, "/nothing", &q))
        return 0;
    if (path_is(req, "/204", &q)) {
        int rc = respond(x, 204, -1);
        return rc < 0 ? rc : shmipc_serve_write(x, "dropped", 7);
    }
    if (path_is(req, "/slow", &q)) {
        long ms = strtol(q, NULL, 10);
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        int n = snprintf(line, sizeof line, "%ld\n", (long)getpid());
        int rc = respond(x, 200, n);
        return rc < 0 ? rc : shmipc_serve_write(x, line, (size_t)n);
    }
    if (path_is(req, "/crash", &q)) {
        raise(SIGKILL);
        return -1;
    }
    if (path_is(req, "/headers", &q)) {
        int rc = respond(x, 200, -1);
        shmipc_serve_fields it = req->fields;
        shmipc_serve_field f;
        while (rc == 0 && shmipc_serve_fields_next(&it, &f) == 1) {
            int n = snprintf(line, sizeof line, "%.*s: %.*s\n", (int)f.name_len,
                             (const char *)f.name, (int)f.value_len, (const char *)f.value);
            rc = shmipc_serve_write(x, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        }
        return rc;
    }
    static const char nf[] = "not found\n";
    int rc = respond(x, 404, sizeof nf - 1);
    return rc < 0 ? rc : shmipc_serve_write(x, nf, sizeof nf - 1);
}
