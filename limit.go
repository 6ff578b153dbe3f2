package sluice

import (
	"cmp"
	"fmt"
	"hash/maphash"
	"math"
	"math/big"
	"time"

	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/reserved"
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
	// as every store can count exactly (see engine.MaxDebt); a policy file's
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
	// LeaseTerm is how long a Concurrency limit's slot stays held without a
	// renewal or a release (default DefaultLeaseTerm): a holder that dies
	// without releasing loses its slot when its lease ends.
	LeaseTerm time.Duration
}

// Limit is a validated, compiled Spec: immutable and safe to share. Every
// engine evaluates it from Params, which hold the integer form of the
// rate and sizes.
type Limit struct {
	spec   Spec
	params engine.Params
	nameID uint64
	shards *shardSet // nil unless Spec.Shards > 1
	// plain is set for a limit of tokens, in one bucket (not sharded),
	// that holds at least one token: a request for one token of it needs
	// no judging (Request.Charged).
	plain bool
	one   engine.Charge // the charge of one token, when plain
	whole int64         // the capacity in whole tokens (Decision.Capacity)
}

// nameSeed seeds NameID: random per process, so IDs never leave it.
var nameSeed = maphash.MakeSeed()

// Values and bounds of a Spec's fields.
const (
	// ZeroCapacity is the Spec.Capacity of a bucket that holds nothing:
	// with Reserve, every request waits its turn, cost/rate after the
	// previous one.
	ZeroCapacity = -1
	// MaxNameLen is the longest name of a rule or a tier.
	MaxNameLen = 64
	// MaxShards bounds Spec.Shards. A peek reads every shard and a Reset
	// clears every one, so their cost grows with the count; beyond a few
	// per Cluster node more shards only shrink each one.
	MaxShards = 256
	// DefaultLeaseTerm is a concurrency limit's lease term when its Spec
	// gives none.
	DefaultLeaseTerm = 30 * time.Second
	// MaxInFlightLimit is the most slots a concurrency limit may have:
	// a key's state is one entry per slot held (O(MaxInFlight)).
	MaxInFlightLimit = 1 << 16
	// MinLeaseTerm and MaxLeaseTerm bound Spec.LeaseTerm: a lease
	// shorter than a millisecond ends before a store's answer is back,
	// and one longer than a day keeps a dead holder's slot far longer
	// than any request runs.
	MinLeaseTerm = time.Millisecond
	MaxLeaseTerm = 24 * time.Hour
)

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
// the limits sluice keeps for itself (package internal/reserved). It
// checks the Spec in the order its steps name: the name and algorithm,
// the numbers, the spelling of the rate (normalize), the sizes
// (sizeParams) and what the algorithm adds (bucketParams, windowParams).
func newLimit(s Spec, checkName bool) (*Limit, error) {
	if s.Name == "" {
		return nil, fmt.Errorf("%w: a limit needs a name", ErrInvalidLimit)
	}
	if checkName && !validLimitName(s.Name) {
		return nil, specErr(s, "name", "must be 1 to %d of A-Z a-z 0-9 _ . - (or RULE.TIER, two such names), as in a policy file", MaxNameLen)
	}
	if int(s.Algorithm) >= len(algorithmPrefixes) {
		return nil, specErr(s, "", "unknown algorithm %d", s.Algorithm)
	}
	if s.Algorithm == Concurrency || s.MaxInFlight != 0 || s.LeaseTerm != 0 {
		return newConcurrency(s)
	}
	if err := checkNumbers(s); err != nil {
		return nil, err
	}
	loc, calPeriod, err := s.calendarWindow()
	if err != nil {
		return nil, err
	}
	n, err := normalize(s, calPeriod)
	if err != nil {
		return nil, err
	}
	p, err := n.sizeParams(s)
	if err != nil {
		return nil, err
	}
	p.Loc = loc
	switch s.Algorithm {
	case TokenBucket, LeakyBucket:
		err = n.bucketParams(s, &p)
	case FixedWindow, SlidingLog, SlidingWindow:
		err = n.windowParams(s, &p)
	}
	if err != nil {
		return nil, err
	}
	p.Precompute()
	l := &Limit{spec: s, params: p, nameID: maphash.String(nameSeed, s.Name)}
	if err := l.initShards(); err != nil {
		return nil, specErr(s, "", "%v", err)
	}
	l.setPlain()
	return l, nil
}

// specErr is the error of a Spec that cannot be enforced, naming the
// field at fault (none when the fault lies between fields).
func specErr(s Spec, field, format string, a ...any) error {
	return &SpecError{Limit: s.Name, Field: field, Reason: fmt.Sprintf(format, a...)}
}

// checkNumbers refuses the numbers of a rate limit's Spec that no
// spelling admits: NaN, infinities, negative amounts (but a capacity,
// where negative is ZeroCapacity) and negative durations.
func checkNumbers(s Spec) error {
	for field, v := range map[string]float64{"tokens_per_second": s.TokensPerSecond, "burst": s.Burst, "rate": s.Rate, "capacity": s.Capacity, "max_reserved": s.MaxReserved} {
		if math.IsNaN(v) || math.IsInf(v, 0) || (v < 0 && field != "capacity") {
			return specErr(s, field, "must be a finite number >= 0, got %v", v)
		}
	}
	if s.Period < 0 || s.MaxDelay < 0 {
		return specErr(s, "", "period and max_delay must not be negative")
	}
	if s.Jitter < 0 {
		return specErr(s, "jitter", "must not be negative")
	}
	return nil
}

// normal is a rate limit's Spec in one spelling, rate tokens per period
// up to capacity (negative: ZeroCapacity), with the fields the rate and
// the size were given in, for errors.
type normal struct {
	rate, capacity      float64
	period              time.Duration
	rateField, capField string
}

// normalize reads the two spellings of a Spec (tokens_per_second with
// burst, rate per period with capacity) into one. A calendar window's
// period is calPeriod, its unit's longest length (Spec.calendarWindow).
func normalize(s Spec, calPeriod time.Duration) (normal, error) {
	n := normal{rate: s.Rate, period: s.Period, capacity: s.Capacity, rateField: "rate", capField: "capacity"}
	if calPeriod > 0 {
		n.period = calPeriod
	}
	switch {
	case s.TokensPerSecond > 0 && s.Rate > 0:
		return n, specErr(s, "", "give either tokens_per_second or rate, not both")
	case s.TokensPerSecond > 0:
		if s.Period != 0 && s.Period != time.Second {
			return n, specErr(s, "", "tokens_per_second is per second; use rate with period for another period")
		}
		n.rate, n.period = s.TokensPerSecond, time.Second
		if s.Algorithm == TokenBucket && s.Burst == 0 && s.Capacity == 0 {
			// As in a policy file: a bucket one second deep is a guess
			// about bursts that the writer should make.
			return n, specErr(s, "burst", "is required with tokens_per_second (the bucket size: how many requests may pass at once)")
		}
		if s.Burst > 0 {
			n.capacity = s.Burst
		}
	case s.Rate > 0:
		n.period = cmp.Or(n.period, time.Second)
		n.capacity = cmp.Or(n.capacity, s.Burst)
	default:
		return n, specErr(s, "", "a rate is required: tokens_per_second (rps) or rate, > 0")
	}
	if s.Burst > 0 && s.Capacity != 0 && s.Burst != s.Capacity {
		return n, specErr(s, "", "burst and capacity disagree (%v vs %v)", s.Burst, s.Capacity)
	}
	if n.period%time.Microsecond != 0 {
		return n, specErr(s, "period", "must be a whole number of microseconds (the resolution of every store), got %v", n.period)
	}
	if n.capacity == 0 {
		n.capacity = n.rate
		if s.Algorithm == LeakyBucket {
			n.capacity = 1
		}
	}
	if s.TokensPerSecond > 0 {
		n.rateField = "tokens_per_second"
	}
	switch {
	case s.Capacity == 0 && s.Burst > 0:
		n.capField = "burst"
	case s.Capacity == 0:
		n.capField = n.rateField // the size defaults to the rate
	}
	return n, nil
}

// sizeParams converts n's sizes, window rate and start to Params, the
// part every rate algorithm shares.
func (n *normal) sizeParams(s Spec) (engine.Params, error) {
	p := engine.Params{Algorithm: engine.Algorithm(s.Algorithm), Period: int64(n.period / time.Microsecond), Offset: -1, Reserve: s.Reserve, Calendar: s.Calendar}
	if s.Reserve && (s.Algorithm == SlidingLog || p.Windowed()) {
		return p, specErr(s, "", "reserve needs a token bucket, leaky bucket or fixed window of a fixed period")
	}
	var why string
	switch {
	case n.capacity >= 0:
		if p.Capacity, why = amountReason(n.capacity); why != "" {
			return p, specErr(s, n.capField, "%s", why)
		}
	case !s.Reserve && s.Algorithm != LeakyBucket:
		// Without a reservation no request could ever pass.
		return p, specErr(s, "", "a capacity of zero needs reserve (every request then waits its turn)")
	default:
		n.capacity = 0
	}
	if p.WindowRate, why = amountReason(n.rate); why != "" {
		return p, specErr(s, n.rateField, "%s", why)
	}
	if s.Start != nil {
		if *s.Start < 0 {
			return p, specErr(s, "start", "must not be negative")
		}
		p.Offset = int64(*s.Start/time.Microsecond) % p.Period
	}
	return p, nil
}

// bucketParams completes the Params of a token or leaky bucket: its rate
// as an exact fraction, and its debt bound.
func (n *normal) bucketParams(s Spec, p *engine.Params) error {
	var err error
	p.RateNum, p.RateDen, err = rational(n.rate, p.Period)
	if err != nil {
		return specErr(s, n.rateField, "%v", err)
	}
	if hi := float64(p.Capacity) * float64(p.RateDen); hi >= engine.MaxScaled {
		return specErr(s, n.capField, "%v is too large for this rate's precision: give the rate as rate and period in whole numbers", n.capacity)
	}
	if s.Algorithm == LeakyBucket {
		p.Reserve = true
		delay := cmp.Or(s.MaxDelay, time.Second)
		// The debt that drains in exactly delay.
		p.MaxReserved = min(engine.MulDiv(engine.Micros(delay), p.RateNum, p.RateDen), engine.MaxDebt(p))
	} else if p.MaxReserved, err = maxReserved(s.MaxReserved, p); err != nil {
		return specErr(s, "max_reserved", "%v", err)
	}
	return nil
}

// windowParams checks and completes the Params of a fixed window, a
// sliding log or a sliding window, calendar windows included.
func (n *normal) windowParams(s Spec, p *engine.Params) error {
	if s.Algorithm != FixedWindow && s.MaxReserved > 0 {
		return specErr(s, "", "max_reserved needs a token bucket, leaky bucket or fixed window")
	}
	if s.Algorithm != FixedWindow && p.Offset >= 0 {
		return specErr(s, "", "start applies to fixed windows only")
	}
	if why := calendarParams(p); why != "" {
		return specErr(s, "", "%s", why)
	}
	// Waits reach up to capacity/rate windows ahead; keep them in range.
	if windows := float64(p.Capacity/p.WindowRate + 1); windows*float64(p.Period) >= engine.MaxScaled {
		return specErr(s, "", "refilling capacity %v at rate %v per %v takes too long to express", n.capacity, n.rate, n.period)
	}
	if s.Algorithm == FixedWindow {
		var err error
		if p.MaxReserved, err = maxReserved(s.MaxReserved, p); err != nil {
			return specErr(s, "max_reserved", "%v", err)
		}
	}
	return nil
}

// maxReserved is the debt bound of a max_reserved of tokens (zero: none)
// on a limit of parameters p, in micro-tokens: at most engine.MaxDebt, which is
// also what no bound means.
func maxReserved(tokens float64, p *engine.Params) (int64, error) {
	most := engine.MaxDebt(p)
	if tokens == 0 {
		return most, nil
	}
	mr, why := amountReason(tokens)
	if why != "" {
		// ErrInvalidCost: a request's own max_reserved is part of its
		// charge (Request.Charged).
		return 0, &costError{why, ErrInvalidCost}
	}
	return min(mr, most), nil
}

// setPlain sets l.plain, and what a decision of l derives from its
// parameters alone, from l's final parameters.
func (l *Limit) setPlain() {
	l.whole = l.params.Capacity / engine.TokenScale
	l.plain = l.params.Algorithm != engine.Concurrency && l.shards == nil && l.params.Capacity >= engine.TokenScale
	l.one = engine.Charge{Cost: engine.TokenScale, Reserve: l.params.Reserve, MaxReserved: l.params.MaxReserved}
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
func (l *Limit) Params() *engine.Params { return &l.params }

// Algorithm returns how the limit counts.
func (l *Limit) Algorithm() Algorithm { return Algorithm(l.params.Algorithm) }

// Capacity returns the burst or capacity in tokens.
func (l *Limit) Capacity() float64 { return engine.FromMicroTokens(l.params.Capacity) }

// TokensPerSecond returns the long-run rate in tokens per second.
func (l *Limit) TokensPerSecond() float64 {
	if l.params.RateDen > 0 {
		return float64(l.params.RateNum) / float64(l.params.RateDen)
	}
	return float64(l.params.WindowRate) / float64(l.params.Period)
}

// cost is the cost half of Request.Charged's rule (see there): most is the
// most one request can be charged, in micro-tokens.
func (l *Limit) cost(op engine.Op, cost float64, most int64, extra bool) (int64, error) {
	if l.shards != nil && op != engine.OpRefund {
		return l.shardCost(cost)
	}
	c, err := engine.ToMicroTokens(cost)
	if op != engine.OpRefund && !extra {
		c = l.logEntry(c) // c is unused when err is set
	}
	if err == nil && c <= most {
		return c, nil
	}
	// Above the most: a number beyond it, or infinity or an amount too
	// large to count, which are beyond any. NaN is not above.
	above := err == nil || cost > engine.FromMicroTokens(most)
	switch {
	case !above:
		return 0, costInvalid(l.spec.Name, cost)
	case op == engine.OpRefund:
		return most, nil
	}
	what := fmt.Sprintf("the capacity (%v)", l.Capacity())
	if most > l.params.Capacity {
		what = fmt.Sprintf("the capacity (%v) plus max_reserved (%v)", l.Capacity(), engine.FromMicroTokens(most-l.params.Capacity))
	}
	return 0, costAbove(l.spec.Name, cost, what)
}

// logEntry is a take's charge c, or on a sliding log, an entry per take,
// at least a token (its capacity when less): a micro-token at a time, a
// key's log held a million per token (TestAttackTinyCostsGrowSlidingLog).
func (l *Limit) logEntry(c int64) int64 {
	if l.params.Algorithm != engine.SlidingLog {
		return c
	}
	return max(c, min(engine.TokenScale, l.params.Capacity))
}

// rational expresses rate tokens per period microseconds as num/den
// micro-tokens per microsecond in lowest terms. Whole micro-token rates are
// exact; others take the closest fraction with a denominator of at most
// 1e9 (a relative error below 1e-9 for any rate in range).
func rational(rate float64, periodUs int64) (num, den int64, err error) {
	micro := rate * engine.TokenScale
	if micro < 1 {
		return 0, 0, fmt.Errorf("must be at least one micro-token (0.000001) per period, got %v per %v", rate, engine.Duration(periodUs))
	}
	if micro == math.Trunc(micro) && micro < engine.MaxMicroTokens {
		n, d := int64(micro), periodUs
		g := gcd(n, d)
		n, d = n/g, d/g
		if d <= engine.MaxRateDen {
			return n, d, nil
		}
	}
	x := new(big.Rat).SetFloat64(micro)
	x.Quo(x, new(big.Rat).SetInt64(periodUs))
	n, d := bestRational(x, engine.MaxRateDen)
	if n <= 0 || n >= engine.MaxScaled {
		return 0, 0, fmt.Errorf("is out of range: %v per %v", rate, engine.Duration(periodUs))
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
