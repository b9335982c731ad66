#include "sockio.h"

#include "common/clock.h"
#include "common/error.h"
#include "common/unixsock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static int parse_unix(const char *path, const char *text, struct shmipc__addr *out)
{
    struct sockaddr_un *un = (struct sockaddr_un *)&out->ss;
    size_t n = strlen(path);
    un->sun_family = AF_UNIX;
    if (n == 0 || n >= sizeof un->sun_path)
        return shmipc__fail(SHMIPC_ENAMETOOLONG,
                            "address \"%s\": unix path of %zu bytes, need 1..%zu", text, n,
                            sizeof un->sun_path - 1);
    memcpy(un->sun_path, path, n);
    /* "@name" is Linux's abstract namespace: a leading NUL and no file. */
    if (path[0] == '@')
        un->sun_path[0] = '\0';
    out->len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (path[0] == '@' ? 0 : 1));
    out->family = AF_UNIX;
    return 0;
}

static int parse_inet(const char *hostport, const char *text, struct shmipc__addr *out)
{
    char host[256];
    const char *colon, *host_end;
    if (hostport[0] == '[') {
        host_end = strchr(hostport, ']');
        if (host_end == NULL || host_end[1] != ':')
            return shmipc__fail(SHMIPC_EINVAL, "address \"%s\": expected [IPv6]:PORT", text);
        colon = host_end + 1;
        hostport++;
    } else {
        colon = host_end = strrchr(hostport, ':');
    }
    if (colon == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "address \"%s\": expected HOST:PORT", text);
    size_t hlen = (size_t)(host_end - hostport);
    if (hlen == 0 || hlen >= sizeof host)
        return shmipc__fail(SHMIPC_EINVAL, "address \"%s\": bad host", text);
    memcpy(host, hostport, hlen);
    host[hlen] = '\0';
    char *endp;
    long port = strtol(colon + 1, &endp, 10);
    if (colon[1] == '\0' || *endp != '\0' || port < 0 || port > 65535)
        return shmipc__fail(SHMIPC_EINVAL, "address \"%s\": bad port", text);

    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *res;
    char portstr[8];
    snprintf(portstr, sizeof portstr, "%ld", port);
    int rc = getaddrinfo(host, portstr, &hints, &res);
    if (rc != 0)
        return shmipc__fail(SHMIPC_ENOENT, "address \"%s\": %s", text, gai_strerror(rc));
    memcpy(&out->ss, res->ai_addr, res->ai_addrlen);
    out->len = res->ai_addrlen;
    out->family = res->ai_family;
    freeaddrinfo(res);
    return 0;
}

int shmipc__addr_is_unix(const char *text)
{
    return text != NULL &&
           (strncmp(text, "unix:", 5) == 0 || text[0] == '/' || text[0] == '.' || text[0] == '@');
}

int shmipc__addr_parse(const char *text, struct shmipc__addr *out)
{
    memset(out, 0, sizeof *out);
    if (text == NULL || text[0] == '\0')
        return shmipc__fail(SHMIPC_EINVAL, "address: empty");
    if (strlen(text) >= sizeof out->text)
        return shmipc__fail(SHMIPC_ENAMETOOLONG, "address: longer than %zu bytes",
                            sizeof out->text - 1);
    strcpy(out->text, text);
    if (shmipc__addr_is_unix(text))
        return parse_unix(strncmp(text, "unix:", 5) == 0 ? text + 5 : text, text, out);
    if (strncmp(text, "tcp:", 4) == 0)
        return parse_inet(text + 4, text, out);
    return parse_inet(text, text, out);
}

int shmipc__fd_wait(int fd, short events, uint64_t deadline)
{
    struct pollfd p = {.fd = fd, .events = events};
    for (;;) {
        int rc = poll(&p, 1, shmipc__remaining_ms(deadline));
        if (rc > 0)
            return 0; /* readable, writable, or an error the next call reports */
        if (rc == 0)
            return shmipc__fail(SHMIPC_ETIMEDOUT, "socket: timed out waiting for the peer");
        if (errno != EINTR)
            return shmipc__fail_errno(errno, "socket: poll");
    }
}

int shmipc__write_full(int fd, const void *buf, size_t len, uint64_t deadline)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            int rc = shmipc__fd_wait(fd, POLLOUT, deadline);
            if (rc < 0)
                return rc;
            continue;
        }
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN))
            return shmipc__fail(SHMIPC_ECONNRESET, "socket: peer is gone (write)");
        return shmipc__fail_errno(errno, "socket: send");
    }
    return 0;
}

int shmipc__read_full(int fd, void *buf, size_t len, uint64_t deadline)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return shmipc__fail(SHMIPC_ECONNRESET, "socket: peer closed the connection");
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN) {
            int rc = shmipc__fd_wait(fd, POLLIN, deadline);
            if (rc < 0)
                return rc;
            continue;
        }
        if (errno == ECONNRESET)
            return shmipc__fail(SHMIPC_ECONNRESET, "socket: connection reset by peer");
        return shmipc__fail_errno(errno, "socket: recv");
    }
    return 0;
}

#define MAX_PASSED_FDS 8

int shmipc__send_fds(int fd, const int *fds, int n, uint64_t deadline)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * MAX_PASSED_FDS)];
        struct cmsghdr align;
    } ctl;
    char dummy = 0;
    struct iovec iov = {.iov_base = &dummy, .iov_len = 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf};
    if (n <= 0 || n > MAX_PASSED_FDS)
        return shmipc__fail(SHMIPC_EINVAL, "send_fds: %d fds", n);
    memset(&ctl, 0, sizeof ctl);
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n);
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)n);
    for (;;) {
        ssize_t rc = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (rc == 1)
            return 0;
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0 && errno == EAGAIN) {
            int w = shmipc__fd_wait(fd, POLLOUT, deadline);
            if (w < 0)
                return w;
            continue;
        }
        if (rc < 0 && (errno == EPIPE || errno == ECONNRESET))
            return shmipc__fail(SHMIPC_ECONNRESET, "send_fds: peer is gone");
        return shmipc__fail_errno(rc < 0 ? errno : EIO, "send_fds: sendmsg");
    }
}

/* Closes every fd carried by the control messages of `msg`. */
static void close_passed(struct msghdr *msg)
{
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c != NULL; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        int got[MAX_PASSED_FDS * 2];
        if (k > MAX_PASSED_FDS * 2)
            k = MAX_PASSED_FDS * 2;
        memcpy(got, CMSG_DATA(c), k * sizeof(int));
        for (size_t i = 0; i < k; i++)
            close(got[i]);
    }
}

int shmipc__recv_fds(int fd, int *fds, int n, uint64_t deadline)
{
    /* Room for more than expected, so a peer that sends extra fds cannot make them leak. */
    union {
        char buf[CMSG_SPACE(sizeof(int) * MAX_PASSED_FDS * 2)];
        struct cmsghdr align;
    } ctl;
    char dummy;
    struct iovec iov = {.iov_base = &dummy, .iov_len = 1};
    struct msghdr msg;
    if (n <= 0 || n > MAX_PASSED_FDS)
        return shmipc__fail(SHMIPC_EINVAL, "recv_fds: %d fds", n);
    for (;;) {
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof ctl.buf;
        ssize_t rc = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0 && errno == EAGAIN) {
            int w = shmipc__fd_wait(fd, POLLIN, deadline);
            if (w < 0)
                return w;
            continue;
        }
        if (rc == 0)
            return shmipc__fail(SHMIPC_ECONNRESET, "recv_fds: peer closed the connection");
        if (rc < 0)
            return shmipc__fail_errno(errno, "recv_fds: recvmsg");
        break;
    }
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    int ok = (msg.msg_flags & MSG_CTRUNC) == 0 &&
             msg.msg_controllen == CMSG_SPACE(sizeof(int) * (size_t)n) && c != NULL &&
             c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
             c->cmsg_len == CMSG_LEN(sizeof(int) * (size_t)n) && CMSG_NXTHDR(&msg, c) == NULL;
    if (!ok) {
        close_passed(&msg);
        return shmipc__fail(SHMIPC_EPROTO,
                            "recv_fds: expected one SCM_RIGHTS message with %d fds (control "
                            "length %zu, got %zu)",
                            n, (size_t)CMSG_SPACE(sizeof(int) * (size_t)n),
                            (size_t)msg.msg_controllen);
    }
    memcpy(fds, CMSG_DATA(c), sizeof(int) * (size_t)n);
    return 0;
}

int shmipc__sock_connect(const struct shmipc__addr *addr, uint64_t deadline)
{
    int fd = socket(addr->family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return shmipc__fail_errno(errno, "connect %s: socket", addr->text);
    if (connect(fd, (const struct sockaddr *)&addr->ss, addr->len) < 0) {
        if (errno != EINPROGRESS && errno != EAGAIN) {
            int err = errno;
            close(fd);
            if (err == ENOENT || err == ECONNREFUSED)
                return shmipc__fail(SHMIPC_ECONNREFUSED, "connect %s: nobody is listening",
                                    addr->text);
            return shmipc__fail_errno(err, "connect %s", addr->text);
        }
        int rc = shmipc__fd_wait(fd, POLLOUT, deadline);
        int err = 0;
        socklen_t len = sizeof err;
        if (rc == 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
            err = errno;
        if (rc < 0 || err != 0) {
            close(fd);
            if (rc < 0)
                return rc;
            if (err == ECONNREFUSED)
                return shmipc__fail(SHMIPC_ECONNREFUSED, "connect %s: refused", addr->text);
            return shmipc__fail_errno(err, "connect %s", addr->text);
        }
    }
    if (addr->family != AF_UNIX) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
}

#define LISTEN_BACKLOG 1024

int shmipc__sock_listen(const struct shmipc__addr *addr, unsigned mode,
                        struct shmipc__unix_file *file)
{
    const struct sockaddr_un *un = (const struct sockaddr_un *)&addr->ss;
    int fd = socket(addr->family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    memset(file, 0, sizeof *file);
    if (fd < 0)
        return shmipc__fail_errno(errno, "listen %s: socket", addr->text);
    if (addr->family != AF_UNIX) {
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    }
    if (addr->family == AF_UNIX) {
        int rc = shmipc__unix_listen_at(fd, un, addr->len, mode, LISTEN_BACKLOG, file);
        if (rc < 0) {
            close(fd);
            /* A regular file (or anything but a socket) there is "in use" too. */
            if (rc == -EADDRINUSE || rc == -EEXIST)
                return shmipc__fail(SHMIPC_EADDRINUSE, "listen %s: address in use", addr->text);
            return shmipc__fail_errno(-rc, "listen %s: bind", addr->text);
        }
        return fd;
    }
    if (bind(fd, (const struct sockaddr *)&addr->ss, addr->len) < 0) {
        int err = errno;
        close(fd);
        if (err == EADDRINUSE)
            return shmipc__fail(SHMIPC_EADDRINUSE, "listen %s: address in use", addr->text);
        return shmipc__fail_errno(err, "listen %s: bind", addr->text);
    }
    if (listen(fd, LISTEN_BACKLOG) < 0) {
        int err = errno;
        close(fd);
        return shmipc__fail_errno(err, "listen %s", addr->text);
    }
    return fd;
}
