/*
 * Exported config calls: a NULL config refused, then the builder in core/ipc/config.c, which
 * owns the defaults and every rule. Plain getters read the field (0 or NULL for a NULL
 * config, as shmipc.h documents).
 */
#include "shmipc.h"

#include "common/error.h"
#include "ipc/config.h"

#define REQUIRE_CONFIG(cfg, fn)                                                                    \
    do {                                                                                           \
        if ((cfg) == NULL)                                                                         \
            return shmipc__fail(SHMIPC_EINVAL, fn ": config is NULL");                             \
    } while (0)

SHMIPC_API int shmipc_config_new(shmipc_config **out)
{
    if (out == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "config_new: out is NULL");
    return shmipc__config_new(out);
}

SHMIPC_API int shmipc_config_clone(const shmipc_config *src, shmipc_config **out)
{
    if (src == NULL || out == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "config_clone: %s is NULL", src ? "out" : "config");
    return shmipc__config_clone(src, out);
}

SHMIPC_API void shmipc_config_free(shmipc_config *cfg)
{
    shmipc__config_free(cfg);
}

SHMIPC_API int shmipc_config_validate(const shmipc_config *cfg)
{
    REQUIRE_CONFIG(cfg, "config_validate");
    return shmipc__config_validate(cfg);
}

SHMIPC_API int shmipc_config_set_memmap_type(shmipc_config *cfg, int type)
{
    REQUIRE_CONFIG(cfg, "memmap_type");
    return shmipc__config_set_memmap_type(cfg, type);
}

SHMIPC_API int shmipc_config_set_buffer_capacity(shmipc_config *cfg, uint64_t bytes)
{
    REQUIRE_CONFIG(cfg, "buffer_capacity");
    return shmipc__config_set_buffer_capacity(cfg, bytes);
}

SHMIPC_API int shmipc_config_set_queue_capacity(shmipc_config *cfg, uint32_t capacity)
{
    REQUIRE_CONFIG(cfg, "queue_capacity");
    return shmipc__config_set_queue_capacity(cfg, capacity);
}

SHMIPC_API int shmipc_config_set_slice_classes(shmipc_config *cfg,
                                               const shmipc_slice_class *classes, size_t n)
{
    REQUIRE_CONFIG(cfg, "slice_classes");
    return shmipc__config_set_slice_classes(cfg, classes, n);
}

SHMIPC_API int shmipc_config_parse_slice_classes(shmipc_config *cfg, const char *spec)
{
    REQUIRE_CONFIG(cfg, "slice_classes");
    return shmipc__config_parse_slice_classes(cfg, spec);
}

SHMIPC_API int shmipc_config_get_slice_classes(const shmipc_config *cfg, shmipc_slice_class *out,
                                               size_t cap)
{
    REQUIRE_CONFIG(cfg, "slice_classes");
    return shmipc__config_get_slice_classes(cfg, out, cap);
}

SHMIPC_API int shmipc_config_set_path_prefix(shmipc_config *cfg, const char *prefix)
{
    REQUIRE_CONFIG(cfg, "path_prefix");
    return shmipc__config_set_path_prefix(cfg, prefix);
}

SHMIPC_API int shmipc_config_set_timeout_ms(shmipc_config *cfg, int which, uint32_t ms)
{
    REQUIRE_CONFIG(cfg, "timeout");
    return shmipc__config_set_timeout_ms(cfg, which, ms);
}

SHMIPC_API int shmipc_config_set_timeout(shmipc_config *cfg, int which, int timeout_ms)
{
    REQUIRE_CONFIG(cfg, "timeout");
    return shmipc__config_set_timeout(cfg, which, timeout_ms);
}

SHMIPC_API int shmipc_config_get_timeout(const shmipc_config *cfg, int which, int *timeout_ms)
{
    REQUIRE_CONFIG(cfg, "get_timeout");
    if (timeout_ms == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "get_timeout: timeout_ms is NULL");
    return shmipc__config_get_timeout(cfg, which, timeout_ms);
}

SHMIPC_API int shmipc_config_set_protocol(shmipc_config *cfg, int protocol, int fallback)
{
    REQUIRE_CONFIG(cfg, "protocol");
    return shmipc__config_set_protocol(cfg, protocol, fallback);
}

SHMIPC_API int shmipc_config_set_wakeup(shmipc_config *cfg, int wakeup,
                                        uint32_t polling_interval_us)
{
    REQUIRE_CONFIG(cfg, "wakeup");
    return shmipc__config_set_wakeup(cfg, wakeup, polling_interval_us);
}

SHMIPC_API int shmipc_config_with_v4(shmipc_config *cfg)
{
    REQUIRE_CONFIG(cfg, "with_v4");
    return shmipc__config_with_v4(cfg);
}

SHMIPC_API int shmipc_config_with_v4_eventfd(shmipc_config *cfg)
{
    REQUIRE_CONFIG(cfg, "with_v4_eventfd");
    return shmipc__config_with_v4_eventfd(cfg);
}

SHMIPC_API int shmipc_config_with_v4_event_queue_polling(shmipc_config *cfg, uint32_t interval_us)
{
    REQUIRE_CONFIG(cfg, "with_v4_event_queue_polling");
    return shmipc__config_with_v4_event_queue_polling(cfg, interval_us);
}

SHMIPC_API int shmipc_config_get_memmap_type(const shmipc_config *cfg)
{
    return cfg ? cfg->memmap_type : 0;
}

SHMIPC_API uint64_t shmipc_config_get_buffer_capacity(const shmipc_config *cfg)
{
    return cfg ? cfg->buffer_capacity : 0;
}

SHMIPC_API uint32_t shmipc_config_get_queue_capacity(const shmipc_config *cfg)
{
    return cfg ? cfg->queue_capacity : 0;
}

SHMIPC_API const char *shmipc_config_get_path_prefix(const shmipc_config *cfg)
{
    return cfg ? cfg->path_prefix : NULL;
}

SHMIPC_API int64_t shmipc_config_get_timeout_ms(const shmipc_config *cfg, int which)
{
    return cfg ? shmipc__config_get_timeout_ms(cfg, which) : -1;
}

SHMIPC_API int shmipc_config_get_protocol(const shmipc_config *cfg)
{
    return cfg ? cfg->protocol : 0;
}

SHMIPC_API int shmipc_config_get_fallback(const shmipc_config *cfg)
{
    return cfg ? cfg->fallback : 0;
}

SHMIPC_API int shmipc_config_get_wakeup(const shmipc_config *cfg)
{
    return cfg ? cfg->wakeup : 0;
}

SHMIPC_API uint32_t shmipc_config_get_polling_interval_us(const shmipc_config *cfg)
{
    return cfg ? cfg->polling_interval_us : 0;
}

SHMIPC_API int shmipc_config_set_session_num(shmipc_config *cfg, uint32_t n)
{
    REQUIRE_CONFIG(cfg, "session_num");
    return shmipc__config_set_session_num(cfg, n);
}

SHMIPC_API int shmipc_config_set_max_stream_num(shmipc_config *cfg, uint32_t n)
{
    REQUIRE_CONFIG(cfg, "max_stream_num");
    return shmipc__config_set_max_stream_num(cfg, n);
}

SHMIPC_API int shmipc_config_set_rebuild_interval_ms(shmipc_config *cfg, uint32_t ms)
{
    REQUIRE_CONFIG(cfg, "rebuild_interval");
    return shmipc__config_set_rebuild_interval_ms(cfg, ms);
}

SHMIPC_API uint32_t shmipc_config_get_session_num(const shmipc_config *cfg)
{
    return cfg ? cfg->session_num : 0;
}

SHMIPC_API uint32_t shmipc_config_get_max_stream_num(const shmipc_config *cfg)
{
    return cfg ? cfg->max_stream_num : 0;
}

SHMIPC_API uint32_t shmipc_config_get_rebuild_interval_ms(const shmipc_config *cfg)
{
    return cfg ? cfg->rebuild_interval_ms : 0;
}

SHMIPC_API int shmipc_config_set_server_v4(shmipc_config *cfg, int accept, unsigned features)
{
    REQUIRE_CONFIG(cfg, "server_v4");
    return shmipc__config_set_server_v4(cfg, accept, features);
}

SHMIPC_API int shmipc_config_get_server_v4(const shmipc_config *cfg, unsigned *features)
{
    if (features != NULL)
        *features = cfg ? cfg->server_v4_features : 0;
    return cfg ? cfg->server_v4 : 0;
}

SHMIPC_API int shmipc_config_set_peer_uids(shmipc_config *cfg, const uint32_t *uids, size_t n)
{
    REQUIRE_CONFIG(cfg, "peer_uids");
    return shmipc__config_set_peer_uids(cfg, uids, n);
}

SHMIPC_API int shmipc_config_get_peer_uids(const shmipc_config *cfg, uint32_t *out, size_t cap)
{
    REQUIRE_CONFIG(cfg, "peer_uids");
    return shmipc__config_get_peer_uids(cfg, out, cap);
}

SHMIPC_API int shmipc_config_set_socket_mode(shmipc_config *cfg, unsigned mode)
{
    REQUIRE_CONFIG(cfg, "socket_mode");
    return shmipc__config_set_socket_mode(cfg, mode);
}

SHMIPC_API unsigned shmipc_config_get_socket_mode(const shmipc_config *cfg)
{
    return cfg ? shmipc__config_get_socket_mode(cfg) : 0;
}

SHMIPC_API int shmipc_config_set_max_pending_streams(shmipc_config *cfg, uint32_t n)
{
    REQUIRE_CONFIG(cfg, "max_pending_streams");
    return shmipc__config_set_max_pending_streams(cfg, n);
}

SHMIPC_API uint32_t shmipc_config_get_max_pending_streams(const shmipc_config *cfg)
{
    return cfg ? shmipc__config_get_max_pending_streams(cfg) : 0;
}

SHMIPC_API int shmipc_config_set_spin_us(shmipc_config *cfg, uint32_t us)
{
    REQUIRE_CONFIG(cfg, "spin_us");
    return shmipc__config_set_spin_us(cfg, us);
}

SHMIPC_API uint32_t shmipc_config_get_spin_us(const shmipc_config *cfg)
{
    return cfg ? shmipc__config_get_spin_us(cfg) : 0;
}

SHMIPC_API int shmipc_config_set_memory_wait(shmipc_config *cfg, int wait)
{
    REQUIRE_CONFIG(cfg, "memory_wait");
    return shmipc__config_set_memory_wait(cfg, wait);
}

SHMIPC_API int shmipc_config_get_memory_wait(const shmipc_config *cfg)
{
    return cfg ? cfg->memory_wait : 0;
}

SHMIPC_API int shmipc_config_set_max_fallback_unread(shmipc_config *cfg, uint64_t bytes)
{
    REQUIRE_CONFIG(cfg, "max_fallback_unread");
    return shmipc__config_set_max_fallback_unread(cfg, bytes);
}

SHMIPC_API uint64_t shmipc_config_get_max_fallback_unread(const shmipc_config *cfg)
{
    return cfg ? shmipc__config_get_max_fallback_unread(cfg) : 0;
}
