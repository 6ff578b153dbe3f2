package sluice

import (
	"github.com/sluicehq/sluice/internal/reserved"

	"fmt"
	"hash/maphash"
	"math"
	"math/big"
	"time"
)

// Spec describes a limit as a person writes it. It accepts both spellings
// found in configuration files: a rate per second with a burst
// (TokensPerSecond + Burst) and a rate per period with a capacity (Rate +
// Period + Capacity, the capacity defaulting to the rate). Exactly one of
// TokensPerSecond and Rate is set. NewLimit validates a Spec and compiles
// it into a Limit.
type Spec struct {
	// Name identifies the limit in decisions, keys, headers and metrics.
	Name      string
	Algorithm Algorithm

	// TokensPerSecond is the refill rate in the per-second spelling.
	TokensPerSecond float64
	// Burst is the bucket size in the per-second spelling.
	Burst float64

	// Rate tokens arrive every Period (default one second).
	Rate   float64
	Period time.Duration
	// Capacity is the bucket, window rollover or log size; zero means Rate
	// (or Burst in the per-second spelling). ZeroCapacity (any negative
	// value) asks for a bucket that holds nothing, which needs Reserve:
	// every request then waits its turn, cost/rate after the one before
	// it, the spacing a leaky bucket gives without its burst of one.
	Capacity float64

	// Calendar aligns a fixed or sliding window's periods to calendar
	// days, weeks (from Monday), months or years in Timezone instead of
	// counting a Period of microseconds (see calendar.go); Period is then
	// left zero.
	Calendar Calendar
	// Timezone is the IANA name of the zone whose calendar Calendar
	// follows ("Europe/Berlin"); empty is UTC.
	Timezone string

	// Start fixes where fixed windows begin, as an offset from the Unix
	// epoch. Nil spreads window starts over the period by a hash of each
	// key, so that not every key refills at the same instant.
	Start *time.Duration

	// Reserve makes every request of the limit a reservation (see
	// Request.Reserve), as every request of a leaky bucket is. Token
	// buckets and fixed windows; a zero capacity needs it.
	Reserve bool
	// MaxReserved is how far into debt a reservation may take a token
	// bucket or fixed window, in tokens. Zero means without bound: as far
	// as every store can count exactly (see MaxDebt); a policy file's
	// rules get a finite default instead (policy.DefaultMaxReserved),
	// since a server's clients share buckets with strangers. For a leaky bucket
	// it is derived from MaxDelay.
	MaxReserved float64
	// MaxDelay is a leaky bucket's longest queueing delay (default one
	// second).
	MaxDelay time.Duration

	// Jitter spreads rejected callers' retries: a Limiter adds up to
	// Jitter to the wait of every rejection, an offset fixed per limit,
	// key and caller (see Limit.Jitter), so that callers rejected together
	// do not come back together. Zero (the default) adds none. A reserved
	// turn is never moved: it is exact. Setting it to the period (the
	// rule's `jitter: period`) spreads retries over one refill period.
	Jitter time.Duration
	// Shards keeps the limit in this many buckets per key (at most
	// MaxShards), each with 1/Shards of the rate, capacity and
	// MaxReserved, for a limit too hot for one key; zero or one is one
	// bucket. A take is charged to the fuller of two shards picked at
	// random, or split over both (see Limit.Shards). Token buckets, fixed
	// windows and sliding logs only; a sharded limit is used through a
	// Limiter, which expands its requests.
	Shards int

	// MaxInFlight is a Concurrency limit's number of slots: at most this
	// many requests of a key hold one at once (1 to MaxInFlightLimit).
	MaxInFlight int
	// Lease is how long a Concurrency limit's slot stays held without a
	// renewal or a release (default DefaultLease): a holder that dies
	// without releasing loses its slot when its lease ends.
	Lease time.Duration
}

// Limit is a validated, compiled Spec: immutable and safe to share. Every
// engine evaluates it from Params, which hold the integer form of the
// rate and sizes.
type Limit struct {
	spec   Spec
	params Params
	loc    *time.Location // Spec.Timezone's, for a calendar window
	nameID uint64
	shards *shardSet // nil unless Spec.Shards > 1
}

// nameSeed seeds NameID: random per process, so IDs never leave it.
var nameSeed = maphash.MakeSeed()

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
	// Calendar is set for windows aligned to the calendar: their bounds
	// come from package engine's Windows, not from Period.
	Calendar Calendar
	// rateInv and denInv are reciprocal(RateNum) and reciprocal(RateDen),
	// for the divisions of every decision; zero in Params built by hand,
	// which then divide.
	rateInv, denInv uint64
}

// setReciprocals computes rateInv and denInv: called wherever a Limit's
// Params are final.
func (p *Params) setReciprocals() {
	p.rateInv, p.denInv = reciprocal(p.RateNum), reciprocal(p.RateDen)
}

// ZeroCapacity is the Spec.Capacity of a bucket that holds nothing: with
// Reserve, every request waits its turn, cost/rate after the previous one.
const ZeroCapacity = -1

const (
	maxScaled  = 1 << 62
	maxRateDen = 1_000_000_000
	// maxExactScaled bounds the values of a limit that every store,
	// Redis's Lua included, computes exactly: Lua numbers are doubles,
	// exact for integers below 2^53, and 2^52 leaves room for every
	// intermediate (a sum of two values, a quotient times its divisor).
	maxExactScaled = 1 << 52
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
// range below 2^62 instead. Sliding logs take no reservations: zero.
func MaxDebt(p *Params) int64 {
	switch p.Algorithm {
	case TokenBucket, LeakyBucket:
		if p.RateDen <= 0 {
			return 0
		}
		hi := int64(maxExactScaled)
		if p.Capacity > (hi-1)/p.RateDen {
			hi = maxScaled
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
			return min(hi-1, mulDiv(windows, p.WindowRate, 1))
		}
		m := most(maxExactScaled)
		if p.Capacity > m {
			m = most(maxScaled)
		}
		return max(0, m-p.Capacity)
	}
	return 0
}

// MaxNameLen is the longest name of a rule or a tier.
const MaxNameLen = 64

// ValidName reports whether s may name a rule or a tier: 1 to MaxNameLen
// bytes of A-Z a-z 0-9 _ . - (so that a name is safe in a metric label, a
// store key, a header and a log line as written). The file format and
// NewLimit check names with it.
func ValidName(s string) bool {
	if s == "" || len(s) > MaxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// validLimitName reports whether s may name a limit: a rule's name, or a
// tier's limit, RULE.TIER, each a ValidName.
func validLimitName(s string) bool {
	if ValidName(s) {
		return true
	}
	for i := 0; i < len(s); i++ {
		if s[i] == '.' && ValidName(s[:i]) && ValidName(s[i+1:]) {
			return true
		}
	}
	return false
}

func init() {
	reserved.NewLimit = func(s any) (any, error) { return newLimit(s.(Spec), false) }
}

// NewLimit validates s and compiles it. Errors wrap ErrInvalidLimit and
// name the offending field. Its name must be one a policy file could
// give (ValidName, or RULE.TIER of two).
func NewLimit(s Spec) (*Limit, error) { return newLimit(s, true) }

// newLimit is NewLimit; checkName false admits any non-empty name, for
// the limits sluice keeps for itself (package internal/reserved).
func newLimit(s Spec, checkName bool) (*Limit, error) {
	bad := func(format string, a ...any) (*Limit, error) {
		return nil, &SpecError{Limit: s.Name, Reason: fmt.Sprintf(format, a...)}
	}
	// badField names the field at fault; reason is said of it.
	badField := func(field, format string, a ...any) (*Limit, error) {
		return nil, &SpecError{Limit: s.Name, Field: field, Reason: fmt.Sprintf(format, a...)}
	}
	if s.Name == "" {
		return nil, fmt.Errorf("%w: a limit needs a name", ErrInvalidLimit)
	}
	if checkName && !validLimitName(s.Name) {
		return badField("name", "must be 1 to %d of A-Z a-z 0-9 _ . - (or RULE.TIER, two such names), as in a policy file", MaxNameLen)
	}
	if int(s.Algorithm) >= len(algorithmNames) {
		return bad("unknown algorithm %d", s.Algorithm)
	}
	if s.Algorithm == Concurrency || s.MaxInFlight != 0 || s.Lease != 0 {
		return newConcurrency(s)
	}
	for field, v := range map[string]float64{"tokens_per_second": s.TokensPerSecond, "burst": s.Burst, "rate": s.Rate, "capacity": s.Capacity, "max_reserved": s.MaxReserved} {
		if math.IsNaN(v) || math.IsInf(v, 0) || (v < 0 && field != "capacity") {
			return badField(field, "must be a finite number >= 0, got %v", v)
		}
	}
	if s.Period < 0 || s.MaxDelay < 0 {
		return bad("period and max_delay must not be negative")
	}
	if s.Jitter < 0 {
		return badField("jitter", "must not be negative")
	}
	loc, calPeriod, err := s.calendarWindow()
	if err != nil {
		return nil, err
	}
	// Normalise the two spellings into rate per period plus capacity.
	rate, period, capacity := s.Rate, s.Period, s.Capacity
	if calPeriod > 0 {
		period = calPeriod
	}
	switch {
	case s.TokensPerSecond > 0 && s.Rate > 0:
		return bad("give either tokens_per_second or rate, not both")
	case s.TokensPerSecond > 0:
		if s.Period != 0 && s.Period != time.Second {
			return bad("tokens_per_second is per second; use rate with period for another period")
		}
		rate, period = s.TokensPerSecond, time.Second
		if s.Algorithm == TokenBucket && s.Burst == 0 && s.Capacity == 0 {
			// As in a policy file: a bucket one second deep is a guess
			// about bursts that the writer should make.
			return badField("burst", "is required with tokens_per_second (the bucket size: how many requests may pass at once)")
		}
		if s.Burst > 0 && s.Capacity != 0 && s.Burst != s.Capacity {
			return bad("burst and capacity disagree (%v vs %v)", s.Burst, s.Capacity)
		}
		if s.Burst > 0 {
			capacity = s.Burst
		}
	case s.Rate > 0:
		if period == 0 {
			period = time.Second
		}
		if s.Burst > 0 && s.Capacity != 0 && s.Burst != s.Capacity {
			return bad("burst and capacity disagree (%v vs %v)", s.Burst, s.Capacity)
		}
		if capacity == 0 {
			capacity = s.Burst
		}
	default:
		return bad("a rate is required: tokens_per_second (rps) or rate, > 0")
	}
	if period%time.Microsecond != 0 {
		return badField("period", "must be a whole number of microseconds (the resolution of every store), got %v", period)
	}
	if capacity == 0 {
		capacity = rate
		if s.Algorithm == LeakyBucket {
			capacity = 1
		}
	}
	p := Params{Algorithm: s.Algorithm, Period: int64(period / time.Microsecond), Offset: -1, Reserve: s.Reserve, Calendar: s.Calendar}
	if s.Reserve && (s.Algorithm == SlidingLog || s.Algorithm == SlidingWindow || s.Calendar != 0) {
		return bad("reserve needs a token bucket, leaky bucket or fixed window of a fixed period")
	}
	// The fields the rate and the size were given in, for errors.
	rateField, capField := "rate", "capacity"
	if s.TokensPerSecond > 0 {
		rateField = "tokens_per_second"
	}
	switch {
	case s.Capacity == 0 && s.Burst > 0:
		capField = "burst"
	case s.Capacity == 0:
		capField = rateField // the size defaults to the rate
	}
	var why string
	switch {
	case capacity >= 0:
		if p.Capacity, why = amountReason(capacity); why != "" {
			return badField(capField, "%s", why)
		}
	case !s.Reserve && s.Algorithm != LeakyBucket:
		// Without a reservation no request could ever pass.
		return bad("a capacity of zero needs reserve (every request then waits its turn)")
	default:
		capacity = 0
	}
	if p.WindowRate, why = amountReason(rate); why != "" {
		return badField(rateField, "%s", why)
	}
	if s.Start != nil {
		if *s.Start < 0 {
			return badField("start", "must not be negative")
		}
		p.Offset = int64(*s.Start/time.Microsecond) % p.Period
	}
	switch s.Algorithm {
	case TokenBucket, LeakyBucket:
		p.RateNum, p.RateDen, err = rational(rate, p.Period)
		if err != nil {
			return badField(rateField, "%v", err)
		}
		if hi := float64(p.Capacity) * float64(p.RateDen); hi >= maxScaled {
			return badField(capField, "%v is too large for this rate's precision: give the rate as rate and period in whole numbers", capacity)
		}
		if s.Algorithm == LeakyBucket {
			p.Reserve = true
			delay := s.MaxDelay
			if delay == 0 {
				delay = time.Second
			}
			// The debt that drains in exactly delay.
			p.MaxReserved = min(mulDiv(Micros(delay), p.RateNum, p.RateDen), MaxDebt(&p))
		} else if p.MaxReserved, err = maxReserved(s.MaxReserved, &p); err != nil {
			return badField("max_reserved", "%v", err)
		}
	case FixedWindow, SlidingLog, SlidingWindow:
		if s.Algorithm != FixedWindow && s.MaxReserved > 0 {
			return bad("max_reserved needs a token bucket, leaky bucket or fixed window")
		}
		if s.Algorithm != FixedWindow && p.Offset >= 0 {
			return bad("start applies to fixed windows only")
		}
		if why := calendarParams(&p); why != "" {
			return bad("%s", why)
		}
		// Waits reach up to capacity/rate windows ahead; keep them in range.
		if windows := float64(p.Capacity/p.WindowRate + 1); windows*float64(p.Period) >= maxScaled {
			return bad("refilling capacity %v at rate %v per %v takes too long to express", capacity, rate, period)
		}
		if s.Algorithm == FixedWindow {
			if p.MaxReserved, err = maxReserved(s.MaxReserved, &p); err != nil {
				return badField("max_reserved", "%v", err)
			}
		}
	}
	p.setReciprocals()
	l := &Limit{spec: s, params: p, loc: loc, nameID: maphash.String(nameSeed, s.Name)}
	if err := l.initShards(); err != nil {
		return bad("%v", err)
	}
	return l, nil
}

// maxReserved is the debt bound of a max_reserved of tokens (zero: none)
// on a limit of parameters p, in micro-tokens: at most MaxDebt, which is
// also what no bound means.
func maxReserved(tokens float64, p *Params) (int64, error) {
	most := MaxDebt(p)
	if tokens == 0 {
		return most, nil
	}
	mr, why := amountReason(tokens)
	if why != "" {
		// ErrInvalidCost: a request's own max_reserved is part of its
		// charge (Request.Charge).
		return 0, &costError{why, ErrInvalidCost}
	}
	return min(mr, most), nil
}

// NameID is a 64-bit hash of the limit's name, the same for every Limit of
// that name within this process (and different in the next). In-process
// stores key state by name so that a reloaded limit keeps its buckets; the
// ID spares them hashing the name on every request.
func (l *Limit) NameID() uint64 { return l.nameID }

// MustLimit is NewLimit for limits written in code; it panics on an
// invalid Spec and is meant for package-level variables and tests.
func MustLimit(s Spec) *Limit {
	l, err := NewLimit(s)
	if err != nil {
		panic(err)
	}
	return l
}

// Name returns the limit's name.
func (l *Limit) Name() string { return l.spec.Name }

// Spec returns the specification the limit was compiled from.
func (l *Limit) Spec() Spec { return l.spec }

// Params returns the integer parameters every engine computes with.
func (l *Limit) Params() *Params { return &l.params }

// Algorithm returns how the limit counts.
func (l *Limit) Algorithm() Algorithm { return l.params.Algorithm }

// Capacity returns the burst or capacity in tokens.
func (l *Limit) Capacity() float64 { return FromMicroTokens(l.params.Capacity) }

// TokensPerSecond returns the long-run rate in tokens per second.
func (l *Limit) TokensPerSecond() float64 {
	if l.params.RateDen > 0 {
		return float64(l.params.RateNum) / float64(l.params.RateDen)
	}
	return float64(l.params.WindowRate) / float64(l.params.Period)
}

// Cost validates the cost of a take that sets no reservation of its own
// against l and returns it in micro-tokens: the cost half of
// Request.Charge's rule for OpTake, where a cost above the capacity (plus
// max_reserved when every request of l reserves) is ErrCostExceedsLimit.
// Zero is no cost here (ErrInvalidCost).
func (l *Limit) Cost(cost float64) (int64, error) {
	most := l.params.Capacity
	if l.params.Reserve {
		most += l.params.MaxReserved
	}
	return l.cost(OpTake, cost, most)
}

// cost is the cost half of Request.Charge's rule (see there): most is the
// most one request can be charged, in micro-tokens.
func (l *Limit) cost(op Op, cost float64, most int64) (int64, error) {
	if l.shards != nil && op != OpRefund {
		return l.shardCost(cost)
	}
	c, err := ToMicroTokens(cost)
	if err == nil && c <= most {
		return c, nil
	}
	// Above the most: a number beyond it, or infinity or an amount too
	// large to count, which are beyond any. NaN is not above.
	above := err == nil || cost > FromMicroTokens(most)
	switch {
	case !above:
		return 0, costInvalid(l.spec.Name, cost)
	case op == OpRefund:
		return most, nil
	}
	what := fmt.Sprintf("the capacity (%v)", l.Capacity())
	if most > l.params.Capacity {
		what = fmt.Sprintf("the capacity (%v) plus max_reserved (%v)", l.Capacity(), FromMicroTokens(most-l.params.Capacity))
	}
	return 0, costAbove(l.spec.Name, cost, what)
}

// rational expresses rate tokens per period microseconds as num/den
// micro-tokens per microsecond in lowest terms. Whole micro-token rates are
// exact; others take the closest fraction with a denominator of at most
// 1e9 (a relative error below 1e-9 for any rate in range).
func rational(rate float64, periodUs int64) (num, den int64, err error) {
	micro := rate * TokenScale
	if micro < 1 {
		return 0, 0, fmt.Errorf("must be at least one micro-token (0.000001) per period, got %v per %v", rate, Duration(periodUs))
	}
	if micro == math.Trunc(micro) && micro < maxMicroTokens {
		n, d := int64(micro), periodUs
		g := gcd(n, d)
		n, d = n/g, d/g
		if d <= maxRateDen {
			return n, d, nil
		}
	}
	x := new(big.Rat).SetFloat64(micro)
	x.Quo(x, new(big.Rat).SetInt64(periodUs))
	n, d := bestRational(x, maxRateDen)
	if n <= 0 || n >= maxScaled {
		return 0, 0, fmt.Errorf("is out of range: %v per %v", rate, Duration(periodUs))
	}
	return n, d, nil
}

// bestRational returns the closest fraction to x with denominator <= maxDen,
// by continued fractions.
func bestRational(x *big.Rat, maxDen int64) (int64, int64) {
	// Convergents h/k of the continued fraction of x.
	h0, h1 := big.NewInt(0), big.NewInt(1)
	k0, k1 := big.NewInt(1), big.NewInt(0)
	r := new(big.Rat).Set(x)
	limit := big.NewInt(maxDen)
	for i := 0; i < 64; i++ {
		a := new(big.Int).Quo(r.Num(), r.Denom())
		h2 := new(big.Int).Add(new(big.Int).Mul(a, h1), h0)
		k2 := new(big.Int).Add(new(big.Int).Mul(a, k1), k0)
		if k2.Cmp(limit) > 0 {
			break
		}
		h0, h1, k0, k1 = h1, h2, k1, k2
		frac := new(big.Rat).Sub(r, new(big.Rat).SetInt(a))
		if frac.Sign() == 0 {
			break
		}
		r.Inv(frac)
	}
	if !h1.IsInt64() || !k1.IsInt64() || k1.Sign() == 0 {
		return 0, 1
	}
	return h1.Int64(), k1.Int64()
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	if a == 0 {
		return 1
	}
	return a
}
