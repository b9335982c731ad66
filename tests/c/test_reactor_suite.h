/*
 * The connection tests that every backend must pass, shared by test_reactor_epoll.c and
 * test_reactor_uring.c: each sets suite_opts to force its backend and runs SUITE_TESTS.
 * Sockets are loopback TCP on ephemeral ports or unix socketpairs; the loop runs on the test
 * thread (pumped with run_once) unless a test needs a client that blocks, and then on a thread
 * of its own.
 */
#ifndef TEST_REACTOR_SUITE_H
#define TEST_REACTOR_SUITE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "shmipc.h"
#include "reactor/loop.h"

static struct shmipc__loop_opts suite_opts;

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static const char *suite_backend(void)
{
    return suite_opts.backend == SHMIPC__BACKEND_EPOLL ? "epoll" : "io_uring";
}

static struct shmipc__loop *new_loop_with(const struct shmipc__loop_opts *o)
{
    struct shmipc__loop *loop = NULL;
    int rc = shmipc__loop_new(o, &loop);
    if (rc != 0)
        fail_msg("loop_new: %s: %s", shmipc_errname(rc), shmipc_error_detail());
    assert_string_equal(shmipc__loop_backend_name(loop), suite_backend());
    return loop;
}

static struct shmipc__loop *new_loop(void)
{
    return new_loop_with(&suite_opts);
}

/* Runs turns until `cond` holds; fails after 5 s. */
#define PUMP_UNTIL(loop, cond)                                                                     \
    do {                                                                                           \
        uint64_t pump_end_ = mono_ms() + 5000;                                                     \
        while (!(cond)) {                                                                          \
            assert_true(mono_ms() < pump_end_);                                                    \
            assert_true(shmipc__loop_run_once((loop), 10) >= 0);                                   \
        }                                                                                          \
    } while (0)

/* Waits (without running the loop, which runs on another thread) until `cond` holds. */
#define WAIT_UNTIL(cond)                                                                           \
    do {                                                                                           \
        uint64_t wait_end_ = mono_ms() + 5000;                                                     \
        while (!(cond)) {                                                                          \
            assert_true(mono_ms() < wait_end_);                                                    \
            usleep(1000);                                                                          \
        }                                                                                          \
    } while (0)

static void set_timeouts(int fd)
{
    struct timeval tv = {.tv_sec = 5};
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv), 0);
}

static int connect_to(int port, int rcvbuf)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    if (rcvbuf > 0)
        assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf), 0);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sin, sizeof sin) != 0) {
        /* Interrupted, the connection goes on in the background: wait for its outcome. */
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t len = sizeof err;
        assert_int_equal(errno, EINTR);
        while (poll(&p, 1, 5000) < 0)
            assert_int_equal(errno, EINTR);
        assert_int_equal(getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len), 0);
        assert_int_equal(err, 0);
    }
    set_timeouts(fd);
    return fd;
}

/*
 * The client side retries EINTR: a thread that also uses io_uring can see its blocking socket
 * calls interrupted by the kernel's task-work notification (a read with SO_RCVTIMEO then fails
 * with EINTR instead of restarting).
 */
static void write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        assert_true(n > 0);
        p += n;
        len -= (size_t)n;
    }
}

static ssize_t read_some(int fd, void *buf, size_t len)
{
    ssize_t n;
    do
        n = read(fd, buf, len);
    while (n < 0 && errno == EINTR);
    return n;
}

static void read_exact(int fd, void *buf, size_t len)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            fail_msg("read: %zd (%s) with %zu bytes missing", n, strerror(errno), len);
        p += n;
        len -= (size_t)n;
    }
}

/* ---- a small test server ---- */

enum srv_mode {
    SRV_ECHO = 0,   /* sends back what arrives */
    SRV_REPLY_SHUT, /* first input: replies "response" and shuts down; drains the rest */
    SRV_BIG_FIRST,  /* first connection: a 1 MiB body behind a header, as two iovecs */
    SRV_SINK,       /* keeps what arrives, sends nothing */
};

#define SRV_KEEP   4096
#define BIG_HEADER "HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\n\r\n"
#define BIG_BODY   (1u << 20)

struct srv {
    struct shmipc__loop *loop;
    enum srv_mode mode;
    atomic_int accepted;
    atomic_int ended;
    atomic_int end_status;
    atomic_int sent_ok;
    atomic_int sent_err;
    atomic_int last_send_status;
    atomic_int shut;
    atomic_size_t received;
    size_t max_chunk;
    char kept[SRV_KEEP];
    size_t kept_len;
    unsigned char *big;
    struct shmipc__conn *last;
    int close_on_end;
    int pause_on_data;      /* the first on_data pauses reading */
    int check_pattern;      /* byte i of the stream must be i % 251 */
    atomic_size_t bad_byte; /* 1 + the offset of the first byte out of order; 0: none */
};

static void srv_sent(struct shmipc__conn *c, int status, void *data)
{
    (void)c;
    (void)status;
    free(data);
}

static void srv_sent_static(struct shmipc__conn *c, int status, void *data)
{
    struct srv *s = data;
    (void)c;
    atomic_store(&s->last_send_status, status);
    if (status == 0)
        atomic_fetch_add(&s->sent_ok, 1);
    else
        atomic_fetch_add(&s->sent_err, 1);
}

static void srv_sent_copy(struct shmipc__conn *c, int status, void *data)
{
    struct srv *s = shmipc__conn_data(c);
    srv_sent(c, status, data);
    srv_sent_static(c, status, s);
}

static void srv_on_data(struct shmipc__conn *c, const void *data, size_t len)
{
    struct srv *s = shmipc__conn_data(c);
    size_t keep = len < SRV_KEEP - s->kept_len ? len : SRV_KEEP - s->kept_len;
    memcpy(s->kept + s->kept_len, data, keep);
    s->kept_len += keep;
    if (len > s->max_chunk)
        s->max_chunk = len;
    if (s->check_pattern) {
        size_t at = atomic_load(&s->received);
        for (size_t i = 0; i < len && atomic_load(&s->bad_byte) == 0; i++)
            if (((const unsigned char *)data)[i] != (unsigned char)((at + i) % 251))
                atomic_store(&s->bad_byte, at + i + 1);
    }
    atomic_fetch_add(&s->received, len);
    if (s->pause_on_data) {
        s->pause_on_data = 0;
        assert_int_equal(shmipc__conn_pause_read(c), 0);
    }
    switch (s->mode) {
    case SRV_ECHO:
    case SRV_BIG_FIRST: {
        void *copy = malloc(len);
        assert_non_null(copy);
        memcpy(copy, data, len);
        assert_int_equal(shmipc__conn_send(c, copy, len, srv_sent_copy, copy), 0);
        break;
    }
    case SRV_REPLY_SHUT:
        if (!atomic_load(&s->shut)) {
            assert_int_equal(shmipc__conn_send(c, "response", 8, srv_sent_static, s), 0);
            assert_int_equal(shmipc__conn_shutdown(c), 0);
            atomic_store(&s->shut, 1);
        }
        break;
    case SRV_SINK:
        break;
    }
}

static void srv_on_end(struct shmipc__conn *c, int status)
{
    struct srv *s = shmipc__conn_data(c);
    atomic_store(&s->end_status, status);
    atomic_fetch_add(&s->ended, 1);
    if (s->close_on_end)
        shmipc__conn_close(c);
}

static const struct shmipc__conn_cbs srv_cbs = {srv_on_data, srv_on_end, NULL};

static void srv_on_accept(struct shmipc__acceptor *a, struct shmipc__conn *c, void *data)
{
    struct srv *s = data;
    (void)a;
    s->last = c;
    if (s->mode == SRV_BIG_FIRST && atomic_load(&s->accepted) == 0) {
        /* A small send buffer makes the kernel take the body in pieces. */
        int sndbuf = 16384;
        struct iovec iov[2] = {{BIG_HEADER, sizeof BIG_HEADER - 1}, {s->big, BIG_BODY}};
        assert_int_equal(
            setsockopt(shmipc__conn_fd(c), SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf), 0);
        assert_int_equal(shmipc__conn_sendv(c, iov, 2, srv_sent_static, s), 0);
    }
    atomic_fetch_add(&s->accepted, 1);
}

static void srv_init(struct srv *s, struct shmipc__loop *loop, enum srv_mode mode)
{
    memset(s, 0, sizeof *s);
    s->loop = loop;
    s->mode = mode;
    s->close_on_end = 1;
    atomic_init(&s->end_status, 1);
}

/* Opens an acceptor on 127.0.0.1 and an ephemeral port; returns the port. */
static int srv_listen(struct srv *s, struct shmipc__acceptor **out)
{
    int fd = -1;
    int port;
    assert_int_equal(shmipc__tcp_listen("127.0.0.1", 0, 1024, 0, &fd), 0);
    port = shmipc__sock_port(fd);
    assert_true(port > 0);
    assert_int_equal(shmipc__acceptor_open(s->loop, fd, &srv_cbs, srv_on_accept, s, out), 0);
    return port;
}

/* Listens, connects one client and runs the loop until it is accepted; returns its socket. */
static int srv_connect_one(struct srv *s)
{
    struct shmipc__acceptor *acc;
    int fd = connect_to(srv_listen(s, &acc), 0);
    PUMP_UNTIL(s->loop, atomic_load(&s->accepted) == 1);
    return fd;
}

/*
 * Adopts one end of a new socketpair as a connection of the server (in *c); the other end,
 * sp[1], is the client, with 5 s timeouts.
 */
static void srv_adopt_pair(struct srv *s, int sp[2], struct shmipc__conn **c)
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    set_timeouts(sp[1]);
    assert_int_equal(shmipc__conn_open(s->loop, sp[0], &srv_cbs, s, c), 0);
}

/* Sends the 8-byte `req` to an echo server (its `nth` answer) and reads the same bytes back. */
static void echo_8(struct srv *s, int fd, const char *req, int nth)
{
    char resp[8];
    write_all(fd, req, 8);
    PUMP_UNTIL(s->loop, atomic_load(&s->sent_ok) == nth);
    read_exact(fd, resp, 8);
    assert_memory_equal(resp, req, 8);
}

/*
 * 100 bytes through a connection of a loop made with `o`, into a sink: they all arrive, in
 * order, in chunks of at most `o->recv_buf_size` bytes. Returns the loop's counters then.
 */
static struct shmipc__loop_stats sink_100_bytes(const struct shmipc__loop_opts *o)
{
    struct shmipc__loop *loop = new_loop_with(o);
    struct shmipc__conn *c;
    struct shmipc__loop_stats st;
    struct srv s;
    char msg[100];
    int sp[2];
    srv_init(&s, loop, SRV_SINK);
    for (int i = 0; i < 100; i++)
        msg[i] = (char)('a' + i % 26);
    srv_adopt_pair(&s, sp, &c);
    write_all(sp[1], msg, sizeof msg);
    PUMP_UNTIL(loop, atomic_load(&s.received) == 100);
    assert_memory_equal(s.kept, msg, 100);
    assert_true(s.max_chunk <= o->recv_buf_size);
    shmipc__loop_stats(loop, &st);
    close(sp[1]);
    PUMP_UNTIL(loop, atomic_load(&s.ended) == 1);
    shmipc__loop_free(loop);
    return st;
}

static void *loop_thread(void *arg)
{
    struct shmipc__loop *loop = arg;
    int rc = shmipc__loop_run(loop);
    if (rc != 0)
        fprintf(stderr, "loop_run: %s: %s\n", shmipc_errname(rc), shmipc_error_detail());
    return (void *)(intptr_t)rc;
}

static void join_loop(struct shmipc__loop *loop, pthread_t t)
{
    void *rc;
    shmipc__loop_stop(loop);
    assert_int_equal(pthread_join(t, &rc), 0);
    assert_int_equal((int)(intptr_t)rc, 0);
}

/* ---- the tests ---- */

/* Echo through an acceptor and a TCP connection, then through an adopted socketpair. */
static void echo(void **state)
{
    struct shmipc__loop *loop = new_loop();
    struct shmipc__acceptor *acc;
    struct shmipc__conn *c;
    struct srv s;
    char buf[32];
    int sp[2];
    int port;
    int fd;
    (void)state;

    srv_init(&s, loop, SRV_ECHO);
    port = srv_listen(&s, &acc);
    assert_int_equal(shmipc__loop_handles(loop), 1);
    fd = connect_to(port, 0);
    PUMP_UNTIL(loop, atomic_load(&s.accepted) == 1);
    write_all(fd, "hello, loop", 11);
    PUMP_UNTIL(loop, atomic_load(&s.sent_ok) == 1);
    read_exact(fd, buf, 11);
    assert_memory_equal(buf, "hello, loop", 11);
    close(fd);
    PUMP_UNTIL(loop, atomic_load(&s.ended) == 1);
    assert_int_equal(atomic_load(&s.end_status), 0);

    srv_adopt_pair(&s, sp, &c);
    assert_int_equal(shmipc__conn_fd(c), sp[0]);
    assert_ptr_equal(shmipc__conn_loop(c), loop);
    write_all(sp[1], "over a pair", 11);
    PUMP_UNTIL(loop, atomic_load(&s.sent_ok) == 2);
    read_exact(sp[1], buf, 11);
    assert_memory_equal(buf, "over a pair", 11);
    close(sp[1]);
    PUMP_UNTIL(loop, atomic_load(&s.ended) == 2);
    assert_int_equal(shmipc__loop_handles(loop), 1);
    shmipc__acceptor_close(acc);
    assert_int_equal(shmipc__loop_handles(loop), 0);
    shmipc__loop_free(loop);
}

/* 200 request/response exchanges on one keep-alive connection. */
static void keepalive_200(void **state)
{
    struct shmipc__loop *loop = new_loop();
    struct shmipc__loop_stats a, b;
    struct srv s;
    int fd;
    (void)state;

    srv_init(&s, loop, SRV_ECHO);
    fd = srv_connect_one(&s);
    shmipc__loop_stats(loop, &a);
    for (int i = 0; i < 200; i++) {
        char req[9];
        snprintf(req, sizeof req, "ping%04d", i);
        echo_8(&s, fd, req, i + 1);
    }
    shmipc__loop_stats(loop, &b);
    print_message("%s: 200 exchanges: %llu waits, %llu events, %llu epoll_ctl, %llu rearms\n",
                  suite_backend(), (unsigned long long)(b.waits - a.waits),
                  (unsigned long long)(b.events - a.events),
                  (unsigned long long)(b.epoll_ctl - a.epoll_ctl),
                  (unsigned long long)(b.recv_rearm - a.recv_rearm));
    assert_int_equal(b.recv_rearm - a.recv_rearm, 0);
    close(fd);
    shmipc__loop_free(loop);
}

/* 100 bytes through a 10-byte receive buffer all arrive, in order, in chunks of <= 10. */
static void small_receive_buffer(void **state)
{
    struct shmipc__loop_opts o = suite_opts;
    struct shmipc__loop_stats st;
    (void)state;

    o.recv_buf_size = 10;
    o.recv_buf_count = 4;  /* io_uring: the ring runs dry after 40 bytes */
    o.reads_per_event = 3; /* epoll: the budget runs out after 30 bytes */
    st = sink_100_bytes(&o);
    /* Each backend had to carry on without a new notification from the kernel. */
    assert_true(st.deferred + st.enobufs >= 1);
}

/* With a budget of one event per turn, two ready connections take two turns, in order of
 * readiness, and neither is lost. */
static void budget_bounds_a_turn(void **state)
{
    struct shmipc__loop_opts o = suite_opts;
    struct shmipc__loop *loop;
    struct shmipc__conn *c1, *c2;
    struct srv s1, s2;
    int p1[2], p2[2];
    (void)state;

    o.max_events = 1;
    loop = new_loop_with(&o);
    srv_init(&s1, loop, SRV_SINK);
    srv_init(&s2, loop, SRV_SINK);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p1), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p2), 0);
    assert_int_equal(shmipc__conn_open(loop, p1[0], &srv_cbs, &s1, &c1), 0);
    assert_int_equal(shmipc__conn_open(loop, p2[0], &srv_cbs, &s2, &c2), 0);
    PUMP_UNTIL(loop, shmipc__loop_run_once(loop, 0) == 0);
    write_all(p1[1], "one", 3);
    write_all(p2[1], "two", 3);
    assert_int_equal(shmipc__loop_run_once(loop, 1000), 1);
    assert_int_equal(atomic_load(&s1.received) + atomic_load(&s2.received), 3);
    assert_int_equal(shmipc__loop_run_once(loop, 1000), 1);
    assert_int_equal(atomic_load(&s1.received), 3);
    assert_int_equal(atomic_load(&s2.received), 3);
    close(p1[1]);
    close(p2[1]);
    shmipc__loop_free(loop);
}

/* A batch of pipelined responses as one sendv of many buffers arrives whole and in order. */
static void sendv_many_buffers(void **state)
{
    struct shmipc__loop *loop = new_loop();
    struct shmipc__conn *c;
    struct srv s;
    struct iovec iov[200];
    char parts[200][8], got[200 * 7];
    int sp[2];
    (void)state;

    srv_init(&s, loop, SRV_SINK);
    srv_adopt_pair(&s, sp, &c);
    for (int i = 0; i < 200; i++) {
        snprintf(parts[i], sizeof parts[i], "r%05d.", i);
        iov[i].iov_base = parts[i];
        iov[i].iov_len = 7;
    }
    /* 2 inline, 16 from the pool of arrays, 200 from the heap; and one empty send. */
    assert_int_equal(shmipc__conn_sendv(c, iov, 2, srv_sent_static, &s), 0);
    assert_int_equal(shmipc__conn_sendv(c, iov + 2, 16, srv_sent_static, &s), 0);
    assert_int_equal(shmipc__conn_sendv(c, iov + 18, 182, srv_sent_static, &s), 0);
    assert_int_equal(shmipc__conn_send(c, "", 0, srv_sent_static, &s), 0);
    assert_int_equal(shmipc__conn_sendv(c, iov, 0, NULL, NULL), SHMIPC_EINVAL);
    PUMP_UNTIL(loop, atomic_load(&s.sent_ok) == 4);
    assert_int_equal(shmipc__conn_pending(c), 0);
    read_exact(sp[1], got, sizeof got);
    for (int i = 0; i < 200; i++)
        assert_memory_equal(got + 7 * i, parts[i], 7);
    close(sp[1]);
    PUMP_UNTIL(loop, atomic_load(&s.ended) == 1);
    shmipc__loop_free(loop);
}

/*
 * Two connections have input queued for the same turn. The first one dispatched closes the
 * other, and puts a new connection on the very fd number. The closed connection's pending
 * event or completion must be dropped, not delivered to the newcomer. On io_uring the number
 * is freed only by the next wait (an IORING_OP_CLOSE behind the conn's SQEs), so there the
 * newcomer takes it after that wait, while the victim's completion may still be queued.
 */
struct reuse {
    struct shmipc__loop *loop;
    struct shmipc__conn *a, *b, *victim, *first, *c;
    int victim_fd, c_peer;
    char first_got[16], c_got[16];
    size_t first_len, c_len;
    int victim_calls;
    int c_later; /* the victim's fd was still open after the close: C comes after a wait */
};

static void reuse_on_data(struct shmipc__conn *conn, const void *data, size_t len);

static void reuse_on_end(struct shmipc__conn *conn, int status)
{
    (void)status;
    shmipc__conn_close(conn);
}

static const struct shmipc__conn_cbs reuse_cbs = {reuse_on_data, reuse_on_end, NULL};

/* The newcomer, on the victim's fd number (free now). */
static void reuse_open_c(struct reuse *r)
{
    int sp[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    /* socketpair() most likely took the freed number already; if not, move it there. */
    if (sp[0] != r->victim_fd) {
        assert_int_equal(dup2(sp[0], r->victim_fd), r->victim_fd);
        close(sp[0]);
    }
    write_all(sp[1], "C-data", 6);
    r->c_peer = sp[1];
    assert_int_equal(shmipc__conn_open(r->loop, r->victim_fd, &reuse_cbs, r, &r->c), 0);
}

static void reuse_on_data(struct shmipc__conn *conn, const void *data, size_t len)
{
    struct reuse *r = shmipc__conn_data(conn);
    if (conn == r->c) {
        assert_true(r->c_len + len <= sizeof r->c_got);
        memcpy(r->c_got + r->c_len, data, len);
        r->c_len += len;
        return;
    }
    if (conn == r->victim) {
        r->victim_calls++;
        return;
    }
    if (r->first == NULL) {
        r->first = conn;
        r->victim = conn == r->a ? r->b : r->a;
        r->victim_fd = shmipc__conn_fd(r->victim);
        shmipc__conn_close(r->victim);
        /* Reusing a number still open would close the newcomer with the victim's SQE. */
        r->c_later = fcntl(r->victim_fd, F_GETFD) >= 0;
        if (!r->c_later)
            reuse_open_c(r);
    }
    assert_ptr_equal(conn, r->first);
    memcpy(r->first_got + r->first_len, data, len);
    r->first_len += len;
}

static void fd_reuse_generation(void **state)
{
    struct shmipc__loop *loop = new_loop();
    struct shmipc__loop_stats st;
    struct reuse r;
    int pa[2], pb[2];
    (void)state;

    memset(&r, 0, sizeof r);
    r.loop = loop;
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pa), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pb), 0);
    assert_int_equal(shmipc__conn_open(loop, pa[0], &reuse_cbs, &r, &r.a), 0);
    assert_int_equal(shmipc__conn_open(loop, pb[0], &reuse_cbs, &r, &r.b), 0);
    /* Both receives are armed before any input exists, then both get input at once. */
    assert_true(shmipc__loop_run_once(loop, 0) >= 0);
    write_all(pa[1], "A-data", 6);
    write_all(pb[1], "B-data", 6);
    PUMP_UNTIL(loop, r.first != NULL && (r.c_later || r.c_len == 6));
    if (r.c_later) {
        assert_string_equal(shmipc__loop_backend_name(loop), "io_uring");
        PUMP_UNTIL(loop, fcntl(r.victim_fd, F_GETFD) < 0);
        reuse_open_c(&r);
        PUMP_UNTIL(loop, r.c_len == 6);
    }
    PUMP_UNTIL(loop, shmipc__loop_run_once(loop, 0) == 0);
    assert_memory_equal(r.c_got, "C-data", 6);
    assert_int_equal(r.c_len, 6);
    assert_int_equal(r.first_len, 6);
    assert_memory_equal(r.first_got, r.first == r.a ? "A-data" : "B-data", 6);
    assert_int_equal(r.victim_calls, 0);
    assert_int_equal(shmipc__conn_fd(r.c), r.victim_fd);
    shmipc__loop_stats(loop, &st);
    assert_true(st.stale >= 1);
    assert_int_equal(shmipc__loop_handles(loop), 2);
    close(pa[1]);
    close(pb[1]);
    close(r.c_peer);
    shmipc__loop_free(loop);
}

/*
 * Half-close: the server answers, shuts down its side and keeps draining the input that is
 * still coming. The client reads the answer and then a clean EOF, not ECONNRESET.
 */
static void half_close_sends_fin(void **state)
{
    struct shmipc__loop *loop = new_loop();
    struct srv s;
    static char junk[64 << 10];
    char buf[16];
    size_t total = 7 + sizeof junk;
    int fd;
    ssize_t n;
    (void)state;

    srv_init(&s, loop, SRV_REPLY_SHUT);
    fd = srv_connect_one(&s);
    write_all(fd, "request", 7);
    PUMP_UNTIL(loop, atomic_load(&s.shut) && atomic_load(&s.sent_ok) == 1);
    /* Input that arrives after the shutdown is still read, so closing leaves none unread. */
    memset(junk, 'j', sizeof junk);
    write_all(fd, junk, sizeof junk);
    PUMP_UNTIL(loop, atomic_load(&s.received) == total);
    assert_int_equal(shmipc__conn_send(s.last, "late", 4, NULL, NULL), SHMIPC_ECLOSED);
    read_exact(fd, buf, 8);
    assert_memory_equal(buf, "response", 8);
    errno = 0;
    n = read_some(fd, buf, sizeof buf);
    assert_int_equal(n, 0);
    assert_int_equal(errno, 0);
    shutdown(fd, SHUT_WR);
    PUMP_UNTIL(loop, atomic_load(&s.ended) == 1);
    assert_int_equal(atomic_load(&s.end_status), 0);
    close(fd);
    shmipc__loop_free(loop);
}

/* The peer's FIN arrives as on_end(0); a reset as on_end(SHMIPC_ECONNRESET). */
static void end_of_input(void **state)
{
    struct shmipc__loop *loop = new_loop();
    struct shmipc__acceptor *acc;
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    struct srv s;
    int port, fd;
    (void)state;

    srv_init(&s, loop, SRV_SINK);
    port = srv_listen(&s, &acc);
    fd = connect_to(port, 0);
    write_all(fd, "bye", 3);
    shutdown(fd, SHUT_WR);
    PUMP_UNTIL(loop, atomic_load(&s.ended) == 1);
    assert_int_equal(atomic_load(&s.end_status), 0);
    assert_int_equal(atomic_load(&s.received), 3);
    close(fd);

    fd = connect_to(port, 0);
    PUMP_UNTIL(loop, atomic_load(&s.accepted) == 2);
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg), 0);
    close(fd);
    PUMP_UNTIL(loop, atomic_load(&s.ended) == 2);
    assert_int_equal(atomic_load(&s.end_status), SHMIPC_ECONNRESET);
    shmipc__loop_free(loop);
}

/* Closing with sends queued completes them with SHMIPC_ECLOSED; the socket really closes. */
static void close_fails_queued_sends(void **state)
{
    struct shmipc__loop *loop = new_loop();
    struct shmipc__conn *c;
    struct srv s;
    int sp[2], sndbuf = 4096;
    unsigned char *big = calloc(1, 4u << 20);
    char sink[4096];
    ssize_t n;
    (void)state;

    assert_non_null(big);
    srv_init(&s, loop, SRV_SINK);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    assert_int_equal(setsockopt(sp[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf), 0);
    set_timeouts(sp[1]);
    assert_int_equal(shmipc__conn_open(loop, sp[0], &srv_cbs, &s, &c), 0);
    assert_int_equal(shmipc__conn_send(c, big, 4u << 20, srv_sent_static, &s), 0);
    assert_int_equal(shmipc__conn_send(c, "tail", 4, srv_sent_static, &s), 0);
    /* Callbacks never run inside the call that caused them. */
    assert_int_equal(atomic_load(&s.sent_ok) + atomic_load(&s.sent_err), 0);
    PUMP_UNTIL(loop, shmipc__loop_run_once(loop, 0) == 0);
    assert_true(shmipc__conn_pending(c) > 0);
    assert_int_equal(atomic_load(&s.sent_ok) + atomic_load(&s.sent_err), 0);
    shmipc__conn_close(c);
    PUMP_UNTIL(loop, atomic_load(&s.sent_err) == 2);
    assert_int_equal(atomic_load(&s.last_send_status), SHMIPC_ECLOSED);
    /* What the kernel took before the close arrives, then the end of the stream. */
    while ((n = read_some(sp[1], sink, sizeof sink)) > 0)
        ;
    assert_int_equal(n, 0);
    close(sp[1]);
    shmipc__loop_free(loop);
    free(big);
}

/*
 * A 1 MiB body behind a header, as two iovecs, to a reader that takes it in small pieces:
 * it arrives intact, and meanwhile the loop keeps serving another connection.
 */
static void large_sendv_slow_reader(void **state)
{
    struct shmipc__loop *loop = new_loop();
    struct shmipc__acceptor *acc;
    struct shmipc__loop_stats st;
    struct srv s;
    pthread_t t;
    char hdr[sizeof BIG_HEADER - 1];
    unsigned char *got = malloc(BIG_BODY);
    size_t off = 0;
    int port, slow, other;
    (void)state;

    assert_non_null(got);
    srv_init(&s, loop, SRV_BIG_FIRST);
    s.big = malloc(BIG_BODY);
    assert_non_null(s.big);
    for (size_t i = 0; i < BIG_BODY; i++)
        s.big[i] = (unsigned char)(i * 7 + i / 4096);
    port = srv_listen(&s, &acc);
    assert_int_equal(pthread_create(&t, NULL, loop_thread, loop), 0);

    slow = connect_to(port, 4096);
    read_exact(slow, hdr, sizeof hdr);
    assert_memory_equal(hdr, BIG_HEADER, sizeof hdr);
    while (off < 64 << 10) {
        ssize_t n = read_some(slow, got + off, 4096 < BIG_BODY - off ? 4096 : BIG_BODY - off);
        assert_true(n > 0);
        off += (size_t)n;
        usleep(200);
    }
    /* The body is far from sent; another client is served all the same. */
    assert_int_equal(atomic_load(&s.sent_ok), 0);
    other = connect_to(port, 0);
    write_all(other, "still here?", 11);
    read_exact(other, hdr, 11);
    assert_memory_equal(hdr, "still here?", 11);
    close(other);
    while (off < BIG_BODY) {
        ssize_t n = read_some(slow, got + off, 4096 < BIG_BODY - off ? 4096 : BIG_BODY - off);
        assert_true(n > 0);
        off += (size_t)n;
    }
    assert_memory_equal(got, s.big, BIG_BODY);
    WAIT_UNTIL(atomic_load(&s.sent_ok) == 2);
    close(slow);
    WAIT_UNTIL(atomic_load(&s.ended) == 2);
    join_loop(loop, t);
    shmipc__loop_stats(loop, &st);
    assert_true(st.send_partial >= 1);
    shmipc__loop_free(loop);
    free(s.big);
    free(got);
}

/* 500 connections open at once, each with one exchange. */
#define MANY 500
static void many_connections(void **state)
{
    struct shmipc__loop *loop = new_loop();
    struct shmipc__acceptor *acc;
    struct srv s;
    static int fds[MANY];
    int port;
    (void)state;

    srv_init(&s, loop, SRV_ECHO);
    port = srv_listen(&s, &acc);
    for (int i = 0; i < MANY; i++)
        fds[i] = connect_to(port, 0);
    PUMP_UNTIL(loop, atomic_load(&s.accepted) == MANY);
    assert_int_equal(shmipc__loop_handles(loop), MANY + 1);
    for (int i = 0; i < MANY; i++) {
        char req[8];
        snprintf(req, sizeof req, "c%05d", i);
        write_all(fds[i], req, 6);
    }
    PUMP_UNTIL(loop, atomic_load(&s.sent_ok) == MANY);
    for (int i = 0; i < MANY; i++) {
        char req[8], resp[8];
        snprintf(req, sizeof req, "c%05d", i);
        read_exact(fds[i], resp, 6);
        assert_memory_equal(resp, req, 6);
        close(fds[i]);
    }
    PUMP_UNTIL(loop, atomic_load(&s.ended) == MANY);
    assert_int_equal(shmipc__loop_handles(loop), 1);
    shmipc__loop_free(loop);
}

/* Loop calls from a thread that does not own the loop are refused. */
struct foreign {
    struct shmipc__conn *conn;
    int rc;
    int detail_names_thread;
};

static void *foreign_thread(void *arg)
{
    struct foreign *f = arg;
    f->rc = shmipc__conn_send(f->conn, "x", 1, NULL, NULL);
    f->detail_names_thread = strstr(shmipc_error_detail(), "thread") != NULL;
    return NULL;
}

static void foreign_thread_refused(void **state)
{
    struct shmipc__loop *loop = new_loop();
    struct shmipc__conn *c;
    struct foreign f;
    struct srv s;
    pthread_t t;
    int sp[2];
    (void)state;

    srv_init(&s, loop, SRV_SINK);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    assert_int_equal(shmipc__conn_open(loop, sp[0], &srv_cbs, &s, &c), 0);
    f.conn = c;
    assert_int_equal(pthread_create(&t, NULL, foreign_thread, &f), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(f.rc, SHMIPC_EBUSY);
    assert_true(f.detail_names_thread);
    assert_int_equal(shmipc__loop_handles(loop), 1);
    close(sp[1]);
    shmipc__loop_free(loop);
}

/* Writes the pattern (byte i is i % 251) from offset *at until the socket would block, or
 * `limit` bytes in all. Returns how many bytes this call wrote. */
static size_t write_pattern(int fd, size_t *at, size_t limit)
{
    unsigned char buf[16384];
    size_t wrote = 0;
    int fl = fcntl(fd, F_GETFL);
    assert_int_equal(fcntl(fd, F_SETFL, fl | O_NONBLOCK), 0);
    while (*at < limit) {
        size_t n = limit - *at < sizeof buf ? limit - *at : sizeof buf;
        for (size_t i = 0; i < n; i++)
            buf[i] = (unsigned char)((*at + i) % 251);
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            assert_int_equal(errno, EAGAIN);
            break;
        }
        *at += (size_t)w;
        wrote += (size_t)w;
    }
    assert_int_equal(fcntl(fd, F_SETFL, fl), 0);
    return wrote;
}

/* Runs the loop for about `ms` milliseconds. */
static void pump_for(struct shmipc__loop *loop, int ms)
{
    uint64_t end = mono_ms() + (uint64_t)ms;
    while (mono_ms() < end)
        assert_true(shmipc__loop_run_once(loop, 5) >= 0);
}

/*
 * A paused connection gets no on_data: its socket buffers fill and the peer's writes block
 * (TCP flow control, the point of pausing). Resuming delivers everything, in order, and the
 * FIN that came while paused only after it.
 */
static void pause_read_stops_the_peer(void **state)
{
    struct shmipc__loop *loop = new_loop();
    struct srv s;
    size_t at = 0, limit = 64u << 20;
    int fd;
    (void)state;

    srv_init(&s, loop, SRV_SINK);
    s.check_pattern = 1;
    fd = srv_connect_one(&s);
    assert_int_equal(shmipc__conn_pause_read(s.last), 0);
    assert_int_equal(shmipc__conn_pause_read(s.last), 0); /* idempotent */
    assert_int_equal(shmipc__conn_read_paused(s.last), 1);
    pump_for(loop, 20);
    /* Until the socket would block: both kernel buffers full, nothing read by the server
     * (bytes completed before the pause took effect are held, not delivered). */
    for (int round = 0; round < 50; round++) {
        write_pattern(fd, &at, limit);
        pump_for(loop, 10);
        if (write_pattern(fd, &at, limit) == 0)
            break;
    }
    assert_true(at < limit);
    assert_int_equal(atomic_load(&s.received), 0);
    print_message("%s: a paused connection stopped its peer after %zu bytes\n", suite_backend(),
                  at);
    shutdown(fd, SHUT_WR);
    pump_for(loop, 20);
    assert_int_equal(atomic_load(&s.ended), 0);
    assert_int_equal(shmipc__conn_resume_read(s.last), 0);
    assert_int_equal(shmipc__conn_resume_read(s.last), 0);
    assert_int_equal(shmipc__conn_read_paused(s.last), 0);
    assert_int_equal(atomic_load(&s.received), 0); /* delivered from the loop, not the call */
    PUMP_UNTIL(loop, atomic_load(&s.ended) == 1);
    assert_int_equal(atomic_load(&s.received), at);
    assert_int_equal(atomic_load(&s.bad_byte), 0);
    assert_int_equal(atomic_load(&s.end_status), 0);
    close(fd);
    shmipc__loop_free(loop);
}

/* Pausing from on_data, with more input on its way, many times over: no byte is lost,
 * duplicated or reordered, and the loop does not spin while paused. */
static void pause_from_on_data(void **state)
{
    struct shmipc__loop *loop = new_loop();
    struct srv s;
    size_t at = 0, limit = 4u << 20;
    int fd, pauses = 0;
    (void)state;

    srv_init(&s, loop, SRV_SINK);
    s.check_pattern = 1;
    fd = srv_connect_one(&s);
    while (at < limit) {
        struct shmipc__loop_stats a, b;
        size_t before = atomic_load(&s.received);
        /* 64 KiB a round: several receives' worth, so more completes behind the pause. */
        s.pause_on_data = 1;
        write_pattern(fd, &at, at + (64u << 10) < limit ? at + (64u << 10) : limit);
        PUMP_UNTIL(loop, shmipc__conn_read_paused(s.last));
        pauses++;
        assert_true(atomic_load(&s.received) > before);
        shmipc__loop_stats(loop, &a);
        pump_for(loop, 5);
        shmipc__loop_stats(loop, &b);
        /* Paused: the conn does not come back turn after turn. */
        assert_true(b.events - a.events <= 2);
        /* Every other round the first delivery after the resume pauses again, in the middle
         * of what was held (io_uring) or of the socket's bytes (epoll). */
        s.pause_on_data = pauses % 2;
        assert_int_equal(shmipc__conn_resume_read(s.last), 0);
        uint64_t round_end = mono_ms() + 5000;
        while (atomic_load(&s.received) < at) {
            assert_true(mono_ms() < round_end);
            if (shmipc__conn_read_paused(s.last))
                assert_int_equal(shmipc__conn_resume_read(s.last), 0);
            assert_true(shmipc__loop_run_once(loop, 10) >= 0);
        }
        s.pause_on_data = 0;
        assert_int_equal(atomic_load(&s.bad_byte), 0);
    }
    assert_int_equal(atomic_load(&s.received), limit);
    assert_int_equal(atomic_load(&s.bad_byte), 0);
    struct shmipc__loop_stats st;
    shmipc__loop_stats(loop, &st);
    print_message("%s: %d pauses over %zu bytes, %llu receives held\n", suite_backend(), pauses,
                  limit, (unsigned long long)st.held);
    close(fd);
    PUMP_UNTIL(loop, atomic_load(&s.ended) == 1);
    shmipc__loop_free(loop);
}

/* on_hup's count, for hup_while_paused_keeps_sending (on its conn's data, a struct srv). */
static atomic_int hup_count;

static void hup_on_hup(struct shmipc__conn *c)
{
    (void)c;
    atomic_fetch_add(&hup_count, 1);
}

static const struct shmipc__conn_cbs hup_cbs = {srv_on_data, srv_on_end, hup_on_hup};

/*
 * A peer that sends, then its FIN, and reads a large answer: the read that pauses and the
 * hangup come in one event. on_hup is heard once, and the answer still goes out whole: the
 * one-shot epoll registration (EPOLLOUT for the blocked send) must be armed again, although
 * the conn went on the ready list for its hangup (which on_hup took at once).
 */
static void hup_while_paused_keeps_sending(void **state)
{
    struct shmipc__loop *loop = new_loop();
    struct shmipc__conn *c;
    struct srv s;
    int sp[2], sndbuf = 16384;
    size_t total = 4u << 20, got = 0;
    unsigned char *big = malloc(total), buf[65536];
    (void)state;

    assert_non_null(big);
    memset(big, 'b', total);
    atomic_store(&hup_count, 0);
    srv_init(&s, loop, SRV_SINK);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    set_timeouts(sp[1]);
    assert_int_equal(setsockopt(sp[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf), 0);
    assert_int_equal(shmipc__conn_open(loop, sp[0], &hup_cbs, &s, &c), 0);
    s.last = c;
    assert_int_equal(shmipc__conn_send(c, big, total, srv_sent_static, &s), 0);
    pump_for(loop, 20); /* the send blocks: nobody reads yet */
    assert_int_equal(atomic_load(&s.sent_ok), 0);
    s.pause_on_data = 1;
    write_all(sp[1], "request", 7);
    assert_int_equal(shutdown(sp[1], SHUT_WR), 0);
    PUMP_UNTIL(loop, atomic_load(&hup_count) == 1);
    assert_int_equal(shmipc__conn_read_paused(c), 1);
    assert_int_equal(atomic_load(&s.received), 7);
    int fl = fcntl(sp[1], F_GETFL);
    assert_int_equal(fcntl(sp[1], F_SETFL, fl | O_NONBLOCK), 0);
    uint64_t end = mono_ms() + 5000;
    while (got < total) {
        if (mono_ms() >= end)
            fail_msg("%s: the answer stalled after %zu of %zu bytes", suite_backend(), got, total);
        ssize_t n = read(sp[1], buf, sizeof buf);
        if (n > 0)
            got += (size_t)n;
        else
            assert_true(n < 0 && (errno == EAGAIN || errno == EINTR));
        assert_true(shmipc__loop_run_once(loop, 1) >= 0);
    }
    PUMP_UNTIL(loop, atomic_load(&s.sent_ok) == 1);
    assert_int_equal(atomic_load(&hup_count), 1);
    assert_int_equal(atomic_load(&s.ended), 0); /* on_end waits for the resume */
    assert_int_equal(shmipc__conn_resume_read(c), 0);
    PUMP_UNTIL(loop, atomic_load(&s.ended) == 1);
    assert_int_equal(atomic_load(&s.end_status), 0);
    assert_int_equal(atomic_load(&hup_count), 1);
    close(sp[1]);
    PUMP_UNTIL(loop, shmipc__loop_handles(loop) == 0);
    shmipc__loop_free(loop);
    free(big);
}

/* A timer started by a callback after a long wait runs its whole time from then. */
struct late {
    struct shmipc__timer t;
    uint64_t data_ms;
    atomic_ullong fired_ms;
};

static struct late late_state;

static void late_fire(struct shmipc__timer *t)
{
    (void)t;
    atomic_store(&late_state.fired_ms, mono_ms());
}

static void late_on_data(struct shmipc__conn *c, const void *data, size_t len)
{
    (void)c;
    (void)data;
    (void)len;
    if (late_state.data_ms == 0) {
        late_state.data_ms = mono_ms();
        assert_int_equal(shmipc__timer_start(&late_state.t, 200), 0);
    }
}

static void late_on_end(struct shmipc__conn *c, int status)
{
    (void)status;
    shmipc__conn_close(c);
}

static const struct shmipc__conn_cbs late_cbs = {late_on_data, late_on_end, NULL};

static void *late_writer(void *arg)
{
    usleep(400000);
    write_all((int)(intptr_t)arg, "x", 1);
    return NULL;
}

static void timer_from_callback_after_long_wait(void **state)
{
    struct shmipc__loop *loop = new_loop();
    struct shmipc__conn *c;
    pthread_t t;
    int sp[2];
    (void)state;

    memset(&late_state, 0, sizeof late_state);
    shmipc__timer_init(loop, &late_state.t, late_fire, NULL);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    assert_int_equal(shmipc__conn_open(loop, sp[0], &late_cbs, NULL, &c), 0);
    assert_int_equal(pthread_create(&t, NULL, late_writer, (void *)(intptr_t)sp[1]), 0);
    /* No timer is armed: the turn waits (400 ms) without a timeout, then reads the byte. */
    while (atomic_load(&late_state.fired_ms) == 0)
        assert_true(shmipc__loop_run_once(loop, late_state.data_ms ? 1000 : -1) >= 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(atomic_load(&late_state.fired_ms) - late_state.data_ms >= 190);
    close(sp[1]);
    PUMP_UNTIL(loop, shmipc__loop_handles(loop) == 0);
    shmipc__loop_free(loop);
}

#define SUITE_TESTS                                                                                \
    cmocka_unit_test(echo), cmocka_unit_test(keepalive_200),                                       \
        cmocka_unit_test(small_receive_buffer), cmocka_unit_test(fd_reuse_generation),             \
        cmocka_unit_test(half_close_sends_fin), cmocka_unit_test(end_of_input),                    \
        cmocka_unit_test(close_fails_queued_sends), cmocka_unit_test(large_sendv_slow_reader),     \
        cmocka_unit_test(many_connections), cmocka_unit_test(foreign_thread_refused),              \
        cmocka_unit_test(budget_bounds_a_turn), cmocka_unit_test(sendv_many_buffers),              \
        cmocka_unit_test(pause_read_stops_the_peer), cmocka_unit_test(pause_from_on_data),         \
        cmocka_unit_test(timer_from_callback_after_long_wait),                                     \
        cmocka_unit_test(hup_while_paused_keeps_sending)

#endif
