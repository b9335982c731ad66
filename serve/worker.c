/*
 * shmipc-serve-worker: one application worker process of shmipc-serve for a C handler in a
 * shared object (--c LIB.so[:SYMBOL]) or a Lua handler module (--lua MODULE[:FUNCTION], Lua 5.4
 * embedded: serve/worker_lua.c). docs/serve.md, "The C worker" and "The Lua worker".
 *
 * The process contract is the Python worker's (python/shmipc/serve/worker.py): listen on the
 * shmipc address of --address, print "... ready on ADDRESS", serve each stream a front opens as
 * one request (shmipc_serve_handle_stream(): the protocol's answers whatever the handler does),
 * one request at a time per process; SIGTERM, SIGINT or SIGQUIT stop it after the request in progress
 * (exit 0), and so does the Nth request with --max-requests N; SIGHUP, SIGUSR1 and SIGUSR2 do
 * nothing (unless the application handles them); --parent-pid asks for a SIGTERM when the
 * supervisor dies. --check loads the application and exits 0, or 2 with the reason.
 *
 * May call: the public API (libshmipc) and serve/worker.h.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "shmipc_serve.h"
#include "worker.h"

/* A unix socket address by the rule of shmipc's address parser: "unix:...", or a path or
 * "@name" without the prefix; anything else is TCP, which carries no uid. */
static int is_unix_address(const char *a)
{
    return strncmp(a, "unix:", 5) == 0 || a[0] == '/' || a[0] == '.' || a[0] == '@';
}

/* Blocking accepts wake this often to see a stop. */
#define POLL_MS 200
/* Refused requests: how long their frames are waited for, all reads together (the one that
 * came after the stop, then those left in the session's queue; as the Python worker's). */
#define REFUSE_MS 5000
/* Streams refused when a session ends: at most this many (see refuse_stream). */
#define REFUSE_MAX 64

/* Set by the signal handler and by the session that reached --max-requests; read by every
 * thread: a lock-free atomic (async-signal safe), not a plain volatile, so threads agree. */
static int stopping_flag;

static int stopping(void)
{
    return __atomic_load_n(&stopping_flag, __ATOMIC_ACQUIRE);
}

static void stop_now(void)
{
    __atomic_store_n(&stopping_flag, 1, __ATOMIC_RELEASE);
    /* An open WebSocket would hold the worker until its client leaves: it closes 1001. */
    shmipc_serve_shutdown();
}

static void on_stop(int sig)
{
    (void)sig;
    stop_now();
}

/*
 * The supervisor's own signals: SIGHUP (a reload, which stops this generation with SIGTERM once
 * the next one is ready), SIGUSR1 (its status), SIGUSR2 (its access log). Sent to the whole
 * process group (a terminal's hangup, kill -HUP -PGID, a pkill whose pattern matches the
 * workers' name too) they reach the workers, and their default action killed the worker and
 * cut its request in flight (a 502). So each does nothing here, unless the application (its
 * constructors ran at its load) handles or ignores it itself: caught by a handler that does
 * nothing rather than ignored, since an ignored signal stays ignored in the programs a handler
 * runs; SA_RESTART, so the application's own system calls go on (the worker's waits retry an
 * interruption).
 */
static void on_ignored(int sig)
{
    (void)sig;
}

static void ignore_supervisor_signals(void)
{
    static const int sigs[] = {SIGHUP, SIGUSR1, SIGUSR2};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old, sa = {.sa_handler = on_ignored, .sa_flags = SA_RESTART};
        sigemptyset(&sa.sa_mask);
        if (sigaction(sigs[i], NULL, &old) == 0 && !(old.sa_flags & SA_SIGINFO) &&
            old.sa_handler == SIG_DFL)
            sigaction(sigs[i], &sa, NULL);
    }
}

struct worker {
    shmipc_serve_handler fn;
    void *data;
    pthread_mutex_t mu; /* one request at a time per process */
    unsigned long long served, max_requests;
    unsigned long long counts[6]; /* by SHMIPC_SERVE_OUTCOME_* */
};

struct session_thread {
    struct worker *w;
    shmipc_session *s;
    pthread_t t;
    int done;
    struct session_thread *next;
};

/*
 * ABORT SHUTDOWN, the protocol's "not processed", to a request this worker will not serve (it
 * is stopping): the front gives it to another worker, whatever its method. A stream whose
 * first frame is not a REQUEST_HEAD (a late ABORT) is just closed. After the ABORT the rest
 * of the request is read, bounded, so that nothing of it arrives after the close.
 */
static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The read timeout to `deadline` (now_ms()): 0 once it passed, a read then takes only what
 * arrived. A front that stalls a stream or trickles its body cannot hold a stopping worker. */
static void refuse_wait_left(shmipc_stream *st, int64_t deadline)
{
    int64_t left = deadline - now_ms();
    shmipc_stream_set_timeout(st, SHMIPC_TIMEOUT_READ, left > 0 ? (int)left : 0);
}

/*
 * `n` bytes of the refused stream by `deadline`. A signal that lands on this thread while it
 * waits (a second SIGTERM: the supervisor's and the parent-death one; the supervisor's own
 * signals sent to the group) fails the wait with SHMIPC_EINTR, having read nothing: the wait
 * goes on with what is left of the deadline, rather than ending the refusal and closing the
 * stream before the front sent the rest of its request. Past the deadline a read does not
 * wait, so no signal can make this loop long.
 */
static int refuse_read(shmipc_stream *st, size_t n, const void **p, int64_t deadline)
{
    int rc;
    do {
        refuse_wait_left(st, deadline);
        rc = shmipc_stream_read_exact_bytes(st, n, p, 0);
    } while (rc == SHMIPC_EINTR);
    return rc;
}

/* The ABORT SHUTDOWN sent; a flush that a signal interrupted (nothing sent) is tried again. */
static int refuse_send_abort(shmipc_stream *st)
{
    uint8_t h[SHMIPC_SERVE_HDR_SIZE];
    int rc;
    if (shmipc_serve_encode_header(h, sizeof h, SHMIPC_SERVE_ABORT, 0,
                                   SHMIPC_SERVE_ABORT_SHUTDOWN) < 0 ||
        shmipc_stream_write(st, h, sizeof h) < 0)
        return -1;
    do
        rc = shmipc_stream_flush(st);
    while (rc == SHMIPC_EINTR);
    return rc;
}

static void refuse_stream(shmipc_stream *st, int64_t deadline)
{
    uint8_t h[SHMIPC_SERVE_HDR_SIZE];
    const void *p;
    int first = 1;
    for (;;) {
        shmipc_serve_frame f = {.size = sizeof f};
        if (refuse_read(st, sizeof h, &p, deadline) < 0)
            break;
        memcpy(h, p, sizeof h);
        shmipc_stream_release(st);
        if (shmipc_serve_decode_header(h, sizeof h, &f) != (int)sizeof h)
            break;
        if (f.length > 0) {
            if (refuse_read(st, f.length, &p, deadline) < 0)
                break;
            shmipc_stream_release(st);
        }
        if (first) {
            /* A new session's HELLO: the session gets nothing more from the front. Closed
             * without an answer, the front would take this worker for one that does not know
             * HELLO, and send it uploads it cannot resend when refused. */
            if (f.type == SHMIPC_SERVE_HELLO) {
                (void)refuse_send_abort(st);
                break;
            }
            if (f.type != SHMIPC_SERVE_REQUEST_HEAD)
                break;
            first = 0;
            if (refuse_send_abort(st) < 0)
                break;
            continue;
        }
        if (f.type == SHMIPC_SERVE_END || f.type == SHMIPC_SERVE_ABORT)
            break;
    }
    shmipc_stream_close(st);
}

static void *serve_session(void *arg)
{
    struct session_thread *th = arg;
    struct worker *w = th->w;
    while (!stopping()) {
        shmipc_stream *st;
        int rc = shmipc_session_accept_stream(th->s, POLL_MS, &st);
        /* EINTR: a signal (the app's own handler, or SIGTERM, which stopping() then sees)
         * interrupted the wait; the session is fine. */
        if (rc == SHMIPC_ETIMEDOUT || rc == SHMIPC_EAGAIN || rc == SHMIPC_EINTR)
            continue;
        if (rc < 0)
            break; /* the front's session ended */
        pthread_mutex_lock(&w->mu);
        if (stopping()) {
            /* Past --max-requests, or stopping: not served, and said so. */
            pthread_mutex_unlock(&w->mu);
            refuse_stream(st, now_ms() + REFUSE_MS);
            break;
        }
        int outcome = shmipc_serve_handle_stream(st, w->fn, w->data);
        if (outcome >= 0 && outcome < 6)
            w->counts[outcome]++;
        if (outcome != SHMIPC_SERVE_OUTCOME_LATE && outcome != SHMIPC_SERVE_OUTCOME_HELLO) {
            w->served++;
            if (w->max_requests && w->served >= w->max_requests)
                stop_now();
        }
        pthread_mutex_unlock(&w->mu);
    }
    /* Streams the front opened that this worker will not serve: each refused, so the front
     * gives its request to another worker instead of a 502. One deadline for all of them:
     * stalled streams cannot add up. */
    int64_t deadline = now_ms() + REFUSE_MS;
    for (int i = 0; i < REFUSE_MAX; i++) {
        shmipc_stream *st;
        if (shmipc_session_accept_stream(th->s, 0, &st) < 0)
            break;
        refuse_stream(st, deadline);
    }
    shmipc_session_close(th->s);
    __atomic_store_n(&th->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* LIB.so[:SYMBOL]: the last ':' starts the symbol when a C identifier follows it. */
static int load_c(const char *spec, shmipc_serve_handler *fn, char *err, size_t errlen)
{
    char path[4096];
    const char *sym = SHMIPC__WORKER_C_SYMBOL;
    const char *c = strrchr(spec, ':');
    size_t plen = strlen(spec);
    if (c != NULL && c[1] != '\0' &&
        strspn(c + 1, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVW"
                      "XYZ_0123456789") == strlen(c + 1) &&
        !(c[1] >= '0' && c[1] <= '9')) {
        sym = c + 1;
        plen = (size_t)(c - spec);
    }
    if (plen == 0 || plen >= sizeof path) {
        snprintf(err, errlen, "'%s' is not LIB.so[:SYMBOL]", spec);
        return -1;
    }
    memcpy(path, spec, plen);
    path[plen] = '\0';
    /* A bare name would be searched in the system's library path: "./" keeps it the file. */
    char full[4096 + 2];
    snprintf(full, sizeof full, "%s%s", strchr(path, '/') != NULL ? "" : "./", path);
    void *h = dlopen(full, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(err, errlen, "cannot load %s: %s", path, dlerror());
        return -1;
    }
    dlerror();
    void *f = dlsym(h, sym);
    const char *e = dlerror();
    if (e != NULL || f == NULL) {
        snprintf(err, errlen, "%s has no function %s%s%s", path, sym, e ? ": " : "", e ? e : "");
        dlclose(h);
        return -1;
    }
    /* dlsym gives a data pointer; POSIX guarantees it converts to the function's. */
    memcpy(fn, &f, sizeof *fn);
    return 0; /* the library stays loaded for the process's life */
}

static void usage(FILE *to)
{
    fputs("usage: shmipc-serve-worker (--c LIB.so[:SYMBOL] | --lua MODULE[:FUNCTION])\n"
          "                           --address ADDR [--max-requests N] [--parent-pid PID]\n"
          "       shmipc-serve-worker (--c ... | --lua ...) --check\n"
          "Serves a C handler (SYMBOL, by default " SHMIPC__WORKER_C_SYMBOL
          ") or a Lua handler to a shmipc-serve front on the shmipc address ADDR "
          "(docs/serve.md).\n",
          to);
}

static int parse_count(const char *s, unsigned long long *out)
{
    char *end;
    if (s == NULL || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > 1000000000ull)
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    const char *c_app = NULL, *lua_app = NULL, *address = NULL;
    unsigned long long max_requests = 0, parent = 0;
    int check = 0;
    char err[8192] = "";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--check") == 0) {
            check = 1;
            continue;
        }
        if (v == NULL) {
            fprintf(stderr, "shmipc-serve-worker: %s needs a value\n", a);
            usage(stderr);
            return 2;
        }
        i++;
        if (strcmp(a, "--c") == 0)
            c_app = v;
        else if (strcmp(a, "--lua") == 0)
            lua_app = v;
        else if (strcmp(a, "--address") == 0)
            address = v;
        else if (strcmp(a, "--max-requests") == 0 && parse_count(v, &max_requests) == 0)
            ;
        else if (strcmp(a, "--parent-pid") == 0 && parse_count(v, &parent) == 0 && parent > 0)
            ;
        else {
            fprintf(stderr, "shmipc-serve-worker: bad argument %s %s\n", a, v);
            usage(stderr);
            return 2;
        }
    }
    if ((c_app == NULL) == (lua_app == NULL) || (!check && address == NULL)) {
        fprintf(stderr, "shmipc-serve-worker: give one of --c and --lua%s\n",
                check ? "" : ", and --address");
        usage(stderr);
        return 2;
    }
    struct worker w = {.max_requests = max_requests};
    pthread_mutex_init(&w.mu, NULL);
    int rc = c_app != NULL ? load_c(c_app, &w.fn, err, sizeof err)
                           : shmipc__worker_lua_load(lua_app, &w.fn, &w.data, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "shmipc-serve worker: %s\n", err);
        return 2;
    }
    if (check) {
        shmipc__worker_lua_free(w.data);
        return 0;
    }

    struct sigaction sa = {.sa_handler = on_stop};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* A terminal's Ctrl-\ sends SIGQUIT to the whole group, shmipc-serve's graceful stop: the
     * workers end after their request, as on Ctrl-C, rather than dumping core. */
    sigaction(SIGQUIT, &sa, NULL);
    ignore_supervisor_signals();
    signal(SIGPIPE, SIG_IGN);
    if (parent > 0) {
        /* A supervisor killed with SIGKILL leaves no worker behind; checked after the prctl,
         * so a parent that died before it is seen here rather than missed. */
        prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0);
        if ((unsigned long long)getppid() != parent)
            stop_now();
    }
    shmipc_listener *l;
    shmipc_config *cfg = NULL;
    /* A response the front holds back (its client reads slowly) stops this worker's writes
     * once the session's shared memory is full, instead of going over the socket to the
     * front's heap (docs/serve.md, "Backpressure"). */
    /* The handshake's 10 s: a front's own connect timeout bounds its wait; the 1 s default
     * here failed fronts' handshakes on a loaded machine (the listener's thread gave up). */
    /* Only the front may connect: on a unix socket (an abstract name is open to every local
     * process) a client must run as our own uid, as the front does (docs/security.md). */
    uint32_t me = (uint32_t)geteuid();
    if ((rc = shmipc_config_new(&cfg)) == 0 && (rc = shmipc_config_set_memory_wait(cfg, 1)) == 0 &&
        (rc = shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_INITIALIZE, 10000)) == 0 &&
        (!is_unix_address(address) || (rc = shmipc_config_set_peer_uids(cfg, &me, 1)) == 0))
        rc = shmipc_listener_new(address, cfg, &l);
    shmipc_config_free(cfg);
    if (rc < 0) {
        fprintf(stderr, "shmipc-serve worker: cannot listen on %s: %s: %s\n", address,
                shmipc_errname(rc), shmipc_error_detail());
        shmipc__worker_lua_free(w.data);
        return 1;
    }
    printf("shmipc-serve worker %ld ready on %s\n", (long)getpid(), address);
    fflush(stdout);
    struct session_thread *threads = NULL;
    while (!stopping()) {
        shmipc_session *s;
        rc = shmipc_listener_accept(l, POLL_MS, &s);
        if (rc == SHMIPC_ETIMEDOUT || rc == SHMIPC_EAGAIN || rc == SHMIPC_EINTR)
            continue;
        if (rc < 0) {
            if (!stopping())
                fprintf(stderr, "shmipc-serve worker: accept: %s\n", shmipc_errname(rc));
            continue;
        }
        /* Reap the threads whose front went away. */
        for (struct session_thread **p = &threads; *p != NULL;) {
            struct session_thread *t = *p;
            if (__atomic_load_n(&t->done, __ATOMIC_ACQUIRE)) {
                pthread_join(t->t, NULL);
                *p = t->next;
                free(t);
            } else {
                p = &t->next;
            }
        }
        struct session_thread *t = calloc(1, sizeof *t);
        if (t != NULL) {
            t->w = &w;
            t->s = s;
        }
        if (t == NULL || pthread_create(&t->t, NULL, serve_session, t) != 0) {
            free(t);
            shmipc_session_close(s);
            continue;
        }
        t->next = threads;
        threads = t;
    }
    /* Closed first: a front that reconnects meanwhile is refused at once, rather than
     * waiting out its handshake timeout on a listener nobody accepts on. */
    shmipc_listener_close(l);
    while (threads != NULL) {
        struct session_thread *t = threads;
        pthread_join(t->t, NULL);
        threads = t->next;
        free(t);
    }
    shmipc__worker_lua_free(w.data);
    return 0;
}
