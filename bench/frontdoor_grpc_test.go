package bench

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"runtime/pprof"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
)

// frontDoorGRPC runs the Envoy rate limit service's pairs:
//
//   - grpc: sluice beside a no-op service, both on envoyrls.ServerOptions
//     (the stack sluice serve ships): extra-µs/op is sluice's own work.
//   - grpc-floor: the no-op service on grpc-go's defaults (grpc.NewServer()
//     with no options) beside the same service on envoyrls.ServerOptions
//     ("shipped"): the ratio is what sluice's server options and codec
//     buy the floor.
//
// The no-op service answers what sluice answers (the same status fields
// and RateLimit headers, taken from sluice's answer to a first call), so
// that the client decodes the same bytes from both sides: the client's
// work, which this process pays too, is then the same on both.
//
// Run it with -tags vtprotobuf, as sluice's image is built, so that the
// shipped stack includes the codec envoyrls.ServerOptions adds then:
//
//	go test -tags vtprotobuf -run '^$' -bench 'FrontDoor/grpc' -benchtime 1x
func frontDoorGRPC(b *testing.B, rounds int, round time.Duration, conns int, users []string) {
	pol, err := policy.Parse("bench", []byte(GRPCPolicy))
	if err != nil {
		b.Fatal(err)
	}
	srv := envoyrls.New(pol, sluice.New(memory.New(memory.Options{})), envoyrls.Options{Logger: slog.New(slog.DiscardHandler)})
	reqs := make([]*rlspb.RateLimitRequest, len(users))
	for i, u := range users {
		reqs[i] = &rlspb.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{{
			Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: u}},
		}}}
	}
	noop, err := NoopLikeSluice(srv)
	if err != nil {
		b.Fatal(err)
	}

	b.Run("grpc", func(b *testing.B) {
		compare(b, rounds, round, conns, "noop", "sluice",
			grpcCaller(b, startGRPC(b, "noop", noop, envoyrls.ServerOptions()...), conns, reqs),
			grpcCaller(b, startGRPC(b, "sluice", srv, envoyrls.ServerOptions()...), conns, reqs))
	})

	b.Run("grpc-floor", func(b *testing.B) {
		compare(b, rounds, round, conns, "default", "shipped",
			grpcCaller(b, startGRPC(b, "noop-default", noop), conns, reqs),
			grpcCaller(b, startGRPC(b, "noop-shipped", noop, envoyrls.ServerOptions()...), conns, reqs))
	})
}

// startGRPC serves svc (NoopRLS, or something with a Register method) on
// a server with opts, labelled name in CPU profiles.
func startGRPC(b *testing.B, name string, svc any, opts ...grpc.ServerOption) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var g *grpc.Server
	// Labelled, so that a CPU profile tells the servers apart (go tool
	// pprof -tagfocus server=NAME): the goroutines it starts, its stream
	// workers among them, inherit the label.
	pprof.Do(context.Background(), pprof.Labels("server", name), func(context.Context) {
		g = grpc.NewServer(opts...)
		switch s := svc.(type) {
		case NoopRLS:
			rlspb.RegisterRateLimitServiceServer(g, s)
		case *envoyrls.Server:
			s.Register(g)
		default:
			b.Fatalf("cannot serve %T", svc)
		}
		go g.Serve(ln)
	})
	b.Cleanup(g.Stop)
	return ln.Addr().String()
}

// grpcCaller spreads the workers over 4 connections, as Envoy keeps a few.
func grpcCaller(b *testing.B, addr string, conns int, reqs []*rlspb.RateLimitRequest) caller {
	clients := make([]rlspb.RateLimitServiceClient, 4)
	for i := range clients {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cc.Close() })
		clients[i] = rlspb.NewRateLimitServiceClient(cc)
	}
	ctx := context.Background()
	return func(w, i int) error {
		resp, err := clients[w%len(clients)].ShouldRateLimit(ctx, reqs[i%len(reqs)])
		if err != nil {
			return err
		}
		if resp.OverallCode != rlspb.RateLimitResponse_OK {
			return fmt.Errorf("%s: %v", addr, resp.OverallCode)
		}
		return nil
	}
}
