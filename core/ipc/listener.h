/* The server's listening socket: accept a client and run its handshake. */
#ifndef SHMIPC_CORE_IPC_LISTENER_H
#define SHMIPC_CORE_IPC_LISTENER_H

#include "shmipc.h"

#include "ipc/config.h"
#include "ipc/sockio.h"

struct shmipc_listener {
    int fd;
    int wake_fd;  /* eventfd that shmipc_listener_stop() writes */
    int serving;  /* a thread is in serve() (atomic) */
    int stopping; /* atomic */
    struct shmipc__addr addr;
    struct shmipc_config cfg;
};

int shmipc__ipc_listener_new(const char *address, const shmipc_config *cfg, shmipc_listener **out);
int shmipc__ipc_listener_accept(shmipc_listener *l, int timeout_ms, shmipc_session **out);
void shmipc__ipc_listener_close(shmipc_listener *l);
int shmipc__ipc_listener_serve(shmipc_listener *l, shmipc_stream_cb on_stream,
                               shmipc_stream_cb on_data, void *user_data,
                               shmipc_destroy_cb destroy);
int shmipc__ipc_listener_stop(shmipc_listener *l);

#endif
