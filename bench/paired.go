package bench

import (
	"math"
	"slices"
)

// Pair is one alternation of a paired comparison: the same load driven
// for the same time against the floor and then sluice (or sluice, then
// the floor), one right after the other, so that whatever the machine
// does over seconds (another guest's load, a frequency change) falls on
// both sides of a pair alike.
type Pair struct {
	Floor, Sluice Side
}

// Side is what one side of a Pair measured: the calls it answered, the
// wall time they took, and the server process's CPU time over it, in
// seconds.
type Side struct {
	Calls     int64
	Wall, CPU float64
}

// Rate is the side's calls per second.
func (s Side) Rate() float64 { return float64(s.Calls) / s.Wall }

// PerCall is the server's CPU per call in microseconds.
func (s Side) PerCall() float64 { return s.CPU * 1e6 / float64(s.Calls) }

// Summary is a paired comparison's answer: for each statistic, the median
// over the pairs and its 95% interval (see MedianInterval).
type Summary struct {
	Pairs int
	// Extra is sluice's CPU per call less the floor's, in µs.
	Extra Interval
	// CPURatio is the floor's CPU per call over sluice's: the share of the
	// floor's calls per second that sluice answers when the server's cores
	// are what limits both (a saturated server).
	CPURatio Interval
	// RateRatio is sluice's calls per second over the floor's, as this
	// load drove them (bounded by the client as much as the server when
	// the server is not saturated).
	RateRatio Interval
}

// Interval is a median with the bounds of its 95% interval.
type Interval struct{ Lo, Median, Hi float64 }

// Summarize computes the Summary of pairs, which it does not modify.
func Summarize(pairs []Pair) Summary {
	extra := make([]float64, len(pairs))
	cpu := make([]float64, len(pairs))
	rate := make([]float64, len(pairs))
	for i, p := range pairs {
		extra[i] = p.Sluice.PerCall() - p.Floor.PerCall()
		cpu[i] = p.Floor.PerCall() / p.Sluice.PerCall()
		rate[i] = p.Sluice.Rate() / p.Floor.Rate()
	}
	return Summary{Pairs: len(pairs), Extra: MedianInterval(extra), CPURatio: MedianInterval(cpu), RateRatio: MedianInterval(rate)}
}

// MedianInterval returns the median of xs and a distribution-free
// interval that holds the true median with at least 95% confidence: the
// j-th smallest and j-th largest of the n values, for the largest j with
// P(Binomial(n, 1/2) < j) <= 2.5%. It assumes nothing of the values'
// distribution (round-to-round noise on a shared machine is neither
// normal nor symmetric), only that the values are independent. With
// fewer than 6 values no such j exists and the interval is the whole
// range. xs is not modified.
func MedianInterval(xs []float64) Interval {
	n := len(xs)
	if n == 0 {
		return Interval{math.NaN(), math.NaN(), math.NaN()}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	j := rankBound(n)
	if j < 1 {
		return Interval{s[0], med, s[n-1]}
	}
	return Interval{s[j-1], med, s[n-j]}
}

// rankBound is MedianInterval's j: the largest j with
// P(Binomial(n, 1/2) <= j-1) <= 0.025, or 0 when even j = 1 exceeds it.
func rankBound(n int) int {
	// P(X = k) for X ~ Binomial(n, 1/2), summed from k = 0, in logs to
	// stay finite for large n.
	cdf := 0.0
	for k := 0; k <= n; k++ {
		lg, _ := math.Lgamma(float64(n + 1))
		lk, _ := math.Lgamma(float64(k + 1))
		lnk, _ := math.Lgamma(float64(n - k + 1))
		cdf += math.Exp(lg - lk - lnk - float64(n)*math.Ln2)
		if cdf > 0.025 {
			return k // P(X <= k-1) <= 0.025 < P(X <= k): j - 1 = k - 1
		}
	}
	return 0
}
