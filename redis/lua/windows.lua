-- Sliding windows and calendar windows: package engine's
-- TakeSlidingWindow, RefundSlidingWindow, TakeCalendarWindow and
-- RefundCalendarWindow, line for line. Both decide on five window bounds
-- (engine.Bounds): given by the request for a calendar window, whose
-- boundaries need the time-zone database that Lua lacks, and computed
-- here from the period otherwise.
-- State: sw {start, count, prev}; cw {tokens, start}, as fw's.

local function sw_load(raw)
  if not raw or #raw ~= 24 then return nil end
  local start, count, prev = sunpack('<ddd', raw)
  return {start, count, prev}
end

local function sw_dump(st)
  return spack('<ddd', st[1], st[2], st[3])
end

-- floor(a*b/c) for integers 0 <= a, b < 2^53 and 0 < c < 2^52 whose
-- result is below 2^53: the product does not fit a double, so it is
-- built bit by bit of b as a quotient and a remainder below c.
local function muldiv(a, b, c)
  local qa = fdiv(a, c)
  local ra = a - qa * c
  local q, r, bit = 0, 0, 1
  while bit * 2 <= b do bit = bit * 2 end
  while bit >= 1 do
    q, r = q * 2, r * 2
    if r >= c then q, r = q + 1, r - c end
    if b >= bit then
      b = b - bit
      q, r = q + qa, r + ra
      if r >= c then q, r = q + 1, r - c end
    end
    bit = bit / 2
  end
  return q
end

-- engine.Bounds: "b0 b1 b2 b3 b4" as given, or windows of period from
-- the epoch around now; then engine.Bounds.Pick.
local function win_pick(bounds, period, now)
  local b
  if bounds ~= '' then
    b = {}
    for v in string.gmatch(bounds, '%-?%d+') do b[#b + 1] = tonumber(v) end
  else
    local s = now - fmod(now, period)
    b = {s - period, s, s + period, s + 2 * period, s + 3 * period}
  end
  if now >= b[3] then return b[2], b[3], b[4], b[5] end
  return b[1], b[2], b[3], b[4]
end

local function sw_weigh(prev, now, start, stop)
  if prev == 0 then return 0 end
  local elapsed = now - start
  if elapsed < 0 then elapsed = 0 end
  return prev - muldiv(prev, elapsed, stop - start)
end

-- Returns count, prev, weighted, the start to store, and the bounds.
local function sw_roll(st, now, period, bounds)
  local before, start, stop, nxt = win_pick(bounds, period, now)
  local count, prev, stamp = 0, 0, start
  if st then
    if st[1] >= start then count, prev, stamp = st[2], st[3], st[1]
    elseif st[1] >= before then prev = st[2] end
  end
  return count, prev, sw_weigh(prev, now, start, stop), stamp, start, stop, nxt, before
end

local function sw_reset(count, weighted, now, stop, nxt)
  if count > 0 then return nxt - now end
  if weighted > 0 then return stop - now end
  return 0
end

local function sw_take(st, now, cost, cap, period, bounds)
  local count, prev, weighted, stamp, start, stop, nxt = sw_roll(st, now, period, bounds)
  local allowed, retry = 0, 0
  local used = count + weighted
  if used + cost <= cap then
    allowed = 1
    used = used + cost
    count = count + cost
  else
    local room = cap - count - cost
    if room >= 0 then
      retry = stop - muldiv(room, stop - start, prev) - now
    else
      room = cap - cost
      if count <= room then retry = stop - now
      else retry = nxt - muldiv(room, nxt - stop, count) - now end
    end
  end
  return allowed, {stamp, count, prev}, cap - used, retry, sw_reset(count, weighted, now, stop, nxt)
end

-- An absent key has counted nothing: nil state, nothing written. since,
-- a Cluster rollback's, is the start of the window its take counted in:
-- the charge comes out of that window's count alone, the current one's
-- or the previous one's, and stays once neither is that window, for a
-- refund out of a later window's count would let it admit the cost again
-- (TestAttackClusterRollbackRefundsLaterWindow).
local function sw_refund(st, now, cost, cap, period, bounds, since)
  if not st then return nil, cap, 0 end
  local count, prev, weighted, stamp, start, stop, nxt, before = sw_roll(st, now, period, bounds)
  local back = cost
  if since and since < start then back = 0 end
  if back > count then back = count end
  count = count - back
  back = cost - back
  if since and (since >= start or since < before) then back = 0 end
  if back > prev then back = prev end
  prev = prev - back
  weighted = sw_weigh(prev, now, start, stop)
  return {stamp, count, prev}, cap - count - weighted, sw_reset(count, weighted, now, stop, nxt)
end

local function cw_roll(st, now, cap, bounds)
  local _, start, stop = win_pick(bounds, 0, now)
  if not st or st[2] < start then return cap, start, stop end
  local tokens = st[1]
  if tokens > cap then tokens = cap end
  return tokens, st[2], stop
end

local function cw_take(st, now, cost, cap, bounds)
  local tokens, start, stop = cw_roll(st, now, cap, bounds)
  local allowed, retry, reset = 0, 0, 0
  if tokens >= cost then
    allowed = 1
    tokens = tokens - cost
  else
    retry = stop - now
  end
  if tokens < cap then reset = stop - now end
  return allowed, {tokens, start}, tokens, retry, reset
end

-- since, a Cluster rollback's, is the start of the window its take
-- counted in: as fw_refund, the charge of a window that has ended stays.
local function cw_refund(st, now, cost, cap, bounds, since)
  if not st then return nil, cap, 0 end
  local tokens, start, stop = cw_roll(st, now, cap, bounds)
  if since and start ~= since then cost = 0 end
  if cost > cap then cost = cap end
  tokens = tokens + cost
  if tokens > cap then tokens = cap end
  local reset = 0
  if tokens < cap then reset = stop - now end
  return {tokens, start}, tokens, reset
end
