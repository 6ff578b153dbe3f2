package sluice_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/memory"
)

// A cost too large to count is above the capacity, said as such: the
// caller learns that no wait will help, not that the number is malformed.
func TestHugeCostIsAboveTheCapacity(t *testing.T) {
	l := sluice.MustLimit(sluice.Spec{Name: "c", TokensPerSecond: 10, Burst: 5})
	for c, want := range map[float64]string{
		1e300:       `limit "c": cost 1e+300 is above the capacity (5): it can never succeed`,
		math.Inf(1): `limit "c": cost +Inf is above the capacity (5): it can never succeed`,
		6:           `limit "c": cost 6 is above the capacity (5): it can never succeed`,
	} {
		_, err := (sluice.Request{Limit: l, Cost: c}).Charged(engine.OpTake)
		if !errors.Is(err, sluice.ErrCostExceedsLimit) || errors.Is(err, sluice.ErrInvalidCost) || err.Error() != want {
			t.Errorf("cost %v: %v, want ErrCostExceedsLimit alone: %s", c, err, want)
		}
	}
	r := sluice.MustLimit(sluice.Spec{Name: "r", TokensPerSecond: 10, Burst: 5, Reserve: true, MaxReserved: 2})
	_, err := (sluice.Request{Limit: r, Cost: 1e300}).Charged(engine.OpTake)
	if want := `limit "r": cost 1e+300 is above the capacity (5) plus max_reserved (2): it can never succeed`; err == nil || err.Error() != want {
		t.Errorf("reservation: %v, want %s", err, want)
	}
	s := sluice.MustLimit(sluice.Spec{Name: "s", TokensPerSecond: 10, Burst: 8, Shards: 4})
	_, err = (sluice.Request{Limit: s, Cost: 1e300}).Charged(engine.OpTake)
	if want := `limit "s": cost 1e+300 is above what two of its 4 shards hold together (4: 2 x capacity 8 / 4): it can never succeed`; !errors.Is(err, sluice.ErrCostExceedsLimit) || err.Error() != want {
		t.Errorf("sharded: %v, want %s", err, want)
	}
	for c, want := range map[float64]string{
		-1:   `limit "c": cost -1 must be a number > 0`,
		1e-9: `limit "c": cost 1e-09 is below one micro-token (0.000001), the least every store counts`,
	} {
		_, err := (sluice.Request{Limit: l, Cost: c}).Charged(engine.OpTake)
		if !errors.Is(err, sluice.ErrInvalidCost) || err.Error() != want {
			t.Errorf("cost %v: %v, want %s", c, err, want)
		}
	}
	// The zero value of Request asks for one token.
	if ch, err := (sluice.Request{Limit: l}).Charged(engine.OpTake); err != nil || ch.Cost != engine.TokenScale {
		t.Errorf("cost 0: %+v %v, want one token", ch, err)
	}
}

// NewLimit names the field at fault, as the file spells it, with a reason
// about that field's range: a burst out of range is the burst's problem,
// not a cost's.
func TestSpecErrorNamesTheField(t *testing.T) {
	cases := []struct {
		spec         sluice.Spec
		field, error string
	}{
		{sluice.Spec{Name: "b", TokensPerSecond: 1, Burst: 1e12}, "burst",
			`sluice: invalid limit "b": burst must be at most 9007199254.740992 (2^53 micro-tokens, the most every store counts exactly), got 1e+12`},
		{sluice.Spec{Name: "b", TokensPerSecond: 1, Burst: 1e-9}, "burst",
			`sluice: invalid limit "b": burst must be at least 0.000001 (one micro-token, the least every store counts), got 1e-09`},
		{sluice.Spec{Name: "c", Rate: 1, Capacity: 1e12}, "capacity", ""},
		{sluice.Spec{Name: "r", Rate: 1e12}, "rate", ""},
		{sluice.Spec{Name: "t", TokensPerSecond: 1e12, Burst: 1}, "tokens_per_second", ""},
		{sluice.Spec{Name: "m", TokensPerSecond: 1, Burst: 1, MaxReserved: 1e12}, "max_reserved",
			`sluice: invalid limit "m": max_reserved must be at most 9007199254.740992 (2^53 micro-tokens, the most every store counts exactly), got 1e+12`},
		{sluice.Spec{Name: "n", TokensPerSecond: 1, Burst: -1}, "burst", `sluice: invalid limit "n": burst must be a finite number >= 0, got -1`},
	}
	for _, c := range cases {
		_, err := sluice.NewLimit(c.spec)
		var se *sluice.SpecError
		if !errors.As(err, &se) || !errors.Is(err, sluice.ErrInvalidLimit) || se.Field != c.field || se.Limit != c.spec.Name {
			t.Errorf("%+v: %#v, want a SpecError of field %s", c.spec, err, c.field)
			continue
		}
		if c.error != "" && err.Error() != c.error {
			t.Errorf("%+v:\n got %s\nwant %s", c.spec, err, c.error)
		}
	}
}

// A burst below the rate is a legal token bucket: it caps how many pass at
// once, and requests spread over the second still reach the rate. One rule
// (NewLimit's) decides it for code and configuration files alike.
func TestBurstBelowRate(t *testing.T) {
	l, err := sluice.NewLimit(sluice.Spec{Name: "smooth", TokensPerSecond: 100, Burst: 10})
	if err != nil {
		t.Fatal(err)
	}
	clk := sluice.NewManualClock(time.Unix(1_700_000_000, 0))
	lim := sluice.NewWithOptions(memory.New(memory.Options{Clock: clk}), sluice.Options{Clock: clk})
	r := sluice.Request{Limit: l, Key: "k"}
	admitted := 0
	for range 20 {
		if d, err := lim.Take(context.Background(), r); err != nil {
			t.Fatal(err)
		} else if d.Allowed {
			admitted++
		}
	}
	if admitted != 10 {
		t.Fatalf("%d admitted at once, want the burst of 10", admitted)
	}
	// One request every 10 ms is the rate, and each passes.
	for i := range 100 {
		clk.Advance(10 * time.Millisecond)
		if d, err := lim.Take(context.Background(), r); err != nil || !d.Allowed {
			t.Fatalf("request %d at the rate: %+v %v", i, d, err)
		}
	}
}
