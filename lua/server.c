/*
 * server.c - the HTTP/1.1 server handle, shmipc.server{...}: routes with Lua handlers, static
 * routes served in C, WebSocket routes with Lua callbacks (the shmipc.ws handle), run/start/stop.
 *
 * Threads. The C server calls handlers on its worker threads, but a lua_State is not thread
 * safe. So every Lua state that made a server has one gate (a flag under a mutex and a
 * condition variable): whoever runs Lua code of that state holds it. The Lua side holds it
 * from the first shmipc.server() on, and lets go only while it is blocked in srv:run() or in
 * shmipc.poll(); a worker that has a Lua handler to call waits for the gate, calls the
 * handler, and gives the gate back; WebSocket callbacks do the same. Lua handlers are thus
 * serialized, while static routes, parsing and I/O stay parallel on the workers. Each server
 * has one Lua thread of its own (lua_newthread, anchored in the registry) on which its
 * callbacks run: one is enough, since the gate lets one callback in at a time. User code can
 * reach that thread (coroutine.running() in a handler) and close or resume it between
 * callbacks, so it holds nothing between them: its routes, connections and on_error are in
 * the registry, pushed for each callback, and a thread that is not idle any more is replaced
 * by a spare (shmipc__lua_server_thread). After srv:start() returns to Lua code, workers with
 * a Lua handler to call wait until the Lua side blocks in run() or shmipc.poll().
 *
 * The gate is not a plain mutex because the Lua side may take it on one OS thread and let go
 * of it on another (an embedding program), and because a worker must stop waiting for it
 * when its server is closed (the close holds the gate and waits for the workers).
 *
 * Lifetimes. A started server is anchored in the registry until run() returns or it is
 * closed, so the collector never frees it under its workers. close() (and __gc, __close)
 * stops and frees the server; called inside one of that server's own callbacks it cannot
 * wait for its own worker, so it stops the server and leaves the free to run()'s return or
 * to a close() from outside a callback.
 *
 * Files (lserver.h has what they share): server.c (the server handle and its lifecycle: new,
 * route, static, start, run, stop, close), gate.c (the gate), request.c (Lua route handlers),
 * ws.c (WebSocket routes), server_signals.c (run{signals = true}), server_config.c (the
 * options of shmipc.server{...}).
 * Owns: struct core (what the workers see), the server handle, the callback thread and its
 * error log. May call: the public C API (shmipc_server_*), lshmipc.h and the files above.
 */
#include "lserver.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------ */
/* The server's C side                                                                  */
/* ------------------------------------------------------------------------------------ */

lserver *shmipc__lua_check_server(lua_State *L, int arg)
{
    lserver *u = luaL_checkudata(L, arg, SERVER_MT);
    if (u->c == NULL || u->c->close_pending)
        luaL_error(L, "attempt to use a closed " SERVER_MT);
    return u;
}

/* Worker side: waits for the gate; 0 when the server is closing instead. */
int shmipc__lua_gate_enter_worker(struct core *c)
{
    struct shmipc__lua_gate *g = c->gate;
    pthread_mutex_lock(&g->m);
    while (g->held && !c->closing)
        pthread_cond_wait(&g->cv, &g->m);
    int ok = !c->closing;
    if (ok) {
        g->held = 1;
        g->in_callback = 1;
    }
    pthread_mutex_unlock(&g->m);
    return ok;
}

/* Message handler: the error with a traceback of the handler. */
static int msgh(lua_State *L)
{
    const char *msg = lua_tostring(L, 1);
    if (msg == NULL)
        msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/* Idle: no call in progress, neither suspended nor dead by an error, nothing on its stack. */
static int thread_idle(lua_State *T)
{
    lua_Debug ar;
    return lua_status(T) == LUA_OK && lua_getstack(T, 0, &ar) == 0 && lua_gettop(T) == 0;
}

/* Under pcall on the callback thread, argument the core: makes a new spare thread. */
static int protected_new_spare(lua_State *L)
{
    struct core *c = lua_touserdata(L, 1);
    lua_State *spare = lua_newthread(L);
    int ref = luaL_ref(L, LUA_REGISTRYINDEX);
    luaL_unref(L, LUA_REGISTRYINDEX, c->spare_ref);
    c->spare = spare;
    c->spare_ref = ref;
    return 0;
}

/*
 * Worker side, holding the gate: the thread one of c's callbacks runs on, with the slots T_MSGH
 * to T_WS pushed; the callback empties its stack when done. A callback leaves the thread idle
 * and neither coroutine.close() nor coroutine.resume() from outside changes an idle thread
 * with an empty stack, but should it ever be otherwise (a yielded or failed coroutine, a
 * call in progress), the spare, which never ran, takes its place and a new spare is made on
 * it. NULL, with a line on stderr naming `label`, when no idle thread is left (out of memory).
 */
lua_State *shmipc__lua_server_thread(struct core *c, const char *label)
{
    if (!thread_idle(c->T)) {
        if (!thread_idle(c->spare)) {
            fprintf(stderr, "shmipc.server: %s: no usable Lua thread for the callback\n", label);
            fflush(stderr);
            return NULL;
        }
        lua_State *broken = c->T;
        int broken_ref = c->thread_ref;
        c->T = c->spare;
        c->thread_ref = c->spare_ref;
        c->spare = broken; /* not idle: replaced below */
        c->spare_ref = broken_ref;
    }
    lua_State *T = c->T;
    if (!thread_idle(c->spare)) {
        lua_pushcfunction(T, protected_new_spare);
        lua_pushlightuserdata(T, c);
        if (lua_pcall(T, 1, 0, 0) != LUA_OK)
            lua_pop(T, 1); /* out of memory: tried again next time */
    }
    lua_pushcfunction(T, msgh);
    lua_rawgeti(T, LUA_REGISTRYINDEX, c->on_error_ref);
    lua_rawgeti(T, LUA_REGISTRYINDEX, c->routes_ref);
    lua_rawgeti(T, LUA_REGISTRYINDEX, c->ws_ref);
    return T;
}

/*
 * Under pcall, arguments (on_error or nil, label as light userdata, error value): builds
 * "<label>: <message>" and gives it to on_error, or writes it on stderr.
 */
static int protected_log(lua_State *L)
{
    const char *label = lua_touserdata(L, 2);
    const char *msg = lua_tostring(L, 3);
    msg = lua_pushfstring(L, "%s: %s", label, msg != NULL ? msg : "(error object is not a string)");
    if (lua_isnil(L, 1)) {
        fprintf(stderr, "shmipc.server: %s\n", msg);
        fflush(stderr);
        return 0;
    }
    lua_pushvalue(L, 1);
    lua_insert(L, -2);
    lua_call(L, 1, 0);
    return 0;
}

/*
 * Logs the error on top of T, prefixed with `label`, and pops it. Under the gate. Everything
 * that may allocate runs under pcall: an error must never escape on a worker thread.
 */
void shmipc__lua_server_log_error(lua_State *T, const char *label)
{
    lua_pushcfunction(T, protected_log);
    lua_pushvalue(T, T_ON_ERROR);
    lua_pushlightuserdata(T, (void *)label);
    lua_rotate(T, -4, -1); /* function, on_error, label, error */
    if (lua_pcall(T, 3, 0, 0) != LUA_OK) {
        fprintf(stderr, "shmipc.server: %s: on_error failed: %s\n", label, lua_tostring(T, -1));
        fflush(stderr);
        lua_pop(T, 1);
    }
}

/* ------------------------------------------------------------------------------------ */
/* The server handle                                                                    */
/* ------------------------------------------------------------------------------------ */

static void unanchor(lua_State *L, struct core *c)
{
    luaL_unref(L, LUA_REGISTRYINDEX, c->anchor_ref);
    c->anchor_ref = LUA_NOREF;
}

/* Frees the C server and what belongs to it. On the Lua side, holding the gate. */
static void free_core(lua_State *L, struct core *c)
{
    pthread_mutex_lock(&c->gate->m);
    c->closing = 1;
    pthread_cond_broadcast(&c->gate->cv);
    pthread_mutex_unlock(&c->gate->m);
    /* Workers waiting for the gate answer 503 now, so the stop can end without it. */
    shmipc_server_close(c->s);
    unanchor(L, c);
    luaL_unref(L, LUA_REGISTRYINDEX, c->thread_ref);
    luaL_unref(L, LUA_REGISTRYINDEX, c->spare_ref);
    luaL_unref(L, LUA_REGISTRYINDEX, c->on_error_ref);
    luaL_unref(L, LUA_REGISTRYINDEX, c->routes_ref);
    luaL_unref(L, LUA_REGISTRYINDEX, c->ws_ref);
    shmipc__lua_gate_unref(c->gate);
    free(c);
}

/*
 * __gc, __close and :close(). Safe twice. Inside one of this server's callbacks it only stops
 * the server (its worker cannot wait for itself): run() frees it when it returns, and so does
 * a later close() outside the callbacks.
 */
static int server_close(lua_State *L)
{
    lserver *u = luaL_checkudata(L, 1, SERVER_MT);
    struct core *c = u->c;
    if (c == NULL)
        return 0;
    if (c->busy || c->running) {
        shmipc_server_stop(c->s);
        c->close_pending = 1;
        return 0;
    }
    u->c = NULL;
    free_core(L, c);
    return 0;
}

static int server_tostring(lua_State *L)
{
    lserver *u = luaL_checkudata(L, 1, SERVER_MT);
    if (u->c == NULL || u->c->close_pending)
        lua_pushliteral(L, SERVER_MT " (closed)");
    else
        lua_pushfstring(L, SERVER_MT " (%p)", (void *)u->c->s);
    return 1;
}

/* The optional method at `arg`: nil or "*" is any method (NULL). */
static const char *opt_method(lua_State *L, int arg)
{
    if (lua_isnoneornil(L, arg))
        return NULL;
    const char *m = shmipc__lua_check_cstring(L, arg);
    return strcmp(m, "*") == 0 ? NULL : m;
}

/* route(method, path, handler) -> server; method nil or "*" is any method. */
static int server_route(lua_State *L)
{
    lserver *u = shmipc__lua_check_server(L, 1);
    struct core *c = u->c;
    const char *method = opt_method(L, 2);
    const char *path = shmipc__lua_check_cstring(L, 3);
    luaL_checktype(L, 4, LUA_TFUNCTION);
    const char *label = lua_pushfstring(L, "%s %s", method != NULL ? method : "*", path);
    struct route *r = malloc(sizeof *r + strlen(label) + 1);
    if (r == NULL)
        return luaL_error(L, "route: out of memory");
    r->c = c;
    r->index = c->nroutes + 1;
    strcpy(r->label, label);
    int rc = shmipc_server_route(c->s, method, path, shmipc__lua_server_on_request, r, free);
    if (rc < 0)
        return shmipc__lua_push_failure(L, rc);
    /* No callback reads the table: the Lua side holds the gate and the server is not started. */
    lua_rawgeti(L, LUA_REGISTRYINDEX, c->routes_ref);
    lua_pushvalue(L, 4);
    lua_rawseti(L, -2, r->index);
    c->nroutes++;
    lua_settop(L, 1);
    return 1;
}

/*
 * static(path, body [, content_type [, status [, method]]]) -> server: a fixed response,
 * served in C. status defaults to 200, method to GET (which answers HEAD too).
 */
static int server_static(lua_State *L)
{
    lserver *u = shmipc__lua_check_server(L, 1);
    const char *path = shmipc__lua_check_cstring(L, 2);
    size_t len;
    const char *body = luaL_checklstring(L, 3, &len);
    const char *type = lua_isnoneornil(L, 4) ? NULL : shmipc__lua_check_cstring(L, 4);
    lua_Integer status = luaL_optinteger(L, 5, 200);
    const char *method = lua_isnoneornil(L, 6) ? NULL : shmipc__lua_check_cstring(L, 6);
    if (status < 200 || status > 999)
        return shmipc__lua_push_invalid(L, "static %s: status %I is outside 200..999", path,
                                        status);
    return shmipc__lua_server_self_or_failure(
        L, shmipc_server_static(u->c->s, method, path, (int)status, type, body, len));
}

static void anchor(lua_State *L, struct core *c)
{
    if (c->anchor_ref == LUA_NOREF) {
        lua_pushvalue(L, 1);
        c->anchor_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    }
}

/*
 * start() -> server: binds and starts the workers, and returns. Lua handlers then run while
 * the Lua side is blocked in run() or shmipc.poll().
 */
static int server_start(lua_State *L)
{
    lserver *u = shmipc__lua_check_server(L, 1);
    int rc = shmipc_server_start(u->c->s);
    if (rc < 0)
        return shmipc__lua_push_failure(L, rc);
    anchor(L, u->c);
    lua_settop(L, 1);
    return 1;
}

/*
 * run() -> true: starts the server unless started and serves until stop(), then stops
 * gracefully. Lua handlers run while it waits. Not from a callback.
 */
/*
 * run([opts]) -> true[, "SIGINT"|"SIGTERM"], or nil, message, code. Blocks until stop();
 * opts.signals = true also stops it (gracefully) on SIGINT and SIGTERM, and the second
 * result names the signal that did.
 */
static int server_run(lua_State *L)
{
    lserver *u = shmipc__lua_check_server(L, 1);
    struct core *c = u->c;
    struct sig_watch w;
    int signals = 0, signo = 0;
    if (!lua_isnoneornil(L, 2)) {
        luaL_checktype(L, 2, LUA_TTABLE);
        lua_pushnil(L);
        while (lua_next(L, 2) != 0) {
            if (lua_type(L, -2) != LUA_TSTRING || strcmp(lua_tostring(L, -2), "signals") != 0)
                return luaL_error(L, "run: unknown option '%s'", luaL_tolstring(L, -2, NULL));
            if (lua_type(L, -1) != LUA_TBOOLEAN)
                return luaL_error(L, "run: option 'signals' is a boolean, got a %s",
                                  luaL_typename(L, -1));
            signals = lua_toboolean(L, -1);
            lua_pop(L, 1);
        }
    }
    if (c->gate->in_callback)
        return luaL_error(L, "run: not from a server callback (handlers must not block)");
    if (c->running)
        return luaL_error(L, "run: this server is already running");
    /* Anchored before the signal watch starts: luaL_ref can raise (out of memory), and a raise
     * after shmipc__lua_sig_watch_start would leave the handlers installed and the watcher thread reading
     * this frame's `w` after it is gone. */
    int was_anchored = c->anchor_ref != LUA_NOREF;
    anchor(L, c);
    if (signals) {
        char msg[128];
        int rc = shmipc__lua_sig_watch_start(&w, c->s, msg, sizeof msg);
        if (rc < 0) {
            if (!was_anchored)
                unanchor(L, c);
            luaL_pushfail(L);
            lua_pushstring(L, msg);
            lua_pushinteger(L, rc);
            return 3;
        }
    }
    c->running = 1;
    shmipc__lua_gate_give(c->gate);
    int rc = shmipc_server_run(c->s);
    if (signals)
        signo = shmipc__lua_sig_watch_end(&w);
    shmipc__lua_gate_take(c->gate);
    c->running = 0;
    /* Stopped: nothing runs on the workers any more, so the collector may have it. */
    unanchor(L, c);
    if (c->close_pending) {
        u->c = NULL;
        free_core(L, c);
    }
    if (rc < 0)
        return shmipc__lua_push_failure(L, rc);
    lua_pushboolean(L, 1);
    if (signo == 0)
        return 1;
    lua_pushstring(L, signo == SIGINT ? "SIGINT" : signo == SIGTERM ? "SIGTERM" : "signal");
    return 2;
}

/* stop() -> server: makes run() return soon. Thread safe; fine from a handler. */
static int server_stop(lua_State *L)
{
    return shmipc__lua_server_self_or_failure(
        L, shmipc_server_stop(shmipc__lua_check_server(L, 1)->c->s));
}

/* port() -> the TCP port, or nil, message, code before the server started. */
static int server_port(lua_State *L)
{
    int port = shmipc_server_port(shmipc__lua_check_server(L, 1)->c->s);
    if (port < 0)
        return shmipc__lua_push_failure(L, port);
    lua_pushinteger(L, port);
    return 1;
}

/* backend() -> "io_uring" or "epoll" once started, else nil. */
static int server_backend(lua_State *L)
{
    const char *b = shmipc_server_backend(shmipc__lua_check_server(L, 1)->c->s);
    if (b == NULL)
        lua_pushnil(L);
    else
        lua_pushstring(L, b);
    return 1;
}

/*
 * shmipc.server([opts]) -> server, or nil, message, code when an option is refused. Options:
 * address, port, workers, backend, header_timeout, keepalive_timeout, stop_timeout (seconds),
 * max_request_line, max_head_bytes, max_headers, max_body, pipeline, max_ws_message,
 * ws_ping_timeout, ws_idle_timeout (seconds, 0: never), ws_send_high_water, ws_send_limit,
 * server_name (false: no Server header), reuse_port (true: share the port with another
 * server listening there; else start fails with EADDRINUSE), on_error (function(message), called for each
 * handler error; default: a line on stderr).
 */
static int l_server(lua_State *L)
{
    if (!lua_isnoneornil(L, 1))
        luaL_checktype(L, 1, LUA_TTABLE);
    else {
        lua_settop(L, 0);
        lua_newtable(L);
    }
    lua_settop(L, 1);
    struct shmipc__lua_gate *g = shmipc__lua_gate_get(L);

    /* 2: the config box. */
    shmipc_server_config **box = lua_newuserdatauv(L, sizeof *box, 0);
    *box = NULL;
    lua_createtable(L, 0, 1);
    lua_pushcfunction(L, shmipc__lua_server_config_box_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    int rc = shmipc_server_config_new(box);
    if (rc < 0)
        return shmipc__lua_push_failure(L, rc);
    int nres = shmipc__lua_server_build_config(L, *box);
    if (nres != 0)
        return nres;

    /* 3: the handle, which owns the core from here on. */
    lserver *u = lua_newuserdatauv(L, sizeof *u, 0);
    u->c = NULL;
    luaL_setmetatable(L, SERVER_MT);
    struct core *c = calloc(1, sizeof *c);
    if (c == NULL)
        return luaL_error(L, "shmipc.server: out of memory");
    c->gate = g;
    c->anchor_ref = LUA_NOREF;
    c->thread_ref = LUA_NOREF;
    c->spare_ref = LUA_NOREF;
    c->on_error_ref = LUA_NOREF;
    c->routes_ref = LUA_NOREF;
    c->ws_ref = LUA_NOREF;
    pthread_mutex_lock(&g->m);
    g->refs++;
    pthread_mutex_unlock(&g->m);
    u->c = c;
    rc = shmipc_server_new(*box, &c->s);
    shmipc_server_config_free(*box); /* the server copied it */
    *box = NULL;
    if (rc < 0) {
        u->c = NULL;
        free_core(L, c);
        return shmipc__lua_push_failure(L, rc);
    }

    /* The callback thread, its spare, and what the callbacks' slots hold. */
    c->T = lua_newthread(L);
    c->thread_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    c->spare = lua_newthread(L);
    c->spare_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    if (lua_getfield(L, 1, "on_error") != LUA_TFUNCTION) {
        lua_pop(L, 1);
        lua_pushnil(L);
    }
    c->on_error_ref = luaL_ref(L, LUA_REGISTRYINDEX); /* LUA_REFNIL for nil */
    lua_newtable(L);
    c->routes_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_newtable(L);
    c->ws_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_settop(L, 3);
    return 1;
}

static const luaL_Reg server_methods[] = {
    {"route", server_route},
    {"static", server_static},
    {"start", server_start},
    {"run", server_run},
    {"stop", server_stop},
    {"port", server_port},
    {"backend", server_backend},
    {"close", server_close},
    {"websocket", shmipc__lua_server_websocket},
    {NULL, NULL},
};

static const luaL_Reg server_meta[] = {
    {"__gc", server_close},
    {"__close", server_close},
    {"__tostring", server_tostring},
    {NULL, NULL},
};

static const luaL_Reg functions[] = {
    {"server", l_server},
    {NULL, NULL},
};

void shmipc__lua_open_server(lua_State *L)
{
    shmipc__lua_new_class(L, SERVER_MT, server_meta, server_methods);
    shmipc__lua_new_class(L, WS_MT, shmipc__lua_ws_meta, shmipc__lua_ws_methods);
    luaL_newmetatable(L, REQUEST_MT);
    luaL_setfuncs(L, shmipc__lua_request_meta, 0);
    lua_pop(L, 1);
    luaL_newmetatable(L, PENDING_MT);
    luaL_setfuncs(L, shmipc__lua_pending_meta, 0);
    lua_newtable(L);
    luaL_setfuncs(L, shmipc__lua_pending_methods, 0);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
    luaL_newmetatable(L, GATE_MT);
    luaL_setfuncs(L, shmipc__lua_gate_meta, 0);
    lua_pop(L, 1);
    luaL_setfuncs(L, functions, 0);
}
