package engine

import (
	"math"
	"math/bits"
)

// MulDiv returns floor(a*b/c) for a, b >= 0 and c > 0 without intermediate
// overflow, saturating at math.MaxInt64.
func MulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// ceilDiv returns ceil(a/b) for a >= 0 and b > 0.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}

// reciprocal is floor((2^64-1)/d) for d > 0: what divBy divides by d
// with. A limit computes it for its rate once, since a 64-bit division
// costs tens of cycles on many x86 processors (as much as the rest of a
// rejection's arithmetic) and a multiplication three or four.
func reciprocal(d int64) uint64 {
	if d <= 0 {
		return 0
	}
	return math.MaxUint64 / uint64(d)
}

// divBy returns floor(a/d) and a mod d for 0 <= a and d > 0, given inv =
// reciprocal(d). The high word of a*inv is floor(a/d) or one less: inv*d
// lies within d of 2^64, so a*inv/2^64 lies below a/d by less than
// a/2^64 < 1/2, and never above it. One comparison corrects it.
func divBy(a, d int64, inv uint64) (q, r int64) {
	hi, _ := bits.Mul64(uint64(a), inv)
	q = int64(hi)
	r = a - q*d
	if r >= d {
		q++
		r -= d
	}
	return q, r
}

// ceilDivBy is ceilDiv(a, d) for a >= 0, given inv = reciprocal(d), or
// zero (Params not built by NewLimit), when it computes the reciprocal.
// Small enough to be inlined into every decision's arithmetic.
func ceilDivBy(a, d int64, inv uint64) int64 {
	if inv == 0 {
		inv = math.MaxUint64 / uint64(d)
	}
	q, r := divBy(a, d, inv)
	if r != 0 {
		q++
	}
	return q
}

// floorDivBy is FloorDiv(a, d) for any sign of a, given inv =
// reciprocal(d), or by division when inv is zero.
func floorDivBy(a, d int64, inv uint64) int64 {
	if inv == 0 || a == math.MinInt64 {
		return FloorDiv(a, d)
	}
	if a < 0 {
		return -ceilDivBy(-a, d, inv)
	}
	q, _ := divBy(a, d, inv)
	return q
}

// FloorDiv returns floor(a/b) for b > 0 and any sign of a.
func FloorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
