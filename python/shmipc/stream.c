/*
 * stream.c - shmipc.Stream, shmipc.Chunk (received bytes, in place in shared memory) and the
 * window that Stream.reserve() exports as a writable memoryview.
 *
 * The lifetime rules (module.h has the fields, docs/python.md the user's view):
 *  - A Chunk is valid until Chunk.release(), Stream.release() or Stream.close(); after that
 *    every use raises shmipc.ReleasedError, so no Python code can reach memory the library
 *    may have reused. A Chunk keeps its Stream alive.
 *  - The slices behind Chunks go back to shared memory (shmipc_stream_release) as soon as no
 *    Chunk that points into them is alive; holding one Chunk holds every slice read since.
 *  - While a memoryview of a Chunk is alive, Stream.release() and Stream.close() raise
 *    BufferError (as mmap.close() does); so does Chunk.release().
 *  - The reserve() window is valid until commit, write, the next reserve, flush or close,
 *    each of which raises BufferError while a memoryview of the window is alive.
 *
 * Owns: the Stream type, its busy/close_pending and generation helpers, and its life (wrap,
 * detach, shutdown, close, dealloc, timeouts). chunk.c holds Chunk and the reserve window,
 * stream_io.c the reading and writing methods.
 * May call: the public C API (shmipc_stream_*), module.h's helpers and stream_io.c's methods.
 */
#include "module.h"

#include <stdlib.h>
#include <string.h>

#include <structmember.h>

module_state *shmipcpy_stream_state(StreamObject *self)
{
    return shmipcpy_state_of_type(Py_TYPE(self));
}

/* The handle, or NULL with ClosedError (closed) or RuntimeError (another thread is in it). */
shmipc_stream *shmipcpy_stream_usable(StreamObject *self)
{
    if (self->st == NULL || self->close_pending) {
        shmipcpy_raise_closed(shmipcpy_stream_state(self), "stream");
        return NULL;
    }
    if (self->busy) {
        shmipcpy_raise_busy("shmipc.Stream");
        return NULL;
    }
    return self->st;
}

/*
 * Back from a call made with the GIL released. When close() came meanwhile, the handle is
 * closed now and ClosedError is raised (-1).
 */
int shmipcpy_stream_leave(StreamObject *self)
{
    self->busy = 0;
    if (!self->close_pending)
        return 0;
    self->close_pending = 0;
    shmipc_stream *h = self->st;
    self->st = NULL;
    if (!shmipcpy_forked(self->pid))
        shmipc_stream_close(h);
    shmipcpy_raise_closed(shmipcpy_stream_state(self), "stream");
    return -1;
}

/* Gives consumed slices back when no Chunk points into them and no other thread reads. */
void shmipcpy_stream_maybe_release(StreamObject *self)
{
    if (self->st != NULL && !self->busy && !self->close_pending && self->live == 0 &&
        self->consumed && !shmipcpy_forked(self->pid)) {
        self->consumed = 0;
        shmipc_stream_release(self->st);
    }
}

/* Starts a new Chunk and window generation: every older Chunk and window is invalid. */
void shmipcpy_stream_invalidate(StreamObject *self)
{
    self->gen++;
    self->live = 0;
    self->last_exact = NULL;
    self->wgen++;
}

int shmipcpy_stream_refuse_chunk_exports(StreamObject *self, const char *what)
{
    if (self->exports > 0) {
        PyErr_Format(PyExc_BufferError,
                     "cannot %s a Stream while a memoryview of one of its Chunks is alive "
                     "(%zd exported); release the memoryview first",
                     what, self->exports);
        return -1;
    }
    return 0;
}

int shmipcpy_stream_refuse_exports(StreamObject *self, const char *what)
{
    if (shmipcpy_stream_refuse_chunk_exports(self, what) < 0)
        return -1;
    if (self->wexports > 0) {
        PyErr_Format(PyExc_BufferError,
                     "cannot %s a Stream while the memoryview from reserve() is alive; "
                     "release it first (with st.reserve(n) as buf: ...)",
                     what);
        return -1;
    }
    return 0;
}

int shmipcpy_stream_refuse_window(StreamObject *self, const char *what)
{
    if (self->wexports > 0) {
        PyErr_Format(PyExc_BufferError,
                     "%s: the memoryview from reserve() is still alive; release it first "
                     "(with st.reserve(n) as buf: ...)",
                     what);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Stream: life                                                                             */
/* ---------------------------------------------------------------------------------------- */

PyObject *shmipcpy_stream_wrap(module_state *ms, shmipc_stream *h, PyObject *owner, int32_t read_ms,
                               int32_t write_ms, int memory_wait)
{
    StreamObject *self = PyObject_New(StreamObject, ms->stream_type);
    if (self == NULL) {
        shmipc_stream_close(h);
        return NULL;
    }
    self->st = h;
    self->owner = Py_NewRef(owner);
    self->weakreflist = NULL;
    self->id = shmipc_stream_id(h);
    self->pid = shmipcpy_pid;
    self->busy = 0;
    self->close_pending = 0;
    self->consumed = 0;
    self->gen = 0;
    self->live = 0;
    self->exports = 0;
    self->last_exact = NULL;
    self->wgen = 0;
    self->wexports = 0;
    self->read_ms = read_ms;
    self->c_read_ms = read_ms;
    self->write_ms = write_ms;
    self->memory_wait = memory_wait;
    return (PyObject *)self;
}

shmipc_stream *shmipcpy_stream_detach(StreamObject *self)
{
    shmipc_stream *h = shmipcpy_stream_usable(self);
    if (h == NULL || shmipcpy_stream_refuse_exports(self, "put back") < 0)
        return NULL;
    /* The pool takes only streams with nothing left to release. */
    shmipcpy_stream_invalidate(self);
    self->consumed = 0;
    shmipc_stream_release(h);
    self->st = NULL;
    return h;
}

/*
 * Wakes a call blocked on the stream in another thread (ClosedError) and fails later ones; the
 * stream stays open until close(). With the GIL held, as Session.shutdown.
 */
static PyObject *stream_shutdown(StreamObject *self, PyObject *unused)
{
    (void)unused;
    if (self->st != NULL && !self->close_pending)
        shmipc_stream_shutdown(self->st);
    Py_RETURN_NONE;
}

/* In a fork child, the parent's stream is forgotten instead of closed (module.h). */
static int stream_forget_forked(StreamObject *self)
{
    if (self->st == NULL || !shmipcpy_forked(self->pid))
        return 0;
    shmipcpy_stream_invalidate(self);
    self->st = NULL;
    self->close_pending = 0;
    return 1;
}

static PyObject *stream_close(StreamObject *self, PyObject *unused)
{
    (void)unused;
    if (stream_forget_forked(self) || self->st == NULL || self->close_pending)
        Py_RETURN_NONE;
    if (shmipcpy_stream_refuse_exports(self, "close") < 0)
        return NULL;
    shmipcpy_stream_invalidate(self);
    if (self->busy) {
        /* Another thread is in a call on the handle: wake it; it closes it on its way out. */
        shmipc_stream_shutdown(self->st);
        self->close_pending = 1;
        Py_RETURN_NONE;
    }
    shmipc_stream *h = self->st;
    self->st = NULL;
    Py_BEGIN_ALLOW_THREADS shmipc_stream_close(h);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

/* Flush and close in one step (shmipc_stream_flush_close): closed afterwards in every case. */
static PyObject *stream_flush_close(StreamObject *self, PyObject *unused)
{
    (void)unused;
    if (stream_forget_forked(self)) /* nothing flushed either: the queue is the parent's */
        Py_RETURN_NONE;
    shmipc_stream *h = shmipcpy_stream_usable(self);
    if (h == NULL || shmipcpy_stream_refuse_window(self, "flush_close") < 0 ||
        shmipcpy_stream_refuse_exports(self, "close") < 0)
        return NULL;
    shmipcpy_stream_invalidate(self);
    self->st = NULL; /* closed from here on, for every thread */
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = shmipc_stream_flush_close(h);
    Py_END_ALLOW_THREADS if (rc < 0) return shmipcpy_raise_last(shmipcpy_stream_state(self), rc);
    Py_RETURN_NONE;
}

static void stream_dealloc(StreamObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    /*
     * No Chunk or window is alive (each holds a reference), and no thread is inside. The
     * close may wait for the socket (a full queue), so it runs without the GIL.
     */
    if (self->st != NULL && !shmipcpy_forked(self->pid)) {
        shmipc_stream *h = self->st;
        self->st = NULL;
        Py_BEGIN_ALLOW_THREADS shmipc_stream_close(h);
        Py_END_ALLOW_THREADS
    }
    Py_XDECREF(self->owner);
    PyObject_Free(self);
    Py_DECREF(tp);
}

static PyObject *stream_enter(StreamObject *self, PyObject *unused)
{
    (void)unused;
    if (shmipcpy_stream_usable(self) == NULL)
        return NULL;
    return Py_NewRef(self);
}

static PyObject *stream_exit(StreamObject *self, PyObject *args)
{
    (void)args;
    return stream_close(self, NULL);
}

static PyObject *stream_fileno(StreamObject *self, PyObject *unused)
{
    (void)unused;
    module_state *ms = shmipcpy_stream_state(self);
    if (shmipcpy_stream_usable(self) == NULL)
        return NULL;
    if (!PyObject_TypeCheck(self->owner, ms->session_type)) {
        PyErr_SetString(ms->unsupported,
                        "fileno: this stream came from a SessionManager or a serving Listener, "
                        "whose sessions are not exposed; poll with read(..., nonblock=True)");
        return NULL;
    }
    SessionObject *s = (SessionObject *)self->owner;
    if (s->s == NULL || s->close_pending)
        return shmipcpy_raise_closed(ms, "session");
    return PyLong_FromLong(shmipc_session_fileno(s->s));
}

static PyObject *stream_get_id(StreamObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLong(self->id);
}

static PyObject *stream_get_closed(StreamObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->st == NULL || self->close_pending);
}

static PyObject *stream_get_available(StreamObject *self, void *closure)
{
    (void)closure;
    shmipc_stream *h = shmipcpy_stream_usable(self);
    if (h == NULL)
        return NULL;
    return PyLong_FromSize_t(shmipc_stream_available(h));
}

static PyObject *stream_get_session(StreamObject *self, void *closure)
{
    (void)closure;
    module_state *ms = shmipcpy_stream_state(self);
    if (PyObject_TypeCheck(self->owner, ms->session_type))
        return Py_NewRef(self->owner);
    Py_RETURN_NONE;
}

static PyObject *timeout_value(int32_t ms)
{
    if (ms < 0)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(ms / 1000.0);
}

static PyObject *stream_get_read_timeout(StreamObject *self, void *closure)
{
    (void)closure;
    return timeout_value(self->read_ms);
}

static int stream_set_read_timeout(StreamObject *self, PyObject *value, void *closure)
{
    (void)closure;
    int64_t ms;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete Stream.read_timeout");
        return -1;
    }
    if (shmipcpy_timeout_arg(shmipcpy_stream_state(self), value, "read_timeout", 1, &ms) < 0)
        return -1;
    /* Applied per wait slice (or as "no wait") by do_read(); the handle is not touched here. */
    self->read_ms = (int32_t)ms;
    return 0;
}

static PyObject *stream_get_write_timeout(StreamObject *self, void *closure)
{
    (void)closure;
    return timeout_value(self->write_ms);
}

static int stream_set_write_timeout(StreamObject *self, PyObject *value, void *closure)
{
    (void)closure;
    int64_t ms;
    shmipc_stream *h;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete Stream.write_timeout");
        return -1;
    }
    if (shmipcpy_timeout_arg(shmipcpy_stream_state(self), value, "write_timeout", 1, &ms) < 0 ||
        (h = shmipcpy_stream_usable(self)) == NULL)
        return -1;
    int32_t v = (int32_t)ms;
    int rc = shmipc_stream_set_timeout(h, SHMIPC_TIMEOUT_WRITE, v);
    if (rc < 0) {
        shmipcpy_raise_last(shmipcpy_stream_state(self), rc);
        return -1;
    }
    self->write_ms = v;
    return 0;
}

static PyObject *stream_repr(StreamObject *self)
{
    return PyUnicode_FromFormat("<shmipc.Stream id=%u%s>", (unsigned)self->id,
                                self->st == NULL || self->close_pending ? " closed" : "");
}

#define READ_DOC_TAIL                                                                              \
    "Waits up to read_timeout (None: forever; 0: no wait) with the GIL released; Ctrl-C "          \
    "interrupts the\n"                                                                             \
    "wait within about 0.1 s. With nonblock=True it never waits and returns None when no\n"        \
    "data is there yet. "

static PyMethodDef stream_methods[] = {
    {"write", (PyCFunction)shmipcpy_stream_write, METH_O,
     "write(data) -> int\n\n"
     "Append a bytes-like object to the send buffer (one copy, into shared memory) and return\n"
     "its length. Nothing is sent until flush(). Does not block."},
    {"reserve", (PyCFunction)shmipcpy_stream_reserve, METH_O,
     "reserve(n) -> memoryview\n\n"
     "A writable memoryview of n bytes in shared memory at the end of the send buffer: write\n"
     "into it, release it, then commit(k) the first k bytes (zero copy):\n\n"
     "    with st.reserve(5) as buf:\n"
     "        buf[:] = b'hello'\n"
     "    st.commit(5)\n"
     "    st.flush()\n\n"
     "The view is valid until commit, write, the next reserve, flush or close; each of them\n"
     "raises BufferError while the view is alive."},
    {"commit", (PyCFunction)shmipcpy_stream_commit, METH_O,
     "commit(n) -> None\n\nAdd the first n bytes of the reserved window to the send buffer."},
    {"flush", (PyCFunction)shmipcpy_stream_flush, METH_NOARGS,
     "flush() -> None\n\n"
     "Send the send buffer as one message and wake the peer. 'Flushed' means enqueued, not\n"
     "read. Blocks only when the peer's queue is full (up to 100 ms or the write timeout,\n"
     "then shmipc.Error EQUEUEFULL) or the socket is; the GIL is released."},
    {"flush_close", (PyCFunction)stream_flush_close, METH_NOARGS,
     "flush_close() -> None\n\n"
     "flush(), then close(), in one step: the close goes right behind the last message and the\n"
     "peer is woken once for both (a flush, then a close, may wake it twice). For the last\n"
     "reply of an exchange. The stream is closed afterwards even when the flush raises."},
    {"read_chunk", (PyCFunction)(void (*)(void))shmipcpy_stream_read_chunk,
     METH_FASTCALL | METH_KEYWORDS,
     "read_chunk(max=0, *, nonblock=False) -> Chunk | None\n\n"
     "The next contiguous piece of received data, at most max bytes (0: no limit), as a\n"
     "zero-copy Chunk. At end of stream it returns an empty Chunk (falsy, like b'' from\n"
     "socket.recv). " READ_DOC_TAIL
     "Raises TimeoutError, PeerGoneError when the peer went away, ClosedError after close."},
    {"read_exact_bytes", (PyCFunction)(void (*)(void))shmipcpy_stream_read_exact_bytes,
     METH_FASTCALL | METH_KEYWORDS,
     "read_exact_bytes(n, *, nonblock=False) -> Chunk | None\n\n"
     "Exactly n bytes as a Chunk: in place when they lie in one slice, else a stream-owned\n"
     "copy. Raises EndOfStreamError (an EOFError) when the stream ends before n bytes came;\n"
     "the bytes stay unread (see available). " READ_DOC_TAIL},
    {"read", (PyCFunction)(void (*)(void))shmipcpy_stream_read, METH_FASTCALL | METH_KEYWORDS,
     "read(max=0, *, nonblock=False) -> bytes | None\n\n"
     "read_chunk() copied into bytes: b'' at end of stream, None when nonblock and no data."},
    {"readexactly", (PyCFunction)(void (*)(void))shmipcpy_stream_readexactly,
     METH_FASTCALL | METH_KEYWORDS,
     "readexactly(n, *, nonblock=False) -> bytes | None\n\n"
     "read_exact_bytes() copied into bytes; EndOfStreamError when the stream ends first."},
    {"forward", (PyCFunction)(void (*)(void))shmipcpy_stream_forward, METH_VARARGS | METH_KEYWORDS,
     "forward(src, n=0, *, nonblock=False) -> True | None\n\n"
     "Send received bytes on without copying them: the bytes read from the Stream src and\n"
     "not yet given back, then its next n unread bytes, go into this stream's send buffer;\n"
     "flush() sends them. src gives what was read back as soon as none of its Chunks is\n"
     "alive (whatever the read: read() and readexactly() too), so keep the Chunks you want\n"
     "sent on, and drop them all to send only the next n bytes. Whole slices move as they\n"
     "are when both streams belong to one session (an echo: st.forward(st, n); a proxy\n"
     "between two streams), the rest is copied. Waits for the n bytes as read_exact_bytes\n"
     "does (None with nonblock=True when they are not there yet; EndOfStreamError when src\n"
     "ends first; nothing moves then). Otherwise every Chunk of src becomes invalid, as\n"
     "after src.release(), also when it raises. BufferError while a memoryview of one is\n"
     "alive."},
    {"release", (PyCFunction)shmipcpy_stream_release, METH_NOARGS,
     "release() -> None\n\n"
     "Invalidate every Chunk of this stream and give the slices they hold back to shared\n"
     "memory now. Raises BufferError while a memoryview of a Chunk is alive. Dropping or\n"
     "releasing the Chunks does the same on its own."},
    {"fileno", (PyCFunction)stream_fileno, METH_NOARGS,
     "fileno() -> int\n\n"
     "The session's descriptor, readable when the session has events (for event loops; see\n"
     "shmipc.aio). Only for streams of a Session; io.UnsupportedOperation otherwise."},
    {"close", (PyCFunction)stream_close, METH_NOARGS,
     "close() -> None\n\n"
     "Close the stream: unread data is dropped, the peer's reads drain what was sent and\n"
     "then end. Every Chunk of the stream becomes invalid. Raises BufferError while a\n"
     "memoryview of a Chunk or of the reserve() window is alive. Safe to call twice; from\n"
     "another thread it ends a blocked read (ClosedError) at once, as shutdown() does."},
    {"shutdown", (PyCFunction)stream_shutdown, METH_NOARGS,
     "shutdown() -> None\n\n"
     "Wake a read, forward or flush blocked on this stream in another thread (it raises\n"
     "ClosedError) and make every later call but release() and close() raise ClosedError.\n"
     "The peer is told nothing until close(); the session goes on. Any thread, any number\n"
     "of times; a no-op once closed."},
    {"__enter__", (PyCFunction)stream_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)stream_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef stream_getset[] = {
    {"id", (getter)stream_get_id, NULL, "The stream id (client streams count up from 2).", NULL},
    {"closed", (getter)stream_get_closed, NULL, "True after close() (or put_back()).", NULL},
    {"available", (getter)stream_get_available, NULL,
     "Bytes received and not yet read. Does not wait.", NULL},
    {"session", (getter)stream_get_session, NULL,
     "The Session this stream belongs to, or None for streams from a SessionManager or a\n"
     "serving Listener.",
     NULL},
    {"read_timeout", (getter)stream_get_read_timeout, (setter)stream_set_read_timeout,
     "Read timeout in seconds; None (negative when set) waits forever, 0 does not wait (from\n"
     "the config by default).",
     NULL},
    {"write_timeout", (getter)stream_get_write_timeout, (setter)stream_set_write_timeout,
     "Write timeout in seconds (how long flush retries a full queue); None (negative when set)\n"
     "waits forever, 0 fails a flush at once when the queue is full.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef stream_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(StreamObject, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot stream_slots[] = {
    {Py_tp_dealloc, stream_dealloc},
    {Py_tp_repr, stream_repr},
    {Py_tp_methods, stream_methods},
    {Py_tp_getset, stream_getset},
    {Py_tp_members, stream_members},
    {Py_tp_doc,
     "A byte stream inside a session (from Session.open_stream(), Session.accept_stream(),\n"
     "SessionManager.get_stream() or Listener.serve()). Message boundaries are not kept.\n\n"
     "Writing: write(data) or reserve(n)/commit(n) fill the send buffer in shared memory;\n"
     "flush() sends it. Reading: read_chunk() and read_exact_bytes() return zero-copy\n"
     "Chunks; read() and readexactly() return bytes.\n\n"
     "Conventions: end of stream is an empty result from read_chunk()/read() and\n"
     "EndOfStreamError from read_exact_bytes()/readexactly(); nonblock=True returns None\n"
     "when no data is there; timeouts raise TimeoutError; a vanished peer raises\n"
     "PeerGoneError; a closed stream or session raises ClosedError.\n\n"
     "Threads: a stream is used by one thread at a time (RuntimeError otherwise); different\n"
     "streams of one session run in parallel; blocking calls release the GIL. A Stream keeps\n"
     "its Session alive. Use it as a context manager, or call close()."},
    {0, NULL},
};

PyType_Spec shmipcpy_stream_spec = {
    .name = "shmipc.Stream",
    .basicsize = sizeof(StreamObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = stream_slots,
};
