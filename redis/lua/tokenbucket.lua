-- Token (and leaky) bucket: sluice.TakeTokenBucket, line for line.
-- State: tokens in units of 1/(1e6*den) token, the stamp refill is
-- counted to, and den. In the scripts a state is the table {tokens,
-- stamp}: engine.State's Tokens and Stamp.

-- sluice.ConvertBucket: tokens written under rate denominator from, in
-- units of den (a limit reloaded with another rate keeps its buckets):
-- whole micro-tokens, floored, at most the capacity and at most
-- sluice.MaxDebt in debt, which for the limits this store takes
-- (capacity times den below 2^52, redis.fits) is floor((2^52-1)/den) -
-- cap. Every product stays below 2^52.
local function tb_convert(tokens, from, den, cap)
  local micro = fdiv(tokens, from)
  if micro > cap then micro = cap end
  local most = fdiv(4503599627370495, den) - cap
  if micro < -most then micro = -most end
  return micro * den
end

-- tb_load returns the state and whether it was converted from another
-- rate denominator.
local function tb_load(raw, den, cap)
  if not raw or #raw ~= 24 then return nil end
  local tokens, stamp, d = sunpack('<ddd', raw)
  if d == den then return {tokens, stamp}, false end
  if d <= 0 then return nil end
  return {tb_convert(tokens, d, den, cap), stamp}, true
end

local function tb_dump(st, den)
  return spack('<ddd', st[1], st[2], den)
end

-- Returns allowed (0/1), the new state, tokens left (micro-tokens),
-- retry_after and reset_after (microseconds).
local function tb_take(st, now, cost, reserve, maxres, cap, num, den)
  local full = cap * den
  local tokens, stamp = full, now
  if st then
    tokens, stamp = st[1], st[2]
    if now > stamp then
      if tokens < full then
        -- elapsed*num can pass 2^53; compare elapsed with the time to fill
        -- instead, and multiply only when the product stays below full.
        local e = now - stamp
        if e >= cdiv(full - tokens, num) then
          tokens = full
        else
          tokens = tokens + e * num
        end
      end
      stamp = now
    end
    if tokens > full then tokens = full end
  end
  local lag = stamp - now
  local need = cost * den
  local allowed, retry, reset = 0, 0, 0
  if tokens >= need then
    allowed = 1
    tokens = tokens - need
  elseif reserve and need - tokens <= maxres * den then
    allowed = 1
    tokens = tokens - need
    retry = lag + cdiv(-tokens, num)
  else
    if reserve then need = need - maxres * den end
    retry = lag + cdiv(need - tokens, num)
  end
  if tokens < full then reset = lag + cdiv(full - tokens, num) end
  return allowed, {tokens, stamp}, fdiv(tokens, den), retry, reset
end

-- sluice.RefundTokenBucket: gives cost micro-tokens back (a charge not
-- carried out, or a Cluster TakeAll rolled back). Refill to now exactly as
-- a take, add the scaled cost, cap at full; debt is paid back too. An
-- absent key is full and stays absent (nil state). Returns the state,
-- tokens (micro-tokens) and reset_after.
--
-- A rollback passes tail: the stamp and tokens (micro-tokens, floored)
-- its take left. Reservations are told turns that count every charge
-- before theirs, so while the bucket is in debt a charge is given back
-- only if no charge has come after it (the bucket is where the take
-- left it, refilled to now): given back from under a later reservation,
-- it would let the reservations after the refund take turns that the
-- ones before it already hold. Such a rollback gives nothing back; the
-- bucket refills as if the request had been admitted.
local function tb_refund(st, now, cost, cap, num, den, tail)
  local full = cap * den
  if not st then return nil, cap, 0 end
  local tokens, stamp = st[1], st[2]
  if now > stamp then
    if tokens < full then
      local e = now - stamp
      if e >= cdiv(full - tokens, num) then tokens = full else tokens = tokens + e * num end
    end
    stamp = now
  end
  if tail and tokens < 0 then
    -- Where the take left it, refilled to now: never below the bucket
    -- unless a later charge took more (each is a whole micro-token or
    -- more, the floor's error less than one).
    local was = tail[2] * den
    if now > tail[1] then was = was + (now - tail[1]) * num end
    if tokens < was then
      return {tokens, stamp}, fdiv(tokens, den), stamp - now + cdiv(full - tokens, num)
    end
  end
  -- tokens >= -max_reserved*den and cost <= capacity + max_reserved
  -- (sluice.Request.Charge): the sum stays below 2^53 (see maxLuaScaled)
  tokens = tokens + cost * den
  if tokens > full then tokens = full end
  local reset = 0
  if tokens < full then reset = stamp - now + cdiv(full - tokens, num) end
  return {tokens, stamp}, fdiv(tokens, den), reset
end
