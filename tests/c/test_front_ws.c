/* Description: WebSocket through shmipc-serve's front (core/serve/front_ws.c) end to end on
 * epoll and io_uring (docs/serve.md, "WebSocket through the front"): the handshake goes to a
 * worker (REQUEST_HEAD with UPGRADE) and its 101 accepts it (the server's accept key, the
 * worker's subprotocol) or its 403 refuses it; text, binary, fragmented and multi-frame
 * messages both ways; the close handshake from either side with its code and reason; pings
 * both ways; the worker dying or aborting (1011); the client leaving (ABORT CLIENT_GONE); a
 * slow client holding the worker back (what the front queues stays near the mark); the
 * client's close frame with its FIN or reset right behind it while the front holds or does not
 * read it (WS_CLOSE with its code, not ABORT CLIENT_GONE); cross-talk of 32 connections over 2
 * workers and 2 reactor threads with unique messages.
 *
 * The workers are front_harness.c's threads; their WebSocket side is ws_worker() below,
 * reached through the harness's front_ws_serve hook. Threads other than the case's own never
 * assert (they count into appw.bad or the case's counters). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "shmipc.h"
#include "shmipc_serve.h"
#include "net/server.h"
#include "serve/access_log.h"
#include "serve/front.h"

#include "front_harness.h"
#include "sock_sent.h"

/* ---- the worker's side ---- */

static atomic_int w_close_code; /* the last WS_CLOSE code the worker got (1005: none) */
static atomic_int w_closes;     /* WS_CLOSE frames the worker got */
static atomic_int w_upgrades;   /* handshakes the worker saw (REQUEST_HEAD with UPGRADE) */
static atomic_int w_messages;   /* whole messages the worker got from the front */

static int wsend(shmipc_stream *st, uint32_t type, uint32_t arg, const void *p, size_t n)
{
    uint8_t h[12];
    if (shmipc_serve_encode_header(h, 12, type, n, arg) != 12)
        return -1;
    int rc = shmipc_stream_write(st, h, 12);
    if (rc == 0 && n > 0)
        rc = shmipc_stream_write(st, p, n);
    if (rc == 0)
        rc = shmipc_stream_flush(st);
    return rc;
}

/* A message in frames of at most `piece` bytes: 0, or the failed write's code. */
static int wmessage(shmipc_stream *st, unsigned op, const uint8_t *p, size_t n, size_t piece)
{
    size_t off = 0;
    do {
        size_t k = n - off > piece ? piece : n - off;
        uint32_t arg =
            (off == 0 ? op : SHMIPC_SERVE_WS_CONT) | (off + k == n ? SHMIPC_SERVE_WS_FIN : 0);
        int rc = wsend(st, SHMIPC_SERVE_WS_DATA, arg, p + off, k);
        if (rc < 0)
            return rc;
        off += k;
    } while (off < n);
    return 0;
}

static int wclose(shmipc_stream *st, unsigned code, const char *reason)
{
    uint8_t buf[12 + 2 + 123];
    int64_t n =
        shmipc_serve_encode_ws_close(buf, sizeof buf, code, reason, reason ? strlen(reason) : 0);
    if (n < 12)
        return -1;
    int rc = shmipc_stream_write(st, buf, (size_t)n);
    return rc == 0 ? shmipc_stream_flush(st) : rc;
}

/* Waits for the front's WS_CLOSE (recorded) or its ABORT (counted); other frames dropped. */
static void wait_close(struct appw *w, shmipc_stream *st)
{
    for (;;) {
        uint8_t *b;
        size_t n;
        shmipc_serve_frame f;
        if (read_frame(st, &b, &n, &f) < 0)
            return;
        free(b);
        if (f.type == SHMIPC_SERVE_WS_CLOSE) {
            atomic_store(&w_close_code, f.close_code ? f.close_code : 1005);
            bump(&w_closes);
            return;
        }
        if (f.type == SHMIPC_SERVE_ABORT) {
            bump(&w->aborts[f.arg & 7]);
            return;
        }
    }
}

/* Counts the exchange out of w->concurrent, once: before the frame that lets the front give
 * the worker its next stream. */
static void count_out(struct appw *w, int *out)
{
    if (!*out) {
        *out = 1;
        atomic_fetch_sub(&w->concurrent, 1);
    }
}

/* Acts on one whole message: 1 when the exchange is over. */
static int wcommand(struct appw *w, shmipc_stream *st, unsigned op, uint8_t *m, size_t n, int *out)
{
    char cmd[64] = "";
    unsigned code, a, b;
    char reason[64];
    if (op == SHMIPC_SERVE_WS_TEXT && n < sizeof cmd) {
        memcpy(cmd, m, n);
        cmd[n] = '\0';
    }
    if (sscanf(cmd, "close:%u:%63s", &code, reason) == 2) {
        count_out(w, out); /* the front frees the worker as its answer goes out */
        if (wclose(st, code, reason) < 0)
            bump(&w->bad);
        wait_close(w, st); /* the client's answer, through the front */
        return 1;
    }
    if (strncmp(cmd, "ping:", 5) == 0 || strncmp(cmd, "pong:", 5) == 0) {
        if (wsend(st, cmd[1] == 'i' ? SHMIPC_SERVE_WS_PING : SHMIPC_SERVE_WS_PONG, 0, cmd + 5,
                  strlen(cmd + 5)) < 0)
            bump(&w->bad);
        return 0;
    }
    if (sscanf(cmd, "stall:%u", &a) == 1) { /* reads nothing for a while: the queue fills */
        sleep_ms(a);
        return 0;
    }
    if (strcmp(cmd, "badtext") == 0) { /* text that is not UTF-8 */
        if (wsend(st, SHMIPC_SERVE_WS_DATA, SHMIPC_SERVE_WS_TEXT | SHMIPC_SERVE_WS_FIN, "\xff\xfe",
                  2) < 0)
            bump(&w->bad);
        wait_close(w, st); /* the front's ABORT PROTOCOL */
        return 1;
    }
    if (strcmp(cmd, "die") == 0) {
        kill_sessions(w);
        return 1;
    }
    if (strcmp(cmd, "abort") == 0) {
        if (wsend(st, SHMIPC_SERVE_ABORT, SHMIPC_SERVE_ABORT_WORKER_ERROR, "app failed", 10) < 0)
            bump(&w->bad);
        return 1;
    }
    if (sscanf(cmd, "flood:%u:%u", &a, &b) == 2) {
        uint8_t *p = malloc(a);
        for (unsigned i = 0; i < b; i++) {
            memset(p, (int)(i & 0xff), a);
            if (wmessage(st, SHMIPC_SERVE_WS_BINARY, p, a, SHMIPC_SERVE_MAX_CHUNK) < 0) {
                bump(&w->bad);
                break;
            }
        }
        free(p);
        return 0;
    }
    /* an echo, in 64 KiB frames (a large one comes back in many); the front may have ended
     * the exchange meanwhile (its ABORT is behind the frames still read): EEOF is not bad */
    int rc = wmessage(st, op, m, n, 64u << 10);
    if (rc < 0 && rc != SHMIPC_EEOF)
        bump(&w->bad);
    return 0;
}

/*
 * A scripted worker after its 101 and END (target "/ws/script/<steps>"), one letter a step:
 * T a text message "t", P a text frame "p" without FIN, B a binary message of 1 MiB in one
 * frame, C WS_CLOSE 4000 "bye", A ABORT WORKER_ERROR, E a second END, I a WS_PING "i",
 * K every session of the worker ends, S a 200 ms sleep, W waits for the front's WS_CLOSE or
 * ABORT, X counts out. Writes that fail end the script (the front may have ended it).
 */
static void wscript(struct appw *w, shmipc_stream *st, const char *steps, int *out)
{
    static uint8_t big[1u << 20];
    int rc = 0;
    for (const char *s = steps; *s != '\0' && rc >= 0; s++) {
        switch (*s) {
        case 'T':
            rc =
                wsend(st, SHMIPC_SERVE_WS_DATA, SHMIPC_SERVE_WS_TEXT | SHMIPC_SERVE_WS_FIN, "t", 1);
            break;
        case 'P':
            rc = wsend(st, SHMIPC_SERVE_WS_DATA, SHMIPC_SERVE_WS_TEXT, "p", 1);
            break;
        case 'B':
            memset(big, 'b', sizeof big);
            rc = wsend(st, SHMIPC_SERVE_WS_DATA, SHMIPC_SERVE_WS_BINARY | SHMIPC_SERVE_WS_FIN, big,
                       sizeof big);
            break;
        case 'C':
            rc = wclose(st, 4000, "bye");
            break;
        case 'A':
            rc = wsend(st, SHMIPC_SERVE_ABORT, SHMIPC_SERVE_ABORT_WORKER_ERROR, NULL, 0);
            break;
        case 'E':
            rc = wsend(st, SHMIPC_SERVE_END, 0, NULL, 0);
            break;
        case 'I':
            rc = wsend(st, SHMIPC_SERVE_WS_PING, 0, "i", 1);
            break;
        case 'K':
            kill_sessions(w);
            break;
        case 'S':
            sleep_ms(200);
            break;
        case 'W':
            wait_close(w, st);
            break;
        case 'X':
            count_out(w, out);
            break;
        }
    }
}

static void ws_worker(struct appw *w, shmipc_stream *st, const char *target)
{
    int out = 0;
    bump(&w_upgrades);
    if (strncmp(target, "/ws/refuse", 10) == 0) {
        send_frames(w, st, 403, w->name, "nope", 4, 1, 0); /* counts the answer out */
        return;
    }
    if (strncmp(target, "/ws/early", 9) == 0) { /* WS_DATA before any 101 */
        count_out(w, &out);
        if (wsend(st, SHMIPC_SERVE_WS_DATA, SHMIPC_SERVE_WS_TEXT | SHMIPC_SERVE_WS_FIN, "x", 1) < 0)
            bump(&w->bad);
        wait_close(w, st); /* the front's ABORT PROTOCOL */
        return;
    }
    uint8_t head[512];
    shmipc_serve_field fields[2] = {
        {(const uint8_t *)"X-Worker", (const uint8_t *)w->name, 8, (uint32_t)strlen(w->name)},
        {(const uint8_t *)"Sec-WebSocket-Protocol", (const uint8_t *)"chat", 22, 4},
    };
    if (strstr(target, "ext")) /* an extension the front does not speak */
        fields[1] = (shmipc_serve_field){(const uint8_t *)"Sec-WebSocket-Extensions",
                                         (const uint8_t *)"permessage-deflate", 24, 18};
    shmipc_serve_response r = {.size = sizeof r, .status = 101};
    int64_t hn = shmipc_serve_encode_response_head(
        head, sizeof head, &r, fields, strstr(target, "proto") || strstr(target, "ext") ? 2 : 1);
    if (hn <= 0 || shmipc_stream_write(st, head, (size_t)hn) < 0 ||
        wsend(st, SHMIPC_SERVE_END, 0, NULL, 0) < 0) {
        bump(&w->bad);
        count_out(w, &out);
        return;
    }
    if (strncmp(target, "/ws/script/", 11) == 0) { /* a hostile worker's frames, in order */
        wscript(w, st, target + 11, &out);
        count_out(w, &out);
        return;
    }
    size_t cap = 1 << 16, len = 0;
    uint8_t *msg = malloc(cap);
    unsigned op = 0;
    for (;;) {
        uint8_t *b;
        size_t n;
        shmipc_serve_frame f;
        if (read_frame(st, &b, &n, &f) < 0)
            break; /* the stream or the session ended */
        if (f.type == SHMIPC_SERVE_WS_DATA) {
            unsigned fop = f.arg & 0xff;
            if ((fop == SHMIPC_SERVE_WS_CONT) != (op != 0) || f.length > SHMIPC_SERVE_MAX_CHUNK)
                bump(&w->bad);
            if (fop != SHMIPC_SERVE_WS_CONT)
                op = fop;
            while (len + f.length > cap)
                msg = realloc(msg, cap *= 2);
            memcpy(msg + len, f.payload, f.length);
            len += f.length;
            free(b);
            if (f.arg & SHMIPC_SERVE_WS_FIN) {
                bump(&w_messages);
                int over = wcommand(w, st, op, msg, len, &out);
                len = 0;
                op = 0;
                if (over)
                    break;
            }
            continue;
        }
        free(b);
        if (f.type == SHMIPC_SERVE_WS_CLOSE) { /* the client's: echoed */
            unsigned code = f.close_code;
            atomic_store(&w_close_code, code ? code : 1005);
            /* The front closes the stream once it has this echo: a flush may find it closed. */
            count_out(w, &out);
            int wrc = wclose(st, code, NULL);
            if (wrc < 0 && wrc != SHMIPC_EEOF)
                bump(&w->bad);
            bump(&w_closes); /* after the write: a case that waited for it may stop the front */
            break;
        }
        if (f.type == SHMIPC_SERVE_ABORT) {
            bump(&w->aborts[f.arg & 7]);
            break;
        }
        if (f.type != SHMIPC_SERVE_WS_PING && f.type != SHMIPC_SERVE_WS_PONG) {
            bump(&w->bad);
            break;
        }
    }
    free(msg);
    count_out(w, &out);
}

/* ---- the client ---- */

struct wsc {
    int fd;
    char head[2048];
};

/* Connects and sends the handshake for `target` (with `extra` fields); reads the response
 * head (and, for a refusal, nothing more). Returns the status, or -1 (client threads). */
static int wsc_open_rcvbuf(struct wsc *c, int port, const char *target, const char *extra,
                           int rcvbuf)
{
    char req[1024];
    struct timeval tv = {WAIT_MS / 1000, 0};
    size_t n = 0;
    c->fd = tcp_connect_rcvbuf(port, rcvbuf);
    if (c->fd < 0)
        return -1;
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int k = snprintf(req, sizeof req,
                     "GET %s HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                     "%s\r\n",
                     target, extra ? extra : "");
    if (send_all_try(c->fd, req, (size_t)k) < 0)
        return -1;
    while (n < sizeof c->head - 1) { /* byte by byte: frames may follow the head */
        if (read(c->fd, c->head + n, 1) != 1)
            return -1;
        n++;
        if (n >= 4 && memcmp(c->head + n - 4, "\r\n\r\n", 4) == 0)
            break;
    }
    c->head[n] = '\0';
    int status = 0;
    if (sscanf(c->head, "HTTP/1.1 %d", &status) != 1)
        return -1;
    return status;
}

/* As wsc_open_rcvbuf, with the default receive buffer. */
static int wsc_open_try(struct wsc *c, int port, const char *target, const char *extra)
{
    return wsc_open_rcvbuf(c, port, target, extra, 0);
}

static void wsc_open(struct wsc *c, int port, const char *target, const char *extra)
{
    assert_int_equal(wsc_open_try(c, port, target, extra), 101);
}

/* A masked client frame with FIN `fin`. */
static int wsc_send_try(struct wsc *c, unsigned op, int fin, const void *data, size_t len)
{
    static const uint8_t key[4] = {0x5a, 0x13, 0xc7, 0x08};
    uint8_t h[14];
    size_t hn = 0;
    h[hn++] = (uint8_t)((fin ? 0x80 : 0) | op);
    if (len < 126) {
        h[hn++] = (uint8_t)(0x80 | len);
    } else if (len <= 0xffff) {
        h[hn++] = 0x80 | 126;
        h[hn++] = (uint8_t)(len >> 8);
        h[hn++] = (uint8_t)len;
    } else {
        h[hn++] = 0x80 | 127;
        for (int i = 7; i >= 0; i--)
            h[hn++] = (uint8_t)((uint64_t)len >> (8 * i));
    }
    memcpy(h + hn, key, 4);
    hn += 4;
    uint8_t *buf = malloc(hn + len);
    memcpy(buf, h, hn);
    for (size_t i = 0; i < len; i++)
        buf[hn + i] = ((const uint8_t *)data)[i] ^ key[i & 3];
    int rc = send_all_try(c->fd, buf, hn + len);
    free(buf);
    return rc;
}

static void wsc_send(struct wsc *c, unsigned op, int fin, const void *data, size_t len)
{
    assert_int_equal(wsc_send_try(c, op, fin, data, len), 0);
}

static int read_full(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)p + got, n - got);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

/* One server frame: its first byte (FIN and opcode), or -1 (closed, or a masked frame). */
static int wsc_recv_try(struct wsc *c, uint8_t **payload, size_t *len)
{
    uint8_t h[2], ext[8];
    uint64_t n;
    *payload = NULL;
    if (read_full(c->fd, h, 2) < 0 || (h[1] & 0x80))
        return -1;
    n = h[1] & 0x7f;
    if (n == 126) {
        if (read_full(c->fd, ext, 2) < 0)
            return -1;
        n = (uint64_t)ext[0] << 8 | ext[1];
    } else if (n == 127) {
        if (read_full(c->fd, ext, 8) < 0)
            return -1;
        n = 0;
        for (int i = 0; i < 8; i++)
            n = n << 8 | ext[i];
    }
    *payload = malloc(n + 1);
    if (read_full(c->fd, *payload, (size_t)n) < 0) {
        free(*payload);
        *payload = NULL;
        return -1;
    }
    (*payload)[n] = 0;
    *len = (size_t)n;
    return h[0];
}

/* Expects one frame `first` with exactly data[0..len). */
static void wsc_expect(struct wsc *c, int first, const void *data, size_t len)
{
    uint8_t *p;
    size_t n = 0;
    int b = wsc_recv_try(c, &p, &n);
    assert_int_equal(b, first);
    assert_int_equal(n, len);
    assert_memory_equal(p, data, len);
    free(p);
}

/* Expects a close frame with `code` and returns its reason (malloc'd). */
static char *wsc_expect_close(struct wsc *c, unsigned code)
{
    uint8_t *p;
    size_t n = 0;
    int b = wsc_recv_try(c, &p, &n);
    assert_int_equal(b, 0x88);
    assert_true(n >= 2);
    assert_int_equal((unsigned)(p[0] << 8 | p[1]), code);
    memmove(p, p + 2, n - 2);
    p[n - 2] = 0;
    return (char *)p;
}

/* After the close handshake the server closes the connection. */
static void wsc_expect_eof(struct wsc *c)
{
    char b;
    assert_int_equal(read(c->fd, &b, 1), 0);
}

/* A case starts with the worker's counts at 0: a case that waits for w_closes must not be
 * answered by the one before it (its front stopped under a worker still writing). */
static void ws_fresh(void)
{
    front_ws_serve = ws_worker;
    atomic_store(&w_close_code, 0);
    atomic_store(&w_closes, 0);
    atomic_store(&w_upgrades, 0);
    atomic_store(&w_messages, 0);
}

static void start_opts(struct tc *t, unsigned nworkers, unsigned threads,
                       const struct shmipc__front_opts *o)
{
    struct appw *ws[2];
    char name[8];
    ws_fresh();
    for (unsigned i = 0; i < nworkers; i++) {
        snprintf(name, sizeof name, "w%u", i);
        appw_start(&t->w[i], name, NULL);
        ws[i] = &t->w[i];
    }
    fx_start(&t->x, ws, nworkers, threads, o);
    for (unsigned i = 0; i < nworkers; i++)
        assert_true(wait_sessions(&t->x, t->w[i].addr, threads));
}

static void start1(struct tc *t, unsigned nworkers, unsigned threads)
{
    start_opts(t, nworkers, threads, NULL);
}

/* The worker is free again: a plain request goes through it. */
static void plain_after(struct tc *t)
{
    struct resp p;
    assert_int_equal(request(t->x.port, "GET", "/after", NULL, &p), 200);
    assert_string_equal(p.body, "/after:");
    resp_free(&p);
}

/* ---- cases ---- */

/*
 * The handshake through the worker (the server's accept key, the worker's subprotocol and
 * field), then text, binary, a fragmented client message (one WS_DATA message for the
 * worker), a 3 MiB message (4 WS_DATA frames to the worker, 48 back, one message to the
 * client), the client's ping answered by the front, the client's close 1000 echoed and passed
 * on, and the worker free for the next request.
 */
static void ws_echo(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    start1(t, 1, 1);
    wsc_open(&c, t->x.port, "/ws/proto", "Sec-WebSocket-Protocol: x, chat\r\n");
    assert_non_null(strstr(c.head, "\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"));
    assert_non_null(strstr(c.head, "\r\nSec-WebSocket-Protocol: chat\r\n"));
    assert_non_null(strstr(c.head, "\r\nX-Worker: w0\r\n"));
    assert_non_null(strstr(c.head, "\r\nUpgrade: websocket\r\n"));
    wsc_send(&c, 0x1, 1, "hello", 5);
    wsc_expect(&c, 0x81, "hello", 5);
    uint8_t bin[1000];
    for (size_t i = 0; i < sizeof bin; i++)
        bin[i] = (uint8_t)(i * 31 + 7);
    wsc_send(&c, 0x2, 1, bin, sizeof bin);
    wsc_expect(&c, 0x82, bin, sizeof bin);
    wsc_send(&c, 0x1, 0, "frag-", 5);
    wsc_send(&c, 0x0, 0, "men", 3);
    wsc_send(&c, 0x0, 1, "t", 1);
    wsc_expect(&c, 0x81, "frag-ment", 9);
    size_t big_len = (3u << 20) + 5;
    uint8_t *big = malloc(big_len);
    for (size_t i = 0; i < big_len; i++)
        big[i] = gen_byte(7, i);
    wsc_send(&c, 0x2, 1, big, big_len);
    wsc_expect(&c, 0x82, big, big_len);
    free(big);
    wsc_send(&c, 0x9, 1, "pp", 2);
    wsc_expect(&c, 0x8A, "pp", 2);
    wsc_send(&c, 0x8, 1,
             "\x03\xe8"
             "done",
             6);
    free(wsc_expect_close(&c, 1000));
    wsc_expect_eof(&c);
    close(c.fd);
    assert_true(wait_for(&w_closes, 1, WAIT_MS));
    assert_int_equal(atomic_load(&w_close_code), 1000);
    plain_after(t);
    assert_int_equal(atomic_load(&t->w[0].bad), 0);
}

/* The worker's 403: a normal response with its body, Connection: close. */
static void ws_refused_403(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    struct rd *r = malloc(sizeof *r);
    start1(t, 1, 1);
    assert_int_equal(wsc_open_try(&c, t->x.port, "/ws/refuse", NULL), 403);
    assert_non_null(strstr(c.head, "\r\nConnection: close\r\n"));
    assert_null(strstr(c.head, "Sec-WebSocket-Accept"));
    char body[5] = "";
    assert_int_equal(read_full(c.fd, body, 4), 0);
    assert_string_equal(body, "nope");
    wsc_expect_eof(&c);
    close(c.fd);
    free(r);
    assert_int_equal(atomic_load(&w_upgrades), 1);
    plain_after(t);
    /* A handshake the front finds invalid never reaches a worker: its 426. */
    rd_open(r = malloc(sizeof *r), t->x.port);
    static const char bad[] =
        "GET /ws/x HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 7\r\n\r\n";
    struct resp p;
    send_all(r->fd, bad, strlen(bad));
    read_resp(r, &p);
    assert_int_equal(p.status, 426);
    resp_free(&p);
    close(r->fd);
    free(r);
    assert_int_equal(atomic_load(&w_upgrades), 1);
}

/* The worker closes first with 4001 and a reason: the client sees both and answers; the
 * worker gets the answer's code; the connection ends. */
static void ws_worker_closes_4001(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    start1(t, 1, 1);
    wsc_open(&c, t->x.port, "/ws/a", NULL);
    const char *cmd = "close:4001:bye";
    wsc_send(&c, 0x1, 1, cmd, strlen(cmd));
    char *reason = wsc_expect_close(&c, 4001);
    assert_string_equal(reason, "bye");
    free(reason);
    wsc_send(&c, 0x8, 1, "\x0f\xa1", 2);
    wsc_expect_eof(&c);
    close(c.fd);
    assert_true(wait_for(&w_closes, 1, WAIT_MS));
    assert_int_equal(atomic_load(&w_close_code), 4001);
    plain_after(t);
}

/* Pings: the client's answered by the front; the worker's WS_PING pings the client, its
 * WS_PONG is an unsolicited pong. */
static void ws_pings(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    start1(t, 1, 1);
    wsc_open(&c, t->x.port, "/ws/a", NULL);
    wsc_send(&c, 0x9, 1, "c1", 2);
    wsc_expect(&c, 0x8A, "c1", 2);
    wsc_send(&c, 0x1, 1, "ping:hi", 7);
    wsc_expect(&c, 0x89, "hi", 2);
    wsc_send(&c, 0xA, 1, "hi", 2); /* the client's pong: the front takes it */
    wsc_send(&c, 0x1, 1, "pong:yo", 7);
    wsc_expect(&c, 0x8A, "yo", 2);
    wsc_send(&c, 0x1, 1, "still", 5);
    wsc_expect(&c, 0x81, "still", 5);
    wsc_send(&c, 0x8, 1, NULL, 0); /* no code: 1005 to the worker */
    free(wsc_expect_close(&c, 1000));
    wsc_expect_eof(&c);
    close(c.fd);
    assert_true(wait_for(&w_closes, 1, WAIT_MS));
    assert_int_equal(atomic_load(&w_close_code), 1005);
}

/* The worker's session ends (the process died), or it sends ABORT: the client gets 1011. */
static void ws_worker_dies_1011(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    start1(t, 1, 1);
    wsc_open(&c, t->x.port, "/ws/a", NULL);
    wsc_send(&c, 0x1, 1, "abort", 5);
    free(wsc_expect_close(&c, 1011));
    wsc_send(&c, 0x8, 1, "\x03\xf3", 2);
    wsc_expect_eof(&c);
    close(c.fd);
    plain_after(t);
    wsc_open(&c, t->x.port, "/ws/a", NULL);
    wsc_send(&c, 0x1, 1, "die", 3);
    free(wsc_expect_close(&c, 1011));
    close(c.fd);
}

/* A bad frame from the worker after the 101 (text that is not UTF-8): the client gets 1011,
 * the worker ABORT PROTOCOL, and the worker is free after it. */
static void ws_worker_bad_frame_1011(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    start1(t, 1, 1);
    wsc_open(&c, t->x.port, "/ws/a", NULL);
    wsc_send(&c, 0x1, 1, "badtext", 7);
    free(wsc_expect_close(&c, 1011));
    close(c.fd);
    assert_true(wait_for(&t->w[0].aborts[SHMIPC_SERVE_ABORT_PROTOCOL], 1, WAIT_MS));
    plain_after(t);
}

/*
 * Starts the front (its sessions' queue of capacity 1) and one worker, opens a WebSocket and
 * tells the worker to read nothing for stall_ms: the client's messages behind that wait in
 * the front.
 */
static void open_stalled_queue_of_one(struct tc *t, int stall_ms, struct wsc *c)
{
    shmipc_config *ipc;
    char cmd[32];
    CHECK(shmipc_config_new(&ipc));
    CHECK(shmipc_config_set_queue_capacity(ipc, 1));
    struct shmipc__front_opts o = {.ipc = ipc};
    start_opts(t, 1, 1, &o);
    shmipc_config_free(ipc);
    wsc_open(c, t->x.port, "/ws/a", NULL);
    snprintf(cmd, sizeof cmd, "stall:%d", stall_ms);
    wsc_send(c, 0x1, 1, cmd, strlen(cmd));
}

/*
 * The session's queue to the worker is full (capacity 1, the worker reading nothing for
 * 400 ms): the client's messages wait in the front and its input is held, the loop serves
 * others meanwhile, and once the worker reads again every message arrives, in order.
 */
static void ws_session_full_holds_client(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    struct resp p;
    open_stalled_queue_of_one(t, 400, &c);
    char msg[64];
    for (int i = 0; i < 40; i++) {
        snprintf(msg, sizeof msg, "m%d-%0*d", i, 20 + i, i);
        wsc_send(&c, 0x1, 1, msg, strlen(msg));
    }
    assert_int_equal(request(t->x.port, "GET", "/static", NULL, &p), 200); /* not blocked */
    resp_free(&p);
    for (int i = 0; i < 40; i++) {
        snprintf(msg, sizeof msg, "m%d-%0*d", i, 20 + i, i);
        wsc_expect(&c, 0x81, msg, strlen(msg));
    }
    wsc_send(&c, 0x8, 1, "\x03\xe8", 2);
    free(wsc_expect_close(&c, 1000));
    close(c.fd);
    assert_true(wait_for(&w_closes, 1, WAIT_MS));
    assert_int_equal(atomic_load(&t->w[0].bad), 0);
}

/* The memory-full cases: FILL_N binary messages of FILL_LEN bytes, more than the 1 MiB. */
enum { FILL_N = 24, FILL_LEN = 60000 };

/*
 * Starts the front (options `o`, its sessions' memory the least there is) and one worker
 * (with `beside`, granting TAKEN and 4 at once: a request beside the WebSocket), opens a
 * WebSocket, tells the worker to read nothing for stall_ms and sends the FILL_N messages.
 * Returns when the stall was asked (mono_ms).
 */
static uint64_t fill_memory_behind_a_stall(struct tc *t, struct shmipc__front_opts *o, int beside,
                                           int stall_ms, struct wsc *c)
{
    shmipc_config *ipc;
    struct appw *ws[] = {&t->w[0]};
    static char msg[FILL_LEN];
    char cmd[32];
    ws_fresh();
    CHECK(shmipc_config_new(&ipc));
    CHECK(shmipc_config_set_buffer_capacity(ipc, SHMIPC_MIN_BUFFER_CAPACITY));
    o->ipc = ipc;
    appw_start(&t->w[0], "w0", NULL);
    if (beside) {
        atomic_store(&t->w[0].taken, TAKEN_GRANT);
        atomic_store(&t->w[0].conc, 4);
    }
    fx_start(&t->x, ws, 1, 1, o);
    shmipc_config_free(ipc);
    assert_true(wait_sessions(&t->x, t->w[0].addr, 1));
    wsc_open(c, t->x.port, "/ws/a", NULL);
    snprintf(cmd, sizeof cmd, "stall:%d", stall_ms);
    wsc_send(c, 0x1, 1, cmd, strlen(cmd));
    uint64_t t0 = mono_ms();
    for (int i = 0; i < FILL_N; i++) {
        memset(msg, 'a' + i, sizeof msg);
        wsc_send(c, 0x2, 1, msg, sizeof msg);
    }
    return t0;
}

/*
 * The session's shared memory is full (1 MiB of it, the worker reading nothing for 3 s while
 * the client sends 24 messages of 60000 bytes): the client's messages wait in the front, its
 * input held, and nothing goes over the session's socket. Before, a message that found no
 * slice went over the socket and shmipc refused the session's new streams (the session was
 * replaced: replaced 1 != 0 below); with a worker process reading nothing at all, its socket
 * would fill and the front's write block the reactor thread (this harness's worker still
 * reads its socket, so the bound on the request the thread serves itself is a guard, not what
 * fails before). Here that request is answered at once, one to the stalled worker once it
 * reads, every message comes back in order, and no session was replaced.
 */
static void ws_session_memory_full_holds_client(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    struct resp p;
    enum { STALL_MS = 3000 };
    static char msg[FILL_LEN];
    static struct shmipc__front_stats st;
    struct shmipc__front_opts o = {.hello = 1};
    (void)fill_memory_behind_a_stall(t, &o, 1, STALL_MS, &c);
    uint64_t t1 = mono_ms();
    assert_int_equal(request(t->x.port, "GET", "/static", NULL, &p), 200);
    resp_free(&p);
    uint64_t took = mono_ms() - t1;
    if (took >= STALL_MS / 2)
        fail_msg("a request on the reactor thread took %llu ms behind a stalled worker",
                 (unsigned long long)took);
    assert_int_equal(request(t->x.port, "GET", "/beside", NULL, &p), 200);
    assert_string_equal(p.body, "/beside:");
    resp_free(&p);
    for (int i = 0; i < FILL_N; i++) {
        memset(msg, 'a' + i, sizeof msg);
        wsc_expect(&c, 0x82, msg, sizeof msg);
    }
    wsc_send(&c, 0x8, 1, "\x03\xe8", 2);
    free(wsc_expect_close(&c, 1000));
    close(c.fd);
    assert_true(wait_for(&w_closes, 1, WAIT_MS));
    assert_int_equal(atomic_load(&t->w[0].bad), 0);
    CHECK(shmipc__front_stats(t->x.f, &st));
    assert_int_equal(st.replaced, 0);
}

/*
 * As above, but the worker takes nothing for longer than the request deadline (1 s; it
 * stalls 4 s): the front gives up as nginx's proxy_send_timeout does. The client gets 1011,
 * the worker ABORT TIMEOUT behind the frames it had; a request beside is served meanwhile.
 * Before, the client was held for as long as the worker read nothing, retried every 1 ms.
 */
static void ws_worker_taking_nothing_for_a_deadline_is_1011(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    struct resp p;
    enum { STALL_MS = 4000, DEADLINE_MS = 1000 };
    static struct shmipc__front_stats st;
    struct shmipc__front_opts o = {.deadline_ms = DEADLINE_MS};
    uint64_t t0 = fill_memory_behind_a_stall(t, &o, 0, STALL_MS, &c);
    assert_int_equal(request(t->x.port, "GET", "/static", NULL, &p), 200);
    resp_free(&p);
    free(wsc_expect_close(&c, 1011));
    uint64_t took = mono_ms() - t0;
    if (took >= STALL_MS)
        fail_msg("the 1011 came after %llu ms, not before the worker read again",
                 (unsigned long long)took);
    close(c.fd);
    assert_true(wait_for(&t->w[0].aborts[SHMIPC_SERVE_ABORT_TIMEOUT], 1, WAIT_MS));
    CHECK(shmipc__front_stats(t->x.f, &st));
    assert_true(st.timeouts >= 1);
    assert_int_equal(st.replaced, 0);
    assert_int_equal(atomic_load(&t->w[0].bad), 0);
}

static void *stop_main(void *arg)
{
    fx_stop(arg);
    return NULL;
}

/* The server (then the front) is freed with two sockets open, one client answering the
 * server's going-away close and one silent: both get the close frame 1001, nothing crashes or
 * leaks (ASan), and both workers hear of it (a WS_CLOSE, or ABORT CLIENT_GONE). */
static void ws_close_with_sockets_open(void **state)
{
    struct tc *t = *state;
    struct wsc a, b;
    start1(t, 2, 1);
    wsc_open(&a, t->x.port, "/ws/a", NULL);
    wsc_open(&b, t->x.port, "/ws/b", NULL);
    wsc_send(&a, 0x1, 1, "x", 1);
    wsc_expect(&a, 0x81, "x", 1);
    wsc_send(&b, 0x1, 1, "y", 1);
    wsc_expect(&b, 0x81, "y", 1);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, stop_main, &t->x), 0);
    free(wsc_expect_close(&a, 1001));
    wsc_send(&a, 0x8, 1, "\x03\xe9", 2);
    free(wsc_expect_close(&b, 1001)); /* b never answers: the stop timeout closes it */
    pthread_join(th, NULL);
    close(a.fd);
    close(b.fd);
    int heard =
        atomic_load(&w_closes) + atomic_load(&t->w[0].aborts[1]) + atomic_load(&t->w[1].aborts[1]);
    assert_true(heard >= 1);
}

/* The access log has one line per WebSocket, at its end: the handshake's request line and 101
 * (a refusal is logged as its response is). */
static void ws_access_log_line(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    struct shmipc__access_log *log;
    char path[96], text[4096] = "";
    snprintf(path, sizeof path, "/tmp/shmipc-front-ws-log-%d.log", (int)getpid());
    unlink(path);
    CHECK(shmipc__access_log_open(path, SHMIPC__ACCESS_COMMON, &log));
    struct shmipc__front_opts o = {.access_log = log};
    start_opts(t, 1, 1, &o);
    wsc_open(&c, t->x.port, "/ws/logged", NULL);
    wsc_send(&c, 0x1, 1, "x", 1);
    wsc_expect(&c, 0x81, "x", 1);
    wsc_send(&c, 0x8, 1, "\x03\xe8", 2);
    free(wsc_expect_close(&c, 1000));
    close(c.fd);
    assert_int_equal(wsc_open_try(&c, t->x.port, "/ws/refuse", NULL), 403);
    close(c.fd);
    assert_true(wait_for(&w_closes, 1, WAIT_MS));
    fx_stop(&t->x); /* the lines are written out */
    shmipc__access_log_free(log);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    unlink(path);
    text[n] = '\0';
    assert_non_null(strstr(text, "\"GET /ws/logged HTTP/1.1\" 101 0"));
    assert_non_null(strstr(text, "\"GET /ws/refuse HTTP/1.1\" 403 4"));
}

/* Sends the handshake for `target` and, in the same write, the client frames `tail[0..n)`
 * (masked as wsc_send masks them); reads the response head as wsc_open_try does. */
static int wsc_open_with(struct wsc *c, int port, const char *target, const uint8_t *tail,
                         size_t tn)
{
    char req[1024 + 256];
    struct timeval tv = {WAIT_MS / 1000, 0};
    size_t n = 0;
    c->fd = tcp_connect_try(port);
    if (c->fd < 0)
        return -1;
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int k = snprintf(req, 1024,
                     "GET %s HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                     "\r\n",
                     target);
    if (tn > 256)
        return -1;
    memcpy(req + k, tail, tn);
    if (send_all_try(c->fd, req, (size_t)k + tn) < 0)
        return -1;
    while (n < sizeof c->head - 1) {
        if (read(c->fd, c->head + n, 1) != 1)
            return -1;
        n++;
        if (n >= 4 && memcmp(c->head + n - 4, "\r\n\r\n", 4) == 0)
            break;
    }
    c->head[n] = '\0';
    int status = 0;
    if (sscanf(c->head, "HTTP/1.1 %d", &status) != 1)
        return -1;
    return status;
}

/* A masked client frame (payload < 126 bytes) into out: its length. */
static size_t mask_frame(uint8_t *out, unsigned op, const void *data, size_t len)
{
    static const uint8_t key[4] = {0x11, 0x22, 0x33, 0x44};
    out[0] = (uint8_t)(0x80 | op);
    out[1] = (uint8_t)(0x80 | len);
    memcpy(out + 2, key, 4);
    for (size_t i = 0; i < len; i++)
        out[6 + i] = ((const uint8_t *)data)[i] ^ key[i & 3];
    return 6 + len;
}

/*
 * The client's first messages in the same write as its handshake (the bytes behind the head
 * reach the server's WebSocket inside the front's accept of the worker's 101): they reach the
 * worker in order and their echoes come back; none is lost.
 */
static void ws_message_with_handshake_not_lost(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    uint8_t tail[64];
    start1(t, 1, 1);
    size_t tn = mask_frame(tail, 0x1, "early", 5);
    tn += mask_frame(tail + tn, 0x2, "two", 3);
    assert_int_equal(wsc_open_with(&c, t->x.port, "/ws/a", tail, tn), 101);
    wsc_expect(&c, 0x81, "early", 5);
    wsc_expect(&c, 0x82, "two", 3);
    wsc_send(&c, 0x1, 1, "later", 5);
    wsc_expect(&c, 0x81, "later", 5);
    wsc_send(&c, 0x8, 1, "\x03\xe8", 2);
    free(wsc_expect_close(&c, 1000));
    wsc_expect_eof(&c);
    close(c.fd);
    assert_true(wait_for(&w_closes, 1, WAIT_MS));
    plain_after(t);
    assert_int_equal(atomic_load(&t->w[0].bad), 0);
}

/*
 * The client's close in the same write as its handshake: the worker gets that close (WS_CLOSE
 * 1000), its answer goes to the client, the connection ends and the worker is free; the
 * WebSocket does not stay open for the worker with nobody behind it.
 */
static void ws_close_with_handshake_reaches_worker(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    uint8_t tail[64];
    start1(t, 1, 1);
    size_t tn = mask_frame(tail, 0x8, "\x03\xe8", 2);
    assert_int_equal(wsc_open_with(&c, t->x.port, "/ws/a", tail, tn), 101);
    free(wsc_expect_close(&c, 1000));
    wsc_expect_eof(&c);
    close(c.fd);
    assert_true(wait_for(&w_closes, 1, WAIT_MS));
    assert_int_equal(atomic_load(&w_close_code), 1000);
    plain_after(t);
    assert_int_equal(atomic_load(&t->w[0].bad), 0);
}

/*
 * An unmasked frame (a protocol error) right behind the handshake: the server fails the
 * connection with 1002 from inside the front's accept; the worker is told (WS_CLOSE 1002)
 * and is free after it.
 */
static void ws_bad_frame_with_handshake_reaches_worker(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    const uint8_t tail[] = {0x81, 0x02, 'h', 'i'}; /* not masked */
    start1(t, 1, 1);
    assert_int_equal(wsc_open_with(&c, t->x.port, "/ws/a", tail, sizeof tail), 101);
    free(wsc_expect_close(&c, 1002));
    close(c.fd);
    assert_true(wait_for(&w_closes, 1, WAIT_MS));
    assert_int_equal(atomic_load(&w_close_code), 1002);
    plain_after(t);
    assert_int_equal(atomic_load(&t->w[0].bad), 0);
}

/*
 * The worker's 101 names an extension (permessage-deflate) the front's WebSocket does not
 * implement: the client must not be told it was negotiated (it would compress its frames, and
 * expect compressed ones); the field is dropped and uncompressed messages go both ways.
 */
static void ws_worker_extension_not_passed(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    start1(t, 1, 1);
    wsc_open(&c, t->x.port, "/ws/ext", "Sec-WebSocket-Extensions: permessage-deflate\r\n");
    assert_null(strcasestr(c.head, "Sec-WebSocket-Extensions"));
    assert_non_null(strstr(c.head, "\r\nX-Worker: w0\r\n"));
    wsc_send(&c, 0x1, 1, "plain", 5);
    wsc_expect(&c, 0x81, "plain", 5);
    wsc_send(&c, 0x8, 1, "\x03\xe8", 2);
    free(wsc_expect_close(&c, 1000));
    wsc_expect_eof(&c);
    close(c.fd);
    assert_true(wait_for(&w_closes, 1, WAIT_MS));
    plain_after(t);
    assert_int_equal(atomic_load(&t->w[0].bad), 0);
}

/*
 * The client's FIN right behind its handshake (it is gone before the worker's 101 comes
 * back): the worker is told (ABORT CLIENT_GONE, or the close), it does not keep a WebSocket
 * nobody is behind, and it is free after it.
 */
static void ws_fin_with_handshake_frees_worker(void **state)
{
    struct tc *t = *state;
    start1(t, 1, 1);
    for (int i = 0; i < 3; i++) {
        struct wsc c;
        char req[512];
        c.fd = tcp_connect(t->x.port);
        int k = snprintf(req, sizeof req,
                         "GET /ws/a HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\n"
                         "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                         "Sec-WebSocket-Version: 13\r\n\r\n");
        assert_int_equal(send_all_try(c.fd, req, (size_t)k), 0);
        shutdown(c.fd, SHUT_WR);
        int want = i + 1;
        long deadline = WAIT_MS;
        while (atomic_load(&t->w[0].aborts[SHMIPC_SERVE_ABORT_CLIENT_GONE]) +
                       atomic_load(&w_closes) <
                   want &&
               deadline-- > 0)
            sleep_ms(1);
        assert_true(atomic_load(&t->w[0].aborts[SHMIPC_SERVE_ABORT_CLIENT_GONE]) +
                        atomic_load(&w_closes) >=
                    want);
        close(c.fd);
        plain_after(t);
    }
    assert_int_equal(atomic_load(&t->w[0].bad), 0);
}

/* The worker's WS_DATA before any 101: 502 to the client (no 101), ABORT PROTOCOL to the
 * worker, which is free after it. */
static void ws_worker_data_before_101(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    start1(t, 1, 1);
    assert_int_equal(wsc_open_try(&c, t->x.port, "/ws/early", NULL), 502);
    close(c.fd);
    assert_true(wait_for(&t->w[0].aborts[SHMIPC_SERVE_ABORT_PROTOCOL], 1, WAIT_MS));
    plain_after(t);
    assert_int_equal(atomic_load(&t->w[0].bad), 0);
}

/* The client leaves (FIN, then a reset): the worker gets ABORT CLIENT_GONE and is free. */
static void ws_client_drops(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    start1(t, 1, 1);
    for (int reset = 0; reset < 2; reset++) {
        wsc_open(&c, t->x.port, "/ws/a", NULL);
        wsc_send(&c, 0x1, 1, "x", 1);
        wsc_expect(&c, 0x81, "x", 1);
        if (reset) {
            struct linger lg = {1, 0};
            setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        }
        close(c.fd);
        assert_true(wait_for(&t->w[0].aborts[SHMIPC_SERVE_ABORT_CLIENT_GONE], reset + 1, WAIT_MS));
        plain_after(t);
    }
    assert_int_equal(atomic_load(&w_closes), 0);
}

/*
 * A slow client: the worker sends 48 messages of 128 KiB at once, the client reads nothing
 * for 300 ms, then all of them, each intact. What the front queued on the connection stayed
 * under the mark plus one message (the server's ws_tx_max), so the rest waited in the
 * worker's stream, not in the front.
 */
static void ws_slow_client_bounded(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    struct shmipc__server_stats st;
    const unsigned n = 128u << 10, k = 48;
    start1(t, 1, 1);
    wsc_open(&c, t->x.port, "/ws/a", NULL);
    int rcvbuf = 16384;
    setsockopt(c.fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    char cmd[32];
    snprintf(cmd, sizeof cmd, "flood:%u:%u", n, k);
    wsc_send(&c, 0x1, 1, cmd, strlen(cmd));
    sleep_ms(300);
    for (unsigned i = 0; i < k; i++) {
        uint8_t *p;
        size_t len = 0;
        assert_int_equal(wsc_recv_try(&c, &p, &len), 0x82);
        assert_int_equal(len, n);
        for (size_t j = 0; j < len; j += 4099)
            assert_int_equal(p[j], i & 0xff);
        free(p);
    }
    wsc_send(&c, 0x8, 1, "\x03\xe8", 2);
    free(wsc_expect_close(&c, 1000));
    close(c.fd);
    assert_true(wait_for(&w_closes, 1, WAIT_MS));
    /* The server's counters are summed when it shuts down. */
    CHECK(shmipc_server_stop(t->x.srv));
    CHECK(shmipc_server_run(t->x.srv));
    shmipc__server_stats(t->x.srv, &st);
    assert_int_equal(st.ws_upgrades, 1);
    assert_true(st.ws_tx_max > 0);
    assert_true(st.ws_tx_max <= (256u << 10) + n + 64);
}

/*
 * What the worker sent before its session ended (a message and its close 4000, then the
 * process exits) reaches the client, as a finished HTTP response does (fs_down reads the
 * requests' frames first): before, the front took the session down without reading them, and
 * the client got 1011 and never the message. The reactor thread is held meanwhile (a 500 ms
 * route), so the frames and the session's end come in one turn of the loop.
 */
static void ws_worker_frames_before_its_end_reach_client(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    struct resp p;
    start1(t, 1, 1);
    wsc_open(&c, t->x.port, "/ws/script/STCK", NULL);
    assert_int_equal(request(t->x.port, "GET", "/sleep500", NULL, &p), 200);
    resp_free(&p);
    wsc_expect(&c, 0x81, "t", 1);
    char *why = wsc_expect_close(&c, 4000);
    assert_string_equal(why, "bye");
    free(why);
    close(c.fd);
    assert_int_equal(atomic_load(&t->w[0].bad), 0);
}

/*
 * A server whose WebSocket send limit (64 KiB here) is below the front's mark (256 KiB): the
 * front read the worker's next message while the connection had less than the mark queued,
 * and the server refused it (SHMIPC_EAGAIN at the limit), so the message was lost without a
 * word (here all but the first ~220 of 800, the client then waiting for nothing). The
 * front's mark is the lower of the two now: 800 messages of 16 KiB (more than the sockets'
 * buffers hold) to a client that reads nothing for 500 ms all arrive, in order.
 */
static void ws_send_limit_below_the_mark_loses_nothing(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    const unsigned n = 16u << 10, k = 800;
    t->x.ws_send_limit = 64u << 10;
    start1(t, 1, 1);
    /* a small receive buffer, set before the connect (front_harness.h, tcp_connect_rcvbuf) */
    assert_int_equal(wsc_open_rcvbuf(&c, t->x.port, "/ws/a", NULL, 16384), 101);
    char cmd[32];
    snprintf(cmd, sizeof cmd, "flood:%u:%u", n, k);
    wsc_send(&c, 0x1, 1, cmd, strlen(cmd));
    sleep_ms(500);
    for (unsigned i = 0; i < k; i++) {
        uint8_t *p;
        size_t len = 0;
        assert_int_equal(wsc_recv_try(&c, &p, &len), 0x82);
        assert_int_equal(len, n);
        assert_int_equal(p[0], i & 0xff);
        assert_int_equal(p[n - 1], i & 0xff);
        free(p);
    }
    wsc_send(&c, 0x8, 1, "\x03\xe8", 2);
    free(wsc_expect_close(&c, 1000));
    close(c.fd);
    assert_true(wait_for(&w_closes, 1, WAIT_MS));
    assert_int_equal(atomic_load(&t->w[0].bad), 0);
}

/*
 * The client sends messages and its close while the worker reads nothing for 5.6 s (a session
 * queue of capacity 1: they wait in the front). The server answers the client's close at once;
 * the front waited 5 s for the worker's answer counted from that close, so it closed the
 * stream before its own WS_CLOSE (and the messages before it) ever reached the worker. Now
 * the wait starts when the close went: the worker gets all of them and the close 1000.
 */
static void ws_client_close_behind_held_messages_reaches_worker(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    open_stalled_queue_of_one(t, 5600, &c);
    for (int i = 0; i < 4; i++)
        wsc_send(&c, 0x1, 1, "last", 4);
    wsc_send(&c, 0x8, 1, "\x03\xe8", 2);
    free(wsc_expect_close(&c, 1000)); /* the server's answer, at once */
    close(c.fd);
    assert_true(wait_for(&w_closes, 1, WAIT_MS));
    assert_int_equal(atomic_load(&w_close_code), 1000);
    assert_int_equal(atomic_load(&t->w[0].aborts[SHMIPC_SERVE_ABORT_CLIENT_GONE]), 0);
    assert_int_equal(atomic_load(&t->w[0].bad), 0);
}

/*
 * The client's close frame (4001 "bye") with its TCP connection gone right behind it (RFC 6455
 * §7.1.5: the frame's code is the close's, 1006 only without one), while the front held the
 * client's input (the worker reads nothing for 1 s, a session queue of one: the client's
 * messages wait in the front): the worker gets the client's WS_CLOSE 4001 (behind the messages
 * that waited), with a FIN and with a reset. It got ABORT CLIENT_GONE: the server heard the
 * client leave while held and closed at once, 1006, without reading the frame behind the hold.
 */
static void close_then_gone_while_held(struct tc *t, int reset)
{
    struct wsc c;
    open_stalled_queue_of_one(t, 1000, &c);
    for (int i = 0; i < 4; i++)
        wsc_send(&c, 0x1, 1, "held", 4);
    sleep_ms(100);                             /* they wait in the front: its client is held */
    wsc_send(&c, 0x8, 1, "\x0f\xa1\x62ye", 5); /* 4001 "bye" */
    assert_int_equal(sock_wait_sent(c.fd, WAIT_MS), 0); /* it left: a reset drops the unsent */
    if (reset) {
        struct linger lg = {1, 0};
        setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    close(c.fd);
    assert_true(wait_for(&w_closes, 1, WAIT_MS));
    assert_int_equal(atomic_load(&w_close_code), 4001);
    assert_int_equal(atomic_load(&t->w[0].aborts[SHMIPC_SERVE_ABORT_CLIENT_GONE]), 0);
    assert_int_equal(atomic_load(&t->w[0].bad), 0);
}

static void ws_close_then_fin_while_held_reaches_worker(void **state)
{
    close_then_gone_while_held(*state, 0);
}

static void ws_close_then_reset_while_held_reaches_worker(void **state)
{
    close_then_gone_while_held(*state, 1);
}

/*
 * The same while the server does not read the client: the worker's 8 MiB message waits for a
 * client that reads one byte of it (a 16 KiB receive buffer), far above the high-water mark,
 * so the client's next message makes the server stop reading it (PAUSE). Then its close frame,
 * and close(): a reset, since the client leaves unread bytes. The worker gets WS_CLOSE 4001.
 * It got ABORT CLIENT_GONE: the server's send failed on the reset and it closed at once, the
 * close frame unread behind the pause.
 * The frame must have left the client before the reset, which drops what the client's kernel
 * still holds: Nagle held it behind the unacknowledged "x" when the server delayed its ACK, and
 * the worker rightly got CLIENT_GONE (1006). That, not the reactor, failed this case about once
 * in 60 runs on io_uring (SIOCOUTQNSD read 11 unsent bytes at the close in every failure).
 */
static void ws_close_then_reset_while_paused_reaches_worker(void **state)
{
    struct tc *t = *state;
    struct wsc c;
    struct shmipc__server_stats st;
    uint8_t one;
    start1(t, 1, 1);
    assert_int_equal(wsc_open_rcvbuf(&c, t->x.port, "/ws/a", NULL, 16384), 101);
    wsc_send(&c, 0x1, 1, "flood:8388608:1", 15);
    assert_int_equal(read(c.fd, &one, 1), 1); /* the message is on its way: queued */
    assert_int_equal(one, 0x82);
    /* Read while the queue is above the mark: PAUSE, at the end of the very call that passed
     * it on, so once the worker has it the server no longer reads the client. */
    wsc_send(&c, 0x1, 1, "x", 1);
    assert_true(wait_for(&w_messages, 2, WAIT_MS));
    wsc_send(&c, 0x8, 1, "\x0f\xa1\x62ye", 5);          /* 4001 "bye" */
    assert_int_equal(sock_wait_sent(c.fd, WAIT_MS), 0); /* it left: a reset drops the unsent */
    close(c.fd);
    assert_true(wait_for(&w_closes, 1, WAIT_MS));
    assert_int_equal(atomic_load(&w_close_code), 4001);
    assert_int_equal(atomic_load(&t->w[0].aborts[SHMIPC_SERVE_ABORT_CLIENT_GONE]), 0);
    assert_int_equal(atomic_load(&t->w[0].bad), 0);
    CHECK(shmipc_server_stop(t->x.srv));
    CHECK(shmipc_server_run(t->x.srv));
    shmipc__server_stats(t->x.srv, &st);
    assert_true(st.ws_pauses >= 1); /* the close frame did wait behind the pause */
}

/* ---- cross-talk ---- */

struct xws {
    int port, id;
    atomic_int *mism, *ok;
};

static void *xws_main(void *arg)
{
    struct xws *a = arg;
    struct wsc c;
    uint8_t *out = malloc(70000);
    int bad = 0;
    if (wsc_open_try(&c, a->port, "/ws/x", NULL) != 101) {
        bump(a->mism);
        free(out);
        return NULL;
    }
    for (int i = 0; i < 6 && !bad; i++) {
        size_t len = 16 + (size_t)((a->id * 7919 + i * 104729) % 69000);
        for (size_t j = 0; j < len; j++)
            out[j] = gen_byte((unsigned)(a->id * 100 + i), j);
        uint8_t *p = NULL;
        size_t n = 0;
        if (wsc_send_try(&c, 0x2, 1, out, len) < 0 || wsc_recv_try(&c, &p, &n) != 0x82) {
            free(p);
            bad = 1;
            break;
        }
        if (n != len || memcmp(p, out, len) != 0)
            bad = 1;
        free(p);
    }
    if (!bad) {
        uint8_t *p = NULL;
        size_t n;
        if (wsc_send_try(&c, 0x8, 1, "\x03\xe8", 2) < 0 || wsc_recv_try(&c, &p, &n) != 0x88)
            bad = 1;
        free(p);
    }
    close(c.fd);
    bump(bad ? a->mism : a->ok);
    free(out);
    return NULL;
}

/*
 * 32 connections over 2 workers and 2 reactor threads, 6 unique messages each (a WebSocket
 * holds its worker for its life: the others wait in the front's queue): every echo is the
 * connection's own, and no worker ever served two at once.
 */
static void ws_cross_talk(void **state)
{
    struct tc *t = *state;
    struct xws a[32];
    pthread_t th[32];
    start1(t, 2, 2);
    atomic_store(&t->mism, 0);
    atomic_store(&t->ok, 0);
    for (int i = 0; i < 32; i++) {
        a[i] = (struct xws){t->x.port, i, &t->mism, &t->ok};
        assert_int_equal(pthread_create(&th[i], NULL, xws_main, &a[i]), 0);
    }
    for (int i = 0; i < 32; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&t->mism), 0);
    assert_int_equal(atomic_load(&t->ok), 32);
    assert_true(wait_for(&w_closes, 32, WAIT_MS));
    for (int i = 0; i < 2; i++) {
        assert_int_equal(atomic_load(&t->w[i].bad), 0);
        assert_true(atomic_load(&t->w[i].max_concurrent) <= 1);
    }
}

#define T(f) cmocka_unit_test_setup_teardown(f, tc_setup, tc_teardown)
#define WS_TESTS                                                                                   \
    T(ws_echo), T(ws_refused_403), T(ws_worker_closes_4001), T(ws_pings), T(ws_worker_dies_1011),  \
        T(ws_client_drops), T(ws_slow_client_bounded), T(ws_cross_talk),                           \
        T(ws_worker_bad_frame_1011), T(ws_session_full_holds_client),                              \
        T(ws_session_memory_full_holds_client),                                                    \
        T(ws_worker_taking_nothing_for_a_deadline_is_1011), T(ws_close_with_sockets_open),         \
        T(ws_access_log_line), T(ws_message_with_handshake_not_lost),                              \
        T(ws_close_with_handshake_reaches_worker), T(ws_bad_frame_with_handshake_reaches_worker),  \
        T(ws_worker_extension_not_passed), T(ws_fin_with_handshake_frees_worker),                  \
        T(ws_worker_data_before_101), T(ws_worker_frames_before_its_end_reach_client),             \
        T(ws_send_limit_below_the_mark_loses_nothing),                                             \
        T(ws_client_close_behind_held_messages_reaches_worker),                                    \
        T(ws_close_then_fin_while_held_reaches_worker),                                            \
        T(ws_close_then_reset_while_held_reaches_worker),                                          \
        T(ws_close_then_reset_while_paused_reaches_worker)

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {WS_TESTS};
    int rc;
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    unsetenv("SHMIPC_REACTOR_BACKEND");
    suite_backend = SHMIPC_BACKEND_EPOLL;
    rc = cmocka_run_group_tests_name("front_ws_epoll", tests, NULL, NULL);
    suite_backend = SHMIPC_BACKEND_AUTO; /* io_uring where the kernel has it */
    rc |= cmocka_run_group_tests_name("front_ws_uring", tests, NULL, NULL);
    return rc != 0;
}
