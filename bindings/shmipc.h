/*
 * shmipc.h - the public header of libshmipc: the API a C program uses. The descriptor table
 * that language bindings call the library through (libffi) is in shmipc_abi.h, beside it.
 *
 * Conventions that hold for every declaration below:
 *  - A function that can fail returns int: >= 0 on success (0, or a count), a negative
 *    SHMIPC_E* code on failure. errno is never part of the contract.
 *  - After a failure, shmipc_error_detail() returns a message for the calling thread that
 *    names the field or object at fault (for example "buffer_capacity: 4096 is below the
 *    minimum 1048576"). It stays valid until the next failing call on the same thread.
 *  - Handles are opaque. The caller owns what a *_new() function returns and releases it
 *    with the matching *_close() when the object holds a peer, a file descriptor or threads
 *    (session, stream, listener, session manager, server), or *_free() when it is a plain
 *    value (the two configs). Closing or freeing NULL is a no-op.
 *  - Timeouts are int milliseconds with one rule everywhere: a negative value waits forever
 *    (SHMIPC_WAIT_FOREVER, or any other), 0 does not wait (the call does what it can at once
 *    and fails with SHMIPC_ETIMEDOUT, or SHMIPC_EAGAIN where documented, otherwise), a
 *    positive value is the most it waits. A timeout for which "no wait" has no meaning (a
 *    handshake) refuses 0 with SHMIPC_EINVAL.
 *  - Functions marked SHMIPC_DEPRECATED still work as documented and are removed in the
 *    release after the next one (CHANGELOG.md).
 *  - Unless a comment says otherwise, a handle must not be used from two threads at once;
 *    different handles are independent.
 */
#ifndef SHMIPC_H
#define SHMIPC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(SHMIPC_BUILDING_LIBRARY)
#define SHMIPC_API __attribute__((visibility("default")))
#else
#define SHMIPC_API
#endif

/* Marks a function kept for one more release under an old name or meaning; `msg` says what to
 * use instead. The compiler warns at each use (GCC, clang). */
#if defined(__GNUC__) || defined(__clang__)
#define SHMIPC_DEPRECATED(msg) __attribute__((deprecated(msg)))
#else
#define SHMIPC_DEPRECATED(msg)
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
    XX(EREJECTED, -4008, "the peer rejected the protocol negotiation")                             \
    XX(EPIPE, -4009, "connection is closing (nothing more can be sent)")

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
/* Logging                                                                              */
/* ------------------------------------------------------------------------------------ */

/** Levels of diagnostic lines, as SHMIPC_LOG_LEVEL names them. */
enum shmipc_log_level {
    SHMIPC_LOG_ERROR = 1,
    SHMIPC_LOG_WARN = 2,
    SHMIPC_LOG_INFO = 3,
    SHMIPC_LOG_DEBUG = 4,
};

/** Receives one diagnostic line; `line` is valid during the call only. */
typedef void (*shmipc_log_sink)(int level, const char *line);

/**
 * Sends the library's diagnostic lines to `sink` instead of stderr; NULL restores stderr.
 * SHMIPC_LOG_LEVEL filters as before. The sink gets the level and the text stderr would get,
 * "shmipc[<pid>] <level>: <message>", without the trailing newline. It may be called from any
 * thread, from several at once.
 *
 * Rule: no callback into user code (this sink, the shmipc_listener_serve callbacks) runs with
 * a library lock held. A line logged while a session's lock is held is
 * kept, formatted, and handed to the sink after the lock is dropped (so it may come slightly
 * later than the event), and the sink is not called under any lock of the logger either. A
 * sink may therefore call back into shmipc, even into the session that logged, and may call
 * shmipc_set_log_sink() itself; a sink that takes its own lock (an interpreter lock) cannot
 * deadlock against a thread that holds that lock and waits for a session.
 *
 * When this function returns, no thread runs the previous sink any more (other than the
 * caller, when a sink calls it) and none will call it again, so what it holds (a libffi
 * closure, say) may be freed. It waits for calls in flight: a binding releases its
 * interpreter lock around it. Thread safe.
 */
SHMIPC_API void shmipc_set_log_sink(shmipc_log_sink sink);

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

/**
 * Which timeout shmipc_config_set_timeout() (and shmipc_stream_set_timeout(), for READ and
 * WRITE) sets. Negative waits forever, 0 does not wait, as everywhere.
 */
enum shmipc_timeout {
    /** The whole handshake: negative (forever) or 1..3600000 ms, default 1000. 0 is
     * SHMIPC_EINVAL: a handshake cannot take no time. */
    SHMIPC_TIMEOUT_INITIALIZE = 0,
    /** Socket writes (control messages, fallback data): negative (forever) or 1..3600000 ms,
     * default 10000. 0 is SHMIPC_EINVAL, as for the handshake. */
    SHMIPC_TIMEOUT_CONNECTION_WRITE = 1,
    /** Stream reads and forward: negative waits forever (default); 0 takes what is pending
     * now and else fails at once with SHMIPC_ETIMEDOUT; > 0 waits up to that many ms. */
    SHMIPC_TIMEOUT_READ = 2,
    /** A flush retrying a full queue: negative waits forever (default; the retry still ends
     * after about 100 ms with SHMIPC_EQUEUEFULL); 0 fails at once with SHMIPC_ETIMEDOUT when
     * the queue is full; > 0 waits up to that many ms. */
    SHMIPC_TIMEOUT_WRITE = 3,
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

/**
 * Sets one of the timeouts (enum shmipc_timeout) in milliseconds by the rule: negative waits
 * forever, 0 does not wait (SHMIPC_EINVAL for the two handshake timeouts), ranges as given
 * there. Returns 0 or SHMIPC_EINVAL.
 */
SHMIPC_API int shmipc_config_set_timeout(shmipc_config *cfg, int which, int timeout_ms);

/**
 * Stores one of the timeouts in *timeout_ms: SHMIPC_WAIT_FOREVER for forever, 0 for "do not
 * wait", else the milliseconds (at most INT_MAX: a longer one set with the deprecated setter
 * reads back as INT_MAX). Returns 0 or SHMIPC_EINVAL (NULL, a bad `which`).
 */
SHMIPC_API int shmipc_config_get_timeout(const shmipc_config *cfg, int which, int *timeout_ms);

/**
 * Deprecated: use shmipc_config_set_timeout(). The old meaning: for READ and WRITE 0 waits
 * forever (any uint32 ms else); INITIALIZE and CONNECTION_WRITE take 1..3600000.
 */
SHMIPC_DEPRECATED("use shmipc_config_set_timeout")
SHMIPC_API int shmipc_config_set_timeout_ms(shmipc_config *cfg, int which, uint32_t ms);

/**
 * Sets the protocol (enum shmipc_protocol) and, for V4, whether the client may fall back to
 * legacy when V4 set-up fails on the network or protocol level (never after an explicit
 * rejection). Choosing legacy resets the wakeup mode to SHMIPC_WAKEUP_SOCKET.
 */
SHMIPC_API int shmipc_config_set_protocol(shmipc_config *cfg, int protocol, int fallback);

/**
 * Sets the V4 wakeup mode (enum shmipc_wakeup). Eventfd and polling need protocol V4;
 * eventfd needs memfd, and is asked for only when the server is of our uid or root (else the
 * session gets socket wakeups; docs/security.md). `polling_interval_us` is used by SHMIPC_WAKEUP_POLLING only and must
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

/** Most sessions a session manager keeps, and most idle streams it pools per session. */
#define SHMIPC_MAX_SESSION_NUM 1024u
#define SHMIPC_MAX_STREAM_NUM  65536u

/**
 * Session manager: how many sessions it keeps to the server (1..SHMIPC_MAX_SESSION_NUM,
 * default 1, as the reference's SessionNum).
 */
SHMIPC_API int shmipc_config_set_session_num(shmipc_config *cfg, uint32_t n);

/** Session manager: idle streams pooled per session (1..SHMIPC_MAX_STREAM_NUM, default 4096). */
SHMIPC_API int shmipc_config_set_max_stream_num(shmipc_config *cfg, uint32_t n);

/**
 * Session manager: after a reconnect fails, the next attempt waits at least this long
 * (1..3600000 ms, default 1000). A dead session is replaced on the next get_stream.
 */
SHMIPC_API int shmipc_config_set_rebuild_interval_ms(shmipc_config *cfg, uint32_t ms);

/** Optional V4 features, as a server offers them (a bit mask). */
enum shmipc_v4_feature {
    SHMIPC_V4_FEATURE_EVENTFD = 1, /**< "eventfd_wakeup" */
    SHMIPC_V4_FEATURE_POLLING = 2, /**< "event_queue_polling" */
};

/**
 * Server: whether V4 clients are accepted (default 1) and which optional features it offers
 * (default both; eventfd is granted only to a client of our uid or root, docs/security.md).
 * A server that does not accept V4 closes the connection on a V4 header, as
 * a legacy server does, so V4 clients with fallback retry legacy.
 */
SHMIPC_API int shmipc_config_set_server_v4(shmipc_config *cfg, int accept, unsigned features);

/*
 * Getters. They never fail on a valid config; on NULL they return 0 (or NULL), which is
 * never a valid value of the field except where noted.
 */
SHMIPC_API int shmipc_config_get_memmap_type(const shmipc_config *cfg);
SHMIPC_API uint64_t shmipc_config_get_buffer_capacity(const shmipc_config *cfg);
SHMIPC_API uint32_t shmipc_config_get_queue_capacity(const shmipc_config *cfg);
SHMIPC_API const char *shmipc_config_get_path_prefix(const shmipc_config *cfg);
/**
 * Deprecated: use shmipc_config_get_timeout(). Returns the timeout in ms, 0 meaning "wait
 * forever"; -1 for a bad `which`, and for a read or write timeout of 0 ("do not wait", set
 * with shmipc_config_set_timeout()), which this getter cannot express.
 */
SHMIPC_DEPRECATED("use shmipc_config_get_timeout")
SHMIPC_API int64_t shmipc_config_get_timeout_ms(const shmipc_config *cfg, int which);
SHMIPC_API int shmipc_config_get_protocol(const shmipc_config *cfg);
SHMIPC_API int shmipc_config_get_fallback(const shmipc_config *cfg);
SHMIPC_API int shmipc_config_get_wakeup(const shmipc_config *cfg);
SHMIPC_API uint32_t shmipc_config_get_polling_interval_us(const shmipc_config *cfg);
SHMIPC_API uint32_t shmipc_config_get_session_num(const shmipc_config *cfg);
SHMIPC_API uint32_t shmipc_config_get_max_stream_num(const shmipc_config *cfg);
SHMIPC_API uint32_t shmipc_config_get_rebuild_interval_ms(const shmipc_config *cfg);
/** 1 when the server accepts V4; *features (may be NULL) gets the offered feature mask. */
SHMIPC_API int shmipc_config_get_server_v4(const shmipc_config *cfg, unsigned *features);

/* Peer uids and socket permissions (docs/security.md). */

/** Most uids a peer-uid allow-list holds. */
#define SHMIPC_MAX_PEER_UIDS 64

/**
 * Sets the allow-list of peer uids: when it is not empty, a session starts only with a peer
 * whose uid (SO_PEERCRED, as the kernel recorded it when the peer called connect() or
 * listen()) is one of `uids`. A listener closes the connection of a client not listed; a
 * client refuses a server not listed. Either side's handshake then fails with SHMIPC_EACCES
 * and a detail naming the uid. Needs a unix socket: a TCP peer has no uid, so with a list
 * set, connecting over TCP fails with SHMIPC_EACCES and a TCP listener is refused
 * (SHMIPC_EINVAL). n = 0 (uids may then be NULL) clears the list: any peer that can reach the
 * socket is accepted (the default). At most SHMIPC_MAX_PEER_UIDS uids; copied.
 */
SHMIPC_API int shmipc_config_set_peer_uids(shmipc_config *cfg, const uint32_t *uids, size_t n);

/**
 * Copies up to `cap` uids of the allow-list into `out` (which may be NULL when cap is 0).
 * Returns the number of uids the list holds (0: no list), or SHMIPC_EINVAL.
 */
SHMIPC_API int shmipc_config_get_peer_uids(const shmipc_config *cfg, uint32_t *out, size_t cap);

/**
 * Sets the permission bits of the unix socket file a listener creates: 1..0777, or 0 for the
 * default 0600 (owner read and write: only the same uid, and root, can connect). Abstract
 * sockets ("unix:@name") have no file and no permissions: any local process can connect, so
 * pair them with an allow-list.
 */
SHMIPC_API int shmipc_config_set_socket_mode(shmipc_config *cfg, unsigned mode);

/** The socket file mode a listener uses (0600 by default). */
SHMIPC_API unsigned shmipc_config_get_socket_mode(const shmipc_config *cfg);

/**
 * Server: how many streams the peer may have opened on one session that nobody accepted yet
 * (1..SHMIPC_MAX_STREAM_NUM, or 0 for the default 4096). A peer that opens one more ends the
 * session with SHMIPC_EPROTO and a detail naming max_pending_streams: we cannot make it wait
 * without stalling every stream of the session. serve() accepts every stream at once, so
 * this bounds what one processing turn brings in.
 */
SHMIPC_API int shmipc_config_set_max_pending_streams(shmipc_config *cfg, uint32_t n);

/** The pending-stream limit in force (4096 by default). */
SHMIPC_API uint32_t shmipc_config_get_max_pending_streams(const shmipc_config *cfg);

/**
 * How many bytes of fallback data (data the peer sent over the socket because shared memory
 * was full) one session may hold on the heap for its streams, unread or read and not released:
 * 65536..2^40, or 0 for the default 128 MiB (twice the largest message, so one big fallback
 * write of a well-behaved peer always fits). Data beyond it ends the session with
 * SHMIPC_EPROTO and a detail naming max_fallback_unread: the socket is shared by every
 * stream, so pushing back on one stream would stall them all.
 */
SHMIPC_API int shmipc_config_set_max_fallback_unread(shmipc_config *cfg, uint64_t bytes);

/** The fallback limit in force, in bytes (128 MiB by default). */
SHMIPC_API uint64_t shmipc_config_get_max_fallback_unread(const shmipc_config *cfg);

/**
 * Most microseconds a thread waiting for a session's shared-memory data (a blocking read,
 * accept_stream, a serving listener, shmipc_session_spin()) polls the receive queue before it
 * sleeps: 0..100000, 0 = never spin. The spin adapts below this cap to the gaps recently seen
 * between messages. Default: SHMIPC_SPIN_US, else 50. A peer answering within the spin costs
 * no system call on either side; an idle session spins only until the budget runs out.
 * SHMIPC_EINVAL beyond 100000.
 */
SHMIPC_API int shmipc_config_set_spin_us(shmipc_config *cfg, uint32_t us);
/** The spin cap of shmipc_config_set_spin_us(); 0 for a NULL config. */
SHMIPC_API uint32_t shmipc_config_get_spin_us(const shmipc_config *cfg);

/**
 * What a write does when the session's shared memory is exhausted (the peer holds it unread):
 * 0 (the default, as shmipc-go) sends the data over the socket (fallback; the stream stays on
 * the socket from then on, and the peer holds it on its heap, up to max_fallback_unread); 1
 * makes shmipc_stream_write() and shmipc_stream_reserve() wait until the peer frees some, up
 * to the stream's write timeout (then SHMIPC_ETIMEDOUT, and that write added nothing), like a
 * pipe: a reader that stops reading stops the writer, and nobody buffers on the heap.
 * Forwarding (shmipc_stream_forward) never waits. Local: nothing changes on the wire.
 * SHMIPC_EINVAL for other values.
 */
SHMIPC_API int shmipc_config_set_memory_wait(shmipc_config *cfg, int wait);
/** The memory_wait setting (0 or 1); 0 for a NULL config. */
SHMIPC_API int shmipc_config_get_memory_wait(const shmipc_config *cfg);

/* ------------------------------------------------------------------------------------ */
/* Sessions and streams                                                                 */
/* ------------------------------------------------------------------------------------ */

/*
 * A session is one connection to a peer (a unix or TCP socket for the handshake and wakeups)
 * with its shared memory: a buffer of slices and a pair of queues. Streams are multiplexed
 * byte streams inside a session; the client opens them, the server accepts them.
 *
 * Threads: a session handle may be used from several threads at once; a stream handle from
 * one thread at a time (different streams of one session may run in parallel), except
 * shmipc_stream_shutdown() and shmipc_stream_close(), which any thread may call while another
 * is in a call on the stream. No library thread exists: the thread that waits for data reads
 * the socket itself, or an event loop polls shmipc_session_fileno() and calls
 * shmipc_session_process().
 *
 * Blocking calls: accept_stream, read_chunk, read_exact_bytes and forward wait (up to their
 * timeouts); flush may wait up to the write timeouts when the peer's queue or the socket is
 * full. To end a wait from another thread, shut the session or the stream down: the waiting
 * call fails with SHMIPC_ECLOSED and the handle stays valid until closed. Closing a handle
 * while another thread is inside a call on it is safe too (it shuts it down first, and the
 * memory is freed when the last call in flight leaves), but no call may start on a handle
 * once its close has begun: to stop workers, shut down, join them, then close.
 *
 * fork(): a session, stream, listener or session manager belongs to the process that made it.
 * In another process (a fork() child), closing it (close, flush_close, put_back, a binding's
 * finalizer) releases only that process's copies (mappings, descriptors, memory): nothing is
 * sent to the peer or written to shared memory, no socket is shut down, no file removed, no
 * thread joined, no lock taken; the parent's objects go on. Close them from one thread of the
 * child and use them for nothing else there (docs/ipc.md, "fork").
 *
 * Addresses: "unix:/path", "/path" or "./path" (unix socket), "unix:@name" (abstract),
 * "tcp:host:port" or "host:port". memfd sessions need a unix socket.
 */
typedef struct shmipc_session shmipc_session;
typedef struct shmipc_stream shmipc_stream;
typedef struct shmipc_listener shmipc_listener;

/** Flag for reads and accepts: fail with SHMIPC_EAGAIN instead of waiting. */
#define SHMIPC_NONBLOCK 1

/** A timeout argument meaning "wait forever" (any negative value means the same). */
#define SHMIPC_WAIT_FOREVER (-1)

/**
 * Connects to a server and runs the client handshake (V3 over memfd, V2 over /dev/shm files,
 * as `cfg` says; NULL means defaults). Blocks up to the initialize timeout. The client
 * creates the shared memory; its names are unique to the process and the session.
 */
SHMIPC_API int shmipc_session_connect(const char *address, const shmipc_config *cfg,
                                      shmipc_session **out);

/**
 * Opens a new stream (client sessions only). Sends nothing: the peer learns of the stream
 * from its first message. SHMIPC_EUNHEALTHY while the fallback circuit breaker is open,
 * SHMIPC_ECONNRESET or SHMIPC_ECLOSED when the session has ended.
 */
SHMIPC_API int shmipc_session_open_stream(shmipc_session *s, shmipc_stream **out);

/**
 * Takes the next stream the peer opened (server sessions). Waits up to `timeout_ms`: any
 * negative value waits forever, 0 takes what is pending without waiting (SHMIPC_EAGAIN when
 * nothing is), a positive value fails with SHMIPC_ETIMEDOUT when none came in time.
 * A poll (0) within 50 µs of the session's last processing, with nothing come since, takes
 * only what that processing found (no system call; see docs/ipc.md, event loops).
 */
SHMIPC_API int shmipc_session_accept_stream(shmipc_session *s, int timeout_ms, shmipc_stream **out);

/**
 * The descriptor that becomes readable when the session has events to process: register it
 * with an event loop and call shmipc_session_process() when it fires. Level- or
 * edge-triggered; edge-triggered only when the loop is the session's only processor (no other
 * thread blocks in a read, accept or write on it: what that thread takes brings no new edge).
 * It is the socket, or for V4 eventfd and polling sessions an epoll descriptor that also
 * watches the wakeup eventfd or the polling timer.
 */
SHMIPC_API int shmipc_session_fileno(const shmipc_session *s);

/**
 * Processes whatever events are pending without waiting: data for streams, closes, new
 * streams. It reads the socket until it would block, so that an edge-triggered loop misses
 * nothing (a peer's last data and its close may come as one edge). Returns the number of
 * events handled (>= 0), or the code that ended the session. Thread safe; returns 0 at once
 * when another thread is already processing (that thread takes what is pending, and a watch
 * of shmipc_session_fileno() gets no edge for it).
 */
SHMIPC_API int shmipc_session_process(shmipc_session *s);

/**
 * For event loops, before they sleep on shmipc_session_fileno(): polls the session's receive
 * queue for up to its spin budget (adaptive, capped by shmipc_config_set_spin_us(); with the
 * queue's working flag set, so the peer sends no wakeup meanwhile) and processes what came,
 * as shmipc_session_process() does. Returns 1 when it processed something (dispatch, do not
 * sleep), 0 when nothing came within the budget, or spinning is off (0 cap, one CPU, V4
 * polling), or recent spins came up empty (then a few calls in a row return 0 at once), or
 * another thread is processing: sleep on the descriptor, which a message arriving after the
 * spin makes readable as usual. SHMIPC_ECONNRESET or SHMIPC_ECLOSED when the session ended.
 */
SHMIPC_API int shmipc_session_spin(shmipc_session *s);

/** 0 while the session is alive, else the code that ended it (SHMIPC_ECONNRESET, ...). */
SHMIPC_API int shmipc_session_status(const shmipc_session *s);

/** The negotiated protocol version: 2, 3, or 4 (a V4 client that fell back reports 3 or 2). */
SHMIPC_API int shmipc_session_version(const shmipc_session *s);

/**
 * The negotiated wakeup (enum shmipc_wakeup; always SHMIPC_WAKEUP_SOCKET before V4) and, for
 * polling, the interval both peers use, in *polling_interval_us (may be NULL).
 */
SHMIPC_API int shmipc_session_wakeup(const shmipc_session *s, uint32_t *polling_interval_us);

/**
 * Ends the session as shmipc_session_close() does (the socket is shut down, the peer sees the
 * connection end, unread data is lost) but keeps the handle: every call blocked on the
 * session or one of its streams (accept_stream, reads, forward, a flush waiting for a full
 * queue) wakes and fails with SHMIPC_ECLOSED, and so does every later call but status,
 * version, fileno and close. Thread safe: any thread, any number of times, also while other
 * threads are inside calls on the session. A session that ended already keeps its cause.
 * Returns 0, or SHMIPC_EINVAL for NULL.
 */
SHMIPC_API int shmipc_session_shutdown(shmipc_session *s);

/**
 * Hard close, as in the reference: the socket is closed at once, the peer sees the
 * connection end, queued but unread data is lost, and every stream of the session fails
 * with SHMIPC_ECLOSED from then on. Releases the handle; shared memory stays mapped until
 * the last stream handle is closed, so pointers from read_chunk stay valid until then.
 * Calls blocked in other threads wake with SHMIPC_ECLOSED, and the session is freed when the
 * last of them leaves; no call may start on the handle after close began (see "Blocking
 * calls" above). NULL is a no-op.
 */
SHMIPC_API void shmipc_session_close(shmipc_session *s);

/** The stream id (client streams count up from 2). */
SHMIPC_API uint32_t shmipc_stream_id(const shmipc_stream *st);

/**
 * Appends len bytes to the stream's send buffer, copying them into shared memory (or, when
 * it is exhausted, into heap memory that flush sends over the socket). Nothing is sent
 * until shmipc_stream_flush(). Does not block.
 */
SHMIPC_API int shmipc_stream_write(shmipc_stream *st, const void *buf, size_t len);

/**
 * Reserves a contiguous window of `n` bytes at the end of the send buffer, in one slice of
 * shared memory, and stores its address in *ptr. n = 0 is SHMIPC_EINVAL; n larger than the
 * largest slice class is SHMIPC_EMSGSIZE and changes nothing (no window, the stream stays on
 * shared memory): use shmipc_stream_write(), which splits any size across slices. A window that
 * fits a class while shared memory is exhausted goes on the heap and is sent as fallback data
 * (as in the reference); more than one message's payload (64 MiB - 16 bytes) is always
 * SHMIPC_EMSGSIZE. Write into it, then commit. A second reserve before commit replaces the first (also
 * when it fails: then no window is open); write, flush and forward end the window too.
 */
SHMIPC_API int shmipc_stream_reserve(shmipc_stream *st, size_t n, void **ptr);

/**
 * Adds the first `n` bytes of the open window to the send buffer and closes the window;
 * n = 0 gives the window up. SHMIPC_EINVAL when n is larger than the window or no window is
 * open (nothing reserved, or it was committed or ended already), whatever n is.
 */
SHMIPC_API int shmipc_stream_commit(shmipc_stream *st, size_t n);

/**
 * Sends the send buffer as one message: its slices go to the peer through the queue and the
 * peer is woken (flush means "enqueued and peer woken", not "read by the peer"). An empty
 * buffer sends nothing. When the queue is full it retries for up to 100 ms (or the write
 * timeout), then fails with SHMIPC_EQUEUEFULL and drops the message. Data in heap memory
 * goes over the socket (FallbackData); the stream then stays on the socket for good and the
 * session refuses new streams for 30 s.
 */
SHMIPC_API int shmipc_stream_flush(shmipc_stream *st);

/**
 * Returns in *ptr and *len one non-empty contiguous piece of received data, at most `max`
 * bytes (0: no limit), without copying: it points into shared memory. The piece stays valid
 * until shmipc_stream_release() or close. Waits up to the read timeout for data; with
 * SHMIPC_NONBLOCK fails with SHMIPC_EAGAIN. SHMIPC_EEOF once the peer closed the stream and
 * everything was read.
 */
SHMIPC_API int shmipc_stream_read_chunk(shmipc_stream *st, size_t max, const void **ptr,
                                        size_t *len, int flags);

/**
 * Returns in *ptr exactly `n` contiguous received bytes: a pointer into shared memory when
 * they lie in one slice, else a copy in a stream-owned buffer. Valid until the next read,
 * release or close. Waits (as read_chunk) until n bytes are there; SHMIPC_EEOF when the
 * stream ends first (the bytes stay unread).
 */
SHMIPC_API int shmipc_stream_read_exact_bytes(shmipc_stream *st, size_t n, const void **ptr,
                                              int flags);

/** Bytes received and not yet read. Does not wait. */
SHMIPC_API size_t shmipc_stream_available(const shmipc_stream *st);

/**
 * Gives the slices that earlier reads consumed back to shared memory. Pointers returned by
 * earlier reads become invalid. Call it after each message, or memory runs out.
 */
SHMIPC_API int shmipc_stream_release(shmipc_stream *st);

/**
 * Sends received bytes on without copying them: appends to dst's send buffer first the bytes
 * of src read and not yet released (what shmipc_stream_release() would give back), then the
 * next `n` unread bytes of src (0: none), waiting for them as read_exact_bytes does (read
 * timeout of src; SHMIPC_NONBLOCK fails with SHMIPC_EAGAIN and moves nothing). The bytes are
 * consumed from src as if read and released; flush dst to send them. Whole slices move as
 * they are when both streams belong to one session (an echo, or a proxy between two streams
 * of a session); the rest (part of a slice, data that came over the socket, another session)
 * is copied. dst may be src. Pointers returned by earlier reads of src become invalid. On a
 * failure the bytes already moved stay in dst's send buffer and the rest stays in src (running
 * out of memory in the middle of a copied piece may leave that piece in both).
 */
SHMIPC_API int shmipc_stream_forward(shmipc_stream *dst, shmipc_stream *src, size_t n, int flags);

/**
 * Sets this stream's SHMIPC_TIMEOUT_READ or SHMIPC_TIMEOUT_WRITE (a new stream has the
 * config's): negative waits forever, 0 does not wait (a read or flush that cannot proceed at
 * once fails with SHMIPC_ETIMEDOUT), a positive value waits up to that many ms.
 */
SHMIPC_API int shmipc_stream_set_timeout(shmipc_stream *st, int which, int timeout_ms);

/** Deprecated: use shmipc_stream_set_timeout(). The old meaning: 0 waits forever. */
SHMIPC_DEPRECATED("use shmipc_stream_set_timeout")
SHMIPC_API int shmipc_stream_set_timeout_ms(shmipc_stream *st, int which, uint32_t ms);

/**
 * Wakes every call blocked on this stream (a read, forward, a flush retrying a full queue);
 * they fail with SHMIPC_ECLOSED, and so does every later call on it but release and close.
 * The peer is told nothing until close; the session goes on. Thread safe: any thread, any
 * number of times. A flush already writing over the socket (fallback) finishes its message
 * (bounded by the connection write timeout). Returns 0, or SHMIPC_EINVAL for NULL.
 */
SHMIPC_API int shmipc_stream_shutdown(shmipc_stream *st);

/**
 * Closes the stream: unread data is dropped, the peer is told (its reads drain what was sent,
 * then end), and the handle is released. Another thread may be inside a call on the stream:
 * that call wakes with SHMIPC_ECLOSED (as after shmipc_stream_shutdown()) and the stream is
 * freed when it leaves. NULL is a no-op.
 */
SHMIPC_API void shmipc_stream_close(shmipc_stream *st);

/**
 * Flushes what was written (as shmipc_stream_flush()) and closes the stream (as
 * shmipc_stream_close()) in one step: the close travels right behind the last message, and the
 * peer is woken once for both, where a flush and then a close may wake it twice. For the last
 * reply of an exchange. The handle is released in every case, also when the flush fails; the
 * flush's result is returned: 0, its error (the peer gets what was flushed before, then the
 * stream's end), or SHMIPC_EINVAL for NULL. A stream shut down (shmipc_stream_shutdown) sends
 * nothing more: its SHMIPC_ECLOSED is returned, and it is closed. Another thread inside a call
 * on the stream wakes with SHMIPC_ECLOSED, as with close. A signal never ends it with
 * SHMIPC_EINTR (a flush over the socket waits on): no handle would be left to retry with.
 */
SHMIPC_API int shmipc_stream_flush_close(shmipc_stream *st);

/* ------------------------------------------------------------------------------------ */
/* Session manager                                                                      */
/* ------------------------------------------------------------------------------------ */

/**
 * A client pool, as the reference's SessionManager: `session_num` sessions to one server,
 * each with up to `max_stream_num` idle streams kept for reuse (see the config). Thread safe.
 *
 * Lifetime: the manager is freed when the last of these goes: the handle (close), a call in
 * flight, a stream taken from it (put back, or closed with shmipc_stream_close). So after
 * close, the handle stays valid while a stream taken from it is out: put_back of that stream
 * closes it, get_stream fails with SHMIPC_ECLOSED, a second close does nothing. Once every such
 * stream is back, the manager is gone and the handle must not be used again (as after free()).
 */
typedef struct shmipc_session_manager shmipc_session_manager;

/** Connects every session (blocking, as shmipc_session_connect). `cfg` may be NULL. */
SHMIPC_API int shmipc_session_manager_new(const char *address, const shmipc_config *cfg,
                                          shmipc_session_manager **out);

/**
 * A stream from the pool, or a new one. Sessions are used in turn, 32 calls each. A session
 * that has died is reconnected here first; after a failed reconnect, calls fail at once with
 * its code until the rebuild interval has passed. SHMIPC_ECLOSED once the manager's close has
 * begun in another thread.
 */
SHMIPC_API int shmipc_session_manager_get_stream(shmipc_session_manager *m, shmipc_stream **out);

/**
 * Gives a stream back for reuse. A stream that cannot be reused as if new (unread or unsent
 * data, closed by the peer, on fallback, its session gone, or the pool full) is closed, as is
 * every stream once the manager's close has begun, also when this call starts after close
 * returned: the stream keeps the manager alive for it (see the lifetime above). `st` must have
 * been taken from `m`; the handle `st` is released in every case.
 */
SHMIPC_API void shmipc_session_manager_put_back(shmipc_session_manager *m, shmipc_stream *st);

/**
 * Hard close of every session (see shmipc_session_close) and release of the handle. Streams
 * taken from it and not put back must still be put back or closed by their owner; each keeps
 * the manager until then. Safe while other threads are inside get_stream or put_back: those
 * fail with SHMIPC_ECLOSED (put_back closes its stream), close waits for a reconnect in flight
 * (at most the initialize timeout), and the last reference to leave frees the manager (see the
 * lifetime above: after close, only put_back of a stream still out, get_stream, which fails,
 * and close, which does nothing, may be called, and only while such a stream is out). NULL is a
 * no-op.
 */
SHMIPC_API void shmipc_session_manager_close(shmipc_session_manager *m);

/* ------------------------------------------------------------------------------------ */
/* Listener                                                                             */
/* ------------------------------------------------------------------------------------ */

/**
 * Listens on `address` (a unix socket file is created mode 0600; a stale one left by a dead
 * process is replaced). `cfg` may be NULL. The listener accepts V2 and V3 clients.
 */
SHMIPC_API int shmipc_listener_new(const char *address, const shmipc_config *cfg,
                                   shmipc_listener **out);

/**
 * Accepts one client and runs the server handshake. Waits up to `timeout_ms` (any negative
 * value: forever; 0: take a finished handshake without waiting, else SHMIPC_EAGAIN). A client that fails its handshake is dropped and the
 * wait goes on. Thread safe. Each handshake runs on a short-lived thread of the listener (at
 * most 64 at once; a client beyond them is disconnected), so a client that stalls its
 * handshake delays no other; this returns the oldest session whose handshake is done.
 */
SHMIPC_API int shmipc_listener_accept(shmipc_listener *l, int timeout_ms, shmipc_session **out);

/**
 * A file descriptor (an epoll set) readable when a client waits on the socket or a finished
 * handshake waits to be accepted, and for good after shmipc_listener_shutdown() (accept then
 * says SHMIPC_ECLOSED); accept(l, 0, ...) may still say SHMIPC_EAGAIN while the handshake
 * runs. Owned by the listener.
 */
SHMIPC_API int shmipc_listener_fileno(const shmipc_listener *l);

/** A callback about a stream; `user_data` is what was registered with it. */
typedef void (*shmipc_stream_cb)(shmipc_stream *st, void *user_data);
/** Called once when a registration ends, to free its `user_data`. */
typedef void (*shmipc_destroy_cb)(void *user_data);

/**
 * Serves clients on the calling thread until shmipc_listener_stop(): accepts them (each
 * handshake runs on a thread of its own, as for accept), processes every session, and calls
 *  - on_stream(st, user_data) for each stream a client opens; the callee owns `st` and must
 *    close it (now or later, on any thread that follows the stream rules);
 *  - on_data(st, user_data) whenever a stream handed out by on_stream may have data to read,
 *    was closed by the peer, or lost its session; read with SHMIPC_NONBLOCK until
 *    SHMIPC_EAGAIN. Spurious calls are possible. Not for a stream its holder closed before;
 *    one closed on another thread while on_data runs stays a valid handle until on_data
 *    returns (its calls fail with SHMIPC_ECLOSED).
 * Both run on the serving thread and should not block. Before serve returns, it ends its
 * sessions and calls on_data once more for each stream still handed out (its reads give what
 * had come, then SHMIPC_ECLOSED: close it there); then it has closed its sessions (streams
 * still held stay valid handles that fail with SHMIPC_ECLOSED) and called
 * destroy(user_data) if given (also when it fails at once: SHMIPC_EBUSY, because another
 * thread is serving, or SHMIPC_EINVAL for a NULL listener or callback).
 */
SHMIPC_API int shmipc_listener_serve(shmipc_listener *l, shmipc_stream_cb on_stream,
                                     shmipc_stream_cb on_data, void *user_data,
                                     shmipc_destroy_cb destroy);

/**
 * Makes shmipc_listener_serve() return soon. Thread safe and async-signal-safe; may be
 * called from a callback. A stop before serve starts makes the next serve return at once.
 */
SHMIPC_API int shmipc_listener_stop(shmipc_listener *l);

/**
 * Ends the listener but keeps the handle: a shmipc_listener_accept() or
 * shmipc_listener_serve() blocked in another thread wakes and fails with SHMIPC_ECLOSED
 * (serve closes its sessions and calls destroy first), and so does every later accept or
 * serve; handshakes in flight are cut off. Thread safe: any thread, any number of times,
 * also while other threads are inside calls on the listener (not async-signal-safe: it takes
 * a lock; use shmipc_listener_stop() from a signal handler). Returns 0, or SHMIPC_EINVAL for
 * NULL.
 */
SHMIPC_API int shmipc_listener_shutdown(shmipc_listener *l);

/**
 * Stops listening (the unix socket file is removed) and frees the listener. Safe while
 * another thread is blocked in accept or serve: close shuts the listener down first (that
 * call fails with SHMIPC_ECLOSED) and the last call to leave frees it; the socket file goes
 * then. The handle must not be used after close.
 */
SHMIPC_API void shmipc_listener_close(shmipc_listener *l);

/* ------------------------------------------------------------------------------------ */
/* Server (HTTP/1.1)                                                                    */
/* ------------------------------------------------------------------------------------ */

/*
 * An HTTP/1.1 server on the reactor (docs/http.md): shared-nothing worker threads, each with
 * its own event loop (io_uring, or epoll) and its own SO_REUSEPORT listening socket; a
 * connection lives and dies on one worker. Keep-alive and pipelining are handled by the
 * server, as are Date, Content-Length, HEAD, Expect: 100-continue, 404, 405 and 501, the
 * parser's limits (400, 413, 414, 431, ...) and the header and keep-alive timeouts.
 *
 * Handlers run on the worker threads, on the thread that read the request, and must not
 * block: a blocked handler stalls every connection of its worker. With several workers a
 * handler runs on several threads at once, so what its user_data points to must be thread
 * safe (or the server given one worker).
 */
typedef struct shmipc_server_config shmipc_server_config;
typedef struct shmipc_server shmipc_server;
typedef struct shmipc_http_request shmipc_http_request;
typedef struct shmipc_http_response shmipc_http_response;

/** The event-loop backend of a server's workers. */
enum shmipc_backend {
    SHMIPC_BACKEND_DEFAULT = 0,       /**< SHMIPC_REACTOR_BACKEND and SHMIPC_RX_EPOLL decide */
    SHMIPC_BACKEND_AUTO = 1,          /**< io_uring, or epoll where io_uring cannot be set up */
    SHMIPC_BACKEND_IO_URING = 2,      /**< io_uring or fail (SHMIPC_EACCES, SHMIPC_ENOTSUP) */
    SHMIPC_BACKEND_EPOLL = 3,         /**< epoll; SHMIPC_RX_EPOLL picks its mode (persistent) */
    SHMIPC_BACKEND_EPOLL_ONESHOT = 4, /**< epoll re-armed per read, for comparison only */
};

/**
 * Which timeout shmipc_server_config_set_timeout() sets. Values are ms by the rule of every
 * timeout: negative is never (forever), 0 does not wait, where that means something; positive
 * values up to 3600000.
 */
enum shmipc_server_timeout {
    /**
     * A request head must arrive whole within this time of its first byte (of the connection,
     * for the first request); else the connection is closed (slowloris). Negative: no header
     * deadline; 0: SHMIPC_EINVAL. Default SHMIPC_HTTP_HEADER_TIMEOUT_MS, else 10000.
     */
    SHMIPC_SERVER_TIMEOUT_HEADER = 0,
    /**
     * An idle keep-alive connection is closed after this long. 0: no keep-alive (every
     * response carries Connection: close and the connection closes after it, as nginx's
     * keepalive_timeout 0); negative: idle connections never time out. Default
     * SHMIPC_HTTP_KEEPALIVE_TIMEOUT_MS, else 60000. A request body that stops arriving, or a
     * response (or WebSocket output: on_close 1006) the peer stops reading, is closed after
     * this long without progress when it is positive, else after 60000 ms.
     */
    SHMIPC_SERVER_TIMEOUT_KEEPALIVE = 1,
    /**
     * A graceful stop waits this long for requests in flight before it closes what is left.
     * 0: close at once; negative: wait for them however long they take. Default 5000.
     */
    SHMIPC_SERVER_TIMEOUT_STOP = 2,
    /**
     * An open WebSocket that received nothing for this long is sent a ping, and again after
     * each such interval of silence. Negative: never (default); 0: SHMIPC_EINVAL; below
     * SHMIPC_SERVER_TIMEOUT_WS_IDLE when both are set.
     */
    SHMIPC_SERVER_TIMEOUT_WS_PING = 3,
    /**
     * An open WebSocket that received nothing at all (a pong included) for this long is failed:
     * the TCP connection is closed without a close frame and on_close gets 1006. Not counted
     * while the server itself stopped reading it (backpressure). Negative: never (default);
     * 0: SHMIPC_EINVAL; above SHMIPC_SERVER_TIMEOUT_WS_PING when both are set.
     */
    SHMIPC_SERVER_TIMEOUT_WS_IDLE = 4,
};

/** Which limit shmipc_server_config_set_limit() sets; a larger request gets the status named. */
enum shmipc_server_limit {
    SHMIPC_SERVER_LIMIT_REQUEST_LINE = 0, /**< bytes of the request line; 8192; 414 */
    SHMIPC_SERVER_LIMIT_HEAD_BYTES = 1,   /**< bytes of the whole head; 16384, up to 64 MiB; 431 */
    SHMIPC_SERVER_LIMIT_HEADERS = 2,      /**< header fields; 64, up to 4096; 431 */
    SHMIPC_SERVER_LIMIT_BODY = 3,         /**< bytes of a decoded request body; 1 MiB; 413 */
    SHMIPC_SERVER_LIMIT_PIPELINE = 4,     /**< requests answered per connection per loop turn
                                               (fairness between connections); 16, 1..1024 */
    SHMIPC_SERVER_LIMIT_WS_MESSAGE = 5,   /**< bytes of a WebSocket frame or whole message;
                                               16 MiB, up to 1 GiB; close 1009 above it */
    SHMIPC_SERVER_LIMIT_WS_SEND_HIGH_WATER = 6, /**< bytes queued for a WebSocket peer at which
                                                     the server stops reading it; 1 MiB, up to
                                                     1 GiB, at most WS_SEND_LIMIT */
    SHMIPC_SERVER_LIMIT_WS_SEND_LIMIT = 7,      /**< bytes queued at which shmipc_ws_send()
                                                     fails with SHMIPC_EAGAIN; 16 MiB (or the
                                                     high-water mark when larger), up to 1 GiB,
                                                     at least WS_SEND_HIGH_WATER */
    SHMIPC_SERVER_LIMIT_KEEPALIVE_REQUESTS = 8, /**< requests served on one keep-alive
                                                     connection: the last answer says
                                                     Connection: close and the connection
                                                     closes after it (nginx's
                                                     keepalive_requests); 0 keeps the default:
                                                     SHMIPC_HTTP_KEEPALIVE_REQUESTS, else 1000;
                                                     up to 4294967295 */
};

/** Longest address text ("unix:" and a 107-byte path, or "unix:@" and a 107-byte name, fit). */
#define SHMIPC_SERVER_MAX_ADDRESS 127
/** Longest Server header value. */
#define SHMIPC_SERVER_MAX_NAME 127

/**
 * Allocates a server config holding the defaults: address 127.0.0.1, port 8080, workers from
 * SHMIPC_WORKERS (else one per online CPU), backend from the environment, the timeouts and
 * limits above, Server header "shmipc". Setters validate their value and leave the config
 * unchanged on failure (SHMIPC_EINVAL with a detail naming the field). A server copies its
 * config, which may then be changed or freed. Returns 0 or SHMIPC_EINVAL/SHMIPC_ENOMEM.
 */
SHMIPC_API int shmipc_server_config_new(shmipc_server_config **out);

/** Frees a server config. NULL is a no-op. */
SHMIPC_API void shmipc_server_config_free(shmipc_server_config *cfg);

/**
 * Sets the address to listen on: a numeric IPv4 or IPv6 address ("0.0.0.0", "::1"), or a unix
 * socket: "unix:/path/to/socket" (a file made with the process's umask and removed when the
 * server stops) or "unix:@name" (an abstract name, no file). With a unix socket the port is
 * not used (shmipc_server_port() gives 0) and every worker thread accepts from the one socket.
 * At start, a socket file nothing accepts on (left by a server that died) is replaced; a live
 * one is SHMIPC_EADDRINUSE; a path holding anything but a socket (a regular file, a symbolic
 * link, a directory) is SHMIPC_EEXIST and is left untouched. A path over 107 bytes is
 * SHMIPC_ENAMETOOLONG, here. At most SHMIPC_SERVER_MAX_ADDRESS bytes.
 */
SHMIPC_API int shmipc_server_config_set_address(shmipc_server_config *cfg, const char *address);

/** Sets the TCP port, 0..65535; 0 picks an ephemeral port (see shmipc_server_port()). */
SHMIPC_API int shmipc_server_config_set_port(shmipc_server_config *cfg, int port);

/** Sets the number of worker threads, 1..1024; 0 restores the default. */
SHMIPC_API int shmipc_server_config_set_workers(shmipc_server_config *cfg, unsigned workers);

/**
 * Sets the backend (enum shmipc_backend). Anything but SHMIPC_BACKEND_DEFAULT overrides
 * SHMIPC_REACTOR_BACKEND; SHMIPC_BACKEND_AUTO and _EPOLL leave SHMIPC_RX_EPOLL in force.
 */
SHMIPC_API int shmipc_server_config_set_backend(shmipc_server_config *cfg, int backend);

/**
 * Sets one of the timeouts (enum shmipc_server_timeout) in milliseconds: negative is never, 0
 * as given there. Returns 0 or SHMIPC_EINVAL (the config unchanged).
 */
SHMIPC_API int shmipc_server_config_set_timeout(shmipc_server_config *cfg, int which,
                                                int timeout_ms);

/**
 * Deprecated: use shmipc_server_config_set_timeout(). The old meaning: HEADER and KEEPALIVE
 * 1..3600000, STOP 0..3600000, WS_PING and WS_IDLE 0..3600000 with 0 = never.
 */
SHMIPC_DEPRECATED("use shmipc_server_config_set_timeout")
SHMIPC_API int shmipc_server_config_set_timeout_ms(shmipc_server_config *cfg, int which,
                                                   uint32_t ms);

/**
 * Sets one of the limits (enum shmipc_server_limit); 0 restores the default. Values above
 * the bound given there are refused.
 */
SHMIPC_API int shmipc_server_config_set_limit(shmipc_server_config *cfg, int which, uint64_t value);

/**
 * Sets the Server header's value (copied; at most SHMIPC_SERVER_MAX_NAME bytes of visible
 * ASCII and spaces), or removes the header when `name` is NULL or "".
 */
SHMIPC_API int shmipc_server_config_set_server_name(shmipc_server_config *cfg, const char *name);

/**
 * Whether the port may be shared with other processes: 0 (the default) makes
 * shmipc_server_start() fail with SHMIPC_EADDRINUSE when any socket already listens on the
 * address and port; 1 joins the SO_REUSEPORT group of another server of the same user there
 * (the kernel then spreads new connections over both). The server's own workers share the
 * port either way. Unset, SHMIPC_HTTP_REUSEPORT (0 or 1) decides. Other values: SHMIPC_EINVAL.
 */
SHMIPC_API int shmipc_server_config_set_reuse_port(shmipc_server_config *cfg, int share);

/**
 * Creates a server from `cfg` (NULL: defaults), reading the SHMIPC_* variables for what the
 * config leaves at its default; nothing is bound or started yet. Returns 0, SHMIPC_EINVAL
 * (a bad variable, named in the detail) or SHMIPC_ENOMEM.
 */
SHMIPC_API int shmipc_server_new(const shmipc_server_config *cfg, shmipc_server **out);

/**
 * Answers requests whose method and path match with `fn`, on the worker threads (see the
 * section comment). `method` is a method name ("GET", "POST"; a GET route also answers HEAD,
 * without the body) or NULL for any method. `path` is an exact path ("/items"), or a prefix
 * ending in "/\*" ("/items/\*" matches "/items/" and everything below it, but not "/items");
 * an exact route wins over a prefix route, a longer prefix over a shorter one. The query is
 * not part of the path. Only before shmipc_server_start() (else SHMIPC_EBUSY); a route that
 * is already there is SHMIPC_EEXIST. destroy(user_data), when given, runs once: when the
 * server is freed, or at once when the call fails.
 *
 * `fn` fills in the response and returns 0; a negative return answers 500 and closes the
 * connection (what the handler set is dropped). `req` and `res`, and every pointer the
 * request functions return, are valid only during the call.
 */
typedef int (*shmipc_http_handler)(shmipc_http_request *req, shmipc_http_response *res,
                                   void *user_data);
SHMIPC_API int shmipc_server_route(shmipc_server *s, const char *method, const char *path,
                                   shmipc_http_handler fn, void *user_data,
                                   shmipc_destroy_cb destroy);

/**
 * Answers `method` (NULL: GET, which includes HEAD) on `path` (as for routes) with a fixed
 * response, without calling any handler: `status` (200..999), the Content-Type
 * `content_type` (NULL for none) and `len` bytes of `body`, all copied now. Only before
 * shmipc_server_start() (else SHMIPC_EBUSY).
 */
SHMIPC_API int shmipc_server_static(shmipc_server *s, const char *method, const char *path,
                                    int status, const char *content_type, const void *body,
                                    size_t len);

/**
 * Binds the listening sockets and starts the workers; returns once every worker accepts.
 * Does not block beyond that. Starting a running server is a no-op. SHMIPC_EADDRINUSE (the
 * port is served by another socket and reuse_port is off; the detail says so),
 * SHMIPC_EACCES, SHMIPC_ENOTSUP (io_uring requested but refused), ...
 */
SHMIPC_API int shmipc_server_start(shmipc_server *s);

/**
 * Runs the server: starts it unless started, blocks until shmipc_server_stop(), then stops
 * gracefully: no new connections are accepted, requests in flight are answered (with
 * Connection: close), idle keep-alive connections are closed with a FIN, and after the stop
 * timeout whatever is left is closed. Returns 0 once every worker has stopped, or a start
 * failure. A stop requested before run makes it return at once (stopping a server already
 * started); every stop requested while it runs (while it stops, too) is for that run. One
 * caller at a time (SHMIPC_EBUSY).
 */
SHMIPC_API int shmipc_server_run(shmipc_server *s);

/**
 * Asks shmipc_server_run() to stop gracefully and return. Thread safe and async-signal-safe
 * (may be called from a signal handler or a handler); never blocks. Returns 0.
 */
SHMIPC_API int shmipc_server_stop(shmipc_server *s);

/**
 * The TCP port the server listens on (after start; 0 on a unix socket), or SHMIPC_EINVAL
 * before it started.
 */
SHMIPC_API int shmipc_server_port(const shmipc_server *s);

/** The backend the workers run, "io_uring" or "epoll" (after start; else NULL). Static. */
SHMIPC_API const char *shmipc_server_backend(const shmipc_server *s);

/**
 * Stops a running server as shmipc_server_run() does (blocking up to the stop timeout), calls
 * every route's destroy and frees the server. Not while shmipc_server_run() runs on another
 * thread: stop it and let it return first. NULL is a no-op.
 */
SHMIPC_API void shmipc_server_close(shmipc_server *s);

/** Deprecated: the old name of shmipc_server_close(), which it calls. */
SHMIPC_DEPRECATED("use shmipc_server_close")
SHMIPC_API void shmipc_server_free(shmipc_server *s);

/*
 * The request, inside a handler. Strings are not NUL-terminated: each function returns a
 * pointer into the request and stores its length in *len (len may be NULL). They never fail
 * on a valid request; on NULL they return NULL (or 0) with *len set to 0.
 */

/** The method token, "GET", "POST", ... */
SHMIPC_API const char *shmipc_http_request_method(const shmipc_http_request *req, size_t *len);

/** The path of the target, without the query ("/items/7"). */
SHMIPC_API const char *shmipc_http_request_path(const shmipc_http_request *req, size_t *len);

/** The query, after '?' and without it; NULL (and *len 0) when the target has none. */
SHMIPC_API const char *shmipc_http_request_query(const shmipc_http_request *req, size_t *len);

/**
 * For a prefix route ("/items/\*"), the part of the path the '*' matched ("7" for "/items/7");
 * "" otherwise.
 */
SHMIPC_API const char *shmipc_http_request_wildcard(const shmipc_http_request *req, size_t *len);

/**
 * The value of the first header named `name` (case-insensitive), without surrounding
 * whitespace; NULL when the request has none.
 */
SHMIPC_API const char *shmipc_http_request_header(const shmipc_http_request *req, const char *name,
                                                  size_t *len);

/** The number of header fields. */
SHMIPC_API size_t shmipc_http_request_header_count(const shmipc_http_request *req);

/**
 * Header field `i` (0 .. count - 1), as received: its name in *name and *name_len, its value
 * returned. NULL when `i` is out of range.
 */
SHMIPC_API const char *shmipc_http_request_header_at(const shmipc_http_request *req, size_t i,
                                                     const char **name, size_t *name_len,
                                                     size_t *len);

/** The decoded body (Content-Length or chunked); "" with *len 0 when there is none. */
SHMIPC_API const char *shmipc_http_request_body(const shmipc_http_request *req, size_t *len);

/** The HTTP version: 10 for HTTP/1.0, 11 for HTTP/1.1. */
SHMIPC_API int shmipc_http_request_version(const shmipc_http_request *req);

/**
 * The address of the request's client (peer) or the one it came to (local), as getpeername()
 * and getsockname() give them: at most *len bytes go to `addr` (a struct sockaddr_storage
 * holds any), and *len becomes the address's whole length. AF_INET or AF_INET6 on a TCP
 * listener; AF_UNIX on a unix one (a client's unnamed socket: the family alone). The kernel is
 * asked once per connection. In the handler, as the request. Returns 0; SHMIPC_EINVAL for a
 * NULL argument; SHMIPC_ECONNRESET when the kernel could not tell (the client already left).
 */
SHMIPC_API int shmipc_http_request_peer(const shmipc_http_request *req, struct sockaddr *addr,
                                        socklen_t *len);
SHMIPC_API int shmipc_http_request_local(const shmipc_http_request *req, struct sockaddr *addr,
                                         socklen_t *len);

/*
 * The response, inside a handler. It starts as 200 with no Content-Type and an empty body.
 * The server adds Date, Server, Content-Length and Connection; the head and the body leave in
 * one vectored write, the body not copied again when it is large. A HEAD request gets the
 * head only. After shmipc_http_response_end() every setter fails with SHMIPC_EBUSY.
 */

/** Sets the status, 200..999 (1xx responses are the server's). */
SHMIPC_API int shmipc_http_response_set_status(shmipc_http_response *res, int status);

/**
 * Adds a header; name and value are copied. The name must be a token, the value free of
 * control bytes. Content-Type sets the content type (once); "Connection: close" closes the
 * connection after this response; Transfer-Encoding, Date, Server and other Connection values
 * are the server's (SHMIPC_EINVAL). Content-Length is the server's too (SHMIPC_EINVAL), but on
 * an answer to HEAD: there it says, once, the length GET's body would have (1 to 19 ASCII
 * digits), the header the client gets whatever body is set, and no body goes (RFC 9110 8.6).
 * At most 32 headers and 4096 bytes of names and values per response (SHMIPC_ENOSPC).
 */
SHMIPC_API int shmipc_http_response_add_header(shmipc_http_response *res, const char *name,
                                               const char *value);

/** Sets the body to a copy of `len` bytes of `data` (replacing an earlier body). */
SHMIPC_API int shmipc_http_response_body(shmipc_http_response *res, const void *data, size_t len);

/**
 * Sets the body to `len` bytes of `data` without copying: the memory must stay valid and
 * unchanged until release(user_data) runs, once, on the worker thread, when the response has
 * been written or the connection failed. When this call fails, release runs before it
 * returns. Replacing the body later still releases this one.
 */
SHMIPC_API int shmipc_http_response_body_borrow(shmipc_http_response *res, const void *data,
                                                size_t len, void *user_data,
                                                shmipc_destroy_cb release);

/**
 * Ends the response: nothing can be changed afterwards. Optional: returning from the handler
 * ends it. A response is complete when its handler returns, unless the handler deferred it
 * (shmipc_http_response_defer(): an answer from any thread, later).
 */
SHMIPC_API int shmipc_http_response_end(shmipc_http_response *res);

/*
 * Answers from any thread (docs/http.md, "Answers from any thread"). A handler that cannot
 * answer at once (the work runs on a thread pool, another event loop, a remote service) calls
 * shmipc_http_response_defer() and returns 0; the handle it gets is then filled in and sent
 * from any thread, with the same checks as the response above. Meanwhile the connection waits
 * (requests pipelined behind it are answered after it, in order) and the worker serves its
 * other connections. The handle belongs to one thread at a time (it has no lock of its own);
 * shmipc_http_pending_send() or shmipc_http_pending_free() gives it up, exactly once.
 */
typedef struct shmipc_http_pending shmipc_http_pending;

/** Why a deferred request stopped waiting (the `reason` of shmipc_http_pending_cb). */
enum shmipc_http_pending_end {
    SHMIPC_HTTP_PENDING_SENT = 0,        /**< the answer went to the connection */
    SHMIPC_HTTP_PENDING_CLIENT_GONE = 1, /**< the client left, or the server stopped first */
    SHMIPC_HTTP_PENDING_TIMEOUT = 2,     /**< the deadline passed: the client got 504 */
    SHMIPC_HTTP_PENDING_FAILED = 3,      /**< the handler returned an error after deferring,
                                              or the answer could not be built: 500 */
    SHMIPC_HTTP_PENDING_ABANDONED = 4,   /**< freed unsent: the client got 500 */
};

/**
 * Runs once per deferral, on the worker thread, when the request stops waiting, with a
 * shmipc_http_pending_end reason: user_data may be freed there. Possibly after the handle was
 * sent or freed, possibly before (the client left first). It must not block, and must not
 * call the server's functions other than shmipc_http_pending_*.
 */
typedef void (*shmipc_http_pending_cb)(void *user_data, int reason);

/**
 * Inside a handler: this request is answered later, from any thread, through *out (200, no
 * headers, an empty body until set). Return 0 from the handler afterwards; a negative return
 * answers 500 and ends the deferral (FAILED). What was set on `res` is dropped and `res`
 * ends. `timeout_ms`: the client gets 504 when no answer was sent that long after the
 * request (1..3600000), negative: no deadline (the client's leaving and the server's stop end
 * the wait); 0 is SHMIPC_EINVAL. `on_end` may be NULL.
 * SHMIPC_EBUSY for a response that has ended or was deferred already, SHMIPC_ENOMEM.
 */
SHMIPC_API int shmipc_http_response_defer(shmipc_http_response *res, int timeout_ms,
                                          shmipc_http_pending_cb on_end, void *user_data,
                                          shmipc_http_pending **out);

/** The answer's status, 200..999. Any thread (the handle's owner). */
SHMIPC_API int shmipc_http_pending_set_status(shmipc_http_pending *p, int status);

/** A header of the answer, as shmipc_http_response_add_header() (the same checks and
 * bounds; Connection: close counts toward the 32 headers). Any thread (the handle's owner). */
SHMIPC_API int shmipc_http_pending_add_header(shmipc_http_pending *p, const char *name,
                                              const char *value);

/** The answer's body, a copy of `len` bytes (replacing an earlier body). */
SHMIPC_API int shmipc_http_pending_body(shmipc_http_pending *p, const void *data, size_t len);

/**
 * The answer's body without a copy: the memory must stay valid and unchanged until
 * release(user_data) runs, once, on whichever thread last holds it (the worker's once written;
 * the caller's when this call fails or the request stopped waiting). Replacing it releases it.
 * Without `release` the bytes are copied now, as by shmipc_http_pending_body(). The request's
 * on_end (SENT) may run before the release: do not free the body in on_end.
 */
SHMIPC_API int shmipc_http_pending_body_borrow(shmipc_http_pending *p, const void *data, size_t len,
                                               void *user_data, shmipc_destroy_cb release);

/**
 * Sends the answer from any thread and gives the handle up (it is invalid afterwards, whatever
 * the result): the worker is woken and writes it. 0 once queued; SHMIPC_ECLOSED when the
 * request had stopped waiting (the client left, the deadline passed, the server stopped):
 * nothing is sent, the body is released. Never blocks (a mutex, an eventfd write).
 */
SHMIPC_API int shmipc_http_pending_send(shmipc_http_pending *p);

/** 1 while the request still waits for its answer, 0 once it stopped (on_end ran or runs). */
SHMIPC_API int shmipc_http_pending_waiting(const shmipc_http_pending *p);

/** Gives the handle up unsent: a request still waiting is answered 500 (ABANDONED). NULL is a
 * no-op. */
SHMIPC_API void shmipc_http_pending_free(shmipc_http_pending *p);

/* ------------------------------------------------------------------------------------ */
/* WebSocket                                                                            */
/* ------------------------------------------------------------------------------------ */

/*
 * WebSocket (RFC 6455) routes on the HTTP server (docs/websocket.md). Callbacks run on the
 * worker thread that owns the connection, like HTTP handlers, and must not block. Messages
 * arrive whole (fragments reassembled, text checked to be UTF-8); pings are answered, the close
 * handshake and protocol errors (1002, 1007, 1009) are the server's. Sends are queued and
 * written as the peer reads: a peer that does not read makes the server stop reading it, and
 * sends past the send queue's limit fail with SHMIPC_EAGAIN, so memory stays bounded.
 */
/** One WebSocket connection: valid from on_open until on_close returns. */
typedef struct shmipc_ws shmipc_ws;

/** The kind of a message. */
enum shmipc_ws_kind { SHMIPC_WS_TEXT = 1, SHMIPC_WS_BINARY = 2 };

/**
 * After a valid upgrade request, before the 101 is sent. Return 0 to accept, negative to
 * refuse (403). req (and what its functions return) is valid only during the call. NULL
 * callback: accept all. The connection's functions may be used from here on (what is sent
 * follows the 101).
 */
typedef int (*shmipc_ws_open_cb)(shmipc_ws *ws, const shmipc_http_request *req, void *user_data);

/**
 * One whole message (fragments reassembled): kind SHMIPC_WS_TEXT (valid UTF-8) or
 * SHMIPC_WS_BINARY. data is valid only during the call.
 */
typedef void (*shmipc_ws_message_cb)(shmipc_ws *ws, int kind, const void *data, size_t len,
                                     void *user_data);

/**
 * Once per accepted connection, when it ends for any reason: code is the peer's close code
 * (1005 when the close frame had none, 1006 when the connection dropped without a close frame),
 * or the code the server failed the connection with (1002, 1007, 1009); reason its text
 * (reason_len bytes, NUL-terminated, valid during the call). ws is invalid after it returns.
 * NULL callback allowed.
 */
typedef void (*shmipc_ws_close_cb)(shmipc_ws *ws, int code, const char *reason, size_t reason_len,
                                   void *user_data);

/**
 * Serves WebSocket upgrades on `path` (exact, or prefix ending in "/\*", as for routes; a GET
 * route on the same path keeps answering plain GETs, other requests there get the handshake's
 * 400/426). `subprotocols`: comma-separated list the server offers in preference order, or
 * NULL. on_message is required. One user_data for the three callbacks; destroy(user_data)
 * runs once, when the server is freed or at once when this call fails. Only before
 * shmipc_server_start() (SHMIPC_EBUSY); SHMIPC_EEXIST when the path has a WebSocket route.
 */
SHMIPC_API int shmipc_server_websocket(shmipc_server *s, const char *path, const char *subprotocols,
                                       shmipc_ws_open_cb on_open, shmipc_ws_message_cb on_message,
                                       shmipc_ws_close_cb on_close, void *user_data,
                                       shmipc_destroy_cb destroy);

/*
 * The following are called on the connection's worker thread only (inside any callback of
 * that worker, typically its own callbacks; else SHMIPC_EBUSY), between on_open and the end of
 * on_close.
 */

/**
 * Queues one message, copied (kind TEXT: data must be valid UTF-8, else SHMIPC_EINVAL).
 * SHMIPC_EAGAIN when the connection's send queue is at its limit (a client that does not
 * read); SHMIPC_EPIPE once closing. Never blocks.
 */
SHMIPC_API int shmipc_ws_send(shmipc_ws *ws, int kind, const void *data, size_t len);

/** Queues a ping with up to 125 bytes of payload (else SHMIPC_EINVAL). Errors as send. */
SHMIPC_API int shmipc_ws_ping(shmipc_ws *ws, const void *data, size_t len);

/**
 * Starts the close handshake with `code` (1000..4999, valid per RFC 6455) and `reason` (NULL
 * or UTF-8, at most 123 bytes). Nothing can be sent afterwards; messages that still arrive are
 * dropped. on_close follows, with the peer's code, or 1006 when the peer does not answer
 * within the linger time (2 s). SHMIPC_EPIPE when already closing.
 */
SHMIPC_API int shmipc_ws_close(shmipc_ws *ws, int code, const char *reason);

/** The subprotocol selected at upgrade (NUL-terminated, owned by the server), or NULL. */
SHMIPC_API const char *shmipc_ws_subprotocol(const shmipc_ws *ws);

/** Sets the per-connection pointer for the application (NULL at open). */
SHMIPC_API void shmipc_ws_set_data(shmipc_ws *ws, void *data);

/** The per-connection pointer set with shmipc_ws_set_data(), or NULL. */
SHMIPC_API void *shmipc_ws_data(const shmipc_ws *ws);

#ifdef __cplusplus
}
#endif

#endif /* SHMIPC_H */
