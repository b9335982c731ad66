/*
 * shmipc__lua_abi_call.c - calling a GENERIC entry of the descriptor table from Lua: shmipc.abi.call,
 * the functions bound by shmipc.abi.<name>, describe and names. Every argument is checked
 * against the descriptor before it reaches C; results come back in the table's types.
 *
 * Owns: the argument and result marshalling (abi_do_call).
 * May call: the public C API through libffi, lshmipc.h, and abi.c's handles and log sink
 * (labi.h).
 */
#include "labi.h"

#include <limits.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------------------------ */
/* Calls                                                                                */
/* ------------------------------------------------------------------------------------ */

typedef union {
    int i32;
    uint32_t u32;
    int64_t i64;
    uint64_t u64;
    size_t sz;
    void *p;
    const void *cp;
} abi_value;

/* Does parameter type `t` take a Lua argument? */
int shmipc__lua_abi_takes_arg(int t)
{
    switch (t) {
    case SHMIPC_ABI_BYTES_LEN:
    case SHMIPC_ABI_OUT_HANDLE:
    case SHMIPC_ABI_OUT_CPTR:
    case SHMIPC_ABI_OUT_LEN:
    case SHMIPC_ABI_OUT_CPTR_N:
    case SHMIPC_ABI_OUT_WPTR_N:
    case SHMIPC_ABI_OUT_I32:
    case SHMIPC_ABI_OUT_U32:
    case SHMIPC_ABI_OUT_I64:
    case SHMIPC_ABI_OUT_U64:
    case SHMIPC_ABI_OUT_SIZE:
    case SHMIPC_ABI_OUT_CHARS:
    case SHMIPC_ABI_USER_DATA:
        return 0;
    default:
        return 1;
    }
}

static lua_Integer check_int(lua_State *L, int arg, const shmipc_abi_fn *d, const char *pname,
                             lua_Integer lo, lua_Integer hi)
{
    if (lua_type(L, arg) != LUA_TNUMBER)
        luaL_error(L, "%s: argument %d (%s) must be an integer, got %s", d->name, arg, pname,
                   luaL_typename(L, arg));
    int isint;
    lua_Integer v = lua_tointegerx(L, arg, &isint);
    if (!isint)
        luaL_error(L, "%s: argument %d (%s) has no integer representation", d->name, arg, pname);
    if (v < lo || v > hi)
        luaL_error(L, "%s: argument %d (%s) out of range", d->name, arg, pname);
    return v;
}

static void push_u64(lua_State *L, uint64_t v)
{
    if (v > (uint64_t)LUA_MAXINTEGER)
        lua_pushnumber(L, (lua_Number)v);
    else
        lua_pushinteger(L, (lua_Integer)v);
}

static abi_handle *new_handle(lua_State *L, void *p, int kind, int parent)
{
    abi_handle *h = lua_newuserdatauv(L, sizeof *h, 1);
    h->p = p;
    h->kind = kind;
    luaL_setmetatable(L, ABI_HANDLE_MT);
    if (parent) {
        /* Keep the handle it came from alive at least as long. */
        lua_pushvalue(L, parent);
        lua_setiuservalue(L, -2, 1);
    }
    return h;
}

static int abi_do_call(lua_State *L, const abi_entry *e, int base)
{
    const shmipc_abi_fn *d = e->d;
    int given = lua_gettop(L) - base + 1;
    if (given != e->nargs)
        return luaL_error(L, "%s: expected %d argument%s, got %d", d->name, e->nargs,
                          e->nargs == 1 ? "" : "s", given);

    abi_value vals[ABI_MAXPARAMS], outs[ABI_MAXPARAMS];
    void *args[ABI_MAXPARAMS];
    memset(vals, 0, sizeof vals);
    memset(outs, 0, sizeof outs);
    int arg = base, parent = 0;
    sink_rec *new_sink = NULL;
    int sets_sink = 0;

    /* First pass: check and convert; nothing reaches C, nothing is allocated but a sink. */
    for (int k = 0; k < d->nparams; k++) {
        const shmipc_abi_param *pp = &d->params[k];
        args[k] = &vals[k];
        int a = shmipc__lua_abi_takes_arg(pp->type) ? arg++ : 0;
        switch (pp->type) {
        case SHMIPC_ABI_I32:
            vals[k].i32 = (int)check_int(L, a, d, pp->name, INT_MIN, INT_MAX);
            break;
        case SHMIPC_ABI_U32:
            vals[k].u32 = (uint32_t)check_int(L, a, d, pp->name, 0, UINT32_MAX);
            break;
        case SHMIPC_ABI_I64:
            vals[k].i64 = (int64_t)check_int(L, a, d, pp->name, LUA_MININTEGER, LUA_MAXINTEGER);
            break;
        case SHMIPC_ABI_U64:
        case SHMIPC_ABI_SIZE:
            vals[k].u64 = (uint64_t)check_int(L, a, d, pp->name, 0, LUA_MAXINTEGER);
            break;
        case SHMIPC_ABI_CSTR:
            if (lua_isnil(L, a)) {
                vals[k].p = NULL;
            } else if (lua_type(L, a) == LUA_TSTRING) {
                size_t len;
                const char *s = lua_tolstring(L, a, &len);
                if (strlen(s) != len)
                    return luaL_error(L, "%s: argument %d (%s) contains a NUL byte", d->name, a,
                                      pp->name);
                vals[k].cp = s;
            } else {
                return luaL_error(L, "%s: argument %d (%s) must be a string or nil, got %s",
                                  d->name, a, pp->name, luaL_typename(L, a));
            }
            break;
        case SHMIPC_ABI_HANDLE:
        case SHMIPC_ABI_RELEASE:
            if (lua_isnil(L, a)) {
                vals[k].p = NULL;
                break;
            } else {
                abi_handle *h = luaL_testudata(L, a, ABI_HANDLE_MT);
                if (!h)
                    return luaL_error(L, "%s: argument %d (%s) must be a %s %s or nil, got %s",
                                      d->name, a, pp->name, ABI_HANDLE_MT,
                                      shmipc__lua_abi_kind_name(pp->kind), luaL_typename(L, a));
                if (h->kind != pp->kind)
                    return luaL_error(L, "%s: argument %d (%s) must be a %s handle, got a %s one",
                                      d->name, a, pp->name, shmipc__lua_abi_kind_name(pp->kind),
                                      shmipc__lua_abi_kind_name(h->kind));
                if (!h->p)
                    return luaL_error(L, "%s: argument %d (%s) is a closed %s handle", d->name, a,
                                      pp->name, shmipc__lua_abi_kind_name(h->kind));
                vals[k].p = h->p;
                if (!parent && pp->type == SHMIPC_ABI_HANDLE)
                    parent = a;
            }
            break;
        case SHMIPC_ABI_BYTES_IN:
            if (lua_isnil(L, a)) {
                vals[k].p = NULL;
                if (k + 1 < d->nparams)
                    vals[k + 1].sz = 0;
            } else if (lua_type(L, a) == LUA_TSTRING) {
                size_t len;
                vals[k].cp = lua_tolstring(L, a, &len);
                if (k + 1 < d->nparams)
                    vals[k + 1].sz = len;
            } else {
                return luaL_error(L, "%s: argument %d (%s) must be a string, got %s", d->name, a,
                                  pp->name, luaL_typename(L, a));
            }
            break;
        case SHMIPC_ABI_BYTES_LEN:
            break; /* set by the BYTES_IN before it */
        case SHMIPC_ABI_OUT_WPTR_N:
            return luaL_error(L, "%s: a writable window (%s) cannot be used from Lua", d->name,
                              pp->name);
        case SHMIPC_ABI_OUT_HANDLE:
        case SHMIPC_ABI_OUT_CPTR:
        case SHMIPC_ABI_OUT_LEN:
        case SHMIPC_ABI_OUT_CPTR_N:
        case SHMIPC_ABI_OUT_I32:
        case SHMIPC_ABI_OUT_U32:
        case SHMIPC_ABI_OUT_I64:
        case SHMIPC_ABI_OUT_U64:
        case SHMIPC_ABI_OUT_SIZE:
        case SHMIPC_ABI_OUT_CHARS:
            vals[k].p = &outs[k];
            break;
        case SHMIPC_ABI_USER_DATA:
            vals[k].p = NULL;
            break;
        case SHMIPC_ABI_CALLBACK:
            if (pp->kind != SHMIPC_ABI_KIND_LOG_SINK)
                return luaL_error(L,
                                  "%s: callbacks of kind %s run on library threads; shmipc.abi "
                                  "supports only LOG_SINK (use the hand-written methods)",
                                  d->name, shmipc__lua_abi_kind_name(pp->kind));
            if (lua_isnil(L, a)) {
                vals[k].p = NULL;
            } else if (lua_type(L, a) != LUA_TFUNCTION) {
                return luaL_error(L, "%s: argument %d (%s) must be a function or nil, got %s",
                                  d->name, a, pp->name, luaL_typename(L, a));
            }
            sets_sink = 1;
            break;
        default:
            return luaL_error(L, "%s: parameter %s has a type shmipc.abi cannot marshal", d->name,
                              pp->name);
        }
    }
    /* The closure last, after every check passed, so that a refused call leaks nothing. */
    if (sets_sink) {
        for (int k = 0, a = base; k < d->nparams; k++) {
            if (d->params[k].type == SHMIPC_ABI_CALLBACK && lua_type(L, a) == LUA_TFUNCTION) {
                new_sink = shmipc__lua_abi_sink_new(L, a);
                vals[k].p = new_sink->code;
            }
            if (shmipc__lua_abi_takes_arg(d->params[k].type))
                a++;
        }
    }

    union {
        ffi_arg a;
        ffi_sarg s;
        uint64_t u64;
        int64_t i64;
        void *p;
    } ret;
    memset(&ret, 0, sizeof ret);
    sink_rec *old_sink = NULL;
    /*
     * Handles passed to RELEASE are closed before the call, nothing raising after this: Lua
     * code that runs during it (the log sink) must not use or release them again, which
     * freed the handle twice.
     */
    for (int k = 0, a = base; k < d->nparams; k++) {
        if (d->params[k].type == SHMIPC_ABI_RELEASE && !lua_isnil(L, a))
            ((abi_handle *)lua_touserdata(L, a))->p = NULL;
        if (shmipc__lua_abi_takes_arg(d->params[k].type))
            a++;
    }
    if (sets_sink)
        pthread_mutex_lock(&shmipc__lua_abi_sink_lock);
    ffi_call((ffi_cif *)&e->cif, d->fn, &ret, args);
    if (sets_sink) {
        /* The old sink is not running once shmipc_set_log_sink has returned. */
        old_sink = shmipc__lua_abi_sink_current;
        shmipc__lua_abi_sink_current = new_sink;
        pthread_mutex_unlock(&shmipc__lua_abi_sink_lock);
        shmipc__lua_abi_sink_free(old_sink, shmipc__lua_abi_main_thread(L));
    }

    int nres = 0, failed = 0;
    const char *chars = NULL;
    switch (d->ret.type) {
    case SHMIPC_ABI_VOID:
        break;
    case SHMIPC_ABI_I32:
        lua_pushinteger(L, (int)ret.s);
        failed = (int)ret.s < 0;
        nres++;
        break;
    case SHMIPC_ABI_U32:
        lua_pushinteger(L, (uint32_t)ret.a);
        nres++;
        break;
    case SHMIPC_ABI_I64:
        lua_pushinteger(L, ret.i64);
        nres++;
        break;
    case SHMIPC_ABI_U64:
    case SHMIPC_ABI_SIZE:
        push_u64(L, ret.u64);
        nres++;
        break;
    case SHMIPC_ABI_CSTR:
        if (ret.p)
            lua_pushstring(L, ret.p);
        else
            lua_pushnil(L);
        nres++;
        break;
    case SHMIPC_ABI_CHARS:
        chars = ret.p; /* pushed with the OUT_LEN that follows no OUT_CPTR/OUT_CHARS */
        break;
    default:
        lua_pushnil(L);
        nres++;
        break;
    }
    if (d->ret.type == SHMIPC_ABI_CHARS) {
        int found = 0;
        for (int k = 0; k < d->nparams; k++) {
            int t = d->params[k].type;
            if (t == SHMIPC_ABI_OUT_LEN &&
                (k == 0 || (d->params[k - 1].type != SHMIPC_ABI_OUT_CPTR &&
                            d->params[k - 1].type != SHMIPC_ABI_OUT_CHARS))) {
                if (chars)
                    lua_pushlstring(L, chars, outs[k].sz);
                else
                    lua_pushnil(L);
                found = 1;
            }
        }
        if (!found)
            lua_pushnil(L);
        nres++;
    }

    size_t last_size = 0;
    for (int k = 0; k < d->nparams; k++) {
        const shmipc_abi_param *pp = &d->params[k];
        switch (pp->type) {
        case SHMIPC_ABI_SIZE:
            last_size = vals[k].sz;
            continue;
        case SHMIPC_ABI_OUT_HANDLE:
            if (!failed && outs[k].p)
                new_handle(L, outs[k].p, pp->kind, parent);
            else
                lua_pushnil(L);
            break;
        case SHMIPC_ABI_OUT_CPTR:
        case SHMIPC_ABI_OUT_CHARS: {
            size_t len = k + 1 < d->nparams ? outs[k + 1].sz : 0;
            if (!failed && outs[k].cp)
                lua_pushlstring(L, outs[k].cp, len);
            else if (!failed && d->ret.type == SHMIPC_ABI_I32)
                lua_pushliteral(L, ""); /* success with no bytes */
            else
                lua_pushnil(L);
            k++; /* the OUT_LEN is part of this value */
            break;
        }
        case SHMIPC_ABI_OUT_CPTR_N:
            if (!failed && outs[k].cp)
                lua_pushlstring(L, outs[k].cp, last_size);
            else
                lua_pushnil(L);
            break;
        case SHMIPC_ABI_OUT_I32:
            if (failed)
                lua_pushnil(L);
            else
                lua_pushinteger(L, outs[k].i32);
            break;
        case SHMIPC_ABI_OUT_U32:
            if (failed)
                lua_pushnil(L);
            else
                lua_pushinteger(L, outs[k].u32);
            break;
        case SHMIPC_ABI_OUT_I64:
            if (failed)
                lua_pushnil(L);
            else
                lua_pushinteger(L, outs[k].i64);
            break;
        case SHMIPC_ABI_OUT_U64:
        case SHMIPC_ABI_OUT_SIZE:
            if (failed)
                lua_pushnil(L);
            else
                push_u64(L, outs[k].u64);
            break;
        default:
            continue; /* OUT_LEN of a CHARS return was pushed with it */
        }
        nres++;
    }
    return nres;
}

/* The entry named `name` ("shmipc_config_new" or "config_new"); raises when there is none. */
static const abi_entry *find_entry(lua_State *L, abi_state *st, const char *name)
{
    const shmipc_abi_fn *d = shmipc_abi_find(name);
    if (!d) {
        lua_pushfstring(L, "shmipc_%s", name);
        d = shmipc_abi_find(lua_tostring(L, -1));
        lua_pop(L, 1);
    }
    if (!d)
        luaL_error(L, "shmipc.abi: no function named %s", name);
    if (!(d->flags & SHMIPC_ABI_GENERIC))
        luaL_error(L, "shmipc.abi: %s is not GENERIC (it has OPAQUE types) and cannot be called",
                   d->name);
    for (int i = 0; i < st->n; i++)
        if (st->e[i].d == d)
            return &st->e[i];
    luaL_error(L, "shmipc.abi: %s could not be prepared", d->name);
    return NULL;
}

int shmipc__lua_abi_call(lua_State *L)
{
    abi_state *st = lua_touserdata(L, lua_upvalueindex(1));
    const abi_entry *e = find_entry(L, st, luaL_checkstring(L, 1));
    return abi_do_call(L, e, 2);
}

static int abi_bound(lua_State *L)
{
    const abi_entry *e = lua_touserdata(L, lua_upvalueindex(2));
    return abi_do_call(L, e, 1);
}

/* shmipc.abi.<name>: a function bound to the entry, cached in the table. */
int shmipc__lua_abi_index(lua_State *L)
{
    abi_state *st = lua_touserdata(L, lua_upvalueindex(1));
    const char *name = luaL_checkstring(L, 2);
    const abi_entry *e = find_entry(L, st, name);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_pushlightuserdata(L, (void *)e);
    lua_pushcclosure(L, abi_bound, 2);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, -2);
    lua_rawset(L, 1);
    return 1;
}

/* shmipc.abi.describe(name) -> {name=, generic=, blocks=, ret=type, params={{name,type,kind}}} */
static const char *type_name(int t)
{
    static const char *const names[] = {
        "VOID",       "I32",        "U32",        "I64",       "U64",       "SIZE",     "CSTR",
        "HANDLE",     "RELEASE",    "OUT_HANDLE", "BYTES_IN",  "BYTES_LEN", "OUT_CPTR", "OUT_LEN",
        "OUT_CPTR_N", "OUT_WPTR_N", "OUT_I32",    "OUT_U32",   "OUT_I64",   "OUT_U64",  "OUT_SIZE",
        "CALLBACK",   "USER_DATA",  "CHARS",      "OUT_CHARS", "OPAQUE",
    };
    return t >= 0 && t < (int)(sizeof names / sizeof names[0]) ? names[t] : "?";
}

int shmipc__lua_abi_describe(lua_State *L)
{
    const char *name = luaL_checkstring(L, 1);
    const shmipc_abi_fn *d = shmipc_abi_find(name);
    if (!d) {
        lua_pushfstring(L, "shmipc_%s", name);
        d = shmipc_abi_find(lua_tostring(L, -1));
        lua_pop(L, 1);
    }
    if (!d)
        return luaL_error(L, "shmipc.abi: no function named %s", name);
    lua_createtable(L, 0, 5);
    lua_pushstring(L, d->name);
    lua_setfield(L, -2, "name");
    lua_pushboolean(L, (d->flags & SHMIPC_ABI_GENERIC) != 0);
    lua_setfield(L, -2, "generic");
    lua_pushboolean(L, (d->flags & SHMIPC_ABI_BLOCKS) != 0);
    lua_setfield(L, -2, "blocks");
    lua_pushstring(L, type_name(d->ret.type));
    lua_setfield(L, -2, "ret");
    lua_createtable(L, d->nparams, 0);
    for (int k = 0; k < d->nparams; k++) {
        lua_createtable(L, 0, 3);
        lua_pushstring(L, d->params[k].name);
        lua_setfield(L, -2, "name");
        lua_pushstring(L, type_name(d->params[k].type));
        lua_setfield(L, -2, "type");
        lua_pushstring(L, shmipc__lua_abi_kind_name(d->params[k].kind));
        lua_setfield(L, -2, "kind");
        lua_rawseti(L, -2, k + 1);
    }
    lua_setfield(L, -2, "params");
    return 1;
}

/* shmipc.abi.names() -> the names of the GENERIC entries, in table order. */
int shmipc__lua_abi_names(lua_State *L)
{
    abi_state *st = lua_touserdata(L, lua_upvalueindex(1));
    lua_createtable(L, st->n, 0);
    for (int i = 0; i < st->n; i++) {
        lua_pushstring(L, st->e[i].d->name);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}
