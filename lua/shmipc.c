/*
 * shmipc.c - the Lua 5.4 module: require "shmipc". This file: the module table, version and
 * errors; the config handle is in config.c and config_options.c, sessions, streams, the
 * session manager and the listener in session.c, stream.c and listener.c, waiting and
 * yielding in wait.c, the HTTP server in server.c, shmipc.abi in abi.c (see lshmipc.h).
 *
 * A thin layer over the public header only. Handles follow Lua's liolib.c: a full userdata
 * with a named metatable, one close shared by __gc, __close and :close() that is safe to call
 * twice, and two kinds of failure: misuse (a wrong argument type, a closed handle) raises an
 * error, while a value that the library refuses returns nil, message, code, where message is
 * the detail naming the field and code is the negative SHMIPC_E* code.
 *
 * Owns: luaopen_shmipc, the failure helpers every file uses, shmipc__lua_new_class.
 * May call: the public C API and every file's registration (lshmipc.h).
 */
#include "lshmipc.h"

#include <limits.h>
#include <stdarg.h>
#include <string.h>

/* ------------------------------------------------------------------------------------ */
/* Failures                                                                             */
/* ------------------------------------------------------------------------------------ */

/* Pushes nil, the library's detail and `code`: the result of a refused value. */
int shmipc__lua_push_failure(lua_State *L, int code)
{
    luaL_pushfail(L);
    lua_pushstring(L, shmipc_error_detail());
    lua_pushinteger(L, code);
    return 3;
}

/*
 * Like shmipc__lua_push_failure() for a value this module refuses before it reaches the
 * library (a number that does not fit the C type, an unknown name); the message is formatted
 * with lua_pushfstring() and names the field as the library's details do.
 */
int shmipc__lua_push_invalid(lua_State *L, const char *fmt, ...)
{
    va_list ap;
    luaL_pushfail(L);
    va_start(ap, fmt);
    lua_pushvfstring(L, fmt, ap);
    va_end(ap);
    lua_pushinteger(L, SHMIPC_EINVAL);
    return 3;
}

/* The result of a setter: the config itself so calls chain, or nil, message, code. */

/* A string argument without embedded NUL bytes, which a C string would silently cut. */
const char *shmipc__lua_check_cstring(lua_State *L, int arg)
{
    size_t len;
    const char *s = luaL_checklstring(L, arg, &len);
    if (strlen(s) != len)
        luaL_argerror(L, arg, "string contains a NUL byte");
    return s;
}
/* ------------------------------------------------------------------------------------ */
/* Version and errors                                                                   */
/* ------------------------------------------------------------------------------------ */

static int l_version(lua_State *L)
{
    lua_pushstring(L, shmipc_version_string());
    return 1;
}

static int l_version_number(lua_State *L)
{
    lua_pushinteger(L, shmipc_version());
    return 1;
}

/* The code at `arg` as an int; a value outside int is no code, so it becomes 0 (not one). */
static int check_code(lua_State *L, int arg)
{
    lua_Integer code = luaL_checkinteger(L, arg);
    return code >= INT_MIN && code <= INT_MAX ? (int)code : 0;
}

static int l_strerror(lua_State *L)
{
    lua_pushstring(L, shmipc_strerror(check_code(L, 1)));
    return 1;
}

/* errname(code) -> "SHMIPC_ETIMEDOUT", or nil for a code that is not an shmipc code. */
static int l_errname(lua_State *L)
{
    const char *name = shmipc_errname(check_code(L, 1));
    if (name == NULL)
        luaL_pushfail(L);
    else
        lua_pushstring(L, name);
    return 1;
}

static const luaL_Reg functions[] = {
    {"version", l_version}, {"version_number", l_version_number}, {"strerror", l_strerror},
    {"errname", l_errname}, {"config", shmipc__lua_config_new},   {NULL, NULL},
};

void shmipc__lua_new_class(lua_State *L, const char *name, const luaL_Reg *meta,
                           const luaL_Reg *methods)
{
    luaL_newmetatable(L, name);
    luaL_setfuncs(L, meta, 0);
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
}

/* The one symbol the module exports; the rest is hidden (see meson.build). */
__attribute__((visibility("default"))) int luaopen_shmipc(lua_State *L);

/* shmipc.abi, in abi.c. */
void shmipc__lua_open_abi(lua_State *L);

int luaopen_shmipc(lua_State *L)
{
    shmipc__lua_new_class(L, CONFIG_MT, shmipc__lua_config_metamethods, shmipc__lua_config_methods);

    luaL_newlib(L, functions);
    /* shmipc.errors: every code of SHMIPC_ERRNO_MAP by its name without the prefix. */
    lua_newtable(L);
#define ERR_FIELD(name, value, msg)                                                                \
    lua_pushinteger(L, (value));                                                                   \
    lua_setfield(L, -2, #name);
    SHMIPC_ERRNO_MAP(ERR_FIELD)
#undef ERR_FIELD
    lua_setfield(L, -2, "errors");
    luaL_setfuncs(L, shmipc__lua_wait_functions, 0);
    shmipc__lua_open_stream(L);
    shmipc__lua_open_session(L);
    shmipc__lua_open_listener(L);
    shmipc__lua_open_server(L);
    shmipc__lua_open_abi(L);
    return 1;
}
