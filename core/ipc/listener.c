#include "ipc/listener.h"

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "ipc/session.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int shmipc__ipc_listener_new(const char *address, const shmipc_config *cfg, shmipc_listener **out)
{
    shmipc_listener *l = calloc(1, sizeof *l);
    int rc;
    if (l == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "listener: out of memory");
    if (cfg != NULL && (rc = shmipc_config_validate(cfg)) < 0)
        goto err;
    if (cfg != NULL) {
        l->cfg = *cfg;
    } else {
        shmipc_config *def;
        if ((rc = shmipc_config_new(&def)) < 0)
            goto err;
        l->cfg = *def;
        shmipc_config_free(def);
    }
    if ((rc = shmipc__addr_parse(address, &l->addr)) < 0 ||
        (rc = shmipc__sock_listen(&l->addr, 0600)) < 0)
        goto err;
    l->fd = rc;
    *out = l;
    return 0;
err:
    free(l);
    return rc;
}

int shmipc__ipc_listener_accept(shmipc_listener *l, int timeout_ms, shmipc_session **out)
{
    uint64_t deadline = timeout_ms > 0 ? shmipc__deadline_ms((uint64_t)timeout_ms) : 0;
    for (;;) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN)
                return shmipc__fail_errno(errno, "listener %s: accept", l->addr.text);
            if (timeout_ms == 0)
                return shmipc__fail(SHMIPC_EAGAIN, "listener %s: no client waiting", l->addr.text);
            struct pollfd p = {.fd = l->fd, .events = POLLIN};
            int rc = poll(&p, 1, shmipc__remaining_ms(deadline));
            if (rc == 0)
                return shmipc__fail(SHMIPC_ETIMEDOUT, "listener %s: no client came", l->addr.text);
            if (rc < 0 && errno == EINTR)
                return shmipc__fail(SHMIPC_EINTR, "listener %s: interrupted", l->addr.text);
            if (rc < 0)
                return shmipc__fail_errno(errno, "listener %s: poll", l->addr.text);
            continue;
        }
        int rc = shmipc__session_accept_fd(fd, &l->cfg, out);
        if (rc == 0)
            return 0;
        /* One client's failed handshake must not fail the server: drop it and go on. */
        SHMIPC__LOG(SHMIPC__LOG_WARN, "listener %s: handshake failed: %s (%s)", l->addr.text,
                    shmipc_errname(rc), shmipc_error_detail());
        if (deadline != 0 && shmipc__now_ns() >= deadline)
            return shmipc__fail(SHMIPC_ETIMEDOUT, "listener %s: no client completed a handshake",
                                l->addr.text);
    }
}

void shmipc__ipc_listener_close(shmipc_listener *l)
{
    const struct sockaddr_un *un = (const struct sockaddr_un *)&l->addr.ss;
    close(l->fd);
    if (l->addr.family == AF_UNIX && un->sun_path[0] != '\0')
        unlink(un->sun_path);
    free(l);
}
