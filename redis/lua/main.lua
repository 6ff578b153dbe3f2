-- sluice: the driver. KEYS are bucket keys, one per request. ARGV[1] is
-- the TTL padding in milliseconds (zero outside tests); then come groups:
--
--   n, op, now, then n requests
--
-- op is "t" (take), "p" (peek) or "r" (refund); now is the time in
-- microseconds, or "" for the server's clock (TIME). A group of takes is
-- all-or-nothing: every request in it is charged, or none. Groups are
-- independent of each other and run in order, so a batch of unrelated
-- takes is many groups of one. Each request is
--
--   "tb", cost, reserve (0/1), max_reserved, capacity, rate_num, rate_den
--   "fw", cost, capacity, window_rate, period, offset (-1: hashed), hash_key
--   "sl", cost, capacity, period
--
-- with, in refund groups, one more argument for "sl": the stamp the take
-- gave the entry. The reply has five integers per request: allowed,
-- tokens left (micro-tokens), retry_after, reset_after (microseconds) and,
-- for sliding logs, the stamp an admitted entry got.
--
-- Writes are deferred to the end of the script: a hot key taken by many
-- groups of one batch is read once and written once.

local pad = tonumber(ARGV[1])
local servertime = nil
local cache = {}  -- key -> {st = state or false}
local dirty = {}  -- key -> ttl in microseconds (0: delete)
local kinds = {}  -- key -> {alg, den}
local order = {}
local out = {}

local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
  if not servertime then
    local t = redis.call('TIME')
    servertime = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return servertime
end

local function load(key, alg, den)
  local c = cache[key]
  if c then return c.st or nil end
  local raw = redis.call('GET', key)
  if not raw then raw = nil end
  local st
  if alg == 'tb' then st = tb_load(raw, den)
  elseif alg == 'fw' then st = fw_load(raw)
  else st = sl_load(raw) end
  cache[key] = {st = st or false}
  return st
end

local function save(key, st, ttl, alg, den)
  cache[key] = {st = st or false}
  if dirty[key] == nil then order[#order + 1] = key end
  dirty[key] = ttl
  kinds[key] = {alg, den}
end

local ai, ki = 2, 1
while ai <= #ARGV do
  local n, op = tonumber(ARGV[ai]), ARGV[ai + 1]
  local now = clock(ARGV[ai + 2])
  ai = ai + 3
  local all = true
  local pending = {} -- tentative states of this group, by key
  local results = {}
  for j = 1, n do
    local key = KEYS[ki]
    ki = ki + 1
    local alg = ARGV[ai]
    local cost = tonumber(ARGV[ai + 1])
    local allowed, st, tokens, retry, reset, aux = 1, nil, 0, 0, 0, 0
    local den = 0
    if alg == 'tb' then
      local reserve, maxres = ARGV[ai + 2] == '1', tonumber(ARGV[ai + 3])
      local cap, num = tonumber(ARGV[ai + 4]), tonumber(ARGV[ai + 5])
      den = tonumber(ARGV[ai + 6])
      ai = ai + 7
      local prev = pending[key]
      if prev == nil then prev = load(key, alg, den) else prev = prev.st or nil end
      if op == 'r' then
        st, reset = tb_refund(prev, now, cost, cap, num, den)
      else
        allowed, st, tokens, retry, reset = tb_take(prev, now, cost, reserve, maxres, cap, num, den)
      end
    elseif alg == 'fw' then
      local cap, wrate, period = tonumber(ARGV[ai + 2]), tonumber(ARGV[ai + 3]), tonumber(ARGV[ai + 4])
      local offset, hkey = tonumber(ARGV[ai + 5]), ARGV[ai + 6]
      ai = ai + 7
      local prev = pending[key]
      if prev == nil then prev = load(key, alg, 0) else prev = prev.st or nil end
      if op == 'r' then
        st, reset = fw_refund(prev, now, cost, cap, wrate, period)
      else
        allowed, st, tokens, retry, reset = fw_take(prev, now, cost, cap, wrate, period, offset, hkey)
      end
    else
      local cap, period = tonumber(ARGV[ai + 2]), tonumber(ARGV[ai + 3])
      ai = ai + 4
      local prev = pending[key]
      if prev == nil then prev = load(key, alg, 0) else prev = prev.st or {} end
      if op == 'r' then
        local stamp = tonumber(ARGV[ai])
        ai = ai + 1
        -- work on a copy: the cached log must not change under a later group
        local copy = {}
        for i = 1, #prev do copy[i] = prev[i] end
        st, reset = sl_refund(copy, now, cost, period, stamp)
      else
        allowed, st, tokens, retry, reset, aux = sl_take(prev, now, cost, cap, period, op == 't')
        if st == nil then st = prev end
      end
    end
    if allowed == 0 then all = false end
    pending[key] = {st = st or false, ttl = reset, alg = alg, den = den}
    results[j] = {allowed, tokens, retry, reset, aux}
  end
  if all and op ~= 'p' then
    for key, p in pairs(pending) do save(key, p.st, p.ttl, p.alg, p.den) end
  end
  for j = 1, n do
    local r = results[j]
    if not all then r[1] = 0 end
    out[#out + 1] = r[1]
    out[#out + 1] = r[2]
    out[#out + 1] = r[3]
    out[#out + 1] = r[4]
    out[#out + 1] = r[5]
  end
end

for _, key in ipairs(order) do
  local ttl = dirty[key]
  local c = cache[key].st
  if not c or ttl <= 0 then
    redis.call('DEL', key)
  else
    local k = kinds[key]
    local raw
    if k[1] == 'tb' then raw = tb_dump(c, k[2])
    elseif k[1] == 'fw' then raw = fw_dump(c)
    else raw = sl_dump(c, 1) end
    redis.call('SET', key, raw, 'PX', cdiv(ttl, 1000) + pad)
  end
end
return out
