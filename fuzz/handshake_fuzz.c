/*
 * Fuzz target: the V2, V3 and V4 handshakes (core/ipc/handshake.c, with the V4 negotiation
 * of core/ipc/v4.c), in both roles, against a peer whose every byte is the input.
 *
 * Input: byte 0 is the mode:
 *   bit 0     the role we play: 0 server (shmipc__session_accept_fd), 1 client (memfd);
 *   bit 1     V4: the server accepts V4 clients, the client asks for V4;
 *   bits 2-3  the client's V4 wakeup: 1 eventfd, 2 polling, else the socket;
 *   bit 4     the peer passes fds (SCM_RIGHTS) at the offset in bytes 1-2;
 *   bits 5-6  which: 0 a legacy buffer and queue, 1 a sealed V4 pair, 2 a sealed 1-byte
 *             memfd, 3 pipes;
 *   bit 7     four fds (the two more are eventfds) instead of two.
 * The rest is what the peer sends on the socket; then the peer stops writing, so a
 * handshake waiting for more sees the end of the stream at once rather than its deadline.
 * The oracle, beyond the sanitizers and leak checks: a handshake ends (success or a clear
 * error) and leaves no fd open: the fds open after an input (listed from /proc/self/fd) are
 * exactly those open before it, taken after the harness's own setup and before its
 * socketpair, so a received fd the handshake kept, or one of the harness's fds it closed,
 * aborts with the fd and what it was.
 *
 * A V2 client names files for the server to map and later remove. So that no input can
 * name a real file, the server role runs in a private mount namespace with its own tmpfs on
 * /dev/shm (and is skipped, with a note, where one cannot be made); /dev/shm/fz_b and
 * /dev/shm/fz_q there hold a proper buffer and queue for the seeds to name.
 */
#include "common/clock.h"
#include "ipc/session.h"
#include "shm/buffer.h"
#include "shm/mapping.h"
#include "shm/queue.h"

#include "shmipc.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define BUF_SIZE  4096u
#define QUEUE_CAP 16u

static int sandboxed = -1;
static int fds_legacy[2], fds_v4[2], fd_tiny, pipe_fds[2], efds[2];
static shmipc_config *cfgs[2][6]; /* [role][v4 + 2 * wakeup] */

/* The fds watched for leaks: a leaked fd takes the lowest free number, far below this. */
#define FD_WATCH 1024
struct fd_set_bits {
    uint8_t bit[FD_WATCH / 8];
};

/* The fds open now, from /proc/self/fd (or, without /proc, by fcntl over [0, FD_WATCH)). */
static void open_fds(struct fd_set_bits *set)
{
    memset(set, 0, sizeof *set);
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL) {
        for (int fd = 0; fd < FD_WATCH; fd++)
            if (fcntl(fd, F_GETFD) >= 0)
                set->bit[fd / 8] |= (uint8_t)(1u << (fd % 8));
        return;
    }
    int own = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        long fd = strtol(e->d_name, NULL, 10);
        if (fd != own && fd < FD_WATCH)
            set->bit[fd / 8] |= (uint8_t)(1u << (fd % 8));
    }
    closedir(d);
}

/* Aborts, naming each fd, when the fds open now are not those of `before`. */
static void check_fds(const struct fd_set_bits *before)
{
    struct fd_set_bits after;
    open_fds(&after);
    if (memcmp(before, &after, sizeof after) == 0)
        return;
    for (int fd = 0; fd < FD_WATCH; fd++) {
        int was = before->bit[fd / 8] >> (fd % 8) & 1, is = after.bit[fd / 8] >> (fd % 8) & 1;
        if (was == is)
            continue;
        char link[64], target[256] = "?";
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t k = is ? readlink(link, target, sizeof target - 1) : -1;
        if (k >= 0)
            target[k] = '\0';
        if (is)
            fprintf(stderr, "handshake fuzz: fd %d (%s) left open by the input\n", fd, target);
        else
            fprintf(stderr, "handshake fuzz: fd %d, open before the input, closed by it\n", fd);
    }
    abort();
}

static int write_id_map(const char *file, const char *text)
{
    int fd = open(file, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, text, strlen(text));
    close(fd);
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

/* A private /dev/shm: as root a new mount namespace, else inside a new user namespace. */
static int make_sandbox(void)
{
    if (unshare(CLONE_NEWNS) < 0) {
        char map[64];
        uid_t uid = getuid();
        gid_t gid = getgid();
        if (unshare(CLONE_NEWUSER | CLONE_NEWNS) < 0)
            return -1;
        snprintf(map, sizeof map, "%u %u 1", (unsigned)uid, (unsigned)uid);
        if (write_id_map("/proc/self/setgroups", "deny") < 0 ||
            write_id_map("/proc/self/uid_map", map) < 0)
            return -1;
        snprintf(map, sizeof map, "%u %u 1", (unsigned)gid, (unsigned)gid);
        if (write_id_map("/proc/self/gid_map", map) < 0)
            return -1;
    }
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
        mount("shmipc-fuzz", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=1777") < 0)
        return -1;
    return 0;
}

/* A buffer or a queue pair laid out as a client does, in `fd` (a memfd or a file). */
static void format_into(int fd, int queue, int layout)
{
    size_t size = queue ? (size_t)shmipc__queue_pair_size_for(QUEUE_CAP, layout) : BUF_SIZE;
    static const shmipc_slice_class classes[] = {{64, 50}, {256, 50}};
    if (ftruncate(fd, (off_t)size) < 0)
        abort();
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        abort();
    struct shmipc__buffer bm;
    struct shmipc__queue_pair qp;
    if (queue ? shmipc__queue_pair_format(&qp, p, size, QUEUE_CAP, layout) < 0
              : shmipc__buffer_format(&bm, p, size, classes, 2) < 0)
        abort();
    munmap(p, size);
}

static int new_memfd(int queue, int layout, int seal)
{
    int fd = memfd_create("shmipc-fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        abort();
    if (queue >= 0)
        format_into(fd, queue, layout);
    else if (ftruncate(fd, 1) < 0)
        abort();
    if (seal && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
        abort();
    return fd;
}

/* The files a V2 seed names, made again whenever a session has removed them. */
static void make_v2_files(void)
{
    static const char *const paths[2] = {"/dev/shm/fz_b", "/dev/shm/fz_q"};
    for (int i = 0; i < 2; i++) {
        if (access(paths[i], F_OK) == 0)
            continue;
        int fd = open(paths[i], O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0)
            abort();
        format_into(fd, i, SHMIPC__QUEUE_LEGACY);
        close(fd);
    }
}

static shmipc_config *make_config(int client, int v4, int wakeup)
{
    shmipc_config *c;
    if (shmipc_config_new(&c) < 0 || shmipc_config_set_buffer_capacity(c, 1u << 20) < 0 ||
        shmipc_config_set_queue_capacity(c, QUEUE_CAP) < 0 ||
        shmipc_config_parse_slice_classes(c, "65536:100") < 0 ||
        shmipc_config_set_timeout(c, SHMIPC_TIMEOUT_INITIALIZE, 2000) < 0)
        abort();
    unsigned all = SHMIPC_V4_FEATURE_EVENTFD | SHMIPC_V4_FEATURE_POLLING;
    if (!client && v4 && shmipc_config_set_server_v4(c, 1, all) < 0)
        abort();
    if (client && v4) {
        int rc = wakeup == 1   ? shmipc_config_with_v4_eventfd(c)
                 : wakeup == 2 ? shmipc_config_with_v4_event_queue_polling(c, 100)
                               : shmipc_config_with_v4(c);
        if (rc < 0 || shmipc_config_set_protocol(c, SHMIPC_PROTOCOL_V4, 0) < 0)
            abort();
    }
    return c;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    sandboxed = make_sandbox() == 0;
    if (!sandboxed)
        fprintf(stderr, "handshake fuzz: no private /dev/shm (no mount namespace); the server "
                        "role is skipped\n");
    fds_legacy[0] = new_memfd(0, SHMIPC__QUEUE_LEGACY, 0);
    fds_legacy[1] = new_memfd(1, SHMIPC__QUEUE_LEGACY, 0);
    fds_v4[0] = new_memfd(0, SHMIPC__QUEUE_V4, 1);
    fds_v4[1] = new_memfd(1, SHMIPC__QUEUE_V4, 1);
    fd_tiny = new_memfd(-1, 0, 1);
    efds[0] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    efds[1] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (pipe2(pipe_fds, O_CLOEXEC) < 0 || efds[0] < 0 || efds[1] < 0)
        abort();
    for (int role = 0; role < 2; role++)
        for (int v = 0; v < 6; v++)
            cfgs[role][v] = make_config(role, v & 1, v >> 1);
    return 0;
}

static void send_fds(int fd, uint8_t mode)
{
    int fds[4] = {fds_legacy[0], fds_legacy[1], efds[0], efds[1]};
    switch ((mode >> 5) & 3) {
    case 1:
        fds[0] = fds_v4[0];
        fds[1] = fds_v4[1];
        break;
    case 2:
        fds[0] = fds[1] = fd_tiny;
        break;
    case 3:
        fds[0] = pipe_fds[0];
        fds[1] = pipe_fds[1];
        break;
    default:
        break;
    }
    int n = mode & 0x80 ? 4 : 2;
    char byte = 0;
    struct iovec iov = {&byte, 1};
    union {
        char buf[CMSG_SPACE(sizeof(int) * 4)];
        struct cmsghdr align;
    } u;
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = u.buf,
                         .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)n);
    if (sendmsg(fd, &msg, MSG_NOSIGNAL) != 1)
        abort();
}

/* The client's half of a session, as session_alloc() sets it up, around the handshake. */
static void run_client(int fd, const shmipc_config *cfg)
{
    static shmipc_session s;
    memset(&s, 0, sizeof s);
    s.fd = fd;
    s.efd_send = s.efd_recv = s.event_fd = s.timer_fd = -1;
    s.wakeup = SHMIPC_WAKEUP_SOCKET;
    s.role = SHMIPC__CLIENT;
    s.cfg = *cfg;
    shmipc__mapping_init(&s.buffer_map);
    shmipc__mapping_init(&s.queue_map);
    (void)shmipc__handshake_client(&s, shmipc__deadline_ms(2000));
    shmipc__mapping_unmap(&s.buffer_map);
    shmipc__mapping_unmap(&s.queue_map);
    if (s.unlink_files) {
        shmipc__mapping_unlink(s.buffer_path);
        shmipc__mapping_unlink(s.queue_path);
    }
    if (s.efd_send >= 0)
        close(s.efd_send);
    if (s.efd_recv >= 0)
        close(s.efd_recv);
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3 || size > 65536)
        return 0;
    uint8_t mode = data[0];
    int client = mode & 1;
    size_t n = size - 3;
    size_t at = n ? ((size_t)data[1] << 8 | data[2]) % (n + 1) : 0;
    data += 3;
    if (sandboxed < 0)
        LLVMFuzzerInitialize(NULL, NULL);
    if (!client && !sandboxed)
        return 0;
    if (!client)
        make_v2_files();
    struct fd_set_bits before;
    open_fds(&before);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        abort();
    /* Everything the peer says goes in first: the socket buffer holds 64 KiB and more. */
    int pass = (mode & 0x10) && !client;
    size_t first = pass ? at : n;
    if ((first && write(sv[1], data, first) != (ssize_t)first))
        abort();
    if (pass) {
        send_fds(sv[1], mode);
        if (n > first && write(sv[1], data + first, n - first) != (ssize_t)(n - first))
            abort();
    }
    shutdown(sv[1], SHUT_WR);
    int v = (mode >> 1) & 1;
    if (client) {
        int wakeup = (mode >> 2) & 3;
        run_client(sv[0], cfgs[1][v + 2 * (wakeup == 3 ? 0 : wakeup)]);
    } else {
        shmipc_session *s;
        if (shmipc__session_accept_fd(sv[0], cfgs[0][v], &s) == 0)
            shmipc__session_close(s);
    }
    close(sv[1]);
    check_fds(&before);
    return 0;
}
