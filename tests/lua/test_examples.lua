-- Description: the Lua examples run: examples/lua/greeter_client.lua against the C greeter
-- server and examples/lua/greeter_server.lua against the C greeter client, over V3 and V2,
-- and coroutine_echo.lua's client and server.
local support = dofile((debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or ".") .. "/ipc_support.lua")

local tests = {}

local function example(name)
    return support.source_dir .. "/examples/lua/" .. name
end

-- Runs a Lua example as a process, with this module on its path.
local function run_example(name, ...)
    local args = {}
    for i, a in ipairs({ ... }) do
        args[i] = support.quote(a)
    end
    return support.spawn(string.format("env LUA_CPATH=%s %s %s %s", support.quote(support.module_dir .. "/?.so;;"),
        support.quote(support.lua), support.quote(example(name)), table.concat(args, " ")))
end

for _, version in ipairs({ "v3", "v2" }) do
    tests["lua_greeter_client_" .. version] = function(t)
        local address = support.address("exc")
        local server <close> = support.greeter_server(address)
        local client <close> = run_example("greeter_client.lua", address, version)
        local ok, out = client:finish()
        t.truthy(ok, "greeter_client.lua: " .. out)
        t.truthy(out:find("client stream receive response " .. support.REPLY, 1, true), out)
        t.truthy(out:find("protocol V" .. version:sub(2), 1, true), out)
        t.truthy(server:finish(), "the C server")
    end

    tests["lua_greeter_server_" .. version] = function(t)
        local address = support.address("exs")
        local server <close> = run_example("greeter_server.lua", address, 1)
        server:expect("listening on")
        local client <close> = support.greeter_client(address, version)
        t.truthy(client:finish(), "the C client")
        local ok, out = server:finish()
        t.truthy(ok, "greeter_server.lua: " .. out)
        t.truthy(out:find("server receive request message:" .. support.REQUEST, 1, true), out)
        t.truthy(out:find("protocol V" .. version:sub(2), 1, true), out)
    end
end

function tests.lua_greeters_together(t)
    local address = support.address("exl")
    local server <close> = run_example("greeter_server.lua", address, 2)
    server:expect("listening on")
    for _, version in ipairs({ "v3", "v2" }) do
        local client <close> = run_example("greeter_client.lua", address, version)
        local ok, out = client:finish()
        t.truthy(ok, "greeter_client.lua " .. version .. ": " .. out)
    end
    t.truthy(server:finish(), "greeter_server.lua")
end

function tests.coroutine_echo(t)
    local address = support.address("excoro")
    local server <close> = run_example("coroutine_echo.lua", "server", address)
    server:expect("listening on")
    local client <close> = run_example("coroutine_echo.lua", "client", address, 4, 50)
    local ok, out = client:finish()
    t.truthy(ok, "client: " .. out)
    t.truthy(out:find("4 tasks x 50 round trips", 1, true), out)
    ok, out = server:finish()
    t.truthy(ok, "server: " .. out)
    t.truthy(out:find("stopped", 1, true), out)
end

return tests
