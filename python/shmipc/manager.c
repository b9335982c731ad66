/*
 * manager.c - shmipc.SessionManager: a pool of client sessions to one address, handing out
 * streams (get_stream) and taking them back (put_back). Closing under a running call follows the
 * rule at the top of session.c (busy / close_pending).
 *
 * Owns: the SessionManager type.
 * May call: the public C API (shmipc_session_manager_*), module.h's helpers and stream.c's
 * wrap/detach.
 */
#include "module.h"

/* ---------------------------------------------------------------------------------------- */
/* SessionManager                                                                           */
/* ---------------------------------------------------------------------------------------- */

static module_state *manager_state(ManagerObject *self)
{
    return shmipcpy_state_of_type(Py_TYPE(self));
}

static shmipc_session_manager *manager_usable(ManagerObject *self)
{
    if (self->m == NULL || self->close_pending) {
        shmipcpy_raise_closed(manager_state(self), "session manager");
        return NULL;
    }
    return self->m;
}

static void manager_settle(ManagerObject *self)
{
    if (self->busy > 0 || !self->close_pending)
        return;
    self->close_pending = 0;
    shmipc_session_manager *m = self->m;
    self->m = NULL;
    if (!shmipcpy_forked(self->pid))
        shmipc_session_manager_close(m);
}

static PyObject *manager_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"address", "config", NULL};
    module_state *ms = shmipcpy_state_of_type(type);
    const char *address;
    PyObject *cfg_obj = Py_None;
    shmipc_config *cfg;
    shmipc_session_manager *m;
    int rc;
    if (ms == NULL ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "s|O:SessionManager", kwlist, &address,
                                     &cfg_obj) ||
        shmipcpy_config_arg(ms, cfg_obj, &cfg) < 0)
        return NULL;
    ManagerObject *self = (ManagerObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        shmipc_config_free(cfg);
        return NULL;
    }
    self->pid = shmipcpy_pid;
    shmipcpy_config_timeouts(cfg, &self->read_ms, &self->write_ms, &self->memory_wait);
    Py_BEGIN_ALLOW_THREADS rc = shmipc_session_manager_new(address, cfg, &m);
    Py_END_ALLOW_THREADS shmipc_config_free(cfg);
    if (rc < 0) {
        Py_DECREF(self);
        return shmipcpy_raise_last(ms, rc);
    }
    self->m = m;
    return (PyObject *)self;
}

static PyObject *manager_get_stream(ManagerObject *self, PyObject *unused)
{
    (void)unused;
    module_state *ms = manager_state(self);
    shmipc_session_manager *m = manager_usable(self);
    shmipc_stream *h;
    int rc;
    if (m == NULL)
        return NULL;
    /* May reconnect a dead session: blocking, so without the GIL. */
    self->busy++;
    Py_BEGIN_ALLOW_THREADS rc = shmipc_session_manager_get_stream(m, &h);
    Py_END_ALLOW_THREADS self->busy--;
    if (self->close_pending) {
        if (rc == 0)
            shmipc_stream_close(h);
        manager_settle(self);
        return shmipcpy_raise_closed(ms, "session manager");
    }
    if (rc < 0)
        return shmipcpy_raise_last(ms, rc);
    return shmipcpy_stream_wrap(ms, h, (PyObject *)self, self->read_ms, self->write_ms,
                                self->memory_wait);
}

static PyObject *manager_put_back(ManagerObject *self, PyObject *arg)
{
    module_state *ms = manager_state(self);
    if (!PyObject_TypeCheck(arg, ms->stream_type)) {
        PyErr_Format(PyExc_TypeError, "put_back() takes a shmipc.Stream, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    StreamObject *stream = (StreamObject *)arg;
    if (stream->owner != (PyObject *)self) {
        PyErr_SetString(PyExc_ValueError,
                        "put_back: the stream did not come from this SessionManager");
        return NULL;
    }
    if (self->m == NULL || self->close_pending) {
        /* The pool is gone: the stream can only be closed. */
        PyObject *r = PyObject_CallMethod(arg, "close", NULL);
        return r;
    }
    shmipc_stream *h = shmipcpy_stream_detach(stream);
    if (h == NULL)
        return NULL;
    shmipc_session_manager *m = self->m;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS shmipc_session_manager_put_back(m, h);
    Py_END_ALLOW_THREADS self->busy--;
    manager_settle(self);
    Py_RETURN_NONE;
}

static PyObject *manager_close(ManagerObject *self, PyObject *unused)
{
    (void)unused;
    if (self->m != NULL && shmipcpy_forked(self->pid)) { /* a fork child: forget (module.h) */
        self->m = NULL;
        self->close_pending = 0;
        Py_RETURN_NONE;
    }
    if (self->m == NULL || self->close_pending)
        Py_RETURN_NONE;
    if (self->busy) {
        self->close_pending = 1;
        Py_RETURN_NONE;
    }
    shmipc_session_manager *m = self->m;
    self->m = NULL;
    Py_BEGIN_ALLOW_THREADS shmipc_session_manager_close(m);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static void manager_dealloc(ManagerObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->m != NULL && !shmipcpy_forked(self->pid)) {
        shmipc_session_manager *m = self->m;
        self->m = NULL;
        Py_BEGIN_ALLOW_THREADS shmipc_session_manager_close(m);
        Py_END_ALLOW_THREADS
    }
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyObject *manager_enter(ManagerObject *self, PyObject *unused)
{
    (void)unused;
    if (manager_usable(self) == NULL)
        return NULL;
    return Py_NewRef(self);
}

static PyObject *manager_exit(ManagerObject *self, PyObject *args)
{
    (void)args;
    return manager_close(self, NULL);
}

static PyObject *manager_get_closed(ManagerObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->m == NULL || self->close_pending);
}

static PyObject *manager_repr(ManagerObject *self)
{
    return PyUnicode_FromFormat("<shmipc.SessionManager%s>",
                                self->m == NULL || self->close_pending ? " closed" : "");
}

static PyMethodDef manager_methods[] = {
    {"get_stream", (PyCFunction)manager_get_stream, METH_NOARGS,
     "get_stream() -> Stream\n\n"
     "A stream from the pool, or a new one. A session that died is reconnected first\n"
     "(blocking, GIL released); after a failed reconnect, calls fail at once with its error\n"
     "until config.rebuild_interval has passed. Thread safe."},
    {"put_back", (PyCFunction)manager_put_back, METH_O,
     "put_back(stream) -> None\n\n"
     "Give a stream from get_stream() back for reuse. The Stream object is closed for you\n"
     "(its Chunks become invalid); the pool keeps the underlying stream when it is as good\n"
     "as new (no unread or unsent data, not closed by the peer), else closes it. Raises\n"
     "BufferError while a memoryview of one of its Chunks is alive."},
    {"close", (PyCFunction)manager_close, METH_NOARGS,
     "close() -> None\n\n"
     "Hard close of every session. Streams taken and not put back fail with ClosedError\n"
     "and must still be closed. Safe to call twice."},
    {"__enter__", (PyCFunction)manager_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)manager_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef manager_getset[] = {
    {"closed", (getter)manager_get_closed, NULL, "True after close().", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot manager_slots[] = {
    {Py_tp_new, manager_new},
    {Py_tp_dealloc, manager_dealloc},
    {Py_tp_repr, manager_repr},
    {Py_tp_methods, manager_methods},
    {Py_tp_getset, manager_getset},
    {Py_tp_doc,
     "SessionManager(address, config=None)\n\n"
     "A client pool, as the reference's SessionManager: config.session_num sessions to one\n"
     "server (all connected here, blocking), each keeping up to config.max_stream_num idle\n"
     "streams for reuse. Thread safe. Use it as a context manager, or call close()."},
    {0, NULL},
};

PyType_Spec shmipcpy_manager_spec = {
    .name = "shmipc.SessionManager",
    .basicsize = sizeof(ManagerObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = manager_slots,
};
