/*
 * ws.c - WebSocket routes: the shmipc.ws handle (send, ping, close, subprotocol), the C
 * callbacks on_ws_open/_message/_close that run the Lua handlers on a worker thread under the
 * gate (server.c), and srv:websocket().
 *
 * Owns: the ws handle and the connection table (T_WS during a callback).
 * May call: the public C API (shmipc_ws_*, shmipc_server_websocket), lshmipc.h, server.c's gate
 * entry and error log, request.c's request handle.
 */
#include "lserver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------ */
/* WebSocket routes                                                                     */
/* ------------------------------------------------------------------------------------ */

/*
 * A WebSocket connection, from on_open until on_close returns; ws is NULL afterwards. The one
 * handle of a connection is anchored in T_WS and passed to each of its callbacks, so it can
 * serve as a table key.
 */
typedef struct {
    shmipc_ws *ws;
} lws;

static lws *check_ws(lua_State *L, int arg)
{
    lws *u = luaL_checkudata(L, arg, WS_MT);
    if (u->ws == NULL)
        luaL_error(L, "attempt to use a closed " WS_MT " (after its on_close)");
    return u;
}

static int ws_kind(lua_State *L, int arg)
{
    static const char *const names[] = {"text", "binary", NULL};
    return luaL_checkoption(L, arg, "text", names) == 0 ? SHMIPC_WS_TEXT : SHMIPC_WS_BINARY;
}

/* ws:send(data [, "text" | "binary"]) -> ws: queues one message ("text": valid UTF-8). */
static int ws_send(lua_State *L)
{
    lws *u = check_ws(L, 1);
    size_t len;
    const char *data = luaL_checklstring(L, 2, &len);
    int kind = ws_kind(L, 3);
    return shmipc__lua_server_self_or_failure(L, shmipc_ws_send(u->ws, kind, data, len));
}

/* ws:ping([data]) -> ws: at most 125 bytes. */
static int ws_ping(lua_State *L)
{
    lws *u = check_ws(L, 1);
    size_t len = 0;
    const char *data = luaL_optlstring(L, 2, "", &len);
    return shmipc__lua_server_self_or_failure(L, shmipc_ws_ping(u->ws, data, len));
}

/* ws:close([code [, reason]]) -> ws: starts the close handshake (1000 by default). */
static int ws_close(lua_State *L)
{
    lws *u = check_ws(L, 1);
    lua_Integer code = luaL_optinteger(L, 2, 1000);
    const char *reason = lua_isnoneornil(L, 3) ? NULL : shmipc__lua_check_cstring(L, 3);
    if (code < 1000 || code > 4999)
        return shmipc__lua_push_invalid(L, "close: code %I is outside 1000..4999", code);
    return shmipc__lua_server_self_or_failure(L, shmipc_ws_close(u->ws, (int)code, reason));
}

/* ws:subprotocol() -> the subprotocol chosen at the upgrade, or nil. */
static int ws_subprotocol(lua_State *L)
{
    const char *p = shmipc_ws_subprotocol(check_ws(L, 1)->ws);
    if (p == NULL)
        lua_pushnil(L);
    else
        lua_pushstring(L, p);
    return 1;
}

static int ws_tostring(lua_State *L)
{
    lws *u = luaL_checkudata(L, 1, WS_MT);
    if (u->ws == NULL)
        lua_pushliteral(L, WS_MT " (closed)");
    else
        lua_pushfstring(L, WS_MT " (%p)", (void *)u->ws);
    return 1;
}

/* One WebSocket event, handed to the protected functions below as light userdata. */
struct ws_event {
    struct route *r;
    shmipc_ws *ws;
    const shmipc_http_request *req; /* on_open */
    int kind;                       /* on_message */
    const void *data;
    size_t len;
    int code; /* on_close */
    int accepted;
};

/*
 * The protected functions get (event, routes table, connections table) and push the Lua
 * handler named `name` of the event's route (nil when there is none).
 */
static void push_ws_handler(lua_State *T, const struct ws_event *e, const char *name)
{
    lua_rawgeti(T, 2, e->r->index);
    lua_getfield(T, -1, name);
    lua_remove(T, -2);
}

/* Under pcall: makes the connection's handle, then on_open(ws, req); false refuses. */
static int protected_ws_open(lua_State *T)
{
    struct ws_event *e = lua_touserdata(T, 1);
    lua_settop(T, 3);
    lws *u = lua_newuserdatauv(T, sizeof *u, 0);
    u->ws = NULL;
    luaL_setmetatable(T, WS_MT);
    lua_pushvalue(T, -1);
    lua_rawsetp(T, 3, e->ws);
    u->ws = e->ws;
    shmipc_ws_set_data(e->ws, u);
    push_ws_handler(T, e, "on_open");
    if (lua_isnil(T, -1)) {
        e->accepted = 1;
        return 0;
    }
    lua_pushvalue(T, 4);
    lrequest *req = lua_newuserdatauv(T, sizeof *req, 0);
    req->req = e->req;
    req->res = NULL; /* an upgrade is not deferred from Lua */
    req->deferred = 0;
    luaL_setmetatable(T, REQUEST_MT);
    e->r->c->cur_request = req;
    lua_call(T, 2, 1);
    req->req = NULL;
    e->accepted = !(lua_isboolean(T, -1) && !lua_toboolean(T, -1));
    return 0;
}

/* Under pcall: on_message(ws, data, "text" | "binary"). */
static int protected_ws_message(lua_State *T)
{
    struct ws_event *e = lua_touserdata(T, 1);
    push_ws_handler(T, e, "on_message");
    if (lua_rawgetp(T, 3, e->ws) != LUA_TUSERDATA)
        return 0; /* refused at open: no handle */
    lua_pushlstring(T, e->data, e->len);
    lua_pushstring(T, e->kind == SHMIPC_WS_BINARY ? "binary" : "text");
    lua_call(T, 3, 0);
    return 0;
}

/* Under pcall: on_close(ws, code, reason). */
static int protected_ws_close(lua_State *T)
{
    struct ws_event *e = lua_touserdata(T, 1);
    push_ws_handler(T, e, "on_close");
    if (lua_isnil(T, -1) || lua_rawgetp(T, 3, e->ws) != LUA_TUSERDATA)
        return 0;
    lua_pushinteger(T, e->code);
    lua_pushlstring(T, e->data, e->len);
    lua_call(T, 3, 0);
    return 0;
}

/*
 * Runs `fn` for event `e` on T (from shmipc__lua_server_thread, or NULL: fails), holding the
 * gate; logs an error. Returns 0 or -1 (it raised). T keeps its slots.
 */
static int call_ws(struct core *c, lua_State *T, lua_CFunction fn, struct ws_event *e,
                   const char *what)
{
    int rc = 0;
    if (T == NULL)
        return -1;
    c->busy = 1;
    c->cur_request = NULL;
    lua_pushcfunction(T, fn);
    lua_pushlightuserdata(T, e);
    lua_pushvalue(T, T_ROUTES);
    lua_pushvalue(T, T_WS);
    if (lua_pcall(T, 3, 0, T_MSGH) != LUA_OK) {
        if (c->cur_request != NULL)
            ((lrequest *)c->cur_request)->req = NULL;
        char label[256];
        snprintf(label, sizeof label, "%s %s", e->r->label, what);
        shmipc__lua_server_log_error(T, label);
        rc = -1;
    }
    lua_settop(T, T_NSLOTS);
    c->busy = 0;
    return rc;
}

/*
 * Forgets the connection's handle: it raises from now on, and T's T_WS (when T is not NULL)
 * lets go of it. Holding the gate.
 */
static void ws_forget(lua_State *T, shmipc_ws *ws)
{
    lws *u = shmipc_ws_data(ws);
    if (u == NULL)
        return;
    u->ws = NULL;
    shmipc_ws_set_data(ws, NULL);
    if (T != NULL) {
        lua_pushnil(T);
        lua_rawsetp(T, T_WS, ws);
    }
}

static int on_ws_open(shmipc_ws *ws, const shmipc_http_request *req, void *user_data)
{
    struct route *r = user_data;
    struct core *c = r->c;
    struct ws_event e = {.r = r, .ws = ws, .req = req};
    if (!shmipc__lua_gate_enter_worker(c))
        return -1;
    lua_State *T = shmipc__lua_server_thread(c, r->label);
    if (call_ws(c, T, protected_ws_open, &e, "on_open") < 0 || !e.accepted) {
        e.accepted = 0;
        ws_forget(T, ws);
    }
    if (T != NULL)
        lua_settop(T, 0);
    shmipc__lua_gate_give(c->gate);
    return e.accepted ? 0 : -1;
}

static void on_ws_message(shmipc_ws *ws, int kind, const void *data, size_t len, void *user_data)
{
    struct route *r = user_data;
    struct ws_event e = {.r = r, .ws = ws, .kind = kind, .data = data, .len = len};
    if (!shmipc__lua_gate_enter_worker(r->c))
        return;
    lua_State *T = shmipc__lua_server_thread(r->c, r->label);
    call_ws(r->c, T, protected_ws_message, &e, "on_message");
    if (T != NULL)
        lua_settop(T, 0);
    shmipc__lua_gate_give(r->c->gate);
}

static void on_ws_close(shmipc_ws *ws, int code, const char *reason, size_t reason_len,
                        void *user_data)
{
    struct route *r = user_data;
    struct ws_event e = {.r = r, .ws = ws, .code = code, .data = reason, .len = reason_len};
    if (!shmipc__lua_gate_enter_worker(r->c)) {
        /*
         * The server is being freed by a holder of the gate, which waits for this worker:
         * the handle stays anchored in the connection table until then, and only needs to
         * learn that the connection is gone.
         */
        lws *u = shmipc_ws_data(ws);
        if (u != NULL)
            u->ws = NULL;
        return;
    }
    lua_State *T = shmipc__lua_server_thread(r->c, r->label);
    call_ws(r->c, T, protected_ws_close, &e, "on_close");
    ws_forget(T, ws);
    if (T != NULL)
        lua_settop(T, 0);
    shmipc__lua_gate_give(r->c->gate);
}

/* The subprotocols at `idx`: nil, a comma-separated string, or an array of names. */
static const char *opt_subprotocols(lua_State *L, int idx)
{
    if (lua_isnil(L, idx))
        return NULL;
    if (lua_type(L, idx) == LUA_TSTRING)
        return shmipc__lua_check_cstring(L, idx);
    if (lua_type(L, idx) != LUA_TTABLE)
        luaL_error(L, "websocket: subprotocols is a %s, not a table of names",
                   luaL_typename(L, idx));
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    lua_Integer n = luaL_len(L, idx);
    for (lua_Integer i = 1; i <= n; i++) {
        if (lua_geti(L, idx, i) != LUA_TSTRING)
            luaL_error(L, "websocket: subprotocol %I is a %s, not a string", i,
                       luaL_typename(L, -1));
        if (i > 1)
            luaL_addchar(&b, ',');
        luaL_addvalue(&b);
    }
    luaL_pushresult(&b);
    return lua_tostring(L, -1);
}

/*
 * websocket(path, {on_open =, on_message =, on_close =, subprotocols =}) -> server. on_message
 * is required. on_open(ws, req) may return false to refuse the upgrade (403); on_message(ws,
 * data, kind) gets each whole message, kind "text" or "binary"; on_close(ws, code, reason)
 * runs once per accepted connection, after which ws raises.
 */
int shmipc__lua_server_websocket(lua_State *L)
{
    static const char *const names[] = {"on_open", "on_message", "on_close"};
    lserver *u = shmipc__lua_check_server(L, 1);
    struct core *c = u->c;
    const char *path = shmipc__lua_check_cstring(L, 2);
    luaL_checktype(L, 3, LUA_TTABLE);
    lua_settop(L, 3);
    lua_createtable(L, 0, 3); /* 4: the handlers, copied */
    for (int i = 0; i < 3; i++) {
        int type = lua_getfield(L, 3, names[i]);
        if (type != LUA_TFUNCTION && (i == 1 || type != LUA_TNIL))
            return luaL_error(L, "websocket: %s is a %s, not a function%s", names[i],
                              luaL_typename(L, -1), i == 1 ? "" : " (or nil)");
        lua_setfield(L, 4, names[i]);
    }
    lua_getfield(L, 3, "subprotocols");
    const char *subprotocols = opt_subprotocols(L, 5);
    const char *label = lua_pushfstring(L, "WebSocket %s", path);
    struct route *r = malloc(sizeof *r + strlen(label) + 1);
    if (r == NULL)
        return luaL_error(L, "websocket: out of memory");
    r->c = c;
    r->index = c->nroutes + 1;
    strcpy(r->label, label);
    int rc = shmipc_server_websocket(c->s, path, subprotocols, on_ws_open, on_ws_message,
                                     on_ws_close, r, free);
    if (rc < 0)
        return shmipc__lua_push_failure(L, rc);
    lua_rawgeti(L, LUA_REGISTRYINDEX, c->routes_ref);
    lua_pushvalue(L, 4);
    lua_rawseti(L, -2, r->index);
    c->nroutes++;
    lua_settop(L, 1);
    return 1;
}

const luaL_Reg shmipc__lua_ws_methods[] = {
    {"send", ws_send}, {"ping", ws_ping}, {"close", ws_close}, {"subprotocol", ws_subprotocol},
    {NULL, NULL},
};

const luaL_Reg shmipc__lua_ws_meta[] = {
    {"__tostring", ws_tostring},
    {NULL, NULL},
};
