/*
 * shmipcpy_abi_call.c - shmipc.abi's functions: _abi_call (check every argument against the
 * descriptor, then call the entry through its prepared cif, with the GIL released for BLOCKS
 * shmipcpy_abi_entries), _abi_describe and _abi_names.
 *
 * Owns: the argument conversion (Python -> C and the result back).
 * May call: the public C API through libffi, module.h's helpers and abi.c's handles, cifs and
 * closures (abi.h).
 */
#include "abi.h"

#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Calls                                                                                    */
/* ---------------------------------------------------------------------------------------- */

typedef union {
    int i32;
    uint32_t u32;
    int64_t i64;
    uint64_t u64;
    size_t size;
    void *ptr;
} abi_value;

/* Does parameter i take a Python argument? */
static int takes_arg(const shmipc_abi_fn *d, int i)
{
    switch (d->params[i].type) {
    case SHMIPC_ABI_I32:
    case SHMIPC_ABI_U32:
    case SHMIPC_ABI_I64:
    case SHMIPC_ABI_U64:
    case SHMIPC_ABI_SIZE:
    case SHMIPC_ABI_CSTR:
    case SHMIPC_ABI_HANDLE:
    case SHMIPC_ABI_RELEASE:
    case SHMIPC_ABI_BYTES_IN:
        return 1;
    case SHMIPC_ABI_CALLBACK:
        /* with user data, the binding supplies the destroy callback itself */
        for (int k = 0; k < d->nparams; k++)
            if (d->params[k].type == SHMIPC_ABI_USER_DATA)
                return d->params[i].kind != SHMIPC_ABI_KIND_DESTROY_CB;
        return 1;
    default:
        return 0;
    }
}

static int has_user_data(const shmipc_abi_fn *d)
{
    for (int k = 0; k < d->nparams; k++)
        if (d->params[k].type == SHMIPC_ABI_USER_DATA)
            return 1;
    return 0;
}

static int int_arg(const shmipc_abi_fn *d, int i, PyObject *o, int type, abi_value *v)
{
    const char *pname = d->params[i].name;
    if (!PyLong_Check(o) || PyBool_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s(): %s must be int, not %.100s", d->name, pname,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    if (type == SHMIPC_ABI_I32 || type == SHMIPC_ABI_I64) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (x == -1 && PyErr_Occurred())
            return -1;
        if (overflow || (type == SHMIPC_ABI_I32 && (x < INT32_MIN || x > INT32_MAX))) {
            PyErr_Format(PyExc_OverflowError, "%s(): %s out of range for %s", d->name, pname,
                         d->params[i].ctype);
            return -1;
        }
        if (type == SHMIPC_ABI_I32)
            v->i32 = (int)x;
        else
            v->i64 = (int64_t)x;
        return 0;
    }
    int sign = 0;
    long long as_signed = PyLong_AsLongLongAndOverflow(o, &sign);
    if (as_signed == -1 && PyErr_Occurred())
        return -1;
    if (sign < 0 || (sign == 0 && as_signed < 0)) {
        PyErr_Format(PyExc_OverflowError, "%s(): %s must not be negative", d->name, pname);
        return -1;
    }
    unsigned long long x = PyLong_AsUnsignedLongLong(o);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        x = 0;
        goto range;
    }
    if (type == SHMIPC_ABI_U32) {
        if (x > UINT32_MAX)
            goto range;
        v->u32 = (uint32_t)x;
    } else if (type == SHMIPC_ABI_SIZE) {
        if (x > SIZE_MAX)
            goto range;
        v->size = (size_t)x;
    } else {
        v->u64 = (uint64_t)x;
    }
    return 0;
range:
    PyErr_Format(PyExc_OverflowError, "%s(): %s out of range for %s", d->name, pname,
                 d->params[i].ctype);
    return -1;
}

static PyObject *ret_value(const shmipc_abi_fn *d, abi_value *r, size_t chars_len)
{
    switch (d->ret.type) {
    case SHMIPC_ABI_VOID:
        Py_RETURN_NONE;
    case SHMIPC_ABI_I32:
        return PyLong_FromLong(r->i32);
    case SHMIPC_ABI_U32:
        return PyLong_FromUnsignedLong(r->u32);
    case SHMIPC_ABI_I64:
        return PyLong_FromLongLong(r->i64);
    case SHMIPC_ABI_U64:
        return PyLong_FromUnsignedLongLong(r->u64);
    case SHMIPC_ABI_SIZE:
        return PyLong_FromSize_t(r->size);
    case SHMIPC_ABI_CSTR:
        if (r->ptr == NULL)
            Py_RETURN_NONE;
        return PyUnicode_DecodeUTF8(r->ptr, (Py_ssize_t)strlen(r->ptr), "surrogateescape");
    case SHMIPC_ABI_CHARS:
        if (r->ptr == NULL)
            Py_RETURN_NONE;
        return PyBytes_FromStringAndSize(r->ptr, (Py_ssize_t)chars_len);
    default:
        Py_RETURN_NONE;
    }
}

PyObject *shmipcpy_abi_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "call(name, *args): name must be a str");
        return NULL;
    }
    const char *name = PyUnicode_AsUTF8(args[0]);
    if (name == NULL)
        return NULL;
    abi_entry *e = shmipcpy_abi_find_entry(name);
    if (e == NULL) {
        PyErr_Format(PyExc_AttributeError, "shmipc.abi has no function %R", args[0]);
        return NULL;
    }
    const shmipc_abi_fn *d = e->d;
    if (!(d->flags & SHMIPC_ABI_GENERIC) || !e->ok) {
        PyErr_Format(PyExc_NotImplementedError,
                     "%s is not GENERIC in the ABI table: it cannot be called through shmipc.abi",
                     d->name);
        return NULL;
    }
    args++;
    nargs--;
    int expected = 0;
    for (int i = 0; i < d->nparams; i++)
        expected += takes_arg(d, i);
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s() takes %d argument%s (%zd given)", d->name, expected,
                     expected == 1 ? "" : "s", nargs);
        return NULL;
    }

    abi_value vals[ABI_MAX_PARAMS], outs[ABI_MAX_PARAMS];
    void *argp[ABI_MAX_PARAMS];
    Py_buffer bufs[ABI_MAX_PARAMS];
    int nbufs = 0;
    PyObject *tmp[ABI_MAX_PARAMS]; /* encoded strings */
    int ntmp = 0;
    closure_state *closures[ABI_MAX_PARAMS];
    int nclosures = 0;
    HandleObject *busy[ABI_MAX_PARAMS];
    int nbusy = 0;
    PyObject *owner = NULL; /* the first handle argument: owner of new handles */
    PyObject *result = NULL, *list = NULL;
    int blocks = (d->flags & SHMIPC_ABI_BLOCKS) != 0;
    int replaces_log_sink = 0;
    closure_state *new_sink = NULL;
    memset(vals, 0, sizeof vals);
    memset(outs, 0, sizeof outs);

    /* 1. check and convert every argument; nothing reaches C before all are good */
    Py_ssize_t a = 0;
    for (int i = 0; i < d->nparams; i++) {
        const shmipc_abi_param *p = &d->params[i];
        argp[i] = &vals[i];
        if (!takes_arg(d, i))
            continue;
        PyObject *o = args[a++];
        switch (p->type) {
        case SHMIPC_ABI_I32:
        case SHMIPC_ABI_U32:
        case SHMIPC_ABI_I64:
        case SHMIPC_ABI_U64:
        case SHMIPC_ABI_SIZE:
            if (int_arg(d, i, o, p->type, &vals[i]) < 0)
                goto fail;
            break;
        case SHMIPC_ABI_CSTR: {
            const char *s;
            Py_ssize_t len;
            if (o == Py_None) {
                vals[i].ptr = NULL;
                break;
            }
            if (PyUnicode_Check(o)) {
                s = PyUnicode_AsUTF8AndSize(o, &len);
                if (s == NULL)
                    goto fail;
            } else if (PyBytes_Check(o)) {
                s = PyBytes_AS_STRING(o);
                len = PyBytes_GET_SIZE(o);
            } else {
                PyErr_Format(PyExc_TypeError, "%s(): %s must be str, bytes or None, not %.100s",
                             d->name, p->name, Py_TYPE(o)->tp_name);
                goto fail;
            }
            if (memchr(s, '\0', (size_t)len) != NULL) {
                PyErr_Format(PyExc_ValueError, "%s(): %s contains a NUL character", d->name,
                             p->name);
                goto fail;
            }
            tmp[ntmp++] = Py_NewRef(o);
            vals[i].ptr = (void *)s;
            break;
        }
        case SHMIPC_ABI_HANDLE:
        case SHMIPC_ABI_RELEASE: {
            if (o == Py_None) {
                vals[i].ptr = NULL;
                break;
            }
            if (!shmipcpy_abi_is_handle(o)) {
                PyErr_Format(PyExc_TypeError,
                             "%s(): %s must be a shmipc.abi.Handle of kind %s, "
                             "not %.100s",
                             d->name, p->name, shmipcpy_abi_kind_name(p->kind),
                             Py_TYPE(o)->tp_name);
                goto fail;
            }
            HandleObject *h = (HandleObject *)o;
            if (h->kind != p->kind) {
                PyErr_Format(PyExc_TypeError, "%s(): %s must be a %s handle, not a %s handle",
                             d->name, p->name, shmipcpy_abi_kind_name(p->kind),
                             shmipcpy_abi_kind_name(h->kind));
                goto fail;
            }
            if (h->released == ABI_RELEASING) {
                PyErr_Format(PyExc_RuntimeError, "%s(): %s: the %s handle is being released",
                             d->name, p->name, shmipcpy_abi_kind_name(h->kind));
                goto fail;
            }
            if (h->released) {
                PyErr_Format(PyExc_ValueError, "%s(): %s: the %s handle was released", d->name,
                             p->name, shmipcpy_abi_kind_name(h->kind));
                goto fail;
            }
            if (p->type == SHMIPC_ABI_RELEASE && h->busy) {
                PyErr_Format(PyExc_RuntimeError, "%s(): %s is in use by another thread", d->name,
                             p->name);
                goto fail;
            }
            for (int k = 0; k < i; k++) { /* a handle released and also used in one call */
                int tk = d->params[k].type;
                if ((tk == SHMIPC_ABI_HANDLE || tk == SHMIPC_ABI_RELEASE) &&
                    (tk == SHMIPC_ABI_RELEASE || p->type == SHMIPC_ABI_RELEASE) &&
                    vals[k].ptr == h->ptr) {
                    PyErr_Format(PyExc_ValueError, "%s(): a released handle is passed twice",
                                 d->name);
                    goto fail;
                }
            }
            vals[i].ptr = h->ptr;
            if (owner == NULL && p->type == SHMIPC_ABI_HANDLE)
                owner = o;
            break;
        }
        case SHMIPC_ABI_BYTES_IN:
            if (PyObject_GetBuffer(o, &bufs[nbufs], PyBUF_SIMPLE) < 0) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "%s(): %s must be a bytes-like object, not %.100s",
                             d->name, p->name, Py_TYPE(o)->tp_name);
                goto fail;
            }
            vals[i].ptr = bufs[nbufs].buf;
            if (i + 1 < d->nparams && d->params[i + 1].type == SHMIPC_ABI_BYTES_LEN)
                vals[i + 1].size = (size_t)bufs[nbufs].len;
            nbufs++;
            break;
        case SHMIPC_ABI_CALLBACK:
            if (o == Py_None) {
                vals[i].ptr = NULL;
            } else if (!PyCallable_Check(o)) {
                PyErr_Format(PyExc_TypeError, "%s(): %s must be callable or None, not %.100s",
                             d->name, p->name, Py_TYPE(o)->tp_name);
                goto fail;
            } else {
                closure_state *c = shmipcpy_abi_closure_new(module, p->kind, o);
                if (c == NULL)
                    goto fail;
                closures[nclosures++] = c;
                vals[i].ptr = c->code;
            }
            if (p->kind == SHMIPC_ABI_KIND_LOG_SINK) {
                replaces_log_sink = 1;
                new_sink = nclosures > 0 && vals[i].ptr != NULL ? closures[nclosures - 1] : NULL;
            }
            break;
        default:
            break;
        }
    }

    /* 2. storage for out-parameters, user data, destroy */
    registration *reg = NULL;
    if (has_user_data(d)) {
        reg = PyMem_RawCalloc(1, sizeof *reg);
        if (reg == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        for (int k = 0; k < nclosures; k++)
            reg->c[reg->n++] = closures[k];
        nclosures = 0; /* owned by the registration now */
    }
    for (int i = 0; i < d->nparams; i++) {
        const shmipc_abi_param *p = &d->params[i];
        switch (p->type) {
        case SHMIPC_ABI_OUT_HANDLE:
        case SHMIPC_ABI_OUT_CPTR:
        case SHMIPC_ABI_OUT_CPTR_N:
        case SHMIPC_ABI_OUT_WPTR_N:
        case SHMIPC_ABI_OUT_CHARS:
        case SHMIPC_ABI_OUT_LEN:
        case SHMIPC_ABI_OUT_I32:
        case SHMIPC_ABI_OUT_U32:
        case SHMIPC_ABI_OUT_I64:
        case SHMIPC_ABI_OUT_U64:
        case SHMIPC_ABI_OUT_SIZE:
            vals[i].ptr = &outs[i];
            break;
        case SHMIPC_ABI_USER_DATA:
            vals[i].ptr = reg;
            break;
        case SHMIPC_ABI_CALLBACK:
            if (reg != NULL && p->kind == SHMIPC_ABI_KIND_DESTROY_CB)
                vals[i].ptr = (void *)shmipcpy_abi_registration_destroy;
            break;
        default:
            break;
        }
    }

    /* 3. the call. A released handle is marked before it: a blocking call lets other threads
     * (and the callbacks it waits for) run, and none of them may use or release it again. */
    a = 0;
    /* Step 2's conversions may run code of the caller's (a buffer export of Python 3.12's
     * __buffer__, a C type's) that releases a handle checked in step 1: checked again here,
     * with nothing between this check and the marks and the call. */
    for (int i = 0; i < d->nparams; i++) {
        if (!takes_arg(d, i))
            continue;
        PyObject *o = args[a++];
        int t = d->params[i].type;
        if ((t != SHMIPC_ABI_HANDLE && t != SHMIPC_ABI_RELEASE) || o == Py_None)
            continue;
        HandleObject *h = (HandleObject *)o;
        if (h->released || (t == SHMIPC_ABI_RELEASE && h->busy)) {
            PyErr_Format(PyExc_RuntimeError,
                         "%s(): %s was released or taken by another call while the arguments "
                         "were converted",
                         d->name, d->params[i].name);
            goto fail;
        }
    }
    a = 0;
    for (int i = 0; i < d->nparams; i++) {
        if (!takes_arg(d, i))
            continue;
        PyObject *o = args[a++];
        if (d->params[i].type == SHMIPC_ABI_RELEASE && o != Py_None)
            ((HandleObject *)o)->released = ABI_RELEASING;
    }
    abi_value rv;
    ffi_arg rraw = 0;
    memset(&rv, 0, sizeof rv);
    void *rslot = &rv;
    if (d->ret.type == SHMIPC_ABI_I32 || d->ret.type == SHMIPC_ABI_U32)
        rslot = &rraw; /* small integers come back widened to ffi_arg */
    if (blocks) {
        a = 0;
        for (int i = 0; i < d->nparams; i++) {
            if (!takes_arg(d, i))
                continue;
            PyObject *o = args[a++];
            if (d->params[i].type == SHMIPC_ABI_HANDLE && o != Py_None) {
                busy[nbusy] = (HandleObject *)o;
                busy[nbusy++]->busy++;
            }
        }
        Py_BEGIN_ALLOW_THREADS ffi_call(&e->cif, d->fn, rslot, argp);
        Py_END_ALLOW_THREADS for (int k = 0; k < nbusy; k++) busy[k]->busy--;
    } else {
        ffi_call(&e->cif, d->fn, rslot, argp);
    }
    if (d->ret.type == SHMIPC_ABI_I32)
        rv.i32 = (int)rraw;
    else if (d->ret.type == SHMIPC_ABI_U32)
        rv.u32 = (uint32_t)rraw;

    /* 4. after the call: releases, closures, results */
    a = 0;
    for (int i = 0; i < d->nparams; i++) {
        if (!takes_arg(d, i))
            continue;
        PyObject *o = args[a++];
        if (d->params[i].type == SHMIPC_ABI_RELEASE && o != Py_None) {
            ((HandleObject *)o)->released = 1;
            ((HandleObject *)o)->ptr = NULL;
        }
    }
    if (replaces_log_sink) { /* the old sink no longer runs once set_log_sink returned */
        shmipcpy_abi_closure_free(shmipcpy_abi_log_sink_closure);
        shmipcpy_abi_log_sink_closure = new_sink;
        for (int k = 0; k < nclosures; k++)
            if (closures[k] == new_sink)
                closures[k] = NULL;
    }
    for (int k = 0; k < nclosures; k++)
        shmipcpy_abi_closure_free(closures[k]);
    nclosures = 0;
    /* a registration's closures belong to the library now: it calls destroy exactly once */

    int failed = d->ret.type == SHMIPC_ABI_I32 && rv.i32 < 0;
    size_t chars_len = 0;
    for (int i = 0; i < d->nparams; i++)
        if (d->params[i].type == SHMIPC_ABI_OUT_LEN &&
            !(i > 0 && (d->params[i - 1].type == SHMIPC_ABI_OUT_CPTR ||
                        d->params[i - 1].type == SHMIPC_ABI_OUT_CHARS)))
            chars_len = outs[i].size;
    PyObject *r = ret_value(d, &rv, chars_len);
    if (r == NULL)
        goto fail_after;
    list = PyList_New(0);
    if (list == NULL || PyList_Append(list, r) < 0) {
        Py_DECREF(r);
        goto fail_after;
    }
    Py_DECREF(r);
    int nouts = 0;
    for (int i = 0; i < d->nparams; i++) {
        const shmipc_abi_param *p = &d->params[i];
        PyObject *v = NULL;
        switch (p->type) {
        case SHMIPC_ABI_OUT_HANDLE:
            if (failed || outs[i].ptr == NULL)
                v = Py_NewRef(Py_None);
            else
                v = shmipcpy_abi_handle_new(module, outs[i].ptr, p->kind, 1, owner);
            break;
        case SHMIPC_ABI_OUT_CPTR:
        case SHMIPC_ABI_OUT_CHARS: {
            size_t n = i + 1 < d->nparams ? outs[i + 1].size : 0;
            v = failed || outs[i].ptr == NULL
                    ? Py_NewRef(Py_None)
                    : PyBytes_FromStringAndSize(outs[i].ptr, (Py_ssize_t)n);
            break;
        }
        case SHMIPC_ABI_OUT_CPTR_N: {
            size_t n = i > 0 ? vals[i - 1].size : 0;
            v = failed || outs[i].ptr == NULL
                    ? Py_NewRef(Py_None)
                    : PyBytes_FromStringAndSize(outs[i].ptr, (Py_ssize_t)n);
            break;
        }
        case SHMIPC_ABI_OUT_WPTR_N:
            v = failed || outs[i].ptr == NULL ? Py_NewRef(Py_None)
                                              : PyLong_FromVoidPtr(outs[i].ptr);
            break;
        case SHMIPC_ABI_OUT_LEN:
            if (i > 0 && (d->params[i - 1].type == SHMIPC_ABI_OUT_CPTR ||
                          d->params[i - 1].type == SHMIPC_ABI_OUT_CHARS))
                continue; /* folded into the bytes */
            if (d->ret.type == SHMIPC_ABI_CHARS)
                continue; /* folded into the returned bytes */
            v = PyLong_FromSize_t(outs[i].size);
            break;
        case SHMIPC_ABI_OUT_I32:
            v = PyLong_FromLong(outs[i].i32);
            break;
        case SHMIPC_ABI_OUT_U32:
            v = PyLong_FromUnsignedLong(outs[i].u32);
            break;
        case SHMIPC_ABI_OUT_I64:
            v = PyLong_FromLongLong(outs[i].i64);
            break;
        case SHMIPC_ABI_OUT_U64:
            v = PyLong_FromUnsignedLongLong(outs[i].u64);
            break;
        case SHMIPC_ABI_OUT_SIZE:
            v = PyLong_FromSize_t(outs[i].size);
            break;
        default:
            continue;
        }
        if (v == NULL || PyList_Append(list, v) < 0) {
            Py_XDECREF(v);
            goto fail_after;
        }
        Py_DECREF(v);
        nouts++;
    }
    if (nouts == 0)
        result = Py_NewRef(PyList_GET_ITEM(list, 0));
    else
        result = PyList_AsTuple(list);
fail_after:
    Py_XDECREF(list);
    goto cleanup;
fail:
    for (int k = 0; k < nclosures; k++)
        shmipcpy_abi_closure_free(closures[k]);
cleanup:
    for (int k = 0; k < nbufs; k++)
        PyBuffer_Release(&bufs[k]);
    for (int k = 0; k < ntmp; k++)
        Py_DECREF(tmp[k]);
    return result;
}

/* describe(name) -> (flags, (ret type, kind, ctype), ((type, kind, ctype, name), ...)) */
static PyObject *param_tuple(const shmipc_abi_param *p)
{
    return Py_BuildValue("(iiss)", p->type, p->kind, p->ctype ? p->ctype : "",
                         p->name ? p->name : "");
}

PyObject *shmipcpy_abi_describe(PyObject *module, PyObject *arg)
{
    (void)module;
    const char *name = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
    if (name == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "describe(name): name must be a str");
        return NULL;
    }
    abi_entry *e = shmipcpy_abi_find_entry(name);
    if (e == NULL) {
        PyErr_Format(PyExc_AttributeError, "shmipc.abi has no function %R", arg);
        return NULL;
    }
    const shmipc_abi_fn *d = e->d;
    PyObject *params = PyTuple_New(d->nparams);
    if (params == NULL)
        return NULL;
    for (int i = 0; i < d->nparams; i++) {
        PyObject *t = param_tuple(&d->params[i]);
        if (t == NULL) {
            Py_DECREF(params);
            return NULL;
        }
        PyTuple_SET_ITEM(params, i, t);
    }
    PyObject *ret = param_tuple(&d->ret);
    if (ret == NULL) {
        Py_DECREF(params);
        return NULL;
    }
    return Py_BuildValue("(INN)", d->flags, ret, params);
}

PyObject *shmipcpy_abi_names(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    for (int i = 0; i < shmipcpy_abi_nentries; i++) {
        if (shmipcpy_abi_entries[i].d == NULL)
            continue;
        PyObject *s = PyUnicode_FromString(shmipcpy_abi_entries[i].d->name);
        if (s == NULL || PyList_Append(list, s) < 0) {
            Py_XDECREF(s);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(s);
    }
    return list;
}
