/*
 * The process supervisor of shmipc-serve (docs/serve.md, "Supervision"): it starts N worker
 * processes from an argv template, each listening on its own shmipc address, watches them,
 * restarts them with back-off, replaces them on reload and stops them within a deadline.
 *
 * One thread runs shmipc__sup_run(), a poll loop over a control pipe, each worker's pidfd and
 * the pipes of each worker's stdout (read for the "ready on ADDRESS" line) and stderr, both
 * forwarded in whole lines.
 * Any thread (and a signal handler) may call shmipc__sup_stop(), _reload() and
 * _request_status(); shmipc__sup_snapshot() and _status() may be called from any thread.
 */
#ifndef SHMIPC_SERVE_SUPERVISOR_H
#define SHMIPC_SERVE_SUPERVISOR_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The most workers one supervisor runs (--workers). */
#define SHMIPC__SUP_MAX_WORKERS 1024u
/* What shmipc__sup_run() returns after end_on_boot_failure ended the run (docs/serve.md: the
 * exit status of shmipc-serve then, gunicorn's "worker failed to boot"). */
#define SHMIPC__SUP_BOOT_FAILED 3
/* The text replaced by a worker's address in the arguments of the template: every occurrence
 * in every argument, or (address_whole_args) only whole arguments that are this text. */
#define SHMIPC__SUP_ADDRESS_TOKEN "{address}"
/* Workers' output is forwarded in whole lines, each of one worker: a line longer than this is
 * cut, forwarded with SHMIPC__SUP_CUT_MARK and a newline, and its rest follows as a new line. */
#define SHMIPC__SUP_LINE_MAX 16384
#define SHMIPC__SUP_CUT_MARK " [line cut by shmipc-serve]"

typedef struct shmipc__sup shmipc__sup;

/*
 * Called on the loop's thread, without the supervisor's lock, whenever the set of ready
 * worker addresses changes; `addrs` (n strings) is valid during the call only. n is 0 once
 * the stop began: the front sends no new request then. An address that leaves the set gets no
 * new request; the requests in flight on it go on (its worker finishes them after SIGTERM).
 */
typedef void (*shmipc__sup_ready_fn)(void *data, const char *const *addrs, size_t n);

/* Zero means the default for every number; the strings are copied by shmipc__sup_new(). */
typedef struct shmipc__sup_config {
    const char *const *argv;      /* NULL-terminated template; argv[0] is looked up in PATH */
    char *const *envp;            /* the workers' environment; NULL: the supervisor's */
    const char *chdir_to;         /* the workers' directory; NULL: the supervisor's */
    unsigned workers;             /* 1 .. SHMIPC__SUP_MAX_WORKERS */
    uint32_t start_timeout_ms;    /* ready within this, or SIGKILL and restart; default 30 s */
    uint32_t graceful_timeout_ms; /* SIGTERM to SIGKILL on stop and reload; default 30 s */
    uint32_t backoff_min_ms;      /* the first restart delay after a failure; default 100 ms */
    uint32_t backoff_max_ms;      /* the delay doubles up to this; default 10 s */
    uint32_t healthy_ms;          /* ready this long resets the delay; default 10 s */
    uint32_t max_spawns_per_sec;  /* all workers together; default 2 * workers + 4 */
    int out_fd;                   /* workers' stdout goes here, in whole lines; 0: 1 */
    int err_fd;                   /* workers' stderr goes here, in whole lines; 0: 2 */
    int log_fd;                   /* the supervisor's log and status; 0: 2 */
    int signals; /* run() handles SIGTERM/SIGINT/SIGQUIT (stop), SIGHUP (reload), SIGUSR1 (status) */
    /* Only arguments that are exactly "{address}" get the address: the others (a user's APP,
     * paths) are passed as they are, whatever text they hold. 0: every "{address}" in every
     * argument (a shell script's, in tests). */
    int address_whole_args;
    /* A worker that ends before its ready line (an app that cannot be imported, an interpreter
     * that cannot be started, the start timeout) while no worker of the run was ever ready
     * stops the run: the other workers get SIGTERM (SIGKILL after min(graceful, 500 ms)) and
     * run() returns SHMIPC__SUP_BOOT_FAILED, as gunicorn exits when a worker fails to boot. 0:
     * such a worker is restarted with back-off, as any. */
    int end_on_boot_failure;
    shmipc__sup_ready_fn on_ready_set;
    void *data;
} shmipc__sup_config;

enum shmipc__sup_state {
    SHMIPC__SUP_STARTING = 1, /* spawned, "ready on" not seen yet */
    SHMIPC__SUP_READY = 2,
    SHMIPC__SUP_STOPPING = 3, /* SIGTERM sent; SIGKILL at the graceful deadline */
    SHMIPC__SUP_BACKOFF = 4,  /* exited; respawned when the delay is over */
};

/* One worker slot, as shmipc__sup_snapshot() copies it. */
typedef struct shmipc__sup_worker_info {
    pid_t pid; /* 0 in BACKOFF */
    unsigned generation;
    unsigned index;
    int state;              /* enum shmipc__sup_state */
    unsigned restarts;      /* spawns of this slot after its first */
    uint64_t started_ns;    /* CLOCK_MONOTONIC of the last spawn */
    int last_status;        /* the last wait status; -1 when none exited yet */
    uint32_t last_delay_ms; /* the delay before the last restart (0: at once) */
    char address[96];
} shmipc__sup_worker_info;

/* The state's name: "starting", "ready", "stopping", "backoff"; "?" otherwise. */
const char *shmipc__sup_state_name(int state);

/* A supervisor that has started nothing yet. SHMIPC_EINVAL for a bad config, SHMIPC_ENOMEM. */
int shmipc__sup_new(const shmipc__sup_config *cfg, shmipc__sup **out);

/*
 * Starts the workers and supervises them until a stop request, then stops them (SIGTERM, and
 * SIGKILL at the graceful deadline) and reaps them all. Returns 0, SHMIPC__SUP_BOOT_FAILED
 * (end_on_boot_failure), or a negative SHMIPC_E* code when the loop could not run (then no
 * worker is left behind). Once per supervisor.
 */
int shmipc__sup_run(shmipc__sup *sup);

/* Thread and async-signal safe requests to the loop. A second stop while stopping kills
 * the workers at once (the second Ctrl-C). Before run(), they take effect when it starts.
 * A reload whose every new worker ended before its ready line, none of them ever ready, is
 * given up (logged; the serving generation goes on as if no reload had come): docs/serve.md
 * "Reload". */
void shmipc__sup_stop(shmipc__sup *sup);
void shmipc__sup_reload(shmipc__sup *sup);
void shmipc__sup_request_status(shmipc__sup *sup); /* prints the status on log_fd */

/*
 * Kills (SIGKILL) the worker listening on `address`, ready or stopping, that its front found
 * hung (`why`, for the log line); the loop then reaps it and, unless it was stopping,
 * restarts its slot with back-off as after a crash. Any thread (not a signal handler): it
 * takes the supervisor's lock, which the loop holds except while it polls. 0, SHMIPC_ENOENT
 * when no such worker runs (it ended meanwhile, or the address was another run's),
 * SHMIPC_EINVAL for NULL.
 */
int shmipc__sup_kill_hung(shmipc__sup *sup, const char *address, const char *why);

/* Copies up to cap slots (ordered by generation, then index) and returns how many there are. */
size_t shmipc__sup_snapshot(shmipc__sup *sup, shmipc__sup_worker_info *out, size_t cap);

/* Total spawns so far, the restarts and reloads included. */
uint64_t shmipc__sup_spawns(shmipc__sup *sup);

/* Writes the worker table to fd (one line per worker). Returns 0 or a negative code. */
int shmipc__sup_status(shmipc__sup *sup, int fd);

/*
 * A line of the embedding program's own (printf format; a newline is added) written to fd as
 * the supervisor writes its log: never blocking for long (a pipe, socket or terminal without
 * room within 20 ms loses it, and a later line says how many bytes were dropped). A program
 * that supervises must not write with stdio: a full stderr nobody reads holds the writer.
 */
void shmipc__sup_say(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Frees a supervisor whose run() returned (or never ran). */
void shmipc__sup_free(shmipc__sup *sup);

#endif
