/*
 * The config object behind the public shmipc_config handle. The builder in
 * bindings/config.c validates every field when it is set, so the core reads these fields
 * without checking them again.
 */
#ifndef SHMIPC_CORE_IPC_CONFIG_H
#define SHMIPC_CORE_IPC_CONFIG_H

#include "shmipc.h"

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
    uint32_t timeout_ms[4]; /* indexed by enum shmipc_timeout */
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
};

/*
 * Slices a class gets in a buffer of `capacity` bytes split into `nclasses` lists, by the
 * creator's formula (reference §2.3): floor(regionCap * percent / 100) / (size + 20).
 */
uint32_t shmipc__slices_per_class(uint32_t capacity, uint32_t nclasses, shmipc_slice_class c);

#endif
