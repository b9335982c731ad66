-- Description: srv:websocket(): echo of text and binary messages (small, 64 KiB+, fragmented)
-- through a raw-socket client, subprotocols, on_open refusing or raising (403), on_message
-- raising (logged, the connection goes on), ws:close/ping from the server, the ws handle raising
-- after on_close, sends outside a callback refused, both backends, misuse, and the client's close
-- code when it closes or resets its socket right behind its close frame. The client is
-- lua-socket in this process (tests/lua/server_support.lua); without it the file skips.
local shmipc = require "shmipc"

local E = shmipc.errors
local has_socket = pcall(require, "socket")
if not has_socket then
    print("# skip test_server_ws.lua: lua-socket is not installed (apt-get install lua-socket)")
    return { skipped_without_lua_socket = function() end }
end
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local client = dofile(here .. "/server_support.lua")

local tests = {}

local function new_server(opts)
    local errors = {}
    opts = opts or {}
    opts.port = 0
    opts.workers = opts.workers or 2
    opts.on_error = function(msg)
        errors[#errors + 1] = msg
    end
    return assert(shmipc.server(opts)), errors
end

-- An echo route on /echo that records its events in `log`.
local function echo_route(srv, log, extra)
    local handlers = {
        on_open = function(ws, req)
            log[#log + 1] = "open " .. req.path .. " " .. tostring(ws:subprotocol())
            log.ws = ws
        end,
        on_message = function(ws, data, kind)
            log.same = (log.same ~= false) and rawequal(log.ws, ws)
            assert(ws:send(data, kind))
        end,
        on_close = function(ws, code, reason)
            log[#log + 1] = string.format("close %d %s", code, reason)
            log.closed = ws
        end,
    }
    for k, v in pairs(extra or {}) do
        handlers[k] = v
    end
    assert(srv:websocket("/echo", handlers))
end

-- Waits (releasing the gate) until `cond()` holds.
local function wait_for(cond, what)
    local deadline = shmipc.monotime() + 10
    while not cond() do
        assert(shmipc.monotime() < deadline, "timed out waiting for " .. what)
        shmipc.poll({}, 0.01)
    end
end

for _, backend in ipairs({ "epoll", "io_uring" }) do
    tests["echo_" .. backend] = function(t)
        local srv <close>, errors = new_server({ backend = backend })
        local log = {}
        echo_route(srv, log)
        local ok, msg, code = srv:start()
        if not ok and backend == "io_uring" and (code == E.EACCES or code == E.ENOTSUP) then
            print("# skip echo_io_uring: " .. msg)
            return
        end
        t.truthy(ok, msg)
        t.eq(srv:backend(), backend, "backend")
        local c, status, head = client.ws_connect(srv:port(), "/echo")
        t.eq(status, 101, "upgrade: " .. head)
        t.truthy(head:find("Sec-WebSocket-Accept: " .. client.WS_ACCEPT, 1, true), head)

        c:ws_send("text", "hello")
        local kind, data = c:ws_recv()
        t.eq(kind, "text", "kind")
        t.eq(data, "hello", "text echo")

        local bin = "\0\1\2\255binary"
        c:ws_send("binary", bin)
        kind, data = c:ws_recv()
        t.eq(kind, "binary", "binary kind")
        t.eq(data, bin, "binary echo")

        local big = string.rep("0123456789abcdef", 70000 // 16 + 1)
        c:ws_send("binary", big)
        kind, data = c:ws_recv()
        t.eq(#data, #big, "large echo length")
        t.eq(data, big, "large echo")

        -- A fragmented message reaches on_message whole.
        c:ws_send("text", "frag", false)
        c:ws_send(0, "ment", false)
        c:ws_send(0, "ed", true)
        kind, data = c:ws_recv()
        t.eq(data, "fragmented", "reassembled")

        c:ws_send("close", string.pack(">I2", 1000) .. "done")
        kind, data = c:ws_recv()
        t.eq(kind, "close", "close answered")
        t.eq(string.unpack(">I2", data), 1000, "close code")
        wait_for(function()
            return log.closed
        end, "on_close")
        c:close()
        t.eq(log[1], "open /echo nil", "on_open")
        t.eq(log[2], "close 1000 done", "on_close")
        t.truthy(log.same, "one handle per connection")
        t.raises("attempt to use a closed shmipc.ws", log.closed.send, log.closed, "late")
        t.raises("closed shmipc.ws", log.closed.subprotocol, log.closed)
        t.eq(tostring(log.closed), "shmipc.ws (closed)", "tostring")
        t.eq(#errors, 0, "no errors: " .. table.concat(errors, "\n"))
    end
end

function tests.subprotocols(t)
    local srv <close> = new_server()
    local log = {}
    assert(srv:websocket("/p", {
        subprotocols = { "chat", "echo" },
        on_open = function(ws)
            log[#log + 1] = tostring(ws:subprotocol())
        end,
        on_message = function(ws, data)
            ws:send(ws:subprotocol() or "none")
        end,
    }))
    assert(srv:websocket("/q", { subprotocols = "v2,v1", on_message = function() end }))
    assert(srv:start())
    local c, status, head = client.ws_connect(srv:port(), "/p", "echo, chat")
    t.eq(status, 101, "upgrade")
    t.truthy(head:find("Sec-WebSocket-Protocol: chat", 1, true), head)
    c:ws_send("text", "?")
    local _, data = c:ws_recv()
    t.eq(data, "chat", "the server's preference")
    c:close()
    c, status, head = client.ws_connect(srv:port(), "/p")
    t.eq(status, 101, "upgrade without a subprotocol")
    t.eq(head:find("Sec-WebSocket-Protocol", 1, true), nil, "none chosen")
    c:close()
    c, status, head = client.ws_connect(srv:port(), "/q", "v1")
    t.truthy(head:find("Sec-WebSocket-Protocol: v1", 1, true), "string list: " .. head)
    c:close()
    t.eq(log[1], "chat", "subprotocol in on_open")
    t.eq(log[2], "nil", "none")
end

function tests.on_open_refuses(t)
    local srv <close>, errors = new_server()
    local messages = 0
    assert(srv:websocket("/ws", {
        on_open = function(ws, req)
            if req.query == "no" then
                return false
            elseif req.query == "raise" then
                error("refused by raising")
            end
            t.eq(req:header("x-token"), "secret", "request header in on_open")
        end,
        on_message = function()
            messages = messages + 1
        end,
    }))
    assert(srv:start())
    local c, status = client.ws_connect(srv:port(), "/ws?no")
    t.eq(status, 403, "false refuses")
    c:close()
    c, status = client.ws_connect(srv:port(), "/ws?raise")
    t.eq(status, 403, "raising refuses")
    c:close()
    t.eq(#errors, 1, "one error")
    t.truthy(errors[1]:find("WebSocket /ws on_open: ", 1, true), errors[1])
    t.truthy(errors[1]:find("refused by raising", 1, true), errors[1])
    c, status = client.ws_connect(srv:port(), "/ws?yes", nil, { "X-Token: secret" })
    t.eq(status, 101, "accepted")
    c:close()
    t.eq(#errors, 1, "header check passed")
end

function tests.on_message_raises_connection_goes_on(t)
    local srv <close>, errors = new_server()
    assert(srv:websocket("/ws", {
        on_message = function(ws, data)
            if data == "boom" then
                error("bad message")
            end
            ws:send("ok " .. data)
        end,
    }))
    assert(srv:start())
    local c, status = client.ws_connect(srv:port(), "/ws")
    t.eq(status, 101, "upgrade")
    c:ws_send("text", "boom")
    c:ws_send("text", "after")
    local _, data = c:ws_recv()
    t.eq(data, "ok after", "still served")
    c:close()
    t.truthy(errors[1] and errors[1]:find("WebSocket /ws on_message: ", 1, true), tostring(errors[1]))
    t.truthy(errors[1]:find("bad message", 1, true), errors[1])
end

function tests.server_close_ping_and_errors(t)
    local srv <close>, errors = new_server()
    local kept, results, closed = nil, {}, nil
    assert(srv:websocket("/ws", {
        on_message = function(ws, data)
            kept = ws
            if data == "ping" then
                assert(ws:ping("p!"))
            elseif data == "bad-utf8" then
                results[#results + 1] = { ws:send("\255\254", "text") }
                results[#results + 1] = { pcall(ws.send, ws, "x", "bogus") }
                results[#results + 1] = { ws:close(999) }
                results[#results + 1] = { ws:ping(string.rep("x", 126)) }
            elseif data == "close" then
                assert(ws:close(4000, "server says bye"))
                results[#results + 1] = { ws:send("too late") }
            end
        end,
        on_close = function(ws, code, reason)
            closed = { code, reason }
        end,
    }))
    assert(srv:start())
    local c, status = client.ws_connect(srv:port(), "/ws")
    t.eq(status, 101, "upgrade")
    c:ws_send("text", "ping")
    local kind, data = c:ws_recv()
    t.eq(kind, "ping", "server ping")
    t.eq(data, "p!", "ping payload")

    c:ws_send("text", "bad-utf8")
    wait_for(function()
        return #results == 4
    end, "results")
    t.eq(results[1][1], nil, "invalid UTF-8 refused")
    t.eq(results[1][3], E.EINVAL, "EINVAL")
    t.eq(results[2][1], false, "bad kind raises")
    t.truthy(tostring(results[2][2]):find("invalid option 'bogus'", 1, true), tostring(results[2][2]))
    t.eq(results[3][3], E.EINVAL, "close code refused")
    t.eq(results[4][3], E.EINVAL, "ping too long")

    -- Outside a callback the connection cannot be used: the library says EBUSY.
    local v, msg, code = kept:send("from the Lua side")
    t.eq(v, nil, "send outside a callback")
    t.eq(code, E.EBUSY, "EBUSY: " .. tostring(msg))

    c:ws_send("text", "close")
    kind, data = c:ws_recv()
    t.eq(kind, "close", "server close")
    t.eq(string.unpack(">I2", data), 4000, "its code")
    t.eq(data:sub(3), "server says bye", "its reason")
    c:ws_send("close", string.pack(">I2", 4000))
    wait_for(function()
        return closed
    end, "on_close")
    t.eq(results[5][3], E.EPIPE, "send once closing")
    t.eq(closed[1], 4000, "peer's close code")
    c:close()
    t.raises("closed shmipc.ws", kept.ping, kept)
    t.eq(#errors, 0, "no errors: " .. table.concat(errors, "\n"))
end

function tests.dropped_connection_is_1006(t)
    local srv <close> = new_server()
    local closed
    assert(srv:websocket("/ws", {
        on_message = function() end,
        on_close = function(ws, code)
            closed = code
        end,
    }))
    assert(srv:start())
    local c, status = client.ws_connect(srv:port(), "/ws")
    t.eq(status, 101, "upgrade")
    c:close()
    wait_for(function()
        return closed
    end, "on_close")
    t.eq(closed, 1006, "no close frame")
end

-- The client's close frame (4001 "bye") with its TCP connection gone right behind it (RFC 6455
-- 7.1.5: the frame's code is the close's; 7.4.1: 1006 only for a close without one), while the
-- server reads the client, and while it does not: the handler's 8 MiB answer to "big" waits for
-- a client that read one byte of it, so the client's next message made the server stop reading
-- it (backpressure). Then close() is a reset that fails the server's send, and a FIN is heard
-- while paused and the stall timeout (keep-alive, 0.3 s) gives the client up. on_close got 1006
-- in those: the server closed without reading the frame. Both backends.
for _, backend in ipairs({ "epoll", "io_uring" }) do
    tests["close_frame_then_gone_is_its_code_" .. backend] = function(t)
        local srv <close>, errors =
            new_server({ backend = backend, workers = 1, keepalive_timeout = 0.3 })
        local closed = {}
        assert(srv:websocket("/ws", {
            on_message = function(ws, data)
                if data == "big" then
                    assert(ws:send(string.rep("b", 8 << 20), "binary"))
                elseif data == "hi" then
                    assert(ws:send(data, "text"))
                end
            end,
            on_close = function(ws, code, reason)
                closed[#closed + 1] = code .. " " .. reason
            end,
        }))
        local ok, msg, code = srv:start()
        if not ok and backend == "io_uring" and (code == E.EACCES or code == E.ENOTSUP) then
            print("# skip close_frame_then_gone_is_its_code_io_uring: " .. msg)
            return
        end
        t.truthy(ok, msg)
        for _, paused in ipairs({ false, true }) do
            for _, how in ipairs({ "close", "reset", "fin" }) do
                local what = how .. (paused and ", paused" or ", reading")
                local c, status = client.ws_connect(srv:port(), "/ws")
                t.eq(status, 101, "upgrade")
                -- Each write leaves at once: a reset drops what the client's kernel holds.
                c.sock:setoption("tcp-nodelay", true)
                if paused then
                    c:ws_send("text", "big")
                    t.truthy(c:read(1), "the message is queued")
                    c:ws_send("text", "after")
                    shmipc.poll({}, 0.1)
                else
                    c:ws_send("text", "hi")
                    t.eq(select(2, c:ws_recv()), "hi", "echo")
                end
                c:ws_send("close", string.pack(">I2", 4001) .. "bye")
                if how == "fin" then
                    c.sock:shutdown("send")
                else
                    if how == "reset" then
                        c.sock:setoption("linger", { on = true, timeout = 0 })
                    end
                    c:close()
                end
                wait_for(function()
                    return #closed == 1
                end, "on_close, " .. what)
                if how == "fin" then
                    c:close()
                end
                t.eq(closed[1], "4001 bye", what)
                closed[1] = nil
            end
        end
        t.eq(#errors, 0, "no errors: " .. table.concat(errors, "\n"))
    end
end

function tests.stop_from_ws_handler_and_plain_get(t)
    local srv <close> = new_server()
    assert(srv:websocket("/ws", {
        on_message = function(ws, data)
            if data == "stop" then
                srv:stop()
            end
        end,
    }))
    assert(srv:static("/ws", "plain GET"))
    assert(srv:start())
    t.eq(client.fetch(srv:port(), "GET", "/ws").body, "plain GET", "a GET route on the same path")
    local c, status = client.ws_connect(srv:port(), "/ws")
    t.eq(status, 101, "upgrade")
    c:ws_send("text", "stop")
    t.eq(srv:run(), true, "run returns after stop() from on_message")
    c:close()
end

function tests.max_ws_message(t)
    local srv <close> = new_server({ max_ws_message = 100 })
    local closed
    assert(srv:websocket("/ws", {
        on_message = function(ws, data)
            ws:send(data)
        end,
        on_close = function(ws, code)
            closed = code
        end,
    }))
    assert(srv:start())
    local c, status = client.ws_connect(srv:port(), "/ws")
    t.eq(status, 101, "upgrade")
    c:ws_send("text", string.rep("a", 100))
    local _, data = c:ws_recv()
    t.eq(#data, 100, "at the limit")
    c:ws_send("text", string.rep("a", 101))
    local kind
    kind, data = c:ws_recv()
    t.eq(kind, "close", "over the limit")
    t.eq(string.unpack(">I2", data), 1009, "1009")
    c:close()
    wait_for(function()
        return closed
    end, "on_close")
    t.refused(E.EINVAL, "", shmipc.server({ max_ws_message = 1 << 40 }))
end

function tests.misuse(t)
    local srv <close> = new_server()
    t.raises("on_message is a nil", srv.websocket, srv, "/ws", {})
    t.raises("on_open is a string", srv.websocket, srv, "/ws", { on_message = print, on_open = "x" })
    t.raises("subprotocol 1 is a number", srv.websocket, srv, "/ws", { on_message = print, subprotocols = { 1 } })
    t.raises("table expected", srv.websocket, srv, "/ws", print)
    assert(srv:websocket("/ws", { on_message = print }))
    t.refused(E.EEXIST, "", srv:websocket("/ws", { on_message = print }))
    t.refused(E.EINVAL, "", srv:websocket("no-slash", { on_message = print }))
    assert(srv:start())
    t.refused(E.EBUSY, "", srv:websocket("/late", { on_message = print }))
end

return tests
