/*
 * A front for tests/python/test_serve_front.py: runs the HTTP server on 127.0.0.1 (an
 * ephemeral port, one reactor thread) with shmipc-serve's front (core/serve/front.h) on every path,
 * handing requests to the application workers named on the command line, prints "port N" and
 * serves until its standard input closes. Not installed; the front has no public ABI yet.
 *
 * Usage: front_run [--deadline-ms N] [--max-body BYTES] ADDRESS...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shmipc.h"
#include "net/server.h"
#include "serve/front.h"

int main(int argc, char **argv)
{
    struct shmipc__front_opts o = {0};
    struct shmipc__front *f = NULL;
    shmipc_server_config *cfg = NULL;
    shmipc_server *srv = NULL;
    unsigned long long max_body = 0; /* 0: the server's default */
    int i = 1, rc;
    char c;

    for (; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--deadline-ms") == 0)
            o.deadline_ms = (uint32_t)strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--max-body") == 0)
            max_body = strtoull(argv[i + 1], NULL, 10);
        else
            break;
    }
    if (i >= argc) {
        fprintf(stderr, "usage: front_run [--deadline-ms N] [--max-body BYTES] ADDRESS...\n");
        return 2;
    }
    o.workers = (const char *const *)&argv[i];
    o.nworkers = (unsigned)(argc - i);
    if ((rc = shmipc__front_new(&o, &f)) < 0 || (rc = shmipc_server_config_new(&cfg)) < 0 ||
        (rc = shmipc_server_config_set_address(cfg, "127.0.0.1")) < 0 ||
        (rc = shmipc_server_config_set_port(cfg, 0)) < 0 ||
        (rc = shmipc_server_config_set_workers(cfg, 1)) < 0 ||
        (max_body > 0 &&
         (rc = shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_BODY, max_body)) < 0) ||
        (rc = shmipc_server_new(cfg, &srv)) < 0 || (rc = shmipc__front_attach(f, srv, "/*")) < 0 ||
        (rc = shmipc_server_start(srv)) < 0) {
        fprintf(stderr, "front_run: %s: %s\n", shmipc_errname(rc), shmipc_error_detail());
        goto out;
    }
    printf("port %d\n", shmipc_server_port(srv));
    fflush(stdout);
    while (read(0, &c, 1) > 0) {
    }
    rc = 0;
out:
    shmipc_server_close(srv);
    shmipc_server_config_free(cfg);
    shmipc__front_free(f);
    return rc < 0 ? 1 : 0;
}
