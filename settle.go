package sluice

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice/engine"
)

// Settlement is what Limiter.Settle did to a bucket.
type Settlement struct {
	// Decision describes the bucket after the store call that settled it
	// (allowed). When the actual cost equals the charge no call is made:
	// Decision then names the rule and its limit, with no tokens.
	Decision Decision
	// Refunded is the tokens given back: charged - actual, when the
	// request used less than it was charged. A refund never fills the
	// bucket above its capacity.
	Refunded float64
	// Extra is the tokens charged on top: actual - charged, when the
	// request used more, less what the debt bound forgave.
	Extra float64
	// Forgiven is what the request used beyond its charge that could not
	// be charged: the bucket was already as deep in debt as SettleDebt
	// lets it go. Forgiven is zero unless a request used more than its
	// limit can ever owe.
	Forgiven float64
}

// settleTries bounds the extra charge's attempts: each one that finds the
// bucket deeper in debt than it was read charges what then fits, so only
// callers settling the same key at the same moment make it try again.
const settleTries = 4

// Settle charges what a request turned out to cost when it was charged an
// estimate up front: the limit of r charged was taken from r.Key (by
// Take, TakeAll or a policy), and the request used actual, known only
// once it was served (the tokens a model generated, the bytes a download
// sent). r.Cost and r.Reserve are not read: charged and actual say it
// all. actual may be zero (the request used nothing).
//
// A request that used less is refunded the difference (engine.OpRefund), never
// above the bucket's capacity. A request that used more is charged the
// difference, and that charge is never refused: it was served already.
// It takes the bucket into debt, as a reservation does, as far as
// SettleDebt allows; what would go deeper is forgiven (Settlement.Forgiven)
// rather than refused, so a key's debt stays bounded whatever a response
// reports. Each of the two is one atomic store operation, so settling a
// key that other requests take from, or settle, at the same moment
// never loses or doubles a charge: the bucket ends where the sum of the
// actual costs puts it. (When the bucket is found deeper in debt than
// the extra fits, the extra charge asks again for what fits, at most a
// few times; each attempt either charges or changes nothing.)
//
// A sharded limit (Spec.Shards) settles as it takes and refunds: the
// extra charge is a take on credit from its shards, and the refund goes
// to two shards picked at random, each up to full, as every refund of a
// sharded limit does; what those two cannot hold is dropped, so the key
// may end charged more than its actual costs, never less.
//
// The errors are the store's, and ErrInvalidCost for a charged that is
// no cost or an actual that is not a finite number >= 0.
func (l *Limiter) Settle(ctx context.Context, r Request, charged, actual float64) (Settlement, error) {
	if r.Limit == nil {
		_, err := r.Charged(engine.OpRefund) // names the missing limit
		return Settlement{}, err
	}
	if r.Key == "" {
		return Settlement{}, noKey(r.Limit)
	}
	c, err := engine.ToMicroTokens(charged)
	if err != nil {
		return Settlement{}, fmt.Errorf("limit %q: settle: charged: %w", r.Limit.Name(), err)
	}
	a, err := settledCost(actual)
	if err != nil {
		return Settlement{}, fmt.Errorf("limit %q: settle: actual: %w", r.Limit.Name(), err)
	}
	base := Request{Limit: r.Limit, Key: r.Key}
	var s Settlement
	switch {
	case a < c:
		base.Cost = engine.FromMicroTokens(c - a)
		if s.Decision, err = l.one(ctx, engine.OpRefund, base); err != nil {
			return Settlement{}, err
		}
		s.Refunded = base.Cost
		return s, nil
	case a == c:
		s.Decision = Decision{Allowed: true, Capacity: r.Limit.params.Capacity / engine.TokenScale, Rule: r.Limit.Name()}
		return s, nil
	}
	return l.settleExtra(ctx, base, a-c)
}

// settledCost reads an actual cost: zero, or a finite amount of tokens
// counted in micro-tokens (an amount beyond what any limit counts is the
// most there is: the debt bound forgives it anyway).
func settledCost(actual float64) (int64, error) {
	switch {
	case math.IsNaN(actual) || math.IsInf(actual, 0) || actual < 0:
		return 0, fmt.Errorf("%w (got %v)", ErrInvalidCost, actual)
	case actual == 0:
		return 0, nil
	case actual*engine.TokenScale >= engine.MaxMicroTokens:
		return engine.MaxMicroTokens, nil
	}
	return int64(math.Round(actual * engine.TokenScale)), nil
}

// settleExtra charges extra micro-tokens to base's bucket, never refused:
// a take on credit up to SettleDebt, whatever the limit's own reserve
// setting, and what would go deeper is forgiven.
func (l *Limiter) settleExtra(ctx context.Context, base Request, extra int64) (Settlement, error) {
	lim := base.Limit
	bound := lim.settleDebt()
	// Even a full bucket cannot owe more than one take on credit may be:
	// the rest is forgiven.
	most := lim.settleMost(bound)
	extra, forgiven := min(extra, most), max(extra-most, 0)
	var charged int64
	var last Decision
	for try := 0; try < settleTries && extra > 0; try++ {
		req := base
		req.Cost, req.extra = engine.FromMicroTokens(extra), true
		if bound > 0 {
			req.Reserve, req.MaxReserved = true, engine.FromMicroTokens(bound)
		} else {
			req.NoReserve = true
		}
		d, err := l.one(ctx, engine.OpTake, req)
		if IsInputError(err) && extra > 2 {
			// At the edge of what a store counts exactly, the cost's trip
			// through a float64 can land a micro-token or two above the
			// most a take may be: ask a little less.
			cut := max(2, extra>>40)
			extra, forgiven = extra-cut, forgiven+cut
			continue
		}
		if err != nil {
			return Settlement{}, err
		}
		last = d
		if d.Allowed {
			charged, extra = extra, 0
			break
		}
		// Refused, which charged nothing: the bucket holds d.Tokens, and
		// only what leaves it within the bound can be charged.
		var over int64
		extra, over = fitExtra(extra, toMicro(d.Tokens), bound)
		forgiven += over
	}
	forgiven += extra // still unplaced after every try
	last.Allowed, last.RetryAfter, last.RetryAt = true, 0, time.Time{}
	return Settlement{Decision: last, Extra: engine.FromMicroTokens(charged), Forgiven: engine.FromMicroTokens(forgiven)}, nil
}

// fitExtra is what of an extra charge fits a bucket holding tokens (may
// be negative) within a debt bound, and what does not.
func fitExtra(extra, tokens, bound int64) (charge, forgiven int64) {
	room := tokens + bound
	switch {
	case room <= 0:
		return 0, extra
	case room < extra:
		return room, extra - room
	}
	return extra, 0
}

// SettleDebt is how far into debt, in tokens, a settlement's extra charge
// (see Limiter.Settle) may take a bucket of l: as far as every store
// counts exactly (engine.MaxDebt, and at most two billion tokens: see
// maxSettleDebt), whatever the limit's max_reserved, which bounds what a
// client may reserve, not what it has used. So a key that used more than
// it was charged owes all of it, and waits until its bucket has refilled
// that far. A sliding log, sliding window or calendar window keeps none: zero.
func (l *Limit) SettleDebt() float64 { return engine.FromMicroTokens(l.settleDebt()) }

// settleMost is the most one extra charge on credit of bound may be: the
// capacity plus bound, or for a sharded limit what its take can place
// (two shards' tokens, or one shard's tokens and its share of the bound,
// less a micro-token for the share's rounding).
func (l *Limit) settleMost(bound int64) int64 {
	if l.shards == nil {
		return l.params.Capacity + bound
	}
	cs := l.shards.lim.params.Capacity
	return max(2*cs, cs+bound/int64(l.shards.n)-1)
}

// settleDebt is SettleDebt in micro-tokens. A sharded limit's extra
// charge is a reservation from one shard, given 1/n of the bound (see
// Request.shardRequest): n times what one shard counts exactly.
func (l *Limit) settleDebt() int64 {
	p, n := &l.params, int64(1)
	if l.shards != nil {
		p, n = &l.shards.lim.params, int64(l.shards.n)
	}
	if p.Algorithm == engine.SlidingLog || p.Windowed() {
		return 0
	}
	return min(engine.MulDiv(engine.MaxDebt(p), n, 1), maxSettleDebt)
}

// maxSettleDebt bounds SettleDebt at 2^51 micro-tokens (two billion
// tokens): an amount that passes through a float64 and back unchanged, as
// a Request's MaxReserved does. Only a limit that may owe more than that
// is bounded by it.
const maxSettleDebt = 1 << 51
