/*
 * shmipc-serve's process supervisor (supervisor.h, docs/serve.md "Supervision").
 *
 * Workers are started with posix_spawn: the process that embeds this also runs threads (the
 * front's reactors), and after a fork only exec is safe there. Each worker's stdout is a pipe
 * the loop reads: the line "... ready on ADDRESS" marks it ready, and everything is forwarded
 * to out_fd. Exits are seen through a pidfd per worker (poll wakes at once) and reaped with
 * waitpid() on that pid only, so the embedding program's own children are never taken.
 */
#include "supervisor.h"

#include "shmipc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define NS_PER_MS      1000000ull
#define LINE_MAX_BYTES 1024
/* Without a pidfd (old kernels) exits are found by this periodic waitpid sweep. */
#define SWEEP_MS 100

struct slot {
    pid_t pid;
    int pidfd;
    int out;
    unsigned gen;
    unsigned index;
    int state;
    unsigned restarts;
    int last_status;
    int killed; /* SIGKILL sent (start timeout or graceful deadline) */
    uint32_t delay_ms;
    uint32_t last_delay_ms;
    uint64_t started_ns;
    uint64_t ready_ns;
    uint64_t deadline_ns; /* STARTING: the start timeout; STOPPING: SIGKILL; BACKOFF: respawn */
    size_t line_len;
    char line[LINE_MAX_BYTES];
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
    int ran;
    int stopping;
    uint64_t stop_deadline_ns;
    uint64_t spawns;
    uint64_t *spawn_times; /* a ring of the last max_spawns_per_sec spawns */
    size_t spawn_pos;
    uint64_t rate_logged_ns;
    char **ready; /* the ready set last reported */
    size_t nready;
    atomic_int pending_stop, pending_reload, pending_status;
};

/* The generations of all supervisors of a process are distinct, so two supervisors (tests) in
 * one process never share an address. */
static atomic_uint next_generation;
/* The control pipe of the supervisor whose run() handles signals. */
static volatile sig_atomic_t signal_fd = -1;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return; /* a closed or full log is not a reason to stop supervising */
        p += k;
        n -= (size_t)k;
    }
}

static void logf_(shmipc__sup *sup, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(shmipc__sup *sup, const char *fmt, ...)
{
    char buf[512];
    int n = snprintf(buf, sizeof buf, "shmipc-serve[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        return;
    size_t len = (size_t)n +
                 ((size_t)m < sizeof buf - (size_t)n - 1 ? (size_t)m : sizeof buf - (size_t)n - 2);
    buf[len++] = '\n';
    write_all(sup->cfg.log_fd, buf, len);
}

static void describe_status(int status, char *out, size_t cap)
{
    if (status < 0)
        snprintf(out, cap, "-");
    else if (WIFEXITED(status))
        snprintf(out, cap, "exit %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(out, cap, "signal %d", WTERMSIG(status));
    else
        snprintf(out, cap, "status %d", status);
}

const char *shmipc__sup_state_name(int state)
{
    switch (state) {
    case SHMIPC__SUP_STARTING:
        return "starting";
    case SHMIPC__SUP_READY:
        return "ready";
    case SHMIPC__SUP_STOPPING:
        return "stopping";
    case SHMIPC__SUP_BACKOFF:
        return "backoff";
    default:
        return "?";
    }
}

static void ctl_write(shmipc__sup *sup, char c)
{
    int saved = errno;
    /* A full pipe already holds a wake-up; the pending_* flags carry the request. */
    ssize_t r = write(sup->ctl[1], &c, 1);
    (void)r;
    errno = saved;
}

void shmipc__sup_stop(shmipc__sup *sup)
{
    if (sup == NULL)
        return;
    atomic_fetch_add(&sup->pending_stop, 1);
    ctl_write(sup, 's');
}

void shmipc__sup_reload(shmipc__sup *sup)
{
    if (sup == NULL)
        return;
    atomic_fetch_add(&sup->pending_reload, 1);
    ctl_write(sup, 'h');
}

void shmipc__sup_request_status(shmipc__sup *sup)
{
    if (sup == NULL)
        return;
    atomic_store(&sup->pending_status, 1);
    ctl_write(sup, 'u');
}

static void on_signal(int signo)
{
    int saved = errno;
    int fd = signal_fd;
    char c = signo == SIGHUP ? 'H' : signo == SIGUSR1 ? 'U' : 'S';
    if (fd >= 0) {
        ssize_t r = write(fd, &c, 1);
        (void)r;
    }
    errno = saved;
}

int shmipc__sup_new(const shmipc__sup_config *cfg, shmipc__sup **out)
{
    if (out != NULL)
        *out = NULL;
    if (cfg == NULL || out == NULL || cfg->argv == NULL || cfg->argv[0] == NULL ||
        cfg->argv[0][0] == '\0' || cfg->workers == 0 || cfg->workers > SHMIPC__SUP_MAX_WORKERS)
        return SHMIPC_EINVAL;
    if (cfg->backoff_min_ms > 0 && cfg->backoff_max_ms > 0 &&
        cfg->backoff_min_ms > cfg->backoff_max_ms)
        return SHMIPC_EINVAL;
    shmipc__sup *sup = calloc(1, sizeof *sup);
    if (sup == NULL)
        return SHMIPC_ENOMEM;
    sup->ctl[0] = sup->ctl[1] = -1;
    int rc = SHMIPC_ENOMEM;
    sup->cfg = *cfg;
    sup->cfg.argv = NULL;
    sup->cfg.chdir_to = NULL;
    shmipc__sup_config *c = &sup->cfg;
    if (c->start_timeout_ms == 0)
        c->start_timeout_ms = 30000;
    if (c->graceful_timeout_ms == 0)
        c->graceful_timeout_ms = 30000;
    if (c->backoff_min_ms == 0)
        c->backoff_min_ms = 100;
    if (c->backoff_max_ms == 0)
        c->backoff_max_ms = 10000;
    if (c->backoff_max_ms < c->backoff_min_ms)
        c->backoff_max_ms = c->backoff_min_ms;
    if (c->healthy_ms == 0)
        c->healthy_ms = 10000;
    if (c->max_spawns_per_sec == 0)
        c->max_spawns_per_sec = 2 * c->workers + 4;
    if (c->out_fd == 0)
        c->out_fd = 1;
    if (c->log_fd == 0)
        c->log_fd = 2;
    pthread_mutex_init(&sup->mu, NULL);
    while (cfg->argv[sup->argc] != NULL)
        sup->argc++;
    sup->argv = calloc((size_t)sup->argc + 1, sizeof *sup->argv);
    sup->spawn_times = calloc(c->max_spawns_per_sec, sizeof *sup->spawn_times);
    if (sup->argv == NULL || sup->spawn_times == NULL)
        goto fail;
    for (int i = 0; i < sup->argc; i++)
        if ((sup->argv[i] = strdup(cfg->argv[i])) == NULL)
            goto fail;
    if (cfg->chdir_to != NULL && (sup->chdir_to = strdup(cfg->chdir_to)) == NULL)
        goto fail;
    if (pipe2(sup->ctl, O_CLOEXEC | O_NONBLOCK) != 0) {
        rc = -errno;
        goto fail;
    }
    sup->cur_gen = sup->act_gen = atomic_fetch_add(&next_generation, 1);
    *out = sup;
    return 0;
fail:
    shmipc__sup_free(sup);
    return rc;
}

void shmipc__sup_free(shmipc__sup *sup)
{
    if (sup == NULL)
        return;
    for (size_t i = 0; i < sup->nw; i++) {
        /* Only when run() never ran or failed before its loop: nothing is alive then. */
        if (sup->w[i].out >= 0)
            close(sup->w[i].out);
        if (sup->w[i].pidfd >= 0)
            close(sup->w[i].pidfd);
    }
    free(sup->w);
    if (sup->argv != NULL)
        for (int i = 0; i < sup->argc; i++)
            free(sup->argv[i]);
    free(sup->argv);
    free(sup->chdir_to);
    free(sup->spawn_times);
    for (size_t i = 0; i < sup->nready; i++)
        free(sup->ready[i]);
    free(sup->ready);
    if (sup->ctl[0] >= 0)
        close(sup->ctl[0]);
    if (sup->ctl[1] >= 0)
        close(sup->ctl[1]);
    pthread_mutex_destroy(&sup->mu);
    free(sup);
}

/* ---- slots ------------------------------------------------------------------------------ */

static int add_generation(shmipc__sup *sup, unsigned gen, uint64_t now)
{
    size_t need = sup->nw + sup->cfg.workers;
    if (need > sup->capw) {
        size_t cap = sup->capw ? sup->capw : 8;
        while (cap < need)
            cap *= 2;
        struct slot *w = realloc(sup->w, cap * sizeof *w);
        if (w == NULL)
            return SHMIPC_ENOMEM;
        sup->w = w;
        sup->capw = cap;
    }
    for (unsigned i = 0; i < sup->cfg.workers; i++) {
        struct slot *s = &sup->w[sup->nw++];
        memset(s, 0, sizeof *s);
        s->pidfd = s->out = -1;
        s->gen = gen;
        s->index = i;
        s->state = SHMIPC__SUP_BACKOFF;
        s->last_status = -1;
        s->deadline_ns = now;
        snprintf(s->address, sizeof s->address, "unix:@shmipc-serve-%d-%u-%u", (int)getpid(), gen,
                 i);
    }
    return 0;
}

static void remove_slot(shmipc__sup *sup, size_t i)
{
    memmove(&sup->w[i], &sup->w[i + 1], (sup->nw - i - 1) * sizeof *sup->w);
    sup->nw--;
}

/* "{address}" replaced in every argument; NULL when out of memory. */
static char **make_argv(shmipc__sup *sup, const char *address)
{
    static const char token[] = SHMIPC__SUP_ADDRESS_TOKEN;
    const size_t tl = sizeof token - 1, al = strlen(address);
    char **v = calloc((size_t)sup->argc + 1, sizeof *v);
    if (v == NULL)
        return NULL;
    for (int i = 0; i < sup->argc; i++) {
        const char *a = sup->argv[i];
        size_t n = 0;
        for (const char *p = strstr(a, token); p != NULL; p = strstr(p + tl, token))
            n++;
        char *o = malloc(strlen(a) + n * al + 1);
        if (o == NULL)
            goto fail;
        char *q = o;
        const char *p;
        while ((p = strstr(a, token)) != NULL) {
            memcpy(q, a, (size_t)(p - a));
            q += p - a;
            memcpy(q, address, al);
            q += al;
            a = p + tl;
        }
        strcpy(q, a);
        v[i] = o;
    }
    return v;
fail:
    for (int i = 0; i < sup->argc; i++)
        free(v[i]);
    free(v);
    return NULL;
}

static void free_argv(char **v)
{
    if (v == NULL)
        return;
    for (size_t i = 0; v[i] != NULL; i++)
        free(v[i]);
    free(v);
}

/* The crash-loop cap: when the last max_spawns_per_sec spawns all fall within one second,
 * the next one waits until the oldest of them is a second old. Returns when it may spawn. */
static uint64_t spawn_allowed_at(const shmipc__sup *sup)
{
    uint64_t oldest = sup->spawn_times[sup->spawn_pos];
    if (oldest == 0)
        return 0;
    return oldest + 1000 * NS_PER_MS;
}

static void spawn(shmipc__sup *sup, struct slot *s, uint64_t now)
{
    int pfd[2] = {-1, -1};
    char **argv = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    int have_fa = 0, have_at = 0, err;
    pid_t pid = 0;

    sup->spawn_times[sup->spawn_pos] = now;
    sup->spawn_pos = (sup->spawn_pos + 1) % sup->cfg.max_spawns_per_sec;
    sup->spawns++;
    s->started_ns = now;
    s->ready_ns = 0;
    s->killed = 0;
    s->line_len = 0;
    if ((argv = make_argv(sup, s->address)) == NULL) {
        err = ENOMEM;
        goto fail;
    }
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        err = errno;
        goto fail;
    }
    if ((err = posix_spawn_file_actions_init(&fa)) != 0)
        goto fail;
    have_fa = 1;
    if ((err = posix_spawnattr_init(&at)) != 0)
        goto fail;
    have_at = 1;
    /* stdin from /dev/null, stdout into our pipe (dup2 clears its close-on-exec), stderr
     * inherited; nothing else of this process (the front's listeners) passes to the worker. */
    err = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (!err)
        err = posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
    if (!err)
        err = posix_spawn_file_actions_addclosefrom_np(&fa, 3);
    if (!err && sup->chdir_to != NULL)
        err = posix_spawn_file_actions_addchdir_np(&fa, sup->chdir_to);
    if (err)
        goto fail;
    /* The worker starts with default dispositions and nothing blocked, whatever the
     * supervisor's threads ignore or block (SIGPIPE, signalfd masks). */
    sigset_t none, def;
    sigemptyset(&none);
    sigemptyset(&def);
    int defs[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGPIPE, SIGCHLD};
    for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++)
        sigaddset(&def, defs[i]);
    err = posix_spawnattr_setsigmask(&at, &none);
    if (!err)
        err = posix_spawnattr_setsigdefault(&at, &def);
    if (!err)
        err = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    if (err)
        goto fail;
    err = posix_spawnp(&pid, argv[0], &fa, &at, argv,
                       sup->cfg.envp != NULL ? sup->cfg.envp : environ);
    if (err)
        goto fail;
    close(pfd[1]);
    pfd[1] = -1;
    fcntl(pfd[0], F_SETFL, O_NONBLOCK);
    s->pid = pid;
    s->out = pfd[0];
    s->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    s->state = SHMIPC__SUP_STARTING;
    s->deadline_ns = now + sup->cfg.start_timeout_ms * NS_PER_MS;
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    free_argv(argv);
    return;
fail:
    logf_(sup, "worker %u (generation %u): cannot start %s: %s", s->index, s->gen, sup->argv[0],
          strerror(err));
    if (have_fa)
        posix_spawn_file_actions_destroy(&fa);
    if (have_at)
        posix_spawnattr_destroy(&at);
    if (pfd[0] >= 0)
        close(pfd[0]);
    if (pfd[1] >= 0)
        close(pfd[1]);
    free_argv(argv);
    /* As if it exited 127 at once (the shell's "not found"): the back-off applies. */
    s->pid = 0;
    s->last_status = 127 << 8;
    s->state = SHMIPC__SUP_BACKOFF;
    s->delay_ms = s->delay_ms == 0
                      ? sup->cfg.backoff_min_ms
                      : (s->delay_ms >= sup->cfg.backoff_max_ms / 2 ? sup->cfg.backoff_max_ms
                                                                    : s->delay_ms * 2);
    s->last_delay_ms = s->delay_ms;
    s->restarts++;
    s->deadline_ns = now + s->delay_ms * NS_PER_MS;
}

/* Checks a complete line of a starting worker's stdout for "ready on <its address>". */
static void check_ready_line(shmipc__sup *sup, struct slot *s, uint64_t now)
{
    static const char key[] = "ready on ";
    (void)sup;
    s->line[s->line_len] = '\0';
    size_t n = s->line_len;
    while (n > 0 && (s->line[n - 1] == '\r' || s->line[n - 1] == ' '))
        s->line[--n] = '\0';
    const char *p = strstr(s->line, key);
    if (p == NULL)
        return;
    if (strcmp(p + sizeof key - 1, s->address) != 0)
        return;
    s->state = SHMIPC__SUP_READY;
    s->ready_ns = now;
}

/* Reads what the worker wrote, forwards it to out_fd, and looks for its ready line while it
 * starts. Returns 0 at the pipe's end (the worker and any child holding it are done). */
static int read_output(shmipc__sup *sup, struct slot *s, uint64_t now)
{
    char buf[4096];
    for (int rounds = 0; rounds < 16; rounds++) {
        ssize_t k = read(s->out, buf, sizeof buf);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return 1; /* EAGAIN: all read */
        if (k == 0)
            return 0;
        write_all(sup->cfg.out_fd, buf, (size_t)k);
        for (ssize_t i = 0; i < k && s->state == SHMIPC__SUP_STARTING; i++) {
            if (buf[i] == '\n') {
                check_ready_line(sup, s, now);
                s->line_len = 0;
            } else if (s->line_len < sizeof s->line - 1) {
                s->line[s->line_len++] = buf[i];
            }
            /* A longer line is cut: it cannot be the ready line of an address we gave. */
        }
    }
    return 1;
}

static void close_out(struct slot *s)
{
    if (s->out >= 0)
        close(s->out);
    s->out = -1;
}

static void send_signal(struct slot *s, int sig)
{
    if (s->pid <= 0)
        return;
    /* The pidfd names this process even if its pid was reused; kill() is the fallback. */
    if (s->pidfd >= 0 && syscall(SYS_pidfd_send_signal, s->pidfd, sig, NULL, 0) == 0)
        return;
    kill(s->pid, sig);
}

static void begin_stop_slot(shmipc__sup *sup, struct slot *s, uint64_t now)
{
    if (s->state == SHMIPC__SUP_STOPPING)
        return;
    s->state = SHMIPC__SUP_STOPPING;
    s->deadline_ns = now + sup->cfg.graceful_timeout_ms * NS_PER_MS;
    send_signal(s, SIGTERM);
}

/* A slot's process exited with `status`: restart it, or drop it (stopping, old generation). */
static void on_exit_(shmipc__sup *sup, size_t i, int status, uint64_t now)
{
    struct slot *s = &sup->w[i];
    char how[32];
    describe_status(status, how, sizeof how);
    if (s->out >= 0 && read_output(sup, s, now) == 0)
        close_out(s);
    /* A grandchild may still hold the pipe: its output is not ours to wait for. */
    close_out(s);
    if (s->pidfd >= 0)
        close(s->pidfd);
    s->pidfd = -1;
    int was = s->state;
    pid_t pid = s->pid;
    double ran = (double)(now - s->started_ns) / 1e9;
    s->pid = 0;
    s->last_status = status;
    if (sup->stopping || was == SHMIPC__SUP_STOPPING ||
        (s->gen != sup->cur_gen && s->gen != sup->act_gen)) {
        if (was != SHMIPC__SUP_STOPPING || status != 0)
            logf_(sup, "worker %u (generation %u, pid %d) stopped: %s", s->index, s->gen, (int)pid,
                  how);
        remove_slot(sup, i);
        return;
    }
    uint32_t delay;
    if (was == SHMIPC__SUP_READY && status == 0) {
        delay = 0; /* a clean exit (--max-requests): replaced at once */
    } else {
        if (was == SHMIPC__SUP_READY && now - s->ready_ns >= sup->cfg.healthy_ms * NS_PER_MS)
            s->delay_ms = 0; /* it ran healthy long enough: the back-off starts over */
        delay = s->delay_ms == 0
                    ? sup->cfg.backoff_min_ms
                    : (s->delay_ms >= sup->cfg.backoff_max_ms / 2 ? sup->cfg.backoff_max_ms
                                                                  : s->delay_ms * 2);
        s->delay_ms = delay;
    }
    s->last_delay_ms = delay;
    s->restarts++;
    s->state = SHMIPC__SUP_BACKOFF;
    s->deadline_ns = now + delay * NS_PER_MS;
    if (delay == 0)
        logf_(sup, "worker %u (generation %u, pid %d) exited (%s) after %.1f s; restarting",
              s->index, s->gen, (int)pid, how, ran);
    else
        logf_(sup, "worker %u (generation %u, pid %d) %s (%s) after %.1f s; restart %u in %.1f s",
              s->index, s->gen, (int)pid, was == SHMIPC__SUP_STARTING ? "failed to start" : "died",
              how, ran, s->restarts, delay / 1000.0);
}

static void reap(shmipc__sup *sup, uint64_t now)
{
    for (size_t i = 0; i < sup->nw;) {
        struct slot *s = &sup->w[i];
        int status;
        if (s->pid > 0) {
            pid_t r = waitpid(s->pid, &status, WNOHANG);
            if (r == s->pid || (r < 0 && errno == ECHILD)) {
                if (r < 0)
                    status = -1; /* reaped by someone else: the status is lost */
                size_t before = sup->nw;
                on_exit_(sup, i, status, now);
                if (sup->nw < before)
                    continue; /* slot i removed; the next one moved into i */
            }
        }
        i++;
    }
}

static int gen_all_ready(const shmipc__sup *sup, unsigned gen)
{
    unsigned n = 0;
    for (size_t i = 0; i < sup->nw; i++)
        if (sup->w[i].gen == gen) {
            if (sup->w[i].state != SHMIPC__SUP_READY)
                return 0;
            n++;
        }
    return n == sup->cfg.workers;
}

/* Builds the ready set (the serving generation's and the new one's ready workers, never a
 * stopping one) and reports it when it changed. Called with the lock held; drops it for the
 * callback. */
static void report_ready_set(shmipc__sup *sup)
{
    const char *now_set[2 * SHMIPC__SUP_MAX_WORKERS];
    size_t n = 0;
    if (!sup->stopping)
        for (size_t i = 0; i < sup->nw && n < 2 * SHMIPC__SUP_MAX_WORKERS; i++) {
            const struct slot *s = &sup->w[i];
            if (s->state == SHMIPC__SUP_READY && (s->gen == sup->act_gen || s->gen == sup->cur_gen))
                now_set[n++] = s->address;
        }
    int same = n == sup->nready;
    for (size_t i = 0; same && i < n; i++)
        same = strcmp(now_set[i], sup->ready[i]) == 0;
    if (same)
        return;
    char **copy = calloc(n ? n : 1, sizeof *copy);
    if (copy == NULL)
        return; /* retried on the next round */
    for (size_t i = 0; i < n; i++)
        if ((copy[i] = strdup(now_set[i])) == NULL) {
            for (size_t j = 0; j < i; j++)
                free(copy[j]);
            free(copy);
            return;
        }
    for (size_t i = 0; i < sup->nready; i++)
        free(sup->ready[i]);
    free(sup->ready);
    sup->ready = copy;
    sup->nready = n;
    if (sup->cfg.on_ready_set != NULL) {
        pthread_mutex_unlock(&sup->mu);
        sup->cfg.on_ready_set(sup->cfg.data, (const char *const *)copy, n);
        pthread_mutex_lock(&sup->mu);
    }
}

static void do_reload(shmipc__sup *sup, uint64_t now)
{
    if (sup->stopping)
        return;
    unsigned gen = atomic_fetch_add(&next_generation, 1);
    /* A reload during a reload: the unfinished generation is superseded. */
    if (sup->cur_gen != sup->act_gen)
        for (size_t i = 0; i < sup->nw;) {
            struct slot *s = &sup->w[i];
            if (s->gen == sup->cur_gen && s->pid <= 0) {
                remove_slot(sup, i);
                continue;
            }
            if (s->gen == sup->cur_gen)
                begin_stop_slot(sup, s, now);
            i++;
        }
    if (add_generation(sup, gen, now) != 0) {
        logf_(sup, "reload: out of memory; generation %u keeps serving", sup->act_gen);
        return;
    }
    logf_(sup, "reload: starting generation %u (generation %u serves until it is ready)", gen,
          sup->act_gen);
    sup->cur_gen = gen;
}

/* The new generation is all ready: it serves alone, then the old ones are told to stop. */
static void promote(shmipc__sup *sup, uint64_t now)
{
    unsigned old = sup->act_gen;
    sup->act_gen = sup->cur_gen;
    report_ready_set(sup);
    for (size_t i = 0; i < sup->nw;) {
        struct slot *s = &sup->w[i];
        if (s->gen != sup->act_gen) {
            if (s->pid <= 0) {
                remove_slot(sup, i);
                continue;
            }
            begin_stop_slot(sup, s, now);
        }
        i++;
    }
    logf_(sup, "reload: generation %u ready; generation %u stopping", sup->act_gen, old);
}

static void begin_stop(shmipc__sup *sup, uint64_t now)
{
    if (sup->stopping) {
        /* The second request: no more waiting. */
        logf_(sup, "stop: killing the workers now");
        for (size_t i = 0; i < sup->nw; i++)
            if (sup->w[i].pid > 0 && !sup->w[i].killed) {
                send_signal(&sup->w[i], SIGKILL);
                sup->w[i].killed = 1;
            }
        return;
    }
    sup->stopping = 1;
    logf_(sup, "stop: stopping %zu workers (graceful timeout %.1f s)", sup->nw,
          sup->cfg.graceful_timeout_ms / 1000.0);
    for (size_t i = 0; i < sup->nw;) {
        struct slot *s = &sup->w[i];
        if (s->pid <= 0) {
            remove_slot(sup, i);
            continue;
        }
        begin_stop_slot(sup, s, now);
        i++;
    }
    report_ready_set(sup);
}

/* Deadlines: the start timeout, the graceful one, respawns. Returns the next one (0: none). */
static uint64_t run_timers(shmipc__sup *sup, uint64_t now)
{
    uint64_t next = 0;
#define NEXT(t) (next = (next == 0 || (t) < next) ? (t) : next)
    for (size_t i = 0; i < sup->nw; i++) {
        struct slot *s = &sup->w[i];
        switch (s->state) {
        case SHMIPC__SUP_STARTING:
            if (s->killed)
                break;
            if (now >= s->deadline_ns) {
                logf_(sup, "worker %u (generation %u, pid %d) not ready within %.1f s: killed",
                      s->index, s->gen, (int)s->pid, sup->cfg.start_timeout_ms / 1000.0);
                send_signal(s, SIGKILL);
                s->killed = 1;
            } else {
                NEXT(s->deadline_ns);
            }
            break;
        case SHMIPC__SUP_STOPPING:
            if (s->killed)
                break;
            if (now >= s->deadline_ns) {
                logf_(sup,
                      "worker %u (generation %u, pid %d) still running %.1f s after SIGTERM: "
                      "killed",
                      s->index, s->gen, (int)s->pid, sup->cfg.graceful_timeout_ms / 1000.0);
                send_signal(s, SIGKILL);
                s->killed = 1;
            } else {
                NEXT(s->deadline_ns);
            }
            break;
        case SHMIPC__SUP_BACKOFF: {
            uint64_t at = s->deadline_ns;
            uint64_t cap = spawn_allowed_at(sup);
            if (cap > at) {
                /* Held back by the cap rather than by its own delay: said once a second. */
                if (now - sup->rate_logged_ns >= 1000 * NS_PER_MS) {
                    sup->rate_logged_ns = now;
                    logf_(sup, "%u spawns in the last second: restarts are held back",
                          sup->cfg.max_spawns_per_sec);
                }
                at = cap;
            }
            if (now >= at)
                spawn(sup, s, now);
            NEXT(s->state == SHMIPC__SUP_BACKOFF ? at : s->deadline_ns);
            break;
        }
        default:
            break;
        }
    }
#undef NEXT
    return next;
}

static void drain_ctl(shmipc__sup *sup, uint64_t now)
{
    char buf[64];
    int stop = 0, reload = 0, status = 0;
    ssize_t k;
    while ((k = read(sup->ctl[0], buf, sizeof buf)) > 0)
        for (ssize_t i = 0; i < k; i++) {
            /* Capitals come from signal handlers, which cannot touch the counters. */
            stop += buf[i] == 'S';
            reload += buf[i] == 'H';
            status |= buf[i] == 'U';
        }
    stop += atomic_exchange(&sup->pending_stop, 0);
    reload += atomic_exchange(&sup->pending_reload, 0);
    status |= atomic_exchange(&sup->pending_status, 0);
    if (status) {
        pthread_mutex_unlock(&sup->mu);
        shmipc__sup_status(sup, sup->cfg.log_fd);
        pthread_mutex_lock(&sup->mu);
    }
    if (stop) {
        begin_stop(sup, now);
        if (stop > 1)
            begin_stop(sup, now);
    }
    if (reload && !sup->stopping)
        do_reload(sup, now);
}

struct saved_signals {
    struct sigaction old[5];
    int on;
};
static const int handled_signals[5] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGPIPE};

static void install_signals(shmipc__sup *sup, struct saved_signals *ss)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    signal_fd = sup->ctl[1];
    for (int i = 0; i < 5; i++) {
        /* SIGPIPE ignored: a closed stdout must not kill the supervisor of running workers. */
        sa.sa_handler = handled_signals[i] == SIGPIPE ? SIG_IGN : on_signal;
        sigaction(handled_signals[i], &sa, &ss->old[i]);
    }
    ss->on = 1;
}

static void restore_signals(struct saved_signals *ss)
{
    if (!ss->on)
        return;
    for (int i = 0; i < 5; i++)
        sigaction(handled_signals[i], &ss->old[i], NULL);
    signal_fd = -1;
}

int shmipc__sup_run(shmipc__sup *sup)
{
    if (sup == NULL)
        return SHMIPC_EINVAL;
    struct saved_signals ss = {.on = 0};
    struct pollfd *pfds = NULL;
    size_t *pidx = NULL;
    int rc = 0;
    pthread_mutex_lock(&sup->mu);
    if (sup->ran) {
        pthread_mutex_unlock(&sup->mu);
        return SHMIPC_EINVAL;
    }
    sup->ran = 1;
    if ((rc = add_generation(sup, sup->cur_gen, now_ns())) != 0) {
        pthread_mutex_unlock(&sup->mu);
        return rc;
    }
    if (sup->cfg.signals)
        install_signals(sup, &ss);
    logf_(sup, "starting %u workers: %s ...", sup->cfg.workers, sup->argv[0]);
    for (;;) {
        uint64_t now = now_ns();
        drain_ctl(sup, now);
        reap(sup, now);
        uint64_t next = run_timers(sup, now);
        /* The set with the newly ready workers first (beside the old generation's during a
         * reload), then, once the new generation is complete, the new one alone. */
        report_ready_set(sup);
        if (sup->cur_gen != sup->act_gen && gen_all_ready(sup, sup->cur_gen))
            promote(sup, now);
        if (sup->stopping && sup->nw == 0)
            break;
        /* A pollfd per worker pipe and pidfd, and the control pipe. */
        size_t cap = 1 + 2 * sup->nw;
        struct pollfd *np = realloc(pfds, cap * sizeof *np);
        size_t *ni = realloc(pidx, cap * sizeof *ni);
        if (np != NULL)
            pfds = np;
        if (ni != NULL)
            pidx = ni;
        if (np == NULL || ni == NULL) {
            /* Out of memory in the loop: wait a little and try again, never spin. */
            pthread_mutex_unlock(&sup->mu);
            poll(NULL, 0, SWEEP_MS);
            pthread_mutex_lock(&sup->mu);
            continue;
        }
        size_t n = 0;
        int sweep = 0;
        pfds[n] = (struct pollfd){.fd = sup->ctl[0], .events = POLLIN};
        pidx[n++] = (size_t)-1;
        for (size_t i = 0; i < sup->nw; i++) {
            if (sup->w[i].out >= 0) {
                pfds[n] = (struct pollfd){.fd = sup->w[i].out, .events = POLLIN};
                pidx[n++] = i;
            }
            if (sup->w[i].pid > 0 && sup->w[i].pidfd < 0)
                sweep = 1;
            if (sup->w[i].pidfd >= 0) {
                pfds[n] = (struct pollfd){.fd = sup->w[i].pidfd, .events = POLLIN};
                pidx[n++] = (size_t)-1; /* its exit is taken by reap() */
            }
        }
        int timeout = -1;
        if (next != 0) {
            uint64_t t = now_ns();
            timeout = next <= t ? 0 : (int)((next - t + NS_PER_MS - 1) / NS_PER_MS);
        }
        if (sweep && (timeout < 0 || timeout > SWEEP_MS))
            timeout = SWEEP_MS;
        pthread_mutex_unlock(&sup->mu);
        int r = poll(pfds, n, timeout);
        pthread_mutex_lock(&sup->mu);
        if (r < 0 && errno != EINTR) {
            rc = -errno;
            logf_(sup, "poll: %s; stopping the workers", strerror(errno));
            /* Cannot wait any more: kill and reap what is left so no worker outlives us. */
            for (size_t i = 0; i < sup->nw; i++)
                if (sup->w[i].pid > 0) {
                    send_signal(&sup->w[i], SIGKILL);
                    waitpid(sup->w[i].pid, NULL, 0);
                }
            break;
        }
        now = now_ns();
        for (size_t k = 0; r > 0 && k < n; k++)
            if (pidx[k] != (size_t)-1 && (pfds[k].revents & (POLLIN | POLLHUP | POLLERR))) {
                struct slot *s = &sup->w[pidx[k]];
                if (s->out >= 0 && read_output(sup, s, now) == 0)
                    close_out(s);
            }
    }
    for (size_t i = 0; i < sup->nw; i++) {
        close_out(&sup->w[i]);
        if (sup->w[i].pidfd >= 0)
            close(sup->w[i].pidfd);
    }
    sup->nw = 0;
    if (rc == 0)
        logf_(sup, "stopped");
    pthread_mutex_unlock(&sup->mu);
    restore_signals(&ss);
    free(pfds);
    free(pidx);
    return rc;
}

size_t shmipc__sup_snapshot(shmipc__sup *sup, shmipc__sup_worker_info *out, size_t cap)
{
    if (sup == NULL)
        return 0;
    pthread_mutex_lock(&sup->mu);
    size_t n = sup->nw;
    for (size_t i = 0; i < n && i < cap && out != NULL; i++) {
        const struct slot *s = &sup->w[i];
        shmipc__sup_worker_info *o = &out[i];
        memset(o, 0, sizeof *o);
        o->pid = s->pid;
        o->generation = s->gen;
        o->index = s->index;
        o->state = s->state;
        o->restarts = s->restarts;
        o->started_ns = s->started_ns;
        o->last_status = s->last_status;
        o->last_delay_ms = s->last_delay_ms;
        snprintf(o->address, sizeof o->address, "%s", s->address);
    }
    pthread_mutex_unlock(&sup->mu);
    return n;
}

uint64_t shmipc__sup_spawns(shmipc__sup *sup)
{
    if (sup == NULL)
        return 0;
    pthread_mutex_lock(&sup->mu);
    uint64_t n = sup->spawns;
    pthread_mutex_unlock(&sup->mu);
    return n;
}

int shmipc__sup_status(shmipc__sup *sup, int fd)
{
    if (sup == NULL || fd < 0)
        return SHMIPC_EINVAL;
    shmipc__sup_worker_info *w = calloc(2 * SHMIPC__SUP_MAX_WORKERS + 1, sizeof *w);
    if (w == NULL)
        return SHMIPC_ENOMEM;
    size_t n = shmipc__sup_snapshot(sup, w, 2 * SHMIPC__SUP_MAX_WORKERS + 1);
    if (n > 2 * SHMIPC__SUP_MAX_WORKERS + 1)
        n = 2 * SHMIPC__SUP_MAX_WORKERS + 1;
    pthread_mutex_lock(&sup->mu);
    unsigned act = sup->act_gen, cur = sup->cur_gen;
    int stopping = sup->stopping;
    uint64_t spawns = sup->spawns;
    pthread_mutex_unlock(&sup->mu);
    char line[256];
    int len = snprintf(line, sizeof line,
                       "shmipc-serve[%d] status: %zu workers, generation %u serving%s%s, %llu "
                       "spawns\n%-5s %-4s %-8s %-9s %-8s %-9s %-10s %s\n",
                       (int)getpid(), n, act, cur != act ? ", reloading to the next" : "",
                       stopping ? ", stopping" : "", (unsigned long long)spawns, "index", "gen",
                       "pid", "state", "restarts", "uptime", "last-exit", "address");
    write_all(fd, line, (size_t)len);
    uint64_t now = now_ns();
    for (size_t i = 0; i < n; i++) {
        char how[32], up[32];
        describe_status(w[i].last_status, how, sizeof how);
        if (w[i].pid > 0)
            snprintf(up, sizeof up, "%.1fs", (double)(now - w[i].started_ns) / 1e9);
        else
            snprintf(up, sizeof up, "-");
        len = snprintf(line, sizeof line, "%-5u %-4u %-8d %-9s %-8u %-9s %-10s %s\n", w[i].index,
                       w[i].generation, (int)w[i].pid, shmipc__sup_state_name(w[i].state),
                       w[i].restarts, up, how, w[i].address);
        write_all(fd, line, (size_t)len < sizeof line ? (size_t)len : sizeof line - 1);
    }
    free(w);
    return 0;
}
