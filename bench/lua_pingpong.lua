-- Run: LUA_CPATH='build/lua/?.so;;' lua5.4 bench/lua_pingpong.lua [--seconds S] [--rounds N]
--          [--sizes 64,1024,...] [--no-warmup] [--out PREFIX] [--trips N]
--      (from the source tree, after `ninja -C build`; the unix-socket side needs Debian's
--      lua-socket: apt-get install lua-socket)
--
-- lua_pingpong.lua: a Lua ping-pong benchmark, shmipc (V3, and V4 with eventfd wakeups when
-- the library negotiates it) against a unix socket through lua-socket, in the same run. For
-- each size a client sends a message (a 4-byte big-endian length and the payload) and waits
-- for the payload to come back from an echo peer, which is a second lua5.4 process running
-- this script with --peer. Every transport sees the same Lua work: one string written, the
-- echo read as one string by the client; the peer reads the payload and writes it back. It
-- prints round trips per second and the shmipc/socket ratios as a Markdown table. It
-- measures, never judges: every echo is checked for its length and the last one of each
-- measurement byte for byte. With --out PREFIX it also writes the table to PREFIX.md and every
-- round's figure, the medians and the conditions of the run to PREFIX.json
-- (bench/results/bench-lua is where the documented run lives). With --trips N it times exactly
-- N round trips per size and transport instead, and prints the microseconds per round trip and
-- the context switches per round trip of the client and (over its whole life) of the peer,
-- from /proc/self/status: whether a waiting reader slept or was preempted.
local shmipc = require "shmipc"

local function usage(msg)
    io.stderr:write("lua_pingpong: " .. msg .. "\n")
    os.exit(2)
end

local opts = { seconds = 0.5, rounds = 3,
    sizes = { 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304 } }
local peer_kind, peer_address
do
    local i = 1
    while i <= #arg do
        local a = arg[i]
        if a == "--seconds" then
            opts.seconds = tonumber(arg[i + 1]) or usage("--seconds takes a number")
            i = i + 2
        elseif a == "--rounds" then
            opts.rounds = math.tointeger(tonumber(arg[i + 1])) or usage("--rounds takes an integer")
            i = i + 2
        elseif a == "--sizes" then
            opts.sizes = {}
            for n in (arg[i + 1] or ""):gmatch("%d+") do
                opts.sizes[#opts.sizes + 1] = tonumber(n)
            end
            i = i + 2
        elseif a == "--out" then
            opts.out = arg[i + 1] or usage("--out takes a path prefix")
            i = i + 2
        elseif a == "--trips" then
            opts.trips = math.tointeger(tonumber(arg[i + 1])) or usage("--trips takes an integer")
            i = i + 2
        elseif a == "--no-warmup" then
            opts.no_warmup = true
            i = i + 1
        elseif a == "--peer" then
            peer_kind, peer_address = arg[i + 1], arg[i + 2]
            i = i + 3
        else
            usage("unknown argument " .. a)
        end
    end
end

-- ---------------------------------------------------------------------------------------
-- The echo peers. Each prints "ready" once it listens, then echoes until a length of 0.
-- ---------------------------------------------------------------------------------------

-- switches() -> voluntary, involuntary context switches of this process so far.
local function switches()
    local f = assert(io.open("/proc/self/status"))
    local text = f:read("a")
    f:close()
    return tonumber(text:match("\nvoluntary_ctxt_switches:%s*(%d+)")),
        tonumber(text:match("\nnonvoluntary_ctxt_switches:%s*(%d+)"))
end

local function ready()
    io.stdout:write("ready\n")
    io.stdout:flush()
end

local function shmipc_peer(address)
    local l <close> = assert(shmipc.listen(address))
    ready()
    local s <close> = assert(l:accept(30))
    local st <close> = assert(s:accept_stream(30))
    while true do
        local n = string.unpack(">I4", assert(st:read(4)))
        if n == 0 then
            break
        end
        -- Write back each piece as it comes: one copy out of and one into shared memory.
        while n > 0 do
            local chunk = assert(st:read_chunk(n))
            assert(st:write(chunk))
            n = n - #chunk
        end
        assert(st:flush())
    end
end

local function socket_peer(path)
    local unix = require "socket.unix"
    local server = assert(unix.stream())
    os.remove(path)
    assert(server:bind(path))
    assert(server:listen(1))
    ready()
    local c = assert(server:accept())
    server:close()
    os.remove(path)
    while true do
        local n = string.unpack(">I4", assert(c:receive(4)))
        if n == 0 then
            break
        end
        assert(c:send(assert(c:receive(n))))
    end
    c:close()
end

if peer_kind == "shmipc" or peer_kind == "socket" then
    if peer_kind == "shmipc" then
        shmipc_peer(peer_address)
    else
        socket_peer(peer_address)
    end
    io.stdout:write(string.format("switches %d %d\n", switches()))
    return
elseif peer_kind ~= nil then
    usage("unknown peer " .. peer_kind)
end

-- ---------------------------------------------------------------------------------------
-- The client.
-- ---------------------------------------------------------------------------------------

local interpreter = arg[-1] or "lua5.4"
local script = arg[0]

local function quote(s)
    return "'" .. s:gsub("'", "'\\''") .. "'"
end

local function start_peer(kind, address)
    local p = assert(io.popen(string.format("exec %s %s --peer %s %s", quote(interpreter), quote(script),
        kind, quote(address))))
    local line = p:read("l")
    if line ~= "ready" then
        usage(kind .. " peer did not start: " .. tostring(line))
    end
    return p
end

-- A transport: send(msg) then recv(n) -> string; close() ends the peer.
local function shmipc_transport(address, config, label)
    local p = start_peer("shmipc", address)
    local s = assert(shmipc.connect(address, config))
    local st = assert(s:open_stream())
    return {
        name = string.format("shmipc V%d%s", s:version(), s:version() == 4 and label or ""),
        version = s:version(),
        send = function(msg)
            assert(st:write(msg))
            assert(st:flush())
        end,
        recv = function(n)
            return assert(st:read(n))
        end,
        close = function(self)
            assert(st:write(string.pack(">I4", 0)):flush())
            self.peer_switches = p:read("l")
            assert(p:close())
            st:close()
            s:close()
        end,
    }
end

-- Uses every slice of the session's buffer once, all of it, before anything is timed. The free
-- lists are FIFO, so a new session hands out never-touched memory for a long while, and the
-- first touch of a shared page is slow (very slow on a VM); a size that reaches into the
-- second page of its slices would otherwise pay for it in its measurement. As shmipc-bench.
local function warm_up(tr)
    local cfg = shmipc.config()
    local capacity = cfg:buffer_capacity()
    for _, class in ipairs(cfg:slice_classes()) do
        local slices = capacity * class.percent // 100 // class.size
        local payload = string.rep("w", class.size - 64)
        local msg = string.pack(">I4", #payload) .. payload
        -- A round trip takes a slice each way; go round the list a little more than once.
        for _ = 1, slices // 2 + 16 do
            tr.send(msg)
            assert(#tr.recv(#payload) == #payload)
        end
    end
end

local function socket_transport(path)
    local p = start_peer("socket", path)
    local unix = require "socket.unix"
    local c = assert(unix.stream())
    assert(c:connect(path))
    return {
        name = "lua-socket unix",
        send = function(msg)
            assert(c:send(msg))
        end,
        recv = function(n)
            return assert(c:receive(n))
        end,
        close = function(self)
            assert(c:send(string.pack(">I4", 0)))
            self.peer_switches = p:read("l")
            assert(p:close())
            c:close()
        end,
    }
end

-- Round trips per second at `size`, for at least opts.seconds.
local function measure(tr, size)
    local payload = string.rep("x", size - 1) .. "!"
    local msg = string.pack(">I4", size) .. payload
    for _ = 1, 20 do
        tr.send(msg)
        assert(tr.recv(size) == payload)
    end
    local rounds, t0 = 0, shmipc.monotime()
    local deadline = t0 + opts.seconds
    local now = t0
    while now < deadline do
        for _ = 1, 8 do
            tr.send(msg)
            local echo = tr.recv(size)
            if #echo ~= size then
                error("short echo")
            end
        end
        rounds = rounds + 8
        now = shmipc.monotime()
    end
    -- The last echo is compared in full; the others by length (comparing costs a pass too).
    tr.send(msg)
    assert(tr.recv(size) == payload, "echo differs")
    return rounds / (now - t0)
end

local function human(n)
    if n >= 1 << 20 and n % (1 << 20) == 0 then
        return string.format("%d MiB", n >> 20)
    elseif n >= 1024 and n % 1024 == 0 then
        return string.format("%d KiB", n >> 10)
    end
    return string.format("%d B", n)
end

local function loadavg()
    local f = io.open("/proc/loadavg")
    local load = f and f:read("l"):match("^(%S+ %S+ %S+)") or "?"
    if f then
        f:close()
    end
    return load
end
local load_start = loadavg()
local t_start = shmipc.monotime()

local tag = string.format("%d-%d", os.time(), math.random(1 << 30))
-- shmipc as the reference implementations default (V3 over memfd), and V4 with eventfd
-- wakeups when the library negotiates it; then the socket, the baseline of the ratios.
local transports = { shmipc_transport("unix:@shmipc-lua-pingpong-" .. tag) }
local v4 = shmipc_transport("unix:@shmipc-lua-pingpong-v4-" .. tag, { with_v4_eventfd = true }, " eventfd")
if v4.version == 4 then
    transports[#transports + 1] = v4
else
    v4:close()
end
if not opts.no_warmup then
    for _, tr in ipairs(transports) do
        warm_up(tr)
    end
end
local socket
if pcall(require, "socket.unix") then
    socket = socket_transport("/tmp/shmipc-lua-pingpong-" .. tag .. ".sock")
    transports[#transports + 1] = socket
else
    io.stderr:write("lua_pingpong: lua-socket is not installed (apt-get install lua-socket); "
        .. "measuring shmipc only\n")
end

if opts.trips then
    -- Exactly N round trips per size and transport: time and context switches per round trip.
    local payloads = {}
    print("transport | size | us per round trip | client voluntary / rt | client involuntary / rt")
    local trips = {}
    for _, size in ipairs(opts.sizes) do
        payloads[size] = string.pack(">I4", size) .. string.rep("x", size)
        for i, tr in ipairs(transports) do
            local v0, i0 = switches()
            local t0 = shmipc.monotime()
            for _ = 1, opts.trips do
                tr.send(payloads[size])
                assert(#tr.recv(size) == size)
            end
            local t1 = shmipc.monotime()
            local v1, i1 = switches()
            trips[i] = (trips[i] or 0) + opts.trips
            print(string.format("%s | %d | %.1f | %.2f | %.2f", tr.name, size, (t1 - t0) / opts.trips * 1e6,
                (v1 - v0) / opts.trips, (i1 - i0) / opts.trips))
        end
    end
    for i, tr in ipairs(transports) do
        tr:close()
        local v, inv = tr.peer_switches:match("switches (%d+) (%d+)")
        print(string.format("%s peer: %s voluntary, %s involuntary switches in its life (%d timed round trips"
            .. "%s)", tr.name, v, inv, trips[i], opts.no_warmup and "" or " and the warm-up"))
    end
    print("load average " .. loadavg())
    return
end

-- Rounds interleave the transports size by size, so a busy moment of the machine hits all;
-- each figure is the median of its rounds.
local results = {}
for i = 1, #transports do
    results[i] = {}
end
for _, size in ipairs(opts.sizes) do
    for i = 1, #transports do
        results[i][size] = {}
    end
    for _ = 1, opts.rounds do
        for i, tr in ipairs(transports) do
            local r = results[i][size]
            r[#r + 1] = measure(tr, size)
        end
    end
end
for _, tr in ipairs(transports) do
    tr:close()
end

local function median(v)
    table.sort(v)
    local n = #v
    return n % 2 == 1 and v[(n + 1) // 2] or (v[n // 2] + v[n // 2 + 1]) / 2
end

local load = loadavg()
local lines = {}
local function out(line)
    lines[#lines + 1] = line
    print(line)
end
out(string.format("Lua %s ping-pong, round trips per second; shmipc %s; median of %d rounds of %.2f s "
    .. "per size; load average %s at the start, %s at the end", _VERSION:match("%d.*"), shmipc.version(),
    opts.rounds, opts.seconds, load_start, load))
out("")
local head, rule = { "size" }, { "---:" }
for _, tr in ipairs(transports) do
    head[#head + 1] = tr.name
    rule[#rule + 1] = "---:"
end
for _, tr in ipairs(transports) do
    if socket and tr ~= socket then
        head[#head + 1] = tr.name .. " / socket"
        rule[#rule + 1] = "---:"
    end
end
out("| " .. table.concat(head, " | ") .. " |")
out("|" .. table.concat(rule, "|") .. "|")
local medians = {}
for _, size in ipairs(opts.sizes) do
    local row, m = { human(size) }, {}
    for i = 1, #transports do
        m[i] = median(results[i][size])
        row[#row + 1] = string.format("%.0f", m[i])
    end
    medians[size] = m
    for i, tr in ipairs(transports) do
        if socket and tr ~= socket then
            row[#row + 1] = string.format("%.2fx", m[i] / m[#transports])
        end
    end
    out("| " .. table.concat(row, " | ") .. " |")
end

-- The JSON record: hand-written, the values are numbers and plain strings.
local function json_string(s)
    return '"' .. s:gsub('[%c"\\]', function(c)
        return string.format("\\u%04x", c:byte())
    end) .. '"'
end

local function json_numbers(v)
    local parts = {}
    for i, x in ipairs(v) do
        parts[i] = string.format("%.1f", x)
    end
    return "[" .. table.concat(parts, ", ") .. "]"
end

if opts.out then
    local md = assert(io.open(opts.out .. ".md", "w"))
    md:write(table.concat(lines, "\n"), "\n")
    md:close()
    local j = {}
    j[#j + 1] = "{"
    j[#j + 1] = string.format('  "benchmark": "bench/lua_pingpong.lua",')
    j[#j + 1] = string.format('  "command": %s,', json_string("lua5.4 bench/lua_pingpong.lua " .. table.concat(arg, " ")))
    j[#j + 1] = string.format('  "lua": %s, "shmipc": %s,', json_string(_VERSION), json_string(shmipc.version()))
    j[#j + 1] = string.format('  "shmipc_spin_us": %s,', json_string(os.getenv("SHMIPC_SPIN_US") or "default"))
    j[#j + 1] = string.format('  "seconds_per_round": %g, "rounds": %d, "warmup": %s,', opts.seconds, opts.rounds,
        tostring(not opts.no_warmup))
    j[#j + 1] = string.format('  "loadavg_start": %s, "loadavg_end": %s, "wall_seconds": %.1f,', json_string(load_start),
        json_string(load), shmipc.monotime() - t_start)
    j[#j + 1] = '  "unit": "round trips per second",'
    j[#j + 1] = '  "transports": ['
    for i, tr in ipairs(transports) do
        local sizes = {}
        for k, size in ipairs(opts.sizes) do
            sizes[k] = string.format('      {"size": %d, "median": %.1f, "rounds": %s%s}', size, medians[size][i],
                json_numbers(results[i][size]), (socket and tr ~= socket)
                and string.format(', "ratio_to_socket": %.3f', medians[size][i] / medians[size][#transports]) or "")
        end
        j[#j + 1] = string.format('    {"name": %s, "results": [\n%s\n    ]}%s', json_string(tr.name),
            table.concat(sizes, ",\n"), i < #transports and "," or "")
    end
    j[#j + 1] = "  ]"
    j[#j + 1] = "}"
    local f = assert(io.open(opts.out .. ".json", "w"))
    f:write(table.concat(j, "\n"), "\n")
    f:close()
end
