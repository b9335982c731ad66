-- Description: shmipc.server's answers sent later from Lua (req:defer(), pending:send()):
-- a long poll answered by another request's handler, the deadline (504), a client that leaves,
-- an unsent pending collected or closed (500), and the misuse of every call: defer twice,
-- outside its handler, bad timeouts, a handler that defers and still returns an answer, an
-- invalid answer (500 to the client, the error to the caller), send twice.
local shmipc = require "shmipc"
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."

local has_socket, socket = pcall(require, "socket")
if not has_socket then
    print("# skip test_server_pending.lua: lua-socket is not installed (apt-get install lua-socket)")
    return { skipped_without_lua_socket = function() end }
end
local client = dofile(here .. "/server_support.lua")
local parse, fetch, request_text = client.parse, client.fetch, client.request_text

local tests = {}

local function new_server(opts)
    local errors = {}
    opts = opts or {}
    opts.port = 0
    opts.workers = opts.workers or 2
    opts.on_error = function(msg)
        errors[#errors + 1] = msg
    end
    return assert(shmipc.server(opts)), errors
end

-- A raw connection with one request sent; its response is read later.
local function open(port, path)
    local c = assert(socket.tcp())
    c:settimeout(5)
    assert(c:connect("127.0.0.1", port))
    assert(c:send(request_text("GET", path)))
    return c
end

-- Lets the workers run Lua handlers until cond() holds (or 5 s).
local function until_(cond)
    local deadline = shmipc.monotime() + 5
    while not cond() do
        assert(shmipc.monotime() < deadline, "not in time")
        shmipc.poll({}, 0.01)
    end
end

function tests.long_poll_answered_by_another_handler(t)
    local srv <close> = new_server()
    local held = {}
    assert(srv:route("GET", "/wait", function(req)
        local p = req:defer()
        t.eq(p:waiting(), true, "waiting")
        t.eq(p:reason(), nil, "no reason yet")
        held[#held + 1] = p
    end))
    assert(srv:route("GET", "/publish", function(req)
        local p = table.remove(held)
        if not p then
            return 409, "nobody waits"
        end
        return p:send(201, "hello " .. req.query, { ["X-Kind"] = "published" }) and "published" or "gone"
    end))
    assert(srv:start())
    local port = srv:port()
    local c = open(port, "/wait")
    local r
    until_(function()
        r = fetch(port, "GET", "/publish?a=1")
        return r.status == 200
    end)
    t.eq(r.body, "published", "the publisher's answer")
    local got = parse(assert(c:receive("*a")))[1]
    c:close()
    t.eq(got.status, 201, "status")
    t.eq(got.body, "hello a=1", "body")
    t.eq(got.headers["x-kind"], "published", "header")
end

function tests.deadline_and_client_gone(t)
    local srv <close> = new_server()
    local held = {}
    assert(srv:route("GET", "/short", function(req)
        held.short = req:defer(0.2)
    end))
    assert(srv:route("GET", "/hold", function(req)
        held.hold = req:defer()
    end))
    assert(srv:start())
    local port = srv:port()
    local t0 = shmipc.monotime()
    t.eq(fetch(port, "GET", "/short").status, 504, "504 at the deadline")
    t.truthy(shmipc.monotime() - t0 >= 0.19, "not before it")
    until_(function()
        return held.short and held.short:reason() == "timeout"
    end)
    t.eq(held.short:send(200, "late"), false, "refused after the deadline")
    local c = open(port, "/hold")
    until_(function()
        return held.hold ~= nil
    end)
    c:close()
    until_(function()
        return held.hold:reason() == "client_gone"
    end)
    t.eq(held.hold:waiting(), false, "not waiting")
    t.eq(held.hold:send(200, "late"), false, "refused after the client left")
    t.raises("sent or closed already", held.hold.send, held.hold, 200, "twice")
end

function tests.unsent_is_500(t)
    local srv <close> = new_server()
    local closed
    assert(srv:route("GET", "/drop", function(req)
        req:defer() -- collected unsent
        collectgarbage("collect")
    end))
    assert(srv:route("GET", "/close", function(req)
        closed = req:defer()
        closed:close()
        closed:close() -- twice is nothing
    end))
    assert(srv:route("GET", "/scope", function(req)
        local p <close> = req:defer() -- closed at the end of its scope
    end))
    assert(srv:start())
    local port = srv:port()
    t.eq(fetch(port, "GET", "/drop").status, 500, "collected unsent")
    t.eq(fetch(port, "GET", "/close").status, 500, "closed")
    t.eq(fetch(port, "GET", "/scope").status, 500, "to-be-closed")
    until_(function()
        return closed:reason() == "abandoned"
    end)
    t.raises("sent or closed already", closed.send, closed, 200, "x")
    t.truthy(tostring(closed):find("abandoned", 1, true), tostring(closed))
end

function tests.misuse(t)
    local srv <close>, errors = new_server()
    local kept, failed
    assert(srv:route("GET", "/twice", function(req)
        local p = req:defer()
        t.raises("deferred already", req.defer, req)
        return p:send("ok") and nil
    end))
    assert(srv:route("GET", "/timeouts", function(req)
        for _, bad in ipairs({ 0, -1, 3601, 0 / 0 }) do
            t.raises("timeout", req.defer, req, bad)
        end
        t.raises("number expected", req.defer, req, "soon")
        kept = req
        return "fine"
    end))
    assert(srv:route("GET", "/returns", function(req)
        failed = req:defer()
        return 200, "an answer it can no longer give"
    end))
    assert(srv:route("GET", "/invalid", function(req)
        local p = req:defer()
        local ok, err = pcall(p.send, p, 99, "x")
        t.eq(ok, false, "status 99 refused")
        t.truthy(tostring(err):find("status", 1, true), tostring(err))
        t.raises("sent or closed already", p.send, p, 200, "x")
    end))
    assert(srv:route("GET", "/header", function(req)
        local p = req:defer()
        t.raises("header", p.send, p, 200, "x", { ["X"] = "a\r\nInjected: 1" })
    end))
    assert(srv:start())
    local port = srv:port()
    t.eq(fetch(port, "GET", "/twice").body, "ok", "one answer")
    t.eq(fetch(port, "GET", "/timeouts").body, "fine", "bad timeouts refused")
    t.raises("after its handler returned", function()
        return kept:defer()
    end)
    t.eq(fetch(port, "GET", "/returns").status, 500, "a deferred handler that returns an answer")
    until_(function()
        return failed:reason() == "failed"
    end)
    t.eq(failed:send(200, "x"), false, "refused: the handler failed")
    t.truthy(errors[1]:find("returns nothing", 1, true), errors[1])
    t.eq(fetch(port, "GET", "/invalid").status, 500, "an invalid answer is a 500")
    t.eq(fetch(port, "GET", "/header").status, 500, "an invalid header is a 500")
end

-- A handler that raises: whether it had deferred was read from its request's userdata after
-- the error was logged, and the log's on_error can collect that userdata (a read after free:
-- memory reused there made a plain error a bare 500 and a closed connection).
function tests.error_logged_with_a_collection_is_the_handlers_500(t)
    local keep = {}
    local srv <close> = assert(shmipc.server({
        port = 0,
        workers = 1,
        on_error = function()
            collectgarbage("collect")
            for i = 1, 2000 do -- reuse the freed blocks, non-zero bytes everywhere
                keep[i] = string.format("%07d", i) .. string.rep("x", 24)
            end
        end,
    }))
    assert(srv:route("GET", "/err", function()
        error("boom")
    end))
    assert(srv:start())
    for i = 1, 5 do
        local r = fetch(srv:port(), "GET", "/err")
        t.eq(r.status, 500, "status " .. i)
        t.eq(r.body, "internal server error\n", "the handler error's own 500, " .. i)
    end
end

return tests
