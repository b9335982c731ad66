/*
 * cc -O2 examples/c/http_json_api.c -Ibindings -Lbuild/bindings -lshmipc -lpthread -o http_json_api
 *
 * A tiny JSON API over the HTTP server: an in-memory list of items.
 *   GET  /health        {"status":"ok"}            (a static response)
 *   GET  /items         [{"id":1,"item":{...}},...]
 *   POST /items         stores the JSON object sent; 201 {"id":N,"count":M}
 *   GET  /items/<id>    the item, or 404 {"error":"no such item"}
 *
 *   http_json_api [PORT [WORKERS]]
 *   curl -s -d '{"name":"apple"}' http://127.0.0.1:8080/items
 *   curl -s http://127.0.0.1:8080/items/1
 *
 * Handlers run on the server's worker threads, several at once when there are several
 * workers, so the store is guarded by a mutex; they never block for long. Ctrl-C stops the
 * server gracefully.
 */
#include <shmipc.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ITEMS 1024
#define MAX_ITEM  4096

struct store {
    pthread_mutex_t lock;
    char *items[MAX_ITEMS];
    size_t lens[MAX_ITEMS];
    int count;
};

static shmipc_server *server;

static void on_signal(int sig)
{
    (void)sig;
    shmipc_server_stop(server);
}

static int json(shmipc_http_response *res, int status, const char *body, size_t len)
{
    shmipc_http_response_set_status(res, status);
    shmipc_http_response_add_header(res, "Content-Type", "application/json");
    return shmipc_http_response_body(res, body, len);
}

/* free() as a release callback for a borrowed body. */
static void release(void *p)
{
    free(p);
}

static int list_items(shmipc_http_request *req, shmipc_http_response *res, void *user_data)
{
    struct store *st = user_data;
    size_t cap = 2, len = 0;
    char *out;
    (void)req;
    pthread_mutex_lock(&st->lock);
    for (int i = 0; i < st->count; i++)
        cap += st->lens[i] + 32;
    out = malloc(cap);
    if (out == NULL) {
        pthread_mutex_unlock(&st->lock);
        return -1;
    }
    out[len++] = '[';
    for (int i = 0; i < st->count; i++)
        len += (size_t)snprintf(out + len, cap - len, "%s{\"id\":%d,\"item\":%.*s}", i ? "," : "",
                                i + 1, (int)st->lens[i], st->items[i]);
    pthread_mutex_unlock(&st->lock);
    out[len++] = ']';
    shmipc_http_response_add_header(res, "Content-Type", "application/json");
    /* The list may be large: lend it to the server instead of copying it again. */
    return shmipc_http_response_body_borrow(res, out, len, out, release);
}

static int add_item(shmipc_http_request *req, shmipc_http_response *res, void *user_data)
{
    struct store *st = user_data;
    size_t len;
    const char *body = shmipc_http_request_body(req, &len);
    char reply[64];
    int id, n;
    while (len > 0 && (*body == ' ' || *body == '\n' || *body == '\r' || *body == '\t'))
        body++, len--;
    if (len < 2 || body[0] != '{' || len > MAX_ITEM)
        return json(res, 400, "{\"error\":\"send a JSON object\"}", 30);
    pthread_mutex_lock(&st->lock);
    if (st->count == MAX_ITEMS) {
        pthread_mutex_unlock(&st->lock);
        return json(res, 507, "{\"error\":\"store is full\"}", 25);
    }
    st->items[st->count] = malloc(len);
    if (st->items[st->count] == NULL) {
        pthread_mutex_unlock(&st->lock);
        return -1;
    }
    memcpy(st->items[st->count], body, len);
    st->lens[st->count] = len;
    id = ++st->count;
    pthread_mutex_unlock(&st->lock);
    n = snprintf(reply, sizeof reply, "{\"id\":%d,\"count\":%d}", id, id);
    return json(res, 201, reply, (size_t)n);
}

static int get_item(shmipc_http_request *req, shmipc_http_response *res, void *user_data)
{
    struct store *st = user_data;
    size_t len;
    const char *w = shmipc_http_request_wildcard(req, &len);
    char buf[MAX_ITEM + 64];
    int id = 0, n = -1;
    for (size_t i = 0; i < len && i < 9; i++) {
        if (w[i] < '0' || w[i] > '9') {
            id = 0;
            break;
        }
        id = id * 10 + (w[i] - '0');
    }
    pthread_mutex_lock(&st->lock);
    if (id >= 1 && id <= st->count)
        n = snprintf(buf, sizeof buf, "{\"id\":%d,\"item\":%.*s}", id, (int)st->lens[id - 1],
                     st->items[id - 1]);
    pthread_mutex_unlock(&st->lock);
    if (n < 0)
        return json(res, 404, "{\"error\":\"no such item\"}", 24);
    return json(res, 200, buf, (size_t)n);
}

static void store_free(void *user_data)
{
    struct store *st = user_data;
    for (int i = 0; i < st->count; i++)
        free(st->items[i]);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "http_json_api: %s: %s (%s)\n", what, shmipc_strerror(rc),
            shmipc_error_detail());
    return 1;
}

int main(int argc, char **argv)
{
    shmipc_server_config *cfg;
    struct store *st = calloc(1, sizeof *st);
    int rc;

    if (st == NULL)
        return 1;
    pthread_mutex_init(&st->lock, NULL);
    if ((rc = shmipc_server_config_new(&cfg)) < 0)
        return fail("config", rc);
    if ((rc = shmipc_server_config_set_port(cfg, argc > 1 ? atoi(argv[1]) : 8080)) < 0 ||
        (rc = shmipc_server_config_set_workers(cfg, argc > 2 ? (unsigned)atoi(argv[2]) : 0)) < 0)
        return fail("config", rc);
    rc = shmipc_server_new(cfg, &server);
    shmipc_server_config_free(cfg);
    if (rc < 0)
        return fail("server", rc);
    /* The store is shared by three routes; the last one registered frees it. */
    if ((rc = shmipc_server_static(server, "GET", "/health", 200, "application/json",
                                   "{\"status\":\"ok\"}", 15)) < 0 ||
        (rc = shmipc_server_route(server, "GET", "/items", list_items, st, NULL)) < 0 ||
        (rc = shmipc_server_route(server, "GET", "/items/*", get_item, st, NULL)) < 0 ||
        (rc = shmipc_server_route(server, "POST", "/items", add_item, st, store_free)) < 0)
        return fail("route", rc);
    if ((rc = shmipc_server_start(server)) < 0)
        return fail("start", rc);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    printf("http_json_api: listening on 127.0.0.1:%d (%s)\n", shmipc_server_port(server),
           shmipc_server_backend(server));
    fflush(stdout);
    rc = shmipc_server_run(server);
    shmipc_server_close(server);
    return rc < 0 ? fail("run", rc) : 0;
}
