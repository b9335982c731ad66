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
 * callbacks run: one is enough, since the gate lets one callback in at a time. After
 * srv:start() returns to Lua code, workers with a Lua handler to call wait until the Lua side
 * blocks in run() or shmipc.poll().
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
 */
#include "lshmipc.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define SERVER_MT  "shmipc.server"
#define REQUEST_MT "shmipc.request"
#define GATE_MT    "shmipc.gate"
#define WS_MT      "shmipc.ws"

/* ------------------------------------------------------------------------------------ */
/* The gate                                                                             */
/* ------------------------------------------------------------------------------------ */

struct shmipc__lua_gate {
    pthread_mutex_t m;
    pthread_cond_t cv;
    int held;        /* someone runs Lua code of this state */
    int in_callback; /* ... and it is a worker in a callback, not the Lua side */
    int refs;        /* the registry's box and every server */
};

/* The registry key of the state's gate box. */
static const char gate_key = 0;

static void gate_unref(struct shmipc__lua_gate *g)
{
    pthread_mutex_lock(&g->m);
    int last = --g->refs == 0;
    pthread_mutex_unlock(&g->m);
    if (last) {
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->m);
        free(g);
    }
}

static int gate_box_gc(lua_State *L)
{
    struct shmipc__lua_gate **box = luaL_checkudata(L, 1, GATE_MT);
    if (*box != NULL)
        gate_unref(*box);
    *box = NULL;
    return 0;
}

/* The state's gate, or NULL when this state has made no server yet. */
static struct shmipc__lua_gate *find_gate(lua_State *L)
{
    struct shmipc__lua_gate *g = NULL;
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &gate_key) == LUA_TUSERDATA)
        g = *(struct shmipc__lua_gate **)lua_touserdata(L, -1);
    lua_pop(L, 1);
    return g;
}

/* The state's gate, made on first use, held by the Lua side from then on. Raises on ENOMEM. */
static struct shmipc__lua_gate *get_gate(lua_State *L)
{
    struct shmipc__lua_gate *g = find_gate(L);
    if (g != NULL)
        return g;
    struct shmipc__lua_gate **box = lua_newuserdatauv(L, sizeof *box, 0);
    *box = NULL;
    luaL_setmetatable(L, GATE_MT);
    g = calloc(1, sizeof *g);
    if (g == NULL)
        luaL_error(L, "shmipc.server: out of memory");
    pthread_mutex_init(&g->m, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->held = 1;
    g->refs = 1;
    *box = g;
    lua_rawsetp(L, LUA_REGISTRYINDEX, &gate_key);
    return g;
}

/* Lua side: waits for the gate (a worker may be running a callback). */
static void gate_enter_lua(struct shmipc__lua_gate *g)
{
    pthread_mutex_lock(&g->m);
    while (g->held)
        pthread_cond_wait(&g->cv, &g->m);
    g->held = 1;
    pthread_mutex_unlock(&g->m);
}

static void gate_leave(struct shmipc__lua_gate *g)
{
    pthread_mutex_lock(&g->m);
    g->held = 0;
    g->in_callback = 0;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->m);
}

struct shmipc__lua_gate *shmipc__lua_gate_leave(lua_State *L)
{
    struct shmipc__lua_gate *g = find_gate(L);
    /* Inside a callback the worker holds the gate for its whole call: never let go there. */
    if (g == NULL || g->in_callback)
        return NULL;
    gate_leave(g);
    return g;
}

void shmipc__lua_gate_enter(struct shmipc__lua_gate *g)
{
    if (g != NULL)
        gate_enter_lua(g);
}

/* ------------------------------------------------------------------------------------ */
/* The server's C side                                                                  */
/* ------------------------------------------------------------------------------------ */

/* Slots of the callback thread's stack, set up once by shmipc.server(). */
enum {
    T_MSGH = 1,     /* the message handler, which adds a traceback */
    T_ON_ERROR = 2, /* on_error or nil */
    T_ROUTES = 3,   /* route index -> handler function, or table of WebSocket handlers */
    T_WS = 4,       /* open WebSocket connections: shmipc_ws (light userdata) -> handle */
    T_NSLOTS = T_WS,
};

/*
 * What the workers see; freed after shmipc_server_free(), so it outlives the routes. Fields
 * other than `closing` are used by the Lua side and, inside callbacks, by the gate holder.
 */
struct core {
    shmipc_server *s;
    struct shmipc__lua_gate *gate;
    lua_State *T;      /* the thread callbacks run on */
    int thread_ref;    /* registry reference of T */
    int anchor_ref;    /* registry reference of the handle while started, else LUA_NOREF */
    int closing;       /* under gate->m: waiting workers give up */
    int busy;          /* one of this server's callbacks runs */
    int running;       /* the Lua side is in run() */
    int close_pending; /* closed inside its own callback: free when possible */
    int nroutes;       /* Lua handlers registered */
    void *cur_request; /* the request handle of the running handler */
    int applying;      /* the handler returned: its results are being applied */
};

/* One Lua route: the C handler's user_data. */
struct route {
    struct core *c;
    int index;    /* in T_ROUTES */
    char label[]; /* "GET /items", for the error log */
};

typedef struct {
    struct core *c; /* NULL once closed */
} lserver;

static lserver *check_server(lua_State *L, int arg)
{
    lserver *u = luaL_checkudata(L, arg, SERVER_MT);
    if (u->c == NULL || u->c->close_pending)
        luaL_error(L, "attempt to use a closed " SERVER_MT);
    return u;
}

/* A request inside its handler; req is NULL after the handler returned. */
typedef struct {
    const shmipc_http_request *req;
} lrequest;

/* Worker side: waits for the gate; 0 when the server is closing instead. */
static int gate_enter_worker(struct core *c)
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
static void log_error(lua_State *T, const char *label)
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

typedef const char *(*request_field)(const shmipc_http_request *, size_t *);

/*
 * __index: req.method, req.path, req.query (nil when the target has none), req.wildcard,
 * req.body, req.version (1.0 or 1.1, as a number), and the methods header and headers.
 */
static int request_index(lua_State *L)
{
    static const char *const names[] = {"method",  "path",   "query",   "wildcard", "body",
                                        "version", "header", "headers", NULL};
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
    } else {
        lua_pushcfunction(L, which == 6 ? request_header : request_headers);
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
static int self_or_failure(lua_State *L, int rc)
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

static void add_header(lua_State *L, shmipc_http_response *res, int name, int value)
{
    if (lua_type(L, value) != LUA_TSTRING && lua_type(L, value) != LUA_TNUMBER)
        luaL_error(L, "header %s: the value is a %s, not a string", lua_tostring(L, name),
                   luaL_typename(L, value));
    size_t nlen, vlen;
    const char *n = lua_tolstring(L, name, &nlen);
    const char *v = lua_tolstring(L, value, &vlen);
    if (strlen(n) != nlen || strlen(v) != vlen)
        luaL_error(L, "header %s: contains a NUL byte", n);
    check_set(L, shmipc_http_response_add_header(res, n, v), "header");
}

/* The headers at `idx`: a table of name -> value or array of values, or a Content-Type. */
static void apply_headers(lua_State *L, shmipc_http_response *res, int idx)
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

static void apply_body(lua_State *L, shmipc_http_response *res, int idx)
{
    size_t len;
    if (lua_isnil(L, idx))
        return;
    if (lua_type(L, idx) != LUA_TSTRING)
        luaL_error(L, "body: a %s, not a string", luaL_typename(L, idx));
    const char *body = lua_tolstring(L, idx, &len);
    check_set(L, shmipc_http_response_body(res, body, len), "body");
}

static void apply_status(lua_State *L, shmipc_http_response *res, int idx)
{
    int isint = 0;
    lua_Integer status = lua_tointegerx(L, idx, &isint);
    if (lua_type(L, idx) != LUA_TNUMBER || !isint)
        luaL_error(L, "status: a %s, not an integer", luaL_typename(L, idx));
    if (status < 200 || status > 999)
        luaL_error(L, "status: %I is outside 200..999", status);
    check_set(L, shmipc_http_response_set_status(res, (int)status), "status");
}

/*
 * Turns what a handler returned (at `first`, three values) into the response:
 *   status, body [, headers]   status an integer, body a string or nil, headers a table
 *                              (name -> value or array of values) or a string (Content-Type)
 *   body                       a string: 200
 *   {status =, body =, headers =}
 *   nothing (nil)              204 No Content
 */
static void apply_result(lua_State *L, shmipc_http_response *res, int first)
{
    switch (lua_type(L, first)) {
    case LUA_TNIL:
        check_set(L, shmipc_http_response_set_status(res, 204), "status");
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
    luaL_setmetatable(T, REQUEST_MT);
    r->c->cur_request = req;
    lua_call(T, 1, 3);
    req->req = NULL;
    r->c->applying = 1;
    apply_result(T, res, 5);
    return 0;
}

/* The C handler of every Lua route, on a worker thread. */
static int on_request(shmipc_http_request *req, shmipc_http_response *res, void *user_data)
{
    struct route *r = user_data;
    struct core *c = r->c;
    int rc = 0;
    if (!gate_enter_worker(c)) {
        shmipc_http_response_set_status(res, 503);
        shmipc_http_response_add_header(res, "Content-Type", "text/plain");
        return shmipc_http_response_body(res, "server closing\n", 15);
    }
    lua_State *T = c->T;
    c->busy = 1;
    c->cur_request = NULL;
    c->applying = 0;
    lua_settop(T, T_NSLOTS);
    lua_pushcfunction(T, protected_request);
    lua_pushlightuserdata(T, r);
    lua_pushlightuserdata(T, req);
    lua_pushlightuserdata(T, res);
    lua_pushvalue(T, T_ROUTES);
    if (lua_pcall(T, 4, 0, T_MSGH) != LUA_OK) {
        if (c->cur_request != NULL)
            ((lrequest *)c->cur_request)->req = NULL;
        log_error(T, r->label);
        if (c->applying) {
            rc = -1; /* part of the response is set: the server answers 500 and closes */
        } else {
            shmipc_http_response_set_status(res, 500);
            shmipc_http_response_add_header(res, "Content-Type", "text/plain");
            shmipc_http_response_body(res, "internal server error\n", 22);
        }
    }
    lua_settop(T, T_NSLOTS);
    c->busy = 0;
    gate_leave(c->gate);
    return rc;
}

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
    return self_or_failure(L, shmipc_ws_send(u->ws, kind, data, len));
}

/* ws:ping([data]) -> ws: at most 125 bytes. */
static int ws_ping(lua_State *L)
{
    lws *u = check_ws(L, 1);
    size_t len = 0;
    const char *data = luaL_optlstring(L, 2, "", &len);
    return self_or_failure(L, shmipc_ws_ping(u->ws, data, len));
}

/* ws:close([code [, reason]]) -> ws: starts the close handshake (1000 by default). */
static int ws_close(lua_State *L)
{
    lws *u = check_ws(L, 1);
    lua_Integer code = luaL_optinteger(L, 2, 1000);
    const char *reason = lua_isnoneornil(L, 3) ? NULL : shmipc__lua_check_cstring(L, 3);
    if (code < 1000 || code > 4999)
        return shmipc__lua_push_invalid(L, "close: code %I is outside 1000..4999", code);
    return self_or_failure(L, shmipc_ws_close(u->ws, (int)code, reason));
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

/* Runs `fn` for event `e` on T, holding the gate; logs an error. Returns 0 or -1 (it raised). */
static int call_ws(struct core *c, lua_CFunction fn, struct ws_event *e, const char *what)
{
    lua_State *T = c->T;
    int rc = 0;
    c->busy = 1;
    c->cur_request = NULL;
    lua_settop(T, T_NSLOTS);
    lua_pushcfunction(T, fn);
    lua_pushlightuserdata(T, e);
    lua_pushvalue(T, T_ROUTES);
    lua_pushvalue(T, T_WS);
    if (lua_pcall(T, 3, 0, T_MSGH) != LUA_OK) {
        if (c->cur_request != NULL)
            ((lrequest *)c->cur_request)->req = NULL;
        char label[256];
        snprintf(label, sizeof label, "%s %s", e->r->label, what);
        log_error(T, label);
        rc = -1;
    }
    lua_settop(T, T_NSLOTS);
    c->busy = 0;
    return rc;
}

/* Forgets the connection's handle: it raises from now on. Holding the gate. */
static void ws_forget(struct core *c, shmipc_ws *ws)
{
    lws *u = shmipc_ws_data(ws);
    if (u == NULL)
        return;
    u->ws = NULL;
    shmipc_ws_set_data(ws, NULL);
    lua_pushnil(c->T);
    lua_rawsetp(c->T, T_WS, ws);
}

static int on_ws_open(shmipc_ws *ws, const shmipc_http_request *req, void *user_data)
{
    struct route *r = user_data;
    struct core *c = r->c;
    struct ws_event e = {.r = r, .ws = ws, .req = req};
    if (!gate_enter_worker(c))
        return -1;
    if (call_ws(c, protected_ws_open, &e, "on_open") < 0 || !e.accepted) {
        e.accepted = 0;
        ws_forget(c, ws);
    }
    gate_leave(c->gate);
    return e.accepted ? 0 : -1;
}

static void on_ws_message(shmipc_ws *ws, int kind, const void *data, size_t len, void *user_data)
{
    struct route *r = user_data;
    struct ws_event e = {.r = r, .ws = ws, .kind = kind, .data = data, .len = len};
    if (!gate_enter_worker(r->c))
        return;
    call_ws(r->c, protected_ws_message, &e, "on_message");
    gate_leave(r->c->gate);
}

static void on_ws_close(shmipc_ws *ws, int code, const char *reason, size_t reason_len,
                        void *user_data)
{
    struct route *r = user_data;
    struct ws_event e = {.r = r, .ws = ws, .code = code, .data = reason, .len = reason_len};
    if (!gate_enter_worker(r->c)) {
        /*
         * The server is being freed by a holder of the gate, which waits for this worker:
         * the handle stays anchored in T_WS until then, and only needs to learn that the
         * connection is gone.
         */
        lws *u = shmipc_ws_data(ws);
        if (u != NULL)
            u->ws = NULL;
        return;
    }
    call_ws(r->c, protected_ws_close, &e, "on_close");
    ws_forget(r->c, ws);
    gate_leave(r->c->gate);
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
static int server_websocket(lua_State *L)
{
    static const char *const names[] = {"on_open", "on_message", "on_close"};
    lserver *u = check_server(L, 1);
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
    lua_pushvalue(L, 4);
    lua_xmove(L, c->T, 1);
    lua_rawseti(c->T, T_ROUTES, r->index);
    c->nroutes++;
    lua_settop(L, 1);
    return 1;
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
    shmipc_server_free(c->s);
    unanchor(L, c);
    luaL_unref(L, LUA_REGISTRYINDEX, c->thread_ref);
    gate_unref(c->gate);
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
    lserver *u = check_server(L, 1);
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
    int rc = shmipc_server_route(c->s, method, path, on_request, r, free);
    if (rc < 0)
        return shmipc__lua_push_failure(L, rc);
    /* T is not running: the Lua side holds the gate and the server is not started. */
    lua_pushvalue(L, 4);
    lua_xmove(L, c->T, 1);
    lua_rawseti(c->T, T_ROUTES, r->index);
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
    lserver *u = check_server(L, 1);
    const char *path = shmipc__lua_check_cstring(L, 2);
    size_t len;
    const char *body = luaL_checklstring(L, 3, &len);
    const char *type = lua_isnoneornil(L, 4) ? NULL : shmipc__lua_check_cstring(L, 4);
    lua_Integer status = luaL_optinteger(L, 5, 200);
    const char *method = lua_isnoneornil(L, 6) ? NULL : shmipc__lua_check_cstring(L, 6);
    if (status < 200 || status > 999)
        return shmipc__lua_push_invalid(L, "static %s: status %I is outside 200..999", path,
                                        status);
    return self_or_failure(
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
    lserver *u = check_server(L, 1);
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
 * run{signals = true}: SIGINT and SIGTERM stop the server gracefully instead of killing the
 * process. The handler only writes the signal number to a self-pipe (write() is
 * async-signal-safe; the pipe is non-blocking, and a full pipe already holds a wake-up); a
 * watcher thread that run() starts and joins reads it and calls shmipc_server_stop(). The
 * pipe is created once and never closed, so a handler still running on some thread when
 * run() restores the old dispositions never writes to a closed or reused descriptor. Signal
 * dispositions are per process, so one such run() at a time (else EBUSY).
 */
static int sig_pipe[2] = {-1, -1};
static pthread_mutex_t sig_lock = PTHREAD_MUTEX_INITIALIZER;
static int sig_busy;
static const int stop_signals[] = {SIGINT, SIGTERM};
#define NSTOP_SIGNALS (sizeof stop_signals / sizeof stop_signals[0])

static void on_stop_signal(int signo)
{
    int saved = errno;
    unsigned char b = (unsigned char)signo;
    ssize_t n = write(sig_pipe[1], &b, 1);
    (void)n;
    errno = saved;
}

struct sig_watch {
    shmipc_server *s;
    int quit_fd; /* eventfd: run() returned, the watcher ends */
    int signo;   /* the first stop signal seen; read after the join */
    pthread_t thread;
    struct sigaction old[NSTOP_SIGNALS];
};

static void drain_sig_pipe(int *first)
{
    unsigned char b;
    while (read(sig_pipe[0], &b, 1) == 1)
        if (first != NULL && *first == 0)
            *first = b;
}

static void *sig_watch_main(void *arg)
{
    struct sig_watch *w = arg;
    for (;;) {
        struct pollfd p[2] = {{.fd = sig_pipe[0], .events = POLLIN},
                              {.fd = w->quit_fd, .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[1].revents != 0)
            break;
        if (p[0].revents != 0) {
            drain_sig_pipe(&w->signo);
            shmipc_server_stop(w->s);
        }
    }
    return NULL;
}

/* Installs the stop handlers and starts the watcher; 0, or a negative code and `msg`. */
static int sig_watch_start(struct sig_watch *w, shmipc_server *s, char *msg, size_t cap)
{
    struct sigaction sa;
    int rc = 0;
    memset(w, 0, sizeof *w);
    w->s = s;
    w->quit_fd = -1;
    pthread_mutex_lock(&sig_lock);
    if (sig_busy) {
        rc = SHMIPC_EBUSY;
        snprintf(msg, cap, "run: another run{signals = true} is active in this process");
        goto out;
    }
    if (sig_pipe[0] < 0 && pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
        rc = SHMIPC_EMFILE;
        snprintf(msg, cap, "run: pipe2: %s", strerror(errno));
        goto out;
    }
    drain_sig_pipe(NULL);
    w->quit_fd = eventfd(0, EFD_CLOEXEC);
    if (w->quit_fd < 0) {
        rc = SHMIPC_EMFILE;
        snprintf(msg, cap, "run: eventfd: %s", strerror(errno));
        goto out;
    }
    if ((rc = pthread_create(&w->thread, NULL, sig_watch_main, w)) != 0) {
        snprintf(msg, cap, "run: pthread_create: %s", strerror(rc));
        rc = SHMIPC_ENOMEM;
        close(w->quit_fd);
        w->quit_fd = -1;
        goto out;
    }
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < NSTOP_SIGNALS; i++)
        sigaction(stop_signals[i], &sa, &w->old[i]);
    sig_busy = 1;
out:
    pthread_mutex_unlock(&sig_lock);
    return rc;
}

/* Restores the dispositions, ends the watcher; returns the stop signal seen, or 0. */
static int sig_watch_end(struct sig_watch *w)
{
    uint64_t one = 1;
    ssize_t n;
    pthread_mutex_lock(&sig_lock);
    for (size_t i = 0; i < NSTOP_SIGNALS; i++)
        sigaction(stop_signals[i], &w->old[i], NULL);
    n = write(w->quit_fd, &one, sizeof one);
    (void)n;
    pthread_join(w->thread, NULL);
    close(w->quit_fd);
    sig_busy = 0;
    pthread_mutex_unlock(&sig_lock);
    return w->signo;
}

/*
 * run([opts]) -> true[, "SIGINT"|"SIGTERM"], or nil, message, code. Blocks until stop();
 * opts.signals = true also stops it (gracefully) on SIGINT and SIGTERM, and the second
 * result names the signal that did.
 */
static int server_run(lua_State *L)
{
    lserver *u = check_server(L, 1);
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
     * after sig_watch_start would leave the handlers installed and the watcher thread reading
     * this frame's `w` after it is gone. */
    int was_anchored = c->anchor_ref != LUA_NOREF;
    anchor(L, c);
    if (signals) {
        char msg[128];
        int rc = sig_watch_start(&w, c->s, msg, sizeof msg);
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
    gate_leave(c->gate);
    int rc = shmipc_server_run(c->s);
    if (signals)
        signo = sig_watch_end(&w);
    gate_enter_lua(c->gate);
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
    return self_or_failure(L, shmipc_server_stop(check_server(L, 1)->c->s));
}

/* port() -> the TCP port, or nil, message, code before the server started. */
static int server_port(lua_State *L)
{
    int port = shmipc_server_port(check_server(L, 1)->c->s);
    if (port < 0)
        return shmipc__lua_push_failure(L, port);
    lua_pushinteger(L, port);
    return 1;
}

/* backend() -> "io_uring" or "epoll" once started, else nil. */
static int server_backend(lua_State *L)
{
    const char *b = shmipc_server_backend(check_server(L, 1)->c->s);
    if (b == NULL)
        lua_pushnil(L);
    else
        lua_pushstring(L, b);
    return 1;
}

/* ------------------------------------------------------------------------------------ */
/* shmipc.server{...}                                                                   */
/* ------------------------------------------------------------------------------------ */

static const char *const backend_names[] = {"default", "auto",          "io_uring",
                                            "epoll",   "epoll_oneshot", NULL};

#define T(t) (1u << (t))

enum opt_kind {
    O_ADDRESS,
    O_PORT,
    O_WORKERS,
    O_BACKEND,
    O_TIMEOUT,
    O_LIMIT,
    O_NAME,
    O_REUSE_PORT,
    O_ON_ERROR
};

/*
 * The options, in the order they are applied (whatever the order of the table): the limits
 * checked against each other come in the order that lets any consistent pair pass from the
 * defaults, the WebSocket send queue's high-water mark before its limit.
 */
static const struct server_option {
    const char *name;
    enum opt_kind kind;
    int which; /* the timeout or limit */
    unsigned types;
} server_options[] = {
    {"address", O_ADDRESS, 0, T(LUA_TSTRING)},
    {"port", O_PORT, 0, T(LUA_TNUMBER)},
    {"workers", O_WORKERS, 0, T(LUA_TNUMBER)},
    {"backend", O_BACKEND, 0, T(LUA_TSTRING)},
    {"header_timeout", O_TIMEOUT, SHMIPC_SERVER_TIMEOUT_HEADER, T(LUA_TNUMBER)},
    {"keepalive_timeout", O_TIMEOUT, SHMIPC_SERVER_TIMEOUT_KEEPALIVE, T(LUA_TNUMBER)},
    {"stop_timeout", O_TIMEOUT, SHMIPC_SERVER_TIMEOUT_STOP, T(LUA_TNUMBER)},
    {"max_request_line", O_LIMIT, SHMIPC_SERVER_LIMIT_REQUEST_LINE, T(LUA_TNUMBER)},
    {"max_head_bytes", O_LIMIT, SHMIPC_SERVER_LIMIT_HEAD_BYTES, T(LUA_TNUMBER)},
    {"max_headers", O_LIMIT, SHMIPC_SERVER_LIMIT_HEADERS, T(LUA_TNUMBER)},
    {"max_body", O_LIMIT, SHMIPC_SERVER_LIMIT_BODY, T(LUA_TNUMBER)},
    {"pipeline", O_LIMIT, SHMIPC_SERVER_LIMIT_PIPELINE, T(LUA_TNUMBER)},
    {"max_ws_message", O_LIMIT, SHMIPC_SERVER_LIMIT_WS_MESSAGE, T(LUA_TNUMBER)},
    {"ws_ping_timeout", O_TIMEOUT, SHMIPC_SERVER_TIMEOUT_WS_PING, T(LUA_TNUMBER)},
    {"ws_idle_timeout", O_TIMEOUT, SHMIPC_SERVER_TIMEOUT_WS_IDLE, T(LUA_TNUMBER)},
    {"ws_send_high_water", O_LIMIT, SHMIPC_SERVER_LIMIT_WS_SEND_HIGH_WATER, T(LUA_TNUMBER)},
    {"ws_send_limit", O_LIMIT, SHMIPC_SERVER_LIMIT_WS_SEND_LIMIT, T(LUA_TNUMBER)},
    {"server_name", O_NAME, 0, T(LUA_TSTRING) | T(LUA_TBOOLEAN)},
    {"reuse_port", O_REUSE_PORT, 0, T(LUA_TBOOLEAN)},
    {"on_error", O_ON_ERROR, 0, T(LUA_TFUNCTION)},
};
#define NSERVER_OPTIONS (sizeof server_options / sizeof server_options[0])

static const struct server_option *find_server_option(const char *name)
{
    for (size_t i = 0; i < NSERVER_OPTIONS; i++)
        if (strcmp(server_options[i].name, name) == 0)
            return &server_options[i];
    return NULL;
}

/* An integer option at the top of the stack; raises when it is a float. */
static lua_Integer int_option(lua_State *L, const char *name)
{
    int isint = 0;
    lua_Integer v = lua_tointegerx(L, -1, &isint);
    if (!isint)
        luaL_error(L, "shmipc.server: option '%s' must be an integer", name);
    return v;
}

/*
 * Applies the option `o` at the top of the stack to `cfg`. Returns 0, or the number of
 * results pushed (nil, message, code) when the value is refused.
 */
static int apply_server_option(lua_State *L, shmipc_server_config *cfg,
                               const struct server_option *o)
{
    int rc = 0;
    lua_Integer v;
    uint32_t ms;
    int nres;
    switch (o->kind) {
    case O_ADDRESS:
        rc = shmipc_server_config_set_address(cfg, shmipc__lua_check_cstring(L, -1));
        break;
    case O_PORT:
        v = int_option(L, o->name);
        if (v < 0 || v > 65535)
            return shmipc__lua_push_invalid(L, "port: %I is outside 0..65535", v);
        rc = shmipc_server_config_set_port(cfg, (int)v);
        break;
    case O_WORKERS:
        v = int_option(L, o->name);
        if (v < 0 || v > 1024)
            return shmipc__lua_push_invalid(L, "workers: %I is outside 0..1024", v);
        rc = shmipc_server_config_set_workers(cfg, (unsigned)v);
        break;
    case O_BACKEND: {
        int b = -1;
        const char *name = lua_tostring(L, -1);
        for (int i = 0; backend_names[i] != NULL; i++)
            if (strcmp(backend_names[i], name) == 0)
                b = i;
        if (b < 0)
            return shmipc__lua_push_invalid(L,
                                            "backend: \"%s\" is not one of \"default\", \"auto\", "
                                            "\"io_uring\", \"epoll\", \"epoll_oneshot\"",
                                            name);
        rc = shmipc_server_config_set_backend(cfg, b);
        break;
    }
    case O_TIMEOUT:
        if ((nres = shmipc__lua_seconds_to_ms(L, lua_gettop(L), o->name, &ms)) != 0)
            return nres;
        rc = shmipc_server_config_set_timeout_ms(cfg, o->which, ms);
        break;
    case O_LIMIT:
        v = int_option(L, o->name);
        if (v < 0)
            return shmipc__lua_push_invalid(L, "%s: %I is negative", o->name, v);
        rc = shmipc_server_config_set_limit(cfg, o->which, (uint64_t)v);
        break;
    case O_NAME:
        if (lua_type(L, -1) == LUA_TBOOLEAN) {
            if (lua_toboolean(L, -1))
                luaL_error(L, "shmipc.server: option 'server_name' is a string, or false for none");
            rc = shmipc_server_config_set_server_name(cfg, NULL);
        } else {
            rc = shmipc_server_config_set_server_name(cfg, shmipc__lua_check_cstring(L, -1));
        }
        break;
    case O_REUSE_PORT:
        rc = shmipc_server_config_set_reuse_port(cfg, lua_toboolean(L, -1));
        break;
    case O_ON_ERROR:
        break; /* kept by the caller */
    }
    return rc < 0 ? shmipc__lua_push_failure(L, rc) : 0;
}

/*
 * Builds the C config from the options at 1: every name and type is checked first, then the
 * options are applied in the order of server_options.
 */
static int build_config(lua_State *L, shmipc_server_config *cfg)
{
    lua_pushnil(L);
    while (lua_next(L, 1) != 0) {
        if (lua_type(L, -2) != LUA_TSTRING)
            return luaL_error(L, "shmipc.server: option names are strings, got a %s",
                              luaL_typename(L, -2));
        const struct server_option *o = find_server_option(lua_tostring(L, -2));
        if (o == NULL)
            return luaL_error(L, "shmipc.server: unknown option '%s'", lua_tostring(L, -2));
        if ((o->types & T(lua_type(L, -1))) == 0)
            return luaL_error(L, "shmipc.server: option '%s' got a %s", o->name,
                              luaL_typename(L, -1));
        lua_pop(L, 1);
    }
    for (size_t i = 0; i < NSERVER_OPTIONS; i++) {
        if (lua_getfield(L, 1, server_options[i].name) != LUA_TNIL) {
            int nres = apply_server_option(L, cfg, &server_options[i]);
            if (nres != 0)
                return nres;
        }
        lua_pop(L, 1);
    }
    return 0;
}

/* Holds the C config while the options are applied, so an error raised there leaks nothing. */
static int config_box_gc(lua_State *L)
{
    shmipc_server_config **box = lua_touserdata(L, 1);
    shmipc_server_config_free(*box);
    *box = NULL;
    return 0;
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
    struct shmipc__lua_gate *g = get_gate(L);

    /* 2: the config box. */
    shmipc_server_config **box = lua_newuserdatauv(L, sizeof *box, 0);
    *box = NULL;
    lua_createtable(L, 0, 1);
    lua_pushcfunction(L, config_box_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    int rc = shmipc_server_config_new(box);
    if (rc < 0)
        return shmipc__lua_push_failure(L, rc);
    int nres = build_config(L, *box);
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

    /* The callback thread and its fixed slots. */
    c->T = lua_newthread(L);
    c->thread_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushcfunction(c->T, msgh);
    if (lua_getfield(L, 1, "on_error") == LUA_TFUNCTION)
        lua_xmove(L, c->T, 1);
    else {
        lua_pop(L, 1);
        lua_pushnil(c->T);
    }
    lua_newtable(c->T);
    lua_newtable(c->T);
    lua_settop(L, 3);
    return 1;
}

static const luaL_Reg server_methods[] = {
    {"route", server_route},         {"static", server_static},
    {"start", server_start},         {"run", server_run},
    {"stop", server_stop},           {"port", server_port},
    {"backend", server_backend},     {"close", server_close},
    {"websocket", server_websocket}, {NULL, NULL},
};

static const luaL_Reg ws_methods[] = {
    {"send", ws_send}, {"ping", ws_ping}, {"close", ws_close}, {"subprotocol", ws_subprotocol},
    {NULL, NULL},
};

static const luaL_Reg ws_meta[] = {
    {"__tostring", ws_tostring},
    {NULL, NULL},
};

static const luaL_Reg server_meta[] = {
    {"__gc", server_close},
    {"__close", server_close},
    {"__tostring", server_tostring},
    {NULL, NULL},
};

static const luaL_Reg request_meta[] = {
    {"__index", request_index},
    {"__tostring", request_tostring},
    {NULL, NULL},
};

static const luaL_Reg gate_meta[] = {
    {"__gc", gate_box_gc},
    {NULL, NULL},
};

static const luaL_Reg functions[] = {
    {"server", l_server},
    {NULL, NULL},
};

void shmipc__lua_open_server(lua_State *L)
{
    shmipc__lua_new_class(L, SERVER_MT, server_meta, server_methods);
    shmipc__lua_new_class(L, WS_MT, ws_meta, ws_methods);
    luaL_newmetatable(L, REQUEST_MT);
    luaL_setfuncs(L, request_meta, 0);
    lua_pop(L, 1);
    luaL_newmetatable(L, GATE_MT);
    luaL_setfuncs(L, gate_meta, 0);
    lua_pop(L, 1);
    luaL_setfuncs(L, functions, 0);
}
