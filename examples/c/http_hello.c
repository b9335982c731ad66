/*
 * cc -O2 examples/c/http_hello.c -Ibindings -Lbuild/bindings -lshmipc -o http_hello
 *
 * The smallest HTTP server: GET / answers "Hello, World!" as a static response (no handler
 * runs per request), GET /hello answers the same from a handler. It is the benchmark's target
 * (docs/http.md). Ctrl-C stops it gracefully.
 *
 *   http_hello [PORT [WORKERS [BACKEND]]]     BACKEND: auto, io_uring, epoll, epoll-oneshot
 *   curl -i http://127.0.0.1:8080/
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

static int hello(shmipc_http_request *req, shmipc_http_response *res, void *user_data)
{
    (void)req;
    (void)user_data;
    shmipc_http_response_add_header(res, "Content-Type", "text/plain");
    return shmipc_http_response_body(res, "Hello, World!", 13);
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "http_hello: %s: %s (%s)\n", what, shmipc_strerror(rc), shmipc_error_detail());
    return 1;
}

int main(int argc, char **argv)
{
    static const char *const backends[] = {"default", "auto", "io_uring", "epoll", "epoll-oneshot"};
    shmipc_server_config *cfg;
    int backend = SHMIPC_BACKEND_DEFAULT;
    int rc;

    if (argc > 3) {
        for (backend = 0; backend < 5 && strcmp(argv[3], backends[backend]) != 0; backend++)
            ;
        if (backend == 5) {
            fprintf(stderr, "http_hello: unknown backend %s\n", argv[3]);
            return 2;
        }
    }
    if ((rc = shmipc_server_config_new(&cfg)) < 0)
        return fail("config", rc);
    if ((rc = shmipc_server_config_set_port(cfg, argc > 1 ? atoi(argv[1]) : 8080)) < 0 ||
        (rc = shmipc_server_config_set_workers(cfg, argc > 2 ? (unsigned)atoi(argv[2]) : 0)) < 0 ||
        (rc = shmipc_server_config_set_backend(cfg, backend)) < 0)
        return fail("config", rc);
    rc = shmipc_server_new(cfg, &server);
    shmipc_server_config_free(cfg);
    if (rc < 0)
        return fail("server", rc);
    if ((rc = shmipc_server_static(server, "GET", "/", 200, "text/plain", "Hello, World!", 13)) <
            0 ||
        (rc = shmipc_server_route(server, "GET", "/hello", hello, NULL, NULL)) < 0)
        return fail("route", rc);
    if ((rc = shmipc_server_start(server)) < 0)
        return fail("start", rc);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    printf("http_hello: listening on 127.0.0.1:%d (%s)\n", shmipc_server_port(server),
           shmipc_server_backend(server));
    fflush(stdout);
    rc = shmipc_server_run(server);
    shmipc_server_close(server);
    return rc < 0 ? fail("run", rc) : 0;
}
