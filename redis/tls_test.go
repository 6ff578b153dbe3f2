package redis_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/realserver"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redis"
)

// writeCert makes a throwaway CA-signed certificate for 127.0.0.1 and
// returns the CA pool and the server's cert and key files.
func writeCert(t *testing.T, dir string) (*x509.CertPool, string, string, string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return pool, write("ca.pem", "CERTIFICATE", caDER), write("cert.pem", "CERTIFICATE", der), write("key.pem", "EC PRIVATE KEY", keyDER)
}

// rediss:// with a private CA.
func TestTLS(t *testing.T) {
	redistest.Need(t, "redis-server", "")
	ports, err := realserver.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pool, caFile, certFile, keyFile := writeCert(t, dir)
	srv, err := redistest.Start(ports[0], dir, "--tls-port", strconv.Itoa(ports[1]), "--tls-cert-file", certFile,
		"--tls-key-file", keyFile, "--tls-ca-cert-file", caFile, "--tls-auth-clients", "no")
	if err != nil {
		realserver.Unavailable(t, fmt.Sprintf("redis-server did not start with TLS (built without it?): %v", err))
	}
	t.Cleanup(srv.Stop)
	url := "rediss://127.0.0.1:" + strconv.Itoa(ports[1])
	s := open(t, url, redis.Options{TLSConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}})
	lim := uniqueLimit(t, sluice.Spec{Name: "tls", TokensPerSecond: 1, Burst: 1})
	if d, err := conformance.Take(context.Background(), s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"}); err != nil || !d.Allowed {
		t.Fatalf("take over TLS: %v %+v", err, d)
	}
	// Without the CA, the server's certificate is not trusted.
	if bad, err := redis.Open(url, redis.Options{Timeout: time.Second}); err == nil {
		defer bad.Close()
		if _, err := conformance.Take(context.Background(), bad, engine.OpTake, sluice.Request{Limit: lim, Key: "k"}); err == nil {
			t.Fatal("TLS with an untrusted certificate succeeded")
		}
	}
}
