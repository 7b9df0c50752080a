-- struct.lua: a pure-Lua stand-in for the subset of Redis' `struct` library redisync uses.
--
-- Real Redis embeds the C `struct` library; fakeredis (the embedded default and the unit tests)
-- does not. The library carries this file (library.py) and calls it where the server has no `struct`.
-- Only little-endian float64 formats are supported: '<' followed by one or more 'd'.
-- returns: the module table {pack = ..., unpack = ...}; values are bit-exact, NaN and ±inf included.

local floor, frexp, ldexp, huge = math.floor, math.frexp, math.ldexp, math.huge
local byte, char, concat = string.byte, string.char, table.concat

local function count_of(fmt)
  local n = #fmt - 1
  if n < 1 or string.sub(fmt, 1, 1) ~= '<' or string.find(fmt, '[^d]', 2) then
    error("struct stand-in supports only '<d...' formats, got " .. tostring(fmt))
  end
  return n
end

local function decode(s, p)
  local b1, b2, b3, b4, b5, b6, b7, b8 = byte(s, p, p + 7)
  if not b8 then error('struct.unpack: data string too short') end
  local sign = 1
  if b8 >= 128 then sign = -1; b8 = b8 - 128 end
  local exp = b8 * 16 + floor(b7 / 16)
  local mant = ((((((b7 % 16) * 256 + b6) * 256 + b5) * 256 + b4) * 256 + b3) * 256 + b2) * 256 + b1
  if exp == 2047 then
    if mant == 0 then return sign * huge end
    return 0 / 0
  end
  if exp == 0 then return sign * ldexp(mant, -1074) end
  return sign * ldexp(mant + 4503599627370496, exp - 1075)
end

local function encode(x)
  if x ~= x then return char(0, 0, 0, 0, 0, 0, 248, 127) end
  local sign = 0
  if x < 0 or (x == 0 and 1 / x < 0) then sign = 128; x = -x end
  if x == huge then return char(0, 0, 0, 0, 0, 0, 240, 127 + sign) end
  if x == 0 then return char(0, 0, 0, 0, 0, 0, 0, sign) end
  local m, e = frexp(x)
  local exp = e + 1022
  local mant
  if exp <= 0 then
    mant = ldexp(x, 1074)
    exp = 0
  else
    mant = ldexp(m, 53) - 4503599627370496
  end
  local b = {}
  for i = 1, 6 do
    b[i] = mant % 256
    mant = floor(mant / 256)
  end
  b[7] = (exp % 16) * 16 + mant
  b[8] = sign + floor(exp / 16)
  return char(b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8])
end

local M = {}

function M.pack(fmt, ...)
  local n = count_of(fmt)
  local out = {}
  for i = 1, n do
    local v = select(i, ...)
    if type(v) ~= 'number' then error('struct.pack: bad argument #' .. (i + 1)) end
    out[i] = encode(v)
  end
  return concat(out)
end

function M.unpack(fmt, s, pos)
  local n = count_of(fmt)
  pos = pos or 1
  local out = {}
  for i = 1, n do
    out[i] = decode(s, pos)
    pos = pos + 8
  end
  out[n + 1] = pos
  return unpack(out, 1, n + 1)
end

return M
