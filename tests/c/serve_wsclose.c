/*
 * A shmipc-serve C handler for tests/python/test_serve_ws_front.py: a WebSocket echo that
 * appends how each WebSocket ended (shmipc_serve_ws_closed(): the client's close code and
 * reason, 1006 when it went without a close) to disconnects.log in the working directory, one
 * "TAG CODE REASON" line, TAG the target's query. The message "big" is answered with one 8 MiB
 * binary message instead of its echo, "slow" is echoed after 300 ms. Any other request is a
 * 404.
 */
#include "shmipc_serve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BIG_LEN (8u << 20)

static void log_end(shmipc_serve_exchange *x, const shmipc_serve_request *req)
{
    char reason[124];
    size_t rlen = 0;
    int32_t code = shmipc_serve_ws_closed(x, reason, sizeof reason - 1, &rlen);
    const char *q = memchr(req->target, '?', req->target_len);
    int tlen = q != NULL ? (int)(req->target_len - (size_t)(q + 1 - (const char *)req->target)) : 0;
    FILE *f = fopen("disconnects.log", "a");
    if (f == NULL)
        return;
    reason[rlen < sizeof reason ? rlen : sizeof reason - 1] = '\0';
    fprintf(f, "%.*s %d %s\n", tlen, q != NULL ? q + 1 : "", (int)code, reason);
    fclose(f);
}

/* Handlers may run on several threads at once: each has its own message buffer. */
static int ws_echo(shmipc_serve_exchange *x, const shmipc_serve_request *req)
{
    enum { CAP = 1u << 20 };
    char *msg = malloc(CAP);
    size_t len = 0;
    int rc = msg != NULL ? shmipc_serve_ws_accept(x, NULL, NULL, 0) : -1;
    while (rc == 0) {
        uint32_t flags;
        int64_t n = shmipc_serve_ws_recv(x, msg + len, CAP - len, &flags, -1);
        if (n < 0)
            break; /* closed (answered), gone, or the worker stops */
        len += (size_t)n;
        if (!(flags & SHMIPC_SERVE_WS_FIN)) {
            if (len == CAP)
                rc = shmipc_serve_ws_close(x, 1009, NULL, 0);
            continue;
        }
        if (len == 4 && memcmp(msg, "slow", 4) == 0) {
            struct timespec ts = {0, 300 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if (len == 3 && memcmp(msg, "big", 3) == 0) {
            char *big = malloc(BIG_LEN);
            if (big == NULL)
                break;
            memset(big, 'b', BIG_LEN);
            rc = shmipc_serve_ws_send(x, SHMIPC_SERVE_WS_BINARY, big, BIG_LEN);
            free(big);
        } else {
            rc = shmipc_serve_ws_send(x, flags & 0xFFu, msg, len);
        }
        len = 0;
    }
    free(msg);
    log_end(x, req);
    return 0;
}

int shmipc_serve_handle(shmipc_serve_exchange *x, void *user_data)
{
    (void)user_data;
    const shmipc_serve_request *req = shmipc_serve_exchange_request(x);
    if (req->flags & SHMIPC_SERVE_REQ_UPGRADE)
        return ws_echo(x, req);
    shmipc_serve_response r = {.size = sizeof r,
                               .status = 404,
                               .flags = SHMIPC_SERVE_RESP_CONTENT_LENGTH,
                               .content_length = 0};
    return shmipc_serve_respond(x, &r, NULL, 0);
}
