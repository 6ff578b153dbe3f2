package conformance

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// LeaseOptions tunes RunLeases.
type LeaseOptions struct {
	// Goroutines is how many callers race for the slots (default 32).
	Goroutines int
	// Rounds is how many acquire-release cycles each caller of the churn
	// makes (default 20).
	Rounds int
}

// RunLeases checks a store's concurrency limits under concurrent callers,
// beyond the vectors' single caller: of N+1 (or many more) acquires made
// at once, exactly N are admitted; a release frees its slot at once, and
// a second release of it finds nothing; a lease that is never released
// frees its slot exactly when it ends; callers that acquire and release
// in a loop never hold more than N slots together and leave every slot
// free; a limit whose N was lowered admits again only once enough leases
// have ended. The store reads its time from a manual clock, so every
// expiry is exact and nothing waits in real time.
func RunLeases(t *testing.T, newStore NewStore, opts LeaseOptions) {
	t.Helper()
	if opts.Goroutines <= 0 {
		opts.Goroutines = 32
	}
	if opts.Rounds <= 0 {
		opts.Rounds = 20
	}
	lease := 10 * time.Second
	ctx := context.Background()
	fresh := func(t *testing.T) (*sluice.Limiter, *sluice.ManualClock) {
		clock := sluice.NewManualClock(time.UnixMicro(1_000_000_000))
		return sluice.NewWithOptions(newStore(t, clock), sluice.Options{Clock: clock}), clock
	}
	limit := func(name string, n int) *sluice.Limit {
		return sluice.MustLimit(sluice.Spec{Name: name, Algorithm: sluice.Concurrency, MaxInFlight: n, Lease: lease})
	}

	for _, tc := range []struct{ n, callers int }{{1, 2}, {5, 6}, {5, opts.Goroutines}} {
		t.Run(fmt.Sprintf("n%d_of_%d_at_once", tc.n, tc.callers), func(t *testing.T) {
			lim, clock := fresh(t)
			l := limit("cc-race", tc.n)
			leases := raceAcquire(t, lim, l, "k", tc.callers)
			if len(leases) != tc.n {
				t.Fatalf("%d of %d acquires at once admitted, want exactly %d", len(leases), tc.callers, tc.n)
			}
			d, err := lim.Peek(ctx, sluice.Request{Limit: l, Key: "k"})
			if err != nil || d.Allowed || d.Remaining != 0 {
				t.Fatalf("peek with every slot held: %+v, %v; want rejected, 0 remaining", d, err)
			}
			if d.RetryAfter != lease {
				t.Fatalf("peek's retry after %v, want the lease %v (no lease has run any of it)", d.RetryAfter, lease)
			}

			// A release frees its slot at once; a second finds nothing.
			if err := leases[0].Release(ctx); err != nil {
				t.Fatal(err)
			}
			d, err = lim.Release(ctx, sluice.Request{Limit: l, Key: "k"}, leases[0].ID())
			if err != nil || d.Allowed {
				t.Fatalf("second release of one lease: %+v, %v; want not held", d, err)
			}
			if d.Remaining != 1 {
				t.Fatalf("after one release %d slots are free, want 1", d.Remaining)
			}
			clock.Advance(time.Second)
			again := raceAcquire(t, lim, l, "k", tc.callers)
			if len(again) != 1 {
				t.Fatalf("after one release %d acquires at once admitted, want 1", len(again))
			}

			// The others are never released (their holders died): their
			// slots come back exactly when their leases end.
			clock.Advance(lease - time.Second - time.Microsecond)
			if got := raceAcquire(t, lim, l, "k", tc.callers); len(got) != 0 {
				t.Fatalf("1us before the leases end, %d acquires admitted, want 0", len(got))
			}
			clock.Advance(time.Microsecond)
			// The lease taken after the release ends later; every other
			// slot is free again.
			if got := raceAcquire(t, lim, l, "k", tc.callers); len(got) != tc.n-1 {
				t.Fatalf("when the dead holders' leases end, %d acquires admitted, want %d", len(got), tc.n-1)
			}
			if d, err := lim.Release(ctx, sluice.Request{Limit: l, Key: "k"}, leases[len(leases)-1].ID()); err != nil || d.Allowed {
				t.Fatalf("release of an expired lease: %+v, %v; want not held", d, err)
			}
		})
	}

	t.Run("churn", func(t *testing.T) {
		lim, _ := fresh(t)
		const n = 3
		l := limit("cc-churn", n)
		var inFlight, most, admitted atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, opts.Goroutines)
		for g := 0; g < opts.Goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range opts.Rounds {
					ls, d, err := lim.Acquire(ctx, sluice.Request{Limit: l, Key: "k"})
					if err != nil {
						errs <- err
						return
					}
					if !d.Allowed {
						continue
					}
					admitted.Add(1)
					now := inFlight.Add(1)
					for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
					}
					inFlight.Add(-1)
					d, err = lim.Release(ctx, sluice.Request{Limit: l, Key: "k"}, ls.ID())
					if err != nil {
						errs <- err
						return
					}
					if !d.Allowed {
						errs <- fmt.Errorf("a held lease's release found nothing: %+v", d)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if most.Load() > n {
			t.Fatalf("%d callers held slots at once, want at most %d", most.Load(), n)
		}
		if admitted.Load() == 0 {
			t.Fatal("no acquire was admitted")
		}
		d, err := lim.Peek(ctx, sluice.Request{Limit: l, Key: "k"})
		if err != nil || !d.Allowed || d.Remaining != n-1 {
			t.Fatalf("after every holder released: %+v, %v; want every slot free (a peek leaves %d)", d, err, n-1)
		}
	})

	t.Run("lowered_n", func(t *testing.T) {
		lim, clock := fresh(t)
		three := limit("cc-lowered", 3)
		for range 3 {
			if _, d, err := lim.Acquire(ctx, sluice.Request{Limit: three, Key: "k"}); err != nil || !d.Allowed {
				t.Fatalf("acquire: %+v, %v", d, err)
			}
			clock.Advance(time.Second)
		}
		// Now 3s after the first; the leases end at 10s, 11s and 12s.
		one := limit("cc-lowered", 1)
		_, d, err := lim.Acquire(ctx, sluice.Request{Limit: one, Key: "k"})
		if err != nil || d.Allowed {
			t.Fatalf("3 held under a limit lowered to 1: %+v, %v; want rejected", d, err)
		}
		if d.RetryAfter != 9*time.Second || d.Tokens != -2 {
			t.Fatalf("3 held under a limit lowered to 1: retry after %v, tokens %v; want 9s (when the third lease ends) and -2", d.RetryAfter, d.Tokens)
		}
		clock.Advance(9 * time.Second)
		if _, d, err := lim.Acquire(ctx, sluice.Request{Limit: one, Key: "k"}); err != nil || !d.Allowed {
			t.Fatalf("once every lease ended: %+v, %v; want admitted", d, err)
		}
	})

	t.Run("reset_and_keys", func(t *testing.T) {
		lim, _ := fresh(t)
		l := limit("cc-reset", 1)
		other := limit("cc-reset-other", 1)
		for _, r := range []sluice.Request{{Limit: l, Key: "a"}, {Limit: l, Key: "b"}, {Limit: other, Key: "a"}} {
			if _, d, err := lim.Acquire(ctx, r); err != nil || !d.Allowed {
				t.Fatalf("%s/%s: the first acquire of its own key: %+v, %v", r.Limit.Name(), r.Key, d, err)
			}
		}
		if err := lim.Reset(ctx, l, "a"); err != nil {
			t.Fatal(err)
		}
		if _, d, err := lim.Acquire(ctx, sluice.Request{Limit: l, Key: "a"}); err != nil || !d.Allowed {
			t.Fatalf("after a reset: %+v, %v; want admitted", d, err)
		}
		for _, r := range []sluice.Request{{Limit: l, Key: "b"}, {Limit: other, Key: "a"}} {
			if _, d, err := lim.Acquire(ctx, r); err != nil || d.Allowed {
				t.Fatalf("%s/%s, untouched by the reset: %+v, %v; want rejected", r.Limit.Name(), r.Key, d, err)
			}
		}
	})
}

// raceAcquire makes callers acquires of l's key at once and returns the
// leases admitted.
func raceAcquire(t *testing.T, lim *sluice.Limiter, l *sluice.Limit, key string, callers int) []sluice.Lease {
	t.Helper()
	var (
		mu  sync.Mutex
		got []sluice.Lease
		wg  sync.WaitGroup
	)
	start := make(chan struct{})
	errs := make(chan error, callers)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ls, d, err := lim.Acquire(context.Background(), sluice.Request{Limit: l, Key: key})
			switch {
			case err != nil:
				errs <- err
			case d.Allowed != ls.Held():
				errs <- fmt.Errorf("decision allowed %v with a lease held %v", d.Allowed, ls.Held())
			case d.Allowed:
				mu.Lock()
				got = append(got, ls)
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return got
}

// CallsOnNothing renews and releases a lease of each of n keys of cc, a
// concurrency limit, that hold none, under ids never acquired: what a
// caller with the decision API's token may send for keys of its
// choosing. It fails t if any is admitted; the caller then checks that
// its store kept no state for them, since only an admitted acquire may.
func CallsOnNothing(ctx context.Context, t testing.TB, lim *sluice.Limiter, cc *sluice.Limit, n int) {
	t.Helper()
	for i := range n {
		r := sluice.Request{Limit: cc, Key: fmt.Sprint("k", i)}
		if d, err := lim.Renew(ctx, r, sluice.NewLeaseID()); err != nil || d.Allowed {
			t.Fatalf("renew of a key holding nothing: %+v, %v", d, err)
		}
		if d, err := lim.Release(ctx, r, sluice.NewLeaseID()); err != nil || d.Allowed {
			t.Fatalf("release of a key holding nothing: %+v, %v", d, err)
		}
	}
}
