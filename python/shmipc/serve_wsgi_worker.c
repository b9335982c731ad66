/*
 * serve_wsgi_worker.c - shmipc._serve.WSGIWorker: the shmipc-serve WSGI worker's request in C
 * (docs/serve.md, "The Python worker (WSGI)"). WSGIHandler.handle (shmipc/serve/wsgi.py) gives
 * it each stream: it reads the REQUEST_HEAD, runs the app and sends its response, with the
 * same frames, checks, outcomes and failures as the Python route of wsgi.py, whose _Exchange
 * and _Response it mirrors method by method; the Python per request was most of a pipelined
 * request's cost in the worker (docs/benchmarks.md).
 *
 * It serves every REQUEST_HEAD that decodes, its body read through wsgi.input (wsgi.py's
 * _Input, on this exchange's next_body). What is not a request is handed back before anything
 * was sent: a first frame other than a REQUEST_HEAD (HELLO, a late ABORT, a bad frame), or one
 * that does not decode. handle() then returns (the header's bytes, the payload or None) and
 * wsgi.py serves the stream from there. The rare turns (a failed app, a bad frame, ABORT) call
 * wsgi.py's functions (_failed, _violation, ...), which use the exchange's methods.
 *
 * Owns: the WSGIWorker, WSGIExchange and WSGIStreamResponse types.
 * May call: CPython (the Stream's methods through their Python names), the codec of
 * shmipc_serve.h and the module's helpers (serve_module.h).
 */
#include "serve_module.h"

#include <stddef.h>
#include <string.h>
#include <structmember.h>
#include <time.h>

/* What wsgi.py gives WSGIWorker (its hooks dict), by these names. */
enum {
    H_ABORTED,       /* RequestAborted */
    H_VIOLATION,     /* ProtocolViolation */
    H_LENGTH_ERROR,  /* _LengthError */
    H_INPUT,         /* _Input(ex): wsgi.input */
    H_FLAT,          /* _flat(data): a bytearray or memoryview piece as bytes, one per item */
    H_STREAM_ENDED,  /* _stream_ended(st, e) */
    H_ON_ABORTED,    /* _aborted(frame, e) -> outcome */
    H_ON_VIOLATION,  /* _violation(ex, e) -> outcome */
    H_CLOSE_FAILED,  /* _close_failed(e) */
    H_FAILED,        /* _failed(ex, head_sent, frame, method, e) -> outcome */
    H_DRAIN_TIMEOUT, /* _ABORT_DRAIN_TIMEOUT */
    H_HEAD_TIMEOUT,  /* _HEAD_READ_TIMEOUT */
    H_ERROR,         /* shmipc.Error */
    H_EOS,           /* shmipc.EndOfStreamError */
    H_PEER_GONE,     /* shmipc.PeerGoneError */
    H_CLOSED,        /* shmipc.ClosedError */
    H_TIMEOUT,       /* shmipc.TimeoutError */
    NHOOK
};
static const char *const hook_names[NHOOK] = {
    "RequestAborted",
    "ProtocolViolation",
    "_LengthError",
    "_Input",
    "_flat",
    "_stream_ended",
    "_aborted",
    "_violation",
    "_close_failed",
    "_failed",
    "_ABORT_DRAIN_TIMEOUT",
    "_HEAD_READ_TIMEOUT",
    "Error",
    "EndOfStreamError",
    "PeerGoneError",
    "ClosedError",
    "TimeoutError",
};

/* Names and constants made once (the module's state). */
enum {
    N_READEXACTLY,
    N_WRITE,
    N_FLUSH,
    N_FLUSH_CLOSE,
    N_CLOSE,
    N_READ_TIMEOUT,
    N_START_RESPONSE,
    N_KW_NONBLOCK, /* ("nonblock",) */
    N_INPUT_KEY,   /* "wsgi.input" */
    N_OK,
    N_ERROR,
    N_ABORTED,
    N_PROTOCOL,
    N_TAKEN, /* the TAKEN frame */
    N_END,   /* the END frame */
    N_EMPTY, /* b"" */
    NNAME
};

typedef struct {
    PyObject_HEAD PyObject *app;
    PyObject *base; /* the constant wsgi.* keys of every environ */
    PyObject *hook[NHOOK];
    PyObject *name[NNAME];
    PyTypeObject *exchange_type, *response_type;
    /* The Stream's methods, N_READEXACTLY .. N_CLOSE, as found on st_type: called with the
     * stream first, without a lookup per call (st_method). */
    PyTypeObject *st_type;
    PyObject *st_meth[N_CLOSE + 1];
} wsgi_worker;

/* The worker's end of one stream (wsgi.py's _Exchange). */
typedef struct {
    PyObject_HEAD PyObject *st;
    wsgi_worker *w;
    char done;        /* the front's END (or ABORT) was read */
    char aborted;     /* the front ended the request */
    char end_queued;  /* our END is written, not flushed: close() sends it (flush_close) */
    char has_partial; /* a frame whose header was read and whose payload had not all arrived */
    char has_body;    /* HAS_BODY: BODY frames may follow the head */
    char has_expect;  /* CONTENT_LENGTH: exactly `expect` bytes of them */
    uint32_t ptype, plen, parg;
    uint32_t abort_reason;
    uint64_t expect, got; /* the head's content_length; body bytes read */
    PyObject *pending;    /* a BODY payload check_abort read ahead, for wsgi.input */
    double drain_by;      /* drain()'s deadline (mono_s()) while it runs, else 0 */
    /* Small parts queued: written to the stream as one before anything else is (a write, the
     * flush, the close), so a response's frames cost one write() of the Stream, not one each
     * (with memory_wait each gives up the GIL). The frames go out as before: nothing is sent
     * before the flush or the close anyway. */
    char *wbuf;
    size_t wlen, wcap;
} wsgi_exchange;

/* The most wbuf holds; a larger part is written on its own. */
#define COALESCE_MAX (16 * 1024)

/* wsgi.py's _Response: WSGIResponse that sends on its exchange. */
typedef struct {
    wsgi_response r;
    wsgi_exchange *ex;
    char hold; /* the app's iterable is a list or tuple: the last piece and END wait */
} stream_response;

static int is_set(PyObject *x)
{
    return x != NULL && x != Py_None;
}

/* The pending exception, normalized, with its traceback: a new reference (none pending: NULL). */
static PyObject *fetch_exc(void)
{
    PyObject *type, *e, *tb;
    PyErr_Fetch(&type, &e, &tb);
    if (type == NULL)
        return NULL;
    PyErr_NormalizeException(&type, &e, &tb);
    if (tb != NULL && e != NULL)
        PyException_SetTraceback(e, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return e;
}

/* Raises e (a reference taken) as it is, its __context__ and traceback kept: as the Python
 * route's bare `raise` and `finally` let an exception through. PyErr_SetObject chains it to the
 * exception being handled (the caller's, or the app's own `except` block's), which replaced the
 * __context__ the exception had. */
static void restore_exc(PyObject *e)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(e);
#else
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(e)), e, PyException_GetTraceback(e));
#endif
}

/* ---- the stream ------------------------------------------------------------------------- */

/*
 * st.NAME(args[1:]) (args[0] is the stream). A shmipc.Stream's type allows no subclass and its
 * instances have no attributes of their own, so its methods are the type's: taken once from
 * the first such type seen and called directly. Any other object's are looked up per call.
 */
static PyObject *st_invoke(wsgi_exchange *ex, int name, PyObject *const *args, size_t nargs,
                           PyObject *kwnames)
{
    wsgi_worker *w = ex->w;
    PyTypeObject *tp = Py_TYPE(ex->st);
    if (w->st_type == NULL && (tp->tp_flags & Py_TPFLAGS_IMMUTABLETYPE) &&
        !(tp->tp_flags & Py_TPFLAGS_BASETYPE) && tp->tp_dictoffset == 0) {
        PyObject *m[N_CLOSE + 1] = {NULL};
        int ok = 1;
        for (int i = 0; ok && i <= N_CLOSE; i++) {
            m[i] = PyObject_GetAttr((PyObject *)tp, w->name[i]);
            ok = m[i] != NULL && Py_IS_TYPE(m[i], &PyMethodDescr_Type);
        }
        PyErr_Clear();
        for (int i = 0; i <= N_CLOSE; i++) {
            if (ok)
                w->st_meth[i] = m[i];
            else
                Py_XDECREF(m[i]);
        }
        if (ok)
            w->st_type = (PyTypeObject *)Py_NewRef(tp);
    }
    if (tp == w->st_type)
        return PyObject_Vectorcall(w->st_meth[name], args, nargs, kwnames);
    return PyObject_VectorcallMethod(w->name[name], (PyObject **)args, nargs, kwnames);
}

/* CLOCK_MONOTONIC in seconds, time.monotonic()'s clock. */
static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Before a read of drain(): what is left of its deadline as the stream's read timeout; once it
 * passed, shmipc.TimeoutError and no read (wsgi.py's _Exchange._drain_left). */
static int drain_left(wsgi_exchange *ex)
{
    double left = ex->drain_by - mono_s();
    if (left <= 0) {
        PyObject *st_id = PyObject_GetAttrString(ex->st, "id");
        PyObject *msg =
            st_id != NULL
                ? PyUnicode_FromFormat("stream %S: the front did not end the request within "
                                       "%S s of the worker's END or ABORT",
                                       st_id, ex->w->hook[H_DRAIN_TIMEOUT])
                : NULL;
        if (msg != NULL)
            PyErr_SetObject(ex->w->hook[H_TIMEOUT], msg);
        Py_XDECREF(msg);
        Py_XDECREF(st_id);
        return -1;
    }
    PyObject *t = PyFloat_FromDouble(left);
    int rc = t != NULL ? PyObject_SetAttr(ex->st, ex->w->name[N_READ_TIMEOUT], t) : -1;
    Py_XDECREF(t);
    return rc;
}

/* st.readexactly(n[, nonblock=True]): bytes, Py_None (nothing yet), or NULL. */
static PyObject *st_read(wsgi_exchange *ex, size_t n, int nonblock);

/*
 * A read of the stream's first frame (wsgi.py's _Exchange.readexactly while head_by holds): what
 * is here already (nearly always: the front sends a frame whole), else a wait of what is left of
 * `by` (mono_s()), past it shmipc.TimeoutError and no read. The stream's read timeout before
 * such a wait changed it goes to *saved (a new reference), for head_done() to put back. Before,
 * these reads had the stream's read timeout (none in our workers): a front that sent part of
 * the first frame and kept the stream open held the worker (one request at a time) for good.
 */
static PyObject *head_read(wsgi_exchange *ex, size_t n, double by, PyObject **saved)
{
    PyObject *r = st_read(ex, n, 1);
    if (r != Py_None)
        return r;
    Py_DECREF(r);
    double left = by - mono_s();
    if (left <= 0) {
        PyObject *st_id = PyObject_GetAttrString(ex->st, "id");
        PyObject *msg = st_id != NULL
                            ? PyUnicode_FromFormat("stream %S: the front did not send the stream's "
                                                   "first frame whole within %S s",
                                                   st_id, ex->w->hook[H_HEAD_TIMEOUT])
                            : NULL;
        if (msg != NULL)
            PyErr_SetObject(ex->w->hook[H_TIMEOUT], msg);
        Py_XDECREF(msg);
        Py_XDECREF(st_id);
        return NULL;
    }
    if (*saved == NULL && (*saved = PyObject_GetAttr(ex->st, ex->w->name[N_READ_TIMEOUT])) == NULL)
        return NULL;
    PyObject *t = PyFloat_FromDouble(left);
    int rc = t != NULL ? PyObject_SetAttr(ex->st, ex->w->name[N_READ_TIMEOUT], t) : -1;
    Py_XDECREF(t);
    return rc < 0 ? NULL : st_read(ex, n, 0);
}

/* The first frame read: the stream's read timeout as it was before head_read() changed it (the
 * application's reads have it); *saved released. */
static int head_done(wsgi_exchange *ex, PyObject **saved)
{
    if (*saved == NULL)
        return 0;
    int rc = PyObject_SetAttr(ex->st, ex->w->name[N_READ_TIMEOUT], *saved);
    Py_CLEAR(*saved);
    return rc;
}

static PyObject *st_read(wsgi_exchange *ex, size_t n, int nonblock)
{
    if (ex->drain_by > 0 && !nonblock && drain_left(ex) < 0)
        return NULL;
    PyObject *len = PyLong_FromSize_t(n);
    if (len == NULL)
        return NULL;
    PyObject *args[3] = {ex->st, len, Py_True};
    PyObject *r =
        st_invoke(ex, N_READEXACTLY, args, 2, nonblock ? ex->w->name[N_KW_NONBLOCK] : NULL);
    Py_DECREF(len);
    if (r != NULL && r != Py_None && !PyBytes_Check(r)) {
        PyErr_SetString(PyExc_TypeError, "readexactly() returned no bytes");
        Py_CLEAR(r);
    }
    return r;
}

static int st_call(wsgi_exchange *ex, int name, PyObject *arg)
{
    PyObject *args[2] = {ex->st, arg};
    PyObject *r = st_invoke(ex, name, args, arg != NULL ? 2 : 1, NULL);
    Py_XDECREF(r);
    return r != NULL ? 0 : -1;
}

/* What wbuf holds, written to the stream (wbuf empty afterwards, also on failure). */
static int write_held(wsgi_exchange *ex)
{
    if (ex->wlen == 0)
        return 0;
    PyObject *b = PyBytes_FromStringAndSize(ex->wbuf, (Py_ssize_t)ex->wlen);
    ex->wlen = 0; /* before the write, which runs without the GIL */
    if (b == NULL)
        return -1;
    int rc = st_call(ex, N_WRITE, b);
    Py_DECREF(b);
    return rc;
}

/* _Exchange.queue: written, not flushed (small parts into wbuf). */
static int ex_queue(wsgi_exchange *ex, PyObject *const *parts, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_buffer b;
        if (PyObject_GetBuffer(parts[i], &b, PyBUF_SIMPLE) < 0)
            return -1;
        size_t len = (size_t)b.len;
        int rc = 0;
        if (ex->wlen + len > COALESCE_MAX)
            rc = write_held(ex);
        if (rc == 0 && len > COALESCE_MAX) {
            PyBuffer_Release(&b);
            if (st_call(ex, N_WRITE, parts[i]) < 0)
                return -1;
            continue;
        }
        if (rc == 0 && ex->wlen + len > ex->wcap) {
            size_t cap = ex->wcap ? ex->wcap : 512; /* pymalloc's, not malloc's */
            while (cap < ex->wlen + len)
                cap *= 2;
            char *p = PyMem_Realloc(ex->wbuf, cap);
            if (p == NULL) {
                PyErr_NoMemory();
                rc = -1;
            } else {
                ex->wbuf = p;
                ex->wcap = cap;
            }
        }
        if (rc == 0) {
            memcpy(ex->wbuf + ex->wlen, b.buf, len);
            ex->wlen += len;
        }
        PyBuffer_Release(&b);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* _Exchange.send: queued, then flushed. */
static int ex_send(wsgi_exchange *ex, PyObject *const *parts, Py_ssize_t n)
{
    if (ex->wlen == 0 && n == 1) { /* one part (TAKEN, ABORT): as it is */
        if (st_call(ex, N_WRITE, parts[0]) < 0)
            return -1;
    } else if (ex_queue(ex, parts, n) < 0 || write_held(ex) < 0) {
        return -1;
    }
    return st_call(ex, N_FLUSH, NULL);
}

/* ---- the request's frames ---------------------------------------------------------------- */

static int violation(wsgi_exchange *ex, const char *fmt, ...)
{
    va_list va;
    va_start(va, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    if (msg != NULL) {
        PyErr_SetObject(ex->w->hook[H_VIOLATION], msg);
        Py_DECREF(msg);
    }
    return -1;
}

static int request_aborted(wsgi_exchange *ex)
{
    PyObject *msg =
        PyUnicode_FromFormat("the front aborted the request (reason %u)", ex->abort_reason);
    if (msg != NULL) {
        PyErr_SetObject(ex->w->hook[H_ABORTED], msg);
        Py_DECREF(msg);
    }
    return -1;
}

/* _Exchange.read_frame_header: 1 (*f set), 0 (nonblock: no header yet) or -1. */
static int read_header(wsgi_exchange *ex, int nonblock, shmipc_serve_frame *f)
{
    PyObject *raw = st_read(ex, SHMIPC_SERVE_HDR_SIZE, nonblock);
    if (raw == NULL)
        return -1;
    if (raw == Py_None) {
        Py_DECREF(raw);
        return 0;
    }
    *f = (shmipc_serve_frame){.size = sizeof *f};
    int rc = shmipc_serve_decode_header(PyBytes_AS_STRING(raw), (size_t)PyBytes_GET_SIZE(raw), f);
    Py_DECREF(raw);
    if (rc == 0)
        return violation(ex, "decode_header: an incomplete frame");
    if (rc < 0)
        return violation(ex, "decode_header: the frame breaks the protocol (%d)", rc);
    return 1;
}

/* _Exchange.payload: the partial frame's payload: bytes, Py_None when nonblock and not all of
 * it is here (nothing consumed), or NULL. */
static PyObject *read_payload(wsgi_exchange *ex, int nonblock)
{
    if (ex->plen == 0)
        return Py_NewRef(ex->w->name[N_EMPTY]);
    return st_read(ex, ex->plen, nonblock);
}

/* _Exchange._next_body: the next BODY payload, b"" at the END, Py_None (nonblock: no whole
 * frame yet), or NULL (RequestAborted at an ABORT, ProtocolViolation, the stream's errors). */
static PyObject *next_body_impl(wsgi_exchange *ex, int nonblock)
{
    if (ex->pending != NULL) {
        PyObject *data = ex->pending;
        ex->pending = NULL;
        return data;
    }
    while (!ex->done) {
        if (!ex->has_partial) {
            shmipc_serve_frame f;
            int r = read_header(ex, nonblock, &f);
            if (r < 0)
                return NULL;
            if (r == 0)
                return Py_NewRef(Py_None);
            if (f.type == SHMIPC_SERVE_BODY) {
                if (!ex->has_body) {
                    violation(ex, "a BODY frame for a request without HAS_BODY");
                    return NULL;
                }
                if (ex->has_expect && ex->got + f.length > ex->expect) {
                    violation(ex, "the body goes past its content_length %llu",
                              (unsigned long long)ex->expect);
                    return NULL;
                }
                ex->got += f.length;
            } else if (f.type == SHMIPC_SERVE_END) {
                if (ex->has_expect && ex->got != ex->expect) {
                    violation(ex, "END after %llu of the body's %llu bytes",
                              (unsigned long long)ex->got, (unsigned long long)ex->expect);
                    return NULL;
                }
                ex->done = 1;
                return Py_NewRef(ex->w->name[N_EMPTY]);
            } else if (f.type != SHMIPC_SERVE_ABORT) {
                violation(ex, "a frame of type %u in a request body", f.type);
                return NULL;
            }
            ex->has_partial = 1;
            ex->ptype = f.type;
            ex->plen = f.length;
            ex->parg = f.arg;
        }
        PyObject *payload = read_payload(ex, nonblock);
        if (payload == NULL || payload == Py_None)
            return payload;
        ex->has_partial = 0;
        if (ex->ptype == SHMIPC_SERVE_BODY)
            return payload;
        Py_DECREF(payload);
        ex->done = ex->aborted = 1; /* ABORT, its text read and dropped */
        ex->abort_reason = ex->parg;
    }
    if (ex->aborted) {
        request_aborted(ex);
        return NULL;
    }
    return Py_NewRef(ex->w->name[N_EMPTY]);
}

static int matches_stream_end(wsgi_worker *w)
{
    return PyErr_ExceptionMatches(w->hook[H_EOS]) || PyErr_ExceptionMatches(w->hook[H_PEER_GONE]) ||
           PyErr_ExceptionMatches(w->hook[H_CLOSED]);
}

/* The stream's or the session's end (pending) as RequestAborted, raised from it: -1. Its
 * __context__ and __cause__ are the stream's error, as `raise ... from e` in the Python route's
 * `except ... as e:` makes them; raised with PyErr_SetObject, the exception being handled (an
 * app's own, when it reads in its `except` block) replaced the __context__. */
static int stream_ended(wsgi_exchange *ex)
{
    PyObject *type, *e, *tb;
    PyErr_Fetch(&type, &e, &tb);
    PyErr_NormalizeException(&type, &e, &tb);
    if (tb != NULL)
        PyException_SetTraceback(e, tb);
    ex->done = ex->aborted = 1;
    PyObject *msg = PyUnicode_FromFormat("the front's stream ended: %S", e);
    PyObject *exc = msg != NULL ? PyObject_CallOneArg(ex->w->hook[H_ABORTED], msg) : NULL;
    Py_XDECREF(msg);
    if (exc != NULL) {
        PyException_SetContext(exc, Py_NewRef(e));
        PyException_SetCause(exc, Py_NewRef(e)); /* raise ... from e */
        restore_exc(exc);
    }
    Py_XDECREF(type);
    Py_XDECREF(e);
    Py_XDECREF(tb);
    return -1;
}

/* _Exchange.next_body: the stream's or the session's end is RequestAborted. */
static PyObject *next_body(wsgi_exchange *ex, int nonblock)
{
    PyObject *r = next_body_impl(ex, nonblock);
    if (r == NULL && matches_stream_end(ex->w))
        stream_ended(ex);
    return r;
}

/* _Exchange.check_abort, without blocking: -1 with RequestAborted when the front has aborted
 * the request. What is queued before an ABORT may be request body the app has not read: one
 * BODY frame is read ahead and kept for wsgi.input, and no more until the app takes it. */
static int check_abort(wsgi_exchange *ex)
{
    while (ex->pending == NULL) {
        if (ex->done) {
            if (!ex->has_partial) {
                shmipc_serve_frame f;
                int r = read_header(ex, 1, &f);
                if (r <= 0)
                    return r;
                if (f.type != SHMIPC_SERVE_ABORT)
                    return violation(ex, "a frame of type %u after the request's END", f.type);
                ex->has_partial = 1;
                ex->ptype = f.type;
                ex->plen = f.length;
                ex->parg = f.arg;
            }
            PyObject *text = read_payload(ex, 1);
            if (text == NULL || text == Py_None) {
                Py_XDECREF(text);
                return text == NULL ? -1 : 0; /* its text is on its way */
            }
            Py_DECREF(text);
            ex->has_partial = 0;
            ex->aborted = 1;
            ex->abort_reason = ex->parg;
            return request_aborted(ex);
        }
        PyObject *data = next_body(ex, 1);
        if (data == NULL)
            return -1;
        if (data == Py_None) {
            Py_DECREF(data);
            return 0;
        }
        if (PyBytes_GET_SIZE(data) > 0)
            ex->pending = data;
        else
            Py_DECREF(data);
    }
    return 0;
}

/* wsgi.py's _look: check_abort for write() and the END, the stream's end RequestAborted. */
static int look(wsgi_exchange *ex)
{
    int r = check_abort(ex);
    if (r >= 0 || !matches_stream_end(ex->w))
        return r;
    return stream_ended(ex);
}

/* _Exchange.drain: the rest of the request read, within one deadline for all its reads
 * (_ABORT_DRAIN_TIMEOUT: past it shmipc.TimeoutError); RequestAborted ends it quietly. */
static int drain(wsgi_exchange *ex)
{
    double timeout = PyFloat_AsDouble(ex->w->hook[H_DRAIN_TIMEOUT]);
    if (timeout == -1.0 && PyErr_Occurred())
        return -1;
    int rc = 0;
    ex->drain_by = mono_s() + timeout;
    while (!ex->done) {
        PyObject *data = next_body(ex, 0);
        if (data == NULL) {
            if (!PyErr_ExceptionMatches(ex->w->hook[H_ABORTED])) {
                rc = -1;
                break;
            }
            PyErr_Clear();
            break;
        }
        Py_DECREF(data);
    }
    ex->drain_by = 0;
    return rc;
}

/* Calls hook `h` with args; the new reference to its result, or NULL. */
static PyObject *call_hook(wsgi_worker *w, int h, PyObject *const *args, size_t n)
{
    return PyObject_Vectorcall(w->hook[h], args, n, NULL);
}

/* _Exchange.drain_end: 1 when a bad frame came (ABORT PROTOCOL sent), 0, or -1. */
static int drain_end(wsgi_exchange *ex)
{
    if (drain(ex) == 0)
        return 0;
    if (!PyErr_ExceptionMatches(ex->w->hook[H_VIOLATION]))
        return -1;
    PyObject *e = fetch_exc();
    PyObject *args[2] = {(PyObject *)ex, e};
    PyObject *r = call_hook(ex->w, H_ON_VIOLATION, args, 2);
    Py_DECREF(e);
    Py_XDECREF(r);
    return r != NULL ? 1 : -1;
}

/* _Exchange.abort: ABORT sent, then (but after a bad frame) the front's end of the request
 * waited for, bounded; the stream's and the front's failures are dropped. */
static int ex_abort(wsgi_exchange *ex, uint32_t reason, PyObject *text)
{
    PyObject *data = PyUnicode_AsEncodedString(text, "utf-8", "replace");
    if (data == NULL)
        return -1;
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    if (n > SHMIPC_SERVE_MAX_ABORT_TEXT)
        n = SHMIPC_SERVE_MAX_ABORT_TEXT;
    PyObject *frame = PyBytes_FromStringAndSize(NULL, SHMIPC_SERVE_HDR_SIZE + n);
    int rc = -1;
    if (frame == NULL)
        goto out;
    if (shmipc_serve_encode_frame(PyBytes_AS_STRING(frame), (size_t)PyBytes_GET_SIZE(frame),
                                  SHMIPC_SERVE_ABORT, reason, PyBytes_AS_STRING(data),
                                  (size_t)n) < 0) {
        PyErr_Format(PyExc_ValueError, "ABORT reason %u breaks the protocol", reason);
        goto out;
    }
    rc = ex_send(ex, &frame, 1);
    if (rc == 0 && reason != SHMIPC_SERVE_ABORT_PROTOCOL)
        rc = drain(ex);
    if (rc < 0 &&
        (PyErr_ExceptionMatches(ex->w->hook[H_ERROR]) || PyErr_ExceptionMatches(PyExc_OSError) ||
         PyErr_ExceptionMatches(ex->w->hook[H_VIOLATION]))) {
        PyErr_Clear();
        rc = 0;
    }
out:
    Py_XDECREF(frame);
    Py_DECREF(data);
    return rc;
}

/* _Exchange.close: our END still queued goes with the close (flush_close). */
static int ex_close(wsgi_exchange *ex)
{
    if (write_held(ex) < 0) {
        /* Closed all the same, as flush_close closes when its flush fails. */
        PyObject *e = fetch_exc();
        ex->end_queued = 0;
        if (st_call(ex, N_CLOSE, NULL) < 0)
            PyErr_Clear();
        restore_exc(e);
        return -1;
    }
    if (ex->end_queued) {
        ex->end_queued = 0;
        return st_call(ex, N_FLUSH_CLOSE, NULL);
    }
    return st_call(ex, N_CLOSE, NULL);
}

/* ---- WSGIExchange: what wsgi.py's _Input and the rare turns call -------------------------- */

static PyObject *exm_next_body(PyObject *o, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    wsgi_exchange *ex = (wsgi_exchange *)o;
    int nonblock = 0;
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs + nkw > 1 ||
        (nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "nonblock"))) {
        PyErr_SetString(PyExc_TypeError, "next_body(nonblock=False)");
        return NULL;
    }
    if (nargs + nkw == 1 && (nonblock = PyObject_IsTrue(args[0])) < 0)
        return NULL;
    return next_body(ex, nonblock);
}

static PyObject *exm_check_abort(PyObject *o, PyObject *unused)
{
    (void)unused;
    return check_abort((wsgi_exchange *)o) < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *exm_queue(PyObject *o, PyObject *const *args, Py_ssize_t nargs)
{
    return ex_queue((wsgi_exchange *)o, args, nargs) < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *exm_send(PyObject *o, PyObject *const *args, Py_ssize_t nargs)
{
    return ex_send((wsgi_exchange *)o, args, nargs) < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *exm_drain(PyObject *o, PyObject *unused)
{
    (void)unused;
    return drain((wsgi_exchange *)o) < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *exm_drain_end(PyObject *o, PyObject *unused)
{
    (void)unused;
    int r = drain_end((wsgi_exchange *)o);
    return r < 0 ? NULL : PyBool_FromLong(r);
}

static PyObject *exm_abort(PyObject *o, PyObject *args)
{
    unsigned int reason;
    PyObject *text = NULL;
    if (!PyArg_ParseTuple(args, "I|U:abort", &reason, &text))
        return NULL;
    PyObject *empty = NULL;
    if (text == NULL && (text = empty = PyUnicode_FromString("")) == NULL)
        return NULL;
    int r = ex_abort((wsgi_exchange *)o, reason, text);
    Py_XDECREF(empty);
    return r < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *exm_close(PyObject *o, PyObject *unused)
{
    (void)unused;
    return ex_close((wsgi_exchange *)o) < 0 ? NULL : Py_NewRef(Py_None);
}

static int ex_traverse(PyObject *o, visitproc visit, void *arg)
{
    wsgi_exchange *ex = (wsgi_exchange *)o;
    Py_VISIT(Py_TYPE(o));
    Py_VISIT(ex->st);
    Py_VISIT(ex->w);
    Py_VISIT(ex->pending);
    return 0;
}

static int ex_clear(PyObject *o)
{
    wsgi_exchange *ex = (wsgi_exchange *)o;
    Py_CLEAR(ex->st);
    Py_CLEAR(ex->w);
    Py_CLEAR(ex->pending);
    return 0;
}

static void ex_dealloc(PyObject *o)
{
    PyTypeObject *tp = Py_TYPE(o);
    PyObject_GC_UnTrack(o);
    PyMem_Free(((wsgi_exchange *)o)->wbuf);
    ex_clear(o);
    tp->tp_free(o);
    Py_DECREF(tp);
}

static PyMethodDef ex_methods[] = {
    {"next_body", (PyCFunction)(void (*)(void))exm_next_body, METH_FASTCALL | METH_KEYWORDS,
     "next_body(nonblock=False) -> the next BODY payload, b'' at the END, None (nonblock) when\n"
     "no whole frame is there yet; RequestAborted at an ABORT or the stream's end."},
    {"check_abort", exm_check_abort, METH_NOARGS,
     "Without blocking: RequestAborted when the front aborted the request."},
    {"queue", (PyCFunction)(void (*)(void))exm_queue, METH_FASTCALL,
     "queue(*parts): written, not flushed."},
    {"send", (PyCFunction)(void (*)(void))exm_send, METH_FASTCALL,
     "send(*parts): written and flushed."},
    {"drain", exm_drain, METH_NOARGS, "The rest of the request read (to its END or ABORT)."},
    {"drain_end", exm_drain_end, METH_NOARGS,
     "drain(), a bad frame answered ABORT PROTOCOL: True then."},
    {"abort", exm_abort, METH_VARARGS,
     "abort(reason, text=''): ABORT sent, the front's end of the request waited for."},
    {"close", exm_close, METH_NOARGS, "Closes the stream (flush_close when our END is queued)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef ex_members[] = {
    {"st", T_OBJECT, offsetof(wsgi_exchange, st), READONLY, "the request's stream"},
    {"done", T_BOOL, offsetof(wsgi_exchange, done), READONLY,
     "the front's END (or ABORT) was read"},
    {"aborted", T_BOOL, offsetof(wsgi_exchange, aborted), READONLY, "the front ended the request"},
    {"abort_reason", T_UINT, offsetof(wsgi_exchange, abort_reason), READONLY,
     "the reason of the front's ABORT"},
    {"end_queued", T_BOOL, offsetof(wsgi_exchange, end_queued), READONLY,
     "our END is written, not flushed: close() sends it"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot ex_slots[] = {
    {Py_tp_doc, "The worker's end of one request's stream (made by WSGIWorker.handle)."},
    {Py_tp_dealloc, ex_dealloc},
    {Py_tp_traverse, ex_traverse},
    {Py_tp_clear, ex_clear},
    {Py_tp_methods, ex_methods},
    {Py_tp_members, ex_members},
    {0, NULL},
};

static PyType_Spec ex_spec = {
    .name = "shmipc._serve.WSGIExchange",
    .basicsize = sizeof(wsgi_exchange),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = ex_slots,
};

/* ---- WSGIStreamResponse ------------------------------------------------------------------ */

/* _Response._head: the RESPONSE_HEAD for `length` (None: no Content-Length). */
static PyObject *encode_head(stream_response *self, PyObject *length)
{
    wsgi_response *r = &self->r;
    uint32_t flags = r->flags;
    uint64_t n = 0;
    if (is_set(length)) {
        flags |= SHMIPC_SERVE_RESP_CONTENT_LENGTH;
        /* `length or 0`, `length` held: r.length is writable, and its __bool__ or __index__
         * may replace it (freeing it, when r held the only reference). */
        Py_INCREF(length);
        int t = PyObject_IsTrue(length);
        PyObject *i = t > 0 ? PyNumber_Index(length) : NULL;
        Py_DECREF(length);
        if (t < 0 || (t > 0 && i == NULL))
            return NULL;
        if (i != NULL) {
            n = PyLong_AsUnsignedLongLong(i);
            Py_DECREF(i);
            if (n == (uint64_t)-1 && PyErr_Occurred())
                return NULL;
        }
    }
    return shmipcpy_serve_encode_head(r->code, r->headers != NULL ? r->headers : Py_None, flags, n);
}

/* `a` > `b` (op Py_GT), `a` < `b` (Py_LT) or `a` == `b` (Py_EQ) for a size and the app's
 * length: 1, 0, -1. `length` is held: its comparison may replace r.length, which held it. */
static int compare_length(Py_ssize_t a, PyObject *length, int op)
{
    PyObject *x = PyLong_FromSsize_t(a);
    if (x == NULL)
        return -1;
    Py_INCREF(length);
    int r = PyObject_RichCompareBool(x, length, op);
    Py_DECREF(length);
    Py_DECREF(x);
    return r;
}

static int length_error(stream_response *self, PyObject *msg)
{
    if (msg != NULL) {
        PyErr_SetObject(self->ex->w->hook[H_LENGTH_ERROR], msg);
        Py_DECREF(msg);
    }
    return -1;
}

/* _Exchange.send or, when `queue`, queue of parts. */
static int out(stream_response *self, PyObject *const *parts, Py_ssize_t n, int queue)
{
    return queue ? ex_queue(self->ex, parts, n) : ex_send(self->ex, parts, n);
}

/* _Response._end: the END (after the head, when none was sent) is queued for the close when
 * the request was read to its END (a look without waiting tells), else sent. */
static int end(stream_response *self, PyObject *const *parts, Py_ssize_t n)
{
    if (self->hold) {
        if (look(self->ex) < 0)
            return -1;
        if (self->ex->done && self->ex->pending == NULL) {
            if (ex_queue(self->ex, parts, n) < 0)
                return -1;
            self->ex->end_queued = 1;
            return 0;
        }
    }
    return ex_send(self->ex, parts, n);
}

/* The body header of a BODY frame of n bytes. */
static PyObject *body_header(size_t n)
{
    uint8_t hdr[SHMIPC_SERVE_HDR_SIZE];
    if (shmipc_serve_encode_header(hdr, sizeof hdr, SHMIPC_SERVE_BODY, n, 0) < 0) {
        PyErr_SetString(PyExc_ValueError, "a BODY frame too large");
        return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)hdr, sizeof hdr);
}

/* _Response.write. */
static int write_impl(stream_response *self, PyObject *data)
{
    wsgi_response *r = &self->r;
    if (self->ex == NULL) {
        PyErr_SetString(PyExc_TypeError, "this response has no stream");
        return -1;
    }
    PyObject *keep;
    if (PyBytes_Check(data)) {
        keep = Py_NewRef(data);
    } else if (PyByteArray_Check(data) || PyMemoryView_Check(data)) {
        if ((keep = call_hook(self->ex->w, H_FLAT, &data, 1)) == NULL)
            return -1;
    } else {
        PyObject *name = PyObject_GetAttrString((PyObject *)Py_TYPE(data), "__name__");
        if (name != NULL) {
            PyErr_Format(PyExc_TypeError, "the body must be bytes, not %S", name);
            Py_DECREF(name);
        }
        return -1;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(keep, &view, PyBUF_SIMPLE) < 0) {
        Py_DECREF(keep);
        return -1;
    }
    int rc = -1;
    PyObject *parts[1 + 2 * 8], **extra = NULL, **pv = parts, *whole = NULL;
    Py_ssize_t np = 0, n = view.len;
    if (n == 0) {
        rc = 0;
        goto done;
    }
    if (!is_set(r->status)) {
        PyErr_SetString(PyExc_AssertionError,
                        "the app sent body bytes before calling start_response");
        goto done;
    }
    if (look(self->ex) < 0)
        goto done;
    Py_ssize_t nchunks = (n + SHMIPC_SERVE_MAX_CHUNK - 1) / SHMIPC_SERVE_MAX_CHUNK;
    if (1 + 2 * nchunks > (Py_ssize_t)(sizeof parts / sizeof parts[0])) {
        if ((extra = PyMem_Calloc((size_t)(1 + 2 * nchunks), sizeof *extra)) == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        pv = extra;
    }
    if (!r->head_sent) {
        if ((pv[np] = encode_head(self, r->length)) == NULL) /* then nothing was sent */
            goto done;
        np++;
        r->head_sent = 1;
    }
    if (shmipcpy_serve_bodyless(r)) {
        rc = np ? ex_send(self->ex, pv, np) : 0;
        goto done;
    }
    if (is_set(r->length)) {
        int over = compare_length(r->sent > PY_SSIZE_T_MAX - n ? PY_SSIZE_T_MAX : r->sent + n,
                                  r->length, Py_GT);
        if (over < 0)
            goto done;
        if (over) {
            length_error(self, PyUnicode_FromFormat(
                                   "the app sent more than its Content-Length of %S", r->length));
            goto done;
        }
    }
    for (Py_ssize_t off = 0; off < n; off += SHMIPC_SERVE_MAX_CHUNK) {
        Py_ssize_t len = n - off < SHMIPC_SERVE_MAX_CHUNK ? n - off : SHMIPC_SERVE_MAX_CHUNK;
        if ((pv[np] = body_header((size_t)len)) == NULL)
            goto done;
        np++;
        /* The piece as it is when whole, else a slice of a view of it, which holds it: the
         * stream may keep what it is given past this call (a view of bare memory did not). */
        if (len == n && PyBytes_CheckExact(keep)) {
            pv[np] = Py_NewRef(keep);
        } else {
            if (whole == NULL && (whole = PyMemoryView_FromObject(keep)) == NULL)
                goto done;
            pv[np] = len == n ? Py_NewRef(whole) : PySequence_GetSlice(whole, off, off + len);
        }
        if (pv[np] == NULL)
            goto done;
        np++;
    }
    if (n > PY_SSIZE_T_MAX - r->sent) {
        PyErr_SetString(PyExc_OverflowError, "the body's size overflows");
        goto done;
    }
    r->sent += n;
    int queue = 0;
    if (self->hold && is_set(r->length) && (queue = compare_length(r->sent, r->length, Py_EQ)) < 0)
        goto done;
    rc = out(self, pv, np, queue);
done:
    for (Py_ssize_t i = 0; i < np; i++)
        Py_DECREF(pv[i]);
    Py_XDECREF(whole);
    PyMem_Free(extra);
    PyBuffer_Release(&view);
    Py_DECREF(keep);
    return rc;
}

/* _Response.finish: the iterable is exhausted: the head if none was sent yet, then END. */
static int finish(stream_response *self)
{
    wsgi_response *r = &self->r;
    PyObject *end_frame = self->ex->w->name[N_END];
    if (!r->head_sent) {
        PyObject *length = r->length != NULL ? r->length : Py_None;
        PyObject *zero = NULL;
        if (length == Py_None && !shmipcpy_serve_no_content(r)) {
            /* no body: Content-Length 0, also to HEAD (GET's would be 0) */
            if ((length = zero = PyLong_FromLong(0)) == NULL)
                return -1;
        }
        PyObject *parts[2] = {encode_head(self, length), end_frame};
        Py_XDECREF(zero);
        if (parts[0] == NULL)
            return -1;
        r->head_sent = 1;
        int rc = end(self, parts, 2);
        Py_DECREF(parts[0]);
        return rc;
    }
    if (is_set(r->length) && !shmipcpy_serve_bodyless(r)) {
        int under = compare_length(r->sent, r->length, Py_LT);
        if (under < 0)
            return -1;
        if (under)
            return length_error(
                self, PyUnicode_FromFormat("the app sent %zd bytes of its Content-Length of %S",
                                           r->sent, r->length));
    }
    return end(self, &end_frame, 1);
}

static PyObject *sresp_write(PyObject *o, PyObject *data)
{
    return write_impl((stream_response *)o, data) < 0 ? NULL : Py_NewRef(Py_None);
}

static int sresp_traverse(PyObject *o, visitproc visit, void *arg)
{
    stream_response *self = (stream_response *)o;
    wsgi_response *r = &self->r;
    Py_VISIT(Py_TYPE(o));
    Py_VISIT(r->method);
    Py_VISIT(r->status);
    Py_VISIT(r->headers);
    Py_VISIT(r->length);
    Py_VISIT(r->chunks);
    Py_VISIT(self->ex);
    return 0;
}

static int sresp_clear(PyObject *o)
{
    stream_response *self = (stream_response *)o;
    wsgi_response *r = &self->r;
    Py_CLEAR(r->method);
    Py_CLEAR(r->status);
    Py_CLEAR(r->headers);
    Py_CLEAR(r->length);
    Py_CLEAR(r->chunks);
    Py_CLEAR(self->ex);
    return 0;
}

static void sresp_dealloc(PyObject *o)
{
    PyTypeObject *tp = Py_TYPE(o);
    PyObject_GC_UnTrack(o);
    if (((stream_response *)o)->r.weak != NULL)
        PyObject_ClearWeakRefs(o);
    sresp_clear(o);
    tp->tp_free(o);
    Py_DECREF(tp);
}

static PyMethodDef sresp_methods[] = {
    {"write", sresp_write, METH_O,
     "write(data): PEP 3333's write(), sent on the request's stream (wsgi.py's _Response)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef sresp_members[] = {
    {"hold", T_BOOL, offsetof(stream_response, hold), READONLY,
     "the app's iterable is a list or tuple: its last piece and END wait for the close"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot sresp_slots[] = {
    {Py_tp_doc, "WSGIResponse that sends on its request's stream (made by WSGIWorker.handle)."},
    {Py_tp_dealloc, sresp_dealloc},
    {Py_tp_traverse, sresp_traverse},
    {Py_tp_clear, sresp_clear},
    {Py_tp_methods, sresp_methods},
    {Py_tp_members, sresp_members},
    {0, NULL},
};

static PyType_Spec sresp_spec = {
    .name = "shmipc._serve.WSGIStreamResponse",
    .basicsize = sizeof(stream_response),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = sresp_slots,
};

/* ---- WSGIWorker.handle ------------------------------------------------------------------- */

/* _list_length: the bytes of a list of body pieces; None when one is not bytes. */
static PyObject *piece_size(PyObject *piece, int one)
{
    if (PyBytes_Check(piece))
        return PyLong_FromSsize_t(PyBytes_GET_SIZE(piece));
    if (PyByteArray_Check(piece))
        return PyLong_FromSsize_t(PyByteArray_GET_SIZE(piece));
    if (PyMemoryView_Check(piece))
        return PyObject_GetAttrString(piece, "nbytes");
    if (!one)
        return Py_NewRef(Py_None);
    Py_ssize_t n = PyObject_Size(piece); /* len(): a str's, say; write() refuses it */
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

static PyObject *list_length(PyObject *seq)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n == 1) {
        PyObject *piece = Py_NewRef(PySequence_Fast_GET_ITEM(seq, 0));
        PyObject *r = piece_size(piece, 1);
        Py_DECREF(piece);
        return r;
    }
    PyObject *total = PyLong_FromLong(0);
    for (Py_ssize_t i = 0; total != NULL && i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *piece = Py_NewRef(PySequence_Fast_GET_ITEM(seq, i));
        PyObject *size = piece_size(piece, 0);
        Py_DECREF(piece);
        if (size == Py_None) {
            Py_DECREF(total);
            return size;
        }
        Py_SETREF(total, size != NULL ? PyNumber_Add(total, size) : NULL);
        Py_XDECREF(size);
    }
    return total;
}

/* The request run once its REQUEST_HEAD is in: the app, its response, the failures. The
 * outcome (a new reference) or NULL (the exception to handle() or its caller). */
static PyObject *run_app(wsgi_worker *w, wsgi_exchange *ex, PyObject *environ, PyObject *frame)
{
    PyObject *outcome = Py_NewRef(w->name[N_OK]), *result = NULL, *pending = NULL, *sr = NULL;
    int finished = 0, hold = 0;
    PyObject *input = call_hook(w, H_INPUT, (PyObject **)&ex, 1);
    if (input == NULL)
        goto fail_early;
    int rc = PyDict_SetItem(environ, w->name[N_INPUT_KEY], input);
    Py_DECREF(input);
    if (rc < 0)
        goto fail_early;
    /* The failure's handling takes the method from here, never from the environ: the app may
     * change it before it raises. */
    serve_state *ss = PyType_GetModuleState(Py_TYPE(w));
    PyObject *method = PyDict_GetItemWithError(environ, ss->k_method);
    if (method == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_KeyError, "REQUEST_METHOD");
        goto fail_early;
    }
    Py_INCREF(method);
    stream_response *resp = (stream_response *)w->response_type->tp_alloc(w->response_type, 0);
    if (resp == NULL) {
        Py_DECREF(method);
        goto fail_early;
    }
    resp->r.method = method;
    resp->r.status = Py_NewRef(Py_None);
    resp->r.headers = Py_NewRef(Py_None);
    resp->r.length = Py_NewRef(Py_None);
    resp->ex = (wsgi_exchange *)Py_NewRef(ex);
    wsgi_response *r = &resp->r;

    sr = PyObject_GetAttr((PyObject *)resp, w->name[N_START_RESPONSE]);
    if (sr == NULL)
        goto caught;
    PyObject *args[2] = {environ, sr};
    result = PyObject_Vectorcall(w->app, args, 2, NULL);
    if (result == NULL)
        goto caught;
    hold = PyList_CheckExact(result) || PyTuple_CheckExact(result);
    resp->hold = (char)hold;
    if (!is_set(r->length) && r->length != NULL && !r->head_sent && hold &&
        PySequence_Fast_GET_SIZE(result) > 0 && is_set(r->status) &&
        !shmipcpy_serve_no_content(r)) {
        /* A list's length is known before its first piece goes, so the front can send
         * Content-Length (to HEAD too), whether the pieces reach it at once or not. */
        PyObject *len = list_length(result);
        if (len == NULL)
            goto caught;
        Py_XSETREF(r->length, len);
    }
    PyObject *it = PyObject_GetIter(result), *data;
    if (it == NULL)
        goto caught;
    while ((data = PyIter_Next(it)) != NULL) {
        int wr = write_impl(resp, data);
        Py_DECREF(data);
        if (wr < 0)
            break;
    }
    Py_DECREF(it);
    if (PyErr_Occurred() || finish(resp) < 0)
        goto caught;
    finished = 1;
    goto closing;

caught:;
    PyObject *e = fetch_exc(), *turn = NULL;
    if (PyErr_GivenExceptionMatches(e, w->hook[H_ABORTED])) {
        PyObject *a[2] = {frame, e};
        turn = call_hook(w, H_ON_ABORTED, a, 2);
    } else if (PyErr_GivenExceptionMatches(e, w->hook[H_VIOLATION])) {
        PyObject *a[2] = {(PyObject *)ex, e};
        turn = call_hook(w, H_ON_VIOLATION, a, 2);
    } else if (PyErr_GivenExceptionMatches(e, PyExc_Exception) &&
               !PyErr_GivenExceptionMatches(e, w->hook[H_ERROR]) &&
               !(PyErr_GivenExceptionMatches(e, PyExc_OSError) && ex->aborted)) {
        PyObject *a[5] = {(PyObject *)ex, r->head_sent ? Py_True : Py_False, frame, method, e};
        turn = call_hook(w, H_FAILED, a, 5);
    } else {
        pending = e; /* the stream is gone (handle() reports it), or not an Exception */
        e = NULL;
    }
    if (e != NULL) {
        Py_DECREF(e);
        if (turn == NULL)
            pending = fetch_exc();
        else
            Py_SETREF(outcome, turn);
    }

closing:
    if (result != NULL && !hold) {
        /* getattr(result, "close", None)(); a list or tuple has none. A failed close() is
         * logged (the outcome "error" if it was "ok"); what is not an Exception replaces the
         * exception on its way out, as in Python's finally. */
        PyObject *close = PyObject_GetAttr(result, w->name[N_CLOSE]), *cr = NULL;
        if (close == NULL && PyErr_ExceptionMatches(PyExc_AttributeError))
            PyErr_Clear();
        else if (close != NULL && (cr = PyObject_CallNoArgs(close)) == NULL &&
                 PyErr_ExceptionMatches(PyExc_Exception)) {
            PyObject *ce = fetch_exc();
            PyObject *t = call_hook(w, H_CLOSE_FAILED, &ce, 1);
            Py_DECREF(ce);
            if (t != NULL) {
                Py_DECREF(t);
                if (outcome == w->name[N_OK])
                    Py_SETREF(outcome, Py_NewRef(w->name[N_ERROR]));
            }
        }
        Py_XDECREF(cr);
        Py_XDECREF(close);
        if (PyErr_Occurred())
            Py_XSETREF(pending, fetch_exc());
    }
    Py_XDECREF(sr);
    Py_XDECREF(result);
    Py_DECREF(resp);
    if (pending != NULL) {
        Py_DECREF(outcome);
        restore_exc(pending);
        return NULL;
    }
    if (finished) {
        /* Also when close() raised after it: the front's END is still read before the stream
         * closes, else it would come as a new stream (docs/serve.md, "Streams"). */
        int d = drain_end(ex);
        if (d < 0) {
            Py_DECREF(outcome);
            return NULL;
        }
        if (d)
            Py_SETREF(outcome, Py_NewRef(w->name[N_PROTOCOL]));
    }
    return outcome;

fail_early:
    Py_DECREF(outcome);
    return NULL;
}

/* The head of the request: its first frame and, for a REQUEST_HEAD, its payload; a request
 * this route serves is run (run_app). Anything else is handed to wsgi.py as (header, payload
 * or None) before anything was sent: a tuple. */
static PyObject *serve(wsgi_worker *w, wsgi_exchange *ex)
{
    serve_state *ss = PyType_GetModuleState(Py_TYPE(w));
    double timeout = PyFloat_AsDouble(w->hook[H_HEAD_TIMEOUT]);
    if (timeout == -1.0 && PyErr_Occurred())
        return NULL;
    /* All of the first frame within _HEAD_READ_TIMEOUT; what is handed back, wsgi.py reads by
     * the same deadline (handed back with it). */
    double by = mono_s() + timeout;
    PyObject *saved = NULL; /* the stream's read timeout, when a wait for the frame changed it */
    PyObject *raw = head_read(ex, SHMIPC_SERVE_HDR_SIZE, by, &saved), *payload = NULL;
    PyObject *frame = NULL, *environ = NULL, *out = NULL;
    if (raw == NULL) {
        Py_XDECREF(saved);
        return NULL;
    }
    shmipc_serve_frame f = {.size = sizeof f};
    if (shmipc_serve_decode_header(PyBytes_AS_STRING(raw), (size_t)PyBytes_GET_SIZE(raw), &f) <=
            0 ||
        f.type != SHMIPC_SERVE_REQUEST_HEAD)
        goto hand_over;
    if ((payload = head_read(ex, f.length, by, &saved)) == NULL)
        goto done;
    if (head_done(ex, &saved) < 0)
        goto done;
    uint32_t flags = f.arg;
    frame = PyBytes_FromStringAndSize(NULL, PyBytes_GET_SIZE(raw) + PyBytes_GET_SIZE(payload));
    if (frame == NULL)
        goto done;
    memcpy(PyBytes_AS_STRING(frame), PyBytes_AS_STRING(raw), (size_t)PyBytes_GET_SIZE(raw));
    memcpy(PyBytes_AS_STRING(frame) + PyBytes_GET_SIZE(raw), PyBytes_AS_STRING(payload),
           (size_t)PyBytes_GET_SIZE(payload));
    environ = shmipcpy_serve_decode_environ(ss, PyBytes_AS_STRING(frame), PyBytes_GET_SIZE(frame),
                                            w->base);
    if (environ == NULL) {
        if (!PyErr_ExceptionMatches(ss->frame_error))
            goto done;
        PyErr_Clear();
        goto hand_over;
    }
    /* _Exchange.head: what the REQUEST_HEAD says of the body, for next_body to hold the frames
     * that follow to it (its content_length at 12 in the payload: docs/serve.md). */
    ex->has_body = (flags & SHMIPC_SERVE_REQ_HAS_BODY) != 0;
    if ((flags & SHMIPC_SERVE_REQ_CONTENT_LENGTH) && PyBytes_GET_SIZE(payload) >= 20) {
        const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(payload) + 12;
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--)
            n = n << 8 | p[i];
        ex->has_expect = 1;
        ex->expect = n;
    }
    if ((flags & SHMIPC_SERVE_REQ_TAKEN_WANTED) && ex_send(ex, &w->name[N_TAKEN], 1) < 0)
        goto done;
    out = run_app(w, ex, environ, frame);
    goto done;
hand_over:
    /* With the deadline (time.monotonic()) the rest of the first frame is read by. */
    if (head_done(ex, &saved) == 0)
        out = Py_BuildValue("(OOd)", raw, payload != NULL ? payload : Py_None, by);
done:
    Py_XDECREF(saved);
    Py_XDECREF(environ);
    Py_XDECREF(frame);
    Py_XDECREF(payload);
    Py_DECREF(raw);
    return out;
}

/* __init__ has succeeded (it sets app, base and every hook at once, or none): WSGIWorker.__new__
 * alone, or copy.copy() of a worker, made one without them, whose handle() called a NULL hook
 * (a segfault). */
static int worker_ready(const wsgi_worker *w)
{
    if (w->app == NULL || w->base == NULL)
        return 0;
    for (int i = 0; i < NHOOK; i++)
        if (w->hook[i] == NULL)
            return 0;
    return 1;
}

/* handle(st): serve the request on stream st and close it: the outcome ("ok", "error",
 * "aborted", "protocol"); or (header, payload or None), the stream still open, for wsgi.py to
 * serve the request from there. As WSGIHandler._serve: the stream's or the session's failure
 * is "aborted" (logged at debug), anything else is raised after the close. */
static PyObject *worker_handle(PyObject *o, PyObject *st)
{
    wsgi_worker *w = (wsgi_worker *)o;
    if (!worker_ready(w)) {
        PyErr_SetString(PyExc_RuntimeError,
                        "WSGIWorker not initialised: __init__(app, base, hooks) has not succeeded");
        return NULL;
    }
    wsgi_exchange *ex = PyObject_GC_New(wsgi_exchange, w->exchange_type);
    if (ex == NULL)
        return NULL;
    ex->st = Py_NewRef(st);
    ex->w = (wsgi_worker *)Py_NewRef(o);
    ex->done = ex->aborted = ex->end_queued = ex->has_partial = 0;
    ex->ptype = ex->plen = ex->parg = ex->abort_reason = 0;
    ex->wbuf = NULL;
    ex->wlen = ex->wcap = 0;
    ex->has_body = 1; /* until the head says otherwise */
    ex->has_expect = 0;
    ex->expect = ex->got = 0;
    ex->pending = NULL;
    ex->drain_by = 0;
    PyObject_GC_Track(ex);
    PyObject *out = serve(w, ex), *pending = NULL;
    if (out != NULL && PyTuple_Check(out)) {
        Py_DECREF(ex);
        return out;
    }
    if (out == NULL) {
        if (PyErr_ExceptionMatches(w->hook[H_ERROR]) || PyErr_ExceptionMatches(PyExc_OSError)) {
            /* The stream or session ended under us: the front went away. */
            PyObject *e = fetch_exc();
            PyObject *a[2] = {st, e};
            PyObject *t = call_hook(w, H_STREAM_ENDED, a, 2);
            Py_DECREF(e);
            Py_XDECREF(t);
            if (t != NULL)
                out = Py_NewRef(w->name[N_ABORTED]);
        }
        if (out == NULL)
            pending = fetch_exc();
    }
    if (ex_close(ex) < 0) {
        if (PyErr_ExceptionMatches(w->hook[H_ERROR])) {
            /* Our END went with the close (flush_close): the front never got it. */
            PyObject *e = fetch_exc();
            PyObject *a[2] = {st, e};
            PyObject *t = call_hook(w, H_STREAM_ENDED, a, 2);
            Py_DECREF(e);
            if (t != NULL) {
                Py_DECREF(t);
                Py_XSETREF(out, Py_NewRef(w->name[N_ABORTED]));
            }
        }
        if (PyErr_Occurred()) {
            Py_CLEAR(pending);
            Py_CLEAR(out);
        }
    }
    Py_DECREF(ex);
    if (pending != NULL) {
        Py_XDECREF(out);
        restore_exc(pending);
        return NULL;
    }
    return out;
}

static int worker_init(PyObject *o, PyObject *args, PyObject *kw)
{
    wsgi_worker *w = (wsgi_worker *)o;
    static char *kwlist[] = {"app", "base", "hooks", NULL};
    PyObject *app, *base, *hooks;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO!O!:WSGIWorker", kwlist, &app, &PyDict_Type,
                                     &base, &PyDict_Type, &hooks))
        return -1;
    /* Strong references as they are found: a lookup may run a key's __eq__, which may change
     * the dict. Nothing of the worker changes unless all are there and right, so a failed
     * __init__ leaves it as it was (uninitialised, or serving with what it had). */
    PyObject *hook[NHOOK] = {NULL};
    int rc = -1;
    for (int i = 0; i < NHOOK; i++) {
        PyObject *key = PyUnicode_FromString(hook_names[i]);
        if (key == NULL)
            goto out;
        hook[i] = PyDict_GetItemWithError(hooks, key);
        Py_DECREF(key);
        if (hook[i] == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_KeyError, "WSGIWorker: the hooks have no %s", hook_names[i]);
            goto out;
        }
        Py_INCREF(hook[i]);
    }
    for (int i = 0; i < NHOOK; i++) {
        int is_class = i <= H_LENGTH_ERROR || (i >= H_ERROR && i <= H_CLOSED);
        if (is_class && !PyExceptionClass_Check(hook[i])) {
            PyErr_SetString(PyExc_TypeError,
                            "WSGIWorker: an exception hook is not an exception class");
            goto out;
        }
    }
    Py_XSETREF(w->app, Py_NewRef(app));
    Py_XSETREF(w->base, Py_NewRef(base));
    for (int i = 0; i < NHOOK; i++) {
        Py_XSETREF(w->hook[i], hook[i]);
        hook[i] = NULL;
    }
    rc = 0;
out:
    for (int i = 0; i < NHOOK; i++)
        Py_XDECREF(hook[i]);
    return rc;
}

static int worker_names(wsgi_worker *w)
{
    static const char *const strs[] = {
        [N_READEXACTLY] = "readexactly",
        [N_WRITE] = "write",
        [N_FLUSH] = "flush",
        [N_FLUSH_CLOSE] = "flush_close",
        [N_CLOSE] = "close",
        [N_READ_TIMEOUT] = "read_timeout",
        [N_START_RESPONSE] = "start_response",
        [N_INPUT_KEY] = "wsgi.input",
        [N_OK] = "ok",
        [N_ERROR] = "error",
        [N_ABORTED] = "aborted",
        [N_PROTOCOL] = "protocol",
    };
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        if (strs[i] != NULL && (w->name[i] = PyUnicode_InternFromString(strs[i])) == NULL)
            return -1;
    w->name[N_KW_NONBLOCK] = Py_BuildValue("(s)", "nonblock");
    uint8_t fr[SHMIPC_SERVE_HDR_SIZE];
    if (shmipc_serve_encode_frame(fr, sizeof fr, SHMIPC_SERVE_TAKEN, 0, NULL, 0) < 0)
        return -1;
    w->name[N_TAKEN] = PyBytes_FromStringAndSize((const char *)fr, sizeof fr);
    if (shmipc_serve_encode_frame(fr, sizeof fr, SHMIPC_SERVE_END, 0, NULL, 0) < 0)
        return -1;
    w->name[N_END] = PyBytes_FromStringAndSize((const char *)fr, sizeof fr);
    w->name[N_EMPTY] = PyBytes_FromStringAndSize(NULL, 0);
    for (int i = 0; i < NNAME; i++)
        if (w->name[i] == NULL)
            return -1;
    return 0;
}

static PyObject *worker_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    wsgi_worker *w = (wsgi_worker *)tp->tp_alloc(tp, 0);
    if (w == NULL)
        return NULL;
    PyObject *m = PyType_GetModule(tp);
    PyObject *et = m != NULL ? PyObject_GetAttrString(m, "WSGIExchange") : NULL;
    PyObject *rt = et != NULL ? PyObject_GetAttrString(m, "WSGIStreamResponse") : NULL;
    w->exchange_type = (PyTypeObject *)et;
    w->response_type = (PyTypeObject *)rt;
    if (rt == NULL || !PyType_Check(et) || !PyType_Check(rt) || worker_names(w) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "WSGIWorker: the module's types are missing");
        Py_DECREF(w);
        return NULL;
    }
    return (PyObject *)w;
}

static int worker_traverse(PyObject *o, visitproc visit, void *arg)
{
    wsgi_worker *w = (wsgi_worker *)o;
    Py_VISIT(Py_TYPE(o));
    Py_VISIT(w->app);
    Py_VISIT(w->base);
    for (int i = 0; i < NHOOK; i++)
        Py_VISIT(w->hook[i]);
    Py_VISIT(w->exchange_type);
    Py_VISIT(w->response_type);
    Py_VISIT(w->st_type);
    for (int i = 0; i <= N_CLOSE; i++)
        Py_VISIT(w->st_meth[i]);
    return 0;
}

static int worker_clear(PyObject *o)
{
    wsgi_worker *w = (wsgi_worker *)o;
    Py_CLEAR(w->app);
    Py_CLEAR(w->base);
    for (int i = 0; i < NHOOK; i++)
        Py_CLEAR(w->hook[i]);
    for (int i = 0; i < NNAME; i++)
        Py_CLEAR(w->name[i]);
    Py_CLEAR(w->exchange_type);
    Py_CLEAR(w->response_type);
    Py_CLEAR(w->st_type);
    for (int i = 0; i <= N_CLOSE; i++)
        Py_CLEAR(w->st_meth[i]);
    return 0;
}

static void worker_dealloc(PyObject *o)
{
    PyTypeObject *tp = Py_TYPE(o);
    PyObject_GC_UnTrack(o);
    worker_clear(o);
    tp->tp_free(o);
    Py_DECREF(tp);
}

static PyMethodDef worker_methods[] = {
    {"handle", worker_handle, METH_O,
     "handle(st) -> outcome | (header, payload or None)\n\n"
     "Serve the request on stream st and close it: 'ok', 'error', 'aborted' or 'protocol'.\n"
     "What this route leaves to wsgi.py (a first frame that is not a REQUEST_HEAD, or does\n"
     "not decode) comes back as that frame's header and payload (None when only the header\n"
     "was read), the stream open, before anything was sent. RuntimeError when __init__\n"
     "has not succeeded."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef worker_members[] = {
    {"app", T_OBJECT, offsetof(wsgi_worker, app), READONLY, "the WSGI app"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot worker_slots[] = {
    {Py_tp_doc, "WSGIWorker(app, base, hooks): the WSGI worker's request in C (wsgi.py)."},
    {Py_tp_new, worker_new},
    {Py_tp_init, worker_init},
    {Py_tp_dealloc, worker_dealloc},
    {Py_tp_traverse, worker_traverse},
    {Py_tp_clear, worker_clear},
    {Py_tp_methods, worker_methods},
    {Py_tp_members, worker_members},
    {0, NULL},
};

static PyType_Spec worker_spec = {
    .name = "shmipc._serve.WSGIWorker",
    .basicsize = sizeof(wsgi_worker),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = worker_slots,
};

static int add_type(PyObject *module, PyType_Spec *spec, PyObject *base, const char *name)
{
    PyObject *tp = PyType_FromModuleAndSpec(module, spec, base);
    if (tp == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(module, name, tp);
    Py_DECREF(tp);
    return rc;
}

int shmipcpy_serve_add_wsgi_worker(PyObject *module)
{
    PyObject *base = PyObject_GetAttrString(module, "WSGIResponse");
    if (base == NULL)
        return -1;
    int rc = add_type(module, &ex_spec, NULL, "WSGIExchange") < 0 ||
                     add_type(module, &sresp_spec, base, "WSGIStreamResponse") < 0 ||
                     add_type(module, &worker_spec, NULL, "WSGIWorker") < 0
                 ? -1
                 : 0;
    Py_DECREF(base);
    return rc;
}
