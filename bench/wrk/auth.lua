-- GET /v1/auth with X-User drawn from 10,000 users, as frontdoor-http.yaml
-- keys its rule (bench/wrkpair.sh).
local n = 0
request = function()
  n = (n * 7919 + 13) % 10000
  return wrk.format("GET", "/v1/auth", {["X-User"] = "user-" .. n})
end
