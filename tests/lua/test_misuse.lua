-- Description: API misuse never crashes (issue 19): shutdown of sessions and streams (twice,
-- after close, ending a read that waits in a coroutine), calls after shutdown, and wrong types
-- and sizes, which raise or return nil, message, code.
local shmipc = require "shmipc"
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local support = dofile(here .. "/ipc_support.lua")

local E = shmipc.errors
local tests = {}

function tests.stream_shutdown_ends_a_waiting_read(t)
    local address = support.address("mshut")
    local server <close> = support.greeter_server(address)
    local s <close> = t.ok(shmipc.connect(address))
    local st = t.ok(s:open_stream())
    local co = coroutine.create(function()
        return st:read(1, "yield")
    end)
    local ok = coroutine.resume(co)
    t.eq(ok, true, "resume")
    t.eq(coroutine.status(co), "suspended", "the read waits")
    t.eq(st:shutdown(), true, "shutdown")
    t.eq(st:shutdown(), true, "shutdown twice")
    local rok, v, msg, code = coroutine.resume(co)
    t.eq(rok, true, "resume")
    t.eq(v, nil, "result")
    t.eq(code, E.ECLOSED, "code: " .. tostring(msg))
    local _, _, wcode = st:write("x")
    t.eq(wcode, E.ECLOSED, "write after shutdown")
    local _, _, rcode = st:read_chunk(nil, "nb")
    t.eq(rcode, E.ECLOSED, "read after shutdown")
    -- The session goes on: another stream still talks to the greeter.
    local st2 <close> = t.ok(s:open_stream())
    t.ok(st2:write(support.REQUEST):flush())
    t.eq(st2:read(#support.REPLY), support.REPLY, "reply on another stream")
    st:close()
    t.eq(st:shutdown(), true, "shutdown after close is a no-op")
end

function tests.session_shutdown_fails_later_calls(t)
    local address = support.address("msess")
    local server <close> = support.greeter_server(address)
    local s = t.ok(shmipc.connect(address))
    local st = t.ok(s:open_stream())
    local co = coroutine.create(function()
        return st:read(1, "yield")
    end)
    t.eq(coroutine.resume(co), true, "resume")
    t.eq(s:shutdown(), true, "shutdown")
    t.eq(s:shutdown(), true, "shutdown twice")
    t.eq(s:status(), E.ECLOSED, "status")
    local _, v, _, code = coroutine.resume(co)
    t.eq(v, nil, "the waiting read ends")
    t.eq(code, E.ECLOSED, "with ECLOSED")
    local _, _, ocode = s:open_stream()
    t.eq(ocode, E.ECLOSED, "open_stream after shutdown")
    st:close()
    s:close()
    t.eq(s:shutdown(), true, "shutdown after close is a no-op")
end

function tests.wrong_types_and_sizes(t)
    local address = support.address("mtypes")
    local server <close> = support.greeter_server(address)
    local s <close> = t.ok(shmipc.connect(address))
    local st <close> = t.ok(s:open_stream())
    local function raises(fn, what)
        local ok, err = pcall(fn)
        t.eq(ok, false, what .. " raises")
        t.truthy(type(err) == "string", what .. ": " .. tostring(err))
    end
    raises(function() st:read_exact_bytes(-1) end, "negative n")
    raises(function() st:read_exact_bytes("x") end, "a string n")
    raises(function() st:read_exact_bytes(1.5) end, "a fractional n")
    raises(function() st:read_chunk(-1) end, "negative max")
    raises(function() st:read_chunk(0) end, "zero max")
    raises(function() st:write({}) end, "a table to write")
    raises(function() st:write(nil) end, "nil to write")
    raises(function() st:forward(st, -1) end, "negative forward")
    raises(function() st:forward(nil, 1) end, "forward from nil")
    t.eq(st:set_timeout("read", -1), st, "a negative timeout waits forever")
    local tv, _, tcode = st:set_timeout("read", 0 / 0)
    t.eq(tv, nil, "a NaN timeout fails")
    t.eq(tcode, E.EINVAL, "with EINVAL")
    raises(function() st.shutdown(s) end, "shutdown of a session as a stream")
    raises(function() s.shutdown(st) end, "shutdown of a stream as a session")
    raises(function() st:read(1, "sideways") end, "an unknown mode")
    -- Sizes the C API cannot take are failures, not crashes.
    local v, _, code = st:read_exact_bytes(math.maxinteger, "nb")
    t.eq(v, nil, "a huge n")
    t.eq(code, E.EINVAL, "EINVAL")
    v, _, code = st:read_exact_bytes(4294967296, "nb")
    t.eq(code, E.EINVAL, "2^32")
    -- Still a working stream.
    t.ok(st:write(support.REQUEST):flush())
    t.eq(st:read(#support.REPLY), support.REPLY, "reply")
end

return tests
