package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/postgres"
)

// Limiter.Wait on PostgreSQL: a turn past the deadline is refused in the
// statement that would have charged it, and a cancelled wait's
// reservation comes back. The store decides on the manual clock the
// limiter sleeps on, which starts at least an hour after the real now, so that the
// contexts' deadlines lie in the real future.
func TestWait(t *testing.T) {
	clock := sluice.NewManualClock(time.Now().Truncate(time.Hour).Add(2 * time.Hour))
	lim := sluice.NewWithOptions(newStoreOpts(t, postgres.Options{Clock: clock}), sluice.Options{Clock: clock})
	const d = 6 * time.Minute // one token of 10 per hour
	l := sluice.MustLimit(sluice.Spec{Name: "pg-wait", Rate: 10, Period: time.Hour, Capacity: 3})
	r := func(cost float64) sluice.Request { return sluice.Request{Limit: l, Key: "k", Cost: cost} }
	bg := context.Background()
	emptyFor := func(wait time.Duration) {
		t.Helper()
		dec, err := lim.Take(bg, r(1))
		if err != nil || dec.Allowed || dec.RetryAfter != wait || !dec.RetryAt.Equal(clock.Now().Add(wait)) {
			t.Fatalf("take of 1: %+v, %v; want refused, retry after %v", dec, err, wait)
		}
	}
	asleep := func(done chan error) {
		t.Helper()
		for {
			n, changed := clock.PendingTimers()
			if n == 1 {
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

	if err := lim.Wait(atNow(t, clock), r(2)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithDeadline(bg, clock.Now().Add(2*d-time.Microsecond))
	defer cancel()
	if err := lim.Wait(ctx, r(3)); !errors.Is(err, sluice.ErrBeyondDeadline) { // its turn: 2d away
		t.Fatalf("a turn a microsecond past the deadline: %v", err)
	}
	cctx, ccancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() { done <- lim.Wait(cctx, r(3)) }()
	asleep(done)
	clock.Advance(d)
	ccancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	// 1 token, -2 reserved, +1 refilled, +3 given back: 2 tokens.
	if err := lim.Wait(atNow(t, clock), r(2)); err != nil {
		t.Fatal(err)
	}
	emptyFor(d)
}

// atNow is a context whose deadline is clock's now: a Wait under it goes
// at once or fails, and never sleeps (which would hang the test).
func atNow(t *testing.T, clock *sluice.ManualClock) context.Context {
	ctx, cancel := context.WithDeadline(context.Background(), clock.Now())
	t.Cleanup(cancel)
	return ctx
}
