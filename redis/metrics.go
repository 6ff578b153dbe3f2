package redis

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the store's counters. They exist (and count) whether or not
// a Registerer was given, so the code that counts never checks.
type metrics struct {
	errors         prometheus.Counter
	breakerOpens   prometheus.Counter
	breakerState   prometheus.Gauge
	cacheHits      prometheus.Counter
	refundFailures prometheus.Counter
	dropsLost      prometheus.Counter
	batchSize      prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_redis_store_errors_total",
			Help: "Calls to Redis that failed (errors, timeouts, or refused by the open circuit breaker).",
		}),
		breakerOpens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_redis_breaker_opens_total",
			Help: "Times the circuit breaker opened.",
		}),
		breakerState: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_redis_breaker_state",
			Help: "Circuit breaker state: 0 closed, 1 open, 2 probing.",
		}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_redis_overlimit_cache_hits_total",
			Help: "Takes rejected in process from the over-limit cache, without a round trip.",
		}),
		refundFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_redis_refund_failures_total",
			Help: "Cluster TakeAll refunds that failed, leaving a charge for a rejected request.",
		}),
		dropsLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_redis_overlimit_drops_failures_total",
			Help: "Failures of the channel that carries Resets and refunds to every process's over-limit cache: a subscription lost or refused (each clears this process's cache), or a publish that failed (the other caches keep the key until its RetryAfter).",
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_redis_batch_requests",
			Help:    "Requests carried by one script call of the batch writers.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 9),
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("redis store metrics: already registered (one store per registry): %w", err)
			}
			return nil, fmt.Errorf("redis store metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) breakerChanged(state int32, opened bool) {
	m.breakerState.Set(float64(state))
	if opened {
		m.breakerOpens.Inc()
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.errors, m.breakerOpens, m.breakerState, m.cacheHits, m.refundFailures, m.dropsLost, m.batchSize}
}
