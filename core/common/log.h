/*
 * Diagnostics to stderr, or to the sink set with shmipc_set_log_sink(), filtered by
 * SHMIPC_LOG_LEVEL (see docs/runtime-config.md).
 */
#ifndef SHMIPC_CORE_LOG_H
#define SHMIPC_CORE_LOG_H

#include "shmipc.h"

enum shmipc__log_level {
    SHMIPC__LOG_OFF = 0,
    SHMIPC__LOG_ERROR = 1,
    SHMIPC__LOG_WARN = 2,
    SHMIPC__LOG_INFO = 3,
    SHMIPC__LOG_DEBUG = 4,
};

/* The level in force: SHMIPC_LOG_LEVEL read once, SHMIPC__LOG_WARN when unset or unknown. */
int shmipc__log_level(void);

/* Parses a level name ("off", "error", "warn", "info", "debug"); -1 when unknown. */
int shmipc__log_parse_level(const char *name);

/* Writes one line, "shmipc[<pid>] <level>: <message>", to the sink or else to stderr. */
void shmipc__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Replaces the sink (NULL: stderr); returns once no thread runs the previous one. */
void shmipc__log_set_sink(shmipc_log_sink fn);
/* Between these two calls (nestable, per thread) this thread holds a library lock: records are
 * kept formatted and emitted by the outermost end, after the lock is dropped, so that no sink
 * runs under a library lock. */
void shmipc__log_defer_begin(void);
void shmipc__log_defer_end(void);

#define SHMIPC__LOG(level, ...)                                                                    \
    do {                                                                                           \
        if ((level) <= shmipc__log_level())                                                        \
            shmipc__log((level), __VA_ARGS__);                                                     \
    } while (0)

#endif
