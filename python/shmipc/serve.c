/*
 * serve.c - the shmipc._serve extension: the shmipc-serve frame codec (shmipc_serve.h,
 * docs/serve.md "Protocol") for Python workers. The hot call is decode_request(), which
 * turns a whole REQUEST_HEAD frame into a PEP 3333 environ dict in one pass, so a WSGI worker
 * does no per-header work in Python. The encoders write whole frames as bytes.
 *
 * A module of its own beside _shmipc: it calls the public codec of shmipc_serve.h directly
 * (no descriptor table: the calls take structs) and needs none of _shmipc's objects.
 *
 * Owns: the module (state, exec, FrameError), the decoders (decode_header, decode_request,
 * decode_response); serve_encode.c holds the encoders.
 * May call: the public codec of shmipc_serve.h and serve_encode.c (serve_module.h).
 */
#include "serve_module.h"

#include <arpa/inet.h>
#include <string.h>

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
_Static_assert(sizeof common_names / sizeof common_names[0] == NCOMMON,
               "NCOMMON (serve_module.h) counts common_names");

static serve_state *state_of(PyObject *module)
{
    return (serve_state *)PyModule_GetState(module);
}

PyObject *shmipcpy_serve_frame_error(serve_state *st, int64_t rc, const char *what)
{
    if (rc == 0)
        PyErr_Format(st->frame_error, "%s: an incomplete frame", what);
    else
        PyErr_Format(st->frame_error, "%s: the frame breaks the protocol (%lld)", what,
                     (long long)rc);
    return NULL;
}

/* A decode_request/_response failure: a whole valid frame of another type is named as such
 * (the typed decoders refuse it like a bad frame), anything else is shmipcpy_serve_frame_error. */
static PyObject *other_frame_error(serve_state *st, const void *buf, size_t len, int64_t rc,
                                   const char *what, const char *want)
{
    shmipc_serve_frame f = {.size = sizeof f};
    if (rc < 0 && shmipc_serve_decode(buf, len, &f) == (int64_t)len) {
        PyErr_Format(st->frame_error, "%s: a %s frame, not %s", what,
                     shmipc_serve_type_name(f.type), want);
        return NULL;
    }
    return shmipcpy_serve_frame_error(st, rc, what);
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
        return shmipcpy_serve_frame_error(st, rc, "decode_header");
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

size_t shmipcpy_serve_percent_decode(const uint8_t *p, size_t n, uint8_t *out)
{
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
    return o;
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
    size_t o = shmipcpy_serve_percent_decode(p, n, out);
    int rc = set_str(d, key, out, o);
    if (out != stackbuf)
        PyMem_Free(out);
    return rc;
}

/* An address as text; 0 when there is none (family none or unix). */
static int addr_text(const shmipc_serve_addr *a, char *out, size_t cap)
{
    if (a->family == SHMIPC_SERVE_AF_INET && cap >= sizeof "255.255.255.255") {
        /* inet_ntop's text, without its sprintf (a good part of a request's decode) */
        char *p = out;
        for (int i = 0; i < 4; i++) {
            unsigned v = a->addr[i];
            if (v >= 100)
                *p++ = (char)('0' + v / 100);
            if (v >= 10)
                *p++ = (char)('0' + v / 10 % 10);
            *p++ = (char)('0' + v % 10);
            *p++ = i < 3 ? '.' : '\0';
        }
        return 1;
    }
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

/* The target's path and query part: the target itself in origin form; in absolute form
 * "http://host/p?q" what follows the authority (RFC 9112 §3.2.2), NULL with length 0 for
 * "http://h", "?q" for "http://h?q"; "*" for OPTIONS. Shared with serve_scope.c. */
const uint8_t *shmipcpy_serve_target_path(const shmipc_serve_request *r, size_t *len)
{
    const uint8_t *t = r->target;
    size_t tn = r->target_len;
    if (tn && t[0] != '/' && t[0] != '*') {
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
    *len = tn;
    return t;
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
    PyObject *d = shmipcpy_serve_decode_environ(st, b.buf, b.len, base);
    PyBuffer_Release(&b);
    return d;
}

PyObject *shmipcpy_serve_decode_environ(serve_state *st, const void *buf, Py_ssize_t len,
                                        PyObject *base)
{
    PyObject *d = NULL;
    shmipc_serve_request req = {.size = sizeof req};
    int64_t rc = shmipc_serve_decode_request(buf, (size_t)len, &req);
    if (rc <= 0 || rc != len) {
        if (rc > 0)
            PyErr_Format(st->frame_error, "decode_request: %zd bytes after the frame",
                         len - (Py_ssize_t)rc);
        else
            other_frame_error(st, buf, (size_t)len, rc, "decode_request", "REQUEST_HEAD");
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

    size_t tn;
    const uint8_t *t = shmipcpy_serve_target_path(r, &tn);
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
    return d;
fail:
    Py_XDECREF(d);
    return NULL;
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
            shmipcpy_serve_frame_error(st, -2, "decode_response");
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
    {"decode_request_scope", shmipcpy_serve_py_decode_request_scope, METH_O,
     "decode_request_scope(frame) -> dict: a whole REQUEST_HEAD frame as the ASGI 3 HTTP\n"
     "connection scope (docs/serve.md, \"The ASGI worker\"). FrameError when it breaks\n"
     "docs/serve.md."},
    {"asgi_start", shmipcpy_serve_py_asgi_start, METH_O,
     "asgi_start(message) -> (status, fields, close, content_length): an ASGI\n"
     "http.response.start checked (status 200..599, (bytes, bytes) headers) and split: the\n"
     "fields without the hop-by-hop ones, close for Connection: close, content_length from\n"
     "Content-Length (None without one). TypeError or ValueError for what it refuses."},
    {"decode_response", py_decode_response, METH_O,
     "decode_response(frame) -> (status, flags, content_length, [(name, value), ...])."},
    {"encode_response_head", (PyCFunction)(void (*)(void))shmipcpy_serve_py_encode_response_head,
     METH_VARARGS | METH_KEYWORDS,
     "encode_response_head(status, headers, flags=0, content_length=0) -> bytes\n"
     "(a whole RESPONSE_HEAD frame; ValueError for what a receiver would refuse)."},
    {"encode_request_head", (PyCFunction)(void (*)(void))shmipcpy_serve_py_encode_request_head,
     METH_VARARGS | METH_KEYWORDS,
     "encode_request_head(method, target, headers, flags=0, content_length=0, peer=None,\n"
     "local=None, version_minor=1, scheme=0) -> bytes. Addresses are (host, port), 'unix'\n"
     "or None."},
    {"encode_frame", (PyCFunction)(void (*)(void))shmipcpy_serve_py_encode_frame,
     METH_VARARGS | METH_KEYWORDS,
     "encode_frame(type, payload=b'', arg=0) -> bytes: a BODY, END, ABORT or WS_* frame."},
    {"response_fields", (PyCFunction)(void (*)(void))shmipcpy_serve_py_response_fields,
     METH_FASTCALL,
     "response_fields(pairs, close) -> list: (name, value) bytes pairs for the in-process C\n"
     "server: Date and Server dropped (the server's own), a second Content-Type dropped,\n"
     "(b'Connection', b'close') added when close is true."},
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
        {"HELLO", SHMIPC_SERVE_HELLO},
        {"TAKEN", SHMIPC_SERVE_TAKEN},
        {"HELLO_SIZE", SHMIPC_SERVE_HELLO_SIZE},
        {"FEAT_TAKEN", SHMIPC_SERVE_FEAT_TAKEN},
        {"REQ_TAKEN_WANTED", SHMIPC_SERVE_REQ_TAKEN_WANTED},
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
    if (shmipcpy_serve_add_wsgi(m) < 0 || shmipcpy_serve_add_wsgi_worker(m) < 0 ||
        shmipcpy_serve_add_asgi(m) < 0)
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
