-- Description: shmipc.abi, the generic libffi path to every GENERIC entry of the descriptor
-- table: marshalling by type, handles and their kinds, out-parameters, the log sink closure,
-- and misuse raising before C. The IPC cases use the C greeter server as the peer.
local shmipc = require "shmipc"
local support = dofile((debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or ".") .. "/ipc_support.lua")

local abi = shmipc.abi
local E = shmipc.errors

local REQUEST = "client say hello world!!!"
local REPLY = "server hello world!!!"

local tests = {}

-- Asserts that f(...) raises an error whose message contains `text`.
local function raises(t, text, f, ...)
    local ok, msg = pcall(f, ...)
    t.eq(ok, false, "call raised")
    t.truthy(type(msg) == "string" and msg:find(text, 1, true), "message " .. tostring(msg) ..
        " contains " .. text)
end

local counter = 0
local function address()
    counter = counter + 1
    return string.format("unix:@shmipc-luaabi-%d-%d", support.pid(), counter)
end

function tests.version_and_errors(t)
    t.eq(math.type(abi.version()), "integer", "version")
    t.eq(abi.call("shmipc_version"), abi.version(), "call by full name")
    t.eq(abi.version_string(), shmipc.version(), "version_string")
    t.eq(abi.errname(E.EINVAL), "SHMIPC_EINVAL", "errname")
    t.eq(abi.shmipc_errname(E.ETIMEDOUT), "SHMIPC_ETIMEDOUT", "errname by full name")
    t.eq(abi.strerror(E.EINVAL), "invalid argument", "strerror")
    t.eq(abi.strerror(-22.0), "invalid argument", "integral float accepted")
    t.eq(type(abi.error_detail()), "string", "error_detail")
    t.truthy(abi.abi_count() > 50, "abi_count")
end

function tests.config_roundtrip(t)
    local rc, cfg = abi.config_new()
    t.eq(rc, 0, "config_new")
    t.eq(getmetatable(cfg).__name, "shmipc.abi.handle", "__name")
    t.eq(getmetatable(cfg), abi.handle, "abi.handle is the metatable")
    t.eq(cfg:kind(), "CONFIG", "kind")
    t.eq(cfg:closed(), false, "open")
    t.eq(abi.config_validate(cfg), 0, "validate")
    t.eq(abi.config_set_buffer_capacity(cfg, 64 << 20), 0, "set capacity")
    t.eq(abi.config_get_buffer_capacity(cfg), 64 << 20, "get capacity")
    -- A runtime failure is the C return value, not an error.
    t.eq(abi.config_set_buffer_capacity(cfg, 4096), E.EINVAL, "capacity too small")
    t.eq(abi.config_get_buffer_capacity(cfg), 64 << 20, "unchanged")
    t.eq(abi.config_set_queue_capacity(cfg, 1024.0), 0, "integral float")
    t.eq(abi.config_get_queue_capacity(cfg), 1024, "queue capacity")
    t.eq(abi.config_set_path_prefix(cfg, "/dev/shm/luaabi"), 0, "path prefix")
    t.eq(abi.config_get_path_prefix(cfg), "/dev/shm/luaabi", "path prefix back")
    t.eq(abi.config_parse_slice_classes(cfg, "nonsense"), E.EINVAL, "parse refused")
    local rc2, copy = abi.config_clone(cfg)
    t.eq(rc2, 0, "clone")
    t.eq(abi.config_get_buffer_capacity(copy), 64 << 20, "clone keeps capacity")
    t.eq(select("#", abi.config_free(copy)), 0, "void returns nothing")
    t.eq(copy:closed(), true, "released")
    cfg:close()
    t.eq(cfg:closed(), true, "closed by method")
    cfg:close() -- twice is harmless
end

function tests.out_scalars_follow_the_return_value(t)
    local _, cfg = abi.config_new()
    local rc, features = abi.config_get_server_v4(cfg)
    t.eq(math.type(rc), "integer", "return value")
    t.eq(math.type(features), "integer", "out value")
    abi.config_free(cfg)
end

function tests.nil_handles_reach_c_as_null(t)
    -- NULL handles are the C functions' own business: they answer with their documented
    -- failure, and views come back as nil.
    t.eq(abi.config_validate(nil), E.EINVAL, "validate(NULL)")
    local rc, chunk = abi.stream_read_chunk(nil, 0, 0)
    t.eq(rc, E.EINVAL, "read_chunk(NULL)")
    t.eq(chunk, nil, "no chunk on failure")
    t.eq(abi.http_request_method(nil), nil, "CHARS return of NULL")
    local value, name = abi.http_request_header_at(nil, 0)
    t.eq(value, nil, "header value")
    t.eq(name, nil, "header name")
    t.eq(abi.http_request_header_count(nil), 0, "SIZE return")
end

function tests.describe_and_names(t)
    local names = abi.names()
    local seen = {}
    for _, n in ipairs(names) do
        seen[n] = true
    end
    t.truthy(seen.shmipc_config_new, "config_new listed")
    t.eq(seen.shmipc_config_set_slice_classes, nil, "non-generic not listed")
    local d = abi.describe("stream_write")
    t.eq(d.name, "shmipc_stream_write", "describe name")
    t.eq(d.generic, true, "generic")
    t.eq(d.ret, "I32", "ret")
    t.eq(d.params[2].type, "BYTES_IN", "bytes in")
    t.eq(d.params[1].kind, "STREAM", "kind")
    t.eq(abi.describe("config_set_slice_classes").generic, false, "not generic")
    local f = abi.version
    t.eq(rawget(abi, "version"), f, "bound functions are cached")
end

function tests.wrong_counts_raise(t)
    raises(t, "expected 1 argument, got 0", abi.strerror)
    raises(t, "expected 1 argument, got 2", abi.strerror, 1, 2)
    raises(t, "expected 0 arguments, got 1", abi.config_new, nil)
    raises(t, "expected 2 arguments, got 1", abi.call, "config_set_buffer_capacity", nil)
    raises(t, "expected 0 arguments, got 1", abi.call, "version", 1)
end

function tests.wrong_types_raise(t)
    local _, cfg = abi.config_new()
    raises(t, "must be an integer, got string", abi.strerror, "1")
    raises(t, "has no integer representation", abi.strerror, 1.5)
    raises(t, "out of range", abi.strerror, 1 << 40)
    raises(t, "out of range", abi.config_set_queue_capacity, cfg, -1)
    raises(t, "out of range", abi.config_set_buffer_capacity, cfg, -1)
    raises(t, "must be a string or nil, got number", abi.config_set_path_prefix, cfg, 5)
    raises(t, "contains a NUL byte", abi.config_set_path_prefix, cfg, "a\0b")
    raises(t, "must be a shmipc.abi.handle CONFIG or nil, got number", abi.config_validate, 1)
    raises(t, "must be a shmipc.abi.handle CONFIG or nil, got userdata",
        abi.config_validate, shmipc.config())
    raises(t, "must be a function or nil, got number", abi.set_log_sink, 1)
    raises(t, "must be a string, got table", abi.stream_write, nil, {})
    t.eq(abi.config_get_buffer_capacity(cfg) > 0, true, "config untouched")
    abi.config_free(cfg)
end

function tests.wrong_kind_raises(t)
    local _, cfg = abi.config_new()
    raises(t, "must be a SESSION handle, got a CONFIG one", abi.session_open_stream, cfg)
    raises(t, "must be a STREAM handle, got a CONFIG one", abi.stream_close, cfg)
    t.eq(cfg:closed(), false, "not released by a refused call")
    abi.config_free(cfg)
end

function tests.use_after_release_raises(t)
    local _, cfg = abi.config_new()
    abi.config_free(cfg)
    raises(t, "is a closed CONFIG handle", abi.config_validate, cfg)
    raises(t, "is a closed CONFIG handle", abi.config_free, cfg)
    raises(t, "is a closed CONFIG handle", abi.config_set_buffer_capacity, cfg, 1 << 20)
end

function tests.non_generic_and_unknown_raise(t)
    raises(t, "is not GENERIC", abi.call, "shmipc_config_set_slice_classes", nil, nil, 0)
    raises(t, "is not GENERIC", function() return abi.config_get_slice_classes end)
    raises(t, "is not GENERIC", abi.call, "abi_get", 0)
    raises(t, "no function named", abi.call, "no_such_function")
    raises(t, "no function named", function() return abi.no_such_function end)
    -- Callbacks other than the log sink run on library threads: refused before C.
    raises(t, "supports only LOG_SINK", abi.listener_serve, nil, function() end, function() end,
        function() end)
    -- A writable window has no Lua value.
    raises(t, "writable window", abi.stream_reserve, nil, 16)
end

function tests.session_with_the_greeter_server(t)
    local addr = address()
    local server <close> = support.greeter_server(addr)
    local _, cfg = abi.config_new()
    local rc, s = abi.session_connect(addr, cfg)
    t.eq(rc, 0, "session_connect: " .. abi.error_detail())
    t.eq(s:kind(), "SESSION", "session handle")
    t.truthy(abi.session_version(s) >= 2, "session_version")
    local rc2, st = abi.session_open_stream(s)
    t.eq(rc2, 0, "open_stream")
    t.eq(st:kind(), "STREAM", "stream handle")
    t.eq(abi.stream_write(st, REQUEST), 0, "write")
    t.eq(abi.stream_flush(st), 0, "flush")
    local rc3, reply = abi.stream_read_exact_bytes(st, #REPLY, 0)
    t.eq(rc3, 0, "read_exact_bytes")
    t.eq(reply, REPLY, "reply")
    t.eq(abi.stream_release(st), 0, "release slices")
    abi.stream_close(st)
    t.eq(st:closed(), true, "stream released")
    raises(t, "is a closed STREAM handle", abi.stream_write, st, "x")
    abi.session_close(s)
    raises(t, "is a closed SESSION handle", abi.session_open_stream, s)
    abi.config_free(cfg)
    local ok, out = server:finish()
    t.truthy(ok, "server exit: " .. out)
    t.truthy(out:find("server receive request message:" .. REQUEST, 1, true), "server got request")
end

function tests.connect_failure_is_the_return_value(t)
    local rc, s = abi.session_connect(address(), nil)
    t.eq(rc, E.ECONNREFUSED, "refused")
    t.eq(s, nil, "no handle")
    t.eq(abi.errname(rc), "SHMIPC_ECONNREFUSED", "errname")
end

function tests.log_sink_set_replace_clear(t)
    local before = abi.log_dropped()
    t.eq(math.type(before), "integer", "log_dropped")
    t.eq(select("#", abi.set_log_sink(function() end)), 0, "set")
    abi.set_log_sink(function() end) -- replaces and frees the first closure
    abi.set_log_sink(nil)
    abi.set_log_sink(nil)
    collectgarbage()
end

function tests.log_sink_receives_lines(t)
    local addr = address()
    local server <close> = support.greeter_server(addr)
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write(string.format("package.cpath = %q .. ';' .. package.cpath\n",
        support.module_dir .. "/?.so"))
    f:write([[
local abi = require("shmipc").abi
local addr = ...
local lines = {}
abi.set_log_sink(function(level, line) lines[#lines + 1] = { level, line } end)
local rc, s = abi.session_connect(addr, nil)
assert(rc == 0, abi.error_detail())
local _, st = abi.session_open_stream(s)
assert(abi.stream_write(st, "client say hello world!!!") == 0)
assert(abi.stream_flush(st) == 0)
local _, reply = abi.stream_read_exact_bytes(st, #"server hello world!!!", 0)
abi.stream_close(st)
abi.session_close(s)
abi.set_log_sink(nil)
print("reply " .. tostring(reply))
for _, l in ipairs(lines) do
    print(string.format("sink %d %s", l[1], l[2]))
end
print("done " .. #lines)
]])
    f:close()
    local peer <close> = support.spawn(string.format("env SHMIPC_LOG_LEVEL=debug %s %s %s",
        support.quote(support.lua), support.quote(script), support.quote(addr)))
    peer.script = script
    local ok, out = peer:finish()
    t.truthy(ok, "peer exit: " .. out)
    t.truthy(out:find("reply " .. REPLY, 1, true), "peer reply: " .. out)
    t.truthy(out:find("sink 4 shmipc%[%d+%] debug: session .* up"), "a debug line in the sink: " .. out)
    -- Nothing the sink took went to stderr (the peer's stderr is in `out`).
    t.eq(out:find("\nshmipc%[%d+%] debug: session"), nil, "sink replaced stderr")
    server:finish()
end

function tests.handles_are_collected(t)
    for _ = 1, 50 do
        local _, cfg = abi.config_new()
        local _, copy = abi.config_clone(cfg)
        t.truthy(copy, "clone")
    end
    collectgarbage()
    collectgarbage()
end

-- Regression: a handle passed to a RELEASE call stayed open until the call returned, so a log
-- sink that ran during the call (the flush_close here falls back to the socket and warns) could
-- release it a second time: the stream was freed twice (SIGSEGV).
function tests.sink_cannot_release_a_handle_being_released(t)
    local server_address = address()
    local server <close> = support.lua_server("echo", server_address)
    local peer <close> = support.lua_peer([[
local abi = require("shmipc").abi
local _, cfg = abi.config_new()
assert(abi.config_set_buffer_capacity(cfg, 1 << 20) == 0)
local rc, s = abi.session_connect(arg[1], cfg)
assert(rc == 0, abi.error_detail())
local _, st = abi.session_open_stream(s)
local seen = {}
abi.set_log_sink(function(level, line)
    local ok, err = pcall(abi.stream_close, st)
    seen[#seen + 1] = tostring(ok) .. " " .. tostring(err)
end)
assert(abi.stream_write(st, string.rep("x", 4 << 20)) == 0)
local frc = abi.stream_flush_close(st)
abi.set_log_sink(nil)
print("flush_close " .. frc .. " closed " .. tostring(st:closed()))
for _, l in ipairs(seen) do print("sink " .. l) end
abi.session_close(s)
print("done")
]], server_address)
    local ok, out = peer:finish()
    t.truthy(ok, "peer exit: " .. out)
    t.truthy(out:find("sink false", 1, true) and out:find("is a closed STREAM handle", 1, true),
        "the sink's close was refused: " .. out)
    t.truthy(out:find("flush_close 0 closed true", 1, true), "flush_close: " .. out)
end

-- Regression: a log sink that cleared or replaced itself freed its own record, closure and
-- thread while it ran (use after free: heap-use-after-free under ASan, or a crash once the
-- collector took the running thread). The record is freed when the sink returns now. Without
-- ASan: strings of the record's size made right after the sink replaced itself take its
-- memory if it was freed, and the old code's end of the sink (busy = 0) wrote zeros into one.
function tests.sink_that_replaces_itself(t)
    local server_address = address()
    local server <close> = support.greeter_server(server_address, 2)
    local peer <close> = support.lua_peer([[
local abi = require("shmipc").abi
local _, cfg = abi.config_new()
assert(abi.config_set_buffer_capacity(cfg, 1 << 20) == 0)
local calls = 0
local fresh, changed = {}, 0
for round = 1, 2 do
    -- A session per round: one whose memory ran out refuses new streams for a while.
    local rc, s = abi.session_connect(arg[1], cfg)
    assert(rc == 0, abi.error_detail())
    local _, st = abi.session_open_stream(s)
    abi.set_log_sink(function(level, line)
        calls = calls + 1
        if round == 1 then
            abi.set_log_sink(nil)
        else
            abi.set_log_sink(function() end)
        end
        -- New strings of the record's size (56 bytes with Lua's header): malloc hands one of
        -- them the record's memory if it was freed, and the sink's end must not write into it.
        for k = 1, 64 do
            fresh[#fresh + 1] = string.format("%031d", round * 1000 + k)
        end
        for _ = 1, 3 do
            collectgarbage()
        end
        local junk = {}
        for i = 1, 10000 do
            junk[i] = { i }
        end
    end)
    assert(abi.stream_write(st, string.rep("x", 4 << 20)) == 0)
    assert(abi.stream_flush(st) == 0)
    for k = 1, 64 do
        local want = string.format("%031d", round * 1000 + k)
        if fresh[(round - 1) * 64 + k] ~= want then
            changed = changed + 1
        end
    end
    abi.stream_close(st)
    abi.session_close(s)
end
abi.set_log_sink(nil)
collectgarbage()
print("changed " .. changed)
print("calls " .. calls)
print("done")
]], server_address)
    local ok, out = peer:finish()
    t.truthy(ok, "peer exit: " .. out)
    t.truthy(out:find("changed 0\n", 1, true), "strings in the freed record's place: " .. out)
    t.truthy(out:find("calls 2\ndone"), "each sink ran once: " .. out)
end

return tests
