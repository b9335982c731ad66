-- Description: the config handle: defaults, every setter's good and bad values, the
-- nil, message, code convention, misuse raising, close, clone and shmipc.config{...}.
-- The value cases mirror tests/c/test_config.c.
local shmipc = require "shmipc"

local EINVAL = shmipc.errors.EINVAL
local ENAMETOOLONG = shmipc.errors.ENAMETOOLONG

local tests = {}

-- Asserts that a setter succeeded by returning the config itself.
local function set(t, cfg, ...)
    local v, msg, code = ...
    if v == nil then
        error(string.format("setter failed: %s (%s)", tostring(msg), tostring(code)), 2)
    end
    t.eq(v, cfg, "setter result")
    t.eq(select("#", ...), 1, "setter results")
end

function tests.defaults_match_reference(t)
    local cfg = shmipc.config()
    t.eq(cfg:memmap(), "memfd", "memmap")
    t.eq(cfg:buffer_capacity(), 32 << 20, "buffer_capacity")
    t.eq(cfg:queue_capacity(), 8192, "queue_capacity")
    t.eq(cfg:path_prefix(), "/dev/shm/shmipc", "path_prefix")
    local c = cfg:slice_classes()
    t.eq(#c, 3, "slice classes")
    t.eq(c[1].size, 8172, "class 1 size")
    t.eq(c[1].percent, 50, "class 1 percent")
    t.eq(c[2].size, 32748, "class 2 size")
    t.eq(c[2].percent, 30, "class 2 percent")
    t.eq(c[3].size, 131052, "class 3 size")
    t.eq(c[3].percent, 20, "class 3 percent")
    t.eq(cfg:initialize_timeout(), 1.0, "initialize_timeout")
    t.eq(cfg:connection_write_timeout(), 10.0, "connection_write_timeout")
    t.eq(cfg:read_timeout(), -1, "read_timeout: forever")
    t.eq(cfg:write_timeout(), -1, "write_timeout: forever")
    local name, fallback = cfg:protocol()
    t.eq(name, "legacy", "protocol")
    t.eq(fallback, false, "fallback")
    local wakeup, interval = cfg:wakeup()
    t.eq(wakeup, "socket", "wakeup")
    t.eq(interval, 0, "polling interval")
    t.eq(cfg:validate(), true, "validate()")
end

function tests.buffer_capacity(t)
    local cfg = shmipc.config()
    set(t, cfg, cfg:buffer_capacity(1 << 30))
    t.eq(cfg:buffer_capacity(), 1 << 30, "buffer_capacity")
    t.refused(EINVAL, "buffer_capacity", cfg:buffer_capacity((1 << 20) - 1))
    t.refused(EINVAL, "below the minimum", cfg:buffer_capacity(0))
    t.refused(EINVAL, "buffer_capacity", cfg:buffer_capacity(1 << 32))
    t.refused(EINVAL, "buffer_capacity: -1 is negative", cfg:buffer_capacity(-1))
    t.refused(EINVAL, "buffer_capacity", cfg:buffer_capacity(math.mininteger))
    t.refused(EINVAL, "buffer_capacity", cfg:buffer_capacity(math.maxinteger))
    t.eq(cfg:buffer_capacity(), 1 << 30, "buffer_capacity after refusals")
    -- 1 MiB holds the default classes: 20 % of it still fits one 128 KiB slice.
    set(t, cfg, cfg:buffer_capacity(1 << 20))
    set(t, cfg, cfg:buffer_capacity(2097152.0))
    t.eq(cfg:buffer_capacity(), 2 << 20, "buffer_capacity from an integral float")
end

function tests.buffer_capacity_must_hold_every_class(t)
    local cfg = shmipc.config()
    set(t, cfg, cfg:buffer_capacity(4 << 20))
    set(t, cfg, cfg:slice_classes({ { 4096, 50 }, { 600000, 50 } }))
    -- At 1 MiB, half the region cannot hold one 600000-byte slice.
    t.refused(EINVAL, "buffer_capacity", cfg:buffer_capacity(1 << 20))
    t.eq(cfg:buffer_capacity(), 4 << 20, "buffer_capacity unchanged")
end

function tests.queue_capacity(t)
    local cfg = shmipc.config()
    for _, n in ipairs({ 1, 16, 64, 1024, 8192, 65535, 65536, 1 << 24 }) do
        set(t, cfg, cfg:queue_capacity(n))
        t.eq(cfg:queue_capacity(), n, "queue_capacity")
    end
    t.refused(EINVAL, "queue_capacity", cfg:queue_capacity(0))
    t.refused(EINVAL, "queue_capacity", cfg:queue_capacity((1 << 24) + 16))
    for _, n in ipairs({ 8, 24, 2, 18, 65544 }) do
        t.refused(EINVAL, "split lock", cfg:queue_capacity(n))
    end
    -- Values that do not fit the C uint32_t are refused here, never truncated (2^32 + 16
    -- would otherwise become 16, a valid capacity).
    t.refused(EINVAL, "queue_capacity: -1 is negative", cfg:queue_capacity(-1))
    t.refused(EINVAL, "queue_capacity", cfg:queue_capacity((1 << 32) + 16))
    t.eq(cfg:queue_capacity(), 1 << 24, "queue_capacity after refusals")
end

function tests.slice_classes_sorted_and_checked(t)
    local cfg = shmipc.config()
    set(t, cfg, cfg:buffer_capacity(1 << 20))
    set(t, cfg, cfg:slice_classes({ { 16364, 40 }, { 4076, 60 } }))
    local got = cfg:slice_classes()
    t.eq(#got, 2, "classes")
    t.eq(got[1].size, 4076, "class 1 size")
    t.eq(got[1].percent, 60, "class 1 percent")
    t.eq(got[2].size, 16364, "class 2 size")
    t.eq(got[2].percent, 40, "class 2 percent")
    -- Named fields, and both forms mixed.
    set(t, cfg, cfg:slice_classes({ { size = 8192, percent = 70 }, { 4096, 30 } }))
    got = cfg:slice_classes()
    t.eq(got[1].size, 4096, "named class 1 size")
    t.eq(got[2].percent, 70, "named class 2 percent")
    -- The getter returns a fresh table each time.
    got[1].size = 1
    t.eq(cfg:slice_classes()[1].size, 4096, "getter copy")
end

function tests.slice_classes_refused(t)
    local cfg = shmipc.config()
    local many = {}
    for i = 1, 33 do
        many[i] = { 64 + i, 1 }
    end
    t.refused(EINVAL, "sum to 90", cfg:slice_classes({ { 4096, 40 }, { 8192, 50 } }))
    t.refused(EINVAL, "sum to 110", cfg:slice_classes({ { 4096, 60 }, { 8192, 50 } }))
    t.refused(EINVAL, "size 0", cfg:slice_classes({ { 0, 100 } }))
    t.refused(EINVAL, "multiple of 4", cfg:slice_classes({ { 4097, 100 } }))
    t.refused(EINVAL, "percent 0", cfg:slice_classes({ { 4096, 0 }, { 8192, 100 } }))
    t.refused(EINVAL, "twice", cfg:slice_classes({ { 4096, 50 }, { 4096, 50 } }))
    t.refused(EINVAL, "larger than buffer_capacity", cfg:slice_classes({ { (32 << 20) + 4, 100 } }))
    t.refused(EINVAL, "slice_classes: 33 classes", cfg:slice_classes(many))
    t.refused(EINVAL, "slice_classes", cfg:slice_classes({}))
    t.refused(EINVAL, "slice_classes: entry 1 has size -1", cfg:slice_classes({ { -1, 100 } }))
    t.refused(EINVAL, "slice_classes: entry 2 has percent", cfg:slice_classes({ { 1, 50 }, { 2, 1 << 32 } }))
    local got = cfg:slice_classes()
    t.eq(#got, 3, "classes unchanged")
    t.eq(got[1].size, 8172, "class 1 unchanged")
end

function tests.slice_classes_misuse_raises(t)
    local cfg = shmipc.config()
    t.raises("string or table expected", cfg.slice_classes, cfg, 42)
    t.raises("string or table expected", cfg.slice_classes, cfg, nil)
    t.raises("entry 1 is a number", cfg.slice_classes, cfg, { 4096, 100 })
    t.raises("entry 1: size must be an integer, got string", cfg.slice_classes, cfg, { { "4096", 100 } })
    t.raises("entry 1: percent must be an integer, got nil", cfg.slice_classes, cfg, { { 4096 } })
    t.raises("percent must be an integer, got number", cfg.slice_classes, cfg, { { 4096, 99.5 } })
    t.raises("NUL", cfg.slice_classes, cfg, "4096:100\0junk")
end

function tests.slice_class_with_one_slice_is_allowed(t)
    -- The exchange-fallback vector: 1 MiB with one 524268-byte class, a single slice.
    local cfg = shmipc.config()
    set(t, cfg, cfg:buffer_capacity(1 << 20))
    set(t, cfg, cfg:slice_classes("524268:100"))
    t.eq(cfg:slice_classes()[1].size, 524268, "size")
end

function tests.parse_slice_classes(t)
    local cfg = shmipc.config()
    set(t, cfg, cfg:slice_classes(" 131052:20, 8172 : 50,32748:30"))
    local got = cfg:slice_classes()
    t.eq(#got, 3, "classes")
    t.eq(got[1].size, 8172, "class 1 size")
    t.eq(got[3].size, 131052, "class 3 size")
    for _, bad in ipairs({ "", "4096", "4096:", ":100", "4096:100,", "4096;100", "4096:100 8192:0",
        "99999999999:100", "-1:100", "4096:1e2" }) do
        t.refused(EINVAL, "slice_classes", cfg:slice_classes(bad))
    end
    t.eq(#cfg:slice_classes(), 3, "classes unchanged")
end

function tests.memmap(t)
    local cfg = shmipc.config()
    set(t, cfg, cfg:memmap("devshm"))
    t.eq(cfg:memmap(), "devshm", "memmap")
    t.refused(EINVAL, 'memmap: "tmpfs" is neither', cfg:memmap("tmpfs"))
    t.refused(EINVAL, "memmap", cfg:memmap("MEMFD"))
    t.refused(EINVAL, "memmap", cfg:memmap("memfd\0"))
    t.refused(EINVAL, "memmap", cfg:memmap(""))
    t.eq(cfg:memmap(), "devshm", "memmap unchanged")
    set(t, cfg, cfg:memmap("memfd"))
    t.eq(cfg:memmap(), "memfd", "memmap back")
    t.raises("string expected", cfg.memmap, cfg, {})
    t.raises("string expected", cfg.memmap, cfg, nil)
end

function tests.path_prefix(t)
    local cfg = shmipc.config()
    set(t, cfg, cfg:path_prefix("/dev/shm/myapp"))
    t.eq(cfg:path_prefix(), "/dev/shm/myapp", "path_prefix")
    t.refused(EINVAL, "path_prefix", cfg:path_prefix(""))
    t.refused(EINVAL, "path_prefix", cfg:path_prefix("a\nb"))
    t.refused(ENAMETOOLONG, "path_prefix", cfg:path_prefix("/" .. string.rep("a", 180)))
    set(t, cfg, cfg:path_prefix("/" .. string.rep("a", 179)))
    -- memfd names are labels, so a relative prefix is fine there but not with files.
    set(t, cfg, cfg:path_prefix("label"))
    t.refused(EINVAL, "path_prefix", cfg:memmap("devshm"))
    set(t, cfg, cfg:path_prefix("/dev/shm/x"))
    set(t, cfg, cfg:memmap("devshm"))
    t.refused(EINVAL, "absolute", cfg:path_prefix("label"))
    t.eq(cfg:path_prefix(), "/dev/shm/x", "path_prefix unchanged")
    t.raises("string expected", cfg.path_prefix, cfg, nil)
    t.raises("NUL", cfg.path_prefix, cfg, "/dev/shm/a\0b")
end

function tests.timeouts_in_seconds(t)
    local cfg = shmipc.config()
    set(t, cfg, cfg:read_timeout(1.5))
    t.eq(cfg:read_timeout(), 1.5, "read_timeout")
    set(t, cfg, cfg:write_timeout(0))
    t.eq(cfg:write_timeout(), 0, "write_timeout 0: do not wait")
    set(t, cfg, cfg:write_timeout(-1))
    t.eq(cfg:write_timeout(), -1, "write_timeout forever reads back as -1")
    -- The largest that fits the C int of milliseconds.
    set(t, cfg, cfg:write_timeout(2147483.647))
    t.eq(cfg:write_timeout(), 2147483.647, "write_timeout max")
    t.refused(EINVAL, "write_timeout", cfg:write_timeout(2147483.648))
    set(t, cfg, cfg:initialize_timeout(0.05))
    t.eq(cfg:initialize_timeout(), 0.05, "initialize_timeout")
    set(t, cfg, cfg:connection_write_timeout(3600))
    t.eq(cfg:connection_write_timeout(), 3600.0, "connection_write_timeout")
    t.refused(EINVAL, "initialize_timeout", cfg:initialize_timeout(0))
    t.refused(EINVAL, "connection_write_timeout", cfg:connection_write_timeout(3600.001))
    t.eq(cfg:initialize_timeout(), 0.05, "initialize_timeout unchanged")
end

function tests.timeouts_round_to_milliseconds(t)
    local cfg = shmipc.config()
    set(t, cfg, cfg:read_timeout(0.0006))
    t.eq(cfg:read_timeout(), 0.001, "0.6 ms rounds up")
    set(t, cfg, cfg:read_timeout(1.0004))
    t.eq(cfg:read_timeout(), 1.001, "1000.4 ms rounds up")
    set(t, cfg, cfg:read_timeout(2))
    t.eq(cfg:read_timeout(), 2.0, "integer seconds")
    -- A positive timeout must never become 0, which means "do not wait".
    set(t, cfg, cfg:read_timeout(0.0001))
    t.eq(cfg:read_timeout(), 0.001, "0.1 ms rounds up to 1 ms, never to 0")
    set(t, cfg, cfg:read_timeout(0))
    t.eq(cfg:read_timeout(), 0.0, "0 does not wait, as in C")
end

function tests.timeouts_refused(t)
    local cfg = shmipc.config()
    for _, name in ipairs({ "initialize_timeout", "connection_write_timeout", "read_timeout",
        "write_timeout" }) do
        local before = cfg[name](cfg)
        t.refused(EINVAL, name .. ": not a number", cfg[name](cfg, 0 / 0))
        t.refused(EINVAL, name, cfg[name](cfg, math.huge))
        t.refused(EINVAL, name, cfg[name](cfg, 1e300))
        t.eq(cfg[name](cfg), before, name .. " unchanged")
        t.raises("number expected", cfg[name], cfg, "soon")
        -- nil and any negative value wait forever (read back as -1).
        for _, v in ipairs({ -1, -0.0001, -math.huge, -1e300 }) do
            set(t, cfg, cfg[name](cfg, v))
            t.eq(cfg[name](cfg), -1, name .. " forever")
        end
        set(t, cfg, cfg[name](cfg, 1))
        set(t, cfg, cfg[name](cfg, nil))
        t.eq(cfg[name](cfg), -1, name .. " nil: forever")
    end
end

function tests.protocol_and_wakeup(t)
    local cfg = shmipc.config()
    t.refused(EINVAL, "need protocol V4", cfg:wakeup("eventfd"))
    t.refused(EINVAL, 'protocol: "v3" is neither', cfg:protocol("v3"))
    t.refused(EINVAL, "fallback", cfg:protocol("legacy", true))
    set(t, cfg, cfg:protocol("v4", false))
    local name, fallback = cfg:protocol()
    t.eq(name, "v4", "protocol")
    t.eq(fallback, false, "fallback")
    set(t, cfg, cfg:wakeup("polling", 100))
    local wakeup, interval = cfg:wakeup()
    t.eq(wakeup, "polling", "wakeup")
    t.eq(interval, 100, "interval")
    t.refused(EINVAL, "polling_interval_us", cfg:wakeup("polling", 0))
    t.refused(EINVAL, "polling_interval_us", cfg:wakeup("polling"))
    t.refused(EINVAL, "polling_interval_us", cfg:wakeup("polling", 1000001))
    t.refused(EINVAL, "polling_interval_us", cfg:wakeup("polling", -1))
    t.refused(EINVAL, "polling_interval_us", cfg:wakeup("eventfd", 5))
    t.refused(EINVAL, 'wakeup: "busy" is not one of', cfg:wakeup("busy"))
    t.eq(cfg:wakeup(), "polling", "wakeup unchanged")
    -- Going back to legacy drops the V4-only wakeup.
    set(t, cfg, cfg:protocol("legacy"))
    wakeup, interval = cfg:wakeup()
    t.eq(wakeup, "socket", "wakeup after legacy")
    t.eq(interval, 0, "interval after legacy")
    set(t, cfg, cfg:protocol("v4", true))
    t.eq(select(2, cfg:protocol()), true, "fallback on")
end

function tests.protocol_and_wakeup_misuse_raises(t)
    local cfg = shmipc.config()
    t.raises("boolean expected", cfg.protocol, cfg, "v4", 1)
    t.raises("string expected", cfg.protocol, cfg, true)
    -- As everywhere in Lua's own libraries, a number is taken as a string; 4 is no name.
    t.refused(EINVAL, 'protocol: "4" is neither', cfg:protocol(4))
    t.raises("string expected", cfg.wakeup, cfg, nil, 100)
    t.raises("number expected", cfg.wakeup, cfg, "polling", "fast")
    t.raises("number has no integer representation", cfg.wakeup, cfg, "polling", 1.5)
end

function tests.eventfd_needs_memfd(t)
    local cfg = shmipc.config()
    set(t, cfg, cfg:memmap("devshm"))
    set(t, cfg, cfg:protocol("v4", true))
    t.refused(EINVAL, "memfd", cfg:wakeup("eventfd"))
    -- The helper switches to memfd itself, as the Rust helper does.
    set(t, cfg, cfg:with_v4_eventfd())
    t.eq(cfg:memmap(), "memfd", "memmap after with_v4_eventfd")
    t.refused(EINVAL, "eventfd", cfg:memmap("devshm"))
end

function tests.v4_helpers(t)
    local cfg = shmipc.config()
    set(t, cfg, cfg:with_v4())
    local name, fallback = cfg:protocol()
    t.eq(name, "v4", "protocol")
    t.eq(fallback, true, "fallback")
    t.eq(cfg:wakeup(), "socket", "wakeup")
    set(t, cfg, cfg:with_v4_eventfd())
    t.eq(cfg:wakeup(), "eventfd", "wakeup")
    set(t, cfg, cfg:with_v4_event_queue_polling(250))
    local wakeup, interval = cfg:wakeup()
    t.eq(wakeup, "polling", "wakeup")
    t.eq(interval, 250, "interval")
    t.refused(EINVAL, "polling_interval_us", cfg:with_v4_event_queue_polling(0))
    t.refused(EINVAL, "polling_interval_us", cfg:with_v4_event_queue_polling(-5))
    t.eq(select(2, cfg:wakeup()), 250, "interval unchanged")
    t.eq(cfg:validate(), true, "validate()")
    t.raises("number expected", cfg.with_v4_event_queue_polling, cfg)
end

function tests.chaining(t)
    local cfg = shmipc.config()
    local same = cfg:buffer_capacity(1 << 20):queue_capacity(1024):slice_classes("4096:100")
        :path_prefix("/dev/shm/chain"):memmap("devshm"):with_v4():read_timeout(2.5)
    t.eq(same, cfg, "chain returns the config")
    t.eq(cfg:buffer_capacity(), 1 << 20, "buffer_capacity")
    t.eq(cfg:queue_capacity(), 1024, "queue_capacity")
    t.eq(cfg:memmap(), "devshm", "memmap")
    t.eq(cfg:read_timeout(), 2.5, "read_timeout")
    -- A refusal in the middle of a chain stops it with an error on the nil that follows.
    t.raises("attempt to index a nil value", function()
        return cfg:queue_capacity(0):queue_capacity(64)
    end)
    t.eq(cfg:queue_capacity(), 1024, "queue_capacity unchanged")
    -- The usual way to turn a refusal into an error.
    t.raises("queue_capacity", function()
        return assert(cfg:queue_capacity(0))
    end)
end

function tests.clone_is_independent(t)
    local cfg = shmipc.config():queue_capacity(1024)
    local copy = t.ok(cfg:clone())
    t.truthy(copy ~= cfg, "clone is another object")
    t.eq(getmetatable(copy), getmetatable(cfg), "clone metatable")
    set(t, cfg, cfg:queue_capacity(64))
    t.eq(copy:queue_capacity(), 1024, "copy keeps its value")
    set(t, copy, copy:queue_capacity(16))
    t.eq(cfg:queue_capacity(), 64, "original keeps its value")
    cfg:close()
    t.eq(copy:queue_capacity(), 16, "copy outlives the closed original")
end

function tests.validate(t)
    local cfg = shmipc.config{ with_v4_event_queue_polling = 10, memmap = "devshm" }
    local v = cfg:validate()
    t.eq(v, true, "validate()")
    t.eq(select("#", cfg:validate()), 1, "validate() results")
end

function tests.close_twice_is_safe(t)
    local cfg = shmipc.config()
    t.eq(select("#", cfg:close()), 0, "close() results")
    cfg:close()
    local mt = getmetatable(cfg)
    mt.__close(cfg)
    mt.__gc(cfg)
    t.eq(tostring(cfg), "shmipc.config (closed)", "tostring of a closed config")
end

function tests.closed_handle_raises(t)
    local cfg = shmipc.config()
    cfg:close()
    for _, method in ipairs({ "buffer_capacity", "queue_capacity", "slice_classes", "memmap",
        "path_prefix", "initialize_timeout", "connection_write_timeout", "read_timeout",
        "write_timeout", "protocol", "wakeup", "with_v4", "with_v4_eventfd", "validate",
        "clone" }) do
        t.raises("attempt to use a closed shmipc.config", cfg[method], cfg)
    end
    t.raises("closed", cfg.queue_capacity, cfg, 16)
    t.raises("closed", cfg.with_v4_event_queue_polling, cfg, 16)
end

function tests.to_be_closed_variable(t)
    local outer
    do
        local cfg <close> = shmipc.config()
        outer = cfg
        set(t, cfg, cfg:queue_capacity(64))
    end
    t.eq(tostring(outer), "shmipc.config (closed)", "closed at the end of the block")
    t.raises("closed", outer.queue_capacity, outer)
    -- Also closed when the block is left by an error.
    local ok = pcall(function()
        local cfg <close> = shmipc.config()
        outer = cfg
        error("boom")
    end)
    t.eq(ok, false, "pcall")
    t.eq(tostring(outer), "shmipc.config (closed)", "closed after an error")
end

function tests.gc_collects_configs(t)
    local weak = setmetatable({}, { __mode = "v" })
    for i = 1, 100 do
        weak[i] = shmipc.config():queue_capacity(16)
    end
    weak[101] = shmipc.config()
    weak[101]:close() -- __gc after close must be harmless too
    collectgarbage()
    collectgarbage()
    t.eq(next(weak), nil, "every config collected")
end

function tests.tostring_and_name(t)
    local cfg = shmipc.config()
    t.truthy(tostring(cfg):match("^shmipc%.config %(0x%x+%)$") or tostring(cfg):match("^shmipc%.config %(%x+%)$"),
        "tostring " .. tostring(cfg))
    t.eq(getmetatable(cfg).__name, "shmipc.config", "__name")
    t.eq(type(cfg), "userdata", "type")
end

function tests.wrong_self_raises(t)
    local cfg = shmipc.config()
    t.raises("shmipc.config expected", cfg.buffer_capacity, {})
    t.raises("shmipc.config expected", cfg.close, io.stdout)
    t.raises("shmipc.config expected", cfg.validate)
    t.raises("number expected", cfg.buffer_capacity, cfg, "big")
    t.raises("number has no integer representation", cfg.buffer_capacity, cfg, 1.5)
    -- An explicit nil is a wrong argument, not a call of the getter.
    t.raises("number expected, got nil", cfg.queue_capacity, cfg, nil)
end

function tests.config_options(t)
    local cfg = t.ok(shmipc.config{
        buffer_capacity = 1 << 20,
        queue_capacity = 1024,
        slice_classes = "4096:100",
        memmap = "devshm",
        path_prefix = "/dev/shm/opts",
        read_timeout = 0.25,
        write_timeout = 3,
        initialize_timeout = 2,
        connection_write_timeout = 5,
    })
    t.eq(cfg:buffer_capacity(), 1 << 20, "buffer_capacity")
    t.eq(cfg:queue_capacity(), 1024, "queue_capacity")
    t.eq(cfg:slice_classes()[1].size, 4096, "slice_classes")
    t.eq(cfg:memmap(), "devshm", "memmap")
    t.eq(cfg:path_prefix(), "/dev/shm/opts", "path_prefix")
    t.eq(cfg:read_timeout(), 0.25, "read_timeout")
    t.eq(cfg:write_timeout(), 3.0, "write_timeout")
    t.eq(cfg:initialize_timeout(), 2.0, "initialize_timeout")
    t.eq(cfg:connection_write_timeout(), 5.0, "connection_write_timeout")
    t.ok(shmipc.config(nil))
    t.ok(shmipc.config({}))
end

function tests.config_options_apply_in_a_fixed_order(t)
    -- Each pair only works in one order; the table's own order is unspecified.
    local cfg = t.ok(shmipc.config{ wakeup = { "polling", 50 }, protocol = { "v4", true } })
    t.eq(select(2, cfg:wakeup()), 50, "wakeup after protocol")
    cfg = t.ok(shmipc.config{ memmap = "devshm", path_prefix = "/dev/shm/abs" })
    t.eq(cfg:memmap(), "devshm", "memmap after path_prefix")
    cfg = t.ok(shmipc.config{ slice_classes = { { 4096, 50 }, { 600000, 50 } }, buffer_capacity = 4 << 20 })
    t.eq(cfg:buffer_capacity(), 4 << 20, "buffer_capacity before slice_classes")
    cfg = t.ok(shmipc.config{ protocol = "v4", slice_classes = { { size = 4096, percent = 100 } } })
    t.eq(cfg:protocol(), "v4", "protocol as a plain string")
end

function tests.config_option_helpers(t)
    local cfg = t.ok(shmipc.config{ with_v4 = true })
    t.eq(cfg:protocol(), "v4", "with_v4 = true")
    cfg = t.ok(shmipc.config{ with_v4 = false })
    t.eq(cfg:protocol(), "legacy", "with_v4 = false skips")
    cfg = t.ok(shmipc.config{ with_v4_eventfd = true })
    t.eq(cfg:wakeup(), "eventfd", "with_v4_eventfd")
    cfg = t.ok(shmipc.config{ with_v4_event_queue_polling = 250 })
    t.eq(select(2, cfg:wakeup()), 250, "with_v4_event_queue_polling")
end

function tests.config_options_refused(t)
    t.refused(EINVAL, "buffer_capacity", shmipc.config{ buffer_capacity = 5 })
    t.refused(EINVAL, "queue_capacity", shmipc.config{ queue_capacity = 8 })
    t.refused(EINVAL, "memmap", shmipc.config{ memmap = "tmpfs" })
    t.refused(EINVAL, "sum to 90", shmipc.config{ slice_classes = "4096:90" })
    t.refused(ENAMETOOLONG, "path_prefix", shmipc.config{ path_prefix = string.rep("p", 200) })
    t.refused(EINVAL, "initialize_timeout", shmipc.config{ initialize_timeout = 0 })
    t.refused(EINVAL, "protocol", shmipc.config{ protocol = "v5" })
    t.refused(EINVAL, "fallback", shmipc.config{ protocol = { "legacy", true } })
    t.refused(EINVAL, "need protocol V4", shmipc.config{ wakeup = "eventfd" })
    t.refused(EINVAL, "polling_interval_us", shmipc.config{ with_v4_event_queue_polling = 0 })
end

function tests.config_options_misuse_raises(t)
    t.raises("unknown option 'buffer_size'", shmipc.config, { buffer_size = 1 << 20 })
    t.raises("unknown option 'close'", shmipc.config, { close = true })
    t.raises("option names are strings, got a number", shmipc.config, { 1 << 20 })
    t.raises("option 'buffer_capacity' got a string", shmipc.config, { buffer_capacity = "1M" })
    t.raises("option 'memmap' got a boolean", shmipc.config, { memmap = true })
    t.raises("option 'with_v4' got a string", shmipc.config, { with_v4 = "yes" })
    t.raises("option 'slice_classes' got a number", shmipc.config, { slice_classes = 4096 })
    t.raises("table expected", shmipc.config, "defaults")
end

function tests.session_manager_fields(t)
    local cfg = shmipc.config { session_num = 4, max_stream_num = 128, rebuild_interval = 0.25 }
    t.eq(cfg:session_num(), 4, "session_num")
    t.eq(cfg:max_stream_num(), 128, "max_stream_num")
    t.eq(cfg:rebuild_interval(), 0.25, "rebuild_interval")
    t.refused(EINVAL, "session_num", cfg:session_num(0))
    t.refused(EINVAL, "session_num", cfg:session_num(1025))
    t.refused(EINVAL, "max_stream_num", cfg:max_stream_num(0))
    t.refused(EINVAL, "rebuild_interval", cfg:rebuild_interval(0))
    t.eq(cfg:session_num(), 4, "session_num unchanged")
end

function tests.server_v4(t)
    local cfg = shmipc.config()
    local accept, features = cfg:server_v4()
    t.eq(accept, true, "accepts V4 by default")
    t.eq(table.concat(features, ","), "eventfd,polling", "offers both features by default")
    set(t, cfg, cfg:server_v4(true, { "polling" }))
    accept, features = cfg:server_v4()
    t.eq(table.concat(features, ","), "polling", "features")
    set(t, cfg, cfg:server_v4(false))
    accept, features = cfg:server_v4()
    t.eq(accept, false, "accept")
    t.eq(table.concat(features, ","), "eventfd,polling", "nil features: both")
    set(t, cfg, cfg:server_v4(true, {}))
    t.eq(#select(2, cfg:server_v4()), 0, "no optional feature")
    t.refused(EINVAL, 'server_v4: "epoll" is neither', cfg:server_v4(true, { "eventfd", "epoll" }))
    t.eq(#select(2, cfg:server_v4()), 0, "unchanged after a refusal")
    t.raises("boolean expected", cfg.server_v4, cfg, "yes")
    t.raises("table expected", cfg.server_v4, cfg, true, "eventfd")
    t.raises("feature 1 is a number", cfg.server_v4, cfg, true, { 1 })
    -- As an option: a boolean, or {accept, features}.
    t.eq(t.ok(shmipc.config { server_v4 = false }):server_v4(), false, "option false")
    local _, f = t.ok(shmipc.config { server_v4 = { true, { "eventfd" } } }):server_v4()
    t.eq(table.concat(f, ","), "eventfd", "option table")
end

return tests
