/*
 * route_queue.c - shmipc._shmipc._RouteQueue: a route that hands its requests to an event loop
 * without the GIL (the in-process ASGI adapter's: shmipc/serve/inprocess.py, ASGIRoute).
 *
 * A handler whose class says _shmipc_frame_route = "queue" and whose `_shmipc_queue` is a
 * _RouteQueue is not called at all: on the server's worker thread, without taking the GIL,
 * the C route call encodes the request as a REQUEST_HEAD frame (request.c), defers it
 * (shmipc_http_response_defer) and queues the frame, the body and the pending answer here; it
 * writes the queue's eventfd when the queue was empty, so a burst of requests costs the loop
 * one wakeup. The loop, woken on fileno(), calls take() and gets (frame, body,
 * PendingResponse) tuples. A worker thread that never takes the GIL never waits for the loop
 * thread that holds it.
 *
 * Owns: the _RouteQueue type and shmipcpy_queue_route_call. May call: the public C API,
 * request.c's frame encoder, pending.c's state and object constructors.
 * Lifetimes: the server holds the queue (in its handlers list) as long as the route exists;
 * close() refuses later requests (the worker answers 500 itself) and answers the queued ones
 * 500; the eventfd is closed with the object.
 */
#include "module.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

typedef struct rq_item {
    struct rq_item *next;
    shmipc_http_pending *p;
    void *st; /* pending.c's state: this item holds its object reference */
    size_t frame_len, body_len;
    uint8_t data[]; /* the frame, then the body */
} rq_item;

typedef struct {
    PyObject_HEAD pthread_mutex_t mu;
    rq_item *head, **tail; /* under mu */
    int closed;            /* under mu */
    int efd;
    pid_t pid;
} RouteQueueObject;

/* A queued request that will never be taken: the adapters' 500, without the GIL. */
static void pending_500(shmipc_http_pending *p)
{
    if (shmipc_http_pending_set_status(p, 500) < 0 ||
        shmipc_http_pending_add_header(p, "Content-Type", shmipcpy_error_type) < 0 ||
        shmipc_http_pending_body(p, shmipcpy_error_body, strlen(shmipcpy_error_body)) < 0) {
        shmipc_http_pending_free(p); /* the server's own 500 */
        return;
    }
    (void)shmipc_http_pending_send(p); /* ECLOSED: the client left meanwhile */
}

/* The C route callback of a queue route, on a server worker thread, without the GIL. */
int shmipcpy_queue_route_call(shmipc_http_request *req, shmipc_http_response *res, PyObject *queue)
{
    RouteQueueObject *q = (RouteQueueObject *)queue;
    uint8_t stack[4096], *frame;
    int status = 0;
    int64_t flen = shmipcpy_encode_request_frame(req, stack, sizeof stack, &frame, &status);
    if (flen <= 0) {
        if (frame != stack)
            free(frame);
        return status != 0 ? shmipcpy_answer_direct(res, status) : shmipcpy_answer_500(res);
    }
    size_t blen = 0;
    const char *body = shmipc_http_request_body(req, &blen);
    rq_item *it = malloc(sizeof *it + (size_t)flen + blen);
    void *st = it != NULL ? shmipcpy_pending_state_new() : NULL;
    if (st == NULL) {
        free(it);
        if (frame != stack)
            free(frame);
        return shmipcpy_answer_500(res);
    }
    it->next = NULL;
    it->st = st;
    it->frame_len = (size_t)flen;
    it->body_len = blen;
    memcpy(it->data, frame, (size_t)flen);
    if (blen > 0)
        memcpy(it->data + flen, body, blen);
    if (frame != stack)
        free(frame);
    if (shmipcpy_pending_defer(res, st, &it->p) < 0) {
        shmipcpy_pending_state_drop(st);
        free(it);
        return shmipcpy_answer_500(res);
    }
    pthread_mutex_lock(&q->mu);
    if (q->closed) { /* the loop takes nothing any more */
        pthread_mutex_unlock(&q->mu);
        pending_500(it->p);
        shmipcpy_pending_state_release(st);
        free(it);
        return 0;
    }
    int wake = q->head == NULL;
    *q->tail = it;
    q->tail = &it->next;
    if (wake) {
        uint64_t one = 1;
        /* Under the mutex, as the C post box does: close() cannot race it. EAGAIN (a
         * saturated counter) still leaves the descriptor readable. */
        ssize_t n = write(q->efd, &one, sizeof one);
        (void)n;
    }
    pthread_mutex_unlock(&q->mu);
    return 0;
}

/* Takes the queued items (the caller frees them). */
static rq_item *grab(RouteQueueObject *q)
{
    uint64_t n;
    while (read(q->efd, &n, sizeof n) > 0)
        ;
    pthread_mutex_lock(&q->mu);
    rq_item *list = q->head;
    q->head = NULL;
    q->tail = &q->head;
    pthread_mutex_unlock(&q->mu);
    return list;
}

static PyObject *rq_take(PyObject *o, PyObject *unused)
{
    (void)unused;
    RouteQueueObject *q = (RouteQueueObject *)o;
    module_state *ms = shmipcpy_state_of_type(Py_TYPE(o));
    rq_item *it = grab(q), *next;
    PyObject *out = PyList_New(0);
    for (; it != NULL; it = next) {
        next = it->next;
        PyObject *t = NULL;
        if (out != NULL) {
            PyObject *pending = shmipcpy_pending_wrap(ms, it->p, it->st);
            it->p = NULL;
            it->st = NULL;
            PyObject *frame =
                PyBytes_FromStringAndSize((const char *)it->data, (Py_ssize_t)it->frame_len);
            PyObject *body = PyBytes_FromStringAndSize((const char *)it->data + it->frame_len,
                                                       (Py_ssize_t)it->body_len);
            if (pending != NULL && frame != NULL && body != NULL)
                t = PyTuple_Pack(3, frame, body, pending);
            Py_XDECREF(frame);
            Py_XDECREF(body);
            Py_XDECREF(pending); /* an object whose request is not handed over answers 500 */
            if (t == NULL || PyList_Append(out, t) < 0)
                Py_CLEAR(out);
            Py_XDECREF(t);
        }
        if (it->p != NULL) { /* not handed over (no memory): 500 */
            pending_500(it->p);
            shmipcpy_pending_state_release(it->st);
        }
        free(it);
    }
    return out;
}

/* close(): later requests are answered 500 by the worker; the queued ones too. */
static PyObject *rq_close(PyObject *o, PyObject *unused)
{
    (void)unused;
    RouteQueueObject *q = (RouteQueueObject *)o;
    pthread_mutex_lock(&q->mu);
    q->closed = 1;
    pthread_mutex_unlock(&q->mu);
    rq_item *it = grab(q), *next;
    for (; it != NULL; it = next) {
        next = it->next;
        pending_500(it->p);
        shmipcpy_pending_state_release(it->st);
        free(it);
    }
    Py_RETURN_NONE;
}

static PyObject *rq_fileno(PyObject *o, PyObject *unused)
{
    (void)unused;
    return PyLong_FromLong(((RouteQueueObject *)o)->efd);
}

static PyObject *rq_get_closed(PyObject *o, void *closure)
{
    (void)closure;
    RouteQueueObject *q = (RouteQueueObject *)o;
    pthread_mutex_lock(&q->mu);
    int closed = q->closed;
    pthread_mutex_unlock(&q->mu);
    return PyBool_FromLong(closed);
}

static PyObject *rq_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (!PyArg_ParseTuple(args, ":_RouteQueue") || (kwargs != NULL && PyDict_Size(kwargs) > 0)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "_RouteQueue() takes no arguments");
        return NULL;
    }
    RouteQueueObject *q = (RouteQueueObject *)type->tp_alloc(type, 0);
    if (q == NULL)
        return NULL;
    q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (q->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(q);
        return NULL;
    }
    pthread_mutex_init(&q->mu, NULL);
    q->tail = &q->head;
    q->pid = shmipcpy_pid;
    return (PyObject *)q;
}

static void rq_dealloc(PyObject *o)
{
    RouteQueueObject *q = (RouteQueueObject *)o;
    PyTypeObject *tp = Py_TYPE(o);
    if (q->efd >= 0) {
        if (!shmipcpy_forked(q->pid)) {
            PyObject *r = rq_close(o, NULL);
            Py_XDECREF(r);
        }
        close(q->efd);
        pthread_mutex_destroy(&q->mu);
    }
    tp->tp_free(o);
    Py_DECREF(tp);
}

static PyMethodDef rq_methods[] = {
    {"take", rq_take, METH_NOARGS,
     "take() -> [(frame, body, PendingResponse)]\n\nThe requests queued since the last take()."},
    {"close", rq_close, METH_NOARGS,
     "close() -> None\n\nLater requests get 500 from the worker; the queued ones get 500."},
    {"fileno", rq_fileno, METH_NOARGS,
     "fileno() -> int\n\nAn eventfd, readable when requests are queued."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef rq_getset[] = {
    {"closed", rq_get_closed, NULL, "True after close().", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot rq_slots[] = {
    {Py_tp_new, rq_new},
    {Py_tp_dealloc, rq_dealloc},
    {Py_tp_methods, rq_methods},
    {Py_tp_getset, rq_getset},
    {Py_tp_doc, "_RouteQueue(): the queue of a route served on an event loop (ASGIRoute's)."},
    {0, NULL},
};

PyType_Spec shmipcpy_route_queue_spec = {
    .name = "shmipc._shmipc._RouteQueue",
    .basicsize = sizeof(RouteQueueObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = rq_slots,
};
