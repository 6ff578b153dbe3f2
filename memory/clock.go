package memory

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// The hot path's clock.
//
// Reading the clock is a large part of a limiter's cost: one monotonic read
// (BenchmarkMonotonic in the bench module), or one time.Now
// (BenchmarkClock), costs as much as the whole rest of a Take (the bench
// module's BenchmarkMemory compares sluice-take with sluice-take-precise,
// a store with PreciseClock set: that difference is why this file is kept,
// for Limiter.Take and Allow; the doors' TakeAll reads the precise clock,
// where a read is a small part of a request). So the memory
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
//     even that, for one precise clock read more per Take.
//   - Fixed windows and sliding logs always use the precise clock: an early
//     time could place a request in the previous window and let one window
//     admit more than its capacity.
//
// The ticker runs only while the clock is read: after idleTicks ticks in a
// row that no decision read, it parks, and an idle process does not wake
// a thousand times a second. A reader that finds it parked uses the
// precise clock, which is always correct, and wakes it.
//
// Nor does it tick for a process that reads the clock too seldom for the
// ticks to pay: a tick (a wake of a parked thread) costs the CPU of many
// clock reads, so ticking costs more than it saves below some rate of
// reads (bench/results/2026-11-26.md#what-the-coarse-clock-costs-a-server-2026-11-26
// measured both, and the wakes per second). Each tick notes when it
// was first read and when it was next read at least readSpacing after
// that; when that next read came more than slowGap after the first, or
// not at all, for slowTicks ticks in a row (reads that frequent would, by
// chance, come that far apart in a row less than once in millions of
// ticks; a goroutine descheduled once does not count), the ticker goes
// slow: readers read the precise clock, and the ticker wakes only every
// probeEvery to see whether reads have become frequent again (one tick
// read so), or have stopped (then it parks). The spacing makes a burst
// of reads, as one request's few Takes are, count as one read.
// The wait from the tick to its first read would not do: it includes how
// long the tick's write takes to reach another core, and how long the
// ticker's thread keeps a CPU that a reader shares, which on a virtual
// machine is often over a microsecond for a reader that reads without
// pause, and tens of them, tick after tick, when both threads land on one
// CPU.
//
// The clock never steps back: both clocks read the same monotonic source.
const (
	refreshEvery  = 64 // see Store.Take
	coarseTick    = time.Millisecond
	tickMicros    = int64(coarseTick / time.Microsecond)
	recheckWithin = 2 * tickMicros
	idleTicks     = 2 // unread ticks before the ticker parks
	// slowGap is the time from a tick's first read to its next read at
	// least readSpacing later above which the tick counts as seldom read:
	// a reader that leaves a gap of 2µs (under about half a million reads
	// a second) saves less than the ticks cost. readSpacing is long enough
	// for a burst of reads to end, even under the race detector, and
	// short enough that the reads in it, which read the precise clock to
	// know when it ends, are few among a tight loop's reads.
	readSpacing = 5 * time.Microsecond
	slowGap     = readSpacing + 2*time.Microsecond
	slowTicks   = 8
	probeEvery  = 10 * time.Millisecond
)

// The coarse clock is one word: the time in microseconds shifted left by
// four, and four flags, so that a reader's usual cost stays one load.
const (
	coarseFresh  = 1 // no reader has read this tick's time yet
	coarseParked = 2 // the ticker is parked: the time is stale
	coarseSlow   = 4 // the ticker is slow: the time is stale, read the precise clock
	coarseSecond = 8 // no reader has read this tick's time readSpacing after its first
	coarseFlags  = coarseFresh | coarseParked | coarseSlow | coarseSecond
	coarseShift  = 4
)

var coarse struct {
	once   sync.Once
	word   atomic.Int64 // time<<coarseShift | flags; the time is µs since the Unix epoch, per the anchor
	epoch  time.Time
	epochU int64
	wake   chan struct{}
	ticks  atomic.Int64 // ticks so far, for tests
	// firstRead is when the current tick was first read, secondRead
	// when next at least readSpacing later (ns since epoch).
	firstRead, secondRead atomic.Int64
}

func startCoarse() {
	coarse.epoch = time.Now()
	coarse.epochU = coarse.epoch.UnixMicro()
	coarse.wake = make(chan struct{}, 1)
	coarse.word.Store(coarse.epochU << coarseShift)
	go runCoarse()
}

// runCoarse advances the coarse clock every tick, parks after idleTicks
// ticks whose time no reader took, until a reader wakes it, and goes slow
// while the reads are too far apart to pay for the ticks.
func runCoarse() {
	t := time.NewTicker(coarseTick)
	idle, seldom := 0, 0
	for range t.C {
		coarse.ticks.Add(1)
		old := coarse.word.Load()
		if old&coarseFresh == 0 {
			idle = 0
			if readOften(old) {
				seldom = 0
			} else if seldom++; seldom >= slowTicks {
				t.Stop()
				if !runSlow() {
					<-coarse.wake // parked: the waker has stored the time
				}
				idle, seldom = 0, 0
				t.Reset(coarseTick)
				continue
			}
		} else if idle++; idle >= idleTicks {
			if coarse.word.CompareAndSwap(old, old|coarseParked) {
				t.Stop()
				<-coarse.wake // the waker has stored the time
				idle, seldom = 0, 0
				t.Reset(coarseTick)
				continue
			}
			idle = 0 // read meanwhile
		}
		publish(old)
	}
}

// readOften reports whether the tick that w ends was read often enough
// to pay for ticking: a second time within slowGap of the first.
func readOften(w int64) bool {
	return w&(coarseFresh|coarseSecond) == 0 &&
		time.Duration(coarse.secondRead.Load()-coarse.firstRead.Load()) <= slowGap
}

// publish stores the current time as a fresh tick over old.
func publish(old int64) {
	next := atMicros(time.Since(coarse.epoch))<<coarseShift | coarseFresh | coarseSecond
	if !coarse.word.CompareAndSwap(old, next) { // read or brought forward meanwhile
		coarse.word.Store(next)
	}
}

// runSlow keeps the ticker slow: readers read the precise clock, and every
// probeEvery one tick tells whether reads come fast enough again (true:
// tick) or there were none in two probes' time (false: it has parked).
func runSlow() bool {
	idle := 0
	for {
		for w := coarse.word.Load(); !coarse.word.CompareAndSwap(w, w|coarseSlow|coarseFresh); w = coarse.word.Load() {
		}
		time.Sleep(probeEvery)
		coarse.ticks.Add(1)
		w := coarse.word.Load()
		if w&coarseFresh != 0 { // not read since the last probe
			if idle++; idle >= idleTicks && coarse.word.CompareAndSwap(w, w&^(coarseSlow|coarseFresh)|coarseParked) {
				return false
			}
			continue
		}
		idle = 0
		// A probe: one tick of the coarse clock, and the wait for its
		// first read.
		publish(w)
		time.Sleep(coarseTick)
		coarse.ticks.Add(1)
		if w := coarse.word.Load(); readOften(w) {
			publish(w)
			return true
		}
	}
}

// monoNow reads the monotonic clock, anchored to the wall clock once.
func monoNow() int64 { return atMicros(time.Since(coarse.epoch)) }

// atMicros is the time d after the anchor, in µs since the Unix epoch.
func atMicros(d time.Duration) int64 { return coarse.epochU + int64(d/time.Microsecond) }

// sinceEpoch is a reading us of this package's clocks (coarseNow,
// preciseNow) as the time since the anchor (the store's Epoch), for a
// Limiter to date a wait from the reading the decision was made on
// without reading the clock again; negative (no reading) for one before
// the anchor or beyond time.Duration, which the Limiter then dates by its
// own clock.
func sinceEpoch(us int64) time.Duration {
	if s := us - coarse.epochU; uint64(s) <= uint64(maxSinceMicros) {
		return time.Duration(s) * time.Microsecond
	}
	return -1
}

// maxSinceMicros is the longest time.Duration in whole µs.
const maxSinceMicros = math.MaxInt64 / int64(time.Microsecond)

// preciseNow reads the monotonic clock. A reader that finds the coarse
// clock more than a tick behind brings it forward, so that a ticker
// waiting for a CPU does not let it fall far behind while the process is
// busy. That write happens at most about once per tick, not per call:
// readers writing on every call would bounce the clock's cache line
// between cores.
func preciseNow() int64 {
	now := monoNow()
	if w := coarse.word.Load(); w&(coarseParked|coarseSlow) == 0 && w>>coarseShift < now-tickMicros {
		coarse.word.CompareAndSwap(w, now<<coarseShift)
	}
	return now
}

// coarseNow returns the coarse clock, starting it on first use. The
// first reader of a tick clears its fresh flag, which keeps the ticker
// running, and the first at least readSpacing later its second flag,
// which tells the ticker how often the clock is read (two writes per
// tick); a reader that finds it parked reads the precise clock and wakes
// it.
func coarseNow() int64 {
	coarse.once.Do(startCoarse)
	w := coarse.word.Load()
	if w&coarseFlags == 0 {
		return w >> coarseShift
	}
	if w&coarseSlow != 0 {
		if w&coarseFresh != 0 {
			coarse.word.CompareAndSwap(w, w&^coarseFresh) // a read since the last probe
		}
		return monoNow()
	}
	if w&coarseParked != 0 {
		now := monoNow()
		if coarse.word.CompareAndSwap(w, now<<coarseShift) {
			coarse.wake <- struct{}{} // one waker per parking: never blocks
		}
		return now
	}
	// The first reader's time is stored before its flag clears, so that a
	// reader that finds the flag cleared finds this tick's first read.
	now := int64(time.Since(coarse.epoch))
	if w&coarseFresh != 0 {
		coarse.firstRead.Store(now)
		coarse.word.CompareAndSwap(w, w&^coarseFresh)
	} else if time.Duration(now-coarse.firstRead.Load()) >= readSpacing && coarse.word.CompareAndSwap(w, w&^coarseSecond) {
		coarse.secondRead.Store(now)
	}
	return w >> coarseShift
}
