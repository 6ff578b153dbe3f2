package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/postgres"
)

func init() {
	storeOpeners["postgres"] = openPostgres
	storeOpeners["postgresql"] = openPostgres
}

// openPostgres opens a postgres:// store URL. Besides pgx's settings the
// URL may carry sluice_migrate=true (apply migrations at start),
// sluice_key_prefix, sluice_housekeeping=30s and sluice_violations=true
// (record every rejection in sluice_violations).
func openPostgres(ctx context.Context, rawURL string, reg prometheus.Registerer) (sluice.Store, func() error, error) {
	connURL, o, err := postgres.SplitURL(rawURL)
	if err != nil {
		return nil, nil, err
	}
	if o.LogViolations {
		o.Options.RecordViolations = &postgres.ViolationOptions{Registerer: reg}
	}
	s, err := postgres.Open(ctx, connURL, o.Options)
	if err != nil {
		return nil, nil, err
	}
	return s, func() error { s.Close(); return nil }, nil
}

// startPostgresRules is serve's hook for rules kept in sluice_rules: when
// the store URL is postgres:// with sluice_rules=true it compiles the
// config file (filename, data) together with the table's rows, calls
// install with the result and again after every change to the table, and
// returns the source (whose SetConfig takes a reloaded file) and a stop
// function. When store records violations, they name their sluice_rules
// row. For any other store URL it returns nil, nil, nil.
func startPostgresRules(ctx context.Context, storeURL string, store sluice.Store, filename string, data []byte, install func(*policy.Policy)) (*postgres.PolicySource, func(), error) {
	if !strings.HasPrefix(storeURL, "postgres://") && !strings.HasPrefix(storeURL, "postgresql://") {
		return nil, nil, nil
	}
	connURL, o, err := postgres.SplitURL(storeURL)
	if err != nil || !o.Rules {
		return nil, nil, err
	}
	cfg, err := pgxpool.ParseConfig(connURL)
	if err != nil {
		return nil, nil, fmt.Errorf("sluice_rules: %w", err)
	}
	cfg.MaxConns = 2 // one LISTENs, one reloads
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("sluice_rules: %w", err)
	}
	opts := postgres.PolicySourceOptions{Filename: filename, Config: data, OnChange: install}
	if ps, ok := store.(*postgres.Store); ok {
		opts.Violations = ps.Violations()
	}
	src, err := postgres.NewPolicySource(ctx, pool, opts)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return src, func() { src.Close(); pool.Close() }, nil
}
