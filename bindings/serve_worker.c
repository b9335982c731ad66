/*
 * The worker's side of one shmipc-serve exchange (shmipc_serve.h, "Handlers"; docs/serve.md,
 * "The C worker"): read and check the REQUEST_HEAD, run a handler, and answer what the
 * protocol asks of a worker whatever the handler does: END, a complete 500, ABORT
 * WORKER_ERROR, ABORT PROTOCOL, and the bounded drains of "ABORT". The C worker program and
 * the Lua worker run every request through here, so both behave as the Python worker does.
 */
#include "shmipc_serve.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"

/* After its own ABORT the worker waits this long for the front to end its side. */
#define ABORT_DRAIN_MS 5000

static const char error_body[] = "Internal Server Error\n";

struct shmipc_serve_exchange {
    shmipc_stream *st;
    const shmipc_serve_request *req;
    uint64_t frame_left; /* unread payload bytes of the current BODY frame */
    uint64_t received;   /* request body bytes in the BODY frames so far */
    uint64_t length;     /* the response's content_length, with has_length */
    uint64_t sent;       /* body bytes the handler wrote */
    uint32_t abort_reason;
    unsigned done : 1;       /* the front's END or ABORT was read, or its stream ended */
    unsigned gone : 1;       /* the front aborted, or the stream ended: send nothing more */
    unsigned protocol : 1;   /* the front sent a bad frame */
    unsigned failed : 1;     /* the handler broke a rule of the API (more than its length) */
    unsigned head_sent : 1;  /* RESPONSE_HEAD went out */
    unsigned bodyless : 1;   /* HEAD, 204, 304: no BODY frames */
    unsigned has_length : 1; /* the head had CONTENT_LENGTH */
};

static int is_method(const shmipc_serve_request *r, const char *m)
{
    size_t n = strlen(m);
    return r->method_len == n && memcmp(r->method, m, n) == 0;
}

/* The stream failed under us (the front closed it, the session ended, a timeout). */
static int lost(shmipc_serve_exchange *x)
{
    x->done = x->gone = 1;
    return SHMIPC_ECONNRESET;
}

/*
 * The stream calls, waited again when a signal interrupted the wait (SHMIPC_EINTR): a signal
 * that lands on the handler's thread (a process's SIGTERM may land on any thread) has been
 * handled when the call returns, and the request goes on; a stop is after it. Nothing was
 * consumed or sent when a wait returns SHMIPC_EINTR.
 */
static int read_chunk(shmipc_serve_exchange *x, size_t max, const void **p, size_t *len, int flags)
{
    int rc;
    do
        rc = shmipc_stream_read_chunk(x->st, max, p, len, flags);
    while (rc == SHMIPC_EINTR);
    return rc;
}

static int read_exact(shmipc_serve_exchange *x, size_t n, const void **p, int flags)
{
    int rc;
    do
        rc = shmipc_stream_read_exact_bytes(x->st, n, p, flags);
    while (rc == SHMIPC_EINTR);
    return rc;
}

static int flush(shmipc_serve_exchange *x)
{
    int rc;
    do
        rc = shmipc_stream_flush(x->st);
    while (rc == SHMIPC_EINTR);
    return rc;
}

/* Reads and drops n bytes (an ABORT text, an unread BODY payload). */
static int skip(shmipc_serve_exchange *x, uint64_t n)
{
    while (n > 0) {
        const void *p;
        size_t len;
        int rc = read_chunk(x, n > (1u << 20) ? (1u << 20) : (size_t)n, &p, &len, 0);
        if (rc < 0)
            return lost(x);
        n -= len;
        shmipc_stream_release(x->st);
    }
    return 0;
}

/* Reads one frame header; SHMIPC_EAGAIN when nonblocking and none is there. */
static int read_header(shmipc_serve_exchange *x, int flags, shmipc_serve_frame *f)
{
    const void *p;
    int rc = read_exact(x, SHMIPC_SERVE_HDR_SIZE, &p, flags);
    if (rc == SHMIPC_EAGAIN && flags != 0)
        return SHMIPC_EAGAIN;
    if (rc < 0)
        return lost(x);
    f->size = sizeof *f;
    rc = shmipc_serve_decode_header(p, SHMIPC_SERVE_HDR_SIZE, f);
    shmipc_stream_release(x->st);
    if (rc < 0) {
        x->protocol = 1;
        return SHMIPC_EPROTO;
    }
    return 0;
}

/* The front's ABORT: its text is read and dropped, then nothing more is read or sent. */
static int aborted(shmipc_serve_exchange *x, const shmipc_serve_frame *f)
{
    x->abort_reason = f->arg;
    skip(x, f->length);
    x->done = 1;
    return lost(x);
}

/*
 * Moves to request body bytes: 1 when a BODY frame has unread bytes, 0 at the request's END,
 * SHMIPC_EAGAIN (nonblocking, nothing there yet), SHMIPC_ECONNRESET, SHMIPC_EPROTO.
 */
static int advance(shmipc_serve_exchange *x, int flags)
{
    while (x->frame_left == 0) {
        if (x->gone)
            return SHMIPC_ECONNRESET;
        if (x->protocol)
            return SHMIPC_EPROTO;
        if (x->done)
            return 0;
        shmipc_serve_frame f;
        int rc = read_header(x, flags, &f);
        if (rc < 0)
            return rc;
        /* With CONTENT_LENGTH the head states the body's exact length: a body that runs past
         * it or ends short of it is a bad frame, not a body to hand the handler. */
        int exact = (x->req->flags & SHMIPC_SERVE_REQ_CONTENT_LENGTH) != 0;
        if (f.type == SHMIPC_SERVE_END) {
            if (exact && x->received != x->req->content_length) {
                x->protocol = 1;
                return SHMIPC_EPROTO;
            }
            x->done = 1;
            return 0;
        }
        if (f.type == SHMIPC_SERVE_ABORT)
            return aborted(x, &f);
        if (f.type != SHMIPC_SERVE_BODY || !(x->req->flags & SHMIPC_SERVE_REQ_HAS_BODY) ||
            (exact && f.length > x->req->content_length - x->received)) {
            x->protocol = 1;
            return SHMIPC_EPROTO;
        }
        x->received += f.length;
        x->frame_left = f.length;
    }
    return 1;
}

/*
 * Without waiting: has the front aborted? Reads only frame headers: a BODY frame's payload
 * stays in the stream for the handler, so nothing is buffered, and nothing behind unread body
 * bytes can be seen (the front's ABORT is seen once the handler has read up to it).
 */
static int check_abort(shmipc_serve_exchange *x)
{
    for (;;) {
        if (x->gone)
            return SHMIPC_ECONNRESET;
        if (x->protocol)
            return SHMIPC_EPROTO;
        if (x->frame_left > 0)
            return 0;
        if (!x->done) {
            int rc = advance(x, SHMIPC_NONBLOCK);
            if (rc == SHMIPC_EAGAIN || rc == 1)
                return 0;
            if (rc < 0)
                return rc;
            continue; /* the request's END: an ABORT may follow it */
        }
        shmipc_serve_frame f;
        int rc = read_header(x, SHMIPC_NONBLOCK, &f);
        if (rc == SHMIPC_EAGAIN)
            return 0;
        if (rc < 0)
            return rc;
        if (f.type == SHMIPC_SERVE_ABORT)
            return aborted(x, &f);
        x->protocol = 1; /* anything else after the request's END */
        return SHMIPC_EPROTO;
    }
}

/* Appends to the stream's send buffer; nothing goes out before send_now() or a flush. */
static int queue(shmipc_serve_exchange *x, const void *a, size_t alen, const void *b, size_t blen)
{
    if ((alen > 0 && shmipc_stream_write(x->st, a, alen) < 0) ||
        (blen > 0 && shmipc_stream_write(x->st, b, blen) < 0))
        return lost(x);
    return 0;
}

static int send_now(shmipc_serve_exchange *x, const void *a, size_t alen, const void *b,
                    size_t blen)
{
    if (queue(x, a, alen, b, blen) < 0 || flush(x) < 0)
        return lost(x);
    return 0;
}

/* After our END (or ABORT): the rest of the request, so both sides ended before the close. */
static void drain(shmipc_serve_exchange *x)
{
    while (!x->done && !x->gone && !x->protocol) {
        int rc = advance(x, 0);
        if (rc != 1)
            break;
        uint64_t n = x->frame_left;
        x->frame_left = 0;
        if (skip(x, n) < 0)
            break;
    }
}

static void send_abort(shmipc_serve_exchange *x, uint32_t reason, const char *text)
{
    uint8_t buf[SHMIPC_SERVE_HDR_SIZE + 128];
    size_t tl = strlen(text);
    if (tl > sizeof buf - SHMIPC_SERVE_HDR_SIZE)
        tl = sizeof buf - SHMIPC_SERVE_HDR_SIZE;
    int64_t n = shmipc_serve_encode_frame(buf, sizeof buf, SHMIPC_SERVE_ABORT, reason, text, tl);
    if (n < 0 || send_now(x, buf, (size_t)n, NULL, 0) < 0)
        return;
    if (reason != SHMIPC_SERVE_ABORT_PROTOCOL) {
        shmipc_stream_set_timeout(x->st, SHMIPC_TIMEOUT_READ, ABORT_DRAIN_MS);
        drain(x);
    }
}

SHMIPC_API const shmipc_serve_request *shmipc_serve_exchange_request(shmipc_serve_exchange *x)
{
    return x != NULL ? x->req : NULL;
}

SHMIPC_API int64_t shmipc_serve_read(shmipc_serve_exchange *x, void *buf, size_t cap)
{
    if (x == NULL || buf == NULL || cap == 0)
        return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_read: NULL or cap 0");
    int rc = advance(x, 0);
    if (rc <= 0)
        return rc;
    const void *p;
    size_t len;
    size_t want = cap < x->frame_left ? cap : (size_t)x->frame_left;
    if (read_chunk(x, want, &p, &len, 0) < 0)
        return lost(x);
    memcpy(buf, p, len);
    shmipc_stream_release(x->st);
    x->frame_left -= len;
    return (int64_t)len;
}

SHMIPC_API int shmipc_serve_respond(shmipc_serve_exchange *x, const shmipc_serve_response *r,
                                    const shmipc_serve_field *fields, size_t nfields)
{
    if (x == NULL || r == NULL || r->size < sizeof *r)
        return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_respond: NULL or r->size too small");
    if (x->head_sent || x->failed)
        return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_respond: the head was sent already");
    if (r->status < 200 || r->status > 599)
        return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_respond: status %u is not 200..599",
                            (unsigned)r->status);
    int rc = check_abort(x);
    if (rc < 0)
        return rc;
    /* Most heads fit the stack; the largest (64 KiB) take the heap. */
    uint8_t small[2048], *buf = small;
    int64_t n = shmipc_serve_encode_response_head(small, sizeof small, r, fields, nfields);
    if (n == SHMIPC_EMSGSIZE) {
        if ((buf = malloc(SHMIPC_SERVE_HDR_SIZE + SHMIPC_SERVE_MAX_HEAD)) == NULL)
            return SHMIPC_ENOMEM;
        n = shmipc_serve_encode_response_head(buf, SHMIPC_SERVE_HDR_SIZE + SHMIPC_SERVE_MAX_HEAD, r,
                                              fields, nfields);
    }
    /*
     * Queued, not flushed: it goes out with the first body piece (or the END), one message and
     * one wakeup of the front rather than two or three, as the WSGI worker sends its head.
     */
    rc = n < 0 ? (int)n : queue(x, buf, (size_t)n, NULL, 0);
    if (buf != small)
        free(buf);
    if (rc < 0)
        return rc;
    x->head_sent = 1;
    x->bodyless = is_method(x->req, "HEAD") || r->status == 204 || r->status == 304;
    x->has_length = (r->flags & SHMIPC_SERVE_RESP_CONTENT_LENGTH) != 0;
    x->length = r->content_length;
    return 0;
}

SHMIPC_API int shmipc_serve_write(shmipc_serve_exchange *x, const void *data, size_t len)
{
    if (x == NULL || (data == NULL && len > 0))
        return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_write: NULL");
    if (!x->head_sent)
        return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_write: no response head yet");
    if (x->failed)
        return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_write: the response failed already");
    int rc = check_abort(x);
    if (rc < 0 || len == 0 || x->bodyless)
        return rc;
    if (x->has_length && (len > x->length || x->sent > x->length - len)) {
        x->failed = 1;
        return shmipc__fail(SHMIPC_EINVAL,
                            "shmipc_serve_write: more body than the content_length of %llu",
                            (unsigned long long)x->length);
    }
    const uint8_t *p = data;
    /* The piece that completes a declared length waits for the END: one message for both. */
    int last = x->has_length && x->sent + len == x->length;
    for (size_t off = 0; off < len;) {
        size_t piece = len - off < SHMIPC_SERVE_MAX_CHUNK ? len - off : SHMIPC_SERVE_MAX_CHUNK;
        uint8_t hdr[SHMIPC_SERVE_HDR_SIZE];
        shmipc_serve_encode_header(hdr, sizeof hdr, SHMIPC_SERVE_BODY, piece, 0);
        rc = last && off + piece == len ? queue(x, hdr, sizeof hdr, p + off, piece)
                                        : send_now(x, hdr, sizeof hdr, p + off, piece);
        if (rc < 0)
            return rc;
        off += piece;
    }
    x->sent += len;
    return 0;
}

/* A complete 500: the handler failed before its head. */
static void send_500(shmipc_serve_exchange *x)
{
    static const uint8_t ct_name[] = "Content-Type", ct_value[] = "text/plain; charset=utf-8";
    shmipc_serve_field ct = {ct_name, ct_value, sizeof ct_name - 1, sizeof ct_value - 1};
    shmipc_serve_response r = {.size = sizeof r,
                               .status = 500,
                               .flags = SHMIPC_SERVE_RESP_CONTENT_LENGTH,
                               .content_length = sizeof error_body - 1};
    uint8_t end[SHMIPC_SERVE_HDR_SIZE];
    if (shmipc_serve_respond(x, &r, &ct, 1) < 0 ||
        shmipc_serve_write(x, error_body, sizeof error_body - 1) < 0)
        return;
    shmipc_serve_encode_header(end, sizeof end, SHMIPC_SERVE_END, 0, 0);
    if (send_now(x, end, sizeof end, NULL, 0) == 0)
        drain(x);
}

/* Reads the REQUEST_HEAD whole into *head (malloc'd); an outcome when there is none. */
static int read_head(shmipc_serve_exchange *x, uint8_t **head, shmipc_serve_request *req)
{
    shmipc_serve_frame f;
    const void *p;
    int rc = read_header(x, 0, &f);
    if (rc == SHMIPC_EPROTO)
        return SHMIPC_SERVE_OUTCOME_PROTOCOL;
    if (rc < 0)
        return SHMIPC_SERVE_OUTCOME_ABORTED;
    if (f.type == SHMIPC_SERVE_ABORT) {
        /* A late ABORT for an exchange already over on our side (docs/serve.md, "Streams"). */
        skip(x, f.length);
        return SHMIPC_SERVE_OUTCOME_LATE;
    }
    if (f.type != SHMIPC_SERVE_REQUEST_HEAD) {
        x->protocol = 1;
        return SHMIPC_SERVE_OUTCOME_PROTOCOL;
    }
    uint8_t *buf = malloc(SHMIPC_SERVE_HDR_SIZE + (size_t)f.length);
    if (buf == NULL)
        return SHMIPC_ENOMEM;
    *head = buf;
    /* decode_header accepted these 12 bytes; rebuilt rather than kept (the read pointer
     * does not outlive the next read). Little-endian, as on the wire. */
    const uint32_t w[2] = {f.length, f.arg};
    buf[0] = 0x53;
    buf[1] = 0x56;
    buf[2] = 1;
    buf[3] = (uint8_t)f.type;
    for (int i = 0; i < 8; i++)
        buf[4 + i] = (uint8_t)(w[i / 4] >> (8 * (i % 4)));
    if (read_exact(x, f.length, &p, 0) < 0) {
        lost(x);
        return SHMIPC_SERVE_OUTCOME_ABORTED;
    }
    memcpy(buf + SHMIPC_SERVE_HDR_SIZE, p, f.length);
    shmipc_stream_release(x->st);
    req->size = sizeof *req;
    if (shmipc_serve_decode_request(buf, SHMIPC_SERVE_HDR_SIZE + (size_t)f.length, req) <= 0) {
        x->protocol = 1;
        return SHMIPC_SERVE_OUTCOME_PROTOCOL;
    }
    return -1; /* a request to serve */
}

SHMIPC_API int shmipc_serve_handle_stream(shmipc_stream *st, shmipc_serve_handler handler,
                                          void *user_data)
{
    if (st == NULL || handler == NULL) {
        shmipc_stream_close(st);
        return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_handle_stream: NULL");
    }
    shmipc_serve_exchange x = {.st = st};
    shmipc_serve_request req = {.size = sizeof req};
    uint8_t *head = NULL;
    int outcome = read_head(&x, &head, &req);
    if (outcome == SHMIPC_SERVE_OUTCOME_PROTOCOL) {
        shmipc__log(SHMIPC_LOG_ERROR, "shmipc-serve: a bad frame from the front");
        send_abort(&x, SHMIPC_SERVE_ABORT_PROTOCOL, "bad request head");
    }
    if (outcome != -1)
        goto out;
    x.req = &req;
    int rc = handler(&x, user_data);
    if (x.gone) {
        outcome = SHMIPC_SERVE_OUTCOME_ABORTED;
    } else if (x.protocol) {
        shmipc__log(SHMIPC_LOG_ERROR, "shmipc-serve: a bad frame from the front in a request body");
        send_abort(&x, SHMIPC_SERVE_ABORT_PROTOCOL, "bad frame in the request");
        outcome = SHMIPC_SERVE_OUTCOME_PROTOCOL;
    } else if (rc < 0 || x.failed || !x.head_sent ||
               (x.has_length && !x.bodyless && x.sent != x.length)) {
        const char *why = rc < 0         ? "the handler failed"
                          : x.failed     ? "the handler wrote more than its content length"
                          : !x.head_sent ? "the handler returned without a response"
                                         : "the handler wrote less than its content length";
        shmipc__log(SHMIPC_LOG_ERROR, "shmipc-serve: %.*s %.*s: %s (%d)", (int)req.method_len,
                    (const char *)req.method, (int)(req.target_len > 200 ? 200 : req.target_len),
                    (const char *)req.target, why, rc);
        if (!x.head_sent)
            send_500(&x);
        else
            send_abort(&x, SHMIPC_SERVE_ABORT_WORKER_ERROR, why);
        outcome = SHMIPC_SERVE_OUTCOME_ERROR;
    } else {
        uint8_t end[SHMIPC_SERVE_HDR_SIZE];
        shmipc_serve_encode_header(end, sizeof end, SHMIPC_SERVE_END, 0, 0);
        if (send_now(&x, end, sizeof end, NULL, 0) == 0)
            drain(&x);
        outcome = x.gone       ? SHMIPC_SERVE_OUTCOME_ABORTED
                  : x.protocol ? SHMIPC_SERVE_OUTCOME_PROTOCOL
                               : SHMIPC_SERVE_OUTCOME_OK;
    }
out:
    free(head);
    shmipc_stream_close(st);
    return outcome;
}
