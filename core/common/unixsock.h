/*
 * Unix socket files for listeners: made so that the path appears only once the socket
 * listens, replaced only when stale, removed only when still ours. Shared by the IPC listener
 * and the HTTP server.
 */
#ifndef SHMIPC_CORE_UNIXSOCK_H
#define SHMIPC_CORE_UNIXSOCK_H

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

/** The socket file a unix listener made, so that closing removes that file and no other. */
struct shmipc__unix_file {
    char path[108]; /* sun_path; "" for an abstract name or nothing made (nothing to remove) */
    dev_t dev;
    ino_t ino;
};

/**
 * True when something accepts connections on `un`, or when that cannot be told. Never blocks:
 * a live listener whose backlog is full answers EAGAIN, which counts as alive.
 */
int shmipc__unix_alive(const struct sockaddr_un *un, socklen_t len);

/**
 * Binds the unix stream socket `fd` to the file `path` and listens with `backlog`. The socket
 * is bound inside a private 0700 directory made next to `path` (same filesystem), given `mode`
 * there (0: the umask's), made to listen, and only then renamed into place: the file never
 * exists at `path` with another mode, and a client that sees it can connect at once. A socket
 * file at `path` that nothing accepts on (its server died) is replaced; a live one is
 * -EADDRINUSE; anything else there (a regular file, a symbolic link, a directory) is -EEXIST and
 * left as it is. A stale socket is swapped out with RENAME_EXCHANGE and swapped back unless what
 * came out is a socket nothing accepts on. `file` records what was made. Returns 0 or -errno.
 * The kernel keeps the name bound (/proc/self/fd/N/s): getsockname() and `ss -xl` show it, not
 * `path`. Needs /proc.
 */
int shmipc__unix_bind_listen(int fd, const char *path, unsigned mode, int backlog,
                             struct shmipc__unix_file *file);

/**
 * Binds the unix stream socket `fd` to `un` (`len` bytes) and listens: an abstract name
 * ("\0name") plainly, a path with shmipc__unix_bind_listen(). `file` records the file made
 * (none for an abstract name). Returns 0 or -errno (-EADDRINUSE: the name or a live socket is
 * taken; -EEXIST: not a socket at the path).
 */
int shmipc__unix_listen_at(int fd, const struct sockaddr_un *un, socklen_t len, unsigned mode,
                           int backlog, struct shmipc__unix_file *file);

/**
 * Tests only: called by shmipc__unix_bind_listen() with the path and the bound socket's
 * temporary name, at SHMIPC__UNIX_HOOK_PLACE once it listens, before it is put at the path,
 * at SHMIPC__UNIX_HOOK_EXCHANGE when a stale socket found there is about to be swapped out, and
 * at SHMIPC__UNIX_HOOK_GIVE_BACK when what came out was not stale and is about to go back.
 */
enum { SHMIPC__UNIX_HOOK_PLACE = 1, SHMIPC__UNIX_HOOK_EXCHANGE, SHMIPC__UNIX_HOOK_GIVE_BACK };
extern void (*shmipc__unix_bind_hook)(int stage, const char *path, const char *bound);

/** Removes the file `file` records if the path still holds that file, then forgets it. */
void shmipc__unix_unlink(struct shmipc__unix_file *file);

#endif
