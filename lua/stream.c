/*
 * stream.c - the stream handle, shmipc.stream.
 *
 * Copies. Lua strings are immutable values in the Lua heap, so bytes cross between Lua and
 * shared memory exactly once each way: write() copies the string into the stream's send
 * buffer in shared memory (shmipc_stream_write), and a read copies the bytes from shared
 * memory into a new Lua string (lua_pushlstring). A read_exact_bytes() whose bytes span two
 * slices is the one exception: the library gathers them in its own buffer first, so they are
 * copied twice. Since Lua holds copies only, every read gives its slices back at once
 * (shmipc_stream_release right after the string is made): a Lua program never holds shared
 * memory, and there is no release() to forget. reserve/commit are not exposed, for the same
 * reason: Lua could only fill the window from a string, which is what write() does.
 */
#include "lshmipc.h"

#include <stdint.h>

/* The open stream at `arg`; raises when it is not a stream or is closed. */
static lstream *check_stream(lua_State *L, int arg)
{
    lstream *u = luaL_checkudata(L, arg, STREAM_MT);
    if (u->st == NULL)
        luaL_error(L, "attempt to use a closed " STREAM_MT);
    return u;
}

lstream *shmipc__lua_new_stream(lua_State *L, int parent, int32_t read_timeout_ms)
{
    parent = lua_absindex(L, parent);
    lstream *u = lua_newuserdatauv(L, sizeof *u, 2);
    u->st = NULL;
    u->read_timeout_ms = read_timeout_ms;
    luaL_setmetatable(L, STREAM_MT);
    lua_pushvalue(L, parent);
    lua_setiuservalue(L, -2, STREAM_UV_PARENT);
    return u;
}

shmipc_stream *shmipc__lua_stream_take(lua_State *L, int idx)
{
    lstream *u = luaL_checkudata(L, idx, STREAM_MT);
    shmipc_stream *st = u->st;
    idx = lua_absindex(L, idx);
    if (st == NULL)
        return NULL;
    u->st = NULL;
    /* A stream that serve() handed out leaves its table, unless the slot was reused. */
    if (lua_getiuservalue(L, idx, STREAM_UV_SERVED) == LUA_TTABLE) {
        if (lua_rawgetp(L, -1, st) == LUA_TUSERDATA && lua_touserdata(L, -1) == u) {
            lua_pushnil(L);
            lua_rawsetp(L, -3, st);
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return st;
}

void shmipc__lua_stream_close(lua_State *L, int idx)
{
    shmipc_stream_close(shmipc__lua_stream_take(L, idx));
}

/* __gc, __close and :close(). Closing twice is a no-op. */
static int stream_close(lua_State *L)
{
    shmipc__lua_stream_close(L, 1);
    return 0;
}

/*
 * shutdown() -> true: a read of this stream waiting elsewhere (a coroutine in "yield" mode,
 * another Lua state's thread) and every later call but close fail with SHMIPC_ECLOSED; the
 * session goes on. Any number of times; a no-op once closed.
 */
static int stream_shutdown(lua_State *L)
{
    lstream *u = luaL_checkudata(L, 1, STREAM_MT);
    if (u->st != NULL)
        shmipc_stream_shutdown(u->st);
    lua_pushboolean(L, 1);
    return 1;
}

static int stream_tostring(lua_State *L)
{
    lstream *u = luaL_checkudata(L, 1, STREAM_MT);
    if (u->st == NULL)
        lua_pushliteral(L, STREAM_MT " (closed)");
    else
        lua_pushfstring(L, STREAM_MT " %d (%p)", (int)shmipc_stream_id(u->st), (void *)u->st);
    return 1;
}

/* The stream itself so calls chain, or nil, message, code. */
static int self_or_failure(lua_State *L, int rc)
{
    if (rc < 0)
        return shmipc__lua_push_failure(L, rc);
    lua_settop(L, 1);
    return 1;
}

/* write(s, ...) -> stream: appends each string (or number) to the send buffer. */
static int stream_write(lua_State *L)
{
    lstream *u = check_stream(L, 1);
    int top = lua_gettop(L);
    for (int i = 2; i <= top; i++)
        luaL_checklstring(L, i, NULL);
    for (int i = 2; i <= top; i++) {
        size_t len;
        const char *s = lua_tolstring(L, i, &len);
        int rc = shmipc_stream_write(u->st, s, len);
        if (rc < 0)
            return shmipc__lua_push_failure(L, rc);
    }
    lua_settop(L, 1);
    return 1;
}

/* flush() -> stream: sends what was written as one message. */
static int stream_flush(lua_State *L)
{
    return self_or_failure(L, shmipc_stream_flush(check_stream(L, 1)->st));
}

/*
 * flush_close() -> true, or nil, message, code: flush(), then close(), in one step (the peer
 * is woken once for both). The stream is closed afterwards in every case.
 */
static int stream_flush_close(lua_State *L)
{
    check_stream(L, 1);
    int rc = shmipc_stream_flush_close(shmipc__lua_stream_take(L, 1));
    if (rc < 0)
        return shmipc__lua_push_failure(L, rc);
    lua_pushboolean(L, 1);
    return 1;
}

/*
 * The stream's descriptor for a scheduler: its session's, when the stream came from a
 * session handle that is still open; -1 otherwise (session manager and serve() streams:
 * the C API has no call that gives a stream's session).
 */
static int stream_fd(lua_State *L)
{
    int fd = -1;
    lua_getiuservalue(L, 1, STREAM_UV_PARENT);
    lsession *s = luaL_testudata(L, -1, SESSION_MT);
    if (s != NULL && s->s != NULL)
        fd = shmipc_session_fileno(s->s);
    lua_pop(L, 1);
    return fd;
}

/* Slot 2: max (0 = no limit). Pushes one string. */
static int attempt_read_chunk(lua_State *L, int flags)
{
    lstream *u = check_stream(L, 1);
    const void *p;
    size_t len;
    int rc = shmipc_stream_read_chunk(u->st, (size_t)lua_tointeger(L, 2), &p, &len, flags);
    if (rc < 0)
        return rc;
    lua_pushlstring(L, p, len);
    shmipc_stream_release(u->st);
    return 1;
}

/* Slot 2: n. Pushes one string. */
static int attempt_read_exact(lua_State *L, int flags)
{
    lstream *u = check_stream(L, 1);
    size_t n = (size_t)lua_tointeger(L, 2);
    const void *p;
    int rc = shmipc_stream_read_exact_bytes(u->st, n, &p, flags);
    if (rc < 0)
        return rc;
    lua_pushlstring(L, p, n);
    shmipc_stream_release(u->st);
    return 1;
}

static const struct shmipc__lua_op read_chunk_op = {"read_chunk", 2, attempt_read_chunk, stream_fd};
static const struct shmipc__lua_op read_exact_op = {"read_exact_bytes", 2, attempt_read_exact,
                                                    stream_fd};

/* Slot 1: src, slot 2: n, slot 3: dst. Pushes dst. */
static int attempt_forward(lua_State *L, int flags)
{
    lstream *src = check_stream(L, 1), *dst = check_stream(L, 3);
    int rc = shmipc_stream_forward(dst->st, src->st, (size_t)lua_tointeger(L, 2), flags);
    if (rc < 0)
        return rc;
    lua_pushvalue(L, 3);
    return 1;
}

static const struct shmipc__lua_op forward_op = {"forward", 3, attempt_forward, stream_fd};

/* In yield mode the stream's read timeout bounds the whole wait, as it bounds a blocking one. */
static int read_timeout(const lstream *u)
{
    return u->read_timeout_ms < 0 ? -1 : (int)u->read_timeout_ms;
}

/*
 * A read timeout of 0 does not wait in any mode: the read runs once in C, whose wait engine
 * takes what is pending and otherwise fails with SHMIPC_ETIMEDOUT (a yielding read with a 0
 * wait would say SHMIPC_EAGAIN instead).
 */
static enum shmipc__lua_mode read_mode(const lstream *u, enum shmipc__lua_mode mode)
{
    return u->read_timeout_ms == 0 && mode == SHMIPC__LUA_YIELD ? SHMIPC__LUA_BLOCK : mode;
}

/* read_chunk([max [, mode]]) -> string: one non-empty piece of at most max bytes. */
static int stream_read_chunk(lua_State *L)
{
    lstream *u = check_stream(L, 1);
    lua_Integer max = luaL_optinteger(L, 2, 0);
    enum shmipc__lua_mode mode = shmipc__lua_check_mode(L, 3);
    luaL_argcheck(L, lua_isnoneornil(L, 2) || max > 0, 2, "max must be positive");
    lua_settop(L, 1);
    lua_pushinteger(L, max);
    return shmipc__lua_run(L, &read_chunk_op, read_mode(u, mode), read_timeout(u));
}

/* read_exact_bytes(n [, mode]) and read(n [, mode]) -> string of exactly n bytes. */
static int stream_read_exact_bytes(lua_State *L)
{
    lstream *u = check_stream(L, 1);
    lua_Integer n = luaL_checkinteger(L, 2);
    enum shmipc__lua_mode mode = shmipc__lua_check_mode(L, 3);
    luaL_argcheck(L, n >= 0, 2, "n must not be negative");
    if (n == 0) {
        lua_pushliteral(L, "");
        return 1;
    }
    return shmipc__lua_run(L, &read_exact_op, read_mode(u, mode), read_timeout(u));
}

/*
 * dst:forward(src, n [, mode]) -> dst: the next n unread bytes of src go into dst's send
 * buffer, whole slices without a copy when both streams are of one session (an echo is
 * st:forward(st, n)). Waits for them on src as read_exact_bytes does.
 */
static int stream_forward(lua_State *L)
{
    check_stream(L, 1);
    lstream *src = check_stream(L, 2);
    lua_Integer n = luaL_checkinteger(L, 3);
    enum shmipc__lua_mode mode = shmipc__lua_check_mode(L, 4);
    luaL_argcheck(L, n >= 0, 3, "n must not be negative");
    /* The op's slots: src first (its descriptor is the one to wait on), n, dst. */
    lua_settop(L, 3);
    lua_rotate(L, 1, -1);
    return shmipc__lua_run(L, &forward_op, read_mode(src, mode), read_timeout(src));
}

static int stream_available(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)shmipc_stream_available(check_stream(L, 1)->st));
    return 1;
}

static int stream_id(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)shmipc_stream_id(check_stream(L, 1)->st));
    return 1;
}

/*
 * set_timeout("read" | "write", seconds) -> stream; nil or negative waits forever, 0 does not
 * wait.
 */
static int stream_set_timeout(lua_State *L)
{
    static const char *const names[] = {"read", "write", NULL};
    static const char *const fields[] = {"read_timeout", "write_timeout"};
    lstream *u = check_stream(L, 1);
    int which = luaL_checkoption(L, 2, NULL, names);
    int ms = 0;
    int nres = shmipc__lua_seconds_to_ms(L, 3, fields[which], &ms);
    if (nres != 0)
        return nres;
    int rc = shmipc_stream_set_timeout(u->st,
                                       which == 0 ? SHMIPC_TIMEOUT_READ : SHMIPC_TIMEOUT_WRITE, ms);
    if (rc == 0 && which == 0)
        u->read_timeout_ms = ms;
    return self_or_failure(L, rc);
}

/* pollfd() and fileno() -> fd: the descriptor to watch for reading, or nil, message, code. */
static int stream_pollfd(lua_State *L)
{
    check_stream(L, 1);
    int fd = stream_fd(L);
    if (fd >= 0) {
        lua_pushinteger(L, fd);
        return 1;
    }
    lua_getiuservalue(L, 1, STREAM_UV_PARENT);
    lsession *s = luaL_testudata(L, -1, SESSION_MT);
    luaL_pushfail(L);
    if (s != NULL) {
        lua_pushliteral(L, "pollfd: the stream's session is closed");
        lua_pushinteger(L, SHMIPC_ECLOSED);
    } else {
        lua_pushliteral(L, "pollfd: only streams of a session handle have a descriptor");
        lua_pushinteger(L, SHMIPC_ENOTSUP);
    }
    return 3;
}

/*
 * events() -> "r" when a read would not wait (data, the end of the stream, or the end of
 * its session), else "". It never consumes data, but it does process the session's pending
 * events, as a non-blocking read would.
 */
static int stream_events(lua_State *L)
{
    lstream *u = check_stream(L, 1);
    int ready = shmipc_stream_available(u->st) > 0;
    if (!ready) {
        /*
         * The C API has no readiness call, so ask for more bytes than can ever be
         * buffered: the read can only fail, with SHMIPC_EAGAIN while the stream is open
         * and empty, or with the code a read would return now.
         */
        const void *p;
        int rc = shmipc_stream_read_exact_bytes(u->st, UINT32_MAX, &p, SHMIPC_NONBLOCK);
        ready = rc != SHMIPC_EAGAIN || shmipc_stream_available(u->st) > 0;
    }
    lua_pushstring(L, ready ? "r" : "");
    return 1;
}

static const luaL_Reg stream_methods[] = {
    {"write", stream_write},
    {"flush", stream_flush},
    {"flush_close", stream_flush_close},
    {"read_chunk", stream_read_chunk},
    {"read_exact_bytes", stream_read_exact_bytes},
    {"read", stream_read_exact_bytes},
    {"forward", stream_forward},
    {"available", stream_available},
    {"id", stream_id},
    {"set_timeout", stream_set_timeout},
    {"pollfd", stream_pollfd},
    {"fileno", stream_pollfd},
    {"events", stream_events},
    {"shutdown", stream_shutdown},
    {"close", stream_close},
    {NULL, NULL},
};

static const luaL_Reg stream_meta[] = {
    {"__gc", stream_close},
    {"__close", stream_close},
    {"__tostring", stream_tostring},
    {NULL, NULL},
};

void shmipc__lua_open_stream(lua_State *L)
{
    shmipc__lua_new_class(L, STREAM_MT, stream_meta, stream_methods);
}
