/*
 * shmipc_abi.h - the descriptor table of libshmipc, for language bindings.
 *
 * A C program does not need this header: it calls the functions of shmipc.h directly. A
 * binding that calls the library through libffi (as the Python and Lua modules do) reads here
 * how the library describes each exported function. shmipc.h does not include this file;
 * include it after (or instead of) shmipc.h, which it includes. Both are installed side by
 * side, so `pkg-config --cflags shmipc` serves both. See docs/abi.md.
 */
#ifndef SHMIPC_ABI_H
#define SHMIPC_ABI_H

#include "shmipc.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The library describes its own exported functions, so that a language binding can call any
 * of them through libffi without a hand-written wrapper: for each function its name, its
 * address, and its return and parameter types in the small vocabulary below. A binding builds
 * its call descriptions once at load, from shmipc_abi_get(); docs/abi.md shows how. The table
 * is bindings/abi.def, checked against shmipc.h and this header, the version script and the
 * exported symbols by scripts/check-abi-table.py.
 */

/**
 * The type vocabulary. Each C parameter has one type, so parameters map one to one onto
 * libffi arguments; pairs are marshalled as one value (BYTES_IN + BYTES_LEN, OUT_CPTR +
 * OUT_LEN, OUT_CHARS + OUT_LEN). Values are only appended.
 */
enum shmipc_abi_type {
    SHMIPC_ABI_VOID = 0,        /**< no value (return type only) */
    SHMIPC_ABI_I32 = 1,         /**< int */
    SHMIPC_ABI_U32 = 2,         /**< uint32_t or unsigned */
    SHMIPC_ABI_I64 = 3,         /**< int64_t */
    SHMIPC_ABI_U64 = 4,         /**< uint64_t */
    SHMIPC_ABI_SIZE = 5,        /**< size_t */
    SHMIPC_ABI_CSTR = 6,        /**< const char *: NUL-terminated text; borrowed for the call as a
                                     parameter, static or owned by a handle as a return value */
    SHMIPC_ABI_HANDLE = 7,      /**< pointer to an object of `kind` */
    SHMIPC_ABI_RELEASE = 8,     /**< pointer to an object of `kind` that the call releases */
    SHMIPC_ABI_OUT_HANDLE = 9,  /**< T **: receives a new object of `kind`, owned by the caller */
    SHMIPC_ABI_BYTES_IN = 10,   /**< const void *: bytes read during the call; their length is
                                     the next parameter, a BYTES_LEN */
    SHMIPC_ABI_BYTES_LEN = 11,  /**< size_t: the length of the preceding BYTES_IN */
    SHMIPC_ABI_OUT_CPTR = 12,   /**< const void **: receives a pointer to bytes the library owns;
                                     their length goes to the next parameter, an OUT_LEN */
    SHMIPC_ABI_OUT_LEN = 13,    /**< size_t *: receives the length of the preceding OUT_CPTR or
                                     OUT_CHARS, else of the CHARS return value; may be NULL */
    SHMIPC_ABI_OUT_CPTR_N = 14, /**< const void **: receives a pointer to bytes the library owns,
                                     as many as the preceding SIZE parameter says */
    SHMIPC_ABI_OUT_WPTR_N = 15, /**< void **: receives a writable window of as many bytes as the
                                     preceding SIZE parameter says */
    SHMIPC_ABI_OUT_I32 = 16,    /**< int *: receives a value */
    SHMIPC_ABI_OUT_U32 = 17,    /**< uint32_t * or unsigned *: receives a value */
    SHMIPC_ABI_OUT_I64 = 18,    /**< int64_t *: receives a value */
    SHMIPC_ABI_OUT_U64 = 19,    /**< uint64_t *: receives a value */
    SHMIPC_ABI_OUT_SIZE = 20,   /**< size_t *: receives a value */
    SHMIPC_ABI_CALLBACK = 21,   /**< function pointer of callback `kind`; its signature is
                                     shmipc_abi_callback(kind) */
    SHMIPC_ABI_USER_DATA = 22,  /**< void *: handed back to callbacks, never dereferenced */
    SHMIPC_ABI_CHARS = 23,      /**< const char * return value: text the library owns, not
                                     NUL-terminated; its length goes to the OUT_LEN parameter
                                     that follows no OUT_CPTR or OUT_CHARS */
    SHMIPC_ABI_OUT_CHARS = 24,  /**< const char **: receives text the library owns, not
                                     NUL-terminated; its length goes to the next parameter, an
                                     OUT_LEN */
    SHMIPC_ABI_OPAQUE = 25,     /**< anything else (an array of structs, memory kept after the
                                     call): a function with one is not callable generically */
};

/**
 * What a HANDLE, RELEASE or OUT_HANDLE points to, or which callback a CALLBACK is:
 * XX(name, value, C type). Handles count from 1, callbacks from 101; values are only appended.
 */
#define SHMIPC_ABI_KIND_MAP(XX)                                                                    \
    XX(CONFIG, 1, shmipc_config)                                                                   \
    XX(SESSION, 2, shmipc_session)                                                                 \
    XX(STREAM, 3, shmipc_stream)                                                                   \
    XX(LISTENER, 4, shmipc_listener)                                                               \
    XX(MANAGER, 5, shmipc_session_manager)                                                         \
    XX(SERVER_CONFIG, 6, shmipc_server_config)                                                     \
    XX(SERVER, 7, shmipc_server)                                                                   \
    XX(HTTP_REQUEST, 8, shmipc_http_request)                                                       \
    XX(HTTP_RESPONSE, 9, shmipc_http_response)                                                     \
    XX(STREAM_CB, 101, shmipc_stream_cb)                                                           \
    XX(DESTROY_CB, 102, shmipc_destroy_cb)                                                         \
    XX(LOG_SINK, 103, shmipc_log_sink)                                                             \
    XX(HTTP_HANDLER, 104, shmipc_http_handler)                                                     \
    XX(WS, 10, shmipc_ws)                                                                          \
    XX(WS_OPEN_CB, 105, shmipc_ws_open_cb)                                                         \
    XX(WS_MESSAGE_CB, 106, shmipc_ws_message_cb)                                                   \
    XX(WS_CLOSE_CB, 107, shmipc_ws_close_cb)                                                       \
    XX(SERVE_EXCHANGE, 11, shmipc_serve_exchange)                                                  \
    XX(SERVE_HANDLER, 108, shmipc_serve_handler)                                                   \
    XX(HTTP_PENDING, 12, shmipc_http_pending)                                                      \
    XX(HTTP_PENDING_CB, 109, shmipc_http_pending_cb)

/** SHMIPC_ABI_KIND_CONFIG, ...; SHMIPC_ABI_KIND_NONE for parameters of other types. */
enum shmipc_abi_kind {
    SHMIPC_ABI_KIND_NONE = 0,
#define SHMIPC__ABI_KIND_ENUM(name, value, ctype) SHMIPC_ABI_KIND_##name = (value),
    SHMIPC_ABI_KIND_MAP(SHMIPC__ABI_KIND_ENUM)
#undef SHMIPC__ABI_KIND_ENUM
};

/** Flags of a described function. */
enum shmipc_abi_flag {
    SHMIPC_ABI_GENERIC = 1, /**< no parameter and no return value is OPAQUE */
    SHMIPC_ABI_BLOCKS = 2,  /**< may wait: a binding releases its interpreter lock around it */
};

/** One parameter, or the return value, of a described function. A value type: never grows. */
typedef struct shmipc_abi_param {
    int type;         /**< enum shmipc_abi_type */
    int kind;         /**< enum shmipc_abi_kind; SHMIPC_ABI_KIND_NONE unless a handle or callback */
    const char *name; /**< the parameter's name in this header; "" for the return value */
    const char *ctype; /**< the C type as this header spells it, e.g. "const shmipc_config *" */
} shmipc_abi_param;

/**
 * One exported function, or (from shmipc_abi_callback()) one callback type, whose `fn` is
 * NULL. @sized: it starts with its size and only grows at the end; read a field your header
 * has and the library may not only when `size` covers it. Static storage; thread safe.
 */
typedef struct shmipc_abi_fn {
    size_t size;                    /**< sizeof(shmipc_abi_fn) in the loaded library */
    const char *name;               /**< "shmipc_config_new", or "shmipc_stream_cb" */
    void (*fn)(void);               /**< the function: call it through libffi or its real type */
    unsigned flags;                 /**< enum shmipc_abi_flag */
    shmipc_abi_param ret;           /**< the return value; type SHMIPC_ABI_VOID when none */
    int nparams;                    /**< number of C parameters */
    const shmipc_abi_param *params; /**< nparams entries in declaration order; NULL when none */
} shmipc_abi_fn;

/** The number of described functions: every exported function, these included. Thread safe. */
SHMIPC_API int shmipc_abi_count(void);

/** The i-th described function, 0 <= i < shmipc_abi_count(), else NULL. Thread safe. */
SHMIPC_API const shmipc_abi_fn *shmipc_abi_get(int i);

/** The function named `name` (e.g. "shmipc_config_new"), or NULL. Thread safe. */
SHMIPC_API const shmipc_abi_fn *shmipc_abi_find(const char *name);

/** The signature of callback kind `kind` (SHMIPC_ABI_KIND_LOG_SINK, ...), or NULL. */
SHMIPC_API const shmipc_abi_fn *shmipc_abi_callback(int kind);

#ifdef __cplusplus
}
#endif

#endif /* SHMIPC_ABI_H */
