package httpgate

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/internal/deadline"
	"github.com/sluicehq/sluice/policy"
)

// shaping is what a Gate keeps about the upstream it stands in front of,
// by limit name so that it outlives a reload that keeps the name (as
// bucket state does): the adaptive rates and the queues of held requests.
type shaping struct {
	rates  adaptive.Registry
	mu     sync.Mutex // queues
	queues map[string]*ruleQueue
}

// initShaping readies the adaptive rates: kept in the store when it
// shares values (Redis), counted in the metrics.
func (g *Gate) initShaping() {
	g.shaping.rates.Shared = g.fleetValues()
	g.shaping.rates.Logger = g.opts.Logger
	g.shaping.rates.OnRate = func(name string, rate float64, c *adaptive.Config) {
		g.shapingMetrics().AdaptiveRate(name, rate/c.Per.Seconds(), c.Min/c.Per.Seconds())
	}
}

// AdaptiveRate is the state of one adaptive limit (Gate.AdaptiveRates).
type AdaptiveRate struct {
	// Rule names the limit: a rule's name, or RULE.TIER.
	Rule string `json:"rule"`
	// Rate is the rate in force, Start the one the limit was written
	// with, Min and Max its bounds: tokens per Per.
	Rate  float64 `json:"rate"`
	Start float64 `json:"start"`
	Min   float64 `json:"min"`
	Max   float64 `json:"max"`
	// Per is the period of the rates (one second for tokens_per_second).
	Per time.Duration `json:"per_ns"`
}

// AdaptiveRates reports the rate in force of every adaptive limit of the
// current policy, in file order; a limit no request has reached yet is
// at its Start.
func (g *Gate) AdaptiveRates() []AdaptiveRate {
	var out []AdaptiveRate
	for _, al := range g.Policy().AdaptiveLimits() {
		c := al.Config
		r := AdaptiveRate{Rule: al.Name, Rate: c.Start, Start: c.Start, Min: c.Min, Max: c.Max, Per: c.Per}
		if ctl := g.shaping.rates.Get(al.Name); ctl != nil {
			ctl.SetConfig(c) // a reload's bounds apply before its first request
			r.Rate = ctl.Rate()
		}
		out = append(out, r)
	}
	return out
}

// adapt charges the adaptive matches of ms at their limits' current
// rates, first taking an interval's step where one is due.
func (g *Gate) adapt(ctx context.Context, ms []policy.Match) {
	for i := range ms {
		cfg := ms[i].Adaptive()
		if cfg == nil {
			continue
		}
		ctl := g.shaping.rates.Controller(ctx, ms[i].Request.Limit.Name(), cfg, g.lim.Now())
		ms[i].AtScale(ctl.Scale())
	}
}

// wrapper is a store that wraps another (the metrics package's
// instrumented store), which Unwrap returns.
type wrapper interface {
	Unwrap() sluice.Store
}

// beneath finds, beneath any wrappers of s, a store that is a T.
func beneath[T any](s sluice.Store) (T, bool) {
	for range 8 {
		if v, ok := s.(T); ok {
			return v, true
		}
		u, ok := s.(wrapper)
		if !ok {
			break
		}
		s = u.Unwrap()
	}
	var zero T
	return zero, false
}

// serveMeasured serves an admitted request with next and, when v has
// adaptive limits, tells their controllers how the upstream answered to
// the client's key (adaptive.Measure).
func (g *Gate) serveMeasured(next http.Handler, w http.ResponseWriter, r *http.Request, v *policy.Verdict) {
	type measured struct {
		ctl *adaptive.Controller
		key string
	}
	var ms []measured
	for i := range v.Results {
		m := &v.Results[i].Match
		if m.Adaptive() == nil {
			continue
		}
		if ctl := g.shaping.rates.Get(m.Request.Limit.Name()); ctl != nil {
			ms = append(ms, measured{ctl, evidenceKey(m)})
		}
	}
	if len(ms) == 0 {
		next.ServeHTTP(w, r)
		return
	}
	status, latency := adaptive.Measure(next, w, r, g.lim.Now)
	ctx, cancel := deadline.WithTimeout(context.WithoutCancel(r.Context()), g.opts.StoreTimeout)
	defer cancel()
	now := g.lim.Now()
	for _, m := range ms {
		m.ctl.Observe(m.key, status, latency)
		g.shaping.rates.Tick(ctx, m.ctl, now)
	}
}

// evidenceKey is whose answer a response of m is, for an adaptive
// limit's per-key verdict: the rule's key, or, for a rule without
// limit_keys (one key for every client), the client's identity (its
// verified JWT subject, else its address).
func evidenceKey(m *policy.Match) string {
	if m.Rule != nil && len(m.Rule.LimitKeys) == 0 && m.Identity != "" {
		return m.Identity
	}
	return m.Request.Key
}
