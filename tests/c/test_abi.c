/*
 * Description: the descriptor table through libffi, as a script binding uses it. Call
 * descriptions are prepared once from shmipc_abi_get(); a small interpreter then calls every
 * GENERIC entry by name with valid and with invalid arguments, marshalled by the table's
 * types alone, and checks the documented results; callbacks come from libffi closures built
 * from shmipc_abi_callback(); the shared library's SONAME and exported table are checked.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <ctype.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <ffi.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "shmipc.h"
#include "shmipc_abi.h"
#include "shmipc_serve.h"
#include "common/log.h"

/* This file calls the deprecated functions on purpose: their old meaning is part of the ABI
 * until they go (CHANGELOG.md). */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#define MAX_PARAMS 16
#define MAX_VARS   48

/* ------------------------------------------------------------------------------------ */
/* Call descriptions, built once from the table                                         */
/* ------------------------------------------------------------------------------------ */

struct call {
    const shmipc_abi_fn *d;
    ffi_cif cif;
    ffi_type *args[MAX_PARAMS];
    int ready; /* GENERIC and prepared */
};

static struct call *calls;
static int ncalls;
static unsigned char *called_valid, *called_invalid;

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
    default: /* every other type is a pointer */
        return &ffi_type_pointer;
    }
}

static int prep_cif(ffi_cif *cif, ffi_type **args, const shmipc_abi_fn *d)
{
    if (d->nparams > MAX_PARAMS)
        return -1;
    for (int i = 0; i < d->nparams; i++)
        args[i] = ffi_type_of(d->params[i].type);
    return ffi_prep_cif(cif, FFI_DEFAULT_ABI, (unsigned)d->nparams, ffi_type_of(d->ret.type),
                        args) == FFI_OK
               ? 0
               : -1;
}

static int is_generic(const shmipc_abi_fn *d)
{
    return (d->flags & SHMIPC_ABI_GENERIC) != 0;
}

static void prepare_calls(void)
{
    ncalls = shmipc_abi_count();
    calls = calloc((size_t)ncalls, sizeof *calls);
    called_valid = calloc((size_t)ncalls, 1);
    called_invalid = calloc((size_t)ncalls, 1);
    assert_non_null(calls);
    for (int i = 0; i < ncalls; i++) {
        calls[i].d = shmipc_abi_get(i);
        assert_non_null(calls[i].d);
        if (is_generic(calls[i].d)) {
            assert_int_equal(prep_cif(&calls[i].cif, calls[i].args, calls[i].d), 0);
            calls[i].ready = 1;
        }
    }
}

static int call_index(const char *name)
{
    const shmipc_abi_fn *d = shmipc_abi_find(name);
    for (int i = 0; d != NULL && i < ncalls; i++)
        if (calls[i].d == d)
            return i;
    return -1;
}

/* ------------------------------------------------------------------------------------ */
/* Callbacks a script can name                                                          */
/* ------------------------------------------------------------------------------------ */

/* What "ud" points to: the registrations' bookkeeping. */
struct user_data {
    int destroyed;
    int handled;
    int sink_lines;
    int pending_ends;    /* on_end of a deferred answer: how many ran */
    int pending_reasons; /* their reasons, each as a bit */
    char err[768];
};
static struct user_data ud;

static void cb_on_stream(shmipc_stream *st, void *user_data)
{
    (void)user_data;
    shmipc_stream_close(st);
}

static void cb_on_data(shmipc_stream *st, void *user_data)
{
    (void)st;
    (void)user_data;
}

static void cb_destroy(void *user_data)
{
    if (user_data != NULL)
        __atomic_add_fetch(&((struct user_data *)user_data)->destroyed, 1, __ATOMIC_RELAXED);
}

static void cb_sink(int level, const char *line)
{
    (void)level;
    (void)line;
    __atomic_add_fetch(&ud.sink_lines, 1, __ATOMIC_RELAXED);
}

static int cb_handler(shmipc_http_request *req, shmipc_http_response *res, void *user_data);
static int cb_defer_handler(shmipc_http_request *req, shmipc_http_response *res, void *user_data);
static void cb_pending_end(void *user_data, int reason);
static int cb_ws_open(shmipc_ws *ws, const shmipc_http_request *req, void *user_data);
static void cb_ws_message(shmipc_ws *ws, int kind, const void *data, size_t len, void *user_data);
static void cb_ws_close(shmipc_ws *ws, int code, const char *reason, size_t len, void *user_data);
static int cb_serve_handler(shmipc_serve_exchange *x, void *user_data);
static int cb_serve_ws_handler(shmipc_serve_exchange *x, void *user_data);

static const struct {
    const char *name;
    int kind;
    void (*fn)(void);
} callback_names[] = {
    {"on_stream", SHMIPC_ABI_KIND_STREAM_CB, (void (*)(void))cb_on_stream},
    {"on_data", SHMIPC_ABI_KIND_STREAM_CB, (void (*)(void))cb_on_data},
    {"destroy", SHMIPC_ABI_KIND_DESTROY_CB, (void (*)(void))cb_destroy},
    {"sink", SHMIPC_ABI_KIND_LOG_SINK, (void (*)(void))cb_sink},
    {"handler", SHMIPC_ABI_KIND_HTTP_HANDLER, (void (*)(void))cb_handler},
    {"defer_handler", SHMIPC_ABI_KIND_HTTP_HANDLER, (void (*)(void))cb_defer_handler},
    {"pending_end", SHMIPC_ABI_KIND_HTTP_PENDING_CB, (void (*)(void))cb_pending_end},
    {"ws_open", SHMIPC_ABI_KIND_WS_OPEN_CB, (void (*)(void))cb_ws_open},
    {"ws_message", SHMIPC_ABI_KIND_WS_MESSAGE_CB, (void (*)(void))cb_ws_message},
    {"ws_close", SHMIPC_ABI_KIND_WS_CLOSE_CB, (void (*)(void))cb_ws_close},
    {"serve_handler", SHMIPC_ABI_KIND_SERVE_HANDLER, (void (*)(void))cb_serve_handler},
    {"serve_ws_handler", SHMIPC_ABI_KIND_SERVE_HANDLER, (void (*)(void))cb_serve_ws_handler},
};

/* Constants a script can name: the error codes and these. */
struct constant {
    const char *name;
    long long value;
};
#define SCRIPT_CONSTANTS(X)                                                                        \
    X(SHMIPC_VERSION_HEX)                                                                          \
    X(SHMIPC_MEMMAP_DEVSHM)                                                                        \
    X(SHMIPC_MEMMAP_MEMFD)                                                                         \
    X(SHMIPC_PROTOCOL_LEGACY)                                                                      \
    X(SHMIPC_PROTOCOL_V4)                                                                          \
    X(SHMIPC_WAKEUP_SOCKET)                                                                        \
    X(SHMIPC_WAKEUP_EVENTFD)                                                                       \
    X(SHMIPC_WAKEUP_POLLING)                                                                       \
    X(SHMIPC_TIMEOUT_INITIALIZE)                                                                   \
    X(SHMIPC_TIMEOUT_CONNECTION_WRITE)                                                             \
    X(SHMIPC_TIMEOUT_READ)                                                                         \
    X(SHMIPC_TIMEOUT_WRITE)                                                                        \
    X(SHMIPC_V4_FEATURE_EVENTFD)                                                                   \
    X(SHMIPC_V4_FEATURE_POLLING)                                                                   \
    X(SHMIPC_NONBLOCK)                                                                             \
    X(SHMIPC_WAIT_FOREVER)                                                                         \
    X(SHMIPC_MIN_BUFFER_CAPACITY)                                                                  \
    X(SHMIPC_BACKEND_DEFAULT)                                                                      \
    X(SHMIPC_BACKEND_EPOLL)                                                                        \
    X(SHMIPC_SERVER_TIMEOUT_STOP)                                                                  \
    X(SHMIPC_SERVER_TIMEOUT_HEADER)                                                                \
    X(SHMIPC_SERVER_TIMEOUT_KEEPALIVE)                                                             \
    X(SHMIPC_SERVER_TIMEOUT_WS_PING)                                                               \
    X(SHMIPC_SERVER_LIMIT_BODY)                                                                    \
    X(SHMIPC_LOG_ERROR)
#define K(x)               {.name = #x, .value = (x)},
#define ERR_CONST(n, v, m) {.name = "SHMIPC_" #n, .value = (v)},
static const struct constant constants[] = {SCRIPT_CONSTANTS(K)};
static const struct constant error_constants[] = {SHMIPC_ERRNO_MAP(ERR_CONST)};
#undef ERR_CONST
#undef K

/* ------------------------------------------------------------------------------------ */
/* The interpreter                                                                      */
/* ------------------------------------------------------------------------------------ */

/*
 * A script is a list of statements separated by ';':
 *   name(arg, ...) [= | >= | != value]   calls a table entry through ffi_call
 *   !name(...) ...                         the same, counted as a call with invalid (or edge)
 *                                          arguments, as is a call with a NULL handle or one
 *                                          expected to fail
 *   var = value                            checks a variable an out-parameter filled
 *   var := "text"                          copies text into a window from OUT_WPTR_N
 * Arguments are integers, constants, "text", NULL, &var (an out-parameter that binds var),
 * variables (handles, strings and numbers), callback names and ud. Every argument is checked
 * against the table's type for its parameter, as a binding would before reaching C. Handles
 * bound by OUT_HANDLE are released when the script's interpreter is finished, unless a
 * RELEASE parameter took them.
 */
struct var {
    char name[24];
    int type; /* SHMIPC_ABI_HANDLE for handles, else the type of the out-parameter */
    int kind;
    int env;  /* set up by the test: never released by a script */
    int live; /* a handle this interpreter owns */
    union {
        void *p;
        const void *cp;
        int i32;
        uint32_t u32;
        int64_t i64;
        uint64_t u64;
        size_t z;
    } v;
    size_t len;          /* bytes at v.cp, for pointer outs */
    struct var *len_var; /* OUT_LEN that holds the length of this OUT_CPTR or OUT_CHARS */
    const char *str;     /* a string variable */
};

struct interp {
    struct var vars[MAX_VARS];
    int nvars;
    char err[768];
};

static int script_fail(struct interp *in, const char *stmt, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int script_fail(struct interp *in, const char *stmt, const char *fmt, ...)
{
    if (in->err[0] == '\0') {
        va_list ap;
        int n = snprintf(in->err, sizeof in->err, "in `%.200s`: ", stmt);
        va_start(ap, fmt);
        vsnprintf(in->err + n, sizeof in->err - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static struct var *var_find(struct interp *in, const char *name)
{
    for (int i = 0; i < in->nvars; i++)
        if (strcmp(in->vars[i].name, name) == 0)
            return &in->vars[i];
    return NULL;
}

static struct var *var_bind(struct interp *in, const char *name)
{
    struct var *v = var_find(in, name);
    if (v == NULL) {
        if (in->nvars == MAX_VARS)
            return NULL;
        v = &in->vars[in->nvars++];
    } else if (v->env || v->live) {
        return NULL; /* would lose an object */
    }
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "%s", name);
    return v;
}

static void interp_handle(struct interp *in, const char *name, int kind, void *p)
{
    struct var *v = var_bind(in, name);
    assert_non_null(v);
    v->type = SHMIPC_ABI_HANDLE;
    v->kind = kind;
    v->env = 1;
    v->v.p = p;
}

static void interp_string(struct interp *in, const char *name, const char *s)
{
    struct var *v = var_bind(in, name);
    assert_non_null(v);
    v->type = SHMIPC_ABI_CSTR;
    v->env = 1;
    v->str = s;
}

static void *interp_get(struct interp *in, const char *name)
{
    struct var *v = var_find(in, name);
    return v != NULL ? v->v.p : NULL;
}

/* The destructor of a kind: the table entry whose only parameter RELEASEs that kind. */
static const shmipc_abi_fn *destructor_of(int kind)
{
    for (int i = 0; i < ncalls; i++) {
        const shmipc_abi_fn *d = calls[i].d;
        if (d->nparams == 1 && d->params[0].type == SHMIPC_ABI_RELEASE &&
            d->params[0].kind == kind && d->ret.type == SHMIPC_ABI_VOID)
            return d;
    }
    return NULL;
}

/* Releases what the script still owns, newest first, through the table. */
static void interp_finish(struct interp *in)
{
    for (int i = in->nvars - 1; i >= 0; i--) {
        struct var *v = &in->vars[i];
        if (!v->live)
            continue;
        const shmipc_abi_fn *d = destructor_of(v->kind);
        assert_non_null(d);
        ffi_cif cif;
        ffi_type *args[1];
        void *argv[1] = {&v->v.p};
        assert_int_equal(prep_cif(&cif, args, d), 0);
        ffi_call(&cif, d->fn, NULL, argv);
        v->live = 0;
    }
    in->nvars = 0;
}

/* Tokens */
enum tok { T_END, T_INT, T_STR, T_NULL, T_REF, T_IDENT, T_PUNCT };
struct token {
    enum tok t;
    long long i;
    char s[256];
    size_t slen;
};

static void skip_ws(const char **p)
{
    while (isspace((unsigned char)**p))
        (*p)++;
}

static int lookup_constant(const char *name, long long *out)
{
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++)
        if (strcmp(constants[i].name, name) == 0) {
            *out = constants[i].value;
            return 0;
        }
    for (size_t i = 0; i < sizeof error_constants / sizeof error_constants[0]; i++)
        if (strcmp(error_constants[i].name, name) == 0) {
            *out = error_constants[i].value;
            return 0;
        }
    return -1;
}

static int next_token(const char **p, struct token *t)
{
    skip_ws(p);
    memset(t, 0, sizeof *t);
    const char *s = *p;
    if (*s == '\0' || *s == ';') {
        t->t = T_END;
        return 0;
    }
    if (*s == '"') {
        s++;
        while (*s != '"' && *s != '\0' && t->slen < sizeof t->s - 1) {
            char c = *s++;
            if (c == '\\') {
                c = *s++;
                c = c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : c;
            }
            t->s[t->slen++] = c;
        }
        if (*s != '"')
            return -1;
        *p = s + 1;
        t->t = T_STR;
        return 0;
    }
    if (isdigit((unsigned char)*s) || (*s == '-' && isdigit((unsigned char)s[1]))) {
        char *end;
        t->i = strtoll(s, &end, 0);
        *p = end;
        t->t = T_INT;
        return 0;
    }
    if (*s == '&' || isalpha((unsigned char)*s) || *s == '_') {
        int ref = *s == '&';
        s += ref;
        size_t n = 0;
        while ((isalnum((unsigned char)*s) || *s == '_') && n < sizeof t->s - 1)
            t->s[n++] = *s++;
        *p = s;
        t->slen = n;
        if (ref) {
            t->t = T_REF;
        } else if (strcmp(t->s, "NULL") == 0) {
            t->t = T_NULL;
        } else if (lookup_constant(t->s, &t->i) == 0) {
            t->t = T_INT;
        } else {
            t->t = T_IDENT;
        }
        return 0;
    }
    /* Punctuation: ( ) , = >= != := */
    t->t = T_PUNCT;
    if ((s[0] == '>' || s[0] == '!' || s[0] == ':') && s[1] == '=') {
        memcpy(t->s, s, 2);
        *p = s + 2;
    } else {
        t->s[0] = *s;
        *p = s + 1;
    }
    return 0;
}

static int is_punct(const struct token *t, const char *s)
{
    return t->t == T_PUNCT && strcmp(t->s, s) == 0;
}

static int is_pointer_type(int type)
{
    return ffi_type_of(type) == &ffi_type_pointer;
}

/* The integer value of a token or a numeric variable. */
static int int_value(struct interp *in, const struct token *t, long long *out)
{
    if (t->t == T_INT) {
        *out = t->i;
        return 0;
    }
    struct var *v = t->t == T_IDENT ? var_find(in, t->s) : NULL;
    if (v == NULL)
        return -1;
    switch (v->type) {
    case SHMIPC_ABI_OUT_I32:
        *out = v->v.i32;
        return 0;
    case SHMIPC_ABI_OUT_U32:
        *out = v->v.u32;
        return 0;
    case SHMIPC_ABI_OUT_I64:
        *out = v->v.i64;
        return 0;
    case SHMIPC_ABI_OUT_U64:
        *out = (long long)v->v.u64;
        return 0;
    case SHMIPC_ABI_OUT_LEN:
    case SHMIPC_ABI_OUT_SIZE:
        *out = (long long)v->v.z;
        return 0;
    default:
        return -1;
    }
}

static int compare_int(const char *op, long long got, long long want)
{
    if (strcmp(op, "=") == 0)
        return got == want;
    if (strcmp(op, ">=") == 0)
        return got >= want;
    return got != want;
}

static const char *var_bytes(struct var *v, size_t *len)
{
    *len = v->len_var != NULL ? v->len_var->v.z : v->len;
    return v->v.cp;
}

/* Checks `var op value` for a variable an out-parameter filled. */
static int check_var(struct interp *in, const char *stmt, struct var *v, const char **p)
{
    struct token op, val;
    next_token(p, &op);
    next_token(p, &val);
    if (is_punct(&op, ":=")) {
        if (v->type != SHMIPC_ABI_OUT_WPTR_N || val.t != T_STR || v->v.p == NULL)
            return script_fail(in, stmt, "%s is not a writable window", v->name);
        if (val.slen > v->len)
            return script_fail(in, stmt, "%zu bytes do not fit a window of %zu", val.slen, v->len);
        memcpy(v->v.p, val.s, val.slen);
        return 0;
    }
    if (op.t != T_PUNCT || !(is_punct(&op, "=") || is_punct(&op, ">=") || is_punct(&op, "!=")))
        return script_fail(in, stmt, "expected = >= != or := after %s", v->name);
    if (val.t == T_STR) {
        size_t len;
        const char *b = var_bytes(v, &len);
        if (b == NULL || len != val.slen || memcmp(b, val.s, len) != 0)
            return script_fail(in, stmt, "%s holds \"%.*s\" (%zu bytes), expected \"%s\"", v->name,
                               b ? (int)(len > 200 ? 200 : len) : 4, b ? b : "NULL", len, val.s);
        return 0;
    }
    if (val.t == T_NULL) {
        if ((v->v.cp == NULL) != is_punct(&op, "="))
            return script_fail(in, stmt, "%s is %p", v->name, v->v.cp);
        return 0;
    }
    long long got, want;
    struct token self = {.t = T_IDENT};
    snprintf(self.s, sizeof self.s, "%s", v->name);
    if (int_value(in, &self, &got) < 0 || int_value(in, &val, &want) < 0)
        return script_fail(in, stmt, "cannot compare %s with that", v->name);
    if (!compare_int(op.s, got, want))
        return script_fail(in, stmt, "%s is %lld, expected %s %lld", v->name, got, op.s, want);
    return 0;
}

/* Storage of one marshalled argument. */
union argval {
    int i32;
    uint32_t u32;
    int64_t i64;
    uint64_t u64;
    size_t z;
    void *p;
    const void *cp;
};

/* Marshals one argument for parameter `prm` (index `i`); a mismatch fails before any C call. */
static int marshal(struct interp *in, const char *stmt, const shmipc_abi_fn *d, int i,
                   const struct token *t, union argval *av, struct var **bound, int *null_ptr)
{
    const shmipc_abi_param *prm = &d->params[i];
    long long n;
    *bound = NULL;
    if (t->t == T_NULL) {
        if (!is_pointer_type(prm->type))
            return script_fail(in, stmt, "NULL for %s, which is not a pointer", prm->name);
        av->p = NULL;
        /* A missing object is an invalid call; other pointers may be optional. */
        if (prm->type == SHMIPC_ABI_HANDLE || prm->type == SHMIPC_ABI_RELEASE)
            *null_ptr = 1;
        return 0;
    }
    switch (prm->type) {
    case SHMIPC_ABI_I32:
    case SHMIPC_ABI_U32:
    case SHMIPC_ABI_I64:
    case SHMIPC_ABI_U64:
    case SHMIPC_ABI_SIZE:
    case SHMIPC_ABI_BYTES_LEN:
        if (int_value(in, t, &n) < 0)
            return script_fail(in, stmt, "%s takes a number", prm->name);
        if (prm->type == SHMIPC_ABI_I32)
            av->i32 = (int)n;
        else if (prm->type == SHMIPC_ABI_U32)
            av->u32 = (uint32_t)n;
        else if (prm->type == SHMIPC_ABI_I64)
            av->i64 = n;
        else if (prm->type == SHMIPC_ABI_U64)
            av->u64 = (uint64_t)n;
        else
            av->z = (size_t)n;
        return 0;
    case SHMIPC_ABI_CSTR:
    case SHMIPC_ABI_BYTES_IN:
        if (t->t == T_IDENT) {
            struct var *v = var_find(in, t->s);
            if (v == NULL || v->str == NULL)
                return script_fail(in, stmt, "%s is not a string variable", t->s);
            av->cp = v->str;
            return 0;
        }
        if (t->t != T_STR)
            return script_fail(in, stmt, "%s takes text", prm->name);
        /* The token lives until the call returns: the library only reads it during the call. */
        av->cp = t->s;
        return 0;
    case SHMIPC_ABI_HANDLE:
    case SHMIPC_ABI_RELEASE: {
        struct var *v = t->t == T_IDENT ? var_find(in, t->s) : NULL;
        if (v == NULL || v->type != SHMIPC_ABI_HANDLE)
            return script_fail(in, stmt, "%s takes a handle", prm->name);
        if (v->kind != prm->kind)
            return script_fail(in, stmt, "%s is a handle of kind %d, %s takes kind %d", v->name,
                               v->kind, prm->name, prm->kind);
        if (prm->type == SHMIPC_ABI_RELEASE && v->env)
            return script_fail(in, stmt, "%s belongs to the test; a script cannot release it",
                               v->name);
        av->p = v->v.p;
        *bound = v;
        return 0;
    }
    case SHMIPC_ABI_CALLBACK:
        for (size_t k = 0; k < sizeof callback_names / sizeof callback_names[0]; k++)
            if (t->t == T_IDENT && strcmp(callback_names[k].name, t->s) == 0) {
                if (callback_names[k].kind != prm->kind)
                    return script_fail(in, stmt, "%s is not a callback of kind %d", t->s,
                                       prm->kind);
                av->p = (void *)callback_names[k].fn;
                return 0;
            }
        return script_fail(in, stmt, "%s takes a callback", prm->name);
    case SHMIPC_ABI_USER_DATA:
        if (t->t != T_IDENT || strcmp(t->s, "ud") != 0)
            return script_fail(in, stmt, "%s takes ud or NULL", prm->name);
        av->p = &ud;
        return 0;
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
    case SHMIPC_ABI_OUT_SIZE: {
        if (t->t != T_REF)
            return script_fail(in, stmt, "%s is an out-parameter: pass &name or NULL", prm->name);
        struct var *v = var_bind(in, t->s);
        if (v == NULL)
            return script_fail(in, stmt, "cannot bind %s (a live handle, or too many variables)",
                               t->s);
        v->type = prm->type == SHMIPC_ABI_OUT_HANDLE ? SHMIPC_ABI_HANDLE : prm->type;
        v->kind = prm->kind;
        av->p = &v->v;
        *bound = v;
        return 0;
    }
    default:
        return script_fail(in, stmt, "%s has type %d, which no generic caller marshals", prm->name,
                           prm->type);
    }
}

/* Runs one call statement; `p` is just past the function name. */
static int run_call(struct interp *in, const char *stmt, int idx, int invalid, const char **p)
{
    const shmipc_abi_fn *d = calls[idx].d;
    struct token args[MAX_PARAMS], t;
    union argval av[MAX_PARAMS];
    void *argv[MAX_PARAMS];
    struct var *bound[MAX_PARAMS] = {0};
    int nargs = 0, null_ptr = 0;

    if (!calls[idx].ready)
        return script_fail(in, stmt, "%s is not GENERIC", d->name);
    next_token(p, &t);
    if (!is_punct(&t, "("))
        return script_fail(in, stmt, "expected (");
    next_token(p, &t);
    while (!is_punct(&t, ")")) {
        if (nargs == MAX_PARAMS || t.t == T_END)
            return script_fail(in, stmt, "unterminated argument list");
        args[nargs++] = t;
        next_token(p, &t);
        if (is_punct(&t, ","))
            next_token(p, &t);
    }
    if (nargs != d->nparams)
        return script_fail(in, stmt, "%s takes %d arguments, got %d", d->name, d->nparams, nargs);
    for (int i = 0; i < nargs; i++) {
        if (marshal(in, stmt, d, i, &args[i], &av[i], &bound[i], &null_ptr) < 0)
            return -1;
        argv[i] = &av[i];
    }

    union {
        ffi_arg a;
        ffi_sarg s;
        uint64_t u64;
        int64_t i64;
        void *p;
    } rv = {0};
    ffi_call(&calls[idx].cif, d->fn, &rv, argv);

    /* What the out-parameters now hold, and which handles the call took. */
    struct var *chars_len = NULL;
    for (int i = 0; i < nargs; i++) {
        const shmipc_abi_param *prm = &d->params[i];
        struct var *v = bound[i];
        if (v == NULL)
            continue;
        if (prm->type == SHMIPC_ABI_RELEASE)
            v->live = 0, v->v.p = NULL;
        else if (prm->type == SHMIPC_ABI_OUT_HANDLE)
            v->live = v->v.p != NULL;
        else if (prm->type == SHMIPC_ABI_OUT_CPTR_N || prm->type == SHMIPC_ABI_OUT_WPTR_N)
            v->len = av[i - 1].z;
        else if (prm->type == SHMIPC_ABI_OUT_CPTR || prm->type == SHMIPC_ABI_OUT_CHARS)
            v->len_var = bound[i + 1];
        else if (prm->type == SHMIPC_ABI_OUT_LEN &&
                 (i == 0 || (d->params[i - 1].type != SHMIPC_ABI_OUT_CPTR &&
                             d->params[i - 1].type != SHMIPC_ABI_OUT_CHARS)))
            chars_len = v;
    }

    int rc = d->ret.type == SHMIPC_ABI_I32 ? (int)rv.s : 0;
    if (d->ret.type == SHMIPC_ABI_I32 && rc < 0 && shmipc_errname(rc) == NULL)
        return script_fail(in, stmt, "returned %d, which is no shmipc error code", rc);

    /* The expected result. */
    struct token op, val;
    next_token(p, &op);
    int negative = 0;
    if (op.t != T_END) {
        if (d->ret.type == SHMIPC_ABI_VOID)
            return script_fail(in, stmt, "%s returns nothing", d->name);
        next_token(p, &val);
        if (val.t == T_STR || val.t == T_NULL) {
            const char *got = rv.p;
            size_t len = 0;
            if (d->ret.type == SHMIPC_ABI_CHARS)
                len = chars_len != NULL ? chars_len->v.z : (got ? strlen(got) : 0);
            else if (got != NULL)
                len = strlen(got);
            int same = val.t == T_NULL
                           ? got == NULL
                           : got != NULL && len == val.slen && memcmp(got, val.s, len) == 0;
            if (same != is_punct(&op, "="))
                return script_fail(in, stmt, "returned \"%.*s\" (%zu bytes), expected %s %s%s%s",
                                   got ? (int)(len > 200 ? 200 : len) : 4, got ? got : "NULL", len,
                                   op.s, val.t == T_STR ? "\"" : "",
                                   val.t == T_STR ? val.s : "NULL", val.t == T_STR ? "\"" : "");
        } else {
            long long want, got;
            if (int_value(in, &val, &want) < 0)
                return script_fail(in, stmt, "cannot read the expected value");
            switch (d->ret.type) {
            case SHMIPC_ABI_I32:
                got = rc;
                break;
            case SHMIPC_ABI_U32:
                got = (uint32_t)rv.a;
                break;
            case SHMIPC_ABI_I64:
                got = rv.i64;
                break;
            default:
                got = (long long)rv.u64;
            }
            if (!compare_int(op.s, got, want))
                return script_fail(in, stmt, "returned %lld (%s), expected %s %lld", got,
                                   got < 0 && shmipc_errname((int)got) ? shmipc_errname((int)got)
                                                                       : "",
                                   op.s, want);
            negative = is_punct(&op, "=") && want < 0;
        }
    }
    if (invalid || null_ptr || negative)
        called_invalid[idx] = 1;
    else
        called_valid[idx] = 1;
    return 0;
}

/* Runs a script; 0, or -1 with in->err set. Stops at the first failed statement. */
static int interp_run(struct interp *in, const char *script)
{
    const char *p = script;
    while (*p != '\0') {
        skip_ws(&p);
        /* Statements end at ';' (the scripts put none inside text). */
        const char *end = strchr(p, ';');
        char text[512];
        size_t n = end ? (size_t)(end - p) : strlen(p);
        snprintf(text, sizeof text, "%.*s", (int)n, p);
        if (n == 0) {
            p += end ? 1 : 0;
            continue;
        }
        int invalid = *p == '!';
        p += invalid;
        struct token name;
        next_token(&p, &name);
        if (name.t != T_IDENT)
            return script_fail(in, text, "expected a function or a variable");
        struct var *v = var_find(in, name.s);
        int idx = v == NULL ? call_index(name.s) : -1;
        int rc;
        if (v != NULL)
            rc = check_var(in, text, v, &p);
        else if (idx >= 0)
            rc = run_call(in, text, idx, invalid, &p);
        else
            rc = script_fail(in, text, "%s is neither in the table nor a variable", name.s);
        if (rc < 0)
            return -1;
        skip_ws(&p);
        if (*p == ';')
            p++;
        else if (*p != '\0')
            return script_fail(in, text, "unexpected text at \"%.20s\"", p);
    }
    return 0;
}

#define RUN(in, script)                                                                            \
    do {                                                                                           \
        if (interp_run((in), (script)) < 0)                                                        \
            fail_msg("%s", (in)->err);                                                             \
    } while (0)

/* ------------------------------------------------------------------------------------ */
/* The objects scripts work on                                                          */
/* ------------------------------------------------------------------------------------ */

/* Streams the echo server holds, closed when their peer ends them or at teardown. */
struct echo {
    shmipc_stream *held[64];
    int n;
};

static void echo_on_stream(shmipc_stream *st, void *user_data)
{
    struct echo *e = user_data;
    if (e->n < 64)
        e->held[e->n++] = st;
    else
        shmipc_stream_close(st);
}

static void echo_on_data(shmipc_stream *st, void *user_data)
{
    struct echo *e = user_data;
    int wrote = 0;
    for (;;) {
        const void *p;
        size_t n;
        int rc = shmipc_stream_read_chunk(st, 0, &p, &n, SHMIPC_NONBLOCK);
        if (rc == SHMIPC_EAGAIN)
            break;
        if (rc < 0) {
            for (int i = 0; i < e->n; i++)
                if (e->held[i] == st) {
                    e->held[i] = e->held[--e->n];
                    break;
                }
            shmipc_stream_close(st);
            return;
        }
        shmipc_stream_write(st, p, n);
        shmipc_stream_release(st);
        wrote = 1;
    }
    if (wrote)
        shmipc_stream_flush(st);
}

static struct env {
    char served_addr[64], acc_addr[64], idle_addr[64], nobody_addr[64];
    shmipc_config *cfg;
    shmipc_listener *served, *acc, *idle;
    pthread_t serve_thread;
    struct echo echo;
    shmipc_session *client, *client2, *server;
    shmipc_stream *st, *st2;
    shmipc_session_manager *m;
} env;

static int fresh_n;
static char fresh_addr[8][64];

static void *serve_main(void *arg)
{
    (void)arg;
    shmipc_listener_serve(env.served, echo_on_stream, echo_on_data, &env.echo, NULL);
    return NULL;
}

static void *connect_main(void *arg)
{
    const char *addr = arg;
    shmipc_session *s = NULL;
    if (shmipc_session_connect(addr, env.cfg, &s) < 0)
        return NULL;
    return s;
}

static void address(char *buf, size_t size, const char *what)
{
    snprintf(buf, size, "unix:@shmipc-test-abi-%d-%s", (int)getpid(), what);
}

static int env_setup(void **state)
{
    (void)state;
    prepare_calls();
    address(env.served_addr, sizeof env.served_addr, "served");
    address(env.acc_addr, sizeof env.acc_addr, "acc");
    address(env.idle_addr, sizeof env.idle_addr, "idle");
    address(env.nobody_addr, sizeof env.nobody_addr, "nobody");
    assert_int_equal(shmipc_config_new(&env.cfg), 0);
    assert_int_equal(shmipc_config_set_buffer_capacity(env.cfg, 4u << 20), 0);
    assert_int_equal(shmipc_config_set_queue_capacity(env.cfg, 1024), 0);
    assert_int_equal(shmipc_config_set_timeout_ms(env.cfg, SHMIPC_TIMEOUT_READ, 10000), 0);
    assert_int_equal(shmipc_listener_new(env.served_addr, env.cfg, &env.served), 0);
    assert_int_equal(shmipc_listener_new(env.acc_addr, env.cfg, &env.acc), 0);
    assert_int_equal(shmipc_listener_new(env.idle_addr, env.cfg, &env.idle), 0);
    assert_int_equal(pthread_create(&env.serve_thread, NULL, serve_main, NULL), 0);
    assert_int_equal(shmipc_session_connect(env.served_addr, env.cfg, &env.client), 0);
    assert_int_equal(shmipc_session_open_stream(env.client, &env.st), 0);
    /* A pair whose server side the test holds: connect on a thread, accept here. */
    pthread_t t;
    void *client2;
    assert_int_equal(pthread_create(&t, NULL, connect_main, env.acc_addr), 0);
    assert_int_equal(shmipc_listener_accept(env.acc, 10000, &env.server), 0);
    pthread_join(t, &client2);
    env.client2 = client2;
    assert_non_null(env.client2);
    assert_int_equal(shmipc_session_open_stream(env.client2, &env.st2), 0);
    assert_int_equal(shmipc_session_manager_new(env.served_addr, env.cfg, &env.m), 0);
    return 0;
}

static int env_teardown(void **state)
{
    (void)state;
    shmipc_session_manager_close(env.m);
    shmipc_stream_close(env.st2);
    shmipc_stream_close(env.st);
    shmipc_session_close(env.client2);
    shmipc_session_close(env.server);
    shmipc_session_close(env.client);
    shmipc_listener_stop(env.served);
    pthread_join(env.serve_thread, NULL);
    for (int i = 0; i < env.echo.n; i++)
        shmipc_stream_close(env.echo.held[i]);
    shmipc_listener_close(env.idle);
    shmipc_listener_close(env.acc);
    shmipc_listener_close(env.served);
    shmipc_config_free(env.cfg);
    free(calls);
    free(called_valid);
    free(called_invalid);
    return 0;
}

/* An interpreter that knows the environment. */
static void interp_init(struct interp *in)
{
    memset(in, 0, sizeof *in);
    interp_handle(in, "cfg", SHMIPC_ABI_KIND_CONFIG, env.cfg);
    interp_handle(in, "client", SHMIPC_ABI_KIND_SESSION, env.client);
    interp_handle(in, "client2", SHMIPC_ABI_KIND_SESSION, env.client2);
    interp_handle(in, "server", SHMIPC_ABI_KIND_SESSION, env.server);
    interp_handle(in, "st", SHMIPC_ABI_KIND_STREAM, env.st);
    interp_handle(in, "st2", SHMIPC_ABI_KIND_STREAM, env.st2);
    interp_handle(in, "idle", SHMIPC_ABI_KIND_LISTENER, env.idle);
    interp_handle(in, "m", SHMIPC_ABI_KIND_MANAGER, env.m);
    interp_string(in, "addr", env.served_addr);
    interp_string(in, "acc_addr", env.acc_addr);
    interp_string(in, "nobody", env.nobody_addr);
    int n = fresh_n++ % 8;
    address(fresh_addr[n], sizeof fresh_addr[n], "fresh");
    snprintf(fresh_addr[n] + strlen(fresh_addr[n]), sizeof fresh_addr[n] - strlen(fresh_addr[n]),
             "-%d", fresh_n);
    interp_string(in, "newaddr", fresh_addr[n]);
}

/* ------------------------------------------------------------------------------------ */
/* The table itself                                                                     */
/* ------------------------------------------------------------------------------------ */

static void table_is_well_formed(void **state)
{
    (void)state;
    assert_true(ncalls > 0);
    assert_null(shmipc_abi_get(-1));
    assert_null(shmipc_abi_get(ncalls));
    assert_null(shmipc_abi_find(NULL));
    assert_null(shmipc_abi_find("shmipc_no_such_function"));
    assert_null(shmipc_abi_callback(SHMIPC_ABI_KIND_NONE));
    assert_null(shmipc_abi_callback(SHMIPC_ABI_KIND_CONFIG));
    for (int i = 0; i < ncalls; i++) {
        const shmipc_abi_fn *d = calls[i].d;
        int opaque = d->ret.type == SHMIPC_ABI_OPAQUE;
        assert_int_equal(d->size, sizeof(shmipc_abi_fn));
        assert_non_null(d->fn);
        assert_int_equal(strncmp(d->name, "shmipc_", 7), 0);
        assert_ptr_equal(shmipc_abi_find(d->name), d);
        assert_true(d->nparams >= 0 && d->nparams <= MAX_PARAMS);
        assert_true((d->params != NULL) == (d->nparams > 0));
        assert_string_equal(d->ret.name, "");
        for (int k = 0; k < d->nparams; k++) {
            const shmipc_abi_param *prm = &d->params[k];
            assert_true(prm->type > SHMIPC_ABI_VOID && prm->type <= SHMIPC_ABI_OPAQUE);
            assert_true(prm->name[0] != '\0' && prm->ctype[0] != '\0');
            opaque |= prm->type == SHMIPC_ABI_OPAQUE;
            if (prm->type == SHMIPC_ABI_CALLBACK) {
                const shmipc_abi_fn *cb = shmipc_abi_callback(prm->kind);
                assert_non_null(cb);
                assert_null(cb->fn);
                assert_int_equal(cb->size, sizeof(shmipc_abi_fn));
            }
            if (prm->type == SHMIPC_ABI_OUT_HANDLE || prm->type == SHMIPC_ABI_RELEASE) {
                /* Every object a call hands out can be released through the table. */
                assert_non_null(destructor_of(prm->kind));
            }
        }
        assert_int_equal(!opaque, is_generic(d));
    }
    /* The table describes itself. */
    const shmipc_abi_fn *get = shmipc_abi_find("shmipc_abi_get");
    assert_non_null(get);
    assert_int_equal(get->ret.type, SHMIPC_ABI_OPAQUE);
    assert_string_equal(get->ret.ctype, "const shmipc_abi_fn *");
    const shmipc_abi_fn *sink = shmipc_abi_find("shmipc_set_log_sink");
    assert_non_null(sink);
    assert_int_equal(sink->nparams, 1);
    assert_int_equal(sink->params[0].type, SHMIPC_ABI_CALLBACK);
    assert_int_equal(sink->params[0].kind, SHMIPC_ABI_KIND_LOG_SINK);
    assert_string_equal(shmipc_abi_callback(SHMIPC_ABI_KIND_LOG_SINK)->name, "shmipc_log_sink");
}

/* Every GENERIC entry, all pointers NULL and numbers 0: a documented code or nothing, no crash. */
static void every_entry_with_null_arguments(void **state)
{
    (void)state;
    for (int i = 0; i < ncalls; i++) {
        const shmipc_abi_fn *d = calls[i].d;
        union argval av[MAX_PARAMS];
        void *argv[MAX_PARAMS];
        int pointers = 0;
        if (!calls[i].ready)
            continue;
        for (int k = 0; k < d->nparams; k++) {
            memset(&av[k], 0, sizeof av[k]);
            argv[k] = &av[k];
            pointers += is_pointer_type(d->params[k].type);
        }
        if (pointers == 0)
            continue;
        union {
            ffi_sarg s;
            uint64_t u64;
            void *p;
        } rv = {0};
        ffi_call(&calls[i].cif, d->fn, &rv, argv);
        switch (d->ret.type) {
        case SHMIPC_ABI_I32:
            if ((int)rv.s > 0)
                fail_msg("%s(NULL, ...) returned %d", d->name, (int)rv.s);
            if ((int)rv.s < 0 && shmipc_errname((int)rv.s) == NULL)
                fail_msg("%s(NULL, ...) returned %d, no shmipc code", d->name, (int)rv.s);
            break;
        case SHMIPC_ABI_I64: /* 0, or -1 where 0 is a valid value (get_timeout_ms) */
            if ((int64_t)rv.u64 != 0 && (int64_t)rv.u64 != -1)
                fail_msg("%s(NULL, ...) returned %lld", d->name, (long long)rv.u64);
            break;
        case SHMIPC_ABI_U32:
        case SHMIPC_ABI_U64:
        case SHMIPC_ABI_SIZE:
            if (rv.u64 != 0)
                fail_msg("%s(NULL, ...) returned %llu, not 0", d->name, (unsigned long long)rv.u64);
            break;
        default:
            break;
        }
    }
}

/* ------------------------------------------------------------------------------------ */
/* Valid and invalid calls, area by area                                                */
/* ------------------------------------------------------------------------------------ */

static void version_and_errors(void **state)
{
    struct interp in;
    (void)state;
    interp_init(&in);
    RUN(&in, "shmipc_version() = SHMIPC_VERSION_HEX; shmipc_version_string() != NULL;"
             "shmipc_strerror(SHMIPC_EINVAL) = \"invalid argument\";"
             "!shmipc_strerror(12345) = \"unknown error\";"
             "shmipc_errname(SHMIPC_ETIMEDOUT) = \"SHMIPC_ETIMEDOUT\";"
             "!shmipc_errname(12345) = NULL;"
             "shmipc_serve_type_name(1) = \"REQUEST_HEAD\";"
             "!shmipc_serve_type_name(12345) = \"?\";"
             "shmipc_config_set_queue_capacity(cfg, 0) = SHMIPC_EINVAL;"
             "shmipc_error_detail() = \"queue_capacity: 0 is outside 1..16777216\";"
             "shmipc_abi_count() >= 1; shmipc_set_log_sink(sink);"
             /* Every sink is valid; NULL, the edge, restores stderr. */
             "!shmipc_set_log_sink(NULL)");
    interp_finish(&in);
}

static void config_calls(void **state)
{
    struct interp in;
    (void)state;
    interp_init(&in);
    RUN(&in,
        "shmipc_config_new(&c) = 0; shmipc_config_clone(c, &d) = 0; shmipc_config_validate(d) = 0;"
        "shmipc_config_free(d); shmipc_config_new(NULL) = SHMIPC_EINVAL;"
        "shmipc_config_clone(NULL, &d) = SHMIPC_EINVAL; shmipc_config_clone(c, NULL) = "
        "SHMIPC_EINVAL;"
        "shmipc_config_validate(NULL) = SHMIPC_EINVAL; shmipc_config_free(NULL);"

        "shmipc_config_set_memmap_type(c, SHMIPC_MEMMAP_DEVSHM) = 0;"
        "shmipc_config_get_memmap_type(c) = SHMIPC_MEMMAP_DEVSHM;"
        "shmipc_config_set_memmap_type(c, 7) = SHMIPC_EINVAL;"
        "shmipc_config_set_memmap_type(NULL, 0) = SHMIPC_EINVAL;"
        "shmipc_config_get_memmap_type(NULL) = 0;"
        "shmipc_config_set_memmap_type(c, SHMIPC_MEMMAP_MEMFD) = 0;"

        "shmipc_config_set_buffer_capacity(c, 4194304) = 0;"
        "shmipc_config_get_buffer_capacity(c) = 4194304;"
        "shmipc_config_set_buffer_capacity(c, 4096) = SHMIPC_EINVAL;"
        "shmipc_config_set_buffer_capacity(NULL, 4194304) = SHMIPC_EINVAL;"
        "shmipc_config_get_buffer_capacity(NULL) = 0;"

        "shmipc_config_set_queue_capacity(c, 2048) = 0; shmipc_config_get_queue_capacity(c) = 2048;"
        "shmipc_config_set_queue_capacity(c, 8) = SHMIPC_EINVAL;"
        "shmipc_config_set_queue_capacity(NULL, 16) = SHMIPC_EINVAL;"
        "shmipc_config_get_queue_capacity(NULL) = 0;"

        "shmipc_config_parse_slice_classes(c, \"4096:50,16384:50\") = 0;"
        "shmipc_config_parse_slice_classes(c, \"4096:50\") = SHMIPC_EINVAL;"
        "shmipc_config_parse_slice_classes(c, NULL) = SHMIPC_EINVAL;"
        "shmipc_config_parse_slice_classes(NULL, \"4096:100\") = SHMIPC_EINVAL;"

        "shmipc_config_set_path_prefix(c, \"/dev/shm/abi\") = 0;"
        "shmipc_config_get_path_prefix(c) = \"/dev/shm/abi\";"
        "shmipc_config_set_path_prefix(c, \"\") = SHMIPC_EINVAL;"
        "shmipc_config_set_path_prefix(c, NULL) = SHMIPC_EINVAL;"
        "shmipc_config_get_path_prefix(NULL) = NULL;"

        "shmipc_config_set_timeout_ms(c, SHMIPC_TIMEOUT_READ, 250) = 0;"
        "shmipc_config_get_timeout_ms(c, SHMIPC_TIMEOUT_READ) = 250;"
        "shmipc_config_set_timeout_ms(c, SHMIPC_TIMEOUT_INITIALIZE, 0) = SHMIPC_EINVAL;"
        "shmipc_config_set_timeout_ms(c, 9, 1) = SHMIPC_EINVAL;"
        "shmipc_config_get_timeout_ms(c, 9) = -1;"
        "shmipc_config_get_timeout_ms(NULL, 0) = -1;"
        "shmipc_config_set_timeout(c, SHMIPC_TIMEOUT_READ, 0) = 0;"
        "shmipc_config_get_timeout(c, SHMIPC_TIMEOUT_READ, &i) = 0; i = 0;"
        "shmipc_config_get_timeout_ms(c, SHMIPC_TIMEOUT_READ) = -1;"
        "shmipc_config_set_timeout(c, SHMIPC_TIMEOUT_READ, -5) = 0;"
        "shmipc_config_get_timeout(c, SHMIPC_TIMEOUT_READ, &i) = 0; i = SHMIPC_WAIT_FOREVER;"
        "shmipc_config_set_timeout(c, SHMIPC_TIMEOUT_INITIALIZE, 0) = SHMIPC_EINVAL;"
        "shmipc_config_get_timeout(c, 9, &i) = SHMIPC_EINVAL;"
        "shmipc_config_get_timeout(NULL, 0, &i) = SHMIPC_EINVAL;"

        "shmipc_config_set_protocol(c, SHMIPC_PROTOCOL_V4, 1) = 0;"
        "shmipc_config_get_protocol(c) = SHMIPC_PROTOCOL_V4; shmipc_config_get_fallback(c) = 1;"
        "shmipc_config_set_protocol(c, 3, 0) = SHMIPC_EINVAL;"
        "shmipc_config_set_protocol(NULL, 0, 0) = SHMIPC_EINVAL;"
        "shmipc_config_get_protocol(NULL) = 0; shmipc_config_get_fallback(NULL) = 0;"

        "shmipc_config_set_wakeup(c, SHMIPC_WAKEUP_POLLING, 100) = 0;"
        "shmipc_config_get_wakeup(c) = SHMIPC_WAKEUP_POLLING;"
        "shmipc_config_get_polling_interval_us(c) = 100;"
        "shmipc_config_set_wakeup(c, SHMIPC_WAKEUP_POLLING, 0) = SHMIPC_EINVAL;"
        "shmipc_config_set_wakeup(NULL, 0, 0) = SHMIPC_EINVAL;"
        "shmipc_config_get_wakeup(NULL) = 0; shmipc_config_get_polling_interval_us(NULL) = 0;"

        "shmipc_config_with_v4(c) = 0; shmipc_config_get_wakeup(c) = SHMIPC_WAKEUP_SOCKET;"
        "shmipc_config_with_v4_eventfd(c) = 0; shmipc_config_get_wakeup(c) = SHMIPC_WAKEUP_EVENTFD;"
        "shmipc_config_with_v4_event_queue_polling(c, 50) = 0;"
        "shmipc_config_with_v4_event_queue_polling(c, 0) = SHMIPC_EINVAL;"
        "shmipc_config_with_v4(NULL) = SHMIPC_EINVAL;"
        "shmipc_config_with_v4_eventfd(NULL) = SHMIPC_EINVAL;"
        "shmipc_config_with_v4_event_queue_polling(NULL, 50) = SHMIPC_EINVAL;"

        "shmipc_config_set_session_num(c, 2) = 0; shmipc_config_get_session_num(c) = 2;"
        "shmipc_config_set_session_num(c, 0) = SHMIPC_EINVAL;"
        "shmipc_config_set_session_num(NULL, 1) = SHMIPC_EINVAL;"
        "shmipc_config_get_session_num(NULL) = 0;"
        "shmipc_config_set_max_stream_num(c, 16) = 0; shmipc_config_get_max_stream_num(c) = 16;"
        "shmipc_config_set_max_stream_num(c, 0) = SHMIPC_EINVAL;"
        "shmipc_config_set_max_stream_num(NULL, 1) = SHMIPC_EINVAL;"
        "shmipc_config_get_max_stream_num(NULL) = 0;"
        "shmipc_config_set_rebuild_interval_ms(c, 10) = 0;"
        "shmipc_config_get_rebuild_interval_ms(c) = 10;"
        "shmipc_config_set_rebuild_interval_ms(c, 0) = SHMIPC_EINVAL;"
        "shmipc_config_set_rebuild_interval_ms(NULL, 1) = SHMIPC_EINVAL;"
        "shmipc_config_get_rebuild_interval_ms(NULL) = 0;"

        "shmipc_config_set_server_v4(c, 1, SHMIPC_V4_FEATURE_EVENTFD) = 0;"
        "shmipc_config_get_server_v4(c, &features) = 1; features = SHMIPC_V4_FEATURE_EVENTFD;"
        "shmipc_config_get_server_v4(c, NULL) = 1;"
        "shmipc_config_set_server_v4(c, 1, 8) = SHMIPC_EINVAL;"
        "shmipc_config_set_server_v4(NULL, 1, 0) = SHMIPC_EINVAL;"
        "shmipc_config_get_server_v4(NULL, &features) = 0;"

        /* 384 is 0600, 432 is 0660, 1024 is 02000 (outside 0777). */
        "shmipc_config_get_socket_mode(c) = 384;"
        "shmipc_config_set_socket_mode(c, 432) = 0; shmipc_config_get_socket_mode(c) = 432;"
        "shmipc_config_set_socket_mode(c, 1024) = SHMIPC_EINVAL;"
        "shmipc_config_set_socket_mode(NULL, 0) = SHMIPC_EINVAL;"
        "shmipc_config_get_socket_mode(NULL) = 0;"

        /* What a peer may make a session hold: 0 is the default, 65536 the least bytes. */
        "shmipc_config_get_max_pending_streams(c) = 4096;"
        "shmipc_config_set_max_pending_streams(c, 8) = 0;"
        "shmipc_config_get_max_pending_streams(c) = 8;"
        "shmipc_config_set_max_pending_streams(c, 65537) = SHMIPC_EINVAL;"
        "shmipc_config_set_max_pending_streams(NULL, 8) = SHMIPC_EINVAL;"
        "shmipc_config_get_max_pending_streams(NULL) = 0;"
        "shmipc_config_get_max_fallback_unread(c) = 134217728;"
        "shmipc_config_set_max_fallback_unread(c, 65536) = 0;"
        "shmipc_config_get_max_fallback_unread(c) = 65536;"
        "shmipc_config_set_max_fallback_unread(c, 65535) = SHMIPC_EINVAL;"
        "shmipc_config_set_max_fallback_unread(NULL, 0) = SHMIPC_EINVAL;"
        "shmipc_config_get_max_fallback_unread(NULL) = 0;"

        /* The spin cap: 0 never spins, 100000 µs the most. */
        "shmipc_config_set_spin_us(c, 0) = 0; shmipc_config_get_spin_us(c) = 0;"
        "shmipc_config_set_spin_us(c, 100000) = 0; shmipc_config_get_spin_us(c) = 100000;"
        "shmipc_config_set_spin_us(c, 100001) = SHMIPC_EINVAL;"
        "shmipc_config_get_spin_us(c) = 100000;"
        "shmipc_config_set_spin_us(NULL, 5) = SHMIPC_EINVAL;"
        "shmipc_config_get_spin_us(NULL) = 0;"

        /* memory_wait: 0 (fall back, the default) or 1 (wait for shared memory). */
        "shmipc_config_get_memory_wait(c) = 0;"
        "shmipc_config_set_memory_wait(c, 1) = 0; shmipc_config_get_memory_wait(c) = 1;"
        "shmipc_config_set_memory_wait(c, 2) = SHMIPC_EINVAL;"
        "shmipc_config_get_memory_wait(c) = 1;"
        "shmipc_config_set_memory_wait(NULL, 1) = SHMIPC_EINVAL;"
        "shmipc_config_get_memory_wait(NULL) = 0");
    interp_finish(&in);
}

static void session_calls(void **state)
{
    struct interp in;
    (void)state;
    interp_init(&in);
    RUN(&in, "shmipc_session_connect(addr, cfg, &s) = 0; shmipc_session_version(s) = 3;"
             "shmipc_session_close(s); shmipc_session_close(NULL);"
             "shmipc_session_connect(addr, cfg, &s) = 0; shmipc_session_shutdown(s) = 0;"
             "shmipc_session_shutdown(s) = 0; shmipc_session_status(s) = SHMIPC_ECLOSED;"
             "shmipc_session_close(s); shmipc_session_shutdown(NULL) = SHMIPC_EINVAL;"
             "shmipc_session_connect(NULL, cfg, &s) = SHMIPC_EINVAL;"
             "shmipc_session_connect(addr, cfg, NULL) = SHMIPC_EINVAL;"
             "shmipc_session_connect(nobody, cfg, &s) = SHMIPC_ECONNREFUSED;"

             "shmipc_session_open_stream(client, &x) = 0; shmipc_stream_id(x) >= 2;"
             "shmipc_stream_close(x); shmipc_stream_close(NULL); shmipc_stream_id(NULL) = 0;"
             "shmipc_session_open_stream(client, &x) = 0; shmipc_stream_shutdown(x) = 0;"
             "shmipc_stream_write(x, \"x\", 1) = SHMIPC_ECLOSED; shmipc_stream_release(x) = 0;"
             "shmipc_stream_close(x); shmipc_stream_shutdown(NULL) = SHMIPC_EINVAL;"
             "shmipc_session_open_stream(client, &x) = 0; shmipc_stream_write(x, \"z\", 1) = 0;"
             "shmipc_stream_flush_close(x) = 0; shmipc_stream_flush_close(NULL) = SHMIPC_EINVAL;"
             "shmipc_session_open_stream(NULL, &x) = SHMIPC_EINVAL;"
             "shmipc_session_open_stream(client, NULL) = SHMIPC_EINVAL;"

             "shmipc_stream_write(st2, \"x\", 1) = 0; shmipc_stream_flush(st2) = 0;"
             "shmipc_session_accept_stream(server, 5000, &y) = 0;"
             "shmipc_stream_read_exact_bytes(y, 1, &p, 0) = 0; p = \"x\";"
             "shmipc_stream_release(y) = 0; shmipc_stream_close(y);"
             "shmipc_session_accept_stream(server, 0, &y) = SHMIPC_EAGAIN;"
             "shmipc_session_accept_stream(server, 1, &y) = SHMIPC_ETIMEDOUT;"
             "shmipc_session_accept_stream(server, 0, NULL) = SHMIPC_EINVAL;"
             "shmipc_session_accept_stream(NULL, 0, &y) = SHMIPC_EINVAL;"

             "shmipc_session_fileno(client) >= 0; shmipc_session_fileno(NULL) = SHMIPC_EINVAL;"
             "shmipc_session_process(client) >= 0; shmipc_session_process(NULL) = SHMIPC_EINVAL;"
             "shmipc_session_spin(client) >= 0; shmipc_session_spin(NULL) = SHMIPC_EINVAL;"
             "shmipc_session_status(client) = 0; shmipc_session_status(NULL) = SHMIPC_EINVAL;"
             "shmipc_session_version(client) = 3; shmipc_session_version(NULL) = SHMIPC_EINVAL;"
             "shmipc_session_wakeup(client, &iv) = SHMIPC_WAKEUP_SOCKET;"
             "shmipc_session_wakeup(client, NULL) = SHMIPC_WAKEUP_SOCKET;"
             "shmipc_session_wakeup(NULL, &iv) = SHMIPC_EINVAL");
    interp_finish(&in);
}

static void stream_calls(void **state)
{
    struct interp in;
    (void)state;
    interp_init(&in);
    RUN(&in, "shmipc_stream_write(st, \"hello\", 5) = 0; shmipc_stream_flush(st) = 0;"
             "shmipc_stream_read_chunk(st, 0, &p, &n, 0) = 0; n = 5; p = \"hello\";"
             "shmipc_stream_release(st) = 0;"

             "shmipc_stream_reserve(st, 3, &w) = 0; w := \"abc\"; shmipc_stream_commit(st, 3) = 0;"
             "shmipc_stream_flush(st) = 0; shmipc_stream_read_exact_bytes(st, 3, &q, 0) = 0;"
             "q = \"abc\"; shmipc_stream_available(st) = 0; shmipc_stream_release(st) = 0;"

             "shmipc_stream_write(st, \"fwd\", 3) = 0; shmipc_stream_flush(st) = 0;"
             "shmipc_stream_forward(st, st, 3, 0) = 0; shmipc_stream_flush(st) = 0;"
             "shmipc_stream_read_exact_bytes(st, 3, &q, 0) = 0; q = \"fwd\";"
             "shmipc_stream_release(st) = 0;"

             "shmipc_stream_write(NULL, \"x\", 1) = SHMIPC_EINVAL;"
             "shmipc_stream_write(st, NULL, 1) = SHMIPC_EINVAL;"
             "shmipc_stream_reserve(st, 3, NULL) = SHMIPC_EINVAL;"
             "shmipc_stream_reserve(NULL, 3, &w) = SHMIPC_EINVAL;"
             "shmipc_stream_commit(st, 99) = SHMIPC_EINVAL;"
             "shmipc_stream_commit(NULL, 0) = SHMIPC_EINVAL;"
             "shmipc_stream_flush(NULL) = SHMIPC_EINVAL;"
             "shmipc_stream_read_chunk(st, 0, &p, &n, SHMIPC_NONBLOCK) = SHMIPC_EAGAIN;"
             "shmipc_stream_read_chunk(st, 0, NULL, &n, 0) = SHMIPC_EINVAL;"
             "shmipc_stream_read_chunk(NULL, 0, &p, &n, 0) = SHMIPC_EINVAL;"
             "shmipc_stream_read_exact_bytes(st, 1, &q, SHMIPC_NONBLOCK) = SHMIPC_EAGAIN;"
             "shmipc_stream_read_exact_bytes(st, 1, NULL, 0) = SHMIPC_EINVAL;"
             "shmipc_stream_read_exact_bytes(NULL, 1, &q, 0) = SHMIPC_EINVAL;"
             "shmipc_stream_available(NULL) = 0; shmipc_stream_release(NULL) = SHMIPC_EINVAL;"
             "shmipc_stream_forward(st, st, 1, SHMIPC_NONBLOCK) = SHMIPC_EAGAIN;"
             "shmipc_stream_forward(NULL, st, 0, 0) = SHMIPC_EINVAL;"
             "shmipc_stream_forward(st, NULL, 0, 0) = SHMIPC_EINVAL;"
             "shmipc_stream_set_timeout_ms(st, SHMIPC_TIMEOUT_READ, 10000) = 0;"
             "shmipc_stream_set_timeout_ms(st, SHMIPC_TIMEOUT_INITIALIZE, 1) = SHMIPC_EINVAL;"
             "shmipc_stream_set_timeout_ms(NULL, SHMIPC_TIMEOUT_READ, 1) = SHMIPC_EINVAL;"
             "shmipc_stream_set_timeout(st, SHMIPC_TIMEOUT_READ, 0) = 0;"
             "shmipc_stream_read_chunk(st, 0, &p, &n, 0) = SHMIPC_ETIMEDOUT;"
             "shmipc_stream_set_timeout(st, SHMIPC_TIMEOUT_READ, -7) = 0;"
             "shmipc_stream_set_timeout(st, SHMIPC_TIMEOUT_WRITE, 0) = 0;"
             "shmipc_stream_set_timeout(st, SHMIPC_TIMEOUT_INITIALIZE, 1) = SHMIPC_EINVAL;"
             "shmipc_stream_set_timeout(NULL, SHMIPC_TIMEOUT_READ, 1) = SHMIPC_EINVAL");
    interp_finish(&in);
}

static void manager_calls(void **state)
{
    struct interp in;
    (void)state;
    interp_init(&in);
    RUN(&in,
        "shmipc_session_manager_new(addr, cfg, &mm) = 0;"
        "shmipc_session_manager_get_stream(mm, &x) = 0;"
        "shmipc_stream_write(x, \"hi\", 2) = 0; shmipc_stream_flush(x) = 0;"
        "shmipc_stream_read_exact_bytes(x, 2, &p, 0) = 0; p = \"hi\";"
        "shmipc_stream_release(x) = 0; shmipc_session_manager_put_back(mm, x);"
        "shmipc_session_manager_close(mm); shmipc_session_manager_close(NULL);"
        "shmipc_session_manager_new(NULL, cfg, &mm) = SHMIPC_EINVAL;"
        "shmipc_session_manager_new(addr, cfg, NULL) = SHMIPC_EINVAL;"
        "shmipc_session_manager_new(nobody, cfg, &mm) = SHMIPC_ECONNREFUSED;"
        "shmipc_session_manager_get_stream(NULL, &x) = SHMIPC_EINVAL;"
        "shmipc_session_manager_get_stream(m, NULL) = SHMIPC_EINVAL;"
        "shmipc_session_manager_put_back(m, NULL);"
        /* No manager: the stream is closed instead. */
        "shmipc_session_open_stream(client, &y) = 0; shmipc_session_manager_put_back(NULL, y)");
    interp_finish(&in);
}

static void listener_calls(void **state)
{
    struct interp in;
    (void)state;
    interp_init(&in);
    ud.destroyed = 0;
    RUN(&in, "shmipc_listener_new(newaddr, cfg, &l) = 0; shmipc_listener_fileno(l) >= 0;"
             "shmipc_listener_new(newaddr, cfg, &l2) = SHMIPC_EADDRINUSE;"
             "shmipc_listener_accept(l, 0, &s) = SHMIPC_EAGAIN;"
             "shmipc_listener_accept(l, 10, &s) = SHMIPC_ETIMEDOUT;"
             /* A stop before serve makes serve return at once, after destroy(user_data). */
             "shmipc_listener_stop(l) = 0;"
             "shmipc_listener_serve(l, on_stream, on_data, ud, destroy) = 0;"
             "shmipc_listener_close(l); shmipc_listener_close(NULL);"
             /* After shutdown accept and serve fail; serve still frees its user_data. */
             "shmipc_listener_new(newaddr, cfg, &l) = 0; shmipc_listener_shutdown(l) = 0;"
             "shmipc_listener_shutdown(l) = 0; shmipc_listener_accept(l, 0, &s) = SHMIPC_ECLOSED;"
             "shmipc_listener_serve(l, on_stream, on_data, ud, destroy) = SHMIPC_ECLOSED;"
             "shmipc_listener_close(l); shmipc_listener_shutdown(NULL) = SHMIPC_EINVAL;"
             "shmipc_listener_new(NULL, cfg, &l) = SHMIPC_EINVAL;"
             "shmipc_listener_new(newaddr, cfg, NULL) = SHMIPC_EINVAL;"
             "shmipc_listener_accept(NULL, 0, &s) = SHMIPC_EINVAL;"
             "shmipc_listener_accept(idle, 1, &s) = SHMIPC_ETIMEDOUT;"
             "shmipc_listener_accept(idle, 0, NULL) = SHMIPC_EINVAL;"
             "shmipc_listener_fileno(NULL) = SHMIPC_EINVAL;"
             "shmipc_listener_serve(NULL, on_stream, on_data, NULL, NULL) = SHMIPC_EINVAL;"
             "shmipc_listener_serve(idle, NULL, on_data, NULL, NULL) = SHMIPC_EINVAL;"
             "shmipc_listener_stop(NULL) = SHMIPC_EINVAL");
    assert_int_equal(ud.destroyed, 2);

    /* A real accept: the client connects on another thread. */
    pthread_t t;
    void *client;
    assert_int_equal(pthread_create(&t, NULL, connect_main, env.acc_addr), 0);
    interp_handle(&in, "acc", SHMIPC_ABI_KIND_LISTENER, env.acc);
    RUN(&in, "shmipc_listener_accept(acc, 10000, &s) = 0; shmipc_session_version(s) = 3");
    pthread_join(t, &client);
    assert_non_null(client);
    interp_finish(&in);
    shmipc_session_close(client);
}

/* ------------------------------------------------------------------------------------ */
/* The HTTP server, with a handler that calls the request and response functions         */
/* ------------------------------------------------------------------------------------ */

static int cb_handler(shmipc_http_request *req, shmipc_http_response *res, void *user_data)
{
    struct user_data *u = user_data;
    struct interp in;
    memset(&in, 0, sizeof in);
    /* No cmocka assertions here: this runs on a worker thread. */
    struct var *v = var_bind(&in, "req");
    v->type = SHMIPC_ABI_HANDLE, v->kind = SHMIPC_ABI_KIND_HTTP_REQUEST, v->env = 1, v->v.p = req;
    v = var_bind(&in, "res");
    v->type = SHMIPC_ABI_HANDLE, v->kind = SHMIPC_ABI_KIND_HTTP_RESPONSE, v->env = 1, v->v.p = res;
    int rc = interp_run(
        &in,
        "shmipc_http_request_method(req, &n) = \"GET\"; n = 3;"
        "shmipc_http_request_path(req, &n) = \"/abi/7\";"
        "shmipc_http_request_query(req, &n) = \"x=1\";"
        "shmipc_http_request_wildcard(req, &n) = \"7\";"
        "shmipc_http_request_header(req, \"x-test\", &n) = \"yes\";"
        "shmipc_http_request_header(req, \"x-none\", &n) = NULL;"
        "!shmipc_http_request_header(req, NULL, &n) = NULL;"
        "shmipc_http_request_header_count(req) = 3;"
        "shmipc_http_request_header_at(req, 1, &name, &nl, &n) = \"yes\"; name = \"X-Test\";"
        "!shmipc_http_request_header_at(req, 9, &name, &nl, &n) = NULL;"
        "shmipc_http_request_body(req, &n) = \"\"; shmipc_http_request_version(req) = 11;"
        "shmipc_http_request_method(NULL, &n) = NULL; shmipc_http_request_path(NULL, &n) = NULL;"
        "shmipc_http_request_query(NULL, &n) = NULL;"
        "shmipc_http_request_wildcard(NULL, &n) = NULL;"
        "shmipc_http_request_header_count(NULL) = 0; shmipc_http_request_body(NULL, &n) = NULL;"
        "shmipc_http_request_version(NULL) = SHMIPC_EINVAL;"
        "shmipc_http_response_set_status(res, 42) = SHMIPC_EINVAL;"
        "shmipc_http_response_set_status(NULL, 200) = SHMIPC_EINVAL;"
        "shmipc_http_response_add_header(res, \"Content-Length\", \"5\") = SHMIPC_EINVAL;"
        "shmipc_http_response_add_header(res, NULL, \"x\") = SHMIPC_EINVAL;"
        "shmipc_http_response_body(NULL, \"x\", 1) = SHMIPC_EINVAL;"
        "shmipc_http_response_body(res, NULL, 1) = SHMIPC_EINVAL;"
        "shmipc_http_response_set_status(res, 201) = 0;"
        "shmipc_http_response_add_header(res, \"X-Abi\", \"1\") = 0;"
        "shmipc_http_response_body(res, \"ok\", 2) = 0; shmipc_http_response_end(res) = 0;"
        "shmipc_http_response_set_status(res, 200) = SHMIPC_EBUSY;"
        "shmipc_http_response_end(NULL) = SHMIPC_EINVAL");
    if (rc < 0)
        snprintf(u->err, sizeof u->err, "%s", in.err);
    __atomic_add_fetch(&u->handled, 1, __ATOMIC_RELEASE);
    in.nvars = 0;
    return 0;
}

/* "/later/send": deferred, then answered through the table from the handler's own thread
 * (any thread may); "/later/free": deferred, then given up (500). */
static int cb_defer_handler(shmipc_http_request *req, shmipc_http_response *res, void *user_data)
{
    struct user_data *u = user_data;
    struct interp in;
    size_t len;
    const char *path = shmipc_http_request_path(req, &len);
    memset(&in, 0, sizeof in);
    struct var *v = var_bind(&in, "res");
    v->type = SHMIPC_ABI_HANDLE, v->kind = SHMIPC_ABI_KIND_HTTP_RESPONSE, v->env = 1, v->v.p = res;
    int rc = interp_run(
        &in, "shmipc_http_response_defer(res, 0, pending_end, ud, &p) = SHMIPC_EINVAL;"
             "shmipc_http_response_defer(NULL, 100, pending_end, ud, &p) = SHMIPC_EINVAL;"
             "shmipc_http_response_defer(res, 5000, pending_end, ud, &p) = 0;"
             "shmipc_http_response_defer(res, 5000, pending_end, ud, &q) = SHMIPC_EBUSY;"
             "shmipc_http_pending_set_status(p, 42) = SHMIPC_EINVAL;"
             "shmipc_http_pending_set_status(NULL, 200) = SHMIPC_EINVAL;"
             "shmipc_http_pending_add_header(p, \"Content-Length\", \"5\") = SHMIPC_EINVAL;"
             "shmipc_http_pending_add_header(NULL, \"a\", \"b\") = SHMIPC_EINVAL;"
             "shmipc_http_pending_body(NULL, \"x\", 1) = SHMIPC_EINVAL;"
             "shmipc_http_pending_send(NULL) = SHMIPC_EINVAL; shmipc_http_pending_free(NULL);"
             "shmipc_http_pending_waiting(p) = 1; shmipc_http_pending_waiting(NULL) = 0;"
             "shmipc_http_pending_set_status(p, 202) = 0;"
             "shmipc_http_pending_add_header(p, \"X-Later\", \"1\") = 0;"
             "shmipc_http_pending_body(p, \"later\", 5) = 0");
    if (rc == 0)
        rc = interp_run(&in, len == 11 && memcmp(path, "/later/send", 11) == 0
                                 ? "shmipc_http_pending_send(p) = 0"
                                 : "shmipc_http_pending_free(p)");
    if (rc < 0)
        snprintf(u->err, sizeof u->err, "%s", in.err);
    __atomic_add_fetch(&u->handled, 1, __ATOMIC_RELEASE);
    in.nvars = 0;
    return 0;
}

static void cb_pending_end(void *user_data, int reason)
{
    struct user_data *u = user_data;
    __atomic_or_fetch(&u->pending_reasons, 1 << reason, __ATOMIC_RELAXED);
    __atomic_add_fetch(&u->pending_ends, 1, __ATOMIC_RELEASE);
}

/* Sends one request to 127.0.0.1:port and returns the whole response (Connection: close). */
static void http_get(int port, const char *request, char *out, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    size_t got = 0;
    assert_true(fd >= 0);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(write(fd, request, strlen(request)), (ssize_t)strlen(request));
    for (;;) {
        ssize_t n = read(fd, out + got, cap - 1 - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    out[got] = '\0';
    close(fd);
}

static void server_calls(void **state)
{
    struct interp in;
    char resp[4096];
    (void)state;
    interp_init(&in);
    memset(&ud, 0, sizeof ud);
    RUN(&in,
        "shmipc_server_config_new(&sc) = 0;"
        "shmipc_server_config_set_address(sc, \"127.0.0.1\") = 0;"
        "shmipc_server_config_set_port(sc, 0) = 0; shmipc_server_config_set_workers(sc, 1) = 0;"
        "shmipc_server_config_set_backend(sc, SHMIPC_BACKEND_DEFAULT) = 0;"
        "shmipc_server_config_set_timeout_ms(sc, SHMIPC_SERVER_TIMEOUT_STOP, 1000) = 0;"
        "shmipc_server_config_set_limit(sc, SHMIPC_SERVER_LIMIT_BODY, 4096) = 0;"
        "shmipc_server_config_set_server_name(sc, \"abi-test\") = 0;"
        "shmipc_server_config_set_address(sc, \"not an address\") = SHMIPC_EINVAL;"
        "shmipc_server_config_set_address(NULL, \"::1\") = SHMIPC_EINVAL;"
        "shmipc_server_config_set_port(sc, 70000) = SHMIPC_EINVAL;"
        "shmipc_server_config_set_port(NULL, 0) = SHMIPC_EINVAL;"
        "shmipc_server_config_set_workers(sc, 5000) = SHMIPC_EINVAL;"
        "shmipc_server_config_set_workers(NULL, 1) = SHMIPC_EINVAL;"
        "shmipc_server_config_set_backend(sc, 99) = SHMIPC_EINVAL;"
        "shmipc_server_config_set_backend(NULL, 0) = SHMIPC_EINVAL;"
        "shmipc_server_config_set_timeout_ms(sc, 99, 1) = SHMIPC_EINVAL;"
        "shmipc_server_config_set_timeout_ms(NULL, 0, 1) = SHMIPC_EINVAL;"
        "shmipc_server_config_set_timeout(sc, SHMIPC_SERVER_TIMEOUT_KEEPALIVE, 0) = 0;"
        "shmipc_server_config_set_timeout(sc, SHMIPC_SERVER_TIMEOUT_KEEPALIVE, 60000) = 0;"
        "shmipc_server_config_set_timeout(sc, SHMIPC_SERVER_TIMEOUT_HEADER, 0) = SHMIPC_EINVAL;"
        "shmipc_server_config_set_timeout(sc, SHMIPC_SERVER_TIMEOUT_WS_PING, -1) = 0;"
        "shmipc_server_config_set_timeout(sc, 99, 1) = SHMIPC_EINVAL;"
        "shmipc_server_config_set_timeout(NULL, 0, 1) = SHMIPC_EINVAL;"
        "shmipc_server_config_set_limit(sc, 99, 1) = SHMIPC_EINVAL;"
        "shmipc_server_config_set_limit(NULL, 0, 1) = SHMIPC_EINVAL;"
        "shmipc_server_config_set_server_name(sc, \"bad\\tname\") = SHMIPC_EINVAL;"
        "shmipc_server_config_set_server_name(NULL, \"x\") = SHMIPC_EINVAL;"
        "shmipc_server_config_set_reuse_port(sc, 2) = SHMIPC_EINVAL;"
        "shmipc_server_config_set_reuse_port(NULL, 1) = SHMIPC_EINVAL;"
        "shmipc_server_config_set_reuse_port(sc, 1) = 0;"
        "shmipc_server_config_set_reuse_port(sc, 0) = 0;"
        "shmipc_server_config_new(NULL) = SHMIPC_EINVAL; shmipc_server_config_free(NULL);"

        "shmipc_server_new(sc, &srv) = 0; shmipc_server_config_free(sc);"
        "shmipc_server_new(NULL, NULL) = SHMIPC_EINVAL;"
        "shmipc_server_route(srv, \"GET\", \"/abi/*\", handler, ud, destroy) = 0;"
        "shmipc_server_route(srv, \"GET\", \"/abi/*\", handler, NULL, NULL) = SHMIPC_EEXIST;"
        "shmipc_server_route(srv, \"GET\", \"/later/*\", defer_handler, ud, NULL) = 0;"
        "shmipc_server_route(NULL, \"GET\", \"/x\", handler, NULL, NULL) = SHMIPC_EINVAL;"
        "shmipc_server_route(srv, \"GET\", \"/y\", NULL, NULL, NULL) = SHMIPC_EINVAL;"
        "shmipc_server_static(srv, NULL, \"/static\", 200, \"text/plain\", \"static!\", 7) = 0;"
        "shmipc_server_static(srv, NULL, \"/bad\", 42, NULL, \"\", 0) = SHMIPC_EINVAL;"
        "shmipc_server_static(NULL, NULL, \"/x\", 200, NULL, \"\", 0) = SHMIPC_EINVAL;"
        "shmipc_server_port(srv) = SHMIPC_EINVAL; shmipc_server_backend(srv) = NULL;"
        "shmipc_server_start(srv) = 0; shmipc_server_port(srv) >= 1;"
        "shmipc_server_backend(srv) != NULL; shmipc_server_start(srv) = 0;"
        "shmipc_server_route(srv, \"GET\", \"/late\", handler, NULL, NULL) = SHMIPC_EBUSY;"
        "shmipc_server_start(NULL) = SHMIPC_EINVAL; shmipc_server_run(NULL) = SHMIPC_EINVAL;"
        "shmipc_server_stop(NULL) = SHMIPC_EINVAL; shmipc_server_port(NULL) = SHMIPC_EINVAL;"
        "shmipc_server_backend(NULL) = NULL; shmipc_server_free(NULL); shmipc_server_close(NULL)");

    int port = shmipc_server_port(interp_get(&in, "srv"));
    http_get(port,
             "GET /abi/7?x=1 HTTP/1.1\r\nHost: a\r\nX-Test:  yes \r\nConnection: close\r\n\r\n",
             resp, sizeof resp);
    if (ud.err[0] != '\0')
        fail_msg("handler: %s", ud.err);
    assert_int_equal(__atomic_load_n(&ud.handled, __ATOMIC_ACQUIRE), 1);
    assert_non_null(strstr(resp, "HTTP/1.1 201"));
    assert_non_null(strstr(resp, "X-Abi: 1\r\n"));
    assert_non_null(strstr(resp, "\r\n\r\nok"));
    http_get(port, "GET /static HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", resp,
             sizeof resp);
    assert_non_null(strstr(resp, "\r\n\r\nstatic!"));
    http_get(port, "GET /later/send HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", resp,
             sizeof resp);
    if (ud.err[0] != '\0')
        fail_msg("defer handler: %s", ud.err);
    assert_non_null(strstr(resp, "HTTP/1.1 202"));
    assert_non_null(strstr(resp, "X-Later: 1\r\n"));
    assert_non_null(strstr(resp, "\r\n\r\nlater"));
    http_get(port, "GET /later/free HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", resp,
             sizeof resp);
    if (ud.err[0] != '\0')
        fail_msg("defer handler: %s", ud.err);
    assert_non_null(strstr(resp, "HTTP/1.1 500"));
    assert_int_equal(__atomic_load_n(&ud.pending_ends, __ATOMIC_ACQUIRE), 2);
    assert_int_equal(ud.pending_reasons,
                     (1 << SHMIPC_HTTP_PENDING_SENT) | (1 << SHMIPC_HTTP_PENDING_ABANDONED));

    /* A stop before run makes run return at once; free calls the route's destroy. */
    RUN(&in, "shmipc_server_stop(srv) = 0; shmipc_server_run(srv) = 0; shmipc_server_close(srv)");
    assert_int_equal(ud.destroyed, 1);
    interp_finish(&in);
}

/* ------------------------------------------------------------------------------------ */
/* WebSocket: callbacks that call the connection's functions through the table           */
/* ------------------------------------------------------------------------------------ */

/* What the WebSocket callbacks saw (they run on the worker thread: no assertions there). */
static struct {
    int opened, messages, closes, close_code;
    char reason[128];
    char err[768];
} wsu;

static int ws_script(shmipc_ws *ws, const shmipc_http_request *req, const char *script)
{
    struct interp in;
    memset(&in, 0, sizeof in);
    struct var *v = var_bind(&in, "ws");
    v->type = SHMIPC_ABI_HANDLE, v->kind = SHMIPC_ABI_KIND_WS, v->env = 1, v->v.p = ws;
    if (req != NULL) {
        v = var_bind(&in, "req");
        v->type = SHMIPC_ABI_HANDLE, v->kind = SHMIPC_ABI_KIND_HTTP_REQUEST, v->env = 1;
        v->v.p = (void *)req;
    }
    int rc = interp_run(&in, script);
    if (rc < 0 && wsu.err[0] == '\0')
        snprintf(wsu.err, sizeof wsu.err, "%s", in.err);
    in.nvars = 0;
    return rc;
}

static int cb_ws_open(shmipc_ws *ws, const shmipc_http_request *req, void *user_data)
{
    (void)user_data;
    wsu.opened++;
    /* The server prefers chat; the client offers superchat first. */
    return ws_script(ws, req,
                     "shmipc_ws_subprotocol(ws) = \"chat\"; shmipc_ws_subprotocol(NULL) = NULL;"
                     "shmipc_http_request_path(req, &n) = \"/ws\"; n = 3;"
                     "shmipc_ws_set_data(ws, ud); !shmipc_ws_set_data(NULL, ud)");
}

static void cb_ws_message(shmipc_ws *ws, int kind, const void *data, size_t len, void *user_data)
{
    (void)user_data;
    wsu.messages++;
    if (kind != SHMIPC_WS_TEXT || len != 2 || memcmp(data, "hi", 2) != 0 ||
        shmipc_ws_data(ws) != (void *)&ud)
        snprintf(wsu.err, sizeof wsu.err, "on_message: kind %d, %zu bytes", kind, len);
    ws_script(ws, NULL,
              "shmipc_ws_send(ws, 1, \"echo\", 4) = 0; shmipc_ws_send(ws, 7, \"x\", 1) = "
              "SHMIPC_EINVAL; shmipc_ws_send(NULL, 1, \"x\", 1) = SHMIPC_EINVAL;"
              "shmipc_ws_ping(ws, \"p\", 1) = 0; shmipc_ws_ping(NULL, \"p\", 1) = SHMIPC_EINVAL;"
              "shmipc_ws_close(ws, 1004, NULL) = SHMIPC_EINVAL;"
              "shmipc_ws_close(NULL, 1000, NULL) = SHMIPC_EINVAL;"
              "shmipc_ws_close(ws, 1000, \"bye\") = 0; shmipc_ws_close(ws, 1000, NULL) = "
              "SHMIPC_EPIPE; shmipc_ws_send(ws, 2, \"late\", 4) = SHMIPC_EPIPE");
}

static void cb_ws_close(shmipc_ws *ws, int code, const char *reason, size_t len, void *user_data)
{
    (void)ws;
    (void)user_data;
    wsu.closes++;
    wsu.close_code = code;
    snprintf(wsu.reason, sizeof wsu.reason, "%.*s", (int)len, reason);
}

/* Reads exactly n bytes or fails. */
static void read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        assert_true(r > 0);
        got += (size_t)r;
    }
}

static void ws_calls(void **state)
{
    struct interp in;
    (void)state;
    interp_init(&in);
    memset(&ud, 0, sizeof ud);
    memset(&wsu, 0, sizeof wsu);
    RUN(&in,
        "shmipc_server_config_new(&sc) = 0;"
        "shmipc_server_config_set_port(sc, 0) = 0; shmipc_server_config_set_workers(sc, 1) = 0;"
        "shmipc_server_config_set_limit(sc, 5, 1048576) = 0;"
        "shmipc_server_config_set_limit(sc, 5, 2147483648) = SHMIPC_EINVAL;"
        "shmipc_server_new(sc, &srv) = 0; shmipc_server_config_free(sc);"
        "shmipc_server_websocket(srv, \"/ws\", \"chat, superchat\", ws_open, ws_message, "
        "ws_close, ud, destroy) = 0;"
        "shmipc_server_websocket(srv, \"/ws\", NULL, NULL, ws_message, NULL, NULL, NULL) = "
        "SHMIPC_EEXIST;"
        "shmipc_server_websocket(srv, \"/p\", \"no good\", NULL, ws_message, NULL, NULL, NULL) = "
        "SHMIPC_EINVAL;"
        "shmipc_server_websocket(srv, \"/x\", NULL, NULL, NULL, NULL, NULL, NULL) = "
        "SHMIPC_EINVAL;"
        "shmipc_server_websocket(NULL, \"/x\", NULL, NULL, ws_message, NULL, NULL, NULL) = "
        "SHMIPC_EINVAL;"
        "shmipc_server_start(srv) = 0;"
        "shmipc_server_websocket(srv, \"/y\", NULL, NULL, ws_message, NULL, NULL, NULL) = "
        "SHMIPC_EBUSY");

    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port =
                                 htons((uint16_t)shmipc_server_port(interp_get(&in, "srv")))};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    /* The upgrade and a masked text frame "hi" (key 0) in one write. */
    static const char req[] = "GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n"
                              "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                              "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                              "Sec-WebSocket-Protocol: superchat, chat\r\n\r\n"
                              "\x81\x82\0\0\0\0hi";
    assert_int_equal(write(fd, req, sizeof req - 1), (ssize_t)sizeof req - 1);
    char head[1024];
    size_t n = 0;
    while (n < 4 || memcmp(head + n - 4, "\r\n\r\n", 4) != 0) {
        assert_true(n < sizeof head);
        read_full(fd, head + n, 1);
        n++;
    }
    head[n] = '\0';
    assert_non_null(strstr(head, "HTTP/1.1 101 "));
    assert_non_null(strstr(head, "Sec-WebSocket-Protocol: chat\r\n"));
    /* The echo, the ping, the close with 1000 "bye". */
    static const char want[] = "\x81\x04"
                               "echo"
                               "\x89\x01p"
                               "\x88\x05\x03\xe8"
                               "bye";
    char got[sizeof want - 1];
    read_full(fd, got, sizeof got);
    assert_memory_equal(got, want, sizeof got);
    /* The client's close answer ends it: the server closes first. */
    static const char close_frame[] = "\x88\x82\0\0\0\0\x03\xe8";
    assert_int_equal(write(fd, close_frame, sizeof close_frame - 1),
                     (ssize_t)sizeof close_frame - 1);
    assert_int_equal(read(fd, got, 1), 0);
    close(fd);
    RUN(&in, "shmipc_server_stop(srv) = 0; shmipc_server_run(srv) = 0; shmipc_server_free(srv)");
    if (wsu.err[0] != '\0')
        fail_msg("websocket callbacks: %s", wsu.err);
    assert_int_equal(wsu.opened, 1);
    assert_int_equal(wsu.messages, 1);
    assert_int_equal(wsu.closes, 1);
    assert_int_equal(wsu.close_code, 1000);
    assert_int_equal(ud.destroyed, 1);
    interp_finish(&in);
}

/* ------------------------------------------------------------------------------------ */
/* Closures: a "script" function turned into a C function pointer                       */
/* ------------------------------------------------------------------------------------ */

/* A closure's state: what a script runtime would keep for its callable. */
struct script_fn {
    const shmipc_abi_fn *sig; /* the callback type it implements */
    int calls;
    int retired; /* set once the registration ended: a call then is a bug */
    int late_calls;
    int last_level;
    char last_line[1024];
};

/* Guards what the trampoline records: a sink may run on several threads at once. */
static pthread_mutex_t record = PTHREAD_MUTEX_INITIALIZER;

/*
 * The generic handler every closure runs: it decodes its arguments by the callback's
 * descriptor alone, as a binding's trampoline into the script would.
 */
static void script_trampoline(ffi_cif *cif, void *ret, void **args, void *user)
{
    struct script_fn *f = user;
    (void)cif;
    (void)ret;
    if (__atomic_load_n(&f->retired, __ATOMIC_ACQUIRE))
        __atomic_add_fetch(&f->late_calls, 1, __ATOMIC_RELAXED);
    /* A sink may run on several threads at once. */
    pthread_mutex_lock(&record);
    for (int i = 0; i < f->sig->nparams; i++) {
        if (f->sig->params[i].type == SHMIPC_ABI_I32)
            f->last_level = *(int *)args[i];
        else if (f->sig->params[i].type == SHMIPC_ABI_CSTR)
            snprintf(f->last_line, sizeof f->last_line, "%s", *(const char **)args[i]);
    }
    pthread_mutex_unlock(&record);
    __atomic_add_fetch(&f->calls, 1, __ATOMIC_RELEASE);
}

struct closure {
    ffi_closure *closure;
    void *code;
    ffi_cif cif;
    ffi_type *args[MAX_PARAMS];
};

static void closure_make(struct closure *c, struct script_fn *f, int kind)
{
    f->sig = shmipc_abi_callback(kind);
    assert_non_null(f->sig);
    assert_int_equal(prep_cif(&c->cif, c->args, f->sig), 0);
    c->closure = ffi_closure_alloc(sizeof(ffi_closure), &c->code);
    assert_non_null(c->closure);
    assert_int_equal(ffi_prep_closure_loc(c->closure, &c->cif, script_trampoline, f, c->code),
                     FFI_OK);
}

/* Installs a sink through the table, as a binding would: shmipc_set_log_sink by ffi_call. */
static void set_sink_generic(void *code)
{
    int idx = call_index("shmipc_set_log_sink");
    assert_true(idx >= 0);
    void *argv[1] = {&code};
    ffi_call(&calls[idx].cif, calls[idx].d->fn, NULL, argv);
}

/* A client that sends a bad handshake, so that the listener logs a warning. */
static void bad_handshake(void)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    const char *name = env.idle_addr + strlen("unix:@");
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    memcpy(sa.sun_path + 1, name, strlen(name));
    assert_int_equal(
        connect(fd, (struct sockaddr *)&sa,
                (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name))),
        0);
    static const char junk[64] = "this is no shmipc handshake";
    assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
    close(fd);
    shmipc_session *s = NULL;
    int rc = shmipc_listener_accept(env.idle, 300, &s);
    assert_true(rc == SHMIPC_ETIMEDOUT || rc == SHMIPC_EAGAIN);
}

static void log_sink_from_a_closure(void **state)
{
    struct script_fn f = {0};
    struct closure c;
    (void)state;
    closure_make(&c, &f, SHMIPC_ABI_KIND_LOG_SINK);
    set_sink_generic(c.code);

    if (shmipc__log_level() >= SHMIPC__LOG_WARN) {
        bad_handshake();
        /* The handshake, and its warning, run on one of the listener's threads. */
        for (int i = 0; i < 5000 && __atomic_load_n(&f.calls, __ATOMIC_ACQUIRE) < 1; i++)
            usleep(1000);
        assert_true(__atomic_load_n(&f.calls, __ATOMIC_ACQUIRE) >= 1);
        pthread_mutex_lock(&record);
        int level = f.last_level;
        int said = strstr(f.last_line, "handshake failed") != NULL;
        pthread_mutex_unlock(&record);
        assert_int_equal(level, SHMIPC_LOG_WARN);
        assert_true(said);
    }
    if (shmipc__log_level() >= SHMIPC__LOG_ERROR) {
        int before = __atomic_load_n(&f.calls, __ATOMIC_ACQUIRE);
        shmipc__log(SHMIPC__LOG_ERROR, "abi test line %d", 42);
        assert_int_equal(__atomic_load_n(&f.calls, __ATOMIC_ACQUIRE), before + 1);
        assert_int_equal(f.last_level, SHMIPC_LOG_ERROR);
        char want[64];
        snprintf(want, sizeof want, "shmipc[%d] error: abi test line 42", (int)getpid());
        assert_string_equal(f.last_line, want); /* no trailing newline */
    }

    /* NULL restores stderr: the closure hears nothing more, stderr gets the line. */
    set_sink_generic(NULL);
    f.retired = 1;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    int saved = dup(2);
    dup2(fds[1], 2);
    shmipc__log(SHMIPC__LOG_ERROR, "abi test after the sink");
    dup2(saved, 2);
    close(saved);
    close(fds[1]);
    char buf[256] = {0};
    assert_true(read(fds[0], buf, sizeof buf - 1) > 0);
    close(fds[0]);
    assert_non_null(strstr(buf, "abi test after the sink\n"));
    assert_int_equal(f.late_calls, 0);
    ffi_closure_free(c.closure);
}

/* Threads log while the sink changes: once set_log_sink returns, the old sink is never run. */
struct logger {
    pthread_t t;
    int stop;
};

static void *logger_main(void *arg)
{
    struct logger *l = arg;
    while (!__atomic_load_n(&l->stop, __ATOMIC_ACQUIRE))
        shmipc__log(SHMIPC__LOG_ERROR, "abi swap test");
    return NULL;
}

static void log_sink_swaps_under_load(void **state)
{
    enum { THREADS = 3, SWAPS = 200 };
    struct logger loggers[THREADS] = {0};
    struct script_fn *f = calloc(SWAPS, sizeof *f);
    struct closure *c = calloc(SWAPS, sizeof *c);
    (void)state;
    assert_non_null(f);
    assert_non_null(c);
    closure_make(&c[0], &f[0], SHMIPC_ABI_KIND_LOG_SINK);
    set_sink_generic(c[0].code);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&loggers[i].t, NULL, logger_main, &loggers[i]), 0);
    for (int i = 1; i < SWAPS; i++) {
        /* Let the loggers reach the current sink before it is replaced. */
        for (int spin = 0; spin < 1000000 && !__atomic_load_n(&f[i - 1].calls, __ATOMIC_ACQUIRE);
             spin++)
            sched_yield();
        closure_make(&c[i], &f[i], SHMIPC_ABI_KIND_LOG_SINK);
        set_sink_generic(c[i].code);
        __atomic_store_n(&f[i - 1].retired, 1, __ATOMIC_RELEASE);
        /* Freed at once, as a binding frees a closure when its registration ends. */
        ffi_closure_free(c[i - 1].closure);
        c[i - 1].closure = NULL;
    }
    for (int i = 0; i < THREADS; i++) {
        __atomic_store_n(&loggers[i].stop, 1, __ATOMIC_RELEASE);
        pthread_join(loggers[i].t, NULL);
    }
    set_sink_generic(NULL);
    ffi_closure_free(c[SWAPS - 1].closure);
    int reached = 0;
    for (int i = 0; i < SWAPS; i++) {
        assert_int_equal(f[i].late_calls, 0);
        reached += f[i].calls > 0;
    }
    assert_true(reached > SWAPS / 2);
    free(f);
    free(c);
}

/* A callback with user data: listener_serve with closures for on_stream, on_data, destroy. */
static struct closure serve_stream, serve_data, serve_destroy;
static struct script_fn serve_fn[3];

static void serve_from_closures(void **state)
{
    (void)state;
    struct interp in;
    interp_init(&in);
    closure_make(&serve_stream, &serve_fn[0], SHMIPC_ABI_KIND_STREAM_CB);
    closure_make(&serve_data, &serve_fn[1], SHMIPC_ABI_KIND_STREAM_CB);
    closure_make(&serve_destroy, &serve_fn[2], SHMIPC_ABI_KIND_DESTROY_CB);
    RUN(&in, "shmipc_listener_new(newaddr, cfg, &l) = 0; shmipc_listener_stop(l) = 0");
    int idx = call_index("shmipc_listener_serve");
    void *l = interp_get(&in, "l"), *user = &serve_fn;
    void *argv[5] = {&l, &serve_stream.code, &serve_data.code, &user, &serve_destroy.code};
    ffi_sarg rc = -1;
    ffi_call(&calls[idx].cif, calls[idx].d->fn, &rc, argv);
    assert_int_equal((int)rc, 0);
    assert_int_equal(serve_fn[2].calls, 1); /* destroy(user_data), once */
    interp_finish(&in);
    ffi_closure_free(serve_stream.closure);
    ffi_closure_free(serve_data.closure);
    ffi_closure_free(serve_destroy.closure);
}

/*
 * The shmipc-serve handler calls: a script serves a request stream with a handler closure
 * (shmipc_serve_handle_stream), and the handler writes its body through the table
 * (shmipc_serve_write), with valid and invalid arguments each.
 */
static int serve_handler_calls_seen;

static int cb_serve_handler(shmipc_serve_exchange *x, void *user_data)
{
    assert_ptr_equal(user_data, &ud);
    const shmipc_serve_request *req = shmipc_serve_exchange_request(x);
    assert_non_null(req);
    assert_memory_equal(req->method, "GET", 3);
    assert_null(shmipc_serve_exchange_request(NULL));
    /* Misuse: each refused without sending anything, and the exchange goes on. */
    char b[4];
    assert_int_equal(shmipc_serve_read(NULL, b, sizeof b), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_read(x, NULL, sizeof b), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_read(x, b, 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_read(x, b, sizeof b), 0);         /* no body: its end at once */
    assert_int_equal(shmipc_serve_write(x, "a", 1), SHMIPC_EINVAL); /* no head yet */
    /* The WebSocket calls on an HTTP request: refused, the request goes on. */
    uint32_t wfl = 0;
    assert_int_equal(shmipc_serve_ws_recv(x, b, sizeof b, &wfl, 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_ws_send(x, SHMIPC_SERVE_WS_TEXT, "a", 1), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_ws_close(x, 1000, NULL, 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_ws_accept(x, NULL, NULL, 0), SHMIPC_EINVAL); /* no upgrade */
    shmipc_serve_response r = {.size = sizeof r, .status = 101};
    assert_int_equal(shmipc_serve_respond(x, NULL, NULL, 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_respond(NULL, &r, NULL, 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_respond(x, &r, NULL, 0), SHMIPC_EINVAL); /* no 1xx */
    r.status = 600;
    assert_int_equal(shmipc_serve_respond(x, &r, NULL, 0), SHMIPC_EINVAL);
    r.status = 200;
    r.size = sizeof r.size;
    assert_int_equal(shmipc_serve_respond(x, &r, NULL, 0), SHMIPC_EINVAL);
    r.size = sizeof r;
    r.flags = SHMIPC_SERVE_RESP_CONTENT_LENGTH;
    r.content_length = 2;
    assert_int_equal(shmipc_serve_respond(x, &r, NULL, 0), 0);
    assert_int_equal(shmipc_serve_respond(x, &r, NULL, 0), SHMIPC_EINVAL); /* once */
    struct interp in;
    interp_init(&in);
    interp_handle(&in, "x", SHMIPC_ABI_KIND_SERVE_EXCHANGE, x);
    RUN(&in, "shmipc_serve_write(x, \"hi\", 2) = 0;"
             "shmipc_serve_write(NULL, \"hi\", 2) = SHMIPC_EINVAL;"
             "shmipc_serve_write(x, NULL, 1) = SHMIPC_EINVAL");
    interp_finish(&in);
    serve_handler_calls_seen++;
    return 0;
}

static void serve_handler_calls(void **state)
{
    (void)state;
    uint8_t buf[256];
    shmipc_stream *cst;
    shmipc_serve_request rq = {.size = sizeof rq,
                               .version_minor = 1,
                               .method = (const uint8_t *)"GET",
                               .method_len = 3,
                               .target = (const uint8_t *)"/",
                               .target_len = 1};
    int64_t n = shmipc_serve_encode_request_head(buf, sizeof buf, &rq, NULL, 0);
    assert_true(n > 0);
    assert_int_equal(
        shmipc_serve_encode_header(buf + n, sizeof buf - (size_t)n, SHMIPC_SERVE_END, 0, 0), 12);
    assert_int_equal(shmipc_session_open_stream(env.client2, &cst), 0);
    assert_int_equal(shmipc_stream_write(cst, buf, (size_t)n + 12), 0);
    assert_int_equal(shmipc_stream_flush(cst), 0);
    struct interp in;
    interp_init(&in);
    RUN(&in, "shmipc_session_accept_stream(server, 10000, &sst) = 0;"
             "shmipc_serve_handle_stream(sst, serve_handler, ud) = 0;"
             "shmipc_serve_handle_stream(NULL, serve_handler, ud) = SHMIPC_EINVAL");
    interp_finish(&in);
    assert_int_equal(serve_handler_calls_seen, 1);
    /* The front's side got the head, the two bytes and END. */
    const void *p;
    assert_int_equal(shmipc_stream_read_exact_bytes(cst, 12, &p, 0), 0);
    shmipc_serve_frame f = {.size = sizeof f};
    assert_int_equal(shmipc_serve_decode_header(p, 12, &f), 12);
    assert_int_equal(f.type, SHMIPC_SERVE_RESPONSE_HEAD);
    uint32_t skip = f.length;
    shmipc_stream_release(cst);
    assert_int_equal(shmipc_stream_read_exact_bytes(cst, skip + 12 + 2 + 12, &p, 0), 0);
    assert_memory_equal((const uint8_t *)p + skip + 12, "hi", 2);
    assert_int_equal(shmipc_serve_decode_header((const uint8_t *)p + skip + 14, 12, &f), 12);
    assert_int_equal(f.type, SHMIPC_SERVE_END);
    shmipc_stream_release(cst);
    shmipc_stream_close(cst);
}

/*
 * The WebSocket handler calls: a handler accepts an upgrade, then sends a message and closes
 * through the table (shmipc_serve_ws_send, _ws_close, shmipc_serve_shutdown), with valid and
 * invalid arguments each; the front's close was written beforehand (one thread plays both).
 */
static int serve_ws_handler_seen;

static int cb_serve_ws_handler(shmipc_serve_exchange *x, void *user_data)
{
    (void)user_data;
    assert_int_equal(shmipc_serve_ws_send(x, SHMIPC_SERVE_WS_TEXT, "a", 1), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_ws_accept(x, "nope", NULL, 0), SHMIPC_EINVAL); /* not offered */
    assert_int_equal(shmipc_serve_ws_accept(x, NULL, NULL, 0), 0);
    assert_int_equal(shmipc_serve_ws_accept(x, NULL, NULL, 0), SHMIPC_EINVAL); /* once */
    assert_int_equal(shmipc_serve_write(x, "a", 1), SHMIPC_EINVAL);            /* not HTTP now */
    /* The request-only calls on the accepted WebSocket: refused (shmipc_serve_read returned
     * 0, the end of a body, as if there were a request body to read). */
    char rb[4];
    assert_int_equal(shmipc_serve_read(x, rb, sizeof rb), SHMIPC_EINVAL);
    shmipc_serve_response hr = {.size = sizeof hr, .status = 200};
    assert_int_equal(shmipc_serve_respond(x, &hr, NULL, 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_ws_closed(x, NULL, 0, NULL), 0);
    struct interp in;
    interp_init(&in);
    interp_handle(&in, "x", SHMIPC_ABI_KIND_SERVE_EXCHANGE, x);
    RUN(&in, "shmipc_serve_ws_send(x, 1, \"hi\", 2) = 0;"
             "shmipc_serve_ws_send(x, 3, \"hi\", 2) = SHMIPC_EINVAL;"
             "shmipc_serve_ws_send(NULL, 1, \"hi\", 2) = SHMIPC_EINVAL;"
             "shmipc_serve_ws_close(x, 999, \"\", 0) = SHMIPC_EINVAL;"
             "shmipc_serve_ws_close(x, 1000, \"bye\", 3) = 0;"
             "shmipc_serve_ws_close(NULL, 1000, \"\", 0) = SHMIPC_EINVAL;"
             "shmipc_serve_shutdown()");
    interp_finish(&in);
    assert_int_equal(shmipc_serve_ws_send(x, SHMIPC_SERVE_WS_TEXT, "a", 1), SHMIPC_EINVAL);
    assert_int_equal(shmipc_serve_ws_close(x, 1000, NULL, 0), SHMIPC_EINVAL); /* closed already */
    char b[8];
    uint32_t fl;
    assert_int_equal(shmipc_serve_ws_recv(x, b, sizeof b, &fl, 10000), SHMIPC_ECLOSED);
    size_t rl = 0;
    assert_int_equal(shmipc_serve_ws_closed(x, b, sizeof b, &rl), 1000);
    assert_int_equal(rl, 2);
    assert_memory_equal(b, "ok", 2);
    serve_ws_handler_seen++;
    return 0;
}

static void serve_ws_handler_calls(void **state)
{
    (void)state;
    uint8_t buf[512];
    shmipc_stream *cst;
    static const uint8_t proto[] = "Sec-WebSocket-Protocol", chat[] = "chat";
    shmipc_serve_field fp = {proto, chat, sizeof proto - 1, sizeof chat - 1};
    shmipc_serve_request rq = {.size = sizeof rq,
                               .version_minor = 1,
                               .flags = SHMIPC_SERVE_REQ_UPGRADE,
                               .method = (const uint8_t *)"GET",
                               .method_len = 3,
                               .target = (const uint8_t *)"/ws",
                               .target_len = 3};
    int64_t n = shmipc_serve_encode_request_head(buf, sizeof buf, &rq, &fp, 1);
    assert_true(n > 0);
    assert_int_equal(
        shmipc_serve_encode_header(buf + n, sizeof buf - (size_t)n, SHMIPC_SERVE_END, 0, 0), 12);
    n += 12;
    int64_t c = shmipc_serve_encode_ws_close(buf + n, sizeof buf - (size_t)n, 1000, "ok", 2);
    assert_true(c > 0);
    n += c;
    assert_int_equal(shmipc_session_open_stream(env.client2, &cst), 0);
    assert_int_equal(shmipc_stream_write(cst, buf, (size_t)n), 0);
    assert_int_equal(shmipc_stream_flush(cst), 0);
    struct interp in;
    interp_init(&in);
    RUN(&in, "shmipc_session_accept_stream(server, 10000, &sst) = 0;"
             "shmipc_serve_handle_stream(sst, serve_ws_handler, ud) = 0");
    interp_finish(&in);
    assert_int_equal(serve_ws_handler_seen, 1);
    /* The front's side: 101, END, the text "hi", the close 1000 "bye". */
    uint32_t want[] = {SHMIPC_SERVE_RESPONSE_HEAD, SHMIPC_SERVE_END, SHMIPC_SERVE_WS_DATA,
                       SHMIPC_SERVE_WS_CLOSE};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const void *p;
        assert_int_equal(shmipc_stream_read_exact_bytes(cst, 12, &p, 0), 0);
        shmipc_serve_frame f = {.size = sizeof f};
        assert_int_equal(shmipc_serve_decode_header(p, 12, &f), 12);
        shmipc_stream_release(cst);
        assert_int_equal(f.type, want[i]);
        if (f.length > 0)
            assert_int_equal(shmipc_stream_read_exact_bytes(cst, f.length, &p, 0), 0);
        if (f.type == SHMIPC_SERVE_WS_DATA) {
            assert_int_equal(f.arg, SHMIPC_SERVE_WS_TEXT | SHMIPC_SERVE_WS_FIN);
            assert_memory_equal(p, "hi", 2);
        } else if (f.type == SHMIPC_SERVE_WS_CLOSE) {
            assert_int_equal(f.length, 5);
            assert_memory_equal(p,
                                "\xe8\x03"
                                "bye",
                                5); /* 1000, little-endian */
        } else if (f.type == SHMIPC_SERVE_RESPONSE_HEAD) {
            assert_int_equal(((const uint8_t *)p)[0] | ((const uint8_t *)p)[1] << 8, 101);
        }
        shmipc_stream_release(cst);
    }
    shmipc_stream_close(cst);
}

/* ------------------------------------------------------------------------------------ */
/* The shared library                                                                   */
/* ------------------------------------------------------------------------------------ */

/* DT_SONAME of an ELF file, read from its section headers. */
static void read_soname(const char *path, char *out, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    out[0] = '\0';
    assert_true(fd >= 0);
    assert_int_equal(fstat(fd, &sb), 0);
    const unsigned char *base = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    assert_true(base != MAP_FAILED);
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)base;
    assert_memory_equal(eh->e_ident, ELFMAG, SELFMAG);
    assert_int_equal(eh->e_ident[EI_CLASS], ELFCLASS64);
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(base + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_DYNAMIC)
            continue;
        const char *strtab = (const char *)base + sh[sh[i].sh_link].sh_offset;
        const Elf64_Dyn *dyn = (const Elf64_Dyn *)(base + sh[i].sh_offset);
        for (; dyn->d_tag != DT_NULL; dyn++)
            if (dyn->d_tag == DT_SONAME)
                snprintf(out, cap, "%s", strtab + dyn->d_un.d_val);
    }
    munmap((void *)base, (size_t)sb.st_size);
}

static void shared_library_soname_and_table(void **state)
{
    char soname[64];
    (void)state;
    read_soname(SHMIPC_LIBRARY_PATH, soname, sizeof soname);
    /* Changes only with an incompatible release (docs/abi.md). */
    assert_string_equal(soname, "libshmipc.so.0");

    void *h = dlopen(SHMIPC_LIBRARY_PATH, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        fail_msg("dlopen %s: %s", SHMIPC_LIBRARY_PATH, dlerror());
    int (*count)(void) = (int (*)(void))dlsym(h, "shmipc_abi_count");
    const shmipc_abi_fn *(*get)(int) = (const shmipc_abi_fn *(*)(int))dlsym(h, "shmipc_abi_get");
    assert_non_null(count);
    assert_non_null(get);
    assert_int_equal(count(), ncalls);
    for (int i = 0; i < ncalls; i++) {
        const shmipc_abi_fn *d = get(i);
        /* The library's own table points at its own exported functions. */
        assert_string_equal(d->name, calls[i].d->name);
        assert_ptr_equal((void *)d->fn, dlsym(h, d->name));
    }
    /* Internal functions stay hidden. */
    assert_null(dlsym(h, "shmipc__log"));
    dlclose(h);
}

/* Runs last: every GENERIC entry was called with valid and with invalid arguments. */
static void every_generic_entry_was_called(void **state)
{
    (void)state;
    int missing = 0;
    for (int i = 0; i < ncalls; i++) {
        const shmipc_abi_fn *d = calls[i].d;
        if (!calls[i].ready)
            continue;
        if (!called_valid[i]) {
            print_message("no call with valid arguments: %s\n", d->name);
            missing++;
        }
        if (d->nparams > 0 && !called_invalid[i]) {
            print_message("no call with invalid arguments: %s\n", d->name);
            missing++;
        }
    }
    if (missing)
        fail_msg("%d calls missing: add them to tests/c/test_abi.c", missing);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(table_is_well_formed),
        cmocka_unit_test(every_entry_with_null_arguments),
        cmocka_unit_test(version_and_errors),
        cmocka_unit_test(config_calls),
        cmocka_unit_test(session_calls),
        cmocka_unit_test(stream_calls),
        cmocka_unit_test(manager_calls),
        cmocka_unit_test(listener_calls),
        cmocka_unit_test(server_calls),
        cmocka_unit_test(ws_calls),
        cmocka_unit_test(log_sink_from_a_closure),
        cmocka_unit_test(log_sink_swaps_under_load),
        cmocka_unit_test(serve_from_closures),
        cmocka_unit_test(serve_handler_calls),
        cmocka_unit_test(serve_ws_handler_calls),
        cmocka_unit_test(shared_library_soname_and_table),
        cmocka_unit_test(every_generic_entry_was_called),
    };
    return cmocka_run_group_tests(tests, env_setup, env_teardown);
}
