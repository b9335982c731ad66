/*
 * shmipc-serve's options (docs/serve.md, "Configuration"): the command line, the config file
 * (`key = value` lines whose keys are the long flag names), --check, --help, and the worker
 * command each kind of application runs. Errors are messages for the user: "FILE:LINE: ..."
 * for the config file, "--flag: ..." for the command line. Nothing here starts the server.
 */
#ifndef SHMIPC_SERVE_OPTIONS_H
#define SHMIPC_SERVE_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "serve/access_log.h" /* the access-log formats (core/serve) */

/* The kinds of application; only WSGI has a worker today. */
enum shmipc__serve_kind {
    SHMIPC__SERVE_WSGI = 1,
    SHMIPC__SERVE_ASGI = 2,
    SHMIPC__SERVE_LUA = 3,
    SHMIPC__SERVE_C = 4,
};

/* Limits of the numeric options. */
#define SHMIPC__SERVE_MAX_THREADS      256u
#define SHMIPC__SERVE_MAX_QUEUE        1000000u
#define SHMIPC__SERVE_MAX_MAX_REQUESTS 1000000000u
#define SHMIPC__SERVE_MAX_SECONDS_MS   (86400u * 1000u) /* one day */
/* --timeout: the front's longest finite deadline (SHMIPC__FRONT_MAX_DEADLINE, the server's
 * longest deferral); a longer one would pass here and then stop the server from starting. */
#define SHMIPC__SERVE_MAX_TIMEOUT_MS (3600u * 1000u) /* one hour */
/* The longest string value (a path) and config file line; the largest config file. */
#define SHMIPC__SERVE_MAX_VALUE 4096u
#define SHMIPC__SERVE_MAX_LINE  8192u
#define SHMIPC__SERVE_MAX_FILE  (1u << 20)
/* The bytes an error message may need; shorter buffers get a cut message. */
#define SHMIPC__SERVE_ERR_SIZE 512u
/* What an ASGI worker runs at once when --concurrency does not say (docs/serve.md). */
#define SHMIPC__SERVE_DEFAULT_CONCURRENCY 64u

typedef struct shmipc__serve_options {
    int kind;                     /* enum shmipc__serve_kind; default WSGI */
    char *app;                    /* module:callable, the Lua FILE or LIB.so:symbol */
    char *listen;                 /* host:port, [v6]:port or unix:PATH; 127.0.0.1:8000 */
    unsigned workers;             /* 1 .. SHMIPC__FRONT_MAX_WORKERS (64); default 1 */
    unsigned threads;             /* the front's reactor threads, 1 .. 256; default 1 */
    uint64_t max_requests;        /* 0: no recycling */
    uint32_t timeout_ms;          /* the request deadline (504); 0: none; default 60 s */
    unsigned queue;               /* requests waiting for a worker before 503; default 1024 */
    unsigned pipeline;            /* requests in flight per TAKEN worker, 1..16; default 1 */
    unsigned concurrency;         /* --asgi: requests at once per worker, 1..256; 0: the default */
    uint32_t graceful_timeout_ms; /* 1 ms .. 1 day; default 30 s */
    char *access_log;             /* NULL: none; "-": stdout */
    int access_log_format;        /* enum shmipc__access_format_kind; default common */
    char *python;                 /* the interpreter of Python workers; default python3 */
    char *chdir_to;               /* the workers' directory (and APP's import root) */
    char *config;                 /* the config file read, if any */
    int check, help, version;
} shmipc__serve_options;

/* The defaults (the strings allocated). SHMIPC_ENOMEM. */
int shmipc__serve_options_init(shmipc__serve_options *o);

/* Frees the strings; the struct may be initialised again. */
void shmipc__serve_options_free(shmipc__serve_options *o);

/*
 * Parses argv[1..argc) into o (initialised): --config FILE is read first, then every flag
 * overrides what the file set. Returns 0, or SHMIPC_EINVAL with a message in err (always
 * NUL-terminated when errlen > 0), or SHMIPC_ENOMEM. With --help or --version nothing else is
 * required (no APP).
 */
int shmipc__serve_options_parse(shmipc__serve_options *o, int argc, char *const *argv, char *err,
                                size_t errlen);

/* Reads a config file into o (as --config does; the caller's later flags override it). */
int shmipc__serve_options_load_file(shmipc__serve_options *o, const char *path, char *err,
                                    size_t errlen);

/*
 * What --check does: every option against the system without starting anything: the kind has
 * a worker, the directory exists, the interpreter runs, the listen address resolves, the access
 * log can be written, and APP imports (the interpreter is run on it, at most timeout_ms; it runs
 * the app module's import-time code, as starting a worker would). `envp` is the workers'
 * environment (NULL: this process's). Returns 0, or SHMIPC_EINVAL (the message in err).
 */
int shmipc__serve_check(const shmipc__serve_options *o, char *const *envp, uint32_t timeout_ms,
                        char *err, size_t errlen);

/*
 * The argv template the supervisor runs for each worker (with "{address}"), NULL-terminated,
 * allocated (free with shmipc__serve_argv_free). SHMIPC_ENOTSUP (message in err) for a kind
 * without a worker yet.
 */
int shmipc__serve_worker_argv(const shmipc__serve_options *o, char ***argv, char *err,
                              size_t errlen);
void shmipc__serve_argv_free(char **argv);

/* The --help text. */
const char *shmipc__serve_usage(void);

/* The kind's flag name: "wsgi", "asgi", "lua", "c"; "?" otherwise. */
const char *shmipc__serve_kind_name(int kind);

#endif
