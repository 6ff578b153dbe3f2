package policy_test

import (
	"errors"
	"math"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/policy"
)

// FuzzParse feeds the loader arbitrary files: it must never panic, and it
// either compiles a usable policy or reports located problems.
func FuzzParse(f *testing.F) {
	f.Add([]byte(policy.DefaultYAML))
	f.Add([]byte(tieredCfg))
	f.Add([]byte(adaptiveRule))
	f.Add([]byte(rule("", "      rate: 10\n      period: 1m\n      burst_seconds: 300\n      reserve: true\n      max_queue_delay: 2s\n      max_queued: 5\n")))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := policy.Parse("f.yaml", data)
		if err != nil {
			var es *policy.Errors
			if !errors.As(err, &es) || len(es.List) == 0 {
				t.Fatalf("error %T %v is not a non-empty *policy.Errors", err, err)
			}
			for _, e := range es.List {
				var pe *policy.Error
				if !errors.As(e, &pe) || pe.File != "f.yaml" || pe.Line < 0 || pe.Msg == "" {
					t.Fatalf("bad problem %#v", e)
				}
			}
			return
		}
		if p == nil || len(p.Rules) == 0 {
			t.Fatal("a valid policy without rules")
		}
		for _, r := range p.Rules {
			if r.Limit == nil || p.Rule(r.Name) != r {
				t.Fatalf("rule %q has no limit or is not indexed", r.Name)
			}
		}
		// Whatever it holds, a request can be matched against it.
		if _, err := p.Match(&policy.Input{Method: "GET", Path: "/", Header: http.Header{"X-Api-Key": {"k"}}}); err != nil {
			t.Fatal(err)
		}
	})
}

var fuzzPolicy = `trusted_proxies: ["10.0.0.0/8", "2001:db8::/32"]
rules:
  - name: all-sources
    limit_keys: ["ip:address", "header:x-api-key", "query:user", "path", "method", "host", "descriptor:k", "descriptor"]
    match: {"header:x-tenant": [a, b, "c|d"], path_prefix: /}
    algorithm_config: {rps: 10, burst: 100, cost_source: "header:x-weight", default_cost: 2}
`

// FuzzMatch feeds key extraction arbitrary header, query, path, forwarding
// and cost values: it must never panic, every key must be bounded and free
// of separators injected by the values, values must round-trip through
// their escaping, and costs must stay positive numbers.
func FuzzMatch(f *testing.F) {
	f.Add("key-1", "user=u1", "/api/x", "1.2.3.4", "5", "a", "10.0.0.1")
	f.Add("a|b:c{d}", "user=%7C%3A", "/../x//y/", "garbage, 2001:db8::1", "-1", "c|d", "2001:db8::5")
	f.Add(strings.Repeat("x", 300), "user="+strings.Repeat("é", 100), "", "", "NaN", "b", "203.0.113.9")
	p, err := policy.Parse("fuzz.yaml", []byte(fuzzPolicy))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, apiKey, rawQuery, path, xff, weight, tenant, peerIP string) {
		h := http.Header{}
		h.Set("X-Api-Key", apiKey)
		h.Set("X-Forwarded-For", xff)
		h.Set("X-Weight", weight)
		h.Set("X-Tenant", tenant)
		h.Set("Forwarded", "for="+xff)
		q, _ := url.ParseQuery(rawQuery)
		in := &policy.Input{Method: "POST", Host: apiKey, Path: path, Header: h, Query: q,
			Descriptor: []policy.DescriptorEntry{{Key: "k", Value: apiKey}, {Key: tenant, Value: weight}}}
		if a, err := netip.ParseAddr(peerIP); err == nil {
			in.Peer = netip.AddrPortFrom(a, 1)
		}
		ms, err := p.Match(in)
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) == 0 {
			if tenant == "a" || tenant == "b" || tenant == "c|d" {
				t.Fatalf("tenant %q did not match", tenant)
			}
			return
		}
		m := ms[0]
		if c := m.Request.Cost; math.IsNaN(c) || c <= 0 {
			t.Fatalf("cost %v from weight %q", c, weight)
		}
		parts := strings.Split(m.Request.Key, "|")
		if len(parts) != 8 {
			t.Fatalf("key %q has %d components, want 8", m.Request.Key, len(parts))
		}
		for _, c := range parts {
			if len(c) > 128 && !(len(c) == 65 && c[0] == '#') {
				t.Fatalf("component %q is unbounded", c)
			}
			for i := 0; i < len(c); i++ {
				if c[i] <= ' ' || c[i] >= 0x7f || c[i] == '{' || c[i] == '}' {
					t.Fatalf("component %q holds byte %q", c, c[i])
				}
			}
		}
		// The API key component decodes back to the header value (an
		// empty one included: present but empty is its own bucket).
		if k := parts[1]; !strings.HasPrefix(k, "#") {
			if got, err := unescape(k); err != nil || got != apiKey {
				t.Fatalf("key component %q decodes to %q (%v), want %q", k, got, err, apiKey)
			}
		} else if len(apiKey) <= 128/3 {
			t.Fatalf("short value %q was hashed", apiKey)
		}
	})
}

func unescape(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			if strings.IndexByte("|:{}()#", s[i]) >= 0 {
				return "", errors.New("unescaped separator")
			}
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", errors.New("short escape")
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", err
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}
