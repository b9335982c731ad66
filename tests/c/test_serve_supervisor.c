/*
 * Description: shmipc-serve's process supervisor (serve/supervisor.c, docs/serve.md
 * "Supervision") with real worker processes: /bin/sh scripts that print the ready line and
 * misbehave on purpose (crash, ignore SIGTERM, never get ready), and, when the Python module is
 * built, Python WSGI workers that this test talks to over shmipc with the public codec.
 * Every wait is bounded.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "shmipc_serve.h"
#include "supervisor.h"
#include "sup_int.h" /* shmipc__sup_write_all */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define MAXSET 16

struct harness {
    shmipc__sup *sup;
    pthread_t th;
    int rc;
    int running;
    pthread_mutex_t mu;
    unsigned nsets;
    size_t nset;
    char set[MAXSET][96];
    int events_fd; /* the ready sets are appended here as "SET n a b ..." lines */
    /* Reload watch: when the set first holds no address of generation old_gen, how many of
     * that generation's workers had been told to stop already (-1: not seen yet). */
    int watch;
    char old_prefix[96];
    int stopping_at_switch;
    char dir[64];
    char out_path[128], log_path[128];
    int out_fd, log_fd;
};

static uint64_t ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void on_ready(void *data, const char *const *addrs, size_t n)
{
    struct harness *h = data;
    pthread_mutex_lock(&h->mu);
    h->nsets++;
    h->nset = n < MAXSET ? n : MAXSET;
    for (size_t i = 0; i < h->nset; i++)
        snprintf(h->set[i], sizeof h->set[i], "%s", addrs[i]);
    if (h->watch && h->stopping_at_switch < 0 && n > 0) {
        int old = 0;
        for (size_t i = 0; i < n; i++)
            old += strncmp(addrs[i], h->old_prefix, strlen(h->old_prefix)) == 0;
        if (old == 0) {
            /* Called without the supervisor's lock: its state at this moment is visible. */
            shmipc__sup_worker_info w[16];
            size_t k = shmipc__sup_snapshot(h->sup, w, 16);
            h->stopping_at_switch = 0;
            for (size_t i = 0; i < k && i < 16; i++)
                h->stopping_at_switch +=
                    strncmp(w[i].address, h->old_prefix, strlen(h->old_prefix)) == 0 &&
                    w[i].state == SHMIPC__SUP_STOPPING;
        }
    }
    if (h->events_fd >= 0) {
        char line[2048];
        int len = snprintf(line, sizeof line, "SET %zu", n);
        for (size_t i = 0; i < n && len < 1800; i++)
            len += snprintf(line + len, sizeof line - (size_t)len, " %s", addrs[i]);
        line[len++] = '\n';
        assert_int_equal(write(h->events_fd, line, (size_t)len), len);
    }
    pthread_mutex_unlock(&h->mu);
}

static void *run_thread(void *arg)
{
    struct harness *h = arg;
    h->rc = shmipc__sup_run(h->sup);
    return NULL;
}

static void harness_init(struct harness *h)
{
    memset(h, 0, sizeof *h);
    pthread_mutex_init(&h->mu, NULL);
    h->events_fd = -1;
    snprintf(h->dir, sizeof h->dir, "/tmp/shmipc-sup-XXXXXX");
    assert_non_null(mkdtemp(h->dir));
    snprintf(h->out_path, sizeof h->out_path, "%s/out", h->dir);
    snprintf(h->log_path, sizeof h->log_path, "%s/log", h->dir);
    h->out_fd = open(h->out_path, O_CREAT | O_RDWR | O_APPEND | O_CLOEXEC, 0600);
    h->log_fd = open(h->log_path, O_CREAT | O_RDWR | O_APPEND | O_CLOEXEC, 0600);
    assert_true(h->out_fd >= 0 && h->log_fd >= 0);
}

/* The config every test starts from: the harness's output files and callback. */
static shmipc__sup_config base_config(struct harness *h, const char *const *argv, unsigned n)
{
    shmipc__sup_config c;
    memset(&c, 0, sizeof c);
    c.argv = argv;
    c.workers = n;
    c.out_fd = h->out_fd;
    c.log_fd = h->log_fd;
    c.on_ready_set = on_ready;
    c.data = h;
    c.graceful_timeout_ms = 5000;
    c.start_timeout_ms = 10000;
    return c;
}

static void harness_start(struct harness *h, const shmipc__sup_config *c)
{
    assert_int_equal(shmipc__sup_new(c, &h->sup), 0);
    assert_int_equal(pthread_create(&h->th, NULL, run_thread, h), 0);
    h->running = 1;
}

static void harness_join(struct harness *h)
{
    if (h->running) {
        assert_int_equal(pthread_join(h->th, NULL), 0);
        h->running = 0;
        assert_int_equal(h->rc, 0);
    }
}

static void harness_finish(struct harness *h)
{
    if (h->running) {
        shmipc__sup_stop(h->sup);
        harness_join(h);
    }
    shmipc__sup_free(h->sup);
    h->sup = NULL;
    close(h->out_fd);
    close(h->log_fd);
    if (h->events_fd >= 0)
        close(h->events_fd);
    DIR *d = opendir(h->dir);
    if (d != NULL) {
        struct dirent *e;
        char p[512];
        while ((e = readdir(d)) != NULL)
            if (e->d_name[0] != '.') {
                snprintf(p, sizeof p, "%s/%s", h->dir, e->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(h->dir);
    pthread_mutex_destroy(&h->mu);
}

/* The whole file (NUL-terminated; the caller frees). */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return strdup("");
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    size_t k;
    while ((k = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (cap - n < 2) {
            cap *= 2;
            b = realloc(b, cap);
        }
    }
    fclose(f);
    b[n] = '\0';
    return b;
}

static unsigned ready_count(struct harness *h, unsigned *nsets)
{
    pthread_mutex_lock(&h->mu);
    unsigned n = (unsigned)h->nset;
    if (nsets != NULL)
        *nsets = h->nsets;
    pthread_mutex_unlock(&h->mu);
    return n;
}

/* Waits until the ready set has n addresses; fails the test after timeout_ms. */
static void wait_ready(struct harness *h, unsigned n, unsigned timeout_ms)
{
    uint64_t end = ms_now() + timeout_ms;
    while (ready_count(h, NULL) != n) {
        if (ms_now() > end) {
            char *log = slurp(h->log_path);
            print_message("ready set %u, want %u; log:\n%s\n", ready_count(h, NULL), n, log);
            free(log);
            fail_msg("the workers were not ready in time");
        }
        sleep_ms(10);
    }
}

/* Snapshot of slot `index` of generation `gen`; 0 when there is none. */
static int slot_of(struct harness *h, unsigned gen, unsigned index, shmipc__sup_worker_info *out)
{
    shmipc__sup_worker_info w[64];
    size_t n = shmipc__sup_snapshot(h->sup, w, 64);
    for (size_t i = 0; i < n && i < 64; i++)
        if (w[i].generation == gen && w[i].index == index) {
            *out = w[i];
            return 1;
        }
    return 0;
}

static unsigned first_generation(struct harness *h)
{
    shmipc__sup_worker_info w[64];
    uint64_t end = ms_now() + 5000;
    size_t n;
    while ((n = shmipc__sup_snapshot(h->sup, w, 64)) == 0 && ms_now() < end)
        sleep_ms(5);
    assert_true(n > 0);
    return w[0].generation;
}

static int file_contains(const char *path, const char *needle)
{
    char *b = slurp(path);
    int r = strstr(b, needle) != NULL;
    free(b);
    return r;
}

static void wait_log(struct harness *h, const char *needle, unsigned timeout_ms)
{
    uint64_t end = ms_now() + timeout_ms;
    while (!file_contains(h->log_path, needle)) {
        if (ms_now() > end) {
            char *log = slurp(h->log_path);
            print_message("log:\n%s\n", log);
            free(log);
            fail_msg("'%s' not logged in time", needle);
        }
        sleep_ms(10);
    }
}

static int pid_gone(pid_t pid)
{
    return kill(pid, 0) != 0 && errno == ESRCH;
}

#define SH(script) ((const char *const[]){"/bin/sh", "-c", script, NULL})

/* A worker that prints its ready line and sleeps; TERM ends it (exec'd sleep). */
static const char *const sleeper_argv[] = {
    "/bin/sh", "-c", "echo \"w $$ ready on {address}\"; echo after-ready; exec sleep 30", NULL};

static const char *const *sleeper(void)
{
    return sleeper_argv;
}

/* ---- misuse ---------------------------------------------------------------------------- */

/* Creates the file at `path` (empty), as the shell's touch: a mark the workers' scripts test. */
static void touch_file(const char *path)
{
    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    close(fd);
}

static void test_misuse(void **state)
{
    (void)state;
    shmipc__sup *s = (shmipc__sup *)1;
    shmipc__sup_config c;
    memset(&c, 0, sizeof c);
    assert_int_equal(shmipc__sup_new(NULL, &s), SHMIPC_EINVAL);
    assert_null(s);
    c.workers = 1;
    assert_int_equal(shmipc__sup_new(&c, &s), SHMIPC_EINVAL); /* argv NULL */
    const char *const empty[] = {NULL};
    c.argv = empty;
    assert_int_equal(shmipc__sup_new(&c, &s), SHMIPC_EINVAL);
    const char *const blank[] = {"", NULL};
    c.argv = blank;
    assert_int_equal(shmipc__sup_new(&c, &s), SHMIPC_EINVAL);
    c.argv = sleeper();
    assert_int_equal(shmipc__sup_new(&c, NULL), SHMIPC_EINVAL);
    c.workers = 0;
    assert_int_equal(shmipc__sup_new(&c, &s), SHMIPC_EINVAL);
    c.workers = SHMIPC__SUP_MAX_WORKERS + 1;
    assert_int_equal(shmipc__sup_new(&c, &s), SHMIPC_EINVAL);
    c.workers = UINT32_MAX;
    assert_int_equal(shmipc__sup_new(&c, &s), SHMIPC_EINVAL);
    c.workers = 1;
    c.backoff_min_ms = 200;
    c.backoff_max_ms = 100;
    assert_int_equal(shmipc__sup_new(&c, &s), SHMIPC_EINVAL);
    c.backoff_min_ms = c.backoff_max_ms = 0;

    shmipc__sup_stop(NULL);
    shmipc__sup_reload(NULL);
    shmipc__sup_request_status(NULL);
    assert_int_equal(shmipc__sup_snapshot(NULL, NULL, 0), 0);
    assert_int_equal(shmipc__sup_status(NULL, 1), SHMIPC_EINVAL);
    assert_int_equal(shmipc__sup_run(NULL), SHMIPC_EINVAL);
    assert_int_equal(shmipc__sup_spawns(NULL), 0);
    shmipc__sup_free(NULL);
    assert_string_equal(shmipc__sup_state_name(0), "?");
    assert_string_equal(shmipc__sup_state_name(SHMIPC__SUP_READY), "ready");

    /* Stopped before it ran: run() starts nothing and returns; a second run() is refused. */
    struct harness h;
    harness_init(&h);
    c = base_config(&h, sleeper(), 3);
    assert_int_equal(shmipc__sup_new(&c, &h.sup), 0);
    assert_int_equal(shmipc__sup_status(h.sup, -1), SHMIPC_EINVAL);
    shmipc__sup_stop(h.sup);
    assert_int_equal(shmipc__sup_run(h.sup), 0);
    assert_int_equal(shmipc__sup_spawns(h.sup), 0);
    assert_int_equal(shmipc__sup_run(h.sup), SHMIPC_EINVAL);
    harness_finish(&h);

    /* Freed without running. */
    harness_init(&h);
    c = base_config(&h, sleeper(), 2);
    assert_int_equal(shmipc__sup_new(&c, &h.sup), 0);
    harness_finish(&h);
}

/* ---- start, ready, output -------------------------------------------------------------- */

static void test_workers_ready_with_unique_addresses(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    shmipc__sup_config c = base_config(&h, sleeper(), 3);
    harness_start(&h, &c);
    wait_ready(&h, 3, 10000);
    unsigned gen = first_generation(&h);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "unix:@shmipc-serve-%d-%u-", (int)getpid(), gen);
    pid_t pids[3];
    for (unsigned i = 0; i < 3; i++) {
        shmipc__sup_worker_info w = {0};
        assert_true(slot_of(&h, gen, i, &w));
        assert_int_equal(w.state, SHMIPC__SUP_READY);
        assert_true(w.pid > 0);
        assert_int_equal(w.restarts, 0);
        assert_int_equal(w.last_status, -1);
        /* PREFIX<index>-<16 hex digits>: an unguessable name per slot. */
        char want[96];
        snprintf(want, sizeof want, "%s%u-", prefix, i);
        assert_int_equal(strncmp(w.address, want, strlen(want)), 0);
        assert_int_equal(strlen(w.address), strlen(want) + 16);
        assert_int_equal(strspn(w.address + strlen(want), "0123456789abcdef"), 16);
        pids[i] = w.pid;
        pthread_mutex_lock(&h.mu);
        int found = 0;
        for (size_t k = 0; k < h.nset; k++)
            found += strcmp(h.set[k], w.address) == 0;
        pthread_mutex_unlock(&h.mu);
        assert_int_equal(found, 1);
        /* The worker's stdout is forwarded, the ready line and what follows it. */
        char line[160];
        snprintf(line, sizeof line, "w %d ready on %s\n", (int)w.pid, w.address);
        uint64_t end = ms_now() + 5000;
        while (!file_contains(h.out_path, line) && ms_now() < end)
            sleep_ms(10);
        assert_true(file_contains(h.out_path, line));
    }
    uint64_t end = ms_now() + 5000;
    while (ms_now() < end) {
        char *out = slurp(h.out_path);
        int n = 0;
        for (char *p = strstr(out, "after-ready"); p != NULL; p = strstr(p + 1, "after-ready"))
            n++;
        free(out);
        if (n == 3)
            break;
        sleep_ms(10);
    }
    assert_true(ms_now() <= end);
    assert_int_equal(shmipc__sup_spawns(h.sup), 3);
    shmipc__sup_stop(h.sup);
    harness_join(&h);
    /* All reaped; the last report was the empty set. */
    for (unsigned i = 0; i < 3; i++)
        assert_true(pid_gone(pids[i]));
    assert_int_equal(shmipc__sup_snapshot(h.sup, NULL, 0), 0);
    assert_int_equal(ready_count(&h, NULL), 0);
    harness_finish(&h);
}

/* Waits (10 s at most) until slot `index` of generation `gen` is ready with a pid other than
 * `old`; its info in *now. */
static void wait_replaced(struct harness *h, unsigned gen, unsigned index, pid_t old,
                          shmipc__sup_worker_info *now)
{
    uint64_t end = ms_now() + 10000;
    for (;;) {
        assert_true(slot_of(h, gen, index, now));
        if (now->state == SHMIPC__SUP_READY && now->pid != old)
            return;
        assert_true(ms_now() < end);
        sleep_ms(10);
    }
}

static void test_kill9_restarts_with_a_new_pid(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    shmipc__sup_config c = base_config(&h, sleeper(), 2);
    harness_start(&h, &c);
    wait_ready(&h, 2, 10000);
    unsigned gen = first_generation(&h);
    shmipc__sup_worker_info w0 = {0}, w1 = {0}, now = {0};
    assert_true(slot_of(&h, gen, 0, &w0));
    assert_true(slot_of(&h, gen, 1, &w1));
    unsigned sets_before;
    ready_count(&h, &sets_before);
    assert_int_equal(kill(w0.pid, SIGKILL), 0);
    wait_replaced(&h, gen, 0, w0.pid, &now);
    assert_int_equal(now.restarts, 1);
    assert_true(WIFSIGNALED(now.last_status) && WTERMSIG(now.last_status) == SIGKILL);
    assert_int_equal(now.last_delay_ms, 100); /* the first restart after a failure: 100 ms */
    /* Each start gets a name of its own: the slot's prefix, new random digits. The name the
     * dead worker had is known to every local user; one could hold it. */
    size_t plen = strlen(w0.address) - 16;
    assert_int_equal(strlen(now.address), strlen(w0.address));
    assert_int_equal(strncmp(now.address, w0.address, plen), 0);
    assert_string_not_equal(now.address, w0.address);
    assert_int_equal(strspn(now.address + plen, "0123456789abcdef"), 16);
    /* The other worker was not touched. */
    assert_true(slot_of(&h, gen, 1, &now));
    assert_int_equal(now.pid, w1.pid);
    assert_int_equal(now.restarts, 0);
    /* The set lost the worker, then got it back. */
    wait_ready(&h, 2, 5000);
    unsigned sets_after;
    ready_count(&h, &sets_after);
    assert_true(sets_after >= sets_before + 2);
    wait_log(&h, "died (signal 9)", 2000);
    /* Killed again at once: the delay doubles, as it never ran healthy for 10 s. */
    assert_true(slot_of(&h, gen, 0, &w0));
    assert_int_equal(kill(w0.pid, SIGKILL), 0);
    uint64_t end = ms_now() + 10000;
    for (;;) {
        assert_true(slot_of(&h, gen, 0, &now));
        if (now.restarts == 2)
            break;
        assert_true(ms_now() < end);
        sleep_ms(5);
    }
    assert_int_equal(now.last_delay_ms, 200);
    harness_finish(&h);
}

/*
 * shmipc__sup_kill_hung (the front found the worker hung): the worker at that address is
 * killed (SIGKILL) with a log line naming why, and its slot restarts as after a crash; the
 * other worker is not touched. An address no worker has (a restarted worker's old one, an
 * unknown one) is SHMIPC_ENOENT and kills nothing; NULL is SHMIPC_EINVAL.
 */
static void test_kill_hung_kills_and_restarts_that_worker(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    shmipc__sup_config c = base_config(&h, sleeper(), 2);
    harness_start(&h, &c);
    wait_ready(&h, 2, 10000);
    unsigned gen = first_generation(&h);
    shmipc__sup_worker_info w0 = {0}, w1 = {0}, now = {0};
    assert_true(slot_of(&h, gen, 0, &w0));
    assert_true(slot_of(&h, gen, 1, &w1));
    assert_int_equal(shmipc__sup_kill_hung(NULL, w0.address, "x"), SHMIPC_EINVAL);
    assert_int_equal(shmipc__sup_kill_hung(h.sup, NULL, "x"), SHMIPC_EINVAL);
    assert_int_equal(shmipc__sup_kill_hung(h.sup, "unix:@nobody-has-this", "x"), SHMIPC_ENOENT);
    assert_int_equal(shmipc__sup_kill_hung(h.sup, w0.address, "a test's reason"), 0);
    wait_replaced(&h, gen, 0, w0.pid, &now);
    assert_int_equal(now.restarts, 1);
    assert_true(WIFSIGNALED(now.last_status) && WTERMSIG(now.last_status) == SIGKILL);
    wait_log(&h, "is hung (a test's reason): killed", 2000);
    /* The old address is nobody's now: nothing more is killed. */
    assert_int_equal(shmipc__sup_kill_hung(h.sup, w0.address, "x"), SHMIPC_ENOENT);
    assert_true(slot_of(&h, gen, 1, &now));
    assert_int_equal(now.pid, w1.pid);
    assert_int_equal(now.restarts, 0);
    harness_finish(&h);
}

/* ---- back-off and crash loops ---------------------------------------------------------- */

static void test_crash_loop_backs_off(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    shmipc__sup_config c = base_config(&h, SH("echo boom >&2; exit 3"), 2);
    harness_start(&h, &c);
    unsigned gen = first_generation(&h);
    sleep_ms(2500);
    shmipc__sup_worker_info w[2];
    for (unsigned i = 0; i < 2; i++) {
        assert_true(slot_of(&h, gen, i, &w[i]));
        /* Spawns at 0, 0.1, 0.3, 0.7, 1.5 s (+ the shell's run time each): 4 restarts in
         * 2.5 s, never the hundreds an unbounded loop would make. */
        assert_in_range(w[i].restarts, 2, 5);
        assert_true(WIFEXITED(w[i].last_status) && WEXITSTATUS(w[i].last_status) == 3);
        /* Each delay doubled the last: 100, 200, 400, 800. */
        assert_int_equal(w[i].last_delay_ms, 100u << (w[i].restarts - 1));
    }
    assert_in_range(shmipc__sup_spawns(h.sup), 6, 12);
    unsigned nsets;
    assert_int_equal(ready_count(&h, &nsets), 0);
    assert_int_equal(nsets, 0); /* never ready: never reported */
    wait_log(&h, "failed to start (exit 3)", 1000);
    harness_finish(&h);
}

/*
 * Regression (end_on_boot_failure, shmipc-serve's): a worker that could not load its app at the
 * start was restarted with back-off for good. Worker 0 fails to boot; worker 1, starting, ignores
 * SIGTERM: the run ends with SHMIPC__SUP_BOOT_FAILED, worker 1 killed 0.5 s after its SIGTERM
 * (not the 5 s graceful timeout: none was ever ready, nothing is in flight), none left.
 */
static void test_boot_failure_ends_the_run(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    /* The address ends in -INDEX-HEX: worker 0 fails once worker 1 ignores SIGTERM (else the
     * SIGTERM could come before its trap, and nobody would be killed), and worker 1 hangs. */
    char script[1024];
    snprintf(script, sizeof script,
             "a={address}; a=${a%%-*}; if [ \"${a##*-}\" = 0 ]; then i=0; "
             "while [ ! -e %s/trapped ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done; "
             "echo 'cannot load app' >&2; exit 2; else trap '' TERM; touch %s/trapped; "
             "exec sleep 30; fi",
             h.dir, h.dir);
    shmipc__sup_config c = base_config(&h, SH(script), 2);
    c.end_on_boot_failure = 1;
    harness_start(&h, &c);
    char trapped[300];
    snprintf(trapped, sizeof trapped, "%s/trapped", h.dir);
    uint64_t t0 = ms_now();
    while (access(trapped, F_OK) != 0 && ms_now() - t0 < 10000)
        sleep_ms(5);
    t0 = ms_now(); /* worker 0 fails about now: the run ends within the 0.5 s, not 5 s */
    assert_int_equal(pthread_join(h.th, NULL), 0);
    h.running = 0;
    assert_int_equal(h.rc, SHMIPC__SUP_BOOT_FAILED);
    assert_true(ms_now() - t0 < 4000);
    assert_int_equal(waitpid(-1, NULL, WNOHANG), -1); /* every worker reaped */
    assert_int_equal(errno, ECHILD);
    assert_true(file_contains(h.log_path, "worker 0 (generation"));
    assert_true(file_contains(h.log_path, "failed to boot (exit 2) and no worker was ever ready"));
    /* The worker that ignores SIGTERM is killed after the 0.5 s a failed boot gives, and the
     * line says so (it said the graceful timeout's 5.0 s). */
    assert_true(file_contains(h.log_path, "still running 0.5 s after SIGTERM: killed"));
    unsigned nsets;
    assert_int_equal(ready_count(&h, &nsets), 0);
    harness_finish(&h);
}

/* An exec that fails at the start is a failed boot too (no such interpreter). */
static void test_boot_failure_of_a_spawn_ends_the_run(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    shmipc__sup_config c =
        base_config(&h, (const char *const[]){"/nonexistent/shmipc-worker", NULL}, 2);
    c.end_on_boot_failure = 1;
    harness_start(&h, &c);
    assert_int_equal(pthread_join(h.th, NULL), 0);
    h.running = 0;
    assert_int_equal(h.rc, SHMIPC__SUP_BOOT_FAILED);
    assert_true(file_contains(h.log_path, "failed to boot (it could not be started)"));
    harness_finish(&h);
}

/* Once a worker was ready, a worker that dies (before or after its own ready line) is restarted
 * with back-off, end_on_boot_failure or not. */
static void test_boot_failure_only_before_any_ready(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    shmipc__sup_config c = base_config(
        &h,
        SH("a={address}; a=${a%-*}; if [ \"${a##*-}\" = 0 ]; then echo \"ready on {address}\"; "
           "exec sleep 30; else sleep 1; exit 2; fi"),
        2);
    c.end_on_boot_failure = 1;
    c.backoff_min_ms = 10;
    harness_start(&h, &c);
    wait_ready(&h, 1, 10000);
    unsigned gen = first_generation(&h);
    shmipc__sup_worker_info w = {0};
    uint64_t end = ms_now() + 10000;
    do {
        assert_true(ms_now() < end);
        sleep_ms(20);
        assert_true(slot_of(&h, gen, 1, &w));
    } while (w.restarts < 1);
    assert_true(slot_of(&h, gen, 0, &w));
    assert_int_equal(w.state, SHMIPC__SUP_READY);
    assert_false(file_contains(h.log_path, "failed to boot ("));
    harness_finish(&h); /* the run still ran: stopped with rc 0 */
}

static void test_crash_loop_delay_caps_at_max(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    shmipc__sup_config c = base_config(&h, SH("exit 1"), 1);
    c.backoff_min_ms = 20;
    c.backoff_max_ms = 60;
    harness_start(&h, &c);
    unsigned gen = first_generation(&h);
    shmipc__sup_worker_info w = {0};
    uint64_t end = ms_now() + 10000;
    do {
        assert_true(ms_now() < end);
        sleep_ms(20);
        assert_true(slot_of(&h, gen, 0, &w));
    } while (w.restarts < 5);
    assert_int_equal(w.last_delay_ms, 60); /* 20, 40, 60, 60, ... */
    harness_finish(&h);
}

/* A worker that is ready, then dies after 0.3 s; with healthy_ms the delays after 3 deaths. */
static uint32_t delay_after_three_deaths(uint32_t healthy_ms)
{
    struct harness h;
    harness_init(&h);
    shmipc__sup_config c =
        base_config(&h, SH("echo \"w ready on {address}\"; sleep 0.3; exit 1"), 1);
    c.healthy_ms = healthy_ms;
    harness_start(&h, &c);
    unsigned gen = first_generation(&h);
    shmipc__sup_worker_info w = {0};
    uint64_t end = ms_now() + 15000;
    do {
        assert_true(ms_now() < end);
        sleep_ms(5);
        assert_true(slot_of(&h, gen, 0, &w));
    } while (w.restarts < 3);
    harness_finish(&h);
    return w.last_delay_ms;
}

static void test_backoff_resets_after_a_healthy_run(void **state)
{
    (void)state;
    /* Ready for 0.3 s counts as healthy with healthy_ms 100: each death restarts after the
     * first delay again. With 10 s it does not: the delay doubles. */
    assert_int_equal(delay_after_three_deaths(100), 100);
    assert_int_equal(delay_after_three_deaths(10000), 400);
}

static void test_spawn_rate_is_capped(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    /* A back-off of 1 ms would respawn ~hundreds of times a second; the cap holds it. */
    shmipc__sup_config c = base_config(&h, SH("exit 1"), 2);
    c.backoff_min_ms = 1;
    c.backoff_max_ms = 1;
    c.max_spawns_per_sec = 4;
    harness_start(&h, &c);
    sleep_ms(1500);
    uint64_t spawns = shmipc__sup_spawns(h.sup);
    /* At most 4 in any second: 0..1 s and 1..1.5 s. */
    assert_in_range(spawns, 4, 8);
    wait_log(&h, "restarts are held back", 1000);
    harness_finish(&h);
}

static void test_spawn_failure_backs_off(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    shmipc__sup_config c =
        base_config(&h, (const char *const[]){"/nonexistent/shmipc-worker", NULL}, 1);
    c.backoff_min_ms = 10;
    c.backoff_max_ms = 40;
    harness_start(&h, &c);
    unsigned gen = first_generation(&h);
    wait_log(&h, "cannot start /nonexistent/shmipc-worker", 5000);
    shmipc__sup_worker_info w = {0};
    uint64_t end = ms_now() + 5000;
    do {
        assert_true(ms_now() < end);
        sleep_ms(10);
        assert_true(slot_of(&h, gen, 0, &w));
    } while (w.restarts < 3);
    assert_true(WIFEXITED(w.last_status) && WEXITSTATUS(w.last_status) == 127);
    harness_finish(&h);
}

static void test_start_timeout_kills_a_silent_worker(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    /* It prints a ready line for another address (not its own), then nothing. */
    shmipc__sup_config c =
        base_config(&h, SH("echo \"w ready on unix:@someone-else\"; exec sleep 30"), 1);
    c.start_timeout_ms = 300;
    harness_start(&h, &c);
    unsigned gen = first_generation(&h);
    wait_log(&h, "not ready within 0.3 s: killed", 5000);
    shmipc__sup_worker_info w = {0};
    uint64_t end = ms_now() + 5000;
    do {
        assert_true(ms_now() < end);
        sleep_ms(10);
        assert_true(slot_of(&h, gen, 0, &w));
    } while (w.restarts < 1);
    assert_true(WIFSIGNALED(w.last_status) && WTERMSIG(w.last_status) == SIGKILL);
    unsigned nsets;
    ready_count(&h, &nsets);
    assert_int_equal(nsets, 0);
    harness_finish(&h);
}

static void test_long_output_line_then_ready(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    /* 5000 bytes without a newline overflow the line buffer; the ready line after still
     * counts, and every byte is forwarded. */
    shmipc__sup_config c = base_config(&h,
                                       SH("head -c 5000 /dev/zero | tr '\\0' x; echo; echo \"w "
                                          "ready on {address}\"; exec sleep 30"),
                                       1);
    harness_start(&h, &c);
    wait_ready(&h, 1, 10000);
    char *out = slurp(h.out_path);
    char *x = strchr(out, 'x');
    assert_non_null(x);
    assert_true(strspn(x, "x") == 5000);
    free(out);
    harness_finish(&h);
}

/* Waits until the output file holds `n` newlines (a worker's lines all forwarded). */
static void wait_out_lines(struct harness *h, unsigned n, unsigned timeout_ms)
{
    uint64_t end = ms_now() + timeout_ms;
    for (;;) {
        char *out = slurp(h->out_path);
        unsigned k = 0;
        for (const char *p = out; (p = strchr(p, '\n')) != NULL; p++)
            k++;
        free(out);
        if (k >= n)
            return;
        if (ms_now() > end)
            fail_msg("%u of %u output lines in time", k, n);
        sleep_ms(10);
    }
}

/* One line of two_writers: "ADDRESS:0 ADDRESS:1 ... ADDRESS:9 end", in ten pieces 10 ms apart. */
#define PIECES_LINE                                                                                \
    "for p in 0 1 2 3 4 5 6 7 8 9; do printf '%s:%s ' {address} $p; sleep 0.01; done; echo end; "

/*
 * Two workers write 8 lines each (4 on stdout, 4 on stderr, both forwarded to one file) in
 * small pieces with pauses, at the same time: the output holds only whole lines, each of one
 * worker (the supervisor forwards whole lines, not the
 * pieces as they come, which interleaved the two workers' pieces within lines).
 */
static void test_output_whole_lines_of_two_workers(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    shmipc__sup_config c =
        base_config(&h,
                    SH("echo \"w ready on {address}\"; for l in 1 2 3 4; do " PIECES_LINE
                       "done; for l in 5 6 7 8; do " PIECES_LINE "done >&2; exec sleep 30"),
                    2);
    c.err_fd = h.out_fd; /* stderr's lines too, into the same file */
    harness_start(&h, &c);
    wait_ready(&h, 2, 10000);
    wait_out_lines(&h, 2 + 16, 30000);
    char *out = slurp(h.out_path);
    unsigned lines = 0, ready = 0;
    for (char *line = out, *nl; (nl = strchr(line, '\n')) != NULL; line = nl + 1) {
        *nl = '\0';
        lines++;
        if (strstr(line, " ready on ") != NULL) {
            ready++;
            continue;
        }
        char want[1024], addr[128];
        const char *colon = strchr(line, ':');
        colon = colon != NULL ? strchr(colon + 1, ':') : NULL; /* "unix:@...:0" */
        assert_non_null(colon);
        snprintf(addr, sizeof addr, "%.*s", (int)(colon - line), line);
        size_t n = 0;
        for (int p = 0; p < 10; p++)
            n += (size_t)snprintf(want + n, sizeof want - n, "%s:%d ", addr, p);
        snprintf(want + n, sizeof want - n, "end");
        if (strcmp(line, want) != 0)
            fail_msg("a mixed or broken line: '%s'", line);
    }
    assert_int_equal(ready, 2);
    assert_int_equal(lines, 18);
    free(out);
    harness_finish(&h);
}

/*
 * A line longer than the bound (20000 bytes in pieces): its first SHMIPC__SUP_LINE_MAX bytes
 * are forwarded with the cut marker, the rest as a line of its own; then the next line whole.
 */
static void test_output_line_over_the_bound_is_cut(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    shmipc__sup_config c = base_config(
        &h,
        SH("echo \"w ready on {address}\"; for i in 1 2 3 4 5; do head -c 4000 /dev/zero | "
           "tr '\\0' x; sleep 0.01; done; echo; echo next; head -c 16384 /dev/zero | tr '\\0' y; "
           "sleep 0.01; echo; echo after; exec sleep 30"),
        1);
    harness_start(&h, &c);
    wait_ready(&h, 1, 10000);
    wait_out_lines(&h, 3, 30000); /* with the old code: the ready line, the x's, "next" */
    uint64_t end = ms_now() + 30000;
    while (!file_contains(h.out_path, "next\n") && ms_now() < end)
        sleep_ms(10);
    char *out = slurp(h.out_path);
    char *x = strchr(out, '\n');
    assert_non_null(x);
    x++;
    size_t first = strspn(x, "x");
    assert_int_equal(first, SHMIPC__SUP_LINE_MAX);
    assert_memory_equal(x + first, SHMIPC__SUP_CUT_MARK "\n", strlen(SHMIPC__SUP_CUT_MARK) + 1);
    x += first + strlen(SHMIPC__SUP_CUT_MARK) + 1;
    size_t rest = strspn(x, "x");
    assert_int_equal(rest, 20000 - SHMIPC__SUP_LINE_MAX);
    assert_memory_equal(x + rest, "\nnext\n", 6);
    /* a line of exactly the bound, its newline in a later read: cut, and no empty line */
    while (!file_contains(h.out_path, "after\n") && ms_now() < end)
        sleep_ms(10);
    free(out);
    out = slurp(h.out_path);
    x = strstr(out, "\nyy"); /* not the "y" of "ready" */
    assert_non_null(x);
    x++;
    assert_int_equal(strspn(x, "y"), SHMIPC__SUP_LINE_MAX);
    assert_string_equal(x + SHMIPC__SUP_LINE_MAX, SHMIPC__SUP_CUT_MARK "\nafter\n");
    free(out);
    harness_finish(&h);
}

/* A worker's last line without a newline is forwarded when it exits, ended by a newline: the
 * next instance's ready line does not join it. */
static void test_output_last_line_without_newline(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    char script[512];
    snprintf(script, sizeof script,
             "echo \"w ready on {address}\"; if [ -e %s/once ]; then exec sleep 30; fi; "
             "touch %s/once; printf 'last words'; sleep 0.05; printf ' here'; exit 3",
             h.dir, h.dir);
    shmipc__sup_config c = base_config(&h, SH(script), 1);
    harness_start(&h, &c);
    wait_log(&h, "died", 10000);
    wait_out_lines(&h, 3, 30000); /* ready, the last words, the second instance's ready */
    char *out = slurp(h.out_path);
    assert_non_null(strstr(out, "\nlast words here\nw ready on "));
    free(out);
    harness_finish(&h);
}

static void test_address_substitution(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    /* Every "{address}" of every argument is replaced, a partial token is not; argv[0] is
     * looked up in PATH. */
    const char *const argv[] = {"sh",
                                "-c",
                                "echo \"$1 $2 ready on {address}\"; exec sleep 30",
                                "{address}",
                                "x{address}y{address}{addr",
                                "{}",
                                NULL};
    shmipc__sup_config c = base_config(&h, argv, 1);
    harness_start(&h, &c);
    wait_ready(&h, 1, 10000);
    unsigned gen = first_generation(&h);
    shmipc__sup_worker_info w = {0};
    assert_true(slot_of(&h, gen, 0, &w));
    char want[400];
    snprintf(want, sizeof want, "x%sy%s{addr {} ready on %s\n", w.address, w.address, w.address);
    uint64_t end = ms_now() + 5000;
    while (!file_contains(h.out_path, want) && ms_now() < end)
        sleep_ms(10);
    assert_true(file_contains(h.out_path, want));
    harness_finish(&h);
}

static void test_address_in_whole_arguments_only(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    /* address_whole_args (shmipc-serve's): only an argument that is the token gets the
     * address; the others (an APP, a path, this script) keep their "{address}" text. */
    const char *const argv[] = {
        "sh",        "-c",          "echo \"$1 {address} ready on $0\"; exec sleep 30",
        "{address}", "x{address}y", NULL};
    shmipc__sup_config c = base_config(&h, argv, 1);
    c.address_whole_args = 1;
    harness_start(&h, &c);
    wait_ready(&h, 1, 10000);
    unsigned gen = first_generation(&h);
    shmipc__sup_worker_info w = {0};
    assert_true(slot_of(&h, gen, 0, &w));
    char want[400];
    snprintf(want, sizeof want, "x{address}y {address} ready on %s\n", w.address);
    uint64_t end = ms_now() + 5000;
    while (!file_contains(h.out_path, want) && ms_now() < end)
        sleep_ms(10);
    assert_true(file_contains(h.out_path, want));
    harness_finish(&h);
}

static void test_clean_exit_restarts_at_once(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    /* As a worker does after --max-requests: ready, then exit 0. */
    shmipc__sup_config c =
        base_config(&h, SH("echo \"w ready on {address}\"; sleep 0.2; exit 0"), 1);
    harness_start(&h, &c);
    unsigned gen = first_generation(&h);
    shmipc__sup_worker_info w = {0};
    uint64_t end = ms_now() + 10000;
    do {
        assert_true(ms_now() < end);
        sleep_ms(10);
        assert_true(slot_of(&h, gen, 0, &w));
    } while (w.restarts < 3);
    assert_int_equal(w.last_delay_ms, 0);
    assert_true(WIFEXITED(w.last_status) && WEXITSTATUS(w.last_status) == 0);
    wait_log(&h, "exited (exit 0)", 1000);
    harness_finish(&h);
}

static void test_instant_clean_exits_are_capped_too(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    /* Ready, then exit 0 at once: each exit restarts without delay, and only the spawn cap
     * (2 x 1 + 4 a second by default) keeps it from spinning. */
    shmipc__sup_config c = base_config(&h, SH("echo \"w ready on {address}\"; exit 0"), 1);
    harness_start(&h, &c);
    sleep_ms(1500);
    assert_in_range(shmipc__sup_spawns(h.sup), 3, 12);
    wait_log(&h, "restarts are held back", 2000);
    harness_finish(&h);
}

static void test_many_workers(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    enum { N = 32 };
    shmipc__sup_config c = base_config(&h, sleeper(), N);
    c.max_spawns_per_sec = 1000;
    harness_start(&h, &c);
    wait_ready(&h, MAXSET, 30000); /* the harness keeps the first 16 of the set */
    unsigned gen = first_generation(&h);
    shmipc__sup_worker_info w[N + 8];
    uint64_t end = ms_now() + 30000;
    for (;;) {
        size_t n = shmipc__sup_snapshot(h.sup, w, N + 8);
        size_t ready = 0;
        for (size_t i = 0; i < n; i++)
            ready += w[i].state == SHMIPC__SUP_READY;
        if (n == N && ready == N)
            break;
        assert_true(ms_now() < end);
        sleep_ms(10);
    }
    /* Half of them killed at once: all come back, each with a new pid and one restart. */
    pid_t old[N];
    for (unsigned i = 0; i < N; i++) {
        old[i] = w[i].pid;
        if (i % 2 == 0)
            assert_int_equal(kill(w[i].pid, SIGKILL), 0);
    }
    end = ms_now() + 30000;
    for (;;) {
        size_t n = shmipc__sup_snapshot(h.sup, w, N + 8);
        size_t back = 0;
        for (size_t i = 0; i < n; i++)
            back += w[i].state == SHMIPC__SUP_READY && w[i].generation == gen &&
                    (w[i].index % 2 == 0 ? w[i].pid != old[w[i].index] && w[i].restarts == 1
                                         : w[i].pid == old[w[i].index] && w[i].restarts == 0);
        if (n == N && back == N)
            break;
        assert_true(ms_now() < end);
        sleep_ms(10);
    }
    shmipc__sup_stop(h.sup);
    harness_join(&h);
    for (unsigned i = 0; i < N; i++)
        assert_true(pid_gone(w[i].pid));
    harness_finish(&h);
}

/* ---- reload ---------------------------------------------------------------------------- */

static void test_reload_new_ready_before_old_term(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    char ev[160], script[512];
    snprintf(ev, sizeof ev, "%s/events", h.dir);
    h.events_fd = open(ev, O_CREAT | O_WRONLY | O_APPEND | O_CLOEXEC, 0600);
    assert_true(h.events_fd >= 0);
    /* Each worker logs its ready and its SIGTERM into the same file as the ready sets. */
    snprintf(script, sizeof script,
             "trap 'echo \"TERM {address}\" >> %s; exit 0' TERM; sleep 0.1; "
             "echo \"READY {address}\" >> %s; echo \"w ready on {address}\"; "
             "while :; do sleep 0.05; done",
             ev, ev);
    shmipc__sup_config c = base_config(&h, SH(script), 2);
    harness_start(&h, &c);
    wait_ready(&h, 2, 10000);
    unsigned g0 = first_generation(&h);
    shmipc__sup_worker_info old0, old1;
    assert_true(slot_of(&h, g0, 0, &old0));
    assert_true(slot_of(&h, g0, 1, &old1));
    pthread_mutex_lock(&h.mu);
    snprintf(h.old_prefix, sizeof h.old_prefix, "unix:@shmipc-serve-%d-%u-", (int)getpid(), g0);
    h.stopping_at_switch = -1;
    h.watch = 1;
    pthread_mutex_unlock(&h.mu);
    shmipc__sup_reload(h.sup);
    /* Until the old ones are gone and two new ones serve. */
    uint64_t end = ms_now() + 15000;
    shmipc__sup_worker_info w[8];
    size_t n;
    for (;;) {
        n = shmipc__sup_snapshot(h.sup, w, 8);
        if (n == 2 && w[0].generation != g0 && w[1].generation != g0 &&
            w[0].state == SHMIPC__SUP_READY && w[1].state == SHMIPC__SUP_READY &&
            pid_gone(old0.pid) && pid_gone(old1.pid) && file_contains(ev, "TERM") &&
            ready_count(&h, NULL) == 2)
            break;
        assert_true(ms_now() < end);
        sleep_ms(10);
    }
    unsigned g1 = w[0].generation;
    assert_int_equal(w[1].generation, g1);
    /* Give the old ones' traps time to write both TERM lines. */
    end = ms_now() + 5000;
    for (;;) {
        char *e = slurp(ev);
        int terms = 0;
        for (char *p = strstr(e, "TERM"); p != NULL; p = strstr(p + 1, "TERM"))
            terms++;
        free(e);
        if (terms == 2)
            break;
        assert_true(ms_now() < end);
        sleep_ms(10);
    }
    char *e = slurp(ev);
    char a[2][160], set_new[400];
    for (unsigned i = 0; i < 2; i++)
        snprintf(a[i], sizeof a[i], "READY %s\n", w[i].address);
    snprintf(set_new, sizeof set_new, "SET 2 %s %s\n", w[0].address, w[1].address);
    char *term = strstr(e, "TERM ");
    char *r0 = strstr(e, a[0]), *r1 = strstr(e, a[1]), *s2 = strstr(e, set_new);
    if (term == NULL || r0 == NULL || r1 == NULL || s2 == NULL || r0 > term || r1 > term ||
        s2 > term)
        print_message("events:\n%s\n", e);
    assert_non_null(term);
    /* When the set became the new generation alone, no old worker had been told to stop. */
    pthread_mutex_lock(&h.mu);
    assert_int_equal(h.stopping_at_switch, 0);
    pthread_mutex_unlock(&h.mu);
    /* The new workers were ready, and the set was the new one alone, before the first TERM. */
    assert_true(r0 != NULL && r0 < term);
    assert_true(r1 != NULL && r1 < term);
    assert_true(s2 != NULL && s2 < term);
    /* While the new ones came up, old and new served together (a set of more than 2). */
    assert_true(strstr(e, "SET 3 ") != NULL || strstr(e, "SET 4 ") != NULL);
    /* Only the old generation got SIGTERM. */
    char t_old[2][160];
    snprintf(t_old[0], sizeof t_old[0], "TERM %s\n", old0.address);
    snprintf(t_old[1], sizeof t_old[1], "TERM %s\n", old1.address);
    assert_non_null(strstr(e, t_old[0]));
    assert_non_null(strstr(e, t_old[1]));
    free(e);
    wait_log(&h, "reload: generation", 1000);
    harness_finish(&h);
}

/* The generation the last "reload: starting generation G" line of the log named (waits up to
 * 5 s for `count` such lines). */
static unsigned reload_generation(struct harness *h, unsigned count)
{
    static const char key[] = "reload: starting generation ";
    uint64_t end = ms_now() + 5000;
    for (;;) {
        char *log = slurp(h->log_path);
        unsigned n = 0, gen = 0;
        for (char *p = strstr(log, key); p != NULL; p = strstr(p + 1, key)) {
            n++;
            gen = (unsigned)strtoul(p + sizeof key - 1, NULL, 10);
        }
        if (n >= count) {
            free(log);
            return gen;
        }
        if (ms_now() > end) {
            print_message("log:\n%s\n", log);
            free(log);
            fail_msg("%u reloads not logged in time", count);
        }
        free(log);
        sleep_ms(10);
    }
}

/* Waits until the supervisor holds exactly the slots of generation `gen` (n of them, all ready,
 * each with the pid pids[i] when pids is not NULL). */
static void wait_only_generation(struct harness *h, unsigned gen, unsigned n, const pid_t *pids,
                                 unsigned timeout_ms)
{
    uint64_t end = ms_now() + timeout_ms;
    for (;;) {
        shmipc__sup_worker_info w[16];
        size_t k = shmipc__sup_snapshot(h->sup, w, 16);
        int ok = k == n;
        for (size_t i = 0; ok && i < k; i++)
            ok = w[i].generation == gen && w[i].state == SHMIPC__SUP_READY &&
                 (pids == NULL || w[i].pid == pids[w[i].index]);
        if (ok)
            return;
        if (ms_now() > end) {
            char *log = slurp(h->log_path);
            print_message("%zu slots; log:\n%s\n", k, log);
            free(log);
            fail_msg("not only generation %u's %u workers in time", gen, n);
        }
        sleep_ms(10);
    }
}

/*
 * Regression: a reload to a broken app (every new worker exits before its ready line) was
 * retried with back-off for good, beside the old generation. As nginx on a HUP with a bad
 * configuration, the reload is now given up once every worker of the new generation failed to
 * boot and none was ready: one line says so, the new generation's slots are gone (nothing left
 * to respawn), the old workers serve on with their pids, and are supervised as before (one
 * killed is restarted); a later reload, the app fixed, completes.
 */
static void test_reload_to_a_broken_generation_is_given_up(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    char flag[160], script[512];
    snprintf(flag, sizeof flag, "%s/broken", h.dir);
    snprintf(script, sizeof script,
             "[ -e %s ] && { echo 'cannot load app' >&2; exit 4; }; echo \"w ready on {address}\"; "
             "exec sleep 30",
             flag);
    shmipc__sup_config c = base_config(&h, SH(script), 2);
    c.backoff_min_ms = 20;
    c.backoff_max_ms = 100;
    harness_start(&h, &c);
    wait_ready(&h, 2, 10000);
    unsigned g0 = first_generation(&h);
    shmipc__sup_worker_info o0, o1;
    assert_true(slot_of(&h, g0, 0, &o0));
    assert_true(slot_of(&h, g0, 1, &o1));
    pid_t old[2] = {o0.pid, o1.pid};
    touch_file(flag);
    unsigned sets_before;
    ready_count(&h, &sets_before);
    shmipc__sup_reload(h.sup);
    unsigned g1 = reload_generation(&h, 1);
    char line[160];
    snprintf(line, sizeof line, "reload: generation %u failed to boot: all 2 of its workers", g1);
    wait_log(&h, line, 10000);
    wait_log(&h, "exit 4); the reload is given up: generation", 100);
    /* As if no reload had happened: the old workers, their pids, the set never changed. */
    wait_only_generation(&h, g0, 2, old, 5000);
    unsigned sets_now;
    assert_int_equal(ready_count(&h, &sets_now), 2);
    assert_int_equal(sets_now, sets_before);
    uint64_t spawns = shmipc__sup_spawns(h.sup);
    /* The old generation keeps its supervision: killed, worker 0 is restarted in it (the app
     * fixed first: a restart loads what is on disk), and that is the only spawn since. */
    unlink(flag);
    assert_int_equal(kill(o0.pid, SIGKILL), 0);
    shmipc__sup_worker_info w = {0};
    uint64_t end = ms_now() + 10000;
    for (;;) {
        assert_true(slot_of(&h, g0, 0, &w));
        if (w.state == SHMIPC__SUP_READY && w.pid != o0.pid)
            break;
        assert_true(ms_now() < end);
        sleep_ms(10);
    }
    assert_int_equal(w.restarts, 1);
    assert_int_equal(shmipc__sup_spawns(h.sup), spawns + 1);
    assert_int_equal(shmipc__sup_snapshot(h.sup, NULL, 0), 2);
    /* A later reload tries again, and completes. */
    shmipc__sup_reload(h.sup);
    unsigned g2 = reload_generation(&h, 2);
    assert_true(g2 != g1 && g2 != g0);
    wait_only_generation(&h, g2, 2, NULL, 10000);
    end = ms_now() + 10000;
    while (!pid_gone(w.pid) || !pid_gone(o1.pid)) {
        assert_true(ms_now() < end);
        sleep_ms(10);
    }
    wait_log(&h, "reload: generation", 100);
    assert_int_equal(ready_count(&h, NULL), 2);
    harness_finish(&h);
}

/* A reload whose workers cannot even be spawned (the program is gone) is given up the same
 * way, and one whose workers are not ready within the start timeout (killed) too. */
static void test_reload_that_cannot_spawn_or_times_out_is_given_up(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    char prog[160], flag[160];
    snprintf(prog, sizeof prog, "%s/worker.sh", h.dir);
    snprintf(flag, sizeof flag, "%s/silent", h.dir);
    FILE *f = fopen(prog, "w");
    assert_non_null(f);
    fprintf(f, "#!/bin/sh\n[ -e %s ] && exec sleep 30\necho \"w ready on $1\"\nexec sleep 30\n",
            flag);
    fclose(f);
    assert_int_equal(chmod(prog, 0700), 0);
    shmipc__sup_config c = base_config(&h, (const char *const[]){prog, "{address}", NULL}, 2);
    c.backoff_min_ms = 20;
    c.backoff_max_ms = 100;
    c.start_timeout_ms = 1000;
    harness_start(&h, &c);
    wait_ready(&h, 2, 10000);
    unsigned g0 = first_generation(&h);
    shmipc__sup_worker_info o0, o1;
    assert_true(slot_of(&h, g0, 0, &o0));
    assert_true(slot_of(&h, g0, 1, &o1));
    pid_t old[2] = {o0.pid, o1.pid};
    /* Not ready within the start timeout: killed, a failed boot. */
    touch_file(flag);
    shmipc__sup_reload(h.sup);
    unsigned g1 = reload_generation(&h, 1);
    char line[160];
    snprintf(line, sizeof line, "reload: generation %u failed to boot: all 2 of its workers", g1);
    wait_log(&h, line, 15000);
    wait_log(&h, "signal 9); the reload is given up", 100);
    wait_only_generation(&h, g0, 2, old, 5000);
    /* Cannot be spawned. */
    unlink(flag);
    assert_int_equal(unlink(prog), 0);
    shmipc__sup_reload(h.sup);
    unsigned g2 = reload_generation(&h, 2);
    snprintf(line, sizeof line, "reload: generation %u failed to boot: all 2 of its workers", g2);
    wait_log(&h, line, 10000);
    wait_log(&h, "it could not be started); the reload is given up", 100);
    wait_only_generation(&h, g0, 2, old, 5000);
    harness_finish(&h);
}

/* Not broken: a reload where one new worker gets ready and another keeps failing follows the
 * restart policy (the failing one restarted with back-off, old and new serving together) and
 * completes once it comes up. The rule is "every new worker failed before any was ready". */
static void test_reload_with_a_ready_new_worker_is_not_given_up(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    char flag[160], script[512];
    snprintf(flag, sizeof flag, "%s/broken1", h.dir);
    /* The address ends in -INDEX-HEX: worker 1 fails while the flag exists. */
    snprintf(script, sizeof script,
             "a={address}; a=${a%%-*}; [ -e %s ] && [ \"${a##*-}\" = 1 ] && exit 4; "
             "echo \"w ready on {address}\"; exec sleep 30",
             flag);
    shmipc__sup_config c = base_config(&h, SH(script), 2);
    c.backoff_min_ms = 20;
    c.backoff_max_ms = 40;
    harness_start(&h, &c);
    wait_ready(&h, 2, 10000);
    unsigned g0 = first_generation(&h);
    shmipc__sup_worker_info o0;
    assert_true(slot_of(&h, g0, 0, &o0));
    touch_file(flag);
    shmipc__sup_reload(h.sup);
    unsigned g1 = reload_generation(&h, 1);
    shmipc__sup_worker_info w = {0};
    uint64_t end = ms_now() + 15000;
    for (;;) {
        shmipc__sup_worker_info n0 = {0};
        if (slot_of(&h, g1, 0, &n0) && n0.state == SHMIPC__SUP_READY && slot_of(&h, g1, 1, &w) &&
            w.restarts >= 3 && ready_count(&h, NULL) == 3)
            break;
        assert_true(ms_now() < end);
        sleep_ms(10);
    }
    assert_false(file_contains(h.log_path, "given up"));
    assert_true(slot_of(&h, g0, 0, &w));
    assert_int_equal(w.pid, o0.pid);
    unlink(flag);
    wait_only_generation(&h, g1, 2, NULL, 10000);
    assert_true(file_contains(h.log_path, "reload: generation"));
    assert_false(file_contains(h.log_path, "given up"));
    harness_finish(&h);
}

/* A reload during a failing reload: the first new generation (its workers still starting) is
 * superseded, the second one fails and is given up (one line, naming it), and the old workers
 * never stopped serving. */
static void test_reload_during_a_failing_reload(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    char flag[160], go[160], script[768];
    snprintf(flag, sizeof flag, "%s/broken", h.dir);
    snprintf(go, sizeof go, "%s/go", h.dir);
    /* Broken: a worker waits for "go", then fails to boot. */
    snprintf(script, sizeof script,
             "if [ -e %s ]; then i=0; while [ ! -e %s ] && [ $i -lt 3000 ]; do sleep 0.01; "
             "i=$((i+1)); done; echo 'cannot load app' >&2; exit 2; fi; "
             "echo \"w ready on {address}\"; exec sleep 30",
             flag, go);
    shmipc__sup_config c = base_config(&h, SH(script), 2);
    c.backoff_min_ms = 20;
    c.backoff_max_ms = 100;
    harness_start(&h, &c);
    wait_ready(&h, 2, 10000);
    unsigned g0 = first_generation(&h);
    shmipc__sup_worker_info o0, o1;
    assert_true(slot_of(&h, g0, 0, &o0));
    assert_true(slot_of(&h, g0, 1, &o1));
    pid_t old[2] = {o0.pid, o1.pid};
    touch_file(flag);
    unsigned sets_before;
    ready_count(&h, &sets_before);
    shmipc__sup_reload(h.sup);
    unsigned g1 = reload_generation(&h, 1);
    shmipc__sup_reload(h.sup);
    unsigned g2 = reload_generation(&h, 2);
    assert_true(g2 != g1);
    touch_file(go);
    char line[160];
    snprintf(line, sizeof line, "reload: generation %u failed to boot: all 2 of its workers", g2);
    wait_log(&h, line, 10000);
    wait_only_generation(&h, g0, 2, old, 5000);
    char *log = slurp(h.log_path);
    char *p = strstr(log, "the reload is given up");
    assert_non_null(p);
    assert_null(strstr(p + 1, "the reload is given up"));
    snprintf(line, sizeof line, "reload: generation %u failed", g1);
    assert_null(strstr(log, line));
    free(log);
    unsigned sets_now;
    assert_int_equal(ready_count(&h, &sets_now), 2);
    assert_int_equal(sets_now, sets_before);
    harness_finish(&h);
}

/*
 * realloc() of this program goes through here (meson: -Wl,--wrap=realloc for this test): one
 * of exactly `fail_realloc_size` bytes fails once, as out of memory.
 */
void *__real_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n);
static atomic_size_t fail_realloc_size;

void *__wrap_realloc(void *p, size_t n)
{
    size_t want = atomic_load(&fail_realloc_size);
    if (want != 0 && n == want && atomic_compare_exchange_strong(&fail_realloc_size, &want, 0)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_realloc(p, n);
}

/* The status report of `h`'s supervisor, as shmipc__sup_status() writes it; free() it. */
static char *status_text(struct harness *h)
{
    char path[160];
    snprintf(path, sizeof path, "%s/status", h->dir);
    int fd = open(path, O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(shmipc__sup_status(h->sup, fd), 0);
    close(fd);
    return slurp(path);
}

/*
 * A reload during a reload that finds no memory for the new generation's slots: the serving
 * generation keeps serving, the superseded one stops, and the supervisor is no longer
 * reloading. It went on naming the stopped generation as the one under way (cur_gen), so the
 * status said "reloading to the next" until the next SIGHUP. 6 workers: the slots (8, then 16
 * for the first reload) grow to 32 for the second, and that realloc fails.
 */
static void test_reload_during_a_reload_out_of_memory(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    char flag[160], script[512];
    snprintf(flag, sizeof flag, "%s/slow", h.dir);
    /* With the flag, a worker never gets ready: the first reload stays under way. */
    snprintf(script, sizeof script,
             "if [ -e %s ]; then exec sleep 30; fi; echo \"w ready on {address}\"; exec sleep 30",
             flag);
    shmipc__sup_config c = base_config(&h, SH(script), 6);
    harness_start(&h, &c);
    wait_ready(&h, 6, 10000);
    unsigned g0 = first_generation(&h);
    touch_file(flag);
    shmipc__sup_reload(h.sup);
    unsigned g1 = reload_generation(&h, 1);
    /* Every worker of the first reload has its process (a slot without one is dropped, not
     * stopped, and the slots would not need to grow). */
    uint64_t end = ms_now() + 10000;
    for (unsigned i = 0; i < 6;) {
        shmipc__sup_worker_info w;
        if (slot_of(&h, g1, i, &w) && w.pid > 0) {
            i++;
            continue;
        }
        assert_true(ms_now() < end);
        sleep_ms(10);
    }
    atomic_store(&fail_realloc_size, 32 * sizeof(struct slot));
    shmipc__sup_reload(h.sup);
    char line[160];
    snprintf(line, sizeof line, "reload: out of memory; generation %u keeps serving", g0);
    wait_log(&h, line, 5000);
    assert_int_equal(atomic_load(&fail_realloc_size), 0); /* that realloc did fail */
    char *st = status_text(&h);
    char want[160];
    snprintf(want, sizeof want, "generation %u serving, ", g0);
    if (strstr(st, want) == NULL || strstr(st, "reloading") != NULL)
        fail_msg("after the failed reload, the status says:\n%s", st);
    free(st);
    /* The superseded generation's workers stop; the serving one's 6 stay ready. */
    end = ms_now() + 10000;
    for (;;) {
        shmipc__sup_worker_info w;
        int left = 0;
        for (unsigned i = 0; i < 6; i++)
            left += slot_of(&h, g1, i, &w);
        if (left == 0)
            break;
        assert_true(ms_now() < end);
        sleep_ms(10);
    }
    assert_int_equal(ready_count(&h, NULL), 6);
    /* A later reload works. */
    unlink(flag);
    shmipc__sup_reload(h.sup);
    unsigned g2 = reload_generation(&h, 2); /* the one that failed logged no start */
    snprintf(line, sizeof line, "reload: generation %u ready", g2);
    wait_log(&h, line, 10000);
    harness_finish(&h);
}

/* A stop while a reload fails (one new worker failed, the other hangs before its ready line and
 * ignores SIGTERM) stops every generation within the graceful timeout: run() returns 0. */
static void test_stop_during_a_failing_reload(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    char flag[160], trapped[160], script[768];
    snprintf(flag, sizeof flag, "%s/broken", h.dir);
    snprintf(trapped, sizeof trapped, "%s/trapped", h.dir);
    snprintf(script, sizeof script,
             "a={address}; a=${a%%-*}; if [ -e %s ]; then if [ \"${a##*-}\" = 0 ]; then exit 2; "
             "fi; trap '' TERM; touch %s; exec sleep 30; fi; echo \"w ready on {address}\"; "
             "exec sleep 30",
             flag, trapped);
    shmipc__sup_config c = base_config(&h, SH(script), 2);
    c.graceful_timeout_ms = 300;
    harness_start(&h, &c);
    wait_ready(&h, 2, 10000);
    unsigned g0 = first_generation(&h);
    touch_file(flag);
    shmipc__sup_reload(h.sup);
    unsigned g1 = reload_generation(&h, 1);
    shmipc__sup_worker_info w[8];
    uint64_t end = ms_now() + 10000;
    for (;;) {
        shmipc__sup_worker_info x;
        if (access(trapped, F_OK) == 0 && slot_of(&h, g1, 0, &x) && x.restarts >= 1)
            break;
        assert_true(ms_now() < end);
        sleep_ms(10);
    }
    size_t n = shmipc__sup_snapshot(h.sup, w, 8);
    assert_int_equal(n, 4);
    shmipc__sup_stop(h.sup);
    harness_join(&h); /* rc 0 */
    for (size_t i = 0; i < n; i++)
        if (w[i].pid > 0)
            assert_true(pid_gone(w[i].pid));
    assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
    assert_int_equal(errno, ECHILD);
    assert_true(file_contains(h.log_path, "still running 0.3 s after SIGTERM: killed"));
    assert_false(file_contains(h.log_path, "given up"));
    (void)g0;
    harness_finish(&h);
}

/*
 * Regression: a failed boot that ends the run gave every stopping worker 0.5 s from then, also
 * one whose SIGKILL was due earlier (a reload's superseded worker that ignores SIGTERM): its
 * deadline moved later. A deadline now only moves earlier. Made certain by holding the
 * supervisor's lock until both the failed boot (worker of the first generation exits 2) and the
 * superseded worker's deadline are there, so the loop sees them in one round: that worker is
 * killed in that round, and the line says the 2.0 s its SIGTERM gave it.
 */
static void test_boot_failure_never_delays_an_earlier_deadline(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    char script[1024], first[160], fail[160];
    snprintf(first, sizeof first, "%s/first", h.dir);
    snprintf(fail, sizeof fail, "%s/fail", h.dir);
    /* The first worker waits for "fail", then exits 2 (a failed boot); any later one ignores
     * SIGTERM (then says so with a file named after its pid) and is never ready. */
    snprintf(script, sizeof script,
             "if mkdir %s 2>/dev/null; then i=0; while [ ! -e %s ] && [ $i -lt 3000 ]; do "
             "sleep 0.01; i=$((i+1)); done; exit 2; fi; trap '' TERM; touch %s/trapped.$$; "
             "exec sleep 30",
             first, fail, h.dir);
    shmipc__sup_config c = base_config(&h, SH(script), 1);
    c.end_on_boot_failure = 1;
    c.graceful_timeout_ms = 2000;
    harness_start(&h, &c);
    unsigned g0 = first_generation(&h);
    shmipc__sup_worker_info w0 = {0}, w1 = {0};
    uint64_t end = ms_now() + 10000;
    while (!slot_of(&h, g0, 0, &w0) || w0.pid <= 0 || access(first, F_OK) != 0) {
        assert_true(ms_now() < end);
        sleep_ms(5);
    }
    shmipc__sup_reload(h.sup);
    unsigned g1 = reload_generation(&h, 1);
    char trapped[200];
    for (;;) {
        if (slot_of(&h, g1, 0, &w1) && w1.pid > 0) {
            snprintf(trapped, sizeof trapped, "%s/trapped.%d", h.dir, (int)w1.pid);
            if (access(trapped, F_OK) == 0)
                break;
        }
        assert_true(ms_now() < end);
        sleep_ms(5);
    }
    /* A reload during the reload: g1's worker gets SIGTERM (ignored), SIGKILL due in 2 s. */
    shmipc__sup_reload(h.sup);
    for (;;) {
        assert_true(slot_of(&h, g1, 0, &w1));
        if (w1.state == SHMIPC__SUP_STOPPING)
            break;
        assert_true(ms_now() < end);
        sleep_ms(5);
    }
    pthread_mutex_lock(&h.sup->mu);
    uint64_t due = 0;
    int killed = 1;
    for (size_t i = 0; i < h.sup->nw; i++)
        if (h.sup->w[i].gen == g1) {
            due = h.sup->w[i].deadline_ns;
            killed = h.sup->w[i].killed;
        }
    if (killed) {
        pthread_mutex_unlock(&h.sup->mu);
        fail_msg("the loop passed the 2 s deadline before the test could hold it");
    }
    touch_file(fail);
    siginfo_t si;
    for (;;) { /* the first worker exited (not reaped: the supervisor reaps it) */
        memset(&si, 0, sizeof si);
        if (waitid(P_PID, (id_t)w0.pid, &si, WEXITED | WNOWAIT | WNOHANG) == 0 &&
            si.si_pid == w0.pid)
            break;
        assert_true(ms_now() < end + 5000);
        sleep_ms(5);
    }
    for (;;) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        if ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec > due + 10 * NS_PER_MS)
            break;
        sleep_ms(10);
    }
    pthread_mutex_unlock(&h.sup->mu);
    wait_log(&h, "failed to boot (exit 2) and no worker was ever ready", 5000);
    /* The round that logged it ran its timers before the lock could be had again. */
    pthread_mutex_lock(&h.sup->mu);
    char line[200];
    snprintf(line, sizeof line,
             "worker 0 (generation %u, pid %d) still running 2.0 s after SIGTERM: killed", g1,
             (int)w1.pid);
    int said = file_contains(h.log_path, line);
    pthread_mutex_unlock(&h.sup->mu);
    if (!said) {
        char *log = slurp(h.log_path);
        print_message("log:\n%s\n", log);
        free(log);
    }
    assert_true(said);
    assert_int_equal(pthread_join(h.th, NULL), 0);
    h.running = 0;
    assert_int_equal(h.rc, SHMIPC__SUP_BOOT_FAILED);
    assert_true(pid_gone(w1.pid));
    assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
    harness_finish(&h);
}

static void test_stop_during_a_reload(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    /* The new generations never get ready: a worker started after the marker file exists
     * sleeps without its ready line. (A fixed "sleep 1" raced against a loaded TSan run, where
     * the first new generation could get ready before the second reload.) The stop takes every
     * generation down. */
    char marker[160], script[400];
    snprintf(marker, sizeof marker, "%s/slow", h.dir);
    snprintf(script, sizeof script,
             "if [ -e '%s' ]; then exec sleep 30; fi; echo \"w ready on {address}\"; exec sleep 30",
             marker);
    shmipc__sup_config c = base_config(&h, SH(script), 2);
    harness_start(&h, &c);
    wait_ready(&h, 2, 10000);
    unsigned g0 = first_generation(&h);
    touch_file(marker);
    shmipc__sup_reload(h.sup);
    uint64_t end = ms_now() + 5000;
    while (shmipc__sup_snapshot(h.sup, NULL, 0) < 4) {
        assert_true(ms_now() < end);
        sleep_ms(5);
    }
    shmipc__sup_worker_info w[16];
    size_t n = shmipc__sup_snapshot(h.sup, w, 16);
    assert_int_equal(n, 4);
    unsigned g1 = w[2].generation;
    assert_true(g1 != g0);
    /* A reload during the reload: the unfinished generation g1 is stopped, g0 still serves. */
    shmipc__sup_reload(h.sup);
    end = ms_now() + 10000;
    for (;;) {
        shmipc__sup_worker_info x;
        n = shmipc__sup_snapshot(h.sup, w, 16);
        if (!slot_of(&h, g1, 0, &x) && !slot_of(&h, g1, 1, &x) && n == 4)
            break;
        assert_true(ms_now() < end);
        sleep_ms(5);
    }
    assert_int_equal(w[0].generation, g0);
    assert_int_equal(w[0].state, SHMIPC__SUP_READY);
    assert_true(w[2].generation != g1 && w[2].generation != g0);
    shmipc__sup_stop(h.sup);
    harness_join(&h);
    for (size_t i = 0; i < n; i++)
        if (w[i].pid > 0)
            assert_true(pid_gone(w[i].pid));
    assert_int_equal(shmipc__sup_snapshot(h.sup, NULL, 0), 0);
    harness_finish(&h);
}

/* ---- stop ------------------------------------------------------------------------------ */

static void test_stop_kills_a_worker_that_ignores_term(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    shmipc__sup_config c =
        base_config(&h, SH("trap '' TERM; echo \"w ready on {address}\"; exec sleep 30"), 2);
    c.graceful_timeout_ms = 300;
    harness_start(&h, &c);
    wait_ready(&h, 2, 10000);
    unsigned gen = first_generation(&h);
    shmipc__sup_worker_info w0 = {0}, w1 = {0};
    assert_true(slot_of(&h, gen, 0, &w0));
    assert_true(slot_of(&h, gen, 1, &w1));
    uint64_t t0 = ms_now();
    shmipc__sup_stop(h.sup);
    harness_join(&h);
    uint64_t took = ms_now() - t0;
    assert_true(took >= 300);  /* it waited for the graceful deadline */
    assert_true(took < 10000); /* and not for the 30 s sleep */
    assert_true(pid_gone(w0.pid) && pid_gone(w1.pid));
    wait_log(&h, "still running 0.3 s after SIGTERM: killed", 100);
    wait_log(&h, "stopped: signal 9", 100);
    harness_finish(&h);
}

static void test_stop_is_quick_for_a_polite_worker(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    shmipc__sup_config c = base_config(
        &h, SH("trap 'exit 0' TERM; echo \"w ready on {address}\"; while :; do sleep 0.05; done"),
        2);
    c.graceful_timeout_ms = 20000;
    harness_start(&h, &c);
    wait_ready(&h, 2, 10000);
    uint64_t t0 = ms_now();
    shmipc__sup_stop(h.sup);
    harness_join(&h);
    assert_true(ms_now() - t0 < 10000);
    assert_false(file_contains(h.log_path, "killed"));
    harness_finish(&h);
}

static void test_second_stop_kills_at_once(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    shmipc__sup_config c =
        base_config(&h, SH("trap '' TERM; echo \"w ready on {address}\"; exec sleep 30"), 1);
    c.graceful_timeout_ms = 60000;
    harness_start(&h, &c);
    wait_ready(&h, 1, 10000);
    uint64_t t0 = ms_now();
    shmipc__sup_stop(h.sup);
    wait_log(&h, "stop: stopping", 5000);
    shmipc__sup_stop(h.sup);
    harness_join(&h);
    assert_true(ms_now() - t0 < 10000);
    wait_log(&h, "stop: killing the workers now", 100);
    harness_finish(&h);
}

/*
 * Output dropped for want of room is not lost silently: once the destination has room again,
 * a line says how many bytes it lost, then output goes on (before, nothing told the reader).
 */
static void test_dropped_output_is_counted(void **state)
{
    (void)state;
    int pfd[2];
    char buf[256];
    assert_int_equal(pipe2(pfd, O_CLOEXEC | O_NONBLOCK), 0);
    while (write(pfd[1], "x", 1) == 1) /* full */
        ;
    assert_int_equal(fcntl(pfd[1], F_SETFL, 0), 0); /* blocking, as a log reader's pipe is */
    shmipc__sup_write_all(pfd[1], "abc\n", 4);      /* waits OUT_WAIT_MS, then drops */
    shmipc__sup_write_all(pfd[1], "de\n", 3);       /* drops at once */
    while (read(pfd[0], buf, sizeof buf) > 0)       /* the reader comes back */
        ;
    shmipc__sup_write_all(pfd[1], "next\n", 5);
    char want[128];
    int wl = snprintf(want, sizeof want,
                      "shmipc-serve[%d]: 7 bytes of output dropped: nobody read them\nnext\n",
                      (int)getpid());
    ssize_t got = read(pfd[0], buf, sizeof buf);
    assert_int_equal(got, wl);
    assert_memory_equal(buf, want, (size_t)wl);
    shmipc__sup_write_all(pfd[1], "more\n", 5); /* no second notice */
    got = read(pfd[0], buf, sizeof buf);
    assert_int_equal(got, 5);
    assert_memory_equal(buf, "more\n", 5);
    close(pfd[0]);
    close(pfd[1]);
}

/*
 * A drop that cuts a line written in two pieces (a worker's last line, then its newline; a cut
 * line, then its marker) is one no piece of the drop's own write shows: the notice must still
 * start a line of its own, not run on from the worker's cut line.
 */
static void test_dropped_notice_after_a_line_cut_between_writes(void **state)
{
    (void)state;
    int pfd[2];
    static char buf[8192];
    assert_int_equal(pipe2(pfd, O_CLOEXEC), 0);
    assert_int_equal(fcntl(pfd[1], F_SETPIPE_SZ, 4096), 4096); /* one page */
    memset(buf, 'a', 4095);
    shmipc__sup_write_all(pfd[1], buf, 4095); /* the line, without its end: it fits */
    shmipc__sup_write_all(pfd[1], "\n", 1);   /* its end finds no room: dropped */
    int fl = fcntl(pfd[0], F_GETFL);
    assert_int_equal(fcntl(pfd[0], F_SETFL, fl | O_NONBLOCK), 0);
    ssize_t got = read(pfd[0], buf, sizeof buf); /* the reader comes back */
    assert_int_equal(got, 4095);
    shmipc__sup_write_all(pfd[1], "next\n", 5);
    char want[128];
    int wl = snprintf(want, sizeof want,
                      "\nshmipc-serve[%d]: 1 bytes of output dropped: nobody read them\nnext\n",
                      (int)getpid());
    got = read(pfd[0], buf, sizeof buf);
    assert_int_equal(got, wl);
    assert_memory_equal(buf, want, (size_t)wl);
    close(pfd[0]);
    close(pfd[1]);
}

struct pty_writer {
    int fd;
    atomic_int done;
};

static void *pty_writer_thread(void *arg)
{
    struct pty_writer *pw = arg;
    char line[4000];
    memset(line, 'w', sizeof line);
    line[sizeof line - 1] = '\n';
    for (int i = 0; i < 64; i++) /* 250 KiB: far past what a pty holds */
        shmipc__sup_write_all(pw->fd, line, sizeof line);
    atomic_store(&pw->done, 1);
    return NULL;
}

/*
 * A terminal nobody reads (a pty whose master is not read: an ssh session whose client
 * stalled): its poll() says POLLOUT while a few bytes are free, and a blocking write of
 * PIPE_BUF then waits for the reader, which stalled supervision as a full pipe did. The
 * writes must give up (dropping) instead.
 */
static void test_unread_terminal_does_not_block_writes(void **state)
{
    (void)state;
    int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (m < 0)
        skip();
    assert_int_equal(grantpt(m), 0);
    assert_int_equal(unlockpt(m), 0);
    int s = open(ptsname(m), O_RDWR | O_NOCTTY | O_CLOEXEC);
    assert_true(s >= 0);
    struct pty_writer pw = {.fd = s};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, pty_writer_thread, &pw), 0);
    uint64_t end = ms_now() + 5000;
    while (!atomic_load(&pw.done) && ms_now() < end)
        sleep_ms(10);
    int blocked = !atomic_load(&pw.done);
    /* Unblocked either way before the test ends: the master read until the writer returns. */
    char junk[65536];
    int fl = fcntl(m, F_GETFL);
    assert_int_equal(fcntl(m, F_SETFL, fl | O_NONBLOCK), 0);
    while (!atomic_load(&pw.done)) {
        while (read(m, junk, sizeof junk) > 0) {
        }
        sleep_ms(10);
    }
    assert_int_equal(pthread_join(th, NULL), 0);
    /* The shared description was left as it was (blocking). */
    assert_int_equal(fcntl(s, F_GETFL) & O_NONBLOCK, 0);
    close(s);
    close(m);
    if (blocked)
        fail_msg("a write to a terminal nobody reads blocked past 5 s");
}

static int other_writer = -1; /* a description of the pipe's write end of the "other thread" */

static void other_thread_takes_the_room(int fd)
{
    (void)fd;
    char b[512];
    memset(b, 'o', sizeof b);
    while (write(other_writer, b, sizeof b) > 0) {
    }
    while (write(other_writer, b, 1) > 0) {
    }
}

static void *pipe_writer_thread(void *arg)
{
    struct pty_writer *pw = arg;
    char line[1000];
    memset(line, 'w', sizeof line);
    line[sizeof line - 1] = '\n';
    shmipc__sup_write_all(pw->fd, line, sizeof line);
    atomic_store(&pw->done, 1);
    return NULL;
}

/*
 * A pipe that had room at poll() and has none at write(): another thread writing here (the
 * front's reactor threads log through the same writer) took it in between. The write must be
 * dropped, not wait for a reader that never comes (before, a blocking write() did).
 */
static void test_pipe_room_taken_after_poll_does_not_block(void **state)
{
    (void)state;
    int pfd[2];
    char path[64];
    assert_int_equal(pipe2(pfd, O_CLOEXEC), 0); /* blocking, as a log reader's pipe is */
    snprintf(path, sizeof path, "/proc/self/fd/%d", pfd[1]);
    other_writer = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    assert_true(other_writer >= 0);
    shmipc__sup_after_poll_hook = other_thread_takes_the_room;
    struct pty_writer pw = {.fd = pfd[1]};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, pipe_writer_thread, &pw), 0);
    uint64_t end = ms_now() + 5000;
    while (!atomic_load(&pw.done) && ms_now() < end)
        sleep_ms(10);
    int blocked = !atomic_load(&pw.done);
    shmipc__sup_after_poll_hook = NULL;
    char junk[65536];
    int fl = fcntl(pfd[0], F_GETFL);
    assert_int_equal(fcntl(pfd[0], F_SETFL, fl | O_NONBLOCK), 0);
    while (!atomic_load(&pw.done)) { /* unblocked either way before the test ends */
        while (read(pfd[0], junk, sizeof junk) > 0) {
        }
        sleep_ms(10);
    }
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(fcntl(pfd[1], F_GETFL) & O_NONBLOCK, 0); /* the shared one kept its flags */
    close(other_writer);
    other_writer = -1;
    close(pfd[0]);
    close(pfd[1]);
    if (blocked)
        fail_msg("a write to a pipe whose room another writer took blocked past 5 s");
}

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (d == NULL)
        return -1;
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n;
}

static void *one_line_thread(void *arg)
{
    shmipc__sup_write_all(*(int *)arg, "a line\n", 7);
    return NULL;
}

/*
 * A pipe is written through an O_NONBLOCK description of its own, one per thread that writes
 * it (a thread-local table: the threads write without a lock). It was never closed: each
 * thread that wrote a line to a pipe (the library's threads log through shmipc__sup_say in
 * shmipc-serve, a test's supervisor runs on a thread of its own) left a descriptor open, and
 * the pipe's write end open with it, until the process ended. Now it is closed when its
 * thread ends: 64 threads, one after another, leave the count of open descriptors as it was.
 */
static void test_writer_descriptors_end_with_their_thread(void **state)
{
    (void)state;
    int pfd[2];
    assert_int_equal(pipe2(pfd, O_CLOEXEC | O_NONBLOCK), 0);
    char junk[4096];
    one_line_thread(&pfd[1]); /* this thread's own description, kept (the main thread's) */
    assert_int_equal(read(pfd[0], junk, sizeof junk), 7);
    int before = open_fds();
    assert_true(before > 0);
    for (int i = 0; i < 64; i++) {
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, one_line_thread, &pfd[1]), 0);
        assert_int_equal(pthread_join(th, NULL), 0);
        assert_int_equal(read(pfd[0], junk, sizeof junk), 7); /* it was written */
    }
    int after = open_fds();
    close(pfd[0]);
    close(pfd[1]);
    if (after != before)
        fail_msg("64 threads that wrote a line to a pipe left %d descriptors open", after - before);
}

struct run_flag {
    shmipc__sup *sup;
    int rc;
    atomic_int done;
};

static void *run_flag_thread(void *arg)
{
    struct run_flag *f = arg;
    f->rc = shmipc__sup_run(f->sup);
    atomic_store(&f->done, 1);
    return NULL;
}

/*
 * A worker's stdout forwarded to a pipe nobody reads (a stalled log reader, a terminal stopped
 * with Ctrl-S): the supervisor's write blocked once the pipe was full, and from then on it
 * supervised nothing: no restart, no reload, and a stop (SIGTERM, a second one) never ended,
 * nor did shmipc-serve, until someone read the pipe. Now the output waits for room a moment,
 * then is dropped: the stop ends within its graceful timeout.
 */
static void test_unread_output_does_not_stall_supervision(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    int pfd[2];
    assert_int_equal(pipe2(pfd, O_CLOEXEC), 0);
    shmipc__sup_config c = base_config(
        &h,
        SH("echo \"w ready on {address}\"; sleep 0.3; "
           "while :; do echo 0123456789012345678901234567890123456789012345678901234567890123; "
           "done"),
        1);
    c.out_fd = pfd[1];
    c.graceful_timeout_ms = 3000;
    struct run_flag f = {.rc = -1};
    assert_int_equal(shmipc__sup_new(&c, &f.sup), 0);
    h.sup = f.sup;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, run_flag_thread, &f), 0);
    wait_ready(&h, 1, 10000);
    sleep_ms(800); /* the pipe is full by now: 64 KiB at 65 bytes a line */
    shmipc__sup_stop(h.sup);
    uint64_t end = ms_now() + 15000;
    while (!atomic_load(&f.done) && ms_now() < end)
        sleep_ms(20);
    int stopped = atomic_load(&f.done);
    /* Unblocked either way before the test ends: the pipe read until the loop returns. */
    char junk[65536];
    int fl = fcntl(pfd[0], F_GETFL);
    fcntl(pfd[0], F_SETFL, fl | O_NONBLOCK);
    while (!atomic_load(&f.done)) {
        while (read(pfd[0], junk, sizeof junk) > 0) {
        }
        sleep_ms(10);
    }
    assert_int_equal(pthread_join(th, NULL), 0);
    close(pfd[0]);
    close(pfd[1]);
    assert_true(stopped);
    assert_int_equal(f.rc, 0);
    harness_finish(&h);
}

/* ---- status and signals ---------------------------------------------------------------- */

static void test_status_output(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    shmipc__sup_config c = base_config(&h, sleeper(), 2);
    harness_start(&h, &c);
    wait_ready(&h, 2, 10000);
    unsigned gen = first_generation(&h);
    shmipc__sup_worker_info w0;
    assert_true(slot_of(&h, gen, 0, &w0));
    kill(w0.pid, SIGKILL);
    uint64_t end = ms_now() + 10000;
    do {
        assert_true(ms_now() < end);
        sleep_ms(10);
        assert_true(slot_of(&h, gen, 0, &w0));
    } while (w0.state != SHMIPC__SUP_READY || w0.restarts != 1);
    char path[160];
    snprintf(path, sizeof path, "%s/status", h.dir);
    int fd = open(path, O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(shmipc__sup_status(h.sup, fd), 0);
    close(fd);
    char *s = slurp(path);
    char want[200];
    snprintf(want, sizeof want, "status: 2 workers, generation %u serving", gen);
    assert_non_null(strstr(s, want));
    assert_non_null(
        strstr(s, "index gen  pid      state     restarts uptime    last-exit  address"));
    snprintf(want, sizeof want, "%-5u %-4u %-8d %-9s %-8u ", 0u, gen, (int)w0.pid, "ready", 1u);
    assert_non_null(strstr(s, want));
    assert_non_null(strstr(s, "signal 9"));
    assert_non_null(strstr(s, w0.address));
    free(s);
    /* The request from another thread prints it on the log. */
    shmipc__sup_request_status(h.sup);
    wait_log(&h, "status: 2 workers", 5000);
    harness_finish(&h);
}

static void test_signals(void **state)
{
    (void)state;
    struct harness h;
    harness_init(&h);
    shmipc__sup_config c = base_config(&h, sleeper(), 1);
    c.signals = 1;
    harness_start(&h, &c);
    wait_ready(&h, 1, 10000); /* the handlers are in place before the first spawn */
    unsigned g0 = first_generation(&h);
    assert_int_equal(kill(getpid(), SIGUSR1), 0);
    wait_log(&h, "status: 1 workers", 5000);
    assert_int_equal(kill(getpid(), SIGHUP), 0);
    wait_log(&h, "reload: starting generation", 5000);
    uint64_t end = ms_now() + 10000;
    shmipc__sup_worker_info w[4];
    while (shmipc__sup_snapshot(h.sup, w, 4) != 1 || w[0].generation == g0 ||
           w[0].state != SHMIPC__SUP_READY) {
        assert_true(ms_now() < end);
        sleep_ms(10);
    }
    assert_int_equal(kill(getpid(), SIGTERM), 0);
    harness_join(&h);
    /* run() put the previous dispositions back. */
    struct sigaction sa;
    sigaction(SIGTERM, NULL, &sa);
    assert_true(sa.sa_handler == SIG_DFL);
    sigaction(SIGPIPE, NULL, &sa);
    assert_true(sa.sa_handler == SIG_DFL);
    harness_finish(&h);
}

/* ---- Python WSGI workers --------------------------------------------------------------- */

static const char app_py[] =
    "import os, time\n"
    "def app(environ, start_response):\n"
    "    if environ['PATH_INFO'] == '/slow':\n"
    "        open('slow.started', 'w').close()\n"
    "        time.sleep(float(environ['QUERY_STRING']))\n"
    "    start_response('200 OK', [('Content-Type', 'text/plain')])\n"
    "    return [('pid=%d path=%s' % (os.getpid(), environ['PATH_INFO'])).encode()]\n";

/* The Python module is built (it is not in the sanitizer builds): else these tests skip. */
static int python_built(void)
{
    char p[512];
    snprintf(p, sizeof p, "%s/python/shmipc/serve/worker.py", SHMIPC_BUILD_DIR);
    if (access(p, R_OK) != 0)
        return 0;
    snprintf(p, sizeof p, "%s/python/shmipc", SHMIPC_BUILD_DIR);
    DIR *d = opendir(p);
    int found = 0;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL)
        found |= strncmp(e->d_name, "_serve.", 7) == 0 && strstr(e->d_name, ".so") != NULL;
    if (d != NULL)
        closedir(d);
    return found && access(SHMIPC_PYTHON, X_OK) == 0;
}

struct pyenv {
    char *env[512];
    char pythonpath[600];
};

static void pyenv_init(struct pyenv *pe)
{
    size_t n = 0;
    snprintf(pe->pythonpath, sizeof pe->pythonpath, "PYTHONPATH=%s/python", SHMIPC_BUILD_DIR);
    pe->env[n++] = pe->pythonpath;
    for (char **e = environ; *e != NULL && n < 510; e++)
        if (strncmp(*e, "PYTHONPATH=", 11) != 0)
            pe->env[n++] = *e;
    pe->env[n] = NULL;
}

static void write_app(struct harness *h)
{
    char p[200];
    snprintf(p, sizeof p, "%s/supapp.py", h->dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(app_py, f);
    fclose(f);
}

/* One GET through a worker's shmipc address, as the front will send it; the body into out.
 * The status, or a negative step that failed: -1 connect, -2 open, -3 encode, -4 send, -5
 * read, -6 a bad frame, -7 a body over cap. No cmocka assertion in here: it runs on threads
 * too, and a failed assertion off the test's thread longjmps across stacks (a run once exited
 * 255 with no message from there); callers assert the status. */
static int request(const char *address, const char *target, char *out, size_t cap)
{
    shmipc_config *cfg = NULL;
    shmipc_session *s = NULL;
    shmipc_stream *st = NULL;
    int status = -1;
    uint8_t buf[2048];
    size_t got = 0;
    out[0] = '\0';
    if (shmipc_config_new(&cfg) != 0 ||
        shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_READ, 10000) != 0 ||
        shmipc_session_connect(address, cfg, &s) != 0)
        goto out;
    status = -2;
    if (shmipc_session_open_stream(s, &st) != 0)
        goto out;
    shmipc_serve_request r;
    memset(&r, 0, sizeof r);
    r.size = sizeof r;
    r.version_minor = 1;
    r.method = (const uint8_t *)"GET";
    r.method_len = 3;
    r.target = (const uint8_t *)target;
    r.target_len = (uint32_t)strlen(target);
    shmipc_serve_field host = {(const uint8_t *)"Host", (const uint8_t *)"t", 4, 1};
    status = -3;
    int64_t n = shmipc_serve_encode_request_head(buf, sizeof buf, &r, &host, 1);
    if (n <= 0 || shmipc_serve_encode_header(buf + n, sizeof buf - (size_t)n, SHMIPC_SERVE_END, 0,
                                             0) != SHMIPC_SERVE_HDR_SIZE)
        goto out;
    status = -4;
    if (shmipc_stream_write(st, buf, (size_t)n + SHMIPC_SERVE_HDR_SIZE) != 0 ||
        shmipc_stream_flush(st) != 0)
        goto out;
    int answer = -5;
    for (int frames = 0; frames < 64; frames++) {
        const void *p;
        shmipc_serve_frame f;
        memset(&f, 0, sizeof f);
        f.size = sizeof f;
        status = -5;
        if (shmipc_stream_read_exact_bytes(st, SHMIPC_SERVE_HDR_SIZE, &p, 0) != 0)
            goto out;
        uint8_t hdr[SHMIPC_SERVE_HDR_SIZE];
        memcpy(hdr, p, sizeof hdr);
        status = -6;
        if (shmipc_serve_decode_header(hdr, sizeof hdr, &f) != SHMIPC_SERVE_HDR_SIZE ||
            f.length > sizeof buf - sizeof hdr)
            goto out;
        memcpy(buf, hdr, sizeof hdr);
        if (f.length > 0) {
            status = -5;
            if (shmipc_stream_read_exact_bytes(st, f.length, &p, 0) != 0)
                goto out;
            memcpy(buf + sizeof hdr, p, f.length);
        }
        status = -6;
        if (f.type == SHMIPC_SERVE_RESPONSE_HEAD) {
            shmipc_serve_response resp;
            memset(&resp, 0, sizeof resp);
            resp.size = sizeof resp;
            if (shmipc_serve_decode_response(buf, sizeof hdr + f.length, &resp) <= 0)
                goto out;
            answer = resp.status;
        } else if (f.type == SHMIPC_SERVE_BODY) {
            status = -7;
            if (got + f.length >= cap)
                goto out;
            memcpy(out + got, buf + sizeof hdr, f.length);
            got += f.length;
        } else if (f.type == SHMIPC_SERVE_END) {
            status = answer;
            break;
        } else {
            goto out;
        }
    }
    out[got] = '\0';
out:
    if (st != NULL)
        shmipc_stream_close(st);
    if (s != NULL)
        shmipc_session_close(s);
    shmipc_config_free(cfg);
    return status;
}

/* Binds and listens on a worker's abstract name ("unix:@NAME") as soon as it is free (its
 * process is gone), within timeout_ms: a local squatter. Returns the socket. */
static int squat_name(const char *address, unsigned timeout_ms)
{
    const char *name = address + strlen("unix:@");
    assert_int_equal(strncmp(address, "unix:@", 6), 0);
    struct sockaddr_un un;
    memset(&un, 0, sizeof un);
    un.sun_family = AF_UNIX;
    size_t len = strlen(name);
    assert_true(len + 1 < sizeof un.sun_path);
    memcpy(un.sun_path + 1, name, len);
    socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    uint64_t end = ms_now() + timeout_ms;
    while (bind(fd, (struct sockaddr *)&un, sl) != 0) {
        assert_int_equal(errno, EADDRINUSE);
        assert_true(ms_now() < end);
        sleep_ms(1);
    }
    assert_int_equal(listen(fd, 4), 0);
    return fd;
}

static void expect_served_by(const char *address, pid_t pid, const char *target)
{
    char body[256], want[256];
    assert_int_equal(request(address, target, body, sizeof body), 200);
    snprintf(want, sizeof want, "pid=%d path=%s", (int)pid, target);
    assert_string_equal(body, want);
}

static void test_python_wsgi_workers(void **state)
{
    (void)state;
    if (!python_built())
        skip();
    struct harness h;
    struct pyenv pe;
    harness_init(&h);
    write_app(&h);
    pyenv_init(&pe);
    const char *const argv[] = {
        SHMIPC_PYTHON, "-m", "shmipc.serve.worker", "supapp:app", "--address", "{address}", NULL};
    shmipc__sup_config c = base_config(&h, argv, 2);
    c.envp = pe.env;
    c.chdir_to = h.dir;
    c.start_timeout_ms = 60000;
    harness_start(&h, &c);
    wait_ready(&h, 2, 60000);
    unsigned gen = first_generation(&h);
    shmipc__sup_worker_info w0 = {0}, w1 = {0}, now = {0};
    assert_true(slot_of(&h, gen, 0, &w0));
    assert_true(slot_of(&h, gen, 1, &w1));
    /* Each address is served by its own worker process. */
    expect_served_by(w0.address, w0.pid, "/zero");
    expect_served_by(w1.address, w1.pid, "/one");
    /* kill -9, and another process takes the dead worker's name (which /proc/net/unix shows
     * every local user) before the restart: the new worker starts on a name of its own and
     * serves, instead of failing to bind for good. */
    assert_int_equal(kill(w0.pid, SIGKILL), 0);
    int squat = squat_name(w0.address, 5000);
    uint64_t end = ms_now() + 30000;
    for (;;) {
        assert_true(slot_of(&h, gen, 0, &now));
        if (now.state == SHMIPC__SUP_READY && now.pid != w0.pid)
            break;
        assert_true(ms_now() < end);
        sleep_ms(20);
    }
    assert_int_equal(now.restarts, 1);
    assert_string_not_equal(now.address, w0.address);
    expect_served_by(now.address, now.pid, "/again");
    expect_served_by(w1.address, w1.pid, "/one");
    close(squat);
    /* Stop: the workers exit on SIGTERM (exit 0), none is killed. */
    shmipc__sup_stop(h.sup);
    harness_join(&h);
    assert_true(pid_gone(now.pid) && pid_gone(w1.pid));
    assert_false(file_contains(h.log_path, "killed"));
    harness_finish(&h);
}

struct slow_req {
    char address[96];
    int status;
    char body[256];
};

static void *slow_request(void *arg)
{
    struct slow_req *r = arg;
    r->status = request(r->address, "/slow?0.8", r->body, sizeof r->body);
    return NULL;
}

static void test_python_stop_finishes_the_request_in_flight(void **state)
{
    (void)state;
    if (!python_built())
        skip();
    struct harness h;
    struct pyenv pe;
    harness_init(&h);
    write_app(&h);
    pyenv_init(&pe);
    const char *const argv[] = {
        SHMIPC_PYTHON, "-m", "shmipc.serve.worker", "supapp:app", "--address", "{address}", NULL};
    shmipc__sup_config c = base_config(&h, argv, 1);
    c.envp = pe.env;
    c.chdir_to = h.dir;
    c.start_timeout_ms = 60000;
    c.graceful_timeout_ms = 20000;
    harness_start(&h, &c);
    wait_ready(&h, 1, 60000);
    unsigned gen = first_generation(&h);
    shmipc__sup_worker_info w = {0};
    assert_true(slot_of(&h, gen, 0, &w));
    struct slow_req r;
    memset(&r, 0, sizeof r);
    snprintf(r.address, sizeof r.address, "%s", w.address);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, slow_request, &r), 0);
    /* The stop comes once the request is in the app's sleep (the app marks it in its
     * directory): a fixed 300 ms wait came before the request on a loaded machine. */
    char mark[300];
    snprintf(mark, sizeof mark, "%s/slow.started", h.dir);
    uint64_t end = ms_now() + 30000;
    while (access(mark, F_OK) != 0 && ms_now() < end)
        sleep_ms(5);
    assert_int_equal(access(mark, F_OK), 0);
    shmipc__sup_stop(h.sup);
    harness_join(&h);
    assert_int_equal(pthread_join(t, NULL), 0);
    /* SIGTERM let the worker answer the request it had, then it exited 0: not killed. */
    assert_int_equal(r.status, 200);
    char want[64];
    snprintf(want, sizeof want, "pid=%d path=/slow", (int)w.pid);
    assert_string_equal(r.body, want);
    assert_true(pid_gone(w.pid));
    assert_false(file_contains(h.log_path, "killed"));
    harness_finish(&h);
}

static void test_python_max_requests_recycles(void **state)
{
    (void)state;
    if (!python_built())
        skip();
    struct harness h;
    struct pyenv pe;
    harness_init(&h);
    write_app(&h);
    pyenv_init(&pe);
    const char *const argv[] = {
        SHMIPC_PYTHON, "-m",        "shmipc.serve.worker", "supapp:app", "--max-requests",
        "2",           "--address", "{address}",           NULL};
    shmipc__sup_config c = base_config(&h, argv, 1);
    c.envp = pe.env;
    c.chdir_to = h.dir;
    c.start_timeout_ms = 60000;
    harness_start(&h, &c);
    wait_ready(&h, 1, 60000);
    unsigned gen = first_generation(&h);
    shmipc__sup_worker_info w, now;
    assert_true(slot_of(&h, gen, 0, &w));
    expect_served_by(w.address, w.pid, "/1");
    expect_served_by(w.address, w.pid, "/2");
    uint64_t end = ms_now() + 60000;
    for (;;) {
        assert_true(slot_of(&h, gen, 0, &now));
        if (now.state == SHMIPC__SUP_READY && now.pid != w.pid)
            break;
        assert_true(ms_now() < end);
        sleep_ms(20);
    }
    assert_int_equal(now.restarts, 1);
    assert_true(WIFEXITED(now.last_status) && WEXITSTATUS(now.last_status) == 0);
    assert_int_equal(now.last_delay_ms, 0); /* a clean recycle: no back-off */
    expect_served_by(now.address, now.pid, "/3");
    harness_finish(&h);
}

static void test_python_import_failure_backs_off(void **state)
{
    (void)state;
    if (!python_built())
        skip();
    struct harness h;
    struct pyenv pe;
    harness_init(&h);
    pyenv_init(&pe);
    const char *const argv[] = {
        SHMIPC_PYTHON, "-m", "shmipc.serve.worker", "nosuchmodule:app", "--address",
        "{address}",   NULL};
    shmipc__sup_config c = base_config(&h, argv, 1);
    c.envp = pe.env;
    c.chdir_to = h.dir;
    harness_start(&h, &c);
    unsigned gen = first_generation(&h);
    shmipc__sup_worker_info w = {0};
    uint64_t end = ms_now() + 60000;
    do {
        assert_true(ms_now() < end);
        sleep_ms(20);
        assert_true(slot_of(&h, gen, 0, &w));
    } while (w.restarts < 2);
    assert_true(WIFEXITED(w.last_status) && WEXITSTATUS(w.last_status) == 2);
    assert_true(w.last_delay_ms >= 200);
    /* Bounded: the interpreter's start is slow, the back-off only adds to it. */
    sleep_ms(1000);
    assert_true(slot_of(&h, gen, 0, &w));
    assert_true(w.restarts <= 6);
    unsigned nsets;
    ready_count(&h, &nsets);
    assert_int_equal(nsets, 0);
    harness_finish(&h);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_workers_ready_with_unique_addresses),
        cmocka_unit_test(test_kill9_restarts_with_a_new_pid),
        cmocka_unit_test(test_kill_hung_kills_and_restarts_that_worker),
        cmocka_unit_test(test_crash_loop_backs_off),
        cmocka_unit_test(test_boot_failure_ends_the_run),
        cmocka_unit_test(test_boot_failure_of_a_spawn_ends_the_run),
        cmocka_unit_test(test_boot_failure_only_before_any_ready),
        cmocka_unit_test(test_crash_loop_delay_caps_at_max),
        cmocka_unit_test(test_backoff_resets_after_a_healthy_run),
        cmocka_unit_test(test_spawn_rate_is_capped),
        cmocka_unit_test(test_spawn_failure_backs_off),
        cmocka_unit_test(test_start_timeout_kills_a_silent_worker),
        cmocka_unit_test(test_long_output_line_then_ready),
        cmocka_unit_test(test_output_whole_lines_of_two_workers),
        cmocka_unit_test(test_output_line_over_the_bound_is_cut),
        cmocka_unit_test(test_output_last_line_without_newline),
        cmocka_unit_test(test_address_substitution),
        cmocka_unit_test(test_address_in_whole_arguments_only),
        cmocka_unit_test(test_clean_exit_restarts_at_once),
        cmocka_unit_test(test_instant_clean_exits_are_capped_too),
        cmocka_unit_test(test_many_workers),
        cmocka_unit_test(test_reload_new_ready_before_old_term),
        cmocka_unit_test(test_reload_to_a_broken_generation_is_given_up),
        cmocka_unit_test(test_reload_that_cannot_spawn_or_times_out_is_given_up),
        cmocka_unit_test(test_reload_with_a_ready_new_worker_is_not_given_up),
        cmocka_unit_test(test_reload_during_a_failing_reload),
        cmocka_unit_test(test_reload_during_a_reload_out_of_memory),
        cmocka_unit_test(test_stop_during_a_failing_reload),
        cmocka_unit_test(test_boot_failure_never_delays_an_earlier_deadline),
        cmocka_unit_test(test_stop_during_a_reload),
        cmocka_unit_test(test_stop_kills_a_worker_that_ignores_term),
        cmocka_unit_test(test_stop_is_quick_for_a_polite_worker),
        cmocka_unit_test(test_second_stop_kills_at_once),
        cmocka_unit_test(test_unread_output_does_not_stall_supervision),
        cmocka_unit_test(test_dropped_output_is_counted),
        cmocka_unit_test(test_dropped_notice_after_a_line_cut_between_writes),
        cmocka_unit_test(test_unread_terminal_does_not_block_writes),
        cmocka_unit_test(test_pipe_room_taken_after_poll_does_not_block),
        cmocka_unit_test(test_writer_descriptors_end_with_their_thread),
        cmocka_unit_test(test_status_output),
        cmocka_unit_test(test_signals),
        cmocka_unit_test(test_python_wsgi_workers),
        cmocka_unit_test(test_python_stop_finishes_the_request_in_flight),
        cmocka_unit_test(test_python_max_requests_recycles),
        cmocka_unit_test(test_python_import_failure_backs_off),
    };
    if (argc > 1) /* one case (or a pattern) by name */
        cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
