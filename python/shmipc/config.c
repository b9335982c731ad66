/*
 * config.c - shmipc.Config, the type: its constructor (keyword arguments set properties),
 * methods (set_protocol, set_wakeup, with_v4..., validate, copy), repr and the helpers its
 * property setters share. The properties themselves are in config_fields.c.
 *
 * Owns: the Config type (a private shmipc_config per object).
 * May call: the public C API (shmipc_config_*) and module.h's helpers.
 */
#include "module.h"
#include "int_args.h"

/* ---------------------------------------------------------------------------------------- */
/* Config                                                                                   */
/* ---------------------------------------------------------------------------------------- */

const char *const shmipcpy_config_memmap_names[] = {"devshm", "memfd"};
const char *const shmipcpy_config_wakeup_names[] = {"socket", "eventfd", "polling"};

int shmipcpy_config_lookup_name(const char *const *names, int n, PyObject *value)
{
    Py_ssize_t len = 0;
    const char *s = PyUnicode_Check(value) ? PyUnicode_AsUTF8AndSize(value, &len) : NULL;
    if (s == NULL || strlen(s) != (size_t)len) /* "memfd\0x" is no name */
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

int shmipcpy_config_setter_result(ConfigObject *self, int rc)
{
    if (rc < 0) {
        shmipcpy_raise_last(shmipcpy_state_of_type(Py_TYPE(self)), rc);
        return -1;
    }
    return 0;
}

int shmipcpy_config_require_value(PyObject *value, const char *field)
{
    if (value == NULL) {
        PyErr_Format(PyExc_AttributeError, "cannot delete Config.%s", field);
        return -1;
    }
    return 0;
}

/* Reads a non-negative int from a Python int; raises TypeError for other types. */
int shmipcpy_config_to_u64(ConfigObject *self, PyObject *value, const char *field, uint64_t *out)
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
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "U|O&:set_wakeup", kwlist, &name,
                                     shmipcpy_u32_arg, &interval))
        return NULL;
    int wakeup = shmipcpy_config_lookup_name(shmipcpy_config_wakeup_names, 3, name);
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
    PyObject *classes = shmipcpy_config_get_slice_classes(self, NULL);
    char interval[32] = "";
    if (classes == NULL)
        return NULL;
    if (shmipc_config_get_wakeup(self->cfg) == SHMIPC_WAKEUP_POLLING)
        PyOS_snprintf(interval, sizeof interval, "(%uus)",
                      (unsigned)shmipc_config_get_polling_interval_us(self->cfg));
    PyObject *r = PyUnicode_FromFormat(
        "<shmipc.Config memmap=%s buffer_capacity=%llu queue_capacity=%u slice_classes=%R "
        "path_prefix=%s protocol=%s%s wakeup=%s%s>",
        shmipcpy_config_memmap_names[shmipc_config_get_memmap_type(self->cfg)],
        (unsigned long long)shmipc_config_get_buffer_capacity(self->cfg),
        (unsigned)shmipc_config_get_queue_capacity(self->cfg), classes,
        shmipc_config_get_path_prefix(self->cfg),
        shmipc_config_get_protocol(self->cfg) == SHMIPC_PROTOCOL_V4 ? "v4" : "legacy",
        shmipc_config_get_fallback(self->cfg) ? "+fallback" : "",
        shmipcpy_config_wakeup_names[shmipc_config_get_wakeup(self->cfg)], interval);
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

static int apply_kwargs(ConfigObject *self, PyObject *kwargs)
{
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kwargs, &pos, &key, &value)) {
        const char *name = PyUnicode_AsUTF8(key);
        const PyGetSetDef *def = shmipcpy_config_getset;
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
    {Py_tp_getset, shmipcpy_config_getset},
    {Py_tp_doc, "Config(**settings)\n\n"
                "Settings for sessions, session managers and listeners. A new Config holds the\n"
                "defaults of the reference implementations; keyword arguments set properties.\n"
                "Invalid values raise InvalidArgumentError naming the field and leave the\n"
                "Config unchanged."},
    {0, NULL},
};

PyType_Spec shmipcpy_config_spec = {
    .name = "shmipc.Config",
    .basicsize = sizeof(ConfigObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = config_slots,
};
