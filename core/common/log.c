#include "log.h"

#include "env.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *const level_names[] = {"off", "error", "warn", "info", "debug"};

static int level = SHMIPC__LOG_WARN;
static pthread_once_t level_once = PTHREAD_ONCE_INIT;

/*
 * The sink that replaces stderr, read atomically so that logging without one takes no lock.
 * Calls of a sink hold `sink_lock` for reading and a change of sink takes it for writing, so
 * that once shmipc__log_set_sink() returns nobody runs the old sink: the caller may free it
 * (a libffi closure, for instance). Sinks are called from any thread, several at once.
 */
static shmipc_log_sink sink;
static pthread_rwlock_t sink_lock = PTHREAD_RWLOCK_INITIALIZER;

int shmipc__log_parse_level(const char *name)
{
    for (int i = 0; i < (int)(sizeof level_names / sizeof level_names[0]); i++)
        if (strcmp(name, level_names[i]) == 0)
            return i;
    return -1;
}

static void read_level(void)
{
    const char *v = shmipc__getenv("SHMIPC_LOG_LEVEL");
    int parsed = v != NULL ? shmipc__log_parse_level(v) : -1;
    if (parsed >= 0)
        level = parsed;
    else if (v != NULL)
        fprintf(stderr, "shmipc: SHMIPC_LOG_LEVEL=%s is not one of off|error|warn|info|debug\n", v);
}

int shmipc__log_level(void)
{
    pthread_once(&level_once, read_level);
    return level;
}

void shmipc__log(int lvl, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    int n = snprintf(line, sizeof line, "shmipc[%d] %s: ", (int)getpid(),
                     level_names[lvl > 0 && lvl <= SHMIPC__LOG_DEBUG ? lvl : 1]);
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    if (__atomic_load_n(&sink, __ATOMIC_ACQUIRE) != NULL) {
        pthread_rwlock_rdlock(&sink_lock);
        shmipc_log_sink fn = __atomic_load_n(&sink, __ATOMIC_ACQUIRE);
        if (fn != NULL)
            fn(lvl, line);
        pthread_rwlock_unlock(&sink_lock);
        if (fn != NULL)
            return;
    }
    /* One write per line so lines from several threads or processes do not interleave. */
    fprintf(stderr, "%s\n", line);
}

void shmipc__log_set_sink(shmipc_log_sink fn)
{
    pthread_rwlock_wrlock(&sink_lock);
    __atomic_store_n(&sink, fn, __ATOMIC_RELEASE);
    pthread_rwlock_unlock(&sink_lock);
}
