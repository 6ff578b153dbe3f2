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
//     The cost: an interval's admissions may include up to rate*coarseTick
//     tokens that a precise clock would have placed just before it (with
//     the 1ms tick and 100 rps, a tenth of a token); Options.PreciseClock
//     removes even that, for about 25ns more per Take.
//   - Fixed windows and sliding logs always use the precise clock: an early
//     time could place a request in the previous window and let one window
//     admit more than its capacity.
//
// The clock never steps back: both clocks read the same monotonic source.
const (
	coarseTick    = time.Millisecond
	recheckWithin = int64(4 * coarseTick / time.Microsecond)
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
// Only the ticker writes the coarse clock: readers writing it too would
// bounce its cache line between cores.
func preciseNow() int64 {
	return coarse.epochU + int64(time.Since(coarse.epoch)/time.Microsecond)
}

// coarseNow returns the coarse clock, starting it on first use.
func coarseNow() int64 {
	coarse.once.Do(startCoarse)
	return coarse.now.Load()
}
