/* Description: the loop itself: knobs and options, the io_uring -> epoll fallback, timers,
 * stop from another thread, readiness watches (on both backends), and SO_REUSEPORT workers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "shmipc.h"
#include "reactor/loop.h"

static int uring_available;

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void clear_env(void)
{
    unsetenv("SHMIPC_REACTOR_BACKEND");
    unsetenv("SHMIPC_RX_EPOLL");
    unsetenv("SHMIPC_WORKERS");
    unsetenv("SHMIPC_REACTOR_BATCH_US");
}

static int teardown_env(void **state)
{
    (void)state;
    clear_env();
    return 0;
}

/* A loop on the backend of the running group, or a skipped test. */
static struct shmipc__loop *group_loop(void **state)
{
    enum shmipc__backend_kind kind = *(enum shmipc__backend_kind *)*state;
    struct shmipc__loop_opts o = {.backend = kind};
    struct shmipc__loop *loop = NULL;
    int rc;
    if (kind == SHMIPC__BACKEND_IO_URING && !uring_available)
        skip();
    rc = shmipc__loop_new(&o, &loop);
    if (rc != 0)
        fail_msg("loop_new: %s: %s", shmipc_errname(rc), shmipc_error_detail());
    return loop;
}

#define assert_refused(rc, code, text)                                                             \
    do {                                                                                           \
        assert_int_equal((rc), (code));                                                            \
        if (strstr(shmipc_error_detail(), (text)) == NULL)                                         \
            fail_msg("detail \"%s\" does not mention \"%s\"", shmipc_error_detail(), (text));      \
    } while (0)

/* ---- knobs and options ---- */

static void knobs_are_validated(void **state)
{
    struct shmipc__loop_opts o = {0};
    struct shmipc__loop *loop = NULL;
    (void)state;

    assert_int_equal(setenv("SHMIPC_REACTOR_BACKEND", "kqueue", 1), 0);
    assert_refused(shmipc__loop_new(NULL, &loop), SHMIPC_EINVAL, "SHMIPC_REACTOR_BACKEND=kqueue");
    assert_null(loop);
    assert_int_equal(setenv("SHMIPC_REACTOR_BACKEND", "epoll", 1), 0);
    assert_int_equal(setenv("SHMIPC_RX_EPOLL", "yes", 1), 0);
    assert_refused(shmipc__loop_new(NULL, &loop), SHMIPC_EINVAL, "SHMIPC_RX_EPOLL=yes");
    assert_int_equal(unsetenv("SHMIPC_RX_EPOLL"), 0);

    assert_int_equal(shmipc__loop_new(NULL, &loop), 0);
    assert_string_equal(shmipc__loop_backend_name(loop), "epoll");
    shmipc__loop_free(loop);

    /* Options override the knob. */
    if (uring_available) {
        o.backend = SHMIPC__BACKEND_IO_URING;
        assert_int_equal(shmipc__loop_new(&o, &loop), 0);
        assert_string_equal(shmipc__loop_backend_name(loop), "io_uring");
        shmipc__loop_free(loop);
    }
    assert_int_equal(setenv("SHMIPC_REACTOR_BACKEND", "io_uring", 1), 0);
    o.backend = SHMIPC__BACKEND_EPOLL;
    assert_int_equal(shmipc__loop_new(&o, &loop), 0);
    assert_string_equal(shmipc__loop_backend_name(loop), "epoll");
    shmipc__loop_free(loop);

    o.recv_buf_count = 3;
    assert_refused(shmipc__loop_new(&o, &loop), SHMIPC_EINVAL, "recv_buf_count");
    o.recv_buf_count = 65536;
    assert_refused(shmipc__loop_new(&o, &loop), SHMIPC_EINVAL, "recv_buf_count");
    o.recv_buf_count = 0;
    o.backend = (enum shmipc__backend_kind)9;
    assert_refused(shmipc__loop_new(&o, &loop), SHMIPC_EINVAL, "backend");

    /* The batching window: microseconds in 0..10000. */
    o.backend = SHMIPC__BACKEND_EPOLL;
    o.batch_us = 10001;
    assert_refused(shmipc__loop_new(&o, &loop), SHMIPC_EINVAL, "batch_us");
    o.batch_us = 0;
    {
        const char *bad[] = {"abc", "-1", "10001", "50us", "99999999999999999999"};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            assert_int_equal(setenv("SHMIPC_REACTOR_BATCH_US", bad[i], 1), 0);
            assert_refused(shmipc__loop_new(&o, &loop), SHMIPC_EINVAL, "SHMIPC_REACTOR_BATCH_US");
            assert_null(loop);
        }
    }
    assert_int_equal(setenv("SHMIPC_REACTOR_BATCH_US", "0", 1), 0);
    assert_int_equal(shmipc__loop_new(&o, &loop), 0);
    shmipc__loop_free(loop);
    assert_int_equal(setenv("SHMIPC_REACTOR_BATCH_US", "10000", 1), 0);
    assert_int_equal(shmipc__loop_new(&o, &loop), 0);
    shmipc__loop_free(loop);
}

static void auto_prefers_io_uring(void **state)
{
    struct shmipc__loop *loop = NULL;
    (void)state;
    assert_int_equal(shmipc__loop_new(NULL, &loop), 0);
    assert_string_equal(shmipc__loop_backend_name(loop), uring_available ? "io_uring" : "epoll");
    shmipc__loop_free(loop);
}

/* Set-up refused as Docker's seccomp (EPERM), an old or stripped kernel (ENOSYS) or a memlock
 * limit (ENOMEM) would refuse it: auto runs epoll, a loop that works. */
static void fallback_auto_runs_epoll(void **state)
{
    static const int errs[] = {EPERM, ENOSYS, ENOMEM};
    (void)state;
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
        struct shmipc__loop_opts o = {.backend = SHMIPC__BACKEND_AUTO,
                                      .test_uring_setup_errno = errs[i]};
        struct shmipc__loop *loop = NULL;
        assert_int_equal(shmipc__loop_new(&o, &loop), 0);
        assert_string_equal(shmipc__loop_backend_name(loop), "epoll");
        assert_int_equal(shmipc__loop_run_once(loop, 0), 0);
        shmipc__loop_free(loop);
    }
    /* The same through the knob. */
    {
        struct shmipc__loop_opts o = {.test_uring_setup_errno = EPERM};
        struct shmipc__loop *loop = NULL;
        assert_int_equal(setenv("SHMIPC_REACTOR_BACKEND", "auto", 1), 0);
        assert_int_equal(shmipc__loop_new(&o, &loop), 0);
        assert_string_equal(shmipc__loop_backend_name(loop), "epoll");
        shmipc__loop_free(loop);
    }
}

/* An explicit io_uring request fails instead, with a code and a detail that say why. */
static void fallback_not_for_explicit_io_uring(void **state)
{
    struct shmipc__loop_opts o = {.backend = SHMIPC__BACKEND_IO_URING,
                                  .test_uring_setup_errno = EPERM};
    struct shmipc__loop *loop = NULL;
    (void)state;
    assert_refused(shmipc__loop_new(&o, &loop), SHMIPC_EACCES, "io_uring (requested)");
    assert_non_null(strstr(shmipc_error_detail(), "Operation not permitted"));
    assert_null(loop);
    o.test_uring_setup_errno = ENOSYS;
    assert_refused(shmipc__loop_new(&o, &loop), SHMIPC_ENOTSUP, "io_uring");
    o.backend = SHMIPC__BACKEND_DEFAULT;
    assert_int_equal(setenv("SHMIPC_REACTOR_BACKEND", "io_uring", 1), 0);
    assert_refused(shmipc__loop_new(&o, &loop), SHMIPC_ENOTSUP, "io_uring");
}

/* Other set-up failures are real errors, even for auto. */
static void fallback_not_for_other_errors(void **state)
{
    struct shmipc__loop_opts o = {.backend = SHMIPC__BACKEND_AUTO,
                                  .test_uring_setup_errno = EMFILE};
    struct shmipc__loop *loop = NULL;
    (void)state;
    assert_refused(shmipc__loop_new(&o, &loop), SHMIPC_EMFILE, "io_uring");
}

/* ---- timers ---- */

struct fired {
    int order[8];
    int n;
};

struct tagged {
    struct shmipc__timer t;
    struct fired *f;
    int tag;
};

static void record(struct shmipc__timer *t)
{
    struct tagged *x = t->data;
    x->f->order[x->f->n++] = x->tag;
}

static void timers_fire_in_order(void **state)
{
    struct shmipc__loop *loop = group_loop(state);
    struct fired f = {{0}, 0};
    struct tagged x[6];
    static const uint64_t ms[6] = {30, 10, 20, 10, 15, 5};
    uint64_t start = mono_ms();

    for (int i = 0; i < 6; i++) {
        x[i].f = &f;
        x[i].tag = i;
        shmipc__timer_init(loop, &x[i].t, record, &x[i]);
        assert_false(shmipc__timer_active(&x[i].t));
        assert_int_equal(shmipc__timer_start(&x[i].t, ms[i]), 0);
        assert_true(shmipc__timer_active(&x[i].t));
    }
    shmipc__timer_stop(&x[4].t); /* cancelled: never fires */
    shmipc__timer_stop(&x[4].t); /* twice is fine */
    assert_false(shmipc__timer_active(&x[4].t));
    assert_int_equal(shmipc__timer_start(&x[5].t, 25), 0); /* restarted: moves */
    while (f.n < 5) {
        assert_true(mono_ms() - start < 5000);
        assert_true(shmipc__loop_run_once(loop, -1) >= 0);
    }
    assert_true(mono_ms() - start >= 30);
    /* 10 ms twice, in start order, then 20, 25 (restarted), 30. */
    assert_int_equal(f.order[0], 1);
    assert_int_equal(f.order[1], 3);
    assert_int_equal(f.order[2], 2);
    assert_int_equal(f.order[3], 5);
    assert_int_equal(f.order[4], 0);
    assert_int_equal(shmipc__loop_run_once(loop, 20), 0);
    assert_int_equal(f.n, 5);
    for (int i = 0; i < 6; i++)
        assert_false(shmipc__timer_active(&x[i].t));
    shmipc__loop_free(loop);
}

static void restart_at_zero(struct shmipc__timer *t)
{
    int *n = t->data;
    (*n)++;
    assert_int_equal(shmipc__timer_start(t, 0), 0);
}

/* A timer restarting itself at 0 ms fires once per turn; the turn does not spin on it. */
static void zero_timer_runs_once_per_turn(void **state)
{
    struct shmipc__loop *loop = group_loop(state);
    struct shmipc__timer t;
    int n = 0;
    shmipc__timer_init(loop, &t, restart_at_zero, &n);
    assert_int_equal(shmipc__timer_start(&t, 0), 0);
    for (int i = 1; i <= 3; i++) {
        assert_int_equal(shmipc__loop_run_once(loop, -1), 1);
        assert_int_equal(n, i);
    }
    shmipc__timer_stop(&t);
    shmipc__loop_free(loop);
}

/* ---- stop ---- */

struct ticker {
    struct shmipc__timer t;
    atomic_int ticks;
};

static void tick(struct shmipc__timer *t)
{
    struct ticker *k = t->data;
    atomic_fetch_add(&k->ticks, 1);
    shmipc__timer_start(t, 1);
}

static void *run_thread(void *arg)
{
    return (void *)(intptr_t)shmipc__loop_run(arg);
}

static void stop_from_another_thread(void **state)
{
    struct shmipc__loop *loop = group_loop(state);
    struct ticker k;
    pthread_t th;
    void *rc;
    uint64_t t0;

    /* A stop that comes first makes run return at once. */
    shmipc__loop_stop(loop);
    assert_int_equal(shmipc__loop_run(loop), 0);

    atomic_init(&k.ticks, 0);
    shmipc__timer_init(loop, &k.t, tick, &k);
    assert_int_equal(shmipc__timer_start(&k.t, 1), 0);
    assert_int_equal(pthread_create(&th, NULL, run_thread, loop), 0);
    while (atomic_load(&k.ticks) < 3)
        usleep(1000);
    t0 = mono_ms();
    shmipc__loop_stop(loop);
    assert_int_equal(pthread_join(th, &rc), 0);
    assert_int_equal((int)(intptr_t)rc, 0);
    assert_true(mono_ms() - t0 < 2000);
    shmipc__loop_free(loop);
}

/* An idle loop blocked in its wait wakes up for a stop. */
static void stop_wakes_a_blocked_wait(void **state)
{
    struct shmipc__loop *loop = group_loop(state);
    pthread_t th;
    void *rc;
    uint64_t t0 = mono_ms();
    assert_int_equal(pthread_create(&th, NULL, run_thread, loop), 0);
    usleep(50000);
    shmipc__loop_stop(loop);
    assert_int_equal(pthread_join(th, &rc), 0);
    assert_int_equal((int)(intptr_t)rc, 0);
    assert_true(mono_ms() - t0 < 2000);
    shmipc__loop_free(loop);
}

/* ---- watches ---- */

struct watched {
    int calls;
    uint64_t total;
};

static void on_eventfd(struct shmipc__watch *w, int fd, unsigned events, void *data)
{
    struct watched *x = data;
    uint64_t v;
    (void)w;
    assert_true((events & SHMIPC__WATCH_READ) != 0);
    x->calls++;
    while (read(fd, &v, sizeof v) == sizeof v)
        x->total += v;
}

static void watch_eventfd(void **state)
{
    struct shmipc__loop *loop = group_loop(state);
    struct shmipc__watch *w, *dup;
    struct watched x = {0, 0};
    uint64_t one = 1;
    uint64_t start = mono_ms();
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);

    assert_true(efd >= 0);
    assert_int_equal(shmipc__watch_new(loop, efd, SHMIPC__WATCH_READ, on_eventfd, &x, &w), 0);
    assert_int_equal(shmipc__loop_handles(loop), 1);
    assert_refused(shmipc__watch_new(loop, efd, SHMIPC__WATCH_READ, on_eventfd, &x, &dup),
                   SHMIPC_EEXIST, "already open");
    assert_null(dup);
    assert_int_equal(shmipc__loop_run_once(loop, 0), 0);
    for (uint64_t round = 1; round <= 3; round++) {
        assert_int_equal(write(efd, &one, sizeof one), (ssize_t)sizeof one);
        while (x.total < round) {
            assert_true(mono_ms() - start < 5000);
            assert_true(shmipc__loop_run_once(loop, 100) >= 0);
        }
    }
    assert_int_equal(x.calls, 3);
    shmipc__watch_free(w);
    assert_int_equal(shmipc__loop_handles(loop), 0);
    assert_int_equal(write(efd, &one, sizeof one), (ssize_t)sizeof one);
    assert_true(shmipc__loop_run_once(loop, 20) >= 0);
    assert_int_equal(x.calls, 3);
    shmipc__loop_free(loop);
    close(efd);
}

/* ---- workers ---- */

static _Thread_local char thread_mark;

#define WORKERS        2
#define WORKER_CLIENTS 40

struct wstate {
    atomic_int conns[WORKERS];
    atomic_int wrong_thread;
    atomic_uintptr_t thread[WORKERS];
    atomic_int signals_blocked[WORKERS]; /* SIGTERM, SIGINT, SIGHUP, SIGCHLD, SIGUSR1 */
    atomic_int faults_open[WORKERS];     /* SIGBUS, SIGSEGV */
};

struct wconn {
    struct wstate *ws;
    unsigned index;
};

static struct wconn wconns[WORKERS];

static void w_sent(struct shmipc__conn *c, int status, void *data)
{
    (void)c;
    (void)status;
    free(data);
}

static void w_check_thread(struct shmipc__conn *c)
{
    struct wconn *wc = shmipc__conn_data(c);
    if (atomic_load(&wc->ws->thread[wc->index]) != (uintptr_t)&thread_mark)
        atomic_fetch_add(&wc->ws->wrong_thread, 1);
}

static void w_on_data(struct shmipc__conn *c, const void *data, size_t len)
{
    void *copy = malloc(len);
    w_check_thread(c);
    if (copy == NULL)
        return;
    memcpy(copy, data, len);
    if (shmipc__conn_send(c, copy, len, w_sent, copy) != 0)
        free(copy);
}

static void w_on_end(struct shmipc__conn *c, int status)
{
    (void)status;
    w_check_thread(c);
    shmipc__conn_close(c);
}

static const struct shmipc__conn_cbs w_cbs = {w_on_data, w_on_end, NULL};

static void w_on_accept(struct shmipc__acceptor *a, struct shmipc__conn *c, void *data)
{
    struct wconn *wc = data;
    (void)a;
    w_check_thread(c);
    atomic_fetch_add(&wc->ws->conns[wc->index], 1);
}

/* A read with SO_RCVTIMEO fails with EINTR when io_uring task work interrupts it. */
static ssize_t read_retry(int fd, void *buf, size_t len)
{
    ssize_t n;
    do
        n = read(fd, buf, len);
    while (n < 0 && errno == EINTR);
    return n;
}

static int w_setup(struct shmipc__loop *loop, int fd, unsigned index, void *data)
{
    struct shmipc__acceptor *acc;
    wconns[index].ws = data;
    wconns[index].index = index;
    atomic_store(&wconns[index].ws->thread[index], (uintptr_t)&thread_mark);
    sigset_t cur;
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    atomic_store(&wconns[index].ws->signals_blocked[index],
                 sigismember(&cur, SIGTERM) && sigismember(&cur, SIGINT) &&
                     sigismember(&cur, SIGHUP) && sigismember(&cur, SIGCHLD) &&
                     sigismember(&cur, SIGUSR1));
    atomic_store(&wconns[index].ws->faults_open[index],
                 !sigismember(&cur, SIGBUS) && !sigismember(&cur, SIGSEGV));
    return shmipc__acceptor_open(loop, fd, &w_cbs, w_on_accept, &wconns[index], &acc);
}

static void workers_share_a_port(void **state)
{
    struct wstate ws;
    struct shmipc__workers_opts o = {
        .count = WORKERS, .host = "127.0.0.1", .setup = w_setup, .data = &ws};
    struct shmipc__workers *w = NULL;
    int fds[WORKER_CLIENTS];
    (void)state;

    memset(&ws, 0, sizeof ws);
    assert_int_equal(shmipc__workers_start(&o, &w), 0);
    assert_int_equal(shmipc__workers_count(w), WORKERS);
    assert_true(shmipc__workers_port(w) > 0);
    assert_true(atomic_load(&ws.thread[0]) != atomic_load(&ws.thread[1]));
    for (int i = 0; i < WORKER_CLIENTS; i++) {
        struct sockaddr_in sin = {.sin_family = AF_INET,
                                  .sin_port = htons(shmipc__workers_port(w))};
        struct timeval tv = {.tv_sec = 5};
        char buf[4];
        sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(fds[i] >= 0);
        assert_int_equal(setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
        assert_int_equal(connect(fds[i], (struct sockaddr *)&sin, sizeof sin), 0);
        assert_int_equal(write(fds[i], "abc", 3), 3);
        assert_int_equal(read_retry(fds[i], buf, 3), 3);
        assert_memory_equal(buf, "abc", 3);
    }
    for (int i = 0; i < WORKER_CLIENTS; i++)
        close(fds[i]);
    /* The kernel spread the connections: 2^-39 odds that one worker got them all. */
    assert_int_equal(atomic_load(&ws.conns[0]) + atomic_load(&ws.conns[1]), WORKER_CLIENTS);
    assert_true(atomic_load(&ws.conns[0]) > 0);
    assert_true(atomic_load(&ws.conns[1]) > 0);
    shmipc__workers_free(w);
    assert_int_equal(atomic_load(&ws.wrong_thread), 0);
    /* Process signals stay with the application's threads: one delivered to a reactor thread
     * woke none of the application's waits (Python runs its handlers on its main thread only:
     * python -m shmipc.serve --in-process then slept through its SIGTERM). The faults stay
     * open for the SIGBUS guard. */
    for (int i = 0; i < WORKERS; i++) {
        assert_int_equal(atomic_load(&ws.signals_blocked[i]), 1);
        assert_int_equal(atomic_load(&ws.faults_open[i]), 1);
    }
}

static int failing_setup(struct shmipc__loop *loop, int fd, unsigned index, void *data)
{
    (void)loop;
    (void)data;
    close(fd);
    return index == 1 ? SHMIPC_EADDRINUSE : 0;
}

static void workers_count_and_failures(void **state)
{
    struct shmipc__workers_opts o = {.count = 3, .host = "127.0.0.1", .setup = failing_setup};
    struct shmipc__workers *w = NULL;
    unsigned n;
    int fd;
    (void)state;

    assert_int_equal(shmipc__workers_default(&n), 0);
    assert_int_equal(n, (unsigned)sysconf(_SC_NPROCESSORS_ONLN));
    assert_int_equal(setenv("SHMIPC_WORKERS", "3", 1), 0);
    assert_int_equal(shmipc__workers_default(&n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(setenv("SHMIPC_WORKERS", "0", 1), 0);
    assert_refused(shmipc__workers_default(&n), SHMIPC_EINVAL, "SHMIPC_WORKERS=0");
    assert_int_equal(setenv("SHMIPC_WORKERS", "two", 1), 0);
    assert_refused(shmipc__workers_default(&n), SHMIPC_EINVAL, "SHMIPC_WORKERS=two");

    /* One worker's setup fails: start fails with its code and detail, nothing is left. */
    assert_int_equal(shmipc__workers_start(&o, &w), SHMIPC_EADDRINUSE);
    assert_null(w);

    assert_refused(shmipc__tcp_listen("localhost", 0, 0, 0, &fd), SHMIPC_EINVAL, "numeric");
    assert_int_equal(shmipc__tcp_listen("::1", 0, 0, 0, &fd), 0);
    assert_true(shmipc__sock_port(fd) > 0);
    close(fd);
}

/* An argument runs only the tests whose names match it (cmocka's filter, * allowed). */
int main(int argc, char **argv)
{
    static enum shmipc__backend_kind epoll = SHMIPC__BACKEND_EPOLL;
    static enum shmipc__backend_kind uring = SHMIPC__BACKEND_IO_URING;
    const struct CMUnitTest loop_tests[] = {
        cmocka_unit_test_teardown(knobs_are_validated, teardown_env),
        cmocka_unit_test_teardown(auto_prefers_io_uring, teardown_env),
        cmocka_unit_test_teardown(fallback_auto_runs_epoll, teardown_env),
        cmocka_unit_test_teardown(fallback_not_for_explicit_io_uring, teardown_env),
        cmocka_unit_test_teardown(fallback_not_for_other_errors, teardown_env),
        cmocka_unit_test_teardown(workers_share_a_port, teardown_env),
        cmocka_unit_test_teardown(workers_count_and_failures, teardown_env),
    };
    const struct CMUnitTest epoll_tests[] = {
        cmocka_unit_test_prestate(timers_fire_in_order, &epoll),
        cmocka_unit_test_prestate(zero_timer_runs_once_per_turn, &epoll),
        cmocka_unit_test_prestate(stop_from_another_thread, &epoll),
        cmocka_unit_test_prestate(stop_wakes_a_blocked_wait, &epoll),
        cmocka_unit_test_prestate(watch_eventfd, &epoll),
    };
    const struct CMUnitTest uring_tests[] = {
        cmocka_unit_test_prestate(timers_fire_in_order, &uring),
        cmocka_unit_test_prestate(zero_timer_runs_once_per_turn, &uring),
        cmocka_unit_test_prestate(stop_from_another_thread, &uring),
        cmocka_unit_test_prestate(stop_wakes_a_blocked_wait, &uring),
        cmocka_unit_test_prestate(watch_eventfd, &uring),
    };
    struct shmipc__loop_opts o = {.backend = SHMIPC__BACKEND_IO_URING};
    struct shmipc__loop *probe = NULL;
    int failed;

    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    clear_env();
    uring_available = shmipc__loop_new(&o, &probe) == 0;
    if (!uring_available)
        printf("io_uring refused here (%s): its tests are skipped\n", shmipc_error_detail());
    shmipc__loop_free(probe);
    failed = cmocka_run_group_tests_name("loop", loop_tests, NULL, NULL);
    failed += cmocka_run_group_tests_name("epoll", epoll_tests, NULL, NULL);
    failed += cmocka_run_group_tests_name("io_uring", uring_tests, NULL, NULL);
    return failed != 0;
}
