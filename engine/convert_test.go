package engine_test

import (
	"testing"

	"github.com/sluicehq/sluice/engine"
)

// ConvertWindow keeps a window's used count across a change of capacity:
// a raise admits the difference, a lowering never more than the new
// capacity, a debt stays, and state of no known capacity is taken as it is.
func TestConvertWindow(t *testing.T) {
	const tok = engine.TokenScale
	fw := func(capacity int64) *engine.Params {
		return &engine.Params{Algorithm: engine.FixedWindow, Capacity: capacity * tok, WindowRate: capacity * tok, Period: 60_000_000, Offset: 0}
	}
	for _, c := range []struct {
		name             string
		from, to, tokens int64 // capacities and tokens, in tokens
		want             int64
	}{
		{"raise used up", 3, 5, 0, 2},
		{"raise partly used", 3, 5, 1, 3},
		{"raise unused", 3, 5, 3, 5},
		{"lower below used", 5, 2, 2, 0},
		{"lower to used", 5, 3, 2, 0},
		{"lower above used", 5, 4, 2, 1},
		{"unchanged", 5, 5, 2, 2},
		{"debt kept on a raise", 3, 5, -2, -2},
		{"debt kept on a lowering", 5, 2, -4, -4},
		{"unknown capacity", 0, 5, 4, 4},
		{"unknown capacity, lowered", 0, 2, 4, 2},
	} {
		got := engine.ConvertWindow(fw(c.to), c.tokens*tok, c.from*tok)
		if got != c.want*tok {
			t.Errorf("%s: %d of %d with %d left: %v left, want %d", c.name, c.from, c.to, c.tokens, float64(got)/tok, c.want)
		}
	}
	// A debt beyond what the new limit counts exactly is kept up to MaxDebt.
	p := &engine.Params{Algorithm: engine.FixedWindow, Capacity: tok, WindowRate: tok, Period: 1 << 50}
	if got, want := engine.ConvertWindow(p, -1<<40, 1000*tok), -engine.MaxDebt(p); got != want {
		t.Errorf("debt beyond range: %d, want %d", got, want)
	}
}
