-- Description: what the IPC tests share: unique addresses, peer processes (the C greeters and
-- small Lua peers), descriptor counts. Not a test file: the harness runs test_*.lua only.
--
-- Every peer is a separate process started with io.popen, because a session's handshake
-- blocks: one Lua state cannot be both ends of a connection. A peer handle is closeable
-- (`local peer <close> = support.spawn(...)`), so a failing test still ends its peer.
local shmipc = require "shmipc"

local support = {}

local module_path = assert(package.searchpath("shmipc", package.cpath))
support.module_dir = module_path:match("^(.*)/[^/]*$") or "."
-- SHMIPC_BUILD_DIR: the build tree holding the peers when the module comes from elsewhere (a
-- luarocks tree: scripts/check-install-lua.sh); else the tree the module was built in.
support.build_dir = os.getenv("SHMIPC_BUILD_DIR")
    or support.module_dir:match("^(.*)/lua$") or (support.module_dir .. "/..")
support.examples = support.build_dir .. "/examples/c"
-- This file is tests/lua/ipc_support.lua: the source tree is two levels up.
support.source_dir = (debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or ".") .. "/../.."
support.lua = (arg and arg[-1]) or "lua5.4"

local E = shmipc.errors

function support.quote(s)
    return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local pid
function support.pid()
    if not pid then
        local f = assert(io.open("/proc/self/stat"))
        pid = f:read("n")
        f:close()
    end
    return pid
end

local counter = 0
-- address(tag) -> "unix:@shmipc-lua-<pid>-<tag>-<n>": abstract, so no file is left behind.
function support.address(tag)
    counter = counter + 1
    return string.format("unix:@shmipc-lua-%d-%s-%d", support.pid(), tag, counter)
end

-- A prefix for /dev/shm files that no other run uses.
function support.shm_prefix(tag)
    counter = counter + 1
    return string.format("/dev/shm/shmipc-lua-%d-%s-%d", support.pid(), tag, counter)
end

-- Files in /dev/shm whose path starts with `prefix`.
function support.shm_files(prefix)
    local dir, base = prefix:match("^(.*)/([^/]*)$")
    local files = {}
    local ls = assert(io.popen("ls -1 " .. support.quote(dir)))
    for name in ls:lines() do
        if name:sub(1, #base) == base then
            files[#files + 1] = name
        end
    end
    ls:close()
    return files
end

-- Number of descriptors this process has open. Listed by a child into a file while this
-- process waits (os.execute), then read: a popen'd `ls` raced the parent's close of the
-- pipe's write end after the spawn and counted it or not (7 or 8 under load: the lifetime
-- tests failed about 2 runs in 3 beside two CPU hogs, and once in CI).
function support.fd_count()
    local path = os.tmpname()
    assert(os.execute("ls -1 /proc/" .. support.pid() .. "/fd > " .. support.quote(path)))
    local n = 0
    for _ in io.lines(path) do
        n = n + 1
    end
    os.remove(path)
    return n
end

-- Sleeps without a busy loop.
function support.sleep(seconds)
    shmipc.poll({}, seconds)
end

local peer = {}
peer.__index = peer

-- spawn(command) -> peer: runs `command` (a shell command line) with its output piped here.
function support.spawn(command)
    local pipe = assert(io.popen("echo $$; exec " .. command .. " 2>&1", "r"))
    local p = setmetatable({ pipe = pipe, pid = assert(pipe:read("n")), output = {} }, peer)
    pipe:read("l")
    return p
end

-- Reads output lines until one contains `text`; returns it. Raises at the end of output.
function peer:expect(text)
    for line in self.pipe:lines() do
        self.output[#self.output + 1] = line
        if line:find(text, 1, true) then
            return line
        end
    end
    error(string.format("peer ended without printing %q; it printed:\n%s", text,
        table.concat(self.output, "\n")), 2)
end

-- Waits for the peer's end: returns exit-ok (boolean), its whole output.
function peer:finish()
    if self.done then
        return self.ok, table.concat(self.output, "\n")
    end
    for line in self.pipe:lines() do
        self.output[#self.output + 1] = line
    end
    self.ok = self.pipe:close()
    self.done = true
    return self.ok, table.concat(self.output, "\n")
end

function peer:kill(signal)
    os.execute(string.format("kill -%s %d 2>/dev/null", signal or "KILL", self.pid))
end

-- Ends a peer that is still running; used by <close> and the collector.
function peer:__close()
    if not self.done then
        self:kill("KILL")
        self:finish()
    end
    if self.script then
        os.remove(self.script)
        self.script = nil
    end
end
peer.__gc = peer.__close

-- greeter_server(address [, sessions]) -> peer, once it listens.
function support.greeter_server(address, sessions)
    local p = support.spawn(string.format("%s %s %d", support.quote(support.examples .. "/greeter_server"),
        support.quote(address), sessions or 1))
    p:expect("listening on")
    return p
end

-- greeter_client(address [, "v2"]) -> peer, started (it connects at once).
function support.greeter_client(address, version)
    return support.spawn(string.format("%s %s %s", support.quote(support.examples .. "/greeter_client"),
        support.quote(address), version or "v3"))
end

-- A Lua peer: runs `code` in a new lua5.4 with this module on its path and `...` as arg.
function support.lua_peer(code, ...)
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write(string.format("package.cpath = %q .. ';' .. package.cpath\n", support.module_dir .. "/?.so"))
    f:write(code)
    f:close()
    local args = {}
    for i, a in ipairs({ ... }) do
        args[i] = support.quote(a)
    end
    local p = support.spawn(string.format("%s %s %s", support.quote(support.lua), support.quote(script),
        table.concat(args, " ")))
    p.script = script
    return p
end

-- The Lua server peer: `lua_server(mode, address)` serves with callbacks. Mode "echo" sends
-- back what each stream receives; "bye" answers a stream's first message with "bye" and
-- closes the stream; "last" answers "last words" with flush_close(). A stream that sends "quit" stops the server. It prints "listening" once
-- it listens.
support.SERVER = [[
local shmipc = require "shmipc"
local mode, address, memmap = arg[1], arg[2], arg[3]
local l = assert(shmipc.listen(address))
print("listening")
io.stdout:flush()
local function on_data(st)
    while true do
        local data, _, code = st:read_chunk(nil, "nb")
        if data == nil then
            if code ~= shmipc.errors.EAGAIN then
                st:close()
            end
            return
        end
        if data == "quit" then
            st:close()
            l:stop()
            return
        end
        if mode == "bye" then
            assert(st:write("bye"):flush())
            st:close()
            return
        end
        if mode == "last" then
            -- nil, message, EEOF when the client closed its side first
            local ok, msg, code = st:write("last words"):flush_close()
            assert(ok == true or code == shmipc.errors.EEOF, msg)
            return
        end
        assert(st:write(data):flush())
    end
end
assert(l:serve(nil, on_data))
print("served")
]]

function support.lua_server(mode, address)
    local p = support.lua_peer(support.SERVER, mode, address)
    p:expect("listening")
    return p
end

-- Tells a Lua server peer to stop, and waits for it.
function support.stop_server(p, address)
    local s = shmipc.connect(address)
    if s then
        local st = assert(s:open_stream())
        st:write("quit"):flush()
        st:read_chunk() -- the end of the stream, once the server closed it
        s:close()
    end
    return p:finish()
end

-- Reads a stream to its end: returns everything read, then the code that ended it.
function support.read_all(st)
    local parts = {}
    while true do
        local data, _, code = st:read_chunk()
        if data == nil then
            return table.concat(parts), code
        end
        parts[#parts + 1] = data
    end
end

support.REQUEST = "client say hello world!!!"
support.REPLY = "server hello world!!!"
support.E = E

return support
