-- Description: version and the error model: every code has a name and a message, unknown codes
-- have neither.
local shmipc = require "shmipc"

local tests = {}

function tests.version(t)
    t.eq(shmipc.version(), "0.1.0", "version()")
    t.eq(shmipc.version_number(), 100, "version_number()")
    t.eq(math.type(shmipc.version_number()), "integer", "version_number() type")
end

function tests.errors_table_covers_the_codes(t)
    local n = 0
    for name, code in pairs(shmipc.errors) do
        n = n + 1
        t.eq(type(name), "string", "key type")
        t.truthy(name:match("^E[A-Z]+$"), "name " .. name .. " is E + capitals")
        t.eq(math.type(code), "integer", name .. " type")
        t.truthy(code < 0, name .. " is negative")
    end
    -- SHMIPC_ERRNO_MAP has 29 codes; a new code grows this number on purpose.
    t.eq(n, 29, "number of codes")
end

function tests.well_known_codes(t)
    t.eq(shmipc.errors.EINVAL, -22, "EINVAL")
    t.eq(shmipc.errors.ENOENT, -2, "ENOENT")
    t.eq(shmipc.errors.ETIMEDOUT, -110, "ETIMEDOUT")
    t.eq(shmipc.errors.ECONNRESET, -104, "ECONNRESET")
    t.eq(shmipc.errors.ENAMETOOLONG, -36, "ENAMETOOLONG")
    t.eq(shmipc.errors.ECLOSED, -4001, "ECLOSED")
    t.eq(shmipc.errors.EREJECTED, -4008, "EREJECTED")
end

function tests.every_code_is_named_and_described(t)
    for name, code in pairs(shmipc.errors) do
        t.eq(shmipc.errname(code), "SHMIPC_" .. name, "errname(" .. code .. ")")
        local msg = shmipc.strerror(code)
        t.eq(type(msg), "string", "strerror(" .. code .. ") type")
        t.truthy(#msg > 0, "strerror(" .. code .. ") is not empty")
        t.truthy(msg ~= "unknown error", "strerror(" .. code .. ") is known")
    end
end

function tests.codes_are_distinct(t)
    local seen = {}
    for name, code in pairs(shmipc.errors) do
        t.eq(seen[code], nil, name .. " shares its code")
        seen[code] = name
    end
end

function tests.unknown_codes(t)
    for _, code in ipairs({ 0, 1, 22, -1, -3999, -4010, 12345, math.mininteger, math.maxinteger,
        -22 - (1 << 32) }) do
        t.eq(shmipc.errname(code), nil, "errname(" .. code .. ")")
        t.eq(shmipc.strerror(code), "unknown error", "strerror(" .. code .. ")")
    end
    -- errname returns exactly one nil, so it can sit in an argument list.
    t.eq(select("#", shmipc.errname(0)), 1, "errname(0) results")
end

function tests.codes_accept_integral_floats(t)
    t.eq(shmipc.errname(-22.0), "SHMIPC_EINVAL", "errname(-22.0)")
end

function tests.misuse_raises(t)
    t.raises("number expected", shmipc.strerror, "x")
    t.raises("number expected", shmipc.errname)
    t.raises("number has no integer representation", shmipc.errname, -22.5)
    t.raises("number expected", shmipc.strerror, {})
end

function tests.refusal_code_has_a_name(t)
    local v, msg, code = shmipc.config():queue_capacity(0)
    t.eq(v, nil, "result")
    t.truthy(msg:find("queue_capacity", 1, true), "message names the field")
    t.eq(shmipc.errname(code), "SHMIPC_EINVAL", "errname of the code")
end

return tests
