/*
 * Starting a worker and signalling it (sup_int.h): the argv template with "{address}"
 * replaced (in every argument, or only whole ones), posix_spawn with stdin from /dev/null, stdout and stderr into pipes sup_output.c reads,
 * default signal dispositions and nothing else of this process inherited; a spawn that fails
 * counts as an exit 127 with its back-off. Signals go through the pidfd.
 */
#include "sup_int.h"

#include "shmipc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

extern char **environ;

/* "{address}" replaced in every argument (or only whole ones: address_whole_args); NULL when
 * out of memory. */
static char **make_argv(shmipc__sup *sup, const char *address)
{
    static const char token[] = SHMIPC__SUP_ADDRESS_TOKEN;
    const size_t tl = sizeof token - 1, al = strlen(address);
    char **v = calloc((size_t)sup->argc + 1, sizeof *v);
    if (v == NULL)
        return NULL;
    for (int i = 0; i < sup->argc; i++) {
        const char *a = sup->argv[i];
        if (sup->cfg.address_whole_args) {
            if ((v[i] = strdup(strcmp(a, token) == 0 ? address : a)) == NULL)
                goto fail;
            continue;
        }
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

void shmipc__sup_name_slot(struct slot *s, uint64_t now)
{
    /* Unguessable: another local user cannot take a name before its worker binds it. A name
     * is bound by one process only: a worker that exits leaves its name known to every local
     * user (/proc/net/unix), who could bind it and keep the slot from ever starting again. */
    uint64_t nonce = 0;
    if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce)
        nonce = now ^ ((uint64_t)s->index << 48) ^ (uint64_t)(uintptr_t)s ^ s->restarts;
    snprintf(s->address, sizeof s->address, "unix:@shmipc-serve-%d-%u-%u-%016llx", (int)getpid(),
             s->gen, s->index, (unsigned long long)nonce);
}

void shmipc__sup_spawn(shmipc__sup *sup, struct slot *s, uint64_t now)
{
    int pfd[2] = {-1, -1}, efd[2] = {-1, -1};
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
    s->out[0].len = s->out[1].len = 0;
    s->out[0].cut = s->out[1].cut = 0;
    shmipc__sup_name_slot(s, now); /* a restart never reuses the name of the process before */
    if ((argv = make_argv(sup, s->address)) == NULL) {
        err = ENOMEM;
        goto fail;
    }
    if (pipe2(pfd, O_CLOEXEC) != 0 || pipe2(efd, O_CLOEXEC) != 0) {
        err = errno;
        goto fail;
    }
    if ((err = posix_spawn_file_actions_init(&fa)) != 0)
        goto fail;
    have_fa = 1;
    if ((err = posix_spawnattr_init(&at)) != 0)
        goto fail;
    have_at = 1;
    /* stdin from /dev/null, stdout and stderr into our pipes (dup2 clears their close-on-exec);
     * nothing else of this process (the front's listeners) passes to the worker. */
    err = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (!err)
        err = posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
    if (!err)
        err = posix_spawn_file_actions_adddup2(&fa, efd[1], 2);
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
    close(efd[1]);
    fcntl(pfd[0], F_SETFL, O_NONBLOCK);
    fcntl(efd[0], F_SETFL, O_NONBLOCK);
    s->pid = pid;
    s->out[0].fd = pfd[0];
    s->out[1].fd = efd[0];
    s->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    s->state = SHMIPC__SUP_STARTING;
    s->deadline_ns = now + sup->cfg.start_timeout_ms * NS_PER_MS;
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    free_argv(argv);
    return;
fail:
    shmipc__sup_logf(sup, "worker %u (generation %u): cannot start %s: %s", s->index, s->gen,
                     sup->argv[0], strerror(err));
    if (have_fa)
        posix_spawn_file_actions_destroy(&fa);
    if (have_at)
        posix_spawnattr_destroy(&at);
    if (pfd[0] >= 0)
        close(pfd[0]);
    if (pfd[1] >= 0)
        close(pfd[1]);
    if (efd[0] >= 0)
        close(efd[0]);
    if (efd[1] >= 0)
        close(efd[1]);
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

void shmipc__sup_signal(struct slot *s, int sig)
{
    if (s->pid <= 0)
        return;
    /* The pidfd names this process even if its pid was reused; kill() is the fallback. */
    if (s->pidfd >= 0 && syscall(SYS_pidfd_send_signal, s->pidfd, sig, NULL, 0) == 0)
        return;
    kill(s->pid, sig);
}
