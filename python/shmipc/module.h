/*
 * module.h - what the source files of the _shmipc extension share: the module state, the
 * object layouts, and the error and timeout helpers. Nothing here is exported: the module is
 * built with -fvisibility=hidden and only PyInit__shmipc is public.
 *
 * Files: _shmipc.c (module, errors, helpers), config.c and config_fields.c (Config),
 * stream.c (Stream) with chunk.c (Chunk, the reserve window) and stream_io.c (its reads and
 * writes), session.c (Session), manager.c (SessionManager), listener.c (Listener and its
 * serve loop), abi.c and abi_call.c (shmipc.abi), server.c (Server: the HTTP server with Python
 * handlers; its Python half is _server.py) with request.c, ws.c and server_config.c.
 */
#ifndef SHMIPC_PY_MODULE_H
#define SHMIPC_PY_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <sys/types.h>

#include <shmipc.h>

typedef struct {
    PyTypeObject *config_type;
    PyTypeObject *session_type;
    PyTypeObject *stream_type;
    PyTypeObject *chunk_type;
    PyTypeObject *window_type;
    PyTypeObject *manager_type;
    PyTypeObject *listener_type;
    PyTypeObject *server_type;
    PyTypeObject *websocket_type;
    PyTypeObject *pending_type;
    PyTypeObject *route_queue_type;
    PyTypeObject *request_base_type; /* the C half of shmipc.Request (request.c) */

    PyObject *error;          /* shmipc.Error(OSError) */
    PyObject *timeout_error;  /* + TimeoutError */
    PyObject *closed_error;   /* handle closed locally */
    PyObject *peer_gone;      /* + ConnectionResetError */
    PyObject *protocol_error; /* the peer broke the protocol, or refused ours */
    PyObject *invalid_error;  /* + ValueError */
    PyObject *eof_error;      /* + EOFError */
    PyObject *released_error; /* ClosedError + ValueError: a Chunk used after its release */
    PyObject *unsupported;    /* io.UnsupportedOperation */
} module_state;

extern PyModuleDef shmipcpy_module;

typedef struct {
    PyObject_HEAD shmipc_config *cfg;
} ConfigObject;

/*
 * fork (docs/python.md, "fork"). Every object that holds a handle records the process that made
 * it (`pid`). In another process, a fork() child whose memory, descriptors and mappings are
 * copies of the parent's, close() and dealloc only forget the handle: nothing is sent to the
 * peer, no shared memory is given back, no socket file is removed and no thread is joined, so
 * the parent's objects are untouched; the child's copy is left to its exit.
 */
extern pid_t shmipcpy_pid; /* this process: set at import, again in a fork child (atfork) */
static inline int shmipcpy_forked(pid_t made_in)
{
    return made_in != shmipcpy_pid;
}

/*
 * Blocking calls wait in slices of at most this many milliseconds, with the GIL released,
 * and look for signals (Ctrl-C) and for a close() from another thread between slices.
 */
#define SHMIPCPY_SLICE_MS 100

/*
 * A Session. `busy` counts threads inside a blocking call on `s` with the GIL released;
 * close() while busy only marks `close_pending`, and the last busy thread closes the handle,
 * so the handle is never freed under a running call.
 */
typedef struct {
    PyObject_HEAD shmipc_session *s;
    pid_t pid; /* the process that made it (fork) */
    int busy;
    int close_pending;
    int server; /* accepted by a Listener (streams are accepted, not opened) */
    int32_t
        read_ms; /* the config's stream read timeout (-1: forever, 0: no wait), for new Streams */
    int32_t write_ms; /* the config's stream write timeout (-1: forever, 0: no wait) */
    int memory_wait;  /* the config's memory_wait: a write may wait, so it lets the GIL go */
    PyObject *weakreflist;
} SessionObject;

struct ChunkObject;

/*
 * A Stream owns its shmipc_stream handle. It keeps `owner` (the Session, SessionManager or
 * Listener it came from) alive, so the owner's dealloc never hard-closes the session under it.
 *
 * Chunks. Every Chunk of the stream records the generation `gen` it was made in; release()
 * and close() start a new generation, which invalidates every older Chunk (their bytes may
 * be given back to shared memory). `live` counts the Chunks of this generation that point
 * into memory the library owns; when it drops to 0 and reads consumed data since the last
 * shmipc_stream_release(), the stream releases at once. `exports` counts the buffer exports
 * (memoryviews) of this generation's Chunks: release() and close() refuse while any exist.
 *
 * The reserve() window has its own generation `wgen` and export count `wexports`: commit,
 * write, reserve, flush and close start a new window generation and refuse while the current
 * window is exported.
 *
 * `last_exact` is the newest Chunk from read_exact_bytes() that still points into library
 * memory: the C call may have copied its bytes into a stream-owned buffer that the next
 * read reuses, so the next read first copies them into the Chunk (see stream.c).
 */
typedef struct {
    PyObject_HEAD shmipc_stream *st;
    PyObject *owner;
    PyObject *weakreflist;
    uint32_t id;
    pid_t pid;         /* the process that made it (fork) */
    int busy;          /* a thread is inside a call on `st` with the GIL released */
    int close_pending; /* close() came while busy: the busy thread closes the handle */
    int consumed;      /* reads since the last shmipc_stream_release() */
    uint64_t gen;
    Py_ssize_t live;
    Py_ssize_t exports;
    struct ChunkObject *last_exact; /* borrowed */
    uint64_t wgen;
    Py_ssize_t wexports;
    int32_t read_ms;   /* the user's read timeout: -1 forever, 0 do not wait */
    int32_t c_read_ms; /* the read timeout currently set on `st` */
    int32_t write_ms;  /* the write timeout set on `st`: -1 forever, 0 do not wait */
    int memory_wait;   /* the session's memory_wait: every write may wait, without the GIL */
} StreamObject;

typedef struct ChunkObject {
    PyObject_HEAD StreamObject *stream; /* NULL for the empty Chunk of end-of-stream */
    const char *data;
    Py_ssize_t len;
    uint64_t gen;
    int released;
    int owned; /* data is a private copy (malloc) */
    Py_ssize_t exports;
} ChunkObject;

typedef struct {
    PyObject_HEAD shmipc_session_manager *m;
    pid_t pid; /* the process that made it (fork) */
    int busy;
    int close_pending;
    int32_t read_ms, write_ms;
    int memory_wait;
} ManagerObject;

typedef struct {
    PyObject_HEAD shmipc_listener *l;
    pid_t pid; /* the process that made it (fork) */
    int busy;
    int close_pending;
    int32_t read_ms, write_ms;
    int memory_wait;
    PyObject *address;
} ListenerObject;

/* _shmipc.c: the module, errors and the helpers every type shares */
module_state *shmipcpy_state_of_type(PyTypeObject *type);
PyObject *shmipcpy_raise_code(module_state *st, int code, const char *detail);
PyObject *shmipcpy_raise_last(module_state *st, int rc);
PyObject *shmipcpy_raise_invalid(module_state *st, const char *field, const char *what);
PyObject *shmipcpy_raise_closed(module_state *st, const char *what);
PyObject *shmipcpy_raise_busy(const char *what);
/*
 * Reads a timeout argument by the API's rule: None and any negative value mean forever
 * (*ms = -1), 0 does not wait (refused unless allow_zero), else float seconds rounded up to
 * whole milliseconds (a positive value never becomes 0). NaN and +inf are refused.
 */
int shmipcpy_timeout_arg(module_state *st, PyObject *value, const char *field, int allow_zero,
                         int64_t *ms);
/* A monotonic clock in milliseconds. */
uint64_t shmipcpy_now_ms(void);
/*
 * The milliseconds the next slice of a wait may take: SHMIPCPY_SLICE_MS, or less when the
 * deadline (0: none) is nearer; 0 when the deadline has passed.
 */
int shmipcpy_slice_ms(uint64_t deadline);
/* A private copy of a Config argument (NULL for None), so the GIL can be released. */
int shmipcpy_config_arg(module_state *st, PyObject *obj, shmipc_config **out);
/*
 * The read and write timeouts (ms; -1 forever, 0 do not wait) that streams under `cfg` (may be
 * NULL) get.
 */
void shmipcpy_config_timeouts(const shmipc_config *cfg, int32_t *read_ms, int32_t *write_ms,
                              int *memory_wait);
/* Parses (value=default, *, nonblock=False) for the vectorcall methods of Stream and Session. */
int shmipcpy_parse_args(const char *fname, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames, const char *argname, PyObject **value, int *nonblock);

/* config.c */
extern const char *const shmipcpy_config_memmap_names[];
extern const char *const shmipcpy_config_wakeup_names[];
int shmipcpy_config_lookup_name(const char *const *names, int n, PyObject *value);
int shmipcpy_config_setter_result(ConfigObject *self, int rc);
int shmipcpy_config_require_value(PyObject *value, const char *field);
int shmipcpy_config_to_u64(ConfigObject *self, PyObject *value, const char *field, uint64_t *out);
extern PyType_Spec shmipcpy_config_spec;

/* config_fields.c */
PyObject *shmipcpy_config_get_slice_classes(ConfigObject *self, void *closure);
extern PyGetSetDef shmipcpy_config_getset[];

/* The reserve() window, a writable buffer exporter (chunk.c). */
typedef struct {
    PyObject_HEAD StreamObject *stream;
    char *data;
    Py_ssize_t len;
    uint64_t wgen;
    Py_ssize_t exports;
} WindowObject;

/* stream.c */
extern PyType_Spec shmipcpy_stream_spec;
/* Wraps a handle the caller owns; on failure the handle is closed. */
PyObject *shmipcpy_stream_wrap(module_state *st, shmipc_stream *h, PyObject *owner, int32_t read_ms,
                               int32_t write_ms, int memory_wait);
/* Gives the handle up (for put_back) after checking the rules close() checks; NULL on error. */
shmipc_stream *shmipcpy_stream_detach(StreamObject *self);
module_state *shmipcpy_stream_state(StreamObject *self);
shmipc_stream *shmipcpy_stream_usable(StreamObject *self);
int shmipcpy_stream_leave(StreamObject *self);
void shmipcpy_stream_maybe_release(StreamObject *self);
void shmipcpy_stream_invalidate(StreamObject *self);
int shmipcpy_stream_refuse_chunk_exports(StreamObject *self, const char *what);
int shmipcpy_stream_refuse_exports(StreamObject *self, const char *what);
int shmipcpy_stream_refuse_window(StreamObject *self, const char *what);

/* chunk.c */
extern PyType_Spec shmipcpy_chunk_spec, shmipcpy_window_spec;
PyObject *shmipcpy_chunk_new(module_state *ms, StreamObject *stream, const void *data, size_t len);

/* stream_io.c */
PyObject *shmipcpy_stream_read_chunk(StreamObject *self, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames);
PyObject *shmipcpy_stream_read_exact_bytes(StreamObject *self, PyObject *const *args,
                                           Py_ssize_t nargs, PyObject *kwnames);
PyObject *shmipcpy_stream_read(StreamObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames);
PyObject *shmipcpy_stream_readexactly(StreamObject *self, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kwnames);
PyObject *shmipcpy_stream_release(StreamObject *self, PyObject *unused);
PyObject *shmipcpy_stream_forward(StreamObject *self, PyObject *args, PyObject *kwargs);
PyObject *shmipcpy_stream_write(StreamObject *self, PyObject *data);
PyObject *shmipcpy_stream_reserve(StreamObject *self, PyObject *arg);
PyObject *shmipcpy_stream_commit(StreamObject *self, PyObject *arg);
PyObject *shmipcpy_stream_flush(StreamObject *self, PyObject *unused);

/* What shmipcpy_sliced_accept() returns besides the C result (which is <= 0). */
enum {
    ACCEPT_RAISED = 1,     /* a Python exception is set (timeout, signal) */
    ACCEPT_CLOSED_GOT = 2, /* close() came meanwhile; the caller must close what it got */
    ACCEPT_CLOSED = 3,     /* close() came meanwhile; nothing was accepted */
};

/*
 * Waits for `call` (an accept taking a timeout) in slices with the GIL released, counting
 * itself in `*busy` for the whole wait (the timeout's conversion and the signal handlers
 * between slices run Python code that may close the owner), and looking for signals and for
 * `*close_pending` between slices. The caller settles a close_pending after every result.
 */
typedef int (*accept_fn)(void *handle, int timeout_ms, void **out);

/* session.c */
extern PyType_Spec shmipcpy_session_spec;
PyObject *shmipcpy_connect(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *shmipcpy_session_wrap(module_state *ms, shmipc_session *s, int server, int32_t read_ms,
                                int32_t write_ms, int memory_wait);
int shmipcpy_sliced_accept(module_state *ms, accept_fn call, void *handle, int *busy,
                           int *close_pending, PyObject *timeout, int nonblock, const char *what,
                           void **out);

/* manager.c */
extern PyType_Spec shmipcpy_manager_spec;

/* listener.c */
extern PyType_Spec shmipcpy_listener_spec;

/*
 * The Server's files: server.c (the Server type and its lifecycle), request.c (route handlers
 * and the Request/response conversion), ws.c (WebSocket objects and routes), server_config.c
 * (the constructor's arguments).
 */
typedef struct {
    PyObject_HEAD shmipc_server *s;
    PyObject *handlers;  /* list: every route handler (the C contexts borrow them) */
    PyObject *request;   /* shmipc._server.Request (a _RequestBase) */
    PyObject *normalize; /* shmipc._server._normalize */
    PyObject *log_error; /* shmipc._server._log_error */
    PyObject *weakreflist;
    pid_t pid;         /* the process that made it (fork) */
    int wake_fd;       /* eventfd that wakes run() */
    int busy;          /* threads inside a call on `s` with the GIL released */
    int close_pending; /* close() came while busy (or from a handler) */
    int started;       /* workers are running */
    int running;       /* a thread is inside run() */
    int starting;      /* a thread is inside start() */
    int stop_flag;     /* stop() asked run() to return (or the next run() not to wait) */
} ServerObject;

/* What a route's handler is (server.c decides, request.c calls). */
enum {
    SHMIPCPY_ROUTE_PLAIN = 0, /* handler(Request) -> a response (request.c) */
    SHMIPCPY_ROUTE_FRAME = 1, /* handler(frame, body) -> (status, headers, body) */
    SHMIPCPY_ROUTE_QUEUE = 2, /* not called: queued on `queue` without the GIL (route_queue.c) */
};

typedef struct {
    ServerObject *server; /* borrowed: the server outlives its routes */
    PyObject *handler;    /* borrowed from server->handlers */
    int frame;            /* SHMIPCPY_ROUTE_* */
    PyObject *queue;      /* a _RouteQueue, borrowed (the server's handlers list holds it) */
} route_ctx;

/* server.c */
extern PyType_Spec shmipcpy_server_spec;
extern _Thread_local int shmipcpy_in_callback;
PyGILState_STATE shmipcpy_gil_enter(void);
module_state *shmipcpy_server_state(ServerObject *self);
shmipc_server *shmipcpy_server_usable(ServerObject *self);

/* request.c */
extern PyType_Spec shmipcpy_request_base_spec;
PyObject *shmipcpy_make_request(ServerObject *srv, const shmipc_http_request *req);
void shmipcpy_log_exception(ServerObject *srv, const char *what);
int shmipcpy_route_call(shmipc_http_request *req, shmipc_http_response *res, void *user_data);
void shmipcpy_route_ctx_free(void *user_data);

/* pending.c: PendingResponse, and the route call of this thread for Request.defer() */
extern PyType_Spec shmipcpy_pending_spec;
extern _Thread_local shmipc_http_response *shmipcpy_cur_res;
extern _Thread_local PyObject *shmipcpy_cur_request;
extern _Thread_local int shmipcpy_cur_deferred;
PyObject *shmipcpy_pending_new(module_state *ms, shmipc_http_response *res, int timeout_ms,
                               PyObject *on_end);
PyObject *shmipcpy_defer(PyObject *module, PyObject *args);
void *shmipcpy_pending_state_new(void);
int shmipcpy_pending_defer(shmipc_http_response *res, void *st, shmipc_http_pending **out);
void shmipcpy_pending_state_drop(void *st);
void shmipcpy_pending_state_release(void *st);
PyObject *shmipcpy_pending_wrap(module_state *ms, shmipc_http_pending *p, void *st);

/* route_queue.c: the queue route (no GIL on the worker) */
extern PyType_Spec shmipcpy_route_queue_spec;
int shmipcpy_queue_route_call(shmipc_http_request *req, shmipc_http_response *res, PyObject *queue);

/* request.c: the answers of the frame routes without Python (414/431, 500), and the request
 * as a REQUEST_HEAD frame; all without the GIL */
extern const char shmipcpy_error_body[];
extern const char shmipcpy_error_type[];
int shmipcpy_answer_500(shmipc_http_response *res);
int shmipcpy_answer_direct(shmipc_http_response *res, int status);
int64_t shmipcpy_encode_request_frame(const shmipc_http_request *req, uint8_t *stack, size_t cap,
                                      uint8_t **out, int *status);
const char *shmipcpy_header_str(PyObject *o);

/* ws.c */
extern PyType_Spec shmipcpy_websocket_spec;
PyObject *shmipcpy_server_websocket(ServerObject *self, PyObject *args, PyObject *kwargs);

/* server_config.c */
int shmipcpy_build_config(module_state *ms, PyObject *args, PyObject *kwargs,
                          shmipc_server_config *cfg);

#endif
