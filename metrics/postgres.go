package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// ViolationCounts is what a violation log counts (postgres.ViolationLog):
// rejections dropped because its queue was full, written, and lost with
// a batch that could not be written.
type ViolationCounts interface {
	Dropped() uint64
	Written() uint64
	Failed() uint64
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
	}
}

// collectors is several collectors registered as one.
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
