/*
 * The io_uring backend's ring: setup (the flags, and plainer ones for older kernels; the
 * features and opcodes it needs, probed), the ring of provided receive buffers, and teardown
 * (the CLOSE SQEs that no enter submitted are done here). Owns struct uring_state's ring and
 * buffers from calloc to free. Set-up failures carry their errno to loop.c, which decides
 * about the epoll fallback. May call: liburing, common/.
 */
#include "reactor/uring_int.h"

#include "common/error.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/*
 * liburing maps and unmaps rings with raw system calls that TSan does not see, so a ring
 * mapped where another thread's freed ring was looks like a race with the old ring's writes
 * (issue 18, item 7: test_reactor's workers_count_and_failures, a worker whose setup failed
 * freeing its ring while another worker created one at the same address; 2 runs in 300
 * under load). No ring is shared: the kernel orders the unmap before the new map. Under TSan,
 * mapping and unmapping hold one lock, which TSan does see: a ring that lands where a freed
 * one was is mapped in a critical section after the one that unmapped it, and so after every
 * write to the old ring. (A release after the unmap and an acquire after the map, as here
 * before, missed a map that ran between the other thread's unmap and its release.) Not
 * compiled otherwise: rings are created and freed once per loop.
 */
#if defined(__SANITIZE_THREAD__)
static pthread_mutex_t ring_lifetimes = PTHREAD_MUTEX_INITIALIZER;
#define RING_MAP_BEGIN() pthread_mutex_lock(&ring_lifetimes)
#define RING_MAP_END()   pthread_mutex_unlock(&ring_lifetimes)
#else
#define RING_MAP_BEGIN() ((void)0)
#define RING_MAP_END()   ((void)0)
#endif

#ifndef IORING_FEAT_MIN_TIMEOUT
#define IORING_FEAT_MIN_TIMEOUT (1U << 15) /* kernel 6.12; liburing 2.3's headers predate it */
#endif

/*
 * At teardown: the CLOSE SQEs that no enter submitted (a loop freed off its thread, or one
 * that never ran) are done here, since nothing will submit the SQEs before them either.
 */
static void close_unsubmitted(struct uring_state *s)
{
    struct io_uring_sq *sq = &s->ring.sq;
    for (unsigned i = __atomic_load_n(sq->khead, __ATOMIC_ACQUIRE); i != sq->sqe_tail; i++) {
        const struct io_uring_sqe *sqe = &sq->sqes[i & sq->ring_mask];
        if (sqe->opcode == IORING_OP_CLOSE)
            close(sqe->fd);
    }
    sq->sqe_head = sq->sqe_tail = __atomic_load_n(sq->khead, __ATOMIC_ACQUIRE);
    for (unsigned i = 0; i < s->late_n; i++)
        close(s->late_fds[i]);
    s->late_n = 0;
}

void shmipc__uring_destroy(struct shmipc__loop *loop)
{
    struct uring_state *s = state(loop);
    if (s == NULL)
        return;
    for (struct shmipc__conn *c = s->resumed_head; c != NULL; c = c->ready_next)
        shmipc__reactor_unref(&c->io);
    if (s->ring_ok) {
        close_unsubmitted(s);
        RING_MAP_BEGIN();
        io_uring_queue_exit(&s->ring);
        RING_MAP_END();
    }
    if (s->br != NULL)
        munmap(s->br, s->br_bytes);
    if (s->bufs != NULL)
        munmap(s->bufs, s->bufs_bytes);
    free(s->late_fds);
    free(s);
    loop->be_state = NULL;
}

/* Set-up failures carry their errno to the caller, which decides about the epoll fallback. */
static int setup_failed(int *setup_errno, int err, const char *what)
{
    *setup_errno = err;
    if (err == ENOSYS || err == EOPNOTSUPP)
        return shmipc__fail(SHMIPC_ENOTSUP, "%s: %s", what, strerror(err));
    return shmipc__fail_errno(err, "%s", what);
}

/* liburing 2.3 has no io_uring_setup_buf_ring(); this is what it does. */
static int setup_buf_ring(struct shmipc__loop *loop, struct uring_state *s, int *setup_errno)
{
    struct io_uring_buf_reg reg;
    int rc;
    s->nbufs = loop->recv_buf_count;
    s->buf_size = (unsigned)loop->recv_buf_size;
    s->br_bytes = s->nbufs * sizeof(struct io_uring_buf);
    s->br = mmap(NULL, s->br_bytes, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
    if (s->br == MAP_FAILED) {
        s->br = NULL;
        return setup_failed(setup_errno, errno, "io_uring: buffer ring");
    }
    s->bufs_bytes = (size_t)s->nbufs * s->buf_size;
    s->bufs = mmap(NULL, s->bufs_bytes, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
    if (s->bufs == MAP_FAILED) {
        s->bufs = NULL;
        return setup_failed(setup_errno, errno, "io_uring: receive buffers");
    }
    memset(&reg, 0, sizeof reg);
    reg.ring_addr = (uint64_t)(uintptr_t)s->br;
    reg.ring_entries = s->nbufs;
    reg.bgid = BGID;
    rc = io_uring_register_buf_ring(&s->ring, &reg, 0);
    if (rc < 0)
        return setup_failed(setup_errno, rc == -EINVAL ? EOPNOTSUPP : -rc,
                            "io_uring_register_buf_ring (kernel 5.19+)");
    io_uring_buf_ring_init(s->br);
    for (unsigned i = 0; i < s->nbufs; i++)
        io_uring_buf_ring_add(s->br, s->bufs + (size_t)i * s->buf_size, s->buf_size,
                              (unsigned short)i, io_uring_buf_ring_mask(s->nbufs), (int)i);
    io_uring_buf_ring_advance(s->br, (int)s->nbufs);
    return 0;
}

int shmipc__uring_init(struct shmipc__loop *loop, int *setup_errno)
{
    struct uring_state *s = NULL;
    struct io_uring_params p;
    struct io_uring_probe *probe = NULL;
    int rc;

    if (loop->test_uring_setup_errno > 0)
        return setup_failed(setup_errno, loop->test_uring_setup_errno,
                            "io_uring_queue_init (test hook)");
    s = calloc(1, sizeof *s);
    if (s == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "io_uring backend");
    loop->be_state = s;
    /* One issuer with deferred task work: completions are processed only inside our own
     * enter, never by interrupting the thread, which is the intended mode for one ring per
     * thread. Kernels before 6.1 refuse these flags and get a plain ring. */
    memset(&p, 0, sizeof p);
    p.flags = IORING_SETUP_SUBMIT_ALL | IORING_SETUP_CQSIZE | IORING_SETUP_CLAMP |
              IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_R_DISABLED;
    p.cq_entries = loop->ring_entries * 4;
    RING_MAP_BEGIN();
    rc = io_uring_queue_init_params(loop->ring_entries, &s->ring, &p);
    if (rc == -EINVAL) {
        memset(&p, 0, sizeof p);
        p.flags = IORING_SETUP_CQSIZE | IORING_SETUP_CLAMP;
        p.cq_entries = loop->ring_entries * 4;
        rc = io_uring_queue_init_params(loop->ring_entries, &s->ring, &p);
    }
    RING_MAP_END();
    if (rc < 0) {
        rc = setup_failed(setup_errno, -rc, "io_uring_queue_init");
        goto err;
    }
    s->ring_ok = 1;
    s->enabled = (p.flags & IORING_SETUP_R_DISABLED) == 0;
    s->min_timeout = (p.features & IORING_FEAT_MIN_TIMEOUT) != 0;
    s->window = 1; /* a new conn's rx_window is 0: its first receive counts */
    s->batch_backoff_ms = 1;
    if ((p.features & IORING_FEAT_EXT_ARG) == 0 || (p.features & IORING_FEAT_NODROP) == 0) {
        rc = setup_failed(setup_errno, EOPNOTSUPP, "io_uring: kernel lacks EXT_ARG/NODROP");
        goto err;
    }
    /* Multishot receive (6.0) cannot be probed; SEND_ZC arrived in the same release. */
    probe = io_uring_get_probe_ring(&s->ring);
    if (probe == NULL || !io_uring_opcode_supported(probe, IORING_OP_SEND_ZC)) {
        rc = setup_failed(setup_errno, EOPNOTSUPP,
                          "io_uring: kernel older than 6.0 (no multishot receive)");
        goto err;
    }
    rc = setup_buf_ring(loop, s, setup_errno);
    if (rc < 0)
        goto err;
    io_uring_free_probe(probe);
    return 0;
err:
    if (probe != NULL)
        io_uring_free_probe(probe);
    shmipc__uring_destroy(loop);
    return rc;
}
