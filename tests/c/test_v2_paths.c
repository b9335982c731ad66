/*
 * A V2 client names the /dev/shm files the server maps and later removes (reference §1.4).
 * A hostile local client must not make the server map, or remove, anything but a file of its
 * own beneath the server's directory (the directory of its path prefix): each refusal below
 * ends the handshake with SHMIPC_EACCES (or the size error) and a detail saying why, and
 * leaves every file as it was. The server's session is made here from one end of a
 * socketpair, with the V2 ShareMemory message written by hand on the other end, so the test
 * controls every byte and every file. Each refusal also runs with the openat walk that
 * replaces openat2 on kernels without it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ipc_helpers.h"

#include "ipc/proto.h"
#include "ipc/session.h"
#include "shm/buffer.h"
#include "shm/mapping.h"
#include "shm/queue.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <linux/magic.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>

#define QUEUE_CAP 16
#define BUFFER    (256u << 10)

static char base[96];  /* the server's directory: /dev/shm/shmipc-v2p-XXXXXX */
static char other[96]; /* a directory beside it, outside what the server serves */
static shmipc_config *cfg;

static void at(char *out, const char *dir, const char *name)
{
    assert_true((size_t)snprintf(out, 160, "%s/%s", dir, name) < 160);
}

/* A V2 client's two files, laid out as a client does, left in place. */
static void make_files(const char *q, const char *b)
{
    static const shmipc_slice_class classes[] = {{4096, 100}};
    struct shmipc__mapping m;
    struct shmipc__buffer bm;
    struct shmipc__queue_pair qp;
    uint64_t qsize = shmipc__queue_pair_size_for(QUEUE_CAP, SHMIPC__QUEUE_LEGACY);
    shmipc__mapping_init(&m);
    assert_int_equal(shmipc__mapping_create_file(&m, q, qsize), 0);
    assert_int_equal(
        shmipc__queue_pair_format(&qp, m.base, m.size, QUEUE_CAP, SHMIPC__QUEUE_LEGACY), 0);
    shmipc__mapping_unmap(&m);
    assert_int_equal(shmipc__mapping_create_file(&m, b, BUFFER), 0);
    assert_int_equal(shmipc__buffer_format(&bm, m.base, m.size, classes, 1), 0);
    shmipc__mapping_unmap(&m);
}

/*
 * Who `path` is (not following a symlink): device, inode, size, change and modification times
 * and a hash of its bytes, taken BEFORE an action, so a file the server removed and one put in
 * its place, or one it wrote into, no longer compares equal afterwards.
 */
struct ident {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime, ctime;
    uint64_t hash;
};

static uint64_t hash_of(const char *path)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    uint8_t buf[4096];
    ssize_t n;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return 0; /* a symlink or a non-regular file: its lstat fields identify it */
    while ((n = read(fd, buf, sizeof buf)) > 0)
        for (ssize_t i = 0; i < n; i++)
            h = (h ^ buf[i]) * 1099511628211ull;
    close(fd);
    return h;
}

static struct ident ident_of(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        fail_msg("%s: %s", path, strerror(errno));
    return (struct ident){st.st_dev,  st.st_ino,  st.st_size,
                          st.st_mtim, st.st_ctim, S_ISREG(st.st_mode) ? hash_of(path) : 0};
}

static int ident_equal(struct ident a, struct ident b)
{
    return a.dev == b.dev && a.ino == b.ino && a.size == b.size &&
           a.mtime.tv_sec == b.mtime.tv_sec && a.mtime.tv_nsec == b.mtime.tv_nsec &&
           a.ctime.tv_sec == b.ctime.tv_sec && a.ctime.tv_nsec == b.ctime.tv_nsec &&
           a.hash == b.hash;
}

static void assert_untouched(const char *path, struct ident was)
{
    if (!ident_equal(ident_of(path), was))
        fail_msg("%s was replaced or changed", path);
}

/*
 * The identity above must tell a file from one put in its place with the same name, size and
 * bytes, and from the same file written into; otherwise "untouched" proves only existence.
 */
static void v2_identity_sees_a_replaced_or_written_file(void **state)
{
    (void)state;
    char q[160], b[160];
    at(q, base, "q");
    at(b, base, "b");
    make_files(q, b);
    struct ident was = ident_of(q);
    assert_true(ident_equal(ident_of(q), was));
    /* Replaced: same name, same size, same bytes. */
    char tmp[160];
    at(tmp, base, "q.new");
    int in = open(q, O_RDONLY | O_CLOEXEC), out = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(in >= 0 && out >= 0);
    char buf[4096];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0)
        assert_int_equal(write(out, buf, (size_t)n), n);
    close(in);
    close(out);
    assert_int_equal(rename(tmp, q), 0);
    assert_int_equal(ident_of(q).size, was.size);
    assert_int_equal(ident_of(q).hash, was.hash);
    assert_false(ident_equal(ident_of(q), was));
    /* Written into in place, size unchanged. */
    was = ident_of(q);
    int fd = open(q, O_WRONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "x", 1, 0), 1);
    close(fd);
    assert_false(ident_equal(ident_of(q), was));
}

/* The server's side of a V2 handshake naming `q` and `b`. */
static int serve(const char *q, const char *b, shmipc_session **out)
{
    uint8_t msg[8 + 4 + 2 * 256];
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    size_t n =
        shmipc__encode_share_memory(msg, sizeof msg, 2, SHMIPC__MSG_SHARE_MEMORY_BY_PATH, q, b);
    assert_true(n > 0);
    assert_int_equal(write(sv[1], msg, n), (ssize_t)n);
    int rc = shmipc__session_accept_fd(sv[0], cfg, out);
    close(sv[1]);
    return rc;
}

/*
 * The server's side of a V2 handshake naming `q` and `b`, over a loopback TCP connection: a
 * peer with no credentials, which may as well be on another host.
 */
static int serve_tcp(const char *q, const char *b, shmipc_session **out)
{
    uint8_t msg[8 + 4 + 2 * 256];
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(l >= 0 && c >= 0);
    assert_int_equal(bind(l, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(l, 1), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&sa, &len), 0);
    assert_int_equal(connect(c, (struct sockaddr *)&sa, sizeof sa), 0);
    int a = accept4(l, NULL, NULL, SOCK_CLOEXEC);
    assert_true(a >= 0);
    close(l);
    size_t n =
        shmipc__encode_share_memory(msg, sizeof msg, 2, SHMIPC__MSG_SHARE_MEMORY_BY_PATH, q, b);
    assert_true(n > 0);
    assert_int_equal(write(c, msg, n), (ssize_t)n);
    int rc = shmipc__session_accept_fd(a, cfg, out);
    close(c);
    return rc;
}

/* Serves `q` and `b` with both resolvers and expects the refusal `code` naming `why`. */
static void expect_refused(const char *q, const char *b, int code, const char *why)
{
    struct ipc_held before = ipc_held_now();
    for (int walk = 0; walk < 2; walk++) {
        shmipc_session *s = NULL;
        shmipc__mapping_force_walk(walk);
        int rc = serve(q, b, &s);
        shmipc__mapping_force_walk(0);
        if (rc == 0)
            shmipc_session_close(s);
        assert_int_equal(rc, code);
        if (strstr(shmipc_error_detail(), why) == NULL)
            fail_msg("detail \"%s\" lacks \"%s\" (walk %d)", shmipc_error_detail(), why, walk);
    }
    ipc_assert_held(&before);
}

static void rm_rf(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static int setup(void **state)
{
    (void)state;
    char prefix[160];
    snprintf(base, sizeof base, "/dev/shm/shmipc-v2p-XXXXXX");
    snprintf(other, sizeof other, "/dev/shm/shmipc-v2p-out-XXXXXX");
    if (mkdtemp(base) == NULL || mkdtemp(other) == NULL)
        return -1;
    snprintf(prefix, sizeof prefix, "%s/srv", base);
    if (shmipc_config_new(&cfg) != 0 || shmipc_config_set_path_prefix(cfg, prefix) != 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    rm_rf(base);
    rm_rf(other);
    mkdir(base, 0700);
    mkdir(other, 0700);
    return 0;
}

static int teardown_last(void **state)
{
    teardown(state);
    rmdir(base);
    rmdir(other);
    shmipc_config_free(cfg);
    return 0;
}

/* The ordinary case, in the directory and beneath it: mapped, and removed at the close. */
static void v2_files_beneath_the_directory_are_mapped_and_removed(void **state)
{
    (void)state;
    char q[160], b[160], sub[160];
    shmipc_session *s;
    for (int walk = 0; walk < 2; walk++) {
        at(sub, base, "sub");
        if (walk)
            assert_int_equal(mkdir(sub, 0700), 0);
        at(q, walk ? sub : base, "c_1_queue_0");
        at(b, walk ? sub : base, "c_1_buffer");
        make_files(q, b);
        shmipc__mapping_force_walk(walk);
        assert_int_equal(serve(q, b, &s), 0);
        shmipc__mapping_force_walk(0);
        assert_int_equal(access(q, F_OK), 0);
        shmipc_session_close(s);
        assert_int_equal(access(q, F_OK), -1);
        assert_int_equal(access(b, F_OK), -1);
    }
}

/*
 * The server's own directory may be reached through a symlink (as /dev/shm -> /run/shm on
 * some systems): it is configuration, not the peer's, and is followed as it is.
 */
static void v2_directory_of_the_prefix_may_be_a_symlink(void **state)
{
    (void)state;
    char real[160], link[160], prefix[160], q[160], b[160], lq[160], lb[160];
    shmipc_session *s;
    shmipc_config *saved = cfg;
    at(real, base, "real");
    at(link, other, "to-real");
    assert_int_equal(mkdir(real, 0700), 0);
    assert_int_equal(symlink(real, link), 0);
    at(prefix, link, "srv");
    assert_int_equal(shmipc_config_new(&cfg), 0);
    assert_int_equal(shmipc_config_set_path_prefix(cfg, prefix), 0);
    at(q, real, "q");
    at(b, real, "b");
    make_files(q, b);
    at(lq, link, "q");
    at(lb, link, "b");
    assert_int_equal(serve(lq, lb, &s), 0);
    shmipc_session_close(s);
    assert_int_equal(access(q, F_OK), -1);
    assert_int_equal(access(b, F_OK), -1);
    shmipc_config_free(cfg);
    cfg = saved;
}

/* base/link -> base/real: a directory component that is a symlink. */
static void v2_symlinked_directory_component_is_refused(void **state)
{
    (void)state;
    char real[160], link[160], q[160], b[160], lq[160], lb[160];
    at(real, base, "real");
    at(link, base, "link");
    assert_int_equal(mkdir(real, 0700), 0);
    at(q, real, "q");
    at(b, real, "b");
    make_files(q, b);
    assert_int_equal(symlink(real, link), 0);
    at(lq, link, "q");
    at(lb, link, "b");
    struct ident iq = ident_of(q), ib = ident_of(b);
    expect_refused(lq, lb, SHMIPC_EACCES, "symlinks are not followed");
    /* The same through a symlink to a directory outside. */
    char out_q[160], out_b[160], olink[160], oq[160], ob[160];
    at(out_q, other, "q");
    at(out_b, other, "b");
    make_files(out_q, out_b);
    struct ident ioq = ident_of(out_q), iob = ident_of(out_b);
    at(olink, base, "olink");
    assert_int_equal(symlink(other, olink), 0);
    at(oq, olink, "q");
    at(ob, olink, "b");
    expect_refused(oq, ob, SHMIPC_EACCES, "symlinks are not followed");
    assert_untouched(q, iq);
    assert_untouched(b, ib);
    assert_untouched(out_q, ioq);
    assert_untouched(out_b, iob);
}

/* base/lq -> base/q: the last component is a symlink. */
static void v2_symlinked_last_component_is_refused(void **state)
{
    (void)state;
    char q[160], b[160], lq[160];
    at(q, base, "q");
    at(b, base, "b");
    at(lq, base, "lq");
    make_files(q, b);
    assert_int_equal(symlink(q, lq), 0);
    struct ident iq = ident_of(q), il = ident_of(lq);
    expect_refused(lq, b, SHMIPC_EACCES, "not a regular file");
    assert_untouched(q, iq);
    assert_untouched(lq, il);
}

/* "..", ".", empty components and paths outside the directory are refused by their text. */
static void v2_dotdot_and_paths_outside_are_refused(void **state)
{
    (void)state;
    char q[160], b[160], sub[160], up[160], oq[160], ob[160], dot[160], dbl[160];
    at(q, base, "q");
    at(b, base, "b");
    at(sub, base, "sub");
    make_files(q, b);
    assert_int_equal(mkdir(sub, 0700), 0);
    struct ident iq = ident_of(q);
    at(up, sub, "../q"); /* resolves to base/q, a good file */
    expect_refused(up, b, SHMIPC_EACCES, "\"..\"");
    at(dot, base, "./q");
    expect_refused(dot, b, SHMIPC_EACCES, "\"..\"");
    snprintf(dbl, sizeof dbl, "%s//q", base);
    expect_refused(dbl, b, SHMIPC_EACCES, "\"..\"");
    /* A good file in a directory beside the served one, by its plain absolute path. */
    at(oq, other, "q");
    at(ob, other, "b");
    make_files(oq, ob);
    struct ident ioq = ident_of(oq);
    expect_refused(oq, ob, SHMIPC_EACCES, "not beneath");
    /* A prefix of the directory's name is not the directory. */
    char sibling[160];
    snprintf(sibling, sizeof sibling, "%sx/q", base);
    expect_refused(sibling, b, SHMIPC_EACCES, "not beneath");
    expect_refused("q", b, SHMIPC_EACCES, "not beneath");
    assert_untouched(q, iq);
    assert_untouched(oq, ioq);
}

/* A FIFO (whose open could block), a directory, a device node. */
static void v2_non_regular_files_are_refused(void **state)
{
    (void)state;
    char q[160], b[160], fifo[160], dir[160], dev[160];
    at(q, base, "q");
    at(b, base, "b");
    make_files(q, b);
    at(fifo, base, "fifo");
    at(dir, base, "dir");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(mkdir(dir, 0700), 0);
    expect_refused(fifo, b, SHMIPC_EACCES, "not a regular file");
    expect_refused(q, dir, SHMIPC_EACCES, "not a regular file");
    at(dev, base, "null");
    if (mknod(dev, S_IFCHR | 0600, makedev(1, 3)) == 0)
        expect_refused(dev, b, SHMIPC_EACCES, "not a regular file");
    else
        print_message("(no device node: mknod needs root; %s)\n", strerror(errno));
    struct stat st;
    assert_int_equal(lstat(fifo, &st), 0);
    assert_true(S_ISFIFO(st.st_mode));
}

/* A server whose directory is not a tmpfs maps nothing from it (page cache, disk writes). */
static void v2_file_not_on_tmpfs_is_refused(void **state)
{
    (void)state;
    char dir[64], prefix[160], q[160], b[160];
    struct statfs fs;
    shmipc_config *saved = cfg;
    snprintf(dir, sizeof dir, "/var/tmp/shmipc-v2p-XXXXXX");
    assert_non_null(mkdtemp(dir));
    if (statfs(dir, &fs) != 0 || fs.f_type == TMPFS_MAGIC) {
        rmdir(dir);
        print_message("skipped: /var/tmp is a tmpfs here\n");
        skip();
    }
    at(prefix, dir, "srv");
    assert_int_equal(shmipc_config_new(&cfg), 0);
    assert_int_equal(shmipc_config_set_path_prefix(cfg, prefix), 0);
    at(q, dir, "q");
    at(b, dir, "b");
    make_files(q, b);
    struct ident iq = ident_of(q);
    expect_refused(q, b, SHMIPC_EACCES, "not on a tmpfs");
    assert_untouched(q, iq);
    shmipc_config_free(cfg);
    cfg = saved;
    rm_rf(dir);
}

/* A file that belongs to another uid than the peer's (root only: chown). */
static void v2_file_of_another_uid_is_refused(void **state)
{
    (void)state;
    char q[160], b[160];
    if (geteuid() != 0) {
        print_message("skipped: chown needs root\n");
        skip();
    }
    at(q, base, "q");
    at(b, base, "b");
    make_files(q, b);
    assert_int_equal(chown(b, 65534, 65534), 0);
    struct ident ib = ident_of(b);
    expect_refused(q, b, SHMIPC_EACCES, "belongs to uid 65534");
    assert_untouched(b, ib);
}

/* A second name for a file: it could be someone else's, and would outlive our removal. */
static void v2_hard_linked_file_is_refused(void **state)
{
    (void)state;
    char q[160], b[160], q2[160];
    at(q, base, "q");
    at(b, base, "b");
    at(q2, base, "q2");
    make_files(q, b);
    assert_int_equal(link(q, q2), 0);
    struct ident iq = ident_of(q);
    expect_refused(q2, b, SHMIPC_EACCES, "2 links");
    assert_untouched(q, iq);
    assert_untouched(q2, iq);
}

/* Files too small for what they must hold: refused when mapped or laid out, left in place. */
static void v2_too_small_files_are_refused(void **state)
{
    (void)state;
    char q[160], b[160];
    at(q, base, "q");
    at(b, base, "b");
    make_files(q, b);
    assert_int_equal(truncate(q, 8), 0);
    struct ident iq = ident_of(q), ib = ident_of(b);
    expect_refused(q, b, SHMIPC_EPROTO, "queue");
    assert_int_equal(truncate(q, 0), 0);
    iq = ident_of(q);
    expect_refused(q, b, SHMIPC_EINVAL, "size 0");
    assert_untouched(q, iq);
    assert_int_equal(unlink(q), 0);
    assert_int_equal(unlink(b), 0);
    make_files(q, b);
    assert_int_equal(truncate(b, 4), 0);
    iq = ident_of(q);
    ib = ident_of(b);
    expect_refused(q, b, SHMIPC_EPROTO, "buffer");
    assert_untouched(q, iq);
    assert_untouched(b, ib);
}

/*
 * The client swaps its file for another (or for a symlink, or swaps a directory) after the
 * handshake: the server removes only the file it mapped, so the replacement stays.
 */
static void v2_swap_between_handshake_and_unlink_spares_the_replacement(void **state)
{
    (void)state;
    char q[160], b[160], moved[160], victim[160], sub[160], subq[160], subb[160], subold[160];
    shmipc_session *s;
    at(q, base, "q");
    at(b, base, "b");
    at(moved, base, "q.moved");
    at(victim, base, "victim");
    make_files(q, b);
    assert_int_equal(serve(q, b, &s), 0);
    /* A new file under the mapped name. */
    assert_int_equal(rename(q, moved), 0);
    int fd = open(q, O_CREAT | O_EXCL | O_WRONLY, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "victim", 6), 6);
    close(fd);
    /* A symlink to another file under the other name. */
    fd = open(victim, O_CREAT | O_EXCL | O_WRONLY, 0600);
    assert_true(fd >= 0);
    close(fd);
    char bmoved[160];
    at(bmoved, base, "b.moved");
    assert_int_equal(rename(b, bmoved), 0);
    assert_int_equal(symlink(victim, b), 0);
    struct ident iq = ident_of(q), ib = ident_of(b), iv = ident_of(victim);
    shmipc_session_close(s);
    assert_untouched(q, iq);
    assert_untouched(b, ib);
    assert_untouched(victim, iv);
    assert_int_equal(access(moved, F_OK), 0); /* mapped, but by another name now: left */

    /* The same with a directory component swapped. */
    at(sub, base, "sub");
    at(subold, base, "sub.old");
    assert_int_equal(mkdir(sub, 0700), 0);
    at(subq, sub, "q");
    at(subb, sub, "b");
    make_files(subq, subb);
    assert_int_equal(serve(subq, subb, &s), 0);
    assert_int_equal(rename(sub, subold), 0);
    assert_int_equal(mkdir(sub, 0700), 0);
    make_files(subq, subb);
    iq = ident_of(subq);
    ib = ident_of(subb);
    shmipc_session_close(s);
    assert_untouched(subq, iq);
    assert_untouched(subb, ib);
}

/*
 * A TCP peer has no uid, so the only owner its files could be checked against is ours: without
 * the refusal, anyone reaching the port could make us map, then remove, any single-link tmpfs
 * file of our own user (a V2 client's files elsewhere in this process, say). Path memory over
 * TCP is refused unless SHMIPC_TCP_PATH_MEMORY=1 asks for it, and the files are left alone.
 */
static void v2_path_over_tcp_is_refused_without_the_knob(void **state)
{
    (void)state;
    char q[160], b[160];
    at(q, base, "q");
    at(b, base, "b");
    make_files(q, b);
    struct ident iq = ident_of(q), ib = ident_of(b);
    struct ipc_held before = ipc_held_now();
    shmipc_session *s = NULL;
    unsetenv("SHMIPC_TCP_PATH_MEMORY");
    int rc = serve_tcp(q, b, &s);
    if (rc == 0)
        shmipc_session_close(s);
    assert_int_equal(rc, SHMIPC_EACCES);
    assert_non_null(strstr(shmipc_error_detail(), "SHMIPC_TCP_PATH_MEMORY"));
    ipc_assert_held(&before);
    assert_untouched(q, iq);
    assert_untouched(b, ib);
    /* Any value but 1 is no opt-in. */
    setenv("SHMIPC_TCP_PATH_MEMORY", "0", 1);
    assert_int_equal(serve_tcp(q, b, &s), SHMIPC_EACCES);
    assert_untouched(q, iq);
    assert_untouched(b, ib);
    /* With the opt-in the old behaviour: mapped, and removed at close as a V2 server does. */
    setenv("SHMIPC_TCP_PATH_MEMORY", "1", 1);
    rc = serve_tcp(q, b, &s);
    unsetenv("SHMIPC_TCP_PATH_MEMORY");
    assert_int_equal(rc, 0);
    shmipc_session_close(s);
    assert_int_equal(access(q, F_OK), -1);
    assert_int_equal(access(b, F_OK), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(v2_identity_sees_a_replaced_or_written_file, teardown),
        cmocka_unit_test_teardown(v2_files_beneath_the_directory_are_mapped_and_removed, teardown),
        cmocka_unit_test_teardown(v2_path_over_tcp_is_refused_without_the_knob, teardown),
        cmocka_unit_test_teardown(v2_directory_of_the_prefix_may_be_a_symlink, teardown),
        cmocka_unit_test_teardown(v2_symlinked_directory_component_is_refused, teardown),
        cmocka_unit_test_teardown(v2_symlinked_last_component_is_refused, teardown),
        cmocka_unit_test_teardown(v2_dotdot_and_paths_outside_are_refused, teardown),
        cmocka_unit_test_teardown(v2_non_regular_files_are_refused, teardown),
        cmocka_unit_test_teardown(v2_file_not_on_tmpfs_is_refused, teardown),
        cmocka_unit_test_teardown(v2_file_of_another_uid_is_refused, teardown),
        cmocka_unit_test_teardown(v2_hard_linked_file_is_refused, teardown),
        cmocka_unit_test_teardown(v2_too_small_files_are_refused, teardown),
        cmocka_unit_test_teardown(v2_swap_between_handshake_and_unlink_spares_the_replacement,
                                  teardown),
    };
    return cmocka_run_group_tests(tests, setup, teardown_last);
}
