package redis

import (
	"sync"
	"time"
)

// expiry wakes the callers of a batcher whose deadlines pass while they
// wait, with one timer for all of them: a caller that waited on its
// context's Done would make a context whose timer is armed only when
// asked (the Envoy service's store deadline) arm one for every queued
// call, with its registration in the parent context, for a deadline that
// almost never passes (BenchmarkShouldRateLimitRedis). The timer is set
// for the earliest deadline, and at most scanEvery ahead while calls are
// watched: each time it fires it also wakes the callers whose contexts
// were cancelled (a client that hung up), so that a flood of calls given
// up while Redis hangs does not keep a goroutine each until their
// deadlines (TestAttackCancelledCallersReturnWhileRedisHangs).
type expiry struct {
	mu    sync.Mutex
	calls []*call // watched; each knows its place (watchAt, -1 when not)
	timer *time.Timer
	at    time.Time // when the timer fires; zero while it is stopped
}

// scanEvery is how long, at most, a watched caller whose context was
// cancelled before its deadline waits to be woken.
const scanEvery = 10 * time.Millisecond

func newExpiry() *expiry {
	e := &expiry{}
	e.timer = time.AfterFunc(time.Hour, e.fire)
	e.timer.Stop()
	return e
}

// watch sends c.expired one value once c.deadline has passed or c.ctx
// has ended, unless forget comes first.
func (e *expiry) watch(c *call) {
	e.mu.Lock()
	c.watchAt = len(e.calls)
	e.calls = append(e.calls, c)
	if e.at.IsZero() || c.deadline.Before(e.at) {
		e.arm(c.deadline, time.Now())
	}
	e.mu.Unlock()
}

// forget stops watching c, if it is still watched.
func (e *expiry) forget(c *call) {
	e.mu.Lock()
	if c.watchAt >= 0 {
		e.remove(c)
	}
	e.mu.Unlock()
}

// remove takes c out of the watched calls, the last taking its place.
func (e *expiry) remove(c *call) {
	last := e.calls[len(e.calls)-1]
	e.calls[c.watchAt], last.watchAt = last, c.watchAt
	e.calls[len(e.calls)-1] = nil
	e.calls = e.calls[:len(e.calls)-1]
	c.watchAt = -1
}

// fire wakes the calls whose deadlines have passed or whose contexts
// have ended, and sets the timer for the rest.
func (e *expiry) fire() {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	var next time.Time
	for i := 0; i < len(e.calls); {
		c := e.calls[i]
		if !c.deadline.After(now) || c.ctx.Err() != nil {
			e.remove(c)
			c.expired <- struct{}{} // buffered, and a call is watched once per wait
			continue
		}
		if next.IsZero() || c.deadline.Before(next) {
			next = c.deadline
		}
		i++
	}
	e.at = time.Time{}
	if len(e.calls) > 0 {
		e.arm(next, now)
	}
}

// arm sets the timer for deadline, or scanEvery from now if sooner.
func (e *expiry) arm(deadline, now time.Time) {
	e.at = deadline
	if scan := now.Add(scanEvery); scan.Before(e.at) {
		e.at = scan
	}
	e.timer.Reset(e.at.Sub(now))
}
