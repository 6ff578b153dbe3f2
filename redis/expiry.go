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
// up (TestAttackCancelledCallersReturnWhileRedisHangs). Short or spread
// deadlines neither make it look at the contexts each time
// (TestAttackShortDeadlinesDoNotRescanWaitingCallers) nor fire it more
// than once per fireEvery (TestAttackSpreadDeadlinesDoNotFireTheTimerForEach).
type expiry struct {
	mu             sync.Mutex
	calls          []*call     // watched; each knows its place (watchAt, -1 when not)
	timer          *time.Timer // made by the first watch
	at             time.Time   // when the timer fires; zero while it is stopped
	scanned, fired time.Time   // when the contexts were last looked at, and the timer fired
	fires          int         // the timer's firings
}

// A watched caller whose context ends early waits at most scanEvery to be
// woken; one whose deadline passes, fireEvery.
const scanEvery, fireEvery = 10 * time.Millisecond, time.Millisecond

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
	e.fired, e.fires = now, e.fires+1
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

// arm sets the timer for deadline, or for the next scan if sooner, and
// no sooner than fireEvery after the last firing.
func (e *expiry) arm(deadline, now time.Time) {
	d := max(min(deadline.Sub(now), e.scanned.Add(scanEvery).Sub(now)), e.fired.Add(fireEvery).Sub(now))
	e.at = now.Add(d)
	if e.timer == nil {
		e.timer = time.AfterFunc(d, e.fire)
	} else {
		e.timer.Reset(d)
	}
}
