#include "ipc/listener.h"

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "ipc/session.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

/* A handshake thread needs a few KiB: the messages it reads are small and on its stack. */
#define HANDSHAKE_STACK (256u * 1024u)
/* Turns served by a spin in a row before serve() polls its descriptors once. */
#define LOOK_EVERY 16u
/* How long accepting pauses after accept() ran out of descriptors or memory: nginx's
 * accept_mutex_delay, which it waits after EMFILE/ENFILE. */
#define ACCEPT_PAUSE_MS 500u

static void listener_destroy(shmipc_listener *l);

int shmipc__ipc_listener_new(const char *address, const shmipc_config *cfg, shmipc_listener **out)
{
    shmipc_listener *l = calloc(1, sizeof *l);
    int rc;
    if (l == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "listener: out of memory");
    l->fd = l->wake_fd = l->ready_fd = l->poll_fd = l->shut_fd = l->pause_fd = -1;
    l->refs = 1;
    l->pid = shmipc__pid();
    if (cfg != NULL && (rc = shmipc__config_validate(cfg)) < 0)
        goto err;
    if (cfg != NULL) {
        l->cfg = *cfg;
    } else {
        shmipc_config *def;
        if ((rc = shmipc__config_new(&def)) < 0)
            goto err;
        l->cfg = *def;
        shmipc__config_free(def);
    }
    if ((rc = shmipc__addr_parse(address, &l->addr)) < 0)
        goto err;
    /* SO_PEERCRED says who a unix peer is; a TCP peer has no uid to check against the list. */
    if (l->cfg.npeer_uids > 0 && l->addr.family != AF_UNIX) {
        rc = shmipc__fail(SHMIPC_EINVAL, "listener %s: peer_uids need a unix socket, not TCP",
                          address);
        goto err;
    }
    if ((rc = pthread_mutex_init(&l->mu, NULL)) != 0) {
        rc = shmipc__fail_errno(rc, "listener %s: mutex", address);
        goto err;
    }
    if ((rc = shmipc__sock_listen(&l->addr, shmipc__config_get_socket_mode(&l->cfg), &l->file)) <
        0) {
        pthread_mutex_destroy(&l->mu);
        goto err;
    }
    l->fd = rc;
    /* From here on listener_destroy() undoes what was done, including the socket file. */
    struct epoll_event ev = {.events = EPOLLIN};
    if ((l->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0 ||
        (l->shut_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0 ||
        (l->ready_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0 ||
        (l->pause_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK)) < 0 ||
        (l->poll_fd = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
        /* The end of a pause of accepting wakes an event loop, which then accepts again. */
        epoll_ctl(l->poll_fd, EPOLL_CTL_ADD, l->pause_fd, &ev) < 0 ||
        epoll_ctl(l->poll_fd, EPOLL_CTL_ADD, l->fd, &ev) < 0 ||
        epoll_ctl(l->poll_fd, EPOLL_CTL_ADD, l->ready_fd, &ev) < 0 ||
        /* An event loop waiting on fileno() hears of a shutdown: accept then says ECLOSED. */
        epoll_ctl(l->poll_fd, EPOLL_CTL_ADD, l->shut_fd, &ev) < 0) {
        rc = shmipc__fail_errno(errno, "listener %s: eventfd/epoll", address);
        listener_destroy(l);
        return rc;
    }
    *out = l;
    return 0;
err:
    free(l);
    return rc;
}

int shmipc__ipc_listener_fileno(const shmipc_listener *l)
{
    return l->poll_fd;
}

/* Queues a session whose handshake succeeded. Under mu. */
static int ready_push(shmipc_listener *l, shmipc_session *s)
{
    if (l->nready == l->ready_cap) {
        uint32_t cap = l->ready_cap ? l->ready_cap * 2 : 16;
        shmipc_session **p = realloc(l->ready, cap * sizeof *p);
        if (p == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "listener: out of memory");
        l->ready = p;
        l->ready_cap = cap;
    }
    l->ready[l->nready++] = s;
    if (l->nready == 1) {
        uint64_t one = 1;
        (void)!write(l->ready_fd, &one, sizeof one);
    }
    return 0;
}

/* The oldest session waiting, or NULL. Under mu. */
static shmipc_session *ready_pop(shmipc_listener *l)
{
    if (l->nready == 0)
        return NULL;
    shmipc_session *s = l->ready[0];
    memmove(l->ready, l->ready + 1, --l->nready * sizeof *l->ready);
    if (l->nready == 0) {
        uint64_t junk;
        (void)!read(l->ready_fd, &junk, sizeof junk);
    }
    return s;
}

static void *handshake_main(void *arg)
{
    struct shmipc__handshake *h = arg;
    shmipc_listener *l = h->l;
    shmipc_session *s = NULL;
    int rc = shmipc__session_accept_fd(h->sock, &l->cfg, &s);
    if (rc < 0)
        SHMIPC__LOG(SHMIPC__LOG_WARN, "listener %s: handshake failed: %s (%s)", l->addr.text,
                    shmipc__errname(rc), shmipc__detail());
    pthread_mutex_lock(&l->mu);
    /* A listener that is closing takes no more sessions: this one is closed below. */
    if (rc == 0 && !l->closing && ready_push(l, s) == 0)
        s = NULL;
    close(h->abort_fd);
    h->abort_fd = -1;
    h->done = 1;
    pthread_mutex_unlock(&l->mu);
    if (s != NULL)
        shmipc__session_close(s);
    return NULL;
}

/*
 * Joins the handshake threads that are done (or, with all, every one) and frees their slots.
 * A slot is taken for joining under mu, so two reapers never join one thread.
 */
static void reap_handshakes(shmipc_listener *l, int all)
{
    int take[SHMIPC__MAX_HANDSHAKES], n = 0;
    pthread_mutex_lock(&l->mu);
    for (int i = 0; i < SHMIPC__MAX_HANDSHAKES; i++) {
        struct shmipc__handshake *h = &l->hs[i];
        if (h->used && !h->joining && (h->done || all)) {
            h->joining = 1;
            take[n++] = i;
        }
    }
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < n; i++)
        pthread_join(l->hs[take[i]].thread, NULL);
    pthread_mutex_lock(&l->mu);
    for (int i = 0; i < n; i++)
        l->hs[take[i]].used = 0;
    pthread_mutex_unlock(&l->mu);
}

/*
 * Starts the handshake of the client on `fd` on a thread of its own, or drops the client.
 * Once shutdown has begun no handshake starts: shutdown cuts off only the handshakes it finds
 * in the table, so one started after it (a client accepted in the same turn, on a thread that
 * looked at `shut` just before) would run for the whole initialize timeout, and close, which
 * joins it, would wait that long for a client that sends nothing.
 */
static void start_handshake(shmipc_listener *l, int fd)
{
    struct shmipc__handshake *h = NULL;
    sigset_t old;
    pthread_attr_t attr;
    int rc = 0, abort_fd, closing = 0;
    reap_handshakes(l, 0);
    if (__atomic_load_n(&l->shut, __ATOMIC_ACQUIRE)) {
        close(fd);
        return;
    }
    if ((abort_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        SHMIPC__LOG(SHMIPC__LOG_ERROR, "listener %s: dup: %s", l->addr.text, strerror(errno));
        close(fd);
        return;
    }
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, HANDSHAKE_STACK);
    /*
     * Process signals stay with the application's threads. The faults stay open: the handshake
     * reads the peer's shared memory, and a SIGBUS there (the peer shrank its file) must reach
     * the SIGBUS guard, not kill the process as a blocked fault does (common/proc.h).
     */
    shmipc__thread_signals_block(&old);
    /* Created under mu: the thread cannot say it is done before its slot is filled in. */
    pthread_mutex_lock(&l->mu);
    /* Checked again under mu, which shutdown takes to set it: no thread slips in after. */
    closing = l->closing;
    for (int i = 0; i < SHMIPC__MAX_HANDSHAKES && h == NULL && !closing; i++)
        if (!l->hs[i].used)
            h = &l->hs[i];
    if (h != NULL) {
        *h = (struct shmipc__handshake){.l = l, .sock = fd, .abort_fd = abort_fd, .used = 1};
        if ((rc = pthread_create(&h->thread, &attr, handshake_main, h)) != 0)
            h->used = 0;
    }
    pthread_mutex_unlock(&l->mu);
    shmipc__thread_signals_restore(&old);
    pthread_attr_destroy(&attr);
    if (h != NULL && rc == 0)
        return;
    /* Shut down meanwhile (closing): the client goes, as those still in the backlog will. */
    if (h == NULL && !closing)
        /* Stalling clients must not make us run out of threads or fds: this one goes. */
        SHMIPC__LOG(SHMIPC__LOG_WARN,
                    "listener %s: %u handshakes in flight already; a new client is disconnected",
                    l->addr.text, SHMIPC__MAX_HANDSHAKES);
    else if (h != NULL)
        SHMIPC__LOG(SHMIPC__LOG_ERROR, "listener %s: handshake thread: %s", l->addr.text,
                    strerror(rc));
    close(abort_fd);
    close(fd);
}

/*
 * Milliseconds left of a pause of accepting (0: not paused). A pause that has ended is lifted
 * here: the socket goes back into fileno()'s set and the timer is drained.
 */
static int accept_pause_left(shmipc_listener *l)
{
    int left = 0;
    /* Not paused, the common case: no lock (serve() asks on every turn of its loop). */
    if (__atomic_load_n(&l->paused_until, __ATOMIC_ACQUIRE) == 0)
        return 0;
    pthread_mutex_lock(&l->mu);
    if (l->paused_until != 0) {
        uint64_t now = shmipc__now_ns();
        if (now < l->paused_until) {
            left = (int)((l->paused_until - now + 999999u) / 1000000u);
        } else {
            struct epoll_event ev = {.events = EPOLLIN};
            uint64_t n;
            (void)epoll_ctl(l->poll_fd, EPOLL_CTL_ADD, l->fd, &ev);
            (void)!read(l->pause_fd, &n, sizeof n);
            __atomic_store_n(&l->paused_until, 0, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&l->mu);
    return left;
}

/*
 * accept() failed for want of descriptors or memory (`err`): the client stays in the
 * backlog and the socket stays readable, so every waiter (accept, serve, an event loop on
 * fileno()) would try again at once and fail again, a busy loop logging as fast as it can.
 * Accepting pauses for ACCEPT_PAUSE_MS instead, as nginx does; one warning per pause.
 */
static void accept_pause(shmipc_listener *l, int err)
{
    pthread_mutex_lock(&l->mu);
    if (l->paused_until == 0) {
        struct itimerspec its = {.it_value = {.tv_sec = ACCEPT_PAUSE_MS / 1000u,
                                              .tv_nsec = (ACCEPT_PAUSE_MS % 1000u) * 1000000L}};
        __atomic_store_n(&l->paused_until, shmipc__now_ns() + (uint64_t)ACCEPT_PAUSE_MS * 1000000u,
                         __ATOMIC_RELEASE);
        (void)epoll_ctl(l->poll_fd, EPOLL_CTL_DEL, l->fd, NULL);
        (void)timerfd_settime(l->pause_fd, 0, &its, NULL);
        SHMIPC__LOG(SHMIPC__LOG_WARN, "listener %s: accept: %s: accepting again in %u ms",
                    l->addr.text, strerror(err), ACCEPT_PAUSE_MS);
    }
    pthread_mutex_unlock(&l->mu);
}

/*
 * Accepts every client waiting on the socket and starts its handshake. While many finished
 * sessions wait for the application, the others stay in the kernel's backlog: a slow
 * application then slows its clients down instead of piling up sessions.
 */
static int accept_clients(shmipc_listener *l)
{
    /* Threads that ended are joined now rather than at the next client: nothing lingers. */
    reap_handshakes(l, 0);
    if (accept_pause_left(l) > 0)
        return 0;
    for (;;) {
        /* Shut down (maybe by a callback, or another thread, during this turn): the clients
         * still in the backlog stay there, and are refused when the socket closes. */
        if (__atomic_load_n(&l->shut, __ATOMIC_ACQUIRE))
            return 0;
        pthread_mutex_lock(&l->mu);
        int backlog = l->nready >= SHMIPC__MAX_HANDSHAKES;
        pthread_mutex_unlock(&l->mu);
        if (backlog)
            return 0;
        int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                accept_pause(l, errno);
                return 0;
            }
            if (errno != EAGAIN)
                return shmipc__fail_errno(errno, "listener %s: accept", l->addr.text);
            return 0;
        }
        start_handshake(l, fd);
    }
}

static shmipc_session *take_ready(shmipc_listener *l)
{
    pthread_mutex_lock(&l->mu);
    shmipc_session *s = ready_pop(l);
    pthread_mutex_unlock(&l->mu);
    return s;
}

static int shut_error(const shmipc_listener *l)
{
    return shmipc__fail(SHMIPC_ECLOSED, "listener %s: shut down", l->addr.text);
}

/*
 * A call that may block (accept, serve) begins: it holds a reference, so that a close from
 * another thread meanwhile wakes it (shutdown) and leaves the freeing to the last one out.
 */
static int listener_enter(shmipc_listener *l)
{
    pthread_mutex_lock(&l->mu);
    int shut = l->closing;
    if (!shut)
        l->refs++;
    pthread_mutex_unlock(&l->mu);
    return shut ? shut_error(l) : 0;
}

static void listener_leave(shmipc_listener *l)
{
    /* In a fork child without the lock (listener_destroy_local frees the child's copy). */
    if (shmipc__unref(l->pid, &l->mu, &l->refs))
        listener_destroy(l);
}

static int accept_in(shmipc_listener *l, int timeout_ms, shmipc_session **out)
{
    uint64_t deadline = timeout_ms > 0 ? shmipc__deadline_ms((uint64_t)timeout_ms) : 0;
    for (;;) {
        if (__atomic_load_n(&l->shut, __ATOMIC_ACQUIRE))
            return shut_error(l);
        int rc = accept_clients(l);
        if (rc < 0)
            return rc;
        /* Shut down while accepting: no session either (the handshakes done now close theirs). */
        if (__atomic_load_n(&l->shut, __ATOMIC_ACQUIRE))
            return shut_error(l);
        if ((*out = take_ready(l)) != NULL)
            return 0;
        if (timeout_ms == 0)
            return shmipc__fail(SHMIPC_EAGAIN, "listener %s: no client waiting", l->addr.text);
        /*
         * New clients, or a handshake that finished (possibly for another accepting thread),
         * or a shutdown: shut_fd stays readable once written.
         */
        int pause = accept_pause_left(l), wait = shmipc__remaining_ms(deadline);
        struct pollfd p[3] = {{.fd = pause > 0 ? -1 : l->fd, .events = POLLIN},
                              {.fd = l->ready_fd, .events = POLLIN},
                              {.fd = l->shut_fd, .events = POLLIN}};
        /* Paused: the socket is not watched, and the wait ends with the pause at the latest. */
        rc = poll(p, 3, pause > 0 && (wait < 0 || pause < wait) ? pause : wait);
        if (rc == 0 && (deadline == 0 || shmipc__remaining_ms(deadline) > 0))
            continue; /* the pause ended: accept again */
        if (rc == 0)
            return shmipc__fail(SHMIPC_ETIMEDOUT, "listener %s: no client completed a handshake",
                                l->addr.text);
        if (rc < 0 && errno == EINTR)
            return shmipc__fail(SHMIPC_EINTR, "listener %s: interrupted", l->addr.text);
        if (rc < 0)
            return shmipc__fail_errno(errno, "listener %s: poll", l->addr.text);
    }
}

int shmipc__ipc_listener_accept(shmipc_listener *l, int timeout_ms, shmipc_session **out)
{
    int rc = listener_enter(l);
    if (rc < 0)
        return rc;
    rc = accept_in(l, timeout_ms, out);
    listener_leave(l);
    return rc;
}

/*
 * Ends the listener but keeps the handle: blocked accept() and serve() calls wake with
 * SHMIPC_ECLOSED (shut_fd, which is never drained, and wake_fd for serve), later ones fail
 * so, and handshakes in flight end now (their reads see the connection shut down). Any
 * thread, any number of times. The descriptors stay open until the last call leaves, so a
 * poll in another thread never watches a number that means another file.
 */
int shmipc__ipc_listener_shutdown(shmipc_listener *l)
{
    uint64_t one = 1;
    /* A fork child's copy: its own calls fail from now on; the parent's listener goes on. */
    if (shmipc__foreign(l->pid)) {
        l->closing = 1;
        __atomic_store_n(&l->shut, 1, __ATOMIC_RELEASE);
        return 0;
    }
    pthread_mutex_lock(&l->mu);
    if (!l->closing) {
        l->closing = 1;
        __atomic_store_n(&l->shut, 1, __ATOMIC_RELEASE);
        for (int i = 0; i < SHMIPC__MAX_HANDSHAKES; i++)
            if (l->hs[i].used && !l->hs[i].done)
                shutdown(l->hs[i].abort_fd, SHUT_RDWR);
        (void)!write(l->shut_fd, &one, sizeof one);
        (void)!write(l->wake_fd, &one, sizeof one);
    }
    pthread_mutex_unlock(&l->mu);
    return 0;
}

void shmipc__ipc_listener_close(shmipc_listener *l)
{
    shmipc__ipc_listener_shutdown(l);
    listener_leave(l);
}

/*
 * A fork child's copy of its parent's listener (common/proc.h): the sessions waiting for accept
 * are closed as copies too (they are the parent's), and the descriptors and memory go. Not the
 * handshakes' threads, which the child does not have, nor their sockets: a handshake that ended
 * just before the fork may have closed its socket, and the number may mean another file.
 */
static void listener_destroy_local(shmipc_listener *l)
{
    /* Not by ready_pop(): it would drain ready_fd, which is the parent's too. */
    for (uint32_t i = 0; i < l->nready; i++)
        shmipc__session_close(l->ready[i]);
    free(l->ready);
    pthread_mutex_destroy(&l->mu);
    close(l->fd);
    close(l->wake_fd);
    close(l->ready_fd);
    close(l->poll_fd);
    close(l->shut_fd);
    close(l->pause_fd);
    free(l);
}

static void listener_destroy(shmipc_listener *l)
{
    if (shmipc__foreign(l->pid)) {
        listener_destroy_local(l);
        return;
    }
    pthread_mutex_lock(&l->mu);
    l->closing = 1; /* a listener_new that failed half-way never shut down */
    pthread_mutex_unlock(&l->mu);
    reap_handshakes(l, 1);
    for (shmipc_session *s; (s = ready_pop(l)) != NULL;)
        shmipc__session_close(s);
    free(l->ready);
    pthread_mutex_destroy(&l->mu);
    shmipc__unix_unlink(&l->file); /* before the close: a client finds no file, not a refusal */
    close(l->fd);
    if (l->wake_fd >= 0)
        close(l->wake_fd);
    if (l->ready_fd >= 0)
        close(l->ready_fd);
    if (l->poll_fd >= 0)
        close(l->poll_fd);
    if (l->shut_fd >= 0)
        close(l->shut_fd);
    if (l->pause_fd >= 0)
        close(l->pause_fd);
    free(l);
}

/* The sessions a serving listener owns, with the pollfd array that watches them. */
struct served {
    shmipc_session **s;
    struct pollfd *pfd; /* [0] wake, [1] listener, [2] handshakes done, [3 + i] session i */
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
        struct pollfd *np = realloc(v->pfd, (cap + 3) * sizeof *np);
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
    /* The session was processed just before: take what it found, with no system call. */
    while (shmipc__session_accept_queued(s, &st) == 0)
        on_stream(st, user_data);
    /* A few rounds, for callbacks whose reads bring in more; then let other sessions run. */
    for (int round = 0; round < 4; round++) {
        uint32_t n = shmipc__session_take_ready(s, &v->ids, &v->ids_cap);
        if (n == 0)
            return 0;
        for (uint32_t i = 0; i < n; i++)
            if ((st = shmipc__session_handed_out(s, v->ids[i])) != NULL) {
                on_data(st, user_data);
                shmipc__stream_leave(st); /* frees it if its holder closed it meanwhile */
            }
        while (shmipc__session_accept_queued(s, &st) == 0)
            on_stream(st, user_data);
    }
    return 1;
}

/* Takes the sessions whose handshake finished into the served set. */
static void take_sessions(shmipc_listener *l, struct served *v)
{
    shmipc_session *s;
    while ((s = take_ready(l)) != NULL) {
        shmipc__session_track_ready(s);
        if (served_add(v, s) < 0) {
            SHMIPC__LOG(SHMIPC__LOG_ERROR, "listener %s: %s", l->addr.text, shmipc__detail());
            shmipc__session_close(s);
        }
    }
}

int shmipc__ipc_listener_serve(shmipc_listener *l, shmipc_stream_cb on_stream,
                               shmipc_stream_cb on_data, void *user_data, shmipc_destroy_cb destroy)
{
    struct served v = {0};
    int rc = listener_enter(l), again = 0;
    if (rc < 0) {
        /* The registration is refused, but its user_data is ours to free all the same. */
        if (destroy != NULL)
            destroy(user_data);
        return rc;
    }
    if (__atomic_exchange_n(&l->serving, 1, __ATOMIC_ACQ_REL)) {
        if (destroy != NULL)
            destroy(user_data);
        listener_leave(l);
        return shmipc__fail(SHMIPC_EBUSY, "listener %s: another thread is serving", l->addr.text);
    }
    if ((v.pfd = malloc(3 * sizeof *v.pfd)) == NULL) {
        rc = shmipc__fail(SHMIPC_ENOMEM, "listener: out of memory");
        goto out;
    }
    /* The session that had news last turn: the one to spin on before sleeping. */
    shmipc_session *last = NULL;
    unsigned quiet_turns = 0; /* turns served by a spin without a poll */
    /* shutdown() sets shut before it writes wake_fd: either the check or the poll sees it. */
    while (!__atomic_load_n(&l->stopping, __ATOMIC_ACQUIRE)) {
        if (__atomic_load_n(&l->shut, __ATOMIC_ACQUIRE)) {
            rc = shut_error(l);
            break;
        }
        v.pfd[0] = (struct pollfd){.fd = l->wake_fd, .events = POLLIN};
        int pause = accept_pause_left(l); /* paused: the socket is not watched */
        v.pfd[1] = (struct pollfd){.fd = pause > 0 ? -1 : l->fd, .events = POLLIN};
        v.pfd[2] = (struct pollfd){.fd = l->ready_fd, .events = POLLIN};
        for (uint32_t i = 0; i < v.n; i++)
            v.pfd[3 + i] = (struct pollfd){.fd = shmipc__session_fileno(v.s[i]), .events = POLLIN};
        /*
         * Before sleeping, spin on the session that was busy last: a peer in a request and
         * reply exchange answers within the spin, and neither side makes a system call.
         * What it processed is dispatched below as leftover news.
         */
        shmipc_session *spun = NULL;
        if (!again && last != NULL && shmipc__session_spin(last) != 0) {
            again = 1;
            spun = last;
        }
        /*
         * After a spin that found work, the descriptors are polled only every LOOK_EVERY
         * turns: a poll is a system call, about what the rest of a round trip costs, and the
         * spun session is served below without one. New clients and the other sessions wait
         * at most that many turns; stop and shutdown are flags, seen at the loop's top.
         */
        int n = 0;
        if (spun == NULL || ++quiet_turns >= LOOK_EVERY) {
            quiet_turns = 0;
            n = poll(v.pfd, v.n + 3, again ? 0 : pause > 0 ? pause : -1);
        } else {
            for (uint32_t i = 0; i < v.n + 3; i++)
                v.pfd[i].revents = 0;
        }
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
        /* Handshakes run on threads of their own: a stalling client holds up nobody here. */
        if (v.pfd[1].revents && accept_clients(l) < 0)
            SHMIPC__LOG(SHMIPC__LOG_WARN, "%s", shmipc__detail());
        if (v.pfd[2].revents)
            take_sessions(l, &v);
        for (uint32_t i = 0; i < v.n; i++) {
            /* Sessions accepted this turn have no pollfd yet: look at them anyway. */
            if (i < before && v.pfd[3 + i].revents == 0 && !leftover)
                continue;
            /* The spin processed its session already; its descriptor says whether more came. */
            int fired = i < before && v.pfd[3 + i].revents;
            if ((v.s[i] == spun && !fired) || shmipc__session_process(v.s[i]) > 0 || fired)
                last = v.s[i];
            again |= dispatch(v.s[i], &v, on_stream, on_data, user_data);
        }
        /*
         * Drop the sessions that ended, once their streams have heard of it through on_data:
         * a session can end inside a callback, after its last dispatch round.
         */
        for (uint32_t i = 0; i < v.n;) {
            if (shmipc__session_status(v.s[i]) != 0) {
                while (dispatch(v.s[i], &v, on_stream, on_data, user_data))
                    ;
                if (v.s[i] == last)
                    last = NULL;
                shmipc__session_close(v.s[i]);
                v.s[i] = v.s[--v.n];
            } else {
                i++;
            }
        }
    }
out:
    /*
     * The streams still handed out lose their session here: on_data tells their holders, as
     * for any session that ends (their reads now fail with SHMIPC_ECLOSED), so a holder that
     * closes a stream at its end closes these too, before serve returns.
     */
    for (uint32_t i = 0; i < v.n; i++) {
        shmipc__session_shutdown(v.s[i]);
        while (dispatch(v.s[i], &v, on_stream, on_data, user_data))
            ;
        shmipc__session_close(v.s[i]);
    }
    if (rc == SHMIPC_ECLOSED)
        rc = shut_error(l); /* the detail the sessions' closes overwrote */
    free(v.s);
    free(v.pfd);
    free(v.ids);
    __atomic_store_n(&l->stopping, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&l->serving, 0, __ATOMIC_RELEASE);
    if (destroy != NULL)
        destroy(user_data);
    listener_leave(l);
    return rc;
}

int shmipc__ipc_listener_stop(shmipc_listener *l)
{
    uint64_t one = 1;
    __atomic_store_n(&l->stopping, 1, __ATOMIC_RELEASE);
    /* A fork child's copy: wake_fd is the parent's too, whose serve() would wake for nothing.
     * (shmipc__pid() is a load once the listener was made: fine in a signal handler.) */
    if (shmipc__foreign(l->pid))
        return 0;
    /* eventfd writes are async-signal-safe: stop may be called from a signal handler. */
    if (write(l->wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        return shmipc__fail_errno(errno, "listener %s: stop", l->addr.text);
    return 0;
}
