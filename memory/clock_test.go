package memory

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// waitFor polls cond until it holds, failing after a generous deadline:
// the ticker needs a CPU to advance, and CI's 2 cores may be busy.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// An idle process's coarse clock stops ticking; a read finds it parked,
// takes the precise time, and wakes it. Nothing here depends on speed: the
// ticks are counted, and a parked ticker counts none however long it is
// left.
func TestCoarseClockParksWhenIdle(t *testing.T) {
	coarseNow() // started and read
	parked := func() bool { return coarse.word.Load()&coarseParked != 0 }
	waitFor(t, "the unread ticker parks", parked)
	n := coarse.ticks.Load()
	time.Sleep(20 * coarseTick)
	if got := coarse.ticks.Load(); got != n || !parked() {
		t.Fatalf("a parked ticker ticked %d times in %v", got-n, 20*coarseTick)
	}
	before := monoNow()
	if got := coarseNow(); got < before {
		t.Fatalf("a read of the parked clock returned %d, before it was called %d", got, before)
	}
	if parked() {
		t.Fatal("a read left the ticker parked")
	}
	// Read as a busy store does: the ticker runs, and each read is at most
	// a little behind the precise clock (one tick, or the time this
	// goroutine or the ticker waited for a CPU: not asserted).
	waitFor(t, "the woken ticker ticks", func() bool {
		coarseNow()
		return coarse.ticks.Load() > n+2
	})
	if got, now := coarseNow(), monoNow(); got > now {
		t.Fatalf("the coarse clock %d is ahead of the precise one %d", got, now)
	}
	waitFor(t, "the ticker parks again", parked)
}

// A clock read too seldom for its ticks to pay goes slow: its reads are
// the precise clock's, and the ticker wakes only to probe. The reads are
// paced at least 50µs apart by spinning (a sleep could leave two ticks
// unread, which parks the ticker instead), far below slowGap's rate on any
// machine; a slower machine only spaces them further. The tick counts are
// bounded by what a ticker with no reads does before it parks, not by
// time, so nothing here depends on speed. (Bursts of reads, which count
// as one when they end within readSpacing, are not read here: how long a
// burst takes is the machine's speed.)
func TestCoarseClockGoesSlowForSeldomReads(t *testing.T) {
	coarseNow()
	slow := func() bool { return coarse.word.Load()&coarseSlow != 0 }
	next := monoNow()
	waitFor(t, "seldom reads slow the ticker", func() bool {
		for end := monoNow() + 1000; monoNow() < end; {
			if now := monoNow(); now >= next {
				coarseNow()
				next = now + 50
			}
			if slow() {
				return true
			}
		}
		return false
	})
	for range 20 {
		before := monoNow()
		if slow() {
			if got := coarseNow(); got < before {
				t.Fatalf("a read of the slow clock returned %d, before it was called %d", got, before)
			}
		}
		time.Sleep(time.Millisecond)
	}
	n := coarse.ticks.Load()
	time.Sleep(20 * coarseTick)
	if got := coarse.ticks.Load() - n; got > 10 {
		t.Errorf("a slow ticker ticked %d times in %v", got, 20*coarseTick)
	}
	waitFor(t, "the unread slow ticker parks", func() bool { return coarse.word.Load()&coarseParked != 0 })
}

// A clock read without pause keeps ticking however late each tick's first
// read comes: that wait is how long the tick takes to reach the reader
// (another core's cache, a CPU the ticker's thread holds), not how often
// the clock is read. Here every tick's first read is held back 20µs, ten
// times slowGap, and the reads then go on without pause; the ticker must
// not go slow in 40 ticks (more than slowTicks in a row, several times
// over). Only a reader descheduled right after a tick's first read, in
// slowTicks ticks in a row, could slow it: the bounds are counts of ticks,
// not times.
func TestCoarseClockKeepsTickingForLateFrequentReads(t *testing.T) {
	waitFor(t, "the ticker runs", func() bool {
		coarseNow()
		return coarse.word.Load()&(coarseSlow|coarseParked) == 0
	})
	start := coarse.ticks.Load()
	for coarse.ticks.Load() < start+40 {
		w := coarse.word.Load()
		if w&coarseSlow != 0 {
			t.Fatalf("frequent reads whose first read of a tick came late slowed the ticker after %d ticks", coarse.ticks.Load()-start)
		}
		if w&coarseFresh != 0 {
			for held := monoNow() + 20; monoNow() < held; {
			}
		}
		coarseNow()
	}
}

// A limiter on the system clock: RetryAt is the wait after the store's
// reading of the clock. With its precise clock that reading lies between
// the clock before the call and after it; its coarse clock (the default)
// may trail, never lead: the wait it measures is then longer by as much,
// and RetryAt the same moment. A trail of a minute would be a stopped
// ticker. The store counts whole microseconds, so its reading may trail
// by less than one.
func TestRetryAtSystemClock(t *testing.T) {
	a := sluice.MustLimit(sluice.Spec{Name: "at-a", Rate: 10, Period: time.Hour, Capacity: 1})
	ra := sluice.Request{Limit: a, Key: "k"}
	bg := context.Background()
	for _, opts := range []Options{{PreciseClock: true}, {}} {
		real := sluice.New(New(opts))
		for _, take := range []func(context.Context, sluice.Request) (sluice.Decision, error){real.Take, real.Peek} {
			real.Take(bg, ra)
			before := time.Now()
			dec, _ := take(bg, ra)
			after := time.Now()
			lo := before.Add(dec.RetryAfter - time.Microsecond)
			if !opts.PreciseClock {
				lo = lo.Add(-time.Minute)
			}
			if dec.Allowed || dec.RetryAt.Before(lo) || dec.RetryAt.After(after.Add(dec.RetryAfter)) {
				t.Fatalf("system clock, %+v: %+v between %v and %v", opts, dec, before, after)
			}
		}
	}
}

// A reading is the time since the anchor, to the µs, for readings at or
// after it; none (negative) before it.
func TestSinceEpoch(t *testing.T) {
	coarse.once.Do(startCoarse)
	now := preciseNow()
	for _, c := range []struct {
		us   int64
		want time.Duration
	}{
		{coarse.epochU, 0},
		{now, time.Duration(now-coarse.epochU) * time.Microsecond},
		{coarse.epochU + 5, 5 * time.Microsecond},
		{coarse.epochU - 5, -1},
		{coarse.epochU + maxSinceMicros, time.Duration(maxSinceMicros) * time.Microsecond},
		{coarse.epochU + maxSinceMicros + 1, -1},
	} {
		if got := sinceEpoch(c.us); got != c.want {
			t.Errorf("sinceEpoch(%d) = %v, want %v", c.us, got, c.want)
		}
	}
	if got := coarse.epoch.Add(sinceEpoch(now)); got.Sub(coarse.epoch) != time.Duration(now-coarse.epochU)*time.Microsecond {
		t.Errorf("the anchor plus the reading is %v past the anchor", got.Sub(coarse.epoch))
	}
}
