/*
 * config_explain: builds a shmipc config from command-line settings and prints what a client
 * with that config would create: the buffer's slice lists and the queue pair sizes.
 *
 * Build: cc config_explain.c $(pkg-config --cflags --libs shmipc) -o config_explain
 * Usage: config_explain [capacity=BYTES] [queue=N] [slices=SIZE:PCT,...] [memmap=memfd|devshm]
 *                       [prefix=PATH] [v4|v4-eventfd|v4-polling=US]
 */
#include <shmipc.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int apply(shmipc_config *cfg, const char *arg)
{
    const char *eq = strchr(arg, '=');
    const char *val = eq ? eq + 1 : "";
    size_t klen = eq ? (size_t)(eq - arg) : strlen(arg);
    if (klen == 8 && strncmp(arg, "capacity", klen) == 0)
        return shmipc_config_set_buffer_capacity(cfg, strtoull(val, NULL, 0));
    if (klen == 5 && strncmp(arg, "queue", klen) == 0)
        return shmipc_config_set_queue_capacity(cfg, (uint32_t)strtoul(val, NULL, 0));
    if (klen == 6 && strncmp(arg, "slices", klen) == 0)
        return shmipc_config_parse_slice_classes(cfg, val);
    if (klen == 6 && strncmp(arg, "memmap", klen) == 0)
        return shmipc_config_set_memmap_type(cfg, strcmp(val, "devshm") == 0 ? SHMIPC_MEMMAP_DEVSHM
                                                                             : SHMIPC_MEMMAP_MEMFD);
    if (klen == 6 && strncmp(arg, "prefix", klen) == 0)
        return shmipc_config_set_path_prefix(cfg, val);
    if (strcmp(arg, "v4") == 0)
        return shmipc_config_with_v4(cfg);
    if (strcmp(arg, "v4-eventfd") == 0)
        return shmipc_config_with_v4_eventfd(cfg);
    if (klen == 10 && strncmp(arg, "v4-polling", klen) == 0)
        return shmipc_config_with_v4_event_queue_polling(cfg, (uint32_t)strtoul(val, NULL, 0));
    fprintf(stderr, "unknown setting \"%s\"\n", arg);
    return SHMIPC_EINVAL;
}

int main(int argc, char **argv)
{
    shmipc_config *cfg = NULL;
    shmipc_slice_class classes[SHMIPC_MAX_SLICE_CLASSES];
    int rc = shmipc_config_new(&cfg);
    for (int i = 1; rc == 0 && i < argc; i++) {
        rc = apply(cfg, argv[i]);
        if (rc < 0)
            fprintf(stderr, "refused %s: %s (%s)\n", argv[i], shmipc_error_detail(),
                    shmipc_errname(rc));
    }
    if (rc < 0) {
        shmipc_config_free(cfg);
        return 1;
    }

    static const char *const wakeups[] = {"socket", "eventfd", "polling"};
    int n = shmipc_config_get_slice_classes(cfg, classes, SHMIPC_MAX_SLICE_CLASSES);
    uint64_t cap = shmipc_config_get_buffer_capacity(cfg);
    uint64_t region = cap - 36u * (uint64_t)n - 8;
    uint32_t q = shmipc_config_get_queue_capacity(cfg);
    printf("libshmipc %s\n", shmipc_version_string());
    printf("protocol   %s%s, wakeup %s\n",
           shmipc_config_get_protocol(cfg) == SHMIPC_PROTOCOL_V4 ? "V4" : "legacy",
           shmipc_config_get_fallback(cfg) ? " (fallback to legacy allowed)" : "",
           wakeups[shmipc_config_get_wakeup(cfg)]);
    printf("memory     %s, buffer \"%s_<pid>_<n>_buffer\" of %" PRIu64 " bytes\n",
           shmipc_config_get_memmap_type(cfg) == SHMIPC_MEMMAP_MEMFD ? "memfd" : "/dev/shm files",
           shmipc_config_get_path_prefix(cfg), cap);
    for (int i = 0; i < n; i++) {
        uint64_t slices = (region * classes[i].percent / 100) / (classes[i].size + 20u);
        printf("  list %d   %6" PRIu64 " slices of %7u bytes (%3u%%)\n", i, slices, classes[i].size,
               classes[i].percent);
    }
    printf("queues     2 x %u elements, %" PRIu64 " bytes in all\n", q,
           2 * (24 + 12 * (uint64_t)q));
    shmipc_config_free(cfg);
    return 0;
}
