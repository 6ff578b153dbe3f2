package breaker

import (
	"testing"
	"time"
)

// The breaker's state machine, driven directly: the real-server tests
// (TestBreakerOpensAndProbes, TestRestartUnderLoad) cannot force a probe
// whose caller gives up.
func TestBreakerStates(t *testing.T) {
	advance := fakeClock(t)
	var opens int
	b := New(2, 20*time.Millisecond, func(_ int32, opened bool) {
		if opened {
			opens++
		}
	})
	b.Done(false)
	if !b.Allow() {
		t.Fatal("open after one failure of two")
	}
	b.Done(false)
	if b.Allow() || opens != 1 {
		t.Fatalf("not open after two failures (opens %d)", opens)
	}
	advance(19 * time.Millisecond)
	if b.Allow() {
		t.Fatal("a call went through before the backoff ended")
	}
	advance(time.Millisecond)
	if !b.Allow() {
		t.Fatal("no probe after the backoff")
	}
	if b.Allow() {
		t.Fatal("a second call went through while the probe is out")
	}
	b.Abort() // the probe's caller gave up: the next call probes
	if !b.Allow() {
		t.Fatal("an aborted probe kept the breaker shut")
	}
	b.Done(false)
	if b.Allow() || opens != 2 {
		t.Fatalf("a failed probe did not reopen (opens %d)", opens)
	}
	advance(20 * time.Millisecond)
	if !b.Allow() {
		t.Fatal("no probe")
	}
	b.Done(true)
	if !b.Allow() || !b.Allow() {
		t.Fatal("a successful probe did not close")
	}
}

// Failures among many successes (a stall of this process making a few
// calls miss their deadline together) do not open the breaker; a Redis
// that fails most calls does.
func TestBreakerOpensOnAShareOfFailures(t *testing.T) {
	fakeClock(t) // all in one window, however slow the machine
	b := New(5, time.Minute, nil)
	for range 100 {
		b.Done(true)
	}
	for range 20 {
		b.Done(false)
	}
	if !b.Allow() {
		t.Fatal("20 failures among 120 calls opened the breaker")
	}
	for range 100 {
		b.Done(false)
	}
	if b.Allow() {
		t.Fatal("120 failures among 220 calls left the breaker closed")
	}
}

// fakeClock stands the breaker's clock still for the test (no stall of a
// loaded machine ends a window or a backoff) and returns what steps it.
func fakeClock(t *testing.T) (advance func(time.Duration)) {
	at := time.Unix(1_000_000, 0)
	now = func() time.Time { return at }
	t.Cleanup(func() { now = time.Now })
	return func(d time.Duration) { at = at.Add(d) }
}

// How long a hung server costs before the breaker opens, as the stores'
// documentation states it: one caller, whose calls fail one per deadline,
// opens it after threshold deadlines when its window holds nothing else,
// and at most a window plus threshold deadlines after the hang when the
// window began with successes (the failures must be half of its calls, or
// wait for the next window). Every offset of the hang within a window of
// 2*threshold deadlines is tried, after a success every 10 ms.
func TestHungServerOpensWithinBound(t *testing.T) {
	const threshold, deadline = 5, 250 * time.Millisecond
	window := 2 * threshold * deadline
	for offset := time.Duration(0); offset < window; offset += 50 * time.Millisecond {
		advance := fakeClock(t)
		b := ForDeadline(threshold, 500*time.Millisecond, deadline, nil)
		for at := time.Duration(0); at < offset; at += 10 * time.Millisecond {
			b.Done(true)
			advance(10 * time.Millisecond)
		}
		var hung time.Duration
		for b.Allow() {
			advance(deadline)
			hung += deadline
			b.Done(false)
			if hung > 10*window {
				break
			}
		}
		if lo, hi := threshold*deadline, window+threshold*deadline; hung < lo || hung > hi {
			t.Errorf("hang at %v into the window: open after %v, want between %v and %v", offset, hung, lo, hi)
		}
		if offset == 0 && hung != threshold*deadline {
			t.Errorf("a hang at a window's start: open after %v, want %v", hung, threshold*deadline)
		}
	}
}
