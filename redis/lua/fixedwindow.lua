-- Fixed window with rollover: sluice.TakeFixedWindow, line for line.
-- State: micro-tokens left and the start of the window they count in, the
-- table {tokens, start}: sluice.State's Tokens and Stamp.

local function fw_load(raw)
  if not raw or #raw ~= 16 then return nil end
  local tokens, start = sunpack('<dd', raw)
  return {tokens, start}
end

local function fw_dump(st)
  return spack('<dd', st[1], st[2])
end

-- sluice.WindowOffset: the first 48 bits of SHA-1(key), modulo period.
local function fw_offset(key, period)
  return fmod(tonumber(string.sub(redis.sha1hex(key), 1, 12), 16), period)
end

local function fw_roll(st, now, cap, wrate, period)
  local tokens, start = st[1], st[2]
  if now - start >= period then
    local k = fdiv(now - start, period)
    start = start + k * period
    if k > fdiv(cap - tokens, wrate) then
      tokens = cap
    else
      tokens = tokens + k * wrate
    end
  end
  if tokens > cap then tokens = cap end
  return tokens, start
end

-- A reservation (reserve) whose debt, cost - tokens, is at most maxres is
-- admitted: tokens go negative and retry is the boundary that pays them.
local function fw_take(st, now, cost, reserve, maxres, cap, wrate, period, offset, hkey)
  local tokens, start
  if st then
    tokens, start = fw_roll(st, now, cap, wrate, period)
  else
    if offset < 0 then offset = fw_offset(hkey, period) end
    tokens, start = cap, now - fmod(now - offset, period)
  end
  local allowed, retry, reset = 0, 0, 0
  if tokens >= cost then
    allowed = 1
    tokens = tokens - cost
  elseif reserve and cost - tokens <= maxres then
    allowed = 1
    tokens = tokens - cost
    retry = start + cdiv(-tokens, wrate) * period - now
  else
    local need = cost
    if reserve then need = need - maxres end
    retry = start + cdiv(need - tokens, wrate) * period - now
  end
  if tokens < cap then reset = start + cdiv(cap - tokens, wrate) * period - now end
  return allowed, {tokens, start}, tokens, retry, reset
end

-- sluice.RefundFixedWindow: roll the window forward as a take would, then
-- give cost back (debt first), capped at the capacity. An absent key is
-- full and stays absent (nil state). Returns the state, tokens and
-- reset_after.
local function fw_refund(st, now, cost, cap, wrate, period)
  if not st then return nil, cap, 0 end
  local tokens, start = fw_roll(st, now, cap, wrate, period)
  if cost >= cap - tokens then tokens = cap else tokens = tokens + cost end
  local reset = 0
  if tokens < cap then reset = start + cdiv(cap - tokens, wrate) * period - now end
  return {tokens, start}, tokens, reset
end
