/*
 * _shmipc: the CPython extension behind `import shmipc`. It calls only the public header.
 * Multi-phase init, heap types and module state (no static Python objects), so the module
 * can be loaded in several interpreters and reloaded.
 */
#include "module.h"

#include <math.h>
#include <time.h>

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
    if (!isfinite(s) || s < 0 || s * 1000.0 > (double)INT32_MAX) {
        shmipcpy_raise_invalid(st, field, "must be a finite number of seconds >= 0, or None");
        return -1;
    }
    if (s == 0 && !allow_zero) {
        shmipcpy_raise_invalid(st, field, "0 is not a timeout; use None to wait forever");
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

void shmipcpy_config_timeouts(const shmipc_config *cfg, uint32_t *read_ms, uint32_t *write_ms)
{
    /* A NULL config means the defaults, whose stream timeouts are "forever". */
    *read_ms = cfg ? (uint32_t)shmipc_config_get_timeout_ms(cfg, SHMIPC_TIMEOUT_READ) : 0;
    *write_ms = cfg ? (uint32_t)shmipc_config_get_timeout_ms(cfg, SHMIPC_TIMEOUT_WRITE) : 0;
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
/* Config                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static const char *const memmap_names[] = {"devshm", "memfd"};
static const char *const wakeup_names[] = {"socket", "eventfd", "polling"};

static int lookup_name(const char *const *names, int n, PyObject *value)
{
    const char *s = PyUnicode_Check(value) ? PyUnicode_AsUTF8(value) : NULL;
    if (s == NULL)
        return -1;
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

static void config_dealloc(ConfigObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    shmipc_config_free(self->cfg);
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* Returns self (new reference) when rc is 0, so builder calls chain. */
static PyObject *chain(ConfigObject *self, int rc)
{
    if (rc < 0)
        return shmipcpy_raise_last(shmipcpy_state_of_type(Py_TYPE(self)), rc);
    return Py_NewRef(self);
}

static int setter_result(ConfigObject *self, int rc)
{
    if (rc < 0) {
        shmipcpy_raise_last(shmipcpy_state_of_type(Py_TYPE(self)), rc);
        return -1;
    }
    return 0;
}

static int require_value(PyObject *value, const char *field)
{
    if (value == NULL) {
        PyErr_Format(PyExc_AttributeError, "cannot delete Config.%s", field);
        return -1;
    }
    return 0;
}

/* Reads a non-negative int from a Python int; raises TypeError for other types. */
static int to_u64(ConfigObject *self, PyObject *value, const char *field, uint64_t *out)
{
    if (!PyLong_Check(value) || PyBool_Check(value)) {
        PyErr_Format(PyExc_TypeError, "Config.%s must be an int, not %.100s", field,
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow != 0 || v < 0) {
        shmipcpy_raise_invalid(shmipcpy_state_of_type(Py_TYPE(self)), field, "out of range");
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

static PyObject *get_buffer_capacity(ConfigObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(shmipc_config_get_buffer_capacity(self->cfg));
}

static int set_buffer_capacity(ConfigObject *self, PyObject *value, void *closure)
{
    (void)closure;
    uint64_t v;
    if (require_value(value, "buffer_capacity") < 0 ||
        to_u64(self, value, "buffer_capacity", &v) < 0)
        return -1;
    return setter_result(self, shmipc_config_set_buffer_capacity(self->cfg, v));
}

static PyObject *get_queue_capacity(ConfigObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLong(shmipc_config_get_queue_capacity(self->cfg));
}

static int set_queue_capacity(ConfigObject *self, PyObject *value, void *closure)
{
    (void)closure;
    uint64_t v;
    if (require_value(value, "queue_capacity") < 0 || to_u64(self, value, "queue_capacity", &v) < 0)
        return -1;
    if (v > UINT32_MAX) {
        shmipcpy_raise_invalid(shmipcpy_state_of_type(Py_TYPE(self)), "queue_capacity",
                               "out of range");
        return -1;
    }
    return setter_result(self, shmipc_config_set_queue_capacity(self->cfg, (uint32_t)v));
}

static PyObject *get_slice_classes(ConfigObject *self, void *closure)
{
    (void)closure;
    shmipc_slice_class classes[SHMIPC_MAX_SLICE_CLASSES];
    int n = shmipc_config_get_slice_classes(self->cfg, classes, SHMIPC_MAX_SLICE_CLASSES);
    if (n < 0)
        return shmipcpy_raise_last(shmipcpy_state_of_type(Py_TYPE(self)), n);
    PyObject *list = PyList_New(n);
    for (int i = 0; list != NULL && i < n; i++) {
        PyObject *pair = Py_BuildValue("(II)", classes[i].size, classes[i].percent);
        if (pair == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, pair);
    }
    return list;
}

/* Accepts "size:pct,..." or an iterable of (size, percent) pairs. */
static int set_slice_classes(ConfigObject *self, PyObject *value, void *closure)
{
    (void)closure;
    module_state *st = shmipcpy_state_of_type(Py_TYPE(self));
    shmipc_slice_class classes[SHMIPC_MAX_SLICE_CLASSES];
    size_t n = 0;
    if (require_value(value, "slice_classes") < 0)
        return -1;
    if (PyUnicode_Check(value)) {
        const char *spec = PyUnicode_AsUTF8(value);
        if (spec == NULL)
            return -1;
        return setter_result(self, shmipc_config_parse_slice_classes(self->cfg, spec));
    }
    PyObject *seq = PySequence_Fast(value, "Config.slice_classes must be a str or a sequence "
                                           "of (size, percent) pairs");
    if (seq == NULL)
        return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    if (len == 0 || len > SHMIPC_MAX_SLICE_CLASSES) {
        Py_DECREF(seq);
        shmipcpy_raise_invalid(st, "slice_classes", "need 1 to 32 (size, percent) pairs");
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        uint64_t size, percent;
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if ((!PyTuple_Check(item) && !PyList_Check(item)) || PySequence_Size(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "Config.slice_classes items must be (size, percent)");
            Py_DECREF(seq);
            return -1;
        }
        PyObject *pair = PySequence_Tuple(item);
        int ok = pair != NULL &&
                 to_u64(self, PyTuple_GET_ITEM(pair, 0), "slice_classes", &size) == 0 &&
                 to_u64(self, PyTuple_GET_ITEM(pair, 1), "slice_classes", &percent) == 0;
        Py_XDECREF(pair);
        if (!ok) {
            Py_DECREF(seq);
            return -1;
        }
        if (size > UINT32_MAX || percent > UINT32_MAX) {
            Py_DECREF(seq);
            shmipcpy_raise_invalid(st, "slice_classes", "size or percent out of range");
            return -1;
        }
        classes[n++] = (shmipc_slice_class){(uint32_t)size, (uint32_t)percent};
    }
    Py_DECREF(seq);
    return setter_result(self, shmipc_config_set_slice_classes(self->cfg, classes, n));
}

static PyObject *get_memmap(ConfigObject *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(memmap_names[shmipc_config_get_memmap_type(self->cfg)]);
}

static int set_memmap(ConfigObject *self, PyObject *value, void *closure)
{
    (void)closure;
    if (require_value(value, "memmap") < 0)
        return -1;
    int type = lookup_name(memmap_names, 2, value);
    if (type < 0) {
        shmipcpy_raise_invalid(shmipcpy_state_of_type(Py_TYPE(self)), "memmap",
                               "must be 'memfd' or 'devshm'");
        return -1;
    }
    return setter_result(self, shmipc_config_set_memmap_type(self->cfg, type));
}

static PyObject *get_path_prefix(ConfigObject *self, void *closure)
{
    (void)closure;
    return PyUnicode_DecodeFSDefault(shmipc_config_get_path_prefix(self->cfg));
}

static int set_path_prefix(ConfigObject *self, PyObject *value, void *closure)
{
    (void)closure;
    PyObject *bytes = NULL;
    if (require_value(value, "path_prefix") < 0 || !PyUnicode_FSConverter(value, &bytes))
        return -1;
    int rc = shmipc_config_set_path_prefix(self->cfg, PyBytes_AS_STRING(bytes));
    Py_DECREF(bytes);
    return setter_result(self, rc);
}

static const char *const timeout_fields[] = {"initialize_timeout", "connection_write_timeout",
                                             "read_timeout", "write_timeout"};

static PyObject *get_timeout(ConfigObject *self, void *closure)
{
    int which = (int)(intptr_t)closure;
    int64_t ms = shmipc_config_get_timeout_ms(self->cfg, which);
    if (ms == 0 && (which == SHMIPC_TIMEOUT_READ || which == SHMIPC_TIMEOUT_WRITE))
        Py_RETURN_NONE;
    return PyFloat_FromDouble((double)ms / 1000.0);
}

/*
 * Timeouts are float seconds. None means "wait forever" (read/write only). A positive value
 * below a millisecond rounds up to 1 ms rather than down to 0, which would mean forever.
 */
static int set_timeout(ConfigObject *self, PyObject *value, void *closure)
{
    int which = (int)(intptr_t)closure;
    const char *field = timeout_fields[which];
    module_state *st = shmipcpy_state_of_type(Py_TYPE(self));
    uint32_t ms;
    if (require_value(value, field) < 0)
        return -1;
    if (value == Py_None) {
        ms = 0;
    } else {
        double s = PyFloat_AsDouble(value);
        if (s == -1.0 && PyErr_Occurred())
            return -1;
        if (!isfinite(s) || s < 0 || s * 1000.0 > (double)UINT32_MAX) {
            shmipcpy_raise_invalid(st, field, "must be a finite number of seconds >= 0");
            return -1;
        }
        double msf = ceil(s * 1000.0);
        ms = (uint32_t)msf;
        if (s > 0 && ms == 0)
            ms = 1;
        if (s == 0 && (which == SHMIPC_TIMEOUT_READ || which == SHMIPC_TIMEOUT_WRITE)) {
            shmipcpy_raise_invalid(st, field, "0 is not a timeout; use None to wait forever");
            return -1;
        }
    }
    return setter_result(self, shmipc_config_set_timeout_ms(self->cfg, which, ms));
}

/* session_num and max_stream_num: plain u32 fields; the closure picks which. */
static PyObject *get_pool_field(ConfigObject *self, void *closure)
{
    return PyLong_FromUnsignedLong(closure ? shmipc_config_get_max_stream_num(self->cfg)
                                           : shmipc_config_get_session_num(self->cfg));
}

static int set_pool_field(ConfigObject *self, PyObject *value, void *closure)
{
    const char *field = closure ? "max_stream_num" : "session_num";
    uint64_t v;
    if (require_value(value, field) < 0 || to_u64(self, value, field, &v) < 0)
        return -1;
    if (v > UINT32_MAX) {
        shmipcpy_raise_invalid(shmipcpy_state_of_type(Py_TYPE(self)), field, "out of range");
        return -1;
    }
    return setter_result(self, closure ? shmipc_config_set_max_stream_num(self->cfg, (uint32_t)v)
                                       : shmipc_config_set_session_num(self->cfg, (uint32_t)v));
}

static PyObject *get_rebuild_interval(ConfigObject *self, void *closure)
{
    (void)closure;
    return PyFloat_FromDouble(shmipc_config_get_rebuild_interval_ms(self->cfg) / 1000.0);
}

static int set_rebuild_interval(ConfigObject *self, PyObject *value, void *closure)
{
    (void)closure;
    double s;
    if (require_value(value, "rebuild_interval") < 0)
        return -1;
    if ((s = PyFloat_AsDouble(value)) == -1.0 && PyErr_Occurred())
        return -1;
    if (!isfinite(s) || s < 0 || ceil(s * 1000.0) > (double)UINT32_MAX) {
        shmipcpy_raise_invalid(shmipcpy_state_of_type(Py_TYPE(self)), "rebuild_interval",
                               "out of range");
        return -1;
    }
    return setter_result(
        self, shmipc_config_set_rebuild_interval_ms(self->cfg, (uint32_t)ceil(s * 1000.0)));
}

static PyObject *get_protocol(ConfigObject *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(
        shmipc_config_get_protocol(self->cfg) == SHMIPC_PROTOCOL_V4 ? "v4" : "legacy");
}

static PyObject *get_fallback(ConfigObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(shmipc_config_get_fallback(self->cfg));
}

static PyObject *get_wakeup(ConfigObject *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(wakeup_names[shmipc_config_get_wakeup(self->cfg)]);
}

static PyObject *get_polling_interval_us(ConfigObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLong(shmipc_config_get_polling_interval_us(self->cfg));
}

/* server_v4: whether a listener accepts V4 clients; the offered features are kept as they are. */
static const char *const v4_feature_names[] = {"eventfd", "polling"};
#define ALL_V4_FEATURES (SHMIPC_V4_FEATURE_EVENTFD | SHMIPC_V4_FEATURE_POLLING)

static PyObject *get_server_v4(ConfigObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(shmipc_config_get_server_v4(self->cfg, NULL) > 0);
}

static int set_server_v4(ConfigObject *self, PyObject *value, void *closure)
{
    (void)closure;
    unsigned features = 0;
    if (require_value(value, "server_v4") < 0)
        return -1;
    if (!PyBool_Check(value)) {
        PyErr_Format(PyExc_TypeError, "Config.server_v4 must be a bool, not %.100s",
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    (void)shmipc_config_get_server_v4(self->cfg, &features);
    return setter_result(self, shmipc_config_set_server_v4(self->cfg, value == Py_True, features));
}

/* The offered V4 features as a tuple of names, in the order of their bits. */
static PyObject *get_server_v4_features(ConfigObject *self, void *closure)
{
    (void)closure;
    unsigned features = 0;
    Py_ssize_t n = 0;
    (void)shmipc_config_get_server_v4(self->cfg, &features);
    PyObject *tuple = PyTuple_New(__builtin_popcount(features & ALL_V4_FEATURES));
    for (int i = 0; tuple != NULL && i < 2; i++) {
        if ((features & (1u << i)) == 0)
            continue;
        PyObject *name = PyUnicode_FromString(v4_feature_names[i]);
        if (name == NULL)
            Py_CLEAR(tuple);
        else
            PyTuple_SET_ITEM(tuple, n++, name);
    }
    return tuple;
}

/* Any iterable of "eventfd" and "polling" (a str alone is refused: it is not a list of names). */
static int set_server_v4_features(ConfigObject *self, PyObject *value, void *closure)
{
    (void)closure;
    module_state *st = shmipcpy_state_of_type(Py_TYPE(self));
    unsigned features = 0;
    if (require_value(value, "server_v4_features") < 0)
        return -1;
    if (PyUnicode_Check(value) || PyBytes_Check(value)) {
        PyErr_SetString(PyExc_TypeError,
                        "Config.server_v4_features must be an iterable of names, not a string");
        return -1;
    }
    PyObject *seq = PySequence_Fast(value, "Config.server_v4_features must be an iterable of "
                                           "'eventfd' and 'polling'");
    if (seq == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyUnicode_Check(item)) {
            PyErr_Format(PyExc_TypeError, "Config.server_v4_features items must be str, not %.100s",
                         Py_TYPE(item)->tp_name);
            Py_DECREF(seq);
            return -1;
        }
        int bit = lookup_name(v4_feature_names, 2, item);
        if (bit < 0) {
            PyErr_Clear(); /* a str that is no valid UTF-8 is just an unknown name here */
            Py_DECREF(seq);
            shmipcpy_raise_invalid(st, "server_v4_features",
                                   "each feature must be 'eventfd' or 'polling'");
            return -1;
        }
        features |= 1u << bit;
    }
    Py_DECREF(seq);
    int accept = shmipc_config_get_server_v4(self->cfg, NULL);
    return setter_result(self, shmipc_config_set_server_v4(self->cfg, accept, features));
}

static PyObject *get_peer_uids(ConfigObject *self, void *closure)
{
    (void)closure;
    uint32_t uids[SHMIPC_MAX_PEER_UIDS];
    int n = shmipc_config_get_peer_uids(self->cfg, uids, SHMIPC_MAX_PEER_UIDS);
    if (n < 0)
        return shmipcpy_raise_last(shmipcpy_state_of_type(Py_TYPE(self)), n);
    if (n > SHMIPC_MAX_PEER_UIDS)
        n = SHMIPC_MAX_PEER_UIDS;
    PyObject *list = PyList_New(n);
    for (int i = 0; list != NULL && i < n; i++) {
        PyObject *uid = PyLong_FromUnsignedLong(uids[i]);
        if (uid == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, uid);
    }
    return list;
}

/*
 * An iterable of ints (uids), or None or [] to clear the allow-list. Read one item at a time,
 * so an endless iterator is refused after SHMIPC_MAX_PEER_UIDS + 1 items, not materialized.
 */
static int set_peer_uids(ConfigObject *self, PyObject *value, void *closure)
{
    (void)closure;
    module_state *st = shmipcpy_state_of_type(Py_TYPE(self));
    uint32_t uids[SHMIPC_MAX_PEER_UIDS];
    size_t n = 0;
    int rc = -1;
    PyObject *it, *item = NULL;
    if (require_value(value, "peer_uids") < 0)
        return -1;
    if (value == Py_None)
        return setter_result(self, shmipc_config_set_peer_uids(self->cfg, NULL, 0));
    if (PyUnicode_Check(value) || PyBytes_Check(value) || (it = PyObject_GetIter(value)) == NULL) {
        PyErr_Format(PyExc_TypeError,
                     "Config.peer_uids must be an iterable of int uids or None, not %.100s",
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    while ((item = PyIter_Next(it)) != NULL) {
        uint64_t v;
        if (!PyLong_Check(item) || PyBool_Check(item)) {
            PyErr_Format(PyExc_TypeError, "Config.peer_uids items must be int uids, not %.100s",
                         Py_TYPE(item)->tp_name);
            goto done;
        }
        if (to_u64(self, item, "peer_uids", &v) < 0)
            goto done;
        if (v > UINT32_MAX) {
            shmipcpy_raise_invalid(st, "peer_uids", "a uid is 0..4294967294");
            goto done;
        }
        if (n == SHMIPC_MAX_PEER_UIDS) {
            shmipcpy_raise_invalid(st, "peer_uids", "more uids than the 64 allowed (at most 64)");
            goto done;
        }
        uids[n++] = (uint32_t)v;
        Py_CLEAR(item);
    }
    if (!PyErr_Occurred())
        rc = setter_result(self, shmipc_config_set_peer_uids(self->cfg, uids, n));
done:
    Py_XDECREF(item);
    Py_DECREF(it);
    return rc;
}

static PyObject *get_socket_mode(ConfigObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLong(shmipc_config_get_socket_mode(self->cfg));
}

static int set_socket_mode(ConfigObject *self, PyObject *value, void *closure)
{
    (void)closure;
    uint64_t v;
    if (require_value(value, "socket_mode") < 0 || to_u64(self, value, "socket_mode", &v) < 0)
        return -1;
    if (v > 0777) {
        shmipcpy_raise_invalid(shmipcpy_state_of_type(Py_TYPE(self)), "socket_mode",
                               "has bits outside 0o777");
        return -1;
    }
    return setter_result(self, shmipc_config_set_socket_mode(self->cfg, (unsigned)v));
}

static PyObject *get_max_pending_streams(ConfigObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLong(shmipc_config_get_max_pending_streams(self->cfg));
}

static int set_max_pending_streams(ConfigObject *self, PyObject *value, void *closure)
{
    (void)closure;
    uint64_t v;
    if (require_value(value, "max_pending_streams") < 0 ||
        to_u64(self, value, "max_pending_streams", &v) < 0)
        return -1;
    if (v > UINT32_MAX) {
        shmipcpy_raise_invalid(shmipcpy_state_of_type(Py_TYPE(self)), "max_pending_streams",
                               "out of range");
        return -1;
    }
    return setter_result(self, shmipc_config_set_max_pending_streams(self->cfg, (uint32_t)v));
}

static PyObject *get_spin_us(ConfigObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLong(shmipc_config_get_spin_us(self->cfg));
}

static int set_spin_us(ConfigObject *self, PyObject *value, void *closure)
{
    (void)closure;
    uint64_t v;
    if (require_value(value, "spin_us") < 0 || to_u64(self, value, "spin_us", &v) < 0)
        return -1;
    if (v > UINT32_MAX) {
        shmipcpy_raise_invalid(shmipcpy_state_of_type(Py_TYPE(self)), "spin_us", "out of range");
        return -1;
    }
    return setter_result(self, shmipc_config_set_spin_us(self->cfg, (uint32_t)v));
}

static PyObject *get_max_fallback_unread(ConfigObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(shmipc_config_get_max_fallback_unread(self->cfg));
}

static int set_max_fallback_unread(ConfigObject *self, PyObject *value, void *closure)
{
    (void)closure;
    uint64_t v;
    if (require_value(value, "max_fallback_unread") < 0 ||
        to_u64(self, value, "max_fallback_unread", &v) < 0)
        return -1;
    return setter_result(self, shmipc_config_set_max_fallback_unread(self->cfg, v));
}

static PyObject *config_set_protocol(ConfigObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"protocol", "fallback", NULL};
    const char *name;
    int fallback = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s|p:set_protocol", kwlist, &name, &fallback))
        return NULL;
    int protocol;
    if (strcmp(name, "legacy") == 0)
        protocol = SHMIPC_PROTOCOL_LEGACY;
    else if (strcmp(name, "v4") == 0)
        protocol = SHMIPC_PROTOCOL_V4;
    else
        return shmipcpy_raise_invalid(shmipcpy_state_of_type(Py_TYPE(self)), "protocol",
                                      "must be 'legacy' or 'v4'");
    return chain(self, shmipc_config_set_protocol(self->cfg, protocol, fallback));
}

static PyObject *config_set_wakeup(ConfigObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"wakeup", "interval_us", NULL};
    PyObject *name;
    unsigned int interval = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "U|I:set_wakeup", kwlist, &name, &interval))
        return NULL;
    int wakeup = lookup_name(wakeup_names, 3, name);
    if (wakeup < 0)
        return shmipcpy_raise_invalid(shmipcpy_state_of_type(Py_TYPE(self)), "wakeup",
                                      "must be 'socket', 'eventfd' or 'polling'");
    return chain(self, shmipc_config_set_wakeup(self->cfg, wakeup, interval));
}

static PyObject *config_with_v4(ConfigObject *self, PyObject *unused)
{
    (void)unused;
    return chain(self, shmipc_config_with_v4(self->cfg));
}

static PyObject *config_with_v4_eventfd(ConfigObject *self, PyObject *unused)
{
    (void)unused;
    return chain(self, shmipc_config_with_v4_eventfd(self->cfg));
}

static PyObject *config_with_v4_event_queue_polling(ConfigObject *self, PyObject *arg)
{
    unsigned long interval = PyLong_AsUnsignedLong(arg);
    if (interval == (unsigned long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return NULL;
        PyErr_Clear();
        return shmipcpy_raise_invalid(shmipcpy_state_of_type(Py_TYPE(self)), "polling_interval_us",
                                      "out of range");
    }
    if (interval > UINT32_MAX)
        return shmipcpy_raise_invalid(shmipcpy_state_of_type(Py_TYPE(self)), "polling_interval_us",
                                      "out of range");
    return chain(self, shmipc_config_with_v4_event_queue_polling(self->cfg, (uint32_t)interval));
}

static PyObject *config_validate(ConfigObject *self, PyObject *unused)
{
    (void)unused;
    int rc = shmipc_config_validate(self->cfg);
    if (rc < 0)
        return shmipcpy_raise_last(shmipcpy_state_of_type(Py_TYPE(self)), rc);
    Py_RETURN_NONE;
}

static PyObject *config_copy(ConfigObject *self, PyObject *unused)
{
    (void)unused;
    PyTypeObject *type = Py_TYPE(self);
    ConfigObject *copy = (ConfigObject *)type->tp_alloc(type, 0);
    if (copy == NULL)
        return NULL;
    int rc = shmipc_config_clone(self->cfg, &copy->cfg);
    if (rc < 0) {
        Py_DECREF(copy);
        return shmipcpy_raise_last(shmipcpy_state_of_type(type), rc);
    }
    return (PyObject *)copy;
}

static PyObject *config_repr(ConfigObject *self)
{
    PyObject *classes = get_slice_classes(self, NULL);
    char interval[32] = "";
    if (classes == NULL)
        return NULL;
    if (shmipc_config_get_wakeup(self->cfg) == SHMIPC_WAKEUP_POLLING)
        PyOS_snprintf(interval, sizeof interval, "(%uus)",
                      (unsigned)shmipc_config_get_polling_interval_us(self->cfg));
    PyObject *r = PyUnicode_FromFormat(
        "<shmipc.Config memmap=%s buffer_capacity=%llu queue_capacity=%u slice_classes=%R "
        "path_prefix=%s protocol=%s%s wakeup=%s%s>",
        memmap_names[shmipc_config_get_memmap_type(self->cfg)],
        (unsigned long long)shmipc_config_get_buffer_capacity(self->cfg),
        (unsigned)shmipc_config_get_queue_capacity(self->cfg), classes,
        shmipc_config_get_path_prefix(self->cfg),
        shmipc_config_get_protocol(self->cfg) == SHMIPC_PROTOCOL_V4 ? "v4" : "legacy",
        shmipc_config_get_fallback(self->cfg) ? "+fallback" : "",
        wakeup_names[shmipc_config_get_wakeup(self->cfg)], interval);
    Py_DECREF(classes);
    return r;
}

static PyMethodDef config_methods[] = {
    {"set_protocol", (PyCFunction)(void (*)(void))config_set_protocol, METH_VARARGS | METH_KEYWORDS,
     "set_protocol(protocol, fallback=False) -> Config\n\n"
     "Choose 'legacy' (V3 over memfd, V2 over /dev/shm files) or 'v4'. With fallback, a V4\n"
     "client retries legacy when V4 set-up fails on the network or protocol level, never\n"
     "after an explicit rejection. Choosing legacy resets the wakeup to 'socket'."},
    {"set_wakeup", (PyCFunction)(void (*)(void))config_set_wakeup, METH_VARARGS | METH_KEYWORDS,
     "set_wakeup(wakeup, interval_us=0) -> Config\n\n"
     "V4 wakeup: 'socket', 'eventfd' (needs memfd) or 'polling' (needs interval_us,\n"
     "1..1000000)."},
    {"with_v4", (PyCFunction)config_with_v4, METH_NOARGS,
     "with_v4() -> Config\n\nV4 with socket wakeups and fallback on."},
    {"with_v4_eventfd", (PyCFunction)config_with_v4_eventfd, METH_NOARGS,
     "with_v4_eventfd() -> Config\n\nV4 with eventfd wakeups over memfd, fallback on."},
    {"with_v4_event_queue_polling", (PyCFunction)config_with_v4_event_queue_polling, METH_O,
     "with_v4_event_queue_polling(interval_us) -> Config\n\n"
     "V4 with no per-message wakeup: both peers drain every interval_us; fallback on."},
    {"validate", (PyCFunction)config_validate, METH_NOARGS,
     "validate() -> None\n\nCheck every rule across all fields; raise InvalidArgumentError."},
    {"copy", (PyCFunction)config_copy, METH_NOARGS, "copy() -> Config\n\nAn independent copy."},
    {"__copy__", (PyCFunction)config_copy, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

#define TIMEOUT_GETSET(name, i, doc)                                                               \
    {                                                                                              \
        name, (getter)get_timeout, (setter)set_timeout, doc, (void *)(intptr_t)(i)                 \
    }

static PyGetSetDef config_getset[] = {
    {"buffer_capacity", (getter)get_buffer_capacity, (setter)set_buffer_capacity,
     "Shared buffer size in bytes (1 MiB .. 4 GiB-1; default 32 MiB).", NULL},
    {"queue_capacity", (getter)get_queue_capacity, (setter)set_queue_capacity,
     "Elements per queue direction (default 8192; multiples of 16 always work).", NULL},
    {"slice_classes", (getter)get_slice_classes, (setter)set_slice_classes,
     "Slice classes as a list of (size, percent), sorted by size. Set from a list of pairs\n"
     "or from text 'size:percent,...'. Percents sum to 100.",
     NULL},
    {"memmap", (getter)get_memmap, (setter)set_memmap,
     "'memfd' (default, protocol V3) or 'devshm' (/dev/shm files, protocol V2).", NULL},
    {"path_prefix", (getter)get_path_prefix, (setter)set_path_prefix,
     "Prefix of shared-memory names (default '/dev/shm/shmipc').", NULL},
    TIMEOUT_GETSET("initialize_timeout", 0, "Handshake timeout in seconds (default 1.0)."),
    TIMEOUT_GETSET("connection_write_timeout", 1,
                   "Socket write timeout in seconds (default 10.0)."),
    TIMEOUT_GETSET("read_timeout", 2,
                   "Stream read timeout in seconds, or None to wait forever (default)."),
    TIMEOUT_GETSET("write_timeout", 3,
                   "Stream write timeout in seconds, or None to wait forever (default)."),
    {"session_num", (getter)get_pool_field, (setter)set_pool_field,
     "Session manager: sessions kept to the server (1..1024, default 1).", NULL},
    {"max_stream_num", (getter)get_pool_field, (setter)set_pool_field,
     "Session manager: idle streams pooled per session (1..65536, default 4096).", (void *)1},
    {"rebuild_interval", (getter)get_rebuild_interval, (setter)set_rebuild_interval,
     "Session manager: seconds between reconnect attempts after one failed (default 1.0).", NULL},
    {"protocol", (getter)get_protocol, NULL, "'legacy' or 'v4' (see set_protocol).", NULL},
    {"fallback", (getter)get_fallback, NULL, "Whether a V4 client may fall back to legacy.", NULL},
    {"wakeup", (getter)get_wakeup, NULL, "'socket', 'eventfd' or 'polling' (see set_wakeup).",
     NULL},
    {"polling_interval_us", (getter)get_polling_interval_us, NULL,
     "Polling interval in microseconds (0 unless wakeup is 'polling').", NULL},
    {"server_v4", (getter)get_server_v4, (setter)set_server_v4,
     "Listener: whether V4 clients are accepted (default True). A listener that refuses V4\n"
     "closes the connection on a V4 header, so V4 clients with fallback retry legacy.",
     NULL},
    {"server_v4_features", (getter)get_server_v4_features, (setter)set_server_v4_features,
     "Listener: the optional V4 features offered, a tuple of 'eventfd' and 'polling'\n"
     "(default both). Set from any iterable of those names; () offers neither.",
     NULL},
    {"peer_uids", (getter)get_peer_uids, (setter)set_peer_uids,
     "Allow-list of peer uids (SO_PEERCRED), a list of ints; [] means any peer (default).\n"
     "When set, a listener drops a client whose uid is not listed and a client refuses such\n"
     "a server (shmipc.Error named SHMIPC_EACCES). Needs a unix socket. At most 64 uids;\n"
     "set from any iterable of ints, or None or [] to clear. The getter returns a copy.",
     NULL},
    {"socket_mode", (getter)get_socket_mode, (setter)set_socket_mode,
     "Listener: permission bits of the unix socket file, 0o1..0o777 (default 0o600; 0\n"
     "restores it). Abstract sockets ('unix:@name') have no file: pair them with peer_uids.",
     NULL},
    {"spin_us", (getter)get_spin_us, (setter)set_spin_us,
     "Most microseconds a waiting reader polls shared memory before it sleeps, 0..100000\n"
     "(0: never spin; default SHMIPC_SPIN_US, else 50). Adapts below this cap to the gaps\n"
     "recently seen between messages.",
     NULL},
    {"max_pending_streams", (getter)get_max_pending_streams, (setter)set_max_pending_streams,
     "Server side: streams the peer may open that nobody accepted yet, 1..65536 (default\n"
     "4096; 0 restores it). One more ends the session with ProtocolError.",
     NULL},
    {"max_fallback_unread", (getter)get_max_fallback_unread, (setter)set_max_fallback_unread,
     "Bytes of fallback data (sent over the socket when shared memory was full) a session\n"
     "holds unread or unreleased, 65536..2**40 (default 128 MiB; 0 restores it). More ends\n"
     "the session with ProtocolError.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* Keyword arguments of Config() set properties; a typo or a read-only name is a TypeError. */
static int apply_kwargs(ConfigObject *self, PyObject *kwargs)
{
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kwargs, &pos, &key, &value)) {
        const char *name = PyUnicode_AsUTF8(key);
        const PyGetSetDef *def = config_getset;
        if (name == NULL)
            return -1;
        while (def->name != NULL && (def->set == NULL || strcmp(def->name, name) != 0))
            def++;
        if (def->name == NULL) {
            PyErr_Format(PyExc_TypeError, "Config() got an unexpected keyword argument '%U'", key);
            return -1;
        }
        if (def->set((PyObject *)self, value, def->closure) < 0)
            return -1;
    }
    return 0;
}

static PyObject *config_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    module_state *st = shmipcpy_state_of_type(type);
    if (st == NULL)
        return NULL;
    if (PyTuple_GET_SIZE(args) != 0) {
        PyErr_SetString(PyExc_TypeError, "Config() takes keyword arguments only");
        return NULL;
    }
    ConfigObject *self = (ConfigObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    int rc = shmipc_config_new(&self->cfg);
    if (rc < 0) {
        Py_DECREF(self);
        return shmipcpy_raise_last(st, rc);
    }
    if (kwargs != NULL && apply_kwargs(self, kwargs) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyType_Slot config_slots[] = {
    {Py_tp_new, config_new},
    {Py_tp_dealloc, config_dealloc},
    {Py_tp_repr, config_repr},
    {Py_tp_methods, config_methods},
    {Py_tp_getset, config_getset},
    {Py_tp_doc, "Config(**settings)\n\n"
                "Settings for sessions, session managers and listeners. A new Config holds the\n"
                "defaults of the reference implementations; keyword arguments set properties.\n"
                "Invalid values raise InvalidArgumentError naming the field and leave the\n"
                "Config unchanged."},
    {0, NULL},
};

static PyType_Spec config_spec = {
    .name = "shmipc.Config",
    .basicsize = sizeof(ConfigObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = config_slots,
};

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

static PyMethodDef module_methods[] = {
    {"strerror", mod_strerror, METH_O, "strerror(code) -> str\n\nMessage for an shmipc code."},
    {"errname", mod_errname, METH_O,
     "errname(code) -> str | None\n\nSymbolic name ('SHMIPC_ETIMEDOUT') or None."},
    {"_raise_for_code", mod_raise_for_code, METH_VARARGS,
     "_raise_for_code(code, detail=None)\n\nRaise the exception a C call failing with `code` "
     "raises (for tests and for code built on shmipc.abi)."},
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
    module_state *st = state_of_module(module);

    st->config_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &config_spec, NULL);
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
        PyModule_AddIntConstant(module, "MIN_BUFFER_CAPACITY", SHMIPC_MIN_BUFFER_CAPACITY) < 0)
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
