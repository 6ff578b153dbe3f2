package policy

// The sections of the file that are the server's, not the rules': the
// listeners (listen, grpc_listen, api_listen, proxy), the store, and the
// server, grpc and grpc_tls sections. They are read into a
// serverconf.Settings (see ParseConfig), which a Policy does not hold.

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"net"

	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice/serverconf"
)

// listenAt reads a listener's address field into dst. It reports whether
// dst then holds a good address: the one given, the default when the
// field is absent, or "" (serve none) where allowEmpty.
func (l *loader) listenAt(o *obj, field string, dst *string, allowEmpty bool) bool {
	v, n, ok := o.str(field)
	switch {
	case !ok:
		return n == nil // absent: the default stands
	case v == "" && allowEmpty:
		*dst = ""
		return true
	}
	if msg := serverconf.CheckListen(v); msg != "" {
		l.errf(n, field, "%s", msg)
		return false
	}
	*dst = v
	return true
}

// listen reads listen and grpc_listen, whose default follows listen.
func (l *loader) listen(o *obj, s *serverconf.Settings, addrs map[string]string) {
	if l.listenAt(o, "listen", &s.Listen, false) {
		addrs["listen"] = s.Listen
	}
	s.GRPCListen, s.GRPCListenDerived = serverconf.DefaultGRPCListen(s.Listen), !o.has("grpc_listen")
	if l.listenAt(o, "grpc_listen", &s.GRPCListen, true) && s.GRPCListen != "" {
		addrs["grpc_listen"] = s.GRPCListen
	}
}

func (l *loader) store(o *obj, s *serverconf.Settings) {
	if n, ok := o.vals["store"]; ok {
		if so := l.object(n, "store", []string{"url"}); so != nil {
			so.checked("url", serverconf.CheckStoreURL, &s.StoreURL)
		}
	}
}

// checked reads a string field into *dst when check (serverconf's)
// finds nothing wrong with it. It reports whether the field is a string.
func (o *obj) checked(name string, check func(string) string, dst *string) bool {
	v, n, ok := o.str(name)
	if !ok {
		return false
	}
	if msg := check(v); msg != "" {
		o.l.errf(n, join(o.path, name), "%s", msg)
	} else {
		*dst = v
	}
	return true
}

// proxy reads the reverse proxy's section: listen and upstream, both or
// neither.
func (l *loader) proxy(o *obj, s *serverconf.Settings, addrs map[string]string) {
	n, ok := o.vals["proxy"]
	if !ok {
		return
	}
	po := l.object(n, "proxy", []string{"listen", "upstream", "upstream_timeout"})
	if po == nil {
		return
	}
	upOK := po.checked("upstream", serverconf.CheckUpstream, &s.ProxyUpstream)
	lsOK := po.checked("listen", serverconf.CheckListen, &s.ProxyListen)
	if lsOK && s.ProxyListen != "" {
		addrs["proxy.listen"] = s.ProxyListen
	}
	if upOK && !po.has("listen") {
		l.errf(po.n, "proxy.listen", "is required with proxy.upstream (the address the proxy serves on, such as \":8000\")")
	}
	if lsOK && !po.has("upstream") {
		l.errf(po.n, "proxy.upstream", "is required with proxy.listen (the URL requests are forwarded to)")
	}
	if d, dn, ok := po.duration("upstream_timeout"); ok {
		switch {
		case d <= 0:
			l.errf(dn, "proxy.upstream_timeout", "must be > 0 (got %q): an upstream that never answers would hold every request sent to it", dn.Value)
		case !po.has("upstream"):
			l.errf(dn, "proxy.upstream_timeout", "applies only with proxy.upstream and proxy.listen")
		default:
			s.ProxyUpstreamTimeout = d
		}
	}
}

// apiListen reads api_listen, the decision API's own listener.
func (l *loader) apiListen(o *obj, s *serverconf.Settings, addrs map[string]string) {
	if l.listenAt(o, "api_listen", &s.APIListen, false) && s.APIListen != "" {
		addrs["api_listen"] = s.APIListen
	}
}

// checkDistinct reports two listeners given one address.
func (l *loader) checkDistinct(o *obj, addrs map[string]string) {
	seen := map[string]string{}
	for _, f := range []string{"listen", "grpc_listen", "proxy.listen", "api_listen"} {
		a, ok := addrs[f]
		if !ok {
			continue
		}
		if _, port, _ := net.SplitHostPort(a); port == "0" {
			continue // any free port: never the same as another
		}
		if other, dup := seen[a]; dup {
			var n *yaml.Node
			if f == "proxy.listen" {
				if pn, ok := o.vals["proxy"]; ok {
					n = pn
				}
			} else {
				n = o.vals[f]
			}
			n = cmp.Or(n, o.n)
			hint := ""
			if f == "grpc_listen" && !o.has("grpc_listen") {
				hint = " (grpc_listen defaults to listen's host with port 8081; set grpc_listen to another address)"
			}
			l.errf(n, f, "%q is also %s's address%s", a, other, hint)
			continue
		}
		seen[a] = f
	}
}

var serverFields = []string{"read_header_timeout", "read_timeout", "write_timeout", "idle_timeout", "max_header_bytes", "max_conns", "max_conns_per_client", "shutdown_drain"}

// serverLimits reads the server section into s, which holds the defaults.
// Zero would mean "no deadline" to net/http, so every timeout must be
// positive: a listener without deadlines is what slow clients exploit.
func (l *loader) serverLimits(n *yaml.Node, s *serverconf.ServerLimits) {
	o := l.object(n, "server", serverFields)
	if o == nil {
		return
	}
	const held = ": a listener without this deadline can be held by a client that never finishes"
	o.positiveDuration("read_header_timeout", held, &s.ReadHeaderTimeout)
	o.positiveDuration("read_timeout", held, &s.ReadTimeout)
	o.positiveDuration("write_timeout", held, &s.WriteTimeout)
	o.positiveDuration("idle_timeout", held, &s.IdleTimeout)
	o.intIn("max_header_bytes", 4<<10, 16<<20, &s.MaxHeaderBytes)
	if d, dn, ok := o.duration("shutdown_drain"); ok {
		if d < 0 || d > serverconf.MaxShutdownDrain {
			l.errf(dn, "server.shutdown_drain", "must be between 0s (no drain) and %v (got %q)", serverconf.MaxShutdownDrain, dn.Value)
		} else {
			s.ShutdownDrain = d
		}
	}
	o.intIn("max_conns", 1, 1<<20, &s.MaxConns)
	o.intIn("max_conns_per_client", 1, 1<<20, &s.MaxConnsPerClient)
}

var grpcFields = []string{"max_conns", "max_concurrent_streams", "max_recv_bytes", "max_in_flight", "keepalive_min_time", "max_connection_idle"}

// grpcLimits reads the grpc section into g, which holds the defaults.
func (l *loader) grpcLimits(n *yaml.Node, g *serverconf.GRPCLimits) {
	o := l.object(n, "grpc", grpcFields)
	if o == nil {
		return
	}
	o.intIn("max_conns", 1, 1<<20, &g.MaxConns)
	o.intIn("max_concurrent_streams", 1, 10000, &g.MaxConcurrentStreams)
	// grpc-go's own default is the top: beyond it a call is no Envoy's.
	o.intIn("max_recv_bytes", 4<<10, 4<<20, &g.MaxRecvBytes)
	o.intIn("max_in_flight", 1, 1<<20, &g.MaxInFlight)
	o.positiveDuration("keepalive_min_time", "", &g.KeepaliveMinTime)
	o.positiveDuration("max_connection_idle", "", &g.MaxConnectionIdle)
}

// grpcTLS reads the grpc_tls section: {cert_file, key_file,
// client_ca_file}. The files are read and checked now, so that a missing
// or mismatched file is a config error (sluice check reports it) rather
// than a listener that fails at start.
func (l *loader) grpcTLS(n *yaml.Node, path string) *serverconf.GRPCTLS {
	o := l.object(n, path, []string{"cert_file", "key_file", "client_ca_file"})
	if o == nil {
		return nil
	}
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
		if pool, msg = serverconf.CertPool(ca); msg != "" {
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
	return serverconf.NewGRPCTLS(certPath, keyPath, caPath, pair, pool)
}
