-- Description: HTTP and WebSocket clients for the server tests (test_server*.lua), over
-- lua-socket. Not a test file: the harness runs test_*.lua only. Every wait for the server
-- goes through shmipc.poll(), which lets the workers of a server started in this process call
-- its Lua handlers meanwhile; a blocking lua-socket call would hold them off.
local shmipc = require "shmipc"
local socket = require "socket"

local client = {}

-- ---------------------------------------------------------------------------------------
-- A small HTTP client.
-- ---------------------------------------------------------------------------------------

-- Splits raw bytes into responses: {status =, reason =, headers = {lower name = value}, body =}.
function client.parse(raw)
    local out, pos = {}, 1
    while pos <= #raw do
        local head_end = raw:find("\r\n\r\n", pos, true)
        assert(head_end, "incomplete head: " .. raw:sub(pos))
        local head = raw:sub(pos, head_end - 1)
        local status, reason = head:match("^HTTP/1%.%d (%d+) ([^\r]*)")
        assert(status, "bad status line: " .. head)
        local headers = {}
        for name, value in head:gmatch("\r\n([^:\r]+): ([^\r]*)") do
            name = name:lower()
            headers[name] = headers[name] and (headers[name] .. ", " .. value) or value
        end
        local len = tonumber(headers["content-length"] or "0")
        local body = raw:sub(head_end + 4, head_end + 3 + len)
        out[#out + 1] = { status = tonumber(status), reason = reason, headers = headers, body = body }
        pos = head_end + 4 + len
    end
    return out
end

-- Opens connections to `port`, sends each its text, and reads each to its end (the server
-- closes them: every request text ends with Connection: close). Waits in shmipc.poll(), so
-- the Lua handlers run meanwhile. Returns the raw bytes of each connection.
function client.exchange(port, texts, timeout)
    local conns, raw, open = {}, {}, 0
    for i, text in ipairs(texts) do
        local c = assert(socket.tcp())
        c:settimeout(5)
        assert(c:connect("127.0.0.1", port))
        assert(c:send(text))
        c:settimeout(0)
        conns[i], raw[i] = c, {}
        open = open + 1
    end
    local deadline = shmipc.monotime() + (timeout or 10)
    while open > 0 do
        local fds, progress = {}, false
        for i, c in pairs(conns) do
            local data, err, partial = c:receive(65536)
            local got = data or partial
            if got and #got > 0 then
                raw[i][#raw[i] + 1] = got
                progress = true
            end
            if err == "closed" then
                c:close()
                conns[i] = nil
                open = open - 1
            elseif err ~= nil and err ~= "timeout" then
                error("receive: " .. err)
            elseif err == "timeout" then
                fds[#fds + 1] = c:getfd()
            end
        end
        if open > 0 and not progress then
            assert(shmipc.monotime() < deadline, "no response in time")
            shmipc.poll(fds, 0.5)
        end
    end
    for i = 1, #texts do
        raw[i] = table.concat(raw[i])
    end
    return raw
end

function client.request_text(method, path, body, headers)
    local lines = { string.format("%s %s HTTP/1.1", method, path), "Host: test" }
    for name, value in pairs(headers or {}) do
        lines[#lines + 1] = name .. ": " .. value
    end
    if body then
        lines[#lines + 1] = "Content-Length: " .. #body
    end
    lines[#lines + 1] = "Connection: close"
    return table.concat(lines, "\r\n") .. "\r\n\r\n" .. (body or "")
end

-- One request on its own connection: the parsed response.
function client.fetch(port, method, path, body, headers)
    local raw = client.exchange(port, { client.request_text(method, path, body, headers) })[1]
    local r = client.parse(raw)
    assert(#r == 1, "want one response, got " .. #r .. ": " .. raw)
    return r[1]
end


-- ---------------------------------------------------------------------------------------
-- A WebSocket client (RFC 6455): masked frames out, plain frames in.
-- ---------------------------------------------------------------------------------------

local conn = {}
conn.__index = conn

-- connect(port) -> a buffered connection, non-blocking underneath.
function client.connect(port)
    local c = assert(socket.tcp())
    c:settimeout(5)
    assert(c:connect("127.0.0.1", port))
    c:settimeout(0)
    return setmetatable({ sock = c, buf = "", closed = false }, conn)
end

function conn:send(data)
    self.sock:settimeout(5)
    assert(self.sock:send(data))
    self.sock:settimeout(0)
end

-- Reads what is there into the buffer, waiting in shmipc.poll() when nothing is. Returns
-- false once the peer closed and nothing more will come.
function conn:fill(deadline)
    while true do
        local data, err, partial = self.sock:receive(65536)
        local got = data or partial
        if got and #got > 0 then
            self.buf = self.buf .. got
            return true
        end
        if err == "closed" then
            self.closed = true
            return false
        end
        assert(err == "timeout", err)
        assert(shmipc.monotime() < deadline, "timed out waiting for the server")
        shmipc.poll({ self.sock:getfd() }, 0.2)
    end
end

-- read(n) -> exactly n bytes, or nil when the connection ended first.
function conn:read(n, timeout)
    local deadline = shmipc.monotime() + (timeout or 10)
    while #self.buf < n do
        if not self:fill(deadline) then
            return nil
        end
    end
    local out = self.buf:sub(1, n)
    self.buf = self.buf:sub(n + 1)
    return out
end

-- read_head() -> the response head up to the blank line, or nil.
function conn:read_head(timeout)
    local deadline = shmipc.monotime() + (timeout or 10)
    while not self.buf:find("\r\n\r\n", 1, true) do
        if not self:fill(deadline) then
            return nil
        end
    end
    local e = self.buf:find("\r\n\r\n", 1, true)
    local head = self.buf:sub(1, e + 3)
    self.buf = self.buf:sub(e + 4)
    return head
end

function conn:close()
    self.sock:close()
end

local KEY = "dGhlIHNhbXBsZSBub25jZQ==" -- RFC 6455's example key
client.WS_ACCEPT = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" -- its accept value

-- ws_connect(port, path [, subprotocols [, extra headers]]) -> connection, status, head.
-- The connection is ready for frames when status is 101.
function client.ws_connect(port, path, protocols, extra)
    local c = client.connect(port)
    local lines = { "GET " .. path .. " HTTP/1.1", "Host: test", "Upgrade: websocket", "Connection: Upgrade",
        "Sec-WebSocket-Key: " .. KEY, "Sec-WebSocket-Version: 13" }
    if protocols then
        lines[#lines + 1] = "Sec-WebSocket-Protocol: " .. protocols
    end
    for _, h in ipairs(extra or {}) do
        lines[#lines + 1] = h
    end
    c:send(table.concat(lines, "\r\n") .. "\r\n\r\n")
    local head = assert(c:read_head(), "no handshake response")
    return c, tonumber(head:match("^HTTP/1%.1 (%d+)")), head
end

local OPCODES = { text = 1, binary = 2, close = 8, ping = 9, pong = 10 }
local NAMES = { [0] = "continuation", "text", "binary", [8] = "close", [9] = "ping", [10] = "pong" }

-- frame(kind, payload [, fin]) -> the bytes of one masked client frame.
function client.frame(kind, payload, fin)
    local op = OPCODES[kind] or kind
    local n = #payload
    local head
    if n < 126 then
        head = string.pack(">BB", (fin == false and 0 or 0x80) | op, 0x80 | n)
    elseif n < 65536 then
        head = string.pack(">BBI2", (fin == false and 0 or 0x80) | op, 0x80 | 126, n)
    else
        head = string.pack(">BBI8", (fin == false and 0 or 0x80) | op, 0x80 | 127, n)
    end
    local mask = { 0x12, 0x34, 0x56, 0x78 }
    local out = {}
    for i = 1, n, 4096 do
        local chunk = { payload:byte(i, math.min(i + 4095, n)) }
        for k = 1, #chunk do
            chunk[k] = chunk[k] ~ mask[((i + k - 2) % 4) + 1]
        end
        out[#out + 1] = string.char(table.unpack(chunk))
    end
    return head .. string.char(table.unpack(mask)) .. table.concat(out)
end

function conn:ws_send(kind, payload, fin)
    self:send(client.frame(kind, payload, fin))
end

-- ws_recv() -> kind ("text", "binary", "close", "ping", "pong"), payload; nil at the end.
-- Server frames are unmasked.
function conn:ws_recv(timeout)
    local h = self:read(2, timeout)
    if not h then
        return nil
    end
    local b0, b1 = h:byte(1, 2)
    assert(b1 & 0x80 == 0, "a masked frame from the server")
    local n = b1 & 0x7f
    if n == 126 then
        n = string.unpack(">I2", self:read(2, timeout))
    elseif n == 127 then
        n = string.unpack(">I8", self:read(8, timeout))
    end
    local payload = n > 0 and self:read(n, timeout) or ""
    return NAMES[b0 & 0x0f], payload, b0 & 0x80 ~= 0
end

return client
