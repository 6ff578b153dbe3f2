-- sluice: the driver. KEYS are bucket keys, one per request. ARGV[1] is
-- the TTL padding in milliseconds (zero outside tests); then come groups,
-- each a header and three arguments per request:
--
--   header       op, request count and optionally the time: "t1", "p3",
--                "r2:1700000000000000"; op is t (take), p (peek) or
--                r (refund: sluice.OpRefund, or a Cluster TakeAll rolled
--                back); the time is in microseconds, and without it the
--                server's clock (TIME) is used. An upper-case op ("T29")
--                is a run: that many groups of one request, a key each,
--                whose requests share the three arguments that follow
--   limit        "tb capacity rate_num rate_den"
--                "fw capacity window_rate period offset" (offset -1: hashed)
--                "sl capacity period"
--                "sw capacity period" (a sliding window; period 0: calendar)
--                "cw capacity 0" (a fixed window on calendar boundaries)
--   cost         micro-tokens; a reservation (tb, fw) appends "r" and the
--                debt it may leave in micro-tokens: "16000000r4000000";
--                a Cluster TakeAll's rollback of a window's take (fw, cw,
--                sw) appends "w" and the start of the window the take
--                counted in, which its reply gave: "5000000w1700000000000000"
--   extra        tb: "" but when a Cluster TakeAll is rolled back, the
--                stamp and tokens its take answered: "1700000000000000:-2000000"
--                fw: the request key when the offset is hashed, else ""
--                sl: when a Cluster TakeAll is rolled back, the stamp the
--                take gave the entry to remove; "" for a plain refund,
--                which takes the cost out of the newest entries
--                sw, cw: the five window bounds "b0 b1 b2 b3 b4" of a
--                calendar window (engine.Bounds), computed by the caller
--                where the time-zone database is; "" for a period
--
-- Headers, limits and costs repeat across the requests of a batch; each
-- distinct string is parsed once (tonumber on a string is libc's strtod).
-- A group of takes is all-or-nothing: every request
-- in it is charged, or none. A refund is always allowed, and a refund of
-- an absent key (a full bucket) writes nothing. Groups are independent of
-- each other and run in order, so a batch of unrelated takes is many
-- groups of one. The reply has five integers per request: allowed, tokens
-- left (micro-tokens), retry_after, reset_after (microseconds) and the
-- stamp of the state a take left (token buckets), that an admitted
-- entry got (sliding logs) or of the window a take counted in (fw, cw,
-- sw).
--
-- Writes are deferred to the end of the script: a hot key taken by many
-- groups of one batch is read once and written once.

-- Replicate the writes, not the script, which reads TIME: the default
-- since Redis 5, asked for explicitly on 3.2 and 4 (a no-op on 7).
if redis.replicate_commands then redis.replicate_commands() end

local pad = tonumber(ARGV[1])
local servertime = nil
-- The batch's view of its keys, so a hot key taken by many groups is read
-- once and written once: state (false when absent), algorithm, the unit
-- the state is in (a token bucket's rate denominator, a fixed or calendar
-- window's capacity; see convert) and TTL of the state to write.
local seen = {} -- key: {state, alg, den, ttl}, one table per key
local order = {}
local out, nout = {}, 0
local ai, ki = 2, 1

-- Read every key of the batch with one MGET rather than one GET each (MGET
-- answers nil for a key of another type). unpack is bounded by Lua's
-- stack, so very large calls fall back to GET per key.
local raws, prefetched = {}, false
if #KEYS > 0 and #KEYS <= 4000 then
  local vals = redis.call('MGET', unpack(KEYS))
  for i = 1, #KEYS do
    local v = vals[i]
    if v then raws[KEYS[i]] = v end
  end
  prefetched = true
end

local function clock()
  if not servertime then
    local t = redis.call('TIME')
    servertime = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return servertime
end

local lims, hdrs, costs = {}, {}, {}

local function limit(d)
  local l = lims[d]
  if l then return l end
  -- the numbers after the capacity: tb rate_num rate_den; fw window_rate
  -- period offset; sl period
  local alg, cap, n1, n2, n3 = string.match(d, '^(%a+) (%-?%d+) (%-?%d+) ?(%-?%d*) ?(%-?%d*)$')
  l = {alg, tonumber(cap), tonumber(n1), tonumber(n2), tonumber(n3)}
  lims[d] = l
  return l
end

local function header(h)
  local v = hdrs[h]
  if not v then
    local op, n, now = string.match(h, '^(%a)(%d+):?(%d*)$')
    -- an upper-case op: a run of n groups of one request, sharing its
    -- arguments, which the driver takes as n repetitions of a group of one
    local lower, reps = string.lower(op), 1
    if lower ~= op then n, reps = 1, n end
    v = {lower, tonumber(n), tonumber(now), tonumber(reps)} -- no time: nil, clock()'s
    hdrs[h] = v
  end
  return v[1], v[2], v[3] or clock(), v[4]
end

local save

-- convert returns state v, written under unit from, in the units of a
-- limit of unit den (a token bucket's rate denominator, a fixed or
-- calendar window's capacity), capacity cap and rate num (per period for
-- a fixed window): tb_convert for a bucket, fw_convert for a window.
local function convert(alg, v, from, den, cap, num, period)
  if not v or from == den then return v end
  if alg == 'tb' then return {tb_convert(v[1], from, den, cap), v[2]} end
  if alg == 'fw' or alg == 'cw' then return {fw_convert(v[1], from, cap, num, period), v[2]} end
  return v
end

-- load returns key's state as of this batch. A token bucket written under
-- another rate denominator is converted to den (tb_convert) and, when read
-- from Redis, written back converted with the TTL of its new limit (the
-- time until full at rate num), rejected or not: the TTL the old limit
-- set may end before the bucket is full at the new rate, and an expired
-- key is a full bucket. A window written under another capacity is
-- converted as it is read (fw_convert) and written only by a take or
-- refund that changes it, as engine.ConvertWindow's callers do: a limit
-- lowered and raised back before any write finds the count it had.
local function load(key, alg, den, cap, num, now, period)
  local e = seen[key]
  if e then
    local v = e[1]
    -- state seen under another unit (a limit changed while this batch was
    -- queued) is converted, as tb_load would
    return convert(alg, v or nil, e[3], den, cap, num, period)
  end
  -- A value sluice did not write (another type, another length) reads as
  -- absent and is overwritten, rather than failing every take in the batch.
  local raw
  if prefetched then
    raw = raws[key]
  else
    raw = redis.pcall('GET', key)
    if type(raw) ~= 'string' then raw = nil end
  end
  local st, converted
  local from = den
  if alg == 'tb' then st, converted = tb_load(raw, den, cap)
  elseif alg == 'fw' or alg == 'cw' then st, from = fw_load(raw)
  elseif alg == 'sw' then st = sw_load(raw)
  else st = sl_load(raw) end
  seen[key] = {st or false, nil, from, nil}
  if from ~= den then return convert(alg, st, from, den, cap, num, period) end
  if converted then
    local full = cap * den
    local ttl = 0
    if st[1] < full then ttl = st[2] + cdiv(full - st[1], num) - now end
    save(key, st, ttl, alg, den)
  end
  return st
end

save = function(key, st, ttl, alg, den)
  local e = seen[key]
  if not e then
    e = {}
    seen[key] = e
  end
  if e[4] == nil then order[#order + 1] = key end
  e[1], e[2], e[3], e[4] = st or false, alg, den, ttl
end

-- eval decides (or refunds) the request at ARGV[ai] against the state
-- prev(key, alg, den, cap, num, now, period) returns, and advances ai. It
-- returns allowed, the state to keep, tokens, retry_after, reset_after,
-- aux, alg and den (the unit the state is in: see convert).
local function eval(key, op, now, prev)
  local l = limit(ARGV[ai])
  local carg, extra = ARGV[ai + 1], ARGV[ai + 2]
  ai = ai + 3
  local c = costs[carg]
  if not c then
    c = {tonumber(carg), false, 0}
    if not c[1] then
      local n, m = string.match(carg, '^(%d+)r(%d+)$')
      if n then
        c = {tonumber(n), true, tonumber(m)}
      else
        n, m = string.match(carg, '^(%d+)w(%-?%d+)$')
        c = {tonumber(n), false, 0, tonumber(m)}
      end
    end
    costs[carg] = c
  end
  local cost, reserve, maxres, since = c[1], c[2], c[3], c[4]
  local alg, cap = l[1], l[2]
  if alg == 'tb' then
    local num, den = l[3], l[4]
    local st = prev(key, alg, den, cap, num, now)
    if op == 'r' then
      local tail = nil
      if extra ~= '' then
        local s1, t1 = string.match(extra, '^(%-?%d+):(%-?%d+)$')
        tail = {tonumber(s1), tonumber(t1)}
      end
      local nst, tokens, reset = tb_refund(st, now, cost, cap, num, den, tail)
      return 1, nst, tokens, 0, reset, 0, alg, den
    end
    local allowed, nst, tokens, retry, reset = tb_take(st, now, cost, reserve, maxres, cap, num, den)
    return allowed, nst, tokens, retry, reset, nst[2], alg, den
  elseif alg == 'fw' then
    local wrate, period = l[3], l[4]
    local st = prev(key, alg, cap, cap, wrate, now, period)
    if op == 'r' then
      local nst, tokens, reset = fw_refund(st, now, cost, cap, wrate, period, since)
      return 1, nst, tokens, 0, reset, 0, alg, cap
    end
    local allowed, nst, tokens, retry, reset = fw_take(st, now, cost, reserve, maxres, cap, wrate, period, l[5], extra)
    return allowed, nst, tokens, retry, reset, nst[2], alg, cap
  elseif alg == 'sw' then
    local st = prev(key, alg, 0)
    if op == 'r' then
      local nst, tokens, reset = sw_refund(st, now, cost, cap, l[3], extra, since)
      return 1, nst, tokens, 0, reset, 0, alg, 0
    end
    local allowed, nst, tokens, retry, reset = sw_take(st, now, cost, cap, l[3], extra)
    return allowed, nst, tokens, retry, reset, nst[1], alg, 0
  elseif alg == 'cw' then
    local st = prev(key, alg, cap, cap, 0, now, 0)
    if op == 'r' then
      local nst, tokens, reset = cw_refund(st, now, cost, cap, extra, since)
      return 1, nst, tokens, 0, reset, 0, alg, cap
    end
    local allowed, nst, tokens, retry, reset = cw_take(st, now, cost, cap, extra)
    return allowed, nst, tokens, retry, reset, nst[2], alg, cap
  end
  local period = l[3]
  local log = prev(key, alg, 0) or {}
  if op == 'r' then
    -- sl_refund builds a new log: the batch's cached one must not change
    local nst, tokens, reset = sl_refund(log, now, cost, cap, period, tonumber(extra))
    return 1, nst, tokens, 0, reset, 0, alg, 0
  end
  local allowed, nst, tokens, retry, reset, aux = sl_take(log, now, cost, cap, period, op == 't')
  if nst == nil then nst = log end
  return allowed, nst, tokens, retry, reset, aux, alg, 0
end

local function emit(allowed, tokens, retry, reset, aux)
  out[nout + 1] = allowed
  out[nout + 2] = tokens
  out[nout + 3] = retry
  out[nout + 4] = reset
  out[nout + 5] = aux
  nout = nout + 5
end

while ai <= #ARGV do
  local op, n, now, reps = header(ARGV[ai])
  ai = ai + 1
  if n == 1 then
    -- One request: its own answer is the group's; no tentative copies.
    -- A run is reps such groups whose requests share these arguments.
    local first = ai
    for _ = 1, reps do
      ai = first
      local key = KEYS[ki]
      ki = ki + 1
      local allowed, st, tokens, retry, reset, aux, alg, den = eval(key, op, now, load)
      -- a refund of an absent key returns no state: absent stays absent
      if allowed == 1 and op ~= 'p' and st then save(key, st, reset, alg, den) end
      emit(allowed, tokens, retry, reset, aux)
    end
  else
    local all = true
    local pst, pttl, palg, pden = {}, {}, {}, {} -- tentative, by key
    local pkeys = {}
    local function prev(key, alg, den, cap, num, now, period)
      local v = pst[key]
      if v ~= nil then return convert(alg, v or nil, pden[key], den, cap, num, period) end
      return load(key, alg, den, cap, num, now, period)
    end
    local base = nout
    for j = 1, n do
      local key = KEYS[ki]
      ki = ki + 1
      local allowed, st, tokens, retry, reset, aux, alg, den = eval(key, op, now, prev)
      if allowed == 0 then all = false end
      if pst[key] == nil then pkeys[#pkeys + 1] = key end
      pst[key], pttl[key], palg[key], pden[key] = st or false, reset, alg, den
      emit(allowed, tokens, retry, reset, aux)
    end
    if all and op ~= 'p' then
      for _, key in ipairs(pkeys) do
        local st = pst[key]
        if st then save(key, st, pttl[key], palg[key], pden[key]) end
      end
    end
    if not all then
      for j = 0, n - 1 do out[base + 5 * j + 1] = 0 end
    end
  end
end

for _, key in ipairs(order) do
  local e = seen[key]
  local st, ttl = e[1], e[4]
  if not st or ttl <= 0 then
    redis.call('DEL', key)
  else
    local alg, den = e[2], e[3]
    local raw
    if alg == 'tb' then raw = tb_dump(st, den)
    elseif alg == 'fw' or alg == 'cw' then raw = fw_dump(st, den)
    elseif alg == 'sw' then raw = sw_dump(st)
    else raw = sl_dump(st, 1) end
    -- an integer string: a number argument would be written by printf's
    -- %.17g, its slower double path
    redis.call('SET', key, raw, 'PX', sformat('%d', cdiv(ttl, 1000) + pad))
  end
end
return out
