package policy

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/settle"
)

// Match is one limit that applies to a request.
type Match struct {
	Rule *Rule
	// Request is what to ask the store: the selected limit (the matching
	// tier's, or the rule's own), the composite Key and the Cost. The store
	// keeps the bucket under Request.Limit.StorageKey(Request.Key),
	// e.g. "tb:per-org-rps:org-abc" or "tb:api.enterprise:k-123".
	Request sluice.Request
	// Identity seeds the Retry-After jitter: the verified JWT subject,
	// else the client IP.
	Identity string
	// Tier is the tier that matched, nil for the rule's own limit.
	Tier *Tier
	// Settle, when not nil, says where the actual cost of the request is
	// found once it has been served (the limit's settle_from): what it
	// was charged, Request.Cost, is an estimate to settle.
	Settle *settle.Source

	v         *variant      // the limit's settings; nil for a Match built by hand
	scale     float64       // AtScale's factor; 0 for none
	queueFull bool          // QueueFull: no place in the rule's queue
	queueRoom time.Duration // QueueFull: until the queue has room

	// judged is the request that Judge (or Enforce) charged as a take,
	// with its charge and error: Enforce's take of that very request hands
	// that charge to the Limiter rather than charging it again. A Result
	// keeps its request's charge here too, for the Limiter.
	judged        sluice.Request
	judgedCharged sluice.Charged
	judgedErr     error
}

// CostExceedsLimit reports whether a take of m's request, as it stands,
// asks more than its limit can ever hold (sluice.Request.Charged's rule),
// for a caller that decides such a request apart (the Envoy service). It
// keeps what it found in m, as Judge does.
func (m *Match) CostExceedsLimit() bool { return errors.Is(m.Judge(), sluice.ErrCostExceedsLimit) }

// Judge charges a take of m's request as it stands
// (sluice.Request.Charged) and returns the charge's error, for a caller
// that answers a request it cannot charge apart (the decision API's
// 400 and 422). It keeps the charge in m, so that Enforce, taking m
// unchanged, hands it to the Limiter rather than computing it again.
func (m *Match) Judge() error {
	c, err := m.Request.Charged(engine.OpTake)
	m.judged, m.judgedCharged, m.judgedErr = m.Request, c, err
	return err
}

// Match returns the limits that apply to in, in rule order: for every rule
// whose match holds, the first tier whose match holds (or, when none does,
// the rule's own limit if it has one), with the key built from the rule's
// limit_keys and the cost from its cost_source. A rule whose key source is
// absent applies with AbsentMarker in the key (missing_key: shared, the
// default) or not at all (skip); a rule keyed only on what the other
// transport sends (descriptors for an HTTP request, an HTTP request's
// parts for an Envoy descriptor) does not apply. The error is reserved for input that
// cannot be evaluated at all; none is currently produced.
func (p *Policy) Match(in *Input) ([]Match, error) { return p.AppendMatch(nil, in) }

// AppendMatch is Match appending the limits that apply to in to out, so
// that a caller deciding many requests can reuse one slice.
func (p *Policy) AppendMatch(out []Match, in *Input) ([]Match, error) {
	e := &eval{p: p, r: in}
	base := len(out)
	identity := ""
	envoy := in.Domain != "" || len(in.Descriptor) > 0
	for _, rule := range p.Rules {
		if !rule.keyedFor(envoy) || !e.holds(rule.match, true) {
			continue
		}
		v, tier := rule.ownVariant(), (*Tier)(nil)
		for _, t := range rule.Tiers {
			if e.holds(t.match, false) {
				v, tier = t.v, t
				break
			}
		}
		if v == nil {
			continue
		}
		key, ok := e.key(rule)
		if !ok {
			continue
		}
		if len(out) == base {
			identity = e.identity()
		}
		out = append(out, Match{
			Rule:     rule,
			Request:  v.request(e, key),
			Identity: identity,
			Tier:     tier,
			Settle:   v.settle,
			v:        v,
		})
	}
	return out, nil
}

// ownVariant is the rule's own limit, or nil for a tiered rule without
// one.
func (r *Rule) ownVariant() *variant {
	if r.own == nil && len(r.Tiers) == 0 && r.Limit != nil {
		// A Rule built in code rather than loaded: its Limit, one token
		// per request.
		return &variant{limit: r.Limit, cost: costSpec{fixed: 1, def: 1}}
	}
	return r.own
}

// request is what a match of v asks the store: the limit, the key, the
// request's cost and whether it reserves.
func (v *variant) request(e *eval, key string) sluice.Request {
	return sluice.Request{Limit: v.limit, Key: key, Cost: e.cost(v.cost), Reserve: v.reserve, MaxReserved: v.queueDebt}
}

// LimitMatch returns the Match that Match builds for a request that
// reaches the limit called name (a rule's own limit, or "RULE.TIER") under
// key and declares no cost: the same Request, reservation and cost
// included, that a server asks the store, for tools that replay traffic
// against one limit. ok is false when no rule has such a limit.
func (p *Policy) LimitMatch(name, key string) (m Match, ok bool) {
	e := &eval{p: p, r: &Input{}}
	for _, rule := range p.Rules {
		if v := rule.ownVariant(); v != nil && v.limit.Name() == name {
			return Match{Rule: rule, Request: v.request(e, key), Settle: v.settle, v: v}, true
		}
		for _, t := range rule.Tiers {
			if t.v != nil && t.v.limit.Name() == name {
				return Match{Rule: rule, Request: t.v.request(e, key), Tier: t, Settle: t.v.settle, v: t.v}, true
			}
		}
	}
	return Match{}, false
}

func (e *eval) identity() string {
	if s, ok := claim(e.verifiedClaims(), "sub"); ok {
		if sub, ok := scalarString(s); ok && sub != "" {
			return "sub:" + sub
		}
	}
	if ip := e.clientIP(); ip.IsValid() {
		if e.r.peerIdentity != "" && ip == peerHost(e.r.Peer) {
			return e.r.peerIdentity // the client is the connection's (IPv4) peer
		}
		// An IPv6 client by its prefix: a host commonly holds a whole /64,
		// and evidence of its addresses (an adaptive limit's per-key
		// verdict) is one client's (TestAttackAdaptiveIPv6AddressesMintKeys).
		return ipIdentity(ip, e.p.Settings.IPv6Prefix)
	}
	return ""
}

// ipIdentity is the identity of a client known by its address alone, as
// its key holds it (AddressKey, an IPv6 one by its prefix of bits), in
// one string rather than the key's and then the concatenation.
func ipIdentity(ip netip.Addr, bits int) string {
	var buf [64]byte
	return string(appendAddressKey(append(buf[:0], "ip:"...), ip, bits))
}

// Verdict is the outcome of Enforce.
type Verdict struct {
	// Allowed is false iff an enforce-mode rule rejected, or its store
	// failed and its on_store_error is deny. Shadow rules never make it
	// false.
	Allowed bool
	// Overall is sluice.Combine over the enforce-mode decisions (the zero
	// Decision when there are none).
	Overall sluice.Decision
	// Results has one entry per match, in the same order.
	Results []Result
}

// Result is one match's outcome.
type Result struct {
	Match Match
	// Decision is the limit's decision. For a shadow rule it says what
	// enforcing would have done.
	Decision sluice.Decision
	// Shadow is set for shadow-mode rules.
	Shadow bool
	// StoreErr is the store's failure, when it failed for this rule;
	// Decision then follows the rule's on_store_error.
	StoreErr error
	// Violated is set when this limit itself refused the request: it was
	// short of tokens, the cost can never fit it, or its store failed under
	// on_store_error: deny. In a rejected request every enforce-mode
	// Decision says not allowed (nothing was charged), but only the limits
	// that caused the rejection are Violated. A shadow result is Violated
	// when enforcing it would have rejected.
	Violated bool

	// Lease is the slot a concurrency rule holds for the request (Options.Hold);
	// the zero Lease when none is held. Verdict.Release frees it.
	Lease sluice.Lease

	impossible  bool  // the cost exceeds the limit's capacity
	refusal     error // why, when impossible: the charge's error
	notCharged  bool  // it had room, but another limit rejected the request
	unsupported bool  // a concurrency rule on a path that cannot hold its slot

	cost int64 // the cost in micro-tokens, as sluice.Request.Charged judged it
}

// Observer is told every decision; package metrics implements it with
// Prometheus counters.
type Observer interface {
	// Observe counts one decision of rule; result is one of "allowed",
	// "rejected", "not_charged" (it had room, but another rule rejected
	// the all-or-nothing request, so nothing was taken),
	// "shadow_rejected" or "store_error".
	Observe(rule string, result string)
}

// ResultsObserver is an Observer that wants the whole of each decision:
// the limit and the key besides the rule and the outcome (package insight
// ranks the hottest keys with them). Enforce calls ObserveResults, once per
// call with every result (Result.Outcome names each one's result), instead
// of Observe. It must not keep rs, which the caller goes on to use, and
// should not allocate: it runs on every decision.
type ResultsObserver interface {
	Observer
	ObserveResults(rs []Result)
}

// Observers combines observers into one that tells each of them every
// decision (nil ones are left out); nil when none is left.
func Observers(obs ...Observer) Observer {
	out := tee(slices.DeleteFunc(slices.Clone(obs), func(o Observer) bool { return o == nil }))
	switch len(out) {
	case 0:
		return nil
	case 1:
		return out[0]
	}
	return out
}

// tee is Observers' result.
type tee []Observer

func (t tee) Observe(rule, result string) {
	for _, o := range t {
		o.Observe(rule, result)
	}
}

func (t tee) ObserveResults(rs []Result) {
	for _, o := range t {
		observe(o, rs)
	}
}

// observe tells o the results rs.
func observe(o Observer, rs []Result) {
	if ro, ok := o.(ResultsObserver); ok {
		ro.ObserveResults(rs)
		return
	}
	for i := range rs {
		o.Observe(rs[i].Match.Rule.Name, rs[i].result())
	}
}

// StoreErrorRetry is the wait a rejection by on_store_error: deny reports.
const StoreErrorRetry = time.Second

// Options say how Enforce decides a request's matches. The zero value
// takes (charges) the matches, holds no concurrency slot, keeps nothing
// in a Scratch and tells no Observer.
type Options struct {
	// Op is engine.OpTake (the zero value), engine.OpPeek to answer
	// without consuming, or engine.OpRefund to give every match's cost
	// back (see Refunds below).
	Op engine.Op
	// Hold is set by a caller that holds a request's concurrency slots for
	// as long as it runs (the reverse proxy, the Go middleware, the
	// decision API): see Holding slots below.
	Hold bool
	// Scratch, when set, keeps the verdict's results and the store's
	// requests and decisions in its memory (see Scratch), so that a
	// server deciding request after request allocates none of them.
	Scratch *Scratch
	// Observer, when set, is told each match's result.
	Observer Observer
}

// Enforce decides ms, the one entry to a decision for every transport:
//
//   - The enforce-mode matches go to the store in one all-or-nothing
//     Limiter.TakeAll: all are charged if every one admits, none if any
//     rejects. A cost that sluice.Request.Charge finds above a limit's
//     capacity (which can never succeed) is a rejection decided without
//     the store; the others are then only peeked, so nothing is charged.
//   - When the store fails (or answers with an input error, which a
//     validated policy never causes), every enforce-mode match of the call
//     gets the error and follows its rule's on_store_error: allow (admitted,
//     state untouched) or deny (rejected, retry after StoreErrorRetry).
//   - Shadow-mode matches never reject and never block charging the
//     others. Each is decided on its own after the enforce-mode ones:
//     charged when the request was allowed, peeked when it was rejected,
//     so its counts are what enforcing it alongside the others would have
//     produced. Its store errors are recorded and otherwise ignored.
//
// Holding slots: without Options.Hold, a take that a concurrency rule
// matches is refused, with reason ReasonConcurrencyUnsupported: holding a
// slot needs a caller that knows when the request ends. With it, a slot of
// each concurrency rule is acquired before the rate rules are charged and
// kept in Result.Lease; the caller must call Verdict.Release once the
// request ends, however it ends (a deferred call). Slots go first because
// a lease is given back exactly (its id is removed) while a refund of
// tokens is not always exact: when a rate rule then rejects, the slots are
// released. Until they are, about one store round trip, a concurrent
// request may find a slot taken by a request that in the end was
// rejected: the error is towards rejecting, never admitting too much. A
// rejected verdict holds no lease.
//
// Refunds (engine.OpRefund) give every match's cost back, shadow-mode
// rules included, since they were charged alike. A refund never rejects:
// the verdict is allowed, each result describes its bucket after the
// refund, and a store failure is recorded without denying anything. A
// cost above a limit's capacity refunds the capacity
// (sluice.Request.Charge). Refunds are not decisions, so the Observer is
// not told.
func Enforce(ctx context.Context, lim *sluice.Limiter, ms []Match, o Options) Verdict {
	s := o.Scratch
	if s == nil {
		return decide(ctx, lim, ms, o, nil, nil, nil)
	}
	s.charged, s.decisions = slices.Grow(s.charged[:0], len(ms)), slices.Grow(s.decisions[:0], len(ms))
	v := decide(ctx, lim, ms, o, s.results, s.charged, s.decisions)
	if cap(v.Results) > cap(s.results) {
		s.results = v.Results[:0]
	}
	return v
}

// resultsFor is room for n results: buf's when it has it.
func resultsFor(buf []Result, n int) []Result { return slices.Grow(buf[:0], n)[:n] }

// decide is Enforce with the verdict's Results, the charged requests and
// their decisions in buf, csBuf and decBuf when they have room for them.
func decide(ctx context.Context, lim *sluice.Limiter, ms []Match, o Options, buf []Result, csBuf []sluice.Charged, decBuf []sluice.Decision) Verdict {
	op, obs, hold := o.Op, o.Observer, o.Hold
	if op == engine.OpRefund {
		return refund(ctx, lim, ms, buf)
	}
	v := Verdict{Allowed: true, Results: resultsFor(buf, len(ms))}
	// Index lists of a few matches (the usual) stay on the stack.
	var enfBuf, shadowBuf, idxBuf [8]int
	enf, shadow, idx := enfBuf[:0], shadowBuf[:0], idxBuf[:0]
	for i, m := range ms {
		v.Results[i] = Result{Match: m, Shadow: m.Rule != nil && m.Rule.Mode == Shadow}
		if v.Results[i].Shadow {
			shadow = append(shadow, i)
		} else {
			enf = append(enf, i)
		}
	}

	cs := slices.Grow(csBuf[:0], len(enf))
	impossible, uncharged := false, false
	var concBuf [8]int
	conc := concBuf[:0]
	for _, i := range enf {
		r := &v.Results[i]
		if isSlot(r.Match.Request.Limit) {
			conc = append(conc, i)
			continue
		}
		if r.judge() {
			impossible = true
			continue
		}
		cs = append(cs, r.Match.judgedCharged)
		uncharged = uncharged || r.Match.judgedErr != nil
		idx = append(idx, i)
	}
	// Slots first: a lease is given back exactly when the rate rules
	// then reject (see Enforce, Holding slots).
	slotted := len(conc) == 0 || v.slots(ctx, lim, op, conc, hold, !impossible)
	if len(cs) > 0 {
		ask := engine.OpTake
		if op == engine.OpPeek || impossible || !slotted {
			ask = engine.OpPeek
		}
		if op != engine.OpPeek && ask == engine.OpPeek { // a free refusal: read two shards, not all
			for k := range cs {
				cs[k] = cs[k].Sampled()
			}
		}
		ds, err := decideCharged(ctx, lim, ask, decBuf, cs, v.Results, idx, uncharged)
		for k, i := range idx {
			if err == nil {
				v.Results[i].Decision = ds[k]
			} else if sluice.IsInputError(err) {
				// The request is at fault, not the store: on_store_error
				// must not admit what can never be decided as asked.
				v.Results[i].refuse(err)
			} else {
				v.Results[i].storeFailed(err)
			}
		}
	}
	for _, i := range enf {
		v.Results[i].unscale()
	}
	if len(enf) > 0 {
		v.Overall = combineOf(v.Results, enf)
		v.Allowed = v.Overall.Allowed
	}
	if !v.Allowed && len(conc) > 0 {
		v.unhold(ctx, conc)
	}

	for _, i := range shadow {
		r := &v.Results[i]
		if isSlot(r.Match.Request.Limit) {
			// A shadow slot is held when the request runs and the caller
			// can hold it, so that its count is what enforcing would see.
			// Where it cannot be held, it is peeked: a shadow rule never
			// refuses.
			v.slots(ctx, lim, op, []int{i}, true, v.Allowed && hold)
			continue
		}
		if r.judge() {
			continue
		}
		// Asked as the enforced limits are (TakeAll), on the precise clock:
		// a server that reads the memory store's coarse clock keeps its
		// ticker waking a thousand times a second (see memory/clock.go).
		ask, cs := engine.OpTake, []sluice.Charged{r.Match.judgedCharged}
		if op == engine.OpPeek || !v.Allowed {
			ask = engine.OpPeek
		}
		if op != engine.OpPeek && !v.Allowed {
			cs[0] = cs[0].Sampled()
		}
		if ds, err := decideCharged(ctx, lim, ask, decBuf, cs, v.Results, []int{i}, r.Match.judgedErr != nil); err != nil {
			r.storeFailed(err)
		} else {
			r.Decision = ds[0]
		}
		r.unscale()
	}

	for i := range v.Results {
		r := &v.Results[i]
		// A limit short of tokens always reports a positive wait; one that
		// passed but was not charged because another refused reports none.
		r.Violated = !r.Decision.Allowed && (r.Decision.RetryAfter > 0 || r.impossible || r.StoreErr != nil || r.unsupported)
		// Counted apart from "allowed": a rule that admitted nothing must
		// not read as letting traffic through.
		r.notCharged = !v.Allowed && !r.Violated && !r.Shadow && r.StoreErr == nil
	}
	if obs != nil {
		observe(obs, v.Results)
	}
	return v
}

// combineOf is sluice.Combine of the decisions of results[i] for i in idx.
// One (the usual) is combined without room for eight on the stack.
func combineOf(results []Result, idx []int) sluice.Decision {
	if len(idx) == 1 {
		return sluice.Combine([]sluice.Decision{results[idx[0]].Decision})
	}
	var dsBuf [8]sluice.Decision
	ds := dsBuf[:0]
	for _, i := range idx {
		ds = append(ds, results[i].Decision)
	}
	return sluice.Combine(ds)
}

// refund is Enforce of engine.OpRefund (see Enforce's Refunds).
func refund(ctx context.Context, lim *sluice.Limiter, ms []Match, buf []Result) Verdict {
	v := Verdict{Allowed: true, Results: resultsFor(buf, len(ms))}
	reqs := make([]sluice.Request, 0, len(ms))
	idx := make([]int, 0, len(ms))
	for i, m := range ms {
		v.Results[i] = Result{Match: m, Shadow: m.Rule != nil && m.Rule.Mode == Shadow}
		if isSlot(m.Request.Limit) {
			// A slot is given back by its lease, not by a refund, which
			// leaves the slots as they are and reports none of them used.
			l := m.Request.Limit
			n := int64(l.MaxInFlight())
			v.Results[i].Decision = sluice.Decision{Allowed: true, Capacity: n, Remaining: n, Tokens: float64(n), Rule: l.Name()}
			continue
		}
		r := m.Request
		r.Reserve = false
		reqs = append(reqs, r)
		idx = append(idx, i)
	}
	if len(reqs) == 0 {
		return v
	}
	ds, err := lim.RefundAll(ctx, reqs...)
	var enf []sluice.Decision
	for k, i := range idx {
		r := &v.Results[i]
		if err != nil {
			r.StoreErr = err
			l := r.Match.Request.Limit
			r.Decision = sluice.Decision{Allowed: true, Capacity: int64(l.Capacity()), Rule: l.Name()}
		} else {
			r.Decision = ds[k]
		}
		r.unscale()
		if !r.Shadow {
			enf = append(enf, r.Decision)
		}
	}
	if len(enf) > 0 {
		v.Overall = sluice.Combine(enf)
	}
	return v
}

// Outcome names r's result as an Observer is told it: "allowed",
// "rejected", "not_charged", "shadow_rejected" or "store_error".
func (r *Result) Outcome() string { return r.result() }

// result names r for the Observer. A limit that would have admitted the
// request but was not charged because another refused is "not_charged":
// neither a rejection of its own nor traffic it let through.
func (r *Result) result() string {
	switch {
	case r.StoreErr != nil:
		return "store_error"
	case r.notCharged:
		return "not_charged"
	case !r.Violated:
		return "allowed"
	case r.Shadow:
		return "shadow_rejected"
	}
	return "rejected"
}

func (r *Result) storeFailed(err error) {
	r.StoreErr = err
	l := r.Match.Request.Limit
	c := l.Capacity()
	d := sluice.Decision{Allowed: true, Capacity: int64(c), Remaining: int64(c), Rule: l.Name(), Tokens: c}
	if r.Match.Rule != nil && r.Match.Rule.OnStoreError == DenyOnError {
		d.Allowed, d.Remaining, d.Tokens, d.RetryAfter = false, 0, 0, StoreErrorRetry
	}
	r.Decision = d
}

// judge charges r's request (sluice.Request.Charged) once, as a take: a
// peek is charged alike. The charge, kept in r.Match (see Match.Judge),
// goes to the Limiter as it stands. A cost the limit can never admit is
// decided here, as a rejection, and judge reports true; any other problem
// is left for the Limiter to report (decideCharged).
func (r *Result) judge() bool {
	if m := &r.Match; m.judged.Limit == nil || m.judged != m.Request {
		m.Judge()
	}
	err := r.Match.judgedErr
	r.cost = r.Match.judgedCharged.Cost
	if !errors.Is(err, sluice.ErrCostExceedsLimit) {
		return false
	}
	if r.queueRefuse(engine.OpTake) {
		return true
	}
	r.refuse(err)
	return true
}

// decideCharged asks lim for the charged requests cs, those of
// results[idx] in order, appending their decisions to dst. When one of
// them could not be charged (uncharged), the requests go to the Limiter
// as they are, for the error it reports for such a batch.
func decideCharged(ctx context.Context, lim *sluice.Limiter, op engine.Op, dst []sluice.Decision, cs []sluice.Charged, results []Result, idx []int, uncharged bool) ([]sluice.Decision, error) {
	if !uncharged {
		return lim.AppendAll(ctx, op, dst, cs...)
	}
	reqs := make([]sluice.Request, len(idx))
	for k, i := range idx {
		reqs[k] = results[i].Match.Request
	}
	all := lim.TakeAll
	if op == engine.OpPeek {
		all = lim.PeekAll
	}
	_, ds, err := all(ctx, reqs...)
	if err != nil {
		return nil, err
	}
	return append(dst, ds...), nil
}

// refuse rejects r as a request that can never succeed, charging nothing;
// err says why.
func (r *Result) refuse(err error) {
	r.Decision, r.impossible, r.refusal = sluice.Decision{Allowed: false}, true, err
	if l := r.Match.Request.Limit; l != nil {
		r.Decision.Capacity, r.Decision.Rule = int64(l.Capacity()), l.Name()
	}
}
