/*
 * Exported WebSocket calls: argument checks, then the server (core/net/server_ws.c), which owns
 * the connections. The behaviour is documented in shmipc.h and docs/websocket.md.
 */
#include "shmipc.h"

#include "common/error.h"
#include "net/server.h"

SHMIPC_API int shmipc_server_websocket(shmipc_server *s, const char *path, const char *subprotocols,
                                       shmipc_ws_open_cb on_open, shmipc_ws_message_cb on_message,
                                       shmipc_ws_close_cb on_close, void *user_data,
                                       shmipc_destroy_cb destroy)
{
    const char *missing = s == NULL            ? "server"
                          : path == NULL       ? "path"
                          : on_message == NULL ? "on_message"
                                               : NULL;
    if (missing != NULL) {
        if (destroy != NULL)
            destroy(user_data);
        return shmipc__fail(SHMIPC_EINVAL, "server_websocket: %s is NULL", missing);
    }
    return shmipc__server_websocket(s, path, subprotocols, on_open, on_message, on_close, user_data,
                                    destroy);
}

SHMIPC_API int shmipc_ws_send(shmipc_ws *ws, int kind, const void *data, size_t len)
{
    if (ws == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "ws_send: ws is NULL");
    if (data == NULL && len > 0)
        return shmipc__fail(SHMIPC_EINVAL, "ws_send: data is NULL");
    if (kind != SHMIPC_WS_TEXT && kind != SHMIPC_WS_BINARY)
        return shmipc__fail(SHMIPC_EINVAL, "ws_send: kind %d is not SHMIPC_WS_TEXT or _BINARY",
                            kind);
    return shmipc__ws_send(ws, kind, data, len);
}

SHMIPC_API int shmipc_ws_ping(shmipc_ws *ws, const void *data, size_t len)
{
    if (ws == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "ws_ping: ws is NULL");
    if (data == NULL && len > 0)
        return shmipc__fail(SHMIPC_EINVAL, "ws_ping: data is NULL");
    return shmipc__ws_ping(ws, data, len);
}

SHMIPC_API int shmipc_ws_close(shmipc_ws *ws, int code, const char *reason)
{
    if (ws == NULL)
        return shmipc__fail(SHMIPC_EINVAL, "ws_close: ws is NULL");
    return shmipc__ws_close(ws, code, reason);
}

SHMIPC_API const char *shmipc_ws_subprotocol(const shmipc_ws *ws)
{
    return ws != NULL ? ws->subprotocol : NULL;
}

SHMIPC_API void shmipc_ws_set_data(shmipc_ws *ws, void *data)
{
    if (ws != NULL)
        ws->data = data;
}

SHMIPC_API void *shmipc_ws_data(const shmipc_ws *ws)
{
    return ws != NULL ? ws->data : NULL;
}
