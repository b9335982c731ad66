-- Use: local scheduler = dofile("examples/lua/scheduler.lua")   (or put it on LUA_PATH)
--
-- scheduler.lua: a tiny reference scheduler that drives shmipc from coroutines. A task is a
-- function run as a coroutine; it calls shmipc in "yield" mode (stream:read(n, "yield"),
-- session:accept_stream(nil, "yield"), listener:accept(nil, "yield")), and each call that
-- would block yields
--
--     fd (or nil), "r", seconds left before its timeout (or nil), handle
--
-- to this scheduler, which resumes the task when the descriptor is readable, when
-- handle:events() says a retry would succeed, or when the timeout has passed; the call then
-- tries again by itself. Tasks may also yield that shape on their own: yield(fd, "r") for any
-- descriptor, or scheduler.sleep(seconds).
--
--     local sched = scheduler.new()
--     sched:spawn(function() local s = assert(shmipc.connect(addr)) ... end)
--     sched:run()          -- until every task has ended; raises a task's error
--
-- Why it also asks handle:events() and never sleeps longer than `backstop` seconds while a
-- shmipc call waits: a non-blocking call on one stream processes the events of the whole
-- session, so data or an end for a stream whose task sleeps may have been taken off the
-- socket already, and the descriptor no longer shows it. events() sees data and the ends of
-- streams and sessions; a new stream to accept is only seen by trying again, which the
-- backstop does (see docs/lua.md). Handles without a descriptor (session-manager streams)
-- are retried after a delay that grows while nothing happens.
local shmipc = require "shmipc"

local scheduler = {}
scheduler.__index = scheduler

-- new([opts]) -> scheduler. opts.backstop: the longest sleep, in seconds, while a shmipc
-- call waits (default 0.05). Calls on handles without a descriptor (session-manager streams)
-- are retried after a delay that grows from opts.min_delay (0.0001 s) to opts.max_delay
-- (0.01 s) while nothing happens.
function scheduler.new(opts)
    opts = opts or {}
    return setmetatable({
        backstop = opts.backstop or 0.05,
        min_delay = opts.min_delay or 0.0001,
        max_delay = opts.max_delay or 0.01,
        delay = opts.min_delay or 0.0001,
        ready = {},   -- tasks to resume, in order
        waiting = {}, -- task -> { fd =, deadline =, handle = }
        ntasks = 0,
        stats = { resumes = 0, polls = 0, yields = 0 },
    }, scheduler)
end

-- spawn(fn, ...) -> coroutine: runs fn(...) as a task from the next turn on.
function scheduler:spawn(fn, ...)
    local args = table.pack(...)
    local co = coroutine.create(function() return fn(table.unpack(args, 1, args.n)) end)
    self.ntasks = self.ntasks + 1
    self.ready[#self.ready + 1] = co
    return co
end

-- sleep(seconds): called from a task, suspends it that long.
function scheduler.sleep(seconds)
    coroutine.yield(nil, nil, seconds)
end

-- Resumes one task and files it as ended or waiting.
function scheduler:step(co)
    self.stats.resumes = self.stats.resumes + 1
    local ok, fd, _, timeout, handle = coroutine.resume(co)
    if not ok then
        error(debug.traceback(co, tostring(fd)), 0)
    end
    if coroutine.status(co) == "dead" then
        self.ntasks = self.ntasks - 1
        return
    end
    self.stats.yields = self.stats.yields + 1
    if fd == nil and timeout == nil and handle == nil then
        -- A bare coroutine.yield(): just let the others run first.
        self.ready[#self.ready + 1] = co
        return
    end
    self.waiting[co] = {
        fd = math.type(fd) == "integer" and fd or nil,
        deadline = timeout and shmipc.monotime() + timeout or nil,
        handle = handle,
    }
end

-- Moves a waiting task to the ready list.
function scheduler:wake(co)
    self.waiting[co] = nil
    self.ready[#self.ready + 1] = co
end

-- Whether a retry on `handle` would not wait, as far as handle:events() can tell. A handle
-- that another task closed raises there: its task is woken to meet that error itself.
local function retry_would_succeed(handle)
    if handle == nil or handle.events == nil then
        return false
    end
    local ok, ev = pcall(handle.events, handle)
    return not ok or ev ~= ""
end

-- run(): runs until every task has ended.
function scheduler:run()
    while self.ntasks > 0 do
        local ready = self.ready
        self.ready = {}
        for _, co in ipairs(ready) do
            self:step(co)
        end
        if self.ntasks == 0 then
            break
        end
        -- Without waiting: deadlines that passed, and handles that say a retry succeeds.
        local now = shmipc.monotime()
        for co, w in pairs(self.waiting) do
            if (w.deadline and now >= w.deadline) or retry_would_succeed(w.handle) then
                self:wake(co)
            end
        end
        if #self.ready == 0 then
            self:wait(now)
        else
            self.delay = self.min_delay
        end
    end
end

-- Sleeps in poll until a descriptor is readable, a deadline passes, or the backstop ends.
function scheduler:wait(now)
    local fds, seen, timeout, cap = {}, {}, nil, nil
    for _, w in pairs(self.waiting) do
        if w.fd and not seen[w.fd] then
            seen[w.fd] = true
            fds[#fds + 1] = w.fd
        end
        if w.deadline then
            local left = math.max(0, w.deadline - now)
            timeout = timeout and math.min(timeout, left) or left
        end
        if w.handle ~= nil then
            cap = math.min(cap or math.huge, w.fd and self.backstop or self.delay)
        end
    end
    if cap then
        timeout = timeout and math.min(timeout, cap) or cap
        self.delay = math.min(self.delay * 2, self.max_delay)
    end
    if #fds == 0 and timeout == nil then
        error("scheduler: every task waits, with nothing that could wake one", 0)
    end
    self.stats.polls = self.stats.polls + 1
    local got, err, code = shmipc.poll(fds, timeout)
    if not got then
        if code == shmipc.errors.EINTR then
            return
        end
        error("scheduler: poll: " .. tostring(err), 0)
    end
    local readable = {}
    for _, fd in ipairs(got) do
        readable[fd] = true
    end
    now = shmipc.monotime()
    for co, w in pairs(self.waiting) do
        -- A shmipc call is cheap to retry, so after a quiet backstop every one tries again.
        if (w.fd and readable[w.fd]) or (w.deadline and now >= w.deadline)
            or (#got == 0 and w.handle ~= nil) then
            self:wake(co)
        end
    end
end

-- scheduler.run_tasks(fn, ...): runs the given task functions to their ends.
function scheduler.run_tasks(...)
    local s = scheduler.new()
    for _, fn in ipairs({ ... }) do
        s:spawn(fn)
    end
    s:run()
    return s
end

return scheduler
