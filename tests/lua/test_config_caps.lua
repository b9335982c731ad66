-- Description: the config settings that bound what a peer may do (peer_uids, socket_mode,
-- max_pending_streams, max_fallback_unread) and the server's WebSocket options
-- (ws_ping_timeout, ws_idle_timeout, ws_send_high_water, ws_send_limit): defaults, good and bad
-- values, the nil, message, code convention and misuse raising, and that each takes effect on
-- a real listener, session or WebSocket connection. Clients that must handshake with a
-- listener of this process run as Lua peers (a handshake blocks one Lua state); the WebSocket
-- client is lua-socket in this process, and those cases skip without it.
local shmipc = require "shmipc"
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local support = dofile(here .. "/ipc_support.lua")

local E = shmipc.errors
local tests = {}

local function set(t, cfg, ...)
    local v, msg, code = ...
    if v == nil then
        error(string.format("setter failed: %s (%s)", tostring(msg), tostring(code)), 2)
    end
    t.eq(v, cfg, "setter result")
end

-- Our real uid, from /proc (the module has no getuid, and Lua no posix).
local function my_uid()
    local f = assert(io.open("/proc/self/status"))
    local uid
    for line in f:lines() do
        uid = uid or tonumber(line:match("^Uid:%s+(%d+)"))
    end
    f:close()
    assert(uid, "no Uid line in /proc/self/status")
    return uid
end

-- ---- values ----------------------------------------------------------------------------

function tests.defaults(t)
    local cfg = shmipc.config()
    t.eq(#cfg:peer_uids(), 0, "no allow-list")
    t.eq(cfg:socket_mode(), tonumber("600", 8), "socket_mode")
    t.eq(cfg:max_pending_streams(), 4096, "max_pending_streams")
    t.eq(cfg:max_fallback_unread(), 128 << 20, "max_fallback_unread")
end

function tests.peer_uids(t)
    local cfg = shmipc.config()
    set(t, cfg, cfg:peer_uids({ 0, 1000, 4294967294 }))
    t.eq(table.concat(cfg:peer_uids(), ","), "0,1000,4294967294", "peer_uids")
    local many = {}
    for i = 1, 64 do
        many[i] = i
    end
    set(t, cfg, cfg:peer_uids(many))
    t.eq(#cfg:peer_uids(), 64, "64 uids")
    set(t, cfg, cfg:peer_uids({ 5 }))
    many[65] = 65
    t.refused(E.EINVAL, "peer_uids: 65 uids, at most 64", cfg:peer_uids(many))
    t.refused(E.EINVAL, "peer_uids: uid 0 is -1", cfg:peer_uids({ 4294967295 }))
    t.refused(E.EINVAL, "peer_uids: entry 2 is -1, outside 0..4294967294", cfg:peer_uids({ 1, -1 }))
    t.refused(E.EINVAL, "peer_uids: entry 1 is 4294967296", cfg:peer_uids({ 1 << 32 }))
    t.eq(table.concat(cfg:peer_uids(), ","), "5", "unchanged after refusals")
    t.raises("table expected, got number", cfg.peer_uids, cfg, 1000)
    t.raises("table expected, got nil", cfg.peer_uids, cfg, nil)
    t.raises("peer_uids: entry 1 is a string, not an integer uid", cfg.peer_uids, cfg, { "1000" })
    t.raises("peer_uids: entry 2 is a float", cfg.peer_uids, cfg, { 1, 1.5 })
    set(t, cfg, cfg:peer_uids({ 7.0 }))
    t.eq(cfg:peer_uids()[1], 7, "an integral float")
    set(t, cfg, cfg:peer_uids({}))
    t.eq(#cfg:peer_uids(), 0, "{} clears the list")
end

function tests.socket_mode(t)
    local cfg = shmipc.config()
    set(t, cfg, cfg:socket_mode(tonumber("660", 8)))
    t.eq(cfg:socket_mode(), 432, "socket_mode 0660")
    set(t, cfg, cfg:socket_mode("0640"))
    t.eq(cfg:socket_mode(), tonumber("640", 8), "an octal string")
    set(t, cfg, cfg:socket_mode("777"))
    t.eq(cfg:socket_mode(), 511, "777")
    set(t, cfg, cfg:socket_mode(0))
    t.eq(cfg:socket_mode(), 384, "0 restores 0600")
    t.refused(E.EINVAL, "socket_mode: 512 has bits outside 0777", cfg:socket_mode(512))
    t.refused(E.EINVAL, "socket_mode", cfg:socket_mode(-1))
    t.refused(E.EINVAL, "socket_mode: \"0660x\" is not an octal mode", cfg:socket_mode("0660x"))
    t.refused(E.EINVAL, "socket_mode: 1023 has bits outside", cfg:socket_mode("1777")) -- the sticky bit
    t.refused(E.EINVAL, "not an octal mode", cfg:socket_mode("0o660"))
    t.refused(E.EINVAL, "not an octal mode", cfg:socket_mode(""))
    t.refused(E.EINVAL, "not an octal mode", cfg:socket_mode("8"))
    t.eq(cfg:socket_mode(), 384, "unchanged after refusals")
    t.raises("number expected, got boolean", cfg.socket_mode, cfg, true)
    t.raises("number has no integer representation", cfg.socket_mode, cfg, 1.5)
end

function tests.session_caps(t)
    local cfg = shmipc.config()
    set(t, cfg, cfg:max_pending_streams(1))
    t.eq(cfg:max_pending_streams(), 1, "max_pending_streams 1")
    set(t, cfg, cfg:max_pending_streams(65536))
    set(t, cfg, cfg:max_pending_streams(0))
    t.eq(cfg:max_pending_streams(), 4096, "0 restores the default")
    t.refused(E.EINVAL, "max_pending_streams: 65537 is outside 1..65536", cfg:max_pending_streams(65537))
    t.refused(E.EINVAL, "max_pending_streams: -1 is negative", cfg:max_pending_streams(-1))
    t.refused(E.EINVAL, "max_pending_streams", cfg:max_pending_streams(1 << 32))
    set(t, cfg, cfg:max_fallback_unread(65536))
    t.eq(cfg:max_fallback_unread(), 65536, "max_fallback_unread")
    set(t, cfg, cfg:max_fallback_unread(1 << 40))
    set(t, cfg, cfg:max_fallback_unread(0))
    t.eq(cfg:max_fallback_unread(), 128 << 20, "0 restores the default")
    t.refused(E.EINVAL, "max_fallback_unread: 65535 bytes is outside", cfg:max_fallback_unread(65535))
    t.refused(E.EINVAL, "max_fallback_unread", cfg:max_fallback_unread((1 << 40) + 1))
    t.refused(E.EINVAL, "max_fallback_unread: -1 is negative", cfg:max_fallback_unread(-1))
    t.eq(cfg:max_fallback_unread(), 128 << 20, "unchanged after refusals")
    t.raises("number expected, got string", cfg.max_fallback_unread, cfg, "1M")
    t.raises("number has no integer representation", cfg.max_pending_streams, cfg, 2.5)
end

function tests.spin_us(t)
    local cfg = shmipc.config()
    if os.getenv("SHMIPC_SPIN_US") == nil then
        t.eq(cfg:spin_us(), 50, "the default cap")
    end
    set(t, cfg, cfg:spin_us(0))
    t.eq(cfg:spin_us(), 0, "0: never spin")
    set(t, cfg, cfg:spin_us(100000))
    t.eq(cfg:spin_us(), 100000, "the most")
    t.refused(E.EINVAL, "spin_us: 100001 is outside 0..100000", cfg:spin_us(100001))
    t.refused(E.EINVAL, "spin_us: -1 is negative", cfg:spin_us(-1))
    t.refused(E.EINVAL, "spin_us", cfg:spin_us(1 << 32))
    t.eq(cfg:spin_us(), 100000, "unchanged after refusals")
    t.raises("number expected, got string", cfg.spin_us, cfg, "ten")
    t.raises("number has no integer representation", cfg.spin_us, cfg, 2.5)
    t.eq(t.ok(shmipc.config { spin_us = 7 }):spin_us(), 7, "an option")
    t.eq(t.ok(shmipc.config { spin_us = 7 }):clone():spin_us(), 7, "cloned")
    t.refused(E.EINVAL, "spin_us", shmipc.config { spin_us = 100001 })
    t.raises("option 'spin_us' got a string", shmipc.config, { spin_us = "3" })
end

function tests.memory_wait(t)
    local cfg = shmipc.config()
    t.eq(cfg:memory_wait(), false, "off by default (fallback, as shmipc-go)")
    set(t, cfg, cfg:memory_wait(true))
    t.eq(cfg:memory_wait(), true, "on")
    t.raises("boolean expected, got number", cfg.memory_wait, cfg, 1)
    t.raises("boolean expected, got string", cfg.memory_wait, cfg, "yes")
    t.eq(cfg:memory_wait(), true, "unchanged after refusals")
    t.eq(t.ok(shmipc.config { memory_wait = true }):memory_wait(), true, "an option")
    t.eq(t.ok(shmipc.config { memory_wait = true }):clone():memory_wait(), true, "cloned")
    t.raises("option 'memory_wait' got a number", shmipc.config, { memory_wait = 1 })
end

function tests.options_and_clone(t)
    local cfg = t.ok(shmipc.config {
        peer_uids = { 7, 8 },
        socket_mode = "0660",
        max_pending_streams = 3,
        max_fallback_unread = 1 << 20,
    })
    local copy = cfg:clone()
    for _, c in ipairs({ cfg, copy }) do
        t.eq(table.concat(c:peer_uids(), ","), "7,8", "peer_uids")
        t.eq(c:socket_mode(), 432, "socket_mode")
        t.eq(c:max_pending_streams(), 3, "max_pending_streams")
        t.eq(c:max_fallback_unread(), 1 << 20, "max_fallback_unread")
    end
    t.eq(t.ok(shmipc.config { socket_mode = 416 }):socket_mode(), 416, "a numeric mode")
    t.refused(E.EINVAL, "peer_uids", shmipc.config { peer_uids = { -5 } })
    t.refused(E.EINVAL, "socket_mode", shmipc.config { socket_mode = 1024 })
    t.refused(E.EINVAL, "max_pending_streams", shmipc.config { max_pending_streams = 70000 })
    t.refused(E.EINVAL, "max_fallback_unread", shmipc.config { max_fallback_unread = 10 })
    t.raises("option 'peer_uids' got a number", shmipc.config, { peer_uids = 1000 })
    t.raises("option 'socket_mode' got a boolean", shmipc.config, { socket_mode = true })
    t.raises("option 'max_pending_streams' got a string", shmipc.config, { max_pending_streams = "3" })
    t.raises("option 'max_fallback_unread' got a table", shmipc.config, { max_fallback_unread = {} })
    t.raises("entry 1 is a boolean", shmipc.config, { peer_uids = { true } })
end

-- ---- effects on listeners and sessions -------------------------------------------------

-- A client peer: connects to arg[1] and prints "connected" or "failed <code> <message>".
local CONNECTOR = [[
local shmipc = require "shmipc"
local s, msg, code = shmipc.connect(arg[1], { initialize_timeout = 10 })
print(s and "connected" or ("failed " .. tostring(code) .. " " .. tostring(msg)))
]]

function tests.listener_allow_list_refuses_an_unlisted_client(t)
    local address = support.address("uids")
    local l <close> = t.ok(shmipc.listen(address, { peer_uids = { my_uid() + 1 } }))
    local peer <close> = support.lua_peer(CONNECTOR, address)
    local t0 = shmipc.monotime()
    -- The listener checks SO_PEERCRED first and hangs up: no session to accept.
    t.refused(E.ETIMEDOUT, "", l:accept(1))
    local line = peer:expect("failed")
    t.truthy(not line:find(tostring(E.ETIMEDOUT), 1, true), "hung up on, not timed out: " .. line)
    t.truthy(shmipc.monotime() - t0 < 5, "the client learnt at once")
    peer:finish()
end

function tests.listener_allow_list_admits_a_listed_client(t)
    local address = support.address("uids-ok")
    local l <close> = t.ok(shmipc.listen(address, { peer_uids = { my_uid() + 1, my_uid() } }))
    local client <close> = support.greeter_client(address)
    local s <close> = t.ok(l:accept(10))
    local st <close> = t.ok(s:accept_stream(10))
    t.eq(st:read(#support.REQUEST), support.REQUEST, "request")
    t.ok(st:write(support.REPLY):flush())
    local ok, out = client:finish()
    t.truthy(ok, "greeter_client exit: " .. out)
end

function tests.client_allow_list_refuses_an_unlisted_server(t)
    local address = support.address("uids-client")
    local l <close> = t.ok(shmipc.listen(address))
    -- The client checks the server's uid as it connects, before any handshake byte.
    local msg = t.refused(E.EACCES, "is uid " .. my_uid(), shmipc.connect(address, { peer_uids = { my_uid() + 1 } }))
    t.truthy(msg:find("peer_uids", 1, true), msg)
    t.truthy(l:accept(0.2) == nil, "nothing to accept")
end

function tests.allow_list_needs_a_unix_socket(t)
    t.refused(E.EINVAL, "unix socket", shmipc.listen("tcp:127.0.0.1:0", { peer_uids = { my_uid() } }))
end

local function file_mode(path)
    local p = assert(io.popen("stat -c %a " .. support.quote(path)))
    local mode = p:read("l")
    p:close()
    return mode
end

function tests.socket_mode_shows_on_the_file(t)
    for _, case in ipairs({ { nil, "600" }, { "0640", "640" }, { tonumber("666", 8), "666" } }) do
        local path = os.tmpname()
        os.remove(path)
        local l = t.ok(shmipc.listen("unix:" .. path, case[1] and { socket_mode = case[1] } or nil))
        t.eq(file_mode(path), case[2], "mode of the socket file for " .. tostring(case[1]))
        l:close()
        t.eq(io.open(path), nil, "the file is removed on close")
    end
end

-- A client peer: connects to arg[1], opens arg[2] streams and sends "x" on each, prints
-- "sent", then waits for the end of the session.
local OPENER = [[
local shmipc = require "shmipc"
local s = assert(shmipc.connect(arg[1]))
local streams = {}
for i = 1, tonumber(arg[2]) do
    streams[i] = assert(s:open_stream())
    assert(streams[i]:write("x"):flush())
end
print("sent")
io.stdout:flush()
streams[1]:set_timeout("read", 10)
print("ended", select(3, streams[1]:read_chunk()))
]]

-- Listens with `opts`, lets a peer open `n` streams, and accepts them: returns how many were
-- accepted and the refusal (message, code) that ended it, if any.
local function pending_streams(t, opts, n)
    local address = support.address("pending")
    local l <close> = t.ok(shmipc.listen(address, opts))
    local peer <close> = support.lua_peer(OPENER, address, n)
    local s <close> = t.ok(l:accept(10))
    peer:expect("sent")
    local accepted = 0
    for _ = 1, n do
        local st, msg, code = s:accept_stream(10)
        if not st then
            s:close()
            peer:finish()
            return accepted, msg, code
        end
        t.eq(st:read(1), "x", "first byte")
        st:close()
        accepted = accepted + 1
    end
    s:close()
    peer:finish()
    return accepted
end

function tests.max_pending_streams_ends_the_session(t)
    local accepted, msg, code = pending_streams(t, { max_pending_streams = 2 }, 3)
    t.eq(code, E.EPROTO, "code (" .. tostring(msg) .. ")")
    t.truthy(msg:find("max_pending_streams is 2", 1, true), msg)
    t.eq(accepted, 0, "the session ended while they waited")
    t.eq(pending_streams(t, { max_pending_streams = 3 }, 3), 3, "three fit a cap of three")
end

-- A client peer with a 1 MiB buffer that sends arg[2] bytes on one stream: more than its
-- buffer holds, so the message goes over the socket (fallback).
local FALLBACK = [[
local shmipc = require "shmipc"
local s = assert(shmipc.connect(arg[1], { buffer_capacity = 1 << 20, connection_write_timeout = 5 }))
local st = assert(s:open_stream())
print("flushed", st:write(string.rep("f", tonumber(arg[2]))):flush())
io.stdout:flush()
st:set_timeout("read", 10)
print("ended", select(3, st:read_chunk()))
]]

local function fallback_transfer(t, opts)
    local n = (1 << 20) + (512 << 10)
    local address = support.address("fallback")
    local l <close> = t.ok(shmipc.listen(address, opts))
    local peer <close> = support.lua_peer(FALLBACK, address, n)
    local s <close> = t.ok(l:accept(10))
    local st, msg, code = s:accept_stream(10)
    local data
    if st then
        st:set_timeout("read", 10)
        data, msg, code = st:read(n)
        st:close()
    end
    s:close()
    peer:finish()
    return data, msg, code, n
end

function tests.max_fallback_unread_ends_the_session(t)
    local data, msg, code = fallback_transfer(t, { max_fallback_unread = 65536 })
    t.eq(data, nil, "nothing read")
    t.eq(code, E.EPROTO, "code (" .. tostring(msg) .. ")")
    t.truthy(msg:find("max_fallback_unread (65536 bytes)", 1, true), msg)
    local n
    data, msg, code, n = fallback_transfer(t, nil)
    t.eq(data and #data, n, "the default cap takes it: " .. tostring(msg))
    t.eq(data, string.rep("f", n), "intact")
end

-- ---- server WebSocket options ------------------------------------------------------------

local has_socket = pcall(require, "socket")
local client = has_socket and dofile(here .. "/server_support.lua")

local function ws_test(name, fn)
    tests[name] = function(t)
        if not has_socket then
            print("# skip " .. name .. ": lua-socket is not installed (apt-get install lua-socket)")
            return
        end
        fn(t)
    end
end

local function wait_for(cond, what)
    local deadline = shmipc.monotime() + 10
    while not cond() do
        assert(shmipc.monotime() < deadline, "timed out waiting for " .. what)
        shmipc.poll({}, 0.01)
    end
end

-- A started echo server with `opts`; `log.close` gets on_close's code.
local function ws_echo(t, opts, log)
    opts.port, opts.workers = 0, 1
    local srv = t.ok(shmipc.server(opts))
    assert(srv:websocket("/ws", {
        on_message = function(ws, data)
            ws:send(data)
        end,
        on_close = function(_, code)
            if log then
                log.close = code
            end
        end,
    }))
    assert(srv:start())
    local c, status = client.ws_connect(srv:port(), "/ws")
    t.eq(status, 101, "upgrade")
    return srv, c
end

ws_test("ws_ping_timeout_pings_a_silent_client", function(t)
    local srv <close>, c = ws_echo(t, { ws_ping_timeout = 0.2 })
    local t0 = shmipc.monotime()
    local kind, data = c:ws_recv(5)
    t.eq(kind, "ping", "a ping")
    t.eq(data, "", "with no payload")
    t.truthy(shmipc.monotime() - t0 >= 0.15, "after the timeout")
    c:close()
    local quiet <close>, q = ws_echo(t, {}) -- the default: no pings
    t.raises("timed out waiting for the server", q.ws_recv, q, 0.6)
    q:close()
end)

ws_test("ws_idle_timeout_fails_a_silent_client", function(t)
    local log = {}
    local srv <close>, c = ws_echo(t, { ws_idle_timeout = 0.3 }, log)
    c:ws_send("text", "hi")
    t.eq(select(2, c:ws_recv()), "hi", "echo")
    local t0 = shmipc.monotime()
    t.eq(c:ws_recv(5), nil, "TCP closed without a close frame")
    t.truthy(shmipc.monotime() - t0 >= 0.25, "after the timeout")
    wait_for(function()
        return log.close
    end, "on_close")
    t.eq(log.close, 1006, "on_close code")
    c:close()
end)

ws_test("ws_send_limit_refuses_sends_to_a_peer_that_does_not_read", function(t)
    local chunk = string.rep("z", 64 << 10)
    local result
    local srv <close> = t.ok(shmipc.server {
        port = 0, workers = 1, ws_send_limit = 128 << 10, ws_send_high_water = 64 << 10,
    })
    assert(srv:websocket("/ws", {
        on_message = function(ws)
            local sent = 0
            while sent < (16 << 20) do
                local ok, _, code = ws:send(chunk, "binary")
                if not ok then
                    result = { sent = sent, code = code }
                    return
                end
                sent = sent + #chunk
            end
            result = { sent = sent }
        end,
    }))
    assert(srv:start())
    local c, status = client.ws_connect(srv:port(), "/ws")
    t.eq(status, 101, "upgrade")
    c:ws_send("text", "flood") -- and never read
    wait_for(function()
        return result
    end, "the flood to end")
    -- Refused before 16 MiB went out, which the default limit (16 MiB queued, on top of what
    -- the kernel's socket buffers take) never does.
    t.eq(result.code, E.EAGAIN, "refused with EAGAIN after " .. result.sent .. " bytes")
    t.truthy(result.sent < (16 << 20), "sent " .. result.sent)
    c:close()
end)

function tests.ws_options_refused(t)
    t.refused(E.EINVAL, "ws_ping_timeout (1000 ms) must be below ws_idle_timeout",
        shmipc.server { ws_ping_timeout = 1, ws_idle_timeout = 0.5 })
    t.refused(E.EINVAL, "ws_idle_timeout: 0", shmipc.server { ws_idle_timeout = 0 })
    t.refused(E.EINVAL, "ws_ping_timeout: 0", shmipc.server { ws_ping_timeout = 0 })
    t.refused(E.EINVAL, "ws_ping_timeout", shmipc.server { ws_ping_timeout = 3601 })
    t.refused(E.EINVAL, "ws_send_limit", shmipc.server { ws_send_limit = 1000 })
    t.refused(E.EINVAL, "ws_send_high_water", shmipc.server { ws_send_high_water = (1 << 30) + 1 })
    t.refused(E.EINVAL, "ws_send_limit: -1 is negative", shmipc.server { ws_send_limit = -1 })
    t.raises("option 'ws_ping_timeout' got a string", shmipc.server, { ws_ping_timeout = "1s" })
    t.raises("option 'ws_send_limit' must be an integer", shmipc.server, { ws_send_limit = 1.5 })
    -- Applied in a fixed order, whatever the table's: the high-water mark before the limit.
    for _ = 1, 8 do
        t.ok(shmipc.server { ws_send_limit = 128 << 10, ws_send_high_water = 64 << 10 }):close()
    end
    t.ok(shmipc.server { ws_idle_timeout = 0.5, ws_ping_timeout = 0.1 }):close()
    t.ok(shmipc.server { ws_idle_timeout = -1, ws_ping_timeout = -1 }):close()
end

return tests
