/*
 * The HTTP server's deferred requests (docs/serve.md, "The front"): a route handler defers its
 * request and an application worker answers it later. Owns the ticket (defer, cancel) and the
 * answer's checks and copies (complete); the DEFERRED state's transitions are server_conn.c's,
 * which complete() reaches through the COMPLETE event.
 * May call: http_writer (header checks, the deferred response) and server_conn.c's
 * shmipc__server_conn_event() and shmipc__server_conn_after().
 */
#include "net/server_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int shmipc__server_defer(struct shmipc_http_response *res, uint32_t timeout_ms,
                         shmipc__server_cancel_fn cancel, void *data,
                         struct shmipc__server_ticket *out)
{
    struct server_conn *sc = res->conn;
    if (res->deferred || sc == NULL || sc->defer_on || sc->state != SHMIPC__CS_HANDLING)
        return shmipc__fail(SHMIPC_EINVAL, "defer: not in a route handler, or deferred twice");
    if (timeout_ms > SHMIPC__SERVER_MAX_TIMEOUT_MS)
        return shmipc__fail(SHMIPC_ERANGE, "defer: timeout of %u ms", timeout_ms);
    res->deferred = 1;
    sc->defer_on = 1;
    sc->answered = 0;
    sc->on_cancel = cancel;
    sc->cancel_data = data;
    sc->defer_deadline = timeout_ms ? shmipc__server_conn_after(sc, timeout_ms) : 0;
    sc->defer_ms = timeout_ms;
    out->sc = sc;
    out->gen = sc->defer_gen;
    return 0;
}

void shmipc__server_defer_cancel(struct server_conn *sc, int reason)
{
    if (!sc->defer_on)
        return;
    shmipc__server_cancel_fn fn = sc->on_cancel;
    sc->defer_on = 0;
    sc->ws_defer = 0;
    sc->up_on = 0; /* the rest of a streamed body is nobody's: the connection closes */
    sc->defer_gen++;
    sc->defer_deadline = 0;
    sc->on_cancel = NULL;
    sc->on_drain = NULL;
    if (fn != NULL) {
        sc->in_cancel = 1; /* shmipc__server_stream_sent() answers the stale ticket meanwhile */
        fn(sc->cancel_data, reason);
        sc->in_cancel = 0;
    }
}

static int header_named(const struct shmipc__http_header_out *h, const char *name)
{
    size_t n = strlen(name);
    return h->name_len == n && strncasecmp(h->name, name, n) == 0;
}

/* The ticket names a live deferral of this thread's (0), or the error to return. */
static int ticket_check(struct shmipc__server_ticket t, const char *what)
{
    struct server_conn *sc = t.sc;
    if (sc == NULL || !pthread_equal(pthread_self(), sc->w->thread))
        return shmipc__fail(SHMIPC_EINVAL, "%s: off the worker thread", what);
    if (!sc->defer_on || sc->answered || sc->defer_gen != t.gen)
        return shmipc__fail(SHMIPC_ECLOSED, "%s: the deferred request was cancelled", what);
    if (sc->state != SHMIPC__CS_DEFERRED) /* from inside the handler that deferred */
        return shmipc__fail(SHMIPC_EINVAL, "%s: the handler has not returned yet", what);
    return 0;
}

/*
 * Checks the owner's head and copies it into sc->http.deferred, its memory on answer_rel,
 * with `lead` header slots before the owner's (the caller fills them: a 101's handshake
 * fields) and `extra` more bytes behind it (*extra_out) for the caller. The head is checked as the
 * handler API checks it (shmipc_http_response_add_header): the framing headers are the
 * server's alone (a second Content-Length beside ours makes the client or a proxy in front
 * split the stream elsewhere), and a control byte is refused now, while the owner can still
 * answer otherwise.
 */
static int answer_prepare(struct server_conn *sc, int status, const char *content_type,
                          const struct shmipc__http_header_out *headers, uint32_t nheaders,
                          uint32_t lead, size_t extra, char **extra_out)
{
    if (status < 200 || status > 999 || nheaders > SHMIPC__SERVER_MAX_RESP_HEADERS)
        return shmipc__fail(SHMIPC_EINVAL, "complete: a bad status or too many headers");
    uint16_t close_flag = 0;
    uint32_t ntype = content_type != NULL;
    if (content_type != NULL) {
        struct shmipc__http_header_out ct = {"Content-Type", content_type, 12,
                                             (uint32_t)strlen(content_type)};
        if (!shmipc__http_header_valid(&ct))
            return shmipc__fail(SHMIPC_EINVAL, "complete: Content-Type has a control byte");
    }
    for (uint32_t i = 0; i < nheaders; i++) {
        const struct shmipc__http_header_out *hd = &headers[i];
        if (!shmipc__http_header_valid(hd) || header_named(hd, "Content-Length") ||
            header_named(hd, "Transfer-Encoding") || header_named(hd, "Date") ||
            header_named(hd, "Server") ||
            (header_named(hd, "Connection") &&
             (hd->value_len != 5 || strncasecmp(hd->value, "close", 5) != 0)) ||
            (header_named(hd, "Content-Type") && ++ntype > 1))
            return shmipc__fail(SHMIPC_EINVAL, "complete: response header %u is refused", i);
        if (header_named(hd, "Connection"))
            close_flag = SHMIPC__HTTP_RESP_CLOSE;
    }
    /* The header array and the content type are copied now: the answer may be batched later
     * (after the batch in flight), when the caller's memory is gone. */
    size_t ctlen = content_type != NULL ? strlen(content_type) + 1 : 0;
    size_t need = sizeof(struct release) + (lead + nheaders) * sizeof *headers + ctlen + extra;
    for (uint32_t i = 0; i < nheaders; i++)
        need += headers[i].name_len + headers[i].value_len;
    struct release *meta = malloc(need);
    if (meta == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "complete: out of memory for the answer");
    struct shmipc__http_header_out *h = (struct shmipc__http_header_out *)(meta + 1);
    char *p = (char *)(h + lead + nheaders);
    uint32_t nh = lead;
    for (uint32_t i = 0; i < nheaders; i++) {
        if (header_named(&headers[i], "Connection"))
            continue; /* "close": a flag, the writer adds the header */
        h[nh] = headers[i];
        memcpy(p, headers[i].name, headers[i].name_len);
        h[nh].name = p;
        p += headers[i].name_len;
        memcpy(p, headers[i].value, headers[i].value_len);
        h[nh].value = p;
        p += headers[i].value_len;
        nh++;
    }
    struct shmipc__http_response *r = &sc->http.deferred;
    r->status = (uint16_t)status;
    /* A refused upgrade: the client may have sent frames behind its head (it should not), and
     * they must never be read as a request. */
    if (sc->ws_defer)
        close_flag = SHMIPC__HTTP_RESP_CLOSE;
    sc->ws_defer = 0;
    r->flags |= close_flag;
    r->headers = h;
    r->nheaders = nh;
    r->content_type = NULL;
    if (content_type != NULL) {
        memcpy(p, content_type, ctlen);
        r->content_type = p;
        p += ctlen;
    }
    r->body = NULL;
    r->body_len = 0;
    meta->fn = NULL;
    meta->user_data = NULL;
    meta->next = sc->answer_rel;
    sc->answer_rel = meta;
    *extra_out = p;
    return 0;
}

/* The deferral ends with the answer in sc->http.deferred: the ticket goes stale (its cancel
 * will not run) and the answer goes out. */
static void answered(struct server_conn *sc)
{
    sc->defer_on = 0;
    sc->up_on = 0; /* the rest of a streamed body is nobody's: the connection closes */
    sc->defer_gen++;
    sc->on_cancel = NULL;
    sc->answered = 1;
    shmipc__server_conn_event(sc, SHMIPC__CE_COMPLETE, NULL, 0);
}

/* The server's own error answer (its canned body, Connection: close), as the deadline's 504;
 * nothing is allocated. What the request implied (HEAD, HTTP/1.0) is kept. */
static void answer_error(struct server_conn *sc, int status)
{
    struct shmipc__http_response *r = &sc->http.deferred;
    uint16_t keep = r->flags;
    memset(r, 0, sizeof *r);
    r->flags = keep;
    shmipc__http_response_error(r, status);
    sc->ws_defer = 0;
    answered(sc);
}

int shmipc__server_complete(struct shmipc__server_ticket t, int status, const char *content_type,
                            const struct shmipc__http_header_out *headers, uint32_t nheaders,
                            const void *body, size_t body_len, shmipc_destroy_cb release,
                            void *user_data)
{
    struct server_conn *sc = t.sc;
    struct release *bnode = NULL;
    char *copy = NULL;
    /* No body but a length: an answer to HEAD saying GET's (nothing to copy or send). */
    int head_length = body == NULL && body_len > 0;
    int rc = ticket_check(t, "complete");
    if (rc < 0)
        goto refuse;
    if (sc->streaming) {
        rc = shmipc__fail(SHMIPC_EINVAL, "complete: the answer is streamed");
        goto refuse;
    }
    if (head_length && !(sc->http.deferred_flags & SHMIPC__HTTP_RESP_HEAD)) {
        rc = shmipc__fail(SHMIPC_EINVAL, "complete: a length without a body, not for HEAD");
        goto refuse;
    }
    if (release != NULL && (bnode = malloc(sizeof *bnode)) == NULL) {
        rc = shmipc__fail(SHMIPC_ENOMEM, "complete: out of memory for the answer");
        goto refuse;
    }
    /* Without a release callback the caller cannot know when the body is no longer used:
     * it is copied too. */
    rc = answer_prepare(sc, status, content_type, headers, nheaders, 0,
                        release == NULL && !head_length ? body_len : 0, &copy);
    if (rc < 0) {
        free(bnode);
        goto refuse;
    }
    struct shmipc__http_response *r = &sc->http.deferred;
    if (release == NULL && body_len > 0 && !head_length) {
        memcpy(copy, body, body_len);
        body = copy;
    }
    r->body = body;
    r->body_len = body_len;
    if (bnode != NULL) {
        bnode->fn = release;
        bnode->user_data = user_data;
        bnode->next = sc->answer_rel;
        sc->answer_rel = bnode;
    }
    answered(sc);
    return 0;
refuse:
    if (release != NULL)
        release(user_data);
    return rc;
}

int shmipc__server_complete_error(struct shmipc__server_ticket t, int status)
{
    struct server_conn *sc = t.sc;
    int rc = ticket_check(t, "complete_error");
    if (rc < 0)
        return rc;
    if (sc->streaming)
        return shmipc__fail(SHMIPC_EINVAL, "complete_error: the answer is streamed");
    answer_error(sc, status);
    return 0;
}

/* ---- deferred WebSocket upgrades (docs/http.md, "Deferred WebSocket upgrades") ---- */

int shmipc__server_ws_defer(struct shmipc_http_response *res, const struct shmipc_http_request *req,
                            uint32_t timeout_ms, shmipc__server_cancel_fn cancel, void *data,
                            struct shmipc__server_ticket *out)
{
    struct server_conn *sc = res != NULL ? res->conn : NULL;
    if (sc == NULL || req == NULL || req->r == NULL || res->deferred || sc->defer_on ||
        sc->state != SHMIPC__CS_HANDLING)
        return shmipc__fail(SHMIPC_EINVAL, "ws_defer: not in a route handler, or deferred twice");
    struct shmipc__ws_handshake *hs = &sc->w->hs;
    int rc = shmipc__ws_handshake_check(hs, req->r, NULL, 0);
    if (rc == 0 && !(req->r->flags & SHMIPC__HTTP_KEEP_ALIVE)) {
        /* "Connection: Upgrade, close" asks for two things that exclude each other. */
        hs->status = 400;
        hs->detail = "the request closes the connection";
        rc = SHMIPC_EPROTO;
    }
    if (rc < 0) {
        /* The 400/426 (with Connection: close) is the handler's response now. */
        shmipc__ws_handshake_response(hs, res->r);
        return shmipc__fail(SHMIPC_EPROTO, "ws_defer: not a valid WebSocket handshake (%u): %s",
                            hs->status, hs->detail ? hs->detail : "");
    }
    rc = shmipc__server_defer(res, timeout_ms, cancel, data, out);
    if (rc < 0)
        return rc;
    sc->ws_defer = 1;
    memcpy(sc->ws_accept, hs->accept, sizeof sc->ws_accept);
    return 0;
}

static int ws_field_refused(const struct shmipc__http_header_out *h)
{
    return header_named(h, "Upgrade") || header_named(h, "Connection") ||
           header_named(h, "Sec-WebSocket-Accept");
}

int shmipc__server_ws_accept(struct shmipc__server_ticket t,
                             const struct shmipc__http_header_out *headers, uint32_t nheaders,
                             const struct shmipc__server_ws_cbs *cbs, void *user_data,
                             struct shmipc_ws **out)
{
    struct server_conn *sc = t.sc;
    char *unused;
    int rc = ticket_check(t, "ws_accept");
    if (rc < 0)
        return rc;
    if (!sc->ws_defer || sc->streaming)
        return shmipc__fail(SHMIPC_EINVAL, "ws_accept: the deferred request is no upgrade");
    if (cbs == NULL || cbs->on_message == NULL || cbs->on_close == NULL || out == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "ws_accept: on_message and on_close are required");
    if (nheaders > SHMIPC__SERVER_MAX_RESP_HEADERS - 3)
        return shmipc__fail(SHMIPC_EINVAL, "ws_accept: %u headers", nheaders);
    for (uint32_t i = 0; i < nheaders; i++)
        if (ws_field_refused(&headers[i]))
            return shmipc__fail(SHMIPC_EINVAL, "ws_accept: header %u is the handshake's own", i);
    if (shmipc__server_stopping(sc->w)) {
        /* The stop already told its WebSockets to go away (1001): a new one would only be
         * cut by the stop's end. nginx refuses new work while it drains too. */
        answer_error(sc, 503);
        return shmipc__fail(SHMIPC_EPIPE, "ws_accept: the server is stopping (503)");
    }
    struct shmipc_ws *ws = shmipc__server_ws_new(sc, cbs, user_data);
    if (ws == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "ws_accept: websocket connection");
    /* The caller's headers are checked as complete() checks them; answer_prepare() also
     * ends ws_defer, which matters only for a refusal. */
    sc->ws_defer = 0;
    rc = answer_prepare(sc, 200, NULL, headers, nheaders, 3, 0, &unused);
    if (rc < 0) {
        sc->ws_defer = 1;
        shmipc__ws_conn_destroy(&ws->c);
        free(ws);
        return rc;
    }
    struct shmipc__http_response *r = &sc->http.deferred;
    struct shmipc__http_header_out *h = (struct shmipc__http_header_out *)r->headers;
    h[0] = (struct shmipc__http_header_out){"Upgrade", "websocket", 7, 9};
    h[1] = (struct shmipc__http_header_out){"Connection", "Upgrade", 10, 7};
    h[2] = (struct shmipc__http_header_out){"Sec-WebSocket-Accept", sc->ws_accept, 20,
                                            SHMIPC__WS_ACCEPT_LEN};
    r->status = 101;
    sc->ws = ws;
    /* The bytes behind the head are frames: the HTTP parser stops before them (see
     * shmipc__server_ws_upgrade()), and conn_serve() switches to WebSocket. */
    sc->http.head_reserve = UINT32_MAX;
    *out = ws;
    answered(sc);
    return 0;
}

/* ---- streamed answers (docs/serve.md, "Streamed responses") ---- */

int shmipc__server_stream_head(struct shmipc__server_ticket t, int status, const char *content_type,
                               const struct shmipc__http_header_out *headers, uint32_t nheaders,
                               uint64_t length, size_t mark, shmipc__server_drain_fn drain,
                               void *drain_data)
{
    struct server_conn *sc = t.sc;
    char *unused;
    int rc = ticket_check(t, "stream_head");
    if (rc < 0)
        return rc;
    if (sc->streaming || mark == 0)
        return shmipc__fail(SHMIPC_EINVAL, "stream_head: a second head, or a mark of 0");
    rc = answer_prepare(sc, status, content_type, headers, nheaders, 0, 0, &unused);
    if (rc < 0)
        return rc;
    struct shmipc__http_response *r = &sc->http.deferred;
    if (length == SHMIPC__SERVER_STREAM_UNSIZED)
        r->flags |= SHMIPC__HTTP_RESP_STREAM;
    else
        r->body_len = (size_t)length; /* the head's Content-Length; the pieces follow */
    sc->streaming = 1;
    /* HEAD, 204 and 304 send none of the body: its length is not checked against it. */
    int sends = !(r->flags & SHMIPC__HTTP_RESP_HEAD) && status != 204 && status != 304;
    sc->stream_len = sends ? length : SHMIPC__SERVER_STREAM_UNSIZED;
    sc->stream_given = 0;
    sc->stream_mark = mark;
    sc->on_drain = drain;
    sc->drain_data = drain_data;
    sc->sq_head = NULL;
    sc->sq_tail = &sc->sq_head;
    sc->sq_bytes = 0;
    /* The deferral's timeout runs again between the owner's pieces. */
    sc->stream_ms = sc->defer_deadline != 0 ? sc->defer_ms : 0;
    sc->stream_at = sc->stream_ms ? shmipc__server_conn_after(sc, sc->stream_ms) : 0;
    shmipc__server_conn_event(sc, SHMIPC__CE_COMPLETE, NULL, 0);
    return 0;
}

/* A call on the stream between its head and its end. */
static int stream_check(struct shmipc__server_ticket t, const char *what)
{
    int rc = ticket_check(t, what);
    if (rc == 0 && (!t.sc->streaming || t.sc->stream_end))
        rc = shmipc__fail(SHMIPC_EINVAL, "%s: no stream head, or the stream ended", what);
    return rc;
}

int shmipc__server_stream_body(struct shmipc__server_ticket t, const void *data, size_t len,
                               shmipc_destroy_cb release, void *user_data)
{
    struct server_conn *sc = t.sc;
    struct spiece *pc;
    int rc = stream_check(t, "stream_body");
    if (rc < 0)
        goto refuse;
    if (len == 0) {
        rc = 0;
        goto refuse;
    }
    if (sc->stream_len != SHMIPC__SERVER_STREAM_UNSIZED &&
        len > sc->stream_len - sc->stream_given) {
        rc = shmipc__fail(SHMIPC_EINVAL, "stream_body: more than the Content-Length");
        goto refuse;
    }
    pc = malloc(sizeof *pc + (release == NULL ? len : 0));
    if (pc == NULL) {
        rc = shmipc__fail(SHMIPC_ENOMEM, "stream_body: a %zu-byte piece", len);
        goto refuse;
    }
    pc->next = NULL;
    pc->len = len;
    pc->fn = release;
    pc->user_data = user_data;
    if (release == NULL) {
        memcpy(pc + 1, data, len);
        data = pc + 1;
    }
    pc->data = data;
    *sc->sq_tail = pc;
    sc->sq_tail = &pc->next;
    sc->sq_bytes += len;
    sc->stream_given += len;
    sc->stream_at = sc->stream_ms ? shmipc__server_conn_after(sc, sc->stream_ms) : 0;
    shmipc__server_conn_event(sc, SHMIPC__CE_COMPLETE, NULL, 0);
    return 0;
refuse:
    if (release != NULL)
        release(user_data);
    return rc;
}

/* The stream's last call: the ticket goes stale, nothing is cancelled any more. */
static int stream_finish(struct shmipc__server_ticket t, int how, const char *what)
{
    struct server_conn *sc = t.sc;
    int rc = stream_check(t, what);
    if (rc < 0)
        return rc;
    int short_ = how == STREAM_ENDED && sc->stream_len != SHMIPC__SERVER_STREAM_UNSIZED &&
                 sc->stream_given != sc->stream_len;
    if (short_)
        how = STREAM_ABORTED; /* short of its Content-Length: the client must not wait */
    sc->stream_end = (uint8_t)how;
    sc->defer_on = 0;
    sc->up_on = 0; /* the rest of a streamed body is nobody's: the connection closes */
    sc->defer_gen++;
    sc->on_cancel = NULL;
    sc->on_drain = NULL;
    sc->stream_at = 0;
    shmipc__server_conn_event(sc, SHMIPC__CE_COMPLETE, NULL, 0);
    return short_ ? shmipc__fail(SHMIPC_EINVAL, "%s: short of the Content-Length; aborted", what)
                  : 0;
}

int shmipc__server_stream_end(struct shmipc__server_ticket t)
{
    return stream_finish(t, STREAM_ENDED, "stream_end");
}

int shmipc__server_stream_abort(struct shmipc__server_ticket t)
{
    return stream_finish(t, STREAM_ABORTED, "stream_abort");
}

size_t shmipc__server_stream_queued(struct shmipc__server_ticket t)
{
    struct server_conn *sc = t.sc;
    if (sc == NULL || !sc->streaming || sc->defer_gen != t.gen)
        return 0;
    return sc->sq_bytes;
}

uint64_t shmipc__server_stream_sent(struct shmipc__server_ticket t)
{
    struct server_conn *sc = t.sc;
    if (sc == NULL || !sc->streaming ||
        !(sc->defer_gen == t.gen || (sc->in_cancel && sc->defer_gen == t.gen + 1)))
        return 0;
    /* Given, less what is queued or in the batch in flight (not known to be written). */
    return sc->stream_given - sc->sq_bytes;
}

static void piece_list_free(struct spiece *pc)
{
    while (pc != NULL) {
        struct spiece *next = pc->next;
        if (pc->fn != NULL)
            pc->fn(pc->user_data);
        free(pc);
        pc = next;
    }
}

/* The stream's pieces and state go (the connection closes, or the stream was sent whole). */
void shmipc__server_stream_free(struct server_conn *sc)
{
    piece_list_free(sc->sq_head);
    piece_list_free(sc->sq_sent);
    sc->sq_head = sc->sq_sent = NULL;
    sc->sq_tail = &sc->sq_head;
    sc->sq_bytes = 0;
    sc->streaming = sc->stream_end = sc->head_sent = sc->last_sent = 0;
    sc->on_drain = NULL;
    sc->stream_at = 0;
}

/* Two system calls per connection instead of per request (a keep-alive connection asks
 * once). An accept with the address is no help: io_uring's multishot accept has one address
 * buffer for all its completions, and the local address of a wildcard listener is the
 * connection's own. A failure is not kept: a later request asks again. */
static void conn_addrs(struct server_conn *sc)
{
    if (sc->addrs_known)
        return;
    int fd = shmipc__conn_fd(sc->conn);
    memset(&sc->peer_addr, 0, sizeof sc->peer_addr);
    memset(&sc->local_addr, 0, sizeof sc->local_addr);
    sc->peer_len = sizeof sc->peer_addr;
    int ok = getpeername(fd, (struct sockaddr *)&sc->peer_addr, &sc->peer_len) == 0;
    if (!ok) {
        sc->peer_addr.ss_family = AF_UNSPEC;
        sc->peer_len = 0;
    }
    sc->local_len = sizeof sc->local_addr;
    if (getsockname(fd, (struct sockaddr *)&sc->local_addr, &sc->local_len) < 0) {
        sc->local_addr.ss_family = AF_UNSPEC;
        sc->local_len = 0;
        ok = 0;
    }
    sc->addrs_known = (uint8_t)ok;
}

int shmipc__server_where(const struct shmipc_http_response *res, struct shmipc__server_where *out)
{
    struct server_conn *sc = res->conn;
    if (sc == NULL || res->w == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "server_where: not a route handler's response");
    out->index = res->w->index;
    out->nworkers = res->w->srv->nworkers;
    out->loop = res->w->loop;
    out->fd = shmipc__conn_fd(sc->conn);
    conn_addrs(sc);
    out->peer = &sc->peer_addr;
    out->local = &sc->local_addr;
    return 0;
}

int shmipc__server_request_addr(const struct shmipc_http_request *req, int local,
                                struct sockaddr *addr, socklen_t *len)
{
    struct server_conn *sc = req->conn;
    if (sc == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "http_request_%s: not a handler's request",
                            local ? "local" : "peer");
    conn_addrs(sc);
    const struct sockaddr_storage *a = local ? &sc->local_addr : &sc->peer_addr;
    socklen_t n = local ? sc->local_len : sc->peer_len;
    if (a->ss_family == AF_UNSPEC)
        return shmipc__fail(SHMIPC_ECONNRESET, "http_request_%s: the kernel could not tell (%s)",
                            local ? "local" : "peer", "the client left");
    memcpy(addr, a, n < *len ? n : *len);
    *len = n;
    return 0;
}

/* ---- streamed request bodies (server_conn.c's shmipc__server_upload_pump delivers) ---- */

int shmipc__server_upload(struct shmipc_http_response *res, shmipc__server_body_fn on_body,
                          shmipc__server_body_end_fn on_end, void *data)
{
    struct server_conn *sc = res != NULL ? res->conn : NULL;
    if (sc == NULL || on_body == NULL || !res->deferred || !sc->defer_on ||
        sc->state != SHMIPC__CS_HANDLING || sc->up_on ||
        !shmipc__http_conn_body_pending(&sc->http) || sc->http.upload)
        return shmipc__fail(SHMIPC_EINVAL,
                            "upload: not in a deferring handler that runs at a request's head");
    sc->up_on = 1;
    sc->up_held = 0;
    sc->on_body = on_body;
    sc->on_body_end = on_end;
    sc->up_data = data;
    sc->http.upload = 1;
    sc->up_at = shmipc__server_conn_after(sc, sc->w->srv->stall_ms);
    sc->w->stats.uploads++;
    return 0;
}

int shmipc__server_upload_resume(struct shmipc__server_ticket t)
{
    struct server_conn *sc = t.sc;
    int rc = ticket_check(t, "upload_resume");
    if (rc < 0)
        return rc;
    if (!sc->up_on)
        return shmipc__fail(SHMIPC_ECLOSED, "upload_resume: the body was read to its end");
    sc->up_held = 0;
    sc->up_at = shmipc__server_conn_after(sc, sc->w->srv->stall_ms);
    shmipc__server_upload_pump(sc);
    return 0;
}
