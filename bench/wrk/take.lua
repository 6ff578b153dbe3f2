-- POST /v1/take of the per-user rule for one of 10,000 users
-- (bench/wrkpair.sh).
local n = 0
request = function()
  n = (n * 7919 + 13) % 10000
  return wrk.format("POST", "/v1/take", {["Content-Type"] = "application/json"},
    '{"rule":"per-user","key":"user-' .. n .. '"}')
end
