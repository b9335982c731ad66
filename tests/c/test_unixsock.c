/*
 * Description: unix socket files for listeners (core/common/unixsock.c), each race made
 * deterministic with the test hook: the socket listens before its file appears; a stale socket
 * is replaced, and what another process puts at the path between our look and the swap (a
 * regular file, a live socket, nothing) is given back or taken as it should; a third file
 * swapped in by the give-back is kept, never removed; the close removes only our own file.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/unixsock.h"

static char dir[64], path[96];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/shmipc-unixsock-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    snprintf(path, sizeof path, "%s/s.sock", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    shmipc__unix_bind_hook = NULL;
    DIR *d = opendir(dir);
    if (d != NULL) {
        for (struct dirent *e; (e = readdir(d)) != NULL;) {
            char p[512];
            if (e->d_name[0] == '.' && (e->d_name[1] == '\0' || e->d_name[1] == '.'))
                continue;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            if (unlink(p) < 0) { /* a private directory kept on purpose */
                char q[600];
                snprintf(q, sizeof q, "%s/s", p);
                unlink(q);
                rmdir(p);
            }
        }
        closedir(d);
    }
    rmdir(dir);
    return 0;
}

static struct sockaddr_un addr_of(const char *p)
{
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    snprintf(un.sun_path, sizeof un.sun_path, "%s", p);
    return un;
}

/* A socket bound at `p` (listening or not: not listening and closed is a stale file). */
static int plain_socket_at(const char *p, int listening)
{
    struct sockaddr_un un = addr_of(p);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&un, sizeof un), 0);
    if (listening)
        assert_int_equal(listen(fd, 8), 0);
    return fd;
}

static void make_stale(const char *p)
{
    close(plain_socket_at(p, 0));
}

/* 0 when a connect to `p` is taken (or queued), else -errno. */
static int try_connect(const char *p)
{
    struct sockaddr_un un = addr_of(p);
    int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int rc = connect(c, (struct sockaddr *)&un, sizeof un) == 0 || errno == EAGAIN ? 0 : -errno;
    close(c);
    return rc;
}

/* Entries of the test directory, the socket path's own included. */
static int entries(void)
{
    int n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.' || (e->d_name[1] != '\0' && e->d_name[1] != '.');
    closedir(d);
    return n;
}

static int ours(int lfd)
{
    /* A connect to the path lands in our backlog. */
    if (try_connect(path) != 0)
        return 0;
    int a = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (a < 0)
        return 0;
    close(a);
    return 1;
}

static int new_listener(struct shmipc__unix_file *file, int *rc)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    assert_true(fd >= 0);
    *rc = shmipc__unix_bind_listen(fd, path, 0600, 16, file);
    return fd;
}

static int place_checked;

static void check_listening_before_placed(int stage, const char *p, const char *bound)
{
    if (stage != SHMIPC__UNIX_HOOK_PLACE)
        return;
    struct stat st;
    assert_string_equal(p, path);
    assert_int_equal(lstat(p, &st), -1);     /* not at the path yet, */
    assert_int_equal(try_connect(bound), 0); /* and listening already */
    place_checked = 1;
}

static void listens_before_the_file_appears(void **state)
{
    (void)state;
    struct shmipc__unix_file file;
    struct stat st;
    int rc;
    shmipc__unix_bind_hook = check_listening_before_placed;
    int fd = new_listener(&file, &rc);
    assert_int_equal(rc, 0);
    assert_true(place_checked);
    assert_int_equal(lstat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_true(ours(fd));
    assert_int_equal(entries(), 1); /* the private directory is gone */
    shmipc__unix_unlink(&file);
    assert_int_equal(lstat(path, &st), -1);
    close(fd);
}

static void stale_socket_replaced_live_one_refused(void **state)
{
    (void)state;
    struct shmipc__unix_file file, other;
    int rc;
    make_stale(path);
    int fd = new_listener(&file, &rc);
    assert_int_equal(rc, 0);
    assert_true(ours(fd));
    assert_int_equal(entries(), 1); /* the stale file swapped out was removed */
    /* Ours is live now: the next one is refused and ours stays. */
    int fd2 = new_listener(&other, &rc);
    assert_int_equal(rc, -EADDRINUSE);
    assert_int_equal(other.path[0], '\0');
    close(fd2);
    assert_true(ours(fd));
    assert_int_equal(entries(), 1);
    shmipc__unix_unlink(&file);
    close(fd);
}

static void regular_file_there_refused_and_kept(void **state)
{
    (void)state;
    struct shmipc__unix_file file;
    int rc;
    FILE *f = fopen(path, "w");
    fputs("theirs", f);
    fclose(f);
    int fd = new_listener(&file, &rc);
    assert_int_equal(rc, -EEXIST);
    close(fd);
    char buf[16] = {0};
    f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(buf, sizeof buf, f));
    fclose(f);
    assert_string_equal(buf, "theirs");
    assert_int_equal(entries(), 1);
}

/* Between our look at the stale file and the swap, another process removes it and writes a
 * regular file there (on ext4 it may even get the stale file's inode number). */
static void put_regular_file(int stage, const char *p, const char *bound)
{
    (void)bound;
    if (stage != SHMIPC__UNIX_HOOK_EXCHANGE)
        return;
    assert_int_equal(unlink(p), 0);
    FILE *f = fopen(p, "w");
    fputs("theirs", f);
    fclose(f);
}

static void stale_swapped_for_a_regular_file_meanwhile(void **state)
{
    (void)state;
    struct shmipc__unix_file file;
    struct stat st;
    int rc;
    make_stale(path);
    shmipc__unix_bind_hook = put_regular_file;
    int fd = new_listener(&file, &rc);
    assert_int_equal(rc, -EADDRINUSE);
    close(fd);
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_size, 6);
    assert_int_equal(entries(), 1);
}

static int their_fd = -1;

/* Another server does unlink-and-bind between our look and the swap. */
static void put_live_socket(int stage, const char *p, const char *bound)
{
    (void)bound;
    if (stage != SHMIPC__UNIX_HOOK_EXCHANGE)
        return;
    assert_int_equal(unlink(p), 0);
    their_fd = plain_socket_at(p, 1);
}

static void remove_it(int stage, const char *p, const char *bound)
{
    (void)bound;
    if (stage == SHMIPC__UNIX_HOOK_EXCHANGE)
        assert_int_equal(unlink(p), 0);
}

static void stale_removed_meanwhile_path_taken(void **state)
{
    (void)state;
    struct shmipc__unix_file file;
    int rc;
    make_stale(path);
    shmipc__unix_bind_hook = remove_it;
    int fd = new_listener(&file, &rc);
    assert_int_equal(rc, 0);
    assert_true(ours(fd));
    assert_int_equal(entries(), 1);
    shmipc__unix_unlink(&file);
    close(fd);
}

/* As put_live_socket, and at the give-back our socket is removed from the path: theirs goes
 * back all the same. With `block`, a third file takes the path too: the give-back swaps it in,
 * and it is kept in the private directory, not removed. */
static int block;

static void and_empty_the_path(int stage, const char *p, const char *bound)
{
    put_live_socket(stage, p, bound);
    if (stage != SHMIPC__UNIX_HOOK_GIVE_BACK)
        return;
    assert_int_equal(unlink(p), 0); /* ours */
    if (block) {
        FILE *f = fopen(p, "w");
        fclose(f);
    }
}

/* A stale socket at the path, `hook` at work meanwhile: ours is refused "in use", and theirs
 * (their_fd, put there by the hook) is at the path and reachable. */
static void refused_for_theirs(void (*hook)(int, const char *, const char *), int with_block)
{
    struct shmipc__unix_file file;
    int rc;
    make_stale(path);
    block = with_block;
    shmipc__unix_bind_hook = hook;
    int fd = new_listener(&file, &rc);
    assert_int_equal(rc, -EADDRINUSE);
    close(fd);
    assert_true(ours(their_fd));
}

static void stale_swapped_for_a_live_socket_meanwhile(void **state)
{
    (void)state;
    refused_for_theirs(put_live_socket, 0);
    assert_int_equal(entries(), 1);
    close(their_fd);
}

static void give_back_when_our_socket_left_the_path(void **state)
{
    (void)state;
    refused_for_theirs(and_empty_the_path, 0);
    assert_int_equal(entries(), 1);
    close(their_fd);
}

static void a_third_file_swapped_in_is_kept(void **state)
{
    (void)state;
    struct stat st;
    /* The give-back swapped theirs for the third file: theirs is at the path and reachable,
     * the third file is kept in the private directory, not removed. */
    refused_for_theirs(and_empty_the_path, 1);
    assert_int_equal(entries(), 2);
    DIR *d = opendir(dir);
    char kept[600] = "";
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strncmp(e->d_name, ".shmipc-bind-", 13) == 0)
            snprintf(kept, sizeof kept, "%s/%s/s", dir, e->d_name);
    closedir(d);
    assert_true(kept[0] != '\0');
    assert_int_equal(lstat(kept, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    close(their_fd);
}

/* The close removes the file only while the path holds ours. */
static void unlink_removes_only_our_file(void **state)
{
    (void)state;
    struct shmipc__unix_file file;
    struct stat st;
    int rc;
    int fd = new_listener(&file, &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(unlink(path), 0);
    int theirs = plain_socket_at(path, 1);
    shmipc__unix_unlink(&file);
    assert_int_equal(lstat(path, &st), 0);
    assert_true(ours(theirs));
    close(theirs);
    close(fd);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(listens_before_the_file_appears),
        T(stale_socket_replaced_live_one_refused),
        T(regular_file_there_refused_and_kept),
        T(stale_swapped_for_a_regular_file_meanwhile),
        T(stale_swapped_for_a_live_socket_meanwhile),
        T(stale_removed_meanwhile_path_taken),
        T(give_back_when_our_socket_left_the_path),
        T(a_third_file_swapped_in_is_kept),
        T(unlink_removes_only_our_file),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
