// Package envoyrls serves Envoy's global rate limit protocol,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, over a
// sluice Limiter: a drop-in for envoyproxy/ratelimit (the reference
// server) that Envoy, Istio, Emissary, Gloo and Contour can point at by
// changing one address. Server.Register also adds the standard gRPC health
// service and server reflection.
//
// # Descriptors to rules
//
// For each descriptor of a call, the request's domain and the descriptor's
// entries select rules: with a sluice policy, every rule whose match holds
// (match on domain and on descriptor:KEY values) applies, keyed by its
// limit_keys (descriptor:KEY, or descriptor for the whole descriptor).
//
// The cost of a descriptor is its own hits_addend when set, else
// max(1, the request's hits_addend). A hits_addend of 0 checks without
// charging: the descriptor is answered as a peek for one request, and if
// that peek fails the call is OVER_LIMIT and nothing is charged (the peek
// and the charge of the others are two store calls, so the peek may be a
// moment stale). is_negative_hits gives hits_addend tokens back to every
// limit the descriptor matches (sluice.OpRefund), never above a limit's
// capacity; such a descriptor is always OK, and its status describes the
// bucket after the refund.
//
// All descriptors of one call are all-or-nothing, unlike the reference
// server: the enforce-mode limits of every charged descriptor go to the
// store in one policy.Enforce (one TakeAll), so when any of them is over
// its limit, none is charged. Shadow-mode rules are decided and counted
// but never make the answer OVER_LIMIT. A store failure follows each
// rule's on_store_error (allow: admitted, nothing charged; deny: over
// limit), so Envoy's failure_mode_deny only matters when sluice itself is
// unreachable.
//
// # The answer
//
// overall_code is OK or OVER_LIMIT. There is exactly one status per
// descriptor: OVER_LIMIT only for a descriptor whose own limit rejected
// (the others of a rejected call are OK, and their limit_remaining shows
// that nothing was taken from them). current_limit names the limit that
// speaks for the descriptor (the rejecting one, else the one closest to
// rejecting) in the unit that says it best: a rule of 600 per minute is
// 600/MINUTE, not 10/SECOND; 100 per 10 minutes is 100/MINUTE with
// unit_multiplier 10. limit_remaining is the whole tokens left and
// duration_until_reset the time until the bucket is full again (for
// windows with a fixed start, such as the reference format's, the time to
// the end of the current window, as the reference server reports it). A
// descriptor no rule applies to is OK with no current_limit.
// response_headers_to_add carries the RateLimit headers of the HTTP API
// (RateLimit-Policy and RateLimit, RateLimit-Limit/-Remaining/-Reset, and
// Retry-After when over the limit), for OK and OVER_LIMIT alike.
//
// # The reference server's configuration
//
// ParseReferenceConfig reads the reference server's YAML (IsReferenceConfig
// tells it from sluice's own format) and enforces it with the semantics
// that file promises:
//
//   - domain: descriptors apply only to calls with that domain. Several
//     YAML documents in one file configure several domains.
//   - descriptors: key, value: a tree. A call's descriptor walks it entry
//     by entry, at each level preferring "key: value" exactly, then the
//     first wildcard value "prefix*" that matches, then the bare key (any
//     value). The limit applies only when the node reached by the last
//     entry has a rate_limit: a descriptor longer or shorter than the
//     configured path is not limited.
//   - rate_limit: {unit, requests_per_unit}: a sluice fixed window of one
//     unit (second, minute, hour, day, week, month = 30 days, year = 365
//     days; times unit_multiplier) holding requests_per_unit, with windows
//     aligned to the Unix epoch like the reference server's. There is a
//     bucket per value of every entry of the descriptor, so "remote_address"
//     without a value limits each address on its own.
//     requests_per_unit: 0 rejects every request.
//   - unlimited: true: never limited (limit_remaining is the maximum).
//   - shadow_mode: true: a shadow-mode rule, counted but never rejecting.
//   - replaces: [{name}]: a limit named in another applicable limit's
//     replaces does not apply to the call.
//   - share_threshold: every value matching the wildcard shares one bucket.
//   - name: reported as current_limit.name.
//   - detailed_metric, value_to_metric: accepted; they only shape the
//     reference server's statistics.
//   - A descriptor's own limit override (RateLimitDescriptor.limit) replaces
//     the configured limit, as in the reference server.
//
// Unknown keys are errors, as they are for the reference server. Where the
// reference server counts every descriptor even when another rejects the
// call, sluice charges none of them. sluice's own format can say more:
// token buckets, any period (not only whole units), burst above the rate,
// rollover, tiers, per-rule on_store_error, and costs from headers.
package envoyrls
