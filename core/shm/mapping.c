#include "shm/mapping.h"

#include "common/error.h"
#include "shm/guard.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

/* The label the reference puts before every memfd name (go:sys_memfd_create_linux.go). */
#define MEMFD_LABEL "shmipc"
/* The kernel refuses memfd names longer than NAME_MAX minus the "memfd:" it prepends. */
#define MEMFD_NAME_MAX 249

void shmipc__mapping_init(struct shmipc__mapping *m)
{
    m->base = NULL;
    m->size = 0;
    m->fd = -1;
    m->guard = NULL;
    m->dev = 0;
    m->ino = 0;
    m->dir_len = 0;
    m->path[0] = '\0';
}

/* Remembers which file `fd` is, and that path[0..dir_len) is the directory to remove it from. */
static int keep_identity(struct shmipc__mapping *m, int fd, size_t dir_len)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return shmipc__fail_errno(errno, "%s: fstat", m->path);
    m->dev = (uint64_t)st.st_dev;
    m->ino = (uint64_t)st.st_ino;
    m->dir_len = (uint32_t)dir_len;
    return 0;
}

static int set_path(struct shmipc__mapping *m, const char *path)
{
    size_t n = path != NULL ? strlen(path) : 0;
    if (n >= sizeof m->path)
        return shmipc__fail(SHMIPC_ENAMETOOLONG, "shared memory name: %zu bytes, at most %zu", n,
                            sizeof m->path - 1);
    memcpy(m->path, path != NULL ? path : "", n + 1);
    return 0;
}

static int check_size(const char *what, uint64_t size)
{
    if (size == 0 || size > UINT32_MAX)
        return shmipc__fail(SHMIPC_EINVAL,
                            "%s: size %llu is outside 1..4294967295 (offsets are 32-bit)", what,
                            (unsigned long long)size);
    return 0;
}

/* Maps `fd` shared and read-write at `size` bytes into `m`, which takes the address only. */
static int map_shared(struct shmipc__mapping *m, int fd, size_t size, const char *what)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return shmipc__fail_errno(errno, "%s: mmap of %zu bytes", what, size);
    m->base = p;
    m->size = size;
    /* The file may shrink under us (the peer holds it): a SIGBUS then ends a session only. */
    m->guard = shmipc__guard_register(p, size);
    return 0;
}

int shmipc__mapping_create_memfd(struct shmipc__mapping *m, const char *path, size_t size)
{
    char name[MEMFD_NAME_MAX + 1];
    int fd = -1;
    int rc = check_size("memfd", size);
    if (rc < 0)
        return rc;
    rc = set_path(m, path);
    if (rc < 0)
        return rc;
    if ((size_t)snprintf(name, sizeof name, MEMFD_LABEL "%s", path) >= sizeof name) {
        rc = shmipc__fail(SHMIPC_ENAMETOOLONG, "memfd name \"" MEMFD_LABEL "%s\" exceeds %d bytes",
                          path, MEMFD_NAME_MAX);
        goto err;
    }
    /*
     * The reference passes flags 0. We add MFD_CLOEXEC so the fd does not leak into programs
     * this process execs (SCM_RIGHTS still passes it; the receiver's flags are its own), and
     * MFD_ALLOW_SEALING so V4 can seal the size. Neither changes what a legacy peer sees.
     */
    fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        rc = shmipc__fail_errno(errno, "memfd_create(\"%s\")", name);
        goto err;
    }
    if (ftruncate(fd, (off_t)size) != 0) {
        rc = shmipc__fail_errno(errno, "memfd \"%s\": ftruncate to %zu bytes", name, size);
        goto err;
    }
    rc = map_shared(m, fd, size, name);
    if (rc < 0)
        goto err;
    m->fd = fd;
    return 0;
err:
    if (fd >= 0)
        close(fd);
    shmipc__mapping_init(m);
    return rc;
}

int shmipc__mapping_create_file(struct shmipc__mapping *m, const char *path, size_t size)
{
    struct statvfs vfs;
    int fd = -1;
    int rc = check_size(path, size);
    if (rc < 0)
        return rc;
    rc = set_path(m, path);
    if (rc < 0)
        return rc;
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        rc = shmipc__fail_errno(errno, "%s: create", path);
        goto err;
    }
    /*
     * tmpfs allocates pages on first touch, so ftruncate succeeds on a full /dev/shm and the
     * first write then raises SIGBUS. The reference checks the free space first; so do we.
     */
    if (fstatvfs(fd, &vfs) != 0) {
        rc = shmipc__fail_errno(errno, "%s: fstatvfs", path);
        goto err;
    }
    if ((uint64_t)vfs.f_bavail * vfs.f_frsize < size) {
        rc = shmipc__fail(SHMIPC_ENOSPC, "%s: %zu bytes wanted, %llu free", path, size,
                          (unsigned long long)vfs.f_bavail * vfs.f_frsize);
        goto err;
    }
    if (ftruncate(fd, (off_t)size) != 0) {
        rc = shmipc__fail_errno(errno, "%s: ftruncate to %zu bytes", path, size);
        goto err;
    }
    /* Our own name: its directory is the prefix's, which our configuration chose. */
    const char *slash = strrchr(m->path, '/');
    if ((rc = keep_identity(m, fd, slash != NULL ? (size_t)(slash - m->path) : 0)) < 0)
        goto err;
    rc = map_shared(m, fd, size, path);
    if (rc < 0)
        goto err;
    close(fd);
    return 0;
err:
    /* Only a file this call created is removed: O_EXCL failing leaves fd at -1. */
    if (fd >= 0) {
        unlink(path);
        close(fd);
    }
    shmipc__mapping_init(m);
    return rc;
}

/* Maps an open fd at its fstat size; the caller decides what happens to the fd. */
static int map_whole(struct shmipc__mapping *m, int fd, const char *what)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return shmipc__fail_errno(errno, "%s: fstat", what);
    if (!S_ISREG(st.st_mode))
        return shmipc__fail(SHMIPC_EINVAL, "%s: not a regular file or memfd", what);
    int rc = check_size(what, st.st_size < 0 ? 0 : (uint64_t)st.st_size);
    if (rc < 0)
        return rc;
    return map_shared(m, fd, (size_t)st.st_size, what);
}

int shmipc__mapping_map_fd(struct shmipc__mapping *m, int fd, const char *path)
{
    struct stat st;
    struct statfs fs;
    int rc = set_path(m, path);
    if (rc < 0)
        return rc;
    /*
     * Shared memory only: a memfd (the kernel's internal tmpfs, or hugetlbfs) or a tmpfs file.
     * A peer's file on a disk, or on a FUSE mount whose daemon is the peer, would make every
     * page fault of ours wait on it, beyond any timeout and the SIGBUS guard. (What is not a
     * regular file at all map_whole refuses.)
     */
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
        (fstatfs(fd, &fs) != 0 || (fs.f_type != TMPFS_MAGIC && fs.f_type != HUGETLBFS_MAGIC))) {
        rc = shmipc__fail(SHMIPC_EACCES, "%s: not shared memory (a memfd or a tmpfs file)",
                          m->path[0] != '\0' ? m->path : "received fd");
        shmipc__mapping_init(m);
        return rc;
    }
    rc = map_whole(m, fd, m->path[0] != '\0' ? m->path : "received fd");
    if (rc < 0) {
        shmipc__mapping_init(m);
        return rc;
    }
    m->fd = fd;
    return 0;
}

static atomic_int force_walk;

void shmipc__mapping_force_walk(int on)
{
    atomic_store(&force_walk, on);
}

/*
 * Checks that `rel` is a relative name of plain components: not empty, not absolute, no empty
 * component ("//", a trailing "/"), no "." or "..". Lexically, before anything is opened.
 */
static int check_relative(const char *rel, const char *path)
{
    if (rel[0] == '\0')
        return shmipc__fail(SHMIPC_EACCES, "%s: no file name beneath the directory", path);
    for (const char *c = rel; *c != '\0';) {
        const char *end = strchr(c, '/');
        size_t n = end != NULL ? (size_t)(end - c) : strlen(c);
        if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
            return shmipc__fail(SHMIPC_EACCES,
                                "%s: a path component is empty, \".\" or \"..\" (refused)", path);
        c += n;
        if (*c == '/' && *++c == '\0')
            return shmipc__fail(SHMIPC_EACCES, "%s: ends with \"/\" (refused)", path);
    }
    return 0;
}

/*
 * Opens the directory that holds the last component of `rel`, beneath `dirfd`, following no
 * symlink (openat2, or one O_NOFOLLOW openat per component). Returns an fd (O_PATH; it may be
 * `dirfd` itself when `rel` has one component, then *own is 0) or a negative code.
 */
static int open_parent(int dirfd, const char *rel, const char *path, int *own)
{
    const char *last = strrchr(rel, '/');
    char sub[SHMIPC__SHM_NAME_MAX];
    *own = 0;
    if (last == NULL)
        return dirfd;
    size_t n = (size_t)(last - rel);
    memcpy(sub, rel, n);
    sub[n] = '\0';
    *own = 1;
    if (!atomic_load(&force_walk)) {
        struct open_how how = {
            .flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
            .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        };
        long fd = syscall(SYS_openat2, dirfd, sub, &how, sizeof how);
        if (fd >= 0)
            return (int)fd;
        /* Old seccomp profiles (Docker before 20.10) refuse unknown calls with EPERM. */
        if (errno != ENOSYS && errno != EPERM)
            return shmipc__fail_errno(errno == ELOOP || errno == EXDEV ? EACCES : errno,
                                      "%s: directory \"%s\" beneath the allowed one (symlinks "
                                      "are not followed)",
                                      path, sub);
    }
    /* No openat2 (kernels before 5.6, some seccomp filters): one component at a time. */
    int cur = dirfd;
    for (char *c = sub, *next; c != NULL; c = next) {
        next = strchr(c, '/');
        if (next != NULL)
            *next++ = '\0';
        int fd = openat(cur, c, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int err = errno;
        struct stat st;
        if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode))) {
            close(fd);
            fd = -1;
            err = ENOTDIR;
        }
        if (cur != dirfd)
            close(cur);
        if (fd < 0)
            return shmipc__fail_errno(err == ELOOP || err == ENOTDIR ? EACCES : err,
                                      "%s: component \"%s\" is not a directory beneath the "
                                      "allowed one (symlinks are not followed)",
                                      path, c);
        cur = fd;
    }
    return cur;
}

/* The file described by `st` may be mapped: a regular file with one link, owned by `owner`. */
static int check_file(const struct stat *st, uint32_t owner, const char *path)
{
    if (!S_ISREG(st->st_mode))
        return shmipc__fail(SHMIPC_EACCES, "%s: not a regular file (refused)", path);
    if (st->st_uid != owner)
        return shmipc__fail(SHMIPC_EACCES, "%s: belongs to uid %u, the peer is uid %u", path,
                            (unsigned)st->st_uid, (unsigned)owner);
    /* A second name could be a link to someone else's file, or keep it alive after we remove. */
    if (st->st_nlink != 1)
        return shmipc__fail(SHMIPC_EACCES, "%s: has %lu links, not 1 (refused)", path,
                            (unsigned long)st->st_nlink);
    return 0;
}

int shmipc__mapping_open_beneath(struct shmipc__mapping *m, const char *dir, const char *path,
                                 uint32_t owner)
{
    int dirfd = -1, parent = -1, own = 0, fd = -1;
    size_t dlen = strlen(dir);
    struct stat pre, st;
    struct statfs fs;
    int rc = set_path(m, path);
    if (rc < 0)
        return rc;
    if (dlen == 0 || strncmp(path, dir, dlen) != 0 || path[dlen] != '/') {
        rc = shmipc__fail(SHMIPC_EACCES, "%s: not beneath %s, where this server maps files", path,
                          dir);
        goto out;
    }
    const char *rel = path + dlen + 1;
    if ((rc = check_relative(rel, path)) < 0)
        goto out;
    /* The directory is ours (configured), so it is opened as it is, symlinks and all. */
    if ((dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0) {
        rc = shmipc__fail_errno(errno, "%s: open", dir);
        goto out;
    }
    if ((parent = open_parent(dirfd, rel, path, &own)) < 0) {
        rc = parent;
        goto out;
    }
    const char *last = strrchr(rel, '/') != NULL ? strrchr(rel, '/') + 1 : rel;
    /* Look before opening: opening a FIFO or a device can block or have side effects. */
    if (fstatat(parent, last, &pre, AT_SYMLINK_NOFOLLOW) != 0) {
        rc = shmipc__fail_errno(errno, "%s", path);
        goto out;
    }
    if ((rc = check_file(&pre, owner, path)) < 0)
        goto out;
    fd = openat(parent, last, O_RDWR | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        rc = shmipc__fail_errno(errno == ELOOP ? EACCES : errno, "%s: open", path);
        goto out;
    }
    /* What we opened must be what we looked at, and still pass: the name may have changed. */
    if (fstat(fd, &st) != 0 || fstatfs(fd, &fs) != 0) {
        rc = shmipc__fail_errno(errno, "%s: fstat", path);
        goto out;
    }
    if (st.st_dev != pre.st_dev || st.st_ino != pre.st_ino) {
        rc = shmipc__fail(SHMIPC_EACCES, "%s: replaced between the check and the open", path);
        goto out;
    }
    if ((rc = check_file(&st, owner, path)) < 0)
        goto out;
    if (fs.f_type != TMPFS_MAGIC) {
        rc = shmipc__fail(SHMIPC_EACCES, "%s: not on a tmpfs such as /dev/shm", path);
        goto out;
    }
    if ((rc = keep_identity(m, fd, dlen)) < 0 || (rc = map_whole(m, fd, path)) < 0)
        goto out;
out:
    if (fd >= 0)
        close(fd);
    if (own && parent >= 0)
        close(parent);
    if (dirfd >= 0)
        close(dirfd);
    if (rc < 0)
        shmipc__mapping_init(m);
    return rc;
}

int shmipc__shm_dir_of(const char *prefix, char *out, size_t cap)
{
    const char *slash = prefix[0] == '/' ? strrchr(prefix, '/') : NULL;
    const char *dir = slash != NULL ? prefix : "/dev/shm";
    size_t n = slash != NULL ? (size_t)(slash - prefix) : strlen(dir);
    /* A prefix right under the root ("/x") would allow the whole tree: refuse it. */
    if (slash != NULL && n == 0)
        return shmipc__fail(SHMIPC_EINVAL,
                            "path_prefix \"%s\": files right under / are not "
                            "served",
                            prefix);
    if (n >= cap)
        return shmipc__fail(SHMIPC_ENAMETOOLONG, "path_prefix \"%s\": directory too long", prefix);
    memcpy(out, dir, n);
    out[n] = '\0';
    return (int)n;
}

int shmipc__mapping_seal_size(struct shmipc__mapping *m)
{
    if (m->fd < 0)
        return shmipc__fail(SHMIPC_EINVAL, "%s: no memfd to seal", m->path);
    if (fcntl(m->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)
        return shmipc__fail_errno(errno, "%s: sealing the size", m->path);
    return 0;
}

int shmipc__mapping_damaged(const struct shmipc__mapping *m)
{
    return shmipc__guard_damaged(m->guard);
}

void shmipc__mapping_set_wake_fd(struct shmipc__mapping *m, int fd)
{
    shmipc__guard_set_wake_fd(m->guard, fd);
}

void shmipc__mapping_unmap(struct shmipc__mapping *m)
{
    shmipc__guard_unregister(m->guard);
    if (m->base != NULL)
        munmap(m->base, m->size);
    if (m->fd >= 0)
        close(m->fd);
    shmipc__mapping_init(m);
}

int shmipc__mapping_remove(const struct shmipc__mapping *m)
{
    char dir[SHMIPC__SHM_NAME_MAX];
    struct stat st;
    int dirfd = -1, parent = -1, own = 0, rc = 0;
    if (m->ino == 0)
        return 0;
    if (m->dir_len == 0) {
        /* A name right under "/", or a relative one of our own (a test's). */
        snprintf(dir, sizeof dir, "%s", m->path[0] == '/' ? "/" : ".");
    } else {
        memcpy(dir, m->path, m->dir_len);
        dir[m->dir_len] = '\0';
    }
    const char *rel = m->path + m->dir_len + (m->dir_len > 0 || m->path[0] == '/');
    if ((dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0) {
        rc = shmipc__fail_errno(errno, "%s: open", dir);
        goto out;
    }
    if ((parent = open_parent(dirfd, rel, m->path, &own)) < 0) {
        rc = parent;
        goto out;
    }
    const char *last = strrchr(rel, '/') != NULL ? strrchr(rel, '/') + 1 : rel;
    if (fstatat(parent, last, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        rc = shmipc__fail_errno(errno, "%s: remove", m->path);
        goto out;
    }
    /*
     * Between this comparison and unlinkat the name could be changed once more. That window
     * is the one every careful remover has (there is no unlink-by-inode): only a process that
     * may rename entries of that directory can use it, in the sticky /dev/shm only the owner
     * of the entry, so at worst the peer gets one of its own files removed.
     */
    if ((uint64_t)st.st_dev != m->dev || (uint64_t)st.st_ino != m->ino) {
        rc = shmipc__fail(SHMIPC_EACCES,
                          "%s: now names another file than the one mapped; left "
                          "in place",
                          m->path);
        goto out;
    }
    if (unlinkat(parent, last, 0) != 0)
        rc = shmipc__fail_errno(errno, "%s: unlink", m->path);
out:
    if (own && parent >= 0)
        close(parent);
    if (dirfd >= 0)
        close(dirfd);
    return rc;
}

int shmipc__mapping_unlink(const char *path)
{
    if (unlink(path) != 0)
        return shmipc__fail_errno(errno, "%s: unlink", path);
    return 0;
}

static int name_result(int n, size_t cap, const char *prefix)
{
    if (n < 0 || (size_t)n >= cap || n >= SHMIPC__SHM_NAME_MAX)
        return shmipc__fail(SHMIPC_ENAMETOOLONG,
                            "shared memory name for prefix \"%s\" does not fit in %zu bytes",
                            prefix, cap < SHMIPC__SHM_NAME_MAX ? cap : SHMIPC__SHM_NAME_MAX);
    return n;
}

int shmipc__shm_name_buffer(char *out, size_t cap, const char *prefix, long pid)
{
    return name_result(snprintf(out, cap, "%s_%ld_buffer", prefix, pid), cap, prefix);
}

int shmipc__shm_name_queue(char *out, size_t cap, const char *prefix, long pid, uint32_t n)
{
    return name_result(snprintf(out, cap, "%s_%ld_queue_%u", prefix, pid, n), cap, prefix);
}
