/* Description: the io_uring backend: the shared connection suite with io_uring forced, the
 * multishot receive's re-arm after ENOBUFS, and one io_uring_enter per keep-alive request.
 * Exits 77 (skip) where the kernel or a seccomp filter refuses io_uring. */
#include "test_reactor_suite.h"

/* 100 bytes, 10-byte buffers, a ring of 2: the multishot receive runs dry and is re-armed. */
static void rearm_after_enobufs(void **state)
{
    struct shmipc__loop_opts o = suite_opts;
    struct shmipc__loop_stats st;
    (void)state;

    o.recv_buf_size = 10;
    o.recv_buf_count = 2;
    st = sink_100_bytes(&o);
    assert_true(st.enobufs >= 1);
    assert_true(st.recv_rearm >= st.enobufs);
}

/* A keep-alive exchange costs one enter that submits the response and waits for the next
 * request; the test pumps with a timeout, so allow the turns that time out in between. */
static void one_enter_per_request(void **state)
{
    struct shmipc__loop *loop = new_loop();
    struct shmipc__conn *c;
    struct shmipc__loop_stats a, b;
    struct srv s;
    int sp[2];
    (void)state;

    srv_init(&s, loop, SRV_ECHO);
    srv_adopt_pair(&s, sp, &c);
    assert_true(shmipc__loop_run_once(loop, 0) >= 0);
    shmipc__loop_stats(loop, &a);
    for (int i = 0; i < 100; i++) {
        char buf[4];
        write_all(sp[1], "req", 3);
        /* Turn 1 receives and queues the echo; turn 2 submits it (and finds the send's
         * completion or waits for it). */
        PUMP_UNTIL(loop, atomic_load(&s.sent_ok) == i + 1);
        read_exact(sp[1], buf, 3);
    }
    shmipc__loop_stats(loop, &b);
    print_message("io_uring: 100 exchanges: %llu enters, %llu extra submits, %llu completions\n",
                  (unsigned long long)(b.waits - a.waits),
                  (unsigned long long)(b.submits - a.submits),
                  (unsigned long long)(b.events - a.events));
    assert_int_equal(b.submits - a.submits, 0);
    assert_true(b.waits - a.waits <= 300);
    close(sp[1]);
    PUMP_UNTIL(loop, atomic_load(&s.ended) == 1);
    shmipc__loop_free(loop);
}

/* An argument runs only the tests whose names match it (cmocka's filter, * allowed). */
int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        SUITE_TESTS,
        cmocka_unit_test(rearm_after_enobufs),
        cmocka_unit_test(one_enter_per_request),
    };
    struct shmipc__loop *probe = NULL;
    int rc;

    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    unsetenv("SHMIPC_REACTOR_BACKEND");
    suite_opts.backend = SHMIPC__BACKEND_IO_URING;
    rc = shmipc__loop_new(&suite_opts, &probe);
    if (rc != 0) {
        printf("SKIP: io_uring refused here: %s\n", shmipc_error_detail());
        return 77;
    }
    shmipc__loop_free(probe);
    return cmocka_run_group_tests_name("io_uring", tests, NULL, NULL) != 0;
}
