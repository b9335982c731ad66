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

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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
    socklen_t len;
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
 * be checked empty before we create it. The window between the probe and our binds is a few
 * microseconds: two programs started at the same instant on one port could both pass it and
 * share; one started after our binds fails its own probe (or, without a probe, joins only
 * because it set SO_REUSEPORT itself, i.e. asked to share).
 */
static int port_free(const char *host, uint16_t port)
{
    struct sockaddr_storage ss;
    socklen_t len;
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
    if (g->port != 0 && !opts->share_port) {
        rc = port_free(opts->host, g->port);
        if (rc < 0)
            goto err;
    }
    for (unsigned i = 0; i < g->count; i++) {
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
    for (unsigned i = 0; i < g->count; i++) {
        g->w[i].group = g;
        g->w[i].index = i;
        rc = pthread_create(&g->w[i].thread, NULL, worker_main, &g->w[i]);
        if (rc != 0) {
            rc = shmipc__fail_errno(rc, "workers: pthread_create");
            goto err;
        }
        g->w[i].started = 1;
        started++;
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
