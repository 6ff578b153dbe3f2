package insight

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// Window is how far back the per-second series reach: five minutes, one
// value per second.
const Window = 300

// ringLen holds the Window complete seconds and the one in progress.
const ringLen = Window + 1

// Outcomes, as policy.Result.Outcome names them, in the order a rule's
// counters keep them.
const (
	outAllowed = iota
	outRejected
	outShadowRejected
	outStoreError
	outNotCharged
	nOutcomes
)

// ruleSlot is one second of a rule's decisions.
type ruleSlot struct {
	sec atomic.Int64 // the Unix second the counts belong to
	n   [nOutcomes]atomic.Uint64
}

// ruleSeries is a rule's decisions per second over the last Window
// seconds: a ring of slots, each reused for the second ringLen later.
// Writers only add; the first writer of a new second zeroes its slot.
type ruleSeries struct {
	mu   sync.Mutex // serialises the zeroing of a slot for a new second
	ring [ringLen]ruleSlot
	last atomic.Int64 // the last second counted, to drop idle rules
}

func (r *ruleSeries) add(sec int64, o int) {
	s := &r.ring[sec%ringLen]
	if s.sec.Load() != sec {
		r.mu.Lock()
		if s.sec.Load() < sec {
			for i := range s.n {
				s.n[i].Store(0)
			}
			s.sec.Store(sec)
			r.last.Store(sec)
		}
		r.mu.Unlock()
	}
	s.n[o].Add(1)
}

// read returns the counts of outcome o for the seconds from, from+1, ...,
// from+Window-1 (zero for a second nothing was counted in), and whether
// any is non-zero.
func (r *ruleSeries) read(from int64, o int) ([]uint64, bool) {
	out := make([]uint64, Window)
	some := false
	for i := range out {
		sec := from + int64(i)
		s := &r.ring[sec%ringLen]
		if s.sec.Load() == sec {
			out[i] = s.n[o].Load()
			some = some || out[i] != 0
		}
	}
	return out, some
}

// storeSlot is one second of store calls.
type storeSlot struct {
	sec    atomic.Int64
	calls  atomic.Uint64
	errors atomic.Uint64
	sumNs  atomic.Uint64 // latency, summed
	maxNs  atomic.Uint64 // the slowest call
}

// storeSeries is the store's calls per second over the last Window
// seconds, as ruleSeries keeps decisions.
type storeSeries struct {
	mu   sync.Mutex
	ring [ringLen]storeSlot
}

func (r *storeSeries) add(sec int64, d time.Duration, failed bool) {
	s := &r.ring[sec%ringLen]
	if s.sec.Load() != sec {
		r.mu.Lock()
		if s.sec.Load() < sec {
			s.calls.Store(0)
			s.errors.Store(0)
			s.sumNs.Store(0)
			s.maxNs.Store(0)
			s.sec.Store(sec)
		}
		r.mu.Unlock()
	}
	ns := uint64(max(d, 0))
	s.calls.Add(1)
	if failed {
		s.errors.Add(1)
	}
	s.sumNs.Add(ns)
	for {
		m := s.maxNs.Load()
		if ns <= m || s.maxNs.CompareAndSwap(m, ns) {
			break
		}
	}
}

// StoreSeries is the store's calls of each second of a Snapshot's window.
type StoreSeries struct {
	Calls, Errors []uint64
	// MeanMs and MaxMs are the calls' mean and longest latency in
	// milliseconds (0 for a second without calls).
	MeanMs, MaxMs []float64
}

func (r *storeSeries) read(from int64) StoreSeries {
	out := StoreSeries{Calls: make([]uint64, Window), Errors: make([]uint64, Window), MeanMs: make([]float64, Window), MaxMs: make([]float64, Window)}
	for i := range Window {
		sec := from + int64(i)
		s := &r.ring[sec%ringLen]
		if s.sec.Load() != sec {
			continue
		}
		n := s.calls.Load()
		out.Calls[i], out.Errors[i] = n, s.errors.Load()
		if n > 0 {
			out.MeanMs[i] = float64(s.sumNs.Load()) / float64(n) / 1e6
			out.MaxMs[i] = float64(s.maxNs.Load()) / 1e6
		}
	}
	return out
}

// seconds tells the current Unix second for the hot path. With a Clock
// (tests) it asks the clock. Without one it keeps the second in an atomic
// that a goroutine advances at each second's start, so that a decision
// pays one load instead of a clock read (BenchmarkClock in the bench
// module); the goroutine stops after two seconds in which nothing
// read it, and the next reader starts it again, so an idle process does
// not wake for it.
type seconds struct {
	clock sluice.Clock
	now   atomic.Int64 // 0 while no goroutine keeps it
	read  atomic.Bool  // read since the last tick
}

func (s *seconds) get() int64 {
	if s.clock != nil {
		return s.clock.Now().Unix()
	}
	if !s.read.Load() {
		s.read.Store(true)
	}
	if v := s.now.Load(); v != 0 {
		return v
	}
	v := time.Now().Unix()
	if s.now.CompareAndSwap(0, v) {
		go s.tick()
	}
	return v
}

func (s *seconds) tick() {
	idle := 0
	for {
		now := time.Now()
		time.Sleep(now.Truncate(time.Second).Add(time.Second).Sub(now))
		s.now.Store(time.Now().Unix())
		if s.read.Swap(false) {
			idle = 0
		} else if idle++; idle >= 2 {
			s.now.Store(0)
			return
		}
	}
}

// wall is the current time as the series count it, for snapshots.
func (s *seconds) wall() time.Time {
	if s.clock != nil {
		return s.clock.Now()
	}
	return time.Now()
}
