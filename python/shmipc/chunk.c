/*
 * chunk.c - shmipc.Chunk (received bytes, in place in shared memory, valid until released)
 * and the window that Stream.reserve() exports as a writable memoryview. The lifetime rules are
 * at the top of stream.c.
 *
 * Owns: the Chunk and window types, their buffer exports and their generation checks.
 * May call: module.h's helpers and stream.c's generation helpers (shmipcpy_maybe_release).
 */
#include "module.h"

#include <string.h>

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

PyObject *shmipcpy_chunk_new(module_state *ms, StreamObject *stream, const void *data, size_t len)
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
        shmipcpy_stream_maybe_release(s);
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
