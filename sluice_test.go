package sluice_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
)

// mapStore evaluates the algorithms with nothing around them: a map under
// one mutex. Running the vectors through it checks the pure arithmetic
// itself, apart from any engine's storage.
type mapStore struct {
	mu    sync.Mutex
	clock sluice.Clock
	m     map[string]*engine.State
	// dens are the rate denominators the buckets of m were written under,
	// and caps the capacities of its fixed windows, for the conversion a
	// reloaded limit's state needs.
	dens, caps map[string]int64
}

func (s *mapStore) Take(_ context.Context, op engine.Op, r sluice.Charged) (sluice.Decision, error) {
	ds, err := s.TakeAll(context.Background(), op, []sluice.Charged{r}, nil)
	if err != nil {
		return sluice.Decision{}, err
	}
	return ds[0], nil
}

func (s *mapStore) Supports(*sluice.Limit) error { return nil }

func (s *mapStore) TakeAll(_ context.Context, op engine.Op, rs []sluice.Charged, _ []sluice.Decision) ([]sluice.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now().UnixMicro()
	scratch := map[string]*engine.State{}
	out := make([]engine.Outcome, len(rs))
	all := true
	for i, r := range rs {
		ch := r.Charge
		k := r.Limit.StorageKey(r.Key)
		st, present := scratch[k]
		if !present {
			st = &engine.State{}
			if old, had := s.m[k]; had {
				*st = *old
				st.Log = append([]engine.LogEntry(nil), old.Log...)
				present = true
				if p := r.Limit.Params(); p.RateDen > 0 {
					st.Tokens = engine.ConvertBucket(p, st.Tokens, s.dens[k])
				} else if p.Algorithm == engine.FixedWindow {
					st.Tokens = engine.ConvertWindow(p, st.Tokens, s.caps[k])
				}
			}
		}
		var written bool
		if op == engine.OpRefund {
			out[i], written = engine.Refund(r.Limit.Params(), st, present, r.Key, now, ch)
		} else {
			out[i], written = engine.Evaluate(r.Limit.Params(), st, present, r.Key, now, ch, true)
		}
		if present || written {
			scratch[k] = st
		}
		all = all && out[i].Allowed
	}
	ds := make([]sluice.Decision, len(rs))
	for i, r := range rs {
		if !all {
			out[i].Allowed = false
		}
		ds[i] = r.Limit.Decide(out[i])
	}
	if all && op != engine.OpPeek {
		for k, st := range scratch {
			s.m[k] = st
		}
		for _, r := range rs {
			k := r.Limit.StorageKey(r.Key)
			s.dens[k], s.caps[k] = r.Limit.Params().RateDen, r.Limit.Params().Capacity
		}
	}
	return ds, nil
}

func (s *mapStore) Reset(_ context.Context, l *sluice.Limit, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, l.StorageKey(key))
	return nil
}

func (s *mapStore) Lease(_ context.Context, op engine.Op, r sluice.Request, id engine.LeaseID) (sluice.Decision, error) {
	if err := r.CheckLease(); err != nil {
		return sluice.Decision{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := r.Limit.StorageKey(r.Key)
	var set []engine.LeaseEntry
	if st, ok := s.m[k]; ok {
		set = st.Leases
	}
	set, o, write := engine.StepLease(r.Limit.Params(), set, s.clock.Now().UnixMicro(), op, id)
	if write {
		s.m[k] = &engine.State{Leases: set}
	}
	return r.Limit.Decide(o), nil
}

func newMapStore(t *testing.T, clock sluice.Clock) sluice.Store {
	return &mapStore{clock: clock, m: map[string]*engine.State{}, dens: map[string]int64{}, caps: map[string]int64{}}
}

func TestVectorsPureArithmetic(t *testing.T) { conformance.Run(t, newMapStore) }

func TestInvariantsPureArithmetic(t *testing.T) {
	conformance.RunInvariants(t, newMapStore, conformance.InvariantOptions{Goroutines: []int{1, 4}})
}

// The worked example of the token bucket, asserted directly: r = 10/s,
// b = 50, a request every 1/60 s from t = 0.
func TestWorkedExample(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(0))
	lim := sluice.New(newMapStore(t, clock))
	l := sluice.MustLimit(sluice.Spec{Name: "example", TokensPerSecond: 10, Burst: 50})
	take := func(tUs int64) sluice.Decision {
		clock.Set(time.UnixMicro(tUs))
		d, err := lim.Take(context.Background(), sluice.Request{Limit: l, Key: "c"})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for k := int64(0); k < 59; k++ {
		if d := take(k * 1e6 / 60); !d.Allowed {
			t.Fatalf("request %d rejected", k+1)
		}
	}
	d := take(59 * 1_000_000 / 60)
	if d.Allowed || d.RetryAfter != 16667*time.Microsecond {
		t.Fatalf("request 60: %+v, want rejected with 16.667ms to wait", d)
	}
	if d := take(1e6); !d.Allowed || d.Tokens != 0 {
		t.Fatalf("request 61 at t=1s: %+v, want allowed finding exactly one token", d)
	}
	allowed := 0
	for k := int64(1); k <= 60; k++ {
		if take(1e6 + k*1e6/60).Allowed {
			allowed++
		}
	}
	if allowed != 10 {
		t.Fatalf("%d of 60 allowed in the next second, want 1 in 6", allowed)
	}
	clock.Set(time.UnixMicro(7e6))
	if d, _ := lim.Peek(context.Background(), sluice.Request{Limit: l, Key: "c", Cost: 50}); !d.Allowed {
		t.Fatalf("after 5 s idle the bucket is not full: %+v", d)
	}
}

func TestBadCosts(t *testing.T) {
	l := sluice.MustLimit(sluice.Spec{Name: "c", TokensPerSecond: 10, Burst: 5})
	for _, c := range []float64{-1, math.NaN(), math.Inf(-1), 1e-9, -0.5} {
		if _, err := (sluice.Request{Limit: l, Cost: c}).Charged(engine.OpTake); !errors.Is(err, sluice.ErrInvalidCost) {
			t.Errorf("cost %v: got %v, want ErrInvalidCost", c, err)
		}
	}
	if _, err := (sluice.Request{Limit: l, Cost: 5.000001}).Charged(engine.OpTake); !errors.Is(err, sluice.ErrCostExceedsLimit) {
		t.Errorf("cost above burst: got %v", err)
	}
	if ch, err := (sluice.Request{Limit: l, Cost: 0.5}).Charged(engine.OpTake); err != nil || ch.Cost != 500000 {
		t.Errorf("cost 0.5: %+v %v", ch, err)
	}
	sl := sluice.MustLimit(sluice.Spec{Name: "sl", Algorithm: sluice.SlidingLog, Rate: 5})
	if _, err := (sluice.Request{Limit: sl, Reserve: true}).Charged(engine.OpTake); !errors.Is(err, sluice.ErrReserveUnsupported) {
		t.Errorf("reserve on a sliding log: %v", err)
	}
	if _, err := (sluice.Request{Limit: l, Reserve: true, MaxReserved: math.NaN()}).Charged(engine.OpTake); err == nil {
		t.Error("NaN max_reserved accepted")
	}
	if sluice.IsInputError(errors.New("connection refused")) || !sluice.IsInputError(sluice.ErrCostExceedsLimit) {
		t.Error("IsInputError misclassifies")
	}
}

func TestSpecValidation(t *testing.T) {
	bad := []sluice.Spec{
		{},
		{Name: "no-rate"},
		{Name: "both", TokensPerSecond: 1, Rate: 1},
		{Name: "neg", TokensPerSecond: -1},
		{Name: "nan", TokensPerSecond: math.NaN()},
		{Name: "inf-burst", TokensPerSecond: 1, Burst: math.Inf(1)},
		{Name: "tps-period", TokensPerSecond: 1, Period: time.Minute},
		{Name: "sub-us", Rate: 1, Period: time.Nanosecond * 1500},
		{Name: "tiny", Rate: 1e-9},
		{Name: "huge", TokensPerSecond: 1, Burst: 1e300},
		{Name: "sl-max-reserved", Algorithm: sluice.SlidingLog, Rate: 1, MaxReserved: 1},
		{Name: "sl-reserve", Algorithm: sluice.SlidingLog, Rate: 1, Reserve: true},
		{Name: "zero-without-reserve", Rate: 1, Capacity: sluice.ZeroCapacity},
		{Name: "fw-zero-without-reserve", Algorithm: sluice.FixedWindow, Rate: 1, Capacity: sluice.ZeroCapacity},
		{Name: "sl-zero", Algorithm: sluice.SlidingLog, Rate: 1, Capacity: sluice.ZeroCapacity, Reserve: true},
		{Name: "zero-and-burst", TokensPerSecond: 1, Burst: 2, Capacity: sluice.ZeroCapacity, Reserve: true},
		{Name: "nan-capacity", Rate: 1, Capacity: math.NaN(), Reserve: true},
		{Name: "disagree", Rate: 1, Burst: 2, Capacity: 3},
		{Name: "alg", Algorithm: 9, Rate: 1},
	}
	for _, s := range bad {
		if _, err := sluice.NewLimit(s); !errors.Is(err, sluice.ErrInvalidLimit) {
			t.Errorf("%+v: got %v, want ErrInvalidLimit", s, err)
		}
	}
}

// Rates from one a day to a billion a second are held exactly.
func TestRatePrecision(t *testing.T) {
	cases := []struct {
		spec     sluice.Spec
		num, den int64
	}{
		{sluice.Spec{Name: "a", TokensPerSecond: 10, Burst: 50}, 10, 1},
		{sluice.Spec{Name: "b", Rate: 1, Period: 24 * time.Hour}, 1, 86400},
		{sluice.Spec{Name: "c", TokensPerSecond: 1e9, Burst: 1e9}, 1_000_000_000, 1},
		{sluice.Spec{Name: "d", TokensPerSecond: 0.5, Burst: 1}, 1, 2},
		{sluice.Spec{Name: "e", Rate: 7, Period: 3 * time.Second, Capacity: 2}, 7, 3},
		{sluice.Spec{Name: "f", TokensPerSecond: 1.0 / 3, Burst: 1}, 1, 3},
		{sluice.Spec{Name: "g", Rate: 100, Period: time.Minute}, 5, 3},
	}
	for _, c := range cases {
		p := sluice.MustLimit(c.spec).Params()
		if p.RateNum != c.num || p.RateDen != c.den {
			t.Errorf("%s: rate %d/%d micro-tokens per µs, want %d/%d", c.spec.Name, p.RateNum, p.RateDen, c.num, c.den)
		}
	}
}

func TestCombine(t *testing.T) {
	ds := []sluice.Decision{
		{Allowed: true, Remaining: 5, Rule: "a"},
		{Allowed: true, Remaining: 2, Rule: "b", RetryAfter: time.Second},
		{Allowed: true, Remaining: 9, Rule: "c", RetryAfter: 3 * time.Second},
	}
	if c := sluice.Combine(ds); !c.Allowed || c.Rule != "b" || c.RetryAfter != 3*time.Second {
		t.Errorf("all allowed: %+v", c)
	}
	ds[0].Allowed, ds[0].RetryAfter = false, time.Second
	ds[2].Allowed, ds[2].RetryAfter = false, 2*time.Second
	if c := sluice.Combine(ds); c.Allowed || c.Rule != "c" {
		t.Errorf("two rejected: %+v", c)
	}
}

// Combine answers for one decision what its loops answer: that decision
// twice over combines to the same as it alone, whatever its fields (a
// negative wait and a zero RetryAt among them).
func TestCombineOneAsTheLoops(t *testing.T) {
	at := time.Unix(1700000000, 0)
	for _, allowed := range []bool{true, false} {
		for _, wait := range []time.Duration{-time.Second, 0, time.Millisecond} {
			for _, retryAt := range []time.Time{{}, at, time.Unix(-62135596900, 0)} {
				d := sluice.Decision{Allowed: allowed, Capacity: 10, Remaining: 3, RetryAfter: wait, RetryAt: retryAt, ResetAfter: time.Second, Rule: "r", Tokens: 3.5}
				one, two := sluice.Combine([]sluice.Decision{d}), sluice.Combine([]sluice.Decision{d, d})
				if one != two {
					t.Errorf("%+v: one %+v, twice %+v", d, one, two)
				}
			}
		}
	}
}

func TestWindowOffsetSpreads(t *testing.T) {
	seen := map[int64]bool{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		off := engine.WindowOffset(k, 60e6)
		if off < 0 || off >= 60e6 {
			t.Fatalf("offset %d outside the period", off)
		}
		seen[off] = true
	}
	if len(seen) < 7 {
		t.Fatalf("offsets do not spread: %v", seen)
	}
}

func TestFixedWindowRefillRange(t *testing.T) {
	_, err := sluice.NewLimit(sluice.Spec{Name: "slow-fw", Algorithm: sluice.FixedWindow, Rate: 1e-6, Capacity: 1e9, Period: 24 * time.Hour})
	if !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Fatalf("a window refill beyond the time range was accepted: %v", err)
	}
}

// A refund gives back at most what one request can be charged, the
// capacity plus max_reserved: a larger one, however large, is a refund of
// that, never an error. A take of the same cost is refused as one that can
// never succeed.
func TestChargeRefundClampsToMostCharge(t *testing.T) {
	l := sluice.MustLimit(sluice.Spec{Name: "c", TokensPerSecond: 10, Burst: 5, MaxReserved: 2})
	for _, c := range []float64{7.000001, 8, 1e12, 1e300, math.Inf(1)} {
		ch, err := (sluice.Request{Limit: l, Cost: c}).Charged(engine.OpRefund)
		if err != nil || ch.Cost != 7*engine.TokenScale {
			t.Errorf("refund of %v: %+v, %v; want the capacity plus max_reserved, 7 tokens", c, ch, err)
		}
		if _, err := (sluice.Request{Limit: l, Cost: c, Reserve: true}).Charged(engine.OpTake); !errors.Is(err, sluice.ErrCostExceedsLimit) {
			t.Errorf("reserved take of %v: %v, want ErrCostExceedsLimit", c, err)
		}
	}
	for _, c := range []float64{5.000001, 7} {
		if _, err := (sluice.Request{Limit: l, Cost: c}).Charged(engine.OpTake); !errors.Is(err, sluice.ErrCostExceedsLimit) {
			t.Errorf("take of %v without reserving: %v, want ErrCostExceedsLimit", c, err)
		}
		if ch, err := (sluice.Request{Limit: l, Cost: c, Reserve: true}).Charged(engine.OpTake); err != nil || !ch.Reserve {
			t.Errorf("reserved take of %v: %+v, %v; want a reservation", c, ch, err)
		}
	}
	sl := sluice.MustLimit(sluice.Spec{Name: "sl", Algorithm: sluice.SlidingLog, Rate: 5})
	if ch, err := (sluice.Request{Limit: sl, Cost: 1e12}).Charged(engine.OpRefund); err != nil || ch.Cost != 5*engine.TokenScale {
		t.Errorf("sliding log refund of 1e12: %+v, %v; want the capacity, 5 tokens", ch, err)
	}
	for _, c := range []float64{-1, math.NaN(), math.Inf(-1), 1e-9} {
		if _, err := (sluice.Request{Limit: l, Cost: c}).Charged(engine.OpRefund); !errors.Is(err, sluice.ErrInvalidCost) {
			t.Errorf("refund of %v: %v, want ErrInvalidCost", c, err)
		}
	}
	if ch, err := (sluice.Request{Limit: l}).Charged(engine.OpRefund); err != nil || ch.Cost != engine.TokenScale {
		t.Errorf("refund of cost 0 (one token): %+v, %v", ch, err)
	}
}

// NoReserve refuses the reservation a limit would make for every request:
// a leaky bucket becomes a bucket of one, a bucket of nothing passes
// nothing.
func TestChargeNoReserve(t *testing.T) {
	lb := sluice.MustLimit(sluice.Spec{Name: "lb", Algorithm: sluice.LeakyBucket, TokensPerSecond: 10})
	if ch, err := (sluice.Request{Limit: lb, NoReserve: true}).Charged(engine.OpTake); err != nil || ch.Reserve {
		t.Errorf("leaky bucket with NoReserve: %+v, %v", ch, err)
	}
	if ch, err := (sluice.Request{Limit: lb}).Charged(engine.OpTake); err != nil || !ch.Reserve {
		t.Errorf("leaky bucket: %+v, %v; want a reservation", ch, err)
	}
	zero := sluice.MustLimit(sluice.Spec{Name: "zero", TokensPerSecond: 10, Capacity: sluice.ZeroCapacity, Reserve: true})
	if _, err := (sluice.Request{Limit: zero, NoReserve: true}).Charged(engine.OpTake); !errors.Is(err, sluice.ErrCostExceedsLimit) {
		t.Errorf("capacity 0 with NoReserve: %v, want ErrCostExceedsLimit", err)
	}
}

// MaxDebt is the range every store counts exactly: below 2^52 scaled
// units, and a max_reserved beyond it counts as it.
func TestMaxDebtRange(t *testing.T) {
	for _, s := range []sluice.Spec{
		{Name: "tb", TokensPerSecond: 10, Burst: 10},
		{Name: "tb-den", Rate: 10, Period: time.Minute},
		{Name: "fw", Algorithm: sluice.FixedWindow, Rate: 10, Period: time.Minute},
		{Name: "fw-slow", Algorithm: sluice.FixedWindow, Rate: 1, Period: (1 << 50) * time.Microsecond},
	} {
		p := sluice.MustLimit(s).Params()
		d := engine.MaxDebt(p)
		if p.MaxReserved != d || d <= 0 {
			t.Errorf("%s: max_reserved %d, MaxDebt %d", s.Name, p.MaxReserved, d)
		}
		switch s.Algorithm {
		case sluice.FixedWindow:
			windows := (p.Capacity+d+p.WindowRate-1)/p.WindowRate + 1
			if p.Capacity+d >= 1<<52 || float64(windows)*float64(p.Period) >= 1<<52 {
				t.Errorf("%s: debt %d leaves the exact range", s.Name, d)
			}
		default:
			if float64(p.Capacity+d)*float64(p.RateDen) >= 1<<52 || (p.Capacity+d+1)*p.RateDen < 1<<52 {
				t.Errorf("%s: debt %d is not the whole exact range at den %d", s.Name, d, p.RateDen)
			}
		}
		if s.MaxReserved = 9e9; sluice.MustLimit(s).Params().MaxReserved != d { // beyond the range
			t.Errorf("%s: a max_reserved beyond the range is not clamped to it", s.Name)
		}
	}
}

// A Limiter refuses the empty key, as the decision API does: it would be
// one bucket for every caller that leaves its key out. The refusal is
// the caller's fault (IsInputError) and reaches no store.
func TestEmptyKeyRefused(t *testing.T) {
	ctx := context.Background()
	clock := sluice.NewManualClock(time.Unix(1_700_000_000, 0))
	lim := sluice.NewWithOptions(newMapStore(t, clock), sluice.Options{Clock: clock})
	tb := sluice.MustLimit(sluice.Spec{Name: "tb", TokensPerSecond: 1, Burst: 1})
	conc := sluice.MustLimit(sluice.Spec{Name: "conc", Algorithm: sluice.Concurrency, MaxInFlight: 1, LeaseTerm: time.Minute})
	r := sluice.Request{Limit: tb}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, sluice.ErrNoKey) || !sluice.IsInputError(err) {
			t.Errorf("%s with no key: %v, want ErrNoKey, an input error", what, err)
		}
	}
	_, err := lim.Take(ctx, r)
	check("Take", err)
	_, err = lim.TakeOrError(ctx, r)
	check("TakeOrError", err)
	_, err = lim.Peek(ctx, r)
	check("Peek", err)
	_, _, err = lim.TakeAll(ctx, sluice.Request{Limit: tb, Key: "k"}, r)
	check("TakeAll", err)
	_, err = lim.Refund(ctx, r)
	check("Refund", err)
	check("Reset", lim.Reset(ctx, tb, ""))
	check("Wait", lim.Wait(ctx, r))
	_, err = lim.Settle(ctx, r, 1, 0)
	check("Settle", err)
	_, _, err = lim.Acquire(ctx, sluice.Request{Limit: conc})
	check("Acquire", err)
	if lim.Allow(ctx, tb, "") {
		t.Error("Allow with no key admitted")
	}
	// Nothing was charged: the named key still has its one token, which
	// TakeAll's refusal did not take either.
	if d, err := lim.Take(ctx, sluice.Request{Limit: tb, Key: "k"}); err != nil || !d.Allowed {
		t.Errorf("a keyed take after the refusals: %+v %v", d, err)
	}
}
