/*
 * The V2 and V3 handshakes of the reference (§1.3-§1.5), in both roles. The client creates
 * the shared memory and tells the server where it is; the server only maps what it is told.
 */
#include "ipc/session.h"

#include "common/env.h"
#include "common/error.h"
#include "common/version.h"
#include "common/log.h"
#include "ipc/proto.h"
#include "ipc/sockio.h"
#include "ipc/v4.h"
#include "common/clock.h"
#include "ipc/v4probe.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#define SUPPORTED_VERSION 3

static atomic_uint session_counter;

static int send_simple(shmipc_session *s, uint8_t version, uint8_t type, uint64_t deadline)
{
    uint8_t msg[SHMIPC__HEADER_SIZE];
    shmipc__encode_simple(msg, version, type);
    return shmipc__write_full(s->fd, msg, sizeof msg, deadline);
}

/*
 * Reads one handshake header and checks it is of type `want` (any type when want < 0). Version 0
 * (V4) passes only on a server that accepts V4; a legacy server refuses it, as Go does.
 */
static int read_header(shmipc_session *s, int want, struct shmipc__header *h, uint64_t deadline)
{
    uint8_t raw[SHMIPC__HEADER_SIZE];
    int rc = shmipc__read_full(s->fd, raw, sizeof raw, deadline);
    if (rc < 0)
        return rc;
    shmipc__header_decode(raw, h);
    if ((rc = shmipc__header_check(h, s->role == SHMIPC__SERVER && s->cfg.server_v4)) < 0)
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

static int queue_layout(const shmipc_session *s)
{
    return s->version == 4 ? SHMIPC__QUEUE_V4 : SHMIPC__QUEUE_LEGACY;
}

static int create_memory(shmipc_session *s)
{
    int rc;
    uint64_t qsize = shmipc__queue_pair_size_for(s->cfg.queue_capacity, queue_layout(s));
    if ((rc = make_names(s)) < 0)
        return rc;
    if (s->cfg.memmap_type == SHMIPC_MEMMAP_MEMFD) {
        if ((rc = shmipc__mapping_create_memfd(&s->buffer_map, s->buffer_path,
                                               s->cfg.buffer_capacity)) < 0 ||
            (rc = shmipc__mapping_create_memfd(&s->queue_map, s->queue_path, qsize)) < 0)
            return rc;
        /* V4 seals its memfds, so a server can map them without fearing a truncation. */
        if (s->version == 4 && ((rc = shmipc__mapping_seal_size(&s->buffer_map)) < 0 ||
                                (rc = shmipc__mapping_seal_size(&s->queue_map)) < 0))
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
                                     s->cfg.queue_capacity, queue_layout(s));
}

static int send_share_memory(shmipc_session *s, uint8_t type, uint64_t deadline)
{
    uint8_t msg[SHMIPC__HEADER_SIZE + 4 + 2 * SHMIPC__SHM_NAME_MAX];
    size_t n =
        shmipc__encode_share_memory(msg, sizeof msg, s->wire, type, s->queue_path, s->buffer_path);
    if (n == 0)
        return shmipc__fail(SHMIPC_ENAMETOOLONG, "handshake: shared-memory names too long");
    return shmipc__write_full(s->fd, msg, n, deadline);
}

static int handshake_client_legacy(shmipc_session *s, uint64_t deadline)
{
    struct shmipc__header h;
    int rc;
    if ((rc = create_memory(s)) < 0)
        return rc;
    if (s->cfg.memmap_type == SHMIPC_MEMMAP_DEVSHM) {
        /* V2: one message and no reply; the server opens the files by path. */
        s->version = s->wire = 2;
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
    s->version = s->wire = SUPPORTED_VERSION;
    if ((rc = send_share_memory(s, SHMIPC__MSG_SHARE_MEMORY_BY_MEMFD, deadline)) < 0 ||
        (rc = read_header(s, SHMIPC__MSG_ACK_READY_RECV_FD, &h, deadline)) < 0)
        return rc;
    int fds[2] = {s->buffer_map.fd, s->queue_map.fd};
    if ((rc = shmipc__send_fds(s->fd, fds, 2, deadline)) < 0)
        return rc;
    return read_header(s, SHMIPC__MSG_ACK_SHARE_MEMORY, &h, deadline);
}

/* Reads one V4 handshake message of type `want` (version byte 0) with its body into `buf`. */
static int read_v4_message(shmipc_session *s, int want, uint8_t *buf, size_t cap,
                           struct shmipc__msg *m, uint64_t deadline)
{
    struct shmipc__header h;
    uint8_t raw[SHMIPC__HEADER_SIZE];
    int rc = shmipc__read_full(s->fd, raw, sizeof raw, deadline);
    if (rc < 0)
        return rc;
    shmipc__header_decode(raw, &h);
    if ((rc = shmipc__header_check(&h, 1)) < 0)
        return rc;
    if (h.version != 0 || h.type != want)
        return shmipc__fail(SHMIPC_EPROTO,
                            "V4 handshake: expected %s with version 0, got %s "
                            "with version %u",
                            shmipc__msg_type_name((unsigned)want), shmipc__msg_type_name(h.type),
                            h.version);
    if (h.length > cap)
        return shmipc__fail(SHMIPC_EPROTO, "V4 handshake: %s of %u bytes is too long",
                            shmipc__msg_type_name(h.type), h.length);
    memcpy(buf, raw, sizeof raw);
    if ((rc = shmipc__read_full(s->fd, buf + sizeof raw, h.length - sizeof raw, deadline)) < 0)
        return rc;
    rc = shmipc__msg_parse(buf, h.length, m, 1);
    return rc < 0 ? rc : 0;
}

/*
 * Eventfd wakeups only with a peer that could stop us anyway: one of our uid, or root. The
 * eventfd's open file is shared with the peer, which can clear O_NONBLOCK on it and fill its
 * counter; our next wakeup write then blocks for good (docs/security.md), and no check before
 * the write closes that race. A peer of another uid gets socket wakeups (a TCP peer, whose
 * uid is unknown, cannot have eventfds anyway).
 */
/*
 * The uid SO_PEERCRED gives for a peer our user namespace does not map: the overflow uid
 * (/proc/sys/kernel/overflowuid, 65534 by default), which says nothing of who the peer is.
 * UINT32_MAX when no uid is munged, in the initial user namespace (uid_map "0 0 4294967295"),
 * where every uid maps: there 65534 is nobody.
 */
static uid_t unmapped_uid(void)
{
    unsigned inside, outside, count, overflow = 65534;
    char extra;
    FILE *f = fopen("/proc/self/uid_map", "re");
    int initial = f != NULL && fscanf(f, "%u %u %u %c", &inside, &outside, &count, &extra) == 3 &&
                  inside == 0 && outside == 0 && count == UINT32_MAX;
    if (f != NULL)
        fclose(f);
    if (initial)
        return (uid_t)-1;
    if ((f = fopen("/proc/sys/kernel/overflowuid", "re")) != NULL) {
        if (fscanf(f, "%u", &overflow) != 1)
            overflow = 65534;
        fclose(f);
    }
    return (uid_t)overflow;
}

static int eventfd_peer_trusted(const shmipc_session *s)
{
    struct ucred cred;
    socklen_t clen = sizeof cred;
    /*
     * The uid alone: a peer in a pid namespace we cannot see into (another container) has pid
     * 0 here, but its uid is right. A socket without credentials (TCP) gives uid -1, and a
     * uid our user namespace cannot map comes as the overflow uid: neither is ours or root.
     */
    if (getsockopt(s->fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0 || cred.uid == (uid_t)-1)
        return 0;
    if (cred.uid == 0)
        return 1;
    /*
     * In a user namespace, any peer it does not map shows as the overflow uid: not one of
     * ours, even when we are that uid (nobody, or unmapped ourselves).
     */
    uid_t unknown = unmapped_uid();
    if (cred.uid == geteuid() && cred.uid != unknown)
        return 1;
    SHMIPC__LOG(SHMIPC__LOG_INFO,
                "V4: no eventfd wakeups with the %s (pid %ld), of uid %u (ours %u): socket "
                "wakeups instead",
                s->role == SHMIPC__SERVER ? "client" : "server", (long)cred.pid, (unsigned)cred.uid,
                (unsigned)geteuid());
    return 0;
}

static int make_eventfds(int *a, int *b)
{
    *a = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    *b = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (*a < 0 || *b < 0)
        return shmipc__fail_errno(errno, "V4: eventfd");
    return 0;
}

/* The V4 client: negotiate, then hand the memory over as V3 does, with version byte 0. */
static int handshake_client_v4(shmipc_session *s, uint64_t deadline)
{
    uint8_t msg[1024];
    struct shmipc__v4_request req = {.wants_v4 = 1};
    struct shmipc__v4_response resp;
    struct shmipc__msg m;
    int rc;
    s->version = 4;
    s->wire = 0;
    strcpy(req.sdk_name, SHMIPC__V4_SDK_NAME);
    snprintf(req.sdk_version, sizeof req.sdk_version, "%s", shmipc__version_string());
    if (s->cfg.wakeup == SHMIPC_WAKEUP_POLLING) {
        req.features = SHMIPC_V4_FEATURE_POLLING;
        req.interval_us = s->cfg.polling_interval_us;
    } else if (s->cfg.wakeup == SHMIPC_WAKEUP_EVENTFD && eventfd_peer_trusted(s)) {
        req.features = SHMIPC_V4_FEATURE_EVENTFD;
    }
    if ((rc = shmipc__v4_encode_request(&req, msg, sizeof msg)) < 0 ||
        (rc = shmipc__write_full(s->fd, msg, (size_t)rc, deadline)) < 0)
        return rc;
    /* A peer's response may be as long as the protocol allows. */
    uint8_t *rbuf = malloc(SHMIPC__MAX_NEGOTIATION);
    if (rbuf == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "V4: out of memory");
    /*
     * A legacy Go server gives no signal on a V4 hello (it neither answers nor closes), and a
     * V4 server answers before any shared memory work: with fallback on, wait only the probe
     * time for the response (docs/interop.md).
     */
    uint64_t probe = deadline;
    if (s->cfg.fallback) {
        uint64_t p = shmipc__deadline_ms(shmipc__v4_probe_ms());
        if (deadline == 0 || p < deadline)
            probe = p;
    }
    rc = read_v4_message(s, SHMIPC__MSG_NEGOTIATION, rbuf, SHMIPC__MAX_NEGOTIATION, &m, probe);
    if (rc == 0)
        rc = shmipc__v4_parse_response(m.u.negotiation.json, m.u.negotiation.len, &resp);
    free(rbuf);
    if (rc < 0)
        return rc;
    if (resp.error_code[0] != '\0' || resp.protocol != 4)
        return shmipc__fail(SHMIPC_EREJECTED, "V4: the server refused: %s: %s",
                            resp.error_code[0] ? resp.error_code : "selected_protocol",
                            resp.error_message[0] ? resp.error_message : "not 4");
    if ((resp.features & ~req.features) != 0 ||
        resp.features == (SHMIPC_V4_FEATURE_POLLING | SHMIPC_V4_FEATURE_EVENTFD))
        return shmipc__fail(SHMIPC_EPROTO, "V4: the server selected features %#x, asked %#x",
                            resp.features, req.features);
    if (resp.features & SHMIPC_V4_FEATURE_POLLING) {
        if (resp.interval_us < SHMIPC_MIN_POLLING_INTERVAL_US ||
            resp.interval_us > SHMIPC_MAX_POLLING_INTERVAL_US)
            return shmipc__fail(SHMIPC_EPROTO, "V4: negotiated polling interval %u us",
                                resp.interval_us);
        s->wakeup = SHMIPC_WAKEUP_POLLING;
        s->interval_us = resp.interval_us;
    } else if (resp.features & SHMIPC_V4_FEATURE_EVENTFD) {
        s->wakeup = SHMIPC_WAKEUP_EVENTFD;
    }
    if ((rc = create_memory(s)) < 0)
        return rc;
    if (s->cfg.memmap_type == SHMIPC_MEMMAP_DEVSHM) {
        if ((rc = send_share_memory(s, SHMIPC__MSG_SHARE_MEMORY_BY_PATH, deadline)) < 0)
            return rc;
    } else {
        /* [buffer, queue, our send eventfd, our receive eventfd] in one message. */
        int fds[4] = {s->buffer_map.fd, s->queue_map.fd, -1, -1};
        int nfds = 2;
        if (s->wakeup == SHMIPC_WAKEUP_EVENTFD) {
            if ((rc = make_eventfds(&s->efd_send, &s->efd_recv)) < 0)
                return rc;
            fds[2] = s->efd_send;
            fds[3] = s->efd_recv;
            nfds = 4;
        }
        if ((rc = send_share_memory(s, SHMIPC__MSG_SHARE_MEMORY_BY_MEMFD, deadline)) < 0 ||
            (rc = read_v4_message(s, SHMIPC__MSG_ACK_READY_RECV_FD, msg, sizeof msg, &m,
                                  deadline)) < 0 ||
            (rc = shmipc__send_fds(s->fd, fds, nfds, deadline)) < 0)
            return rc;
    }
    return read_v4_message(s, SHMIPC__MSG_ACK_SHARE_MEMORY, msg, sizeof msg, &m, deadline);
}

/*
 * The peer-uid allow-list (shmipc_config_set_peer_uids). The kernel recorded the peer's
 * credentials when it called connect() (a client) or listen() (a server), so a peer cannot
 * forge them, and passing the socket to another process does not change them.
 */
static int check_peer_uid(const shmipc_session *s)
{
    const char *peer = s->role == SHMIPC__SERVER ? "client" : "server";
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    struct ucred cred;
    socklen_t clen = sizeof cred;
    if (s->cfg.npeer_uids == 0)
        return 0;
    if (getsockname(s->fd, (struct sockaddr *)&ss, &len) < 0 || ss.ss_family != AF_UNIX)
        return shmipc__fail(SHMIPC_EACCES,
                            "peer_uids: the %s is on a TCP socket, which carries no uid to check",
                            peer);
    if (getsockopt(s->fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0 || cred.pid == 0)
        return shmipc__fail(SHMIPC_EACCES, "peer_uids: the kernel does not say who the %s is",
                            peer);
    for (uint32_t i = 0; i < s->cfg.npeer_uids; i++)
        if (s->cfg.peer_uids[i] == (uint32_t)cred.uid)
            return 0;
    return shmipc__fail(SHMIPC_EACCES,
                        "peer_uids: the %s (pid %ld) is uid %u, which is not in the allow-list "
                        "of %u uids (first %u)",
                        peer, (long)cred.pid, (unsigned)cred.uid, s->cfg.npeer_uids,
                        s->cfg.peer_uids[0]);
}

int shmipc__handshake_client(shmipc_session *s, uint64_t deadline)
{
    int rc = check_peer_uid(s);
    if (rc < 0)
        return rc;
    if (s->cfg.protocol == SHMIPC_PROTOCOL_V4)
        return handshake_client_v4(s, deadline);
    return handshake_client_legacy(s, deadline);
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
    rc = shmipc__msg_parse(buf, h->length, msg, s->version == 4);
    return rc < 0 ? rc : 0;
}

static void copy_path(char *dst, const uint8_t *src, uint16_t len)
{
    memcpy(dst, src, len);
    dst[len] = '\0';
}

/*
 * A V2 client names files for the server to open read-write and later remove. They must lie
 * beneath the directory of our path prefix (normally /dev/shm), reached without following a
 * symlink, and be regular files with one link on a tmpfs, owned by the peer: its uid from
 * SO_PEERCRED on a unix socket. A TCP peer has none and is refused unless
 * SHMIPC_TCP_PATH_MEMORY=1; then the owner is our own uid, since a file of ours is the only
 * kind a peer we cannot identify may name. See shmipc__mapping_open_beneath.
 */
static int map_by_path(shmipc_session *s, const struct shmipc__msg *msg)
{
    char dir[SHMIPC__SHM_NAME_MAX];
    struct ucred cred;
    socklen_t len = sizeof cred;
    uint32_t owner = (uint32_t)geteuid();
    int rc;
    struct sockaddr_storage ss;
    socklen_t slen = sizeof ss;
    const char *knob = shmipc__getenv("SHMIPC_TCP_PATH_MEMORY");
    /*
     * A peer on a TCP socket has no credentials and may be on another host, where shared
     * memory cannot work anyway: the owner its files would be checked against is ours, so it
     * could make us map and later remove any single-link tmpfs file of our user. Refused
     * unless the operator opts in; nothing is opened before this check.
     */
    if ((getsockname(s->fd, (struct sockaddr *)&ss, &slen) != 0 || ss.ss_family != AF_UNIX) &&
        (knob == NULL || strcmp(knob, "1") != 0))
        return shmipc__fail(SHMIPC_EACCES,
                            "handshake: the peer names /dev/shm files over a socket that is not a "
                            "unix socket; it has no uid to check them against (use a unix socket, "
                            "or SHMIPC_TCP_PATH_MEMORY=1 to allow it)");
    copy_path(s->queue_path, msg->u.share.queue_path, msg->u.share.queue_len);
    copy_path(s->buffer_path, msg->u.share.buffer_path, msg->u.share.buffer_len);
    if (getsockopt(s->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.pid != 0)
        owner = (uint32_t)cred.uid;
    if ((rc = shmipc__shm_dir_of(s->cfg.path_prefix, dir, sizeof dir)) < 0 ||
        (rc = shmipc__mapping_open_beneath(&s->queue_map, dir, s->queue_path, owner)) < 0 ||
        (rc = shmipc__mapping_open_beneath(&s->buffer_map, dir, s->buffer_path, owner)) < 0) {
        char why[256];
        snprintf(why, sizeof why, "%s", shmipc__detail());
        return shmipc__fail(rc, "handshake: %s", why);
    }
    /* As the reference does, the server removes the client's files when it unmaps them. */
    s->unlink_files = 1;
    return 0;
}

static int attach_memory(shmipc_session *s)
{
    int rc = shmipc__queue_pair_attach(&s->qp, s->queue_map.base, s->queue_map.size,
                                       queue_layout(s), SHMIPC__QUEUE_SERVER);
    if (rc == 0)
        rc = shmipc__buffer_attach(&s->bm, s->buffer_map.base, s->buffer_map.size);
    /*
     * A file that shrank while we read its layout raised SIGBUS; the guard gave us zeros,
     * which usually fail the checks above with a less helpful message.
     */
    if (shmipc__session_memory_damaged(s))
        rc = shmipc__fail(SHMIPC_EPROTO, "handshake: the peer's shared memory shrank under the "
                                         "mapping (SIGBUS caught)");
    /* Memory we refused was never served: its files stay the peer's to remove. */
    if (rc < 0)
        s->unlink_files = 0;
    return rc;
}

/* V4 memfds must be sealed against shrinking and growing: then no page can vanish under us. */
static int check_seals(int fd, const char *what)
{
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
        return shmipc__fail(SHMIPC_EACCES,
                            "V4 handshake: the %s memfd is not sealed against shrinking and "
                            "growing",
                            what);
    return 0;
}

/* True when `fd` is an eventfd: a peer must not make us read or write other kinds of file. */
static int is_eventfd(int fd)
{
    char path[64], target[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n < 0)
        return 0;
    target[n] = '\0';
    return strcmp(target, "anon_inode:[eventfd]") == 0;
}

/*
 * Receives the memfds (and, for eventfd wakeups, the client's two eventfds: its send is our
 * receive and the other way round) and maps them. Every received fd is owned or closed.
 */
static int receive_memfds(shmipc_session *s, const struct shmipc__msg *msg, uint64_t deadline)
{
    int fds[4] = {-1, -1, -1, -1}, rc;
    int n = s->wakeup == SHMIPC_WAKEUP_EVENTFD ? 4 : 2;
    copy_path(s->queue_path, msg->u.share.queue_path, msg->u.share.queue_len);
    copy_path(s->buffer_path, msg->u.share.buffer_path, msg->u.share.buffer_len);
    if ((rc = send_simple(s, s->wire, SHMIPC__MSG_ACK_READY_RECV_FD, deadline)) < 0 ||
        (rc = shmipc__recv_fds(s->fd, fds, n, deadline)) < 0)
        return rc;
    if (s->version == 4 &&
        ((rc = check_seals(fds[0], "buffer")) < 0 || (rc = check_seals(fds[1], "queue")) < 0))
        goto err;
    if (n == 4) {
        if (!is_eventfd(fds[2]) || !is_eventfd(fds[3])) {
            rc = shmipc__fail(SHMIPC_EPROTO, "V4 handshake: the wakeup fds are not eventfds");
            goto err;
        }
        s->efd_recv = fds[2];
        s->efd_send = fds[3];
        fds[2] = fds[3] = -1;
    }
    /* fds[0] is the buffer, fds[1] the queue (reference §1.5). */
    if ((rc = shmipc__mapping_map_fd(&s->buffer_map, fds[0], s->buffer_path)) < 0)
        goto err;
    fds[0] = -1;
    if ((rc = shmipc__mapping_map_fd(&s->queue_map, fds[1], s->queue_path)) < 0)
        goto err;
    return 0;
err:
    for (int i = 0; i < 4; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    return rc;
}

/* After the version exchange or the negotiation: the memory hand-over and the ack. */
static int server_share_memory(shmipc_session *s, uint64_t deadline)
{
    uint8_t body[SHMIPC__HEADER_SIZE + 4 + 2 * SHMIPC__MAX_SHM_PATH];
    struct shmipc__header h;
    struct shmipc__msg msg;
    int rc;
    if ((rc = read_header(s, -1, &h, deadline)) < 0)
        return rc;
    if (h.version != s->wire && s->version == 4)
        return shmipc__fail(SHMIPC_EPROTO, "V4 handshake: %s with version %u, not 0",
                            shmipc__msg_type_name(h.type), h.version);
    if ((rc = read_share_body(s, &h, body, sizeof body, &msg, deadline)) < 0)
        return rc;
    if (h.type == SHMIPC__MSG_SHARE_MEMORY_BY_PATH) {
        if (s->wakeup == SHMIPC_WAKEUP_EVENTFD)
            return shmipc__fail(SHMIPC_EPROTO, "V4 handshake: eventfd wakeups need memfd");
        rc = map_by_path(s, &msg);
    } else if (h.type == SHMIPC__MSG_SHARE_MEMORY_BY_MEMFD) {
        rc = receive_memfds(s, &msg, deadline);
    } else {
        rc = shmipc__fail(SHMIPC_EPROTO, "handshake: expected a ShareMemory message, got %s",
                          shmipc__msg_type_name(h.type));
    }
    if (rc < 0 || (rc = attach_memory(s)) < 0)
        return rc;
    return send_simple(s, s->wire, SHMIPC__MSG_ACK_SHARE_MEMORY, deadline);
}

/* The V4 server: read the request, answer it, refuse explicitly what it cannot serve. */
static int server_negotiate(shmipc_session *s, const struct shmipc__header *h, uint64_t deadline)
{
    struct shmipc__v4_request req = {0};
    struct shmipc__v4_response resp;
    struct shmipc__msg m;
    uint8_t out[1024];
    int rc;
    if (h->type != SHMIPC__MSG_NEGOTIATION)
        return shmipc__fail(SHMIPC_EPROTO, "V4 handshake: expected Negotiation, got %s",
                            shmipc__msg_type_name(h->type));
    uint8_t *buf = malloc(h->length);
    if (buf == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "V4: out of memory");
    shmipc__header_encode(buf, h->length, h->version, h->type);
    rc = shmipc__read_full(s->fd, buf + SHMIPC__HEADER_SIZE, h->length - SHMIPC__HEADER_SIZE,
                           deadline);
    if (rc == 0 && (rc = shmipc__msg_parse(buf, h->length, &m, 1)) > 0)
        rc = shmipc__v4_parse_request(m.u.negotiation.json, m.u.negotiation.len, &req);
    free(buf);
    if (rc == SHMIPC_EPROTO) {
        memset(&resp, 0, sizeof resp);
        strcpy(resp.error_code, "JSON_PARSE_ERROR");
        snprintf(resp.error_message, sizeof resp.error_message, "%s", shmipc__detail());
    } else if (rc < 0) {
        return rc;
    } else {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int eventfd_ok = getsockname(s->fd, (struct sockaddr *)&ss, &len) == 0 &&
                         ss.ss_family == AF_UNIX &&
                         (!(req.features & SHMIPC_V4_FEATURE_EVENTFD) || eventfd_peer_trusted(s));
        shmipc__v4_select(&req, s->cfg.server_v4_features, eventfd_ok, &resp);
    }
    int n = shmipc__v4_encode_response(&resp, out, sizeof out);
    if (n < 0)
        return n;
    if ((rc = shmipc__write_full(s->fd, out, (size_t)n, deadline)) < 0)
        return rc;
    if (resp.error_code[0] != '\0')
        return shmipc__fail(SHMIPC_EREJECTED, "V4 handshake: refused the client: %s: %s",
                            resp.error_code, resp.error_message);
    if (resp.features & SHMIPC_V4_FEATURE_POLLING) {
        s->wakeup = SHMIPC_WAKEUP_POLLING;
        s->interval_us = resp.interval_us;
    } else if (resp.features & SHMIPC_V4_FEATURE_EVENTFD) {
        s->wakeup = SHMIPC_WAKEUP_EVENTFD;
    }
    return 0;
}

int shmipc__handshake_server(shmipc_session *s, uint64_t deadline)
{
    uint8_t body[SHMIPC__HEADER_SIZE + 4 + 2 * SHMIPC__MAX_SHM_PATH];
    struct shmipc__header h;
    struct shmipc__msg msg;
    int rc;
    /* A refused client gets nothing read from it and nothing sent: its connection just ends. */
    if ((rc = check_peer_uid(s)) < 0 || (rc = read_header(s, -1, &h, deadline)) < 0)
        return rc;
    if (h.version == 0) {
        s->version = 4;
        s->wire = 0;
        if ((rc = server_negotiate(s, &h, deadline)) < 0)
            return rc;
        return server_share_memory(s, deadline);
    }
    if (h.version == 2) {
        if (h.type != SHMIPC__MSG_SHARE_MEMORY_BY_PATH)
            return shmipc__fail(SHMIPC_EPROTO, "handshake: V2 must start with %s, not %s",
                                shmipc__msg_type_name(0), shmipc__msg_type_name(h.type));
        s->version = s->wire = 2;
        if ((rc = read_share_body(s, &h, body, sizeof body, &msg, deadline)) < 0 ||
            (rc = map_by_path(s, &msg)) < 0)
            return rc;
        return attach_memory(s);
    }
    if (h.version < 3 || h.type != SHMIPC__MSG_EXCHANGE_VERSION)
        return shmipc__fail(SHMIPC_EVERSION,
                            "handshake: version %u starting with %s is not a protocol we speak",
                            h.version, shmipc__msg_type_name(h.type));
    s->version = s->wire = h.version < SUPPORTED_VERSION ? h.version : SUPPORTED_VERSION;
    if ((rc = send_simple(s, SUPPORTED_VERSION, SHMIPC__MSG_EXCHANGE_VERSION, deadline)) < 0)
        return rc;
    return server_share_memory(s, deadline);
}
