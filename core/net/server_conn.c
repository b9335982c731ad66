/*
 * The HTTP server's connection lifecycle, the one place where a connection's state
 * (conn_state.h) changes: the event dispatch through the table, its named transitions, the
 * per-connection timer, and the receive buffer and batch a transition works on.
 * Owns struct server_conn from accept to free (the workers' pools it borrows from are
 * server_worker.c's; the deferred request's ticket and answer are server_defer.c's).
 * May call: the reactor, http_conn (parsing and batching), the request dispatch
 * (shmipc__server_handle(), server_route.c), the WebSocket layer (server_ws.c) for
 * upgraded connections, server_worker.c's pools and server_defer.c's cancel. See
 * docs/http.md, "Connection lifecycle".
 *
 * Per connection: bytes from the reactor are appended to the connection's receive buffer and
 * shmipc__http_conn_process() answers every complete request there into one batch, which
 * leaves in one vectored send. While a batch is in flight nothing else is processed: its
 * iovecs may point into the receive buffer (a request body echoed back) and into the
 * connection's arena, so new bytes are only appended, and the next batch is built when the
 * send completes. Receive buffers and batch arenas come from per-worker free lists and are
 * held only while there is something in them, so an idle keep-alive connection costs its
 * small struct only.
 *
 * The lifecycle is one state machine (conn_state.h; docs/http.md, "Connection lifecycle"):
 * every reactor callback, the timer and a graceful stop become an event that
 * shmipc__server_conn_event() runs through the table; the act_* functions and conn_serve(),
 * ws_start(), shmipc__server_conn_linger(), linger_wait() and shmipc__server_conn_close() are
 * its named transitions.
 *
 * Timeouts use one timer per connection, started lazily: the connection keeps its deadline
 * and the timer, when it fires early, starts again for what is left, so a keep-alive
 * request does not touch the timer heap.
 */
#include "net/server_int.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static void conn_serve(struct server_conn *sc);
static void defer_start(struct server_conn *sc);
static void ws_start(struct server_conn *sc, size_t consumed);
static void stream_kick(struct server_conn *sc);
static void stream_sent(struct server_conn *sc);
static void stream_timer(struct server_conn *sc);

/* ---- the connection ---- */

static size_t conn_size(const struct shmipc_server *s)
{
    return sizeof(struct server_conn) + s->limits.max_headers * sizeof(struct shmipc__http_field);
}

/* ---- timers ---- */

static void conn_timeout(struct shmipc__timer *t);

/*
 * Sets the connection's deadline (0: none). The timer is started only when it is idle or
 * would fire after the new deadline; a later deadline is picked up when it fires.
 */
void shmipc__server_conn_set_deadline(struct server_conn *sc, uint64_t deadline)
{
    uint64_t now = shmipc__loop_now_ms(sc->w->loop);
    sc->deadline = deadline;
    if (deadline == 0)
        return;
    if (shmipc__timer_active(&sc->timer) && sc->timer_at <= deadline)
        return;
    sc->timer_at = deadline;
    if (shmipc__timer_start(&sc->timer, deadline > now ? deadline - now : 0) < 0) {
        SHMIPC__LOG(SHMIPC__LOG_WARN, "server: timer: %s; closing the connection",
                    shmipc__detail());
        sc->deadline = 0;
    }
}

uint64_t shmipc__server_conn_after(const struct server_conn *sc, uint32_t ms)
{
    return shmipc__loop_now_ms(sc->w->loop) + ms;
}

/* The deadline of a timeout that may be off (negative: none, 0 for set_deadline). */
static uint64_t after_or_never(const struct server_conn *sc, int64_t ms)
{
    return ms < 0 ? 0 : shmipc__server_conn_after(sc, (uint32_t)ms);
}

/*
 * The lingering close's wait, once the last response has left (the reactor shuts the write
 * side down right behind it): input is drained until the peer's FIN, LINGER_MS or
 * LINGER_BYTES, so that closing does not answer unread bytes with a reset that would destroy
 * the response in the peer's receive queue. A FIN that already came ends it at once.
 */
static void linger_wait(struct server_conn *sc)
{
    sc->state = SHMIPC__CS_LINGERING;
    if (sc->peer_done) {
        shmipc__server_conn_close(sc);
        return;
    }
    shmipc__server_conn_set_deadline(sc, shmipc__server_conn_after(sc, LINGER_MS));
    /* CLOSING stopped reading; the drain (bounded by LINGER_BYTES and LINGER_MS) reads again. */
    if (shmipc__conn_resume_read(sc->conn) < 0)
        shmipc__server_conn_close(sc);
}

/* Half-close (nginx's lingering_close): the peer gets a FIN after what was queued, which is
 * sent whole under the send timeout; the linger timer starts only when it has left. */
void shmipc__server_conn_linger(struct server_conn *sc)
{
    sc->state = sc->inflight ? SHMIPC__CS_CLOSING : SHMIPC__CS_LINGERING;
    sc->in_head = 0;
    if (shmipc__conn_shutdown(sc->conn) < 0) {
        shmipc__server_conn_close(sc);
        return;
    }
    /*
     * While the last response goes out, input nobody will answer is not read: thrown away,
     * it would have no bound but the send timeout, which a peer that takes a byte now and then
     * extends forever (a worker receiving at full speed all that time). TCP pushes back
     * instead; a reset still ends the send (ERROR), and linger_wait() reads again.
     */
    if (sc->inflight && shmipc__conn_pause_read(sc->conn) < 0) {
        shmipc__server_conn_close(sc);
        return;
    }
    if (!sc->inflight)
        linger_wait(sc);
}

/* The send timeout runs between two moves of the output (nginx's send_timeout), not over a
 * whole response: it is extended while the peer takes bytes. */
static int send_progress(struct server_conn *sc)
{
    size_t pending = shmipc__conn_pending(sc->conn);
    if (pending >= sc->tx_mark)
        return 0;
    sc->tx_mark = pending;
    return 1;
}

/* The timer fired: a TIMEOUT event once the deadline has passed (a WebSocket keeps its own
 * deadlines: ws_timeout). */
static void conn_timeout(struct shmipc__timer *t)
{
    struct server_conn *sc = t->data;
    uint64_t now = shmipc__loop_now_ms(sc->w->loop);
    if (sc->state != SHMIPC__CS_UPGRADED) {
        if (sc->deadline == 0)
            return;
        if (sc->deadline > now) {
            sc->timer_at = sc->deadline;
            if (shmipc__timer_start(&sc->timer, sc->deadline - now) == 0)
                return;
        }
    }
    shmipc__server_conn_event(sc, SHMIPC__CE_TIMEOUT, NULL, 0);
}

/* ---- lifecycle ---- */

static void release_list(struct release **list)
{
    while (*list != NULL) {
        struct release *r = *list;
        *list = r->next;
        if (r->fn != NULL)
            r->fn(r->user_data);
        free(r);
    }
}

static void release_all(struct server_conn *sc)
{
    release_list(&sc->releases);
}

static void conn_free(struct server_conn *sc)
{
    struct shmipc__server_worker *w = sc->w;
    if (sc->ws != NULL) {
        shmipc__ws_conn_destroy(&sc->ws->c);
        free(sc->ws);
        sc->ws = NULL;
    }
    release_all(sc);
    release_list(&sc->answer_rel);
    shmipc__server_stream_free(sc);
    shmipc__server_tx_put(w, sc->tx);
    shmipc__server_rx_put(w, sc->rx, sc->rx_cap);
    free(sc->rx_retired);
    sc->next = w->free_conns;
    w->free_conns = sc;
}

static void conn_unlink(struct server_conn *sc)
{
    struct shmipc__server_worker *w = sc->w;
    if (sc->prev != NULL)
        sc->prev->next = sc->next;
    else
        w->conns = sc->next;
    if (sc->next != NULL)
        sc->next->prev = sc->prev;
    sc->prev = sc->next = NULL;
    w->nconns--;
}

/* A send of the connection is in flight: its callback will come. */
static int conn_sending(const struct server_conn *sc)
{
    return sc->inflight || (sc->ws != NULL && sc->ws->sending);
}

/*
 * Closes now. The memory waits for the sends in flight, whose callbacks come with ECLOSED.
 * A WebSocket that did not finish its close handshake reports on_close (1006) first.
 */
void shmipc__server_conn_close(struct server_conn *sc)
{
    if (sc->state == SHMIPC__CS_CLOSED)
        return;
    /* Whatever closes the connection while its request is at a worker (the client's FIN or
     * reset, a timeout, the stop's end) cancels the request there. */
    shmipc__server_defer_cancel(sc, SHMIPC__SERVER_CANCEL_CLIENT_GONE);
    sc->state = SHMIPC__CS_CLOSED;
    sc->deadline = 0;
    shmipc__timer_stop(&sc->timer);
    if (sc->ws != NULL && !sc->ws->reported)
        shmipc__ws_conn_eof(&sc->ws->c);
    conn_unlink(sc);
    shmipc__conn_close(sc->conn);
    if (!conn_sending(sc))
        conn_free(sc);
}

/* Drops the bytes the last batch was made of from the front of the receive buffer. */
static void rx_drop_done(struct server_conn *sc)
{
    struct shmipc__server_worker *w = sc->w;
    free(sc->rx_retired);
    sc->rx_retired = NULL;
    if (sc->rx_done > 0) {
        sc->rx_len -= sc->rx_done;
        memmove(sc->rx, sc->rx + sc->rx_done, sc->rx_len);
        sc->rx_done = 0;
    }
    if (sc->rx_len == 0 && sc->rx != NULL) {
        shmipc__server_rx_put(w, sc->rx, sc->rx_cap);
        sc->rx = NULL;
        sc->rx_cap = 0;
    }
}

/* Appends received bytes. Fails when the connection holds more than any request may need. */
static int rx_append(struct server_conn *sc, const void *data, size_t len)
{
    struct shmipc__server_worker *w = sc->w;
    size_t need = sc->rx_len + len;
    if (need > sc->rx_cap) {
        size_t keep = sc->rx_len - sc->rx_done; /* bytes not yet made into responses */
        size_t cap = sc->rx_cap > RX_STD ? sc->rx_cap : RX_STD;
        char *nb;
        if (keep + len > w->srv->rx_max)
            return shmipc__fail(SHMIPC_EMSGSIZE, "server: %zu unanswered bytes on one connection",
                                keep + len);
        while (cap < keep + len)
            cap *= 2;
        nb = cap == RX_STD ? shmipc__server_rx_get(w) : malloc(cap);
        if (nb == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "server: %zu-byte receive buffer", cap);
        if (sc->rx != NULL) {
            memcpy(nb, sc->rx + sc->rx_done, keep);
            /* The batch in flight may point into the old buffer: keep it until it is sent.
             * Only one buffer can be in that state, since the new one holds no answered
             * bytes. */
            if (sc->inflight && sc->rx_done > 0)
                sc->rx_retired = sc->rx;
            else
                shmipc__server_rx_put(w, sc->rx, sc->rx_cap);
        }
        sc->rx = nb;
        sc->rx_cap = cap;
        sc->rx_len = keep;
        sc->rx_done = 0;
    }
    memcpy(sc->rx + sc->rx_len, data, len);
    sc->rx_len += len;
    return 0;
}

/* The deadline that applies once a batch has been built and there is nothing in flight. */
static void update_deadline(struct server_conn *sc)
{
    const struct shmipc_server *s = sc->w->srv;
    if (sc->rx_len > 0 && sc->http.phase == 0) {
        /* Part of a head is here (phase 0 is http_conn's "reading a head"): the header
         * timeout runs from its first byte and is not extended by more bytes; the first
         * request's runs from accept (set there), which its first byte does not restart. */
        if (!sc->in_head) {
            sc->in_head = 1;
            if (!sc->fresh)
                shmipc__server_conn_set_deadline(sc, after_or_never(sc, s->header_ms));
        }
        return;
    }
    sc->in_head = 0;
    /* A body that stops arriving, the first request's too: the header timeout covers heads
     * only (the first request's body is no part of the wait for it). */
    if (sc->http.phase != 0)
        shmipc__server_conn_set_deadline(sc, shmipc__server_conn_after(sc, s->stall_ms));
    else if (sc->fresh)
        shmipc__server_conn_set_deadline(sc, after_or_never(sc, s->header_ms));
    else /* idle between requests: the keep-alive timeout, which may be off */
        shmipc__server_conn_set_deadline(sc, after_or_never(sc, s->idle_ms));
}

/* The batch in flight was written (or failed): a SENT or ERROR event. */
static void on_sent(struct shmipc__conn *c, int status, void *data)
{
    struct server_conn *sc = data;
    (void)c;
    sc->inflight = 0;
    release_all(sc);
    shmipc__server_tx_put(sc->w, sc->tx);
    sc->tx = NULL;
    shmipc__server_conn_event(sc, status < 0 ? SHMIPC__CE_ERROR : SHMIPC__CE_SENT, NULL, 0);
}

/* WRITING, SENT: the next batch for what came meanwhile, the close the peer's FIN asked for,
 * the lingering close of a graceful stop, or READING again. */
static void act_next(struct server_conn *sc)
{
    struct shmipc__server_worker *w = sc->w;
    /* act_buffer stopped reading behind the batch: it has left. Held bytes and the socket's
     * come in a later dispatch, answered in READING or buffered behind the next batch. */
    if (shmipc__conn_read_paused(sc->conn) && shmipc__conn_resume_read(sc->conn) < 0) {
        shmipc__server_conn_close(sc);
        return;
    }
    rx_drop_done(sc);
    sc->state = SHMIPC__CS_READING;
    if (sc->rx_len > 0) {
        conn_serve(sc); /* pipelined leftovers, or bytes that came while sending */
        return;
    }
    if (sc->peer_done)
        shmipc__server_conn_close(sc);
    else if (w->draining)
        shmipc__server_conn_linger(sc);
    else
        update_deadline(sc);
}

/* Answers what the receive buffer holds. Called with no batch in flight. */
static void conn_serve(struct server_conn *sc)
{
    struct shmipc__server_worker *w = sc->w;
    size_t len = sc->rx_len, consumed = 0;
    int verdict;

    if (sc->tx == NULL) {
        sc->tx = shmipc__server_tx_get(w);
        if (sc->tx == NULL) {
            SHMIPC__LOG(SHMIPC__LOG_WARN, "server: out of memory for a response batch");
            shmipc__server_conn_close(sc);
            return;
        }
    }
    shmipc__http_batch_init(&sc->batch, sc->tx->iov, TX_IOV, sc->tx->arena, TX_ARENA, &w->date);
    sc->batch.server = w->srv->server_name;
    sc->state = SHMIPC__CS_HANDLING;
    verdict = SHMIPC__HTTP_CONN_MORE;
    if (sc->answered) {
        /* A deferred request's answer goes first; pipelined requests behind it follow. */
        sc->answered = 0;
        /* An accepted upgrade (sc->ws) is no keep-alive: neither the keep-alive timeout nor a
         * stop ends it here. Accepted before the stop (ws_accept refuses one after it), it
         * opens and is told to go away as the stop tells every WebSocket (ws_start). */
        if (sc->ws == NULL && shmipc__server_keep_off(sc))
            sc->http.deferred.flags |= SHMIPC__HTTP_RESP_CLOSE;
        struct release **tail = &sc->releases;
        while (*tail != NULL)
            tail = &(*tail)->next;
        *tail = sc->answer_rel;
        sc->answer_rel = NULL;
        if (shmipc__http_conn_complete(&sc->http, &sc->batch) == 1)
            verdict = SHMIPC__HTTP_CONN_CLOSE;
    }
    if (verdict == SHMIPC__HTTP_CONN_CLOSE)
        consumed = len; /* nothing after a closing answer is read */
    else
        verdict = shmipc__http_conn_process(&sc->http, sc->rx, &len, &consumed, &sc->batch,
                                            w->srv->pipeline);
    sc->rx_len = len;
    sc->rx_done = consumed;
    if (consumed > 0)
        sc->fresh = 0;
    if (verdict == SHMIPC__HTTP_CONN_DEFER) {
        defer_start(sc);
        return;
    }
    if (sc->batch.niov > 0) {
        if (shmipc__conn_sendv(sc->conn, sc->batch.iov, (int)sc->batch.niov, on_sent, sc) < 0) {
            shmipc__server_conn_close(sc);
            return;
        }
        sc->inflight = 1;
        sc->state = SHMIPC__CS_WRITING;
        sc->tx_mark = shmipc__conn_pending(sc->conn);
        if (sc->ws != NULL && verdict != SHMIPC__HTTP_CONN_CLOSE) {
            ws_start(sc, consumed);
            return;
        }
        /* The send timeout: the peer must take some of the batch within the keep-alive
         * timeout, again and again until it is sent (conn_timeout). */
        sc->in_head = 0;
        shmipc__server_conn_set_deadline(sc, shmipc__server_conn_after(sc, w->srv->stall_ms));
        if (verdict == SHMIPC__HTTP_CONN_CLOSE)
            shmipc__server_conn_linger(sc);
        return;
    }
    shmipc__server_tx_put(w, sc->tx);
    sc->tx = NULL;
    release_all(sc);
    rx_drop_done(sc);
    sc->state = SHMIPC__CS_READING;
    if (verdict == SHMIPC__HTTP_CONN_CLOSE) {
        shmipc__server_conn_linger(sc);
        return;
    }
    /* Only part of a request is here: with the peer done sending, it cannot complete. */
    if (sc->peer_done) {
        shmipc__server_conn_close(sc);
        return;
    }
    update_deadline(sc);
}

/* A streamed body being read (not held by its owner) is given up when it stops arriving for
 * the stall timeout: the earlier of that and `d` (0: none). */
static uint64_t upload_deadline(const struct server_conn *sc, uint64_t d)
{
    if (!sc->up_on || sc->up_held || sc->up_at == 0)
        return d;
    return d == 0 || sc->up_at < d ? sc->up_at : d;
}

/* Whether a streamed body stopped arriving for the stall timeout: then the request is
 * cancelled (TIMEOUT) and the connection closed, as a plain body that stops arriving is. */
static int upload_stalled(struct server_conn *sc, uint64_t now)
{
    if (!sc->up_on || sc->up_held || sc->up_at == 0 || now < sc->up_at)
        return 0;
    sc->w->stats.timeouts++;
    shmipc__server_defer_cancel(sc, SHMIPC__SERVER_CANCEL_TIMEOUT);
    shmipc__server_conn_close(sc);
    return 1;
}

/* DEFERRED's deadline: the request's (504), and the send timeout while the answers before it
 * are in flight, whichever comes first; none when neither applies. */
static void defer_deadline(struct server_conn *sc)
{
    uint64_t d = sc->answered ? 0 : sc->defer_deadline;
    d = upload_deadline(sc, d);
    if (sc->inflight) {
        uint64_t send = shmipc__server_conn_after(sc, sc->w->srv->stall_ms);
        d = d == 0 || send < d ? send : d;
    }
    shmipc__server_conn_set_deadline(sc, d);
}

/* HANDLING ended with a deferred request: send what came before it, then wait. */
static void defer_start(struct server_conn *sc)
{
    struct shmipc__server_worker *w = sc->w;
    sc->in_head = 0;
    sc->state = SHMIPC__CS_DEFERRED;
    if (sc->batch.niov > 0) {
        if (shmipc__conn_sendv(sc->conn, sc->batch.iov, (int)sc->batch.niov, on_sent, sc) < 0) {
            shmipc__server_conn_close(sc);
            return;
        }
        sc->inflight = 1;
        sc->tx_mark = shmipc__conn_pending(sc->conn);
    } else {
        shmipc__server_tx_put(w, sc->tx);
        sc->tx = NULL;
        release_all(sc);
        rx_drop_done(sc);
    }
    defer_deadline(sc);
    /* Body bytes that came with the head go to a streamed body's owner now. */
    if (sc->up_on)
        shmipc__server_upload_pump(sc);
}

/* DEFERRED with nothing in flight and the answer here: out it goes, with what is behind it. */
static void defer_answer(struct server_conn *sc)
{
    if (shmipc__conn_read_paused(sc->conn) && shmipc__conn_resume_read(sc->conn) < 0) {
        shmipc__server_conn_close(sc);
        return;
    }
    conn_serve(sc);
}

/* DEFERRED, SENT: the answers before the deferred one have left. */
static void act_hold(struct server_conn *sc)
{
    rx_drop_done(sc);
    if (sc->up_on) {
        shmipc__server_upload_pump(sc);
        if (sc->state != SHMIPC__CS_DEFERRED)
            return;
    }
    if (sc->streaming)
        stream_sent(sc);
    else if (sc->answered)
        defer_answer(sc);
    else
        defer_deadline(sc);
}

/* DEFERRED, TIMEOUT: the request's deadline (504, the worker is told), or the send timeout
 * of the answers before it (no progress: closed, as in WRITING). */
static void act_defer_timer(struct server_conn *sc)
{
    uint64_t now = shmipc__loop_now_ms(sc->w->loop);
    if (upload_stalled(sc, now))
        return;
    if (sc->streaming) {
        stream_timer(sc);
        return;
    }
    if (sc->answered && !sc->inflight) { /* completed from inside a handler: act_answer */
        defer_answer(sc);
        return;
    }
    if (sc->defer_on && !sc->answered && sc->defer_deadline != 0 && now >= sc->defer_deadline) {
        sc->w->stats.timeouts++;
        shmipc__server_defer_cancel(sc, SHMIPC__SERVER_CANCEL_TIMEOUT);
        struct shmipc__http_response *r = &sc->http.deferred;
        uint16_t keep = r->flags;
        memset(r, 0, sizeof *r);
        r->flags = keep;
        shmipc__http_response_error(r, 504);
        sc->answered = 1;
        if (!sc->inflight)
            defer_answer(sc);
        else
            defer_deadline(sc);
        return;
    }
    if (sc->inflight && !send_progress(sc)) {
        sc->w->stats.timeouts++;
        shmipc__server_conn_close(sc);
        return;
    }
    defer_deadline(sc);
}

/* DEFERRED, COMPLETE: the answer goes now, once the batch in flight has left, or (from inside
 * a handler) on the timer right after it. */
static void act_answer(struct server_conn *sc)
{
    if (sc->streaming)
        stream_kick(sc);
    else if (sc->inflight)
        defer_deadline(sc);
    else if (sc->w->in_handler || sc->in_pump)
        /* complete() from a route handler (or from a streamed body's callback, whose bytes
         * the pump is moving) (another client's request, as in long polling):
         * serving here would run this connection's pipelined handlers inside that one, over
         * the worker's response scratch it is using. The timer answers once it returned. */
        shmipc__server_conn_set_deadline(sc, shmipc__loop_now_ms(sc->w->loop));
    else
        defer_answer(sc);
}

/* ---- a streamed answer (DEFERRED; server_defer.c's stream_* calls) ----
 *
 * The head, the pieces queued meanwhile and, once the owner ended the stream, the last chunk
 * go out in batches, one in flight at a time: what is queued while one is sent leaves
 * together in the next. The connection stays DEFERRED until the last batch has left; then it
 * goes on as after any answer (pipelined requests, keep-alive, or the close). */

/* The deadline while streaming: the send timeout while a batch is in flight, and the owner's
 * (between two pieces) while it is not held back by the queued bytes. */
static void stream_deadline(struct server_conn *sc)
{
    uint64_t d = upload_deadline(sc, sc->sq_bytes < sc->stream_mark ? sc->stream_at : 0);
    if (sc->inflight)
        d = d == 0 || sc->send_at < d ? sc->send_at : d;
    shmipc__server_conn_set_deadline(sc, d);
}

/* The stream's end went out whole: the connection goes on as after any answer. */
static void stream_done(struct server_conn *sc)
{
    /* A streamed request body not read to its end: its rest is never parsed as a request. */
    int closes = sc->stream_closes || shmipc__http_conn_body_pending(&sc->http);
    shmipc__server_stream_free(sc);
    shmipc__http_conn_stream_done(&sc->http, closes);
    if (closes) {
        shmipc__server_conn_linger(sc);
        return;
    }
    sc->deadline = 0;
    act_next(sc); /* pipelined requests behind it, the peer's FIN, or keep-alive */
}

/* Nothing in flight: the next batch of the stream, if there is anything to send. */
static void stream_send(struct server_conn *sc)
{
    struct shmipc__server_worker *w = sc->w;
    if (sc->stream_end == STREAM_ABORTED) {
        shmipc__server_conn_close(sc); /* the client sees the body cut short */
        return;
    }
    if (sc->head_sent && sc->sq_head == NULL && sc->stream_end != STREAM_ENDED) {
        stream_deadline(sc); /* waiting for the owner */
        return;
    }
    if (sc->tx == NULL && (sc->tx = shmipc__server_tx_get(w)) == NULL) {
        SHMIPC__LOG(SHMIPC__LOG_WARN, "server: out of memory for a response batch");
        shmipc__server_conn_close(sc);
        return;
    }
    shmipc__http_batch_init(&sc->batch, sc->tx->iov, TX_IOV, sc->tx->arena, TX_ARENA, &w->date);
    sc->batch.server = w->srv->server_name;
    if (!sc->head_sent) {
        if (shmipc__server_keep_off(sc))
            sc->http.deferred.flags |= SHMIPC__HTTP_RESP_CLOSE;
        int rc = shmipc__http_conn_stream_head(&sc->http, &sc->batch, &sc->stream_resp);
        if (rc < 0) {
            SHMIPC__LOG(SHMIPC__LOG_WARN, "server: a streamed head: %s; closing", shmipc__detail());
            shmipc__server_conn_close(sc);
            return;
        }
        sc->stream_closes = (uint8_t)rc;
        sc->head_sent = 1;
        /* The head's memory (headers, content type) is released with this batch. */
        struct release **tail = &sc->releases;
        while (*tail != NULL)
            tail = &(*tail)->next;
        *tail = sc->answer_rel;
        sc->answer_rel = NULL;
    }
    /* Pieces while a chunk (3 iovecs) and the last chunk still fit. */
    struct spiece **sent_tail = &sc->sq_sent;
    while (sc->sq_head != NULL && sc->batch.iov_cap - sc->batch.niov >= 4 &&
           sc->batch.cap - sc->batch.used >= 2 * SHMIPC__HTTP_CHUNK_HEAD_MAX + 8) {
        struct spiece *pc = sc->sq_head;
        if (shmipc__http_batch_add_chunk(&sc->batch, &sc->stream_resp, pc->data, pc->len) < 0)
            break;
        sc->sq_head = pc->next;
        if (sc->sq_head == NULL)
            sc->sq_tail = &sc->sq_head;
        pc->next = NULL;
        *sent_tail = pc;
        sent_tail = &pc->next;
    }
    if (sc->stream_end == STREAM_ENDED && sc->sq_head == NULL &&
        shmipc__http_batch_add_last_chunk(&sc->batch, &sc->stream_resp) == 0)
        sc->last_sent = 1;
    if (sc->batch.niov == 0) {
        /* Nothing goes on the wire (HEAD, 204, 304): the pieces are done with. */
        shmipc__server_tx_put(w, sc->tx);
        sc->tx = NULL;
        release_all(sc);
        stream_sent(sc);
        return;
    }
    if (shmipc__conn_sendv(sc->conn, sc->batch.iov, (int)sc->batch.niov, on_sent, sc) < 0) {
        shmipc__server_conn_close(sc);
        return;
    }
    sc->inflight = 1;
    sc->tx_mark = shmipc__conn_pending(sc->conn);
    sc->send_at = shmipc__server_conn_after(sc, w->srv->stall_ms);
    stream_deadline(sc);
}

/* A batch of the stream left (or nothing was to be sent): its pieces are released, the owner
 * hears it may go on, and the next batch goes. */
static void stream_sent(struct server_conn *sc)
{
    struct spiece *pc = sc->sq_sent;
    size_t freed = 0;
    sc->sq_sent = NULL;
    while (pc != NULL) {
        struct spiece *next = pc->next;
        freed += pc->len;
        if (pc->fn != NULL)
            pc->fn(pc->user_data);
        free(pc);
        pc = next;
    }
    sc->sq_bytes -= freed;
    if (sc->last_sent) {
        stream_done(sc);
        return;
    }
    if (freed > 0 && sc->sq_bytes < sc->stream_mark && sc->on_drain != NULL) {
        /* The owner was held back: its next piece is due from now. */
        if (sc->stream_ms)
            sc->stream_at = shmipc__server_conn_after(sc, sc->stream_ms);
        sc->on_drain(sc->drain_data);
    }
    stream_send(sc);
}

/* COMPLETE while streaming: the head, a piece, the end or the abort was given. */
static void stream_kick(struct server_conn *sc)
{
    if (sc->stream_end == STREAM_ABORTED && !sc->in_pump) {
        shmipc__server_conn_close(sc);
        return;
    }
    if (sc->inflight)
        return; /* the next batch goes when this one has left (stream_sent) */
    if (sc->w->in_handler || sc->in_pump) {
        /* As act_answer: not from inside another connection's handler. */
        shmipc__server_conn_set_deadline(sc, shmipc__loop_now_ms(sc->w->loop));
        return;
    }
    stream_send(sc);
}

/* TIMEOUT while streaming: the send timeout (the client takes nothing: closed), the owner's
 * (no piece for the deferral's timeout: cancelled and closed, the body cut short), or the
 * deferred kick of stream_kick. */
static void stream_timer(struct server_conn *sc)
{
    uint64_t now = shmipc__loop_now_ms(sc->w->loop);
    if (sc->inflight && now >= sc->send_at) {
        if (!send_progress(sc)) {
            sc->w->stats.timeouts++;
            shmipc__server_conn_close(sc);
            return;
        }
        sc->send_at = shmipc__server_conn_after(sc, sc->w->srv->stall_ms);
    }
    if (sc->defer_on && sc->stream_at != 0 && now >= sc->stream_at &&
        sc->sq_bytes < sc->stream_mark) {
        sc->w->stats.timeouts++;
        shmipc__server_defer_cancel(sc, SHMIPC__SERVER_CANCEL_TIMEOUT);
        shmipc__server_conn_close(sc);
        return;
    }
    if (!sc->inflight)
        stream_send(sc);
    else
        stream_deadline(sc);
}

/* ---- a streamed request body (DEFERRED; shmipc__server_upload) ---- */

/*
 * The body went over max_body (413) or its framing is invalid (400): the owner's deferral is
 * cancelled with the reason, and the client gets the status (with a close) if no answer
 * started, else the connection closes. Runs inside the pump: the answer goes from the timer.
 */
static void upload_fail(struct server_conn *sc, int status)
{
    sc->up_on = 0;
    shmipc__server_defer_cancel(sc, status == 413 ? SHMIPC__SERVER_CANCEL_TOO_LARGE
                                                  : SHMIPC__SERVER_CANCEL_BAD_BODY);
    if (sc->streaming) {
        if (!sc->head_sent && sc->stream_end == 0) {
            /* Nothing of the answer left yet: the status replaces it. */
            shmipc__server_stream_free(sc);
            sc->streaming = 0;
        } else {
            sc->stream_end = STREAM_ABORTED;
            shmipc__server_conn_set_deadline(sc, shmipc__loop_now_ms(sc->w->loop));
            return;
        }
    }
    if (sc->answered)
        return; /* an answer is waiting to go; it closes (the body is pending) */
    struct shmipc__http_response *r = &sc->http.deferred;
    uint16_t keep = r->flags;
    memset(r, 0, sizeof *r);
    r->flags = keep;
    shmipc__http_response_error(r, status);
    r->flags |= SHMIPC__HTTP_RESP_CLOSE;
    sc->answered = 1;
    if (sc->inflight)
        defer_deadline(sc); /* the answer goes when the batch has left (act_hold) */
    else
        shmipc__server_conn_set_deadline(sc, shmipc__loop_now_ms(sc->w->loop));
}

/*
 * Hands the body bytes received so far to the upload's owner: decoded in place in the receive
 * buffer behind what the batch in flight may point into (rx_done), given as one piece, then
 * dropped, so the buffer holds at most what came since the last pump (bounded by RX_PAUSE
 * while the owner holds the body: act_buffer stops reading there). At the body's end the
 * owner hears it, and what follows is the next request, served after the answer.
 */
void shmipc__server_upload_pump(struct server_conn *sc)
{
    static char none[1]; /* the buffer of a pump with no bytes (a Content-Length: 0 end) */
    struct shmipc__server_worker *w = sc->w;
    if (!sc->up_on || sc->up_held || sc->in_pump || sc->state != SHMIPC__CS_DEFERRED)
        return;
    size_t held = sc->rx_len - sc->rx_done;
    if (held > w->stats.upload_rx_max)
        w->stats.upload_rx_max = held;
    char *buf = sc->rx != NULL ? sc->rx + sc->rx_done : none;
    size_t len = held, piece, drop;
    int status;
    sc->in_pump = 1;
    int rc = shmipc__http_conn_upload(&sc->http, buf, &len, &piece, &drop, &status);
    sc->rx_len = sc->rx_done + len;
    if (rc < 0) {
        upload_fail(sc, status);
    } else {
        if (piece > 0) {
            w->stats.upload_bytes += piece;
            if (sc->on_body(sc->up_data, buf, piece) != 0)
                sc->up_held = 1;
        }
        if (drop > 0) {
            memmove(buf, buf + drop, len - drop);
            sc->rx_len -= drop;
        }
        if (rc == 1) {
            shmipc__server_body_end_fn end = sc->on_body_end;
            sc->up_on = 0;
            if (end != NULL && sc->defer_on)
                end(sc->up_data);
        }
    }
    sc->in_pump = 0;
    if (sc->state != SHMIPC__CS_DEFERRED)
        return;
    /* Nothing left that the batch in flight points into: the buffer goes back to the pool. */
    if (sc->rx_len == 0 && sc->rx_done == 0 && sc->rx_retired == NULL && sc->rx != NULL) {
        shmipc__server_rx_put(w, sc->rx, sc->rx_cap);
        sc->rx = NULL;
        sc->rx_cap = 0;
    }
    /* The stall timeout of a body being read is armed (a resumed one had none). */
    if (sc->up_on && !sc->up_held && (sc->deadline == 0 || sc->up_at < sc->deadline))
        shmipc__server_conn_set_deadline(sc, sc->up_at);
    /* Reading stopped behind a held body (act_buffer) goes on once it is taken again. */
    if (sc->up_on && !sc->up_held && shmipc__conn_read_paused(sc->conn) &&
        shmipc__conn_resume_read(sc->conn) < 0)
        shmipc__server_conn_close(sc);
}

/* READING, DATA: append the bytes and answer what is complete. */
static void act_serve(struct server_conn *sc, const void *data, size_t len)
{
    if (rx_append(sc, data, len) < 0) {
        SHMIPC__LOG(SHMIPC__LOG_DEBUG, "%s; closing", shmipc__detail());
        shmipc__server_conn_close(sc);
        return;
    }
    conn_serve(sc);
}

/*
 * WRITING, DATA: append the bytes; they are answered when the batch in flight is sent. The
 * deadline stays the send timeout's: bytes the peer sends are no progress of the response, and
 * a peer that trickled a body while taking nothing would otherwise hold the connection (and
 * its response) for as long as the body lasts. The body's own deadline starts again in READING.
 * Past RX_PAUSE unanswered bytes reading stops until the batch has left (act_next), as nginx
 * reads nothing more while it writes: input piling up behind a large response would otherwise
 * reach rx_max and close the connection with the started response cut short, and holding
 * more is memory spent on a peer that is not reading. TCP pushes back meanwhile.
 */
static void act_buffer(struct server_conn *sc, const void *data, size_t len)
{
    if (rx_append(sc, data, len) < 0) {
        SHMIPC__LOG(SHMIPC__LOG_DEBUG, "%s; closing", shmipc__detail());
        shmipc__server_conn_close(sc);
        return;
    }
    if (sc->up_on) {
        /* A streamed body's bytes: the stall timeout runs again from here (nginx's
         * client_body_timeout, between two reads). */
        sc->up_at = shmipc__server_conn_after(sc, sc->w->srv->stall_ms);
        shmipc__server_upload_pump(sc);
        if (sc->state == SHMIPC__CS_CLOSED)
            return;
    }
    if (sc->rx_len - sc->rx_done > RX_PAUSE && !shmipc__conn_read_paused(sc->conn) &&
        shmipc__conn_pause_read(sc->conn) < 0)
        shmipc__server_conn_close(sc);
}

/* CLOSING or LINGERING, DATA: nobody will answer it. While the last response is still going
 * out the send timeout bounds the connection; afterwards the drain has a byte limit too. */
static void act_drain(struct server_conn *sc, size_t len)
{
    if (sc->state != SHMIPC__CS_LINGERING)
        return;
    sc->drained += len;
    if (sc->drained > LINGER_BYTES)
        shmipc__server_conn_close(sc);
}

/* CLOSING or WRITING, TIMEOUT: the send timeout runs again while the peer takes bytes; a
 * peer that took nothing for that long loses what it did not take. */
static void act_send_timer(struct server_conn *sc)
{
    if (send_progress(sc)) {
        shmipc__server_conn_set_deadline(sc, shmipc__server_conn_after(sc, sc->w->srv->stall_ms));
        return;
    }
    sc->w->stats.timeouts++;
    shmipc__server_conn_close(sc);
}

/* UPGRADED: the WebSocket layer's part of each event. */
static void act_ws(struct server_conn *sc, int ev, const void *data, size_t len)
{
    switch (ev) {
    case SHMIPC__CE_DATA:
        /* The reactor's receive buffers are the loop's own writable memory, lent for the
         * call; the WebSocket layer unmasks payloads in place there, or while copying them
         * out (and may read the rest of a large payload itself: ws_read_now). */
        shmipc__server_ws_input(sc, (char *)(uintptr_t)data, len);
        break;
    case SHMIPC__CE_SENT:
        rx_drop_done(sc); /* the 101's batch; frames complete in ws_sent */
        break;
    case SHMIPC__CE_PEER_FIN:
        shmipc__server_ws_peer_gone(sc);
        break;
    case SHMIPC__CE_ERROR:
        /* A reset, or a failed send: the close frame may still be in the input. */
        shmipc__server_ws_error(sc);
        break;
    case SHMIPC__CE_TIMEOUT:
        shmipc__server_ws_timeout(sc);
        break;
    case SHMIPC__CE_SHUTDOWN:
        /* A close frame (1001, going away), sent as the application's close is: the answer
         * is waited for WS_CLOSE_MS (then 1006), also when the stop timeout is never, so a
         * client that does not answer cannot hold the stop; the stop timeout bounds it too. */
        (void)shmipc__ws_close(sc->ws, 1001, NULL);
        break;
    default:
        shmipc__server_conn_close(sc);
        break;
    }
}

/*
 * Runs the lifecycle table's cell for (state, event) (conn_state.c; docs/http.md,
 * "Connection lifecycle"). Each action sets the next state itself: the table's `next` is the
 * one it leads to unless the action's own check decides (docs/http.md lists them).
 */
void shmipc__server_conn_event(struct server_conn *sc, int ev, const void *data, size_t len)
{
    const struct shmipc__cs_transition *t = shmipc__cs_lookup(sc->state, ev);
    int from = sc->state;
    switch (t->action) {
    case SHMIPC__CA_SERVE:
        act_serve(sc, data, len);
        break;
    case SHMIPC__CA_BUFFER:
        act_buffer(sc, data, len);
        break;
    case SHMIPC__CA_DRAIN:
        act_drain(sc, len);
        break;
    case SHMIPC__CA_NEXT:
        act_next(sc);
        break;
    case SHMIPC__CA_LINGER:
        rx_drop_done(sc);
        linger_wait(sc); /* the response is out whole; the FIN follows it */
        break;
    case SHMIPC__CA_HALF_CLOSE:
        /* The peer is done sending but may still read: the response in flight goes whole,
         * what the receive buffer holds is answered, then the connection closes. */
        sc->peer_done = 1;
        break;
    case SHMIPC__CA_SEND_TIMER:
        act_send_timer(sc);
        break;
    case SHMIPC__CA_STOP_IDLE:
        /* An idle keep-alive connection gets its FIN now; part of a request is answered
         * with Connection: close (shmipc__server_handle()) when the rest arrives. */
        if (sc->rx_len == 0)
            shmipc__server_conn_linger(sc);
        break;
    case SHMIPC__CA_WS:
        act_ws(sc, ev, data, len);
        break;
    case SHMIPC__CA_CLOSE:
        /* A reset; the FIN a lingering close waits for, or one with at most part of a
         * request unanswered; a slowloris head, an idle connection, the linger's end: nothing
         * of ours is unsent that the peer would want. */
        if (ev == SHMIPC__CE_TIMEOUT)
            sc->w->stats.timeouts++;
        shmipc__server_conn_close(sc);
        break;
    case SHMIPC__CA_HOLD:
        act_hold(sc);
        break;
    case SHMIPC__CA_DEFER_TIMER:
        act_defer_timer(sc);
        break;
    case SHMIPC__CA_ANSWER:
        act_answer(sc);
        break;
    case SHMIPC__CA_RELEASE:
        if (shmipc__server_cs_trace != NULL)
            shmipc__server_cs_trace(from, ev, t->action, from);
        if (!conn_sending(sc))
            conn_free(sc);
        return; /* back on the free list */
    case SHMIPC__CA_NONE:
        break;
    default:
        SHMIPC__LOG(SHMIPC__LOG_ERROR, "server: event %s in state %s cannot happen; closing",
                    shmipc__cs_event_name(ev), shmipc__cs_state_name(from));
        shmipc__server_conn_close(sc);
        break;
    }
    if (shmipc__server_cs_trace != NULL)
        shmipc__server_cs_trace(from, ev, t->action, sc->state);
}

static void on_data(struct shmipc__conn *c, const void *data, size_t len)
{
    shmipc__server_conn_event(shmipc__conn_data(c), SHMIPC__CE_DATA, data, len);
}

static void on_end(struct shmipc__conn *c, int status)
{
    struct server_conn *sc = shmipc__conn_data(c);
    sc->rx_end = 1;
    shmipc__server_conn_event(sc, status < 0 ? SHMIPC__CE_ERROR : SHMIPC__CE_PEER_FIN, NULL, 0);
}

/*
 * The peer left while reading is paused (the reactor's on_hup). A deferred request must hear
 * it before the input behind the pause is read: it stopped reading there (act_buffer), and a
 * request without a deadline would otherwise wait for an answer nobody takes, as a FIN or
 * reset that came unpaused would have cancelled it (DEFERRED, PEER_FIN or ERROR: close). So
 * must a WebSocket its owner holds (shmipc__ws_hold): the hold may last as long as the owner
 * likes (the front's worker stays busy), and the timers do not count held time, so the client
 * gone would keep its connection until then. It ends as a FIN unpaused ends it (act_ws): a
 * close handshake already done lets its last frame go; else the input behind the hold is read
 * for the client's close frame alone (its code to on_close, 1006 without one: server_ws.c,
 * ws_read_last()), and the messages there are not delivered (the client is gone, nobody gets
 * an answer to them).
 * Elsewhere the end comes in order once reading resumes (a send in flight fails on a reset; the
 * layer's own pause is bounded by the send timeout).
 */
static void on_hup(struct shmipc__conn *c)
{
    struct server_conn *sc = shmipc__conn_data(c);
    if (sc->state == SHMIPC__CS_DEFERRED ||
        (sc->state == SHMIPC__CS_UPGRADED && sc->ws != NULL && sc->ws->held))
        shmipc__server_conn_event(sc, SHMIPC__CE_PEER_FIN, NULL, 0);
    else if (sc->state == SHMIPC__CS_UPGRADED && sc->ws != NULL)
        sc->ws->hup = 1; /* told once per pause: a hold that comes later ends it (ws_hold) */
}

const struct shmipc__conn_cbs shmipc__server_conn_cbs = {on_data, on_end, on_hup};

void shmipc__server_conn_accept(struct shmipc__acceptor *a, struct shmipc__conn *c, void *data)
{
    struct shmipc__server_worker *w = data;
    struct shmipc_server *s = w->srv;
    struct server_conn *sc = w->free_conns;
    int one = 1;
    uint32_t gen = 0;
    (void)a;
    if (sc != NULL) {
        w->free_conns = sc->next;
        /* A pooled connection keeps counting deferrals: a stale ticket from its last life
         * must not match its next one. */
        gen = sc->defer_gen + 1;
    } else
        sc = malloc(conn_size(s));
    if (sc == NULL) {
        SHMIPC__LOG(SHMIPC__LOG_WARN, "server: out of memory for a connection");
        shmipc__conn_close(c);
        return;
    }
    memset(sc, 0, sizeof *sc);
    sc->defer_gen = gen;
    sc->w = w;
    sc->conn = c;
    sc->fresh = 1;
    shmipc__http_conn_init(&sc->http, &s->limits, sc->fields, shmipc__server_handle, sc);
    sc->http.head_reserve = HEAD_RESERVE;
    if (s->at_head_routes > 0)
        sc->http.at_head = shmipc__server_at_head;
    shmipc__timer_init(w->loop, &sc->timer, conn_timeout, sc);
    shmipc__conn_set_data(c, sc);
    /* Responses leave in one write per batch; Nagle would hold the next batch back until the
     * peer acknowledged the previous one. */
    if (setsockopt(shmipc__conn_fd(c), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
        SHMIPC__LOG(SHMIPC__LOG_DEBUG, "server: TCP_NODELAY: %s", strerror(errno));
    sc->next = w->conns;
    if (w->conns != NULL)
        w->conns->prev = sc;
    w->conns = sc;
    w->nconns++;
    w->stats.connections++;
    shmipc__server_conn_set_deadline(sc, after_or_never(sc, s->header_ms));
}

/* The 101 (and what the batch holds before it) was just queued: from here on, frames. */
static void ws_start(struct server_conn *sc, size_t consumed)
{
    size_t left = sc->rx_len - consumed;
    sc->state = SHMIPC__CS_UPGRADED;
    sc->in_head = 0;
    sc->w->stats.ws_upgrades++;
    /* The HTTP timeouts end here; the WebSocket's own start (an application's close in
     * on_open has its close_at already). The batch carrying the 101 is the WebSocket's
     * output to stall on now, as its frames are (the send timeout, measured from here). */
    sc->deadline = 0;
    shmipc__timer_stop(&sc->timer);
    sc->ws->rx_at = shmipc__loop_now_ms(sc->w->loop);
    sc->ws->rx_seen = 1;
    sc->ws->tx_at = sc->ws->rx_at;
    sc->ws->tx_seen = 1;
    shmipc__server_ws_arm(sc);
    /* A deferred upgrade whose 101 waited while the stop passed the connection by: the close
     * frame (1001, going away) that its SHUTDOWN sends every WebSocket, behind what the owner
     * queued; the stop timeout bounds the answer. */
    if (sc->w->draining)
        (void)shmipc__ws_conn_close(&sc->ws->c, 1001, NULL, 0);
    /* The bytes behind the request head are the first frames. The batch in flight points
     * only before them, so they are processed now and dropped with it (rx_drop_done). */
    sc->rx_len = consumed;
    if (left > 0)
        shmipc__server_ws_input(sc, sc->rx + consumed, left);
    else
        shmipc__server_ws_flush(sc);
}
