-- Description: coroutine-driven IO: reads, accepts and accept_streams in "yield" mode yield
-- fd, "r", timeout, handle and retry when resumed; the reference scheduler
-- (examples/lua/scheduler.lua) runs many streams of one session, a coroutine server against
-- the C greeter clients, timeouts and ends of stream; shmipc.poll and events().
local shmipc = require "shmipc"
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local support = dofile(here .. "/ipc_support.lua")
local scheduler = dofile(support.source_dir .. "/examples/lua/scheduler.lua")

local E = shmipc.errors
local tests = {}

function tests.yield_protocol_by_hand(t)
    local address = support.address("byhand")
    local server <close> = support.greeter_server(address)
    local s <close> = t.ok(shmipc.connect(address))
    local st <close> = t.ok(s:open_stream())
    local co = coroutine.create(function()
        return st:read(#support.REPLY, "yield")
    end)
    -- Nothing was sent yet, so the read cannot complete: it yields.
    local ok, fd, ev, timeout, handle = coroutine.resume(co)
    t.eq(ok, true, "resume")
    t.eq(coroutine.status(co), "suspended", "status")
    t.eq(fd, s:fileno(), "yields the session's descriptor")
    t.eq(ev, "r", "for reading")
    t.eq(timeout, nil, "no read timeout")
    t.eq(handle, st, "and the stream")
    t.eq(st:events(), "", "events")
    t.ok(st:write(support.REQUEST):flush())
    local results
    for _ = 1, 200 do
        t.ok(shmipc.poll({ fd }, 5))
        results = table.pack(coroutine.resume(co, "values passed to resume are ignored"))
        if coroutine.status(co) == "dead" then
            break
        end
    end
    t.eq(results[1], true, "resume")
    t.eq(results[2], support.REPLY, "the read's result")
    t.eq(results.n, 2, "one result")
end

function tests.yield_timeout(t)
    local address = support.address("ytimeout")
    local server <close> = support.greeter_server(address)
    local s <close> = t.ok(shmipc.connect(address))
    local st <close> = t.ok(s:open_stream())
    t.ok(st:set_timeout("read", 0.05))
    local co = coroutine.create(function()
        return st:read_chunk(nil, "yield")
    end)
    local _, _, _, timeout = coroutine.resume(co)
    t.truthy(timeout and timeout > 0 and timeout <= 0.05, "seconds left: " .. tostring(timeout))
    support.sleep(0.06)
    local ok, v, msg, code = coroutine.resume(co)
    t.eq(ok, true, "resume")
    t.eq(v, nil, "result")
    t.eq(code, E.ETIMEDOUT, "code")
    t.truthy(msg:find("read_chunk: timed out", 1, true), msg)
end

function tests.yield_on_a_closed_handle(t)
    local address = support.address("yclosed")
    local server <close> = support.greeter_server(address)
    local s <close> = t.ok(shmipc.connect(address))
    local st = t.ok(s:open_stream())
    local co = coroutine.create(function()
        return st:read(1, "yield")
    end)
    coroutine.resume(co)
    st:close()
    local ok, err = coroutine.resume(co)
    t.eq(ok, false, "the retry raised")
    t.truthy(tostring(err):find("attempt to use a closed shmipc.stream", 1, true), tostring(err))
end

function tests.stream_closed_by_another_task(t)
    local address = support.address("yclosed2")
    local server <close> = support.greeter_server(address)
    local s <close> = t.ok(shmipc.connect(address))
    local st = t.ok(s:open_stream())
    local err
    local sched = scheduler.new()
    sched:spawn(function()
        local ok, e = pcall(st.read, st, 1, "yield")
        err = e
    end)
    sched:spawn(function()
        scheduler.sleep(0.01)
        st:close()
    end)
    sched:run()
    t.truthy(tostring(err):find("attempt to use a closed shmipc.stream", 1, true), tostring(err))
end

function tests.session_close_wakes_a_yielded_read(t)
    local address = support.address("yclose")
    local server <close> = support.greeter_server(address)
    local s = t.ok(shmipc.connect(address))
    local st <close> = t.ok(s:open_stream())
    local result
    local sched = scheduler.new()
    sched:spawn(function()
        result = table.pack(st:read(1, "yield"))
    end)
    sched:spawn(function()
        scheduler.sleep(0.02)
        s:close()
    end)
    sched:run()
    t.eq(result[1], nil, "result")
    t.eq(result[3], E.ECLOSED, "code")
end

-- `n` tasks share one session, each with its own stream, `rounds` echoes each.
local function many_streams(t, n, rounds, cfg)
    local address = support.address("many")
    local server <close> = support.lua_server("echo", address)
    local s <close> = t.ok(shmipc.connect(address, cfg))
    local done = 0
    local sched = scheduler.new()
    for i = 1, n do
        sched:spawn(function()
            local st <close> = assert(s:open_stream())
            -- Nothing was sent on this stream yet, so this read must yield (then time out):
            -- the echoes below may all be back before their reads (a fast peer that spins),
            -- and the yield path would go unexercised.
            st:set_timeout("read", 0.05)
            local none, _, code = st:read(1, "yield")
            assert(none == nil and code == shmipc.errors.ETIMEDOUT, code)
            st:set_timeout("read", nil)
            for r = 1, rounds do
                local msg = string.format("task %3d round %4d", i, r)
                assert(st:write(msg):flush())
                local got = assert(st:read(#msg, "yield"))
                assert(got == msg, got)
            end
            done = done + 1
        end)
    end
    sched:run()
    t.eq(done, n, "tasks done")
    t.truthy(sched.stats.yields > 0, "reads yielded: " .. sched.stats.yields)
    support.stop_server(server, address)
    return sched
end

function tests.scheduler_many_streams_one_session(t)
    many_streams(t, 8, 100)
end

function tests.scheduler_many_streams_v2(t)
    many_streams(t, 4, 50, { memmap = "devshm", path_prefix = support.shm_prefix("co") })
end

function tests.scheduler_many_streams_v4_eventfd(t)
    -- The descriptor is then an epoll set of the socket and the eventfd.
    many_streams(t, 4, 100, { with_v4_eventfd = true })
end

function tests.scheduler_many_streams_v4_polling(t)
    -- The descriptor then includes a timer that fires every polling interval.
    many_streams(t, 4, 50, { with_v4_event_queue_polling = 500 })
end

function tests.scheduler_end_of_stream(t)
    local address = support.address("yeof")
    local server <close> = support.lua_server("bye", address)
    local s <close> = t.ok(shmipc.connect(address))
    local got, code
    scheduler.run_tasks(function()
        local st <close> = assert(s:open_stream())
        assert(st:write("hi"):flush())
        local parts = {}
        while true do
            local data, _, c = st:read_chunk(nil, "yield")
            if not data then
                code = c
                break
            end
            parts[#parts + 1] = data
        end
        got = table.concat(parts)
    end)
    t.eq(got, "bye", "data")
    t.eq(code, E.EEOF, "then the end")
    support.stop_server(server, address)
end

function tests.scheduler_sleep_and_timeouts(t)
    local l <close> = t.ok(shmipc.listen(support.address("yacc")))
    local order = {}
    local accept_result
    local sched = scheduler.new()
    sched:spawn(function()
        accept_result = table.pack(l:accept(0.05, "yield"))
        order[#order + 1] = "accept"
    end)
    sched:spawn(function()
        scheduler.sleep(0.01)
        order[#order + 1] = "sleep"
    end)
    local t0 = shmipc.monotime()
    sched:run()
    local took = shmipc.monotime() - t0
    t.eq(accept_result[3], E.ETIMEDOUT, "accept timed out")
    t.truthy(accept_result[2]:find("accept: timed out", 1, true), accept_result[2])
    t.eq(table.concat(order, ","), "sleep,accept", "order")
    -- A timeout of 0 only looks, in "yield" mode too.
    t.refused(E.EAGAIN, "", coroutine.wrap(function()
        return l:accept(0, "yield")
    end)())
    t.truthy(took >= 0.045 and took < 3, "took " .. took)
end

function tests.coroutine_server_with_greeter_clients(t)
    local address = support.address("coserver")
    local l <close> = t.ok(shmipc.listen(address))
    local nclients = 3
    local clients = {}
    for i = 1, nclients do
        clients[i] = support.greeter_client(address, i == 2 and "v2" or "v3")
    end
    local served, versions = 0, {}
    local sched = scheduler.new()
    local function serve_session(s)
        local st <close> = assert(s:accept_stream(10, "yield"))
        local req = assert(st:read(#support.REQUEST, "yield"))
        assert(req == support.REQUEST, req)
        assert(st:write(support.REPLY):flush())
        local _, _, code = st:read_chunk(nil, "yield")
        assert(code == E.EEOF or code == E.ECONNRESET, code)
        versions[#versions + 1] = s:version()
        served = served + 1
        s:close()
    end
    sched:spawn(function()
        for _ = 1, nclients do
            local s = assert(l:accept(10, "yield"))
            sched:spawn(serve_session, s)
        end
    end)
    sched:run()
    t.eq(served, nclients, "sessions served")
    table.sort(versions)
    t.eq(table.concat(versions, ","), "2,3,3", "protocol versions")
    for i = 1, nclients do
        local ok, out = clients[i]:finish()
        t.truthy(ok, "client " .. i .. ": " .. out)
    end
end

function tests.poll(t)
    local t0 = shmipc.monotime()
    local ready = t.ok(shmipc.poll({}, 0.02))
    t.eq(#ready, 0, "timeout: nothing ready")
    t.truthy(shmipc.monotime() - t0 >= 0.015, "waited")
    -- A descriptor that is not open is "ready": a read on it would not wait.
    local got = t.ok(shmipc.poll({ 1000000 }, 0))
    t.eq(got[1], 1000000, "invalid descriptor reported")
    t.raises("table expected", shmipc.poll, 3)
    t.raises("entry 1 is not a descriptor", shmipc.poll, { "x" })
    t.raises("entry 2 is not a descriptor", shmipc.poll, { 0, -1 })
    t.raises("timeout must be a number of seconds", shmipc.poll, {}, 0 / 0)
    -- A negative timeout waits forever (the rule of every wait): poll() with one ready fd.
    t.eq(t.ok(shmipc.poll({ 1000000 }, -1))[1], 1000000, "negative: forever, ready at once")
    t.eq(math.type(shmipc.monotime()), "float", "monotime")
end

function tests.events_sees_data_that_another_read_took_off_the_socket(t)
    -- Two streams of one session: the data for the second arrives while the first is read,
    -- so the descriptor no longer shows it; events() does.
    local address = support.address("stolen")
    local server <close> = support.lua_server("echo", address)
    local s <close> = t.ok(shmipc.connect(address))
    local a <close> = t.ok(s:open_stream())
    local b <close> = t.ok(s:open_stream())
    t.ok(b:write("for b"):flush())
    t.ok(a:write("for a"):flush())
    t.eq(a:read(5), "for a", "a's echo")
    -- b's echo went out before a's, so it was processed by a's blocking read.
    t.eq(b:available(), 5, "b's data is already here")
    t.eq(b:events(), "r", "events() says so")
    t.eq(b:read(5, "nb"), "for b", "and a non-blocking read gets it")
    support.stop_server(server, address)
end

return tests
