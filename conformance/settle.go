package conformance

import (
	"cmp"
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// SettleOptions sizes RunSettle's concurrent streams.
type SettleOptions struct {
	Goroutines int // callers on one key (default 8)
	PerCaller  int // requests each caller settles (default 25)
}

// RunSettle checks Limiter.Settle on a store: exact settlements one at a
// time (a refund, an extra charge into debt, the debt's bound), then
// callers that take an estimate and settle the actual cost concurrently
// on one key, on a stopped clock. However their calls interleave, the
// bucket must end where the actual costs put it: capacity - sum(actual -
// forgiven) over the admitted requests. A settlement that lost or doubled
// a charge, a refund that raced an extra charge, shows as a difference.
func RunSettle(t *testing.T, newStore NewStore, opts SettleOptions) {
	opts.Goroutines = cmp.Or(opts.Goroutines, 8)
	opts.PerCaller = cmp.Or(opts.PerCaller, 25)
	start := engine.Duration(0)
	specs := []sluice.Spec{
		{Name: "settle-tb", TokensPerSecond: 1, Burst: 100},
		{Name: "settle-tb-mr", TokensPerSecond: 1, Burst: 100, MaxReserved: 30},
		{Name: "settle-fw", Algorithm: sluice.FixedWindow, Rate: 100, Period: time.Hour, Start: &start},
		{Name: "settle-sl", Algorithm: sluice.SlidingLog, Rate: 100, Period: time.Hour},
	}
	for _, spec := range specs {
		t.Run(spec.Name+"/exact", func(t *testing.T) { settleExact(t, newStore, sluice.MustLimit(spec)) })
		// Ten times the size, so that hundreds of requests settle before
		// the debt reaches its bound and the stopped clock admits no more.
		spec.Burst, spec.Rate, spec.MaxReserved = 10*spec.Burst, 10*spec.Rate, 10*spec.MaxReserved
		t.Run(spec.Name+"/concurrent", func(t *testing.T) { settleConcurrent(t, newStore, sluice.MustLimit(spec), opts) })
	}
}

// Level reads the tokens of key's bucket without changing them: a peek
// of a micro-token (a sliding log's charge: a token) reports what would
// be left after it when admitted, and what there is when refused.
func Level(t *testing.T, l *sluice.Limiter, lim *sluice.Limit, key string) float64 {
	t.Helper()
	r := sluice.Request{Limit: lim, Key: key, Cost: 1e-6}
	ch, err := r.Charged(engine.OpPeek) // a sliding log's is a token
	d, err2 := l.Peek(context.Background(), r)
	if err := cmp.Or(err, err2); err != nil {
		t.Fatal(err)
	}
	if d.Allowed {
		return d.Tokens + engine.FromMicroTokens(ch.Cost)
	}
	return d.Tokens
}

func settleExact(t *testing.T, newStore NewStore, lim *sluice.Limit) {
	clock := sluice.NewManualClock(time.UnixMicro(1_000_000_000_000))
	l := sluice.NewWithOptions(newStore(t, clock), sluice.Options{Clock: clock})
	ctx := context.Background()
	req := sluice.Request{Limit: lim, Key: "k"}
	take := func(cost float64) {
		t.Helper()
		r := req
		r.Cost = cost
		if d, err := l.Take(ctx, r); err != nil || !d.Allowed {
			t.Fatalf("take %v: %+v %v", cost, d, err)
		}
	}
	settle := func(charged, actual float64, want sluice.Settlement, level float64) {
		t.Helper()
		s, err := l.Settle(ctx, req, charged, actual)
		if err != nil {
			t.Fatalf("settle %v as %v: %v", charged, actual, err)
		}
		if s.Refunded != want.Refunded || s.Extra != want.Extra || s.Forgiven != want.Forgiven || !s.Decision.Allowed {
			t.Fatalf("settle %v as %v: %+v, want refunded %v extra %v forgiven %v", charged, actual, s, want.Refunded, want.Extra, want.Forgiven)
		}
		if got := Level(t, l, lim, "k"); got != level {
			t.Fatalf("settle %v as %v: the bucket holds %v, want %v", charged, actual, got, level)
		}
	}
	debt := lim.SettleDebt()
	take(40)
	settle(40, 12.5, sluice.Settlement{Refunded: 27.5}, 87.5)
	take(20)
	settle(20, 20, sluice.Settlement{}, 67.5)
	take(10)
	settle(10, 0, sluice.Settlement{Refunded: 10}, 67.5)
	take(30)
	settle(30, 60, sluice.Settlement{Extra: 30}, 7.5)
	if debt == 0 {
		// No debt: what does not fit the bucket is forgiven.
		take(7.5)
		settle(7.5, 10, sluice.Settlement{Forgiven: 2.5}, 0)
		return
	}
	// Into debt, up to the bound, and the rest forgiven.
	take(7.5)
	settle(7.5, 17.5+debt, sluice.Settlement{Extra: debt, Forgiven: 10}, -debt)
	// A bucket at its bound owes no more, however much a response reports.
	settle(1, 1e6, sluice.Settlement{Forgiven: 1e6 - 1}, -debt)
}

// settled is one admitted request's settlement, in micro-tokens.
type settled struct{ actual, forgiven int64 }

func settleConcurrent(t *testing.T, newStore NewStore, lim *sluice.Limit, opts SettleOptions) {
	clock := sluice.NewManualClock(time.UnixMicro(1_000_000_000_000))
	l := sluice.NewWithOptions(newStore(t, clock), sluice.Options{Clock: clock})
	ctx := context.Background()
	var mu sync.Mutex
	var done []settled
	var errs []error
	var wg sync.WaitGroup
	for g := range opts.Goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(20261121, uint64(g)))
			for range opts.PerCaller {
				est := 1 + rng.IntN(10)
				// Below or above the estimate, and now and then far above:
				// enough in all to take the bucket into debt, to its bound
				// and past it.
				actual := float64(rng.IntN(2*est+3)) + 0.25*float64(rng.IntN(4))
				if rng.IntN(100) == 0 {
					actual = float64(100 + rng.IntN(200))
				}
				// Half the takes reserve, so that the bucket goes on into
				// debt and extra charges meet their bound.
				reserve := lim.Algorithm() != sluice.SlidingLog && rng.IntN(2) == 0
				req := sluice.Request{Limit: lim, Key: "hot", Cost: float64(est), Reserve: reserve}
				d, err := l.Take(ctx, req)
				if err == nil && !d.Allowed {
					continue // refused, charged nothing: nothing to settle
				}
				var s sluice.Settlement
				if err == nil {
					s, err = l.Settle(ctx, req, req.Cost, actual)
				}
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					done = append(done, settled{actual: micro(actual), forgiven: micro(s.Forgiven)})
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d settlements failed, the first: %v", len(errs), errs[0])
	}
	want := micro(lim.Capacity())
	for _, s := range done {
		want -= s.actual - s.forgiven
	}
	if got := micro(Level(t, l, lim, "hot")); got != want {
		t.Fatalf("after %d settled requests the bucket holds %v tokens, want %v (capacity - sum of actual costs not forgiven)", len(done), engine.FromMicroTokens(got), engine.FromMicroTokens(want))
	}
	if total := opts.Goroutines * opts.PerCaller; len(done) < min(total*9/10, 50) {
		t.Fatalf("only %d of %d requests were admitted: the stream does not exercise settling", len(done), total)
	}
	var forgiven int64
	for _, s := range done {
		forgiven += s.forgiven
	}
	t.Logf("%d settled, %v tokens forgiven, the bucket at %v", len(done), engine.FromMicroTokens(forgiven), engine.FromMicroTokens(want))
}

func micro(tokens float64) int64 { return int64(math.Round(tokens * engine.TokenScale)) }
