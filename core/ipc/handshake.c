/*
 * The V2 and V3 handshakes of the reference (§1.3-§1.5), in both roles. The client creates
 * the shared memory and tells the server where it is; the server only maps what it is told.
 */
#include "ipc/session.h"

#include "common/error.h"
#include "common/log.h"
#include "ipc/proto.h"
#include "ipc/sockio.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#define SUPPORTED_VERSION 3

static atomic_uint session_counter;

static int send_simple(shmipc_session *s, uint8_t version, uint8_t type, uint64_t deadline)
{
    uint8_t msg[SHMIPC__HEADER_SIZE];
    shmipc__encode_simple(msg, version, type);
    return shmipc__write_full(s->fd, msg, sizeof msg, deadline);
}

/* Reads one handshake header and checks it is of type `want` (any type when want < 0). */
static int read_header(shmipc_session *s, int want, struct shmipc__header *h, uint64_t deadline)
{
    uint8_t raw[SHMIPC__HEADER_SIZE];
    int rc = shmipc__read_full(s->fd, raw, sizeof raw, deadline);
    if (rc < 0)
        return rc;
    shmipc__header_decode(raw, h);
    if ((rc = shmipc__header_check(h, 0)) < 0)
        return rc;
    if (want >= 0 && h->type != want)
        return shmipc__fail(SHMIPC_EPROTO, "handshake: expected %s, got %s",
                            shmipc__msg_type_name((unsigned)want), shmipc__msg_type_name(h->type));
    return 0;
}

/* Names unique to this process and session: a Go server keys its mappings by buffer path. */
static int make_names(shmipc_session *s)
{
    unsigned k = atomic_fetch_add(&session_counter, 1);
    long pid = (long)getpid();
    int a = snprintf(s->buffer_path, sizeof s->buffer_path, "%s_%ld_%u_buffer", s->cfg.path_prefix,
                     pid, k);
    int b = snprintf(s->queue_path, sizeof s->queue_path, "%s_%ld_%u_queue_0", s->cfg.path_prefix,
                     pid, k);
    if (a < 0 || b < 0 || (size_t)a >= sizeof s->buffer_path || (size_t)b >= sizeof s->queue_path)
        return shmipc__fail(SHMIPC_ENAMETOOLONG, "path_prefix: shared-memory names too long");
    return 0;
}

static int create_memory(shmipc_session *s)
{
    int rc;
    uint64_t qsize = shmipc__queue_pair_size(s->cfg.queue_capacity);
    if ((rc = make_names(s)) < 0)
        return rc;
    if (s->cfg.memmap_type == SHMIPC_MEMMAP_MEMFD) {
        if ((rc = shmipc__mapping_create_memfd(&s->buffer_map, s->buffer_path,
                                               s->cfg.buffer_capacity)) < 0 ||
            (rc = shmipc__mapping_create_memfd(&s->queue_map, s->queue_path, qsize)) < 0)
            return rc;
    } else {
        s->unlink_files = 1;
        if ((rc = shmipc__mapping_create_file(&s->buffer_map, s->buffer_path,
                                              s->cfg.buffer_capacity)) < 0 ||
            (rc = shmipc__mapping_create_file(&s->queue_map, s->queue_path, qsize)) < 0)
            return rc;
    }
    if ((rc = shmipc__buffer_format(&s->bm, s->buffer_map.base, s->buffer_map.size, s->cfg.classes,
                                    s->cfg.nclasses)) < 0)
        return rc;
    return shmipc__queue_pair_format(&s->qp, s->queue_map.base, s->queue_map.size,
                                     s->cfg.queue_capacity, SHMIPC__QUEUE_LEGACY);
}

static int send_share_memory(shmipc_session *s, uint8_t type, uint64_t deadline)
{
    uint8_t msg[SHMIPC__HEADER_SIZE + 4 + 2 * SHMIPC__SHM_NAME_MAX];
    size_t n = shmipc__encode_share_memory(msg, sizeof msg, s->version, type, s->queue_path,
                                           s->buffer_path);
    if (n == 0)
        return shmipc__fail(SHMIPC_ENAMETOOLONG, "handshake: shared-memory names too long");
    return shmipc__write_full(s->fd, msg, n, deadline);
}

int shmipc__handshake_client(shmipc_session *s, uint64_t deadline)
{
    struct shmipc__header h;
    int rc;
    if ((rc = create_memory(s)) < 0)
        return rc;
    if (s->cfg.memmap_type == SHMIPC_MEMMAP_DEVSHM) {
        /* V2: one message and no reply; the server opens the files by path. */
        s->version = 2;
        return send_share_memory(s, SHMIPC__MSG_SHARE_MEMORY_BY_PATH, deadline);
    }
    if ((rc = send_simple(s, SUPPORTED_VERSION, SHMIPC__MSG_EXCHANGE_VERSION, deadline)) < 0 ||
        (rc = read_header(s, SHMIPC__MSG_EXCHANGE_VERSION, &h, deadline)) < 0)
        return rc;
    if (h.version < 3)
        return shmipc__fail(SHMIPC_EVERSION,
                            "handshake: the server speaks version %u, and memfd needs 3; use "
                            "memmap devshm (V2) with this server",
                            h.version);
    s->version = SUPPORTED_VERSION;
    if ((rc = send_share_memory(s, SHMIPC__MSG_SHARE_MEMORY_BY_MEMFD, deadline)) < 0 ||
        (rc = read_header(s, SHMIPC__MSG_ACK_READY_RECV_FD, &h, deadline)) < 0)
        return rc;
    int fds[2] = {s->buffer_map.fd, s->queue_map.fd};
    if ((rc = shmipc__send_fds(s->fd, fds, 2, deadline)) < 0)
        return rc;
    return read_header(s, SHMIPC__MSG_ACK_SHARE_MEMORY, &h, deadline);
}

/* Reads the body of a ShareMemory message into `body` and parses it. */
static int read_share_body(shmipc_session *s, const struct shmipc__header *h, uint8_t *buf,
                           size_t cap, struct shmipc__msg *msg, uint64_t deadline)
{
    if (h->length > cap)
        return shmipc__fail(SHMIPC_EPROTO, "handshake: %s of %u bytes is too long",
                            shmipc__msg_type_name(h->type), h->length);
    shmipc__header_encode(buf, h->length, h->version, h->type);
    int rc = shmipc__read_full(s->fd, buf + SHMIPC__HEADER_SIZE, h->length - SHMIPC__HEADER_SIZE,
                               deadline);
    if (rc < 0)
        return rc;
    rc = shmipc__msg_parse(buf, h->length, msg, 0);
    return rc < 0 ? rc : 0;
}

static void copy_path(char *dst, const uint8_t *src, uint16_t len)
{
    memcpy(dst, src, len);
    dst[len] = '\0';
}

/*
 * A V2 client names files for the server to open read-write and later remove. Accept only
 * regular files on a tmpfs that the peer owns (when the socket tells us who the peer is), so
 * a local client cannot make the server map or delete anyone else's files.
 */
static int check_peer_file(shmipc_session *s, const char *path)
{
    struct stat st;
    struct statfs fs;
    if (lstat(path, &st) < 0)
        return shmipc__fail_errno(errno, "handshake: shared-memory file %s", path);
    if (!S_ISREG(st.st_mode))
        return shmipc__fail(SHMIPC_EACCES, "handshake: %s is not a regular file", path);
    if (statfs(path, &fs) < 0 || fs.f_type != TMPFS_MAGIC)
        return shmipc__fail(SHMIPC_EACCES, "handshake: %s is not on a tmpfs such as /dev/shm",
                            path);
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(s->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.pid != 0 &&
        cred.uid != st.st_uid)
        return shmipc__fail(SHMIPC_EACCES, "handshake: %s belongs to uid %u, the peer is uid %u",
                            path, (unsigned)st.st_uid, (unsigned)cred.uid);
    return 0;
}

static int map_by_path(shmipc_session *s, const struct shmipc__msg *msg)
{
    int rc;
    copy_path(s->queue_path, msg->u.share.queue_path, msg->u.share.queue_len);
    copy_path(s->buffer_path, msg->u.share.buffer_path, msg->u.share.buffer_len);
    if ((rc = check_peer_file(s, s->queue_path)) < 0 ||
        (rc = check_peer_file(s, s->buffer_path)) < 0)
        return rc;
    if ((rc = shmipc__mapping_open_file(&s->queue_map, s->queue_path)) < 0 ||
        (rc = shmipc__mapping_open_file(&s->buffer_map, s->buffer_path)) < 0)
        return rc;
    /* As the reference does, the server removes the client's files when it unmaps them. */
    s->unlink_files = 1;
    return 0;
}

static int attach_memory(shmipc_session *s)
{
    int rc = shmipc__queue_pair_attach(&s->qp, s->queue_map.base, s->queue_map.size,
                                       SHMIPC__QUEUE_LEGACY, SHMIPC__QUEUE_SERVER);
    if (rc < 0)
        return rc;
    return shmipc__buffer_attach(&s->bm, s->buffer_map.base, s->buffer_map.size);
}

int shmipc__handshake_server(shmipc_session *s, uint64_t deadline)
{
    uint8_t body[SHMIPC__HEADER_SIZE + 4 + 2 * SHMIPC__MAX_SHM_PATH];
    struct shmipc__header h;
    struct shmipc__msg msg;
    int rc;
    if ((rc = read_header(s, -1, &h, deadline)) < 0)
        return rc;
    if (h.version == 2) {
        if (h.type != SHMIPC__MSG_SHARE_MEMORY_BY_PATH)
            return shmipc__fail(SHMIPC_EPROTO, "handshake: V2 must start with %s, not %s",
                                shmipc__msg_type_name(0), shmipc__msg_type_name(h.type));
        s->version = 2;
        if ((rc = read_share_body(s, &h, body, sizeof body, &msg, deadline)) < 0 ||
            (rc = map_by_path(s, &msg)) < 0)
            return rc;
        return attach_memory(s);
    }
    if (h.version < 3 || h.type != SHMIPC__MSG_EXCHANGE_VERSION)
        return shmipc__fail(SHMIPC_EVERSION,
                            "handshake: version %u starting with %s is not a protocol we speak",
                            h.version, shmipc__msg_type_name(h.type));
    s->version = h.version < SUPPORTED_VERSION ? h.version : SUPPORTED_VERSION;
    if ((rc = send_simple(s, SUPPORTED_VERSION, SHMIPC__MSG_EXCHANGE_VERSION, deadline)) < 0 ||
        (rc = read_header(s, -1, &h, deadline)) < 0 ||
        (rc = read_share_body(s, &h, body, sizeof body, &msg, deadline)) < 0)
        return rc;
    if (h.type == SHMIPC__MSG_SHARE_MEMORY_BY_PATH) {
        if ((rc = map_by_path(s, &msg)) < 0)
            return rc;
    } else if (h.type == SHMIPC__MSG_SHARE_MEMORY_BY_MEMFD) {
        int fds[2];
        copy_path(s->queue_path, msg.u.share.queue_path, msg.u.share.queue_len);
        copy_path(s->buffer_path, msg.u.share.buffer_path, msg.u.share.buffer_len);
        if ((rc = send_simple(s, s->version, SHMIPC__MSG_ACK_READY_RECV_FD, deadline)) < 0 ||
            (rc = shmipc__recv_fds(s->fd, fds, 2, deadline)) < 0)
            return rc;
        /* fds[0] is the buffer, fds[1] the queue (reference §1.5). */
        if ((rc = shmipc__mapping_map_fd(&s->buffer_map, fds[0], s->buffer_path)) < 0) {
            close(fds[0]);
            close(fds[1]);
            return rc;
        }
        if ((rc = shmipc__mapping_map_fd(&s->queue_map, fds[1], s->queue_path)) < 0) {
            close(fds[1]);
            return rc;
        }
    } else {
        return shmipc__fail(SHMIPC_EPROTO, "handshake: expected a ShareMemory message, got %s",
                            shmipc__msg_type_name(h.type));
    }
    if ((rc = attach_memory(s)) < 0)
        return rc;
    return send_simple(s, s->version, SHMIPC__MSG_ACK_SHARE_MEMORY, deadline);
}
