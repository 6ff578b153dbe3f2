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
// NewLimit is the one rule for what a limit may be and Request.Charged the
// one rule for what a request may cost, for every store and every
// transport.
//
// Amounts are float64 tokens (0.5 is half a token) and waits are
// time.Duration. Package engine holds the integer arithmetic every store
// runs, and is all a new store needs.
package sluice

import (
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/engine"
)

// Errors of a Limiter's calls: the requests that can never be decided
// as asked, and rejections as errors. They are
// wrapped with detail; test with errors.Is.
var (
	// ErrInvalidCost is a cost that is no amount of tokens: negative, NaN,
	// or below one micro-token (see Request.Charged; a Request's zero Cost
	// means one token). A cost too large to count is not one: it is
	// ErrCostExceedsLimit.
	ErrInvalidCost = engine.ErrInvalidCost
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
	// ErrLimited is what a rejection is as an error: every *LimitedError
	// is ErrLimited (errors.Is), whatever its rule, key and time.
	ErrLimited = errors.New("sluice: rate limited")
	// ErrBeyondDeadline is why Wait gave up without waiting: the turn it
	// would have had comes after the context's deadline. The error Wait
	// returns is a *LimitedError too.
	ErrBeyondDeadline = errors.New("the turn comes after the context's deadline")
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

var algorithmPrefixes = [...]string{"tb", "fw", "sl", "lb", "cc", "sw"}

// String returns the configuration name of a, such as "token_bucket".
func (a Algorithm) String() string { return engine.Algorithm(a).String() }

// KeyPrefix returns the short prefix of bucket keys for a ("tb", "fw", ...).
func (a Algorithm) KeyPrefix() string {
	if int(a) < len(algorithmPrefixes) {
		return algorithmPrefixes[a]
	}
	return "x"
}

// ParseAlgorithm reads a configuration name such as "token_bucket".
func ParseAlgorithm(s string) (Algorithm, error) {
	for a := range Algorithm(len(algorithmPrefixes)) {
		if a.String() == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown algorithm %q (want token_bucket, fixed_window, sliding_log, sliding_window, leaky_bucket or concurrency)", ErrInvalidLimit, s)
}

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
