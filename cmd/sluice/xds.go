package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/envoyrls/xds"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/serverconf"
)

// xdsClient is the control plane serve follows, when the config file has
// an xds section, or, with no file, when the reference server's
// environment says CONFIG_TYPE=GRPC_XDS_SOTW (the rest of that
// environment, the store, the gRPC address, SHADOW_MODE, QUOTA_MODE and
// the response headers, then applies as for a reference-format file:
// envoyrls.ReadReferenceEnv). p is the file's policy (or the default): its
// settings, and srv, the file's server settings, are what the control
// plane's policies are served with (srv as the environment changes it is
// returned). nil, nil without either.
func xdsClient(path string, srv serverconf.Settings, p *policy.Policy, getenv func(string) string, log *slog.Logger) (*xds.Client, *policy.Policy, serverconf.Settings, error) {
	var cfg xds.Config
	var ok bool
	var err error
	set := p.Settings
	if path != "" {
		data, rerr := os.ReadFile(path)
		if rerr != nil {
			return nil, nil, srv, rerr
		}
		cfg, ok, err = xds.FromFile(path, data)
	} else {
		cfg, ok, err = xds.FromEnv(getenv)
		if ok && err == nil {
			env, eerr := envoyrls.ReadReferenceEnv(getenv)
			if eerr != nil {
				return nil, nil, srv, eerr
			}
			srv = env.Server(srv)
			if env.Headers != nil {
				set.Headers = env.Headers
			}
			cfg.Modes = env.Modes
			cfg.HealthyOnceApplied = env.HealthyOnceApplied
		}
	}
	if err != nil {
		return nil, nil, srv, fmt.Errorf("xds: %w", err)
	}
	if !ok {
		return nil, nil, srv, nil
	}
	if _, err := cfg.TLSConfig(); err != nil { // refused at start, not on the first connection
		return nil, nil, srv, err
	}
	c := xds.New(cfg, set, log)
	initial, err := c.Initial()
	if err != nil {
		return nil, nil, srv, err
	}
	log.Info("rate limits from an xDS control plane", "server", cfg.Server, "node_id", cfg.NodeID, "tls", cfg.TLS, "unready_when_lost", cfg.UnreadyWhenLost)
	return c, initial, srv, nil
}

// runXDS follows the control plane until ctx is done or the returned
// function is called, and exports the client's state on reg.
func runXDS(ctx context.Context, c *xds.Client, reg prometheus.Registerer, log *slog.Logger) (stop func()) {
	gauge := func(name, help string, v func(xds.Status) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return v(c.Status()) })
	}
	counter := func(name, help string, v func(xds.Status) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v(c.Status())) })
	}
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	reg.MustRegister(
		gauge("sluice_xds_connected", "1 while a stream to the xDS control plane is open.", func(s xds.Status) float64 { return b2f(s.Connected) }),
		gauge("sluice_xds_applied", "1 once a snapshot of the control plane was applied.", func(s xds.Status) float64 { return b2f(s.Applied) }),
		counter("sluice_xds_snapshots_applied_total", "Snapshots of the control plane applied.", func(s xds.Status) uint64 { return s.Updates }),
		counter("sluice_xds_snapshots_rejected_total", "Snapshots of the control plane refused (NACK), each counted once however often resent.", func(s xds.Status) uint64 { return s.Rejected }),
		counter("sluice_xds_reconnects_total", "Streams to the control plane that ended.", func(s xds.Status) uint64 { return s.Reconnects }),
	)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.Run(ctx); err != nil {
			log.Error("xds client stopped", "err", err)
		}
	}()
	return func() { cancel(); <-done }
}
