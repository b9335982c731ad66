-- Description: the client side: a Lua session against the C greeter server (V3 over memfd,
-- V2 over /dev/shm files) and the Lua server peer; reads, EOF, timeouts, a killed peer, the
-- hard close, and the nil, message, code convention against raising on misuse.
local shmipc = require "shmipc"
local support = dofile((debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or ".") .. "/ipc_support.lua")

local E = shmipc.errors
local tests = {}

-- write(data) then flush(): the results of the first that fails, or of flush.
local function send(st, data)
    local ok, msg, code = st:write(data)
    if not ok then
        return ok, msg, code
    end
    return st:flush()
end

-- One greeter exchange on session `s`.
local function greet(t, s)
    local st <close> = t.ok(s:open_stream())
    t.eq(st:write(support.REQUEST), st, "write returns the stream")
    t.eq(st:flush(), st, "flush returns the stream")
    t.eq(st:read(#support.REPLY), support.REPLY, "reply")
end

function tests.greeter_v3_memfd(t)
    local address = support.address("greet3")
    local server <close> = support.greeter_server(address)
    local s <close> = t.ok(shmipc.connect(address))
    t.eq(s:version(), 3, "version")
    t.eq(s:wakeup(), "socket", "wakeup")
    t.eq(s:status(), 0, "status")
    t.eq(math.type(s:fileno()), "integer", "fileno")
    t.eq(s:pollfd(), s:fileno(), "pollfd")
    greet(t, s)
    s:close()
    local ok, out = server:finish()
    t.truthy(ok, "greeter_server exit: " .. out)
    t.truthy(out:find("server receive request message:" .. support.REQUEST, 1, true), out)
    t.truthy(out:find("protocol V3", 1, true), out)
end

function tests.greeter_v2_devshm(t)
    local address = support.address("greet2")
    local prefix = support.shm_prefix("v2")
    local server <close> = support.greeter_server(address)
    do
        local s <close> = t.ok(shmipc.connect(address, { memmap = "devshm", path_prefix = prefix }))
        t.eq(s:version(), 2, "version")
        t.truthy(#support.shm_files(prefix) > 0, "the client created /dev/shm files")
        greet(t, s)
    end
    t.eq(#support.shm_files(prefix), 0, "files removed once the session is closed")
    local ok, out = server:finish()
    t.truthy(ok, "greeter_server exit: " .. out)
    t.truthy(out:find("protocol V2", 1, true), out)
end

-- V4 with each wakeup mode. A core without V4 falls back to legacy (fallback is on in these
-- helpers), which the test reports instead of failing on.
local v4_modes = {
    socket = { with_v4 = true },
    eventfd = { with_v4_eventfd = true },
    polling = { with_v4_event_queue_polling = 200 },
}
for name, opts in pairs(v4_modes) do
    tests["greeter_v4_" .. name] = function(t)
        local address = support.address("greet4")
        local server <close> = support.greeter_server(address)
        local s <close> = t.ok(shmipc.connect(address, opts))
        local version = s:version()
        if version ~= 4 then
            print("# skip greeter_v4_" .. name .. ": V4 was not negotiated (version " .. version .. ")")
        else
            local wakeup, interval = s:wakeup()
            t.eq(wakeup, name, "negotiated wakeup")
            t.eq(interval, name == "polling" and 200 or 0, "polling interval")
        end
        greet(t, s)
        s:close()
        local ok, out = server:finish()
        t.truthy(ok, "greeter_server exit: " .. out)
        t.truthy(out:find("protocol V" .. version, 1, true), out)
    end
end

function tests.connect_with_a_config_handle(t)
    local address = support.address("cfg")
    local server <close> = support.greeter_server(address)
    local cfg <close> = shmipc.config { buffer_capacity = 1 << 20, read_timeout = 5 }
    local s <close> = t.ok(shmipc.connect(address, cfg))
    cfg:close() -- the session copied it
    greet(t, s)
end

function tests.read_chunk_limits_and_pieces(t)
    local address = support.address("echo")
    local server <close> = support.lua_server("echo", address)
    local s <close> = t.ok(shmipc.connect(address))
    local st <close> = t.ok(s:open_stream())
    local payload = {}
    for i = 1, 20000 do
        payload[i] = string.char(i % 251)
    end
    payload = table.concat(payload)
    t.ok(st:write(payload:sub(1, 7000), payload:sub(7001)))
    t.ok(st:flush())
    local got, pieces = {}, 0
    local n = 0
    while n < #payload do
        local chunk = t.ok(st:read_chunk(1000))
        t.truthy(#chunk > 0 and #chunk <= 1000, "chunk size " .. #chunk)
        got[#got + 1] = chunk
        n = n + #chunk
        pieces = pieces + 1
    end
    t.eq(table.concat(got), payload, "echoed bytes")
    t.truthy(pieces >= 20, "pieces " .. pieces)
    t.eq(st:available(), 0, "nothing left")
    -- Numbers are written as io.write writes them.
    t.ok(st:write(42, "|", 1.5):flush())
    t.eq(st:read(6), "42|1.5", "numbers")
    t.eq(st:read(0), "", "read(0)")
    st:close()
    local ok, out = support.stop_server(server, address)
    t.truthy(ok, out)
end

function tests.read_exact_spanning_slices(t)
    -- 4 KiB slices: a 10000-byte message lies in three of them.
    local address = support.address("span")
    local server <close> = support.lua_server("echo", address)
    local s <close> = t.ok(shmipc.connect(address, { buffer_capacity = 1 << 20, slice_classes = "4096:100" }))
    local st <close> = t.ok(s:open_stream())
    local msg = string.rep("0123456789", 1000)
    t.ok(st:write(msg):flush())
    t.eq(st:read_exact_bytes(10000), msg, "10000 bytes across slices")
    support.stop_server(server, address)
end

function tests.end_of_stream(t)
    local address = support.address("bye")
    local server <close> = support.lua_server("bye", address)
    local s <close> = t.ok(shmipc.connect(address))
    local st <close> = t.ok(s:open_stream())
    -- The peer learns of a stream from its first message.
    t.ok(st:write("hi"):flush())
    t.eq(st:read(3), "bye", "data before the end")
    t.refused(E.EEOF, "closed the stream", st:read_chunk())
    t.refused(E.EEOF, "closed the stream", st:read(1))
    t.refused(E.EEOF, "closed the stream", st:read_chunk(nil, "nb"))
    t.eq(st:events(), "r", "a read does not wait at the end")
    -- The bytes before the end stay readable when read_exact_bytes asks for too many.
    local st2 <close> = t.ok(s:open_stream())
    t.ok(st2:write("hi"):flush())
    t.refused(E.EEOF, "", st2:read(4))
    t.eq(st2:read(3), "bye", "bytes left after a short read_exact_bytes")
    support.stop_server(server, address)
end

function tests.flush_close(t)
    local address = support.address("last")
    local server <close> = support.lua_server("last", address)
    local s <close> = t.ok(shmipc.connect(address))
    -- The server's reply and its end come in one step.
    local st <close> = t.ok(s:open_stream())
    t.ok(st:write("hi"):flush())
    t.eq(st:read(10), "last words", "the last message")
    t.refused(E.EEOF, "closed the stream", st:read_chunk())
    -- Ours: the stream is closed afterwards (the server's answer to it is dropped).
    local mine = t.ok(s:open_stream())
    t.raises("shmipc.stream expected", mine.flush_close, s)
    t.eq(mine:write("ping"):flush_close(), true, "flush_close")
    t.raises("attempt to use a closed shmipc.stream", mine.flush_close, mine)
    t.raises("attempt to use a closed shmipc.stream", mine.write, mine, "x")
    mine:close() -- a no-op once closed
    -- Shut down first: nothing more goes, nil, message, ECLOSED, and closed all the same.
    local shut = t.ok(s:open_stream())
    t.ok(shut:write("unsent"))
    shut:shutdown()
    t.refused(E.ECLOSED, "", shut:flush_close())
    t.raises("attempt to use a closed shmipc.stream", shut.write, shut, "x")
    local ok, out = support.stop_server(server, address)
    t.truthy(ok, out)
end

function tests.read_timeouts(t)
    local address = support.address("timeout")
    local server <close> = support.greeter_server(address)
    local s <close> = t.ok(shmipc.connect(address, { read_timeout = 0.05 }))
    local st <close> = t.ok(s:open_stream())
    local t0 = shmipc.monotime()
    t.refused(E.ETIMEDOUT, "timed out", st:read_chunk())
    local waited = shmipc.monotime() - t0
    t.truthy(waited >= 0.04 and waited < 2, "waited " .. waited)
    t.eq(st:set_timeout("read", 0.01), st, "set_timeout returns the stream")
    t.refused(E.ETIMEDOUT, "timed out", st:read(5))
    t.ok(st:set_timeout("write", 1))
    t.refused(E.EINVAL, "write_timeout", st:set_timeout("write", 0 / 0))
    -- 0 does not wait: nothing is pending, so the read fails at once.
    t.ok(st:set_timeout("read", 0))
    t.refused(E.ETIMEDOUT, "timed out", st:read_chunk())
    -- The session still works after timeouts; a negative timeout waits forever.
    t.ok(st:set_timeout("read", -1))
    t.ok(st:write(support.REQUEST):flush())
    t.eq(st:read(#support.REPLY), support.REPLY, "reply after timeouts")
end

function tests.nonblocking_reads(t)
    local address = support.address("nb")
    local server <close> = support.greeter_server(address)
    local s <close> = t.ok(shmipc.connect(address))
    local st <close> = t.ok(s:open_stream())
    t.refused(E.EAGAIN, "no data yet", st:read_chunk(nil, "nb"))
    t.refused(E.EAGAIN, "no data yet", st:read(3, "nb"))
    t.eq(st:events(), "", "nothing to read")
    t.ok(st:write(support.REQUEST):flush())
    -- Wait for the reply on the descriptor, as an event loop would.
    local got
    for _ = 1, 100 do
        local ready = t.ok(shmipc.poll({ st:pollfd() }, 5))
        t.eq(#ready, 1, "the session's descriptor is readable")
        t.ok(s:process())
        got = st:read(#support.REPLY, "nb")
        if got then
            break
        end
    end
    t.eq(got, support.REPLY, "reply")
end

-- spin() before sleeping: the reply comes through the spin or the descriptor, never lost.
-- (The greeter answers one request per session.)
function tests.event_loop_spin(t)
    local address = support.address("spin")
    local server <close> = support.greeter_server(address)
    local s <close> = t.ok(shmipc.connect(address))
    local st <close> = t.ok(s:open_stream())
    t.ok(st:write(support.REQUEST):flush())
    local got
    for _ = 1, 10 do
        local spun, msg = s:spin()
        t.eq(type(spun), "boolean", msg)
        if not spun then
            t.ok(shmipc.poll({ st:pollfd() }, 5))
            t.ok(s:process())
        end
        got = st:read(#support.REPLY, "nb")
        if got then
            break
        end
    end
    t.eq(got, support.REPLY, "reply")
    t.eq(s:spin(), false, "nothing comes")
    s:shutdown()
    t.refused(E.ECLOSED, "", s:spin())
end

function tests.killed_peer(t)
    local address = support.address("kill")
    local server = support.greeter_server(address)
    local s <close> = t.ok(shmipc.connect(address))
    local st <close> = t.ok(s:open_stream())
    t.ok(st:write("x"):flush())
    -- Killed while this read blocks: the read ends at once with the peer gone.
    local killer = support.spawn(string.format("sh -c 'sleep 0.2; kill -9 %d'", server.pid))
    local t0 = shmipc.monotime()
    t.refused(E.ECONNRESET, "", st:read_chunk())
    t.truthy(shmipc.monotime() - t0 < 5, "read ended soon after the kill")
    killer:finish()
    server:finish()
    t.eq(s:status(), E.ECONNRESET, "status")
    t.refused(E.ECONNRESET, "", send(st, "y"))
    t.refused(E.ECONNRESET, "", s:process())
    t.refused(E.ECONNRESET, "", s:open_stream())
end

function tests.killed_before_the_read(t)
    local address = support.address("kill2")
    local server = support.greeter_server(address)
    local s <close> = t.ok(shmipc.connect(address))
    local st <close> = t.ok(s:open_stream())
    server:kill()
    server:finish()
    t.refused(E.ECONNRESET, "", st:read(1))
end

function tests.session_close_is_a_hard_close(t)
    local address = support.address("hard")
    local server <close> = support.greeter_server(address)
    local s = t.ok(shmipc.connect(address))
    local st <close> = t.ok(s:open_stream())
    s:close()
    t.refused(E.ECLOSED, "closed", st:read_chunk())
    t.refused(E.ECLOSED, "closed", st:read(1, "nb"))
    t.refused(E.ECLOSED, "", send(st, "x"))
    t.refused(E.ECLOSED, "session is closed", st:pollfd())
    t.eq(st:events(), "r", "a read returns at once")
    t.raises("attempt to use a closed shmipc.session", s.open_stream, s)
    t.raises("attempt to use a closed shmipc.session", s.fileno, s)
    t.eq(tostring(s), "shmipc.session (closed)", "tostring")
    st:close()
    t.raises("attempt to use a closed shmipc.stream", st.read, st, 1)
end

function tests.connect_failures(t)
    local v, msg, code = shmipc.connect(support.address("nobody"))
    t.eq(v, nil, "result")
    t.eq(type(msg), "string", "message")
    t.eq(code, E.ECONNREFUSED, "code (" .. tostring(msg) .. ")")
    t.refused(E.EINVAL, "", shmipc.connect("nonsense"))
    t.refused(E.EINVAL, "buffer_capacity", shmipc.connect(support.address("x"), { buffer_capacity = 5 }))
    t.refused(E.EINVAL, "memfd needs a unix socket", shmipc.connect("tcp:127.0.0.1:1"))
end

function tests.role_mismatch(t)
    local address = support.address("role")
    local server <close> = support.greeter_server(address)
    local s <close> = t.ok(shmipc.connect(address))
    t.refused(E.ENOTSUP, "only servers accept streams", s:accept_stream(0))
end

function tests.misuse_raises(t)
    local address = support.address("misuse")
    local server <close> = support.greeter_server(address)
    t.raises("string expected", shmipc.connect, {})
    t.raises("NUL", shmipc.connect, "unix:@a\0b")
    t.raises("shmipc.config or table of options expected", shmipc.connect, address, "memfd")
    t.raises("unknown option 'buffer'", shmipc.connect, address, { buffer = 1 })
    local closed = shmipc.config()
    closed:close()
    t.raises("attempt to use a closed shmipc.config", shmipc.connect, address, closed)
    local s <close> = t.ok(shmipc.connect(address))
    local st <close> = t.ok(s:open_stream())
    t.raises("shmipc.session expected", s.open_stream, st)
    t.raises("shmipc.stream expected", st.read, s, 1)
    t.raises("string expected", st.write, st, {})
    t.raises("string expected", st.write, st, "ok", nil)
    t.raises("n must not be negative", st.read, st, -1)
    t.raises("number expected", st.read, st)
    t.raises("max must be positive", st.read_chunk, st, 0)
    t.raises("invalid option 'bogus'", st.read_chunk, st, nil, "bogus")
    t.raises("invalid option 'later'", st.set_timeout, st, "later", 1)
    t.raises("timeout must be a number", s.accept_stream, s, 0 / 0)
    t.raises("cannot yield here", st.read, st, 1, "yield")
    -- A failed write of a bad argument wrote nothing: the greeter still gets its request.
    greet(t, s)
end

-- A Lua echo server that forwards each payload back without copying it: a 4-byte big-endian
-- length (read and released), then st:forward(st, n). A length of 0 ends it.
local FORWARD_SERVER = [[
local shmipc = require "shmipc"
local l = assert(shmipc.listen(arg[1]))
print("listening")
io.stdout:flush()
local s = assert(l:accept(10))
local st = assert(s:accept_stream(10))
while true do
    local n = string.unpack(">I4", assert(st:read(4)))
    if n == 0 then break end
    assert(st:forward(st, n) == st)
    assert(st:flush())
end
print("done")
]]

function tests.forward_echo(t)
    local address = support.address("fwd")
    local server <close> = support.lua_peer(FORWARD_SERVER, address)
    server:expect("listening")
    local s <close> = t.ok(shmipc.connect(address))
    local st <close> = t.ok(s:open_stream())
    for _, n in ipairs({ 1, 100, 5000, 300000 }) do
        local payload = string.rep(string.char(n % 251), n - 1) .. "!"
        t.ok(send(st, string.pack(">I4", n) .. payload))
        t.eq(st:read(n), payload, "echo of " .. n .. " bytes")
    end
    -- Nothing to forward yet: refused without waiting, nothing moves.
    t.refused(E.EAGAIN, "", st:forward(st, 1, "nb"))
    t.ok(send(st, string.pack(">I4", 0)))
    local ok, out = server:finish()
    t.truthy(ok and out:find("done", 1, true), "server: " .. out)
    t.truthy(not pcall(st.forward, st, "not a stream", 1), "src must be a stream")
    t.truthy(not pcall(st.forward, st, st, -1), "n must not be negative")
end

function tests.handle_names(t)
    local address = support.address("names")
    local server <close> = support.greeter_server(address)
    local s <close> = t.ok(shmipc.connect(address))
    local st <close> = t.ok(s:open_stream())
    t.eq(getmetatable(s).__name, "shmipc.session", "session __name")
    t.eq(getmetatable(st).__name, "shmipc.stream", "stream __name")
    t.truthy(tostring(s):match("^shmipc%.session %(0x%x+%)$"), tostring(s))
    t.truthy(tostring(st):match("^shmipc%.stream 2 %(0x%x+%)$"), tostring(st))
    t.eq(st:id(), 2, "first client stream id")
    local st2 <close> = t.ok(s:open_stream())
    t.eq(st2:id(), 3, "second client stream id")
end

return tests
