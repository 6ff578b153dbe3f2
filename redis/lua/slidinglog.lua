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

-- Removes the entry an earlier take appended (same stamp and cost).
local function sl_refund(log, now, cost, period, stamp)
  for i = #log - 1, 1, -2 do
    if log[i] == stamp and log[i + 1] == cost then
      table.remove(log, i + 1)
      table.remove(log, i)
      break
    end
  end
  local n = #log
  if n == 0 or log[n - 1] <= now - period then return nil, 0 end
  return log, log[n - 1] + period - now
end
