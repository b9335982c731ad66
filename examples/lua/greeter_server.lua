-- Run: LUA_CPATH='build/lua/?.so;;' lua5.4 examples/lua/greeter_server.lua [ADDRESS [SESSIONS]]
--      (from the source tree; default unix:/tmp/shmipc_greeter.sock, 1 session; then run
--      build/examples/c/greeter_client or greeter_client.lua against it)
--
-- greeter_server.lua: the shmipc-go helloworld server in Lua. It accepts a client, reads
-- "client say hello world!!!" from its first stream and answers "server hello world!!!".
-- Go's greeter_client and the C and Lua ones all work with it, over V2 or V3.
local shmipc = require "shmipc"

local REQUEST = "client say hello world!!!"
local REPLY = "server hello world!!!"

local address = arg[1] or "unix:/tmp/shmipc_greeter.sock"
local sessions = tonumber(arg[2] or "1")

local function serve(s)
    local st <close> = assert(s:accept_stream(5)) -- seconds
    local request = assert(st:read(#REQUEST))
    print("server receive request message:" .. request)
    assert(st:write(REPLY))
    assert(st:flush())
    print("server reply response: " .. REPLY)
    -- Wait for the client to hang up before closing, so the reply is surely read: reads
    -- return nil, message, code at the end of the stream.
    while st:read_chunk() do
    end
end

local l <close> = assert(shmipc.listen(address))
print("greeter_server: listening on " .. address)
io.stdout:flush()
for _ = 1, sessions do
    local s <close> = assert(l:accept(30))
    print(string.format("greeter_server: session with protocol V%d", s:version()))
    serve(s)
    io.stdout:flush()
end
