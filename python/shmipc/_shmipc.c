/*
 * _shmipc: the CPython extension behind `import shmipc`. It calls only the public header.
 * Multi-phase init, heap types and module state (no static Python objects), so the module
 * can be loaded in several interpreters and reloaded.
 *
 * Owns: the module (exec, state, exception classes, module functions), the error mapping from
 * C codes to exceptions, and the timeout and argument helpers every type shares (module.h lists
 * the files of each type).
 * May call: the public C API and every file's type spec (module.h).
 */
#include "module.h"

#include <math.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

/* This process's id for the fork rule (module.h), kept here rather than asked of getpid(), a
 * system call, at each close. */
pid_t shmipcpy_pid;
static int pid_ok;

static void pid_refresh(void)
{
    shmipcpy_pid = getpid();
}

static void pid_init(void)
{
    pid_refresh();
    /* os.fork() calls fork(), which runs the handler in the child. */
    pid_ok = pthread_atfork(NULL, NULL, pid_refresh) == 0;
}

static module_state *state_of_module(PyObject *module)
{
    return (module_state *)PyModule_GetState(module);
}

/* Module state from an instance of one of our types, also when the type was subclassed. */
module_state *shmipcpy_state_of_type(PyTypeObject *type)
{
    PyObject *module = PyType_GetModuleByDef(type, &shmipcpy_module);
    return module ? state_of_module(module) : NULL;
}

static PyObject *class_for_code(module_state *st, int code)
{
    switch (code) {
    case SHMIPC_ETIMEDOUT:
        return st->timeout_error;
    case SHMIPC_ECLOSED:
        return st->closed_error;
    case SHMIPC_ECONNRESET:
        return st->peer_gone;
    case SHMIPC_EPROTO:
    case SHMIPC_EVERSION:
    case SHMIPC_EREJECTED:
        return st->protocol_error;
    case SHMIPC_EINVAL:
    case SHMIPC_ERANGE:
    case SHMIPC_ENAMETOOLONG:
        return st->invalid_error;
    case SHMIPC_EEOF:
        return st->eof_error;
    default:
        return st->error;
    }
}

/*
 * Raises the exception for a negative shmipc code: errno is the positive code, strerror the
 * detail of the failed call (or the generic message), and `code` and `name` carry the
 * shmipc code and its symbolic name. Always returns NULL.
 */
PyObject *shmipcpy_raise_code(module_state *st, int code, const char *detail)
{
    const char *msg = (detail != NULL && detail[0] != '\0') ? detail : shmipc_strerror(code);
    const char *name = shmipc_errname(code);
    PyObject *exc = PyObject_CallFunction(class_for_code(st, code), "is", -code, msg);
    if (exc == NULL)
        return NULL;
    PyObject *code_obj = PyLong_FromLong(code);
    PyObject *name_obj = name ? PyUnicode_FromString(name) : Py_NewRef(Py_None);
    int failed = code_obj == NULL || name_obj == NULL ||
                 PyObject_SetAttrString(exc, "code", code_obj) < 0 ||
                 PyObject_SetAttrString(exc, "name", name_obj) < 0;
    Py_XDECREF(code_obj);
    Py_XDECREF(name_obj);
    if (failed) {
        Py_DECREF(exc);
        return NULL;
    }
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
    return NULL;
}

/* Raises for `rc` with the detail the failing C call left on this thread. */
PyObject *shmipcpy_raise_last(module_state *st, int rc)
{
    return shmipcpy_raise_code(st, rc, shmipc_error_detail());
}

/* A Python-side argument error that reads like the C ones: "field: message". */
PyObject *shmipcpy_raise_invalid(module_state *st, const char *field, const char *what)
{
    char msg[256];
    PyOS_snprintf(msg, sizeof msg, "%s: %s", field, what);
    return shmipcpy_raise_code(st, SHMIPC_EINVAL, msg);
}

/* ClosedError for an object closed on the Python side, whose C handle is gone. */
PyObject *shmipcpy_raise_closed(module_state *st, const char *what)
{
    char msg[128];
    PyOS_snprintf(msg, sizeof msg, "%s: closed", what);
    return shmipcpy_raise_code(st, SHMIPC_ECLOSED, msg);
}

/* A handle used by one thread at a time was called while another thread is inside it. */
PyObject *shmipcpy_raise_busy(const char *what)
{
    PyErr_Format(PyExc_RuntimeError,
                 "%s is in use by another thread (a stream is used by one thread at a time)", what);
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Helpers of the IPC types                                                                 */
/* ---------------------------------------------------------------------------------------- */

int shmipcpy_timeout_arg(module_state *st, PyObject *value, const char *field, int allow_zero,
                         int64_t *ms)
{
    if (value == NULL || value == Py_None) {
        *ms = -1;
        return 0;
    }
    double s = PyFloat_AsDouble(value);
    if (s == -1.0 && PyErr_Occurred())
        return -1;
    if (isnan(s) || s * 1000.0 > (double)INT32_MAX) {
        shmipcpy_raise_invalid(st, field,
                               "must be a number of seconds up to 2147483.647 (negative or None: "
                               "forever)");
        return -1;
    }
    if (s < 0) {
        *ms = -1;
        return 0;
    }
    if (s == 0 && !allow_zero) {
        shmipcpy_raise_invalid(st, field, "0 is not a timeout here; None or negative: forever");
        return -1;
    }
    *ms = (int64_t)ceil(s * 1000.0);
    if (s > 0 && *ms == 0)
        *ms = 1;
    return 0;
}

uint64_t shmipcpy_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int shmipcpy_slice_ms(uint64_t deadline)
{
    if (deadline == 0)
        return SHMIPCPY_SLICE_MS;
    uint64_t now = shmipcpy_now_ms();
    if (now >= deadline)
        return 0;
    return deadline - now < SHMIPCPY_SLICE_MS ? (int)(deadline - now) : SHMIPCPY_SLICE_MS;
}

int shmipcpy_config_arg(module_state *st, PyObject *obj, shmipc_config **out)
{
    *out = NULL;
    if (obj == NULL || obj == Py_None)
        return 0;
    if (!PyObject_TypeCheck(obj, st->config_type)) {
        PyErr_Format(PyExc_TypeError, "config must be a shmipc.Config or None, not %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    int rc = shmipc_config_clone(((ConfigObject *)obj)->cfg, out);
    if (rc < 0) {
        shmipcpy_raise_last(st, rc);
        return -1;
    }
    return 0;
}

void shmipcpy_config_timeouts(const shmipc_config *cfg, int32_t *read_ms, int32_t *write_ms,
                              int *memory_wait)
{
    *memory_wait = cfg != NULL && shmipc_config_get_memory_wait(cfg);
    /* A NULL config means the defaults, whose stream timeouts are "forever". */
    int r = SHMIPC_WAIT_FOREVER, w = SHMIPC_WAIT_FOREVER;
    if (cfg != NULL) {
        (void)shmipc_config_get_timeout(cfg, SHMIPC_TIMEOUT_READ, &r);
        (void)shmipc_config_get_timeout(cfg, SHMIPC_TIMEOUT_WRITE, &w);
    }
    *read_ms = r;
    *write_ms = w;
}

int shmipcpy_parse_args(const char *fname, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames, const char *argname, PyObject **value, int *nonblock)
{
    *nonblock = 0;
    if (nargs > (argname ? 1 : 0)) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional argument%s", fname,
                     argname ? 1 : 0, argname ? "" : "s");
        return -1;
    }
    if (nargs == 1)
        *value = args[0];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, i);
        PyObject *v = args[nargs + i];
        if (PyUnicode_CompareWithASCIIString(key, "nonblock") == 0) {
            if ((*nonblock = PyObject_IsTrue(v)) < 0)
                return -1;
        } else if (argname && nargs == 0 && PyUnicode_CompareWithASCIIString(key, argname) == 0) {
            *value = v;
        } else {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fname,
                         key);
            return -1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Module                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static PyObject *mod_strerror(PyObject *module, PyObject *arg)
{
    (void)module;
    int overflow = 0;
    long code = PyLong_AsLongAndOverflow(arg, &overflow);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(overflow || code < INT32_MIN || code > INT32_MAX
                                    ? "unknown error"
                                    : shmipc_strerror((int)code));
}

static PyObject *mod_errname(PyObject *module, PyObject *arg)
{
    (void)module;
    int overflow = 0;
    long code = PyLong_AsLongAndOverflow(arg, &overflow);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    const char *name =
        overflow || code < INT32_MIN || code > INT32_MAX ? NULL : shmipc_errname((int)code);
    if (name == NULL)
        Py_RETURN_NONE;
    return PyUnicode_FromString(name);
}

static PyObject *mod_raise_for_code(PyObject *module, PyObject *args)
{
    int code;
    const char *detail = NULL;
    if (!PyArg_ParseTuple(args, "i|z:_raise_for_code", &code, &detail))
        return NULL;
    if (code >= 0)
        return shmipcpy_raise_invalid(state_of_module(module), "code", "must be negative");
    return shmipcpy_raise_code(state_of_module(module), code, detail);
}

/*
 * Marks the calling thread, for its life, as one that runs route handlers: an adapter's event
 * loop (shmipc.serve.inprocess.ASGIRoute), whose requests' worker threads wait on it. From it,
 * Server.stop() and close() do not wait for the server (they would wait for those requests,
 * which wait for this thread) and start()/run() are refused, as from a handler.
 */
static PyObject *mod_handler_thread(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    shmipcpy_in_callback = 1;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"strerror", mod_strerror, METH_O, "strerror(code) -> str\n\nMessage for an shmipc code."},
    {"errname", mod_errname, METH_O,
     "errname(code) -> str | None\n\nSymbolic name ('SHMIPC_ETIMEDOUT') or None."},
    {"_raise_for_code", mod_raise_for_code, METH_VARARGS,
     "_raise_for_code(code, detail=None)\n\nRaise the exception a C call failing with `code` "
     "raises (for tests and for code built on shmipc.abi)."},
    {"_handler_thread", mod_handler_thread, METH_NOARGS,
     "_handler_thread()\n\nThis thread runs route handlers for good (an adapter's event loop): "
     "Server.stop() and close() from it do not wait, as from a handler."},
    {"_defer", shmipcpy_defer, METH_VARARGS,
     "_defer(request, timeout_ms, on_end=None) -> PendingResponse\n\nRequest.defer()'s C "
     "side: only inside the request's own route handler."},
    {"connect", (PyCFunction)(void (*)(void))shmipcpy_connect, METH_VARARGS | METH_KEYWORDS,
     "connect(address, config=None) -> Session\n\n"
     "Connect to a server and run the client handshake; the same as Session.connect()."},
    {NULL, NULL, 0, NULL},
};

static PyObject *new_exception(PyObject *module, const char *name, const char *doc, PyObject *bases)
{
    PyObject *exc = PyErr_NewExceptionWithDoc(name, doc, bases, NULL);
    Py_DECREF(bases);
    if (exc == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, strrchr(name, '.') + 1, exc) < 0) {
        Py_DECREF(exc);
        return NULL;
    }
    return exc;
}

static int add_errors_dict(PyObject *module)
{
    PyObject *errors = PyDict_New();
    if (errors == NULL)
        return -1;
#define ADD_CODE(name, value, msg)                                                                 \
    do {                                                                                           \
        PyObject *v = PyLong_FromLong(value);                                                      \
        if (v == NULL || PyDict_SetItemString(errors, #name, v) < 0) {                             \
            Py_XDECREF(v);                                                                         \
            Py_DECREF(errors);                                                                     \
            return -1;                                                                             \
        }                                                                                          \
        Py_DECREF(v);                                                                              \
    } while (0);
    SHMIPC_ERRNO_MAP(ADD_CODE)
#undef ADD_CODE
    int rc = PyModule_AddObjectRef(module, "errors", errors);
    Py_DECREF(errors);
    return rc;
}

int shmipcpy_abi_exec(PyObject *module); /* abi.c: shmipc.abi's functions and Handle type */

static int module_exec(PyObject *module)
{
    static pthread_once_t pid_once = PTHREAD_ONCE_INIT;
    module_state *st = state_of_module(module);

    if (pthread_once(&pid_once, pid_init) != 0 || !pid_ok) {
        PyErr_SetString(PyExc_RuntimeError, "shmipc: cannot register its fork handler");
        return -1;
    }

    st->config_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &shmipcpy_config_spec, NULL);
    if (st->config_type == NULL || PyModule_AddType(module, st->config_type) < 0)
        return -1;

    st->error = new_exception(module, "shmipc.Error",
                              "Base of every shmipc error. errno is the positive shmipc code,\n"
                              "code the negative one, name its symbol ('SHMIPC_EPROTO').",
                              PyTuple_Pack(1, PyExc_OSError));
    if (st->error == NULL)
        return -1;
#define SUBCLASS(field, name, doc, ...)                                                            \
    do {                                                                                           \
        PyObject *bases = PyTuple_Pack(__VA_ARGS__);                                               \
        if (bases == NULL || (st->field = new_exception(module, name, doc, bases)) == NULL)        \
            return -1;                                                                             \
    } while (0)
    SUBCLASS(timeout_error, "shmipc.TimeoutError", "An operation timed out.", 2, st->error,
             PyExc_TimeoutError);
    SUBCLASS(closed_error, "shmipc.ClosedError", "The handle was closed locally.", 1, st->error);
    SUBCLASS(peer_gone, "shmipc.PeerGoneError", "The peer is gone (connection reset or EOF).", 2,
             st->error, PyExc_ConnectionResetError);
    SUBCLASS(protocol_error, "shmipc.ProtocolError",
             "The peer broke the protocol, or refused the version or negotiation.", 1, st->error);
    SUBCLASS(invalid_error, "shmipc.InvalidArgumentError",
             "A value was refused; the message names the field.", 2, st->error, PyExc_ValueError);
    SUBCLASS(eof_error, "shmipc.EndOfStreamError", "The peer closed the stream.", 2, st->error,
             PyExc_EOFError);
    SUBCLASS(released_error, "shmipc.ReleasedError",
             "A Chunk (a zero-copy buffer) was used after it was released, or after its\n"
             "stream was released or closed. Also a ValueError, as for a released memoryview.",
             2, st->closed_error, PyExc_ValueError);
#undef SUBCLASS

#define ADD_TYPE(field, spec, base)                                                                \
    do {                                                                                           \
        st->field = (PyTypeObject *)PyType_FromModuleAndSpec(module, &(spec), (base));             \
        if (st->field == NULL || PyModule_AddType(module, st->field) < 0)                          \
            return -1;                                                                             \
    } while (0)
    ADD_TYPE(session_type, shmipcpy_session_spec, NULL);
    ADD_TYPE(stream_type, shmipcpy_stream_spec, NULL);
    ADD_TYPE(chunk_type, shmipcpy_chunk_spec, NULL);
    ADD_TYPE(window_type, shmipcpy_window_spec, NULL);
    ADD_TYPE(manager_type, shmipcpy_manager_spec, NULL);
    ADD_TYPE(listener_type, shmipcpy_listener_spec, NULL);
    ADD_TYPE(server_type, shmipcpy_server_spec, NULL);
    ADD_TYPE(websocket_type, shmipcpy_websocket_spec, NULL);
    ADD_TYPE(pending_type, shmipcpy_pending_spec, NULL);
    ADD_TYPE(route_queue_type, shmipcpy_route_queue_spec, NULL);
    ADD_TYPE(request_base_type, shmipcpy_request_base_spec, NULL);
#undef ADD_TYPE

    PyObject *io = PyImport_ImportModule("io");
    if (io == NULL)
        return -1;
    st->unsupported = PyObject_GetAttrString(io, "UnsupportedOperation");
    Py_DECREF(io);
    if (st->unsupported == NULL)
        return -1;

    if (PyModule_AddStringConstant(module, "__version__", shmipc_version_string()) < 0 ||
        PyModule_AddIntConstant(module, "version_number", shmipc_version()) < 0 ||
        PyModule_AddIntConstant(module, "MAX_SLICE_CLASSES", SHMIPC_MAX_SLICE_CLASSES) < 0 ||
        PyModule_AddIntConstant(module, "MIN_BUFFER_CAPACITY", SHMIPC_MIN_BUFFER_CAPACITY) < 0 ||
        PyModule_AddIntConstant(module, "PENDING_SENT", SHMIPC_HTTP_PENDING_SENT) < 0 ||
        PyModule_AddIntConstant(module, "PENDING_CLIENT_GONE", SHMIPC_HTTP_PENDING_CLIENT_GONE) <
            0 ||
        PyModule_AddIntConstant(module, "PENDING_TIMEOUT", SHMIPC_HTTP_PENDING_TIMEOUT) < 0 ||
        PyModule_AddIntConstant(module, "PENDING_FAILED", SHMIPC_HTTP_PENDING_FAILED) < 0 ||
        PyModule_AddIntConstant(module, "PENDING_ABANDONED", SHMIPC_HTTP_PENDING_ABANDONED) < 0)
        return -1;
    if (shmipcpy_abi_exec(module) < 0)
        return -1;
    return add_errors_dict(module);
}

static int module_traverse(PyObject *module, visitproc visit, void *arg)
{
    module_state *st = state_of_module(module);
    Py_VISIT(st->config_type);
    Py_VISIT(st->session_type);
    Py_VISIT(st->stream_type);
    Py_VISIT(st->chunk_type);
    Py_VISIT(st->window_type);
    Py_VISIT(st->manager_type);
    Py_VISIT(st->listener_type);
    Py_VISIT(st->server_type);
    Py_VISIT(st->websocket_type);
    Py_VISIT(st->pending_type);
    Py_VISIT(st->route_queue_type);
    Py_VISIT(st->request_base_type);
    Py_VISIT(st->error);
    Py_VISIT(st->timeout_error);
    Py_VISIT(st->closed_error);
    Py_VISIT(st->peer_gone);
    Py_VISIT(st->protocol_error);
    Py_VISIT(st->invalid_error);
    Py_VISIT(st->eof_error);
    Py_VISIT(st->released_error);
    Py_VISIT(st->unsupported);
    return 0;
}

static int module_clear(PyObject *module)
{
    module_state *st = state_of_module(module);
    Py_CLEAR(st->config_type);
    Py_CLEAR(st->session_type);
    Py_CLEAR(st->stream_type);
    Py_CLEAR(st->chunk_type);
    Py_CLEAR(st->window_type);
    Py_CLEAR(st->manager_type);
    Py_CLEAR(st->listener_type);
    Py_CLEAR(st->server_type);
    Py_CLEAR(st->websocket_type);
    Py_CLEAR(st->pending_type);
    Py_CLEAR(st->route_queue_type);
    Py_CLEAR(st->request_base_type);
    Py_CLEAR(st->error);
    Py_CLEAR(st->timeout_error);
    Py_CLEAR(st->closed_error);
    Py_CLEAR(st->peer_gone);
    Py_CLEAR(st->protocol_error);
    Py_CLEAR(st->invalid_error);
    Py_CLEAR(st->eof_error);
    Py_CLEAR(st->released_error);
    Py_CLEAR(st->unsupported);
    return 0;
}

static void module_free(void *module)
{
    module_clear((PyObject *)module);
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

PyModuleDef shmipcpy_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "shmipc._shmipc",
    .m_doc = "C core of the shmipc package; use `import shmipc`.",
    .m_size = sizeof(module_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__shmipc(void)
{
    return PyModuleDef_Init(&shmipcpy_module);
}
