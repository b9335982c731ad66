/*
 * serve_wsgi.c - shmipc._serve.WSGIResponse: the state of one WSGI response and PEP 3333's
 * start_response, in C, for both WSGI adapters (docs/serve.md): the shmipc-serve worker
 * (shmipc/serve/wsgi.py, whose subclass sends the head and body on its stream) and the
 * in-process route (shmipc/serve/inprocess.py, which uses write() and collect() here to gather
 * the response whole). Per request this replaces some 40 lines of Python (the checks of the
 * status and of each header, the hop-by-hop fields, the collecting of the body), the larger
 * part of an in-process WSGI request's cost.
 *
 * Owns: the WSGIResponse type (start_response, write, collect, _bodyless) and
 * response_fields(), the in-process server's filter of a response's fields.
 * May call: CPython; the module state (serve_module.h).
 */
#include "serve_module.h"

#include <stddef.h>
#include <string.h>
#include <strings.h>
#include <structmember.h>

/* Hop-by-hop fields (RFC 9110 §7.6.1) are the server's: PEP 3333 forbids them to an app, and
 * the server reconciles its own framing. Connection: close turns into the CLOSE flag. */
/* A field set to something: neither None nor NULL (a subclass may del a writable member). */
static int is_set(PyObject *x)
{
    return x != NULL && x != Py_None;
}

const char *const shmipcpy_serve_hop_names[NHOP] = {
    [HOP_CONNECTION] = "connection",
    [HOP_CONTENT_LENGTH] = "content-length",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
};

/* An ASCII lower-case name `lower` equal to str `s`, case aside (only ASCII letters fold). */
static int str_is(PyObject *s, const char *lower)
{
    size_t n = strlen(lower);
    if ((size_t)PyUnicode_GET_LENGTH(s) != n)
        return 0;
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    for (size_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, (Py_ssize_t)i);
        if (c >= 'A' && c <= 'Z')
            c += 32;
        if (c != (Py_UCS4)(unsigned char)lower[i])
            return 0;
    }
    return 1;
}

/* "close" anywhere in str `s`, case aside. */
static int has_close(PyObject *s)
{
    static const char word[] = "close";
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    for (Py_ssize_t i = 0; i + 5 <= n; i++) {
        Py_ssize_t k = 0;
        for (; k < 5; k++) {
            Py_UCS4 c = PyUnicode_READ(kind, data, i + k);
            if (c >= 'A' && c <= 'Z')
                c += 32;
            if (c != (Py_UCS4)word[k])
                break;
        }
        if (k == 5)
            return 1;
    }
    return 0;
}

/* A Content-Length value: ASCII digits between white space, at most
 * SHMIPCPY_SERVE_MAX_LENGTH; NULL (ValueError, saying which) otherwise. */
static PyObject *parse_length(PyObject *value)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(value), i = 0;
    int kind = PyUnicode_KIND(value);
    const void *data = PyUnicode_DATA(value);
    while (i < n && Py_UNICODE_ISSPACE(PyUnicode_READ(kind, data, i)))
        i++;
    while (n > i && Py_UNICODE_ISSPACE(PyUnicode_READ(kind, data, n - 1)))
        n--;
    unsigned long long v = 0;
    int ok = i < n, big = 0;
    for (; ok && i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < '0' || c > '9')
            ok = 0;
        else if (!big && v > (SHMIPCPY_SERVE_MAX_LENGTH - (c - '0')) / 10)
            big = 1; /* the digits are still checked: "99...9x" is not a length at all */
        else if (!big)
            v = v * 10 + (c - '0');
    }
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "bad Content-Length %R", value);
        return NULL;
    }
    if (big) {
        PyErr_Format(PyExc_ValueError, SHMIPCPY_SERVE_TOO_LONG, value);
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(v);
}

static int resp_init(PyObject *o, PyObject *args, PyObject *kw)
{
    wsgi_response *self = (wsgi_response *)o;
    static char *kwlist[] = {"method", NULL};
    PyObject *method;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "U:WSGIResponse", kwlist, &method))
        return -1;
    Py_XSETREF(self->method, Py_NewRef(method));
    Py_XSETREF(self->status, Py_NewRef(Py_None));
    Py_XSETREF(self->headers, Py_NewRef(Py_None));
    Py_XSETREF(self->length, Py_NewRef(Py_None));
    Py_CLEAR(self->chunks);
    self->sent = 0;
    self->code = 0;
    self->flags = 0;
    self->head_sent = 0;
    return 0;
}

static PyObject *resp_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    wsgi_response *self = (wsgi_response *)tp->tp_alloc(tp, 0);
    if (self == NULL)
        return NULL;
    self->method = Py_NewRef(Py_None);
    self->status = Py_NewRef(Py_None);
    self->headers = Py_NewRef(Py_None);
    self->length = Py_NewRef(Py_None);
    return (PyObject *)self;
}

static int resp_traverse(PyObject *o, visitproc visit, void *arg)
{
    wsgi_response *self = (wsgi_response *)o;
    Py_VISIT(Py_TYPE(o));
    Py_VISIT(self->method);
    Py_VISIT(self->status);
    Py_VISIT(self->headers);
    Py_VISIT(self->length);
    Py_VISIT(self->chunks);
    return 0;
}

static int resp_clear(PyObject *o)
{
    wsgi_response *self = (wsgi_response *)o;
    Py_CLEAR(self->method);
    Py_CLEAR(self->status);
    Py_CLEAR(self->headers);
    Py_CLEAR(self->length);
    Py_CLEAR(self->chunks);
    return 0;
}

static void resp_dealloc(PyObject *o)
{
    PyTypeObject *tp = Py_TYPE(o);
    PyObject_GC_UnTrack(o);
    if (((wsgi_response *)o)->weak != NULL)
        PyObject_ClearWeakRefs(o);
    resp_clear(o);
    tp->tp_free(o);
    Py_DECREF(tp);
}

/* 1xx, 204 and 304: no content, and no length to say. */
static int no_content(const wsgi_response *self)
{
    return self->code < 200 || self->code == 204 || self->code == 304;
}

int shmipcpy_serve_no_content(const wsgi_response *r)
{
    return no_content(r);
}

static int is_head(const wsgi_response *self)
{
    return self->method != NULL && PyUnicode_Check(self->method) &&
           PyUnicode_CompareWithASCIIString(self->method, "HEAD") == 0;
}

/* No body bytes go to the client. */
static int bodyless(wsgi_response *self)
{
    return no_content(self) || is_head(self);
}

int shmipcpy_serve_bodyless(wsgi_response *r)
{
    return bodyless(r);
}

/* exc_info given once the head is out: PEP 3333 says raise it again. */
static PyObject *reraise(PyObject *exc_info)
{
    PyObject *val = NULL, *tb = NULL;
    if (!PyTuple_Check(exc_info) || PyTuple_GET_SIZE(exc_info) != 3) {
        PyErr_SetString(PyExc_TypeError, "exc_info must be a (type, value, traceback) tuple");
        return NULL;
    }
    val = PyTuple_GET_ITEM(exc_info, 1);
    tb = PyTuple_GET_ITEM(exc_info, 2);
    if (!PyExceptionInstance_Check(val)) {
        PyErr_SetString(PyExc_TypeError, "exc_info[1] must be an exception");
        return NULL;
    }
    if (tb != Py_None && PyException_SetTraceback(val, tb) < 0)
        return NULL;
    PyErr_SetObject((PyObject *)Py_TYPE(val), val);
    return NULL;
}

/* The header list's checks; the fields without hop-by-hop ones into *out. */
static int take_headers(PyObject *headers, PyObject **out, PyObject **length, unsigned *flags)
{
    if (!PyList_Check(headers)) {
        PyErr_SetString(PyExc_TypeError, "the headers must be a list of (name, value) tuples");
        return -1;
    }
    PyObject *fields = PyList_New(0);
    if (fields == NULL)
        return -1;
    *length = Py_NewRef(Py_None);
    *flags = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(headers); i++) {
        PyObject *h = Py_NewRef(PyList_GET_ITEM(headers, i));
        int rc = -1;
        if (!PyTuple_CheckExact(h) || PyTuple_GET_SIZE(h) != 2) {
            PyErr_Format(PyExc_TypeError, "a header must be a (name, value) tuple, not %R", h);
            goto next;
        }
        PyObject *name = PyTuple_GET_ITEM(h, 0), *value = PyTuple_GET_ITEM(h, 1);
        if (!PyUnicode_CheckExact(name) || !PyUnicode_CheckExact(value)) {
            PyErr_Format(PyExc_TypeError, "header names and values must be str: %R", h);
            goto next;
        }
        size_t k = 0;
        while (k < NHOP && !str_is(name, shmipcpy_serve_hop_names[k]))
            k++;
        if (k == NHOP) {
            rc = PyList_Append(fields, h);
        } else if (k == HOP_CONTENT_LENGTH) {
            PyObject *v = parse_length(value);
            if (v != NULL) {
                Py_SETREF(*length, v);
                rc = 0;
            }
        } else {
            if (k == HOP_CONNECTION && has_close(value))
                *flags |= SHMIPC_SERVE_RESP_CLOSE;
            rc = 0;
        }
    next:
        Py_DECREF(h);
        if (rc < 0) {
            Py_CLEAR(*length);
            Py_DECREF(fields);
            return -1;
        }
    }
    *out = fields;
    return 0;
}

static PyObject *resp_start_response(PyObject *o, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames)
{
    wsgi_response *self = (wsgi_response *)o;
    static const char *const names[] = {"status", "headers", "exc_info"};
    PyObject *a[3] = {NULL, NULL, Py_None};
    if (nargs > 3) {
        PyErr_Format(PyExc_TypeError, "start_response() takes at most 3 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        a[i] = args[i];
    for (Py_ssize_t i = 0; kwnames != NULL && i < PyTuple_GET_SIZE(kwnames); i++) {
        PyObject *kn = PyTuple_GET_ITEM(kwnames, i);
        int k = 0;
        while (k < 3 && PyUnicode_CompareWithASCIIString(kn, names[k]) != 0)
            k++;
        if (k == 3 || (k < nargs)) {
            PyErr_Format(PyExc_TypeError,
                         "start_response() got an unexpected or repeated "
                         "keyword argument %R",
                         kn);
            return NULL;
        }
        a[k] = args[nargs + i];
    }
    if (a[0] == NULL || a[1] == NULL) {
        PyErr_SetString(PyExc_TypeError, "start_response() takes a status and a header list");
        return NULL;
    }
    PyObject *status = a[0], *headers = a[1], *exc_info = a[2];
    if (exc_info != Py_None) {
        if (self->head_sent)
            return reraise(exc_info);
    } else if (is_set(self->status)) {
        PyErr_SetString(PyExc_AssertionError, "start_response was called twice without exc_info");
        return NULL;
    }
    if (!PyUnicode_Check(status)) {
        PyErr_SetString(PyExc_TypeError, "the status must be a str like '200 OK'");
        return NULL;
    }
    /* "NNN Reason" (PEP 3333; wsgiref.validate checks the same), 200..599 as the C worker's:
     * the protocol carries a 1xx only as an interim head before the final one, which a WSGI
     * app cannot send (a 1xx head then END was a bad exchange to the front: 502). */
    int code = 0;
    int kind = PyUnicode_KIND(status);
    const void *data = PyUnicode_DATA(status);
    int ok = PyUnicode_GET_LENGTH(status) >= 4 && PyUnicode_READ(kind, data, 3) == ' ';
    for (Py_ssize_t i = 0; ok && i < 3; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        ok = c >= '0' && c <= '9';
        code = code * 10 + (int)(c - '0');
    }
    if (!ok || code < 200 || code > 599) {
        PyErr_Format(PyExc_ValueError, "bad status %R", status);
        return NULL;
    }
    PyObject *fields, *length;
    unsigned flags;
    if (take_headers(headers, &fields, &length, &flags) < 0)
        return NULL;
    /* XSETREF: `length` is writable, so `del r.length` leaves it NULL. */
    Py_XSETREF(self->status, Py_NewRef(status));
    Py_XSETREF(self->headers, fields);
    Py_XSETREF(self->length, length);
    self->code = code;
    self->flags = flags;
    return PyObject_GetAttrString(o, "write");
}

/* The in-process server's write(): the body is collected (collect() returns it). */
static PyObject *resp_write(PyObject *o, PyObject *data)
{
    wsgi_response *self = (wsgi_response *)o;
    PyObject *piece;
    if (PyBytes_Check(data)) {
        piece = Py_NewRef(data);
    } else if (PyByteArray_Check(data) || PyMemoryView_Check(data)) {
        if ((piece = PyBytes_FromObject(data)) == NULL)
            return NULL;
    } else {
        PyErr_Format(PyExc_TypeError, "the body must be bytes, not %s", Py_TYPE(data)->tp_name);
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(piece);
    int rc = 0;
    if (n == 0)
        goto out;
    rc = -1;
    if (!is_set(self->status)) {
        PyErr_SetString(PyExc_AssertionError,
                        "the app sent body bytes before calling start_response");
        goto out;
    }
    self->head_sent = 1; /* as with a front: exc_info can no longer replace the head */
    rc = 0;
    if (no_content(self))
        goto out;
    if (is_head(self)) {
        /* Counted, not kept: HEAD's Content-Length is what GET's would be. */
        if (n <= PY_SSIZE_T_MAX - self->sent)
            self->sent += n;
        goto out;
    }
    rc = -1;
    if (is_set(self->length)) {
        unsigned long long len = PyLong_AsUnsignedLongLong(self->length);
        if (len == (unsigned long long)-1 && PyErr_Occurred())
            goto out;
        if ((unsigned long long)self->sent + (unsigned long long)n > len) {
            PyErr_Format(PyExc_ValueError, "the app sent more than its Content-Length of %llu",
                         len);
            goto out;
        }
    }
    if (n > PY_SSIZE_T_MAX - self->sent) { /* `sent` is writable */
        PyErr_SetString(PyExc_OverflowError, "the body's size overflows");
        goto out;
    }
    if (self->chunks == NULL) {
        /* An allocation can run a collection, whose finalizers can write() here first. */
        PyObject *chunks = PyList_New(0);
        if (chunks == NULL)
            goto out;
        if (self->chunks == NULL)
            self->chunks = chunks;
        else
            Py_DECREF(chunks);
    }
    if (PyList_Append(self->chunks, piece) < 0)
        goto out;
    self->sent += n;
    rc = 0;
out:
    Py_DECREF(piece);
    return rc < 0 ? NULL : Py_NewRef(Py_None);
}

/* Fields for the C server from (name, value) bytes pairs: Date and Server are its own, a
 * second Content-Type is dropped (as a front does), Connection: close becomes its own field. */
PyObject *shmipcpy_serve_server_fields(PyObject *pairs, int close)
{
    PyObject *out = PyList_New(0);
    int ctype = 0;
    if (out == NULL)
        return NULL;
    PyObject *it = PyObject_GetIter(pairs), *p;
    if (it == NULL)
        goto fail;
    while ((p = PyIter_Next(it)) != NULL) {
        PyObject *name =
            PyTuple_Check(p) && PyTuple_GET_SIZE(p) == 2 ? PyTuple_GET_ITEM(p, 0) : NULL;
        if (name == NULL || !PyBytes_Check(name)) {
            PyErr_Format(PyExc_TypeError, "a field must be a (bytes, bytes) pair, not %R", p);
            Py_DECREF(p);
            goto fail;
        }
        const char *s = PyBytes_AS_STRING(name);
        Py_ssize_t n = PyBytes_GET_SIZE(name);
        int skip = (n == 4 && strncasecmp(s, "date", 4) == 0) ||
                   (n == 6 && strncasecmp(s, "server", 6) == 0);
        if (!skip && n == 12 && strncasecmp(s, "content-type", 12) == 0) {
            skip = ctype;
            ctype = 1;
        }
        int rc = skip ? 0 : PyList_Append(out, p);
        Py_DECREF(p);
        if (rc < 0)
            goto fail;
    }
    if (PyErr_Occurred())
        goto fail;
    Py_CLEAR(it);
    if (close) {
        PyObject *c = Py_BuildValue("(y#y#)", "Connection", (Py_ssize_t)10, "close", (Py_ssize_t)5);
        int rc = c != NULL ? PyList_Append(out, c) : -1;
        Py_XDECREF(c);
        if (rc < 0)
            goto fail;
    }
    return out;
fail:
    Py_XDECREF(it);
    Py_DECREF(out);
    return NULL;
}

PyObject *shmipcpy_serve_py_response_fields(PyObject *module, PyObject *const *args,
                                            Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "response_fields(pairs, close) takes 2 arguments");
        return NULL;
    }
    int close = PyObject_IsTrue(args[1]);
    return close < 0 ? NULL : shmipcpy_serve_server_fields(args[0], close);
}

/*
 * The app's header list as latin-1 bytes pairs (WSGI's str headers are latin-1). The list is
 * r.headers, which the app can reach and change after start_response, and an allocation here
 * can run a collection whose finalizers change it: each item is checked again and held while
 * it is read, and the size is read again at each step. The caller holds `headers`.
 */
static PyObject *latin1_pairs(PyObject *headers)
{
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(headers); i++) {
        PyObject *h = Py_NewRef(PyList_GET_ITEM(headers, i)), *pair = NULL;
        if (!PyTuple_Check(h) || PyTuple_GET_SIZE(h) != 2 ||
            !PyUnicode_Check(PyTuple_GET_ITEM(h, 0)) || !PyUnicode_Check(PyTuple_GET_ITEM(h, 1))) {
            PyErr_SetString(PyExc_TypeError,
                            "the response's headers were changed: not (str, str) tuples");
        } else {
            PyObject *name = PyUnicode_AsLatin1String(PyTuple_GET_ITEM(h, 0));
            PyObject *value =
                name != NULL ? PyUnicode_AsLatin1String(PyTuple_GET_ITEM(h, 1)) : NULL;
            pair = value != NULL ? PyTuple_Pack(2, name, value) : NULL;
            Py_XDECREF(name);
            Py_XDECREF(value);
        }
        Py_DECREF(h);
        int rc = pair != NULL ? PyList_Append(out, pair) : -1;
        Py_XDECREF(pair);
        if (rc < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

int shmipcpy_serve_head_length(PyObject *fields, unsigned long long length)
{
    char digits[24];
    int n = PyOS_snprintf(digits, sizeof digits, "%llu", length);
    PyObject *pair =
        Py_BuildValue("(y#y#)", "Content-Length", (Py_ssize_t)14, digits, (Py_ssize_t)n);
    int rc = pair != NULL ? PyList_Append(fields, pair) : -1;
    Py_XDECREF(pair);
    return rc;
}

/* The collected pieces as one bytes object. */
PyObject *shmipcpy_serve_join(PyObject *chunks)
{
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(chunks); i++)
        total += PyBytes_GET_SIZE(PyList_GET_ITEM(chunks, i));
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
    char *p = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(chunks); i++) {
        PyObject *c = PyList_GET_ITEM(chunks, i);
        memcpy(p, PyBytes_AS_STRING(c), (size_t)PyBytes_GET_SIZE(c));
        p += PyBytes_GET_SIZE(c);
    }
    return out;
}

/* collect(iterable): write() each piece, then (code, fields, body) for the C server. */
static PyObject *resp_collect(PyObject *o, PyObject *iterable)
{
    wsgi_response *self = (wsgi_response *)o;
    PyObject *it = PyObject_GetIter(iterable), *data;
    if (it == NULL)
        return NULL;
    while ((data = PyIter_Next(it)) != NULL) {
        PyObject *r = resp_write(o, data);
        Py_DECREF(data);
        if (r == NULL) {
            Py_DECREF(it);
            return NULL;
        }
        Py_DECREF(r);
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return NULL;
    if (!is_set(self->status) || self->headers == NULL || !PyList_Check(self->headers)) {
        PyErr_SetString(PyExc_AssertionError, "the app returned without calling start_response");
        return NULL;
    }
    if (is_set(self->length) && !bodyless(self)) {
        unsigned long long len = PyLong_AsUnsignedLongLong(self->length);
        if (len == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
        if ((unsigned long long)self->sent < len) {
            PyErr_Format(PyExc_ValueError, "the app sent %zd bytes of its Content-Length of %llu",
                         self->sent, len);
            return NULL;
        }
    }
    /* The head whole now: a finalizer run by a collection below (latin1_pairs allocates) may
     * call start_response with exc_info and replace it, freeing the list. */
    PyObject *headers = Py_NewRef(self->headers);
    int code = self->code;
    unsigned flags = self->flags;
    PyObject *body;
    Py_ssize_t nchunks = self->chunks != NULL ? PyList_GET_SIZE(self->chunks) : 0;
    /* HEAD: GET's length (the app's own, else the bytes it gave), said to the server. */
    int head = is_head(self) && !no_content(self);
    unsigned long long head_length = (unsigned long long)self->sent;
    if (head && is_set(self->length)) {
        head_length = PyLong_AsUnsignedLongLong(self->length);
        if (head_length == (unsigned long long)-1 && PyErr_Occurred()) {
            Py_DECREF(headers);
            return NULL;
        }
    }
    if (nchunks == 1)
        body = Py_NewRef(PyList_GET_ITEM(self->chunks, 0));
    else if (nchunks == 0)
        body = PyBytes_FromStringAndSize(NULL, 0);
    else
        body = shmipcpy_serve_join(self->chunks);
    if (body == NULL) {
        Py_DECREF(headers);
        return NULL;
    }
    PyObject *pairs = latin1_pairs(headers);
    Py_DECREF(headers);
    PyObject *fields =
        pairs != NULL ? shmipcpy_serve_server_fields(pairs, flags & SHMIPC_SERVE_RESP_CLOSE) : NULL;
    Py_XDECREF(pairs);
    if (fields != NULL && head && shmipcpy_serve_head_length(fields, head_length) < 0)
        Py_CLEAR(fields);
    PyObject *out = fields != NULL ? Py_BuildValue("(iNN)", code, fields, body) : NULL;
    if (fields == NULL)
        Py_DECREF(body);
    return out;
}

static PyObject *resp_bodyless(PyObject *o, PyObject *unused)
{
    (void)unused;
    return PyBool_FromLong(bodyless((wsgi_response *)o));
}

static PyMethodDef resp_methods[] = {
    {"start_response", (PyCFunction)(void (*)(void))resp_start_response,
     METH_FASTCALL | METH_KEYWORDS,
     "start_response(status, headers, exc_info=None) -> write: PEP 3333's, with its checks\n"
     "(status 'NNN Reason' with NNN in 200..599; a list of (str, str) tuples; hop-by-hop\n"
     "fields dropped, Content-Length into .length, Connection: close into .flags)."},
    {"write", resp_write, METH_O,
     "write(data): collects a body piece (the in-process server; the worker's subclass sends)."},
    {"collect", resp_collect, METH_O,
     "collect(iterable) -> (status, fields, body): write() each piece of the app's iterable,\n"
     "check Content-Length, and return the response for the in-process C server."},
    {"_bodyless", resp_bodyless, METH_NOARGS,
     "True when the response carries no body (HEAD, 1xx, 204, 304)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef resp_members[] = {
    {"method", T_OBJECT, offsetof(wsgi_response, method), READONLY, "the request's method"},
    {"status", T_OBJECT, offsetof(wsgi_response, status), READONLY,
     "the app's status line, None before start_response"},
    {"headers", T_OBJECT, offsetof(wsgi_response, headers), READONLY,
     "the app's fields without the hop-by-hop ones, None before start_response"},
    {"length", T_OBJECT, offsetof(wsgi_response, length), 0,
     "the response's Content-Length, or None"},
    {"code", T_INT, offsetof(wsgi_response, code), READONLY, "the status code"},
    {"flags", T_UINT, offsetof(wsgi_response, flags), READONLY, "RESP_CLOSE or 0"},
    {"sent", T_PYSSIZET, offsetof(wsgi_response, sent), 0, "body bytes taken"},
    {"head_sent", T_BOOL, offsetof(wsgi_response, head_sent), 0,
     "the head is out: exc_info can no longer replace it"},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(wsgi_response, weak), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot resp_slots[] = {
    {Py_tp_doc, "WSGIResponse(method): one WSGI response's state and start_response."},
    {Py_tp_init, resp_init},
    {Py_tp_new, resp_new},
    {Py_tp_dealloc, resp_dealloc},
    {Py_tp_traverse, resp_traverse},
    {Py_tp_clear, resp_clear},
    {Py_tp_methods, resp_methods},
    {Py_tp_members, resp_members},
    {0, NULL},
};

static PyType_Spec resp_spec = {
    .name = "shmipc._serve.WSGIResponse",
    .basicsize = sizeof(wsgi_response),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = resp_slots,
};

int shmipcpy_serve_add_wsgi(PyObject *module)
{
    PyObject *tp = PyType_FromModuleAndSpec(module, &resp_spec, NULL);
    if (tp == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(module, "WSGIResponse", tp);
    Py_DECREF(tp);
    /* HOP_FIELDS: the same names for the ASGI worker's checks (Python). */
    PyObject *hop = rc == 0 ? PyFrozenSet_New(NULL) : NULL;
    for (size_t i = 0; hop != NULL && i < NHOP; i++) {
        PyObject *s = PyUnicode_FromString(shmipcpy_serve_hop_names[i]);
        if (s == NULL || PySet_Add(hop, s) < 0)
            Py_CLEAR(hop);
        Py_XDECREF(s);
    }
    rc = hop != NULL ? PyModule_AddObjectRef(module, "HOP_FIELDS", hop) : -1;
    Py_XDECREF(hop);
    return rc;
}
