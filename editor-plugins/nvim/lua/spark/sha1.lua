-- SHA-1 and base64, for the WebSocket handshake only (Sec-WebSocket-Accept is
-- base64(SHA-1(key .. GUID)), RFC 6455 section 4.2.2). Neovim 0.7 has sha256 but neither of
-- these. LuaJIT's `bit` library does the 32-bit arithmetic.
local bit = require('bit')
local band, bor, bxor, bnot = bit.band, bit.bor, bit.bxor, bit.bnot
local rol, tobit = bit.rol, bit.tobit

local M = {}

local function be32(s, i)
  local a, b, c, d = s:byte(i, i + 3)
  return tobit(a * 0x1000000 + b * 0x10000 + c * 0x100 + d)
end

local function hex32(x)
  return string.format('%08x', x % 0x100000000)
end

--- The SHA-1 digest of `msg` as 20 raw bytes.
function M.sha1(msg)
  local len = #msg
  -- pad: 0x80, zeros to 56 mod 64, then the bit length as a 64-bit big-endian number
  local bits = len * 8
  local pad = '\128' .. string.rep('\0', (55 - len) % 64)
  local hi, lo = math.floor(bits / 0x100000000), bits % 0x100000000
  local tail = string.char(
    math.floor(hi / 0x1000000) % 256, math.floor(hi / 0x10000) % 256,
    math.floor(hi / 0x100) % 256, hi % 256,
    math.floor(lo / 0x1000000) % 256, math.floor(lo / 0x10000) % 256,
    math.floor(lo / 0x100) % 256, lo % 256)
  local m = msg .. pad .. tail
  local h0, h1, h2, h3, h4 =
    tobit(0x67452301), tobit(0xEFCDAB89), tobit(0x98BADCFE), tobit(0x10325476), tobit(0xC3D2E1F0)
  local w = {}
  for chunk = 1, #m, 64 do
    for i = 0, 15 do
      w[i] = be32(m, chunk + i * 4)
    end
    for i = 16, 79 do
      w[i] = rol(bxor(w[i - 3], w[i - 8], w[i - 14], w[i - 16]), 1)
    end
    local a, b, c, d, e = h0, h1, h2, h3, h4
    for i = 0, 79 do
      local f, k
      if i < 20 then
        f, k = bor(band(b, c), band(bnot(b), d)), 0x5A827999
      elseif i < 40 then
        f, k = bxor(b, c, d), 0x6ED9EBA1
      elseif i < 60 then
        f, k = bor(band(b, c), band(b, d), band(c, d)), 0x8F1BBCDC
      else
        f, k = bxor(b, c, d), 0xCA62C1D6
      end
      local t = tobit(rol(a, 5) + f + e + k + w[i])
      e, d, c, b, a = d, c, rol(b, 30), a, t
    end
    h0, h1, h2, h3, h4 = tobit(h0 + a), tobit(h1 + b), tobit(h2 + c), tobit(h3 + d), tobit(h4 + e)
  end
  local hex = hex32(h0) .. hex32(h1) .. hex32(h2) .. hex32(h3) .. hex32(h4)
  return (hex:gsub('..', function(x) return string.char(tonumber(x, 16)) end))
end

local alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'

--- Standard base64 with padding.
function M.base64(s)
  local out = {}
  for i = 1, #s, 3 do
    local a, b, c = s:byte(i, i + 2)
    local n = a * 65536 + (b or 0) * 256 + (c or 0)
    local q = {}
    for j = 3, 0, -1 do
      local v = math.floor(n / 64 ^ j) % 64
      q[#q + 1] = alphabet:sub(v + 1, v + 1)
    end
    if not b then
      q[3], q[4] = '=', '='
    elseif not c then
      q[4] = '='
    end
    out[#out + 1] = table.concat(q)
  end
  return table.concat(out)
end

return M
