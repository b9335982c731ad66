/*
 * abi.h - what abi.c and abi_call.c (shmipc.abi) share: the prepared cifs of the descriptor
 * table, the AbiHandle layout and the libffi closures. Private to those two files; it needs
 * libffi, which the rest of the module does not.
 */
#ifndef SHMIPC_PY_ABI_H
#define SHMIPC_PY_ABI_H

#include "module.h"

#include <shmipc_abi.h>

#include <ffi.h>

#define ABI_MAX_PARAMS 16

typedef struct {
    const shmipc_abi_fn *d;
    ffi_cif cif;
    ffi_type *types[ABI_MAX_PARAMS];
    int ok;
} abi_entry;

typedef struct {
    const shmipc_abi_fn *d; /* the callback descriptor */
    ffi_cif cif;
    ffi_type *types[ABI_MAX_PARAMS];
    int ok;
} abi_cb_entry;
/* HandleObject.released while the call it was passed to as RELEASE runs: a callback or
 * another thread may try to use it meanwhile, and is refused (RuntimeError). */
#define ABI_RELEASING 2

typedef struct {
    PyObject_HEAD void *ptr;
    int kind;
    int released;    /* passed to a RELEASE parameter, or a callback's handle after the callback;
                        ABI_RELEASING while the releasing call runs */
    int owned;       /* freed with its destructor when collected unreleased */
    int busy;        /* threads inside a BLOCKS call with this handle */
    pid_t pid;       /* the process that made it: a fork child never frees it (module.h) */
    PyObject *owner; /* a handle this one came from (a stream's session), kept alive */
} HandleObject;

typedef struct {
    ffi_closure *closure;
    void *code;
    PyObject *callable;
    PyObject *module; /* for wrapping handles passed to the callback */
    abi_cb_entry *cb;
} closure_state;

/* A (fn, user_data, destroy) registration: its closures, freed when the library destroys it. */
typedef struct {
    int n;
    closure_state *c[ABI_MAX_PARAMS];
} registration;

/* abi.c */
extern abi_entry *shmipcpy_abi_entries;
extern int shmipcpy_abi_nentries;
const char *shmipcpy_abi_kind_name(int kind);
int shmipcpy_abi_is_handle(PyObject *o);
PyObject *shmipcpy_abi_handle_new(PyObject *module, void *ptr, int kind, int owned,
                                  PyObject *owner);
abi_entry *shmipcpy_abi_find_entry(const char *name);
void shmipcpy_abi_closure_free(closure_state *c);
closure_state *shmipcpy_abi_closure_new(PyObject *module, int kind, PyObject *callable);
extern closure_state *shmipcpy_abi_log_sink_closure;
void shmipcpy_abi_registration_destroy(void *user_data);

/* abi_call.c */
PyObject *shmipcpy_abi_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *shmipcpy_abi_describe(PyObject *module, PyObject *arg);
PyObject *shmipcpy_abi_names(PyObject *module, PyObject *unused);

#endif
