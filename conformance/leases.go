package conformance

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/defaults"
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
	defaults.Set(&opts.Goroutines, 32)
	defaults.Set(&opts.Rounds, 20)
	r := leaseRun{newStore: newStore, opts: opts, lease: 10 * time.Second}
	for _, tc := range []struct{ n, callers int }{{1, 2}, {5, 6}, {5, opts.Goroutines}} {
		t.Run(fmt.Sprintf("n%d_of_%d_at_once", tc.n, tc.callers), func(t *testing.T) { r.atOnce(t, tc.n, tc.callers) })
	}
	t.Run("churn", r.churn)
	t.Run("lowered_n", r.loweredN)
	t.Run("reset_and_keys", r.resetAndKeys)
}

// leaseRun is one RunLeases: the store under test and the lease every
// limit holds its slots for.
type leaseRun struct {
	newStore NewStore
	opts     LeaseOptions
	lease    time.Duration
}

// fresh returns a Limiter over a new store on a new manual clock.
func (r leaseRun) fresh(t *testing.T) (*sluice.Limiter, *sluice.ManualClock) {
	clock := sluice.NewManualClock(time.UnixMicro(1_000_000_000))
	return sluice.NewWithOptions(r.newStore(t, clock), sluice.Options{Clock: clock}), clock
}

func (r leaseRun) limit(name string, n int) *sluice.Limit {
	return sluice.MustLimit(sluice.Spec{Name: name, Algorithm: sluice.Concurrency, MaxInFlight: n, LeaseTerm: r.lease})
}

// atOnce: of callers acquires made at once, exactly n are admitted; a
// release frees its slot at once; a lease never released frees its slot
// exactly when it ends.
func (r leaseRun) atOnce(t *testing.T, n, callers int) {
	ctx := context.Background()
	lim, clock := r.fresh(t)
	l := r.limit("cc-race", n)
	leases := raceAcquire(t, lim, l, "k", callers)
	if len(leases) != n {
		t.Fatalf("%d of %d acquires at once admitted, want exactly %d", len(leases), callers, n)
	}
	d, err := lim.Peek(ctx, sluice.Request{Limit: l, Key: "k"})
	if err != nil || d.Allowed || d.Remaining != 0 {
		t.Fatalf("peek with every slot held: %+v, %v; want rejected, 0 remaining", d, err)
	}
	if d.RetryAfter != r.lease {
		t.Fatalf("peek's retry after %v, want the lease %v (no lease has run any of it)", d.RetryAfter, r.lease)
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
	again := raceAcquire(t, lim, l, "k", callers)
	if len(again) != 1 {
		t.Fatalf("after one release %d acquires at once admitted, want 1", len(again))
	}

	// The others are never released (their holders died): their
	// slots come back exactly when their leases end.
	clock.Advance(r.lease - time.Second - time.Microsecond)
	if got := raceAcquire(t, lim, l, "k", callers); len(got) != 0 {
		t.Fatalf("1us before the leases end, %d acquires admitted, want 0", len(got))
	}
	clock.Advance(time.Microsecond)
	// The lease taken after the release ends later; every other
	// slot is free again.
	if got := raceAcquire(t, lim, l, "k", callers); len(got) != n-1 {
		t.Fatalf("when the dead holders' leases end, %d acquires admitted, want %d", len(got), n-1)
	}
	if d, err := lim.Release(ctx, sluice.Request{Limit: l, Key: "k"}, leases[len(leases)-1].ID()); err != nil || d.Allowed {
		t.Fatalf("release of an expired lease: %+v, %v; want not held", d, err)
	}
}

// churn: callers that acquire and release in a loop never hold more than
// N slots together, and leave every slot free.
func (r leaseRun) churn(t *testing.T) {
	ctx := context.Background()
	lim, _ := r.fresh(t)
	const n = 3
	l := r.limit("cc-churn", n)
	var inFlight, most, admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, r.opts.Goroutines)
	for g := 0; g < r.opts.Goroutines; g++ {
		wg.Go(func() {
			for range r.opts.Rounds {
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
		})
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
}

// loweredN: a limit whose N was lowered admits again only once enough
// leases have ended.
func (r leaseRun) loweredN(t *testing.T) {
	ctx := context.Background()
	lim, clock := r.fresh(t)
	three := r.limit("cc-lowered", 3)
	for range 3 {
		if _, d, err := lim.Acquire(ctx, sluice.Request{Limit: three, Key: "k"}); err != nil || !d.Allowed {
			t.Fatalf("acquire: %+v, %v", d, err)
		}
		clock.Advance(time.Second)
	}
	// Now 3s after the first; the leases end at 10s, 11s and 12s.
	one := r.limit("cc-lowered", 1)
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
}

// resetAndKeys: Reset frees one key of one limit, and no other.
func (r leaseRun) resetAndKeys(t *testing.T) {
	ctx := context.Background()
	lim, _ := r.fresh(t)
	l := r.limit("cc-reset", 1)
	other := r.limit("cc-reset-other", 1)
	for _, req := range []sluice.Request{{Limit: l, Key: "a"}, {Limit: l, Key: "b"}, {Limit: other, Key: "a"}} {
		if _, d, err := lim.Acquire(ctx, req); err != nil || !d.Allowed {
			t.Fatalf("%s/%s: the first acquire of its own key: %+v, %v", req.Limit.Name(), req.Key, d, err)
		}
	}
	if err := lim.Reset(ctx, l, "a"); err != nil {
		t.Fatal(err)
	}
	if _, d, err := lim.Acquire(ctx, sluice.Request{Limit: l, Key: "a"}); err != nil || !d.Allowed {
		t.Fatalf("after a reset: %+v, %v; want admitted", d, err)
	}
	for _, req := range []sluice.Request{{Limit: l, Key: "b"}, {Limit: other, Key: "a"}} {
		if _, d, err := lim.Acquire(ctx, req); err != nil || d.Allowed {
			t.Fatalf("%s/%s, untouched by the reset: %+v, %v; want rejected", req.Limit.Name(), req.Key, d, err)
		}
	}
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
		wg.Go(func() {
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
		})
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
		if d, err := lim.Renew(ctx, r, engine.NewLeaseID()); err != nil || d.Allowed {
			t.Fatalf("renew of a key holding nothing: %+v, %v", d, err)
		}
		if d, err := lim.Release(ctx, r, engine.NewLeaseID()); err != nil || d.Allowed {
			t.Fatalf("release of a key holding nothing: %+v, %v", d, err)
		}
	}
}
