-- luarocks --lua-version 5.4 make --tree <dir>   (Debian: luarocks, liblua5.4-dev, liburing-dev,
-- libffi-dev, found on the compiler's default paths). The module carries libshmipc whole (its C sources compiled in), so the rock needs
-- no installed C library. The version is meson.build's project version (scripts/
-- check-install-lua.sh checks), and the source lists are meson's (the same check).
rockspec_format = "3.0"
package = "shmipc"
version = "0.1.0-1"
source = {
    url = "git+file://.",
}
description = {
    summary = "Shared-memory IPC wire-compatible with shmipc-go, and an io_uring/epoll HTTP server",
    detailed = "require \"shmipc\": sessions, streams, listeners and an HTTP/WebSocket server over libshmipc.",
    license = "Apache-2.0",
}
dependencies = {
    "lua >= 5.4, < 5.5",
}
build = {
    type = "builtin",
    modules = {
        shmipc = {
            sources = {
            "lua/shmipc.c",
            "lua/wait.c",
            "lua/stream.c",
            "lua/session.c",
            "lua/listener.c",
            "lua/abi.c",
            "lua/server.c",
            "bindings/abi.c",
            "bindings/config.c",
            "bindings/error.c",
            "bindings/session.c",
            "bindings/serve.c",
            "bindings/server.c",
            "bindings/ws.c",
            "core/common/env.c",
            "core/common/error.c",
            "core/common/clock.c",
            "core/common/log.c",
            "core/common/version.c",
            "core/ipc/config.c",
            "core/ipc/handshake.c",
            "core/ipc/json.c",
            "core/ipc/listener.c",
            "core/ipc/manager.c",
            "core/ipc/proto.c",
            "core/ipc/session.c",
            "core/ipc/session_cache.c",
            "core/ipc/session_read.c",
            "core/ipc/session_recv.c",
            "core/ipc/session_stream.c",
            "core/ipc/session_wait.c",
            "core/ipc/session_write.c",
            "core/ipc/sockio.c",
            "core/ipc/v4.c",
            "core/ipc/v4probe.c",
            "core/shm/buffer.c",
            "core/shm/guard.c",
            "core/shm/mapping.c",
            "core/shm/queue.c",
            "core/reactor/conn.c",
            "core/reactor/epoll.c",
            "core/reactor/loop.c",
            "core/reactor/sock.c",
            "core/reactor/timer.c",
            "core/reactor/uring.c",
            "core/net/http_conn.c",
            "core/net/http_parser.c",
            "core/net/http_writer.c",
            "core/net/ws_codec.c",
            "core/net/ws_conn.c",
            "core/net/ws_frame.c",
            "core/net/ws_handshake.c",
            "core/net/server.c",
            "core/net/server_config.c",
            "core/net/server_conn.c",
            "core/net/server_route.c",
            "core/net/server_ws.c",
            "core/net/conn_state.c",
            "core/net/serve_frame.c",
            },
            defines = { "_GNU_SOURCE" },
            incdirs = { "bindings", "core", "lua" },
            libraries = { "uring", "ffi", "pthread", "m" },
        },
    },
}
