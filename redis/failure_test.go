package redis_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/redis"
)

// Deadline tests bound a call by its deadline plus deadlineSlack, more
// than a goroutine waits for a CPU on a loaded 2-core machine under
// -race. Their stores raise the client's own timeouts far beyond it
// (slowClientTimeouts), so that a call which ignored its deadline and
// waited on those instead still breaks the bound.
const deadlineSlack = 5 * time.Second

// Redis stopped and restarted under load: while it is down every call
// fails within the deadline (the breaker makes most fail at once), with a
// store error, not an input error; the rule's on_store_error decides from
// there. When it is back, calls succeed again without a new store, and no
// goroutines were left behind.
func TestRestartUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("restart takes seconds")
	}
	srv := newStandalone(t)
	reg := prometheus.NewRegistry()
	const timeout = 100 * time.Millisecond
	s := open(t, withQuery("redis://"+srv.Addr(), slowClientTimeouts), redis.Options{Timeout: timeout, Observer: observed(reg), BreakerBackoff: 100 * time.Millisecond, NoOverLimitCache: true})
	ctx := context.Background()
	lim := uniqueLimit(t, sluice.Spec{Name: "restart", TokensPerSecond: 1e6, Burst: 1e6})
	goroutinesBefore := runtime.NumGoroutine()

	var phase atomic.Int32 // 0 up, 1 down, 2 restarted
	var okUp, okAfter, failDown atomic.Int64
	var maxFailLatency atomic.Int64
	var inputErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				_, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"})
				lat := time.Since(start)
				switch {
				case err == nil && phase.Load() == 0:
					okUp.Add(1)
				case err == nil && phase.Load() == 2:
					okAfter.Add(1)
				case err != nil:
					if sluice.IsInputError(err) {
						inputErr.Store(err)
					}
					if phase.Load() == 1 {
						failDown.Add(1)
						for {
							m := maxFailLatency.Load()
							if int64(lat) <= m || maxFailLatency.CompareAndSwap(m, int64(lat)) {
								break
							}
						}
					}
					time.Sleep(time.Millisecond) // a caller answering per on_store_error
				}
			}
		}()
	}
	// The phases end on what happened, not on how long they took: the
	// machine's speed decides how many takes each phase holds.
	for deadline := time.Now().Add(time.Minute); okUp.Load() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("no take succeeded in a minute with Redis up")
		}
		time.Sleep(5 * time.Millisecond)
	}
	phase.Store(1)
	srv.Stop()
	time.Sleep(time.Second)
	for deadline := time.Now().Add(time.Minute); metricValue(t, reg, "sluice_redis_breaker_opens_total") < 1; {
		if time.Now().After(deadline) {
			t.Fatal("the breaker did not open in a minute with Redis down")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	phase.Store(2)
	deadline := time.Now().Add(time.Minute)
	for okAfter.Load() < 100 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()

	if v := inputErr.Load(); v != nil {
		t.Fatalf("a store failure was reported as an input error: %v", v)
	}
	if okUp.Load() == 0 || failDown.Load() == 0 {
		t.Fatalf("up %d, failed while down %d: the test tests nothing", okUp.Load(), failDown.Load())
	}
	if okAfter.Load() < 100 {
		t.Fatalf("only %d takes succeeded in a minute after the restart: no recovery", okAfter.Load())
	}
	// Bounded by the deadline, with a slack (deadlineSlack) a goroutine
	// waiting for a CPU on a loaded machine stays within.
	if lat := time.Duration(maxFailLatency.Load()); lat > timeout+deadlineSlack {
		t.Fatalf("a failing call took %v, deadline %v", lat, timeout)
	}
	opens := metricValue(t, reg, "sluice_redis_breaker_opens_total")
	errs := metricValue(t, reg, "sluice_redis_store_errors_total")
	if opens < 1 || errs < 1 {
		t.Fatalf("breaker opens %v, store errors %v: not counted", opens, errs)
	}
	t.Logf("up: %d ok; down 1s: %d failed, slowest failure %v; breaker opened %v times; after restart: %d ok",
		okUp.Load(), failDown.Load(), time.Duration(maxFailLatency.Load()), opens, okAfter.Load())
	// No goroutine pile-up: the store's goroutines are a fixed set. Those
	// of calls that ended may take a while to exit on a loaded machine: a
	// pile-up never comes down.
	for deadline := time.Now().Add(time.Minute); runtime.NumGoroutine() > goroutinesBefore+5; {
		if time.Now().After(deadline) {
			t.Fatalf("goroutines %d before the load, %d a minute after", goroutinesBefore, runtime.NumGoroutine())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// observed returns the store's metrics (metrics.RedisObserver),
// registered on reg, for Options.Observer.
func observed(reg *prometheus.Registry) *metrics.RedisObserver {
	o := metrics.NewRedisObserver()
	reg.MustRegister(o)
	return o
}

// metricValue reads a registered counter or gauge by name.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			v := mf.GetMetric()[0]
			if v.Counter != nil {
				return v.Counter.GetValue()
			}
			return v.Gauge.GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// Three separately connected clients, 32 goroutines each, one key at
// r=100/s, b=100, for 2s on the server's clock: no more than b + r*t is
// admitted, where t is this process's measure of the run (which contains
// the server's), and no less than the burst, which the bucket starts with
// (or every take, when a loaded machine made fewer).
func TestNoOverAdmissionAcrossClients(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for 2s of real time")
	}
	url := standaloneURL(t)
	lim := uniqueLimit(t, sluice.Spec{Name: "fleet", TokensPerSecond: 100, Burst: 100})
	var stores []*redis.Store
	for range 3 {
		// A long deadline: on a loaded machine a timed-out take may have
		// been charged without being counted, which only lowers the count.
		stores = append(stores, open(t, url, redis.Options{Timeout: 5 * time.Second}))
	}
	ctx := context.Background()
	var admitted, errs, takes atomic.Int64
	start := time.Now()
	end := start.Add(2 * time.Second)
	var wg sync.WaitGroup
	for _, s := range stores {
		for range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(end) {
					d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "one"})
					takes.Add(1)
					if err != nil {
						if errs.Add(1) == 1 {
							t.Logf("first error: %v", err)
						}
						continue
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	bound := 100 + int64(100*elapsed.Seconds())
	t.Logf("admitted %d in %v (bound b + r*t = %d), %d errors", admitted.Load(), elapsed, bound, errs.Load())
	if admitted.Load() > bound {
		t.Fatalf("admitted %d > b + r*t = %d", admitted.Load(), bound)
	}
	// A take that failed may have been charged without being counted.
	if admitted.Load()+errs.Load() < min(100, takes.Load()) {
		t.Fatalf("admitted only %d (and %d errors) of %d takes from a full bucket of 100: the limiter starves", admitted.Load(), errs.Load(), takes.Load())
	}
}

// The over-limit cache answers a rejected key in process until its
// RetryAfter, counted, and lets it through again after.
func TestOverLimitCache(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(7_000_000_000_000))
	reg := prometheus.NewRegistry()
	s := open(t, standaloneURL(t), redis.Options{Clock: clock, Observer: observed(reg)})
	ctx := context.Background()
	lim := uniqueLimit(t, sluice.Spec{Name: "cache", TokensPerSecond: 1, Burst: 2})
	take := func(cost float64) sluice.Decision {
		t.Helper()
		d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k", Cost: cost})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	take(2)
	d := take(1)
	if d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("want a rejection for 1s, got %+v", d)
	}
	// Answered in process: the key is deleted behind the store's back,
	// and still the cached rejection answers.
	c := s.Client()
	if err := c.Do(ctx, c.B().Del().Key(lim.StorageKey("k")).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	clock.Advance(400 * time.Millisecond)
	d = take(1)
	if d.Allowed || d.RetryAfter != 600*time.Millisecond {
		t.Fatalf("cached answer: %+v", d)
	}
	if hits := metricValue(t, reg, "sluice_redis_overlimit_cache_hits_total"); hits != 1 {
		t.Fatalf("cache hits %v, want 1", hits)
	}
	// A TakeAll of one request (every Envoy descriptor with one limit) is
	// answered from the cache too; one of two is not, since the other
	// limit's decision needs Redis.
	ds, err := conformance.TakeAll(ctx, s, engine.OpTake, []sluice.Request{{Limit: lim, Key: "k", Cost: 1}}, nil)
	if err != nil || len(ds) != 1 || ds[0].Allowed || ds[0].RetryAfter != 600*time.Millisecond {
		t.Fatalf("TakeAll of one, cached: %+v, %v", ds, err)
	}
	if hits := metricValue(t, reg, "sluice_redis_overlimit_cache_hits_total"); hits != 2 {
		t.Fatalf("cache hits %v after TakeAll of one, want 2", hits)
	}
	// A reload makes a new limit under the same name (the same key): its
	// takes are not answered by the old limit's rejection.
	reloaded := sluice.MustLimit(sluice.Spec{Name: lim.Name(), TokensPerSecond: 1, Burst: 4})
	if _, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: reloaded, Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if hits := metricValue(t, reg, "sluice_redis_overlimit_cache_hits_total"); hits != 2 {
		t.Fatalf("cache hits %v after a take of the reloaded limit, want still 2", hits)
	}
	other := uniqueLimit(t, sluice.Spec{Name: "cache-other", TokensPerSecond: 1, Burst: 2})
	if _, err := conformance.TakeAll(ctx, s, engine.OpTake, []sluice.Request{{Limit: lim, Key: "k", Cost: 1}, {Limit: other, Key: "k"}}, nil); err != nil {
		t.Fatal(err)
	}
	if hits := metricValue(t, reg, "sluice_redis_overlimit_cache_hits_total"); hits != 2 {
		t.Fatalf("cache hits %v after TakeAll of two, want still 2", hits)
	}
	// A smaller cost than the one rejected is asked of Redis.
	if d := take(0.5); !d.Allowed {
		t.Fatalf("cost 0.5 after the key was deleted: %+v", d)
	}
	// A Reset through the store drops the entry.
	if err := s.Reset(ctx, lim, "k"); err != nil {
		t.Fatal(err)
	}
	if d := take(1); !d.Allowed {
		t.Fatalf("after Reset: %+v", d)
	}
	// After the deadline, Redis is asked again.
	take(2)
	take(2)
	clock.Advance(2 * time.Second)
	if d := take(2); !d.Allowed {
		t.Fatalf("after RetryAfter: %+v", d)
	}

	// The switch, from the store URL.
	reg2 := prometheus.NewRegistry()
	off := open(t, standaloneURL(t)+"?overlimit_cache=0", redis.Options{Clock: clock, Observer: observed(reg2)})
	for range 3 {
		if _, err := conformance.Take(ctx, off, engine.OpTake, sluice.Request{Limit: lim, Key: "k", Cost: 2}); err != nil {
			t.Fatal(err)
		}
	}
	if hits := metricValue(t, reg2, "sluice_redis_overlimit_cache_hits_total"); hits != 0 {
		t.Fatalf("overlimit_cache=0: %v cache hits", hits)
	}
}

func TestBreakerOpensAndProbes(t *testing.T) {
	srv := newStandalone(t)
	s := open(t, "redis://"+srv.Addr(), redis.Options{Timeout: time.Second, BreakerFailures: 3, BreakerBackoff: 200 * time.Millisecond})
	ctx := context.Background()
	lim := uniqueLimit(t, sluice.Spec{Name: "breaker", TokensPerSecond: 10, Burst: 10})
	req := sluice.Request{Limit: lim, Key: "k"}
	if _, err := conformance.Take(ctx, s, engine.OpTake, req); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	for range 3 {
		if _, err := conformance.Take(ctx, s, engine.OpTake, req); err == nil {
			t.Fatal("take succeeded against a stopped server")
		}
	}
	// ErrBreakerOpen is the breaker's own answer, given without a call to
	// Redis (which would fail with a connection error): that, not how soon
	// a loaded machine returns it, shows the call was refused at once.
	_, err := conformance.Take(ctx, s, engine.OpTake, req)
	if !errors.Is(err, redis.ErrBreakerOpen) {
		t.Fatalf("want ErrBreakerOpen, got %v", err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err = conformance.Take(ctx, s, engine.OpTake, req); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url     string
		addrs   []string
		user    string
		pass    string
		db      int
		timeout time.Duration
		master  string
		tls     bool
	}{
		{url: "redis://localhost:6380/2?timeout=5ms", addrs: []string{"localhost:6380"}, db: 2, timeout: 5 * time.Millisecond},
		{url: "redis://bob:secret@h:1", addrs: []string{"h:1"}, user: "bob", pass: "secret"},
		{url: "rediss://h:2", addrs: []string{"h:2"}, tls: true},
		{url: "redis+cluster://u:p@a:1,b:2,c?timeout=3ms", addrs: []string{"a:1", "b:2", "c:6379"}, user: "u", pass: "p", timeout: 3 * time.Millisecond},
		{url: "redis+sentinel://s1:26379,s2/mymaster/3", addrs: []string{"s1:26379", "s2:26379"}, master: "mymaster", db: 3},
	} {
		co, timeout, err := redis.ParseURL(tc.url)
		if err != nil {
			t.Fatalf("%s: %v", tc.url, err)
		}
		if len(co.InitAddress) != len(tc.addrs) || co.Username != tc.user || co.Password != tc.pass || co.SelectDB != tc.db ||
			timeout != tc.timeout || co.Sentinel.MasterSet != tc.master || (co.TLSConfig != nil) != tc.tls {
			t.Fatalf("%s: got addrs %v user %q db %d timeout %v master %q tls %v", tc.url, co.InitAddress, co.Username, co.SelectDB, timeout, co.Sentinel.MasterSet, co.TLSConfig != nil)
		}
		for i := range tc.addrs {
			if co.InitAddress[i] != tc.addrs[i] {
				t.Fatalf("%s: addrs %v", tc.url, co.InitAddress)
			}
		}
	}
	if _, err := redis.Open("redis://127.0.0.1:1?batch=maybe", redis.Options{}); err == nil || !strings.Contains(err.Error(), "batch must be 0 or 1") {
		t.Fatalf("batch=maybe: %v", err)
	}
	for _, v := range []string{"0", "65", "many"} {
		if _, err := redis.Open("redis://127.0.0.1:1?batch_writers="+v, redis.Options{}); err == nil || !strings.Contains(err.Error(), "batch_writers must be 1 to 64") {
			t.Fatalf("batch_writers=%s: %v", v, err)
		}
	}
	for _, bad := range []string{"mysql://x", "redis://h?timeout=-1s", "redis+sentinel://h:1", "nohost"} {
		if _, _, err := redis.ParseURL(bad); err == nil {
			t.Fatalf("%s: no error", bad)
		}
	}
	if _, err := redis.Open("redis://u:hunter2@127.0.0.1:1?timeout=bad", redis.Options{}); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error leaks the password or is missing: %v", err)
	}
}

// A URL that net/url cannot parse (a port or an escape mistyped) is
// reported without its password: url.Parse's error repeats the whole URL.
func TestAttackStoreURLParseErrorEchoesPassword(t *testing.T) {
	for _, bad := range []string{"redis://:hunter2@h:port", "redis://u:hunter2@h:1%zz", "redis+cluster://u:hunter2@[::1:1,h:2", "redis+sentinel://:hunter2@h:port/m"} {
		err := redis.CheckURL(bad)
		if err == nil || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: %v, want an error without the password", bad, err)
		}
	}
}

// CheckURL refuses what Open would, without a server to connect to.
func TestCheckURL(t *testing.T) {
	for _, ok := range []string{"redis://127.0.0.1:1/0", "rediss://h:2?key_prefix=app:", "redis+cluster://a:1,b:2?batch=0"} {
		if err := redis.CheckURL(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for bad, want := range map[string]string{
		"redis://h:1?batch=maybe":         "batch must be 0 or 1",
		"redis://h:1?batch_writers=65":    "batch_writers must be 1 to 64",
		"redis://h:1?key_prefix={tenant}": "hash tag",
		"redis://u:hunter2@h:1?timeout=x": "timeout",
		"mysql://x":                       "unknown scheme",
	} {
		err := redis.CheckURL(bad)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: %v, want an error naming %q without the password", bad, err, want)
		}
	}
}

// With Redis down, the rules' on_store_error applies through the policy
// layer: allow admits and charges nothing, deny rejects; once Redis is
// back, the same rules are enforced from the state Redis kept.
func TestOnStoreErrorWithRedisDown(t *testing.T) {
	srv := newStandalone(t)
	p, err := policy.Parse("redis-down.yaml", []byte(`
rules:
  - name: open
    algorithm_config: {rps: 1, burst: 2}
    on_store_error: allow
  - name: closed
    algorithm_config: {rps: 1, burst: 2}
    on_store_error: deny
`))
	if err != nil {
		t.Fatal(err)
	}
	clock := sluice.NewManualClock(time.UnixMicro(8_000_000_000_000))
	// A deadline far beyond deadlineSlack: a decision that waited for it
	// with Redis down, instead of failing at once, breaks the bound below.
	s := open(t, withQuery("redis://"+srv.Addr(), slowClientTimeouts), redis.Options{Timeout: 30 * time.Second, Clock: clock, NoOverLimitCache: true, BreakerBackoff: 10 * time.Millisecond})
	lim := sluice.New(s)
	ctx := context.Background()
	enforce := func(name string) policy.Verdict {
		var r *policy.Rule
		for _, x := range p.Rules {
			if x.Name == name {
				r = x
			}
		}
		return policy.Enforce(ctx, lim, []policy.Match{{Rule: r, Request: sluice.Request{Limit: r.Limit, Key: "k", Cost: 1}}}, policy.Options{})
	}
	// One token of each bucket spent while Redis is up.
	for _, name := range []string{"open", "closed"} {
		if v := enforce(name); !v.Allowed {
			t.Fatalf("%s: first take rejected: %+v", name, v)
		}
	}
	srv.Stop()
	for range 5 {
		start := time.Now()
		allow, deny := enforce("open"), enforce("closed")
		if !allow.Allowed || allow.Results[0].StoreErr == nil {
			t.Fatalf("on_store_error allow: %+v", allow)
		}
		if deny.Allowed || deny.Results[0].StoreErr == nil {
			t.Fatalf("on_store_error deny: %+v", deny)
		}
		if d := time.Since(start); d > deadlineSlack {
			t.Fatalf("two decisions took %v with Redis down", d)
		}
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	// The restart emptied Redis (no persistence), so the bucket is full
	// again: the first take after recovery leaves burst-1, which also shows
	// the allows while Redis was down left nothing behind to replay.
	deadline := time.Now().Add(time.Minute)
	for {
		v := enforce("open")
		if v.Results[0].StoreErr == nil {
			if !v.Allowed || v.Results[0].Decision.Remaining != 1 {
				t.Fatalf("after restart: %+v", v.Results[0].Decision)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery: %v", v.Results[0].StoreErr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A Redis that hangs (SIGSTOP: connections open, no answers) is the case a
// deadline exists for: every call ends by its deadline (the default one),
// the breaker with its default threshold then fails calls at once, and
// answers resume when the server does (SIGCONT).
func TestHungRedis(t *testing.T) {
	srv := newStandalone(t)
	const timeout = redis.DefaultTimeout
	s := open(t, withQuery("redis://"+srv.Addr(), slowClientTimeouts), redis.Options{Timeout: timeout, BreakerBackoff: 100 * time.Millisecond, NoOverLimitCache: true})
	ctx := context.Background()
	lim := uniqueLimit(t, sluice.Spec{Name: "hung", TokensPerSecond: 1e6, Burst: 1e6})
	req := sluice.Request{Limit: lim, Key: "k"}
	if _, err := conformance.Take(ctx, s, engine.OpTake, req); err != nil {
		t.Fatal(err)
	}
	if err := srv.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			srv.Signal(syscall.SIGCONT)
		}
	}()
	var slowest time.Duration
	var breakerOpen int
	for range 30 {
		start := time.Now()
		_, err := conformance.Take(ctx, s, engine.OpTake, req)
		slowest = max(slowest, time.Since(start))
		if err == nil {
			t.Fatal("a take succeeded against a stopped server")
		}
		if errors.Is(err, redis.ErrBreakerOpen) {
			breakerOpen++
		}
	}
	if slowest > timeout+deadlineSlack {
		t.Fatalf("a call against a hung server took %v, deadline %v", slowest, timeout)
	}
	if breakerOpen == 0 {
		t.Fatal("the breaker never opened")
	}
	t.Logf("hung server: slowest call %v (deadline %v), %d of 30 refused by the open breaker", slowest, timeout, breakerOpen)
	srv.Signal(syscall.SIGCONT)
	resumed = true
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := conformance.Take(ctx, s, engine.OpTake, req); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("no recovery after SIGCONT: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Against a hung Redis, calls that waited in this process for a batch to
// carry them (their deadline runs from the send) still end in bounded
// time: each batch ends by its deadline and takes every call queued.
func TestHungRedisConcurrentCallers(t *testing.T) {
	srv := newStandalone(t)
	const timeout = redis.DefaultTimeout
	s := open(t, withQuery("redis://"+srv.Addr(), slowClientTimeouts), redis.Options{Timeout: timeout, NoOverLimitCache: true})
	ctx := context.Background()
	lim := uniqueLimit(t, sluice.Spec{Name: "hung-many", TokensPerSecond: 1e6, Burst: 1e6})
	if _, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer srv.Signal(syscall.SIGCONT)
	var slowest atomic.Int64
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 4 {
				start := time.Now()
				_, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: fmt.Sprint(g, "-", i)})
				if err == nil {
					t.Error("a take succeeded against a stopped server")
				}
				for d := int64(time.Since(start)); ; {
					m := slowest.Load()
					if d <= m || slowest.CompareAndSwap(m, d) {
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	// A call queued behind a batch in flight waits for it and then for
	// its own: two deadlines, and deadlineSlack.
	if d := time.Duration(slowest.Load()); d > 2*timeout+deadlineSlack {
		t.Fatalf("a call against a hung server took %v, deadline %v", d, timeout)
	}
	t.Logf("hung server, 64 callers: slowest call %v (deadline %v)", time.Duration(slowest.Load()), timeout)
}

// Attack: a loaded host makes a healthy Redis read as a failed one. When
// this process is short of CPU, every call waits for the scheduler at each
// hand-off (the caller, the client's writer, its reader), and a deadline
// shorter than those waits fails calls that Redis answered at once; enough
// of them open the circuit breaker, and then every decision is the rule's
// on_store_error for the backoff, with Redis up. Here the load is made
// inside the process, so that it does not depend on the machine: one P
// (GOMAXPROCS 1) shared with a goroutine that never blocks, so a goroutine
// that becomes runnable waits for the Go scheduler to preempt it (after
// 10 ms, whatever the machine's speed) before it runs. With the default
// options the calls succeed and the breaker stays closed; two failures of
// 40 are allowed in an attempt, and five attempts are made, for a machine
// that stalls this whole process meanwhile (with the former 10 ms default,
// 8 to 19 of 40 failed in every attempt).
func TestAttackLoadedHostIsNotADeadStore(t *testing.T) {
	url := standaloneURL(t)
	// A machine loaded from outside (other processes on its cores) can
	// fail calls in any one attempt as well: that is its speed, not the
	// store's. Such load comes and goes; the load made here does not, and
	// with a deadline it defeats, every attempt fails.
	var tries []string
	for range 5 {
		failed, opens, last, slowest := loadedTakes(t, url)
		if failed <= 2 && opens == 0 {
			t.Logf("40 takes on a loaded process: %d failed, slowest %v (after %d attempts with more)", failed, slowest, len(tries))
			return
		}
		tries = append(tries, fmt.Sprintf("%d of 40 failed (last: %v), breaker opened %v times, slowest call %v", failed, last, opens, slowest))
	}
	t.Fatalf("takes against a healthy Redis failed in every attempt:\n%s", strings.Join(tries, "\n"))
}

// loadedTakes makes 40 takes from two goroutines on a process with one P
// shared with a goroutine that never blocks, on a store of its own with
// the default deadline and breaker, and returns how many failed, how
// often the breaker opened, the last error and the slowest call.
func loadedTakes(t *testing.T, url string) (failed int64, opens float64, last any, slowest time.Duration) {
	reg := prometheus.NewRegistry()
	s, err := redis.Open(url, redis.Options{Observer: observed(reg), NoOverLimitCache: true}) // the default deadline and breaker
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	lim := uniqueLimit(t, sluice.Spec{Name: "loaded", TokensPerSecond: 1e6, Burst: 1e6})
	if _, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "warm"}); err != nil {
		t.Fatal(err)
	}

	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var stop atomic.Bool
	var hogs sync.WaitGroup
	for range 1 {
		hogs.Add(1)
		go func() {
			defer hogs.Done()
			for n := 0; !stop.Load(); n++ {
			}
		}()
	}
	var nFailed atomic.Int64
	var callers sync.WaitGroup
	var lastErr atomic.Value
	var slowestNs atomic.Int64
	for c := range 2 {
		callers.Add(1)
		go func() {
			defer callers.Done()
			for i := range 20 {
				start := time.Now()
				_, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k" + string(rune('a'+c)) + string(rune('a'+i))})
				if d := int64(time.Since(start)); d > slowestNs.Load() {
					slowestNs.Store(d)
				}
				if err != nil {
					nFailed.Add(1)
					lastErr.Store(err)
				}
			}
		}()
	}
	callers.Wait()
	stop.Store(true)
	hogs.Wait()
	return nFailed.Load(), metricValue(t, reg, "sluice_redis_breaker_opens_total"), lastErr.Load(), time.Duration(slowestNs.Load())
}

// A fleet shares Redis, each process with its own over-limit cache: a
// Reset or a refund made through one store reaches the others' caches
// (published on a channel), so they stop rejecting the key at once rather
// than at the cached RetryAfter. The clock stands still, so only a dropped
// entry can make a take pass.
func TestOverLimitCacheFleet(t *testing.T) {
	for _, tc := range []struct {
		name string
		url  func(testing.TB) string
	}{{"standalone", standaloneURL}, {"cluster", clusterURL}} {
		t.Run(tc.name, func(t *testing.T) {
			clock := sluice.NewManualClock(time.UnixMicro(9_000_000_000_000))
			regA := prometheus.NewRegistry()
			a := open(t, tc.url(t), redis.Options{Clock: clock, Observer: observed(regA)})
			b := open(t, tc.url(t), redis.Options{Clock: clock, NoOverLimitCache: true})
			ctx := context.Background()
			lim := uniqueLimit(t, sluice.Spec{Name: "fleet", TokensPerSecond: 1.0 / 3600, Burst: 2})
			take := func() sluice.Decision {
				t.Helper()
				ds, err := conformance.TakeAll(ctx, a, engine.OpTake, []sluice.Request{{Limit: lim, Key: "k"}}, nil)
				if err != nil {
					t.Fatal(err)
				}
				return ds[0]
			}
			exhaust := func() {
				t.Helper()
				for take().Allowed {
				}
				hits := metricValue(t, regA, "sluice_redis_overlimit_cache_hits_total")
				if take().Allowed || metricValue(t, regA, "sluice_redis_overlimit_cache_hits_total") != hits+1 {
					t.Fatal("the rejection was not answered from the cache")
				}
			}
			untilAllowed := func(what string) {
				t.Helper()
				for deadline := time.Now().Add(time.Minute); !take().Allowed; {
					if time.Now().After(deadline) {
						t.Fatalf("after %s through another store, the cache still rejects", what)
					}
					time.Sleep(5 * time.Millisecond) // waiting for the message, not for tokens
				}
			}

			exhaust()
			if err := b.Reset(ctx, lim, "k"); err != nil {
				t.Fatal(err)
			}
			untilAllowed("a Reset")

			exhaust()
			if _, err := conformance.Take(ctx, b, engine.OpRefund, sluice.Request{Limit: lim, Key: "k", Cost: 1}); err != nil {
				t.Fatal(err)
			}
			untilAllowed("a refund")
		})
	}
}

// New waits for its drops subscription only a store call's deadline, so
// a store whose subscription is slower may cache a rejection before it is
// up, and a Reset made through another store meanwhile is published to no
// one: the cache is cleared when the first subscription is confirmed too,
// not only when a lost one is made again. The subscription is held back
// until the rejection is cached and the Reset published; the clock stands
// still.
func TestOverLimitCacheBeforeFirstSubscription(t *testing.T) {
	hold := make(chan struct{})
	var once sync.Once
	// New's wait ends (as at its deadline), then the subscription waits.
	redis.SetBeforeSubscribe(t, func(waitOver func()) { once.Do(func() { waitOver(); <-hold }) })
	clock := sluice.NewManualClock(time.UnixMicro(9_100_000_000_000))
	a := open(t, standaloneURL(t), redis.Options{Clock: clock})
	b := open(t, standaloneURL(t), redis.Options{Clock: clock, NoOverLimitCache: true})
	ctx := context.Background()
	lim := uniqueLimit(t, sluice.Spec{Name: "early", TokensPerSecond: 1.0 / 3600, Burst: 1})
	take := func() sluice.Decision {
		t.Helper()
		d, err := conformance.Take(ctx, a, engine.OpTake, sluice.Request{Limit: lim, Key: "k"})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	take()
	if take().Allowed {
		t.Fatal("a second take of a burst of 1 was admitted")
	}
	if err := b.Reset(ctx, lim, "k"); err != nil {
		t.Fatal(err)
	}
	close(hold)
	for deadline := time.Now().Add(time.Minute); !take().Allowed; {
		if time.Now().After(deadline) {
			t.Fatal("a rejection cached before the first subscription outlived a Reset")
		}
		time.Sleep(5 * time.Millisecond) // waiting for the subscription, not for tokens
	}
}

// A subscription that is lost may have missed messages: the cache is
// cleared when it is made again. Redis restarted empty here, so the
// bucket is full, and a cache kept across the restart would reject it.
func TestOverLimitCacheClearedOnResubscribe(t *testing.T) {
	if testing.Short() {
		t.Skip("restart takes seconds")
	}
	srv := newStandalone(t)
	clock := sluice.NewManualClock(time.UnixMicro(9_500_000_000_000))
	s := open(t, "redis://"+srv.Addr(), redis.Options{Clock: clock, Timeout: time.Second, BreakerBackoff: 10 * time.Millisecond})
	ctx := context.Background()
	lim := uniqueLimit(t, sluice.Spec{Name: "resub", TokensPerSecond: 1.0 / 3600, Burst: 1})
	take := func() (sluice.Decision, error) {
		return conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"})
	}
	take()
	if d, err := take(); err != nil || d.Allowed {
		t.Fatalf("second take of a burst of 1: %+v, %v", d, err)
	}
	srv.Stop()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		d, err := take()
		if err == nil && d.Allowed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the restart: %+v, %v (the cache outlived the subscription)", d, err)
		}
		time.Sleep(20 * time.Millisecond) // waiting for the reconnection
	}
}

// A user whose ACL has no pub/sub channels still gets its takes; the
// refused subscription and publishes are counted, not fatal.
func TestOverLimitDropsRefusedByACL(t *testing.T) {
	srv := newStandalone(t)
	if out, err := redistest.CLI(srv.Addr(), "ACL", "SETUSER", "nochan", "on", ">pw", "~*", "+@all", "resetchannels"); err != nil || !strings.Contains(out, "OK") {
		t.Fatalf("ACL SETUSER: %v %s", err, out)
	}
	reg := prometheus.NewRegistry()
	s := open(t, "redis://nochan:pw@"+srv.Addr(), redis.Options{Observer: observed(reg)})
	ctx := context.Background()
	lim := uniqueLimit(t, sluice.Spec{Name: "acl", TokensPerSecond: 1, Burst: 1})
	if d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"}); err != nil || !d.Allowed {
		t.Fatalf("take: %+v, %v", d, err)
	}
	if err := s.Reset(ctx, lim, "k"); err != nil {
		t.Fatalf("reset with its publish refused: %v", err)
	}
	for deadline := time.Now().Add(time.Minute); metricValue(t, reg, "sluice_redis_overlimit_drops_failures_total") < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("refused subscription and publish not counted: %v", metricValue(t, reg, "sluice_redis_overlimit_drops_failures_total"))
		}
		time.Sleep(10 * time.Millisecond) // waiting for the subscription's retry
	}
}
