/*
 * abi.c - shmipc.abi: call any GENERIC entry of libshmipc's descriptor table by name through
 * libffi (docs/abi.md, docs/python.md). The cifs are prepared once, at the first module
 * exec, from shmipc_abi_count()/shmipc_abi_get(); they hold no Python objects, so every
 * interpreter shares them. Arguments are checked completely before anything reaches C.
 *
 * Handles are AbiHandle objects carrying their kind. A handle passed to a RELEASE parameter is
 * marked released (and refused afterwards); an owned handle that is garbage collected
 * unreleased is freed with its kind's destructor (the entry whose only parameter RELEASEs it).
 * Callbacks are libffi closures: the log sink's closure lives until the sink is replaced;
 * closures of (fn, user_data, destroy) registrations live until the library calls destroy.
 *
 * Owns: the prepared cifs (shmipcpy_abi_entries), the AbiHandle type, the closures and the
 * module's exec of shmipc.abi; abi_call.c holds the functions (call, describe, names).
 * May call: the descriptor table (shmipc_abi.h), libffi, module.h's helpers, abi_call.c.
 */
#include "abi.h"

#include <string.h>

abi_entry *shmipcpy_abi_entries;
int shmipcpy_abi_nentries;
static abi_cb_entry cb_entries[8];
static int ncb_entries;

/* ---------------------------------------------------------------------------------------- */
/* Handle                                                                                   */
/* ---------------------------------------------------------------------------------------- */

const char *shmipcpy_abi_kind_name(int kind)
{
    switch (kind) {
#define KN(name, value, ctype)                                                                     \
    case value:                                                                                    \
        return #name;
        SHMIPC_ABI_KIND_MAP(KN)
#undef KN
    default:
        return "NONE";
    }
}

static const shmipc_abi_fn *destructor_of(int kind)
{
    for (int i = 0; i < shmipcpy_abi_nentries; i++) {
        const shmipc_abi_fn *d = shmipcpy_abi_entries[i].d;
        if (d->nparams == 1 && d->params[0].type == SHMIPC_ABI_RELEASE && d->params[0].kind == kind)
            return d;
    }
    return NULL;
}

static void handle_dealloc(HandleObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->owned && !self->released && self->ptr != NULL && !shmipcpy_forked(self->pid)) {
        const shmipc_abi_fn *d = destructor_of(self->kind);
        if (d != NULL && (d->flags & SHMIPC_ABI_BLOCKS)) { /* may wait for a callback */
            void *ptr = self->ptr;
            Py_BEGIN_ALLOW_THREADS((void (*)(void *))(void *)d->fn)(ptr);
            Py_END_ALLOW_THREADS
        } else if (d != NULL) {
            ((void (*)(void *))(void *)d->fn)(self->ptr);
        }
    }
    Py_CLEAR(self->owner);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static int handle_traverse(HandleObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->owner);
    return 0;
}

static PyObject *handle_repr(HandleObject *self)
{
    if (self->released || self->ptr == NULL)
        return PyUnicode_FromFormat("<shmipc.abi.Handle %s released>",
                                    shmipcpy_abi_kind_name(self->kind));
    return PyUnicode_FromFormat("<shmipc.abi.Handle %s %p>", shmipcpy_abi_kind_name(self->kind),
                                self->ptr);
}

static PyObject *handle_get_kind(HandleObject *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(shmipcpy_abi_kind_name(self->kind));
}

static PyObject *handle_get_released(HandleObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->released);
}

static PyGetSetDef handle_getset[] = {
    {"kind", (getter)handle_get_kind, NULL, "The handle's kind: 'CONFIG', 'SESSION', ...", NULL},
    {"released", (getter)handle_get_released, NULL,
     "True once passed to a releasing call (or after the callback that lent it).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot handle_slots[] = {
    {Py_tp_dealloc, handle_dealloc},
    {Py_tp_traverse, handle_traverse},
    {Py_tp_repr, handle_repr},
    {Py_tp_getset, handle_getset},
    {Py_tp_doc, "An opaque libshmipc handle of one kind, made by shmipc.abi calls only."},
    {0, NULL},
};

static PyType_Spec handle_spec = {
    .name = "shmipc.abi.Handle",
    .basicsize = sizeof(HandleObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = handle_slots,
};

int shmipcpy_abi_is_handle(PyObject *o)
{
    return Py_TYPE(o)->tp_dealloc == (destructor)handle_dealloc;
}

static PyObject *handle_type_of(PyObject *module)
{
    return PyObject_GetAttrString(module, "AbiHandle");
}

PyObject *shmipcpy_abi_handle_new(PyObject *module, void *ptr, int kind, int owned, PyObject *owner)
{
    PyObject *tp = handle_type_of(module);
    if (tp == NULL)
        return NULL;
    HandleObject *h = PyObject_GC_New(HandleObject, (PyTypeObject *)tp);
    Py_DECREF(tp);
    if (h == NULL)
        return NULL;
    h->ptr = ptr;
    h->kind = kind;
    h->released = 0;
    h->owned = owned;
    h->busy = 0;
    h->pid = shmipcpy_pid;
    h->owner = Py_XNewRef(owner);
    PyObject_GC_Track(h);
    return (PyObject *)h;
}

/* ---------------------------------------------------------------------------------------- */
/* Preparation                                                                              */
/* ---------------------------------------------------------------------------------------- */

static ffi_type *ffi_type_of(int type)
{
    switch (type) {
    case SHMIPC_ABI_VOID:
        return &ffi_type_void;
    case SHMIPC_ABI_I32:
        return &ffi_type_sint;
    case SHMIPC_ABI_U32:
        return &ffi_type_uint32;
    case SHMIPC_ABI_I64:
        return &ffi_type_sint64;
    case SHMIPC_ABI_U64:
        return &ffi_type_uint64;
    case SHMIPC_ABI_SIZE:
    case SHMIPC_ABI_BYTES_LEN:
        return sizeof(size_t) == 8 ? &ffi_type_uint64 : &ffi_type_uint32;
    default:
        return &ffi_type_pointer;
    }
}

static int prep(const shmipc_abi_fn *d, ffi_cif *cif, ffi_type **types)
{
    if (d->nparams > ABI_MAX_PARAMS)
        return 0;
    for (int i = 0; i < d->nparams; i++)
        types[i] = ffi_type_of(d->params[i].type);
    return ffi_prep_cif(cif, FFI_DEFAULT_ABI, (unsigned)d->nparams, ffi_type_of(d->ret.type),
                        types) == FFI_OK;
}

static int prepare_all(void)
{
    if (shmipcpy_abi_entries != NULL)
        return 0;
    int n = shmipc_abi_count();
    abi_entry *e = PyMem_RawCalloc((size_t)(n > 0 ? n : 1), sizeof *e);
    if (e == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < n; i++) {
        e[i].d = shmipc_abi_get(i);
        if (e[i].d != NULL && (e[i].d->flags & SHMIPC_ABI_GENERIC))
            e[i].ok = prep(e[i].d, &e[i].cif, e[i].types);
    }
    static const int cb_kinds[] = {SHMIPC_ABI_KIND_STREAM_CB, SHMIPC_ABI_KIND_DESTROY_CB,
                                   SHMIPC_ABI_KIND_LOG_SINK, SHMIPC_ABI_KIND_HTTP_HANDLER};
    for (size_t k = 0; k < sizeof cb_kinds / sizeof cb_kinds[0]; k++) {
        const shmipc_abi_fn *d = shmipc_abi_callback(cb_kinds[k]);
        if (d == NULL)
            continue;
        abi_cb_entry *c = &cb_entries[ncb_entries++];
        c->d = d;
        c->ok = prep(d, &c->cif, c->types);
    }
    shmipcpy_abi_nentries = n;
    shmipcpy_abi_entries = e;
    return 0;
}

abi_entry *shmipcpy_abi_find_entry(const char *name)
{
    for (int i = 0; i < shmipcpy_abi_nentries; i++)
        if (shmipcpy_abi_entries[i].d != NULL && strcmp(shmipcpy_abi_entries[i].d->name, name) == 0)
            return &shmipcpy_abi_entries[i];
    return NULL;
}

static abi_cb_entry *find_cb(int kind)
{
    const shmipc_abi_fn *d = shmipc_abi_callback(kind);
    for (int i = 0; i < ncb_entries; i++)
        if (cb_entries[i].d == d)
            return cb_entries[i].ok ? &cb_entries[i] : NULL;
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Closures                                                                                 */
/* ---------------------------------------------------------------------------------------- */

void shmipcpy_abi_closure_free(closure_state *c)
{
    if (c == NULL)
        return;
    if (c->closure != NULL)
        ffi_closure_free(c->closure);
    Py_XDECREF(c->callable);
    Py_XDECREF(c->module);
    PyMem_RawFree(c);
}

static void closure_handler(ffi_cif *cif, void *ret, void **args, void *user)
{
    (void)cif;
    closure_state *c = user;
    const shmipc_abi_fn *d = c->cb->d;
    PyGILState_STATE g = PyGILState_Ensure();
    /* The callable may free `c` (a log sink that clears itself): nothing reads it after. */
    PyObject *callable = Py_NewRef(c->callable);
    PyObject *lent[ABI_MAX_PARAMS];
    int nlent = 0;
    long result = 0;
    PyObject *pargs = PyTuple_New(0);
    PyObject *list = PyList_New(0);
    if (pargs == NULL || list == NULL)
        goto fail;
    for (int i = 0; i < d->nparams; i++) {
        const shmipc_abi_param *p = &d->params[i];
        PyObject *v = NULL;
        switch (p->type) {
        case SHMIPC_ABI_I32:
            v = PyLong_FromLong(*(int *)args[i]);
            break;
        case SHMIPC_ABI_CSTR: {
            const char *s = *(const char **)args[i];
            v = s ? PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "surrogateescape")
                  : Py_NewRef(Py_None);
            break;
        }
        case SHMIPC_ABI_HANDLE:
            v = shmipcpy_abi_handle_new(c->module, *(void **)args[i], p->kind, 0, NULL);
            if (v != NULL)
                lent[nlent++] = Py_NewRef(v);
            break;
        case SHMIPC_ABI_USER_DATA:
            continue; /* the binding's own state */
        default:
            v = Py_NewRef(Py_None);
        }
        if (v == NULL || PyList_Append(list, v) < 0) {
            Py_XDECREF(v);
            goto fail;
        }
        Py_DECREF(v);
    }
    Py_DECREF(pargs);
    pargs = PyList_AsTuple(list);
    if (pargs == NULL)
        goto fail;
    {
        PyObject *r = PyObject_Call(callable, pargs, NULL);
        if (r == NULL)
            goto fail;
        if (d->ret.type == SHMIPC_ABI_I32 && r != Py_None) {
            result = PyLong_AsLong(r);
            if (result == -1 && PyErr_Occurred()) {
                Py_DECREF(r);
                goto fail;
            }
        }
        Py_DECREF(r);
    }
    goto done;
fail:
    PyErr_WriteUnraisable(callable);
    result = SHMIPC_EINVAL;
done:
    for (int i = 0; i < nlent; i++) { /* a lent handle is only valid during the callback */
        ((HandleObject *)lent[i])->released = 1;
        ((HandleObject *)lent[i])->ptr = NULL;
        Py_DECREF(lent[i]);
    }
    Py_XDECREF(pargs);
    Py_XDECREF(list);
    Py_DECREF(callable);
    if (d->ret.type == SHMIPC_ABI_I32)
        *(ffi_sarg *)ret = (ffi_sarg)(int)result;
    PyGILState_Release(g);
}

closure_state *shmipcpy_abi_closure_new(PyObject *module, int kind, PyObject *callable)
{
    abi_cb_entry *cb = find_cb(kind);
    if (cb == NULL) {
        PyErr_Format(PyExc_NotImplementedError, "callback kind %s has no descriptor",
                     shmipcpy_abi_kind_name(kind));
        return NULL;
    }
    closure_state *c = PyMem_RawCalloc(1, sizeof *c);
    if (c == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    c->closure = ffi_closure_alloc(sizeof(ffi_closure), &c->code);
    if (c->closure == NULL) {
        PyMem_RawFree(c);
        PyErr_NoMemory();
        return NULL;
    }
    c->callable = Py_NewRef(callable);
    c->module = Py_NewRef(module);
    c->cb = cb;
    if (ffi_prep_closure_loc(c->closure, &cb->cif, closure_handler, c, c->code) != FFI_OK) {
        shmipcpy_abi_closure_free(c);
        PyErr_SetString(PyExc_RuntimeError, "ffi_prep_closure_loc failed");
        return NULL;
    }
    return c;
}

/* The log sink: one process-wide registration, replaced by the next shmipc_set_log_sink. */
closure_state *shmipcpy_abi_log_sink_closure;

static void registration_free(registration *r)
{
    for (int i = 0; i < r->n; i++)
        shmipcpy_abi_closure_free(r->c[i]);
    PyMem_RawFree(r);
}

void shmipcpy_abi_registration_destroy(void *user_data)
{
    PyGILState_STATE g = PyGILState_Ensure();
    registration_free(user_data);
    PyGILState_Release(g);
}

static PyMethodDef abi_methods[] = {
    {"_abi_call", (PyCFunction)(void (*)(void))shmipcpy_abi_call, METH_FASTCALL,
     "_abi_call(name, *args)\n\nCall a GENERIC ABI table entry; see shmipc.abi.call."},
    {"_abi_describe", shmipcpy_abi_describe, METH_O,
     "_abi_describe(name) -> (flags, ret, params)\n\nThe table row of a function."},
    {"_abi_names", shmipcpy_abi_names, METH_NOARGS,
     "_abi_names() -> list[str]\n\nEvery table entry."},
    {NULL, NULL, 0, NULL},
};

int shmipcpy_abi_exec(PyObject *module)
{
    if (prepare_all() < 0)
        return -1;
    PyObject *tp = PyType_FromModuleAndSpec(module, &handle_spec, NULL);
    if (tp == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(module, "AbiHandle", tp);
    Py_DECREF(tp);
    if (rc < 0)
        return -1;
    return PyModule_AddFunctions(module, abi_methods);
}
