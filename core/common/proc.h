/*
 * The fork rule (docs/ipc.md, "fork"): a session, stream, listener or session manager belongs
 * to the process that made it. Each records shmipc__pid() when made; in any other process (a
 * fork() child holding copies of the parent's memory and descriptors) closing it releases only
 * that process's copies: nothing goes to the peer or into shared memory, no socket is shut
 * down, no file is removed, no thread is joined.
 */
#ifndef SHMIPC_CORE_PROC_H
#define SHMIPC_CORE_PROC_H

#include <pthread.h>
#include <signal.h>
#include <sys/types.h>

/*
 * This process's id, without a system call: cached, and refreshed in a fork() child by a
 * pthread_atfork() handler (a child made by a raw clone() or _Fork() runs no handler and keeps
 * the parent's id: its objects then act as the parent's, as before the rule).
 */
pid_t shmipc__pid(void);

/* 1 when this process is not `made_in`, the process that made an object. */
static inline int shmipc__foreign(pid_t made_in)
{
    return made_in != shmipc__pid();
}

/*
 * Drops one of an object's references, `*refs`, which is counted under `mu`, and returns 1
 * when it was the last (the caller then frees the object). In a process other than `made_in`
 * the lock is not taken: a lock that a parent thread held at the fork is held for good in the
 * child, whose copy is closed from one thread (docs/ipc.md, "fork"); a call the parent had in
 * flight at the fork then keeps the child's copy until the child exits.
 */
int shmipc__unref(pid_t made_in, pthread_mutex_t *mu, int *refs);

/*
 * Around the pthread_create() of a library thread (a reactor worker, a listener's handshake):
 * blocks every process signal in the calling thread, keeping its mask in `old`, so that the new
 * thread inherits that mask; shmipc__thread_signals_restore() then puts `old` back.
 *
 * Process signals stay with the application's threads: one the kernel delivered to a library
 * thread wakes none of the application's waits (CPython runs its handlers on its main thread
 * only: a main thread asleep in select() slept through its SIGTERM).
 *
 * The synchronous fault signals (SIGBUS, SIGSEGV, SIGFPE, SIGILL, SIGTRAP, SIGSYS) stay open. A
 * fault signal is sent to the thread that faulted and cannot wait: when it is blocked, Linux
 * unblocks it and resets it to the default action, so the process dies and no handler runs
 * (POSIX leaves it undefined). That would kill the process from a peer's truncated file (the
 * SIGBUS guard, shm/guard.h, turns it into the end of one session on the thread that touched
 * the mapping, a handshake thread reading the peer's layout too) and hide a crash from the
 * application's handlers (Python's faulthandler, a crash reporter, a sanitizer).
 */
void shmipc__thread_signals_block(sigset_t *old);
void shmipc__thread_signals_restore(const sigset_t *old);

#endif
