-- Description: Lua and Python talk over shmipc: a Lua client against a Python server and a
-- Python client against a Lua server, both through the greeter exchange. Runs when the
-- Python module built beside this one (build/python) has sessions; otherwise it says so
-- and skips.
local shmipc = require "shmipc"
local support = dofile((debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or ".") .. "/ipc_support.lua")

local E = shmipc.errors
local tests = {}

local pythonpath = support.build_dir .. "/python"

-- Runs `code` with /usr/bin/python3 and the built module; `...` become sys.argv[1:].
local function python(code, ...)
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write(code)
    f:close()
    local args = {}
    for i, a in ipairs({ ... }) do
        args[i] = support.quote(a)
    end
    local p = support.spawn(string.format("env PYTHONPATH=%s /usr/bin/python3 -u %s %s", support.quote(pythonpath),
        support.quote(script), table.concat(args, " ")))
    p.script = script
    return p
end

local function python_has_sessions()
    local p = python("import shmipc\nshmipc.connect; shmipc.Listener; shmipc.Stream.readexactly\nprint('yes')\n")
    local ok, out = p:finish()
    p:__close()
    return ok and out:find("yes", 1, true) ~= nil
end

local PY_SERVER = [[
import sys, shmipc
REQUEST, REPLY = b"client say hello world!!!", b"server hello world!!!"
with shmipc.Listener(sys.argv[1]) as l:
    print("listening", flush=True)
    with l.accept(10) as s, s.accept_stream(10) as st:
        req = st.readexactly(len(REQUEST))
        print("python got", req.decode(), flush=True)
        st.write(REPLY)
        st.flush()
        try:
            while st.read(): pass
        except shmipc.Error:
            pass
]]

local PY_CLIENT = [[
import sys, shmipc
REQUEST, REPLY = b"client say hello world!!!", b"server hello world!!!"
with shmipc.connect(sys.argv[1]) as s, s.open_stream() as st:
    st.write(REQUEST)
    st.flush()
    reply = st.readexactly(len(REPLY))
    print("python got", reply.decode(), "V%d" % s.version, flush=True)
    assert reply == REPLY
]]

if not python_has_sessions() then
    function tests.skipped_python_module_has_no_sessions(t)
        print("# skip test_python.lua: the Python module in " .. pythonpath .. " has no sessions")
    end
    return tests
end

function tests.lua_client_python_server(t)
    local address = support.address("py-server")
    local server <close> = python(PY_SERVER, address)
    server:expect("listening")
    do
        local s <close> = t.ok(shmipc.connect(address))
        local st <close> = t.ok(s:open_stream())
        t.ok(st:write(support.REQUEST):flush())
        t.eq(st:read(#support.REPLY), support.REPLY, "reply from Python")
    end
    local ok, out = server:finish()
    t.truthy(ok, "python server: " .. out)
    t.truthy(out:find("python got " .. support.REQUEST, 1, true), out)
end

function tests.python_client_lua_server(t)
    local address = support.address("py-client")
    local l <close> = t.ok(shmipc.listen(address))
    local client <close> = python(PY_CLIENT, address)
    local s <close> = t.ok(l:accept(10))
    local st <close> = t.ok(s:accept_stream(10))
    t.eq(st:read(#support.REQUEST), support.REQUEST, "request from Python")
    t.ok(st:write(support.REPLY):flush())
    local _, code = support.read_all(st)
    t.truthy(code == E.EEOF or code == E.ECONNRESET, "the client hung up")
    local ok, out = client:finish()
    t.truthy(ok, "python client: " .. out)
    t.truthy(out:find("python got " .. support.REPLY .. " V3", 1, true), out)
end

return tests
