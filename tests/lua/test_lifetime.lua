-- Description: handle lifetimes: <close> and the collector release every descriptor and
-- /dev/shm file, a stream keeps its session alive, close is safe twice on every handle, and a
-- closed handle raises.
local shmipc = require "shmipc"
local support = dofile((debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or ".") .. "/ipc_support.lua")

local tests = {}

local function full_gc()
    collectgarbage()
    collectgarbage()
end

-- Runs fn and checks that the process has as many descriptors afterwards as before.
local function same_fds(t, what, fn)
    full_gc()
    local before = support.fd_count()
    fn()
    local during = support.fd_count()
    full_gc()
    t.eq(support.fd_count(), before, what .. ": descriptors after")
    return during - before
end

function tests.close_scope_releases_everything(t)
    local address = support.address("closefd")
    local server <close> = support.lua_server("echo", address)
    local grew = same_fds(t, "<close>", function()
        local s <close> = t.ok(shmipc.connect(address))
        local streams = {}
        for i = 1, 4 do
            local st <close> = t.ok(s:open_stream())
            t.ok(st:write("ping " .. i):flush())
            t.eq(st:read(6), "ping " .. i, "echo")
        end
        -- Checked before the scope ends: the session holds descriptors while open.
        t.truthy(support.fd_count() > 0, "count")
    end)
    support.stop_server(server, address)
end

function tests.collector_releases_everything(t)
    local address = support.address("gcfd")
    local server <close> = support.lua_server("echo", address)
    local weak = setmetatable({}, { __mode = "v" })
    local grew = same_fds(t, "collector", function()
        -- Nothing here is closed: the collector must do it.
        for i = 1, 3 do
            local s = t.ok(shmipc.connect(address))
            local st = t.ok(s:open_stream())
            t.ok(st:write("x"):flush())
            t.eq(st:read(1), "x", "echo")
            weak[#weak + 1] = s
            weak[#weak + 1] = st
        end
        t.truthy(support.fd_count() > 0, "count")
    end)
    t.eq(next(weak), nil, "every handle collected")
    support.stop_server(server, address)
end

function tests.descriptors_are_held_while_open(t)
    local address = support.address("held")
    local server <close> = support.greeter_server(address)
    full_gc()
    local before = support.fd_count()
    local s = t.ok(shmipc.connect(address))
    t.truthy(support.fd_count() > before, "a session holds descriptors")
    s:close()
    t.eq(support.fd_count(), before, "after close")
end

function tests.stream_keeps_its_session_alive(t)
    local address = support.address("keepalive")
    local server <close> = support.greeter_server(address)
    local weak = setmetatable({}, { __mode = "v" })
    local st
    do
        local s = t.ok(shmipc.connect(address))
        weak[1] = s
        st = t.ok(s:open_stream())
    end
    full_gc()
    t.truthy(weak[1] ~= nil, "the session is reachable through its stream")
    -- Still a live session: the collector did not hard-close it.
    t.ok(st:write(support.REQUEST):flush())
    t.eq(st:read(#support.REPLY), support.REPLY, "reply")
    st:close()
    st = nil
    full_gc()
    t.eq(weak[1], nil, "the session goes once its last stream does")
end

function tests.devshm_files_removed_by_the_collector(t)
    local address = support.address("v2gc")
    local prefix = support.shm_prefix("gc")
    local server <close> = support.greeter_server(address)
    do
        local s = t.ok(shmipc.connect(address, { memmap = "devshm", path_prefix = prefix }))
        local st = t.ok(s:open_stream())
        t.ok(st:write(support.REQUEST):flush())
        t.eq(st:read(#support.REPLY), support.REPLY, "reply")
        t.truthy(#support.shm_files(prefix) > 0, "files while open")
    end
    full_gc()
    t.eq(#support.shm_files(prefix), 0, "files after the collection")
end

-- Number of mappings of this process whose name contains `text`.
local function mappings(text)
    local n = 0
    for line in io.lines("/proc/self/maps") do
        if line:find(text, 1, true) then
            n = n + 1
        end
    end
    return n
end

function tests.mapping_outlives_the_hard_close(t)
    -- After session:close() the streams fail with ECLOSED, but the shared memory stays mapped
    -- (and its descriptors open) until the last stream handle is closed.
    local address = support.address("outlive")
    local label = "shmipc-lua-maps-" .. support.pid()
    local server <close> = support.greeter_server(address)
    full_gc()
    local before = support.fd_count()
    local s = t.ok(shmipc.connect(address, { path_prefix = label }))
    local st = t.ok(s:open_stream())
    t.truthy(mappings(label) >= 2, "buffer and queue mapped")
    s:close()
    t.truthy(mappings(label) >= 2, "still mapped after the hard close")
    t.refused(shmipc.errors.ECLOSED, "", st:read(1))
    st:close()
    t.eq(mappings(label), 0, "unmapped with the last stream")
    full_gc()
    t.eq(support.fd_count(), before, "descriptors after the last stream")
end

function tests.close_twice_on_every_handle(t)
    local address = support.address("twice")
    local server <close> = support.greeter_server(address)
    local s = t.ok(shmipc.connect(address))
    local st = t.ok(s:open_stream())
    local l = t.ok(shmipc.listen(support.address("twice-l")))
    for _, h in ipairs({ st, s, l }) do
        h:close()
        h:close()
        getmetatable(h).__close(h)
        getmetatable(h).__gc(h)
        t.truthy(tostring(h):find("(closed)", 1, true), tostring(h))
    end
    t.raises("attempt to use a closed shmipc.listener", l.accept, l, 0)
    t.raises("attempt to use a closed shmipc.stream", st.write, st, "x")
    t.raises("attempt to use a closed shmipc.stream", st.available, st)
    t.raises("attempt to use a closed shmipc.session", s.process, s)
end

function tests.close_scope_on_error(t)
    local address = support.address("scoperr")
    local server <close> = support.greeter_server(address)
    local kept
    local ok = pcall(function()
        local s <close> = assert(shmipc.connect(address))
        kept = s
        error("leaving the scope by an error")
    end)
    t.eq(ok, false, "raised")
    t.eq(tostring(kept), "shmipc.session (closed)", "closed by <close>")
end

return tests
