-- Run: LUA_CPATH='build/lua/?.so;;' lua5.4 examples/lua/http_app.lua [PORT [WORKERS [BACKEND]]]
--      (from the source tree; PORT 8080 by default, 0 for any; BACKEND auto, io_uring, epoll)
--      curl -i http://127.0.0.1:8080/ ; curl -d 'milk' http://127.0.0.1:8080/items ;
--      curl http://127.0.0.1:8080/items/1 ; curl -X POST http://127.0.0.1:8080/shutdown
--
-- http_app.lua: a small HTTP application on shmipc.server. GET / is a static page served in
-- C (no Lua runs for it); /items is a to-do list kept in a Lua table by handlers, which the
-- server calls one at a time, so the table needs no lock even with several worker threads.
-- A handler that raises gets a 500 and the server goes on (GET /items/oops shows it).
-- POST /shutdown stops the server from a handler; run() then returns. So do SIGINT (Ctrl-C)
-- and SIGTERM, through run{signals = true}: requests in flight are answered first (GET
-- /slow?ms=N takes N ms, at most 5000, to show it), and the script ends with status 0.
local shmipc = require "shmipc"

local port = tonumber(arg[1] or "8080")
local workers = tonumber(arg[2] or "0")
local backend = arg[3] or "default"

local srv <close> = assert(shmipc.server {
    port = port,
    workers = workers,
    backend = backend,
    server_name = "http_app.lua",
    on_error = function(msg)
        io.stderr:write("http_app: ", msg:match("^[^\n]*"), "\n")
    end,
})

assert(srv:static("/", "<h1>shmipc from Lua</h1>\n", "text/html"))

local items, next_id = {}, 1

-- A list as text, one "id: text" per line, sorted by id.
local function listing()
    local ids = {}
    for id in pairs(items) do
        ids[#ids + 1] = id
    end
    table.sort(ids)
    local lines = {}
    for i, id in ipairs(ids) do
        lines[i] = id .. ": " .. items[id] .. "\n"
    end
    return table.concat(lines)
end

assert(srv:route("GET", "/items", function(req)
    return 200, listing(), "text/plain"
end))

assert(srv:route("POST", "/items", function(req)
    if req.body == "" then
        return 400, "empty item\n", "text/plain"
    end
    local id = next_id
    next_id = next_id + 1
    items[id] = req.body
    return { status = 201, body = id .. "\n", headers = { Location = "/items/" .. id } }
end))

assert(srv:route(nil, "/items/*", function(req)
    if req.wildcard == "oops" then
        error("a bug in a handler")
    end
    local id = math.tointeger(tonumber(req.wildcard))
    if not id or not items[id] then
        return 404, "no such item\n", "text/plain"
    end
    if req.method == "DELETE" then
        items[id] = nil
        return -- 204 No Content
    elseif req.method == "GET" then
        return 200, items[id] .. "\n", "text/plain"
    end
    return 405, "GET or DELETE\n", { ["Content-Type"] = "text/plain", Allow = "GET, DELETE" }
end))

-- A handler that takes long (computing, say). It holds this Lua state meanwhile, so other Lua
-- handlers wait; a stop lets it finish and answers it before the server closes.
assert(srv:route("GET", "/slow", function(req)
    local ms = math.min(tonumber((req.query or ""):match("ms=(%d+)")) or 200, 5000)
    print("http_app: /slow started")
    io.stdout:flush()
    local deadline = shmipc.monotime() + ms / 1000
    while shmipc.monotime() < deadline do
    end
    return 200, "slept " .. ms .. " ms\n", "text/plain"
end))

assert(srv:route("POST", "/shutdown", function()
    srv:stop()
    return "bye\n"
end))

assert(srv:start())
print(string.format("http_app: listening on 127.0.0.1:%d (%s)", srv:port(), srv:backend()))
io.stdout:flush()
local _, signal = assert(srv:run { signals = true })
print("http_app: stopped" .. (signal and " by " .. signal or "") .. " with " .. (next_id - 1) .. " items added")
