/*
 * abi.c - shmipc.abi: any GENERIC function of the descriptor table (bindings/abi.def), called
 * by name through libffi with marshalling driven by the table's types. docs/lua.md describes
 * the Lua API, docs/abi.md the vocabulary. One ffi_cif per GENERIC entry is prepared when the
 * module loads; a call checks every argument before it reaches C.
 *
 * Owns: the prepared entries (abi_state, anchored in the registry), the handle type, the log
 * sink closure, and shmipc__lua_open_abi; abi_call.c holds the calls themselves.
 * May call: the descriptor table (shmipc_abi.h), libffi, lshmipc.h and abi_call.c (labi.h).
 */
#include "labi.h"

#include <stdatomic.h>
#include <stdlib.h>

/* ------------------------------------------------------------------------------------ */
/* Kinds and destructors                                                                */
/* ------------------------------------------------------------------------------------ */

const char *shmipc__lua_abi_kind_name(int kind)
{
    switch (kind) {
#define KIND_CASE(name, value, ctype)                                                              \
    case (value):                                                                                  \
        return #name;
        SHMIPC_ABI_KIND_MAP(KIND_CASE)
#undef KIND_CASE
    default:
        return "NONE";
    }
}

/* The table entry whose only parameter RELEASEs `kind`, or NULL. */
static const shmipc_abi_fn *destructor_of(int kind)
{
    int n = shmipc_abi_count();
    for (int i = 0; i < n; i++) {
        const shmipc_abi_fn *d = shmipc_abi_get(i);
        if (d && d->nparams == 1 && d->params[0].type == SHMIPC_ABI_RELEASE &&
            d->params[0].kind == kind && d->ret.type == SHMIPC_ABI_VOID)
            return d;
    }
    return NULL;
}

static void handle_release(abi_handle *h)
{
    if (!h->p)
        return;
    const shmipc_abi_fn *d = destructor_of(h->kind);
    void *p = h->p;
    h->p = NULL;
    if (d)
        ((void (*)(void *))(void *)d->fn)(p);
}

static int handle_gc(lua_State *L)
{
    handle_release(luaL_checkudata(L, 1, ABI_HANDLE_MT));
    return 0;
}

static int handle_close(lua_State *L)
{
    handle_release(luaL_checkudata(L, 1, ABI_HANDLE_MT));
    return 0;
}

static int handle_kind(lua_State *L)
{
    abi_handle *h = luaL_checkudata(L, 1, ABI_HANDLE_MT);
    lua_pushstring(L, shmipc__lua_abi_kind_name(h->kind));
    return 1;
}

static int handle_closed(lua_State *L)
{
    abi_handle *h = luaL_checkudata(L, 1, ABI_HANDLE_MT);
    lua_pushboolean(L, h->p == NULL);
    return 1;
}

static int handle_tostring(lua_State *L)
{
    abi_handle *h = luaL_checkudata(L, 1, ABI_HANDLE_MT);
    if (h->p)
        lua_pushfstring(L, ABI_HANDLE_MT " %s (%p)", shmipc__lua_abi_kind_name(h->kind), h->p);
    else
        lua_pushfstring(L, ABI_HANDLE_MT " %s (closed)", shmipc__lua_abi_kind_name(h->kind));
    return 1;
}

static const luaL_Reg handle_meta[] = {
    {"__gc", handle_gc},
    {"__close", handle_gc},
    {"__tostring", handle_tostring},
    {NULL, NULL},
};

static const luaL_Reg handle_methods[] = {
    {"close", handle_close},
    {"kind", handle_kind},
    {"closed", handle_closed},
    {NULL, NULL},
};

/* ------------------------------------------------------------------------------------ */
/* The log sink closure                                                                 */
/* ------------------------------------------------------------------------------------ */

static ffi_cif sink_cif;
static ffi_type *sink_types[ABI_MAXPARAMS];
static const shmipc_abi_fn *sink_desc;
pthread_mutex_t shmipc__lua_abi_sink_lock = PTHREAD_MUTEX_INITIALIZER;
sink_rec *shmipc__lua_abi_sink_current; /* under shmipc__lua_abi_sink_lock */
static atomic_ulong sink_dropped;

static ffi_type *ffi_type_of(int type)
{
    switch (type) {
    case SHMIPC_ABI_VOID:
        return &ffi_type_void;
    case SHMIPC_ABI_I32:
        return &ffi_type_sint;
    case SHMIPC_ABI_U32:
        return &ffi_type_uint32;
    case SHMIPC_ABI_I64:
        return &ffi_type_sint64;
    case SHMIPC_ABI_U64:
    case SHMIPC_ABI_SIZE:
    case SHMIPC_ABI_BYTES_LEN:
        return &ffi_type_uint64;
    case SHMIPC_ABI_OPAQUE:
        return NULL;
    default:
        return &ffi_type_pointer;
    }
}

static void sink_handler(ffi_cif *cif, void *ret, void **args, void *ud)
{
    (void)cif;
    (void)ret;
    sink_rec *r = ud;
    if (!pthread_equal(pthread_self(), r->owner) || r->busy) {
        atomic_fetch_add(&sink_dropped, 1);
        return;
    }
    r->busy = 1;
    lua_State *T = r->thread;
    int top = lua_gettop(T);
    lua_rawgeti(T, LUA_REGISTRYINDEX, r->fn_ref);
    for (int k = 0; k < sink_desc->nparams; k++) {
        switch (sink_desc->params[k].type) {
        case SHMIPC_ABI_I32:
            lua_pushinteger(T, *(int *)args[k]);
            break;
        case SHMIPC_ABI_CSTR: {
            const char *s = *(const char **)args[k];
            if (s)
                lua_pushstring(T, s);
            else
                lua_pushnil(T);
            break;
        }
        default:
            lua_pushnil(T);
            break;
        }
    }
    if (lua_pcall(T, sink_desc->nparams, 0, 0) != LUA_OK)
        atomic_fetch_add(&sink_dropped, 1); /* an error in the sink is dropped */
    lua_settop(T, top);
    r->busy = 0;
    if (r->doomed) /* the sink replaced itself: freed now that it is done */
        shmipc__lua_abi_sink_free(r, r->doomed_state);
}

void shmipc__lua_abi_sink_free(sink_rec *r, lua_State *L)
{
    if (!r)
        return;
    if (r->busy && !r->doomed) {
        /* Running on this thread (the sink replaced itself): its closure, its thread and its
         * function stay until sink_handler leaves, which frees it. */
        r->doomed = 1;
        r->doomed_state = L;
        return;
    }
    /* A reference in another state's registry dies with that state. */
    if (L && r->main == L) {
        luaL_unref(L, LUA_REGISTRYINDEX, r->fn_ref);
        luaL_unref(L, LUA_REGISTRYINDEX, r->thread_ref);
    }
    ffi_closure_free(r->closure);
    free(r);
}

lua_State *shmipc__lua_abi_main_thread(lua_State *L)
{
    lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
    lua_State *m = lua_tothread(L, -1);
    lua_pop(L, 1);
    return m;
}

/* Builds the closure for the function at `arg`. Raises on failure. */
sink_rec *shmipc__lua_abi_sink_new(lua_State *L, int arg)
{
    if (!sink_desc)
        luaL_error(L, "shmipc.abi: the log sink callback could not be prepared");
    sink_rec *r = calloc(1, sizeof *r);
    if (!r) {
        luaL_error(L, "shmipc.abi: out of memory");
        return NULL;
    }
    r->closure = ffi_closure_alloc(sizeof(ffi_closure), &r->code);
    if (!r->closure) {
        free(r);
        luaL_error(L, "shmipc.abi: ffi_closure_alloc failed");
        return NULL;
    }
    if (ffi_prep_closure_loc(r->closure, &sink_cif, sink_handler, r, r->code) != FFI_OK) {
        ffi_closure_free(r->closure);
        free(r);
        luaL_error(L, "shmipc.abi: ffi_prep_closure_loc failed");
        return NULL;
    }
    r->main = shmipc__lua_abi_main_thread(L);
    r->owner = pthread_self();
    lua_pushvalue(L, arg);
    r->fn_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    r->thread = lua_newthread(L);
    r->thread_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return r;
}

static int abi_log_dropped(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)atomic_load(&sink_dropped));
    return 1;
}

/* When the state closes, its sink (if it is the installed one) is removed before it is freed. */
static int state_gc(lua_State *L)
{
    lua_State *m = shmipc__lua_abi_main_thread(L);
    pthread_mutex_lock(&shmipc__lua_abi_sink_lock);
    sink_rec *r = shmipc__lua_abi_sink_current;
    if (r && r->main == m) {
        shmipc_set_log_sink(NULL);
        shmipc__lua_abi_sink_current = NULL;
    } else {
        r = NULL;
    }
    pthread_mutex_unlock(&shmipc__lua_abi_sink_lock);
    if (r) {
        ffi_closure_free(r->closure); /* the registry goes away with the state */
        free(r);
    }
    return 0;
}

static pthread_once_t sink_once = PTHREAD_ONCE_INIT;

static void sink_prepare(void)
{
    const shmipc_abi_fn *cb = shmipc_abi_callback(SHMIPC_ABI_KIND_LOG_SINK);
    if (!cb || cb->nparams > ABI_MAXPARAMS)
        return;
    for (int k = 0; k < cb->nparams; k++)
        sink_types[k] = ffi_type_of(cb->params[k].type);
    if (ffi_prep_cif(&sink_cif, FFI_DEFAULT_ABI, (unsigned)cb->nparams, ffi_type_of(cb->ret.type),
                     sink_types) == FFI_OK)
        sink_desc = cb;
}

void shmipc__lua_open_abi(lua_State *L);
/* Sets field "abi" of the module table at the top of the stack. */
void shmipc__lua_open_abi(lua_State *L)
{
    pthread_once(&sink_once, sink_prepare);
    shmipc__lua_new_class(L, ABI_HANDLE_MT, handle_meta, handle_methods);

    int count = shmipc_abi_count(), n = 0;
    abi_state *st = lua_newuserdatauv(L, sizeof *st + (size_t)count * sizeof(abi_entry), 0);
    for (int i = 0; i < count; i++) {
        const shmipc_abi_fn *d = shmipc_abi_get(i);
        if (!d || !(d->flags & SHMIPC_ABI_GENERIC) || d->nparams > ABI_MAXPARAMS)
            continue;
        abi_entry *e = &st->e[n];
        e->d = d;
        e->nargs = 0;
        int ok = 1;
        for (int k = 0; k < d->nparams; k++) {
            e->types[k] = ffi_type_of(d->params[k].type);
            ok = ok && e->types[k];
            e->nargs += shmipc__lua_abi_takes_arg(d->params[k].type);
        }
        ffi_type *rt = ffi_type_of(d->ret.type);
        if (!ok || !rt ||
            ffi_prep_cif(&e->cif, FFI_DEFAULT_ABI, (unsigned)d->nparams, rt, e->types) != FFI_OK)
            continue;
        n++;
    }
    st->n = n;
    luaL_newmetatable(L, ABI_STATE_MT);
    lua_pushcfunction(L, state_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    /* Anchor it: it lives as long as the state, whatever happens to the module table. */
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, ABI_STATE_MT);
    int sti = lua_gettop(L);

    lua_newtable(L); /* shmipc.abi */
    static const luaL_Reg fns[] = {
        {"call", shmipc__lua_abi_call},
        {"names", shmipc__lua_abi_names},
        {NULL, NULL},
    };
    lua_pushvalue(L, sti);
    luaL_setfuncs(L, fns, 1);
    lua_pushcfunction(L, shmipc__lua_abi_describe);
    lua_setfield(L, -2, "describe");
    lua_pushcfunction(L, abi_log_dropped);
    lua_setfield(L, -2, "log_dropped");
    lua_newtable(L); /* kinds */
#define KIND_FIELD(name, value, ctype)                                                             \
    lua_pushinteger(L, (value));                                                                   \
    lua_setfield(L, -2, #name);
    SHMIPC_ABI_KIND_MAP(KIND_FIELD)
#undef KIND_FIELD
    lua_setfield(L, -2, "kinds");
    luaL_getmetatable(L, ABI_HANDLE_MT);
    lua_setfield(L, -2, "handle");
    lua_newtable(L); /* its metatable */
    lua_pushvalue(L, sti);
    lua_pushcclosure(L, shmipc__lua_abi_index, 1);
    lua_setfield(L, -2, "__index");
    lua_setmetatable(L, -2);
    lua_setfield(L, -3, "abi");
    lua_pop(L, 1); /* the state */
}
