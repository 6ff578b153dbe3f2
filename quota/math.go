package quota

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// Settings tune how one limit is leased: the policy file's lease: section
// of a token-bucket or fixed-window rule. The zero value takes every
// default.
type Settings struct {
	// MaxSlice is the most tokens one process holds of one key at once.
	// Zero: MaxShare of the limit's capacity.
	MaxSlice float64
	// MaxShare is the max slice as a fraction of the limit's capacity
	// (0.003 for "0.3%"), used when MaxSlice is zero. Zero:
	// DefaultMaxShare.
	MaxShare float64
	// Term is a slice's lifetime: what a process has not used of it by
	// then goes back to the store. Zero: DefaultTerm.
	Term time.Duration
	// HotAfter is how many requests of one key a process must see within
	// one term before that key leases; a key below it stays exact. Zero:
	// DefaultHotAfter.
	HotAfter int
}

// Defaults and bounds of Settings.
const (
	// DefaultMaxShare keeps three processes within 0.9% of a hot key's
	// limit: each holds at most 0.3% of its capacity.
	DefaultMaxShare = 0.003
	// DefaultTerm is a slice's lifetime when Settings give none.
	DefaultTerm = time.Second
	// DefaultHotAfter is the requests of one key per term in one process
	// before the key leases when Settings give none.
	DefaultHotAfter = 8
	// MinSlice is the smallest slice, in tokens: a limit whose max slice
	// is smaller stays exact, where a slice would save no store call.
	MinSlice = 2
	// MinTerm and MaxTerm bound Settings.Term: a term shorter than a
	// millisecond ends before a store answers, and one longer than an
	// hour keeps a stopped process's tokens away from the fleet that
	// long.
	MinTerm = time.Millisecond
	MaxTerm = time.Hour
	// MaxHotAfter bounds Settings.HotAfter.
	MaxHotAfter = 1_000_000
)

// ErrNotLeasable is a limit that cannot be leased: only token buckets and
// fixed windows of a fixed period that do not reserve and are not
// sharded can be; every other limit is decided exactly.
var ErrNotLeasable = errors.New("quota: only token buckets and fixed windows of a fixed period, without reservations or shards, can be leased")

// Validate reports the first field of s that is out of range, by its
// name in the policy file.
func (s Settings) Validate() error {
	switch {
	case math.IsNaN(s.MaxSlice) || math.IsInf(s.MaxSlice, 0) || s.MaxSlice < 0:
		return fmt.Errorf("max_slice: %v is not a number of tokens >= 0", s.MaxSlice)
	case math.IsNaN(s.MaxShare) || s.MaxShare < 0 || s.MaxShare > 1:
		return fmt.Errorf("max_slice: a share of %v is not between 0%% and 100%% of the capacity", s.MaxShare)
	case s.Term != 0 && (s.Term < MinTerm || s.Term > MaxTerm):
		return fmt.Errorf("term: %v is not between %v and %v", s.Term, MinTerm, MaxTerm)
	case s.HotAfter < 0 || s.HotAfter > MaxHotAfter:
		return fmt.Errorf("hot_after: %d is not between 0 and %d", s.HotAfter, MaxHotAfter)
	}
	return nil
}

// WithDefaults returns s with each zero field given its default.
func (s Settings) WithDefaults() Settings {
	if s.MaxSlice == 0 && s.MaxShare == 0 {
		s.MaxShare = DefaultMaxShare
	}
	s.Term = cmp.Or(s.Term, DefaultTerm)
	s.HotAfter = cmp.Or(s.HotAfter, DefaultHotAfter)
	return s
}

// Leasable reports whether lim can be leased (see ErrNotLeasable).
func Leasable(lim *sluice.Limit) error {
	p := lim.Params()
	switch {
	case p.Algorithm != engine.TokenBucket && p.Algorithm != engine.FixedWindow:
		return fmt.Errorf("limit %q (%s): %w", lim.Name(), p.Algorithm, ErrNotLeasable)
	case p.Calendar != 0:
		return fmt.Errorf("limit %q (a calendar window): %w", lim.Name(), ErrNotLeasable)
	case p.Reserve:
		return fmt.Errorf("limit %q (reserves): %w", lim.Name(), ErrNotLeasable)
	case lim.Spec().Shards > 1:
		return fmt.Errorf("limit %q (sharded): %w", lim.Name(), ErrNotLeasable)
	}
	return nil
}

// MaxSlice returns the most micro-tokens one process holds of one key of
// a limit of capacity micro-tokens under s: s.MaxSlice, else s.MaxShare
// of the capacity (DefaultMaxShare when both are zero), never above the
// capacity. Zero means the limit stays exact: its max slice would be
// under MinSlice tokens.
func MaxSlice(capacity int64, s Settings) int64 {
	s = s.WithDefaults()
	var m float64
	if s.MaxSlice > 0 {
		m = s.MaxSlice * engine.TokenScale
	} else {
		m = s.MaxShare * float64(capacity)
	}
	m = math.Floor(min(m, float64(capacity)))
	if m < MinSlice*engine.TokenScale {
		return 0
	}
	return int64(m)
}

// Overshoot is the bound: the most tokens a fleet of processes admits of
// one key of lim, over any interval, beyond what the exact limit admits
// over it (ExactAdmits), in tokens. Each process holds at most one slice
// of a key, of at most the max slice, and only tokens of slices taken
// before the interval began can be admitted without the store counting
// them within it: processes x max slice. A key that no process sees
// HotAfter times within a term holds no slice, and its overshoot is zero.
func Overshoot(lim *sluice.Limit, s Settings, processes int) float64 {
	return float64(processes) * engine.FromMicroTokens(MaxSlice(lim.Params().Capacity, s))
}

// ExactAdmits is the most tokens the exact limit lim admits of one key
// over any interval of length d, from a full bucket: a token bucket its
// capacity plus the refill over d; a fixed window its capacity in the
// first window the interval touches and its rate at each boundary
// crossed (at most ceil(d/period) of them).
func ExactAdmits(lim *sluice.Limit, d time.Duration) float64 {
	p := lim.Params()
	us := engine.Micros(d)
	if p.Algorithm == engine.FixedWindow {
		windows := (us + p.Period - 1) / p.Period
		return engine.FromMicroTokens(p.Capacity) + float64(windows)*engine.FromMicroTokens(p.WindowRate)
	}
	return engine.FromMicroTokens(p.Capacity) + lim.TokensPerSecond()*d.Seconds()
}

// NextSize returns the size of a key's next slice, in micro-tokens, after
// a slice of size ended with left unused, held for held of its term: a
// slice used up within half its term doubles (the key is hotter than its
// slice), one that ended more than half unused halves (the key cooled),
// any other keeps its size; always within [least, most].
func NextSize(size, left, least, most int64, held, term time.Duration) int64 {
	switch {
	case left <= 0 && held < term/2:
		size *= 2
	case left*2 > size:
		size /= 2
	}
	return max(least, min(size, most))
}

// WindowUseBy returns until when a slice of a fixed window may be used:
// the end of the window the store charged it to, less margin, on the
// local clock. sent is when the slice's take was sent and d the store's
// admitted Decision of it. The store answers how long until its bucket is
// full again (ResetAfter), which is the end of its window plus one period
// for each further boundary whose rate the refill needs; that count
// follows from the tokens left. The store decided no earlier than sent,
// so sent plus the time left in its window is never after the window's
// end, whatever the two clocks read. Zero (nothing usable) when the
// decision does not describe a window.
func WindowUseBy(p *engine.Params, sent time.Time, d sluice.Decision, margin time.Duration) time.Time {
	tokens := int64(math.Round(d.Tokens * engine.TokenScale))
	if p.WindowRate <= 0 || p.Period <= 0 || tokens >= p.Capacity {
		return time.Time{}
	}
	boundaries := (p.Capacity - tokens + p.WindowRate - 1) / p.WindowRate
	left := engine.Micros(d.ResetAfter) - (boundaries-1)*p.Period
	if left <= 0 || left > p.Period {
		return time.Time{}
	}
	return sent.Add(engine.Duration(left) - margin)
}

// windowMargin is how long before its window's end a slice of a fixed
// window stops being used: room for the local clock to run slower than
// the store's over the window, a twentieth of the period up to 250ms.
func windowMargin(p *engine.Params) time.Duration {
	return min(engine.Duration(p.Period)/20, 250*time.Millisecond)
}
