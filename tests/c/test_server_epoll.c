/* Description: the HTTP server over real sockets with the epoll backend forced (the shared
 * suite), the server config's validation, the SHMIPC_HTTP_* knobs, and the epoll_ctl count of
 * 200 keep-alive requests through the server: none after the connection's registration. */
#include "test_server_suite.h"
#include "test_server_pending.h"
#include "test_server_port.h"

/* This file calls the deprecated functions on purpose: their old meaning is part of the ABI
 * until they go (CHANGELOG.md). */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* Setters refuse bad values with a detail naming the field, and leave the config as it was. */
static void config_validation(void **state)
{
    shmipc_server_config *cfg;
    (void)state;
    CHECK(shmipc_server_config_new(&cfg));
    assert_int_equal(shmipc_server_config_set_port(cfg, 65536), SHMIPC_EINVAL);
    assert_non_null(strstr(shmipc_error_detail(), "port"));
    assert_int_equal(shmipc_server_config_set_port(cfg, -1), SHMIPC_EINVAL);
    assert_int_equal(shmipc_server_config_set_address(cfg, "localhost"), SHMIPC_EINVAL);
    assert_non_null(strstr(shmipc_error_detail(), "address"));
    CHECK(shmipc_server_config_set_address(cfg, "::1"));
    CHECK(shmipc_server_config_set_address(cfg, "127.0.0.1"));
    assert_int_equal(shmipc_server_config_set_workers(cfg, 1025), SHMIPC_EINVAL);
    assert_int_equal(shmipc_server_config_set_backend(cfg, 5), SHMIPC_EINVAL);
    assert_int_equal(shmipc_server_config_set_timeout_ms(cfg, SHMIPC_SERVER_TIMEOUT_HEADER, 0),
                     SHMIPC_EINVAL);
    assert_non_null(strstr(shmipc_error_detail(), "header_timeout"));
    assert_int_equal(shmipc_server_config_set_timeout_ms(cfg, 7, 10), SHMIPC_EINVAL);
    CHECK(shmipc_server_config_set_timeout_ms(cfg, SHMIPC_SERVER_TIMEOUT_STOP, 0));
    assert_int_equal(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_HEADERS, 5000),
                     SHMIPC_EINVAL);
    assert_non_null(strstr(shmipc_error_detail(), "headers"));
    assert_int_equal(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_PIPELINE, 2000),
                     SHMIPC_EINVAL);
    CHECK(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_PIPELINE, 4));
    assert_int_equal(shmipc_server_config_set_server_name(cfg, "bad\r\nname"), SHMIPC_EINVAL);
    CHECK(shmipc_server_config_set_server_name(cfg, NULL));
    assert_int_equal(shmipc_server_config_new(NULL), SHMIPC_EINVAL);
    shmipc_server_config_free(cfg);
    shmipc_server_config_free(NULL);
}

/* Routes are checked; a failed registration still calls destroy; routes are refused while
 * the server runs; free calls every destroy once. */
static void route_validation(void **state)
{
    shmipc_server_config *cfg;
    shmipc_server *s;
    int before;
    (void)state;
    CHECK(shmipc_server_config_new(&cfg));
    CHECK(shmipc_server_config_set_port(cfg, 0));
    CHECK(shmipc_server_config_set_workers(cfg, 1));
    CHECK(shmipc_server_config_set_backend(cfg, SHMIPC_BACKEND_EPOLL));
    CHECK(shmipc_server_new(cfg, &s));
    shmipc_server_config_free(cfg);
    assert_int_equal(shmipc_server_port(s), SHMIPC_EINVAL);
    assert_null(shmipc_server_backend(s));
    before = atomic_load(&destroys);
    assert_int_equal(shmipc_server_route(s, "GET", "nope", h_hello, NULL, count_destroy),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc_server_route(s, "GET", "/a*b", h_hello, NULL, count_destroy),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc_server_route(s, "G T", "/", h_hello, NULL, count_destroy),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc_server_route(s, "GET", "/", NULL, NULL, count_destroy), SHMIPC_EINVAL);
    assert_int_equal(atomic_load(&destroys), before + 4);
    CHECK(shmipc_server_route(s, "GET", "/x", h_hello, NULL, count_destroy));
    assert_int_equal(shmipc_server_route(s, "GET", "/x", h_hello, NULL, count_destroy),
                     SHMIPC_EEXIST);
    CHECK(shmipc_server_route(s, "POST", "/x", h_hello, NULL, count_destroy));
    CHECK(shmipc_server_route(s, "GET", "/x/*", h_hello, NULL, count_destroy));
    assert_int_equal(shmipc_server_static(s, NULL, "/s", 100, NULL, "", 0), SHMIPC_EINVAL);
    CHECK(shmipc_server_static(s, NULL, "/s", 204, NULL, NULL, 0));
    CHECK(shmipc_server_start(s));
    CHECK(shmipc_server_start(s)); /* already running: a no-op */
    assert_true(shmipc_server_port(s) > 0);
    assert_int_equal(shmipc_server_route(s, "GET", "/y", h_hello, NULL, count_destroy),
                     SHMIPC_EBUSY);
    assert_int_equal(shmipc_server_static(s, NULL, "/t", 200, NULL, "", 0), SHMIPC_EBUSY);
    before = atomic_load(&destroys);
    shmipc_server_close(s); /* stops the running server, then destroys the three routes */
    assert_int_equal(atomic_load(&destroys), before + 3);
    shmipc_server_close(NULL);
}

/* A stop before run makes run return at once, without starting. */
static void stop_before_run(void **state)
{
    shmipc_server *s;
    (void)state;
    CHECK(shmipc_server_new(NULL, &s));
    CHECK(shmipc_server_stop(s));
    CHECK(shmipc_server_run(s));
    assert_null(shmipc_server_backend(s));
    shmipc_server_close(s);
}

/*
 * The timeout knobs are read at server creation, by the rule of every timeout (negative:
 * never, 0: no wait where that means something); bad values are refused naming them.
 */
static void timeout_knobs(void **state)
{
    static const char *const bad_header[] = {"soon", "0", "3600001", "-", "-x", "--1", "1-"};
    shmipc_server *s;
    (void)state;
    for (size_t i = 0; i < sizeof bad_header / sizeof bad_header[0]; i++) {
        setenv("SHMIPC_HTTP_HEADER_TIMEOUT_MS", bad_header[i], 1);
        assert_int_equal(shmipc_server_new(NULL, &s), SHMIPC_EINVAL);
        assert_non_null(strstr(shmipc_error_detail(), "SHMIPC_HTTP_HEADER_TIMEOUT_MS"));
    }
    setenv("SHMIPC_HTTP_HEADER_TIMEOUT_MS", "250", 1);
    setenv("SHMIPC_HTTP_KEEPALIVE_TIMEOUT_MS", "1000", 1);
    CHECK(shmipc_server_new(NULL, &s));
    assert_int_equal(s->header_ms, 250);
    assert_int_equal(s->idle_ms, 1000);
    assert_int_equal(s->stall_ms, 1000);
    shmipc_server_close(s);
    /* 0: no keep-alive; the stall timeout keeps its default. */
    setenv("SHMIPC_HTTP_KEEPALIVE_TIMEOUT_MS", "0", 1);
    CHECK(shmipc_server_new(NULL, &s));
    assert_int_equal(s->idle_ms, 0);
    assert_int_equal(s->stall_ms, 60000);
    shmipc_server_close(s);
    /* Any negative value is "never", however large. */
    setenv("SHMIPC_HTTP_HEADER_TIMEOUT_MS", "-1", 1);
    setenv("SHMIPC_HTTP_KEEPALIVE_TIMEOUT_MS", "-99999999999999999999999", 1);
    CHECK(shmipc_server_new(NULL, &s));
    assert_true(s->header_ms < 0);
    assert_true(s->idle_ms < 0);
    assert_int_equal(s->stall_ms, 60000);
    shmipc_server_close(s);
    unsetenv("SHMIPC_HTTP_HEADER_TIMEOUT_MS");
    unsetenv("SHMIPC_HTTP_KEEPALIVE_TIMEOUT_MS");
}

/*
 * SHMIPC_HTTP_KEEPALIVE_REQUESTS sets keepalive_requests where the config leaves it 0 (the
 * config's SHMIPC_SERVER_LIMIT_KEEPALIVE_REQUESTS wins); 0, a sign or junk is refused naming
 * the variable; unset it is 1000. The limit's range is checked by the setter.
 */
static void keepalive_requests_knob(void **state)
{
    static const char *const bad[] = {"0", "-1", "lots", "4294967296"};
    shmipc_server_config *cfg;
    shmipc_server *s;
    (void)state;
    CHECK(shmipc_server_new(NULL, &s));
    assert_int_equal(s->keepalive_requests, 1000);
    shmipc_server_close(s);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("SHMIPC_HTTP_KEEPALIVE_REQUESTS", bad[i], 1);
        assert_int_equal(shmipc_server_new(NULL, &s), SHMIPC_EINVAL);
        assert_non_null(strstr(shmipc_error_detail(), "SHMIPC_HTTP_KEEPALIVE_REQUESTS"));
    }
    setenv("SHMIPC_HTTP_KEEPALIVE_REQUESTS", "7", 1);
    CHECK(shmipc_server_new(NULL, &s));
    assert_int_equal(s->keepalive_requests, 7);
    shmipc_server_close(s);
    CHECK(shmipc_server_config_new(&cfg));
    assert_int_equal(
        shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_KEEPALIVE_REQUESTS, 1ull << 32),
        SHMIPC_EINVAL);
    assert_non_null(strstr(shmipc_error_detail(), "keepalive_requests"));
    CHECK(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_KEEPALIVE_REQUESTS, 4294967295u));
    CHECK(shmipc_server_new(cfg, &s));
    assert_int_equal(s->keepalive_requests, 4294967295u);
    shmipc_server_close(s);
    CHECK(shmipc_server_config_set_limit(cfg, SHMIPC_SERVER_LIMIT_KEEPALIVE_REQUESTS, 0));
    CHECK(shmipc_server_new(cfg, &s));
    assert_int_equal(s->keepalive_requests, 7);
    shmipc_server_close(s);
    shmipc_server_config_free(cfg);
    unsetenv("SHMIPC_HTTP_KEEPALIVE_REQUESTS");
}

/*
 * shmipc_server_config_set_timeout() follows the rule of every timeout (negative: never, 0: no
 * wait where that means something, else EINVAL); the deprecated _ms setter keeps its meaning.
 */
static void server_timeouts_follow_one_rule(void **state)
{
    shmipc_server_config *cfg;
    shmipc_server *s;
    (void)state;
    CHECK(shmipc_server_config_new(&cfg));
    /* 0 where "no wait" means nothing; above the bound; a bad which; NULL. */
    assert_int_equal(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_HEADER, 0),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_PING, 0),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_IDLE, 0),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_STOP, 3600001),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_STOP, INT_MAX),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc_server_config_set_timeout(cfg, 5, 1), SHMIPC_EINVAL);
    assert_int_equal(shmipc_server_config_set_timeout(cfg, -1, 1), SHMIPC_EINVAL);
    assert_int_equal(shmipc_server_config_set_timeout(NULL, 0, 1), SHMIPC_EINVAL);
    /* The ping must stay below the idle timeout when both are on; "never" is no bound. */
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_IDLE, 1000));
    assert_int_equal(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_PING, 1000),
                     SHMIPC_EINVAL);
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_PING, 500));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_IDLE, -1));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_PING, 3600000));
    CHECK(shmipc_server_new(cfg, &s));
    assert_int_equal(s->ws_ping_ms, 3600000);
    assert_int_equal(s->ws_idle_ms, 0); /* never */
    shmipc_server_close(s);
    /* Negative, however large, is never. */
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_HEADER, INT_MIN));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_KEEPALIVE, -2));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_STOP, -1));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_WS_PING, -5));
    CHECK(shmipc_server_new(cfg, &s));
    assert_true(s->header_ms < 0);
    assert_true(s->idle_ms < 0);
    assert_int_equal(s->stall_ms, 60000); /* a stalled body or reader still times out */
    assert_true(s->stop_ms < 0);
    assert_int_equal(s->ws_ping_ms, 0);
    shmipc_server_close(s);
    /* 0: no keep-alive, an immediate stop. */
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_KEEPALIVE, 0));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_STOP, 0));
    CHECK(shmipc_server_new(cfg, &s));
    assert_int_equal(s->idle_ms, 0);
    assert_int_equal(s->stall_ms, 60000);
    assert_int_equal(s->stop_ms, 0);
    shmipc_server_close(s);
    /* The deprecated setter: its old ranges and its 0 = never for the WebSocket ones. */
    assert_int_equal(shmipc_server_config_set_timeout_ms(cfg, SHMIPC_SERVER_TIMEOUT_KEEPALIVE, 0),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc_server_config_set_timeout_ms(cfg, SHMIPC_SERVER_TIMEOUT_HEADER, 0),
                     SHMIPC_EINVAL);
    CHECK(shmipc_server_config_set_timeout_ms(cfg, SHMIPC_SERVER_TIMEOUT_WS_PING, 0));
    CHECK(shmipc_server_config_set_timeout_ms(cfg, SHMIPC_SERVER_TIMEOUT_KEEPALIVE, 2500));
    CHECK(shmipc_server_new(cfg, &s));
    assert_int_equal(s->ws_ping_ms, 0);
    assert_int_equal(s->idle_ms, 2500);
    assert_int_equal(s->stall_ms, 2500);
    shmipc_server_close(s);
    shmipc_server_config_free(cfg);
}

/* 200 keep-alive requests on one connection; returns the worker's epoll_ctl calls. */
static uint64_t epoll_ctl_over_200(int backend)
{
    struct srv_opts o = {.backend = backend};
    struct srv t;
    struct rd r;
    struct resp p;
    struct shmipc__server_stats st;

    srv_start(&t, &o);
    rd_open(&r, t.port);
    for (int i = 0; i < 200; i++) {
        exchange(&r, "GET / HTTP/1.1\r\nHost: t\r\n\r\n", &p);
        assert_int_equal(p.status, 200);
        free(p.body);
    }
    rd_close(&r);
    st = srv_stop(&t);
    assert_int_equal(st.requests, 200);
    print_message("%s: 200 keep-alive requests: %llu epoll_ctl, %llu waits\n",
                  backend == SHMIPC_BACKEND_EPOLL ? "persistent" : "one-shot",
                  (unsigned long long)st.loop.epoll_ctl, (unsigned long long)st.loop.waits);
    return st.loop.epoll_ctl;
}

/*
 * The worker's loop registers its wakeup eventfd, the listener and the connection: three
 * epoll_ctl calls in all, whatever the number of requests. The one-shot mode re-arms per
 * request, which shows the counter counts.
 */
static void epoll_ctl_per_request(void **state)
{
    (void)state;
    assert_int_equal(epoll_ctl_over_200(SHMIPC_BACKEND_EPOLL), 3);
    assert_true(epoll_ctl_over_200(SHMIPC_BACKEND_EPOLL_ONESHOT) >= 200);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(config_validation),
        cmocka_unit_test(route_validation),
        cmocka_unit_test(stop_before_run),
        cmocka_unit_test(timeout_knobs),
        cmocka_unit_test(keepalive_requests_knob),
        cmocka_unit_test(server_timeouts_follow_one_rule),
        cmocka_unit_test(epoll_ctl_per_request),
        SERVER_TESTS,
        PENDING_TESTS,
        PORT_TESTS,
    };
    int rc;

    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    raise_fd_limit();
    unsetenv("SHMIPC_REACTOR_BACKEND");
    unsetenv("SHMIPC_RX_EPOLL");
    unsetenv("SHMIPC_HTTP_KEEPALIVE_REQUESTS");
    suite_backend = SHMIPC_BACKEND_EPOLL;
    rc = cmocka_run_group_tests_name("server_epoll", tests, NULL, NULL);
    free(big_body);
    return rc != 0;
}
