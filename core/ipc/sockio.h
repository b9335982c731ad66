/*
 * Blocking socket IO with deadlines for the handshake and the control stream, fd passing
 * (SCM_RIGHTS exactly as the reference does it), and address parsing. Sockets may be
 * blocking or not: every call waits with poll() before it reads or writes.
 */
#ifndef SHMIPC_CORE_IPC_SOCKIO_H
#define SHMIPC_CORE_IPC_SOCKIO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "common/unixsock.h"

/* A parsed address: "unix:PATH", "unix:@NAME" (abstract), a path starting with '/' or '.',
 * "tcp:HOST:PORT", or "HOST:PORT" (IPv6 as "[::1]:PORT"). */
struct shmipc__addr {
    struct sockaddr_storage ss;
    socklen_t len;
    int family; /* AF_UNIX, AF_INET or AF_INET6 */
    char text[256];
};

int shmipc__addr_parse(const char *text, struct shmipc__addr *out);

/* Waits until `fd` is ready for `events` (POLLIN/POLLOUT): 0, SHMIPC_ETIMEDOUT or an error. */
int shmipc__fd_wait(int fd, short events, uint64_t deadline);

/* Writes all of buf (MSG_NOSIGNAL: a dead peer is SHMIPC_ECONNRESET, never SIGPIPE). */
int shmipc__write_full(int fd, const void *buf, size_t len, uint64_t deadline);

/* Reads exactly len bytes; end of file is SHMIPC_ECONNRESET. */
int shmipc__read_full(int fd, void *buf, size_t len, uint64_t deadline);

/*
 * Sends one dummy byte 0x00 with one SCM_RIGHTS message carrying `fds` (reference §1.5: the
 * client sends [buffer, queue] after AckReadyRecvFD).
 */
int shmipc__send_fds(int fd, const int *fds, int n, uint64_t deadline);

/*
 * Receives the dummy byte and exactly `n` fds in one SCM_RIGHTS message whose control length
 * is CMSG_SPACE(4n), as the Go server requires. Any fd received beyond those, or with a
 * malformed message, is closed; on failure no fd is left open.
 */
int shmipc__recv_fds(int fd, int *fds, int n, uint64_t deadline);

/* Whether `text` names a unix socket ("unix:...", or a path or "@name" without the prefix),
 * by the rule shmipc__addr_parse() follows; anything else is TCP. */
int shmipc__addr_is_unix(const char *text);

/* Connects a stream socket to `addr` within the deadline; returns the fd (CLOEXEC). */
int shmipc__sock_connect(const struct shmipc__addr *addr, uint64_t deadline);

/*
 * Binds and listens on `addr` (CLOEXEC, non-blocking). A unix path whose socket nobody is
 * listening on any more is replaced; a live one, or anything but a socket, is
 * SHMIPC_EADDRINUSE. The socket file is created with mode 0600 unless `mode` says otherwise and
 * appears only once the socket listens (shmipc__unix_bind_listen); `file` records it.
 */
int shmipc__sock_listen(const struct shmipc__addr *addr, unsigned mode,
                        struct shmipc__unix_file *file);

#endif
