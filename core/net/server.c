/*
 * The HTTP/1.1 server; see server.h and docs/http.md.
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
 * every reactor callback, the timer and a graceful stop become an event that conn_event()
 * runs through the table; the act_* functions and conn_serve(), conn_linger(), linger_wait()
 * and conn_close() are its named transitions.
 *
 * Timeouts use one timer per connection, started lazily: the connection keeps its deadline
 * and the timer, when it fires early, starts again for what is left, so a keep-alive
 * request does not touch the timer heap.
 */
#include "net/server.h"

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "net/conn_state.h"
#include "net/ws_codec.h"
#include "net/ws_handshake.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RX_STD       8192u      /* pooled receive buffers; larger requests get their own */
#define RX_PAUSE     65536u     /* unanswered input held while a batch is sent; then no reads */
#define TX_IOV       64u        /* iovecs of a batch; the reactor takes up to 64 without malloc */
#define TX_ARENA     16384u     /* heads (and small bodies) of a batch */
#define HEAD_RESERVE 6144u      /* a head with 4 KiB of handler headers, plus a copied body */
#define LINGER_MS    2000u      /* how long a half-closed connection waits for the peer's FIN */
#define LINGER_BYTES (1u << 20) /* how much input a lingering close drains before closing */
#define POOL_KEEP    1024u      /* free buffers a worker keeps per list */
#define WS_CLOSE_MS  2000u      /* how long the application's close waits for the peer's */

/* ---------------------------------------------------------------------------------------- */
/* Config */

static const char *const timeout_names[] = {"header_timeout", "keepalive_timeout", "stop_timeout",
                                            "ws_ping_timeout", "ws_idle_timeout"};

int shmipc__server_config_new(struct shmipc_server_config **out)
{
    struct shmipc_server_config *cfg = calloc(1, sizeof *cfg);
    if (cfg == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "server_config_new: out of memory");
    strcpy(cfg->address, "127.0.0.1");
    cfg->port = SHMIPC__SERVER_DEFAULT_PORT;
    strcpy(cfg->server_name, "shmipc");
    *out = cfg;
    return 0;
}

static int parse_address(const char *address, void *buf)
{
    return inet_pton(AF_INET, address, buf) == 1 || inet_pton(AF_INET6, address, buf) == 1;
}

int shmipc__server_config_set_address(struct shmipc_server_config *cfg, const char *address)
{
    unsigned char buf[sizeof(struct in6_addr)];
    size_t len = strlen(address);
    if (len == 0 || len > SHMIPC_SERVER_MAX_ADDRESS)
        return shmipc__fail(SHMIPC_EINVAL, "address: %zu bytes, expected 1..%d", len,
                            SHMIPC_SERVER_MAX_ADDRESS);
    if (!parse_address(address, buf))
        return shmipc__fail(SHMIPC_EINVAL, "address: \"%s\" is not a numeric IPv4 or IPv6 address",
                            address);
    memcpy(cfg->address, address, len + 1);
    return 0;
}

int shmipc__server_config_set_timeout_ms(struct shmipc_server_config *cfg, int which, uint32_t ms)
{
    uint32_t min, ping, idle;
    if (which < SHMIPC_SERVER_TIMEOUT_HEADER || which > SHMIPC_SERVER_TIMEOUT_WS_IDLE)
        return shmipc__fail(SHMIPC_EINVAL, "server timeout: %d is not a shmipc_server_timeout",
                            which);
    min = which == SHMIPC_SERVER_TIMEOUT_HEADER || which == SHMIPC_SERVER_TIMEOUT_KEEPALIVE ? 1 : 0;
    if (ms < min || ms > SHMIPC__SERVER_MAX_TIMEOUT_MS)
        return shmipc__fail(SHMIPC_EINVAL, "%s: %u ms is outside %u..%u", timeout_names[which], ms,
                            min, SHMIPC__SERVER_MAX_TIMEOUT_MS);
    /* A ping that is not sent before the idle timeout runs out cannot keep anything open. */
    ping = which == SHMIPC_SERVER_TIMEOUT_WS_PING ? ms
                                                  : cfg->timeout_ms[SHMIPC_SERVER_TIMEOUT_WS_PING];
    idle = which == SHMIPC_SERVER_TIMEOUT_WS_IDLE ? ms
                                                  : cfg->timeout_ms[SHMIPC_SERVER_TIMEOUT_WS_IDLE];
    if (ping != 0 && idle != 0 && ping >= idle)
        return shmipc__fail(SHMIPC_EINVAL,
                            "%s: %u ms, but ws_ping_timeout (%u ms) must be below "
                            "ws_idle_timeout (%u ms)",
                            timeout_names[which], ms, ping, idle);
    cfg->timeout_ms[which] = ms;
    cfg->timeout_set[which] = 1;
    return 0;
}

static int limit_range(int which, uint64_t value)
{
    static const char *const names[] = {
        "request_line", "head_bytes",         "headers",      "body", "pipeline",
        "ws_message",   "ws_send_high_water", "ws_send_limit"};
    static const uint64_t max[] = {
        SHMIPC__HTTP_LIMIT_MAX_HEAD_BYTES, SHMIPC__HTTP_LIMIT_MAX_HEAD_BYTES,
        SHMIPC__HTTP_LIMIT_MAX_HEADERS,    SHMIPC__SERVER_MAX_BODY,
        SHMIPC__SERVER_MAX_PIPELINE,       SHMIPC__WS_LIMIT_MAX_MESSAGE,
        SHMIPC__WS_LIMIT_MAX_TX,           SHMIPC__WS_LIMIT_MAX_TX};
    return shmipc__fail(SHMIPC_EINVAL, "limit %s: %llu is above %llu", names[which],
                        (unsigned long long)value, (unsigned long long)max[which]);
}

/* The WebSocket send queue's marks, checked against each other as they resolve (the one not
 * set at its default): the high-water mark may not exceed the limit. */
static int ws_tx_limit(struct shmipc_server_config *cfg, int which, uint64_t value)
{
    uint64_t high = cfg->ws_tx_high_water, limit = cfg->ws_tx_limit, rhigh, rlimit;
    if (value > SHMIPC__WS_LIMIT_MAX_TX)
        return limit_range(which, value);
    if (which == SHMIPC_SERVER_LIMIT_WS_SEND_HIGH_WATER)
        high = value;
    else
        limit = value;
    /* As shmipc__ws_limits_resolve() will resolve them. */
    rhigh = high != 0 ? high : SHMIPC__WS_DEFAULT_TX_HIGH_WATER;
    rlimit = limit != 0                            ? limit
             : rhigh > SHMIPC__WS_DEFAULT_TX_LIMIT ? rhigh
                                                   : SHMIPC__WS_DEFAULT_TX_LIMIT;
    if (rhigh > rlimit)
        return shmipc__fail(
            SHMIPC_EINVAL,
            "limit %s: %llu, but ws_send_high_water (%llu) may not be above "
            "ws_send_limit (%llu)",
            which == SHMIPC_SERVER_LIMIT_WS_SEND_LIMIT ? "ws_send_limit" : "ws_send_high_water",
            (unsigned long long)value, (unsigned long long)rhigh, (unsigned long long)rlimit);
    cfg->ws_tx_high_water = high;
    cfg->ws_tx_limit = limit;
    return 0;
}

int shmipc__server_config_set_limit(struct shmipc_server_config *cfg, int which, uint64_t value)
{
    struct shmipc__http_limits l = cfg->limits;
    struct shmipc__http_limits resolved;
    int rc;
    switch (which) {
    case SHMIPC_SERVER_LIMIT_REQUEST_LINE:
        if (value > SHMIPC__HTTP_LIMIT_MAX_HEAD_BYTES)
            return limit_range(which, value);
        l.max_request_line = (uint32_t)value;
        break;
    case SHMIPC_SERVER_LIMIT_HEAD_BYTES:
        if (value > SHMIPC__HTTP_LIMIT_MAX_HEAD_BYTES)
            return limit_range(which, value);
        l.max_head_bytes = (uint32_t)value;
        break;
    case SHMIPC_SERVER_LIMIT_HEADERS:
        if (value > SHMIPC__HTTP_LIMIT_MAX_HEADERS)
            return limit_range(which, value);
        l.max_headers = (uint32_t)value;
        break;
    case SHMIPC_SERVER_LIMIT_BODY:
        /* The receive buffer holds a whole body, so the bound is memory, not the parser's. */
        if (value > SHMIPC__SERVER_MAX_BODY)
            return limit_range(which, value);
        l.max_body = value;
        break;
    case SHMIPC_SERVER_LIMIT_PIPELINE:
        if (value > SHMIPC__SERVER_MAX_PIPELINE)
            return limit_range(which, value);
        cfg->pipeline = (uint32_t)value;
        return 0;
    case SHMIPC_SERVER_LIMIT_WS_MESSAGE:
        if (value > SHMIPC__WS_LIMIT_MAX_MESSAGE)
            return limit_range(which, value);
        cfg->ws_max_message = value;
        return 0;
    case SHMIPC_SERVER_LIMIT_WS_SEND_HIGH_WATER:
    case SHMIPC_SERVER_LIMIT_WS_SEND_LIMIT:
        return ws_tx_limit(cfg, which, value);
    default:
        return shmipc__fail(SHMIPC_EINVAL, "server limit: %d is not a shmipc_server_limit", which);
    }
    rc = shmipc__http_limits_resolve(&resolved, &l);
    if (rc < 0)
        return rc;
    cfg->limits = l;
    return 0;
}

int shmipc__server_config_set_server_name(struct shmipc_server_config *cfg, const char *name)
{
    size_t len = name != NULL ? strlen(name) : 0;
    if (len > SHMIPC_SERVER_MAX_NAME)
        return shmipc__fail(SHMIPC_EINVAL, "server_name: %zu bytes, at most %d", len,
                            SHMIPC_SERVER_MAX_NAME);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)name[i] < 0x20 || (unsigned char)name[i] >= 0x7f)
            return shmipc__fail(SHMIPC_EINVAL, "server_name: byte %zu is not visible ASCII", i);
    if (len > 0)
        memcpy(cfg->server_name, name, len + 1);
    else
        cfg->server_name[0] = '\0';
    return 0;
}

/* A millisecond knob's value `v`: unset keeps *out; a bad value fails naming the variable. */
static int env_ms(const char *name, const char *v, uint32_t *out)
{
    unsigned long n = *out;
    int rc = shmipc__env_number(name, v, 1, SHMIPC__SERVER_MAX_TIMEOUT_MS, "milliseconds", &n);
    *out = (uint32_t)n;
    return rc < 0 ? rc : 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Workers and connections */

/* A batch's iovecs and arena, held by a connection while its batch is built and sent. */
struct txbuf {
    struct txbuf *next;
    struct iovec iov[TX_IOV];
    char arena[TX_ARENA];
};

/* Something to free or call once the batch in flight has been written. */
struct release {
    struct release *next;
    shmipc_destroy_cb fn; /* NULL: the body was copied right behind this node */
    void *user_data;
};

struct server_conn {
    struct server_conn *prev, *next; /* the worker's list, for a graceful stop */
    struct shmipc__server_worker *w;
    struct shmipc__conn *conn;
    struct shmipc__http_conn http;
    struct shmipc__timer timer;
    uint64_t deadline; /* loop ms when the connection times out; 0: none */
    uint64_t timer_at; /* when the timer fires, while active */
    size_t tx_mark;    /* the reactor's pending bytes when the send timer last saw progress */
    size_t drained;    /* input dropped while lingering */
    uint8_t state;     /* enum shmipc__cs_state: the lifecycle (conn_state.h) */
    uint8_t inflight;  /* an HTTP batch is being sent (WRITING, CLOSING, or the 101's) */
    uint8_t peer_done; /* the peer's FIN arrived */
    uint8_t in_head;   /* a head is partly here: the header deadline runs */
    uint8_t fresh;     /* no request yet: the header timeout covers the first */
    char *rx;
    size_t rx_len, rx_cap;
    size_t rx_done;   /* bytes at the front that the batch in flight may point into */
    char *rx_retired; /* an older buffer the batch in flight points into */
    struct txbuf *tx;
    struct shmipc__http_batch batch;
    struct release *releases;
    struct shmipc_ws *ws;               /* set by an accepted upgrade */
    struct shmipc__http_field fields[]; /* limits.max_headers */
};

struct shmipc__server_worker {
    struct shmipc_server *srv;
    unsigned index;
    struct shmipc__loop *loop;
    struct shmipc__acceptor *acceptor;
    struct shmipc__http_date date;
    struct shmipc__timer date_timer;
    struct server_conn *conns;
    unsigned nconns;
    int draining;
    /* Free lists. */
    struct server_conn *free_conns;
    char *free_rx;
    unsigned nfree_rx;
    struct txbuf *free_tx;
    unsigned nfree_tx;
    /* A handler's response: headers and small bodies live here until the batch copies them. */
    struct shmipc__http_header_out hdrs[SHMIPC__SERVER_MAX_RESP_HEADERS];
    char hbytes[SHMIPC__SERVER_RESP_HEADER_BYTES];
    size_t hused;
    char body[SHMIPC__HTTP_COPY_MAX];
    char allow[256];
    struct shmipc__ws_handshake hs; /* an upgrade's response points here until batched */
    pthread_t thread;
    struct shmipc__server_stats stats;
};

static void conn_serve(struct server_conn *sc);
static void conn_close(struct server_conn *sc);
static void ws_start(struct server_conn *sc, size_t consumed);
static void ws_flush(struct server_conn *sc);
static void ws_input(struct server_conn *sc, char *data, size_t len);
static void ws_timeout(struct server_conn *sc);

/* ---- pools ---- */

static char *rx_get(struct shmipc__server_worker *w)
{
    char *b = w->free_rx;
    if (b != NULL) {
        w->free_rx = *(char **)b;
        w->nfree_rx--;
        return b;
    }
    return malloc(RX_STD);
}

static void rx_put(struct shmipc__server_worker *w, char *b, size_t cap)
{
    if (b == NULL)
        return;
    if (cap != RX_STD || w->nfree_rx >= POOL_KEEP) {
        free(b);
        return;
    }
    *(char **)b = w->free_rx;
    w->free_rx = b;
    w->nfree_rx++;
}

static struct txbuf *tx_get(struct shmipc__server_worker *w)
{
    struct txbuf *t = w->free_tx;
    if (t != NULL) {
        w->free_tx = t->next;
        w->nfree_tx--;
        return t;
    }
    return malloc(sizeof *t);
}

static void tx_put(struct shmipc__server_worker *w, struct txbuf *t)
{
    if (t == NULL)
        return;
    if (w->nfree_tx >= POOL_KEEP) {
        free(t);
        return;
    }
    t->next = w->free_tx;
    w->free_tx = t;
    w->nfree_tx++;
}

static size_t conn_size(const struct shmipc_server *s)
{
    return sizeof(struct server_conn) + s->limits.max_headers * sizeof(struct shmipc__http_field);
}

static void worker_free_pools(struct shmipc__server_worker *w)
{
    while (w->free_conns != NULL) {
        struct server_conn *sc = w->free_conns;
        w->free_conns = sc->next;
        free(sc);
    }
    while (w->free_rx != NULL) {
        char *b = w->free_rx;
        w->free_rx = *(char **)b;
        free(b);
    }
    while (w->free_tx != NULL) {
        struct txbuf *t = w->free_tx;
        w->free_tx = t->next;
        free(t);
    }
    w->nfree_rx = w->nfree_tx = 0;
}

/* ---- timers ---- */

static void conn_timeout(struct shmipc__timer *t);

/*
 * Sets the connection's deadline (0: none). The timer is started only when it is idle or
 * would fire after the new deadline; a later deadline is picked up when it fires.
 */
static void set_deadline(struct server_conn *sc, uint64_t deadline)
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

static uint64_t after(const struct server_conn *sc, uint32_t ms)
{
    return shmipc__loop_now_ms(sc->w->loop) + ms;
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
        conn_close(sc);
        return;
    }
    set_deadline(sc, after(sc, LINGER_MS));
    /* CLOSING stopped reading; the drain (bounded by LINGER_BYTES and LINGER_MS) reads again. */
    if (shmipc__conn_resume_read(sc->conn) < 0)
        conn_close(sc);
}

/* Half-close (nginx's lingering_close): the peer gets a FIN after what was queued, which is
 * sent whole under the send timeout; the linger timer starts only when it has left. */
static void conn_linger(struct server_conn *sc)
{
    sc->state = sc->inflight ? SHMIPC__CS_CLOSING : SHMIPC__CS_LINGERING;
    sc->in_head = 0;
    if (shmipc__conn_shutdown(sc->conn) < 0) {
        conn_close(sc);
        return;
    }
    /*
     * While the last response goes out, input nobody will answer is not read: thrown away,
     * it would have no bound but the send timeout, which a peer that takes a byte now and then
     * extends forever (a worker receiving at full speed all that time). TCP pushes back
     * instead; a reset still ends the send (ERROR), and linger_wait() reads again.
     */
    if (sc->inflight && shmipc__conn_pause_read(sc->conn) < 0) {
        conn_close(sc);
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

static void conn_event(struct server_conn *sc, int ev, const void *data, size_t len);

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
    conn_event(sc, SHMIPC__CE_TIMEOUT, NULL, 0);
}

static void date_tick(struct shmipc__timer *t)
{
    struct shmipc__server_worker *w = t->data;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    shmipc__http_date_refresh(&w->date, ts.tv_sec);
    /* Just past the next second, so the text changes when the second does. */
    if (shmipc__timer_start(&w->date_timer, 1000 - (uint64_t)ts.tv_nsec / 1000000 + 1) < 0)
        SHMIPC__LOG(SHMIPC__LOG_WARN, "server: date timer: %s", shmipc__detail());
}

/* ---- lifecycle ---- */

static void release_all(struct server_conn *sc)
{
    while (sc->releases != NULL) {
        struct release *r = sc->releases;
        sc->releases = r->next;
        if (r->fn != NULL)
            r->fn(r->user_data);
        free(r);
    }
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
    tx_put(w, sc->tx);
    rx_put(w, sc->rx, sc->rx_cap);
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
static void conn_close(struct server_conn *sc)
{
    if (sc->state == SHMIPC__CS_CLOSED)
        return;
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
        rx_put(w, sc->rx, sc->rx_cap);
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
        nb = cap == RX_STD ? rx_get(w) : malloc(cap);
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
                rx_put(w, sc->rx, sc->rx_cap);
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
         * timeout runs from its first byte and is not extended by more bytes. */
        if (!sc->in_head) {
            sc->in_head = 1;
            set_deadline(sc, after(sc, s->header_ms));
        }
        return;
    }
    sc->in_head = 0;
    if (sc->fresh)
        set_deadline(sc, after(sc, s->header_ms));
    else
        set_deadline(sc, after(sc, s->keepalive_ms));
}

/* The batch in flight was written (or failed): a SENT or ERROR event. */
static void on_sent(struct shmipc__conn *c, int status, void *data)
{
    struct server_conn *sc = data;
    (void)c;
    sc->inflight = 0;
    release_all(sc);
    tx_put(sc->w, sc->tx);
    sc->tx = NULL;
    conn_event(sc, status < 0 ? SHMIPC__CE_ERROR : SHMIPC__CE_SENT, NULL, 0);
}

/* WRITING, SENT: the next batch for what came meanwhile, the close the peer's FIN asked for,
 * the lingering close of a graceful stop, or READING again. */
static void act_next(struct server_conn *sc)
{
    struct shmipc__server_worker *w = sc->w;
    /* act_buffer stopped reading behind the batch: it has left. Held bytes and the socket's
     * come in a later dispatch, answered in READING or buffered behind the next batch. */
    if (shmipc__conn_read_paused(sc->conn) && shmipc__conn_resume_read(sc->conn) < 0) {
        conn_close(sc);
        return;
    }
    rx_drop_done(sc);
    sc->state = SHMIPC__CS_READING;
    if (sc->rx_len > 0) {
        conn_serve(sc); /* pipelined leftovers, or bytes that came while sending */
        return;
    }
    if (sc->peer_done)
        conn_close(sc);
    else if (w->draining)
        conn_linger(sc);
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
        sc->tx = tx_get(w);
        if (sc->tx == NULL) {
            SHMIPC__LOG(SHMIPC__LOG_WARN, "server: out of memory for a response batch");
            conn_close(sc);
            return;
        }
    }
    shmipc__http_batch_init(&sc->batch, sc->tx->iov, TX_IOV, sc->tx->arena, TX_ARENA, &w->date);
    sc->batch.server = w->srv->server_name;
    sc->state = SHMIPC__CS_HANDLING;
    verdict =
        shmipc__http_conn_process(&sc->http, sc->rx, &len, &consumed, &sc->batch, w->srv->pipeline);
    sc->rx_len = len;
    sc->rx_done = consumed;
    if (consumed > 0)
        sc->fresh = 0;
    if (sc->batch.niov > 0) {
        if (shmipc__conn_sendv(sc->conn, sc->batch.iov, (int)sc->batch.niov, on_sent, sc) < 0) {
            conn_close(sc);
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
        set_deadline(sc, after(sc, w->srv->keepalive_ms));
        if (verdict == SHMIPC__HTTP_CONN_CLOSE)
            conn_linger(sc);
        return;
    }
    tx_put(w, sc->tx);
    sc->tx = NULL;
    release_all(sc);
    rx_drop_done(sc);
    sc->state = SHMIPC__CS_READING;
    if (verdict == SHMIPC__HTTP_CONN_CLOSE) {
        conn_linger(sc);
        return;
    }
    /* Only part of a request is here: with the peer done sending, it cannot complete. */
    if (sc->peer_done) {
        conn_close(sc);
        return;
    }
    update_deadline(sc);
}

/* READING, DATA: append the bytes and answer what is complete. */
static void act_serve(struct server_conn *sc, const void *data, size_t len)
{
    if (rx_append(sc, data, len) < 0) {
        SHMIPC__LOG(SHMIPC__LOG_DEBUG, "%s; closing", shmipc__detail());
        conn_close(sc);
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
        conn_close(sc);
        return;
    }
    if (sc->rx_len - sc->rx_done > RX_PAUSE && shmipc__conn_pause_read(sc->conn) < 0)
        conn_close(sc);
}

/* CLOSING or LINGERING, DATA: nobody will answer it. While the last response is still going
 * out the send timeout bounds the connection; afterwards the drain has a byte limit too. */
static void act_drain(struct server_conn *sc, size_t len)
{
    if (sc->state != SHMIPC__CS_LINGERING)
        return;
    sc->drained += len;
    if (sc->drained > LINGER_BYTES)
        conn_close(sc);
}

/* CLOSING or WRITING, TIMEOUT: the send timeout runs again while the peer takes bytes; a
 * peer that took nothing for that long loses what it did not take. */
static void act_send_timer(struct server_conn *sc)
{
    if (send_progress(sc)) {
        set_deadline(sc, after(sc, sc->w->srv->keepalive_ms));
        return;
    }
    sc->w->stats.timeouts++;
    conn_close(sc);
}

/* UPGRADED: the WebSocket layer's part of each event. */
static void act_ws(struct server_conn *sc, int ev, const void *data, size_t len)
{
    switch (ev) {
    case SHMIPC__CE_DATA:
        /* The reactor's receive buffers are the loop's own writable memory, lent for the
         * call; the WebSocket layer unmasks payloads in place there, or while copying them
         * out (and may read the rest of a large payload itself: ws_read_now). */
        ws_input(sc, (char *)(uintptr_t)data, len);
        break;
    case SHMIPC__CE_SENT:
        rx_drop_done(sc); /* the 101's batch; frames complete in ws_sent */
        break;
    case SHMIPC__CE_PEER_FIN:
        /* After a close handshake the close frame may still be on its way out: it goes,
         * then the connection closes (ws_flush). Otherwise the peer left without one. */
        sc->peer_done = 1;
        if (shmipc__ws_conn_state(&sc->ws->c) != SHMIPC__WS_CLOSED)
            conn_close(sc);
        else
            ws_flush(sc);
        break;
    case SHMIPC__CE_TIMEOUT:
        ws_timeout(sc);
        break;
    case SHMIPC__CE_SHUTDOWN:
        /* A close frame (1001, going away); the stop timeout bounds the answer. */
        if (shmipc__ws_conn_close(&sc->ws->c, 1001, NULL, 0) == 0)
            ws_flush(sc);
        break;
    default:
        conn_close(sc);
        break;
    }
}

/*
 * Runs the lifecycle table's cell for (state, event) (conn_state.c; docs/http.md,
 * "Connection lifecycle"). Each action sets the next state itself: the table's `next` is the
 * one it leads to unless the action's own check decides (docs/http.md lists them).
 */
static void conn_event(struct server_conn *sc, int ev, const void *data, size_t len)
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
         * with Connection: close (handle()) when the rest arrives. */
        if (sc->rx_len == 0)
            conn_linger(sc);
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
        conn_close(sc);
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
        conn_close(sc);
        break;
    }
    if (shmipc__server_cs_trace != NULL)
        shmipc__server_cs_trace(from, ev, t->action, sc->state);
}

static void on_data(struct shmipc__conn *c, const void *data, size_t len)
{
    conn_event(shmipc__conn_data(c), SHMIPC__CE_DATA, data, len);
}

static void on_end(struct shmipc__conn *c, int status)
{
    conn_event(shmipc__conn_data(c), status < 0 ? SHMIPC__CE_ERROR : SHMIPC__CE_PEER_FIN, NULL, 0);
}

static const struct shmipc__conn_cbs conn_cbs = {on_data, on_end};

static int handle(void *user_data, const struct shmipc__http_request *req, const char *body,
                  size_t body_len, struct shmipc__http_response *resp);

static void on_accept(struct shmipc__acceptor *a, struct shmipc__conn *c, void *data)
{
    struct shmipc__server_worker *w = data;
    struct shmipc_server *s = w->srv;
    struct server_conn *sc = w->free_conns;
    int one = 1;
    (void)a;
    if (sc != NULL)
        w->free_conns = sc->next;
    else
        sc = malloc(conn_size(s));
    if (sc == NULL) {
        SHMIPC__LOG(SHMIPC__LOG_WARN, "server: out of memory for a connection");
        shmipc__conn_close(c);
        return;
    }
    memset(sc, 0, sizeof *sc);
    sc->w = w;
    sc->conn = c;
    sc->fresh = 1;
    shmipc__http_conn_init(&sc->http, &s->limits, sc->fields, handle, sc);
    sc->http.head_reserve = HEAD_RESERVE;
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
    set_deadline(sc, after(sc, s->header_ms));
}

/* ---------------------------------------------------------------------------------------- */
/* Routing */

static int method_matches(const struct shmipc__route *rt, const struct shmipc__http_request *req)
{
    const char *m = shmipc__http_at(req, req->name);
    if (rt->method == NULL)
        return 1;
    if (req->name.len == rt->method_len && memcmp(m, rt->method, rt->method_len) == 0)
        return 1;
    /* A GET route answers HEAD; the writer leaves the body out. */
    return req->method == SHMIPC__HTTP_HEAD && rt->method_len == 3 &&
           memcmp(rt->method, "GET", 3) == 0;
}

static int path_matches(const struct shmipc__route *rt, const char *path, size_t len)
{
    if (!rt->prefix)
        return len == rt->path_len && memcmp(path, rt->path, len) == 0;
    return len >= rt->path_len && memcmp(path, rt->path, rt->path_len) == 0;
}

/*
 * The route for the request: exact paths first, then the longest prefix. *path_known tells a
 * 405 (some route has the path) from a 404.
 */
static const struct shmipc__route *
find_route(const struct shmipc_server *s, const struct shmipc__http_request *req, int *path_known)
{
    const char *path = shmipc__http_at(req, req->path);
    size_t len = req->path.len;
    const struct shmipc__route *best = NULL;
    *path_known = 0;
    for (size_t i = 0; i < s->nroutes; i++) {
        const struct shmipc__route *rt = &s->routes[i];
        if (!path_matches(rt, path, len))
            continue;
        *path_known = 1;
        if (!method_matches(rt, req))
            continue;
        if (!rt->prefix)
            return rt;
        if (best == NULL || rt->path_len > best->path_len)
            best = rt;
    }
    return best;
}

/* "GET, HEAD, POST": the methods of the routes that have this path. */
static const char *allow_list(struct shmipc__server_worker *w,
                              const struct shmipc__http_request *req, uint32_t *len)
{
    const struct shmipc_server *s = w->srv;
    const char *path = shmipc__http_at(req, req->path);
    size_t n = 0;
    int get = 0, head = 0;
    for (size_t i = 0; i < s->nroutes; i++) {
        const struct shmipc__route *rt = &s->routes[i];
        if (!path_matches(rt, path, req->path.len) || rt->method == NULL)
            continue;
        if (rt->method_len == 3 && memcmp(rt->method, "GET", 3) == 0)
            get = 1;
        if (rt->method_len == 4 && memcmp(rt->method, "HEAD", 4) == 0) {
            if (head)
                continue;
            head = 1;
        }
        if (n + rt->method_len + 2 > sizeof w->allow)
            break;
        if (n > 0) {
            memcpy(w->allow + n, ", ", 2);
            n += 2;
        }
        memcpy(w->allow + n, rt->method, rt->method_len);
        n += rt->method_len;
    }
    if (get && !head && n + 6 <= sizeof w->allow) {
        memcpy(w->allow + n, ", HEAD", 6);
        n += 6;
    }
    *len = (uint32_t)n;
    return w->allow;
}

/* A canned status that keeps the connection open, unless the request closes it. */
static void canned(struct shmipc__http_response *resp, int status)
{
    uint16_t close = resp->flags & SHMIPC__HTTP_RESP_CLOSE;
    shmipc__http_response_error(resp, status);
    resp->flags = (uint16_t)((resp->flags & ~SHMIPC__HTTP_RESP_CLOSE) | close);
}

/* ---------------------------------------------------------------------------------------- */
/* WebSocket connections (docs/websocket.md, "Wiring it into the server") */

static const struct shmipc__ws_route *find_ws_route(const struct shmipc_server *s,
                                                    const struct shmipc__http_request *req)
{
    const char *path = shmipc__http_at(req, req->path);
    size_t len = req->path.len;
    const struct shmipc__ws_route *best = NULL;
    for (size_t i = 0; i < s->nws_routes; i++) {
        const struct shmipc__ws_route *rt = &s->ws_routes[i];
        if (!rt->prefix) {
            if (len == rt->path_len && memcmp(path, rt->path, len) == 0)
                return rt;
        } else if (len >= rt->path_len && memcmp(path, rt->path, rt->path_len) == 0 &&
                   (best == NULL || rt->path_len > best->path_len)) {
            best = rt;
        }
    }
    return best;
}

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
    .on_close = ws_on_close,
    .write_now = ws_write_now,
    .read_now = ws_read_now,
};

/*
 * A request for a WebSocket route: the handshake's 400/426, the application's 403, or the 101.
 * After a 101 the HTTP parser must not look at the bytes behind this head (they are frames):
 * a head reserve that no batch can meet makes shmipc__http_conn_process() stop after this
 * request, with `consumed` at the end of its head; conn_serve() then switches to WebSocket.
 */
static int ws_upgrade(struct server_conn *sc, const struct shmipc__ws_route *wsr,
                      const struct shmipc__http_request *req, const char *body, size_t body_len,
                      struct shmipc__http_response *resp)
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
    if (w->draining) {
        canned(resp, 503);
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
        struct shmipc_http_request preq = {req, body, body_len, 0, 0};
        if (wsr->prefix) {
            preq.wild_off = req->path.off + (uint32_t)wsr->path_len;
            preq.wild_len = req->path.len - (uint32_t)wsr->path_len;
        }
        rc = wsr->on_open(ws, &preq, wsr->user_data);
        if (rc < 0) {
            sc->ws = NULL;
            shmipc__ws_conn_destroy(&ws->c);
            free(ws);
            canned(resp, 403);
            resp->flags |= SHMIPC__HTTP_RESP_CLOSE;
            return 0;
        }
    }
    shmipc__ws_handshake_response(hs, resp);
    sc->http.head_reserve = UINT32_MAX;
    return 0;
}

/*
 * WebSocket timers, on the connection's one timer (see set_deadline()): the application's
 * close waiting for the peer's (close_at), output the peer stops taking (the keep-alive
 * timeout, while a send is in flight), and, while open and reading, the automatic ping and
 * the idle timeout. Input and output progress only raise a flag (rx_seen, tx_seen); the timer,
 * when it fires, turns the flags into times on its own clock, does what is due and starts
 * again for the next thing. So nothing touches the timer per message, and no time is ever
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

static uint64_t ws_deadline(const struct server_conn *sc)
{
    const struct shmipc_ws *ws = sc->ws;
    const struct shmipc_server *s = sc->w->srv;
    uint64_t d = ws->close_at;
    if (ws->sending)
        d = earliest(d, ws->tx_at + s->keepalive_ms);
    if (ws_reading(sc)) {
        if (s->ws_idle_ms != 0)
            d = earliest(d, ws->rx_at + s->ws_idle_ms);
        if (s->ws_ping_ms != 0)
            d = earliest(d, ws_ping_due(ws, s->ws_ping_ms));
    }
    return d;
}

static void ws_arm(struct server_conn *sc)
{
    uint64_t d = ws_deadline(sc);
    if (d != 0)
        set_deadline(sc, d);
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

static void ws_timeout(struct server_conn *sc)
{
    struct shmipc__server_worker *w = sc->w;
    const struct shmipc_server *s = w->srv;
    struct shmipc_ws *ws = sc->ws;
    uint64_t now = shmipc__loop_now_ms(w->loop);
    if (ws->close_at != 0 && now >= ws->close_at) {
        w->stats.timeouts++;
        conn_close(sc); /* the peer never answered the application's close: 1006 */
        return;
    }
    if (ws->rx_seen) {
        ws->rx_seen = 0;
        ws->rx_at = now;
    }
    if (ws->sending) {
        int64_t mark = ws_progress(sc);
        if (ws->tx_seen || mark != ws->tx_mark) {
            ws->tx_seen = 0;
            ws->tx_at = now;
            ws->tx_mark = mark;
        } else if (now >= ws->tx_at + s->keepalive_ms) {
            /* The peer stopped reading: what it did not take goes with the connection. */
            w->stats.timeouts++;
            w->stats.ws_stall_closes++;
            conn_close(sc);
            return;
        }
    }
    if (ws_reading(sc)) {
        if (s->ws_idle_ms != 0 && now >= ws->rx_at + s->ws_idle_ms) {
            /* Nothing arrived, not even a pong: the peer is taken for gone. No close frame
             * (it would only wait for an answer that does not come); on_close gets 1006. */
            w->stats.timeouts++;
            w->stats.ws_idle_closes++;
            conn_close(sc);
            return;
        }
        if (s->ws_ping_ms != 0 && now >= ws_ping_due(ws, s->ws_ping_ms)) {
            ws->ping_at = now;
            /* A full queue (SHMIPC_EAGAIN) skips this ping; the idle timer still runs. */
            if (shmipc__ws_conn_ping(&ws->c, "", 0) == 0) {
                w->stats.ws_pings++;
                ws_flush(sc);
                if (sc->state != SHMIPC__CS_UPGRADED)
                    return;
            }
        }
    }
    ws_arm(sc);
}

/* The 101 (and what the batch holds before it) was just queued: from here on, frames. */
static void ws_start(struct server_conn *sc, size_t consumed)
{
    size_t left = sc->rx_len - consumed;
    sc->state = SHMIPC__CS_UPGRADED;
    sc->in_head = 0;
    sc->w->stats.ws_upgrades++;
    /* The HTTP timeouts end here; the WebSocket's own start (an application's close in
     * on_open has its close_at already). */
    sc->deadline = 0;
    shmipc__timer_stop(&sc->timer);
    sc->ws->rx_at = shmipc__loop_now_ms(sc->w->loop);
    sc->ws->rx_seen = 1;
    ws_arm(sc);
    /* The bytes behind the request head are the first frames. The batch in flight points
     * only before them, so they are processed now and dropped with it (rx_drop_done). */
    sc->rx_len = consumed;
    if (left > 0)
        ws_input(sc, sc->rx + consumed, left);
    else
        ws_flush(sc);
}

static void ws_sent(struct shmipc__conn *c, int status, void *data)
{
    struct server_conn *sc = data;
    struct shmipc_ws *ws = sc->ws;
    (void)c;
    ws->sending = 0;
    if (sc->state == SHMIPC__CS_CLOSED || status < 0) {
        conn_event(sc, status < 0 ? SHMIPC__CE_ERROR : SHMIPC__CE_SENT, NULL, 0);
        return; /* released, or closed */
    }
    ws->tx_done += ws->flight;
    ws->tx_seen = 1;
    /* Drained to half the high-water mark: read again (see ws_input). The time spent paused
     * was ours, not the peer's silence: the idle and ping timers start afresh. */
    if (shmipc__ws_conn_tx_sent(&ws->c, ws->flight) && shmipc__conn_read_paused(sc->conn) &&
        shmipc__conn_resume_read(sc->conn) == 0) {
        ws->rx_at = shmipc__loop_now_ms(sc->w->loop);
        ws->rx_seen = 1;
        ws_arm(sc);
    }
    ws_flush(sc);
}

/*
 * Hands the queued output to the reactor, one send at a time: the peeked bytes stay put until
 * their completion (ws_conn.h), so they go without a copy. Once the close handshake is over
 * and its frame written, the server closes the TCP connection first (RFC 6455 §7.1.1): a FIN,
 * then the peer's input is drained until its own FIN or the linger time.
 */
static void ws_flush(struct server_conn *sc)
{
    struct shmipc_ws *ws = sc->ws;
    const char *p;
    size_t n, queued;
    if (sc->state != SHMIPC__CS_UPGRADED)
        return; /* before the 101 is queued, or done */
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
            set_deadline(sc, ws->tx_at + sc->w->srv->keepalive_ms);
        }
    }
    /* Not from inside process(): its caller flushes again when it returns. */
    if (ws->sending || ws->c.busy || shmipc__ws_conn_state(&ws->c) != SHMIPC__WS_CLOSED)
        return;
    if (sc->peer_done)
        conn_close(sc);
    else
        conn_linger(sc);
}

/*
 * Received bytes. On PAUSE (tx_high_water bytes queued: the peer does not read what it is
 * sent) the reactor stops reading, so TCP flow control stops the peer, until ws_sent() sees
 * the queue drained to half the mark.
 */
static void ws_input(struct server_conn *sc, char *data, size_t len)
{
    struct shmipc_ws *ws = sc->ws;
    int v;
    /* Input only moves deadlines later: the timer picks it up when it fires. */
    ws->rx_seen = 1;
    v = shmipc__ws_conn_process(&ws->c, data, len);
    if (v == SHMIPC__WS_CONN_PAUSE && !shmipc__conn_read_paused(sc->conn) &&
        shmipc__conn_pause_read(sc->conn) == 0)
        sc->w->stats.ws_pauses++;
    ws_flush(sc);
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
    ws_flush(ws->conn);
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
        ws->close_at = after(sc, WS_CLOSE_MS);
        set_deadline(sc, ws->close_at);
    }
    return rc;
}

static int handle(void *user_data, const struct shmipc__http_request *req, const char *body,
                  size_t body_len, struct shmipc__http_response *resp)
{
    struct server_conn *sc = user_data;
    struct shmipc__server_worker *w = sc->w;
    const struct shmipc__route *rt;
    const struct shmipc__ws_route *wsr;
    int path_known;
    int rc = 0;

    w->stats.requests++;
    rt = find_route(w->srv, req, &path_known);
    wsr = find_ws_route(w->srv, req);
    /* A plain GET keeps its route; every other request on a WebSocket path is a handshake,
     * which answers 400/426 when it is not a valid one. */
    if (wsr != NULL && (rt == NULL || shmipc__ws_is_upgrade(req)))
        return ws_upgrade(sc, wsr, req, body, body_len, resp);
    if (rt == NULL) {
        if (req->flags & SHMIPC__HTTP_UNKNOWN_METHOD) {
            canned(resp, 501);
        } else if (path_known) {
            canned(resp, 405);
            w->hdrs[0].name = "Allow";
            w->hdrs[0].name_len = 5;
            w->hdrs[0].value = allow_list(w, req, &w->hdrs[0].value_len);
            resp->headers = w->hdrs;
            resp->nheaders = 1;
        } else {
            canned(resp, 404);
        }
    } else if (rt->fn == NULL) {
        resp->status = rt->status;
        resp->content_type = rt->content_type;
        resp->body = rt->body;
        resp->body_len = rt->body_len;
    } else {
        struct shmipc_http_request preq = {req, body, body_len, 0, 0};
        struct shmipc_http_response pres = {resp, w, sc, 0, 0};
        if (rt->prefix) {
            preq.wild_off = req->path.off + (uint32_t)rt->path_len;
            preq.wild_len = req->path.len - (uint32_t)rt->path_len;
        }
        w->hused = 0;
        resp->headers = w->hdrs;
        resp->nheaders = 0;
        rc = rt->fn(&preq, &pres, rt->user_data);
    }
    /* A graceful stop ends keep-alive with the answer to the request in progress. */
    if (w->draining)
        resp->flags |= SHMIPC__HTTP_RESP_CLOSE;
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* The response API */

static int header_is(const char *name, const char *what)
{
    return strcasecmp(name, what) == 0;
}

static int is_token(const char *s)
{
    if (*s == '\0')
        return 0;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              strchr("!#$%&'*+-.^_`|~", c)))
            return 0;
    }
    return 1;
}

int shmipc__http_response_add_header(struct shmipc_http_response *res, const char *name,
                                     const char *value)
{
    struct shmipc__server_worker *w = res->w;
    struct shmipc__http_response *r = res->r;
    size_t nlen = strlen(name), vlen = strlen(value);
    char *p;
    if (!is_token(name))
        return shmipc__fail(SHMIPC_EINVAL, "response header \"%s\": the name is not a token", name);
    for (size_t i = 0; i < vlen; i++) {
        unsigned char c = (unsigned char)value[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return shmipc__fail(SHMIPC_EINVAL, "response header %s: the value has a control byte",
                                name);
    }
    if (header_is(name, "Content-Length") || header_is(name, "Transfer-Encoding") ||
        header_is(name, "Date") || header_is(name, "Server"))
        return shmipc__fail(SHMIPC_EINVAL, "response header %s: set by the server", name);
    if (header_is(name, "Connection")) {
        if (strcasecmp(value, "close") != 0)
            return shmipc__fail(SHMIPC_EINVAL,
                                "response header Connection: only \"close\" may be set");
        r->flags |= SHMIPC__HTTP_RESP_CLOSE;
        return 0;
    }
    if (header_is(name, "Content-Type") && res->has_type)
        return shmipc__fail(SHMIPC_EINVAL, "response header Content-Type: already set");
    if (w->hused + nlen + vlen + 1 > sizeof w->hbytes ||
        (!header_is(name, "Content-Type") && r->nheaders >= SHMIPC__SERVER_MAX_RESP_HEADERS))
        return shmipc__fail(SHMIPC_ENOSPC, "response header %s: more than %u headers or %u bytes",
                            name, SHMIPC__SERVER_MAX_RESP_HEADERS,
                            SHMIPC__SERVER_RESP_HEADER_BYTES);
    p = w->hbytes + w->hused;
    memcpy(p, name, nlen);
    memcpy(p + nlen, value, vlen + 1);
    w->hused += nlen + vlen + 1;
    if (header_is(name, "Content-Type")) {
        r->content_type = p + nlen;
        res->has_type = 1;
        return 0;
    }
    w->hdrs[r->nheaders].name = p;
    w->hdrs[r->nheaders].name_len = (uint32_t)nlen;
    w->hdrs[r->nheaders].value = p + nlen;
    w->hdrs[r->nheaders].value_len = (uint32_t)vlen;
    r->nheaders++;
    return 0;
}

int shmipc__http_response_body(struct shmipc_http_response *res, const void *data, size_t len,
                               void *user_data, shmipc_destroy_cb release, int borrow)
{
    struct server_conn *sc = res->conn;
    struct release *node;
    if (borrow) {
        node = malloc(sizeof *node);
        if (node == NULL) {
            if (release != NULL)
                release(user_data);
            return shmipc__fail(SHMIPC_ENOMEM, "response body: out of memory");
        }
        node->fn = release;
        node->user_data = user_data;
        res->r->body = data;
    } else if (len <= sizeof res->w->body) {
        /* The batch copies a body this small behind its head (its arena keeps room). */
        if (len > 0)
            memcpy(res->w->body, data, len);
        res->r->body = res->w->body;
        res->r->body_len = len;
        return 0;
    } else {
        node = malloc(sizeof *node + len);
        if (node == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "response body: %zu bytes", len);
        node->fn = NULL;
        node->user_data = NULL;
        memcpy(node + 1, data, len);
        res->r->body = node + 1;
    }
    res->r->body_len = len;
    node->next = sc->releases;
    sc->releases = node;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Workers */

static int worker_setup(struct shmipc__loop *loop, int listen_fd, unsigned index, void *data)
{
    struct shmipc_server *s = data;
    struct shmipc__server_worker *w = &s->w[index];
    struct timespec ts;
    int rc;
    w->loop = loop;
    w->thread = pthread_self();
    clock_gettime(CLOCK_REALTIME, &ts);
    shmipc__http_date_init(&w->date, ts.tv_sec);
    shmipc__timer_init(loop, &w->date_timer, date_tick, w);
    rc = shmipc__timer_start(&w->date_timer, 1000 - (uint64_t)ts.tv_nsec / 1000000 + 1);
    if (rc < 0) {
        close(listen_fd);
        return rc;
    }
    rc = shmipc__acceptor_open(loop, listen_fd, &conn_cbs, on_accept, w, &w->acceptor);
    if (rc < 0) {
        shmipc__timer_stop(&w->date_timer);
        return rc;
    }
    if (index == 0)
        s->backend_name = shmipc__loop_backend_name(loop);
    return 0;
}

/*
 * Runs on the worker thread once its loop was stopped: the graceful part of a stop. The loop
 * still works, so it is run here until the connections are gone or the stop timeout passed.
 */
static void worker_teardown(struct shmipc__loop *loop, unsigned index, void *data)
{
    struct shmipc_server *s = data;
    struct shmipc__server_worker *w = &s->w[index];
    uint64_t deadline = shmipc__loop_now_ms(loop) + s->stop_ms;
    struct server_conn *sc, *next;

    w->draining = 1;
    if (w->acceptor != NULL) {
        shmipc__acceptor_close(w->acceptor);
        w->acceptor = NULL;
    }
    /* Idle keep-alive connections get their FIN now; the others with their last answer.
     * WebSockets get a close frame (1001, going away) and the stop timeout to answer it. */
    for (sc = w->conns; sc != NULL; sc = next) {
        next = sc->next;
        conn_event(sc, SHMIPC__CE_SHUTDOWN, NULL, 0);
    }
    while (w->nconns > 0) {
        uint64_t now = shmipc__loop_now_ms(loop);
        if (now >= deadline)
            break;
        if (shmipc__loop_run_once(loop, (int)(deadline - now < 50 ? deadline - now : 50)) < 0)
            break;
    }
    while (w->conns != NULL)
        conn_close(w->conns);
    shmipc__timer_stop(&w->date_timer);
    shmipc__loop_stats(loop, &w->stats.loop);
}

/* ---------------------------------------------------------------------------------------- */
/* The server */

int shmipc__server_new(const struct shmipc_server_config *cfg, struct shmipc_server **out)
{
    struct shmipc_server_config *defaults = NULL;
    struct shmipc_server *s = NULL;
    uint32_t header_ms = SHMIPC__SERVER_DEFAULT_HEADER_MS;
    uint32_t keepalive_ms = SHMIPC__SERVER_DEFAULT_KEEPALIVE_MS;
    int rc;

    *out = NULL;
    if (cfg == NULL) {
        rc = shmipc__server_config_new(&defaults);
        if (rc < 0)
            return rc;
        cfg = defaults;
    }
    s = calloc(1, sizeof *s);
    if (s == NULL) {
        rc = shmipc__fail(SHMIPC_ENOMEM, "server_new: out of memory");
        goto err;
    }
    s->stop_fd = -1;
    s->cfg = *cfg;
    rc = env_ms("SHMIPC_HTTP_HEADER_TIMEOUT_MS", shmipc__getenv("SHMIPC_HTTP_HEADER_TIMEOUT_MS"),
                &header_ms);
    if (rc == 0)
        rc = env_ms("SHMIPC_HTTP_KEEPALIVE_TIMEOUT_MS",
                    shmipc__getenv("SHMIPC_HTTP_KEEPALIVE_TIMEOUT_MS"), &keepalive_ms);
    if (rc == 0 && !cfg->reuse_port_set) {
        unsigned long share = 0;
        rc = shmipc__env_number("SHMIPC_HTTP_REUSEPORT", shmipc__getenv("SHMIPC_HTTP_REUSEPORT"), 0,
                                1, "flags (1: share)", &share);
        s->cfg.reuse_port = (uint8_t)share;
    }
    if (rc < 0)
        goto err;
    s->header_ms = cfg->timeout_set[SHMIPC_SERVER_TIMEOUT_HEADER]
                       ? cfg->timeout_ms[SHMIPC_SERVER_TIMEOUT_HEADER]
                       : header_ms;
    s->keepalive_ms = cfg->timeout_set[SHMIPC_SERVER_TIMEOUT_KEEPALIVE]
                          ? cfg->timeout_ms[SHMIPC_SERVER_TIMEOUT_KEEPALIVE]
                          : keepalive_ms;
    s->stop_ms = cfg->timeout_set[SHMIPC_SERVER_TIMEOUT_STOP]
                     ? cfg->timeout_ms[SHMIPC_SERVER_TIMEOUT_STOP]
                     : SHMIPC__SERVER_DEFAULT_STOP_MS;
    s->ws_ping_ms = cfg->timeout_ms[SHMIPC_SERVER_TIMEOUT_WS_PING];
    s->ws_idle_ms = cfg->timeout_ms[SHMIPC_SERVER_TIMEOUT_WS_IDLE];
    s->pipeline = cfg->pipeline != 0 ? cfg->pipeline : SHMIPC__HTTP_CONN_BUDGET;
    rc = shmipc__http_limits_resolve(&s->limits, &cfg->limits);
    if (rc < 0)
        goto err;
    {
        struct shmipc__ws_limits wl = {.max_message = cfg->ws_max_message,
                                       .tx_high_water = (size_t)cfg->ws_tx_high_water,
                                       .tx_limit = (size_t)cfg->ws_tx_limit};
        rc = shmipc__ws_limits_resolve(&s->ws_limits, &wl);
        if (rc < 0)
            goto err;
    }
    /* A head, a body with its chunk framing and trailers, and room for what the peer
     * pipelines behind them. */
    s->rx_max = (size_t)s->limits.max_head_bytes * 2 + (size_t)s->limits.max_body +
                s->limits.max_chunk_line + (64u << 10);
    s->server_name = s->cfg.server_name[0] != '\0' ? s->cfg.server_name : NULL;
    switch (cfg->backend) {
    case SHMIPC_BACKEND_DEFAULT:
        break;
    case SHMIPC_BACKEND_AUTO:
        s->loop_opts.backend = SHMIPC__BACKEND_AUTO;
        break;
    case SHMIPC_BACKEND_IO_URING:
        s->loop_opts.backend = SHMIPC__BACKEND_IO_URING;
        break;
    case SHMIPC_BACKEND_EPOLL:
        s->loop_opts.backend = SHMIPC__BACKEND_EPOLL;
        break;
    default:
        s->loop_opts.backend = SHMIPC__BACKEND_EPOLL;
        s->loop_opts.rx_epoll = SHMIPC__RX_ONESHOT;
        break;
    }
    /* Room for a frame head beside 16 KiB: a 16 KiB WebSocket message (16392 bytes as a
     * masked frame) then arrives in one receive and is delivered in place, not copied. */
    s->loop_opts.recv_buf_size = SHMIPC__SERVER_RECV_BUF;
    s->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->stop_fd < 0) {
        rc = shmipc__fail_errno(errno, "server_new: eventfd");
        goto err;
    }
    atomic_init(&s->stop_requested, 0);
    atomic_init(&s->running, 0);
    free(defaults);
    *out = s;
    return 0;
err:
    shmipc__server_free(s);
    free(defaults);
    return rc;
}

static int valid_route_path(const char *path, size_t len, int *prefix)
{
    *prefix = len >= 2 && path[len - 1] == '*' && path[len - 2] == '/';
    if (len == 0 || path[0] != '/')
        return shmipc__fail(SHMIPC_EINVAL, "route path \"%s\" does not start with '/'", path);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)path[i];
        if (c <= 0x20 || c >= 0x7f || c == '?' || (c == '*' && !(*prefix && i == len - 1)))
            return shmipc__fail(SHMIPC_EINVAL,
                                "route path \"%s\": byte %zu is not allowed (visible ASCII, no "
                                "'?', '*' only as a final \"/*\")",
                                path, i);
    }
    return 0;
}

int shmipc__server_route(struct shmipc_server *s, const char *method, const char *path,
                         shmipc_http_handler fn, void *user_data, shmipc_destroy_cb destroy,
                         int status, const char *content_type, const void *body, size_t len)
{
    struct shmipc__route rt;
    size_t plen = strlen(path);
    int rc;

    memset(&rt, 0, sizeof rt);
    if (s->workers != NULL) {
        rc = shmipc__fail(SHMIPC_EBUSY, "route %s: the server is running", path);
        goto err;
    }
    if (method != NULL && !is_token(method)) {
        rc = shmipc__fail(SHMIPC_EINVAL, "route %s: method \"%s\" is not a token", path, method);
        goto err;
    }
    rc = valid_route_path(path, plen, &rt.prefix);
    if (rc < 0)
        goto err;
    if (fn == NULL) {
        if (status < 200 || status > 999) {
            rc = shmipc__fail(SHMIPC_EINVAL, "static %s: status %d is outside 200..999", path,
                              status);
            goto err;
        }
        if (content_type != NULL)
            for (const char *p = content_type; *p; p++)
                if (((unsigned char)*p < 0x20 && *p != '\t') || *p == 0x7f) {
                    rc = shmipc__fail(SHMIPC_EINVAL, "static %s: content type has a control byte",
                                      path);
                    goto err;
                }
    }
    if (rt.prefix)
        plen--; /* a prefix route is stored without its final star */
    for (size_t i = 0; i < s->nroutes; i++) {
        const struct shmipc__route *o = &s->routes[i];
        int same_method = (o->method == NULL && method == NULL) ||
                          (o->method != NULL && method != NULL && strcmp(o->method, method) == 0);
        if (same_method && o->prefix == rt.prefix && o->path_len == plen &&
            memcmp(o->path, path, plen) == 0) {
            rc = shmipc__fail(SHMIPC_EEXIST, "route %s %s: already registered",
                              method ? method : "*", path);
            goto err;
        }
    }
    if (s->nroutes == s->routes_cap) {
        size_t cap = s->routes_cap ? s->routes_cap * 2 : 8;
        struct shmipc__route *grown = realloc(s->routes, cap * sizeof *grown);
        if (grown == NULL) {
            rc = shmipc__fail(SHMIPC_ENOMEM, "route %s: out of memory", path);
            goto err;
        }
        s->routes = grown;
        s->routes_cap = cap;
    }
    rt.method = method != NULL ? strdup(method) : NULL;
    rt.method_len = method != NULL ? strlen(method) : 0;
    rt.path = strndup(path, plen);
    rt.path_len = plen;
    rt.fn = fn;
    rt.user_data = user_data;
    rt.destroy = destroy;
    rt.status = (uint16_t)status;
    if (fn == NULL) {
        rt.content_type = content_type != NULL ? strdup(content_type) : NULL;
        rt.body = malloc(len > 0 ? len : 1);
        if (rt.body != NULL && len > 0)
            memcpy(rt.body, body, len);
        rt.body_len = len;
    }
    if ((method != NULL && rt.method == NULL) || rt.path == NULL ||
        (fn == NULL && (rt.body == NULL || (content_type != NULL && rt.content_type == NULL)))) {
        free(rt.method);
        free(rt.path);
        free(rt.content_type);
        free(rt.body);
        rc = shmipc__fail(SHMIPC_ENOMEM, "route %s: out of memory", path);
        goto err;
    }
    s->routes[s->nroutes++] = rt;
    return 0;
err:
    if (destroy != NULL)
        destroy(user_data);
    return rc;
}

static void ws_route_free(struct shmipc__ws_route *rt)
{
    if (rt->destroy != NULL)
        rt->destroy(rt->user_data);
    for (size_t i = 0; i < rt->nprotocols; i++)
        free(rt->protocols[i]);
    free(rt->protocols);
    free(rt->path);
}

/* Splits "chat, superchat" into tokens. Returns 0 or SHMIPC_EINVAL/SHMIPC_ENOMEM. */
static int ws_protocols(struct shmipc__ws_route *rt, const char *list)
{
    const char *p = list;
    while (*p != '\0') {
        const char *a, *z;
        char *tok, **grown;
        while (*p == ' ' || *p == '\t')
            p++;
        a = p;
        while (*p != '\0' && *p != ',')
            p++;
        z = p;
        while (z > a && (z[-1] == ' ' || z[-1] == '\t'))
            z--;
        if (*p == ',')
            p++;
        tok = strndup(a, (size_t)(z - a));
        if (tok == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "websocket %s: subprotocols", rt->path);
        if (!is_token(tok)) {
            free(tok);
            return shmipc__fail(SHMIPC_EINVAL,
                                "websocket %s: subprotocols \"%s\": element %zu is not a token",
                                rt->path, list, rt->nprotocols + 1);
        }
        grown = realloc(rt->protocols, (rt->nprotocols + 1) * sizeof *grown);
        if (grown == NULL) {
            free(tok);
            return shmipc__fail(SHMIPC_ENOMEM, "websocket %s: subprotocols", rt->path);
        }
        rt->protocols = grown;
        rt->protocols[rt->nprotocols++] = tok;
    }
    return 0;
}

int shmipc__server_websocket(struct shmipc_server *s, const char *path, const char *subprotocols,
                             shmipc_ws_open_cb on_open, shmipc_ws_message_cb on_message,
                             shmipc_ws_close_cb on_close, void *user_data,
                             shmipc_destroy_cb destroy)
{
    struct shmipc__ws_route rt;
    size_t plen = strlen(path);
    int rc;

    memset(&rt, 0, sizeof rt);
    if (s->workers != NULL) {
        rc = shmipc__fail(SHMIPC_EBUSY, "websocket %s: the server is running", path);
        goto err;
    }
    rc = valid_route_path(path, plen, &rt.prefix);
    if (rc < 0)
        goto err;
    if (rt.prefix)
        plen--;
    for (size_t i = 0; i < s->nws_routes; i++) {
        const struct shmipc__ws_route *o = &s->ws_routes[i];
        if (o->prefix == rt.prefix && o->path_len == plen && memcmp(o->path, path, plen) == 0) {
            rc = shmipc__fail(SHMIPC_EEXIST, "websocket %s: already registered", path);
            goto err;
        }
    }
    rt.path = strndup(path, plen);
    rt.path_len = plen;
    if (rt.path == NULL) {
        rc = shmipc__fail(SHMIPC_ENOMEM, "websocket %s: out of memory", path);
        goto err;
    }
    if (subprotocols != NULL) {
        rc = ws_protocols(&rt, subprotocols);
        if (rc < 0)
            goto err;
    }
    if (s->nws_routes == s->ws_routes_cap) {
        size_t cap = s->ws_routes_cap ? s->ws_routes_cap * 2 : 4;
        struct shmipc__ws_route *grown = realloc(s->ws_routes, cap * sizeof *grown);
        if (grown == NULL) {
            rc = shmipc__fail(SHMIPC_ENOMEM, "websocket %s: out of memory", path);
            goto err;
        }
        s->ws_routes = grown;
        s->ws_routes_cap = cap;
    }
    rt.on_open = on_open;
    rt.on_message = on_message;
    rt.on_close = on_close;
    rt.user_data = user_data;
    rt.destroy = destroy;
    s->ws_routes[s->nws_routes++] = rt;
    return 0;
err:
    rt.destroy = destroy;
    rt.user_data = user_data;
    ws_route_free(&rt);
    return rc;
}

static void server_shutdown(struct shmipc_server *s)
{
    if (s->workers == NULL)
        return;
    /* Stops every loop; each worker's teardown drains its connections, in parallel. */
    shmipc__workers_free(s->workers);
    s->workers = NULL;
    memset(&s->stats, 0, sizeof s->stats);
    for (unsigned i = 0; i < s->nworkers; i++) {
        const struct shmipc__server_worker *w = &s->w[i];
        const uint64_t *from = (const uint64_t *)&w->stats.loop;
        uint64_t *to = (uint64_t *)&s->stats.loop;
        for (size_t k = 0; k < sizeof w->stats.loop / sizeof(uint64_t); k++)
            to[k] += from[k];
        s->stats.connections += w->stats.connections;
        s->stats.requests += w->stats.requests;
        s->stats.timeouts += w->stats.timeouts;
        s->stats.ws_upgrades += w->stats.ws_upgrades;
        s->stats.ws_pauses += w->stats.ws_pauses;
        s->stats.ws_pings += w->stats.ws_pings;
        s->stats.ws_idle_closes += w->stats.ws_idle_closes;
        s->stats.ws_stall_closes += w->stats.ws_stall_closes;
        if (w->stats.ws_tx_max > s->stats.ws_tx_max)
            s->stats.ws_tx_max = w->stats.ws_tx_max;
        worker_free_pools(&s->w[i]);
    }
    free(s->w);
    s->w = NULL;
    s->nworkers = 0;
}

int shmipc__server_start(struct shmipc_server *s)
{
    struct shmipc__workers_opts o;
    unsigned count = s->cfg.workers;
    int rc;

    if (s->workers != NULL)
        return 0;
    if (count == 0) {
        rc = shmipc__workers_default(&count);
        if (rc < 0)
            return rc;
    }
    s->w = calloc(count, sizeof *s->w);
    if (s->w == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "server_start: %u workers", count);
    s->nworkers = count;
    for (unsigned i = 0; i < count; i++) {
        s->w[i].srv = s;
        s->w[i].index = i;
    }
    memset(&o, 0, sizeof o);
    o.count = count;
    o.loop = &s->loop_opts;
    o.host = s->cfg.address;
    o.port = s->cfg.port;
    o.share_port = s->cfg.reuse_port;
    o.setup = worker_setup;
    o.teardown = worker_teardown;
    o.data = s;
    rc = shmipc__workers_start(&o, &s->workers);
    if (rc < 0) {
        for (unsigned i = 0; i < count; i++)
            worker_free_pools(&s->w[i]);
        free(s->w);
        s->w = NULL;
        s->nworkers = 0;
        return rc;
    }
    s->port = shmipc__workers_port(s->workers);
    return 0;
}

static void drain_stop_fd(struct shmipc_server *s)
{
    uint64_t n;
    while (read(s->stop_fd, &n, sizeof n) > 0)
        ;
}

int shmipc__server_run(struct shmipc_server *s)
{
    int rc = 0;
    if (atomic_exchange(&s->running, 1))
        return shmipc__fail(SHMIPC_EBUSY, "server_run: already running on another thread");
    if (atomic_exchange(&s->stop_requested, 0)) {
        /* Stopped before run got here: a server started meanwhile stops all the same. */
        drain_stop_fd(s);
        server_shutdown(s);
        goto out;
    }
    rc = shmipc__server_start(s);
    if (rc < 0)
        goto out;
    for (;;) {
        struct pollfd p = {.fd = s->stop_fd, .events = POLLIN};
        if (poll(&p, 1, -1) < 0 && errno != EINTR) {
            rc = shmipc__fail_errno(errno, "server_run: poll");
            break;
        }
        drain_stop_fd(s);
        if (atomic_exchange(&s->stop_requested, 0))
            break;
    }
    server_shutdown(s);
out:
    atomic_store(&s->running, 0);
    return rc;
}

int shmipc__server_stop(struct shmipc_server *s)
{
    uint64_t one = 1;
    ssize_t n;
    atomic_store(&s->stop_requested, 1);
    /* EAGAIN means the counter is saturated, which wakes run as well. */
    n = write(s->stop_fd, &one, sizeof one);
    (void)n;
    return 0;
}

void shmipc__server_stats(const struct shmipc_server *s, struct shmipc__server_stats *out)
{
    *out = s->stats;
}

void shmipc__server_free(struct shmipc_server *s)
{
    if (s == NULL)
        return;
    server_shutdown(s);
    for (size_t i = 0; i < s->nroutes; i++) {
        struct shmipc__route *rt = &s->routes[i];
        if (rt->destroy != NULL)
            rt->destroy(rt->user_data);
        free(rt->method);
        free(rt->path);
        free(rt->content_type);
        free(rt->body);
    }
    free(s->routes);
    for (size_t i = 0; i < s->nws_routes; i++)
        ws_route_free(&s->ws_routes[i]);
    free(s->ws_routes);
    if (s->stop_fd >= 0)
        close(s->stop_fd);
    free(s);
}
