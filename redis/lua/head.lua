-- sluice: shared helpers. The algorithm files and main.lua are appended to
-- this file to form one script (see scripts.go).
--
-- Lua numbers are doubles. Every value these scripts compute with is an
-- integer below 2^53 (the Go side refuses limits whose scaled capacity
-- would not be), so double arithmetic on them is exact; divisions go
-- through fdiv/cdiv, which correct the rounded quotient to the exact
-- integer floor/ceiling.

-- Library functions used per request, as locals: a global lookup per use
-- is measurable at hundreds of requests per call.
local floor, tonumber, spack, sunpack, sformat = math.floor, tonumber, struct.pack, struct.unpack, string.format

local function fdiv(a, b) -- floor(a/b) for integers a and b > 0
  local q = floor(a / b)
  local r = a - q * b
  if r < 0 then return q - 1 end
  if r >= b then return q + 1 end
  return q
end

local function cdiv(a, b) -- ceil(a/b)
  return -fdiv(-a, b)
end

local function fmod(a, b) -- a mod b in [0, b)
  return a - fdiv(a, b) * b
end
