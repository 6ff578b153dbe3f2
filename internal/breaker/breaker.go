// Package breaker is the circuit breaker the stores put in front of their
// servers: after enough failed calls it fails calls at once for a backoff,
// so that a dead server does not add its timeout to every request, then
// lets one call through as a probe.
package breaker

import (
	"sync"
	"sync/atomic"
	"time"
)

// now is the breaker's clock; its tests step a fake one.
var now = time.Now

// The states, as onChange is told them.
const (
	Closed int32 = iota
	Open
	Probing
)

// Breaker opens when, within one window (one second, or longer: see
// NewWindowed), at least threshold calls failed and they are at least half
// of the calls: for backoff, every call fails at once instead of adding
// the timeout to every request. Then one call goes through as a probe; its
// success closes the breaker, its failure opens it again.
//
// A share rather than a run of consecutive failures: with many calls in
// flight, one stall of this process (CPU stolen, a GC) can make several of
// them miss their deadline together while the server answers everything
// else, and opening then would fail every call for the backoff. A server
// that is down fails them all, and opens the breaker after threshold calls
// as a run would.
type Breaker struct {
	state     atomic.Int32
	threshold int64
	backoff   time.Duration

	// The current window: its start (Unix nanoseconds), its calls and its
	// failures. A new window starts them over after span nanoseconds.
	window        atomic.Int64
	span          int64
	calls, failed atomic.Int64

	mu       sync.Mutex
	until    time.Time
	onChange func(state int32, opened bool)
}

// New returns a closed Breaker that opens when at least threshold calls
// failed within a second and they are at least half of its calls, stays
// open for backoff, and tells onChange (when not nil) every change of state.
func New(threshold int, backoff time.Duration, onChange func(state int32, opened bool)) *Breaker {
	return NewWindowed(threshold, backoff, time.Second, onChange)
}

// ForDeadline is NewWindowed with the window a store whose calls have the
// given deadline needs: twice the time one caller takes to fail threshold
// calls, each at its deadline.
func ForDeadline(threshold int, backoff, deadline time.Duration, onChange func(state int32, opened bool)) *Breaker {
	return NewWindowed(threshold, backoff, 2*time.Duration(threshold)*deadline, onChange)
}

// NewWindowed is New with the failures counted over window (at least a
// second). A caller whose calls fail by their deadline fails one call per
// deadline: with a deadline of d, threshold failures of one caller take
// threshold*d, so a window shorter than that would never see them and a
// server that hangs would never open the breaker for it.
func NewWindowed(threshold int, backoff, window time.Duration, onChange func(state int32, opened bool)) *Breaker {
	b := &Breaker{threshold: int64(threshold), backoff: backoff, span: int64(max(window, time.Second)), onChange: onChange}
	b.window.Store(now().UnixNano())
	return b
}

// Allow reports whether a call may go to the server.
func (b *Breaker) Allow() bool {
	if b.state.Load() == Closed {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state.Load() {
	case Closed:
		return true
	case Open:
		if now().Before(b.until) {
			return false
		}
		b.set(Probing, false)
		return true
	default: // a probe is out
		return false
	}
}

// State is the breaker's state now (Closed, Open or Probing), for a
// caller that reports on it without making a call.
func (b *Breaker) State() int32 { return b.state.Load() }

// count adds a call to the current window, starting a new one when the
// window has passed, and returns the window's calls and failures.
func (b *Breaker) count(failed bool) (calls, failures int64) {
	t := now().UnixNano()
	if w := b.window.Load(); t-w >= b.span && b.window.CompareAndSwap(w, t) {
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

// Done records a call's result.
func (b *Breaker) Done(ok bool) {
	calls, failures := b.count(!ok)
	if ok {
		if b.state.Load() == Closed {
			return
		}
		b.mu.Lock()
		b.set(Closed, false)
		b.calls.Store(0)
		b.failed.Store(0)
		b.mu.Unlock()
		return
	}
	st := b.state.Load()
	if st == Open || (st == Closed && (failures < b.threshold || 2*failures < calls)) {
		return
	}
	b.mu.Lock()
	if st := b.state.Load(); st == Probing || st == Closed {
		b.until = now().Add(b.backoff)
		b.set(Open, true)
	}
	b.mu.Unlock()
}

// Abort records a call that ended without telling anything about the
// server (its caller gave up, or it never left this process): a probe it
// was is released, so the next call probes instead.
func (b *Breaker) Abort() {
	if b.state.Load() != Probing {
		return
	}
	b.mu.Lock()
	if b.state.Load() == Probing {
		b.until = now()
		b.set(Open, false)
	}
	b.mu.Unlock()
}

func (b *Breaker) set(st int32, opened bool) {
	b.state.Store(st)
	if b.onChange != nil {
		b.onChange(st, opened)
	}
}
