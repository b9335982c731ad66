/*
 * server_config.c - the options of shmipc.server{...} turned into a shmipc_server_config:
 * the option table (names, kinds), each option's checks, and the config box that frees the C
 * config when an option raises.
 *
 * Owns: the server option table.
 * May call: the public C API (shmipc_server_config_*) and lshmipc.h.
 */
#include "lserver.h"

#include <string.h>

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
    {"keepalive_requests", O_LIMIT, SHMIPC_SERVER_LIMIT_KEEPALIVE_REQUESTS, T(LUA_TNUMBER)},
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
    int ms;
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
        rc = shmipc_server_config_set_timeout(cfg, o->which, ms);
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
int shmipc__lua_server_build_config(lua_State *L, shmipc_server_config *cfg)
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
int shmipc__lua_server_config_box_gc(lua_State *L)
{
    shmipc_server_config **box = lua_touserdata(L, 1);
    shmipc_server_config_free(*box);
    *box = NULL;
    return 0;
}
