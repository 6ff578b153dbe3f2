package httpgate_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/internal/lockedbuf"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/metrics"
)

// upstream counts the requests it sees and serves /stream (an event
// stream that waits for the test between events) and /ws (an Upgrade that
// echoes bytes).
type upstream struct {
	*httptest.Server
	hits    atomic.Int64
	release chan struct{}
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{release: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		switch r.URL.Path {
		case "/stream":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: one\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-u.release:
			case <-r.Context().Done():
				return
			}
			fmt.Fprint(w, "data: two\n\n")
		case "/slow":
			<-r.Context().Done() // never answers; the proxy gives up
		case "/ws":
			if r.Header.Get("Upgrade") != "echo" {
				http.Error(w, "want Upgrade: echo", 400)
				return
			}
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			brw.Flush()
			io.Copy(conn, brw)
		default:
			w.Header().Set("X-Upstream", "yes")
			fmt.Fprintf(w, "hello %s xff=%s conn=%q", r.URL.Path, r.Header.Get("X-Forwarded-For"), r.Header.Get("Connection"))
		}
	}))
	t.Cleanup(u.Close)
	return u
}

// Behind a trusted proxy that writes Forwarded (client_header: Forwarded),
// the X-Forwarded-For a request carries is the client's own: extended to
// the upstream, it named the client's address of choice to an upstream
// that reads X-Forwarded-For. Only the proxy's own address goes on, and
// the rules count the address the proxy wrote.
func TestAttackClientXFFPastForwardedProxyReachesUpstream(t *testing.T) {
	up := newUpstream(t)
	e := newEnv(t, `
trusted_proxies: ["127.0.0.1/32", "::1/128"]
client_header: Forwarded
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm_config: {rps: 1, burst: 1}
`)
	upURL, _ := url.Parse(up.URL)
	proxy := httptest.NewServer(e.gate.Proxy(upURL, httpgate.ProxyOptions{}))
	t.Cleanup(proxy.Close)
	get := func(xff string) (int, string) {
		req, _ := http.NewRequest("GET", proxy.URL+"/hello", nil)
		req.Header.Set("X-Forwarded-For", xff)
		req.Header.Set("Forwarded", "for=198.51.100.9")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get("192.0.2.44")
	if code != 200 || !strings.Contains(body, "xff=127.0.0.1 ") {
		t.Fatalf("%d: upstream saw %q, want X-Forwarded-For 127.0.0.1 alone", code, body)
	}
	// A fresh X-Forwarded-For is no fresh bucket: the client is 198.51.100.9.
	if code, body := get("192.0.2.45"); code != 429 {
		t.Fatalf("second request with another X-Forwarded-For: %d %q, want 429", code, body)
	}
}

func TestReverseProxy(t *testing.T) {
	up := newUpstream(t)
	e := newEnv(t, tightPolicy)
	upURL, _ := url.Parse(up.URL)
	proxy := httptest.NewServer(e.gate.Proxy(upURL, httpgate.ProxyOptions{}))
	t.Cleanup(proxy.Close)

	get := func(path string) (*http.Response, string) {
		req, _ := http.NewRequest("GET", proxy.URL+path, nil)
		req.Header.Set("X-Forwarded-For", "192.0.2.44")
		req.Header.Set("Connection", "keep-alive, X-Secret")
		req.Header.Set("X-Secret", "hop-by-hop")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := get("/hello")
	if resp.StatusCode != 200 || !strings.HasPrefix(body, "hello /hello") || resp.Header.Get("X-Upstream") != "yes" {
		t.Fatalf("allowed: %d %q", resp.StatusCode, body)
	}
	// The trusted peer's X-Forwarded-For is extended; hop-by-hop headers
	// stop at the proxy.
	if !strings.Contains(body, "xff=192.0.2.44, 127.0.0.1") || !strings.Contains(body, `conn=""`) {
		t.Errorf("upstream saw %q", body)
	}
	wantHeaders(t, resp.Header, map[string]string{"RateLimit": `"per-ip";r=1;t=1`, "RateLimit-Remaining": "1"})
	get("/hello")
	resp, body = get("/hello")
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" || !strings.Contains(body, "quota-exceeded") {
		t.Fatalf("rejected: %d %v %q", resp.StatusCode, resp.Header, body)
	}
	if n := up.hits.Load(); n != 2 {
		t.Errorf("upstream saw %d requests, want 2: rejected ones must not reach it", n)
	}

	// An unreachable upstream is a 502 problem.
	dead, _ := url.Parse("http://127.0.0.1:1")
	bad := httptest.NewServer(e.gate.Proxy(dead, httpgate.ProxyOptions{DialTimeout: time.Second}))
	t.Cleanup(bad.Close)
	e.clk.Advance(time.Minute)
	r2, err := http.Get(bad.URL + "/x")
	if err != nil {
		t.Fatal(err)
	}
	r2.Body.Close()
	if r2.StatusCode != 502 || r2.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("dead upstream: %d %q", r2.StatusCode, r2.Header.Get("Content-Type"))
	}

	// An upstream that does not answer in time is a 504.
	slow := httptest.NewServer(e.gate.Proxy(upURL, httpgate.ProxyOptions{ResponseHeaderTimeout: 50 * time.Millisecond}))
	t.Cleanup(slow.Close)
	e.clk.Advance(time.Minute)
	r3, err := http.Get(slow.URL + "/slow")
	if err != nil {
		t.Fatal(err)
	}
	r3.Body.Close()
	if r3.StatusCode != 504 {
		t.Errorf("slow upstream: %d", r3.StatusCode)
	}
}

func TestReverseProxyStreamsAndUpgrades(t *testing.T) {
	up := newUpstream(t)
	e := newEnv(t, `
rules:
  - name: global
    algorithm: token_bucket
    algorithm_config: {rps: 100, burst: 100}
`)
	upURL, _ := url.Parse(up.URL)
	proxy := httptest.NewServer(e.gate.Proxy(upURL, httpgate.ProxyOptions{}))
	t.Cleanup(proxy.Close)

	// The first event arrives while the upstream still holds the stream
	// open: nothing is buffered.
	resp, err := http.Get(proxy.URL + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "data: one\n" {
		t.Fatalf("first event: %q %v", line, err)
	}
	close(up.release)
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), "data: two") {
		t.Errorf("rest of stream %q", rest)
	}

	// An Upgrade passes through and the connection becomes a byte pipe.
	conn, cr, r := upgradeTo(t, proxy.URL)
	if r.Header.Get("RateLimit") == "" {
		t.Errorf("upgrade response without RateLimit: %v", r.Header)
	}
	fmt.Fprint(conn, "ping\n")
	echo, err := cr.ReadString('\n')
	if err != nil || echo != "ping\n" {
		t.Errorf("echo %q %v", echo, err)
	}
}

func TestMiddleware(t *testing.T) {
	clk := sluice.NewManualClock(time.Unix(1_700_000_000, 0))
	lim := sluice.New(memory.New(memory.Options{Clock: clk}))
	var hits atomic.Int64
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.WriteString(w, "ok")
	})
	reg := prometheus.NewRegistry()
	mw := httpgate.Middleware(mustPolicy(t, tightPolicy), lim, httpgate.Options{Metrics: metrics.New(reg)})
	srv := httptest.NewServer(mw(next))
	t.Cleanup(srv.Close)

	var last *http.Response
	for i := 0; i < 3; i++ {
		resp, err := http.Get(srv.URL + "/anything")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if i < 2 && (resp.StatusCode != 200 || resp.Header.Get("RateLimit") != fmt.Sprintf(`"per-ip";r=%d;t=%d`, 1-i, i+1)) {
			t.Errorf("request %d: %d %q", i, resp.StatusCode, resp.Header.Get("RateLimit"))
		}
		last = resp
	}
	wantHeaders(t, last.Header, map[string]string{
		"Retry-After":         "1",
		"X-Sluice-Reason":     "token_bucket_exceeded",
		"RateLimit":           `"per-ip";r=0;t=1`,
		"RateLimit-Remaining": "0",
		"Content-Type":        "application/problem+json",
	})
	if last.StatusCode != 429 || hits.Load() != 2 {
		t.Errorf("third request: %d; handler ran %d times", last.StatusCode, hits.Load())
	}
	clk.Advance(time.Second)
	if resp, _ := http.Get(srv.URL + "/"); resp.StatusCode != 200 {
		t.Errorf("after a second: %d", resp.StatusCode)
	}
}

// Attack: the reverse proxy passed the client's X-Real-IP (and the like)
// on, so an upstream that believes its proxy's X-Real-IP took the
// client's word for its address; and its 502 told the client the
// upstream's internal address.
func TestAttackReverseProxyHeadersAndErrors(t *testing.T) {
	var mu sync.Mutex
	var seen http.Header
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-r.Context().Done()
			return
		}
		mu.Lock()
		seen = r.Header.Clone()
		mu.Unlock()
	}))
	t.Cleanup(app.Close)
	e := newEnv(t, `
rules:
  - name: global
    algorithm_config: {rps: 100, burst: 100}
`)
	logs := &lockedbuf.Buffer{}
	opts := httpgate.ProxyOptions{Logger: newTextLogger(logs)}
	upURL, _ := url.Parse(app.URL)
	proxy := httptest.NewServer(e.gate.Proxy(upURL, opts))
	t.Cleanup(proxy.Close)

	req, _ := http.NewRequest("GET", proxy.URL+"/x", nil)
	h := forged(0)
	for j := 0; j+1 < len(h); j += 2 {
		req.Header.Set(h[j], h[j+1])
	}
	for _, name := range []string{"True-Client-IP", "X-Client-IP", "CF-Connecting-IP", "X-Forwarded-Port", "X-Forwarded-Server", "X-Forwarded-Prefix"} {
		req.Header.Set(name, "198.18.0.99")
	}
	resp, _ := e.do(req)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	mu.Lock()
	for _, name := range []string{"X-Real-Ip", "True-Client-Ip", "X-Client-Ip", "Cf-Connecting-Ip", "X-Forwarded-Port", "X-Forwarded-Server",
		"X-Forwarded-Prefix", "X-Forwarded-Uri", "X-Forwarded-Method", "X-Original-Uri", "X-Original-Url", "X-Original-Method", "X-Original-Host", "Forwarded"} {
		if v := seen.Get(name); v != "" {
			t.Errorf("the upstream got the client's %s: %q", name, v)
		}
	}
	// The proxy's own forwarding headers: the socket peer (untrusted), the
	// host the client asked for.
	if xff, xfh := seen.Get("X-Forwarded-For"), seen.Get("X-Forwarded-Host"); xff != "127.0.0.1" || xfh == "" {
		t.Errorf("X-Forwarded-For %q, X-Forwarded-Host %q", xff, xfh)
	}
	mu.Unlock()

	// An unreachable upstream: 502, "upstream unreachable", no address.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := ln.Addr().String()
	ln.Close()
	dead, _ := url.Parse("http://" + deadAddr)
	bad := httptest.NewServer(e.gate.Proxy(dead, httpgate.ProxyOptions{Logger: newTextLogger(logs), DialTimeout: time.Second}))
	t.Cleanup(bad.Close)
	r2, body := rawRequest(t, strings.TrimPrefix(bad.URL, "http://"), "GET", "/x")
	if r2.StatusCode != 502 || !strings.Contains(body, `"detail":"upstream unreachable"`) || strings.Contains(body, "127.0.0.1") || strings.Contains(body, "dial") {
		t.Errorf("dead upstream: %d %s", r2.StatusCode, body)
	}
	// A slow one: 504, "upstream timed out".
	slow := httptest.NewServer(e.gate.Proxy(upURL, httpgate.ProxyOptions{Logger: newTextLogger(logs), ResponseHeaderTimeout: 50 * time.Millisecond}))
	t.Cleanup(slow.Close)
	r3, body := rawRequest(t, strings.TrimPrefix(slow.URL, "http://"), "GET", "/slow")
	if r3.StatusCode != 504 || !strings.Contains(body, `"detail":"upstream timed out"`) || strings.Contains(body, "127.0.0.1") {
		t.Errorf("slow upstream: %d %s", r3.StatusCode, body)
	}
	// The operator still learns what happened.
	if l := logs.String(); !strings.Contains(l, deadAddr) || !strings.Contains(l, "upstream timed out") {
		t.Errorf("the log lacks the upstream errors:\n%s", l)
	}
}

// Attack: a request whose cost a limit can never grant (max_tokens 400000
// on a burst of 300000) was answered 429 with Retry-After: 1, so a client
// that obeys it retried forever. Through the proxy, the middleware and
// forward auth it is a 422 problem naming the limit, as /v1/take answers
// it, with no Retry-After, and nothing reaches the upstream or is charged.
func TestAttackCostNeverGrantedIsNot429(t *testing.T) {
	var hits atomic.Int64
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	t.Cleanup(app.Close)
	e := newEnv(t, `
rules:
  - name: llm-tokens
    limit_keys: ["header:x-api-key"]
    match: { path_prefix: /v1/chat/completions }
    algorithm_config:
      rate: 300000
      period: 1m
      capacity: 300000
      cost_source: "body:max_tokens"
      default_cost: 8000
  - name: by-header
    limit_keys: ["header:x-api-key"]
    algorithm_config: {rps: 10, burst: 300000, cost_source: "header:X-Cost"}
`)
	upURL, _ := url.Parse(app.URL)
	proxy := httptest.NewServer(e.gate.Proxy(upURL, httpgate.ProxyOptions{}))
	t.Cleanup(proxy.Close)
	mw := httptest.NewServer(httpgate.Middleware(e.gate.Policy(), e.gate.Limiter(), httpgate.Options{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) })))
	t.Cleanup(mw.Close)

	check := func(door string, req *http.Request, want int) {
		t.Helper()
		resp, body := e.do(req)
		if resp.StatusCode != want || resp.Header.Get("Retry-After") != "" || resp.Header.Get("X-Sluice-Reason") != "cost_exceeds_limit" ||
			!strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
			t.Errorf("%s: %d, Retry-After %q, reason %q, %s; want %d, no Retry-After, cost_exceeds_limit, a problem",
				door, resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("X-Sluice-Reason"), resp.Header.Get("Content-Type"), want)
		}
		if names, _ := body["violated-policies"].([]any); len(names) == 0 || !strings.Contains(fmt.Sprint(body["detail"]), "can never") {
			t.Errorf("%s: problem %v, want the limit named and why", door, body)
		}
	}
	for _, base := range []struct{ door, url string }{{"proxy", proxy.URL}, {"middleware", mw.URL}} {
		req, _ := http.NewRequest("POST", base.url+"/v1/chat/completions", strings.NewReader(`{"max_tokens": 400000}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Api-Key", "k")
		check(base.door+" body:max_tokens", req, http.StatusUnprocessableEntity)
		req, _ = http.NewRequest("GET", base.url+"/h", nil)
		req.Header.Set("X-Api-Key", "k")
		req.Header.Set("X-Cost", "300001")
		check(base.door+" header cost", req, http.StatusUnprocessableEntity)
	}
	req, _ := http.NewRequest("GET", e.srv.URL+"/v1/auth/h", nil)
	req.Header.Set("X-Api-Key", "k")
	req.Header.Set("X-Cost", "300001")
	check("forward auth", req, http.StatusUnprocessableEntity)
	// nginx passes on only the status it asks for.
	req, _ = http.NewRequest("GET", e.srv.URL+"/v1/auth/h?deny_status=403", nil)
	req.Header.Set("X-Api-Key", "k")
	req.Header.Set("X-Cost", "300001")
	check("forward auth, deny_status=403", req, http.StatusForbidden)
	if n := hits.Load(); n != 0 {
		t.Errorf("%d requests reached the upstream", n)
	}
	// Nothing was charged: the whole burst is still there.
	req, _ = http.NewRequest("GET", proxy.URL+"/h", nil)
	req.Header.Set("X-Api-Key", "k")
	req.Header.Set("X-Cost", "300000")
	if resp, _ := e.do(req); resp.StatusCode != 200 {
		t.Errorf("a cost of the whole burst after the refusals: %d, want 200", resp.StatusCode)
	}
}

// Attack: the upstream behind sluice's reverse proxy reads the operator's
// session. Browsers send a host's cookies to all of its ports, so an
// operator who uses the proxied application on the same host hands it
// the session cookie; the proxy drops it and passes the others.
func TestAttackProxyForwardsSessionCookie(t *testing.T) {
	var mu sync.Mutex
	var got []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Values("Cookie")...)
		mu.Unlock()
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	g := httpgate.New(mustPolicy(t, "rules:\n  - name: all\n    algorithm_config: {rps: 1000, burst: 1000}\n"), sluice.New(memory.New(memory.Options{})), httpgate.Options{})
	front := httptest.NewServer(g.Proxy(u, httpgate.ProxyOptions{}))
	defer front.Close()
	req, _ := http.NewRequest("GET", front.URL+"/app", nil)
	req.Header.Add("Cookie", "app=1; sluice_ui=123.session; theme=dark")
	req.Header.Add("Cookie", "sluice_ui=again")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(got, "; ") != "app=1; theme=dark" {
		t.Errorf("the upstream got cookies %q", got)
	}
}

// upgradeTo asks the proxy at url for /ws with an Upgrade that the
// upstream echoes, and returns the connection, its reader past the 101
// and the 101.
func upgradeTo(t *testing.T, url string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	cr := bufio.NewReader(conn)
	r, err := http.ReadResponse(cr, nil)
	if err != nil || r.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", r, err)
	}
	return conn, cr, r
}

// Attack: a rule keys on a header (X-Api-Key), and requests without one
// share the (absent) bucket. Through the reverse proxy, a client sends a
// fresh X-Api-Key on every request and names it in Connection
// ("Connection: X-Api-Key"): httputil.ReverseProxy drops the headers
// Connection lists (hop-by-hop, RFC 9110 section 7.6.1), so the upstream
// sees an anonymous request each time, while sluice charged a bucket of
// the client's choosing. The client is anonymous to the upstream and
// never limited as one: it must be judged on what the upstream is sent.
func TestAttackConnectionHeaderHidesKeyFromUpstream(t *testing.T) {
	e := newEnv(t, `
rules:
  - name: per-key
    limit_keys: ["header:x-api-key"]
    algorithm_config: {rps: 1, burst: 2}
`)
	var mu sync.Mutex
	var seen []string
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("X-Api-Key"))
		mu.Unlock()
	}))
	t.Cleanup(app.Close)
	up, _ := url.Parse(app.URL)
	proxy := httptest.NewServer(e.gate.Proxy(up, httpgate.ProxyOptions{}))
	t.Cleanup(proxy.Close)
	addr := strings.TrimPrefix(proxy.URL, "http://")
	got := statuses(t, 4, func(i int) int {
		resp, _ := rawRequest(t, addr, "GET", "/data", "X-Api-Key", fmt.Sprintf("fresh-%d", i), "Connection", "X-Api-Key")
		return resp.StatusCode
	})
	mu.Lock()
	defer mu.Unlock()
	for i, k := range seen {
		if k != "" {
			t.Fatalf("request %d: the upstream saw X-Api-Key %q; the attack needs it dropped", i, k)
		}
	}
	if got != "200 200 429 429" {
		t.Errorf("4 requests whose X-Api-Key the proxy drops: %s, want 200 200 429 429 (the upstream saw %d anonymous requests: one (absent) bucket)", got, len(seen))
	}
}

// Attack: a rule limits GET /search (an expensive query, or an oracle
// whose status says whether a name exists); the client sends HEAD
// instead. Go's mux, like Express and Rails, serves HEAD with GET's
// handler, which does all of its work and only leaves the body unsent. A
// HEAD is a GET to the rules: three searches, then 429s.
func TestAttackHeadEscapesGetRule(t *testing.T) {
	e := newEnv(t, `
rules:
  - name: search
    match: {path: /search, method: GET}
    algorithm_config: {rps: 1, burst: 3}
`)
	var searches atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("GET /search", func(w http.ResponseWriter, r *http.Request) {
		searches.Add(1)
		io.WriteString(w, "results")
	})
	app := httptest.NewServer(mux)
	t.Cleanup(app.Close)
	up, _ := url.Parse(app.URL)
	proxy := httptest.NewServer(e.gate.Proxy(up, httpgate.ProxyOptions{}))
	t.Cleanup(proxy.Close)
	got := statuses(t, 5, func(int) int {
		resp, err := http.Head(proxy.URL + "/search?q=a")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	})
	if got != "200 200 200 429 429" || searches.Load() != 3 {
		t.Errorf("five HEAD /search: %s, the app searched %d times; want 200 200 200 429 429 and 3", got, searches.Load())
	}
}

// Attack: a rule limits DELETE /items; the client sends POST with
// X-HTTP-Method-Override: DELETE, which Symfony and Laravel (and
// Express's method-override) honour on a POST, so the upstream deletes
// while the rules judged a POST. The proxy drops the override headers:
// the upstream serves the POST that was judged.
func TestAttackMethodOverrideHeaderEscapesRule(t *testing.T) {
	e := newEnv(t, `
rules:
  - name: deletes
    match: {path: /items, method: DELETE}
    algorithm_config: {rps: 1, burst: 2}
`)
	var deletes atomic.Int64
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m := r.Method
		for _, h := range []string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"} {
			if o := r.Header.Get(h); m == "POST" && o != "" {
				m = strings.ToUpper(o)
			}
		}
		if m == "DELETE" {
			deletes.Add(1)
		}
	}))
	t.Cleanup(app.Close)
	up, _ := url.Parse(app.URL)
	proxy := httptest.NewServer(e.gate.Proxy(up, httpgate.ProxyOptions{}))
	t.Cleanup(proxy.Close)
	addr := strings.TrimPrefix(proxy.URL, "http://")
	for _, h := range []string{"X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override"} {
		for i := 0; i < 2; i++ {
			rawRequest(t, addr, "POST", "/items", h, "DELETE")
		}
	}
	if n := deletes.Load(); n > 2 {
		t.Errorf("the upstream deleted %d times through POSTs with an override header; the rule admits 2 DELETEs", n)
	}
}
