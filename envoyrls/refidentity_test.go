package envoyrls_test

import (
	"testing"

	"github.com/sluicehq/sluice/envoyrls"
)

// TestAttackReferenceReorderKeepsBuckets: a reload that only moves a
// limit (another limit added before it, the descriptors reordered, as a
// control plane's resources arrive in any order) must keep its buckets,
// whose identity is the limit's name: on b1b6bb6 the name was the
// limit's position (envoy.DOMAIN.N), so the move reset every moved
// limit's count.
func TestAttackReferenceReorderKeepsBuckets(t *testing.T) {
	a := "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 3}\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 9}\n"
	b := "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n---\ndomain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 9}\n  - key: new\n    rate_limit: {unit: day, requests_per_unit: 1}\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"
	names := func(src string) map[string]bool {
		p, err := envoyrls.ParseReferenceConfig("f.yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		_, limits, _ := envoyrls.ReferenceLimits(p)
		out := map[string]bool{}
		for _, l := range limits {
			out[l.Name()] = true
		}
		return out
	}
	before, after := names(a), names(b)
	for n := range before {
		if !after[n] {
			t.Errorf("limit %s is gone after a reload that only moved it (and raised remote_address's rate): its buckets are lost; after: %v", n, after)
		}
	}
}
