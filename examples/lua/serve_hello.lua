-- serve_hello.lua - a Lua handler for shmipc-serve (docs/serve.md, "The Lua worker"):
--
--   shmipc-serve --lua serve_hello --workers 2        (run where serve_hello.lua is, or --chdir)
--
-- The module returns the handler: function(req) returning status, headers, body. GET / says
-- hello; a request with a body gets it back. The other paths show the failure mapping, and the
-- tests (tests/python/test_serve_native_worker.py) use them, as they do the C example's.
-- A WebSocket upgrade to /ws is accepted and every message echoed; any other upgrade is a 403.
local function handler(req)
  if req.websocket then
    if req.path ~= "/ws" then return 403, {}, "" end
    local ws = req:accept_websocket()
    while true do
      local data, typ = ws:recv_frame()
      if typ == "close" or not data then return end  -- the client closed, or went away
      local ok
      if typ == "text" then ok = ws:send_text(data) else ok = ws:send_binary(data) end
      if not ok then return end
    end
  end
  if req.has_body then
    return 200, {["Content-Type"] = "application/octet-stream"}, req.body
  end
  local path, q = req.path, req.query
  if path == "/" then
    return 200, {["Content-Type"] = "text/plain"}, "Hello, world!\n"
  elseif path == "/big" then
    -- a body as a function: called until it returns nil, each piece a BODY frame
    local left, piece = tonumber(q), string.rep("abcdefghijklmnopqrstuvwxyz", 3847):sub(1, 100000)
    return 200, {}, function()
      if left <= 0 then return nil end
      local n = math.min(left, #piece)
      left = left - n
      return piece:sub(1, n)
    end
  elseif path == "/fail" then
    error("failing before the head")
  elseif path == "/fail-after" then
    local sent = false
    return 200, {{"Content-Length", "100"}}, function()
      if sent then error("failing after the head") end
      sent = true
      return "partial"
    end
  elseif path == "/short" then
    local once = "abc"
    return 200, {["Content-Length"] = "10"}, function() local s = once; once = nil; return s end
  elseif path == "/long" then
    local once = "abc"
    return 200, {["Content-Length"] = "2"}, function() local s = once; once = nil; return s end
  elseif path == "/nothing" then
    return nil
  elseif path == "/204" then
    return 204, {}, nil
  elseif path == "/slow" then
    -- Sleeps q milliseconds in a child it waits for with io.popen's close. Not os.execute:
    -- its system() ignores SIGINT and SIGQUIT in the worker until the child ends, so a stop
    -- signal sent to the worker then was lost and the worker served on. Waited for here, the
    -- signal reaches the worker's handler, which stops it after this request. The child
    -- ignores the two itself: a terminal's Ctrl-C or Ctrl-\ goes to the whole group, and a
    -- sleep killed by SIGQUIT could leave a core file.
    local sleep = io.popen(string.format("trap '' INT QUIT; exec sleep %.3f", tonumber(q) / 1000))
    sleep:close()
    local f = io.open("/proc/self/stat")
    local pid = f:read("n")
    f:close()
    return 200, {}, tostring(pid) .. "\n"
  elseif path == "/crash" then
    os.execute("kill -9 " .. io.open("/proc/self/stat"):read("n"))
  elseif path == "/headers" then
    local names = {}
    for k in pairs(req.headers) do names[#names + 1] = k end
    table.sort(names)
    local out = {}
    for _, k in ipairs(names) do out[#out + 1] = k .. ": " .. req.headers[k] .. "\n" end
    return 200, {{"X-Peer", tostring(req.peer)}, {"X-Method", req.method},
                 {"X-Query", req.query}}, table.concat(out)
  end
  return 404, {["Content-Type"] = "text/plain"}, "not found\n"
end

return handler
