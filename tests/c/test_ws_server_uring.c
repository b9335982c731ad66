/* Description: the WebSocket server over real sockets with the io_uring backend forced (the
 * shared suite, test_ws_server_suite.h). Exits 77 (skip) where the kernel or a seccomp filter
 * refuses io_uring. Usage: test_ws_server_uring [FIXTURE_DIR] */
#include "test_ws_server_suite.h"

#include "reactor/loop.h"

int main(int argc, char **argv)
{
    struct shmipc__loop_opts o = {.backend = SHMIPC__BACKEND_IO_URING};
    struct shmipc__loop *probe = NULL;
    if (shmipc__loop_new(&o, &probe) != 0) {
        printf("SKIP: io_uring refused here: %s\n", shmipc_error_detail());
        return 77;
    }
    shmipc__loop_free(probe);
    unsetenv("SHMIPC_REACTOR_BACKEND");
    suite_backend = SHMIPC_BACKEND_IO_URING;
    return ws_server_main(argc, argv, "ws_server_uring");
}
