/*
 * libFuzzer entry point for the WebSocket layer (frame parser, connection, handshake). Not
 * part of the library: everything is inside SHMIPC_WS_FUZZ. Build and run with
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -DSHMIPC_WS_FUZZ -Ibindings -Icore \
 *     core/net/ws_fuzz.c core/net/ws_conn.c core/net/ws_frame.c core/net/ws_codec.c \
 *     core/net/ws_handshake.c core/net/http_parser.c core/net/http_writer.c \
 *     core/common/error.c core/common/log.c core/common/env.c bindings/error.c -o ws_fuzz
 *   ./ws_fuzz CORPUS_DIR   (seeds: the `in` bytes of tests/ws)
 *
 * or, as the project does, with fuzz/run.sh (target "ws", fuzz/README.md); the C suite
 * replays fuzz/corpus/ws and fuzz/regressions/ws through it (fuzz_replay_ws).
 *
 * Input: byte 0 picks the mode (bit 0: small limits, so 1009 paths are reached; bit 1: the
 * application closes first; bit 2: the rest is an HTTP upgrade request instead of frames),
 * bytes 1-2 a split point; the rest is what a client sends. The oracles, beyond the
 * sanitizers: the connection's output, the messages it delivers and its close code do not
 * depend on how the bytes were split; the output parses as well-formed server frames with
 * nothing after a close frame; and the reassembly buffer never exceeds max_message.
 */
#ifdef SHMIPC_WS_FUZZ

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/http_parser.h"
#include "net/ws_codec.h"
#include "net/ws_conn.h"
#include "net/ws_handshake.h"

struct out {
    char *p;
    size_t n;
};

static void append(struct out *o, const void *d, size_t n)
{
    if (!n)
        return;
    o->p = realloc(o->p, o->n + n);
    if (!o->p)
        abort();
    memcpy(o->p + o->n, d, n);
    o->n += n;
}

struct run {
    struct shmipc__ws_conn conn;
    struct out wire;     /* everything the server sent */
    struct out messages; /* opcode, 8-byte length, bytes, for each message */
    unsigned close_code;
    unsigned closes;
};

static int on_message(void *ud, unsigned opcode, const char *data, size_t len)
{
    struct run *r = ud;
    uint64_t n = len;
    uint8_t op = (uint8_t)opcode;
    if (opcode == SHMIPC__WS_OP_TEXT && !shmipc__utf8_valid(data, len))
        abort();
    append(&r->messages, &op, 1);
    append(&r->messages, &n, sizeof n);
    append(&r->messages, data, len);
    /* Echo, like Autobahn's testee; refusals (tx_limit) are part of the behaviour. */
    (void)shmipc__ws_conn_send(&r->conn, opcode, data, len, SHMIPC__WS_SEND_TRUSTED);
    return len % 97 == 96 ? -1 : 0; /* now and then, an application error (1011) */
}

static void on_close(void *ud, unsigned code, const char *reason, size_t len)
{
    struct run *r = ud;
    (void)reason;
    (void)len;
    r->closes++;
    r->close_code = code;
}

static const struct shmipc__ws_callbacks cbs = {.on_message = on_message, .on_close = on_close};

static void drain(struct run *r)
{
    const char *p;
    size_t n;
    while ((n = shmipc__ws_conn_tx_peek(&r->conn, &p)) > 0) {
        append(&r->wire, p, n);
        shmipc__ws_conn_tx_sent(&r->conn, n);
    }
}

static void run(struct run *r, const struct shmipc__ws_limits *lim, uint8_t mode,
                const uint8_t *data, size_t n, size_t cut)
{
    memset(r, 0, sizeof *r);
    shmipc__ws_conn_init(&r->conn, lim, &cbs, r);
    if (mode & 2)
        (void)shmipc__ws_conn_close(&r->conn, 1001, "bye", 3);
    size_t pieces[2] = {cut, n}, from = 0;
    for (int k = 0; k < 2; k++) {
        size_t len = pieces[k] - from;
        char *buf = malloc(len ? len : 1);
        if (!buf)
            abort();
        memcpy(buf, data + from, len);
        int v = shmipc__ws_conn_process(&r->conn, buf, len);
        free(buf);
        if (v < 0 || r->conn.msg_cap > lim->max_message)
            abort();
        drain(r);
        from = pieces[k];
    }
}

/* The server's output must be well-formed server frames, none after a close frame. */
static void check_wire(const struct out *w)
{
    char *copy = malloc(w->n ? w->n : 1);
    if (!copy)
        abort();
    if (w->n)
        memcpy(copy, w->p, w->n);
    struct shmipc__ws_parser p;
    struct shmipc__ws_event ev;
    shmipc__ws_parser_init(&p, SHMIPC__WS_CLIENT, 0);
    size_t pos = 0;
    int closed = 0;
    for (;;) {
        pos += shmipc__ws_parse(&p, copy + pos, w->n - pos, &ev);
        if (ev.kind == SHMIPC__WS_EV_NONE)
            break;
        if (ev.kind == SHMIPC__WS_EV_ERROR)
            abort();
        if (ev.kind == SHMIPC__WS_EV_HEAD) {
            if (closed)
                abort(); /* a frame after the close frame */
            closed = ev.frame.opcode == SHMIPC__WS_OP_CLOSE;
        }
    }
    if (pos != w->n || p.have != 0)
        abort(); /* a partial frame */
    free(copy);
}

static void fuzz_handshake(const uint8_t *data, size_t n)
{
    struct shmipc__http_limits lim;
    if (shmipc__http_limits_resolve(&lim, NULL) != 0)
        abort();
    struct shmipc__http_field *fields = calloc(lim.max_headers, sizeof *fields);
    struct shmipc__http_parser p;
    shmipc__http_parser_init(&p, &lim, fields);
    char *buf = malloc(n ? n : 1);
    if (!fields || !buf)
        abort();
    memcpy(buf, data, n);
    if (shmipc__http_parse_head(&p, buf, n) > 0) {
        static const char *const protocols[] = {"chat", "superchat", "v1.example"};
        struct shmipc__ws_handshake hs;
        int rc = shmipc__ws_handshake_check(&hs, &p.req, protocols, 3);
        if ((rc == 0) != (hs.status == 101) || (rc != 0 && hs.status != 400 && hs.status != 426))
            abort();
        char out[1024];
        if (shmipc__ws_handshake_write(&hs, out, sizeof out, NULL, NULL) <= 0)
            abort();
    }
    free(buf);
    free(fields);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    uint8_t mode = data[0];
    size_t n = size - 3;
    size_t cut = n ? ((size_t)data[1] << 8 | data[2]) % (n + 1) : 0;
    data += 3;
    if (mode & 4) {
        fuzz_handshake(data, n);
        return 0;
    }
    struct shmipc__ws_limits in = {0}, lim;
    if (mode & 1) {
        /* Output limits stay at their defaults: refusing an echo or replacing a pong depends,
         * rightly, on when the owner drains the queue, which differs between the two runs. */
        in.max_message = 300;
        in.max_frame = 200;
    }
    if (shmipc__ws_limits_resolve(&lim, &in) != 0)
        abort();
    static struct run whole, split;
    run(&whole, &lim, mode, data, n, n);
    run(&split, &lim, mode, data, n, cut);
    if (whole.wire.n != split.wire.n ||
        (whole.wire.n && memcmp(whole.wire.p, split.wire.p, whole.wire.n) != 0) ||
        whole.messages.n != split.messages.n ||
        (whole.messages.n && memcmp(whole.messages.p, split.messages.p, whole.messages.n) != 0) ||
        whole.close_code != split.close_code || whole.closes > 1 || split.closes > 1)
        abort();
    check_wire(&whole.wire);
    shmipc__ws_conn_destroy(&whole.conn);
    shmipc__ws_conn_destroy(&split.conn);
    free(whole.wire.p);
    free(whole.messages.p);
    free(split.wire.p);
    free(split.messages.p);
    return 0;
}

#endif
