/*
 * serve_encode.c - the encoders of the shmipc._serve extension: encode_response_head,
 * encode_request_head and encode_frame, each writing one whole frame (shmipc_serve.h,
 * docs/serve.md "Protocol") as bytes.
 *
 * Owns: the conversion of header pairs and addresses to the codec's structs.
 * May call: the public codec of shmipc_serve.h and serve.c's errors (serve_module.h).
 */
#include "serve_module.h"
#include "int_args.h"

#include <arpa/inet.h>

/* ---- encoders --------------------------------------------------------------------------- */

/*
 * Header fields from an iterable of (name, value) pairs of str (latin-1, as WSGI's
 * "bytes-as-unicode") or bytes. On success *fields is a PyMem block pointing into *keep (a
 * list holding the encoded bytes), *n the count.
 */
static int fields_from(PyObject *pairs, shmipc_serve_field **fields, uint16_t *n, PyObject **keep)
{
    *fields = NULL;
    *n = 0;
    *keep = NULL;
    PyObject *seq = PySequence_Fast(pairs, "headers must be an iterable of (name, value) pairs");
    if (seq == NULL)
        return -1;
    Py_ssize_t cnt = PySequence_Fast_GET_SIZE(seq);
    if (cnt > SHMIPC_SERVE_MAX_HEADERS) {
        PyErr_Format(PyExc_ValueError, "%zd header fields, at most %u", cnt,
                     SHMIPC_SERVE_MAX_HEADERS);
        Py_DECREF(seq);
        return -1;
    }
    PyObject *keep_list = PyList_New(0);
    shmipc_serve_field *fl = PyMem_Calloc((size_t)cnt + 1, sizeof *fl);
    if (keep_list == NULL || fl == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < cnt; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "a header must be a (name, value) tuple");
            goto fail;
        }
        for (int j = 0; j < 2; j++) {
            PyObject *o = PyTuple_GET_ITEM(pair, j), *bytes;
            if (PyUnicode_Check(o)) {
                bytes = PyUnicode_AsLatin1String(o);
                if (bytes == NULL)
                    goto fail;
            } else if (PyBytes_Check(o)) {
                bytes = Py_NewRef(o);
            } else {
                PyErr_SetString(PyExc_TypeError, "header names and values must be str or bytes");
                goto fail;
            }
            int rc = PyList_Append(keep_list, bytes);
            Py_DECREF(bytes);
            if (rc < 0)
                goto fail;
            Py_ssize_t len = PyBytes_GET_SIZE(bytes);
            if (len > (j == 0 ? SHMIPC_SERVE_MAX_NAME : SHMIPC_SERVE_MAX_VALUE)) {
                PyErr_Format(PyExc_ValueError, "header %s of %zd bytes is over the limit",
                             j == 0 ? "name" : "value", len);
                goto fail;
            }
            if (j == 0) {
                fl[i].name = (const uint8_t *)PyBytes_AS_STRING(bytes);
                fl[i].name_len = (uint16_t)len;
            } else {
                fl[i].value = (const uint8_t *)PyBytes_AS_STRING(bytes);
                fl[i].value_len = (uint16_t)len;
            }
        }
    }
    Py_DECREF(seq);
    *fields = fl;
    *n = (uint16_t)cnt;
    *keep = keep_list;
    return 0;
fail:
    PyMem_Free(fl);
    Py_XDECREF(keep_list);
    Py_DECREF(seq);
    return -1;
}

static PyObject *encoded(int64_t rc, uint8_t *buf, const char *what)
{
    if (rc > 0) {
        PyObject *out = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)rc);
        PyMem_Free(buf);
        return out;
    }
    PyMem_Free(buf);
    PyErr_Format(PyExc_ValueError, "%s: a field breaks the protocol's rules or limits (%lld)", what,
                 (long long)rc);
    return NULL;
}

PyObject *shmipcpy_serve_py_encode_response_head(PyObject *module, PyObject *args, PyObject *kw)
{
    (void)module;
    static char *kwlist[] = {"status", "headers", "flags", "content_length", NULL};
    int status;
    PyObject *headers;
    uint32_t flags = 0;
    uint64_t clen = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iO|O&O&:encode_response_head", kwlist, &status,
                                     &headers, shmipcpy_u32_arg, &flags, shmipcpy_u64_arg, &clen))
        return NULL;
    return shmipcpy_serve_encode_head(status, headers, flags, clen);
}

PyObject *shmipcpy_serve_encode_head(int status, PyObject *headers, uint32_t flags, uint64_t clen)
{
    if (status < 100 || status > 599) {
        PyErr_Format(PyExc_ValueError, "status %d is not in 100..599", status);
        return NULL;
    }
    shmipc_serve_field *fields;
    uint16_t n;
    PyObject *keep;
    if (fields_from(headers, &fields, &n, &keep) < 0)
        return NULL;
    shmipc_serve_response r = {
        .size = sizeof r, .flags = flags, .status = (uint16_t)status, .content_length = clen};
    /* A head that fits 1 KiB (most do) is encoded on the stack: the buffer of the largest one
     * (64 KiB) cost a malloc and a free of that size per response. */
    uint8_t small[1024];
    int64_t rc = shmipc_serve_encode_response_head(small, sizeof small, &r, fields, n);
    if (rc > 0) {
        PyMem_Free(fields);
        Py_DECREF(keep);
        return PyBytes_FromStringAndSize((const char *)small, (Py_ssize_t)rc);
    }
    size_t cap = SHMIPC_SERVE_HDR_SIZE + SHMIPC_SERVE_MAX_HEAD;
    uint8_t *buf = PyMem_Malloc(cap);
    rc = buf != NULL ? shmipc_serve_encode_response_head(buf, cap, &r, fields, n) : 0;
    PyMem_Free(fields);
    Py_DECREF(keep);
    if (buf == NULL)
        return PyErr_NoMemory();
    return encoded(rc, buf, "encode_response_head");
}

/* (host, port) or None; a host with ':' is IPv6; the string "unix" is a unix socket. */
static int addr_from(PyObject *o, const char *what, shmipc_serve_addr *a)
{
    memset(a, 0, sizeof *a);
    if (o == Py_None)
        return 0;
    if (PyUnicode_Check(o) && PyUnicode_CompareWithASCIIString(o, "unix") == 0) {
        a->family = SHMIPC_SERVE_AF_UNIX;
        return 0;
    }
    const char *host;
    int port;
    if (!PyTuple_Check(o)) { /* PyArg_ParseTuple on another object is a SystemError */
        PyErr_Format(PyExc_TypeError, "%s must be a (host, port) tuple, 'unix' or None, not %.100s",
                     what, Py_TYPE(o)->tp_name);
        return -1;
    }
    if (!PyArg_ParseTuple(o, "si:address", &host, &port))
        return -1;
    if (port < 0 || port > 65535) {
        PyErr_SetString(PyExc_ValueError, "port out of range");
        return -1;
    }
    a->port = (uint16_t)port;
    if (inet_pton(AF_INET, host, a->addr) == 1) {
        a->family = SHMIPC_SERVE_AF_INET;
    } else if (inet_pton(AF_INET6, host, a->addr) == 1) {
        a->family = SHMIPC_SERVE_AF_INET6;
    } else {
        PyErr_Format(PyExc_ValueError, "%s is not an IP address", host);
        return -1;
    }
    return 0;
}

PyObject *shmipcpy_serve_py_encode_request_head(PyObject *module, PyObject *args, PyObject *kw)
{
    (void)module;
    static char *kwlist[] = {"method", "target", "headers",       "flags",  "content_length",
                             "peer",   "local",  "version_minor", "scheme", NULL};
    Py_buffer method, target;
    PyObject *headers, *peer = Py_None, *local = Py_None;
    uint32_t flags = 0;
    uint64_t clen = 0;
    unsigned char minor = 1, scheme = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*y*O|O&O&OObb:encode_request_head", kwlist,
                                     &method, &target, &headers, shmipcpy_u32_arg, &flags,
                                     shmipcpy_u64_arg, &clen, &peer, &local, &minor, &scheme))
        return NULL;
    PyObject *out = NULL, *keep = NULL;
    shmipc_serve_field *fields = NULL;
    uint16_t n;
    shmipc_serve_request r = {.size = sizeof r,
                              .flags = flags,
                              .version_minor = minor,
                              .scheme = scheme,
                              .content_length = clen};
    if (method.len > SHMIPC_SERVE_MAX_METHOD || target.len > SHMIPC_SERVE_MAX_TARGET) {
        PyErr_SetString(PyExc_ValueError, "method or target over the limit");
        goto out;
    }
    if (addr_from(peer, "peer", &r.peer) < 0 || addr_from(local, "local", &r.local) < 0 ||
        fields_from(headers, &fields, &n, &keep) < 0)
        goto out;
    r.method = method.buf;
    r.method_len = (uint32_t)method.len;
    r.target = target.buf;
    r.target_len = (uint32_t)target.len;
    size_t cap = SHMIPC_SERVE_HDR_SIZE + SHMIPC_SERVE_MAX_HEAD;
    uint8_t *buf = PyMem_Malloc(cap);
    if (buf == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    out = encoded(shmipc_serve_encode_request_head(buf, cap, &r, fields, n), buf,
                  "encode_request_head");
out:
    PyMem_Free(fields);
    Py_XDECREF(keep);
    PyBuffer_Release(&method);
    PyBuffer_Release(&target);
    return out;
}

PyObject *shmipcpy_serve_py_encode_frame(PyObject *module, PyObject *args, PyObject *kw)
{
    (void)module;
    static char *kwlist[] = {"type", "payload", "arg", NULL};
    uint32_t type, arg = 0;
    Py_buffer payload = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|y*O&:encode_frame", kwlist, shmipcpy_u32_arg,
                                     &type, &payload, shmipcpy_u32_arg, &arg))
        return NULL;
    const void *data = payload.buf != NULL ? payload.buf : "";
    size_t n = payload.buf != NULL ? (size_t)payload.len : 0;
    /* The header's checks first (type, arg, the length's limit), so a payload over the limit
     * is refused before a bytes object of its size is made; then the whole frame, written
     * straight into the result. */
    uint8_t hdr[SHMIPC_SERVE_HDR_SIZE];
    PyObject *out = NULL;
    int64_t rc = shmipc_serve_encode_header(hdr, sizeof hdr, type, n, arg);
    if (rc > 0) {
        out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(SHMIPC_SERVE_HDR_SIZE + n));
        if (out == NULL)
            goto done;
        rc = shmipc_serve_encode_frame(PyBytes_AS_STRING(out), SHMIPC_SERVE_HDR_SIZE + n, type, arg,
                                       data, n);
    }
    if (rc < 0) {
        Py_CLEAR(out);
        PyErr_Format(PyExc_ValueError,
                     "encode_frame: type %u, arg %u and %zu payload bytes break the protocol", type,
                     arg, n);
    }
done:
    if (payload.buf != NULL)
        PyBuffer_Release(&payload);
    return out;
}
