#include "common/proc.h"

#include <pthread.h>
#include <unistd.h>

static pid_t cached;
static int cached_ok; /* the handler is registered: cached stays right across fork() */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void refresh(void)
{
    __atomic_store_n(&cached, getpid(), __ATOMIC_RELAXED);
}

static void init(void)
{
    refresh();
    /* Only the child needs it: fork() runs the handler there before it returns. */
    cached_ok = pthread_atfork(NULL, NULL, refresh) == 0;
}

pid_t shmipc__pid(void)
{
    pthread_once(&once, init);
    /* Without the handler (out of memory when registering), the system call every time. */
    return cached_ok ? __atomic_load_n(&cached, __ATOMIC_RELAXED) : getpid();
}

int shmipc__unref(pid_t made_in, pthread_mutex_t *mu, int *refs)
{
    int last;
    if (shmipc__foreign(made_in))
        return --*refs == 0;
    pthread_mutex_lock(mu);
    last = --*refs == 0;
    pthread_mutex_unlock(mu);
    return last;
}

void shmipc__thread_signals_block(sigset_t *old)
{
    static const int faults[] = {SIGBUS, SIGSEGV, SIGFPE, SIGILL, SIGTRAP, SIGSYS};
    sigset_t quiet;
    sigfillset(&quiet);
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++)
        sigdelset(&quiet, faults[i]);
    pthread_sigmask(SIG_SETMASK, &quiet, old);
}

void shmipc__thread_signals_restore(const sigset_t *old)
{
    pthread_sigmask(SIG_SETMASK, old, NULL);
}
