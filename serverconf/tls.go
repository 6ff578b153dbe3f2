package serverconf

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
)

// GRPCTLS is the grpc_tls section: the server's certificate and key, and
// the CA that client certificates must chain to ("" = no client
// certificates asked for). Paths are resolved against the config file's
// directory; the files were read and checked when the policy was loaded.
type GRPCTLS struct {
	CertFile, KeyFile, ClientCAFile string
	// ClientSAN, when set, is a name a client certificate must carry
	// among its subject alternative names (DNS, URI, IP or email), on
	// top of chaining to ClientCAFile: the reference server's
	// GRPC_CLIENT_TLS_SAN.
	ClientSAN string
	// Config is ready to serve: the certificate, TLS 1.2 or later, and
	// when ClientCAFile is set, a verified client certificate required.
	Config *tls.Config
}

// NewGRPCTLS is the grpc_tls section of the files at certFile, keyFile
// and clientCAFile, read into pair (the certificate and its key) and
// clientCAs (nil, with clientCAFile "": no client certificates asked
// for). Its Config is TLS 1.2 or later, and asks for a verified client
// certificate when there is a CA.
func NewGRPCTLS(certFile, keyFile, clientCAFile string, pair tls.Certificate, clientCAs *x509.CertPool) *GRPCTLS {
	out := &GRPCTLS{CertFile: certFile, KeyFile: keyFile, ClientCAFile: clientCAFile}
	out.Config = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if clientCAs != nil {
		out.Config.ClientCAs = clientCAs
		out.Config.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return out
}

// LoadGRPCTLS reads the files of a gRPC TLS setting given outside a
// config file (the reference server's GRPC_SERVER_TLS_* environment):
// the server's certificate and key, the client CA ("" asks for no client
// certificate) and a SAN a client certificate must carry ("" for any).
// A file that cannot be read or used is an error naming it.
func LoadGRPCTLS(certFile, keyFile, clientCAFile, clientSAN string) (*GRPCTLS, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("gRPC over TLS needs both a certificate and a key file")
	}
	cert, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	key, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("%s with %s: %w", certFile, keyFile, err)
	}
	var pool *x509.CertPool
	if clientCAFile != "" {
		data, err := os.ReadFile(clientCAFile)
		if err != nil {
			return nil, err
		}
		var msg string
		if pool, msg = CertPool(data); msg != "" {
			return nil, fmt.Errorf("%s: %s", clientCAFile, msg)
		}
	}
	if clientSAN != "" && pool == nil {
		return nil, errors.New("a client certificate SAN to check needs a client CA: a certificate is only asked for under mutual TLS")
	}
	out := NewGRPCTLS(certFile, keyFile, clientCAFile, pair, pool)
	if clientSAN != "" {
		out.ClientSAN = clientSAN
		out.Config.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || !carriesSAN(cs.PeerCertificates[0], clientSAN) {
				return fmt.Errorf("client certificate without the subject alternative name %q", clientSAN)
			}
			return nil
		}
	}
	return out, nil
}

// carriesSAN reports whether c names san among its subject alternative
// names, of any kind.
func carriesSAN(c *x509.Certificate, san string) bool {
	return slices.Contains(c.DNSNames, san) || slices.Contains(c.EmailAddresses, san) ||
		slices.ContainsFunc(c.IPAddresses, func(ip net.IP) bool { return ip.String() == san }) ||
		slices.ContainsFunc(c.URIs, func(u *url.URL) bool { return u.String() == san })
}

// CertPool reads the CERTIFICATE blocks of a PEM file: the CAs that
// client certificates must chain to. The message says what is wrong
// with the file, "" when nothing is.
func CertPool(data []byte) (*x509.CertPool, string) {
	pool := x509.NewCertPool()
	found := 0
	for b, rest := pem.Decode(data); b != nil; b, rest = pem.Decode(rest) {
		if b.Type != "CERTIFICATE" {
			return nil, "holds a " + b.Type + " block; want CERTIFICATE blocks only (the CA that signs client certificates)"
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, err.Error()
		}
		pool.AddCert(c)
		found++
	}
	if found == 0 {
		return nil, "holds no PEM CERTIFICATE block"
	}
	return pool, ""
}
