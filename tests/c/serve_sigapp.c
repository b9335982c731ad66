/*
 * A shmipc-serve C handler for tests/python/test_serve_native_worker.py: an application that
 * installs a signal handler of its own (SIGUSR2, without SA_RESTART), as a C app with a timer
 * or a child to reap would. Signals it gets must not end the worker's sessions with the front.
 * GET answers 200 "ok".
 */
#include "shmipc_serve.h"

#include <signal.h>
#include <string.h>

static void on_usr2(int sig)
{
    (void)sig;
}

__attribute__((constructor)) static void install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr2;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR2, &sa, NULL);
}

int shmipc_serve_handle(shmipc_serve_exchange *x, void *user_data)
{
    (void)user_data;
    static const shmipc_serve_field ct = {(const uint8_t *)"Content-Type",
                                          (const uint8_t *)"text/plain", 12, 10};
    shmipc_serve_response r = {.size = sizeof r,
                               .status = 200,
                               .flags = SHMIPC_SERVE_RESP_CONTENT_LENGTH,
                               .content_length = 2};
    int rc = shmipc_serve_respond(x, &r, &ct, 1);
    return rc < 0 ? rc : shmipc_serve_write(x, "ok", 2);
}
