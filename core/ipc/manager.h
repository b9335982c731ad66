/*
 * The session manager (reference §3.5): a pool of client sessions to one server, each with a
 * ring of idle streams for reuse, and reconnection when a session dies.
 */
#ifndef SHMIPC_CORE_IPC_MANAGER_H
#define SHMIPC_CORE_IPC_MANAGER_H

#include "shmipc.h"

#include "common/proc.h"
#include "ipc/config.h"

#include <pthread.h>
#include <stdint.h>

struct shmipc__pool {
    shmipc_session *s; /* NULL after a failed reconnect */
    shmipc_stream **idle;
    uint32_t nidle;
};

struct shmipc_session_manager {
    pthread_mutex_t mu;
    /*
     * The manager's life, apart from mu (which a reconnect holds for up to the initialize
     * timeout): refs counts the user's handle, each get_stream or put_back in flight, and each
     * session it connected until that session is freed (after its close and the close of every
     * stream taken from it); the last one out frees the manager. closing (atomic, set once by
     * close) refuses new calls. Lock order: mu, then life_mu (a session freed under mu).
     */
    pthread_mutex_t life_mu;
    int refs;
    int closing;
    /*
     * The process that made it (common/proc.h). In another one (a fork() child) get_stream
     * fails, put_back and close release that process's copies only, and no lock is taken.
     */
    pid_t pid;
    struct shmipc_config cfg;
    char address[256];
    uint64_t calls;
    uint64_t next_attempt_ns; /* no reconnect before this, after one failed */
    int last_err;
    uint32_t npools;
    struct shmipc__pool pools[]; /* cfg.session_num of them */
};

int shmipc__manager_new(const char *address, const shmipc_config *cfg,
                        shmipc_session_manager **out);
int shmipc__manager_get_stream(shmipc_session_manager *m, shmipc_stream **out);
/* Pools `st` for the next taker, or closes it: shut down, not as new, or its pool full. */
void shmipc__manager_put_back(shmipc_session_manager *m, shmipc_stream *st);
/*
 * Closes every session now (waiting for a reconnect in flight) and frees the manager, or leaves
 * the freeing to the last get_stream or put_back still in flight in other threads, or to the
 * close or put_back of the last stream taken from it.
 */
void shmipc__manager_close(shmipc_session_manager *m);

#endif
