/*
 * labi.h - what abi.c and abi_call.c (shmipc.abi) share: the prepared entries, the handle,
 * the log sink record and the functions one calls in the other. Internal: every function is
 * hidden in the shared object. It needs libffi, which the rest of the module does not.
 */
#ifndef SHMIPC_LUA_LABI_H
#define SHMIPC_LUA_LABI_H

#include "lshmipc.h"

#include <shmipc_abi.h>

#include <ffi.h>

#include <pthread.h>

#define ABI_HANDLE_MT "shmipc.abi.handle"
#define ABI_STATE_MT  "shmipc.abi.state"
#define ABI_MAXPARAMS 16

/* One prepared entry. */
typedef struct {
    const shmipc_abi_fn *d;
    int nargs; /* Lua arguments: parameters that take one */
    ffi_cif cif;
    ffi_type *types[ABI_MAXPARAMS];
} abi_entry;

/* The per-state table of prepared entries (a full userdata anchored in the registry). */
typedef struct {
    int n;
    abi_entry e[];
} abi_state;

/* A handle: p is NULL once released. `kind` is an enum shmipc_abi_kind. */
typedef struct {
    void *p;
    int kind;
} abi_handle;
/*
 * The installed sink. Lines are delivered only on the thread that installed it, while no
 * other line is being delivered; lines from any other thread are dropped and counted.
 */
typedef struct {
    ffi_closure *closure;
    void *code;
    lua_State *main;   /* the main thread of the owning state */
    lua_State *thread; /* a thread of that state the function runs on */
    int thread_ref;    /* registry references in that state */
    int fn_ref;
    pthread_t owner;
    int busy;
    /* Replaced while running (the sink cleared or replaced itself): sink_handler frees it on
     * its way out, with the references of `doomed_state` (NULL: another state's). */
    int doomed;
    lua_State *doomed_state;
} sink_rec;

/* abi.c */
const char *shmipc__lua_abi_kind_name(int kind);
extern pthread_mutex_t shmipc__lua_abi_sink_lock;
extern sink_rec *shmipc__lua_abi_sink_current; /* under shmipc__lua_abi_sink_lock */
void shmipc__lua_abi_sink_free(sink_rec *r, lua_State *L);
lua_State *shmipc__lua_abi_main_thread(lua_State *L);
sink_rec *shmipc__lua_abi_sink_new(lua_State *L, int arg);

/* abi_call.c */
int shmipc__lua_abi_takes_arg(int t);
int shmipc__lua_abi_call(lua_State *L);
int shmipc__lua_abi_index(lua_State *L);
int shmipc__lua_abi_describe(lua_State *L);
int shmipc__lua_abi_names(lua_State *L);

#endif
