package policy

import (
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/defaults"
)

// A server's reservations are bounded by default. The library keeps
// Convex's default (a reservation without max_reserved may go as deep
// into debt as the stores count exactly), but a rule served to clients
// is shared by strangers: a client that reserves a turn and goes away
// before it comes (or a decision API caller that never waits) must not
// leave every other client of the bucket locked out for hours. So a
// token bucket or fixed window loaded from a policy file that sets no
// max_reserved gets one (DefaultMaxReserved); a leaky bucket's is its
// max_delay's already.

// DefaultMaxReserved is the max_reserved, in tokens, that a rule of a
// policy file gets when it sets none, for lim compiled without one and
// queueDelay its max_queue_delay (0: none): the debt that drains in
// max_queue_delay when one is set (a turn within it is what the rule
// asks for); else the capacity, so that a turn is at most one refill of
// the bucket ahead and no key owes more than one bucket; else, for a
// bucket of capacity 0, one period of the rate (a second with
// tokens_per_second). Zero for the algorithms that take no max_reserved.
func DefaultMaxReserved(lim *sluice.Limit, queueDelay time.Duration) float64 {
	switch lim.Algorithm() {
	case sluice.TokenBucket, sluice.FixedWindow:
	default:
		return 0
	}
	switch {
	case queueDelay > 0:
		return queueDelay.Seconds() * lim.TokensPerSecond()
	case lim.Capacity() > 0:
		return lim.Capacity()
	}
	per := lim.Spec().Period
	defaults.Set(&per, time.Second)
	return per.Seconds() * lim.TokensPerSecond()
}

// boundDebt recompiles lim with DefaultMaxReserved when the config sets
// no max_reserved, and notes what a reserving rule's debt is bounded to
// (sluice check prints it). It returns nil, having reported why, when
// the bounded limit does not compile.
func (l *loader) boundDebt(o *obj, spec sluice.Spec, lim *sluice.Limit, v *variant) *sluice.Limit {
	how := "max_reserved"
	// A max_queue_delay below a micro-token of the rate is queueBound's
	// to report.
	if mr := DefaultMaxReserved(lim, v.queueDelay); !o.has("max_reserved") && mr*engine.TokenScale >= 1 {
		spec.MaxReserved = mr
		bounded, err := sluice.NewLimit(spec)
		if err != nil {
			l.errf(o.n, o.path, "bounding reservations to %v tokens of debt (the default max_reserved): %v", mr, err)
			return nil
		}
		lim = bounded
		how = "the default max_reserved: " + defaultDebtWhy(lim, v.queueDelay)
	}
	p := lim.Params()
	if p.Algorithm == engine.LeakyBucket {
		how = "max_delay"
	}
	if !v.reserve && !p.Reserve {
		return lim
	}
	debt := engine.FromMicroTokens(p.MaxReserved)
	at, path := o.vals["reserve"], join(o.path, "reserve")
	if at == nil {
		at, path = o.n, o.path
	}
	l.notef(at, path, "a reservation owes at most %v tokens (%s): a turn is at most %v ahead, and a client that leaves before its turn cannot lock its bucket's other clients out for longer", debt, how, turnAhead(lim, debt))
	return lim
}

func defaultDebtWhy(lim *sluice.Limit, queueDelay time.Duration) string {
	switch {
	case queueDelay > 0:
		return "max_queue_delay x rate"
	case lim.Capacity() > 0:
		return "the capacity"
	}
	return "one period of the rate"
}

// turnAhead is how long debt tokens take to pay back at lim's rate,
// rounded up to the millisecond.
func turnAhead(lim *sluice.Limit, debt float64) time.Duration {
	tps := lim.TokensPerSecond()
	if tps <= 0 {
		return 0
	}
	d := time.Duration(debt / tps * float64(time.Second))
	return d.Round(time.Millisecond)
}
