package httpgate_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/policy"
)

// inflightPolicy allows 3 requests per API key in flight, on leases of
// 30s.
const inflightPolicy = `
rules:
  - name: inflight
    algorithm: concurrency
    limit_keys: ["header:x-api-key"]
    algorithm_config: {max_in_flight: 3, lease: 30s}
`

// holdingUpstream answers /hold only when the test closes release (or the
// request ends), counting the requests in it.
type holdingUpstream struct {
	*httptest.Server
	in      atomic.Int64
	arrived chan struct{} // one send per request that reached /hold
	release chan struct{}
}

func newHoldingUpstream(t *testing.T) *holdingUpstream {
	u := &holdingUpstream{arrived: make(chan struct{}, 64), release: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.in.Add(1)
		defer u.in.Add(-1)
		u.arrived <- struct{}{}
		select {
		case <-u.release:
			io.WriteString(w, "done")
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(u.Close)
	return u
}

// proxyTo serves e's gate as a reverse proxy to up.
func (e *env) proxyTo(up string, opts httpgate.ProxyOptions) *httptest.Server {
	e.t.Helper()
	u, err := url.Parse(up)
	if err != nil {
		e.t.Fatal(err)
	}
	srv := httptest.NewServer(e.gate.Proxy(u, opts))
	e.t.Cleanup(srv.Close)
	return srv
}

// slotsFree reports the free slots of key under the concurrency rule of
// e, as a peek sees them (the slots a take would leave, plus its own).
func (e *env) slotsFree(rule, key string) int64 {
	e.t.Helper()
	lim := e.gate.Policy().Limit(rule)
	d, err := e.gate.Limiter().Peek(context.Background(), sluice.Request{Limit: lim, Key: key})
	if err != nil {
		e.t.Fatal(err)
	}
	if !d.Allowed {
		return 0
	}
	return d.Remaining + 1
}

// waitFree waits until key has want free slots: a handler releases its
// slots after its response has gone out, so a client may see the answer
// a moment before the slot is free. The wait is for that goroutine, not
// for time to pass: it ends as soon as the slot is free.
func (e *env) waitFree(rule, key string, want int64) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.slotsFree(rule, key) != want {
		if time.Now().After(deadline) {
			e.t.Fatalf("%s/%s: %d slots free 10s after every request ended, want %d", rule, key, e.slotsFree(rule, key), want)
		}
		time.Sleep(time.Millisecond)
	}
}

func getWith(t *testing.T, ctx context.Context, u, key string) (*http.Response, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Api-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b), nil
}

// N+1 requests at once through the real proxy, each held by the upstream
// until the test lets go: exactly N reach it and one is refused with a 429
// (concurrency_exceeded); once they end, every slot is free again.
func TestProxyConcurrencyLimit(t *testing.T) {
	up := newHoldingUpstream(t)
	e := newEnv(t, inflightPolicy)
	proxy := e.proxyTo(up.URL, httpgate.ProxyOptions{})

	const n = 3
	type result struct {
		status int
		reason string
		retry  string
	}
	results := make(chan result, n+1)
	for range n + 1 {
		go func() {
			resp, _, err := getWith(t, context.Background(), proxy.URL+"/hold", "k1")
			if err != nil {
				results <- result{status: -1, reason: err.Error()}
				return
			}
			results <- result{resp.StatusCode, resp.Header.Get("X-Sluice-Reason"), resp.Header.Get("Retry-After")}
		}()
	}
	// The admitted ones wait in the upstream; the one refused answers.
	rejected := <-results
	if rejected.status != 429 || rejected.reason != "concurrency_exceeded" || rejected.retry == "" {
		t.Fatalf("the request beyond max_in_flight: %+v, want 429 concurrency_exceeded with Retry-After", rejected)
	}
	for range n {
		<-up.arrived
	}
	if got := up.in.Load(); got != n {
		t.Fatalf("%d requests in the upstream, want %d", got, n)
	}
	// Another key has slots of its own.
	if e.slotsFree("inflight", "k2") != n {
		t.Fatal("another key's slots are taken")
	}
	close(up.release)
	for range n {
		if r := <-results; r.status != 200 {
			t.Fatalf("an admitted request: %+v, want 200", r)
		}
	}
	e.waitFree("inflight", "k1", n)
	// All free: N more at once are admitted.
	results2 := make(chan int, n)
	for range n {
		go func() {
			resp, _, err := getWith(t, context.Background(), proxy.URL+"/hold", "k1")
			if err != nil {
				results2 <- -1
				return
			}
			results2 <- resp.StatusCode
		}()
	}
	for range n {
		if s := <-results2; s != 200 {
			t.Fatalf("after every slot was freed: %d, want 200", s)
		}
	}
}

// A holder that dies keeps its slot only until its lease ends: a lease
// taken through the decision API and never released blocks the proxy's
// requests of that key, and not a moment past its lease.
func TestKilledHolderSlotComesBack(t *testing.T) {
	e := newEnv(t, `
rules:
  - name: one
    algorithm: concurrency
    limit_keys: ["header:x-api-key"]
    algorithm_config: {max_in_flight: 1, lease: 30s}
`)
	up := newUpstream(t)
	proxy := e.proxyTo(up.URL, httpgate.ProxyOptions{})

	_, took := e.post("/v1/take", `{"rule":"one","key":"k1"}`)
	if took["allowed"] != true || len(fmt.Sprint(took["lease"])) != 32 || took["lease_ms"] != float64(30000) {
		t.Fatalf("take: %v; want allowed with a 32-digit lease of 30000ms", took)
	}
	// Its holder dies here: the lease is never released.
	resp, _, err := getWith(t, context.Background(), proxy.URL+"/x", "k1")
	if err != nil {
		t.Fatal(err)
	}
	// Retry-After is the lease's end, spread by up to half again per client.
	if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); resp.StatusCode != 429 || ra < 30 || ra > 45 {
		t.Fatalf("while the dead holder's lease runs: %d Retry-After %q, want 429 after 30 to 45", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	e.clk.Advance(30*time.Second - time.Microsecond)
	if resp, _, _ := getWith(t, context.Background(), proxy.URL+"/x", "k1"); resp.StatusCode != 429 {
		t.Fatalf("1us before the lease ends: %d, want 429", resp.StatusCode)
	}
	e.clk.Advance(time.Microsecond)
	resp, body, err := getWith(t, context.Background(), proxy.URL+"/x", "k1")
	if err != nil || resp.StatusCode != 200 || !strings.HasPrefix(body, "hello /x") {
		t.Fatalf("once the lease ended: %v %v %q, want 200 from the upstream", resp, err, body)
	}
	e.waitFree("one", "k1", 1)
	// The late release of the dead holder's lease frees nothing.
	_, rel := e.post("/v1/release", fmt.Sprintf(`{"rule":"one","key":"k1","lease":%q}`, took["lease"]))
	wantFields(t, rel, map[string]any{"released": false, "rule": "one", "limit": 1, "remaining": 1})
}

// However the request ends (the upstream fails, times out or the client
// goes away mid-stream, or the handler panics), its slot is freed.
func TestSlotFreedHoweverTheRequestEnds(t *testing.T) {
	const one = `
rules:
  - name: one
    algorithm: concurrency
    limit_keys: ["header:x-api-key"]
    algorithm_config: {max_in_flight: 1}
`
	t.Run("upstream_fails", func(t *testing.T) {
		e := newEnv(t, one)
		broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close() // no answer at all
			}
		}))
		t.Cleanup(broken.Close)
		proxy := e.proxyTo(broken.URL, httpgate.ProxyOptions{})
		for range 3 {
			resp, _, err := getWith(t, context.Background(), proxy.URL+"/x", "k")
			if err != nil || resp.StatusCode != 502 {
				t.Fatalf("%v %v, want 502", resp, err)
			}
			e.waitFree("one", "k", 1)
		}
	})
	t.Run("upstream_times_out", func(t *testing.T) {
		e := newEnv(t, one)
		up := newUpstream(t)
		proxy := e.proxyTo(up.URL, httpgate.ProxyOptions{ResponseHeaderTimeout: 50 * time.Millisecond})
		resp, _, err := getWith(t, context.Background(), proxy.URL+"/slow", "k")
		if err != nil || resp.StatusCode != 504 {
			t.Fatalf("%v %v, want 504", resp, err)
		}
		e.waitFree("one", "k", 1)
	})
	t.Run("client_goes_away", func(t *testing.T) {
		e := newEnv(t, one)
		up := newUpstream(t)
		proxy := e.proxyTo(up.URL, httpgate.ProxyOptions{})
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", proxy.URL+"/stream", nil)
		req.Header.Set("X-Api-Key", "k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len("data: one\n\n"))
		if _, err := io.ReadFull(resp.Body, buf); err != nil {
			t.Fatal(err)
		}
		if e.slotsFree("one", "k") != 0 {
			t.Fatal("the streaming request holds no slot")
		}
		cancel()
		resp.Body.Close()
		e.waitFree("one", "k", 1)
	})
	t.Run("handler_panics", func(t *testing.T) {
		e := newEnv(t, one)
		srv := httptest.NewUnstartedServer(e.gate.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			panic(http.ErrAbortHandler) // net/http recovers it without a log line
		})))
		srv.Start()
		t.Cleanup(srv.Close)
		for range 3 {
			if _, _, err := getWith(t, context.Background(), srv.URL+"/x", "k"); err == nil {
				t.Fatal("the panicking handler answered")
			}
			e.waitFree("one", "k", 1)
		}
	})
}

// A request that runs longer than its lease keeps its slot: the middleware
// renews the lease every half lease while the handler runs, on the
// limiter's clock. Only a holder that died loses its slot.
func TestLongRequestKeepsItsSlot(t *testing.T) {
	e := newEnv(t, `
rules:
  - name: one
    algorithm: concurrency
    limit_keys: ["header:x-api-key"]
    algorithm_config: {max_in_flight: 1, lease: 10s}
`)
	entered, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(e.gate.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/long" {
			close(entered)
			<-release
		}
		io.WriteString(w, "ok")
	})))
	t.Cleanup(srv.Close)
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	t.Cleanup(letGo) // before srv.Close, which waits for the handler
	done := make(chan int, 1)
	go func() {
		resp, _, err := getWith(t, context.Background(), srv.URL+"/long", "k")
		if err != nil {
			done <- -1
			return
		}
		done <- resp.StatusCode
	}()
	<-entered
	// Each half lease the renewal fires and arms its next timer: wait for
	// that timer before moving the clock again.
	for range 4 {
		waitTimers(t, e.clk, 1)
		e.clk.Advance(5 * time.Second)
		waitTimers(t, e.clk, 1)
	}
	// 20s in, twice the lease: still held.
	if resp, _, _ := getWith(t, context.Background(), srv.URL+"/short", "k"); resp.StatusCode != 429 {
		t.Fatalf("while the long request runs, 20s after it began on a 10s lease: %d, want 429", resp.StatusCode)
	}
	letGo()
	if s := <-done; s != 200 {
		t.Fatalf("the long request: %d", s)
	}
	e.waitFree("one", "k", 1)
	waitTimers(t, e.clk, 0) // the renewals stopped with the request
}

// waitTimers waits until clk has n timers pending (a renewal goroutine
// has armed its next timer, or stopped).
func waitTimers(t *testing.T, clk *sluice.ManualClock, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		got, changed := clk.PendingTimers()
		if got == n {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("%d timers pending after 10s, want %d", got, n)
		}
	}
}

// The decision API acquires a slot with a take, returning its lease, and
// frees it with /v1/release; a batch that is rejected holds no slot.
func TestDecisionAPISlots(t *testing.T) {
	e := newEnv(t, `
rules:
  - name: jobs
    algorithm: concurrency
    algorithm_config: {max_in_flight: 2, lease: 1m}
  - name: rate
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
`)
	_, a := e.post("/v1/take", `{"rule":"jobs","key":"acme"}`)
	wantFields(t, a, map[string]any{"allowed": true, "limit": 2, "remaining": 1, "rule": "jobs", "lease_ms": 60000, "reset_after_ms": 60000})
	_, b := e.post("/v1/take", `{"rule":"jobs","key":"acme"}`)
	wantFields(t, b, map[string]any{"allowed": true, "remaining": 0})
	if a["lease"] == b["lease"] {
		t.Fatal("two takes got one lease")
	}
	e.clk.Advance(time.Second)
	_, c := e.post("/v1/take", `{"rule":"jobs","key":"acme"}`)
	wantFields(t, c, map[string]any{"allowed": false, "reason": "concurrency_exceeded", "retry_after_ms": 59000, "remaining": 0})
	if _, ok := c["lease"]; ok {
		t.Fatalf("a rejected take returned a lease: %v", c)
	}
	_, p := e.post("/v1/peek", `{"rule":"jobs","key":"acme"}`)
	wantFields(t, p, map[string]any{"allowed": false, "reason": "concurrency_exceeded"})

	_, rel := e.post("/v1/release", fmt.Sprintf(`{"rule":"jobs","key":"acme","lease":%q}`, a["lease"]))
	wantFields(t, rel, map[string]any{"released": true, "rule": "jobs", "limit": 2, "remaining": 1, "reset_after_ms": 59000})
	_, rel = e.post("/v1/release", fmt.Sprintf(`{"rule":"jobs","key":"acme","lease":%q}`, a["lease"]))
	wantFields(t, rel, map[string]any{"released": false, "remaining": 1})

	// All-or-nothing: the rate rule takes its one token, then refuses, so
	// the batch holds no slot.
	e.post("/v1/take", `{"rule":"rate","key":"acme"}`)
	_, batch := e.post("/v1/take", `{"takes":[{"rule":"jobs","key":"acme"},{"rule":"rate","key":"acme"}]}`)
	wantFields(t, batch, map[string]any{"allowed": false, "reason": "token_bucket_exceeded"})
	takes := batch["takes"].([]any)
	if j := takes[0].(map[string]any); j["allowed"] != false || j["lease"] != nil || j["reason"] != "" {
		t.Fatalf("the slot of a rejected batch: %v; want not admitted, no lease, not the cause", j)
	}
	if got := e.slotsFree("jobs", "acme"); got != 1 {
		t.Fatalf("after a rejected batch %d slots are free, want 1", got)
	}
}

// A decision API caller whose work outlasts the lease keeps its slot with
// /v1/renew: the lease then ends a whole lease from the renewal. A lease
// that ended before its renewal is not renewed, and takes no slot even
// with one free: the caller takes a new one.
func TestDecisionAPIRenew(t *testing.T) {
	e := newEnv(t, `
rules:
  - name: jobs
    algorithm: concurrency
    algorithm_config: {max_in_flight: 1, lease: 1m}
`)
	renew := func(lease any) map[string]any {
		t.Helper()
		resp, m := e.post("/v1/renew", fmt.Sprintf(`{"rule":"jobs","key":"acme","lease":%q}`, lease))
		if resp.StatusCode != 200 || resp.Header.Get("Cache-Control") != "no-store" {
			t.Fatalf("renew: %d %v (Cache-Control %q)", resp.StatusCode, m, resp.Header.Get("Cache-Control"))
		}
		return m
	}
	_, a := e.post("/v1/take", `{"rule":"jobs","key":"acme"}`)
	wantFields(t, a, map[string]any{"allowed": true, "lease_ms": 60000})
	e.clk.Advance(50 * time.Second)
	wantFields(t, renew(a["lease"]), map[string]any{"renewed": true, "rule": "jobs", "lease_ms": 60000, "limit": 1, "remaining": 0, "reset_after_ms": 60000})
	// Past the end of the first lease, the renewed one still holds the slot.
	e.clk.Advance(30 * time.Second)
	_, b := e.post("/v1/take", `{"rule":"jobs","key":"acme"}`)
	wantFields(t, b, map[string]any{"allowed": false, "retry_after_ms": 30000})
	// Past the end of the renewed lease: too late to renew.
	e.clk.Advance(31 * time.Second)
	wantFields(t, renew(a["lease"]), map[string]any{"renewed": false, "remaining": 1, "reset_after_ms": 0})
	if got := e.slotsFree("jobs", "acme"); got != 1 {
		t.Fatalf("a late renewal left %d slots free, want 1", got)
	}
	_, b = e.post("/v1/take", `{"rule":"jobs","key":"acme"}`)
	wantFields(t, b, map[string]any{"allowed": true})
	// A released lease is not renewed either.
	e.post("/v1/release", fmt.Sprintf(`{"rule":"jobs","key":"acme","lease":%q}`, b["lease"]))
	wantFields(t, renew(b["lease"]), map[string]any{"renewed": false, "remaining": 1})
}

// Forward auth is asked before a request and never told when it ends: a
// request that a concurrency rule matches is refused there, closed, with
// a reason the operator can act on, and holds no slot.
func TestForwardAuthRefusesConcurrency(t *testing.T) {
	e := newEnv(t, inflightPolicy)
	for range 5 {
		resp, body := e.get("/v1/auth", "X-Api-Key", "k1")
		if resp.StatusCode != 500 || resp.Header.Get("X-Sluice-Reason") != "concurrency_unsupported" || resp.Header.Get("Retry-After") != "" {
			t.Fatalf("forward auth of a concurrency rule: %d %v %v; want 500 concurrency_unsupported without Retry-After", resp.StatusCode, resp.Header, body)
		}
		if d := fmt.Sprint(body["detail"]); !strings.Contains(d, `"inflight"`) || !strings.Contains(d, "reverse proxy") {
			t.Fatalf("detail %q does not say which rule or where it belongs", d)
		}
	}
	if got := e.slotsFree("inflight", "k1"); got != 3 {
		t.Fatalf("forward auth left %d of 3 slots free", got)
	}
}

// A shadow-mode concurrency rule never refuses; it holds a slot while the
// request runs so its count is what enforcing would see, and frees it.
func TestShadowConcurrency(t *testing.T) {
	e := newEnv(t, `
rules:
  - name: one
    mode: shadow
    algorithm: concurrency
    limit_keys: ["header:x-api-key"]
    algorithm_config: {max_in_flight: 1}
`)
	up := newHoldingUpstream(t)
	proxy := e.proxyTo(up.URL, httpgate.ProxyOptions{})
	var wg sync.WaitGroup
	statuses := make(chan int, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _, err := getWith(t, context.Background(), proxy.URL+"/hold", "k")
			if err != nil {
				statuses <- -1
				return
			}
			statuses <- resp.StatusCode
		}()
	}
	<-up.arrived
	<-up.arrived
	close(up.release)
	wg.Wait()
	for range 2 {
		if s := <-statuses; s != 200 {
			t.Fatalf("a shadow rule refused: %d", s)
		}
	}
	e.waitFree("one", "k", 1)
	if m := e.metrics(); !strings.Contains(m, `sluice_decisions_total{result="shadow_rejected",rule="one"} 1`) {
		t.Errorf("the second request is not counted as shadow_rejected:\n%s", grep(m, "sluice_decisions_total"))
	}
}

// twoSlotRules are two concurrency rules of one slot each, keyed by the
// decision API's key.
const twoSlotRules = `
api_token_env: ` + apiTokenEnv + `
rules:
  - name: jobs
    algorithm: concurrency
    algorithm_config: {max_in_flight: 1}
  - name: exports
    algorithm: concurrency
    algorithm_config: {max_in_flight: 1}
`

// takeLease takes a slot of rule under key through the decision API and
// returns its lease.
func takeLease(e *env, rule, key string, hdr ...string) string {
	e.t.Helper()
	_, m := e.post("/v1/take", fmt.Sprintf(`{"rule":%q,"key":%q}`, rule, key), hdr...)
	lease, _ := m["lease"].(string)
	if m["allowed"] != true || len(lease) != 32 {
		e.t.Fatalf("take %s/%s: %v; want allowed with a lease", rule, key, m)
	}
	return lease
}

// Attack: free another caller's slot by guessing its lease, or by
// replaying a lease of one's own under another key or another rule, so
// as to run more than max_in_flight at once. A lease is 128 random bits
// bound to its rule and key: none of these frees anything.
func TestAttackForgedLeaseFreesNothing(t *testing.T) {
	e := newClosedEnv(t, twoSlotRules)
	auth := []string{"Authorization", "Bearer " + apiToken}
	victim := takeLease(e, "jobs", "victim", auth...)
	mine := takeLease(e, "jobs", "attacker", auth...)
	other := takeLease(e, "exports", "victim", auth...)

	forged := []string{
		"00000000000000000000000000000000",
		"ffffffffffffffffffffffffffffffff",
		engine.NewLeaseID().String(),
		strings.ToUpper(mine),          // the attacker's own lease, another key
		other,                          // the victim's lease of another rule
		victim[:31] + flip(victim[31]), // one bit off the victim's
	}
	for _, lease := range forged {
		resp, m := e.post("/v1/release", fmt.Sprintf(`{"rule":"jobs","key":"victim","lease":%q}`, lease), auth...)
		if resp.StatusCode != 200 || m["released"] != false {
			t.Fatalf("release of victim's slot with lease %s: %d %v; want 200 released=false", lease, resp.StatusCode, m)
		}
	}
	if got := e.slotsFree("jobs", "victim"); got != 0 {
		t.Fatalf("forged releases freed the victim's slot (%d free)", got)
	}
	if got := e.slotsFree("exports", "victim"); got != 0 {
		t.Fatalf("a lease of jobs freed a slot of exports (%d free)", got)
	}
	// The real lease, and only it, frees the slot.
	_, m := e.post("/v1/release", fmt.Sprintf(`{"rule":"jobs","key":"victim","lease":%q}`, victim), auth...)
	wantFields(t, m, map[string]any{"released": true, "remaining": 1})
}

// A caller of /v1/take that has gone by the time its slot is acquired
// never reads the lease: the slot is released, not held for lease_ms.
func TestTakeOfGoneCallerHoldsNoSlot(t *testing.T) {
	e := newClosedEnv(t, twoSlotRules)
	gone, hangUp := context.WithCancel(context.Background())
	hangUp()
	req := httptest.NewRequestWithContext(gone, "POST", "/v1/take", strings.NewReader(`{"rule":"jobs","key":"k"}`))
	req.Header.Set("Authorization", "Bearer "+apiToken)
	e.gate.Handler().ServeHTTP(httptest.NewRecorder(), req)
	if got := e.slotsFree("jobs", "k"); got != 1 {
		t.Fatalf("a take whose caller had gone holds its slot (%d free)", got)
	}
}

func flip(c byte) string {
	if c == '0' {
		return "1"
	}
	return "0"
}

// Attack: choose one's own lease id at take time (to know, or to collide
// with, another caller's), or take less than a slot with a fractional
// cost, or reserve a slot for later. The take of a concurrency rule
// accepts none of these: the id is drawn by the server, and a take holds
// exactly one slot, now.
func TestAttackTakeCannotChooseLeaseOrWeight(t *testing.T) {
	e := newClosedEnv(t, twoSlotRules)
	auth := []string{"Authorization", "Bearer " + apiToken}
	for _, body := range []string{
		`{"rule":"jobs","key":"k","lease":"00000000000000000000000000000001"}`,
		`{"rule":"jobs","key":"k","cost":0.5}`,
		`{"rule":"jobs","key":"k","cost":0.000001}`,
		`{"rule":"jobs","key":"k","cost":2}`,
		`{"rule":"jobs","key":"k","reserve":true}`,
		`{"takes":[{"rule":"jobs","key":"k","cost":0.5}]}`,
	} {
		resp, m := e.post("/v1/take", body, auth...)
		if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("take %s: %d %v; want a 400 problem", body, resp.StatusCode, m)
		}
		wantNoInternals(t, fmt.Sprint(m["detail"]))
	}
	if got := e.slotsFree("jobs", "k"); got != 1 {
		t.Fatalf("refused takes held a slot (%d free)", got)
	}
}

// Attack: take a slot without /v1/take's lease, or keep another caller's
// slot past its lease, through /v1/renew: renew a lease id of one's own
// choosing (to hold a slot under an id one knows, or one another caller
// might send), one's own lease under another key or rule, or a guess at
// the victim's. A renewal acts only on a live lease the server drew for
// that rule and key: none of these holds or extends anything.
func TestAttackRenewAcquiresNothing(t *testing.T) {
	e := newClosedEnv(t, twoSlotRules)
	auth := []string{"Authorization", "Bearer " + apiToken}
	mine := takeLease(e, "jobs", "attacker", auth...)
	other := takeLease(e, "exports", "free", auth...)
	chosen := []string{
		"00000000000000000000000000000000",
		"00000000000000000000000000000001",
		"ffffffffffffffffffffffffffffffff",
		engine.NewLeaseID().String(),
		mine,  // the attacker's own lease, another key
		other, // a lease of another rule
	}
	for _, lease := range chosen {
		resp, m := e.post("/v1/renew", fmt.Sprintf(`{"rule":"jobs","key":"free","lease":%q}`, lease), auth...)
		if resp.StatusCode != 200 || m["renewed"] != false {
			t.Fatalf("renew of a free key's slot with lease %s: %d %v; want 200 renewed=false", lease, resp.StatusCode, m)
		}
	}
	if got := e.slotsFree("jobs", "free"); got != 1 {
		t.Fatalf("renewals of leases never taken under the key took a slot (%d free)", got)
	}
	// The victim's lease is not kept alive by forged renewals: it ends
	// when its own lease does.
	victim := takeLease(e, "jobs", "victim", auth...)
	for _, lease := range append(chosen, strings.ToUpper(mine), victim[:31]+flip(victim[31])) {
		e.clk.Advance(20 * e.gate.Policy().Limit("jobs").LeaseTerm() / 100)
		e.post("/v1/renew", fmt.Sprintf(`{"rule":"jobs","key":"victim","lease":%q}`, lease), auth...)
	}
	e.clk.Advance(e.gate.Policy().Limit("jobs").LeaseTerm())
	if got := e.slotsFree("jobs", "victim"); got != 1 {
		t.Fatalf("forged renewals kept the victim's slot past its lease (%d free)", got)
	}
}

// Attack: free slots without the API token (a caller outside the trusted
// services releasing every lease it can find). /v1/release needs the
// token that /v1/take needs.
func TestAttackReleaseNeedsToken(t *testing.T) {
	e := newClosedEnv(t, twoSlotRules)
	lease := takeLease(e, "jobs", "k", "Authorization", "Bearer "+apiToken)
	for _, hdr := range [][]string{nil, {"Authorization", "Bearer wrong"}, {"X-Sluice-Token", apiToken}} {
		for _, path := range []string{"/v1/release", "/v1/renew"} {
			resp, _ := e.post(path, fmt.Sprintf(`{"rule":"jobs","key":"k","lease":%q}`, lease), hdr...)
			if resp.StatusCode != 401 {
				t.Fatalf("%s with %v: %d, want 401", path, hdr, resp.StatusCode)
			}
		}
	}
	if got := e.slotsFree("jobs", "k"); got != 0 {
		t.Fatal("a release without the token freed the slot")
	}
}

// Attack: malformed releases (a lease that is no lease, a rule that holds
// no slots, a missing field) must be refused with a reason, never freeing
// a slot or showing the server's internals.
func TestAttackMalformedRelease(t *testing.T) {
	e := newClosedEnv(t, twoSlotRules+`
  - name: rate
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
`)
	auth := []string{"Authorization", "Bearer " + apiToken}
	takeLease(e, "jobs", "k", auth...)
	for _, body := range []string{
		`{"rule":"jobs","key":"k"}`,
		`{"rule":"jobs","key":"k","lease":""}`,
		`{"rule":"jobs","key":"k","lease":"xyz"}`,
		`{"rule":"jobs","key":"k","lease":"0000000000000000000000000000000g"}`,
		`{"rule":"jobs","key":"k","lease":"000000000000000000000000000000000"}`,
		`{"rule":"jobs","key":"k","lease":12}`,
		`{"rule":"jobs","lease":"00000000000000000000000000000000"}`,
		`{"rule":"rate","key":"k","lease":"00000000000000000000000000000000"}`,
		`{"rule":"nope","key":"k","lease":"00000000000000000000000000000000"}`,
		`{"rule":"jobs","key":"k","lease":"00000000000000000000000000000000","extra":1}`,
	} {
		for _, path := range []string{"/v1/release", "/v1/renew"} {
			resp, m := e.post(path, body, auth...)
			if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("%s %s: %d %v; want a 400 problem", path, body, resp.StatusCode, m)
			}
			wantNoInternals(t, fmt.Sprint(m["detail"]))
		}
	}
	if got := e.slotsFree("jobs", "k"); got != 0 {
		t.Fatal("a malformed release freed the slot")
	}
}

// Attack: hold every slot of a key by opening requests and dropping them
// (a client that connects, is admitted and vanishes, again and again). The
// proxy frees a slot as soon as its client goes away, so slots cannot be
// hoarded by abandoned requests.
func TestAttackAbandonedRequestsHoldNoSlot(t *testing.T) {
	e := newEnv(t, `
rules:
  - name: two
    algorithm: concurrency
    limit_keys: ["header:x-api-key"]
    algorithm_config: {max_in_flight: 2}
`)
	up := newHoldingUpstream(t)
	proxy := e.proxyTo(up.URL, httpgate.ProxyOptions{})
	for range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 2)
		for range 2 {
			go func() {
				_, _, err := getWith(t, ctx, proxy.URL+"/hold", "k")
				errc <- err
			}()
		}
		<-up.arrived
		<-up.arrived
		cancel() // both clients vanish
		<-errc
		<-errc
		e.waitFree("two", "k", 2)
	}
}

// Attack: pass a concurrency rule through forward auth, which would
// otherwise hand out slots it can never take back (or skip the rule):
// the request is refused, and nothing is held.
func TestAttackForwardAuthCannotBypassConcurrency(t *testing.T) {
	e := newEnv(t, `
rules:
  - name: one
    algorithm: concurrency
    algorithm_config: {max_in_flight: 1}
`)
	for _, path := range []string{"/v1/auth", "/v1/auth/anything"} {
		resp, _ := e.get(path)
		if resp.StatusCode == 200 {
			t.Fatalf("%s admitted a request that a concurrency rule matched", path)
		}
	}
	if got := e.slotsFree("one", "global"); got != 1 {
		t.Fatalf("forward auth held a slot (%d free)", got)
	}
}

// heldSlotPolicy holds one request at a time (on leases of a second) and
// spaces each API key's requests a second apart, holding them up to 10s.
const heldSlotPolicy = `
rules:
  - name: inflight
    algorithm: concurrency
    algorithm_config: {max_in_flight: 1, lease: 1s}
  - name: shaped
    algorithm: leaky_bucket
    limit_keys: ["header:x-api-key"]
    algorithm_config: {rps: 1, max_delay: 10s}
`

// A request admitted with its concurrency slot and a turn seconds ahead
// waits for the turn holding the slot's lease unrenewed: the lease ends
// during the wait, another client takes the "free" slot, and both then
// reach the upstream, two in flight under max_in_flight 1. The slot's
// lease must be kept while its request waits, as while it is served.
func TestAttackTurnOutlastsConcurrencyLease(t *testing.T) {
	up := newHoldingUpstream(t)
	held, resume := make(chan time.Duration, 1), make(chan struct{})
	e := newEnvOpts(t, mustPolicy(t, heldSlotPolicy), nil, func(_ *env, o *httpgate.Options) {
		o.Delay = func(ctx context.Context, d time.Duration) error {
			held <- d
			<-resume
			return nil
		}
	})
	proxy := e.proxyTo(up.URL, httpgate.ProxyOptions{})
	// Key a owes the leaky bucket three turns: its next request waits 3s.
	in := &policy.Input{Method: "GET", Path: "/hold", Header: http.Header{"X-Api-Key": {"a"}}, ClientIP: netip.MustParseAddr("192.0.2.1")}
	ms, err := e.gate.Policy().Match(in)
	if err != nil {
		t.Fatal(err)
	}
	var slot sluice.Request
	for _, m := range ms {
		if m.Request.Limit.Name() == "inflight" {
			slot = m.Request
		}
		if m.Request.Limit.Name() == "shaped" {
			for range 3 {
				if _, err := e.gate.Limiter().Take(context.Background(), m.Request); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	results := make(chan int, 2)
	get := func(key string) {
		resp, _, err := getWith(t, context.Background(), proxy.URL+"/hold", key)
		if err != nil {
			results <- -1
			return
		}
		results <- resp.StatusCode
	}
	go get("a")
	d := <-held
	if d < 2*time.Second {
		t.Fatalf("a's turn is %v ahead, want seconds", d)
	}
	// Time passes during the wait, a quarter of a lease at a time; the
	// slot must stay held past each step (renewed by a goroutine, which
	// the test waits for, not for time).
	const step = 250 * time.Millisecond
	for passed, kept := time.Duration(0), true; passed < d && kept; passed += step {
		e.clk.Advance(step)
		deadline := time.Now().Add(10 * time.Second)
		for kept = false; !kept && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			d, err := e.gate.Limiter().Peek(context.Background(), slot)
			kept = err == nil && !d.Allowed && d.RetryAfter > step
		}
	}
	go get("b")
	select {
	case <-up.arrived:
	case s := <-results:
		if s != 429 {
			t.Fatalf("b, while a waits its turn holding the only slot: %d, want 429", s)
		}
	}
	close(resume)
	<-up.arrived
	if n := up.in.Load(); n != 1 {
		t.Errorf("%d requests in the upstream under max_in_flight 1", n)
	}
	close(up.release)
}
