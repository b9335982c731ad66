/* Description: the HTTP server over real sockets with the epoll backend forced (the shared
 * suite), the server config's validation, the SHMIPC_HTTP_* knobs, and the epoll_ctl count of
 * 200 keep-alive requests through the server: none after the connection's registration. */
#include "test_server_suite.h"
#include "test_server_port.h"

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
    shmipc_server_free(s); /* stops the running server, then destroys the three routes */
    assert_int_equal(atomic_load(&destroys), before + 3);
    shmipc_server_free(NULL);
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
    shmipc_server_free(s);
}

/* The timeout knobs are read at server creation; bad values are refused naming them. */
static void timeout_knobs(void **state)
{
    shmipc_server *s;
    (void)state;
    setenv("SHMIPC_HTTP_HEADER_TIMEOUT_MS", "soon", 1);
    assert_int_equal(shmipc_server_new(NULL, &s), SHMIPC_EINVAL);
    assert_non_null(strstr(shmipc_error_detail(), "SHMIPC_HTTP_HEADER_TIMEOUT_MS"));
    setenv("SHMIPC_HTTP_HEADER_TIMEOUT_MS", "250", 1);
    setenv("SHMIPC_HTTP_KEEPALIVE_TIMEOUT_MS", "0", 1);
    assert_int_equal(shmipc_server_new(NULL, &s), SHMIPC_EINVAL);
    assert_non_null(strstr(shmipc_error_detail(), "SHMIPC_HTTP_KEEPALIVE_TIMEOUT_MS"));
    setenv("SHMIPC_HTTP_KEEPALIVE_TIMEOUT_MS", "1000", 1);
    CHECK(shmipc_server_new(NULL, &s));
    assert_int_equal(s->header_ms, 250);
    assert_int_equal(s->keepalive_ms, 1000);
    shmipc_server_free(s);
    unsetenv("SHMIPC_HTTP_HEADER_TIMEOUT_MS");
    unsetenv("SHMIPC_HTTP_KEEPALIVE_TIMEOUT_MS");
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
        cmocka_unit_test(epoll_ctl_per_request),
        SERVER_TESTS,
        PORT_TESTS,
    };
    int rc;

    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    raise_fd_limit();
    unsetenv("SHMIPC_REACTOR_BACKEND");
    unsetenv("SHMIPC_RX_EPOLL");
    suite_backend = SHMIPC_BACKEND_EPOLL;
    rc = cmocka_run_group_tests_name("server_epoll", tests, NULL, NULL);
    free(big_body);
    return rc != 0;
}
