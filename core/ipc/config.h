/*
 * The config object behind the public shmipc_config handle, and its builder (config.c). The
 * setters validate every field when it is set, so the core reads these fields without
 * checking them again. It lives in ipc/, not common/: every field is an IPC notion (the shared
 * buffer, the protocol and wakeup, the client pool, the listener's socket), and only ipc/
 * reads it. bindings/config.c maps the public shmipc_config_* calls onto these.
 */
#ifndef SHMIPC_CORE_IPC_CONFIG_H
#define SHMIPC_CORE_IPC_CONFIG_H

#include "shmipc.h"

#include <stddef.h>
#include <stdint.h>

/* Bytes of the buffer-manager header and of each list header (reference §2.2, §2.3). */
#define SHMIPC__BUFFER_HEADER_SIZE 8u
#define SHMIPC__LIST_HEADER_SIZE   36u
#define SHMIPC__SLICE_HEADER_SIZE  20u

struct shmipc_config {
    int memmap_type;
    uint32_t buffer_capacity;
    uint32_t queue_capacity;
    uint32_t nclasses;
    shmipc_slice_class classes[SHMIPC_MAX_SLICE_CLASSES]; /* sorted by size, ascending */
    char path_prefix[SHMIPC_MAX_PATH_PREFIX + 1];
    /* Indexed by enum shmipc_timeout: -1 waits forever, 0 does not wait (read and write only). */
    int64_t timeout_ms[4];
    int protocol;
    int fallback;
    int wakeup;
    uint32_t polling_interval_us;
    /* Session manager (client pool). */
    uint32_t session_num;
    uint32_t max_stream_num;
    uint32_t rebuild_interval_ms;
    /* Server: whether V4 clients are accepted, and which optional V4 features. */
    int server_v4;
    uint32_t server_v4_features;
    /* Peer-uid allow-list (empty: any peer) and the listener's socket file mode (0: 0600). */
    uint32_t npeer_uids;
    uint32_t peer_uids[SHMIPC_MAX_PEER_UIDS];
    unsigned socket_mode;
    /*
     * What a peer may make a session hold on our heap (0: the default): streams it opened
     * that nobody accepted yet, and fallback bytes that streams hold unread or unreleased.
     */
    uint32_t max_pending_streams;
    uint64_t max_fallback_unread;
    /* Longest spin of a waiter before it sleeps, in µs (0: never spin); see session_wait.c. */
    uint32_t spin_us;
    /* Shared memory exhausted: 0 sends over the socket (fallback, as shmipc-go); 1 makes a
     * write wait for the peer to free some, up to its write timeout (session_write.c). */
    int memory_wait;
};

/* Most a waiter may spin: 100 ms, far past any gap worth spinning for. */
#define SHMIPC__SPIN_US_MAX 100000u

/* The spin budget a new config starts with: SHMIPC_SPIN_US, else the default (session_wait.c). */
uint32_t shmipc__spin_default_us(void);

/*
 * Slices a class gets in a buffer of `capacity` bytes split into `nclasses` lists, by the
 * creator's formula (reference §2.3): floor(regionCap * percent / 100) / (size + 20).
 */
uint32_t shmipc__slices_per_class(uint32_t capacity, uint32_t nclasses, shmipc_slice_class c);

/*
 * The builder. Every call takes non-NULL configs and out pointers; each behaves as the public
 * call of the same name documents in shmipc.h.
 */
int shmipc__config_new(shmipc_config **out);
int shmipc__config_clone(const shmipc_config *src, shmipc_config **out);
void shmipc__config_free(shmipc_config *cfg);
int shmipc__config_validate(const shmipc_config *cfg);
int shmipc__config_set_memmap_type(shmipc_config *cfg, int type);
int shmipc__config_set_buffer_capacity(shmipc_config *cfg, uint64_t bytes);
int shmipc__config_set_queue_capacity(shmipc_config *cfg, uint32_t capacity);
int shmipc__config_set_slice_classes(shmipc_config *cfg, const shmipc_slice_class *classes,
                                     size_t n);
int shmipc__config_parse_slice_classes(shmipc_config *cfg, const char *spec);
int shmipc__config_get_slice_classes(const shmipc_config *cfg, shmipc_slice_class *out, size_t cap);
int shmipc__config_set_path_prefix(shmipc_config *cfg, const char *prefix);
int shmipc__config_set_timeout_ms(shmipc_config *cfg, int which, uint32_t ms);
int64_t shmipc__config_get_timeout_ms(const shmipc_config *cfg, int which);
int shmipc__config_set_timeout(shmipc_config *cfg, int which, int timeout_ms);
int shmipc__config_get_timeout(const shmipc_config *cfg, int which, int *timeout_ms);
int shmipc__config_set_protocol(shmipc_config *cfg, int protocol, int fallback);
int shmipc__config_set_wakeup(shmipc_config *cfg, int wakeup, uint32_t polling_interval_us);
int shmipc__config_with_v4(shmipc_config *cfg);
int shmipc__config_with_v4_eventfd(shmipc_config *cfg);
int shmipc__config_with_v4_event_queue_polling(shmipc_config *cfg, uint32_t interval_us);
int shmipc__config_set_session_num(shmipc_config *cfg, uint32_t n);
int shmipc__config_set_max_stream_num(shmipc_config *cfg, uint32_t n);
int shmipc__config_set_rebuild_interval_ms(shmipc_config *cfg, uint32_t ms);
int shmipc__config_set_server_v4(shmipc_config *cfg, int accept, unsigned features);
int shmipc__config_set_peer_uids(shmipc_config *cfg, const uint32_t *uids, size_t n);
int shmipc__config_get_peer_uids(const shmipc_config *cfg, uint32_t *out, size_t cap);
int shmipc__config_set_socket_mode(shmipc_config *cfg, unsigned mode);
int shmipc__config_set_max_pending_streams(shmipc_config *cfg, uint32_t n);
int shmipc__config_set_max_fallback_unread(shmipc_config *cfg, uint64_t bytes);
int shmipc__config_set_spin_us(shmipc_config *cfg, uint32_t us);
uint32_t shmipc__config_get_spin_us(const shmipc_config *cfg);

/* The limits in force: the value set, or the default where 0 means "the default". */
unsigned shmipc__config_get_socket_mode(const shmipc_config *cfg);
uint32_t shmipc__config_get_max_pending_streams(const shmipc_config *cfg);
uint64_t shmipc__config_get_max_fallback_unread(const shmipc_config *cfg);
int shmipc__config_set_memory_wait(shmipc_config *cfg, int wait);

#endif
