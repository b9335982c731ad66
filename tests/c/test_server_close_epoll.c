/* Description: close-delimited responses (Connection: close, HTTP/1.0, 4xx/5xx) delivered whole
 * under half-close, slow and stalled readers, with the epoll backend forced (the shared suite). */
#include "test_server_close_suite.h"

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        CLOSE_TESTS,
    };
    int rc;

    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    unsetenv("SHMIPC_REACTOR_BACKEND");
    close_backend = SHMIPC_BACKEND_EPOLL;
    rc = cmocka_run_group_tests_name("server_close_epoll", tests, NULL, NULL);
    free(huge_body);
    return rc != 0;
}
