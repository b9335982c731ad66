/*
 * pending.c - shmipc.PendingResponse: a request's answer sent later, from any thread, over the
 * C API's deferred answers (shmipc_http_response_defer(), shmipc_http_pending_*; docs/http.md
 * and docs/python.md, "Answers from any thread"). A route handler gets one from
 * Request.defer() (or, for a frame route that asks for it, as its third argument); send()
 * answers, close() (or the object's end) answers 500 if nothing was sent.
 *
 * Owns: the PendingResponse type, its state shared with the C on_end callback, and
 * _shmipc._defer (Request.defer's C side). May call: the public C API, module.h's helpers.
 * Threads: every method runs under the GIL, which makes one thread at a time use the C handle,
 * as the C API asks. on_end runs on the server's worker thread and takes the GIL.
 */
#include "module.h"

#include <stdatomic.h>
#include <string.h>
#include <structmember.h>

/* Bodies from this size up are lent to the C server instead of copied (request.c's too). */
#define BORROW_MIN (64 * 1024)

/*
 * What the object and the C on_end callback share; both hold a reference. The callback runs
 * on the server's worker thread and takes the GIL only when there is an on_end to call: the
 * end of an answered request costs the worker no GIL (the loop thread of an in-process ASGI
 * app holds it most of the time). So `reason` and `refs` are atomic, and `on_end` is written
 * under the GIL but read by the worker without it. An on_end set after the request ended is
 * not called: whoever sets it looks at `reason` afterwards.
 */
typedef struct {
    PyObject *_Atomic on_end; /* callable or NULL; its reference is the state's */
    atomic_int refs;
    atomic_int reason; /* -1 while the request waits */
} pend_state;

typedef struct {
    PyObject_HEAD shmipc_http_pending *p; /* NULL once sent or closed */
    pend_state *st;
    pid_t pid;
    PyObject *weakreflist;
} PendingObject;

/* The route call of this thread (request.c sets them around a plain route's handler). */
_Thread_local shmipc_http_response *shmipcpy_cur_res;
_Thread_local PyObject *shmipcpy_cur_request; /* borrowed */
_Thread_local int shmipcpy_cur_deferred;

/* Drops a reference; the GIL held. */
static void state_unref(pend_state *st)
{
    if (atomic_fetch_sub(&st->refs, 1) != 1)
        return;
    Py_XDECREF(atomic_load(&st->on_end));
    PyMem_RawFree(st);
}

/* The C callback: once, on the worker thread, when the request stops waiting. */
static void pend_end(void *user_data, int reason)
{
    pend_state *st = user_data;
    atomic_store(&st->reason, reason);
    if (atomic_load(&st->on_end) == NULL) {
        /* Nothing to call. The last reference here means the object is gone; it may have set
         * an on_end between the look above and the drop, which then needs the GIL to go. */
        if (atomic_fetch_sub(&st->refs, 1) == 1) {
            if (atomic_load(&st->on_end) != NULL) {
                PyGILState_STATE g = shmipcpy_gil_enter();
                Py_DECREF(atomic_load(&st->on_end));
                PyGILState_Release(g);
            }
            PyMem_RawFree(st);
        }
        return;
    }
    PyGILState_STATE g = shmipcpy_gil_enter();
    PyObject *cb = atomic_load(&st->on_end); /* again: it may have changed meanwhile */
    if (cb != NULL) {
        Py_INCREF(cb);
        PyObject *r = PyObject_CallFunction(cb, "i", reason);
        if (r == NULL)
            PyErr_WriteUnraisable(cb);
        Py_XDECREF(r);
        Py_DECREF(cb);
    }
    state_unref(st);
    PyGILState_Release(g);
}

/* ---- a deferral's state and object; the queue route (route_queue.c) makes the deferral
 * without the GIL, Request.defer() with it ---- */

void *shmipcpy_pending_state_new(void)
{
    pend_state *st = PyMem_RawMalloc(sizeof *st);
    if (st == NULL)
        return NULL;
    atomic_init(&st->on_end, NULL);
    atomic_init(&st->refs, 2); /* the callback's, and the object's (or the queued item's) */
    atomic_init(&st->reason, -1);
    return st;
}

int shmipcpy_pending_defer(shmipc_http_response *res, void *st, shmipc_http_pending **out)
{
    return shmipc_http_response_defer(res, -1, pend_end, st, out);
}

/* A state whose deferral was never made: nobody else holds it. */
void shmipcpy_pending_state_drop(void *st)
{
    PyMem_RawFree(st);
}

/* The object's reference before there is an object (a queued item's), given up without the
 * GIL: no on_end was ever set. */
void shmipcpy_pending_state_release(void *st)
{
    pend_state *s = st;
    if (atomic_fetch_sub(&s->refs, 1) == 1)
        PyMem_RawFree(s);
}

/* A PendingResponse over a deferral made without the GIL; takes `p` and the item's reference
 * to `st` in every case (on failure the request is answered 500). */
PyObject *shmipcpy_pending_wrap(module_state *ms, shmipc_http_pending *p, void *st)
{
    PendingObject *self = PyObject_GC_New(PendingObject, ms->pending_type);
    if (self == NULL) {
        shmipc_http_pending_free(p);
        shmipcpy_pending_state_release(st);
        return NULL;
    }
    self->p = p;
    self->st = st;
    self->pid = shmipcpy_pid;
    self->weakreflist = NULL;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

/* Request.defer()'s deferral, on the worker thread inside the route call (where no on_end
 * of this request can run yet). */
PyObject *shmipcpy_pending_new(module_state *ms, shmipc_http_response *res, int timeout_ms,
                               PyObject *on_end)
{
    if (on_end == Py_None)
        on_end = NULL;
    if (on_end != NULL && !PyCallable_Check(on_end)) {
        PyErr_SetString(PyExc_TypeError, "on_end must be callable or None");
        return NULL;
    }
    void *st = shmipcpy_pending_state_new();
    if (st == NULL)
        return PyErr_NoMemory();
    shmipc_http_pending *p;
    int rc = shmipc_http_response_defer(res, timeout_ms, pend_end, st, &p);
    if (rc < 0) {
        shmipcpy_pending_state_drop(st);
        return shmipcpy_raise_last(ms, rc);
    }
    PyObject *self = shmipcpy_pending_wrap(ms, p, st);
    if (self != NULL && on_end != NULL)
        atomic_store(&((pend_state *)st)->on_end, Py_NewRef(on_end));
    return self;
}

/* A lent body's release: on the worker thread once written, or on the thread of the send()
 * that was refused (any Python thread, holding the GIL): not shmipcpy_gil_enter(), which is
 * for the server's own threads. The worker has a thread state of its own by then (its route
 * callback made it), so the Ensure is cheap there too. */
static void release_bytes(void *obj)
{
    PyGILState_STATE g = PyGILState_Ensure();
    Py_DECREF((PyObject *)obj);
    PyGILState_Release(g);
}

/* The answer's fields and body onto the handle `p`, which send() took from the object first:
 * the Python code this runs (a headers iterator, a body's buffer) cannot reach it through
 * the object (a nested or another thread's send() or close() finds it sent); < 0 with an
 * exception set. */
static int build(shmipc_http_pending *p, int status, PyObject *headers, PyObject *body)
{
    int rc = shmipc_http_pending_set_status(p, status);
    PyObject *it = NULL, *pair;
    if (rc == 0 && headers != NULL && headers != Py_None) {
        if ((it = PyObject_GetIter(headers)) == NULL)
            return -1;
        while (rc == 0 && (pair = PyIter_Next(it)) != NULL) {
            /* A (name, value) pair: a tuple, a list, any sequence of two but text. */
            PyObject *seq =
                PyUnicode_Check(pair) || PyBytes_Check(pair)
                    ? (PyErr_SetString(PyExc_TypeError, "a header must be a (name, value) pair"),
                       NULL)
                    : PySequence_Fast(pair, "a header must be a (name, value) pair");
            Py_DECREF(pair);
            const char *name, *value;
            if (seq != NULL && PySequence_Fast_GET_SIZE(seq) != 2)
                PyErr_Format(PyExc_TypeError,
                             "a header must be a (name, value) pair, not %zd items",
                             PySequence_Fast_GET_SIZE(seq));
            if (seq == NULL || PyErr_Occurred() ||
                (name = shmipcpy_header_str(PySequence_Fast_GET_ITEM(seq, 0))) == NULL ||
                (value = shmipcpy_header_str(PySequence_Fast_GET_ITEM(seq, 1))) == NULL) {
                Py_XDECREF(seq);
                Py_DECREF(it);
                return -1;
            }
            rc = shmipc_http_pending_add_header(p, name, value);
            Py_DECREF(seq);
        }
        Py_DECREF(it);
        if (PyErr_Occurred())
            return -1;
    }
    if (rc == 0 && PyBytes_Check(body) && PyBytes_GET_SIZE(body) >= BORROW_MIN) {
        Py_INCREF(body);
        rc = shmipc_http_pending_body_borrow(p, PyBytes_AS_STRING(body),
                                             (size_t)PyBytes_GET_SIZE(body), body, release_bytes);
    } else if (rc == 0 && PyUnicode_Check(body)) {
        Py_ssize_t n;
        const char *text = PyUnicode_AsUTF8AndSize(body, &n);
        if (text == NULL)
            return -1;
        rc = shmipc_http_pending_body(p, text, (size_t)n);
    } else if (rc == 0) {
        Py_buffer view;
        if (PyObject_GetBuffer(body, &view, PyBUF_SIMPLE) < 0)
            return -1;
        rc = shmipc_http_pending_body(p, view.buf, (size_t)view.len);
        PyBuffer_Release(&view);
    }
    if (rc < 0) {
        char detail[200];
        PyOS_snprintf(detail, sizeof detail, "%s", shmipc_error_detail());
        PyErr_Format(PyExc_ValueError, "invalid response: %s (%s)", detail,
                     shmipc_errname(rc) ? shmipc_errname(rc) : "?");
        return -1;
    }
    return 0;
}

static PyObject *pending_send(PendingObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"status", "headers", "body", NULL};
    int status = 200;
    PyObject *headers = NULL, *body = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|iOO:send", kwlist, &status, &headers, &body))
        return NULL;
    if (self->p == NULL || shmipcpy_forked(self->pid)) {
        PyErr_SetString(PyExc_RuntimeError, "this PendingResponse was sent or closed already");
        return NULL;
    }
    PyObject *empty = NULL;
    if (body == NULL || body == Py_None)
        body = empty = PyBytes_FromStringAndSize(NULL, 0);
    if (body == NULL)
        return NULL;
    /* Given up by the object before any Python code runs in build(). */
    shmipc_http_pending *p = self->p;
    self->p = NULL;
    int built = build(p, status, headers, body);
    Py_XDECREF(empty);
    if (built < 0) {
        /* All or nothing: an answer half built is no answer. The client gets 500, as for a
         * handler that returned an invalid response. */
        shmipc_http_pending_free(p);
        return NULL;
    }
    int rc = shmipc_http_pending_send(p);
    if (rc == SHMIPC_ECLOSED)
        Py_RETURN_FALSE;
    if (rc < 0)
        return shmipcpy_raise_last(shmipcpy_state_of_type(Py_TYPE(self)), rc);
    Py_RETURN_TRUE;
}

static PyObject *pending_close(PendingObject *self, PyObject *unused)
{
    (void)unused;
    shmipc_http_pending *p = self->p;
    self->p = NULL;
    if (p != NULL && !shmipcpy_forked(self->pid))
        shmipc_http_pending_free(p);
    Py_RETURN_NONE;
}

static PyObject *pending_enter(PendingObject *self, PyObject *unused)
{
    (void)unused;
    return Py_NewRef(self);
}

static PyObject *pending_exit(PendingObject *self, PyObject *args)
{
    (void)args;
    return pending_close(self, NULL);
}

static PyObject *get_waiting(PendingObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(atomic_load(&self->st->reason) < 0);
}

static PyObject *get_reason(PendingObject *self, void *closure)
{
    (void)closure;
    int reason = atomic_load(&self->st->reason);
    if (reason < 0)
        Py_RETURN_NONE;
    return PyLong_FromLong(reason);
}

static PyObject *get_sent(PendingObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->p == NULL);
}

static PyObject *get_on_end(PendingObject *self, void *closure)
{
    (void)closure;
    PyObject *cb = atomic_load(&self->st->on_end);
    return Py_NewRef(cb != NULL ? cb : Py_None);
}

static int set_on_end(PendingObject *self, PyObject *value, void *closure)
{
    (void)closure;
    if (value != NULL && value != Py_None && !PyCallable_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "on_end must be callable or None");
        return -1;
    }
    PyObject *cb = value != NULL && value != Py_None ? Py_NewRef(value) : NULL;
    /* The worker reads it without the GIL, and uses it only under the GIL (which this thread
     * holds): the old one can go now. */
    Py_XDECREF(atomic_exchange(&self->st->on_end, cb));
    return 0;
}

static int pending_traverse(PendingObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    /* While the C callback holds the state (refs 2) it may still call on_end: not visited
     * then, nor cleared (a cycle through it lives until the request stops waiting). Once the
     * request ended, on_end is this object's alone, and a cycle through it is collectable. */
    if (self->st != NULL && self->st->refs == 1)
        Py_VISIT(self->st->on_end);
    return 0;
}

static int pending_clear(PendingObject *self)
{
    if (self->st != NULL && self->st->refs == 1)
        Py_CLEAR(self->st->on_end);
    return 0;
}

static void pending_dealloc(PendingObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    if (self->p != NULL && !shmipcpy_forked(self->pid))
        shmipc_http_pending_free(self->p); /* never sent: the client gets 500 */
    self->p = NULL;
    if (self->st != NULL)
        state_unref(self->st);
    PyObject_GC_Del(self);
    Py_DECREF(tp);
}

static PyObject *pending_repr(PendingObject *self)
{
    const char *state = atomic_load(&self->st->reason) >= 0 ? "ended"
                        : self->p == NULL                   ? "sent"
                                                            : "waiting";
    return PyUnicode_FromFormat("<shmipc.PendingResponse %s>", state);
}

static PyMethodDef pending_methods[] = {
    {"send", (PyCFunction)(void (*)(void))pending_send, METH_VARARGS | METH_KEYWORDS,
     "send(status=200, headers=(), body=b'') -> bool\n\n"
     "Answers the request, from any thread: True once the answer is queued for the client,\n"
     "False when the request no longer waits (the client left, its deadline passed, the\n"
     "server stopped). headers: (name, value) pairs, str or bytes; body: bytes-like, or\n"
     "str (sent as UTF-8).\n"
     "An invalid status or field raises ValueError and the client gets 500. Once only\n"
     "(RuntimeError afterwards)."},
    {"close", (PyCFunction)pending_close, METH_NOARGS,
     "close() -> None\n\nGives the answer up unsent: a request still waiting gets 500.\n"
     "Nothing after send(). Also when the object goes away unsent."},
    {"__enter__", (PyCFunction)pending_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)pending_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef pending_getset[] = {
    {"waiting", (getter)get_waiting, NULL,
     "True until the request stopped waiting (answered, or ended otherwise: see reason).", NULL},
    {"reason", (getter)get_reason, NULL,
     "None while the request waits; then why it stopped: shmipc.PENDING_SENT, _CLIENT_GONE,\n"
     "_TIMEOUT, _FAILED or _ABANDONED.",
     NULL},
    {"sent", (getter)get_sent, NULL, "True once send() or close() gave the answer up.", NULL},
    {"on_end", (getter)get_on_end, (setter)set_on_end,
     "Called once with the reason, on the server's worker thread, when the request stops\n"
     "waiting (it must not block); None for nothing.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef pending_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(PendingObject, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot pending_slots[] = {
    {Py_tp_dealloc, pending_dealloc},
    {Py_tp_traverse, pending_traverse},
    {Py_tp_clear, pending_clear},
    {Py_tp_repr, pending_repr},
    {Py_tp_methods, pending_methods},
    {Py_tp_getset, pending_getset},
    {Py_tp_members, pending_members},
    {Py_tp_doc, "The answer to a deferred request (Request.defer()): send() it from any thread,\n"
                "once. Not made directly."},
    {0, NULL},
};

PyType_Spec shmipcpy_pending_spec = {
    .name = "shmipc.PendingResponse",
    .basicsize = sizeof(PendingObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = pending_slots,
};

/* _shmipc._defer(request, timeout_ms, on_end): Request.defer()'s C side. */
PyObject *shmipcpy_defer(PyObject *module, PyObject *args)
{
    PyObject *request, *on_end = Py_None;
    int timeout_ms;
    if (!PyArg_ParseTuple(args, "Oi|O:_defer", &request, &timeout_ms, &on_end))
        return NULL;
    if (shmipcpy_cur_res == NULL || shmipcpy_cur_request != request) {
        PyErr_SetString(PyExc_RuntimeError,
                        "Request.defer() is for the request's own route handler, while it runs");
        return NULL;
    }
    if (shmipcpy_cur_deferred) {
        PyErr_SetString(PyExc_RuntimeError, "Request.defer(): deferred already");
        return NULL;
    }
    PyObject *p =
        shmipcpy_pending_new(PyModule_GetState(module), shmipcpy_cur_res, timeout_ms, on_end);
    if (p != NULL)
        shmipcpy_cur_deferred = 1;
    return p;
}
