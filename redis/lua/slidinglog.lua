-- Sliding-window log: sluice.TakeSlidingLog, line for line.
-- State: the admitted requests of the last period, oldest first, packed as
-- pairs of doubles (stamp, cost): 16 bytes an entry, O(capacity) per key.

local function sl_load(raw)
  local log = {}
  if not raw or #raw % 16 ~= 0 then return log end
  local n, pos = 0, 1
  while pos < #raw do
    local s, c
    s, c, pos = sunpack('<dd', raw, pos)
    log[n + 1] = s
    log[n + 2] = c
    n = n + 2
  end
  return log
end

local function sl_dump(log, first)
  local parts = {}
  for i = first, #log, 2 do
    parts[#parts + 1] = spack('<dd', log[i], log[i + 1])
  end
  return table.concat(parts)
end

-- Returns allowed, the log to store (or nil when nothing changes), tokens
-- left, retry_after, reset_after and the stamp an admitted entry got.
local function sl_take(log, now, cost, cap, period, take)
  local n = #log
  local eff = now
  if n > 0 and log[n - 1] > eff then eff = log[n - 1] end
  local first = 1
  while first < n and log[first] <= eff - period do first = first + 2 end
  local used = 0
  for i = first, n, 2 do used = used + log[i + 1] end
  local allowed, retry, reset = 0, 0, 0
  local out = nil
  if used + cost <= cap then
    allowed = 1
    used = used + cost
    if take then
      out = {}
      for i = first, n do out[#out + 1] = log[i] end
      out[#out + 1] = eff
      out[#out + 1] = cost
    end
    reset = eff + period - now
  else
    local excess = used + cost - cap
    for i = first, n, 2 do
      excess = excess - log[i + 1]
      if excess <= 0 then
        retry = log[i] + period - now
        break
      end
    end
    if n >= first then reset = log[n - 1] + period - now end
  end
  return allowed, out, cap - used, retry, reset, eff
end

-- sluice.RefundSlidingLog: drops the expired entries, then takes cost back
-- out of the newest entries (an entry partly refunded keeps the rest of
-- its cost). With stamp set (a Cluster TakeAll rolled back), it removes
-- instead the one entry that take appended (same stamp and cost). The log
-- given is not changed: the batch's cached copy must stay as it was. An
-- absent (empty) log stays absent (nil). Returns the log to store, tokens
-- left and reset_after.
local function sl_refund(log, now, cost, cap, period, stamp)
  local n = #log
  if n == 0 then return nil, cap, 0 end
  local eff = now
  if log[n - 1] > eff then eff = log[n - 1] end
  local first = 1
  while first < n and log[first] <= eff - period do first = first + 2 end
  local out, m = {}, 0
  for i = first, n do
    m = m + 1
    out[m] = log[i]
  end
  if stamp then
    for i = m - 1, 1, -2 do
      if out[i] == stamp and out[i + 1] == cost then
        table.remove(out, i + 1)
        table.remove(out, i)
        m = m - 2
        break
      end
    end
  else
    while m > 0 and cost > 0 do
      local c = out[m]
      if c > cost then
        out[m] = c - cost
        break
      end
      cost = cost - c
      out[m] = nil
      out[m - 1] = nil
      m = m - 2
    end
  end
  local used = 0
  for i = 2, m, 2 do used = used + out[i] end
  local reset = 0
  if m > 0 then reset = out[m - 1] + period - now end
  return out, cap - used, reset
end
