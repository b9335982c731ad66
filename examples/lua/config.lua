-- Run: LUA_CPATH='build/lua/?.so;;' lua5.4 examples/lua/config.lua   (from the source tree)
--
-- config.lua: builds a shmipc config by chaining setters, prints its settings, and shows how a
-- refused value comes back: nil, a message naming the field, and a negative error code.
local shmipc = require "shmipc"

print("shmipc " .. shmipc.version())

-- shmipc.config{...} applies options by the setters' names; <close> frees the config at the end
-- of the scope. Setters return the config, so they chain. These values are known to be good;
-- wrap a setter in assert() when its value comes from outside, so a refusal raises its message.
local cfg <close> = assert(shmipc.config{ path_prefix = "/dev/shm/example" })
cfg:buffer_capacity(8 << 20)
   :slice_classes({ { 4096, 60 }, { 65536, 40 } })
   :queue_capacity(1024)
   :with_v4_event_queue_polling(200)
   :read_timeout(2.5) -- seconds; nil or negative waits forever, 0 does not wait
assert(cfg:validate())

print("buffer_capacity", cfg:buffer_capacity())
print("queue_capacity", cfg:queue_capacity())
for i, class in ipairs(cfg:slice_classes()) do
    print(string.format("slice class %d", i), string.format("%d bytes, %d%%", class.size, class.percent))
end
print("memmap", cfg:memmap())
print("path_prefix", cfg:path_prefix())
print("protocol", cfg:protocol()) -- name, fallback
print("wakeup", cfg:wakeup())     -- name, polling interval in microseconds
print("initialize_timeout", cfg:initialize_timeout())
print("read_timeout", cfg:read_timeout())

-- A refused value leaves the config unchanged and returns nil, message, code.
local ok, msg, code = cfg:queue_capacity(24)
print("queue_capacity(24)", ok, msg, code, shmipc.errname(code))
print("queue_capacity still", cfg:queue_capacity())
