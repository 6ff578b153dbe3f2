package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/defaults"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/postgres"
	"github.com/sluicehq/sluice/redis"
)

// storeKind is one store this binary can open: each parses its own URL.
type storeKind struct {
	schemes []string
	// check reports what open would refuse in a URL, without connecting.
	check func(rawURL string) error
	// open opens the store and returns it with the function that releases
	// it. The store's own metrics go to reg (nil: none).
	open func(ctx context.Context, rawURL string, reg prometheus.Registerer) (sluice.Store, func() error, error)
	// supports is the store's Supports, which needs no connection; nil
	// takes every limit.
	supports func(*sluice.Limit) error
}

// storeKinds are the stores of store.url, by scheme: the one list of them.
var storeKinds = []storeKind{
	{[]string{"memory"}, func(u string) error { _, err := memory.ParseURL(u); return err }, openMemory, nil},
	{[]string{"redis", "rediss", "redis+sentinel", "redis+cluster"}, redis.CheckURL, openRedis, redis.Supports},
	{[]string{"postgres", "postgresql"}, postgres.CheckURL, openPostgres, nil},
}

// storeKindOf returns the kind of store rawURL names ("memory://" when
// empty).
func storeKindOf(rawURL string) (storeKind, error) {
	scheme, _, _ := strings.Cut(rawURL, "://")
	if rawURL == "" {
		scheme = "memory"
	}
	var known []string
	for _, k := range storeKinds {
		for _, s := range k.schemes {
			if s == scheme {
				return k, nil
			}
			known = append(known, s)
		}
	}
	sort.Strings(known)
	return storeKind{}, fmt.Errorf("unknown store %q (this sluice knows %s)", scheme, strings.Join(known, ", "))
}

// checkStoreURL reports what would stop serve from opening the store of
// rawURL, short of the store not answering.
func checkStoreURL(rawURL string) error {
	k, err := storeKindOf(rawURL)
	if err != nil {
		return err
	}
	return k.check(storeURLOrDefault(rawURL))
}

func storeURLOrDefault(rawURL string) string { return cmp.Or(rawURL, "memory://") }

// openMemory opens memory://[?max_keys=N], registering the eviction
// counters with reg.
func openMemory(_ context.Context, rawURL string, reg prometheus.Registerer) (sluice.Store, func() error, error) {
	store, err := memory.Open(rawURL)
	if err != nil {
		return nil, nil, err
	}
	if reg != nil {
		for _, state := range []string{"full", "partial"} {
			err := reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name:        "sluice_memory_evictions_total",
				Help:        "Keys the memory store evicted at its key bound, by the state of the bucket: full (state equivalent to none) or partial (below full: evicted because no bucket was full; its owner got back what it still owed).",
				ConstLabels: prometheus.Labels{"state": state},
			}, func() float64 {
				full, partial := store.Evictions()
				if state == "full" {
					return float64(full)
				}
				return float64(partial)
			}))
			if err != nil {
				return nil, nil, fmt.Errorf("memory store metrics: %w", err)
			}
		}
	}
	return store, func() error { return nil }, nil
}

// openRedis opens a Redis store URL (see redis.Open for the forms), its
// error, breaker and cache metrics counted by a metrics.RedisObserver
// registered with reg.
func openRedis(_ context.Context, rawURL string, reg prometheus.Registerer) (sluice.Store, func() error, error) {
	obs := metrics.NewRedisObserver()
	s, err := redis.Open(rawURL, redis.Options{Observer: obs})
	if err != nil {
		return nil, nil, err
	}
	if reg != nil {
		if err := reg.Register(obs); err != nil {
			s.Close()
			return nil, nil, fmt.Errorf("redis store metrics: %w", err)
		}
	}
	return s, s.Close, nil
}

// openPostgres opens a postgres:// store URL. Besides pgx's settings the
// URL may carry sluice_migrate=true (apply migrations at start),
// sluice_key_prefix, sluice_housekeeping=30s, sluice_timeout and
// sluice_violations=true (record rejections in sluice_violations, a
// bucket's once per sluice_violations_per_bucket, kept for
// sluice_violations_retention).
// Its failed calls and breaker are counted by a metrics.PostgresObserver
// registered with reg.
func openPostgres(ctx context.Context, rawURL string, reg prometheus.Registerer) (sluice.Store, func() error, error) {
	connURL, opts, err := postgresOptions(rawURL)
	if err != nil {
		return nil, nil, err
	}
	obs := metrics.NewPostgresObserver()
	opts.Observer = obs
	s, err := postgres.Open(ctx, connURL, opts)
	if err != nil {
		return nil, nil, err
	}
	if reg != nil {
		if err := reg.Register(obs); err != nil {
			s.Close()
			return nil, nil, fmt.Errorf("postgres store metrics: %w", err)
		}
	}
	if v := s.Violations(); v != nil && reg != nil {
		if err := reg.Register(metrics.NewViolationLogCollector(v)); err != nil {
			s.Close()
			return nil, nil, fmt.Errorf("postgres violations: register metrics: %w", err)
		}
	}
	return s, func() error { s.Close(); return nil }, nil
}

// servePostgresTimeout is the deadline of each PostgreSQL call under
// serve when the URL sets no sluice_timeout: the library's one second is
// for applications whose own requests are slow anyway, while serve
// answers decisions, where a second per call against a hung server, until
// the breaker opens, is a second added to every request.
const servePostgresTimeout = 250 * time.Millisecond

// postgresOptions is the pgx URL and the store options serve opens a
// postgres:// store URL with.
func postgresOptions(rawURL string) (string, postgres.Options, error) {
	connURL, o, err := postgres.SplitURL(rawURL)
	if err != nil {
		return "", postgres.Options{}, err
	}
	if o.LogViolations {
		o.Options.RecordViolations = &o.ViolationOptions
	}
	defaults.Set(&o.Options.Timeout, servePostgresTimeout)
	return connURL, o.Options, nil
}

// Retries of a store that did not answer at start: the first after
// storeRetryMin, doubling to storeRetryMax; each attempt may take
// storeOpenTimeout (PostgreSQL's migrations run within it).
var (
	storeRetryMin    = 100 * time.Millisecond
	storeRetryMax    = 5 * time.Second
	storeOpenTimeout = 30 * time.Second
)

// connectStore opens the store for serve, which starts whether or not the
// store answers: a store that cannot be opened (not yet up, unreachable)
// is stood in for by one whose every call fails, so that each rule's
// on_store_error decides and /readyz fails, as during a later outage,
// while the opening is retried in the background. A URL the store
// refuses is an error.
func connectStore(ctx context.Context, rawURL string, reg prometheus.Registerer, log *slog.Logger) (sluice.Store, func() error, error) {
	if err := checkStoreURL(rawURL); err != nil {
		return nil, nil, fmt.Errorf("store.url: %w", err)
	}
	k, _ := storeKindOf(rawURL) // known: checked
	open := func(ctx context.Context) (sluice.Store, func() error, error) {
		ctx, cancel := context.WithTimeout(ctx, storeOpenTimeout)
		defer cancel()
		s, release, err := k.open(ctx, storeURLOrDefault(rawURL), reg)
		if e, ok := s.(interface{ EvictionWarning(context.Context) string }); ok && err == nil {
			if w := e.EvictionWarning(ctx); w != "" {
				log.Warn(w, "store", redact(rawURL))
			}
		}
		return s, release, err
	}
	s, closeStore, err := open(ctx)
	if err == nil {
		return s, closeStore, nil
	}
	log.Warn("the store did not answer at start: serving on each rule's on_store_error, /readyz failing, until it does", "store", redact(rawURL), "err", err)
	p := &pendingStore{supports: k.supports}
	p.err.Store(&err)
	rctx, cancel := context.WithCancel(context.Background())
	p.stop = cancel
	p.wg.Add(1)
	go p.retry(rctx, open, redact(rawURL), log)
	return p, p.close, nil
}

// pendingStore is the stand-in of a store that could not be opened at
// start (see connectStore). Once opened, it passes every call through.
type pendingStore struct {
	store atomic.Pointer[sluice.Store]
	err   atomic.Pointer[error] // the last failure to open
	stop  context.CancelFunc
	wg    sync.WaitGroup
	// release closes the store once opened; set before store.
	release func() error
	// supports is the store kind's Supports (nil: every limit).
	supports func(*sluice.Limit) error
}

// errStoreNotOpen is the error of every call before the store opens.
var errStoreNotOpen = errors.New("the store has not answered since start")

func (p *pendingStore) opened() (sluice.Store, error) {
	if s := p.store.Load(); s != nil {
		return *s, nil
	}
	return nil, fmt.Errorf("%w: %w", errStoreNotOpen, *p.err.Load())
}

func (p *pendingStore) Take(ctx context.Context, op engine.Op, r sluice.Charged) (sluice.Decision, error) {
	s, err := p.opened()
	if err != nil {
		return sluice.Decision{}, err
	}
	return s.Take(ctx, op, r)
}

func (p *pendingStore) TakeAll(ctx context.Context, op engine.Op, rs []sluice.Charged, dst []sluice.Decision) ([]sluice.Decision, error) {
	s, err := p.opened()
	if err != nil {
		return nil, err
	}
	return s.TakeAll(ctx, op, rs, dst)
}

func (p *pendingStore) Reset(ctx context.Context, l *sluice.Limit, key string) error {
	s, err := p.opened()
	if err != nil {
		return err
	}
	return s.Reset(ctx, l, key)
}

func (p *pendingStore) Supports(l *sluice.Limit) error {
	if p.supports == nil {
		return nil
	}
	return p.supports(l)
}

func (p *pendingStore) Lease(ctx context.Context, op engine.Op, r sluice.Request, id engine.LeaseID) (sluice.Decision, error) {
	s, err := p.opened()
	if err != nil {
		return sluice.Decision{}, err
	}
	return s.Lease(ctx, op, r, id)
}

// retry opens the store until it succeeds or ctx ends.
func (p *pendingStore) retry(ctx context.Context, open func(context.Context) (sluice.Store, func() error, error), name string, log *slog.Logger) {
	defer p.wg.Done()
	wait := storeRetryMin
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		s, release, err := open(ctx)
		if err == nil {
			p.release = release
			p.store.Store(&s)
			log.Info("the store answers", "store", name)
			return
		}
		p.err.Store(&err)
		wait = min(2*wait, storeRetryMax)
	}
}

// close stops the retries and closes the store if it opened.
func (p *pendingStore) close() error {
	p.stop()
	p.wg.Wait()
	if p.store.Load() != nil {
		return p.release()
	}
	return nil
}

// rulesSource returns the source of serve's policy when the store keeps
// rules in a table (postgres://...?sluice_rules=true): the config file
// merged with the rows of sluice_rules, loaded once; nil otherwise. When
// the store records violations, they name their sluice_rules row.
func rulesSource(ctx context.Context, storeURL string, store sluice.Store, file *policy.File) (*postgres.PolicySource, *policy.Policy, error) {
	if _, o, err := postgres.SplitURL(storeURL); err != nil || !o.Rules {
		return nil, nil, nil
	}
	if file == nil {
		return nil, nil, errors.New("store.url: sluice_rules=true needs a config file (--config) for the table's rules to join")
	}
	opts := postgres.PolicySourceOptions{File: file}
	if ps, ok := store.(*postgres.Store); ok {
		opts.Violations = ps.Violations()
	}
	src, err := postgres.OpenRulesSource(ctx, storeURL, opts)
	if err != nil {
		return nil, nil, err
	}
	p, err := src.Load(ctx, true)
	if err != nil {
		src.Close()
		return nil, nil, err
	}
	return src, p, nil
}

// supported refuses a policy with a limit that store cannot compute
// exactly (sluice.Store.Supports): at start, and on every reload through
// supportedSource, so that no request finds out.
func supported(store sluice.Store, p *policy.Policy) error {
	for _, l := range p.NamedLimits() {
		if err := store.Supports(l); err != nil {
			return err
		}
	}
	return nil
}

// supportedSource is a policy source whose loads the store must support:
// a reload it refuses keeps the policy in force.
type supportedSource struct {
	policy.Source
	store sluice.Store
}

func (s supportedSource) Load(ctx context.Context, force bool) (*policy.Policy, error) {
	p, err := s.Source.Load(ctx, force)
	if err == nil && p != nil {
		err = supported(s.store, p)
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}
