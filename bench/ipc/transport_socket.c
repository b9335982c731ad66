/*
 * shmipc-bench ipc, baseline transports (unix domain socket, TCP loopback): listening,
 * connecting, and the echo server's side of a connection.
 */
#include "ipc_bench.h"

void sconn_close(struct server *sv, int i)
{
    close(sv->conns[i].fd);
    free(sv->conns[i].buf);
    sv->conns[i] = sv->conns[--sv->nconns];
}

/* Writes back what can be written; 1 while more remains, 0 when done, -1 on failure. */
static int sconn_flush(struct sconn *c)
{
    while (c->sent < c->msg) {
        ssize_t w = write(c->fd, c->buf + c->sent, c->msg - c->sent);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                return 1;
            return -1;
        }
        c->sent += (size_t)w;
    }
    /* A pipelining client may have sent part of the next message already: keep it. */
    memmove(c->buf, c->buf + c->msg, c->have - c->msg);
    c->have -= c->msg;
    c->msg = c->sent = 0;
    return 0;
}

/* Starts echoing when a whole message is in the buffer; grows the buffer for a large one. */
static int sconn_check(struct sconn *c)
{
    while (c->msg == 0 && c->have >= HDR) {
        size_t need = HDR + get_be32(c->buf);
        if (need > c->cap) {
            void *p = realloc(c->buf, need);
            if (p == NULL)
                return -1;
            c->buf = p;
            c->cap = need;
        }
        if (c->have < need)
            return 0;
        c->msg = need;
        c->sent = 0;
        int rc = sconn_flush(c);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* The connection fired: read (until a short read) or write back. -1 when it is done. */
int sconn_ready(struct sconn *c, short revents)
{
    if (c->msg > 0) {
        if (!(revents & (POLLOUT | POLLERR | POLLHUP)))
            return 0;
        int rc = sconn_flush(c);
        return rc < 0 ? -1 : sconn_check(c) < 0 ? -1 : 0;
    }
    for (;;) {
        size_t room = c->cap - c->have;
        ssize_t r = read(c->fd, c->buf + c->have, room);
        if (r == 0)
            return -1;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN ? 0 : -1;
        }
        c->have += (size_t)r;
        size_t before = c->have;
        if (sconn_check(c) < 0)
            return -1;
        /*
         * Read on only while a message is incomplete and the read filled the buffer: a short
         * read drained the socket, and poll() says when more comes.
         */
        if ((size_t)r < room || c->msg > 0 || c->have != before)
            return 0;
    }
}

void accept_conns(struct server *sv, int lfd, int tcp)
{
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                sys_fail("server: accept");
            return;
        }
        int one = 1;
        if (tcp && setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
            sys_fail("server: TCP_NODELAY");
        uint8_t *buf = malloc(64 * 1024 + HDR);
        if (buf == NULL ||
            grow((void **)&sv->conns, &sv->conns_cap, sv->nconns + 1, sizeof *sv->conns) < 0) {
            free(buf);
            close(fd);
            fprintf(stderr, "shmipc-bench: server: out of memory\n");
            return;
        }
        sv->conns[sv->nconns++] = (struct sconn){.fd = fd, .buf = buf, .cap = 64 * 1024 + HDR};
    }
}

int listen_unix(const char *path)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return sys_fail("unix socket");
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, SOMAXCONN) != 0) {
        sys_fail(path);
        close(fd);
        return -1;
    }
    return fd;
}

int listen_tcp(uint16_t *port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int one = 1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return sys_fail("tcp socket");
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, SOMAXCONN) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        sys_fail("tcp 127.0.0.1");
        close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

int sock_connect(const struct client *c)
{
    struct timeval tv = {io_timeout_ms / 1000, io_timeout_ms % 1000 * 1000};
    int one = 1, fd;
    if (c->t == T_UDS) {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof a.sun_path, "%s", c->uds_path);
        if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
            return sys_fail("unix socket");
        if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            sys_fail(c->uds_path);
            close(fd);
            return -1;
        }
    } else {
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons(c->tcp_port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if ((fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
            return sys_fail("tcp socket");
        if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) {
            sys_fail("tcp 127.0.0.1");
            close(fd);
            return -1;
        }
    }
    /* A hung server ends the run with an error instead of hanging it. */
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) {
        sys_fail("socket timeouts");
        close(fd);
        return -1;
    }
    return fd;
}
