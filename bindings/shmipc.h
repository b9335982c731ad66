/*
 * shmipc.h - the one public header of libshmipc.
 *
 * Conventions that hold for every declaration below:
 *  - A function that can fail returns int: >= 0 on success (0, or a count), a negative
 *    SHMIPC_E* code on failure. errno is never part of the contract.
 *  - After a failure, shmipc_error_detail() returns a message for the calling thread that
 *    names the field or object at fault (for example "buffer_capacity: 4096 is below the
 *    minimum 1048576"). It stays valid until the next failing call on the same thread.
 *  - Handles are opaque. The caller owns what a *_new() function returns and frees it
 *    with the matching *_free(). Freeing NULL is a no-op.
 *  - Unless a comment says otherwise, a handle must not be used from two threads at once;
 *    different handles are independent.
 */
#ifndef SHMIPC_H
#define SHMIPC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(SHMIPC_BUILDING_LIBRARY)
#define SHMIPC_API __attribute__((visibility("default")))
#else
#define SHMIPC_API
#endif

/* ------------------------------------------------------------------------------------ */
/* Version                                                                              */
/* ------------------------------------------------------------------------------------ */

#define SHMIPC_VERSION_MAJOR 0
#define SHMIPC_VERSION_MINOR 1
#define SHMIPC_VERSION_PATCH 0
/** The version as one number: major * 10000 + minor * 100 + patch. */
#define SHMIPC_VERSION_HEX                                                                         \
    (SHMIPC_VERSION_MAJOR * 10000 + SHMIPC_VERSION_MINOR * 100 + SHMIPC_VERSION_PATCH)

/** Version of the loaded library, encoded as SHMIPC_VERSION_HEX. Never fails; thread safe. */
SHMIPC_API int shmipc_version(void);

/** Version of the loaded library as "major.minor.patch"; static storage, thread safe. */
SHMIPC_API const char *shmipc_version_string(void);

/* ------------------------------------------------------------------------------------ */
/* Errors                                                                               */
/* ------------------------------------------------------------------------------------ */

/*
 * Every error code, once: XX(name, value, message). Codes that have a POSIX meaning use the
 * negated Linux errno value, so a binding can map them onto its own OS error types; the
 * codes below -4000 are shmipc's own conditions.
 */
#define SHMIPC_ERRNO_MAP(XX)                                                                       \
    XX(EINTR, -4, "interrupted")                                                                   \
    XX(EIO, -5, "input/output error")                                                              \
    XX(EAGAIN, -11, "operation would block")                                                       \
    XX(ENOMEM, -12, "out of memory")                                                               \
    XX(EACCES, -13, "permission denied")                                                           \
    XX(EBUSY, -16, "resource busy")                                                                \
    XX(ENOENT, -2, "no such file or directory")                                                    \
    XX(EEXIST, -17, "already exists")                                                              \
    XX(EINVAL, -22, "invalid argument")                                                            \
    XX(EMFILE, -24, "too many open files")                                                         \
    XX(ENOSPC, -28, "no space left on device")                                                     \
    XX(ERANGE, -34, "value out of range")                                                          \
    XX(ENAMETOOLONG, -36, "name too long")                                                         \
    XX(EPROTO, -71, "protocol error")                                                              \
    XX(EMSGSIZE, -90, "message too long")                                                          \
    XX(ENOTSUP, -95, "operation not supported")                                                    \
    XX(EADDRINUSE, -98, "address already in use")                                                  \
    XX(ECONNRESET, -104, "peer is gone (connection reset)")                                        \
    XX(ETIMEDOUT, -110, "operation timed out")                                                     \
    XX(ECONNREFUSED, -111, "connection refused")                                                   \
    XX(ECLOSED, -4001, "handle is closed")                                                         \
    XX(EEOF, -4002, "end of stream")                                                               \
    XX(EQUEUEFULL, -4003, "io queue is full")                                                      \
    XX(ENOSHM, -4004, "shared memory is exhausted")                                                \
    XX(EUNHEALTHY, -4005, "session is unhealthy (fallback circuit breaker is open)")               \
    XX(ESTREAMS, -4006, "stream ids are exhausted")                                                \
    XX(EVERSION, -4007, "protocol version not supported by the peer")                              \
    XX(EREJECTED, -4008, "the peer rejected the protocol negotiation")

/** The error codes: SHMIPC_EINVAL, SHMIPC_ETIMEDOUT, ... (all negative). */
enum shmipc_errno {
#define SHMIPC__ERRNO_ENUM(name, value, msg) SHMIPC_##name = (value),
    SHMIPC_ERRNO_MAP(SHMIPC__ERRNO_ENUM)
#undef SHMIPC__ERRNO_ENUM
};

/**
 * A short English message for an error code. Unknown codes give "unknown error".
 * Static storage; thread safe.
 */
SHMIPC_API const char *shmipc_strerror(int code);

/**
 * The symbolic name of an error code, for example "SHMIPC_ETIMEDOUT", or NULL when the code
 * is not an shmipc error code. Static storage; thread safe.
 */
SHMIPC_API const char *shmipc_errname(int code);

/**
 * The detail of the last failure on the calling thread: a message naming the field or object
 * at fault. "" when the thread has seen no failure. Thread-local storage, valid until the
 * next failing call on this thread.
 */
SHMIPC_API const char *shmipc_error_detail(void);

/* ------------------------------------------------------------------------------------ */
/* Config                                                                               */
/* ------------------------------------------------------------------------------------ */

/**
 * A configuration for sessions, session managers and listeners. A new config holds the
 * defaults of the reference implementations (see docs/api.md): legacy protocol over memfd
 * (V3), a 32 MiB buffer in slices of 8172:50,32748:30,131052:20, queue capacity 8192,
 * path prefix "/dev/shm/shmipc", initialize timeout 1000 ms, connection write timeout
 * 10000 ms, no read or write timeout.
 *
 * Every setter validates its value against the rules of the reference implementations and
 * against the fields already set; a refused value leaves the config unchanged and returns
 * SHMIPC_EINVAL (or SHMIPC_ENAMETOOLONG) with a detail naming the field. Objects created
 * from a config copy it, so a config may be changed or freed afterwards.
 */
typedef struct shmipc_config shmipc_config;

/** How shared memory is created. Values are those of the Go MemMapType. */
enum shmipc_memmap_type {
    SHMIPC_MEMMAP_DEVSHM = 0, /**< regular files under /dev/shm; selects protocol V2 */
    SHMIPC_MEMMAP_MEMFD = 1,  /**< memfd_create, fds passed over the unix socket; V3 */
};

/** Protocol family the client asks for. */
enum shmipc_protocol {
    SHMIPC_PROTOCOL_LEGACY = 0, /**< V3 over memfd, V2 over /dev/shm files */
    SHMIPC_PROTOCOL_V4 = 4,     /**< negotiated V4 (optionally falling back to legacy) */
};

/** How a peer is told that its receive queue has work (V4 only; legacy uses the socket). */
enum shmipc_wakeup {
    SHMIPC_WAKEUP_SOCKET = 0,  /**< a Polling message on the socket */
    SHMIPC_WAKEUP_EVENTFD = 1, /**< eventfds passed at handshake; requires memfd */
    SHMIPC_WAKEUP_POLLING = 2, /**< no wakeup; both peers drain every polling interval */
};

/** Which timeout shmipc_config_set_timeout_ms() sets. */
enum shmipc_timeout {
    SHMIPC_TIMEOUT_INITIALIZE = 0,       /**< whole handshake; 1..3600000 ms, default 1000 */
    SHMIPC_TIMEOUT_CONNECTION_WRITE = 1, /**< socket writes; 1..3600000 ms, default 10000 */
    SHMIPC_TIMEOUT_READ = 2,             /**< stream reads; 0 = wait forever (default) */
    SHMIPC_TIMEOUT_WRITE = 3,            /**< stream writes; 0 = wait forever (default) */
};

/** One slice class: slices of `size` data bytes taking `percent` of the buffer. */
typedef struct shmipc_slice_class {
    uint32_t size;
    uint32_t percent;
} shmipc_slice_class;

/** Most slice classes a config holds. */
#define SHMIPC_MAX_SLICE_CLASSES 32
/** Longest path prefix: the reference requires len(prefix) + 75 <= 255. */
#define SHMIPC_MAX_PATH_PREFIX 180
/** Smallest shared-memory buffer, as in the reference: 1 MiB. */
#define SHMIPC_MIN_BUFFER_CAPACITY (1u << 20)
/** Largest queue capacity (elements per direction). */
#define SHMIPC_MAX_QUEUE_CAPACITY (1u << 24)
/** Bounds of the V4 polling interval, in microseconds. */
#define SHMIPC_MIN_POLLING_INTERVAL_US 1u
#define SHMIPC_MAX_POLLING_INTERVAL_US 1000000u

/** Allocates a config holding the defaults. Returns 0 or SHMIPC_EINVAL/SHMIPC_ENOMEM. */
SHMIPC_API int shmipc_config_new(shmipc_config **out);

/** Allocates a copy of `src`. Returns 0 or SHMIPC_EINVAL/SHMIPC_ENOMEM. */
SHMIPC_API int shmipc_config_clone(const shmipc_config *src, shmipc_config **out);

/** Frees a config. NULL is a no-op. */
SHMIPC_API void shmipc_config_free(shmipc_config *cfg);

/**
 * Checks every rule across all fields, as a session does before it uses the config.
 * Returns 0 or SHMIPC_EINVAL with a detail naming the field.
 */
SHMIPC_API int shmipc_config_validate(const shmipc_config *cfg);

/**
 * Sets how shared memory is created (enum shmipc_memmap_type). /dev/shm files are refused
 * while the wakeup mode is eventfd, which needs memfd.
 */
SHMIPC_API int shmipc_config_set_memmap_type(shmipc_config *cfg, int type);

/**
 * Sets the size of the shared buffer in bytes: at least SHMIPC_MIN_BUFFER_CAPACITY, at most
 * UINT32_MAX, at least every slice size, and large enough that every slice class gets at
 * least one slice.
 */
SHMIPC_API int shmipc_config_set_buffer_capacity(shmipc_config *cfg, uint64_t bytes);

/**
 * Sets the capacity of each queue (elements per direction): 1..SHMIPC_MAX_QUEUE_CAPACITY,
 * refusing values that would put an 8-byte queue counter across a 64-byte cache line (a
 * split lock, slow and fatal under split_lock_detect); multiples of 16 are always fine.
 */
SHMIPC_API int shmipc_config_set_queue_capacity(shmipc_config *cfg, uint32_t capacity);

/**
 * Sets the slice classes from an array of n classes (1..SHMIPC_MAX_SLICE_CLASSES). Each
 * size is a multiple of 4 up to the buffer capacity, each percent 1..100, the percents sum to 100, sizes are
 * distinct, and each class gets at least one slice. The classes are stored sorted by size,
 * as the buffer lays them out. A class that gets exactly one slice never hands it out: the
 * last free slice of a list is kept back by the protocol.
 */
SHMIPC_API int shmipc_config_set_slice_classes(shmipc_config *cfg,
                                               const shmipc_slice_class *classes, size_t n);

/**
 * Sets the slice classes from text "size:percent,size:percent,..." (the notation of the
 * reference's BufferSliceSizes), with the rules of shmipc_config_set_slice_classes().
 */
SHMIPC_API int shmipc_config_parse_slice_classes(shmipc_config *cfg, const char *spec);

/**
 * Copies up to `cap` slice classes, sorted by size, into `out` (which may be NULL when cap
 * is 0). Returns the number of classes the config holds, or SHMIPC_EINVAL.
 */
SHMIPC_API int shmipc_config_get_slice_classes(const shmipc_config *cfg, shmipc_slice_class *out,
                                               size_t cap);

/**
 * Sets the prefix of shared-memory names: non-empty, at most SHMIPC_MAX_PATH_PREFIX bytes,
 * no '\n'. The buffer is named "<prefix>_<pid>_buffer", queues "<prefix>_<pid>_queue_<n>";
 * with /dev/shm files these are real paths, so the prefix must then start with '/'.
 */
SHMIPC_API int shmipc_config_set_path_prefix(shmipc_config *cfg, const char *prefix);

/** Sets one of the timeouts (enum shmipc_timeout) in milliseconds; ranges are given there. */
SHMIPC_API int shmipc_config_set_timeout_ms(shmipc_config *cfg, int which, uint32_t ms);

/**
 * Sets the protocol (enum shmipc_protocol) and, for V4, whether the client may fall back to
 * legacy when V4 set-up fails on the network or protocol level (never after an explicit
 * rejection). Choosing legacy resets the wakeup mode to SHMIPC_WAKEUP_SOCKET.
 */
SHMIPC_API int shmipc_config_set_protocol(shmipc_config *cfg, int protocol, int fallback);

/**
 * Sets the V4 wakeup mode (enum shmipc_wakeup). Eventfd and polling need protocol V4;
 * eventfd needs memfd. `polling_interval_us` is used by SHMIPC_WAKEUP_POLLING only and must
 * then be within SHMIPC_MIN/MAX_POLLING_INTERVAL_US; pass 0 otherwise.
 */
SHMIPC_API int shmipc_config_set_wakeup(shmipc_config *cfg, int wakeup,
                                        uint32_t polling_interval_us);

/** V4 with socket wakeups and fallback on (the Rust with_v4()). */
SHMIPC_API int shmipc_config_with_v4(shmipc_config *cfg);

/** V4 with eventfd wakeups, memfd, and fallback on (the Rust with_v4_eventfd()). */
SHMIPC_API int shmipc_config_with_v4_eventfd(shmipc_config *cfg);

/** V4 with event-queue polling every `interval_us`, and fallback on. */
SHMIPC_API int shmipc_config_with_v4_event_queue_polling(shmipc_config *cfg, uint32_t interval_us);

/*
 * Getters. They never fail on a valid config; on NULL they return 0 (or NULL), which is
 * never a valid value of the field except where noted.
 */
SHMIPC_API int shmipc_config_get_memmap_type(const shmipc_config *cfg);
SHMIPC_API uint64_t shmipc_config_get_buffer_capacity(const shmipc_config *cfg);
SHMIPC_API uint32_t shmipc_config_get_queue_capacity(const shmipc_config *cfg);
SHMIPC_API const char *shmipc_config_get_path_prefix(const shmipc_config *cfg);
/** Returns the timeout in ms, 0 meaning "wait forever" for read/write; -1 for a bad `which`. */
SHMIPC_API int64_t shmipc_config_get_timeout_ms(const shmipc_config *cfg, int which);
SHMIPC_API int shmipc_config_get_protocol(const shmipc_config *cfg);
SHMIPC_API int shmipc_config_get_fallback(const shmipc_config *cfg);
SHMIPC_API int shmipc_config_get_wakeup(const shmipc_config *cfg);
SHMIPC_API uint32_t shmipc_config_get_polling_interval_us(const shmipc_config *cfg);

#ifdef __cplusplus
}
#endif

#endif /* SHMIPC_H */
