package httpgate_test

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/internal/lockedbuf"
)

// loginRules limit logins per client, and every path per client and path
// (each forged path would otherwise be a fresh bucket): three each.
const loginRules = `
trusted_proxies: ["127.0.0.1/32", "::1/128"]
rules:
  - name: login
    limit_keys: ["ip:address"]
    match: {path: /login, method: POST}
    algorithm_config: {rps: 1, burst: 3}
  - name: per-path
    limit_keys: ["ip:address", "path"]
    algorithm_config: {rps: 1, burst: 3}
`

// statuses sends n requests built by req(i) and returns their statuses.
func statuses(t *testing.T, n int, do func(i int) int) string {
	t.Helper()
	var b strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprint(&b, do(i))
	}
	return b.String()
}

// forged is every forwarding header a client could send to pose as
// another path, method, host or address, the i-th time.
func forged(i int) []string {
	return []string{
		"X-Forwarded-Uri", fmt.Sprintf("/x%d", i),
		"X-Forwarded-Method", "GET",
		"X-Forwarded-Host", fmt.Sprintf("h%d.example", i),
		"X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i+1),
		"X-Original-Uri", fmt.Sprintf("/y%d", i),
		"X-Original-Url", fmt.Sprintf("/z%d", i),
		"X-Original-Method", "GET",
		"X-Original-Host", fmt.Sprintf("o%d.example", i),
		"X-Real-Ip", fmt.Sprintf("198.18.0.%d", i+1),
		"Forwarded", fmt.Sprintf("for=192.0.2.%d;host=f%d.example", i+1, i),
	}
}

// withHeaders returns forged(i) with the proxy's own headers in place of
// the forged ones of the same name.
func withHeaders(i int, own ...string) []string {
	set := map[string]bool{}
	for j := 0; j+1 < len(own); j += 2 {
		set[http.CanonicalHeaderKey(own[j])] = true
	}
	out := append([]string(nil), own...)
	f := forged(i)
	for j := 0; j+1 < len(f); j += 2 {
		if !set[http.CanonicalHeaderKey(f[j])] {
			out = append(out, f[j], f[j+1])
		}
	}
	return out
}

// Attack: behind a trusted front proxy, the client sends the forwarding
// headers of another proxy family (X-Forwarded-Uri behind nginx, which
// sets X-Original-URI), or forged values of the family's client header's
// neighbours, to move its request to another path, method or address and
// so out of the login rule or into a fresh bucket each time. Only the
// named proxy's headers count: three logins, then 429s.
func TestAttackForwardAuthForgedFamilies(t *testing.T) {
	const client = "198.51.100.1"
	cases := []struct {
		proxy, extra string
		path         string // the call's path
		own          []string
	}{
		{"nginx", "", "/v1/auth", []string{"X-Original-Method", "POST", "X-Original-URI", "/login", "X-Original-Host", "app.example", "X-Real-IP", client}},
		{"traefik", "", "/v1/auth", []string{"X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/login", "X-Forwarded-Host", "app.example", "X-Forwarded-For", client}},
		{"caddy", "", "/v1/auth", []string{"X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/login", "X-Forwarded-Host", "app.example", "X-Forwarded-For", client}},
		{"custom", ", method_header: X-Auth-Method, uri_header: X-Auth-Uri, host_header: X-Auth-Host, client_header: X-Auth-Client", "/v1/auth",
			[]string{"X-Auth-Method", "POST", "X-Auth-Uri", "/login", "X-Auth-Host", "app.example", "X-Auth-Client", client}},
		{"envoy", "", "/v1/auth/login", []string{"X-Forwarded-For", client}},
	}
	for _, c := range cases {
		t.Run(c.proxy, func(t *testing.T) {
			e := newEnv(t, "forward_auth: {proxy: "+c.proxy+c.extra+"}\n"+loginRules)
			got := statuses(t, 5, func(i int) int {
				req, _ := http.NewRequest("POST", e.srv.URL+c.path, nil)
				if c.proxy != "envoy" {
					req.Method = "GET" // nginx and Caddy call /v1/auth with GET
				}
				req.Host = "app.example"
				h := withHeaders(i, c.own...)
				for j := 0; j+1 < len(h); j += 2 {
					req.Header.Set(h[j], h[j+1])
				}
				resp, _ := e.do(req)
				return resp.StatusCode
			})
			if got != "200 200 200 429 429" {
				t.Errorf("five forged POSTs to /login: %s, want 200 200 200 429 429", got)
			}
			audit := e.audit.String()
			if strings.Count(audit, `"rule":"login"`) != 2 || strings.Count(audit, `"client_ip":"`+client+`"`) != strings.Count(audit, "\n") ||
				strings.Count(audit, `"path":"/login"`) != strings.Count(audit, "\n") {
				t.Errorf("audit log: want the client %s and /login only:\n%s", client, audit)
			}
		})
	}
}

// Attack: with no forward_auth, a client behind (or posing as) a trusted
// proxy sends X-Forwarded-For and X-Original-URI to pick its own bucket
// and path. Without forward_auth no header describes the request: every
// call counts as the peer's own call to /v1/auth.
func TestAttackForwardAuthDefaultBelievesNothing(t *testing.T) {
	e := newEnv(t, tightPolicy)
	got := statuses(t, 4, func(i int) int {
		resp, _ := e.get("/v1/auth", forged(i)...)
		return resp.StatusCode
	})
	if got != "200 200 429 429" {
		t.Errorf("four calls with forged headers: %s, want 200 200 429 429 (one bucket, the peer's)", got)
	}
	if a := e.audit.String(); strings.Count(a, `"client_ip":"127.0.0.1"`) != 2 || strings.Count(a, `"path":"/v1/auth"`) != 2 {
		t.Errorf("audit log:\n%s", a)
	}
}

// Attack: the client sends its own X-Original-URI (or host, or method)
// and the front proxy adds its own instead of replacing it, so sluice sees
// two and might believe the client's. A description it cannot trust is a
// 400, never a guess.
func TestAttackForwardAuthAmbiguousDescription(t *testing.T) {
	e := newEnv(t, "forward_auth: {proxy: nginx}\n"+loginRules)
	good := http.Header{
		"X-Original-Method": {"POST"}, "X-Original-Uri": {"/login"},
		"X-Original-Host": {"app.example"}, "X-Real-Ip": {"198.51.100.1"},
	}
	for _, c := range []struct {
		name string
		edit func(h http.Header)
		want string
	}{
		{"two URIs", func(h http.Header) { h["X-Original-Uri"] = []string{"/x", "/login"} }, "X-Original-Uri was sent 2 times"},
		{"two methods", func(h http.Header) { h["X-Original-Method"] = []string{"GET", "POST"} }, "X-Original-Method was sent 2 times"},
		{"two hosts", func(h http.Header) { h["X-Original-Host"] = []string{"a.example", "app.example"} }, "X-Original-Host was sent 2 times"},
		{"a host list", func(h http.Header) { h.Set("X-Original-Host", "a.example, app.example") }, "not one host name"},
		{"no URI", func(h http.Header) { h.Del("X-Original-Uri") }, "sent no X-Original-Uri"},
		{"no client", func(h http.Header) { h.Del("X-Real-Ip") }, "sent no X-Real-Ip"},
		{"a bad method", func(h http.Header) { h.Set("X-Original-Method", "PO ST") }, "not an HTTP method"},
		{"a bad URI", func(h http.Header) { h.Set("X-Original-Uri", "login") }, "not a request URI"},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", e.srv.URL+"/v1/auth", nil)
			req.Header = good.Clone()
			c.edit(req.Header)
			resp, m := e.do(req)
			if d, _ := m["detail"].(string); resp.StatusCode != 400 || !strings.Contains(d, c.want) {
				t.Errorf("%d %v, want a 400 saying %q", resp.StatusCode, m, c.want)
			}
		})
	}
	// Envoy's calls carry the original path after /v1/auth; a call
	// without one describes nothing.
	env := newEnv(t, "forward_auth: {proxy: envoy}\n"+loginRules)
	if resp, _ := env.get("/v1/auth", "X-Forwarded-For", "198.51.100.1"); resp.StatusCode != 400 {
		t.Errorf("envoy call without the original path: %d, want 400", resp.StatusCode)
	}
}

// Attack: behind Envoy (and Caddy) the call's query string is the
// client's, so ?deny_status= would let it choose the status of its own
// rejection (a 401 or 403 that a client or cache treats differently from
// a 429).
func TestAttackEnvoyDenyStatusFromClient(t *testing.T) {
	e := newEnv(t, "forward_auth: {proxy: envoy}\n"+loginRules)
	var last int
	for i := 0; i < 4; i++ {
		req, _ := http.NewRequest("POST", e.srv.URL+"/v1/auth/login?deny_status=401", nil)
		req.Header.Set("X-Forwarded-For", "198.51.100.1")
		resp, _ := e.do(req)
		last = resp.StatusCode
	}
	if last != 429 {
		t.Errorf("the fourth login: %d, want 429 (the policy's deny_status, not the client's)", last)
	}
}

// loginSpellings are ways to write /login that some upstream serves as
// /login: percent-encoded, doubled slashes, dot segments, other case,
// path parameters (Tomcat), backslashes (IIS), a trailing slash (Express),
// double encoding.
var loginSpellings = []string{
	"/%6Cogin", "/%6c%6F%67%69%6E", "//login", "///login", "/x/../login", "/./login",
	"/x/..//login", "/LOGIN", "/Login", "/%4C%4F%47%49%4E", "/login/", "/login;jsessionid=1",
	"/login;/", "/x/..;/login", `/x\..\login`, "/%5Clogin", "/%256Cogin", "/login?next=/", "/LOGIN/.",
}

// adminSpellings are ways to reach under /admin/.
var adminSpellings = []string{
	"/ADMIN/users", "/%61dmin/users", "//admin/users", "/x/../admin/users", "/admin;x/users",
	`/x\..\admin/users`, "/x/..;/admin/users", "/Admin/./users", "/%2561dmin/users",
}

const pathRules = `
trusted_proxies: ["127.0.0.1/32"]
forward_auth: {proxy: nginx}
rules:
  - name: login
    match: {path: /login}
    algorithm_config: {rps: 1, burst: 1}
  - name: admin
    match: {path_prefix: /admin/}
    algorithm_config: {rps: 1, burst: 1}
  - name: per-path
    limit_keys: ["path"]
    match: {path_prefix: /account}
    algorithm_config: {rps: 1, burst: 1}
`

// Attack: once /login (or /admin/...) is over its limit, the client
// spells the path another way that its upstream still serves as /login.
// Every spelling is judged as /login: 429.
func TestAttackPathSpellings(t *testing.T) {
	e := newEnv(t, pathRules)
	call := func(uri string) int {
		resp, _ := e.get("/v1/auth", "X-Original-Method", "GET", "X-Original-URI", uri, "X-Original-Host", "app.example", "X-Real-IP", "198.51.100.1")
		return resp.StatusCode
	}
	for _, c := range []struct {
		plain     string
		spellings []string
	}{
		{"/login", loginSpellings},
		{"/admin/users", adminSpellings},
		{"/account", []string{"/ACCOUNT", "/account/", "/account;x", "/%61ccount", "//account", `/account\`}},
	} {
		if got := call(c.plain); got != 200 {
			t.Fatalf("%s: %d", c.plain, got)
		}
		for _, s := range c.spellings {
			if got := call(s); got != 429 {
				t.Errorf("%s after %s: %d, want 429", s, c.plain, got)
			}
		}
	}
	// The middleware and the reverse proxy read the path of the request
	// line itself.
	mw := httptest.NewServer(e.gate.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	t.Cleanup(mw.Close)
	for _, s := range []string{"/LOGIN", "/%6Cogin", "//login", "/x/../login", "/login;x", "/login/"} {
		if resp, _ := rawRequest(t, strings.TrimPrefix(mw.URL, "http://"), "GET", s); resp.StatusCode != 429 {
			t.Errorf("middleware %s: %d, want 429", s, resp.StatusCode)
		}
	}
}

// rawRequest sends a request line exactly as given (no client-side
// cleaning) and returns the answer.
func rawRequest(t *testing.T, addr, method, target string, hdr ...string) (*http.Response, string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 0\r\nConnection: close\r\n", method, target, addr)
	for i := 0; i+1 < len(hdr); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", hdr[i], hdr[i+1])
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// Attack: a ';' in the query (or a malformed escape, or over 10000
// parameters) made Go's query parser drop the parameter, so a rule keyed
// on it with missing_key: skip no longer applied, and a repeated
// parameter let the client pick a fresh bucket while an upstream that
// reads the last value sees the same identity. Such a parameter is never
// absent: its requests share the (ambiguous) bucket, it matches every
// value a server could read, and it costs the most any server could read.
func TestAttackAmbiguousQuery(t *testing.T) {
	e := newEnv(t, `
rules:
  - name: per-key
    limit_keys: ["query:api_key"]
    missing_key: skip
    algorithm_config: {rps: 1, burst: 2}
  - name: uploads
    match: {"query:op": upload}
    limit_keys: ["query:op"]
    missing_key: skip
    algorithm_config: {rps: 1, burst: 100}
  - name: costly
    limit_keys: ["query:user"]
    missing_key: skip
    algorithm_config: {rps: 1, burst: 10, cost_source: "query:cost"}
`)
	srv := httptest.NewServer(e.gate.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	t.Cleanup(srv.Close)
	get := func(query string) *http.Response {
		resp, err := http.Get(srv.URL + "/api?" + query)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	many := strings.Repeat("a=1&", 10001)
	for _, c := range []struct {
		name    string
		queries []string
	}{
		{"semicolon", []string{"api_key=k;1", "api_key=k;2", "x=1;api_key=k3"}},
		{"malformed escape", []string{"api_key=%zz1", "api_key=%zz2", "api_key=%zz3"}},
		{"repeated", []string{"api_key=a&api_key=k", "api_key=b&api_key=k", "api_key=c&api_key=k"}},
		{"over 10000 parameters", []string{many + "api_key=k1", many + "api_key=k2", many + "api_key=k3"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e.clk.Advance(time.Hour)
			got := statuses(t, 3, func(i int) int { return get(c.queries[i]).StatusCode })
			if got != "200 200 429" {
				t.Errorf("%s: %s, want 200 200 429 (one shared bucket, never skipped)", c.name, got)
			}
		})
	}
	// A value that some server reads as "upload" is an upload.
	e.clk.Advance(time.Hour)
	if rl := get("op=upload;x").Header.Get("RateLimit-Policy"); !strings.Contains(rl, `"uploads"`) {
		t.Errorf("op=upload;x did not count as an upload: RateLimit-Policy %q", rl)
	}
	// cost=10;x is 10 to a server that splits at ';': the bucket of 10 is
	// empty after one such request.
	get("user=u&cost=10;x")
	if resp := get("user=u&cost=1"); resp.StatusCode != 429 {
		t.Errorf("after cost=10;x: %d, want 429 (it cost 10, not the default 1)", resp.StatusCode)
	}
	// Unambiguous queries keep their own buckets.
	e.clk.Advance(time.Hour)
	for _, q := range []string{"api_key=p", "api_key=q", "api_key=p&api_key=p", "api_key=r%3Bs"} {
		if resp := get(q); resp.StatusCode != 200 {
			t.Errorf("%s: %d", q, resp.StatusCode)
		}
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

// Attack (through a real nginx running examples/nginx.conf): the client
// sends every forwarding header it can think of, X-Original-URI and
// X-Real-IP included, and spells /login every other way. nginx replaces
// or drops them, and sluice reads only nginx's: three logins per client,
// then 429s, with the client's real address.
func TestAttackNginxForgedHeaders(t *testing.T) {
	e := newEnv(t, "forward_auth: {proxy: nginx}\n"+loginRules)
	addr, logs := startNginx(t, e, newApp(t))
	attackThroughProxy(t, e, addr, logs)
}

// Attack (through a real Caddy running examples/Caddyfile): the same as
// through nginx.
func TestAttackCaddyForgedHeaders(t *testing.T) {
	e := newEnv(t, "forward_auth: {proxy: caddy}\n"+loginRules)
	addr, logs := startCaddy(t, e, newApp(t))
	attackThroughProxy(t, e, addr, logs)
}

// newApp is an upstream that accepts everything.
func newApp(t *testing.T) *httptest.Server {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "app: "+r.URL.Path)
	}))
	t.Cleanup(app.Close)
	return app
}

// attackThroughProxy runs the forged-header and path-spelling attacks
// through a real front proxy at addr (loginRules, forward auth).
func attackThroughProxy(t *testing.T, e *env, addr string, logs func() string) {
	t.Helper()
	got := statuses(t, 5, func(i int) int {
		resp, _ := rawRequest(t, addr, "POST", "/login", forged(i)...)
		return resp.StatusCode
	})
	if got != "200 200 200 429 429" {
		t.Fatalf("five forged POSTs to /login: %s, want 200 200 200 429 429\n%s", got, logs())
	}
	a := e.audit.String()
	if n := strings.Count(a, "\n"); n == 0 || strings.Count(a, `"client_ip":"127.0.0.1"`) != n || strings.Count(a, `"path":"/login"`) != n {
		t.Errorf("audit log: want the client 127.0.0.1 and /login only:\n%s", a)
	}
	// Nor does the client choose the status of its rejection.
	if resp, _ := rawRequest(t, addr, "POST", "/login?deny_status=401"); resp.StatusCode != 429 {
		t.Errorf("POST /login?deny_status=401: %d, want 429", resp.StatusCode)
	}
	// The login bucket is empty: no spelling of /login gets through.
	for _, s := range []string{"/LOGIN", "/%6Cogin", "//login", "/x/../login", "/login;a=1", "/login/", "/Login?next=/"} {
		if resp, body := rawRequest(t, addr, "POST", s, forged(9)...); resp.StatusCode != 429 {
			t.Errorf("POST %s: %d %q, want 429", s, resp.StatusCode, body)
		}
	}
}

func newTextLogger(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

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
