// Package metrics is sluice's Prometheus instrumentation, the one place
// of the server's collectors whichever transport decides: decisions by
// rule and result (an implementation of policy.Observer), store calls by
// operation (InstrumentStore), configuration reloads, the memory store's
// live keys, and the handler that serves them.
//
// The stores that talk to a server (redis, postgres) register their own
// collectors (breaker state, batch sizes, violations) on the registry
// they are given.
package metrics

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice"
)

// Decision results counted by Metrics.Observe.
const (
	ResultAllowed        = "allowed"
	ResultRejected       = "rejected"
	ResultShadowRejected = "shadow_rejected"
	ResultStoreError     = "store_error"
)

// Metrics holds sluice's Prometheus collectors, registered on a registry
// of the caller's choosing (so a library user can keep them off the
// global one). It implements policy.Observer.
type Metrics struct {
	reg          *prometheus.Registry
	decisions    *prometheus.CounterVec
	storeErrors  *prometheus.CounterVec
	storeLatency *prometheus.HistogramVec
	reloads      *prometheus.CounterVec
}

// New creates the collectors and registers them on reg.
func New(reg *prometheus.Registry) *Metrics {
	m := &Metrics{
		reg: reg,
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_decisions_total",
			Help: "Rate limit decisions by rule and result (allowed, rejected, shadow_rejected, store_error).",
		}, []string{"rule", "result"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_store_errors_total",
			Help: "Store calls that failed, by operation (take, peek, refund, take_all, peek_all, refund_all, reset, acquire, lease_peek, release).",
		}, []string{"op"}),
		storeLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_store_latency_seconds",
			Help:    "Latency of store calls, by operation (take, peek, refund, take_all, peek_all, refund_all, reset, acquire, lease_peek, release).",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}, []string{"op"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_config_reloads_total",
			Help: "Configuration reloads by result (success, failure).",
		}, []string{"result"}),
	}
	reg.MustRegister(m.decisions, m.storeErrors, m.storeLatency, m.reloads)
	// The counters an alert watches exist at zero from the start: a
	// series that first appears at 1 has no increase to alert on, so the
	// first failed reload or store call would go unseen.
	for _, op := range StoreOps() {
		m.storeErrors.WithLabelValues(op)
	}
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("failure")
	return m
}

// StoreOps are the op labels of the store metrics, one per kind of store
// call InstrumentStore records.
func StoreOps() []string {
	var ops []string
	for _, op := range []sluice.Op{sluice.OpTake, sluice.OpPeek, sluice.OpRefund} {
		ops = append(ops, op.String(), op.String()+"_all")
	}
	return append(ops, "reset", "acquire", "lease_peek", "release")
}

// Observe counts one decision of rule; result is one of the Result
// constants. It implements policy.Observer.
func (m *Metrics) Observe(rule, result string) {
	if m == nil {
		return
	}
	m.decisions.WithLabelValues(rule, result).Inc()
}

// Reloaded counts a configuration reload attempt.
func (m *Metrics) Reloaded(ok bool) {
	if m == nil {
		return
	}
	if ok {
		m.reloads.WithLabelValues("success").Inc()
	} else {
		m.reloads.WithLabelValues("failure").Inc()
	}
}

// WatchKeys exports sluice_live_keys from a store that can count its keys
// (the memory store's Len); stores that cannot are left out.
func (m *Metrics) WatchKeys(store sluice.Store) {
	lener, ok := store.(interface{ Len() int })
	if m == nil || !ok {
		return
	}
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_live_keys",
		Help: "Keys with state in the store.",
	}, func() float64 { return float64(lener.Len()) }))
}

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// InstrumentStore wraps s so that every call's latency and failure is
// recorded, labelled by its operation (sluice.Op's String: "take",
// "peek", "refund", with "_all" for TakeAll, and "reset"). Input errors (a
// bad cost) are the caller's, not the store's, and are not counted as
// store errors.
func (m *Metrics) InstrumentStore(s sluice.Store) sluice.Store {
	if m == nil {
		return s
	}
	return &instrumented{s: s, m: m}
}

type instrumented struct {
	s sluice.Store
	m *Metrics
}

func (i *instrumented) observe(op string, start time.Time, err error) {
	i.m.storeLatency.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if err != nil && !sluice.IsInputError(err) {
		i.m.storeErrors.WithLabelValues(op).Inc()
	}
}

func (i *instrumented) Take(ctx context.Context, op sluice.Op, r sluice.Request) (sluice.Decision, error) {
	start := time.Now()
	d, err := i.s.Take(ctx, op, r)
	i.observe(op.String(), start, err)
	return d, err
}

func (i *instrumented) TakeAll(ctx context.Context, op sluice.Op, rs []sluice.Request) ([]sluice.Decision, error) {
	start := time.Now()
	ds, err := i.s.TakeAll(ctx, op, rs)
	i.observe(op.String()+"_all", start, err)
	return ds, err
}

func (i *instrumented) Reset(ctx context.Context, l *sluice.Limit, key string) error {
	start := time.Now()
	err := i.s.Reset(ctx, l, key)
	i.observe("reset", start, err)
	return err
}

// Lease times a concurrency limit's store call as "acquire", "lease_peek"
// or "release".
func (i *instrumented) Lease(ctx context.Context, op sluice.Op, r sluice.Request, id sluice.LeaseID) (sluice.Decision, error) {
	start := time.Now()
	d, err := i.s.Lease(ctx, op, r, id)
	i.observe(leaseOpName(op), start, err)
	return d, err
}

func leaseOpName(op sluice.Op) string {
	switch op {
	case sluice.OpTake:
		return "acquire"
	case sluice.OpRefund:
		return "release"
	}
	return "lease_peek"
}
