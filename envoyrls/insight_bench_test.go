package envoyrls_test

import (
	"context"
	"log/slog"
	"strconv"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/insight"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/policy"
)

// BenchmarkShouldRateLimitObserved is BenchmarkShouldRateLimit's sluice
// policy with the decisions counted as sluice serve counts them:
// Prometheus alone, and Prometheus with the live page's statistics, the
// store wrapped in the metrics' instrumentation in both, as served.
func BenchmarkShouldRateLimitObserved(b *testing.B) {
	pol, err := policy.Parse("bench", []byte("rules:\n  - name: per-user\n    match: {domain: bench}\n    limit_keys: [\"descriptor:user\"]\n    algorithm: token_bucket\n    algorithm_config: {rps: 100, burst: 100}\n"))
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]*rlspb.RateLimitRequest, 10_000)
	for i := range reqs {
		reqs[i] = &rlspb.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{{
			Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "user-" + strconv.Itoa(i)}},
		}}}
	}
	for _, withInsight := range []bool{false, true} {
		name := "metrics"
		if withInsight {
			name = "metrics+insight"
		}
		b.Run(name, func(b *testing.B) {
			m := metrics.New(prometheus.NewRegistry())
			obs := []policy.Observer{m}
			if withInsight {
				stats := insight.New(insight.Options{})
				m.OnStoreCall(stats.StoreCall)
				obs = append(obs, stats)
			}
			s := envoyrls.New(pol, sluice.New(m.InstrumentStore(memory.New(memory.Options{}))), envoyrls.Options{Logger: slog.New(slog.DiscardHandler), Observer: policy.Observers(obs...)})
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
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
