package engine

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// ErrInvalidCost is an amount that is no amount of tokens: negative, NaN,
// infinite, below one micro-token or above MaxMicroTokens. Package sluice
// returns it as sluice.ErrInvalidCost: they are one error.
var ErrInvalidCost = errors.New("sluice: cost must be a finite number > 0")

// TokenScale is the fixed-point scale of token amounts: costs, capacities
// and remaining tokens are held as integer multiples of 1/TokenScale of a
// token, so a cost of 0.5 is exactly 500000.
const TokenScale = 1_000_000

// Micros converts d to whole microseconds, rounding up so that a wait is
// never shortened.
func Micros(d time.Duration) int64 {
	us := int64(d / time.Microsecond)
	if d%time.Microsecond > 0 {
		us++
	}
	return us
}

// Duration converts microseconds to a time.Duration, saturating.
func Duration(us int64) time.Duration {
	if us > math.MaxInt64/int64(time.Microsecond) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(us) * time.Microsecond
}

// ToMicroTokens converts an amount of tokens to fixed point, rejecting
// values that would corrupt state: NaN, infinities, negatives, zero, amounts
// below one micro-token and amounts beyond the representable range.
func ToMicroTokens(amount float64) (int64, error) {
	if amount >= 1 && amount <= 1<<30 && amount == float64(int64(amount)) {
		return int64(amount) * TokenScale, nil // whole tokens, the common case
	}
	if math.IsNaN(amount) || math.IsInf(amount, 0) || amount <= 0 {
		return 0, fmt.Errorf("%w (got %v)", ErrInvalidCost, amount)
	}
	v := math.Round(amount * TokenScale)
	if v < 1 {
		return 0, fmt.Errorf("%w (got %v, below 1e-6)", ErrInvalidCost, amount)
	}
	if v > MaxMicroTokens {
		return 0, fmt.Errorf("%w (got %v, above %v)", ErrInvalidCost, amount, float64(MaxMicroTokens/TokenScale))
	}
	return int64(v), nil
}

// MaxMicroTokens bounds capacities and costs at 2^53 micro-tokens (about
// nine billion tokens): every value then survives a round trip through a
// float64, which is what the Redis engine's Lua computes with.
const MaxMicroTokens = 1 << 53

// FromMicroTokens converts fixed-point tokens back to a float.
func FromMicroTokens(v int64) float64 { return float64(v) / TokenScale }
