/*
 * serve_asgi.c - shmipc._serve.ASGISend: the send() of one in-process ASGI http request
 * (shmipc/serve/inprocess.py, ASGIRoute), in C. It checks http.response.start and
 * http.response.body as the worker's adapter does (shmipc/serve/asgi.py), keeps the app's
 * fields without the hop-by-hop ones, collects the body, and when the last body message comes
 * hands the whole answer to the request's PendingResponse (its send(status, fields, body)).
 * send() returns an awaitable that is already done: the app's `await send(...)` never
 * suspends. Per request this replaces the Python of _Http.send/_start/_collect/result, the
 * larger part of what the in-process adapter added to the native handler's cost.
 *
 * Owns: the ASGISend type and its done awaitable. May call: CPython; serve_wsgi.c's
 * shmipcpy_serve_server_fields(). The PendingResponse is reached through its Python method.
 */
#include "serve_module.h"

#include <stddef.h>
#include <string.h>
#include <strings.h>
#include <structmember.h>

/* ---- an awaitable that is already done (None) ---- */

typedef struct {
    PyObject_HEAD
} done_obj;

static PyObject *done_await(PyObject *self)
{
    return Py_NewRef(self);
}

static PyObject *done_next(PyObject *self)
{
    (void)self;
    return NULL; /* no exception set: StopIteration(None), so `await` gives None */
}

static PyObject *done_send(PyObject *self, PyObject *value)
{
    (void)self;
    (void)value;
    PyErr_SetNone(PyExc_StopIteration);
    return NULL;
}

static PyObject *done_throw(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "throw() takes an exception");
        return NULL;
    }
    PyObject *exc = args[0];
    if (PyExceptionClass_Check(exc))
        PyErr_SetObject(exc, nargs > 1 ? args[1] : Py_None);
    else if (PyExceptionInstance_Check(exc))
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    else
        PyErr_SetString(PyExc_TypeError,
                        "exceptions must be classes or instances deriving from BaseException");
    return NULL;
}

static PyObject *done_close(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    Py_RETURN_NONE;
}

static PyMethodDef done_methods[] = {
    {"send", done_send, METH_O, NULL},
    {"throw", (PyCFunction)(void (*)(void))done_throw, METH_FASTCALL, NULL},
    {"close", done_close, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot done_slots[] = {
    {Py_am_await, done_await},
    {Py_tp_iter, done_await},
    {Py_tp_iternext, done_next},
    {Py_tp_methods, done_methods},
    {Py_tp_doc, "An awaitable that is done (ASGISend.send's)."},
    {0, NULL},
};

static PyType_Spec done_spec = {
    .name = "shmipc._serve._Done",
    .basicsize = sizeof(done_obj),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = done_slots,
};

static PyObject *the_done; /* the one instance, made at import; immortal for the process */

/* Interned keys, made at import (one interpreter: _serve is single-phase for the server's
 * threads' sake, as _shmipc is). */
static PyObject *k_type, *k_status, *k_headers, *k_body, *k_more_body, *k_send;

/* ---- ASGISend ---- */

typedef struct {
    PyObject_HEAD PyObject *pending; /* the PendingResponse */
    PyObject *fields;                /* the app's (bytes, bytes) fields kept, after start */
    PyObject *chunks;                /* the body's pieces (bytes), or NULL */
    PyObject *on_complete;           /* called once the response is complete, or NULL */
    long long length;                /* the app's Content-Length, -1 for none */
    long long sent;                  /* body bytes taken */
    int status;
    char head;     /* the request is HEAD */
    char close;    /* the app said Connection: close */
    char started;  /* http.response.start was accepted */
    char complete; /* the last body message was taken (and the answer handed over) */
    PyObject *weak;
} asgi_send;

static int send_init(PyObject *o, PyObject *args, PyObject *kw)
{
    asgi_send *self = (asgi_send *)o;
    static char *kwlist[] = {"method", "pending", NULL};
    PyObject *method, *pending;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "UO:ASGISend", kwlist, &method, &pending))
        return -1;
    Py_XSETREF(self->pending, Py_NewRef(pending));
    Py_CLEAR(self->fields);
    Py_CLEAR(self->chunks);
    self->head = PyUnicode_CompareWithASCIIString(method, "HEAD") == 0;
    self->length = -1;
    self->sent = 0;
    self->status = 0;
    self->close = self->started = self->complete = 0;
    return 0;
}

static int send_traverse(PyObject *o, visitproc visit, void *arg)
{
    asgi_send *self = (asgi_send *)o;
    Py_VISIT(Py_TYPE(o));
    Py_VISIT(self->pending);
    Py_VISIT(self->fields);
    Py_VISIT(self->chunks);
    Py_VISIT(self->on_complete);
    return 0;
}

static int send_clear(PyObject *o)
{
    asgi_send *self = (asgi_send *)o;
    Py_CLEAR(self->pending);
    Py_CLEAR(self->fields);
    Py_CLEAR(self->chunks);
    Py_CLEAR(self->on_complete);
    return 0;
}

static void send_dealloc(PyObject *o)
{
    PyTypeObject *tp = Py_TYPE(o);
    PyObject_GC_UnTrack(o);
    if (((asgi_send *)o)->weak != NULL)
        PyObject_ClearWeakRefs(o);
    send_clear(o);
    tp->tp_free(o);
    Py_DECREF(tp);
}

/* 1xx, 204 and 304: no content, and no length to say. */
static int no_content(const asgi_send *self)
{
    return self->status < 200 || self->status == 204 || self->status == 304;
}

/* No body bytes go to the client. */
static int bodyless(const asgi_send *self)
{
    return self->head || no_content(self);
}

/* bytes or bytearray as bytes (a new reference); TypeError naming `what` otherwise. */
static PyObject *as_bytes(PyObject *v, const char *what)
{
    if (PyBytes_Check(v))
        return Py_NewRef(v);
    if (PyByteArray_Check(v))
        return PyBytes_FromStringAndSize(PyByteArray_AS_STRING(v), PyByteArray_GET_SIZE(v));
    PyErr_Format(PyExc_TypeError, "%s must be bytes, not %s", what, Py_TYPE(v)->tp_name);
    return NULL;
}

static int bytes_is(PyObject *b, const char *lower)
{
    size_t n = strlen(lower);
    return (size_t)PyBytes_GET_SIZE(b) == n && strncasecmp(PyBytes_AS_STRING(b), lower, n) == 0;
}

/* A Content-Length value: ASCII digits between white space, at most
 * SHMIPCPY_SERVE_MAX_LENGTH; else -1 (-2: digits, but more than that). */
static long long parse_length(PyObject *b)
{
    const char *p = PyBytes_AS_STRING(b), *e = p + PyBytes_GET_SIZE(b);
    while (p < e && (*p == ' ' || *p == '\t'))
        p++;
    while (e > p && (e[-1] == ' ' || e[-1] == '\t'))
        e--;
    if (p == e)
        return -1;
    unsigned long long v = 0;
    int big = 0;
    for (; p < e; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        if (!big && v > (SHMIPCPY_SERVE_MAX_LENGTH - (unsigned)(*p - '0')) / 10)
            big = 1;
        else if (!big)
            v = v * 10 + (unsigned)(*p - '0');
    }
    return big ? -2 : (long long)v;
}

static int contains_close(PyObject *b)
{
    const char *p = PyBytes_AS_STRING(b);
    Py_ssize_t n = PyBytes_GET_SIZE(b);
    for (Py_ssize_t i = 0; i + 5 <= n; i++)
        if (strncasecmp(p + i, "close", 5) == 0)
            return 1;
    return 0;
}

/* Which hop-by-hop field (HOP_*, serve_wsgi.c's list) `name` is, or -1. */
static int hop_index(PyObject *name)
{
    for (int i = 0; i < NHOP; i++)
        if (bytes_is(name, shmipcpy_serve_hop_names[i]))
            return i;
    return -1;
}

/*
 * http.response.start as the worker's adapter checks it: the status (an int, 200..599; a 1xx
 * head is no final answer), and the headers as (bytes, bytes) fields without the hop-by-hop
 * ones, of which Content-Length gives *length (-1 for none) and Connection: close *close.
 * 0 and *fields a new list, or -1 with an exception.
 */
static int parse_start(PyObject *message, int *code_out, PyObject **fields_out,
                       long long *length_out, int *close_out)
{
    PyObject *status = PyDict_GetItemWithError(message, k_status);
    if (status == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_KeyError, "status");
        return -1;
    }
    long code = PyLong_CheckExact(status) ? PyLong_AsLong(status) : -1;
    if (code == -1 && PyErr_Occurred())
        PyErr_Clear();
    if (code < 200 || code > 599) {
        PyErr_Format(PyExc_ValueError, "bad status %R", status);
        return -1;
    }
    PyObject *fields = PyList_New(0);
    if (fields == NULL)
        return -1;
    PyObject *headers = PyDict_GetItemWithError(message, k_headers);
    if (headers == NULL && PyErr_Occurred())
        goto fail;
    long long length = -1;
    int close = 0;
    if (headers != NULL) {
        PyObject *it = PyObject_GetIter(headers), *h;
        if (it == NULL)
            goto fail;
        while ((h = PyIter_Next(it)) != NULL) {
            PyObject *pair = PySequence_Tuple(h), *name = NULL, *value = NULL;
            Py_DECREF(h);
            int ok = pair != NULL;
            if (ok && PyTuple_GET_SIZE(pair) != 2) {
                PyErr_Format(PyExc_ValueError,
                             "a header must be a (name, value) pair, not %zd items",
                             PyTuple_GET_SIZE(pair));
                ok = 0;
            }
            ok = ok && (name = as_bytes(PyTuple_GET_ITEM(pair, 0), "a header name")) != NULL &&
                 (value = as_bytes(PyTuple_GET_ITEM(pair, 1), "a header value")) != NULL;
            Py_XDECREF(pair);
            int hop = ok ? hop_index(name) : -1;
            if (hop >= 0) {
                if (hop == HOP_CONTENT_LENGTH) {
                    length = parse_length(value);
                    if (length < 0) {
                        PyErr_Format(PyExc_ValueError,
                                     length == -2 ? SHMIPCPY_SERVE_TOO_LONG
                                                  : "bad Content-Length %R",
                                     value);
                        ok = 0;
                    }
                } else if (hop == HOP_CONNECTION && contains_close(value)) {
                    close = 1;
                }
            } else if (ok) {
                PyObject *t = PyTuple_Pack(2, name, value);
                ok = t != NULL && PyList_Append(fields, t) == 0;
                Py_XDECREF(t);
            }
            Py_XDECREF(name);
            Py_XDECREF(value);
            if (!ok) {
                Py_DECREF(it);
                goto fail;
            }
        }
        Py_DECREF(it);
        if (PyErr_Occurred())
            goto fail;
    }
    *code_out = (int)code;
    *fields_out = fields;
    *length_out = length;
    *close_out = close;
    return 0;
fail:
    Py_DECREF(fields);
    return -1;
}

static int take_start(asgi_send *self, PyObject *message)
{
    PyObject *fields;
    long long length;
    int code, close;
    if (parse_start(message, &code, &fields, &length, &close) < 0)
        return -1;
    Py_XSETREF(self->fields, fields);
    self->status = code;
    self->length = length;
    self->close = (char)close;
    self->started = 1;
    return 0;
}

/* asgi_start(message) -> (status, fields, close, content_length or None): parse_start for the
 * worker's adapter (shmipc/serve/asgi.py), which sends the response itself. */
PyObject *shmipcpy_serve_py_asgi_start(PyObject *module, PyObject *message)
{
    (void)module;
    if (!PyDict_Check(message)) {
        PyErr_Format(PyExc_TypeError, "an ASGI message must be a dict, not %s",
                     Py_TYPE(message)->tp_name);
        return NULL;
    }
    if (k_status == NULL) { /* the module's init interns them first */
        PyErr_SetString(PyExc_RuntimeError, "shmipc._serve is not initialized");
        return NULL;
    }
    PyObject *fields;
    long long length;
    int code, close;
    if (parse_start(message, &code, &fields, &length, &close) < 0)
        return NULL;
    PyObject *len = length >= 0 ? PyLong_FromLongLong(length) : Py_NewRef(Py_None);
    if (len == NULL) {
        Py_DECREF(fields);
        return NULL;
    }
    return Py_BuildValue("(iNON)", code, fields, close ? Py_True : Py_False, len);
}

/* The whole answer to the PendingResponse. */
static int deliver(asgi_send *self)
{
    PyObject *fields = shmipcpy_serve_server_fields(self->fields, self->close);
    if (fields == NULL)
        return -1;
    /* HEAD: GET's length (the app's own, else the bytes it gave), said to the server. */
    if (self->head && !no_content(self) &&
        shmipcpy_serve_head_length(
            fields, (unsigned long long)(self->length >= 0 ? self->length : self->sent)) < 0) {
        Py_DECREF(fields);
        return -1;
    }
    PyObject *body;
    Py_ssize_t n = self->chunks != NULL ? PyList_GET_SIZE(self->chunks) : 0;
    if (n == 0) {
        body = PyBytes_FromStringAndSize(NULL, 0);
    } else if (n == 1) {
        body = Py_NewRef(PyList_GET_ITEM(self->chunks, 0));
    } else {
        body = shmipcpy_serve_join(self->chunks);
    }
    PyObject *status = body != NULL ? PyLong_FromLong(self->status) : NULL;
    PyObject *r = NULL;
    if (status != NULL) {
        PyObject *args[4] = {self->pending, status, fields, body};
        r = PyObject_VectorcallMethod(k_send, args, 4, NULL);
    }
    Py_XDECREF(status);
    Py_XDECREF(body);
    Py_DECREF(fields);
    Py_CLEAR(self->chunks);
    Py_XDECREF(r);
    return r != NULL ? 0 : -1;
}

static int take_body(asgi_send *self, PyObject *message)
{
    PyObject *body = PyDict_GetItemWithError(message, k_body);
    if (body == NULL && PyErr_Occurred())
        return -1;
    Py_buffer view = {0};
    PyObject *copy = NULL; /* a memoryview's bytes */
    if (body != NULL) {
        if (!PyBytes_Check(body) && !PyByteArray_Check(body) && !PyMemoryView_Check(body)) {
            PyErr_Format(PyExc_TypeError, "the body must be bytes, not %s", Py_TYPE(body)->tp_name);
            return -1;
        }
        /* A strided view has no simple buffer (BufferError): its bytes, in order, as the pool's
         * worker sends them (asgi.py). */
        if (PyMemoryView_Check(body) && (body = copy = PyBytes_FromObject(body)) == NULL)
            return -1;
        if (PyObject_GetBuffer(body, &view, PyBUF_SIMPLE) < 0) {
            Py_XDECREF(copy);
            return -1;
        }
    }
    PyObject *more_o = PyDict_GetItemWithError(message, k_more_body);
    int more = 0;
    if (more_o == NULL && PyErr_Occurred())
        goto fail;
    if (more_o != NULL && (more = PyObject_IsTrue(more_o)) < 0)
        goto fail;
    if (view.len > 0 && !bodyless(self)) {
        if (self->length >= 0 && self->sent + view.len > self->length) {
            PyErr_Format(PyExc_RuntimeError, "the app sent more than its Content-Length of %lld",
                         self->length);
            goto fail;
        }
        PyObject *piece =
            PyBytes_Check(body) ? Py_NewRef(body) : PyBytes_FromStringAndSize(view.buf, view.len);
        if (piece == NULL)
            goto fail;
        if (self->chunks == NULL && (self->chunks = PyList_New(0)) == NULL) {
            Py_DECREF(piece);
            goto fail;
        }
        int rc = PyList_Append(self->chunks, piece);
        Py_DECREF(piece);
        if (rc < 0)
            goto fail;
        self->sent += view.len;
    } else if (view.len > 0 && self->head && !no_content(self)) {
        self->sent += view.len; /* counted, not kept: HEAD's length is what GET's would be */
    }
    if (view.obj != NULL)
        PyBuffer_Release(&view);
    Py_XDECREF(copy);
    if (more)
        return 0;
    if (self->length >= 0 && self->sent < self->length && !bodyless(self)) {
        PyErr_Format(PyExc_RuntimeError, "the app sent %lld bytes of its Content-Length of %lld",
                     self->sent, self->length);
        return -1;
    }
    self->complete = 1;
    int rc = deliver(self);
    if (self->on_complete != NULL) {
        PyObject *cb = self->on_complete;
        self->on_complete = NULL;
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyObject *r = PyObject_CallNoArgs(cb);
        if (r == NULL)
            PyErr_WriteUnraisable(cb);
        Py_DECREF(cb);
        Py_XDECREF(r);
        PyErr_Restore(et, ev, tb);
    }
    return rc;
fail:
    if (view.obj != NULL)
        PyBuffer_Release(&view);
    Py_XDECREF(copy);
    return -1;
}

/* send(message) -> an awaitable already done; raises for a message the protocol refuses. */
static PyObject *send_send(PyObject *o, PyObject *message)
{
    asgi_send *self = (asgi_send *)o;
    if (self->pending == NULL) {
        /* Made by __new__ without __init__, or cleared by the collector (a cycle's finalizer
         * calling it): no answer to hand over. */
        PyErr_SetString(PyExc_RuntimeError, "this ASGISend has no PendingResponse");
        return NULL;
    }
    if (!PyDict_Check(message)) {
        PyErr_Format(PyExc_TypeError, "an ASGI message must be a dict, not %s",
                     Py_TYPE(message)->tp_name);
        return NULL;
    }
    PyObject *typ = PyDict_GetItemWithError(message, k_type);
    if (typ == NULL && PyErr_Occurred())
        return NULL;
    if (typ == NULL)
        typ = Py_None;
    if (self->complete) {
        PyErr_Format(PyExc_RuntimeError, "%R sent after the response was complete", typ);
        return NULL;
    }
    int rc;
    if (PyUnicode_Check(typ) && PyUnicode_CompareWithASCIIString(typ, "http.response.start") == 0) {
        if (self->started) {
            PyErr_SetString(PyExc_RuntimeError, "http.response.start sent twice");
            return NULL;
        }
        rc = take_start(self, message);
    } else if (PyUnicode_Check(typ) &&
               PyUnicode_CompareWithASCIIString(typ, "http.response.body") == 0) {
        if (!self->started) {
            PyErr_SetString(PyExc_RuntimeError, "http.response.body before http.response.start");
            return NULL;
        }
        rc = take_body(self, message);
    } else {
        PyErr_Format(PyExc_ValueError, "unexpected ASGI message type %R for an http scope", typ);
        return NULL;
    }
    return rc < 0 ? NULL : Py_NewRef(the_done);
}

static PyObject *get_on_complete(PyObject *o, void *closure)
{
    (void)closure;
    asgi_send *self = (asgi_send *)o;
    return Py_NewRef(self->on_complete != NULL ? self->on_complete : Py_None);
}

static int set_on_complete(PyObject *o, PyObject *value, void *closure)
{
    (void)closure;
    asgi_send *self = (asgi_send *)o;
    if (value == NULL || value == Py_None)
        Py_CLEAR(self->on_complete);
    else
        Py_XSETREF(self->on_complete, Py_NewRef(value));
    return 0;
}

static PyObject *get_flag(PyObject *o, void *closure)
{
    asgi_send *self = (asgi_send *)o;
    return PyBool_FromLong(closure == NULL ? self->complete : self->started);
}

static PyMethodDef send_methods[] = {
    {"send", send_send, METH_O,
     "send(message) -> awaitable\n\nThe app's send(): checks the message, keeps the response "
     "and, at the last body message, hands the whole answer to the PendingResponse. The "
     "awaitable returned is already done."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef send_getset[] = {
    {"complete", get_flag, NULL, "The last body message was taken.", NULL},
    {"started", get_flag, NULL, "http.response.start was taken.", (void *)1},
    {"on_complete", get_on_complete, set_on_complete,
     "Called with no arguments once the response is complete (then cleared); None.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef send_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(asgi_send, weak), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot send_slots[] = {
    {Py_tp_init, send_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_traverse, send_traverse},
    {Py_tp_clear, send_clear},
    {Py_tp_dealloc, send_dealloc},
    {Py_tp_methods, send_methods},
    {Py_tp_getset, send_getset},
    {Py_tp_members, send_members},
    {Py_tp_doc, "ASGISend(method, pending): the send() of one in-process ASGI http request."},
    {0, NULL},
};

static PyType_Spec send_spec = {
    .name = "shmipc._serve.ASGISend",
    .basicsize = sizeof(asgi_send),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = send_slots,
};

int shmipcpy_serve_add_asgi(PyObject *module)
{
    if (k_type == NULL) {
        k_type = PyUnicode_InternFromString("type");
        k_status = PyUnicode_InternFromString("status");
        k_headers = PyUnicode_InternFromString("headers");
        k_body = PyUnicode_InternFromString("body");
        k_more_body = PyUnicode_InternFromString("more_body");
        k_send = PyUnicode_InternFromString("send");
        if (k_type == NULL || k_status == NULL || k_headers == NULL || k_body == NULL ||
            k_more_body == NULL || k_send == NULL)
            return -1;
    }
    PyObject *done_type = PyType_FromModuleAndSpec(module, &done_spec, NULL);
    if (done_type == NULL)
        return -1;
    if (the_done == NULL) {
        the_done = (PyObject *)PyObject_New(done_obj, (PyTypeObject *)done_type);
        if (the_done == NULL) {
            Py_DECREF(done_type);
            return -1;
        }
    }
    Py_DECREF(done_type);
    PyObject *t = PyType_FromModuleAndSpec(module, &send_spec, NULL);
    if (t == NULL)
        return -1;
    int rc = PyModule_AddType(module, (PyTypeObject *)t);
    Py_DECREF(t);
    return rc;
}
