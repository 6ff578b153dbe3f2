package main

import (
	"context"
	"log/slog"
	"net"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/serverconf"
)

func TestEnvoyServesExample(t *testing.T) {
	_, p, err := loadPolicy("../../examples/ratelimit-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lim := sluice.New(memory.New(memory.Options{}))
	log := slog.New(slog.DiscardHandler)
	gate := httpgate.New(p, lim, httpgate.Options{Logger: log})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr, stop := startEnvoy(&server{Gate: gate, Limiter: lim, Logger: log}, runSettings{Settings: serverconf.Settings{GRPCListen: ln.Addr().String()}}, ln)
	defer stop()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	rls := rlspb.NewRateLimitServiceClient(cc)
	call := func() *rlspb.RateLimitResponse {
		resp, err := rls.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "192.0.2.66"}}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if resp := call(); resp.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Errorf("the blocked address got %v", resp)
	}
}

// envoyFreeAddr returns a loopback address with a port that was free a
// moment ago.
func envoyFreeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestServeReferenceConfig runs sluice serve on the reference server's
// format, as a deployment switching from it would, and asks over gRPC.
func TestServeReferenceConfig(t *testing.T) {
	addr := envoyFreeAddr(t)
	startServe(t, "--config", "../../examples/ratelimit-config.yaml", "--grpc-listen", addr)
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	rls := rlspb.NewRateLimitServiceClient(cc)
	ask := func(hits uint32) *rlspb.RateLimitResponse {
		t.Helper()
		resp, err := rls.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "edge", HitsAddend: hits, Descriptors: []*rlv3.RateLimitDescriptor{
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "path", Value: "/api/search"}, {Key: "client_id", Value: "c1"}}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// search-per-client: 10 per second. A window may end between the two
	// calls, so the second is over the limit or finds a fresh window.
	if resp := ask(10); resp.OverallCode != rlspb.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit.GetName() != "search-per-client" {
		t.Fatalf("first call: %v", resp)
	}
	if resp := ask(1); resp.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT && resp.Statuses[0].LimitRemaining != 9 {
		t.Errorf("second call: %v", resp)
	}
}
