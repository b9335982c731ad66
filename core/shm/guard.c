#include "shm/guard.h"

#include "common/env.h"
#include "common/log.h"

#include <pthread.h>
#include <signal.h>
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

static struct shmipc__guard_slot *find_slot(uintptr_t addr)
{
    for (struct block *b = &first_block; b != NULL;
         b = atomic_load_explicit(&b->next, memory_order_acquire))
        for (int i = 0; i < SLOTS_PER_BLOCK; i++) {
            struct shmipc__guard_slot *s = &b->slot[i];
            uintptr_t base = atomic_load_explicit(&s->base, memory_order_acquire);
            if (base != 0 && addr >= base &&
                addr - base < atomic_load_explicit(&s->len, memory_order_relaxed))
                return s;
        }
    return NULL;
}

/*
 * The fault this thread is handing on, to catch a loop: a handler installed after ours that
 * chains back to ours, while we chain to it. Each round of such a loop passes the same address
 * from deeper in the stack; a handler that longjmps out leaves stale values behind, which a
 * later fault does not match both ways. Initial-exec TLS: the handler must not allocate it.
 */
static __thread struct {
    void *addr;
    uintptr_t sp;
} passing __attribute__((tls_model("initial-exec")));

/* Hands a SIGBUS that is not ours to whoever had it before, or to the default action. */
static void pass_on(int sig, siginfo_t *info, void *ctx)
{
    volatile char here = 0;
    uintptr_t sp = (uintptr_t)&here;
    void *addr = info != NULL ? info->si_addr : NULL;
    int loop = passing.sp != 0 && passing.addr == addr && sp < passing.sp;
    int chained = (previous.sa_flags & SA_SIGINFO) ||
                  (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN);
    if (chained && !loop) {
        void *old_addr = passing.addr;
        uintptr_t old_sp = passing.sp;
        passing.addr = addr;
        passing.sp = sp;
        if (previous.sa_flags & SA_SIGINFO)
            previous.sa_sigaction(sig, info, ctx);
        else
            previous.sa_handler(sig);
        passing.addr = old_addr;
        passing.sp = old_sp;
        return;
    }
    /*
     * Default action: restore it and raise. The signal is blocked while we run, so it is
     * delivered (and kills) as the handler returns; a fault would also simply recur.
     */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGBUS, &dfl, NULL);
    raise(SIGBUS);
}

static void on_sigbus(int sig, siginfo_t *info, void *ctx)
{
    /* si_code > 0: raised by a fault, not sent with kill() or raise(). */
    struct shmipc__guard_slot *s =
        info != NULL && info->si_code > 0 ? find_slot((uintptr_t)info->si_addr) : NULL;
    if (s == NULL) {
        pass_on(sig, info, ctx);
        return;
    }
    int expect = INTACT;
    if (atomic_compare_exchange_strong(&s->state, &expect, REPLACING)) {
        uintptr_t base = atomic_load(&s->base);
        size_t len = atomic_load(&s->len);
        void *p = mmap((void *)base, len, PROT_READ | PROT_WRITE,
                       MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        atomic_store(&s->state, p == MAP_FAILED ? FAILED : REPLACED);
        expect = p == MAP_FAILED ? FAILED : REPLACED;
    }
    /* REPLACING: another thread is swapping the pages in; the access will retry. */
    if (expect == FAILED)
        pass_on(sig, info, ctx);
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
}

/*
 * Puts our handler in front, keeping what was there as `previous`. Called at each
 * registration under registry_mu: a handler installed after ours (a test framework, Python's
 * faulthandler) is chained behind ours again from the next mapping on.
 */
static void install_locked(void)
{
    struct sigaction cur, sa;
    if (sigaction(SIGBUS, NULL, &cur) != 0) {
        SHMIPC__LOG(SHMIPC__LOG_WARN, "SIGBUS guard: sigaction failed; guard off");
        return;
    }
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigbus)
        return;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    previous = cur;
    if (sigaction(SIGBUS, &sa, NULL) != 0) {
        SHMIPC__LOG(SHMIPC__LOG_WARN, "SIGBUS guard: sigaction failed; guard off");
        return;
    }
    atomic_store(&installed, 1);
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
    install_locked();
    struct shmipc__guard_slot *s = atomic_load(&installed) ? claim_locked() : NULL;
    if (s != NULL) {
        atomic_store_explicit(&s->len, (len + page - 1) / page * page, memory_order_relaxed);
        atomic_store_explicit(&s->state, INTACT, memory_order_relaxed);
        atomic_store_explicit(&s->base, (uintptr_t)base, memory_order_release);
    }
    pthread_mutex_unlock(&registry_mu);
    if (s == NULL && atomic_load(&installed))
        SHMIPC__LOG(SHMIPC__LOG_WARN, "SIGBUS guard: out of memory; mapping %p not guarded", base);
    return s;
}

void shmipc__guard_unregister(struct shmipc__guard_slot *slot)
{
    if (slot == NULL)
        return;
    pthread_mutex_lock(&registry_mu);
    atomic_store_explicit(&slot->base, 0, memory_order_release);
    pthread_mutex_unlock(&registry_mu);
}

int shmipc__guard_damaged(const struct shmipc__guard_slot *slot)
{
    return slot != NULL && atomic_load_explicit(&slot->state, memory_order_acquire) != INTACT;
}
