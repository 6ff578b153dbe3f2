package envoyrls_test

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"sync/atomic"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/redis"
)

// BenchmarkShouldRateLimit is the service's own cost per call, without
// gRPC: one descriptor over 10,000 values on the memory store.
func BenchmarkShouldRateLimit(b *testing.B) {
	benchmarkShouldRateLimit(b, 1, func(b *testing.B) sluice.Store { return memory.New(memory.Options{}) })
}

// BenchmarkShouldRateLimitRedis is BenchmarkShouldRateLimit on the Redis
// store, on a redis-server of its own, from 64 callers as in
// bench/cmd/envoyload, so that the store batches as it does under load:
// the service's cost per call and the store client's, without gRPC.
func BenchmarkShouldRateLimitRedis(b *testing.B) {
	addr := redistest.Server(b)
	benchmarkShouldRateLimit(b, 32, func(b *testing.B) sluice.Store {
		s, err := redis.Open("redis://"+addr+"?timeout=1s", redis.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return s
	})
}

// benchmarkShouldRateLimit runs parallelism callers per GOMAXPROCS: set
// on each sub-benchmark, since a sub-benchmark does not inherit its
// parent's.
func benchmarkShouldRateLimit(b *testing.B, parallelism int, open func(b *testing.B) sluice.Store) {
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
			s := envoyrls.New(pol, sluice.New(open(b)), envoyrls.Options{Logger: slog.New(slog.DiscardHandler)})
			reqs := make([]*rlspb.RateLimitRequest, 10_000)
			for i := range reqs {
				reqs[i] = &rlspb.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{{
					Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "user-" + strconv.Itoa(i)}},
				}}}
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.SetParallelism(parallelism)
			var next atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				// Each caller starts at a value of its own, as callers
				// asking for different users do.
				i := int(next.Add(1)) * 7919
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

// BenchmarkShouldRateLimitGRPC is a call through gRPC over loopback, from
// 64 concurrent callers on 4 connections, on the memory store.
func BenchmarkShouldRateLimitGRPC(b *testing.B) {
	pol, err := policy.Parse("bench", []byte("rules:\n  - name: per-user\n    match: {domain: bench}\n    limit_keys: [\"descriptor:user\"]\n    algorithm: token_bucket\n    algorithm_config: {rps: 100, burst: 100}\n"))
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	g := grpc.NewServer(envoyrls.ServerOptions()...)
	envoyrls.New(pol, sluice.New(memory.New(memory.Options{})), envoyrls.Options{Logger: slog.New(slog.DiscardHandler)}).Register(g)
	go g.Serve(ln)
	defer g.Stop()
	clients := make([]rlspb.RateLimitServiceClient, 4)
	for i := range clients {
		cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Close()
		clients[i] = rlspb.NewRateLimitServiceClient(cc)
	}
	reqs := make([]*rlspb.RateLimitRequest, 10_000)
	for i := range reqs {
		reqs[i] = &rlspb.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{{
			Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "user-" + strconv.Itoa(i)}},
		}}}
	}
	var next atomic.Int64
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		n := int(next.Add(1))
		cl := clients[n%len(clients)]
		i := n * 7919
		for pb.Next() {
			if _, err := cl.ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
				b.Error(err)
				return
			}
			i += 7
		}
	})
}
