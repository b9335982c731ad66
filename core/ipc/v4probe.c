#include "ipc/v4probe.h"

#include "common/clock.h"
#include "common/env.h"
#include "common/log.h"

#include <pthread.h>
#include <string.h>

#define DEFAULT_PROBE_MS 250u
#define DEFAULT_CACHE_MS 60000u
/* Addresses remembered at once; the oldest entry is replaced when full. */
#define CACHE_SLOTS 64

static pthread_once_t once = PTHREAD_ONCE_INIT;
static uint32_t probe_ms = DEFAULT_PROBE_MS;
static uint32_t cache_ms = DEFAULT_CACHE_MS;

static struct {
    char address[128];
    uint64_t until_ns;
} cache[CACHE_SLOTS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void read_knobs(void)
{
    unsigned long v;
    const char *name = "SHMIPC_V4_PROBE_TIMEOUT_MS";
    int rc = shmipc__env_number(name, shmipc__getenv("SHMIPC_V4_PROBE_TIMEOUT_MS"), 1, 3600000,
                                "milliseconds", &v);
    if (rc == 1)
        probe_ms = (uint32_t)v;
    else if (rc < 0)
        SHMIPC__LOG(SHMIPC__LOG_WARN, "%s ignored (default %u ms)", name, DEFAULT_PROBE_MS);
    name = "SHMIPC_V4_LEGACY_CACHE_MS";
    rc = shmipc__env_number(name, shmipc__getenv("SHMIPC_V4_LEGACY_CACHE_MS"), 0, 86400000,
                            "milliseconds", &v);
    if (rc == 1)
        cache_ms = (uint32_t)v;
    else if (rc < 0)
        SHMIPC__LOG(SHMIPC__LOG_WARN, "%s ignored (default %u ms)", name, DEFAULT_CACHE_MS);
}

uint32_t shmipc__v4_probe_ms(void)
{
    pthread_once(&once, read_knobs);
    return probe_ms;
}

/* The slot of `address`, or -1. Under mu. */
static int find_locked(const char *address)
{
    for (int i = 0; i < CACHE_SLOTS; i++)
        if (cache[i].until_ns != 0 && strcmp(cache[i].address, address) == 0)
            return i;
    return -1;
}

int shmipc__v4_legacy_known(const char *address)
{
    pthread_once(&once, read_knobs);
    uint64_t now = shmipc__now_ns();
    pthread_mutex_lock(&mu);
    int i = find_locked(address), known = 0;
    if (i >= 0) {
        if (cache[i].until_ns > now)
            known = 1;
        else
            cache[i].until_ns = 0; /* expired: probe V4 again */
    }
    pthread_mutex_unlock(&mu);
    return known;
}

void shmipc__v4_legacy_remember(const char *address)
{
    pthread_once(&once, read_knobs);
    if (cache_ms == 0 || strlen(address) >= sizeof cache[0].address)
        return;
    uint64_t until = shmipc__now_ns() + (uint64_t)cache_ms * 1000000u;
    pthread_mutex_lock(&mu);
    int i = find_locked(address);
    if (i < 0) {
        i = 0;
        for (int j = 1; j < CACHE_SLOTS; j++)
            if (cache[j].until_ns < cache[i].until_ns)
                i = j;
        strcpy(cache[i].address, address);
    }
    cache[i].until_ns = until;
    pthread_mutex_unlock(&mu);
}

void shmipc__v4_legacy_forget(const char *address)
{
    pthread_mutex_lock(&mu);
    int i = find_locked(address);
    if (i >= 0)
        cache[i].until_ns = 0;
    pthread_mutex_unlock(&mu);
}

void shmipc__v4_legacy_clear(void)
{
    pthread_mutex_lock(&mu);
    for (int i = 0; i < CACHE_SLOTS; i++)
        cache[i].until_ns = 0;
    pthread_mutex_unlock(&mu);
}
