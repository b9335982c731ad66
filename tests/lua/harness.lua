-- Description: runs the Lua tests of the shmipc module and prints one line per test.
--
-- Usage: LUA_CPATH='/path/to/build/lua/?.so;;' lua5.4 tests/lua/harness.lua [test_x.lua ...]
--
-- With no arguments it runs every test_*.lua beside this file, sorted by name. A test file
-- returns a table of name -> function(t); each test runs in pcall and gets `t`, the
-- assertions below. A file that cannot be loaded or defines no test counts as one failure,
-- so no file goes silently unrun. The last line is "N passed, N failed"; the exit code is 0
-- only when nothing failed. The module is found through LUA_CPATH, which the caller sets.

local t = {}

local function fail(level, fmt, ...)
    error(string.format(fmt, ...), level + 1)
end

local function show(v)
    if type(v) == "string" then
        return string.format("%q", v)
    end
    return tostring(v)
end

-- t.eq(got, want, [what]): got == want.
function t.eq(got, want, what)
    if got ~= want then
        fail(2, "%s: got %s, want %s", what or "value", show(got), show(want))
    end
end

-- t.truthy(v, [what]): v is neither nil nor false.
function t.truthy(v, what)
    if not v then
        fail(2, "%s: got %s, want a true value", what or "value", show(v))
    end
    return v
end

-- t.ok(...): the results of a call that must succeed; returns them.
function t.ok(...)
    local v, msg, code = ...
    if v == nil then
        fail(2, "call failed: %s (%s)", show(msg), show(code))
    end
    return ...
end

-- t.refused(code, text, ...): the results of a call refused with nil, message, code, where
-- the message contains `text` (plain, not a pattern).
function t.refused(code, text, ...)
    local n = select("#", ...)
    local v, msg, got = ...
    if v ~= nil then
        fail(2, "call succeeded with %s, want it refused with %s", show(v), show(text))
    end
    if n ~= 3 then
        fail(2, "refusal returned %d values, want nil, message, code", n)
    end
    if type(msg) ~= "string" or not msg:find(text, 1, true) then
        fail(2, "message %s does not contain %s", show(msg), show(text))
    end
    if got ~= code then
        fail(2, "code: got %s, want %s (message %s)", show(got), show(code), show(msg))
    end
    return msg
end

-- t.raises(text, fn, ...): fn(...) raises an error whose message contains `text`.
function t.raises(text, fn, ...)
    local ok, err = pcall(fn, ...)
    if ok then
        fail(2, "no error raised, want one containing %s", show(text))
    end
    if not tostring(err):find(text, 1, true) then
        fail(2, "error %s does not contain %s", show(tostring(err)), show(text))
    end
    return err
end

local passed, failed = 0, 0

local function report(ok, file, name, err)
    if ok then
        passed = passed + 1
        print(string.format("ok - %s: %s", file, name))
    else
        failed = failed + 1
        print(string.format("not ok - %s: %s: %s", file, name, tostring(err)))
    end
end

local function basename(path)
    return path:match("([^/]*)$")
end

local function run_file(path)
    local file = basename(path)
    local chunk, err = loadfile(path)
    if not chunk then
        return report(false, file, "(load)", err)
    end
    local ok, tests = pcall(chunk)
    if not ok then
        return report(false, file, "(load)", tests)
    end
    if type(tests) ~= "table" then
        return report(false, file, "(load)", "returns a " .. type(tests) .. ", not a table of tests")
    end
    local names = {}
    for name, fn in pairs(tests) do
        if type(fn) ~= "function" then
            report(false, file, tostring(name), "is a " .. type(fn) .. ", not a function")
        else
            names[#names + 1] = name
        end
    end
    if #names == 0 then
        return report(false, file, "(load)", "defines no tests")
    end
    table.sort(names)
    for _, name in ipairs(names) do
        local ok, err = pcall(tests[name], t)
        -- A full collection after each test runs the finalizers of what the test left, so a
        -- crash in __gc shows up next to the test that caused it.
        collectgarbage()
        report(ok, file, name, err)
    end
end

local function shell_quote(s)
    return "'" .. s:gsub("'", "'\\''") .. "'"
end

-- Every test_*.lua in `dir`, sorted.
local function discover(dir)
    local files = {}
    local ls = assert(io.popen("ls -1 " .. shell_quote(dir)))
    for name in ls:lines() do
        if name:match("^test_.*%.lua$") then
            files[#files + 1] = dir .. "/" .. name
        end
    end
    ls:close()
    table.sort(files)
    return files
end

local files = { ... }
if #files == 0 then
    local dir = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
    files = discover(dir)
    if #files == 0 then
        report(false, dir, "(discover)", "no test_*.lua files found")
    end
end
for _, path in ipairs(files) do
    run_file(path)
end

print(string.format("%d passed, %d failed", passed, failed))
-- Closing the state runs every pending finalizer, so a leak checker sees a clean exit.
os.exit(failed == 0 and 0 or 1, true)
