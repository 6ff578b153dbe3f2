package httpgate_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/policy"
)

// holding is a gate whose Delay holds each request until the test lets
// it go (or its client gives up), on a manual clock: a queue the test
// can fill.
type holding struct {
	clk     *sluice.ManualClock
	gate    *httpgate.Gate
	m       *metrics.Metrics
	srv     *httptest.Server
	entered chan time.Duration
	release chan struct{}
}

func newHolding(t *testing.T, yaml string) *holding {
	t.Helper()
	h := &holding{clk: sluice.NewManualClock(sluiceEpoch), m: metrics.New(prometheus.NewRegistry()), entered: make(chan time.Duration, 64), release: make(chan struct{})}
	m := h.m
	lim := sluice.NewWithOptions(m.InstrumentStore(memory.New(memory.Options{Clock: h.clk})), sluice.Options{Clock: h.clk})
	h.gate = httpgate.New(mustPolicy(t, yaml), lim, httpgate.Options{
		Metrics: m,
		Logger:  slog.New(slog.NewTextHandler(t.Output(), nil)),
		Delay: func(ctx context.Context, d time.Duration) error {
			h.entered <- d
			select {
			case <-h.release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	})
	h.srv = httptest.NewServer(h.gate.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	})))
	t.Cleanup(h.srv.Close)
	t.Cleanup(func() {
		select {
		case <-h.release:
		default:
			close(h.release)
		}
	})
	return h
}

// send sends a request in the background and returns its answer's
// channel.
func (h *holding) send(ctx context.Context) chan *http.Response {
	out := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "GET", h.srv.URL+"/", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- nil
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		out <- resp
	}()
	return out
}

func (h *holding) metric(t *testing.T, name string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return grep(rec.Body.String(), name)
}

// wait takes the next wait the gate was asked to hold for.
func (h *holding) wait(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-h.entered:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no request reached its wait")
		return 0
	}
}

const shapedPolicy = `rules:
  - name: shaped
    algorithm: leaky_bucket
    algorithm_config:
      rps: 10
      max_delay: 10s
      max_queued: 3
`

// N+1 requests into a queue of max_queued N: the one beyond is refused at
// once (429 queue_full with a Retry-After), is charged nothing (the next
// request's turn is the one it would have had), and the queue is seen in
// sluice_queued.
func TestQueueFull(t *testing.T) {
	h := newHolding(t, shapedPolicy)
	first := <-h.send(context.Background()) // the bucket's one request: no wait
	if first == nil || first.StatusCode != 200 {
		t.Fatalf("first: %v", first)
	}
	var held []chan *http.Response
	for i := range 3 {
		held = append(held, h.send(context.Background()))
		if d := h.wait(t); d != time.Duration(i+1)*100*time.Millisecond {
			t.Fatalf("held request %d waits %v", i, d)
		}
	}
	if got := h.metric(t, "sluice_queued{"); !strings.Contains(got, `sluice_queued{rule="shaped"} 3`) {
		t.Fatalf("sluice_queued: %q", got)
	}
	resp := <-h.send(context.Background())
	if resp == nil || resp.StatusCode != 429 || resp.Header.Get("X-Sluice-Reason") != "queue_full" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("beyond max_queued: %+v", resp)
	}
	close(h.release)
	for _, c := range held {
		if r := <-c; r == nil || r.StatusCode != 200 {
			t.Fatalf("a held request: %+v", r)
		}
	}
	if got := h.metric(t, "sluice_queued{"); !strings.Contains(got, `sluice_queued{rule="shaped"} 0`) {
		t.Fatalf("sluice_queued after: %q", got)
	}
	// The refused request took no turn: the next one's is 400ms, right
	// after the three held ones'.
	h.release = make(chan struct{})
	next := h.send(context.Background())
	if d := h.wait(t); d != 400*time.Millisecond {
		t.Fatalf("next turn %v, want 400ms: the refused request was charged", d)
	}
	close(h.release)
	<-next
	if got := h.metric(t, "sluice_queue_delay_seconds_count"); !strings.Contains(got, `sluice_queue_delay_seconds_count{rule="shaped"} 5`) {
		t.Fatalf("queue delay histogram: %q", got)
	}
}

// A wait beyond max_queue_delay is refused at once with its Retry-After
// (429 queue_delay_exceeded), charging nothing.
func TestQueueDelayExceeded(t *testing.T) {
	e := newEnv(t, `rules:
  - name: paced
    algorithm_config:
      rate: 10
      capacity: 0
      reserve: true
      max_queue_delay: 250ms
`)
	srv := httptest.NewServer(e.gate.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	t.Cleanup(srv.Close)
	for i := range 2 {
		if resp := fetch(t, srv.URL); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	if w := e.waits(); len(w) != 2 || w[0] != 100*time.Millisecond || w[1] != 200*time.Millisecond {
		t.Fatalf("waits %v", w)
	}
	req, _ := http.NewRequest("GET", srv.URL, nil)
	resp, body := e.do(req)
	if resp.StatusCode != 429 || resp.Header.Get("X-Sluice-Reason") != "queue_delay_exceeded" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a turn 300ms away: %d %q Retry-After %q", resp.StatusCode, resp.Header.Get("X-Sluice-Reason"), resp.Header.Get("Retry-After"))
	}
	if body["reason"] != "queue_delay_exceeded" || body["status"] != float64(429) {
		b, _ := json.Marshal(body)
		t.Fatalf("problem %s", b)
	}
	// Nothing was charged: 100ms later one token has come back, and the
	// next turn is 200ms away again.
	e.clk.Advance(100 * time.Millisecond)
	if resp := fetch(t, srv.URL); resp.StatusCode != 200 {
		t.Fatalf("after 100ms: %d", resp.StatusCode)
	}
	if w := e.waits(); len(w) != 3 || w[2] != 200*time.Millisecond {
		t.Fatalf("waits %v: the refused request was charged", w)
	}
}

// A client that gives up while held gives its place up: the queue does
// not stay full of requests nobody waits for.
func TestQueuePlaceFreedWhenClientLeaves(t *testing.T) {
	h := newHolding(t, strings.Replace(shapedPolicy, "max_queued: 3", "max_queued: 1", 1))
	<-h.send(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	gone := h.send(ctx)
	h.wait(t)
	cancel()
	<-gone
	// The place is free once the handler has returned; the next request
	// may race it, so ask until it is held rather than refused.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := h.send(context.Background())
		select {
		case d := <-h.entered:
			if d <= 0 {
				t.Fatalf("wait %v", d)
			}
			close(h.release)
			<-c
			return
		case r := <-c:
			if r == nil || r.Header.Get("X-Sluice-Reason") != "queue_full" || time.Now().After(deadline) {
				t.Fatalf("after the client left: %+v", r)
			}
		}
	}
}

// reservePolicy is attack 3's rule: every request of a host reserves its
// turn, and the file sets no max_reserved.
const reservePolicy = `rules:
  - name: per-host
    limit_keys: ["host"]
    algorithm_config: {rps: 10, burst: 10, reserve: true}
`

// A client that opens a request through the proxy to a reserving rule
// and leaves before its turn, again and again, must not run its bucket
// into debt for every other client of it: each abandoned turn is given
// back, so each next one is the same 100ms away (on b1b6bb6 the turns
// grew 100ms, 200ms, ... without bound), the abandoned requests never
// reach the upstream, and a client that comes after finds its bucket as
// the attacker found it.
func TestAttackReserveAbandonedTurnsRefunded(t *testing.T) {
	up := newUpstream(t)
	entered := make(chan time.Duration, 1)
	e := newEnvOpts(t, mustPolicy(t, reservePolicy), nil, func(_ *env, o *httpgate.Options) {
		// The turn never comes on the manual clock: the client leaves.
		o.Delay = func(ctx context.Context, d time.Duration) error {
			entered <- d
			<-ctx.Done()
			return ctx.Err()
		}
	})
	upURL, _ := url.Parse(up.URL)
	proxied := e.gate.Proxy(upURL, httpgate.ProxyOptions{})
	done := make(chan struct{}, 1)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxied.ServeHTTP(w, r)
		done <- struct{}{} // the refund, if any, is made
	}))
	t.Cleanup(proxy.Close)
	send := func(ctx context.Context) chan *http.Response {
		out := make(chan *http.Response, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", proxy.URL+"/", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				out <- nil
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			out <- resp
		}()
		return out
	}
	for i := range 10 { // the burst: no turn to wait for
		if r := <-send(context.Background()); r == nil || r.StatusCode != 200 {
			t.Fatalf("request %d of the burst: %+v", i, r)
		}
		<-done
	}
	for i := range 30 {
		ctx, cancel := context.WithCancel(context.Background())
		c := send(ctx)
		select {
		case d := <-entered:
			if d != 100*time.Millisecond {
				cancel()
				t.Fatalf("abandoned request %d waits %v, want 100ms: the turns of the clients before it were kept", i, d)
			}
		case r := <-c:
			cancel()
			t.Fatalf("abandoned request %d answered %+v before its turn", i, r)
		}
		cancel()
		<-c
		<-done
	}
	if n := up.hits.Load(); n != 10 {
		t.Fatalf("upstream saw %d requests, want the burst's 10", n)
	}
	// 100ms on, one token has come: the next client is served at once.
	e.clk.Advance(100 * time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := send(ctx)
	select {
	case d := <-entered:
		cancel()
		t.Fatalf("a client after the attack waits %v for the turns of requests nobody waits for", d)
	case r := <-c:
		if r == nil || r.StatusCode != 200 {
			t.Fatalf("a client after the attack: %+v", r)
		}
	}
}

// The decision API cannot know whether its caller waits for a turn it
// answers, so there the debt is what bounds the attack: a served rule
// that reserves without max_reserved owes at most its capacity (on
// b1b6bb6 every reservation was admitted, 50 of them leaving the bucket
// at -40 and a turn 4s away, growing with each call).
func TestAttackReserveDebtBoundedOnDecisionAPI(t *testing.T) {
	e := newEnv(t, reservePolicy)
	admitted := 0
	for i := range 50 {
		resp, body := e.post("/v1/take", `{"rule":"per-host","key":"victim.example","reserve":true}`)
		if resp.StatusCode != 200 && resp.StatusCode != 429 {
			t.Fatalf("take %d: %d %v", i, resp.StatusCode, body)
		}
		if body["allowed"] == true {
			admitted++
		}
		if tok, _ := body["tokens"].(float64); tok < -10 {
			t.Fatalf("take %d: the bucket owes %v tokens, beyond its capacity (10)", i, -tok)
		}
		if ms, _ := body["retry_after_ms"].(float64); ms > 2000 {
			t.Fatalf("take %d: retry_after_ms %v: a lockout beyond what capacity and debt (20 tokens at 10/s) take to refill", i, ms)
		}
	}
	if admitted != 20 {
		t.Fatalf("admitted %d, want 20: the burst of 10 and 10 turns of debt", admitted)
	}
}

// A client keeping max_queued of its own requests waiting (each one its
// own bucket allows) must not fill the queue its limit's other keys share:
// it holds at most half of it (its share, with room for one more key),
// and another client's 4 back-to-back requests are all admitted (on
// b1b6bb6 the first client held all 20 places and the other got 1 of 4,
// three refused queue_full).
func TestAttackQueueHogLeavesOtherKeysPlaces(t *testing.T) {
	h := newHolding(t, `rules:
  - name: shaped
    limit_keys: ["header:x-client"]
    algorithm: leaky_bucket
    algorithm_config:
      rps: 10
      max_delay: 10s
      max_queued: 20
`)
	var held []chan *http.Response
	// send sends one request of client and reports whether it is held
	// for its turn; one answered at once must be admitted or queue_full.
	send := func(client string) (bool, *http.Response) {
		out := make(chan *http.Response, 1)
		go func() {
			req, _ := http.NewRequest("GET", h.srv.URL+"/", nil)
			req.Header.Set("X-Client", client)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				out <- nil
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			out <- resp
		}()
		select {
		case <-h.entered:
			held = append(held, out)
			return true, nil
		case r := <-out:
			if r == nil || (r.StatusCode != 200 && r.Header.Get("X-Sluice-Reason") != "queue_full") {
				t.Fatalf("%s: %+v", client, r)
			}
			return false, r
		case <-time.After(10 * time.Second):
			t.Fatal("no answer, and not held")
			return false, nil
		}
	}
	hogHeld := 0
	for range 21 { // the bucket's one request, then 20 to wait
		if ok, _ := send("hog"); ok {
			hogHeld++
		}
	}
	for i := range 4 {
		ok, r := send("victim")
		if !ok && r.StatusCode != 200 {
			t.Fatalf("the other client's request %d: %d %s", i, r.StatusCode, r.Header.Get("X-Sluice-Reason"))
		}
	}
	if hogHeld > 10 {
		t.Errorf("one client holds %d of the queue's 20 places", hogHeld)
	}
	close(h.release)
	for _, c := range held {
		if r := <-c; r == nil || r.StatusCode != 200 {
			t.Fatalf("a held request: %+v", r)
		}
	}
}

// Attack: a queue of held requests makes every request wait; if that wait
// counted as the upstream's latency, shaping itself would read as a slow
// upstream and collapse the rate (and a client could lengthen the queue
// on purpose to that end). The latency is measured from when the request
// leaves the queue.
func TestAttackQueueWaitIsNotUpstreamLatency(t *testing.T) {
	clk := sluice.NewManualClock(sluiceEpoch)
	m := metrics.New(prometheus.NewRegistry())
	lim := sluice.NewWithOptions(m.InstrumentStore(memory.New(memory.Options{Clock: clk})), sluice.Options{Clock: clk})
	g := httpgate.New(mustPolicy(t, `rules:
  - name: paced
    algorithm: leaky_bucket
    algorithm_config:
      rps: 10
      max_delay: 10s
      adaptive: {min: 1, max: 20, target_latency: 20ms, error_ratio: 0}
`), lim, httpgate.Options{
		Metrics: m,
		Logger:  slog.New(slog.NewTextHandler(t.Output(), nil)),
		// Each held request waits its turn on the test's clock.
		Delay: func(_ context.Context, d time.Duration) error { clk.Advance(d); return nil },
	})
	srv := serve(t, g.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	// Every request but the first waits its turn: 1/rate, at least 50ms,
	// more than twice the target.
	for range 5 {
		for range 20 {
			if resp := srv.get(t, "/"); resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
		}
	}
	if got := g.AdaptiveRates()[0].Rate; got < 10 {
		t.Fatalf("rate %v: the queue's own wait was taken for a slow upstream", got)
	}
}

// Attack: a flood of concurrent requests into a shaping rule holds one
// goroutine and one connection each for as long as its turn is away. At
// most max_queued are held; every other is refused at once, charged
// nothing, however they race for the last places.
func TestAttackQueueFlood(t *testing.T) {
	h := newHolding(t, strings.Replace(shapedPolicy, "max_queued: 3", "max_queued: 4", 1))
	<-h.send(context.Background()) // the bucket's one request: no wait
	const flood = 24
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	done := make(chan struct{})
	for range flood {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := <-h.send(context.Background())
			mu.Lock()
			defer mu.Unlock()
			if r == nil {
				codes[0]++
				return
			}
			codes[r.StatusCode]++
			if r.StatusCode == 429 && r.Header.Get("X-Sluice-Reason") != "queue_full" {
				codes[-1]++
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	// Exactly four reach their wait; the twenty others are refused
	// without waiting for the held ones.
	var waits []time.Duration
	for range 4 {
		waits = append(waits, h.wait(t))
	}
	for {
		mu.Lock()
		refused := codes[429]
		mu.Unlock()
		if refused == flood-4 {
			break
		}
		select {
		case d := <-h.entered:
			t.Fatalf("a fifth request was held (%v)", d)
		case <-time.After(10 * time.Millisecond): // the refusals are on their way
		}
	}
	close(h.release)
	<-done
	if codes[200] != 4 || codes[429] != flood-4 || codes[-1] != 0 || codes[0] != 0 {
		t.Fatalf("answers %v", codes)
	}
	// The refused took no turns: the held got 100..400ms, and the next
	// request's turn is the fifth.
	h.release = make(chan struct{})
	c := h.send(context.Background())
	if d := h.wait(t); d != 500*time.Millisecond {
		t.Fatalf("next turn %v, want 500ms (held: %v)", d, waits)
	}
	close(h.release)
	<-c
}

// windowAndTurnPolicy counts each client in windows of a minute, and
// spaces its requests to /slow a minute apart.
const windowAndTurnPolicy = `rules:
  - name: per-minute
    limit_keys: ["header:x-client"]
    algorithm: fixed_window
    algorithm_config: {rate: 1, period: 1m, start: 0s}
  - name: slow
    match: {path: /slow}
    limit_keys: ["header:x-client"]
    algorithm: leaky_bucket
    algorithm_config: {rate: 1, period: 1m, max_delay: 5m}
`

// A client that leaves before its turn is given back what its request
// was charged, but a refund lands in the window of the moment it is
// made: a request charged in one minute's window and abandoned in the
// next gave that next window a request more than its limit. Only the
// turn it leaves is given back; the limits it merely took from keep it,
// as for a request that was served.
func TestAttackAbandonedTurnRefundsLaterWindow(t *testing.T) {
	h := newHolding(t, windowAndTurnPolicy)
	get := func(ctx context.Context, path string) chan *http.Response {
		out := make(chan *http.Response, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", h.srv.URL+path, nil)
			req.Header.Set("X-Client", "a")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				out <- nil
				return
			}
			resp.Body.Close()
			out <- resp
		}()
		return out
	}
	in := &policy.Input{Method: "GET", Path: "/slow", Header: http.Header{"X-Client": {"a"}}, ClientIP: netip.MustParseAddr("192.0.2.1")}
	ms, err := h.gate.Policy().Match(in)
	if err != nil {
		t.Fatal(err)
	}
	var turn sluice.Request
	for _, m := range ms {
		if m.Request.Limit.Name() == "slow" {
			turn = m.Request
		}
	}
	for range 2 { // a's earlier requests to /slow: its next turn is minutes away
		if _, err := h.gate.Limiter().Take(context.Background(), turn); err != nil {
			t.Fatal(err)
		}
	}
	owed := func() time.Duration {
		d, err := h.gate.Limiter().Peek(context.Background(), turn)
		if err != nil {
			t.Fatal(err)
		}
		return d.RetryAfter
	}
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	abandoned := get(ctx, "/slow") // this minute's one request, held for its turn
	if d := h.wait(t); d < time.Minute {
		t.Fatalf("the held request waits %v", d)
	}
	next := h.clk.Now().Truncate(time.Minute).Add(time.Minute + time.Second)
	h.clk.Set(next)
	if r := <-get(context.Background(), "/other"); r == nil || r.StatusCode != 200 {
		t.Fatalf("the next minute's one request: %+v", r)
	}
	before := owed()
	leave()
	<-abandoned
	for deadline := time.Now().Add(10 * time.Second); owed() >= before; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the abandoned turn was not given back")
		}
	}
	if r := <-get(context.Background(), "/other"); r == nil || r.StatusCode != 429 {
		t.Fatalf("a second request in a minute of one: %+v, want 429", r)
	}
}
