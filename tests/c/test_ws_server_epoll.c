/* Description: the WebSocket server over real sockets with the epoll backend forced: every
 * tests/ws fixture through a server, backpressure, routing and a graceful stop (the shared
 * suite, test_ws_server_suite.h). Usage: test_ws_server_epoll [FIXTURE_DIR] */
#include "test_ws_server_suite.h"

int main(int argc, char **argv)
{
    unsetenv("SHMIPC_REACTOR_BACKEND");
    suite_backend = SHMIPC_BACKEND_EPOLL;
    return ws_server_main(argc, argv, "ws_server_epoll");
}
