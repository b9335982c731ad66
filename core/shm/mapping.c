#include "shm/mapping.h"

#include "common/error.h"
#include "shm/guard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
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
    m->path[0] = '\0';
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
    int rc = set_path(m, path);
    if (rc < 0)
        return rc;
    rc = map_whole(m, fd, m->path[0] != '\0' ? m->path : "received fd");
    if (rc < 0) {
        shmipc__mapping_init(m);
        return rc;
    }
    m->fd = fd;
    return 0;
}

int shmipc__mapping_open_file(struct shmipc__mapping *m, const char *path)
{
    int rc = set_path(m, path);
    if (rc < 0)
        return rc;
    /* The path comes from the peer: never follow a symlink it planted as the last component. */
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        rc = shmipc__fail_errno(errno, "%s: open", path);
        shmipc__mapping_init(m);
        return rc;
    }
    rc = map_whole(m, fd, path);
    close(fd);
    if (rc < 0)
        shmipc__mapping_init(m);
    return rc;
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
