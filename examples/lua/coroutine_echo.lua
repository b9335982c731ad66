-- Run: LUA_CPATH='build/lua/?.so;;' lua5.4 examples/lua/coroutine_echo.lua server unix:@echo &
--      LUA_CPATH='build/lua/?.so;;' lua5.4 examples/lua/coroutine_echo.lua client unix:@echo [TASKS [ROUNDS]]
--      (from the source tree; the client stops the server when it is done)
--
-- coroutine_echo.lua: many coroutines sharing one session without blocking each other. The
-- server echoes every stream with listener:serve() callbacks. The client runs TASKS
-- coroutines under examples/lua/scheduler.lua, each with its own stream of one session; their
-- reads use the "yield" mode, so a read that would block hands the interpreter to the others.
local shmipc = require "shmipc"

local mode, address = arg[1], arg[2] or "unix:@shmipc-coroutine-echo"

if mode == "server" then
    local l <close> = assert(shmipc.listen(address))
    print("coroutine_echo: listening on " .. address)
    io.stdout:flush()
    assert(l:serve(nil, function(st)
        -- Callbacks must not block: read with "nb" until there is nothing more.
        while true do
            local data, _, code = st:read_chunk(nil, "nb")
            if not data then
                if code ~= shmipc.errors.EAGAIN then
                    st:close() -- its end, or its session's
                end
                return
            end
            if data == "stop" then
                l:stop()
            end
            assert(st:write(data):flush())
        end
    end))
    print("coroutine_echo: stopped")
    return
elseif mode ~= "client" then
    io.stderr:write("usage: coroutine_echo.lua server|client [ADDRESS [TASKS [ROUNDS]]]\n")
    os.exit(2)
end

-- The scheduler sits beside this file.
local here = arg[0]:match("^(.*)/[^/]*$") or "."
local scheduler = dofile(here .. "/scheduler.lua")

local tasks, rounds = tonumber(arg[3] or "8"), tonumber(arg[4] or "1000")
local s <close> = assert(shmipc.connect(address))
local sched = scheduler.new()
for i = 1, tasks do
    sched:spawn(function()
        local st <close> = assert(s:open_stream())
        for r = 1, rounds do
            local msg = string.format("task %d round %d", i, r)
            assert(st:write(msg):flush())
            local echo = assert(st:read(#msg, "yield")) -- yields while the echo is on its way
            assert(echo == msg, echo)
        end
    end)
end
local t0 = shmipc.monotime()
sched:run()
local took = shmipc.monotime() - t0
print(string.format("coroutine_echo: %d tasks x %d round trips in %.3f s (%.0f/s), %d yields",
    tasks, rounds, took, tasks * rounds / took, sched.stats.yields))

-- Tell the server to stop.
local st <close> = assert(s:open_stream())
assert(st:write("stop"):flush())
st:read_chunk()
