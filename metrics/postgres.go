package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// ViolationCounts is what a violation log counts (postgres.ViolationLog):
// rejections dropped because its queue was full, written, lost with a
// batch that could not be written, and not recorded because their
// bucket's was within the same interval.
type ViolationCounts interface {
	Dropped() uint64
	Written() uint64
	Failed() uint64
	Coalesced() uint64
}

// NewViolationLogCollector exports v's counts as counters, to register
// on the server's registry: the postgres package does not import
// Prometheus.
func NewViolationLogCollector(v ViolationCounts) prometheus.Collector {
	counter := func(name, help string, read func() uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(read()) })
	}
	return collectors{
		counter("sluice_postgres_violations_dropped_total", "Violations not recorded because the write queue was full.", v.Dropped),
		counter("sluice_postgres_violations_written_total", "Violations written to sluice_violations.", v.Written),
		counter("sluice_postgres_violations_failed_total", "Violations lost because their batch could not be written.", v.Failed),
		counter("sluice_postgres_violations_coalesced_total", "Violations not recorded because their bucket's was recorded within the same interval (sluice_violations_per_bucket).", v.Coalesced),
	}
}

// collectors is several collectors registered as one (the observers'
// Describe and Collect).
type collectors []prometheus.Collector

func (cs collectors) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range cs {
		c.Describe(ch)
	}
}

func (cs collectors) Collect(ch chan<- prometheus.Metric) {
	for _, c := range cs {
		c.Collect(ch)
	}
}

// PostgresObserver is the PostgreSQL store's metrics: a postgres.Observer
// (give it as postgres.Options.Observer) that counts what the store tells
// it, and a prometheus.Collector of those counts, to register on the
// server's registry. One store per observer: a registry takes one of
// them.
type PostgresObserver struct {
	collectors
	errors       prometheus.Counter
	breakerOpens prometheus.Counter
	breakerState prometheus.Gauge
}

// NewPostgresObserver returns a PostgresObserver with every count at zero.
func NewPostgresObserver() *PostgresObserver {
	o := &PostgresObserver{
		errors: newCounter("sluice_postgres_store_errors_total",
			"Calls to PostgreSQL that failed (errors, timeouts, lock waits past lock_timeout, or refused by the open circuit breaker)."),
		breakerOpens: newCounter("sluice_postgres_breaker_opens_total", "Times the PostgreSQL store's circuit breaker opened."),
		breakerState: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_postgres_breaker_state",
			Help: "The PostgreSQL store's circuit breaker state: 0 closed, 1 open, 2 probing.",
		}),
	}
	o.collectors = collectors{o.errors, o.breakerOpens, o.breakerState}
	return o
}

// StoreError implements postgres.Observer.
func (o *PostgresObserver) StoreError() { o.errors.Inc() }

// BreakerChanged implements postgres.Observer.
func (o *PostgresObserver) BreakerChanged(state int32, opened bool) {
	o.breakerState.Set(float64(state))
	if opened {
		o.breakerOpens.Inc()
	}
}

var _ prometheus.Collector = (*PostgresObserver)(nil)
