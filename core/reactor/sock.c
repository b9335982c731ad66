/*
 * Listening sockets and shared-nothing workers. Each worker thread owns one loop and one
 * SO_REUSEPORT listening socket bound to the same port: the kernel spreads new connections
 * over the sockets, every worker accepts its own, and no connection is handed between
 * threads (an accept thread would be the bottleneck at high connection turnover, and one
 * shared socket spreads load unevenly; see docs/reactor.md).
 */
#include "reactor/backend.h"

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "common/proc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_WORKERS 1024u

/* `host` (numeric; NULL: 0.0.0.0) and `port` as a socket address. */
static int sock_addr(const char *host, uint16_t port, struct sockaddr_storage *ss, socklen_t *len)
{
    memset(ss, 0, sizeof *ss);
    if (inet_pton(AF_INET, host, &((struct sockaddr_in *)ss)->sin_addr) == 1) {
        struct sockaddr_in *sin = (struct sockaddr_in *)ss;
        sin->sin_family = AF_INET;
        sin->sin_port = htons(port);
        *len = sizeof *sin;
    } else if (inet_pton(AF_INET6, host, &((struct sockaddr_in6 *)ss)->sin6_addr) == 1) {
        struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)ss;
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons(port);
        *len = sizeof *sin6;
    } else {
        return shmipc__fail(SHMIPC_EINVAL, "listen: host \"%s\" is not a numeric address", host);
    }
    return 0;
}

int shmipc__tcp_listen(const char *host, uint16_t port, int backlog, int reuseport, int *out_fd)
{
    struct sockaddr_storage ss;
    socklen_t len = 0;
    int one = 1;
    int fd = -1;
    int rc;

    *out_fd = -1;
    if (host == NULL)
        host = "0.0.0.0";
    rc = sock_addr(host, port, &ss, &len);
    if (rc < 0)
        return rc;
    fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return shmipc__fail_errno(errno, "listen: socket");
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0)) {
        rc = shmipc__fail_errno(errno, "listen: setsockopt");
        goto err;
    }
    if (bind(fd, (struct sockaddr *)&ss, len) < 0) {
        rc = shmipc__fail_errno(errno, "listen: bind %s port %u", host, (unsigned)port);
        goto err;
    }
    if (listen(fd, backlog > 0 ? backlog : SOMAXCONN) < 0) {
        rc = shmipc__fail_errno(errno, "listen: listen %s port %u", host, (unsigned)port);
        goto err;
    }
    *out_fd = fd;
    return 0;
err:
    close(fd);
    return rc;
}

/*
 * Whether `host`:`port` is free for a new SO_REUSEPORT group: a probe socket is bound there
 * WITHOUT SO_REUSEPORT (with SO_REUSEADDR, as ours are, so connections in TIME_WAIT do not
 * count) and closed at once, never listening. The kernel refuses that bind with EADDRINUSE
 * when any listener overlaps the address (the wildcard included), whoever owns it and
 * whatever its options, where an SO_REUSEPORT bind of the same user would silently join it.
 *
 * Why a probe: the workers need SO_REUSEPORT to share the port among themselves (one socket
 * per worker, see the top of this file), and a socket with it set can join another
 * process's group of the same user, which nothing on our side can refuse. So the group must
 * be checked empty before we create it. A program that binds in the few microseconds between
 * the probe and our binds is caught by listeners_ours() after them; one started after our
 * binds fails its own probe (or, without a probe, joins only because it set SO_REUSEPORT
 * itself, i.e. asked to share).
 */
static int port_free(const char *host, uint16_t port)
{
    struct sockaddr_storage ss;
    socklen_t len = 0;
    int one = 1;
    int fd, rc;

    if (host == NULL)
        host = "0.0.0.0";
    rc = sock_addr(host, port, &ss, &len);
    if (rc < 0)
        return rc;
    fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return shmipc__fail_errno(errno, "listen: socket");
    rc = 0;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0)
        rc = shmipc__fail_errno(errno, "listen: setsockopt");
    else if (bind(fd, (struct sockaddr *)&ss, len) < 0)
        rc = errno == EADDRINUSE
                 ? shmipc__fail(SHMIPC_EADDRINUSE,
                                "listen: %s port %u is already in use by another socket "
                                "(to share it on purpose, set reuse_port or "
                                "SHMIPC_HTTP_REUSEPORT=1)",
                                host, (unsigned)port)
                 : shmipc__fail_errno(errno, "listen: bind %s port %u", host, (unsigned)port);
    close(fd);
    return rc;
}

void (*shmipc__sock_after_probe_hook)(const char *host, uint16_t port);

/* Whether a listener bound to `a` (family `fa`; `v6only` for AF_INET6) and one bound to `b`
 * (family `fb`) would both receive connections for some address, as the kernel's bind
 * conflict check sees it: the same address, or a wildcard on either side, across families
 * only through an AF_INET6 wildcard that is not IPV6_V6ONLY (or a v4-mapped address). */
static int addr_overlap(int fa, const uint8_t *a, int a_v6only, int fb, const uint8_t *b,
                        int b_v6only)
{
    static const uint8_t zero[16];
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (fa == fb) {
        size_t n = fa == AF_INET ? 4 : 16;
        return memcmp(a, zero, n) == 0 || memcmp(b, zero, n) == 0 || memcmp(a, b, n) == 0;
    }
    if (fa == AF_INET) /* order: a is AF_INET6, b is AF_INET */
        return addr_overlap(fb, b, b_v6only, fa, a, a_v6only);
    if (a_v6only)
        return 0;
    if (memcmp(a, zero, 16) == 0)
        return 1;
    return memcmp(a, mapped, 12) == 0 && (memcmp(a + 12, b, 4) == 0 || memcmp(b, zero, 4) == 0);
}

struct foreign_scan {
    int family; /* our address */
    uint8_t addr[16];
    uint16_t port;       /* network order */
    const ino_t *inodes; /* our listening sockets */
    unsigned count;
    unsigned long foreign; /* the first listener found that is not ours (its inode), or 0 */
    int found;
};

/* One inet_diag reply: a listener of `family` that is on our port, overlaps our address and
 * is none of our sockets is foreign. */
static void scan_one(struct foreign_scan *f, const struct nlmsghdr *h)
{
    const struct inet_diag_msg *m = NLMSG_DATA(h);
    int v6only = 0;
    if (h->nlmsg_len < NLMSG_LENGTH(sizeof *m) || m->id.idiag_sport != f->port)
        return;
    if (m->idiag_family == AF_INET6) {
        int rem = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof *m));
        for (struct rtattr *a = (struct rtattr *)(uintptr_t)(m + 1); RTA_OK(a, rem);
             a = RTA_NEXT(a, rem))
            if (a->rta_type == INET_DIAG_SKV6ONLY && RTA_PAYLOAD(a) >= 1)
                v6only = *(const uint8_t *)RTA_DATA(a) != 0;
    }
    if (!addr_overlap(f->family, f->addr, 0, m->idiag_family, (const uint8_t *)m->id.idiag_src,
                      v6only))
        return;
    for (unsigned i = 0; i < f->count; i++)
        if (f->inodes[i] == (ino_t)m->idiag_inode)
            return;
    if (!f->found) {
        f->found = 1;
        f->foreign = m->idiag_inode;
    }
}

/* Dumps the TCP listeners of `family` in our network namespace through NETLINK_SOCK_DIAG. */
static int scan_family(int nl, int family, struct foreign_scan *f)
{
    struct {
        struct nlmsghdr nlh;
        struct inet_diag_req_v2 r;
    } req;
    /* On the stack, not static: two servers may start at once on two threads. */
    _Alignas(struct nlmsghdr) char buf[32768];
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};

    memset(&req, 0, sizeof req);
    req.nlh.nlmsg_len = sizeof req;
    req.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    req.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    req.nlh.nlmsg_seq = (uint32_t)family;
    req.r.sdiag_family = (uint8_t)family;
    req.r.sdiag_protocol = IPPROTO_TCP;
    /* Listeners only; an AF_INET6 listener's reply always carries INET_DIAG_SKV6ONLY. */
    req.r.idiag_states = 1u << TCP_LISTEN;
    if (sendto(nl, &req, sizeof req, 0, (struct sockaddr *)&kernel, sizeof kernel) < 0)
        return shmipc__fail_errno(errno, "listen: sock_diag request");
    for (;;) {
        ssize_t n = recv(nl, buf, sizeof buf, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return shmipc__fail_errno(errno, "listen: sock_diag reply");
        if (n == 0)
            return shmipc__fail(SHMIPC_EIO, "listen: sock_diag reply ended early");
        size_t left = (size_t)n;
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, left);
             h = NLMSG_NEXT(h, left)) {
            if (h->nlmsg_type == NLMSG_DONE)
                return 0;
            if (h->nlmsg_type == NLMSG_ERROR) {
                const struct nlmsgerr *e = NLMSG_DATA(h);
                return shmipc__fail_errno(e->error < 0 ? -e->error : EIO, "listen: sock_diag dump");
            }
            if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY)
                scan_one(f, h);
        }
    }
}

/*
 * The second half of the port check, after our sockets listen: every TCP listener in our
 * network namespace on our port whose address overlaps ours must be one of `fds` (compared by
 * socket inode, st_ino of the fd), else SHMIPC_EADDRINUSE. The probe of port_free() runs
 * before our binds and cannot see a process that binds between it and them (two servers
 * started at the same instant); this check, after them, sees it. With both, two racing
 * servers can both fail, but neither silently shares.
 *
 * Why sock_diag and not /proc/net/tcp{,6}: it needs no procfs (containers may lack it, or
 * hide it), the kernel filters on the listening state so the cost does not grow with the
 * number of established connections (the /proc files list every socket, as text, and are
 * slow on busy hosts), it reports IPV6_V6ONLY (needed to tell whether an AF_INET6 wildcard
 * covers an IPv4 address), and its fields are binary and typed rather than hex text whose
 * byte order depends on the host.
 */
static int listeners_ours(const char *host, uint16_t port, const int *fds, unsigned count)
{
    struct sockaddr_storage ss;
    struct foreign_scan f;
    ino_t *inodes = NULL;
    socklen_t len = 0;
    int nl = -1;
    int rc;

    if (host == NULL)
        host = "0.0.0.0";
    rc = sock_addr(host, port, &ss, &len);
    if (rc < 0)
        return rc;
    memset(&f, 0, sizeof f);
    f.family = ss.ss_family;
    f.port = htons(port);
    if (ss.ss_family == AF_INET)
        memcpy(f.addr, &((struct sockaddr_in *)&ss)->sin_addr, 4);
    else
        memcpy(f.addr, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
    inodes = calloc(count, sizeof *inodes);
    if (inodes == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "listen: %u inodes", count);
    for (unsigned i = 0; i < count; i++) {
        struct stat st;
        if (fstat(fds[i], &st) < 0) {
            rc = shmipc__fail_errno(errno, "listen: fstat");
            goto out;
        }
        inodes[i] = st.st_ino;
    }
    f.inodes = inodes;
    f.count = count;
    /* Where sock_diag is refused (no inet_diag in the kernel, a seccomp filter), the probe
     * before our binds stays the only check: the start goes on, with a warning, rather than
     * refusing every fixed port on such a host. */
    nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (nl < 0)
        rc = shmipc__fail_errno(errno, "NETLINK_SOCK_DIAG socket");
    else
        rc = scan_family(nl, AF_INET, &f);
    if (rc == 0)
        rc = scan_family(nl, AF_INET6, &f);
    if (rc < 0) {
        SHMIPC__LOG(SHMIPC__LOG_WARN,
                    "listen: cannot check %s port %u for listeners bound at the same time as "
                    "ours (%s); only the probe before binding guarded it",
                    host, (unsigned)port, shmipc__detail());
        rc = 0;
        goto out;
    }
    if (f.found)
        rc = shmipc__fail(SHMIPC_EADDRINUSE,
                          "listen: %s port %u is already in use by another socket (inode %lu, "
                          "bound at the same time as ours; to share it on purpose, set "
                          "reuse_port or SHMIPC_HTTP_REUSEPORT=1)",
                          host, (unsigned)port, f.foreign);
out:
    if (nl >= 0)
        close(nl);
    free(inodes);
    return rc;
}

int shmipc__sock_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
        return shmipc__fail_errno(errno, "getsockname(%d)", fd);
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return shmipc__fail(SHMIPC_EINVAL, "getsockname(%d): not an IP socket", fd);
}

/* ---- unix-socket listeners ---- */

int shmipc__is_unix_host(const char *host)
{
    return host != NULL && strncmp(host, "unix:", 5) == 0;
}

/* "unix:PATH" or "unix:@NAME" as a socket address. */
static int unix_addr(const char *host, struct sockaddr_un *un, socklen_t *len)
{
    const char *p = host + 5;
    size_t n = strlen(p);
    int abstract = p[0] == '@';
    memset(un, 0, sizeof *un);
    un->sun_family = AF_UNIX;
    if (abstract) {
        p++;
        n--;
    }
    if (n == 0)
        return shmipc__fail(SHMIPC_EINVAL, "listen %s: no %s", host,
                            abstract ? "name after '@'" : "path");
    if (n > sizeof un->sun_path - 1)
        return shmipc__fail(SHMIPC_ENAMETOOLONG,
                            "listen %s: the unix socket %s is %zu bytes, at most %zu", host,
                            abstract ? "name" : "path", n, sizeof un->sun_path - 1);
    memcpy(un->sun_path + abstract, p, n);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + abstract + n + !abstract);
    return 0;
}

int shmipc__unix_host_check(const char *host)
{
    struct sockaddr_un un;
    socklen_t len = 0;
    return unix_addr(host, &un, &len);
}

static const char *file_kind(mode_t m)
{
    return S_ISLNK(m)    ? "a symbolic link"
           : S_ISREG(m)  ? "a regular file"
           : S_ISDIR(m)  ? "a directory"
           : S_ISFIFO(m) ? "a FIFO"
                         : "not a socket";
}

int shmipc__unix_listen(const char *host, int backlog, int *out_fd, struct shmipc__unix_file *file)
{
    struct sockaddr_un un;
    struct stat st;
    socklen_t len = 0;
    int fd, rc;

    *out_fd = -1;
    memset(file, 0, sizeof *file);
    if ((rc = unix_addr(host, &un, &len)) < 0)
        return rc;
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return shmipc__fail_errno(errno, "listen %s: socket", host);
    /* What nginx leaves to the operator, done carefully (shmipc__unix_bind_listen): the file
     * appears once the socket listens; a stale socket file (its server died) is replaced, and
     * nothing else is. */
    rc = shmipc__unix_listen_at(fd, &un, len, 0, backlog > 0 ? backlog : SOMAXCONN, file);
    if (rc < 0) {
        close(fd);
        if (rc == -EADDRINUSE)
            return shmipc__fail(SHMIPC_EADDRINUSE,
                                un.sun_path[0] != '\0'
                                    ? "listen %s: a server already accepts on this socket"
                                    : "listen %s: address in use",
                                host);
        if (rc == -EEXIST)
            return shmipc__fail(
                SHMIPC_EEXIST,
                "listen %s: the path exists and is %s, not a socket; "
                "it is left as it is",
                host, lstat(un.sun_path, &st) == 0 ? file_kind(st.st_mode) : "not a socket");
        return shmipc__fail_errno(-rc, "listen %s", host);
    }
    *out_fd = fd;
    return 0;
}

int shmipc__workers_default(unsigned *out)
{
    unsigned long n;
    int rc = shmipc__env_number("SHMIPC_WORKERS", shmipc__getenv("SHMIPC_WORKERS"), 1, MAX_WORKERS,
                                "workers", &n);
    if (rc < 0)
        return rc;
    if (rc == 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        n = cpus < 1 ? 1 : cpus > (long)MAX_WORKERS ? MAX_WORKERS : (unsigned long)cpus;
    }
    *out = (unsigned)n;
    return 0;
}

struct worker {
    struct shmipc__workers *group;
    unsigned index;
    int listen_fd;
    pthread_t thread;
    int started;
    struct shmipc__loop *_Atomic loop; /* set once running, read by shmipc__workers_free */
};

struct shmipc__workers {
    struct shmipc__workers_opts opts;
    struct shmipc__loop_opts loop_opts;
    unsigned count;
    uint16_t port;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    unsigned ready; /* workers whose setup has run */
    int error;      /* the first setup failure */
    char detail[256];
    atomic_int stopping;
    struct worker *w;
    struct shmipc__unix_file unix_file; /* a unix listener's socket file, removed at the end */
};

/* Reports a worker's setup result to shmipc__workers_start(). */
static void report(struct shmipc__workers *g, int rc)
{
    pthread_mutex_lock(&g->lock);
    if (rc < 0 && g->error == 0) {
        g->error = rc;
        snprintf(g->detail, sizeof g->detail, "%s", shmipc__detail());
    }
    g->ready++;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->lock);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct shmipc__workers *g = w->group;
    struct shmipc__loop *loop = NULL;
    int fd = w->listen_fd;
    int rc;

    w->listen_fd = -1;
    /* The loop is created here so that it, and an io_uring ring, belong to this thread. */
    rc = shmipc__loop_new(&g->loop_opts, &loop);
    if (rc < 0) {
        close(fd);
        report(g, rc);
        return NULL;
    }
    rc = g->opts.setup(loop, fd, w->index, g->opts.data);
    if (rc == 0) {
        atomic_store(&w->loop, loop);
        /* A stop requested while this worker was starting must not be missed. */
        if (atomic_load(&g->stopping))
            shmipc__loop_stop(loop);
    }
    report(g, rc);
    if (rc == 0) {
        rc = shmipc__loop_run(loop);
        if (rc < 0)
            SHMIPC__LOG(SHMIPC__LOG_ERROR, "reactor: worker %u: %s", w->index, shmipc__detail());
        if (g->opts.teardown != NULL)
            g->opts.teardown(loop, w->index, g->opts.data);
    }
    /* The pointer is cleared under the lock so that a stop never touches a freed loop. */
    pthread_mutex_lock(&g->lock);
    atomic_store(&w->loop, NULL);
    pthread_mutex_unlock(&g->lock);
    shmipc__loop_free(loop);
    return NULL;
}

static void stop_all(struct shmipc__workers *g)
{
    pthread_mutex_lock(&g->lock);
    atomic_store(&g->stopping, 1);
    for (unsigned i = 0; i < g->count; i++) {
        struct shmipc__loop *loop = atomic_load(&g->w[i].loop);
        if (loop != NULL)
            shmipc__loop_stop(loop);
    }
    pthread_mutex_unlock(&g->lock);
}

void shmipc__workers_free(struct shmipc__workers *g)
{
    if (g == NULL)
        return;
    stop_all(g);
    /* Before the sockets close: a client finds no file rather than a refusing one, and the
     * file is still ours (its inode in use) when it is compared. */
    shmipc__unix_unlink(&g->unix_file);
    for (unsigned i = 0; i < g->count; i++) {
        if (g->w[i].started)
            pthread_join(g->w[i].thread, NULL);
        if (g->w[i].listen_fd >= 0)
            close(g->w[i].listen_fd);
    }
    pthread_cond_destroy(&g->cond);
    pthread_mutex_destroy(&g->lock);
    free(g->w);
    free(g);
}

int shmipc__workers_start(const struct shmipc__workers_opts *opts, struct shmipc__workers **out)
{
    struct shmipc__workers *g = NULL;
    unsigned started = 0;
    int rc;

    *out = NULL;
    if (opts->setup == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "workers: a setup callback is required");
    g = calloc(1, sizeof *g);
    if (g == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "workers");
    g->opts = *opts;
    if (opts->loop != NULL)
        g->loop_opts = *opts->loop;
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cond, NULL);
    atomic_init(&g->stopping, 0);
    g->count = opts->count;
    if (g->count == 0) {
        rc = shmipc__workers_default(&g->count);
        if (rc < 0)
            goto err;
    } else if (g->count > MAX_WORKERS) {
        rc = shmipc__fail(SHMIPC_EINVAL, "workers: count %u is above %u", g->count, MAX_WORKERS);
        g->count = 0;
        goto err;
    }
    g->w = calloc(g->count, sizeof *g->w);
    if (g->w == NULL) {
        g->count = 0;
        rc = shmipc__fail(SHMIPC_ENOMEM, "workers: %u", opts->count);
        goto err;
    }
    for (unsigned i = 0; i < g->count; i++)
        g->w[i].listen_fd = -1;
    /* All sockets are bound here, first to last, so that port 0 becomes one ephemeral port
     * that the others then share. A fixed port must be free unless the caller shares it on
     * purpose (port_free() says why a probe); an ephemeral one is free by construction: the
     * kernel never picks a port that a reuseport bind would have to share. */
    g->port = opts->port;
    if (shmipc__is_unix_host(opts->host)) {
        /* One socket for a path: every worker's acceptor takes connections from it (a
         * descriptor each, so that each closes its own), the kernel handing each connection
         * to one of them. */
        g->port = 0;
        rc = shmipc__unix_listen(opts->host, opts->backlog, &g->w[0].listen_fd, &g->unix_file);
        for (unsigned i = 1; rc == 0 && i < g->count; i++)
            if ((g->w[i].listen_fd = fcntl(g->w[0].listen_fd, F_DUPFD_CLOEXEC, 0)) < 0)
                rc = shmipc__fail_errno(errno, "listen %s: dup", opts->host);
        if (rc < 0)
            goto err;
    } else if (g->port != 0 && !opts->share_port) {
        rc = port_free(opts->host, g->port);
        if (rc < 0)
            goto err;
        if (shmipc__sock_after_probe_hook != NULL)
            shmipc__sock_after_probe_hook(opts->host, g->port);
    }
    for (unsigned i = 0; i < g->count && !shmipc__is_unix_host(opts->host); i++) {
        rc = shmipc__tcp_listen(opts->host, g->port, opts->backlog, 1, &g->w[i].listen_fd);
        if (rc < 0)
            goto err;
        if (g->port == 0) {
            rc = shmipc__sock_port(g->w[i].listen_fd);
            if (rc < 0)
                goto err;
            g->port = (uint16_t)rc;
        }
    }
    if (opts->port != 0 && !opts->share_port && !shmipc__is_unix_host(opts->host)) {
        int *fds = malloc(g->count * sizeof *fds);
        if (fds == NULL) {
            rc = shmipc__fail(SHMIPC_ENOMEM, "workers: %u", g->count);
            goto err;
        }
        for (unsigned i = 0; i < g->count; i++)
            fds[i] = g->w[i].listen_fd;
        rc = listeners_ours(opts->host, g->port, fds, g->count);
        free(fds);
        if (rc < 0)
            goto err;
    }
    /* Process signals stay with the application's threads, the faults open (common/proc.h). */
    sigset_t old;
    shmipc__thread_signals_block(&old);
    rc = 0;
    for (unsigned i = 0; i < g->count; i++) {
        g->w[i].group = g;
        g->w[i].index = i;
        rc = pthread_create(&g->w[i].thread, NULL, worker_main, &g->w[i]);
        if (rc != 0)
            break;
        g->w[i].started = 1;
        started++;
    }
    shmipc__thread_signals_restore(&old);
    if (rc != 0) {
        rc = shmipc__fail_errno(rc, "workers: pthread_create");
        goto err;
    }
    pthread_mutex_lock(&g->lock);
    while (g->ready < started)
        pthread_cond_wait(&g->cond, &g->lock);
    rc = g->error;
    pthread_mutex_unlock(&g->lock);
    if (rc < 0) {
        shmipc__fail(rc, "%s", g->detail);
        goto err;
    }
    *out = g;
    return 0;
err:
    /* Workers not yet started still hold their sockets; free() closes them. */
    shmipc__workers_free(g);
    return rc;
}

uint16_t shmipc__workers_port(const struct shmipc__workers *workers)
{
    return workers->port;
}

unsigned shmipc__workers_count(const struct shmipc__workers *workers)
{
    return workers->count;
}
