/*
 * server_signals.c - run{signals = true}: SIGINT and SIGTERM stop a running server
 * gracefully, through a self-pipe and a watcher thread that run() starts and joins.
 *
 * Owns: the process-wide signal pipe and the watcher (one such run() at a time).
 * May call: the public C API (shmipc_server_stop), POSIX signals and pthreads.
 */
#include "lserver.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/*
 * run{signals = true}: SIGINT and SIGTERM stop the server gracefully instead of killing the
 * process. The handler only writes the signal number to a self-pipe (write() is
 * async-signal-safe; the pipe is non-blocking, and a full pipe already holds a wake-up); a
 * watcher thread that run() starts and joins reads it and calls shmipc_server_stop(). The
 * pipe is created once and never closed, so a handler still running on some thread when
 * run() restores the old dispositions never writes to a closed or reused descriptor. Signal
 * dispositions are per process, so one such run() at a time (else EBUSY).
 */
static int sig_pipe[2] = {-1, -1};
static pthread_mutex_t sig_lock = PTHREAD_MUTEX_INITIALIZER;
static int sig_busy;
static const int stop_signals[] = {SIGINT, SIGTERM};
_Static_assert(sizeof stop_signals / sizeof stop_signals[0] == NSTOP_SIGNALS,
               "NSTOP_SIGNALS (lserver.h) counts stop_signals");

static void on_stop_signal(int signo)
{
    int saved = errno;
    unsigned char b = (unsigned char)signo;
    ssize_t n = write(sig_pipe[1], &b, 1);
    (void)n;
    errno = saved;
}

static void drain_sig_pipe(int *first)
{
    unsigned char b;
    while (read(sig_pipe[0], &b, 1) == 1)
        if (first != NULL && *first == 0)
            *first = b;
}

static void *sig_watch_main(void *arg)
{
    struct sig_watch *w = arg;
    for (;;) {
        struct pollfd p[2] = {{.fd = sig_pipe[0], .events = POLLIN},
                              {.fd = w->quit_fd, .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[1].revents != 0)
            break;
        if (p[0].revents != 0) {
            drain_sig_pipe(&w->signo);
            shmipc_server_stop(w->s);
        }
    }
    return NULL;
}

/* Installs the stop handlers and starts the watcher; 0, or a negative code and `msg`. */
int shmipc__lua_sig_watch_start(struct sig_watch *w, shmipc_server *s, char *msg, size_t cap)
{
    struct sigaction sa;
    int rc = 0;
    memset(w, 0, sizeof *w);
    w->s = s;
    w->quit_fd = -1;
    pthread_mutex_lock(&sig_lock);
    if (sig_busy) {
        rc = SHMIPC_EBUSY;
        snprintf(msg, cap, "run: another run{signals = true} is active in this process");
        goto out;
    }
    if (sig_pipe[0] < 0 && pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
        rc = SHMIPC_EMFILE;
        snprintf(msg, cap, "run: pipe2: %s", strerror(errno));
        goto out;
    }
    drain_sig_pipe(NULL);
    w->quit_fd = eventfd(0, EFD_CLOEXEC);
    if (w->quit_fd < 0) {
        rc = SHMIPC_EMFILE;
        snprintf(msg, cap, "run: eventfd: %s", strerror(errno));
        goto out;
    }
    if ((rc = pthread_create(&w->thread, NULL, sig_watch_main, w)) != 0) {
        snprintf(msg, cap, "run: pthread_create: %s", strerror(rc));
        rc = SHMIPC_ENOMEM;
        close(w->quit_fd);
        w->quit_fd = -1;
        goto out;
    }
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < NSTOP_SIGNALS; i++)
        sigaction(stop_signals[i], &sa, &w->old[i]);
    sig_busy = 1;
out:
    pthread_mutex_unlock(&sig_lock);
    return rc;
}

/* Restores the dispositions, ends the watcher; returns the stop signal seen, or 0. */
int shmipc__lua_sig_watch_end(struct sig_watch *w)
{
    uint64_t one = 1;
    ssize_t n;
    pthread_mutex_lock(&sig_lock);
    for (size_t i = 0; i < NSTOP_SIGNALS; i++)
        sigaction(stop_signals[i], &w->old[i], NULL);
    n = write(w->quit_fd, &one, sizeof one);
    (void)n;
    pthread_join(w->thread, NULL);
    close(w->quit_fd);
    sig_busy = 0;
    pthread_mutex_unlock(&sig_lock);
    return w->signo;
}
