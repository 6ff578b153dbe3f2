package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
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
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/envoyrls/xds"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testcert"
)

// envoyGatewayEnv is the environment Envoy Gateway's rate limit
// Deployment gives its container (its ratelimit infrastructure
// translator's default Deployment, every variable), with the certificate
// paths under dir, the control plane at xdsAddr and Redis at redisAddr.
func envoyGatewayEnv(dir, xdsAddr, redisAddr string) map[string]string {
	return map[string]string{
		"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true", "RUNTIME_WATCH_ROOT": "false",
		"LOG_LEVEL": "info", "USE_STATSD": "true", "STATSD_PORT": "9125",
		"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": xdsAddr, "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
		"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": filepath.Join(dir, "tls.crt"), "GRPC_SERVER_TLS_KEY": filepath.Join(dir, "tls.key"),
		"GRPC_SERVER_TLS_CA_CERT":        filepath.Join(dir, "ca.crt"),
		"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": filepath.Join(dir, "tls.crt"),
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY": filepath.Join(dir, "tls.key"), "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": filepath.Join(dir, "ca.crt"),
		"FORCE_START_WITHOUT_INITIAL_CONFIG": "true", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": redisAddr,
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "10ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "100ms",
	}
}

// TestServeEnvoyGatewayDeployment runs sluice serve in the place of the
// reference server inside Envoy Gateway: the container's environment as
// Envoy Gateway writes it (gRPC served over TLS from /certs, the control
// plane reached over mutual TLS, Redis, statsd and runtime variables
// sluice has no use for), real Redis, and go-control-plane's server as
// the control plane. The probes Envoy Gateway sets (GET /healthcheck on
// the HTTP port) pass before any limit exists, as the reference's do
// with FORCE_START_WITHOUT_INITIAL_CONFIG; Envoy's calls are answered
// over TLS, and not in plaintext.
func TestServeEnvoyGatewayDeployment(t *testing.T) {
	redisAddr := redistest.Server(t)
	dir := t.TempDir()
	ca := testcert.New(t, "envoy-gateway CA")
	// Envoy Gateway's one certificate serves gRPC and is the control
	// plane's client certificate.
	cert, key := ca.Issue(t, 2, "127.0.0.1", x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	for name, data := range map[string][]byte{"tls.crt": cert, "tls.key": key, "ca.crt": ca.PEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cpCert, cpKey := ca.Issue(t, 3, "127.0.0.1", x509.ExtKeyUsageServerAuth)
	cpPair, err := tls.X509KeyPair(cpCert, cpKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	cp := startControlPlane(t, grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{cpPair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	})))

	env := envoyGatewayEnv(dir, cp.addr, redisAddr)
	for k, v := range env {
		t.Setenv(k, v)
	}
	addrs, logs := startServeArgs(t, "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0")
	get := func(path string) int { code, _ := httpGet(t, addrs.API, path); return code }
	if code := get("/healthcheck"); code != 200 {
		t.Fatalf("Envoy Gateway's probe before a snapshot: %d, want 200 (the reference starts healthy with FORCE_START_WITHOUT_INITIAL_CONFIG)\n%s", code, logs.String())
	}
	cp.push(t, "envoy-ratelimit", "1", &rlsconf.RateLimitConfig{Name: "default/eg/http", Domain: "default/eg/http", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "rule-0-match-0", RateLimit: &rlsconf.RateLimitPolicy{RequestsPerUnit: 2, Unit: rlsconf.RateLimitUnit_HOUR}},
	}})
	waitStatus(t, addrs.API, "/readyz", 200, logs.String)

	if _, err := askEnvoy(context.Background(), dialEnvoy(t, addrs.GRPC, insecure.NewCredentials())); err == nil {
		t.Error("GRPC_SERVER_USE_TLS=true, yet a plaintext call was served")
	}
	rls := rlspb.NewRateLimitServiceClient(dialEnvoy(t, addrs.GRPC, clientTLS(t, ca, nil, nil)))
	var codes []rlspb.RateLimitResponse_Code
	for range 3 {
		resp, err := rls.ShouldRateLimit(context.Background(), egRequest("default/eg/http", "rule-0-match-0", "alice"))
		if err != nil {
			t.Fatalf("Envoy's call over TLS: %v\n%s", err, logs.String())
		}
		codes = append(codes, resp.GetOverallCode())
	}
	if codes[0] != rlspb.RateLimitResponse_OK || codes[1] != rlspb.RateLimitResponse_OK || codes[2] != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Errorf("2 per hour over TLS on Redis: %v", codes)
	}
}

// With HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true the reference's
// health check fails until a first configuration is applied, and so does
// sluice's /healthcheck.
func TestServeHealthcheckWaitsForConfig(t *testing.T) {
	cp := startControlPlane(t)
	t.Setenv("CONFIG_TYPE", "GRPC_XDS_SOTW")
	t.Setenv("CONFIG_GRPC_XDS_SERVER_URL", cp.addr)
	t.Setenv("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit")
	t.Setenv("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true")
	t.Setenv("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10ms")
	addrs, logs := startServeArgs(t, "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0")
	if code, _ := httpGet(t, addrs.API, "/healthcheck"); code != 500 {
		t.Fatalf("/healthcheck before a snapshot: %d, want 500", code)
	}
	cp.push(t, "envoy-ratelimit", "1", &rlsconf.RateLimitConfig{Name: "d", Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{RequestsPerUnit: 1, Unit: rlsconf.RateLimitUnit_HOUR}},
	}})
	waitStatus(t, addrs.API, "/healthcheck", 200, logs.String)
}

// controlPlane is go-control-plane's xDS server on its snapshot cache, as
// Envoy Gateway runs it, on a loopback port.
type controlPlane struct {
	addr  string
	snaps cache.SnapshotCache
}

func startControlPlane(t *testing.T, opts ...grpc.ServerOption) controlPlane {
	t.Helper()
	snaps := cache.NewSnapshotCache(true, cache.IDHash{}, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(opts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(g, xdsserver.NewServer(context.Background(), snaps, nil))
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	return controlPlane{addr: ln.Addr().String(), snaps: snaps}
}

// push sets node's snapshot to version, holding rcs.
func (cp controlPlane) push(t *testing.T, node, version string, rcs ...*rlsconf.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(rcs))
	for i, rc := range rcs {
		res[i] = rc
	}
	snap, err := cache.NewSnapshot(version, map[string][]types.Resource{xds.TypeURL: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.snaps.SetSnapshot(context.Background(), node, snap); err != nil {
		t.Fatal(err)
	}
}

// httpGet answers GET path on addr: the status and the body.
func httpGet(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitStatus polls path on addr until it answers want, for up to a minute.
func waitStatus(t *testing.T, addr, path string, want int, logs func() string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for code, _ := httpGet(t, addr, path); code != want; code, _ = httpGet(t, addr, path) {
		if time.Now().After(deadline) {
			t.Fatalf("%s never answered %d:\n%s", path, want, logs())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func egRequest(domain, key, value string) *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}}}
}
