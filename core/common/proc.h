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

#endif
