/*
 * Description: the listener: blocking accept, serving many clients with callbacks, and
 * clients that stall their handshake delaying nobody else.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ipc_helpers.h"
#include "unix_race.h"
#include "shmipc.h"

static char address[128];

/*
 * Handshakes get 10 s: under a sanitizer on two CPUs four clients at once can take longer
 * than the default second.
 */
static shmipc_config *patient_config(void)
{
    shmipc_config *cfg;
    if (shmipc_config_new(&cfg) != 0 ||
        shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_INITIALIZE, 10000) != 0)
        return NULL;
    return cfg;
}

/* What the serving callbacks saw. */
struct server_state {
    int streams;
    int messages;
    int ended;
    int destroyed;
    int stop_after; /* stop serving after this many ended streams (0: never) */
    shmipc_listener *l;
    shmipc_stream *kept; /* keep_stream only */
};

static void on_stream(shmipc_stream *st, void *ud)
{
    struct server_state *ss = ud;
    (void)st;
    __atomic_fetch_add(&ss->streams, 1, __ATOMIC_RELEASE); /* a test may wait on it */
}

/* Echoes each 8-byte message; closes the stream when it ends. */
static void on_data(shmipc_stream *st, void *ud)
{
    struct server_state *ss = ud;
    const void *p;
    for (;;) {
        int rc = shmipc_stream_read_exact_bytes(st, 8, &p, SHMIPC_NONBLOCK);
        if (rc == SHMIPC_EAGAIN)
            return;
        if (rc < 0) {
            int ended = __atomic_add_fetch(&ss->ended, 1, __ATOMIC_RELEASE);
            shmipc_stream_close(st);
            if (ss->stop_after && ended == ss->stop_after)
                shmipc_listener_stop(ss->l);
            return;
        }
        char msg[8];
        memcpy(msg, p, 8);
        shmipc_stream_release(st);
        assert_int_equal(shmipc_stream_write(st, msg, 8), 0);
        assert_int_equal(shmipc_stream_flush(st), 0);
        ss->messages++;
    }
}

static void on_destroy(void *ud)
{
    ((struct server_state *)ud)->destroyed++;
}

struct serve_run {
    shmipc_listener *l;
    struct server_state *ss;
    int rc;
};

static void *serve_main(void *arg)
{
    struct serve_run *r = arg;
    r->rc = shmipc_listener_serve(r->l, on_stream, on_data, r->ss, on_destroy);
    return NULL;
}

/* A client: `streams` streams, `rounds` messages each, interleaved. */
static void *client_main(void *arg)
{
    int streams = 3, rounds = 20;
    shmipc_session *s;
    shmipc_stream *st[3];
    const void *p;
    intptr_t bad = 0;
    (void)arg;
    shmipc_config *cfg = patient_config();
    int rc = shmipc_session_connect(address, cfg, &s);
    shmipc_config_free(cfg);
    if (rc != 0)
        return (void *)1;
    for (int i = 0; i < streams; i++)
        bad |= shmipc_session_open_stream(s, &st[i]) != 0;
    for (int r = 0; r < rounds && !bad; r++) {
        for (int i = 0; i < streams; i++) {
            char msg[9];
            snprintf(msg, sizeof msg, "%02d-%02d-%c", r, i, 'x');
            bad |= shmipc_stream_write(st[i], msg, 8) != 0 || shmipc_stream_flush(st[i]) != 0;
        }
        for (int i = 0; i < streams && !bad; i++) {
            char want[9];
            snprintf(want, sizeof want, "%02d-%02d-%c", r, i, 'x');
            bad |= shmipc_stream_read_exact_bytes(st[i], 8, &p, 0) != 0 || memcmp(p, want, 8) != 0;
            shmipc_stream_release(st[i]);
        }
    }
    for (int i = 0; i < streams; i++)
        shmipc_stream_close(st[i]);
    shmipc_session_close(s);
    return (void *)bad;
}

/* A client that sends 8-byte messages on one stream, 4 in flight, until told to stop (or 10 s). */
struct busy_client {
    pthread_t thread;
    int stop;
    unsigned round_trips;
    int bad;
};

static void *busy_client_main(void *arg)
{
    struct busy_client *b = arg;
    shmipc_session *s;
    shmipc_stream *st;
    const void *p;
    shmipc_config *cfg = patient_config();
    int rc = shmipc_session_connect(address, cfg, &s);
    shmipc_config_free(cfg);
    if (rc != 0 || shmipc_session_open_stream(s, &st) != 0) {
        b->bad = 1;
        return NULL;
    }
    /* Messages kept in flight, so that every spin of the server finds one already queued. */
    enum { IN_FLIGHT = 4 };
    unsigned sent = 0;
    uint64_t end = ipc_now_ms() + 10000;
    while (!b->bad && !__atomic_load_n(&b->stop, __ATOMIC_ACQUIRE) && ipc_now_ms() < end) {
        char msg[9];
        while (sent < b->round_trips + IN_FLIGHT) {
            snprintf(msg, sizeof msg, "b%07u", sent++ % 10000000u);
            if (shmipc_stream_write(st, msg, 8) != 0 || shmipc_stream_flush(st) != 0)
                b->bad = 1;
        }
        snprintf(msg, sizeof msg, "b%07u", b->round_trips % 10000000u);
        if (b->bad || shmipc_stream_read_exact_bytes(st, 8, &p, 0) != 0 || memcmp(p, msg, 8) != 0) {
            b->bad = 1;
            break;
        }
        shmipc_stream_release(st);
        __atomic_store_n(&b->round_trips, b->round_trips + 1, __ATOMIC_RELEASE);
    }
    /* Take the echoes still in flight: serve()'s on_data asserts that its flush succeeds. */
    while (!b->bad && b->round_trips < sent) {
        if (shmipc_stream_read_exact_bytes(st, 8, &p, 0) != 0)
            b->bad = 1;
        shmipc_stream_release(st);
        b->round_trips++;
    }
    shmipc_stream_close(st);
    shmipc_session_close(s);
    return NULL;
}

/*
 * serve() spins on the session that was busy last and, while such spins keep finding work,
 * polls its other descriptors only every few turns (listener.c, LOOK_EVERY). A client that
 * connects while another keeps a session busy must still be accepted and served, with the
 * busy one still running, not once it goes quiet.
 */
static void a_busy_session_does_not_starve_new_clients(void **state)
{
    (void)state;
    ipc_pick_address(address, sizeof address, "busy");
    shmipc_config *cfg = patient_config();
    shmipc_listener *l;
    assert_int_equal(shmipc_listener_new(address, cfg, &l), 0);
    shmipc_config_free(cfg);
    struct server_state ss = {0};
    struct serve_run run = {l, &ss, 0};
    pthread_t server;
    assert_int_equal(pthread_create(&server, NULL, serve_main, &run), 0);
    struct busy_client busy = {0};
    assert_int_equal(pthread_create(&busy.thread, NULL, busy_client_main, &busy), 0);
    uint64_t end = ipc_now_ms() + 5000;
    while (__atomic_load_n(&busy.round_trips, __ATOMIC_ACQUIRE) < 500 && !busy.bad &&
           ipc_now_ms() < end)
        usleep(1000);
    unsigned before = __atomic_load_n(&busy.round_trips, __ATOMIC_ACQUIRE);
    pthread_t other;
    void *bad;
    assert_int_equal(pthread_create(&other, NULL, client_main, NULL), 0);
    assert_int_equal(pthread_join(other, &bad), 0);
    /* The busy client kept going while the other was served (it was not starved either). */
    unsigned during = __atomic_load_n(&busy.round_trips, __ATOMIC_ACQUIRE) - before;
    int busy_alive = !__atomic_load_n(&busy.stop, __ATOMIC_ACQUIRE);
    __atomic_store_n(&busy.stop, 1, __ATOMIC_RELEASE);
    pthread_join(busy.thread, NULL);
    print_message("busy client: %u round trips before, %u while the other was served\n", before,
                  during);
    assert_null(bad);
    assert_false(busy.bad);
    assert_true(busy_alive);
    assert_true(during > 0);
    /* The clients closed their streams: serve() sees each end (on_data closes the stream)
     * before it stops. A stream whose end it had not read yet was never closed by anyone,
     * and the session it holds leaked (LeakSanitizer, now and then under load). */
    end = ipc_now_ms() + 5000;
    while (__atomic_load_n(&ss.ended, __ATOMIC_ACQUIRE) <
               __atomic_load_n(&ss.streams, __ATOMIC_ACQUIRE) &&
           ipc_now_ms() < end)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&ss.ended, __ATOMIC_ACQUIRE),
                     __atomic_load_n(&ss.streams, __ATOMIC_ACQUIRE));
    assert_int_equal(shmipc_listener_stop(l), 0);
    pthread_join(server, NULL);
    assert_int_equal(run.rc, 0);
    shmipc_listener_close(l);
}

static void serve_many_clients(void **state)
{
    (void)state;
    enum { CLIENTS = 4 };
    struct server_state ss = {.stop_after = CLIENTS * 3};
    struct serve_run r = {.ss = &ss};
    pthread_t server, clients[CLIENTS];
    ipc_pick_address(address, sizeof address, "listener");
    shmipc_config *cfg = patient_config();
    assert_int_equal(shmipc_listener_new(address, cfg, &r.l), 0);
    shmipc_config_free(cfg);
    ss.l = r.l;
    assert_int_equal(pthread_create(&server, NULL, serve_main, &r), 0);
    for (int i = 0; i < CLIENTS; i++)
        assert_int_equal(pthread_create(&clients[i], NULL, client_main, NULL), 0);
    for (int i = 0; i < CLIENTS; i++) {
        void *bad;
        pthread_join(clients[i], &bad);
        assert_null(bad);
    }
    /* The callback stops the server once every stream has ended. */
    pthread_join(server, NULL);
    assert_int_equal(r.rc, 0);
    assert_int_equal(ss.streams, CLIENTS * 3);
    assert_int_equal(ss.messages, CLIENTS * 3 * 20);
    assert_int_equal(ss.ended, CLIENTS * 3);
    assert_int_equal(ss.destroyed, 1);
    shmipc_listener_close(r.l);
}

static void stop_from_another_thread(void **state)
{
    (void)state;
    struct server_state ss = {0};
    struct serve_run r = {.ss = &ss};
    pthread_t server;
    ipc_pick_address(address, sizeof address, "listener-stop");
    assert_int_equal(shmipc_listener_new(address, NULL, &r.l), 0);
    assert_int_equal(pthread_create(&server, NULL, serve_main, &r), 0);
    usleep(20000);
    /* A second server on the same listener is refused, and its user_data still freed. */
    struct server_state other = {0};
    assert_int_equal(shmipc_listener_serve(r.l, on_stream, on_data, &other, on_destroy),
                     SHMIPC_EBUSY);
    assert_int_equal(other.destroyed, 1);
    assert_int_equal(shmipc_listener_stop(r.l), 0);
    pthread_join(server, NULL);
    assert_int_equal(r.rc, 0);
    assert_int_equal(ss.destroyed, 1);
    shmipc_listener_close(r.l);
}

/* A serve refused for a NULL argument frees its user_data too (bindings free their state in
 * destroy: Python's shmipc.abi leaked its closures and callables here). */
static void serve_refused_argument_still_destroys(void **state)
{
    (void)state;
    shmipc_listener *l;
    ipc_pick_address(address, sizeof address, "listener-einval");
    assert_int_equal(shmipc_listener_new(address, NULL, &l), 0);
    struct server_state ss = {0};
    assert_int_equal(shmipc_listener_serve(NULL, on_stream, on_data, &ss, on_destroy),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc_listener_serve(l, NULL, on_data, &ss, on_destroy), SHMIPC_EINVAL);
    assert_int_equal(shmipc_listener_serve(l, on_stream, NULL, &ss, on_destroy), SHMIPC_EINVAL);
    assert_int_equal(ss.destroyed, 3);
    assert_int_equal(shmipc_listener_serve(l, on_stream, NULL, NULL, NULL), SHMIPC_EINVAL);
    shmipc_listener_close(l);
}

/*
 * Streams still held when serve returns lose their session: on_data tells their holders
 * (their reads fail) before serve returns, so a holder that closes a stream at its end
 * closes them all. Before, serve closed its sessions without a word, and such a stream stayed
 * open, holding its session, until the user found it.
 */
static void serve_tells_held_streams_of_its_end(void **state)
{
    (void)state;
    shmipc_config *cfg = patient_config();
    for (int round = 0; round < 5; round++) {
        struct server_state ss = {0};
        struct serve_run r = {.ss = &ss};
        pthread_t server;
        shmipc_session *c;
        shmipc_stream *st[3];
        const void *p;
        ipc_pick_address(address, sizeof address, "listener-held");
        assert_int_equal(shmipc_listener_new(address, cfg, &r.l), 0);
        assert_int_equal(pthread_create(&server, NULL, serve_main, &r), 0);
        assert_int_equal(shmipc_session_connect(address, cfg, &c), 0);
        for (int i = 0; i < 3; i++) {
            assert_int_equal(shmipc_session_open_stream(c, &st[i]), 0);
            assert_int_equal(shmipc_stream_write(st[i], "abcdefgh", 8), 0);
            assert_int_equal(shmipc_stream_flush(st[i]), 0);
        }
        for (int i = 0; i < 3; i++) {
            assert_int_equal(shmipc_stream_read_exact_bytes(st[i], 8, &p, 0), 0);
            shmipc_stream_release(st[i]);
        }
        /* Served and echoed; the client keeps its streams open, so the server's stay too. */
        assert_int_equal(__atomic_load_n(&ss.streams, __ATOMIC_ACQUIRE), 3);
        assert_int_equal(__atomic_load_n(&ss.ended, __ATOMIC_ACQUIRE), 0);
        assert_int_equal(shmipc_listener_stop(r.l), 0);
        pthread_join(server, NULL);
        assert_int_equal(r.rc, 0);
        assert_int_equal(ss.ended, 3); /* on_data saw each end, and closed each stream */
        assert_int_equal(ss.destroyed, 1);
        for (int i = 0; i < 3; i++) {
            assert_int_equal(shmipc_stream_read_exact_bytes(st[i], 8, &p, 0), SHMIPC_ECONNRESET);
            shmipc_stream_close(st[i]);
        }
        shmipc_session_close(c);
        shmipc_listener_close(r.l);
    }
    shmipc_config_free(cfg);
}

/*
 * A stream handed to a worker thread, which closes it while serve's thread is in on_data for
 * it (on_stream's owner may close it "on any thread"). serve looked the stream up, let the
 * session's lock go and called on_data with a pointer the worker's close then freed: on_data's
 * read of it was a heap use after free (ASan). The stream now stays valid until on_data
 * returns, and calls on it fail with SHMIPC_ECLOSED.
 */
struct handoff {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    shmipc_listener *l;
    shmipc_stream *st; /* handed out by on_stream */
    int go;            /* on_data asks the worker to close st */
    int closed;        /* the worker closed it */
    int seen;          /* on_data saw the close: rc and id below */
    int rc;
    uint32_t id;
};

static void handoff_stream(shmipc_stream *st, void *ud)
{
    struct handoff *h = ud;
    pthread_mutex_lock(&h->mu);
    h->st = st;
    pthread_mutex_unlock(&h->mu);
}

static void handoff_data(shmipc_stream *st, void *ud)
{
    struct handoff *h = ud;
    struct timespec ts;
    const void *p;
    size_t n;
    pthread_mutex_lock(&h->mu);
    if (st != h->st || h->seen) {
        pthread_mutex_unlock(&h->mu);
        return;
    }
    h->go = 1;
    pthread_cond_broadcast(&h->cond);
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 5;
    while (!h->closed && pthread_cond_timedwait(&h->cond, &h->mu, &ts) == 0)
        ;
    pthread_mutex_unlock(&h->mu);
    /* The worker closed it meanwhile (or 5 s went by): the handle is still ours to look at. */
    h->rc = shmipc_stream_read_chunk(st, 0, &p, &n, SHMIPC_NONBLOCK);
    h->id = shmipc_stream_id(st);
    h->seen = 1;
    shmipc_listener_stop(h->l);
}

static void *handoff_worker(void *arg)
{
    struct handoff *h = arg;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    pthread_mutex_lock(&h->mu);
    while (!h->go && pthread_cond_timedwait(&h->cond, &h->mu, &ts) == 0)
        ;
    shmipc_stream *st = h->go ? h->st : NULL;
    pthread_mutex_unlock(&h->mu);
    shmipc_stream_close(st);
    pthread_mutex_lock(&h->mu);
    h->closed = st != NULL;
    pthread_cond_broadcast(&h->cond);
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

struct handoff_serve {
    struct handoff *h;
    int rc;
};

static void *handoff_serve_main(void *arg)
{
    struct handoff_serve *r = arg;
    r->rc = shmipc_listener_serve(r->h->l, handoff_stream, handoff_data, r->h, NULL);
    return NULL;
}

static void on_data_outlives_a_close_on_another_thread(void **state)
{
    (void)state;
    shmipc_config *cfg = patient_config();
    for (int round = 0; round < 3; round++) {
        struct handoff h = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
        struct handoff_serve r = {.h = &h};
        pthread_t server, worker;
        shmipc_session *c;
        shmipc_stream *cs;
        ipc_pick_address(address, sizeof address, "listener-handoff");
        assert_int_equal(shmipc_listener_new(address, cfg, &h.l), 0);
        assert_int_equal(pthread_create(&server, NULL, handoff_serve_main, &r), 0);
        assert_int_equal(pthread_create(&worker, NULL, handoff_worker, &h), 0);
        assert_int_equal(shmipc_session_connect(address, cfg, &c), 0);
        assert_int_equal(shmipc_session_open_stream(c, &cs), 0);
        ipc_send_text(cs, "hello");
        pthread_join(worker, NULL);
        pthread_join(server, NULL);
        assert_int_equal(r.rc, 0);
        assert_int_equal(h.closed, 1);
        assert_int_equal(h.seen, 1);
        assert_int_equal(h.rc, SHMIPC_ECLOSED);
        assert_int_equal(h.id, shmipc_stream_id(cs));
        shmipc_stream_close(cs);
        shmipc_session_close(c);
        shmipc_listener_close(h.l);
    }
    shmipc_config_free(cfg);
}

static void socket_file_mode_and_stale_replacement(void **state)
{
    (void)state;
    char path[64], addr[80];
    struct stat st;
    shmipc_listener *l, *again;
    snprintf(path, sizeof path, "/tmp/shmipc-test-%d.sock", (int)getpid());
    snprintf(addr, sizeof addr, "unix:%s", path);
    assert_int_equal(shmipc_listener_new(addr, NULL, &l), 0);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    /* A live listener keeps its address. */
    assert_int_equal(shmipc_listener_new(addr, NULL, &again), SHMIPC_EADDRINUSE);
    /* A socket file left by a dead process is replaced; a regular file never is. */
    int fd = dup(shmipc_listener_fileno(l));
    shmipc_listener_close(l);
    close(fd);
    assert_int_not_equal(stat(path, &st), 0);
    FILE *f = fopen(path, "w");
    fclose(f);
    assert_int_equal(shmipc_listener_new(addr, NULL, &again), SHMIPC_EADDRINUSE);
    unlink(path);
    assert_int_equal(shmipc_listener_new(addr, NULL, &again), 0);
    shmipc_listener_close(again);
    assert_int_equal(shmipc_listener_new("unix:", NULL, &again), SHMIPC_ENAMETOOLONG);
    assert_int_equal(shmipc_listener_new("nonsense", NULL, &again), SHMIPC_EINVAL);
    assert_int_equal(shmipc_listener_new("tcp:127.0.0.1:99999", NULL, &again), SHMIPC_EINVAL);
}

static int listener_open(const char *addr, void **out)
{
    return shmipc_listener_new(addr, NULL, (shmipc_listener **)out);
}

static void listener_close(void *l)
{
    shmipc_listener_close(l);
}

static const struct unix_race_ops listener_ops = {listener_open, listener_close};

/* The socket file appears only once the socket listens: a client that sees the path (a test, a
 * supervisor waiting for it) and connects at once is never refused. The file used to be renamed
 * into place before listen(), and a connect in between got ECONNREFUSED (the README's C example
 * failed so in CI). */
static void socket_file_appears_only_when_listening(void **state)
{
    (void)state;
    char path[64];
    snprintf(path, sizeof path, "/tmp/shmipc-test-appear-%d.sock", (int)getpid());
    unix_race_appear(path, &listener_ops, 300);
}

/* Two listeners started at once on one path (two copies of a service, a restart racing the old
 * one): exactly one gets it, the other gets SHMIPC_EADDRINUSE. The loser's "is the file stale?"
 * probe used to run before the winner listened, found it refusing, and replaced it: both
 * succeeded and the first one was left listening on a name nobody can reach. */
static void two_listeners_racing_for_a_path_one_wins(void **state)
{
    (void)state;
    char path[64];
    snprintf(path, sizeof path, "/tmp/shmipc-test-race-%d.sock", (int)getpid());
    unix_race_two(path, &listener_ops, 200);
}

/* The close removes the listener's own socket file only: a file someone put at the path since
 * (here a regular file after an operator's `rm`) stays. It used to be unlinked whatever it was. */
static void replaced_file_not_removed_at_close(void **state)
{
    (void)state;
    char path[64], addr[80];
    struct stat st;
    shmipc_listener *l;
    snprintf(path, sizeof path, "/tmp/shmipc-test-replaced-%d.sock", (int)getpid());
    snprintf(addr, sizeof addr, "unix:%s", path);
    unlink(path);
    assert_int_equal(shmipc_listener_new(addr, NULL, &l), 0);
    assert_int_equal(unlink(path), 0);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("not yours", f);
    fclose(f);
    shmipc_listener_close(l);
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    unlink(path);
}

/* A live socket whose backlog is full still counts as live, and finding that out never blocks:
 * the liveness probe used a blocking connect(), which on a unix socket with a full backlog waits
 * until the listener accepts (forever here). Run in a child so the old code fails by timeout
 * instead of hanging the suite. */
static void busy_live_socket_refused_without_waiting(void **state)
{
    (void)state;
    char path[64], addr[80];
    snprintf(path, sizeof path, "/tmp/shmipc-test-busy-%d.sock", (int)getpid());
    snprintf(addr, sizeof addr, "unix:%s", path);
    unlink(path);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(lfd >= 0);
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    snprintf(un.sun_path, sizeof un.sun_path, "%s", path);
    assert_int_equal(bind(lfd, (struct sockaddr *)&un, sizeof un), 0);
    assert_int_equal(listen(lfd, 0), 0);
    /* Fill the backlog: nonblocking connects until the kernel says EAGAIN. */
    int cfds[64], n = 0;
    while (n < 64) {
        int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        assert_true(c >= 0);
        if (connect(c, (struct sockaddr *)&un, sizeof un) < 0) {
            assert_int_equal(errno, EAGAIN);
            close(c);
            break;
        }
        cfds[n++] = c;
    }
    assert_true(n < 64);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(5);
        shmipc_listener *l = NULL;
        int rc = shmipc_listener_new(addr, NULL, &l);
        _exit(rc == SHMIPC_EADDRINUSE ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status))
        print_message(
            "shmipc_listener_new blocked on a live socket with a full backlog (signal %d)\n",
            WTERMSIG(status));
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* The live socket is left in place. */
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    for (int i = 0; i < n; i++)
        close(cfds[i]);
    close(lfd);
    unlink(path);
}

static void accept_timeout(void **state)
{
    (void)state;
    shmipc_listener *l;
    shmipc_session *s;
    ipc_pick_address(address, sizeof address, "listener-t");
    assert_int_equal(shmipc_listener_new(address, NULL, &l), 0);
    assert_int_equal(shmipc_listener_accept(l, 0, &s), SHMIPC_EAGAIN);
    assert_int_equal(shmipc_listener_accept(l, 1, &s), SHMIPC_ETIMEDOUT);
    assert_int_equal(shmipc_listener_accept(l, 30, &s), SHMIPC_ETIMEDOUT);
    shmipc_listener_close(l);
}

struct forever_accept {
    shmipc_listener *l;
    int timeout_ms;
    int rc;
    shmipc_session *s;
};

static void *forever_accept_main(void *arg)
{
    struct forever_accept *a = arg;
    a->rc = shmipc_listener_accept(a->l, a->timeout_ms, &a->s);
    return NULL;
}

/*
 * Every negative timeout waits forever, not only SHMIPC_WAIT_FOREVER (the old code refused
 * -2 and INT_MIN with SHMIPC_EINVAL): the accept is still waiting after a while, and takes the
 * client that connects then.
 */
static void accept_any_negative_timeout_waits_forever(void **state)
{
    static const int timeouts[] = {-1, -2, -1000, INT_MIN};
    /* 10 s handshakes: with the default second a loaded TSan run failed the handshake, and
     * the accept that waits forever then hung the case until meson's timeout. */
    shmipc_config *cfg = patient_config();
    (void)state;
    assert_non_null(cfg);
    for (size_t i = 0; i < sizeof timeouts / sizeof timeouts[0]; i++) {
        struct forever_accept a = {.timeout_ms = timeouts[i], .rc = 1};
        struct ipc_connector c;
        pthread_t t;
        ipc_pick_address(address, sizeof address, "listener-forever");
        assert_int_equal(shmipc_listener_new(address, cfg, &a.l), 0);
        assert_int_equal(pthread_create(&t, NULL, forever_accept_main, &a), 0);
        usleep(100 * 1000);
        assert_int_equal(__atomic_load_n(&a.rc, __ATOMIC_SEQ_CST), 1); /* still waiting */
        ipc_connector_start(&c, address, cfg);
        pthread_join(t, NULL);
        assert_int_equal(a.rc, 0);
        assert_int_equal(ipc_connector_join(&c), 0);
        shmipc_session_close(c.s);
        shmipc_session_close(a.s);
        shmipc_listener_close(a.l);
    }
    shmipc_config_free(cfg);
}

/* ------------------------------------------------------------------------------------ */
/* Clients that stall their handshake                                                   */
/* ------------------------------------------------------------------------------------ */

enum { STALLERS = 20 };

/* A raw client of the abstract socket in `address` ("unix:@name") that sends nothing. */
static int connect_staller(void)
{
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    const char *name = address + strlen("unix:@");
    size_t n = strlen(name);
    memcpy(un.sun_path + 1, name, n);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&un,
                (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Whether the server ended the connection on `fd` within `ms` (it read EOF or a reset). */
static int sees_end(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char c;
    return poll(&p, 1, ms) == 1 && recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

/* The initialize timeout of these tests: a stalled handshake holds its thread this long. */
#define STALL_TIMEOUT_MS 10000

static shmipc_config *stall_config(void)
{
    shmipc_config *cfg;
    if (shmipc_config_new(&cfg) != 0 ||
        shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_INITIALIZE, STALL_TIMEOUT_MS) != 0)
        return NULL;
    return cfg;
}

/* A listener at a fresh address (named after `tag`) with `n` stallers connected to it. */
static shmipc_listener *listen_with_stallers(const char *tag, int *stall, int n)
{
    shmipc_listener *l;
    ipc_pick_address(address, sizeof address, tag);
    shmipc_config *cfg = stall_config();
    assert_int_equal(shmipc_listener_new(address, cfg, &l), 0);
    shmipc_config_free(cfg);
    for (int i = 0; i < n; i++)
        assert_true((stall[i] = connect_staller()) >= 0);
    return l;
}

struct good_client {
    int rc;
    shmipc_session *s;
};

static void *good_client_main(void *arg)
{
    struct good_client *g = arg;
    shmipc_config *cfg = stall_config();
    g->rc = shmipc_session_connect(address, cfg, &g->s);
    shmipc_config_free(cfg);
    return NULL;
}

/*
 * Regression: the handshake ran on the accepting thread, so one client that connected and
 * sent nothing held accept() for the whole initialize timeout. Twenty such clients come
 * first; a good client must still be accepted well within one timeout (before the fix it
 * waited for twenty of them, one after another).
 */
static void stalling_clients_do_not_delay_accept(void **state)
{
    (void)state;
    int stall[STALLERS];
    shmipc_listener *l;
    struct good_client g = {0};
    pthread_t th;
    l = listen_with_stallers("listener-stall", stall, STALLERS);
    /* The listener takes the stallers in: their handshakes are now in flight. */
    shmipc_session *s = NULL;
    assert_int_equal(shmipc_listener_accept(l, 0, &s), SHMIPC_EAGAIN);
    uint64_t t0 = ipc_now_ms();
    assert_int_equal(pthread_create(&th, NULL, good_client_main, &g), 0);
    assert_int_equal(shmipc_listener_accept(l, STALL_TIMEOUT_MS * 3, &s), 0);
    uint64_t waited = ipc_now_ms() - t0;
    pthread_join(th, NULL);
    assert_int_equal(g.rc, 0);
    assert_in_range(waited, 0, STALL_TIMEOUT_MS / 2);
    /* A stream over the new session works while the stallers still hold their handshakes. */
    shmipc_stream *cst, *sst;
    assert_int_equal(shmipc_session_open_stream(g.s, &cst), 0);
    ipc_send_text(cst, "ping");
    assert_int_equal(shmipc_session_accept_stream(s, 5000, &sst), 0);
    ipc_expect_text(sst, "ping");
    shmipc_stream_close(sst);
    shmipc_stream_close(cst);
    shmipc_session_close(g.s);
    shmipc_session_close(s);

    /* The same through fileno(): readable once a handshake is done, then accept(0) works. */
    assert_int_equal(pthread_create(&th, NULL, good_client_main, &g), 0);
    t0 = ipc_now_ms();
    int rc = SHMIPC_EAGAIN;
    while (rc == SHMIPC_EAGAIN && ipc_now_ms() - t0 < STALL_TIMEOUT_MS / 2) {
        struct pollfd pf = {.fd = shmipc_listener_fileno(l), .events = POLLIN};
        assert_true(poll(&pf, 1, 1000) >= 0);
        rc = shmipc_listener_accept(l, 0, &s);
    }
    pthread_join(th, NULL);
    assert_int_equal(rc, 0);
    assert_int_equal(g.rc, 0);
    shmipc_session_close(g.s);
    shmipc_session_close(s);
    for (int i = 0; i < STALLERS; i++)
        close(stall[i]);
    shmipc_listener_close(l);
}

/* The same for serve(): its thread runs every session, so a stall would stall them all. */
static void stalling_clients_do_not_delay_serve(void **state)
{
    (void)state;
    int stall[STALLERS];
    struct server_state ss = {0};
    struct serve_run r = {.ss = &ss};
    pthread_t server;
    ipc_pick_address(address, sizeof address, "listener-stall-serve");
    shmipc_config *cfg = stall_config();
    assert_int_equal(shmipc_listener_new(address, cfg, &r.l), 0);
    ss.l = r.l;
    assert_int_equal(pthread_create(&server, NULL, serve_main, &r), 0);
    for (int i = 0; i < STALLERS; i++)
        assert_true((stall[i] = connect_staller()) >= 0);
    usleep(50000);
    uint64_t t0 = ipc_now_ms();
    shmipc_session *s;
    shmipc_stream *st;
    assert_int_equal(shmipc_session_connect(address, cfg, &s), 0);
    shmipc_config_free(cfg);
    assert_int_equal(shmipc_session_open_stream(s, &st), 0);
    ipc_send_text(st, "echo-me!");
    ipc_expect_text(st, "echo-me!");
    uint64_t waited = ipc_now_ms() - t0;
    assert_in_range(waited, 0, STALL_TIMEOUT_MS / 2);
    shmipc_stream_close(st);
    shmipc_session_close(s);
    assert_int_equal(shmipc_listener_stop(r.l), 0);
    pthread_join(server, NULL);
    assert_int_equal(r.rc, 0);
    assert_int_equal(ss.messages, 1);
    for (int i = 0; i < STALLERS; i++)
        close(stall[i]);
    shmipc_listener_close(r.l);
}

/*
 * Closing a listener with handshakes in flight ends them at once (the stallers see their
 * connection end long before the timeout) and leaves no fd and no thread behind.
 */
static void close_with_handshakes_in_flight_leaks_nothing(void **state)
{
    (void)state;
    int stall[STALLERS];
    shmipc_listener *l;
    shmipc_session *s;
    int fds = ipc_count_fds(), threads = ipc_count_dir("/proc/self/task");
    l = listen_with_stallers("listener-close", stall, STALLERS);
    assert_int_equal(shmipc_listener_accept(l, 0, &s), SHMIPC_EAGAIN);
    assert_true(ipc_count_dir("/proc/self/task") > threads);
    uint64_t t0 = ipc_now_ms();
    shmipc_listener_close(l);
    assert_in_range(ipc_now_ms() - t0, 0, STALL_TIMEOUT_MS / 2);
    for (int i = 0; i < STALLERS; i++) {
        assert_true(sees_end(stall[i], 0));
        close(stall[i]);
    }
    assert_int_equal(ipc_count_fds(), fds);
    assert_int_equal(ipc_count_dir("/proc/self/task"), threads);
}

/* The signal mask (SigBlk) of each thread of this process, by tid; returns how many. */
static int thread_masks(pid_t *tid, unsigned long long *mask, int cap)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int n = 0;
    assert_non_null(d);
    while ((e = readdir(d)) != NULL && n < cap) {
        char path[sizeof "/proc/self/task//status" + sizeof e->d_name], line[256];
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue; /* the thread ended meanwhile */
        while (fgets(line, sizeof line, f) != NULL)
            if (strncmp(line, "SigBlk:", 7) == 0) {
                tid[n] = (pid_t)atoi(e->d_name);
                mask[n++] = strtoull(line + 7, NULL, 16);
            }
        fclose(f);
    }
    closedir(d);
    return n;
}

#define SIG_BIT(sig) (1ull << ((sig)-1))

/*
 * The mask of the one thread that is not in `old`, once it has set it: glibc starts a thread
 * with every signal blocked until it puts the mask it inherited in place, so a mask with the
 * faults blocked is looked at again, for up to 5 s.
 */
static unsigned long long new_thread_mask(const pid_t *old, int nold)
{
    enum { CAP = 256 };
    pid_t tid[CAP];
    unsigned long long mask[CAP], m = 0;
    uint64_t t0 = ipc_now_ms();
    int found;
    do {
        int n = thread_masks(tid, mask, CAP);
        found = 0;
        for (int i = 0; i < n; i++) {
            int seen = 0;
            for (int j = 0; j < nold && !seen; j++)
                seen = old[j] == tid[i];
            if (!seen) {
                found++;
                m = mask[i];
            }
        }
        assert_int_equal(found, 1);
        if (!(m & SIG_BIT(SIGBUS)))
            break;
        usleep(1000);
    } while (ipc_now_ms() - t0 < 5000);
    return m;
}

/*
 * Regression: a handshake thread blocked every signal, the faults too. It reads the peer's
 * shared memory (the queue and buffer layout), and a peer that shrank its file under the
 * mapping then raised a SIGBUS that was blocked: Linux delivers a blocked fault signal with
 * its default action, so the whole server died instead of the SIGBUS guard failing that one
 * handshake. Now the handshake thread blocks the process signals (they stay with the
 * application's threads) and leaves the faults open, as the reactor's threads do.
 */
static void handshake_thread_leaves_faults_open(void **state)
{
    (void)state;
    enum { CAP = 256 };
    pid_t before[CAP];
    unsigned long long before_mask[CAP];
    int stall, nbefore = thread_masks(before, before_mask, CAP);
    shmipc_listener *l = listen_with_stallers("listener-mask", &stall, 1);
    shmipc_session *s;
    /* The staller's handshake thread now waits for it, for STALL_TIMEOUT_MS. */
    assert_int_equal(shmipc_listener_accept(l, 0, &s), SHMIPC_EAGAIN);
    unsigned long long m = new_thread_mask(before, nbefore);
    assert_true(m & SIG_BIT(SIGTERM));
    assert_true(m & SIG_BIT(SIGINT));
    assert_true(m & SIG_BIT(SIGHUP));
    assert_true(m & SIG_BIT(SIGUSR1));
    assert_false(m & SIG_BIT(SIGBUS));
    assert_false(m & SIG_BIT(SIGSEGV));
    assert_false(m & SIG_BIT(SIGFPE));
    assert_false(m & SIG_BIT(SIGILL));
    close(stall);
    shmipc_listener_close(l);
}

/* Beyond 64 handshakes in flight, a new client is disconnected at once. */
static void handshakes_in_flight_are_bounded(void **state)
{
    (void)state;
    enum { MAX = 64, EXTRA = 6 };
    int stall[MAX + EXTRA];
    shmipc_listener *l;
    shmipc_session *s;
    l = listen_with_stallers("listener-cap", stall, MAX + EXTRA);
    assert_int_equal(shmipc_listener_accept(l, 0, &s), SHMIPC_EAGAIN);
    /* Accepted in order: the first 64 wait in their handshakes, the rest are gone. */
    for (int i = 0; i < MAX; i++)
        assert_false(sees_end(stall[i], 0));
    for (int i = MAX; i < MAX + EXTRA; i++)
        assert_true(sees_end(stall[i], 0));
    for (int i = 0; i < MAX + EXTRA; i++)
        close(stall[i]);
    shmipc_listener_close(l);
}

/* ------------------------------------------------------------------------------------ */
/* Shutdown landing while clients are being accepted                                     */
/* ------------------------------------------------------------------------------------ */

/* The listener the sink below shuts down (once), and the descriptor limit it restores. */
static shmipc_listener *sink_shuts;
static struct rlimit sink_old_limit;

/*
 * Runs on the accepting thread, in the middle of its accept loop: the first client's dup
 * failed (the limit left no second descriptor). It gives the descriptors back and shuts the
 * listener down, as another thread could at that very moment; the loop then goes on.
 */
static void shutdown_in_accept_loop_sink(int level, const char *line)
{
    (void)level;
    if (sink_shuts != NULL && strstr(line, ": dup: ") != NULL) {
        setrlimit(RLIMIT_NOFILE, &sink_old_limit);
        shmipc_listener_shutdown(sink_shuts);
        sink_shuts = NULL;
    }
}

/*
 * Regression: a client accepted in the same turn as the listener's shutdown got a handshake
 * thread all the same. Shutdown cuts off only the handshakes it finds, so that one waited for
 * its client for the whole initialize timeout, and close, which joins it, waited as long for a
 * client that sends nothing. Made certain here: two stallers wait in the backlog, the first
 * one's dup fails for want of a descriptor, and the log line it writes (on the accepting
 * thread, inside the accept loop) shuts the listener down before the second is accepted. Now
 * no handshake starts once shutdown has begun (the second client stays in the backlog and is
 * refused when the socket closes), accept says SHMIPC_ECLOSED, and close returns at once.
 */
static void handshake_accepted_as_shutdown_lands_is_cut_off(void **state)
{
    (void)state;
    int stall[2];
    int fds = ipc_count_fds(), threads = ipc_count_dir("/proc/self/task");
    shmipc_listener *l = listen_with_stallers("listener-sd-turn", stall, 2);
    /* The lowest free descriptor is the last one allowed: accept() gets it, dup() fails. */
    int lowest = open("/dev/null", O_RDONLY | O_CLOEXEC);
    assert_true(lowest >= 0);
    close(lowest);
    struct rlimit low;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &sink_old_limit), 0);
    low = sink_old_limit;
    low.rlim_cur = (rlim_t)lowest + 1;
    sink_shuts = l;
    shmipc_set_log_sink(shutdown_in_accept_loop_sink);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    shmipc_session *s = NULL;
    int rc = shmipc_listener_accept(l, 0, &s);
    setrlimit(RLIMIT_NOFILE, &sink_old_limit); /* also when the sink never ran */
    shmipc_set_log_sink(NULL);
    int sink_ran = sink_shuts == NULL;
    sink_shuts = NULL;
    uint64_t t0 = ipc_now_ms();
    shmipc_listener_close(l);
    uint64_t waited = ipc_now_ms() - t0;
    /* Both clients see the end: the first was dropped, the second refused with the socket. */
    int ended[2];
    for (int i = 0; i < 2; i++) {
        ended[i] = sees_end(stall[i], 1000);
        close(stall[i]);
    }
    assert_true(sink_ran);
    assert_in_range(waited, 0, STALL_TIMEOUT_MS / 2);
    assert_true(ended[0]);
    assert_true(ended[1]);
    assert_int_equal(rc, SHMIPC_ECLOSED);
    assert_int_equal(ipc_count_fds(), fds);
    assert_int_equal(ipc_count_dir("/proc/self/task"), threads);
}

/* One round of close_races_connecting_clients: who connects, and what came of it. */
struct conn_race {
    char address[128];
    const shmipc_config *cfg;
    shmipc_listener *l;
    int stop;      /* atomic: the clients stop connecting */
    int sessions;  /* atomic: handshakes that completed on the client side */
    int accept_rc; /* what serve() or the last accept() returned */
    uint64_t accept_done_ms;
};

enum { RACE_ROUNDS = 20, RACE_CLIENTS = 3, RACE_CONNECTS = 200, RACE_STALLERS = 8 };

/* A raw client of `address` ("unix:@name") that sends nothing, or -1. */
static int connect_staller_to(const char *addr)
{
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    const char *name = addr + strlen("unix:@");
    size_t n = strlen(name);
    memcpy(un.sun_path + 1, name, n);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&un,
                           (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) < 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/*
 * Connects, in turn, a real client (closed at once) and stallers, until told to stop. The
 * stallers are a ring: the oldest goes when a new one comes, so clients keep arriving.
 */
static void *race_client_main(void *arg)
{
    struct conn_race *r = arg;
    int stall[RACE_STALLERS], nstall = 0, next = 0;
    for (int i = 0; i < RACE_CONNECTS && !__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE); i++) {
        if (i % 4 == 0) {
            shmipc_session *s;
            if (shmipc_session_connect(r->address, r->cfg, &s) == 0) {
                __atomic_add_fetch(&r->sessions, 1, __ATOMIC_RELAXED);
                shmipc_session_close(s);
            }
            continue;
        }
        int fd = connect_staller_to(r->address);
        if (fd < 0) {
            usleep(200);
            continue;
        }
        if (nstall == RACE_STALLERS)
            close(stall[next]);
        else
            nstall++;
        stall[next] = fd;
        next = (next + 1) % RACE_STALLERS;
    }
    for (int i = 0; i < nstall; i++)
        close(stall[i]);
    return NULL;
}

/* serve()'s callbacks in close_races_connecting_clients: the clients open no stream. */
static void race_close_stream(shmipc_stream *st, void *ud)
{
    (void)ud;
    shmipc_stream_close(st);
}

static void race_ignore_data(shmipc_stream *st, void *ud)
{
    (void)st;
    (void)ud;
}

/*
 * Serves until the listener is closed: one call, which holds the listener for its whole run,
 * so a close from another thread at any moment is allowed (a loop of accept calls could start
 * one after the close, the caller's bug).
 */
static void *race_serve_main(void *arg)
{
    struct conn_race *r = arg;
    r->accept_rc = shmipc_listener_serve(r->l, race_close_stream, race_ignore_data, NULL, NULL);
    r->accept_done_ms = ipc_now_ms();
    return NULL;
}

/* Accepts (and closes) sessions until the listener is shut down (closed only after the join). */
static void *race_accept_main(void *arg)
{
    struct conn_race *r = arg;
    for (int i = 0; i < 100000; i++) {
        shmipc_session *s = NULL;
        r->accept_rc = shmipc_listener_accept(r->l, 50, &s);
        if (r->accept_rc == 0) {
            shmipc_session_close(s);
        } else if (r->accept_rc != SHMIPC_ETIMEDOUT) {
            break;
        }
    }
    r->accept_done_ms = ipc_now_ms();
    return NULL;
}

/*
 * Close (even rounds, while another thread serves) or shutdown (odd rounds, while another
 * thread accepts) races a stream of clients, real ones and stallers, connecting from threads:
 * the serving or accepting thread must come out with SHMIPC_ECLOSED and the listener be gone
 * well within the initialize timeout whatever was being accepted, and nothing may be left over
 * (sessions under ASan, descriptors and threads here).
 */
static void close_races_connecting_clients(void **state)
{
    (void)state;
    /* Small shared memory: a handshake is quick, so many complete in a round. */
    shmipc_config *cfg = stall_config();
    assert_int_equal(shmipc_config_set_buffer_capacity(cfg, 1u << 20), 0);
    assert_int_equal(shmipc_config_parse_slice_classes(cfg, "4096:100"), 0);
    assert_int_equal(shmipc_config_set_queue_capacity(cfg, 256), 0);
    int fds = ipc_count_fds();
    for (int round = 0; round < RACE_ROUNDS; round++) {
        struct conn_race r = {.cfg = cfg};
        pthread_t acc, cl[RACE_CLIENTS];
        ipc_pick_address(r.address, sizeof r.address, "listener-race");
        assert_int_equal(shmipc_listener_new(r.address, cfg, &r.l), 0);
        assert_int_equal(
            pthread_create(&acc, NULL, round % 2 == 0 ? race_serve_main : race_accept_main, &r), 0);
        for (int i = 0; i < RACE_CLIENTS; i++)
            assert_int_equal(pthread_create(&cl[i], NULL, race_client_main, &r), 0);
        /* A session came up, so serve (or accept) is in: a close may come at any moment. */
        for (int i = 0; i < 5000 && __atomic_load_n(&r.sessions, __ATOMIC_RELAXED) == 0; i++)
            usleep(1000);
        assert_true(__atomic_load_n(&r.sessions, __ATOMIC_RELAXED) > 0);
        usleep((useconds_t)(round % 5) * 5000);
        uint64_t t0 = ipc_now_ms();
        if (round % 2 == 0) {
            shmipc_listener_close(r.l);
            pthread_join(acc, NULL);
        } else {
            assert_int_equal(shmipc_listener_shutdown(r.l), 0);
            pthread_join(acc, NULL);
            shmipc_listener_close(r.l);
        }
        uint64_t closed = ipc_now_ms() - t0, accept_left = r.accept_done_ms - t0;
        __atomic_store_n(&r.stop, 1, __ATOMIC_RELEASE);
        for (int i = 0; i < RACE_CLIENTS; i++)
            pthread_join(cl[i], NULL);
        assert_int_equal(r.accept_rc, SHMIPC_ECLOSED);
        assert_in_range(accept_left, 0, STALL_TIMEOUT_MS / 2);
        assert_in_range(closed, 0, STALL_TIMEOUT_MS / 2);
    }
    /* The handshake threads are gone with their sockets (threads are not counted here: TSan
     * starts a thread of its own with the first one the test makes). */
    assert_int_equal(ipc_count_fds(), fds);
    shmipc_config_free(cfg);
}

/* ------------------------------------------------------------------------------------ */
/* Close or shutdown while another thread blocks in accept or serve                     */
/* ------------------------------------------------------------------------------------ */

/* A thread blocked in shmipc_listener_accept (10 s: bounded even on broken code). */
struct blocked_listener {
    shmipc_listener *l;
    pthread_t thread;
    int rc;
    int started;
    struct server_state ss; /* serve only */
};

static void *blocked_accept_main(void *arg)
{
    struct blocked_listener *b = arg;
    shmipc_session *s = NULL;
    __atomic_store_n(&b->started, 1, __ATOMIC_RELEASE);
    b->rc = shmipc_listener_accept(b->l, 10000, &s);
    if (b->rc == 0)
        shmipc_session_close(s);
    return NULL;
}

/* The stream a blocked serve was handed: the test closes it once serve returned. */
static void keep_stream(shmipc_stream *st, void *ud)
{
    struct server_state *ss = ud;
    assert_null(ss->kept);
    ss->kept = st;
}

/* Echoes 8-byte messages; an ended stream is left to the test. */
static void echo_data(shmipc_stream *st, void *ud)
{
    const void *p;
    char msg[8];
    (void)ud;
    while (shmipc_stream_read_exact_bytes(st, 8, &p, SHMIPC_NONBLOCK) == 0) {
        memcpy(msg, p, 8);
        shmipc_stream_release(st);
        if (shmipc_stream_write(st, msg, 8) < 0 || shmipc_stream_flush(st) < 0)
            return;
    }
}

static void *blocked_serve_main(void *arg)
{
    struct blocked_listener *b = arg;
    __atomic_store_n(&b->started, 1, __ATOMIC_RELEASE);
    b->rc = shmipc_listener_serve(b->l, keep_stream, echo_data, &b->ss, on_destroy);
    shmipc_stream_close(b->ss.kept);
    return NULL;
}

static void start_blocked(struct blocked_listener *b, shmipc_listener *l, void *(*fn)(void *))
{
    memset(b, 0, sizeof *b);
    b->l = l;
    assert_int_equal(pthread_create(&b->thread, NULL, fn, b), 0);
    while (!__atomic_load_n(&b->started, __ATOMIC_ACQUIRE))
        usleep(1000);
    usleep(3000); /* into the wait, most of the time */
}

/*
 * Regression: closing a listener while another thread was blocked in shmipc_listener_accept
 * freed it under that thread, which sat in poll() on closed descriptors (heap-use-after-free
 * under ASan). The blocked call must wake with SHMIPC_ECLOSED and the listener be freed when
 * it leaves.
 */
static void listener_close_while_accept_blocks(void **state)
{
    (void)state;
    int fds = ipc_count_fds();
    for (int i = 0; i < 100; i++) {
        struct blocked_listener b;
        shmipc_listener *l;
        ipc_pick_address(address, sizeof address, "listener-cab");
        assert_int_equal(shmipc_listener_new(address, NULL, &l), 0);
        start_blocked(&b, l, blocked_accept_main);
        shmipc_listener_close(l);
        pthread_join(b.thread, NULL);
        assert_int_equal(b.rc, SHMIPC_ECLOSED);
    }
    assert_int_equal(ipc_count_fds(), fds);
}

/* The same for a thread in shmipc_listener_serve, with a client being served. */
static void listener_close_while_serve_blocks(void **state)
{
    (void)state;
    shmipc_config *cfg = patient_config();
    int fds = ipc_count_fds();
    for (int i = 0; i < 20; i++) {
        struct blocked_listener b;
        shmipc_listener *l;
        shmipc_session *c;
        shmipc_stream *st;
        ipc_pick_address(address, sizeof address, "listener-csb");
        assert_int_equal(shmipc_listener_new(address, cfg, &l), 0);
        start_blocked(&b, l, blocked_serve_main);
        assert_int_equal(shmipc_session_connect(address, cfg, &c), 0);
        assert_int_equal(shmipc_session_open_stream(c, &st), 0);
        assert_int_equal(shmipc_stream_write(st, "12345678", 8), 0);
        assert_int_equal(shmipc_stream_flush(st), 0);
        const void *p;
        assert_int_equal(shmipc_stream_read_exact_bytes(st, 8, &p, 0), 0);
        assert_memory_equal(p, "12345678", 8);
        shmipc_stream_release(st);
        shmipc_listener_close(l);
        pthread_join(b.thread, NULL);
        assert_int_equal(b.rc, SHMIPC_ECLOSED);
        assert_int_equal(b.ss.destroyed, 1);
        /* The served session was closed with the listener: the client hears of it. */
        assert_int_equal(shmipc_stream_read_exact_bytes(st, 8, &p, 0), SHMIPC_ECONNRESET);
        shmipc_stream_close(st);
        shmipc_session_close(c);
    }
    assert_int_equal(ipc_count_fds(), fds);
    shmipc_config_free(cfg);
}

/* shutdown wakes accept and serve; later calls fail; twice is fine; close still frees. */
static void listener_shutdown_wakes_accept_and_serve(void **state)
{
    (void)state;
    for (int i = 0; i < 20; i++) {
        struct blocked_listener a, b;
        shmipc_listener *l;
        shmipc_session *s;
        ipc_pick_address(address, sizeof address, "listener-sd");
        assert_int_equal(shmipc_listener_new(address, NULL, &l), 0);
        start_blocked(&a, l, blocked_accept_main);
        start_blocked(&b, l, blocked_serve_main);
        assert_int_equal(shmipc_listener_shutdown(l), 0);
        pthread_join(a.thread, NULL);
        pthread_join(b.thread, NULL);
        assert_int_equal(a.rc, SHMIPC_ECLOSED);
        assert_int_equal(b.rc, SHMIPC_ECLOSED);
        assert_int_equal(b.ss.destroyed, 1);
        assert_int_equal(shmipc_listener_shutdown(l), 0);
        assert_int_equal(shmipc_listener_accept(l, 0, &s), SHMIPC_ECLOSED);
        assert_int_equal(shmipc_listener_accept(l, SHMIPC_WAIT_FOREVER, &s), SHMIPC_ECLOSED);
        struct server_state ss = {0};
        assert_int_equal(shmipc_listener_serve(l, on_stream, on_data, &ss, on_destroy),
                         SHMIPC_ECLOSED);
        assert_int_equal(ss.destroyed, 1);
        assert_int_equal(shmipc_listener_stop(l), 0);
        /* An event loop watching fileno() hears of the shutdown too. */
        struct pollfd pfd = {.fd = shmipc_listener_fileno(l), .events = POLLIN};
        assert_int_equal(poll(&pfd, 1, 5000), 1);
        shmipc_listener_close(l);
    }
    assert_int_equal(shmipc_listener_shutdown(NULL), SHMIPC_EINVAL);
}

static void *serve_until_stopped(void *arg)
{
    static struct server_state ss;
    (void)shmipc_listener_serve(arg, on_stream, on_data, &ss, NULL);
    return NULL;
}

/* The child of out_of_descriptors_pauses_accepting: its exit code says what went wrong. */
static int pausing_child(int to_parent, int from_parent)
{
    shmipc_listener *l = NULL;
    shmipc_session *s = NULL;
    char c = 'L';
    if (shmipc_listener_new(address, NULL, &l) != 0)
        return 2;
    if (write(to_parent, &c, 1) != 1 || read(from_parent, &c, 1) != 1) /* a client waits */
        return 3;
    /* Every descriptor taken: accept() fails with EMFILE while the client stays queued. */
    struct rlimit old, low;
    getrlimit(RLIMIT_NOFILE, &old);
    low = old;
    low.rlim_cur = 128;
    setrlimit(RLIMIT_NOFILE, &low);
    int held[128], nheld = 0;
    while (nheld < 128 && (held[nheld] = dup(0)) >= 0)
        nheld++;
    /* A blocking accept waits out its timeout and does not spin (before: EMFILE at once, and a
     * caller that tried again spun, with a warning per try). */
    uint64_t c0 = ipc_cpu_ms(), w0 = ipc_now_ms();
    int rc = shmipc_listener_accept(l, 1200, &s);
    uint64_t cpu = ipc_cpu_ms() - c0, wall = ipc_now_ms() - w0;
    if (rc != SHMIPC_ETIMEDOUT || wall < 1100) {
        fprintf(stderr, "accept: %s after %llu ms\n", shmipc_errname(rc), (unsigned long long)wall);
        return 10;
    }
    if (cpu > 300) {
        fprintf(stderr, "accept: %llu ms of CPU in %llu ms\n", (unsigned long long)cpu,
                (unsigned long long)wall);
        return 11;
    }
    /* An event loop on fileno(): woken once per pause, not on every turn. */
    struct pollfd p = {.fd = shmipc_listener_fileno(l), .events = POLLIN};
    int wakes = 0;
    uint64_t end = ipc_now_ms() + 1200;
    c0 = ipc_cpu_ms();
    while (ipc_now_ms() < end && wakes < 1000) {
        if (poll(&p, 1, (int)(end - ipc_now_ms())) != 1)
            continue;
        wakes++;
        if (shmipc_listener_accept(l, 0, &s) != SHMIPC_EAGAIN)
            return 12;
    }
    if (wakes > 6 || ipc_cpu_ms() - c0 > 300) {
        fprintf(stderr, "fileno: %d wakes, %llu ms of CPU in 1200 ms\n", wakes,
                (unsigned long long)(ipc_cpu_ms() - c0));
        return 13;
    }
    /* serve() idles too. */
    pthread_t th;
    c0 = ipc_cpu_ms();
    if (pthread_create(&th, NULL, serve_until_stopped, l) != 0)
        return 14;
    struct timespec nap = {1, 200000000};
    nanosleep(&nap, NULL);
    shmipc_listener_stop(l);
    pthread_join(th, NULL);
    if (ipc_cpu_ms() - c0 > 300) {
        fprintf(stderr, "serve: %llu ms of CPU in 1200 ms\n",
                (unsigned long long)(ipc_cpu_ms() - c0));
        return 15;
    }
    /* Descriptors back: the next client is accepted (once the pause ends). */
    for (int i = 0; i < nheld; i++)
        close(held[i]);
    setrlimit(RLIMIT_NOFILE, &old);
    c = 'F';
    if (write(to_parent, &c, 1) != 1)
        return 3;
    rc = shmipc_listener_accept(l, 10000, &s);
    if (rc != 0) {
        fprintf(stderr, "accept after: %s\n", shmipc_errname(rc));
        return 16;
    }
    shmipc_session_close(s);
    shmipc_listener_close(l);
    return 0;
}

/*
 * Out of descriptors (EMFILE), accept() left its client in the backlog and the socket
 * readable: a blocking accept returned the error at once (the shmipc-serve workers then tried
 * again at once, a busy loop logging each failure), serve() and an event loop on fileno()
 * woke again and again. Now accepting pauses 500 ms (nginx's accept_mutex_delay) with one
 * warning, nobody spins, and once descriptors are back the next client is accepted. In a
 * child process, whose descriptor limit is lowered.
 */
static void out_of_descriptors_pauses_accepting(void **state)
{
    (void)state;
    int to_parent[2], to_child[2];
    ipc_pick_address(address, sizeof address, "emfile");
    assert_int_equal(pipe(to_parent), 0);
    assert_int_equal(pipe(to_child), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(60);
        close(to_parent[0]);
        close(to_child[1]);
        _exit(pausing_child(to_parent[1], to_child[0]));
    }
    close(to_parent[1]);
    close(to_child[0]);
    char c;
    assert_int_equal(read(to_parent[0], &c, 1), 1);
    int staller = connect_staller(); /* queued: the child cannot accept it */
    assert_true(staller >= 0);
    assert_int_equal(write(to_child[1], "C", 1), 1);
    int got = (int)read(to_parent[0], &c, 1);
    shmipc_session *s = NULL;
    int rc = -1;
    if (got == 1) {
        shmipc_config *cfg = patient_config();
        rc = shmipc_session_connect(address, cfg, &s);
        shmipc_config_free(cfg);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (s != NULL)
        shmipc_session_close(s);
    close(staller);
    close(to_parent[0]);
    close(to_child[1]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("the child failed: %s %d", WIFEXITED(status) ? "exit" : "signal",
                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    assert_int_equal(rc, 0);
}

int main(int argc, char **argv)
{
    /* One test by name: test_x NAME (shell pattern), for repeated runs under a sanitizer. */
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(busy_live_socket_refused_without_waiting),
        cmocka_unit_test(serve_many_clients),
        cmocka_unit_test(a_busy_session_does_not_starve_new_clients),
        cmocka_unit_test(stop_from_another_thread),
        cmocka_unit_test(serve_refused_argument_still_destroys),
        cmocka_unit_test(serve_tells_held_streams_of_its_end),
        cmocka_unit_test(on_data_outlives_a_close_on_another_thread),
        cmocka_unit_test(socket_file_mode_and_stale_replacement),
        cmocka_unit_test(socket_file_appears_only_when_listening),
        cmocka_unit_test(two_listeners_racing_for_a_path_one_wins),
        cmocka_unit_test(replaced_file_not_removed_at_close),
        cmocka_unit_test(accept_timeout),
        cmocka_unit_test(accept_any_negative_timeout_waits_forever),
        cmocka_unit_test(stalling_clients_do_not_delay_accept),
        cmocka_unit_test(stalling_clients_do_not_delay_serve),
        cmocka_unit_test(close_with_handshakes_in_flight_leaks_nothing),
        cmocka_unit_test(handshake_thread_leaves_faults_open),
        cmocka_unit_test(handshakes_in_flight_are_bounded),
        cmocka_unit_test(handshake_accepted_as_shutdown_lands_is_cut_off),
        cmocka_unit_test(close_races_connecting_clients),
        cmocka_unit_test(listener_close_while_accept_blocks),
        cmocka_unit_test(listener_close_while_serve_blocks),
        cmocka_unit_test(listener_shutdown_wakes_accept_and_serve),
        cmocka_unit_test(out_of_descriptors_pauses_accepting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
