/*
 * The binding hub: the descriptor table of every exported function (bindings/abi.def) as the
 * library hands it to language bindings, and the log sink, the one callback of the ABI
 * without a user-data pointer (bindings reach it through a libffi closure).
 */
#include "shmipc.h"
#include "shmipc_abi.h"
#include "shmipc_serve.h"

#include "common/log.h"

#include <string.h>

/* The table describes every exported function, the deprecated ones too (CHANGELOG.md). */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* Short names for the flags column of abi.def. */
#define GENERIC SHMIPC_ABI_GENERIC
#define BLOCKS  SHMIPC_ABI_BLOCKS

/*
 * First pass: the compiler checks each row's C types against the declaration in shmipc.h,
 * so a row cannot describe a call the function does not take. (Unqualified parameter types
 * compare as the C rules say; a missing const on a pointee, a wrong width, a wrong count all
 * fail here.)
 */
#define R(type, kind, ctype)       ctype
#define P(type, kind, ctype, name) ctype
#define FN(name, flags, ret, ...)                                                                  \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&name), ret (*)(__VA_ARGS__)),          \
                   "abi.def: the row of " #name " differs from its declaration in shmipc.h");
#define FN0(name, flags, ret)                                                                      \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&name), ret (*)(void)),                 \
                   "abi.def: the row of " #name " differs from its declaration in shmipc.h");
#define CB(kind, tname, ret, ...)                                                                  \
    _Static_assert(__builtin_types_compatible_p(tname, ret(*)(__VA_ARGS__)),                       \
                   "abi.def: the row of " #tname " differs from its typedef in shmipc.h");
#include "abi.def"
#undef R
#undef P
#undef FN
#undef FN0
#undef CB

/* Second pass: the parameter arrays, named after their function or callback type. */
#define PARAM(t, k, n, c)                                                                          \
    ((shmipc_abi_param){.type = SHMIPC_ABI_##t, .kind = SHMIPC_ABI_KIND_##k, .name = n, .ctype = c})
#define R(type, kind, ctype)       PARAM(type, kind, "", #ctype)
#define P(type, kind, ctype, name) PARAM(type, kind, #name, #ctype)
#define FN(name, flags, ret, ...)  static const shmipc_abi_param params_##name[] = {__VA_ARGS__};
#define FN0(name, flags, ret)
#define CB(kind, tname, ret, ...) static const shmipc_abi_param params_##tname[] = {__VA_ARGS__};
#include "abi.def"
#undef FN
#undef FN0
#undef CB

#define NPARAMS(array) ((int)(sizeof(array) / sizeof((array)[0])))

/* Third pass: the functions. `void (*)(void)` is the generic function pointer type of C. */
#define FN(name, flags, ret, ...)                                                                  \
    {sizeof(shmipc_abi_fn),  #name,        (void (*)(void))name, (flags), ret,                     \
     NPARAMS(params_##name), params_##name},
#define FN0(name, flags, ret)                                                                      \
    {sizeof(shmipc_abi_fn), #name, (void (*)(void))name, (flags), ret, 0, NULL},
#define CB(kind, tname, ret, ...)
static const shmipc_abi_fn functions[] = {
#include "abi.def"
};
#undef FN
#undef FN0
#undef CB

/* Fourth pass: the callback types, with their kind. */
struct callback_type {
    int kind;
    shmipc_abi_fn desc;
};

#define FN(name, flags, ret, ...)
#define FN0(name, flags, ret)
#define CB(kind, tname, ret, ...)                                                                  \
    {SHMIPC_ABI_KIND_##kind,                                                                       \
     {sizeof(shmipc_abi_fn), #tname, NULL, SHMIPC_ABI_GENERIC, ret, NPARAMS(params_##tname),       \
      params_##tname}},
static const struct callback_type callbacks[] = {
#include "abi.def"
};
#undef FN
#undef FN0
#undef CB
#undef R
#undef P
#undef PARAM

SHMIPC_API int shmipc_abi_count(void)
{
    return NPARAMS(functions);
}

SHMIPC_API const shmipc_abi_fn *shmipc_abi_get(int i)
{
    return i >= 0 && i < NPARAMS(functions) ? &functions[i] : NULL;
}

SHMIPC_API const shmipc_abi_fn *shmipc_abi_find(const char *name)
{
    if (name == NULL)
        return NULL;
    for (int i = 0; i < NPARAMS(functions); i++)
        if (strcmp(functions[i].name, name) == 0)
            return &functions[i];
    return NULL;
}

SHMIPC_API const shmipc_abi_fn *shmipc_abi_callback(int kind)
{
    for (int i = 0; i < NPARAMS(callbacks); i++)
        if (callbacks[i].kind == kind)
            return &callbacks[i].desc;
    return NULL;
}

SHMIPC_API void shmipc_set_log_sink(shmipc_log_sink sink)
{
    shmipc__log_set_sink(sink);
}
