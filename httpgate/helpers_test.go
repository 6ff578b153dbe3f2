package httpgate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/internal/lockedbuf"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/policy"
)

// env is a gate over a memory store on a manual clock, served by an
// httptest server.
type env struct {
	t     *testing.T
	clk   *sluice.ManualClock
	store *memory.Store
	gate  *httpgate.Gate
	srv   *httptest.Server
	audit *lockedbuf.Buffer
	env   map[string]string
	// prom are the gate's metrics (Options.Metrics), for tests that read them.
	prom *metrics.Metrics

	mu     sync.Mutex
	delays []time.Duration // the waits Options.Delay was asked for
}

func (e *env) waits() []time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]time.Duration(nil), e.delays...)
}

// sluiceEpoch is where the manual clocks of the tests start.
var sluiceEpoch = time.Unix(1_700_000_000, 0)

// mustPolicy parses yaml for a test, a benchmark or a fuzz target.
func mustPolicy(tb testing.TB, yaml string) *policy.Policy {
	tb.Helper()
	p, err := policy.Parse("test.yaml", []byte(yaml))
	if err != nil {
		tb.Fatalf("policy: %v", err)
	}
	return p
}

func newEnv(t *testing.T, yaml string) *env {
	t.Helper()
	return newEnvStore(t, yaml, nil)
}

// newEnvStore builds an env; wrap, when not nil, wraps the memory store
// (for fault injection).
func newEnvStore(t *testing.T, yaml string, wrap func(sluice.Store) sluice.Store) *env {
	t.Helper()
	return newEnvPolicy(t, mustPolicy(t, yaml), wrap)
}

// newEnvPolicy builds an env serving p (a policy of any format).
func newEnvPolicy(t *testing.T, p *policy.Policy, wrap func(sluice.Store) sluice.Store) *env {
	t.Helper()
	return newEnvOpts(t, p, wrap, nil)
}

// newEnvOpts is newEnvPolicy with opts, when not nil, changing the gate's
// options (given the env, for its clock).
func newEnvOpts(t *testing.T, p *policy.Policy, wrap func(sluice.Store) sluice.Store, opts func(*env, *httpgate.Options)) *env {
	t.Helper()
	e := &env{t: t, clk: sluice.NewManualClock(sluiceEpoch), audit: &lockedbuf.Buffer{}, env: map[string]string{}}
	e.store = memory.New(memory.Options{Clock: e.clk})
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	m.WatchKeys(e.store)
	e.prom = m
	var st sluice.Store = e.store
	if wrap != nil {
		st = wrap(st)
	}
	lim := sluice.NewWithOptions(m.InstrumentStore(st), sluice.Options{Clock: e.clk})
	o := httpgate.Options{
		Metrics: m,
		Audit:   httpgate.NewAudit(e.audit),
		Getenv:  func(k string) string { return e.env[k] },
		Logger:  slog.New(slog.NewTextHandler(t.Output(), nil)),
		Delay: func(_ context.Context, d time.Duration) error {
			e.mu.Lock()
			e.delays = append(e.delays, d)
			e.mu.Unlock()
			return nil
		},
	}
	if opts != nil {
		opts(e, &o)
	}
	e.gate = httpgate.New(p, lim, o)
	e.srv = httptest.NewServer(e.gate.Handler())
	t.Cleanup(e.srv.Close)
	return e
}

// post sends a JSON body and decodes the JSON answer into a map.
func (e *env) post(path, body string, hdr ...string) (*http.Response, map[string]any) {
	e.t.Helper()
	req, err := http.NewRequest("POST", e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return e.do(req)
}

func (e *env) do(req *http.Request) (*http.Response, map[string]any) {
	e.t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if len(data) > 0 && strings.Contains(resp.Header.Get("Content-Type"), "json") {
		if err := json.Unmarshal(data, &m); err != nil {
			e.t.Fatalf("%s %s: body %q: %v", req.Method, req.URL, data, err)
		}
	}
	return resp, m
}

// get sends a GET with headers to path.
func (e *env) get(path string, hdr ...string) (*http.Response, map[string]any) {
	e.t.Helper()
	req, err := http.NewRequest("GET", e.srv.URL+path, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return e.do(req)
}

func (e *env) metrics() string {
	e.t.Helper()
	resp, err := http.Get(e.srv.URL + "/metrics")
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// wantFields checks decoded JSON fields (numbers compare as float64).
func wantFields(t *testing.T, got map[string]any, want map[string]any) {
	t.Helper()
	for k, v := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("field %q missing in %v", k, got)
			continue
		}
		if n, isInt := v.(int); isInt {
			v = float64(n)
		}
		if g != v {
			t.Errorf("%s = %v, want %v (body %v)", k, g, v, got)
		}
	}
}

// wantHeaders checks exact header values; "" means absent.
func wantHeaders(t *testing.T, h http.Header, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
}

// closedPolicy guards the decision API and forward auth with a token. Its
// per-ip rule keys forward auth by the caller's address: 127.0.0.1 here.
const closedPolicy = `
api_token_env: ` + apiTokenEnv + `
admin_token_env: SLUICE_TEST_ADMIN
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm_config: {rps: 1, burst: 2}
`

// newClosedEnv serves closedPolicy, its token in the environment both when
// the policy loads and when the gate reads it.
func newClosedEnv(t *testing.T, yaml string) *env {
	t.Helper()
	t.Setenv(apiTokenEnv, apiToken)
	e := newEnv(t, yaml)
	e.env[apiTokenEnv] = apiToken
	return e
}

// wantUnauthorized checks a 401 problem with a Bearer challenge.
func wantUnauthorized(t *testing.T, what string, resp *http.Response, m map[string]any) {
	t.Helper()
	if resp.StatusCode != 401 || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer ") ||
		resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(m["detail"].(string), "token") {
		t.Errorf("%s: %d %v %v", what, resp.StatusCode, resp.Header, m)
	}
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

// do sends method path with a body and headers (pairs), without following
// redirects, and returns the answer and its body.
func do(t *testing.T, e *env, method, path, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// login trades the token for the session cookie through /ui?token=.
func login(t *testing.T, e *env, token string) *http.Cookie {
	t.Helper()
	resp, _ := do(t, e, "GET", "/ui?token="+url.QueryEscape(token), "")
	for _, c := range resp.Cookies() {
		if c.Name == "sluice_ui" {
			return c
		}
	}
	t.Fatalf("no session cookie: %d %v", resp.StatusCode, resp.Header)
	return nil
}

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

const (
	apiTokenEnv = "SLUICE_TEST_API_TOKEN"
	apiToken    = "api-token-0123456789abcdef"
)
