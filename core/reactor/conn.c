/* Connections, their send queues, listeners and watches: the part of the reactor that is the
 * same on every backend. */
#include "reactor/backend.h"

#include "common/error.h"
#include "common/log.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define ACCEPT_PAUSE_MS 100

static int check_thread(const struct shmipc__loop *loop, const char *what)
{
    if (!shmipc__reactor_on_thread(loop))
        return shmipc__fail(SHMIPC_EBUSY, "%s: called from a thread that does not own the loop",
                            what);
    return 0;
}

static void push_closing(struct shmipc__loop *loop, struct shmipc__io *io)
{
    io->closing_next = loop->closing;
    loop->closing = io;
}

/* ---- send completions ---- */

/* Send callbacks always run later, from the loop, so that a callback never re-enters the
 * code that called send(). The reference keeps the conn's memory until then. */
static void complete(struct shmipc__send_req *r, int status)
{
    struct shmipc__loop *loop = r->conn->loop;
    r->status = status;
    r->next = NULL;
    r->conn->io.refs++;
    if (loop->done_tail != NULL)
        loop->done_tail->next = r;
    else
        loop->done_head = r;
    loop->done_tail = r;
}

int shmipc__reactor_run_done(struct shmipc__loop *loop)
{
    struct shmipc__send_req *r = loop->done_head;
    int n = 0;
    /* Completions that these callbacks cause wait for the next turn, which then does not
     * block: work per turn stays bounded. */
    loop->done_head = loop->done_tail = NULL;
    while (r != NULL) {
        struct shmipc__send_req *next = r->next;
        struct shmipc__conn *c = r->conn;
        if (r->cb != NULL)
            r->cb(c, r->status, r->data);
        shmipc__reactor_unref(&c->io);
        if (r->n > SHMIPC__REQ_POOL_IOV)
            free(r->iov);
        else if (r->n > SHMIPC__REQ_INLINE_IOV)
            shmipc__objpool_put(&loop->iov_pool, r->iov);
        shmipc__objpool_put(&loop->req_pool, r);
        n++;
        r = next;
    }
    return n;
}

static void do_shutdown(struct shmipc__conn *c)
{
    c->shut_pending = 0;
    if (shutdown(c->io.fd, SHUT_WR) < 0)
        SHMIPC__LOG(SHMIPC__LOG_DEBUG, "reactor: shutdown(%d): %s", c->io.fd, strerror(errno));
}

int shmipc__reactor_gather(const struct shmipc__conn *c, struct iovec *iov, int max, size_t *bytes)
{
    int k = 0;
    size_t total = 0;
    for (const struct shmipc__send_req *r = c->tx_head; r != NULL && k < max; r = r->next)
        for (int i = r->idx; i < r->n && k < max; i++) {
            if (r->iov[i].iov_len == 0)
                continue;
            iov[k++] = r->iov[i];
            total += r->iov[i].iov_len;
        }
    *bytes = total;
    return k;
}

void shmipc__reactor_sent(struct shmipc__conn *c, size_t n)
{
    c->tx_bytes -= n;
    while (c->tx_head != NULL) {
        struct shmipc__send_req *r = c->tx_head;
        while (r->idx < r->n) {
            struct iovec *v = &r->iov[r->idx];
            if (v->iov_len > n) {
                v->iov_base = (char *)v->iov_base + n;
                v->iov_len -= n;
                n = 0;
                break;
            }
            n -= v->iov_len;
            r->idx++;
        }
        if (r->idx < r->n)
            break;
        c->tx_head = r->next;
        if (c->tx_head == NULL)
            c->tx_tail = NULL;
        complete(r, 0);
    }
    if (c->tx_head == NULL && c->shut_pending)
        do_shutdown(c);
}

void shmipc__reactor_send_failed(struct shmipc__conn *c, int code)
{
    if (c->tx_error == 0 || c->tx_error == SHMIPC_ECLOSED)
        c->tx_error = code;
    while (c->tx_head != NULL) {
        struct shmipc__send_req *r = c->tx_head;
        c->tx_head = r->next;
        complete(r, code);
    }
    c->tx_tail = NULL;
    c->tx_bytes = 0;
    c->shut_pending = 0;
}

/* ---- connections ---- */

static int conn_open(struct shmipc__loop *loop, int fd, const struct shmipc__conn_cbs *cbs,
                     void *data, int fresh, struct shmipc__conn **out)
{
    struct shmipc__conn *c = NULL;
    int registered = 0;
    int rc;

    *out = NULL;
    if (cbs == NULL || cbs->on_data == NULL || cbs->on_end == NULL) {
        rc = shmipc__fail(SHMIPC_EINVAL, "conn_open: on_data and on_end are required");
        goto err;
    }
    rc = check_thread(loop, "conn_open");
    if (rc < 0)
        goto err;
    c = shmipc__objpool_get(&loop->conn_pool);
    if (c == NULL) {
        rc = shmipc__fail(SHMIPC_ENOMEM, "conn_open: connection for fd %d", fd);
        goto err;
    }
    c->io.fd = fd;
    c->io.kind = SHMIPC__IO_CONN;
    c->loop = loop;
    c->cbs = *cbs;
    c->data = data;
    rc = shmipc__reactor_register(loop, &c->io);
    if (rc < 0)
        goto err;
    registered = 1;
    rc = loop->be->add(loop, &c->io, fresh);
    if (rc < 0)
        goto err;
    *out = c;
    return 0;
err:
    if (registered)
        shmipc__reactor_unregister(loop, &c->io);
    if (c != NULL)
        shmipc__objpool_put(&loop->conn_pool, c);
    /* The fd is ours unless it belongs to another handle of this loop. */
    if (fd >= 0 && rc != SHMIPC_EEXIST)
        close(fd);
    return rc;
}

int shmipc__conn_open(struct shmipc__loop *loop, int fd, const struct shmipc__conn_cbs *cbs,
                      void *data, struct shmipc__conn **out)
{
    return conn_open(loop, fd, cbs, data, 0, out);
}

void *shmipc__conn_data(const struct shmipc__conn *conn)
{
    return conn->data;
}

void shmipc__conn_set_data(struct shmipc__conn *conn, void *data)
{
    conn->data = data;
}

int shmipc__conn_fd(const struct shmipc__conn *conn)
{
    return conn->io.fd;
}

struct shmipc__loop *shmipc__conn_loop(const struct shmipc__conn *conn)
{
    return conn->loop;
}

size_t shmipc__conn_pending(const struct shmipc__conn *conn)
{
    return conn->tx_bytes;
}

int shmipc__conn_sendv(struct shmipc__conn *c, const struct iovec *iov, int n, shmipc__send_cb cb,
                       void *data)
{
    struct shmipc__loop *loop = c->loop;
    struct shmipc__send_req *r = NULL;
    size_t total = 0;
    int rc;

    if (n < 1 || n > IOV_MAX)
        return shmipc__fail(SHMIPC_EINVAL, "conn_sendv: %d buffers (1..%d)", n, IOV_MAX);
    rc = check_thread(loop, "conn_send");
    if (rc < 0)
        return rc;
    if (c->tx_error != 0)
        return shmipc__fail(c->tx_error, "conn_send: connection %d was shut down, closed or failed",
                            c->io.fd);
    r = shmipc__objpool_get(&loop->req_pool);
    if (r == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "conn_send: send request");
    r->iov = r->inline_iov;
    if (n > SHMIPC__REQ_POOL_IOV)
        r->iov = malloc((size_t)n * sizeof *r->iov);
    else if (n > SHMIPC__REQ_INLINE_IOV)
        r->iov = shmipc__objpool_get(&loop->iov_pool);
    if (r->iov == NULL) {
        shmipc__objpool_put(&loop->req_pool, r);
        return shmipc__fail(SHMIPC_ENOMEM, "conn_sendv: %d iovecs", n);
    }
    memcpy(r->iov, iov, (size_t)n * sizeof *iov);
    for (int i = 0; i < n; i++)
        total += iov[i].iov_len;
    r->n = n;
    r->conn = c;
    r->cb = cb;
    r->data = data;
    if (total == 0 && c->tx_head == NULL) {
        complete(r, 0);
        return 0;
    }
    c->tx_bytes += total;
    if (c->tx_tail != NULL)
        c->tx_tail->next = r;
    else
        c->tx_head = r;
    c->tx_tail = r;
    loop->be->send(loop, c);
    return 0;
}

int shmipc__conn_send(struct shmipc__conn *c, const void *buf, size_t len, shmipc__send_cb cb,
                      void *data)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    return shmipc__conn_sendv(c, &iov, 1, cb, data);
}

size_t shmipc__conn_write_now(struct shmipc__conn *c, const struct iovec *iov, int n)
{
    struct msghdr msg = {0};
    ssize_t k;
    if (n < 1 || n > IOV_MAX || c->io.closed || c->tx_error != 0 || c->tx_head != NULL ||
        c->tx_bytes != 0 || !shmipc__reactor_on_thread(c->loop))
        return 0;
    msg.msg_iov = (struct iovec *)(uintptr_t)iov;
    msg.msg_iovlen = (size_t)n;
    /* MSG_DONTWAIT: io_uring keeps its sockets blocking. MSG_NOSIGNAL: a peer gone is the
     * queued send's error to report, not SIGPIPE. */
    k = sendmsg(c->io.fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    return k > 0 ? (size_t)k : 0;
}

size_t shmipc__conn_read_now(struct shmipc__conn *c, void *buf, size_t len)
{
    struct shmipc__loop *loop = c->loop;
    if (len == 0 || c->io.closed || c->rd_done || c->rd_paused || loop->be->read_now == NULL ||
        !shmipc__reactor_on_thread(loop))
        return 0;
    return loop->be->read_now(loop, c, buf, len);
}

int shmipc__conn_shutdown(struct shmipc__conn *c)
{
    int rc = check_thread(c->loop, "conn_shutdown");
    if (rc < 0)
        return rc;
    if (c->tx_error != 0)
        return 0;
    c->tx_error = SHMIPC_ECLOSED;
    c->shut_pending = 1;
    if (c->tx_head == NULL)
        do_shutdown(c);
    return 0;
}

int shmipc__conn_pause_read(struct shmipc__conn *c)
{
    int rc = check_thread(c->loop, "conn_pause_read");
    if (rc < 0)
        return rc;
    if (c->rd_paused || c->io.closed)
        return 0;
    c->rd_paused = 1;
    c->loop->be->read_pause(c->loop, c);
    return 0;
}

int shmipc__conn_resume_read(struct shmipc__conn *c)
{
    int rc = check_thread(c->loop, "conn_resume_read");
    if (rc < 0)
        return rc;
    if (!c->rd_paused || c->io.closed)
        return 0;
    c->rd_paused = 0;
    c->hup_told = 0; /* a next pause reports a hangup again (its owner may care then) */
    c->loop->be->read_resume(c->loop, c);
    return 0;
}

int shmipc__conn_read_paused(const struct shmipc__conn *c)
{
    return c->rd_paused;
}

void shmipc__conn_close(struct shmipc__conn *c)
{
    struct shmipc__loop *loop = c->loop;
    if (c->io.closed)
        return;
    c->io.closed = 1;
    c->rd_done = 1;
    free(c->held);
    c->held = NULL;
    c->held_len = c->held_cap = 0;
    shmipc__reactor_unregister(loop, &c->io);
    /* A send the kernel still holds completes when its cancellation comes back. */
    if (!c->tx_busy)
        shmipc__reactor_send_failed(c, SHMIPC_ECLOSED);
    else
        c->tx_error = SHMIPC_ECLOSED;
    loop->be->del(loop, &c->io);
    push_closing(loop, &c->io);
}

void shmipc__reactor_data(struct shmipc__conn *c, const void *data, size_t len)
{
    if (!c->rd_done)
        c->cbs.on_data(c, data, len);
}

int shmipc__reactor_hold(struct shmipc__conn *c, const void *data, size_t len)
{
    if (c->held_len + len > c->held_cap) {
        size_t cap = c->held_cap ? c->held_cap : 4096;
        char *grown;
        while (cap < c->held_len + len)
            cap *= 2;
        grown = realloc(c->held, cap);
        if (grown == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "reactor: holding %zu bytes of a paused conn",
                                c->held_len + len);
        c->held = grown;
        c->held_cap = cap;
    }
    memcpy(c->held + c->held_len, data, len);
    c->held_len += len;
    c->loop->stats.held++;
    return 0;
}

void shmipc__reactor_deliver_held(struct shmipc__conn *c)
{
    char *p = c->held;
    size_t n = c->held_len, cap = c->held_cap, off = 0;
    if (n > 0 && !c->rd_done && !c->rd_paused) {
        /* The bytes leave the conn during the calls (on_data may close it), and go in pieces
         * of a receive buffer, so that an owner that pauses again gets no more at once than
         * from a receive. What a new pause leaves is held again. */
        c->held = NULL;
        c->held_len = c->held_cap = 0;
        while (off < n && !c->rd_done && !c->rd_paused) {
            size_t k = n - off < c->loop->recv_buf_size ? n - off : c->loop->recv_buf_size;
            c->cbs.on_data(c, p + off, k);
            off += k;
        }
        if (off < n && !c->rd_done) {
            memmove(p, p + off, n - off);
            c->held = p;
            c->held_len = n - off;
            c->held_cap = cap;
        } else {
            free(p);
        }
    }
    if (c->held_end && c->held_len == 0 && !c->rd_paused) {
        c->held_end = 0;
        shmipc__reactor_end(c, c->held_status);
    }
}

void shmipc__reactor_paused_hup(struct shmipc__conn *c)
{
    if (c->hup_told || !c->rd_paused || c->rd_done || c->io.closed || c->cbs.on_hup == NULL)
        return;
    c->hup_told = 1;
    c->cbs.on_hup(c);
}

void shmipc__reactor_end(struct shmipc__conn *c, int status)
{
    if (c->rd_done)
        return;
    c->rd_done = 1;
    c->cbs.on_end(c, status);
}

/* ---- listeners ---- */

static void accept_retry(struct shmipc__timer *t)
{
    struct shmipc__acceptor *l = t->data;
    if (!l->io.closed && l->loop->be->add(l->loop, &l->io, 0) < 0)
        SHMIPC__LOG(SHMIPC__LOG_ERROR, "reactor: accepting again on fd %d: %s", l->io.fd,
                    shmipc__detail());
}

int shmipc__acceptor_open(struct shmipc__loop *loop, int fd, const struct shmipc__conn_cbs *cbs,
                          shmipc__accept_cb on_accept, void *data, struct shmipc__acceptor **out)
{
    struct shmipc__acceptor *l = NULL;
    int registered = 0;
    int rc;

    *out = NULL;
    if (cbs == NULL || cbs->on_data == NULL || cbs->on_end == NULL || on_accept == NULL) {
        rc = shmipc__fail(SHMIPC_EINVAL,
                          "acceptor_open: on_accept, on_data and on_end are required");
        goto err;
    }
    rc = check_thread(loop, "acceptor_open");
    if (rc < 0)
        goto err;
    l = calloc(1, sizeof *l);
    if (l == NULL) {
        rc = shmipc__fail(SHMIPC_ENOMEM, "acceptor_open: fd %d", fd);
        goto err;
    }
    l->io.fd = fd;
    l->io.kind = SHMIPC__IO_ACCEPTOR;
    l->loop = loop;
    l->cbs = *cbs;
    l->on_accept = on_accept;
    l->data = data;
    shmipc__timer_init(loop, &l->retry, accept_retry, l);
    rc = shmipc__reactor_register(loop, &l->io);
    if (rc < 0)
        goto err;
    registered = 1;
    rc = loop->be->add(loop, &l->io, 0);
    if (rc < 0)
        goto err;
    *out = l;
    return 0;
err:
    if (registered)
        shmipc__reactor_unregister(loop, &l->io);
    free(l);
    if (fd >= 0 && rc != SHMIPC_EEXIST)
        close(fd);
    return rc;
}

void shmipc__acceptor_close(struct shmipc__acceptor *l)
{
    if (l->io.closed)
        return;
    l->io.closed = 1;
    shmipc__timer_stop(&l->retry);
    shmipc__reactor_unregister(l->loop, &l->io);
    l->loop->be->del(l->loop, &l->io);
    push_closing(l->loop, &l->io);
}

void shmipc__reactor_accepted(struct shmipc__acceptor *l, int fd)
{
    struct shmipc__conn *c;
    if (conn_open(l->loop, fd, &l->cbs, l->data, 1, &c) < 0) {
        SHMIPC__LOG(SHMIPC__LOG_WARN, "reactor: dropping accepted fd %d: %s", fd, shmipc__detail());
        return;
    }
    l->on_accept(l, c, l->data);
}

int shmipc__reactor_accept_error(struct shmipc__acceptor *l, int err)
{
    switch (err) {
    case EINTR:
    case EAGAIN:
    case ECONNABORTED:
    case EPROTO:
    case EPERM:
        /* The connection died in the queue, or a firewall refused it: take the next one. */
        return 0;
    default:
        /* Out of fds or memory: accepting again at once would spin, so pause and let
         * connections close meanwhile. */
        SHMIPC__LOG(SHMIPC__LOG_WARN, "reactor: accept on fd %d: %s; pausing %d ms", l->io.fd,
                    strerror(err), ACCEPT_PAUSE_MS);
        if (shmipc__timer_start(&l->retry, ACCEPT_PAUSE_MS) < 0)
            SHMIPC__LOG(SHMIPC__LOG_ERROR, "reactor: accept retry timer: %s", shmipc__detail());
        return 1;
    }
}

/* ---- watches ---- */

int shmipc__watch_new(struct shmipc__loop *loop, int fd, unsigned events, shmipc__watch_cb cb,
                      void *data, struct shmipc__watch **out)
{
    struct shmipc__watch *w = NULL;
    int registered = 0;
    int rc;

    *out = NULL;
    if (cb == NULL || events == 0 || (events & ~(SHMIPC__WATCH_READ | SHMIPC__WATCH_WRITE))) {
        rc = shmipc__fail(SHMIPC_EINVAL, "watch_new: a callback and READ/WRITE events needed");
        goto err;
    }
    rc = check_thread(loop, "watch_new");
    if (rc < 0)
        goto err;
    w = calloc(1, sizeof *w);
    if (w == NULL) {
        rc = shmipc__fail(SHMIPC_ENOMEM, "watch_new: watch for fd %d", fd);
        goto err;
    }
    w->io.fd = fd;
    w->io.kind = SHMIPC__IO_WATCH;
    w->loop = loop;
    w->events = events;
    w->cb = cb;
    w->data = data;
    rc = shmipc__reactor_register(loop, &w->io);
    if (rc < 0)
        goto err;
    registered = 1;
    rc = loop->be->add(loop, &w->io, 0);
    if (rc < 0)
        goto err;
    *out = w;
    return 0;
err:
    if (registered)
        shmipc__reactor_unregister(loop, &w->io);
    free(w);
    return rc;
}

void shmipc__watch_free(struct shmipc__watch *w)
{
    if (w == NULL || w->io.closed)
        return;
    w->io.closed = 1;
    shmipc__reactor_unregister(w->loop, &w->io);
    w->loop->be->del(w->loop, &w->io);
    push_closing(w->loop, &w->io);
}

void shmipc__reactor_watch_ready(struct shmipc__watch *w, unsigned events)
{
    events &= w->events;
    if (events != 0 && !w->io.closed)
        w->cb(w, w->io.fd, events, w->data);
}

/* ---- closing and reclaiming ---- */

void shmipc__reactor_close_io(struct shmipc__io *io)
{
    switch (io->kind) {
    case SHMIPC__IO_CONN:
        shmipc__conn_close((struct shmipc__conn *)io);
        break;
    case SHMIPC__IO_ACCEPTOR:
        shmipc__acceptor_close((struct shmipc__acceptor *)io);
        break;
    default:
        shmipc__watch_free((struct shmipc__watch *)io);
        break;
    }
}

static void free_io(struct shmipc__loop *loop, struct shmipc__io *io)
{
    if (io->kind == SHMIPC__IO_CONN)
        shmipc__objpool_put(&loop->conn_pool, io);
    else
        free(io);
}

void shmipc__reactor_reclaim(struct shmipc__loop *loop)
{
    struct shmipc__io **pp = &loop->closing;
    while (*pp != NULL) {
        struct shmipc__io *io = *pp;
        if (io->refs != 0) {
            pp = &io->closing_next;
            continue;
        }
        *pp = io->closing_next;
        free_io(loop, io);
    }
}

void shmipc__reactor_force_reclaim(struct shmipc__loop *loop)
{
    for (struct shmipc__io *io = loop->closing; io != NULL; io = io->closing_next)
        if (io->kind == SHMIPC__IO_CONN)
            shmipc__reactor_send_failed((struct shmipc__conn *)io, SHMIPC_ECLOSED);
    shmipc__reactor_run_done(loop);
    while (loop->closing != NULL) {
        struct shmipc__io *io = loop->closing;
        loop->closing = io->closing_next;
        free_io(loop, io);
    }
}
