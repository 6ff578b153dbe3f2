package main

import (
	"errors"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/policy"
)

// startEnvoy serves Envoy's RateLimitService (with health and reflection)
// on ln, bound to set.GRPCListen, over TLS when set.GRPCTLS says so
// (mutual TLS with a client CA), and returns its address and the function
// that stops it. The service follows the HTTP gate's policy, so a reload
// applies to Envoy's calls too; a policy read from a reference-format file
// brings the file's descriptor lookup with it (policy.Policy.Envoy, set by
// envoyrls.ParseReferenceConfig), which the service uses in place of rules.
func startEnvoy(s *server, set policy.Settings, ln net.Listener) (addr string, stop func()) {
	gopts := append(envoyrls.ServerOptions(),
		// Envoy keeps its connections to the rate limit service open;
		// let it ping them, and keep idle ones from piling up forever.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 15 * time.Minute}),
	)
	security := "plaintext"
	if t := set.GRPCTLS; t != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(t.Config.Clone())))
		security = "tls"
		if t.ClientCAFile != "" {
			security = "mutual tls"
		}
	}
	g := grpc.NewServer(gopts...)
	opts := envoyrls.Options{Logger: s.Logger, Source: s.Gate.Policy, Observer: s.Gate.Observer()}
	rls := envoyrls.New(s.Gate.Policy(), s.Limiter, opts)
	health := rls.Register(g)
	go func() {
		if err := g.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.Logger.Error("envoy rate limit service failed", "err", err)
		}
	}()
	s.Logger.Info("listening", "server", "envoy-rls", "addr", ln.Addr().String(), "security", security, "allow_negative_hits", set.AllowNegativeHits)
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
