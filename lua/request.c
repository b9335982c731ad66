/*
 * request.c - the request handle (shmipc.request) that a Lua route handler gets, and the
 * handler's results turned into the C response; shmipc__lua_server_on_request is the C route callback, run on a
 * worker thread under the gate (server.c).
 *
 * Owns: the request handle, the response building, shmipc__lua_server_on_request.
 * May call: the public C API (shmipc_http_*), lshmipc.h, server.c's gate entry and error log.
 */
#include "lserver.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------ */
/* The request handle                                                                   */
/* ------------------------------------------------------------------------------------ */

static const shmipc_http_request *check_request(lua_State *L, int arg)
{
    lrequest *r = luaL_checkudata(L, arg, REQUEST_MT);
    if (r->req == NULL)
        luaL_error(L, "attempt to use a " REQUEST_MT " after its handler returned");
    return r->req;
}

/* req:header(name) -> the value of the first field named so (any case), or nil. */
static int request_header(lua_State *L)
{
    const shmipc_http_request *req = check_request(L, 1);
    size_t len;
    const char *v = shmipc_http_request_header(req, shmipc__lua_check_cstring(L, 2), &len);
    if (v == NULL)
        lua_pushnil(L);
    else
        lua_pushlstring(L, v, len);
    return 1;
}

/*
 * req:headers() -> {name = value}: names in lower case; a field that occurs more than once
 * has its values joined with ", ", in order (RFC 9110, 5.3).
 */
static int request_headers(lua_State *L)
{
    const shmipc_http_request *req = check_request(L, 1);
    size_t n = shmipc_http_request_header_count(req);
    lua_createtable(L, 0, (int)(n < 64 ? n : 64));
    for (size_t i = 0; i < n; i++) {
        const char *name;
        size_t nlen, vlen;
        const char *v = shmipc_http_request_header_at(req, i, &name, &nlen, &vlen);
        if (v == NULL)
            continue;
        luaL_Buffer b;
        char *lower = luaL_buffinitsize(L, &b, nlen);
        for (size_t k = 0; k < nlen; k++)
            lower[k] = (char)(name[k] >= 'A' && name[k] <= 'Z' ? name[k] + 32 : name[k]);
        luaL_pushresultsize(&b, nlen);
        lua_pushvalue(L, -1);
        if (lua_rawget(L, -3) == LUA_TSTRING) {
            lua_pushliteral(L, ", ");
            lua_pushlstring(L, v, vlen);
            lua_concat(L, 3);
        } else {
            lua_pop(L, 1);
            lua_pushlstring(L, v, vlen);
        }
        lua_rawset(L, -3);
    }
    return 1;
}

static int request_defer(lua_State *L);

typedef const char *(*request_field)(const shmipc_http_request *, size_t *);

/* req.client (the host, as text) or req.client_port: nil on a unix listener, or when the
 * kernel could not tell (the client left). */
static void push_client(lua_State *L, const shmipc_http_request *req, int port)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char host[INET6_ADDRSTRLEN];
    const void *a = NULL;
    unsigned p = 0;
    if (shmipc_http_request_peer(req, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET) {
            a = &((const struct sockaddr_in *)&ss)->sin_addr;
            p = ntohs(((const struct sockaddr_in *)&ss)->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            a = &((const struct sockaddr_in6 *)&ss)->sin6_addr;
            p = ntohs(((const struct sockaddr_in6 *)&ss)->sin6_port);
        }
    }
    if (a == NULL || inet_ntop(ss.ss_family, a, host, sizeof host) == NULL)
        lua_pushnil(L);
    else if (port)
        lua_pushinteger(L, (lua_Integer)p);
    else
        lua_pushstring(L, host);
}

/*
 * __index: req.method, req.path, req.query (nil when the target has none), req.wildcard,
 * req.body, req.version (1.0 or 1.1, as a number), the methods header and headers, and
 * req.client / req.client_port (the client's address; nil on a unix listener).
 */
static int request_index(lua_State *L)
{
    static const char *const names[] = {"method", "path",    "query",       "wildcard",
                                        "body",   "version", "header",      "headers",
                                        "defer",  "client",  "client_port", NULL};
    static const request_field fields[] = {shmipc_http_request_method, shmipc_http_request_path,
                                           shmipc_http_request_query, shmipc_http_request_wildcard,
                                           shmipc_http_request_body};
    const shmipc_http_request *req = check_request(L, 1);
    int which = luaL_checkoption(L, 2, NULL, names);
    if (which <= 4) {
        size_t len;
        const char *v = fields[which](req, &len);
        if (v == NULL)
            lua_pushnil(L);
        else
            lua_pushlstring(L, v, len);
    } else if (which == 5) {
        lua_pushnumber(L, shmipc_http_request_version(req) / 10.0);
    } else if (which >= 9) {
        push_client(L, req, which == 10);
    } else {
        lua_pushcfunction(L, which == 6   ? request_header
                             : which == 7 ? request_headers
                                          : request_defer);
    }
    return 1;
}

static int request_tostring(lua_State *L)
{
    lrequest *r = luaL_checkudata(L, 1, REQUEST_MT);
    if (r->req == NULL) {
        lua_pushliteral(L, REQUEST_MT " (done)");
    } else {
        size_t mlen, plen;
        const char *m = shmipc_http_request_method(r->req, &mlen);
        const char *p = shmipc_http_request_path(r->req, &plen);
        lua_pushfstring(L, REQUEST_MT " (%s %s)", lua_pushlstring(L, m, mlen),
                        lua_pushlstring(L, p, plen));
    }
    return 1;
}

/* ------------------------------------------------------------------------------------ */
/* Calling a handler                                                                    */
/* ------------------------------------------------------------------------------------ */

/* The handle at 1 so calls chain, or nil, message, code. */
int shmipc__lua_server_self_or_failure(lua_State *L, int rc)
{
    if (rc < 0)
        return shmipc__lua_push_failure(L, rc);
    lua_settop(L, 1);
    return 1;
}

/* Raises with the library's detail when a response setter failed. */
static void check_set(lua_State *L, int rc, const char *what)
{
    if (rc < 0)
        luaL_error(L, "%s: %s (%s)", what, shmipc_error_detail(), shmipc_errname(rc));
}

/*
 * Where a handler's results go: the handler's response, or a pending answer (req:defer()).
 * The same checks and messages either way.
 */
struct answer {
    void *to;
    int (*status)(void *to, int status);
    int (*header)(void *to, const char *name, const char *value);
    int (*body)(void *to, const void *data, size_t len);
};

static int res_status(void *to, int status)
{
    return shmipc_http_response_set_status(to, status);
}
static int res_header(void *to, const char *name, const char *value)
{
    return shmipc_http_response_add_header(to, name, value);
}
static int res_body(void *to, const void *data, size_t len)
{
    return shmipc_http_response_body(to, data, len);
}
static int pend_status(void *to, int status)
{
    return shmipc_http_pending_set_status(to, status);
}
static int pend_header(void *to, const char *name, const char *value)
{
    return shmipc_http_pending_add_header(to, name, value);
}
static int pend_body(void *to, const void *data, size_t len)
{
    return shmipc_http_pending_body(to, data, len);
}

static void add_header(lua_State *L, const struct answer *res, int name, int value)
{
    if (lua_type(L, value) != LUA_TSTRING && lua_type(L, value) != LUA_TNUMBER)
        luaL_error(L, "header %s: the value is a %s, not a string", lua_tostring(L, name),
                   luaL_typename(L, value));
    size_t nlen, vlen;
    const char *n = lua_tolstring(L, name, &nlen);
    const char *v = lua_tolstring(L, value, &vlen);
    if (strlen(n) != nlen || strlen(v) != vlen)
        luaL_error(L, "header %s: contains a NUL byte", n);
    check_set(L, res->header(res->to, n, v), "header");
}

/* The headers at `idx`: a table of name -> value or array of values, or a Content-Type. */
static void apply_headers(lua_State *L, const struct answer *res, int idx)
{
    if (lua_isnil(L, idx))
        return;
    if (lua_type(L, idx) == LUA_TSTRING) {
        lua_pushliteral(L, "Content-Type");
        add_header(L, res, lua_gettop(L), idx);
        lua_pop(L, 1);
        return;
    }
    if (lua_type(L, idx) != LUA_TTABLE)
        luaL_error(L, "headers: a %s, not a table or a content type", luaL_typename(L, idx));
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        int name = lua_gettop(L) - 1, value = lua_gettop(L);
        if (lua_type(L, name) != LUA_TSTRING)
            luaL_error(L, "headers: a name is a %s, not a string", luaL_typename(L, name));
        if (lua_type(L, value) == LUA_TTABLE) {
            lua_Integer n = luaL_len(L, value);
            for (lua_Integer i = 1; i <= n; i++) {
                lua_geti(L, value, i);
                add_header(L, res, name, lua_gettop(L));
                lua_pop(L, 1);
            }
        } else {
            add_header(L, res, name, value);
        }
        lua_pop(L, 1);
    }
}

static void apply_body(lua_State *L, const struct answer *res, int idx)
{
    size_t len;
    if (lua_isnil(L, idx))
        return;
    if (lua_type(L, idx) != LUA_TSTRING)
        luaL_error(L, "body: a %s, not a string", luaL_typename(L, idx));
    const char *body = lua_tolstring(L, idx, &len);
    check_set(L, res->body(res->to, body, len), "body");
}

static void apply_status(lua_State *L, const struct answer *res, int idx)
{
    int isint = 0;
    lua_Integer status = lua_tointegerx(L, idx, &isint);
    if (lua_type(L, idx) != LUA_TNUMBER || !isint)
        luaL_error(L, "status: a %s, not an integer", luaL_typename(L, idx));
    if (status < 200 || status > 999)
        luaL_error(L, "status: %I is outside 200..999", status);
    check_set(L, res->status(res->to, (int)status), "status");
}

/*
 * Turns what a handler returned (at `first`, three values) into the response:
 *   status, body [, headers]   status an integer, body a string or nil, headers a table
 *                              (name -> value or array of values) or a string (Content-Type)
 *   body                       a string: 200
 *   {status =, body =, headers =}
 *   nothing (nil)              204 No Content
 */
static void apply_result(lua_State *L, const struct answer *res, int first)
{
    switch (lua_type(L, first)) {
    case LUA_TNIL:
        check_set(L, res->status(res->to, 204), "status");
        return;
    case LUA_TSTRING:
        apply_body(L, res, first);
        return;
    case LUA_TNUMBER:
        apply_status(L, res, first);
        apply_headers(L, res, first + 2);
        apply_body(L, res, first + 1);
        return;
    case LUA_TTABLE:
        lua_getfield(L, first, "status");
        lua_getfield(L, first, "body");
        lua_getfield(L, first, "headers");
        if (!lua_isnil(L, -3))
            apply_status(L, res, lua_gettop(L) - 2);
        apply_headers(L, res, lua_gettop(L));
        apply_body(L, res, lua_gettop(L) - 1);
        return;
    default:
        luaL_error(L,
                   "the handler returned a %s; want status, body [, headers], a body string "
                   "or a table",
                   luaL_typename(L, first));
    }
}

/* ------------------------------------------------------------------------------------ */
/* Answers sent later: req:defer() and the pending answer                               */
/* ------------------------------------------------------------------------------------ */

/* What the C on_end records, shared by the handle and the callback (both hold a reference). */
struct pend_state {
    atomic_int refs;
    atomic_int reason; /* -1 while the request waits */
};

typedef struct {
    shmipc_http_pending *p; /* NULL once sent or closed */
    struct pend_state *st;
} lpending;

static void pend_state_unref(struct pend_state *st)
{
    if (atomic_fetch_sub(&st->refs, 1) == 1)
        free(st);
}

/* The C on_end: on the worker thread, without entering the Lua state. */
static void pend_end(void *user_data, int reason)
{
    struct pend_state *st = user_data;
    atomic_store(&st->reason, reason);
    pend_state_unref(st);
}

static lpending *check_pending(lua_State *L, int arg)
{
    return luaL_checkudata(L, arg, PENDING_MT);
}

/*
 * req:defer([timeout]) -> pending: the request is answered later with pending:send(); the
 * handler returns nothing. timeout: seconds until the client gets 504 (nil: none).
 */
static int request_defer(lua_State *L)
{
    lrequest *r = luaL_checkudata(L, 1, REQUEST_MT);
    if (r->req == NULL || r->res == NULL)
        return luaL_error(L, "req:defer() is for the request's own handler, while it runs");
    if (r->deferred)
        return luaL_error(L, "req:defer(): deferred already");
    int timeout_ms = -1;
    if (!lua_isnoneornil(L, 2)) {
        lua_Number t = luaL_checknumber(L, 2);
        if (!(t > 0) || t > 3600)
            return luaL_error(L, "req:defer(): a timeout of %f s (want 0 < t <= 3600, or nil)",
                              (double)t);
        timeout_ms = (int)(t * 1000 + 0.5);
        if (timeout_ms < 1)
            timeout_ms = 1;
    }
    lpending *lp = lua_newuserdatauv(L, sizeof *lp, 0);
    lp->p = NULL;
    lp->st = NULL;
    luaL_setmetatable(L, PENDING_MT);
    struct pend_state *st = malloc(sizeof *st);
    if (st == NULL)
        return luaL_error(L, "req:defer(): out of memory");
    atomic_init(&st->refs, 2);
    atomic_init(&st->reason, -1);
    int rc = shmipc_http_response_defer(r->res, timeout_ms, pend_end, st, &lp->p);
    if (rc < 0) {
        free(st);
        return luaL_error(L, "req:defer(): %s (%s)", shmipc_error_detail(), shmipc_errname(rc));
    }
    lp->st = st;
    r->deferred = 1;
    return 1;
}

static shmipc_http_pending *take_pending(lua_State *L, lpending *lp)
{
    shmipc_http_pending *p = lp->p;
    if (p == NULL)
        luaL_error(L, "this " PENDING_MT " was sent or closed already");
    lp->p = NULL;
    return p;
}

/* Under pcall: the answer onto the handle at 1 (its arguments at 2..4). */
static int protected_fill(lua_State *L)
{
    struct answer a = {lua_touserdata(L, lua_upvalueindex(1)), pend_status, pend_header, pend_body};
    apply_result(L, &a, 2);
    return 0;
}

/*
 * pending:send(status, body [, headers]) (or body, or a table, as a handler returns) -> true
 * once queued for the client, false when the request no longer waits. An invalid answer
 * raises, and the client gets 500: an answer goes whole or not at all. Once only.
 */
static int pending_send(lua_State *L)
{
    lpending *lp = check_pending(L, 1);
    if (lp->p == NULL)
        return luaL_error(L, "this " PENDING_MT " was sent or closed already");
    lua_settop(L, 4);
    lua_pushlightuserdata(L, lp->p);
    lua_pushcclosure(L, protected_fill, 1); /* may raise (memory): the handle is still lp's */
    lua_insert(L, 1);                       /* fill, handle, status, body, headers */
    shmipc_http_pending *p = take_pending(L, lp);
    if (lua_pcall(L, 4, 0, 0) != LUA_OK) {
        shmipc_http_pending_free(p); /* the client gets 500 */
        return lua_error(L);
    }
    int rc = shmipc_http_pending_send(p);
    if (rc < 0 && rc != SHMIPC_ECLOSED)
        return luaL_error(L, "pending:send(): %s (%s)", shmipc_error_detail(), shmipc_errname(rc));
    lua_pushboolean(L, rc == 0);
    return 1;
}

/* pending:close(): gives the answer up unsent (a request still waiting gets 500). */
static int pending_close(lua_State *L)
{
    lpending *lp = check_pending(L, 1);
    shmipc_http_pending *p = lp->p;
    lp->p = NULL;
    shmipc_http_pending_free(p);
    return 0;
}

static int pending_gc(lua_State *L)
{
    lpending *lp = check_pending(L, 1);
    pending_close(L);
    if (lp->st != NULL) {
        pend_state_unref(lp->st);
        lp->st = NULL;
    }
    return 0;
}

static const char *const pending_reasons[] = {"sent", "client_gone", "timeout", "failed",
                                              "abandoned"};

/* pending:waiting() -> true while the request waits for its answer. */
static int pending_waiting(lua_State *L)
{
    lpending *lp = check_pending(L, 1);
    lua_pushboolean(L, lp->st != NULL && atomic_load(&lp->st->reason) < 0);
    return 1;
}

/* pending:reason() -> nil while the request waits; then "sent", "client_gone", "timeout",
 * "failed" or "abandoned". */
static int pending_reason(lua_State *L)
{
    lpending *lp = check_pending(L, 1);
    int reason = lp->st != NULL ? atomic_load(&lp->st->reason) : -1;
    if (reason < 0 || reason > 4)
        lua_pushnil(L);
    else
        lua_pushstring(L, pending_reasons[reason]);
    return 1;
}

static int pending_tostring(lua_State *L)
{
    lpending *lp = check_pending(L, 1);
    int reason = lp->st != NULL ? atomic_load(&lp->st->reason) : -1;
    lua_pushfstring(L, PENDING_MT " (%s)",
                    reason >= 0 && reason <= 4 ? pending_reasons[reason]
                    : lp->p == NULL            ? "given up"
                                               : "waiting");
    return 1;
}

const luaL_Reg shmipc__lua_pending_methods[] = {
    {"send", pending_send},
    {"close", pending_close},
    {"waiting", pending_waiting},
    {"reason", pending_reason},
    {NULL, NULL},
};

const luaL_Reg shmipc__lua_pending_meta[] = {
    {"__gc", pending_gc},
    {"__close", pending_gc},
    {"__tostring", pending_tostring},
    {NULL, NULL},
};

/*
 * Under pcall on T (a function of its own, so its stack starts at 1): arguments route, req
 * and res as light userdata, and the routes table. Runs one handler and applies its result.
 */
static int protected_request(lua_State *T)
{
    struct route *r = lua_touserdata(T, 1);
    const shmipc_http_request *creq = lua_touserdata(T, 2);
    shmipc_http_response *res = lua_touserdata(T, 3);
    lua_settop(T, 4);
    lua_rawgeti(T, 4, r->index);
    lrequest *req = lua_newuserdatauv(T, sizeof *req, 0);
    req->req = creq;
    req->res = res;
    req->deferred = 0;
    luaL_setmetatable(T, REQUEST_MT);
    r->c->cur_request = req;
    lua_call(T, 1, 3);
    req->req = NULL;
    req->res = NULL;
    r->c->applying = 1;
    if (req->deferred) {
        /* The answer is the pending one's: a returned answer could no longer be given. */
        if (!lua_isnil(T, 5))
            luaL_error(T, "a handler that deferred its request returns nothing, not a %s",
                       luaL_typename(T, 5));
        return 0;
    }
    struct answer a = {res, res_status, res_header, res_body};
    apply_result(T, &a, 5);
    return 0;
}

/* The C handler of every Lua route, on a worker thread. */
int shmipc__lua_server_on_request(shmipc_http_request *req, shmipc_http_response *res,
                                  void *user_data)
{
    struct route *r = user_data;
    struct core *c = r->c;
    int rc = 0;
    if (!shmipc__lua_gate_enter_worker(c)) {
        shmipc_http_response_set_status(res, 503);
        shmipc_http_response_add_header(res, "Content-Type", "text/plain");
        return shmipc_http_response_body(res, "server closing\n", 15);
    }
    lua_State *T = shmipc__lua_server_thread(c, r->label);
    if (T == NULL) {
        shmipc__lua_gate_give(c->gate);
        shmipc_http_response_set_status(res, 500);
        shmipc_http_response_add_header(res, "Content-Type", "text/plain");
        return shmipc_http_response_body(res, "internal server error\n", 22);
    }
    c->busy = 1;
    c->cur_request = NULL;
    c->applying = 0;
    lua_pushcfunction(T, protected_request);
    lua_pushlightuserdata(T, r);
    lua_pushlightuserdata(T, req);
    lua_pushlightuserdata(T, res);
    lua_pushvalue(T, T_ROUTES);
    if (lua_pcall(T, 4, 0, T_MSGH) != LUA_OK) {
        /* Read before the log: its on_error can collect the request's userdata. */
        lrequest *cur = c->cur_request;
        int deferred = cur != NULL && cur->deferred;
        if (cur != NULL) {
            cur->req = NULL;
            cur->res = NULL;
        }
        c->cur_request = NULL;
        shmipc__lua_server_log_error(T, r->label);
        if (c->applying || deferred) {
            rc = -1; /* part of the response is set: the server answers 500 and closes */
        } else {
            shmipc_http_response_set_status(res, 500);
            shmipc_http_response_add_header(res, "Content-Type", "text/plain");
            shmipc_http_response_body(res, "internal server error\n", 22);
        }
    }
    lua_settop(T, 0);
    c->busy = 0;
    shmipc__lua_gate_give(c->gate);
    return rc;
}

const luaL_Reg shmipc__lua_request_meta[] = {
    {"__index", request_index},
    {"__tostring", request_tostring},
    {NULL, NULL},
};
