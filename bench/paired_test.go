package bench

import (
	"math"
	"testing"
)

// The interval's ranks are the binomial table's (the sign test's
// confidence interval for a median at 95%).
func TestRankBound(t *testing.T) {
	for _, c := range []struct{ n, j int }{
		{5, 0}, {6, 1}, {8, 1}, {9, 2}, {10, 2}, {20, 6}, {30, 10}, {40, 14}, {100, 40},
	} {
		if got := rankBound(c.n); got != c.j {
			t.Errorf("rankBound(%d) = %d, want %d", c.n, got, c.j)
		}
	}
}

func TestMedianInterval(t *testing.T) {
	// 20 values, shuffled: median of 10 and 11 is 10.5; ranks 6 and 15.
	xs := []float64{20, 3, 17, 1, 9, 14, 6, 11, 19, 2, 8, 16, 5, 13, 18, 4, 10, 15, 7, 12}
	orig := append([]float64(nil), xs...)
	got := MedianInterval(xs)
	if want := (Interval{6, 10.5, 15}); got != want {
		t.Errorf("MedianInterval = %+v, want %+v", got, want)
	}
	for i := range xs {
		if xs[i] != orig[i] {
			t.Fatal("MedianInterval sorted its argument")
		}
	}
	if got := MedianInterval([]float64{3, 1, 2}); got != (Interval{1, 2, 3}) {
		t.Errorf("three values: %+v, want the whole range", got)
	}
	if got := MedianInterval(nil); !math.IsNaN(got.Median) {
		t.Errorf("no values: %+v, want NaN", got)
	}
}

// Summarize pairs each round's sides: a floor that drifts from round to
// round by far more than sluice's extra still gives that extra exactly.
func TestSummarizePairsRounds(t *testing.T) {
	var pairs []Pair
	for i := range 12 {
		floor := 20 + float64(i%4)*3 // µs per call, drifting by 9
		calls := int64(1000)
		pairs = append(pairs, Pair{
			Floor:  Side{Calls: calls, Wall: 1, CPU: floor * 1e-6 * float64(calls)},
			Sluice: Side{Calls: calls * 9 / 10, Wall: 1, CPU: (floor + 2) * 1e-6 * float64(calls*9/10)},
		})
	}
	s := Summarize(pairs)
	if math.Abs(s.Extra.Lo-2) > 1e-9 || math.Abs(s.Extra.Hi-2) > 1e-9 {
		t.Errorf("extra %+v, want 2 µs exactly", s.Extra)
	}
	if math.Abs(s.RateRatio.Median-0.9) > 1e-9 {
		t.Errorf("rate ratio %+v, want 0.9", s.RateRatio)
	}
	if r := s.CPURatio; r.Lo < 20.0/22-1e-9 || r.Hi > 29.0/31+1e-9 || r.Lo > r.Median || r.Median > r.Hi {
		t.Errorf("CPU ratio %+v, want within [20/22, 29/31]", r)
	}
}
