package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/internal/proxytest"
	"github.com/sluicehq/sluice/internal/testcert"
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

// TestServeReferenceConfig runs sluice serve on the reference server's
// format, as a deployment switching from it would, and asks over gRPC.
func TestServeReferenceConfig(t *testing.T) {
	addr := proxytest.FreeAddr(t)
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

const envoyRule = `rules:
  - name: per-client
    match: {domain: edge}
    limit_keys: ["descriptor:client"]
    algorithm_config: {rps: 1, burst: 5}
`

func askEnvoy(ctx context.Context, cc *grpc.ClientConn) (*rlspb.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return rlspb.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "client", Value: "c1"}}},
	}})
}

// Attack: the operator keeps the decision API on loopback, but the Envoy
// service listened on every interface (":8081"), so anyone on the network
// could charge (or refund) any bucket over gRPC. Its default address now
// follows listen's host.
func TestAttackGRPCListensBeyondLoopbackAPI(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "loopback.yaml")
	if err := os.WriteFile(cfg, []byte("listen: \"127.0.0.1:0\"\n"+envoyRule), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, args := range map[string][]string{
		"listen in the file":   {"--config", cfg},
		"--listen on the flag": {"--listen", "127.0.0.1:0"}, // the embedded default policy
	} {
		t.Run(name, func(t *testing.T) {
			_, logs := startServeArgs(t, args...)
			addr := grpcAddr(t, logs)
			host, _, err := net.SplitHostPort(addr)
			if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
				t.Fatalf("the gRPC service listens on %s while the decision API is loopback-only", addr)
			}
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			if _, err := askEnvoy(context.Background(), cc); err != nil {
				t.Fatalf("the loopback gRPC service does not answer: %v", err)
			}
		})
	}
}

// startTLSEnvoy writes a CA and a server certificate next to a config
// whose grpc_tls names them by relative paths, and runs serve on it.
func startTLSEnvoy(t *testing.T, mutual bool) (addr string, ca *testcert.CA) {
	t.Helper()
	dir := t.TempDir()
	ca = testcert.New(t, "sluice test CA")
	cert, key := ca.Issue(t, 2, "127.0.0.1", x509.ExtKeyUsageServerAuth)
	files := map[string][]byte{"tls/server.pem": cert, "tls/server-key.pem": key, "tls/clients-ca.PEM": ca.PEM}
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tlsYAML := "grpc_tls: {cert_file: tls/server.pem, key_file: tls/server-key.pem}\n"
	if mutual {
		tlsYAML = "grpc_tls: {cert_file: tls/server.pem, key_file: tls/server-key.pem, client_ca_file: tls/clients-ca.PEM}\n"
	}
	cfg := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(cfg, []byte("grpc_listen: \"127.0.0.1:0\"\n"+tlsYAML+envoyRule), 0o600); err != nil {
		t.Fatal(err)
	}
	_, logs := startServeArgs(t, "--listen", "127.0.0.1:0", "--config", cfg)
	addr = grpcAddr(t, logs)
	return addr, ca
}

func dialEnvoy(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func clientTLS(t *testing.T, trust *testcert.CA, cert, key []byte) credentials.TransportCredentials {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(trust.Cert)
	c := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cert != nil {
		pair, err := tls.X509KeyPair(cert, key)
		if err != nil {
			t.Fatal(err)
		}
		// Presented whatever CAs the server names, as an attacker would.
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
	}
	return credentials.NewTLS(c)
}

// Attack: a caller without a client certificate (or with one from
// another CA) reaches a service configured for mutual TLS and charges
// buckets. Only certificates from client_ca_file are served.
func TestAttackGRPCMutualTLSWithoutClientCert(t *testing.T) {
	addr, ca := startTLSEnvoy(t, true)
	ctx := context.Background()

	if _, err := askEnvoy(ctx, dialEnvoy(t, addr, insecure.NewCredentials())); err == nil {
		t.Error("a plaintext client was served by a TLS-only service")
	}
	if _, err := askEnvoy(ctx, dialEnvoy(t, addr, clientTLS(t, ca, nil, nil))); err == nil {
		t.Error("a client without a certificate was served under mutual TLS")
	}
	stranger := testcert.New(t, "another CA")
	sc, sk := stranger.Issue(t, 3, "127.0.0.1", x509.ExtKeyUsageClientAuth)
	if _, err := askEnvoy(ctx, dialEnvoy(t, addr, clientTLS(t, ca, sc, sk))); err == nil {
		t.Error("a client certificate from another CA was accepted")
	}
	cc, ck := ca.Issue(t, 4, "127.0.0.1", x509.ExtKeyUsageClientAuth)
	resp, err := askEnvoy(ctx, dialEnvoy(t, addr, clientTLS(t, ca, cc, ck)))
	if err != nil {
		t.Fatalf("a client with a certificate from client_ca_file was refused: %v", err)
	}
	if resp.OverallCode != rlspb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 4 {
		t.Errorf("answer over mutual TLS: %v", resp)
	}
}

// Attack: with grpc_tls configured, a plaintext client (which an
// attacker on the path could be, or impersonate) is still served. Over
// TLS without client_ca_file any TLS client is served.
func TestAttackGRPCPlaintextToTLSService(t *testing.T) {
	addr, ca := startTLSEnvoy(t, false)
	ctx := context.Background()
	if _, err := askEnvoy(ctx, dialEnvoy(t, addr, insecure.NewCredentials())); err == nil {
		t.Error("a plaintext client was served by a TLS service")
	}
	if _, err := askEnvoy(ctx, dialEnvoy(t, addr, clientTLS(t, ca, nil, nil))); err != nil {
		t.Errorf("a TLS client was refused: %v", err)
	}
}

// Envoy's calls carry no token, so beyond loopback anyone on the network
// can charge any bucket over gRPC; serve says so at start, as it does for
// a decision API without api_token_env, and stays quiet on loopback.
func TestServeWarnsOfListenersOpenToTheNetwork(t *testing.T) {
	const grpcWarning, apiWarning = "the Envoy rate limit service is open to anyone", "the decision API is open to anyone"
	for _, c := range []struct {
		listen string
		warn   bool
	}{
		{"0.0.0.0:0", true},
		{"127.0.0.1:0", false},
	} {
		t.Run(c.listen, func(t *testing.T) {
			cfg := writePolicy(t, "listen: \""+c.listen+"\"\ngrpc_listen: \""+strings.TrimSuffix(c.listen, ":0")+":0\"\n"+envoyRule)
			_, logs := startServeArgs(t, "--config", cfg)
			got := logs.String()
			for _, w := range []string{grpcWarning, apiWarning} {
				if strings.Contains(got, w) != c.warn {
					t.Errorf("listening on %s, warned %q: %v, want %v:\n%s", c.listen, w, !c.warn, c.warn, got)
				}
			}
		})
	}
}
