package sluice

// Concurrency limits: at most N requests of a key in flight at once.
//
// A rate limit counts requests as they start; a concurrency limit counts
// those that have not ended. Each admitted request holds a slot under a
// lease, a random 128-bit id kept in the key's state with the time it
// ends: the state of a key is the set of its (lease id, expiry) pairs.
// Acquiring drops the expired leases and admits when fewer than N are
// left; releasing removes the lease's id. A holder that dies without
// releasing (a crashed process, a client that took a lease and vanished)
// loses its slot when its lease ends, so no slot is lost for good; a
// holder that runs longer renews its lease before it ends.

import (
	"cmp"
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"time"

	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/deadline"
)

// newConcurrency validates and compiles the Spec of a concurrency limit:
// MaxInFlight slots held for Lease each; no rate, size or reservation.
func newConcurrency(s Spec) (*Limit, error) {
	bad := func(format string, a ...any) (*Limit, error) {
		return nil, fmt.Errorf("%w %q: %s", ErrInvalidLimit, s.Name, fmt.Sprintf(format, a...))
	}
	if s.Algorithm != Concurrency {
		return bad("max_in_flight and lease apply to concurrency limits only, not %s", s.Algorithm)
	}
	switch {
	case s.TokensPerSecond != 0 || s.Rate != 0 || s.Burst != 0 || s.Capacity != 0 || s.Period != 0:
		return bad("a concurrency limit counts requests in flight: it takes max_in_flight and lease, no rate, burst, capacity or period")
	case s.Reserve || s.MaxReserved != 0 || s.MaxDelay != 0 || s.Start != nil:
		return bad("a concurrency limit takes no reservation, max_delay or start")
	case s.Shards > 1:
		return bad("a concurrency limit cannot be sharded: its slots are counted in one set per key")
	case s.MaxInFlight < 1 || s.MaxInFlight > MaxInFlightLimit:
		return bad("max_in_flight must be a whole number from 1 to %d (got %d)", MaxInFlightLimit, s.MaxInFlight)
	case s.Jitter < 0:
		return bad("jitter must not be negative")
	}
	lease := cmp.Or(s.LeaseTerm, DefaultLeaseTerm)
	if lease < MinLeaseTerm || lease > MaxLeaseTerm {
		return bad("lease must be from %v to %v (got %v)", MinLeaseTerm, MaxLeaseTerm, s.LeaseTerm)
	}
	p := engine.Params{
		Algorithm: engine.Concurrency,
		Capacity:  int64(s.MaxInFlight) * engine.TokenScale,
		Period:    engine.Micros(lease),
		Offset:    -1,
	}
	l := &Limit{spec: s, params: p, nameID: maphash.String(nameSeed, s.Name)}
	l.setPlain()
	return l, nil
}

// MaxInFlight returns a concurrency limit's number of slots (0 for any
// other limit).
func (l *Limit) MaxInFlight() int {
	if l.params.Algorithm != engine.Concurrency {
		return 0
	}
	return int(l.params.Capacity / engine.TokenScale)
}

// LeaseTerm returns how long a concurrency limit's slot is held without a
// renewal (0 for any other limit).
func (l *Limit) LeaseTerm() time.Duration {
	if l.params.Algorithm != engine.Concurrency {
		return 0
	}
	return engine.Duration(l.params.Period)
}

// slot checks that r asks for one slot of a concurrency limit: the
// request Acquire, Peek and Release take.
func (r *Request) slot() error {
	if r.Limit == nil {
		return fmt.Errorf("%w: request for key %q has no limit", ErrInvalidLimit, r.Key)
	}
	if r.Limit.params.Algorithm != engine.Concurrency {
		return fmt.Errorf("limit %q is a %s, not a concurrency limit: %w", r.Limit.Name(), r.Limit.Algorithm(), ErrLeaseRequired)
	}
	if r.Cost != 0 && r.Cost != 1 {
		return fmt.Errorf("limit %q: a request holds one slot of a concurrency limit, not %v: %w", r.Limit.Name(), r.Cost, ErrInvalidCost)
	}
	if r.Reserve || r.MaxReserved != 0 {
		return fmt.Errorf("limit %q (concurrency): %w", r.Limit.Name(), ErrReserveUnsupported)
	}
	return nil
}

// CheckLease validates r as a request for one slot of a concurrency
// limit: the check every store's Lease makes first.
func (r Request) CheckLease() error { return r.slot() }

// keyedSlot is slot for a request to a Limiter, which needs a key.
func (r *Request) keyedSlot() error {
	if err := r.slot(); err != nil {
		return err
	}
	if r.Key == "" {
		return noKey(r.Limit)
	}
	return nil
}

// Lease is one held slot of a concurrency limit, from Limiter.Acquire.
// It is a small value: copy it freely; its methods are safe for
// concurrent use. The zero Lease holds nothing, and releasing it does
// nothing, so a caller may defer Release whether or not it was admitted.
type Lease struct {
	l   *Limiter
	lim *Limit
	key string
	id  engine.LeaseID
}

// ID returns the lease's id (zero for the zero Lease).
func (s Lease) ID() engine.LeaseID { return s.id }

// Limit returns the limit the lease holds a slot of.
func (s Lease) Limit() *Limit { return s.lim }

// Key returns the key the lease holds a slot of.
func (s Lease) Key() string { return s.key }

// Held reports whether s came from an admitted Acquire (it may have
// expired or been released since).
func (s Lease) Held() bool { return s.l != nil && !s.id.IsZero() }

// Release frees the slot. Releasing the zero Lease, or a lease already
// released or expired, does nothing and is no error; the error is the
// store's failure, after which the slot is freed when its lease ends.
// ctx is most often a request's, done when its client hangs up, so the
// release runs on one of its own (keeping ctx's values), bounded as a
// reservation's refund is: a client cannot keep its slot by leaving.
func (s Lease) Release(ctx context.Context) error {
	if !s.Held() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
	defer cancel()
	_, err := s.l.Release(ctx, Request{Limit: s.lim, Key: s.key}, s.id)
	return err
}

// Reacquire takes the lease's slot again for the limit's lease term from
// now, for a holder whose work runs longer than the lease: a live lease
// is extended, and one that had expired is acquired again if a slot is
// free, and else rejected (the slot was lost). Limiter.Renew, for a
// caller with the id alone, only ever extends.
func (s Lease) Reacquire(ctx context.Context) (Decision, error) {
	if !s.Held() {
		return Decision{}, fmt.Errorf("renew: the zero Lease holds no slot: %w", ErrLeaseRequired)
	}
	r := Request{Limit: s.lim, Key: s.key}
	d, err := s.l.store.Lease(ctx, engine.OpTake, r, s.id)
	if err != nil {
		return Decision{}, err
	}
	s.l.advise(ctx, &d, r.Limit, r.Key, time.Time{})
	return d, nil
}

// Acquire asks r.Limit, a concurrency limit, for one of r.Key's slots.
// When admitted, the Lease holds it until Lease.Release, or until the
// limit's lease ends unrenewed; the Decision's Remaining is the
// slots left. When rejected, the Lease is the zero Lease and the
// Decision's RetryAfter is the wait until enough leases end for a slot to
// be free: an upper bound, since a release frees one sooner.
//
// Like Take, and unlike semaphore.Weighted's Acquire, it does not block:
// a rejected caller decides whether to wait. A request holds one slot
// (Cost 0 or 1). A store error leaves no slot held by the caller; if the
// store acquired one before failing to answer, it is freed when its lease
// ends. The acquire runs to ctx's deadline (or a bound of its own when ctx
// has none) even once ctx is cancelled, so a caller that gives up while
// the store decides still gets the slot it was given, to release.
func (l *Limiter) Acquire(ctx context.Context, r Request) (Lease, Decision, error) {
	if err := r.keyedSlot(); err != nil {
		return Lease{}, Decision{}, err
	}
	id := engine.NewLeaseID()
	// ctx is most often a request's, done when its client hangs up: a
	// store that had taken the slot answered after the cancellation
	// into the void, and the slot stayed held under an id no caller had
	// until its lease ended, so a client hanging up as its request was
	// decided took a slot per hang-up with none of its own held.
	sctx, cancel := deadline.Detached(ctx, giveBackTimeout)
	defer cancel()
	d, err := l.store.Lease(sctx, engine.OpTake, r, id)
	if err != nil {
		return Lease{}, Decision{}, err
	}
	l.advise(ctx, &d, r.Limit, r.Key, time.Time{})
	if !d.Allowed {
		return Lease{}, d, nil
	}
	return Lease{l: l, lim: r.Limit, key: r.Key, id: id}, d, nil
}

// Release frees the slot that lease id holds of r.Key under r.Limit, a
// concurrency limit: what Lease.Release does, for a caller that has the id
// alone (the decision API's /v1/release). The Decision describes the key
// after the release; its Allowed reports whether id held a live lease
// (false for one already released, expired, or never acquired under this
// limit and key).
func (l *Limiter) Release(ctx context.Context, r Request, id engine.LeaseID) (Decision, error) {
	if err := r.keyedSlot(); err != nil {
		return Decision{}, err
	}
	return l.store.Lease(ctx, engine.OpRelease, r, id)
}

// Renew extends lease id of r.Key under r.Limit, a concurrency limit, to
// the limit's lease duration from now, while it is live: for a caller
// that has the id alone (the decision API's /v1/renew), whose work runs
// longer than the lease. Unlike Lease.Reacquire it never acquires: a lease
// that has ended or been released, or that was never acquired under this
// limit and key, is rejected and takes no slot, so that an id the caller
// supplies never becomes a lease of the caller's choosing. The Decision
// describes the key after the renewal; a rejection has no RetryAfter
// (the caller takes a new slot, or waits as its take says).
func (l *Limiter) Renew(ctx context.Context, r Request, id engine.LeaseID) (Decision, error) {
	if err := r.keyedSlot(); err != nil {
		return Decision{}, err
	}
	return l.store.Lease(ctx, engine.OpRenew, r, id)
}

// peekSlot answers what Acquire would for r.
func (l *Limiter) peekSlot(ctx context.Context, r Request) (Decision, error) {
	if err := r.slot(); err != nil {
		return Decision{}, err
	}
	d, err := l.store.Lease(ctx, engine.OpPeek, r, engine.LeaseID{})
	l.advise(ctx, &d, r.Limit, r.Key, time.Time{})
	return d, err
}

// Keep renews the lease every half of its limit's lease, on the limiter's
// clock (see Options), until stop is called: for a holder whose work may
// run longer than the lease, so that only a holder that died loses its
// slot. lost, when not nil, is told each renewal that failed (the store's
// error) or found the slot gone (a rejected Decision: the lease had ended
// and the slots were full). stop waits for a renewal in flight to finish,
// so a Release after stop is never undone by a late renewal. Keeping the
// zero Lease does nothing.
func (s Lease) Keep(lost func(Decision, error)) (stop func()) {
	if !s.Held() {
		return func() {}
	}
	every := s.lim.LeaseTerm() / 2
	stopped, stopKeep := context.WithCancel(context.Background())
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for s.l.sleep(stopped, every) == nil {
			// A renewal that takes longer than half a lease is too late
			// anyway; bounding it keeps stop from waiting on a hung store.
			ctx, cancel := context.WithTimeout(context.Background(), every)
			d, err := s.Reacquire(ctx)
			cancel()
			if (err != nil || !d.Allowed) && lost != nil {
				lost(d, err)
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			stopKeep()
			<-finished
		})
	}
}
