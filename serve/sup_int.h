/*
 * What the files of shmipc-serve's supervisor share (docs/design.md "Rooms: the supervisor"):
 * the supervisor and worker-slot structs, and the functions one file calls in another.
 * supervisor.c: the state machine, the poll loop and the API; sup_spawn.c: starting a worker
 * (posix_spawn, the argv template) and signalling it; sup_output.c: the worker's output pipe
 * (ready line, forwarding) and the supervisor's own log lines. Nothing here leaves serve/.
 */
#ifndef SHMIPC_SERVE_SUP_INT_H
#define SHMIPC_SERVE_SUP_INT_H

#include "supervisor.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define NS_PER_MS 1000000ull
/* Without a pidfd (old kernels) exits are found by this periodic waitpid sweep. */
#define SWEEP_MS 100
/* How long a write of output (forwarded or the supervisor's own) waits for room in a pipe, a
 * socket or a terminal nobody reads before what is left of it is dropped. */
#define OUT_WAIT_MS 20

/* One of a worker's output pipes and the start of a line not yet forwarded (docs/serve.md
 * "Starting": whole lines, each of one worker). */
struct sup_pipe {
    int fd;
    int cut; /* the last bytes forwarded ended a cut: a newline next is the cut line's own */
    size_t len;
    char buf[SHMIPC__SUP_LINE_MAX];
};

struct slot {
    pid_t pid;
    int pidfd;
    unsigned gen;
    unsigned index;
    int state;
    unsigned restarts;
    int last_status;
    int killed;      /* SIGKILL sent (start timeout or graceful deadline) */
    int boot_failed; /* a reload's new worker that ended before its ready line (once or more) */
    uint32_t delay_ms;
    uint32_t last_delay_ms;
    uint64_t started_ns;
    uint64_t ready_ns;
    uint64_t deadline_ns;   /* STARTING: the start timeout; STOPPING: SIGKILL; BACKOFF: respawn */
    uint64_t term_ns;       /* STOPPING: when it got its SIGTERM */
    struct sup_pipe out[2]; /* stdout (to out_fd), stderr (to err_fd) */
    char address[96];
};

struct shmipc__sup {
    shmipc__sup_config cfg;
    char **argv;
    int argc;
    char *chdir_to;
    int ctl[2];
    pthread_mutex_t mu;
    struct slot *w;
    size_t nw, capw;
    unsigned cur_gen; /* the newest generation */
    unsigned act_gen; /* the generation serving; != cur_gen while a reload is under way */
    int reload_ready; /* a worker of the reload's generation (cur_gen) was ever ready */
    int ran;
    int stopping;
    int ever_ready;  /* a worker of the run printed its ready line */
    int boot_failed; /* end_on_boot_failure ended the run */
    uint64_t stop_deadline_ns;
    uint64_t spawns;
    uint64_t *spawn_times; /* a ring of the last max_spawns_per_sec spawns */
    size_t spawn_pos;
    uint64_t rate_logged_ns;
    char **ready; /* the ready set last reported */
    size_t nready;
    atomic_int pending_stop, pending_reload, pending_status;
};

/* sup_output.c */
void shmipc__sup_write_all(int fd, const char *p, size_t n);
/* Test hook: called between a poll() that found room and the write (NULL: none). */
extern void (*shmipc__sup_after_poll_hook)(int fd);
void shmipc__sup_logf(shmipc__sup *sup, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void shmipc__sup_read_output(shmipc__sup *sup, struct slot *s, uint64_t now);
void shmipc__sup_close_out(shmipc__sup *sup, struct slot *s);

/* sup_spawn.c */
void shmipc__sup_name_slot(struct slot *s, uint64_t now);
void shmipc__sup_spawn(shmipc__sup *sup, struct slot *s, uint64_t now);
void shmipc__sup_signal(struct slot *s, int sig);

#endif
