/*
 * The io_uring backend's batched waits (uring.c's header says what they are for): the
 * activity windows, the backoff when batching gathers little, the comparison of batched and
 * plain waits by the loop thread's CPU per completion, and each loop turn's one
 * io_uring_enter, asking for as many completions as the load warrants. Owns struct
 * uring_state's window, batch and ctl fields. May call: liburing's ring, the loop's clock
 * and stats.
 */
#include "reactor/uring_int.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define BATCH_MAX            256u /* completions a batched wait asks for, at most */
#define BATCH_MIN_ACTIVE     16u  /* busy conns below which a wait is never batched */
#define BATCH_MIN_YIELD      4u   /* completions a batched wait must gather to go on batching */
#define BATCH_BACKOFF_MAX_MS 64u
/* The comparison of batched and plain waits (batch_choice): each tried this long, then the
 * cheaper kept this long; a trial with fewer completions than this says nothing. */
#define TRIAL_NS         UINT64_C(20000000)
#define HOLD_NS          UINT64_C(1000000000)
#define TRIAL_MIN_EVENTS 200u

static uint64_t thread_cpu_ns(const struct shmipc__loop *loop)
{
    struct timespec ts;
    if (loop->test_cpu_ns != NULL)
        return loop->test_cpu_ns(loop);
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void ctl_phase(struct shmipc__loop *loop, struct uring_state *s, int phase, uint64_t len)
{
    s->ctl = phase;
    s->ctl_start = loop->now_ns;
    s->ctl_until = loop->now_ns + len;
    s->ctl_cpu0 = thread_cpu_ns(loop);
    s->ctl_events0 = loop->stats.events;
}

/* Completions per second since the phase began. */
static double ctl_rate(const struct shmipc__loop *loop, const struct uring_state *s)
{
    uint64_t ns = loop->now_ns - s->ctl_start;
    return ns > 0 ? (double)(loop->stats.events - s->ctl_events0) * 1e9 / (double)ns : 0;
}

/* The loop thread's CPU ns per completion since the phase began; 0 with too few. */
static double ctl_cost(const struct shmipc__loop *loop, const struct uring_state *s)
{
    uint64_t events = loop->stats.events - s->ctl_events0;
    uint64_t cpu = thread_cpu_ns(loop);
    /* 0 is a failed clock read (at either end): not measured. */
    if (events < TRIAL_MIN_EVENTS || s->ctl_cpu0 == 0 || cpu <= s->ctl_cpu0)
        return 0;
    return (double)(cpu - s->ctl_cpu0) / (double)events;
}

/*
 * Whether a wait under batching load should be batched. Whether batching pays depends on
 * the machine (the cost of a wakeup against that of the timer a batched wait arms) and on
 * how many requests a plain wait already finds: so the loop measures. Under load, plain waits
 * for TRIAL_NS, then batched ones for TRIAL_NS, each timed by the thread's CPU clock per
 * completion. Batching is kept for HOLD_NS when the thread was busy at least half the plain
 * trial (below that, CPU is not what is short, and the latency batching adds is not worth
 * it), batching cost at least 10 % less per completion, and the completions kept coming at
 * 97 % of the plain trial's rate or more (clients that wait for their answers send less when
 * answers are held back: on a loaded host, where a 50 µs timer fires late, a closed loop
 * lost 16 % of its requests); else plain waits are. Then the comparison runs again. Load
 * that stops ends a trial unjudged.
 */
static int batch_choice(struct shmipc__loop *loop, struct uring_state *s)
{
    double cost;
    int busy;
    if (loop->batch_always)
        return 1;
    switch (s->ctl) {
    case CTL_START:
        ctl_phase(loop, s, CTL_TRY_PLAIN, TRIAL_NS);
        return 0;
    case CTL_TRY_PLAIN:
        if (loop->now_ns < s->ctl_until)
            return 0;
        s->cost_plain = ctl_cost(loop, s);
        s->rate_plain = ctl_rate(loop, s);
        ctl_phase(loop, s, CTL_TRY_BATCH, TRIAL_NS);
        return 1;
    case CTL_TRY_BATCH:
        if (loop->now_ns < s->ctl_until)
            return 1;
        cost = ctl_cost(loop, s);
        /* The plain trial's busy share: CPU per completion x completions per second. */
        busy = s->cost_plain * s->rate_plain / 1e9 >= 0.5;
        /* A fake CPU clock (tests) comes with real time, whose rate a test cannot steer. */
        s->ctl_batch = busy && s->cost_plain > 0 && cost > 0 && cost < s->cost_plain * 0.9 &&
                       (loop->test_cpu_ns != NULL || ctl_rate(loop, s) >= s->rate_plain * 0.97);
        loop->stats.batch_trials++;
        loop->stats.batch_idle += (uint64_t)!busy;
        loop->stats.batch_chosen += (uint64_t)s->ctl_batch;
        ctl_phase(loop, s, CTL_HOLD, HOLD_NS);
        return s->ctl_batch;
    default:
        if (loop->now_ns < s->ctl_until)
            return s->ctl_batch;
        s->ctl = CTL_START;
        return batch_choice(loop, s);
    }
}

/*
 * At the end of a window with batched waits: the receives it dispatched per batched wait. A
 * batched wait that gathers fewer than BATCH_MIN_YIELD cost its timer and its clients'
 * latency for little (clients that send rarely, or too few of them to keep requests in flight
 * while the others wait), so batching pauses: for 1 ms, twice as long after each such window
 * in a row (within a second of the last), up to BATCH_BACKOFF_MAX_MS. Counted per window, not
 * per wait: the kernel may post part of what a wait gathered only at the next enter.
 */
static void batch_judge(struct shmipc__loop *loop, struct uring_state *s)
{
    if (s->window_receives >= BATCH_MIN_YIELD * s->window_batched) {
        s->batch_backoff_ms = 1;
        return;
    }
    loop->stats.batch_backoffs++;
    if (loop->now_ns - s->batch_failed_ns > UINT64_C(1000000000))
        s->batch_backoff_ms = 1;
    s->batch_failed_ns = loop->now_ns;
    s->batch_resume_ns = loop->now_ns + (uint64_t)s->batch_backoff_ms * 1000000;
    if (s->batch_backoff_ms < BATCH_BACKOFF_MAX_MS)
        s->batch_backoff_ms *= 2;
}

/*
 * How many receive completions the next wait may gather: the conns that received in this
 * window or the previous one, when there are at least BATCH_MIN_ACTIVE of them and batching
 * has not been paying too little lately; else 0, a plain wait for one completion.
 */
static unsigned batch_target(struct shmipc__loop *loop, struct uring_state *s)
{
    uint64_t age = loop->now_ns - s->window_start_ns;
    unsigned active;
    if (age >= WINDOW_NS) {
        if (s->window_batched > 0)
            batch_judge(loop, s);
        s->window_batched = 0;
        s->window_receives = 0;
        /* The window's conns count for the next one too while traffic goes on (a receive
         * less than a window ago), however long the turns in between took. */
        s->last_active = loop->now_ns - s->last_rx_ns < WINDOW_NS ? s->window_active : 0;
        s->window_active = 0;
        s->window++;
        s->window_start_ns = loop->now_ns;
    }
    active = s->window_active > s->last_active ? s->window_active : s->last_active;
    if (loop->batch_us == 0 || active < BATCH_MIN_ACTIVE) {
        if (s->ctl == CTL_TRY_PLAIN || s->ctl == CTL_TRY_BATCH)
            s->ctl = CTL_START; /* the load went: a trial would compare unlike loads */
        return 0;
    }
    if (!batch_choice(loop, s) || loop->now_ns < s->batch_resume_ns)
        return 0;
    return active < BATCH_MAX ? active : BATCH_MAX;
}

/*
 * io_uring_submit_and_wait_timeout() with a wait for more than one completion and the
 * kernel's minimum timeout, which liburing 2.3 cannot ask for: publishes the queued SQEs as
 * liburing does, then makes the one enter. Returns what the enter returns, or -errno.
 */
int shmipc__uring_submit_and_wait(struct shmipc__loop *loop, struct uring_state *s,
                                  int64_t timeout_ns)
{
    struct io_uring_sq *sq = &s->ring.sq;
    struct io_uring_getevents_arg arg;
    struct __kernel_timespec ts;
    unsigned flags = IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG;
    unsigned wait_nr = 1, target = batch_target(loop, s), submit;
    int64_t batch_ns = (int64_t)loop->batch_us * 1000;
    long rc;

    if (sq->sqe_head != sq->sqe_tail) {
        sq->sqe_head = sq->sqe_tail;
        __atomic_store_n(sq->ktail, sq->sqe_tail, __ATOMIC_RELEASE);
    }
    submit = sq->sqe_tail - __atomic_load_n(sq->khead, __ATOMIC_ACQUIRE);
    memset(&arg, 0, sizeof arg);
    arg.sigmask_sz = _NSIG / 8;
    /* Completions already in the CQ (left by the previous turn's budget) are served now. */
    if (target > 0 && timeout_ns != 0 && io_uring_cq_ready(&s->ring) == 0) {
        /* The sends complete as they are submitted, mostly: their completions do not count
         * toward the batch. A send that waits for socket space instead makes the batch one
         * short, which the time bound covers. */
        wait_nr = s->sends_queued + target;
        s->window_batched++;
        if (timeout_ns > 0 && timeout_ns <= batch_ns)
            ; /* the first timer ends the wait before batch_us would */
        else if (s->min_timeout)
            arg.pad = loop->batch_us; /* min_wait_usec in kernel 6.12's layout */
        else
            timeout_ns = batch_ns;
        loop->stats.batched++;
    }
    s->sends_queued = 0;
    if (timeout_ns >= 0) {
        ts.tv_sec = timeout_ns / 1000000000;
        ts.tv_nsec = timeout_ns % 1000000000;
        arg.ts = (uint64_t)(uintptr_t)&ts;
    }
    if (s->ring_registered)
        flags |= IORING_ENTER_REGISTERED_RING;
    rc = syscall(__NR_io_uring_enter, s->ring_registered ? s->ring.enter_ring_fd : s->ring.ring_fd,
                 submit, wait_nr, flags, &arg, sizeof arg);
    return rc < 0 ? -errno : (int)rc;
}
