// Package adaptive moves a limit's rate between a floor and a ceiling by
// how the upstream behind it answers: additive increase while it is
// healthy, multiplicative decrease when it errs or slows down (AIMD, the
// control law of TCP congestion control and of Netflix's
// concurrency-limits).
//
// The law is Next, a pure function of the configuration, the state, one
// interval's verdict and the time, which is passed in: every process of a
// fleet that shares a State through a store (Values) applies the same
// step, and a test drives it with a clock of its own. A Controller keeps
// one limit's State in a process, collects the measurements of each
// interval (Window), judges them (Config.Judge) and applies the law once
// per interval.
//
// It is adaptive rates' one home: a door keeps its limits' controllers in
// a Registry and measures each upstream answer with Measure (status, and
// latency from the request's end to the answer's first byte).
//
// The law, with its parameters (Config):
//
//   - Every Interval (default 1s) the responses measured in it are
//     judged, first per key (the key of the client that asked: the
//     rule's key, or the client's identity for a rule without one). A key
//     is unhealthy when more than ErrorRatio of its responses have an
//     error status (ErrorStatuses; an upstream that cannot be reached or
//     times out is a 502 or 504), or when their Percentile latency is
//     above TargetLatency; otherwise healthy.
//   - The interval is unhealthy when at least MinKeys distinct keys, and
//     at least MinKeyShare of the keys measured in it, are unhealthy; so
//     no single client (one key) can lower the rate every other client
//     gets by sending requests the upstream fails or answers slowly. Else
//     it is healthy when any key is healthy, and idle when none was
//     measured.
//   - Unhealthy: rate = max(Min, rate x Decrease), at most once per
//     Interval.
//   - Healthy: rate = min(Max, rate + Increase), at most once per
//     Interval, and not within an Interval of any change (a decrease is
//     given an interval to show its effect before the rate climbs again).
//
// In a fleet sharing a State (Values), each process adds its interval's
// per-key counts to the fleet's tally of that interval, kept beside the
// State in the same value and written with a compare-and-swap, and the
// interval is judged on the whole fleet's tally by the first process to
// report a later interval: a key seen by two processes is one key, and no
// process's local view overwrites another's. See Controller.
package adaptive

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/defaults"
)

// Defaults of a Config's zero fields (see Config.WithDefaults).
const (
	DefaultInterval   = time.Second
	DefaultDecrease   = 0.5
	DefaultPercentile = 90
	// DefaultIncreaseShare is the default Increase as a share of Max.
	DefaultIncreaseShare = 0.05
	// DefaultMinKeys and DefaultMinKeyShare: an interval is unhealthy
	// only when at least two distinct keys, and at least half of the
	// keys measured in it, are.
	DefaultMinKeys     = 2
	DefaultMinKeyShare = 0.5
)

// DefaultErrorStatuses are the upstream statuses that count as errors by
// default: the upstream limiting its callers (429), failing (500, 503),
// unreachable (502) or too slow (504).
var DefaultErrorStatuses = []int{429, 500, 502, 503, 504}

// Config is one adaptive limit's control.
type Config struct {
	// Min and Max bound the rate, in tokens per Per.
	Min, Max float64
	// Start is the rate the limit was written with: the rate before any
	// step, and the one its costs are scaled against (see Scale).
	Start float64
	// Per is the period of the rates: one second for tokens_per_second,
	// the period of rate + period.
	Per time.Duration
	// TargetLatency makes an interval whose Percentile latency is above
	// it unhealthy; zero judges by errors alone.
	TargetLatency time.Duration
	// Percentile (0 to 100) of an interval's latencies is compared with
	// TargetLatency (default 90).
	Percentile float64
	// ErrorStatuses are the statuses that count as errors (default
	// DefaultErrorStatuses).
	ErrorStatuses []int
	// ErrorRatio is the share of an interval's responses that may be
	// errors while it is still healthy: zero means any error is
	// unhealthy. (Policy files default to 0.1, so that a few clients
	// whose own requests fail cannot drive everyone's rate down.)
	ErrorRatio float64
	// Interval is how often the rate may move (default 1s).
	Interval time.Duration
	// Increase is added to the rate after a healthy interval, in tokens
	// per Per (default 5% of Max).
	Increase float64
	// Decrease multiplies the rate after an unhealthy interval, in (0, 1)
	// (default 0.5, TCP's).
	Decrease float64
	// MinKeys is how many distinct keys must be unhealthy in an interval
	// for it to be unhealthy (default 2): one client's failing or slow
	// requests alone never lower the rate of the others. 1 lets one key
	// do it: for a limit whose every request has the same key.
	MinKeys int
	// MinKeyShare is the share of an interval's keys, in (0, 1], that
	// must be unhealthy for it to be unhealthy (default 0.5).
	MinKeyShare float64
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	defaults.Set(&c.Per, time.Second)
	defaults.Set(&c.Start, c.Max)
	defaults.Set(&c.Percentile, DefaultPercentile)
	if c.ErrorStatuses == nil {
		c.ErrorStatuses = DefaultErrorStatuses
	}
	defaults.Set(&c.Interval, DefaultInterval)
	defaults.Set(&c.Increase, c.Max*DefaultIncreaseShare)
	defaults.Set(&c.Decrease, DefaultDecrease)
	defaults.Set(&c.MinKeys, DefaultMinKeys)
	defaults.Set(&c.MinKeyShare, DefaultMinKeyShare)
	return c
}

// FieldError is a Config field that cannot work. Field is its name in a
// policy file's adaptive block ("" for the limit's own rate).
type FieldError struct{ Field, Msg string }

func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}

// Validate reports the first field of c that cannot work, as a
// *FieldError.
func (c *Config) Validate() error {
	bad := func(field, format string, a ...any) error {
		return &FieldError{Field: field, Msg: fmt.Sprintf(format, a...)}
	}
	switch {
	case !(c.Min > 0) || math.IsInf(c.Min, 0):
		return bad("min", "must be a rate > 0 (got %v)", c.Min)
	case !(c.Max > c.Min) || math.IsInf(c.Max, 0):
		return bad("max", "must be a rate above min (%v), got %v", c.Min, c.Max)
	case c.Start < c.Min || c.Start > c.Max:
		return bad("", "the limit's rate (%v) must lie between adaptive.min (%v) and adaptive.max (%v): it is the rate the limit starts at", c.Start, c.Min, c.Max)
	case c.Percentile <= 0 || c.Percentile > 100:
		return bad("latency_percentile", "must be above 0 and at most 100 (got %v)", c.Percentile)
	case c.ErrorRatio < 0 || c.ErrorRatio >= 1:
		return bad("error_ratio", "must be at least 0 and below 1 (got %v)", c.ErrorRatio)
	case c.Interval < MinInterval:
		return bad("interval", "must be at least %v (got %v)", MinInterval, c.Interval)
	case !(c.Increase > 0) || math.IsInf(c.Increase, 0):
		return bad("increase", "must be a rate > 0 (got %v)", c.Increase)
	case !(c.Decrease > 0 && c.Decrease < 1):
		return bad("decrease", "must be a factor above 0 and below 1 (got %v)", c.Decrease)
	case c.TargetLatency < 0:
		return bad("target_latency", "must not be negative")
	case c.MinKeys < 1:
		return bad("min_keys", "must be at least 1 (got %d)", c.MinKeys)
	case !(c.MinKeyShare > 0 && c.MinKeyShare <= 1):
		return bad("min_key_share", "must be above 0 and at most 1 (got %v)", c.MinKeyShare)
	}
	for _, s := range c.ErrorStatuses {
		if s < 100 || s > 599 {
			return bad("error_statuses", "%d is not an HTTP status (100 to 599)", s)
		}
	}
	return nil
}

// MinInterval is the shortest Interval: each step of a shared rate is a
// store call.
const MinInterval = 100 * time.Millisecond

// IsError reports whether status counts as an error under c.
func (c *Config) IsError(status int) bool { return slices.Contains(c.ErrorStatuses, status) }

// Scale is what a request's cost is multiplied by so that a limit
// written at c.Start admits rate: Start/rate. The stores keep the limit
// as written (its state, its Lua and SQL are unchanged, and every store
// applies it atomically as before) while each request weighs more as the
// rate falls and less as it rises. The burst scales with the rate: it
// stays the same number of seconds of the current rate.
func (c *Config) Scale(rate float64) float64 {
	if !(rate > 0) {
		return 1
	}
	return c.Start / rate
}

// Health is an interval's verdict.
type Health uint8

// The verdicts.
const (
	// Idle: nothing was measured; the rate stays.
	Idle Health = iota
	// Healthy: the rate may rise.
	Healthy
	// Unhealthy: the rate falls.
	Unhealthy
)

func (h Health) String() string { return healthNames[min(h, 3)] }

var healthNames = [...]string{"idle", "healthy", "unhealthy", "idle"}

// Window is one key's measurements in an interval.
type Window struct {
	// Responses measured, how many of them were errors, and how many
	// came later than TargetLatency.
	Responses, Errors, Slow int
}

// Judge gives the verdict on one key's window w under c. Its Percentile
// latency is above TargetLatency exactly when fewer of its responses than
// the percentile's rank (nearest-rank: ceil(Percentile% of them)) came in
// time, so counting the slow ones is enough: no latency is kept.
func (c *Config) Judge(w Window) Health {
	switch {
	case w.Responses <= 0:
		return Idle
	case float64(w.Errors) > c.ErrorRatio*float64(w.Responses):
		return Unhealthy
	case c.TargetLatency > 0 && w.Slow > 0 && w.Responses-w.Slow < percentileRank(w.Responses, c.Percentile):
		return Unhealthy
	}
	return Healthy
}

// percentileRank is the nearest-rank of the p-th percentile of n samples.
func percentileRank(n int, p float64) int { return min(max(int(math.Ceil(p/100*float64(n))), 1), n) }

// Tally is an interval's keys: how many were measured, and how many of
// them Judge found unhealthy.
type Tally struct{ Keys, Unhealthy int }

// JudgeKeys gives an interval's verdict from its keys' (see the package
// documentation): unhealthy when at least MinKeys and MinKeyShare of its
// keys are, healthy when any key is healthy, else idle.
func (c *Config) JudgeKeys(t Tally) Health {
	switch {
	case t.Keys <= 0:
		return Idle
	case t.Unhealthy >= c.MinKeys && float64(t.Unhealthy) >= c.MinKeyShare*float64(t.Keys):
		return Unhealthy
	case t.Keys > t.Unhealthy:
		return Healthy
	}
	return Idle
}

// State is an adaptive limit's rate and when it last moved.
type State struct {
	// Rate is the current rate, in tokens per Config.Per.
	Rate float64
	// Changed is when the rate last moved, Decreased when it last fell
	// (Unix microseconds; zero: never).
	Changed, Decreased int64
}

// Initial is the state of a limit that has not moved yet.
func (c *Config) Initial() State { return State{Rate: c.Start} }

// Next is the control law: the state after an interval judged h, at now.
// See the package documentation. The rate is always kept within [Min,
// Max], so a state written under another configuration (before a
// reload) is brought within the new bounds.
func Next(c *Config, st State, h Health, now time.Time) State {
	us := now.UnixMicro()
	iv := c.Interval.Microseconds()
	rate := st.Rate
	if !(rate > 0) || math.IsInf(rate, 0) {
		rate = c.Start
	}
	switch {
	case h == Unhealthy && us-st.Decreased >= iv:
		rate *= c.Decrease
		st.Changed, st.Decreased = us, us
	case h == Healthy && us-st.Changed >= iv && rate < c.Max:
		rate += c.Increase
		st.Changed = us
	}
	st.Rate = min(max(rate, c.Min), c.Max)
	return st
}

// String encodes st for a shared store: "RATE CHANGED DECREASED".
func (st State) String() string {
	return strconv.FormatFloat(st.Rate, 'g', -1, 64) + " " + strconv.FormatInt(st.Changed, 10) + " " + strconv.FormatInt(st.Decreased, 10)
}

// ParseState decodes State.String's form.
func ParseState(s string) (State, error) {
	f := strings.Fields(s)
	if len(f) != 3 {
		return State{}, fmt.Errorf("adaptive state %q: want 3 fields", s)
	}
	rate, err := strconv.ParseFloat(f[0], 64)
	if err != nil || !(rate > 0) || math.IsInf(rate, 0) {
		return State{}, fmt.Errorf("adaptive state %q: bad rate", s)
	}
	ch, err1 := strconv.ParseInt(f[1], 10, 64)
	de, err2 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil {
		return State{}, fmt.Errorf("adaptive state %q: bad time", s)
	}
	return State{Rate: rate, Changed: ch, Decreased: de}, nil
}
