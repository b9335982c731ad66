#include "shm/guard.h"

#include "common/env.h"
#include "common/log.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* A slot's state. Only the handler moves it past INTACT. */
enum { INTACT, REPLACING, REPLACED, FAILED };

struct shmipc__guard_slot {
    _Atomic uintptr_t base; /* 0: free */
    _Atomic size_t len;
    _Atomic int state;
    _Atomic int wake_fd; /* a socket the handler shuts down when it hits, or -1 */
};

#define SLOTS_PER_BLOCK 256

struct block {
    struct shmipc__guard_slot slot[SLOTS_PER_BLOCK];
    struct block *_Atomic next;
};

static struct block first_block;
static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t knob_once = PTHREAD_ONCE_INIT;
static struct sigaction previous;
static atomic_int installed;

/* Handlers between their lookup and their last use of a slot: unregister waits for 0. */
static atomic_int in_flight;

/* The slot whose mapping holds `addr`, with the base and length that matched. */
static struct shmipc__guard_slot *find_slot(uintptr_t addr, uintptr_t *base_out, size_t *len_out)
{
    for (struct block *b = &first_block; b != NULL;
         b = atomic_load_explicit(&b->next, memory_order_acquire))
        for (int i = 0; i < SLOTS_PER_BLOCK; i++) {
            struct shmipc__guard_slot *s = &b->slot[i];
            uintptr_t base = atomic_load_explicit(&s->base, memory_order_acquire);
            size_t len = atomic_load_explicit(&s->len, memory_order_relaxed);
            if (base != 0 && addr >= base && addr - base < len) {
                *base_out = base;
                *len_out = len;
                return s;
            }
        }
    return NULL;
}

/*
 * What this thread is handing on, to catch loops. (1) A handler installed after ours that
 * chains back to ours while we chain to it calls us again from inside itself: same address,
 * same context, deeper stack. A handler that longjmps out leaves these values behind, which a
 * fresh fault does not match (its context is new). (2) A handler that re-raises (Python's
 * faulthandler restores the handler it replaced, ours, and calls raise()) leaves a SIGBUS
 * pending that comes back to us as SI_TKILL from our own pid: that one takes the default
 * action instead of going round again. Initial-exec TLS: the handler must not allocate it.
 */
static __thread struct {
    void *addr;
    void *ctx;
    uintptr_t sp;
    int reraised;
} passing __attribute__((tls_model("initial-exec")));

static void take_default_action(void)
{
    /*
     * Restore it and raise. Every signal is blocked while we run, so this one is delivered
     * (and kills) as the handler returns; a fault would also simply recur.
     */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGBUS, &dfl, NULL);
    raise(SIGBUS);
}

/* Hands a SIGBUS that is not ours to whoever had it before, or to the default action. */
static void pass_on(int sig, siginfo_t *info, void *ctx)
{
    volatile char here = 0;
    uintptr_t sp = (uintptr_t)&here;
    void *addr = info != NULL ? info->si_addr : NULL;
    int sent = info == NULL || info->si_code <= 0; /* kill(), raise(), sigqueue() */
    int loop = passing.sp != 0 && passing.addr == addr && passing.ctx == ctx && sp < passing.sp;
    if (sent && passing.reraised && info != NULL && info->si_code == SI_TKILL &&
        info->si_pid == getpid())
        loop = 1;
    passing.reraised = 0;
    if (sent && !(previous.sa_flags & SA_SIGINFO) && previous.sa_handler == SIG_IGN)
        return; /* ignored, as it was before us */
    int chained = (previous.sa_flags & SA_SIGINFO) ||
                  (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN);
    if (!chained || loop) {
        take_default_action();
        return;
    }
    void *old_addr = passing.addr, *old_ctx = passing.ctx;
    uintptr_t old_sp = passing.sp;
    passing.addr = addr;
    passing.ctx = ctx;
    passing.sp = sp;
    if (previous.sa_flags & SA_SIGINFO)
        previous.sa_sigaction(sig, info, ctx);
    else
        previous.sa_handler(sig);
    passing.addr = old_addr;
    passing.ctx = old_ctx;
    passing.sp = old_sp;
    sigset_t pending;
    passing.reraised = sigpending(&pending) == 0 && sigismember(&pending, SIGBUS);
}

/* Swaps private zero pages in for a whole mapping; -1 when that failed (then we pass on). */
static int replace_pages(struct shmipc__guard_slot *s, uintptr_t base, size_t len)
{
    int expect = INTACT;
    if (!atomic_compare_exchange_strong(&s->state, &expect, REPLACING))
        return expect == FAILED ? -1 : 0; /* REPLACING: another thread is at it; retry */
    /* MAP_NORESERVE: no commit charge that could fail under strict overcommit. */
    void *p = mmap((void *)base, len, PROT_READ | PROT_WRITE,
                   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        atomic_store(&s->state, FAILED);
        return -1;
    }
    atomic_store(&s->state, REPLACED);
    /* Wakes the session's processor wherever it sleeps: it sees the damage and ends. */
    int fd = atomic_load(&s->wake_fd);
    if (fd >= 0)
        shutdown(fd, SHUT_RDWR);
    return 0;
}

static void on_sigbus(int sig, siginfo_t *info, void *ctx)
{
    int saved_errno = errno;
    uintptr_t base = 0;
    size_t len = 0;
    int rc = -1;
    atomic_fetch_add(&in_flight, 1);
    /* si_code > 0: raised by a fault, not sent with kill() or raise(). */
    struct shmipc__guard_slot *s =
        info != NULL && info->si_code > 0 ? find_slot((uintptr_t)info->si_addr, &base, &len) : NULL;
    if (s != NULL)
        rc = replace_pages(s, base, len);
    atomic_fetch_sub(&in_flight, 1);
    if (rc < 0)
        pass_on(sig, info, ctx);
    errno = saved_errno;
}

/*
 * fork() (the fork rule, common/proc.h): a fork child's close of the sessions it inherited
 * unregisters their mappings, so the child needs the registry as a consistent, free copy. The
 * lock is taken before the fork and let go on both sides after it, as glibc does with malloc's
 * locks: a lock another thread of the parent held at the fork would be held for good in the
 * child, whose close then hung. A holder only makes system calls and allocates (nothing it
 * logs is logged under the lock), so the fork waits for it briefly.
 */
static void fork_prepare(void)
{
    pthread_mutex_lock(&registry_mu);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&registry_mu);
}

/*
 * The child has one thread, the one that forked, and it is in no handler of ours: a handler
 * another thread had in flight at the fork never finishes here, and would make every
 * unregister in the child wait for it forever.
 */
static void fork_child(void)
{
    atomic_store(&in_flight, 0);
    pthread_mutex_unlock(&registry_mu);
}

/* The knob, read once: SHMIPC_SIGBUS_GUARD=0 turns the guard off. */
static int wanted;

static void read_knob(void)
{
    const char *knob = shmipc__getenv("SHMIPC_SIGBUS_GUARD");
    wanted = knob == NULL || strcmp(knob, "0") != 0;
    if (knob != NULL && wanted && strcmp(knob, "1") != 0)
        SHMIPC__LOG(SHMIPC__LOG_WARN, "SHMIPC_SIGBUS_GUARD=\"%s\": use 0 or 1; guard stays on",
                    knob);
    /* Out of memory: no guard rather than fork children that may hang in their close. */
    if (wanted && pthread_atfork(fork_prepare, fork_parent, fork_child) != 0) {
        wanted = 0;
        SHMIPC__LOG(SHMIPC__LOG_WARN, "SIGBUS guard: pthread_atfork failed; guard off");
    }
}

/*
 * Puts our handler in front, keeping what was there as `previous`. Called at each
 * registration under registry_mu: a handler installed after ours (a test framework, Python's
 * faulthandler) is chained behind ours again from the next mapping on.
 */
static int install_locked(void)
{
    struct sigaction cur, sa;
    if (sigaction(SIGBUS, NULL, &cur) != 0)
        return -1;
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigbus)
        return 0;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    /* Nothing may interrupt the swap (another handler touching the same mapping would spin). */
    sigfillset(&sa.sa_mask);
    previous = cur;
    if (sigaction(SIGBUS, &sa, NULL) != 0)
        return -1;
    atomic_store(&installed, 1);
    return 0;
}

int shmipc__guard_active(void)
{
    return atomic_load(&installed);
}

static struct shmipc__guard_slot *claim_locked(void)
{
    struct block *b = &first_block;
    for (;;) {
        for (int i = 0; i < SLOTS_PER_BLOCK; i++)
            if (atomic_load_explicit(&b->slot[i].base, memory_order_relaxed) == 0)
                return &b->slot[i];
        struct block *next = atomic_load_explicit(&b->next, memory_order_relaxed);
        if (next == NULL) {
            /* Blocks are never freed: the handler may be walking them at any time. */
            if ((next = calloc(1, sizeof *next)) == NULL)
                return NULL;
            atomic_store_explicit(&b->next, next, memory_order_release);
        }
        b = next;
    }
}

struct shmipc__guard_slot *shmipc__guard_register(void *base, size_t len)
{
    pthread_once(&knob_once, read_knob);
    if (!wanted || base == NULL || len == 0)
        return NULL;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    pthread_mutex_lock(&registry_mu);
    /* Logged after the unlock: a log sink may wait for what a fork in progress holds. */
    int refused = install_locked() < 0;
    struct shmipc__guard_slot *s = atomic_load(&installed) ? claim_locked() : NULL;
    if (s != NULL) {
        atomic_store_explicit(&s->len, (len + page - 1) / page * page, memory_order_relaxed);
        atomic_store_explicit(&s->state, INTACT, memory_order_relaxed);
        atomic_store_explicit(&s->wake_fd, -1, memory_order_relaxed);
        atomic_store_explicit(&s->base, (uintptr_t)base, memory_order_release);
    }
    pthread_mutex_unlock(&registry_mu);
    if (refused)
        SHMIPC__LOG(SHMIPC__LOG_WARN, "SIGBUS guard: sigaction failed; guard off");
    if (s == NULL && atomic_load(&installed))
        SHMIPC__LOG(SHMIPC__LOG_WARN, "SIGBUS guard: out of memory; mapping %p not guarded", base);
    return s;
}

void shmipc__guard_unregister(struct shmipc__guard_slot *slot)
{
    if (slot == NULL)
        return;
    pthread_mutex_lock(&registry_mu);
    atomic_store_explicit(&slot->wake_fd, -1, memory_order_relaxed);
    atomic_store_explicit(&slot->base, 0, memory_order_release);
    /*
     * A handler that found the slot before we cleared it may still be swapping pages or
     * shutting the socket down: both must happen before the caller unmaps and closes them.
     */
    while (atomic_load(&in_flight) != 0)
        sched_yield();
    pthread_mutex_unlock(&registry_mu);
}

void shmipc__guard_set_wake_fd(struct shmipc__guard_slot *slot, int fd)
{
    if (slot != NULL)
        atomic_store(&slot->wake_fd, fd);
}

int shmipc__guard_damaged(const struct shmipc__guard_slot *slot)
{
    return slot != NULL && atomic_load_explicit(&slot->state, memory_order_acquire) != INTACT;
}
