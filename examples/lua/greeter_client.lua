-- Run: LUA_CPATH='build/lua/?.so;;' lua5.4 examples/lua/greeter_client.lua [ADDRESS [v2|v3]]
--      (from the source tree; a greeter server must listen on ADDRESS, default
--      unix:/tmp/shmipc_greeter.sock: build/examples/c/greeter_server or greeter_server.lua)
--
-- greeter_client.lua: the shmipc-go helloworld client in Lua. It sends
-- "client say hello world!!!" and reads "server hello world!!!", over V3 (memfd) or V2
-- (/dev/shm files). It works with Go's greeter_server and with the C and Lua ones.
local shmipc = require "shmipc"

local REQUEST = "client say hello world!!!"
local REPLY = "server hello world!!!"

local address = arg[1] or "unix:/tmp/shmipc_greeter.sock"
local v2 = arg[2] == "v2"

-- Runtime failures come back as nil, message, code; assert() raises the message.
local s <close> = assert(shmipc.connect(address, {
    path_prefix = "/dev/shm/client.ipc.shm",
    memmap = v2 and "devshm" or "memfd",
    read_timeout = 5, -- seconds
}))
local st <close> = assert(s:open_stream())
print(string.format("client stream send request:%s (protocol V%d)", REQUEST, s:version()))
-- write copies into shared memory; flush sends it as one message.
assert(st:write(REQUEST))
assert(st:flush())
-- A stream is a byte stream: read exactly the reply's length, as the Go client does.
local reply = assert(st:read(#REPLY))
print("client stream receive response " .. reply)
if reply ~= REPLY then
    error("unexpected reply " .. string.format("%q", reply))
end
-- <close> closes the stream, then the session, when the chunk ends.
