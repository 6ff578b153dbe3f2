package memory_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// Limiter.Take and Allow on a store of the system clock go through the
// memory store's own way for a token or leaky bucket on the coarse clock
// (TakeOutcome), and on a store with PreciseClock set through its
// general one (decideOne): the same random sequence of requests, on
// limits so slow that the time the test takes moves no whole token,
// answers alike on both. New keys, admissions, reservations, rejections
// and a limit whose rate changes under the same name (its state is
// converted on the general way) are all in it. The waits may differ by
// how far apart the two stores read the time, never by a token's worth.
func TestCoarseWayAnswersAsPreciseWay(t *testing.T) {
	limits := []*sluice.Limit{
		sluice.MustLimit(sluice.Spec{Name: "tb", Rate: 20, Period: time.Hour, Capacity: 5}),
		sluice.MustLimit(sluice.Spec{Name: "res", Rate: 10, Period: time.Hour, Capacity: 3, MaxReserved: 4}),
		sluice.MustLimit(sluice.Spec{Name: "leaky", Algorithm: sluice.LeakyBucket, Rate: 30, Period: time.Hour, MaxReserved: 3}),
		sluice.MustLimit(sluice.Spec{Name: "moved", Rate: 12, Period: time.Hour, Capacity: 4}),
		sluice.MustLimit(sluice.Spec{Name: "moved", Rate: 7, Period: time.Hour, Capacity: 6}),
	}
	bg := context.Background()
	coarse := sluice.New(memory.New(memory.Options{}))
	precise := sluice.New(memory.New(memory.Options{PreciseClock: true}))
	rng := rand.New(rand.NewPCG(3, 5))
	start := time.Now()
	for i := range 20000 {
		r := sluice.Request{Limit: limits[rng.IntN(len(limits))], Key: "k" + strconv.Itoa(rng.IntN(40))}
		switch rng.IntN(6) {
		case 0:
			r.Cost = float64(1 + rng.IntN(3))
		case 1:
			r.Reserve = true
		case 2:
			r.NoReserve = true
		}
		if rng.IntN(4) == 0 {
			if got, want := coarse.Allow(bg, r.Limit, r.Key), precise.Allow(bg, r.Limit, r.Key); got != want {
				t.Fatalf("step %d: Allow(%s, %s) = %v, want %v", i, r.Limit.Name(), r.Key, got, want)
			}
			continue
		}
		got, gerr := coarse.Take(bg, r)
		want, werr := precise.Take(bg, r)
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("step %d: Take(%+v) error %v, want %v", i, r, gerr, werr)
		}
		// However far apart the two stores read the time, while the test
		// runs, and however late the coarse clock is, within a second.
		slack := time.Since(start) + time.Second
		if got.Allowed != want.Allowed || got.Remaining != want.Remaining || got.Capacity != want.Capacity || got.Rule != want.Rule ||
			!near(got.RetryAfter, want.RetryAfter, slack) || !near(got.ResetAfter, want.ResetAfter, slack) ||
			got.RetryAt.IsZero() != want.RetryAt.IsZero() || !near(got.RetryAt.Sub(want.RetryAt), 0, slack) {
			t.Fatalf("step %d: Take(%+v) = %+v, want %+v", i, r, got, want)
		}
		if !got.RetryAt.IsZero() && !near(time.Until(got.RetryAt), got.RetryAfter, slack) {
			t.Fatalf("step %d: RetryAt %v is not RetryAfter %v from now", i, got.RetryAt, got.RetryAfter)
		}
	}
}

func near(a, b, within time.Duration) bool { return a-b <= within && b-a <= within }

// A rejection on the coarse clock whose wait is within the recheck
// window is decided again on the precise clock (clock.go): on a limit of
// one token a millisecond, asked without pause, every rejection waits
// at most that millisecond, or, where a late coarse clock made the wait
// longer than the window, more than the window; never a wait between.
func TestCoarseWayRechecksNearTheBoundary(t *testing.T) {
	bg := context.Background()
	lim := sluice.New(memory.New(memory.Options{}))
	l := sluice.MustLimit(sluice.Spec{Name: "ms", TokensPerSecond: 1000, Burst: 1})
	rejected := 0
	for i := range 20000 {
		d, err := lim.Take(bg, sluice.Request{Limit: l, Key: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			if d.RetryAfter != 0 || !d.RetryAt.IsZero() {
				t.Fatalf("take %d: admitted with a wait: %+v", i, d)
			}
			continue
		}
		rejected++
		if d.RetryAfter <= 0 || d.RetryAfter > time.Millisecond && d.RetryAfter <= 2*time.Millisecond || d.RetryAt.IsZero() {
			t.Fatalf("take %d: rejected with %+v", i, d)
		}
	}
	if rejected == 0 {
		t.Fatal("no take was rejected")
	}
}
