-- Run: LUA_CPATH='build/lua/?.so;;' lua5.4 examples/lua/ws_echo.lua [PORT [WORKERS]]
--      (from the source tree; PORT 8080 by default, 0 for any), then connect a WebSocket
--      client to ws://127.0.0.1:8080/echo (subprotocol "echo" offered) and send messages.
--
-- ws_echo.lua: a WebSocket echo server on shmipc.server. Each message comes back with its
-- kind (text or binary); the message "close" makes the server close that connection with
-- 1000 "bye", and "shutdown" stops the server. GET / answers a static page. The callbacks
-- run one at a time, on the server's worker threads, so `open` needs no lock.
local shmipc = require "shmipc"

local port = tonumber(arg[1] or "8080")
local workers = tonumber(arg[2] or "0")

local srv <close> = assert(shmipc.server { port = port, workers = workers })
assert(srv:static("/", "WebSocket echo on /echo\n", "text/plain"))

local open, total = 0, 0
assert(srv:websocket("/echo", {
    subprotocols = { "echo" },
    on_open = function(ws, req)
        open = open + 1
        print(string.format("ws_echo: open from %s (subprotocol %s), %d open",
            req:header("user-agent") or "?", ws:subprotocol() or "none", open))
        io.stdout:flush()
    end,
    on_message = function(ws, data, kind)
        total = total + 1
        if data == "close" then
            ws:close(1000, "bye")
        elseif data == "shutdown" then
            srv:stop()
        else
            assert(ws:send(data, kind))
        end
    end,
    on_close = function(ws, code, reason)
        open = open - 1
        print(string.format("ws_echo: closed %d %q, %d open", code, reason, open))
        io.stdout:flush()
    end,
}))

assert(srv:start())
print(string.format("ws_echo: listening on ws://127.0.0.1:%d/echo (%s)", srv:port(), srv:backend()))
io.stdout:flush()
-- SIGINT and SIGTERM stop it as "shutdown" does: gracefully, and the script ends with 0.
local _, signal = assert(srv:run { signals = true })
print("ws_echo: stopped" .. (signal and " by " .. signal or "") .. " after " .. total .. " messages")
