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
 * (default both). A server that does not accept V4 closes the connection on a V4 header, as
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
/** Returns the timeout in ms, 0 meaning "wait forever" for read/write; -1 for a bad `which`. */
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

/* ------------------------------------------------------------------------------------ */
/* Sessions and streams                                                                 */
/* ------------------------------------------------------------------------------------ */

/*
 * A session is one connection to a peer (a unix or TCP socket for the handshake and wakeups)
 * with its shared memory: a buffer of slices and a pair of queues. Streams are multiplexed
 * byte streams inside a session; the client opens them, the server accepts them.
 *
 * Threads: a session handle may be used from several threads at once; a stream handle from
 * one thread at a time (different streams of one session may run in parallel). No library
 * thread exists: the thread that waits for data reads the socket itself, or an event loop
 * polls shmipc_session_fileno() and calls shmipc_session_process().
 *
 * Addresses: "unix:/path", "/path" or "./path" (unix socket), "unix:@name" (abstract),
 * "tcp:host:port" or "host:port". memfd sessions need a unix socket.
 */
typedef struct shmipc_session shmipc_session;
typedef struct shmipc_stream shmipc_stream;
typedef struct shmipc_listener shmipc_listener;

/** Flag for reads and accepts: fail with SHMIPC_EAGAIN instead of waiting. */
#define SHMIPC_NONBLOCK 1

/** A timeout argument meaning "wait forever". */
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
 * Takes the next stream the peer opened (server sessions). Waits up to `timeout_ms`
 * (SHMIPC_WAIT_FOREVER, or 0 to poll); SHMIPC_ETIMEDOUT or SHMIPC_EAGAIN when none came.
 */
SHMIPC_API int shmipc_session_accept_stream(shmipc_session *s, int timeout_ms, shmipc_stream **out);

/**
 * The descriptor that becomes readable when the session has events to process: register it
 * with an event loop (level-triggered) and call shmipc_session_process() when it fires. It is
 * the socket, or for V4 eventfd and polling sessions an epoll descriptor that also watches
 * the wakeup eventfd or the polling timer.
 */
SHMIPC_API int shmipc_session_fileno(const shmipc_session *s);

/**
 * Processes whatever events are pending without waiting: data for streams, closes, new
 * streams. Returns the number of events handled (>= 0), or the code that ended the session.
 * Thread safe; returns 0 at once when another thread is already processing.
 */
SHMIPC_API int shmipc_session_process(shmipc_session *s);

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
 * Hard close, as in the reference: the socket is closed at once, the peer sees the
 * connection end, queued but unread data is lost, and every stream of the session fails
 * with SHMIPC_ECLOSED from then on. Releases the handle; shared memory stays mapped until
 * the last stream handle is closed, so pointers from read_chunk stay valid until then.
 * NULL is a no-op.
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
 * Reserves a contiguous window of `n` bytes at the end of the send buffer, in shared memory
 * when a slice can hold it, and stores its address in *ptr. Write into it, then commit.
 * A second reserve before commit replaces the first.
 */
SHMIPC_API int shmipc_stream_reserve(shmipc_stream *st, size_t n, void **ptr);

/** Adds the first `n` bytes of the last reserved window to the send buffer (n <= reserved). */
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

/** Sets this stream's SHMIPC_TIMEOUT_READ or SHMIPC_TIMEOUT_WRITE (0 = forever). */
SHMIPC_API int shmipc_stream_set_timeout_ms(shmipc_stream *st, int which, uint32_t ms);

/**
 * Closes the stream: unread data is dropped, the peer is told (its reads drain what was sent,
 * then end), and the handle is released. NULL is a no-op.
 */
SHMIPC_API void shmipc_stream_close(shmipc_stream *st);

/* ------------------------------------------------------------------------------------ */
/* Session manager                                                                      */
/* ------------------------------------------------------------------------------------ */

/**
 * A client pool, as the reference's SessionManager: `session_num` sessions to one server,
 * each with up to `max_stream_num` idle streams kept for reuse (see the config). Thread safe.
 */
typedef struct shmipc_session_manager shmipc_session_manager;

/** Connects every session (blocking, as shmipc_session_connect). `cfg` may be NULL. */
SHMIPC_API int shmipc_session_manager_new(const char *address, const shmipc_config *cfg,
                                          shmipc_session_manager **out);

/**
 * A stream from the pool, or a new one. Sessions are used in turn, 32 calls each. A session
 * that has died is reconnected here first; after a failed reconnect, calls fail at once with
 * its code until the rebuild interval has passed.
 */
SHMIPC_API int shmipc_session_manager_get_stream(shmipc_session_manager *m, shmipc_stream **out);

/**
 * Gives a stream back for reuse. A stream that cannot be reused as if new (unread or unsent
 * data, closed by the peer, on fallback, its session gone, or the pool full) is closed.
 */
SHMIPC_API void shmipc_session_manager_put_back(shmipc_session_manager *m, shmipc_stream *st);

/**
 * Hard close of every session (see shmipc_session_close) and release of the manager. Streams
 * taken from it and not put back must still be closed by their owner. NULL is a no-op.
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
 * Accepts one client and runs the server handshake. Waits up to `timeout_ms`
 * (SHMIPC_WAIT_FOREVER, or 0 to poll). A client that fails its handshake is dropped and the
 * wait goes on. Thread safe.
 */
SHMIPC_API int shmipc_listener_accept(shmipc_listener *l, int timeout_ms, shmipc_session **out);

/** The listening socket, readable when a client is waiting. */
SHMIPC_API int shmipc_listener_fileno(const shmipc_listener *l);

/** A callback about a stream; `user_data` is what was registered with it. */
typedef void (*shmipc_stream_cb)(shmipc_stream *st, void *user_data);
/** Called once when a registration ends, to free its `user_data`. */
typedef void (*shmipc_destroy_cb)(void *user_data);

/**
 * Serves clients on the calling thread until shmipc_listener_stop(): accepts them (running
 * each handshake, up to the initialize timeout), processes every session, and calls
 *  - on_stream(st, user_data) for each stream a client opens; the callee owns `st` and must
 *    close it (now or later, on any thread that follows the stream rules);
 *  - on_data(st, user_data) whenever a stream handed out by on_stream may have data to read,
 *    was closed by the peer, or lost its session; read with SHMIPC_NONBLOCK until
 *    SHMIPC_EAGAIN. Spurious calls are possible.
 * Both run on the serving thread and should not block. When serve returns, it has closed its
 * sessions (streams still held stay valid handles that fail with SHMIPC_ECLOSED) and called
 * destroy(user_data) if given (also when it fails at once with SHMIPC_EBUSY, because another
 * thread is serving).
 */
SHMIPC_API int shmipc_listener_serve(shmipc_listener *l, shmipc_stream_cb on_stream,
                                     shmipc_stream_cb on_data, void *user_data,
                                     shmipc_destroy_cb destroy);

/**
 * Makes shmipc_listener_serve() return soon. Thread safe and async-signal-safe; may be
 * called from a callback. A stop before serve starts makes the next serve return at once.
 */
SHMIPC_API int shmipc_listener_stop(shmipc_listener *l);

/** Stops listening (the unix socket file is removed) and frees the listener. */
SHMIPC_API void shmipc_listener_close(shmipc_listener *l);

#ifdef __cplusplus
}
#endif

#endif /* SHMIPC_H */
