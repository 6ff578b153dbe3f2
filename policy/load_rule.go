package policy

// The rules section: each rule, its tiers, match conditions,
// algorithm_config and costs.

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/settle"
	"gopkg.in/yaml.v3"
)

// rules reads the rules list into p: at least one rule, each named once.
func (l *loader) rules(o *obj, p *Policy) {
	items, rulesN, ok := o.list("rules")
	switch {
	case o.has("xds") && o.has("rules"):
		// The control plane's limits replace the file's policy whole.
		l.errf(o.n, "rules", "not with xds: the control plane sends every limit (move these rules to a file of their own or to the control plane)")
	case o.has("xds"):
		// The limits come from the control plane (envoyrls/xds).
	case !o.has("rules"):
		l.errf(o.n, "rules", "is required: at least one rule")
	case ok && len(items) == 0:
		l.errf(rulesN, "rules", "must hold at least one rule")
	}
	for i, it := range items {
		r := l.rule(it, fmt.Sprintf("rules[%d]", i), p.Settings.MissingKey)
		if r == nil {
			continue
		}
		if prev, dup := p.byName[r.Name]; dup {
			l.errf(it, fmt.Sprintf("rules[%d].name", i), "%q is already the name of the rule at line %d", r.Name, prev.Line)
			continue
		}
		p.byName[r.Name] = r
		p.Rules = append(p.Rules, r)
	}
}

// indexLimits names every limit ("RULE", "RULE.TIER") and checks that no
// two share a name: their buckets would be shared.
func (l *loader) indexLimits(p *Policy) {
	for _, r := range p.Rules {
		add := func(lim *sluice.Limit) {
			if lim == nil {
				return
			}
			if _, dup := p.limits[lim.Name()]; dup {
				l.errf(&yaml.Node{Line: r.Line}, "rules."+r.Name, "limit name %q is used twice (a rule named like another rule's tier); rename one, as their buckets would be shared", lim.Name())
				return
			}
			p.limits[lim.Name()] = namedLimit{lim, r}
		}
		if r.own != nil {
			add(r.own.limit)
		}
		for _, t := range r.Tiers {
			add(t.Limit)
		}
	}
}

var ruleFields = []string{"name", "limit_keys", "match", "tiers", "algorithm", "algorithm_config", "mode", "on_store_error", "missing_key"}

// rule reads one rule; nil when it has no usable name or algorithm.
func (l *loader) rule(n *yaml.Node, path string, missing MissingKey) *Rule {
	o := l.object(n, path, ruleFields)
	if o == nil {
		return nil
	}
	r := &Rule{Line: o.n.Line, MissingKey: missing}
	name, nameN, ok := o.str("name")
	switch {
	case !o.has("name"):
		l.errf(o.n, join(path, "name"), "is required")
	case ok && !validName(name):
		l.errf(nameN, join(path, "name"), "%q must be 1 to 64 of A-Z a-z 0-9 _ . -", name)
	case ok:
		r.Name = name
	}
	alg := sluice.TokenBucket
	if v, an, ok := o.str("algorithm"); ok {
		a, err := sluice.ParseAlgorithm(v)
		if err != nil {
			l.errf(an, join(path, "algorithm"), "unknown algorithm %q (want token_bucket, fixed_window, sliding_log, sliding_window, leaky_bucket or concurrency)", v)
			return nil
		}
		alg = a
	}
	r.Algorithm = alg
	l.behaviour(o, r)
	l.limitKeys(o, r)
	if mn, ok := o.vals["match"]; ok {
		r.match = l.match(mn, join(path, "match"))
	}
	l.ruleLimits(o, r)
	if r.Name == "" {
		return nil
	}
	return r
}

// behaviour reads mode, on_store_error and missing_key: whether the rule
// enforces, and what it does when the store fails or a key is missing.
func (l *loader) behaviour(o *obj, r *Rule) {
	either(o, "mode", modeNames, &r.Mode)
	either(o, "on_store_error", onStoreErrorNames, &r.OnStoreError)
	either(o, "missing_key", missingKeyNames, &r.MissingKey)
}

// limitKeys reads limit_keys: the request attributes that make up the
// bucket key, each once.
func (l *loader) limitKeys(o *obj, r *Rule) {
	path := o.path
	if vals, nodes, ok := o.strList("limit_keys"); ok {
		seen := map[string]bool{}
		for i, v := range vals {
			p := fmt.Sprintf("%s.limit_keys[%d]", path, i)
			src, msg := parseSource(v, false)
			if msg != "" {
				l.errf(nodes[i], p, "%s", msg)
				continue
			}
			if seen[src.text] {
				l.errf(nodes[i], p, "%q is listed twice", v)
				continue
			}
			seen[src.text] = true
			l.noteJWT(src, nodes[i], p)
			l.warnAddressHeader(src, nodes[i], p)
			r.keys = append(r.keys, src)
			r.LimitKeys = append(r.LimitKeys, v)
		}
	}
}

// AddressHeaders are the headers that carry a client's address as the
// client, or a proxy in front, states it: X-Forwarded-For and Forwarded,
// lists a proxy appends to, first.
var AddressHeaders = []string{"X-Forwarded-For", "Forwarded",
	"X-Real-Ip", "True-Client-Ip", "X-Client-Ip", "Client-Ip", "Cf-Connecting-Ip",
	"Fastly-Client-Ip", "X-Cluster-Client-Ip", "X-Original-Forwarded-For",
	"X-Forwarded", "Forwarded-For", "X-Envoy-External-Address"}

// warnAddressHeader warns about a key read from one of AddressHeaders,
// which the client can set to a new value with each request.
func (l *loader) warnAddressHeader(src source, n *yaml.Node, path string) {
	if src.kind == srcHeader && slices.Contains(AddressHeaders, src.name) {
		l.warnf(n, path, "%s is the client's address as the client, or a proxy in front, states it (X-Forwarded-For and Forwarded begin with what the client sent): unless every proxy in front overwrites it, a client sending a new one with each request gets a fresh bucket each time; key on ip:address, which reads client_header (X-Forwarded-For by default) only from trusted_proxies", src.text)
	}
}

// ruleLimits compiles the rule's own algorithm_config and its tiers; the
// rule's Limit is its own, else its last tier's.
func (l *loader) ruleLimits(o *obj, r *Rule) {
	path := o.path
	limName := cmp.Or(r.Name, "rule")
	if cn, ok := o.vals["algorithm_config"]; ok {
		r.own = l.algConfig(cn, join(path, "algorithm_config"), r.Algorithm, limName)
	}
	if tn, ok := o.vals["tiers"]; ok {
		r.Tiers = l.tiers(o, tn, join(path, "tiers"), r.Algorithm, limName, r.own != nil)
	}
	switch {
	case !o.has("algorithm_config") && !o.has("tiers"):
		l.errf(o.n, join(path, "algorithm_config"), "is required (or tiers)")
	case r.own != nil:
		r.Limit = r.own.limit
	case len(r.Tiers) > 0:
		r.Limit = r.Tiers[len(r.Tiers)-1].Limit
	}
}

func (l *loader) tiers(ro *obj, n *yaml.Node, path string, alg sluice.Algorithm, rule string, hasOwn bool) []*Tier {
	if n.Kind != yaml.SequenceNode {
		l.errf(n, path, "must be a list of tiers (got %s)", kindName(n))
		return nil
	}
	if len(n.Content) == 0 {
		l.errf(n, path, "must hold at least one tier (or leave tiers out)")
		return nil
	}
	var out []*Tier
	names := map[string]bool{}
	for i, it := range n.Content {
		tp := fmt.Sprintf("%s[%d]", path, i)
		o := l.object(it, tp, []string{"name", "match", "algorithm_config"})
		if o == nil {
			continue
		}
		t := &Tier{}
		name, nn, ok := o.str("name")
		switch {
		case !o.has("name"):
			l.errf(o.n, join(tp, "name"), "is required")
		case ok && !validName(name):
			l.errf(nn, join(tp, "name"), "%q must be 1 to 64 of A-Z a-z 0-9 _ . -", name)
		case ok && names[name]:
			l.errf(nn, join(tp, "name"), "%q is already a tier of this rule", name)
		case ok:
			t.Name = name
			names[name] = true
		}
		if mn, ok := o.vals["match"]; ok {
			t.match = l.match(mn, join(tp, "match"))
		}
		last := i == len(n.Content)-1
		if len(t.match) == 0 && !last {
			l.errf(o.n, tp, "has no match, so it takes every request and the tiers after it are never used; give it a match or move it last")
		}
		if len(t.match) == 0 && last && hasOwn {
			l.errf(o.n, tp, "has no match, so it takes every request and the rule's own algorithm_config is never used; give it a match or remove one of them")
		}
		cn, ok := o.vals["algorithm_config"]
		if !ok {
			l.errf(o.n, join(tp, "algorithm_config"), "is required")
			continue
		}
		t.v = l.algConfig(cn, join(tp, "algorithm_config"), alg, rule+"."+t.Name)
		if t.v == nil || t.Name == "" {
			continue
		}
		t.Limit = t.v.limit
		out = append(out, t)
	}
	return out
}

func (l *loader) match(n *yaml.Node, path string) []cond {
	o := l.object(n, path, nil)
	if o == nil {
		return nil
	}
	var out []cond
	for i := 0; i+1 < len(o.n.Content); i += 2 {
		k := deref(o.n.Content[i])
		name := k.Value
		v, ok := o.vals[name]
		if !ok {
			continue // reported by object
		}
		p := join(path, name)
		var c cond
		if name == "path_prefix" {
			c = cond{src: source{kind: srcPath, text: name}, prefix: true}
		} else {
			src, msg := parseSource(name, true)
			if msg != "" {
				l.errf(k, p, "%s", msg)
				continue
			}
			c.src = src
			l.noteJWT(src, k, p)
		}
		values, ok := l.matchValues(v, p)
		if !ok {
			continue
		}
		for j, val := range values {
			switch {
			case c.prefix:
				if !strings.HasPrefix(val, "/") {
					l.errf(v, p, "%q must start with /", val)
					ok = false
				}
				values[j] = cleanPath(val)
			case c.src.kind == srcMethod:
				values[j] = method(val)
			case c.src.kind == srcHost:
				values[j] = hostOnly(val)
			case c.src.kind == srcPath:
				values[j] = cleanPath(val)
			}
		}
		if !ok {
			continue
		}
		c.values = values
		out = append(out, c)
	}
	return out
}

// matchValues reads a condition's value: one scalar, or a list of them
// (any of which matches).
func (l *loader) matchValues(n *yaml.Node, path string) ([]string, bool) {
	scalar := func(s *yaml.Node, p string) (string, bool) {
		s = deref(s)
		if s.Kind != yaml.ScalarNode || isNull(s) {
			l.errf(s, p, "must be a value or a list of values (got %s)", kindName(s))
			return "", false
		}
		return s.Value, true
	}
	if n.Kind == yaml.SequenceNode {
		if len(n.Content) == 0 {
			l.errf(n, path, "an empty list matches nothing; give at least one value")
			return nil, false
		}
		var out []string
		ok := true
		for i, it := range n.Content {
			v, good := scalar(it, fmt.Sprintf("%s[%d]", path, i))
			ok = ok && good
			out = append(out, v)
		}
		return out, ok
	}
	v, ok := scalar(n, path)
	return []string{v}, ok
}

var (
	costFields   = []string{"cost_source", "fixed_cost", "default_cost", "min_cost", "settle_from", "unsettled_cost", "stream_usage"}
	tbFields     = []string{"tokens_per_second", "rps", "burst", "rate", "period", "capacity", "reserve", "max_reserved", "shards", "burst_seconds", "max_queue_delay", "max_queued", "lease"}
	lbFields     = []string{"tokens_per_second", "rps", "rate", "period", "max_delay", "max_queue_delay", "max_queued"}
	fwFields     = []string{"rate", "period", "capacity", "start", "reserve", "max_reserved", "shards", "max_queued", "timezone", "lease"}
	slFields     = []string{"rate", "period", "capacity", "shards"}
	swFields     = []string{"rate", "period", "capacity", "timezone"}
	allAlgFields = []string{"tokens_per_second", "rps", "burst", "rate", "period", "capacity", "start", "reserve", "max_reserved", "max_delay", "cost_source", "fixed_cost", "default_cost", "min_cost", "shards", "settle_from", "unsettled_cost", "stream_usage", "burst_seconds", "max_queue_delay", "max_queued", "max_in_flight", "lease", "timezone"}
)

// commonAlgFields are the fields every algorithm takes besides its own.
var commonAlgFields = []string{"jitter", "adaptive"}

func algFields(a sluice.Algorithm) []string {
	switch a {
	case sluice.LeakyBucket:
		return append(lbFields, costFields...)
	case sluice.FixedWindow:
		return append(fwFields, costFields...)
	case sluice.SlidingLog:
		return append(slFields, costFields...)
	case sluice.SlidingWindow:
		return append(swFields, costFields...)
	case sluice.Concurrency:
		return ccFields // one slot per request: no cost
	}
	return append(tbFields, costFields...)
}

// algConfig validates an algorithm_config for alg and compiles it into a
// limit called name.
func (l *loader) algConfig(n *yaml.Node, path string, alg sluice.Algorithm, name string) *variant {
	o := l.object(n, path, append(allAlgFields, commonAlgFields...))
	if o == nil {
		return nil
	}
	errsBefore := len(l.errs)
	l.dropInapplicable(o, alg)
	if alg == sluice.Concurrency {
		return l.concurrencyConfig(o, path, name)
	}
	spec := sluice.Spec{Name: name, Algorithm: alg}
	rf := l.rate(o, alg)
	rf.apply(&spec)
	v := &variant{cost: costSpec{fixed: 1, def: 1, min: 1}}
	l.algOptions(o, &spec, v)
	if spec.Capacity == sluice.ZeroCapacity {
		// A bucket of nothing passes only reservations: every request of
		// it reserves, whatever the caller asks.
		if !v.reserve {
			l.errf(rf.capN, join(path, "capacity"), "0 needs reserve: true (every request then waits its turn, cost/rate after the one before); without it no request could pass")
		}
		spec.Reserve = v.reserve
	}
	costN := l.cost(o, path, &v.cost)
	l.settleFrom(o, v, &spec)
	l.queueOptions(o, v, alg)
	if len(l.errs) > errsBefore {
		return nil
	}
	lim, err := sluice.NewLimit(spec)
	if at, field, reason := specErrorAt(o, err); at != nil {
		// NewLimit decides what a limit may be, for code and files alike;
		// the file says where.
		l.errf(at, join(path, field), "%s", reason)
		return nil
	}
	if err != nil {
		msg := err.Error()
		if i := strings.Index(msg, "\": "); i >= 0 {
			msg = msg[i+3:]
		}
		l.errf(o.n, path, "%s", msg)
		return nil
	}
	if lim = l.boundDebt(o, spec, lim, v); lim == nil {
		return nil
	}
	v.limit = lim
	settleDefault(v)
	if !l.queueBound(o, v) || !l.usableCosts(o, v, costN) || !l.adaptiveConfig(o, v, rf) || !l.leaseConfig(o, v, alg) {
		return nil
	}
	l.burstNote(o, rf, lim)
	return v
}

// dropInapplicable reports, and forgets, the fields of an algorithm_config
// that another algorithm takes but alg does not.
func (l *loader) dropInapplicable(o *obj, alg sluice.Algorithm) {
	allowed := algFields(alg)
	for i := 0; i+1 < len(o.n.Content); i += 2 {
		k := deref(o.n.Content[i])
		if _, ok := o.vals[k.Value]; ok && !slices.Contains(allowed, k.Value) && !slices.Contains(commonAlgFields, k.Value) {
			l.errf(k, join(o.path, k.Value), "does not apply to %s (it takes %s)", alg, strings.Join(allowed, ", "))
			delete(o.vals, k.Value)
		}
	}
}

// rateFields are an algorithm_config's rate and size, each with whether
// it was given and valid.
type rateFields struct {
	tps, rate, burst, capacity              float64
	period                                  time.Duration
	tpsOK, rateOK, periodOK, burstOK, capOK bool
	// calendar is a period of day, week, month or year (sluice.Calendar).
	calendar sluice.Calendar
	// burstSeconds is burst_seconds: the burst as seconds of the rate
	// (burst = rate x seconds); zero when not given or not valid.
	burstSeconds float64
	// capN is the capacity's node: a capacity of 0 is checked against
	// reserve once that is read (algOptions).
	capN *yaml.Node
}

// rate reads the rate and size fields of an algorithm_config for alg:
// tokens_per_second (or rps) with burst, or rate, period and capacity.
func (l *loader) rate(o *obj, alg sluice.Algorithm) rateFields {
	var r rateFields
	r.tps, _, r.tpsOK = o.positive("tokens_per_second")
	rps, rpsN, rpsOK := o.positive("rps")
	if o.has("tokens_per_second") && o.has("rps") {
		l.errf(rpsN, join(o.path, "rps"), "is an alias of tokens_per_second: give one of them")
	} else if rpsOK {
		r.tps, r.tpsOK = rps, true
	}
	r.rate, _, r.rateOK = o.positive("rate")
	var periodN *yaml.Node
	if pn, ok := o.vals["period"]; ok && pn.Kind == yaml.ScalarNode {
		r.calendar, _ = engine.ParseCalendar(pn.Value)
	}
	if r.calendar == 0 {
		r.period, periodN, r.periodOK = o.duration("period")
	}
	if r.periodOK && r.period <= 0 {
		l.errf(periodN, join(o.path, "period"), "must be > 0 (got %q)", periodN.Value)
		r.periodOK = false
	}
	r.burst, _, r.burstOK = o.positive("burst")
	// Capacity 0 is a bucket that holds nothing: with reserve, every
	// request waits its turn (see algOptions).
	if r.capacity, r.capN, r.capOK = o.num("capacity"); r.capOK && r.capacity < 0 {
		l.errf(r.capN, join(o.path, "capacity"), "must be >= 0 (got %v)", r.capacity)
		r.capOK = false
	}
	l.checkRate(o, alg, r)
	l.burstSeconds(o, &r)
	return r
}

// checkRate reports the first problem with how the rate and size fields
// combine: both forms of the rate, one form's size with the other, a
// rate or size missing. What values they may hold is sluice.NewLimit's
// to say (a burst below the rate is a bucket that caps bursts below one
// second's worth, which is legal).
func (l *loader) checkRate(o *obj, alg sluice.Algorithm, r rateFields) {
	path := o.path
	perSecond := o.has("tokens_per_second") || o.has("rps")
	tpsName := "tokens_per_second"
	if o.has("rps") {
		tpsName = "rps"
	}
	switch {
	case perSecond && o.has("rate"):
		l.errf(o.vals["rate"], join(path, "rate"), "give either %s or rate (with period), not both", tpsName)
	case perSecond && o.has("period"):
		l.errf(o.vals["period"], join(path, "period"), "%s is per second; use rate with period for another period", tpsName)
	case perSecond && o.has("capacity"):
		l.errf(o.vals["capacity"], join(path, "capacity"), "goes with rate and period; with %s, the bucket size is burst", tpsName)
	case o.has("rate") && o.has("burst"):
		l.errf(o.vals["burst"], join(path, "burst"), "goes with tokens_per_second (rps); with rate and period, the bucket size is capacity")
	case !perSecond && !o.has("rate"):
		switch alg {
		case sluice.TokenBucket, sluice.LeakyBucket:
			l.errf(o.n, path, "needs a rate: tokens_per_second (or its alias rps), or rate with period")
		default:
			l.errf(o.n, path, "needs rate and period")
		}
	case o.has("rate") && !o.has("period") && (alg == sluice.FixedWindow || alg == sluice.SlidingLog || alg == sluice.SlidingWindow):
		l.errf(o.n, join(path, "period"), "is required with rate for %s (such as \"1m\")", alg)
	case o.has("burst_seconds") && (o.has("burst") || o.has("capacity")):
		other := "burst"
		if o.has("capacity") {
			other = "capacity"
		}
		l.errf(o.vals["burst_seconds"], join(path, "burst_seconds"), "gives the bucket size as seconds of the rate (burst = rate x seconds): give either %s or burst_seconds, not both", other)
	case perSecond && alg == sluice.TokenBucket && !o.has("burst") && !o.has("burst_seconds"):
		l.errf(o.n, join(path, "burst"), "is required with %s (the bucket size: how many requests may pass at once; or burst_seconds)", tpsName)
	}
}

// apply sets in spec the fields that were given and valid.
func (r rateFields) apply(spec *sluice.Spec) {
	if r.tpsOK {
		spec.TokensPerSecond = r.tps
	}
	if r.rateOK {
		spec.Rate = r.rate
	}
	if r.periodOK {
		spec.Period = r.period
	}
	spec.Calendar = r.calendar
	if r.burstOK {
		spec.Burst = r.burst
	}
	if r.capOK {
		spec.Capacity = r.capacity
		if r.capacity == 0 {
			spec.Capacity = sluice.ZeroCapacity
		}
	}
}

// algOptions reads reserve, max_reserved, max_delay, start and shards.
func (l *loader) algOptions(o *obj, spec *sluice.Spec, v *variant) {
	if b, _, ok := o.boolean("reserve"); ok {
		v.reserve = b
	}
	// Without max_reserved, boundDebt gives the limit a finite one.
	if mr, _, ok := o.positive("max_reserved"); ok {
		spec.MaxReserved = mr
	}
	if d, dn, ok := o.duration("max_delay"); ok {
		if d <= 0 {
			l.errf(dn, join(o.path, "max_delay"), "must be > 0")
		}
		spec.MaxDelay = d
	}
	if tz, _, ok := o.str("timezone"); ok {
		spec.Timezone = tz
	}
	if sn, ok := o.vals["start"]; ok {
		if st, ok := l.start(sn, join(o.path, "start")); ok {
			spec.Start = &st
		}
	}
	if n, nn, ok := o.integer("shards"); ok {
		if n < 1 || n > sluice.MaxShards {
			l.errf(nn, join(o.path, "shards"), "must be a whole number from 1 to %d (got %v)", sluice.MaxShards, nn.Value)
		} else {
			spec.Shards = n
		}
	}
	l.jitter(o, spec)
}

// jitter reads jitter: a duration ("5s"), or "period" for up to one
// refill period of the rate (a second with tokens_per_second), the spread
// the Convex rate limiter recommends. It sets spec.Jitter.
func (l *loader) jitter(o *obj, spec *sluice.Spec) {
	n, ok := o.vals["jitter"]
	if !ok {
		return
	}
	path := join(o.path, "jitter")
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		l.errf(n, path, "must be a duration with a unit, such as \"2s\", or the word period (got %s)", kindName(n))
		return
	}
	if n.Value == "period" {
		spec.Jitter = spec.Period
		if spec.Jitter == 0 { // NewLimit's default period
			spec.Jitter = time.Second
		}
		return
	}
	d, err := time.ParseDuration(n.Value)
	switch {
	case err != nil:
		l.errf(n, path, "must be a duration such as \"2s\" or \"500ms\", or the word period (got %q)", n.Value)
	case d < 0:
		l.errf(n, path, "must not be negative (0 turns it off)")
	default:
		spec.Jitter = d
	}
}

// usableCosts checks the costs against the compiled limit v.limit: each
// must be one the limit can charge (a reservation, up to its capacity plus
// max_reserved), and the default must not undercut the least a client may
// declare. costN holds the cost fields' nodes.
func (l *loader) usableCosts(o *obj, v *variant, costN map[string]*yaml.Node) bool {
	path, lim := o.path, v.limit
	checks := []struct {
		field string
		cost  float64
	}{{"fixed_cost", v.cost.fixed}, {"default_cost", v.cost.def}}
	if v.cost.src != nil {
		checks = append(checks, struct {
			field string
			cost  float64
		}{"min_cost", v.cost.min})
	}
	for _, c := range checks {
		if _, err := (sluice.Request{Limit: lim, Cost: c.cost, Reserve: v.reserve, MaxReserved: v.queueDebt}).Charged(engine.OpTake); err != nil {
			at := cmp.Or(costN[c.field], o.n)
			if errors.Is(err, sluice.ErrCostExceedsLimit) && v.queueDebt > 0 {
				l.errf(at, join(path, c.field), "%v is above what a request may take within max_queue_delay (capacity %v plus %v tokens of debt): no request could ever pass", c.cost, lim.Capacity(), v.queueDebt)
			} else if errors.Is(err, sluice.ErrCostExceedsLimit) && (v.reserve || lim.Params().Reserve) && lim.Shards() <= 1 {
				l.errf(at, join(path, c.field), "%v is above what a reservation can take (capacity %v plus max_reserved %v): no request could ever pass", c.cost, lim.Capacity(), engine.FromMicroTokens(lim.Params().MaxReserved))
			} else if errors.Is(err, sluice.ErrCostExceedsLimit) && lim.Shards() > 1 {
				l.errf(at, join(path, c.field), "%v is above what two of the limit's %d shards hold together (2 x capacity / shards = %v): no request could ever pass", c.cost, lim.Shards(), lim.MaxCost())
			} else if errors.Is(err, sluice.ErrCostExceedsLimit) {
				l.errf(at, join(path, c.field), "%v is above the limit's capacity (%v): no request could ever pass", c.cost, lim.Capacity())
			} else {
				l.errf(at, join(path, c.field), "%v is not a usable cost (at least 0.000001)", c.cost)
			}
			return false
		}
	}
	if v.cost.src != nil && v.cost.def < v.cost.min {
		// Else a client would pay less by sending no cost at all than by
		// declaring the least it may.
		field, at := "default_cost", costN["default_cost"]
		if at == nil {
			field, at = "min_cost", costN["min_cost"]
		}
		l.errf(at, join(path, field), "default_cost (%v) is below min_cost (%v): a request without a usable cost would pay less than the least a declared one pays; raise default_cost or lower min_cost", v.cost.def, v.cost.min)
		return false
	}
	return true
}

// cost reads cost_source, fixed_cost, default_cost and min_cost into c
// and returns their nodes.
func (l *loader) cost(o *obj, path string, c *costSpec) map[string]*yaml.Node {
	nodes := map[string]*yaml.Node{}
	srcName := "fixed"
	if v, n, ok := o.str("cost_source"); ok {
		nodes["cost_source"] = n
		srcName = v
		if jp, ok := strings.CutPrefix(v, "body:"); ok {
			if _, err := settle.ParsePath(jp); err != nil {
				l.errf(n, join(path, "cost_source"), "%v", err)
			} else {
				c.src = &source{kind: srcBody, name: jp, text: v}
			}
		} else if v != "fixed" {
			src, msg := parseSource(v, false)
			if msg != "" || (src.kind != srcHeader && src.kind != srcQuery) {
				l.errf(n, join(path, "cost_source"), "must be fixed, header:NAME, query:NAME or body:PATH (got %q)", v)
			} else {
				c.src = &src
			}
		}
	}
	if v, n, ok := o.num("fixed_cost"); ok {
		nodes["fixed_cost"] = n
		switch {
		case srcName != "fixed":
			l.errf(n, join(path, "fixed_cost"), "applies only with cost_source: fixed (the cost is read from %s; default_cost covers requests without it)", srcName)
		case v <= 0:
			l.errf(n, join(path, "fixed_cost"), "must be > 0 (got %v)", v)
		default:
			c.fixed = v
		}
	}
	if v, n, ok := o.num("default_cost"); ok {
		nodes["default_cost"] = n
		if v <= 0 {
			l.errf(n, join(path, "default_cost"), "must be > 0 (got %v)", v)
		} else {
			c.def = v
		}
	}
	if v, n, ok := o.num("min_cost"); ok {
		nodes["min_cost"] = n
		switch {
		case srcName == "fixed":
			l.errf(n, join(path, "min_cost"), "applies only with cost_source header:NAME, query:NAME or body:PATH (it bounds the costs clients declare; fixed_cost is the cost here)")
		case v <= 0:
			l.errf(n, join(path, "min_cost"), "must be > 0 (got %v)", v)
		default:
			c.min = v
		}
	}
	return nodes
}

// start reads a fixed window's start: a duration offset from the Unix
// epoch ("30m") or an RFC 3339 time.
func (l *loader) start(n *yaml.Node, path string) (time.Duration, bool) {
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!str" && n.Tag != "!!timestamp") {
		l.errf(n, path, "must be a duration offset such as \"30m\" or an RFC 3339 time (got %s)", kindName(n))
		return 0, false
	}
	if d, err := time.ParseDuration(n.Value); err == nil {
		if d < 0 {
			l.errf(n, path, "must not be negative")
			return 0, false
		}
		return d, true
	}
	t, err := time.Parse(time.RFC3339, n.Value)
	if err != nil {
		l.errf(n, path, "must be a duration offset such as \"30m\" or an RFC 3339 time such as \"2024-01-01T00:00:00Z\" (got %q)", n.Value)
		return 0, false
	}
	if t.Before(time.Unix(0, 0)) {
		l.errf(n, path, "must not be before 1970")
		return 0, false
	}
	return t.Sub(time.Unix(0, 0)), true
}

// specErrorAt locates a sluice.SpecError of o's limit: the node of the
// field NewLimit names (rps when the file spells tokens_per_second so),
// the field and the reason. The node is nil when err is no SpecError or
// names no field of o.
func specErrorAt(o *obj, err error) (*yaml.Node, string, string) {
	var se *sluice.SpecError
	if !errors.As(err, &se) || se.Field == "" {
		return nil, "", ""
	}
	field := se.Field
	if field == "tokens_per_second" && !o.has(field) && o.has("rps") {
		field = "rps"
	}
	n, ok := o.vals[field]
	if !ok {
		return nil, "", ""
	}
	return n, field, se.Reason
}
