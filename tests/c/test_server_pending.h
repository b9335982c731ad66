/*
 * Answers from any thread (shmipc_http_response_defer, shmipc_http_pending_*), for every
 * backend: included after test_server_suite.h by test_server_epoll.c and test_server_uring.c,
 * which run PENDING_TESTS. Handlers on "/defer/<mode>/<n>" defer and hand the pending answer
 * to answer threads (or keep it, or misuse it); the client checks what arrives, and the
 * on_end callback's reasons are counted per request: exactly one each, whatever races.
 */
#ifndef TEST_SERVER_PENDING_H
#define TEST_SERVER_PENDING_H

#define PSLOTS 8192

/* One per deferred request: what its on_end heard. */
struct pslot {
    atomic_int ends;
    atomic_int reason;
};
static struct pslot pslots[PSLOTS];
static atomic_int pslot_next;
static atomic_int preasons[5];
static atomic_int pwrong;
static atomic_int pborrowed, preleased;
static atomic_int p_end_sleep_ms; /* a slow on_end (the worker still holds its reference) */

#define PWRONG(what)                                                                               \
    do {                                                                                           \
        fprintf(stderr, "wrong: %s (%s)\n", what, shmipc_error_detail());                          \
        atomic_fetch_add(&pwrong, 1);                                                              \
    } while (0)

static void p_reset(void)
{
    memset(pslots, 0, sizeof pslots);
    atomic_store(&pslot_next, 0);
    for (int i = 0; i < 5; i++)
        atomic_store(&preasons[i], 0);
    atomic_store(&pwrong, 0);
    atomic_store(&pborrowed, 0);
    atomic_store(&preleased, 0);
}

static void p_end(void *ud, int reason)
{
    struct pslot *s = ud;
    if (reason < 0 || reason > 4) {
        PWRONG("on_end reason");
        return;
    }
    atomic_store(&s->reason, reason);
    if (atomic_fetch_add(&s->ends, 1) != 0)
        PWRONG("on_end twice");
    atomic_fetch_add(&preasons[reason], 1);
    int ms = atomic_load(&p_end_sleep_ms);
    if (ms > 0)
        usleep((useconds_t)ms * 1000);
}

static void p_release(void *ud)
{
    free(ud);
    atomic_fetch_add(&preleased, 1);
}

/* ---- the answer threads: a queue of pending answers ---- */

struct pjob {
    struct pjob *next;
    shmipc_http_pending *p;
    char mode[16];
    unsigned long n;
};

static pthread_mutex_t pq_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pq_cv = PTHREAD_COND_INITIALIZER;
static struct pjob *pq_head, **pq_tail = &pq_head;
static int pq_len, pq_quit;

static void pq_push(struct pjob *j)
{
    pthread_mutex_lock(&pq_mu);
    j->next = NULL;
    *pq_tail = j;
    pq_tail = &j->next;
    pq_len++;
    pthread_cond_broadcast(&pq_cv);
    pthread_mutex_unlock(&pq_mu);
}

/* Takes a job; NULL once quitting with nothing queued. */
static struct pjob *pq_pop(void)
{
    struct pjob *j;
    pthread_mutex_lock(&pq_mu);
    while (pq_head == NULL && !pq_quit)
        pthread_cond_wait(&pq_cv, &pq_mu);
    j = pq_head;
    if (j != NULL) {
        pq_head = j->next;
        if (pq_head == NULL)
            pq_tail = &pq_head;
        pq_len--;
    }
    pthread_mutex_unlock(&pq_mu);
    return j;
}

/* Waits until `n` jobs are queued (the test thread); 0 after 5 s. */
static int pq_wait(int n)
{
    uint64_t end = mono_ms() + 5000;
    for (;;) {
        pthread_mutex_lock(&pq_mu);
        int have = pq_len;
        pthread_mutex_unlock(&pq_mu);
        if (have >= n)
            return 1;
        if (mono_ms() > end)
            return 0;
        usleep(1000);
    }
}

/* The answer of "/defer/<mode>/<n>": 201, X-N: n, the body "answer <n>" (borrowed for odd n). */
static void p_answer(struct pjob *j)
{
    char v[32], body[64];
    snprintf(v, sizeof v, "%lu", j->n);
    int len = snprintf(body, sizeof body, "answer %lu", j->n);
    if (shmipc_http_pending_set_status(j->p, 201) < 0 ||
        shmipc_http_pending_add_header(j->p, "X-N", v) < 0 ||
        shmipc_http_pending_add_header(j->p, "Content-Type", "text/plain") < 0)
        PWRONG("building the answer");
    if (strcmp(j->mode, "close") == 0 &&
        shmipc_http_pending_add_header(j->p, "Connection", "close") < 0)
        PWRONG("Connection: close");
    if (j->n % 2) {
        char *copy = strdup(body);
        atomic_fetch_add(&pborrowed, 1);
        if (shmipc_http_pending_body_borrow(j->p, copy, (size_t)len, copy, p_release) < 0)
            PWRONG("body_borrow");
    } else if (shmipc_http_pending_body(j->p, body, (size_t)len) < 0) {
        PWRONG("body");
    }
    int rc = shmipc_http_pending_send(j->p);
    if (rc < 0 && rc != SHMIPC_ECLOSED)
        PWRONG("send");
}

static void *p_worker(void *arg)
{
    struct pjob *j;
    unsigned seed = (unsigned)(uintptr_t)arg;
    while ((j = pq_pop()) != NULL) {
        if (strcmp(j->mode, "free") == 0) {
            shmipc_http_pending_free(j->p);
        } else {
            if (strcmp(j->mode, "jitter") == 0)
                usleep(rand_r(&seed) % 500);
            p_answer(j);
        }
        free(j);
    }
    return NULL;
}

static pthread_t p_threads[3];

static void p_threads_start(void)
{
    pq_quit = 0;
    for (uintptr_t i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&p_threads[i], NULL, p_worker, (void *)(i + 1)), 0);
}

static void p_threads_stop(void)
{
    pthread_mutex_lock(&pq_mu);
    pq_quit = 1;
    pthread_cond_broadcast(&pq_cv);
    pthread_mutex_unlock(&pq_mu);
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_join(p_threads[i], NULL), 0);
}

/* ---- the handler ---- */

/* "give": on_end itself gives the handle up (the owner never took it): a send there is
 * refused and its borrowed body released; a free there is quiet. */
struct pgive {
    struct pslot *slot;
    shmipc_http_pending *p;
    int send;
};

static void p_end_give(void *ud, int reason)
{
    struct pgive *g = ud;
    p_end(g->slot, reason);
    if (g->send) {
        char *copy = strdup("late");
        atomic_fetch_add(&pborrowed, 1);
        if (shmipc_http_pending_body_borrow(g->p, copy, 4, copy, p_release) < 0 ||
            shmipc_http_pending_send(g->p) != SHMIPC_ECLOSED)
            PWRONG("a send from on_end");
    } else {
        shmipc_http_pending_free(g->p);
    }
    free(g);
}

/*
 * Modes: thread, jitter, close, free (to the answer threads); hold (queued, nobody takes it:
 * the test does), fail (defers, then returns an error), inline (sends from the handler
 * itself), short (a 150 ms deadline, held), misuse (the calls' refusals, then answered);
 * give, givefree (on_end sends or frees the handle), inlinefail, inlinefree (the handler
 * sends or frees, then fails), limits (4096 header bytes, sent from the handler).
 */
static int h_defer(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    size_t wl;
    const char *w = shmipc_http_request_wildcard(req, &wl);
    struct pjob *j = calloc(1, sizeof *j);
    shmipc_http_pending *p = NULL;
    int slot = atomic_fetch_add(&pslot_next, 1);
    (void)ud;
    assert_non_null(j);
    if (slot >= PSLOTS || sscanf(w, "%15[a-z]/%lu", j->mode, &j->n) != 2) {
        free(j);
        return SHMIPC_EINVAL;
    }
    int timeout = strcmp(j->mode, "short") == 0 ? 150 : -1;
    if (strcmp(j->mode, "give") == 0 || strcmp(j->mode, "givefree") == 0) {
        struct pgive *g = calloc(1, sizeof *g);
        assert_non_null(g);
        g->slot = &pslots[slot];
        g->send = strcmp(j->mode, "give") == 0;
        int ms = j->n % 2 ? 150 : -1; /* odd n: a 150 ms deadline; even n: none */
        free(j);
        if (shmipc_http_response_defer(res, ms, p_end_give, g, &g->p) < 0) {
            PWRONG("defer");
            free(g);
            return SHMIPC_EIO;
        }
        return 0;
    }
    if (strcmp(j->mode, "misuse") == 0) {
        if (shmipc_http_response_defer(res, 0, p_end, &pslots[slot], &p) != SHMIPC_EINVAL ||
            p != NULL)
            PWRONG("defer with a timeout of 0");
        if (shmipc_http_response_defer(res, 3600001, p_end, &pslots[slot], &p) != SHMIPC_EINVAL)
            PWRONG("defer with a timeout over the max");
        if (shmipc_http_response_defer(res, 100, p_end, &pslots[slot], NULL) != SHMIPC_EINVAL)
            PWRONG("defer with out NULL");
    }
    if (shmipc_http_response_defer(res, timeout, p_end, &pslots[slot], &p) < 0) {
        PWRONG("defer");
        free(j);
        return SHMIPC_EIO;
    }
    j->p = p;
    if (strcmp(j->mode, "misuse") == 0) {
        shmipc_http_pending *again = NULL;
        if (shmipc_http_response_defer(res, -1, NULL, NULL, &again) != SHMIPC_EBUSY ||
            again != NULL)
            PWRONG("a second defer");
        if (shmipc_http_response_set_status(res, 404) != SHMIPC_EBUSY ||
            shmipc_http_response_body(res, "x", 1) != SHMIPC_EBUSY)
            PWRONG("the response after defer");
        if (shmipc_http_pending_set_status(p, 199) != SHMIPC_EINVAL ||
            shmipc_http_pending_set_status(p, 1000) != SHMIPC_EINVAL ||
            shmipc_http_pending_add_header(p, "Bad Name", "x") != SHMIPC_EINVAL ||
            shmipc_http_pending_add_header(p, "X", "a\r\nInjected: 1") != SHMIPC_EINVAL ||
            shmipc_http_pending_add_header(p, "Content-Length", "1") != SHMIPC_EINVAL ||
            shmipc_http_pending_add_header(p, "Transfer-Encoding", "chunked") != SHMIPC_EINVAL ||
            shmipc_http_pending_add_header(p, "Connection", "keep-alive") != SHMIPC_EINVAL ||
            shmipc_http_pending_add_header(p, NULL, "x") != SHMIPC_EINVAL ||
            shmipc_http_pending_add_header(p, "X", NULL) != SHMIPC_EINVAL ||
            shmipc_http_pending_body(p, NULL, 1) != SHMIPC_EINVAL)
            PWRONG("a refused field");
        if (shmipc_http_pending_add_header(p, "Content-Type", "a/b") < 0 ||
            shmipc_http_pending_add_header(p, "content-type", "c/d") != SHMIPC_EINVAL)
            PWRONG("a second Content-Type");
        char name[16];
        int i, rc = 0;
        for (i = 0; i < 40 && rc == 0; i++) {
            snprintf(name, sizeof name, "X-%d", i);
            rc = shmipc_http_pending_add_header(p, name, "v");
        }
        if (rc != SHMIPC_ENOSPC || i != 33)
            PWRONG("the 33rd header");
        /* Only the refusals: the answer below has none of these fields. */
        shmipc_http_pending_free(p);
        free(j);
        return 0;
    }
    if (strcmp(j->mode, "fail") == 0) {
        /* The handle stays the owner's: the test sends it later (refused). */
        pq_push(j);
        return SHMIPC_EIO;
    }
    if (strcmp(j->mode, "borrownull") == 0) {
        /* Lent without a release: copied at once, so the owner may reuse its memory as
         * soon as the call returned (the worker sends after this handler returns). */
        static char lent[16];
        memcpy(lent, "borrowed", 8);
        if (shmipc_http_pending_body_borrow(p, lent, 8, NULL, NULL) < 0 ||
            shmipc_http_pending_send(p) < 0)
            PWRONG("borrow without a release");
        memset(lent, 'X', 8);
        free(j);
        return 0;
    }
    if (strcmp(j->mode, "inline") == 0) {
        p_answer(j);
        free(j);
        return 0;
    }
    if (strcmp(j->mode, "inlinefail") == 0) {
        p_answer(j); /* sent, then the handler fails: its 500 wins, the answer is dropped */
        free(j);
        return SHMIPC_EIO;
    }
    if (strcmp(j->mode, "inlinefree") == 0) {
        shmipc_http_pending_free(j->p);
        free(j);
        return SHMIPC_EIO;
    }
    if (strcmp(j->mode, "limits") == 0) {
        /* 4096 header bytes exactly (name, value, one byte each for the NUL), then no more;
         * 30 more one-byte headers would not fit either. */
        static char big[4096];
        memset(big, 'v', sizeof big);
        /* Content-Type, text/plain and its NUL: 23 bytes; X-Big and the value's NUL: 6. */
        big[4096 - 23 - 6] = '\0';
        if (shmipc_http_pending_add_header(p, "Content-Type", "text/plain") < 0 ||
            shmipc_http_pending_add_header(p, "X-Big", big) < 0)
            PWRONG("4096 header bytes");
        if (shmipc_http_pending_add_header(p, "Y", "") != SHMIPC_ENOSPC)
            PWRONG("4097 header bytes");
        if (shmipc_http_pending_add_header(p, "Connection", "close") < 0)
            PWRONG("Connection: close beside 4096 bytes");
        if (shmipc_http_pending_send(p) < 0)
            PWRONG("send");
        free(j);
        return 0;
    }
    pq_push(j);
    return 0;
}

static void p_routes(shmipc_server *s)
{
    CHECK(shmipc_server_route(s, NULL, "/defer/*", h_defer, NULL, NULL));
}

static void p_check_answer(const struct resp *p, unsigned long n)
{
    char want[64];
    snprintf(want, sizeof want, "answer %lu", n);
    assert_int_equal(p->status, 201);
    assert_string_equal(p->body, want);
    snprintf(want, sizeof want, "%lu", n);
    assert_header(p, "X-N", want);
    assert_header(p, "Content-Type", "text/plain");
}

/* Every deferred request's on_end ran exactly once (waits up to 5 s for the last ones). */
static void p_all_ended(int n)
{
    uint64_t end = mono_ms() + 5000;
    int total;
    do {
        total = 0;
        for (int i = 0; i < 5; i++)
            total += atomic_load(&preasons[i]);
        if (total >= n)
            break;
        usleep(1000);
    } while (mono_ms() < end);
    assert_int_equal(total, n);
    assert_int_equal(atomic_load(&pslot_next), n);
    for (int i = 0; i < n; i++)
        assert_int_equal(atomic_load(&pslots[i].ends), 1);
    assert_int_equal(atomic_load(&pwrong), 0);
}

/* ---- tests ---- */

/* Answers from other threads, from the handler itself, to HEAD, with Connection: close, and
 * freed unsent (500); three pipelined requests, each deferred, answered in order. */
static void pending_answers(void **state)
{
    struct srv t;
    struct srv_opts o = {.routes = p_routes};
    struct rd r;
    struct resp p;
    (void)state;
    p_reset();
    p_threads_start();
    srv_start(&t, &o);
    rd_open(&r, t.port);
    exchange(&r, "GET /defer/thread/2 HTTP/1.1\r\nHost: x\r\n\r\n", &p);
    p_check_answer(&p, 2);
    free(p.body);
    exchange(&r, "GET /defer/thread/3 HTTP/1.1\r\nHost: x\r\n\r\n", &p);
    p_check_answer(&p, 3);
    free(p.body);
    exchange(&r, "GET /defer/inline/4 HTTP/1.1\r\nHost: x\r\n\r\n", &p);
    p_check_answer(&p, 4);
    free(p.body);
    exchange(&r, "GET /defer/borrownull/9 HTTP/1.1\r\nHost: x\r\n\r\n", &p);
    assert_int_equal(p.status, 200);
    assert_string_equal(p.body, "borrowed");
    free(p.body);
    send_str(r.fd, "HEAD /defer/thread/6 HTTP/1.1\r\nHost: x\r\n\r\n");
    read_response(&r, &p, 1);
    assert_int_equal(p.status, 201);
    assert_header(&p, "Content-Length", "8");
    /* Given up unsent: the server's own 500, which closes, as a failed handler's does. */
    exchange(&r, "GET /defer/free/5 HTTP/1.1\r\nHost: x\r\n\r\n", &p);
    assert_int_equal(p.status, 500);
    assert_string_equal(p.body, "500 Internal Server Error\n");
    assert_header(&p, "Connection", "close");
    free(p.body);
    expect_eof(&r);
    rd_close(&r);
    rd_open(&r, t.port);
    exchange(&r, "GET /defer/misuse/7 HTTP/1.1\r\nHost: x\r\n\r\n", &p);
    assert_int_equal(p.status, 500); /* freed after the refusals */
    free(p.body);
    expect_eof(&r);
    rd_close(&r);
    rd_open(&r, t.port);
    exchange(&r, "GET /defer/close/8 HTTP/1.1\r\nHost: x\r\n\r\n", &p);
    p_check_answer(&p, 8);
    assert_header(&p, "Connection", "close");
    free(p.body);
    expect_eof(&r);
    rd_close(&r);
    p_all_ended(8);
    assert_int_equal(atomic_load(&preasons[SHMIPC_HTTP_PENDING_SENT]), 6);
    assert_int_equal(atomic_load(&preasons[SHMIPC_HTTP_PENDING_ABANDONED]), 2);
    p_threads_stop();

    /* Pipelined: each request behind a deferred one waits for its answer, then is handled. */
    rd_open(&r, t.port);
    send_str(r.fd, "GET /defer/hold/1 HTTP/1.1\r\nHost: x\r\n\r\n"
                   "GET /defer/hold/2 HTTP/1.1\r\nHost: x\r\n\r\n"
                   "GET /defer/hold/3 HTTP/1.1\r\nHost: x\r\n\r\n");
    for (int i = 0; i < 3; i++) {
        assert_true(pq_wait(1));
        struct pjob *j = pq_pop();
        assert_non_null(j);
        assert_int_equal(j->n, (unsigned long)(i + 1));
        p_answer(j);
        free(j);
        read_response(&r, &p, 0);
        p_check_answer(&p, (unsigned long)(i + 1));
        free(p.body);
    }
    rd_close(&r);
    p_all_ended(11);
    srv_stop(&t);
    assert_int_equal(atomic_load(&preleased), atomic_load(&pborrowed));
}

/* The request stops waiting first: the client leaves, its deadline passes (504), the handler
 * fails after deferring (500). Each on_end hears why, once; a send afterwards is refused
 * (ECLOSED) and its borrowed body released; waiting() says 0. */
static void pending_stops_waiting(void **state)
{
    struct srv t;
    struct srv_opts o = {.routes = p_routes};
    struct rd r;
    struct resp p;
    struct pjob *j;
    (void)state;
    p_reset();
    srv_start(&t, &o);

    rd_open(&r, t.port);
    send_str(r.fd, "GET /defer/hold/1 HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_true(pq_wait(1));
    j = pq_pop();
    assert_int_equal(shmipc_http_pending_waiting(j->p), 1);
    rd_close(&r);
    uint64_t end = mono_ms() + 5000;
    while (shmipc_http_pending_waiting(j->p) && mono_ms() < end)
        usleep(1000);
    assert_int_equal(shmipc_http_pending_waiting(j->p), 0);
    assert_int_equal(atomic_load(&pslots[0].reason), SHMIPC_HTTP_PENDING_CLIENT_GONE);
    char *copy = strdup("late");
    atomic_fetch_add(&pborrowed, 1);
    CHECK(shmipc_http_pending_body_borrow(j->p, copy, 4, copy, p_release));
    assert_int_equal(shmipc_http_pending_send(j->p), SHMIPC_ECLOSED);
    assert_int_equal(atomic_load(&preleased), 1);
    free(j);

    rd_open(&r, t.port);
    uint64_t t0 = mono_ms();
    exchange(&r, "GET /defer/short/2 HTTP/1.1\r\nHost: x\r\n\r\n", &p);
    assert_int_equal(p.status, 504);
    assert_true(mono_ms() - t0 >= 140);
    j = pq_pop();
    assert_int_equal(atomic_load(&pslots[1].reason), SHMIPC_HTTP_PENDING_TIMEOUT);
    assert_int_equal(shmipc_http_pending_send(j->p), SHMIPC_ECLOSED);
    free(j);
    assert_header(&p, "Connection", "close"); /* the server's error answers close */
    free(p.body);
    expect_eof(&r);
    rd_close(&r);

    rd_open(&r, t.port);
    exchange(&r, "GET /defer/fail/3 HTTP/1.1\r\nHost: x\r\n\r\n", &p);
    assert_int_equal(p.status, 500);
    assert_header(&p, "Connection", "close");
    free(p.body);
    j = pq_pop();
    assert_int_equal(atomic_load(&pslots[2].reason), SHMIPC_HTTP_PENDING_FAILED);
    shmipc_http_pending_free(j->p); /* refused quietly */
    free(j);
    /* A failed handler's 500 closes the connection, as without a deferral. */
    expect_eof(&r);
    rd_close(&r);
    p_all_ended(3);

    /* NULL everywhere. */
    assert_int_equal(shmipc_http_pending_send(NULL), SHMIPC_EINVAL);
    assert_int_equal(shmipc_http_pending_set_status(NULL, 200), SHMIPC_EINVAL);
    assert_int_equal(shmipc_http_pending_add_header(NULL, "a", "b"), SHMIPC_EINVAL);
    assert_int_equal(shmipc_http_pending_body(NULL, "a", 1), SHMIPC_EINVAL);
    copy = strdup("x");
    atomic_fetch_add(&pborrowed, 1);
    assert_int_equal(shmipc_http_pending_body_borrow(NULL, copy, 1, copy, p_release),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc_http_pending_waiting(NULL), 0);
    shmipc_http_pending_free(NULL);
    shmipc_http_pending *out = (shmipc_http_pending *)&out;
    assert_int_equal(shmipc_http_response_defer(NULL, 100, NULL, NULL, &out), SHMIPC_EINVAL);
    assert_null(out);
    srv_stop(&t);
    assert_int_equal(atomic_load(&preleased), atomic_load(&pborrowed));
}

/* The server stops with answers pending: one sent during the graceful stop reaches its
 * client; one never sent ends when the stop timeout closes its connection, and sending it
 * after the server was freed is refused (no use of freed memory: ASan). */
static void pending_across_stop(void **state)
{
    struct srv t;
    struct srv_opts o = {.routes = p_routes, .stop_ms = 300};
    struct rd r1, r2;
    struct resp p;
    (void)state;
    p_reset();
    srv_start(&t, &o);
    rd_open(&r1, t.port);
    rd_open(&r2, t.port);
    send_str(r1.fd, "GET /defer/hold/1 HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_true(pq_wait(1));
    send_str(r2.fd, "GET /defer/hold/2 HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_true(pq_wait(2));
    struct pjob *j1 = pq_pop(), *j2 = pq_pop();
    assert_int_equal(shmipc_server_stop(t.s), 0);
    usleep(50 * 1000); /* the stop has begun: the server drains */
    p_answer(j1);
    free(j1);
    read_response(&r1, &p, 0);
    p_check_answer(&p, 1);
    assert_header(&p, "Connection", "close");
    free(p.body);
    expect_eof(&r1);
    assert_int_equal(pthread_join(t.thread, NULL), 0);
    assert_int_equal(t.run_rc, 0);
    /* r2's connection was closed at the stop timeout, unanswered. */
    assert_int_equal(rd_fill(&r2), 0);
    assert_int_equal(atomic_load(&pslots[1].reason), SHMIPC_HTTP_PENDING_CLIENT_GONE);
    shmipc_server_close(t.s);
    char *copy = strdup("late");
    atomic_fetch_add(&pborrowed, 1);
    CHECK(shmipc_http_pending_body_borrow(j2->p, copy, 4, copy, p_release));
    assert_int_equal(shmipc_http_pending_send(j2->p), SHMIPC_ECLOSED);
    free(j2);
    rd_close(&r1);
    rd_close(&r2);
    p_all_ended(2);
    assert_int_equal(atomic_load(&preleased), atomic_load(&pborrowed));
}

/* Many clients on two workers, answers from three threads after random delays, and clients
 * that leave while their answer is on its way: every answered response is its own request's
 * (no cross-talk), every on_end ran once, every borrowed body was released once. */
struct pclient {
    int port, id, rounds;
};

static void *p_client(void *arg)
{
    struct pclient *c = arg;
    struct rd r;
    char req[128];
    rd_open(&r, c->port);
    for (int i = 0; i < c->rounds; i++) {
        unsigned long n = (unsigned long)c->id * 1000 + (unsigned long)i;
        snprintf(req, sizeof req, "GET /defer/jitter/%lu HTTP/1.1\r\nHost: x\r\n\r\n", n);
        send_str(r.fd, req);
        if (i % 7 == 6) {
            /* Leave without waiting: the answer races the close. */
            rd_close(&r);
            rd_open(&r, c->port);
            continue;
        }
        struct resp p;
        read_response(&r, &p, 0);
        char want[64];
        snprintf(want, sizeof want, "answer %lu", n);
        if (p.status != 201 || strcmp(p.body, want) != 0)
            PWRONG("a response that is not its request's");
        free(p.body);
    }
    rd_close(&r);
    return NULL;
}

static void pending_crosstalk(void **state)
{
    enum { CLIENTS = 8, ROUNDS = 60 };
    struct srv t;
    struct srv_opts o = {.routes = p_routes, .workers = 2};
    pthread_t th[CLIENTS];
    struct pclient c[CLIENTS];
    (void)state;
    p_reset();
    p_threads_start();
    srv_start(&t, &o);
    for (int i = 0; i < CLIENTS; i++) {
        c[i] = (struct pclient){t.port, i + 1, ROUNDS};
        assert_int_equal(pthread_create(&th[i], NULL, p_client, &c[i]), 0);
    }
    for (int i = 0; i < CLIENTS; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    p_all_ended(CLIENTS * ROUNDS);
    assert_int_equal(atomic_load(&preasons[SHMIPC_HTTP_PENDING_TIMEOUT]), 0);
    p_threads_stop();
    srv_stop(&t);
    assert_int_equal(atomic_load(&preleased), atomic_load(&pborrowed));
}

/* A send refused because the request stopped waiting releases the borrowed body before it
 * returns, on the caller's thread, even while the worker is still in on_end. */
static void pending_refused_releases_now(void **state)
{
    struct srv t;
    struct srv_opts o = {.routes = p_routes};
    struct rd r;
    (void)state;
    p_reset();
    srv_start(&t, &o);
    rd_open(&r, t.port);
    send_str(r.fd, "GET /defer/hold/1 HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_true(pq_wait(1));
    struct pjob *j = pq_pop();
    atomic_store(&p_end_sleep_ms, 300);
    rd_close(&r);
    uint64_t end = mono_ms() + 5000;
    while (shmipc_http_pending_waiting(j->p) && mono_ms() < end)
        usleep(1000);
    assert_int_equal(shmipc_http_pending_waiting(j->p), 0);
    char *copy = strdup("late");
    atomic_fetch_add(&pborrowed, 1);
    CHECK(shmipc_http_pending_body_borrow(j->p, copy, 4, copy, p_release));
    assert_int_equal(shmipc_http_pending_send(j->p), SHMIPC_ECLOSED);
    assert_int_equal(atomic_load(&preleased), 1); /* "nothing is sent, the body is released" */
    free(j);
    p_all_ended(1);
    atomic_store(&p_end_sleep_ms, 0);
    srv_stop(&t);
    assert_int_equal(atomic_load(&preleased), atomic_load(&pborrowed));
}

/* Edges that hold (pinned): on_end gives the handle up itself (a send refused, its borrowed
 * body released; a free quiet), after the client left and after the deadline; an answer sent
 * from the handler that then fails (its 500 wins, the borrowed body is released once), or
 * freed there; the 4096 header bytes exactly, refused at 4097, Connection: close beside them. */
static void pending_edges(void **state)
{
    struct srv t;
    struct srv_opts o = {.routes = p_routes};
    struct rd r;
    struct resp p;
    (void)state;
    p_reset();
    srv_start(&t, &o);
    /* on_end gives the handle up: the client leaves (even n), the deadline passes (odd n). */
    for (int i = 0; i < 4; i++) {
        char req[128];
        snprintf(req, sizeof req, "GET /defer/%s/%d HTTP/1.1\r\nHost: x\r\n\r\n",
                 i < 2 ? "give" : "givefree", i);
        rd_open(&r, t.port);
        if (i % 2) {
            exchange(&r, req, &p);
            assert_int_equal(p.status, 504);
            free(p.body);
        } else {
            send_str(r.fd, req);
            usleep(50 * 1000);
        }
        rd_close(&r);
    }
    rd_open(&r, t.port);
    exchange(&r, "GET /defer/inlinefail/5 HTTP/1.1\r\nHost: x\r\n\r\n", &p);
    assert_int_equal(p.status, 500);
    free(p.body);
    rd_close(&r);
    rd_open(&r, t.port);
    exchange(&r, "GET /defer/inlinefree/6 HTTP/1.1\r\nHost: x\r\n\r\n", &p);
    assert_int_equal(p.status, 500);
    free(p.body);
    rd_close(&r);
    rd_open(&r, t.port);
    exchange(&r, "GET /defer/limits/7 HTTP/1.1\r\nHost: x\r\n\r\n", &p);
    assert_int_equal(p.status, 200);
    assert_header(&p, "Connection", "close");
    assert_header(&p, "Content-Type", "text/plain");
    assert_non_null(strstr(p.head, "X-Big: vvvv"));
    free(p.body);
    expect_eof(&r);
    rd_close(&r);
    p_all_ended(7);
    assert_int_equal(atomic_load(&preasons[SHMIPC_HTTP_PENDING_CLIENT_GONE]), 2);
    assert_int_equal(atomic_load(&preasons[SHMIPC_HTTP_PENDING_TIMEOUT]), 2);
    assert_int_equal(atomic_load(&preasons[SHMIPC_HTTP_PENDING_FAILED]), 2);
    srv_stop(&t);
    assert_int_equal(atomic_load(&preleased), atomic_load(&pborrowed));
}

/*
 * Regression: a client that pipelines more than 64 KiB behind a deferred request (the server
 * stops reading there) and then leaves, with a FIN or a reset. The server did not read, so it
 * never learnt of it: a request without a deadline waited (and held the connection and its
 * buffered input) until its owner answered or the server stopped, instead of ending
 * CLIENT_GONE as when the client leaves without the pipelined input.
 */
static void pending_client_gone_behind_pipelined_input(void **state)
{
    static const char get[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    enum { N = 4000 }; /* about 100 KiB of pipelined requests */
    struct srv t;
    struct srv_opts o = {.routes = p_routes};
    char *junk = malloc(N * (sizeof get - 1));
    (void)state;
    assert_non_null(junk);
    for (int i = 0; i < N; i++)
        memcpy(junk + (size_t)i * (sizeof get - 1), get, sizeof get - 1);
    p_reset();
    srv_start(&t, &o);
    for (int reset = 0; reset <= 1; reset++) {
        char req[64];
        struct rd r;
        snprintf(req, sizeof req, "GET /defer/hold/%d HTTP/1.1\r\nHost: x\r\n\r\n", reset);
        rd_open(&r, t.port);
        send_str(r.fd, req);
        assert_true(pq_wait(1));
        struct pjob *j = pq_pop();
        send_all(r.fd, junk, N * (sizeof get - 1));
        usleep(100 * 1000); /* the server reads up to its pause */
        if (reset) {
            struct linger l = {1, 0};
            assert_int_equal(setsockopt(r.fd, SOL_SOCKET, SO_LINGER, &l, sizeof l), 0);
        } else {
            assert_int_equal(shutdown(r.fd, SHUT_WR), 0);
        }
        rd_close(&r);
        uint64_t end = mono_ms() + 3000;
        while (shmipc_http_pending_waiting(j->p) && mono_ms() < end)
            usleep(1000);
        if (shmipc_http_pending_waiting(j->p))
            fail_msg("%s: the request still waits for its answer after 3 s",
                     reset ? "a reset" : "a FIN");
        assert_int_equal(atomic_load(&pslots[reset].reason), SHMIPC_HTTP_PENDING_CLIENT_GONE);
        assert_int_equal(shmipc_http_pending_send(j->p), SHMIPC_ECLOSED);
        free(j);
    }
    p_all_ended(2);
    srv_stop(&t);
    free(junk);
}

#define PENDING_TESTS                                                                              \
    cmocka_unit_test(pending_answers), cmocka_unit_test(pending_stops_waiting),                    \
        cmocka_unit_test(pending_across_stop), cmocka_unit_test(pending_crosstalk),                \
        cmocka_unit_test(pending_refused_releases_now), cmocka_unit_test(pending_edges),           \
        cmocka_unit_test(pending_client_gone_behind_pipelined_input)

#endif
