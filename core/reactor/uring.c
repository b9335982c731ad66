/*
 * The io_uring backend: completions, not readiness. A listener has one multishot accept armed;
 * a connection has one multishot receive that picks its buffers from a ring of provided
 * buffers, each handed back to the kernel as soon as on_data returns; sends are SEND or
 * SENDMSG SQEs, one in flight per connection so that bytes keep their order, continued from
 * the completion when the socket took less. Every loop turn makes one io_uring_enter that
 * submits what the previous turn's callbacks queued and waits, with the first timer's
 * deadline as the wait timeout.
 *
 * Batched waits: when at least BATCH_MIN_ACTIVE connections received in the last window
 * (about a millisecond), the wait asks the kernel for as many completions as there are such
 * connections, plus the completions of the sends it submits, and lets it hold them back up
 * to batch_us (the MIN_TIMEOUT wait of kernel 6.12; before that, the wait's timeout is cut to
 * batch_us instead). Under load one wakeup then carries many requests instead of about one.
 * A batched wait that gathers little (clients that send rarely) pauses batching for a while.
 * A lone client, or a few, is never held back. docs/reactor.md has the measurements;
 * uring_batch.c holds the controller and the enter.
 *
 * Sockets stay blocking (O_NONBLOCK cleared on fds we did not accept ourselves): on an
 * O_NONBLOCK file io_uring returns -EAGAIN instead of arming its internal poll, which would
 * turn completions back into readiness.
 *
 * user_data is either a connection's address with OP_SEND in its low bits (a send must find
 * its connection even after close, to complete its callback), or op | fd << 4 | generation
 * << 36, looked up in the slot table so that a completion for a closed, maybe reused, fd is
 * recognised as stale (its buffer is still recycled).
 *
 * No SQE ever names a closed fd: conns and listeners are closed by an IORING_OP_CLOSE queued
 * behind their last SQE, never by close() while SQEs naming the fd wait in the SQ
 * (close_after_sqes() says why).
 *
 * This file owns the submissions (arming receives, accepts and polls, sends, cancels, the
 * closes behind the last SQE), the completion dispatch and the backend table. The ring's
 * setup, probe and teardown are uring_setup.c's, the batched waits uring_batch.c's; the three
 * share uring_int.h. May call: the reactor's common parts (backend.h), liburing, common/.
 */
#include "reactor/uring_int.h"

#include "common/error.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

enum {
    OP_RECV = 1,
    OP_ACCEPT,
    OP_POLL,
    OP_SEND,
    OP_IGNORE,
    OP_HUP,
};

#define OP_MASK  UINT64_C(15)
#define SEND_MAX (1u << 30) /* an SQE length is 32 bits; larger sends continue */

static uint64_t ud_io(const struct shmipc__io *io, unsigned op)
{
    return (uint64_t)io->gen << 36 | (uint64_t)(uint32_t)io->fd << 4 | op;
}

static struct io_uring_sqe *get_sqe(struct shmipc__loop *loop)
{
    struct uring_state *s = state(loop);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
    /* Only a turn that queues more than ring_entries SQEs pays this extra enter. */
    if (sqe == NULL && s->enabled) {
        loop->stats.submits++;
        if (io_uring_submit(&s->ring) >= 0)
            sqe = io_uring_get_sqe(&s->ring);
        /* Those sends' completions may be consumed this turn: count fewer, not more, so that
         * a batched wait never asks for completions that cannot come. */
        s->sends_queued = 0;
    }
    if (sqe == NULL)
        shmipc__fail(SHMIPC_ENOMEM, "io_uring: submission queue full (%u entries)",
                     loop->ring_entries);
    return sqe;
}

static void recycle(struct uring_state *s, unsigned bid)
{
    io_uring_buf_ring_add(s->br, s->bufs + (size_t)bid * s->buf_size, s->buf_size,
                          (unsigned short)bid, io_uring_buf_ring_mask(s->nbufs), 0);
    io_uring_buf_ring_advance(s->br, 1);
}

static int set_blocking(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || ((fl & O_NONBLOCK) != 0 && fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0))
        return shmipc__fail_errno(errno, "fcntl(%d, ~O_NONBLOCK)", fd);
    return 0;
}

static int arm_recv(struct shmipc__loop *loop, struct shmipc__conn *c)
{
    struct io_uring_sqe *sqe = get_sqe(loop);
    if (sqe == NULL)
        return SHMIPC_ENOMEM;
    io_uring_prep_recv_multishot(sqe, c->io.fd, NULL, 0, 0);
    sqe->flags |= IOSQE_BUFFER_SELECT;
    sqe->buf_group = BGID;
    io_uring_sqe_set_data64(sqe, ud_io(&c->io, OP_RECV));
    c->rx_armed = 1;
    return 0;
}

static int arm_accept(struct shmipc__loop *loop, struct shmipc__acceptor *l)
{
    struct io_uring_sqe *sqe = get_sqe(loop);
    if (sqe == NULL)
        return SHMIPC_ENOMEM;
    io_uring_prep_multishot_accept(sqe, l->io.fd, NULL, NULL, SOCK_CLOEXEC);
    io_uring_sqe_set_data64(sqe, ud_io(&l->io, OP_ACCEPT));
    l->armed = 1;
    return 0;
}

static int arm_poll(struct shmipc__loop *loop, struct shmipc__watch *w)
{
    struct io_uring_sqe *sqe = get_sqe(loop);
    unsigned mask = 0;
    if (sqe == NULL)
        return SHMIPC_ENOMEM;
    if ((w->events & SHMIPC__WATCH_READ) != 0)
        mask |= POLLIN;
    if ((w->events & SHMIPC__WATCH_WRITE) != 0)
        mask |= POLLOUT;
    io_uring_prep_poll_multishot(sqe, w->io.fd, mask);
    io_uring_sqe_set_data64(sqe, ud_io(&w->io, OP_POLL));
    return 0;
}

/* A paused conn's receive is cancelled, so nothing would hear the peer leave: a one-shot poll
 * for its hangup (POLLRDHUP; POLLHUP and POLLERR always) stands in while the owner asked. */
static void arm_hup(struct shmipc__loop *loop, struct shmipc__conn *c)
{
    struct io_uring_sqe *sqe = get_sqe(loop);
    if (sqe == NULL) {
        SHMIPC__LOG(SHMIPC__LOG_WARN, "reactor: no hangup poll for fd %d: %s", c->io.fd,
                    shmipc__detail());
        return;
    }
    io_uring_prep_poll_add(sqe, c->io.fd, POLLRDHUP);
    io_uring_sqe_set_data64(sqe, ud_io(&c->io, OP_HUP));
    c->hup_armed = 1;
}

static void cancel(struct shmipc__loop *loop, uint64_t ud)
{
    struct io_uring_sqe *sqe = get_sqe(loop);
    if (sqe == NULL) {
        SHMIPC__LOG(SHMIPC__LOG_ERROR, "reactor: cannot cancel: %s", shmipc__detail());
        return;
    }
    io_uring_prep_cancel64(sqe, ud, IORING_ASYNC_CANCEL_ALL);
    io_uring_sqe_set_data64(sqe, OP_IGNORE);
    sqe->flags |= IOSQE_CQE_SKIP_SUCCESS;
}

/*
 * Closes the fd of a conn or listener being deleted, after every SQE already queued for it.
 *
 * An SQE names a bare fd number, which the kernel resolves to a file only when it submits
 * the SQE, at the next enter. The fd table is the process's, shared by every worker: once
 * close() frees the number, another worker's accept takes it at once, and a send or receive
 * SQE still waiting in this loop's SQ then writes this conn's response to that worker's new
 * client, or reads that client's request (issue 18: 410 of 32,462 checked responses went to
 * the wrong client in 1.5 s, test_server_xtalk). So the close is an SQE itself, queued behind
 * the conn's last SQE (its sends, its receive, their cancels): the kernel issues SQEs in
 * order, each earlier one takes its own reference to the file as it is issued (unlinked, not
 * IOSQE_ASYNC: inline, within the submitting enter), and the CLOSE after them only drops the
 * table's. The number cannot be reused before those SQEs hold the file, and a request still
 * in flight keeps the socket itself alive, as before.
 *
 * Cost: none per request, and per connection one SQE in place of the close() system call
 * (the close rides on the enter that the loop makes anyway; IOSQE_CQE_SKIP_SUCCESS posts no
 * completion). The alternatives: submitting before close() costs an extra enter per closed
 * connection; fixed (registered) files would make every SQE safe by construction but need a
 * table update per accept (or the kernel's direct-descriptor accept, which hands the fd to
 * no one else: TCP_NODELAY and shutdown() on it would need SQEs too).
 *
 * When no SQE can be had (the SQ full and its submission failing), the fd waits in late_fds
 * and is closed once an enter has submitted everything queued before it.
 *
 * This rests on every SQE naming a conn's fd being issued inline by the enter that submits
 * it. Do not add IOSQE_ASYNC, IOSQE_IO_DRAIN or links to the send, receive, accept or poll
 * SQEs, nor set up the ring with SQPOLL, without revisiting it: an SQE punted to io-wq or
 * deferred by a drain resolves its fd later, after the CLOSE may have run.
 */
static void close_after_sqes(struct shmipc__loop *loop, int fd)
{
    struct uring_state *s = state(loop);
    struct io_uring_sqe *sqe = get_sqe(loop);
    if (sqe != NULL) {
        io_uring_prep_close(sqe, fd);
        io_uring_sqe_set_data64(sqe, OP_IGNORE);
        sqe->flags |= IOSQE_CQE_SKIP_SUCCESS;
        return;
    }
    if (s->late_n == s->late_cap) {
        unsigned cap = s->late_cap ? s->late_cap * 2 : 16;
        int *grown = realloc(s->late_fds, cap * sizeof *grown);
        if (grown == NULL) {
            /* A leaked fd is better than a response sent to a stranger: it stays open. */
            SHMIPC__LOG(SHMIPC__LOG_ERROR, "reactor: fd %d left open: no memory to close it", fd);
            return;
        }
        s->late_fds = grown;
        s->late_cap = cap;
    }
    s->late_fds[s->late_n++] = fd;
}

/* Closes the late fds once the kernel has taken every SQE queued before them. */
static void close_late(struct uring_state *s)
{
    if (s->late_n == 0 ||
        s->ring.sq.sqe_tail != __atomic_load_n(s->ring.sq.khead, __ATOMIC_ACQUIRE))
        return;
    for (unsigned i = 0; i < s->late_n; i++)
        close(s->late_fds[i]);
    s->late_n = 0;
}

static void ur_send(struct shmipc__loop *loop, struct shmipc__conn *c)
{
    const struct shmipc__send_req *r = c->tx_head;
    struct io_uring_sqe *sqe;
    struct iovec *iov = c->tx_iov;
    size_t bytes = 0;
    int k;
    if (c->tx_busy || c->io.closed || r == NULL)
        return;
    if (r->next == NULL || r->n - r->idx >= SHMIPC__CONN_TX_IOV) {
        /* A lone request (or a long one) goes from its own iovec array, however long: a
         * batch of pipelined responses leaves in one SENDMSG. */
        iov = r->iov + r->idx;
        k = r->n - r->idx;
        for (int i = 0; i < k; i++)
            bytes += iov[i].iov_len;
    } else {
        /* Several short requests are coalesced into the connection's array. */
        k = shmipc__reactor_gather(c, c->tx_iov, SHMIPC__CONN_TX_IOV, &bytes);
    }
    sqe = get_sqe(loop);
    if (sqe == NULL) {
        shmipc__reactor_send_failed(c, SHMIPC_ENOMEM);
        return;
    }
    if (k == 1) {
        if (bytes > SEND_MAX)
            bytes = SEND_MAX;
        io_uring_prep_send(sqe, c->io.fd, iov[0].iov_base, bytes, MSG_NOSIGNAL);
    } else {
        memset(&c->msg, 0, sizeof c->msg);
        c->msg.msg_iov = iov;
        c->msg.msg_iovlen = (size_t)k;
        io_uring_prep_sendmsg(sqe, c->io.fd, &c->msg, MSG_NOSIGNAL);
    }
    io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)c | OP_SEND);
    state(loop)->sends_queued++;
    c->tx_flight = bytes;
    c->tx_busy = 1;
    c->io.refs++;
}

static void send_done(struct shmipc__loop *loop, struct shmipc__conn *c, int res)
{
    c->tx_busy = 0;
    shmipc__reactor_unref(&c->io);
    if (c->io.closed)
        shmipc__reactor_send_failed(c, SHMIPC_ECLOSED);
    else if (res >= 0) {
        if ((size_t)res < c->tx_flight)
            loop->stats.send_partial++;
        shmipc__reactor_sent(c, (size_t)res);
        ur_send(loop, c);
    } else if (res == -EINTR || res == -EAGAIN) {
        ur_send(loop, c);
    } else {
        shmipc__reactor_send_failed(c, shmipc__code_from_errno(-res));
    }
}

/* The receive of a paused conn ended: an end of input waits for the resume (the owner that
 * asked hears of it now: on_hup), anything else (the cancel, -ENOBUFS) is re-armed by the
 * resume. */
static void recv_ended_paused(struct shmipc__conn *c, int res)
{
    if (res == 0 || (res < 0 && res != -ECANCELED && res != -ENOBUFS && res != -EINTR)) {
        c->held_end = 1;
        c->held_status = res == 0 ? 0 : shmipc__code_from_errno(-res);
        shmipc__reactor_paused_hup(c);
    }
}

/* The hangup poll of a paused conn completed: the peer left, or the poll was cancelled by a
 * resume (armed again if the conn was paused again since). */
static void hup_done(struct shmipc__loop *loop, struct shmipc__conn *c, int res)
{
    if (c == NULL)
        return;
    c->hup_armed = 0;
    if (c->io.closed || c->rd_done || !c->rd_paused || c->hup_told || c->cbs.on_hup == NULL)
        return;
    if (res > 0)
        shmipc__reactor_paused_hup(c);
    else if (res == -ECANCELED)
        arm_hup(loop, c);
}

static void recv_done(struct shmipc__loop *loop, struct shmipc__conn *c,
                      const struct io_uring_cqe *cqe)
{
    struct uring_state *s = state(loop);
    int res = cqe->res;
    if ((cqe->flags & IORING_CQE_F_BUFFER) != 0) {
        unsigned bid = cqe->flags >> IORING_CQE_BUFFER_SHIFT;
        const unsigned char *data = s->bufs + (size_t)bid * s->buf_size;
        if (c != NULL && res > 0 && (c->rd_paused || c->held_len > 0) && !c->rd_done) {
            /* Completed before the cancel took effect (bounded by what the kernel posted
             * meanwhile), or behind bytes held so: kept in order, and the buffer goes back
             * to the ring now. */
            if (shmipc__reactor_hold(c, data, (size_t)res) < 0) {
                c->held_end = 1;
                c->held_status = SHMIPC_ENOMEM;
            }
        } else if (c != NULL && res > 0) {
            s->last_rx_ns = loop->now_ns;
            s->window_receives++;
            if (c->rx_window != s->window) {
                c->rx_window = s->window;
                s->window_active++;
            }
            shmipc__reactor_data(c, data, (size_t)res);
        }
        recycle(s, bid);
    }
    if (c == NULL || (cqe->flags & IORING_CQE_F_MORE) != 0)
        return;
    c->rx_armed = 0;
    c->rx_cancel = 0;
    if (c->rd_done || c->io.closed)
        return;
    if (c->rd_paused || c->held_len > 0) {
        /* Held bytes go first: the resumed list delivers them, then the end or a new
         * receive. */
        recv_ended_paused(c, res);
        return;
    }
    /* Cancelled by a pause that a resume has undone since: receive again. */
    if (res == -ECANCELED) {
        if (arm_recv(loop, c) < 0)
            shmipc__reactor_end(c, SHMIPC_ENOMEM);
        return;
    }
    /* The kernel ended the multishot receive without an end of input: it ran out of
     * provided buffers (they are back by the next enter) or stopped for its own reasons. */
    if (res > 0 || res == -ENOBUFS || res == -EINTR) {
        if (res == -ENOBUFS)
            loop->stats.enobufs++;
        loop->stats.recv_rearm++;
        if (arm_recv(loop, c) < 0)
            shmipc__reactor_end(c, SHMIPC_ENOMEM);
        return;
    }
    shmipc__reactor_end(c, res == 0 ? 0 : shmipc__code_from_errno(-res));
}

static void accept_done(struct shmipc__loop *loop, struct shmipc__acceptor *l,
                        const struct io_uring_cqe *cqe)
{
    int paused = 0;
    if (l == NULL) {
        /* Accepted just before the listener was closed: nobody wants it. */
        if (cqe->res >= 0)
            close(cqe->res);
        return;
    }
    if (cqe->res >= 0)
        shmipc__reactor_accepted(l, cqe->res);
    else
        paused = shmipc__reactor_accept_error(l, -cqe->res);
    if (l->io.closed || (cqe->flags & IORING_CQE_F_MORE) != 0)
        return;
    l->armed = 0;
    if (!paused && arm_accept(loop, l) < 0)
        SHMIPC__LOG(SHMIPC__LOG_ERROR, "reactor: accept on fd %d: %s", l->io.fd, shmipc__detail());
}

static void poll_done(struct shmipc__loop *loop, struct shmipc__watch *w,
                      const struct io_uring_cqe *cqe)
{
    unsigned ev = 0;
    if (w == NULL)
        return;
    if (cqe->res < 0) {
        /*
         * The kernel ended the poll with an error (-ECANCELED: cancelled by another hand, or
         * a multishot it could not post on some kernels; -ENOMEM). A watch must not go deaf:
         * its owner looks, since an event may have gone with the poll, and the poll is armed
         * again; a bad fd is not re-armed (it would fail at once, forever) and the owner's
         * own I/O on it reports the error.
         */
        SHMIPC__LOG(SHMIPC__LOG_WARN, "reactor: watch on fd %d: poll ended: %s%s", w->io.fd,
                    strerror(-cqe->res), cqe->res == -EBADF ? "" : " (armed again)");
        shmipc__reactor_watch_ready(w, w->events);
        if (!w->io.closed && cqe->res != -EBADF && arm_poll(loop, w) < 0)
            SHMIPC__LOG(SHMIPC__LOG_ERROR, "reactor: %s", shmipc__detail());
        return;
    }
    if ((cqe->res & (POLLIN | POLLHUP | POLLERR)) != 0)
        ev |= SHMIPC__WATCH_READ;
    if ((cqe->res & (POLLOUT | POLLHUP | POLLERR)) != 0)
        ev |= SHMIPC__WATCH_WRITE;
    shmipc__reactor_watch_ready(w, ev);
    if (!w->io.closed && (cqe->flags & IORING_CQE_F_MORE) == 0 && arm_poll(loop, w) < 0)
        SHMIPC__LOG(SHMIPC__LOG_ERROR, "reactor: %s", shmipc__detail());
}

static void handle(struct shmipc__loop *loop, const struct io_uring_cqe *cqe)
{
    uint64_t ud = cqe->user_data;
    unsigned op = (unsigned)(ud & OP_MASK);
    struct shmipc__io *io;
    if (op == OP_SEND) {
        send_done(loop, (struct shmipc__conn *)(uintptr_t)(ud & ~OP_MASK), cqe->res);
        return;
    }
    if (op == OP_IGNORE)
        return;
    io = shmipc__reactor_lookup(loop, (int)(uint32_t)(ud >> 4), (uint32_t)(ud >> 36));
    switch (op) {
    case OP_RECV:
        recv_done(loop,
                  io != NULL && io->kind == SHMIPC__IO_CONN ? (struct shmipc__conn *)io : NULL,
                  cqe);
        break;
    case OP_HUP:
        hup_done(loop, io != NULL && io->kind == SHMIPC__IO_CONN ? (struct shmipc__conn *)io : NULL,
                 cqe->res);
        break;
    case OP_ACCEPT:
        accept_done(loop,
                    io != NULL && io->kind == SHMIPC__IO_ACCEPTOR ? (struct shmipc__acceptor *)io
                                                                  : NULL,
                    cqe);
        break;
    default:
        poll_done(loop,
                  io != NULL && io->kind == SHMIPC__IO_WATCH ? (struct shmipc__watch *)io : NULL,
                  cqe);
        break;
    }
}

static void ur_read_pause(struct shmipc__loop *loop, struct shmipc__conn *c)
{
    /* A multishot receive cannot be suspended, only cancelled; what it completes before the
     * cancel runs is held (recv_done). */
    if (c->rx_armed && !c->rx_cancel) {
        cancel(loop, ud_io(&c->io, OP_RECV));
        c->rx_cancel = 1;
    }
    if (c->cbs.on_hup != NULL && !c->hup_told && !c->hup_armed && !c->rd_done)
        arm_hup(loop, c);
}

static void ur_read_resume(struct shmipc__loop *loop, struct shmipc__conn *c)
{
    struct uring_state *s = state(loop);
    if (c->hup_armed)
        cancel(loop, ud_io(&c->io, OP_HUP));
    /* A receive still armed (its cancel not yet completed) is re-armed by its last
     * completion; otherwise the resumed list delivers what is held and arms a new one. */
    if (c->in_ready || (c->rx_armed && c->held_len == 0 && !c->held_end))
        return;
    c->in_ready = 1;
    c->io.refs++;
    c->ready_next = NULL;
    if (s->resumed_tail != NULL)
        s->resumed_tail->ready_next = c;
    else
        s->resumed_head = c;
    s->resumed_tail = c;
}

static int run_resumed(struct shmipc__loop *loop)
{
    struct uring_state *s = state(loop);
    struct shmipc__conn *c = s->resumed_head;
    int n = 0;
    s->resumed_head = s->resumed_tail = NULL;
    while (c != NULL) {
        struct shmipc__conn *next = c->ready_next;
        c->in_ready = 0;
        shmipc__reactor_unref(&c->io);
        if (!c->io.closed && !c->rd_paused) {
            shmipc__reactor_deliver_held(c);
            if (!c->io.closed && !c->rd_done && !c->rd_paused && !c->rx_armed &&
                arm_recv(loop, c) < 0)
                shmipc__reactor_end(c, SHMIPC_ENOMEM);
            n++;
        }
        c = next;
    }
    return n;
}

static int ur_poll(struct shmipc__loop *loop, int64_t timeout_ns)
{
    struct uring_state *s = state(loop);
    struct io_uring_cqe *cqe;
    int n = 0;
    int resumed = 0;
    int rc;

    if (s->resumed_head != NULL) {
        /* Before waiting: a resumed conn's held bytes must not wait for unrelated events,
         * and its new receive goes out with this enter. */
        resumed = run_resumed(loop);
        timeout_ns = 0;
    }

    if (!s->enabled) {
        /* The ring was created disabled so that the thread that runs the loop, not the one
         * that created it, becomes its single issuer. Debian's liburing 2.3 declares
         * io_uring_enable_rings() but does not export it, hence the raw system call. */
        if (syscall(__NR_io_uring_register, s->ring.ring_fd, IORING_REGISTER_ENABLE_RINGS, NULL,
                    0) < 0)
            return shmipc__fail_errno(errno, "io_uring_register(ENABLE_RINGS)");
        s->enabled = 1;
        /* Saves the fd lookup on every enter; optional, so a failure only costs that. */
        s->ring_registered = io_uring_register_ring_fd(&s->ring) == 1;
        if (!s->ring_registered)
            SHMIPC__LOG(SHMIPC__LOG_DEBUG, "reactor: io_uring_register_ring_fd failed");
    }
    /* Completions left by the previous turn's budget are served without entering, unless
     * there is something to submit. */
    if (io_uring_cq_ready(&s->ring) == 0 || io_uring_sq_ready(&s->ring) > 0) {
        loop->stats.waits++;
        rc = shmipc__uring_submit_and_wait(loop, s, timeout_ns);
        if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EBUSY && rc != -EAGAIN)
            return shmipc__fail_errno(-rc, "io_uring_enter");
        close_late(s);
        /* The turn's clock was read before the wait: callbacks start timers from it. */
        if (timeout_ns != 0) {
            uint64_t before = loop->now_ns;
            loop->now_ns = shmipc__reactor_now_ns(loop);
            /* A trial that slept through a window saw the load stop: it starts again. */
            if (loop->now_ns - before >= WINDOW_NS &&
                (s->ctl == CTL_TRY_PLAIN || s->ctl == CTL_TRY_BATCH))
                s->ctl = CTL_START;
        }
    }
    while (n < (int)loop->max_events && io_uring_peek_cqe(&s->ring, &cqe) == 0) {
        /* Copied and consumed first, so a callback that submits cannot run the CQ over. */
        struct io_uring_cqe c = *cqe;
        io_uring_cqe_seen(&s->ring, cqe);
        handle(loop, &c);
        n++;
    }
    loop->stats.events += (uint64_t)n;
    return n + resumed;
}

static int ur_add(struct shmipc__loop *loop, struct shmipc__io *io, int fresh)
{
    int rc = 0;
    switch (io->kind) {
    case SHMIPC__IO_CONN:
        if (!fresh)
            rc = set_blocking(io->fd);
        return rc < 0 ? rc : arm_recv(loop, (struct shmipc__conn *)io);
    case SHMIPC__IO_ACCEPTOR: {
        struct shmipc__acceptor *l = (struct shmipc__acceptor *)io;
        if (l->armed)
            return 0;
        rc = set_blocking(io->fd);
        return rc < 0 ? rc : arm_accept(loop, l);
    }
    default:
        return arm_poll(loop, (struct shmipc__watch *)io);
    }
}

static void ur_del(struct shmipc__loop *loop, struct shmipc__io *io)
{
    /* Requests are cancelled by user_data, not by fd; the fd is closed by an SQE behind
     * them (close_after_sqes()). The kernel keeps its own reference to the socket until the
     * cancellations run at the next enter, and only then does the peer see the FIN. A
     * watch's fd stays its owner's: its poll SQE is cancelled, and a poll moves no data. */
    switch (io->kind) {
    case SHMIPC__IO_CONN: {
        struct shmipc__conn *c = (struct shmipc__conn *)io;
        cancel(loop, ud_io(io, OP_RECV));
        if (c->hup_armed)
            cancel(loop, ud_io(io, OP_HUP));
        if (c->tx_busy)
            cancel(loop, (uint64_t)(uintptr_t)c | OP_SEND);
        close_after_sqes(loop, io->fd);
        break;
    }
    case SHMIPC__IO_ACCEPTOR:
        if (((struct shmipc__acceptor *)io)->armed)
            cancel(loop, ud_io(io, OP_ACCEPT));
        close_after_sqes(loop, io->fd);
        break;
    default:
        cancel(loop, ud_io(io, OP_POLL));
        break;
    }
}

const struct shmipc__backend shmipc__backend_uring = {
    .name = "io_uring",
    .init = shmipc__uring_init,
    .destroy = shmipc__uring_destroy,
    .add = ur_add,
    .del = ur_del,
    .send = ur_send,
    .read_pause = ur_read_pause,
    .read_resume = ur_read_resume,
    .poll = ur_poll,
};
