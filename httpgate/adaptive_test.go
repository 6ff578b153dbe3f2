package httpgate_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/internal/lockedbuf"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/postgres"
	"github.com/sluicehq/sluice/postgres/pgtest"
	"github.com/sluicehq/sluice/redis"
)

// Upstream behaviours a test switches between.
const (
	upHealthy int32 = iota
	upFailing       // 500s
	upSlow          // 300ms on the test's clock
)

// switchable is an upstream whose behaviour the test switches over time.
// Slow answers take their time on the test's manual clock, so latency is
// measured without sleeping.
type switchable struct {
	*httptest.Server
	mode atomic.Int32
}

func newSwitchable(t *testing.T, clk *sluice.ManualClock) *switchable {
	u := &switchable{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch u.mode.Load() {
		case upFailing:
			http.Error(w, "upstream is failing", http.StatusInternalServerError)
		case upSlow:
			clk.Advance(300 * time.Millisecond)
			fmt.Fprint(w, "slow")
		default:
			fmt.Fprint(w, "ok")
		}
	}))
	t.Cleanup(u.Close)
	return u
}

// proxyOf serves g as a reverse proxy in front of up.
func proxyOf(t *testing.T, g *httpgate.Gate, up string) *served {
	u, _ := url.Parse(up)
	return serve(t, g.Proxy(u, httpgate.ProxyOptions{}))
}

// get fetches path and waits for the handler to return.
func (s *served) get(t *testing.T, path string) *http.Response {
	t.Helper()
	resp := fetch(t, s.URL+path)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not return")
	}
	return resp
}

func fetch(t *testing.T, u string) *http.Response {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

const adaptivePolicy = `rules:
  - name: upstream
    algorithm_config:
      rps: 10
      burst_seconds: 1
      adaptive:
        min: 1
        max: 20
        target_latency: 200ms
        interval: 1s
        increase: 2
        decrease: 0.5
        error_ratio: 0
        min_keys: 1
`

// The rate follows the upstream: additive increase while it answers well,
// halving each interval while it answers 500 or slowly, down to min, and
// back up once it recovers. One request per interval, on a manual clock;
// each interval's verdict moves the rate at the next interval's first
// request. The limit enforces the rate in force: at min, a burst of one
// second holds one request, and the rate limit fields say so.
func TestAdaptiveRateFollowsUpstream(t *testing.T) {
	e := newEnv(t, adaptivePolicy)
	up := newSwitchable(t, e.clk)
	proxy := proxyOf(t, e.gate, up.URL)

	rate := func() float64 { return e.gate.AdaptiveRates()[0].Rate }
	phases := []struct {
		mode int32
		n    int
	}{{upHealthy, 3}, {upFailing, 6}, {upHealthy, 3}, {upSlow, 2}, {upHealthy, 2}}
	var path []float64
	for _, ph := range phases {
		up.mode.Store(ph.mode)
		for range ph.n {
			resp := proxy.get(t, "/v1/chat")
			if ph.mode == upFailing && resp.StatusCode != 500 || ph.mode != upFailing && resp.StatusCode != 200 {
				t.Fatalf("mode %d: status %d", ph.mode, resp.StatusCode)
			}
			path = append(path, rate())
			e.clk.Advance(time.Second)
		}
	}
	// Each value is the rate after that interval's request, moved by the
	// previous interval's verdict. A slow answer advances the clock by
	// 300ms, so its interval ends 300ms sooner.
	want := []float64{
		10, 12, 14, // healthy: +2
		16, 8, 4, 2, 1, 1, // failing from the 4th: the 4th still moves up (3rd was healthy)
		1, 3, 5, // healthy again: a decrease, then +2 an interval later
		7, 3.5, // slow: 300ms above the 200ms target
		1.75, 3.75,
	}
	if fmt.Sprint(path) != fmt.Sprint(want) {
		t.Fatalf("rate path\n got %v\nwant %v", path, want)
	}
	if m := e.metrics(); !strings.Contains(m, `sluice_adaptive_rate{rule="upstream"} 3.75`) {
		t.Fatalf("metric: %s", grep(m, "sluice_adaptive_rate"))
	}

	// Back to min: a burst of one second of the rate in force holds one
	// request, and the fields tell the burst in the rule's own units.
	up.mode.Store(upFailing)
	for range 4 {
		proxy.get(t, "/")
		e.clk.Advance(time.Second)
	}
	if rate() != 1 {
		t.Fatalf("rate %v, want min", rate())
	}
	up.mode.Store(upHealthy)
	if resp := proxy.get(t, "/"); resp.StatusCode != 200 || resp.Header.Get("RateLimit-Limit") != "1" || resp.Header.Get("RateLimit-Remaining") != "0" {
		t.Fatalf("at min: %d limit %q remaining %q", resp.StatusCode, resp.Header.Get("RateLimit-Limit"), resp.Header.Get("RateLimit-Remaining"))
	}
	resp := proxy.get(t, "/")
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("second request at min: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// A fleet on Redis moves one rate: what one process measures reaches the
// others at their next interval, and the interval's step is taken once
// whoever takes it.
func TestAdaptiveRateSharedThroughRedis(t *testing.T) {
	addr := redistest.Server(t)
	clk := sluice.NewManualClock(sluiceEpoch)
	prefix := fmt.Sprintf("adaptive%d:", time.Now().UnixNano())
	testAdaptiveFleet(t, clk, func() sluice.Store {
		st, err := redis.Open("redis://"+addr+"/0", redis.Options{Clock: clk, KeyPrefix: prefix, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	})
}

// The same fleet on PostgreSQL: each process a store of its own on one
// database.
func TestAdaptiveRateSharedThroughPostgres(t *testing.T) {
	srv := pgtest.ForTest(t)
	ctx := pgtest.Context(t)
	url, err := srv.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	clk := sluice.NewManualClock(sluiceEpoch)
	testAdaptiveFleet(t, clk, func() sluice.Store {
		st, err := postgres.Open(ctx, url, postgres.Options{Clock: clk, Migrate: true, HousekeepingInterval: -1, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		return st
	})
}

// testAdaptiveFleet runs processes of one fleet, each a gate over a
// store that store opens, and checks that they move one adaptive rate.
func testAdaptiveFleet(t *testing.T, clk *sluice.ManualClock, store func() sluice.Store) {
	gate := func() *httpgate.Gate {
		st := store()
		m := metrics.New(prometheus.NewRegistry())
		lim := sluice.NewWithOptions(m.InstrumentStore(st), sluice.Options{Clock: clk})
		return httpgate.New(mustPolicy(t, adaptivePolicy), lim, httpgate.Options{Metrics: m, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	}
	a, b := gate(), gate()
	failing := newSwitchable(t, clk)
	failing.mode.Store(upFailing)
	healthy := newSwitchable(t, clk)
	pa, pb := proxyOf(t, a, failing.URL), proxyOf(t, b, healthy.URL)
	rate := func(g *httpgate.Gate) float64 { return g.AdaptiveRates()[0].Rate }

	// Every request is one client's (one key): min_keys 1 lets it move
	// the rate. Intervals are aligned on the clock's seconds in every
	// process; an interval is judged on the fleet's tally by the first
	// report of a later one.
	pa.get(t, "/") // a: a 500, in the first interval
	pb.get(t, "/") // b: a 200
	clk.Advance(time.Second)
	pa.get(t, "/") // a reports the first interval: the rate waits for the fleet's tally
	if rate(a) != 10 {
		t.Fatalf("a: %v, want 10 until the interval is judged", rate(a))
	}
	pb.get(t, "/") // b's report joins a's: one key, 2 responses, 1 error
	clk.Advance(time.Second)
	failing.mode.Store(upHealthy)
	pb.get(t, "/") // b reports the second interval: the first is judged, 10 -> 5
	if rate(b) != 5 {
		t.Fatalf("b: %v, want 5", rate(b))
	}
	pa.get(t, "/") // a adopts the fleet's rate; its 500 of the second interval joins its tally
	if rate(a) != 5 {
		t.Fatalf("a: %v, want the fleet's 5", rate(a))
	}
	clk.Advance(time.Second)
	pa.get(t, "/") // the second interval had a's 500: 5 -> 2.5
	if rate(a) != 2.5 {
		t.Fatalf("a: %v, want 2.5", rate(a))
	}
	pb.get(t, "/")
	clk.Advance(time.Second)
	pb.get(t, "/") // a healthy interval, an interval after the decrease: +2
	if rate(b) != 4.5 {
		t.Fatalf("b: %v, want 4.5 (2.5, +2)", rate(b))
	}

	// A new process of the fleet starts at the fleet's rate, not its own.
	c := gate()
	pc := proxyOf(t, c, healthy.URL)
	pc.get(t, "/")
	if rate(c) != 4.5 {
		t.Fatalf("a new process: %v, want the fleet's 4.5", rate(c))
	}
}

// The Go middleware measures the handler it wraps as the proxy measures
// its upstream.
func TestAdaptiveMiddleware(t *testing.T) {
	e := newEnv(t, adaptivePolicy)
	var fail atomic.Bool
	h := e.gate.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		// No write at all: net/http's implicit 200.
	}))
	srv := serve(t, h)
	fail.Store(true)
	srv.get(t, "/")
	e.clk.Advance(time.Second)
	fail.Store(false)
	srv.get(t, "/")
	if r := e.gate.AdaptiveRates()[0].Rate; r != 5 {
		t.Fatalf("after a 503: %v, want 5", r)
	}
	e.clk.Advance(time.Second)
	srv.get(t, "/")
	if r := e.gate.AdaptiveRates()[0].Rate; r != 7 {
		t.Fatalf("after implicit 200s: %v, want 7", r)
	}
}

// A reload keeps an adaptive limit's rate (its state is by name, as
// bucket state is), brought within the new bounds.
func TestAdaptiveRateSurvivesReload(t *testing.T) {
	e := newEnv(t, adaptivePolicy)
	up := newSwitchable(t, e.clk)
	proxy := proxyOf(t, e.gate, up.URL)
	up.mode.Store(upFailing)
	proxy.get(t, "/")
	e.clk.Advance(time.Second)
	proxy.get(t, "/")
	if r := e.gate.AdaptiveRates()[0].Rate; r != 5 {
		t.Fatalf("rate %v", r)
	}
	e.gate.SetPolicy(mustPolicy(t, strings.Replace(adaptivePolicy, "min: 1", "min: 6", 1)))
	proxy.get(t, "/")
	got := e.gate.AdaptiveRates()
	if len(got) != 1 || got[0].Rate != 6 || got[0].Min != 6 {
		t.Fatalf("after the reload: %+v, want 6 (the new min)", got)
	}
}

// Through an adaptive limit the response is measured by a wrapper of the
// ResponseWriter: event streams still flush as they come, and upgrades
// still hijack the connection.
func TestAdaptiveProxyStreamsAndUpgrades(t *testing.T) {
	up := newUpstream(t)
	e := newEnv(t, adaptivePolicy)
	proxy := proxyOf(t, e.gate, up.URL)

	resp, err := http.Get(proxy.URL + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: one\n" {
		t.Fatalf("first event: %q %v", line, err)
	}
	close(up.release)
	if rest, _ := io.ReadAll(br); !strings.Contains(string(rest), "data: two") {
		t.Errorf("rest of stream %q", rest)
	}
	<-proxy.done

	conn, cr, _ := upgradeTo(t, proxy.URL)
	fmt.Fprint(conn, "ping\n")
	if echo, err := cr.ReadString('\n'); err != nil || echo != "ping\n" {
		t.Errorf("echo %q %v", echo, err)
	}
	conn.Close()
	<-proxy.done
	// Both were healthy answers: the next interval's step is up.
	e.clk.Advance(time.Second)
	proxy.get(t, "/")
	if r := e.gate.AdaptiveRates()[0].Rate; r != 12 {
		t.Fatalf("rate %v, want 12", r)
	}
}

// perClientAdaptive is an adaptive limit per client (the X-Client
// header), with the defaults of the share of keys: what a client can do
// to the rate the others get.
const perClientAdaptive = `rules:
  - name: per-client
    limit_keys: ["header:X-Client"]
    algorithm_config:
      rps: 10
      burst_seconds: 1
      adaptive:
        min: 1
        max: 20
        target_latency: 200ms
        interval: 1s
        increase: 2
`

// blamingUpstream answers 500 to the client "attacker*" (its own bad
// input), 200 to everyone else.
func blamingUpstream(t *testing.T) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if strings.HasPrefix(r.Header.Get("X-Client"), "attacker") {
			http.Error(w, "bad input", http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(up.Close)
	return up
}

// One client whose requests the upstream answers 500 does not drag every
// other client's rate down: the errors are judged per key, and one key
// is not enough to lower the rule's rate. (Before, the rule's one rate
// halved every interval the attacker's errors were a tenth of the
// responses, and the victim's admitted share with it.)
func TestAttackAdaptiveOneKeyErrorsDoNotLowerOthers(t *testing.T) {
	e := newEnv(t, perClientAdaptive)
	proxy := proxyOf(t, e.gate, blamingUpstream(t).URL)
	for interval := range 8 {
		for range 5 {
			if st, _ := call(t, proxy, "/", "", "X-Client", "attacker"); st != 500 && st != 429 {
				t.Fatalf("attacker: %d", st)
			}
		}
		for i := range 5 {
			if st, _ := call(t, proxy, "/", "", "X-Client", "victim"); st != 200 {
				t.Fatalf("interval %d: the victim's request %d of 5 (half its rate): %d", interval, i+1, st)
			}
		}
		if r := e.gate.AdaptiveRates()[0].Rate; r < 10 {
			t.Fatalf("interval %d: the rule's rate fell to %v on one key's errors", interval, r)
		}
		e.clk.Advance(time.Second)
	}
}

// A client trickling its request body to a healthy upstream does not
// read as a slow upstream: latency runs from the request fully sent to
// the first byte of the answer. Two clients (two keys, enough to lower
// the rate) each send a 4-byte body whose last bytes come 600ms (on the
// gate's clock) after the upstream has started reading it, with
// target_latency 200ms.
func TestAttackAdaptiveSlowBodyIsNotSlowUpstream(t *testing.T) {
	e := newEnv(t, perClientAdaptive)
	reading := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reading <- struct{}{}
		io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(up.Close)
	proxy := proxyOf(t, e.gate, up.URL)
	trickle := func(client string) {
		t.Helper()
		pr, pw := io.Pipe()
		req, _ := http.NewRequest("POST", proxy.URL+"/", pr)
		req.ContentLength = 4
		req.Header.Set("X-Client", client)
		type result struct {
			resp *http.Response
			err  error
		}
		done := make(chan result, 1)
		go func() {
			resp, err := http.DefaultTransport.RoundTrip(req)
			done <- result{resp, err}
		}()
		pw.Write([]byte("a"))
		select {
		case <-reading:
		case <-time.After(10 * time.Second):
			t.Fatal("the upstream never saw the request")
		}
		e.clk.Advance(600 * time.Millisecond) // the client's upload, not the upstream
		pw.Write([]byte("bcd"))
		pw.Close()
		res := <-done
		if res.err != nil {
			t.Fatal(res.err)
		}
		io.Copy(io.Discard, res.resp.Body)
		res.resp.Body.Close()
		<-proxy.done
		if res.resp.StatusCode != 200 {
			t.Fatalf("%s: %d", client, res.resp.StatusCode)
		}
	}
	for interval := range 4 {
		trickle("slow-1")
		trickle("slow-2")
		if r := e.gate.AdaptiveRates()[0].Rate; r < 10 {
			t.Fatalf("interval %d: the rate fell to %v on the clients' own slow uploads", interval, r)
		}
		e.clk.Advance(time.Second)
	}
}

// Two processes on one Redis: an attacker with two keys, touching only
// process 2, is a third of the fleet's keys (four healthy clients on
// process 1), so the shared rate does not fall, and process 2's view
// (its only keys failing) does not overwrite process 1's healthy step
// up. (Before, each process judged its own traffic alone and stepped the
// shared rate on it: process 2 halved it every interval.)
func TestAttackAdaptiveFleetAttackerOnOneProcess(t *testing.T) {
	f := newAdaptiveFleet(t, "adaptive-attack", slog.New(slog.NewTextHandler(t.Output(), nil)))
	for interval := range 8 {
		f.interval(t, interval)
		if r := f.p1.AdaptiveRates()[0].Rate; r < 10 {
			t.Fatalf("interval %d: process 1's rate fell to %v on process 2's attacker", interval, r)
		}
		f.clk.Advance(time.Second)
	}
	if r := f.p1.AdaptiveRates()[0].Rate; r <= 10 {
		t.Fatalf("the fleet's healthy intervals did not raise the rate: %v", r)
	}
}

// adaptiveFleet is two processes on one Redis serving perClientAdaptive
// in front of blamingUpstream, on one manual clock.
type adaptiveFleet struct {
	clk      *sluice.ManualClock
	p1, p2   *httpgate.Gate
	up       *httptest.Server
	px1, px2 *served
}

func newAdaptiveFleet(t *testing.T, name string, log *slog.Logger) *adaptiveFleet {
	addr := redistest.Server(t)
	f := &adaptiveFleet{clk: sluice.NewManualClock(sluiceEpoch)}
	prefix := fmt.Sprintf("%s%d:", name, time.Now().UnixNano())
	gate := func() *httpgate.Gate {
		st, err := redis.Open("redis://"+addr+"/0", redis.Options{Clock: f.clk, KeyPrefix: prefix, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		lim := sluice.NewWithOptions(st, sluice.Options{Clock: f.clk})
		return httpgate.New(mustPolicy(t, perClientAdaptive), lim, httpgate.Options{Logger: log})
	}
	f.p1, f.p2 = gate(), gate()
	f.up = blamingUpstream(t)
	f.px1, f.px2 = proxyOf(t, f.p1, f.up.URL), proxyOf(t, f.p2, f.up.URL)
	return f
}

// interval is one interval's traffic: four healthy clients on process 1,
// each admitted twice, and two attacker keys on process 2 that the
// upstream answers with failures.
func (f *adaptiveFleet) interval(t *testing.T, interval int) {
	t.Helper()
	for _, v := range []string{"v1", "v2", "v3", "v4"} {
		for range 2 {
			if st, _ := call(t, f.px1, "/", "", "X-Client", v); st != 200 {
				t.Fatalf("interval %d: victim %s on process 1: %d", interval, v, st)
			}
		}
	}
	for _, a := range []string{"attacker-1", "attacker-2"} {
		for range 5 {
			call(t, f.px2, "/", "", "X-Client", a)
		}
	}
}

// Attack: keep a process's clients out of the fleet's verdict by hanging
// up. The first request after an interval's end takes the process's step,
// which reports the interval's counts to the fleet's tally; an attacker
// sending a request at each interval's end (the boundaries are multiples
// of the interval, known to all) and hanging up at once had that report
// run on its request's context, which the hang-up ended: the step failed,
// the process's counts were dropped, and the fleet judged the attacker's
// keys on process 2 alone, halving every process's rate each interval.
// The step is the fleet's, and runs to its deadline whoever takes it.
func TestAttackAdaptiveHungUpRequestDropsFleetReport(t *testing.T) {
	f := newAdaptiveFleet(t, "adaptive-hangup", slog.New(slog.NewTextHandler(io.Discard, nil)))
	upURL, _ := url.Parse(f.up.URL)
	direct1 := f.p1.Proxy(upURL, httpgate.ProxyOptions{})
	gone, hangUp := context.WithCancel(context.Background())
	hangUp()
	for interval := range 6 {
		// The client has gone by the time its request is decided.
		req := httptest.NewRequestWithContext(gone, "GET", "/", nil)
		req.Header.Set("X-Client", "attacker-1")
		direct1.ServeHTTP(httptest.NewRecorder(), req)
		f.interval(t, interval)
		if r := f.p2.AdaptiveRates()[0].Rate; r < 10 {
			t.Fatalf("interval %d: the fleet's rate fell to %v: process 1's healthy keys were left out of its verdict", interval, r)
		}
		f.clk.Advance(time.Second)
	}
}

// A client that sends Expect: 100-continue has the upstream answer 100
// as soon as it starts reading the body: that interim answer is not the
// upstream's answer, so an upstream slow for everyone does not read as
// fast to such clients. (Before, the 100's first byte stopped the clock:
// every such request read as 0 ms, and the rate never fell.)
func TestAttackAdaptiveExpectContinueIsNotAFastAnswer(t *testing.T) {
	// The upstream's slowness is the test clock's step right after it has
	// read the body; the proxy's transport may report the request written
	// just after that step (the goroutines' order, not the client's
	// doing), and then that answer reads as fast. Before, every answer
	// read as 0 ms, so no try saw the rate fall; now a try fails only if
	// that order comes up for both clients' every answer.
	var rates []float64
	for range 5 {
		fell, r := expectContinueRateFalls(t)
		if fell {
			return
		}
		rates = append(rates, r)
	}
	t.Fatalf("the rate never fell (ended at %v from 10 in each try) although every answer took 300ms against a 200ms target", rates)
}

// expectContinueRateFalls sends requests with Expect: 100-continue to an
// upstream that answers every one in 300ms of the test's clock, and
// reports whether the adaptive rate fell, and where it ended.
func expectContinueRateFalls(t *testing.T) (bool, float64) {
	e := newEnv(t, perClientAdaptive)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)           // net/http answers 100 Continue here
		e.clk.Advance(300 * time.Millisecond) // the upstream's own slowness
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(up.Close)
	proxy := proxyOf(t, e.gate, up.URL)
	send := func(client string) {
		t.Helper()
		req, _ := http.NewRequest("POST", proxy.URL+"/", strings.NewReader("body"))
		req.Header.Set("X-Client", client)
		req.Header.Set("Expect", "100-continue")
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		<-proxy.done
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", client, resp.StatusCode)
		}
	}
	start := e.gate.AdaptiveRates()[0].Rate
	for range 3 {
		send("c-1")
		send("c-2")
		e.clk.Advance(time.Second)
	}
	send("c-1") // steps the rate for the last interval
	r := e.gate.AdaptiveRates()[0].Rate
	return r < start, r
}

// minorityPolicy is an adaptive rule with the file defaults (error_ratio
// 0.1, the 90th percentile), whose burst admits 20 requests an interval.
const minorityPolicy = `rules:
  - name: upstream
    algorithm_config:
      rps: 20
      burst_seconds: 1
      adaptive: {min: 2, max: 40, target_latency: 200ms, increase: 2}
`

// minorityUpstream fails /crash with a 500, answers /slow in 5s of the
// test's clock, and everything else at once.
func minorityUpstream(t *testing.T, clk *sluice.ManualClock) string {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/crash":
			http.Error(w, "boom", 500)
		case "/slow":
			clk.Advance(5 * time.Second)
		}
	}))
	t.Cleanup(up.Close)
	return up.URL
}

// Attack: a client whose own requests make the upstream fail (a body it
// crashes on) or answer slowly (a huge prompt) would drive the rate of
// every client of the rule down to min, if one error or one slow answer
// made an interval unhealthy. With error_ratio's default (0.1) and the
// 90th percentile, one such request among twenty moves nothing: the rate
// keeps rising. (An upstream failing a tenth of all requests, or slow for
// a tenth, is judged unhealthy: TestAdaptiveRateFollowsUpstream.)
func TestAttackMinorityCannotDriveRateDown(t *testing.T) {
	for _, bad := range []string{"/crash", "/slow"} {
		t.Run(bad, func(t *testing.T) {
			e := newEnv(t, minorityPolicy)
			proxy := proxyOf(t, e.gate, minorityUpstream(t, e.clk))
			start := e.gate.AdaptiveRates()[0].Rate
			for range 3 {
				for range 19 {
					if resp := proxy.get(t, "/ok"); resp.StatusCode != 200 {
						t.Fatalf("status %d", resp.StatusCode)
					}
				}
				proxy.get(t, bad)
				e.clk.Advance(time.Second)
			}
			proxy.get(t, "/ok")
			if got := e.gate.AdaptiveRates()[0].Rate; got <= start {
				t.Fatalf("rate %v after 3 intervals with one %s in 20: the minority drove it down (start %v)", got, bad, start)
			}
		})
	}
}

// Attack: whoever can write to the shared store (or an older sluice with
// other bounds) puts a rate there that the rule does not allow. A process
// adopts the shared rate only within its own min and max, and a value
// that is not a rate is written over.
func TestAttackSharedRateOutOfBounds(t *testing.T) {
	addr := redistest.Server(t)
	clk := sluice.NewManualClock(sluiceEpoch)
	st, err := redis.Open("redis://"+addr+"/0", redis.Options{Clock: clk, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	for _, v := range []string{"1e300 0 0", "0.0001 0 0", "not a rate"} {
		t.Run(v, func(t *testing.T) {
			if err := st.Client().Do(ctx, st.Client().B().Set().Key("adaptive:upstream").Value(v).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			g := httpgate.New(mustPolicy(t, adaptivePolicy), sluice.NewWithOptions(st, sluice.Options{Clock: clk}), httpgate.Options{Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
			srv := serve(t, g.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
			srv.get(t, "/")
			got := g.AdaptiveRates()[0]
			if got.Rate < got.Min || got.Rate > got.Max {
				t.Fatalf("rate %v outside [%v, %v]", got.Rate, got.Min, got.Max)
			}
			// At most the burst of the largest rate passes at once.
			passed := 0
			for range 100 {
				if srv.get(t, "/").StatusCode == 200 {
					passed++
				}
			}
			if passed > 20 {
				t.Fatalf("%d passed at once: more than a second of max", passed)
			}
		})
	}
}

// globalAdaptive is an adaptive limit that every client shares (no
// limit_keys): each response is evidence of the client's identity, here
// its address behind a trusted proxy.
const globalAdaptive = `trusted_proxies: ["127.0.0.1/32"]
rules:
  - name: global
    limit_keys: []
    algorithm_config:
      rps: 1000
      burst_seconds: 1
      adaptive:
        min: 100
        max: 2000
        interval: 1s
`

// Attack: one host holds a whole IPv6 /64 and speaks from a fresh address
// for each request the upstream fails (its own bad input). Were each
// address a key of its own, its many unhealthy keys would outnumber the
// other clients' healthy ones and halve the rate every client shares; as
// ip:address keys do, its addresses count as one client, by ipv6_prefix.
func TestAttackAdaptiveIPv6AddressesMintKeys(t *testing.T) {
	e := newEnv(t, globalAdaptive)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if strings.Contains(r.Header.Get("X-Forwarded-For"), "2001:db8:bad:") {
			http.Error(w, "bad input", http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(up.Close)
	proxy := proxyOf(t, e.gate, up.URL)
	start := e.gate.AdaptiveRates()[0].Rate
	for interval := range 4 {
		for i := range 3 {
			if st, _ := call(t, proxy, "/", "", "X-Forwarded-For", fmt.Sprintf("2001:db8:%d::1", i+1)); st != 200 {
				t.Fatalf("interval %d: victim %d: %d", interval, i+1, st)
			}
		}
		for i := range 16 {
			call(t, proxy, "/", "", "X-Forwarded-For", fmt.Sprintf("2001:db8:bad:0:%x::1", i+1))
		}
		if r := e.gate.AdaptiveRates()[0].Rate; r < start {
			t.Fatalf("interval %d: the shared rate fell from %v to %v on the addresses of one /64", interval, start, r)
		}
		e.clk.Advance(time.Second)
	}
}

// hangUpMidUpload sends a POST to addr as client, with a Content-Length
// of 100 and 3 bytes of it, and hangs up once the upstream has started
// reading it (reading).
func hangUpMidUpload(t *testing.T, addr, client string, reading <-chan struct{}) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nX-Client: %s\r\nContent-Length: 100\r\n\r\nabc", client)
	select {
	case <-reading:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream never saw the request")
	}
	conn.Close()
}

// Attack: lower the rule's rate, every client's, with requests the
// upstream never fails. A client that hangs up in the middle of its
// request body made the transport fail reading it, an unexpected EOF
// that the proxy answered as a 502 "upstream unreachable", and the
// adaptive rate counted it as the upstream's failure: two keys doing so
// each interval halved the rate of the rule (10, 5, 7, 3.5 ...) while the
// upstream answered everyone else at once. A body the client failed to
// send is the client's: not counted, not logged as the upstream's.
func TestAttackAdaptiveUploadHangUpIsNotUpstreamFailure(t *testing.T) {
	logs := &lockedbuf.Buffer{}
	e := newEnvOpts(t, mustPolicy(t, perClientAdaptive), nil, func(_ *env, o *httpgate.Options) { o.Logger = newTextLogger(logs) })
	reading := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.Header.Get("X-Client"), "attacker") {
			reading <- struct{}{}
		}
		io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(up.Close)
	proxy := proxyOf(t, e.gate, up.URL)
	for interval := range 4 {
		for _, c := range []string{"attacker-1", "attacker-2"} {
			hangUpMidUpload(t, proxy.Listener.Addr().String(), c, reading)
			<-proxy.done
		}
		if st, _ := call(t, proxy, "/", "", "X-Client", "victim"); st != 200 {
			t.Fatalf("interval %d: victim: %d", interval, st)
		}
		if r := e.gate.AdaptiveRates()[0].Rate; r < 10 {
			t.Fatalf("interval %d: the rule's rate fell to %v on clients hanging up mid-upload\n%s", interval, r, logs.String())
		}
		e.clk.Advance(time.Second)
	}
	if l := logs.String(); strings.Contains(l, "upstream unreachable") || strings.Contains(l, "upstream timed out") {
		t.Errorf("the log blames the upstream for the clients' hang-ups:\n%s", l)
	}
}

// Attack: lower the rule's rate, every client's, without even hanging up:
// a chunked body that is not HTTP made the transport fail reading it, a
// 502 "upstream unreachable" counted against the upstream. It is the
// client's: a 400, not counted, not logged as the upstream's.
func TestAttackAdaptiveBrokenChunkedBodyIsNotUpstreamFailure(t *testing.T) {
	logs := &lockedbuf.Buffer{}
	e := newEnvOpts(t, mustPolicy(t, perClientAdaptive), nil, func(_ *env, o *httpgate.Options) { o.Logger = newTextLogger(logs) })
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(up.Close)
	proxy := proxyOf(t, e.gate, up.URL)
	addr := proxy.Listener.Addr().String()
	for interval := range 3 {
		for _, c := range []string{"broken-1", "broken-2"} {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nX-Client: %s\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\n", c)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			conn.Close()
			<-proxy.done
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("%s: %d, want 400", c, resp.StatusCode)
			}
		}
		if st, _ := call(t, proxy, "/", "", "X-Client", "victim"); st != 200 {
			t.Fatalf("interval %d: victim: %d", interval, st)
		}
		if r := e.gate.AdaptiveRates()[0].Rate; r < 10 {
			t.Fatalf("interval %d: the rule's rate fell to %v on broken bodies", interval, r)
		}
		e.clk.Advance(time.Second)
	}
	if l := logs.String(); strings.Contains(l, "upstream unreachable") {
		t.Errorf("the log blames the upstream for the clients' broken bodies:\n%s", l)
	}
}

// Attack: lower the rule's rate through the Go middleware by hanging up
// mid-upload to a handler that answers a body it could not read with a
// 500 (as many do): the 500 was counted as the handler's failure. A body
// the client failed to send says nothing of the handler.
func TestAttackAdaptiveMiddlewareUploadHangUp(t *testing.T) {
	e := newEnv(t, perClientAdaptive)
	reading := make(chan struct{}, 1)
	srv := serve(t, e.gate.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.Header.Get("X-Client"), "attacker") {
			reading <- struct{}{}
		}
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})))
	for interval := range 4 {
		for _, c := range []string{"attacker-1", "attacker-2"} {
			hangUpMidUpload(t, srv.Listener.Addr().String(), c, reading)
			<-srv.done
		}
		if st, _ := call(t, srv, "/", "", "X-Client", "victim"); st != 200 {
			t.Fatalf("interval %d: victim: %d", interval, st)
		}
		if r := e.gate.AdaptiveRates()[0].Rate; r < 10 {
			t.Fatalf("interval %d: the rule's rate fell to %v on clients hanging up mid-upload", interval, r)
		}
		e.clk.Advance(time.Second)
	}
}

// A client that hangs up while the upstream's answer is being copied to
// it is not counted against the upstream: the proxy aborts the response
// (http.ErrAbortHandler) and nothing is measured.
func TestAdaptiveResponseHangUpIsNotUpstreamFailure(t *testing.T) {
	e := newEnv(t, perClientAdaptive)
	sent := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.Header.Get("X-Client"), "leaver") {
			fmt.Fprint(w, "ok")
			return
		}
		w.Write([]byte("first"))
		w.(http.Flusher).Flush()
		sent <- struct{}{}
		<-r.Context().Done() // the proxy gives up on the rest once its client has gone
	}))
	t.Cleanup(up.Close)
	proxy := proxyOf(t, e.gate, up.URL)
	addr := proxy.Listener.Addr().String()
	for interval := range 3 {
		for _, c := range []string{"leaver-1", "leaver-2"} {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: x\r\nX-Client: %s\r\n\r\n", c)
			if _, err := http.ReadResponse(bufio.NewReader(conn), nil); err != nil {
				t.Fatal(err)
			}
			<-sent
			conn.Close()
			<-proxy.done
		}
		if st, _ := call(t, proxy, "/", "", "X-Client", "victim"); st != 200 {
			t.Fatalf("interval %d: victim: %d", interval, st)
		}
		if r := e.gate.AdaptiveRates()[0].Rate; r < 10 {
			t.Fatalf("interval %d: the rule's rate fell to %v on clients hanging up mid-response", interval, r)
		}
		e.clk.Advance(time.Second)
	}
}
