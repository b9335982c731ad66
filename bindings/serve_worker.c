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
#include <strings.h>
#include <time.h>

#include "common/error.h"
#include "common/log.h"
#include "ipc/session.h"
#include "net/serve_frame.h"
#include "net/ws_codec.h"

/* After its own END or ABORT the worker waits this long for the front to end its side; after
 * its own WebSocket close, this long for the front's answering close. */
#define ABORT_DRAIN_MS   5000
#define WS_CLOSE_WAIT_MS 5000
/* A WebSocket upgrade's END (and any body) before the 101: all of it within this long. */
#define UPGRADE_END_MS 5000
/* A stream's first frame (the REQUEST_HEAD, a HELLO, a late ABORT): all of it within this long
 * of the stream's accept. */
#define HEAD_READ_MS 5000
/* The front's ABORT, its header read: its text within this long (unless a drain's deadline
 * is sooner). */
#define ABORT_TEXT_MS 5000
/* The bytes of a WebSocket frame whose header came: each read of them waits this long. */
#define WS_PAYLOAD_MS 5000
/* A WebSocket wait wakes this often to see shmipc_serve_shutdown(). */
#define WS_POLL_MS 100

/* Set by shmipc_serve_shutdown() (a signal handler may call it): every WebSocket closes 1001. */
static int ws_shutdown_flag;

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
    /* WebSocket (after shmipc_serve_ws_accept) */
    unsigned ws : 1; /* the 101 went out */
    unsigned ws_sent_close : 1;
    unsigned ws_app_closed : 1; /* the handler called shmipc_serve_ws_close() */
    unsigned ws_got_close : 1;  /* the front's WS_CLOSE was read */
    unsigned ws_fin : 1;        /* the WS_DATA frame being read ends its message */
    uint32_t ws_msg_op;         /* opcode of the client's message in progress, 0 between */
    uint32_t ws_code;           /* shmipc_serve_ws_closed()'s code */
    uint32_t ws_reason_len;
    uint8_t ws_reason[SHMIPC_SERVE_MAX_CLOSE_REASON];
    int64_t ws_close_by; /* going away: when the front's answer to our 1001 is given up, or 0 */
    /* after our END or ABORT, before a 101 (the upgrade's END), or in a WebSocket's last wait:
     * when reads end, or 0 */
    int64_t drain_by;
};

static int64_t mono_ms(void);

static int is_method(const shmipc_serve_request *r, const char *m)
{
    size_t n = strlen(m);
    return r->method_len == n && memcmp(r->method, m, n) == 0;
}

static void ws_read_last(shmipc_serve_exchange *x);

/* The stream failed under us (the front closed it, the session ended, a timeout). A WebSocket
 * whose close was not read yet looks for it in what is left first (ws_read_last). */
static int lost(shmipc_serve_exchange *x)
{
    int first = !x->gone;
    x->done = x->gone = 1;
    if (first && x->ws && !x->ws_got_close && !x->protocol)
        ws_read_last(x);
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

/*
 * After our END or ABORT the drain has one deadline (docs/serve.md, "ABORT": "for at most 5
 * seconds"): each read waits only what is left of it, and none starts once it passed. A
 * per-read timeout alone (or none, after our END) let a front that trickles a body (a frame
 * every few seconds, never END) hold the worker, which serves one request at a time, for as
 * long as it liked. The
 * last wait of a WebSocket (for the front's answer to the close of a worker going away, or
 * of a handler that returned) has one too, for the same reason: a frame's payload trickled
 * behind its header. 0 when the time is up (the stream is then given up), else 1.
 */
static int drain_time_left(shmipc_serve_exchange *x)
{
    if (x->drain_by == 0)
        return 1;
    int64_t left = x->drain_by - mono_ms();
    if (left <= 0)
        return 0;
    shmipc_stream_set_timeout(x->st, SHMIPC_TIMEOUT_READ, (int)left);
    return 1;
}

/* Reads and drops n bytes (an ABORT text, an unread BODY payload). */
static int skip(shmipc_serve_exchange *x, uint64_t n)
{
    while (n > 0) {
        const void *p;
        size_t len;
        if (!drain_time_left(x))
            return lost(x);
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

/*
 * The front's ABORT: its text is read and dropped, then nothing more is read or sent. The text
 * by drain_by when a deadline holds already (a drain's, a WebSocket's last wait), else within
 * ABORT_TEXT_MS: the front sends a frame whole. Before, a handler's respond() or write() that
 * saw the ABORT's header (check_abort()) read its text with the stream's read timeout (none in
 * our workers), and a front that sent the header and part of the text held the worker.
 */
static int aborted(shmipc_serve_exchange *x, const shmipc_serve_frame *f)
{
    x->abort_reason = f->arg;
    if (x->drain_by == 0)
        x->drain_by = mono_ms() + ABORT_TEXT_MS;
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

/* After our END (or ABORT): the rest of the request, so both sides ended before the close,
 * by drain_by when it is set (drain_after_end(), send_abort()). */
static void drain(shmipc_serve_exchange *x)
{
    while (!x->done && !x->gone && !x->protocol) {
        if (!drain_time_left(x)) {
            lost(x);
            break;
        }
        int rc = advance(x, 0);
        if (rc != 1)
            break;
        uint64_t n = x->frame_left;
        x->frame_left = 0;
        if (skip(x, n) < 0)
            break;
    }
}

/* After our END: drain() within ABORT_DRAIN_MS; past it the stream is given up (closed). */
static void drain_after_end(shmipc_serve_exchange *x)
{
    x->drain_by = mono_ms() + ABORT_DRAIN_MS;
    drain(x);
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
        x->drain_by = mono_ms() + ABORT_DRAIN_MS;
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
    if (x->ws) /* the upgrade's body was read before the 101: the stream is frames now */
        return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_read: a WebSocket: shmipc_serve_ws_recv");
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
    if (x->ws)
        return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_write: a WebSocket: shmipc_serve_ws_send");
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

/* ---- WebSocket (docs/serve.md, "WebSocket in the C and Lua workers") ----------------------- */

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int name_is(const uint8_t *name, size_t n, const char *lit)
{
    return strlen(lit) == n && strncasecmp((const char *)name, lit, n) == 0;
}

/* Is `p` (n bytes) one of the subprotocols the client offered (Sec-WebSocket-Protocol fields,
 * split at commas)? Compared exactly: RFC 6455 subprotocol names are case-sensitive. */
static int offered(const shmipc_serve_request *r, const char *p, size_t n)
{
    shmipc_serve_fields it = r->fields;
    shmipc_serve_field f;
    while (shmipc_serve_fields_next(&it, &f) == 1) {
        if (!name_is(f.name, f.name_len, "sec-websocket-protocol"))
            continue;
        const uint8_t *v = f.value, *end = f.value + f.value_len;
        while (v < end) {
            const uint8_t *c = memchr(v, ',', (size_t)(end - v));
            const uint8_t *e = c != NULL ? c : end;
            const uint8_t *a = v, *b = e;
            while (a < b && (*a == ' ' || *a == '\t'))
                a++;
            while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
                b--;
            if ((size_t)(b - a) == n && n > 0 && memcmp(a, p, n) == 0)
                return 1;
            v = c != NULL ? c + 1 : end;
        }
    }
    return 0;
}

/* The handler's 101 fields the front owns (the handshake's and the framing's). */
static int ws_dropped(const shmipc_serve_field *f)
{
    static const char *const hop[] = {
        "connection", "keep-alive", "transfer-encoding", "te",
        "trailer",    "upgrade",    "content-length",    "proxy-connection"};
    for (size_t i = 0; i < sizeof hop / sizeof hop[0]; i++)
        if (name_is(f->name, f->name_len, hop[i]))
            return 1;
    return f->name_len >= 14 && strncasecmp((const char *)f->name, "sec-websocket-", 14) == 0;
}

SHMIPC_API int shmipc_serve_ws_accept(shmipc_serve_exchange *x, const char *subprotocol,
                                      const shmipc_serve_field *fields, size_t nfields)
{
    if (x == NULL || (fields == NULL && nfields > 0))
        return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_ws_accept: NULL");
    if (!(x->req->flags & SHMIPC_SERVE_REQ_UPGRADE))
        return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_ws_accept: not an upgrade request");
    if (x->head_sent || x->failed)
        return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_ws_accept: the head was sent already");
    if (nfields > SHMIPC_SERVE_MAX_HEADERS)
        return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_ws_accept: over %u fields",
                            SHMIPC_SERVE_MAX_HEADERS);
    size_t sl = subprotocol != NULL ? strlen(subprotocol) : 0;
    if (subprotocol != NULL && !offered(x->req, subprotocol, sl))
        return shmipc__fail(SHMIPC_EINVAL,
                            "shmipc_serve_ws_accept: subprotocol '%.64s' was not offered",
                            subprotocol);
    static const uint8_t proto_name[] = "Sec-WebSocket-Protocol";
    shmipc_serve_field *out = malloc((nfields + 1) * sizeof *out);
    uint8_t *buf = malloc(SHMIPC_SERVE_HDR_SIZE + SHMIPC_SERVE_MAX_HEAD + SHMIPC_SERVE_HDR_SIZE);
    int64_t n = SHMIPC_ENOMEM;
    int rc;
    if (out == NULL || buf == NULL)
        goto done;
    size_t k = 0;
    for (size_t i = 0; i < nfields; i++)
        if (!ws_dropped(&fields[i]))
            out[k++] = fields[i];
    if (subprotocol != NULL)
        out[k++] = (shmipc_serve_field){proto_name, (const uint8_t *)subprotocol,
                                        sizeof proto_name - 1, (uint32_t)sl};
    shmipc_serve_response r = {.size = sizeof r, .status = 101};
    n = shmipc_serve_encode_response_head(buf, SHMIPC_SERVE_HDR_SIZE + SHMIPC_SERVE_MAX_HEAD, &r,
                                          out, k);
    if (n < 0)
        goto done;
    /*
     * The upgrade request's END (and any body) first: after the 101 the stream carries only
     * WebSocket frames. The front sends the END with the upgrade's head (docs/serve.md,
     * "Exchanges"), so one deadline bounds the whole read: before, it had none (the stream's
     * read timeout, none in our workers), and a front that sent the head alone and kept the
     * stream open, or trickled a body behind it, held the worker (one request at a time) for
     * as long as it liked. Past it the stream is given up (closed) and the call fails with
     * SHMIPC_ETIMEDOUT. The stream's read timeout is the handler's again afterwards.
     */
    int32_t read_timeout = x->st->read_timeout_ms;
    x->drain_by = mono_ms() + UPGRADE_END_MS;
    drain(x);
    int timed_out = x->gone && x->abort_reason == 0 && mono_ms() >= x->drain_by;
    x->drain_by = 0;
    x->st->read_timeout_ms = read_timeout;
    if (x->gone || x->protocol) {
        n = timed_out ? shmipc__fail(SHMIPC_ETIMEDOUT,
                                     "shmipc_serve_ws_accept: no END of the upgrade request "
                                     "from the front within %d ms",
                                     UPGRADE_END_MS)
            : x->gone ? SHMIPC_ECONNRESET
                      : SHMIPC_EPROTO;
        goto done;
    }
    shmipc_serve_encode_header(buf + n, SHMIPC_SERVE_HDR_SIZE, SHMIPC_SERVE_END, 0, 0);
    rc = send_now(x, buf, (size_t)n + SHMIPC_SERVE_HDR_SIZE, NULL, 0);
    n = rc < 0 ? rc : 0;
    if (rc == 0)
        x->head_sent = x->bodyless = x->ws = 1;
done:
    free(out);
    free(buf);
    return (int)n;
}

/* WS_CLOSE from us; code 0 sends none. SHMIPC_EINVAL for a code or reason the codec refuses. */
static int ws_send_close(shmipc_serve_exchange *x, uint32_t code, const void *reason, size_t len)
{
    uint8_t buf[SHMIPC_SERVE_HDR_SIZE + 2 + SHMIPC_SERVE_MAX_CLOSE_REASON];
    int64_t n = shmipc_serve_encode_ws_close(buf, sizeof buf, code, reason, len);
    if (n < 0)
        return shmipc__fail(SHMIPC_EINVAL, "a WebSocket close: bad code %u or reason",
                            (unsigned)code);
    x->ws_sent_close = 1;
    return send_now(x, buf, (size_t)n, NULL, 0);
}

/* The payload of the front's WS_CLOSE, its header read (`flags` for the read): its code and
 * reason kept for ws_closed(). 0, SHMIPC_EPROTO, or the read's failure (nothing kept). */
static int ws_close_read(shmipc_serve_exchange *x, const shmipc_serve_frame *h, int flags)
{
    uint8_t buf[SHMIPC_SERVE_HDR_SIZE + 2 + SHMIPC_SERVE_MAX_CLOSE_REASON];
    const void *p;
    if (h->length > sizeof buf - SHMIPC_SERVE_HDR_SIZE) {
        x->protocol = 1;
        return SHMIPC_EPROTO;
    }
    shmipc_serve_encode_header(buf, SHMIPC_SERVE_HDR_SIZE, SHMIPC_SERVE_WS_CLOSE, h->length,
                               h->arg);
    if (h->length > 0) {
        int rc = read_exact(x, h->length, &p, flags);
        if (rc < 0)
            return rc;
        memcpy(buf + SHMIPC_SERVE_HDR_SIZE, p, h->length);
        shmipc_stream_release(x->st);
    }
    shmipc_serve_frame f = {.size = sizeof f};
    if (shmipc_serve_decode(buf, SHMIPC_SERVE_HDR_SIZE + h->length, &f) <= 0) {
        x->protocol = 1; /* a reserved code, a reason that is not UTF-8 */
        return SHMIPC_EPROTO;
    }
    x->ws_got_close = 1;
    x->ws_code = f.close_code != 0 ? f.close_code : 1005;
    x->ws_reason_len = f.close_reason_len;
    if (f.close_reason_len > 0)
        memcpy(x->ws_reason, f.close_reason, f.close_reason_len);
    return 0;
}

/*
 * The front's WS_CLOSE, its header read: kept for ws_closed(), answered unless we closed. An
 * answer that fails (the front closed the stream right behind its close) leaves the close
 * received all the same: SHMIPC_ECLOSED, and ws_closed() its code.
 */
static int ws_close_came(shmipc_serve_exchange *x, const shmipc_serve_frame *h)
{
    int rc = ws_close_read(x, h, 0);
    if (rc == SHMIPC_EPROTO)
        return rc;
    if (rc < 0)
        return lost(x);
    /* RFC 6455 §5.5.1: the side that did not close first answers, echoing the code. */
    if (!x->ws_sent_close && ws_send_close(x, x->ws_code == 1005 ? 0 : x->ws_code, NULL, 0) < 0)
        (void)lost(x);
    return SHMIPC_ECLOSED;
}

/*
 * The stream failed under a WebSocket before the front's WS_CLOSE was read: most often a
 * write of ours failed because the front closed the stream right behind its WS_CLOSE (it gave
 * up waiting 5 s for our answer to the client's close). That close is still in what is left to
 * read, in order before the stream's end: RFC 6455 §7.1.5 makes its code the client's close
 * code, and a 1006 ("went away without a close") would hide it. So what is left is looked
 * through now, without waiting (it is all here, or the session is gone): WS_DATA, pings and
 * pongs are dropped, a WS_CLOSE is kept for ws_closed() and not answered (nobody reads it).
 * Anything else (ABORT, the end, a failure, a frame that has no place here) ends the look.
 */
static void ws_read_last(shmipc_serve_exchange *x)
{
    const void *p;
    size_t len;
    x->ws_msg_op = 0;
    for (;;) {
        if (x->frame_left > 0) {
            size_t want = x->frame_left > (1u << 20) ? (1u << 20) : (size_t)x->frame_left;
            if (read_chunk(x, want, &p, &len, SHMIPC_NONBLOCK) < 0)
                return;
            shmipc_stream_release(x->st);
            x->frame_left -= len;
            continue;
        }
        shmipc_serve_frame f = {.size = sizeof f};
        if (read_exact(x, SHMIPC_SERVE_HDR_SIZE, &p, SHMIPC_NONBLOCK) < 0)
            return;
        int rc = shmipc_serve_decode_header(p, SHMIPC_SERVE_HDR_SIZE, &f);
        shmipc_stream_release(x->st);
        if (rc < 0)
            return;
        if (f.type == SHMIPC_SERVE_WS_CLOSE) {
            (void)ws_close_read(x, &f, SHMIPC_NONBLOCK);
            return;
        }
        if (f.type != SHMIPC_SERVE_WS_DATA && f.type != SHMIPC_SERVE_WS_PING &&
            f.type != SHMIPC_SERVE_WS_PONG)
            return;
        x->frame_left = f.length;
    }
}

/* Going away (shmipc_serve_shutdown()): the front's answer to our 1001 is waited for 5 s, all
 * reads together (drain_by: the headers' waits and each read of a payload). */
static void ws_going_away(shmipc_serve_exchange *x)
{
    x->ws_close_by = x->drain_by = mono_ms() + WS_CLOSE_WAIT_MS;
}

/* A frame header within timeout_ms: 0, SHMIPC_ETIMEDOUT (nothing consumed), or as read_header. */
static int ws_read_header(shmipc_serve_exchange *x, int timeout_ms, shmipc_serve_frame *f)
{
    const void *p;
    shmipc_stream_set_timeout(x->st, SHMIPC_TIMEOUT_READ, timeout_ms);
    int rc = read_exact(x, SHMIPC_SERVE_HDR_SIZE, &p, 0);
    if (rc == SHMIPC_ETIMEDOUT)
        return rc;
    if (rc < 0)
        return lost(x);
    f->size = sizeof *f;
    rc = shmipc_serve_decode_header(p, SHMIPC_SERVE_HDR_SIZE, f);
    shmipc_stream_release(x->st);
    if (rc < 0) {
        x->protocol = 1;
        return SHMIPC_EPROTO;
    }
    /* The frame's payload is on its way: its reads get their own bound, not what was left of
     * the caller's time (0 would take a payload still arriving for a client gone), but none
     * past a last wait's deadline. */
    shmipc_stream_set_timeout(x->st, SHMIPC_TIMEOUT_READ, WS_PAYLOAD_MS);
    if (!drain_time_left(x))
        shmipc_stream_set_timeout(x->st, SHMIPC_TIMEOUT_READ, 0);
    return 0;
}

SHMIPC_API int64_t shmipc_serve_ws_recv(shmipc_serve_exchange *x, void *buf, size_t cap,
                                        uint32_t *flags, int timeout_ms)
{
    if (x == NULL || buf == NULL || cap == 0 || flags == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_ws_recv: NULL or cap 0");
    if (!x->ws)
        return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_ws_recv: no WebSocket accepted");
    int64_t until = timeout_ms < 0 ? -1 : mono_ms() + timeout_ms;
    for (;;) {
        /* A close that was read is the client's close, even when the stream failed after it
         * (ws_close_came(), ws_read_last()). */
        if (x->ws_got_close)
            return SHMIPC_ECLOSED;
        if (x->gone)
            return SHMIPC_ECONNRESET;
        if (x->protocol)
            return SHMIPC_EPROTO;
        int stopping = __atomic_load_n(&ws_shutdown_flag, __ATOMIC_ACQUIRE);
        if (stopping && x->ws_close_by == 0) {
            /* Going away: 1001 unless the handler closed already; either way the front's
             * answer is waited for 5 s at most, whatever timeout the caller gave. */
            if (!x->ws_sent_close && ws_send_close(x, 1001, NULL, 0) < 0)
                return SHMIPC_ECONNRESET;
            ws_going_away(x);
        }
        if (x->frame_left > 0) {
            if (stopping) { /* going away: what the client still sends is dropped */
                uint64_t left = x->frame_left;
                x->frame_left = 0;
                if (x->ws_fin)
                    x->ws_msg_op = 0;
                if (skip(x, left) < 0)
                    return SHMIPC_ECONNRESET;
                continue;
            }
            const void *p;
            size_t len;
            size_t want = cap < x->frame_left ? cap : (size_t)x->frame_left;
            if (!drain_time_left(x) || read_chunk(x, want, &p, &len, 0) < 0)
                return lost(x);
            memcpy(buf, p, len);
            shmipc_stream_release(x->st);
            x->frame_left -= len;
            *flags = x->ws_msg_op;
            if (x->frame_left == 0 && x->ws_fin) {
                *flags |= SHMIPC_SERVE_WS_FIN;
                x->ws_msg_op = 0;
            }
            return (int64_t)len;
        }
        /* Wait in slices, to see a shutdown; up to the caller's time and, going away, the
         * time the front has to answer our 1001. */
        int64_t now = mono_ms(), wait = WS_POLL_MS;
        if (until >= 0 && until - now < wait)
            wait = until - now > 0 ? until - now : 0;
        if (x->ws_close_by > 0 && x->ws_close_by - now < wait)
            wait = x->ws_close_by - now > 0 ? x->ws_close_by - now : 0;
        shmipc_serve_frame f;
        int rc = ws_read_header(x, (int)wait, &f);
        if (rc == SHMIPC_ETIMEDOUT) {
            now = mono_ms();
            if (x->ws_close_by > 0 && now >= x->ws_close_by)
                return lost(x); /* no answer to our close: 1006 */
            if (until >= 0 && now >= until)
                return SHMIPC_ETIMEDOUT;
            continue;
        }
        if (rc < 0)
            return rc;
        switch (f.type) {
        case SHMIPC_SERVE_WS_DATA: {
            uint32_t op = f.arg & 0xFFu;
            if ((op == SHMIPC_SERVE_WS_CONT) != (x->ws_msg_op != 0)) {
                x->protocol = 1; /* a continuation with no message, a message inside one */
                return SHMIPC_EPROTO;
            }
            if (op != SHMIPC_SERVE_WS_CONT)
                x->ws_msg_op = op;
            x->ws_fin = (f.arg & SHMIPC_SERVE_WS_FIN) != 0;
            x->frame_left = f.length;
            if (f.length == 0 && !stopping) {
                *flags = x->ws_msg_op | (x->ws_fin ? SHMIPC_SERVE_WS_FIN : 0);
                if (x->ws_fin)
                    x->ws_msg_op = 0;
                return 0;
            }
            if (f.length == 0 && x->ws_fin)
                x->ws_msg_op = 0;
            continue;
        }
        case SHMIPC_SERVE_WS_PING:
        case SHMIPC_SERVE_WS_PONG: /* the front's business: ignored (docs/serve.md) */
            if (skip(x, f.length) < 0)
                return SHMIPC_ECONNRESET;
            continue;
        case SHMIPC_SERVE_WS_CLOSE:
            return ws_close_came(x, &f);
        case SHMIPC_SERVE_ABORT:
            return aborted(x, &f);
        default:
            x->protocol = 1;
            return SHMIPC_EPROTO;
        }
    }
}

/*
 * What shmipc_serve_ws_send() and shmipc_serve_ws_close() check first: 0 when the WebSocket
 * may take a frame, else what the call returns. The handler's own close comes first (a send
 * or close after it is a misuse whatever the client did; `after_close` words it), then the
 * session's end, a protocol error, and a close from the front (answered) or the worker's own
 * going away (1001): SHMIPC_ECLOSED.
 */
static int ws_usable(const shmipc_serve_exchange *x, const char *what, const char *after_close)
{
    if (!x->ws)
        return shmipc__fail(SHMIPC_EINVAL, "%s: no WebSocket accepted", what);
    if (x->ws_app_closed)
        return shmipc__fail(SHMIPC_EINVAL, "%s: %s", what, after_close);
    if (x->gone)
        return SHMIPC_ECONNRESET;
    if (x->protocol)
        return SHMIPC_EPROTO;
    if (x->ws_got_close || x->ws_sent_close)
        return SHMIPC_ECLOSED;
    return 0;
}

SHMIPC_API int shmipc_serve_ws_send(shmipc_serve_exchange *x, uint32_t opcode, const void *data,
                                    size_t len)
{
    if (x == NULL || (data == NULL && len > 0))
        return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_ws_send: NULL");
    int rc = ws_usable(x, "shmipc_serve_ws_send", "after the WebSocket's close");
    if (rc != 0)
        return rc;
    if (__atomic_load_n(&ws_shutdown_flag, __ATOMIC_ACQUIRE)) {
        /* Going away, also for a handler that only sends and never waits in ws_recv: 1001,
         * and the front's answer is waited for when the handler returns (ws_finish). */
        if (ws_send_close(x, 1001, NULL, 0) < 0)
            return SHMIPC_ECONNRESET;
        ws_going_away(x);
        return SHMIPC_ECLOSED;
    }
    uint8_t hdr[SHMIPC_SERVE_HDR_SIZE];
    const uint8_t *p = data;
    if (opcode == SHMIPC_SERVE_WS_PING_OP || opcode == SHMIPC_SERVE_WS_PONG_OP) {
        if (len > SHMIPC_SERVE_MAX_CONTROL)
            return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_ws_send: a ping or pong over %u bytes",
                                SHMIPC_SERVE_MAX_CONTROL);
        shmipc_serve_encode_header(hdr, sizeof hdr,
                                   opcode == SHMIPC_SERVE_WS_PING_OP ? SHMIPC_SERVE_WS_PING
                                                                     : SHMIPC_SERVE_WS_PONG,
                                   len, 0);
        return send_now(x, hdr, sizeof hdr, p, len);
    }
    if (opcode != SHMIPC_SERVE_WS_TEXT && opcode != SHMIPC_SERVE_WS_BINARY)
        return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_ws_send: opcode %u", (unsigned)opcode);
    if (opcode == SHMIPC_SERVE_WS_TEXT && !shmipc__utf8_valid(data, len))
        return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_ws_send: text that is not UTF-8");
    size_t off = 0;
    do {
        size_t piece = len - off < SHMIPC_SERVE_MAX_CHUNK ? len - off : SHMIPC_SERVE_MAX_CHUNK;
        uint32_t arg = (off == 0 ? opcode : SHMIPC_SERVE_WS_CONT) |
                       (off + piece == len ? SHMIPC_SERVE_WS_FIN : 0);
        shmipc_serve_encode_header(hdr, sizeof hdr, SHMIPC_SERVE_WS_DATA, piece, arg);
        rc = send_now(x, hdr, sizeof hdr, piece > 0 ? p + off : NULL, piece);
        if (rc < 0)
            return rc;
        off += piece;
    } while (off < len);
    return 0;
}

SHMIPC_API int shmipc_serve_ws_close(shmipc_serve_exchange *x, uint32_t code, const void *reason,
                                     size_t reason_len)
{
    if (x == NULL || (reason == NULL && reason_len > 0))
        return shmipc__fail(SHMIPC_EINVAL, "shmipc_serve_ws_close: NULL");
    int rc = ws_usable(x, "shmipc_serve_ws_close", "closed already");
    if (rc != 0)
        return rc;
    rc = ws_send_close(x, code, reason, reason_len);
    if (rc != SHMIPC_EINVAL)
        x->ws_app_closed = 1;
    return rc;
}

SHMIPC_API int32_t shmipc_serve_ws_closed(shmipc_serve_exchange *x, void *reason, size_t cap,
                                          size_t *reason_len)
{
    if (x == NULL)
        return -1;
    size_t rl = x->ws_got_close ? x->ws_reason_len : 0;
    if (reason_len != NULL)
        *reason_len = rl;
    if (reason != NULL && cap > 0 && rl > 0)
        memcpy(reason, x->ws_reason, cap < rl ? cap : rl);
    return x->ws_got_close ? (int32_t)x->ws_code : x->gone || x->protocol ? 1006 : 0;
}

SHMIPC_API void shmipc_serve_shutdown(void)
{
    __atomic_store_n(&ws_shutdown_flag, 1, __ATOMIC_RELEASE);
}

/*
 * After the handler of an accepted WebSocket: its socket closed (1000, or 1011 when it
 * failed) unless it was, then the front's answering close waited for (messages meanwhile
 * dropped), at most 5 s, so no frame of the front's arrives after our stream's close.
 */
static int ws_finish(shmipc_serve_exchange *x, int rc)
{
    if (rc < 0)
        shmipc__log(SHMIPC_LOG_ERROR, "shmipc-serve: a WebSocket handler failed (%d): close 1011",
                    rc);
    if (!x->gone && !x->protocol && !x->ws_sent_close && !x->ws_got_close)
        ws_send_close(x, rc < 0 ? 1011 : 1000, NULL, 0);
    int64_t until = mono_ms() + WS_CLOSE_WAIT_MS;
    if (x->drain_by == 0 || until < x->drain_by)
        x->drain_by = until; /* every read of the wait, payloads too (drain_time_left) */
    while (!x->gone && !x->protocol && !x->ws_got_close) {
        int64_t left = until - mono_ms();
        uint8_t sink[4096];
        uint32_t fl;
        if (left <= 0 ||
            shmipc_serve_ws_recv(x, sink, sizeof sink, &fl, (int)left) == SHMIPC_ETIMEDOUT)
            break;
    }
    if (x->protocol) {
        shmipc__log(SHMIPC_LOG_ERROR, "shmipc-serve: a bad frame from the front in a WebSocket");
        send_abort(x, SHMIPC_SERVE_ABORT_PROTOCOL, "bad frame in the WebSocket");
        return SHMIPC_SERVE_OUTCOME_PROTOCOL;
    }
    if (rc < 0)
        return SHMIPC_SERVE_OUTCOME_ERROR;
    return x->gone && !x->ws_got_close ? SHMIPC_SERVE_OUTCOME_ABORTED : SHMIPC_SERVE_OUTCOME_OK;
}

/*
 * After our END, the drain read a bad frame of the front's: ABORT PROTOCOL, as for one read
 * before the END (the front learns why; the session serves on), as the Python workers do.
 */
static void answer_drained_bad_frame(shmipc_serve_exchange *x)
{
    if (!x->protocol || x->gone)
        return;
    shmipc__log(SHMIPC_LOG_ERROR, "shmipc-serve: a bad frame from the front after the response");
    send_abort(x, SHMIPC_SERVE_ABORT_PROTOCOL, "bad frame after the response");
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
    if (send_now(x, end, sizeof end, NULL, 0) == 0) {
        drain_after_end(x);
        answer_drained_bad_frame(x);
    }
}

/*
 * The front's HELLO (docs/serve.md, "HELLO and TAKEN"): granted, of what it offers, what this
 * worker does (TAKEN), with a concurrency of 1 (a handler runs one request at a time).
 */
static int hello(shmipc_serve_exchange *x, const shmipc_serve_frame *f)
{
    const void *p;
    uint8_t out[SHMIPC_SERVE_HDR_SIZE + SHMIPC_SERVE_HELLO_SIZE];
    if (!drain_time_left(x) || read_exact(x, f->length, &p, 0) < 0) {
        lost(x);
        return SHMIPC_SERVE_OUTCOME_ABORTED;
    }
    const uint8_t *b = p;
    uint32_t offered =
        (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    shmipc_stream_release(x->st);
    (void)shmipc__sf_encode_hello(out, sizeof out, offered & SHMIPC_SERVE_FEAT_TAKEN, 1);
    if (send_now(x, out, sizeof out, NULL, 0) < 0)
        return SHMIPC_SERVE_OUTCOME_ABORTED;
    return SHMIPC_SERVE_OUTCOME_HELLO;
}

/*
 * Reads the REQUEST_HEAD whole into *head (malloc'd); an outcome when there is none. All of the
 * stream's first frame (a HELLO's, a late ABORT's too) by x->drain_by (HEAD_READ_MS): the front
 * sends a frame whole, so one that sends part of it (a header short of its 12 bytes, a head
 * short of its length) or nothing, and keeps the stream open, is given up. Before, that read
 * had no deadline (the stream's read timeout: none in our workers), and it held the worker,
 * which serves one request at a time, for as long as it liked, a stopping one too.
 */
static int read_head(shmipc_serve_exchange *x, uint8_t **head, shmipc_serve_request *req)
{
    shmipc_serve_frame f;
    const void *p;
    if (!drain_time_left(x)) {
        lost(x);
        return SHMIPC_SERVE_OUTCOME_ABORTED;
    }
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
    if (f.type == SHMIPC_SERVE_HELLO)
        return hello(x, &f);
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
    if (!drain_time_left(x) || read_exact(x, f.length, &p, 0) < 0) {
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
    /* The head within HEAD_READ_MS; then the stream's read timeout is the handler's again. */
    int32_t read_timeout = st->read_timeout_ms;
    x.drain_by = mono_ms() + HEAD_READ_MS;
    int outcome = read_head(&x, &head, &req);
    x.drain_by = 0;
    st->read_timeout_ms = read_timeout;
    if (outcome == SHMIPC_SERVE_OUTCOME_PROTOCOL) {
        shmipc__log(SHMIPC_LOG_ERROR, "shmipc-serve: a bad frame from the front");
        send_abort(&x, SHMIPC_SERVE_ABORT_PROTOCOL, "bad request head");
    }
    if (outcome != -1)
        goto out;
    x.req = &req;
    if (req.flags & SHMIPC_SERVE_REQ_TAKEN_WANTED) {
        /* TAKEN out before the handler runs: the front resends a request it never saw TAKEN
         * for, so one that cannot be said taken is not run. */
        uint8_t taken[SHMIPC_SERVE_HDR_SIZE];
        shmipc_serve_encode_header(taken, sizeof taken, SHMIPC_SERVE_TAKEN, 0, 0);
        if (send_now(&x, taken, sizeof taken, NULL, 0) < 0) {
            outcome = SHMIPC_SERVE_OUTCOME_ABORTED;
            goto out;
        }
    }
    int rc = handler(&x, user_data);
    if (x.ws) {
        outcome = ws_finish(&x, rc);
    } else if (x.gone) {
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
        if (x.done) {
            /* The request was read to its END: nothing to drain, so our END and the close go
             * in one step, one wakeup of the front instead of two. */
            if (queue(&x, end, sizeof end, NULL, 0) == 0) {
                if (shmipc_stream_flush_close(st) < 0)
                    lost(&x);
                st = NULL; /* closed, whatever the flush did */
            }
        } else if (send_now(&x, end, sizeof end, NULL, 0) == 0) {
            drain_after_end(&x);
            answer_drained_bad_frame(&x);
        }
        outcome = x.gone       ? SHMIPC_SERVE_OUTCOME_ABORTED
                  : x.protocol ? SHMIPC_SERVE_OUTCOME_PROTOCOL
                               : SHMIPC_SERVE_OUTCOME_OK;
    }
out:
    free(head);
    shmipc_stream_close(st);
    return outcome;
}
