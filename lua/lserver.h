/*
 * lserver.h - what the files of the Lua HTTP server share (server.c, gate.c, request.c, ws.c,
 * server_signals.c, server_config.c): the metatable names, the gate, struct core that the
 * workers see, the handles, and the functions one file calls in another. Internal: every
 * function is hidden in the shared object.
 */
#ifndef SHMIPC_LUA_LSERVER_H
#define SHMIPC_LUA_LSERVER_H

#include "lshmipc.h"

#include <pthread.h>
#include <signal.h>

#define SERVER_MT  "shmipc.server"
#define REQUEST_MT "shmipc.request"
#define GATE_MT    "shmipc.gate"
#define WS_MT      "shmipc.ws"
#define PENDING_MT "shmipc.pending"

struct shmipc__lua_gate {
    pthread_mutex_t m;
    pthread_cond_t cv;
    int held;        /* someone runs Lua code of this state */
    int in_callback; /* ... and it is a worker in a callback, not the Lua side */
    int refs;        /* the registry's box and every server */
};

/*
 * Slots of the callback thread's stack while a callback runs: shmipc__lua_server_thread() pushes
 * them from the registry for each callback, and the callback empties the stack again. Nothing is
 * kept on the thread between callbacks: user code can reach it (coroutine.running() in a
 * handler) and coroutine.close() or coroutine.resume() it from outside.
 */
enum {
    T_MSGH = 1,     /* the message handler, which adds a traceback */
    T_ON_ERROR = 2, /* on_error or nil */
    T_ROUTES = 3,   /* route index -> handler function, or table of WebSocket handlers */
    T_WS = 4,       /* open WebSocket connections: shmipc_ws (light userdata) -> handle */
    T_NSLOTS = T_WS,
};

/*
 * What the workers see; freed after shmipc_server_close(), so it outlives the routes. Fields
 * other than `closing` are used by the Lua side and, inside callbacks, by the gate holder.
 */
struct core {
    shmipc_server *s;
    struct shmipc__lua_gate *gate;
    lua_State *T;      /* the thread callbacks run on */
    int thread_ref;    /* registry reference of T */
    lua_State *spare;  /* never runs: takes T's place should T not be idle */
    int spare_ref;     /* registry reference of spare */
    int on_error_ref;  /* registry reference of on_error (LUA_REFNIL: none): T_ON_ERROR */
    int routes_ref;    /* registry reference of the routes table: T_ROUTES */
    int ws_ref;        /* registry reference of the connection table: T_WS */
    int anchor_ref;    /* registry reference of the handle while started, else LUA_NOREF */
    int closing;       /* under gate->m: waiting workers give up */
    int busy;          /* one of this server's callbacks runs */
    int running;       /* the Lua side is in run() */
    int close_pending; /* closed inside its own callback: free when possible */
    int nroutes;       /* Lua handlers registered */
    void *cur_request; /* the request handle of the running handler */
    int applying;      /* the handler returned: its results are being applied */
};

/* One Lua route: the C handler's user_data. */
struct route {
    struct core *c;
    int index;    /* in T_ROUTES */
    char label[]; /* "GET /items", for the error log */
};

typedef struct {
    struct core *c; /* NULL once closed */
} lserver;
/* A request inside its handler; req is NULL after the handler returned. */
typedef struct {
    const shmipc_http_request *req;
    shmipc_http_response *res; /* while the handler runs (NULL for a WebSocket's on_open) */
    int deferred;              /* req:defer() was called */
} lrequest;

/* The stop signals of run{signals = true} (server_signals.c): SIGINT and SIGTERM. */
#define NSTOP_SIGNALS 2

/* A run{signals = true} in progress: the watcher thread and the dispositions it replaced. */
struct sig_watch {
    shmipc_server *s;
    int quit_fd; /* eventfd: run() returned, the watcher ends */
    int signo;   /* the first stop signal seen; read after the join */
    pthread_t thread;
    struct sigaction old[NSTOP_SIGNALS];
};

/* server.c */
lserver *shmipc__lua_check_server(lua_State *L, int arg);
int shmipc__lua_gate_enter_worker(struct core *c);
lua_State *shmipc__lua_server_thread(struct core *c, const char *label);
void shmipc__lua_server_log_error(lua_State *T, const char *label);

/* gate.c */
void shmipc__lua_gate_unref(struct shmipc__lua_gate *g);
struct shmipc__lua_gate *shmipc__lua_gate_get(lua_State *L);
void shmipc__lua_gate_take(struct shmipc__lua_gate *g);
void shmipc__lua_gate_give(struct shmipc__lua_gate *g);
extern const luaL_Reg shmipc__lua_gate_meta[];

/* request.c */
int shmipc__lua_server_self_or_failure(lua_State *L, int rc);
int shmipc__lua_server_on_request(shmipc_http_request *req, shmipc_http_response *res,
                                  void *user_data);
extern const luaL_Reg shmipc__lua_request_meta[];
extern const luaL_Reg shmipc__lua_pending_methods[];
extern const luaL_Reg shmipc__lua_pending_meta[];

/* ws.c */
int shmipc__lua_server_websocket(lua_State *L);
extern const luaL_Reg shmipc__lua_ws_methods[];
extern const luaL_Reg shmipc__lua_ws_meta[];

/* server_signals.c */
int shmipc__lua_sig_watch_start(struct sig_watch *w, shmipc_server *s, char *msg, size_t cap);
int shmipc__lua_sig_watch_end(struct sig_watch *w);

/* server_config.c */
int shmipc__lua_server_build_config(lua_State *L, shmipc_server_config *cfg);
int shmipc__lua_server_config_box_gc(lua_State *L);

#endif
