package envoyrls_test

import (
	"context"
	"log/slog"
	"strconv"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
)

// BenchmarkShouldRateLimit is the service's own cost per call, without
// gRPC: one descriptor over 10,000 values on the memory store.
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, c := range []struct{ name, yaml string }{
		{"sluice", "rules:\n  - name: per-user\n    match: {domain: bench}\n    limit_keys: [\"descriptor:user\"]\n    algorithm: token_bucket\n    algorithm_config: {rps: 100, burst: 100}\n"},
		{"reference", "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 100}\n"},
	} {
		b.Run(c.name, func(b *testing.B) {
			var pol *policy.Policy
			var err error
			if envoyrls.IsReferenceConfig([]byte(c.yaml)) {
				pol, err = envoyrls.ParseReferenceConfig("bench", []byte(c.yaml))
			} else {
				pol, err = policy.Parse("bench", []byte(c.yaml))
			}
			if err != nil {
				b.Fatal(err)
			}
			s := envoyrls.New(pol, sluice.New(memory.New(memory.Options{})), envoyrls.Options{Logger: slog.New(slog.DiscardHandler)})
			reqs := make([]*rlspb.RateLimitRequest, 10_000)
			for i := range reqs {
				reqs[i] = &rlspb.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{{
					Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "user-" + strconv.Itoa(i)}},
				}}}
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					if _, err := s.ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
						b.Fatal(err)
					}
					i += 7
				}
			})
		})
	}
}
