/*
 * The HTTP server's routing and the handler-facing response API: route and WebSocket route
 * registration, matching a request to its route (404/405/501, static bodies, handlers), and
 * the shmipc_http_response calls a handler makes. Owns the route tables of struct
 * shmipc_server (server.h).
 * May call: common/, the writer's response struct (http_writer.h), and the WebSocket
 * upgrade (shmipc__server_ws_upgrade(), server_ws.c) for a request on a WebSocket route.
 */
#include "net/server_int.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---------------------------------------------------------------------------------------- */
/* Routing */

static int method_matches(const struct shmipc__route *rt, const struct shmipc__http_request *req)
{
    const char *m = shmipc__http_at(req, req->name);
    if (rt->method == NULL)
        return 1;
    if (req->name.len == rt->method_len && memcmp(m, rt->method, rt->method_len) == 0)
        return 1;
    /* A GET route answers HEAD; the writer leaves the body out. */
    return req->method == SHMIPC__HTTP_HEAD && rt->method_len == 3 &&
           memcmp(rt->method, "GET", 3) == 0;
}

static int path_matches(const struct shmipc__route *rt, const char *path, size_t len)
{
    if (!rt->prefix)
        return len == rt->path_len && memcmp(path, rt->path, len) == 0;
    return len >= rt->path_len && memcmp(path, rt->path, rt->path_len) == 0;
}

/*
 * The route for the request: exact paths first, then the longest prefix. *path_known tells a
 * 405 (some route has the path) from a 404.
 */
static const struct shmipc__route *
find_route(const struct shmipc_server *s, const struct shmipc__http_request *req, int *path_known)
{
    const char *path = shmipc__http_at(req, req->path);
    size_t len = req->path.len;
    const struct shmipc__route *best = NULL;
    *path_known = 0;
    for (size_t i = 0; i < s->nroutes; i++) {
        const struct shmipc__route *rt = &s->routes[i];
        if (!path_matches(rt, path, len))
            continue;
        *path_known = 1;
        if (!method_matches(rt, req))
            continue;
        if (!rt->prefix)
            return rt;
        if (best == NULL || rt->path_len > best->path_len)
            best = rt;
    }
    return best;
}

/* "GET, HEAD, POST": the methods of the routes that have this path. */
static const char *allow_list(struct shmipc__server_worker *w,
                              const struct shmipc__http_request *req, uint32_t *len)
{
    const struct shmipc_server *s = w->srv;
    const char *path = shmipc__http_at(req, req->path);
    size_t n = 0;
    int get = 0, head = 0;
    for (size_t i = 0; i < s->nroutes; i++) {
        const struct shmipc__route *rt = &s->routes[i];
        if (!path_matches(rt, path, req->path.len) || rt->method == NULL)
            continue;
        if (rt->method_len == 3 && memcmp(rt->method, "GET", 3) == 0)
            get = 1;
        if (rt->method_len == 4 && memcmp(rt->method, "HEAD", 4) == 0) {
            if (head)
                continue;
            head = 1;
        }
        if (n + rt->method_len + 2 > sizeof w->allow)
            break;
        if (n > 0) {
            memcpy(w->allow + n, ", ", 2);
            n += 2;
        }
        memcpy(w->allow + n, rt->method, rt->method_len);
        n += rt->method_len;
    }
    if (get && !head && n + 6 <= sizeof w->allow) {
        memcpy(w->allow + n, ", HEAD", 6);
        n += 6;
    }
    *len = (uint32_t)n;
    return w->allow;
}

/* A canned status that keeps the connection open, unless the request closes it. */
void shmipc__server_canned(struct shmipc__http_response *resp, int status)
{
    uint16_t close = resp->flags & SHMIPC__HTTP_RESP_CLOSE;
    shmipc__http_response_error(resp, status);
    resp->flags = (uint16_t)((resp->flags & ~SHMIPC__HTTP_RESP_CLOSE) | close);
}

static const struct shmipc__ws_route *find_ws_route(const struct shmipc_server *s,
                                                    const struct shmipc__http_request *req)
{
    const char *path = shmipc__http_at(req, req->path);
    size_t len = req->path.len;
    const struct shmipc__ws_route *best = NULL;
    for (size_t i = 0; i < s->nws_routes; i++) {
        const struct shmipc__ws_route *rt = &s->ws_routes[i];
        if (!rt->prefix) {
            if (len == rt->path_len && memcmp(path, rt->path, len) == 0)
                return rt;
        } else if (len >= rt->path_len && memcmp(path, rt->path, rt->path_len) == 0 &&
                   (best == NULL || rt->path_len > best->path_len)) {
            best = rt;
        }
    }
    return best;
}

/* http_conn's at_head question: a request with a body whose route takes it in pieces. */
int shmipc__server_at_head(void *user_data, const struct shmipc__http_request *req)
{
    struct server_conn *sc = user_data;
    int path_known;
    const struct shmipc__route *rt = find_route(sc->w->srv, req, &path_known);
    /* A WebSocket path keeps its handshake (which refuses a body) as shmipc__server_handle. */
    return rt != NULL && rt->at_head && find_ws_route(sc->w->srv, req) == NULL;
}

int shmipc__server_handle(void *user_data, const struct shmipc__http_request *req, const char *body,
                          size_t body_len, struct shmipc__http_response *resp)
{
    struct server_conn *sc = user_data;
    struct shmipc__server_worker *w = sc->w;
    const struct shmipc__route *rt;
    const struct shmipc__ws_route *wsr;
    int path_known;
    int rc = 0;

    w->stats.requests++;
    sc->nreq++; /* at most keepalive_requests: the one that reaches it closes */
    rt = find_route(w->srv, req, &path_known);
    wsr = find_ws_route(w->srv, req);
    /* A plain GET keeps its route; every other request on a WebSocket path is a handshake,
     * which answers 400/426 when it is not a valid one. */
    if (wsr != NULL && (rt == NULL || shmipc__ws_is_upgrade(req)))
        return shmipc__server_ws_upgrade(sc, wsr, req, body, body_len, resp);
    if (rt == NULL) {
        if (req->flags & SHMIPC__HTTP_UNKNOWN_METHOD) {
            shmipc__server_canned(resp, 501);
        } else if (path_known) {
            shmipc__server_canned(resp, 405);
            w->hdrs[0].name = "Allow";
            w->hdrs[0].name_len = 5;
            w->hdrs[0].value = allow_list(w, req, &w->hdrs[0].value_len);
            resp->headers = w->hdrs;
            resp->nheaders = 1;
        } else {
            shmipc__server_canned(resp, 404);
        }
    } else if (rt->fn == NULL) {
        resp->status = rt->status;
        resp->content_type = rt->content_type;
        resp->body = rt->body;
        resp->body_len = rt->body_len;
    } else {
        struct shmipc_http_request preq = {req, body, body_len, 0, 0, sc};
        struct shmipc_http_response pres = {resp, w, sc, 0, 0, 0, 0};
        if (rt->prefix) {
            preq.wild_off = req->path.off + (uint32_t)rt->path_len;
            preq.wild_len = req->path.len - (uint32_t)rt->path_len;
        }
        w->hused = 0;
        resp->headers = w->hdrs;
        resp->nheaders = 0;
        w->in_handler++;
        rc = rt->fn(&preq, &pres, rt->user_data);
        w->in_handler--;
        if (pres.deferred) {
            if (rc == 0)
                return SHMIPC__HTTP_DEFER;
            /* Failed after deferring: answered 500 now, and the deferral ends. */
            shmipc__server_defer_cancel(sc, SHMIPC__SERVER_CANCEL_ERROR);
        }
    }
    /* A stop ends keep-alive with the answer to the request in progress (also one asked while
     * this handler ran); a keep-alive timeout of 0 ends it after every answer (nginx's
     * keepalive_timeout 0); the connection's keepalive_requests-th request ends it after its
     * answer, and requests pipelined behind it are not read (nginx). */
    if (shmipc__server_keep_off(sc))
        resp->flags |= SHMIPC__HTTP_RESP_CLOSE;
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* The response API */

static int header_is(const char *name, const char *what)
{
    return strcasecmp(name, what) == 0;
}

static int is_token(const char *s)
{
    if (*s == '\0')
        return 0;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              strchr("!#$%&'*+-.^_`|~", c)))
            return 0;
    }
    return 1;
}

int shmipc__http_header_check(const char *name, const char *value, int *kind, uint64_t *length)
{
    size_t vlen = strlen(value);
    if (!is_token(name))
        return shmipc__fail(SHMIPC_EINVAL, "response header \"%s\": the name is not a token", name);
    for (size_t i = 0; i < vlen; i++) {
        unsigned char c = (unsigned char)value[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return shmipc__fail(SHMIPC_EINVAL, "response header %s: the value has a control byte",
                                name);
    }
    if (header_is(name, "Content-Length")) {
        if (vlen == 0 || vlen > 19 || strspn(value, "0123456789") != vlen)
            return shmipc__fail(SHMIPC_EINVAL,
                                "response header Content-Length: \"%s\" is not a length", value);
        *length = strtoull(value, NULL, 10);
        *kind = SHMIPC__HEADER_LENGTH;
        return 0;
    }
    if (header_is(name, "Transfer-Encoding") || header_is(name, "Date") ||
        header_is(name, "Server"))
        return shmipc__fail(SHMIPC_EINVAL, "response header %s: set by the server", name);
    *kind = SHMIPC__HEADER_PLAIN;
    if (header_is(name, "Connection")) {
        if (strcasecmp(value, "close") != 0)
            return shmipc__fail(SHMIPC_EINVAL,
                                "response header Connection: only \"close\" may be set");
        *kind = SHMIPC__HEADER_CLOSE;
    } else if (header_is(name, "Content-Type")) {
        *kind = SHMIPC__HEADER_TYPE;
    }
    return 0;
}

int shmipc__http_response_add_header(struct shmipc_http_response *res, const char *name,
                                     const char *value)
{
    struct shmipc__server_worker *w = res->w;
    struct shmipc__http_response *r = res->r;
    size_t nlen = strlen(name), vlen = strlen(value);
    char *p;
    int kind;
    uint64_t length = 0;
    int rc = shmipc__http_header_check(name, value, &kind, &length);
    if (rc < 0)
        return rc;
    if (kind == SHMIPC__HEADER_CLOSE) {
        r->flags |= SHMIPC__HTTP_RESP_CLOSE;
        return 0;
    }
    if (kind == SHMIPC__HEADER_LENGTH) {
        /* The server frames every body itself; an answer to HEAD has none, and may say the
         * length GET's would have (the writer sends body_len, never the body, for HEAD). */
        if (!(r->flags & SHMIPC__HTTP_RESP_HEAD))
            return shmipc__fail(SHMIPC_EINVAL, "response header Content-Length: set by the "
                                               "server (but on an answer to HEAD)");
        if (res->head_length)
            return shmipc__fail(SHMIPC_EINVAL, "response header Content-Length: already set");
        res->head_length = 1;
        r->body = NULL;
        r->body_len = (size_t)length;
        return 0;
    }
    if (kind == SHMIPC__HEADER_TYPE && res->has_type)
        return shmipc__fail(SHMIPC_EINVAL, "response header Content-Type: already set");
    if (w->hused + nlen + vlen + 1 > sizeof w->hbytes ||
        (kind != SHMIPC__HEADER_TYPE && r->nheaders >= SHMIPC__SERVER_MAX_RESP_HEADERS))
        return shmipc__fail(SHMIPC_ENOSPC, "response header %s: more than %u headers or %u bytes",
                            name, SHMIPC__SERVER_MAX_RESP_HEADERS,
                            SHMIPC__SERVER_RESP_HEADER_BYTES);
    p = w->hbytes + w->hused;
    memcpy(p, name, nlen);
    memcpy(p + nlen, value, vlen + 1);
    w->hused += nlen + vlen + 1;
    if (kind == SHMIPC__HEADER_TYPE) {
        r->content_type = p + nlen;
        res->has_type = 1;
        return 0;
    }
    w->hdrs[r->nheaders].name = p;
    w->hdrs[r->nheaders].name_len = (uint32_t)nlen;
    w->hdrs[r->nheaders].value = p + nlen;
    w->hdrs[r->nheaders].value_len = (uint32_t)vlen;
    r->nheaders++;
    return 0;
}

int shmipc__http_response_body(struct shmipc_http_response *res, const void *data, size_t len,
                               void *user_data, shmipc_destroy_cb release, int borrow)
{
    struct server_conn *sc = res->conn;
    struct release *node;
    if (borrow) {
        node = malloc(sizeof *node);
        if (node == NULL) {
            if (release != NULL)
                release(user_data);
            return shmipc__fail(SHMIPC_ENOMEM, "response body: out of memory");
        }
        node->fn = release;
        node->user_data = user_data;
        /* An answer to HEAD that said GET's length keeps it: the body is only released. */
        if (!res->head_length) {
            res->r->body = data;
            res->r->body_len = len;
        }
    } else if (res->head_length) {
        return 0; /* an answer to HEAD that said GET's length: nothing of the body is kept */
    } else if (len <= sizeof res->w->body) {
        /* The batch copies a body this small behind its head (its arena keeps room). */
        if (len > 0)
            memcpy(res->w->body, data, len);
        res->r->body = res->w->body;
        res->r->body_len = len;
        return 0;
    } else {
        node = malloc(sizeof *node + len);
        if (node == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "response body: %zu bytes", len);
        node->fn = NULL;
        node->user_data = NULL;
        memcpy(node + 1, data, len);
        res->r->body = node + 1;
        res->r->body_len = len;
    }
    node->next = sc->releases;
    sc->releases = node;
    return 0;
}

static int valid_route_path(const char *path, size_t len, int *prefix)
{
    *prefix = len >= 2 && path[len - 1] == '*' && path[len - 2] == '/';
    if (len == 0 || path[0] != '/')
        return shmipc__fail(SHMIPC_EINVAL, "route path \"%s\" does not start with '/'", path);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)path[i];
        if (c <= 0x20 || c >= 0x7f || c == '?' || (c == '*' && !(*prefix && i == len - 1)))
            return shmipc__fail(SHMIPC_EINVAL,
                                "route path \"%s\": byte %zu is not allowed (visible ASCII, no "
                                "'?', '*' only as a final \"/*\")",
                                path, i);
    }
    return 0;
}

int shmipc__server_route(struct shmipc_server *s, const char *method, const char *path,
                         shmipc_http_handler fn, void *user_data, shmipc_destroy_cb destroy,
                         int status, const char *content_type, const void *body, size_t len)
{
    struct shmipc__route rt;
    size_t plen = strlen(path);
    int rc;

    memset(&rt, 0, sizeof rt);
    if (s->workers != NULL) {
        rc = shmipc__fail(SHMIPC_EBUSY, "route %s: the server is running", path);
        goto err;
    }
    if (method != NULL && !is_token(method)) {
        rc = shmipc__fail(SHMIPC_EINVAL, "route %s: method \"%s\" is not a token", path, method);
        goto err;
    }
    rc = valid_route_path(path, plen, &rt.prefix);
    if (rc < 0)
        goto err;
    if (fn == NULL) {
        if (status < 200 || status > 999) {
            rc = shmipc__fail(SHMIPC_EINVAL, "static %s: status %d is outside 200..999", path,
                              status);
            goto err;
        }
        if (content_type != NULL)
            for (const char *p = content_type; *p; p++)
                if (((unsigned char)*p < 0x20 && *p != '\t') || *p == 0x7f) {
                    rc = shmipc__fail(SHMIPC_EINVAL, "static %s: content type has a control byte",
                                      path);
                    goto err;
                }
    }
    if (rt.prefix)
        plen--; /* a prefix route is stored without its final star */
    for (size_t i = 0; i < s->nroutes; i++) {
        const struct shmipc__route *o = &s->routes[i];
        int same_method = (o->method == NULL && method == NULL) ||
                          (o->method != NULL && method != NULL && strcmp(o->method, method) == 0);
        if (same_method && o->prefix == rt.prefix && o->path_len == plen &&
            memcmp(o->path, path, plen) == 0) {
            rc = shmipc__fail(SHMIPC_EEXIST, "route %s %s: already registered",
                              method ? method : "*", path);
            goto err;
        }
    }
    if (s->nroutes == s->routes_cap) {
        size_t cap = s->routes_cap ? s->routes_cap * 2 : 8;
        struct shmipc__route *grown = realloc(s->routes, cap * sizeof *grown);
        if (grown == NULL) {
            rc = shmipc__fail(SHMIPC_ENOMEM, "route %s: out of memory", path);
            goto err;
        }
        s->routes = grown;
        s->routes_cap = cap;
    }
    rt.method = method != NULL ? strdup(method) : NULL;
    rt.method_len = method != NULL ? strlen(method) : 0;
    rt.path = strndup(path, plen);
    rt.path_len = plen;
    rt.fn = fn;
    rt.user_data = user_data;
    rt.destroy = destroy;
    rt.status = (uint16_t)status;
    if (fn == NULL) {
        rt.content_type = content_type != NULL ? strdup(content_type) : NULL;
        rt.body = malloc(len > 0 ? len : 1);
        if (rt.body != NULL && len > 0)
            memcpy(rt.body, body, len);
        rt.body_len = len;
    }
    if ((method != NULL && rt.method == NULL) || rt.path == NULL ||
        (fn == NULL && (rt.body == NULL || (content_type != NULL && rt.content_type == NULL)))) {
        free(rt.method);
        free(rt.path);
        free(rt.content_type);
        free(rt.body);
        rc = shmipc__fail(SHMIPC_ENOMEM, "route %s: out of memory", path);
        goto err;
    }
    s->routes[s->nroutes++] = rt;
    return 0;
err:
    if (destroy != NULL)
        destroy(user_data);
    return rc;
}

int shmipc__server_route_at_head(struct shmipc_server *s, const char *method, const char *path)
{
    size_t plen;
    int prefix;
    if (s == NULL || path == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "route_at_head: NULL argument");
    if (s->workers != NULL)
        return shmipc__fail(SHMIPC_EBUSY, "route_at_head %s: the server is running", path);
    plen = strlen(path);
    if (valid_route_path(path, plen, &prefix) < 0)
        return SHMIPC_EINVAL;
    if (prefix)
        plen--;
    for (size_t i = 0; i < s->nroutes; i++) {
        struct shmipc__route *o = &s->routes[i];
        int same_method = (o->method == NULL && method == NULL) ||
                          (o->method != NULL && method != NULL && strcmp(o->method, method) == 0);
        if (!same_method || o->prefix != prefix || o->path_len != plen ||
            memcmp(o->path, path, plen) != 0)
            continue;
        if (o->fn == NULL)
            return shmipc__fail(SHMIPC_EINVAL, "route_at_head %s: a static response", path);
        if (!o->at_head)
            s->at_head_routes++;
        o->at_head = 1;
        return 0;
    }
    return shmipc__fail(SHMIPC_ENOENT, "route_at_head %s %s: no such route", method ? method : "*",
                        path);
}

void shmipc__server_ws_route_free(struct shmipc__ws_route *rt)
{
    if (rt->destroy != NULL)
        rt->destroy(rt->user_data);
    for (size_t i = 0; i < rt->nprotocols; i++)
        free(rt->protocols[i]);
    free(rt->protocols);
    free(rt->path);
}

/* Splits "chat, superchat" into tokens. Returns 0 or SHMIPC_EINVAL/SHMIPC_ENOMEM. */
static int ws_protocols(struct shmipc__ws_route *rt, const char *list)
{
    const char *p = list;
    while (*p != '\0') {
        const char *a, *z;
        char *tok, **grown;
        while (*p == ' ' || *p == '\t')
            p++;
        a = p;
        while (*p != '\0' && *p != ',')
            p++;
        z = p;
        while (z > a && (z[-1] == ' ' || z[-1] == '\t'))
            z--;
        if (*p == ',')
            p++;
        tok = strndup(a, (size_t)(z - a));
        if (tok == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "websocket %s: subprotocols", rt->path);
        if (!is_token(tok)) {
            free(tok);
            return shmipc__fail(SHMIPC_EINVAL,
                                "websocket %s: subprotocols \"%s\": element %zu is not a token",
                                rt->path, list, rt->nprotocols + 1);
        }
        grown = realloc(rt->protocols, (rt->nprotocols + 1) * sizeof *grown);
        if (grown == NULL) {
            free(tok);
            return shmipc__fail(SHMIPC_ENOMEM, "websocket %s: subprotocols", rt->path);
        }
        rt->protocols = grown;
        rt->protocols[rt->nprotocols++] = tok;
    }
    return 0;
}

int shmipc__server_websocket(struct shmipc_server *s, const char *path, const char *subprotocols,
                             shmipc_ws_open_cb on_open, shmipc_ws_message_cb on_message,
                             shmipc_ws_close_cb on_close, void *user_data,
                             shmipc_destroy_cb destroy)
{
    struct shmipc__ws_route rt;
    size_t plen = strlen(path);
    int rc;

    memset(&rt, 0, sizeof rt);
    if (s->workers != NULL) {
        rc = shmipc__fail(SHMIPC_EBUSY, "websocket %s: the server is running", path);
        goto err;
    }
    rc = valid_route_path(path, plen, &rt.prefix);
    if (rc < 0)
        goto err;
    if (rt.prefix)
        plen--;
    for (size_t i = 0; i < s->nws_routes; i++) {
        const struct shmipc__ws_route *o = &s->ws_routes[i];
        if (o->prefix == rt.prefix && o->path_len == plen && memcmp(o->path, path, plen) == 0) {
            rc = shmipc__fail(SHMIPC_EEXIST, "websocket %s: already registered", path);
            goto err;
        }
    }
    rt.path = strndup(path, plen);
    rt.path_len = plen;
    if (rt.path == NULL) {
        rc = shmipc__fail(SHMIPC_ENOMEM, "websocket %s: out of memory", path);
        goto err;
    }
    if (subprotocols != NULL) {
        rc = ws_protocols(&rt, subprotocols);
        if (rc < 0)
            goto err;
    }
    if (s->nws_routes == s->ws_routes_cap) {
        size_t cap = s->ws_routes_cap ? s->ws_routes_cap * 2 : 4;
        struct shmipc__ws_route *grown = realloc(s->ws_routes, cap * sizeof *grown);
        if (grown == NULL) {
            rc = shmipc__fail(SHMIPC_ENOMEM, "websocket %s: out of memory", path);
            goto err;
        }
        s->ws_routes = grown;
        s->ws_routes_cap = cap;
    }
    rt.on_open = on_open;
    rt.on_message = on_message;
    rt.on_close = on_close;
    rt.user_data = user_data;
    rt.destroy = destroy;
    s->ws_routes[s->nws_routes++] = rt;
    return 0;
err:
    rt.destroy = destroy;
    rt.user_data = user_data;
    shmipc__server_ws_route_free(&rt);
    return rc;
}
