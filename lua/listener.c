/*
 * listener.c - the listener handle (shmipc.listen): accept, and serve() with Lua callbacks.
 *
 * serve(on_stream, on_data) runs shmipc_listener_serve() on the calling thread, inside the
 * Lua call, and the C callbacks call the Lua functions on the same lua_State: no thread and
 * no other Lua state is involved. A Lua error must never unwind through the C loop (it would
 * skip its cleanup), so each callback runs under lua_pcall; the first error stops the loop
 * (shmipc_listener_stop) and serve() raises it again once shmipc_listener_serve() returned.
 *
 * Stream handles. serve() keeps a table from each C stream to its handle, so on_data gets
 * the handle on_stream got, and a stream stays alive while the client uses it even when the
 * Lua code keeps no reference. Closing a handle takes it out of the table. When serve()
 * returns, the library has closed the sessions; the handles still open are closed then, so
 * their shared memory is unmapped at once rather than at some later collection.
 */
#include "lshmipc.h"

/* A listener; l is NULL once closed. */
typedef struct {
    shmipc_listener *l;
    int32_t read_timeout_ms; /* what the streams of its sessions start with */
    int serving;             /* serve() is running */
    int close_pending;       /* close() was called from a callback: close when serve returns */
} llistener;

static llistener *check_listener(lua_State *L, int arg)
{
    llistener *u = luaL_checkudata(L, arg, LISTENER_MT);
    if (u->l == NULL || u->close_pending)
        luaL_error(L, "attempt to use a closed " LISTENER_MT);
    return u;
}

/* listen(address [, config]) -> listener. */
static int l_listen(lua_State *L)
{
    const char *address = shmipc__lua_check_cstring(L, 1);
    const shmipc_config *cfg;
    int nres = shmipc__lua_opt_config(L, 2, &cfg);
    if (nres != 0)
        return nres;
    llistener *u = lua_newuserdatauv(L, sizeof *u, 0);
    *u = (llistener){.read_timeout_ms = shmipc__lua_read_timeout_ms(cfg)};
    luaL_setmetatable(L, LISTENER_MT);
    int rc = shmipc_listener_new(address, cfg, &u->l);
    return rc < 0 ? shmipc__lua_push_failure(L, rc) : 1;
}

/*
 * __gc, __close and :close(). Safe twice. Inside a serve() callback the listener cannot be
 * freed under the running loop: close() then stops serving and serve() closes it on return.
 */
static int listener_close(lua_State *L)
{
    llistener *u = luaL_checkudata(L, 1, LISTENER_MT);
    if (u->serving) {
        if (!u->close_pending)
            shmipc_listener_stop(u->l);
        u->close_pending = 1;
        return 0;
    }
    shmipc_listener *l = u->l;
    u->l = NULL;
    shmipc_listener_close(l);
    return 0;
}

static int listener_tostring(lua_State *L)
{
    llistener *u = luaL_checkudata(L, 1, LISTENER_MT);
    if (u->l == NULL || u->close_pending)
        lua_pushliteral(L, LISTENER_MT " (closed)");
    else
        lua_pushfstring(L, LISTENER_MT " (%p)", (void *)u->l);
    return 1;
}

static int listener_fd(lua_State *L)
{
    return shmipc_listener_fileno(check_listener(L, 1)->l);
}

static int listener_fileno(lua_State *L)
{
    lua_pushinteger(L, listener_fd(L));
    return 1;
}

/* Slot 2: the timeout in ms for a blocking attempt. Pushes one session. */
static int attempt_accept(lua_State *L, int flags)
{
    llistener *u = check_listener(L, 1);
    int timeout = flags & SHMIPC_NONBLOCK ? 0 : (int)lua_tointeger(L, 2);
    lsession *s = shmipc__lua_new_session(L, u->read_timeout_ms);
    int rc = shmipc_listener_accept(u->l, timeout, &s->s);
    if (rc < 0) {
        lua_pop(L, 1);
        return rc;
    }
    return 1;
}

static const struct shmipc__lua_op accept_op = {"accept", 2, attempt_accept, listener_fd};

/*
 * accept([timeout_s [, mode]]) -> session: the next client, after its handshake. nil or a
 * negative timeout waits forever, 0 polls. Once a client is there its handshake runs to its
 * end (bounded by the initialize timeout) in every mode.
 */
static int listener_accept(lua_State *L)
{
    check_listener(L, 1);
    int timeout = shmipc__lua_check_wait_ms(L, 2);
    enum shmipc__lua_mode mode = shmipc__lua_check_mode(L, 3);
    lua_settop(L, 1);
    lua_pushinteger(L, timeout);
    return shmipc__lua_run(L, &accept_op, mode, timeout);
}

/* stop() -> true: makes serve() return soon; safe from a callback. */
static int listener_stop(lua_State *L)
{
    int rc = shmipc_listener_stop(check_listener(L, 1)->l);
    if (rc < 0)
        return shmipc__lua_push_failure(L, rc);
    lua_pushboolean(L, 1);
    return 1;
}

/* ------------------------------------------------------------------------------------ */
/* serve()                                                                              */
/* ------------------------------------------------------------------------------------ */

/* Stack slots of a running serve(). */
enum {
    SLOT_LISTENER = 1,
    SLOT_ON_STREAM = 2,
    SLOT_ON_DATA = 3,
    SLOT_STREAMS = 4, /* C stream (light userdata) -> handle */
    SLOT_ERROR = 5,   /* the error a callback raised */
};

struct serve_ctx {
    lua_State *L;
    llistener *u;
    shmipc_stream *st; /* the stream of the callback being run */
    int wrapped;       /* on_stream: a handle owns st */
    int failed;        /* a callback raised; its error is in SLOT_ERROR */
};

/*
 * The arguments of the protected callbacks: copies of serve()'s slots, since a function
 * called through lua_pcall sees only its own stack.
 */
enum { ARG_CTX = 1, ARG_LISTENER, ARG_ON_STREAM, ARG_ON_DATA, ARG_STREAMS, NARGS = ARG_STREAMS };

/* Under pcall: wraps the new stream in a handle, remembers it, calls on_stream(handle). */
static int protected_on_stream(lua_State *L)
{
    struct serve_ctx *c = lua_touserdata(L, ARG_CTX);
    lstream *h = shmipc__lua_new_stream(L, ARG_LISTENER, c->u->read_timeout_ms);
    h->st = c->st;
    c->wrapped = 1;
    lua_pushvalue(L, ARG_STREAMS);
    lua_setiuservalue(L, -2, STREAM_UV_SERVED);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, ARG_STREAMS, c->st);
    if (lua_isnil(L, ARG_ON_STREAM))
        return 0;
    lua_pushvalue(L, ARG_ON_STREAM);
    lua_insert(L, -2);
    lua_call(L, 1, 0);
    return 0;
}

/* Under pcall: calls on_data(handle) for a stream that on_stream got. */
static int protected_on_data(lua_State *L)
{
    struct serve_ctx *c = lua_touserdata(L, ARG_CTX);
    lua_pushvalue(L, ARG_ON_DATA);
    if (lua_rawgetp(L, ARG_STREAMS, c->st) != LUA_TUSERDATA)
        return 0; /* closed by the Lua code: the library will not call again */
    lua_call(L, 1, 0);
    return 0;
}

/* Runs `fn` under pcall; on an error keeps it and stops serving. */
static void call_protected(struct serve_ctx *c, lua_CFunction fn)
{
    lua_State *L = c->L;
    /* serve() reserved the stack for these, so pushing cannot raise here. */
    lua_pushcfunction(L, fn);
    lua_pushlightuserdata(L, c);
    lua_pushvalue(L, SLOT_LISTENER);
    lua_pushvalue(L, SLOT_ON_STREAM);
    lua_pushvalue(L, SLOT_ON_DATA);
    lua_pushvalue(L, SLOT_STREAMS);
    if (lua_pcall(L, NARGS, 0, 0) != LUA_OK) {
        lua_replace(L, SLOT_ERROR);
        c->failed = 1;
        shmipc_listener_stop(c->u->l);
    }
}

static void serve_on_stream(shmipc_stream *st, void *user_data)
{
    struct serve_ctx *c = user_data;
    if (c->failed) {
        /* Serving is ending: nobody will read this stream. */
        shmipc_stream_close(st);
        return;
    }
    c->st = st;
    c->wrapped = 0;
    call_protected(c, protected_on_stream);
    if (!c->wrapped)
        shmipc_stream_close(st); /* no handle could be made for it: still ours */
}

static void serve_on_data(shmipc_stream *st, void *user_data)
{
    struct serve_ctx *c = user_data;
    if (c->failed)
        return;
    c->st = st;
    call_protected(c, protected_on_data);
}

/* Closes every handle serve() handed out and that is still open. */
static void close_served(lua_State *L)
{
    lua_pushnil(L);
    while (lua_next(L, SLOT_STREAMS) != 0) {
        /* Closing clears the field, which lua_next allows during a traversal. */
        shmipc__lua_stream_close(L, -1);
        lua_pop(L, 1);
    }
}

/*
 * serve(on_stream, on_data) -> true: serves every client on this thread until stop().
 * on_stream(stream) is called for each new stream (it may be nil), on_data(stream) whenever
 * a stream may have news: read with "nb" until SHMIPC_EAGAIN, and close the stream at its
 * end. Callbacks must not block or yield. An error raised by a callback stops serving and is
 * raised again by serve(). Returns nil, message, code when the library fails.
 */
static int listener_serve(lua_State *L)
{
    llistener *u = check_listener(L, 1);
    if (!lua_isnil(L, SLOT_ON_STREAM))
        luaL_checktype(L, SLOT_ON_STREAM, LUA_TFUNCTION);
    luaL_checktype(L, SLOT_ON_DATA, LUA_TFUNCTION);
    if (u->serving)
        return luaL_error(L, "serve: this listener is already serving");
    lua_settop(L, SLOT_ON_DATA);
    lua_newtable(L); /* SLOT_STREAMS */
    lua_pushnil(L);  /* SLOT_ERROR */
    /* Room for what the C callbacks push: a function, its arguments, and pcall's error. */
    luaL_checkstack(L, NARGS + 4, "serve");
    struct serve_ctx c = {.L = L, .u = u};
    u->serving = 1;
    int rc = shmipc_listener_serve(u->l, serve_on_stream, serve_on_data, &c, NULL);
    u->serving = 0;
    close_served(L);
    if (u->close_pending) {
        shmipc_listener_close(u->l);
        u->l = NULL;
        u->close_pending = 0;
    }
    if (c.failed) {
        lua_settop(L, SLOT_ERROR);
        return lua_error(L);
    }
    if (rc < 0)
        return shmipc__lua_push_failure(L, rc);
    lua_pushboolean(L, 1);
    return 1;
}

/*
 * shutdown() -> true: ends the listener but keeps the handle; a serve() running (this is
 * called from one of its callbacks, Lua being single-threaded) returns nil, message,
 * SHMIPC_ECLOSED, and every later accept or serve fails so. Any number of times; a no-op
 * once closed.
 */
static int listener_shutdown(lua_State *L)
{
    llistener *u = luaL_checkudata(L, 1, LISTENER_MT);
    if (u->l != NULL && !u->close_pending)
        shmipc_listener_shutdown(u->l);
    lua_pushboolean(L, 1);
    return 1;
}

static const luaL_Reg listener_methods[] = {
    {"accept", listener_accept}, {"fileno", listener_fileno},
    {"pollfd", listener_fileno}, {"serve", listener_serve},
    {"stop", listener_stop},     {"shutdown", listener_shutdown},
    {"close", listener_close},   {NULL, NULL},
};

static const luaL_Reg listener_meta[] = {
    {"__gc", listener_close},
    {"__close", listener_close},
    {"__tostring", listener_tostring},
    {NULL, NULL},
};

static const luaL_Reg functions[] = {
    {"listen", l_listen},
    {NULL, NULL},
};

void shmipc__lua_open_listener(lua_State *L)
{
    shmipc__lua_new_class(L, LISTENER_MT, listener_meta, listener_methods);
    luaL_setfuncs(L, functions, 0);
}
