package sluice

import (
	"context"
	"fmt"
	"time"
)

// Request asks a Limit for Cost tokens on behalf of Key.
type Request struct {
	Limit *Limit
	// Key identifies whose bucket to charge within the limit ("user-42").
	// Stores namespace it by the limit (see StorageKey), so the same key
	// under two limits is two buckets.
	Key string
	// Cost is the number of tokens asked for; zero means 1. Fractions are
	// fine (0.5 is half a token).
	Cost float64
	// Reserve admits the request even when the bucket is short, by taking
	// the tokens on credit up to MaxReserved (without bound when no
	// max_reserved is set); the Decision's RetryAfter then says when the
	// reserved turn comes. A reserving request may cost up to the capacity
	// plus MaxReserved. Token buckets, leaky buckets and fixed windows.
	Reserve bool
	// MaxReserved overrides the limit's MaxReserved for this request, in
	// tokens; zero keeps the limit's. It is never more than MaxDebt.
	MaxReserved float64
	// NoReserve refuses every reservation, even where the limit makes each
	// request reserve (a leaky bucket, Spec.Reserve): for a caller that
	// cannot hold a request until its turn (Envoy's rate limit service),
	// which would otherwise pass at once every turn it is given. A leaky
	// bucket then admits one request per 1/rate; a bucket of zero capacity
	// admits nothing.
	NoReserve bool
}

// Charge is a Request in the integer form the algorithms take.
type Charge struct {
	Cost        int64 // micro-tokens
	Reserve     bool
	MaxReserved int64 // micro-tokens
}

// Charge decides what r asks of its limit under op, in the integer form
// the algorithms take. It is the one place where a request's cost is
// judged: every store calls it, so every store refuses the same input
// with the same error, and policy.Enforce calls it to tell an impossible
// request from one that is merely short of tokens.
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
//     charged, the capacity plus the limit's max_reserved (MaxDebt when
//     it sets none; zero for a sliding log): a larger refund (infinity
//     included) is a refund of that, which fills the bucket.
//   - Reserving (Reserve, or a limit that always reserves: a leaky
//     bucket, Spec.Reserve; never with NoReserve) needs a token bucket,
//     leaky bucket or fixed window, else ErrReserveUnsupported. A MaxReserved of the request's
//     own replaces the limit's: a valid amount, of which at most MaxDebt
//     counts.
func (r Request) Charge(op Op) (Charge, error) {
	if r.Limit == nil {
		return Charge{}, fmt.Errorf("%w: request for key %q has no limit", ErrInvalidLimit, r.Key)
	}
	if r.Limit.params.Algorithm == Concurrency {
		return Charge{}, fmt.Errorf("limit %q: %w", r.Limit.Name(), ErrLeaseRequired)
	}
	if op > OpRefund {
		return Charge{}, fmt.Errorf("limit %q: %v is a call on a concurrency limit's leases (Store.Lease), not a take", r.Limit.Name(), op)
	}
	if r.Limit.shards != nil {
		return r.shardedCharge(op)
	}
	p := &r.Limit.params
	if (r.Cost == 0 || r.Cost == 1) && !r.Reserve && r.MaxReserved == 0 && p.Capacity >= TokenScale {
		// The common request, one token: nothing to convert or validate.
		return Charge{Cost: TokenScale, Reserve: p.Reserve && !r.NoReserve, MaxReserved: p.MaxReserved}, nil
	}
	cost := r.Cost
	if cost == 0 {
		cost = 1
	}
	ch := Charge{Reserve: (r.Reserve || p.Reserve) && !r.NoReserve, MaxReserved: p.MaxReserved}
	if ch.Reserve && (p.Algorithm == SlidingLog || p.Algorithm == SlidingWindow || p.Calendar != 0) {
		return Charge{}, fmt.Errorf("limit %q (%s): %w", r.Limit.Name(), p.Algorithm, ErrReserveUnsupported)
	}
	var err error
	if r.MaxReserved != 0 {
		if ch.MaxReserved, err = maxReserved(r.MaxReserved, p); err != nil {
			return Charge{}, fmt.Errorf("limit %q: max_reserved %w", r.Limit.Name(), err)
		}
	}
	most := p.Capacity
	switch {
	case op == OpRefund:
		most += p.MaxReserved
	case ch.Reserve:
		most += ch.MaxReserved
	}
	if ch.Cost, err = r.Limit.cost(op, cost, most); err != nil {
		return Charge{}, err
	}
	return ch, nil
}

// Op says whether a store call consumes tokens.
type Op uint8

// String returns "take", "peek", "refund" or "renew": the name of op in
// metrics and errors.
func (op Op) String() string {
	switch op {
	case OpTake:
		return "take"
	case OpPeek:
		return "peek"
	case OpRefund:
		return "refund"
	case OpRenew:
		return "renew"
	}
	return fmt.Sprintf("op(%d)", uint8(op))
}

// LeaseString names op as a call on a concurrency limit's leases
// (Store.Lease): "acquire", "lease_peek", "release" or "renew", in
// metrics and errors.
func (op Op) LeaseString() string {
	switch op {
	case OpTake:
		return "acquire"
	case OpRefund:
		return "release"
	case OpRenew:
		return "renew"
	}
	return "lease_peek"
}

const (
	// OpTake charges admitted requests.
	OpTake Op = iota
	// OpPeek answers what a take would, consuming nothing.
	OpPeek
	// OpRefund gives Cost tokens back, never above the capacity, for a
	// request that was charged but not carried out (Envoy's negative
	// hits). A refund larger than one request can be charged gives back
	// that much (see Request.Charge). A key with no state is full and
	// stays so. Its Decision is allowed and describes the bucket after the
	// refund.
	OpRefund
	// OpRenew extends a concurrency limit's lease that is still live, and
	// never acquires a slot (Store.Lease only; see StepLease): what the
	// decision API's /v1/renew asks, where the caller has a lease id alone
	// and must not choose one.
	OpRenew
)

// Store keeps bucket state and applies the algorithms atomically. Every
// engine (memory, redis, postgres) implements it with the same arithmetic,
// checked by the conformance vectors in package conformance.
type Store interface {
	// Take decides one request. With OpTake an admitted request is charged
	// atomically; a rejected one changes nothing. OpRefund gives its cost
	// back. A store that decides on the system clock may set the
	// Decision's RetryAt from its own reading (see Decision.RetryAt); one
	// that leaves it zero lets the Limiter read its clock.
	Take(ctx context.Context, op Op, r Request) (Decision, error)
	// TakeAll decides several requests all-or-nothing: they are charged
	// only if every one is admitted, and a rejection charges none of them.
	// The decisions are in the order of rs. OpRefund refunds every one.
	TakeAll(ctx context.Context, op Op, rs []Request) ([]Decision, error)
	// Reset forgets the state of key under l: the bucket is full again.
	Reset(ctx context.Context, l *Limit, key string) error
	// Lease applies op to lease id of r.Key under r.Limit, a concurrency
	// limit, atomically, as StepLease defines: OpTake acquires a slot (or
	// renews id's), OpPeek answers what OpTake would, OpRefund releases
	// id's slot and OpRenew renews id's live lease alone. Other limits are
	// ErrLeaseRequired (see Request.CheckLease).
	Lease(ctx context.Context, op Op, r Request, id LeaseID) (Decision, error)
}

// StorageKey is the name under which a store keeps the state of key under
// l: "{algorithm}:{limit}:{key}", for example "tb:per-org-rps:org-abc". A
// Redis hash tag inside key ("{user-42}") keeps one identity's buckets in
// one Cluster slot.
func StorageKey(l *Limit, key string) string {
	return l.params.Algorithm.KeyPrefix() + ":" + l.spec.Name + ":" + key
}

// Limiter is the library's entry point: it validates requests and asks its
// Store. It is safe for concurrent use. It expands the requests of a
// sharded limit (Spec.Shards) into requests to its shards, so such a limit
// must be used through a Limiter: a Store asked directly would keep it in
// one bucket of its whole capacity, beside the shards.
type Limiter struct {
	store   Store
	allow   allowStore   // store, when it answers Allow itself; else nil
	outcome outcomeStore // store, when it answers in Outcomes; else nil
	clock   Clock        // nil: the system clock (see Options)
	rng     *lockedRand  // the choice of shards; nil draws from math/rand/v2
}

// New returns a Limiter over store.
func New(store Store) *Limiter { return NewWithOptions(store, Options{}) }

// allowStore is a Store that answers Limiter.Allow without building a
// Decision (the memory store), whose copying through the calls' frames
// costs more than the rest of an in-process decision.
type allowStore interface {
	Allow(ctx context.Context, r Request) bool
}

// outcomeStore is a Store that answers Take in an Outcome and, for an
// outcome with a wait decided on the system clock, the Decision's RetryAt
// (else zero), from which Limiter.Take builds the Decision in its own
// frame.
type outcomeStore interface {
	TakeOutcome(ctx context.Context, op Op, r Request) (Outcome, time.Time, error)
}

// Store returns the limiter's store.
func (l *Limiter) Store() Store { return l.store }

// Take asks for r.Cost tokens and charges them if admitted.
func (l *Limiter) Take(ctx context.Context, r Request) (d Decision, err error) {
	if r.Key == "" {
		return d, noKey(r.Limit)
	}
	if l.outcome == nil || r.Limit == nil || r.Limit.shards != nil {
		return l.takeStore(ctx, r)
	}
	o, at, err := l.outcome.TakeOutcome(ctx, OpTake, r)
	if err != nil {
		return d, err
	}
	dated := l.clock == nil && !at.IsZero() // RetryAt on the limiter's clock
	if o.RetryAfter > 0 && (!dated || (!o.Allowed && r.Limit.spec.Jitter > 0)) {
		return l.takeAdvised(ctx, r, o, at, dated)
	}
	// Nothing to advise: the Decision is written where it is returned, not
	// built in a temporary and copied (see outcomeStore and decideInto).
	r.Limit.decideInto(&d, o, at)
	return d, nil
}

// takeStore is Take through Store.Take: a store without TakeOutcome, or a
// sharded limit.
func (l *Limiter) takeStore(ctx context.Context, r Request) (Decision, error) {
	d, err := l.one(ctx, OpTake, r)
	l.advise(ctx, &d, &r, time.Time{})
	return d, err
}

// takeAdvised is the rest of Take for an outcome with a wait that advise
// changes: jitter, or a RetryAt the Limiter dates itself.
func (l *Limiter) takeAdvised(ctx context.Context, r Request, o Outcome, at time.Time, dated bool) (Decision, error) {
	d := r.Limit.Decide(o)
	if dated {
		d.RetryAt = at
	}
	l.advise(ctx, &d, &r, time.Time{})
	return d, nil
}

// Allow is Take for one token of lim under key, reporting only whether it
// was admitted. Errors count as not admitted.
func (l *Limiter) Allow(ctx context.Context, lim *Limit, key string) bool {
	r := Request{Limit: lim, Key: key, Cost: 1}
	if key == "" {
		return false
	}
	if l.allow != nil && (lim == nil || lim.shards == nil) {
		return l.allow.Allow(ctx, r)
	}
	d, err := l.one(ctx, OpTake, r)
	return err == nil && d.Allowed
}

// Peek answers what Take would, consuming nothing; for a concurrency
// limit, what Acquire would.
func (l *Limiter) Peek(ctx context.Context, r Request) (Decision, error) {
	if r.Limit != nil && r.Limit.params.Algorithm == Concurrency {
		return l.peekSlot(ctx, r)
	}
	d, err := l.one(ctx, OpPeek, r)
	l.advise(ctx, &d, &r, time.Time{})
	return d, err
}

// TakeAll asks several limits at once (per user AND per endpoint AND
// global): all are charged if every one admits, none if any rejects. It
// returns the combined decision (see Combine) and each limit's own.
func (l *Limiter) TakeAll(ctx context.Context, rs ...Request) (Decision, []Decision, error) {
	return combined(l.allInto(ctx, OpTake, nil, rs))
}

// PeekAll answers what TakeAll would, consuming nothing.
func (l *Limiter) PeekAll(ctx context.Context, rs ...Request) (Decision, []Decision, error) {
	return combined(l.allInto(ctx, OpPeek, nil, rs))
}

// combined is TakeAll's answer: the decisions with their combination.
func combined(ds []Decision, err error) (Decision, []Decision, error) {
	if err != nil {
		return Decision{}, nil, err
	}
	return Combine(ds), ds, nil
}

// TakeAllInto is TakeAll with each limit's decision in dst's memory when
// it has room for them, for a caller that decides request after request
// with one slice (a server's pooled working memory). Only a store that
// can fill it does (the memory store, and the metrics' instrumentation
// around it); others allocate as TakeAll does. It returns the decisions
// alone: their combined decision is Combine(ds), which a caller that
// combines them its own way (a policy's verdict) need not pay for.
func (l *Limiter) TakeAllInto(ctx context.Context, dst []Decision, rs ...Request) ([]Decision, error) {
	return l.allInto(ctx, OpTake, dst, rs)
}

// PeekAllInto is PeekAll with the decisions in dst's memory, as
// TakeAllInto.
func (l *Limiter) PeekAllInto(ctx context.Context, dst []Decision, rs ...Request) ([]Decision, error) {
	return l.allInto(ctx, OpPeek, dst, rs)
}

func (l *Limiter) allInto(ctx context.Context, op Op, dst []Decision, rs []Request) ([]Decision, error) {
	ds, err := l.all(ctx, op, rs, dst[:0])
	if err != nil {
		return nil, err
	}
	l.adviseAll(ctx, ds, rs)
	return ds, nil
}

// decisionAppender is a Store that can put TakeAll's decisions in its
// caller's memory: AppendTakeAll is TakeAll with the decisions appended
// to dst.
type decisionAppender interface {
	AppendTakeAll(ctx context.Context, op Op, rs []Request, dst []Decision) ([]Decision, error)
}

// Refund gives r.Cost tokens back to r's bucket, never above its capacity.
func (l *Limiter) Refund(ctx context.Context, r Request) (Decision, error) {
	return l.one(ctx, OpRefund, r)
}

// RefundAll refunds several requests at once; each decision describes its
// bucket after the refund.
func (l *Limiter) RefundAll(ctx context.Context, rs ...Request) ([]Decision, error) {
	return l.all(ctx, OpRefund, rs, nil)
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

// Outcome is an algorithm's answer in integers, the form every engine
// returns before it becomes a Decision.
type Outcome struct {
	Allowed bool
	// Tokens left after the decision, in micro-tokens; negative while a
	// reservation is in debt.
	Tokens int64
	// RetryAfter is the wait in microseconds: until a rejected request
	// would be admitted, or until an admitted reservation's turn.
	RetryAfter int64
	// ResetAfter is the wait in microseconds until the bucket is full.
	ResetAfter int64
}

// Decision is the answer to a request.
type Decision struct {
	Allowed bool
	// Limit is the capacity (burst) in whole tokens.
	Limit int64
	// Remaining is the whole tokens left after this decision.
	Remaining int64
	// RetryAfter is how long to wait: before retrying a rejected request,
	// or before acting on an admitted reservation. Zero for a plain admit.
	// A Limiter adds the limit's Spec.Jitter to a rejection's.
	RetryAfter time.Duration
	// RetryAt is when RetryAfter ends on the Limiter's clock (see
	// Options): the moment the store's answer says the wait is over. A
	// store in the process dates it from its own reading of the system
	// clock, the time it decided at (when the Limiter's clock is the
	// system clock too); otherwise it is the time the store's answer
	// reached the Limiter plus RetryAfter. A store with a server measures
	// the wait on the server's clock, a moment before its answer arrives,
	// so RetryAt is never early on the caller's clock, however far the two
	// clocks are apart, and late by at most the answer's trip back. Zero
	// when RetryAfter is.
	RetryAt time.Time
	// ResetAfter is how long until the bucket is full again.
	ResetAfter time.Duration
	// Rule names the limit that decided.
	Rule string
	// Tokens is the exact number of tokens left (negative while a
	// reservation is in debt).
	Tokens float64
}

// Decide turns an engine's Outcome into a Decision of l.
func (l *Limit) Decide(o Outcome) (d Decision) {
	l.decideInto(&d, o, time.Time{})
	return d
}

// decideInto writes l's Decision of o, with RetryAt given, into d, field
// by field. Inlined (keep it within the inlining budget) where d is the
// function's result, it writes the result in place: a returned literal is
// built in a temporary and copied, and the copy's wide loads stall on the
// fields' narrow stores (store forwarding fails).
func (l *Limit) decideInto(d *Decision, o Outcome, retryAt time.Time) {
	d.Allowed = o.Allowed
	d.Limit = l.params.Capacity / TokenScale
	d.Remaining = max(o.Tokens, 0) / TokenScale
	d.RetryAfter = Duration(o.RetryAfter)
	d.RetryAt = retryAt
	d.ResetAfter = Duration(o.ResetAfter)
	d.Rule = l.spec.Name
	d.Tokens = FromMicroTokens(o.Tokens)
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
