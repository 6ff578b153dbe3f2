package serverconf

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testCA signs certificates for the handshake tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert, key}
}

// issue signs a certificate naming dns as its one DNS SAN, as PEM.
func (ca *testCA) issue(t *testing.T, serial int64, dns string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: dns}, DNSNames: []string{dns},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// handshake runs a TLS handshake between server and a client presenting
// cert (nil: none) over loopback TCP, and returns the server's error.
func handshake(t *testing.T, server *tls.Config, ca *testCA, cert, key []byte) error {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
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
	ca := newTestCA(t)
	sc, sk := ca.issue(t, 2, "rls.local", x509.ExtKeyUsageServerAuth)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})
	for name, data := range map[string][]byte{"tls.crt": sc, "tls.key": sk, "ca.crt": caPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := func(n string) string { return filepath.Join(dir, n) }
	cfg, err := LoadGRPCTLS(path("tls.crt"), path("tls.key"), path("ca.crt"), "envoy.gateway")
	if err != nil {
		t.Fatal(err)
	}
	okC, okK := ca.issue(t, 3, "envoy.gateway", x509.ExtKeyUsageClientAuth)
	if err := handshake(t, cfg.Config, ca, okC, okK); err != nil {
		t.Fatalf("the named client was refused: %v", err)
	}
	otherC, otherK := ca.issue(t, 4, "some-other-workload", x509.ExtKeyUsageClientAuth)
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
