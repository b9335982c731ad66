/*
 * The Lua handler of shmipc-serve-worker (docs/serve.md, "The Lua worker"): Lua 5.4 embedded
 * in the worker, so a request costs no interpreter start and no second codec. The request
 * head is decoded in C (shmipc_serve_exchange_request) into the `req` table, the handler is
 * called as handler(req) and returns status, headers, body, and the response is encoded in C
 * (shmipc_serve_respond / _write). Everything runs inside one lua_pcall: a Lua error before
 * the response head becomes the exchange's 500, after it ABORT WORKER_ERROR
 * (shmipc_serve_handle_stream() decides).
 *
 * A `req` table (or its read function) kept by the application past its request refers to no
 * exchange: each one carries its request's generation, and using it later raises an error.
 *
 * May call: the public API, Lua's C API, serve/worker.h.
 */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "worker.h"

/* What req:read() returns at most when no size is given. */
#define READ_DEFAULT 65536
#define READ_MAX     (1 << 20)

struct lua_app {
    lua_State *L;
    int fn_ref;               /* the handler, in the registry */
    shmipc_serve_exchange *x; /* the request being served, NULL between requests */
    unsigned long long gen;   /* counts requests */
    int ws;                   /* the request's handler accepted a WebSocket */
};

/* The userdata a request's closures hold: which request they belong to. */
struct req_box {
    struct lua_app *app;
    unsigned long long gen;
};

/* The response's fields, gathered into one block the GC frees even after an error. */
struct resp_fields {
    shmipc_serve_field f[SHMIPC_SERVE_MAX_HEADERS];
    size_t n, used;
    char bytes[SHMIPC_SERVE_MAX_HEAD];
};

static shmipc_serve_exchange *box_exchange(lua_State *L, int idx)
{
    struct req_box *b = lua_touserdata(L, idx);
    if (b == NULL || b->app->x == NULL || b->gen != b->app->gen)
        luaL_error(L, "this request is over: req is valid during its handler only");
    return b->app->x;
}

static const char *read_error(int64_t rc)
{
    return rc == SHMIPC_EPROTO   ? "the front sent a bad frame"
           : rc == SHMIPC_EINVAL ? "the request is a WebSocket now: its body was read before "
                                   "the 101 (ws:recv() reads the messages)"
                                 : "the request was aborted";
}

/* req:read([n]): the next piece of the body (at most n bytes), nil at its end. */
static int l_read(lua_State *L)
{
    shmipc_serve_exchange *x = box_exchange(L, lua_upvalueindex(1));
    lua_Integer n = luaL_optinteger(L, 2, READ_DEFAULT);
    luaL_argcheck(L, n > 0 && n <= READ_MAX, 2, "must be 1 .. 1048576");
    luaL_Buffer b;
    char *p = luaL_buffinitsize(L, &b, (size_t)n);
    int64_t got = shmipc_serve_read(x, p, (size_t)n);
    if (got < 0)
        return luaL_error(L, "%s", read_error(got));
    if (got == 0) {
        lua_pushnil(L);
        return 1;
    }
    luaL_pushresultsize(&b, (size_t)got);
    return 1;
}

/* req.body: the whole (rest of the) body as a string, read on first use and kept. */
static int l_index(lua_State *L)
{
    if (lua_type(L, 2) != LUA_TSTRING || strcmp(lua_tostring(L, 2), "body") != 0)
        return 0;
    shmipc_serve_exchange *x = box_exchange(L, lua_upvalueindex(1));
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (;;) {
        char *p = luaL_prepbuffsize(&b, READ_DEFAULT);
        int64_t got = shmipc_serve_read(x, p, READ_DEFAULT);
        if (got < 0)
            return luaL_error(L, "%s", read_error(got));
        if (got == 0)
            break;
        luaL_addsize(&b, (size_t)got);
    }
    luaL_pushresult(&b);
    lua_pushvalue(L, -1);
    lua_setfield(L, 1, "body");
    return 1;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c |= 0x20;
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The target's path and query, as the WSGI environ has them (docs/serve.md). */
static void push_path_query(lua_State *L, const uint8_t *t, size_t n)
{
    size_t start = 0;
    if (n > 0 && t[0] != '/' && !(n == 1 && t[0] == '*')) {
        /* absolute form: the path starts after the authority */
        const uint8_t *ss = memchr(t, '/', n);
        if (ss != NULL && (size_t)(ss - t) + 1 < n && ss[1] == '/') {
            size_t a = (size_t)(ss - t) + 2;
            while (a < n && t[a] != '/' && t[a] != '?')
                a++;
            start = a;
        }
    }
    const uint8_t *q = memchr(t + start, '?', n - start);
    size_t pend = q != NULL ? (size_t)(q - t) : n;
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    if (pend == start)
        luaL_addchar(&b, '/');
    for (size_t i = start; i < pend; i++) {
        int hi, lo;
        if (t[i] == '%' && i + 2 < pend && (hi = hexval(t[i + 1])) >= 0 &&
            (lo = hexval(t[i + 2])) >= 0) {
            luaL_addchar(&b, (char)(hi * 16 + lo));
            i += 2;
        } else {
            luaL_addchar(&b, (char)t[i]);
        }
    }
    luaL_pushresult(&b);
    lua_setfield(L, -2, "path");
    if (q != NULL)
        lua_pushlstring(L, (const char *)q + 1, n - pend - 1);
    else
        lua_pushliteral(L, "");
    lua_setfield(L, -2, "query");
}

static void push_peer(lua_State *L, const shmipc_serve_addr *a)
{
    char host[64];
    const uint8_t *b = a->addr;
    if (a->family == SHMIPC_SERVE_AF_INET) {
        snprintf(host, sizeof host, "%u.%u.%u.%u", b[0], b[1], b[2], b[3]);
    } else if (a->family == SHMIPC_SERVE_AF_INET6) {
        /* the full form, every group: a client address needs no shortening to be right */
        snprintf(host, sizeof host, "%x:%x:%x:%x:%x:%x:%x:%x", b[0] << 8 | b[1], b[2] << 8 | b[3],
                 b[4] << 8 | b[5], b[6] << 8 | b[7], b[8] << 8 | b[9], b[10] << 8 | b[11],
                 b[12] << 8 | b[13], b[14] << 8 | b[15]);
    } else if (a->family == SHMIPC_SERVE_AF_UNIX) {
        lua_pushliteral(L, "unix:");
        lua_setfield(L, -2, "peer");
        return;
    } else {
        return;
    }
    lua_pushstring(L, host);
    lua_setfield(L, -2, "peer");
    lua_pushinteger(L, a->port);
    lua_setfield(L, -2, "peer_port");
}

/* req.headers: lower-cased names; a repeated name's values joined with ", " ("; " for cookie). */
static void push_headers(lua_State *L, const shmipc_serve_request *r)
{
    char name[SHMIPC_SERVE_MAX_NAME + 1];
    shmipc_serve_fields it = r->fields;
    shmipc_serve_field f;
    lua_createtable(L, 0, (int)r->nfields);
    while (shmipc_serve_fields_next(&it, &f) == 1) {
        for (uint32_t i = 0; i < f.name_len; i++) {
            char c = (char)f.name[i];
            name[i] = c >= 'A' && c <= 'Z' ? (char)(c + 32) : c;
        }
        lua_pushlstring(L, name, f.name_len);
        lua_pushvalue(L, -1);
        if (lua_rawget(L, -3) == LUA_TSTRING) {
            lua_pushstring(L, f.name_len == 6 && memcmp(name, "cookie", 6) == 0 ? "; " : ", ");
            lua_pushlstring(L, (const char *)f.value, f.value_len);
            lua_concat(L, 3);
        } else {
            lua_pop(L, 1);
            lua_pushlstring(L, (const char *)f.value, f.value_len);
        }
        lua_rawset(L, -3);
    }
}

static int l_accept_websocket(lua_State *L);

/* req.subprotocols: the Sec-WebSocket-Protocol fields split at commas, in order. */
static void push_subprotocols(lua_State *L, const shmipc_serve_request *r)
{
    shmipc_serve_fields it = r->fields;
    shmipc_serve_field f;
    lua_Integer n = 0;
    lua_newtable(L);
    while (shmipc_serve_fields_next(&it, &f) == 1) {
        if (f.name_len != 22 || strncasecmp((const char *)f.name, "sec-websocket-protocol", 22))
            continue;
        const uint8_t *v = f.value, *end = f.value + f.value_len;
        while (v < end) {
            const uint8_t *c = memchr(v, ',', (size_t)(end - v));
            const uint8_t *a = v, *e = c != NULL ? c : end;
            while (a < e && (*a == ' ' || *a == '\t'))
                a++;
            while (e > a && (e[-1] == ' ' || e[-1] == '\t'))
                e--;
            if (e > a) {
                lua_pushlstring(L, (const char *)a, (size_t)(e - a));
                lua_rawseti(L, -2, ++n);
            }
            v = c != NULL ? c + 1 : end;
        }
    }
}

static void push_request(lua_State *L, struct lua_app *app, const shmipc_serve_request *r)
{
    lua_createtable(L, 0, 12);
    lua_pushlstring(L, (const char *)r->method, r->method_len);
    lua_setfield(L, -2, "method");
    lua_pushlstring(L, (const char *)r->target, r->target_len);
    lua_setfield(L, -2, "target");
    push_path_query(L, r->target, r->target_len);
    lua_pushstring(L, r->version_minor ? "1.1" : "1.0");
    lua_setfield(L, -2, "version");
    lua_pushstring(L, r->scheme ? "https" : "http");
    lua_setfield(L, -2, "scheme");
    lua_pushboolean(L, (r->flags & SHMIPC_SERVE_REQ_HAS_BODY) != 0);
    lua_setfield(L, -2, "has_body");
    if (r->flags & SHMIPC_SERVE_REQ_CONTENT_LENGTH) {
        lua_pushinteger(L, (lua_Integer)r->content_length);
        lua_setfield(L, -2, "content_length");
    }
    push_peer(L, &r->peer);
    push_headers(L, r);
    lua_setfield(L, -2, "headers");
    lua_pushboolean(L, (r->flags & SHMIPC_SERVE_REQ_UPGRADE) != 0);
    lua_setfield(L, -2, "websocket");
    if (r->flags & SHMIPC_SERVE_REQ_UPGRADE) {
        push_subprotocols(L, r);
        lua_setfield(L, -2, "subprotocols");
    }
    struct req_box *box = lua_newuserdatauv(L, sizeof *box, 0);
    box->app = app;
    box->gen = app->gen;
    lua_pushvalue(L, -1);
    lua_pushcclosure(L, l_read, 1);
    lua_setfield(L, -3, "read");
    lua_pushvalue(L, -1);
    lua_pushcclosure(L, l_accept_websocket, 1);
    lua_setfield(L, -3, "accept_websocket");
    lua_createtable(L, 0, 1);
    lua_insert(L, -2);
    lua_pushcclosure(L, l_index, 1);
    lua_setfield(L, -2, "__index");
    lua_setmetatable(L, -2);
}

static int lower_is(const char *s, size_t n, const char *lit)
{
    return strlen(lit) == n && strncasecmp(s, lit, n) == 0;
}

/* One response field into rf, or a framing field into the flags. */
static void add_field(lua_State *L, struct resp_fields *rf, shmipc_serve_response *r,
                      const char *name, size_t nl, const char *value, size_t vl)
{
    if (lower_is(name, nl, "content-length")) {
        uint64_t v = 0;
        if (vl == 0 || vl > 18)
            luaL_error(L, "bad Content-Length '%s'", value);
        for (size_t i = 0; i < vl; i++) {
            if (value[i] < '0' || value[i] > '9')
                luaL_error(L, "bad Content-Length '%s'", value);
            v = v * 10 + (uint64_t)(value[i] - '0');
        }
        r->flags |= SHMIPC_SERVE_RESP_CONTENT_LENGTH;
        r->content_length = v;
        return;
    }
    if (lower_is(name, nl, "connection")) {
        for (size_t i = 0; i + 5 <= vl; i++)
            if (strncasecmp(value + i, "close", 5) == 0)
                r->flags |= SHMIPC_SERVE_RESP_CLOSE;
        return;
    }
    /* Hop-by-hop fields are the front's (as the WSGI worker drops them). */
    if (lower_is(name, nl, "transfer-encoding") || lower_is(name, nl, "keep-alive") ||
        lower_is(name, nl, "te") || lower_is(name, nl, "trailer") ||
        lower_is(name, nl, "upgrade") || lower_is(name, nl, "proxy-connection"))
        return;
    if (rf->n >= SHMIPC_SERVE_MAX_HEADERS || nl + vl > sizeof rf->bytes - rf->used)
        luaL_error(L, "too many or too large response headers");
    char *p = rf->bytes + rf->used;
    memcpy(p, name, nl);
    memcpy(p + nl, value, vl);
    rf->f[rf->n++] = (shmipc_serve_field){(const uint8_t *)p, (const uint8_t *)p + nl, (uint32_t)nl,
                                          (uint32_t)vl};
    rf->used += nl + vl;
}

static void add_value(lua_State *L, struct resp_fields *rf, shmipc_serve_response *r,
                      const char *name, size_t nl, int vidx)
{
    size_t vl;
    int t = lua_type(L, vidx);
    if (t == LUA_TTABLE) { /* several values of one name: several fields */
        lua_Integer n = luaL_len(L, vidx);
        for (lua_Integer i = 1; i <= n; i++) {
            lua_geti(L, vidx, i);
            if (lua_type(L, -1) != LUA_TSTRING && lua_type(L, -1) != LUA_TNUMBER)
                luaL_error(L, "header %s: values must be strings", name);
            const char *v = lua_tolstring(L, -1, &vl);
            add_field(L, rf, r, name, nl, v, vl);
            lua_pop(L, 1);
        }
        return;
    }
    if (t != LUA_TSTRING && t != LUA_TNUMBER)
        luaL_error(L, "header %s: the value must be a string, not %s", name,
                   luaL_typename(L, vidx));
    lua_pushvalue(L, vidx); /* tolstring converts in place: on a copy, not the table's value */
    const char *v = lua_tolstring(L, -1, &vl);
    add_field(L, rf, r, name, nl, v, vl);
    lua_pop(L, 1);
}

/* headers: {Name = value or {values}} and/or {{"Name", "value"}, ...} (order kept). */
static void gather_headers(lua_State *L, int hidx, struct resp_fields *rf, shmipc_serve_response *r)
{
    if (lua_isnil(L, hidx))
        return;
    luaL_argexpected(L, lua_type(L, hidx) == LUA_TTABLE, hidx, "a table of headers");
    lua_Integer n = luaL_len(L, hidx);
    for (lua_Integer i = 1; i <= n; i++) { /* the array part first: its order is the client's */
        lua_geti(L, hidx, i);
        if (lua_type(L, -1) != LUA_TTABLE)
            luaL_error(L, "header %d: expected {name, value}", (int)i);
        int pair = lua_gettop(L);
        lua_geti(L, pair, 1);
        lua_geti(L, pair, 2);
        size_t nl;
        if (lua_type(L, -2) != LUA_TSTRING)
            luaL_error(L, "header %d: the name must be a string", (int)i);
        const char *name = lua_tolstring(L, -2, &nl);
        add_value(L, rf, r, name, nl, lua_gettop(L));
        lua_settop(L, pair - 1);
    }
    lua_pushnil(L);
    while (lua_next(L, hidx) != 0) {
        if (lua_type(L, -2) == LUA_TSTRING) {
            size_t nl;
            const char *name = lua_tolstring(L, -2, &nl);
            add_value(L, rf, r, name, nl, lua_gettop(L));
        } else if (!lua_isinteger(L, -2) || lua_tointeger(L, -2) < 1 || lua_tointeger(L, -2) > n) {
            luaL_error(L, "header names must be strings");
        }
        lua_pop(L, 1);
    }
}

static void write_or_raise(lua_State *L, shmipc_serve_exchange *x, const char *p, size_t n)
{
    int rc = shmipc_serve_write(x, p, n);
    if (rc < 0)
        luaL_error(L, "writing the body: %s: %s", shmipc_errname(rc),
                   rc == SHMIPC_EINVAL ? shmipc_error_detail() : read_error(rc));
}

/* The protected part: build req, call the handler, send its response. */
static int run(lua_State *L)
{
    struct lua_app *app = lua_touserdata(L, 1);
    shmipc_serve_exchange *x = app->x;
    const shmipc_serve_request *req = shmipc_serve_exchange_request(x);
    lua_settop(L, 0);
    lua_rawgeti(L, LUA_REGISTRYINDEX, app->fn_ref);
    push_request(L, app, req);
    lua_call(L, 1, 3); /* status, headers, body at 1, 2, 3 */
    if (app->ws)
        return 0; /* a WebSocket: its end is the handler's return (closed 1000 if open) */
    int isnum;
    lua_Integer status = lua_tointegerx(L, 1, &isnum);
    if (!isnum || status < 200 || status > 599)
        return luaL_error(L, "the handler must return a status 200..599 first, not %s",
                          isnum ? lua_tostring(L, 1) : luaL_typename(L, 1));
    int bt = lua_type(L, 3);
    if (bt != LUA_TNIL && bt != LUA_TSTRING && bt != LUA_TFUNCTION)
        return luaL_error(L, "the body must be a string, a function or nil, not %s",
                          luaL_typename(L, 3));
    struct resp_fields *rf = lua_newuserdatauv(L, sizeof *rf, 0); /* at 4 */
    rf->n = rf->used = 0;
    shmipc_serve_response r = {.size = sizeof r, .status = (uint16_t)status};
    gather_headers(L, 2, rf, &r);
    int bodyless = status == 204 || status == 304 ||
                   (req->method_len == 4 && memcmp(req->method, "HEAD", 4) == 0);
    size_t blen = 0;
    const char *body = bt == LUA_TSTRING ? lua_tolstring(L, 3, &blen) : NULL;
    if (bt != LUA_TFUNCTION && !(r.flags & SHMIPC_SERVE_RESP_CONTENT_LENGTH) && status != 204 &&
        status != 304) {
        r.flags |= SHMIPC_SERVE_RESP_CONTENT_LENGTH; /* a whole body: its length is known */
        r.content_length = blen;
    } else if (bt != LUA_TFUNCTION && !bodyless && r.content_length != blen) {
        return luaL_error(L, "Content-Length %llu but a body of %llu bytes",
                          (unsigned long long)r.content_length, (unsigned long long)blen);
    }
    int rc = shmipc_serve_respond(x, &r, rf->f, rf->n);
    if (rc < 0)
        return luaL_error(L, "the response head: %s: %s", shmipc_errname(rc),
                          rc == SHMIPC_EINVAL || rc == SHMIPC_EMSGSIZE ? shmipc_error_detail()
                                                                       : read_error(rc));
    if (body != NULL) {
        write_or_raise(L, x, body, blen);
        return 0;
    }
    while (bt == LUA_TFUNCTION) {
        lua_pushvalue(L, 3);
        lua_call(L, 0, 1);
        if (lua_isnil(L, -1) || (lua_isboolean(L, -1) && !lua_toboolean(L, -1)))
            break;
        if (lua_type(L, -1) != LUA_TSTRING)
            return luaL_error(L, "a body chunk must be a string, not %s", luaL_typename(L, -1));
        size_t n;
        const char *p = lua_tolstring(L, -1, &n);
        write_or_raise(L, x, p, n);
        lua_pop(L, 1);
    }
    return 0;
}

/* ---- WebSocket (docs/serve.md, "WebSocket in the C and Lua workers") -----------------------
 * req:accept_websocket{protocol =, headers =, timeout =, max_payload_len =} sends the 101 and
 * returns a ws object named after lua-resty-websocket's: ws:recv_frame() (whole messages),
 * ws:send_text / send_binary / send_ping / send_pong / send_close, ws:set_timeout. Misuse (a
 * wrong type, a bad close code, a send after the handler's own close) raises; what the client
 * does (its close, its disappearance, a timeout) is returned as resty returns it. */

#define WS_MT "shmipc.serve.ws"

struct ws_box {
    struct lua_app *app;
    unsigned long long gen;
    int timeout_ms;      /* recv_frame's wait, -1 none */
    lua_Integer max_len; /* a larger message closes 1009; 0 none */
    int closed;          /* recv_frame returned the close once */
    int discard;         /* the rest of a message over max_len is still to come: dropped */
};

static shmipc_serve_exchange *ws_exchange(lua_State *L, struct ws_box **out)
{
    struct ws_box *w = luaL_checkudata(L, 1, WS_MT);
    if (w->app->x == NULL || w->gen != w->app->gen)
        luaL_error(L, "this WebSocket is over: ws is valid during its handler only");
    if (out != NULL)
        *out = w;
    return w->app->x;
}

/* nil, err for what the client did; an error for misuse. */
static int ws_result(lua_State *L, int rc, const char *what)
{
    if (rc == 0) {
        lua_pushboolean(L, 1);
        return 1;
    }
    if (rc == SHMIPC_EINVAL)
        return luaL_error(L, "%s: %s", what, shmipc_error_detail());
    lua_pushnil(L);
    lua_pushstring(L, rc == SHMIPC_EPROTO ? "protocol error" : "closed");
    return 2;
}

static int ws_send(lua_State *L, uint32_t op, const char *what)
{
    shmipc_serve_exchange *x = ws_exchange(L, NULL);
    size_t n = 0;
    const char *s = op == SHMIPC_SERVE_WS_PING_OP || op == SHMIPC_SERVE_WS_PONG_OP
                        ? luaL_optlstring(L, 2, "", &n)
                        : luaL_checklstring(L, 2, &n);
    return ws_result(L, shmipc_serve_ws_send(x, op, s, n), what);
}

static int l_ws_send_text(lua_State *L)
{
    return ws_send(L, SHMIPC_SERVE_WS_TEXT, "send_text");
}

static int l_ws_send_binary(lua_State *L)
{
    return ws_send(L, SHMIPC_SERVE_WS_BINARY, "send_binary");
}

static int l_ws_send_ping(lua_State *L)
{
    return ws_send(L, SHMIPC_SERVE_WS_PING_OP, "send_ping");
}

static int l_ws_send_pong(lua_State *L)
{
    return ws_send(L, SHMIPC_SERVE_WS_PONG_OP, "send_pong");
}

/* ws:send_close([code[, reason]]): code nil sends none. */
static int l_ws_send_close(lua_State *L)
{
    shmipc_serve_exchange *x = ws_exchange(L, NULL);
    lua_Integer code = luaL_optinteger(L, 2, 0);
    size_t rl = 0;
    const char *reason = luaL_optlstring(L, 3, "", &rl);
    luaL_argcheck(L,
                  (code == 0 && rl == 0) || (code >= 1000 && code <= 1003) ||
                      (code >= 1007 && code <= 1014) || (code >= 3000 && code <= 4999),
                  2, "a close code is 1000-1003, 1007-1014 or 3000-4999 (a reason needs one)");
    luaL_argcheck(L, rl <= SHMIPC_SERVE_MAX_CLOSE_REASON, 3, "a close reason is at most 123 bytes");
    return ws_result(L, shmipc_serve_ws_close(x, (uint32_t)code, reason, rl), "send_close");
}

/* ws:set_timeout(ms): recv_frame's wait; nil or negative: none. */
static int l_ws_set_timeout(lua_State *L)
{
    struct ws_box *w;
    ws_exchange(L, &w);
    lua_Integer ms = luaL_optinteger(L, 2, -1);
    luaL_argcheck(L, ms <= 86400000, 2, "at most 86400000 ms");
    w->timeout_ms = ms < 0 ? -1 : (int)ms;
    return 0;
}

/*
 * ws:recv_frame(): the client's next whole message, `data, "text"|"binary"`; its close as
 * `reason, "close", code` (1005: its close had no code; 1006: it went away without one), once;
 * `nil, nil, err` for "timeout" (nothing of a message came in time), "closed" (after the
 * close), "message too big" (over max_payload_len: closed 1009), "protocol error".
 */
static int l_ws_recv_frame(lua_State *L)
{
    struct ws_box *w;
    shmipc_serve_exchange *x = ws_exchange(L, &w);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    size_t total = 0;
    uint32_t op = 0;
    for (;;) {
        uint32_t flags = 0;
        char *p = luaL_prepbuffsize(&b, READ_DEFAULT);
        /* Once a message began, the rest is waited for: its bytes are not dropped by a timeout
         * (the front's WebSocket timers bound a client that stalls mid-message). */
        int64_t n = shmipc_serve_ws_recv(x, p, READ_DEFAULT, &flags,
                                         op == 0 && !w->discard ? w->timeout_ms : -1);
        if (n >= 0 && w->discard) {
            /* The rest of the message that was too big (closed 1009 at its first piece over
             * the limit): not a message of its own. Before, it came back as more "message too
             * big" results, or, once what was left fit the limit, as a message. */
            if (flags & SHMIPC_SERVE_WS_FIN)
                w->discard = 0;
            continue;
        }
        if (n >= 0) {
            luaL_addsize(&b, (size_t)n);
            total += (size_t)n;
            op = flags & 0xFFu;
            if (w->max_len > 0 && total > (size_t)w->max_len) {
                shmipc_serve_ws_close(x, 1009, NULL, 0);
                w->discard = !(flags & SHMIPC_SERVE_WS_FIN);
                lua_pushnil(L);
                lua_pushnil(L);
                lua_pushliteral(L, "message too big");
                return 3;
            }
            if (flags & SHMIPC_SERVE_WS_FIN) {
                luaL_pushresult(&b);
                lua_pushstring(L, op == SHMIPC_SERVE_WS_TEXT ? "text" : "binary");
                return 2;
            }
            continue;
        }
        lua_pushnil(L);
        if (n == SHMIPC_ETIMEDOUT || n == SHMIPC_EPROTO || n == SHMIPC_EINVAL || w->closed) {
            lua_pushnil(L);
            lua_pushstring(L, n == SHMIPC_ETIMEDOUT ? "timeout"
                              : n == SHMIPC_EPROTO  ? "protocol error"
                                                    : "closed");
            return 3;
        }
        /* The client's close (SHMIPC_ECLOSED) or its disappearance (SHMIPC_ECONNRESET). */
        char reason[SHMIPC_SERVE_MAX_CLOSE_REASON];
        size_t rl = 0;
        int32_t code = shmipc_serve_ws_closed(x, reason, sizeof reason, &rl);
        w->closed = 1;
        lua_pushlstring(L, reason, rl);
        lua_pushliteral(L, "close");
        lua_pushinteger(L, code);
        return 3;
    }
}

/* req:accept_websocket([opts]): the 101, and the ws object. */
static int l_accept_websocket(lua_State *L)
{
    struct lua_app *app;
    shmipc_serve_exchange *x = box_exchange(L, lua_upvalueindex(1));
    app = ((struct req_box *)lua_touserdata(L, lua_upvalueindex(1)))->app;
    const char *proto = NULL;
    int timeout = -1;
    lua_Integer max_len = 0;
    lua_settop(L, 2); /* req, opts; the fields' block at 3 */
    struct resp_fields *rf = lua_newuserdatauv(L, sizeof *rf, 0);
    rf->n = rf->used = 0;
    shmipc_serve_response r = {.size = sizeof r};
    if (!lua_isnoneornil(L, 2)) {
        luaL_checktype(L, 2, LUA_TTABLE);
        int top = lua_gettop(L);
        if (lua_getfield(L, 2, "protocol") != LUA_TNIL) {
            luaL_argexpected(L, lua_type(L, -1) == LUA_TSTRING, 2, "protocol: a string");
            proto = lua_tostring(L, -1); /* kept alive by opts */
        }
        if (lua_getfield(L, 2, "timeout") != LUA_TNIL) {
            lua_Integer t = luaL_checkinteger(L, -1);
            timeout = t < 0 ? -1 : t > 86400000 ? 86400000 : (int)t;
        }
        if (lua_getfield(L, 2, "max_payload_len") != LUA_TNIL)
            max_len = luaL_checkinteger(L, -1);
        lua_getfield(L, 2, "headers");
        gather_headers(L, lua_gettop(L), rf, &r);
        lua_settop(L, top);
    }
    if (!(shmipc_serve_exchange_request(x)->flags & SHMIPC_SERVE_REQ_UPGRADE))
        return luaL_error(L, "accept_websocket: not a WebSocket upgrade request");
    int rc = shmipc_serve_ws_accept(x, proto, rf->f, rf->n);
    if (rc < 0)
        return luaL_error(L, "accept_websocket: %s: %s", shmipc_errname(rc),
                          rc == SHMIPC_EINVAL || rc == SHMIPC_EMSGSIZE ? shmipc_error_detail()
                                                                       : read_error(rc));
    app->ws = 1;
    struct ws_box *w = lua_newuserdatauv(L, sizeof *w, 0);
    *w = (struct ws_box){app, app->gen, timeout, max_len > 0 ? max_len : 0, 0, 0};
    luaL_setmetatable(L, WS_MT);
    return 1;
}

static void ws_register(lua_State *L)
{
    static const luaL_Reg methods[] = {
        {"recv_frame", l_ws_recv_frame},   {"send_text", l_ws_send_text},
        {"send_binary", l_ws_send_binary}, {"send_ping", l_ws_send_ping},
        {"send_pong", l_ws_send_pong},     {"send_close", l_ws_send_close},
        {"set_timeout", l_ws_set_timeout}, {NULL, NULL}};
    luaL_newmetatable(L, WS_MT);
    luaL_newlib(L, methods);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
}

/* The text of an error object that is not a string, by its __tostring (lua_pcall'd). */
static int error_text(lua_State *L)
{
    luaL_tolstring(L, 1, NULL); /* raises when __tostring does, or returns no string */
    return 1;
}

/*
 * The message handler: the error and the traceback. An error object that is not a string is
 * told by its __tostring, as lua.c tells it, or by its type; a __tostring that fails (raises,
 * returns something else) is one more error of the application's, not of the handler: it is
 * run protected, so the request still gets its 500 with a message that says what happened.
 */
static int traceback(lua_State *L)
{
    const char *msg = lua_tostring(L, 1);
    if (msg == NULL) {
        const char *t = luaL_typename(L, 1);
        if (luaL_getmetafield(L, 1, "__tostring") == LUA_TNIL) {
            msg = lua_pushfstring(L, "(error object is a %s value)", t);
        } else {
            lua_pop(L, 1);
            lua_pushcfunction(L, error_text);
            lua_pushvalue(L, 1);
            if (lua_pcall(L, 1, 1, 0) == LUA_OK)
                msg = lua_tostring(L, -1);
            else
                msg = lua_pushfstring(L, "(error object is a %s value whose __tostring failed)", t);
        }
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

static int lua_handler(shmipc_serve_exchange *x, void *data)
{
    struct lua_app *app = data;
    lua_State *L = app->L;
    app->gen++;
    app->x = x;
    app->ws = 0;
    lua_settop(L, 0);
    lua_pushcfunction(L, traceback);
    lua_pushcfunction(L, run);
    lua_pushlightuserdata(L, app);
    int rc = lua_pcall(L, 1, 0, 1);
    app->x = NULL;
    if (rc != LUA_OK) {
        const shmipc_serve_request *r = shmipc_serve_exchange_request(x);
        fprintf(stderr, "shmipc-serve worker: the Lua handler failed on %.*s %.*s: %s\n",
                (int)r->method_len, (const char *)r->method,
                (int)(r->target_len > 200 ? 200 : r->target_len), (const char *)r->target,
                lua_tostring(L, -1));
    }
    lua_settop(L, 0);
    return rc == LUA_OK ? 0 : -1;
}

int shmipc__worker_lua_load(const char *spec, shmipc_serve_handler *fn, void **data, char *err,
                            size_t errlen)
{
    struct lua_app *app = calloc(1, sizeof *app);
    lua_State *L = luaL_newstate();
    if (app == NULL || L == NULL) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    app->L = L;
    luaL_openlibs(L);
    ws_register(L);
    const char *colon = strrchr(spec, ':');
    size_t ml = colon != NULL ? (size_t)(colon - spec) : strlen(spec);
    if (ml == 0 || (colon != NULL && colon[1] == '\0')) {
        snprintf(err, errlen, "'%s' is not MODULE[:FUNCTION]", spec);
        goto fail;
    }
    lua_pushcfunction(L, traceback);
    /* FILE.lua (or a path) runs that file; any other name is require()d (package.path). */
    int is_file = (ml > 4 && memcmp(spec + ml - 4, ".lua", 4) == 0) || memchr(spec, '/', ml);
    int lrc;
    if (is_file) {
        char path[4096];
        snprintf(path, sizeof path, "%.*s", (int)ml, spec);
        lrc = luaL_loadfilex(L, path, "t");
        if (lrc == LUA_OK)
            lrc = lua_pcall(L, 0, 1, 1);
    } else {
        lua_getglobal(L, "require");
        lua_pushlstring(L, spec, ml);
        lrc = lua_pcall(L, 1, 1, 1);
    }
    if (lrc != LUA_OK) {
        snprintf(err, errlen, "cannot load the Lua module %.*s: %s", (int)ml, spec,
                 lua_tostring(L, -1));
        goto fail;
    }
    if (colon != NULL) {
        if (lua_type(L, -1) != LUA_TTABLE) {
            snprintf(err, errlen, "the Lua module %.*s returns a %s, not a table holding %s",
                     (int)ml, spec, luaL_typename(L, -1), colon + 1);
            goto fail;
        }
        lua_getfield(L, -1, colon + 1);
    }
    if (lua_type(L, -1) != LUA_TFUNCTION) {
        snprintf(err, errlen, "%s is a %s, not a handler function", spec, luaL_typename(L, -1));
        goto fail;
    }
    app->fn_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_settop(L, 0);
    *fn = lua_handler;
    *data = app;
    return 0;
fail:
    if (L != NULL)
        lua_close(L);
    free(app);
    return -1;
}

void shmipc__worker_lua_free(void *data)
{
    struct lua_app *app = data;
    if (app == NULL)
        return;
    lua_close(app->L);
    free(app);
}
