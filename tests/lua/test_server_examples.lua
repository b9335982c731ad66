-- Description: the server examples run: examples/lua/http_app.lua (static page, the items API,
-- a handler that raises, shutdown from a handler) and examples/lua/ws_echo.lua (text and binary
-- echo, a server-side close, shutdown from on_message), each as its own lua5.4 process driven
-- by the lua-socket client of server_support.lua. Without lua-socket the file skips.
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local support = dofile(here .. "/ipc_support.lua")
if not pcall(require, "socket") then
    print("# skip test_server_examples.lua: lua-socket is not installed (apt-get install lua-socket)")
    return { skipped_without_lua_socket = function() end }
end
local client = dofile(here .. "/server_support.lua")

local tests = {}

-- Starts a Lua example as a process; returns it and the port from its "listening" line.
local function start_example(name, ...)
    local args = {}
    for i, a in ipairs({ ... }) do
        args[i] = support.quote(a)
    end
    local p = support.spawn(string.format("env LUA_CPATH=%s %s %s %s",
        support.quote(support.module_dir .. "/?.so;;"), support.quote(support.lua),
        support.quote(support.source_dir .. "/examples/lua/" .. name), table.concat(args, " ")))
    local line = p:expect("listening on")
    return p, tonumber(line:match(":(%d+)"))
end

function tests.http_app(t)
    local app <close>, port = start_example("http_app.lua", 0, 2)
    local r = client.fetch(port, "GET", "/")
    t.eq(r.status, 200, "static page")
    t.eq(r.headers["content-type"], "text/html", "its type")
    t.eq(r.headers["server"], "http_app.lua", "server_name")
    r = client.fetch(port, "POST", "/items", "milk")
    t.eq(r.status, 201, "created")
    t.eq(r.headers["location"], "/items/1", "location")
    t.eq(client.fetch(port, "POST", "/items", "eggs").body, "2\n", "second id")
    t.eq(client.fetch(port, "POST", "/items", "").status, 400, "empty item")
    t.eq(client.fetch(port, "GET", "/items").body, "1: milk\n2: eggs\n", "listing")
    t.eq(client.fetch(port, "GET", "/items/2").body, "eggs\n", "one item")
    t.eq(client.fetch(port, "DELETE", "/items/1").status, 204, "deleted")
    t.eq(client.fetch(port, "GET", "/items/1").status, 404, "gone")
    r = client.fetch(port, "PUT", "/items/2")
    t.eq(r.status, 405, "method")
    t.eq(r.headers["allow"], "GET, DELETE", "allow")
    t.eq(client.fetch(port, "GET", "/items/oops").status, 500, "a handler that raises")
    t.eq(client.fetch(port, "GET", "/items").body, "2: eggs\n", "still serving")
    t.eq(client.fetch(port, "POST", "/shutdown").body, "bye\n", "shutdown")
    local ok, out = app:finish()
    t.truthy(ok, out)
    t.truthy(out:find("http_app: * /items/*: ", 1, true), out)
    t.truthy(out:find("a bug in a handler", 1, true), out)
    t.truthy(out:find("stopped with 2 items added", 1, true), out)
end

function tests.ws_echo(t)
    local server <close>, port = start_example("ws_echo.lua", 0, 2)
    t.eq(client.fetch(port, "GET", "/").body, "WebSocket echo on /echo\n", "static page")
    local c, status, head = client.ws_connect(port, "/echo", "echo", { "User-Agent: lua-test" })
    t.eq(status, 101, "upgrade: " .. head)
    t.truthy(head:find("Sec-WebSocket-Protocol: echo", 1, true), head)
    c:ws_send("text", "hello")
    local kind, data = c:ws_recv()
    t.eq(kind, "text", "kind")
    t.eq(data, "hello", "text echo")
    c:ws_send("binary", "\0\1\2")
    kind, data = c:ws_recv()
    t.eq(kind, "binary", "binary kind")
    t.eq(data, "\0\1\2", "binary echo")
    c:ws_send("text", "close")
    kind, data = c:ws_recv()
    t.eq(kind, "close", "server close")
    t.eq(data, string.pack(">I2", 1000) .. "bye", "code and reason")
    c:ws_send("close", string.pack(">I2", 1000))
    c:close()
    local c2, status2 = client.ws_connect(port, "/echo")
    t.eq(status2, 101, "second client")
    c2:ws_send("text", "shutdown")
    local ok, out = server:finish()
    c2:close()
    t.truthy(ok, out)
    t.truthy(out:find("open from lua-test (subprotocol echo), 1 open", 1, true), out)
    t.truthy(out:find("closed 1000 \"\"", 1, true), out)
    t.truthy(out:find("ws_echo: stopped after 4 messages", 1, true), out)
end

return tests
