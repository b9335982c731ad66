/*
 * The server's listening socket. Each accepted client's handshake runs on a short-lived
 * thread of its own (at most SHMIPC__MAX_HANDSHAKES at once), so a client that connects and
 * stalls delays nobody else; finished sessions wait in a queue for accept() or serve().
 */
#ifndef SHMIPC_CORE_IPC_LISTENER_H
#define SHMIPC_CORE_IPC_LISTENER_H

#include "shmipc.h"

#include "common/proc.h"
#include "ipc/config.h"
#include "ipc/sockio.h"

#include <pthread.h>

/*
 * Handshakes in flight at once (a client beyond them is disconnected at once), and finished
 * sessions waiting for accept() beyond which new clients stay in the kernel's backlog.
 */
#define SHMIPC__MAX_HANDSHAKES 64

/* One client's handshake, on a thread of its own: a slot of the listener's table. */
struct shmipc__handshake {
    struct shmipc_listener *l;
    pthread_t thread;
    int sock; /* the client's socket, which the session takes */
    /*
     * A duplicate of sock that close() shuts down to end the handshake at once. The thread
     * closes it (under mu, -1 after) when done: the session may have closed sock by then,
     * and this keeps the number from meaning another file while close() may look at it.
     */
    int abort_fd;
    uint8_t used;    /* the slot holds a thread not yet joined */
    uint8_t done;    /* the thread finished its work (set by the thread) */
    uint8_t joining; /* a reaper took it to join */
};

struct shmipc_listener {
    int fd;
    int wake_fd;  /* eventfd that shmipc_listener_stop() writes */
    int ready_fd; /* eventfd, non-zero exactly while `ready` holds a session (under mu) */
    int poll_fd;  /* epoll set of fd, ready_fd and shut_fd: what fileno() returns */
    int shut_fd;  /* eventfd written once by shutdown and never drained: wakes every waiter */
    int pause_fd; /* timerfd in poll_fd's set: fires when a pause of accepting ends */
    int shut;     /* shutdown() ran: every call fails with SHMIPC_ECLOSED (atomic) */
    int serving;  /* a thread is in serve() (atomic) */
    int stopping; /* atomic */
    /*
     * The process that made it (common/proc.h). In another one (a fork() child), shutdown and
     * close act on that process's copy only: no socket of a handshake is shut down, no eventfd
     * written or read (they are the parent's too), no thread joined (the child has none), no
     * socket file removed, no lock taken.
     */
    pid_t pid;
    struct shmipc__addr addr;
    struct shmipc__unix_file file; /* the socket file made, removed at close if still ours */
    struct shmipc_config cfg;

    /* Guards everything below. */
    pthread_mutex_t mu;
    int closing; /* shutdown() ran: handshakes finishing now close their session */
    /* The user's handle plus each accept() or serve() in flight; the last one out frees. */
    int refs;
    shmipc_session **ready; /* sessions whose handshake succeeded, oldest first */
    uint32_t nready, ready_cap;
    /* accept() ran out of descriptors or memory (EMFILE...): nothing is accepted until this
     * CLOCK_MONOTONIC time (ns; 0 = not paused; atomic, written under mu), and fd is out of
     * poll_fd's set meanwhile. */
    uint64_t paused_until;
    struct shmipc__handshake hs[SHMIPC__MAX_HANDSHAKES];
};

int shmipc__ipc_listener_new(const char *address, const shmipc_config *cfg, shmipc_listener **out);
int shmipc__ipc_listener_accept(shmipc_listener *l, int timeout_ms, shmipc_session **out);
int shmipc__ipc_listener_fileno(const shmipc_listener *l);
int shmipc__ipc_listener_shutdown(shmipc_listener *l);
/* shutdown, then free now or when the last accept() or serve() in flight leaves. */
void shmipc__ipc_listener_close(shmipc_listener *l);
int shmipc__ipc_listener_serve(shmipc_listener *l, shmipc_stream_cb on_stream,
                               shmipc_stream_cb on_data, void *user_data,
                               shmipc_destroy_cb destroy);
int shmipc__ipc_listener_stop(shmipc_listener *l);

#endif
