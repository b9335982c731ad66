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
 * frees nor waits for the server: that would join its own thread.
 */
#include "module.h"

#include <structmember.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* Bodies from this size up are lent to the C server instead of copied. */
#define BORROW_MIN (64 * 1024)

/* Set while this (worker) thread runs a Python callback of a server. */
static _Thread_local int in_callback;

/*
 * Python thread states of the worker threads. PyGILState_Ensure() on a thread Python does not
 * know creates a thread state and the matching Release deletes it, which made a trivial
 * handler cost about 150 us; so each worker keeps the one its first callback created (one
 * extra Ensure), and a thread-exit destructor deletes it when the worker ends (inside
 * shmipc_server_free() or the end of run(), whose callers release the GIL). When the
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
static PyGILState_STATE gil_enter(void)
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

typedef struct {
    PyObject_HEAD shmipc_server *s;
    PyObject *handlers;  /* list: every route handler (the C contexts borrow them) */
    PyObject *request;   /* shmipc._server.Request */
    PyObject *normalize; /* shmipc._server._normalize */
    PyObject *log_error; /* shmipc._server._log_error */
    PyObject *weakreflist;
    int wake_fd;       /* eventfd that wakes run() */
    int busy;          /* threads inside a call on `s` with the GIL released */
    int close_pending; /* close() came while busy (or from a handler) */
    int started;       /* workers are running */
    int running;       /* a thread is inside run() */
    int starting;      /* a thread is inside start() */
    int stop_flag;     /* stop() asked run() to return (or the next run() not to wait) */
} ServerObject;

typedef struct {
    ServerObject *server; /* borrowed: the server outlives its routes */
    PyObject *handler;    /* borrowed from server->handlers */
} route_ctx;

static module_state *server_state(ServerObject *self)
{
    return shmipcpy_state_of_type(Py_TYPE(self));
}

static shmipc_server *server_usable(ServerObject *self)
{
    if (self->s == NULL || self->close_pending) {
        shmipcpy_raise_closed(server_state(self), "server");
        return NULL;
    }
    return self->s;
}

/* Frees the C server with the GIL released (its workers may be waiting for the GIL). */
static void server_free_now(ServerObject *self)
{
    shmipc_server *h = self->s;
    self->s = NULL;
    self->started = 0;
    Py_BEGIN_ALLOW_THREADS shmipc_server_free(h);
    Py_END_ALLOW_THREADS
}

/* With no thread left inside, a close() that came meanwhile takes effect now. */
static void server_settle(ServerObject *self)
{
    if (self->busy > 0 || !self->close_pending || self->s == NULL || in_callback)
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

/* ---------------------------------------------------------------------------------------- */
/* Handlers (worker threads)                                                                */
/* ---------------------------------------------------------------------------------------- */

static PyObject *str_of(const char *p, size_t len)
{
    return PyUnicode_DecodeLatin1(p ? p : "", (Py_ssize_t)len, NULL);
}

static PyObject *make_request(ServerObject *srv, const shmipc_http_request *req)
{
    size_t len, nlen, n = shmipc_http_request_header_count(req);
    const char *p, *name;
    PyObject *args[7] = {NULL};
    PyObject *result = NULL;
    int i;

    p = shmipc_http_request_method(req, &len);
    args[0] = str_of(p, len);
    p = shmipc_http_request_path(req, &len);
    args[1] = str_of(p, len);
    p = shmipc_http_request_query(req, &len);
    args[2] = str_of(p, len);
    p = shmipc_http_request_wildcard(req, &len);
    args[3] = str_of(p, len);
    args[4] =
        PyUnicode_FromString(shmipc_http_request_version(req) == 10 ? "HTTP/1.0" : "HTTP/1.1");
    args[5] = PyList_New((Py_ssize_t)n);
    for (size_t k = 0; args[5] != NULL && k < n; k++) {
        const char *value = shmipc_http_request_header_at(req, k, &name, &nlen, &len);
        PyObject *pair = Py_BuildValue("(NN)", str_of(name, nlen), str_of(value, len));
        if (pair == NULL) {
            Py_CLEAR(args[5]);
            break;
        }
        PyList_SET_ITEM(args[5], (Py_ssize_t)k, pair);
    }
    p = shmipc_http_request_body(req, &len);
    args[6] = PyBytes_FromStringAndSize(p, (Py_ssize_t)len);
    for (i = 0; i < 7; i++)
        if (args[i] == NULL)
            goto out;
    result = PyObject_Vectorcall(srv->request, args, 7, NULL);
out:
    for (i = 0; i < 7; i++)
        Py_XDECREF(args[i]);
    return result;
}

/* Logs the exception set on this thread as raised by `what` and clears it. */
static void log_exception(ServerObject *srv, const char *what)
{
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    if (tb != NULL && exc != NULL)
        PyException_SetTraceback(exc, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    if (exc == NULL)
        exc = Py_NewRef(Py_None);
    PyObject *res = PyObject_CallFunction(srv->log_error, "Os", exc, what);
    if (res == NULL)
        PyErr_WriteUnraisable(srv->log_error);
    Py_XDECREF(res);
    Py_XDECREF(exc);
}

static void release_bytes(void *obj)
{
    PyGILState_STATE g = gil_enter();
    Py_DECREF((PyObject *)obj);
    PyGILState_Release(g);
}

/* Sets `body` (a bytes object) as the response body, lent when large. */
static int set_body(shmipc_http_response *res, PyObject *body)
{
    Py_ssize_t len = PyBytes_GET_SIZE(body);
    if (len < BORROW_MIN)
        return shmipc_http_response_body(res, PyBytes_AS_STRING(body), (size_t)len);
    /* release runs on this worker later (or before a failing call returns) and takes the GIL
     * (a nested PyGILState_Ensure() while this thread holds it is fine). */
    Py_INCREF(body);
    return shmipc_http_response_body_borrow(res, PyBytes_AS_STRING(body), (size_t)len, body,
                                            release_bytes);
}

/* Applies (status, [(name, value)], body) from _normalize(); < 0 with an exception set. */
static int apply_normalized(ServerObject *srv, shmipc_http_response *res, PyObject *t)
{
    PyObject *headers, *body;
    int status, rc;
    char detail[200];
    (void)srv;
    if (!PyArg_ParseTuple(t, "iOS", &status, &headers, &body))
        return -1;
    if (!PyList_Check(headers)) {
        PyErr_SetString(PyExc_TypeError, "_normalize: headers must be a list");
        return -1;
    }
    rc = shmipc_http_response_set_status(res, status);
    for (Py_ssize_t i = 0; rc == 0 && i < PyList_GET_SIZE(headers); i++) {
        const char *name, *value;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(headers, i), "ss", &name, &value))
            return -1;
        rc = shmipc_http_response_add_header(res, name, value);
    }
    if (rc == 0)
        rc = set_body(res, body);
    if (rc < 0) {
        PyOS_snprintf(detail, sizeof detail, "%s", shmipc_error_detail());
        PyErr_Format(PyExc_ValueError, "invalid response: %s (%s)", detail,
                     shmipc_errname(rc) ? shmipc_errname(rc) : "?");
        return -1;
    }
    return 0;
}

/* The 500 of a failed handler, on a response nothing was set on yet. */
static int answer_500(shmipc_http_response *res)
{
    static const char msg[] = "Internal Server Error\n";
    if (shmipc_http_response_set_status(res, 500) < 0 ||
        shmipc_http_response_add_header(res, "Content-Type", "text/plain; charset=utf-8") < 0 ||
        shmipc_http_response_body(res, msg, sizeof msg - 1) < 0)
        return -1;
    return 0;
}

static int route_call(shmipc_http_request *req, shmipc_http_response *res, void *user_data)
{
    route_ctx *ctx = user_data;
    ServerObject *srv = ctx->server;
    PyGILState_STATE g = gil_enter();
    int rc = 0, touched = 0;
    in_callback = 1;
    PyObject *request = make_request(srv, req);
    PyObject *result = request ? PyObject_CallOneArg(ctx->handler, request) : NULL;
    if (result != NULL) {
        if (PyBytes_Check(result)) {
            touched = 1;
            rc = set_body(res, result);
        } else if (PyUnicode_Check(result)) {
            Py_ssize_t len;
            const char *text = PyUnicode_AsUTF8AndSize(result, &len);
            if (text != NULL) {
                touched = 1;
                rc = shmipc_http_response_add_header(res, "Content-Type",
                                                     "text/plain; charset=utf-8");
                if (rc == 0)
                    rc = shmipc_http_response_body(res, text, (size_t)len);
            }
        } else {
            PyObject *t = PyObject_CallOneArg(srv->normalize, result);
            if (t != NULL) {
                touched = 1;
                rc = apply_normalized(srv, res, t) < 0 ? -1 : 0;
                Py_DECREF(t);
            }
        }
    }
    if (rc < 0 && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "invalid response: %s (%s)", shmipc_error_detail(),
                     shmipc_errname(rc) ? shmipc_errname(rc) : "?");
    if (PyErr_Occurred()) {
        char what[160];
        size_t mlen = 0, plen = 0;
        const char *m = shmipc_http_request_method(req, &mlen);
        const char *p = shmipc_http_request_path(req, &plen);
        PyOS_snprintf(what, sizeof what, "handler for %.*s %.*s", (int)(mlen > 16 ? 16 : mlen),
                      m ? m : "", (int)(plen > 100 ? 100 : plen), p ? p : "");
        log_exception(srv, what);
        /* A clean 500 keeps the connection; once the handler's answer was partly applied,
         * a negative return makes the C server drop it and answer 500 (closing). */
        rc = touched ? -1 : answer_500(res);
    }
    Py_XDECREF(result);
    Py_XDECREF(request);
    in_callback = 0;
    PyGILState_Release(g);
    return rc;
}

static void route_ctx_free(void *user_data)
{
    PyMem_RawFree(user_data);
}

/* ---------------------------------------------------------------------------------------- */
/* WebSocket (worker threads)                                                               */
/* ---------------------------------------------------------------------------------------- */

/*
 * A WebSocket is made in the C on_open callback and handed to every callback of its
 * connection; the C connection holds a strong reference (shmipc_ws_set_data) until on_close
 * returns, when `ws` becomes NULL and every method raises ClosedError. Attributes may be set
 * on it freely (it has a __dict__) to keep per-connection state.
 */
typedef struct {
    PyObject_HEAD shmipc_ws *ws;
    PyObject *request; /* the upgrade Request */
    PyObject *dict;
    PyObject *weakreflist;
    int close_code; /* the code on_close got, 0 before */
} WebSocketObject;

typedef struct {
    ServerObject *server; /* borrowed, as for routes */
    PyObject *on_open;    /* borrowed from server->handlers; NULL when not given */
    PyObject *on_message;
    PyObject *on_close;
    PyTypeObject *type; /* borrowed: the module state keeps it */
} ws_ctx;

static WebSocketObject *ws_usable(WebSocketObject *self)
{
    if (self->ws == NULL) {
        shmipcpy_raise_closed(shmipcpy_state_of_type(Py_TYPE(self)), "websocket");
        return NULL;
    }
    return self;
}

/* Logs the exception set on this thread as raised by callback `cb` of `w`'s route. */
static void ws_log(ws_ctx *ctx, WebSocketObject *w, const char *cb)
{
    char what[160];
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb); /* no Python call while an exception is set */
    PyObject *path = w && w->request ? PyObject_GetAttrString(w->request, "path") : NULL;
    const char *p = path && PyUnicode_Check(path) ? PyUnicode_AsUTF8(path) : NULL;
    PyErr_Clear(); /* a failure here only loses the path in the message */
    PyOS_snprintf(what, sizeof what, "websocket %s for %.100s", cb, p ? p : "?");
    Py_XDECREF(path);
    PyErr_Restore(type, value, tb);
    log_exception(ctx->server, what);
}

static int ws_open_call(shmipc_ws *ws, const shmipc_http_request *req, void *user_data)
{
    ws_ctx *ctx = user_data;
    PyGILState_STATE g = gil_enter();
    int rc = -1;
    in_callback = 1;
    WebSocketObject *w = PyObject_GC_New(WebSocketObject, ctx->type);
    if (w == NULL)
        goto fail;
    w->ws = ws;
    w->dict = NULL;
    w->weakreflist = NULL;
    w->close_code = 0;
    w->request = make_request(ctx->server, req);
    PyObject_GC_Track(w);
    if (w->request == NULL)
        goto fail;
    if (ctx->on_open != NULL) {
        PyObject *r = PyObject_CallFunctionObjArgs(ctx->on_open, (PyObject *)w, w->request, NULL);
        if (r == NULL)
            goto fail;
        int refused = r == Py_False;
        Py_DECREF(r);
        if (refused) {
            w->ws = NULL;
            Py_DECREF(w);
            goto out;
        }
    }
    shmipc_ws_set_data(ws, w); /* the connection's reference, dropped after on_close */
    rc = 0;
    goto out;
fail:
    ws_log(ctx, w, "on_open");
    if (w != NULL) {
        w->ws = NULL;
        Py_DECREF(w);
    }
out:
    in_callback = 0;
    PyGILState_Release(g);
    return rc;
}

static void ws_message_call(shmipc_ws *ws, int kind, const void *data, size_t len, void *user_data)
{
    ws_ctx *ctx = user_data;
    PyGILState_STATE g = gil_enter();
    WebSocketObject *w = shmipc_ws_data(ws);
    if (w == NULL) { /* refused or already closed: nothing to call */
        PyGILState_Release(g);
        return;
    }
    in_callback = 1;
    PyObject *msg = kind == SHMIPC_WS_TEXT ? PyUnicode_DecodeUTF8(data, (Py_ssize_t)len, "strict")
                                           : PyBytes_FromStringAndSize(data, (Py_ssize_t)len);
    PyObject *r =
        msg ? PyObject_CallFunctionObjArgs(ctx->on_message, (PyObject *)w, msg, NULL) : NULL;
    if (r == NULL) {
        /* As a handler's 500: logged, and this connection closed with 1011. */
        ws_log(ctx, w, "on_message");
        shmipc_ws_close(ws, 1011, "internal error");
    }
    Py_XDECREF(r);
    Py_XDECREF(msg);
    in_callback = 0;
    PyGILState_Release(g);
}

static void ws_close_call(shmipc_ws *ws, int code, const char *reason, size_t reason_len,
                          void *user_data)
{
    ws_ctx *ctx = user_data;
    PyGILState_STATE g = gil_enter();
    WebSocketObject *w = shmipc_ws_data(ws);
    if (w == NULL) {
        PyGILState_Release(g);
        return;
    }
    in_callback = 1;
    w->close_code = code;
    if (ctx->on_close != NULL) {
        PyObject *text =
            PyUnicode_DecodeUTF8(reason ? reason : "", (Py_ssize_t)reason_len, "replace");
        PyObject *r =
            text ? PyObject_CallFunction(ctx->on_close, "OiO", (PyObject *)w, code, text) : NULL;
        if (r == NULL)
            ws_log(ctx, w, "on_close");
        Py_XDECREF(r);
        Py_XDECREF(text);
    }
    w->ws = NULL;
    shmipc_ws_set_data(ws, NULL);
    Py_DECREF(w);
    in_callback = 0;
    PyGILState_Release(g);
}

static PyObject *ws_send(WebSocketObject *self, PyObject *data)
{
    if (ws_usable(self) == NULL)
        return NULL;
    int rc;
    if (PyUnicode_Check(data)) {
        Py_ssize_t len;
        const char *text = PyUnicode_AsUTF8AndSize(data, &len);
        if (text == NULL)
            return NULL;
        rc = shmipc_ws_send(self->ws, SHMIPC_WS_TEXT, text, (size_t)len);
    } else {
        Py_buffer view;
        if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
            return NULL;
        rc = shmipc_ws_send(self->ws, SHMIPC_WS_BINARY, view.buf, (size_t)view.len);
        PyBuffer_Release(&view);
    }
    if (rc < 0)
        return shmipcpy_raise_last(shmipcpy_state_of_type(Py_TYPE(self)), rc);
    Py_RETURN_NONE;
}

static PyObject *ws_ping(WebSocketObject *self, PyObject *args)
{
    Py_buffer view = {0};
    if (ws_usable(self) == NULL || !PyArg_ParseTuple(args, "|y*:ping", &view))
        return NULL;
    int rc = shmipc_ws_ping(self->ws, view.buf, (size_t)view.len);
    PyBuffer_Release(&view); /* a no-op when no data was given */
    if (rc < 0)
        return shmipcpy_raise_last(shmipcpy_state_of_type(Py_TYPE(self)), rc);
    Py_RETURN_NONE;
}

static PyObject *ws_close(WebSocketObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"code", "reason", NULL};
    int code = 1000;
    const char *reason = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|iz:close", kwlist, &code, &reason) ||
        ws_usable(self) == NULL)
        return NULL;
    int rc = shmipc_ws_close(self->ws, code, reason);
    if (rc < 0)
        return shmipcpy_raise_last(shmipcpy_state_of_type(Py_TYPE(self)), rc);
    Py_RETURN_NONE;
}

static PyObject *ws_get_subprotocol(WebSocketObject *self, void *closure)
{
    (void)closure;
    if (ws_usable(self) == NULL)
        return NULL;
    const char *p = shmipc_ws_subprotocol(self->ws);
    if (p == NULL)
        Py_RETURN_NONE;
    return PyUnicode_FromString(p);
}

static PyObject *ws_get_request(WebSocketObject *self, void *closure)
{
    (void)closure;
    return Py_NewRef(self->request ? self->request : Py_None);
}

static PyObject *ws_get_closed(WebSocketObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->ws == NULL);
}

static PyObject *ws_get_close_code(WebSocketObject *self, void *closure)
{
    (void)closure;
    if (self->close_code == 0)
        Py_RETURN_NONE;
    return PyLong_FromLong(self->close_code);
}

static PyObject *ws_repr(WebSocketObject *self)
{
    PyObject *path = self->request ? PyObject_GetAttrString(self->request, "path") : NULL;
    if (path == NULL) {
        PyErr_Clear();
        path = PyUnicode_FromString("?");
        if (path == NULL)
            return NULL;
    }
    PyObject *r = PyUnicode_FromFormat("<shmipc.WebSocket %U%s>", path, self->ws ? "" : " closed");
    Py_DECREF(path);
    return r;
}

static int ws_traverse(WebSocketObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->request);
    Py_VISIT(self->dict);
    return 0;
}

static int ws_clear(WebSocketObject *self)
{
    Py_CLEAR(self->request);
    Py_CLEAR(self->dict);
    return 0;
}

static void ws_dealloc(WebSocketObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    ws_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyObject *ws_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    (void)args;
    (void)kwargs;
    PyErr_Format(PyExc_TypeError, "cannot create '%s' instances (Server.websocket() does)",
                 type->tp_name);
    return NULL;
}

static PyMethodDef ws_methods[] = {
    {"send", (PyCFunction)ws_send, METH_O,
     "send(data) -> None\n\n"
     "Queue one message: a str is sent as a text message, bytes-like as a binary one.\n"
     "Never blocks; shmipc.Error SHMIPC_EAGAIN when the send queue is full (a client that\n"
     "does not read), SHMIPC_EPIPE once closing. Only from this connection's callbacks."},
    {"ping", (PyCFunction)ws_ping, METH_VARARGS,
     "ping(data=b'') -> None\n\nQueue a ping with up to 125 bytes of payload."},
    {"close", (PyCFunction)(void (*)(void))ws_close, METH_VARARGS | METH_KEYWORDS,
     "close(code=1000, reason=None) -> None\n\n"
     "Start the close handshake (code 1000..4999, reason at most 123 UTF-8 bytes);\n"
     "on_close follows."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ws_getset[] = {
    {"subprotocol", (getter)ws_get_subprotocol, NULL,
     "The subprotocol chosen at the upgrade, or None.", NULL},
    {"request", (getter)ws_get_request, NULL, "The upgrade request (a shmipc.Request).", NULL},
    {"closed", (getter)ws_get_closed, NULL,
     "True once on_close returned (then every method raises ClosedError).", NULL},
    {"close_code", (getter)ws_get_close_code, NULL,
     "The code on_close got (1005: none sent, 1006: dropped), None before.", NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef ws_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(WebSocketObject, weakreflist), READONLY, NULL},
    {"__dictoffset__", T_PYSSIZET, offsetof(WebSocketObject, dict), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot ws_slots[] = {
    {Py_tp_new, ws_new},
    {Py_tp_dealloc, ws_dealloc},
    {Py_tp_traverse, ws_traverse},
    {Py_tp_clear, ws_clear},
    {Py_tp_repr, ws_repr},
    {Py_tp_methods, ws_methods},
    {Py_tp_getset, ws_getset},
    {Py_tp_members, ws_members},
    {Py_tp_doc,
     "One WebSocket connection, passed to the callbacks of Server.websocket(). Valid until\n"
     "on_close returns; afterwards every method raises ClosedError. Set any attribute on it\n"
     "to keep per-connection state. Its methods are for its own callbacks (they run on the\n"
     "connection's worker thread); from another thread they raise shmipc.Error SHMIPC_EBUSY."},
    {0, NULL},
};

PyType_Spec shmipcpy_websocket_spec = {
    .name = "shmipc.WebSocket",
    .basicsize = sizeof(WebSocketObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = ws_slots,
};

static void ws_ctx_free(void *user_data)
{
    PyMem_RawFree(user_data);
}

static int optional_callable(PyObject **f, const char *name)
{
    if (*f == Py_None)
        *f = NULL;
    if (*f != NULL && !PyCallable_Check(*f)) {
        PyErr_Format(PyExc_TypeError, "websocket: %s must be callable or None", name);
        return -1;
    }
    return 0;
}

/* Registers a WebSocket route; returns on_message (new reference), so decorators work. */
static PyObject *add_websocket(ServerObject *self, PyObject *path, PyObject *on_message,
                               PyObject *on_open, PyObject *on_close, PyObject *subprotocols)
{
    module_state *ms = server_state(self);
    shmipc_server *s = server_usable(self);
    PyObject *protos = NULL;
    const char *p, *sp = NULL;
    if (s == NULL || optional_callable(&on_open, "on_open") < 0 ||
        optional_callable(&on_close, "on_close") < 0)
        return NULL;
    if (!PyCallable_Check(on_message)) {
        PyErr_SetString(PyExc_TypeError, "websocket: on_message must be callable");
        return NULL;
    }
    if ((p = PyUnicode_AsUTF8(path)) == NULL)
        return NULL;
    if (subprotocols != NULL && subprotocols != Py_None) {
        /* A list of names (or one comma-separated str) becomes the C list. */
        if (PyUnicode_Check(subprotocols)) {
            protos = Py_NewRef(subprotocols);
        } else {
            PyObject *sep = PyUnicode_FromString(",");
            protos = sep ? PyUnicode_Join(sep, subprotocols) : NULL;
            Py_XDECREF(sep);
        }
        if (protos == NULL || (sp = PyUnicode_AsUTF8(protos)) == NULL) {
            Py_XDECREF(protos);
            return NULL;
        }
    }
    ws_ctx *ctx = PyMem_RawMalloc(sizeof *ctx);
    if (ctx == NULL) {
        Py_XDECREF(protos);
        return PyErr_NoMemory();
    }
    *ctx = (ws_ctx){self, on_open, on_message, on_close, ms->websocket_type};
    PyObject *keep =
        PyTuple_Pack(3, on_message, on_open ? on_open : Py_None, on_close ? on_close : Py_None);
    if (keep == NULL || PyList_Append(self->handlers, keep) < 0) {
        Py_XDECREF(keep);
        Py_XDECREF(protos);
        PyMem_RawFree(ctx);
        return NULL;
    }
    Py_DECREF(keep);
    int rc = shmipc_server_websocket(s, p, sp, ws_open_call, ws_message_call, ws_close_call, ctx,
                                     ws_ctx_free);
    Py_XDECREF(protos);
    if (rc < 0)
        return shmipcpy_raise_last(ms, rc);
    return Py_NewRef(on_message);
}

static PyObject *ws_decorator(PyObject *bound, PyObject *on_message)
{
    /* bound is (server, path, on_open, on_close, subprotocols). */
    return add_websocket((ServerObject *)PyTuple_GET_ITEM(bound, 0), PyTuple_GET_ITEM(bound, 1),
                         on_message, PyTuple_GET_ITEM(bound, 2), PyTuple_GET_ITEM(bound, 3),
                         PyTuple_GET_ITEM(bound, 4));
}

static PyMethodDef ws_decorator_def = {
    "websocket_decorator", (PyCFunction)ws_decorator, METH_O,
    "Registers the decorated function as the WebSocket route's on_message and returns it."};

static PyObject *server_websocket(ServerObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"path", "on_message", "on_open", "on_close", "subprotocols", NULL};
    PyObject *path, *on_message = Py_None, *on_open = Py_None, *on_close = Py_None,
                    *subprotocols = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "U|O$OOO:websocket", kwlist, &path, &on_message,
                                     &on_open, &on_close, &subprotocols))
        return NULL;
    if (on_message != Py_None)
        return add_websocket(self, path, on_message, on_open, on_close, subprotocols);
    if (server_usable(self) == NULL)
        return NULL;
    PyObject *bound = PyTuple_Pack(5, (PyObject *)self, path, on_open, on_close, subprotocols);
    if (bound == NULL)
        return NULL;
    PyObject *deco = PyCFunction_New(&ws_decorator_def, bound);
    Py_DECREF(bound);
    return deco;
}

/* ---------------------------------------------------------------------------------------- */
/* Server methods                                                                           */
/* ---------------------------------------------------------------------------------------- */

static const char *const backend_names[] = {"default", "auto", "io_uring", "epoll",
                                            "epoll_oneshot"};

static int config_limit(module_state *ms, shmipc_server_config *cfg, PyObject *v, int which,
                        const char *field)
{
    if (v == NULL || v == Py_None)
        return 0;
    unsigned long long n = PyLong_AsUnsignedLongLong(v);
    if (n == (unsigned long long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            shmipcpy_raise_invalid(ms, field, "out of range");
        }
        return -1;
    }
    int rc = shmipc_server_config_set_limit(cfg, which, n);
    if (rc < 0) {
        shmipcpy_raise_last(ms, rc);
        return -1;
    }
    return 0;
}

static int config_timeout(module_state *ms, shmipc_server_config *cfg, PyObject *v, int which,
                          const char *field)
{
    int64_t ms_value;
    if (v == NULL || v == Py_None)
        return 0;
    /* 0 is a value of its own for these: no stop wait, no WebSocket pings, no idle limit. */
    int allow_zero = which == SHMIPC_SERVER_TIMEOUT_STOP ||
                     which == SHMIPC_SERVER_TIMEOUT_WS_PING ||
                     which == SHMIPC_SERVER_TIMEOUT_WS_IDLE;
    if (shmipcpy_timeout_arg(ms, v, field, allow_zero, &ms_value) < 0)
        return -1;
    int rc = shmipc_server_config_set_timeout_ms(cfg, which, (uint32_t)ms_value);
    if (rc < 0) {
        shmipcpy_raise_last(ms, rc);
        return -1;
    }
    return 0;
}

static int build_config(module_state *ms, PyObject *args, PyObject *kwargs,
                        shmipc_server_config *cfg)
{
    static char *kwlist[] = {"address",
                             "port",
                             "workers",
                             "backend",
                             "header_timeout",
                             "keepalive_timeout",
                             "stop_timeout",
                             "max_request_line",
                             "max_head_bytes",
                             "max_headers",
                             "max_body",
                             "pipeline",
                             "server_name",
                             "max_ws_message",
                             "ws_ping_timeout",
                             "ws_idle_timeout",
                             "ws_send_high_water",
                             "ws_send_limit",
                             "reuse_port",
                             NULL};
    const char *address = NULL;
    int port = -1, rc;
    PyObject *workers = Py_None, *backend = Py_None, *header_to = NULL, *keepalive_to = NULL,
             *stop_to = NULL, *line = NULL, *head = NULL, *nheaders = NULL, *body = NULL,
             *pipeline = NULL, *name = NULL, *ws_message = NULL, *ws_ping = NULL, *ws_idle = NULL,
             *ws_high = NULL, *ws_limit = NULL, *reuse = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|zi$OOOOOOOOOOOOOOOOO:Server", kwlist, &address,
                                     &port, &workers, &backend, &header_to, &keepalive_to, &stop_to,
                                     &line, &head, &nheaders, &body, &pipeline, &name, &ws_message,
                                     &ws_ping, &ws_idle, &ws_high, &ws_limit, &reuse))
        return -1;
    if (address != NULL && (rc = shmipc_server_config_set_address(cfg, address)) < 0)
        goto fail;
    if (port != -1 && (rc = shmipc_server_config_set_port(cfg, port)) < 0)
        goto fail;
    if (workers != Py_None) {
        long n = PyLong_AsLong(workers);
        if (n == -1 && PyErr_Occurred())
            return -1;
        if (n < 1 || n > 1024) {
            shmipcpy_raise_invalid(ms, "workers", "must be 1..1024, or None for the default");
            return -1;
        }
        if ((rc = shmipc_server_config_set_workers(cfg, (unsigned)n)) < 0)
            goto fail;
    }
    if (backend != Py_None) {
        const char *b = PyUnicode_Check(backend) ? PyUnicode_AsUTF8(backend) : NULL;
        int which = -1;
        for (int i = 0; b != NULL && i < 5; i++)
            if (strcmp(b, backend_names[i]) == 0)
                which = i;
        if (which < 0) {
            if (!PyErr_Occurred())
                shmipcpy_raise_invalid(ms, "backend",
                                       "must be 'auto', 'io_uring', 'epoll', 'epoll_oneshot', "
                                       "'default' or None");
            return -1;
        }
        if ((rc = shmipc_server_config_set_backend(cfg, which)) < 0)
            goto fail;
    }
    if (config_timeout(ms, cfg, header_to, SHMIPC_SERVER_TIMEOUT_HEADER, "header_timeout") < 0 ||
        config_timeout(ms, cfg, keepalive_to, SHMIPC_SERVER_TIMEOUT_KEEPALIVE,
                       "keepalive_timeout") < 0 ||
        config_timeout(ms, cfg, stop_to, SHMIPC_SERVER_TIMEOUT_STOP, "stop_timeout") < 0 ||
        config_limit(ms, cfg, line, SHMIPC_SERVER_LIMIT_REQUEST_LINE, "max_request_line") < 0 ||
        config_limit(ms, cfg, head, SHMIPC_SERVER_LIMIT_HEAD_BYTES, "max_head_bytes") < 0 ||
        config_limit(ms, cfg, nheaders, SHMIPC_SERVER_LIMIT_HEADERS, "max_headers") < 0 ||
        config_limit(ms, cfg, body, SHMIPC_SERVER_LIMIT_BODY, "max_body") < 0 ||
        config_limit(ms, cfg, pipeline, SHMIPC_SERVER_LIMIT_PIPELINE, "pipeline") < 0 ||
        config_limit(ms, cfg, ws_message, SHMIPC_SERVER_LIMIT_WS_MESSAGE, "max_ws_message") < 0 ||
        config_timeout(ms, cfg, ws_ping, SHMIPC_SERVER_TIMEOUT_WS_PING, "ws_ping_timeout") < 0 ||
        config_timeout(ms, cfg, ws_idle, SHMIPC_SERVER_TIMEOUT_WS_IDLE, "ws_idle_timeout") < 0 ||
        /* The high-water mark first: each is checked against the other as it would resolve,
         * so a small limit beside the default 1 MiB mark would be refused. */
        config_limit(ms, cfg, ws_high, SHMIPC_SERVER_LIMIT_WS_SEND_HIGH_WATER,
                     "ws_send_high_water") < 0 ||
        config_limit(ms, cfg, ws_limit, SHMIPC_SERVER_LIMIT_WS_SEND_LIMIT, "ws_send_limit") < 0)
        return -1;
    if (reuse != Py_None) {
        if (!PyBool_Check(reuse)) {
            shmipcpy_raise_invalid(ms, "reuse_port", "must be True, False or None");
            return -1;
        }
        if ((rc = shmipc_server_config_set_reuse_port(cfg, reuse == Py_True)) < 0)
            goto fail;
    }
    if (name != NULL) {
        const char *n = NULL;
        if (name != Py_None && (n = PyUnicode_AsUTF8(name)) == NULL)
            return -1;
        if ((rc = shmipc_server_config_set_server_name(cfg, n)) < 0)
            goto fail;
    }
    return 0;
fail:
    shmipcpy_raise_last(ms, rc);
    return -1;
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
    if ((rc = shmipc_server_config_new(&cfg)) < 0) {
        shmipcpy_raise_last(ms, rc);
        goto fail;
    }
    if (build_config(ms, args, kwargs, cfg) < 0)
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

static void server_dealloc(ServerObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    if (self->s != NULL) {
        if (in_callback) {
            /* The last reference went inside a handler: freeing here would join this very
             * worker. Stop it and leave the C server (and its handlers) behind. */
            shmipc_server_stop(self->s);
            PyErr_WarnEx(PyExc_ResourceWarning,
                         "shmipc.Server dropped inside its own handler; close() it instead", 1);
            self->handlers = NULL;
            self->request = self->normalize = self->log_error = NULL;
        } else {
            server_free_now(self);
        }
    }
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
    module_state *ms = server_state(self);
    shmipc_server *s = server_usable(self);
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
    if (PyList_Append(self->handlers, handler) < 0) {
        PyMem_RawFree(ctx);
        return NULL;
    }
    /* On failure the C call frees ctx through route_ctx_free; the handler stays listed,
     * which only keeps it alive a little longer. */
    int rc = shmipc_server_route(s, m, p, route_call, ctx, route_ctx_free);
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
    if (server_usable(self) == NULL)
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
    shmipc_server *s = server_usable(self);
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
            return shmipcpy_raise_last(server_state(self), rc);
        Py_RETURN_NONE;
    }
    if (PyObject_GetBuffer(body, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int rc = shmipc_server_static(s, method, path, status, ctype, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    if (rc < 0)
        return shmipcpy_raise_last(server_state(self), rc);
    Py_RETURN_NONE;
}

static PyObject *server_start(ServerObject *self, PyObject *unused)
{
    (void)unused;
    shmipc_server *s = server_usable(self);
    int rc;
    if (s == NULL)
        return NULL;
    if (self->started)
        Py_RETURN_NONE;
    if (self->starting || self->running)
        return shmipcpy_raise_busy("server");
    if (in_callback) {
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
        return shmipcpy_raise_last(server_state(self), rc);
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
    shmipc_server *s = server_usable(self);
    int rc = 0, interrupted = 0;
    if (s == NULL)
        return NULL;
    if (self->starting || self->running)
        return shmipcpy_raise_busy("server");
    if (in_callback) {
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
        return shmipcpy_raise_last(server_state(self), rc);
    Py_RETURN_NONE;
}

static PyObject *server_stop(ServerObject *self, PyObject *unused)
{
    (void)unused;
    shmipc_server *s = self->s;
    if (s == NULL || self->close_pending)
        Py_RETURN_NONE;
    if (self->running || self->starting || in_callback) {
        /* run() returns (after its graceful stop) when it sees the flag. */
        self->stop_flag = 1;
        if (in_callback && !self->running)
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
        return shmipcpy_raise_last(server_state(self), rc);
    Py_RETURN_NONE;
}

static PyObject *server_close(ServerObject *self, PyObject *unused)
{
    (void)unused;
    if (self->s == NULL)
        Py_RETURN_NONE;
    if (self->busy > 0 || in_callback) {
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
    if (server_usable(self) == NULL)
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
    shmipc_server *s = server_usable(self);
    if (s == NULL)
        return NULL;
    if (!self->started) {
        PyErr_SetString(PyExc_RuntimeError, "Server.port: the server is not running");
        return NULL;
    }
    int port = shmipc_server_port(s);
    if (port < 0)
        return shmipcpy_raise_last(server_state(self), port);
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
    {"websocket", (PyCFunction)(void (*)(void))server_websocket, METH_VARARGS | METH_KEYWORDS,
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
     "limits are counts of bytes (pipeline: requests per turn); None keeps the default.\n"
     "server_name: the Server header (None or '' removes it).\n"
     "reuse_port: True shares the port with another server already listening there\n"
     "(SO_REUSEPORT); False or None (SHMIPC_HTTP_REUSEPORT decides, default 0) makes start()\n"
     "raise shmipc.Error with errno EADDRINUSE when any socket listens on the port.\n"
     "WebSocket: max_ws_message (bytes of a message; close 1009 above it), ws_ping_timeout\n"
     "(a ping after this many seconds of silence), ws_idle_timeout (fail the connection,\n"
     "1006, after this much silence; above ws_ping_timeout), with 0 or None meaning never;\n"
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
