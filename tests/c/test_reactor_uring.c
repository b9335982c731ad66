/* Description: the io_uring backend: the shared connection suite with io_uring forced, the
 * multishot receive's re-arm after ENOBUFS, one io_uring_enter per keep-alive request, and
 * batched waits (SHMIPC_REACTOR_BATCH_US).
 * Exits 77 (skip) where the kernel or a seccomp filter refuses io_uring. */
#include "test_reactor_suite.h"

#include <sys/eventfd.h>
#include <sys/ioctl.h>

#include "reactor/uring_int.h" /* the loop's ring, to cancel a watch's poll behind its back */

/* 100 bytes, 10-byte buffers, a ring of 2: the multishot receive runs dry and is re-armed. */
static void rearm_after_enobufs(void **state)
{
    struct shmipc__loop_opts o = suite_opts;
    struct shmipc__loop_stats st;
    (void)state;

    o.recv_buf_size = 10;
    o.recv_buf_count = 2;
    st = sink_100_bytes(&o);
    assert_true(st.enobufs >= 1);
    assert_true(st.recv_rearm >= st.enobufs);
}

/* A keep-alive exchange costs one enter that submits the response and waits for the next
 * request; the test pumps with a timeout, so allow the turns that time out in between. */
static void one_enter_per_request(void **state)
{
    struct shmipc__loop *loop = new_loop();
    struct shmipc__conn *c;
    struct shmipc__loop_stats a, b;
    struct srv s;
    int sp[2];
    (void)state;

    srv_init(&s, loop, SRV_ECHO);
    srv_adopt_pair(&s, sp, &c);
    assert_true(shmipc__loop_run_once(loop, 0) >= 0);
    shmipc__loop_stats(loop, &a);
    for (int i = 0; i < 100; i++) {
        char buf[4];
        write_all(sp[1], "req", 3);
        /* Turn 1 receives and queues the echo; turn 2 submits it (and finds the send's
         * completion or waits for it). */
        PUMP_UNTIL(loop, atomic_load(&s.sent_ok) == i + 1);
        read_exact(sp[1], buf, 3);
    }
    shmipc__loop_stats(loop, &b);
    print_message("io_uring: 100 exchanges: %llu enters, %llu extra submits, %llu completions\n",
                  (unsigned long long)(b.waits - a.waits),
                  (unsigned long long)(b.submits - a.submits),
                  (unsigned long long)(b.events - a.events));
    assert_int_equal(b.submits - a.submits, 0);
    assert_true(b.waits - a.waits <= 300);
    /* One busy connection: nothing to gather, the wait returns at its first completion. */
    assert_int_equal(b.batched - a.batched, 0);
    close(sp[1]);
    PUMP_UNTIL(loop, atomic_load(&s.ended) == 1);
    shmipc__loop_free(loop);
}

/* ---- a watch whose poll the kernel ended ---- */

struct deaf {
    int calls;
    uint64_t total;
};

static void on_deaf_efd(struct shmipc__watch *w, int fd, unsigned events, void *data)
{
    struct deaf *d = data;
    uint64_t v;
    (void)w;
    (void)events;
    d->calls++;
    if (read(fd, &v, sizeof v) == sizeof v)
        d->total += v;
}

/*
 * The poll behind a watch ends with an error the backend did not ask for (here -ECANCELED:
 * the test cancels it by fd on the loop's ring, as the kernel ends a multishot it could not
 * post on some versions). The watch stays alive: its owner is called (it may have missed an
 * event) and the poll is armed again, so the next write is seen. Before, the error was only
 * logged and the watch never fired again (a front's worker session went deaf).
 */
static void watch_survives_a_cancelled_poll(void **state)
{
    struct shmipc__loop *loop = new_loop();
    struct shmipc__watch *w;
    struct deaf d = {0, 0};
    uint64_t one = 1;
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    (void)state;

    assert_true(efd >= 0);
    assert_int_equal(shmipc__watch_new(loop, efd, SHMIPC__WATCH_READ, on_deaf_efd, &d, &w), 0);
    assert_true(shmipc__loop_run_once(loop, 0) >= 0); /* the poll is submitted */
    struct io_uring *ring = &((struct uring_state *)loop->be_state)->ring;
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
    assert_non_null(sqe);
    io_uring_prep_cancel_fd(sqe, efd, 0);
    io_uring_sqe_set_data64(sqe, 0); /* names no watch: the loop drops its completion */
    sqe->flags |= IOSQE_CQE_SKIP_SUCCESS;
    int calls = d.calls;
    PUMP_UNTIL(loop, d.calls > calls); /* the cancelled poll's completion reaches the owner */
    assert_int_equal(d.total, 0);
    for (uint64_t round = 1; round <= 3; round++) {
        assert_int_equal(write(efd, &one, sizeof one), (ssize_t)sizeof one);
        PUMP_UNTIL(loop, d.total == round);
    }
    shmipc__watch_free(w);
    shmipc__loop_free(loop);
    close(efd);
}

/* ---- closing: no SQE may name a closed fd ---- */

static void *free_loop_thread(void *arg)
{
    shmipc__loop_free(arg);
    return NULL;
}

/*
 * A conn's fd is closed by an IORING_OP_CLOSE behind the SQEs that name it (issue 18): it
 * stays open until the next wait submits them, and only then is its number free. A loop
 * freed from another thread, which submits nothing, still closes what it was asked to.
 */
static void close_waits_for_the_sqes(void **state)
{
    struct shmipc__loop *loop = new_loop();
    struct shmipc__conn *c;
    struct srv s;
    int sp[2], fd;
    char buf[8];
    pthread_t t;
    (void)state;

    srv_init(&s, loop, SRV_ECHO);
    srv_adopt_pair(&s, sp, &c);
    assert_true(shmipc__loop_run_once(loop, 0) >= 0);
    write_all(sp[1], "bye", 3);
    PUMP_UNTIL(loop, atomic_load(&s.sent_ok) == 1); /* the receive is armed again */
    fd = shmipc__conn_fd(c);
    /* The echo's send SQE is queued, not submitted, when the conn closes. */
    assert_int_equal(shmipc__conn_send(c, "late", 4, NULL, NULL), 0);
    shmipc__conn_close(c);
    assert_true(fcntl(fd, F_GETFD) >= 0);
    assert_true(shmipc__loop_run_once(loop, 0) >= 0);
    assert_int_equal(fcntl(fd, F_GETFD), -1);
    assert_int_equal(errno, EBADF);
    read_exact(sp[1], buf, 3);
    close(sp[1]);

    /* Closed, never submitted: the loop is freed off its thread. */
    srv_adopt_pair(&s, sp, &c);
    fd = shmipc__conn_fd(c);
    shmipc__conn_close(c);
    assert_true(fcntl(fd, F_GETFD) >= 0);
    assert_int_equal(pthread_create(&t, NULL, free_loop_thread, loop), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(fcntl(fd, F_GETFD), -1);
    assert_int_equal(read(sp[1], buf, sizeof buf), 0);
    close(sp[1]);
}

/* ---- batched waits ---- */

#define BATCH_CONNS 64

static void request_text(char out[8], int conn, int round)
{
    snprintf(out, 8, "%03u%04u", (unsigned)conn % 1000, (unsigned)round % 10000);
}

/* Like wrk: a request on every connection, then every answer read back, `rounds` times. */
static void lockstep_rounds(const int *fds, int n, int rounds)
{
    for (int r = 0; r < rounds; r++) {
        char req[8], resp[8];
        for (int i = 0; i < n; i++) {
            request_text(req, i, r);
            write_all(fds[i], req, 7);
        }
        for (int i = 0; i < n; i++) {
            request_text(req, i, r);
            read_exact(fds[i], resp, 7);
            assert_memory_equal(resp, req, 7);
        }
    }
}

/* One request at a time, each answered before the next goes out on the next connection. */
static void one_at_a_time(const int *fds, int n, int rounds)
{
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < n; i++) {
            char req[8], resp[8];
            request_text(req, i, r);
            write_all(fds[i], req, 7);
            read_exact(fds[i], resp, 7);
            assert_memory_equal(resp, req, 7);
        }
}

/*
 * An echo loop on its own thread with BATCH_CONNS adopted socketpairs, driven by `drive`;
 * then one more request on one connection after the traffic stopped, which must be answered
 * (a batched wait with no timer armed must not sleep for good). Returns the loop's counters.
 */
static struct shmipc__loop_stats drive_echo(const struct shmipc__loop_opts *o,
                                            void (*drive)(const int *, int, int), int rounds)
{
    struct shmipc__loop *loop = new_loop_with(o);
    struct shmipc__loop_stats st;
    struct srv s;
    int fds[BATCH_CONNS];
    pthread_t t;
    char resp[8];

    srv_init(&s, loop, SRV_ECHO);
    for (int i = 0; i < BATCH_CONNS; i++) {
        struct shmipc__conn *c;
        int sp[2];
        srv_adopt_pair(&s, sp, &c);
        fds[i] = sp[1];
    }
    assert_int_equal(pthread_create(&t, NULL, loop_thread, loop), 0);
    drive(fds, BATCH_CONNS, rounds);
    write_all(fds[5], "last.", 5);
    read_exact(fds[5], resp, 5);
    assert_memory_equal(resp, "last.", 5);
    join_loop(loop, t);
    shmipc__loop_stats(loop, &st);
    for (int i = 0; i < BATCH_CONNS; i++)
        close(fds[i]);
    shmipc__loop_free(loop);
    return st;
}

/* drive_echo with every eligible wait batched (no comparison), its counters printed. */
static struct shmipc__loop_stats drive_batched(void (*drive)(const int *, int, int), int rounds,
                                               const char *what)
{
    struct shmipc__loop_opts o = suite_opts;
    struct shmipc__loop_stats st;
    o.batch_always = 1;
    st = drive_echo(&o, drive, rounds);
    print_message("%s, %d conns x %d: %llu waits, %llu batched, %llu backoffs\n", what, BATCH_CONNS,
                  rounds, (unsigned long long)st.waits, (unsigned long long)st.batched,
                  (unsigned long long)st.batch_backoffs);
    return st;
}

/* 64 connections in lockstep: waits gather several completions, and every echo is right. */
static void batched_waits_gather(void **state)
{
    struct shmipc__loop_stats st = drive_batched(lockstep_rounds, 50, "lockstep");
    (void)state;
    assert_true(st.batched > 0);
}

/*
 * The loop's clock in these tests: 2 µs per completion dispatched. On the real clock a trial
 * (TRIAL_NS) starts over whenever the load pauses for a window (WINDOW_NS, 1 ms), as it does
 * on a loaded machine whenever the scheduler stalls the client or the loop, and the
 * comparison may not come for seconds (issue 18, item 7). On this clock time moves only with
 * the load: a trial is 10,000 completions, a window 500, whatever the scheduling. A turn
 * dispatches at most 256 completions (max_events), 512 µs, so a window still holds several
 * turns; the waits' bounds are real time, as in production.
 */
#define NS_PER_COMPLETION 2000u

static uint64_t clock_by_completions(const struct shmipc__loop *loop)
{
    struct shmipc__loop_stats st;
    shmipc__loop_stats(loop, &st);
    return UINT64_C(1000000000) + st.events * NS_PER_COMPLETION;
}

struct spaced {
    const int *fds;
    int n;      /* connections */
    int rounds; /* requests on each */
};

/* Requests on the connections in turn, 40 µs apart (spun, not slept: a sleep's timer slack
 * would space them further), `rounds` times. */
static void *spaced_writer(void *arg)
{
    const struct spaced *sp = arg;
    for (int r = 0; r < sp->rounds; r++)
        for (int i = 0; i < sp->n; i++) {
            struct timespec t0, t;
            char req[8];
            request_text(req, i, r);
            write_all(sp->fds[i], req, 7);
            clock_gettime(CLOCK_MONOTONIC, &t0);
            do
                clock_gettime(CLOCK_MONOTONIC, &t);
            while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 40000);
        }
    return NULL;
}

/* Bytes waiting to be read on the client sockets `fds`. */
static size_t echoed(const int *fds, int n)
{
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        int avail = 0;
        assert_int_equal(ioctl(fds[i], FIONREAD, &avail), 0);
        total += (size_t)avail;
    }
    return total;
}

/*
 * 400 requests over 40 connections, 40 µs apart: about 25 connections busy per millisecond.
 * Plain waits return for about each request, and once more for its answer's completion
 * (about 700 waits here); batched ones gather many: at most 200 waits, counting those before
 * the loop has seen enough busy connections. The loop runs on clock_by_completions, so a
 * writer stalled by the scheduler for a window (1 ms) does not make the loop forget its busy
 * connections and wait plainly again. Each turn is given 2 s: the batched waits must end by
 * their 10 ms window, or sooner when enough came, never by that bound: no turn that
 * dispatched something may have taken it.
 */
static void batched_wait_gathers_spaced_requests(void **state)
{
    struct shmipc__loop_opts o = suite_opts;
    struct shmipc__loop *loop;
    struct shmipc__loop_stats st;
    struct srv s;
    int fds[40];
    struct spaced sp = {fds, 40, 10};
    pthread_t t;
    uint64_t start, took, longest = 0;
    int failed = 0, stalled = 0;
    (void)state;

    o.batch_us = 10000;
    o.batch_always = 1;
    o.test_clock_ns = clock_by_completions;
    loop = new_loop_with(&o);
    srv_init(&s, loop, SRV_ECHO);
    for (int i = 0; i < sp.n; i++) {
        struct shmipc__conn *c;
        int pair[2];
        srv_adopt_pair(&s, pair, &c);
        fds[i] = pair[1];
    }
    assert_true(shmipc__loop_run_once(loop, 0) >= 0);
    assert_int_equal(pthread_create(&t, NULL, spaced_writer, &sp), 0);
    start = mono_ms();
    /* Done when every echo is back at the clients (two requests may share a receive, and so
     * an echo, so the server's send count cannot tell). No assertion before the writer,
     * which uses this frame, is joined (its writes cannot block: 70 bytes a socket). */
    while (!failed && !stalled && echoed(fds, sp.n) < (size_t)sp.n * sp.rounds * 7) {
        uint64_t t0 = mono_ms();
        int rc = shmipc__loop_run_once(loop, 2000);
        failed = rc < 0;
        if (rc > 0 && mono_ms() - t0 > longest)
            longest = mono_ms() - t0;
        stalled = mono_ms() - start > 60000;
    }
    took = mono_ms() - start;
    shmipc__loop_stats(loop, &st);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_false(failed);
    assert_false(stalled);
    for (int i = 0; i < sp.n; i++) {
        for (int r = 0; r < sp.rounds; r++) {
            char req[8], resp[8];
            request_text(req, i, r);
            read_exact(fds[i], resp, 7);
            assert_memory_equal(resp, req, 7);
        }
        close(fds[i]);
    }
    print_message("400 spaced requests: %llu waits (%llu batched, %llu backoffs) in %llu ms, "
                  "longest turn %llu ms\n",
                  (unsigned long long)st.waits, (unsigned long long)st.batched,
                  (unsigned long long)st.batch_backoffs, (unsigned long long)took,
                  (unsigned long long)longest);
    assert_true(st.batched > 0);
    assert_true(st.waits <= 200);
    assert_true(longest < 2000);
    shmipc__loop_free(loop);
}

/* Off by the knob or by the option: no wait asks for a batch. */
static void batching_can_be_off(void **state)
{
    struct shmipc__loop_opts o = suite_opts;
    struct shmipc__loop_stats st;
    (void)state;

    assert_int_equal(setenv("SHMIPC_REACTOR_BATCH_US", "0", 1), 0);
    st = drive_echo(&suite_opts, lockstep_rounds, 20);
    assert_int_equal(unsetenv("SHMIPC_REACTOR_BATCH_US"), 0);
    assert_int_equal(st.batched, 0);
    o.batch_us = -1;
    st = drive_echo(&o, lockstep_rounds, 20);
    assert_int_equal(st.batched, 0);
}

/*
 * Many connections, but one request in flight at a time: a batched wait would sit out its
 * window for a single request, so after such a wait batching pauses (and the pause doubles).
 * Whether the loop sees 16 busy connections in a millisecond depends on the machine's speed
 * (sanitizers slow it); when it did, most waits must still have been plain ones.
 */
static void sparse_requests_back_off(void **state)
{
    struct shmipc__loop_stats st = drive_batched(one_at_a_time, 30, "one at a time");
    (void)state;
    if (st.batched > 0)
        assert_true(st.batch_backoffs > 0);
    assert_true(st.batched * 5 <= st.waits);
}

/* ---- the adaptive choice: batched against plain waits, by CPU per completion ---- */

struct load {
    int fds[BATCH_CONNS];
    atomic_int stop;
    atomic_int done;
    atomic_int bad; /* a write or read failed, or an echo was wrong */
};

static int load_io(int fd, char *buf, size_t len, int writing)
{
    while (len > 0) {
        ssize_t n = writing ? write(fd, buf, len) : read(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Lockstep rounds on every connection until told to stop, or until a socket fails (the test
 * shuts them down to end a load that cannot go on). No cmocka assertion here: it would bail
 * out of this thread, not the test's. */
static void *load_thread(void *arg)
{
    struct load *l = arg;
    for (int r = 0; !atomic_load(&l->stop) && !atomic_load(&l->bad); r++) {
        char req[8], resp[8];
        for (int i = 0; i < BATCH_CONNS && !atomic_load(&l->bad); i++) {
            request_text(req, i, r);
            if (load_io(l->fds[i], req, 7, 1) != 0)
                atomic_store(&l->bad, 1);
        }
        for (int i = 0; i < BATCH_CONNS && !atomic_load(&l->bad); i++) {
            request_text(req, i, r);
            if (load_io(l->fds[i], resp, 7, 0) != 0 || memcmp(resp, req, 7) != 0)
                atomic_store(&l->bad, 1);
        }
    }
    atomic_store(&l->done, 1);
    return NULL;
}

/* Fake CPU clocks for the comparison: 1 µs per completion plus 200 µs per plain wait (a
 * machine where wakeups are dear), 20 µs per completion plus 200 µs per batched wait (where
 * timers are; busy enough to be judged on cost), or 1 ns per completion (a loop that is
 * nearly idle, though batching is cheaper there too). With 500,000 completions a second on
 * clock_by_completions, the first two are busy all the time, the third 0.5 % at most. (The
 * loop does not check the completion rate when the CPU clock is a test's.) */
static uint64_t plain_dear(const struct shmipc__loop *loop)
{
    struct shmipc__loop_stats st;
    shmipc__loop_stats(loop, &st);
    return st.events * 1000 + (st.waits - st.batched) * 200000;
}

static uint64_t batched_dear(const struct shmipc__loop *loop)
{
    struct shmipc__loop_stats st;
    shmipc__loop_stats(loop, &st);
    return st.events * 20000 + st.batched * 200000;
}

static uint64_t nearly_idle(const struct shmipc__loop *loop)
{
    struct shmipc__loop_stats st;
    shmipc__loop_stats(loop, &st);
    return st.events + (st.waits - st.batched) * 10;
}

/* Completions that span 100 ms on clock_by_completions: inside the hold after a comparison. */
#define AFTER_COMPARISON (100000000u / NS_PER_COMPLETION)

/*
 * Runs the lockstep load until the loop has compared batched and plain waits once, then
 * AFTER_COMPARISON completions more (inside the hold that follows). Returns the counters at
 * the comparison in *at and at the end. Nothing asserts until the load thread is joined (it
 * uses this frame); the 60 s bound on real time only catches a loop that no longer serves.
 */
static struct shmipc__loop_stats adaptive_run(uint64_t (*cpu)(const struct shmipc__loop *),
                                              struct shmipc__loop_stats *at)
{
    struct shmipc__loop_opts o = suite_opts;
    struct shmipc__loop *loop;
    struct shmipc__loop_stats st;
    struct load l;
    struct srv s;
    pthread_t t;
    uint64_t deadline;
    int failed = 0, stalled = 0;

    o.test_cpu_ns = cpu;
    o.test_clock_ns = clock_by_completions;
    loop = new_loop_with(&o);
    srv_init(&s, loop, SRV_ECHO);
    memset(&l, 0, sizeof l);
    memset(at, 0, sizeof *at);
    for (int i = 0; i < BATCH_CONNS; i++) {
        struct shmipc__conn *c;
        int pair[2];
        srv_adopt_pair(&s, pair, &c);
        l.fds[i] = pair[1];
    }
    assert_int_equal(pthread_create(&t, NULL, load_thread, &l), 0);
    deadline = mono_ms() + 60000;
    while (!failed && !stalled && !atomic_load(&l.done) && at->batch_trials == 0) {
        failed = shmipc__loop_run_once(loop, 100) < 0;
        stalled = mono_ms() > deadline;
        shmipc__loop_stats(loop, at);
    }
    shmipc__loop_stats(loop, &st);
    while (!failed && !stalled && !atomic_load(&l.done) &&
           st.events - at->events < AFTER_COMPARISON) {
        failed = shmipc__loop_run_once(loop, 100) < 0;
        stalled = mono_ms() > deadline;
        shmipc__loop_stats(loop, &st);
    }
    /* The load finishes its round, served by the loop; a loop that cannot serve it has its
     * sockets shut down under the load thread instead. */
    atomic_store(&l.stop, 1);
    deadline = mono_ms() + 10000;
    while (!failed && !atomic_load(&l.done) && mono_ms() < deadline)
        failed = shmipc__loop_run_once(loop, 10) < 0;
    if (!atomic_load(&l.done))
        for (int i = 0; i < BATCH_CONNS; i++)
            shutdown(l.fds[i], SHUT_RDWR);
    assert_int_equal(pthread_join(t, NULL), 0);
    for (int i = 0; i < BATCH_CONNS; i++)
        close(l.fds[i]);
    shmipc__loop_free(loop);
    print_message("compared after %llu waits (%llu batched); then %llu more (%llu batched)\n",
                  (unsigned long long)at->waits, (unsigned long long)at->batched,
                  (unsigned long long)(st.waits - at->waits),
                  (unsigned long long)(st.batched - at->batched));
    assert_false(failed);
    assert_false(atomic_load(&l.bad));
    if (stalled)
        fail_msg("no comparison and hold within 60 s: %llu completions, %llu trials",
                 (unsigned long long)st.events, (unsigned long long)st.batch_trials);
    assert_true(st.events - at->events >= AFTER_COMPARISON);
    return st;
}

/* Plain waits dear: batching wins the comparison and goes on. */
static void adaptive_keeps_cheaper_batching(void **state)
{
    struct shmipc__loop_stats at, st = adaptive_run(plain_dear, &at);
    (void)state;
    assert_int_equal(at.batch_trials, 1);
    assert_int_equal(at.batch_chosen, 1);
    assert_int_equal(at.batch_idle, 0);
    assert_true(at.batched > 0); /* the trial itself */
    assert_true(st.batched > at.batched);
}

/* Batched waits dear: the comparison keeps plain waits, none batched during the hold. */
static void adaptive_drops_dearer_batching(void **state)
{
    struct shmipc__loop_stats at, st = adaptive_run(batched_dear, &at);
    (void)state;
    assert_int_equal(at.batch_trials, 1);
    assert_int_equal(at.batch_chosen, 0);
    assert_int_equal(at.batch_idle, 0); /* lost on cost, not for an idle loop */
    assert_true(at.batched > 0);
    assert_int_equal(st.batched, at.batched);
    assert_true(st.waits > at.waits);
}

/* A loop busy less than half the time keeps plain waits even when batching costs less. */
static void adaptive_idle_loop_stays_plain(void **state)
{
    struct shmipc__loop_stats at, st = adaptive_run(nearly_idle, &at);
    (void)state;
    assert_int_equal(at.batch_trials, 1);
    assert_int_equal(at.batch_chosen, 0);
    assert_int_equal(at.batch_idle, 1);
    assert_int_equal(st.batched, at.batched);
}

/* An argument runs only the tests whose names match it (cmocka's filter, * allowed). */
int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        SUITE_TESTS,
        cmocka_unit_test(rearm_after_enobufs),
        cmocka_unit_test(one_enter_per_request),
        cmocka_unit_test(close_waits_for_the_sqes),
        cmocka_unit_test(watch_survives_a_cancelled_poll),
        cmocka_unit_test(batched_waits_gather),
        cmocka_unit_test(batched_wait_gathers_spaced_requests),
        cmocka_unit_test(batching_can_be_off),
        cmocka_unit_test(sparse_requests_back_off),
        cmocka_unit_test(adaptive_keeps_cheaper_batching),
        cmocka_unit_test(adaptive_drops_dearer_batching),
        cmocka_unit_test(adaptive_idle_loop_stays_plain),
    };
    struct shmipc__loop *probe = NULL;
    int rc;

    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    unsetenv("SHMIPC_REACTOR_BACKEND");
    unsetenv("SHMIPC_REACTOR_BATCH_US");
    suite_opts.backend = SHMIPC__BACKEND_IO_URING;
    rc = shmipc__loop_new(&suite_opts, &probe);
    if (rc != 0) {
        printf("SKIP: io_uring refused here: %s\n", shmipc_error_detail());
        return 77;
    }
    shmipc__loop_free(probe);
    return cmocka_run_group_tests_name("io_uring", tests, NULL, NULL) != 0;
}
