package redis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/redis"
)

// Limiter.Wait, Decision.RetryAt and a limit's jitter on a real Redis,
// decided on the store's clock (here a manual one, which the store passes
// to its scripts) and slept on the limiter's, the same clock. The clock
// starts at least an hour after the real now, so that the contexts' deadlines, which the
// runtime keeps in real time, lie in the real future.
func TestWaitAndRetryAt(t *testing.T) {
	clock := sluice.NewManualClock(time.Now().Truncate(time.Hour).Add(2 * time.Hour))
	lim := sluice.NewWithOptions(open(t, standaloneURL(t), redis.Options{Clock: clock}), sluice.Options{Clock: clock})
	const d = 6 * time.Minute // one token of 10 per hour
	l := uniqueLimit(t, sluice.Spec{Name: "wait", Rate: 10, Period: time.Hour, Capacity: 3})
	r := func(cost float64) sluice.Request { return sluice.Request{Limit: l, Key: "k", Cost: cost} }
	bg := context.Background()
	asleep := func(n int, done chan error) {
		t.Helper()
		for {
			k, changed := clock.PendingTimers()
			if k == n {
				return
			}
			select {
			case <-changed:
			case err := <-done:
				t.Fatalf("Wait returned %v before sleeping", err)
			case <-time.After(time.Minute):
				t.Fatal("no waiter sleeps after a minute")
			}
		}
	}
	start := func(ctx context.Context, req sluice.Request) chan error {
		done := make(chan error, 1)
		go func() { done <- lim.Wait(ctx, req) }()
		return done
	}
	emptyFor := func(wait time.Duration) {
		t.Helper()
		dec, err := lim.Take(bg, r(1))
		if err != nil || dec.Allowed || dec.RetryAfter != wait || !dec.RetryAt.Equal(clock.Now().Add(wait)) {
			t.Fatalf("take of 1: %+v, %v; want refused, retry after %v at %v", dec, err, wait, clock.Now().Add(wait))
		}
	}

	if err := lim.Wait(atNow(t, clock), r(2)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithDeadline(bg, clock.Now().Add(d))
	defer cancel()
	err := lim.Wait(ctx, r(3)) // its turn would be 2d away
	var le *sluice.LimitedError
	if !errors.Is(err, sluice.ErrBeyondDeadline) || !errors.As(err, &le) || le.RetryAfter != d || !le.RetryAt.Equal(clock.Now().Add(d)) {
		t.Fatalf("a turn past the deadline: %v, want ErrBeyondDeadline, retry after %v", err, d)
	}
	done := start(bg, r(3)) // nothing was charged: 1 token, so -2 and a turn 2d away
	asleep(1, done)
	clock.Advance(2*d - time.Microsecond)
	asleep(1, done)
	clock.Advance(time.Microsecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	emptyFor(d)

	// Cancelled while asleep, the reservation goes back.
	cctx, ccancel := context.WithCancel(bg)
	done = start(cctx, r(1))
	asleep(1, done)
	ccancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	emptyFor(d) // not 2d: the token came back

	// The limit's jitter is in the decision, RetryAt included.
	jl := uniqueLimit(t, sluice.Spec{Name: "jitter", Rate: 10, Period: time.Hour, Capacity: 1, Jitter: time.Minute})
	lim.Take(bg, sluice.Request{Limit: jl, Key: "j"})
	dec, err := lim.Take(bg, sluice.Request{Limit: jl, Key: "j"})
	if want := d + jl.Jitter(bg, "j"); err != nil || dec.Allowed || dec.RetryAfter != want || !dec.RetryAt.Equal(clock.Now().Add(want)) {
		t.Fatalf("jittered rejection: %+v, %v; want a wait of %v", dec, err, want)
	}

	// A fixed window: Wait sleeps to the window that holds its token.
	at := time.Duration(0)
	wl := uniqueLimit(t, sluice.Spec{Name: "window", Algorithm: sluice.FixedWindow, Rate: 1, Period: time.Hour, Start: &at})
	clock.Set(clock.Now().Truncate(time.Hour).Add(time.Hour + 10*time.Minute))
	if err := lim.Wait(atNow(t, clock), sluice.Request{Limit: wl, Key: "w"}); err != nil {
		t.Fatal(err)
	}
	done = start(bg, sluice.Request{Limit: wl, Key: "w"})
	asleep(1, done)
	clock.Advance(50*time.Minute - time.Microsecond)
	asleep(1, done)
	clock.Advance(time.Microsecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// atNow is a context whose deadline is clock's now: a Wait under it goes
// at once or fails, and never sleeps (which would hang the test).
func atNow(t *testing.T, clock *sluice.ManualClock) context.Context {
	ctx, cancel := context.WithDeadline(context.Background(), clock.Now())
	t.Cleanup(cancel)
	return ctx
}
