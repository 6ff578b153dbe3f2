package envoyrls

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/deadline"
)

// storeContext is deadline.ForStore(ctx, st, d), except that the
// deadline's timer is armed only when something waits for it (Done): a
// call the store answers without leaving the process, as the Redis store
// answers a key its over-limit cache knows to be short, arms none, nor
// does a call the Redis store queues for a batch (its one timer watches
// the deadline), where context.WithTimeout arms and stops a timer for
// every call. The
// deadline is the same, from the same moment, and so are the answers of
// Err, Deadline and Value whether or not the timer was armed.
//
// The context is ended with end (a nil *lazyDeadline, when ctx is returned
// as it is, ends nothing): a method value would be an allocation more.
func storeContext(ctx context.Context, st sluice.Store, d time.Duration) (context.Context, *lazyDeadline) {
	end, ok := deadline.Needed(ctx, st, d)
	if !ok {
		return ctx, nil
	}
	c := &lazyDeadline{parent: ctx, deadline: end}
	return c, c
}

const (
	lazyIdle  int32 = iota // no timer yet
	lazyArmed              // ctx is context.WithDeadline(parent, deadline)
	lazyEnded              // ended before anything waited for it
)

// lazyDeadline is parent with a deadline, armed as a context.WithDeadline
// the first time Done is asked for (by the store, or by a context derived
// from it, which asks for it too).
type lazyDeadline struct {
	parent   context.Context
	deadline time.Time
	state    atomic.Int32
	mu       sync.Mutex // held to arm or end it
	ctx      context.Context
	cancel   context.CancelFunc
}

func (c *lazyDeadline) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *lazyDeadline) Done() <-chan struct{} { return c.arm().Done() }

func (c *lazyDeadline) Err() error {
	switch c.state.Load() {
	case lazyArmed:
		return c.ctx.Err()
	case lazyEnded:
		return context.Canceled
	}
	if err := c.parent.Err(); err != nil {
		return err
	}
	if !time.Now().Before(c.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// Value is the armed context's, so that the context package finds its
// cancellation (a context derived from c registers with it rather than
// starting a goroutine), else the parent's.
func (c *lazyDeadline) Value(key any) any {
	if c.state.Load() == lazyArmed {
		return c.ctx.Value(key)
	}
	return c.parent.Value(key)
}

// arm returns the armed context, arming it first if need be: already
// cancelled when c has ended.
func (c *lazyDeadline) arm() context.Context {
	if c.state.Load() == lazyArmed {
		return c.ctx
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil {
		c.ctx, c.cancel = context.WithDeadline(c.parent, c.deadline)
		// One step from idle to armed: an end that lands between a check
		// of the state and a store of it would be overwritten, and the
		// context would never end (TestStoreContextConcurrent).
		if !c.state.CompareAndSwap(lazyIdle, lazyArmed) {
			c.cancel() // ended before, or while, it was armed
			c.state.Store(lazyArmed)
		}
	}
	return c.ctx
}

// end is the cancel function: it stops the timer when one was armed.
func (c *lazyDeadline) end() {
	if c == nil {
		return
	}
	if c.state.CompareAndSwap(lazyIdle, lazyEnded) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx != nil {
		c.cancel()
	} else {
		c.state.Store(lazyEnded)
	}
}
