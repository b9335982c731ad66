/* Description: shared-memory mappings: memfd and /dev/shm creation, mapping received fds and
 * existing files, sealing, size limits, clean-up, and the process-unique names. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "shmipc.h"
#include "shm/mapping.h"

/* A private directory for file mappings, removed by the teardown. */
struct dir {
    char path[64];
};

static int dir_setup(void **state)
{
    struct dir *d = calloc(1, sizeof *d);
    if (d == NULL)
        return -1;
    /* /dev/shm is where the reference puts its files; fall back where it is missing. */
    snprintf(d->path, sizeof d->path, "/dev/shm/shmipc-test-XXXXXX");
    if (mkdtemp(d->path) == NULL) {
        snprintf(d->path, sizeof d->path, "/tmp/shmipc-test-XXXXXX");
        if (mkdtemp(d->path) == NULL) {
            free(d);
            return -1;
        }
    }
    *state = d;
    return 0;
}

static int dir_teardown(void **state)
{
    struct dir *d = *state;
    int rc = rmdir(d->path); /* fails, and so fails the test, if a file was left behind */
    free(d);
    return rc;
}

static void in_dir(char *out, size_t cap, void **state, const char *name)
{
    const struct dir *d = *state;
    assert_true((size_t)snprintf(out, cap, "%s/%s", d->path, name) < cap);
}

static void names_follow_the_reference(void **state)
{
    (void)state;
    char buf[SHMIPC__SHM_NAME_MAX];
    assert_int_equal(shmipc__shm_name_buffer(buf, sizeof buf, "/dev/shm/shmipc", 19873), 28);
    assert_string_equal(buf, "/dev/shm/shmipc_19873_buffer");
    assert_int_equal(shmipc__shm_name_queue(buf, sizeof buf, "/dev/shm/shmipc", 19873, 0), 29);
    assert_string_equal(buf, "/dev/shm/shmipc_19873_queue_0");
    assert_int_equal(shmipc__shm_name_queue(buf, sizeof buf, "p", 1, 4294967295u), 20);
    assert_string_equal(buf, "p_1_queue_4294967295");
}

static void names_that_do_not_fit_are_refused(void **state)
{
    (void)state;
    char big[SHMIPC__SHM_NAME_MAX + 64], prefix[SHMIPC__SHM_NAME_MAX + 1];
    char small[16];
    assert_int_equal(shmipc__shm_name_buffer(small, sizeof small, "/dev/shm/shmipc", 1),
                     SHMIPC_ENAMETOOLONG);
    assert_non_null(strstr(shmipc_error_detail(), "/dev/shm/shmipc"));
    /* "<prefix>_1_buffer" is the prefix plus 9 bytes: 246 fits in 255, 247 does not. */
    memset(prefix, 'a', sizeof prefix);
    prefix[246] = '\0';
    assert_int_equal(shmipc__shm_name_buffer(big, sizeof big, prefix, 1), 255);
    prefix[246] = 'a';
    prefix[247] = '\0';
    assert_int_equal(shmipc__shm_name_buffer(big, sizeof big, prefix, 1), SHMIPC_ENAMETOOLONG);
    assert_int_equal(shmipc__shm_name_queue(big, sizeof big, prefix, 1, 0), SHMIPC_ENAMETOOLONG);
}

static void memfd_is_zeroed_labelled_and_sealable(void **state)
{
    (void)state;
    struct shmipc__mapping m, peer;
    char link[64], target[PATH_MAX];
    shmipc__mapping_init(&m);
    assert_int_equal(shmipc__mapping_create_memfd(&m, "/dev/shm/shmipc_7_buffer", 1u << 20), 0);
    assert_non_null(m.base);
    assert_int_equal(m.size, 1u << 20);
    assert_true(m.fd >= 0);
    assert_string_equal(m.path, "/dev/shm/shmipc_7_buffer");
    for (size_t i = 0; i < m.size; i += 4096)
        assert_int_equal(((uint8_t *)m.base)[i], 0);
    /* The kernel shows the reference's name: "shmipc" + path. */
    snprintf(link, sizeof link, "/proc/self/fd/%d", m.fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    assert_true(n > 0);
    target[n] = '\0';
    assert_non_null(strstr(target, "memfd:shmipc/dev/shm/shmipc_7_buffer"));
    assert_int_equal(fcntl(m.fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
    assert_int_equal(fcntl(m.fd, F_GET_SEALS), 0);

    /* The server maps what it receives: same memory, through its own fd and address. */
    int fd = dup(m.fd);
    assert_true(fd >= 0);
    shmipc__mapping_init(&peer);
    assert_int_equal(shmipc__mapping_map_fd(&peer, fd, "/dev/shm/shmipc_7_buffer"), 0);
    assert_int_equal(peer.size, m.size);
    assert_int_equal(peer.fd, fd);
    ((uint8_t *)m.base)[12345] = 0x5a;
    assert_int_equal(((uint8_t *)peer.base)[12345], 0x5a);

    /* Sealed, the memory can neither shrink under the peer nor grow. */
    assert_int_equal(shmipc__mapping_seal_size(&m), 0);
    assert_int_equal(fcntl(m.fd, F_GET_SEALS), F_SEAL_SHRINK | F_SEAL_GROW);
    assert_int_not_equal(ftruncate(m.fd, 4096), 0);
    shmipc__mapping_unmap(&peer);
    assert_int_equal(peer.fd, -1);
    assert_null(peer.base);
    shmipc__mapping_unmap(&m);
    shmipc__mapping_unmap(&m); /* twice is harmless */
    assert_int_equal(shmipc__mapping_seal_size(&m), SHMIPC_EINVAL);
}

static void memfd_refuses_bad_sizes_and_names(void **state)
{
    (void)state;
    struct shmipc__mapping m;
    char path[300];
    shmipc__mapping_init(&m);
    assert_int_equal(shmipc__mapping_create_memfd(&m, "/x", 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc__mapping_create_memfd(&m, "/x", (size_t)UINT32_MAX + 1), SHMIPC_EINVAL);
    /* The kernel takes 249 bytes of name; "shmipc" uses 6 of them. */
    memset(path, 'n', sizeof path);
    path[243] = '\0';
    assert_int_equal(shmipc__mapping_create_memfd(&m, path, 4096), 0);
    shmipc__mapping_unmap(&m);
    path[243] = 'n';
    path[244] = '\0';
    assert_int_equal(shmipc__mapping_create_memfd(&m, path, 4096), SHMIPC_ENAMETOOLONG);
    assert_null(m.base);
    assert_int_equal(m.fd, -1);
    path[299] = '\0';
    assert_int_equal(shmipc__mapping_create_memfd(&m, path, 4096), SHMIPC_ENAMETOOLONG);
}

static void received_fds_are_checked(void **state)
{
    (void)state;
    struct shmipc__mapping m;
    int fds[2];
    shmipc__mapping_init(&m);

    /* Empty: nothing the protocol could address. The caller keeps the fd on failure. */
    int fd = memfd_create("shmipc-test-empty", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(shmipc__mapping_map_fd(&m, fd, NULL), SHMIPC_EINVAL);
    assert_int_equal(fcntl(fd, F_GETFD) >= 0, 1);
    assert_null(m.base);
    /* Over 4 GiB: offsets are 32-bit. A sparse memfd costs nothing. */
    assert_int_equal(ftruncate(fd, (off_t)UINT32_MAX + 1), 0);
    assert_int_equal(shmipc__mapping_map_fd(&m, fd, NULL), SHMIPC_EINVAL);
    assert_non_null(strstr(shmipc_error_detail(), "received fd"));
    /* Exactly at the limit is fine (and still costs nothing until touched). */
    assert_int_equal(ftruncate(fd, (off_t)UINT32_MAX), 0);
    assert_int_equal(shmipc__mapping_map_fd(&m, fd, "big"), 0);
    assert_int_equal(m.size, UINT32_MAX);
    shmipc__mapping_unmap(&m); /* closes fd */

    /* Not a regular file: a pipe. A closed fd. */
    assert_int_equal(pipe(fds), 0);
    assert_int_equal(shmipc__mapping_map_fd(&m, fds[0], NULL), SHMIPC_EINVAL);
    close(fds[0]);
    close(fds[1]);
    assert_true(shmipc__mapping_map_fd(&m, fds[0], NULL) < 0);
    assert_null(m.base);
}

/*
 * A regular file of the peer's that is not shared memory: one on a disk, or on a FUSE mount of
 * the peer's own, whose daemon can leave every page fault of ours waiting for ever (the
 * processing thread, serve()'s only thread, a handshake that listener_close() joins), beyond
 * any timeout and the SIGBUS guard. Only memfds and tmpfs files are shared memory (a memfd is
 * on the kernel's internal tmpfs), as the V2 path check already demands; the caller keeps the
 * fd.
 */
static void received_fd_not_on_tmpfs_is_refused(void **state)
{
    (void)state;
    struct shmipc__mapping m;
    struct statfs fs;
    static const char *const dirs[] = {".", "/var/tmp", "/tmp"};
    char path[64];
    int fd = -1;
    shmipc__mapping_init(&m);
    /* The first directory we may write whose file system is not a tmpfs. */
    for (size_t i = 0; fd < 0 && i < sizeof dirs / sizeof dirs[0]; i++) {
        snprintf(path, sizeof path, "%s/shmipc-test-disk-XXXXXX", dirs[i]);
        if ((fd = mkstemp(path)) < 0)
            continue;
        unlink(path);
        if (fstatfs(fd, &fs) != 0 || fs.f_type == TMPFS_MAGIC) {
            close(fd);
            fd = -1;
        }
    }
    if (fd < 0)
        skip(); /* nowhere to make a file that is not on a tmpfs */
    assert_int_equal(ftruncate(fd, 1 << 20), 0);
    assert_int_equal(shmipc__mapping_map_fd(&m, fd, NULL), SHMIPC_EACCES);
    if (strstr(shmipc_error_detail(), "not shared memory") == NULL)
        fail_msg("detail \"%s\" lacks \"not shared memory\"", shmipc_error_detail());
    assert_null(m.base);
    assert_int_equal(fcntl(fd, F_GETFD) >= 0, 1);
    close(fd);
    /* A memfd is fine. */
    fd = memfd_create("shmipc-test-tmpfs", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 1 << 20), 0);
    assert_int_equal(shmipc__mapping_map_fd(&m, fd, NULL), 0);
    shmipc__mapping_unmap(&m); /* closes fd */
}

static void devshm_file_lifecycle(void **state)
{
    const struct dir *D = *state;
    struct shmipc__mapping m, peer;
    struct stat st;
    char path[128];
    in_dir(path, sizeof path, state, "shmipc_1_buffer");
    shmipc__mapping_init(&m);
    assert_int_equal(shmipc__mapping_create_file(&m, path, 1u << 20), 0);
    assert_int_equal(m.fd, -1); /* closed after mmap, as the reference does */
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 1u << 20);
    assert_int_equal(st.st_mode & 0777, 0600);
    /* A second client with the same name must not reuse the file. */
    struct shmipc__mapping again;
    shmipc__mapping_init(&again);
    assert_int_equal(shmipc__mapping_create_file(&again, path, 4096), SHMIPC_EEXIST);
    assert_null(again.base);
    assert_int_equal(stat(path, &st), 0); /* the failure did not remove the other's file */

    /* The server opens the path it was sent. */
    shmipc__mapping_init(&peer);
    assert_int_equal(shmipc__mapping_open_beneath(&peer, D->path, path, (uint32_t)geteuid()), 0);
    assert_int_equal(peer.size, 1u << 20);
    ((uint8_t *)peer.base)[777] = 7;
    assert_int_equal(((uint8_t *)m.base)[777], 7);
    shmipc__mapping_unmap(&peer);
    shmipc__mapping_unmap(&m);
    assert_int_equal(shmipc__mapping_unlink(path), 0);
    assert_int_equal(shmipc__mapping_unlink(path), SHMIPC_ENOENT);
    assert_int_equal(shmipc__mapping_open_beneath(&peer, D->path, path, (uint32_t)geteuid()),
                     SHMIPC_ENOENT);
    assert_null(peer.base);
}

static void devshm_refuses_what_it_should(void **state)
{
    struct shmipc__mapping m;
    char path[128], link[128], missing[128];
    shmipc__mapping_init(&m);
    in_dir(path, sizeof path, state, "empty");
    in_dir(link, sizeof link, state, "link");
    in_dir(missing, sizeof missing, state, "no/such/dir");
    const struct dir *D = *state;

    /* Sizes are checked before anything is created. */
    assert_int_equal(shmipc__mapping_create_file(&m, path, 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc__mapping_create_file(&m, path, (size_t)UINT32_MAX + 1), SHMIPC_EINVAL);
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(shmipc__mapping_create_file(&m, missing, 4096), SHMIPC_ENOENT);

    /* An empty file, a symlink planted by the peer, a directory. */
    int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(shmipc__mapping_open_beneath(&m, D->path, path, (uint32_t)geteuid()),
                     SHMIPC_EINVAL);
    assert_int_equal(symlink(path, link), 0);
    assert_true(shmipc__mapping_open_beneath(&m, D->path, link, (uint32_t)geteuid()) < 0);
    assert_true(shmipc__mapping_open_beneath(&m, D->path, D->path, (uint32_t)geteuid()) < 0);
    assert_null(m.base);
    assert_int_equal(unlink(link), 0);
    assert_int_equal(unlink(path), 0);

    char longpath[SHMIPC__SHM_NAME_MAX + 8];
    memset(longpath, 'x', sizeof longpath);
    longpath[sizeof longpath - 1] = '\0';
    assert_int_equal(shmipc__mapping_create_file(&m, longpath, 4096), SHMIPC_ENAMETOOLONG);
    assert_int_equal(shmipc__mapping_open_beneath(&m, D->path, longpath, (uint32_t)geteuid()),
                     SHMIPC_ENAMETOOLONG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(names_follow_the_reference),
        cmocka_unit_test(names_that_do_not_fit_are_refused),
        cmocka_unit_test(memfd_is_zeroed_labelled_and_sealable),
        cmocka_unit_test(memfd_refuses_bad_sizes_and_names),
        cmocka_unit_test(received_fds_are_checked),
        cmocka_unit_test(received_fd_not_on_tmpfs_is_refused),
        cmocka_unit_test_setup_teardown(devshm_file_lifecycle, dir_setup, dir_teardown),
        cmocka_unit_test_setup_teardown(devshm_refuses_what_it_should, dir_setup, dir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
