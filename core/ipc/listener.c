#include "ipc/listener.h"

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "ipc/session.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
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
    if ((l->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
        rc = shmipc__fail_errno(errno, "listener %s: eventfd", address);
        shmipc__ipc_listener_close(l);
        return rc;
    }
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
    if (l->wake_fd > 0)
        close(l->wake_fd);
    if (l->addr.family == AF_UNIX && un->sun_path[0] != '\0')
        unlink(un->sun_path);
    free(l);
}

/* The sessions a serving listener owns, with the pollfd array that watches them. */
struct served {
    shmipc_session **s;
    struct pollfd *pfd; /* [0] wake, [1] listener, [2 + i] session i */
    uint32_t n, cap;
    uint32_t *ids, ids_cap;
};

static int served_add(struct served *v, shmipc_session *s)
{
    if (v->n == v->cap) {
        uint32_t cap = v->cap ? v->cap * 2 : 16;
        shmipc_session **ns = realloc(v->s, cap * sizeof *ns);
        if (ns == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "listener: out of memory");
        v->s = ns;
        struct pollfd *np = realloc(v->pfd, (cap + 2) * sizeof *np);
        if (np == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "listener: out of memory");
        v->pfd = np;
        v->cap = cap;
    }
    v->s[v->n++] = s;
    return 0;
}

/*
 * Hands new streams to on_stream and news to on_data. Returns 1 when more news may be
 * pending (a callback's reads processed more events), so the caller polls without waiting.
 */
static int dispatch(shmipc_session *s, struct served *v, shmipc_stream_cb on_stream,
                    shmipc_stream_cb on_data, void *user_data)
{
    shmipc_stream *st;
    while (shmipc__session_accept_stream(s, 0, &st) == 0)
        on_stream(st, user_data);
    /* A few rounds, for callbacks whose reads bring in more; then let other sessions run. */
    for (int round = 0; round < 4; round++) {
        uint32_t n = shmipc__session_take_ready(s, &v->ids, &v->ids_cap);
        if (n == 0)
            return 0;
        for (uint32_t i = 0; i < n; i++)
            if ((st = shmipc__session_handed_out(s, v->ids[i])) != NULL)
                on_data(st, user_data);
        while (shmipc__session_accept_stream(s, 0, &st) == 0)
            on_stream(st, user_data);
    }
    return 1;
}

static void accept_clients(shmipc_listener *l, struct served *v)
{
    for (;;) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN)
                SHMIPC__LOG(SHMIPC__LOG_WARN, "listener %s: accept: %s", l->addr.text,
                            strerror(errno));
            return;
        }
        shmipc_session *s;
        int rc = shmipc__session_accept_fd(fd, &l->cfg, &s);
        if (rc < 0) {
            SHMIPC__LOG(SHMIPC__LOG_WARN, "listener %s: handshake failed: %s (%s)", l->addr.text,
                        shmipc_errname(rc), shmipc_error_detail());
            continue;
        }
        shmipc__session_track_ready(s);
        if (served_add(v, s) < 0) {
            SHMIPC__LOG(SHMIPC__LOG_ERROR, "listener %s: %s", l->addr.text, shmipc_error_detail());
            shmipc__session_close(s);
        }
    }
}

int shmipc__ipc_listener_serve(shmipc_listener *l, shmipc_stream_cb on_stream,
                               shmipc_stream_cb on_data, void *user_data, shmipc_destroy_cb destroy)
{
    struct served v = {0};
    int rc = 0, again = 0;
    if (__atomic_exchange_n(&l->serving, 1, __ATOMIC_ACQ_REL)) {
        /* The registration is refused, but its user_data is ours to free all the same. */
        if (destroy != NULL)
            destroy(user_data);
        return shmipc__fail(SHMIPC_EBUSY, "listener %s: another thread is serving", l->addr.text);
    }
    if ((v.pfd = malloc(2 * sizeof *v.pfd)) == NULL) {
        rc = shmipc__fail(SHMIPC_ENOMEM, "listener: out of memory");
        goto out;
    }
    while (!__atomic_load_n(&l->stopping, __ATOMIC_ACQUIRE)) {
        v.pfd[0] = (struct pollfd){.fd = l->wake_fd, .events = POLLIN};
        v.pfd[1] = (struct pollfd){.fd = l->fd, .events = POLLIN};
        for (uint32_t i = 0; i < v.n; i++)
            v.pfd[2 + i] = (struct pollfd){.fd = shmipc_session_fileno(v.s[i]), .events = POLLIN};
        int n = poll(v.pfd, v.n + 2, again ? 0 : -1);
        if (n < 0 && errno != EINTR) {
            rc = shmipc__fail_errno(errno, "listener %s: poll", l->addr.text);
            break;
        }
        if (n < 0)
            continue;
        if (v.pfd[0].revents) {
            uint64_t junk;
            (void)!read(l->wake_fd, &junk, sizeof junk);
        }
        /* Sessions with news left over from the last turn are looked at without an event. */
        int leftover = again;
        again = 0;
        uint32_t before = v.n;
        if (v.pfd[1].revents)
            accept_clients(l, &v);
        for (uint32_t i = 0; i < v.n; i++) {
            /* Sessions accepted this turn have no pollfd yet: look at them anyway. */
            if (i < before && v.pfd[2 + i].revents == 0 && !leftover)
                continue;
            shmipc__session_process(v.s[i]);
            again |= dispatch(v.s[i], &v, on_stream, on_data, user_data);
        }
        /*
         * Drop the sessions that ended, once their streams have heard of it through on_data:
         * a session can end inside a callback, after its last dispatch round.
         */
        for (uint32_t i = 0; i < v.n;) {
            if (shmipc_session_status(v.s[i]) != 0) {
                while (dispatch(v.s[i], &v, on_stream, on_data, user_data))
                    ;
                shmipc__session_close(v.s[i]);
                v.s[i] = v.s[--v.n];
            } else {
                i++;
            }
        }
    }
out:
    for (uint32_t i = 0; i < v.n; i++)
        shmipc__session_close(v.s[i]);
    free(v.s);
    free(v.pfd);
    free(v.ids);
    __atomic_store_n(&l->stopping, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&l->serving, 0, __ATOMIC_RELEASE);
    if (destroy != NULL)
        destroy(user_data);
    return rc;
}

int shmipc__ipc_listener_stop(shmipc_listener *l)
{
    uint64_t one = 1;
    __atomic_store_n(&l->stopping, 1, __ATOMIC_RELEASE);
    /* eventfd writes are async-signal-safe: stop may be called from a signal handler. */
    if (write(l->wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        return shmipc__fail_errno(errno, "listener %s: stop", l->addr.text);
    return 0;
}
