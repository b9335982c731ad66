/*
 * request.c - the route handlers of shmipc.Server, on the server's worker threads: builds the
 * shmipc._server.Request for a C request, calls the Python handler under the GIL and turns its
 * return value (normalized by _server._normalize) into the C response; an exception is logged and
 * answered with 500.
 *
 * Owns: shmipcpy_route_call (the C route callback), its context, the request/response conversion.
 * May call: the public C API (shmipc_http_*), module.h's helpers and server.c's GIL helpers.
 */
#include "module.h"

#include "shmipc_serve.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Bodies from this size up are lent to the C server instead of copied. */
#define BORROW_MIN (64 * 1024)

/* ---------------------------------------------------------------------------------------- */
/* Handlers (worker threads)                                                                */
/* ---------------------------------------------------------------------------------------- */

static PyObject *str_of(const char *p, size_t len)
{
    return PyUnicode_DecodeLatin1(p ? p : "", (Py_ssize_t)len, NULL);
}

/*
 * The C half of shmipc.Request (_server.py's Request subclasses it): the client's address as
 * the kernel gave it, copied in when the request is made and turned into the (host, port) of
 * Request.client only when that is read. A copy: a Request kept after its handler returned
 * (or a WebSocket's, for the connection's life) reads its own bytes, never the C request's.
 */
typedef struct {
    PyObject_HEAD union {
        struct sockaddr sa; /* sa_family AF_UNSPEC (0, as allocated): no address */
        struct sockaddr_in in;
        struct sockaddr_in6 in6;
    } peer;
} RequestBaseObject;

static PyObject *request_client(PyObject *o, void *closure)
{
    const RequestBaseObject *r = (const RequestBaseObject *)o;
    char host[INET6_ADDRSTRLEN];
    unsigned port;
    (void)closure;
    if (r->peer.sa.sa_family == AF_INET) {
        inet_ntop(AF_INET, &r->peer.in.sin_addr, host, sizeof host);
        port = ntohs(r->peer.in.sin_port);
    } else if (r->peer.sa.sa_family == AF_INET6) {
        inet_ntop(AF_INET6, &r->peer.in6.sin6_addr, host, sizeof host);
        port = ntohs(r->peer.in6.sin6_port);
    } else {
        Py_RETURN_NONE; /* a unix listener's client, or the kernel could not tell */
    }
    return Py_BuildValue("(sI)", host, port);
}

/*
 * `_client`, as `client`, and settable: None, or a (host, port) that inet_pton takes as IPv4
 * or IPv6 with a port of 0 .. 65535, else TypeError or ValueError, the address unchanged.
 * Request.__getstate__ saves it under this name, so that copy, deepcopy and pickle (whose
 * default refuses a type with a C layout: "cannot pickle 'Request' object") keep the client,
 * as they did when it was a plain slot.
 */
static int request_set_client(PyObject *o, PyObject *v, void *closure)
{
    RequestBaseObject *r = (RequestBaseObject *)o;
    struct in_addr a4;
    struct in6_addr a6;
    const char *host;
    int port;
    (void)closure;
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "the client cannot be deleted");
        return -1;
    }
    if (v == Py_None) {
        memset(&r->peer, 0, sizeof r->peer);
        return 0;
    }
    if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != 2) {
        PyErr_Format(PyExc_TypeError, "the client must be None or (host, port), not %R", v);
        return -1;
    }
    if (!PyArg_ParseTuple(v, "si", &host, &port))
        return -1;
    if (port < 0 || port > 65535) {
        PyErr_Format(PyExc_ValueError, "the client's port must be 0 .. 65535, not %d", port);
        return -1;
    }
    if (inet_pton(AF_INET, host, &a4) == 1) {
        memset(&r->peer, 0, sizeof r->peer);
        r->peer.in.sin_family = AF_INET;
        r->peer.in.sin_addr = a4;
        r->peer.in.sin_port = htons((uint16_t)port);
    } else if (inet_pton(AF_INET6, host, &a6) == 1) {
        memset(&r->peer, 0, sizeof r->peer);
        r->peer.in6.sin6_family = AF_INET6;
        r->peer.in6.sin6_addr = a6;
        r->peer.in6.sin6_port = htons((uint16_t)port);
    } else {
        PyErr_Format(PyExc_ValueError, "the client's host %R is not an IPv4 or IPv6 address",
                     PyTuple_GET_ITEM(v, 0));
        return -1;
    }
    return 0;
}

static PyGetSetDef request_base_getset[] = {
    {"client", request_client, NULL,
     "The client's (host, port) on a TCP listener; None on a unix one, or when the kernel\n"
     "could not tell (the client already left).",
     NULL},
    {"_client", request_client, request_set_client,
     "client, settable (None or (host, port)): what Request.__getstate__ saves.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot request_base_slots[] = {
    {Py_tp_doc, "The C half of shmipc.Request: the client's address, decoded when read."},
    {Py_tp_getset, request_base_getset},
    {0, NULL},
};

PyType_Spec shmipcpy_request_base_spec = {
    .name = "shmipc._shmipc._RequestBase",
    .basicsize = sizeof(RequestBaseObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = request_base_slots,
};

PyObject *shmipcpy_make_request(ServerObject *srv, const shmipc_http_request *req)
{
    size_t len, nlen, n = shmipc_http_request_header_count(req);
    const char *p, *name;
    PyObject *args[7] = {NULL};
    PyObject *result = NULL;
    int i;

    p = shmipc_http_request_method(req, &len);
    args[0] = str_of(p, len);
    p = shmipc_http_request_path(req, &len);
    args[1] = str_of(p, len);
    p = shmipc_http_request_query(req, &len);
    args[2] = str_of(p, len);
    p = shmipc_http_request_wildcard(req, &len);
    args[3] = str_of(p, len);
    args[4] =
        PyUnicode_FromString(shmipc_http_request_version(req) == 10 ? "HTTP/1.0" : "HTTP/1.1");
    args[5] = PyList_New((Py_ssize_t)n);
    for (size_t k = 0; args[5] != NULL && k < n; k++) {
        const char *value = shmipc_http_request_header_at(req, k, &name, &nlen, &len);
        PyObject *pair = Py_BuildValue("(NN)", str_of(name, nlen), str_of(value, len));
        if (pair == NULL) {
            Py_CLEAR(args[5]);
            break;
        }
        PyList_SET_ITEM(args[5], (Py_ssize_t)k, pair);
    }
    p = shmipc_http_request_body(req, &len);
    args[6] = PyBytes_FromStringAndSize(p, (Py_ssize_t)len);
    for (i = 0; i < 7; i++)
        if (args[i] == NULL)
            goto out;
    result = PyObject_Vectorcall(srv->request, args, 7, NULL);
    /* The client's address into the object, as it is (the kernel was asked once for the
     * connection): server.c made sure srv->request subclasses _RequestBase, and the exact type
     * is checked here as a Request.__new__ could return anything. An AF_UNIX address does not
     * fit and needs not: its family alone says "no (host, port)". */
    if (result != NULL && Py_TYPE(result) == (PyTypeObject *)srv->request) {
        RequestBaseObject *r = (RequestBaseObject *)result;
        socklen_t plen = sizeof r->peer;
        if (shmipc_http_request_peer(req, &r->peer.sa, &plen) < 0)
            r->peer.sa.sa_family = AF_UNSPEC;
    }
out:
    for (i = 0; i < 7; i++)
        Py_XDECREF(args[i]);
    return result;
}

/* Logs the exception set on this thread as raised by `what` and clears it. */
void shmipcpy_log_exception(ServerObject *srv, const char *what)
{
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    if (tb != NULL && exc != NULL)
        PyException_SetTraceback(exc, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    if (exc == NULL)
        exc = Py_NewRef(Py_None);
    PyObject *res = PyObject_CallFunction(srv->log_error, "Os", exc, what);
    if (res == NULL)
        PyErr_WriteUnraisable(srv->log_error);
    Py_XDECREF(res);
    Py_XDECREF(exc);
}

static void release_bytes(void *obj)
{
    PyGILState_STATE g = shmipcpy_gil_enter();
    Py_DECREF((PyObject *)obj);
    PyGILState_Release(g);
}

/* Sets `body` (a bytes object) as the response body, lent when large. */
static int set_body(shmipc_http_response *res, PyObject *body)
{
    Py_ssize_t len = PyBytes_GET_SIZE(body);
    if (len < BORROW_MIN)
        return shmipc_http_response_body(res, PyBytes_AS_STRING(body), (size_t)len);
    /* release runs on this worker later (or before a failing call returns) and takes the GIL
     * (a nested PyGILState_Ensure() while this thread holds it is fine). */
    Py_INCREF(body);
    return shmipc_http_response_body_borrow(res, PyBytes_AS_STRING(body), (size_t)len, body,
                                            release_bytes);
}

/* A header name or value: str (as UTF-8) or bytes (as they are, for the in-process WSGI/ASGI
 * adapters, whose fields are latin-1 bytes as a front sends them); no NUL. */
const char *shmipcpy_header_str(PyObject *o)
{
    Py_ssize_t n = 0;
    const char *s = NULL;
    if (PyBytes_Check(o)) {
        s = PyBytes_AS_STRING(o);
        n = PyBytes_GET_SIZE(o);
    } else if (PyUnicode_Check(o)) {
        if ((s = PyUnicode_AsUTF8AndSize(o, &n)) == NULL)
            return NULL;
    } else {
        PyErr_Format(PyExc_TypeError, "a header name or value must be str or bytes, not %s",
                     Py_TYPE(o)->tp_name);
        return NULL;
    }
    if (strlen(s) != (size_t)n) {
        PyErr_SetString(PyExc_ValueError, "a header name or value has a NUL byte");
        return NULL;
    }
    return s;
}

/* Applies (status, [(name, value)], body) from _normalize(); < 0 with an exception set. */
static int apply_normalized(ServerObject *srv, shmipc_http_response *res, PyObject *t)
{
    PyObject *headers, *body;
    int status, rc;
    char detail[200];
    (void)srv;
    if (!PyArg_ParseTuple(t, "iOS", &status, &headers, &body))
        return -1;
    if (!PyList_Check(headers)) {
        PyErr_SetString(PyExc_TypeError, "_normalize: headers must be a list");
        return -1;
    }
    rc = shmipc_http_response_set_status(res, status);
    for (Py_ssize_t i = 0; rc == 0 && i < PyList_GET_SIZE(headers); i++) {
        PyObject *no, *vo;
        const char *name, *value;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(headers, i), "OO", &no, &vo) ||
            (name = shmipcpy_header_str(no)) == NULL || (value = shmipcpy_header_str(vo)) == NULL)
            return -1;
        rc = shmipc_http_response_add_header(res, name, value);
    }
    if (rc == 0)
        rc = set_body(res, body);
    if (rc < 0) {
        PyOS_snprintf(detail, sizeof detail, "%s", shmipc_error_detail());
        PyErr_Format(PyExc_ValueError, "invalid response: %s (%s)", detail,
                     shmipc_errname(rc) ? shmipc_errname(rc) : "?");
        return -1;
    }
    return 0;
}

/* The 500 of a failed handler (and of the adapters: inprocess.py's _ERROR), on a response
 * nothing was set on yet. No Python: the queue route answers with it without the GIL. */
const char shmipcpy_error_body[] = "Internal Server Error\n";
const char shmipcpy_error_type[] = "text/plain; charset=utf-8";

int shmipcpy_answer_500(shmipc_http_response *res)
{
    if (shmipc_http_response_set_status(res, 500) < 0 ||
        shmipc_http_response_add_header(res, "Content-Type", shmipcpy_error_type) < 0 ||
        shmipc_http_response_body(res, shmipcpy_error_body, sizeof shmipcpy_error_body - 1) < 0)
        return -1;
    return 0;
}

/* A connection's address as a REQUEST_HEAD names it (family NONE when the kernel could not
 * tell: the client left). */
static void serve_addr(const shmipc_http_request *req, int local, shmipc_serve_addr *out)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    memset(out, 0, sizeof *out);
    if ((local ? shmipc_http_request_local(req, (struct sockaddr *)&ss, &len)
               : shmipc_http_request_peer(req, (struct sockaddr *)&ss, &len)) < 0)
        return;
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)&ss;
        out->family = SHMIPC_SERVE_AF_INET;
        out->port = ntohs(in->sin_port);
        memcpy(out->addr, &in->sin_addr, 4);
    } else if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&ss;
        out->family = SHMIPC_SERVE_AF_INET6;
        out->port = ntohs(in6->sin6_port);
        memcpy(out->addr, &in6->sin6_addr, 16);
    } else if (ss.ss_family == AF_UNIX) {
        out->family = SHMIPC_SERVE_AF_UNIX;
    }
}

/*
 * The request as a REQUEST_HEAD frame of docs/serve.md, for the in-process WSGI/ASGI adapters:
 * they hand it to shmipc._serve's decoder, the one a shmipc-serve worker uses, so an app sees
 * the same environ or scope in both modes: the client's and the listener's address as a
 * front names them (REMOTE_ADDR, the scope's "client" and "server"). The body is complete
 * here, so its length is the Content-Length.
 * Without the GIL (the queue route calls it so): the frame goes to `stack` (`cap` bytes) or,
 * when larger, to *out malloc'd (the caller frees *out when it is not `stack`). Returns its
 * length; 0 with *status set to the answer (414, 431) when the head is over the protocol's
 * limits; -1 when the head cannot be encoded (shmipc_error_detail()), -2 out of memory.
 */
int64_t shmipcpy_encode_request_frame(const shmipc_http_request *req, uint8_t *stack, size_t cap,
                                      uint8_t **out, int *status)
{
    size_t n = shmipc_http_request_header_count(req), plen = 0, qlen = 0, mlen = 0, blen = 0;
    const char *path = shmipc_http_request_path(req, &plen);
    const char *query = shmipc_http_request_query(req, &qlen);
    const char *method = shmipc_http_request_method(req, &mlen);
    shmipc_serve_field fstack[32], *fields = fstack;
    uint8_t tstack[1024], *target = tstack;
    int cl_zero = 0;
    int64_t len = -1;
    size_t tlen = plen + (query != NULL ? 1 + qlen : 0);

    *status = 0;
    *out = stack;
    (void)shmipc_http_request_body(req, &blen);
    if (n > SHMIPC_SERVE_MAX_HEADERS || tlen > SHMIPC_SERVE_MAX_TARGET) {
        *status = n > SHMIPC_SERVE_MAX_HEADERS ? 431 : 414;
        return 0;
    }
    if (n > 32 && (fields = malloc(n * sizeof *fields)) == NULL)
        return -2;
    if (tlen > sizeof tstack && (target = malloc(tlen)) == NULL) {
        len = -2;
        goto out;
    }
    memcpy(target, path, plen);
    if (query != NULL) {
        target[plen] = '?';
        memcpy(target + plen + 1, query, qlen);
    }
    for (size_t k = 0; k < n; k++) {
        size_t nl = 0, vl = 0;
        const char *name;
        const char *value = shmipc_http_request_header_at(req, k, &name, &nl, &vl);
        fields[k] = (shmipc_serve_field){.name = (const uint8_t *)name,
                                         .value = (const uint8_t *)value,
                                         .name_len = (uint32_t)nl,
                                         .value_len = (uint32_t)vl};
        /* "Content-Length: 0": CONTENT_LENGTH "0", as a front sends it (serve_frame.c). */
        if (blen == 0 && nl == 14 && strncasecmp(name, "content-length", 14) == 0)
            cl_zero = 1;
    }
    shmipc_serve_request r = {.size = sizeof r,
                              .version_minor = shmipc_http_request_version(req) == 10 ? 0 : 1,
                              .method = (const uint8_t *)method,
                              .method_len = (uint32_t)mlen,
                              .target = target,
                              .target_len = (uint32_t)tlen};
    serve_addr(req, 0, &r.peer);
    serve_addr(req, 1, &r.local);
    if (blen > 0) {
        r.flags |= SHMIPC_SERVE_REQ_HAS_BODY | SHMIPC_SERVE_REQ_CONTENT_LENGTH;
        r.content_length = blen;
    } else if (cl_zero) {
        r.flags |= SHMIPC_SERVE_REQ_CONTENT_LENGTH;
    }
    len = shmipc_serve_encode_request_head(stack, cap, &r, fields, n);
    if (len == SHMIPC_EMSGSIZE) { /* a big head: the protocol's bound always suffices */
        size_t big = SHMIPC_SERVE_HDR_SIZE + SHMIPC_SERVE_MAX_HEAD;
        if ((*out = malloc(big)) == NULL) {
            *out = stack;
            len = -2;
            goto out;
        }
        len = shmipc_serve_encode_request_head(*out, big, &r, fields, n);
    }
    if (len == SHMIPC_EMSGSIZE) {
        *status = 431;
        len = 0;
    } else if (len < 0) {
        len = -1;
    }
out:
    if (target != tstack)
        free(target);
    if (fields != fstack)
        free(fields);
    return len;
}

/* The frame as bytes, or NULL with *status set (414, 431) or an exception. */
static PyObject *request_frame(const shmipc_http_request *req, int *status)
{
    uint8_t stack[4096], *out;
    int64_t len = shmipcpy_encode_request_frame(req, stack, sizeof stack, &out, status);
    PyObject *frame = NULL;
    if (len > 0)
        frame = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)len);
    else if (len == -2)
        PyErr_NoMemory();
    else if (len < 0)
        PyErr_Format(PyExc_ValueError, "the request does not fit a REQUEST_HEAD frame: %s",
                     shmipc_error_detail());
    if (out != stack)
        free(out);
    return frame;
}

/* A frame route's handler: handler(frame, body) -> (status, [(name, value)], body). */
static PyObject *call_frame_route(route_ctx *ctx, const shmipc_http_request *req, int *direct)
{
    size_t blen = 0;
    const char *b = shmipc_http_request_body(req, &blen);
    PyObject *args[2] = {request_frame(req, direct), NULL};
    PyObject *result = NULL;
    if (args[0] == NULL)
        return NULL;
    args[1] = PyBytes_FromStringAndSize(b, (Py_ssize_t)blen);
    if (args[1] != NULL)
        result = PyObject_Vectorcall(ctx->handler, args, 2, NULL);
    Py_DECREF(args[0]);
    Py_XDECREF(args[1]);
    if (result != NULL && !PyTuple_Check(result)) {
        PyErr_Format(PyExc_TypeError, "a frame route returns (status, headers, body), not %s",
                     Py_TYPE(result)->tp_name);
        Py_CLEAR(result);
    }
    return result;
}

/* A head over the protocol's limits in a frame route: the front's answer (docs/serve.md). */
int shmipcpy_answer_direct(shmipc_http_response *res, int status)
{
    const char *msg = status == 414 ? "URI Too Long\n" : "Request Header Fields Too Large\n";
    if (shmipc_http_response_set_status(res, status) < 0 ||
        shmipc_http_response_add_header(res, "Content-Type", "text/plain") < 0 ||
        shmipc_http_response_body(res, msg, strlen(msg)) < 0)
        return -1;
    return 0;
}

/* Logs the exception set on this thread as the handler's for `req`, and clears it. */
static void log_handler_error(ServerObject *srv, const shmipc_http_request *req)
{
    char what[160];
    size_t mlen = 0, plen = 0;
    const char *m = shmipc_http_request_method(req, &mlen);
    const char *p = shmipc_http_request_path(req, &plen);
    PyOS_snprintf(what, sizeof what, "handler for %.*s %.*s", (int)(mlen > 16 ? 16 : mlen),
                  m ? m : "", (int)(plen > 100 ? 100 : plen), p ? p : "");
    shmipcpy_log_exception(srv, what);
}

int shmipcpy_route_call(shmipc_http_request *req, shmipc_http_response *res, void *user_data)
{
    route_ctx *ctx = user_data;
    if (ctx->frame == SHMIPCPY_ROUTE_QUEUE) /* without the GIL */
        return shmipcpy_queue_route_call(req, res, ctx->queue);
    ServerObject *srv = ctx->server;
    PyGILState_STATE g = shmipcpy_gil_enter();
    int rc = 0, touched = 0, direct = 0;
    shmipcpy_in_callback = 1;
    PyObject *request = NULL, *result;
    if (ctx->frame) {
        result = call_frame_route(ctx, req, &direct);
        if (direct) {
            rc = shmipcpy_answer_direct(res, direct);
            goto done;
        }
    } else {
        request = shmipcpy_make_request(srv, req);
        if (request != NULL) {
            /* For Request.defer() (pending.c), during this call only. */
            shmipcpy_cur_res = res;
            shmipcpy_cur_request = request;
            shmipcpy_cur_deferred = 0;
            result = PyObject_CallOneArg(ctx->handler, request);
            shmipcpy_cur_res = NULL;
            shmipcpy_cur_request = NULL;
        } else {
            result = NULL;
        }
    }
    if (!ctx->frame && request != NULL && shmipcpy_cur_deferred) {
        /* Deferred: the answer is the PendingResponse's. A handler that failed, or returned
         * an answer it can no longer give, makes the C server answer 500 (and end the
         * deferral: a later send() returns False). */
        shmipcpy_cur_deferred = 0;
        if (result != NULL && result != Py_None &&
            Py_TYPE(result) != shmipcpy_server_state(srv)->pending_type)
            PyErr_Format(PyExc_TypeError,
                         "a handler that deferred its request returns None, not %s",
                         Py_TYPE(result)->tp_name);
        rc = 0;
        if (PyErr_Occurred()) {
            log_handler_error(srv, req);
            rc = -1;
        }
        Py_XDECREF(result);
        Py_XDECREF(request);
        goto done;
    }
    if (result != NULL && ctx->frame) {
        touched = 1;
        rc = apply_normalized(srv, res, result) < 0 ? -1 : 0;
    } else if (result != NULL) {
        if (PyBytes_Check(result)) {
            touched = 1;
            rc = set_body(res, result);
        } else if (PyUnicode_Check(result)) {
            Py_ssize_t len;
            const char *text = PyUnicode_AsUTF8AndSize(result, &len);
            if (text != NULL) {
                touched = 1;
                rc = shmipc_http_response_add_header(res, "Content-Type",
                                                     "text/plain; charset=utf-8");
                if (rc == 0)
                    rc = shmipc_http_response_body(res, text, (size_t)len);
            }
        } else {
            PyObject *t = PyObject_CallOneArg(srv->normalize, result);
            if (t != NULL) {
                touched = 1;
                rc = apply_normalized(srv, res, t) < 0 ? -1 : 0;
                Py_DECREF(t);
            }
        }
    }
    if (rc < 0 && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "invalid response: %s (%s)", shmipc_error_detail(),
                     shmipc_errname(rc) ? shmipc_errname(rc) : "?");
    if (PyErr_Occurred()) {
        log_handler_error(srv, req);
        /* A clean 500 keeps the connection; once the handler's answer was partly applied,
         * a negative return makes the C server drop it and answer 500 (closing). */
        rc = touched ? -1 : shmipcpy_answer_500(res);
    }
    Py_XDECREF(result);
    Py_XDECREF(request);
done:
    shmipcpy_in_callback = 0;
    PyGILState_Release(g);
    return rc;
}

void shmipcpy_route_ctx_free(void *user_data)
{
    PyMem_RawFree(user_data);
}
