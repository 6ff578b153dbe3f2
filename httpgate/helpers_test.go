package httpgate_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/lockedbuf"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
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

func mustPolicyF(f *testing.F, yaml string) *policy.Policy {
	f.Helper()
	p, err := policy.Parse("fuzz.yaml", []byte(yaml))
	if err != nil {
		f.Fatalf("policy: %v", err)
	}
	return p
}

func mustPolicy(t *testing.T, yaml string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("policy: %v", err)
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
