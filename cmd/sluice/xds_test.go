package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	xdsserver "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/envoyrls/xds"
)

// TestServeXDSReferenceEnv runs sluice serve with the environment Envoy
// Gateway gives the reference server (CONFIG_TYPE=GRPC_XDS_SOTW and its
// CONFIG_GRPC_XDS_* variables) against go-control-plane's server on its
// snapshot cache: /readyz fails until the first snapshot is applied, then
// Envoy's calls get the snapshot's limits over gRPC, and the xDS metrics
// say so.
func TestServeXDSReferenceEnv(t *testing.T) {
	snaps := cache.NewSnapshotCache(true, cache.IDHash{}, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(g, xdsserver.NewServer(context.Background(), snaps, nil))
	go g.Serve(ln)
	t.Cleanup(g.Stop)

	t.Setenv("CONFIG_TYPE", "GRPC_XDS_SOTW")
	t.Setenv("CONFIG_GRPC_XDS_SERVER_URL", ln.Addr().String())
	t.Setenv("CONFIG_GRPC_XDS_NODE_ID", "eg-ratelimit")
	t.Setenv("CONFIG_GRPC_XDS_NODE_METADATA", "cluster=test")
	t.Setenv("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10ms")
	t.Setenv("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "100ms")
	addrs, logs := startServeArgs(t, "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0")
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addrs.API + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "no rate limit configuration") {
		t.Fatalf("/readyz before a snapshot: %d %s", code, body)
	}
	rc := &rlsconf.RateLimitConfig{Name: "default/eg/http", Domain: "default/eg/http", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "rule-0-match-0", RateLimit: &rlsconf.RateLimitPolicy{RequestsPerUnit: 1, Unit: rlsconf.RateLimitUnit_YEAR}},
	}}
	snap, err := cache.NewSnapshot("1", map[string][]types.Resource{xds.TypeURL: {rc}})
	if err != nil {
		t.Fatal(err)
	}
	if err := snaps.SetSnapshot(context.Background(), "eg-ratelimit", snap); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		code, _ := get("/readyz")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never ready:\n%s", logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	conn, err := grpc.NewClient(addrs.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlspb.NewRateLimitServiceClient(conn)
	ask := func() rlspb.RateLimitResponse_Code {
		resp, err := rls.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "default/eg/http", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "rule-0-match-0", Value: "alice"}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode()
	}
	if a, b := ask(), ask(); a != rlspb.RateLimitResponse_OK || b != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("1/year for one value: %v then %v", a, b)
	}
	if _, m := get("/metrics"); !strings.Contains(m, "sluice_xds_applied 1") || !strings.Contains(m, "sluice_xds_snapshots_applied_total 1") {
		t.Fatalf("xds metrics:\n%s", grepLines(m, "sluice_xds"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
