package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// RunWait checks Limiter.Wait, Decision.RetryAt and a limit's jitter on a
// store. The Wait cases port golang.org/x/time/rate's (TestWaitSimple,
// TestWaitCancel, TestWaitTimeout) onto a manual clock: their limiter of
// 10 per second with a burst of 3 and their WaitStep d = 100ms become 10 per
// hour and a WaitStep of 6 minutes, so that the contexts' deadlines, which the
// runtime keeps in real time, lie far in the real future while the
// manual clock decides every turn to the microsecond. The store decides
// on the clock the limiter sleeps on; no case sleeps.
func RunWait(t *testing.T, newStore NewStore) {
	for _, c := range []struct {
		name string
		run  func(*WaitEnv)
	}{
		{"simple", waitSimple},
		{"cancel", waitCancel},
		{"timeout", waitTimeout},
		{"deadline_to_the_microsecond", waitDeadlineExact},
		{"queue", waitQueue},
		{"leaky_bucket", waitLeakyBucket},
		{"fixed_window", waitFixedWindow},
		{"deadline_passed", waitDeadlinePassed},
		{"retry_at", waitRetryAt},
		{"jitter", waitJitter},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(NewWaitEnv(t, newStore)) })
	}
}

// WaitStep is the wait for one token of the Wait cases' limits, 10 per
// hour.
const WaitStep = 6 * time.Minute

// WaitEnv is a fresh store and a Limiter on one manual clock, which
// starts on an hour boundary at least an hour after the real now: what
// RunWait's cases, and a store's own Wait tests, drive.
type WaitEnv struct {
	T       *testing.T
	Clock   *sluice.ManualClock
	Limiter *sluice.Limiter
}

func NewWaitEnv(t *testing.T, newStore NewStore) *WaitEnv {
	clk := sluice.NewManualClock(time.Now().Truncate(time.Hour).Add(2 * time.Hour))
	return &WaitEnv{T: t, Clock: clk, Limiter: sluice.NewWithOptions(newStore(t, clk), sluice.Options{Clock: clk})}
}

// Within returns a context whose deadline is after on the manual clock.
func (e *WaitEnv) Within(after time.Duration) context.Context {
	ctx, cancel := context.WithDeadline(context.Background(), e.Clock.Now().Add(after))
	e.T.Cleanup(cancel)
	return ctx
}

// Start runs Wait in a goroutine; its result arrives on the channel.
func (e *WaitEnv) Start(ctx context.Context, r sluice.Request) chan error {
	done := make(chan error, 1)
	go func() { done <- e.Limiter.Wait(ctx, r) }()
	return done
}

// Asleep returns once n waiters sleep on the clock's timers. A waiter
// that returned instead fails the test.
func (e *WaitEnv) Asleep(n int, done ...chan error) {
	e.T.Helper()
	returned := func() {
		for _, c := range done {
			if len(c) > 0 {
				e.T.Fatalf("a Wait returned (%v) before %d waiters slept", <-c, n)
			}
		}
	}
	for {
		k, changed := e.Clock.PendingTimers()
		if k >= n {
			return
		}
		returned()
		select {
		case <-changed:
		case <-time.After(time.Minute): // a bound on a hung test, never a wait for tokens
			returned()
			e.T.Fatalf("%d waiters sleep after a minute, want %d", k, n)
		}
	}
}

// Pending asserts how many waiters still sleep: a waiter whose timer has
// not fired cannot have returned, so this proves that none woke early.
func (e *WaitEnv) Pending(want int) {
	e.T.Helper()
	if k, _ := e.Clock.PendingTimers(); k != want {
		e.T.Fatalf("%d waiters sleep, want %d", k, want)
	}
}

// Result receives a waiter's result.
func (e *WaitEnv) Result(done chan error) error {
	e.T.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		e.T.Fatal("the waiter did not return")
		return nil
	}
}

// WaitNow calls Wait and requires that it returns without sleeping. A
// ctx without a deadline gets one at the clock's now, so that a Wait that
// would sleep fails instead of hanging the test.
func (e *WaitEnv) WaitNow(ctx context.Context, r sluice.Request) error {
	e.T.Helper()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, e.Clock.Now())
		defer cancel()
	}
	err := e.Limiter.Wait(ctx, r)
	e.Pending(0)
	return err
}

// Empty asserts that the bucket of r holds exactly no tokens: a take is
// refused with the wait of exactly one token, dated on the clock.
func (e *WaitEnv) Empty(r sluice.Request, oneToken time.Duration) {
	e.T.Helper()
	r.Cost = 1
	dec, err := e.Limiter.Take(context.Background(), r)
	if err != nil || dec.Allowed || dec.RetryAfter != oneToken || !dec.RetryAt.Equal(e.Clock.Now().Add(oneToken)) {
		e.T.Fatalf("take of 1: %+v, %v; want refused with a wait of %v (no tokens left)", dec, err, oneToken)
	}
}

// xtime is x/time/rate's NewLimiter(10, 3) at one hour for one second,
// with room for the debt its tests reserve.
func xtime(name string) *sluice.Limit {
	return sluice.MustLimit(sluice.Spec{Name: name, Rate: 10, Period: time.Hour, Capacity: 3, MaxReserved: 2})
}

func waitReq(l *sluice.Limit, cost float64) sluice.Request {
	return sluice.Request{Limit: l, Key: "k", Cost: cost}
}

func waitSimple(e *WaitEnv) {
	l := xtime("wait-simple")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.WaitNow(ctx, waitReq(l, 1)); !errors.Is(err, context.Canceled) {
		e.T.Fatalf("already-cancelled: %v, want context.Canceled", err)
	}
	// More than the burst and all the debt allowed: never.
	if err := e.WaitNow(context.Background(), waitReq(l, 6)); !errors.Is(err, sluice.ErrCostExceedsLimit) || errors.Is(err, sluice.ErrLimited) {
		e.T.Fatalf("exceed-burst: %v, want ErrCostExceedsLimit", err)
	}
	if err := e.WaitNow(context.Background(), waitReq(l, 2)); err != nil {
		e.T.Fatalf("act-now: %v", err)
	}
	done := e.Start(context.Background(), waitReq(l, 3))
	e.Asleep(1, done)
	e.Clock.Advance(2*WaitStep - time.Microsecond)
	e.Pending(1)
	e.Clock.Advance(time.Microsecond)
	if err := e.Result(done); err != nil {
		e.T.Fatalf("act-later: %v", err)
	}
	e.Empty(waitReq(l, 1), WaitStep)
}

func waitCancel(e *WaitEnv) {
	l := xtime("wait-cancel")
	ctx, cancel := context.WithCancel(context.Background())
	if err := e.WaitNow(ctx, waitReq(l, 2)); err != nil { // 1 token left
		e.T.Fatalf("act-now: %v", err)
	}
	done := e.Start(ctx, waitReq(l, 3)) // -2, its turn 2 steps away
	e.Asleep(1, done)
	e.Clock.Advance(WaitStep)
	e.Pending(1)
	cancel()
	if err := e.Result(done); !errors.Is(err, context.Canceled) {
		e.T.Fatalf("will-cancel: %v, want context.Canceled", err)
	}
	// The 3 tokens came back: -2 + 1 refilled + 3 = 2.
	if err := e.WaitNow(context.Background(), waitReq(l, 2)); err != nil {
		e.T.Fatalf("act-now-after-cancel: %v", err)
	}
	e.Empty(waitReq(l, 1), WaitStep)
}

func waitTimeout(e *WaitEnv) {
	l := xtime("wait-timeout")
	ctx := e.Within(WaitStep)
	if err := e.WaitNow(ctx, waitReq(l, 2)); err != nil {
		e.T.Fatalf("act-now: %v", err)
	}
	now := e.Clock.Now()
	err := e.WaitNow(ctx, waitReq(l, 3)) // its turn would be 2 steps away
	var le *sluice.LimitedError
	if !errors.Is(err, sluice.ErrLimited) || !errors.Is(err, sluice.ErrBeyondDeadline) || !errors.As(err, &le) {
		e.T.Fatalf("w-timeout-err: %v, want a *LimitedError beyond the deadline", err)
	}
	// A Wait with a WaitStep to its deadline is admitted once the bucket holds
	// 3 - 1 token of debt: a WaitStep from now.
	if le.Rule != "wait-timeout" || le.Key != "k" || le.RetryAfter != WaitStep || !le.RetryAt.Equal(now.Add(WaitStep)) {
		e.T.Fatalf("the error says %+v, want rule wait-timeout, key k, retry after %v at %v", le, WaitStep, now.Add(WaitStep))
	}
	// Nothing was charged: the token left is still there.
	if err := e.WaitNow(context.Background(), waitReq(l, 1)); err != nil {
		e.T.Fatal(err)
	}
	e.Empty(waitReq(l, 1), WaitStep)
}

// The deadline is exact: a turn at the deadline is waited for, one a
// microsecond after it is refused, charging nothing.
func waitDeadlineExact(e *WaitEnv) {
	l := sluice.MustLimit(sluice.Spec{Name: "wait-exact", Rate: 10, Period: time.Hour, Capacity: 3})
	for _, key := range []string{"at", "after"} {
		if _, err := e.Limiter.Take(context.Background(), sluice.Request{Limit: l, Key: key, Cost: 3}); err != nil {
			e.T.Fatal(err)
		}
	}
	err := e.WaitNow(e.Within(2*WaitStep-time.Microsecond), sluice.Request{Limit: l, Key: "after", Cost: 2})
	if !errors.Is(err, sluice.ErrBeyondDeadline) {
		e.T.Fatalf("turn a microsecond past the deadline: %v, want ErrBeyondDeadline", err)
	}
	e.Empty(sluice.Request{Limit: l, Key: "after"}, WaitStep)

	done := e.Start(e.Within(2*WaitStep), sluice.Request{Limit: l, Key: "at", Cost: 2})
	e.Asleep(1, done)
	e.Clock.Advance(2*WaitStep - time.Microsecond)
	e.Pending(1)
	e.Clock.Advance(time.Microsecond)
	if err := e.Result(done); err != nil {
		e.T.Fatalf("turn at the deadline: %v", err)
	}
	e.Empty(sluice.Request{Limit: l, Key: "at"}, WaitStep)
}

// Waiters queue: each reserves the next turn, a WaitStep apart, and wakes at it.
// The limit sets no max_reserved: Wait reserves anyway, as x/time/rate's
// does, bounded by the deadline alone.
func waitQueue(e *WaitEnv) {
	l := sluice.MustLimit(sluice.Spec{Name: "wait-queue", Rate: 10, Period: time.Hour, Capacity: 1})
	r := sluice.Request{Limit: l, Key: "k"}
	dones := []chan error{e.Start(context.Background(), r), e.Start(context.Background(), r), e.Start(context.Background(), r)}
	e.Asleep(2) // one of them goes at once
	// The others wake at WaitStep and 2*WaitStep, not a microsecond sooner.
	for turn := 1; turn <= 2; turn++ {
		e.Clock.Advance(WaitStep - time.Microsecond)
		e.Pending(3 - turn)
		e.Clock.Advance(time.Microsecond)
		e.Pending(2 - turn)
	}
	for _, c := range dones {
		if err := e.Result(c); err != nil {
			e.T.Fatal(err)
		}
	}
	e.Empty(r, WaitStep)
}

// A leaky bucket spaces waiters 1/rate apart up to its max_delay; past it
// a Wait is refused at once (ErrLimited) and one whose turn falls after
// its deadline too (ErrBeyondDeadline as well).
func waitLeakyBucket(e *WaitEnv) {
	l := sluice.MustLimit(sluice.Spec{Name: "wait-leaky", Algorithm: sluice.LeakyBucket, Rate: 1, Period: time.Minute, MaxDelay: 3 * time.Minute})
	r := sluice.Request{Limit: l, Key: "k"}
	if err := e.WaitNow(context.Background(), r); err != nil {
		e.T.Fatal(err)
	}
	first := e.Start(context.Background(), r)
	e.Asleep(1, first)
	second := e.Start(context.Background(), r)
	e.Asleep(2, first, second)
	if err := e.Limiter.Wait(e.Within(2*time.Minute+30*time.Second), r); !errors.Is(err, sluice.ErrBeyondDeadline) {
		e.T.Fatalf("a turn 3m away with 2m30s to the deadline: %v, want ErrBeyondDeadline", err)
	}
	third := e.Start(context.Background(), r)
	e.Asleep(3, first, second, third)
	err := e.Limiter.Wait(context.Background(), r)
	if !errors.Is(err, sluice.ErrLimited) || errors.Is(err, sluice.ErrBeyondDeadline) {
		e.T.Fatalf("a turn past max_delay: %v, want ErrLimited alone", err)
	}
	for i, c := range []chan error{first, second, third} {
		e.Clock.Advance(time.Minute - time.Microsecond)
		e.Pending(3 - i)
		e.Clock.Advance(time.Microsecond)
		e.Pending(2 - i)
		if err := e.Result(c); err != nil {
			e.T.Fatal(err)
		}
	}
}

// On a fixed window Wait takes without reserving, sleeps until the window
// that will hold its tokens, and takes then. A turn past the deadline is
// refused at once, and a cancelled wait returns, charging nothing either
// way.
func waitFixedWindow(e *WaitEnv) {
	start := time.Duration(0)
	l := sluice.MustLimit(sluice.Spec{Name: "wait-window", Algorithm: sluice.FixedWindow, Rate: 2, Period: time.Hour, Start: &start})
	r := sluice.Request{Limit: l, Key: "k"}
	e.Clock.Advance(10 * time.Minute)
	if _, err := e.Limiter.Take(context.Background(), sluice.Request{Limit: l, Key: "k", Cost: 2}); err != nil {
		e.T.Fatal(err)
	}
	err := e.WaitNow(e.Within(30*time.Minute), r)
	var le *sluice.LimitedError
	if !errors.Is(err, sluice.ErrBeyondDeadline) || !errors.As(err, &le) || le.RetryAfter != 50*time.Minute {
		e.T.Fatalf("next window 50m away, deadline 30m: %v, want ErrBeyondDeadline retrying after 50m", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := e.Start(ctx, r)
	e.Asleep(1, done)
	cancel()
	if err := e.Result(done); !errors.Is(err, context.Canceled) {
		e.T.Fatalf("cancelled: %v", err)
	}
	done = e.Start(e.Within(time.Hour), r)
	e.Asleep(1, done)
	e.Clock.Advance(50*time.Minute - time.Microsecond)
	e.Pending(1)
	e.Clock.Advance(time.Microsecond)
	if err := e.Result(done); err != nil {
		e.T.Fatal(err)
	}
	// The new window's 2 tokens, less the waiter's one.
	if dec, _ := e.Limiter.Take(context.Background(), r); !dec.Allowed {
		e.T.Fatalf("the second token of the window is gone: %+v", dec)
	}
	if dec, _ := e.Limiter.Take(context.Background(), r); dec.Allowed || dec.RetryAfter != time.Hour {
		e.T.Fatalf("a third token: %+v, want refused until the next window", dec)
	}
}

// Wait with a deadline that has passed on the limiter's clock takes only
// what the bucket holds now.
func waitDeadlinePassed(e *WaitEnv) {
	l := xtime("wait-passed")
	e.Clock.Advance(2 * time.Hour) // the deadline below is in the real future, past on the clock
	ctx := e.Within(-time.Hour)
	if err := e.WaitNow(ctx, waitReq(l, 3)); err != nil {
		e.T.Fatalf("tokens at hand: %v", err)
	}
	if err := e.WaitNow(ctx, waitReq(l, 1)); !errors.Is(err, sluice.ErrBeyondDeadline) {
		e.T.Fatalf("no tokens at hand: %v, want ErrBeyondDeadline", err)
	}
	e.Empty(waitReq(l, 1), WaitStep)
}

// RetryAt is RetryAfter after the time the answer came, on the limiter's
// clock; zero without a wait; the longest wait of an all-or-nothing take.
func waitRetryAt(e *WaitEnv) {
	a := sluice.MustLimit(sluice.Spec{Name: "at-a", Rate: 10, Period: time.Hour, Capacity: 1})
	b := sluice.MustLimit(sluice.Spec{Name: "at-b", Rate: 5, Period: time.Hour, Capacity: 1})
	bg := context.Background()
	ra, rb := sluice.Request{Limit: a, Key: "k"}, sluice.Request{Limit: b, Key: "k"}
	all, _, err := e.Limiter.TakeAll(bg, ra, rb)
	if err != nil || !all.Allowed || !all.RetryAt.IsZero() {
		e.T.Fatalf("admitted: %+v, %v; want no RetryAt", all, err)
	}
	now := e.Clock.Now()
	all, ds, err := e.Limiter.TakeAll(bg, ra, rb)
	if err != nil || all.Allowed || all.Rule != "at-b" || all.RetryAfter != 2*WaitStep || !all.RetryAt.Equal(now.Add(2*WaitStep)) ||
		!ds[0].RetryAt.Equal(now.Add(WaitStep)) || !ds[1].RetryAt.Equal(now.Add(2*WaitStep)) {
		e.T.Fatalf("rejected by both: %+v %+v, %v; want at-b's 2d", all, ds, err)
	}
	e.Clock.Advance(time.Minute)
	for _, do := range []func(context.Context, sluice.Request) (sluice.Decision, error){e.Limiter.Take, e.Limiter.Peek} {
		dec, err := do(bg, ra)
		if err != nil || dec.Allowed || !dec.RetryAt.Equal(now.Add(WaitStep)) {
			e.T.Fatalf("a minute later: %+v, %v; want the same RetryAt, %v", dec, err, now.Add(WaitStep))
		}
	}
}

// A limit's Jitter adds a seeded offset of 0..Jitter to every rejection's
// wait, RetryAt included, the same for the same key, never to a reserved
// turn.
func waitJitter(e *WaitEnv) {
	l := sluice.MustLimit(sluice.Spec{Name: "jittery", Rate: 1, Period: time.Minute, Capacity: 1, MaxReserved: 1, Jitter: 30 * time.Second})
	bg := context.Background()
	offsets := map[time.Duration]bool{}
	for _, key := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		r := sluice.Request{Limit: l, Key: key}
		e.Limiter.Take(bg, r)
		dec, err := e.Limiter.Take(bg, r)
		j := l.Jitter(bg, key)
		if err != nil || dec.Allowed || dec.RetryAfter != time.Minute+j || j < 0 || j > 30*time.Second || !dec.RetryAt.Equal(e.Clock.Now().Add(dec.RetryAfter)) {
			e.T.Fatalf("key %s: %+v, %v; want a wait of 1m + %v", key, dec, err, j)
		}
		if again, _ := e.Limiter.Peek(bg, r); again.RetryAfter != dec.RetryAfter {
			e.T.Fatalf("key %s: a peek says %v, the take %v", key, again.RetryAfter, dec.RetryAfter)
		}
		offsets[j] = true
		// A reservation's turn is exact.
		r.Reserve = true
		if res, _ := e.Limiter.Take(bg, r); !res.Allowed || res.RetryAfter != time.Minute {
			e.T.Fatalf("key %s: reservation %+v, want its turn in exactly 1m", key, res)
		}
	}
	if len(offsets) < 4 {
		e.T.Fatalf("8 keys got %d offsets: %v", len(offsets), offsets)
	}
}
