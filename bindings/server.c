/*
 * Exported server, request and response calls: argument checks, then the core. The
 * behaviour is documented in shmipc.h and implemented in core/net/server*.c.
 */
#include "shmipc.h"

#include "common/error.h"
#include "net/server.h"

#include <stdlib.h>
#include <string.h>

#define REQUIRE(cond, fn, what)                                                                    \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return shmipc__fail(SHMIPC_EINVAL, fn ": " what " is NULL");                           \
    } while (0)

/* Request getters never fail: on NULL they answer "nothing". */
#define STR_OUT(len, ptr, n)                                                                       \
    do {                                                                                           \
        if ((len) != NULL)                                                                         \
            *(len) = (n);                                                                          \
        return (ptr);                                                                              \
    } while (0)

/* ---- config ---- */

SHMIPC_API int shmipc_server_config_new(shmipc_server_config **out)
{
    REQUIRE(out, "server_config_new", "out");
    return shmipc__server_config_new(out);
}

SHMIPC_API void shmipc_server_config_free(shmipc_server_config *cfg)
{
    free(cfg);
}

SHMIPC_API int shmipc_server_config_set_address(shmipc_server_config *cfg, const char *address)
{
    REQUIRE(cfg, "server_config_set_address", "config");
    REQUIRE(address, "server_config_set_address", "address");
    return shmipc__server_config_set_address(cfg, address);
}

SHMIPC_API int shmipc_server_config_set_port(shmipc_server_config *cfg, int port)
{
    REQUIRE(cfg, "server_config_set_port", "config");
    if (port < 0 || port > 65535)
        return shmipc__fail(SHMIPC_EINVAL, "port: %d is outside 0..65535", port);
    cfg->port = (uint16_t)port;
    return 0;
}

SHMIPC_API int shmipc_server_config_set_workers(shmipc_server_config *cfg, unsigned workers)
{
    REQUIRE(cfg, "server_config_set_workers", "config");
    if (workers > 1024)
        return shmipc__fail(SHMIPC_EINVAL, "workers: %u is outside 1..1024 (0: default)", workers);
    cfg->workers = workers;
    return 0;
}

SHMIPC_API int shmipc_server_config_set_backend(shmipc_server_config *cfg, int backend)
{
    REQUIRE(cfg, "server_config_set_backend", "config");
    if (backend < SHMIPC_BACKEND_DEFAULT || backend > SHMIPC_BACKEND_EPOLL_ONESHOT)
        return shmipc__fail(SHMIPC_EINVAL, "backend: %d is not a shmipc_backend", backend);
    cfg->backend = backend;
    return 0;
}

SHMIPC_API int shmipc_server_config_set_timeout_ms(shmipc_server_config *cfg, int which,
                                                   uint32_t ms)
{
    REQUIRE(cfg, "server_config_set_timeout_ms", "config");
    return shmipc__server_config_set_timeout_ms(cfg, which, ms);
}

SHMIPC_API int shmipc_server_config_set_timeout(shmipc_server_config *cfg, int which,
                                                int timeout_ms)
{
    REQUIRE(cfg, "server_config_set_timeout", "config");
    return shmipc__server_config_set_timeout(cfg, which, timeout_ms);
}

SHMIPC_API int shmipc_server_config_set_limit(shmipc_server_config *cfg, int which, uint64_t value)
{
    REQUIRE(cfg, "server_config_set_limit", "config");
    return shmipc__server_config_set_limit(cfg, which, value);
}

SHMIPC_API int shmipc_server_config_set_server_name(shmipc_server_config *cfg, const char *name)
{
    REQUIRE(cfg, "server_config_set_server_name", "config");
    return shmipc__server_config_set_server_name(cfg, name);
}

SHMIPC_API int shmipc_server_config_set_reuse_port(shmipc_server_config *cfg, int share)
{
    REQUIRE(cfg, "server_config_set_reuse_port", "config");
    if (share != 0 && share != 1)
        return shmipc__fail(SHMIPC_EINVAL, "reuse_port: %d is not 0 or 1", share);
    cfg->reuse_port = (uint8_t)share;
    cfg->reuse_port_set = 1;
    return 0;
}

/* ---- server ---- */

SHMIPC_API int shmipc_server_new(const shmipc_server_config *cfg, shmipc_server **out)
{
    REQUIRE(out, "server_new", "out");
    return shmipc__server_new(cfg, out);
}

SHMIPC_API int shmipc_server_route(shmipc_server *s, const char *method, const char *path,
                                   shmipc_http_handler fn, void *user_data,
                                   shmipc_destroy_cb destroy)
{
    const char *missing = s == NULL ? "server" : path == NULL ? "path" : fn == NULL ? "fn" : NULL;
    if (missing != NULL) {
        if (destroy != NULL)
            destroy(user_data);
        return shmipc__fail(SHMIPC_EINVAL, "server_route: %s is NULL", missing);
    }
    return shmipc__server_route(s, method, path, fn, user_data, destroy, 0, NULL, NULL, 0);
}

SHMIPC_API int shmipc_server_static(shmipc_server *s, const char *method, const char *path,
                                    int status, const char *content_type, const void *body,
                                    size_t len)
{
    REQUIRE(s, "server_static", "server");
    REQUIRE(path, "server_static", "path");
    REQUIRE(body || len == 0, "server_static", "body");
    return shmipc__server_route(s, method != NULL ? method : "GET", path, NULL, NULL, NULL, status,
                                content_type, body, len);
}

SHMIPC_API int shmipc_server_start(shmipc_server *s)
{
    REQUIRE(s, "server_start", "server");
    return shmipc__server_start(s);
}

SHMIPC_API int shmipc_server_run(shmipc_server *s)
{
    REQUIRE(s, "server_run", "server");
    return shmipc__server_run(s);
}

SHMIPC_API int shmipc_server_stop(shmipc_server *s)
{
    /* No detail on NULL: formatting it is not async-signal-safe. */
    if (s == NULL)
        return SHMIPC_EINVAL;
    return shmipc__server_stop(s);
}

SHMIPC_API int shmipc_server_port(const shmipc_server *s)
{
    REQUIRE(s, "server_port", "server");
    if (s->workers == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "server_port: the server is not running");
    return s->port;
}

SHMIPC_API const char *shmipc_server_backend(const shmipc_server *s)
{
    return s != NULL ? s->backend_name : NULL;
}

SHMIPC_API void shmipc_server_close(shmipc_server *s)
{
    shmipc__server_free(s);
}

/* The name before the _close/_free rule (deprecated): the same call. */
SHMIPC_API void shmipc_server_free(shmipc_server *s)
{
    shmipc__server_free(s);
}

/* ---- request ---- */

SHMIPC_API const char *shmipc_http_request_method(const shmipc_http_request *req, size_t *len)
{
    if (req == NULL)
        STR_OUT(len, NULL, 0);
    STR_OUT(len, shmipc__http_at(req->r, req->r->name), req->r->name.len);
}

SHMIPC_API const char *shmipc_http_request_path(const shmipc_http_request *req, size_t *len)
{
    if (req == NULL)
        STR_OUT(len, NULL, 0);
    STR_OUT(len, shmipc__http_at(req->r, req->r->path), req->r->path.len);
}

SHMIPC_API const char *shmipc_http_request_query(const shmipc_http_request *req, size_t *len)
{
    const char *t, *q;
    if (req == NULL)
        STR_OUT(len, NULL, 0);
    t = shmipc__http_at(req->r, req->r->target);
    q = memchr(t, '?', req->r->target.len);
    if (q == NULL)
        STR_OUT(len, NULL, 0);
    STR_OUT(len, q + 1, req->r->target.len - (size_t)(q + 1 - t));
}

SHMIPC_API const char *shmipc_http_request_wildcard(const shmipc_http_request *req, size_t *len)
{
    if (req == NULL)
        STR_OUT(len, NULL, 0);
    if (req->wild_len == 0)
        STR_OUT(len, "", 0);
    STR_OUT(len, req->r->base + req->wild_off, req->wild_len);
}

SHMIPC_API const char *shmipc_http_request_header(const shmipc_http_request *req, const char *name,
                                                  size_t *len)
{
    int i;
    if (req == NULL || name == NULL)
        STR_OUT(len, NULL, 0);
    i = shmipc__http_find_header(req->r, name, strlen(name), 0);
    if (i < 0)
        STR_OUT(len, NULL, 0);
    STR_OUT(len, shmipc__http_at(req->r, req->r->fields[i].value), req->r->fields[i].value.len);
}

SHMIPC_API size_t shmipc_http_request_header_count(const shmipc_http_request *req)
{
    return req != NULL ? req->r->nfields : 0;
}

SHMIPC_API const char *shmipc_http_request_header_at(const shmipc_http_request *req, size_t i,
                                                     const char **name, size_t *name_len,
                                                     size_t *len)
{
    const struct shmipc__http_field *f;
    if (req == NULL || i >= req->r->nfields) {
        if (name != NULL)
            *name = NULL;
        if (name_len != NULL)
            *name_len = 0;
        STR_OUT(len, NULL, 0);
    }
    f = &req->r->fields[i];
    if (name != NULL)
        *name = shmipc__http_at(req->r, f->name);
    if (name_len != NULL)
        *name_len = f->name.len;
    STR_OUT(len, shmipc__http_at(req->r, f->value), f->value.len);
}

SHMIPC_API const char *shmipc_http_request_body(const shmipc_http_request *req, size_t *len)
{
    if (req == NULL)
        STR_OUT(len, NULL, 0);
    if (req->body_len == 0)
        STR_OUT(len, "", 0);
    STR_OUT(len, req->body, req->body_len);
}

SHMIPC_API int shmipc_http_request_version(const shmipc_http_request *req)
{
    REQUIRE(req, "http_request_version", "request");
    return req->r->minor == 0 ? 10 : 11;
}

SHMIPC_API int shmipc_http_request_peer(const shmipc_http_request *req, struct sockaddr *addr,
                                        socklen_t *len)
{
    REQUIRE(req != NULL && addr != NULL && len != NULL, "http_request_peer", "an argument");
    return shmipc__server_request_addr(req, 0, addr, len);
}

SHMIPC_API int shmipc_http_request_local(const shmipc_http_request *req, struct sockaddr *addr,
                                         socklen_t *len)
{
    REQUIRE(req != NULL && addr != NULL && len != NULL, "http_request_local", "an argument");
    return shmipc__server_request_addr(req, 1, addr, len);
}

/* ---- response ---- */

#define REQUIRE_OPEN(res, fn)                                                                      \
    do {                                                                                           \
        REQUIRE(res, fn, "response");                                                              \
        if ((res)->ended)                                                                          \
            return shmipc__fail(SHMIPC_EBUSY, fn ": the response has ended");                      \
    } while (0)

SHMIPC_API int shmipc_http_response_set_status(shmipc_http_response *res, int status)
{
    REQUIRE_OPEN(res, "http_response_set_status");
    if (status < 200 || status > 999)
        return shmipc__fail(SHMIPC_EINVAL, "http_response_set_status: %d is outside 200..999",
                            status);
    res->r->status = (uint16_t)status;
    return 0;
}

SHMIPC_API int shmipc_http_response_add_header(shmipc_http_response *res, const char *name,
                                               const char *value)
{
    REQUIRE_OPEN(res, "http_response_add_header");
    REQUIRE(name && value, "http_response_add_header", "name or value");
    return shmipc__http_response_add_header(res, name, value);
}

SHMIPC_API int shmipc_http_response_body(shmipc_http_response *res, const void *data, size_t len)
{
    REQUIRE_OPEN(res, "http_response_body");
    REQUIRE(data || len == 0, "http_response_body", "data");
    return shmipc__http_response_body(res, data, len, NULL, NULL, 0);
}

SHMIPC_API int shmipc_http_response_body_borrow(shmipc_http_response *res, const void *data,
                                                size_t len, void *user_data,
                                                shmipc_destroy_cb release)
{
    if (res == NULL || res->ended || (data == NULL && len > 0)) {
        if (release != NULL)
            release(user_data);
        if (res != NULL && res->ended)
            return shmipc__fail(SHMIPC_EBUSY, "http_response_body_borrow: the response has ended");
        return shmipc__fail(SHMIPC_EINVAL, "http_response_body_borrow: %s is NULL",
                            res == NULL ? "response" : "data");
    }
    return shmipc__http_response_body(res, data, len, user_data, release, 1);
}

SHMIPC_API int shmipc_http_response_end(shmipc_http_response *res)
{
    REQUIRE(res, "http_response_end", "response");
    res->ended = 1;
    return 0;
}

/* ---- answers from any thread ---- */

SHMIPC_API int shmipc_http_response_defer(shmipc_http_response *res, int timeout_ms,
                                          shmipc_http_pending_cb on_end, void *user_data,
                                          shmipc_http_pending **out)
{
    REQUIRE(out, "http_response_defer", "out");
    *out = NULL;
    REQUIRE(res, "http_response_defer", "response");
    return shmipc__pending_new(res, timeout_ms, on_end, user_data, (struct shmipc__pending **)out);
}

SHMIPC_API int shmipc_http_pending_set_status(shmipc_http_pending *p, int status)
{
    REQUIRE(p, "http_pending_set_status", "pending answer");
    return shmipc__pending_set_status((struct shmipc__pending *)p, status);
}

SHMIPC_API int shmipc_http_pending_add_header(shmipc_http_pending *p, const char *name,
                                              const char *value)
{
    REQUIRE(p, "http_pending_add_header", "pending answer");
    REQUIRE(name && value, "http_pending_add_header", "name or value");
    return shmipc__pending_add_header((struct shmipc__pending *)p, name, value);
}

SHMIPC_API int shmipc_http_pending_body(shmipc_http_pending *p, const void *data, size_t len)
{
    REQUIRE(p, "http_pending_body", "pending answer");
    REQUIRE(data || len == 0, "http_pending_body", "data");
    return shmipc__pending_body((struct shmipc__pending *)p, data, len, NULL, NULL, 0);
}

SHMIPC_API int shmipc_http_pending_body_borrow(shmipc_http_pending *p, const void *data, size_t len,
                                               void *user_data, shmipc_destroy_cb release)
{
    if (p == NULL || (data == NULL && len > 0)) {
        if (release != NULL)
            release(user_data);
        return shmipc__fail(SHMIPC_EINVAL, "http_pending_body_borrow: %s is NULL",
                            p == NULL ? "pending answer" : "data");
    }
    return shmipc__pending_body((struct shmipc__pending *)p, data, len, user_data, release, 1);
}

SHMIPC_API int shmipc_http_pending_send(shmipc_http_pending *p)
{
    REQUIRE(p, "http_pending_send", "pending answer");
    return shmipc__pending_send((struct shmipc__pending *)p);
}

SHMIPC_API int shmipc_http_pending_waiting(const shmipc_http_pending *p)
{
    return p != NULL && shmipc__pending_waiting((const struct shmipc__pending *)p);
}

SHMIPC_API void shmipc_http_pending_free(shmipc_http_pending *p)
{
    if (p != NULL)
        shmipc__pending_free((struct shmipc__pending *)p);
}
