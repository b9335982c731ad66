/*
 * The wait engine: how a thread that needs data waits for it. The processor spins first
 * (spin_turn_locked, shmipc__session_spin: adaptive budgets, the CPU count, the number of
 * spinners), then sleeps in poll or epoll_wait; the followers wait on `cond`.
 *
 * May call: common/, shm/queue, and receive dispatch (process_locked) through session_int.h.
 */
#include "ipc/session_int.h"

#include "common/clock.h"
#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "ipc/proto.h"
#include "ipc/sockio.h"
#include "ipc/v4probe.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/*
 * V4 eventfd and polling sessions: one epoll_wait on the session's set, waiting up to
 * `timeout_ms` (-1: forever). Returns how many fds fired (0 when none), *socket set when the
 * socket did, or -errno. Waits with mu released when `timeout_ms` is not 0.
 */
int shmipc__session_wait_set_locked(shmipc_session *s, int timeout_ms, int *socket)
{
    struct epoll_event ev[3]; /* the socket, the eventfd or timer, the kick: all at once */
    if (timeout_ms != 0)
        shmipc__session_unlock(s);
    int n = epoll_wait(s->event_fd, ev, 3, timeout_ms);
    int err = errno;
    if (timeout_ms != 0)
        shmipc__session_lock(s);
    *socket = 0;
    for (int i = 0; i < n; i++) {
        uint64_t ticks;
        if (ev[i].data.fd == s->fd)
            *socket = 1;
        else if (ev[i].data.fd == s->timer_fd || ev[i].data.fd == s->kick_fd)
            (void)!read(ev[i].data.fd, &ticks, sizeof ticks);
    }
    return n < 0 ? -err : n;
}

/*
 * Waits for something to happen, by processing the socket when no other thread does or by
 * waiting for the thread that does. Under mu. Returns 0 (look again), SHMIPC_ETIMEDOUT, or
 * the code that ended the session.
 */
/*
 * How long the processor may sleep: until the deadline (NULL: forever), and in polling mode
 * no longer than the negotiated interval, after which it drains the queue.
 */
static struct timespec *wait_span(const shmipc_session *s, uint64_t deadline)
{
    static _Thread_local struct timespec ts;
    uint64_t span = UINT64_MAX;
    if (deadline != 0) {
        uint64_t now = shmipc__now_ns();
        span = deadline > now ? deadline - now : 0;
    }
    if (s->wakeup == SHMIPC_WAKEUP_POLLING && span > (uint64_t)s->interval_us * 1000u)
        span = (uint64_t)s->interval_us * 1000u;
    if (span == UINT64_MAX)
        return NULL;
    ts.tv_sec = (time_t)(span / 1000000000u);
    ts.tv_nsec = (long)(span % 1000000000u);
    return &ts;
}

/* wait_span() in milliseconds for epoll_wait, rounded up; -1 for no limit. */
static int span_ms(const shmipc_session *s, uint64_t deadline)
{
    const struct timespec *ts = wait_span(s, deadline);
    if (ts == NULL)
        return -1;
    uint64_t ms = (uint64_t)ts->tv_sec * 1000u + ((uint64_t)ts->tv_nsec + 999999u) / 1000000u;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

/*
 * The spin cap of a new config: SHMIPC_SPIN_US (read once per process), 50 µs by default.
 * Caps below one cross-process wakeup (13-15 µs on a quiet VM, more under load) leave both
 * peers asleep; 20 µs sat at that edge under load, 50 µs clears it (docs/benchmarks.md).
 */
uint32_t shmipc__spin_default_us(void)
{
    static uint32_t cached = UINT32_MAX;
    uint32_t v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v == UINT32_MAX) {
        const char *env = shmipc__getenv("SHMIPC_SPIN_US");
        long us = env != NULL ? strtol(env, NULL, 10) : 50;
        v = us < 0 ? 0 : (uint32_t)(us > (long)SHMIPC__SPIN_US_MAX ? SHMIPC__SPIN_US_MAX : us);
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* The most a waiting processor spins before it sleeps: the config's spin_us. */
static uint64_t spin_ns(const shmipc_session *s)
{
    return (uint64_t)s->cfg.spin_us * 1000u;
}

/*
 * The least budget of an adaptive spin: about one cross-process wakeup. A peer that answers in
 * 1-2 µs as a rule and later now and then (work between two messages) would find a 2 µs spin
 * given up and pay a wakeup each time (the p99: V3 32-35 µs with a 2 µs floor, 7-10 with this).
 */
#define SPIN_MIN_NS 10000u

/*
 * This wait's spin budget: twice the recent average wait for data (so most waits like the
 * recent ones end inside the spin), at least SPIN_MIN_NS, at most the cap. A session starts
 * at the cap. A peer that answers in 1 µs makes a failed spin cost 10 µs, not the whole
 * cap; one that answers in 15 µs keeps a 30 µs budget (if the cap allows). Under mu.
 */
static uint64_t spin_budget(const shmipc_session *s)
{
    uint64_t cap = spin_ns(s);
    if (s->spin_gap_ns == 0)
        return cap;
    uint64_t b = 2 * s->spin_gap_ns;
    if (b < SPIN_MIN_NS)
        b = SPIN_MIN_NS;
    return b < cap ? b : cap;
}

/*
 * Feeds one observed wait for data (from the start of a wait to the data, in the spin or
 * after the sleep that followed it) into the average, 1/8 weight. A sample is clipped at
 * twice the cap: an idle minute must not keep the budget at the cap for the next hundred
 * waits once traffic resumes (the cap already covers anything longer). Under mu.
 */
static void spin_observe(shmipc_session *s, uint64_t gap)
{
    uint64_t cap = spin_ns(s);
    if (gap > 2 * cap)
        gap = 2 * cap;
    s->spin_gap_ns = s->spin_gap_ns == 0 ? gap : s->spin_gap_ns - s->spin_gap_ns / 8 + gap / 8;
    if (s->spin_gap_ns == 0)
        s->spin_gap_ns = 1;
}

/*
 * Whether the machine has a second CPU: on one, spinning only delays the peer. (Not this
 * thread's affinity: a process pinned to one CPU may well have its peer pinned to another.)
 */
static long online_cpus(void)
{
    static long cpus;
    long n = __atomic_load_n(&cpus, __ATOMIC_RELAXED);
    if (n == 0) {
        n = sysconf(_SC_NPROCESSORS_ONLN);
        n = n > 0 ? n : 2;
        __atomic_store_n(&cpus, n, __ATOMIC_RELAXED);
    }
    return n;
}

static int have_two_cpus(void)
{
    return online_cpus() != 1;
}

/*
 * Threads of this process spinning right now. With more of them than CPUs, a spinner that
 * pauses keeps a CPU from a thread that may be the one about to produce what another
 * spinner waits for: they yield instead (sched_yield), which lets any runnable thread in.
 */
static int spinners;

/*
 * Whether this wait spins first. Not while recent spins came up empty: on a loaded machine
 * the peer is not running when we wait for it, and a spin burns the CPU it needs. Each
 * failure in a row doubles the number of waits that skip the spin (1, 3, 7 .. 63); one
 * success restores spinning on every wait. Under mu.
 */
static int spin_now(shmipc_session *s)
{
    if (spin_ns(s) == 0 || !have_two_cpus())
        return 0;
    if (s->spin_skip > 0) {
        s->spin_skip--;
        return 0;
    }
    return 1;
}

/* Records how a spin went, for spin_now(). Under mu. */
static void spin_done(shmipc_session *s, int found)
{
    if (found) {
        s->spin_fails = 0;
        return;
    }
    if (s->spin_fails < 6)
        s->spin_fails++;
    s->spin_skip = (1u << s->spin_fails) - 1;
}

/*
 * After a spin that found nothing and the sleep that followed (`began`: when the spin
 * started; `gave_up`: when it ended): the spin counts as a failure only when the peer took
 * much longer than the cap (more than 4x), so a peer that answers just after the spin ends
 * keeps spinning on, with a budget grown to the wait it took.
 */
static void spin_judge(shmipc_session *s, uint64_t began, uint64_t gave_up)
{
    if (gave_up == 0)
        return;
    uint64_t now = shmipc__now_ns();
    spin_observe(s, now - began);
    spin_done(s, now - gave_up < 4 * spin_ns(s));
}

/* Our receive queue's working flag in shared memory (the peer's CAS, our spin and clear). */
static uint32_t *recv_flag(const shmipc_session *s)
{
    return (uint32_t *)(void *)(s->qp.recv.hdr + s->qp.recv.flag_at);
}

/* How long after a drain a non-blocking look trusts it (shmipc__session_fresh_locked). */
#define FRESH_NS 50000u

int shmipc__session_fresh_locked(shmipc_session *s)
{
    const uint32_t *flag = recv_flag(s);
    if (s->drained_ns == 0 || shmipc__queue_size(&s->qp.recv) != 0 ||
        __atomic_load_n(flag, __ATOMIC_SEQ_CST) != 0)
        return 0;
    return shmipc__now_ns() - s->drained_ns < FRESH_NS;
}

/* Spins that found work may skip reading the socket this many times in a row, at most. */
#define SPIN_UNREAD_MAX 64u

/*
 * One step of a spin loop: the CPU's pause hint, which frees the pipeline for the sibling
 * hyperthread and keeps the loop from flooding the memory system with reads. Nothing where
 * there is no such hint.
 */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("isb" ::: "memory");
#endif
}

/*
 * Spins from `start` for up to `budget` ns (and never past `deadline`) with our receive
 * queue's working flag set, watching the queue. Returns 1 when elements arrived, 0 when the
 * spin gave up with the flag cleared again and the queue found empty. *woken tells whether
 * the peer may have sent a wakeup since our last turn (see below). The caller holds the
 * processing role.
 */
static int spin_for_work(shmipc_session *s, uint64_t start, uint64_t budget, uint64_t deadline,
                         int *woken)
{
    uint32_t *flag = recv_flag(s);
    uint64_t end = start + budget;
    int found = 0;
    if (deadline != 0 && deadline < end)
        end = deadline;
    /*
     * Set before the first look (seq_cst, as the producer's CAS): a put after this sees the
     * flag and sends no wakeup, and we see its element in the loop or in the final look.
     * Exchanged, not stored: every turn of ours ends with the flag cleared, so a 1 here is the
     * peer's CAS (shmipc__queue_mark_working), and that peer sent a wakeup (a Polling
     * message on the socket, or an eventfd write) that is ours to read.
     */
    *woken = __atomic_exchange_n(flag, 1, __ATOMIC_SEQ_CST) != 0;
    int crowd = __atomic_add_fetch(&spinners, 1, __ATOMIC_RELAXED) > online_cpus();
    for (unsigned i = 0;; i++) {
        shmipc__queue_prefetch_next(&s->qp.recv);
        if (shmipc__queue_size(&s->qp.recv) != 0) {
            found = 1;
            break;
        }
        if ((i & 63) == 63) {
            if (shmipc__now_ns() >= end)
                break;
            crowd = __atomic_load_n(&spinners, __ATOMIC_RELAXED) > online_cpus();
        }
        if (crowd)
            sched_yield();
        else
            cpu_relax();
    }
    __atomic_sub_fetch(&spinners, 1, __ATOMIC_RELAXED);
    if (found)
        return 1;
    /* Clear and look again: a put that saw the flag set sent no wakeup. */
    return shmipc__queue_mark_not_working(&s->qp.recv) != 0;
}

/*
 * One spin turn, when no other thread processes and spinning is on for this wait: before
 * sleeping, spin a little with our working flag set. A peer that answers within the spin
 * sees the flag and sends no wakeup, and we take its message with no system call on either
 * side. Then the flag is cleared and the queue looked at once more (the consumer's usual
 * Dekker step), so no wakeup is lost when the spin gives up. Under mu (dropped while
 * spinning). Returns 1 when elements arrived and were processed, 0 when nothing came (with
 * *gave_up set to when the spin ended, if it ran), or the code that ended the session.
 */
static int spin_turn_locked(shmipc_session *s, uint64_t deadline, uint64_t now, uint64_t *began,
                            uint64_t *gave_up)
{
    if (s->processing || s->wakeup == SHMIPC_WAKEUP_POLLING || shmipc__session_err(s) ||
        !spin_now(s))
        return 0;
    s->processing = 1;
    uint64_t budget = spin_budget(s);
    *began = now != 0 ? now : shmipc__now_ns();
    shmipc__session_unlock(s);
    int woken = 0;
    int found = spin_for_work(s, *began, budget, deadline, &woken);
    shmipc__session_lock(s);
    int rc = 0, events = 0;
    if (found) {
        /* One clock read for both: the wait's length, and when the drain below began. */
        uint64_t at = shmipc__now_ns();
        spin_observe(s, at - *began);
        spin_done(s, 1);
        /*
         * Drain. Then read the socket (and, V4, the eventfd) only when the peer sent us a
         * wakeup, or after SPIN_UNREAD_MAX turns that skipped it: a system call costs about as
         * much as the rest of a round trip, and in a ping-pong answered within the spin the
         * peer sends none. Read it when it did, or its wakeups would pile up unread until its
         * writes block; and now and then regardless, so a control message (StreamClose,
         * FallbackData) waits a bounded number of turns while the queue keeps us busy. When
         * the queue goes quiet, the sleep's poll sees the socket at once.
         */
        if (shmipc__session_err(s) == 0) {
            unsigned closes = s->queue_closes;
            rc = shmipc__session_finish_turn_locked(
                s, shmipc__session_drain_queue_locked(s, &events), events);
            /* The drain's start: a fresh look (FRESH_NS) trusts it a little less long. */
            if (rc >= 0)
                s->drained_ns = at;
            /*
             * A close element is read with the socket too, in this turn (mu held): a stream
             * on the socket sends its last FallbackData there and then its close as an
             * element, which finds our flag set and sends no wakeup. The close is applied
             * after that read (shmipc__session_apply_closes_locked), or the stream would end
             * before that data, or never (a close for a stream the data has yet to open).
             */
            if (rc >= 0 &&
                (woken || s->queue_closes != closes || ++s->spin_unread >= SPIN_UNREAD_MAX)) {
                s->spin_unread = 0;
                rc = shmipc__session_process_locked(s);
            }
        }
        shmipc__session_apply_closes_locked(s);
    } else {
        *gave_up = shmipc__now_ns();
    }
    s->processing = 0;
    if (!found)
        return 0;
    pthread_cond_broadcast(&s->cond);
    return rc < 0 ? rc : 1;
}

/*
 * The wait of a timeout of 0 (SHMIPC__DEADLINE_NOW): processes what is pending at once, the
 * socket and the queue, without sleeping or spinning. Returns 0 when that handled something
 * (the caller looks again, and calls here again: each turn takes only what had arrived), else
 * SHMIPC_ETIMEDOUT, as a timeout that expired. While another thread holds the processing role
 * nothing can be taken without waiting for it, so that times out too. Under mu.
 */
static int wait_now_locked(shmipc_session *s)
{
    if (s->processing)
        return shmipc__fail(SHMIPC_ETIMEDOUT, "timed out (timeout 0: another thread processes)");
    s->processing = 1;
    int rc = shmipc__session_process_locked(s);
    s->processing = 0;
    pthread_cond_broadcast(&s->cond);
    if (rc < 0)
        return shmipc__session_err(s) ? shmipc__session_err(s) : rc;
    return rc > 0 ? 0 : shmipc__fail(SHMIPC_ETIMEDOUT, "timed out (timeout 0: nothing pending)");
}

int shmipc__session_wait_locked(shmipc_session *s, uint64_t deadline)
{
    if (shmipc__session_err(s))
        return shmipc__session_err(s);
    if (deadline == SHMIPC__DEADLINE_NOW)
        return wait_now_locked(s);
    /*
     * Events for other streams end a wait too; the caller's deadline holds across them. The
     * clock read here is also the spin's start (one read less per wait).
     */
    uint64_t now = deadline != 0 ? shmipc__now_ns() : 0;
    if (deadline != 0 && now >= deadline)
        return shmipc__fail(SHMIPC_ETIMEDOUT, "timed out");
    uint64_t began = 0, gave_up = 0; /* when a spin started, and when it found nothing */
    int rc = spin_turn_locked(s, deadline, now, &began, &gave_up);
    if (rc != 0)
        return rc < 0 ? rc : 0;
    if (shmipc__session_err(s))
        return shmipc__session_err(s);
    if (!s->processing) {
        s->processing = 1;
        int socket = 0, err = 0;
        if (s->wakeup == SHMIPC_WAKEUP_SOCKET) {
            /*
             * Not a blocking recv even without a deadline (one system call less): a stream
             * shut down from another thread must be able to wake us through kick_fd.
             */
            shmipc__session_unlock(s);
            struct pollfd p[2] = {{.fd = s->fd, .events = POLLIN},
                                  {.fd = s->kick_fd, .events = POLLIN}};
            rc = ppoll(p, 2, wait_span(s, deadline), NULL);
            err = errno;
            shmipc__session_lock(s);
            socket = rc > 0 && p[0].revents != 0;
            if (rc > 0 && p[1].revents != 0) {
                uint64_t kicks;
                (void)!read(s->kick_fd, &kicks, sizeof kicks);
            }
        } else if ((rc = shmipc__session_wait_set_locked(s, span_ms(s, deadline), &socket)) < 0) {
            err = -rc;
            rc = -1;
        }
        /* In polling mode a quiet interval is the cue to look at the queue. */
        int poll_due = rc == 0 && s->wakeup == SHMIPC_WAKEUP_POLLING &&
                       (deadline == 0 || shmipc__now_ns() < deadline);
        if (rc > 0 || poll_due)
            rc = shmipc__session_process_fds_locked(s, socket);
        else if (rc == 0)
            rc = shmipc__fail(SHMIPC_ETIMEDOUT, "timed out");
        else if (err == EINTR)
            rc = shmipc__fail(SHMIPC_EINTR, "interrupted by a signal");
        else
            rc = shmipc__session_fail_locked(s, shmipc__fail_errno(err, "session: poll"));
        spin_judge(s, began, gave_up);
        s->processing = 0;
        pthread_cond_broadcast(&s->cond);
        return rc < 0 ? rc : 0;
    }
    if (deadline == 0) {
        pthread_cond_wait(&s->cond, &s->mu);
        return 0;
    }
    struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000u),
                          .tv_nsec = (long)(deadline % 1000000000u)};
    if (pthread_cond_timedwait(&s->cond, &s->mu, &ts) == ETIMEDOUT)
        return shmipc__fail(SHMIPC_ETIMEDOUT, "timed out");
    return 0;
}

int shmipc__session_spin(shmipc_session *s)
{
    uint64_t began = 0, gave_up = 0, now = 0;
    shmipc__session_lock(s);
    s->refs++; /* as process: a close meanwhile frees the session when we leave */
    if (s->loop_spin_gave_up != 0) {
        /*
         * The last spin gave up and the caller slept on fileno() since. When elements came
         * meanwhile, this call is the loop's next turn after them, and the wait ended about
         * now: judged as a blocking read's (spin_judge), no failure when the peer answered
         * within 4x the cap, so a loop in a ping-pong keeps spinning rather than skipping its
         * next 1-63 spins and paying a wakeup on each of those round trips. When nothing came
         * (the loop woke for something else), a failure, as before: a busy loop with an idle
         * peer must not spin a budget on every turn.
         */
        now = shmipc__now_ns();
        int came = s->rx_elems != s->loop_spin_rx;
        if (came)
            spin_observe(s, now - s->loop_spin_began);
        spin_done(s, came && now - s->loop_spin_gave_up < 4 * spin_ns(s));
        s->loop_spin_gave_up = 0;
    }
    int rc = shmipc__session_err(s) ? shmipc__session_err(s)
                                    : spin_turn_locked(s, 0, now, &began, &gave_up);
    if (rc == 0 && gave_up != 0) {
        s->loop_spin_began = began;
        s->loop_spin_gave_up = gave_up;
        s->loop_spin_rx = s->rx_elems;
    }
    if (rc < 0)
        rc = shmipc__session_ended(s);
    shmipc__session_unlock(s);
    shmipc__session_release(s);
    return rc;
}

int shmipc__session_process(shmipc_session *s)
{
    int rc = 0;
    shmipc__session_lock(s);
    s->refs++; /* as accept_stream: a close meanwhile frees the session when we leave */
    if (!s->processing) {
        s->processing = 1;
        rc = shmipc__session_process_all_locked(s); /* edge-triggered callers see no more */
        s->processing = 0;
        pthread_cond_broadcast(&s->cond);
    } else if (shmipc__session_err(s)) {
        rc = shmipc__session_err(s);
    }
    if (rc < 0)
        rc = shmipc__session_ended(s);
    shmipc__session_unlock(s);
    shmipc__session_release(s);
    return rc;
}
