#include "unixsock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int shmipc__unix_alive(const struct sockaddr_un *un, socklen_t len)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return 1; /* cannot tell: do not remove it */
    int alive = connect(fd, (const struct sockaddr *)un, len) == 0 ||
                (errno != ECONNREFUSED && errno != ENOENT);
    close(fd);
    return alive;
}

/*
 * Puts the listening socket `dfd`/"s" at `path`. RENAME_NOREPLACE keeps "address in use"
 * atomic. A stale socket file is replaced by an exchange, undone when what came out is not the
 * file found stale (another process put its own there meanwhile); a filesystem without exchange
 * gets a plain rename. Whatever is left at `dfd`/"s" is the caller's to remove.
 */
static int place(int dfd, const char *path)
{
    if (renameat2(dfd, "s", AT_FDCWD, path, RENAME_NOREPLACE) == 0)
        return 0;
    if (errno != EEXIST)
        return -errno;
    struct stat st, out;
    if (lstat(path, &st) < 0)
        return errno == ENOENT ? -EADDRINUSE : -errno; /* gone meanwhile: someone is at it */
    if (!S_ISSOCK(st.st_mode))
        return -EEXIST;
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof un.sun_path)
        return -ENAMETOOLONG;
    memcpy(un.sun_path, path, strlen(path) + 1);
    if (shmipc__unix_alive(&un, sizeof un))
        return -EADDRINUSE;
    if (renameat2(dfd, "s", AT_FDCWD, path, RENAME_EXCHANGE) < 0)
        return errno == EINVAL && renameat(dfd, "s", AT_FDCWD, path) == 0 ? 0 : -errno;
    if (fstatat(dfd, "s", &out, AT_SYMLINK_NOFOLLOW) == 0 && out.st_dev == st.st_dev &&
        out.st_ino == st.st_ino)
        return 0;                                         /* the stale file is at dfd/"s" now */
    renameat2(dfd, "s", AT_FDCWD, path, RENAME_EXCHANGE); /* not the stale file: give it back */
    return -EADDRINUSE;
}

int shmipc__unix_bind_listen(int fd, const char *path, unsigned mode, int backlog,
                             struct shmipc__unix_file *file)
{
    char dir[256]; /* sun_path (108) plus the temporary name */
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) : 0;
    struct stat st;
    int rc;
    memset(file, 0, sizeof *file);
    if (strlen(path) >= sizeof file->path)
        return -ENAMETOOLONG;
    if (slash && dlen == 0)
        dlen = 1; /* "/name": the root directory */
    rc = snprintf(dir, sizeof dir, "%.*s%s.shmipc-bind-XXXXXX", (int)dlen, slash ? path : "",
                  slash ? (dlen == 1 && path[0] == '/' ? "" : "/") : "");
    if (rc < 0 || (size_t)rc >= sizeof dir)
        return -ENAMETOOLONG;
    if (!mkdtemp(dir)) /* mode 0700 */
        return -errno;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        rc = -errno;
        rmdir(dir);
        return rc;
    }
    /* Through /proc/self/fd/<dirfd>/s the bound name stays short whatever the length of path. */
    struct sockaddr_un tmp = {.sun_family = AF_UNIX};
    snprintf(tmp.sun_path, sizeof tmp.sun_path, "/proc/self/fd/%d/s", dfd);
    if (bind(fd, (const struct sockaddr *)&tmp, sizeof tmp) < 0 ||
        (mode != 0 && fchmodat(dfd, "s", mode, 0) < 0) ||
        fstatat(dfd, "s", &st, AT_SYMLINK_NOFOLLOW) < 0 || listen(fd, backlog) < 0)
        rc = -errno;
    else if ((rc = place(dfd, path)) == 0) {
        memcpy(file->path, path, strlen(path) + 1);
        file->dev = st.st_dev;
        file->ino = st.st_ino;
    }
    /* Ours after a failure; the stale file after an exchange; nothing after a rename. */
    unlinkat(dfd, "s", 0);
    close(dfd);
    rmdir(dir);
    return rc;
}

void shmipc__unix_unlink(struct shmipc__unix_file *file)
{
    struct stat st;
    /* Only the file this listener made: a path another server took over since stays. */
    if (file->path[0] != '\0' && lstat(file->path, &st) == 0 && S_ISSOCK(st.st_mode) &&
        st.st_dev == file->dev && st.st_ino == file->ino)
        unlink(file->path);
    file->path[0] = '\0';
}
