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

// breaker opens after threshold consecutive failures: for backoff, every
// call fails at once instead of adding the timeout to every request. Then
// one call goes through as a probe; its success closes the breaker, its
// failure opens it again.
type breaker struct {
	state     atomic.Int32
	fails     atomic.Int32
	threshold int32
	backoff   time.Duration

	mu       sync.Mutex
	until    time.Time
	onChange func(state int32, opened bool)
}

func newBreaker(threshold int, backoff time.Duration, onChange func(int32, bool)) *breaker {
	return &breaker{threshold: int32(threshold), backoff: backoff, onChange: onChange}
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

// done records a call's result.
func (b *breaker) done(ok bool) {
	if ok {
		if b.state.Load() == breakerClosed {
			if b.fails.Load() != 0 {
				b.fails.Store(0)
			}
			return
		}
		b.mu.Lock()
		b.fails.Store(0)
		b.set(breakerClosed, false)
		b.mu.Unlock()
		return
	}
	n := b.fails.Add(1)
	st := b.state.Load()
	if st == breakerOpen || (st == breakerClosed && n < b.threshold) {
		return
	}
	b.mu.Lock()
	if st := b.state.Load(); st == breakerProbing || (st == breakerClosed && b.fails.Load() >= b.threshold) {
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
