/*
 * lshmipc.h - what the C files of the Lua module share. Internal: nothing here is API, and
 * every function is hidden in the shared object (the module exports luaopen_shmipc only).
 *
 * The files: shmipc.c (module entry, version, errors), config.c and config_options.c (the
 * config handle and shmipc.config{...}), wait.c (modes, timeouts, yielding waits,
 * shmipc.poll), stream.c (the stream handle), session.c (session and session manager),
 * listener.c (listener, accept, serve with Lua callbacks), abi.c and abi_call.c (shmipc.abi,
 * sharing labi.h), server.c (the HTTP server with Lua handlers) with gate.c (the gate that
 * keeps its worker threads out of Lua while Lua code runs), request.c, ws.c,
 * server_signals.c and server_config.c (they share lserver.h).
 */
#ifndef SHMIPC_LUA_LSHMIPC_H
#define SHMIPC_LUA_LSHMIPC_H

#include <shmipc.h>

#include <lauxlib.h>
#include <lua.h>

#include <stdint.h>

/* Names of the metatables, which are also the handles' __name. */
#define CONFIG_MT   "shmipc.config"
#define SESSION_MT  "shmipc.session"
#define STREAM_MT   "shmipc.stream"
#define MANAGER_MT  "shmipc.session_manager"
#define LISTENER_MT "shmipc.listener"

/* ------------------------------------------------------------------------------------ */
/* Failures and arguments (shmipc.c)                                                    */
/* ------------------------------------------------------------------------------------ */

/* Pushes nil, shmipc_error_detail() and `code`; returns 3. */
int shmipc__lua_push_failure(lua_State *L, int code);

/* Pushes nil, a formatted message and SHMIPC_EINVAL; returns 3. */
int shmipc__lua_push_invalid(lua_State *L, const char *fmt, ...);

/* A string argument without embedded NUL bytes; raises otherwise. */
const char *shmipc__lua_check_cstring(lua_State *L, int arg);

/*
 * The optional config argument at `arg`: none or nil (*out = NULL, the library's defaults),
 * a config handle, or a table of shmipc.config{...} options, which is replaced at `arg` by
 * the config built from it. Returns 0, or the number of results pushed (nil, message, code)
 * when an option is refused. Raises on a closed config or another type.
 */
int shmipc__lua_opt_config(lua_State *L, int arg, const shmipc_config **out);

/* The read timeout of `cfg` in ms (NULL: the default; -1 = forever, 0 = do not wait). */
int32_t shmipc__lua_read_timeout_ms(const shmipc_config *cfg);

/*
 * Converts the seconds at `arg` to whole milliseconds rounded up, as the config setters do.
 * Returns 0 with *ms set, or the number of results pushed (nil, message, EINVAL) for a value
 * that is negative, NaN or beyond UINT32_MAX ms.
 */
int shmipc__lua_seconds_to_ms(lua_State *L, int arg, const char *field, int *ms);

/* ------------------------------------------------------------------------------------ */
/* Waiting (wait.c)                                                                     */
/* ------------------------------------------------------------------------------------ */

/* How a call that may wait does so: the last, optional argument "block", "nb" or "yield". */
enum shmipc__lua_mode {
    SHMIPC__LUA_BLOCK = 0, /* wait in C: the whole Lua state waits */
    SHMIPC__LUA_NB = 1,    /* never wait: nil, message, SHMIPC_EAGAIN */
    SHMIPC__LUA_YIELD = 2, /* yield to the coroutine's scheduler while it would block */
};

/* The mode argument at `arg` (none or nil: block). Raises on anything else. */
enum shmipc__lua_mode shmipc__lua_check_mode(lua_State *L, int arg);

/*
 * A wait timeout in seconds at `arg`: none, nil, any negative number or math.huge is
 * SHMIPC_WAIT_FOREVER, 0 polls, a positive number is rounded up to whole ms (at most INT_MAX,
 * beyond which it is forever). Raises on NaN.
 */
int shmipc__lua_check_wait_ms(lua_State *L, int arg);

/* Monotonic time in ns. */
uint64_t shmipc__lua_now_ns(void);

/*
 * An operation that may have to wait, run by shmipc__lua_run() in any mode. Its arguments
 * are the first `nargs` slots of the stack; slot 1 is the handle it acts on.
 */
struct shmipc__lua_op {
    const char *what; /* for the timeout message, "read" */
    int nargs;
    /*
     * One attempt. `flags` is 0 (wait, as the handle's timeout says) or SHMIPC_NONBLOCK.
     * On success pushes the results above slot `nargs` + 1 and returns their count (> 0);
     * on failure pushes nothing and returns the negative code, with shmipc_error_detail()
     * saying why.
     */
    int (*attempt)(lua_State *L, int flags);
    /* The descriptor to wait on for the handle at slot 1, or -1 when there is none. */
    int (*pollfd)(lua_State *L);
};

/*
 * Runs `op` in `mode`. In yield mode, while the attempt fails with SHMIPC_EAGAIN, the
 * coroutine yields fd (or nil), "r", the seconds left (or nil) and the handle, and tries
 * again when resumed; after `timeout_ms` (-1: none) it returns nil, message, ETIMEDOUT.
 * Yielding where the running code cannot yield raises. Returns the number of results.
 */
int shmipc__lua_run(lua_State *L, const struct shmipc__lua_op *op, enum shmipc__lua_mode mode,
                    int timeout_ms);

/* Module functions: poll, monotime. */
extern const luaL_Reg shmipc__lua_wait_functions[];

/* ------------------------------------------------------------------------------------ */
/* Handles                                                                              */
/* ------------------------------------------------------------------------------------ */

/* The userdata behind a config; cfg is NULL once the handle is closed. */
typedef struct {
    shmipc_config *cfg;
} lconfig;

/* A session; s is NULL once closed. read_timeout_ms is what its streams start with. */
typedef struct {
    shmipc_session *s;
    int32_t read_timeout_ms; /* -1: forever, 0: do not wait */
} lsession;

/*
 * A stream; st is NULL once closed or given back to a session manager. User value 1 is the
 * handle it came from (session, session manager or listener), which it keeps alive; user
 * value 2 is the table of streams of a running serve(), or nil.
 */
typedef struct {
    shmipc_stream *st;
    int32_t read_timeout_ms; /* a mirror of the stream's read timeout, for yielding reads */
} lstream;

/* Stream user values. */
#define STREAM_UV_PARENT 1
#define STREAM_UV_SERVED 2

/*
 * Pushes a stream userdata holding nothing yet, with the value at `parent` as its user value,
 * so a failed open leaks nothing: the caller stores the stream in it right after.
 */
lstream *shmipc__lua_new_stream(lua_State *L, int parent, int32_t read_timeout_ms);

/*
 * Detaches the C stream from the handle at `idx`, which counts as closed from then on, and
 * returns it (NULL when the handle was closed already). The caller closes it or gives it to
 * a session manager.
 */
shmipc_stream *shmipc__lua_stream_take(lua_State *L, int idx);

/* Closes the stream handle at `idx` (no-op when closed); the one close of every path. */
void shmipc__lua_stream_close(lua_State *L, int idx);

/* Pushes a new, empty session userdata, for listener:accept(). */
lsession *shmipc__lua_new_session(lua_State *L, int32_t read_timeout_ms);

/* Registration: each creates its metatable(s) and adds its functions to the module table. */
void shmipc__lua_open_stream(lua_State *L);
void shmipc__lua_open_session(lua_State *L);
void shmipc__lua_open_listener(lua_State *L);
void shmipc__lua_open_server(lua_State *L);

/*
 * The gate of a state that made a server (server.c): held by whoever runs Lua code of the
 * state. A call that blocks lets go of it around the wait so that workers can call Lua
 * handlers meanwhile: shmipc__lua_gate_leave() returns the gate it let go of, or NULL (no
 * server, or inside a server callback, where it must stay held); shmipc__lua_gate_enter()
 * takes it back (NULL: no-op). Nothing may touch the Lua state in between.
 */
struct shmipc__lua_gate;
struct shmipc__lua_gate *shmipc__lua_gate_leave(lua_State *L);
void shmipc__lua_gate_enter(struct shmipc__lua_gate *g);

/* ------------------------------------------------------------------------------------ */
/* Config (config.c, config_options.c)                                                  */
/* ------------------------------------------------------------------------------------ */

/* A new userdata holding no config yet (pushed), so a failed allocation leaks nothing. */
lconfig *shmipc__lua_config_alloc(lua_State *L);
/* The config at `arg`; raises when it is not a config or is closed. */
shmipc_config *shmipc__lua_check_config(lua_State *L, int arg);
/* The config methods, which the option table of shmipc.config{...} (config_options.c) calls. */
int shmipc__lua_config_buffer_capacity(lua_State *L);
int shmipc__lua_config_queue_capacity(lua_State *L);
int shmipc__lua_config_session_num(lua_State *L);
int shmipc__lua_config_max_stream_num(lua_State *L);
int shmipc__lua_config_rebuild_interval(lua_State *L);
int shmipc__lua_config_slice_classes(lua_State *L);
int shmipc__lua_config_memmap(lua_State *L);
int shmipc__lua_config_path_prefix(lua_State *L);
int shmipc__lua_config_initialize_timeout(lua_State *L);
int shmipc__lua_config_connection_write_timeout(lua_State *L);
int shmipc__lua_config_read_timeout(lua_State *L);
int shmipc__lua_config_write_timeout(lua_State *L);
int shmipc__lua_config_protocol(lua_State *L);
int shmipc__lua_config_wakeup(lua_State *L);
int shmipc__lua_config_with_v4(lua_State *L);
int shmipc__lua_config_with_v4_eventfd(lua_State *L);
int shmipc__lua_config_with_v4_event_queue_polling(lua_State *L);
int shmipc__lua_config_server_v4(lua_State *L);
int shmipc__lua_config_peer_uids(lua_State *L);
int shmipc__lua_config_socket_mode(lua_State *L);
int shmipc__lua_config_max_pending_streams(lua_State *L);
int shmipc__lua_config_spin_us(lua_State *L);
int shmipc__lua_config_max_fallback_unread(lua_State *L);
int shmipc__lua_config_memory_wait(lua_State *L);
extern const luaL_Reg shmipc__lua_config_methods[];
extern const luaL_Reg shmipc__lua_config_metamethods[];

/* shmipc.config([opts]) (config_options.c). */
int shmipc__lua_config_new(lua_State *L);

/* Sets the method table `methods` as __index of the metatable `name`, with `meta`. */
void shmipc__lua_new_class(lua_State *L, const char *name, const luaL_Reg *meta,
                           const luaL_Reg *methods);

#endif
