-- Description: the server examples run: examples/lua/http_app.lua (static page, the items API,
-- a handler that raises, shutdown from a handler) and examples/lua/ws_echo.lua (text and binary
-- echo, a server-side close, shutdown from on_message), each as its own lua5.4 process driven
-- by the lua-socket client of server_support.lua; and both stop cleanly on SIGTERM and SIGINT
-- (run{signals = true}): a request in flight is answered whole and the exit status is 0.
-- Without lua-socket the file skips.
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local support = dofile(here .. "/ipc_support.lua")
local has_socket, socket = pcall(require, "socket")
if not has_socket then
    print("# skip test_server_examples.lua: lua-socket is not installed (apt-get install lua-socket)")
    return { skipped_without_lua_socket = function() end }
end
local client = dofile(here .. "/server_support.lua")

local tests = {}

-- Starts a Lua example as a process; returns it and the port from its "listening" line.
-- SIGINT and SIGTERM are reset to their default first: a non-interactive shell running
-- this harness in the background ignores SIGINT, and the example would inherit that.
local function start_example(name, ...)
    local args = {}
    for i, a in ipairs({ ... }) do
        args[i] = support.quote(a)
    end
    local p = support.spawn(string.format("env --default-signal=INT,TERM LUA_CPATH=%s %s %s %s",
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

-- Waits for the example's end: how ("exit" or "signal"), the code, its whole output. One that
-- has not ended within 15 s is killed (a test that fails must not hang: before run{signals},
-- lua5.4's own SIGINT handler only set a hook that the blocked run() never reached).
local function finish_status(p)
    local dog = assert(io.popen(string.format(
        "(sleep 15; kill -KILL %d) >/dev/null 2>&1 </dev/null & echo $!", p.pid)))
    local dog_pid = assert(dog:read("n"))
    dog:close()
    for line in p.pipe:lines() do
        p.output[#p.output + 1] = line
    end
    local _, how, code = p.pipe:close()
    os.execute(string.format("kill %d 2>/dev/null", dog_pid)) -- the watchdog's shell, so no kill runs
    p.done, p.ok = true, how == "exit" and code == 0
    return how, code, table.concat(p.output, "\n")
end

-- Regression (issue 18 item 6): the Lua example servers died with status 143 on SIGTERM.
-- Now SIGTERM and SIGINT stop them gracefully: the request a slow handler is working on when
-- the signal comes is answered whole, then the script ends with status 0.
for _, sig in ipairs({ "TERM", "INT" }) do
    tests["http_app_stops_on_sig" .. sig:lower() .. "_in_flight"] = function(t)
        local app <close>, port = start_example("http_app.lua", 0, 2)
        local c = client.connect(port)
        c:send("GET /slow?ms=500 HTTP/1.1\r\nHost: h\r\n\r\n")
        app:expect("http_app: /slow started")
        app:kill(sig)
        local head = c:read_head(10)
        t.truthy(head and head:find("^HTTP/1.1 200 OK\r\n"), head)
        local len = tonumber(head:lower():match("\r\ncontent%-length: (%d+)\r\n"))
        t.eq(c:read(len), "slept 500 ms\n", "the whole body")
        c:close()
        local how, code, out = finish_status(app)
        t.eq(how .. " " .. code, "exit 0", out)
        t.truthy(out:find("http_app: stopped by SIG" .. sig .. " with 0 items added", 1, true), out)
        -- Stopped: nothing listens any more.
        t.eq(socket.connect("127.0.0.1", port), nil, "nothing listens after the stop")
    end
end

function tests.ws_echo_stops_on_sigterm(t)
    local server <close>, port = start_example("ws_echo.lua", 0, 2)
    local c, status = client.ws_connect(port, "/echo")
    t.eq(status, 101, "upgrade")
    c:ws_send("text", "hi")
    local kind, data = c:ws_recv()
    t.eq(kind .. " " .. data, "text hi", "echo")
    server:kill("TERM")
    local how, code, out = finish_status(server)
    c:close()
    t.eq(how .. " " .. code, "exit 0", out)
    t.truthy(out:find("ws_echo: stopped by SIGTERM after 1 messages", 1, true), out)
end

return tests
