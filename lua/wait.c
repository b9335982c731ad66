/*
 * wait.c - how calls that may wait do so from Lua: blocking, non-blocking, or yielding to a
 * coroutine scheduler; and shmipc.poll() and shmipc.monotime(), so a scheduler written in
 * plain Lua can wait on descriptors without another C module.
 *
 * Yielding. A call in "yield" mode tries its operation with SHMIPC_NONBLOCK. When that would
 * block it yields four values to whoever resumed the coroutine: the descriptor to wait on (or
 * nil when the handle has none), "r", the seconds left before its timeout (or nil) and the
 * handle itself, whose :events() tells without waiting whether a retry would succeed. When
 * resumed (with any values, which are ignored) the continuation tries again. The arguments
 * of the call and its deadline stay on the coroutine's stack across the yield, so nothing is
 * allocated per wait and nothing needs freeing when a coroutine is abandoned.
 */
#include "lshmipc.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <string.h>
#include <time.h>

uint64_t shmipc__lua_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

enum shmipc__lua_mode shmipc__lua_check_mode(lua_State *L, int arg)
{
    static const char *const names[] = {"block", "nb", "yield", NULL};
    return (enum shmipc__lua_mode)luaL_checkoption(L, arg, "block", names);
}

int shmipc__lua_check_wait_ms(lua_State *L, int arg)
{
    if (lua_isnoneornil(L, arg))
        return SHMIPC_WAIT_FOREVER;
    lua_Number s = luaL_checknumber(L, arg);
    luaL_argcheck(L, !isnan(s), arg, "timeout must be a number of seconds");
    if (s < 0) /* the API's rule: any negative value waits forever */
        return SHMIPC_WAIT_FOREVER;
    lua_Number ms = ceil(s * 1000);
    return ms > INT_MAX ? SHMIPC_WAIT_FOREVER : (int)ms;
}

/* The deadline slot: right above the operation's arguments. */
static int deadline_slot(const struct shmipc__lua_op *op)
{
    return op->nargs + 1;
}

static int retry(lua_State *L, const struct shmipc__lua_op *op);

static int resume_k(lua_State *L, int status, lua_KContext ctx)
{
    const struct shmipc__lua_op *op = (const struct shmipc__lua_op *)ctx;
    (void)status;
    /* Drop what the scheduler passed to resume(). */
    lua_settop(L, deadline_slot(op));
    return retry(L, op);
}

/* One non-blocking attempt; yields when it would block and time is left. */
static int retry(lua_State *L, const struct shmipc__lua_op *op)
{
    int rc = op->attempt(L, SHMIPC_NONBLOCK);
    if (rc >= 0)
        return rc;
    if (rc != SHMIPC_EAGAIN)
        return shmipc__lua_push_failure(L, rc);
    lua_Number left = -1;
    if (!lua_isnil(L, deadline_slot(op))) {
        uint64_t deadline = (uint64_t)lua_tointeger(L, deadline_slot(op));
        uint64_t now = shmipc__lua_now_ns();
        if (now >= deadline) {
            luaL_pushfail(L);
            lua_pushfstring(L, "%s: timed out", op->what);
            lua_pushinteger(L, SHMIPC_ETIMEDOUT);
            return 3;
        }
        left = (lua_Number)(deadline - now) / 1e9;
    }
    int fd = op->pollfd(L);
    if (fd >= 0)
        lua_pushinteger(L, fd);
    else
        lua_pushnil(L);
    lua_pushliteral(L, "r");
    if (left >= 0)
        lua_pushnumber(L, left);
    else
        lua_pushnil(L);
    lua_pushvalue(L, 1);
    return lua_yieldk(L, 4, (lua_KContext)op, resume_k);
}

int shmipc__lua_run(lua_State *L, const struct shmipc__lua_op *op, enum shmipc__lua_mode mode,
                    int timeout_ms)
{
    int rc;
    lua_settop(L, op->nargs);
    /* A timeout of 0 only looks, in every mode: SHMIPC_EAGAIN, not a timeout. */
    if (mode == SHMIPC__LUA_YIELD && timeout_ms == 0)
        mode = SHMIPC__LUA_NB;
    if (mode == SHMIPC__LUA_YIELD) {
        if (!lua_isyieldable(L))
            return luaL_error(L,
                              "%s: cannot yield here (not in a coroutine, or inside a C call "
                              "such as a serve() callback); use \"block\" or \"nb\"",
                              op->what);
        if (timeout_ms >= 0)
            lua_pushinteger(L,
                            (lua_Integer)(shmipc__lua_now_ns() + (uint64_t)timeout_ms * 1000000u));
        else
            lua_pushnil(L);
        return retry(L, op);
    }
    lua_pushnil(L); /* the deadline slot, unused */
    rc = op->attempt(L, mode == SHMIPC__LUA_NB ? SHMIPC_NONBLOCK : 0);
    return rc >= 0 ? rc : shmipc__lua_push_failure(L, rc);
}

/* ------------------------------------------------------------------------------------ */
/* shmipc.poll(fds [, timeout_s]) and shmipc.monotime()                                  */
/* ------------------------------------------------------------------------------------ */

/*
 * poll(fds, [timeout_s]) -> ready: waits until one of the descriptors in the array `fds` is
 * readable (or hung up, in error, or not open: anything a read would not wait on), for at
 * most timeout_s seconds (nil or negative: forever). Returns the array of ready descriptors,
 * in the order given and empty on timeout, or nil, message, code (-errno; SHMIPC_EINTR on a
 * signal).
 */
static int l_poll(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    int timeout = shmipc__lua_check_wait_ms(L, 2);
    lua_Integer n = luaL_len(L, 1);
    luaL_argcheck(L, n >= 0 && n <= 1 << 20, 1, "too many descriptors");
    /* A userdata rather than malloc: nothing leaks when a conversion below raises. */
    struct pollfd *p = lua_newuserdatauv(L, (size_t)(n > 0 ? n : 1) * sizeof *p, 0);
    for (lua_Integer i = 0; i < n; i++) {
        lua_geti(L, 1, i + 1);
        int isint = 0;
        lua_Integer fd = lua_tointegerx(L, -1, &isint);
        if (!isint || fd < 0 || fd > INT_MAX)
            return luaL_error(L, "poll: entry %I is not a descriptor", i + 1);
        lua_pop(L, 1);
        p[i] = (struct pollfd){.fd = (int)fd, .events = POLLIN};
    }
    /*
     * EINTR goes back to the caller, so a signal (Ctrl-C in lua.c) can end a long wait. While
     * it waits, the workers of a started server may call Lua handlers (server.c).
     */
    struct shmipc__lua_gate *gate = shmipc__lua_gate_leave(L);
    int rc = poll(p, (nfds_t)n, timeout);
    int err = errno;
    shmipc__lua_gate_enter(gate);
    if (rc < 0) {
        luaL_pushfail(L);
        lua_pushstring(L, strerror(err));
        lua_pushinteger(L, -err);
        return 3;
    }
    lua_createtable(L, rc, 0);
    int k = 0;
    for (lua_Integer i = 0; i < n && k < rc; i++) {
        if (p[i].revents != 0) {
            lua_pushinteger(L, p[i].fd);
            lua_rawseti(L, -2, ++k);
        }
    }
    return 1;
}

/* monotime() -> seconds of a monotonic clock, as a float: for deadlines and measurements. */
static int l_monotime(lua_State *L)
{
    lua_pushnumber(L, (lua_Number)shmipc__lua_now_ns() / 1e9);
    return 1;
}

const luaL_Reg shmipc__lua_wait_functions[] = {
    {"poll", l_poll},
    {"monotime", l_monotime},
    {NULL, NULL},
};
