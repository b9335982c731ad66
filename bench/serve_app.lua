-- The Lua app of bench/serve_bench.py (shmipc-serve --lua serve_app): the response of
-- serve_app.py, GET / answering SERVE_BENCH_BODY bytes (13: "Hello, World!"; otherwise that
-- many bytes) with Content-Type text/plain and Content-Length.
local n = tonumber(os.getenv("SERVE_BENCH_BODY") or "13")
local body
if n == 13 then
  body = "Hello, World!"
else
  body = string.rep("0123456789abcdef", n // 16 + 1):sub(1, n)
end
local headers = {["Content-Type"] = "text/plain", ["Content-Length"] = tostring(#body)}

return function(req)
  return 200, headers, body
end
