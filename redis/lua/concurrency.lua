-- sluice: concurrency limits, sluice.StepLease line for line. A script of
-- its own (see lease.go): one key, never batched with the takes.
--
-- KEYS[1] is the key's sorted set of leases: member the lease id (32 hex
-- digits), score the time the lease ends (microseconds of the clock).
-- ARGV: op (t acquire or renew, p peek, r release, n renew only), lease id, slots,
-- lease length in microseconds, the time ("" for the server's TIME) and
-- the TTL padding in milliseconds (zero outside tests).
--
-- The reply is allowed, tokens (micro-tokens: slots free after the call,
-- times 1e6), retry_after and reset_after (microseconds).
--
-- Scores are integers below 2^53, exact in doubles; every one that goes
-- back to Redis as a string is formatted with %.0f, since Lua's tostring
-- keeps only 14 digits.

if redis.replicate_commands then redis.replicate_commands() end

local key, op, id = KEYS[1], ARGV[1], ARGV[2]
local n, lease, pad = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[6])
local now
if ARGV[5] ~= '' then
  now = tonumber(ARGV[5])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local nows = string.format('%.0f', now)

-- Live leases: those that end after now.
local live = redis.call('ZCOUNT', key, '(' .. nows, '+inf')
local mine = redis.call('ZSCORE', key, id)
local held = false
if mine then
  mine = tonumber(mine)
  held = mine > now
end

-- An acquire or its peek may take a free slot; a release or a renewal
-- only acts on id's own live lease.
local acquire = op == 't' or op == 'p'
local allowed
if acquire then
  allowed = held or live < n
else
  allowed = held
end

-- The leases after op: count, the latest end, and the end id's lease gets.
local count, ends = live, now + lease
if held and mine > ends then ends = mine end
if allowed and acquire and not held then count = count + 1 end
if op == 'r' and held then count = count - 1 end

-- The latest end among the live leases, leaving out member skip: the last
-- two by score are enough, since only one member is ever left out.
local function latest_live(skip)
  local r = redis.call('ZRANGE', key, -2, -1, 'WITHSCORES')
  for i = #r, 2, -2 do
    if r[i - 1] ~= skip then
      local e = tonumber(r[i])
      if e > now then return e end
      return 0
    end
  end
  return 0
end

local latest
if op == 'r' and held then
  latest = latest_live(id)
else
  latest = latest_live(nil)
end
if allowed and op ~= 'r' and ends > latest then latest = ends end
local reset = 0
if latest > now then reset = latest - now end

-- A rejected acquire waits until enough leases end that one slot is free:
-- the (live - n + 1)-th earliest end.
local retry = 0
if not allowed and acquire then
  local k = live - n + 1
  if k >= 1 then
    local r = redis.call('ZRANGEBYSCORE', key, '(' .. nows, '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)
    if #r == 2 then retry = tonumber(r[2]) - now end
  end
end

if op ~= 'p' then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', nows)
  if op == 'r' then
    if held then redis.call('ZREM', key, id) end
  elseif allowed then
    redis.call('ZADD', key, string.format('%.0f', ends), id)
  end
  if count > 0 then
    -- The key lives until its last lease ends: then it is the same as no
    -- key at all.
    redis.call('PEXPIRE', key, math.ceil(reset / 1000) + pad)
  end
end

local a = 0
if allowed then a = 1 end
return {a, (n - count) * 1000000, retry, reset}
