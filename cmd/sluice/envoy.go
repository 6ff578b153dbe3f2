package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/policy"
)

func init() {
	startGRPC = startEnvoy
}

// startEnvoy serves Envoy's RateLimitService (with health and reflection)
// on set.GRPCListen, over TLS when set.GRPCTLS says so (mutual TLS with a
// client CA). The service follows the HTTP gate's policy, so a reload
// applies to Envoy's calls too; a policy read from a reference-format file
// brings the file's descriptor lookup with it (policy.Policy.Envoy, set by
// envoyrls.ParseReferenceConfig), which the service uses in place of rules.
func startEnvoy(ctx context.Context, s *server, set policy.Settings) (addr string, stop func(), err error) {
	ln, err := net.Listen("tcp", set.GRPCListen)
	if err != nil {
		return "", nil, fmt.Errorf("envoy rate limit service: listen %s: %w", set.GRPCListen, err)
	}
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
	}, nil
}

// parsePolicy reads a configuration in sluice's format or in the format
// of envoyproxy/ratelimit, the reference Envoy rate limit server, so an
// existing deployment switches by pointing Envoy at sluice.
//
// A reference file has no settings; as with the reference server, the
// environment chooses the store (REDIS_URL, "host:port" or a URL, with
// REDIS_AUTH) and the gRPC address (GRPC_HOST, GRPC_PORT).
func parsePolicy(name string, data []byte) (*policy.Policy, error) {
	if !envoyrls.IsReferenceConfig(data) {
		return policy.Parse(name, data)
	}
	p, err := envoyrls.ParseReferenceConfig(name, data)
	if err != nil {
		return nil, err
	}
	if u := os.Getenv("REDIS_URL"); u != "" {
		if !strings.Contains(u, "://") {
			if auth := os.Getenv("REDIS_AUTH"); auth != "" {
				u = url.QueryEscape(auth) + "@" + u
				u = ":" + u
			}
			u = "redis://" + u
		}
		p.Settings.StoreURL = u
	}
	if port := os.Getenv("GRPC_PORT"); port != "" {
		p.Settings.GRPCListen = net.JoinHostPort(os.Getenv("GRPC_HOST"), port)
		p.Settings.GRPCListenDerived = false
	}
	return p, nil
}

// loadPolicy is policy.Load for both formats (see parsePolicy).
func loadPolicy(path string) (*policy.Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return policy.Load(path) // its error names the file the same way
	}
	return parsePolicy(path, data)
}
