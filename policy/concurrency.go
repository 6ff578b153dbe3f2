package policy

// Concurrency rules: their algorithm_config, the transports that can hold
// their slots, and how Enforce (Options.Hold) acquires and releases them
// around a request.

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"gopkg.in/yaml.v3"
)

// ReasonConcurrencyUnsupported is the reason of a request refused because
// it matched a concurrency rule on a path that cannot hold a slot for as
// long as the request runs (forward auth, Envoy's rate limit service):
// such a path is asked before the request and never told when it ends.
const ReasonConcurrencyUnsupported = "concurrency_unsupported"

var ccFields = []string{"max_in_flight", "lease"}

// concurrencyConfig compiles a concurrency rule's algorithm_config:
// max_in_flight, lease and jitter. Its requests hold one slot each: no
// rate, size or cost field applies (dropInapplicable reported them).
func (l *loader) concurrencyConfig(o *obj, path, name string) *variant {
	errsBefore := len(l.errs)
	spec := sluice.Spec{Name: name, Algorithm: sluice.Concurrency}
	n, nn, ok := o.integer("max_in_flight")
	switch {
	case !o.has("max_in_flight"):
		l.errf(o.n, join(path, "max_in_flight"), "is required: the most requests of a key in flight at once (1 to %d)", sluice.MaxInFlightLimit)
	case ok && (n < 1 || n > sluice.MaxInFlightLimit):
		l.errf(nn, join(path, "max_in_flight"), "must be a whole number from 1 to %d (got %v)", sluice.MaxInFlightLimit, nn.Value)
	case ok:
		spec.MaxInFlight = n
	}
	if ln, ok := o.vals["lease"]; ok && ln.Kind == yaml.MappingNode {
		l.errf(ln, join(path, "lease"), "on a concurrency rule is the slot term, a duration such as \"30s\"; a lease: section of fields (a leased quota) applies to token_bucket and fixed_window")
		delete(o.vals, "lease")
	}
	if d, dn, ok := o.duration("lease"); ok {
		if d < sluice.MinLeaseTerm || d > sluice.MaxLeaseTerm {
			l.errf(dn, join(path, "lease"), "must be from 1ms to 24h (got %q): how long a slot stays held when its holder neither ends nor renews it", dn.Value)
		} else {
			spec.LeaseTerm = d
		}
	}
	l.jitter(o, &spec)
	if len(l.errs) > errsBefore {
		return nil
	}
	lim, err := sluice.NewLimit(spec)
	if err != nil {
		l.errf(o.n, path, "%v", err)
		return nil
	}
	return &variant{limit: lim, cost: costSpec{fixed: 1, def: 1, min: 1}}
}

// concurrencyTransports refuses the concurrency rules that only Envoy's
// rate limit service can reach: those whose key or match reads a
// descriptor or the domain, which only Envoy sends. Envoy is asked before
// a request and never told when it ends, so it cannot release a slot; a
// lease alone would make the rule a limit on requests started per lease,
// which is not what it says. With forward_auth set, forward auth (which
// cannot hold a slot either) refuses every request a concurrency rule
// matches: that is a warning, since the rule may be meant for the reverse
// proxy's requests alone, and its match may keep forward auth's out.
func (l *loader) concurrencyTransports(p *Policy) {
	for i, r := range p.Rules {
		if r.Algorithm != sluice.Concurrency {
			continue
		}
		at := fmt.Sprintf("rules[%d]", i)
		if r.readsDescriptor() {
			l.errf(&yaml.Node{Line: r.Line}, at, "%q is a concurrency rule that reads an Envoy descriptor or domain: Envoy's rate limit service is asked before a request and never told when it ends, so it cannot hold a slot; serve this rule through the reverse proxy or the Go middleware", r.Name)
			continue
		}
		if fa := p.Settings.ForwardAuth.Proxy; fa != "" {
			l.warnf(&yaml.Node{Line: r.Line}, at, "%q is a concurrency rule, which forward auth (forward_auth: %s) cannot hold a slot of: it is asked before a request and never told when it ends, so it refuses every request the rule matches (500, reason concurrency_unsupported). The reverse proxy and the Go middleware hold slots; give the rule a match that forward auth's requests do not meet", r.Name, fa)
		}
	}
}

// readsDescriptor reports whether r's key, match or tiers read what only
// Envoy's rate limit service sends: a descriptor, or the domain.
func (r *Rule) readsDescriptor() bool {
	conds := slices.Clone(r.match)
	for _, t := range r.Tiers {
		conds = append(conds, t.match...)
	}
	return slices.ContainsFunc(r.keys, source.fromEnvoy) || slices.ContainsFunc(conds, func(c cond) bool { return c.src.fromEnvoy() })
}

// fromEnvoy reports whether s is what only Envoy's rate limit service
// sends (a descriptor, or the domain), and never an HTTP request.
func (s source) fromEnvoy() bool {
	return s.kind == srcDescriptor || s.kind == srcDescriptorKey || s.kind == srcDomain
}

// keyedFor reports whether r has no limit_keys or one that a request of
// its transport (an Envoy descriptor when envoy, else an HTTP request)
// can carry. A rule keyed only on what the other sends would find every
// such request's key absent (or, for path, "/"), one bucket that any one
// client could use up for every other.
func (r *Rule) keyedFor(envoy bool) bool {
	for _, s := range r.keys {
		if s.fromEnvoy() == envoy {
			return true
		}
	}
	return len(r.keys) == 0
}

// isSlot reports whether l is a concurrency limit, whose requests hold
// slots rather than spend tokens.
func isSlot(l *sluice.Limit) bool { return l != nil && l.Algorithm() == sluice.Concurrency }

// slots decides the enforce-mode concurrency matches conc of v: acquired
// when the caller holds them (hold) and the request may still pass (try),
// peeked when op is a peek or the request is already rejected, refused
// when the caller cannot hold them. It reports whether every one
// admitted; it stops acquiring at the first that does not, and peeks the
// rest.
func (v *Verdict) slots(ctx context.Context, lim *sluice.Limiter, op engine.Op, conc []int, hold, try bool) bool {
	all := true
	for _, i := range conc {
		r := &v.Results[i]
		r.cost = engine.TokenScale
		req := r.Match.Request
		switch {
		case op == engine.OpTake && !hold:
			r.unsupported = true
			r.Decision = sluice.Decision{Capacity: int64(req.Limit.MaxInFlight()), Rule: req.Limit.Name()}
			all = false
			continue
		case op == engine.OpTake && all && try:
			ls, d, err := lim.Acquire(ctx, req)
			r.slotDecided(d, err)
			r.Lease = ls
		default:
			d, err := lim.Peek(ctx, req)
			r.slotDecided(d, err)
		}
		all = all && r.Decision.Allowed
	}
	return all
}

// slotDecided records a concurrency match's decision, or its failure as
// Enforce records a rate rule's.
func (r *Result) slotDecided(d sluice.Decision, err error) {
	switch {
	case sluice.IsInputError(err):
		r.refuse(err)
	case err != nil:
		r.storeFailed(err)
	default:
		r.Decision = d
	}
}

// unhold releases the leases of the enforce-mode results enf of a rejected
// verdict: nothing is held for a request that does not run. A slot that
// had room then reads as not admitted, with no wait, as a rate limit that
// had tokens reads in a rejected all-or-nothing request.
func (v *Verdict) unhold(ctx context.Context, enf []int) {
	for _, i := range enf {
		r := &v.Results[i]
		if !isSlot(r.Match.Request.Limit) {
			continue
		}
		if r.Lease.Held() {
			// A failed release is counted by the store's metrics; the slot
			// is freed when its lease ends.
			_ = r.Lease.Release(ctx)
			r.Lease = sluice.Lease{}
		}
		if r.StoreErr == nil {
			// What the acquire left, as Effective reads it: not taken.
			r.Decision.Allowed = false
		}
	}
}

// Release frees every slot the verdict holds (Options.Hold's leases), shadow-mode
// rules' included: call it once the request ends. It is safe to call on
// any verdict, and more than once. The error joins the store's failures;
// a slot whose release failed is freed when its lease ends.
func (v *Verdict) Release(ctx context.Context) error {
	var errs []error
	for i := range v.Results {
		r := &v.Results[i]
		if !r.Lease.Held() {
			continue
		}
		if err := r.Lease.Release(ctx); err != nil {
			errs = append(errs, fmt.Errorf("release %s: %w", r.Lease.Limit().Name(), err))
		}
		r.Lease = sluice.Lease{}
	}
	return errors.Join(errs...)
}

// Leases returns the slots the verdict holds.
func (v *Verdict) Leases() []sluice.Lease {
	var out []sluice.Lease
	for i := range v.Results {
		if l := v.Results[i].Lease; l.Held() {
			out = append(out, l)
		}
	}
	return out
}
