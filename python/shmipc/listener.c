/*
 * listener.c - shmipc.Listener: the server side that accepts sessions, and serve(), the C
 * listener's loop calling Python callables (on_stream, on_data) on the serving thread. Closing
 * under a running call follows the rule at the top of session.c (busy / close_pending).
 *
 * Owns: the Listener type and the serve loop's context.
 * May call: the public C API (shmipc_listener_*), module.h's helpers, session.c's Session wrapper
 * and sliced accept, and stream.c's wrap.
 */
#include "module.h"

#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Listener                                                                                 */
/* ---------------------------------------------------------------------------------------- */

static module_state *listener_state(ListenerObject *self)
{
    return shmipcpy_state_of_type(Py_TYPE(self));
}

static shmipc_listener *listener_usable(ListenerObject *self)
{
    if (self->l == NULL || self->close_pending) {
        shmipcpy_raise_closed(listener_state(self), "listener");
        return NULL;
    }
    return self->l;
}

static void listener_settle(ListenerObject *self)
{
    if (self->busy > 0 || !self->close_pending)
        return;
    self->close_pending = 0;
    shmipc_listener *l = self->l;
    self->l = NULL;
    if (!shmipcpy_forked(self->pid))
        shmipc_listener_close(l);
}

static PyObject *listener_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"address", "config", NULL};
    module_state *ms = shmipcpy_state_of_type(type);
    PyObject *address;
    PyObject *cfg_obj = Py_None;
    shmipc_config *cfg;
    shmipc_listener *l;
    if (ms == NULL ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "U|O:Listener", kwlist, &address, &cfg_obj))
        return NULL;
    Py_ssize_t addr_len;
    const char *addr = PyUnicode_AsUTF8AndSize(address, &addr_len);
    if (addr == NULL)
        return NULL;
    if (strlen(addr) != (size_t)addr_len) { /* C would listen on the part before the NUL */
        PyErr_SetString(PyExc_ValueError, "Listener: embedded null character in address");
        return NULL;
    }
    if (shmipcpy_config_arg(ms, cfg_obj, &cfg) < 0)
        return NULL;
    ListenerObject *self = (ListenerObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        shmipc_config_free(cfg);
        return NULL;
    }
    self->pid = shmipcpy_pid;
    shmipcpy_config_timeouts(cfg, &self->read_ms, &self->write_ms, &self->memory_wait);
    int rc = shmipc_listener_new(addr, cfg, &l);
    shmipc_config_free(cfg);
    if (rc < 0) {
        Py_DECREF(self);
        return shmipcpy_raise_last(ms, rc);
    }
    self->l = l;
    self->address = Py_NewRef(address);
    return (PyObject *)self;
}

static int listener_accept_call(void *handle, int timeout_ms, void **out)
{
    return shmipc_listener_accept(handle, timeout_ms, (shmipc_session **)out);
}

static PyObject *listener_accept(ListenerObject *self, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames)
{
    module_state *ms = listener_state(self);
    PyObject *timeout = NULL;
    int nonblock;
    void *s = NULL;
    shmipc_listener *l;
    if (shmipcpy_parse_args("accept", args, nargs, kwnames, "timeout", &timeout, &nonblock) < 0 ||
        (l = listener_usable(self)) == NULL)
        return NULL;
    int rc = shmipcpy_sliced_accept(ms, listener_accept_call, l, &self->busy, &self->close_pending,
                                    timeout, nonblock, "accept", &s);
    if (rc == ACCEPT_CLOSED_GOT || rc == ACCEPT_CLOSED || rc == ACCEPT_RAISED) {
        if (rc == ACCEPT_CLOSED_GOT)
            shmipc_session_close(s);
        listener_settle(self); /* a close() that came during the wait */
        return rc == ACCEPT_RAISED ? NULL : shmipcpy_raise_closed(ms, "listener");
    }
    if (rc == SHMIPC_EAGAIN && nonblock)
        Py_RETURN_NONE;
    if (rc < 0)
        return shmipcpy_raise_last(ms, rc);
    return shmipcpy_session_wrap(ms, s, 1, self->read_ms, self->write_ms, self->memory_wait);
}

static PyObject *listener_fileno(ListenerObject *self, PyObject *unused)
{
    (void)unused;
    shmipc_listener *l = listener_usable(self);
    if (l == NULL)
        return NULL;
    return PyLong_FromLong(shmipc_listener_fileno(l));
}

static PyObject *listener_stop(ListenerObject *self, PyObject *unused)
{
    (void)unused;
    if (self->l != NULL) {
        int rc = shmipc_listener_stop(self->l);
        if (rc < 0)
            return shmipcpy_raise_last(listener_state(self), rc);
    }
    Py_RETURN_NONE;
}

/*
 * Wakes a blocked accept() or serve() (ClosedError) and keeps the handle. With the GIL held:
 * no other Python thread can close the handle meanwhile.
 */
static PyObject *listener_shutdown(ListenerObject *self, PyObject *unused)
{
    (void)unused;
    if (self->l != NULL && !self->close_pending)
        shmipc_listener_shutdown(self->l);
    Py_RETURN_NONE;
}

static PyObject *listener_close(ListenerObject *self, PyObject *unused)
{
    (void)unused;
    if (self->l != NULL && shmipcpy_forked(self->pid)) {
        /* A fork child: forget it (module.h); the socket file stays the parent's. */
        self->l = NULL;
        self->close_pending = 0;
        Py_RETURN_NONE;
    }
    if (self->l == NULL || self->close_pending)
        Py_RETURN_NONE;
    if (self->busy) {
        /* serve() or accept() is running: wake it now; the last one out closes. */
        self->close_pending = 1;
        shmipc_listener_shutdown(self->l);
        Py_RETURN_NONE;
    }
    shmipc_listener *l = self->l;
    self->l = NULL;
    shmipc_listener_close(l);
    Py_RETURN_NONE;
}

/*
 * serve(): the C loop runs with the GIL released; each callback takes the GIL back on the
 * serving thread (the thread state saved when serve began), calls the Python callable, and
 * releases it again. The Streams handed to on_stream are kept in `streams` (keyed by handle
 * address) so that on_data can pass the same object; closed ones are swept out as the dict
 * grows, and the dict is dropped when serve returns.
 */
typedef struct {
    ListenerObject *self;
    module_state *ms;
    PyObject *on_stream;
    PyObject *on_data;
    PyObject *streams;
    Py_ssize_t sweep_at;
    PyThreadState *ts;
    int failed;
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc;
#else
    PyObject *exc_type, *exc_value, *exc_tb;
#endif
} serve_ctx;

/* A callback raised: remember the exception, stop serving, ignore later callbacks. */
static void serve_fail(serve_ctx *c)
{
    c->failed = 1;
#if PY_VERSION_HEX >= 0x030C0000
    c->exc = PyErr_GetRaisedException();
#else
    PyErr_Fetch(&c->exc_type, &c->exc_value, &c->exc_tb);
#endif
    shmipc_listener_stop(c->self->l);
}

static void serve_sweep(serve_ctx *c)
{
    PyObject *key, *value, *dead = PyList_New(0);
    Py_ssize_t pos = 0;
    if (dead == NULL) {
        PyErr_Clear();
        return;
    }
    while (PyDict_Next(c->streams, &pos, &key, &value))
        if (((StreamObject *)value)->st == NULL && PyList_Append(dead, key) < 0)
            PyErr_Clear();
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(dead); i++)
        if (PyDict_DelItem(c->streams, PyList_GET_ITEM(dead, i)) < 0)
            PyErr_Clear();
    Py_DECREF(dead);
    c->sweep_at = 2 * PyDict_GET_SIZE(c->streams) + 64;
}

static void serve_on_stream(shmipc_stream *h, void *user_data)
{
    serve_ctx *c = user_data;
    if (c->failed) {
        shmipc_stream_close(h);
        return;
    }
    PyEval_RestoreThread(c->ts);
    PyObject *stream = shmipcpy_stream_wrap(c->ms, h, (PyObject *)c->self, c->self->read_ms,
                                            c->self->write_ms, c->self->memory_wait);
    PyObject *key = stream ? PyLong_FromVoidPtr(h) : NULL;
    PyObject *r = NULL;
    if (key != NULL && PyDict_SetItem(c->streams, key, stream) == 0)
        r = PyObject_CallOneArg(c->on_stream, stream);
    if (r == NULL || PyErr_CheckSignals() < 0)
        serve_fail(c);
    Py_XDECREF(r);
    Py_XDECREF(key);
    Py_XDECREF(stream);
    if (!c->failed && PyDict_GET_SIZE(c->streams) > c->sweep_at)
        serve_sweep(c);
    c->ts = PyEval_SaveThread();
}

static void serve_on_data(shmipc_stream *h, void *user_data)
{
    serve_ctx *c = user_data;
    if (c->failed)
        return;
    PyEval_RestoreThread(c->ts);
    PyObject *key = PyLong_FromVoidPtr(h);
    PyObject *stream = key ? PyDict_GetItemWithError(c->streams, key) : NULL;
    Py_XDECREF(key);
    if (stream == NULL) {
        /* A stream that was closed (or never handed out): nothing to tell. */
        if (PyErr_Occurred())
            serve_fail(c);
    } else if (((StreamObject *)stream)->st == h && c->on_data != Py_None) {
        Py_INCREF(stream);
        PyObject *r = PyObject_CallOneArg(c->on_data, stream);
        Py_DECREF(stream);
        if (r == NULL)
            serve_fail(c);
        Py_XDECREF(r);
    }
    if (!c->failed && PyErr_CheckSignals() < 0)
        serve_fail(c);
    c->ts = PyEval_SaveThread();
}

static PyObject *listener_serve(ListenerObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"on_stream", "on_data", NULL};
    serve_ctx c = {.self = self, .ms = listener_state(self), .on_data = Py_None, .sweep_at = 64};
    shmipc_listener *l;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:serve", kwlist, &c.on_stream, &c.on_data))
        return NULL;
    if (!PyCallable_Check(c.on_stream) || (c.on_data != Py_None && !PyCallable_Check(c.on_data))) {
        PyErr_SetString(PyExc_TypeError, "serve: on_stream and on_data must be callable");
        return NULL;
    }
    if ((l = listener_usable(self)) == NULL || (c.streams = PyDict_New()) == NULL)
        return NULL;
    Py_INCREF(c.on_stream);
    Py_INCREF(c.on_data);
    self->busy++;
    c.ts = PyEval_SaveThread();
    int rc = shmipc_listener_serve(l, serve_on_stream, serve_on_data, &c, NULL);
    PyEval_RestoreThread(c.ts);
    self->busy--;
    /* A close() from another thread ends serve as stop() does; a shutdown() raises. */
    int by_close = self->close_pending;
    listener_settle(self);
    /* Streams the callbacks kept stay valid handles (that fail with ClosedError). */
    Py_DECREF(c.streams);
    Py_DECREF(c.on_stream);
    Py_DECREF(c.on_data);
    if (c.failed) {
#if PY_VERSION_HEX >= 0x030C0000
        PyErr_SetRaisedException(c.exc);
#else
        PyErr_Restore(c.exc_type, c.exc_value, c.exc_tb);
#endif
        return NULL;
    }
    if (rc < 0 && !(rc == SHMIPC_ECLOSED && by_close))
        return shmipcpy_raise_last(c.ms, rc);
    Py_RETURN_NONE;
}

static void listener_dealloc(ListenerObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->l != NULL && !shmipcpy_forked(self->pid))
        shmipc_listener_close(self->l);
    Py_XDECREF(self->address);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyObject *listener_enter(ListenerObject *self, PyObject *unused)
{
    (void)unused;
    if (listener_usable(self) == NULL)
        return NULL;
    return Py_NewRef(self);
}

static PyObject *listener_exit(ListenerObject *self, PyObject *args)
{
    (void)args;
    return listener_close(self, NULL);
}

static PyObject *listener_get_closed(ListenerObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->l == NULL || self->close_pending);
}

static PyObject *listener_get_address(ListenerObject *self, void *closure)
{
    (void)closure;
    return Py_NewRef(self->address ? self->address : Py_None);
}

static PyObject *listener_repr(ListenerObject *self)
{
    return PyUnicode_FromFormat("<shmipc.Listener %R%s>", self->address ? self->address : Py_None,
                                self->l == NULL || self->close_pending ? " closed" : "");
}

static PyMethodDef listener_methods[] = {
    {"accept", (PyCFunction)(void (*)(void))listener_accept, METH_FASTCALL | METH_KEYWORDS,
     "accept(timeout=None, *, nonblock=False) -> Session | None\n\n"
     "Accept one client and run the server handshake (V2, V3 or V4, as the client asks).\n"
     "Waits up to timeout seconds (None or negative: forever; 0: just look) and raises "
     "TimeoutError;\n"
     "with nonblock=True returns None when no client is waiting. A client that fails its\n"
     "handshake is dropped. The GIL is released; Ctrl-C interrupts. Thread safe."},
    {"fileno", (PyCFunction)listener_fileno, METH_NOARGS,
     "fileno() -> int\n\nThe listening socket, readable when a client is waiting."},
    {"serve", (PyCFunction)(void (*)(void))listener_serve, METH_VARARGS | METH_KEYWORDS,
     "serve(on_stream, on_data=None) -> None\n\n"
     "Serve every client on the calling thread until stop(): on_stream(stream) gets each\n"
     "new Stream (you own it: close it when done), on_data(stream) is called when a stream\n"
     "may have data, was closed by the peer, or lost its session: read with nonblock=True\n"
     "until None (or end of stream). Spurious calls are possible. Both run on this thread\n"
     "with the GIL and should not block; the GIL is released between callbacks.\n\n"
     "An exception from a callback stops serving and is raised from serve(). When serve\n"
     "returns, its sessions are closed: Streams still held fail with ClosedError. Ctrl-C\n"
     "is noticed at the next callback; an idle serve() on the main thread cannot see it\n"
     "(run serve() on another thread and call stop() from the main one)."},
    {"stop", (PyCFunction)listener_stop, METH_NOARGS,
     "stop() -> None\n\n"
     "Make serve() return soon. Thread safe; may be called from a callback. A stop before\n"
     "serve() starts makes the next serve() return at once."},
    {"shutdown", (PyCFunction)listener_shutdown, METH_NOARGS,
     "shutdown() -> None\n\n"
     "End the listener but keep the object: an accept() or serve() blocked in another\n"
     "thread raises ClosedError at once, as do later ones. Any thread, any number of times."},
    {"close", (PyCFunction)listener_close, METH_NOARGS,
     "close() -> None\n\n"
     "Stop listening (a unix socket file is removed). From another thread while accept()\n"
     "or serve() runs: accept() raises ClosedError at once, serve() returns, and the\n"
     "listener is closed when the last of them leaves. Safe to call twice."},
    {"__enter__", (PyCFunction)listener_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)listener_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef listener_getset[] = {
    {"closed", (getter)listener_get_closed, NULL, "True after close().", NULL},
    {"address", (getter)listener_get_address, NULL, "The address given to Listener().", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot listener_slots[] = {
    {Py_tp_new, listener_new},
    {Py_tp_dealloc, listener_dealloc},
    {Py_tp_repr, listener_repr},
    {Py_tp_methods, listener_methods},
    {Py_tp_getset, listener_getset},
    {Py_tp_doc,
     "Listener(address, config=None)\n\n"
     "A server's listening socket ('unix:/path' files are created mode 0600; a stale one is\n"
     "replaced; 'unix:@name' is abstract). Accept clients one by one with accept(), or\n"
     "serve them all from one thread with serve(on_stream, on_data). Use it as a context\n"
     "manager, or call close()."},
    {0, NULL},
};

PyType_Spec shmipcpy_listener_spec = {
    .name = "shmipc.Listener",
    .basicsize = sizeof(ListenerObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = listener_slots,
};
