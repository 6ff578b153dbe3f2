package httpgate

import (
	"errors"
	"hash/fnv"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy"
)

// Header sets that the policy's `headers` setting (Settings.Headers) names.
const (
	// SetDraft is RateLimit-Policy and RateLimit as Structured Field lists
	// (draft-ietf-httpapi-ratelimit-headers-11).
	SetDraft = "draft"
	// SetTrio is RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset.
	SetTrio = "trio"
	// SetLegacy is X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset.
	SetLegacy = "legacy"
	// SetNone emits no rate limit fields. Retry-After, X-Sluice-Reason and
	// Cache-Control are still set on rejections: a 429 must say when to
	// retry.
	SetNone = "none"
)

// DefaultSets is what an empty `headers` setting means.
var DefaultSets = []string{SetDraft, SetTrio}

// Reasons of a rejection besides "{algorithm}_exceeded" (see Reason).
const (
	// ReasonStoreUnavailable: the store failed and the rule says
	// on_store_error: deny.
	ReasonStoreUnavailable = "store_unavailable"
	// ReasonCostExceedsLimit: the request's cost is above the limit's
	// burst, so no wait would ever admit it.
	ReasonCostExceedsLimit = "cost_exceeds_limit"
)

// Reason is the X-Sluice-Reason of a rejection by a limit of algorithm a:
// "token_bucket_exceeded", "fixed_window_exceeded", "sliding_log_exceeded"
// or "leaky_bucket_exceeded".
func Reason(a sluice.Algorithm) string { return a.String() + "_exceeded" }

// ResultReason says why r rejected: Reason of its algorithm,
// ReasonStoreUnavailable or ReasonCostExceedsLimit; "" when it admitted or
// when it would have admitted and was rejected only with the others of an
// all-or-nothing request. For a shadow-mode result it says why enforcing
// would have rejected.
func ResultReason(r *policy.Result) string {
	switch {
	case !r.Violated || r.Match.Request.Limit == nil:
		return ""
	case r.StoreErr != nil:
		return ReasonStoreUnavailable
	case costExceeds(r):
		return ReasonCostExceedsLimit
	}
	return Reason(r.Match.Request.Limit.Algorithm())
}

// Violated reports whether r is a cause of its request's rejection, as
// opposed to a limit that had room but was not charged because another
// limit of the all-or-nothing request rejected (policy.Result.Violated).
func Violated(r *policy.Result) bool { return r.Violated && r.Match.Request.Limit != nil }

func costExceeds(r *policy.Result) bool {
	_, err := r.Match.Request.Limit.Cost(costOf(r.Match.Request))
	return errors.Is(err, sluice.ErrCostExceedsLimit)
}

// Effective is r's decision as the client should see it. A limit that had
// room in a rejected all-or-nothing request reports what the store
// answered for the take it did not make (its tokens after the cost); its
// state is untouched, so the tokens left and the time to full are
// reported before the cost.
func Effective(r *policy.Result) sluice.Decision {
	d := r.Decision
	if d.Allowed || Violated(r) || r.Match.Request.Limit == nil {
		return d
	}
	lim := r.Match.Request.Limit
	cost := costOf(r.Match.Request)
	d.Tokens += cost
	d.Remaining = min(int64(math.Floor(d.Tokens+1e-9)), d.Limit)
	// A bucket refills continuously: it is full cost/rate sooner than the
	// store's answer says. A window refills at its boundaries, which the
	// cost does not move, so its answer stands (at worst a window late).
	if rate := lim.TokensPerSecond(); lim.Params().RateDen > 0 && rate > 0 {
		d.ResetAfter = max(0, d.ResetAfter-time.Duration(cost/rate*float64(time.Second)))
	}
	return d
}

func costOf(r sluice.Request) float64 {
	if r.Cost == 0 {
		return 1
	}
	return r.Cost
}

// VerdictReason says why v rejected: the reason of the enforce-mode
// rejection with the longest wait (the one v.Overall reports); "" when v
// admitted.
func VerdictReason(v *policy.Verdict) string {
	if v.Allowed {
		return ""
	}
	reason, wait := "", time.Duration(-1)
	for i := range v.Results {
		r := &v.Results[i]
		if r.Shadow || !Violated(r) {
			continue
		}
		if r.Decision.RetryAfter > wait || r.Decision.Rule == v.Overall.Rule && r.Decision.RetryAfter == wait {
			reason, wait = ResultReason(r), r.Decision.RetryAfter
		}
	}
	if reason == "" {
		reason = "rate_limited"
	}
	return reason
}

// Identity is the seed of a client's Retry-After jitter for v: the
// Identity of its first match (the verified JWT subject, else the client
// IP).
func Identity(v *policy.Verdict) string {
	for i := range v.Results {
		if id := v.Results[i].Match.Identity; id != "" {
			return id
		}
	}
	return ""
}

// RateLimitHeaders builds the response fields for a verdict: the ones every
// request-shaped path (forward auth, proxy, middleware, and Envoy's
// response_headers_to_add) sends, so that all of them answer alike.
//
// identity and path seed the Retry-After jitter: pass Identity(&v) (or a
// match's Identity) and the request path. sets picks the header sets
// (Settings.Headers: SetDraft, SetTrio, SetLegacy, SetNone); empty means
// DefaultSets.
//
//   - draft: RateLimit-Policy: "per-ip";q=20;w=2 and RateLimit:
//     "per-ip";r=19;t=1 (draft-ietf-httpapi-ratelimit-headers-11), one
//     list item per enforce-mode limit, named by the limit (a tier's limit
//     is "RULE.TIER"). q is the burst or capacity, w the seconds it takes
//     to refill from empty (the period for windows and logs), r the whole
//     tokens left (0 on rejection) and t the seconds until the limit
//     admits again when it rejected, else until it is full.
//   - trio: RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset with the
//     same values for the limit closest to rejecting (v.Overall).
//   - legacy: the trio named X-RateLimit-Limit, -Remaining, -Reset.
//
// Shadow-mode limits and limits whose store failed contribute nothing. On
// rejection it adds Retry-After (whole seconds with jitter, see
// RetryAfterSeconds), X-Sluice-Reason (see VerdictReason) and
// Cache-Control: no-store, whatever the sets. The status code and body
// are the caller's to write (see WriteRejection).
func RateLimitHeaders(v policy.Verdict, identity, path string, sets []string) http.Header {
	h := make(http.Header, 8)
	setRateLimitHeaders(h, &v, identity, path, sets)
	return h
}

// Canonical forms of the field names, so that setting them allocates
// nothing (http.Header.Set would canonicalize "RateLimit-Policy" anew each
// time).
const (
	hPolicy         = "Ratelimit-Policy"
	hRateLimit      = "Ratelimit"
	hLimit          = "Ratelimit-Limit"
	hRemaining      = "Ratelimit-Remaining"
	hReset          = "Ratelimit-Reset"
	hLegacyLimit    = "X-Ratelimit-Limit"
	hLegacyRemain   = "X-Ratelimit-Remaining"
	hLegacyReset    = "X-Ratelimit-Reset"
	hRetryAfter     = "Retry-After"
	hReason         = "X-Sluice-Reason"
	hCacheControl   = "Cache-Control"
	headerListDelim = ", "
)

// Field is one response header field, its name in canonical form.
type Field struct{ Name, Value string }

// maxFields bounds what AppendRateLimitFields adds: draft (2), trio (3),
// legacy (3) and the three of a rejection.
const maxFields = 11

// AppendRateLimitFields appends the fields of RateLimitHeaders to dst, in
// a fixed order, for a caller that sends them in another form than
// http.Header (Envoy's response_headers_to_add): with room in dst it
// allocates only the values' strings.
func AppendRateLimitFields(dst []Field, v *policy.Verdict, identity, path string, sets []string) []Field {
	if len(sets) == 0 {
		sets = DefaultSets
	}
	var draft, trio, legacy bool
	for _, s := range sets {
		switch s {
		case SetDraft:
			draft = true
		case SetTrio:
			trio = true
		case SetLegacy:
			legacy = true
		}
	}
	var pol, state []byte
	enforced := 0
	for i := range v.Results {
		r := &v.Results[i]
		lim := r.Match.Request.Limit
		if r.Shadow || r.StoreErr != nil || lim == nil {
			continue
		}
		enforced++
		if draft {
			d := Effective(r)
			viol := Violated(r)
			if len(pol) > 0 {
				pol = append(pol, headerListDelim...)
				state = append(state, headerListDelim...)
			}
			pol = appendSFString(pol, lim.Name())
			pol = strconv.AppendInt(append(pol, ";q="...), d.Limit, 10)
			pol = strconv.AppendInt(append(pol, ";w="...), windowSeconds(lim), 10)
			state = appendSFString(state, lim.Name())
			state = strconv.AppendInt(append(state, ";r="...), remaining(d, viol), 10)
			state = strconv.AppendInt(append(state, ";t="...), resetSeconds(d, viol), 10)
		}
	}
	if len(pol) > 0 {
		dst = append(dst, Field{hPolicy, string(pol)}, Field{hRateLimit, string(state)})
	}
	if enforced > 0 && (trio || legacy) {
		d := v.Overall
		var buf [64]byte
		nums := strconv.AppendInt(buf[:0], d.Limit, 10)
		n1 := len(nums)
		nums = strconv.AppendInt(nums, remaining(d, !v.Allowed), 10)
		n2 := len(nums)
		nums = strconv.AppendInt(nums, resetSeconds(d, !v.Allowed), 10)
		all := string(nums)
		limit, rem, reset := all[:n1], all[n1:n2], all[n2:]
		if trio {
			dst = append(dst, Field{hLimit, limit}, Field{hRemaining, rem}, Field{hReset, reset})
		}
		if legacy {
			dst = append(dst, Field{hLegacyLimit, limit}, Field{hLegacyRemain, rem}, Field{hLegacyReset, reset})
		}
	}
	if !v.Allowed {
		dst = append(dst,
			Field{hRetryAfter, strconv.FormatInt(RetryAfterSeconds(v.Overall.RetryAfter, identity, path), 10)},
			Field{hReason, VerdictReason(v)},
			Field{hCacheControl, "no-store"})
	}
	return dst
}

// setRateLimitHeaders is RateLimitHeaders writing into h.
func setRateLimitHeaders(h http.Header, v *policy.Verdict, identity, path string, sets []string) {
	var buf [maxFields]Field
	fs := AppendRateLimitFields(buf[:0], v, identity, path, sets)
	// One backing array for every value.
	vals := make([]string, len(fs))
	for i, f := range fs {
		vals[i] = f.Value
		h[f.Name] = vals[i : i+1 : i+1]
	}
}

// violated lists the enforce-mode limits that rejected (or denied on a
// store failure), for the problem body.
func violated(v *policy.Verdict) []string {
	var names []string
	for i := range v.Results {
		r := &v.Results[i]
		if !r.Shadow && Violated(r) {
			names = append(names, r.Match.Request.Limit.Name())
		}
	}
	return names
}

// RetryAfterSeconds is the Retry-After for a wait: ceil(wait) in whole
// seconds (at least 1) plus a jitter of 0 to 50% of that, chosen by a hash
// of identity and path. The same client asking for the same path always
// gets the same offset, so its retries stay predictable, while clients
// rejected together come back spread over time instead of as one herd. It
// is never earlier than the wait.
func RetryAfterSeconds(wait time.Duration, identity, path string) int64 {
	base := ceilSeconds(wait)
	if base < 1 {
		base = 1
	}
	h := fnv.New64a()
	h.Write([]byte(identity))
	h.Write([]byte{0})
	h.Write([]byte(path))
	span := uint64(base/2) + 1 // offsets 0..floor(base/2)
	return base + int64(h.Sum64()%span)
}

// remaining is the draft's r: zero for a limit that rejected, never
// negative.
func remaining(d sluice.Decision, rejected bool) int64 {
	if rejected || d.Remaining < 0 {
		return 0
	}
	return d.Remaining
}

// resetSeconds is the draft's t: when a limit that rejected admits the
// request again, else when the bucket is full again.
func resetSeconds(d sluice.Decision, rejected bool) int64 {
	if rejected {
		return max(ceilSeconds(d.RetryAfter), 1)
	}
	return ceilSeconds(d.ResetAfter)
}

// windowSeconds is the draft's w: the period in which the quota q is
// granted. For a bucket that is the time to refill from empty to full.
func windowSeconds(l *sluice.Limit) int64 {
	p := l.Params()
	switch l.Algorithm() {
	case sluice.FixedWindow, sluice.SlidingLog:
		return max(ceilSeconds(sluice.Duration(p.Period)), 1)
	}
	rate := l.TokensPerSecond() // micro-tokens per microsecond = tokens per second
	if rate <= 0 {
		return 1
	}
	w := math.Ceil(l.Capacity()/rate - 1e-9)
	if w < 1 {
		return 1
	}
	if w > math.MaxInt32 {
		return math.MaxInt32
	}
	return int64(w)
}

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// appendSFString appends s as a Structured Field sf-string (RFC 9651):
// printable ASCII, with quote and backslash escaped. Other bytes cannot be
// expressed and become '?'; rule names are plain identifiers in practice.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
