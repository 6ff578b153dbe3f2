package memory_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/metrics"
)

// storeOnly hides the memory store's own answers to Limiter.Take and
// Limiter.Allow (TakeOutcome, Allow), so that a Limiter over it goes the
// way it goes for any store.
type storeOnly struct{ sluice.Store }

// The Limiter's short ways through the memory store (TakeOutcome for
// Take, Allow for Allow) answer exactly what the way through Store.Take
// answers, RetryAt and jitter included: the same random sequence of
// costs, reservations and clock steps, on a Limiter with the test's clock
// and on one with the system clock.
func TestLimiterShortWaysAnswerAsStoreTake(t *testing.T) {
	limits := []*sluice.Limit{
		sluice.MustLimit(sluice.Spec{Name: "tb", Rate: 10, Period: time.Second, Capacity: 5}),
		sluice.MustLimit(sluice.Spec{Name: "slow", Rate: 10, Period: time.Minute, Capacity: 3, MaxReserved: 4}),
		sluice.MustLimit(sluice.Spec{Name: "jit", Rate: 2, Period: time.Second, Capacity: 2, Jitter: 300 * time.Millisecond}),
		sluice.MustLimit(sluice.Spec{Name: "leaky", Algorithm: sluice.LeakyBucket, Rate: 5, Period: time.Second}),
		sluice.MustLimit(sluice.Spec{Name: "fw", Algorithm: sluice.FixedWindow, Rate: 4, Period: time.Second}),
	}
	bg := context.Background()
	for _, withClock := range []bool{true, false} {
		clk := sluice.NewManualClock(time.Unix(1_700_000_000, 0))
		short := memory.New(memory.Options{Clock: clk})
		long := memory.New(memory.Options{Clock: clk})
		var opts sluice.Options
		if withClock {
			opts.Clock = clk
		}
		a, b := sluice.NewWithOptions(short, opts), sluice.NewWithOptions(storeOnly{long}, opts)
		rng := rand.New(rand.NewPCG(7, 11))
		for i := range 3000 {
			r := sluice.Request{Limit: limits[rng.IntN(len(limits))], Key: "k" + string(rune('0'+rng.IntN(3)))}
			switch rng.IntN(4) {
			case 0:
				r.Cost = float64(1 + rng.IntN(3))
			case 1:
				r.Reserve = r.Limit.Name() != "fw" || rng.IntN(2) == 0
			}
			if rng.IntN(5) == 0 {
				if got, want := a.Allow(bg, r.Limit, r.Key), b.Allow(bg, r.Limit, r.Key); got != want {
					t.Fatalf("clock %v, step %d: Allow(%s, %s) = %v, want %v", withClock, i, r.Limit.Name(), r.Key, got, want)
				}
			} else {
				got, gerr := a.Take(bg, r)
				want, werr := b.Take(bg, r)
				if (gerr == nil) != (werr == nil) || !sameDecision(got, want, withClock) {
					t.Fatalf("clock %v, step %d: Take(%+v) = %+v, %v; want %+v, %v", withClock, i, r, got, gerr, want, werr)
				}
			}
			clk.Advance(time.Duration(rng.IntN(300)) * time.Millisecond)
		}
	}
}

// sameDecision compares decisions; RetryAt only when the Limiter reads the
// test's clock (otherwise both are the system clock's, read at different
// moments).
func sameDecision(a, b sluice.Decision, exactAt bool) bool {
	if exactAt && !a.RetryAt.Equal(b.RetryAt) {
		return false
	}
	if a.RetryAt.IsZero() != b.RetryAt.IsZero() {
		return false
	}
	a.RetryAt, b.RetryAt = time.Time{}, time.Time{}
	return a == b
}

// A TakeAll of one request (a call of one descriptor or one rule, the
// servers' usual) answers what Take answers: the same random sequence of
// operations, costs, reservations and clock steps on two stores, one asked
// through TakeAll and one through Take, every algorithm, refunds, peeks
// and refusals included.
func TestTakeAllOfOneAnswersAsTake(t *testing.T) {
	limits := []*sluice.Limit{
		sluice.MustLimit(sluice.Spec{Name: "tb", Rate: 10, Period: time.Second, Capacity: 5, MaxReserved: 3}),
		sluice.MustLimit(sluice.Spec{Name: "leaky", Algorithm: sluice.LeakyBucket, Rate: 5, Period: time.Second}),
		sluice.MustLimit(sluice.Spec{Name: "fw", Algorithm: sluice.FixedWindow, Rate: 4, Period: time.Second}),
		sluice.MustLimit(sluice.Spec{Name: "log", Algorithm: sluice.SlidingLog, Rate: 3, Period: time.Second}),
	}
	ops := []engine.Op{engine.OpTake, engine.OpTake, engine.OpTake, engine.OpPeek, engine.OpRefund}
	clk := sluice.NewManualClock(time.Unix(1_700_000_000, 0))
	all, one := memory.New(memory.Options{Clock: clk, MaxKeys: 6}), memory.New(memory.Options{Clock: clk, MaxKeys: 6})
	rng := rand.New(rand.NewPCG(3, 4))
	bg := context.Background()
	for step := range 4000 {
		r := sluice.Request{Limit: limits[rng.IntN(len(limits))], Key: "k" + string(rune('a'+rng.IntN(9))), Cost: float64(rng.IntN(4)), Reserve: rng.IntN(4) == 0}
		if rng.IntN(50) == 0 {
			r.Cost = 1e9 // never fits: an error from both
		}
		op := ops[rng.IntN(len(ops))]
		ds, errAll := conformance.TakeAll(bg, all, op, []sluice.Request{r}, nil)
		d, errOne := conformance.Take(bg, one, op, r)
		if (errAll == nil) != (errOne == nil) {
			t.Fatalf("step %d (%v %+v): TakeAll error %v, Take error %v", step, op, r, errAll, errOne)
		}
		if errAll == nil && (len(ds) != 1 || ds[0] != d) {
			t.Fatalf("step %d (%v %+v): TakeAll %+v, Take %+v", step, op, r, ds, d)
		}
		clk.Advance(time.Duration(rng.IntN(300)) * time.Millisecond)
	}
}

// AppendAll answers what TakeAll and PeekAll answer, in the caller's
// memory: the same random sequence of one to three requests on two
// stores, one asked each way, and the decisions are in dst's backing
// array whenever it has room, directly and through the metrics'
// instrumentation (which passes dst on to the store's TakeAll).
func TestAppendAllAnswersAsTakeAll(t *testing.T) {
	limits := []*sluice.Limit{
		sluice.MustLimit(sluice.Spec{Name: "tb", Rate: 10, Period: time.Second, Capacity: 5}),
		sluice.MustLimit(sluice.Spec{Name: "fw", Algorithm: sluice.FixedWindow, Rate: 4, Period: time.Second}),
		sluice.MustLimit(sluice.Spec{Name: "sl", Algorithm: sluice.SlidingLog, Rate: 3, Period: time.Second}),
	}
	bg := context.Background()
	for _, wrap := range []bool{false, true} {
		clk := sluice.NewManualClock(time.Unix(1_700_000_000, 0))
		var into sluice.Store = memory.New(memory.Options{Clock: clk})
		if wrap {
			into = metrics.New(prometheus.NewRegistry()).InstrumentStore(into)
		}
		a := sluice.NewWithOptions(into, sluice.Options{Clock: clk})
		b := sluice.NewWithOptions(memory.New(memory.Options{Clock: clk}), sluice.Options{Clock: clk})
		dst := make([]sluice.Decision, 0, 3)
		rng := rand.New(rand.NewPCG(3, 5))
		for i := range 3000 {
			rs := make([]sluice.Request, 1+rng.IntN(3))
			for k := range rs {
				rs[k] = sluice.Request{Limit: limits[rng.IntN(len(limits))], Key: "k" + string(rune('0'+rng.IntN(3))), Cost: float64(1 + rng.IntN(2))}
			}
			peek := rng.IntN(4) == 0
			var want sluice.Decision
			var gds, wds []sluice.Decision
			var gerr, werr error
			cs, err := conformance.ChargeAll(engine.OpTake, rs)
			if err != nil {
				t.Fatal(err)
			}
			if peek {
				gds, gerr = a.AppendAll(bg, engine.OpPeek, dst, cs...)
				want, wds, werr = b.PeekAll(bg, rs...)
			} else {
				gds, gerr = a.AppendAll(bg, engine.OpTake, dst, cs...)
				want, wds, werr = b.TakeAll(bg, rs...)
			}
			var got sluice.Decision
			if gerr == nil {
				got = sluice.Combine(gds)
			}
			if (gerr == nil) != (werr == nil) || got != want || len(gds) != len(wds) {
				t.Fatalf("wrapped %v, step %d: %+v = %+v, %v; want %+v, %v", wrap, i, rs, got, gerr, want, werr)
			}
			for k := range gds {
				if gds[k] != wds[k] {
					t.Fatalf("wrapped %v, step %d: decision %d = %+v, want %+v", wrap, i, k, gds[k], wds[k])
				}
			}
			if &gds[:1][0] != &dst[:1][0] {
				t.Fatalf("wrapped %v, step %d: the decisions are not in dst's memory", wrap, i)
			}
			clk.Advance(time.Duration(rng.IntN(300)) * time.Millisecond)
		}
		// A key that exists: the steady state of a server's calls.
		cs, err := conformance.ChargeAll(engine.OpTake, []sluice.Request{{Limit: limits[0], Key: "k0"}})
		if err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(100, func() { a.AppendAll(bg, engine.OpTake, dst, cs...) }); n != 0 {
			t.Errorf("wrapped %v: AppendAll allocates %.0f times a call, want 0", wrap, n)
		}
	}
}

// The memory store's TakeAll appends to dst: what dst held before stays.
func TestTakeAllKeepsWhatDstHeld(t *testing.T) {
	s := memory.New(memory.Options{})
	lim := sluice.MustLimit(sluice.Spec{Name: "tb", Rate: 10, Period: time.Second, Capacity: 5})
	first := sluice.Decision{Rule: "earlier", Capacity: 7}
	for _, n := range []int{1, 2} {
		rs := []sluice.Request{{Limit: lim, Key: "a", Cost: 1}, {Limit: lim, Key: "b", Cost: 1}}[:n]
		ds, err := conformance.TakeAll(context.Background(), s, engine.OpTake, rs, []sluice.Decision{first})
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) != 1+n || ds[0] != first || ds[1].Rule != "tb" || !ds[1].Allowed {
			t.Errorf("%d requests: %+v, want %+v then %d of tb", n, ds, first, n)
		}
	}
}
