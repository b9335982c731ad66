/* Description: the epoll backend: the shared connection suite, persistent and one-shot, and
 * the epoll_ctl count over 200 keep-alive requests on one connection. */
#include "test_reactor_suite.h"

/* Runs `n` echo exchanges on one connection; returns the epoll_ctl calls the loop made from
 * before the connection existed to after the last response, and those after the first. */
static void count_epoll_ctl(enum shmipc__rx_mode mode, int n, uint64_t *total, uint64_t *after)
{
    struct shmipc__loop_opts o = suite_opts;
    struct shmipc__loop *loop;
    struct shmipc__acceptor *acc;
    struct shmipc__loop_stats before, first, end;
    struct srv s;
    int port, fd;

    o.rx_epoll = mode;
    loop = new_loop_with(&o);
    srv_init(&s, loop, SRV_ECHO);
    port = srv_listen(&s, &acc);
    assert_true(shmipc__loop_run_once(loop, 0) >= 0);
    shmipc__loop_stats(loop, &before);
    fd = connect_to(port, 0);
    for (int i = 0; i < n; i++) {
        char req[9];
        snprintf(req, sizeof req, "GET%05d", i);
        echo_8(&s, fd, req, i + 1);
        if (i == 0)
            shmipc__loop_stats(loop, &first);
    }
    shmipc__loop_stats(loop, &end);
    *total = end.epoll_ctl - before.epoll_ctl;
    *after = end.epoll_ctl - first.epoll_ctl;
    print_message("rx %s: %d requests: %llu epoll_ctl, %llu epoll_wait, %llu events\n",
                  mode == SHMIPC__RX_ONESHOT      ? "one-shot"
                  : mode == SHMIPC__RX_PERSISTENT ? "persistent"
                                                  : "from SHMIPC_RX_EPOLL",
                  n, (unsigned long long)*total, (unsigned long long)(end.waits - before.waits),
                  (unsigned long long)(end.events - before.events));
    close(fd);
    shmipc__loop_free(loop);
}

/* The connection's registration is its only epoll_ctl: none per keep-alive request. */
static void epoll_ctl_once_per_connection(void **state)
{
    uint64_t total, after;
    (void)state;
    count_epoll_ctl(SHMIPC__RX_PERSISTENT, 200, &total, &after);
    assert_int_equal(total, 1);
    assert_int_equal(after, 0);
}

/* SHMIPC_RX_EPOLL=0, the comparison path, re-arms after every read. */
static void oneshot_rearms_per_request(void **state)
{
    uint64_t total, after;
    (void)state;
    count_epoll_ctl(SHMIPC__RX_ONESHOT, 200, &total, &after);
    assert_true(total >= 201);
    assert_true(after >= 199);
}

/* The knob selects the mode when the options leave it open. */
static void rx_knob(void **state)
{
    uint64_t total, after;
    (void)state;
    assert_int_equal(setenv("SHMIPC_RX_EPOLL", "0", 1), 0);
    count_epoll_ctl(SHMIPC__RX_DEFAULT, 10, &total, &after);
    assert_true(total >= 11);
    assert_int_equal(setenv("SHMIPC_RX_EPOLL", "1", 1), 0);
    count_epoll_ctl(SHMIPC__RX_DEFAULT, 10, &total, &after);
    assert_int_equal(total, 1);
    assert_int_equal(unsetenv("SHMIPC_RX_EPOLL"), 0);
}

/* Pausing and resuming reads makes no epoll_ctl: the registration stays as it is. */
static void pause_resume_without_epoll_ctl(void **state)
{
    struct shmipc__loop_opts o = suite_opts;
    struct shmipc__loop *loop;
    struct shmipc__loop_stats before, end;
    struct srv s;
    size_t at = 0;
    int fd;
    (void)state;

    o.rx_epoll = SHMIPC__RX_PERSISTENT;
    loop = new_loop_with(&o);
    srv_init(&s, loop, SRV_SINK);
    s.check_pattern = 1;
    fd = srv_connect_one(&s);
    shmipc__loop_stats(loop, &before);
    for (int i = 0; i < 100; i++) {
        s.pause_on_data = 1;
        write_pattern(fd, &at, at + 1000);
        PUMP_UNTIL(loop, shmipc__conn_read_paused(s.last));
        assert_int_equal(shmipc__conn_resume_read(s.last), 0);
        PUMP_UNTIL(loop, atomic_load(&s.received) == at);
    }
    shmipc__loop_stats(loop, &end);
    assert_int_equal(end.epoll_ctl - before.epoll_ctl, 0);
    assert_int_equal(atomic_load(&s.bad_byte), 0);
    close(fd);
    shmipc__loop_free(loop);
}

/* An argument runs only the tests whose names match it (cmocka's filter, * allowed). */
int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        SUITE_TESTS,
        cmocka_unit_test(epoll_ctl_once_per_connection),
        cmocka_unit_test(oneshot_rearms_per_request),
        cmocka_unit_test(rx_knob),
        cmocka_unit_test(pause_resume_without_epoll_ctl),
    };
    const struct CMUnitTest oneshot_tests[] = {SUITE_TESTS};
    int failed;

    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    unsetenv("SHMIPC_REACTOR_BACKEND");
    unsetenv("SHMIPC_RX_EPOLL");
    suite_opts.backend = SHMIPC__BACKEND_EPOLL;
    suite_opts.rx_epoll = SHMIPC__RX_PERSISTENT;
    failed = cmocka_run_group_tests_name("epoll", tests, NULL, NULL);
    suite_opts.rx_epoll = SHMIPC__RX_ONESHOT;
    failed += cmocka_run_group_tests_name("epoll one-shot (SHMIPC_RX_EPOLL=0)", oneshot_tests, NULL,
                                          NULL);
    return failed != 0;
}
