/*
 * The HTTP/1.1 server object; see server.h and docs/http.md. Owns struct shmipc_server's
 * life: shmipc__server_new() (resolving the config and the SHMIPC_HTTP_* knobs), start, run,
 * stop, stats and free. May call: the config (server_config.c), the workers' setup and
 * teardown (server_worker.c), the route tables' release (server_route.c), the reactor's
 * workers. The rest of the server lives beside it: server_config.c, server_conn.c (the
 * connection lifecycle), server_defer.c (deferred requests), server_worker.c (the workers and
 * their pools), server_route.c (routing and the response API) and server_ws.c (WebSocket).
 */
#include "net/server_int.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/*
 * A timeout knob's value `v`, by the API's rule: unset keeps *out, a negative whole number is
 * -1 (never), 0 is allowed only where `zero_ok` (keep-alive off), else 1..3600000 ms. A bad
 * value fails naming the variable.
 */
static int env_timeout(const char *name, const char *v, int zero_ok, int64_t *out)
{
    if (v != NULL && v[0] == '-') {
        char *end;
        errno = 0;
        long long n = strtoll(v, &end, 10);
        if (end == v + 1 || *end != '\0' || (n >= 0 && errno == 0))
            return shmipc__fail(SHMIPC_EINVAL, "%s: \"%s\" is not a whole number of milliseconds",
                                name, v);
        *out = -1; /* any negative value, however large (ERANGE included) */
        return 0;
    }
    unsigned long n = 0;
    int rc = shmipc__env_number(name, v, zero_ok ? 0 : 1, SHMIPC__SERVER_MAX_TIMEOUT_MS,
                                "milliseconds (negative: never)", &n);
    if (rc > 0)
        *out = (int64_t)n;
    return rc < 0 ? rc : 0;
}

/* ---------------------------------------------------------------------------------------- */
/* The server */

int shmipc__server_new(const struct shmipc_server_config *cfg, struct shmipc_server **out)
{
    struct shmipc_server_config *defaults = NULL;
    struct shmipc_server *s = NULL;
    int64_t header_ms = SHMIPC__SERVER_DEFAULT_HEADER_MS;
    int64_t keepalive_ms = SHMIPC__SERVER_DEFAULT_KEEPALIVE_MS;
    int rc;

    *out = NULL;
    if (cfg == NULL) {
        rc = shmipc__server_config_new(&defaults);
        if (rc < 0)
            return rc;
        cfg = defaults;
    }
    s = calloc(1, sizeof *s);
    if (s == NULL) {
        rc = shmipc__fail(SHMIPC_ENOMEM, "server_new: out of memory");
        goto err;
    }
    s->stop_fd = -1;
    s->cfg = *cfg;
    rc = env_timeout("SHMIPC_HTTP_HEADER_TIMEOUT_MS",
                     shmipc__getenv("SHMIPC_HTTP_HEADER_TIMEOUT_MS"), 0, &header_ms);
    if (rc == 0)
        rc = env_timeout("SHMIPC_HTTP_KEEPALIVE_TIMEOUT_MS",
                         shmipc__getenv("SHMIPC_HTTP_KEEPALIVE_TIMEOUT_MS"), 1, &keepalive_ms);
    s->keepalive_requests = cfg->keepalive_requests;
    if (rc == 0 && s->keepalive_requests == 0) {
        unsigned long n = SHMIPC__SERVER_DEFAULT_KA_REQUESTS;
        rc = shmipc__env_number("SHMIPC_HTTP_KEEPALIVE_REQUESTS",
                                shmipc__getenv("SHMIPC_HTTP_KEEPALIVE_REQUESTS"), 1,
                                (unsigned long)SHMIPC__SERVER_MAX_KA_REQUESTS, "requests", &n);
        s->keepalive_requests = (uint32_t)n;
    }
    if (rc == 0 && !cfg->reuse_port_set) {
        unsigned long share = 0;
        rc = shmipc__env_number("SHMIPC_HTTP_REUSEPORT", shmipc__getenv("SHMIPC_HTTP_REUSEPORT"), 0,
                                1, "flags (1: share)", &share);
        s->cfg.reuse_port = (uint8_t)share;
    }
    if (rc < 0)
        goto err;
    s->header_ms = cfg->timeout_set[SHMIPC_SERVER_TIMEOUT_HEADER]
                       ? cfg->timeout_ms[SHMIPC_SERVER_TIMEOUT_HEADER]
                       : header_ms;
    s->idle_ms = cfg->timeout_set[SHMIPC_SERVER_TIMEOUT_KEEPALIVE]
                     ? cfg->timeout_ms[SHMIPC_SERVER_TIMEOUT_KEEPALIVE]
                     : keepalive_ms;
    s->stall_ms = s->idle_ms > 0 ? (uint32_t)s->idle_ms : SHMIPC__SERVER_DEFAULT_KEEPALIVE_MS;
    s->stop_ms = cfg->timeout_set[SHMIPC_SERVER_TIMEOUT_STOP]
                     ? cfg->timeout_ms[SHMIPC_SERVER_TIMEOUT_STOP]
                     : SHMIPC__SERVER_DEFAULT_STOP_MS;
    s->ws_ping_ms = cfg->timeout_ms[SHMIPC_SERVER_TIMEOUT_WS_PING] > 0
                        ? (uint32_t)cfg->timeout_ms[SHMIPC_SERVER_TIMEOUT_WS_PING]
                        : 0;
    s->ws_idle_ms = cfg->timeout_ms[SHMIPC_SERVER_TIMEOUT_WS_IDLE] > 0
                        ? (uint32_t)cfg->timeout_ms[SHMIPC_SERVER_TIMEOUT_WS_IDLE]
                        : 0;
    s->pipeline = cfg->pipeline != 0 ? cfg->pipeline : SHMIPC__HTTP_CONN_BUDGET;
    rc = shmipc__http_limits_resolve(&s->limits, &cfg->limits);
    if (rc < 0)
        goto err;
    {
        struct shmipc__ws_limits wl = {.max_message = cfg->ws_max_message,
                                       .tx_high_water = (size_t)cfg->ws_tx_high_water,
                                       .tx_limit = (size_t)cfg->ws_tx_limit};
        rc = shmipc__ws_limits_resolve(&s->ws_limits, &wl);
        if (rc < 0)
            goto err;
    }
    /* A head, a body with its chunk framing and trailers, and room for what the peer
     * pipelines behind them. */
    s->rx_max = (size_t)s->limits.max_head_bytes * 2 + (size_t)s->limits.max_body +
                s->limits.max_chunk_line + (64u << 10);
    s->server_name = s->cfg.server_name[0] != '\0' ? s->cfg.server_name : NULL;
    switch (cfg->backend) {
    case SHMIPC_BACKEND_DEFAULT:
        break;
    case SHMIPC_BACKEND_AUTO:
        s->loop_opts.backend = SHMIPC__BACKEND_AUTO;
        break;
    case SHMIPC_BACKEND_IO_URING:
        s->loop_opts.backend = SHMIPC__BACKEND_IO_URING;
        break;
    case SHMIPC_BACKEND_EPOLL:
        s->loop_opts.backend = SHMIPC__BACKEND_EPOLL;
        break;
    default:
        s->loop_opts.backend = SHMIPC__BACKEND_EPOLL;
        s->loop_opts.rx_epoll = SHMIPC__RX_ONESHOT;
        break;
    }
    /* Room for a frame head beside 16 KiB: a 16 KiB WebSocket message (16392 bytes as a
     * masked frame) then arrives in one receive and is delivered in place, not copied. */
    s->loop_opts.recv_buf_size = SHMIPC__SERVER_RECV_BUF;
    s->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->stop_fd < 0) {
        rc = shmipc__fail_errno(errno, "server_new: eventfd");
        goto err;
    }
    atomic_init(&s->stop_requested, 0);
    atomic_init(&s->closing, 0);
    atomic_init(&s->running, 0);
    free(defaults);
    *out = s;
    return 0;
err:
    shmipc__server_free(s);
    free(defaults);
    return rc;
}

static void server_shutdown(struct shmipc_server *s)
{
    if (s->workers == NULL)
        return;
    atomic_store(&s->closing, 1);
    /* Stops every loop; each worker's teardown drains its connections, in parallel. */
    shmipc__workers_free(s->workers);
    s->workers = NULL;
    memset(&s->stats, 0, sizeof s->stats);
    for (unsigned i = 0; i < s->nworkers; i++) {
        const struct shmipc__server_worker *w = &s->w[i];
        const uint64_t *from = (const uint64_t *)&w->stats.loop;
        uint64_t *to = (uint64_t *)&s->stats.loop;
        for (size_t k = 0; k < sizeof w->stats.loop / sizeof(uint64_t); k++)
            to[k] += from[k];
        s->stats.connections += w->stats.connections;
        s->stats.requests += w->stats.requests;
        s->stats.timeouts += w->stats.timeouts;
        s->stats.ws_upgrades += w->stats.ws_upgrades;
        s->stats.ws_pauses += w->stats.ws_pauses;
        s->stats.ws_pings += w->stats.ws_pings;
        s->stats.ws_idle_closes += w->stats.ws_idle_closes;
        s->stats.ws_stall_closes += w->stats.ws_stall_closes;
        s->stats.uploads += w->stats.uploads;
        s->stats.upload_bytes += w->stats.upload_bytes;
        if (w->stats.upload_rx_max > s->stats.upload_rx_max)
            s->stats.upload_rx_max = w->stats.upload_rx_max;
        if (w->stats.ws_tx_max > s->stats.ws_tx_max)
            s->stats.ws_tx_max = w->stats.ws_tx_max;
        shmipc__server_worker_free_pools(&s->w[i]);
    }
    free(s->w);
    s->w = NULL;
    s->nworkers = 0;
}

/*
 * `in_run`: called by shmipc__server_run(), which consumed the stop flag just before. A stop
 * that lands after that check sets `closing` and the flag again, and clearing `closing` here
 * must not undo it: the flag is read after the clear (both seq_cst), so either this load sees
 * the stop, or the stop's own store of `closing` comes after the clear. Either way the workers
 * start closing (answers say Connection: close, upgrades get 503) and run's wakeup ends them.
 */
static int server_start(struct shmipc_server *s, int in_run)
{
    struct shmipc__workers_opts o;
    unsigned count = s->cfg.workers;
    int rc;

    if (s->workers != NULL)
        return 0;
    if (count == 0) {
        rc = shmipc__workers_default(&count);
        if (rc < 0)
            return rc;
    }
    s->w = calloc(count, sizeof *s->w);
    if (s->w == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "server_start: %u workers", count);
    atomic_store(&s->closing, 0); /* a server stopped before may start again */
    if (in_run && atomic_load(&s->stop_requested))
        atomic_store(&s->closing, 1);
    s->nworkers = count;
    for (unsigned i = 0; i < count; i++) {
        s->w[i].srv = s;
        s->w[i].index = i;
    }
    memset(&o, 0, sizeof o);
    o.count = count;
    o.loop = &s->loop_opts;
    o.host = s->cfg.address;
    o.port = s->cfg.port;
    o.share_port = s->cfg.reuse_port;
    o.setup = shmipc__server_worker_setup;
    o.teardown = shmipc__server_worker_teardown;
    o.data = s;
    rc = shmipc__workers_start(&o, &s->workers);
    if (rc < 0) {
        for (unsigned i = 0; i < count; i++)
            shmipc__server_worker_free_pools(&s->w[i]);
        free(s->w);
        s->w = NULL;
        s->nworkers = 0;
        return rc;
    }
    s->port = shmipc__workers_port(s->workers);
    return 0;
}

void (*shmipc__server_run_window)(struct shmipc_server *s);

int shmipc__server_start(struct shmipc_server *s)
{
    return server_start(s, 0);
}

static void drain_stop_fd(struct shmipc_server *s)
{
    uint64_t n;
    while (read(s->stop_fd, &n, sizeof n) > 0)
        ;
}

int shmipc__server_run(struct shmipc_server *s)
{
    int rc = 0;
    if (atomic_exchange(&s->running, 1))
        return shmipc__fail(SHMIPC_EBUSY, "server_run: already running on another thread");
    if (atomic_exchange(&s->stop_requested, 0)) {
        /* Stopped before run got here: a server started meanwhile stops all the same. */
        drain_stop_fd(s);
        server_shutdown(s);
        goto out;
    }
    if (shmipc__server_run_window != NULL)
        shmipc__server_run_window(s);
    rc = server_start(s, 1);
    if (rc < 0)
        goto out;
    for (;;) {
        struct pollfd p = {.fd = s->stop_fd, .events = POLLIN};
        if (poll(&p, 1, -1) < 0 && errno != EINTR) {
            rc = shmipc__fail_errno(errno, "server_run: poll");
            break;
        }
        drain_stop_fd(s);
        if (atomic_exchange(&s->stop_requested, 0))
            break;
    }
    server_shutdown(s);
out:
    /* A stop asked while this run ran (a second one, say, while it was stopping) was for this
     * run: kept, it would end the next run() at once. One asked once run() returned is for
     * the next. */
    atomic_store(&s->stop_requested, 0);
    drain_stop_fd(s);
    atomic_store(&s->running, 0);
    return rc;
}

int shmipc__server_stop(struct shmipc_server *s)
{
    uint64_t one = 1;
    ssize_t n;
    atomic_store(&s->stop_requested, 1);
    atomic_store(&s->closing, 1);
    /* EAGAIN means the counter is saturated, which wakes run as well. */
    n = write(s->stop_fd, &one, sizeof one);
    (void)n;
    return 0;
}

void shmipc__server_stats(const struct shmipc_server *s, struct shmipc__server_stats *out)
{
    *out = s->stats;
}

void shmipc__server_free(struct shmipc_server *s)
{
    if (s == NULL)
        return;
    server_shutdown(s);
    for (size_t i = 0; i < s->nroutes; i++) {
        struct shmipc__route *rt = &s->routes[i];
        if (rt->destroy != NULL)
            rt->destroy(rt->user_data);
        free(rt->method);
        free(rt->path);
        free(rt->content_type);
        free(rt->body);
    }
    free(s->routes);
    for (size_t i = 0; i < s->nws_routes; i++)
        shmipc__server_ws_route_free(&s->ws_routes[i]);
    free(s->ws_routes);
    if (s->stop_fd >= 0)
        close(s->stop_fd);
    free(s);
}
