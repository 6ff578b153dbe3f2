package policy

import (
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/quota"
)

// leaseFields are a token bucket's or fixed window's lease: section, the
// leased quota's settings (package quota).
var leaseFields = []string{"max_slice", "term", "hot_after"}

// leaseConfig reads the lease: section of a token bucket or fixed window:
// lease: {} leases with the defaults, its fields tune them (quota.Settings);
// without it the rule is exact. A concurrency rule's lease is its slot
// term, a duration (concurrencyConfig).
func (l *loader) leaseConfig(o *obj, v *variant, alg sluice.Algorithm) bool {
	n, ok := o.vals["lease"]
	if !ok {
		return true
	}
	path := join(o.path, "lease")
	if isNull(n) {
		l.errf(n, path, "is empty: lease: {} leases with the defaults, and its fields (%s) tune them", strings.Join(leaseFields, ", "))
		return false
	}
	if n.Kind == yaml.ScalarNode {
		l.errf(n, path, "on a %s is a section of fields (%s; lease: {} takes the defaults), not %q: a duration is a concurrency rule's slot term", alg, strings.Join(leaseFields, ", "), n.Value)
		return false
	}
	lo := l.object(n, path, leaseFields)
	if lo == nil {
		return false
	}
	errsBefore := len(l.errs)
	var set quota.Settings
	if mn, ok := lo.vals["max_slice"]; ok {
		l.maxSlice(mn, join(path, "max_slice"), &set)
	}
	if d, dn, ok := lo.duration("term"); ok {
		if d < quota.MinTerm || d > quota.MaxTerm {
			l.errf(dn, join(path, "term"), "must be from 1ms to 1h (got %q): how long a process keeps a slice before what is left goes back", dn.Value)
		} else {
			set.Term = d
		}
	}
	if h, hn, ok := lo.integer("hot_after"); ok {
		if h < 1 || h > quota.MaxHotAfter {
			l.errf(hn, join(path, "hot_after"), "must be a whole number from 1 to %d (got %v): the requests of a key in one term before it leases", quota.MaxHotAfter, hn.Value)
		} else {
			set.HotAfter = h
		}
	}
	if len(l.errs) > errsBefore {
		return false
	}
	if err := quota.Leasable(v.limit); err != nil || v.reserve {
		l.errf(n, path, "applies to a token_bucket or fixed_window of a fixed period without reserve, shards or a calendar: a slice is taken and spent whole, which a reservation, a shard or a calendar month does not fit")
		return false
	}
	v.lease = &set
	l.leaseNote(n, path, v.limit, set)
	return true
}

// leaseNote tells sluice check what a lease: section works out to: the
// max slice, and the bound it gives one process and a fleet.
func (l *loader) leaseNote(n *yaml.Node, path string, lim *sluice.Limit, set quota.Settings) {
	d := set.WithDefaults()
	per := quota.Overshoot(lim, set, 1)
	if per == 0 {
		l.notef(n, path, "the max slice is under %d tokens: the rule stays exact (zero overshoot)", quota.MinSlice)
		return
	}
	limit := lim.Capacity()
	l.notef(n, path, "each process holds at most %v tokens of a key (the max slice, %.3g%% of the capacity %v): over any interval the fleet admits at most processes x %v beyond the exact limit (%v for 3 processes, %.3g%%); keys seen fewer than %d times per %v in a process stay exact",
		per, 100*per/limit, limit, per, quota.Overshoot(lim, set, 3), 300*per/limit, d.HotAfter, d.Term)
}

// maxSlice reads max_slice: tokens (50), or a share of the capacity as a
// percentage ("0.3%").
func (l *loader) maxSlice(n *yaml.Node, path string, set *quota.Settings) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" {
		pct, ok := strings.CutSuffix(strings.TrimSpace(n.Value), "%")
		f, err := strconv.ParseFloat(strings.TrimSpace(pct), 64)
		if !ok || err != nil || !(f > 0 && f <= 100) {
			l.errf(n, path, "must be a number of tokens or a percentage of the capacity above 0%% and at most 100%%, such as \"0.3%%\" (got %q)", n.Value)
			return
		}
		set.MaxShare = f / 100
		return
	}
	f, ok := l.number(n, path)
	if !ok {
		return
	}
	if f <= 0 {
		l.errf(n, path, "must be > 0 tokens (got %v)", f)
		return
	}
	set.MaxSlice = f
}

// Leased returns the policy's leased limits with their settings (the
// lease: sections): what sluice serve leases (quota.Store.Configure).
// Empty when every limit is exact.
func (p *Policy) Leased() map[*sluice.Limit]quota.Settings {
	out := map[*sluice.Limit]quota.Settings{}
	for _, r := range p.Rules {
		for _, v := range r.variants() {
			if v.lease != nil {
				out[v.limit] = *v.lease
			}
		}
	}
	return out
}
