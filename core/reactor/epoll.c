/*
 * The epoll backend. Each connection is registered once, edge-triggered, for input and output
 * (EPOLLIN|EPOLLOUT|EPOLLRDHUP|EPOLLET), and never touched again until close: a keep-alive
 * request costs one epoll_wait, the reads and one sendmsg, and no epoll_ctl. Input is read
 * until the socket would block into one per-loop buffer; output is written at once and, when
 * the socket is full, the rest waits for the EPOLLOUT edge that the registration already asks
 * for. The event data carries the fd and its slot generation, so an event queued for a
 * connection that a callback of the same batch closed, and whose fd number a new connection
 * already took, is recognised as stale and dropped.
 *
 * SHMIPC_RX_EPOLL=0 keeps the older scheme for comparison: EPOLLONESHOT, re-armed with
 * EPOLL_CTL_MOD after every read, which is one epoll_ctl per request.
 */
#include "reactor/backend.h"

#include "common/error.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define FLUSH_IOV 64

struct epoll_state {
    int epfd;
    unsigned char *buf;
    struct epoll_event *events;
    /* Connections whose read budget ran out with input left: edge-triggered epoll will not
     * report that input again, so they are read again next turn, which then does not block. */
    struct shmipc__conn *ready_head, *ready_tail;
};

static struct epoll_state *state(struct shmipc__loop *loop)
{
    return loop->be_state;
}

static int ctl(struct shmipc__loop *loop, int op, const struct shmipc__io *io, uint32_t events)
{
    struct epoll_event ev = {.events = events,
                             .data.u64 = (uint64_t)io->gen << 32 | (uint32_t)io->fd};
    /* Every epoll_ctl goes through here, so the counter is exactly what strace would show. */
    loop->stats.epoll_ctl++;
    if (epoll_ctl(state(loop)->epfd, op, io->fd, &ev) < 0)
        return shmipc__fail_errno(errno, "epoll_ctl(%d, fd %d)", op, io->fd);
    return 0;
}

static int oneshot(const struct shmipc__loop *loop)
{
    return loop->rx_mode == SHMIPC__RX_ONESHOT;
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || ((fl & O_NONBLOCK) == 0 && fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0))
        return shmipc__fail_errno(errno, "fcntl(%d, O_NONBLOCK)", fd);
    return 0;
}

/* Whether the owner of a paused conn waits to hear of the peer's hangup (on_hup). */
static int wants_hup(const struct shmipc__conn *c)
{
    return c->rd_paused && !c->rd_done && !c->hup_told && c->cbs.on_hup != NULL;
}

/* The one-shot mode's re-arm: input unless it ended, output while a send waits, and the
 * hangup alone (EPOLLRDHUP) while paused for an owner that asked for it. */
static void rearm(struct shmipc__loop *loop, struct shmipc__conn *c)
{
    uint32_t ev = EPOLLONESHOT | EPOLLRDHUP;
    if (!c->rd_done && !c->rd_paused)
        ev |= EPOLLIN;
    if (c->tx_blocked)
        ev |= EPOLLOUT;
    if (((ev & (EPOLLIN | EPOLLOUT)) != 0 || wants_hup(c)) &&
        ctl(loop, EPOLL_CTL_MOD, &c->io, ev) < 0)
        SHMIPC__LOG(SHMIPC__LOG_ERROR, "reactor: %s", shmipc__detail());
}

static void flush(struct shmipc__loop *loop, struct shmipc__conn *c)
{
    while (c->tx_head != NULL) {
        struct iovec iov[FLUSH_IOV];
        struct msghdr msg = {0};
        size_t bytes;
        ssize_t n;
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)shmipc__reactor_gather(c, iov, FLUSH_IOV, &bytes);
        /* sendmsg rather than writev only for MSG_NOSIGNAL: a peer gone is an error here,
         * not SIGPIPE. One buffer (the usual small response) goes by send(), which spares
         * the kernel copying and checking a msghdr. */
        if (msg.msg_iovlen == 1)
            n = send(c->io.fd, iov[0].iov_base, iov[0].iov_len, MSG_NOSIGNAL);
        else
            n = sendmsg(c->io.fd, &msg, MSG_NOSIGNAL);
        if (n >= 0) {
            if ((size_t)n < bytes)
                loop->stats.send_partial++;
            shmipc__reactor_sent(c, (size_t)n);
        } else if (errno == EAGAIN) {
            c->tx_blocked = 1;
            if (oneshot(loop))
                rearm(loop, c);
            return;
        } else if (errno != EINTR) {
            shmipc__reactor_send_failed(c, shmipc__code_from_errno(errno));
            return;
        }
    }
}

static void defer(struct shmipc__loop *loop, struct shmipc__conn *c)
{
    struct epoll_state *s = state(loop);
    if (c->in_ready)
        return;
    c->in_ready = 1;
    c->io.refs++;
    c->ready_next = NULL;
    if (s->ready_tail != NULL)
        s->ready_tail->ready_next = c;
    else
        s->ready_head = c;
    s->ready_tail = c;
    loop->stats.deferred++;
}

/*
 * Reads until the socket would block, at most reads_per_event times. A short read also ends
 * it: a stream socket returns less than asked only when its queue is empty, and data arriving
 * later raises a new edge, so the read that would return EAGAIN is skipped. After the peer's
 * FIN was signalled (hup) reads go on until they return 0, which no new edge would announce.
 */
static void conn_read(struct shmipc__loop *loop, struct shmipc__conn *c, int hup)
{
    struct epoll_state *s = state(loop);
    size_t size = loop->recv_buf_size;
    for (unsigned i = 0; i < loop->reads_per_event; i++) {
        ssize_t n;
        /* Paused: the socket keeps what is left; resuming puts the conn on the ready list,
         * since no new edge will announce it. */
        if (c->rd_paused)
            return;
        /* recv, not read: a socket read through the VFS also pays for fdget_pos and the
         * read_iter indirection (both visible in a perf profile of a keep-alive run). */
        n = recv(c->io.fd, s->buf, size, 0);
        if (n > 0) {
            shmipc__reactor_data(c, s->buf, (size_t)n);
            if (c->rd_done || c->rd_paused)
                return;
            if ((size_t)n < size && !hup)
                return;
        } else if (n == 0) {
            shmipc__reactor_end(c, 0);
            return;
        } else if (errno == EAGAIN) {
            return;
        } else if (errno != EINTR) {
            shmipc__reactor_end(c, shmipc__code_from_errno(errno));
            return;
        }
    }
    defer(loop, c);
}

static void conn_event(struct shmipc__loop *loop, struct shmipc__conn *c, uint32_t ev)
{
    if ((ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0)
        c->rd_hup = 1;
    if ((ev & (EPOLLOUT | EPOLLHUP | EPOLLERR)) != 0 && c->tx_blocked) {
        c->tx_blocked = 0;
        flush(loop, c);
    }
    if ((ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0 && !c->rd_done && !c->rd_paused)
        conn_read(loop, c, c->rd_hup);
    /* Paused, the input is not read, but the peer's FIN or reset is reported all the same:
     * its edge will not come again. The read that comes first may have paused it. */
    if (c->rd_hup && !c->io.closed)
        shmipc__reactor_paused_hup(c);
    if (oneshot(loop) && !c->io.closed && !c->in_ready)
        rearm(loop, c);
}

static void accept_drain(struct shmipc__loop *loop, struct shmipc__acceptor *l)
{
    /* Bounded like reads; the rest of the queue is taken at the end of this turn through
     * the listener's timer, since no new edge will announce it. */
    for (unsigned i = 0; i < loop->max_events && !l->io.closed; i++) {
        int fd = accept4(l->io.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0)
            shmipc__reactor_accepted(l, fd);
        else if (errno == EAGAIN || shmipc__reactor_accept_error(l, errno))
            return;
    }
    if (!l->io.closed && shmipc__timer_start(&l->retry, 0) < 0)
        SHMIPC__LOG(SHMIPC__LOG_ERROR, "reactor: %s", shmipc__detail());
}

static void dispatch(struct shmipc__loop *loop, const struct epoll_event *e)
{
    int fd = (int)(uint32_t)e->data.u64;
    struct shmipc__io *io = shmipc__reactor_lookup(loop, fd, (uint32_t)(e->data.u64 >> 32));
    unsigned wev = 0;
    if (io == NULL)
        return;
    switch (io->kind) {
    case SHMIPC__IO_CONN:
        conn_event(loop, (struct shmipc__conn *)io, e->events);
        break;
    case SHMIPC__IO_ACCEPTOR:
        accept_drain(loop, (struct shmipc__acceptor *)io);
        break;
    default:
        if ((e->events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0)
            wev |= SHMIPC__WATCH_READ;
        if ((e->events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) != 0)
            wev |= SHMIPC__WATCH_WRITE;
        shmipc__reactor_watch_ready((struct shmipc__watch *)io, wev);
        break;
    }
}

static int run_ready(struct shmipc__loop *loop)
{
    struct epoll_state *s = state(loop);
    struct shmipc__conn *c = s->ready_head;
    int n = 0;
    s->ready_head = s->ready_tail = NULL;
    while (c != NULL) {
        struct shmipc__conn *next = c->ready_next;
        c->in_ready = 0;
        shmipc__reactor_unref(&c->io);
        if (!c->io.closed && !c->rd_done && !c->rd_paused) {
            conn_read(loop, c, c->rd_hup);
            if (c->rd_hup && !c->io.closed)
                shmipc__reactor_paused_hup(c);
            n++;
        } else if (!c->io.closed && c->rd_hup && wants_hup(c)) {
            shmipc__reactor_paused_hup(c); /* paused after the hangup's edge (read_pause) */
            n++;
        }
        /* Whatever it came for: the event that put it here skipped the re-arm (in_ready), and
         * a paused conn whose hangup was told meanwhile still waits for EPOLLOUT. */
        if (oneshot(loop) && !c->io.closed && !c->in_ready)
            rearm(loop, c);
        c = next;
    }
    return n;
}

static int ep_poll(struct shmipc__loop *loop, int64_t timeout_ns)
{
    struct epoll_state *s = state(loop);
    int timeout_ms;
    int n;
    if (s->ready_head != NULL)
        timeout_ns = 0;
    /* Rounded up: waking before the deadline would only spin. */
    if (timeout_ns < 0)
        timeout_ms = -1;
    else if (timeout_ns >= (int64_t)INT_MAX * 1000000)
        timeout_ms = INT_MAX;
    else
        timeout_ms = (int)((timeout_ns + 999999) / 1000000);
    loop->stats.waits++;
    n = epoll_wait(s->epfd, s->events, (int)loop->max_events, timeout_ms);
    if (n < 0) {
        if (errno != EINTR)
            return shmipc__fail_errno(errno, "epoll_wait");
        n = 0;
    }
    /* The turn's clock was read before the wait: callbacks start timers from it. */
    if (timeout_ms != 0)
        loop->now_ns = shmipc__reactor_now_ns(loop);
    loop->stats.events += (uint64_t)n;
    for (int i = 0; i < n; i++)
        dispatch(loop, &s->events[i]);
    return n + run_ready(loop);
}

static int ep_add(struct shmipc__loop *loop, struct shmipc__io *io, int fresh)
{
    int rc = 0;
    switch (io->kind) {
    case SHMIPC__IO_CONN:
        /* Accepted fds are non-blocking already (accept4 SOCK_NONBLOCK). */
        if (!fresh)
            rc = set_nonblock(io->fd);
        if (rc == 0)
            rc = ctl(loop, EPOLL_CTL_ADD, io,
                     oneshot(loop) ? EPOLLIN | EPOLLRDHUP | EPOLLONESHOT
                                   : EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET);
        return rc;
    case SHMIPC__IO_ACCEPTOR: {
        struct shmipc__acceptor *l = (struct shmipc__acceptor *)io;
        /* Called again by the retry timer: the queue is drained, as no edge will come. */
        if (l->armed) {
            accept_drain(loop, l);
            return 0;
        }
        rc = set_nonblock(io->fd);
        if (rc == 0)
            rc = ctl(loop, EPOLL_CTL_ADD, io, EPOLLIN | EPOLLET);
        l->armed = rc == 0;
        return rc;
    }
    default: {
        const struct shmipc__watch *w = (const struct shmipc__watch *)io;
        uint32_t ev = EPOLLET;
        if ((w->events & SHMIPC__WATCH_READ) != 0)
            ev |= EPOLLIN;
        if ((w->events & SHMIPC__WATCH_WRITE) != 0)
            ev |= EPOLLOUT;
        return ctl(loop, EPOLL_CTL_ADD, io, ev);
    }
    }
}

static void ep_del(struct shmipc__loop *loop, struct shmipc__io *io)
{
    /* Closing the last reference to a file removes it from the epoll set, so conns and
     * listeners need no EPOLL_CTL_DEL; a watched fd stays open and must be removed. */
    if (io->kind == SHMIPC__IO_WATCH) {
        if (ctl(loop, EPOLL_CTL_DEL, io, 0) < 0)
            SHMIPC__LOG(SHMIPC__LOG_WARN, "reactor: %s", shmipc__detail());
    } else {
        close(io->fd);
    }
}

static void ep_send(struct shmipc__loop *loop, struct shmipc__conn *c)
{
    if (!c->tx_blocked)
        flush(loop, c);
}

/* Nothing to do: reads check the flag, and the registration stays (one-shot mode re-arms
 * without EPOLLIN at the end of the event), so pausing costs no system call. A hangup whose
 * edge came already is reported from the ready list, as no edge will announce it again. */
static void ep_read_pause(struct shmipc__loop *loop, struct shmipc__conn *c)
{
    if (c->rd_hup && wants_hup(c))
        defer(loop, c);
}

/* Edges that came while paused were consumed without a read, so the conn is read from the
 * ready list (next dispatch) until the socket would block; one-shot mode re-arms there. */
static void ep_read_resume(struct shmipc__loop *loop, struct shmipc__conn *c)
{
    if (!c->rd_done)
        defer(loop, c);
}

static void ep_destroy(struct shmipc__loop *loop)
{
    struct epoll_state *s = state(loop);
    if (s == NULL)
        return;
    for (struct shmipc__conn *c = s->ready_head; c != NULL; c = c->ready_next)
        shmipc__reactor_unref(&c->io);
    if (s->epfd >= 0)
        close(s->epfd);
    free(s->buf);
    free(s->events);
    free(s);
    loop->be_state = NULL;
}

static int ep_init(struct shmipc__loop *loop, int *setup_errno)
{
    struct epoll_state *s;
    int rc;
    (void)setup_errno;
    s = calloc(1, sizeof *s);
    if (s == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "epoll backend");
    loop->be_state = s;
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (s->epfd < 0) {
        rc = shmipc__fail_errno(errno, "epoll_create1");
        goto err;
    }
    s->buf = malloc(loop->recv_buf_size);
    s->events = calloc(loop->max_events, sizeof *s->events);
    if (s->buf == NULL || s->events == NULL) {
        rc = shmipc__fail(SHMIPC_ENOMEM, "epoll backend: %zu-byte receive buffer",
                          loop->recv_buf_size);
        goto err;
    }
    return 0;
err:
    ep_destroy(loop);
    return rc;
}

/* Bytes are in the socket or already delivered, never in between: a receive now keeps the
 * order. A failure or the end of input is left for conn_read() to meet again (the end
 * repeats; a reset reads as the end once its error was taken here). */
static size_t ep_read_now(struct shmipc__loop *loop, struct shmipc__conn *c, void *buf, size_t len)
{
    (void)loop;
    ssize_t n = recv(c->io.fd, buf, len, MSG_DONTWAIT);
    return n > 0 ? (size_t)n : 0;
}

const struct shmipc__backend shmipc__backend_epoll = {
    .name = "epoll",
    .init = ep_init,
    .destroy = ep_destroy,
    .add = ep_add,
    .del = ep_del,
    .send = ep_send,
    .read_pause = ep_read_pause,
    .read_resume = ep_read_resume,
    .read_now = ep_read_now,
    .poll = ep_poll,
};
