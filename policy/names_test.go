package policy_test

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy"
)

func TestSuggest(t *testing.T) {
	for _, c := range []struct {
		name string
		cand []string
		want string
	}{
		{"per-usr", []string{"per-org", "per-user"}, "per-user"},
		{"PER-USER", []string{"per-user"}, "per-user"},
		{"per-user", []string{"Per-User"}, "Per-User"},
		{"c", []string{"a", "b"}, ""},     // one edit from every one-letter name
		{"ab", []string{"a", "xyz"}, "a"}, // one edit of two
		{"per-user", []string{"per-user-ratelimit"}, ""},
		{strings.Repeat("a", 1<<16), []string{"a"}, ""},
	} {
		if got := policy.Suggest(c.name, c.cand); got != c.want {
			t.Errorf("Suggest(%.20q, %v) = %q, want %q", c.name, c.cand, got, c.want)
		}
	}
}

// FindLimit resolves what /v1/take and sluice simulate are given: rules,
// tiers (of rules whose names hold dots too), and name-only rules by name
// and alias.
func TestFindLimit(t *testing.T) {
	p := mustParse(t, `
rules:
  - name: per-ip
    algorithm_config: {rps: 1, burst: 1}
  - name: api.v1
    mode: shadow
    tiers:
      - {name: gold, match: {header:x-plan: gold}, algorithm_config: {rps: 5, burst: 5}}
      - {name: free, algorithm_config: {rps: 1, burst: 1}}
`)
	for name, rule := range map[string]string{"per-ip": "per-ip", "api.v1.gold": "api.v1", "api.v1.free": "api.v1"} {
		r, lim, err := p.FindLimit(name)
		if err != nil || r.Name != rule || lim.Name() != name {
			t.Errorf("%s: %v %v %v", name, r, lim, err)
		}
	}
	// LimitName knows the limits FindLimit finds first, and no other
	// name (a rule with tiers, an alias: FindLimit explains those).
	for name, want := range map[string]string{"per-ip": "per-ip", "api.v1.gold": "api.v1.gold", "api.v1": "", "per-i": "", "": ""} {
		if got := p.LimitName([]byte(name)); got != want {
			t.Errorf("LimitName(%q) = %q, want %q", name, got, want)
		}
	}
	if _, _, err := p.FindLimit("api.v1"); err == nil || !strings.Contains(err.Error(), "name a tier (api.v1.gold, api.v1.free)") {
		t.Errorf("api.v1: %v", err)
	}
	if got := p.ListLimits(); got != "per-ip, api.v1.gold, api.v1.free" {
		t.Errorf("ListLimits: %q", got)
	}

	lim := func(name string) *policy.Rule {
		return &policy.Rule{Name: name, Limit: sluice.MustLimit(sluice.Spec{Name: name, TokensPerSecond: 1, Burst: 1})}
	}
	a, b, c := lim("envoy.x.0"), lim("envoy.x.1"), lim("envoy.x.2")
	q := policy.NameOnly("ref.yaml", p.Settings, []policy.NamedRule{{Rule: a, Alias: "per-address"}, {Rule: b, Alias: "dup"}, {Rule: c, Alias: "dup"}})
	for name, want := range map[string]*policy.Rule{"envoy.x.0": a, "per-address": a, "envoy.x.2": c} {
		if r, l, err := q.FindLimit(name); err != nil || r != want || l != want.Limit {
			t.Errorf("%s: %v %v", name, r, err)
		}
	}
	if got := q.LimitName([]byte("per-address")); got != "" {
		t.Errorf("LimitName(per-address) = %q, an alias", got)
	}
	if _, _, err := q.FindLimit("dup"); err == nil || !strings.Contains(err.Error(), `"dup" names 2 limits of the file: name one of envoy.x.1, envoy.x.2`) {
		t.Errorf("dup: %v", err)
	}
	if _, _, err := q.FindLimit("per-adress"); err == nil || err.Error() != `unknown rule "per-adress" (did you mean "per-address"?); the limits are: envoy.x.0 (per-address), envoy.x.1 (dup), envoy.x.2 (dup)` {
		t.Errorf("per-adress: %v", err)
	}
	if len(q.Rules) != 0 || len(q.NamedLimits()) != 3 {
		t.Errorf("name-only rules: %d rules, %d limits", len(q.Rules), len(q.NamedLimits()))
	}
	if _, _, err := policy.NameOnly("empty.yaml", p.Settings, nil).FindLimit("x"); err == nil || err.Error() != `unknown rule "x": the policy has no limits` {
		t.Errorf("no limits: %v", err)
	}
}

// sluice.NewLimit and a policy file refuse the same limits: a name the
// file refuses, and a token bucket given per second without a burst.
func TestNewLimitRefusesWhatAFileRefuses(t *testing.T) {
	for _, name := range []string{"per-user", "a.b_C-9", strings.Repeat("x", 64), "a b", "", "a{b}", "é", "a/b", "a:b", strings.Repeat("x", 65)} {
		_, libErr := sluice.NewLimit(sluice.Spec{Name: name, TokensPerSecond: 1, Burst: 1})
		_, fileErr := policy.Parse("t.yaml", []byte("rules:\n  - name: \""+name+"\"\n    algorithm_config: {rps: 1, burst: 1}\n"))
		if (libErr == nil) != (fileErr == nil) {
			t.Errorf("name %q: NewLimit %v, file %v; want both to accept or both to refuse", name, libErr, fileErr)
		}
	}
	// A tier's limit is named RULE.TIER: NewLimit takes the names a file
	// gives its tiers.
	tier := strings.Repeat("r", 64) + "." + strings.Repeat("t", 64)
	if _, err := sluice.NewLimit(sluice.Spec{Name: tier, TokensPerSecond: 1, Burst: 1}); err != nil {
		t.Errorf("a tier's limit name: %v", err)
	}
	_, libErr := sluice.NewLimit(sluice.Spec{Name: "b", TokensPerSecond: 10})
	_, fileErr := policy.Parse("t.yaml", []byte("rules:\n  - name: b\n    algorithm_config: {rps: 10}\n"))
	if libErr == nil || fileErr == nil || !strings.Contains(libErr.Error(), "burst") {
		t.Errorf("a token bucket without a burst: NewLimit %v, file %v; want both refused, naming burst", libErr, fileErr)
	}
}
