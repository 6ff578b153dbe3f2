package sluice

import (
	"context"
	"time"
)

// Options configures a Limiter.
type Options struct {
	// Clock is the clock that Decision.RetryAt is read from and that
	// Wait sleeps on; nil is the system clock. Give a test the clock its
	// memory store was given (memory.Options.Clock): with a ManualClock,
	// Wait sleeps until the test moves the clock, never in real time. A
	// Clock that is not a TimerClock is read for the time, and Wait
	// sleeps in real time.
	Clock Clock
}

// NewWithOptions returns a Limiter over store configured by opts.
func NewWithOptions(store Store, opts Options) *Limiter {
	l := &Limiter{store: store, clock: opts.Clock}
	if l.outcome, _ = store.(OutcomeStore); l.outcome != nil {
		l.epoch = l.outcome.Epoch()
	}
	return l
}

// Now returns the time of the limiter's clock (see Options).
func (l *Limiter) Now() time.Time {
	if l.clock != nil {
		return l.clock.Now()
	}
	return time.Now()
}

// advise completes d, a store's decision of r, with what the caller is
// advised: a rejection's wait grows by the limit's jitter, and a wait gets
// its RetryAt, as of now, read from the limiter's clock when zero. This
// is the one place a decision is dated: stores answer waits, never
// moments. Nothing is read for a decision without a wait, the common
// admit.
func (l *Limiter) advise(ctx context.Context, d *Decision, lim *Limit, key string, now time.Time) time.Time {
	if d.RetryAfter <= 0 {
		if !d.RetryAt.IsZero() { // no write on the common admit: see Limiter.Take
			d.RetryAt = time.Time{}
		}
		return now
	}
	if !d.Allowed && lim != nil {
		d.RetryAfter += lim.Jitter(ctx, key)
	}
	if now.IsZero() {
		now = l.Now()
	}
	d.RetryAt = now.Add(d.RetryAfter)
	return now
}

// adviseAll is advise for the decisions ds of cs, with one reading of the
// clock.
func (l *Limiter) adviseAll(ctx context.Context, ds []Decision, cs []Charged) {
	var now time.Time
	for i := range min(len(ds), len(cs)) {
		now = l.advise(ctx, &ds[i], cs[i].Limit, cs[i].Key, now)
	}
}
