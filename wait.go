package sluice

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/engine"
)

// giveBackTimeout bounds the refund of a reservation whose waiter gave up:
// its own context is done by then, so the refund gets one of its own.
const giveBackTimeout = 2 * time.Second

// Wait blocks until r may go ahead, as golang.org/x/time/rate's Wait
// does: it charges r and returns nil once r's turn has come. It returns
// at once, having charged nothing, when ctx is done already, when the
// request can never succeed (a cost above the capacity: the store's
// error), or when the turn would come after ctx's deadline (a
// *LimitedError wrapping ErrBeyondDeadline, whose RetryAt says when to
// try again). If ctx is done while it sleeps, Wait gives the tokens back
// (Refund) and returns ctx.Err().
//
// On a token or leaky bucket, Wait reserves: one atomic store call admits
// r on credit only if its turn comes by the deadline, and Wait sleeps
// until that turn. The turn of a reservation is the time the bucket takes
// to refill the debt it leaves, debt/rate, so a turn by the deadline is a
// debt of at most (deadline - now) * rate: Wait sends that as the
// request's MaxReserved (or the limit's own max_reserved, or
// r.MaxReserved, when smaller), and the store refuses a later turn in the
// same step in which it would have charged it. So nothing is charged on
// the way to that error, and no other caller can take the turn between a
// look and a take, on any store. (Peeking first and then reserving would
// be racy; reserving and refunding on a late turn would charge, briefly,
// for nothing.) Without a deadline the debt is bounded only by the
// limit's max_reserved, if it has one. r.Reserve is ignored: Wait
// decides.
//
// On a fixed window or a sliding log, whose next turn is not a function
// of a debt, Wait takes without reserving; when refused it sleeps the
// wait the store advises (with the limit's jitter) and takes again, as
// long as the next try comes by the deadline. A rejection charges
// nothing, so that error path charges nothing either. Other callers may
// take the tokens first; then Wait sleeps again.
//
// Wait sleeps on the Limiter's clock (Options.Clock). The deadline is
// compared with that clock's time, which on the system clock is the
// context's own.
func (l *Limiter) Wait(ctx context.Context, r Request) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.Limit == nil {
		_, err := r.Charged(engine.OpTake) // names the missing limit
		return err
	}
	if r.Key == "" {
		return noKey(r.Limit)
	}
	if r.Limit.params.RateDen == 0 {
		return l.waitRetrying(ctx, r)
	}
	return l.waitReserved(ctx, r)
}

// waitReserved is Wait on a token or leaky bucket.
func (l *Limiter) waitReserved(ctx context.Context, r Request) error {
	p := &r.Limit.params
	own := p.MaxReserved
	if r.MaxReserved != 0 {
		mr, err := engine.ToMicroTokens(r.MaxReserved)
		if err != nil {
			return fmt.Errorf("limit %q: max_reserved: %w", r.Limit.Name(), err)
		}
		own = mr
	}
	bound := maxWaitDebt(p)
	if own > 0 {
		bound = min(bound, own)
	}
	deadline, hasDeadline := ctx.Deadline()
	if hasDeadline {
		window := max(deadline.Sub(l.Now()), 0) / time.Microsecond
		// The largest debt, in whole micro-tokens, that refills within
		// window microseconds: wait = ceil(debt*den/num) <= window.
		bound = min(bound, engine.MulDiv(int64(window), p.RateNum, p.RateDen))
	}
	req := r
	req.Reserve = true
	req.MaxReserved = engine.FromMicroTokens(bound)
	if bound == 0 {
		// No debt at all: a take of what the bucket holds now. (Zero would
		// mean "the limit's own" in a Request; a leaky bucket always
		// reserves, so there the smallest debt is asked and a turn past
		// the deadline is given back below.)
		req.Reserve, req.MaxReserved = false, 0
		if p.Reserve {
			req.MaxReserved = 1.0 / engine.TokenScale
		}
	}
	d, err := l.Take(ctx, req)
	if err != nil {
		if hasDeadline && errors.Is(err, ErrCostExceedsLimit) {
			// Above what a debt this short admits, though not above what
			// the limit admits with a longer deadline: the deadline is why.
			if _, cerr := (Request{Limit: r.Limit, Key: r.Key, Cost: r.Cost, Reserve: true, MaxReserved: r.MaxReserved}).Charged(engine.OpTake); cerr == nil {
				return &LimitedError{Rule: r.Limit.Name(), Key: r.Key, cause: ErrBeyondDeadline}
			}
		}
		return err
	}
	if !d.Allowed {
		le := limited(r, d)
		if hasDeadline {
			le.cause = ErrBeyondDeadline
		}
		return le
	}
	if d.RetryAfter <= 0 {
		return nil
	}
	if hasDeadline && d.RetryAt.After(deadline) {
		// Only when the store's answer took longer to come back than the
		// deadline left beyond the turn (or for the leaky bucket's
		// smallest debt above): the turn is past the deadline after all.
		return l.giveBack(ctx, req, &LimitedError{Rule: d.Rule, Key: r.Key, RetryAfter: d.RetryAfter, RetryAt: d.RetryAt, cause: ErrBeyondDeadline})
	}
	if err := l.sleep(ctx, d.RetryAfter); err != nil {
		return l.giveBack(ctx, req, err)
	}
	return nil
}

// waitRetrying is Wait on a fixed window or a sliding log.
func (l *Limiter) waitRetrying(ctx context.Context, r Request) error {
	deadline, hasDeadline := ctx.Deadline()
	req := r
	req.Reserve, req.MaxReserved = false, 0
	for {
		d, err := l.Take(ctx, req)
		if err != nil {
			return err
		}
		if d.Allowed {
			return nil
		}
		if hasDeadline && d.RetryAt.After(deadline) {
			le := limited(r, d)
			le.cause = ErrBeyondDeadline
			return le
		}
		// A rejection always advises a wait; at least a microsecond keeps
		// a store that said none from being asked in a tight loop.
		if err := l.sleep(ctx, max(d.RetryAfter, time.Microsecond)); err != nil {
			return err
		}
	}
}

// sleep waits d on the limiter's clock, or until ctx is done.
func (l *Limiter) sleep(ctx context.Context, d time.Duration) error {
	var c <-chan time.Time
	var stop func() bool
	if tc, ok := l.clock.(TimerClock); ok {
		c, stop = tc.NewTimer(d)
	} else {
		t := time.NewTimer(d)
		c, stop = t.C, t.Stop
	}
	defer stop()
	select {
	case <-c:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// giveBack refunds a reservation whose waiter gave up with err, and
// returns err, joined with the refund's failure when it fails. The
// waiter's context may be done, so the refund runs on one of its own,
// which keeps the waiter's values (the Caller) and bounds the call.
func (l *Limiter) giveBack(ctx context.Context, r Request, err error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
	defer cancel()
	r.Reserve, r.MaxReserved = false, 0
	if _, gerr := l.Refund(ctx, r); gerr != nil {
		return errors.Join(err, fmt.Errorf("sluice: giving back the reservation of %q for key %q: %w", r.Limit.Name(), r.Key, gerr))
	}
	return err
}

// maxWaitDebt is the largest debt, in micro-tokens, that Wait asks a
// bucket to allow when nothing else bounds it: what every store computes
// with exactly. The tightest is Redis's Lua, whose doubles hold
// (capacity + debt) * RateDen exactly below 2^52.
func maxWaitDebt(p *engine.Params) int64 { return max((1<<52-1)/p.RateDen-p.Capacity-1, 0) }
