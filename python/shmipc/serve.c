/*
 * serve.c - the shmipc._serve extension: the shmipc-serve frame codec (shmipc_serve.h,
 * docs/serve.md "Protocol") for Python workers. The hot call is decode_request(), which
 * turns a whole REQUEST_HEAD frame into a PEP 3333 environ dict in one pass, so a WSGI worker
 * does no per-header work in Python. The encoders write whole frames as bytes.
 *
 * A module of its own beside _shmipc: it calls the public codec of shmipc_serve.h directly
 * (no descriptor table: the calls take structs) and needs none of _shmipc's objects.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <stdint.h>
#include <string.h>

#include "shmipc_serve.h"

/* Header names common enough that their HTTP_* key is made once, at import. */
static const char *const common_names[] = {
    "host",
    "user-agent",
    "accept",
    "accept-encoding",
    "accept-language",
    "connection",
    "cookie",
    "referer",
    "cache-control",
    "origin",
    "upgrade-insecure-requests",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-request-id",
    "authorization",
    "if-none-match",
    "if-modified-since",
    "pragma",
    "sec-fetch-mode",
    "transfer-encoding",
};
#define NCOMMON (sizeof common_names / sizeof common_names[0])

typedef struct {
    PyObject *frame_error; /* FrameError(ValueError) */
    PyObject *common_keys[NCOMMON];
    /* Interned environ keys. */
    PyObject *k_method, *k_script, *k_path, *k_query, *k_raw_uri, *k_request_uri, *k_content_type,
        *k_content_length, *k_server_name, *k_server_port, *k_protocol, *k_remote_addr,
        *k_remote_port, *k_scheme, *k_empty, *k_http, *k_https, *k_proto10, *k_proto11;
} serve_state;

static serve_state *state_of(PyObject *module)
{
    return (serve_state *)PyModule_GetState(module);
}

static PyObject *frame_error(serve_state *st, int64_t rc, const char *what)
{
    if (rc == 0)
        PyErr_Format(st->frame_error, "%s: an incomplete frame", what);
    else
        PyErr_Format(st->frame_error, "%s: the frame breaks the protocol (%lld)", what,
                     (long long)rc);
    return NULL;
}

/* A decode_request/_response failure: a whole valid frame of another type is named as such
 * (the typed decoders refuse it like a bad frame), anything else is frame_error. */
static PyObject *other_frame_error(serve_state *st, const void *buf, size_t len, int64_t rc,
                                   const char *what, const char *want)
{
    shmipc_serve_frame f = {.size = sizeof f};
    if (rc < 0 && shmipc_serve_decode(buf, len, &f) == (int64_t)len) {
        PyErr_Format(st->frame_error, "%s: a %s frame, not %s", what,
                     shmipc_serve_type_name(f.type), want);
        return NULL;
    }
    return frame_error(st, rc, what);
}

/* ---- decode_header ---------------------------------------------------------------------- */

static PyObject *py_decode_header(PyObject *module, PyObject *arg)
{
    serve_state *st = state_of(module);
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    shmipc_serve_frame f = {.size = sizeof f};
    int rc = shmipc_serve_decode_header(b.buf, (size_t)b.len, &f);
    PyBuffer_Release(&b);
    if (rc == 0)
        Py_RETURN_NONE;
    if (rc < 0)
        return frame_error(st, rc, "decode_header");
    return Py_BuildValue("(BkI)", f.type, (unsigned long)f.length, (unsigned)f.arg);
}

/* ---- decode_request --------------------------------------------------------------------- */

static int set_str(PyObject *d, PyObject *key, const uint8_t *p, size_t n)
{
    PyObject *v = PyUnicode_DecodeLatin1((const char *)p, (Py_ssize_t)n, NULL);
    if (v == NULL)
        return -1;
    int rc = PyDict_SetItem(d, key, v);
    Py_DECREF(v);
    return rc;
}

static int hexval(uint8_t c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* PATH_INFO: the path percent-decoded to bytes, as latin-1 text (PEP 3333, as wsgiref and
 * gunicorn do); a '%' not followed by two hex digits stays as it is. */
static int set_path(PyObject *d, PyObject *key, const uint8_t *p, size_t n)
{
    const uint8_t *pct = memchr(p, '%', n);
    if (pct == NULL)
        return set_str(d, key, p, n);
    uint8_t stackbuf[512];
    uint8_t *out = n <= sizeof stackbuf ? stackbuf : PyMem_Malloc(n);
    if (out == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int hi, lo;
        if (p[i] == '%' && i + 2 < n && (hi = hexval(p[i + 1])) >= 0 &&
            (lo = hexval(p[i + 2])) >= 0) {
            out[o++] = (uint8_t)(hi << 4 | lo);
            i += 2;
        } else {
            out[o++] = p[i];
        }
    }
    int rc = set_str(d, key, out, o);
    if (out != stackbuf)
        PyMem_Free(out);
    return rc;
}

/* An address as text; 0 when there is none (family none or unix). */
static int addr_text(const shmipc_serve_addr *a, char *out, size_t cap)
{
    if (a->family == SHMIPC_SERVE_AF_INET)
        return inet_ntop(AF_INET, a->addr, out, (socklen_t)cap) != NULL;
    if (a->family == SHMIPC_SERVE_AF_INET6)
        return inet_ntop(AF_INET6, a->addr, out, (socklen_t)cap) != NULL;
    return 0;
}

static int set_u64(PyObject *d, PyObject *key, uint64_t n)
{
    /* PyUnicode_FromFormat costs more than the rest of a port's entry */
    char buf[24], *p = buf + sizeof buf;
    do {
        *--p = (char)('0' + n % 10);
        n /= 10;
    } while (n != 0);
    PyObject *v = PyUnicode_FromStringAndSize(p, buf + sizeof buf - p);
    if (v == NULL)
        return -1;
    int rc = PyDict_SetItem(d, key, v);
    Py_DECREF(v);
    return rc;
}

static int name_is(const shmipc_serve_field *f, const char *lower)
{
    size_t n = strlen(lower);
    if (f->name_len != n)
        return 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = f->name[i];
        if (c >= 'A' && c <= 'Z')
            c = (uint8_t)(c + 32);
        if (c != (uint8_t)lower[i])
            return 0;
    }
    return 1;
}

/* HTTP_<NAME> for a field name; NULL without an error for a name with '_'. */
static PyObject *http_key(const shmipc_serve_field *f)
{
    char key[5 + SHMIPC_SERVE_MAX_NAME + 1];
    memcpy(key, "HTTP_", 5);
    for (size_t i = 0; i < f->name_len; i++) {
        uint8_t c = f->name[i];
        if (c == '_')
            return NULL;
        if (c >= 'a' && c <= 'z')
            c = (uint8_t)(c - 32);
        else if (c == '-')
            c = '_';
        key[5 + i] = (char)c;
    }
    return PyUnicode_DecodeLatin1(key, (Py_ssize_t)(5 + f->name_len), NULL);
}

/*
 * One header field as HTTP_<NAME>. A name with '_' is dropped, as nginx does by default
 * (underscores_in_headers off) and gunicorn since 22: "X_Forwarded_For" would otherwise
 * land on the same key as "X-Forwarded-For" and let a client spoof the front's own header.
 * Repeats are joined with ", " (RFC 9110 §5.3), Cookie with "; " (RFC 6265 §5.4).
 */
static int set_http_field(serve_state *st, PyObject *d, const shmipc_serve_field *f)
{
    PyObject *k = NULL;
    for (size_t i = 0; i < NCOMMON; i++)
        if (name_is(f, common_names[i])) {
            k = Py_NewRef(st->common_keys[i]);
            break;
        }
    if (k == NULL && (k = http_key(f)) == NULL)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *v = PyUnicode_DecodeLatin1((const char *)f->value, f->value_len, NULL);
    int rc = -1;
    if (v == NULL)
        goto out;
    PyObject *old = PyDict_GetItemWithError(d, k);
    if (old != NULL) {
        PyObject *joined =
            PyUnicode_FromFormat("%U%s%U", old, name_is(f, "cookie") ? "; " : ", ", v);
        Py_DECREF(v);
        v = joined;
        if (v == NULL)
            goto out;
    } else if (PyErr_Occurred()) {
        goto out;
    }
    rc = PyDict_SetItem(d, k, v);
out:
    Py_XDECREF(v);
    Py_DECREF(k);
    return rc;
}

/* SERVER_NAME and SERVER_PORT from the Host field when the listener has no IP address. */
static int set_server_from_host(serve_state *st, PyObject *d, const shmipc_serve_field *host,
                                int https)
{
    const char *dport = https ? "443" : "80";
    if (host == NULL || host->value_len == 0) {
        if (set_str(d, st->k_server_name, (const uint8_t *)"localhost", 9) < 0)
            return -1;
        return set_str(d, st->k_server_port, (const uint8_t *)dport, strlen(dport));
    }
    const uint8_t *v = host->value;
    size_t n = host->value_len, hn = n;
    const uint8_t *port = NULL;
    size_t pn = 0;
    const uint8_t *colon = NULL;
    if (v[0] == '[') { /* [v6]:port */
        const uint8_t *rb = memchr(v, ']', n);
        if (rb != NULL && (size_t)(rb - v) + 1 < n && rb[1] == ':')
            colon = rb + 1;
    } else {
        colon = memchr(v, ':', n);
    }
    if (colon != NULL) {
        hn = (size_t)(colon - v);
        port = colon + 1;
        pn = n - hn - 1;
    }
    if (set_str(d, st->k_server_name, v, hn) < 0)
        return -1;
    if (pn == 0)
        return set_str(d, st->k_server_port, (const uint8_t *)dport, strlen(dport));
    return set_str(d, st->k_server_port, port, pn);
}

static PyObject *py_decode_request(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    serve_state *st = state_of(module);
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "decode_request(frame, base=None)");
        return NULL;
    }
    PyObject *base = nargs == 2 ? args[1] : Py_None;
    if (base != Py_None && !PyDict_Check(base)) {
        PyErr_SetString(PyExc_TypeError, "decode_request: base must be a dict or None");
        return NULL;
    }
    Py_buffer b;
    if (PyObject_GetBuffer(args[0], &b, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *d = NULL;
    shmipc_serve_request req = {.size = sizeof req};
    int64_t rc = shmipc_serve_decode_request(b.buf, (size_t)b.len, &req);
    if (rc <= 0 || rc != b.len) {
        if (rc > 0)
            PyErr_Format(st->frame_error, "decode_request: %zd bytes after the frame",
                         b.len - (Py_ssize_t)rc);
        else
            other_frame_error(st, b.buf, (size_t)b.len, rc, "decode_request", "REQUEST_HEAD");
        goto fail;
    }
    const shmipc_serve_request *r = &req;
    /* Sized for a typical environ up front: growing a dict from base's size to ~25 keys
     * rehashes it twice, a good part of this call's time. */
    d = _PyDict_NewPresized(32);
    if (d == NULL || (base != Py_None && PyDict_Update(d, base) < 0))
        goto fail;
    if (set_str(d, st->k_method, r->method, r->method_len) < 0 ||
        PyDict_SetItem(d, st->k_script, st->k_empty) < 0 ||
        set_str(d, st->k_raw_uri, r->target, r->target_len) < 0 ||
        PyDict_SetItem(d, st->k_request_uri, PyDict_GetItem(d, st->k_raw_uri)) < 0 ||
        PyDict_SetItem(d, st->k_protocol, r->version_minor ? st->k_proto11 : st->k_proto10) < 0 ||
        PyDict_SetItem(d, st->k_scheme, r->scheme ? st->k_https : st->k_http) < 0)
        goto fail;

    /* The target: origin form "/p?q"; absolute form "http://host/p?q" (RFC 9112 §3.2.2:
     * the path is what follows the authority); "*" for OPTIONS. */
    const uint8_t *t = r->target;
    size_t tn = r->target_len;
    if (t[0] != '/' && t[0] != '*') {
        const uint8_t *sep = NULL;
        for (size_t i = 0; i + 2 < tn; i++)
            if (t[i] == ':' && t[i + 1] == '/' && t[i + 2] == '/') {
                sep = t + i + 3;
                break;
            }
        if (sep != NULL) {
            size_t rest = tn - (size_t)(sep - t);
            const uint8_t *slash = memchr(sep, '/', rest);
            const uint8_t *qm = memchr(sep, '?', rest);
            if (slash != NULL && (qm == NULL || slash < qm)) {
                tn -= (size_t)(slash - t);
                t = slash;
            } else { /* "http://h" or "http://h?q": the path is "/" */
                tn = qm != NULL ? tn - (size_t)(qm - t) : 0;
                t = qm;
            }
        }
    }
    const uint8_t *q = tn ? memchr(t, '?', tn) : NULL;
    size_t pathn = q != NULL ? (size_t)(q - t) : tn;
    if (pathn == 0 && (t == NULL || t != r->target)) {
        if (set_str(d, st->k_path, (const uint8_t *)"/", 1) < 0)
            goto fail;
    } else if (set_path(d, st->k_path, t, pathn) < 0) {
        goto fail;
    }
    if (q != NULL) {
        if (set_str(d, st->k_query, q + 1, tn - pathn - 1) < 0)
            goto fail;
    } else if (PyDict_SetItem(d, st->k_query, st->k_empty) < 0) {
        goto fail;
    }

    if ((r->flags & SHMIPC_SERVE_REQ_CONTENT_LENGTH) &&
        set_u64(d, st->k_content_length, r->content_length) < 0)
        goto fail;

    char addr[INET6_ADDRSTRLEN];
    if (addr_text(&r->peer, addr, sizeof addr)) {
        if (set_str(d, st->k_remote_addr, (const uint8_t *)addr, strlen(addr)) < 0 ||
            set_u64(d, st->k_remote_port, r->peer.port) < 0)
            goto fail;
    } else if (r->peer.family == SHMIPC_SERVE_AF_UNIX) {
        /* nginx's $remote_addr for a unix socket client */
        if (set_str(d, st->k_remote_addr, (const uint8_t *)"unix:", 5) < 0)
            goto fail;
    }

    shmipc_serve_field fld, host = {0};
    int have_host = 0, have_ctype = 0;
    shmipc_serve_fields it = r->fields;
    while (shmipc_serve_fields_next(&it, &fld)) {
        if (name_is(&fld, "content-length"))
            continue; /* CONTENT_LENGTH comes from the flags: the front checked the value */
        if (name_is(&fld, "content-type")) {
            if (!have_ctype && set_str(d, st->k_content_type, fld.value, fld.value_len) < 0)
                goto fail;
            have_ctype = 1;
            continue;
        }
        if (!have_host && name_is(&fld, "host")) {
            host = fld;
            have_host = 1;
        }
        if (set_http_field(st, d, &fld) < 0)
            goto fail;
    }
    if (addr_text(&r->local, addr, sizeof addr)) {
        if (set_str(d, st->k_server_name, (const uint8_t *)addr, strlen(addr)) < 0 ||
            set_u64(d, st->k_server_port, r->local.port) < 0)
            goto fail;
    } else if (set_server_from_host(st, d, have_host ? &host : NULL, r->scheme != 0) < 0) {
        goto fail;
    }
    PyBuffer_Release(&b);
    return d;
fail:
    Py_XDECREF(d);
    PyBuffer_Release(&b);
    return NULL;
}

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

static PyObject *py_encode_response_head(PyObject *module, PyObject *args, PyObject *kw)
{
    (void)module;
    static char *kwlist[] = {"status", "headers", "flags", "content_length", NULL};
    int status;
    PyObject *headers;
    unsigned int flags = 0;
    unsigned long long clen = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iO|IK:encode_response_head", kwlist, &status,
                                     &headers, &flags, &clen))
        return NULL;
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
    size_t cap = SHMIPC_SERVE_HDR_SIZE + SHMIPC_SERVE_MAX_HEAD;
    uint8_t *buf = PyMem_Malloc(cap);
    int64_t rc = buf != NULL ? shmipc_serve_encode_response_head(buf, cap, &r, fields, n) : 0;
    PyMem_Free(fields);
    Py_DECREF(keep);
    if (buf == NULL)
        return PyErr_NoMemory();
    return encoded(rc, buf, "encode_response_head");
}

/* (host, port) or None; a host with ':' is IPv6; the string "unix" is a unix socket. */
static int addr_from(PyObject *o, shmipc_serve_addr *a)
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

static PyObject *py_encode_request_head(PyObject *module, PyObject *args, PyObject *kw)
{
    (void)module;
    static char *kwlist[] = {"method", "target", "headers",       "flags",  "content_length",
                             "peer",   "local",  "version_minor", "scheme", NULL};
    Py_buffer method, target;
    PyObject *headers, *peer = Py_None, *local = Py_None;
    unsigned int flags = 0;
    unsigned long long clen = 0;
    unsigned char minor = 1, scheme = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*y*O|IKOObb:encode_request_head", kwlist, &method,
                                     &target, &headers, &flags, &clen, &peer, &local, &minor,
                                     &scheme))
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
    if (addr_from(peer, &r.peer) < 0 || addr_from(local, &r.local) < 0 ||
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

static PyObject *py_encode_frame(PyObject *module, PyObject *args, PyObject *kw)
{
    (void)module;
    static char *kwlist[] = {"type", "payload", "arg", NULL};
    unsigned int type, arg = 0;
    Py_buffer payload = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "I|y*I:encode_frame", kwlist, &type, &payload, &arg))
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

static PyObject *py_decode_response(PyObject *module, PyObject *arg)
{
    serve_state *st = state_of(module);
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *list = NULL, *out = NULL;
    shmipc_serve_response resp = {.size = sizeof resp};
    int64_t rc = shmipc_serve_decode_response(b.buf, (size_t)b.len, &resp);
    if (rc <= 0 || rc != b.len) {
        if (rc > 0)
            frame_error(st, -2, "decode_response");
        else
            other_frame_error(st, b.buf, (size_t)b.len, rc, "decode_response", "RESPONSE_HEAD");
        goto done;
    }
    list = PyList_New(0);
    if (list == NULL)
        goto done;
    shmipc_serve_fields it = resp.fields;
    shmipc_serve_field fld;
    while (shmipc_serve_fields_next(&it, &fld)) {
        /* latin-1, as WSGI's header strings: a value may hold any byte 0x80-0xFF */
        PyObject *name = PyUnicode_DecodeLatin1((const char *)fld.name, fld.name_len, NULL);
        PyObject *value = PyUnicode_DecodeLatin1((const char *)fld.value, fld.value_len, NULL);
        PyObject *pair = name != NULL && value != NULL ? PyTuple_Pack(2, name, value) : NULL;
        Py_XDECREF(name);
        Py_XDECREF(value);
        if (pair == NULL || PyList_Append(list, pair) < 0) {
            Py_XDECREF(pair);
            goto done;
        }
        Py_DECREF(pair);
    }
    out = Py_BuildValue("(iIKO)", resp.status, (unsigned)resp.flags,
                        (unsigned long long)resp.content_length, list);
done:
    Py_XDECREF(list);
    PyBuffer_Release(&b);
    return out;
}

/* ---- module ----------------------------------------------------------------------------- */

static PyMethodDef serve_methods[] = {
    {"decode_header", py_decode_header, METH_O,
     "decode_header(buf) -> (type, length, arg), or None with fewer than 12 bytes.\n"
     "Checks magic, version, type, arg and length; FrameError otherwise."},
    {"decode_request", (PyCFunction)(void (*)(void))py_decode_request, METH_FASTCALL,
     "decode_request(frame, base=None) -> dict: a whole REQUEST_HEAD frame (header and\n"
     "payload, nothing more) as a PEP 3333 environ, starting from a copy of base (the\n"
     "constant wsgi.* keys). FrameError when it breaks docs/serve.md."},
    {"decode_response", py_decode_response, METH_O,
     "decode_response(frame) -> (status, flags, content_length, [(name, value), ...])."},
    {"encode_response_head", (PyCFunction)(void (*)(void))py_encode_response_head,
     METH_VARARGS | METH_KEYWORDS,
     "encode_response_head(status, headers, flags=0, content_length=0) -> bytes\n"
     "(a whole RESPONSE_HEAD frame; ValueError for what a receiver would refuse)."},
    {"encode_request_head", (PyCFunction)(void (*)(void))py_encode_request_head,
     METH_VARARGS | METH_KEYWORDS,
     "encode_request_head(method, target, headers, flags=0, content_length=0, peer=None,\n"
     "local=None, version_minor=1, scheme=0) -> bytes. Addresses are (host, port), 'unix'\n"
     "or None."},
    {"encode_frame", (PyCFunction)(void (*)(void))py_encode_frame, METH_VARARGS | METH_KEYWORDS,
     "encode_frame(type, payload=b'', arg=0) -> bytes: a BODY, END, ABORT or WS_* frame."},
    {NULL, NULL, 0, NULL},
};

static int intern(PyObject **slot, const char *s)
{
    *slot = PyUnicode_InternFromString(s);
    return *slot != NULL ? 0 : -1;
}

static int serve_exec(PyObject *m)
{
    serve_state *st = state_of(m);
    st->frame_error = PyErr_NewExceptionWithDoc(
        "shmipc._serve.FrameError", "A frame that breaks docs/serve.md.", PyExc_ValueError, NULL);
    if (st->frame_error == NULL || PyModule_AddObjectRef(m, "FrameError", st->frame_error) < 0)
        return -1;
    if (intern(&st->k_method, "REQUEST_METHOD") < 0 || intern(&st->k_script, "SCRIPT_NAME") < 0 ||
        intern(&st->k_path, "PATH_INFO") < 0 || intern(&st->k_query, "QUERY_STRING") < 0 ||
        intern(&st->k_raw_uri, "RAW_URI") < 0 || intern(&st->k_request_uri, "REQUEST_URI") < 0 ||
        intern(&st->k_content_type, "CONTENT_TYPE") < 0 ||
        intern(&st->k_content_length, "CONTENT_LENGTH") < 0 ||
        intern(&st->k_server_name, "SERVER_NAME") < 0 ||
        intern(&st->k_server_port, "SERVER_PORT") < 0 ||
        intern(&st->k_protocol, "SERVER_PROTOCOL") < 0 ||
        intern(&st->k_remote_addr, "REMOTE_ADDR") < 0 ||
        intern(&st->k_remote_port, "REMOTE_PORT") < 0 ||
        intern(&st->k_scheme, "wsgi.url_scheme") < 0 || intern(&st->k_empty, "") < 0 ||
        intern(&st->k_http, "http") < 0 || intern(&st->k_https, "https") < 0 ||
        intern(&st->k_proto10, "HTTP/1.0") < 0 || intern(&st->k_proto11, "HTTP/1.1") < 0)
        return -1;
    struct {
        const char *name;
        long value;
    } consts[] = {
        {"REQUEST_HEAD", SHMIPC_SERVE_REQUEST_HEAD},
        {"BODY", SHMIPC_SERVE_BODY},
        {"END", SHMIPC_SERVE_END},
        {"RESPONSE_HEAD", SHMIPC_SERVE_RESPONSE_HEAD},
        {"ABORT", SHMIPC_SERVE_ABORT},
        {"WS_DATA", SHMIPC_SERVE_WS_DATA},
        {"WS_PING", SHMIPC_SERVE_WS_PING},
        {"WS_PONG", SHMIPC_SERVE_WS_PONG},
        {"WS_CLOSE", SHMIPC_SERVE_WS_CLOSE},
        {"HDR_SIZE", SHMIPC_SERVE_HDR_SIZE},
        {"MAX_HEAD", SHMIPC_SERVE_MAX_HEAD},
        {"MAX_CHUNK", SHMIPC_SERVE_MAX_CHUNK},
        {"MAX_ABORT_TEXT", SHMIPC_SERVE_MAX_ABORT_TEXT},
        {"REQ_KEEP_ALIVE", SHMIPC_SERVE_REQ_KEEP_ALIVE},
        {"REQ_UPGRADE", SHMIPC_SERVE_REQ_UPGRADE},
        {"REQ_HAS_BODY", SHMIPC_SERVE_REQ_HAS_BODY},
        {"REQ_CHUNKED", SHMIPC_SERVE_REQ_CHUNKED},
        {"REQ_CONTENT_LENGTH", SHMIPC_SERVE_REQ_CONTENT_LENGTH},
        {"REQ_EXPECT_CONTINUE", SHMIPC_SERVE_REQ_EXPECT_CONTINUE},
        {"RESP_CONTENT_LENGTH", SHMIPC_SERVE_RESP_CONTENT_LENGTH},
        {"RESP_CLOSE", SHMIPC_SERVE_RESP_CLOSE},
        {"ABORT_CLIENT_GONE", SHMIPC_SERVE_ABORT_CLIENT_GONE},
        {"ABORT_WORKER_ERROR", SHMIPC_SERVE_ABORT_WORKER_ERROR},
        {"ABORT_TIMEOUT", SHMIPC_SERVE_ABORT_TIMEOUT},
        {"ABORT_PROTOCOL", SHMIPC_SERVE_ABORT_PROTOCOL},
        {"ABORT_TOO_LARGE", SHMIPC_SERVE_ABORT_TOO_LARGE},
        {"ABORT_SHUTDOWN", SHMIPC_SERVE_ABORT_SHUTDOWN},
    };
    for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++)
        if (PyModule_AddIntConstant(m, consts[i].name, consts[i].value) < 0)
            return -1;
    for (size_t i = 0; i < NCOMMON; i++) {
        shmipc_serve_field f = {.name = (const uint8_t *)common_names[i],
                                .name_len = (uint16_t)strlen(common_names[i])};
        if ((st->common_keys[i] = http_key(&f)) == NULL)
            return -1;
        PyUnicode_InternInPlace(&st->common_keys[i]);
    }
    return 0;
}

static int serve_traverse(PyObject *m, visitproc visit, void *arg)
{
    Py_VISIT(state_of(m)->frame_error);
    return 0;
}

static int serve_clear(PyObject *m)
{
    serve_state *st = state_of(m);
    Py_CLEAR(st->frame_error);
    for (size_t i = 0; i < NCOMMON; i++)
        Py_CLEAR(st->common_keys[i]);
    PyObject **keys[] = {
        &st->k_method,      &st->k_script,      &st->k_path,         &st->k_query,
        &st->k_raw_uri,     &st->k_request_uri, &st->k_content_type, &st->k_content_length,
        &st->k_server_name, &st->k_server_port, &st->k_protocol,     &st->k_remote_addr,
        &st->k_remote_port, &st->k_scheme,      &st->k_empty,        &st->k_http,
        &st->k_https,       &st->k_proto10,     &st->k_proto11};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        Py_CLEAR(*keys[i]);
    return 0;
}

static void serve_free(void *m)
{
    serve_clear((PyObject *)m);
}

static PyModuleDef_Slot serve_slots[] = {
    {Py_mod_exec, serve_exec},
    {0, NULL},
};

static PyModuleDef serve_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "shmipc._serve",
    .m_doc = "The shmipc-serve front<->worker frame codec (docs/serve.md), in C.",
    .m_size = sizeof(serve_state),
    .m_methods = serve_methods,
    .m_slots = serve_slots,
    .m_traverse = serve_traverse,
    .m_clear = serve_clear,
    .m_free = serve_free,
};

PyMODINIT_FUNC PyInit__serve(void)
{
    return PyModuleDef_Init(&serve_module);
}
