-- Description: the server side: a Lua listener against the C greeter client (V3 and V2),
-- accept with timeouts, and serve() with Lua callbacks: echo for several clients, stop from a
-- callback, callbacks that raise, close inside a callback, and the streams serve() closes.
local shmipc = require "shmipc"
local support = dofile((debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or ".") .. "/ipc_support.lua")

local E = shmipc.errors
local tests = {}

-- Serves one greeter client on `l`: accept, read the request, reply, wait for its end.
-- Returns the session's protocol version.
local function serve_greeter(t, l)
    local s <close> = t.ok(l:accept(10))
    local st <close> = t.ok(s:accept_stream(10))
    t.eq(st:read(#support.REQUEST), support.REQUEST, "request")
    t.ok(st:write(support.REPLY):flush())
    local rest, code = support.read_all(st)
    t.eq(rest, "", "nothing after the request")
    t.truthy(code == E.EEOF or code == E.ECONNRESET, "the client hung up: " .. tostring(code))
    return s:version()
end

function tests.greeter_client_v3(t)
    local address = support.address("lgreet3")
    local l <close> = t.ok(shmipc.listen(address))
    local client <close> = support.greeter_client(address, "v3")
    serve_greeter(t, l)
    local ok, out = client:finish()
    t.truthy(ok, "greeter_client exit: " .. out)
    t.truthy(out:find("client stream receive response " .. support.REPLY, 1, true), out)
    t.truthy(out:find("protocol V3", 1, true), out)
end

function tests.greeter_client_v2(t)
    local address = support.address("lgreet2")
    local l <close> = t.ok(shmipc.listen(address))
    local client <close> = support.greeter_client(address, "v2")
    serve_greeter(t, l)
    local ok, out = client:finish()
    t.truthy(ok, "greeter_client exit: " .. out)
    t.truthy(out:find("protocol V2", 1, true), out)
end

function tests.greeter_client_v4_eventfd(t)
    local address = support.address("lgreet4")
    local l <close> = t.ok(shmipc.listen(address))
    local client <close> = support.greeter_client(address, "v4-eventfd")
    local version = serve_greeter(t, l)
    t.truthy(client:finish(), "greeter_client exit")
    t.eq(version, 4, "version")
end

function tests.server_without_v4(t)
    -- A V4 client with fallback gets legacy from a listener that refuses V4.
    local address = support.address("lnov4")
    local l <close> = t.ok(shmipc.listen(address, { server_v4 = false }))
    local client <close> = support.greeter_client(address, "v4-eventfd")
    local version = serve_greeter(t, l)
    local ok, out = client:finish()
    t.truthy(ok, "greeter_client exit: " .. out)
    t.eq(version, 3, "version after the fallback")
end

function tests.accept_timeouts(t)
    local l <close> = t.ok(shmipc.listen(support.address("acc")))
    t.refused(E.EAGAIN, "", l:accept(0))
    t.refused(E.EAGAIN, "", l:accept(nil, "nb"))
    local t0 = shmipc.monotime()
    t.refused(E.ETIMEDOUT, "", l:accept(0.05))
    t.truthy(shmipc.monotime() - t0 >= 0.04, "waited")
    t.eq(math.type(l:fileno()), "integer", "fileno")
    t.eq(l:pollfd(), l:fileno(), "pollfd")
end

function tests.accept_stream_timeouts(t)
    local address = support.address("accst")
    local l <close> = t.ok(shmipc.listen(address))
    local client <close> = support.greeter_client(address)
    local s <close> = t.ok(l:accept(10))
    -- The client's stream shows up with its first message; until then there is none, or it
    -- is already there: either way accept_stream(0) does not wait.
    local st, _, code = s:accept_stream(0)
    if st == nil then
        t.eq(code, E.EAGAIN, "accept_stream(0)")
        st = t.ok(s:accept_stream(10))
    end
    t.refused(E.ENOTSUP, "only clients open streams", s:open_stream())
    t.eq(st:read(#support.REQUEST), support.REQUEST, "request")
    t.ok(st:write(support.REPLY):flush())
    t.truthy(client:finish(), "client exit")
    st:close()
end

function tests.listen_failures(t)
    local address = support.address("inuse")
    local l <close> = t.ok(shmipc.listen(address))
    t.refused(E.EADDRINUSE, "", shmipc.listen(address))
    t.refused(E.EINVAL, "", shmipc.listen("nonsense"))
    t.refused(E.EINVAL, "queue_capacity", shmipc.listen(support.address("q"), { queue_capacity = 8 }))
end

-- Echoes 25-byte greeter requests with the reply; counts ended streams; stops after `n`.
local function greeter_handlers(l, n, log)
    log = log or {}
    log.streams, log.ended, log.requests = 0, 0, 0
    local function on_stream(st)
        log.streams = log.streams + 1
    end
    local function on_data(st)
        while true do
            local req, _, code = st:read(#support.REQUEST, "nb")
            if req == nil then
                if code ~= E.EAGAIN then
                    st:close()
                    log.ended = log.ended + 1
                    if log.ended == n then
                        assert(l:stop())
                    end
                end
                return
            end
            log.requests = log.requests + 1
            assert(req == support.REQUEST, req)
            assert(st:write(support.REPLY):flush())
        end
    end
    return on_stream, on_data, log
end

function tests.serve_several_clients(t)
    local address = support.address("serve")
    local l <close> = t.ok(shmipc.listen(address))
    local clients = {}
    for i = 1, 3 do
        clients[i] = support.greeter_client(address, i == 2 and "v2" or "v3")
    end
    local on_stream, on_data, log = greeter_handlers(l, 3)
    t.eq(l:serve(on_stream, on_data), true, "serve result")
    t.eq(log.streams, 3, "streams")
    t.eq(log.requests, 3, "requests")
    t.eq(log.ended, 3, "ended")
    for i = 1, 3 do
        local ok, out = clients[i]:finish()
        t.truthy(ok, "client " .. i .. ": " .. out)
        t.truthy(out:find(support.REPLY, 1, true), out)
    end
    -- The listener serves again after a stop.
    local again = support.greeter_client(address)
    on_stream, on_data, log = greeter_handlers(l, 1)
    t.ok(l:serve(nil, on_data))
    t.eq(log.requests, 1, "requests of the second serve")
    t.truthy(again:finish(), "client of the second serve")
end

function tests.callback_error_is_raised_by_serve(t)
    local address = support.address("raise")
    local l <close> = t.ok(shmipc.listen(address))
    local client <close> = support.greeter_client(address)
    local calls = 0
    local err = t.raises("boom from on_data", l.serve, l, nil, function(st)
        calls = calls + 1
        error("boom from on_data")
    end)
    t.truthy(tostring(err):find("test_listener.lua", 1, true), "error keeps its position: " .. tostring(err))
    t.eq(calls, 1, "no callback after the error")
    -- The client's session was closed by the stopped server.
    local ok = client:finish()
    t.eq(ok, nil, "client failed")
    -- The listener still works.
    local c2 <close> = support.greeter_client(address)
    serve_greeter(t, l)
    t.truthy(c2:finish(), "next client")
end

function tests.on_stream_error_keeps_its_value(t)
    local address = support.address("raise2")
    local l <close> = t.ok(shmipc.listen(address))
    local client <close> = support.greeter_client(address)
    local marker = { "a table as the error" }
    local kept
    local ok, err = pcall(l.serve, l, function(st)
        kept = st
        error(marker)
    end, function() end)
    t.eq(ok, false, "serve raised")
    t.eq(err, marker, "the very error value")
    t.eq(tostring(kept), "shmipc.stream (closed)", "serve closed the stream it handed out")
    t.raises("attempt to use a closed shmipc.stream", kept.read, kept, 1)
    client:finish()
end

function tests.serve_closes_streams_still_open(t)
    local address = support.address("keep")
    local l <close> = t.ok(shmipc.listen(address))
    local client <close> = support.greeter_client(address)
    local kept = {}
    t.ok(l:serve(function(st)
        kept[#kept + 1] = st
    end, function(st)
        local req, _, code = st:read(#support.REQUEST, "nb")
        if req then
            assert(st:write(support.REPLY):flush())
        elseif code ~= E.EAGAIN then
            l:stop() -- the client hung up; the stream is left open
        end
    end))
    t.eq(#kept, 1, "one stream")
    t.eq(tostring(kept[1]), "shmipc.stream (closed)", "closed by serve")
    t.truthy(client:finish(), "the client got its reply")
end

function tests.yield_inside_a_callback_raises(t)
    local address = support.address("cbyield")
    local l <close> = t.ok(shmipc.listen(address))
    local client <close> = support.greeter_client(address)
    local co = coroutine.wrap(function()
        return pcall(l.serve, l, nil, function(st)
            st:read(1, "yield")
        end)
    end)
    local ok, err = co()
    t.eq(ok, false, "serve raised")
    t.truthy(tostring(err):find("cannot yield here", 1, true), tostring(err))
    client:finish()
end

function tests.close_inside_a_callback(t)
    local address = support.address("cbclose")
    local l = t.ok(shmipc.listen(address))
    local client <close> = support.greeter_client(address)
    t.ok(l:serve(nil, function(st)
        l:close()
        l:close() -- twice is fine
        t.raises("attempt to use a closed shmipc.listener", l.stop, l)
    end))
    t.eq(tostring(l), "shmipc.listener (closed)", "closed when serve returned")
    t.raises("attempt to use a closed shmipc.listener", l.accept, l, 0)
    client:finish()
    -- The address is free again.
    local again <close> = t.ok(shmipc.listen(address))
end

function tests.shutdown_inside_a_callback(t)
    local address = support.address("cbshut")
    local l <close> = t.ok(shmipc.listen(address))
    local client <close> = support.greeter_client(address)
    t.refused(E.ECLOSED, "shut down", l:serve(function(st)
        t.eq(l:shutdown(), true, "shutdown")
        t.eq(l:shutdown(), true, "twice is fine")
        st:close()
    end, function() end))
    t.refused(E.ECLOSED, "shut down", l:accept(0))
    t.refused(E.ECLOSED, "shut down", l:accept(5))
    t.refused(E.ECLOSED, "shut down", l:serve(nil, function() end))
    client:finish()
    l:close()
    t.eq(l:shutdown(), true, "a no-op once closed")
end

function tests.serve_misuse(t)
    local l <close> = t.ok(shmipc.listen(support.address("smisuse")))
    t.raises("function expected", l.serve, l, nil, nil)
    t.raises("function expected", l.serve, l, 42, function() end)
    t.raises("function expected", l.serve, l, function() end)
    t.raises("shmipc.listener expected", l.serve, {}, nil, function() end)
    -- A nested serve of the same listener is refused from inside a callback.
    local address = support.address("nested")
    local l2 <close> = t.ok(shmipc.listen(address))
    local client <close> = support.greeter_client(address)
    t.raises("already serving", l2.serve, l2, function()
        l2:serve(nil, function() end)
    end, function() end)
    client:finish()
end

function tests.stop_before_serve(t)
    local l <close> = t.ok(shmipc.listen(support.address("stop")))
    t.eq(l:stop(), true, "stop")
    -- A stop before serve makes the next serve return at once.
    t.eq(l:serve(nil, function() end), true, "serve returned")
    t.eq(getmetatable(l).__name, "shmipc.listener", "__name")
end

return tests
