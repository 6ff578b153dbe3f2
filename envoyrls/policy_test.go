package envoyrls_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
)

// A policy in sluice's own format: token buckets, any period, per-rule
// on_store_error.
const sluiceYAML = `rules:
  - name: per-client
    match: {domain: edge}
    limit_keys: ["descriptor:client"]
    missing_key: skip
    algorithm: token_bucket
    algorithm_config: {rate: 600, period: 1m, capacity: 5}
  - name: strict
    match: {domain: edge, "descriptor:tier": free}
    limit_keys: [descriptor]
    algorithm: fixed_window
    algorithm_config: {rate: 2, period: 10s, start: 0s}
    on_store_error: deny
  - name: trial
    mode: shadow
    match: {domain: edge, "descriptor:trial": "yes"}
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
`

func startSluice(t *testing.T) *harness {
	t.Helper()
	pol, err := policy.Parse("sluice.yaml", []byte(sluiceYAML))
	if err != nil {
		t.Fatal(err)
	}
	return start(t, pol)
}

func TestSluicePolicyTokenBucket(t *testing.T) {
	h := startSluice(t)
	for want := 4; want >= 0; want-- {
		expect(t, h.call(t, "edge", 0, desc("client", "c1")), OK, OK, want)
	}
	resp := h.call(t, "edge", 0, desc("client", "c1"))
	expect(t, resp, OVER, OVER, 0)
	// 600 per minute is said per minute, not as 10 per second.
	if cl := resp.Statuses[0].CurrentLimit; cl == nil || cl.Name != "per-client" || cl.RequestsPerUnit != 600 || cl.Unit != rlspb.RateLimitResponse_RateLimit_MINUTE {
		t.Errorf("current_limit %v, want per-client 600/MINUTE", cl)
	}
	// The bucket is full in 500ms: whole seconds, rounded up.
	if d := resp.Statuses[0].DurationUntilReset.AsDuration(); d != time.Second {
		t.Errorf("duration_until_reset %v, want 1s (500ms until the bucket is full, rounded up)", d)
	}
	if !strings.Contains(header(resp, "RateLimit-Policy"), `"per-client";q=5`) || header(resp, "Retry-After") != "1" {
		t.Errorf("headers %v", resp.ResponseHeadersToAdd)
	}
	// A token bucket refills continuously: one token every 100ms.
	h.clock.Advance(100 * time.Millisecond)
	expect(t, h.call(t, "edge", 0, desc("client", "c1")), OK, OK, 0)
	// Other domains and descriptors without the key are not limited.
	expect(t, h.call(t, "other", 0, desc("client", "c1")), OK, OK, 0)
	if resp := h.call(t, "edge", 0, desc("path", "/")); resp.Statuses[0].CurrentLimit != nil {
		t.Errorf("unrelated descriptor limited: %v", resp)
	}
}

func TestSluicePolicyAllOrNothingAndShadow(t *testing.T) {
	h := startSluice(t)
	// One descriptor may match several rules: all of them decide it.
	expect(t, h.call(t, "edge", 0, desc("tier", "free", "client", "c2")), OK, OK, 1)
	expect(t, h.call(t, "edge", 0, desc("tier", "free", "client", "c2")), OK, OK, 0)
	resp := h.call(t, "edge", 0, desc("tier", "free", "client", "c2"), desc("client", "c3"))
	expect(t, resp, OVER, OVER, 0, OK, 5)
	if cl := resp.Statuses[0].CurrentLimit; cl.GetName() != "strict" || cl.RequestsPerUnit != 2 || cl.Unit != rlspb.RateLimitResponse_RateLimit_SECOND || cl.GetUnitMultiplier().GetValue() != 10 {
		t.Errorf("current_limit %v, want strict 2 per 10 SECOND", cl)
	}
	// c2's token bucket kept the 3 tokens the rejected calls did not take.
	expect(t, h.call(t, "edge", 0, hits(desc("client", "c2"), 0)), OK, OK, 3)
	// Shadow rules count but never reject.
	expect(t, h.call(t, "edge", 0, desc("trial", "yes")), OK, OK, 0)
	expect(t, h.call(t, "edge", 0, desc("trial", "yes"), desc("client", "c4")), OK, OK, 0, OK, 4)
}

func TestSluicePolicyStoreDown(t *testing.T) {
	h := startSluice(t)
	h.store.Down.Store(true)
	// per-client says on_store_error: allow (the default)...
	expect(t, h.call(t, "edge", 0, desc("client", "c5")), OK, OK, 5)
	// ...strict says deny: over the limit, and Envoy is told to retry.
	resp := h.call(t, "edge", 0, desc("tier", "free", "client", "c5"))
	expect(t, resp, OVER, OVER, 0)
	// Retry after a second (plus its jitter), not at the end of the window.
	if ra := header(resp, "Retry-After"); ra != "1" {
		t.Errorf("Retry-After %q on a denied store failure, want 1: %v", ra, resp.ResponseHeadersToAdd)
	}
	h.store.Down.Store(false)
	expect(t, h.call(t, "edge", 0, desc("client", "c5")), OK, OK, 4)
}

func TestFollowsPolicySource(t *testing.T) {
	one, err := policy.Parse("one.yaml", []byte("rules:\n  - name: r\n    match: {domain: edge}\n    limit_keys: [\"descriptor:client\"]\n    algorithm: token_bucket\n    algorithm_config: {rps: 1, burst: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ref, err := envoyrls.ParseReferenceConfig("ref.yaml", []byte("domain: edge\ndescriptors:\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var current atomic.Pointer[policy.Policy]
	current.Store(one)
	clock := sluice.NewManualClock(t0)
	s := envoyrls.New(one, sluice.NewWithOptions(memory.New(memory.Options{Clock: clock}), sluice.Options{Clock: clock}), envoyrls.Options{Source: current.Load})
	ask := func() *rlspb.RateLimitResponse {
		resp, err := s.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("client", "c")}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	expect(t, ask(), OK, OK, 0)
	expect(t, ask(), OVER, OVER, 0)
	current.Store(ref) // a reload, to the reference format
	expect(t, ask(), OK, OK, 2)
	if cl := ask().Statuses[0].CurrentLimit; cl.RequestsPerUnit != 3 || cl.Unit != rlspb.RateLimitResponse_RateLimit_MINUTE {
		t.Errorf("after the reload: %v", cl)
	}
}

// Attack: a burst sent through Envoy against a rule that shapes traffic
// (a leaky bucket) or spaces it (capacity 0 with reserve). Every request
// of such a rule reserves a turn, but Envoy cannot hold a request until
// its turn: an OK lets it through at once, so every turn given would be a
// request passed now, up to the whole queue (or, for a reservation without
// bound, every request). Over Envoy such rules take no reservation: the
// leaky bucket passes one request per 1/rate, the bucket of nothing none.
func TestAttackReservedTurnsPassAtOnceOverEnvoy(t *testing.T) {
	pol, err := policy.Parse("sluice.yaml", []byte(`rules:
  - name: shaped
    match: {domain: edge}
    limit_keys: ["descriptor:client"]
    algorithm: leaky_bucket
    algorithm_config: {rps: 1, max_delay: 10s}
  - name: spaced
    match: {domain: spaced}
    limit_keys: ["descriptor:client"]
    algorithm_config: {rate: 1, period: 1s, capacity: 0, reserve: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, pol)
	expect(t, h.call(t, "edge", 0, desc("client", "c")), OK, OK, 0)
	for i := 0; i < 5; i++ {
		expect(t, h.call(t, "edge", 0, desc("client", "c")), OVER, OVER, 0)
	}
	h.clock.Advance(time.Second)
	expect(t, h.call(t, "edge", 0, desc("client", "c")), OK, OK, 0)
	for i := 0; i < 3; i++ {
		if resp := h.call(t, "spaced", 0, desc("client", "c")); resp.OverallCode != OVER {
			t.Fatalf("capacity 0 over Envoy: call %d passed: %v", i, resp)
		}
	}
}

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
