package envoyrls_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/envoyrls"
)

func TestReferenceConfigErrors(t *testing.T) {
	for name, c := range map[string]struct{ yaml, want string }{
		"unknown key":     {"domain: d\ndescriptors:\n  - key: a\n    shadowmode: true\n", `cfg.yaml:4: descriptors[0]: unknown key "shadowmode"`},
		"bad unit":        {"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n", `cfg.yaml:5: descriptors[0].rate_limit.unit: invalid rate limit unit "fortnight"`},
		"no unit":         {"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {requests_per_unit: 1}\n", `descriptors[0].rate_limit.unit: invalid rate limit unit ""`},
		"duplicate":       {"domain: d\ndescriptors:\n  - key: a\n    value: b\n  - key: a\n    value: b\n", `cfg.yaml:5: descriptors[1]: duplicate descriptor composite key "a_b"`},
		"empty key":       {"domain: d\ndescriptors:\n  - value: b\n", `cfg.yaml:3: descriptors[0].key: must not be empty`},
		"empty domain":    {"descriptors:\n  - key: a\n", `cfg.yaml:1: domain: must not be empty`},
		"empty file":      {"", `cfg.yaml: domain: the file is empty`},
		"unlimited unit":  {"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n", `should not specify rate limit unit when unlimited`},
		"replaces itself": {"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {name: x, unit: second, requests_per_unit: 1, replaces: [{name: x}]}\n", `should not contain name of same descriptor`},
		"share exact":     {"domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n", `share_threshold: applies to wildcard values`},
		"multiplier 0":    {"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, unit_multiplier: 0, requests_per_unit: 1}\n", `unit_multiplier: must be at least 1`},
		"same domain":     {"domain: d\n---\ndomain: d\n", `cfg.yaml:3: domain: duplicate domain "d"`},
		"nested":          {"domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: minute, requests_per_unit: -1}\n", "cfg.yaml:6: cannot unmarshal !!int `-1` into uint32"},
		"not yaml":        {"domain: [\n", "cfg.yaml: "},
	} {
		_, err := envoyrls.ParseReferenceConfig("cfg.yaml", []byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", name, err, c.want)
		}
	}
	// Every problem is reported at once.
	_, err := envoyrls.ParseReferenceConfig("cfg.yaml", []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: x}\n  - foo: 1\n"))
	if err == nil || strings.Count(err.Error(), "\n") < 2 {
		t.Errorf("want three problems, got %v", err)
	}
}

func TestReferenceConfigAccepted(t *testing.T) {
	data, err := os.ReadFile("../examples/ratelimit-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !envoyrls.IsReferenceConfig(data) {
		t.Fatal("the example is not recognised as the reference format")
	}
	if _, err := envoyrls.ParseReferenceConfig("ratelimit-config.yaml", data); err != nil {
		t.Fatal(err)
	}
	// Two domains in one file, and keys that only shape the reference
	// server's statistics.
	two := "domain: a\ndescriptors:\n  - key: k\n    detailed_metric: true\n    value_to_metric: true\n    rate_limit: {unit: SECOND, requests_per_unit: 1}\n---\ndomain: b\n"
	if _, err := envoyrls.ParseReferenceConfig("two.yaml", []byte(two)); err != nil {
		t.Fatal(err)
	}
	for _, own := range []string{"rules: []\n", "listen: :8080\nrules:\n  - name: r\n", "{\"rules\": []}", "not: [yaml", "domain: x\nrules: []\n"} {
		if envoyrls.IsReferenceConfig([]byte(own)) {
			t.Errorf("%q taken for the reference format", own)
		}
	}
}

// TestAttackUnitMultiplierOverflowShortensWindow: a limit's window is
// unit x unit_multiplier (refLimit.period), a time.Duration product that
// overflows silently. 1 per 842,578,216 weeks (some 16 million years: a
// "once ever" limit) wraps to a window of under ten minutes, and 1 per
// 1,017,872,924 years to under three: the key refills every few minutes.
// The reference server computes the window in seconds, without
// overflow. A window too long to express must be refused (or clamped),
// never wrapped to a short one.
func TestAttackUnitMultiplierOverflowShortensWindow(t *testing.T) {
	for unit, mult := range map[string]string{"week": "842578216", "year": "1017872924"} {
		cfg := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {name: once, unit: " + unit + ", requests_per_unit: 1, unit_multiplier: " + mult + "}\n"
		p, err := envoyrls.ParseReferenceConfig("ref.yaml", []byte(cfg))
		if err != nil {
			continue // refused: the fix
		}
		_, lim, err := p.FindLimit("once")
		if err != nil {
			t.Fatal(err)
		}
		if got := lim.Spec().Period; got < 100*365*24*time.Hour {
			t.Errorf("1 per %s %ss is enforced as 1 per %v: the window's length overflowed", mult, unit, got)
		}
	}
}
