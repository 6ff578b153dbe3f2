package main

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
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
func openPostgres(ctx context.Context, rawURL string) (sluice.Store, func() error, error) {
	connURL, o, err := postgres.SplitURL(rawURL)
	if err != nil {
		return nil, nil, err
	}
	if o.LogViolations {
		o.Options.RecordViolations = &postgres.ViolationOptions{Registerer: registererOnce()}
	}
	s, err := postgres.Open(ctx, connURL, o.Options)
	if err != nil {
		return nil, nil, err
	}
	return s, func() error { s.Close(); return nil }, nil
}

var violationMetricsRegistered bool

// registererOnce returns the default registry the first time and nil
// after, so that a second store in one process does not collide with the
// first one's counters.
func registererOnce() prometheus.Registerer {
	if violationMetricsRegistered {
		return nil
	}
	violationMetricsRegistered = true
	return prometheus.DefaultRegisterer
}
