package envoyrls_test

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy"
)

// Attack: pass a concurrency rule through Envoy's rate limit service,
// which is never told when a request ends, so that the rule is skipped
// (or hands out slots it never takes back) and requests run beyond
// max_in_flight. The call is answered OVER_LIMIT, charges nothing, and a
// refund (negative hits) passes over the rule without error.
func TestAttackEnvoyCannotPassConcurrency(t *testing.T) {
	pol, err := policy.Parse("cc.yaml", []byte(`allow_negative_hits: true
rules:
  - name: per-client
    limit_keys: ["descriptor:client"]
    missing_key: skip
    algorithm_config: {rps: 1, burst: 5}
  - name: inflight
    algorithm: concurrency
    algorithm_config: {max_in_flight: 100}
`))
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, pol)
	for range 3 {
		resp := h.call(t, "edge", 0, desc("client", "c1"))
		if resp.OverallCode != OVER {
			t.Fatalf("a call a concurrency rule matches: %v, want OVER_LIMIT", resp.OverallCode)
		}
		if got := header(resp, "X-Sluice-Reason"); got != "concurrency_unsupported" {
			t.Errorf("reason %q, want concurrency_unsupported", got)
		}
	}
	// Nothing was charged: the client's bucket is full, and a refund
	// passes over the slots.
	expect(t, h.call(t, "edge", 0, negative(desc("client", "c1"), 1)), OK, OK, 5)
	d, err := sluice.New(h.store).Peek(context.Background(), sluice.Request{Limit: pol.Limit("inflight"), Key: "*"})
	if err != nil || !d.Allowed || d.Remaining != 99 {
		t.Fatalf("the slots after Envoy's calls: %+v, %v; want all 100 free", d, err)
	}
}
