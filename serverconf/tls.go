package serverconf

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
)

// GRPCTLS is the grpc_tls section: the server's certificate and key, and
// the CA that client certificates must chain to ("" = no client
// certificates asked for). Paths are resolved against the config file's
// directory; the files were read and checked when the policy was loaded.
type GRPCTLS struct {
	CertFile, KeyFile, ClientCAFile string
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

// CertPool reads the CERTIFICATE blocks of a PEM file: the CAs that
// client certificates must chain to. The message says what is wrong
// with the file, "" when nothing is.
func CertPool(data []byte) (*x509.CertPool, string) {
	pool := x509.NewCertPool()
	found := 0
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
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
