/*
 * session.c - the session handle (shmipc.connect, listener:accept) and the session manager
 * (shmipc.session_manager).
 *
 * Lifetimes. A stream handle keeps the handle it came from alive through its user value, so
 * the collector never closes a session (a hard close) under a stream that is still in use.
 * An explicit session:close() is a hard close all the same: the session's streams then fail
 * with SHMIPC_ECLOSED, and the library keeps the shared memory mapped until the last of them
 * is closed too.
 */
#include "lshmipc.h"

/* ------------------------------------------------------------------------------------ */
/* Session                                                                              */
/* ------------------------------------------------------------------------------------ */

lsession *shmipc__lua_new_session(lua_State *L, int32_t read_timeout_ms)
{
    lsession *u = lua_newuserdatauv(L, sizeof *u, 0);
    u->s = NULL;
    u->read_timeout_ms = read_timeout_ms;
    luaL_setmetatable(L, SESSION_MT);
    return u;
}

/* The open session at `arg`; raises when it is not a session or is closed. */
static lsession *check_session(lua_State *L, int arg)
{
    lsession *u = luaL_checkudata(L, arg, SESSION_MT);
    if (u->s == NULL)
        luaL_error(L, "attempt to use a closed " SESSION_MT);
    return u;
}

/* connect(address [, config]) -> session: connects and runs the client handshake. */
static int l_connect(lua_State *L)
{
    const char *address = shmipc__lua_check_cstring(L, 1);
    const shmipc_config *cfg;
    int nres = shmipc__lua_opt_config(L, 2, &cfg);
    if (nres != 0)
        return nres;
    lsession *u = shmipc__lua_new_session(L, shmipc__lua_read_timeout_ms(cfg));
    int rc = shmipc_session_connect(address, cfg, &u->s);
    return rc < 0 ? shmipc__lua_push_failure(L, rc) : 1;
}

/* __gc, __close and :close(): a hard close. Closing twice is a no-op. */
static int session_close(lua_State *L)
{
    lsession *u = luaL_checkudata(L, 1, SESSION_MT);
    shmipc_session *s = u->s;
    u->s = NULL;
    shmipc_session_close(s);
    return 0;
}

/*
 * shutdown() -> true: ends the session as close does but keeps the handle; waiting calls on
 * it and its streams and every later call fail with SHMIPC_ECLOSED. Any number of times; a
 * no-op once closed.
 */
static int session_shutdown(lua_State *L)
{
    lsession *u = luaL_checkudata(L, 1, SESSION_MT);
    if (u->s != NULL)
        shmipc_session_shutdown(u->s);
    lua_pushboolean(L, 1);
    return 1;
}

static int session_tostring(lua_State *L)
{
    lsession *u = luaL_checkudata(L, 1, SESSION_MT);
    if (u->s == NULL)
        lua_pushliteral(L, SESSION_MT " (closed)");
    else
        lua_pushfstring(L, SESSION_MT " (%p)", (void *)u->s);
    return 1;
}

/* open_stream() -> stream (client sessions). */
static int session_open_stream(lua_State *L)
{
    lsession *u = check_session(L, 1);
    lstream *st = shmipc__lua_new_stream(L, 1, u->read_timeout_ms);
    int rc = shmipc_session_open_stream(u->s, &st->st);
    return rc < 0 ? shmipc__lua_push_failure(L, rc) : 1;
}

static int session_fd(lua_State *L)
{
    return shmipc_session_fileno(check_session(L, 1)->s);
}

/* Slot 2: the timeout in ms for a blocking attempt. Pushes one stream. */
static int attempt_accept_stream(lua_State *L, int flags)
{
    lsession *u = check_session(L, 1);
    int timeout = flags & SHMIPC_NONBLOCK ? 0 : (int)lua_tointeger(L, 2);
    lstream *st = shmipc__lua_new_stream(L, 1, u->read_timeout_ms);
    int rc = shmipc_session_accept_stream(u->s, timeout, &st->st);
    if (rc < 0) {
        lua_pop(L, 1);
        return rc;
    }
    return 1;
}

static const struct shmipc__lua_op accept_stream_op = {"accept_stream", 2, attempt_accept_stream,
                                                       session_fd};

/*
 * accept_stream([timeout_s [, mode]]) -> stream (server sessions): nil or negative waits
 * forever, 0 polls (SHMIPC_EAGAIN when none came).
 */
static int session_accept_stream(lua_State *L)
{
    check_session(L, 1);
    int timeout = shmipc__lua_check_wait_ms(L, 2);
    enum shmipc__lua_mode mode = shmipc__lua_check_mode(L, 3);
    lua_settop(L, 1);
    lua_pushinteger(L, timeout);
    return shmipc__lua_run(L, &accept_stream_op, mode, timeout);
}

/* fileno() and pollfd() -> the descriptor an event loop watches for reading. */
static int session_fileno(lua_State *L)
{
    lua_pushinteger(L, session_fd(L));
    return 1;
}

/* process() -> number of events handled, without waiting; or nil, message, code. */
static int session_process(lua_State *L)
{
    int rc = shmipc_session_process(check_session(L, 1)->s);
    if (rc < 0)
        return shmipc__lua_push_failure(L, rc);
    lua_pushinteger(L, rc);
    return 1;
}

/*
 * spin() -> true when something came within the spin budget and was processed (dispatch, do
 * not sleep), false when not (sleep on fileno()); or nil, message, code once the session ended.
 */
static int session_spin(lua_State *L)
{
    int rc = shmipc_session_spin(check_session(L, 1)->s);
    if (rc < 0)
        return shmipc__lua_push_failure(L, rc);
    lua_pushboolean(L, rc > 0);
    return 1;
}

/* status() -> 0 while alive, else the code that ended the session. */
static int session_status(lua_State *L)
{
    lua_pushinteger(L, shmipc_session_status(check_session(L, 1)->s));
    return 1;
}

static int session_version(lua_State *L)
{
    lua_pushinteger(L, shmipc_session_version(check_session(L, 1)->s));
    return 1;
}

/* wakeup() -> "socket" | "eventfd" | "polling", polling interval in us: what was negotiated. */
static int session_wakeup(lua_State *L)
{
    static const char *const names[] = {"socket", "eventfd", "polling"};
    uint32_t interval = 0;
    int wakeup = shmipc_session_wakeup(check_session(L, 1)->s, &interval);
    lua_pushstring(L, wakeup >= SHMIPC_WAKEUP_SOCKET && wakeup <= SHMIPC_WAKEUP_POLLING
                          ? names[wakeup]
                          : "unknown");
    lua_pushinteger(L, (lua_Integer)interval);
    return 2;
}

/*
 * events() -> "r" once the session has ended (every wait on it returns at once), else "".
 * Whether a stream waits to be accepted is not visible through the C API without taking it,
 * so a scheduler learns of new streams from the descriptor and by trying accept_stream.
 */
static int session_events(lua_State *L)
{
    lua_pushstring(L, shmipc_session_status(check_session(L, 1)->s) != 0 ? "r" : "");
    return 1;
}

static const luaL_Reg session_methods[] = {
    {"open_stream", session_open_stream},
    {"accept_stream", session_accept_stream},
    {"fileno", session_fileno},
    {"pollfd", session_fileno},
    {"process", session_process},
    {"spin", session_spin},
    {"status", session_status},
    {"version", session_version},
    {"wakeup", session_wakeup},
    {"events", session_events},
    {"shutdown", session_shutdown},
    {"close", session_close},
    {NULL, NULL},
};

static const luaL_Reg session_meta[] = {
    {"__gc", session_close},
    {"__close", session_close},
    {"__tostring", session_tostring},
    {NULL, NULL},
};

/* ------------------------------------------------------------------------------------ */
/* Session manager                                                                      */
/* ------------------------------------------------------------------------------------ */

/* A session manager; m is NULL once closed. */
typedef struct {
    shmipc_session_manager *m;
    int32_t read_timeout_ms;
} lmanager;

static lmanager *check_manager(lua_State *L, int arg)
{
    lmanager *u = luaL_checkudata(L, arg, MANAGER_MT);
    if (u->m == NULL)
        luaL_error(L, "attempt to use a closed " MANAGER_MT);
    return u;
}

/* session_manager(address [, config]) -> manager: connects config:session_num() sessions. */
static int l_session_manager(lua_State *L)
{
    const char *address = shmipc__lua_check_cstring(L, 1);
    const shmipc_config *cfg;
    int nres = shmipc__lua_opt_config(L, 2, &cfg);
    if (nres != 0)
        return nres;
    lmanager *u = lua_newuserdatauv(L, sizeof *u, 0);
    u->m = NULL;
    u->read_timeout_ms = shmipc__lua_read_timeout_ms(cfg);
    luaL_setmetatable(L, MANAGER_MT);
    int rc = shmipc_session_manager_new(address, cfg, &u->m);
    return rc < 0 ? shmipc__lua_push_failure(L, rc) : 1;
}

/* __gc, __close and :close(): a hard close of every session. Safe twice. */
static int manager_close(lua_State *L)
{
    lmanager *u = luaL_checkudata(L, 1, MANAGER_MT);
    shmipc_session_manager *m = u->m;
    u->m = NULL;
    shmipc_session_manager_close(m);
    return 0;
}

static int manager_tostring(lua_State *L)
{
    lmanager *u = luaL_checkudata(L, 1, MANAGER_MT);
    if (u->m == NULL)
        lua_pushliteral(L, MANAGER_MT " (closed)");
    else
        lua_pushfstring(L, MANAGER_MT " (%p)", (void *)u->m);
    return 1;
}

/* get_stream() -> stream: a pooled stream, or a new one. */
static int manager_get_stream(lua_State *L)
{
    lmanager *u = check_manager(L, 1);
    lstream *st = shmipc__lua_new_stream(L, 1, u->read_timeout_ms);
    int rc = shmipc_session_manager_get_stream(u->m, &st->st);
    return rc < 0 ? shmipc__lua_push_failure(L, rc) : 1;
}

/*
 * put_back(stream) -> true: gives the stream to the pool. The handle is closed from then on
 * (the pool owns the stream); the library closes a stream that cannot be reused as new.
 */
static int manager_put_back(lua_State *L)
{
    lmanager *u = check_manager(L, 1);
    lstream *st = luaL_checkudata(L, 2, STREAM_MT);
    if (st->st == NULL)
        return luaL_error(L, "attempt to use a closed " STREAM_MT);
    shmipc_session_manager_put_back(u->m, shmipc__lua_stream_take(L, 2));
    lua_pushboolean(L, 1);
    return 1;
}

static const luaL_Reg manager_methods[] = {
    {"get_stream", manager_get_stream},
    {"put_back", manager_put_back},
    {"close", manager_close},
    {NULL, NULL},
};

static const luaL_Reg manager_meta[] = {
    {"__gc", manager_close},
    {"__close", manager_close},
    {"__tostring", manager_tostring},
    {NULL, NULL},
};

static const luaL_Reg functions[] = {
    {"connect", l_connect},
    {"session_manager", l_session_manager},
    {NULL, NULL},
};

void shmipc__lua_open_session(lua_State *L)
{
    shmipc__lua_new_class(L, SESSION_MT, session_meta, session_methods);
    shmipc__lua_new_class(L, MANAGER_MT, manager_meta, manager_methods);
    luaL_setfuncs(L, functions, 0);
}
