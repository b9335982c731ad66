/*
 * shmipc-serve's process supervisor (supervisor.h, docs/serve.md "Supervision").
 *
 * Workers are started with posix_spawn: the process that embeds this also runs threads (the
 * front's reactors), and after a fork only exec is safe there. Each worker's stdout is a pipe
 * the loop reads: the line "... ready on ADDRESS" marks it ready, and everything is forwarded
 * to out_fd. Exits are seen through a pidfd per worker (poll wakes at once) and reaped with
 * waitpid() on that pid only, so the embedding program's own children are never taken.
 */
#include "sup_int.h"

#include "shmipc.h"
#include "common/clock.h"

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

/* The generations of all supervisors of a process are distinct, so two supervisors (tests) in
 * one process never share an address. */
static atomic_uint next_generation;
/* The control pipe of the supervisor whose run() handles signals. */
static volatile sig_atomic_t signal_fd = -1;

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

int shmipc__sup_kill_hung(shmipc__sup *sup, const char *address, const char *why)
{
    if (sup == NULL || address == NULL)
        return SHMIPC_EINVAL;
    int rc = SHMIPC_ENOENT;
    pthread_mutex_lock(&sup->mu);
    for (size_t i = 0; i < sup->nw; i++) {
        struct slot *s = &sup->w[i];
        if (s->pid <= 0 || strcmp(s->address, address) != 0 ||
            (s->state != SHMIPC__SUP_READY && s->state != SHMIPC__SUP_STOPPING))
            continue;
        if (!s->killed) {
            shmipc__sup_logf(sup, "worker %u (generation %u, pid %d) is hung (%s): killed",
                             s->index, s->gen, (int)s->pid, why != NULL ? why : "no reason given");
            shmipc__sup_signal(s, SIGKILL);
            s->killed = 1;
        }
        rc = 0;
        break;
    }
    pthread_mutex_unlock(&sup->mu);
    return rc;
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
    if (c->err_fd == 0)
        c->err_fd = 2;
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
        shmipc__sup_close_out(sup, &sup->w[i]);
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
        s->pidfd = s->out[0].fd = s->out[1].fd = -1;
        s->gen = gen;
        s->index = i;
        s->state = SHMIPC__SUP_BACKOFF;
        s->last_status = -1;
        s->deadline_ns = now;
        shmipc__sup_name_slot(s, now);
    }
    return 0;
}

static void remove_slot(shmipc__sup *sup, size_t i)
{
    memmove(&sup->w[i], &sup->w[i + 1], (sup->nw - i - 1) * sizeof *sup->w);
    sup->nw--;
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

static void begin_stop_slot(shmipc__sup *sup, struct slot *s, uint64_t now)
{
    if (s->state == SHMIPC__SUP_STOPPING)
        return;
    s->state = SHMIPC__SUP_STOPPING;
    s->term_ns = now;
    s->deadline_ns = now + sup->cfg.graceful_timeout_ms * NS_PER_MS;
    shmipc__sup_signal(s, SIGTERM);
}

/* A stopping slot gets its SIGKILL at `at` at the latest. A deadline only ever moves earlier:
 * a failed boot's 0.5 s gave a worker whose SIGKILL was due sooner (a reload's superseded one)
 * more time (test_boot_failure_never_delays_an_earlier_deadline). */
static void stop_by(struct slot *s, uint64_t at)
{
    if (s->state == SHMIPC__SUP_STOPPING && at < s->deadline_ns)
        s->deadline_ns = at;
}

static void begin_stop(shmipc__sup *sup, uint64_t now);

/* How long the other workers have after their SIGTERM when a failed boot ends the run (none was
 * ever ready, so none has a request to finish), and a given-up reload's workers (none of them
 * was ready). */
#define BOOT_FAILED_STOP_MS 500u

static uint64_t boot_failed_stop_at(const shmipc__sup *sup, uint64_t now)
{
    uint32_t ms = sup->cfg.graceful_timeout_ms < BOOT_FAILED_STOP_MS ? sup->cfg.graceful_timeout_ms
                                                                     : BOOT_FAILED_STOP_MS;
    return now + ms * NS_PER_MS;
}

/*
 * end_on_boot_failure: worker `s` ended before its ready line (`how`: its status, or the
 * spawn's failure) while no worker of the run was ever ready. The run ends, as gunicorn's
 * arbiter halts with "Worker failed to boot" (exit 3): an app that cannot be imported was
 * restarted with back-off for good, a service manager seeing a running process. The worker
 * said why on its stderr (forwarded). Returns whether it ended the run.
 */
static int boot_failure(shmipc__sup *sup, const struct slot *s, pid_t pid, const char *how,
                        uint64_t now)
{
    if (!sup->cfg.end_on_boot_failure || sup->ever_ready || sup->stopping)
        return 0;
    shmipc__sup_logf(sup,
                     "worker %u (generation %u, pid %d) failed to boot (%s) and no worker was "
                     "ever ready: stopping (exit status %d)",
                     s->index, s->gen, (int)pid, how, SHMIPC__SUP_BOOT_FAILED);
    sup->boot_failed = 1;
    begin_stop(sup, now);
    uint64_t at = boot_failed_stop_at(sup, now);
    for (size_t i = 0; i < sup->nw; i++)
        stop_by(&sup->w[i], at);
    return 1;
}

/*
 * A reload's new generation that cannot boot is given up, as nginx, on a SIGHUP with a bad
 * configuration, logs the error and keeps its old workers: before, its workers were restarted
 * with back-off for good beside the old ones. The rule: every worker of the new generation
 * ended before its ready line at least once (exited, killed at the start timeout, or could not
 * be spawned) while none of them was ever ready. One that got ready makes the others' failures
 * restarts as any (back-off; the reload completes when they come up). Worker `s` of cur_gen
 * (`pid` 0: it could not be spawned) just failed, as `how` says. Giving up removes the new
 * generation's slots that have no process and stops the others (never ready: nothing in
 * flight, so 0.5 s as a failed boot's), and the generation serving goes on as if no reload
 * had come; a later reload starts afresh. Returns whether it gave up (slots were removed).
 */
static int reload_boot_failure(shmipc__sup *sup, struct slot *s, pid_t pid, const char *how,
                               uint64_t now)
{
    if (sup->stopping || sup->cur_gen == sup->act_gen || s->gen != sup->cur_gen ||
        sup->reload_ready)
        return 0;
    s->boot_failed = 1;
    for (size_t i = 0; i < sup->nw; i++)
        if (sup->w[i].gen == sup->cur_gen && !sup->w[i].boot_failed)
            return 0;
    unsigned gen = sup->cur_gen;
    char who[48];
    if (pid > 0)
        snprintf(who, sizeof who, "worker %u, pid %d", s->index, (int)pid);
    else
        snprintf(who, sizeof who, "worker %u", s->index);
    shmipc__sup_logf(sup,
                     "reload: generation %u failed to boot: all %u of its workers ended before "
                     "their ready line (the last: %s: %s); the reload is given up: generation "
                     "%u keeps serving, a SIGHUP tries again",
                     gen, sup->cfg.workers, who, how, sup->act_gen);
    sup->cur_gen = sup->act_gen;
    uint64_t at = boot_failed_stop_at(sup, now);
    for (size_t i = 0; i < sup->nw;) {
        struct slot *w = &sup->w[i];
        if (w->gen == gen && w->pid <= 0) {
            remove_slot(sup, i);
            continue;
        }
        if (w->gen == gen) {
            begin_stop_slot(sup, w, now);
            stop_by(w, at);
        }
        i++;
    }
    return 1;
}

/* A slot's process exited with `status`: restart it, or drop it (stopping, old generation). */
static void on_exit_(shmipc__sup *sup, size_t i, int status, uint64_t now)
{
    struct slot *s = &sup->w[i];
    char how[32];
    describe_status(status, how, sizeof how);
    shmipc__sup_read_output(sup, s, now);
    /* A grandchild may still hold the pipes: its output is not ours to wait for. */
    shmipc__sup_close_out(sup, s);
    if (s->pidfd >= 0)
        close(s->pidfd);
    s->pidfd = -1;
    int was = s->state;
    pid_t pid = s->pid;
    double ran = (double)(now - s->started_ns) / 1e9;
    s->pid = 0;
    s->last_status = status;
    if (was == SHMIPC__SUP_READY) {
        sup->ever_ready = 1;
        sup->reload_ready |= s->gen == sup->cur_gen;
    }
    /* The stop, or the given-up reload, removes this slot (no process any more) with the others
     * that have none. */
    if (was == SHMIPC__SUP_STARTING &&
        (boot_failure(sup, s, pid, how, now) || reload_boot_failure(sup, s, pid, how, now)))
        return;
    if (sup->stopping || was == SHMIPC__SUP_STOPPING ||
        (s->gen != sup->cur_gen && s->gen != sup->act_gen)) {
        if (was != SHMIPC__SUP_STOPPING || status != 0)
            shmipc__sup_logf(sup, "worker %u (generation %u, pid %d) stopped: %s", s->index, s->gen,
                             (int)pid, how);
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
        shmipc__sup_logf(sup,
                         "worker %u (generation %u, pid %d) exited (%s) after %.1f s; restarting",
                         s->index, s->gen, (int)pid, how, ran);
    else
        shmipc__sup_logf(
            sup, "worker %u (generation %u, pid %d) %s (%s) after %.1f s; restart %u in %.1f s",
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
                if (sup->nw + 1 == before)
                    continue; /* slot i removed; the next one moved into i */
                if (sup->nw < before) {
                    /* A stop or a given-up reload removed others too, before i maybe: from the
                     * start again (the slots reaped have no pid any more). */
                    i = 0;
                    continue;
                }
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
        /* The generation under way, if any, is stopping: none is any more. */
        sup->cur_gen = sup->act_gen;
        shmipc__sup_logf(sup, "reload: out of memory; generation %u keeps serving", sup->act_gen);
        return;
    }
    shmipc__sup_logf(sup, "reload: starting generation %u (generation %u serves until it is ready)",
                     gen, sup->act_gen);
    sup->cur_gen = gen;
    sup->reload_ready = 0;
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
    shmipc__sup_logf(sup, "reload: generation %u ready; generation %u stopping", sup->act_gen, old);
}

static void begin_stop(shmipc__sup *sup, uint64_t now)
{
    if (sup->stopping) {
        /* The second request: no more waiting. */
        shmipc__sup_logf(sup, "stop: killing the workers now");
        for (size_t i = 0; i < sup->nw; i++)
            if (sup->w[i].pid > 0 && !sup->w[i].killed) {
                shmipc__sup_signal(&sup->w[i], SIGKILL);
                sup->w[i].killed = 1;
            }
        return;
    }
    sup->stopping = 1;
    shmipc__sup_logf(sup, "stop: stopping %zu workers (graceful timeout %.1f s)", sup->nw,
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
                shmipc__sup_logf(
                    sup, "worker %u (generation %u, pid %d) not ready within %.1f s: killed",
                    s->index, s->gen, (int)s->pid, sup->cfg.start_timeout_ms / 1000.0);
                shmipc__sup_signal(s, SIGKILL);
                s->killed = 1;
            } else {
                NEXT(s->deadline_ns);
            }
            break;
        case SHMIPC__SUP_STOPPING:
            if (s->killed)
                break;
            if (now >= s->deadline_ns) {
                shmipc__sup_logf(
                    sup,
                    "worker %u (generation %u, pid %d) still running %.1f s after SIGTERM: "
                    "killed",
                    s->index, s->gen, (int)s->pid, (double)(s->deadline_ns - s->term_ns) / 1e9);
                shmipc__sup_signal(s, SIGKILL);
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
                    shmipc__sup_logf(sup, "%u spawns in the last second: restarts are held back",
                                     sup->cfg.max_spawns_per_sec);
                }
                at = cap;
            }
            if (now >= at) {
                shmipc__sup_spawn(sup, s, now);
                /* posix_spawn failed (no such interpreter): a failed boot too. The stop, or
                 * the given-up reload, changed the slots: the loop's next round takes it from
                 * there. */
                if (s->state == SHMIPC__SUP_BACKOFF &&
                    (boot_failure(sup, s, 0, "it could not be started", now) ||
                     reload_boot_failure(sup, s, 0, "it could not be started", now)))
                    return now;
            }
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
    struct sigaction old[6];
    int on;
};
static const int handled_signals[6] = {SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGUSR1, SIGPIPE};

static void install_signals(shmipc__sup *sup, struct saved_signals *ss)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    signal_fd = sup->ctl[1];
    for (int i = 0; i < 6; i++) {
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
    for (int i = 0; i < 6; i++)
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
    if ((rc = add_generation(sup, sup->cur_gen, shmipc__now_ns())) != 0) {
        pthread_mutex_unlock(&sup->mu);
        return rc;
    }
    if (sup->cfg.signals)
        install_signals(sup, &ss);
    shmipc__sup_logf(sup, "starting %u workers: %s ...", sup->cfg.workers, sup->argv[0]);
    for (;;) {
        uint64_t now = shmipc__now_ns();
        /* Ready lines read in the last round count before any exit is looked at. */
        for (size_t i = 0; i < sup->nw; i++)
            if (sup->w[i].state == SHMIPC__SUP_READY) {
                sup->ever_ready = 1;
                sup->reload_ready |= sup->w[i].gen == sup->cur_gen;
            }
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
        size_t cap = 1 + 3 * sup->nw;
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
            for (int k = 0; k < 2; k++)
                if (sup->w[i].out[k].fd >= 0) {
                    pfds[n] = (struct pollfd){.fd = sup->w[i].out[k].fd, .events = POLLIN};
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
            uint64_t t = shmipc__now_ns();
            timeout = next <= t ? 0 : (int)((next - t + NS_PER_MS - 1) / NS_PER_MS);
        }
        if (sweep && (timeout < 0 || timeout > SWEEP_MS))
            timeout = SWEEP_MS;
        pthread_mutex_unlock(&sup->mu);
        int r = poll(pfds, n, timeout);
        pthread_mutex_lock(&sup->mu);
        if (r < 0 && errno != EINTR) {
            rc = -errno;
            shmipc__sup_logf(sup, "poll: %s; stopping the workers", strerror(errno));
            /* Cannot wait any more: kill and reap what is left so no worker outlives us. */
            for (size_t i = 0; i < sup->nw; i++)
                if (sup->w[i].pid > 0) {
                    shmipc__sup_signal(&sup->w[i], SIGKILL);
                    waitpid(sup->w[i].pid, NULL, 0);
                }
            break;
        }
        now = shmipc__now_ns();
        for (size_t k = 0; r > 0 && k < n; k++)
            if (pidx[k] != (size_t)-1 && (pfds[k].revents & (POLLIN | POLLHUP | POLLERR))) {
                shmipc__sup_read_output(sup, &sup->w[pidx[k]], now);
            }
    }
    for (size_t i = 0; i < sup->nw; i++) {
        shmipc__sup_close_out(sup, &sup->w[i]);
        if (sup->w[i].pidfd >= 0)
            close(sup->w[i].pidfd);
    }
    sup->nw = 0;
    if (rc == 0 && sup->boot_failed)
        rc = SHMIPC__SUP_BOOT_FAILED;
    if (rc == 0)
        shmipc__sup_logf(sup, "stopped");
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
    shmipc__sup_write_all(fd, line, (size_t)len);
    uint64_t now = shmipc__now_ns();
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
        shmipc__sup_write_all(fd, line, (size_t)len < sizeof line ? (size_t)len : sizeof line - 1);
    }
    free(w);
    return 0;
}
