package main

import (
	"errors"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/internal/connlimit"
	"github.com/sluicehq/sluice/serverconf"
)

// startEnvoy serves Envoy's RateLimitService (with health and reflection)
// on ln, bound to set.GRPCListen, over TLS when set.GRPCTLS says so
// (mutual TLS with a client CA), and returns its address and the function
// that stops it. The service follows the HTTP gate's policy, so a reload
// applies to Envoy's calls too; a policy read from a reference-format file
// brings the file's descriptor lookup with it (envoyrls.ParseReferenceConfig
// keeps it for the policy), which the service uses in place of rules.
// The grpc section bounds it (envoyrls.LimitOptions), and the listener
// holds at most the grpc section's max_conns connections.
func startEnvoy(s *server, set runSettings, ln net.Listener) (addr string, stop func()) {
	bounds := set.GRPC.WithDefaults()
	gopts := append(envoyrls.ServerOptions(), envoyrls.LimitOptions(bounds, set.Server)...)
	// An eighth of the open file limit at most, within the quarter the
	// HTTP listeners leave (maxConns).
	conns := connCap(bounds.MaxConns, serverconf.DefaultGRPCMaxConns, openFileLimit(), 1, 8)
	ln = connlimit.New(ln, conns)
	security := "plaintext"
	if t := set.GRPCTLS; t != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(t.Config.Clone())))
		security = "tls"
		if t.ClientCAFile != "" {
			security = "mutual tls"
		}
	}
	g := grpc.NewServer(gopts...)
	opts := envoyrls.Options{Logger: s.Logger, Source: s.Gate.Policy, Observer: s.Gate.Observer(), MaxRequestBytes: bounds.MaxRecvBytes}
	rls := envoyrls.New(s.Gate.Policy(), s.Limiter, opts)
	health := rls.Register(g)
	go func() {
		if err := g.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.Logger.Error("envoy rate limit service failed", "err", err)
		}
	}()
	s.Logger.Info("listening", "server", "envoy-rls", "addr", ln.Addr().String(), "security", security, "allow_negative_hits", set.pol.AllowNegativeHits,
		"max_conns", conns, "max_concurrent_streams", bounds.MaxConcurrentStreams, "max_in_flight", bounds.MaxInFlight, "max_recv_bytes", bounds.MaxRecvBytes)
	// gRPC callers carry no token: beyond loopback, only mutual TLS tells
	// Envoy from anyone else on the network, as api_token_env does for
	// the decision API (serve warns of that one too).
	if (set.GRPCTLS == nil || set.GRPCTLS.ClientCAFile == "") && !loopback(ln.Addr().String()) {
		s.Logger.Warn("the Envoy rate limit service is open to anyone who reaches it: any caller can charge any descriptor's bucket; set grpc_listen on a private address, or grpc_tls with a client_ca_file", "addr", ln.Addr().String())
	}
	return ln.Addr().String(), func() {
		health.Shutdown() // tell Envoy's health checks first
		done := make(chan struct{})
		go func() { g.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			g.Stop()
		}
	}
}
