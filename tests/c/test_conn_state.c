/* Description: the HTTP connection lifecycle's state machine (issue 18, item 3): the table in
 * core/net/conn_state.c against the one in docs/http.md (read from the file, so the two
 * cannot drift), cell by cell, then every reachable cell walked through real sockets on both
 * backends (epoll, and io_uring where the kernel allows it), seen through the server's trace
 * seam; no "cannot happen" cell is ever hit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "shmipc.h"
#include "net/conn_state.h"
#include "net/server.h"
#include "net/server_int.h"
#include <sys/eventfd.h>
#include "reactor/loop.h"

#define CHECK(call)                                                                                \
    do {                                                                                           \
        int check_rc_ = (call);                                                                    \
        if (check_rc_ < 0)                                                                         \
            fail_msg("%s: %s: %s", #call, shmipc_errname(check_rc_), shmipc_error_detail());       \
    } while (0)

#define NS SHMIPC__CS_COUNT
#define NE SHMIPC__CE_COUNT

/* Skips the calling test where the kernel refuses io_uring (an old kernel, a seccomp filter). */
static void skip_without_io_uring(void)
{
    struct shmipc__loop_opts o = {.backend = SHMIPC__BACKEND_IO_URING};
    struct shmipc__loop *probe = NULL;
    if (shmipc__loop_new(&o, &probe) != 0)
        skip();
    shmipc__loop_free(probe);
}

/* NAME_epoll and NAME_io_uring, the cmocka tests that run FN(backend) on each backend. */
#define BOTH_BACKENDS_OF(name, fn)                                                                 \
    static void name##_epoll(void **state)                                                         \
    {                                                                                              \
        (void)state;                                                                               \
        fn(SHMIPC_BACKEND_EPOLL);                                                                  \
    }                                                                                              \
    static void name##_io_uring(void **state)                                                      \
    {                                                                                              \
        (void)state;                                                                               \
        skip_without_io_uring();                                                                   \
        fn(SHMIPC_BACKEND_IO_URING);                                                               \
    }
#define BOTH_BACKENDS(fn) BOTH_BACKENDS_OF(fn, fn)

/* ---- the table, as docs/http.md writes it, read from the file itself ---- */

#ifndef SHMIPC_DOCS_DIR
#error "SHMIPC_DOCS_DIR (the repository's docs/) comes from tests/c/meson.build"
#endif

/* "action>NEXT" per cell of the docs' "state \ event" table; "" where it has no cell. */
static char documented[NS][NE][64];

/* Splits a markdown table row into its cells, trimmed; returns how many (at most `max`). */
static int cells_of(char *line, char **cell, int max)
{
    int n = 0;
    char *p = strchr(line, '|');
    while (p != NULL && n < max) {
        char *start = p + 1, *bar = strchr(start, '|');
        if (bar == NULL)
            break;
        *bar = '\0';
        while (*start == ' ')
            start++;
        for (char *e = bar; e > start && e[-1] == ' '; e--)
            e[-1] = '\0';
        cell[n++] = start;
        p = bar;
    }
    return n;
}

static int index_of(const char *name, const char *(*name_of)(int), int count)
{
    for (int i = 0; i < count; i++)
        if (strcmp(name, name_of(i)) == 0)
            return i;
    return -1;
}

static const char *state_name(int s)
{
    return shmipc__cs_state_name(s);
}

static const char *event_name(int e)
{
    return shmipc__cs_event_name(e);
}

/*
 * Reads the lifecycle table of docs/http.md: a header "| state \ event | DATA | ... |", then
 * one row per state whose cells are "action → NEXT", an optional "(note)" after, or a bare
 * "action" that keeps the row's state. Every state and event must appear exactly once.
 */
static void read_documented_table(void)
{
    const char *path = SHMIPC_DOCS_DIR "/http.md";
    FILE *f = fopen(path, "r");
    if (f == NULL)
        fail_msg("%s: %s", path, strerror(errno));
    char line[2048], *cell[NE + 2];
    int col_event[NE + 2], ncols = 0, rows = 0, in_table = 0;
    memset(documented, 0, sizeof documented);
    while (fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        if (!in_table) {
            if (strncmp(line, "| state \\ event |", 17) != 0)
                continue;
            ncols = cells_of(line, cell, NE + 2);
            int seen[NE] = {0};
            for (int c = 1; c < ncols; c++) {
                col_event[c] = index_of(cell[c], event_name, NE);
                if (col_event[c] < 0 || seen[col_event[c]]++)
                    fail_msg("%s: the table's column \"%s\" is no event, or twice", path, cell[c]);
            }
            if (ncols != NE + 1)
                fail_msg("%s: the table has %d events, the code %d", path, ncols - 1, NE);
            in_table = 1;
            continue;
        }
        if (line[0] != '|')
            break;
        if (strncmp(line, "|---", 4) == 0)
            continue;
        int n = cells_of(line, cell, NE + 2);
        int st = n > 0 ? index_of(cell[0], state_name, NS) : -1;
        if (st < 0 || n != ncols || documented[st][0][0] != '\0')
            fail_msg("%s: row \"%s\": no state, twice, or %d cells not %d", path,
                     n > 0 ? cell[0] : "", n, ncols);
        for (int c = 1; c < n; c++) {
            char *note = strstr(cell[c], " (");
            if (note != NULL)
                *note = '\0';
            char *arrow = strstr(cell[c], " \u2192 ");
            const char *next = state_name(st);
            if (arrow != NULL) {
                *arrow = '\0';
                next = arrow + strlen(" \u2192 ");
            }
            snprintf(documented[st][col_event[c]], sizeof documented[st][col_event[c]], "%s>%s",
                     cell[c], next);
        }
        rows++;
    }
    fclose(f);
    if (!in_table || rows != NS)
        fail_msg("%s: found %d state rows of the lifecycle table, the code has %d states", path,
                 rows, NS);
}

/* Every cell of the code's table is the documented one; out of range is the bug cell. */
static void table_matches_the_documented_lifecycle(void **state)
{
    (void)state;
    read_documented_table();
    for (int s = 0; s < NS; s++)
        for (int e = 0; e < NE; e++) {
            const struct shmipc__cs_transition *t = shmipc__cs_lookup(s, e);
            char cell[64];
            snprintf(cell, sizeof cell, "%s>%s", shmipc__cs_action_name(t->action),
                     shmipc__cs_state_name(t->next));
            if (strcmp(cell, documented[s][e]) != 0)
                fail_msg("%s x %s: the code says %s, docs/http.md %s", shmipc__cs_state_name(s),
                         shmipc__cs_event_name(e), cell, documented[s][e]);
        }
    assert_int_equal(shmipc__cs_lookup(-1, 0)->action, SHMIPC__CA_BUG);
    assert_int_equal(shmipc__cs_lookup(0, NE)->action, SHMIPC__CA_BUG);
    assert_int_equal(shmipc__cs_lookup(NS, 0)->action, SHMIPC__CA_BUG);
    assert_string_equal(shmipc__cs_state_name(NS), "?");
    assert_string_equal(shmipc__cs_event_name(-1), "?");
    assert_string_equal(shmipc__cs_action_name(SHMIPC__CA_COUNT), "?");
}

/* ---- the walk through sockets ---- */

static atomic_uint hits[NS][NE];
static atomic_uint bad_next; /* a transition that left a state the table does not allow */

/* The states each action may leave the connection in (docs/http.md). */
static int allowed(int action, int next_table, int to)
{
    switch (action) {
    case SHMIPC__CA_SERVE: /* HANDLING, then wherever the answer leads */
        return to != SHMIPC__CS_HANDLING;
    case SHMIPC__CA_NEXT:
        return to != SHMIPC__CS_HANDLING && to != SHMIPC__CS_UPGRADED;
    case SHMIPC__CA_LINGER:
        return to == SHMIPC__CS_LINGERING || to == SHMIPC__CS_CLOSED;
    case SHMIPC__CA_STOP_IDLE:
        return to == SHMIPC__CS_READING || to == SHMIPC__CS_LINGERING || to == SHMIPC__CS_CLOSED;
    case SHMIPC__CA_HOLD: /* waits on, or sends the answer that came meanwhile */
    case SHMIPC__CA_ANSWER:
        return to == SHMIPC__CS_DEFERRED || to == SHMIPC__CS_WRITING || to == SHMIPC__CS_CLOSING ||
               to == SHMIPC__CS_LINGERING || to == SHMIPC__CS_CLOSED ||
               (action == SHMIPC__CA_ANSWER && to == SHMIPC__CS_UPGRADED);
    case SHMIPC__CA_DEFER_TIMER: /* waits on, the 504 (closing), or no send progress */
        return to == SHMIPC__CS_DEFERRED || to == SHMIPC__CS_CLOSING ||
               to == SHMIPC__CS_LINGERING || to == SHMIPC__CS_CLOSED;
    case SHMIPC__CA_BUFFER:
    case SHMIPC__CA_DRAIN:
    case SHMIPC__CA_SEND_TIMER:
    case SHMIPC__CA_WS:
        /* Or closed: a buffer over the limit, the drain limit, no progress, the WebSocket
         * ending (CLOSING/LINGERING after its close handshake). */
        return to == next_table || to == SHMIPC__CS_CLOSED ||
               (action == SHMIPC__CA_WS &&
                (to == SHMIPC__CS_CLOSING || to == SHMIPC__CS_LINGERING));
    default:
        return to == next_table;
    }
}

static void trace(int from, int ev, int action, int to)
{
    if (from < 0 || from >= NS || ev < 0 || ev >= NE)
        return;
    atomic_fetch_add(&hits[from][ev], 1);
    if (!allowed(action, shmipc__cs_lookup(from, ev)->next, to))
        atomic_fetch_add(&bad_next, 1);
}

#define HUGE_LEN (8u << 20)
static unsigned char *huge;

static int h_small(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    (void)ud;
    return shmipc_http_response_body(res, "small", 5);
}

static int h_huge(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    (void)ud;
    return shmipc_http_response_body_borrow(res, huge, HUGE_LEN, NULL, NULL);
}

/*
 * Deferred requests (DEFERRED): /defer waits until the test writes the eventfd, /defer504 has
 * a 300 ms deadline. The completer runs on the worker's loop (a watch on the eventfd), as the
 * shmipc-serve front completes from its sessions; it completes every ticket it holds, the
 * cancelled ones too, which must be refused (stale).
 */
static int defer_efd = -1;
static struct shmipc__watch *defer_watch; /* freed with the loop */
static struct shmipc__server_ticket tickets[64];
static unsigned nticket;
static atomic_uint cancels[4];  /* by reason */
static atomic_uint completed;   /* complete() returned 0 */
static atomic_uint stale;       /* complete() returned SHMIPC_ECLOSED */
static atomic_uint defer_wrong; /* anything else: a failure */
static atomic_uint released;    /* release callbacks run */
static atomic_uint to_release;  /* complete() calls given one */
static atomic_uint deferred_n;  /* requests deferred */

static void count_release(void *ud)
{
    (void)ud;
    atomic_fetch_add(&released, 1);
}

static void on_cancel(void *data, int reason)
{
    (void)data;
    if (reason < 1 || reason > 3)
        atomic_fetch_add(&defer_wrong, 1);
    else
        atomic_fetch_add(&cancels[reason], 1);
}

/*
 * An answer's head is the owner's input (an application worker's headers): what the handler
 * API refuses (a control byte, a name that is no token, the headers the server writes) is
 * refused here too, and the deferral stays live for a good answer.
 */
static atomic_int complete_hostile;

static void complete_refuses_hostile(struct shmipc__server_ticket t)
{
    static const struct shmipc__http_header_out bad[] = {
        /* The framing headers first: the old code sent them beside its own. */
        {"Content-Length", "0", 14, 1},       {"Transfer-Encoding", "chunked", 17, 7},
        {"Connection", "keep-alive", 10, 10}, {"X-Bad", "a\r\nX-Injected: 1", 5, 17},
        {"X-Bad\r\nX-Injected", "2", 18, 1},  {"", "x", 0, 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (shmipc__server_complete(t, 200, NULL, &bad[i], 1, "bad", 3, NULL, NULL) !=
            SHMIPC_EINVAL)
            atomic_fetch_add(&defer_wrong, 1);
    if (shmipc__server_complete(t, 200, "text/plain\r\nX-Injected: 3", NULL, 0, "bad", 3, NULL,
                                NULL) != SHMIPC_EINVAL)
        atomic_fetch_add(&defer_wrong, 1);
}

static void defer_ready(struct shmipc__watch *watch, int fd, unsigned events, void *data)
{
    uint64_t v;
    (void)watch;
    (void)events;
    (void)data;
    if (read(fd, &v, sizeof v) != (ssize_t)sizeof v)
        return;
    for (unsigned i = 0; i < nticket; i++) {
        if (atomic_load(&complete_hostile))
            complete_refuses_hostile(tickets[i]);
        /* Every other answer comes with a release callback (the body referenced until sent),
         * the others are copied. */
        static unsigned turn;
        shmipc_destroy_cb rel = turn++ % 2 ? count_release : NULL;
        if (rel != NULL)
            atomic_fetch_add(&to_release, 1);
        int rc =
            shmipc__server_complete(tickets[i], 200, "text/plain", NULL, 0, "done", 4, rel, NULL);
        atomic_fetch_add(rc == 0 ? &completed : rc == SHMIPC_ECLOSED ? &stale : &defer_wrong, 1);
    }
    nticket = 0;
}

static int h_defer(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    if (defer_watch == NULL && shmipc__watch_new(res->w->loop, defer_efd, SHMIPC__WATCH_READ,
                                                 defer_ready, NULL, &defer_watch) < 0)
        return -1;
    if (nticket == sizeof tickets / sizeof tickets[0]) {
        atomic_fetch_add(&defer_wrong, 1);
        return -1;
    }
    int rc = shmipc__server_defer(res, (uint32_t)(uintptr_t)ud, on_cancel, NULL, &tickets[nticket]);
    if (rc == 0) {
        nticket++;
        atomic_fetch_add(&deferred_n, 1);
    }
    return rc;
}

/* Defers, then fails: answered 500, and the deferral is cancelled (ERROR). */
static int h_defer_fail(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    struct shmipc__server_ticket t;
    (void)req;
    (void)ud;
    if (shmipc__server_defer(res, 0, on_cancel, NULL, &t) < 0 ||
        shmipc__server_complete(t, 200, NULL, NULL, 0, NULL, 0, NULL, NULL) != SHMIPC_EINVAL)
        atomic_fetch_add(&defer_wrong, 1); /* completing inside the handler is refused */
    return -1;
}

/* A pipelined request behind a deferred one: a header of its own. */
static int h_who_a(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    (void)ud;
    if (shmipc_http_response_add_header(res, "X-Who", "A-pipelined") < 0)
        return -1;
    return shmipc_http_response_body(res, "a", 1);
}

/* Long polling: another client's request completes the deferred ones from its handler, after
 * setting its own header; its answer must keep that header (the worker's header scratch is
 * shared by every handler it runs). */
static int h_publish(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    (void)ud;
    if (shmipc_http_response_add_header(res, "X-Who", "B-publisher") < 0)
        return -1;
    for (unsigned i = 0; i < nticket; i++) {
        int rc =
            shmipc__server_complete(tickets[i], 200, "text/plain", NULL, 0, "done", 4, NULL, NULL);
        atomic_fetch_add(rc == 0 ? &completed : rc == SHMIPC_ECLOSED ? &stale : &defer_wrong, 1);
    }
    nticket = 0;
    return shmipc_http_response_body(res, "pub", 3);
}

/* A WebSocket route whose on_open completes the deferred requests, as h_publish does; it
 * notes whether it ran inside another on_open (re-entered). */
static atomic_int open_depth, open_nested;

static int ws_publish_open(shmipc_ws *ws, const shmipc_http_request *req, void *ud)
{
    (void)ws;
    (void)req;
    (void)ud;
    if (atomic_fetch_add(&open_depth, 1) != 0)
        atomic_fetch_add(&open_nested, 1);
    for (unsigned i = 0; i < nticket; i++) {
        int rc =
            shmipc__server_complete(tickets[i], 200, "text/plain", NULL, 0, "done", 4, NULL, NULL);
        atomic_fetch_add(rc == 0 ? &completed : rc == SHMIPC_ECLOSED ? &stale : &defer_wrong, 1);
    }
    nticket = 0;
    atomic_fetch_sub(&open_depth, 1);
    return 0;
}

static void complete_all(void)
{
    uint64_t one = 1;
    assert_int_equal(write(defer_efd, &one, sizeof one), (ssize_t)sizeof one);
}

/* Waits (up to 5 s) for *counter to reach at least `want`. */
static void wait_count(atomic_uint *counter, unsigned want)
{
    for (int i = 0; i < 500 && atomic_load(counter) < want; i++) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    assert_true(atomic_load(counter) >= want);
}

static void ws_msg(shmipc_ws *ws, int kind, const void *data, size_t len, void *ud)
{
    (void)ud;
    CHECK(shmipc_ws_send(ws, kind, data, len));
}

struct tsrv {
    shmipc_server *s;
    pthread_t thread;
    int port, rc;
};

static void *run(void *arg)
{
    struct tsrv *t = arg;
    t->rc = shmipc_server_run(t->s);
    return NULL;
}

static void tsrv_start(struct tsrv *t, int backend, uint32_t short_ms)
{
    shmipc_server_config *cfg;
    memset(t, 0, sizeof *t);
    CHECK(shmipc_server_config_new(&cfg));
    CHECK(shmipc_server_config_set_port(cfg, 0));
    CHECK(shmipc_server_config_set_workers(cfg, 1));
    CHECK(shmipc_server_config_set_backend(cfg, backend));
    if (short_ms != 0) {
        CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_HEADER, short_ms));
        CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_KEEPALIVE, short_ms));
        CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_PING, short_ms));
    }
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_STOP, 1000));
    CHECK(shmipc_server_new(cfg, &t->s));
    shmipc_server_config_free(cfg);
    CHECK(shmipc_server_route(t->s, "GET", "/small", h_small, NULL, NULL));
    CHECK(shmipc_server_route(t->s, "GET", "/huge", h_huge, NULL, NULL));
    CHECK(shmipc_server_route(t->s, "GET", "/defer", h_defer, NULL, NULL));
    CHECK(shmipc_server_route(t->s, "GET", "/deferfail", h_defer_fail, NULL, NULL));
    CHECK(shmipc_server_route(t->s, "GET", "/who", h_who_a, NULL, NULL));
    CHECK(shmipc_server_route(t->s, "GET", "/publish", h_publish, NULL, NULL));
    CHECK(shmipc_server_route(t->s, "GET", "/defer504", h_defer, (void *)(uintptr_t)300, NULL));
    defer_watch = NULL;
    nticket = 0;
    CHECK(shmipc_server_websocket(t->s, "/ws", NULL, NULL, ws_msg, NULL, NULL, NULL));
    CHECK(shmipc_server_websocket(t->s, "/wspub", NULL, ws_publish_open, ws_msg, NULL, NULL, NULL));
    CHECK(shmipc_server_start(t->s));
    t->port = shmipc_server_port(t->s);
    assert_int_equal(pthread_create(&t->thread, NULL, run, t), 0);
}

static void tsrv_stop(struct tsrv *t)
{
    assert_int_equal(shmipc_server_stop(t->s), 0);
    assert_int_equal(pthread_join(t->thread, NULL), 0);
    assert_int_equal(t->rc, 0);
    shmipc_server_close(t->s);
}

static void msleep(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int dial(int port, int rcvbuf)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct timeval tv = {.tv_sec = 10};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    if (rcvbuf > 0)
        assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf), 0);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sin, sizeof sin) != 0)
        fail_msg("connect: %s", strerror(errno));
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
    return fd;
}

static void put(int fd, const char *s)
{
    assert_int_equal(send(fd, s, strlen(s), MSG_NOSIGNAL), (ssize_t)strlen(s));
}

/* Reads until `want` bytes came, or EOF/error when want is 0; returns the count. */
static size_t drain(int fd, size_t want)
{
    static char buf[1 << 16];
    size_t n = 0;
    for (;;) {
        size_t ask = want != 0 && want - n < sizeof buf ? want - n : sizeof buf;
        ssize_t k = read(fd, buf, ask);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return n;
        n += (size_t)k;
        if (want != 0 && n >= want)
            return n;
    }
}

static void rst(int fd)
{
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg), 0);
    close(fd);
}

#define SMALL_KA  "GET /small HTTP/1.1\r\nHost: x\r\n\r\n"
#define DEFER_KA  "GET /defer HTTP/1.1\r\nHost: x\r\n\r\n"
#define DEFER_504 "GET /defer504 HTTP/1.1\r\nHost: x\r\n\r\n"

/* Reads until `n` occurrences of `needle` came (or EOF with `n` 0); the text read, in buf. */
static size_t read_until(int fd, const char *needle, int n, char *buf, size_t cap)
{
    size_t len = 0;
    for (;;) {
        int seen = 0;
        buf[len] = '\0';
        for (const char *p = buf; n > 0 && (p = strstr(p, needle)) != NULL; p++)
            seen++;
        if (n > 0 && seen >= n)
            return len;
        ssize_t k = read(fd, buf + len, cap - 1 - len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return len;
        len += (size_t)k;
    }
}
#define SMALL_CLOSE "GET /small HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
#define HUGE_KA     "GET /huge HTTP/1.1\r\nHost: x\r\n\r\n"
#define HUGE_CLOSE  "GET /huge HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
#define WS_UPGRADE                                                                                 \
    "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"                 \
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"

static int ws_open(int port)
{
    int fd = dial(port, 0);
    char buf[512];
    ssize_t k;
    put(fd, WS_UPGRADE);
    k = read(fd, buf, sizeof buf - 1);
    assert_true(k > 12);
    assert_memory_equal(buf, "HTTP/1.1 101", 12);
    return fd;
}

/* Scenarios that drive each reachable cell with timeouts of 300 ms. */
/*
 * DEFERRED's cells, each checked for what the client sees and what the deferral's owner is
 * told: the answer after the pipelined answer before it and before the one behind it
 * (SENT/hold, DATA/buffer, COMPLETE/answer); the client's FIN and reset cancel it (and the
 * owner's later complete is refused); the request's deadline answers 504 and cancels it.
 */
static void walk_deferred(struct tsrv *t)
{
    char buf[4096];
    unsigned c0, s0;
    int fd, other;

    /* DEFERRED SENT (the small answer before it left), DATA (a request behind it), then
     * COMPLETE: answered in order, and another connection is served meanwhile. */
    c0 = atomic_load(&completed);
    fd = dial(t->port, 0);
    put(fd, SMALL_KA DEFER_KA);
    msleep(50);
    put(fd, SMALL_KA);
    other = dial(t->port, 0);
    put(other, SMALL_KA);
    assert_true(read_until(other, "small", 1, buf, sizeof buf) > 0);
    close(other);
    msleep(50);
    complete_all();
    read_until(fd, "small", 2, buf, sizeof buf);
    char *a = strstr(buf, "small"), *d = strstr(buf, "done"), *b = a ? strstr(a + 5, "small") : 0;
    if (a == NULL || d == NULL || b == NULL || !(a < d && d < b))
        fail_msg("deferred answer out of order: %s", buf);
    wait_count(&completed, c0 + 1);
    close(fd);

    /* DEFERRED PEER_FIN: the client leaves; cancelled, and the completion is refused. */
    c0 = atomic_load(&cancels[SHMIPC__SERVER_CANCEL_CLIENT_GONE]);
    s0 = atomic_load(&stale);
    fd = dial(t->port, 0);
    put(fd, DEFER_KA);
    msleep(50);
    assert_int_equal(shutdown(fd, SHUT_WR), 0);
    assert_int_equal(drain(fd, 0), 0); /* closed without an answer */
    close(fd);
    wait_count(&cancels[SHMIPC__SERVER_CANCEL_CLIENT_GONE], c0 + 1);
    complete_all();
    wait_count(&stale, s0 + 1);

    /* DEFERRED ERROR: a reset. */
    fd = dial(t->port, 0);
    put(fd, DEFER_KA);
    msleep(50);
    rst(fd);
    wait_count(&cancels[SHMIPC__SERVER_CANCEL_CLIENT_GONE], c0 + 2);
    complete_all();
    wait_count(&stale, s0 + 2);

    /* DEFERRED TIMEOUT: the request's deadline: 504, the owner told TIMEOUT. */
    c0 = atomic_load(&cancels[SHMIPC__SERVER_CANCEL_TIMEOUT]);
    fd = dial(t->port, 0);
    put(fd, DEFER_504);
    read_until(fd, "", 0, buf, sizeof buf);
    if (strncmp(buf, "HTTP/1.1 504 ", 13) != 0)
        fail_msg("no 504 at the request's deadline: %s", buf);
    close(fd);
    wait_count(&cancels[SHMIPC__SERVER_CANCEL_TIMEOUT], c0 + 1);
    complete_all();

    /* The handler fails after deferring: 500, and the owner is told ERROR. */
    c0 = atomic_load(&cancels[SHMIPC__SERVER_CANCEL_ERROR]);
    fd = dial(t->port, 0);
    put(fd, "GET /deferfail HTTP/1.1\r\nHost: x\r\n\r\n");
    read_until(fd, "", 0, buf, sizeof buf);
    if (strncmp(buf, "HTTP/1.1 500 ", 13) != 0)
        fail_msg("no 500 for a handler failing after it deferred: %s", buf);
    close(fd);
    assert_int_equal(atomic_load(&cancels[SHMIPC__SERVER_CANCEL_ERROR]), c0 + 1);
    assert_int_equal(atomic_load(&defer_wrong), 0);
    /* Every release callback ran once: after the send, or at once for a refused answer. */
    wait_count(&released, atomic_load(&to_release));
    assert_int_equal(atomic_load(&released), atomic_load(&to_release));
}

static void walk_timed(int backend)
{
    struct tsrv t;
    int fd;
    const char frame[] = "\x81\x82\0\0\0\0hi"; /* a masked "hi" (mask 0) */
    tsrv_start(&t, backend, 300);
    walk_deferred(&t);

    /* READING DATA -> WRITING SENT -> READING; READING PEER_FIN. */
    fd = dial(t.port, 0);
    put(fd, SMALL_KA);
    assert_true(drain(fd, 1) > 0);
    msleep(50);
    assert_int_equal(shutdown(fd, SHUT_WR), 0);
    drain(fd, 0);
    close(fd);
    /* READING ERROR: part of a head, then a reset. */
    fd = dial(t.port, 0);
    put(fd, "GET /sm");
    msleep(50);
    rst(fd);
    /* READING TIMEOUT: the header timeout. */
    fd = dial(t.port, 0);
    assert_int_equal(drain(fd, 0), 0);
    close(fd);
    /* WRITING DATA, WRITING TIMEOUT (no progress: closed; CLOSED ERROR/SENT releases). */
    fd = dial(t.port, 16384);
    put(fd, HUGE_KA);
    msleep(50);
    put(fd, SMALL_KA);
    msleep(1200);
    drain(fd, 0);
    close(fd);
    /* WRITING PEER_FIN: the whole response, the buffered request's, then EOF. */
    fd = dial(t.port, 0);
    put(fd, HUGE_KA SMALL_KA);
    assert_int_equal(shutdown(fd, SHUT_WR), 0);
    assert_true(drain(fd, 0) > HUGE_LEN);
    close(fd);
    /* WRITING ERROR. */
    fd = dial(t.port, 16384);
    put(fd, HUGE_KA);
    assert_true(drain(fd, 4096) > 0);
    rst(fd);
    /* CLOSING DATA, CLOSING PEER_FIN (reading stops in CLOSING: rare), then the drain and
     * the FIN in LINGERING. */
    fd = dial(t.port, 0);
    put(fd, HUGE_CLOSE);
    msleep(20);
    put(fd, SMALL_KA);
    assert_int_equal(shutdown(fd, SHUT_WR), 0);
    assert_true(drain(fd, 0) > HUGE_LEN);
    close(fd);
    /* CLOSING TIMEOUT. */
    fd = dial(t.port, 16384);
    put(fd, HUGE_CLOSE);
    msleep(1200);
    drain(fd, 0);
    close(fd);
    /* CLOSING ERROR. */
    fd = dial(t.port, 16384);
    put(fd, HUGE_CLOSE);
    assert_true(drain(fd, 4096) > 0);
    rst(fd);
    /* CLOSING SENT -> LINGERING; LINGERING DATA, LINGERING PEER_FIN. */
    fd = dial(t.port, 0);
    put(fd, SMALL_CLOSE);
    assert_true(drain(fd, 0) > 0);
    msleep(20); /* the EOF came: the server has seen its send complete */
    put(fd, SMALL_KA);
    msleep(20);
    assert_int_equal(shutdown(fd, SHUT_WR), 0);
    msleep(20);
    close(fd);
    /* LINGERING ERROR. */
    fd = dial(t.port, 0);
    put(fd, SMALL_CLOSE);
    assert_true(drain(fd, 0) > 0);
    msleep(20);
    rst(fd);
    /* LINGERING TIMEOUT: the 2 s linger with no FIN. */
    fd = dial(t.port, 0);
    put(fd, SMALL_CLOSE);
    assert_true(drain(fd, 0) > 0);
    msleep(2500);
    close(fd);
    /* UPGRADED SENT (the 101's batch), DATA (echoed), TIMEOUT (a ping), PEER_FIN. */
    fd = ws_open(t.port);
    assert_int_equal(send(fd, frame, sizeof frame - 1, MSG_NOSIGNAL), (ssize_t)sizeof frame - 1);
    msleep(700);
    assert_int_equal(shutdown(fd, SHUT_WR), 0);
    drain(fd, 0);
    close(fd);
    /* UPGRADED ERROR. */
    fd = ws_open(t.port);
    rst(fd);
    msleep(100);
    tsrv_stop(&t);
}

/* SHUTDOWN in every state a connection can be in when the server stops. */
static void walk_stop(int backend)
{
    struct tsrv t;
    int idle, writing, closing, lingering, ws, deferred;
    unsigned c0 = atomic_load(&cancels[SHMIPC__SERVER_CANCEL_CLIENT_GONE]);
    tsrv_start(&t, backend, 0);
    idle = dial(t.port, 0);
    put(idle, SMALL_KA);
    assert_true(drain(idle, 1) > 0);
    writing = dial(t.port, 16384);
    put(writing, HUGE_KA);
    closing = dial(t.port, 16384);
    put(closing, HUGE_CLOSE);
    lingering = dial(t.port, 0);
    put(lingering, SMALL_CLOSE);
    assert_true(drain(lingering, 0) > 0);
    ws = ws_open(t.port);
    /* DEFERRED SHUTDOWN: the stop waits for the answer; none comes, so the stop timeout's
     * close cancels it. */
    deferred = dial(t.port, 0);
    put(deferred, DEFER_KA);
    msleep(200);
    tsrv_stop(&t);
    assert_int_equal(drain(deferred, 0), 0);
    close(deferred);
    assert_true(atomic_load(&cancels[SHMIPC__SERVER_CANCEL_CLIENT_GONE]) >= c0 + 1);
    close(idle);
    close(writing);
    close(closing);
    close(lingering);
    close(ws);
}

/* CLOSING stops reading: its DATA and PEER_FIN come only from what the reactor had received
 * already (an io_uring completion in flight), so they may not be walked. */
static int cell_unreachable(int s, int e)
{
    const struct shmipc__cs_transition *t = shmipc__cs_lookup(s, e);
    return t->action == SHMIPC__CA_BUG || (s == SHMIPC__CS_CLOSED && e != SHMIPC__CE_ERROR) ||
           (s == SHMIPC__CS_CLOSING && (e == SHMIPC__CE_DATA || e == SHMIPC__CE_PEER_FIN));
}

static int every_reachable_cell_hit(void)
{
    for (int s = 0; s < NS; s++)
        for (int e = 0; e < NE; e++)
            if (!cell_unreachable(s, e) && atomic_load(&hits[s][e]) == 0)
                return 0;
    return 1;
}

static void walk(int backend)
{
    /* Cells no socket can reach: HANDLING's (handlers run inside an event), the bug cells,
     * a CLOSED connection's input, FIN, timer and stop (closed: the reactor and the timer
     * are done with it, the worker's list no longer holds it), and a send that succeeds
     * after the close (a race the kernel decides). Which event a socket's bytes and FIN
     * become depends on how the kernel batches them (a FIN can come with the data), so the
     * timed walk is repeated, at most three more times, until every reachable cell was hit. */
    memset(hits, 0, sizeof hits);
    atomic_store(&bad_next, 0);
    shmipc__server_cs_trace = trace;
    walk_timed(backend);
    walk_stop(backend);
    for (int again = 0; again < 3 && !every_reachable_cell_hit(); again++)
        walk_timed(backend);
    shmipc__server_cs_trace = NULL;
    for (int s = 0; s < NS; s++)
        for (int e = 0; e < NE; e++) {
            const struct shmipc__cs_transition *t = shmipc__cs_lookup(s, e);
            unsigned n = atomic_load(&hits[s][e]);
            printf("  %-9s x %-8s %-10s %u\n", shmipc__cs_state_name(s), shmipc__cs_event_name(e),
                   shmipc__cs_action_name(t->action), n);
            if (t->action == SHMIPC__CA_BUG && n != 0)
                fail_msg("%s x %s cannot happen, yet happened %u times", shmipc__cs_state_name(s),
                         shmipc__cs_event_name(e), n);
            if (!cell_unreachable(s, e) && n == 0)
                fail_msg("%s x %s was never walked", shmipc__cs_state_name(s),
                         shmipc__cs_event_name(e));
        }
    assert_int_equal(atomic_load(&bad_next), 0);
}

static void *complete_later(void *arg)
{
    (void)arg;
    msleep(300);
    complete_all();
    return NULL;
}

/* A stop while a request is deferred waits for its answer (within the stop timeout); the
 * answer is sent whole, with Connection: close, and nothing is cancelled. */
static void deferred_answer_during_stop(int backend)
{
    struct tsrv t;
    pthread_t th;
    char buf[4096];
    tsrv_start(&t, backend, 0);
    unsigned c0 = atomic_load(&completed), g0 = atomic_load(&cancels[1]);
    int fd = dial(t.port, 0);
    put(fd, DEFER_KA);
    msleep(100);
    assert_int_equal(pthread_create(&th, NULL, complete_later, NULL), 0);
    tsrv_stop(&t); /* returns once the answered connection is gone */
    assert_int_equal(pthread_join(th, NULL), 0);
    read_until(fd, "", 0, buf, sizeof buf);
    close(fd);
    if (strncmp(buf, "HTTP/1.1 200 ", 13) != 0 || strstr(buf, "Connection: close\r\n") == NULL ||
        strstr(buf, "\r\n\r\ndone") == NULL)
        fail_msg("the answer during a stop: %s", buf);
    assert_int_equal(atomic_load(&completed), c0 + 1);
    assert_int_equal(atomic_load(&cancels[1]), g0);
    assert_int_equal(atomic_load(&defer_wrong), 0);
}

BOTH_BACKENDS(deferred_answer_during_stop)

/* Regression: a handler completing another connection's deferred request ran that
 * connection's pipelined handlers inside it, over the worker's shared response-header scratch:
 * the publisher's answer carried the other client's header (cross-client bytes). */
static void complete_in_other_handler_keeps_its_headers(int backend)
{
    struct tsrv t;
    char buf[4096];
    tsrv_start(&t, backend, 0);
    unsigned c0 = atomic_load(&completed), d0 = atomic_load(&deferred_n);
    int a = dial(t.port, 0);
    put(a, DEFER_KA "GET /who HTTP/1.1\r\nHost: x\r\n\r\n");
    wait_count(&deferred_n, d0 + 1); /* the pipelined request held behind it */
    int b = dial(t.port, 0);
    put(b, "GET /publish HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    read_until(b, "", 0, buf, sizeof buf);
    close(b);
    if (strstr(buf, "X-Who: B-publisher\r\n") == NULL || strstr(buf, "A-pipelined") != NULL ||
        strstr(buf, "\r\n\r\npub") == NULL)
        fail_msg("the publisher's answer: %s", buf);
    read_until(a, "\r\n\r\na", 1, buf, sizeof buf); /* "done", then the pipelined answer */
    if (strstr(buf, "\r\n\r\ndone") == NULL || strstr(buf, "X-Who: A-pipelined\r\n") == NULL ||
        strstr(buf, "B-publisher") != NULL)
        fail_msg("the deferred client's answers: %s", buf);
    close(a);
    assert_int_equal(atomic_load(&completed), c0 + 1);
    assert_int_equal(atomic_load(&defer_wrong), 0);
    tsrv_stop(&t);
}

/*
 * Regression: a WebSocket route's on_open was not marked as a handler (w->in_handler), so a
 * complete() from it served the other connection's answer and its pipelined requests inside
 * it: another upgrade behind the deferred request ran its handshake (and its on_open) there,
 * over the worker's handshake scratch that this upgrade's 101 is built from after on_open
 * returns, and this client got the other's Sec-WebSocket-Accept. As from a handler, the
 * answer now goes on the timer once on_open returned.
 */
static void complete_in_ws_open_keeps_its_handshake(int backend)
{
    struct tsrv t;
    char buf[4096];
    tsrv_start(&t, backend, 0);
    atomic_store(&open_nested, 0);
    unsigned c0 = atomic_load(&completed), d0 = atomic_load(&deferred_n);
    int a = dial(t.port, 0);
    put(a, DEFER_KA "GET /wspub HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                    "Connection: Upgrade\r\nSec-WebSocket-Key: AQIDBAUGBwgJCgsMDQ4PEA==\r\n"
                    "Sec-WebSocket-Version: 13\r\n\r\n");
    wait_count(&deferred_n, d0 + 1); /* the pipelined upgrade held behind it */
    int b = dial(t.port, 0);
    put(b, "GET /wspub HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n");
    read_until(b, "\r\n\r\n", 1, buf, sizeof buf);
    if (strstr(buf, "HTTP/1.1 101 ") == NULL ||
        strstr(buf, "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n") == NULL)
        fail_msg("the publisher's 101: %s", buf);
    read_until(a, "\r\n\r\n", 2, buf, sizeof buf); /* "done", then the 101 */
    if (strstr(buf, "\r\n\r\ndone") == NULL ||
        strstr(buf, "Sec-WebSocket-Accept: C/0nmHhBztSRGR1CwL6Tf4ZjwpY=\r\n") == NULL)
        fail_msg("the deferred client's answers: %s", buf);
    close(a);
    close(b);
    assert_int_equal(atomic_load(&completed), c0 + 1);
    assert_int_equal(atomic_load(&defer_wrong), 0);
    assert_int_equal(atomic_load(&open_nested), 0);
    tsrv_stop(&t);
}

BOTH_BACKENDS(complete_in_ws_open_keeps_its_handshake)

BOTH_BACKENDS(complete_in_other_handler_keeps_its_headers)

/* Regression: complete() wrote the owner's header names, values and content type as given,
 * so CR LF in one started a header (or a response) of the owner's making, and a Content-Length
 * of its own stood beside the server's. */
static void complete_refuses_header_injection(int backend)
{
    struct tsrv t;
    char buf[4096];
    tsrv_start(&t, backend, 0);
    unsigned c0 = atomic_load(&completed), d0 = atomic_load(&deferred_n);
    int fd = dial(t.port, 0);
    put(fd, DEFER_KA);
    wait_count(&deferred_n, d0 + 1);
    atomic_store(&complete_hostile, 1);
    complete_all();
    read_until(fd, "\r\n\r\n", 1, buf, sizeof buf);
    atomic_store(&complete_hostile, 0);
    close(fd);
    if (strstr(buf, "X-Injected") != NULL || strstr(buf, "X-Bad") != NULL ||
        strstr(buf, "Content-Length: 0") != NULL || strstr(buf, "Content-Length: 4\r\n") == NULL)
        fail_msg("an answer with a hostile head: %s", buf);
    wait_count(&completed, c0 + 1); /* counted after complete() returned */
    assert_int_equal(atomic_load(&completed), c0 + 1);
    assert_int_equal(atomic_load(&defer_wrong), 0);
    tsrv_stop(&t);
}

BOTH_BACKENDS(complete_refuses_header_injection)

BOTH_BACKENDS_OF(every_cell_walked, walk)

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(table_matches_the_documented_lifecycle),
        cmocka_unit_test(every_cell_walked_epoll),
        cmocka_unit_test(every_cell_walked_io_uring),
        cmocka_unit_test(deferred_answer_during_stop_epoll),
        cmocka_unit_test(deferred_answer_during_stop_io_uring),
        cmocka_unit_test(complete_in_other_handler_keeps_its_headers_epoll),
        cmocka_unit_test(complete_in_other_handler_keeps_its_headers_io_uring),
        cmocka_unit_test(complete_in_ws_open_keeps_its_handshake_epoll),
        cmocka_unit_test(complete_in_ws_open_keeps_its_handshake_io_uring),
        cmocka_unit_test(complete_refuses_header_injection_epoll),
        cmocka_unit_test(complete_refuses_header_injection_io_uring),
    };
    int rc;
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    unsetenv("SHMIPC_REACTOR_BACKEND");
    huge = malloc(HUGE_LEN);
    assert_non_null(huge);
    defer_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    assert_true(defer_efd >= 0);
    memset(huge, 'x', HUGE_LEN);
    rc = cmocka_run_group_tests_name("conn_state", tests, NULL, NULL);
    free(huge);
    close(defer_efd);
    return rc != 0;
}
