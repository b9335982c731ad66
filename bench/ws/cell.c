/*
 * shmipc-bench-ws, one cell: n connections in a closed loop (writing frames, parsing and
 * checking echoes, timing each round trip), and the percentiles of a cell over its rounds.
 */
#include "ws_bench.h"

static void conn_arm(struct loop *l, int i, int out)
{
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0u), .data.u32 = (uint32_t)i};
    if (l->c[i].want_out != out) {
        l->c[i].want_out = out;
        if (epoll_ctl(l->ep, EPOLL_CTL_MOD, l->c[i].fd, &ev) < 0)
            die("epoll_ctl: %s", strerror(errno));
    }
}

static void conn_write(struct loop *l, int i)
{
    struct conn *c = &l->c[i];
    const uint8_t *f = l->fr->frame[c->k];
    while (c->sent < l->fr->frame_len) {
        ssize_t w = write(c->fd, f + c->sent, l->fr->frame_len - c->sent);
        if (w < 0) {
            if (errno == EAGAIN)
                break;
            die("%s: write: %s", l->t->name, strerror(errno));
        }
        c->sent += (size_t)w;
    }
    conn_arm(l, i, c->sent < l->fr->frame_len);
}

static void conn_send(struct loop *l, int i)
{
    struct conn *c = &l->c[i];
    c->k = (c->k + 1) % NFRAMES;
    c->sent = 0;
    c->rx_have = c->rx_pos = c->got = 0;
    c->in_flight = 1;
    l->in_flight++;
    c->t0 = now_ns();
    conn_write(l, i);
}

static void mismatch(const struct loop *l, int i, const char *what, size_t off)
{
    die("%s: connection %d, %zu-byte message: %s at byte %zu", l->t->name, i + 1, l->fr->size, what,
        off);
}

/* Checks the WebSocket frames that arrived; 1 when the whole echo is in. */
static int ws_parse(struct loop *l, int i)
{
    struct conn *c = &l->c[i];
    for (;;) {
        const uint8_t *p = c->rx + c->rx_pos;
        size_t avail = c->rx_have - c->rx_pos, h = 2;
        uint64_t len;
        if (avail < 2)
            break;
        len = p[1] & 0x7f;
        if (p[1] & 0x80)
            mismatch(l, i, "a masked server frame", c->got);
        if (len == 126)
            h = 4;
        else if (len == 127)
            h = 10;
        if (avail < h)
            break;
        if (h == 4)
            len = (uint64_t)p[2] << 8 | p[3];
        else if (h == 10)
            for (int b = 0; b < 8; b++)
                len = b ? len << 8 | p[2 + b] : p[2];
        if (len > l->fr->size + 125 || avail - h < len) {
            if (len > l->fr->size + 125)
                mismatch(l, i, "a frame longer than the message", c->got);
            break;
        }
        int op = p[0] & 0x0f, fin = p[0] & 0x80;
        if (op == 8)
            mismatch(l, i, "a close frame from the server", c->got);
        if (op == 2 || op == 0) {
            if (c->got + len > l->fr->size || (op == 2) != (c->got == 0))
                mismatch(l, i, "frames that do not make up the message", c->got);
            if (memcmp(p + h, l->fr->payload[c->k] + c->got, len) != 0)
                mismatch(l, i, "echoed bytes that differ", c->got);
            c->got += len;
        } else if (op != 10) { /* pongs are ignored; nothing else is expected */
            mismatch(l, i, "an unexpected opcode", c->got);
        }
        c->rx_pos += h + len;
        if ((op == 2 || op == 0) && fin) {
            if (c->got != l->fr->size)
                mismatch(l, i, "a short message", c->got);
            if (c->rx_pos != c->rx_have)
                mismatch(l, i, "bytes after the echo", c->rx_pos);
            return 1;
        }
    }
    if (c->rx_pos > 0) { /* keep only the frame not yet whole */
        memmove(c->rx, c->rx + c->rx_pos, c->rx_have - c->rx_pos);
        c->rx_have -= c->rx_pos;
        c->rx_pos = 0;
    }
    return 0;
}

static void conn_read(struct loop *l, int i)
{
    struct conn *c = &l->c[i];
    size_t cap = l->fr->size + 14 + 128;
    for (;;) {
        ssize_t r;
        if (c->rx_have == cap)
            mismatch(l, i, "more bytes than the echo", c->rx_have);
        r = read(c->fd, c->rx + c->rx_have, cap - c->rx_have);
        if (r == 0)
            die("%s: connection %d closed by the server", l->t->name, i + 1);
        if (r < 0) {
            if (errno == EAGAIN)
                return;
            die("%s: read: %s", l->t->name, strerror(errno));
        }
        if (!c->in_flight)
            mismatch(l, i, "bytes with no message in flight", 0);
        c->rx_have += (size_t)r;
        int whole;
        if (l->t->kind == K_TCP) {
            if (c->rx_have > l->fr->frame_len)
                mismatch(l, i, "more bytes than were sent", l->fr->frame_len);
            whole = c->rx_have == l->fr->frame_len;
        } else {
            whole = ws_parse(l, i);
        }
        if (!whole)
            continue;
        uint64_t t1 = now_ns();
        if (l->t->kind == K_TCP && memcmp(c->rx, l->fr->frame[c->k], c->rx_have) != 0)
            mismatch(l, i, "echoed bytes that differ", 0);
        if (c->done >= l->warm && c->done < l->warm + l->timed)
            l->lat[(size_t)i * (size_t)l->timed + (size_t)(c->done - l->warm)] = t1 - c->t0;
        c->done++;
        c->in_flight = 0;
        l->in_flight--;
        l->completed++;
        if (!l->stopping)
            conn_send(l, i);
        return;
    }
}

int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int samples_for(uint64_t size, int n)
{
    uint64_t total = opt.cell_rts, by_bytes = opt.cell_bytes / size;
    if (by_bytes < total)
        total = by_bytes;
    uint64_t each = (total + (uint64_t)n - 1) / (uint64_t)n;
    return each > (uint64_t)opt.samples ? (int)each : opt.samples;
}

/* Runs `warm` untimed and then `timed` timed round trips on each of the n connections; the
 * latencies go to lat (n x timed, in ns). */
void run_pass(const struct target *t, struct conn *c, int n, size_t size, int timed, int warm,
              uint64_t *lat, struct pass *out)
{
    struct frames fr;
    struct loop l = {.t = t, .fr = &fr, .c = c, .n = n};
    struct epoll_event evs[256];
    uint64_t t_start, t_end, cpu0, cpu1, last_progress;
    long last_completed = 0;
    int behind;
    frames_make(&fr, size);
    l.timed = timed;
    l.warm = warm;
    l.lat = lat;
    l.ep = epoll_create1(EPOLL_CLOEXEC);
    if (l.ep < 0)
        die("cell set-up: %s", strerror(errno));
    for (int i = 0; i < n; i++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        free(c[i].rx);
        c[i].rx = malloc(size + 14 + 128);
        c[i].done = 0;
        c[i].want_out = 0;
        if (c[i].rx == NULL || epoll_ctl(l.ep, EPOLL_CTL_ADD, c[i].fd, &ev) < 0)
            die("cell set-up: %s", strerror(errno));
    }
    cpu0 = server_cpu_ns(t->pid);
    t_start = last_progress = now_ns();
    for (int i = 0; i < n; i++)
        conn_send(&l, i);
    behind = n;
    while (l.in_flight > 0) {
        int k = epoll_wait(l.ep, evs, 256, 1000);
        if (k < 0 && errno != EINTR)
            die("epoll_wait: %s", strerror(errno));
        for (int e = 0; e < k; e++) {
            int i = (int)evs[e].data.u32;
            if (evs[e].events & EPOLLOUT)
                conn_write(&l, i);
            if (evs[e].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
                int before = c[i].done;
                conn_read(&l, i);
                if (before < l.warm + l.timed && c[i].done >= l.warm + l.timed)
                    behind--;
            }
        }
        if (behind == 0)
            l.stopping = 1;
        if (l.completed != last_completed) {
            last_completed = l.completed;
            last_progress = now_ns();
        } else if (now_ns() - last_progress > (uint64_t)STALL_MS * 1000000u) {
            die("%s: no echo for %d s with %ld of %d connections waiting (%zu-byte messages)",
                t->name, STALL_MS / 1000, l.in_flight, n, size);
        }
    }
    t_end = now_ns();
    cpu1 = server_cpu_ns(t->pid);
    close(l.ep);
    out->completed = l.completed;
    out->ns = t_end - t_start;
    out->cpu_ns = cpu0 && cpu1 ? cpu1 - cpu0 : 0;
    frames_free(&fr);
}

double percentile_us(const uint64_t *sorted, long n, double q)
{
    long r = (long)ceil(q * (double)n) - 1;
    return (double)sorted[r < 0 ? 0 : r] / 1000.0;
}

/* One cell of one server from its passes: percentiles over the samples of all rounds, each
 * round's own p50 beside them, rates over the time of all passes. */
void cell_sum(struct cell *m, uint64_t *lat, long per_round, const struct pass *ps, size_t size)
{
    long completed = 0;
    uint64_t ns = 0, cpu = 0;
    const double q[4] = {0.50, 0.90, 0.99, 0.999};
    for (int r = 0; r < opt.rounds; r++) {
        uint64_t *part = lat + (size_t)r * (size_t)per_round;
        qsort(part, (size_t)per_round, sizeof *part, cmp_u64);
        m->p50_round[r] = percentile_us(part, per_round, 0.5);
        completed += ps[r].completed;
        ns += ps[r].ns;
        cpu += ps[r].cpu_ns;
    }
    m->samples = per_round * opt.rounds;
    qsort(lat, (size_t)m->samples, sizeof *lat, cmp_u64);
    for (int j = 0; j < 4; j++)
        m->p[j] = percentile_us(lat, m->samples, q[j]);
    m->p[4] = (double)lat[m->samples - 1] / 1000.0;
    m->rt_per_s = (double)completed / ((double)ns / 1e9);
    m->mib_per_s = 2.0 * (double)size * m->rt_per_s / (1024.0 * 1024.0);
    m->server_cpu_us = cpu ? (double)cpu / 1000.0 / (double)completed : 0;
}
