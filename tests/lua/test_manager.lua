-- Description: the session manager: pooled streams come back for reuse, put_back closes the
-- handle, streams that cannot be reused are closed, several sessions, a hard close, a dead
-- server, and its streams under the coroutine scheduler (they have no descriptor).
local shmipc = require "shmipc"
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local support = dofile(here .. "/ipc_support.lua")
local scheduler = dofile(support.source_dir .. "/examples/lua/scheduler.lua")

local E = shmipc.errors
local tests = {}

local function echo(t, st, msg)
    t.ok(st:write(msg):flush())
    t.eq(st:read(#msg), msg, "echo")
end

function tests.pooling(t)
    local address = support.address("pool")
    local server <close> = support.lua_server("echo", address)
    local m <close> = t.ok(shmipc.session_manager(address))
    t.eq(getmetatable(m).__name, "shmipc.session_manager", "__name")
    local st = t.ok(m:get_stream())
    echo(t, st, "one")
    local id = st:id()
    t.eq(m:put_back(st), true, "put_back")
    t.eq(tostring(st), "shmipc.stream (closed)", "the handle is closed: the pool owns the stream")
    t.raises("attempt to use a closed shmipc.stream", st.read, st, 1)
    t.raises("attempt to use a closed shmipc.stream", m.put_back, m, st)
    -- The same stream comes back, as good as new.
    local again <close> = t.ok(m:get_stream())
    t.eq(again:id(), id, "reused stream")
    echo(t, again, "two")
    -- Two at once get different streams.
    local other <close> = t.ok(m:get_stream())
    t.truthy(other:id() ~= again:id(), "distinct streams")
    echo(t, other, "three")
    again:close()
    other:close()
    m:close()
    support.stop_server(server, address)
end

function tests.unreusable_stream_is_closed(t)
    local address = support.address("unreuse")
    local server <close> = support.lua_server("echo", address)
    local m <close> = t.ok(shmipc.session_manager(address))
    local st = t.ok(m:get_stream())
    local id = st:id()
    t.ok(st:write("unread"):flush())
    -- Wait until the echo is here and leave it unread.
    for _ = 1, 500 do
        if st:available() == 6 then
            break
        end
        st:events()
        support.sleep(0.002)
    end
    t.eq(st:available(), 6, "unread data")
    m:put_back(st)
    local fresh <close> = t.ok(m:get_stream())
    t.truthy(fresh:id() ~= id, "a new stream, not the one with unread data")
    echo(t, fresh, "fresh")
    support.stop_server(server, address)
end

function tests.several_sessions(t)
    local address = support.address("sessions")
    local server <close> = support.lua_server("echo", address)
    local m <close> = t.ok(shmipc.session_manager(address, { session_num = 3, max_stream_num = 2 }))
    local held = {}
    for i = 1, 100 do
        held[i] = t.ok(m:get_stream())
    end
    for i = 1, 100 do
        echo(t, held[i], "msg " .. i)
    end
    for i = 1, 100 do
        m:put_back(held[i])
    end
    echo(t, t.ok(m:get_stream()), "after")
    support.stop_server(server, address)
end

function tests.hard_close(t)
    local address = support.address("mclose")
    local server <close> = support.lua_server("echo", address)
    local m = t.ok(shmipc.session_manager(address))
    local st <close> = t.ok(m:get_stream())
    echo(t, st, "before")
    m:close()
    m:close()
    t.refused(E.ECLOSED, "", st:read(1))
    t.raises("attempt to use a closed shmipc.session_manager", m.get_stream, m)
    t.raises("attempt to use a closed shmipc.session_manager", m.put_back, m, st)
    t.eq(tostring(m), "shmipc.session_manager (closed)", "tostring")
    support.stop_server(server, address)
end

function tests.dead_server(t)
    local address = support.address("mdead")
    local server = support.lua_server("echo", address)
    local m <close> = t.ok(shmipc.session_manager(address, { rebuild_interval = 0.05 }))
    local st <close> = t.ok(m:get_stream())
    echo(t, st, "alive")
    server:kill()
    server:finish()
    t.refused(E.ECONNRESET, "", st:read(1))
    -- The dead session is replaced on the next get_stream, which cannot connect.
    local v, msg, code = m:get_stream()
    t.eq(v, nil, "get_stream")
    t.eq(code, E.ECONNREFUSED, "code: " .. tostring(msg))
    -- A new server at the same address: after the rebuild interval the manager reconnects.
    local server2 <close> = support.lua_server("echo", address)
    support.sleep(0.06)
    local st2 <close> = t.ok(m:get_stream())
    echo(t, st2, "back")
    support.stop_server(server2, address)
end

function tests.failures_and_misuse(t)
    t.refused(E.ECONNREFUSED, "", shmipc.session_manager(support.address("nobody")))
    t.refused(E.EINVAL, "session_num", shmipc.session_manager(support.address("x"), { session_num = 0 }))
    t.raises("string expected", shmipc.session_manager, nil)
    local address = support.address("mmisuse")
    local server <close> = support.lua_server("echo", address)
    local m <close> = t.ok(shmipc.session_manager(address))
    t.raises("shmipc.stream expected", m.put_back, m, m)
    t.raises("shmipc.session_manager expected", m.get_stream, {})
    local st <close> = t.ok(m:get_stream())
    t.refused(E.ENOTSUP, "only streams of a session handle", st:pollfd())
    support.stop_server(server, address)
end

function tests.streams_under_the_scheduler(t)
    -- Manager streams have no descriptor: they yield nil, and the scheduler retries them
    -- through events() and its backstop.
    local address = support.address("msched")
    local server <close> = support.lua_server("echo", address)
    local m <close> = t.ok(shmipc.session_manager(address))
    local done = 0
    local sched = scheduler.new()
    for i = 1, 4 do
        sched:spawn(function()
            for r = 1, 20 do
                local st = assert(m:get_stream())
                local msg = "task " .. i .. " round " .. r
                assert(st:write(msg):flush())
                assert(assert(st:read(#msg, "yield")) == msg)
                m:put_back(st)
            end
            done = done + 1
        end)
    end
    sched:run()
    t.eq(done, 4, "tasks")
    support.stop_server(server, address)
end

return tests
