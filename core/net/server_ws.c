/*
 * The HTTP server's WebSocket glue: the upgrade of a request on a WebSocket route, the
 * callbacks joining ws_conn.h to a connection, the WebSocket timers (ping, idle, stall,
 * close), the send path and the public ws_send/ws_ping/ws_close. Owns struct shmipc_ws.
 * May call: ws_conn/ws_handshake/ws_codec, the reactor, and the connection driver's
 * shmipc__server_conn_*() (server_conn.c), which alone changes a connection's state.
 */
#include "net/server_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* WebSocket connections (docs/websocket.md, "Wiring it into the server") */

static int ws_on_message(void *user_data, unsigned opcode, const char *data, size_t len)
{
    struct shmipc_ws *ws = user_data;
    ws->route->on_message(ws, opcode == SHMIPC__WS_OP_TEXT ? SHMIPC_WS_TEXT : SHMIPC_WS_BINARY,
                          data, len, ws->route->user_data);
    return 0;
}

static void ws_on_close(void *user_data, unsigned code, const char *reason, size_t len)
{
    struct shmipc_ws *ws = user_data;
    /* A close frame's reason fits 123 bytes; the layer's own texts are cut to as much. */
    char text[SHMIPC__WS_CONTROL_MAX];
    ws->reported = 1;
    if (ws->route->on_close == NULL)
        return;
    if (len > sizeof text - 1)
        len = shmipc__utf8_truncate(reason, len, sizeof text - 1);
    if (len > 0)
        memcpy(text, reason, len);
    text[len] = '\0';
    ws->route->on_close(ws, (int)code, text, len, ws->route->user_data);
}

/* Pings and pongs matter only to an owner that relays them (shmipc__server_ws_accept()). */
static void ws_on_ping(void *user_data, const char *data, size_t len)
{
    struct shmipc_ws *ws = user_data;
    if (ws->cbs != NULL && ws->cbs->on_ping != NULL)
        ws->cbs->on_ping(ws, data, len, ws->own.user_data);
}

static void ws_on_pong(void *user_data, const char *data, size_t len)
{
    struct shmipc_ws *ws = user_data;
    if (ws->cbs != NULL && ws->cbs->on_pong != NULL)
        ws->cbs->on_pong(ws, data, len, ws->own.user_data);
}

/* A message leaves from the application's memory when nothing of this connection waits to be
 * written before it (the 101's batch, an earlier send): see shmipc__ws_conn_send(). */
static size_t ws_write_now(void *user_data, const struct iovec *iov, int n)
{
    struct shmipc_ws *ws = user_data;
    struct server_conn *sc = ws->conn;
    if (sc->state != SHMIPC__CS_UPGRADED || ws->sending)
        return 0;
    return shmipc__conn_write_now(sc->conn, iov, n);
}

/* The rest of a large payload is read straight into the message when the backend can
 * (shmipc__conn_read_now()); received bytes always go to the WebSocket at once here, so
 * nothing of ours can be overtaken. */
static size_t ws_read_now(void *user_data, void *buf, size_t len)
{
    struct shmipc_ws *ws = user_data;
    struct server_conn *sc = ws->conn;
    if (sc->state != SHMIPC__CS_UPGRADED)
        return 0;
    return shmipc__conn_read_now(sc->conn, buf, len);
}

static const struct shmipc__ws_callbacks ws_cbs = {
    .on_message = ws_on_message,
    .on_ping = ws_on_ping,
    .on_pong = ws_on_pong,
    .on_close = ws_on_close,
    .write_now = ws_write_now,
    .read_now = ws_read_now,
};

/* The WebSocket of a deferred upgrade the owner accepts (server_defer.c): its callbacks stand
 * in for a route's. */
struct shmipc_ws *shmipc__server_ws_new(struct server_conn *sc,
                                        const struct shmipc__server_ws_cbs *cbs, void *user_data)
{
    struct shmipc_ws *ws = calloc(1, sizeof *ws);
    if (ws == NULL)
        return NULL;
    ws->cbs = cbs;
    ws->own.on_message = cbs->on_message;
    ws->own.on_close = cbs->on_close;
    ws->own.user_data = user_data;
    ws->route = &ws->own;
    ws->conn = sc;
    shmipc__ws_conn_init(&ws->c, &sc->w->srv->ws_limits, &ws_cbs, ws);
    return ws;
}

/*
 * A request for a WebSocket route: the handshake's 400/426, the application's 403, or the 101.
 * After a 101 the HTTP parser must not look at the bytes behind this head (they are frames):
 * a head reserve that no batch can meet makes shmipc__http_conn_process() stop after this
 * request, with `consumed` at the end of its head; conn_serve() then switches to WebSocket.
 */
int shmipc__server_ws_upgrade(struct server_conn *sc, const struct shmipc__ws_route *wsr,
                              const struct shmipc__http_request *req, const char *body,
                              size_t body_len, struct shmipc__http_response *resp)
{
    struct shmipc__server_worker *w = sc->w;
    struct shmipc__ws_handshake *hs = &w->hs;
    struct shmipc_ws *ws;
    int rc;

    rc = shmipc__ws_handshake_check(hs, req, (const char *const *)wsr->protocols, wsr->nprotocols);
    if (rc == 0 && !(req->flags & SHMIPC__HTTP_KEEP_ALIVE)) {
        /* "Connection: Upgrade, close" asks for two things that exclude each other. */
        hs->status = 400;
        hs->detail = "the request closes the connection";
        rc = SHMIPC_EPROTO;
    }
    if (rc < 0) {
        SHMIPC__LOG(SHMIPC__LOG_DEBUG, "server: websocket handshake refused (%u): %s", hs->status,
                    hs->detail ? hs->detail : "");
        shmipc__ws_handshake_response(hs, resp);
        return 0;
    }
    if (shmipc__server_stopping(w)) {
        shmipc__server_canned(resp, 503);
        resp->flags |= SHMIPC__HTTP_RESP_CLOSE;
        return 0;
    }
    ws = calloc(1, sizeof *ws);
    if (ws == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "server: websocket connection");
    ws->route = wsr;
    ws->conn = sc;
    ws->subprotocol = hs->protocol >= 0 ? wsr->protocols[hs->protocol] : NULL;
    shmipc__ws_conn_init(&ws->c, &w->srv->ws_limits, &ws_cbs, ws);
    sc->ws = ws;
    if (wsr->on_open != NULL) {
        struct shmipc_http_request preq = {req, body, body_len, 0, 0, sc};
        if (wsr->prefix) {
            preq.wild_off = req->path.off + (uint32_t)wsr->path_len;
            preq.wild_len = req->path.len - (uint32_t)wsr->path_len;
        }
        /* A handler as any route's: an answer it gives another connection (complete()) goes
         * on the timer, not from inside it, where that connection's pipelined requests would
         * run over the worker's scratch, the handshake in `hs` that the 101 below is built
         * from included (another client's Sec-WebSocket-Accept). */
        w->in_handler++;
        rc = wsr->on_open(ws, &preq, wsr->user_data);
        w->in_handler--;
        if (rc < 0) {
            sc->ws = NULL;
            shmipc__ws_conn_destroy(&ws->c);
            free(ws);
            shmipc__server_canned(resp, 403);
            resp->flags |= SHMIPC__HTTP_RESP_CLOSE;
            return 0;
        }
    }
    shmipc__ws_handshake_response(hs, resp);
    sc->http.head_reserve = UINT32_MAX;
    return 0;
}

/*
 * WebSocket timers, on the connection's one timer (see
 * shmipc__server_conn_set_deadline()): the application's close waiting for the peer's
 * (close_at), output the peer stops taking (the keep-alive timeout, while a send is in
 * flight), and, while open and reading, the automatic ping and the idle timeout. Input and
 * output progress only raise a flag (rx_seen, tx_seen); the timer, when it fires, turns the
 * flags into times on its own clock, does what is due and starts again for the next thing.
 * So nothing touches the timer per message, and no time is ever
 * counted from before the progress it follows. The cost is granularity: the idle timeout fails a peer between
 * `idle` and `idle` plus one check interval (the ping interval, else `idle`) after its last
 * byte, a ping goes out between one and two intervals of silence, and output that makes no
 * progress is given up between one and two keep-alive timeouts. With neither ping nor idle
 * set and nothing to send, no timer runs.
 */
static uint64_t earliest(uint64_t a, uint64_t b)
{
    return a == 0 || (b != 0 && b < a) ? b : a;
}

static uint64_t ws_ping_due(const struct shmipc_ws *ws, uint32_t ping_ms)
{
    return (ws->rx_at > ws->ping_at ? ws->rx_at : ws->ping_at) + ping_ms;
}

/* While paused the server does not read, so the peer's silence is not the peer's. */
static int ws_reading(const struct server_conn *sc)
{
    return shmipc__ws_conn_state(&sc->ws->c) == SHMIPC__WS_OPEN &&
           !shmipc__conn_read_paused(sc->conn);
}

/* Output the peer must take: a frame send, or the HTTP batch that carried the 101 (with the
 * answers pipelined before it, which may be large), whose own send timeout ended with the
 * upgrade. */
static int ws_output_busy(const struct server_conn *sc)
{
    return sc->ws->sending || sc->inflight;
}

static uint64_t ws_deadline(const struct server_conn *sc)
{
    const struct shmipc_ws *ws = sc->ws;
    const struct shmipc_server *s = sc->w->srv;
    uint64_t d = ws->close_at;
    if (ws->ending)
        return ws->end_at;
    if (ws_output_busy(sc))
        d = earliest(d, ws->tx_at + s->stall_ms);
    if (ws_reading(sc)) {
        if (s->ws_idle_ms != 0)
            d = earliest(d, ws->rx_at + s->ws_idle_ms);
        if (s->ws_ping_ms != 0)
            d = earliest(d, ws_ping_due(ws, s->ws_ping_ms));
    }
    return d;
}

void shmipc__server_ws_arm(struct server_conn *sc)
{
    uint64_t d = ws_deadline(sc);
    if (d != 0)
        shmipc__server_conn_set_deadline(sc, d);
}

/*
 * How far the output has gone: bytes of completed sends plus what the reactor took of the
 * send in flight. It only grows (the 101's batch, still pending at the start, only shrinks
 * the pending count), so an unchanged value means the peer took nothing.
 */
static int64_t ws_progress(const struct server_conn *sc)
{
    const struct shmipc_ws *ws = sc->ws;
    return (int64_t)(ws->tx_done + (ws->sending ? ws->flight : 0)) -
           (int64_t)shmipc__conn_pending(sc->conn);
}

/*
 * The peer is gone, or takes nothing more, before its close frame was read: a send failed (a
 * reset, EPIPE), its FIN or reset came while the input was held (shmipc__ws_hold()), or the
 * stall or close timer gave up while the layer's pause stopped reading. What it sent before
 * may still wait unread, behind the pause, in the reactor or in the socket (Linux keeps the
 * bytes that came before a reset readable), its close frame among them: RFC 6455 §7.1.5 makes
 * that frame's code the close's even when the TCP connection ended right behind it, and
 * §7.4.1 keeps 1006 for a close without one. Before, on_close got 1006 at once. So the input
 * is read on for that frame alone (shmipc__ws_conn_peer_gone(): the messages before it are not
 * delivered, nobody would get an answer), nothing more is sent, and the connection closes at
 * the frame (on_close with its code), at the end of the input, after LINGER_MS or
 * LINGER_BYTES (on_close 1006). Input the reactor ended already holds nothing more: closed now.
 */
static void ws_read_last(struct server_conn *sc)
{
    struct shmipc_ws *ws = sc->ws;
    if (ws->ending)
        return;
    if (sc->rx_end || shmipc__ws_conn_state(&ws->c) == SHMIPC__WS_CLOSED) {
        shmipc__server_conn_close(sc);
        return;
    }
    ws->ending = 1;
    ws->held = 0;
    ws->close_at = 0;
    shmipc__ws_conn_peer_gone(&ws->c);
    ws->end_at = shmipc__server_conn_after(sc, LINGER_MS);
    shmipc__server_conn_set_deadline(sc, ws->end_at);
    if (shmipc__conn_resume_read(sc->conn) < 0)
        shmipc__server_conn_close(sc);
}

/* Whether the peer's input may wait unread: the layer's pause or the owner's hold stopped
 * reading it. */
static int ws_input_waits(const struct server_conn *sc)
{
    return shmipc__conn_read_paused(sc->conn);
}

/* The peer's FIN, or a hangup heard while held: after a close handshake the close frame may
 * still be on its way out: it goes, then the connection closes (ws_flush). Otherwise the peer
 * left without one (on_close 1006), unless the hold kept its last input, close frame maybe
 * included, unread (ws_read_last). */
void shmipc__server_ws_peer_gone(struct server_conn *sc)
{
    sc->peer_done = 1;
    if (shmipc__ws_conn_state(&sc->ws->c) == SHMIPC__WS_CLOSED)
        shmipc__server_ws_flush(sc);
    else if (!sc->rx_end && !sc->ws->ending && ws_input_waits(sc))
        ws_read_last(sc);
    else
        shmipc__server_conn_close(sc);
}

/* A reset or read failure (the reactor ended the input: closed), or a failed send: the peer
 * is gone, perhaps with its close frame still unread (ws_read_last). */
void shmipc__server_ws_error(struct server_conn *sc)
{
    if (sc->ws->ending)
        return; /* a send that was in flight: the read for the close frame goes on */
    ws_read_last(sc);
}

void shmipc__server_ws_timeout(struct server_conn *sc)
{
    struct shmipc__server_worker *w = sc->w;
    const struct shmipc_server *s = w->srv;
    struct shmipc_ws *ws = sc->ws;
    uint64_t now = shmipc__loop_now_ms(w->loop);
    if (ws->ending) {
        if (now < ws->end_at) {
            shmipc__server_conn_set_deadline(sc, ws->end_at);
            return;
        }
        w->stats.timeouts++;
        shmipc__server_conn_close(sc); /* no close frame in what was left: 1006 */
        return;
    }
    if (ws->hup && ws->held) {
        shmipc__server_ws_peer_gone(sc); /* the client left before the hold (ws_hold) */
        return;
    }
    if (ws->close_at != 0 && now >= ws->close_at) {
        w->stats.timeouts++;
        /* The peer never answered the application's close (1006), unless the answer waits
         * behind the layer's pause. */
        if (ws_input_waits(sc))
            ws_read_last(sc);
        else
            shmipc__server_conn_close(sc);
        return;
    }
    if (ws->rx_seen) {
        ws->rx_seen = 0;
        ws->rx_at = now;
    }
    if (ws_output_busy(sc)) {
        int64_t mark = ws_progress(sc);
        if (ws->tx_seen || mark != ws->tx_mark) {
            ws->tx_seen = 0;
            ws->tx_at = now;
            ws->tx_mark = mark;
        } else if (now >= ws->tx_at + s->stall_ms) {
            /* The peer stopped reading: what it did not take goes with the connection. A
             * close frame it sent meanwhile, unread behind the pause, is still its close. */
            w->stats.timeouts++;
            w->stats.ws_stall_closes++;
            if (ws_input_waits(sc))
                ws_read_last(sc);
            else
                shmipc__server_conn_close(sc);
            return;
        }
    }
    if (ws_reading(sc)) {
        if (s->ws_idle_ms != 0 && now >= ws->rx_at + s->ws_idle_ms) {
            /* Nothing arrived, not even a pong: the peer is taken for gone. No close frame
             * (it would only wait for an answer that does not come); on_close gets 1006. */
            w->stats.timeouts++;
            w->stats.ws_idle_closes++;
            shmipc__server_conn_close(sc);
            return;
        }
        if (s->ws_ping_ms != 0 && now >= ws_ping_due(ws, s->ws_ping_ms)) {
            ws->ping_at = now;
            /* A full queue (SHMIPC_EAGAIN) skips this ping; the idle timer still runs. */
            if (shmipc__ws_conn_ping(&ws->c, "", 0) == 0) {
                w->stats.ws_pings++;
                shmipc__server_ws_flush(sc);
                if (sc->state != SHMIPC__CS_UPGRADED)
                    return;
            }
        }
    }
    shmipc__server_ws_arm(sc);
}

static void ws_sent(struct shmipc__conn *c, int status, void *data)
{
    struct server_conn *sc = data;
    struct shmipc_ws *ws = sc->ws;
    (void)c;
    ws->sending = 0;
    if (sc->state == SHMIPC__CS_CLOSED || status < 0) {
        shmipc__server_conn_event(sc, status < 0 ? SHMIPC__CE_ERROR : SHMIPC__CE_SENT, NULL, 0);
        return; /* released, or closed */
    }
    ws->tx_done += ws->flight;
    ws->tx_seen = 1;
    /* Drained to half the high-water mark: read again (see ws_input), unless the owner holds
     * the input (shmipc__ws_hold()). The time spent paused was ours, not the peer's silence:
     * the idle and ping timers start afresh. */
    if (shmipc__ws_conn_tx_sent(&ws->c, ws->flight) && !ws->held &&
        shmipc__conn_read_paused(sc->conn) && shmipc__conn_resume_read(sc->conn) == 0) {
        ws->rx_at = shmipc__loop_now_ms(sc->w->loop);
        ws->rx_seen = 1;
        shmipc__server_ws_arm(sc);
    }
    /* The owner that waits for room hears of it before the next send starts, so what it
     * queues now joins that send. */
    if (ws->drain_mark != 0 && shmipc__ws_conn_tx_queued(&ws->c) < ws->drain_mark) {
        ws->drain_mark = 0;
        if (ws->cbs != NULL && ws->cbs->on_drain != NULL) {
            ws->cbs->on_drain(ws, ws->own.user_data);
            if (sc->state != SHMIPC__CS_UPGRADED)
                return; /* it closed the connection: sc is pooled memory, ws is gone */
        }
    }
    shmipc__server_ws_flush(sc);
}

/*
 * Hands the queued output to the reactor, one send at a time: the peeked bytes stay put until
 * their completion (ws_conn.h), so they go without a copy. Once the close handshake is over
 * and its frame written, the server closes the TCP connection first (RFC 6455 §7.1.1): a FIN,
 * then the peer's input is drained until its own FIN or the linger time.
 */
void shmipc__server_ws_flush(struct server_conn *sc)
{
    struct shmipc_ws *ws = sc->ws;
    const char *p;
    size_t n, queued;
    if (sc->state != SHMIPC__CS_UPGRADED)
        return; /* before the 101 is queued, or done */
    if (ws->ending) {
        /* Nothing more is sent; the close frame, once read and reported, ends it. */
        if (!ws->c.busy && shmipc__ws_conn_state(&ws->c) == SHMIPC__WS_CLOSED)
            shmipc__server_conn_close(sc);
        return;
    }
    queued = shmipc__ws_conn_tx_queued(&ws->c);
    if (queued > sc->w->stats.ws_tx_max)
        sc->w->stats.ws_tx_max = queued;
    if (!ws->sending) {
        n = shmipc__ws_conn_tx_peek(&ws->c, &p);
        /* A refusal means the connection failed or was shut down, and its end or the
         * failed send's callback closes it. */
        if (n > 0 && shmipc__conn_send(sc->conn, p, n, ws_sent, sc) == 0) {
            ws->sending = 1;
            ws->flight = n;
            /* The stall timer: the peer has the keep-alive timeout to take some of it. The
             * timer is only touched when it is idle or would fire later. */
            if (!ws->tx_seen) {
                ws->tx_seen = 1;
                ws->tx_at = shmipc__loop_now_ms(sc->w->loop);
            }
            shmipc__server_conn_set_deadline(sc, ws->tx_at + sc->w->srv->stall_ms);
        }
    }
    /* Not from inside process(): its caller flushes again when it returns. */
    if (ws->sending || ws->c.busy || shmipc__ws_conn_state(&ws->c) != SHMIPC__WS_CLOSED)
        return;
    if (sc->peer_done)
        shmipc__server_conn_close(sc);
    else
        shmipc__server_conn_linger(sc);
}

/*
 * Received bytes. On PAUSE (tx_high_water bytes queued: the peer does not read what it is
 * sent) the reactor stops reading, so TCP flow control stops the peer, until ws_sent() sees
 * the queue drained to half the mark.
 */
void shmipc__server_ws_input(struct server_conn *sc, char *data, size_t len)
{
    struct shmipc_ws *ws = sc->ws;
    int v;
    /* Input only moves deadlines later: the timer picks it up when it fires. */
    ws->rx_seen = 1;
    v = shmipc__ws_conn_process(&ws->c, data, len);
    if (ws->ending && (ws->end_read += len) > LINGER_BYTES) {
        shmipc__server_conn_close(sc); /* no close frame in as much as a lingering close reads */
        return;
    }
    if (v == SHMIPC__WS_CONN_PAUSE && !shmipc__conn_read_paused(sc->conn) &&
        shmipc__conn_pause_read(sc->conn) == 0)
        sc->w->stats.ws_pauses++;
    shmipc__server_ws_flush(sc);
}

/* The public calls run on the connection's worker, which alone touches its state. */
static int ws_check(const struct shmipc_ws *ws, const char *what)
{
    const struct server_conn *sc = ws->conn;
    if (!pthread_equal(pthread_self(), sc->w->thread))
        return shmipc__fail(SHMIPC_EBUSY, "%s: not on the connection's worker thread", what);
    return 0;
}

static int ws_queued(struct shmipc_ws *ws, int rc, const char *what)
{
    if (rc == SHMIPC_ECLOSED)
        return shmipc__fail(SHMIPC_EPIPE, "%s: the connection is closing", what);
    if (rc < 0)
        return rc;
    shmipc__server_ws_flush(ws->conn);
    return 0;
}

int shmipc__ws_send(struct shmipc_ws *ws, int kind, const void *data, size_t len)
{
    unsigned op = kind == SHMIPC_WS_TEXT ? SHMIPC__WS_OP_TEXT : SHMIPC__WS_OP_BINARY;
    int rc = ws_check(ws, "ws_send");
    if (rc < 0)
        return rc;
    return ws_queued(ws, shmipc__ws_conn_send(&ws->c, op, data, len, 0), "ws_send");
}

size_t shmipc__ws_queued(const struct shmipc_ws *ws)
{
    return shmipc__ws_conn_tx_queued(&ws->c);
}

int shmipc__ws_drain_at(struct shmipc_ws *ws, size_t mark)
{
    int rc = ws_check(ws, "ws_drain_at");
    if (rc < 0)
        return rc;
    if (shmipc__ws_conn_tx_queued(&ws->c) < mark) {
        ws->drain_mark = 0;
        return 1;
    }
    ws->drain_mark = mark;
    return 0;
}

/*
 * The owner's hold on the input, beside the WebSocket layer's own PAUSE (ws_input): reading
 * resumes only when neither holds it. Held time is not the peer's silence (ws_reading()).
 */
int shmipc__ws_hold(struct shmipc_ws *ws, int hold)
{
    struct server_conn *sc = ws->conn;
    int rc = ws_check(ws, "ws_hold");
    if (rc < 0)
        return rc;
    if (sc->state != SHMIPC__CS_UPGRADED)
        return shmipc__fail(SHMIPC_EPIPE, "ws_hold: the connection is closing");
    if (ws->ending)
        return 0; /* the peer is gone: its last input is read for its close frame alone */
    if (hold && !ws->held) {
        ws->held = 1;
        /* The client left while the layer's own pause stopped reading (on_hup told of it
         * then, once per pause): held, its FIN would never be read. It ends from the timer,
         * not from inside the owner's call. */
        if (ws->hup)
            shmipc__server_conn_set_deadline(sc, shmipc__loop_now_ms(sc->w->loop));
        if (!shmipc__conn_read_paused(sc->conn))
            return shmipc__conn_pause_read(sc->conn);
    } else if (!hold && ws->held) {
        ws->held = 0;
        if (!ws->c.paused && shmipc__conn_read_paused(sc->conn)) {
            rc = shmipc__conn_resume_read(sc->conn);
            if (rc < 0)
                return rc;
            ws->rx_at = shmipc__loop_now_ms(sc->w->loop);
            ws->rx_seen = 1;
            shmipc__server_ws_arm(sc);
        }
    }
    return 0;
}

int shmipc__ws_pong(struct shmipc_ws *ws, const void *data, size_t len)
{
    int rc = ws_check(ws, "ws_pong");
    if (rc < 0)
        return rc;
    return ws_queued(ws, shmipc__ws_conn_pong(&ws->c, data, len), "ws_pong");
}

int shmipc__ws_ping(struct shmipc_ws *ws, const void *data, size_t len)
{
    int rc = ws_check(ws, "ws_ping");
    if (rc < 0)
        return rc;
    if (len > SHMIPC__WS_CONTROL_MAX)
        return shmipc__fail(SHMIPC_EINVAL, "ws_ping: %zu bytes of payload, at most %u", len,
                            SHMIPC__WS_CONTROL_MAX);
    return ws_queued(ws, shmipc__ws_conn_ping(&ws->c, data, len), "ws_ping");
}

int shmipc__ws_close(struct shmipc_ws *ws, int code, const char *reason)
{
    struct server_conn *sc = ws->conn;
    size_t rlen = reason != NULL ? strlen(reason) : 0;
    int rc = ws_check(ws, "ws_close");
    if (rc < 0)
        return rc;
    if (code < 1000 || code > 4999 || !shmipc__ws_close_code_valid((unsigned)code))
        return shmipc__fail(SHMIPC_EINVAL, "ws_close: %d is not a close code an endpoint may send",
                            code);
    if (rlen > SHMIPC__WS_CONTROL_MAX - 2)
        return shmipc__fail(SHMIPC_EINVAL, "ws_close: a reason of %zu bytes, at most %u", rlen,
                            SHMIPC__WS_CONTROL_MAX - 2);
    rc = ws_queued(ws, shmipc__ws_conn_close(&ws->c, (unsigned)code, reason, rlen), "ws_close");
    /* The peer's close frame ends it; a peer that does not answer is given up on. */
    if (rc == 0 && sc->state != SHMIPC__CS_CLOSED &&
        shmipc__ws_conn_state(&ws->c) == SHMIPC__WS_CLOSING) {
        ws->close_at = shmipc__server_conn_after(sc, WS_CLOSE_MS);
        shmipc__server_conn_set_deadline(sc, ws->close_at);
    }
    return rc;
}
