/*
 * shmipc-serve, the application server's command (docs/serve.md): the flags and the config
 * file (serve/options.c), --check, then the run. The supervisor (serve/supervisor.c) starts
 * the worker processes and watches them on a thread of its own; once the first of them are
 * ready, the HTTP server starts with the front (core/serve/front.c) routing every path to the
 * ready workers, and each later change of the ready set (a restart, a reload) goes to the
 * front. The main thread waits for signals: SIGTERM, SIGINT or SIGQUIT stop the HTTP server
 * gracefully (it stops accepting, and the requests in flight are answered within the graceful
 * timeout), then the workers; SIGHUP reloads the workers; SIGUSR1 prints the workers' and the front's
 * state on stderr; SIGUSR2 reopens the access log (for logrotate).
 *
 * May call: the public API (the HTTP server), core/serve/front.h, serve/options.h and
 * serve/supervisor.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "shmipc.h"
#include "common/clock.h"
#include "options.h"
#include "serve/access_log.h"
#include "serve/front.h"
#include "supervisor.h"

/* How long --check lets the interpreter import APP. */
#define CHECK_IMPORT_MS 30000u
/* How long the workers have after their SIGTERM when the stop comes before the server ran
 * (a failed start, or a stop signal during the start): no request is in flight then. */
#define NO_SERVER_STOP_MS 500u

struct run {
    const shmipc__serve_options *o;
    struct shmipc__access_log *alog; /* NULL: no --access-log */
    shmipc__sup *sup;
    int wake_fd; /* eventfd: a ready set is pending, or the supervisor's thread ended */
    pthread_mutex_t mu;
    struct shmipc__front *front; /* set by the main thread once the server runs (mu) */
    char **pending;              /* the last ready set seen before that (mu) */
    size_t npending;
    int sup_done, sup_rc; /* the supervisor's loop returned (mu) */
};

/*
 * The stop signals: SIGTERM, SIGINT and SIGQUIT, each a graceful stop (docs/serve.md). SIGQUIT
 * is nginx's graceful stop; unhandled, its default action (a core dump) ended the process at
 * once, its requests in flight cut (test_serve_cli.py test_sigquit_is_a_graceful_stop).
 */
static int is_stop_signal(uint32_t signo)
{
    return signo == SIGTERM || signo == SIGINT || signo == SIGQUIT;
}

static void free_set(char **set, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(set[i]);
    free(set);
}

/* Hands the front a new set of ready workers; a refusal is logged (the old set stays). */
static void set_workers(struct shmipc__front *f, const char *const *addrs, size_t n)
{
    int rc = shmipc__front_set_workers(f, addrs, (unsigned)n);
    if (rc < 0)
        shmipc__sup_say(2, "shmipc-serve: workers: %s: %s", shmipc_errname(rc),
                        shmipc_error_detail());
}

static void wake(struct run *r)
{
    uint64_t one = 1;
    (void)!write(r->wake_fd, &one, sizeof one);
}

/*
 * The supervisor's thread: the ready set changed. Once the front runs it takes the set
 * directly; before, the set is kept for the main thread to start the server with. An empty
 * set (the stop began, or every worker is down) leaves the front's set as it is: a request
 * then waits for a worker that comes back, or gets its 502 or 504.
 */
static void on_ready_set(void *data, const char *const *addrs, size_t n)
{
    struct run *r = data;
    if (n == 0)
        return;
    if (n > SHMIPC__FRONT_MAX_WORKERS)
        n = SHMIPC__FRONT_MAX_WORKERS;
    pthread_mutex_lock(&r->mu);
    if (r->front != NULL) {
        set_workers(r->front, addrs, n);
        pthread_mutex_unlock(&r->mu);
        return;
    }
    char **set = calloc(n, sizeof *set);
    size_t k = 0;
    for (; set != NULL && k < n; k++)
        if ((set[k] = strdup(addrs[k])) == NULL)
            break;
    if (set == NULL || k < n) {
        free_set(set, k);
        pthread_mutex_unlock(&r->mu);
        shmipc__sup_say(2, "shmipc-serve: out of memory for the ready workers");
        return;
    }
    free_set(r->pending, r->npending);
    r->pending = set;
    r->npending = n;
    pthread_mutex_unlock(&r->mu);
    wake(r);
}

static void *sup_main(void *arg)
{
    struct run *r = arg;
    int rc = shmipc__sup_run(r->sup);
    pthread_mutex_lock(&r->mu);
    r->sup_done = 1;
    r->sup_rc = rc;
    pthread_mutex_unlock(&r->mu);
    wake(r);
    return NULL;
}

/* IPv4:PORT, [IPv6]:PORT, unix:PATH or unix:@NAME (options.c checked the shape and that the
 * host is numeric) into the server config. */
static int set_listen(shmipc_server_config *cfg, const char *listen)
{
    char host[256];
    if (strncmp(listen, "unix:", 5) == 0)
        return shmipc_server_config_set_address(cfg, listen);
    const char *colon = strrchr(listen, ':');
    if (colon == NULL || (size_t)(colon - listen) >= sizeof host)
        return shmipc_server_config_set_address(cfg, listen); /* reports the error */
    size_t hl = (size_t)(colon - listen);
    memcpy(host, listen, hl);
    host[hl] = '\0';
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    int rc = shmipc_server_config_set_address(cfg, host);
    if (rc == 0)
        rc = shmipc_server_config_set_port(cfg, atoi(colon + 1));
    return rc;
}

/* The front found a worker hung (a reactor thread): the supervisor kills and restarts it. */
static void on_hung(void *data, const char *address)
{
    struct run *r = data;
    (void)shmipc__sup_kill_hung(r->sup, address,
                                "it took nothing from the front for 5 s after a request's "
                                "deadline");
}

/* Starts the HTTP server and the front on the ready set `addrs`. */
static int start_server(struct run *r, char **addrs, size_t n, shmipc_server **srv_out)
{
    const shmipc__serve_options *o = r->o;
    struct shmipc__front_opts fo = {
        .workers = (const char *const *)addrs,
        .nworkers = (unsigned)n,
        /* --queue 0: no request waits; the front's 0 would mean its default. */
        .queue_max = o->queue ? o->queue : SHMIPC__FRONT_NO_QUEUE,
        .pipeline = o->pipeline,
        .hello = 1, /* every worker kind answers HELLO (docs/serve.md); ASGI says its concurrency */
        /* --timeout 0 means none; the front's 0 would mean its default. */
        .deadline_ms = o->timeout_ms ? o->timeout_ms : SHMIPC__FRONT_NO_DEADLINE,
        .access_log = r->alog,
        .on_hung = on_hung,
        .hung_data = r,
    };
    shmipc_server_config *cfg = NULL;
    shmipc_server *srv = NULL;
    struct shmipc__front *f = NULL;
    int rc;
    if ((rc = shmipc__front_new(&fo, &f)) < 0 || (rc = shmipc_server_config_new(&cfg)) < 0 ||
        (rc = set_listen(cfg, o->listen)) < 0 ||
        (rc = shmipc_server_config_set_workers(cfg, o->threads)) < 0 ||
        /* The server's stop waits an hour at most; the workers get the whole timeout. */
        (rc = shmipc_server_config_set_timeout(
             cfg, SHMIPC_SERVER_TIMEOUT_STOP,
             (int)(o->graceful_timeout_ms < 3600000u ? o->graceful_timeout_ms : 3600000u))) < 0 ||
        (rc = shmipc_server_new(cfg, &srv)) < 0 || (rc = shmipc__front_attach(f, srv, "/*")) < 0 ||
        (rc = shmipc_server_start(srv)) < 0) {
        shmipc__sup_say(2, "shmipc-serve: server: %s: %s", shmipc_errname(rc),
                        shmipc_error_detail());
        shmipc_server_close(srv);
        shmipc_server_config_free(cfg);
        shmipc__front_free(f);
        return rc;
    }
    shmipc_server_config_free(cfg);
    /*
     * From now on the supervisor's thread hands sets to the front itself. A set that came
     * while the server started is newer than `addrs`: applied here, under the same lock, so
     * no older set can follow it.
     */
    pthread_mutex_lock(&r->mu);
    r->front = f;
    if (r->pending != NULL) {
        set_workers(f, (const char *const *)r->pending, r->npending);
        free_set(r->pending, r->npending);
        r->pending = NULL;
        r->npending = 0;
    }
    pthread_mutex_unlock(&r->mu);
    /*
     * The address as bound: with port 0 the kernel's port (every reactor thread's socket shares
     * the one the first bound, core/reactor/sock.c). It said `--listen` as given, `:0`, and a
     * script had no port to connect to (test_serve_cli.py test_listen_on_port_0).
     */
    char shown[300];
    if (strncmp(o->listen, "unix:", 5) == 0)
        snprintf(shown, sizeof shown, "%s", o->listen);
    else
        snprintf(shown, sizeof shown, "%.*s:%d", (int)(strrchr(o->listen, ':') - o->listen),
                 o->listen, shmipc_server_port(srv));
    shmipc__sup_say(2, "shmipc-serve: listening on %s, %s app %s, %u worker%s", shown,
                    shmipc__serve_kind_name(o->kind), o->app, o->workers,
                    o->workers == 1 ? "" : "s");
    *srv_out = srv;
    return 0;
}

static void print_front_stats(struct run *r)
{
    struct shmipc__front_stats *st = malloc(sizeof *st);
    pthread_mutex_lock(&r->mu);
    int rc = st != NULL && r->front != NULL ? shmipc__front_stats(r->front, st) : -1;
    pthread_mutex_unlock(&r->mu);
    if (rc == 0) {
        shmipc__sup_say(
            2,
            "shmipc-serve: front: %u queued, %llu rejected (503), %llu timed out (504), "
            "%llu left by their client, %llu refused by a stopping worker and resent, "
            "%llu request bodies streamed (%llu bytes kept now, %llu at most)",
            st->queued, (unsigned long long)st->rejected, (unsigned long long)st->timeouts,
            (unsigned long long)st->client_gone, (unsigned long long)st->retried,
            (unsigned long long)st->uploads, (unsigned long long)st->upload_kept,
            (unsigned long long)st->upload_kept_peak);
        for (unsigned i = 0; i < st->nworkers; i++)
            shmipc__sup_say(
                2, "  %s %s: %u session(s), %u in flight, %llu served, %llu failed%s",
                st->w[i].address,
                st->w[i].state == SHMIPC__FRONT_WORKER_UP        ? "up"
                : st->w[i].state == SHMIPC__FRONT_WORKER_RETIRED ? "retired"
                                                                 : "down",
                st->w[i].sessions, st->w[i].in_flight, (unsigned long long)st->w[i].served,
                (unsigned long long)st->w[i].failures, st->w[i].hung ? ", hung (killed)" : "");
    }
    free(st);
    if (r->alog != NULL) {
        uint64_t lines, errors;
        shmipc__access_log_counts(r->alog, &lines, &errors);
        shmipc__sup_say(2, "shmipc-serve: access log: %llu lines written, %llu write errors",
                        (unsigned long long)lines, (unsigned long long)errors);
    }
}

/* Until a stop signal or the supervisor's end: starts the server, passes on HUP and USR1. */
static int run_loop(struct run *r, int sfd, shmipc_server **srv)
{
    for (;;) {
        struct pollfd p[2] = {{.fd = sfd, .events = POLLIN}, {.fd = r->wake_fd, .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            shmipc__sup_say(2, "shmipc-serve: poll: %s", strerror(errno));
            return 1;
        }
        if (p[0].revents) {
            struct signalfd_siginfo si;
            if (read(sfd, &si, sizeof si) == sizeof si) {
                if (is_stop_signal(si.ssi_signo))
                    return 0;
                if (si.ssi_signo == SIGHUP) {
                    shmipc__sup_say(2, "shmipc-serve: SIGHUP: reloading the workers");
                    shmipc__sup_reload(r->sup);
                } else if (si.ssi_signo == SIGUSR1) {
                    shmipc__sup_request_status(r->sup);
                    print_front_stats(r);
                } else if (si.ssi_signo == SIGUSR2 && r->alog != NULL) {
                    /* logrotate moved the file: lines go to a new one at the same path. */
                    if (shmipc__access_log_reopen(r->alog) < 0)
                        shmipc__sup_say(2, "shmipc-serve: SIGUSR2: %s (the old file stays)",
                                        shmipc_error_detail());
                }
            }
        }
        if (p[1].revents) {
            uint64_t junk;
            (void)!read(r->wake_fd, &junk, sizeof junk);
            pthread_mutex_lock(&r->mu);
            int done = r->sup_done, rc = r->sup_rc;
            char **set = NULL;
            size_t n = 0;
            if (*srv == NULL && r->pending != NULL) {
                set = r->pending;
                n = r->npending;
                r->pending = NULL;
                r->npending = 0;
            }
            pthread_mutex_unlock(&r->mu);
            if (set != NULL) {
                int src = start_server(r, set, n, srv);
                free_set(set, n);
                if (src < 0)
                    return 1;
            }
            if (done && rc == SHMIPC__SUP_BOOT_FAILED) {
                /* No worker could load the app at the start (the worker said why): gunicorn's
                 * "Worker failed to boot", its exit status 3 (docs/serve.md). */
                shmipc__sup_say(2, "shmipc-serve: a worker failed to boot: exiting with status %d",
                                SHMIPC__SUP_BOOT_FAILED);
                return SHMIPC__SUP_BOOT_FAILED;
            }
            if (done) {
                shmipc__sup_say(2, "shmipc-serve: the supervisor ended: %s",
                                rc < 0 ? shmipc_errname(rc) : "stopped");
                return 1;
            }
        }
    }
}

/*
 * The stop's watcher: from the first SIGTERM, SIGINT or SIGQUIT, one deadline of --graceful-timeout for
 * the whole stop (the server's close, which waits for the requests in flight, then the
 * workers' exit), and a second stop signal ends it at once (docs/serve.md, "Stop"): either
 * way every worker still running gets SIGKILL (shmipc__sup_stop twice). Without it the main
 * thread, blocked in the server's close and then in the supervisor's join, never read the
 * second Ctrl-C, and a worker busy past the deadline got another whole graceful timeout after
 * its SIGTERM, which came only once the server's close had waited out its own.
 */
struct stop_watch {
    struct run *r;
    int sfd, done_fd;
    uint64_t deadline_ns;
};

static void *stop_watch_main(void *arg)
{
    struct stop_watch *w = arg;
    int killed = 0;
    for (;;) {
        int timeout = -1;
        if (!killed) {
            uint64_t now = shmipc__now_ns();
            timeout = now >= w->deadline_ns ? 0 : (int)((w->deadline_ns - now + 999999) / 1000000);
        }
        struct pollfd p[2] = {{.fd = w->sfd, .events = POLLIN},
                              {.fd = w->done_fd, .events = POLLIN}};
        int n = poll(p, 2, timeout);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 || p[1].revents)
            return NULL;
        int kill_now = 0;
        if (n == 0 && !killed) {
            shmipc__sup_say(2, "shmipc-serve: the graceful timeout is over: killing the workers");
            kill_now = 1;
        }
        struct signalfd_siginfo si;
        if (p[0].revents && read(w->sfd, &si, sizeof si) == sizeof si && !killed &&
            is_stop_signal(si.ssi_signo)) {
            shmipc__sup_say(2, "shmipc-serve: a second stop signal: killing the workers");
            kill_now = 1;
        }
        if (kill_now) {
            /* The second stop request kills every worker still running; the requests they
             * held end (502 or a cut connection), so the server's close returns too. */
            shmipc__sup_stop(w->r->sup);
            shmipc__sup_stop(w->r->sup);
            killed = 1;
        }
    }
}

/*
 * The library's own lines (the front's "session ended", ...) come from the server's reactor
 * threads: written as this program's, never blocking for long. Through stderr's fprintf, a
 * full stderr nobody reads held the reactor that logged, and the server's close then waited
 * for it for good: SIGTERM never ended the process.
 */
static void log_sink(int level, const char *line)
{
    (void)level;
    shmipc__sup_say(2, "%s", line);
}

/*
 * The end of an option that prints and exits (--help, --version, --check), as coreutils'
 * close_stdout: the text is flushed and stdout closed, and a text that could not be written
 * (stdout closed, `>&-`; full, `>/dev/full`; EIO) is "write error" on stderr and exit 1. Before,
 * they exited `status` whatever became of the text: the caller was told it had it
 * (test_serve_cli.py test_print_and_exit_options_report_a_write_error).
 */
/* Set at the start when fd 1 was closed (it is /dev/null since: stdio_open()). */
static int stdout_was_closed;

/*
 * 0, 1 or 2 closed at the start (`<&- >&-`, a careless service manager): each is opened on
 * /dev/null, lowest first, so that it takes its own number. Else the descriptors made next took
 * them: the signalfd became fd 1, and the workers' forwarded output went into it
 * (test_serve_cli.py test_closed_standard_descriptors_are_not_reused).
 */
static void stdio_open(void)
{
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
            continue;
        if (fd == 1)
            stdout_was_closed = 1;
        int n = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
        if (n >= 0 && n != fd) { /* cannot be: fd was the lowest free number */
            (void)dup2(n, fd);
            close(n);
        }
    }
}

static int close_stdout(int status)
{
    int e = errno; /* a write in the print (a line-buffered terminal) set it, if it failed */
    int failed = ferror(stdout);
    if (stdout_was_closed) { /* what was printed went to /dev/null, not to the caller */
        failed = 1;
        e = EBADF;
    }
    if (fflush(stdout) != 0) {
        failed = 1;
        e = errno;
    }
    if (fclose(stdout) != 0 && !failed) {
        failed = 1;
        e = errno;
    }
    if (!failed)
        return status;
    if (e != 0)
        shmipc__sup_say(2, "shmipc-serve: write error: %s", strerror(e));
    else
        shmipc__sup_say(2, "shmipc-serve: write error");
    return 1;
}

/*
 * The front and the workers run on this process's CPUs (the workers inherit its mask). On one
 * CPU a waiter that spins only keeps its peer from running: at the CPU it needs, a one-worker
 * front spent 79 µs per request without the spin against 155 µs with it (docs/benchmarks.md,
 * "Application servers"). So no spin there, for the front and the workers, unless
 * SHMIPC_SPIN_US says otherwise. Before anything reads the knob (once per process).
 */
static void no_spin_on_one_cpu(void)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    if (getenv("SHMIPC_SPIN_US") == NULL && sched_getaffinity(0, sizeof set, &set) == 0 &&
        CPU_COUNT(&set) == 1)
        (void)setenv("SHMIPC_SPIN_US", "0", 1);
}

/*
 * --access-log naming a FIFO nobody reads yet: waits for its reader, as an open() of it would,
 * but a SIGTERM, SIGINT or SIGQUIT (blocked since main()'s start, as the others, which stay pending for
 * the run) ends the wait: -1. Before, the open() waited, and with the signals blocked from the
 * start nothing could stop it. *keep_fd: a non-blocking description of the FIFO that keeps the
 * reader's end from seeing an end of file until the log's own is open (the caller closes it).
 */
static int wait_for_a_reader(const char *path, int *keep_fd)
{
    struct stat st;
    if (strcmp(path, "-") == 0 || stat(path, &st) != 0 || !S_ISFIFO(st.st_mode))
        return 0;
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGQUIT);
    for (int said = 0;; said = 1) {
        int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
        if (fd >= 0 || errno != ENXIO) {
            *keep_fd = fd; /* or -1: the log's open says why */
            return 0;
        }
        if (!said)
            shmipc__sup_say(2, "shmipc-serve: --access-log %s is a FIFO: waiting for its reader",
                            path);
        struct timespec slice = {0, 50 * 1000000L};
        int sig = sigtimedwait(&stop, NULL, &slice);
        if (sig > 0 && is_stop_signal((uint32_t)sig)) {
            shmipc__sup_say(2, "shmipc-serve: stopped before the start");
            return -1;
        }
    }
}

int main(int argc, char **argv)
{
    shmipc__serve_options o;
    char err[512];
    char **wargv = NULL;
    struct run r = {.o = &o, .wake_fd = -1};
    shmipc_server *srv = NULL;
    pthread_t sup_thread;
    int started = 0, status = 2, sfd = -1, watching = 0;
    struct stop_watch stop = {.done_fd = -1};
    pthread_t stop_thread;
    sigset_t sigs, old_mask;

    /*
     * Before anything else: the signals the run reads are blocked (they wait, pending, for the
     * signalfd made below; every thread inherits the mask) and SIGPIPE is ignored. They were
     * set only once the options were parsed and the workers' command built, some 20 ms in: a
     * SIGHUP or SIGTERM sent right after the start (a service manager's reload) killed the
     * process with the default action, and a bad option's message to a closed stderr pipe
     * killed it with SIGPIPE instead of exiting 2 (test_serve_cli.py
     * test_signals_right_after_the_start_are_handled, test_bad_flag_into_a_closed_stderr).
     */
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGQUIT);
    sigaddset(&sigs, SIGHUP);
    sigaddset(&sigs, SIGUSR1);
    sigaddset(&sigs, SIGUSR2);
    (void)pthread_sigmask(SIG_BLOCK, &sigs, &old_mask);
    signal(SIGPIPE, SIG_IGN);
    stdio_open();
    no_spin_on_one_cpu();
    shmipc_set_log_sink(log_sink);
    if (shmipc__serve_options_init(&o) < 0) {
        shmipc__sup_say(2, "shmipc-serve: out of memory");
        return 2;
    }
    if (shmipc__serve_options_parse(&o, argc, argv, err, sizeof err) < 0) {
        shmipc__sup_say(2, "shmipc-serve: %s\n(shmipc-serve --help lists the options)", err);
        goto out;
    }
    if (o.help) {
        errno = 0;
        fputs(shmipc__serve_usage(), stdout);
        status = close_stdout(0);
        goto out;
    }
    if (o.version) {
        errno = 0;
        printf("shmipc-serve %s\n", shmipc_version_string());
        status = close_stdout(0);
        goto out;
    }
    if (o.check) {
        /* --check is a command like any other: a signal acts as it would without us. */
        (void)pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
        if (shmipc__serve_check(&o, NULL, CHECK_IMPORT_MS, err, sizeof err) < 0) {
            shmipc__sup_say(2, "shmipc-serve: check: %s", err);
            goto out;
        }
        errno = 0;
        printf("shmipc-serve: the configuration is valid\n");
        status = close_stdout(0);
        goto out;
    }
    if (o.access_log != NULL) {
        int fifo_fd = -1;
        if (wait_for_a_reader(o.access_log, &fifo_fd) < 0) {
            status = 0; /* a stop signal: the graceful stop's status */
            goto out;
        }
        int arc = shmipc__access_log_open(o.access_log, o.access_log_format, &r.alog);
        if (fifo_fd >= 0)
            close(fifo_fd);
        if (arc < 0) {
            shmipc__sup_say(2, "shmipc-serve: --access-log: %s", shmipc_error_detail());
            goto out;
        }
    }
    if (shmipc__serve_worker_argv(&o, &wargv, err, sizeof err) < 0) {
        shmipc__sup_say(2, "shmipc-serve: %s", err);
        goto out;
    }
    status = 1;
    /* The signals blocked since the start come through sfd only, those sent meanwhile too (a
     * SIGHUP then is a reload: it starts a generation beside the one starting). */
    if ((sfd = signalfd(-1, &sigs, SFD_CLOEXEC)) < 0 || (r.wake_fd = eventfd(0, EFD_CLOEXEC)) < 0) {
        shmipc__sup_say(2, "shmipc-serve: signals: %s", strerror(errno));
        goto out;
    }
    pthread_mutex_init(&r.mu, NULL);
    shmipc__sup_config sc = {
        .argv = (const char *const *)wargv,
        .chdir_to = o.chdir_to,
        .workers = o.workers,
        .graceful_timeout_ms = o.graceful_timeout_ms,
        /* The argument after --address only: APP and the paths are the user's, as typed. */
        .address_whole_args = 1,
        /* At the start, a worker that cannot load the app ends the run: exit 3. */
        .end_on_boot_failure = 1,
        .on_ready_set = on_ready_set,
        .data = &r,
    };
    int rc = shmipc__sup_new(&sc, &r.sup);
    if (rc < 0) {
        shmipc__sup_say(2, "shmipc-serve: supervisor: %s: %s", shmipc_errname(rc),
                        shmipc_error_detail());
        goto out;
    }
    if (pthread_create(&sup_thread, NULL, sup_main, &r) != 0) {
        shmipc__sup_say(2, "shmipc-serve: thread: %s", strerror(errno));
        goto out;
    }
    started = 1;
    status = run_loop(&r, sfd, &srv);
    /*
     * Whether asked for or after a failure (the server's start refused: its port taken), the
     * stop has its deadline and reads the stop signals: a failed start stopped the workers
     * with the signals blocked and nobody reading them, so one that ignored SIGTERM held the
     * process for the whole graceful timeout whatever the user sent.
     */
    /*
     * Until the server ran, no request reached a worker: nothing is in flight to wait for, and
     * the workers (starting, or ready and idle) get NO_SERVER_STOP_MS to end after their
     * SIGTERM, then SIGKILL. A failed start (the port taken) gave them the whole graceful
     * timeout, and one that ignored SIGTERM held the process that long before its exit 1
     * (test_serve_cli.py test_failed_start_stops_the_workers_promptly).
     */
    uint32_t stop_ms = o.graceful_timeout_ms;
    if (srv == NULL && stop_ms > NO_SERVER_STOP_MS)
        stop_ms = NO_SERVER_STOP_MS;
    if (srv == NULL && status != SHMIPC__SUP_BOOT_FAILED) /* the supervisor stopped them */
        shmipc__sup_say(2, "shmipc-serve: %s: stopping the workers (up to %u ms)",
                        status == 0 ? "stopped before the server started" : "the start failed",
                        stop_ms);
    stop.r = &r;
    stop.sfd = sfd;
    stop.deadline_ns = shmipc__now_ns() + (uint64_t)stop_ms * 1000000ull;
    if ((stop.done_fd = eventfd(0, EFD_CLOEXEC)) >= 0 &&
        pthread_create(&stop_thread, NULL, stop_watch_main, &stop) == 0)
        watching = 1;
    /*
     * The stop: closing the server stops it gracefully (no new connection; the requests in
     * flight are answered, up to the stop timeout), while the workers still serve; then the
     * workers are stopped.
     */
    if (srv != NULL) {
        shmipc__sup_say(2, "shmipc-serve: stopping (up to %u ms for requests in flight)",
                        o.graceful_timeout_ms);
        shmipc_server_close(srv);
        srv = NULL;
    }
out:
    if (started) {
        shmipc__sup_stop(r.sup);
        pthread_join(sup_thread, NULL);
        if (status == 0 && r.sup_rc < 0)
            status = 1;
    }
    if (watching) {
        uint64_t one = 1;
        (void)!write(stop.done_fd, &one, sizeof one);
        pthread_join(stop_thread, NULL);
    }
    if (stop.done_fd >= 0)
        close(stop.done_fd);
    shmipc_server_close(srv);
    shmipc__front_free(r.front);
    shmipc__access_log_free(r.alog); /* after the server: its threads flushed their lines */
    shmipc__sup_free(r.sup);
    free_set(r.pending, r.npending);
    shmipc__serve_argv_free(wargv);
    shmipc__serve_options_free(&o);
    if (sfd >= 0)
        close(sfd);
    if (r.wake_fd >= 0)
        close(r.wake_fd);
    return status;
}
