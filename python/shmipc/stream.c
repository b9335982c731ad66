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
 */
#include "module.h"

#include <stdlib.h>
#include <string.h>

#include <structmember.h>

/* Returned by the read helpers when a Python exception is set (C codes are <= 0). */
#define RAISED 1

/* Writes at least this large copy with the GIL released. */
#define WRITE_NOGIL_BYTES (256 * 1024)

typedef struct {
    PyObject_HEAD StreamObject *stream;
    char *data;
    Py_ssize_t len;
    uint64_t wgen;
    Py_ssize_t exports;
} WindowObject;

static module_state *stream_state(StreamObject *self)
{
    return shmipcpy_state_of_type(Py_TYPE(self));
}

/* The handle, or NULL with ClosedError (closed) or RuntimeError (another thread is in it). */
static shmipc_stream *usable(StreamObject *self)
{
    if (self->st == NULL || self->close_pending) {
        shmipcpy_raise_closed(stream_state(self), "stream");
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
static int leave(StreamObject *self)
{
    self->busy = 0;
    if (!self->close_pending)
        return 0;
    self->close_pending = 0;
    shmipc_stream *h = self->st;
    self->st = NULL;
    shmipc_stream_close(h);
    shmipcpy_raise_closed(stream_state(self), "stream");
    return -1;
}

/* Gives consumed slices back when no Chunk points into them and no other thread reads. */
static void maybe_release(StreamObject *self)
{
    if (self->st != NULL && !self->busy && !self->close_pending && self->live == 0 &&
        self->consumed) {
        self->consumed = 0;
        shmipc_stream_release(self->st);
    }
}

/* Starts a new Chunk and window generation: every older Chunk and window is invalid. */
static void invalidate(StreamObject *self)
{
    self->gen++;
    self->live = 0;
    self->last_exact = NULL;
    self->wgen++;
}

static int refuse_chunk_exports(StreamObject *self, const char *what)
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

static int refuse_exports(StreamObject *self, const char *what)
{
    if (refuse_chunk_exports(self, what) < 0)
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

static int refuse_window(StreamObject *self, const char *what)
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
/* Chunk                                                                                    */
/* ---------------------------------------------------------------------------------------- */

static int chunk_valid(ChunkObject *self)
{
    return !self->released && (self->stream == NULL || self->gen == self->stream->gen);
}

static int chunk_check(ChunkObject *self)
{
    if (chunk_valid(self))
        return 0;
    module_state *st = shmipcpy_state_of_type(Py_TYPE(self));
    PyObject *exc = PyObject_CallFunction(st->released_error, "is", -SHMIPC_ECLOSED,
                                          "Chunk: released (by Chunk.release(), or by "
                                          "Stream.release() or Stream.close())");
    if (exc != NULL) {
        PyObject *code = PyLong_FromLong(SHMIPC_ECLOSED);
        PyObject *name = PyUnicode_FromString(shmipc_errname(SHMIPC_ECLOSED));
        if (code != NULL && name != NULL && PyObject_SetAttrString(exc, "code", code) == 0 &&
            PyObject_SetAttrString(exc, "name", name) == 0)
            PyErr_SetObject(st->released_error, exc);
        Py_XDECREF(code);
        Py_XDECREF(name);
        Py_DECREF(exc);
    }
    return -1;
}

static PyObject *chunk_new(module_state *ms, StreamObject *stream, const void *data, size_t len)
{
    ChunkObject *c = PyObject_New(ChunkObject, ms->chunk_type);
    if (c == NULL)
        return NULL;
    c->stream = NULL;
    c->data = len ? data : "";
    c->len = (Py_ssize_t)len;
    c->gen = 0;
    c->released = 0;
    c->owned = 0;
    c->exports = 0;
    if (stream != NULL && len > 0) {
        c->stream = (StreamObject *)Py_NewRef(stream);
        c->gen = stream->gen;
        stream->live++;
    }
    return (PyObject *)c;
}

/* The Chunk stops pointing into library memory; the stream may release its slices. */
static void chunk_drop(ChunkObject *self)
{
    StreamObject *s = self->stream;
    if (!self->released && s != NULL && !self->owned && self->gen == s->gen) {
        s->live--;
        if (s->last_exact == self)
            s->last_exact = NULL;
        maybe_release(s);
    }
    self->released = 1;
}

static void chunk_dealloc(ChunkObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    chunk_drop(self);
    if (self->owned)
        PyMem_Free((void *)self->data);
    Py_XDECREF(self->stream);
    PyObject_Free(self);
    Py_DECREF(tp);
}

static int chunk_getbuffer(ChunkObject *self, Py_buffer *view, int flags)
{
    if (chunk_check(self) < 0)
        return -1;
    if (PyBuffer_FillInfo(view, (PyObject *)self, (void *)self->data, self->len, 1, flags) < 0)
        return -1;
    self->exports++;
    if (self->stream != NULL)
        self->stream->exports++;
    return 0;
}

static void chunk_releasebuffer(ChunkObject *self, Py_buffer *view)
{
    (void)view;
    self->exports--;
    /* A generation never changes while its Chunks are exported: release refuses. */
    if (self->stream != NULL && self->gen == self->stream->gen)
        self->stream->exports--;
}

static Py_ssize_t chunk_length(ChunkObject *self)
{
    if (chunk_check(self) < 0)
        return -1;
    return self->len;
}

static PyObject *chunk_release(ChunkObject *self, PyObject *unused)
{
    (void)unused;
    if (self->exports > 0) {
        PyErr_Format(PyExc_BufferError,
                     "cannot release a Chunk while %zd memoryview(s) of it are alive",
                     self->exports);
        return NULL;
    }
    chunk_drop(self);
    Py_RETURN_NONE;
}

static PyObject *chunk_enter(ChunkObject *self, PyObject *unused)
{
    (void)unused;
    if (chunk_check(self) < 0)
        return NULL;
    return Py_NewRef(self);
}

static PyObject *chunk_exit(ChunkObject *self, PyObject *args)
{
    (void)args;
    return chunk_release(self, NULL);
}

static PyObject *chunk_tobytes(ChunkObject *self, PyObject *unused)
{
    (void)unused;
    if (chunk_check(self) < 0)
        return NULL;
    return PyBytes_FromStringAndSize(self->data, self->len);
}

static PyObject *chunk_get_released(ChunkObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(!chunk_valid(self));
}

static PyObject *chunk_richcompare(ChunkObject *self, PyObject *other, int op)
{
    Py_buffer b;
    if (op != Py_EQ && op != Py_NE)
        Py_RETURN_NOTIMPLEMENTED;
    if (chunk_check(self) < 0)
        return NULL;
    if (PyObject_GetBuffer(other, &b, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    int eq = b.len == self->len && memcmp(b.buf, self->data, (size_t)self->len) == 0;
    PyBuffer_Release(&b);
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

static PyObject *chunk_repr(ChunkObject *self)
{
    if (!chunk_valid(self))
        return PyUnicode_FromString("<shmipc.Chunk released>");
    return PyUnicode_FromFormat("<shmipc.Chunk len=%zd%s>", self->len,
                                self->owned ? " copied" : "");
}

static PyMethodDef chunk_methods[] = {
    {"release", (PyCFunction)chunk_release, METH_NOARGS,
     "release() -> None\n\n"
     "Give the bytes back: the Chunk becomes invalid (every later use raises ReleasedError)\n"
     "and, once no other Chunk of the stream is alive, the stream's slices return to shared\n"
     "memory. Raises BufferError while a memoryview of the Chunk is alive. Safe to call twice."},
    {"tobytes", (PyCFunction)chunk_tobytes, METH_NOARGS,
     "tobytes() -> bytes\n\nA copy of the bytes (as bytes(chunk))."},
    {"__enter__", (PyCFunction)chunk_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)chunk_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef chunk_getset[] = {
    {"released", (getter)chunk_get_released, NULL,
     "True once the Chunk was released (directly, or by its stream's release() or close()).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot chunk_slots[] = {
    {Py_tp_dealloc, chunk_dealloc},
    {Py_tp_repr, chunk_repr},
    {Py_tp_methods, chunk_methods},
    {Py_tp_getset, chunk_getset},
    {Py_tp_richcompare, chunk_richcompare},
    {Py_tp_hash, PyObject_HashNotImplemented},
    {Py_sq_length, chunk_length},
    {Py_bf_getbuffer, chunk_getbuffer},
    {Py_bf_releasebuffer, chunk_releasebuffer},
    {Py_tp_doc,
     "Received bytes, in place in shared memory (zero copy), from Stream.read_chunk() or\n"
     "Stream.read_exact_bytes(). Use it as a bytes-like object: memoryview(chunk),\n"
     "bytes(chunk), len(chunk), chunk == b'...', or pass it to anything that takes a buffer.\n\n"
     "Lifetime: valid until chunk.release() (or `with chunk:`), stream.release() or\n"
     "stream.close(); then every use raises ReleasedError. The stream gives its slices back\n"
     "to shared memory when no Chunk pointing into them is alive, so release Chunks (or drop\n"
     "them) promptly. While a memoryview of a Chunk is alive, releasing it or closing its\n"
     "stream raises BufferError.\n\n"
     "An empty Chunk means end of stream."},
    {0, NULL},
};

PyType_Spec shmipcpy_chunk_spec = {
    .name = "shmipc.Chunk",
    .basicsize = sizeof(ChunkObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = chunk_slots,
};

/* ---------------------------------------------------------------------------------------- */
/* The reserve() window                                                                     */
/* ---------------------------------------------------------------------------------------- */

static void window_dealloc(WindowObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    Py_XDECREF(self->stream);
    PyObject_Free(self);
    Py_DECREF(tp);
}

static int window_getbuffer(WindowObject *self, Py_buffer *view, int flags)
{
    StreamObject *s = self->stream;
    if (s->st == NULL || s->close_pending || self->wgen != s->wgen) {
        PyErr_SetString(PyExc_ValueError,
                        "reserve() window: finished (by commit, write, reserve, flush or close)");
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->data, self->len, 0, flags) < 0)
        return -1;
    self->exports++;
    s->wexports++;
    return 0;
}

static void window_releasebuffer(WindowObject *self, Py_buffer *view)
{
    (void)view;
    self->exports--;
    if (self->wgen == self->stream->wgen)
        self->stream->wexports--;
}

static PyType_Slot window_slots[] = {
    {Py_tp_dealloc, window_dealloc},
    {Py_bf_getbuffer, window_getbuffer},
    {Py_bf_releasebuffer, window_releasebuffer},
    {Py_tp_doc, "The shared-memory window behind the memoryview that Stream.reserve() returns."},
    {0, NULL},
};

PyType_Spec shmipcpy_window_spec = {
    .name = "shmipc.ReserveWindow",
    .basicsize = sizeof(WindowObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = window_slots,
};

/* ---------------------------------------------------------------------------------------- */
/* Stream: reading                                                                          */
/* ---------------------------------------------------------------------------------------- */

/* READ_FORWARD: shmipc_stream_forward() onto another stream (or the same one). */
enum read_kind { READ_CHUNK, READ_EXACT, READ_FORWARD };

/*
 * The last read_exact_bytes() may have returned a stream-owned copy that the next read
 * reuses: before reading, a Chunk still holding it gets its own copy of the bytes.
 */
static int detach_exact(StreamObject *self)
{
    ChunkObject *c = self->last_exact;
    if (c->exports > 0) {
        PyErr_SetString(PyExc_BufferError,
                        "a memoryview of the Chunk from the last read_exact_bytes() is alive: "
                        "release it before the next read (its bytes may be in a buffer the "
                        "next read reuses)");
        return -1;
    }
    char *copy = PyMem_Malloc(c->len ? (size_t)c->len : 1);
    if (copy == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(copy, c->data, (size_t)c->len);
    c->data = copy;
    c->owned = 1;
    self->last_exact = NULL;
    self->live--;
    return 0;
}

static int read_call(shmipc_stream *h, enum read_kind kind, size_t n, int flags, shmipc_stream *dst,
                     const void **p, size_t *len)
{
    if (kind == READ_FORWARD)
        return shmipc_stream_forward(dst, h, n, flags);
    if (kind == READ_CHUNK)
        return shmipc_stream_read_chunk(h, n, p, len, flags);
    *len = n;
    return shmipc_stream_read_exact_bytes(h, n, p, flags);
}

/*
 * One read with the Python rules: non-blocking, or waiting up to the stream's read timeout
 * in slices with the GIL released, checking for signals between slices. Returns 0 (*p, *len
 * set), SHMIPC_EEOF, SHMIPC_EAGAIN (non-blocking only), or RAISED.
 */
static int do_read(StreamObject *self, enum read_kind kind, size_t n, int nonblock,
                   shmipc_stream *dst, const void **p, size_t *len)
{
    module_state *ms = stream_state(self);
    shmipc_stream *h = usable(self);
    int rc;
    if (h == NULL)
        return RAISED;
    if (self->last_exact != NULL && detach_exact(self) < 0)
        return RAISED;
    /* Data already here: read it without giving up the GIL. */
    if (nonblock || shmipc_stream_available(h) >= (kind == READ_CHUNK ? 1 : n)) {
        rc = read_call(h, kind, n, SHMIPC_NONBLOCK, dst, p, len);
        if (nonblock || rc != SHMIPC_EAGAIN)
            goto done;
    }
    uint64_t deadline = self->read_ms ? shmipcpy_now_ms() + self->read_ms : 0;
    for (;;) {
        int slice = shmipcpy_slice_ms(deadline);
        if (slice == 0) {
            char msg[96];
            PyOS_snprintf(msg, sizeof msg, "stream %u: read timed out after %.3f s",
                          (unsigned)self->id, self->read_ms / 1000.0);
            maybe_release(self);
            shmipcpy_raise_code(ms, SHMIPC_ETIMEDOUT, msg);
            return RAISED;
        }
        if ((uint32_t)slice != self->c_read_ms) {
            shmipc_stream_set_timeout_ms(h, SHMIPC_TIMEOUT_READ, (uint32_t)slice);
            self->c_read_ms = (uint32_t)slice;
        }
        self->busy = 1;
        Py_BEGIN_ALLOW_THREADS rc = read_call(h, kind, n, 0, dst, p, len);
        Py_END_ALLOW_THREADS if (leave(self) < 0) return RAISED;
        if (rc != SHMIPC_ETIMEDOUT && rc != SHMIPC_EINTR)
            break;
        if (PyErr_CheckSignals() < 0) {
            maybe_release(self);
            return RAISED;
        }
        if (self->st == NULL || self->close_pending) {
            /* A signal handler closed the stream. */
            shmipcpy_raise_closed(ms, "stream");
            return RAISED;
        }
    }
done:
    if (rc == 0) {
        self->consumed = 1;
        return 0;
    }
    maybe_release(self);
    if (rc == SHMIPC_EEOF || rc == SHMIPC_EAGAIN)
        return rc;
    shmipcpy_raise_last(ms, rc);
    return RAISED;
}

static int size_arg(PyObject *obj, const char *name, Py_ssize_t *out)
{
    if (obj == NULL)
        return 0;
    Py_ssize_t v = PyNumber_AsSsize_t(obj, PyExc_OverflowError);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 0) {
        PyErr_Format(PyExc_ValueError, "%s must be >= 0", name);
        return -1;
    }
    *out = v;
    return 0;
}

static PyObject *read_impl(StreamObject *self, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames, const char *fname, const char *argname,
                           enum read_kind kind, int copy)
{
    module_state *ms = stream_state(self);
    PyObject *arg = NULL;
    Py_ssize_t n = 0;
    int nonblock;
    const void *p;
    size_t len;
    if (shmipcpy_parse_args(fname, args, nargs, kwnames, argname, &arg, &nonblock) < 0 ||
        size_arg(arg, argname, &n) < 0)
        return NULL;
    if (kind == READ_EXACT && arg == NULL) {
        PyErr_Format(PyExc_TypeError, "%s() missing required argument 'n'", fname);
        return NULL;
    }
    if (kind == READ_EXACT && n == 0) {
        if (usable(self) == NULL)
            return NULL;
        return copy ? PyBytes_FromStringAndSize(NULL, 0) : chunk_new(ms, NULL, NULL, 0);
    }
    int rc = do_read(self, kind, (size_t)n, nonblock, NULL, &p, &len);
    if (rc == RAISED)
        return NULL;
    if (rc == SHMIPC_EAGAIN)
        Py_RETURN_NONE;
    if (rc == SHMIPC_EEOF) {
        if (kind == READ_EXACT)
            return shmipcpy_raise_last(ms, rc);
        return copy ? PyBytes_FromStringAndSize(NULL, 0) : chunk_new(ms, NULL, NULL, 0);
    }
    if (copy) {
        PyObject *b = PyBytes_FromStringAndSize(p, (Py_ssize_t)len);
        maybe_release(self);
        return b;
    }
    PyObject *c = chunk_new(ms, self, p, len);
    if (c == NULL) {
        maybe_release(self);
        return NULL;
    }
    if (kind == READ_EXACT)
        self->last_exact = (ChunkObject *)c;
    return c;
}

static PyObject *stream_read_chunk(StreamObject *self, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames)
{
    return read_impl(self, args, nargs, kwnames, "read_chunk", "max", READ_CHUNK, 0);
}

static PyObject *stream_read_exact_bytes(StreamObject *self, PyObject *const *args,
                                         Py_ssize_t nargs, PyObject *kwnames)
{
    return read_impl(self, args, nargs, kwnames, "read_exact_bytes", "n", READ_EXACT, 0);
}

static PyObject *stream_read(StreamObject *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames)
{
    return read_impl(self, args, nargs, kwnames, "read", "max", READ_CHUNK, 1);
}

static PyObject *stream_readexactly(StreamObject *self, PyObject *const *args, Py_ssize_t nargs,
                                    PyObject *kwnames)
{
    return read_impl(self, args, nargs, kwnames, "readexactly", "n", READ_EXACT, 1);
}

static PyObject *stream_release(StreamObject *self, PyObject *unused)
{
    (void)unused;
    shmipc_stream *h = usable(self);
    if (h == NULL || refuse_exports(self, "release") < 0)
        return NULL;
    invalidate(self);
    self->consumed = 0;
    shmipc_stream_release(h);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------- */
/* Stream: writing                                                                          */
/* ---------------------------------------------------------------------------------------- */

/*
 * forward(src, n=0, *, nonblock=False): the bytes src read and has not given back (it gives
 * them back once no Chunk of it is alive), then its next n unread bytes, go into this
 * stream's send buffer, as whole slices where they can (shmipc_stream_forward). Unless nothing
 * could move, every Chunk of src becomes invalid, as after src.release().
 */
static PyObject *stream_forward(StreamObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"src", "n", "nonblock", NULL};
    module_state *ms = stream_state(self);
    StreamObject *src;
    Py_ssize_t n = 0;
    int nonblock = 0;
    const void *p;
    size_t len;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!|n$p:forward", kwlist, ms->stream_type, &src,
                                     &n, &nonblock))
        return NULL;
    if (n < 0)
        return shmipcpy_raise_invalid(ms, "forward", "n must be >= 0");
    shmipc_stream *dst = usable(self);
    if (dst == NULL || refuse_window(self, "forward") < 0)
        return NULL;
    if ((src != self && usable(src) == NULL) || refuse_chunk_exports(src, "forward from") < 0)
        return NULL;
    /* Forwarding ends any reservation; while src waits, no other thread may use this one. */
    self->wgen++;
    if (src != self)
        self->busy = 1;
    int rc = do_read(src, READ_FORWARD, (size_t)n, nonblock, dst, &p, &len);
    /*
     * What src's Chunks pointed at may be in this stream's send buffer now (all of it, or a
     * part before a failure), and this stream may be closed below, freeing it: the Chunks
     * end here. Only "not there yet" and "ended first" are known to move nothing.
     */
    if (rc != SHMIPC_EAGAIN && rc != SHMIPC_EEOF) {
        invalidate(src);
        maybe_release(src); /* what was read and did not move goes back */
    }
    if (rc == RAISED) {
        /* The read's error is the one reported; a close of this stream that waited for the
         * forward still happens (raising over a set exception was a SystemError). */
        if (src != self) {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            if (leave(self) < 0)
                PyErr_Clear();
            PyErr_Restore(type, value, tb);
        }
        return NULL;
    }
    if (src != self && leave(self) < 0)
        return NULL;
    if (rc == SHMIPC_EAGAIN)
        Py_RETURN_NONE;
    if (rc == SHMIPC_EEOF)
        return shmipcpy_raise_last(ms, rc);
    Py_RETURN_TRUE;
}

static PyObject *stream_write(StreamObject *self, PyObject *data)
{
    shmipc_stream *h = usable(self);
    Py_buffer b;
    int rc;
    if (h == NULL || refuse_window(self, "write") < 0)
        return NULL;
    if (PyObject_GetBuffer(data, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    /* A write ends any reservation: the window's bytes may be where this data goes. */
    self->wgen++;
    if (b.len >= WRITE_NOGIL_BYTES) {
        self->busy = 1;
        Py_BEGIN_ALLOW_THREADS rc = shmipc_stream_write(h, b.buf, (size_t)b.len);
        Py_END_ALLOW_THREADS if (leave(self) < 0)
        {
            PyBuffer_Release(&b);
            return NULL;
        }
    } else {
        rc = shmipc_stream_write(h, b.buf, (size_t)b.len);
    }
    Py_ssize_t len = b.len;
    PyBuffer_Release(&b);
    if (rc < 0)
        return shmipcpy_raise_last(stream_state(self), rc);
    return PyLong_FromSsize_t(len);
}

static PyObject *stream_reserve(StreamObject *self, PyObject *arg)
{
    module_state *ms = stream_state(self);
    shmipc_stream *h = usable(self);
    Py_ssize_t n;
    void *p;
    if (h == NULL || refuse_window(self, "reserve") < 0)
        return NULL;
    if ((n = PyNumber_AsSsize_t(arg, PyExc_OverflowError)) == -1 && PyErr_Occurred())
        return NULL;
    if (n <= 0)
        return shmipcpy_raise_invalid(ms, "reserve", "need at least 1 byte");
    self->wgen++;
    int rc = shmipc_stream_reserve(h, (size_t)n, &p);
    if (rc < 0)
        return shmipcpy_raise_last(ms, rc);
    WindowObject *w = PyObject_New(WindowObject, ms->window_type);
    if (w == NULL)
        return NULL;
    w->stream = (StreamObject *)Py_NewRef(self);
    w->data = p;
    w->len = n;
    w->wgen = self->wgen;
    w->exports = 0;
    PyObject *view = PyMemoryView_FromObject((PyObject *)w);
    Py_DECREF(w);
    return view;
}

static PyObject *stream_commit(StreamObject *self, PyObject *arg)
{
    shmipc_stream *h = usable(self);
    Py_ssize_t n;
    if (h == NULL || refuse_window(self, "commit") < 0)
        return NULL;
    if ((n = PyNumber_AsSsize_t(arg, PyExc_OverflowError)) == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0)
        return shmipcpy_raise_invalid(stream_state(self), "commit", "n must be >= 0");
    int rc = shmipc_stream_commit(h, (size_t)n);
    if (rc < 0)
        return shmipcpy_raise_last(stream_state(self), rc);
    self->wgen++;
    Py_RETURN_NONE;
}

static PyObject *stream_flush(StreamObject *self, PyObject *unused)
{
    (void)unused;
    shmipc_stream *h = usable(self);
    int rc;
    if (h == NULL || refuse_window(self, "flush") < 0)
        return NULL;
    self->wgen++;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS rc = shmipc_stream_flush(h);
    Py_END_ALLOW_THREADS if (leave(self) < 0) return NULL;
    if (rc < 0)
        return shmipcpy_raise_last(stream_state(self), rc);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------- */
/* Stream: life                                                                             */
/* ---------------------------------------------------------------------------------------- */

PyObject *shmipcpy_stream_wrap(module_state *ms, shmipc_stream *h, PyObject *owner,
                               uint32_t read_ms, uint32_t write_ms)
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
    return (PyObject *)self;
}

shmipc_stream *shmipcpy_stream_detach(StreamObject *self)
{
    shmipc_stream *h = usable(self);
    if (h == NULL || refuse_exports(self, "put back") < 0)
        return NULL;
    /* The pool takes only streams with nothing left to release. */
    invalidate(self);
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

static PyObject *stream_close(StreamObject *self, PyObject *unused)
{
    (void)unused;
    if (self->st == NULL || self->close_pending)
        Py_RETURN_NONE;
    if (refuse_exports(self, "close") < 0)
        return NULL;
    invalidate(self);
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

static void stream_dealloc(StreamObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    /*
     * No Chunk or window is alive (each holds a reference), and no thread is inside. The
     * close may wait for the socket (a full queue), so it runs without the GIL.
     */
    if (self->st != NULL) {
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
    if (usable(self) == NULL)
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
    module_state *ms = stream_state(self);
    if (usable(self) == NULL)
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
    shmipc_stream *h = usable(self);
    if (h == NULL)
        return NULL;
    return PyLong_FromSize_t(shmipc_stream_available(h));
}

static PyObject *stream_get_session(StreamObject *self, void *closure)
{
    (void)closure;
    module_state *ms = stream_state(self);
    if (PyObject_TypeCheck(self->owner, ms->session_type))
        return Py_NewRef(self->owner);
    Py_RETURN_NONE;
}

static PyObject *timeout_value(uint32_t ms)
{
    if (ms == 0)
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
    if (shmipcpy_timeout_arg(stream_state(self), value, "read_timeout", 0, &ms) < 0)
        return -1;
    /* Applied per wait slice by do_read(); the handle is not touched here. */
    self->read_ms = ms < 0 ? 0 : (uint32_t)ms;
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
    if (shmipcpy_timeout_arg(stream_state(self), value, "write_timeout", 0, &ms) < 0 ||
        (h = usable(self)) == NULL)
        return -1;
    uint32_t v = ms < 0 ? 0 : (uint32_t)ms;
    int rc = shmipc_stream_set_timeout_ms(h, SHMIPC_TIMEOUT_WRITE, v);
    if (rc < 0) {
        shmipcpy_raise_last(stream_state(self), rc);
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
    "Waits up to read_timeout (None: forever) with the GIL released; Ctrl-C interrupts the\n"      \
    "wait within about 0.1 s. With nonblock=True it never waits and returns None when no\n"        \
    "data is there yet. "

static PyMethodDef stream_methods[] = {
    {"write", (PyCFunction)stream_write, METH_O,
     "write(data) -> int\n\n"
     "Append a bytes-like object to the send buffer (one copy, into shared memory) and return\n"
     "its length. Nothing is sent until flush(). Does not block."},
    {"reserve", (PyCFunction)stream_reserve, METH_O,
     "reserve(n) -> memoryview\n\n"
     "A writable memoryview of n bytes in shared memory at the end of the send buffer: write\n"
     "into it, release it, then commit(k) the first k bytes (zero copy):\n\n"
     "    with st.reserve(5) as buf:\n"
     "        buf[:] = b'hello'\n"
     "    st.commit(5)\n"
     "    st.flush()\n\n"
     "The view is valid until commit, write, the next reserve, flush or close; each of them\n"
     "raises BufferError while the view is alive."},
    {"commit", (PyCFunction)stream_commit, METH_O,
     "commit(n) -> None\n\nAdd the first n bytes of the reserved window to the send buffer."},
    {"flush", (PyCFunction)stream_flush, METH_NOARGS,
     "flush() -> None\n\n"
     "Send the send buffer as one message and wake the peer. 'Flushed' means enqueued, not\n"
     "read. Blocks only when the peer's queue is full (up to 100 ms or the write timeout,\n"
     "then shmipc.Error EQUEUEFULL) or the socket is; the GIL is released."},
    {"read_chunk", (PyCFunction)(void (*)(void))stream_read_chunk, METH_FASTCALL | METH_KEYWORDS,
     "read_chunk(max=0, *, nonblock=False) -> Chunk | None\n\n"
     "The next contiguous piece of received data, at most max bytes (0: no limit), as a\n"
     "zero-copy Chunk. At end of stream it returns an empty Chunk (falsy, like b'' from\n"
     "socket.recv). " READ_DOC_TAIL
     "Raises TimeoutError, PeerGoneError when the peer went away, ClosedError after close."},
    {"read_exact_bytes", (PyCFunction)(void (*)(void))stream_read_exact_bytes,
     METH_FASTCALL | METH_KEYWORDS,
     "read_exact_bytes(n, *, nonblock=False) -> Chunk | None\n\n"
     "Exactly n bytes as a Chunk: in place when they lie in one slice, else a stream-owned\n"
     "copy. Raises EndOfStreamError (an EOFError) when the stream ends before n bytes came;\n"
     "the bytes stay unread (see available). " READ_DOC_TAIL},
    {"read", (PyCFunction)(void (*)(void))stream_read, METH_FASTCALL | METH_KEYWORDS,
     "read(max=0, *, nonblock=False) -> bytes | None\n\n"
     "read_chunk() copied into bytes: b'' at end of stream, None when nonblock and no data."},
    {"readexactly", (PyCFunction)(void (*)(void))stream_readexactly, METH_FASTCALL | METH_KEYWORDS,
     "readexactly(n, *, nonblock=False) -> bytes | None\n\n"
     "read_exact_bytes() copied into bytes; EndOfStreamError when the stream ends first."},
    {"forward", (PyCFunction)(void (*)(void))stream_forward, METH_VARARGS | METH_KEYWORDS,
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
    {"release", (PyCFunction)stream_release, METH_NOARGS,
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
     "Read timeout in seconds, or None to wait forever (from the config by default).", NULL},
    {"write_timeout", (getter)stream_get_write_timeout, (setter)stream_set_write_timeout,
     "Write timeout in seconds (how long flush retries a full queue), or None.", NULL},
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
