package sluice

import (
	"sync"
	"time"
)

// Clock tells the time. Stores that keep state in this process take one;
// stores whose server has a clock (Redis, PostgreSQL) use the server's and
// take a Clock only in tests.
type Clock interface {
	Now() time.Time
}

// ManualClock is a Clock that moves only when told, for tests and
// simulations: no test of sluice sleeps to wait for tokens.
type ManualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewManualClock returns a clock stopped at t.
func NewManualClock(t time.Time) *ManualClock { return &ManualClock{now: t} }

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t, backwards too.
func (c *ManualClock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// Advance moves the clock forward by d.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
