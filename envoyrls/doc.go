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
// entries select rules. A Server finds them with the Matcher of the
// policy in force: with a sluice policy, every rule whose match holds
// (match on domain and on descriptor:KEY values) applies, keyed by its
// limit_keys (descriptor:KEY, or descriptor for the whole descriptor);
// with a file in the reference server's format, its *Reference finds them
// as that server does (below). Either way the limits found are decided
// with policy.Enforce, and what the caller is told (reasons, the
// RateLimit headers, Retry-After) is what package policy tells every
// transport.
//
// The cost of a descriptor is its own hits_addend when set, else
// max(1, the request's hits_addend). A hits_addend of 0 checks without
// charging: the descriptor is answered as a peek for one request, and if
// that peek fails the call is OVER_LIMIT and nothing is charged (the peek
// and the charge of the others are two store calls, so the peek may be a
// moment stale).
//
// is_negative_hits is a refund, and a refund refills any bucket the
// caller names, so it is honoured only when the policy's settings allow
// it (allow_negative_hits; a reference-format file never does). Otherwise
// the call is answered codes.InvalidArgument before any store call: it
// charges and refunds nothing. When allowed, it gives hits_addend tokens
// back to every limit the descriptor matches (engine.OpRefund), never
// above a limit's capacity; such a descriptor is always OK, and its status
// describes the bucket after the refund.
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
// unit_multiplier 10. limit_remaining is the whole tokens left, 0 for an
// OVER_LIMIT descriptor.
//
// duration_until_reset is always whole seconds, as the reference server
// answers (Envoy builds X-RateLimit-Reset from them). A window with a
// fixed start, as every limit of the reference format has, resets at the
// end of the current window whatever its count: unit - now%unit seconds
// with now in whole Unix seconds (the reference's CalculateReset), which
// is the time left rounded up, from 1 up to the whole unit (times
// unit_multiplier). Every other limit resets when its bucket is full
// again: that time rounded up to a whole second, at least 1 while the
// bucket is not full and 0 when it is. A descriptor no rule applies to is
// OK with no current_limit and no duration_until_reset.
//
// response_headers_to_add carries the RateLimit headers of the HTTP API
// (RateLimit-Policy and RateLimit, RateLimit-Limit/-Remaining/-Reset, and
// Retry-After when over the limit), for OK and OVER_LIMIT alike, with the
// statuses' numbers: RateLimit-Reset and t= are duration_until_reset's
// seconds (for a rejected token bucket, as on HTTP, the seconds until it
// admits the request). A limit of 0 requests has no bucket: alone in a
// call it brings Retry-After but no RateLimit fields.
//
// # The reference server's configuration
//
// ParseReferenceConfig reads the reference server's YAML (IsReferenceConfig
// tells it from sluice's own format) into a policy, with the file's
// *Reference kept for it by this package, and a Server given that policy
// enforces it with the semantics that file promises. Such a file has no settings: as with
// the reference server, its environment names the store (REDIS_URL,
// REDIS_AUTH) and the gRPC address (GRPC_HOST, GRPC_PORT), read by
// ReferenceEnv. Parser is the parse function for a file in either format
// (a policy.File's Parse), with those variables applied:
//
//   - domain: descriptors apply only to calls with that domain. Several
//     YAML documents in one file configure several domains.
//   - descriptors: key, value: a tree. A call's descriptor walks it entry
//     by entry, at each level preferring "key: value" exactly, then the
//     first wildcard value that matches ("api/*", "a*b": a * is any bytes),
//     then the bare key (any value). The limit applies only when the node
//     reached by the last entry has a rate_limit: a descriptor longer or
//     shorter than the configured path is not limited.
//   - rate_limit: {unit, requests_per_unit}: a sluice fixed window of one
//     unit (second, minute, hour, day, week, month = 30 days, year = 365
//     days; times unit_multiplier) holding requests_per_unit, with windows
//     aligned to the Unix epoch like the reference server's. There is a
//     bucket per value of every entry of the descriptor, so "remote_address"
//     without a value limits each address on its own.
//     requests_per_unit: 0 rejects every request.
//   - unlimited: true: never limited (limit_remaining is the maximum).
//   - shadow_mode: true: a shadow-mode rule, counted but never rejecting.
//   - quota_mode: true: a quota descriptor. Over its limit it is
//     OVER_LIMIT in its status, but fails the call only when every quota
//     descriptor of the call is over; an admitted call charges its other
//     descriptors and leaves it as it stands. The environment's
//     QUOTA_MODE makes every descriptor one, SHADOW_MODE answers every
//     call OK overall (Modes; ReadReferenceEnv reads the whole
//     environment, ReferenceEnvVars says what each variable does).
//   - replaces: [{name}]: a limit named in another applicable limit's
//     replaces does not apply to the call.
//   - share_threshold: every value matching the wildcard counts as one, in
//     the limit of that descriptor and in those nested under it.
//   - name: reported as current_limit.name.
//   - detailed_metric, value_to_metric: accepted; they only shape the
//     reference server's statistics.
//   - A descriptor's own limit override (RateLimitDescriptor.limit) replaces
//     the configured limit, counted per domain as in the reference server.
//
// Unknown keys are errors, as they are for the reference server. Where the
// reference server counts every descriptor even when another rejects the
// call, sluice charges none of them: the reference run with
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true matches sluice's
// all-or-nothing behaviour, except that it still adds a rejected
// descriptor's hits to that descriptor's own count (sluice adds nothing),
// and that a shadow-mode descriptor over its limit stops it from counting
// the other descriptors of an admitted call (sluice counts them). The
// reference adds no response headers unless asked to; a store failure
// fails its call, where sluice follows on_store_error. sluice's own format
// can say more: token buckets, any period (not only whole units), burst
// above the rate, rollover, tiers, per-rule on_store_error, and costs from headers.
//
// # Building
//
// go-control-plane ships generated marshalling code (vtprotobuf) for its
// messages behind the build tag vtprotobuf. In a binary built with it
// (go build -tags vtprotobuf, as the container image is), ServerOptions
// marshals the responses with that code, which takes the floor of a call
// down by a microsecond or two; without it, the server uses grpc-go's
// proto codec. Either writes the same messages.
package envoyrls
