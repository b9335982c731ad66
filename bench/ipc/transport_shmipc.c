/*
 * shmipc-bench ipc, shmipc transports (V3, V2, V4 with each wakeup): the session config both
 * peers build, and the echo server's side of a session (its streams: header, copy or forward,
 * probing).
 */
#include "ipc_bench.h"

/* ------------------------------------------------------------------------------------ */
/* shmipc configuration                                                                 */
/* ------------------------------------------------------------------------------------ */

/*
 * The config of shmipc transport `t`: V2 is the legacy protocol over /dev/shm files, V3 over
 * memfd, and the V4 transports use the public helpers a user would (which turn fallback on;
 * client_open() refuses a session that fell back). The echo server uses T_V3's config: the
 * default server accepts V2, V3 and V4 and offers both optional V4 wakeups.
 */
int make_config(const struct opts *o, int t, shmipc_config **out)
{
    shmipc_config *cfg = NULL;
    char prefix[64];
    int rc;
    /* One prefix per run: a run's leftovers in /dev/shm are easy to find and remove. */
    snprintf(prefix, sizeof prefix, "/dev/shm/shmipc-bench-%ld", (long)getpid());
    if ((rc = shmipc_config_new(&cfg)) < 0)
        return shm_fail("config_new", rc);
    if ((rc = shmipc_config_set_memmap_type(cfg, t == T_V2 ? SHMIPC_MEMMAP_DEVSHM
                                                           : SHMIPC_MEMMAP_MEMFD)) < 0) {
        shm_fail("config: memmap type", rc);
        goto err;
    }
    rc = t == T_V4    ? shmipc_config_with_v4(cfg)
         : t == T_V4E ? shmipc_config_with_v4_eventfd(cfg)
         : t == T_V4P ? shmipc_config_with_v4_event_queue_polling(cfg, o->polling_us)
                      : 0;
    if (rc < 0) {
        shm_fail("config: V4", rc);
        goto err;
    }
    if ((rc = shmipc_config_set_path_prefix(cfg, prefix)) < 0) {
        shm_fail("config: path prefix", rc);
        goto err;
    }
    /* The capacity first, so that large slice classes find room when they are checked. */
    if ((rc = shmipc_config_set_buffer_capacity(cfg, o->buffer)) < 0) {
        shm_fail("config: --buffer", rc);
        goto err;
    }
    if ((rc = shmipc_config_parse_slice_classes(cfg, o->slices)) < 0) {
        shm_fail("config: --slices", rc);
        goto err;
    }
    if ((rc = shmipc_config_set_queue_capacity(cfg, o->queue)) < 0) {
        shm_fail("config: --queue", rc);
        goto err;
    }
    if (o->spin_us >= 0 && (rc = shmipc_config_set_spin_us(cfg, (uint32_t)o->spin_us)) < 0) {
        shm_fail("config: --spin-us", rc);
        goto err;
    }
    /* A hung peer ends the run with an error instead of hanging it. */
    if ((rc = shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_READ, (int)io_timeout_ms)) < 0) {
        shm_fail("config: read timeout", rc);
        goto err;
    }
    /* The client lays out a large buffer during the handshake: give it more than 1 s. */
    if ((rc = shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_INITIALIZE, HANDSHAKE_MS)) < 0) {
        shm_fail("config: initialize timeout", rc);
        goto err;
    }
    if ((rc = shmipc_config_validate(cfg)) < 0) {
        shm_fail("config", rc);
        goto err;
    }
    *out = cfg;
    return 0;
err:
    shmipc_config_free(cfg);
    return -1;
}

/* The largest slice class: the largest window reserve can hand out in shared memory. */
int largest_slice(const shmipc_config *cfg, uint32_t *out)
{
    shmipc_slice_class c[SHMIPC_MAX_SLICE_CLASSES];
    int n = shmipc_config_get_slice_classes(cfg, c, SHMIPC_MAX_SLICE_CLASSES);
    if (n <= 0)
        return shm_fail("config: slice classes", n < 0 ? n : SHMIPC_EINVAL);
    *out = c[n - 1].size;
    return 0;
}

static void sstream_close(struct ssession *ss, int i)
{
    shmipc_stream_close(ss->streams[i].st);
    ss->streams[i] = ss->streams[--ss->n];
}

void ssession_end(struct server *sv, int i)
{
    sv->last = -1;
    struct ssession *ss = &sv->sess[i];
    while (ss->n > 0)
        sstream_close(ss, ss->n - 1);
    free(ss->streams);
    shmipc_session_close(ss->s);
    sv->sess[i] = sv->sess[--sv->nsess];
    sv->sessions_done++;
}

/*
 * Reads the next bytes of a message's length. Copying echo: the length goes into the reply
 * when it is complete. Forwarding echo: it stays read and not released, so the forward of
 * the payload takes it along (an empty payload is forwarded at once).
 */
static int sstream_header(struct sstream *x)
{
    const void *p;
    size_t n;
    int rc = shmipc_stream_read_chunk(x->st, HDR - x->hdr_got, &p, &n, SHMIPC_NONBLOCK);
    if (rc < 0)
        return rc;
    memcpy(x->hdr + x->hdr_got, p, n);
    x->hdr_got += (uint32_t)n;
    if (x->hdr_got < HDR)
        return 0;
    x->left = get_be32(x->hdr);
    if (echo_copy) {
        if ((rc = shmipc_stream_write(x->st, x->hdr, HDR)) < 0)
            return rc;
        return shmipc_stream_release(x->st);
    }
    return x->left == 0 ? shmipc_stream_forward(x->st, x->st, 0, 0) : 0;
}

/* Copying echo: one chunk of payload is copied into the reply and released. */
static int sstream_copy(struct sstream *x)
{
    const void *p;
    size_t n;
    int rc = shmipc_stream_read_chunk(x->st, (size_t)x->left, &p, &n, SHMIPC_NONBLOCK);
    if (rc < 0 || (rc = shmipc_stream_write(x->st, p, n)) < 0)
        return rc;
    x->left -= n;
    return shmipc_stream_release(x->st);
}

/*
 * Forwarding echo: the payload received so far (with the length before it) goes into the
 * reply as the slices it arrived in. With nothing available it asks for one byte, which is
 * how a probe sees the stream's end.
 */
static int sstream_forward(struct sstream *x, size_t avail)
{
    size_t n = avail == 0 ? 1 : avail < x->left ? avail : (size_t)x->left;
    int rc = shmipc_stream_forward(x->st, x->st, n, SHMIPC_NONBLOCK);
    if (rc == 0)
        x->left -= n;
    return rc;
}

/*
 * Echoes what one stream has received, message by message, and flushes the reply when its
 * message is complete; reads stop at message ends, so a pipelining client works too. The
 * payload is forwarded (its slices go back untouched, as a socket echo sends back the buffer
 * it received into) or, with --echo copy, copied into new slices.
 *
 * Only streams with bytes available are read: a non-blocking read of an empty stream makes
 * the library try the socket (a recv() system call). `probe` reads once anyway, which is
 * how a stream the peer has closed is seen (EEOF), without a system call.
 *
 * Returns the number of reads made, or -1 when the stream is done (closed or failed).
 */
static int sstream_serve(struct sstream *x, int probe, uint64_t now)
{
    int chunks = 0;
    if (probe == PROBE_STALE)
        probe = now - x->last_ns >= STALE_NS;
    for (;;) {
        size_t avail = shmipc_stream_available(x->st);
        if (!probe && avail == 0)
            break;
        probe = 0;
        int rc = x->hdr_got < HDR ? sstream_header(x)
                 : echo_copy      ? sstream_copy(x)
                                  : sstream_forward(x, avail);
        if (rc == SHMIPC_EAGAIN)
            break;
        if (rc == SHMIPC_EEOF)
            return -1;
        if (rc < 0) {
            shm_fail("server: echo", rc);
            return -1;
        }
        chunks++;
        if (x->hdr_got == HDR && x->left == 0) {
            x->hdr_got = 0;
            if ((rc = shmipc_stream_flush(x->st)) < 0) {
                if (rc != SHMIPC_EEOF)
                    shm_fail("server: flush", rc);
                return -1;
            }
        }
    }
    if (chunks > 0)
        x->last_ns = now;
    return chunks;
}

/* Serves every stream of a session, reading empty ones as `probe` (enum probe) says. */
static int ssession_serve_all(struct ssession *ss, int probe, uint64_t now)
{
    int total = 0;
    for (int i = ss->n - 1; i >= 0; i--) {
        int rc = sstream_serve(&ss->streams[i], probe, now);
        if (rc < 0)
            sstream_close(ss, i);
        else
            total += rc;
    }
    return total;
}

/*
 * Takes the new streams and echoes what every stream has, reading empty streams as `probe`
 * says. The library reads the socket not only in process() but also inside a non-blocking
 * accept or read that finds nothing, and whatever that delivers (new streams, data) raises
 * no further poll() event: so every such call is followed by another accept and serve.
 * Returns the chunks served, or -1 when the session ended.
 */
int ssession_pump(struct ssession *ss, uint64_t now, int probe)
{
    /* Known streams first: their replies leave before the accept below reads the socket. */
    int served = ssession_serve_all(ss, PROBE_NONE, now);
    for (;;) {
        shmipc_stream *st;
        int rc;
        /* The accept that finds no stream reads the socket once more (recv). */
        while ((rc = shmipc_session_accept_stream(ss->s, 0, &st)) == 0) {
            if (grow((void **)&ss->streams, &ss->cap, ss->n + 1, sizeof *ss->streams) < 0) {
                shmipc_stream_close(st);
                fprintf(stderr, "shmipc-bench: server: out of memory\n");
                return -1;
            }
            ss->streams[ss->n++] = (struct sstream){.st = st, .last_ns = now};
        }
        if (rc != SHMIPC_EAGAIN) {
            if (rc != SHMIPC_ECONNRESET && rc != SHMIPC_ECLOSED)
                shm_fail("server: accept stream", rc);
            return -1;
        }
        served += ssession_serve_all(ss, PROBE_NONE, now);
        if (probe == PROBE_NONE)
            return served;
        /* Probing reads may read the socket: go round once more for what they delivered. */
        served += ssession_serve_all(ss, probe, now);
        probe = PROBE_NONE;
    }
}

/*
 * After shmipc_session_process() or shmipc_session_spin() returned rc: take new streams,
 * echo. -1 when the session ended.
 */
int ssession_took(struct ssession *ss, uint64_t now, int rc)
{
    if (rc < 0) {
        if (rc != SHMIPC_ECONNRESET && rc != SHMIPC_ECLOSED)
            shm_fail("server: session", rc);
        return -1;
    }
    if (rc == 0)
        return 0;
    if ((rc = ssession_pump(ss, now, PROBE_NONE)) != 0)
        return rc < 0 ? -1 : 0;
    /* Events but no data: streams were closed (or opened empty); probing finds the closed. */
    return ssession_pump(ss, now, PROBE_ALL) < 0 ? -1 : 0;
}

/* The session's descriptor fired: process, take new streams, echo. -1 when it ended. */
int ssession_ready(struct ssession *ss, uint64_t now)
{
    return ssession_took(ss, now, shmipc_session_process(ss->s));
}
