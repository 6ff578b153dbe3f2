-- Fixed window with rollover: sluice.TakeFixedWindow, line for line.
-- State: micro-tokens left, the start of the window they count in, and
-- the capacity they were counted under; in the scripts the table {tokens,
-- start}: engine.State's Tokens and Stamp, the capacity kept beside it as
-- a token bucket's den is. Calendar windows (cw) store the same.

-- fw_load returns the state and the capacity it was written under: 0 for
-- state written before the capacity was recorded (16 bytes), which
-- fw_convert keeps as it is.
local function fw_load(raw)
  if not raw then return nil, 0 end
  if #raw == 16 then
    local tokens, start = sunpack('<dd', raw)
    return {tokens, start}, 0
  end
  if #raw ~= 24 then return nil, 0 end
  local tokens, start, cap = sunpack('<ddd', raw)
  return {tokens, start}, cap
end

local function fw_dump(st, cap)
  return spack('<ddd', st[1], st[2], cap)
end

-- engine.ConvertWindow: tokens written under capacity from, counted under
-- capacity cap (a limit reloaded with another capacity keeps its window's
-- used count, from - tokens): cap less that count, at least zero; a debt
-- is kept up to engine.MaxDebt, which for the limits this store takes
-- (redis.fits) is min(2^52-1, (floor((2^52-1)/period) - 1) * wrate) - cap
-- (wrate 0: a calendar window, which holds no debt). from 0: kept as it
-- is, at most cap.
local function fw_convert(tokens, from, cap, wrate, period)
  if from == cap then return tokens end
  if tokens < 0 then
    local most = 0
    if wrate > 0 then
      local windows = fdiv(4503599627370495, period) - 1
      if windows > 0 then
        most = windows * wrate
        if most > 4503599627370495 then most = 4503599627370495 end
        most = most - cap
        if most < 0 then most = 0 end
      end
    end
    if tokens < -most then return -most end
    return tokens
  end
  if from <= 0 then
    if tokens > cap then return cap end
    return tokens
  end
  if tokens > from then tokens = from end
  tokens = tokens - from + cap
  if tokens < 0 then return 0 end
  return tokens
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
-- reset_after. since, a Cluster rollback's, is the start of the window
-- its take counted in: once that window has ended the charge stays, for
-- a refund counts in the window of its moment, and would give that one
-- the cost again (TestAttackClusterRollbackRefundsLaterWindow).
local function fw_refund(st, now, cost, cap, wrate, period, since)
  if not st then return nil, cap, 0 end
  local tokens, start = fw_roll(st, now, cap, wrate, period)
  if since and start ~= since then cost = 0 end
  if cost >= cap - tokens then tokens = cap else tokens = tokens + cost end
  local reset = 0
  if tokens < cap then reset = start + cdiv(cap - tokens, wrate) * period - now end
  return {tokens, start}, tokens, reset
end
