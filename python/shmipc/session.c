/*
 * session.c - shmipc.Session, shmipc.SessionManager and shmipc.Listener, with the serve loop
 * that calls Python callables from the C listener.
 *
 * Closing under a running call. Each of these objects counts the threads inside a blocking
 * call on its handle with the GIL released (`busy`). close() from another thread (or from a
 * callback of serve) then only marks `close_pending`: the blocked calls wait in slices of
 * SHMIPCPY_SLICE_MS, notice the mark, and the last one out frees the handle. So no handle is
 * freed under a running C call, and close() never waits.
 */
#include "module.h"

#include <structmember.h>

/* ---------------------------------------------------------------------------------------- */
/* Session                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static module_state *session_state(SessionObject *self)
{
    return shmipcpy_state_of_type(Py_TYPE(self));
}

static shmipc_session *session_usable(SessionObject *self)
{
    if (self->s == NULL || self->close_pending) {
        shmipcpy_raise_closed(session_state(self), "session");
        return NULL;
    }
    return self->s;
}

/* With no thread left inside, a close() that came meanwhile takes effect now. */
static void session_settle(SessionObject *self)
{
    if (self->busy > 0 || !self->close_pending)
        return;
    self->close_pending = 0;
    shmipc_session *h = self->s;
    self->s = NULL;
    shmipc_session_close(h);
}

static PyObject *session_wrap(module_state *ms, shmipc_session *s, int server, uint32_t read_ms,
                              uint32_t write_ms)
{
    SessionObject *self = PyObject_New(SessionObject, ms->session_type);
    if (self == NULL) {
        shmipc_session_close(s);
        return NULL;
    }
    self->s = s;
    self->busy = 0;
    self->close_pending = 0;
    self->server = server;
    self->read_ms = read_ms;
    self->write_ms = write_ms;
    self->weakreflist = NULL;
    return (PyObject *)self;
}

static PyObject *connect_impl(module_state *ms, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"address", "config", NULL};
    const char *address;
    PyObject *cfg_obj = Py_None;
    shmipc_config *cfg;
    shmipc_session *s;
    uint32_t read_ms, write_ms;
    int rc;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s|O:connect", kwlist, &address, &cfg_obj) ||
        shmipcpy_config_arg(ms, cfg_obj, &cfg) < 0)
        return NULL;
    shmipcpy_config_timeouts(cfg, &read_ms, &write_ms);
    Py_BEGIN_ALLOW_THREADS rc = shmipc_session_connect(address, cfg, &s);
    Py_END_ALLOW_THREADS shmipc_config_free(cfg);
    if (rc < 0)
        return shmipcpy_raise_last(ms, rc);
    return session_wrap(ms, s, 0, read_ms, write_ms);
}

PyObject *shmipcpy_connect(PyObject *module, PyObject *args, PyObject *kwargs)
{
    return connect_impl((module_state *)PyModule_GetState(module), args, kwargs);
}

static PyObject *session_connect(PyTypeObject *cls, PyObject *args, PyObject *kwargs)
{
    module_state *ms = shmipcpy_state_of_type(cls);
    if (ms == NULL)
        return NULL;
    return connect_impl(ms, args, kwargs);
}

static PyObject *session_open_stream(SessionObject *self, PyObject *unused)
{
    (void)unused;
    shmipc_session *s = session_usable(self);
    shmipc_stream *h;
    if (s == NULL)
        return NULL;
    int rc = shmipc_session_open_stream(s, &h);
    if (rc < 0)
        return shmipcpy_raise_last(session_state(self), rc);
    return shmipcpy_stream_wrap(session_state(self), h, (PyObject *)self, self->read_ms,
                                self->write_ms);
}

/* What sliced_accept() returns besides the C result (which is <= 0). */
enum {
    ACCEPT_RAISED = 1,     /* a Python exception is set (timeout, signal) */
    ACCEPT_CLOSED_GOT = 2, /* close() came meanwhile; the caller must close what it got */
    ACCEPT_CLOSED = 3,     /* close() came meanwhile; nothing was accepted */
};

/*
 * Waits for `call` (an accept taking a timeout) in slices with the GIL released, counting
 * itself in `*busy` during each slice, and looking for signals and for `*close_pending`
 * between slices.
 */
typedef int (*accept_fn)(void *handle, int timeout_ms, void **out);

static int sliced_accept(module_state *ms, accept_fn call, void *handle, int *busy,
                         int *close_pending, PyObject *timeout, int nonblock, const char *what,
                         void **out)
{
    int64_t ms_timeout;
    int rc;
    if (nonblock)
        return call(handle, 0, out);
    if (shmipcpy_timeout_arg(ms, timeout, "timeout", 1, &ms_timeout) < 0)
        return ACCEPT_RAISED;
    if (ms_timeout == 0) {
        rc = call(handle, 0, out);
        if (rc == SHMIPC_EAGAIN) {
            char msg[96];
            PyOS_snprintf(msg, sizeof msg, "%s: nothing waiting", what);
            shmipcpy_raise_code(ms, SHMIPC_ETIMEDOUT, msg);
            return ACCEPT_RAISED;
        }
        return rc;
    }
    uint64_t deadline = ms_timeout > 0 ? shmipcpy_now_ms() + (uint64_t)ms_timeout : 0;
    for (;;) {
        int slice = shmipcpy_slice_ms(deadline);
        if (slice == 0) {
            char msg[96];
            PyOS_snprintf(msg, sizeof msg, "%s: timed out after %.3f s", what, ms_timeout / 1000.0);
            shmipcpy_raise_code(ms, SHMIPC_ETIMEDOUT, msg);
            return ACCEPT_RAISED;
        }
        (*busy)++;
        Py_BEGIN_ALLOW_THREADS rc = call(handle, slice, out);
        Py_END_ALLOW_THREADS(*busy)--;
        if (*close_pending)
            return rc == 0 ? ACCEPT_CLOSED_GOT : ACCEPT_CLOSED;
        if (rc != SHMIPC_ETIMEDOUT && rc != SHMIPC_EINTR && rc != SHMIPC_EAGAIN)
            return rc;
        if (PyErr_CheckSignals() < 0)
            return ACCEPT_RAISED;
    }
}

static int accept_stream_call(void *handle, int timeout_ms, void **out)
{
    return shmipc_session_accept_stream(handle, timeout_ms, (shmipc_stream **)out);
}

static PyObject *session_accept_stream(SessionObject *self, PyObject *const *args, Py_ssize_t nargs,
                                       PyObject *kwnames)
{
    module_state *ms = session_state(self);
    PyObject *timeout = NULL;
    int nonblock;
    void *h = NULL;
    shmipc_session *s;
    if (shmipcpy_parse_args("accept_stream", args, nargs, kwnames, "timeout", &timeout, &nonblock) <
            0 ||
        (s = session_usable(self)) == NULL)
        return NULL;
    int rc = sliced_accept(ms, accept_stream_call, s, &self->busy, &self->close_pending, timeout,
                           nonblock, "accept_stream", &h);
    if (rc == ACCEPT_CLOSED_GOT || rc == ACCEPT_CLOSED) {
        if (rc == ACCEPT_CLOSED_GOT)
            shmipc_stream_close(h);
        session_settle(self);
        return shmipcpy_raise_closed(ms, "session");
    }
    if (rc == ACCEPT_RAISED)
        return NULL;
    if (rc == SHMIPC_EAGAIN && nonblock)
        Py_RETURN_NONE;
    if (rc < 0)
        return shmipcpy_raise_last(ms, rc);
    return shmipcpy_stream_wrap(ms, h, (PyObject *)self, self->read_ms, self->write_ms);
}

static PyObject *session_fileno(SessionObject *self, PyObject *unused)
{
    (void)unused;
    shmipc_session *s = session_usable(self);
    if (s == NULL)
        return NULL;
    return PyLong_FromLong(shmipc_session_fileno(s));
}

static PyObject *session_process(SessionObject *self, PyObject *unused)
{
    (void)unused;
    shmipc_session *s = session_usable(self);
    if (s == NULL)
        return NULL;
    /* Never waits: it handles what the socket holds (another thread may hold the role). */
    int rc = shmipc_session_process(s);
    if (rc < 0)
        return shmipcpy_raise_last(session_state(self), rc);
    return PyLong_FromLong(rc);
}

/*
 * Spins up to the spin budget with the GIL released (busy, as a blocking call: a close()
 * meanwhile shuts the session down, which ends the spin, and the handle is freed here).
 */
static PyObject *session_spin(SessionObject *self, PyObject *unused)
{
    (void)unused;
    shmipc_session *s = session_usable(self);
    int rc;
    if (s == NULL)
        return NULL;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS rc = shmipc_session_spin(s);
    Py_END_ALLOW_THREADS self->busy--;
    if (self->close_pending) {
        session_settle(self);
        return shmipcpy_raise_closed(session_state(self), "session");
    }
    if (rc < 0)
        return shmipcpy_raise_last(session_state(self), rc);
    return PyBool_FromLong(rc > 0);
}

/*
 * Wakes every call blocked on the session or its streams (ClosedError) and keeps the handle.
 * With the GIL held: no other Python thread can close the handle meanwhile, and the library
 * runs no callback under its locks (shmipc.h), so waiting for its lock cannot deadlock.
 */
static PyObject *session_shutdown(SessionObject *self, PyObject *unused)
{
    (void)unused;
    if (self->s != NULL && !self->close_pending)
        shmipc_session_shutdown(self->s);
    Py_RETURN_NONE;
}

static PyObject *session_close(SessionObject *self, PyObject *unused)
{
    (void)unused;
    if (self->s == NULL || self->close_pending)
        Py_RETURN_NONE;
    if (self->busy) {
        /* Wake the blocked calls now; the last one out frees the handle (session_settle). */
        shmipc_session_shutdown(self->s);
        self->close_pending = 1;
        Py_RETURN_NONE;
    }
    shmipc_session *h = self->s;
    self->s = NULL;
    shmipc_session_close(h);
    Py_RETURN_NONE;
}

static void session_dealloc(SessionObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    if (self->s != NULL)
        shmipc_session_close(self->s);
    PyObject_Free(self);
    Py_DECREF(tp);
}

static PyObject *session_enter(SessionObject *self, PyObject *unused)
{
    (void)unused;
    if (session_usable(self) == NULL)
        return NULL;
    return Py_NewRef(self);
}

static PyObject *session_exit(SessionObject *self, PyObject *args)
{
    (void)args;
    return session_close(self, NULL);
}

static PyObject *session_get_status(SessionObject *self, void *closure)
{
    (void)closure;
    if (self->s == NULL || self->close_pending)
        return PyLong_FromLong(SHMIPC_ECLOSED);
    return PyLong_FromLong(shmipc_session_status(self->s));
}

static PyObject *session_get_version(SessionObject *self, void *closure)
{
    (void)closure;
    shmipc_session *s = session_usable(self);
    if (s == NULL)
        return NULL;
    return PyLong_FromLong(shmipc_session_version(s));
}

static PyObject *session_get_closed(SessionObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->s == NULL || self->close_pending);
}

static PyObject *session_get_role(SessionObject *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(self->server ? "server" : "client");
}

static PyObject *session_repr(SessionObject *self)
{
    if (self->s == NULL || self->close_pending)
        return PyUnicode_FromFormat("<shmipc.Session %s closed>",
                                    self->server ? "server" : "client");
    int status = shmipc_session_status(self->s);
    return PyUnicode_FromFormat("<shmipc.Session %s V%d%s%s>", self->server ? "server" : "client",
                                shmipc_session_version(self->s), status ? " ended: " : "",
                                status ? shmipc_errname(status) : "");
}

static PyMethodDef session_methods[] = {
    {"connect", (PyCFunction)(void (*)(void))session_connect,
     METH_CLASS | METH_VARARGS | METH_KEYWORDS,
     "connect(address, config=None) -> Session\n\n"
     "Connect to a server and run the client handshake (V3 over memfd by default, V2 with\n"
     "config.memmap = 'devshm', V4 when the config asks). Addresses: 'unix:/path', '/path',\n"
     "'unix:@abstract', 'tcp:host:port'. Blocks up to the config's initialize_timeout with\n"
     "the GIL released."},
    {"open_stream", (PyCFunction)session_open_stream, METH_NOARGS,
     "open_stream() -> Stream\n\n"
     "Open a new stream (client sessions). Sends nothing: the peer learns of the stream\n"
     "from its first message."},
    {"accept_stream", (PyCFunction)(void (*)(void))session_accept_stream,
     METH_FASTCALL | METH_KEYWORDS,
     "accept_stream(timeout=None, *, nonblock=False) -> Stream | None\n\n"
     "The next stream the peer opened (server sessions). Waits up to timeout seconds (None:\n"
     "forever; 0: just look) and raises TimeoutError; with nonblock=True returns None when\n"
     "no stream is waiting. The GIL is released while waiting; Ctrl-C interrupts."},
    {"fileno", (PyCFunction)session_fileno, METH_NOARGS,
     "fileno() -> int\n\n"
     "A descriptor that becomes readable when the session has events; register it with an\n"
     "event loop (level-triggered) and call process() when it fires."},
    {"spin", (PyCFunction)session_spin, METH_NOARGS,
     "spin() -> bool\n\n"
     "For event loops, before sleeping on fileno(): poll the receive queue for up to the\n"
     "spin budget (Config.spin_us caps it) and process what came. True: something was\n"
     "processed (dispatch, do not sleep); False: sleep on fileno() as usual."},
    {"process", (PyCFunction)session_process, METH_NOARGS,
     "process() -> int\n\n"
     "Handle pending events without waiting (data for streams, closes, new streams) and\n"
     "return how many. Raises the error that ended the session (PeerGoneError, ...)."},
    {"close", (PyCFunction)session_close, METH_NOARGS,
     "close() -> None\n\n"
     "Hard close: the peer sees the connection end and every stream of the session fails\n"
     "with ClosedError from then on. Chunks already read stay valid until their stream is\n"
     "closed (the memory stays mapped). Safe to call twice; from another thread it ends a\n"
     "blocked accept_stream() at once (ClosedError), as shutdown() does."},
    {"shutdown", (PyCFunction)session_shutdown, METH_NOARGS,
     "shutdown() -> None\n\n"
     "End the session as close() does (the peer sees the connection end) but keep the\n"
     "object: every call blocked on it or on one of its streams, in any thread, raises\n"
     "ClosedError at once, and so does every later call. Any thread, any number of times;\n"
     "a no-op once closed. Then join the threads and close()."},
    {"__enter__", (PyCFunction)session_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)session_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef session_getset[] = {
    {"status", (getter)session_get_status, NULL,
     "0 while the session is alive, else the (negative) code that ended it; ECLOSED after\n"
     "close().",
     NULL},
    {"version", (getter)session_get_version, NULL, "The negotiated protocol version.", NULL},
    {"closed", (getter)session_get_closed, NULL, "True after close().", NULL},
    {"role", (getter)session_get_role, NULL, "'client' or 'server'.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef session_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(SessionObject, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot session_slots[] = {
    {Py_tp_dealloc, session_dealloc},
    {Py_tp_repr, session_repr},
    {Py_tp_methods, session_methods},
    {Py_tp_getset, session_getset},
    {Py_tp_members, session_members},
    {Py_tp_doc,
     "A connection to a peer with its shared memory; streams are multiplexed inside it.\n"
     "Clients get one from Session.connect() (or shmipc.connect()), servers from\n"
     "Listener.accept(). A session may be used from several threads at once. Its streams\n"
     "keep the Session object alive. Use it as a context manager, or call close()."},
    {0, NULL},
};

PyType_Spec shmipcpy_session_spec = {
    .name = "shmipc.Session",
    .basicsize = sizeof(SessionObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = session_slots,
};

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
    shmipcpy_config_timeouts(cfg, &self->read_ms, &self->write_ms);
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
    return shmipcpy_stream_wrap(ms, h, (PyObject *)self, self->read_ms, self->write_ms);
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
    if (self->m != NULL) {
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
    const char *addr = PyUnicode_AsUTF8(address);
    if (addr == NULL || shmipcpy_config_arg(ms, cfg_obj, &cfg) < 0)
        return NULL;
    ListenerObject *self = (ListenerObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        shmipc_config_free(cfg);
        return NULL;
    }
    shmipcpy_config_timeouts(cfg, &self->read_ms, &self->write_ms);
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
    int rc = sliced_accept(ms, listener_accept_call, l, &self->busy, &self->close_pending, timeout,
                           nonblock, "accept", &s);
    if (rc == ACCEPT_CLOSED_GOT || rc == ACCEPT_CLOSED) {
        if (rc == ACCEPT_CLOSED_GOT)
            shmipc_session_close(s);
        listener_settle(self);
        return shmipcpy_raise_closed(ms, "listener");
    }
    if (rc == ACCEPT_RAISED)
        return NULL;
    if (rc == SHMIPC_EAGAIN && nonblock)
        Py_RETURN_NONE;
    if (rc < 0)
        return shmipcpy_raise_last(ms, rc);
    return session_wrap(ms, s, 1, self->read_ms, self->write_ms);
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
    PyObject *stream =
        shmipcpy_stream_wrap(c->ms, h, (PyObject *)c->self, c->self->read_ms, c->self->write_ms);
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
    if (self->l != NULL)
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
     "Waits up to timeout seconds (None: forever; 0: just look) and raises TimeoutError;\n"
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
