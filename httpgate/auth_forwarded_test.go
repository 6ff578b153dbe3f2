package httpgate_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
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
// double encoding, a fragment (nginx).
var loginSpellings = []string{
	"/%6Cogin", "/%6c%6F%67%69%6E", "//login", "///login", "/x/../login", "/./login",
	"/x/..//login", "/LOGIN", "/Login", "/%4C%4F%47%49%4E", "/login/", "/login;jsessionid=1",
	"/login;/", "/x/..;/login", `/x\..\login`, "/%5Clogin", "/%256Cogin", "/login?next=/", "/LOGIN/.",
	"/login#/../x",
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

// Attack: an upstream that compares paths without case by upper-casing
// each letter, as Java's String.equalsIgnoreCase does, serves "/ſignin"
// (a long s, which Unicode case folding also takes for s) and "/sıgnin"
// (a dotless i) as /signin: both letters upper-case to ASCII. Lower-cased
// alone, they were other paths, out of the signin rule and fresh buckets.
// Rules fold a path's case as such an upstream does: three sign-ins,
// then 429s.
func TestAttackPathUnicodeCaseFold(t *testing.T) {
	e := newEnv(t, `
trusted_proxies: ["127.0.0.1/32"]
forward_auth: {proxy: nginx}
rules:
  - name: signin
    match: {path: /signin}
    algorithm_config: {rps: 1, burst: 3}
  - name: per-path
    limit_keys: ["path"]
    algorithm_config: {rps: 1, burst: 3}
`)
	var signins atomic.Int64
	mw := httptest.NewServer(e.gate.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.ToUpper(r.URL.Path) == "/SIGNIN" {
			signins.Add(1)
		}
	})))
	t.Cleanup(mw.Close)
	spellings := []string{"/%C5%BFignin", "/s%C4%B1gnin", "/%C5%BF%C4%B1gnin", "/SIGN%C4%B1N", "/%C5%BFIGNIN"}
	got := statuses(t, len(spellings), func(i int) int {
		resp, _ := rawRequest(t, strings.TrimPrefix(mw.URL, "http://"), "POST", spellings[i])
		return resp.StatusCode
	})
	if got != "200 200 200 429 429" || signins.Load() != 3 {
		t.Errorf("middleware %v: %s, the app signed in %d times; want 200 200 200 429 429 and 3", spellings, got, signins.Load())
	}
	// Forward auth reads X-Original-URI as the middleware reads the path
	// (the signin rule is one bucket, spent).
	for _, s := range spellings[:2] {
		if resp, _ := e.get("/v1/auth", "X-Original-Method", "POST", "X-Original-URI", s, "X-Original-Host", "app.example", "X-Real-IP", "198.51.100.1"); resp.StatusCode != 429 {
			t.Errorf("forward auth %s after three sign-ins: %d, want 429", s, resp.StatusCode)
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
