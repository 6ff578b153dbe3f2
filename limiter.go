package sluice

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/sluicehq/sluice/engine"
)

// Request asks a Limit for Cost tokens on behalf of Key.
type Request struct {
	Limit *Limit
	// Key identifies whose bucket to charge within the limit ("user-42").
	// Stores namespace it by the limit (see StorageKey), so the same key
	// under two limits is two buckets.
	Key string
	// Cost is the number of tokens asked for; zero means 1. Fractions are
	// fine (0.5 is half a token), but a sliding log charges a token at least.
	Cost float64
	// Reserve admits the request even when the bucket is short, by taking
	// the tokens on credit up to MaxReserved (without bound when no
	// max_reserved is set); the Decision's RetryAfter then says when the
	// reserved turn comes. A reserving request may cost up to the capacity
	// plus MaxReserved. Token buckets, leaky buckets and fixed windows.
	Reserve bool
	// MaxReserved overrides the limit's MaxReserved for this request, in
	// tokens; zero keeps the limit's. It is never more than engine.MaxDebt.
	MaxReserved float64
	// NoReserve refuses every reservation, even where the limit makes each
	// request reserve (a leaky bucket, Spec.Reserve): for a caller that
	// cannot hold a request until its turn (Envoy's rate limit service),
	// which would otherwise pass at once every turn it is given. A leaky
	// bucket then admits one request per 1/rate; a bucket of zero capacity
	// admits nothing.
	NoReserve bool
	// extra marks settlement's charge of what a request used beyond its
	// take: exactly that, never rounded up to a log entry's token.
	extra bool
}

// Charged is a request that Request.Charged has validated: its limit and
// key, and what it asks of the limit in the engine's integers. It is what
// a Store is handed: the Limiter computes each request's charge once, and
// a store applies it as it stands, judging nothing again. A Charged made
// for engine.OpTake serves engine.OpPeek as well (the rule is the same);
// one for engine.OpRefund is a refund's.
type Charged struct {
	Limit *Limit
	Key   string
	engine.Charge

	// A sharded limit's request as given, which the Limiter spreads over
	// the shards (see Limit.Shards); zero for any other limit.
	cost, maxReserved float64
	sampled           bool // see Sampled
}

// Sampled returns c for a peek that reads a sharded limit as a take
// does, two shards at random, rather than every shard: for a caller that
// peeks only to report what a refused request left, which must not cost
// the store a read of every shard.
func (c Charged) Sampled() Charged { c.sampled = true; return c }

// Charged validates r under op and computes its charge, in the integer
// form the algorithms take. It is the one place where a request's cost is
// judged: the Limiter calls it once per request and hands the store the
// result, so every store decides the same input alike, and policy.Enforce
// calls it to tell an impossible request from one that is merely short of
// tokens (and hands what it computed to Limiter.AppendAll).
//
// The rule:
//
//   - A Cost of zero means one token: the zero value of Request asks
//     for one, as most callers do. (The decision API's JSON has no zero
//     value: an explicit "cost": 0 there is refused, and a cost left out
//     is one.) Fractions count down to one micro-token (1e-6 of a token).
//   - A cost that is not a number, is negative, or is below one
//     micro-token is ErrInvalidCost.
//   - A take or a peek above the most it can ever be charged is
//     ErrCostExceedsLimit: no wait would ever admit it. That most is the
//     limit's capacity (its burst), plus its max_reserved when the
//     request reserves: a reservation may cost more than the bucket
//     holds, and waits its turn for the rest. A cost too large to count
//     (1e300, infinity) is above every capacity and is refused the same
//     way: "cost 1e+300 is above the capacity (10): it can never
//     succeed", never as an invalid number.
//   - A refund gives back at most the most that one request can be
//     charged, the capacity plus the limit's max_reserved (engine.MaxDebt when
//     it sets none; zero for a sliding log): a larger refund (infinity
//     included) is a refund of that, which fills the bucket.
//   - Reserving (Reserve, or a limit that always reserves: a leaky
//     bucket, Spec.Reserve; never with NoReserve) needs a token bucket,
//     leaky bucket or fixed window, else ErrReserveUnsupported. A MaxReserved of the request's
//     own replaces the limit's: a valid amount, of which at most engine.MaxDebt
//     counts.
func (r Request) Charged(op engine.Op) (Charged, error) {
	if r.Limit != nil && op <= engine.OpRefund && r.one() {
		var c Charged
		r.chargeOne(&c)
		return c, nil
	}
	return r.charged(op)
}

// one reports whether r is the common request: one token of a limit
// that holds one (Limit.plain), with no reservation of its own, whose
// charge needs nothing converted or validated (chargeOne). r.Limit is
// not nil. The Limiter's hot paths ask it inline, rather than call
// Charged: a Charged returned with an error is copied through memory,
// with wide loads of what was just stored narrow (store forwarding
// fails), where chargeOne writes it in place.
func (r *Request) one() bool {
	return r.Limit.plain && (r.Cost == 0 || r.Cost == 1) && !r.Reserve && r.MaxReserved == 0
}

// chargeOne writes the charge of r, a request for which one holds, into
// c, a zero Charged, field by field: the limit's precomputed one-token
// charge.
func (r *Request) chargeOne(c *Charged) {
	l := r.Limit
	c.Limit, c.Key = l, r.Key
	c.Cost, c.Reserve, c.MaxReserved = l.one.Cost, l.one.Reserve && !r.NoReserve, l.one.MaxReserved
}

// charged is Charged for every request but Charged's common one.
func (r Request) charged(op engine.Op) (Charged, error) {
	ch, err := r.charge(op)
	if err != nil {
		return Charged{}, err
	}
	c := Charged{Limit: r.Limit, Key: r.Key, Charge: ch}
	if r.Limit.shards != nil {
		c.cost, c.maxReserved = r.Cost, r.MaxReserved
	}
	return c, nil
}

// request is the request c was charged for, as far as a sharded limit's
// expansion needs it.
func (c *Charged) request() Request {
	return Request{Limit: c.Limit, Key: c.Key, Cost: c.cost, Reserve: c.Reserve, MaxReserved: c.maxReserved}
}

// charge is the integer charge of r under op (Charged's rule).
func (r Request) charge(op engine.Op) (engine.Charge, error) {
	if r.Limit == nil {
		return engine.Charge{}, fmt.Errorf("%w: request for key %q has no limit", ErrInvalidLimit, r.Key)
	}
	if r.Limit.params.Algorithm == engine.Concurrency {
		return engine.Charge{}, fmt.Errorf("limit %q: %w", r.Limit.Name(), ErrLeaseRequired)
	}
	if op > engine.OpRefund {
		return engine.Charge{}, fmt.Errorf("limit %q: %v is a call on a concurrency limit's leases (Store.Lease), not a take", r.Limit.Name(), op)
	}
	if r.Limit.shards != nil {
		return r.shardedCharge(op)
	}
	p := &r.Limit.params
	cost := r.costOrOne()
	ch := engine.Charge{Reserve: (r.Reserve || p.Reserve) && !r.NoReserve, MaxReserved: p.MaxReserved}
	if ch.Reserve && (p.Algorithm == engine.SlidingLog || p.Windowed()) {
		return engine.Charge{}, fmt.Errorf("limit %q (%s): %w", r.Limit.Name(), p.Algorithm, ErrReserveUnsupported)
	}
	var err error
	if r.MaxReserved != 0 {
		if ch.MaxReserved, err = maxReserved(r.MaxReserved, p); err != nil {
			return engine.Charge{}, fmt.Errorf("limit %q: max_reserved %w", r.Limit.Name(), err)
		}
	}
	most := p.Capacity
	switch {
	case op == engine.OpRefund:
		most += p.MaxReserved
	case ch.Reserve:
		most += ch.MaxReserved
	}
	if ch.Cost, err = r.Limit.cost(op, cost, most, r.extra); err != nil {
		return engine.Charge{}, err
	}
	return ch, nil
}

// Store keeps bucket state and applies the algorithms atomically. Every
// engine (memory, redis, postgres) implements it with the same arithmetic,
// checked by the conformance vectors in package conformance.
type Store interface {
	// Take decides one request, charged by the Limiter (see Charged): the
	// store applies c as it stands, validating nothing again. With
	// engine.OpTake an admitted request is charged atomically; a
	// rejected one changes nothing. engine.OpRefund gives its cost back.
	// The Decision's RetryAt is left zero: the Limiter dates it.
	Take(ctx context.Context, op engine.Op, c Charged) (Decision, error)
	// TakeAll decides several charged requests all-or-nothing: they are
	// charged only if every one is admitted, and a rejection charges none
	// of them. The decisions are in the order of cs. engine.OpRefund
	// refunds every one. cs is the caller's memory, lent for the call
	// alone. dst, when not nil, is memory the caller lends for the
	// decisions: a store may write them from dst[:0], or return a slice of
	// its own.
	TakeAll(ctx context.Context, op engine.Op, cs []Charged, dst []Decision) ([]Decision, error)
	// Reset forgets the state of key under l: the bucket is full again.
	Reset(ctx context.Context, l *Limit, key string) error
	// Lease applies op to lease id of r.Key under r.Limit, a concurrency
	// limit, atomically, as engine.StepLease defines: engine.OpTake
	// acquires a slot (or renews id's), engine.OpPeek answers what
	// engine.OpTake would, engine.OpRelease releases id's slot and
	// engine.OpRenew renews id's live lease alone. Other limits are
	// ErrLeaseRequired (see Request.CheckLease).
	Lease(ctx context.Context, op engine.Op, r Request, id engine.LeaseID) (Decision, error)
	// Supports refuses a limit the store cannot compute exactly (an
	// ErrInvalidLimit), without a call to any server: a program checks
	// its limits with it at start (sluice serve does, and on every
	// reload), never finding out at a request. The stores that compute in
	// 64-bit integers take every limit NewLimit accepts.
	Supports(l *Limit) error
}

// StorageKey is the name under which a store keeps the state of key
// under l: "{algorithm}:{limit}:{key}", for example
// "tb:per-org-rps:org-abc". A Redis hash tag inside key ("{user-42}")
// keeps one identity's buckets in one Cluster slot.
func (l *Limit) StorageKey(key string) string {
	return l.Algorithm().KeyPrefix() + ":" + l.spec.Name + ":" + key
}

// Limiter is the library's entry point: it validates requests and asks its
// Store. It is safe for concurrent use. It expands the requests of a
// sharded limit (Spec.Shards) into requests to its shards, so such a limit
// must be used through a Limiter: a Store asked directly would keep it in
// one bucket of its whole capacity, beside the shards.
type Limiter struct {
	store   Store
	outcome OutcomeStore // store, when it is one; else nil
	epoch   time.Time    // outcome's Epoch
	clock   Clock        // nil: the system clock (see Options)
	rng     *lockedRand  // the choice of shards; nil draws from math/rand/v2
}

// New returns a Limiter over store.
func New(store Store) *Limiter { return NewWithOptions(store, Options{}) }

// OutcomeStore is a Store that also answers one request in the engine's
// integers (the memory store). A Limiter over one builds the Decision in
// its own frame: a Decision is too large for registers, and each frame
// that returns one copies it, a large share of an in-process decision.
type OutcomeStore interface {
	Store
	// TakeOutcome is Take of engine.OpTake (the one a Limiter asks this
	// way) for the charge ch of key under lim, a limit that is not
	// sharded, answering in an engine.Outcome. It takes the Charged's
	// parts, not a Charged, so that every argument passes in registers:
	// an argument that does not fit is built in the caller's frame and
	// copied to the call's, and that copy's wide loads stall on the
	// narrow stores that built it (store forwarding fails), a large share
	// of an in-process decision. When the Outcome has a wait, it also
	// answers when the store read the clock it decided by, as the time
	// since Epoch, if that was the system clock, and a negative duration
	// otherwise: the Limiter dates Decision.RetryAt from that reading
	// (one time.Time.Add, the only one) instead of reading the clock
	// again.
	TakeOutcome(ctx context.Context, lim *Limit, key string, ch engine.Charge) (engine.Outcome, time.Duration, error)
	// Epoch is the moment TakeOutcome's readings count from, with the
	// process's monotonic reading, the same for every call.
	Epoch() time.Time
}

// Store returns the limiter's store.
func (l *Limiter) Store() Store { return l.store }

// Take asks for r.Cost tokens and charges them if admitted.
func (l *Limiter) Take(ctx context.Context, r Request) (d Decision, err error) {
	// Inlined (keep it within the inlining budget), Take leaves d in the
	// caller's frame, where takeInto writes it: a Decision returned from
	// a call is written to the call's result area and copied out of it.
	err = l.takeInto(ctx, &d, &r)
	return d, err
}

// takeInto is Take, writing the Decision into d, a zero Decision, which
// it leaves zero on an error.
func (l *Limiter) takeInto(ctx context.Context, d *Decision, r *Request) error {
	lim := r.Limit
	if l.outcome == nil || lim == nil || lim.shards != nil || r.Key == "" {
		var err error
		*d, err = l.take(ctx, *r)
		return err
	}
	var o engine.Outcome
	var at time.Duration
	var err error
	if r.one() {
		// chargeOne's charge.
		one := &lim.one
		o, at, err = l.outcome.TakeOutcome(ctx, lim, r.Key, engine.Charge{Cost: one.Cost, Reserve: one.Reserve && !r.NoReserve, MaxReserved: one.MaxReserved})
	} else {
		c, err := r.Charged(engine.OpTake)
		if err != nil {
			return err
		}
		o, at, err = l.outcome.TakeOutcome(ctx, lim, c.Key, c.Charge)
	}
	if err != nil {
		return err
	}
	lim.decideInto(d, o)
	switch {
	case o.RetryAfter <= 0:
	case at < 0 || l.clock != nil || !o.Allowed && lim.spec.Jitter > 0:
		l.dateWait(ctx, d, *r, at)
	default: // dateWait's usual answer, without its call
		d.RetryAt = l.waitEnds(at, d.RetryAfter)
	}
	return nil
}

// take is Take through Store.Take: for a store that is no OutcomeStore,
// a sharded limit, and the errors of a request without a limit or key.
func (l *Limiter) take(ctx context.Context, r Request) (Decision, error) {
	if r.Key == "" {
		return Decision{}, noKey(r.Limit)
	}
	d, err := l.one(ctx, engine.OpTake, r)
	l.advise(ctx, &d, r.Limit, r.Key, time.Time{})
	return d, err
}

// dateWait is advise for a Decision d of r that has a wait, decided on
// the store's reading at past its Epoch (negative when the store read
// no system clock): a rejection's wait grows by the limit's jitter, and
// RetryAt is the reading plus the wait, or the wait from now on the
// Limiter's own clock when the Limiter has one.
func (l *Limiter) dateWait(ctx context.Context, d *Decision, r Request, at time.Duration) {
	if at < 0 || l.clock != nil {
		l.advise(ctx, d, r.Limit, r.Key, time.Time{})
		return
	}
	if !d.Allowed && r.Limit.spec.Jitter > 0 {
		d.RetryAfter += r.Limit.Jitter(ctx, r.Key)
	}
	d.RetryAt = l.waitEnds(at, d.RetryAfter)
}

// waitEnds is when a wait that began at the store's reading at (past its
// Epoch) ends: the reading plus the wait, as two time.Time.Adds would
// give it, the monotonic reading included, in one Add where their sum is
// a time.Duration (a wait beyond it saturates, as Add does).
func (l *Limiter) waitEnds(at, wait time.Duration) time.Time {
	if wait <= math.MaxInt64-at {
		return l.epoch.Add(at + wait)
	}
	return l.epoch.Add(at).Add(wait)
}

// Allow is Take for one token of lim under key, reporting only whether it
// was admitted. Errors count as not admitted.
func (l *Limiter) Allow(ctx context.Context, lim *Limit, key string) bool {
	if key == "" {
		return false
	}
	if l.outcome != nil && lim != nil && lim.shards == nil {
		if lim.plain {
			// chargeOne's charge of a request with no NoReserve.
			o, _, err := l.outcome.TakeOutcome(ctx, lim, key, lim.one)
			return err == nil && o.Allowed
		}
		c, err := Request{Limit: lim, Key: key, Cost: 1}.Charged(engine.OpTake)
		if err != nil {
			return false
		}
		o, _, err := l.outcome.TakeOutcome(ctx, lim, key, c.Charge)
		return err == nil && o.Allowed
	}
	d, err := l.one(ctx, engine.OpTake, Request{Limit: lim, Key: key, Cost: 1})
	return err == nil && d.Allowed
}

// Peek answers what Take would, consuming nothing; for a concurrency
// limit, what Acquire would.
func (l *Limiter) Peek(ctx context.Context, r Request) (Decision, error) {
	if r.Limit != nil && r.Limit.params.Algorithm == engine.Concurrency {
		return l.peekSlot(ctx, r)
	}
	d, err := l.one(ctx, engine.OpPeek, r)
	l.advise(ctx, &d, r.Limit, r.Key, time.Time{})
	return d, err
}

// TakeAll asks several limits at once (per user AND per endpoint AND
// global): all are charged if every one admits, none if any rejects. It
// returns the combined decision (see Combine) and each limit's own.
func (l *Limiter) TakeAll(ctx context.Context, rs ...Request) (Decision, []Decision, error) {
	return combined(l.allInto(ctx, engine.OpTake, nil, rs))
}

// PeekAll answers what TakeAll would, consuming nothing.
func (l *Limiter) PeekAll(ctx context.Context, rs ...Request) (Decision, []Decision, error) {
	return combined(l.allInto(ctx, engine.OpPeek, nil, rs))
}

// combined is TakeAll's answer: the decisions with their combination.
func combined(ds []Decision, err error) (Decision, []Decision, error) {
	if err != nil {
		return Decision{}, nil, err
	}
	return Combine(ds), ds, nil
}

// AppendAll is TakeAll (op engine.OpTake) or PeekAll (engine.OpPeek) of
// requests the caller has charged with Request.Charged (for
// engine.OpTake), with each limit's decision appended to dst, in dst's
// memory when it has room: for a caller that decides request after
// request with one slice (a server's pooled working memory), and that
// judges its requests before deciding them (policy.Enforce), so that
// they are not judged twice. It returns the decisions alone: their
// combined decision is Combine(ds), which a caller that combines them
// its own way (a policy's verdict) need not pay for. cs is lent for the
// call alone.
func (l *Limiter) AppendAll(ctx context.Context, op engine.Op, dst []Decision, cs ...Charged) ([]Decision, error) {
	if op != engine.OpTake && op != engine.OpPeek {
		return nil, fmt.Errorf("sluice: AppendAll takes or peeks, not %v", op)
	}
	for i, c := range cs {
		switch {
		case c.Limit == nil:
			return nil, fmt.Errorf("take %d of %d: %w: a Charged without a limit (see Request.Charged)", i+1, len(cs), ErrInvalidLimit)
		case c.Key == "":
			return nil, noKey(c.Limit)
		}
	}
	ds, err := l.allCharged(ctx, op, cs, dst[:0])
	if err != nil {
		return nil, err
	}
	l.adviseAll(ctx, ds, cs)
	return ds, nil
}

func (l *Limiter) allInto(ctx context.Context, op engine.Op, dst []Decision, rs []Request) ([]Decision, error) {
	buf, err := chargeAll(op, rs)
	if err != nil {
		return nil, err
	}
	ds, err := l.allCharged(ctx, op, *buf, dst[:0])
	if err == nil {
		l.adviseAll(ctx, ds, *buf)
	}
	putCharged(buf)
	return ds, err
}

// chargedPool holds the memory in which a Limiter charges the requests of
// a TakeAll: it is handed to the store through an interface, so it would
// escape from the Limiter's frame, and a server deciding request after
// request would allocate it each time.
var chargedPool = sync.Pool{New: func() any { return new([]Charged) }}

// chargeAll charges every request of rs under op, in memory from
// chargedPool that the caller gives back with putCharged. A request
// without a key, or one that Request.Charged refuses, is an error.
func chargeAll(op engine.Op, rs []Request) (*[]Charged, error) {
	for _, r := range rs {
		if r.Key == "" {
			return nil, noKey(r.Limit)
		}
	}
	buf := chargedPool.Get().(*[]Charged)
	cs := (*buf)[:0]
	for i, r := range rs {
		c, err := r.Charged(op)
		if err != nil {
			*buf = cs
			putCharged(buf)
			return nil, fmt.Errorf("take %d of %d: %w", i+1, len(rs), err)
		}
		cs = append(cs, c)
	}
	*buf = cs
	return buf, nil
}

// putCharged gives buf back to chargedPool, keeping no limit or key alive.
func putCharged(buf *[]Charged) {
	clear(*buf)
	*buf = (*buf)[:0]
	chargedPool.Put(buf)
}

// Refund gives r.Cost tokens back to r's bucket, never above its capacity.
func (l *Limiter) Refund(ctx context.Context, r Request) (Decision, error) {
	return l.one(ctx, engine.OpRefund, r)
}

// RefundAll refunds several requests at once; each decision describes its
// bucket after the refund.
func (l *Limiter) RefundAll(ctx context.Context, rs ...Request) ([]Decision, error) {
	buf, err := chargeAll(engine.OpRefund, rs)
	if err != nil {
		return nil, err
	}
	ds, err := l.allCharged(ctx, engine.OpRefund, *buf, nil)
	putCharged(buf)
	return ds, err
}

// Reset refills key's bucket under lim.
func (l *Limiter) Reset(ctx context.Context, lim *Limit, key string) error {
	if key == "" {
		return noKey(lim)
	}
	return l.reset(ctx, lim, key)
}

// noKey is ErrNoKey for a request to lim.
func noKey(lim *Limit) error {
	if lim == nil {
		return ErrNoKey
	}
	return fmt.Errorf("limit %q: %w", lim.Name(), ErrNoKey)
}

// Decision is the answer to a request.
type Decision struct {
	Allowed bool
	// Capacity is the limit's capacity (burst) in whole tokens.
	Capacity int64
	// Remaining is the whole tokens left after this decision.
	Remaining int64
	// RetryAfter is how long to wait: before retrying a rejected request,
	// or before acting on an admitted reservation. Zero for a plain admit.
	// A Limiter adds the limit's Spec.Jitter to a rejection's.
	RetryAfter time.Duration
	// RetryAt is when RetryAfter ends on the Limiter's clock (see
	// Options): the time the store's answer reached the Limiter plus
	// RetryAfter, dated by the Limiter alone (stores answer waits, never
	// moments). A store measures the wait on its own clock, a moment
	// before its answer arrives, so RetryAt is never early on the
	// caller's clock, however far the two clocks are apart, and late by
	// at most the answer's trip back. Zero when RetryAfter is.
	RetryAt time.Time
	// ResetAfter is how long until the bucket is full again.
	ResetAfter time.Duration
	// Rule names the limit that decided.
	Rule string
	// Tokens is the exact number of tokens left (negative while a
	// reservation is in debt).
	Tokens float64
}

// Decide turns an engine's engine.Outcome into a Decision of l.
func (l *Limit) Decide(o engine.Outcome) (d Decision) {
	l.decideInto(&d, o)
	return d
}

// decideInto writes l's Decision of o into d, a zero Decision, field by
// field (RetryAt, which the Outcome does not date, is left zero). Inlined
// (keep it within the inlining budget) where d is the function's result,
// it writes the result in place: a returned literal is
// built in a temporary and copied, and the copy's wide loads stall on the
// fields' narrow stores (store forwarding fails).
func (l *Limit) decideInto(d *Decision, o engine.Outcome) {
	d.Allowed = o.Allowed
	d.Capacity = l.whole
	d.Remaining = max(o.Tokens, 0) / engine.TokenScale
	d.RetryAfter = engine.Duration(o.RetryAfter)
	d.ResetAfter = engine.Duration(o.ResetAfter)
	d.Rule = l.spec.Name
	d.Tokens = engine.FromMicroTokens(o.Tokens)
}

// Combine merges the decisions of an all-or-nothing request. It is
// rejected if any is; then it reports the rejection with the longest wait.
// Otherwise it reports the limit closest to rejecting (fewest remaining),
// with the longest reservation wait among them.
func Combine(ds []Decision) Decision {
	switch {
	case len(ds) == 0:
		return Decision{Allowed: true}
	case len(ds) == 1 && (!ds[0].Allowed || ds[0].RetryAfter >= 0 && (ds[0].RetryAt.IsZero() || !ds[0].RetryAt.Before(time.Time{}))):
		// One limit (the usual): its decision is the combined one, as the
		// loops below would find at more cost.
		return ds[0]
	}
	best := -1
	for i, d := range ds {
		if !d.Allowed && (best < 0 || d.RetryAfter > ds[best].RetryAfter) {
			best = i
		}
	}
	if best >= 0 {
		return ds[best]
	}
	best = 0
	var wait time.Duration
	var at time.Time
	for i, d := range ds {
		if d.Remaining < ds[best].Remaining {
			best = i
		}
		wait = max(wait, d.RetryAfter)
		if d.RetryAt.After(at) {
			at = d.RetryAt
		}
	}
	out := ds[best]
	out.RetryAfter, out.RetryAt = wait, at
	return out
}
