package policy

import (
	"cmp"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// What a client is told about a Verdict, whichever transport carries it:
// the HTTP paths (httpgate) write these fields as http.Header and a
// problem+json body, the Envoy service (envoyrls) as
// response_headers_to_add. Keeping them here, beside Enforce, is what
// makes every path answer alike.

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
// "token_bucket_exceeded", "fixed_window_exceeded", "sliding_log_exceeded",
// "leaky_bucket_exceeded" or "concurrency_exceeded".
func Reason(a sluice.Algorithm) string { return a.String() + "_exceeded" }

// Refused reports whether r is a cause of its request's rejection
// (Violated), as opposed to a limit that had room but was not charged
// because another limit of the all-or-nothing request rejected.
func (r *Result) Refused() bool { return r.Violated && r.Match.Request.Limit != nil }

// Reason says why r rejected: Reason of its algorithm,
// ReasonStoreUnavailable, ReasonCostExceedsLimit, ReasonQueueFull or
// ReasonQueueDelayExceeded; "" when it admitted or
// when it would have admitted and was rejected only with the others of an
// all-or-nothing request. For a shadow-mode result it says why enforcing
// would have rejected.
func (r *Result) Reason() string {
	switch {
	case !r.Refused():
		return ""
	case r.StoreErr != nil:
		return ReasonStoreUnavailable
	case r.impossible:
		return ReasonCostExceedsLimit
	case r.unsupported:
		return ReasonConcurrencyUnsupported
	case r.Match.queueFull:
		return ReasonQueueFull
	case r.Match.queueDelayBinds():
		return ReasonQueueDelayExceeded
	}
	return Reason(r.Match.Request.Limit.Algorithm())
}

// Effective is r's decision as the client should see it. Stores answer
// with what a take leaves. taken says that answer stands: the take was
// made, or the caller reports what it would leave (a peek of the decision
// API). Otherwise (a limit that had room in a rejected all-or-nothing
// request, or an Envoy check of hits_addend 0) the cost is still in the
// bucket: the tokens left and the time to full are reported before it.
// A limit that refused, or whose store failed, is reported as decided.
func (r *Result) Effective(taken bool) sluice.Decision {
	d := r.Decision
	lim := r.Match.Request.Limit
	if taken || r.Violated || r.StoreErr != nil || lim == nil {
		return d
	}
	cost := engine.FromMicroTokens(r.cost)
	d.Tokens += cost / r.Match.Scale() // in the rule's units, as unscale reports them
	d.Remaining = min(int64(math.Floor(math.Max(0, d.Tokens)+1e-9)), d.Capacity)
	// A bucket refills continuously: it is full cost/rate sooner than the
	// store's answer says. A window refills at its boundaries, which the
	// cost does not move, so its answer stands (at worst a window late).
	if rate := lim.TokensPerSecond(); lim.Params().RateDen > 0 && rate > 0 {
		d.ResetAfter = max(0, d.ResetAfter-time.Duration(cost/rate*float64(time.Second)))
	}
	return d
}

// Impossible reports whether an enforce-mode limit of a rejected v can
// never admit its request as asked (ReasonCostExceedsLimit): no wait would
// let it through, so it is answered as the decision API answers such a
// take (422, and no Retry-After), never as a 429 that a client obeying
// Retry-After would retry forever. detail says which limits and why.
func (v *Verdict) Impossible() (detail string, names []string, ok bool) {
	if v.Allowed {
		return "", nil, false
	}
	for i := range v.Results {
		r := &v.Results[i]
		if r.Shadow || !r.Refused() || !r.impossible {
			continue
		}
		names = append(names, r.Match.Request.Limit.Name())
		why := fmt.Sprintf("limit %q: the request's cost is above what it can ever grant", r.Match.Request.Limit.Name())
		if r.refusal != nil {
			why = r.refusal.Error()
		}
		if detail != "" {
			detail += "; "
		}
		detail += why
	}
	return detail, names, names != nil
}

// markCostExceedsLimit records that r's request asked a cost its limit
// can never grant, for a part judged without Enforce (Parts.Add: the Envoy
// service peeks such a descriptor): Reason and Impossible then say so, and
// AppendFields sets no Retry-After.
func (r *Result) markCostExceedsLimit() {
	if !r.Shadow {
		r.impossible, r.Violated = true, true
	}
}

// Reason says why v rejected: the reason of the enforce-mode rejection
// with the longest wait (the one v.Overall reports), cost_exceeds_limit
// when one can never admit it (see Impossible); "" when v admitted.
func (v *Verdict) Reason() string {
	if v.Allowed {
		return ""
	}
	if _, _, never := v.Impossible(); never {
		return ReasonCostExceedsLimit
	}
	reason, wait := "", time.Duration(-1)
	for i := range v.Results {
		r := &v.Results[i]
		if r.Shadow || !r.Refused() {
			continue
		}
		if r.Decision.RetryAfter > wait || r.Decision.Rule == v.Overall.Rule && r.Decision.RetryAfter == wait {
			reason, wait = r.Reason(), r.Decision.RetryAfter
		}
	}
	reason = cmp.Or(reason, "rate_limited")
	return reason
}

// Identity is the seed of a client's Retry-After jitter for v: the
// Identity of its first match (the verified JWT subject, else the client
// IP).
func (v *Verdict) Identity() string {
	for i := range v.Results {
		if id := v.Results[i].Match.Identity; id != "" {
			return id
		}
	}
	return ""
}

// Violations names the enforce-mode limits that rejected v (or denied on
// a store failure), and the detail of a problem report that lists them.
func (v *Verdict) Violations() (detail string, names []string) {
	for i := range v.Results {
		r := &v.Results[i]
		if !r.Shadow && r.Refused() {
			names = append(names, r.Match.Request.Limit.Name())
		}
	}
	detail = "rate limit exceeded"
	for i, n := range names {
		if i == 0 {
			detail += ": "
		} else {
			detail += ", "
		}
		detail += strconv.Quote(n)
	}
	return detail, names
}

// Canonical forms of the field names (http.CanonicalHeaderKey's), so that
// an http.Header built from them needs no canonicalizing.
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

// MaxFields bounds what AppendFields adds: draft (2), trio (3), legacy (3)
// and the three of a rejection.
const MaxFields = 11

// AppendFields appends to dst the response fields for v, in a fixed
// order: the ones every request-shaped path (forward auth, proxy,
// middleware, and Envoy's response_headers_to_add) sends, so that all of
// them answer alike. With room in dst it allocates only the values'
// strings.
//
// identity and path seed the Retry-After jitter: pass v.Identity() (or a
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
//     admits again when it rejected, else until it is full. Each limit is
//     reported as Effective(its Decision.Allowed) says.
//   - trio: RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset with the
//     same values for the limit closest to rejecting (v.Overall).
//   - legacy: the trio named X-RateLimit-Limit, -Remaining, -Reset.
//
// Shadow-mode limits and limits whose store failed contribute nothing. On
// rejection it adds Retry-After (whole seconds with jitter, see
// RetryAfterSeconds), X-Sluice-Reason (see Verdict.Reason) and
// Cache-Control: no-store, whatever the sets; a rejection no wait ends
// (Verdict.Impossible) gets no Retry-After.
func AppendFields(dst []Field, v *Verdict, identity, path string, sets []string) []Field {
	draft, trio, legacy := pickSets(sets)
	var polBuf, stateBuf [128]byte
	pol, state := polBuf[:0], stateBuf[:0]
	enforced := 0
	for i := range v.Results {
		r := &v.Results[i]
		lim := r.Match.Request.Limit
		if r.Shadow || r.StoreErr != nil || lim == nil {
			continue
		}
		enforced++
		if !draft {
			continue
		}
		d, refused := r.Effective(r.Decision.Allowed), r.Refused()
		if len(pol) > 0 {
			pol = append(pol, headerListDelim...)
			state = append(state, headerListDelim...)
		}
		if lf := r.Match.v.fields(lim, d.Capacity); lf != nil {
			pol = append(pol, lf.item...)
			state = append(state, lf.name...)
		} else {
			pol = appendPolicyItem(pol, lim, d.Capacity, windowSeconds(lim))
			state = appendSFString(state, lim.Name())
		}
		state = strconv.AppendInt(append(state, ";r="...), remaining(d, refused), 10)
		state = strconv.AppendInt(append(state, ";t="...), resetSeconds(d, refused), 10)
	}
	// Every value so far is cut from one string: one allocation for the
	// lot rather than one per field.
	var buf [256]byte
	all := append(append(buf[:0], pol...), state...)
	np := len(pol)
	var n1, n2 int
	nums := enforced > 0 && (trio || legacy)
	if nums {
		d := v.Overall
		all = strconv.AppendInt(all, d.Capacity, 10)
		n1 = len(all)
		all = strconv.AppendInt(all, remaining(d, !v.Allowed), 10)
		n2 = len(all)
		all = strconv.AppendInt(all, resetSeconds(d, !v.Allowed), 10)
	}
	vals := string(all)
	if len(pol) > 0 {
		dst = append(dst, Field{hPolicy, vals[:np]}, Field{hRateLimit, vals[np : np+len(state)]})
	}
	if nums {
		limit, rem, reset := vals[np+len(state):n1], vals[n1:n2], vals[n2:]
		if trio {
			dst = append(dst, Field{hLimit, limit}, Field{hRemaining, rem}, Field{hReset, reset})
		}
		if legacy {
			dst = append(dst, Field{hLegacyLimit, limit}, Field{hLegacyRemain, rem}, Field{hLegacyReset, reset})
		}
	}
	if _, _, never := v.Impossible(); never {
		// No wait admits it: a Retry-After would have an obedient client
		// retry forever.
		dst = append(dst, Field{hReason, v.Reason()}, Field{hCacheControl, "no-store"})
	} else if !v.Allowed {
		dst = append(dst,
			Field{hRetryAfter, strconv.FormatInt(v.retryAfterSeconds(identity, path), 10)},
			Field{hReason, v.Reason()},
			Field{hCacheControl, "no-store"})
	}
	return dst
}

// pickSets reads Settings.Headers.
func pickSets(sets []string) (draft, trio, legacy bool) {
	if len(sets) == 0 {
		sets = DefaultSets
	}
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
	return draft, trio, legacy
}

// RetryAfterSeconds is the Retry-After for a wait: ceil(wait) in whole
// seconds (at least 1) plus a jitter of 0 to 50% of that, chosen by a hash
// of identity and path. The same client asking for the same path always
// gets the same offset, so its retries stay predictable, while clients
// rejected together come back spread over time instead of as one herd. It
// is never earlier than the wait. The offset is engine.Spread's, the one
// jitter of sluice.
func RetryAfterSeconds(wait time.Duration, identity, path string) int64 {
	base := max(ceilSeconds(wait), 1)
	return base + int64(engine.Spread(uint64(base/2), identity, path))
}

// retryAfterSeconds is the Retry-After of a rejected v. When the limit
// that decided it has a jitter of its own (sluice.Spec.Jitter), the
// decision's wait carries it already, as the decision API's retry_after_ms
// and the RateLimit t do: the header says the same, rounded up to whole
// seconds, and adds none of RetryAfterSeconds' own.
func (v *Verdict) retryAfterSeconds(identity, path string) int64 {
	for i := range v.Results {
		r := &v.Results[i]
		if !r.Shadow && r.Refused() && r.StoreErr == nil && r.Decision.Rule == v.Overall.Rule && r.Match.Request.Limit.Spec().Jitter > 0 {
			return max(ceilSeconds(v.Overall.RetryAfter), 1)
		}
	}
	return RetryAfterSeconds(v.Overall.RetryAfter, identity, path)
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
	case sluice.FixedWindow, sluice.SlidingLog, sluice.SlidingWindow, sluice.Concurrency:
		// A concurrency limit's quota is slots, not tokens over time; the
		// lease is the most a slot stays held without its holder.
		return max(ceilSeconds(engine.Duration(p.Period)), 1)
	}
	rate := l.TokensPerSecond() // micro-tokens per microsecond = tokens per second
	if rate <= 0 {
		return 1
	}
	return int64(min(max(math.Ceil(l.Capacity()/rate-1e-9), 1), math.MaxInt32))
}

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// appendPolicyItem appends lim's RateLimit-Policy item: its name, quota q
// and window w.
func appendPolicyItem(b []byte, lim *sluice.Limit, q, w int64) []byte {
	b = appendSFString(b, lim.Name())
	b = strconv.AppendInt(append(b, ";q="...), q, 10)
	return strconv.AppendInt(append(b, ";w="...), w, 10)
}

// limitFields is how a limit's items in RateLimit-Policy and RateLimit
// begin, formatted once rather than for every response: its name as an
// sf-string, and its whole policy item for the quota and window it was
// made with. Both stay as they are for most limits, but an adaptive rate
// moves the window, so the item is used only while they are the same.
type limitFields struct {
	name string // "name"
	item string // "name";q=Q;w=W
	q, w int64
}

// fields returns the formatted fields of v's limit lim for a decision of
// quota q, or nil when v is nil (a Match built by hand) or is not lim's.
func (v *variant) fields(lim *sluice.Limit, q int64) *limitFields {
	if v == nil || v.limit != lim {
		return nil
	}
	w := windowSeconds(lim)
	if lf := v.formatted.Load(); lf != nil && lf.q == q && lf.w == w {
		return lf
	}
	lf := &limitFields{name: string(appendSFString(nil, lim.Name())), item: string(appendPolicyItem(nil, lim, q, w)), q: q, w: w}
	v.formatted.Store(lf)
	return lf
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

// StoreErrorLog logs store failures at most once a second. During an
// outage every request fails alike: a line per request would bury the log
// and cost the CPU the fallback needs, while sluice_decisions_total
// {result="store_error"} counts them all. The zero value is ready to use.
type StoreErrorLog struct {
	last atomic.Int64 // Unix second of the last line
}

// Log writes one warning for a failed store call of limit, unless one was
// written this second.
func (l *StoreErrorLog) Log(logger *slog.Logger, limit, key string, err error, denied bool) {
	now, last := time.Now().Unix(), l.last.Load()
	if now == last || !l.last.CompareAndSwap(last, now) {
		return
	}
	logger.Warn("store error (logged at most once a second; see sluice_decisions_total{result=\"store_error\"})",
		"limit", limit, "key", key, "err", err, "denied", denied)
}
