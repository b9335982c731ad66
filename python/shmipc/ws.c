/*
 * ws.c - shmipc.WebSocket and Server.websocket(): the WebSocket objects handed to the Python
 * on_open/on_message/on_close callbacks on the server's worker threads, their methods (send,
 * ping, close), and the registration of WebSocket routes.
 *
 * Owns: the WebSocket type, the C WebSocket callbacks and their context.
 * May call: the public C API (shmipc_ws_*, shmipc_server_websocket), module.h's helpers, server.c's
 * GIL helpers and request.c's Request builder.
 */
#include "module.h"

#include <structmember.h>

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
    shmipcpy_log_exception(ctx->server, what);
}

static int ws_open_call(shmipc_ws *ws, const shmipc_http_request *req, void *user_data)
{
    ws_ctx *ctx = user_data;
    PyGILState_STATE g = shmipcpy_gil_enter();
    int rc = -1;
    shmipcpy_in_callback = 1;
    WebSocketObject *w = PyObject_GC_New(WebSocketObject, ctx->type);
    if (w == NULL)
        goto fail;
    w->ws = ws;
    w->dict = NULL;
    w->weakreflist = NULL;
    w->close_code = 0;
    w->request = shmipcpy_make_request(ctx->server, req);
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
    shmipcpy_in_callback = 0;
    PyGILState_Release(g);
    return rc;
}

static void ws_message_call(shmipc_ws *ws, int kind, const void *data, size_t len, void *user_data)
{
    ws_ctx *ctx = user_data;
    PyGILState_STATE g = shmipcpy_gil_enter();
    WebSocketObject *w = shmipc_ws_data(ws);
    if (w == NULL) { /* refused or already closed: nothing to call */
        PyGILState_Release(g);
        return;
    }
    shmipcpy_in_callback = 1;
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
    shmipcpy_in_callback = 0;
    PyGILState_Release(g);
}

static void ws_close_call(shmipc_ws *ws, int code, const char *reason, size_t reason_len,
                          void *user_data)
{
    ws_ctx *ctx = user_data;
    PyGILState_STATE g = shmipcpy_gil_enter();
    WebSocketObject *w = shmipc_ws_data(ws);
    if (w == NULL) {
        PyGILState_Release(g);
        return;
    }
    shmipcpy_in_callback = 1;
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
    shmipcpy_in_callback = 0;
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
    module_state *ms = shmipcpy_server_state(self);
    shmipc_server *s = shmipcpy_server_usable(self);
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

PyObject *shmipcpy_server_websocket(ServerObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"path", "on_message", "on_open", "on_close", "subprotocols", NULL};
    PyObject *path, *on_message = Py_None, *on_open = Py_None, *on_close = Py_None,
                    *subprotocols = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "U|O$OOO:websocket", kwlist, &path, &on_message,
                                     &on_open, &on_close, &subprotocols))
        return NULL;
    if (on_message != Py_None)
        return add_websocket(self, path, on_message, on_open, on_close, subprotocols);
    if (shmipcpy_server_usable(self) == NULL)
        return NULL;
    PyObject *bound = PyTuple_Pack(5, (PyObject *)self, path, on_open, on_close, subprotocols);
    if (bound == NULL)
        return NULL;
    PyObject *deco = PyCFunction_New(&ws_decorator_def, bound);
    Py_DECREF(bound);
    return deco;
}
