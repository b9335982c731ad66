/*
 * config.c - the config handle, shmipc.config: one method per field of shmipc_config that
 * gets it (no argument) or sets it (returning the config, or nil, message, code when the
 * library refuses the value), validate, clone and close.
 *
 * Owns: the config userdata (lconfig) and its method tables.
 * May call: the public C API (shmipc_config_*) and lshmipc.h's failure helpers.
 */
#include "lshmipc.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static int setter_result(lua_State *L, int rc)
{
    if (rc < 0)
        return shmipc__lua_push_failure(L, rc);
    lua_settop(L, 1);
    return 1;
}

/*
 * Converts an integer argument for a uint32_t parameter. Returns 0 with *out set, or the
 * number of results pushed (nil, message, code) when the value does not fit.
 */
static int to_u32(lua_State *L, lua_Integer v, const char *field, uint32_t *out)
{
    if (v < 0)
        return shmipc__lua_push_invalid(L, "%s: %I is negative", field, v);
    if ((lua_Unsigned)v > UINT32_MAX)
        return shmipc__lua_push_invalid(L, "%s: %I is larger than %I", field, v,
                                        (lua_Integer)UINT32_MAX);
    *out = (uint32_t)v;
    return 0;
}

/* Index of the string at `arg` in the NULL-terminated `names`, or -1. */
static int find_name(lua_State *L, int arg, const char *const names[])
{
    size_t len;
    const char *s = luaL_checklstring(L, arg, &len);
    for (int i = 0; names[i] != NULL; i++)
        if (strlen(names[i]) == len && memcmp(names[i], s, len) == 0)
            return i;
    return -1;
}

/* ------------------------------------------------------------------------------------ */
/* Config handle                                                                        */
/* ------------------------------------------------------------------------------------ */

/* A new userdata holding no config yet, so a failed allocation below it leaks nothing. */
lconfig *shmipc__lua_config_alloc(lua_State *L)
{
    lconfig *c = lua_newuserdatauv(L, sizeof *c, 0);
    c->cfg = NULL;
    luaL_setmetatable(L, CONFIG_MT);
    return c;
}

/* The config at `arg`; raises when it is not a config or is closed. */
shmipc_config *shmipc__lua_check_config(lua_State *L, int arg)
{
    lconfig *c = luaL_checkudata(L, arg, CONFIG_MT);
    if (c->cfg == NULL)
        luaL_error(L, "attempt to use a closed " CONFIG_MT);
    return c->cfg;
}

/* __gc, __close and :close(). Closing twice is a no-op. */
static int config_close(lua_State *L)
{
    lconfig *c = luaL_checkudata(L, 1, CONFIG_MT);
    shmipc_config_free(c->cfg);
    c->cfg = NULL;
    return 0;
}

static int config_tostring(lua_State *L)
{
    lconfig *c = luaL_checkudata(L, 1, CONFIG_MT);
    if (c->cfg == NULL)
        lua_pushliteral(L, CONFIG_MT " (closed)");
    else
        lua_pushfstring(L, CONFIG_MT " (%p)", (void *)c->cfg);
    return 1;
}

/* True when a method was called with no argument besides self, so it acts as a getter. */
static int is_getter(lua_State *L)
{
    return lua_gettop(L) == 1;
}

/* A byte count: a getter without an argument, else a setter of a non-negative integer. */
static int u64_field(lua_State *L, const char *name, int (*set)(shmipc_config *, uint64_t),
                     uint64_t (*get)(const shmipc_config *))
{
    shmipc_config *cfg = shmipc__lua_check_config(L, 1);
    if (is_getter(L)) {
        lua_pushinteger(L, (lua_Integer)get(cfg));
        return 1;
    }
    lua_Integer n = luaL_checkinteger(L, 2);
    if (n < 0)
        return shmipc__lua_push_invalid(L, "%s: %I is negative", name, n);
    return setter_result(L, set(cfg, (uint64_t)n));
}

int shmipc__lua_config_buffer_capacity(lua_State *L)
{
    return u64_field(L, "buffer_capacity", shmipc_config_set_buffer_capacity,
                     shmipc_config_get_buffer_capacity);
}

int shmipc__lua_config_queue_capacity(lua_State *L)
{
    shmipc_config *cfg = shmipc__lua_check_config(L, 1);
    uint32_t n = 0;
    int nres;
    if (is_getter(L)) {
        lua_pushinteger(L, (lua_Integer)shmipc_config_get_queue_capacity(cfg));
        return 1;
    }
    if ((nres = to_u32(L, luaL_checkinteger(L, 2), "queue_capacity", &n)) != 0)
        return nres;
    return setter_result(L, shmipc_config_set_queue_capacity(cfg, n));
}

/* A u32 field with a plain setter and getter: session_num, max_stream_num, rebuild_interval. */
static int u32_field(lua_State *L, const char *name, int (*set)(shmipc_config *, uint32_t),
                     uint32_t (*get)(const shmipc_config *))
{
    shmipc_config *cfg = shmipc__lua_check_config(L, 1);
    uint32_t n = 0;
    int nres;
    if (is_getter(L)) {
        lua_pushinteger(L, (lua_Integer)get(cfg));
        return 1;
    }
    if ((nres = to_u32(L, luaL_checkinteger(L, 2), name, &n)) != 0)
        return nres;
    return setter_result(L, set(cfg, n));
}

int shmipc__lua_config_session_num(lua_State *L)
{
    return u32_field(L, "session_num", shmipc_config_set_session_num,
                     shmipc_config_get_session_num);
}

int shmipc__lua_config_max_stream_num(lua_State *L)
{
    return u32_field(L, "max_stream_num", shmipc_config_set_max_stream_num,
                     shmipc_config_get_max_stream_num);
}

/* In seconds, as the timeouts; stored in whole milliseconds rounded up. */
int shmipc__lua_config_rebuild_interval(lua_State *L)
{
    shmipc_config *cfg = shmipc__lua_check_config(L, 1);
    if (is_getter(L)) {
        lua_pushnumber(L, (lua_Number)shmipc_config_get_rebuild_interval_ms(cfg) / 1000);
        return 1;
    }
    lua_Number s = luaL_checknumber(L, 2);
    if (isnan(s) || s < 0 || ceil(s * 1000) > UINT32_MAX)
        return shmipc__lua_push_invalid(L, "rebuild_interval: %f s is out of range", s);
    return setter_result(L, shmipc_config_set_rebuild_interval_ms(cfg, (uint32_t)ceil(s * 1000)));
}

/*
 * Reads field `key`, else array slot `slot`, of the table on top of the stack as an integer.
 * Returns 0 with *out set, or the number of results pushed for a value out of range.
 */
static int class_field(lua_State *L, lua_Integer entry, const char *key, int slot, uint32_t *out)
{
    int isint = 0;
    lua_Integer v;
    if (lua_getfield(L, -1, key) == LUA_TNIL) {
        lua_pop(L, 1);
        lua_geti(L, -1, slot);
    }
    v = lua_type(L, -1) == LUA_TNUMBER ? lua_tointegerx(L, -1, &isint) : 0;
    if (!isint)
        return luaL_error(L, "slice_classes: entry %I: %s must be an integer, got %s", entry, key,
                          luaL_typename(L, -1));
    lua_pop(L, 1);
    if (v < 0 || (lua_Unsigned)v > UINT32_MAX)
        return shmipc__lua_push_invalid(L, "slice_classes: entry %I has %s %I, outside 0..%I",
                                        entry, key, v, (lua_Integer)UINT32_MAX);
    *out = (uint32_t)v;
    return 0;
}

/* slice_classes from an array of {size, percent} or {size = , percent = } tables. */
static int set_classes_from_table(lua_State *L, shmipc_config *cfg)
{
    shmipc_slice_class classes[SHMIPC_MAX_SLICE_CLASSES];
    lua_Integer n = luaL_len(L, 2);
    int nres;
    if (n > SHMIPC_MAX_SLICE_CLASSES)
        return shmipc__lua_push_invalid(L, "slice_classes: %I classes, need 1..%d", n,
                                        SHMIPC_MAX_SLICE_CLASSES);
    for (lua_Integer i = 1; i <= n; i++) {
        if (lua_geti(L, 2, i) != LUA_TTABLE)
            return luaL_error(L, "slice_classes: entry %I is a %s, not a {size, percent} table", i,
                              luaL_typename(L, -1));
        if ((nres = class_field(L, i, "size", 1, &classes[i - 1].size)) != 0 ||
            (nres = class_field(L, i, "percent", 2, &classes[i - 1].percent)) != 0)
            return nres;
        lua_pop(L, 1);
    }
    return setter_result(L, shmipc_config_set_slice_classes(cfg, classes, (size_t)n));
}

int shmipc__lua_config_slice_classes(lua_State *L)
{
    shmipc_config *cfg = shmipc__lua_check_config(L, 1);
    if (is_getter(L)) {
        shmipc_slice_class classes[SHMIPC_MAX_SLICE_CLASSES];
        int n = shmipc_config_get_slice_classes(cfg, classes, SHMIPC_MAX_SLICE_CLASSES);
        if (n < 0)
            return shmipc__lua_push_failure(L, n);
        if (n > SHMIPC_MAX_SLICE_CLASSES)
            n = SHMIPC_MAX_SLICE_CLASSES;
        lua_createtable(L, n, 0);
        for (int i = 0; i < n; i++) {
            lua_createtable(L, 0, 2);
            lua_pushinteger(L, classes[i].size);
            lua_setfield(L, -2, "size");
            lua_pushinteger(L, classes[i].percent);
            lua_setfield(L, -2, "percent");
            lua_rawseti(L, -2, i + 1);
        }
        return 1;
    }
    if (lua_type(L, 2) == LUA_TTABLE)
        return set_classes_from_table(L, cfg);
    if (lua_type(L, 2) != LUA_TSTRING)
        return luaL_typeerror(L, 2, "string or table");
    return setter_result(L,
                         shmipc_config_parse_slice_classes(cfg, shmipc__lua_check_cstring(L, 2)));
}

/* Names in the order of the enum values, so a name's index is its value. */
static const char *const memmap_names[] = {"devshm", "memfd", NULL};
static const char *const wakeup_names[] = {"socket", "eventfd", "polling", NULL};

int shmipc__lua_config_memmap(lua_State *L)
{
    shmipc_config *cfg = shmipc__lua_check_config(L, 1);
    if (is_getter(L)) {
        int type = shmipc_config_get_memmap_type(cfg);
        lua_pushstring(L, type == SHMIPC_MEMMAP_DEVSHM ? "devshm" : "memfd");
        return 1;
    }
    int type = find_name(L, 2, memmap_names);
    if (type < 0)
        return shmipc__lua_push_invalid(L, "memmap: \"%s\" is neither \"memfd\" nor \"devshm\"",
                                        lua_tostring(L, 2));
    return setter_result(L, shmipc_config_set_memmap_type(cfg, type));
}

int shmipc__lua_config_path_prefix(lua_State *L)
{
    shmipc_config *cfg = shmipc__lua_check_config(L, 1);
    if (is_getter(L)) {
        lua_pushstring(L, shmipc_config_get_path_prefix(cfg));
        return 1;
    }
    return setter_result(L, shmipc_config_set_path_prefix(cfg, shmipc__lua_check_cstring(L, 2)));
}

static const char *const timeout_names[] = {"initialize_timeout", "connection_write_timeout",
                                            "read_timeout", "write_timeout"};

/*
 * A timeout in seconds, as Lua code counts time, by the API's rule: nil and any negative
 * value wait forever (*ms = -1), 0 does not wait, else milliseconds rounded up, so a positive
 * value never becomes 0. The Python module rounds the same way.
 */
int shmipc__lua_seconds_to_ms(lua_State *L, int arg, const char *field, int *ms)
{
    if (lua_isnil(L, arg)) {
        *ms = -1;
        return 0;
    }
    lua_Number s = luaL_checknumber(L, arg);
    if (isnan(s))
        return shmipc__lua_push_invalid(L, "%s: not a number", field);
    if (s < 0) {
        *ms = -1;
        return 0;
    }
    lua_Number v = ceil(s * 1000);
    if (v > INT_MAX)
        return shmipc__lua_push_invalid(L, "%s: %f s is more than %f s", field, s,
                                        (lua_Number)INT_MAX / 1000);
    *ms = (int)v;
    return 0;
}

static int timeout(lua_State *L, int which)
{
    shmipc_config *cfg = shmipc__lua_check_config(L, 1);
    int ms = 0;
    int nres;
    if (is_getter(L)) {
        /* Forever reads back as -1, a value the setter takes for forever. */
        (void)shmipc_config_get_timeout(cfg, which, &ms);
        if (ms < 0)
            lua_pushinteger(L, -1);
        else
            lua_pushnumber(L, (lua_Number)ms / 1000);
        return 1;
    }
    if ((nres = shmipc__lua_seconds_to_ms(L, 2, timeout_names[which], &ms)) != 0)
        return nres;
    return setter_result(L, shmipc_config_set_timeout(cfg, which, ms));
}

int shmipc__lua_config_initialize_timeout(lua_State *L)
{
    return timeout(L, SHMIPC_TIMEOUT_INITIALIZE);
}

int shmipc__lua_config_connection_write_timeout(lua_State *L)
{
    return timeout(L, SHMIPC_TIMEOUT_CONNECTION_WRITE);
}

int shmipc__lua_config_read_timeout(lua_State *L)
{
    return timeout(L, SHMIPC_TIMEOUT_READ);
}

int shmipc__lua_config_write_timeout(lua_State *L)
{
    return timeout(L, SHMIPC_TIMEOUT_WRITE);
}

/* protocol("legacy" | "v4", [fallback]) or protocol() -> name, fallback. */
int shmipc__lua_config_protocol(lua_State *L)
{
    shmipc_config *cfg = shmipc__lua_check_config(L, 1);
    if (is_getter(L)) {
        int v4 = shmipc_config_get_protocol(cfg) == SHMIPC_PROTOCOL_V4;
        lua_pushstring(L, v4 ? "v4" : "legacy");
        lua_pushboolean(L, shmipc_config_get_fallback(cfg));
        return 2;
    }
    static const char *const names[] = {"legacy", "v4", NULL};
    int protocol = find_name(L, 2, names);
    int fallback = 0;
    if (!lua_isnoneornil(L, 3)) {
        luaL_checktype(L, 3, LUA_TBOOLEAN);
        fallback = lua_toboolean(L, 3);
    }
    if (protocol < 0)
        return shmipc__lua_push_invalid(L, "protocol: \"%s\" is neither \"legacy\" nor \"v4\"",
                                        lua_tostring(L, 2));
    protocol = protocol == 1 ? SHMIPC_PROTOCOL_V4 : SHMIPC_PROTOCOL_LEGACY;
    return setter_result(L, shmipc_config_set_protocol(cfg, protocol, fallback));
}

/* wakeup("socket" | "eventfd" | "polling", [interval_us]) or wakeup() -> name, interval_us. */
int shmipc__lua_config_wakeup(lua_State *L)
{
    shmipc_config *cfg = shmipc__lua_check_config(L, 1);
    uint32_t interval = 0;
    int nres;
    if (is_getter(L)) {
        int wakeup = shmipc_config_get_wakeup(cfg);
        lua_pushstring(L, wakeup >= SHMIPC_WAKEUP_SOCKET && wakeup <= SHMIPC_WAKEUP_POLLING
                              ? wakeup_names[wakeup]
                              : "unknown");
        lua_pushinteger(L, shmipc_config_get_polling_interval_us(cfg));
        return 2;
    }
    int wakeup = find_name(L, 2, wakeup_names);
    lua_Integer us = luaL_optinteger(L, 3, 0);
    if (wakeup < 0)
        return shmipc__lua_push_invalid(
            L, "wakeup: \"%s\" is not one of \"socket\", \"eventfd\", \"polling\"",
            lua_tostring(L, 2));
    if ((nres = to_u32(L, us, "polling_interval_us", &interval)) != 0)
        return nres;
    return setter_result(L, shmipc_config_set_wakeup(cfg, wakeup, interval));
}

int shmipc__lua_config_with_v4(lua_State *L)
{
    return setter_result(L, shmipc_config_with_v4(shmipc__lua_check_config(L, 1)));
}

int shmipc__lua_config_with_v4_eventfd(lua_State *L)
{
    return setter_result(L, shmipc_config_with_v4_eventfd(shmipc__lua_check_config(L, 1)));
}

int shmipc__lua_config_with_v4_event_queue_polling(lua_State *L)
{
    shmipc_config *cfg = shmipc__lua_check_config(L, 1);
    uint32_t interval = 0;
    int nres;
    if ((nres = to_u32(L, luaL_checkinteger(L, 2), "polling_interval_us", &interval)) != 0)
        return nres;
    return setter_result(L, shmipc_config_with_v4_event_queue_polling(cfg, interval));
}

/* Feature names of server_v4, by bit: 1 << i is names[i]. */
static const char *const v4_feature_names[] = {"eventfd", "polling", NULL};
#define ALL_V4_FEATURES (SHMIPC_V4_FEATURE_EVENTFD | SHMIPC_V4_FEATURE_POLLING)

/*
 * server_v4(accept [, features]) or server_v4() -> accept, features: whether a listener takes
 * V4 clients and which optional features it offers, as an array of "eventfd" and "polling"
 * (nil: both).
 */
int shmipc__lua_config_server_v4(lua_State *L)
{
    shmipc_config *cfg = shmipc__lua_check_config(L, 1);
    unsigned features = 0;
    if (is_getter(L)) {
        int accept = shmipc_config_get_server_v4(cfg, &features);
        lua_pushboolean(L, accept > 0);
        lua_newtable(L);
        for (int i = 0, n = 0; v4_feature_names[i] != NULL; i++) {
            if (features & (1u << i)) {
                lua_pushstring(L, v4_feature_names[i]);
                lua_rawseti(L, -2, ++n);
            }
        }
        return 2;
    }
    luaL_checktype(L, 2, LUA_TBOOLEAN);
    if (lua_isnoneornil(L, 3)) {
        features = ALL_V4_FEATURES;
    } else {
        luaL_checktype(L, 3, LUA_TTABLE);
        lua_Integer n = luaL_len(L, 3);
        for (lua_Integer i = 1; i <= n; i++) {
            if (lua_geti(L, 3, i) != LUA_TSTRING)
                return luaL_error(L, "server_v4: feature %I is a %s, not a name", i,
                                  luaL_typename(L, -1));
            int bit = find_name(L, lua_gettop(L), v4_feature_names);
            if (bit < 0)
                return shmipc__lua_push_invalid(
                    L, "server_v4: \"%s\" is neither \"eventfd\" nor \"polling\"",
                    lua_tostring(L, -1));
            features |= 1u << bit;
            lua_pop(L, 1);
        }
    }
    return setter_result(L, shmipc_config_set_server_v4(cfg, lua_toboolean(L, 2), features));
}

/*
 * peer_uids({uid, ...}) or peer_uids() -> array: the allow-list of peer uids (SO_PEERCRED);
 * {} clears it, so any peer that can reach the socket is accepted (the default).
 */
int shmipc__lua_config_peer_uids(lua_State *L)
{
    shmipc_config *cfg = shmipc__lua_check_config(L, 1);
    uint32_t uids[SHMIPC_MAX_PEER_UIDS];
    if (is_getter(L)) {
        int n = shmipc_config_get_peer_uids(cfg, uids, SHMIPC_MAX_PEER_UIDS);
        if (n < 0)
            return shmipc__lua_push_failure(L, n);
        if (n > SHMIPC_MAX_PEER_UIDS)
            n = SHMIPC_MAX_PEER_UIDS;
        lua_createtable(L, n, 0);
        for (int i = 0; i < n; i++) {
            lua_pushinteger(L, uids[i]);
            lua_rawseti(L, -2, i + 1);
        }
        return 1;
    }
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_Integer n = luaL_len(L, 2);
    if (n > SHMIPC_MAX_PEER_UIDS)
        return shmipc__lua_push_invalid(L, "peer_uids: %I uids, at most %d", n,
                                        SHMIPC_MAX_PEER_UIDS);
    for (lua_Integer i = 1; i <= n; i++) {
        int isint = 0;
        lua_geti(L, 2, i);
        lua_Integer uid = lua_type(L, -1) == LUA_TNUMBER ? lua_tointegerx(L, -1, &isint) : 0;
        if (!isint)
            return luaL_error(L, "peer_uids: entry %I is a %s, not an integer uid", i,
                              lua_type(L, -1) == LUA_TNUMBER ? "float" : luaL_typename(L, -1));
        lua_pop(L, 1);
        if (uid < 0 || (lua_Unsigned)uid > UINT32_MAX)
            return shmipc__lua_push_invalid(L, "peer_uids: entry %I is %I, outside 0..%I", i, uid,
                                            (lua_Integer)UINT32_MAX - 1);
        uids[i - 1] = (uint32_t)uid;
    }
    return setter_result(L, shmipc_config_set_peer_uids(cfg, uids, (size_t)n));
}

/*
 * socket_mode(mode) or socket_mode() -> integer: the permission bits of a listener's socket
 * file. Lua has no octal literals, so the mode may also be a string of octal digits ("660",
 * "0660"); 0 restores the default 0600.
 */
int shmipc__lua_config_socket_mode(lua_State *L)
{
    shmipc_config *cfg = shmipc__lua_check_config(L, 1);
    lua_Integer mode = 0;
    if (is_getter(L)) {
        lua_pushinteger(L, (lua_Integer)shmipc_config_get_socket_mode(cfg));
        return 1;
    }
    if (lua_type(L, 2) == LUA_TSTRING) {
        size_t len;
        const char *s = lua_tolstring(L, 2, &len);
        if (len == 0 || len > 4 || strspn(s, "01234567") != len)
            return shmipc__lua_push_invalid(
                L, "socket_mode: \"%s\" is not an octal mode such as \"0660\"", s);
        for (size_t i = 0; i < len; i++)
            mode = mode * 8 + (s[i] - '0');
    } else {
        mode = luaL_checkinteger(L, 2);
    }
    if (mode < 0 || mode > 0777)
        return shmipc__lua_push_invalid(L, "socket_mode: %I has bits outside 0777 (511)", mode);
    return setter_result(L, shmipc_config_set_socket_mode(cfg, (unsigned)mode));
}

int shmipc__lua_config_max_pending_streams(lua_State *L)
{
    return u32_field(L, "max_pending_streams", shmipc_config_set_max_pending_streams,
                     shmipc_config_get_max_pending_streams);
}

int shmipc__lua_config_spin_us(lua_State *L)
{
    return u32_field(L, "spin_us", shmipc_config_set_spin_us, shmipc_config_get_spin_us);
}

/* memory_wait(bool) or memory_wait() -> bool: writes wait for shared memory (no fallback). */
int shmipc__lua_config_memory_wait(lua_State *L)
{
    shmipc_config *cfg = shmipc__lua_check_config(L, 1);
    if (is_getter(L)) {
        lua_pushboolean(L, shmipc_config_get_memory_wait(cfg));
        return 1;
    }
    luaL_checktype(L, 2, LUA_TBOOLEAN);
    return setter_result(L, shmipc_config_set_memory_wait(cfg, lua_toboolean(L, 2)));
}

int shmipc__lua_config_max_fallback_unread(lua_State *L)
{
    return u64_field(L, "max_fallback_unread", shmipc_config_set_max_fallback_unread,
                     shmipc_config_get_max_fallback_unread);
}

/* validate() -> true, or nil, message, code. */
static int config_validate(lua_State *L)
{
    int rc = shmipc_config_validate(shmipc__lua_check_config(L, 1));
    if (rc < 0)
        return shmipc__lua_push_failure(L, rc);
    lua_pushboolean(L, 1);
    return 1;
}

/* clone() -> an independent copy. */
static int config_clone(lua_State *L)
{
    shmipc_config *cfg = shmipc__lua_check_config(L, 1);
    lconfig *copy = shmipc__lua_config_alloc(L);
    int rc = shmipc_config_clone(cfg, &copy->cfg);
    if (rc < 0)
        return shmipc__lua_push_failure(L, rc);
    return 1;
}

const luaL_Reg shmipc__lua_config_methods[] = {
    {"buffer_capacity", shmipc__lua_config_buffer_capacity},
    {"queue_capacity", shmipc__lua_config_queue_capacity},
    {"slice_classes", shmipc__lua_config_slice_classes},
    {"memmap", shmipc__lua_config_memmap},
    {"path_prefix", shmipc__lua_config_path_prefix},
    {"initialize_timeout", shmipc__lua_config_initialize_timeout},
    {"connection_write_timeout", shmipc__lua_config_connection_write_timeout},
    {"read_timeout", shmipc__lua_config_read_timeout},
    {"write_timeout", shmipc__lua_config_write_timeout},
    {"protocol", shmipc__lua_config_protocol},
    {"wakeup", shmipc__lua_config_wakeup},
    {"with_v4", shmipc__lua_config_with_v4},
    {"with_v4_eventfd", shmipc__lua_config_with_v4_eventfd},
    {"with_v4_event_queue_polling", shmipc__lua_config_with_v4_event_queue_polling},
    {"session_num", shmipc__lua_config_session_num},
    {"max_stream_num", shmipc__lua_config_max_stream_num},
    {"rebuild_interval", shmipc__lua_config_rebuild_interval},
    {"server_v4", shmipc__lua_config_server_v4},
    {"peer_uids", shmipc__lua_config_peer_uids},
    {"socket_mode", shmipc__lua_config_socket_mode},
    {"max_pending_streams", shmipc__lua_config_max_pending_streams},
    {"max_fallback_unread", shmipc__lua_config_max_fallback_unread},
    {"memory_wait", shmipc__lua_config_memory_wait},
    {"spin_us", shmipc__lua_config_spin_us},
    {"validate", config_validate},
    {"clone", config_clone},
    {"close", config_close},
    {NULL, NULL},
};

const luaL_Reg shmipc__lua_config_metamethods[] = {
    {"__index", NULL}, /* set to the method table below */
    {"__gc", config_close}, {"__close", config_close}, {"__tostring", config_tostring},
    {NULL, NULL},
};
