/*
 * libFuzzer entry point for the HTTP/1.1 layer (parser, body decoder, writer, connection).
 * Not part of the library: everything is inside SHMIPC_HTTP_FUZZ. Build and run with
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -DSHMIPC_HTTP_FUZZ -Ibindings -Icore \
 *     core/net/http_fuzz.c core/net/http_parser.c core/net/http_body.c core/net/http_writer.c \
 *     core/net/http_conn.c core/common/error.c core/common/log.c core/common/env.c \
 *     bindings/error.c -o http_fuzz
 *   ./http_fuzz CORPUS_DIR
 *
 * or, as the project does, with fuzz/run.sh (target "http", fuzz/README.md); the C suite
 * replays fuzz/corpus/http and fuzz/regressions/http through it (fuzz_replay_http).
 *
 * Input: byte 0 bits 0-1 pick the limits (small ones, so limit paths are reached) and
 * LENIENT_LF; bits 2-7 of byte 0 and byte 1 are a split point (bits 2-7 the high part: any
 * offset up to 16383); the rest is what a client sends. A split point past the end is byte 1
 * modulo the length, as when byte 1 alone gave the split, so that an input of that time
 * (bits 2-7 clear, or fewer than 256 bytes after these two) splits where it did. The
 * oracle, beyond the
 * sanitizers: the connection's output must not depend on how the bytes were split, apart
 * from "100 Continue" interim responses (which legitimately do), and the parser's slices
 * must stay inside the head.
 */
#ifdef SHMIPC_HTTP_FUZZ

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/http_conn.h"

static const char *const bodies[] = {"a", "bb", "", "dddd"};

/* Answers from static memory only, so output bytes never echo input bytes. */
static int fuzz_handler(void *user_data, const struct shmipc__http_request *req, const char *body,
                        size_t body_len, struct shmipc__http_response *resp)
{
    (void)user_data;
    (void)body;
    for (uint32_t i = 0; i < req->nfields; i++) {
        const struct shmipc__http_field *f = &req->fields[i];
        if ((uint64_t)f->name.off + f->name.len > req->head_len ||
            (uint64_t)f->value.off + f->value.len > req->head_len)
            abort();
    }
    if ((uint64_t)req->target.off + req->target.len > req->head_len)
        abort();
    if (req->path.len > 1 && req->path.len > req->target.len)
        abort();
    if (req->nfields % 5 == 4)
        return -1; /* exercise the 500 path */
    resp->status = (uint16_t)(200 + body_len % 7);
    resp->body = bodies[body_len % 4];
    resp->body_len = strlen(bodies[body_len % 4]);
    return 0;
}

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

/* Feeds data in the given pieces through one connection; returns everything it wrote. */
static struct out run(const uint8_t *data, size_t n, size_t cut, uint8_t mode)
{
    struct shmipc__http_limits in = {0}, lim;
    if (mode & 1) {
        in.max_request_line = 40;
        in.max_head_bytes = 120;
        in.max_headers = 4;
        in.max_chunk_line = 12;
        in.max_body = 64;
    }
    if (mode & 2)
        in.flags = SHMIPC__HTTP_LENIENT_LF;
    if (shmipc__http_limits_resolve(&lim, &in) != 0)
        abort();
    struct shmipc__http_field *fields = calloc(lim.max_headers, sizeof *fields);
    static struct iovec iov[64];
    static char arena[1 << 16];
    struct shmipc__http_date date;
    shmipc__http_date_init(&date, 0);
    struct shmipc__http_batch b;
    shmipc__http_batch_init(&b, iov, 64, arena, sizeof arena, &date);
    struct shmipc__http_conn c;
    shmipc__http_conn_init(&c, &lim, fields, fuzz_handler, NULL);
    struct out out = {0};
    char *rx = NULL;
    size_t len = 0;
    size_t pieces[2] = {cut, n};
    size_t fed = 0;
    int closed = 0;
    for (int k = 0; k < 2 && !closed; k++) {
        size_t add = pieces[k] - fed;
        char *grown = malloc(len + add + 1);
        if (len)
            memcpy(grown, rx, len);
        memcpy(grown + len, data + fed, add);
        free(rx);
        rx = grown;
        len += add;
        fed = pieces[k];
        for (;;) {
            size_t consumed;
            int v = shmipc__http_conn_process(&c, rx, &len, &consumed, &b, 3);
            if (v < 0 || consumed > len)
                abort();
            size_t bytes = 0;
            for (uint32_t i = 0; i < b.niov; i++) {
                append(&out, iov[i].iov_base, iov[i].iov_len);
                bytes += iov[i].iov_len;
            }
            if (bytes != b.bytes)
                abort();
            shmipc__http_batch_reset(&b);
            memmove(rx, rx + consumed, len - consumed);
            len -= consumed;
            if (v == SHMIPC__HTTP_CONN_CLOSE) {
                closed = 1;
                break;
            }
            if (v == SHMIPC__HTTP_CONN_MORE)
                break;
        }
    }
    free(rx);
    free(fields);
    return out;
}

/* Drops every "HTTP/1.1 100 Continue\r\n\r\n" (no other output can contain it). */
static void strip_continues(struct out *o)
{
    static const char line[] = "HTTP/1.1 100 Continue\r\n\r\n";
    size_t w = 0;
    for (size_t r = 0; r < o->n;) {
        if (o->n - r >= sizeof line - 1 && memcmp(o->p + r, line, sizeof line - 1) == 0) {
            r += sizeof line - 1;
            continue;
        }
        o->p[w++] = o->p[r++];
    }
    o->n = w;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    uint8_t mode = data[0];
    size_t n = size - 2;
    size_t cut = (size_t)(mode >> 2) << 8 | data[1];
    if (cut > n)
        cut = data[1] % (n + 1);
    data += 2;
    struct out whole = run(data, n, n, mode);
    struct out split = run(data, n, cut, mode);
    strip_continues(&whole);
    strip_continues(&split);
    if (whole.n != split.n || (whole.n && memcmp(whole.p, split.p, whole.n) != 0))
        abort();
    free(whole.p);
    free(split.p);
    return 0;
}

#endif
