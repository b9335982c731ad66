/*
 * The front: WebSocket connections (docs/serve.md, "WebSocket through the front"). The
 * handshake goes to a worker as a REQUEST_HEAD with UPGRADE (front_request.c sends it and
 * reads the answer as any request's: a refusal is a normal response); the worker's
 * RESPONSE_HEAD 101 accepts it here (shmipc__server_ws_accept()), and from then on the
 * request is RQ_WS: the client's messages go to the worker as WS_DATA frames, the worker's
 * frames to the client, until the close handshake has gone both ways or either side is gone.
 *
 * Backpressure, without blocking the loop: a worker's next frame is read only while the
 * client connection has less than STREAM_MARK queued (else on_drain reads again); a client
 * message the session cannot take now (its queue or its shared memory full: frames never go
 * over the session's socket) waits in a queue of its own, the client's input is held
 * (shmipc__ws_hold()) and the queue is retried every RETRY_MS.
 *
 * Lifetimes: struct fws is the WebSocket callbacks' data and lives until both the request
 * (freed by front_request.c, which calls shmipc__front_ws_detach()) and the server's
 * WebSocket (its on_close) are done with it.
 * May call: front_request.c (abort, finish), front_session.c (a session down), the serve frame
 * codec, the server's WebSocket calls.
 */
#include "serve/front_int.h"

#include "common/error.h"
#include "common/log.h"
#include "net/ws_handshake.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/uio.h>

/*
 * A client's message goes to the worker in WS_DATA frames of at most this payload, each into
 * the session's shared memory only (ws_write): a small frame finds room where a 1 MiB one
 * would wait for most of the buffer to be free.
 */
#define WS_PIECE (64u << 10)

/* A frame for the worker waiting for room in the session's queue or shared memory. */
struct pend {
    struct pend *next;
    size_t len;
    uint8_t data[];
};

struct fws {
    struct freq *r; /* NULL once the request was freed */
    shmipc_ws *ws;  /* NULL once on_close ran */
    uint8_t got_end;
    uint8_t client_closed; /* the client's close (or its absence: ABORT) went to the worker */
    uint8_t worker_closed; /* the worker's WS_CLOSE came */
    uint8_t closed_client; /* a close frame went to the client */
    uint8_t held;          /* the client's input is held: frames wait in `ph` */
    uint8_t msg_op;        /* the worker's message in progress: TEXT or BINARY; 0 none */
    /* Inside shmipc__server_ws_accept(): the bytes behind the handshake are the client's
     * first frames and reach on_message/on_close from inside it, before the request is
     * RQ_WS. Their frames wait in `ph` (nothing is written or freed from in there), and
     * `gone` says the client left (1006, or no memory): the request is ended after it. */
    uint8_t accepting;
    uint8_t gone;
    uint8_t *msg;
    size_t msg_len, msg_cap;
    struct pend *ph, **pt;
    uint64_t close_until; /* loop ms: the worker's answer to the client's close is given up */
    /* Frames waiting (ph): since when none went out (loop ms), and the next retry's delay
     * (RETRY_MS doubling to HOLD_RETRY_MAX_MS; back to RETRY_MS when one goes out). */
    uint64_t stuck_since;
    unsigned retry_ms;
};

#define HOLD_RETRY_MAX_MS 16u

/* Frames wait from now: the deadline bound counts from here, retries from RETRY_MS. */
static void hold_restart(struct freq *r)
{
    struct fws *x = r->wsx;
    x->stuck_since = shmipc__loop_now_ms(r->t->loop);
    x->retry_ms = RETRY_MS;
}

/*
 * The worker's next frame is read only while the client has less than this queued. At most
 * the server's WebSocket send limit too: the server refuses a message once that much is
 * queued (SHMIPC_EAGAIN), and a message read from the worker then would be lost without a
 * word (a server configured with a send limit below STREAM_MARK dropped them all while its
 * client read slowly: `ws_send_limit_below_the_mark_loses_nothing`). Below the limit, each
 * message the front reads is taken whole, whatever its size.
 */
static size_t ws_mark(const struct shmipc__front *f)
{
    size_t mark = f->max_response < STREAM_MARK ? (size_t)f->max_response : STREAM_MARK;
    size_t limit = f->srv->ws_limits.tx_limit;
    return limit != 0 && limit < mark ? limit : mark;
}

/* ---- the handshake ---- */

/* 1 when the request is no valid handshake: the response is its 400 or 426. */
int shmipc__front_ws_refuse(shmipc_http_request *req, shmipc_http_response *res)
{
    struct shmipc__ws_handshake hs;
    if (shmipc__ws_handshake_check(&hs, req->r, NULL, 0) == 0 &&
        (req->r->flags & SHMIPC__HTTP_KEEP_ALIVE))
        return 0;
    /* ws_defer answers it: the same checks, and its response is the handler's. */
    struct shmipc__server_ticket unused;
    return shmipc__server_ws_defer(res, req, 0, NULL, NULL, &unused) == SHMIPC_EPROTO;
}

static int hdr_is(const struct shmipc__sf_field *fd, const char *name)
{
    size_t n = strlen(name);
    return fd->name_len == n && strncasecmp((const char *)fd->name, name, n) == 0;
}

static void fws_free(struct fws *x)
{
    while (x->ph != NULL) {
        struct pend *p = x->ph;
        x->ph = p->next;
        free(p);
    }
    free(x->msg);
    free(x);
}

static const struct shmipc__server_ws_cbs ws_cbs;
static int pend_flush(struct freq *r);

/* Gives the WebSocket up towards the client: 1011 unless a close went already. */
static void client_fail(struct fws *x, const char *why)
{
    if (x->ws != NULL && !x->closed_client) {
        x->closed_client = 1;
        (void)shmipc__ws_close(x->ws, 1011, why);
    }
}

/* A bad frame from the worker: the client gets 1011, the worker ABORT PROTOCOL. */
static void worker_protocol(struct freq *r)
{
    client_fail(r->wsx, "bad frame from the application");
    shmipc__front_req_abort(r, 0, SHMIPC__SF_ABORT_PROTOCOL);
}

/* The worker's 101 (a whole RESPONSE_HEAD frame, malloc'd: freed here). */
void shmipc__front_ws_accept(struct freq *r, uint8_t *head, size_t head_len)
{
    struct shmipc__sf_frame fr;
    struct shmipc__sf_field fd;
    struct shmipc__http_header_out h[SHMIPC__SERVER_MAX_RESP_HEADERS];
    uint32_t n = 0;
    struct fws *x = NULL;
    int rc = SHMIPC_EPROTO;
    if (shmipc__sf_decode(head, head_len, &fr) <= 0)
        goto bad;
    /* The handshake's fields are the server's (its Sec-WebSocket-Accept), the framing ones
     * mean nothing for a 101. An extension is the WebSocket's wire format, which is the
     * server's and has none: a worker's (permessage-deflate from a framework) would have the
     * client compress its frames and expect compressed ones. */
    struct shmipc__sf_fields it = fr.u.resp.fields;
    while (shmipc__sf_fields_next(&it, &fd)) {
        if (hdr_is(&fd, "Upgrade") || hdr_is(&fd, "Connection") ||
            hdr_is(&fd, "Sec-WebSocket-Accept") || hdr_is(&fd, "Content-Length") ||
            hdr_is(&fd, "Transfer-Encoding") || hdr_is(&fd, "Date") || hdr_is(&fd, "Server") ||
            hdr_is(&fd, "Keep-Alive") || hdr_is(&fd, "Sec-WebSocket-Extensions"))
            continue;
        if (n == SHMIPC__SERVER_MAX_RESP_HEADERS - 3)
            goto bad;
        h[n++] = (struct shmipc__http_header_out){(const char *)fd.name, (const char *)fd.value,
                                                  fd.name_len, fd.value_len};
    }
    if ((x = calloc(1, sizeof *x)) == NULL)
        goto bad;
    x->r = r;
    x->pt = &x->ph;
    r->wsx = x;
    x->accepting = 1;
    rc = shmipc__server_ws_accept(r->ticket, h, n, &ws_cbs, x, &x->ws);
    x->accepting = 0;
    if (rc < 0) {
        r->wsx = NULL;
        fws_free(x);
        goto bad;
    }
    free(head);
    r->live = 0;
    r->got_head = 1;
    r->state = RQ_WS;
    atomic_fetch_add(&r->fs->w->served, 1);
    if (x->gone) { /* the client left in its first bytes */
        atomic_fetch_add(&r->t->f->client_gone, 1);
        shmipc__front_req_abort(r, 0, SHMIPC__SF_ABORT_CLIENT_GONE);
        return;
    }
    /* The client's first frames, behind its handshake. */
    if (x->ph != NULL && pend_flush(r) < 0)
        return;
    /* END and the worker's first frames may be here already. */
    (void)shmipc__front_ws_read(r);
    return;
bad:
    free(head);
    /* A field the server refuses (502, ABORT PROTOCOL), or the server stopping: it answered
     * 503 itself, and the client is gone for the worker. */
    if (rc == SHMIPC_EPIPE)
        shmipc__front_req_abort(r, 0, SHMIPC__SF_ABORT_CLIENT_GONE);
    else
        shmipc__front_req_abort(r, 502, SHMIPC__SF_ABORT_PROTOCOL);
}

/* ---- client -> worker ---- */

/*
 * Writes a frame (a + b) to the worker's stream, into shared memory only: SHMIPC_ENOSHM when
 * it is full now (the frame then waits, as for a full queue). Over the socket, the reactor
 * thread would block while the worker does not read (up to the session's write timeout,
 * every connection of the thread with it), and shmipc would refuse the session's new streams
 * for 30 s. Every frame is at most WS_PIECE + a header, so it fits once the worker reads. A
 * stream on the socket already (the worker's frames came that way: shmipc keeps both
 * directions there, in order) goes on there, as a request's head does (front_request.c).
 */
static int ws_write(struct freq *r, const void *a, size_t alen, const void *b, size_t blen)
{
    if (r->st->fallback) {
        int rc = shmipc__stream_write(r->st, a, alen);
        return rc == 0 && blen > 0 ? shmipc__stream_write(r->st, b, blen) : rc;
    }
    struct iovec iov[2] = {{(void *)a, alen}, {(void *)b, blen}};
    return shmipc__stream_write_shm(r->st, iov, blen > 0 ? 2 : 1);
}

/* Writes the waiting frames while the session takes them: 0, or -1 when the request is gone. */
static int pend_flush(struct freq *r)
{
    struct fws *x = r->wsx;
    int wrote = 0, rc = 0;
    while (x->ph != NULL) {
        if (r->fs->s == NULL || !shmipc__session_can_send(r->fs->s))
            break;
        struct pend *p = x->ph;
        rc = ws_write(r, p->data, p->len, NULL, 0);
        if (rc == SHMIPC_ENOSHM) { /* the memory is full: the timer tries again */
            rc = 0;
            break;
        }
        if (rc < 0)
            break;
        wrote = 1;
        x->ph = p->next;
        if (x->ph == NULL)
            x->pt = &x->ph;
        free(p);
    }
    if (wrote) /* progress: the bound and the back-off start again */
        hold_restart(r);
    /* The client's close went to the worker only now (it waited behind the client's last
     * messages): the wait for the worker's answer starts now, not at the client's close. */
    if (wrote && x->ph == NULL && x->client_closed)
        x->close_until = shmipc__loop_now_ms(r->t->loop) + SHMIPC__FRONT_DRAIN_MS;
    if (rc == 0 && wrote)
        rc = shmipc__stream_flush(r->st);
    if (rc < 0) {
        shmipc__front_fs_down(r->fs, rc); /* frees r: the client gets 1011 (detach) */
        return -1;
    }
    if (x->ph == NULL && x->held) {
        x->held = 0;
        if (x->ws != NULL)
            (void)shmipc__ws_hold(x->ws, 0);
    }
    return 0;
}

/*
 * One frame to the worker, behind any that wait: 0, or -1 when the request is gone. The
 * session's queue or shared memory full: the frame waits (copied), the client's input is held.
 */
static int ws_out(struct freq *r, unsigned type, uint32_t arg, const void *data, size_t len)
{
    struct fws *x = r->wsx;
    uint8_t hdr[SHMIPC__SF_HDR_SIZE];
    if (shmipc__sf_encode_header(hdr, type, len, arg) < 0)
        return 0; /* cannot happen: sizes are the caller's and checked */
    if (!x->accepting && x->ph == NULL && r->fs->s != NULL && shmipc__session_can_send(r->fs->s)) {
        int rc = ws_write(r, hdr, sizeof hdr, data, len);
        if (rc == 0)
            rc = shmipc__stream_flush(r->st);
        if (rc == 0)
            return 0;
        if (rc != SHMIPC_ENOSHM) {
            shmipc__front_fs_down(r->fs, rc);
            return -1;
        }
        /* the memory is full: the frame waits with the others */
    }
    struct pend *p = malloc(sizeof *p + sizeof hdr + len);
    if (p == NULL) {
        client_fail(x, "out of memory");
        if (x->accepting) {
            x->gone = 1;
            x->client_closed = 1;
            return -1;
        }
        shmipc__front_req_abort(r, 0, SHMIPC__SF_ABORT_CLIENT_GONE);
        return -1;
    }
    p->next = NULL;
    p->len = sizeof hdr + len;
    memcpy(p->data, hdr, sizeof hdr);
    if (len > 0)
        memcpy(p->data + sizeof hdr, data, len);
    if (x->ph == NULL) /* the first to wait */
        hold_restart(r);
    *x->pt = p;
    x->pt = &p->next;
    if (!x->held) {
        x->held = 1;
        if (x->ws != NULL)
            (void)shmipc__ws_hold(x->ws, 1);
    }
    if (!shmipc__timer_active(&r->timer))
        shmipc__timer_start(&r->timer, RETRY_MS);
    return 0;
}

/* Both closes went their ways (and our last frame left): the stream closes. 1 when done. */
static int maybe_done(struct freq *r)
{
    struct fws *x = r->wsx;
    if (!x->client_closed || !x->worker_closed || x->ph != NULL)
        return 0;
    shmipc__front_req_finish(r);
    return 1;
}

static void on_message(shmipc_ws *ws, int kind, const void *data, size_t len, void *user_data)
{
    struct fws *x = user_data;
    struct freq *r = x->r;
    const uint8_t *p = data;
    (void)ws;
    if (r == NULL || (r->state != RQ_WS && !x->accepting) || x->client_closed)
        return;
    unsigned op = kind == SHMIPC_WS_TEXT ? SHMIPC__SF_WS_TEXT : SHMIPC__SF_WS_BINARY;
    size_t off = 0;
    do { /* a message in frames of at most WS_PIECE; an empty one is one empty frame */
        size_t n = len - off > WS_PIECE ? WS_PIECE : len - off;
        uint32_t arg =
            (off == 0 ? op : SHMIPC__SF_WS_CONT) | (off + n == len ? SHMIPC__SF_WS_FIN : 0);
        if (ws_out(r, SHMIPC__SF_WS_DATA, arg, p + off, n) < 0)
            return;
        off += n;
    } while (off < len);
}

static void on_close(shmipc_ws *ws, int code, const char *reason, size_t len, void *user_data)
{
    struct fws *x = user_data;
    struct freq *r = x->r;
    uint8_t buf[SHMIPC__SF_HDR_SIZE + 2 + SHMIPC__SF_MAX_CLOSE_REASON];
    (void)ws;
    x->ws = NULL;
    if (r == NULL) {
        fws_free(x);
        return;
    }
    if ((r->state != RQ_WS && !x->accepting) || x->client_closed)
        return;
    x->client_closed = 1;
    if (code == 1006 && x->accepting) {
        x->gone = 1; /* ended by shmipc__front_ws_accept() */
        return;
    }
    if (code == 1006) {
        /* Gone without a close frame (a FIN, a reset, the server's WebSocket timers): never
         * an empty WS_CLOSE, which would be "no code" (docs/serve.md). */
        atomic_fetch_add(&r->t->f->client_gone, 1);
        shmipc__front_req_abort(r, 0, SHMIPC__SF_ABORT_CLIENT_GONE);
        return;
    }
    /* The client's close (1005: it had no code), or the code the server failed it with. */
    long n = shmipc__sf_encode_ws_close(buf, sizeof buf, code == 1005 ? 0 : (uint16_t)code, reason,
                                        len > SHMIPC__SF_MAX_CLOSE_REASON ? 0 : len);
    if (n < (long)SHMIPC__SF_HDR_SIZE) {
        if (x->accepting)
            x->gone = 1;
        else
            shmipc__front_req_abort(r, 0, SHMIPC__SF_ABORT_CLIENT_GONE);
        return;
    }
    /* The payload only: ws_out writes the header. */
    if (ws_out(r, SHMIPC__SF_WS_CLOSE, 0, buf + SHMIPC__SF_HDR_SIZE,
               (size_t)n - SHMIPC__SF_HDR_SIZE) < 0)
        return;
    if (!x->accepting && maybe_done(r))
        return;
    /* The worker answers with its own WS_CLOSE; it is not waited for longer than an ABORT's
     * drain. */
    x->close_until = shmipc__loop_now_ms(r->t->loop) + SHMIPC__FRONT_DRAIN_MS;
    if (!shmipc__timer_active(&r->timer))
        shmipc__timer_start(&r->timer, x->ph != NULL ? RETRY_MS : SHMIPC__FRONT_DRAIN_MS);
}

static void on_drain(shmipc_ws *ws, void *user_data)
{
    struct fws *x = user_data;
    (void)ws;
    /* Read again from the loop, not from inside the server's send completion. */
    if (x->r != NULL && x->r->state == RQ_WS)
        shmipc__timer_start(&x->r->timer, 0);
}

static const struct shmipc__server_ws_cbs ws_cbs = {
    .on_message = on_message,
    .on_close = on_close,
    .on_drain = on_drain,
};

/* ---- worker -> client ---- */

/* A WS_DATA payload into the message being reassembled: 0, or -1 over the server's limit. */
static int msg_add(struct freq *r, const void *p, size_t n)
{
    struct fws *x = r->wsx;
    uint64_t max = r->t->f->srv->ws_limits.max_message;
    if (x->msg_len + n > max)
        return -1;
    if (x->msg_len + n > x->msg_cap) {
        size_t cap = x->msg_cap ? x->msg_cap : 4096;
        while (cap < x->msg_len + n)
            cap *= 2;
        uint8_t *nb = realloc(x->msg, cap);
        if (nb == NULL)
            return -1;
        x->msg = nb;
        x->msg_cap = cap;
    }
    if (n > 0)
        memcpy(x->msg + x->msg_len, p, n);
    x->msg_len += n;
    return 0;
}

/* The worker's WS_CLOSE payload (checked by the decoder): to the client, or the answer. */
static int worker_close(struct freq *r, const uint8_t *frame, size_t len)
{
    struct fws *x = r->wsx;
    struct shmipc__sf_frame fr;
    char reason[SHMIPC__SF_MAX_CLOSE_REASON + 1];
    if (shmipc__sf_decode(frame, len, &fr) <= 0 || x->worker_closed)
        return -1;
    x->worker_closed = 1;
    if (!x->client_closed && x->ws != NULL && !x->closed_client) {
        /* The worker closes first: the client gets its code (1000 for none) and reason; the
         * client's answer goes back to the worker from on_close. */
        memcpy(reason, fr.u.close.reason, fr.u.close.reason_len);
        reason[fr.u.close.reason_len] = '\0';
        x->closed_client = 1;
        (void)shmipc__ws_close(x->ws, fr.u.close.code ? fr.u.close.code : 1000, reason);
    }
    return 0;
}

/* Reads the worker's frames while the client takes them: 0, or -1 when the request ended
 * (it may be freed). */
int shmipc__front_ws_read(struct freq *r)
{
    struct fws *x = r->wsx;
    size_t mark = ws_mark(r->t->f);
    for (;;) {
        const void *p;
        int rc;
        /* Nothing more is read while the client has the mark queued: on_drain resumes. */
        if (x->ws != NULL && !x->closed_client && shmipc__ws_drain_at(x->ws, mark) == 0)
            return 0;
        if (!r->have_hdr) {
            rc = shmipc__stream_read_exact(r->st, SHMIPC__SF_HDR_SIZE, &p, SHMIPC_NONBLOCK);
            if (rc == SHMIPC_EAGAIN)
                return 0;
            if (rc < 0)
                goto ended;
            memcpy(r->hdr, p, sizeof r->hdr);
            rc = shmipc__sf_decode_header(r->hdr, sizeof r->hdr, &r->fh);
            shmipc__stream_release(r->st);
            if (rc < 0)
                goto protocol;
            r->have_hdr = 1;
        }
        uint32_t len = r->fh.length;
        p = NULL;
        if (len > 0) {
            rc = shmipc__stream_read_exact(r->st, len, &p, SHMIPC_NONBLOCK);
            if (rc == SHMIPC_EAGAIN)
                return 0;
            if (rc < 0)
                goto ended;
        }
        r->have_hdr = 0;
        unsigned type = r->fh.type;
        if (type != SHMIPC__SF_END && type != SHMIPC__SF_ABORT && !x->got_end) {
            if (len > 0)
                shmipc__stream_release(r->st);
            goto protocol; /* frames before the 101's END */
        }
        switch (type) {
        case SHMIPC__SF_END:
            if (x->got_end)
                goto protocol;
            x->got_end = 1;
            break;
        case SHMIPC__SF_WS_DATA: {
            unsigned op = r->fh.arg & 0xffu, fin = (r->fh.arg & SHMIPC__SF_WS_FIN) != 0;
            if ((op == SHMIPC__SF_WS_CONT) != (x->msg_op != 0) || op > SHMIPC__SF_WS_BINARY) {
                if (len > 0)
                    shmipc__stream_release(r->st);
                goto protocol;
            }
            if (op != SHMIPC__SF_WS_CONT)
                x->msg_op = (uint8_t)op;
            rc = msg_add(r, p, len);
            if (len > 0)
                shmipc__stream_release(r->st);
            if (rc < 0) {
                client_fail(x, "message too large");
                shmipc__front_req_abort(r, 0, SHMIPC__SF_ABORT_TOO_LARGE);
                return -1;
            }
            if (!fin)
                break;
            int kind = x->msg_op == SHMIPC__SF_WS_TEXT ? SHMIPC_WS_TEXT : SHMIPC_WS_BINARY;
            x->msg_op = 0;
            /* After a close either way the client takes no more messages: dropped. */
            rc = x->ws != NULL && !x->closed_client
                     ? shmipc__ws_send(x->ws, kind, x->msg, x->msg_len)
                     : 0;
            x->msg_len = 0;
            if (x->msg_cap > (64u << 10)) { /* a large message's buffer is not kept */
                free(x->msg);
                x->msg = NULL;
                x->msg_cap = 0;
            }
            if (rc == SHMIPC_EINVAL)
                goto protocol; /* text that is not UTF-8 */
            break;
        }
        case SHMIPC__SF_WS_PING:
        case SHMIPC__SF_WS_PONG:
            if (x->ws != NULL && !x->closed_client)
                (void)(type == SHMIPC__SF_WS_PING ? shmipc__ws_ping(x->ws, p, len)
                                                  : shmipc__ws_pong(x->ws, p, len));
            if (len > 0)
                shmipc__stream_release(r->st);
            break;
        case SHMIPC__SF_WS_CLOSE: {
            uint8_t frame[SHMIPC__SF_HDR_SIZE + 2 + SHMIPC__SF_MAX_CLOSE_REASON];
            memcpy(frame, r->hdr, SHMIPC__SF_HDR_SIZE);
            if (len > 0)
                memcpy(frame + SHMIPC__SF_HDR_SIZE, p, len);
            if (len > 0)
                shmipc__stream_release(r->st);
            if (worker_close(r, frame, SHMIPC__SF_HDR_SIZE + len) < 0)
                goto protocol;
            if (maybe_done(r))
                return -1;
            break;
        }
        case SHMIPC__SF_ABORT:
            if (len > 0)
                shmipc__stream_release(r->st);
            /* The worker gave the socket up (the application failed): 1011, and its close of
             * the stream follows. */
            client_fail(x, "application error");
            shmipc__front_req_finish(r);
            return -1;
        default:
            if (len > 0)
                shmipc__stream_release(r->st);
            goto protocol;
        }
    }
ended:
    /* The worker's stream or session ended without a close: 1011 (detach). */
    if (shmipc__session_status(r->fs->s) < 0) {
        shmipc__front_fs_down(r->fs, shmipc__session_status(r->fs->s));
        return -1;
    }
    client_fail(x, "application gone");
    shmipc__front_req_finish(r);
    return -1;
protocol:
    worker_protocol(r);
    return -1;
}

/* The request's timer while RQ_WS: frames waiting for room, a held-back read, the wait for the
 * worker's answer to the client's close. */
void shmipc__front_ws_timer(struct freq *r)
{
    struct fws *x = r->wsx;
    if (pend_flush(r) < 0)
        return;
    if (maybe_done(r))
        return;
    uint64_t now = shmipc__loop_now_ms(r->t->loop);
    /* Only once the client's close went: while it waits behind the client's last messages
     * for room in the session, the deadline below bounds the wait, and the worker gets them
     * all and the close once it reads again. Before, the 5 s ran from the client's close: a
     * worker that read nothing for 5 s lost the client's last messages and its close, while
     * the client had its close answered (`ws_client_close_behind_held_messages_reaches_worker`). */
    if (x->client_closed && x->ph == NULL && x->close_until != 0 && now >= x->close_until) {
        shmipc__front_req_finish(r); /* the worker never answered the close: the stream closes */
        return;
    }
    uint32_t deadline = atomic_load(&r->t->f->deadline_ms);
    if (x->ph != NULL && deadline != 0 && now - x->stuck_since >= deadline) {
        /* The worker took none of the client's frames for a request deadline (it reads
         * nothing, or a slow client's answers fill the session's memory): as nginx's
         * proxy_send_timeout, the connection ends. 1011 to the client, TIMEOUT to the
         * worker; the held frames are dropped with the request. */
        atomic_fetch_add(&r->t->f->timeouts, 1);
        client_fail(x, "the application took no message in time");
        shmipc__front_req_abort(r, 0, SHMIPC__SF_ABORT_TIMEOUT);
        return;
    }
    if (shmipc__front_ws_read(r) < 0)
        return; /* ended: the request may be freed */
    if (x->ph != NULL) {
        shmipc__timer_start(&r->timer, x->retry_ms);
        x->retry_ms = x->retry_ms * 2 > HOLD_RETRY_MAX_MS ? HOLD_RETRY_MAX_MS : x->retry_ms * 2;
    } else if (x->client_closed && x->close_until > now)
        shmipc__timer_start(&r->timer, x->close_until - now);
}

/* The request is freed (front_request.c): the client is told unless both closes are done. */
void shmipc__front_ws_detach(struct freq *r)
{
    struct fws *x = r->wsx;
    shmipc__front_req_log_ws(r);
    r->wsx = NULL;
    x->r = NULL;
    client_fail(x, "application gone");
    if (x->ws == NULL)
        fws_free(x);
}
