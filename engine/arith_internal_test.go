package engine

import (
	"math"
	"math/rand/v2"
	"testing"
)

// divBy, ceilDivBy and floorDivBy give what the division operators give,
// for every divisor a limit can have and every dividend, at the edges
// where the reciprocal's error is largest (a near 2^63, d = 1, d a power
// of two, d just above one).
func TestDivByReciprocal(t *testing.T) {
	divisors := []int64{1, 2, 3, 6, 7, 10, 60, 1_000_000, 1_000_000_007, 1 << 31, 1<<32 + 1, 1 << 62, math.MaxInt64 - 1, math.MaxInt64}
	dividends := []int64{0, 1, 2, 5, 999_999, 1_000_000, 1 << 32, 1<<62 - 1, 1 << 62, math.MaxInt64 - 1, math.MaxInt64}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		divisors = append(divisors, 1+rng.Int64N(1<<uint(1+rng.IntN(62))))
		dividends = append(dividends, rng.Int64N(1<<uint(1+rng.IntN(62))))
	}
	for _, d := range divisors {
		inv := reciprocal(d)
		for _, a := range dividends {
			checkDivBy(t, a, d, inv)
			checkDivBy(t, a/d*d, d, inv) // exact multiples
			if a > 0 {
				checkDivBy(t, a/d*d-1, d, inv)
			}
		}
	}
}

func FuzzDivByReciprocal(f *testing.F) {
	f.Add(int64(math.MaxInt64), int64(1))
	f.Add(int64(math.MaxInt64), int64(3))
	f.Add(int64(-7), int64(2))
	f.Fuzz(func(t *testing.T, a, d int64) {
		if d <= 0 {
			return
		}
		checkDivBy(t, a, d, reciprocal(d))
	})
}

func checkDivBy(t *testing.T, a, d int64, inv uint64) {
	t.Helper()
	if got, want := floorDivBy(a, d, inv), FloorDiv(a, d); got != want {
		t.Fatalf("floorDivBy(%d, %d) = %d, want %d", a, d, got, want)
	}
	if a < 0 {
		return
	}
	if q, r := divBy(a, d, inv); q != a/d || r != a%d {
		t.Fatalf("divBy(%d, %d) = %d, %d; want %d, %d", a, d, q, r, a/d, a%d)
	}
	if got, want := ceilDivBy(a, d, inv), ceilDiv(a, d); got != want {
		t.Fatalf("ceilDivBy(%d, %d) = %d, want %d", a, d, got, want)
	}
	if got, want := ceilDivBy(a, d, 0), ceilDiv(a, d); got != want {
		t.Fatalf("ceilDivBy without a reciprocal(%d, %d) = %d, want %d", a, d, got, want)
	}
}
