/*
 * stream_io.c - the reading and writing methods of shmipc.Stream: read, read_chunk,
 * read_exact_bytes, readexactly, release, forward, write, reserve, commit and flush, each waiting
 * in slices with the GIL released. The lifetime rules are at the top of stream.c.
 *
 * Owns: the read paths (Chunks made from library memory, the read_exact_bytes copy) and the write
 * paths (the reserve window's generations).
 * May call: the public C API (shmipc_stream_*), module.h's helpers, stream.c's busy/shmipcpy_stream_usable and
 * generation helpers, chunk.c's Chunk maker.
 */
#include "module.h"

#include <string.h>

/* Returned by the read helpers when a Python exception is set (C codes are <= 0). */
#define RAISED 1

/* Writes at least this large copy with the GIL released. */
#define WRITE_NOGIL_BYTES (256 * 1024)

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
    module_state *ms = shmipcpy_stream_state(self);
    shmipc_stream *h = shmipcpy_stream_usable(self);
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
    if (self->read_ms == 0) {
        /* "Do not wait": one look in C's wait engine, which takes what is pending. */
        if (self->c_read_ms != 0) {
            shmipc_stream_set_timeout(h, SHMIPC_TIMEOUT_READ, 0);
            self->c_read_ms = 0;
        }
        self->busy = 1;
        Py_BEGIN_ALLOW_THREADS rc = read_call(h, kind, n, 0, dst, p, len);
        Py_END_ALLOW_THREADS if (shmipcpy_stream_leave(self) < 0) return RAISED;
        if (rc == SHMIPC_ETIMEDOUT || rc == SHMIPC_EINTR) {
            char msg[96];
            PyOS_snprintf(msg, sizeof msg,
                          "stream %u: read timed out (read_timeout 0: nothing pending)",
                          (unsigned)self->id);
            shmipcpy_stream_maybe_release(self);
            shmipcpy_raise_code(ms, SHMIPC_ETIMEDOUT, msg);
            return RAISED;
        }
        goto done;
    }
    uint64_t deadline = self->read_ms > 0 ? shmipcpy_now_ms() + (uint64_t)self->read_ms : 0;
    for (;;) {
        int slice = shmipcpy_slice_ms(deadline);
        if (slice == 0) {
            char msg[96];
            PyOS_snprintf(msg, sizeof msg, "stream %u: read timed out after %.3f s",
                          (unsigned)self->id, self->read_ms / 1000.0);
            shmipcpy_stream_maybe_release(self);
            shmipcpy_raise_code(ms, SHMIPC_ETIMEDOUT, msg);
            return RAISED;
        }
        if (slice != self->c_read_ms) {
            shmipc_stream_set_timeout(h, SHMIPC_TIMEOUT_READ, slice);
            self->c_read_ms = slice;
        }
        self->busy = 1;
        Py_BEGIN_ALLOW_THREADS rc = read_call(h, kind, n, 0, dst, p, len);
        Py_END_ALLOW_THREADS if (shmipcpy_stream_leave(self) < 0) return RAISED;
        if (rc != SHMIPC_ETIMEDOUT && rc != SHMIPC_EINTR)
            break;
        if (PyErr_CheckSignals() < 0) {
            shmipcpy_stream_maybe_release(self);
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
    shmipcpy_stream_maybe_release(self);
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
    module_state *ms = shmipcpy_stream_state(self);
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
        if (shmipcpy_stream_usable(self) == NULL)
            return NULL;
        return copy ? PyBytes_FromStringAndSize(NULL, 0) : shmipcpy_chunk_new(ms, NULL, NULL, 0);
    }
    int rc = do_read(self, kind, (size_t)n, nonblock, NULL, &p, &len);
    if (rc == RAISED)
        return NULL;
    if (rc == SHMIPC_EAGAIN)
        Py_RETURN_NONE;
    if (rc == SHMIPC_EEOF) {
        if (kind == READ_EXACT)
            return shmipcpy_raise_last(ms, rc);
        return copy ? PyBytes_FromStringAndSize(NULL, 0) : shmipcpy_chunk_new(ms, NULL, NULL, 0);
    }
    if (copy) {
        PyObject *b = PyBytes_FromStringAndSize(p, (Py_ssize_t)len);
        shmipcpy_stream_maybe_release(self);
        return b;
    }
    PyObject *c = shmipcpy_chunk_new(ms, self, p, len);
    if (c == NULL) {
        shmipcpy_stream_maybe_release(self);
        return NULL;
    }
    if (kind == READ_EXACT)
        self->last_exact = (ChunkObject *)c;
    return c;
}

PyObject *shmipcpy_stream_read_chunk(StreamObject *self, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames)
{
    return read_impl(self, args, nargs, kwnames, "read_chunk", "max", READ_CHUNK, 0);
}

PyObject *shmipcpy_stream_read_exact_bytes(StreamObject *self, PyObject *const *args,
                                           Py_ssize_t nargs, PyObject *kwnames)
{
    return read_impl(self, args, nargs, kwnames, "read_exact_bytes", "n", READ_EXACT, 0);
}

PyObject *shmipcpy_stream_read(StreamObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    return read_impl(self, args, nargs, kwnames, "read", "max", READ_CHUNK, 1);
}

PyObject *shmipcpy_stream_readexactly(StreamObject *self, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kwnames)
{
    return read_impl(self, args, nargs, kwnames, "readexactly", "n", READ_EXACT, 1);
}

PyObject *shmipcpy_stream_release(StreamObject *self, PyObject *unused)
{
    (void)unused;
    shmipc_stream *h = shmipcpy_stream_usable(self);
    if (h == NULL || shmipcpy_stream_refuse_exports(self, "release") < 0)
        return NULL;
    shmipcpy_stream_invalidate(self);
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
PyObject *shmipcpy_stream_forward(StreamObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"src", "n", "nonblock", NULL};
    module_state *ms = shmipcpy_stream_state(self);
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
    shmipc_stream *dst = shmipcpy_stream_usable(self);
    if (dst == NULL || shmipcpy_stream_refuse_window(self, "forward") < 0)
        return NULL;
    if ((src != self && shmipcpy_stream_usable(src) == NULL) ||
        shmipcpy_stream_refuse_chunk_exports(src, "forward from") < 0)
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
        shmipcpy_stream_invalidate(src);
        shmipcpy_stream_maybe_release(src); /* what was read and did not move goes back */
    }
    if (rc == RAISED) {
        /* The read's error is the one reported; a close of this stream that waited for the
         * forward still happens (raising over a set exception was a SystemError). */
        if (src != self) {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            if (shmipcpy_stream_leave(self) < 0)
                PyErr_Clear();
            PyErr_Restore(type, value, tb);
        }
        return NULL;
    }
    if (src != self && shmipcpy_stream_leave(self) < 0)
        return NULL;
    if (rc == SHMIPC_EAGAIN)
        Py_RETURN_NONE;
    if (rc == SHMIPC_EEOF)
        return shmipcpy_raise_last(ms, rc);
    Py_RETURN_TRUE;
}

PyObject *shmipcpy_stream_write(StreamObject *self, PyObject *data)
{
    shmipc_stream *h = shmipcpy_stream_usable(self);
    Py_buffer b;
    int rc;
    if (h == NULL || shmipcpy_stream_refuse_window(self, "write") < 0)
        return NULL;
    if (PyObject_GetBuffer(data, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    /* A write ends any reservation: the window's bytes may be where this data goes. */
    self->wgen++;
    /* With memory_wait any write may wait for the peer to free shared memory: without the
     * GIL, or every other thread (a signal handler too) would wait with it. */
    if (b.len >= WRITE_NOGIL_BYTES || self->memory_wait) {
        self->busy = 1;
        Py_BEGIN_ALLOW_THREADS rc = shmipc_stream_write(h, b.buf, (size_t)b.len);
        Py_END_ALLOW_THREADS if (shmipcpy_stream_leave(self) < 0)
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
        return shmipcpy_raise_last(shmipcpy_stream_state(self), rc);
    return PyLong_FromSsize_t(len);
}

PyObject *shmipcpy_stream_reserve(StreamObject *self, PyObject *arg)
{
    module_state *ms = shmipcpy_stream_state(self);
    shmipc_stream *h;
    Py_ssize_t n;
    void *p;
    /* n first: its __index__ may run code that closes the stream. */
    if ((n = PyNumber_AsSsize_t(arg, PyExc_OverflowError)) == -1 && PyErr_Occurred())
        return NULL;
    if ((h = shmipcpy_stream_usable(self)) == NULL ||
        shmipcpy_stream_refuse_window(self, "reserve") < 0)
        return NULL;
    if (n <= 0)
        return shmipcpy_raise_invalid(ms, "reserve", "need at least 1 byte");
    self->wgen++;
    int rc;
    if (self->memory_wait) { /* it may wait for shared memory: as write() */
        self->busy = 1;
        Py_BEGIN_ALLOW_THREADS rc = shmipc_stream_reserve(h, (size_t)n, &p);
        Py_END_ALLOW_THREADS if (shmipcpy_stream_leave(self) < 0) return NULL;
    } else {
        rc = shmipc_stream_reserve(h, (size_t)n, &p);
    }
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

PyObject *shmipcpy_stream_commit(StreamObject *self, PyObject *arg)
{
    shmipc_stream *h;
    Py_ssize_t n;
    /* n first: its __index__ may run code that closes the stream. */
    if ((n = PyNumber_AsSsize_t(arg, PyExc_OverflowError)) == -1 && PyErr_Occurred())
        return NULL;
    if ((h = shmipcpy_stream_usable(self)) == NULL ||
        shmipcpy_stream_refuse_window(self, "commit") < 0)
        return NULL;
    if (n < 0)
        return shmipcpy_raise_invalid(shmipcpy_stream_state(self), "commit", "n must be >= 0");
    int rc = shmipc_stream_commit(h, (size_t)n);
    if (rc < 0)
        return shmipcpy_raise_last(shmipcpy_stream_state(self), rc);
    self->wgen++;
    Py_RETURN_NONE;
}

PyObject *shmipcpy_stream_flush(StreamObject *self, PyObject *unused)
{
    (void)unused;
    shmipc_stream *h = shmipcpy_stream_usable(self);
    int rc;
    if (h == NULL || shmipcpy_stream_refuse_window(self, "flush") < 0)
        return NULL;
    self->wgen++;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS rc = shmipc_stream_flush(h);
    Py_END_ALLOW_THREADS if (shmipcpy_stream_leave(self) < 0) return NULL;
    if (rc < 0)
        return shmipcpy_raise_last(shmipcpy_stream_state(self), rc);
    Py_RETURN_NONE;
}
