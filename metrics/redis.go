package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// RedisObserver is the Redis store's metrics: a redis.Observer (give it
// as redis.Options.Observer) that counts what the store tells it, and a
// prometheus.Collector of those counts, to register on the server's
// registry. One store per observer: a registry takes one of them.
type RedisObserver struct {
	collectors
	errors         prometheus.Counter
	breakerOpens   *prometheus.CounterVec
	breakerState   *prometheus.GaugeVec
	cacheHits      prometheus.Counter
	refundFailures prometheus.Counter
	dropsLost      prometheus.Counter
	batchSize      prometheus.Histogram
}

// NewRedisObserver returns a RedisObserver with every count at zero.
func NewRedisObserver() *RedisObserver {
	o := &RedisObserver{
		errors: newCounter("sluice_redis_store_errors_total",
			"Calls to Redis that failed (errors, timeouts, or refused by the open circuit breaker)."),
		breakerOpens: newCounterVec("sluice_redis_breaker_opens_total",
			"Times the circuit breaker of a node opened (node: a Cluster primary's address, empty for a standalone Redis).", "node"),
		breakerState: newGaugeVec("sluice_redis_breaker_state",
			"Circuit breaker state of a node: 0 closed, 1 open, 2 probing (node: a Cluster primary's address, empty for a standalone Redis).", "node"),
		cacheHits: newCounter("sluice_redis_overlimit_cache_hits_total",
			"Takes rejected in process from the over-limit cache, without a round trip."),
		refundFailures: newCounter("sluice_redis_refund_failures_total",
			"Cluster TakeAll refunds that failed, leaving a charge for a rejected request."),
		dropsLost: newCounter("sluice_redis_overlimit_drops_failures_total",
			"Failures of the channel that carries Resets and refunds to every process's over-limit cache: a subscription lost or refused (each clears this process's cache), or a publish that failed (the other caches keep the key until its RetryAfter)."),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_redis_batch_requests",
			Help:    "Requests carried by one script call of the batch writers.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 9),
		}),
	}
	o.collectors = collectors{o.errors, o.breakerOpens, o.breakerState, o.cacheHits, o.refundFailures, o.dropsLost, o.batchSize}
	return o
}

// StoreError implements redis.Observer.
func (o *RedisObserver) StoreError() { o.errors.Inc() }

// BreakerChanged implements redis.Observer.
func (o *RedisObserver) BreakerChanged(node string, state int32, opened bool) {
	o.breakerState.WithLabelValues(node).Set(float64(state))
	opens := o.breakerOpens.WithLabelValues(node) // exported at 0 before the first opening
	if opened {
		opens.Inc()
	}
}

// BreakerRemoved implements redis.Observer: the node's series go, so
// that the state it was left in (open, for a primary that failed over)
// does not read as a breaker open for good.
func (o *RedisObserver) BreakerRemoved(node string) {
	o.breakerState.DeleteLabelValues(node)
	o.breakerOpens.DeleteLabelValues(node)
}

// OverLimitCacheHit implements redis.Observer.
func (o *RedisObserver) OverLimitCacheHit() { o.cacheHits.Inc() }

// RefundFailed implements redis.Observer.
func (o *RedisObserver) RefundFailed() { o.refundFailures.Inc() }

// DropsLost implements redis.Observer.
func (o *RedisObserver) DropsLost() { o.dropsLost.Inc() }

// Batch implements redis.Observer.
func (o *RedisObserver) Batch(n int) { o.batchSize.Observe(float64(n)) }

var _ prometheus.Collector = (*RedisObserver)(nil)
