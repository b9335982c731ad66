/*
 * Private to the io_uring backend's files: uring.c (the submissions, the completion
 * dispatch and the backend table), uring_batch.c (batched waits: the controller and the
 * enter) and uring_setup.c (the ring and the buffer ring: setup, probe, teardown). Nothing
 * else in the library includes it (test_reactor_uring.c does, to reach the loop's ring); the
 * rest of the reactor sees the backend through backend.h's shmipc__backend_uring.
 */
#ifndef SHMIPC_CORE_REACTOR_URING_INT_H
#define SHMIPC_CORE_REACTOR_URING_INT_H

#include "reactor/backend.h"

#include <liburing.h>
#include <stdint.h>

#define BGID      0
#define WINDOW_NS UINT64_C(1000000) /* the activity window of batched waits */

struct uring_state {
    struct io_uring ring;
    int ring_ok;
    int enabled;
    struct io_uring_buf_ring *br;
    size_t br_bytes;
    unsigned char *bufs;
    size_t bufs_bytes;
    unsigned buf_size;
    unsigned nbufs;
    /* fds to close once every SQE queued so far is submitted (close_after_sqes()'s
     * fallback when no SQE is free for the IORING_OP_CLOSE). */
    int *late_fds;
    unsigned late_n, late_cap;
    /* Conns resumed after a pause, served at the next poll (conn->ready_next). */
    struct shmipc__conn *resumed_head, *resumed_tail;
    int ring_registered; /* enter through ring.enter_ring_fd */
    int min_timeout;     /* the kernel holds completions back (IORING_FEAT_MIN_TIMEOUT) */
    /* Batched waits: sends queued since the last enter, and the activity windows. */
    unsigned sends_queued;
    uint64_t window_start_ns;
    unsigned window;          /* the current window's number, stamped on conns (rx_window) */
    unsigned window_active;   /* conns that received in the current window */
    unsigned last_active;     /* and in the previous one */
    uint64_t last_rx_ns;      /* the turn that last delivered a receive */
    unsigned window_receives; /* receives dispatched in the current window */
    unsigned window_batched;  /* batched waits made in it */
    uint64_t batch_resume_ns;
    uint64_t batch_failed_ns; /* when a batched wait last gathered too little */
    unsigned batch_backoff_ms;
    /* The comparison: its phase, when the phase ends, the CPU clock and completion count at
     * its start, the plain trial's cost (ns per completion; 0: not measured), the choice. */
    int ctl;
    uint64_t ctl_start, ctl_until, ctl_cpu0, ctl_events0;
    /* The plain trial's CPU per completion and completions per second. */
    double cost_plain, rate_plain;
    int ctl_batch;
};

enum { CTL_START, CTL_TRY_PLAIN, CTL_TRY_BATCH, CTL_HOLD };

static inline struct uring_state *state(struct shmipc__loop *loop)
{
    return loop->be_state;
}

/* uring_batch.c: the loop turn's one io_uring_enter, batched when the load pays. */
int shmipc__uring_submit_and_wait(struct shmipc__loop *loop, struct uring_state *s,
                                  int64_t timeout_ns);

/* uring_setup.c: the backend's init and destroy (shmipc__backend_uring's). */
int shmipc__uring_init(struct shmipc__loop *loop, int *setup_errno);
void shmipc__uring_destroy(struct shmipc__loop *loop);

#endif
