/*
 * config_fields.c - the properties of shmipc.Config: one getter and one setter per field of
 * shmipc_config, each checking the Python type and leaving the Config unchanged on an invalid
 * value, and the table that lists them (Config() applies its keyword arguments through it).
 *
 * Owns: the property table shmipcpy_config_getset.
 * May call: the public C API (the shmipc_config getters and setters), module.h's helpers
 * and config.c's setter helpers.
 */
#include "module.h"

#include <math.h>

static PyObject *get_buffer_capacity(ConfigObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(shmipc_config_get_buffer_capacity(self->cfg));
}

static int set_buffer_capacity(ConfigObject *self, PyObject *value, void *closure)
{
    (void)closure;
    uint64_t v;
    if (shmipcpy_config_require_value(value, "buffer_capacity") < 0 ||
        shmipcpy_config_to_u64(self, value, "buffer_capacity", &v) < 0)
        return -1;
    return shmipcpy_config_setter_result(self, shmipc_config_set_buffer_capacity(self->cfg, v));
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
    if (shmipcpy_config_require_value(value, "queue_capacity") < 0 ||
        shmipcpy_config_to_u64(self, value, "queue_capacity", &v) < 0)
        return -1;
    if (v > UINT32_MAX) {
        shmipcpy_raise_invalid(shmipcpy_state_of_type(Py_TYPE(self)), "queue_capacity",
                               "out of range");
        return -1;
    }
    return shmipcpy_config_setter_result(self,
                                         shmipc_config_set_queue_capacity(self->cfg, (uint32_t)v));
}

PyObject *shmipcpy_config_get_slice_classes(ConfigObject *self, void *closure)
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
    if (shmipcpy_config_require_value(value, "slice_classes") < 0)
        return -1;
    if (PyUnicode_Check(value)) {
        Py_ssize_t len;
        const char *spec = PyUnicode_AsUTF8AndSize(value, &len);
        if (spec == NULL)
            return -1;
        if (strlen(spec) != (size_t)len) { /* C would parse the part before the NUL */
            PyErr_SetString(PyExc_ValueError, "Config.slice_classes: embedded null character");
            return -1;
        }
        return shmipcpy_config_setter_result(self,
                                             shmipc_config_parse_slice_classes(self->cfg, spec));
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
        int ok =
            pair != NULL &&
            shmipcpy_config_to_u64(self, PyTuple_GET_ITEM(pair, 0), "slice_classes", &size) == 0 &&
            shmipcpy_config_to_u64(self, PyTuple_GET_ITEM(pair, 1), "slice_classes", &percent) == 0;
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
    return shmipcpy_config_setter_result(self,
                                         shmipc_config_set_slice_classes(self->cfg, classes, n));
}

static PyObject *get_memmap(ConfigObject *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(
        shmipcpy_config_memmap_names[shmipc_config_get_memmap_type(self->cfg)]);
}

static int set_memmap(ConfigObject *self, PyObject *value, void *closure)
{
    (void)closure;
    if (shmipcpy_config_require_value(value, "memmap") < 0)
        return -1;
    int type = shmipcpy_config_lookup_name(shmipcpy_config_memmap_names, 2, value);
    if (type < 0) {
        shmipcpy_raise_invalid(shmipcpy_state_of_type(Py_TYPE(self)), "memmap",
                               "must be 'memfd' or 'devshm'");
        return -1;
    }
    return shmipcpy_config_setter_result(self, shmipc_config_set_memmap_type(self->cfg, type));
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
    if (shmipcpy_config_require_value(value, "path_prefix") < 0 ||
        !PyUnicode_FSConverter(value, &bytes))
        return -1;
    int rc = shmipc_config_set_path_prefix(self->cfg, PyBytes_AS_STRING(bytes));
    Py_DECREF(bytes);
    return shmipcpy_config_setter_result(self, rc);
}

static const char *const timeout_fields[] = {"initialize_timeout", "connection_write_timeout",
                                             "read_timeout", "write_timeout"};

static PyObject *get_timeout(ConfigObject *self, void *closure)
{
    int which = (int)(intptr_t)closure;
    int ms = 0;
    (void)shmipc_config_get_timeout(self->cfg, which, &ms);
    if (ms < 0)
        Py_RETURN_NONE;
    return PyFloat_FromDouble((double)ms / 1000.0);
}

/*
 * Timeouts are float seconds by the API's rule: None and any negative value wait forever, 0
 * does not wait (the C setter refuses it for the two handshake timeouts). A positive value
 * below a millisecond rounds up to 1 ms rather than down to 0, which would mean "no wait".
 */
static int set_timeout(ConfigObject *self, PyObject *value, void *closure)
{
    int which = (int)(intptr_t)closure;
    const char *field = timeout_fields[which];
    int64_t ms;
    if (shmipcpy_config_require_value(value, field) < 0 ||
        shmipcpy_timeout_arg(shmipcpy_state_of_type(Py_TYPE(self)), value, field, 1, &ms) < 0)
        return -1;
    return shmipcpy_config_setter_result(self,
                                         shmipc_config_set_timeout(self->cfg, which, (int)ms));
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
    if (shmipcpy_config_require_value(value, field) < 0 ||
        shmipcpy_config_to_u64(self, value, field, &v) < 0)
        return -1;
    if (v > UINT32_MAX) {
        shmipcpy_raise_invalid(shmipcpy_state_of_type(Py_TYPE(self)), field, "out of range");
        return -1;
    }
    return shmipcpy_config_setter_result(
        self, closure ? shmipc_config_set_max_stream_num(self->cfg, (uint32_t)v)
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
    if (shmipcpy_config_require_value(value, "rebuild_interval") < 0)
        return -1;
    if ((s = PyFloat_AsDouble(value)) == -1.0 && PyErr_Occurred())
        return -1;
    if (!isfinite(s) || s < 0 || ceil(s * 1000.0) > (double)UINT32_MAX) {
        shmipcpy_raise_invalid(shmipcpy_state_of_type(Py_TYPE(self)), "rebuild_interval",
                               "out of range");
        return -1;
    }
    return shmipcpy_config_setter_result(
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
    return PyUnicode_FromString(shmipcpy_config_wakeup_names[shmipc_config_get_wakeup(self->cfg)]);
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
    if (shmipcpy_config_require_value(value, "server_v4") < 0)
        return -1;
    if (!PyBool_Check(value)) {
        PyErr_Format(PyExc_TypeError, "Config.server_v4 must be a bool, not %.100s",
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    (void)shmipc_config_get_server_v4(self->cfg, &features);
    return shmipcpy_config_setter_result(
        self, shmipc_config_set_server_v4(self->cfg, value == Py_True, features));
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
    if (shmipcpy_config_require_value(value, "server_v4_features") < 0)
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
        int bit = shmipcpy_config_lookup_name(v4_feature_names, 2, item);
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
    return shmipcpy_config_setter_result(self,
                                         shmipc_config_set_server_v4(self->cfg, accept, features));
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
    if (shmipcpy_config_require_value(value, "peer_uids") < 0)
        return -1;
    if (value == Py_None)
        return shmipcpy_config_setter_result(self, shmipc_config_set_peer_uids(self->cfg, NULL, 0));
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
        if (shmipcpy_config_to_u64(self, item, "peer_uids", &v) < 0)
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
        rc = shmipcpy_config_setter_result(self, shmipc_config_set_peer_uids(self->cfg, uids, n));
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
    if (shmipcpy_config_require_value(value, "socket_mode") < 0 ||
        shmipcpy_config_to_u64(self, value, "socket_mode", &v) < 0)
        return -1;
    if (v > 0777) {
        shmipcpy_raise_invalid(shmipcpy_state_of_type(Py_TYPE(self)), "socket_mode",
                               "has bits outside 0o777");
        return -1;
    }
    return shmipcpy_config_setter_result(self,
                                         shmipc_config_set_socket_mode(self->cfg, (unsigned)v));
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
    if (shmipcpy_config_require_value(value, "max_pending_streams") < 0 ||
        shmipcpy_config_to_u64(self, value, "max_pending_streams", &v) < 0)
        return -1;
    if (v > UINT32_MAX) {
        shmipcpy_raise_invalid(shmipcpy_state_of_type(Py_TYPE(self)), "max_pending_streams",
                               "out of range");
        return -1;
    }
    return shmipcpy_config_setter_result(
        self, shmipc_config_set_max_pending_streams(self->cfg, (uint32_t)v));
}

/* memory_wait: a bool (1 / 0 in C). */
static PyObject *get_memory_wait(ConfigObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(shmipc_config_get_memory_wait(self->cfg));
}

static int set_memory_wait(ConfigObject *self, PyObject *value, void *closure)
{
    (void)closure;
    if (shmipcpy_config_require_value(value, "memory_wait") < 0)
        return -1;
    if (!PyBool_Check(value)) {
        PyErr_Format(PyExc_TypeError, "Config.memory_wait must be a bool, not %.100s",
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    return shmipcpy_config_setter_result(
        self, shmipc_config_set_memory_wait(self->cfg, value == Py_True));
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
    if (shmipcpy_config_require_value(value, "spin_us") < 0 ||
        shmipcpy_config_to_u64(self, value, "spin_us", &v) < 0)
        return -1;
    if (v > UINT32_MAX) {
        shmipcpy_raise_invalid(shmipcpy_state_of_type(Py_TYPE(self)), "spin_us", "out of range");
        return -1;
    }
    return shmipcpy_config_setter_result(self, shmipc_config_set_spin_us(self->cfg, (uint32_t)v));
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
    if (shmipcpy_config_require_value(value, "max_fallback_unread") < 0 ||
        shmipcpy_config_to_u64(self, value, "max_fallback_unread", &v) < 0)
        return -1;
    return shmipcpy_config_setter_result(self, shmipc_config_set_max_fallback_unread(self->cfg, v));
}

#define TIMEOUT_GETSET(name, i, doc)                                                               \
    {                                                                                              \
        name, (getter)get_timeout, (setter)set_timeout, doc, (void *)(intptr_t)(i)                 \
    }

PyGetSetDef shmipcpy_config_getset[] = {
    {"buffer_capacity", (getter)get_buffer_capacity, (setter)set_buffer_capacity,
     "Shared buffer size in bytes (1 MiB .. 4 GiB-1; default 32 MiB).", NULL},
    {"queue_capacity", (getter)get_queue_capacity, (setter)set_queue_capacity,
     "Elements per queue direction (default 8192; multiples of 16 always work).", NULL},
    {"slice_classes", (getter)shmipcpy_config_get_slice_classes, (setter)set_slice_classes,
     "Slice classes as a list of (size, percent), sorted by size. Set from a list of pairs\n"
     "or from text 'size:percent,...'. Percents sum to 100.",
     NULL},
    {"memmap", (getter)get_memmap, (setter)set_memmap,
     "'memfd' (default, protocol V3) or 'devshm' (/dev/shm files, protocol V2).", NULL},
    {"path_prefix", (getter)get_path_prefix, (setter)set_path_prefix,
     "Prefix of shared-memory names (default '/dev/shm/shmipc').", NULL},
    TIMEOUT_GETSET("initialize_timeout", 0,
                   "Handshake timeout in seconds (default 1.0); None or negative: forever; "
                   "0 is refused."),
    TIMEOUT_GETSET("connection_write_timeout", 1,
                   "Socket write timeout in seconds (default 10.0); None or negative: "
                   "forever; 0 is refused."),
    TIMEOUT_GETSET("read_timeout", 2,
                   "Stream read timeout in seconds; None or negative: forever (default); "
                   "0: do not wait."),
    TIMEOUT_GETSET("write_timeout", 3,
                   "Stream write timeout in seconds; None or negative: forever (default); "
                   "0: do not wait."),
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
    {"memory_wait", (getter)get_memory_wait, (setter)set_memory_wait,
     "When shared memory is exhausted: False (default, as shmipc-go) sends over the socket\n"
     "(fallback); True makes write() and reserve() wait for the peer to free some, up to\n"
     "the write timeout (then TimeoutError, and that write added nothing).",
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
