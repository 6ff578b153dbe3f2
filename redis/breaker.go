package redis

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// ErrBreakerOpen is returned, wrapped, while the circuit breaker keeps
// calls away from a Redis that has been failing.
var ErrBreakerOpen = errors.New("redis store: circuit breaker open")

const (
	breakerClosed int32 = iota
	breakerOpen
	breakerProbing
)

// breaker opens when, within one second, at least threshold calls failed
// and they are at least half of the calls: for backoff, every call fails at
// once instead of adding the timeout to every request. Then one call goes
// through as a probe; its success closes the breaker, its failure opens it
// again.
//
// A share rather than a run of consecutive failures: with many calls in
// flight, one stall of this process (CPU stolen, a GC) can make several of
// them miss their deadline together while Redis answers everything else,
// and opening then would fail every call for the backoff. A Redis that is
// down fails them all, and opens the breaker after threshold calls as a
// run would.
type breaker struct {
	state     atomic.Int32
	threshold int64
	backoff   time.Duration

	// The current one-second window: its start (Unix nanoseconds), its
	// calls and its failures. A new window starts them over.
	window        atomic.Int64
	calls, failed atomic.Int64

	mu       sync.Mutex
	until    time.Time
	onChange func(state int32, opened bool)
}

const breakerWindow = int64(time.Second)

func newBreaker(threshold int, backoff time.Duration, onChange func(int32, bool)) *breaker {
	b := &breaker{threshold: int64(threshold), backoff: backoff, onChange: onChange}
	b.window.Store(time.Now().UnixNano())
	return b
}

// allow reports whether a call may go to Redis.
func (b *breaker) allow() bool {
	if b.state.Load() == breakerClosed {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state.Load() {
	case breakerClosed:
		return true
	case breakerOpen:
		if time.Now().Before(b.until) {
			return false
		}
		b.set(breakerProbing, false)
		return true
	default: // a probe is out
		return false
	}
}

// count adds a call to the current window, starting a new one when a
// second has passed, and returns the window's calls and failures.
func (b *breaker) count(failed bool) (calls, failures int64) {
	now := time.Now().UnixNano()
	if w := b.window.Load(); now-w >= breakerWindow && b.window.CompareAndSwap(w, now) {
		// Calls counted by other goroutines between the swap and these
		// stores may be lost: the share is an estimate either way.
		b.calls.Store(0)
		b.failed.Store(0)
	}
	calls = b.calls.Add(1)
	if failed {
		return calls, b.failed.Add(1)
	}
	return calls, b.failed.Load()
}

// done records a call's result.
func (b *breaker) done(ok bool) {
	calls, failures := b.count(!ok)
	if ok {
		if b.state.Load() == breakerClosed {
			return
		}
		b.mu.Lock()
		b.set(breakerClosed, false)
		b.calls.Store(0)
		b.failed.Store(0)
		b.mu.Unlock()
		return
	}
	st := b.state.Load()
	if st == breakerOpen || (st == breakerClosed && (failures < b.threshold || 2*failures < calls)) {
		return
	}
	b.mu.Lock()
	if st := b.state.Load(); st == breakerProbing || st == breakerClosed {
		b.until = time.Now().Add(b.backoff)
		b.set(breakerOpen, true)
	}
	b.mu.Unlock()
}

// abort records a call that ended without telling anything about Redis
// (its caller gave up): a probe it was is released, so the next call
// probes instead.
func (b *breaker) abort() {
	if b.state.Load() != breakerProbing {
		return
	}
	b.mu.Lock()
	if b.state.Load() == breakerProbing {
		b.until = time.Now()
		b.set(breakerOpen, false)
	}
	b.mu.Unlock()
}

func (b *breaker) set(st int32, opened bool) {
	b.state.Store(st)
	if b.onChange != nil {
		b.onChange(st, opened)
	}
}
