package redis

import (
	"sync"
	"time"
)

// expiry wakes the callers of a batcher whose deadlines pass while they
// wait, with one timer for all: waiting on Done would make the Envoy
// service's lazily armed store deadline arm a timer, registered in the
// call's context, per queued call (BenchmarkShouldRateLimitRedis). The
// timer is set for the earliest deadline, and at most scanEvery after the
// last look at the contexts, which wakes the callers whose clients hung
// up (TestAttackCancelledCallersReturnWhileRedisHangs); contexts are not
// looked at each time short deadlines fire it
// (TestAttackShortDeadlinesDoNotRescanWaitingCallers).
type expiry struct {
	mu      sync.Mutex
	calls   []*call     // watched; each knows its place (watchAt, -1 when not)
	timer   *time.Timer // made by the first watch
	at      time.Time   // when the timer fires; zero while it is stopped
	scanned time.Time   // when the contexts were last looked at
}

// scanEvery is how long, at most, a watched caller whose context was
// cancelled before its deadline waits to be woken.
const scanEvery = 10 * time.Millisecond

// watch sends c.expired one value once c.deadline has passed or c.ctx
// has ended, unless forget comes first.
func (e *expiry) watch(c *call) {
	e.mu.Lock()
	now := time.Now()
	if len(e.calls) == 0 {
		e.scanned = now // none waited: no context to look at before
	}
	c.watchAt = len(e.calls)
	e.calls = append(e.calls, c)
	if e.at.IsZero() || c.deadline.Before(e.at) {
		e.arm(c.deadline, now)
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
	e.calls[len(e.calls)-1], e.calls = nil, e.calls[:len(e.calls)-1]
	c.watchAt = -1
}

// fire wakes the calls whose deadlines have passed or whose contexts
// have ended, and sets the timer for the rest.
func (e *expiry) fire() {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	scan := now.Sub(e.scanned) >= scanEvery
	if scan {
		e.scanned = now
	}
	var next time.Time
	for i := 0; i < len(e.calls); {
		c := e.calls[i]
		if !c.deadline.After(now) || scan && c.ctx.Err() != nil {
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

// arm sets the timer for deadline, or for the next scan if sooner.
func (e *expiry) arm(deadline, now time.Time) {
	e.at = deadline
	if scan := e.scanned.Add(scanEvery); scan.Before(e.at) {
		e.at = scan
	}
	if e.timer == nil {
		e.timer = time.AfterFunc(e.at.Sub(now), e.fire)
	} else {
		e.timer.Reset(e.at.Sub(now))
	}
}
