/*
 * int_args.h - "O&" converters for unsigned integer arguments, shared by the shmipc._shmipc
 * and shmipc._serve extensions. PyArg's "K" and "I" formats take any int modulo 2**64 or
 * 2**32 (content_length=2**64 + 5 was encoded as 5; interval_us=2**32 + 100 read as 100);
 * these refuse a negative or too large value (OverflowError) and a non-integer (TypeError).
 */
#ifndef SHMIPC_PY_INT_ARGS_H
#define SHMIPC_PY_INT_ARGS_H

#include <Python.h>
#include <stdint.h>

static inline int shmipcpy_u64_arg(PyObject *o, void *out)
{
    PyObject *i = PyNumber_Index(o);
    if (i == NULL)
        return 0;
    unsigned long long v = PyLong_AsUnsignedLongLong(i);
    Py_DECREF(i);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return 0;
    *(uint64_t *)out = v;
    return 1;
}

static inline int shmipcpy_u32_arg(PyObject *o, void *out)
{
    uint64_t v;
    if (!shmipcpy_u64_arg(o, &v))
        return 0;
    if (v > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "int too large for an unsigned 32-bit field");
        return 0;
    }
    *(uint32_t *)out = (uint32_t)v;
    return 1;
}

#endif
