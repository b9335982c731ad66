/*
 * module.h - what the source files of the _shmipc extension share: the module state, the
 * object layouts, and the error and timeout helpers. Nothing here is exported: the module is
 * built with -fvisibility=hidden and only PyInit__shmipc is public.
 *
 * Files: _shmipc.c (module, errors, Config), stream.c (Stream, Chunk, the reserve window),
 * session.c (Session, SessionManager, Listener and its serve loop), server.c (Server: the
 * HTTP server with Python handlers; its Python half is _server.py).
 */
#ifndef SHMIPC_PY_MODULE_H
#define SHMIPC_PY_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

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
    int busy;
    int close_pending;
    int server;        /* accepted by a Listener (streams are accepted, not opened) */
    uint32_t read_ms;  /* the config's stream read timeout (0: forever), for new Streams */
    uint32_t write_ms; /* the config's stream write timeout (0: forever) */
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
    int busy;          /* a thread is inside a call on `st` with the GIL released */
    int close_pending; /* close() came while busy: the busy thread closes the handle */
    int consumed;      /* reads since the last shmipc_stream_release() */
    uint64_t gen;
    Py_ssize_t live;
    Py_ssize_t exports;
    struct ChunkObject *last_exact; /* borrowed */
    uint64_t wgen;
    Py_ssize_t wexports;
    uint32_t read_ms;   /* the user's read timeout, 0 = forever */
    uint32_t c_read_ms; /* the read timeout currently set on `st` */
    uint32_t write_ms;  /* the write timeout set on `st`, 0 = forever */
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
    int busy;
    int close_pending;
    uint32_t read_ms, write_ms;
} ManagerObject;

typedef struct {
    PyObject_HEAD shmipc_listener *l;
    int busy;
    int close_pending;
    uint32_t read_ms, write_ms;
    PyObject *address;
} ListenerObject;

/* _shmipc.c */
module_state *shmipcpy_state_of_type(PyTypeObject *type);
PyObject *shmipcpy_raise_code(module_state *st, int code, const char *detail);
PyObject *shmipcpy_raise_last(module_state *st, int rc);
PyObject *shmipcpy_raise_invalid(module_state *st, const char *field, const char *what);
PyObject *shmipcpy_raise_closed(module_state *st, const char *what);
PyObject *shmipcpy_raise_busy(const char *what);
/*
 * Reads a timeout argument: None means forever (*ms = -1); otherwise float seconds, rounded
 * up to whole milliseconds (a positive value never becomes 0). 0 is refused unless allow_zero.
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
/* The read and write timeouts (ms, 0 = forever) that streams under `cfg` (may be NULL) get. */
void shmipcpy_config_timeouts(const shmipc_config *cfg, uint32_t *read_ms, uint32_t *write_ms);
/* Parses (value=default, *, nonblock=False) for the vectorcall methods of Stream and Session. */
int shmipcpy_parse_args(const char *fname, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames, const char *argname, PyObject **value, int *nonblock);

/* stream.c */
extern PyType_Spec shmipcpy_stream_spec, shmipcpy_chunk_spec, shmipcpy_window_spec;
/* Wraps a handle the caller owns; on failure the handle is closed. */
PyObject *shmipcpy_stream_wrap(module_state *st, shmipc_stream *h, PyObject *owner,
                               uint32_t read_ms, uint32_t write_ms);
/* Gives the handle up (for put_back) after checking the rules close() checks; NULL on error. */
shmipc_stream *shmipcpy_stream_detach(StreamObject *self);

/* session.c */
extern PyType_Spec shmipcpy_session_spec, shmipcpy_manager_spec, shmipcpy_listener_spec;
PyObject *shmipcpy_connect(PyObject *module, PyObject *args, PyObject *kwargs);

/* server.c */
extern PyType_Spec shmipcpy_server_spec, shmipcpy_websocket_spec;

#endif
