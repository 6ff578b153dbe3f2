package policy_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/serverconf"
)

func TestDefaultGRPCListen(t *testing.T) {
	for listen, want := range map[string]string{
		"127.0.0.1:8080": "127.0.0.1:8081", // loopback stays loopback
		"[::1]:9000":     "[::1]:8081",
		"localhost:80":   "localhost:8081",
		"10.0.0.5:8080":  "10.0.0.5:8081", // one interface: the same one
		":8080":          ":8081",         // every interface, as the operator chose for the API
		"127.0.0.1:0":    "127.0.0.1:0",   // any free port
		"not an address": "127.0.0.1:8081",
	} {
		if got := serverconf.DefaultGRPCListen(listen); got != want {
			t.Errorf("DefaultGRPCListen(%q) = %q, want %q", listen, got, want)
		}
	}
	const r = "rules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n"
	for cfg, want := range map[string]struct {
		addr    string
		derived bool
	}{
		r:                                     {":8081", true},
		"listen: \"127.0.0.1:9090\"\n" + r:    {"127.0.0.1:8081", true},
		"listen: \"127.0.0.1:0\"\n" + r:       {"127.0.0.1:0", true},
		"grpc_listen: \"0.0.0.0:7000\"\n" + r: {"0.0.0.0:7000", false},
		"grpc_listen: \"\"\n" + r:             {"", false},
		"listen: \"127.0.0.1:0\"\ngrpc_listen: \"127.0.0.1:0\"\n" + r: {"127.0.0.1:0", false},
	} {
		s := mustServer(t, cfg)
		if s.GRPCListen != want.addr || s.GRPCListenDerived != want.derived {
			t.Errorf("%q: grpc_listen %q (derived %v), want %q (%v)", cfg, s.GRPCListen, s.GRPCListenDerived, want.addr, want.derived)
		}
	}
	got := problems(t, "listen: \"127.0.0.1:8081\"\n"+r)
	if len(got) != 1 || !strings.Contains(got[0], `grpc_listen: "127.0.0.1:8081" is also listen's address (grpc_listen defaults to listen's host with port 8081`) {
		t.Errorf("a derived grpc_listen on listen's address: %v", got)
	}
}

func TestAllowNegativeHits(t *testing.T) {
	const r = "rules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n"
	if mustParse(t, r).Settings.AllowNegativeHits {
		t.Error("refunds from Envoy callers are allowed by default")
	}
	if !mustParse(t, "allow_negative_hits: true\n"+r).Settings.AllowNegativeHits {
		t.Error("allow_negative_hits: true was not read")
	}
	if got := problems(t, "allow_negative_hits: \"yes\"\n"+r); len(got) != 1 || !strings.Contains(got[0], "c.yaml:1: allow_negative_hits: must be true or false") {
		t.Errorf("a string for allow_negative_hits: %v", got)
	}
}

// writeServerCert writes a self-signed certificate and its key into dir.
func writeServerCert(t *testing.T, dir string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]*pem.Block{"cert.pem": {Type: "CERTIFICATE", Bytes: der}, "key.pem": {Type: "EC PRIVATE KEY", Bytes: kder}} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestGRPCTLS(t *testing.T) {
	dir := t.TempDir()
	writeServerCert(t, dir)
	if err := os.WriteFile(filepath.Join(dir, "junk.pem"), []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	const r = "rules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n"
	load := func(cfg string) (serverconf.Settings, error) {
		file := filepath.Join(dir, "p.yaml")
		if err := os.WriteFile(file, []byte(cfg+r), 0o600); err != nil {
			t.Fatal(err)
		}
		_, s, err := policy.ParseConfig(file, []byte(cfg+r))
		return s, err
	}
	// Relative paths are relative to the config file; the CA file may be
	// the certificate itself (a self-signed client CA).
	p, err := load("grpc_tls: {cert_file: cert.pem, key_file: key.pem, client_ca_file: cert.pem}\n")
	if err != nil {
		t.Fatal(err)
	}
	g := p.GRPCTLS
	if g == nil || g.CertFile != filepath.Join(dir, "cert.pem") || g.Config.ClientAuth != tls.RequireAndVerifyClientCert || g.Config.ClientCAs == nil || g.Config.MinVersion < tls.VersionTLS12 {
		t.Fatalf("grpc_tls with a client CA: %+v", g)
	}
	if p, err := load("grpc_tls: {cert_file: cert.pem, key_file: key.pem}\n"); err != nil || p.GRPCTLS.Config.ClientAuth != tls.NoClientCert {
		t.Fatalf("grpc_tls without a client CA: %v", err)
	}
	if p, err := load(""); err != nil || p.GRPCTLS != nil {
		t.Fatalf("no grpc_tls: %v", err)
	}
	for cfg, want := range map[string][]string{
		"grpc_tls: {cert_file: cert.pem}\n":                                             {"p.yaml:1: grpc_tls.key_file: is required"},
		"grpc_tls: {key_file: key.pem, client_ca_file: junk.pem}\n":                     {"grpc_tls.cert_file: is required", "grpc_tls.client_ca_file: " + filepath.Join(dir, "junk.pem") + ": holds no PEM CERTIFICATE block"},
		"grpc_tls: {cert_file: none.pem, key_file: key.pem}\n":                          {"p.yaml:1: grpc_tls.cert_file: open " + filepath.Join(dir, "none.pem")},
		"grpc_tls: {cert_file: junk.pem, key_file: key.pem}\n":                          {"grpc_tls.cert_file: " + filepath.Join(dir, "junk.pem") + " with " + filepath.Join(dir, "key.pem") + ": tls:"},
		"grpc_tls: {cert_file: cert.pem, key_file: key.pem, client_ca_file: key.pem}\n": {"holds a EC PRIVATE KEY block; want CERTIFICATE blocks only"},
		"grpc_tls: {cert_file: cert.pem, key_file: \"\"}\n":                             {"grpc_tls.key_file: must be a file path"},
		"grpc_tls: {cert: cert.pem}\n":                                                  {"grpc_tls.cert: unknown field (known: cert_file, key_file, client_ca_file)"},
		"grpc_tls: true\n":                                                              {"grpc_tls: must be a mapping of fields"},
	} {
		_, err := load(cfg)
		for _, w := range want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%q: got %v, want %q", cfg, err, w)
			}
		}
	}
}

func TestGRPCLimits(t *testing.T) {
	const r = "rules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n"
	d := mustServer(t, r).GRPC
	if d != serverconf.DefaultGRPCLimits {
		t.Fatalf("defaults: %+v", d)
	}
	if d.MaxConcurrentStreams <= 0 || d.MaxRecvBytes <= 0 || d.MaxInFlight <= 0 || d.KeepaliveMinTime <= 0 || d.MaxConnectionIdle <= 0 {
		t.Fatalf("a default leaves the gRPC listener without a bound: %+v", d)
	}
	p := mustServer(t, `grpc:
  max_conns: 64
  max_concurrent_streams: 10
  max_recv_bytes: 65536
  max_in_flight: 32
  keepalive_min_time: 30s
  max_connection_idle: 1m
`+r)
	want := serverconf.GRPCLimits{MaxConns: 64, MaxConcurrentStreams: 10, MaxRecvBytes: 65536, MaxInFlight: 32, KeepaliveMinTime: 30 * time.Second, MaxConnectionIdle: time.Minute}
	if got := p.GRPC; got != want {
		t.Fatalf("grpc: %+v, want %+v", got, want)
	}
	// Zero fields (a policy built in code) take the defaults.
	if got := (serverconf.GRPCLimits{MaxInFlight: 7}).WithDefaults(); got.MaxInFlight != 7 || got.MaxRecvBytes != serverconf.DefaultGRPCLimits.MaxRecvBytes || got.MaxConns != 0 {
		t.Fatalf("WithDefaults: %+v", got)
	}
	got := problems(t, `grpc:
  max_conns: 0
  max_concurrent_streams: 100000
  max_recv_bytes: 8388608
  max_in_flight: -1
  keepalive_min_time: 0s
  max_connection_idle: soon
  max_streams: 5
`+r)
	wantErrs := []string{
		"c.yaml:2: grpc.max_conns: must be between 1 and 1048576 (got 0)",
		"c.yaml:3: grpc.max_concurrent_streams: must be between 1 and 10000 (got 100000)",
		"c.yaml:4: grpc.max_recv_bytes: must be between 4096 and 4194304 (got 8388608)",
		"c.yaml:5: grpc.max_in_flight: must be between 1 and 1048576 (got -1)",
		`c.yaml:6: grpc.keepalive_min_time: must be > 0 (got "0s")`,
		`c.yaml:7: grpc.max_connection_idle: must be a duration such as "1m" or "500ms" (got "soon")`,
		"c.yaml:8: grpc.max_streams: unknown field (known: max_conns, max_concurrent_streams, max_recv_bytes, max_in_flight, keepalive_min_time, max_connection_idle)",
	}
	if strings.Join(got, "\n") != strings.Join(wantErrs, "\n") {
		t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(wantErrs, "\n"))
	}
}
