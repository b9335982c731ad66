/*
 * gate.c - the gate of a Lua state that made a server: a flag under a mutex and a condition
 * variable, held by whoever runs Lua code of the state (the rules are at the top of server.c).
 * The Lua side takes it on the first shmipc.server() and lets go while it blocks; workers take
 * it around each Lua callback.
 *
 * Owns: the gate's box in the registry and every change of the gate's flag from the Lua side
 * (shmipc__lua_gate_get, _take, _give, _unref, and shmipc__lua_gate_leave/_enter for blocking
 * calls); the workers' side is server.c's shmipc__lua_gate_enter_worker.
 * May call: pthreads and the Lua API only.
 */
#include "lserver.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

/* ------------------------------------------------------------------------------------ */
/* The gate                                                                             */
/* ------------------------------------------------------------------------------------ */

/* The registry key of the state's gate box. */
static const char gate_key = 0;

void shmipc__lua_gate_unref(struct shmipc__lua_gate *g)
{
    pthread_mutex_lock(&g->m);
    int last = --g->refs == 0;
    pthread_mutex_unlock(&g->m);
    if (last) {
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->m);
        free(g);
    }
}

static int gate_box_gc(lua_State *L)
{
    struct shmipc__lua_gate **box = luaL_checkudata(L, 1, GATE_MT);
    if (*box != NULL)
        shmipc__lua_gate_unref(*box);
    *box = NULL;
    return 0;
}

/* The state's gate, or NULL when this state has made no server yet. */
static struct shmipc__lua_gate *find_gate(lua_State *L)
{
    struct shmipc__lua_gate *g = NULL;
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &gate_key) == LUA_TUSERDATA)
        g = *(struct shmipc__lua_gate **)lua_touserdata(L, -1);
    lua_pop(L, 1);
    return g;
}

/* The state's gate, made on first use, held by the Lua side from then on. Raises on ENOMEM. */
struct shmipc__lua_gate *shmipc__lua_gate_get(lua_State *L)
{
    struct shmipc__lua_gate *g = find_gate(L);
    if (g != NULL)
        return g;
    struct shmipc__lua_gate **box = lua_newuserdatauv(L, sizeof *box, 0);
    *box = NULL;
    luaL_setmetatable(L, GATE_MT);
    g = calloc(1, sizeof *g);
    if (g == NULL)
        luaL_error(L, "shmipc.server: out of memory");
    pthread_mutex_init(&g->m, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->held = 1;
    g->refs = 1;
    *box = g;
    lua_rawsetp(L, LUA_REGISTRYINDEX, &gate_key);
    return g;
}

/* Lua side: waits for the gate (a worker may be running a callback). */
void shmipc__lua_gate_take(struct shmipc__lua_gate *g)
{
    pthread_mutex_lock(&g->m);
    while (g->held)
        pthread_cond_wait(&g->cv, &g->m);
    g->held = 1;
    pthread_mutex_unlock(&g->m);
}

void shmipc__lua_gate_give(struct shmipc__lua_gate *g)
{
    pthread_mutex_lock(&g->m);
    g->held = 0;
    g->in_callback = 0;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->m);
}

struct shmipc__lua_gate *shmipc__lua_gate_leave(lua_State *L)
{
    struct shmipc__lua_gate *g = find_gate(L);
    /* Inside a callback the worker holds the gate for its whole call: never let go there. */
    if (g == NULL || g->in_callback)
        return NULL;
    shmipc__lua_gate_give(g);
    return g;
}

void shmipc__lua_gate_enter(struct shmipc__lua_gate *g)
{
    if (g != NULL)
        shmipc__lua_gate_take(g);
}

const luaL_Reg shmipc__lua_gate_meta[] = {
    {"__gc", gate_box_gc},
    {NULL, NULL},
};
