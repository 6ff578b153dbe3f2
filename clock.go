package sluice

import (
	"slices"
	"sync"
	"time"
)

// Clock tells the time. Stores that keep state in this process take one;
// stores whose server has a clock (Redis, PostgreSQL) use the server's and
// take a Clock only in tests.
type Clock interface {
	Now() time.Time
}

// TimerClock is a Clock that can also wake a sleeper: the clock that
// Limiter.Wait sleeps on (see Options). ManualClock is one, so that a test
// of Wait never sleeps in real time.
type TimerClock interface {
	Clock
	// NewTimer returns a channel that receives the time once the clock
	// has moved d past now (at once for d <= 0), and a stop function
	// that reports whether it stopped the timer before it fired.
	NewTimer(d time.Duration) (c <-chan time.Time, stop func() bool)
}

// ManualClock is a Clock that moves only when told, for tests and
// simulations: no test of sluice sleeps to wait for tokens. Its timers
// fire when Set or Advance moves it to or past their time.
type ManualClock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*manualTimer
	changed chan struct{} // closed when a timer is added or removed
}

type manualTimer struct {
	at time.Time
	c  chan time.Time
}

// NewManualClock returns a clock stopped at t.
func NewManualClock(t time.Time) *ManualClock { return &ManualClock{now: t} }

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t, backwards too, firing the timers due by t.
func (c *ManualClock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.fire()
	c.mu.Unlock()
}

// Advance moves the clock forward by d, firing the timers due by then.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.fire()
	c.mu.Unlock()
}

// NewTimer implements TimerClock: the timer fires when the clock is moved
// to d after its present time, or later.
func (c *ManualClock) NewTimer(d time.Duration) (<-chan time.Time, func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{at: c.now.Add(d), c: make(chan time.Time, 1)}
	if d <= 0 {
		t.c <- c.now
		return t.c, func() bool { return false }
	}
	c.timers = append(c.timers, t)
	c.notify()
	return t.c, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		i := slices.Index(c.timers, t)
		if i < 0 {
			return false
		}
		c.timers = slices.Delete(c.timers, i, i+1)
		c.notify()
		return true
	}
}

// PendingTimers returns the number of timers that have not fired or been
// stopped, and a channel closed at the next change of that number: a test
// waits for a sleeper to be asleep before it moves the clock, without
// sleeping itself.
func (c *ManualClock) PendingTimers() (int, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.changed == nil {
		c.changed = make(chan struct{})
	}
	return len(c.timers), c.changed
}

// fire sends to the timers due by now; c.mu is held.
func (c *ManualClock) fire() {
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.now) {
			kept = append(kept, t)
		} else {
			t.c <- c.now
		}
	}
	if len(kept) != len(c.timers) {
		clear(c.timers[len(kept):])
		c.timers = kept
		c.notify()
	}
}

// notify wakes the callers of PendingTimers; c.mu is held.
func (c *ManualClock) notify() {
	if c.changed != nil {
		close(c.changed)
		c.changed = nil
	}
}
