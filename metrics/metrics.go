// Package metrics is sluice's Prometheus instrumentation, the one place
// of the server's collectors whichever transport decides: decisions by
// rule and result (an implementation of policy.Observer), store calls by
// operation (InstrumentStore), configuration reloads, the memory store's
// live keys, and the handler that serves them.
//
// The stores' own metrics are made here too, from outside the stores,
// which do not import Prometheus: the Redis store reports its events
// (breaker state, batch sizes) to a RedisObserver, and PostgreSQL's
// violation log is read by NewViolationLogCollector.
package metrics

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// Decision results counted by Metrics.Observe.
const (
	ResultAllowed  = "allowed"
	ResultRejected = "rejected"
	// ResultNotCharged is a rule that had room but took nothing, because
	// another rule of the same all-or-nothing request rejected it.
	ResultNotCharged     = "not_charged"
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
	onStoreCall  func(op string, d time.Duration, failed bool)
	shaping      *shaping

	// byRule holds each rule's decision counters (ruleCounters), copied
	// on write: read on every decision, written once per rule.
	byRule   atomic.Pointer[map[string]*[len(ruleResults)]lazyCounter]
	byRuleMu sync.Mutex
}

// New creates the collectors and registers them on reg.
func New(reg *prometheus.Registry) *Metrics {
	m := &Metrics{
		reg: reg,
		decisions: newCounterVec("sluice_decisions_total",
			"Rate limit decisions by rule and result (allowed, rejected, not_charged, shadow_rejected, store_error).", "rule", "result"),
		storeErrors: newCounterVec("sluice_store_errors_total",
			"Store calls that failed, by operation (take, peek, refund, take_all, peek_all, refund_all, reset, acquire, lease_peek, release).", "op"),
		storeLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_store_latency_seconds",
			Help:    "Latency of store calls, by operation (take, peek, refund, take_all, peek_all, refund_all, reset, acquire, lease_peek, release).",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}, []string{"op"}),
		reloads: newCounterVec("sluice_config_reloads_total", "Configuration reloads by result (success, failure).", "result"),
	}
	m.byRule.Store(&map[string]*[len(ruleResults)]lazyCounter{})
	reg.MustRegister(m.decisions, m.storeErrors, m.storeLatency, m.reloads)
	m.shaping = newShaping(reg)
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

// newCounter, newCounterVec and newGaugeVec make a collector of a name,
// a help and the labels alone.
func newCounter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

func newCounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

func newGaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

// StoreOps are the op labels of the store metrics, one per kind of store
// call InstrumentStore records.
func StoreOps() []string {
	var ops []string
	for _, op := range []engine.Op{engine.OpTake, engine.OpPeek, engine.OpRefund} {
		ops = append(ops, op.String(), op.String()+"_all")
	}
	ops = append(ops, "reset")
	for _, op := range []engine.Op{engine.OpTake, engine.OpPeek, engine.OpRelease, engine.OpRenew} {
		ops = append(ops, op.LeaseString())
	}
	return ops
}

// Observe counts one decision of rule; result is one of the Result
// constants. It implements policy.Observer.
func (m *Metrics) Observe(rule, result string) {
	if m == nil {
		return
	}
	k := slices.Index(ruleResults[:], result)
	if k < 0 {
		m.decisions.WithLabelValues(rule, result).Inc()
		return
	}
	if c := (*m.byRule.Load())[rule]; c != nil {
		c[k].Inc()
		return
	}
	m.ruleCounters(rule)[k].Inc()
}

// ruleResults are the results Observe keeps a rule's counters of, the
// most frequent first.
var ruleResults = [...]string{ResultAllowed, ResultRejected, ResultShadowRejected, ResultStoreError, ResultNotCharged}

// ruleCounters returns rule's decision counters, looked up once: hashing
// the labels of every decision costs more than counting it. A series is
// made on its first count, as WithLabelValues makes it, so that a rule
// exports only the results it has had.
func (m *Metrics) ruleCounters(rule string) *[len(ruleResults)]lazyCounter {
	m.byRuleMu.Lock()
	defer m.byRuleMu.Unlock()
	old := *m.byRule.Load()
	if c := old[rule]; c != nil {
		return c
	}
	c := new([len(ruleResults)]lazyCounter)
	for k := range c {
		c[k] = lazyCounter{vec: m.decisions, labels: [2]string{rule, ruleResults[k]}}
	}
	next := maps.Clone(old)
	next[rule] = c
	m.byRule.Store(&next)
	return c
}

// lazyCounter is one series of a CounterVec, made on its first count.
type lazyCounter struct {
	vec    *prometheus.CounterVec
	labels [2]string
	c      atomic.Pointer[prometheus.Counter]
}

func (l *lazyCounter) Inc() {
	c := l.c.Load()
	if c == nil {
		made := l.vec.WithLabelValues(l.labels[:]...)
		c = &made
		l.c.Store(c)
	}
	(*c).Inc()
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

// keyCounter is a store that can count the keys it holds state for (the
// memory store).
type keyCounter interface {
	Len() int
}

// inProcessStore is a store that can say its calls never leave the process
// (the memory store), whose calls are timed without the deadline that a
// networked store's get.
type inProcessStore interface {
	InProcess() bool
}

// WatchKeys exports sluice_live_keys from a store that can count its keys
// (the memory store's Len); stores that cannot are left out.
func (m *Metrics) WatchKeys(store sluice.Store) {
	lener, ok := store.(keyCounter)
	if m == nil || !ok {
		return
	}
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_live_keys",
		Help: "Keys with state in the store.",
	}, func() float64 { return float64(lener.Len()) }))
}

// WatchReady exports sluice_ready: 1 when ready answers nil, 0 when it
// answers an error, asked at every gather with a deadline of timeout.
// /readyz is what a load balancer sees; the gauge lets an alert see the
// same answer over time (a process that stays unready while it still
// answers scrapes: a store it cannot reach, a drain that never ends).
func (m *Metrics) WatchReady(ready func(context.Context) error, timeout time.Duration) {
	if m == nil {
		return
	}
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_ready",
		Help: "1 when /readyz would answer 200 (not shutting down, the store answers), else 0.",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if ready(ctx) != nil {
			return 0
		}
		return 1
	}))
}

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// InstrumentStore wraps s so that every call's latency and failure is
// recorded, labelled by its operation (engine.Op's String: "take",
// "peek", "refund", with "_all" for TakeAll, and "reset"). Input errors (a
// bad cost) are the caller's, not the store's, and are not counted as
// store errors.
func (m *Metrics) InstrumentStore(s sluice.Store) sluice.Store {
	if m == nil {
		return s
	}
	i := &instrumented{s: s, m: m}
	if p, ok := s.(inProcessStore); ok {
		i.inProcess = p.InProcess()
	}
	for op := range i.ops {
		for all := range i.ops[op] {
			i.ops[op][all] = m.storeOp(engine.Op(op), all == 1)
		}
	}
	i.reset = m.storeOpNamed("reset")
	for _, op := range []engine.Op{engine.OpTake, engine.OpPeek, engine.OpRelease, engine.OpRenew} {
		i.leases[op] = m.storeOpNamed(op.LeaseString())
	}
	return i
}

type instrumented struct {
	s sluice.Store
	m *Metrics
	// The series of each operation, looked up once rather than on every
	// call: ops[op][1] is op's TakeAll.
	ops   [engine.OpRefund + 1][2]*storeOp
	reset *storeOp
	// leases[op] is a concurrency limit's call (acquire, lease_peek,
	// release, renew).
	leases [engine.OpRelease + 1]*storeOp
	// inProcess is what s says of itself, asked once.
	inProcess bool
}

// Unwrap returns the store that i instruments, for callers that look for
// what it can do besides sluice.Store (shared values, key counts).
func (i *instrumented) Unwrap() sluice.Store { return i.s }

// storeOp is the op label of one kind of store call and its series. The
// latency series is made on the first call, as WithLabelValues would:
// an operation never called exports no histogram.
type storeOp struct {
	name    string
	errors  prometheus.Counter
	vec     *prometheus.HistogramVec
	latency atomic.Pointer[prometheus.Observer]
}

func (o *storeOp) observe(d time.Duration) {
	l := o.latency.Load()
	if l == nil {
		obs := o.vec.WithLabelValues(o.name)
		l = &obs
		o.latency.Store(l)
	}
	(*l).Observe(d.Seconds())
}

func (m *Metrics) storeOp(op engine.Op, all bool) *storeOp {
	name := op.String()
	if all {
		name += "_all"
	}
	return m.storeOpNamed(name)
}

func (m *Metrics) storeOpNamed(name string) *storeOp {
	return &storeOp{name: name, errors: m.storeErrors.WithLabelValues(name), vec: m.storeLatency}
}

// opOf is the series of op (of a TakeAll when all).
func (i *instrumented) opOf(op engine.Op, all bool) *storeOp {
	if int(op) < len(i.ops) {
		if all {
			return i.ops[op][1]
		}
		return i.ops[op][0]
	}
	return i.m.storeOp(op, all)
}

// sinceStart is the monotonic clock: a store call's start and end are read
// with it alone, without the wall clock that time.Now reads too (about
// half of a clock read's cost on a virtual machine's clock).
func sinceStart() time.Duration { return time.Since(processStart) }

var processStart = time.Now()

func (i *instrumented) observe(op *storeOp, start time.Duration, err error) {
	d := sinceStart() - start
	op.observe(d)
	failed := err != nil && !sluice.IsInputError(err)
	if failed {
		op.errors.Inc()
	}
	if i.m.onStoreCall != nil {
		i.m.onStoreCall(op.name, d, failed)
	}
}

// OnStoreCall makes the stores that InstrumentStore wraps tell f every
// call: its operation, how long it took and whether the store failed (the
// live page's store health, insight.Collector.StoreCall). Set it before
// the stores serve.
func (m *Metrics) OnStoreCall(f func(op string, d time.Duration, failed bool)) {
	if m != nil {
		m.onStoreCall = f
	}
}

// Values returns the current values of the named metrics that the
// registry holds: a bare name sums the series of its family, and
// name{label="value",...} (labels in any order) is the one series with
// exactly those labels. Counters, gauges and untyped metrics have a
// value; histograms and summaries are left out, as are names that match
// nothing (a store that does not export them).
func (m *Metrics) Values(names ...string) map[string]float64 {
	out := map[string]float64{}
	if m == nil {
		return out
	}
	fams, _ := m.reg.Gather() // a failed collector leaves its metrics out
	byName := make(map[string]*dto.MetricFamily, len(fams))
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	for _, name := range names {
		fam, labels, _ := strings.Cut(name, "{")
		f := byName[fam]
		if f == nil {
			continue
		}
		want := map[string]string{}
		for _, kv := range strings.Split(strings.TrimSuffix(labels, "}"), ",") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				want[strings.TrimSpace(k)] = strings.Trim(strings.TrimSpace(v), `"`)
			}
		}
		sum, found := 0.0, false
		for _, s := range f.GetMetric() {
			if !labelsAre(s.GetLabel(), want, labels != "") {
				continue
			}
			switch {
			case s.Counter != nil:
				sum += s.Counter.GetValue()
			case s.Gauge != nil:
				sum += s.Gauge.GetValue()
			case s.Untyped != nil:
				sum += s.Untyped.GetValue()
			default:
				continue
			}
			found = true
		}
		if found {
			out[name] = sum
		}
	}
	return out
}

// labelsAre reports whether a series' labels are exactly want (when
// exact), or any labels at all (when not).
func labelsAre(got []*dto.LabelPair, want map[string]string, exact bool) bool {
	if !exact {
		return true
	}
	if len(got) != len(want) {
		return false
	}
	for _, l := range got {
		if v, ok := want[l.GetName()]; !ok || v != l.GetValue() {
			return false
		}
	}
	return true
}

// InProcess passes on whether the wrapped store's calls stay in the
// process (see deadline.ForStore).
func (i *instrumented) InProcess() bool { return i.inProcess }

func (i *instrumented) Take(ctx context.Context, op engine.Op, r sluice.Charged) (sluice.Decision, error) {
	start := sinceStart()
	d, err := i.s.Take(ctx, op, r)
	i.observe(i.opOf(op, false), start, err)
	return d, err
}

func (i *instrumented) TakeAll(ctx context.Context, op engine.Op, rs []sluice.Charged, dst []sluice.Decision) ([]sluice.Decision, error) {
	start := sinceStart()
	ds, err := i.s.TakeAll(ctx, op, rs, dst)
	i.observe(i.opOf(op, true), start, err)
	return ds, err
}

func (i *instrumented) Supports(l *sluice.Limit) error { return i.s.Supports(l) }

func (i *instrumented) Reset(ctx context.Context, l *sluice.Limit, key string) error {
	start := sinceStart()
	err := i.s.Reset(ctx, l, key)
	i.observe(i.reset, start, err)
	return err
}

// Lease times a concurrency limit's store call as "acquire", "lease_peek",
// "release" or "renew".
func (i *instrumented) Lease(ctx context.Context, op engine.Op, r sluice.Request, id engine.LeaseID) (sluice.Decision, error) {
	start := sinceStart()
	d, err := i.s.Lease(ctx, op, r, id)
	o := i.m.storeOpNamed(op.LeaseString())
	if int(op) < len(i.leases) && i.leases[op] != nil {
		o = i.leases[op]
	}
	i.observe(o, start, err)
	return d, err
}
