/*
 * The IPC config: its defaults, and the builder behind bindings/config.c. Each setter checks
 * its value against the rules of the reference implementations (Go VerifyConfig, reference
 * §2.5 and §3.7) and against the fields already set, then commits; a refused value leaves the
 * config as it was. Every function takes a non-NULL config (the bindings check that).
 */
#include "ipc/config.h"

#include "common/error.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_BUFFER_CAPACITY  (32u << 20)
#define DEFAULT_QUEUE_CAPACITY   8192u
#define MAX_HANDSHAKE_TIMEOUT_MS 3600000u

static const shmipc_slice_class default_classes[] = {
    {8192 - SHMIPC__SLICE_HEADER_SIZE, 50},
    {32768 - SHMIPC__SLICE_HEADER_SIZE, 30},
    {131072 - SHMIPC__SLICE_HEADER_SIZE, 20},
};

static const char *const timeout_names[] = {"initialize_timeout", "connection_write_timeout",
                                            "read_timeout", "write_timeout"};

uint32_t shmipc__slices_per_class(uint32_t capacity, uint32_t nclasses, shmipc_slice_class c)
{
    uint64_t overhead = (uint64_t)SHMIPC__LIST_HEADER_SIZE * nclasses + SHMIPC__BUFFER_HEADER_SIZE;
    if (capacity <= overhead)
        return 0;
    uint64_t region = capacity - overhead;
    return (uint32_t)((region * c.percent / 100) / ((uint64_t)c.size + SHMIPC__SLICE_HEADER_SIZE));
}

/* Rules that tie the slice classes to the capacity; `field` names the value being set. */
static int check_classes_fit(const char *field, uint32_t capacity, const shmipc_slice_class *c,
                             uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        if (c[i].size > capacity)
            return shmipc__fail(SHMIPC_EINVAL,
                                "%s: slice size %u is larger than buffer_capacity %u", field,
                                c[i].size, capacity);
        if (shmipc__slices_per_class(capacity, n, c[i]) == 0)
            return shmipc__fail(SHMIPC_EINVAL,
                                "%s: slice class %u:%u gets no slice in a buffer of %u bytes",
                                field, c[i].size, c[i].percent, capacity);
    }
    return 0;
}

/* True when the 8-byte field at byte `off` of the queue region crosses a 64-byte line. */
static int straddles_line(uint64_t off)
{
    return off % 64 + 8 > 64;
}

static int check_queue_capacity(uint32_t n)
{
    if (n == 0 || n > SHMIPC_MAX_QUEUE_CAPACITY)
        return shmipc__fail(SHMIPC_EINVAL, "queue_capacity: %u is outside 1..%u", n,
                            SHMIPC_MAX_QUEUE_CAPACITY);
    /* The second half starts at 24 + 12*n; its head is at +4 and its tail at +12. */
    uint64_t second = 24 + 12 * (uint64_t)n;
    if (straddles_line(second + 4) || straddles_line(second + 12))
        return shmipc__fail(SHMIPC_EINVAL,
                            "queue_capacity: %u puts a queue counter across a cache line "
                            "(split lock); use a multiple of 16",
                            n);
    return 0;
}

static int check_prefix(const char *prefix, int memmap_type)
{
    size_t len = strlen(prefix);
    if (len == 0)
        return shmipc__fail(SHMIPC_EINVAL, "path_prefix: must not be empty");
    if (len > SHMIPC_MAX_PATH_PREFIX)
        return shmipc__fail(SHMIPC_ENAMETOOLONG, "path_prefix: %zu bytes, at most %d", len,
                            SHMIPC_MAX_PATH_PREFIX);
    if (strchr(prefix, '\n') != NULL)
        return shmipc__fail(SHMIPC_EINVAL, "path_prefix: must not contain a newline");
    if (memmap_type == SHMIPC_MEMMAP_DEVSHM && prefix[0] != '/')
        return shmipc__fail(SHMIPC_EINVAL,
                            "path_prefix: \"%s\" must be an absolute path with /dev/shm files",
                            prefix);
    return 0;
}

int shmipc__config_new(shmipc_config **out)
{
    shmipc_config *cfg = calloc(1, sizeof *cfg);
    if (cfg == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "config_new: out of memory");
    cfg->memmap_type = SHMIPC_MEMMAP_MEMFD;
    cfg->buffer_capacity = DEFAULT_BUFFER_CAPACITY;
    cfg->queue_capacity = DEFAULT_QUEUE_CAPACITY;
    cfg->nclasses = sizeof default_classes / sizeof default_classes[0];
    memcpy(cfg->classes, default_classes, sizeof default_classes);
    strcpy(cfg->path_prefix, "/dev/shm/shmipc");
    cfg->timeout_ms[SHMIPC_TIMEOUT_INITIALIZE] = 1000;
    cfg->timeout_ms[SHMIPC_TIMEOUT_CONNECTION_WRITE] = 10000;
    cfg->timeout_ms[SHMIPC_TIMEOUT_READ] = -1;
    cfg->timeout_ms[SHMIPC_TIMEOUT_WRITE] = -1;
    cfg->protocol = SHMIPC_PROTOCOL_LEGACY;
    cfg->wakeup = SHMIPC_WAKEUP_SOCKET;
    cfg->session_num = 1;
    cfg->max_stream_num = 4096;
    cfg->rebuild_interval_ms = 1000;
    cfg->server_v4 = 1;
    cfg->server_v4_features = SHMIPC_V4_FEATURE_EVENTFD | SHMIPC_V4_FEATURE_POLLING;
    cfg->spin_us = shmipc__spin_default_us();
    *out = cfg;
    return 0;
}

int shmipc__config_clone(const shmipc_config *src, shmipc_config **out)
{
    shmipc_config *cfg = malloc(sizeof *cfg);
    if (cfg == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "config_clone: out of memory");
    *cfg = *src;
    *out = cfg;
    return 0;
}

void shmipc__config_free(shmipc_config *cfg)
{
    free(cfg);
}

int shmipc__config_validate(const shmipc_config *cfg)
{
    int rc;
    uint32_t sum = 0;
    if (cfg->buffer_capacity < SHMIPC_MIN_BUFFER_CAPACITY)
        return shmipc__fail(SHMIPC_EINVAL, "buffer_capacity: %u is below the minimum %u",
                            cfg->buffer_capacity, SHMIPC_MIN_BUFFER_CAPACITY);
    if ((rc = check_queue_capacity(cfg->queue_capacity)) < 0)
        return rc;
    if (cfg->nclasses == 0 || cfg->nclasses > SHMIPC_MAX_SLICE_CLASSES)
        return shmipc__fail(SHMIPC_EINVAL, "slice_classes: %u classes, need 1..%d", cfg->nclasses,
                            SHMIPC_MAX_SLICE_CLASSES);
    for (uint32_t i = 0; i < cfg->nclasses; i++)
        sum += cfg->classes[i].percent;
    if (sum != 100)
        return shmipc__fail(SHMIPC_EINVAL, "slice_classes: percents sum to %u, not 100", sum);
    if ((rc = check_classes_fit("slice_classes", cfg->buffer_capacity, cfg->classes,
                                cfg->nclasses)) < 0)
        return rc;
    if ((rc = check_prefix(cfg->path_prefix, cfg->memmap_type)) < 0)
        return rc;
    if (cfg->protocol == SHMIPC_PROTOCOL_LEGACY && cfg->wakeup != SHMIPC_WAKEUP_SOCKET)
        return shmipc__fail(SHMIPC_EINVAL, "wakeup: eventfd and polling need protocol V4");
    if (cfg->wakeup == SHMIPC_WAKEUP_EVENTFD && cfg->memmap_type != SHMIPC_MEMMAP_MEMFD)
        return shmipc__fail(SHMIPC_EINVAL, "wakeup: eventfd needs memmap_type memfd");
    if (cfg->session_num < 1 || cfg->session_num > SHMIPC_MAX_SESSION_NUM ||
        cfg->max_stream_num < 1 || cfg->max_stream_num > SHMIPC_MAX_STREAM_NUM ||
        cfg->rebuild_interval_ms < 1 || cfg->rebuild_interval_ms > MAX_HANDSHAKE_TIMEOUT_MS)
        return shmipc__fail(SHMIPC_EINVAL,
                            "session_num, max_stream_num or rebuild_interval: out of range");
    return 0;
}

int shmipc__config_set_memmap_type(shmipc_config *cfg, int type)
{
    if (type != SHMIPC_MEMMAP_DEVSHM && type != SHMIPC_MEMMAP_MEMFD)
        return shmipc__fail(SHMIPC_EINVAL,
                            "memmap_type: %d is neither SHMIPC_MEMMAP_DEVSHM (0) nor "
                            "SHMIPC_MEMMAP_MEMFD (1)",
                            type);
    if (type == SHMIPC_MEMMAP_DEVSHM && cfg->wakeup == SHMIPC_WAKEUP_EVENTFD)
        return shmipc__fail(SHMIPC_EINVAL,
                            "memmap_type: /dev/shm files cannot carry eventfd wakeups; choose "
                            "another wakeup first");
    if (type == SHMIPC_MEMMAP_DEVSHM && cfg->path_prefix[0] != '/')
        return shmipc__fail(SHMIPC_EINVAL,
                            "memmap_type: /dev/shm files need an absolute path_prefix, not \"%s\"",
                            cfg->path_prefix);
    cfg->memmap_type = type;
    return 0;
}

int shmipc__config_set_buffer_capacity(shmipc_config *cfg, uint64_t bytes)
{
    if (bytes < SHMIPC_MIN_BUFFER_CAPACITY)
        return shmipc__fail(SHMIPC_EINVAL, "buffer_capacity: %llu is below the minimum %u",
                            (unsigned long long)bytes, SHMIPC_MIN_BUFFER_CAPACITY);
    if (bytes > UINT32_MAX)
        return shmipc__fail(SHMIPC_EINVAL,
                            "buffer_capacity: %llu is above the maximum %u (offsets are 32-bit)",
                            (unsigned long long)bytes, UINT32_MAX);
    int rc = check_classes_fit("buffer_capacity", (uint32_t)bytes, cfg->classes, cfg->nclasses);
    if (rc < 0)
        return rc;
    cfg->buffer_capacity = (uint32_t)bytes;
    return 0;
}

int shmipc__config_set_queue_capacity(shmipc_config *cfg, uint32_t capacity)
{
    int rc = check_queue_capacity(capacity);
    if (rc < 0)
        return rc;
    cfg->queue_capacity = capacity;
    return 0;
}

static int compare_class(const void *a, const void *b)
{
    const shmipc_slice_class *x = a, *y = b;
    return (x->size > y->size) - (x->size < y->size);
}

int shmipc__config_set_slice_classes(shmipc_config *cfg, const shmipc_slice_class *classes,
                                     size_t n)
{
    shmipc_slice_class sorted[SHMIPC_MAX_SLICE_CLASSES];
    uint32_t sum = 0;
    if (n == 0 || n > SHMIPC_MAX_SLICE_CLASSES)
        return shmipc__fail(SHMIPC_EINVAL, "slice_classes: %zu classes, need 1..%d", n,
                            SHMIPC_MAX_SLICE_CLASSES);
    if (classes == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "slice_classes: classes is NULL");
    for (size_t i = 0; i < n; i++) {
        if (classes[i].size == 0)
            return shmipc__fail(SHMIPC_EINVAL, "slice_classes: class %zu has size 0", i);
        /*
         * Slice strides are size + 20, so a size that is not a multiple of 4 misaligns every
         * later slice header and list header, whose fields both processes update atomically.
         * The reference requires this on arm64; we require it everywhere.
         */
        if (classes[i].size % 4 != 0)
            return shmipc__fail(SHMIPC_EINVAL,
                                "slice_classes: class %zu has size %u, not a multiple of 4", i,
                                classes[i].size);
        if (classes[i].percent == 0 || classes[i].percent > 100)
            return shmipc__fail(SHMIPC_EINVAL,
                                "slice_classes: class %zu has percent %u, not 1..100", i,
                                classes[i].percent);
        sum += classes[i].percent;
    }
    if (sum != 100)
        return shmipc__fail(SHMIPC_EINVAL, "slice_classes: percents sum to %u, not 100", sum);
    memcpy(sorted, classes, n * sizeof *classes);
    qsort(sorted, n, sizeof *sorted, compare_class);
    for (size_t i = 1; i < n; i++)
        if (sorted[i].size == sorted[i - 1].size)
            return shmipc__fail(SHMIPC_EINVAL,
                                "slice_classes: size %u appears twice (a list is found by its "
                                "slice size)",
                                sorted[i].size);
    int rc = check_classes_fit("slice_classes", cfg->buffer_capacity, sorted, (uint32_t)n);
    if (rc < 0)
        return rc;
    memcpy(cfg->classes, sorted, n * sizeof *sorted);
    cfg->nclasses = (uint32_t)n;
    return 0;
}

/* Parses a decimal u32 at *p, skipping blanks around it; -1 when there is none or it overflows. */
static int parse_u32(const char **p, uint32_t *out)
{
    const char *s = *p;
    uint64_t v = 0;
    while (*s == ' ' || *s == '\t')
        s++;
    if (*s < '0' || *s > '9')
        return -1;
    while (*s >= '0' && *s <= '9') {
        v = v * 10 + (uint64_t)(*s++ - '0');
        if (v > UINT32_MAX)
            return -1;
    }
    while (*s == ' ' || *s == '\t')
        s++;
    *out = (uint32_t)v;
    *p = s;
    return 0;
}

int shmipc__config_parse_slice_classes(shmipc_config *cfg, const char *spec)
{
    shmipc_slice_class parsed[SHMIPC_MAX_SLICE_CLASSES];
    size_t n = 0;
    const char *p = spec;
    if (spec == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "slice_classes: spec is NULL");
    for (;;) {
        if (n == SHMIPC_MAX_SLICE_CLASSES)
            return shmipc__fail(SHMIPC_EINVAL, "slice_classes: more than %d classes in \"%s\"",
                                SHMIPC_MAX_SLICE_CLASSES, spec);
        if (parse_u32(&p, &parsed[n].size) < 0 || *p++ != ':' ||
            parse_u32(&p, &parsed[n].percent) < 0)
            return shmipc__fail(SHMIPC_EINVAL,
                                "slice_classes: \"%s\" is not of the form size:percent,... "
                                "(error at byte %td)",
                                spec, p - spec);
        n++;
        if (*p == '\0')
            break;
        if (*p++ != ',')
            return shmipc__fail(SHMIPC_EINVAL, "slice_classes: \"%s\": expected ',' at byte %td",
                                spec, p - 1 - spec);
    }
    return shmipc__config_set_slice_classes(cfg, parsed, n);
}

int shmipc__config_get_slice_classes(const shmipc_config *cfg, shmipc_slice_class *out, size_t cap)
{
    if (out == NULL && cap > 0)
        return shmipc__fail(SHMIPC_EINVAL, "slice_classes: out is NULL");
    size_t n = cfg->nclasses < cap ? cfg->nclasses : cap;
    if (n > 0)
        memcpy(out, cfg->classes, n * sizeof *out);
    return (int)cfg->nclasses;
}

int shmipc__config_set_path_prefix(shmipc_config *cfg, const char *prefix)
{
    if (prefix == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "path_prefix: is NULL");
    int rc = check_prefix(prefix, cfg->memmap_type);
    if (rc < 0)
        return rc;
    strcpy(cfg->path_prefix, prefix);
    return 0;
}

static int check_timeout_which(int which)
{
    if (which < SHMIPC_TIMEOUT_INITIALIZE || which > SHMIPC_TIMEOUT_WRITE)
        return shmipc__fail(SHMIPC_EINVAL, "timeout: %d is not an enum shmipc_timeout value",
                            which);
    return 0;
}

/* The deprecated setter: 0 meant "forever" for read and write, and was refused for the rest. */
int shmipc__config_set_timeout_ms(shmipc_config *cfg, int which, uint32_t ms)
{
    int rc = check_timeout_which(which);
    if (rc < 0)
        return rc;
    int handshake = which == SHMIPC_TIMEOUT_INITIALIZE || which == SHMIPC_TIMEOUT_CONNECTION_WRITE;
    if (handshake && (ms == 0 || ms > MAX_HANDSHAKE_TIMEOUT_MS))
        return shmipc__fail(SHMIPC_EINVAL, "%s: %u ms is outside 1..%u", timeout_names[which], ms,
                            MAX_HANDSHAKE_TIMEOUT_MS);
    cfg->timeout_ms[which] = ms == 0 ? -1 : (int64_t)ms;
    return 0;
}

/*
 * The rule of the API: negative waits forever, 0 does not wait. A handshake cannot take no
 * time, so 0 is refused for the two handshake timeouts, which keep their upper bound.
 */
int shmipc__config_set_timeout(shmipc_config *cfg, int which, int timeout_ms)
{
    int rc = check_timeout_which(which);
    if (rc < 0)
        return rc;
    int handshake = which == SHMIPC_TIMEOUT_INITIALIZE || which == SHMIPC_TIMEOUT_CONNECTION_WRITE;
    if (handshake && timeout_ms == 0)
        return shmipc__fail(SHMIPC_EINVAL,
                            "%s: 0 ms, but a handshake cannot take no time (negative: forever, "
                            "else 1..%u)",
                            timeout_names[which], MAX_HANDSHAKE_TIMEOUT_MS);
    if (handshake && timeout_ms > (int)MAX_HANDSHAKE_TIMEOUT_MS)
        return shmipc__fail(SHMIPC_EINVAL, "%s: %d ms is above %u", timeout_names[which],
                            timeout_ms, MAX_HANDSHAKE_TIMEOUT_MS);
    cfg->timeout_ms[which] = timeout_ms < 0 ? -1 : timeout_ms;
    return 0;
}

int shmipc__config_set_protocol(shmipc_config *cfg, int protocol, int fallback)
{
    if (protocol != SHMIPC_PROTOCOL_LEGACY && protocol != SHMIPC_PROTOCOL_V4)
        return shmipc__fail(SHMIPC_EINVAL,
                            "protocol: %d is neither SHMIPC_PROTOCOL_LEGACY (0) nor "
                            "SHMIPC_PROTOCOL_V4 (4)",
                            protocol);
    if (fallback != 0 && fallback != 1)
        return shmipc__fail(SHMIPC_EINVAL, "fallback: %d is neither 0 nor 1", fallback);
    if (protocol == SHMIPC_PROTOCOL_LEGACY && fallback)
        return shmipc__fail(SHMIPC_EINVAL, "fallback: only a V4 client can fall back");
    cfg->protocol = protocol;
    cfg->fallback = fallback;
    if (protocol == SHMIPC_PROTOCOL_LEGACY) {
        cfg->wakeup = SHMIPC_WAKEUP_SOCKET;
        cfg->polling_interval_us = 0;
    }
    return 0;
}

static int check_wakeup(const shmipc_config *cfg, int protocol, int wakeup, uint32_t interval)
{
    if (wakeup < SHMIPC_WAKEUP_SOCKET || wakeup > SHMIPC_WAKEUP_POLLING)
        return shmipc__fail(SHMIPC_EINVAL, "wakeup: %d is not an enum shmipc_wakeup value", wakeup);
    if (wakeup != SHMIPC_WAKEUP_SOCKET && protocol != SHMIPC_PROTOCOL_V4)
        return shmipc__fail(SHMIPC_EINVAL, "wakeup: eventfd and polling need protocol V4");
    if (wakeup == SHMIPC_WAKEUP_EVENTFD && cfg->memmap_type != SHMIPC_MEMMAP_MEMFD)
        return shmipc__fail(SHMIPC_EINVAL, "wakeup: eventfd needs memmap_type memfd");
    if (wakeup == SHMIPC_WAKEUP_POLLING &&
        (interval < SHMIPC_MIN_POLLING_INTERVAL_US || interval > SHMIPC_MAX_POLLING_INTERVAL_US))
        return shmipc__fail(SHMIPC_EINVAL, "polling_interval_us: %u is outside %u..%u", interval,
                            SHMIPC_MIN_POLLING_INTERVAL_US, SHMIPC_MAX_POLLING_INTERVAL_US);
    if (wakeup != SHMIPC_WAKEUP_POLLING && interval != 0)
        return shmipc__fail(SHMIPC_EINVAL,
                            "polling_interval_us: %u given, but only polling uses an interval",
                            interval);
    return 0;
}

int shmipc__config_set_wakeup(shmipc_config *cfg, int wakeup, uint32_t polling_interval_us)
{
    int rc = check_wakeup(cfg, cfg->protocol, wakeup, polling_interval_us);
    if (rc < 0)
        return rc;
    cfg->wakeup = wakeup;
    cfg->polling_interval_us = polling_interval_us;
    return 0;
}

static int use_v4(shmipc_config *cfg, int wakeup, uint32_t interval)
{
    int memmap = wakeup == SHMIPC_WAKEUP_EVENTFD ? SHMIPC_MEMMAP_MEMFD : cfg->memmap_type;
    int saved = cfg->memmap_type;
    cfg->memmap_type = memmap;
    int rc = check_wakeup(cfg, SHMIPC_PROTOCOL_V4, wakeup, interval);
    if (rc < 0) {
        cfg->memmap_type = saved;
        return rc;
    }
    cfg->protocol = SHMIPC_PROTOCOL_V4;
    cfg->fallback = 1;
    cfg->wakeup = wakeup;
    cfg->polling_interval_us = interval;
    return 0;
}

int shmipc__config_with_v4(shmipc_config *cfg)
{
    return use_v4(cfg, SHMIPC_WAKEUP_SOCKET, 0);
}

int shmipc__config_with_v4_eventfd(shmipc_config *cfg)
{
    return use_v4(cfg, SHMIPC_WAKEUP_EVENTFD, 0);
}

int shmipc__config_with_v4_event_queue_polling(shmipc_config *cfg, uint32_t interval_us)
{
    return use_v4(cfg, SHMIPC_WAKEUP_POLLING, interval_us);
}

/* The deprecated getter: 0 for forever; "do not wait" has no value in it (-1, as a bad which). */
int64_t shmipc__config_get_timeout_ms(const shmipc_config *cfg, int which)
{
    if (which < SHMIPC_TIMEOUT_INITIALIZE || which > SHMIPC_TIMEOUT_WRITE)
        return -1;
    if (cfg->timeout_ms[which] < 0)
        return 0;
    if (cfg->timeout_ms[which] == 0) {
        shmipc__fail(SHMIPC_EINVAL,
                     "%s: 0 (do not wait) has no value in shmipc_config_get_timeout_ms; use "
                     "shmipc_config_get_timeout",
                     timeout_names[which]);
        return -1;
    }
    return cfg->timeout_ms[which];
}

int shmipc__config_get_timeout(const shmipc_config *cfg, int which, int *timeout_ms)
{
    int rc = check_timeout_which(which);
    if (rc < 0)
        return rc;
    int64_t v = cfg->timeout_ms[which];
    /* The deprecated setter takes up to UINT32_MAX ms (49 days); an int holds 24 days. */
    *timeout_ms = v < 0 ? SHMIPC_WAIT_FOREVER : v > INT_MAX ? INT_MAX : (int)v;
    return 0;
}

/* Sets a u32 field that must lie within lo..hi. */
static int set_bounded(uint32_t *field, const char *name, uint32_t v, uint32_t lo, uint32_t hi)
{
    if (v < lo || v > hi)
        return shmipc__fail(SHMIPC_EINVAL, "%s: %u is outside %u..%u", name, v, lo, hi);
    *field = v;
    return 0;
}

int shmipc__config_set_session_num(shmipc_config *cfg, uint32_t n)
{
    return set_bounded(&cfg->session_num, "session_num", n, 1, SHMIPC_MAX_SESSION_NUM);
}

int shmipc__config_set_max_stream_num(shmipc_config *cfg, uint32_t n)
{
    return set_bounded(&cfg->max_stream_num, "max_stream_num", n, 1, SHMIPC_MAX_STREAM_NUM);
}

int shmipc__config_set_rebuild_interval_ms(shmipc_config *cfg, uint32_t ms)
{
    return set_bounded(&cfg->rebuild_interval_ms, "rebuild_interval", ms, 1,
                       MAX_HANDSHAKE_TIMEOUT_MS);
}

int shmipc__config_set_server_v4(shmipc_config *cfg, int accept, unsigned features)
{
    unsigned all = SHMIPC_V4_FEATURE_EVENTFD | SHMIPC_V4_FEATURE_POLLING;
    if (accept != 0 && accept != 1)
        return shmipc__fail(SHMIPC_EINVAL, "server_v4: accept %d is neither 0 nor 1", accept);
    if ((features & ~all) != 0)
        return shmipc__fail(SHMIPC_EINVAL, "server_v4: unknown feature bits %#x", features & ~all);
    cfg->server_v4 = accept;
    cfg->server_v4_features = features;
    return 0;
}

int shmipc__config_set_peer_uids(shmipc_config *cfg, const uint32_t *uids, size_t n)
{
    if (n > SHMIPC_MAX_PEER_UIDS)
        return shmipc__fail(SHMIPC_EINVAL, "peer_uids: %zu uids, at most %d", n,
                            SHMIPC_MAX_PEER_UIDS);
    if (n > 0 && uids == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "peer_uids: uids is NULL with n = %zu", n);
    for (size_t i = 0; i < n; i++)
        /* (uid_t)-1 means "no change" to the kernel's id calls and is never a process's uid. */
        if (uids[i] == UINT32_MAX)
            return shmipc__fail(SHMIPC_EINVAL, "peer_uids: uid %zu is -1, which no process has", i);
    if (n > 0)
        memcpy(cfg->peer_uids, uids, n * sizeof *uids);
    cfg->npeer_uids = (uint32_t)n;
    return 0;
}

int shmipc__config_get_peer_uids(const shmipc_config *cfg, uint32_t *out, size_t cap)
{
    if (cap > 0 && out == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "peer_uids: out is NULL with cap = %zu", cap);
    for (size_t i = 0; i < cap && i < cfg->npeer_uids; i++)
        out[i] = cfg->peer_uids[i];
    return (int)cfg->npeer_uids;
}

int shmipc__config_set_socket_mode(shmipc_config *cfg, unsigned mode)
{
    if (mode > 0777)
        return shmipc__fail(SHMIPC_EINVAL, "socket_mode: %#o has bits outside 0777", mode);
    cfg->socket_mode = mode;
    return 0;
}

unsigned shmipc__config_get_socket_mode(const shmipc_config *cfg)
{
    return cfg->socket_mode != 0 ? cfg->socket_mode : 0600;
}

#define DEFAULT_MAX_PENDING_STREAMS 4096u
#define DEFAULT_MAX_FALLBACK_UNREAD (128ull << 20)
#define MIN_MAX_FALLBACK_UNREAD     65536ull
#define MAX_MAX_FALLBACK_UNREAD     (1ull << 40)

int shmipc__config_set_max_pending_streams(shmipc_config *cfg, uint32_t n)
{
    if (n > SHMIPC_MAX_STREAM_NUM)
        return shmipc__fail(SHMIPC_EINVAL, "max_pending_streams: %u is outside 1..%u (0: default)",
                            n, SHMIPC_MAX_STREAM_NUM);
    cfg->max_pending_streams = n;
    return 0;
}

uint32_t shmipc__config_get_max_pending_streams(const shmipc_config *cfg)
{
    return cfg->max_pending_streams != 0 ? cfg->max_pending_streams : DEFAULT_MAX_PENDING_STREAMS;
}

int shmipc__config_set_spin_us(shmipc_config *cfg, uint32_t us)
{
    if (us > SHMIPC__SPIN_US_MAX)
        return shmipc__fail(SHMIPC_EINVAL, "spin_us: %u is outside 0..%u (0: never spin)", us,
                            SHMIPC__SPIN_US_MAX);
    cfg->spin_us = us;
    return 0;
}

uint32_t shmipc__config_get_spin_us(const shmipc_config *cfg)
{
    return cfg->spin_us;
}

int shmipc__config_set_max_fallback_unread(shmipc_config *cfg, uint64_t bytes)
{
    if (bytes != 0 && (bytes < MIN_MAX_FALLBACK_UNREAD || bytes > MAX_MAX_FALLBACK_UNREAD))
        return shmipc__fail(
            SHMIPC_EINVAL, "max_fallback_unread: %llu bytes is outside %llu..%llu (0: default)",
            (unsigned long long)bytes, MIN_MAX_FALLBACK_UNREAD, MAX_MAX_FALLBACK_UNREAD);
    cfg->max_fallback_unread = bytes;
    return 0;
}

uint64_t shmipc__config_get_max_fallback_unread(const shmipc_config *cfg)
{
    return cfg->max_fallback_unread != 0 ? cfg->max_fallback_unread : DEFAULT_MAX_FALLBACK_UNREAD;
}

int shmipc__config_set_memory_wait(shmipc_config *cfg, int wait)
{
    if (wait != 0 && wait != 1)
        return shmipc__fail(SHMIPC_EINVAL, "memory_wait: %d is neither 0 (fall back) nor 1 (wait)",
                            wait);
    cfg->memory_wait = wait;
    return 0;
}
