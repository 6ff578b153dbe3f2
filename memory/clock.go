package memory

import (
	"sync"
	"sync/atomic"
	"time"
)

// The hot path's clock.
//
// Reading the clock is a large part of a limiter's cost: one monotonic read
// costs about 25ns on the machines sluice is measured on, time.Now about
// 45ns, while the whole rest of a Take is of the same order. So the memory
// store reads a coarse clock, a process-wide atomic that one goroutine
// advances every coarseTick, for the decisions where a slightly early time
// is harmless, and the precise monotonic clock where it is not:
//
//   - A token bucket only gains tokens as time passes, so a decision made at
//     a time up to one tick early can only be stricter. An admit at the
//     coarse time stands. A rejection whose wait is within recheckWithin is
//     re-decided at the precise time, so a caller that waits exactly its
//     RetryAfter is admitted at the exact boundary. A rejection with a
//     longer wait stands: it would stand at the precise time too unless the
//     ticker has fallen more than recheckWithin behind (a process starved
//     of CPU), and then the error is a late admit, never an early one.
//     The cost: an interval's admissions may include up to rate*lag tokens
//     that a precise clock would have placed just before it, where lag is
//     how far the coarse clock trails: at most one tick (with 100 rps, a
//     tenth of a token) while the ticker runs on time. A busy process may
//     keep the ticker from a CPU; then every refreshEvery-th decision of a
//     shard reads the precise clock and brings the coarse one forward, so
//     the lag stays within the time the busy shards take for that many
//     decisions. Options.PreciseClock removes
//     even that, for about 25ns more per Take.
//   - Fixed windows and sliding logs always use the precise clock: an early
//     time could place a request in the previous window and let one window
//     admit more than its capacity.
//
// The clock never steps back: both clocks read the same monotonic source.
const (
	refreshEvery  = 64 // see Store.Take
	coarseTick    = time.Millisecond
	tickMicros    = int64(coarseTick / time.Microsecond)
	recheckWithin = 2 * tickMicros
)

var coarse struct {
	once   sync.Once
	now    atomic.Int64 // microseconds since the Unix epoch, per the anchor
	epoch  time.Time
	epochU int64
}

func startCoarse() {
	coarse.epoch = time.Now()
	coarse.epochU = coarse.epoch.UnixMicro()
	coarse.now.Store(coarse.epochU)
	go func() {
		t := time.NewTicker(coarseTick)
		for range t.C {
			coarse.now.Store(preciseNow())
		}
	}()
}

// preciseNow reads the monotonic clock, anchored to the wall clock once.
// A reader that finds the coarse clock more than a tick behind brings it
// forward, so that a ticker waiting for a CPU does not let it fall far
// behind while the process is busy. That write happens at most about once
// per tick, not per call: readers writing on every call would bounce the
// clock's cache line between cores.
func preciseNow() int64 {
	now := coarse.epochU + int64(time.Since(coarse.epoch)/time.Microsecond)
	if c := coarse.now.Load(); c < now-tickMicros {
		coarse.now.CompareAndSwap(c, now)
	}
	return now
}

// coarseNow returns the coarse clock, starting it on first use.
func coarseNow() int64 {
	coarse.once.Do(startCoarse)
	return coarse.now.Load()
}
