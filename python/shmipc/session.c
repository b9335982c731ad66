/*
 * session.c - shmipc.Session, and the rule that Session, SessionManager (manager.c) and
 * Listener (listener.c, with the serve loop that calls Python callables from the C listener)
 * follow when closed under a running call.
 *
 * Closing under a running call. Each of these objects counts the threads inside a blocking
 * call on its handle with the GIL released (`busy`). close() from another thread (or from a
 * callback of serve) then only marks `close_pending`: the blocked calls wait in slices of
 * SHMIPCPY_SLICE_MS, notice the mark, and the last one out frees the handle. So no handle is
 * freed under a running C call, and close() never waits.
 *
 * Owns: the Session type, shmipc.connect, and the sliced accept that Session.accept_stream and
 * Listener.accept share.
 * May call: the public C API (shmipc_session_*), module.h's helpers and stream.c's wrap.
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
    if (!shmipcpy_forked(self->pid))
        shmipc_session_close(h);
}

PyObject *shmipcpy_session_wrap(module_state *ms, shmipc_session *s, int server, int32_t read_ms,
                                int32_t write_ms, int memory_wait)
{
    SessionObject *self = PyObject_New(SessionObject, ms->session_type);
    if (self == NULL) {
        shmipc_session_close(s);
        return NULL;
    }
    self->s = s;
    self->pid = shmipcpy_pid;
    self->busy = 0;
    self->close_pending = 0;
    self->server = server;
    self->read_ms = read_ms;
    self->write_ms = write_ms;
    self->memory_wait = memory_wait;
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
    int32_t read_ms, write_ms;
    int memory_wait;
    int rc;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s|O:connect", kwlist, &address, &cfg_obj) ||
        shmipcpy_config_arg(ms, cfg_obj, &cfg) < 0)
        return NULL;
    shmipcpy_config_timeouts(cfg, &read_ms, &write_ms, &memory_wait);
    Py_BEGIN_ALLOW_THREADS rc = shmipc_session_connect(address, cfg, &s);
    Py_END_ALLOW_THREADS shmipc_config_free(cfg);
    if (rc < 0)
        return shmipcpy_raise_last(ms, rc);
    return shmipcpy_session_wrap(ms, s, 0, read_ms, write_ms, memory_wait);
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
                                self->write_ms, self->memory_wait);
}

/*
 * The whole wait counts in *busy, the timeout's conversion and the signal handlers between
 * slices too: any of them may run Python code that closes the owner, which then only marks
 * *close_pending (the handle stays valid until the caller settles it).
 */
static int sliced_accept_wait(module_state *ms, accept_fn call, void *handle, int *close_pending,
                              PyObject *timeout, const char *what, void **out)
{
    int64_t ms_timeout;
    int rc;
    if (shmipcpy_timeout_arg(ms, timeout, "timeout", 1, &ms_timeout) < 0)
        return ACCEPT_RAISED;
    if (*close_pending)
        return ACCEPT_CLOSED;
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
        Py_BEGIN_ALLOW_THREADS rc = call(handle, slice, out);
        Py_END_ALLOW_THREADS if (*close_pending) return rc == 0 ? ACCEPT_CLOSED_GOT : ACCEPT_CLOSED;
        if (rc != SHMIPC_ETIMEDOUT && rc != SHMIPC_EINTR && rc != SHMIPC_EAGAIN)
            return rc;
        if (PyErr_CheckSignals() < 0)
            return ACCEPT_RAISED;
        if (*close_pending) /* a signal handler closed the owner */
            return ACCEPT_CLOSED;
    }
}

int shmipcpy_sliced_accept(module_state *ms, accept_fn call, void *handle, int *busy,
                           int *close_pending, PyObject *timeout, int nonblock, const char *what,
                           void **out)
{
    if (nonblock)
        return call(handle, 0, out);
    (*busy)++;
    int rc = sliced_accept_wait(ms, call, handle, close_pending, timeout, what, out);
    (*busy)--;
    return rc;
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
    int rc = shmipcpy_sliced_accept(ms, accept_stream_call, s, &self->busy, &self->close_pending,
                                    timeout, nonblock, "accept_stream", &h);
    if (rc == ACCEPT_CLOSED_GOT || rc == ACCEPT_CLOSED || rc == ACCEPT_RAISED) {
        if (rc == ACCEPT_CLOSED_GOT)
            shmipc_stream_close(h);
        session_settle(self); /* a close() that came during the wait */
        return rc == ACCEPT_RAISED ? NULL : shmipcpy_raise_closed(ms, "session");
    }
    if (rc == SHMIPC_EAGAIN && nonblock)
        Py_RETURN_NONE;
    if (rc < 0)
        return shmipcpy_raise_last(ms, rc);
    return shmipcpy_stream_wrap(ms, h, (PyObject *)self, self->read_ms, self->write_ms,
                                self->memory_wait);
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
    if (self->s != NULL && shmipcpy_forked(self->pid)) {
        /* The parent's session, in a fork child: forget it (module.h), whatever was busy in
         * the parent; its threads are not here. */
        self->s = NULL;
        self->close_pending = 0;
        Py_RETURN_NONE;
    }
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
    if (self->s != NULL && !shmipcpy_forked(self->pid))
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
     "The next stream the peer opened (server sessions). Waits up to timeout seconds (None\n"
     "or negative: forever; 0: just look) and raises TimeoutError; with nonblock=True returns None "
     "when\n"
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
