/* The loop: options and knobs, backend choice with the io_uring -> epoll fallback, the per-fd
 * slot table, object pools, one turn, stop, free. */
#include "reactor/backend.h"

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define POISON(p, n)   ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n)   ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define DEFAULT_RECV_BUF_SIZE   (16u << 10)
#define DEFAULT_RECV_BUF_COUNT  256u
#define MAX_RECV_BUF_COUNT      32768u /* buffer ids are 16 bits */
#define DEFAULT_MAX_EVENTS      256u
#define DEFAULT_READS_PER_EVENT 16u
#define DEFAULT_RING_ENTRIES    1024u
#define DEFAULT_BATCH_US        50u
#define MAX_BATCH_US            10000u
#define POOL_CHUNK              64u

/* The address of a thread-local byte names a live thread without a system call. */
static _Thread_local char thread_token;

static uintptr_t self_token(void)
{
    return (uintptr_t)&thread_token;
}

int shmipc__reactor_on_thread(const struct shmipc__loop *loop)
{
    return atomic_load_explicit(&loop->owner, memory_order_relaxed) == self_token();
}

uint64_t shmipc__reactor_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t shmipc__reactor_now_ns(const struct shmipc__loop *loop)
{
    return loop->test_clock_ns != NULL ? loop->test_clock_ns(loop) : shmipc__reactor_clock_ns();
}

/* ---- pools ---- */

/* A chunk header keeps the objects behind it aligned as malloc() aligns. */
union pool_chunk {
    union pool_chunk *next;
    max_align_t align;
};

static size_t pool_stride(const struct shmipc__objpool *p)
{
    return (p->size + sizeof(max_align_t) - 1) & ~(sizeof(max_align_t) - 1);
}

void *shmipc__objpool_get(struct shmipc__objpool *p)
{
    void *obj;
    if (p->free == NULL) {
        size_t stride = pool_stride(p);
        union pool_chunk *c = malloc(sizeof *c + stride * p->per_chunk);
        if (c == NULL)
            return NULL;
        c->next = p->chunks;
        p->chunks = c;
        for (unsigned i = p->per_chunk; i-- > 0;)
            shmipc__objpool_put(p, (char *)(c + 1) + stride * i);
    }
    obj = p->free;
    UNPOISON(obj, p->size);
    p->free = *(void **)obj;
    memset(obj, 0, p->size);
    return obj;
}

void shmipc__objpool_put(struct shmipc__objpool *p, void *obj)
{
    *(void **)obj = p->free;
    p->free = obj;
    /* Under ASan a recycled object is poisoned past its free-list link, so a use after
     * close is reported as it would be after free(). */
    POISON((char *)obj + sizeof(void *), p->size - sizeof(void *));
}

static void pool_destroy(struct shmipc__objpool *p)
{
    union pool_chunk *c = p->chunks;
    while (c != NULL) {
        union pool_chunk *next = c->next;
        UNPOISON(c + 1, pool_stride(p) * p->per_chunk);
        free(c);
        c = next;
    }
    p->chunks = NULL;
    p->free = NULL;
}

/* ---- slot table ---- */

int shmipc__reactor_register(struct shmipc__loop *loop, struct shmipc__io *io)
{
    struct shmipc__slot *slot;
    if (io->fd < 0)
        return shmipc__fail(SHMIPC_EINVAL, "reactor: fd %d is not a file descriptor", io->fd);
    if ((size_t)io->fd >= loop->nslots) {
        size_t n = loop->nslots != 0 ? loop->nslots : 64;
        struct shmipc__slot *grown;
        while (n <= (size_t)io->fd)
            n *= 2;
        grown = realloc(loop->slots, n * sizeof *grown);
        if (grown == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "reactor: slot table for fd %d", io->fd);
        memset(grown + loop->nslots, 0, (n - loop->nslots) * sizeof *grown);
        loop->slots = grown;
        loop->nslots = n;
    }
    slot = &loop->slots[io->fd];
    if (slot->io != NULL)
        return shmipc__fail(SHMIPC_EEXIST, "reactor: fd %d is already open on this loop", io->fd);
    slot->gen = (slot->gen + 1) & SHMIPC__GEN_MASK;
    if (slot->gen == 0)
        slot->gen = 1;
    slot->io = io;
    io->gen = slot->gen;
    loop->handles++;
    return 0;
}

void shmipc__reactor_unregister(struct shmipc__loop *loop, struct shmipc__io *io)
{
    loop->slots[io->fd].io = NULL;
    loop->handles--;
}

struct shmipc__io *shmipc__reactor_lookup(struct shmipc__loop *loop, int fd, uint32_t gen)
{
    if (fd >= 0 && (size_t)fd < loop->nslots) {
        struct shmipc__slot *slot = &loop->slots[fd];
        if (slot->io != NULL && slot->gen == gen)
            return slot->io;
    }
    loop->stats.stale++;
    return NULL;
}

/* ---- options ---- */

static int backend_from_env(enum shmipc__backend_kind *out)
{
    const char *v = shmipc__getenv("SHMIPC_REACTOR_BACKEND");
    if (v == NULL || strcmp(v, "auto") == 0)
        *out = SHMIPC__BACKEND_AUTO;
    else if (strcmp(v, "io_uring") == 0)
        *out = SHMIPC__BACKEND_IO_URING;
    else if (strcmp(v, "epoll") == 0)
        *out = SHMIPC__BACKEND_EPOLL;
    else
        return shmipc__fail(SHMIPC_EINVAL,
                            "SHMIPC_REACTOR_BACKEND=%s is not one of auto|io_uring|epoll", v);
    return 0;
}

static int rx_from_env(enum shmipc__rx_mode *out)
{
    const char *v = shmipc__getenv("SHMIPC_RX_EPOLL");
    if (v == NULL || strcmp(v, "1") == 0)
        *out = SHMIPC__RX_PERSISTENT;
    else if (strcmp(v, "0") == 0)
        *out = SHMIPC__RX_ONESHOT;
    else
        return shmipc__fail(SHMIPC_EINVAL, "SHMIPC_RX_EPOLL=%s is not 0 or 1", v);
    return 0;
}

static int batch_from_env(unsigned *out)
{
    unsigned long n = DEFAULT_BATCH_US;
    int rc =
        shmipc__env_number("SHMIPC_REACTOR_BATCH_US", shmipc__getenv("SHMIPC_REACTOR_BATCH_US"), 0,
                           MAX_BATCH_US, "microseconds", &n);
    *out = (unsigned)n;
    return rc < 0 ? rc : 0;
}

static int apply_opts(struct shmipc__loop *loop, const struct shmipc__loop_opts *o,
                      enum shmipc__backend_kind *kind)
{
    int rc = 0;
    *kind = o->backend;
    if (*kind == SHMIPC__BACKEND_DEFAULT)
        rc = backend_from_env(kind);
    else if (*kind > SHMIPC__BACKEND_EPOLL)
        rc = shmipc__fail(SHMIPC_EINVAL, "loop_opts.backend: %d is not a backend", (int)*kind);
    if (rc < 0)
        return rc;
    loop->rx_mode = o->rx_epoll;
    if (loop->rx_mode == SHMIPC__RX_DEFAULT)
        rc = rx_from_env(&loop->rx_mode);
    else if (loop->rx_mode > SHMIPC__RX_ONESHOT)
        rc = shmipc__fail(SHMIPC_EINVAL, "loop_opts.rx_epoll: %d is not a mode", (int)o->rx_epoll);
    if (rc < 0)
        return rc;
    loop->recv_buf_size = o->recv_buf_size != 0 ? o->recv_buf_size : DEFAULT_RECV_BUF_SIZE;
    loop->recv_buf_count = o->recv_buf_count != 0 ? o->recv_buf_count : DEFAULT_RECV_BUF_COUNT;
    loop->max_events = o->max_events != 0 ? o->max_events : DEFAULT_MAX_EVENTS;
    loop->reads_per_event = o->reads_per_event != 0 ? o->reads_per_event : DEFAULT_READS_PER_EVENT;
    loop->ring_entries = o->ring_entries != 0 ? o->ring_entries : DEFAULT_RING_ENTRIES;
    loop->test_uring_setup_errno = o->test_uring_setup_errno;
    loop->batch_always = o->batch_always;
    loop->test_cpu_ns = o->test_cpu_ns;
    loop->test_clock_ns = o->test_clock_ns;
    if (o->batch_us == 0)
        rc = batch_from_env(&loop->batch_us);
    else if (o->batch_us > (int)MAX_BATCH_US)
        rc = shmipc__fail(SHMIPC_EINVAL, "loop_opts.batch_us: %d is above %u", o->batch_us,
                          MAX_BATCH_US);
    else
        loop->batch_us = o->batch_us < 0 ? 0 : (unsigned)o->batch_us;
    if (rc < 0)
        return rc;
    if (loop->recv_buf_size > (1u << 30))
        return shmipc__fail(SHMIPC_EINVAL, "loop_opts.recv_buf_size: %zu is above 1 GiB",
                            loop->recv_buf_size);
    if (loop->recv_buf_count > MAX_RECV_BUF_COUNT ||
        (loop->recv_buf_count & (loop->recv_buf_count - 1)) != 0)
        return shmipc__fail(SHMIPC_EINVAL,
                            "loop_opts.recv_buf_count: %u is not a power of two up to %u",
                            loop->recv_buf_count, MAX_RECV_BUF_COUNT);
    if (loop->max_events > INT_MAX / 2)
        return shmipc__fail(SHMIPC_EINVAL, "loop_opts.max_events: %u is too large",
                            loop->max_events);
    return 0;
}

/*
 * auto falls back to epoll when io_uring is refused outright: ENOSYS (no io_uring in the
 * kernel), EPERM (Docker's default seccomp profile, kernel.io_uring_disabled), ENOMEM
 * (RLIMIT_MEMLOCK on kernels before 5.12), and EOPNOTSUPP, which the io_uring backend reports
 * for a kernel without the features it uses.
 */
static int fallback_allowed(int err)
{
    return err == ENOSYS || err == EPERM || err == ENOMEM || err == EOPNOTSUPP;
}

static int start_backend(struct shmipc__loop *loop, enum shmipc__backend_kind kind)
{
    int setup_errno = 0;
    int rc;
    if (kind != SHMIPC__BACKEND_EPOLL) {
        rc = shmipc__backend_uring.init(loop, &setup_errno);
        if (rc == 0) {
            loop->be = &shmipc__backend_uring;
            return 0;
        }
        if (kind == SHMIPC__BACKEND_IO_URING || !fallback_allowed(setup_errno)) {
            char why[256];
            snprintf(why, sizeof why, "%s", shmipc__detail());
            return shmipc__fail(
                rc, "reactor backend %s cannot be used: %s",
                kind == SHMIPC__BACKEND_IO_URING ? "io_uring (requested)" : "io_uring", why);
        }
        SHMIPC__LOG(SHMIPC__LOG_INFO, "reactor: io_uring unavailable (%s); using epoll",
                    shmipc__detail());
    }
    rc = shmipc__backend_epoll.init(loop, &setup_errno);
    if (rc == 0)
        loop->be = &shmipc__backend_epoll;
    return rc;
}

/* ---- the loop's own wakeup ---- */

static void wake_ready(struct shmipc__watch *w, int fd, unsigned events, void *data)
{
    uint64_t n;
    (void)w;
    (void)events;
    (void)data;
    /* Drains the counter; the stop flag itself is read by shmipc__loop_run(). */
    while (read(fd, &n, sizeof n) > 0)
        ;
}

int shmipc__loop_new(const struct shmipc__loop_opts *opts, struct shmipc__loop **out)
{
    static const struct shmipc__loop_opts defaults;
    struct shmipc__loop *loop = NULL;
    enum shmipc__backend_kind kind;
    int rc;

    *out = NULL;
    loop = calloc(1, sizeof *loop);
    if (loop == NULL) {
        rc = shmipc__fail(SHMIPC_ENOMEM, "reactor: loop");
        goto err;
    }
    loop->wake_fd = -1;
    atomic_init(&loop->stop, 0);
    atomic_init(&loop->owner, self_token());
    loop->conn_pool.size = sizeof(struct shmipc__conn);
    loop->conn_pool.per_chunk = POOL_CHUNK;
    loop->req_pool.size = sizeof(struct shmipc__send_req);
    loop->req_pool.per_chunk = POOL_CHUNK;
    loop->iov_pool.size = SHMIPC__REQ_POOL_IOV * sizeof(struct iovec);
    loop->iov_pool.per_chunk = 16;
    loop->now_ns = shmipc__reactor_clock_ns();

    rc = apply_opts(loop, opts != NULL ? opts : &defaults, &kind);
    if (rc < 0)
        goto err;
    if (loop->test_clock_ns != NULL)
        loop->now_ns = loop->test_clock_ns(loop);
    rc = start_backend(loop, kind);
    if (rc < 0)
        goto err;
    loop->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (loop->wake_fd < 0) {
        rc = shmipc__fail_errno(errno, "reactor: eventfd");
        goto err;
    }
    rc = shmipc__watch_new(loop, loop->wake_fd, SHMIPC__WATCH_READ, wake_ready, NULL, &loop->wake);
    if (rc < 0)
        goto err;
    *out = loop;
    return 0;
err:
    shmipc__loop_free(loop);
    return rc;
}

const char *shmipc__loop_backend_name(const struct shmipc__loop *loop)
{
    return loop->be->name;
}

int shmipc__loop_run_once(struct shmipc__loop *loop, int timeout_ms)
{
    int64_t timeout_ns = timeout_ms < 0 ? -1 : (int64_t)timeout_ms * 1000000;
    int64_t timer_ns;
    int handled;
    int rc;

    atomic_store_explicit(&loop->owner, self_token(), memory_order_relaxed);
    loop->stats.turns++;
    loop->in_turn = 1;
    loop->now_ns = shmipc__reactor_now_ns(loop);
    /* Send callbacks already due must not wait behind a blocking wait. */
    if (loop->done_head != NULL)
        timeout_ns = 0;
    timer_ns = shmipc__timers_next_ns(loop);
    if (timer_ns >= 0 && (timeout_ns < 0 || timer_ns < timeout_ns))
        timeout_ns = timer_ns;
    rc = loop->be->poll(loop, timeout_ns);
    if (rc >= 0) {
        handled = rc;
        loop->now_ns = shmipc__reactor_now_ns(loop);
        handled += shmipc__timers_run(loop);
        handled += shmipc__reactor_run_done(loop);
        shmipc__reactor_reclaim(loop);
        rc = handled;
    }
    loop->in_turn = 0;
    return rc;
}

int shmipc__loop_run(struct shmipc__loop *loop)
{
    int rc = 0;
    while (!atomic_exchange(&loop->stop, 0)) {
        rc = shmipc__loop_run_once(loop, -1);
        if (rc < 0)
            return rc;
    }
    return 0;
}

void shmipc__loop_stop(struct shmipc__loop *loop)
{
    uint64_t one = 1;
    ssize_t rc;
    atomic_store(&loop->stop, 1);
    /* EAGAIN means the counter is saturated, which wakes the loop as well. */
    rc = write(loop->wake_fd, &one, sizeof one);
    (void)rc;
}

uint64_t shmipc__loop_now_ms(const struct shmipc__loop *loop)
{
    return loop->now_ns / 1000000;
}

void shmipc__loop_stats(const struct shmipc__loop *loop, struct shmipc__loop_stats *out)
{
    *out = loop->stats;
}

unsigned shmipc__loop_handles(const struct shmipc__loop *loop)
{
    return loop->handles - (loop->wake != NULL);
}

void shmipc__loop_free(struct shmipc__loop *loop)
{
    if (loop == NULL)
        return;
    for (size_t fd = 0; fd < loop->nslots; fd++)
        if (loop->slots[fd].io != NULL)
            shmipc__reactor_close_io(loop->slots[fd].io);
    loop->wake = NULL;
    /* On its own thread the loop lets the kernel finish with what it holds (io_uring sends in
     * flight reference the callers' buffers); elsewhere the backend's teardown cancels it. */
    if (loop->be != NULL && shmipc__reactor_on_thread(loop))
        for (int i = 0; i < 100 && loop->closing != NULL; i++)
            if (shmipc__loop_run_once(loop, 10) < 0)
                break;
    if (loop->be != NULL)
        loop->be->destroy(loop);
    shmipc__reactor_force_reclaim(loop);
    shmipc__timers_free(loop);
    if (loop->wake_fd >= 0)
        close(loop->wake_fd);
    pool_destroy(&loop->conn_pool);
    pool_destroy(&loop->req_pool);
    pool_destroy(&loop->iov_pool);
    free(loop->slots);
    free(loop);
}
