/*
 * shmipc-bench ipc, client side of every transport: opening a session or a connection, streams
 * (chans), sending a message and checking its echo byte by byte.
 */
#include "ipc_bench.h"

/*
 * Connects transport t. A shmipc session must have negotiated exactly what the transport
 * stands for (protocol version, V4 wakeup, polling interval): the V4 helpers turn fallback
 * on, and a session that fell back to V3 silently would be reported under the wrong name.
 */
int client_open(struct client *c, int t, const char *shm_addr, shmipc_config *const cfg[T_COUNT],
                const struct local *lc, const struct opts *o)
{
    memset(c, 0, sizeof *c);
    c->t = t;
    if (is_shmipc(t)) {
        const shmipc_config *cf = cfg[t];
        char what[64];
        snprintf(what, sizeof what, "%s: connect", transport_name[t]);
        uint64_t t0 = now_ns();
        int rc = shmipc_session_connect(shm_addr, cf, &c->sess);
        if (rc < 0)
            return shm_fail(what, rc);
        c->connect_secs = (double)(now_ns() - t0) / 1e9;
        c->version = shmipc_session_version(c->sess);
        c->wakeup = shmipc_session_wakeup(c->sess, &c->interval_us);
        int ok = c->version == want_version(t) && c->wakeup == want_wakeup(t) &&
                 (t != T_V4P || c->interval_us == o->polling_us);
        if (!ok) {
            fprintf(stderr, "shmipc-bench: %s: the session negotiated protocol V%d with %s wakeups",
                    transport_name[t], c->version, wakeup_name(c->wakeup));
            if (c->wakeup == SHMIPC_WAKEUP_POLLING)
                fprintf(stderr, " every %" PRIu32 " µs", c->interval_us);
            fprintf(stderr, ", not V%d with %s wakeups", want_version(t),
                    wakeup_name(want_wakeup(t)));
            if (t == T_V4P)
                fprintf(stderr, " every %" PRIu32 " µs", o->polling_us);
            fprintf(stderr, ": not reporting a session that fell back or was downgraded\n");
            return -1;
        }
        return largest_slice(cf, &c->window);
    }
    c->uds_path = lc->uds_path;
    c->tcp_port = lc->tcp_port;
    return 0;
}

void client_close(struct client *c)
{
    shmipc_session_close(c->sess);
    c->sess = NULL;
}

void chans_close(const struct client *c, struct chan *ch, int n)
{
    for (int i = 0; i < n; i++) {
        if (is_shmipc(c->t))
            shmipc_stream_close(ch[i].st);
        else if (ch[i].fd >= 0)
            close(ch[i].fd);
        free(ch[i].buf);
    }
    free(ch);
}

/* Opens n streams (shmipc) or connections (sockets) for messages of `size` bytes. */
struct chan *chans_open(const struct client *c, int n, size_t size)
{
    struct chan *ch = calloc((size_t)n, sizeof *ch);
    if (ch == NULL) {
        fprintf(stderr, "shmipc-bench: out of memory\n");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        ch[i].fd = -1;
    for (int i = 0; i < n; i++) {
        if (is_shmipc(c->t)) {
            int rc = shmipc_session_open_stream(c->sess, &ch[i].st);
            if (rc < 0) {
                shm_fail("open stream", rc);
                if (rc == SHMIPC_EUNHEALTHY)
                    fprintf(stderr, "shmipc-bench: shared memory ran out and data went over the "
                                    "socket: give a larger --buffer or a smaller --max-inflight\n");
                chans_close(c, ch, i);
                return NULL;
            }
        } else if ((ch[i].fd = sock_connect(c)) < 0 || (ch[i].buf = malloc(HDR + size)) == NULL) {
            if (ch[i].fd >= 0)
                fprintf(stderr, "shmipc-bench: out of memory\n");
            chans_close(c, ch, i + 1);
            return NULL;
        }
    }
    return ch;
}

/*
 * Sends message `seq` of `size` bytes. shmipc: the length and the payload are written
 * straight into shared memory through reserve/commit, in windows no larger than a slice,
 * then flushed. Sockets: the same bytes are written into the connection's buffer, then
 * write().
 */
int chan_send(const struct client *c, struct chan *ch, size_t size, uint64_t seq)
{
    const uint8_t *src = pattern + seq % PATTERN_SLACK;
    if (is_shmipc(c->t)) {
        size_t done = 0, n = min_size(HDR + size, c->window);
        void *p;
        int rc = shmipc_stream_reserve(ch->st, n, &p);
        if (rc < 0)
            return shm_fail("reserve", rc);
        put_be32(p, (uint32_t)size);
        memcpy((uint8_t *)p + HDR, src, n - HDR);
        if ((rc = shmipc_stream_commit(ch->st, n)) < 0)
            return shm_fail("commit", rc);
        done = n - HDR;
        while (done < size) {
            n = min_size(size - done, c->window);
            if ((rc = shmipc_stream_reserve(ch->st, n, &p)) < 0)
                return shm_fail("reserve", rc);
            memcpy(p, src + done, n);
            if ((rc = shmipc_stream_commit(ch->st, n)) < 0)
                return shm_fail("commit", rc);
            done += n;
        }
        if ((rc = shmipc_stream_flush(ch->st)) < 0)
            return shm_fail("flush", rc);
        return 0;
    }
    put_be32(ch->buf, (uint32_t)size);
    memcpy(ch->buf + HDR, src, size);
    const uint8_t *p = ch->buf;
    size_t left = HDR + size;
    while (left > 0) {
        ssize_t w = write(ch->fd, p, left);
        if (w < 0) {
            if (errno == EINTR && !interrupted)
                continue;
            return sys_fail("write");
        }
        p += w;
        left -= (size_t)w;
    }
    return 0;
}

static int check_echo(const uint8_t *hdr, size_t size, uint64_t sum, uint64_t want)
{
    if (get_be32(hdr) != size) {
        fprintf(stderr, "shmipc-bench: echo framing: length %" PRIu32 ", expected %zu\n",
                get_be32(hdr), size);
        return -1;
    }
    if (sum != want) {
        fprintf(stderr,
                "shmipc-bench: echo of %zu bytes is corrupt: sum %" PRIu64 ", expected %" PRIu64
                "\n",
                size, sum, want);
        return -1;
    }
    return 0;
}

/* An echo whose bytes differ from the message sent (in order, not only in sum). */
static int echo_differs(size_t size)
{
    fprintf(stderr, "shmipc-bench: echo of %zu bytes differs from the message sent\n", size);
    return -1;
}

/*
 * Reads the echo of a message, summing every payload byte of every chunk read; with `msg`
 * (the untimed warm-ups) also compares every byte with the message sent, so an echo put
 * together in the wrong order fails too.
 */
int chan_recv(const struct client *c, struct chan *ch, size_t size, uint64_t want,
              const uint8_t *msg)
{
    size_t total = HDR + size, got = 0;
    uint8_t hdr[HDR];
    uint64_t sum = 0;
    if (is_shmipc(c->t)) {
        while (got < total) {
            const void *p;
            size_t n;
            int rc = shmipc_stream_read_chunk(ch->st, total - got, &p, &n, 0);
            if (rc < 0)
                return shm_fail("read", rc);
            const uint8_t *b = p;
            while (got < HDR && n > 0) {
                hdr[got++] = *b++;
                n--;
            }
            if (msg != NULL && n > 0 && memcmp(b, msg + (got - HDR), n) != 0)
                return echo_differs(size);
            sum += byte_sum(b, n);
            got += n;
        }
        int rc = shmipc_stream_release(ch->st);
        if (rc < 0)
            return shm_fail("release", rc);
        return check_echo(hdr, size, sum, want);
    }
    while (got < total) {
        ssize_t r = read(ch->fd, ch->buf + got, total - got);
        if (r < 0) {
            if (errno == EINTR && !interrupted)
                continue;
            return sys_fail("read");
        }
        if (r == 0) {
            fprintf(stderr, "shmipc-bench: read: the echo server closed the connection\n");
            return -1;
        }
        size_t from = got < HDR ? HDR : got;
        got += (size_t)r;
        if (got > from)
            sum += byte_sum(ch->buf + from, got - from);
    }
    if (msg != NULL && memcmp(ch->buf + HDR, msg, size) != 0)
        return echo_differs(size);
    return check_echo(ch->buf, size, sum, want);
}

/* `sums` holds the sum of a message of `size` bytes at each pattern offset. */
int round_trip(const struct client *c, struct chan *ch, size_t size, uint64_t seq,
               const uint64_t *sums, int verify)
{
    if (chan_send(c, ch, size, seq) < 0)
        return -1;
    return chan_recv(c, ch, size, sums[seq % PATTERN_SLACK],
                     verify ? pattern + seq % PATTERN_SLACK : NULL);
}
