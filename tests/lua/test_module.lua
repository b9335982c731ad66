-- Description: the module as a shared object: found on LUA_CPATH, linked against libshmipc
-- and never against liblua (the interpreter that loads it provides the Lua API).
local shmipc = require "shmipc"

local tests = {}

local function module_path()
    local path, err = package.searchpath("shmipc", package.cpath)
    assert(path, err)
    return path
end

function tests.needed_libraries(t)
    local f = assert(io.popen("readelf -d '" .. module_path() .. "'"))
    local out = f:read("a")
    f:close()
    local needed = {}
    for lib in out:gmatch("%(NEEDED%)%s+Shared library: %[([^%]]+)%]") do
        needed[#needed + 1] = lib
    end
    local joined = table.concat(needed, " ")
    if os.getenv("SHMIPC_TEST_INSTALLED") == "1" and not joined:find("libshmipc", 1, true) then
        -- The luarocks build (shmipc-*.rockspec) compiles the library into the module.
        local nm = assert(io.popen("nm -D --defined-only '" .. module_path() .. "'"))
        t.truthy(nm:read("a"):find(" T luaopen_shmipc\n", 1, true), "exports luaopen_shmipc")
        nm:close()
    else
        t.truthy(joined:find("libshmipc.so.0", 1, true), "links libshmipc.so.0: " .. joined)
    end
    t.truthy(not joined:find("liblua", 1, true), "does not link liblua: " .. joined)
end

function tests.loaded_once(t)
    t.eq(require "shmipc", shmipc, "require returns the same table")
    t.eq(package.loaded.shmipc, shmipc, "package.loaded")
end

return tests
