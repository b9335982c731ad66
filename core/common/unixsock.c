#include "unixsock.h"

#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void (*shmipc__unix_bind_hook)(int stage, const char *path, const char *bound);

/* A stale socket the exchange took out may be replaced meanwhile, or the path emptied: so many
 * goes at placing ours before "in use". */
#define PLACE_TRIES 4

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

static void bound_name(int dfd, struct sockaddr_un *un)
{
    memset(un, 0, sizeof *un);
    un->sun_family = AF_UNIX;
    snprintf(un->sun_path, sizeof un->sun_path, "/proc/self/fd/%d/s", dfd);
}

/* The test hook, given the bound socket's temporary name. */
static void hook(int stage, int dfd, const char *path)
{
    struct sockaddr_un bound;
    if (shmipc__unix_bind_hook == NULL)
        return;
    bound_name(dfd, &bound);
    shmipc__unix_bind_hook(stage, path, bound.sun_path);
}

/* `dfd`/"s" to `path` unless something is there (-EEXIST). A filesystem without
 * RENAME_NOREPLACE gets a hard link, which never replaces either. */
static int put_noreplace(int dfd, const char *path)
{
    if (renameat2(dfd, "s", AT_FDCWD, path, RENAME_NOREPLACE) == 0)
        return 0;
    if (errno != EINVAL)
        return -errno;
    if (linkat(dfd, "s", AT_FDCWD, path, 0) < 0)
        return -errno;
    unlinkat(dfd, "s", 0);
    return 0;
}

/* True when `dfd`/"s" is a socket nothing accepts on. What its inode number says is not asked:
 * a filesystem may give a freed one to the next file made. */
static int stale_here(int dfd)
{
    struct stat st;
    struct sockaddr_un un;
    if (fstatat(dfd, "s", &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISSOCK(st.st_mode))
        return 0;
    bound_name(dfd, &un);
    return !shmipc__unix_alive(&un, sizeof un);
}

/*
 * Puts the listening socket `dfd`/"s" at `path`: 0, -EADDRINUSE (a live socket there),
 * -EEXIST (not a socket there) or -errno. A stale socket file is swapped out with
 * RENAME_EXCHANGE and looked at where it landed, in our private directory: anything but a
 * socket nothing accepts on (another process put its own at the path between our look and the
 * exchange) is swapped back. What is left at `dfd`/"s" is the caller's to remove unless *keep
 * says it is not ours (`mine`: our socket) nor a stale socket: nothing of another's is removed.
 */
static int place(int dfd, const char *path, const char *dir, const struct stat *mine, int *keep)
{
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    struct stat st;
    int rc = -EADDRINUSE;
    memcpy(un.sun_path, path, strlen(path) + 1); /* it fits: the caller checked */
    for (int tries = 0; tries < PLACE_TRIES; tries++) {
        if ((rc = put_noreplace(dfd, path)) != -EEXIST)
            return rc;
        if (lstat(path, &st) < 0) {
            if (errno == ENOENT)
                continue; /* gone meanwhile: try again */
            return -errno;
        }
        if (!S_ISSOCK(st.st_mode))
            return -EEXIST;
        if (shmipc__unix_alive(&un, sizeof un))
            return -EADDRINUSE;
        hook(SHMIPC__UNIX_HOOK_EXCHANGE, dfd, path);
        if (renameat2(dfd, "s", AT_FDCWD, path, RENAME_EXCHANGE) < 0) {
            if (errno == ENOENT)
                continue;
            if (errno != EINVAL)
                return -errno;
            /* No exchange on this filesystem: remove the stale file and place ours without
             * replacing. A file put there between the look and the unlink is removed: the
             * window every unlink-and-bind server has. */
            if (unlink(path) < 0 && errno != ENOENT)
                return -errno;
            continue;
        }
        if (stale_here(dfd))
            return 0; /* the caller removes it */
        /* Not the stale file: give it back. */
        hook(SHMIPC__UNIX_HOOK_GIVE_BACK, dfd, path);
        if (renameat2(dfd, "s", AT_FDCWD, path, RENAME_EXCHANGE) == 0) {
            struct stat back;
            if (fstatat(dfd, "s", &back, AT_SYMLINK_NOFOLLOW) == 0 && back.st_dev == mine->st_dev &&
                back.st_ino == mine->st_ino)
                return -EADDRINUSE; /* ours, whose inode is in use: no other file has its number */
            /* A third file had taken the path from ours: it is here now, theirs went back. */
        } else if (errno == ENOENT && put_noreplace(dfd, path) == 0) {
            return -EADDRINUSE; /* ours had left the path: theirs went back, nothing replaced */
        }
        *keep = 1;
        SHMIPC__LOG(SHMIPC__LOG_WARN,
                    "listen %s: files were swapped at the path while it was being taken; one "
                    "that is not ours is kept in %s",
                    path, dir);
        return -EADDRINUSE;
    }
    return rc;
}

int shmipc__unix_bind_listen(int fd, const char *path, unsigned mode, int backlog,
                             struct shmipc__unix_file *file)
{
    char dir[256]; /* sun_path (108) plus the temporary name */
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) : 0;
    struct sockaddr_un tmp;
    struct stat st;
    int rc, keep = 0;
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
    bound_name(dfd, &tmp);
    if (bind(fd, (const struct sockaddr *)&tmp, sizeof tmp) < 0 ||
        (mode != 0 && fchmodat(dfd, "s", mode, 0) < 0) ||
        fstatat(dfd, "s", &st, AT_SYMLINK_NOFOLLOW) < 0 || listen(fd, backlog) < 0) {
        rc = -errno;
    } else {
        hook(SHMIPC__UNIX_HOOK_PLACE, dfd, path);
        if ((rc = place(dfd, path, dir, &st, &keep)) == 0) {
            memcpy(file->path, path, strlen(path) + 1);
            file->dev = st.st_dev;
            file->ino = st.st_ino;
        }
    }
    if (!keep) {
        /* Ours after a failure; the stale file after an exchange; nothing after a rename. */
        unlinkat(dfd, "s", 0);
        rmdir(dir);
    }
    close(dfd);
    return rc;
}

int shmipc__unix_listen_at(int fd, const struct sockaddr_un *un, socklen_t len, unsigned mode,
                           int backlog, struct shmipc__unix_file *file)
{
    memset(file, 0, sizeof *file);
    if (un->sun_path[0] == '\0') { /* abstract: no file */
        if (bind(fd, (const struct sockaddr *)un, len) < 0 || listen(fd, backlog) < 0)
            return -errno;
        return 0;
    }
    char path[sizeof un->sun_path + 1]; /* sun_path need not end in a NUL */
    size_t plen = len - offsetof(struct sockaddr_un, sun_path);
    if (plen > sizeof un->sun_path)
        plen = sizeof un->sun_path;
    memcpy(path, un->sun_path, plen);
    path[plen] = '\0';
    return shmipc__unix_bind_listen(fd, path, mode, backlog, file);
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
