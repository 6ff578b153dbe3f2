package redis

// Observer is told of the store's events, for its metrics: package
// metrics implements it as Prometheus counters (metrics.NewRedisObserver),
// which keeps Prometheus out of a program that uses this store without
// them. The store calls it on the request path: its methods must be
// cheap and must not block.
type Observer interface {
	// StoreError: a call to Redis failed (an error, a timeout, or a
	// refusal by the open circuit breaker).
	StoreError()
	// BreakerChanged: the circuit breaker of node is now in state
	// (0 closed, 1 open, 2 probing); opened is true when it has just
	// opened. node is a Cluster primary's address, "" for a standalone
	// Redis or Sentinel's primary (and for a Cluster's slots whose
	// primary is not known yet).
	BreakerChanged(node string, state int32, opened bool)
	// BreakerRemoved: node serves no slots any more (a failover or a
	// resharding moved them away), and its breaker is dropped.
	BreakerRemoved(node string)
	// OverLimitCacheHit: a take was rejected in process from the
	// over-limit cache, without a round trip.
	OverLimitCacheHit()
	// RefundFailed: a Cluster TakeAll's refund failed, leaving a charge
	// for a rejected request.
	RefundFailed()
	// DropsLost: the channel that carries Resets and refunds to every
	// process's over-limit cache failed: a subscription lost or refused,
	// or a publish that failed.
	DropsLost()
	// Batch: one script call of the batch writers carried n requests.
	Batch(n int)
}

// noObserver is the Observer of a store opened without one.
type noObserver struct{}

func (noObserver) StoreError()                        {}
func (noObserver) BreakerChanged(string, int32, bool) {}
func (noObserver) BreakerRemoved(string)              {}
func (noObserver) OverLimitCacheHit()                 {}
func (noObserver) RefundFailed()                      {}
func (noObserver) DropsLost()                         {}
func (noObserver) Batch(int)                          {}
