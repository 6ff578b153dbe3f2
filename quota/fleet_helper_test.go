package quota_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/quota"
)

// counting wraps a store and counts the takes and refunds that reach it,
// and the most takes of one limit in flight at once.
type counting struct {
	sluice.Store
	takes, refunds   atomic.Int64
	inFlight, most   atomic.Int64
	refundedMicro    atomic.Int64
	slowTake         chan struct{} // when set, every take waits for it
	onTakeStartedOne sync.Once
	started          chan struct{}
}

func (c *counting) Take(ctx context.Context, op engine.Op, r sluice.Charged) (sluice.Decision, error) {
	switch op {
	case engine.OpTake:
		c.takes.Add(1)
		n := c.inFlight.Add(1)
		defer c.inFlight.Add(-1)
		for {
			m := c.most.Load()
			if n <= m || c.most.CompareAndSwap(m, n) {
				break
			}
		}
		if c.slowTake != nil {
			c.onTakeStartedOne.Do(func() { close(c.started) })
			<-c.slowTake
		}
	case engine.OpRefund:
		c.refunds.Add(1)
		c.refundedMicro.Add(r.Cost) // micro-tokens, as charged
	}
	return c.Store.Take(ctx, op, r)
}

// fleet is N processes, each a quota.Store over its own client of one
// shared store, hammering one key of lim in steps of a ManualClock: in
// each step every process makes perStep requests from several
// goroutines at once, at one instant of the clock, and the clock moves
// on only when all are answered, so that every admission has one time.
type fleet struct {
	t      *testing.T
	clock  *sluice.ManualClock
	lim    *sluice.Limit
	set    quota.Settings
	procs  []*quota.Store
	inners []*counting
	// admitted[i] is the tokens admitted in step i, over the fleet.
	admitted []float64
	stamps   []time.Time
	// faults: store errors are counted as not admitted, not failures.
	faults bool
	errors atomic.Int64
}

func newFleet(t *testing.T, clock *sluice.ManualClock, lim *sluice.Limit, set quota.Settings, n int, open func() sluice.Store) *fleet {
	f := &fleet{t: t, clock: clock, lim: lim, set: set}
	for range n {
		c := &counting{Store: open()}
		q := quota.New(c, quota.Options{Clock: clock})
		if err := q.Configure(map[*sluice.Limit]quota.Settings{lim: set}); err != nil {
			t.Fatal(err)
		}
		f.procs = append(f.procs, q)
		f.inners = append(f.inners, c)
	}
	return f
}

// step makes perProc requests of cost at each live process, from two
// goroutines per process, and records what the fleet admitted.
func (f *fleet) step(ctx context.Context, key string, perProc int, cost float64, live []bool) {
	var total atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(f.procs))
	for i, q := range f.procs {
		if live != nil && !live[i] {
			continue
		}
		for g := range 2 {
			n := perProc / 2
			if g == 0 {
				n = perProc - n
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range n {
					d, err := conformance.Take(ctx, q, engine.OpTake, sluice.Request{Limit: f.lim, Key: key, Cost: cost})
					if err != nil && f.faults {
						f.errors.Add(1)
						continue
					}
					if err != nil {
						errs <- err
						return
					}
					if d.Allowed {
						total.Add(int64(cost * engine.TokenScale))
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		f.t.Fatal(err)
	}
	f.admitted = append(f.admitted, engine.FromMicroTokens(total.Load()))
	f.stamps = append(f.stamps, f.clock.Now())
}

// worstOver returns the most tokens admitted over any interval of
// length d (from one step's instant to the steps less than d after it),
// and where it starts.
func (f *fleet) worstOver(d time.Duration) (float64, time.Time) {
	var worst float64
	var at time.Time
	j, sum := 0, 0.0
	for i := range f.admitted {
		for j < len(f.admitted) && f.stamps[j].Sub(f.stamps[i]) < d {
			sum += f.admitted[j]
			j++
		}
		if sum > worst {
			worst, at = sum, f.stamps[i]
		}
		sum -= f.admitted[i]
	}
	return worst, at
}

// checkBound asserts the stated bound over every interval of length d:
// ExactAdmits(d) + N x max slice.
func (f *fleet) checkBound(d time.Duration, extra float64) {
	f.t.Helper()
	worst, at := f.worstOver(d)
	bound := quota.ExactAdmits(f.lim, d) + quota.Overshoot(f.lim, f.set, len(f.procs)) + extra
	if worst > bound+1e-6 {
		f.t.Errorf("the fleet admitted %v tokens over %v from %v, above the bound %v (exact %v + %d x %v + %v)",
			worst, d, at, bound, quota.ExactAdmits(f.lim, d), len(f.procs), quota.Overshoot(f.lim, f.set, 1), extra)
	}
	f.t.Logf("worst over %v: %v admitted, bound %v (exact %v)", d, worst, bound, quota.ExactAdmits(f.lim, d))
}

// storeCalls is the takes that reached the shared store.
func (f *fleet) storeCalls() int64 {
	var n int64
	for _, c := range f.inners {
		n += c.takes.Load()
	}
	return n
}

// hammer runs steps steps of dt, each with perProc requests per process
// at a random cost in [1, maxCost], and asserts the bound over windows.
func (f *fleet) hammer(ctx context.Context, key string, steps int, dt time.Duration, perProc int, live func(step int) []bool) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range steps {
		var l []bool
		if live != nil {
			l = live(i)
		}
		f.step(ctx, key, perProc, float64(1+rng.IntN(2)), l)
		f.clock.Advance(dt)
	}
}

func (f *fleet) close(ctx context.Context) {
	for _, q := range f.procs {
		if err := q.Close(ctx); err != nil && !f.faults {
			f.t.Error(err)
		}
	}
}

func uniqueName(t *testing.T, base string) string {
	return fmt.Sprintf("%s-%d", base, rand.Uint32())
}

// checkWindows asserts that no window of key's fixed window admitted
// more than its capacity: each slice is used inside the window the store
// charged it to, and, the clock standing still during every call, each
// refund lands in the window it was meant for.
func (f *fleet) checkWindows(key string) {
	f.t.Helper()
	p := f.lim.Params()
	off := engine.WindowOffset(key, p.Period)
	per := map[int64]float64{}
	for i, at := range f.stamps {
		per[(at.UnixMicro()-off)/p.Period] += f.admitted[i]
	}
	capacity := f.lim.Capacity()
	for w, n := range per {
		if n > capacity+1e-6 {
			f.t.Errorf("window %d admitted %v, above its capacity %v", w, n, capacity)
		}
	}
}

// checkTotal asserts that over the whole run, which began with no slice
// held, the fleet admitted no more than the exact limit over it (plus
// extra): slices taken within an interval count against it in the store.
func (f *fleet) checkTotal(extra float64) {
	f.t.Helper()
	var total float64
	for _, a := range f.admitted {
		total += a
	}
	span := f.stamps[len(f.stamps)-1].Sub(f.stamps[0])
	if bound := quota.ExactAdmits(f.lim, span) + extra; total > bound+1e-6 {
		f.t.Errorf("the fleet admitted %v over the run of %v, above the exact limit's %v", total, span, bound)
	}
}
