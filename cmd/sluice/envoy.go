package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/policy"
)

func init() {
	startGRPC = startEnvoy
}

// startEnvoy serves Envoy's RateLimitService (with health and reflection)
// on addr. The service follows the HTTP gate's policy, so a reload applies
// to Envoy's calls too.
func startEnvoy(ctx context.Context, s *server, addr string) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("envoy rate limit service: listen %s: %w", addr, err)
	}
	g := grpc.NewServer(
		// Envoy keeps its connections to the rate limit service open;
		// let it ping them, and keep idle ones from piling up forever.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 15 * time.Minute}),
	)
	rls := envoyrls.New(s.Gate.Policy(), s.Limiter, envoyrls.Options{
		Logger:   s.Logger,
		Observer: s.Metrics,
		Source:   s.Gate.Policy,
	})
	health := rls.Register(g)
	go func() {
		if err := g.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.Logger.Error("envoy rate limit service failed", "err", err)
		}
	}()
	s.Logger.Info("listening", "server", "envoy-rls", "addr", ln.Addr().String())
	return func() {
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
func parsePolicy(name string, data []byte) (*policy.Policy, error) {
	if envoyrls.IsReferenceConfig(data) {
		return envoyrls.ParseReferenceConfig(name, data)
	}
	return policy.Parse(name, data)
}
