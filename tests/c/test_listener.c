/* Description: the listener: blocking accept, and serving many clients with callbacks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shmipc.h"

static char address[128];

/*
 * Handshakes get 10 s: the serving thread runs them one after another, and under a sanitizer
 * on two CPUs four clients at once can take longer than the default second.
 */
static shmipc_config *patient_config(void)
{
    shmipc_config *cfg;
    if (shmipc_config_new(&cfg) != 0 ||
        shmipc_config_set_timeout_ms(cfg, SHMIPC_TIMEOUT_INITIALIZE, 10000) != 0)
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
};

static void on_stream(shmipc_stream *st, void *ud)
{
    struct server_state *ss = ud;
    (void)st;
    ss->streams++;
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
            ss->ended++;
            shmipc_stream_close(st);
            if (ss->stop_after && ss->ended == ss->stop_after)
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

static void serve_many_clients(void **state)
{
    (void)state;
    enum { CLIENTS = 4 };
    struct server_state ss = {.stop_after = CLIENTS * 3};
    struct serve_run r = {.ss = &ss};
    pthread_t server, clients[CLIENTS];
    snprintf(address, sizeof address, "unix:@shmipc-test-listener-%d", (int)getpid());
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
    snprintf(address, sizeof address, "unix:@shmipc-test-listener-stop-%d", (int)getpid());
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

static void accept_timeout(void **state)
{
    (void)state;
    shmipc_listener *l;
    shmipc_session *s;
    snprintf(address, sizeof address, "unix:@shmipc-test-listener-t-%d", (int)getpid());
    assert_int_equal(shmipc_listener_new(address, NULL, &l), 0);
    assert_int_equal(shmipc_listener_accept(l, 0, &s), SHMIPC_EAGAIN);
    assert_int_equal(shmipc_listener_accept(l, 30, &s), SHMIPC_ETIMEDOUT);
    assert_int_equal(shmipc_listener_accept(l, -2, &s), SHMIPC_EINVAL);
    shmipc_listener_close(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(serve_many_clients),
        cmocka_unit_test(stop_from_another_thread),
        cmocka_unit_test(socket_file_mode_and_stale_replacement),
        cmocka_unit_test(accept_timeout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
