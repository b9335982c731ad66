/*
 * serve_app.c - the C app of bench/serve_bench.py (shmipc-serve --c libserve_bench_app.so):
 * the response of serve_app.py and serve_app.lua, GET / answering SERVE_BENCH_BODY bytes (13:
 * "Hello, World!"; otherwise that many bytes of a repeated pattern) with Content-Type
 * text/plain and Content-Length. It does nothing else: the pool's cost with the cheapest app,
 * the floor under the Python and Lua apps of the same benchmark.
 */
#include <shmipc_serve.h>

#include <stdlib.h>
#include <string.h>

static char *body;
static size_t body_len;

/* The body, made once (the worker calls the handler on one thread). */
static int make_body(void)
{
    const char *e = getenv("SERVE_BENCH_BODY");
    long n = e != NULL ? strtol(e, NULL, 10) : 13;
    if (n == 13 || n <= 0 || n > (64L << 20)) {
        body = "Hello, World!";
        body_len = 13;
        return 0;
    }
    static const char pattern[] = "0123456789abcdef";
    char *b = malloc((size_t)n);
    if (b == NULL)
        return -1;
    for (long i = 0; i < n; i++)
        b[i] = pattern[i % 16];
    body = b;
    body_len = (size_t)n;
    return 0;
}

int shmipc_serve_handle(shmipc_serve_exchange *x, void *user_data)
{
    (void)user_data;
    if (body == NULL && make_body() != 0)
        return -1;
    static const shmipc_serve_field ct = {(const uint8_t *)"Content-Type",
                                          (const uint8_t *)"text/plain", 12, 10};
    shmipc_serve_response r = {.size = sizeof r,
                               .status = 200,
                               .flags = SHMIPC_SERVE_RESP_CONTENT_LENGTH,
                               .content_length = body_len};
    int rc = shmipc_serve_respond(x, &r, &ct, 1);
    return rc < 0 ? rc : shmipc_serve_write(x, body, body_len);
}
