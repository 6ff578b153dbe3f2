// Package sluice is a rate limiter: token buckets, fixed windows with
// rollover, sliding-window logs and leaky-bucket shaping, enforced per key
// over a pluggable Store (in memory, Redis, Redis Cluster or PostgreSQL) with
// the same answers on every store.
//
// A limit, a store, and a Take per request:
//
//	perUser := sluice.MustLimit(sluice.Spec{Name: "per-user", TokensPerSecond: 10, Burst: 50})
//	lim := sluice.New(memory.New(memory.Options{})) // or redis.Open, postgres.Open
//
//	d, err := lim.Take(ctx, sluice.Request{Limit: perUser, Key: userID})
//	if err != nil {
//		return err // a cost that can never succeed, or a store error
//	}
//	if !d.Allowed {
//		// refuse, or come back after d.RetryAfter
//	}
//
// A Limiter also takes several limits at once, all-or-nothing (TakeAll),
// answers without consuming (Peek), refills a key (Reset), gives tokens
// back (Refund), waits for a turn (Wait) and makes a rejection an error
// (TakeOrError). For HTTP, httpgate.LimitByIP(100, time.Minute) is a
// middleware in one line, and policy.Load reads limits from a
// configuration file (httpgate.Middleware serves them).
//
// NewLimit is the one rule for what a limit may be and Request.Charge the
// one rule for what a request may cost, for every store and every
// transport.
//
// # Units
//
// Time is an int64 count of microseconds and tokens are int64 fixed-point
// micro-tokens (1 token = 1e6). Microseconds are the resolution of the
// clocks that the shared stores offer (Redis TIME, PostgreSQL timestamps),
// so one resolution everywhere is what lets every engine give the very same
// answer. Integers make boundaries exact: a request that arrives exactly
// when the bucket holds its cost is allowed, not "almost" allowed as it
// would be with floating point. See TakeTokenBucket for how rates are kept
// exact.
//
// # For store implementers
//
// Application code needs none of what follows; a Store needs all of it.
// The root package defines every algorithm as pure arithmetic on the
// state and the time: TakeTokenBucket, TakeFixedWindow and TakeSlidingLog
// decide, RefundTokenBucket, RefundFixedWindow and RefundSlidingLog give
// back, over the states BucketState, WindowState and []LogEntry (State
// holds any of them), each answering an Outcome. A Limit's Params are its
// integer form, Request.Charge turns a Request into the Charge those
// functions take, MaxDebt bounds a reservation's debt, StorageKey and
// WindowOffset name and place a key's bucket. The arithmetic has no clock
// of its own: the time is passed in, so each engine uses its own clock
// (Redis's TIME, PostgreSQL's clock_timestamp(), the process's monotonic
// clock) and tests use a fake one. Package conformance checks a Store
// against the vectors every store passes.
package sluice

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// TokenScale is the fixed-point scale of token amounts: costs, capacities
// and remaining tokens are held as integer multiples of 1/TokenScale of a
// token, so a cost of 0.5 is exactly 500000.
const TokenScale = 1_000_000

// Errors returned for requests that can never be decided as asked. They are
// wrapped with detail; test with errors.Is.
var (
	// ErrInvalidCost is a cost that is no amount of tokens: negative, NaN,
	// or below one micro-token (see Request.Charge; a Request's zero Cost
	// means one token). A cost too large to count is not one: it is
	// ErrCostExceedsLimit.
	ErrInvalidCost = errors.New("sluice: cost must be a finite number > 0")
	// ErrCostExceedsLimit is a cost larger than the limit's burst or
	// capacity (plus its max_reserved, for a reservation): no amount of
	// waiting would ever admit it.
	ErrCostExceedsLimit = errors.New("sluice: cost exceeds the limit's capacity and can never succeed")
	// ErrInvalidLimit is a Spec that cannot be enforced.
	ErrInvalidLimit = errors.New("sluice: invalid limit")
	// ErrReserveUnsupported is a reservation against an algorithm that has
	// no notion of a future turn (a sliding log or sliding window), or a
	// calendar window.
	ErrReserveUnsupported = errors.New("sluice: reservations need a token bucket, leaky bucket or fixed window of a fixed period")
	// ErrLeaseRequired is a take, refund or reservation on a concurrency
	// limit, or an acquire on any other: a concurrency limit's slots are
	// held by lease (Limiter.Acquire, Lease.Release), not charged.
	ErrLeaseRequired = errors.New("sluice: a concurrency limit holds slots by lease: use Limiter.Acquire and Lease.Release")
	// ErrNoKey is a request to a Limiter without a key. The empty key
	// would be one bucket for every caller that leaves its key out, by
	// omission, as the decision API refuses it; a bucket meant to be
	// shared is named ("global").
	ErrNoKey = errors.New(`sluice: a request needs a key (a bucket shared by every caller is one key they all use, such as "global")`)
)

// Algorithm names how a Limit counts.
type Algorithm uint8

const (
	// TokenBucket refills continuously at a rate up to a burst; it admits
	// bursts and enforces the rate over time.
	TokenBucket Algorithm = iota
	// FixedWindow adds a rate of tokens at each window boundary; unused
	// tokens roll over up to the capacity. No window admits more than the
	// capacity.
	FixedWindow
	// SlidingLog keeps every admitted request of the last period and admits
	// a request only if the total in any period stays within the capacity.
	// Its state is O(capacity) per key.
	SlidingLog
	// LeakyBucket shapes traffic: a token bucket with a burst of one request
	// where every request reserves its own turn, 1/rate apart, up to a
	// maximum queueing delay.
	LeakyBucket
	// Concurrency admits at most Spec.MaxInFlight requests of a key at
	// once: each holds a slot from Limiter.Acquire until Lease.Release, or
	// until its lease ends (see concurrency.go).
	Concurrency
	// SlidingWindow counts the current window and the previous one, the
	// previous weighted by how much of it the sliding period still
	// overlaps: two numbers per key, an estimate of the sliding log's
	// count whose error docs/sliding-window.md bounds (package engine's
	// TakeSlidingWindow).
	SlidingWindow
)

var algorithmNames = [...]string{"token_bucket", "fixed_window", "sliding_log", "leaky_bucket", "concurrency", "sliding_window"}
var algorithmPrefixes = [...]string{"tb", "fw", "sl", "lb", "cc", "sw"}

// String returns the configuration name of a, such as "token_bucket".
func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// KeyPrefix returns the short prefix of bucket keys for a ("tb", "fw", ...).
func (a Algorithm) KeyPrefix() string {
	if int(a) < len(algorithmPrefixes) {
		return algorithmPrefixes[a]
	}
	return "x"
}

// ParseAlgorithm reads a configuration name such as "token_bucket".
func ParseAlgorithm(s string) (Algorithm, error) {
	for i, n := range algorithmNames {
		if n == s {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown algorithm %q (want token_bucket, fixed_window, sliding_log, sliding_window, leaky_bucket or concurrency)", ErrInvalidLimit, s)
}

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
	if v > maxMicroTokens {
		return 0, fmt.Errorf("%w (got %v, above %v)", ErrInvalidCost, amount, float64(maxMicroTokens/TokenScale))
	}
	return int64(v), nil
}

// maxMicroTokens bounds capacities and costs at 2^53 micro-tokens (about
// nine billion tokens): every value then survives a round trip through a
// float64, which is what the Redis engine's Lua computes with.
const maxMicroTokens = 1 << 53

// FromMicroTokens converts fixed-point tokens back to a float.
func FromMicroTokens(v int64) float64 { return float64(v) / TokenScale }

// IsInputError reports whether err is the caller's fault (a bad cost, an
// impossible cost, an invalid limit, a reservation the algorithm cannot
// make, a request without a key) rather than the store's. Input errors are answered with a 4xx;
// every other error is a store failure, handled by the rule's
// on_store_error.
func IsInputError(err error) bool {
	return errors.Is(err, ErrInvalidCost) || errors.Is(err, ErrCostExceedsLimit) ||
		errors.Is(err, ErrInvalidLimit) || errors.Is(err, ErrReserveUnsupported) ||
		errors.Is(err, ErrLeaseRequired) || errors.Is(err, ErrNoKey)
}
