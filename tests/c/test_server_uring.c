/* Description: the HTTP server over real sockets with the io_uring backend forced (the shared
 * suite). Exits 77 (skip) where the kernel or a seccomp filter refuses io_uring. */
#include "test_server_suite.h"
#include "test_server_pending.h"
#include "test_server_port.h"

#include "reactor/loop.h"

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        SERVER_TESTS,
        PENDING_TESTS,
        PORT_TESTS,
    };
    struct shmipc__loop_opts o = {.backend = SHMIPC__BACKEND_IO_URING};
    struct shmipc__loop *probe = NULL;
    int rc;

    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    if (shmipc__loop_new(&o, &probe) != 0) {
        printf("SKIP: io_uring refused here: %s\n", shmipc_error_detail());
        return 77;
    }
    shmipc__loop_free(probe);
    raise_fd_limit();
    unsetenv("SHMIPC_REACTOR_BACKEND");
    suite_backend = SHMIPC_BACKEND_IO_URING;
    rc = cmocka_run_group_tests_name("server_io_uring", tests, NULL, NULL);
    free(big_body);
    return rc != 0;
}
