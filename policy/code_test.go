package policy_test

import (
	"errors"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy"
)

// A policy built in code matches requests as the same rules in a file do.
func TestFromRulesMatchesAsAFile(t *testing.T) {
	perIP := sluice.MustLimit(sluice.Spec{Name: "per-ip", TokensPerSecond: 10, Burst: 20})
	perKey := sluice.MustLimit(sluice.Spec{Name: "per-key", TokensPerSecond: 1, Burst: 5})
	s := policy.DefaultSettings()
	s.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	code, err := policy.FromRules(s,
		policy.CodeRule{Limit: perIP, LimitKeys: []string{"ip:address"}},
		policy.CodeRule{Limit: perKey, LimitKeys: []string{"header:x-api-key", "path"}, MissingKey: policy.MissingSkip},
	)
	if err != nil {
		t.Fatal(err)
	}
	file := mustParse(t, `trusted_proxies: ["10.0.0.0/8"]
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm_config: {rps: 10, burst: 20}
  - name: per-key
    limit_keys: ["header:x-api-key", "path"]
    missing_key: skip
    algorithm_config: {rps: 1, burst: 5}
`)
	for _, c := range []struct{ peer, xff, key string }{
		{"10.0.0.1:1", "198.51.100.1", "k1"},
		{"198.51.100.2:1", "203.0.113.1", ""},
		{"[2001:db8::1]:1", "", "a|b"},
	} {
		req := httptest.NewRequest("GET", "/Orders/../items", nil)
		req.RemoteAddr = c.peer
		if c.xff != "" {
			req.Header.Set("X-Forwarded-For", c.xff)
		}
		if c.key != "" {
			req.Header.Set("X-API-Key", c.key)
		}
		got, err1 := code.Match(code.FromHTTP(req))
		want, err2 := file.Match(file.FromHTTP(req))
		if err1 != nil || err2 != nil || len(got) != len(want) {
			t.Fatalf("%+v: %d matches (%v), want %d (%v)", c, len(got), err1, len(want), err2)
		}
		for i := range got {
			g, w := got[i].Request, want[i].Request
			if g.Key != w.Key || g.Cost != w.Cost || g.Limit.Name() != w.Limit.Name() || got[i].Identity != want[i].Identity {
				t.Errorf("%+v match %d: %+v, want %+v", c, i, got[i], want[i])
			}
		}
	}
	if _, lim, err := code.FindLimit("per-key"); err != nil || lim != perKey {
		t.Fatalf("FindLimit: %v %v", lim, err)
	}
}

// Rules in code are checked as a file's are, every problem at once.
func TestFromRulesErrors(t *testing.T) {
	ok := sluice.MustLimit(sluice.Spec{Name: "ok", TokensPerSecond: 1, Burst: 1})
	half := sluice.MustLimit(sluice.Spec{Name: "half", TokensPerSecond: 1, Burst: 0.5})
	// A tier's limit name (RULE.TIER), longer than a rule's may be.
	long := strings.Repeat("a", 40) + "." + strings.Repeat("b", 40)
	spaced := sluice.MustLimit(sluice.Spec{Name: long, TokensPerSecond: 1, Burst: 1})
	_, err := policy.FromRules(policy.DefaultSettings(),
		policy.CodeRule{Limit: ok, LimitKeys: []string{"jwt:sub", "header:", "ip:address", "ip:address"}},
		policy.CodeRule{Limit: ok},
		policy.CodeRule{Limit: half},
		policy.CodeRule{Limit: spaced},
		policy.CodeRule{},
	)
	var es *policy.Errors
	if !errors.As(err, &es) {
		t.Fatalf("error %T %v, want *policy.Errors", err, err)
	}
	want := []string{
		`rules[0].limit_keys[0]: "jwt:sub" reads a JWT claim, which needs a jwt section's verification keys: write the policy as a file (policy.Parse)`,
		`rules[0].limit_keys[1]: header needs a name: header:NAME`,
		`rules[0].limit_keys[3]: "ip:address" is listed twice`,
		`rules[1]: limit name "ok" is used twice; their buckets would be shared`,
		`rules[2]: a request costs 1 token: limit "half": cost 1 is above the capacity (0.5): it can never succeed`,
		`rules[3]: limit name "` + long + `" must be 1 to 64 of A-Z a-z 0-9 _ . -`,
		`rules[4]: has no limit`,
	}
	if got := err.Error(); got != strings.Join(want, "\n") {
		t.Fatalf("got:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
	if _, err := policy.FromRules(policy.Settings{}, policy.CodeRule{Limit: ok}); err == nil || !strings.Contains(err.Error(), "IPv6Prefix: must be between 1 and 128 (got 0): start from DefaultSettings") {
		t.Fatalf("zero settings: %v", err)
	}
	bad := policy.DefaultSettings()
	bad.ClientHeader = "X Real IP"
	if _, err := policy.FromRules(bad, policy.CodeRule{Limit: ok}); err == nil || !strings.Contains(err.Error(), `ClientHeader: must be a header name`) {
		t.Fatalf("ClientHeader: %v", err)
	}
	fwd := policy.DefaultSettings()
	fwd.ClientHeader = "forwarded"
	if p, err := policy.FromRules(fwd, policy.CodeRule{Limit: ok}); err != nil {
		t.Fatalf("ClientHeader forwarded: %v", err)
	} else if p.Settings.ClientHeader != "Forwarded" {
		t.Fatalf("ClientHeader %q, want the canonical Forwarded", p.Settings.ClientHeader)
	}
	if _, err := policy.FromRules(policy.DefaultSettings()); err == nil || err.Error() != "rules: must hold at least one rule" {
		t.Fatalf("no rules: %v", err)
	}
}
