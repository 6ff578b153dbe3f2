package engine

import (
	"fmt"
	"time"
)

// Algorithm names the arithmetic a Params is computed with. Its values
// are those of sluice.Algorithm, which a limit's Spec names (NewLimit
// converts one to the other).
type Algorithm uint8

// The algorithms, in the order of sluice.Algorithm's.
const (
	TokenBucket   Algorithm = iota // TakeTokenBucket, RefundTokenBucket
	FixedWindow                    // TakeFixedWindow, RefundFixedWindow
	SlidingLog                     // TakeSlidingLog, RefundSlidingLog
	LeakyBucket                    // a token bucket whose every request reserves
	Concurrency                    // StepLease
	SlidingWindow                  // TakeSlidingWindow, RefundSlidingWindow
)

var algorithmNames = [...]string{"token_bucket", "fixed_window", "sliding_log", "leaky_bucket", "concurrency", "sliding_window"}

// String returns the configuration name of a, such as "token_bucket".
func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// Params is the integer form of a Limit that every engine computes with.
//
// For token and leaky buckets, tokens are kept in "scaled units" of
// 1/(TokenScale*RateDen) token, so that the refill over e microseconds is
// exactly e*RateNum units: a rate of num/den micro-tokens per microsecond
// needs no division and accumulates no rounding, however long the refill
// runs. Every scaled value stays below 2^62.
type Params struct {
	Algorithm Algorithm
	// RateNum/RateDen is the refill in micro-tokens per microsecond
	// (token and leaky buckets), reduced to lowest terms.
	RateNum, RateDen int64
	// Capacity is the bucket, rollover or log size in micro-tokens.
	Capacity int64
	// MaxReserved is the debt a reservation may run up, in micro-tokens:
	// the limit's max_reserved, or MaxDebt when it sets none.
	MaxReserved int64
	// WindowRate is the micro-tokens each fixed window adds.
	WindowRate int64
	// Period is the fixed window or sliding log length in microseconds.
	Period int64
	// Offset is the fixed window start in microseconds, or -1 for a
	// per-key offset (see WindowOffset).
	Offset int64
	// Reserve is set when every request reserves a turn: leaky buckets,
	// and limits whose Spec sets Reserve.
	Reserve bool
	// Calendar is set for windows aligned to the calendar (fixed or
	// sliding): their bounds come from Windows, in the zone Loc, not from
	// Period, which then holds the unit's longest length.
	Calendar Calendar
	// Loc is the zone a calendar window follows (UTC when nil).
	Loc *time.Location
	// rateInv and denInv are reciprocal(RateNum) and reciprocal(RateDen),
	// for the divisions of every decision; zero in Params built by hand,
	// which then divide.
	rateInv, denInv uint64
}

// Precompute computes the reciprocals that spare each decision its
// divisions. It is called wherever a limit's Params are final; Params
// built by hand without it are exact too, and divide.
func (p *Params) Precompute() {
	p.rateInv, p.denInv = reciprocal(p.RateNum), reciprocal(p.RateDen)
}

// Bounds of the integer arithmetic, which NewLimit keeps every Params
// within.
const (
	// MaxScaled bounds every scaled value of a bucket (see Params) and
	// every wait: products of two of them stay within int64.
	MaxScaled = 1 << 62
	// MaxRateDen bounds Params.RateDen: rates are kept as the closest
	// fraction with a denominator of at most 1e9.
	MaxRateDen = 1_000_000_000
	// MaxExactScaled bounds the values of a limit that every store,
	// Redis's Lua included, computes exactly: Lua numbers are doubles,
	// exact for integers below 2^53, and 2^52 leaves room for every
	// intermediate (a sum of two values, a quotient times its divisor).
	MaxExactScaled = 1 << 52
)

// MaxDebt is the most debt, in micro-tokens, that a reservation may run
// up on a limit of parameters p: what a max_reserved left unset ("without
// bound") means, and the most any max_reserved can mean. A reservation
// needs no bound of its own, but its arithmetic does: the debt is kept
// where every value the algorithm computes (the debt plus the capacity,
// scaled by the rate's denominator for a bucket; the windows it takes to
// pay, times the period, for a fixed window) stays below 2^52, the range
// that every store computes exactly. For most limits that is billions of
// tokens, or months of turns. A limit beyond that range even without debt,
// which only the stores that compute in 64-bit integers take, gets the
// range below 2^62 instead. Sliding logs and sliding windows take no
// reservations: zero.
func MaxDebt(p *Params) int64 {
	switch p.Algorithm {
	case TokenBucket, LeakyBucket:
		if p.RateDen <= 0 {
			return 0
		}
		hi := int64(MaxExactScaled)
		if p.Capacity > (hi-1)/p.RateDen {
			hi = MaxScaled
		}
		return max(0, (hi-1)/p.RateDen-p.Capacity)
	case FixedWindow:
		if p.WindowRate <= 0 || p.Period <= 0 {
			return 0
		}
		// The most tokens whose debt still pays back within range: a wait
		// is up to ceil((capacity+debt)/rate) + 1 periods.
		most := func(hi int64) int64 {
			windows := (hi-1)/p.Period - 1
			if windows <= 0 {
				return 0
			}
			return min(hi-1, MulDiv(windows, p.WindowRate, 1))
		}
		m := most(MaxExactScaled)
		if p.Capacity > m {
			m = most(MaxScaled)
		}
		return max(0, m-p.Capacity)
	}
	return 0
}
