package policy

import (
	"time"

	"github.com/sluicehq/sluice"
)

// Parts is what a client is told about a request decided in parts, each
// part by its own Enforce (the descriptors of an Envoy rate limit call,
// grouped by how their costs apply): every part's results as their
// buckets stand after the whole request, and AppendFields over them as
// over one Verdict. A transport keeps a Parts per request in flight and
// reuses its memory: Reset starts the next request.
type Parts struct {
	v       Verdict
	blocked []blocked
	enf     []sluice.Decision
}

// blocked is a rejection with no bucket, added when Results had at
// results: Overall combines the decisions in the order they were added.
type blocked struct {
	at int
	d  sluice.Decision
}

// Reset starts the answer to a request that allowed says was admitted or
// not, in the memory of the last one, which it overwrites rather than
// clears (clearing pointers costs a write barrier per word while the
// collector runs).
func (ps *Parts) Reset(allowed bool) {
	ps.v = Verdict{Allowed: allowed, Results: ps.v.Results[:0]}
	ps.blocked = ps.blocked[:0]
}

// Add adds the results rrs of one part, as their buckets stand after the
// request: charged says the part's decisions charged their buckets (or
// refunded them), so each result's decision is Effective(charged). Only
// the limits that caused a rejection are Violated; exceeds says the part
// asked a cost beyond what an enforce-mode limit of it can ever hold,
// which rejects it with no wait that would admit it (no Retry-After). Each
// decision's Allowed is then !Violated. Add returns the results added,
// which the caller may still change (a protocol's rounding of the waits)
// before AppendFields.
func (ps *Parts) Add(rrs []Result, charged, exceeds bool) []Result {
	start := len(ps.v.Results)
	for _, rr := range rrs {
		rr.Decision = rr.Effective(charged)
		if exceeds {
			rr.markCostExceedsLimit()
		}
		rr.Decision.Allowed = !rr.Violated
		ps.v.Results = append(ps.v.Results, rr)
	}
	return ps.v.Results[start:]
}

// AddBlocked adds a rejection with no bucket behind it (a limit of zero
// requests, such as the reference format's requests_per_unit: 0) named
// rule, which admits nothing for retry.
func (ps *Parts) AddBlocked(rule string, retry time.Duration) {
	ps.blocked = append(ps.blocked, blocked{len(ps.v.Results), sluice.Decision{Rule: rule, RetryAfter: retry}})
}

// Limited reports whether an enforce-mode limit, or a blocked one, was
// added: a request without one is told nothing.
func (ps *Parts) Limited() bool {
	if len(ps.blocked) > 0 {
		return true
	}
	for i := range ps.v.Results {
		if !ps.v.Results[i].Shadow {
			return true
		}
	}
	return false
}

// AppendFields is AppendFields of the parts added as one Verdict, whose
// Overall combines every enforce-mode decision and blocked rejection.
func (ps *Parts) AppendFields(dst []Field, identity, path string, sets []string) []Field {
	ps.enf = ps.enf[:0]
	b := 0
	for i := range ps.v.Results {
		for ; b < len(ps.blocked) && ps.blocked[b].at == i; b++ {
			ps.enf = append(ps.enf, ps.blocked[b].d)
		}
		if r := &ps.v.Results[i]; !r.Shadow {
			ps.enf = append(ps.enf, r.Decision)
		}
	}
	for ; b < len(ps.blocked); b++ {
		ps.enf = append(ps.enf, ps.blocked[b].d)
	}
	ps.v.Overall = sluice.Combine(ps.enf)
	ps.v.Overall.Allowed = ps.v.Allowed
	return AppendFields(dst, &ps.v, identity, path, sets)
}

// PartDecision is the decision that speaks for one part's results rrs
// (see Add for charged): the enforce-mode limit that rejected it (the
// longest wait), else the enforce-mode limit closest to rejecting it; a
// part with shadow-mode limits only is spoken for by them alike. lim is
// the limit of that decision, and over says whether an enforce-mode limit
// of the part rejected it.
func PartDecision(rrs []Result, charged bool) (best sluice.Decision, lim *sluice.Limit, over bool) {
	var enfBuf, shadowBuf [4]sluice.Decision
	var eiBuf, siBuf [4]int
	enf, shadow, ei, si := enfBuf[:0], shadowBuf[:0], eiBuf[:0], siBuf[:0]
	for k := range rrs {
		rr := &rrs[k]
		d := rr.Effective(charged)
		if rr.Shadow {
			shadow, si = append(shadow, d), append(si, k)
			continue
		}
		// Only a limit that caused the rejection says not allowed.
		d.Allowed = !rr.Violated
		over = over || rr.Violated
		enf, ei = append(enf, d), append(ei, k)
	}
	ds, idx := enf, ei
	if len(ds) == 0 {
		ds, idx = shadow, si
	}
	best = sluice.Combine(ds)
	for _, k := range idx {
		if l := rrs[k].Match.Request.Limit; l.Name() == best.Rule {
			return best, l, over
		}
	}
	return best, nil, over
}
