package policy

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"

	"gopkg.in/yaml.v3"
)

// grpcTLS reads the grpc_tls section: {cert_file, key_file,
// client_ca_file}. The files are read and checked now, so that a missing
// or mismatched file is a config error (sluice check reports it) rather
// than a listener that fails at start.
func (l *loader) grpcTLS(n *yaml.Node, path string) *GRPCTLS {
	o := l.object(n, path, []string{"cert_file", "key_file", "client_ca_file"})
	if o == nil {
		return nil
	}
	out := &GRPCTLS{}
	ok := true
	what := map[string]string{"cert_file": "the server's certificate (chain)", "key_file": "the server's private key"}
	file := func(field string) (string, *yaml.Node, []byte) {
		v, vn, has := o.str(field)
		switch {
		case !has && vn == nil && what[field] != "":
			l.errf(o.n, join(path, field), "is required: the PEM file of %s", what[field])
			ok = false
		case !has:
			ok = ok && vn == nil // absent optional, or a wrong type already reported
		case v == "":
			l.errf(vn, join(path, field), "must be a file path")
			ok = false
		default:
			p := l.resolve(v)
			data, err := l.readFile(p)
			if err == nil {
				return p, vn, data
			}
			l.errf(vn, join(path, field), "%v", err)
			ok = false
		}
		return "", nil, nil
	}
	certPath, certN, cert := file("cert_file")
	keyPath, _, key := file("key_file")
	caPath, caN, ca := file("client_ca_file")
	var pool *x509.CertPool
	if caPath != "" {
		var msg string
		if pool, msg = certPool(ca); msg != "" {
			l.errf(caN, join(path, "client_ca_file"), "%s: %s", caPath, msg)
			ok = false
		}
	}
	if certPath == "" || keyPath == "" {
		return nil
	}
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		l.errf(certN, join(path, "cert_file"), "%s with %s: %v", certPath, keyPath, err)
		ok = false
	}
	if !ok {
		return nil
	}
	out.CertFile, out.KeyFile, out.ClientCAFile = certPath, keyPath, caPath
	out.Config = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if pool != nil {
		out.Config.ClientCAs = pool
		out.Config.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return out
}

// certPool reads the CERTIFICATE blocks of a PEM file.
func certPool(data []byte) (*x509.CertPool, string) {
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
