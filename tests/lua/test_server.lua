-- Description: shmipc.server: Lua routes (request fields, every response form), static routes,
-- 404, handlers that raise (500, logged, still serving), both backends, the options, misuse,
-- stop() and close() from a handler, run() against a client process, handlers serialized
-- under concurrent clients, and the callback thread closed or resumed by user code. The HTTP
-- client is lua-socket in this process, waiting with shmipc.poll(), which lets the server's
-- workers call the Lua handlers meanwhile; without lua-socket the file says so and skips.
local shmipc = require "shmipc"
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local support = dofile(here .. "/ipc_support.lua")

local E = shmipc.errors
local has_socket, socket = pcall(require, "socket")
if not has_socket then
    print("# skip test_server.lua: lua-socket is not installed (apt-get install lua-socket)")
    return { skipped_without_lua_socket = function() end }
end
local client = dofile(here .. "/server_support.lua")

local tests = {}

local parse, exchange, request_text, fetch = client.parse, client.exchange, client.request_text, client.fetch

-- A started server on an ephemeral port, with errors collected in `errors`.
local function new_server(opts)
    local errors = {}
    opts = opts or {}
    opts.port = opts.port or 0
    opts.workers = opts.workers or 2
    opts.on_error = opts.on_error or function(msg)
        errors[#errors + 1] = msg
    end
    local srv = assert(shmipc.server(opts))
    return srv, errors
end

-- ---------------------------------------------------------------------------------------
-- Routes and responses.
-- ---------------------------------------------------------------------------------------

local function app(srv)
    assert(srv:route("GET", "/hello", function(req)
        return 200, "hello " .. (req.query or "(none)"), "text/plain"
    end))
    assert(srv:route("POST", "/items/*", function(req)
        return {
            status = 201,
            body = string.format("%s|%s|%s|%s|%s", req.method, req.path, req.wildcard, req.body, req.version),
            headers = { ["X-Multi"] = { "a", "b" }, ["Content-Type"] = "text/x-items" },
        }
    end))
    assert(srv:route(nil, "/echo-headers", function(req)
        local h = req:headers()
        return 200, string.format("%s|%s|%s|%s", tostring(req:header("x-one")), tostring(req:header("X-ONE")),
            tostring(h["x-two"]), tostring(req:header("x-missing")))
    end))
    assert(srv:route("GET", "/string", function()
        return "just a string"
    end))
    assert(srv:route("DELETE", "/nothing", function() end))
    assert(srv:route("GET", "/client", function(req)
        return 200, string.format("%s %s %s", req.client, math.type(req.client_port), req.client_port)
    end))
    assert(srv:route("GET", "/teapot", function()
        return 418, nil, { ["X-Kind"] = "teapot" }
    end))
    return srv
end

for _, backend in ipairs({ "epoll", "io_uring" }) do
    tests["routes_" .. backend] = function(t)
        local srv <close>, errors = new_server({ backend = backend })
        app(srv)
        local ok, msg, code = srv:start()
        if not ok and backend == "io_uring" and (code == E.EACCES or code == E.ENOTSUP) then
            print("# skip routes_io_uring: " .. msg)
            return
        end
        t.truthy(ok, msg)
        t.eq(srv:backend(), backend, "backend")
        local port = srv:port()
        t.truthy(port > 0, "port")

        local r = fetch(port, "GET", "/hello?a=1&b=2")
        t.eq(r.status, 200, "status")
        t.eq(r.body, "hello a=1&b=2", "body")
        t.eq(r.headers["content-type"], "text/plain", "content type")
        t.eq(r.headers["server"], "shmipc", "server header")

        t.eq(fetch(port, "GET", "/hello").body, "hello (none)", "no query is nil")

        r = fetch(port, "POST", "/items/7/x", "the body")
        t.eq(r.status, 201, "status from a table")
        t.eq(r.body, "POST|/items/7/x|7/x|the body|1.1", "request fields")
        t.eq(r.headers["x-multi"], "a, b", "repeated header")
        t.eq(r.headers["content-type"], "text/x-items", "content type header")

        r = fetch(port, "PUT", "/echo-headers", nil, { ["X-One"] = "1" })
        t.eq(r.body, "1|1|nil|nil", "header lookups")

        local raw = exchange(port, { "GET /echo-headers HTTP/1.1\r\nHost: h\r\nX-Two: a\r\nx-two: b\r\n"
            .. "Connection: close\r\n\r\n" })[1]
        t.eq(parse(raw)[1].body, "nil|nil|a, b|nil", "headers() joins repeats")

        r = fetch(port, "GET", "/string")
        t.eq(r.status, 200, "a string is 200")
        t.eq(r.body, "just a string", "string body")

        t.eq(fetch(port, "DELETE", "/nothing").status, 204, "nothing is 204")

        local host, kind, cport = fetch(port, "GET", "/client").body:match("^(%S+) (%S+) (%d+)$")
        t.eq(host, "127.0.0.1", "req.client")
        t.eq(kind, "integer", "req.client_port is an integer")
        t.truthy(tonumber(cport) > 0 and tonumber(cport) ~= port, "req.client_port is the client's")

        r = fetch(port, "GET", "/teapot")
        t.eq(r.status, 418, "status with nil body")
        t.eq(r.body, "", "empty body")
        t.eq(r.headers["x-kind"], "teapot", "headers table")

        r = fetch(port, "HEAD", "/hello")
        t.eq(r.status, 200, "HEAD on a GET route")

        t.eq(fetch(port, "GET", "/missing").status, 404, "unknown path")
        t.eq(fetch(port, "GET", "/items/1").status, 405, "wrong method")
        t.eq(#errors, 0, "no handler errors: " .. table.concat(errors, "\n"))
    end
end

function tests.static_routes(t)
    local srv <close> = new_server()
    assert(srv:static("/", "Hello, World!", "text/plain"))
    assert(srv:static("/created", "made", nil, 201, "POST"))
    assert(srv:static("/files/*", "any file"))
    assert(srv:start())
    local port = srv:port()
    local r = fetch(port, "GET", "/")
    t.eq(r.status, 200, "status")
    t.eq(r.body, "Hello, World!", "body")
    t.eq(r.headers["content-type"], "text/plain", "content type")
    r = fetch(port, "POST", "/created", "x")
    t.eq(r.status, 201, "static status")
    t.eq(r.body, "made", "static body")
    t.eq(r.headers["content-type"], nil, "no content type")
    t.eq(fetch(port, "GET", "/files/a/b").body, "any file", "static prefix route")
    t.eq(fetch(port, "GET", "/created").status, 405, "static route's method")
    t.eq(fetch(port, "GET", "/nope").status, 404, "404")
end

-- Static routes and 404s are answered in C: they need no gate, so they are served while
-- Lua code runs (here: a blocking, gate-holding receive on the main thread).
function tests.static_while_lua_runs(t)
    local srv <close> = new_server()
    assert(srv:static("/s", "static"))
    assert(srv:start())
    local c = assert(socket.tcp())
    c:settimeout(5)
    assert(c:connect("127.0.0.1", srv:port()))
    assert(c:send(request_text("GET", "/s")))
    local raw = assert(c:receive("*a"))
    c:close()
    t.eq(parse(raw)[1].body, "static", "served without leaving Lua")
end

-- ---------------------------------------------------------------------------------------
-- Handler errors.
-- ---------------------------------------------------------------------------------------

function tests.handler_errors_answer_500_and_keep_serving(t)
    local srv <close>, errors = new_server()
    assert(srv:route("GET", "/boom", function()
        error("boom in the handler")
    end))
    assert(srv:route("GET", "/bad-return", function()
        return true
    end))
    assert(srv:route("GET", "/bad-status", function()
        return 99, "x"
    end))
    assert(srv:route("GET", "/bad-header", function()
        return 200, "x", { ["Content-Length"] = "5" }
    end))
    assert(srv:route("GET", "/table-error", function()
        error({ "not a string" })
    end))
    assert(srv:route("GET", "/ok", function()
        return "still here"
    end))
    assert(srv:start())
    local port = srv:port()

    local r = fetch(port, "GET", "/boom")
    t.eq(r.status, 500, "raise")
    t.eq(r.body, "internal server error\n", "500 body")
    t.eq(#errors, 1, "one error logged")
    t.truthy(errors[1]:find("GET /boom: ", 1, true), errors[1])
    t.truthy(errors[1]:find("boom in the handler", 1, true), errors[1])
    t.truthy(errors[1]:find("stack traceback", 1, true), errors[1])

    t.eq(fetch(port, "GET", "/bad-return").status, 500, "a boolean result")
    t.truthy(errors[2]:find("the handler returned a boolean", 1, true), errors[2])
    t.eq(fetch(port, "GET", "/bad-status").status, 500, "status out of range")
    t.truthy(errors[3]:find("outside 200..999", 1, true), errors[3])
    t.eq(fetch(port, "GET", "/bad-header").status, 500, "a header the server owns")
    t.truthy(errors[4]:find("header", 1, true), errors[4])
    t.eq(fetch(port, "GET", "/table-error").status, 500, "a non-string error")
    t.truthy(errors[5]:find("error object is a table", 1, true), errors[5])

    -- The same connection goes on after a handler raised.
    local raw = exchange(port, { "GET /boom HTTP/1.1\r\nHost: h\r\n\r\n" .. request_text("GET", "/ok") })[1]
    local rs = parse(raw)
    t.eq(#rs, 2, "two responses on one connection")
    t.eq(rs[1].status, 500, "first")
    t.eq(rs[2].body, "still here", "second")
end

-- ---------------------------------------------------------------------------------------
-- run(), stop() and close() from handlers.
-- ---------------------------------------------------------------------------------------

local CLIENT = [[
local socket = require "socket"
local port = tonumber(arg[1])
for i = 2, #arg do
    local c = assert(socket.tcp())
    c:settimeout(10)
    assert(c:connect("127.0.0.1", port))
    assert(c:send("GET " .. arg[i] .. " HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"))
    local raw = assert(c:receive("*a"))
    c:close()
    print(arg[i], raw:match("^HTTP/1.1 (%d+)"), raw:match("\r\n\r\n(.*)$"))
end
]]

-- Without on_error the error goes to stderr; checked in a child process that runs the server,
-- with a grandchild client.
function tests.handler_error_default_log(t)
    local client_script = os.tmpname()
    local f = assert(io.open(client_script, "w"))
    f:write(CLIENT)
    f:close()
    local p <close> = support.lua_peer([[
local shmipc = require "shmipc"
local srv = assert(shmipc.server{port = 0, workers = 1})
assert(srv:route("GET", "/boom", function() error("logged to stderr") end))
assert(srv:route("GET", "/stop", function() srv:stop() return "bye" end))
assert(srv:start())
local client = io.popen(string.format("exec %s %s %d /boom /stop", arg[-1], arg[1], srv:port()))
assert(srv:run())
io.write(client:read("a"))
client:close()
srv:close()
]], client_script)
    local ok, out = p:finish()
    os.remove(client_script)
    t.truthy(ok, out)
    t.truthy(out:find("shmipc.server: GET /boom: ", 1, true), out)
    t.truthy(out:find("logged to stderr", 1, true), out)
    t.truthy(out:find("/boom\t500\tinternal server error\n\n/stop\t200\tbye", 1, true), out)
end

function tests.run_until_stop_from_handler(t)
    local srv <close>, errors = new_server({ workers = 2 })
    local count = 0
    assert(srv:route("GET", "/count", function()
        count = count + 1
        return tostring(count)
    end))
    assert(srv:route("GET", "/stop", function()
        t.eq(srv:stop(), srv, "stop returns the server")
        return "stopping"
    end))
    assert(srv:start())
    local client <close> = support.lua_peer(CLIENT, srv:port(), "/count", "/count", "/stop")
    t.eq(srv:run(), true, "run returns after stop()")
    local ok, out = client:finish()
    t.truthy(ok, out)
    t.truthy(out:find("/count\t200\t1\n/count\t200\t2\n/stop\t200\tstopping", 1, true), out)
    t.eq(count, 2, "handlers ran on this state")
    t.eq(#errors, 0, "no errors")
    -- Stopped: the port is free again and the handle can still be closed.
    srv:close()
    t.eq(tostring(srv), "shmipc.server (closed)", "closed")
end

function tests.close_from_handler(t)
    local srv, errors = new_server()
    assert(srv:route("GET", "/close", function()
        srv:close()
        srv:close() -- twice is fine
        return "closing"
    end))
    assert(srv:start())
    local client <close> = support.lua_peer(CLIENT, srv:port(), "/close")
    t.eq(srv:run(), true, "run returns")
    local ok, out = client:finish()
    t.truthy(ok, out)
    t.truthy(out:find("/close\t200\tclosing", 1, true), out)
    t.eq(tostring(srv), "shmipc.server (closed)", "freed when run returned")
    t.raises("closed shmipc.server", srv.port, srv)
    t.eq(#errors, 0, "no errors")
end

function tests.run_inside_handler_raises(t)
    local srv <close>, errors = new_server()
    assert(srv:route("GET", "/run", function()
        srv:run()
    end))
    assert(srv:start())
    t.eq(fetch(srv:port(), "GET", "/run").status, 500, "500")
    t.truthy(errors[1]:find("run: not from a server callback", 1, true), errors[1])
end

-- shmipc.poll() inside a handler keeps the gate (another worker must not enter the Lua state
-- meanwhile); an on_error that raises is reported on stderr and the server goes on.
function tests.poll_inside_handler_and_failing_on_error(t)
    local calls = 0
    local srv <close> = assert(shmipc.server({ port = 0, workers = 2, on_error = function(msg)
        calls = calls + 1
        error("on_error itself fails")
    end }))
    local inside, overlap = 0, false
    assert(srv:route("GET", "/sleep", function()
        inside = inside + 1
        overlap = overlap or inside > 1
        shmipc.poll({}, 0.02)
        inside = inside - 1
        return "slept"
    end))
    assert(srv:route("GET", "/boom", function()
        error("boom")
    end))
    assert(srv:start())
    local texts = {}
    for i = 1, 6 do
        texts[i] = client.request_text("GET", "/sleep")
    end
    for _, raw in ipairs(client.exchange(srv:port(), texts)) do
        t.eq(client.parse(raw)[1].body, "slept", "body")
    end
    t.eq(overlap, false, "no two handlers at once")
    t.eq(fetch(srv:port(), "GET", "/boom").status, 500, "500")
    t.eq(calls, 1, "on_error called")
    t.eq(fetch(srv:port(), "GET", "/sleep").body, "slept", "still serving")
end

-- Regression: Lua callbacks run on one thread of the server's (lua_newthread), which a handler
-- can take with coroutine.running(). The server kept its message handler, routes table and
-- WebSocket connections in fixed slots of that thread's stack: a coroutine.close() of the
-- thread from outside emptied them (every later handler failed with "error in error
-- handling", a WebSocket callback used nil as a table: SEGV under ASan), and a
-- coroutine.resume() of it called the slot on top and left the thread dead by an error. Each
-- case runs in a child process, which may crash on the old code, and prints a line a step.
local CALLBACK_THREAD = [[
local shmipc = require "shmipc"
local client = dofile(arg[1])
local case = arg[2]
local errors = {}
local srv = assert(shmipc.server{port = 0, workers = 2, on_error = function(msg)
    errors[#errors + 1] = msg
end})
local T
assert(srv:route("GET", "/take", function() T = coroutine.running() return "taken" end))
assert(srv:route("GET", "/ok", function(req) return "ok " .. req.query end))
assert(srv:route("GET", "/yield", function() coroutine.yield("x") return "yielded" end))
assert(srv:route("GET", "/close-self", function()
    coroutine.close(coroutine.running())
    return "closed itself"
end))
assert(srv:websocket("/ws", {
    on_open = function() T = coroutine.running() end,
    on_message = function(ws, data) assert(ws:send("echo " .. data)) end,
}))
assert(srv:start())
local port = srv:port()
local function get(path)
    local r = client.fetch(port, "GET", path)
    print(path, r.status, r.body)
    io.stdout:flush()
end
local function churn()
    collectgarbage()
    local junk = {}
    for i = 1, 20000 do junk[i] = {i} end
    collectgarbage()
end
-- Opens /ws, runs `between` (if any), sends "hi" and prints the echo.
local function websocket(between)
    local c, status = client.ws_connect(port, "/ws")
    print("ws", status)
    if between then
        between()
    end
    c:ws_send("text", "hi")
    print("ws", c:ws_recv(5))
    c:close()
end
if case == "close" then
    get("/take")
    print("close", coroutine.close(T), coroutine.status(T))
    T = nil
    churn()
    get("/ok?1")
    get("/ok?2")
elseif case == "resume" then
    get("/take")
    print("resume", coroutine.resume(T, "arg"))
    print("status", coroutine.status(T))
    churn()
    get("/ok?1")
    websocket()
elseif case == "websocket" then
    websocket(function()
        print("close", coroutine.close(T))
        churn()
    end)
    get("/ok?1")
elseif case == "yield" then
    get("/yield")
    get("/close-self")
    get("/ok?1")
end
for i, e in ipairs(errors) do
    print("error", i, (e:match("^[^\n]*"):gsub("[^ ]*:%d+: ", ""))) -- no chunk:line
end
srv:close()
print("done")
]]

local CALLBACK_THREAD_CASES = {
    close = { "/take\t200\ttaken", "close\ttrue\tdead", "/ok?1\t200\tok 1", "/ok?2\t200\tok 2" },
    resume = { "/take\t200\ttaken", "resume\tfalse\tcannot resume dead coroutine", "status\tdead",
        "/ok?1\t200\tok 1", "ws\t101", "ws\ttext\techo hi\ttrue" },
    websocket = { "ws\t101", "close\ttrue", "ws\ttext\techo hi\ttrue", "/ok?1\t200\tok 1" },
    -- Not coroutines: a handler that yields or closes its own thread raises (500, logged).
    yield = { "/yield\t500\tinternal server error\n", "/close-self\t500\tinternal server error\n",
        "/ok?1\t200\tok 1", "error\t1\tGET /yield: attempt to yield across a C-call boundary",
        "error\t2\tGET /close-self: cannot close a running coroutine" },
}

for case, lines in pairs(CALLBACK_THREAD_CASES) do
    tests["callback_thread_taken_by_user_code_" .. case] = function(t)
        local p <close> = support.lua_peer(CALLBACK_THREAD, here .. "/server_support.lua", case)
        local ok, out = p:finish()
        t.eq(out, table.concat(lines, "\n") .. "\ndone", "output")
        t.truthy(ok, out)
    end
end

function tests.stop_before_run(t)
    local srv <close> = new_server()
    assert(srv:start())
    srv:stop()
    t.eq(srv:run(), true, "run returns at once after an earlier stop")
end

-- ---------------------------------------------------------------------------------------
-- Serialized handlers under concurrent clients.
-- ---------------------------------------------------------------------------------------

function tests.handlers_serialized(t)
    local srv <close>, errors = new_server({ workers = 2 })
    local inside, max_inside, total = 0, 0, 0
    assert(srv:route("GET", "/work", function(req)
        inside = inside + 1
        max_inside = math.max(max_inside, inside)
        -- Some Lua work that would interleave if two threads ran it at once.
        local s = 0
        for i = 1, 2000 do
            s = s + i
        end
        total = total + 1
        inside = inside - 1
        return tostring(s) .. " " .. req.query
    end))
    assert(srv:start())
    local texts = {}
    for i = 1, 16 do
        local reqs = {}
        for k = 1, 4 do
            reqs[k] = string.format("GET /work?%d.%d HTTP/1.1\r\nHost: h\r\n%s\r\n", i, k,
                k == 4 and "Connection: close\r\n" or "")
        end
        texts[i] = table.concat(reqs)
    end
    local raws = exchange(srv:port(), texts, 30)
    for i, raw in ipairs(raws) do
        local rs = parse(raw)
        t.eq(#rs, 4, "responses on connection " .. i)
        for k, r in ipairs(rs) do
            t.eq(r.body, string.format("2001000 %d.%d", i, k), "body")
        end
    end
    t.eq(total, 64, "every request ran its handler")
    t.eq(max_inside, 1, "one handler at a time")
    t.eq(#errors, 0, "no errors")
end

-- ---------------------------------------------------------------------------------------
-- Options, the request handle, misuse, lifetimes.
-- ---------------------------------------------------------------------------------------

function tests.options(t)
    t.raises("unknown option 'bogus'", shmipc.server, { bogus = 1 })
    t.raises("option 'port' got a string", shmipc.server, { port = "80" })
    t.raises("option 'workers' must be an integer", shmipc.server, { workers = 1.5 })
    t.refused(E.EINVAL, "port: 70000", shmipc.server({ port = 70000 }))
    t.refused(E.EINVAL, "backend: \"bogus\"", shmipc.server({ backend = "bogus" }))
    t.refused(E.EINVAL, "header_timeout", shmipc.server({ header_timeout = 0 }))
    t.ok(shmipc.server({ header_timeout = -1, keepalive_timeout = -1, stop_timeout = -1 })):close()
    t.refused(E.EINVAL, "address", shmipc.server({ address = "not an address" }))
    t.refused(E.EINVAL, "", shmipc.server({ max_headers = 100000 }))

    local srv <close> = assert(shmipc.server({
        address = "127.0.0.1", port = 0, workers = 1, backend = "epoll", header_timeout = 2,
        keepalive_timeout = 3, stop_timeout = 1, max_body = 16, max_request_line = 1024,
        max_head_bytes = 8192, max_headers = 32, pipeline = 4, server_name = false,
    }))
    assert(srv:route("POST", "/b", function(req)
        return req.body
    end))
    t.eq(srv:backend(), nil, "no backend before start")
    t.refused(E.EINVAL, "", srv:port())
    assert(srv:start())
    t.eq(srv:backend(), "epoll", "backend")
    local r = fetch(srv:port(), "POST", "/b", "0123456789")
    t.eq(r.body, "0123456789", "body under the limit")
    t.eq(r.headers["server"], nil, "server_name = false: no Server header")
    t.eq(fetch(srv:port(), "POST", "/b", string.rep("x", 17)).status, 413, "max_body")

    local named <close> = assert(shmipc.server({ port = 0, workers = 1, server_name = "lua-test" }))
    assert(named:static("/", "x"))
    assert(named:start())
    t.eq(fetch(named:port(), "GET", "/").headers["server"], "lua-test", "server_name")
end

-- keepalive_requests: the second answer on a connection says Connection: close and the
-- connection ends; the third request pipelined behind it is not answered.
function tests.keepalive_requests_option(t)
    t.refused(E.EINVAL, "keepalive_requests", shmipc.server({ keepalive_requests = 2 ^ 32 }))
    local srv <close> = new_server({ keepalive_requests = 2 })
    assert(srv:static("/", "x"))
    assert(srv:start())
    local one = "GET / HTTP/1.1\r\nHost: h\r\n\r\n"
    local rs = parse(exchange(srv:port(), { one .. one .. one })[1])
    t.eq(#rs, 2, "two answers, then the close")
    t.eq(rs[1].headers["connection"], nil, "the first keeps the connection")
    t.eq(rs[2].headers["connection"], "close", "the second closes it")
end

-- address = "unix:PATH": a unix socket, the port unused (0), the file gone after close; a
-- regular file at the path is refused and kept; a path over 107 bytes is refused at once.
function tests.unix_socket_address(t)
    local path = os.tmpname()
    os.remove(path)
    local srv = assert(shmipc.server({ address = "unix:" .. path, workers = 2 }))
    assert(srv:static("/", "over unix"))
    assert(srv:start())
    t.eq(srv:port(), 0, "no port on a unix socket")
    local unix = require "socket.unix"
    local c = assert(unix())
    assert(c:connect(path))
    assert(c:send("GET / HTTP/1.1\r\nHost: u\r\nConnection: close\r\n\r\n"))
    local raw = c:receive("*a")
    c:close()
    t.truthy(raw:find("^HTTP/1.1 200") and raw:find("over unix", 1, true), raw)
    srv:close()
    t.eq(io.open(path), nil, "the socket file is removed at close")
    local f = assert(io.open(path, "w"))
    f:write("keep")
    f:close()
    local again <close> = assert(shmipc.server({ address = "unix:" .. path, workers = 1 }))
    t.refused(E.EEXIST, "not a socket", again:start())
    f = assert(io.open(path))
    t.eq(f:read("a"), "keep", "the file is left as it was")
    f:close()
    os.remove(path)
    t.refused(E.ENAMETOOLONG, "107", shmipc.server({ address = "unix:/" .. string.rep("p", 107) }))
end

function tests.request_outside_its_handler(t)
    local srv <close>, errors = new_server()
    local kept
    assert(srv:route("GET", "/keep", function(req)
        kept = req
        t.truthy(tostring(req):find("GET /keep", 1, true), tostring(req))
        return "kept"
    end))
    assert(srv:route("GET", "/field", function(req)
        return req.bogus
    end))
    assert(srv:start())
    t.eq(fetch(srv:port(), "GET", "/keep").body, "kept", "body")
    t.raises("after its handler returned", function()
        return kept.path
    end)
    t.raises("after its handler returned", function()
        return kept:header("host")
    end)
    t.eq(tostring(kept), "shmipc.request (done)", "tostring")
    t.eq(fetch(srv:port(), "GET", "/field").status, 500, "unknown field raises")
    t.truthy(errors[1]:find("invalid option 'bogus'", 1, true), errors[1])
end

function tests.misuse(t)
    local srv <close> = new_server()
    t.raises("function expected", srv.route, srv, "GET", "/x", "not a function")
    t.raises("NUL", srv.route, srv, "GET", "/x\0y", function() end)
    t.refused(E.EINVAL, "", srv:route("GET", "no-slash", function() end))
    t.refused(E.EINVAL, "method", srv:route("BAD METHOD", "/x", function() end))
    assert(srv:route("GET", "/x", function() end))
    t.refused(E.EEXIST, "", srv:route("GET", "/x", function() end))
    t.refused(E.EINVAL, "status 99", srv:static("/s", "x", nil, 99))
    assert(srv:start())
    t.refused(E.EBUSY, "running", srv:route("GET", "/late", function() end))
    t.refused(E.EBUSY, "", srv:static("/late", "x"))
    t.eq(srv:start(), srv, "start twice is a no-op")
    srv:close()
    srv:close()
    t.raises("closed shmipc.server", srv.start, srv)
    t.raises("closed shmipc.server", srv.route, srv, "GET", "/y", function() end)
    t.eq(tostring(srv), "shmipc.server (closed)", "tostring")
end

function tests.close_and_collect(t)
    local fds = support.fd_count()
    do
        local srv <close> = new_server()
        assert(srv:route("GET", "/", function() return "x" end))
        assert(srv:start())
        t.eq(fetch(srv:port(), "GET", "/").body, "x", "served")
    end
    t.eq(support.fd_count(), fds, "descriptors after <close>")
    -- A server that was never started is collected; a started one is anchored until closed.
    do
        local srv = new_server()
        assert(srv:route("GET", "/", function() return "y" end))
    end
    collectgarbage()
    collectgarbage()
    t.eq(support.fd_count(), fds, "descriptors after collection")
    local port
    local weak = setmetatable({}, { __mode = "v" })
    do
        local srv = new_server()
        assert(srv:route("GET", "/", function() return "anchored" end))
        assert(srv:start())
        port = srv:port()
        weak[1] = srv
    end
    collectgarbage()
    collectgarbage()
    t.truthy(weak[1], "a started server is not collected")
    t.eq(fetch(port, "GET", "/").body, "anchored", "a started server survives collection")
    weak[1]:close()
    collectgarbage()
    t.eq(weak[1], nil, "collected once closed")
    t.eq(support.fd_count(), fds, "descriptors after close")
end

-- Regression (issue 18 item 5): a second server on a port the first serves joined its
-- SO_REUSEPORT group silently; now start() returns nil, a message saying so, E.EADDRINUSE,
-- unless reuse_port = true asks to share.
function tests.port_in_use_is_eaddrinuse(t)
    local a <close> = new_server({ backend = "epoll" })
    assert(a:static("/", "a"))
    assert(a:start())
    local port = a:port()
    for _, reuse in ipairs({ false, "unset" }) do
        local opts = { port = port, workers = 2, backend = "epoll" }
        if reuse ~= "unset" then
            opts.reuse_port = reuse
        end
        local b <close> = assert(shmipc.server(opts))
        t.refused(E.EADDRINUSE, "in use", b:start())
    end
    local b <close> = assert(shmipc.server({ port = port, workers = 2, backend = "epoll", reuse_port = true }))
    assert(b:static("/", "b"))
    t.truthy(b:start(), "shared on purpose")
    t.eq(b:port(), port, "same port")
    t.eq(fetch(port, "GET", "/").status, 200, "served")
    t.raises("reuse_port", shmipc.server, { reuse_port = 1 })
end

-- run{signals = ...}: only a boolean "signals" option; misuse raises before anything runs.
function tests.run_options_misuse(t)
    local srv <close> = new_server({ backend = "epoll" })
    t.raises("unknown option 'signal'", srv.run, srv, { signal = true })
    t.raises("'signals' is a boolean", srv.run, srv, { signals = 1 })
    t.raises("table expected", srv.run, srv, "signals")
    assert(srv:start())
    srv:stop()
    local ok, sig = srv:run({ signals = true })
    t.truthy(ok, "stopped before run")
    t.eq(sig, nil, "not by a signal")
    -- The dispositions are restored: a second run{signals} can install them again.
    srv:stop()
    t.truthy(srv:run({ signals = true }), "again")
end

return tests
