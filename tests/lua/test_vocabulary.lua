-- Description: one vocabulary (issue 20 item 4) from Lua: timeouts are seconds where nil and
-- any negative value wait forever and 0 does not wait (config, set_timeout, accept,
-- accept_stream, the server's options); a keep-alive timeout of 0 answers with
-- Connection: close.
local shmipc = require "shmipc"
local support = dofile((debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or ".") .. "/ipc_support.lua")

local E = shmipc.errors
local tests = {}

-- The old module refused negative waits ("timeout must be a number of seconds >= 0").
function tests.accept_and_accept_stream_negative_wait_forever(t)
    local address = support.address("vforever")
    local l <close> = t.ok(shmipc.listen(address))
    t.refused(E.EAGAIN, "", l:accept(0))
    local client <close> = support.greeter_client(address, "v3")
    local s <close> = t.ok(l:accept(-1))
    local st <close> = t.ok(s:accept_stream(-2.5))
    t.eq(st:read(#support.REQUEST), support.REQUEST, "request")
    t.ok(st:write(support.REPLY):flush())
    support.read_all(st)
    t.truthy(client:finish(), "greeter_client exit")
end

-- A stored read timeout of 0 does not wait (before: it waited forever); negative waits.
function tests.read_timeout_zero_does_not_wait(t)
    local address = support.address("vzero")
    local server <close> = support.greeter_server(address)
    local s <close> = t.ok(shmipc.connect(address, { read_timeout = 0 }))
    local st <close> = t.ok(s:open_stream())
    local t0 = shmipc.monotime()
    t.refused(E.ETIMEDOUT, "timed out", st:read_chunk())
    t.refused(E.ETIMEDOUT, "timed out", st:read(1))
    t.truthy(shmipc.monotime() - t0 < 2, "did not wait")
    t.ok(st:set_timeout("read", -1))
    t.ok(st:write(support.REQUEST):flush())
    t.eq(st:read(#support.REPLY), support.REPLY, "reply, waited for")
end

function tests.config_timeouts_nil_and_negative_are_forever(t)
    local cfg = shmipc.config { initialize_timeout = -1, read_timeout = 0, write_timeout = -7 }
    t.eq(cfg:initialize_timeout(), -1, "initialize forever")
    t.eq(cfg:read_timeout(), 0, "read: do not wait")
    t.eq(cfg:write_timeout(), -1, "write forever")
    t.refused(E.EINVAL, "cannot take no time", cfg:connection_write_timeout(0))
end

function tests.server_keepalive_zero_closes_after_each_response(t)
    local srv <close> = t.ok(shmipc.server { port = 0, keepalive_timeout = 0, stop_timeout = 1 })
    t.ok(srv:static("/", "hi", "text/plain"))
    t.ok(srv:start())
    local socket = require "socket"
    local c = assert(socket.tcp())
    c:settimeout(10)
    assert(c:connect("127.0.0.1", srv:port()))
    assert(c:send("GET / HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\n"))
    local all = c:receive("*a") -- until the server closes: one response only
    c:close()
    t.truthy(all:find("Connection: close\r\n", 1, true), all)
    local _, n = all:gsub("HTTP/1.1 200", "")
    t.eq(n, 1, "one response, then the close")
end

return tests
