package envoyrls_test

import (
	"context"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/policy"
)

// negative is d marked is_negative_hits with n hits.
func negative(d *rlv3.RateLimitDescriptor, n uint64) *rlv3.RateLimitDescriptor {
	d = hits(d, n)
	d.IsNegativeHits = true
	return d
}

// Attack: any caller that reaches the gRPC service refills an exhausted
// bucket (its own, or anyone's it can name) with is_negative_hits and a
// large hits_addend, then spends it again: the limit never holds. Refunds
// are refused unless the configuration says allow_negative_hits, and a
// refused call charges and refunds nothing.
func TestAttackNegativeHitsRefillBucket(t *testing.T) {
	for name, h := range map[string]*harness{"reference format": startRef(t), "sluice format": startSluice(t)} {
		t.Run(name, func(t *testing.T) {
			// The victim's limit and the bystander's, whose capacity is room.
			domain, vk, ok, burst, room := "test", "k", "big", 3, 100
			if name == "sluice format" {
				domain, vk, ok, burst, room = "edge", "client", "client", 5, 5
			}
			victim := func() *rlv3.RateLimitDescriptor { return desc(vk, "victim") }
			other := func() *rlv3.RateLimitDescriptor { return desc(ok, "bystander") }
			expect(t, h.call(t, domain, uint32(burst), victim()), OK, OK, 0)
			for _, req := range [][]*rlv3.RateLimitDescriptor{
				{negative(victim(), 1_000_000)},
				{other(), negative(victim(), 1_000_000)}, // hidden behind an ordinary descriptor
				{negative(victim(), 0)},
			} {
				_, err := h.rls.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: domain, Descriptors: req})
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "allow_negative_hits") {
					t.Fatalf("a refund from the caller: %v, want InvalidArgument naming allow_negative_hits", err)
				}
			}
			// Nothing was refunded, and the ordinary descriptor of the
			// refused call was not charged.
			expect(t, h.call(t, domain, 0, victim()), OVER, OVER, 0)
			expect(t, h.call(t, domain, 0, hits(other(), 0)), OK, OK, room)
		})
	}
}

// With allow_negative_hits the refund is honoured, never above the limit.
func TestNegativeHitsAllowedBySluicePolicy(t *testing.T) {
	pol, err := policy.Parse("sluice.yaml", []byte("allow_negative_hits: true\n"+sluiceYAML))
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, pol)
	expect(t, h.call(t, "edge", 5, desc("client", "c")), OK, OK, 0)
	expect(t, h.call(t, "edge", 0, negative(desc("client", "c"), 2)), OK, OK, 2)
	expect(t, h.call(t, "edge", 0, negative(desc("client", "c"), 1000)), OK, OK, 5)
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
