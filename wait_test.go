package sluice_test

import (
	"context"
	"errors"
	"hash/fnv"
	"net/netip"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// The Wait tests port golang.org/x/time/rate's (TestWaitSimple,
// TestWaitCancel, TestWaitTimeout) onto a manual clock: their limiter of
// 10 per second with a burst of 3 and their step d = 100ms become 10 per
// hour and d = 6 minutes, so that the contexts' deadlines, which the
// runtime keeps in real time, lie far in the real future while the
// manual clock decides every turn to the microsecond. No test sleeps.

const d = 6 * time.Minute // one token of 10 per hour

// waitEnv is a memory store and a Limiter on one manual clock, which
// starts on an hour boundary at least an hour after the real now.
type waitEnv struct {
	t   *testing.T
	clk *sluice.ManualClock
	lim *sluice.Limiter
}

func newWaitEnv(t *testing.T) *waitEnv {
	t.Helper()
	clk := sluice.NewManualClock(time.Now().Truncate(time.Hour).Add(2 * time.Hour))
	store := memory.New(memory.Options{Clock: clk})
	return &waitEnv{t: t, clk: clk, lim: sluice.NewWithOptions(store, sluice.Options{Clock: clk})}
}

// within returns a context whose deadline is after on the manual clock.
func (e *waitEnv) within(after time.Duration) context.Context {
	ctx, cancel := context.WithDeadline(context.Background(), e.clk.Now().Add(after))
	e.t.Cleanup(cancel)
	return ctx
}

// start runs Wait in a goroutine; its result arrives on the channel.
func (e *waitEnv) start(ctx context.Context, r sluice.Request) chan error {
	done := make(chan error, 1)
	go func() { done <- e.lim.Wait(ctx, r) }()
	return done
}

// asleep returns once n waiters sleep on the clock's timers. A waiter
// that returned instead fails the test.
func (e *waitEnv) asleep(n int, done ...chan error) {
	e.t.Helper()
	for {
		k, changed := e.clk.PendingTimers()
		if k >= n {
			return
		}
		for _, c := range done {
			if len(c) > 0 {
				e.t.Fatalf("a Wait returned (%v) before %d waiters slept", <-c, n)
			}
		}
		select {
		case <-changed:
		case <-time.After(time.Minute): // a bound on a hung test, never a wait for tokens
			for _, c := range done {
				if len(c) > 0 {
					e.t.Fatalf("a Wait returned (%v) before %d waiters slept", <-c, n)
				}
			}
			e.t.Fatalf("%d waiters sleep after a minute, want %d", k, n)
		}
	}
}

// pending asserts how many waiters still sleep: a waiter whose timer has
// not fired cannot have returned, so this proves that none woke early.
func (e *waitEnv) pending(want int) {
	e.t.Helper()
	if k, _ := e.clk.PendingTimers(); k != want {
		e.t.Fatalf("%d waiters sleep, want %d", k, want)
	}
}

// result receives a waiter's result.
func (e *waitEnv) result(done chan error) error {
	e.t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		e.t.Fatal("the waiter did not return")
		return nil
	}
}

// waitNow calls Wait and requires that it returns without sleeping. A
// ctx without a deadline gets one at the clock's now, so that a Wait that
// would sleep fails instead of hanging the test.
func (e *waitEnv) waitNow(ctx context.Context, r sluice.Request) error {
	e.t.Helper()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, e.clk.Now())
		defer cancel()
	}
	err := e.lim.Wait(ctx, r)
	e.pending(0)
	return err
}

// empty asserts that the bucket of r holds exactly no tokens: a take is
// refused with the wait of exactly one token.
func (e *waitEnv) empty(r sluice.Request, oneToken time.Duration) {
	e.t.Helper()
	r.Cost = 1
	dec, err := e.lim.Take(context.Background(), r)
	if err != nil || dec.Allowed || dec.RetryAfter != oneToken {
		e.t.Fatalf("take of 1: %+v, %v; want refused with a wait of %v (no tokens left)", dec, err, oneToken)
	}
}

// xtime is x/time/rate's NewLimiter(10, 3) at one hour for one second,
// with room for the debt its tests reserve.
func xtime(name string) *sluice.Limit {
	return sluice.MustLimit(sluice.Spec{Name: name, Rate: 10, Period: time.Hour, Capacity: 3, MaxReserved: 2})
}

func req(l *sluice.Limit, cost float64) sluice.Request {
	return sluice.Request{Limit: l, Key: "k", Cost: cost}
}

func TestWaitSimple(t *testing.T) {
	e := newWaitEnv(t)
	l := xtime("wait-simple")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.waitNow(ctx, req(l, 1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("already-cancelled: %v, want context.Canceled", err)
	}
	// More than the burst and all the debt allowed: never.
	if err := e.waitNow(context.Background(), req(l, 6)); !errors.Is(err, sluice.ErrCostExceedsLimit) || errors.Is(err, sluice.ErrLimited) {
		t.Fatalf("exceed-burst: %v, want ErrCostExceedsLimit", err)
	}
	if err := e.waitNow(context.Background(), req(l, 2)); err != nil {
		t.Fatalf("act-now: %v", err)
	}
	done := e.start(context.Background(), req(l, 3))
	e.asleep(1, done)
	e.clk.Advance(2*d - time.Microsecond)
	e.pending(1)
	e.clk.Advance(time.Microsecond)
	if err := e.result(done); err != nil {
		t.Fatalf("act-later: %v", err)
	}
	e.empty(req(l, 1), d)
}

func TestWaitCancel(t *testing.T) {
	e := newWaitEnv(t)
	l := xtime("wait-cancel")
	ctx, cancel := context.WithCancel(context.Background())
	if err := e.waitNow(ctx, req(l, 2)); err != nil { // 1 token left
		t.Fatalf("act-now: %v", err)
	}
	done := e.start(ctx, req(l, 3)) // -2, its turn 2d away
	e.asleep(1, done)
	e.clk.Advance(d)
	e.pending(1)
	cancel()
	if err := e.result(done); !errors.Is(err, context.Canceled) {
		t.Fatalf("will-cancel: %v, want context.Canceled", err)
	}
	// The 3 tokens came back: -2 + 1 refilled + 3 = 2.
	if err := e.waitNow(context.Background(), req(l, 2)); err != nil {
		t.Fatalf("act-now-after-cancel: %v", err)
	}
	e.empty(req(l, 1), d)
}

func TestWaitTimeout(t *testing.T) {
	e := newWaitEnv(t)
	l := xtime("wait-timeout")
	ctx := e.within(d)
	if err := e.waitNow(ctx, req(l, 2)); err != nil {
		t.Fatalf("act-now: %v", err)
	}
	now := e.clk.Now()
	err := e.waitNow(ctx, req(l, 3)) // its turn would be 2d away
	var le *sluice.LimitedError
	if !errors.Is(err, sluice.ErrLimited) || !errors.Is(err, sluice.ErrBeyondDeadline) || !errors.As(err, &le) {
		t.Fatalf("w-timeout-err: %v, want a *LimitedError beyond the deadline", err)
	}
	// A Wait with d to its deadline is admitted once the bucket holds
	// 3 - 1 token of debt: d from now.
	if le.Rule != "wait-timeout" || le.Key != "k" || le.RetryAfter != d || !le.RetryAt.Equal(now.Add(d)) {
		t.Fatalf("the error says %+v, want rule wait-timeout, key k, retry after %v at %v", le, d, now.Add(d))
	}
	// Nothing was charged: the token left is still there.
	if err := e.waitNow(context.Background(), req(l, 1)); err != nil {
		t.Fatal(err)
	}
	e.empty(req(l, 1), d)
}

// The deadline is exact: a turn at the deadline is waited for, one a
// microsecond after it is refused, charging nothing.
func TestWaitDeadlineToTheMicrosecond(t *testing.T) {
	e := newWaitEnv(t)
	l := sluice.MustLimit(sluice.Spec{Name: "wait-exact", Rate: 10, Period: time.Hour, Capacity: 3})
	for _, key := range []string{"at", "after"} {
		if _, err := e.lim.Take(context.Background(), sluice.Request{Limit: l, Key: key, Cost: 3}); err != nil {
			t.Fatal(err)
		}
	}
	err := e.waitNow(e.within(2*d-time.Microsecond), sluice.Request{Limit: l, Key: "after", Cost: 2})
	if !errors.Is(err, sluice.ErrBeyondDeadline) {
		t.Fatalf("turn a microsecond past the deadline: %v, want ErrBeyondDeadline", err)
	}
	e.empty(sluice.Request{Limit: l, Key: "after"}, d)

	done := e.start(e.within(2*d), sluice.Request{Limit: l, Key: "at", Cost: 2})
	e.asleep(1, done)
	e.clk.Advance(2*d - time.Microsecond)
	e.pending(1)
	e.clk.Advance(time.Microsecond)
	if err := e.result(done); err != nil {
		t.Fatalf("turn at the deadline: %v", err)
	}
	e.empty(sluice.Request{Limit: l, Key: "at"}, d)
}

// Waiters queue: each reserves the next turn, d apart, and wakes at it.
// The limit sets no max_reserved: Wait reserves anyway, as x/time/rate's
// does, bounded by the deadline alone.
func TestWaitQueue(t *testing.T) {
	e := newWaitEnv(t)
	l := sluice.MustLimit(sluice.Spec{Name: "wait-queue", Rate: 10, Period: time.Hour, Capacity: 1})
	r := sluice.Request{Limit: l, Key: "k"}
	dones := []chan error{e.start(context.Background(), r), e.start(context.Background(), r), e.start(context.Background(), r)}
	e.asleep(2) // one of them goes at once
	// One went at once; the others wake at d and 2d, not a microsecond
	// sooner.
	for turn := 1; turn <= 2; turn++ {
		e.clk.Advance(d - time.Microsecond)
		e.pending(3 - turn)
		e.clk.Advance(time.Microsecond)
		e.pending(2 - turn)
	}
	for _, c := range dones {
		if err := e.result(c); err != nil {
			t.Fatal(err)
		}
	}
	e.empty(r, d)
}

// A leaky bucket spaces waiters 1/rate apart up to its max_delay; past it
// a Wait is refused at once (ErrLimited) and one whose turn falls after
// its deadline too (ErrBeyondDeadline as well).
func TestWaitLeakyBucket(t *testing.T) {
	e := newWaitEnv(t)
	l := sluice.MustLimit(sluice.Spec{Name: "wait-leaky", Algorithm: sluice.LeakyBucket, Rate: 1, Period: time.Minute, MaxDelay: 3 * time.Minute})
	r := sluice.Request{Limit: l, Key: "k"}
	if err := e.waitNow(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	first := e.start(context.Background(), r)
	e.asleep(1, first)
	second := e.start(context.Background(), r)
	e.asleep(2, first, second)
	if err := e.lim.Wait(e.within(2*time.Minute+30*time.Second), r); !errors.Is(err, sluice.ErrBeyondDeadline) {
		t.Fatalf("a turn 3m away with 2m30s to the deadline: %v, want ErrBeyondDeadline", err)
	}
	third := e.start(context.Background(), r)
	e.asleep(3, first, second, third)
	err := e.lim.Wait(context.Background(), r)
	if !errors.Is(err, sluice.ErrLimited) || errors.Is(err, sluice.ErrBeyondDeadline) {
		t.Fatalf("a turn past max_delay: %v, want ErrLimited alone", err)
	}
	for i, c := range []chan error{first, second, third} {
		e.clk.Advance(time.Minute - time.Microsecond)
		e.pending(3 - i)
		e.clk.Advance(time.Microsecond)
		e.pending(2 - i)
		if err := e.result(c); err != nil {
			t.Fatal(err)
		}
	}
}

// On a fixed window Wait takes without reserving, sleeps until the window
// that will hold its tokens, and takes then. A turn past the deadline is
// refused at once, and a cancelled wait returns, charging nothing either
// way.
func TestWaitFixedWindow(t *testing.T) {
	e := newWaitEnv(t)
	start := time.Duration(0)
	l := sluice.MustLimit(sluice.Spec{Name: "wait-window", Algorithm: sluice.FixedWindow, Rate: 2, Period: time.Hour, Start: &start})
	r := sluice.Request{Limit: l, Key: "k"}
	e.clk.Advance(10 * time.Minute)
	if _, err := e.lim.Take(context.Background(), sluice.Request{Limit: l, Key: "k", Cost: 2}); err != nil {
		t.Fatal(err)
	}
	err := e.waitNow(e.within(30*time.Minute), r)
	var le *sluice.LimitedError
	if !errors.Is(err, sluice.ErrBeyondDeadline) || !errors.As(err, &le) || le.RetryAfter != 50*time.Minute {
		t.Fatalf("next window 50m away, deadline 30m: %v, want ErrBeyondDeadline retrying after 50m", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := e.start(ctx, r)
	e.asleep(1, done)
	cancel()
	if err := e.result(done); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	done = e.start(e.within(time.Hour), r)
	e.asleep(1, done)
	e.clk.Advance(50*time.Minute - time.Microsecond)
	e.pending(1)
	e.clk.Advance(time.Microsecond)
	if err := e.result(done); err != nil {
		t.Fatal(err)
	}
	// The new window's 2 tokens, less the waiter's one.
	if dec, _ := e.lim.Take(context.Background(), r); !dec.Allowed {
		t.Fatalf("the second token of the window is gone: %+v", dec)
	}
	if dec, _ := e.lim.Take(context.Background(), r); dec.Allowed || dec.RetryAfter != time.Hour {
		t.Fatalf("a third token: %+v, want refused until the next window", dec)
	}
}

// Wait with a deadline that has passed on the limiter's clock takes only
// what the bucket holds now.
func TestWaitDeadlinePassed(t *testing.T) {
	e := newWaitEnv(t)
	l := xtime("wait-passed")
	e.clk.Advance(2 * time.Hour) // the deadline below is in the real future, past on the clock
	ctx := e.within(-time.Hour)
	if err := e.waitNow(ctx, req(l, 3)); err != nil {
		t.Fatalf("tokens at hand: %v", err)
	}
	if err := e.waitNow(ctx, req(l, 1)); !errors.Is(err, sluice.ErrBeyondDeadline) {
		t.Fatalf("no tokens at hand: %v, want ErrBeyondDeadline", err)
	}
	e.empty(req(l, 1), d)
}

func TestTakeOrError(t *testing.T) {
	e := newWaitEnv(t)
	l := sluice.MustLimit(sluice.Spec{Name: "or-error", Rate: 10, Period: time.Hour, Capacity: 1, MaxReserved: 1})
	r := sluice.Request{Limit: l, Key: "user-42"}
	if dec, err := e.lim.TakeOrError(context.Background(), r); err != nil || !dec.Allowed {
		t.Fatalf("first: %+v, %v", dec, err)
	}
	dec, err := e.lim.TakeOrError(context.Background(), r)
	var le *sluice.LimitedError
	if !errors.Is(err, sluice.ErrLimited) || !errors.As(err, &le) || errors.Is(err, sluice.ErrBeyondDeadline) {
		t.Fatalf("second: %v, want a *LimitedError", err)
	}
	want := sluice.LimitedError{Rule: "or-error", Key: "user-42", RetryAfter: d, RetryAt: e.clk.Now().Add(d)}
	if le.Rule != want.Rule || le.Key != want.Key || le.RetryAfter != want.RetryAfter || !le.RetryAt.Equal(want.RetryAt) || dec.Allowed || dec.RetryAfter != d {
		t.Fatalf("second: %+v with %+v, want %+v", le, dec, want)
	}
	if msg := err.Error(); msg != `sluice: rate limited by "or-error" for key "user-42"; retry after 6m0s (at `+want.RetryAt.UTC().Format(sluice.RetryAtLayout)+`)` {
		t.Fatalf("message %q", msg)
	}
	// An admitted reservation is no error: its decision says when.
	r.Reserve = true
	if dec, err := e.lim.TakeOrError(context.Background(), r); err != nil || !dec.Allowed || dec.RetryAfter != d {
		t.Fatalf("reservation: %+v, %v", dec, err)
	}
	// A cost that can never succeed is the store's error, not a rejection.
	if _, err := e.lim.TakeOrError(context.Background(), sluice.Request{Limit: l, Key: "k", Cost: 5}); !errors.Is(err, sluice.ErrCostExceedsLimit) || errors.Is(err, sluice.ErrLimited) {
		t.Fatalf("impossible cost: %v", err)
	}
}

// RetryAt is RetryAfter after the time the answer came, on the limiter's
// clock; zero without a wait; the longest wait of an all-or-nothing take.
func TestRetryAt(t *testing.T) {
	e := newWaitEnv(t)
	a := sluice.MustLimit(sluice.Spec{Name: "at-a", Rate: 10, Period: time.Hour, Capacity: 1})
	b := sluice.MustLimit(sluice.Spec{Name: "at-b", Rate: 5, Period: time.Hour, Capacity: 1})
	bg := context.Background()
	ra, rb := sluice.Request{Limit: a, Key: "k"}, sluice.Request{Limit: b, Key: "k"}
	all, _, err := e.lim.TakeAll(bg, ra, rb)
	if err != nil || !all.Allowed || !all.RetryAt.IsZero() {
		t.Fatalf("admitted: %+v, %v; want no RetryAt", all, err)
	}
	now := e.clk.Now()
	all, ds, err := e.lim.TakeAll(bg, ra, rb)
	if err != nil || all.Allowed || all.Rule != "at-b" || all.RetryAfter != 2*d || !all.RetryAt.Equal(now.Add(2*d)) ||
		!ds[0].RetryAt.Equal(now.Add(d)) || !ds[1].RetryAt.Equal(now.Add(2*d)) {
		t.Fatalf("rejected by both: %+v %+v, %v; want at-b's 2d", all, ds, err)
	}
	e.clk.Advance(time.Minute)
	for _, do := range []func(context.Context, sluice.Request) (sluice.Decision, error){e.lim.Take, e.lim.Peek} {
		dec, err := do(bg, ra)
		if err != nil || dec.Allowed || !dec.RetryAt.Equal(now.Add(d)) {
			t.Fatalf("a minute later: %+v, %v; want the same RetryAt, %v", dec, err, now.Add(d))
		}
	}
	// A limiter on the system clock: RetryAt is the wait after the memory
	// store's reading of the clock. With its precise clock that reading
	// lies between the clock before the call and after it; its coarse
	// clock (the default) may trail, never lead: the wait it measures is
	// then longer by as much, and RetryAt the same moment (clock.go). A
	// trail of a minute would be a stopped ticker. The store counts whole
	// microseconds, so its reading may trail by less than one.
	for _, opts := range []memory.Options{{PreciseClock: true}, {}} {
		real := sluice.New(memory.New(opts))
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

// A limit's Jitter adds a seeded offset of 0..Jitter to every rejection's
// wait, the same for the same key and caller, never to a reserved turn.
func TestJitter(t *testing.T) {
	e := newWaitEnv(t)
	l := sluice.MustLimit(sluice.Spec{Name: "jittery", Rate: 1, Period: time.Minute, Capacity: 1, MaxReserved: 1, Jitter: 30 * time.Second})
	bg := context.Background()
	offsets := map[time.Duration]bool{}
	for _, key := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		r := sluice.Request{Limit: l, Key: key}
		e.lim.Take(bg, r)
		dec, err := e.lim.Take(bg, r)
		j := l.Jitter(bg, key)
		if err != nil || dec.Allowed || dec.RetryAfter != time.Minute+j || j < 0 || j > 30*time.Second || !dec.RetryAt.Equal(e.clk.Now().Add(dec.RetryAfter)) {
			t.Fatalf("key %s: %+v, %v; want a wait of 1m + %v", key, dec, err, j)
		}
		if again, _ := e.lim.Peek(bg, r); again.RetryAfter != dec.RetryAfter {
			t.Fatalf("key %s: a peek says %v, the take %v", key, again.RetryAfter, dec.RetryAfter)
		}
		offsets[j] = true
		// A reservation's turn is exact.
		r.Reserve = true
		if res, _ := e.lim.Take(bg, r); !res.Allowed || res.RetryAfter != time.Minute {
			t.Fatalf("key %s: reservation %+v, want its turn in exactly 1m", key, res)
		}
	}
	if len(offsets) < 4 {
		t.Fatalf("8 keys got %d offsets: %v", len(offsets), offsets)
	}
	// Callers sharing one key are spread by who they are.
	seen := map[time.Duration]bool{}
	for _, ip := range []string{"192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4", "192.0.2.5"} {
		seen[l.Jitter(sluice.WithCaller(bg, sluice.Caller{IP: netip.MustParseAddr(ip)}), "global")] = true
	}
	if len(seen) < 3 {
		t.Fatalf("5 callers of one key got %d offsets", len(seen))
	}
	if _, err := sluice.NewLimit(sluice.Spec{Name: "neg", TokensPerSecond: 1, Jitter: -time.Second}); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Fatalf("negative jitter: %v", err)
	}
}

// Spread is 64-bit FNV-1a over the parts with a zero byte between them:
// what the Retry-After jitter has always hashed.
func TestSpreadIsFNV(t *testing.T) {
	for _, c := range [][2]string{{"", ""}, {"ip:192.0.2.1", "/v1/auth"}, {"sub:alice", "/api/x"}} {
		h := fnv.New64a()
		h.Write([]byte(c[0]))
		h.Write([]byte{0})
		h.Write([]byte(c[1]))
		for _, n := range []uint64{0, 1, 7, 1 << 40} {
			if got, want := sluice.Spread(n, c[0], c[1]), h.Sum64()%(n+1); got != want {
				t.Fatalf("Spread(%d, %q, %q) = %d, want %d", n, c[0], c[1], got, want)
			}
		}
	}
}

func TestManualClockTimers(t *testing.T) {
	clk := sluice.NewManualClock(time.Unix(1000, 0))
	c, _ := clk.NewTimer(0)
	if got := <-c; !got.Equal(time.Unix(1000, 0)) {
		t.Fatalf("a timer of 0 fired at %v", got)
	}
	c1, stop1 := clk.NewTimer(time.Second)
	c2, _ := clk.NewTimer(2 * time.Second)
	if n, _ := clk.PendingTimers(); n != 2 {
		t.Fatalf("%d timers pending", n)
	}
	clk.Set(time.Unix(999, 0)) // backwards: nothing is due
	clk.Advance(1999 * time.Millisecond)
	select {
	case <-c1:
		t.Fatal("fired early")
	default:
	}
	clk.Advance(time.Millisecond)
	if got := <-c1; !got.Equal(time.Unix(1001, 0)) {
		t.Fatalf("fired at %v", got)
	}
	if stop1() {
		t.Fatal("stopped a timer that had fired")
	}
	n, changed := clk.PendingTimers()
	c3, stop3 := clk.NewTimer(time.Hour)
	<-changed
	if !stop3() || n != 1 {
		t.Fatalf("stop of a pending timer failed (%d pending before)", n)
	}
	clk.Advance(time.Hour)
	<-c2
	select {
	case <-c3:
		t.Fatal("a stopped timer fired")
	default:
	}
}
