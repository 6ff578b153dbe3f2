package sluice_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
)

// FuzzLimitAndCost feeds arbitrary numbers, NaN, infinities and extremes
// included, through NewLimit and a sequence of takes: nothing panics, bad
// input is refused with an error, and accepted input never corrupts state
// (remaining stays within the capacity, waits are never negative, a debt
// never passes max_reserved).
func FuzzLimitAndCost(f *testing.F) {
	f.Add(uint8(0), 10.0, 50.0, int64(1e6), 1.0, 0.5, int64(16667), false, 0.0)
	f.Add(uint8(0), 1e9, 1e9, int64(1e6), 1e9, 1000.0, int64(1), true, 5.0)
	f.Add(uint8(1), 100.0, 250.0, int64(60e6), 5.0, 250.0, int64(59e6), false, 0.0)
	f.Add(uint8(2), 3.0, 0.0, int64(1e6), 1.0, 2.0, int64(-5e6), false, 0.0)
	f.Add(uint8(3), 10.0, 0.0, int64(1e6), 1.0, 1.0, int64(0), true, 0.0)
	f.Add(uint8(1), 10.0, -1.0, int64(60e6), 16.0, 5.0, int64(30e6), true, 0.0)
	f.Add(uint8(0), 10.0, 10.0, int64(60e6), 16.0, 5.0, int64(6e6), true, 0.0)
	f.Add(uint8(0), math.NaN(), math.Inf(1), int64(-1), -1.0, math.NaN(), int64(math.MaxInt64), true, math.Inf(1))
	f.Add(uint8(0), 1.0/86400, 1.0, int64(1e6), 1.0, 1e-7, int64(math.MinInt64), true, 1e300)
	f.Fuzz(func(t *testing.T, alg uint8, rate, capacity float64, periodUs int64, cost1, cost2 float64, stepUs int64, reserve bool, maxReserved float64) {
		spec := sluice.Spec{Name: "fuzz", Algorithm: sluice.Algorithm(alg % 5), Rate: rate, Capacity: capacity,
			Period: time.Duration(periodUs) * time.Microsecond, MaxReserved: maxReserved, Reserve: reserve && alg%2 == 1}
		lim, err := sluice.NewLimit(spec)
		if err != nil {
			return
		}
		clock := sluice.NewManualClock(time.UnixMicro(1_000_000_000_000))
		store := &mapStore{clock: clock, m: map[string]*engine.State{}, dens: map[string]int64{}, caps: map[string]int64{}}
		for i, c := range []float64{cost1, cost2, cost1, cost2} {
			if i%2 == 1 && stepUs > -1e12 && stepUs < 1e12 {
				clock.Advance(time.Duration(stepUs) * time.Microsecond)
			}
			op := engine.OpTake
			if i == 2 {
				op = engine.OpRefund // refunds never lift a bucket above its capacity
			}
			d, err := conformance.Take(context.Background(), store, op, sluice.Request{Limit: lim, Key: "k", Cost: c, Reserve: reserve})
			if err != nil {
				if !sluice.IsInputError(err) {
					t.Fatalf("cost %v: an input problem reported as %v", c, err)
				}
				continue
			}
			if d.Remaining < 0 || d.Remaining > d.Capacity || d.RetryAfter < 0 || d.ResetAfter < 0 {
				t.Fatalf("cost %v: corrupt decision %+v", c, d)
			}
			if d.Tokens > lim.Capacity()+1e-6 || math.IsNaN(d.Tokens) {
				t.Fatalf("cost %v: tokens %v above capacity %v", c, d.Tokens, lim.Capacity())
			}
			if debt := engine.FromMicroTokens(lim.Params().MaxReserved); d.Tokens < -debt-1e-6 {
				t.Fatalf("cost %v: tokens %v, a debt beyond max_reserved %v", c, d.Tokens, debt)
			}
		}
	})
}
