/*
 * config_options.c - shmipc.config([opts]): the options table, applied through the config
 * methods of config.c in an order that lets any consistent set pass, and the optional config
 * argument that sessions, managers and listeners take (a handle or a table of options).
 *
 * Owns: the option table and shmipc__lua_opt_config, shmipc__lua_read_timeout_ms.
 * May call: the public C API (shmipc_config_*), lshmipc.h and config.c's methods.
 */
#include "lshmipc.h"

#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------------------------ */
/* shmipc.config([opts])                                                                */
/* ------------------------------------------------------------------------------------ */

#define T(t) (1u << (t))

/* How an option of shmipc.config{...} reaches its method. */
enum option_kind {
    OPT_VALUE,  /* the value is the one argument */
    OPT_UNPACK, /* a table value is unpacked as the arguments, {"v4", true} */
    OPT_FLAG,   /* true calls the method with no argument, false skips it */
};

/*
 * The options, in the order they are applied. The setters check each value against the
 * fields already set, so the order is the one that lets any consistent set of options pass
 * from the defaults: the capacity before the classes that must fit it, the prefix before
 * the /dev/shm files that need it absolute, the protocol before the wakeup that needs V4.
 */
static const struct option {
    const char *name;
    lua_CFunction fn;
    unsigned types; /* accepted Lua types of the value */
    enum option_kind kind;
} options[] = {
    {"buffer_capacity", shmipc__lua_config_buffer_capacity, T(LUA_TNUMBER), OPT_VALUE},
    {"slice_classes", shmipc__lua_config_slice_classes, T(LUA_TSTRING) | T(LUA_TTABLE), OPT_VALUE},
    {"queue_capacity", shmipc__lua_config_queue_capacity, T(LUA_TNUMBER), OPT_VALUE},
    {"path_prefix", shmipc__lua_config_path_prefix, T(LUA_TSTRING), OPT_VALUE},
    {"memmap", shmipc__lua_config_memmap, T(LUA_TSTRING), OPT_VALUE},
    {"protocol", shmipc__lua_config_protocol, T(LUA_TSTRING) | T(LUA_TTABLE), OPT_UNPACK},
    {"with_v4", shmipc__lua_config_with_v4, T(LUA_TBOOLEAN), OPT_FLAG},
    {"with_v4_eventfd", shmipc__lua_config_with_v4_eventfd, T(LUA_TBOOLEAN), OPT_FLAG},
    {"with_v4_event_queue_polling", shmipc__lua_config_with_v4_event_queue_polling, T(LUA_TNUMBER),
     OPT_VALUE},
    {"wakeup", shmipc__lua_config_wakeup, T(LUA_TSTRING) | T(LUA_TTABLE), OPT_UNPACK},
    {"initialize_timeout", shmipc__lua_config_initialize_timeout, T(LUA_TNUMBER), OPT_VALUE},
    {"connection_write_timeout", shmipc__lua_config_connection_write_timeout, T(LUA_TNUMBER),
     OPT_VALUE},
    {"read_timeout", shmipc__lua_config_read_timeout, T(LUA_TNUMBER), OPT_VALUE},
    {"write_timeout", shmipc__lua_config_write_timeout, T(LUA_TNUMBER), OPT_VALUE},
    {"session_num", shmipc__lua_config_session_num, T(LUA_TNUMBER), OPT_VALUE},
    {"max_stream_num", shmipc__lua_config_max_stream_num, T(LUA_TNUMBER), OPT_VALUE},
    {"rebuild_interval", shmipc__lua_config_rebuild_interval, T(LUA_TNUMBER), OPT_VALUE},
    {"server_v4", shmipc__lua_config_server_v4, T(LUA_TBOOLEAN) | T(LUA_TTABLE), OPT_UNPACK},
    {"peer_uids", shmipc__lua_config_peer_uids, T(LUA_TTABLE), OPT_VALUE},
    {"socket_mode", shmipc__lua_config_socket_mode, T(LUA_TNUMBER) | T(LUA_TSTRING), OPT_VALUE},
    {"max_pending_streams", shmipc__lua_config_max_pending_streams, T(LUA_TNUMBER), OPT_VALUE},
    {"max_fallback_unread", shmipc__lua_config_max_fallback_unread, T(LUA_TNUMBER), OPT_VALUE},
    {"spin_us", shmipc__lua_config_spin_us, T(LUA_TNUMBER), OPT_VALUE},
    {"memory_wait", shmipc__lua_config_memory_wait, T(LUA_TBOOLEAN), OPT_VALUE},
};
#define NOPTIONS (sizeof options / sizeof options[0])

static const struct option *find_option(const char *name)
{
    for (size_t i = 0; i < NOPTIONS; i++)
        if (strcmp(options[i].name, name) == 0)
            return &options[i];
    return NULL;
}

/* Raises for a key that names no option or a value of a type the option never takes. */
static void check_options(lua_State *L, int opts)
{
    lua_pushnil(L);
    while (lua_next(L, opts) != 0) {
        if (lua_type(L, -2) != LUA_TSTRING)
            luaL_error(L, "shmipc.config: option names are strings, got a %s",
                       luaL_typename(L, -2));
        const struct option *o = find_option(lua_tostring(L, -2));
        if (o == NULL)
            luaL_error(L, "shmipc.config: unknown option '%s'", lua_tostring(L, -2));
        if ((o->types & T(lua_type(L, -1))) == 0)
            luaL_error(L, "shmipc.config: option '%s' got a %s", o->name, luaL_typename(L, -1));
        lua_pop(L, 1);
    }
}

/*
 * Calls the method of option `o` on the config at `ud` with the value on top of the stack,
 * which it pops. Returns 0, or 3 with nil, message, code pushed when the value is refused.
 */
static int apply_option(lua_State *L, int ud, const struct option *o)
{
    int value = lua_gettop(L);
    int nargs = 1;
    if (o->kind == OPT_FLAG && !lua_toboolean(L, value)) {
        lua_pop(L, 1);
        return 0;
    }
    lua_pushcfunction(L, o->fn);
    lua_pushvalue(L, ud);
    if (o->kind == OPT_FLAG) {
        nargs = 0;
    } else if (o->kind == OPT_UNPACK && lua_type(L, value) == LUA_TTABLE) {
        lua_geti(L, value, 1);
        lua_geti(L, value, 2);
        nargs = lua_isnil(L, -1) ? 1 : 2;
        if (nargs == 1)
            lua_pop(L, 1);
    } else {
        lua_pushvalue(L, value);
    }
    lua_call(L, 1 + nargs, 3);
    if (!lua_isnil(L, -3)) {
        lua_settop(L, value - 1);
        return 0;
    }
    lua_remove(L, value);
    return 3;
}

/* shmipc.config([opts]) -> a new config, or nil, message, code when an option is refused. */
int shmipc__lua_config_new(lua_State *L)
{
    int has_opts = !lua_isnoneornil(L, 1);
    if (has_opts) {
        luaL_checktype(L, 1, LUA_TTABLE);
        check_options(L, 1);
    }
    lua_settop(L, 1);
    lconfig *c = shmipc__lua_config_alloc(L);
    int rc = shmipc_config_new(&c->cfg);
    if (rc < 0)
        return shmipc__lua_push_failure(L, rc);
    for (size_t i = 0; has_opts && i < NOPTIONS; i++) {
        if (lua_getfield(L, 1, options[i].name) == LUA_TNIL) {
            lua_pop(L, 1);
            continue;
        }
        if (apply_option(L, 2, &options[i]) != 0) {
            /* Free the half-built config now rather than at the next collection. */
            shmipc_config_free(c->cfg);
            c->cfg = NULL;
            return 3;
        }
    }
    return 1;
}

int shmipc__lua_opt_config(lua_State *L, int arg, const shmipc_config **out)
{
    *out = NULL;
    if (lua_isnoneornil(L, arg))
        return 0;
    if (lua_type(L, arg) == LUA_TTABLE) {
        lua_pushcfunction(L, shmipc__lua_config_new);
        lua_pushvalue(L, arg);
        lua_call(L, 1, 3);
        if (lua_isnil(L, -3))
            return 3;
        lua_pop(L, 2);
        lua_replace(L, arg);
    } else if (luaL_testudata(L, arg, CONFIG_MT) == NULL) {
        luaL_typeerror(L, arg, "shmipc.config or table of options");
    }
    *out = shmipc__lua_check_config(L, arg);
    return 0;
}

int32_t shmipc__lua_read_timeout_ms(const shmipc_config *cfg)
{
    /* A NULL config means the defaults: forever. */
    int ms = SHMIPC_WAIT_FOREVER;
    if (cfg != NULL)
        (void)shmipc_config_get_timeout(cfg, SHMIPC_TIMEOUT_READ, &ms);
    return ms;
}
