package serverconf

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testcert"
)

// handshake runs a TLS handshake between server and a client presenting
// cert (nil: none) over loopback TCP, and returns the server's error.
func handshake(t *testing.T, server *tls.Config, ca *testcert.CA, cert, key []byte) error {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	cc := &tls.Config{RootCAs: roots, ServerName: "rls.local", MinVersion: tls.VersionTLS12}
	if cert != nil {
		pair, err := tls.X509KeyPair(cert, key)
		if err != nil {
			t.Fatal(err)
		}
		cc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := tls.Dial("tcp", ln.Addr().String(), cc)
		if err == nil {
			c.Close()
		}
	}()
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	s := tls.Server(conn, server)
	if err := s.SetDeadline(time.Now().Add(time.Minute)); err != nil {
		return err
	}
	return s.Handshake()
}

// Attack: under mutual TLS with GRPC_CLIENT_TLS_SAN, a client holding a
// certificate from the right CA issued to another name (another
// workload of the same mesh) is served as if it were the named one.
func TestAttackClientCertificateOfAnotherName(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.New(t, "test CA")
	sc, sk := ca.Issue(t, 2, "rls.local", x509.ExtKeyUsageServerAuth)
	for name, data := range map[string][]byte{"tls.crt": sc, "tls.key": sk, "ca.crt": ca.PEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := func(n string) string { return filepath.Join(dir, n) }
	cfg, err := LoadGRPCTLS(path("tls.crt"), path("tls.key"), path("ca.crt"), "envoy.gateway")
	if err != nil {
		t.Fatal(err)
	}
	okC, okK := ca.Issue(t, 3, "envoy.gateway", x509.ExtKeyUsageClientAuth)
	if err := handshake(t, cfg.Config, ca, okC, okK); err != nil {
		t.Fatalf("the named client was refused: %v", err)
	}
	otherC, otherK := ca.Issue(t, 4, "some-other-workload", x509.ExtKeyUsageClientAuth)
	if err := handshake(t, cfg.Config, ca, otherC, otherK); err == nil || !strings.Contains(err.Error(), "envoy.gateway") {
		t.Errorf("a certificate of another name was served: %v", err)
	}
	if err := handshake(t, cfg.Config, ca, nil, nil); err == nil {
		t.Error("a client without a certificate was served under mutual TLS")
	}

	// Without a client CA no certificate is asked for, so a SAN to check
	// would silently check nothing: refused.
	if _, err := LoadGRPCTLS(path("tls.crt"), path("tls.key"), "", "envoy.gateway"); err == nil {
		t.Error("a client SAN without a client CA was accepted")
	}
	if _, err := LoadGRPCTLS(path("tls.crt"), path("nope.key"), "", ""); err == nil || !strings.Contains(err.Error(), "nope.key") {
		t.Errorf("a missing key file: %v", err)
	}
}
