/*
 * serve_scope.c - decode_request_scope(): a whole REQUEST_HEAD frame (docs/serve.md) as the
 * ASGI 3 HTTP connection scope (asgiref's spec, "HTTP Connection Scope"), built in C so an
 * ASGI worker does no per-header work in Python.
 *
 * Owns: py_decode_request_scope (exported to serve.c's method table).
 * May call: the public codec of shmipc_serve.h and serve.c (serve_module.h).
 */
#include "serve_module.h"

#include <arpa/inet.h>
#include <string.h>

static int put(PyObject *d, const char *key, PyObject *v)
{
    if (v == NULL)
        return -1;
    int rc = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return rc;
}

/* The ASGI path: percent-decoded, then decoded from UTF-8 (the spec); bytes that are not
 * UTF-8 become lone surrogates (surrogateescape), so no client's path fails the request, and
 * raw_path keeps the bytes as sent. */
static PyObject *decoded_path(const uint8_t *p, size_t n)
{
    uint8_t *out = PyMem_Malloc(n ? n : 1);
    if (out == NULL)
        return PyErr_NoMemory();
    size_t o = shmipcpy_serve_percent_decode(p, n, out);
    PyObject *v = PyUnicode_DecodeUTF8((const char *)out, (Py_ssize_t)o, "surrogateescape");
    PyMem_Free(out);
    return v;
}

/* [host, port] for an inet address; None for unix or none (the spec: "None if unknown"). */
static PyObject *addr_pair(const shmipc_serve_addr *a)
{
    char text[INET6_ADDRSTRLEN];
    int fam = a->family == SHMIPC_SERVE_AF_INET    ? AF_INET
              : a->family == SHMIPC_SERVE_AF_INET6 ? AF_INET6
                                                   : 0;
    if (fam == 0 || inet_ntop(fam, a->addr, text, sizeof text) == NULL)
        Py_RETURN_NONE;
    return Py_BuildValue("[sH]", text, a->port);
}

static PyObject *lower_bytes(const uint8_t *p, size_t n)
{
    PyObject *v = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
    if (v == NULL)
        return NULL;
    char *o = PyBytes_AS_STRING(v);
    for (size_t i = 0; i < n; i++)
        o[i] = (char)(p[i] >= 'A' && p[i] <= 'Z' ? p[i] + 32 : p[i]);
    return v;
}

PyObject *shmipcpy_serve_py_decode_request_scope(PyObject *module, PyObject *arg)
{
    serve_state *st = (serve_state *)PyModule_GetState(module);
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *d = NULL, *headers = NULL;
    shmipc_serve_request req = {.size = sizeof req};
    int64_t rc = shmipc_serve_decode_request(b.buf, (size_t)b.len, &req);
    if (rc <= 0 || rc != b.len) {
        if (rc > 0)
            PyErr_Format(st->frame_error, "decode_request_scope: %zd bytes after the frame",
                         b.len - (Py_ssize_t)rc);
        else
            shmipcpy_serve_frame_error(st, rc, "decode_request_scope");
        goto fail;
    }
    const shmipc_serve_request *r = &req;
    d = PyDict_New();
    if (d == NULL)
        goto fail;
    if (put(d, "type", PyUnicode_FromString("http")) < 0 ||
        put(d, "asgi", Py_BuildValue("{ssss}", "version", "3.0", "spec_version", "2.3")) < 0 ||
        put(d, "http_version", PyUnicode_FromString(r->version_minor ? "1.1" : "1.0")) < 0 ||
        put(d, "method",
            PyUnicode_DecodeLatin1((const char *)r->method, (Py_ssize_t)r->method_len, NULL)) < 0 ||
        put(d, "scheme", PyUnicode_FromString(r->scheme ? "https" : "http")) < 0 ||
        put(d, "root_path", PyUnicode_FromString("")) < 0)
        goto fail;

    size_t tn;
    const uint8_t *t = shmipcpy_serve_target_path(r, &tn);
    const uint8_t *q = tn ? memchr(t, '?', tn) : NULL;
    size_t pathn = q != NULL ? (size_t)(q - t) : tn;
    if (pathn == 0) {
        if (put(d, "path", PyUnicode_FromString("/")) < 0 ||
            put(d, "raw_path", PyBytes_FromString("/")) < 0)
            goto fail;
    } else if (put(d, "path", decoded_path(t, pathn)) < 0 ||
               put(d, "raw_path", PyBytes_FromStringAndSize((const char *)t, (Py_ssize_t)pathn)) <
                   0) {
        goto fail;
    }
    if (put(d, "query_string",
            q != NULL ? PyBytes_FromStringAndSize((const char *)q + 1, (Py_ssize_t)(tn - pathn - 1))
                      : PyBytes_FromString("")) < 0)
        goto fail;

    headers = PyList_New(0);
    if (headers == NULL)
        goto fail;
    shmipc_serve_field fld;
    shmipc_serve_fields it = r->fields;
    while (shmipc_serve_fields_next(&it, &fld)) {
        PyObject *name = lower_bytes(fld.name, fld.name_len);
        PyObject *value =
            name ? PyBytes_FromStringAndSize((const char *)fld.value, (Py_ssize_t)fld.value_len)
                 : NULL;
        PyObject *pair = value ? PyList_New(2) : NULL;
        if (pair == NULL) {
            Py_XDECREF(name);
            Py_XDECREF(value);
            goto fail;
        }
        PyList_SET_ITEM(pair, 0, name);
        PyList_SET_ITEM(pair, 1, value);
        int arc = PyList_Append(headers, pair);
        Py_DECREF(pair);
        if (arc < 0)
            goto fail;
    }
    if (PyDict_SetItemString(d, "headers", headers) < 0 ||
        put(d, "client", addr_pair(&r->peer)) < 0 || put(d, "server", addr_pair(&r->local)) < 0)
        goto fail;
    Py_DECREF(headers);
    PyBuffer_Release(&b);
    return d;
fail:
    Py_XDECREF(headers);
    Py_XDECREF(d);
    PyBuffer_Release(&b);
    return NULL;
}
