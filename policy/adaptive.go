package policy

// The settings of an algorithm_config that shape a limit in front of an
// upstream: an adaptive rate (adaptive), the burst as seconds of the rate
// (burst_seconds) and the bounds of the queue of requests held for their
// turns (max_queued, max_queue_delay); and what a Match of such a limit
// tells the gate that enforces it.

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/engine"
	"gopkg.in/yaml.v3"
)

// Reasons of a rejection by a rule's queue bounds (see Result.Reason).
const (
	// ReasonQueueFull: the request would have had to wait for its turn,
	// and the rule's max_queued requests were waiting already. Nothing
	// was charged.
	ReasonQueueFull = "queue_full"
	// ReasonQueueDelayExceeded: the request's turn would have come later
	// than the rule's max_queue_delay. Nothing was charged.
	ReasonQueueDelayExceeded = "queue_delay_exceeded"
)

// DefaultAdaptiveErrorRatio is adaptive.error_ratio's default in a
// policy file: a few clients whose own requests fail (a malformed body
// the upstream answers with a 500) do not drive the rate of every client
// of the rule down; an upstream that fails a tenth of all requests does.
const DefaultAdaptiveErrorRatio = 0.1

var adaptiveFields = []string{"min", "max", "target_latency", "error_statuses", "error_ratio", "latency_percentile", "interval", "increase", "decrease", "min_keys", "min_key_share"}

// notef records a note: what a setting works out to.
func (l *loader) notef(n *yaml.Node, path, format string, args ...any) {
	l.notes = append(l.notes, l.at(n, path, format, args...))
}

// burstSeconds reads burst_seconds into r: the burst (or, with rate and
// period, the capacity) as that many seconds of the rate, DynamoDB's
// burst credit. checkRate has reported burst_seconds given with burst or
// capacity.
func (l *loader) burstSeconds(o *obj, r *rateFields) {
	secs, n, ok := o.positive("burst_seconds")
	if !ok || o.has("burst") || o.has("capacity") {
		return
	}
	switch {
	case r.tpsOK && secs < 1:
		l.errf(n, join(o.path, "burst_seconds"), "must be at least 1 (got %v): burst credit is at least a second of the rate; for a smaller bucket give burst, which may be below the rate", secs)
	case r.tpsOK:
		r.burst, r.burstOK, r.burstSeconds = r.tps*secs, true, secs
	case r.rateOK:
		per := time.Second
		if r.periodOK {
			per = r.period
		}
		r.capacity, r.capOK, r.burstSeconds = r.rate*secs/per.Seconds(), true, secs
	}
}

// burstNote tells what burst_seconds gave: sluice check prints it.
func (l *loader) burstNote(o *obj, r rateFields, lim *sluice.Limit) {
	if r.burstSeconds <= 0 {
		return
	}
	rate, per := rateOf(r)
	l.notef(o.vals["burst_seconds"], join(o.path, "burst_seconds"), "%v seconds of %s give a burst of %v tokens", r.burstSeconds, rateText(rate, per), lim.Capacity())
}

// rateOf is the rate as written and its period.
func rateOf(r rateFields) (float64, time.Duration) {
	if r.tpsOK {
		return r.tps, time.Second
	}
	if r.periodOK {
		return r.rate, r.period
	}
	return r.rate, time.Second
}

func rateText(rate float64, per time.Duration) string {
	if per == time.Second {
		return strconv.FormatFloat(rate, 'g', -1, 64) + " tokens/s"
	}
	return strconv.FormatFloat(rate, 'g', -1, 64) + " tokens per " + shortDuration(per)
}

// shortDuration writes d as a person would: "1m", not "1m0s".
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// queueOptions reads max_queued and max_queue_delay: how many requests
// one process holds for this limit's turns, and for how long. Both need
// a limit that holds requests: a leaky bucket, or reserve: true.
func (l *loader) queueOptions(o *obj, v *variant, alg sluice.Algorithm) {
	holds := alg == sluice.LeakyBucket || v.reserve
	const needHold = "applies only to a limit that holds requests for their turn: a leaky_bucket, or reserve: true"
	if n, nn, ok := o.integer("max_queued"); ok {
		switch {
		case !holds:
			l.errf(nn, join(o.path, "max_queued"), needHold)
		case n < 1:
			l.errf(nn, join(o.path, "max_queued"), "must be at least 1 (got %d); leave it out for no bound but the listener's connections", n)
		default:
			v.maxQueued = n
		}
	}
	if d, dn, ok := o.duration("max_queue_delay"); ok {
		switch {
		case alg == sluice.LeakyBucket:
			l.errf(dn, join(o.path, "max_queue_delay"), "a leaky bucket's longest wait is its max_delay; set that instead")
		case !holds:
			l.errf(dn, join(o.path, "max_queue_delay"), needHold)
		case d <= 0:
			l.errf(dn, join(o.path, "max_queue_delay"), "must be > 0 (got %q)", dn.Value)
		default:
			v.queueDelay = d
		}
	}
}

// queueBound turns max_queue_delay into the debt a turn within it
// leaves, the MaxReserved of each request: the store then refuses a
// later turn in the very step that would have charged it, so a refused
// request is charged nothing, on every store. When max_reserved is
// tighter, it binds instead.
func (l *loader) queueBound(o *obj, v *variant) bool {
	if v.queueDelay <= 0 {
		return true
	}
	debt := v.queueDelay.Seconds() * v.limit.TokensPerSecond()
	n := o.vals["max_queue_delay"]
	if debt*engine.TokenScale < 1 {
		l.errf(n, join(o.path, "max_queue_delay"), "%v is less than a micro-token of the rate: no turn could be given", v.queueDelay)
		return false
	}
	// Without max_reserved, the limit's bound is this very debt
	// (DefaultMaxReserved), which max_queue_delay then names.
	if own := engine.FromMicroTokens(v.limit.Params().MaxReserved); o.has("max_reserved") && debt >= own {
		l.warnf(n, join(o.path, "max_queue_delay"), "max_reserved (%v tokens) is reached before max_queue_delay (%v at %v tokens/s): max_reserved binds", own, v.queueDelay, v.limit.TokensPerSecond())
		return true
	}
	v.queueDebt = debt
	return true
}

// adaptiveConfig reads the adaptive block: the rate the limit was
// written with is where it starts, and moves between min and max (rates
// in the same unit). Each request's cost is scaled by start/current
// (adaptive.Config.Scale), so the costs the rule charges must fit the
// limit at min.
func (l *loader) adaptiveConfig(o *obj, v *variant, rf rateFields) bool {
	n, ok := o.vals["adaptive"]
	if !ok {
		return true
	}
	path := join(o.path, "adaptive")
	ao := l.object(n, path, adaptiveFields)
	if ao == nil {
		return false
	}
	errsBefore := len(l.errs)
	start, per := rateOf(rf)
	c := adaptive.Config{Start: start, Per: per, ErrorRatio: DefaultAdaptiveErrorRatio}
	for _, f := range []string{"min", "max"} {
		if !ao.has(f) {
			l.errf(ao.n, join(path, f), "is required: the %s rate, in the unit of the limit's own (%s)", map[string]string{"min": "lowest", "max": "highest"}[f], rateText(start, per))
		}
	}
	c.Min, _, _ = ao.positive("min")
	c.Max, _, _ = ao.positive("max")
	c.Increase, _, _ = ao.positive("increase")
	if d, dn, ok := ao.num("decrease"); ok && (d <= 0 || d >= 1) {
		l.errf(dn, join(path, "decrease"), "must be a factor above 0 and below 1, such as 0.5 (got %v)", d)
	} else {
		c.Decrease = d
	}
	if n, nn, ok := ao.integer("min_keys"); ok && n < 1 {
		l.errf(nn, join(path, "min_keys"), "must be at least 1 (got %d): how many distinct keys must see errors or slow answers in an interval to lower the rate", n)
	} else if ok {
		c.MinKeys = n
	}
	if r, rn, ok := ao.num("min_key_share"); ok && (r <= 0 || r > 1) {
		l.errf(rn, join(path, "min_key_share"), "must be above 0 and at most 1, such as 0.5 (got %v)", r)
	} else if ok {
		c.MinKeyShare = r
	}
	if r, rn, ok := ao.num("error_ratio"); ok && (r < 0 || r >= 1) {
		l.errf(rn, join(path, "error_ratio"), "must be at least 0 (any error) and below 1 (got %v)", r)
	} else if ok {
		c.ErrorRatio = r
	}
	if p, pn, ok := ao.num("latency_percentile"); ok && (p <= 0 || p > 100) {
		l.errf(pn, join(path, "latency_percentile"), "must be above 0 and at most 100, such as 90 (got %v)", p)
	} else {
		c.Percentile = p
	}
	if d, dn, ok := ao.duration("target_latency"); ok && d <= 0 {
		l.errf(dn, join(path, "target_latency"), "must be > 0 (leave it out to judge the upstream by its errors alone)")
	} else {
		c.TargetLatency = d
	}
	if d, dn, ok := ao.duration("interval"); ok && d < adaptive.MinInterval {
		l.errf(dn, join(path, "interval"), "must be at least %v (got %q): each step of a rate shared through the store is a store call", adaptive.MinInterval, dn.Value)
	} else {
		c.Interval = d
	}
	if items, _, ok := ao.list("error_statuses"); ok {
		c.ErrorStatuses = []int{}
		for i, it := range items {
			ip := fmt.Sprintf("%s[%d]", join(path, "error_statuses"), i)
			f, good := l.number(it, ip)
			if good && (f != math.Trunc(f) || f < 100 || f > 599) {
				l.errf(it, ip, "must be an HTTP status from 100 to 599 (got %v)", it.Value)
				good = false
			}
			if good {
				c.ErrorStatuses = append(c.ErrorStatuses, int(f))
			}
		}
	}
	if len(l.errs) > errsBefore {
		return false
	}
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		at, field := ao.n, ""
		if fe, ok := err.(*adaptive.FieldError); ok {
			field = fe.Field
			if fn, ok := ao.vals[field]; ok {
				at = fn
			}
			err = fmt.Errorf("%s", fe.Msg)
		}
		if field != "" {
			path = join(path, field)
		}
		l.errf(at, path, "%v", err)
		return false
	}
	// At min each request weighs start/min times its cost: it must still
	// fit the limit, or no request could pass while the upstream is sick.
	scale := c.Scale(c.Min)
	for _, cc := range []struct {
		field string
		cost  float64
	}{{"fixed_cost", v.cost.fixed}, {"default_cost", v.cost.def}} {
		if _, err := (sluice.Request{Limit: v.limit, Cost: cc.cost * scale, Reserve: v.reserve, MaxReserved: v.queueDebt}).Charged(engine.OpTake); err != nil {
			at := ao.vals["min"]
			l.errf(at, join(path, "min"), "at min each request weighs %s/min = %v times its %s (%v): %v tokens, above what the limit holds (%v), so no request could pass; raise min, or the burst (burst, burst_seconds or capacity)", strconv.FormatFloat(c.Start, 'g', -1, 64), scale, cc.field, cc.cost, cc.cost*scale, v.limit.Capacity())
			return false
		}
	}
	v.adaptive, v.adaptiveLine = &c, ao.n.Line
	l.notef(ao.n, path, "starts at %s and moves between %v and %v: +%v per %v healthy, x%v per %v when at least %d keys and %v%% of the keys see more than %v%% errors (%s)%s", rateText(c.Start, per), c.Min, c.Max, c.Increase, c.Interval, c.Decrease, c.Interval, c.MinKeys, c.MinKeyShare*100, c.ErrorRatio*100, statusList(c.ErrorStatuses), latencyText(&c))
	return true
}

func statusList(ss []int) string {
	parts := make([]string, len(ss))
	for i, s := range ss {
		parts[i] = strconv.Itoa(s)
	}
	return strings.Join(parts, ", ")
}

func latencyText(c *adaptive.Config) string {
	if c.TargetLatency <= 0 {
		return ""
	}
	return fmt.Sprintf(" or a p%v latency above %v", c.Percentile, c.TargetLatency)
}

// adaptiveWarnings warns of adaptive limits in a file without a reverse
// proxy: only the responses that sluice forwards (the reverse proxy, the
// Go middleware) move a rate.
func (l *loader) adaptiveWarnings(p *Policy) {
	if p == nil || l.server.ProxyUpstream != "" {
		return
	}
	for _, r := range p.Rules {
		for _, v := range r.variants() {
			if v.adaptive != nil {
				l.warnf(&yaml.Node{Line: v.adaptiveLine}, "rules."+r.Name, "limit %q is adaptive, but there is no proxy section: its rate moves only with the responses sluice forwards (proxy, or the Go middleware), so under serve without a proxy it stays at %v", v.limit.Name(), v.adaptive.Start)
			}
		}
	}
}

// Adaptive returns the adaptive control of the match's limit: nil when
// its rate is fixed.
func (m *Match) Adaptive() *adaptive.Config {
	if m.v == nil {
		return nil
	}
	return m.v.adaptive
}

// AtScale charges the match at an adaptive rate: the request's cost is
// multiplied by scale (adaptive.Config.Scale of the current rate), and
// Enforce reports the limit's numbers (its size, the tokens and the whole
// tokens left) divided by it, in the rule's own units. The limit itself,
// and the state the store keeps, are the same at every rate.
func (m *Match) AtScale(scale float64) {
	if !(scale > 0) || math.IsInf(scale, 0) {
		return
	}
	base := m.Scale()
	m.Request.Cost = m.Request.Cost / base * scale
	m.scale = scale
}

// Scale is the factor AtScale set, 1 when none: an amount charged or
// given back later for the match's request (a settlement of its actual
// cost) is multiplied by it too.
func (m *Match) Scale() float64 {
	if m.scale == 0 {
		return 1
	}
	return m.scale
}

// Queue reports whether the match's request may be held for its turn
// (an enforce-mode leaky bucket, or reserve: true), and the rule's
// max_queued (0: no bound).
func (m *Match) Queue() (holds bool, maxQueued int) {
	if m.v == nil || (m.Rule != nil && m.Rule.Mode == Shadow) || m.Request.NoReserve {
		return false, 0
	}
	lim := m.Request.Limit
	holds = m.Request.Reserve || (lim != nil && lim.Params().Reserve)
	return holds, m.v.maxQueued
}

// QueueFull marks the match as finding its rule's queue full: its
// request is admitted only if it needs no wait (sluice.Request.NoReserve,
// decided by the store in the same step, so a refusal charges nothing),
// and a rejection says queue_full. room is how long until the queue has
// room again (its first held request leaves): the wait a rejection
// reports when only a turn could ever admit the request (a bucket of
// capacity 0, a cost above the capacity).
func (m *Match) QueueFull(room time.Duration) {
	m.Request.NoReserve = true
	m.queueFull = true
	m.queueRoom = room
}

// queueRefuse decides, without the store, a match of a full queue whose
// request only a turn could admit: it is refused with the queue's room
// as its wait. It reports false when a turn could not admit it either (a
// cost that can never succeed).
func (r *Result) queueRefuse(op engine.Op) bool {
	m := &r.Match
	if !m.queueFull {
		return false
	}
	turn := m.Request
	turn.NoReserve = false
	if _, err := turn.Charged(op); err != nil {
		return false
	}
	r.Decision = sluice.Decision{Allowed: false, RetryAfter: max(m.queueRoom, time.Millisecond)}
	if l := m.Request.Limit; l != nil {
		r.Decision.Capacity, r.Decision.Rule = int64(l.Capacity()), l.Name()
	}
	return true
}

// queueDelayBinds reports that the match's turns are bounded by
// max_queue_delay: a rejection of its reservation is that bound's.
func (m *Match) queueDelayBinds() bool {
	return m.v != nil && m.v.queueDebt > 0 && !m.Request.NoReserve
}

// unscale reports r's decision in the rule's own units when its match
// was charged at an adaptive rate (see Match.AtScale).
func (r *Result) unscale() {
	s := r.Match.scale
	if s == 0 || s == 1 {
		return
	}
	d := &r.Decision
	if lim := r.Match.Request.Limit; lim != nil {
		d.Capacity = int64(math.Floor(lim.Capacity()/s + 1e-9))
	}
	d.Tokens /= s
	d.Remaining = 0
	if d.Tokens > 0 {
		d.Remaining = min(int64(math.Floor(d.Tokens+1e-9)), d.Capacity)
	}
}

// AdaptiveLimit is an adaptive limit of a policy: its name and control.
type AdaptiveLimit struct {
	// Name is the limit's: a rule's, or "RULE.TIER".
	Name   string
	Config *adaptive.Config
}

// AdaptiveLimits lists the policy's adaptive limits in file order.
func (p *Policy) AdaptiveLimits() []AdaptiveLimit {
	var out []AdaptiveLimit
	for _, r := range p.Rules {
		for _, v := range r.variants() {
			if v.adaptive != nil {
				out = append(out, AdaptiveLimit{Name: v.limit.Name(), Config: v.adaptive})
			}
		}
	}
	return out
}

// variants are the rule's limits with their settings: its own, then its
// tiers'.
func (r *Rule) variants() []*variant {
	var out []*variant
	if r.own != nil {
		out = append(out, r.own)
	}
	for _, t := range r.Tiers {
		if t.v != nil {
			out = append(out, t.v)
		}
	}
	return out
}
