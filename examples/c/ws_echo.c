/*
 * cc -O2 examples/c/ws_echo.c -Ibindings -Lbuild/bindings -lshmipc -o ws_echo
 *
 * A WebSocket echo server: every text or binary message is sent back as it came, on any path
 * (ws://127.0.0.1:8081/ or any other). It is the benchmark's and the interop tests' target
 * (docs/websocket.md). Ctrl-C stops it gracefully (open connections get a 1001 close).
 *
 *   ws_echo [PORT] [--workers N] [--backend auto|io_uring|epoll|epoll-oneshot]
 *           [--max-message BYTES]
 *   PORT defaults to 8081; workers to SHMIPC_WORKERS, else one per CPU.
 */
#include <shmipc.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static shmipc_server *server;

static void on_signal(int sig)
{
    (void)sig;
    shmipc_server_stop(server); /* async-signal-safe */
}

static void on_message(shmipc_ws *ws, int kind, const void *data, size_t len, void *user_data)
{
    int rc = shmipc_ws_send(ws, kind, data, len);
    (void)user_data;
    /* The server stops reading a client that does not read its echoes, so a full queue is
     * rare; such a client is told to come back later. */
    if (rc == SHMIPC_EAGAIN)
        shmipc_ws_close(ws, 1013, "send queue full");
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "ws_echo: %s: %s (%s)\n", what, shmipc_strerror(rc), shmipc_error_detail());
    return 1;
}

static int usage(void)
{
    fprintf(stderr, "usage: ws_echo [PORT] [--workers N] [--backend "
                    "auto|io_uring|epoll|epoll-oneshot] [--max-message BYTES]\n");
    return 2;
}

int main(int argc, char **argv)
{
    static const char *const backends[] = {"default", "auto", "io_uring", "epoll", "epoll-oneshot"};
    shmipc_server_config *cfg;
    int port = 8081, backend = SHMIPC_BACKEND_DEFAULT;
    unsigned workers = 0;
    unsigned long long max_message = 0;
    int rc;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--workers") == 0 && i + 1 < argc) {
            workers = (unsigned)strtoul(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
            i++;
            for (backend = 0; backend < 5 && strcmp(argv[i], backends[backend]) != 0; backend++)
                ;
            if (backend == 5) {
                fprintf(stderr, "ws_echo: unknown backend %s\n", argv[i]);
                return usage();
            }
        } else if (strcmp(argv[i], "--max-message") == 0 && i + 1 < argc) {
            max_message = strtoull(argv[++i], NULL, 10);
        } else if (argv[i][0] >= '0' && argv[i][0] <= '9') {
            port = atoi(argv[i]);
        } else {
            return usage();
        }
    }
    if ((rc = shmipc_server_config_new(&cfg)) < 0)
        return fail("config", rc);
    if ((rc = shmipc_server_config_set_port(cfg, port)) < 0 ||
        (rc = shmipc_server_config_set_workers(cfg, workers)) < 0 ||
        (rc = shmipc_server_config_set_backend(cfg, backend)) < 0 ||
        (rc = shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_WS_MESSAGE, max_message)) < 0)
        return fail("config", rc);
    rc = shmipc_server_new(cfg, &server);
    shmipc_server_config_free(cfg);
    if (rc < 0)
        return fail("server", rc);
    rc = shmipc_server_websocket(server, "/*", NULL, NULL, on_message, NULL, NULL, NULL);
    if (rc < 0)
        return fail("websocket route", rc);
    if ((rc = shmipc_server_start(server)) < 0)
        return fail("start", rc);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    printf("ws_echo: listening on ws://127.0.0.1:%d/ (%s)\n", shmipc_server_port(server),
           shmipc_server_backend(server));
    fflush(stdout);
    rc = shmipc_server_run(server);
    shmipc_server_close(server);
    return rc < 0 ? fail("run", rc) : 0;
}
