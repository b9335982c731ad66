/*
 * server.c - shmipc.Server: the HTTP/1.1 server of the C ABI with Python route handlers.
 *
 * Handlers run on the server's worker threads, which Python does not own: each call takes the
 * GIL with PyGILState_Ensure(), builds a shmipc._server.Request (copies of everything, so it
 * may outlive the call), calls the handler and turns its return value into the response. An
 * exception is logged (logger "shmipc.server") and answered with 500; the server goes on.
 *
 * Lifetime. The handlers are kept in the Server's `handlers` list; the C route contexts only
 * borrow them, and the C server is freed (which joins its workers) before that list goes, so
 * no worker can call into a freed handler. Calls that wait on the C server (start, run, a
 * blocking stop, close) release the GIL, since workers need it to finish their handlers.
 * They count themselves in `busy`; close() while another thread is inside one only marks
 * `close_pending` and the last one out frees the server. A handler (a worker thread) never
 * frees nor waits for the server: that would join its own thread. When a handler drops the
 * last reference, the object is resurrected and left behind (server_finalize), since the
 * route contexts borrow it.
 *
 * Owns: the Server type and its lifecycle (new, start, run, stop, close, dealloc), route
 * registration, and the worker threads' GIL entry (shmipcpy_gil_enter, shmipcpy_in_callback).
 * May call: the public C API (shmipc_server_*), module.h's helpers, request.c (route_call),
 * ws.c (Server.websocket) and server_config.c (the constructor's arguments).
 */
#include "module.h"

#include <structmember.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* Set while this (worker) thread runs a Python callback of a server. */
_Thread_local int shmipcpy_in_callback;

/*
 * Python thread states of the worker threads. PyGILState_Ensure() on a thread Python does not
 * know creates a thread state and the matching Release deletes it, which made a trivial
 * handler cost about 150 us; so each worker keeps the one its first callback created (one
 * extra Ensure), and a thread-exit destructor deletes it when the worker ends (inside
 * shmipc_server_close() or the end of run(), whose callers release the GIL). When the
 * interpreter is already finalizing, the state is left to the interpreter's own cleanup.
 */
static pthread_key_t kept_key;
static pthread_once_t kept_once = PTHREAD_ONCE_INIT;
static int kept_key_ok;
static _Thread_local int kept;

static void kept_drop(void *ts)
{
    /* CPython's own key for this thread's state is already cleared here (glibc clears every
     * key of the thread before it runs the destructors), so delete the state by hand, as
     * PyGILState_Release() does for its last count. */
    if (_Py_IsFinalizing())
        return;
    PyEval_RestoreThread(ts);
    PyThreadState_Clear(ts);
    PyThreadState_DeleteCurrent(); /* also releases the GIL */
}

static void kept_init(void)
{
    /* Without the key, every callback creates and deletes its thread state. */
    kept_key_ok = pthread_key_create(&kept_key, kept_drop) == 0;
}

/* PyGILState_Ensure() for callbacks on worker threads, keeping the thread state. */
PyGILState_STATE shmipcpy_gil_enter(void)
{
    if (!kept) {
        pthread_once(&kept_once, kept_init);
        kept = 1;
        if (kept_key_ok) {
            (void)PyGILState_Ensure(); /* the count that keeps the thread state */
            PyThreadState *ts = PyEval_SaveThread();
            /* On failure the state stays until the interpreter clears it. */
            (void)pthread_setspecific(kept_key, ts);
        }
    }
    return PyGILState_Ensure();
}

module_state *shmipcpy_server_state(ServerObject *self)
{
    return shmipcpy_state_of_type(Py_TYPE(self));
}

shmipc_server *shmipcpy_server_usable(ServerObject *self)
{
    if (self->s == NULL || self->close_pending) {
        shmipcpy_raise_closed(shmipcpy_server_state(self), "server");
        return NULL;
    }
    return self->s;
}

/*
 * Frees the C server with the GIL released (its workers may be waiting for the GIL). In a fork
 * child it is only forgotten (module.h): its workers are the parent's threads, and its
 * listening sockets and socket file the parent's.
 */
static void server_free_now(ServerObject *self)
{
    shmipc_server *h = self->s;
    self->s = NULL;
    self->started = 0;
    if (shmipcpy_forked(self->pid))
        return;
    Py_BEGIN_ALLOW_THREADS shmipc_server_close(h);
    Py_END_ALLOW_THREADS
}

/*
 * Whether freeing the C server from this thread could wait for this thread: only from a
 * handler's thread (or an adapter's loop, _shmipc._handler_thread()) and only once the server
 * has workers, whose requests may wait for it. A server never started has none: closing or
 * dropping it there frees it at once, whichever server the thread handles requests for.
 */
static int frees_later(ServerObject *self)
{
    return shmipcpy_in_callback && (self->started || self->starting || self->running);
}

/* With no thread left inside, a close() that came meanwhile takes effect now. */
static void server_settle(ServerObject *self)
{
    if (self->busy > 0 || !self->close_pending || self->s == NULL || frees_later(self))
        return;
    self->close_pending = 0;
    server_free_now(self);
}

static void wake_run(ServerObject *self)
{
    uint64_t one = 1;
    ssize_t n = write(self->wake_fd, &one, sizeof one);
    (void)n; /* EAGAIN: the counter is saturated, which wakes run() all the same */
}

static PyObject *server_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    module_state *ms = shmipcpy_state_of_type(type);
    shmipc_server_config *cfg = NULL;
    PyObject *helpers = NULL, *reg = NULL;
    ServerObject *self;
    int rc;
    if (ms == NULL)
        return NULL;
    if (PyInterpreterState_Get() != PyInterpreterState_Main()) {
        /* Worker threads take the GIL with PyGILState_Ensure(), which knows one interpreter. */
        PyErr_SetString(PyExc_RuntimeError, "shmipc.Server runs in the main interpreter only");
        return NULL;
    }
    self = (ServerObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->wake_fd = -1;
    self->pid = shmipcpy_pid;
    if ((rc = shmipc_server_config_new(&cfg)) < 0) {
        shmipcpy_raise_last(ms, rc);
        goto fail;
    }
    if (shmipcpy_build_config(ms, args, kwargs, cfg) < 0)
        goto fail;
    if ((rc = shmipc_server_new(cfg, &self->s)) < 0) {
        shmipcpy_raise_last(ms, rc);
        goto fail;
    }
    shmipc_server_config_free(cfg);
    cfg = NULL;
    self->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (self->wake_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto fail;
    }
    helpers = PyImport_ImportModule("shmipc._server");
    if (helpers == NULL || (self->handlers = PyList_New(0)) == NULL ||
        (self->request = PyObject_GetAttrString(helpers, "Request")) == NULL ||
        (self->normalize = PyObject_GetAttrString(helpers, "_normalize")) == NULL ||
        (self->log_error = PyObject_GetAttrString(helpers, "_log_error")) == NULL)
        goto fail;
    /* request.c copies the client's address into every Request it makes: the layout must be
     * _RequestBase's. */
    if (!PyType_Check(self->request) ||
        !PyType_IsSubtype((PyTypeObject *)self->request, ms->request_base_type)) {
        PyErr_SetString(PyExc_TypeError, "shmipc._server.Request is not a _RequestBase");
        goto fail;
    }
    reg = PyObject_CallMethod(helpers, "_register", "O", (PyObject *)self);
    if (reg == NULL)
        goto fail;
    Py_DECREF(reg);
    Py_DECREF(helpers);
    return (PyObject *)self;
fail:
    shmipc_server_config_free(cfg);
    Py_XDECREF(helpers);
    Py_DECREF(self);
    return NULL;
}

/*
 * The last reference went inside a handler (a worker thread): freeing the C server here would
 * join this very worker, and freeing the object would pull it from under the C route contexts,
 * which borrow it (the handler's answer still goes through its `normalize`). The object is
 * resurrected for good instead: the server is stopped and stays behind with its handlers, and
 * the atexit hook of shmipc._server (which still sees it) frees it at exit.
 */
static void server_finalize(ServerObject *self)
{
    PyObject *type, *value, *tb;
    if (self->s == NULL || !frees_later(self) || shmipcpy_forked(self->pid))
        return;
    PyErr_Fetch(&type, &value, &tb);
    Py_INCREF(self); /* never released: PyObject_CallFinalizerFromDealloc sees it resurrected */
    shmipc_server_stop(self->s);
    if (PyErr_WarnEx(PyExc_ResourceWarning,
                     "shmipc.Server dropped inside its own handler; close() it instead", 1) < 0)
        PyErr_WriteUnraisable((PyObject *)self);
    PyErr_Restore(type, value, tb);
}

static void server_dealloc(ServerObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0)
        return; /* resurrected by server_finalize */
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    if (self->s != NULL)
        server_free_now(self);
    Py_XDECREF(self->handlers);
    Py_XDECREF(self->request);
    Py_XDECREF(self->normalize);
    Py_XDECREF(self->log_error);
    if (self->wake_fd >= 0)
        close(self->wake_fd);
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* route(method, path, handler): the call; route(method, path): a decorator. */
static PyObject *add_route(ServerObject *self, PyObject *method, PyObject *path, PyObject *handler)
{
    module_state *ms = shmipcpy_server_state(self);
    shmipc_server *s = shmipcpy_server_usable(self);
    const char *m = NULL, *p;
    if (s == NULL)
        return NULL;
    if (!PyCallable_Check(handler)) {
        PyErr_SetString(PyExc_TypeError, "route: handler must be callable");
        return NULL;
    }
    if ((method != Py_None && (m = PyUnicode_AsUTF8(method)) == NULL) ||
        (p = PyUnicode_AsUTF8(path)) == NULL)
        return NULL;
    route_ctx *ctx = PyMem_RawMalloc(sizeof *ctx);
    if (ctx == NULL)
        return PyErr_NoMemory();
    ctx->server = self;
    ctx->handler = handler;
    /* The in-process WSGI/ASGI adapters (shmipc.serve.inprocess) take the request as a
     * REQUEST_HEAD frame, so the environ/scope comes from shmipc._serve's one C decoder. Asked
     * of the handler's class and only True counts: an object that answers every attribute
     * (a Mock, a proxy with __getattr__) is an ordinary handler. */
    PyObject *fr = PyObject_GetAttrString((PyObject *)Py_TYPE(handler), "_shmipc_frame_route");
    ctx->frame = fr == Py_True ? SHMIPCPY_ROUTE_FRAME : SHMIPCPY_ROUTE_PLAIN;
    ctx->queue = NULL;
    int queue =
        fr != NULL && PyUnicode_Check(fr) && PyUnicode_CompareWithASCIIString(fr, "queue") == 0;
    Py_XDECREF(fr);
    PyErr_Clear();
    if (queue) {
        /* Not called: its requests go to its _RouteQueue without the GIL (route_queue.c).
         * The handlers list holds the queue for the server's life. */
        PyObject *q = PyObject_GetAttrString(handler, "_shmipc_queue");
        if (q == NULL || !PyObject_TypeCheck(q, ms->route_queue_type)) {
            Py_XDECREF(q);
            PyMem_RawFree(ctx);
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError,
                            "a queue route needs a _shmipc_queue that is a shmipc._RouteQueue");
            return NULL;
        }
        int rc = PyList_Append(self->handlers, q);
        Py_DECREF(q);
        if (rc < 0) {
            PyMem_RawFree(ctx);
            return NULL;
        }
        ctx->frame = SHMIPCPY_ROUTE_QUEUE;
        ctx->queue = q;
    }
    if (PyList_Append(self->handlers, handler) < 0) {
        PyMem_RawFree(ctx);
        return NULL;
    }
    /* On failure the C call frees ctx through shmipcpy_route_ctx_free; the handler stays listed,
     * which only keeps it alive a little longer. */
    int rc = shmipc_server_route(s, m, p, shmipcpy_route_call, ctx, shmipcpy_route_ctx_free);
    if (rc < 0)
        return shmipcpy_raise_last(ms, rc);
    return Py_NewRef(handler);
}

static PyObject *route_decorator(PyObject *bound, PyObject *handler)
{
    /* bound is (server, method, path). */
    return add_route((ServerObject *)PyTuple_GET_ITEM(bound, 0), PyTuple_GET_ITEM(bound, 1),
                     PyTuple_GET_ITEM(bound, 2), handler);
}

static PyMethodDef route_decorator_def = {
    "route_decorator", (PyCFunction)route_decorator, METH_O,
    "Registers the decorated function as the route's handler and returns it."};

static PyObject *server_route(ServerObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"method", "path", "handler", NULL};
    PyObject *method, *path, *handler = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OU|O:route", kwlist, &method, &path, &handler))
        return NULL;
    if (method != Py_None && !PyUnicode_Check(method)) {
        PyErr_SetString(PyExc_TypeError, "route: method must be a str or None");
        return NULL;
    }
    if (handler != Py_None)
        return add_route(self, method, path, handler);
    if (shmipcpy_server_usable(self) == NULL)
        return NULL;
    PyObject *bound = PyTuple_Pack(3, (PyObject *)self, method, path);
    if (bound == NULL)
        return NULL;
    PyObject *deco = PyCFunction_New(&route_decorator_def, bound);
    Py_DECREF(bound);
    return deco;
}

static PyObject *server_static(ServerObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"path", "body", "content_type", "status", "method", NULL};
    const char *path, *method = NULL, *ctype = NULL;
    PyObject *body, *ctype_obj = NULL;
    int status = 200;
    Py_buffer view;
    shmipc_server *s = shmipcpy_server_usable(self);
    if (s == NULL)
        return NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sO|$Oiz:static", kwlist, &path, &body,
                                     &ctype_obj, &status, &method))
        return NULL;
    if (ctype_obj != NULL && ctype_obj != Py_None && (ctype = PyUnicode_AsUTF8(ctype_obj)) == NULL)
        return NULL;
    if (PyUnicode_Check(body)) {
        Py_ssize_t len;
        const char *text = PyUnicode_AsUTF8AndSize(body, &len);
        if (text == NULL)
            return NULL;
        if (ctype_obj == NULL)
            ctype = "text/plain; charset=utf-8";
        int rc = shmipc_server_static(s, method, path, status, ctype, text, (size_t)len);
        if (rc < 0)
            return shmipcpy_raise_last(shmipcpy_server_state(self), rc);
        Py_RETURN_NONE;
    }
    if (PyObject_GetBuffer(body, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int rc = shmipc_server_static(s, method, path, status, ctype, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    if (rc < 0)
        return shmipcpy_raise_last(shmipcpy_server_state(self), rc);
    Py_RETURN_NONE;
}

static PyObject *server_start(ServerObject *self, PyObject *unused)
{
    (void)unused;
    shmipc_server *s = shmipcpy_server_usable(self);
    int rc;
    if (s == NULL)
        return NULL;
    if (self->started)
        Py_RETURN_NONE;
    if (self->starting || self->running)
        return shmipcpy_raise_busy("server");
    if (shmipcpy_in_callback) {
        PyErr_SetString(PyExc_RuntimeError, "start() cannot be called from a handler");
        return NULL;
    }
    self->starting = 1;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS rc = shmipc_server_start(s);
    Py_END_ALLOW_THREADS self->busy--;
    self->starting = 0;
    if (rc == 0)
        self->started = 1;
    server_settle(self);
    if (rc < 0)
        return shmipcpy_raise_last(shmipcpy_server_state(self), rc);
    Py_RETURN_NONE;
}

/* Waits for the graceful stop of a started server (GIL released). */
static int finish_stop(ServerObject *self, shmipc_server *s)
{
    int rc;
    shmipc_server_stop(s);
    Py_BEGIN_ALLOW_THREADS rc = shmipc_server_run(s);
    Py_END_ALLOW_THREADS self->started = 0;
    return rc;
}

static PyObject *server_run(ServerObject *self, PyObject *unused)
{
    (void)unused;
    shmipc_server *s = shmipcpy_server_usable(self);
    int rc = 0, interrupted = 0;
    if (s == NULL)
        return NULL;
    if (self->starting || self->running)
        return shmipcpy_raise_busy("server");
    if (shmipcpy_in_callback) {
        PyErr_SetString(PyExc_RuntimeError, "run() cannot be called from a handler");
        return NULL;
    }
    self->running = 1;
    self->busy++;
    if (self->stop_flag) {
        /* stop() came before run(): return at once, stopping a started server. */
        self->stop_flag = 0;
        if (self->started)
            rc = finish_stop(self, s);
        goto out;
    }
    if (!self->started) {
        Py_BEGIN_ALLOW_THREADS rc = shmipc_server_start(s);
        Py_END_ALLOW_THREADS if (rc < 0) goto out;
        self->started = 1;
    }
    /* Wait in slices so that Ctrl-C (or any signal handler that raises) gets through even
     * when the signal went to another thread; stop() and close() wake the poll at once. */
    while (!self->stop_flag && !self->close_pending) {
        struct pollfd p = {.fd = self->wake_fd, .events = POLLIN};
        uint64_t n;
        Py_BEGIN_ALLOW_THREADS if (poll(&p, 1, SHMIPCPY_SLICE_MS) > 0)
        {
            ssize_t r = read(self->wake_fd, &n, sizeof n);
            (void)r;
        }
        Py_END_ALLOW_THREADS if (PyErr_CheckSignals() < 0)
        {
            interrupted = 1;
            break;
        }
    }
    self->stop_flag = 0;
    rc = finish_stop(self, s);
out:
    self->busy--;
    self->running = 0;
    server_settle(self);
    if (interrupted)
        return NULL;
    if (rc < 0)
        return shmipcpy_raise_last(shmipcpy_server_state(self), rc);
    Py_RETURN_NONE;
}

static PyObject *server_stop(ServerObject *self, PyObject *unused)
{
    (void)unused;
    shmipc_server *s = self->s;
    if (s == NULL || self->close_pending)
        Py_RETURN_NONE;
    if (self->running || self->starting || shmipcpy_in_callback) {
        /* run() returns (after its graceful stop) when it sees the flag. */
        self->stop_flag = 1;
        if (shmipcpy_in_callback && !self->running)
            shmipc_server_stop(s); /* the next run() or close() completes it */
        wake_run(self);
        Py_RETURN_NONE;
    }
    if (!self->started) {
        self->stop_flag = 1; /* the next run() returns at once */
        Py_RETURN_NONE;
    }
    self->busy++;
    int rc = finish_stop(self, s);
    self->busy--;
    server_settle(self);
    if (rc < 0)
        return shmipcpy_raise_last(shmipcpy_server_state(self), rc);
    Py_RETURN_NONE;
}

static PyObject *server_close(ServerObject *self, PyObject *unused)
{
    (void)unused;
    if (self->s == NULL)
        Py_RETURN_NONE;
    if ((self->busy > 0 || frees_later(self)) && !shmipcpy_forked(self->pid)) {
        /* run() or start() is inside the C server, or this is a handler: the last one out
         * (or a later close() from a Python thread, or dealloc) frees it. */
        if (!self->close_pending) {
            self->close_pending = 1;
            shmipc_server_stop(self->s);
            wake_run(self);
        }
        Py_RETURN_NONE;
    }
    server_free_now(self);
    Py_RETURN_NONE;
}

static PyObject *server_enter(ServerObject *self, PyObject *unused)
{
    (void)unused;
    if (shmipcpy_server_usable(self) == NULL)
        return NULL;
    return Py_NewRef(self);
}

static PyObject *server_exit(ServerObject *self, PyObject *args)
{
    (void)args;
    PyObject *r = server_close(self, NULL);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

static PyObject *server_get_port(ServerObject *self, void *closure)
{
    (void)closure;
    shmipc_server *s = shmipcpy_server_usable(self);
    if (s == NULL)
        return NULL;
    if (!self->started) {
        PyErr_SetString(PyExc_RuntimeError, "Server.port: the server is not running");
        return NULL;
    }
    int port = shmipc_server_port(s);
    if (port < 0)
        return shmipcpy_raise_last(shmipcpy_server_state(self), port);
    return PyLong_FromLong(port);
}

static PyObject *server_get_backend(ServerObject *self, void *closure)
{
    (void)closure;
    const char *b = self->s && self->started ? shmipc_server_backend(self->s) : NULL;
    if (b == NULL)
        Py_RETURN_NONE;
    return PyUnicode_FromString(b);
}

static PyObject *server_get_running(ServerObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->s != NULL && self->started);
}

static PyObject *server_get_closed(ServerObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->s == NULL || self->close_pending);
}

static PyObject *server_repr(ServerObject *self)
{
    if (self->s == NULL || self->close_pending)
        return PyUnicode_FromString("<shmipc.Server closed>");
    if (!self->started)
        return PyUnicode_FromString("<shmipc.Server not started>");
    return PyUnicode_FromFormat("<shmipc.Server port %d %s>", shmipc_server_port(self->s),
                                shmipc_server_backend(self->s));
}

static PyMethodDef server_methods[] = {
    {"route", (PyCFunction)(void (*)(void))server_route, METH_VARARGS | METH_KEYWORDS,
     "route(method, path, handler=None)\n\n"
     "Answer requests for `method` ('GET', 'POST', ...; None: any; a GET route also answers\n"
     "HEAD) on `path` (exact, or a prefix ending in '/*') by calling handler(request) on a\n"
     "worker thread. Without `handler`, returns a decorator. The handler gets a\n"
     "shmipc.Request and returns bytes, str, a dict or list (sent as JSON), None (204), a\n"
     "shmipc.Response or (body, status[, headers]). An exception is logged (logger\n"
     "'shmipc.server') and answered with 500. Before start() only."},
    {"websocket", (PyCFunction)(void (*)(void))shmipcpy_server_websocket,
     METH_VARARGS | METH_KEYWORDS,
     "websocket(path, on_message=None, *, on_open=None, on_close=None, subprotocols=None)\n\n"
     "Serve WebSocket upgrades on `path` (exact, or a prefix ending in '/*'). Callbacks run\n"
     "on the connection's worker thread with a shmipc.WebSocket: on_open(ws, request) before\n"
     "the 101 (return False, or raise, to refuse with 403), on_message(ws, data) per whole\n"
     "message (str for text, bytes for binary), on_close(ws, code, reason) once at the end.\n"
     "An exception in on_message is logged and closes that connection with 1011.\n"
     "subprotocols: names offered in order of preference (list, or a comma-separated str).\n"
     "Without on_message, returns a decorator for it. Before start() only."},
    {"static", (PyCFunction)(void (*)(void))server_static, METH_VARARGS | METH_KEYWORDS,
     "static(path, body, *, content_type=None, status=200, method=None)\n\n"
     "Answer `method` (None: GET and HEAD) on `path` with a fixed response, served entirely in\n"
     "C. `body` is bytes-like or str (then content_type defaults to text/plain UTF-8).\n"
     "Before start() only."},
    {"start", (PyCFunction)server_start, METH_NOARGS,
     "start() -> None\n\n"
     "Bind and start the workers; returns once they accept (the GIL released meanwhile).\n"
     "Starting a running server is a no-op."},
    {"run", (PyCFunction)server_run, METH_NOARGS,
     "run() -> None\n\n"
     "Start unless started, then block (GIL released) until stop() or close() from another\n"
     "thread or a handler, or a signal whose handler raises (Ctrl-C: KeyboardInterrupt,\n"
     "raised after the server stopped gracefully)."},
    {"stop", (PyCFunction)server_stop, METH_NOARGS,
     "stop() -> None\n\n"
     "Stop gracefully. While run() runs (on another thread, or from a handler) it only asks\n"
     "run() to return. A server started with start() is stopped here (waiting up to the\n"
     "stop timeout); it may be started again. A stop() before run() makes it return at once."},
    {"close", (PyCFunction)server_close, METH_NOARGS,
     "close() -> None\n\n"
     "Stop (gracefully) and free the server. While run() runs on another thread, it is\n"
     "stopped and the server freed when run() returns. Safe to call twice."},
    {"__enter__", (PyCFunction)server_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)server_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef server_getset[] = {
    {"port", (getter)server_get_port, NULL,
     "The TCP port listened on (RuntimeError before start()).", NULL},
    {"backend", (getter)server_get_backend, NULL, "'io_uring' or 'epoll' while running, else None.",
     NULL},
    {"running", (getter)server_get_running, NULL, "Whether the workers are running.", NULL},
    {"closed", (getter)server_get_closed, NULL, "Whether close() was called.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef server_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(ServerObject, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot server_slots[] = {
    {Py_tp_new, server_new},
    {Py_tp_dealloc, server_dealloc},
    {Py_tp_finalize, server_finalize},
    {Py_tp_repr, server_repr},
    {Py_tp_methods, server_methods},
    {Py_tp_getset, server_getset},
    {Py_tp_members, server_members},
    {Py_tp_doc,
     "Server(address='127.0.0.1', port=8080, *, workers=None, backend=None,\n"
     "       header_timeout=None, keepalive_timeout=None, stop_timeout=None,\n"
     "       max_request_line=None, max_head_bytes=None, max_headers=None, max_body=None,\n"
     "       pipeline=None, server_name=..., max_ws_message=None, ws_ping_timeout=None,\n"
     "       ws_idle_timeout=None, ws_send_high_water=None, ws_send_limit=None,\n"
     "       reuse_port=None)\n\n"
     "An HTTP/1.1 server on shmipc's io_uring/epoll reactor (docs/http.md, docs/python.md).\n"
     "port=0 picks an ephemeral port (see .port after start()). workers: worker threads\n"
     "(default SHMIPC_WORKERS, else one per CPU). backend: 'auto', 'io_uring', 'epoll',\n"
     "'epoll_oneshot' or None (the SHMIPC_REACTOR_BACKEND knob). Timeouts are float seconds;\n"
     "limits are counts of bytes (pipeline: requests per turn); None keeps the default (for\n"
     "the timeouts: 10 s, 60 s, 5 s or the SHMIPC_HTTP_* knobs, not forever). A negative\n"
     "timeout means never (no header deadline, no idle timeout, a stop that waits for the\n"
     "requests in flight); keepalive_timeout=0 turns keep-alive off (Connection: close),\n"
     "stop_timeout=0 closes at once, header_timeout=0 is refused.\n"
     "server_name: the Server header (None or '' removes it).\n"
     "reuse_port: True shares the port with another server already listening there\n"
     "(SO_REUSEPORT); False or None (SHMIPC_HTTP_REUSEPORT decides, default 0) makes start()\n"
     "raise shmipc.Error with errno EADDRINUSE when any socket listens on the port.\n"
     "WebSocket: max_ws_message (bytes of a message; close 1009 above it), ws_ping_timeout\n"
     "(a ping after this many seconds of silence), ws_idle_timeout (fail the connection,\n"
     "1006, after this much silence; above ws_ping_timeout), negative or None meaning never\n"
     "(0 is refused);\n"
     "ws_send_high_water (bytes queued for a peer at which the server stops reading it) and\n"
     "ws_send_limit (bytes queued at which WebSocket.send() raises SHMIPC_EAGAIN).\n\n"
     "Handlers run on the worker threads, several at once with several workers, each taking\n"
     "the GIL: keep them short and non-blocking. Routes and static responses are added\n"
     "before start(). A context manager; close() is safe to call twice."},
    {0, NULL},
};

PyType_Spec shmipcpy_server_spec = {
    .name = "shmipc.Server",
    .basicsize = sizeof(ServerObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = server_slots,
};
