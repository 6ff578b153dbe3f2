package httpgate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"gopkg.in/yaml.v3"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/redis"
)

const apiPolicy = `
admin_token_env: SLUICE_TEST_ADMIN
rules:
  - name: per-user
    limit_keys: ["header:x-user"]
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 3}
  - name: per-org
    algorithm: token_bucket
    algorithm_config: {rps: 10, burst: 10}
  - name: watch
    mode: shadow
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
`

func TestTakeDecisions(t *testing.T) {
	e := newEnv(t, apiPolicy)
	for i, rem := range []int{2, 1, 0} {
		resp, m := e.post("/v1/take", `{"rule":"per-user","key":"u1","cost":1}`)
		if resp.StatusCode != 200 {
			t.Fatalf("take %d: status %d %v", i, resp.StatusCode, m)
		}
		wantFields(t, m, map[string]any{"allowed": true, "limit": 3, "remaining": rem, "retry_after_ms": 0,
			"reset_after_ms": (3 - rem) * 1000, "rule": "per-user", "reason": ""})
	}
	resp, m := e.post("/v1/take", `{"rule":"per-user","key":"u1"}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	wantFields(t, m, map[string]any{"allowed": false, "limit": 3, "remaining": 0, "retry_after_ms": 1000,
		"reset_after_ms": 3000, "rule": "per-user", "reason": "token_bucket_exceeded"})

	// Another key has its own bucket.
	_, m = e.post("/v1/take", `{"rule":"per-user","key":"u2"}`)
	wantFields(t, m, map[string]any{"allowed": true, "remaining": 2})

	// Time, not sleeping, refills.
	e.clk.Advance(1500 * time.Millisecond)
	_, m = e.post("/v1/take", `{"rule":"per-user","key":"u1","cost":0.5}`)
	wantFields(t, m, map[string]any{"allowed": true, "remaining": 1, "reset_after_ms": 2000})

	// A whole burst at once is fine.
	_, m = e.post("/v1/take", `{"rule":"per-user","key":"u3","cost":3}`)
	wantFields(t, m, map[string]any{"allowed": true, "remaining": 0, "reset_after_ms": 3000})
}

func TestPeekConsumesNothing(t *testing.T) {
	e := newEnv(t, apiPolicy)
	for i := 0; i < 5; i++ {
		_, m := e.post("/v1/peek", `{"rule":"per-user","key":"u1"}`)
		wantFields(t, m, map[string]any{"allowed": true, "limit": 3, "remaining": 2})
	}
	e.post("/v1/take", `{"rule":"per-user","key":"u1","cost":3}`)
	_, m := e.post("/v1/peek", `{"rule":"per-user","key":"u1"}`)
	wantFields(t, m, map[string]any{"allowed": false, "retry_after_ms": 1000, "reason": "token_bucket_exceeded"})
}

func TestTakesAllOrNothing(t *testing.T) {
	e := newEnv(t, apiPolicy)
	body := `{"takes":[{"rule":"per-user","key":"u1","cost":2},{"rule":"per-org","key":"acme","cost":4}]}`
	_, m := e.post("/v1/take", body)
	wantFields(t, m, map[string]any{"allowed": true, "rule": "per-user", "remaining": 1})
	takes, _ := m["takes"].([]any)
	if len(takes) != 2 {
		t.Fatalf("takes: %v", m)
	}
	wantFields(t, takes[0].(map[string]any), map[string]any{"allowed": true, "rule": "per-user", "key": "u1", "remaining": 1})
	wantFields(t, takes[1].(map[string]any), map[string]any{"allowed": true, "rule": "per-org", "key": "acme", "remaining": 6})

	// per-user has 1 left: the batch is rejected and per-org not charged.
	_, m = e.post("/v1/take", body)
	wantFields(t, m, map[string]any{"allowed": false, "rule": "per-user", "reason": "token_bucket_exceeded", "retry_after_ms": 1000})
	takes, _ = m["takes"].([]any)
	if len(takes) != 2 {
		t.Fatalf("takes: %v", m)
	}
	wantFields(t, takes[0].(map[string]any), map[string]any{"allowed": false, "reason": "token_bucket_exceeded", "remaining": 0})
	// per-org had room: not a cause, and it still holds its 6 tokens.
	wantFields(t, takes[1].(map[string]any), map[string]any{"allowed": false, "reason": "", "remaining": 6})
	_, m = e.post("/v1/peek", `{"rule":"per-org","key":"acme"}`)
	wantFields(t, m, map[string]any{"remaining": 5}) // 6 left; a take of 1 leaves 5
}

func TestShadowRuleNeverRejects(t *testing.T) {
	e := newEnv(t, apiPolicy)
	for i := 0; i < 3; i++ {
		_, m := e.post("/v1/take", `{"rule":"watch","key":"k"}`)
		wantFields(t, m, map[string]any{"allowed": true, "shadow": true})
		if i > 0 {
			wantFields(t, m, map[string]any{"reason": "token_bucket_exceeded"})
		}
	}
	if got := e.metrics(); !strings.Contains(got, `sluice_decisions_total{result="shadow_rejected",rule="watch"} 2`) {
		t.Errorf("metrics lack 2 shadow rejections:\n%s", grep(got, "sluice_decisions_total"))
	}
}

func TestTakeBadInput(t *testing.T) {
	e := newEnv(t, apiPolicy)
	cases := []struct {
		name, body string
		status     int
		detail     string
	}{
		{"malformed", `{"rule":`, 400, "malformed JSON: the body ends before the JSON value does"},
		{"syntax error", `{"rule" "per-user"}`, 400, "malformed JSON at byte 9: invalid character"},
		{"empty", ``, 400, "the body is empty"},
		{"blank", " \n\t", 400, "the body is empty"},
		{"not an object", `[1,2]`, 400, "the body: want an object, got an array"},
		{"a string", `"take"`, 400, "the body: want an object, got a string"},
		{"unknown field", `{"rule":"per-user","key":"u","weight":2}`, 400, `unknown field "weight"; the fields are rule, key, cost, reserve, takes`},
		{"misspelt field", `{"rule":"per-user","kye":"u"}`, 400, `unknown field "kye" (did you mean "key"?)`},
		{"trailing data", `{"rule":"per-user","key":"u"} {}`, 400, "unexpected data after the JSON value, which ends at byte 29"},
		{"trailing bracket", `{"rule":"per-user","key":"u"}]`, 400, "unexpected data after the JSON value"},
		{"unknown rule", `{"rule":"nope","key":"u"}`, 400, `unknown rule "nope"; the limits are: per-user, per-org, watch`},
		{"misspelt rule", `{"rule":"per-usr","key":"u"}`, 400, `unknown rule "per-usr" (did you mean "per-user"?)`},
		{"no rule", `{"key":"u"}`, 400, `"rule" is required`},
		{"no key", `{"rule":"per-user"}`, 400, `"key" is required`},
		{"empty key", `{"rule":"per-user","key":""}`, 400, `"key" is required`},
		{"no key in batch", `{"takes":[{"rule":"per-org","key":"x"},{"rule":"per-org"}]}`, 400, `takes[1]: "key" is required`},
		{"nothing", `{}`, 400, `give "rule" and "key", or "takes"`},
		{"null", `null`, 400, `give "rule" and "key", or "takes"`},
		{"empty batch", `{"takes":[]}`, 400, `"takes" is empty`},
		{"number key", `{"rule":"per-user","key":42}`, 400, "key: want a string, got a number"},
		{"zero cost", `{"rule":"per-user","key":"u","cost":0}`, 400, `cost 0 takes nothing: give a cost > 0, or leave "cost" out to take 1 token`},
		{"negative cost", `{"rule":"per-user","key":"u","cost":-1}`, 400, `limit "per-user": cost -1 must be a number > 0`},
		{"tiny cost", `{"rule":"per-user","key":"u","cost":1e-9}`, 400, `limit "per-user": cost 1e-09 is below one micro-token (0.000001), the least every store counts`},
		{"cost too large to count", `{"rule":"per-user","key":"u","cost":1e300}`, 422, `limit "per-user": cost 1e+300 is above the capacity (3): it can never succeed`},
		{"string cost", `{"rule":"per-user","key":"u","cost":"1"}`, 400, "cost: want a number, got a string"},
		{"overflowing cost", `{"rule":"per-user","key":"u","cost":1e999}`, 400, "cost: 1e999 is out of range"},
		{"string reserve", `{"rule":"per-user","key":"u","reserve":"yes"}`, 400, "reserve: want true or false, got a string"},
		{"takes not a list", `{"takes":{"rule":"per-org"}}`, 400, "takes: want an array, got an object"},
		{"take not an object", `{"takes":[{"rule":"per-org","key":"x"},7]}`, 400, "takes[1]: want an object, got a number"},
		{"string cost in batch", `{"takes":[{"rule":"per-org","key":"x"},{"rule":"per-org","key":"y","cost":"2"}]}`, 400, "takes[1].cost: want a number, got a string"},
		{"unknown field in batch", `{"takes":[{"rule":"per-org","key":"x","cots":2}]}`, 400, `takes[0]: unknown field "cots" (did you mean "cost"?); the fields are rule, key, cost, reserve`},
		{"both shapes", `{"rule":"per-user","key":"u","takes":[{"rule":"per-org","key":"x"}]}`, 400, "not both"},
		{"bad take in batch", `{"takes":[{"rule":"per-org","key":"x"},{"rule":"zzz","key":"x"}]}`, 400, `takes[1]: unknown rule "zzz"`},
		{"long key", `{"rule":"per-user","key":"` + strings.Repeat("k", 2000) + `"}`, 400, "key is 2000 bytes"},
		{"cost above burst", `{"rule":"per-user","key":"u","cost":4}`, 422, "can never succeed"},
		{"cost above burst in batch", `{"takes":[{"rule":"per-org","key":"x","cost":11}]}`, 422, "can never succeed"},
		{"huge body", `{"rule":"per-user","key":"u","x":"` + strings.Repeat("a", 70<<10) + `"}`, 413, "larger than"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, m := e.post("/v1/take", c.body)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d (%v)", resp.StatusCode, c.status, m)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type %q", ct)
			}
			d, _ := m["detail"].(string)
			if !strings.Contains(d, c.detail) {
				t.Errorf("detail %q, want it to mention %q", d, c.detail)
			}
			wantNoInternals(t, d)
			wantFields(t, m, map[string]any{"status": c.status})
		})
	}
	// Nothing above charged anything.
	_, m := e.post("/v1/peek", `{"rule":"per-user","key":"u"}`)
	wantFields(t, m, map[string]any{"remaining": 2})

	if n := e.store.Len(); n != 0 {
		t.Errorf("refused takes created %d keys", n)
	}
}

// Attack: a body that runs past the length it declared, or declares
// none, is read no further than the bound either way: a handler that
// trusts the declared length to skip its own reader still stops at the
// bound, answers 413 and has the connection closed.
func TestAttackTakeBodyPastItsLength(t *testing.T) {
	e := newEnv(t, apiPolicy)
	huge := `{"rule":"per-user","key":"u","x":"` + strings.Repeat("a", 70<<10) + `"}`
	r := httptest.NewRequest("POST", "/v1/take", strings.NewReader(huge))
	r.ContentLength = 30 // a lie: the server would have cut it there
	w := httptest.NewRecorder()
	e.gate.Handler().ServeHTTP(w, r)
	if w.Code != http.StatusRequestEntityTooLarge || !strings.Contains(w.Body.String(), "larger than 65536 bytes") {
		t.Errorf("declared short: %d %s", w.Code, w.Body)
	}
	if c := w.Header().Get("Connection"); c != "close" {
		t.Errorf("declared short: Connection %q, want close", c)
	}
	// No declared length (chunked), through the server.
	req, err := http.NewRequest("POST", e.srv.URL+"/v1/take", io.MultiReader(strings.NewReader(huge)))
	if err != nil {
		t.Fatal(err)
	}
	resp, m := e.do(req)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(fmt.Sprint(m["detail"]), "larger than 65536 bytes") {
		t.Errorf("chunked: %d %v", resp.StatusCode, m)
	}
	if n := e.store.Len(); n != 0 {
		t.Errorf("refused takes created %d keys", n)
	}
}

// wantNoInternals fails when a problem's detail speaks of the server's
// code (Go types, encoding/json) rather than of the request.
func wantNoInternals(t *testing.T, detail string) {
	t.Helper()
	for _, bad := range []string{"Go struct", "Go value", "json:", "httpgate", "TakeRequest", "TakeItem", "ResetRequest", "float64", "[]", "unmarshal"} {
		if strings.Contains(detail, bad) {
			t.Errorf("detail %q speaks of %q", detail, bad)
		}
	}
}

func TestResetNeedsAdminToken(t *testing.T) {
	e := newEnv(t, apiPolicy)
	e.post("/v1/take", `{"rule":"per-user","key":"u1","cost":3}`)

	// No token in the environment: the admin API is off, not open.
	resp, m := e.post("/v1/reset", `{"rule":"per-user","key":"u1"}`, "Authorization", "Bearer ")
	if resp.StatusCode != 403 || !strings.Contains(fmt.Sprint(m["detail"]), "disabled") {
		t.Fatalf("without a configured token: %d %v", resp.StatusCode, m)
	}

	e.env["SLUICE_TEST_ADMIN"] = "s3cret-token"
	for _, auth := range []string{"", "Bearer wrong", "Basic s3cret-token", "Bearer s3cret-token2", "bearer"} {
		resp, m := e.post("/v1/reset", `{"rule":"per-user","key":"u1"}`, "Authorization", auth)
		if resp.StatusCode != 401 || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("Authorization %q: %d %v", auth, resp.StatusCode, m)
		}
	}
	_, m = e.post("/v1/peek", `{"rule":"per-user","key":"u1"}`)
	wantFields(t, m, map[string]any{"allowed": false})

	resp, m = e.post("/v1/reset", `{"rule":"nope","key":"u1"}`, "Authorization", "Bearer s3cret-token")
	if resp.StatusCode != 400 {
		t.Errorf("unknown rule: %d %v", resp.StatusCode, m)
	}
	resp, m = e.post("/v1/reset", `{"rule":"per-user","key":"u1"}`, "Authorization", "Bearer s3cret-token")
	if resp.StatusCode != 200 {
		t.Fatalf("reset: %d %v", resp.StatusCode, m)
	}
	_, m = e.post("/v1/peek", `{"rule":"per-user","key":"u1"}`)
	wantFields(t, m, map[string]any{"allowed": true, "remaining": 2})
}

func TestHealthAndReady(t *testing.T) {
	e := newEnv(t, apiPolicy)
	for _, p := range []string{"/healthz", "/readyz"} {
		if resp, _ := e.get(p); resp.StatusCode != 200 {
			t.Errorf("%s: %d", p, resp.StatusCode)
		}
	}
	if n := e.store.Len(); n != 0 {
		t.Errorf("readyz left %d keys in the store", n)
	}
	if resp, _ := e.get("/healthcheck"); resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
		t.Errorf("/healthcheck: %d %v", resp.StatusCode, resp.Header)
	}
	e.gate.Drain()
	if resp, _ := e.get("/readyz"); resp.StatusCode != 503 {
		t.Errorf("draining /readyz: %d", resp.StatusCode)
	}
	if resp, _ := e.get("/healthcheck"); resp.StatusCode != 500 {
		t.Errorf("draining /healthcheck: %d, want 500 as the reference's", resp.StatusCode)
	}
}

// A Redis Cluster with one primary of three dead serves two thirds of its
// slots: /readyz stays ready, by the store's own rule (a node answers),
// even when the dead primary serves the key a peek would read, and when
// its breaker has opened. Every primary dead is not ready.
func TestReadyWhileOnePrimaryIsDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of its own")
	}
	srvs, addrs := redistest.Primaries(t, 3)
	st, err := redis.Open("redis+cluster://"+strings.Join(addrs, ","), redis.Options{NoOverLimitCache: true, BreakerBackoff: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m := metrics.New(prometheus.NewRegistry())
	g := httpgate.New(mustPolicy(t, apiPolicy), sluice.New(m.InstrumentStore(st)), httpgate.Options{Metrics: m})
	ctx := context.Background()
	if err := g.Ready(ctx); err != nil {
		t.Fatalf("not ready with every primary up: %v", err)
	}
	// The primary of the key a readiness peek reads: the one whose GET
	// of it is not redirected (MOVED).
	probe := sluice.MustLimit(sluice.Spec{Name: "sluice-readyz", TokensPerSecond: 1, Burst: 1}).StorageKey("probe")
	var victim *redistest.Proc
	for _, p := range srvs {
		if out, err := redistest.CLI(p.Addr(), "GET", probe); err == nil && !strings.Contains(out, "MOVED") {
			victim = p
		}
	}
	if victim == nil {
		t.Fatalf("no primary serves %s", probe)
	}
	victim.Stop()
	// Enough probes to open the dead primary's breaker (five failures).
	for i := range 20 {
		if err := g.Ready(ctx); err != nil {
			t.Fatalf("probe %d after a primary died: not ready: %v", i, err)
		}
	}
	for _, p := range srvs {
		p.Stop()
	}
	for i := 0; g.Ready(ctx) == nil; i++ {
		if i == 20 {
			t.Fatal("ready with every primary dead")
		}
	}
}

// grep returns the lines of s containing sub.
func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Every error the listeners answer, from the decision API, reset, the
// router and forward auth, is application/problem+json whose detail speaks
// of the request, never of the server's code.
func TestErrorsAreProblems(t *testing.T) {
	e := newEnv(t, apiPolicy)
	e.env["SLUICE_TEST_ADMIN"] = "s3cret-token"
	admin := []string{"Authorization", "Bearer s3cret-token"}
	cases := []struct {
		method, path, body string
		hdr                []string
		status             int
		detail, allow      string
	}{
		{"GET", "/v1/take", "", nil, 405, "/v1/take takes POST", "POST"},
		{"GET", "/v1/peek", "", nil, 405, "/v1/peek takes POST", "POST"},
		{"HEAD", "/v1/take", "", nil, 405, "", "POST"},
		{"PUT", "/v1/reset", "", nil, 405, "/v1/reset takes POST", "POST"},
		{"POST", "/healthz", "", nil, 405, "/healthz takes GET or HEAD", "GET, HEAD"},
		{"DELETE", "/metrics", "", nil, 405, "", "GET, HEAD"},
		{"POST", "/", "", nil, 405, "/ takes GET or HEAD", "GET, HEAD"},
		{"GET", "/nope", "", nil, 404, "GET / lists the endpoints", ""},
		{"POST", "/v1/take/", `{"rule":"per-user","key":"u"}`, nil, 404, "GET / lists the endpoints", ""},
		{"POST", "/v1/takes", `{"rule":"per-user","key":"u"}`, nil, 404, "GET / lists the endpoints", ""},
		{"GET", "/v2/take", "", nil, 404, "", ""},
		{"POST", "/v1/take", `{"rule":1,"key":"u"}`, nil, 400, "rule: want a string, got a number", ""},
		{"POST", "/v1/take", `{"rule":"per-user","key":["u"]}`, nil, 400, "key: want a string, got an array", ""},
		{"POST", "/v1/take", `{"rule":"per-user","key":{"id":1}}`, nil, 400, "key: want a string, got an object", ""},
		{"POST", "/v1/take", `{"rule":"per-user","key":true}`, nil, 400, "key: want a string, got true or false", ""},
		{"POST", "/v1/take", `{"takes":[{"rule":"per-org","key":"x","reserve":1}]}`, nil, 400, "takes[0].reserve: want true or false, got a number", ""},
		{"POST", "/v1/take", `{"takes":[{"rule":"per-org","key":"x"},{"rule":["per-org"],"key":"y"}]}`, nil, 400, "takes[1].rule: want a string, got an array", ""},
		{"POST", "/v1/take", `{"takes":"all"}`, nil, 400, "takes: want an array, got a string", ""},
		{"POST", "/v1/peek", `{"rule":"per-user","key":1.5}`, nil, 400, "key: want a string, got a number", ""},
		{"POST", "/v1/peek", `{"rule":"per-user","key":"u"`, nil, 400, "malformed JSON", ""},
		{"POST", "/v1/peek", `{"rule":'per-user'}`, nil, 400, "malformed JSON at byte 9", ""},
		{"POST", "/v1/peek", "\xff", nil, 400, "malformed JSON at byte 1", ""},
		{"POST", "/v1/reset", `{"rule":"per-user","key":7}`, admin, 400, "key: want a string, got a number", ""},
		{"POST", "/v1/reset", `{"rule":"per-user","key":"u","cost":1}`, admin, 400, `unknown field "cost"; the fields are rule, key`, ""},
		{"POST", "/v1/reset", `{"rule":"per-user"}`, admin, 400, `"key" is required`, ""},
		{"POST", "/v1/reset", `{"rule":"per-usr","key":"u"}`, admin, 400, `unknown rule "per-usr" (did you mean "per-user"?)`, ""},
		{"POST", "/v1/reset", ``, admin, 400, "the body is empty", ""},
		{"POST", "/v1/reset", `{"rule":"per-user","key":"u"}`, nil, 401, "admin token", ""},
		{"GET", "/v1/auth?deny_status=abc", "", nil, 400, "deny_status", ""},
	}
	for _, c := range cases {
		req, err := http.NewRequest(c.method, e.srv.URL+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(c.hdr); i += 2 {
			req.Header.Set(c.hdr[i], c.hdr[i+1])
		}
		resp, m := e.do(req)
		what := c.method + " " + c.path + " " + c.body
		if resp.StatusCode != c.status || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: %d %q, want %d application/problem+json", what, resp.StatusCode, resp.Header.Get("Content-Type"), c.status)
			continue
		}
		if got := resp.Header.Get("Allow"); got != c.allow {
			t.Errorf("%s: Allow %q, want %q", what, got, c.allow)
		}
		if c.method == "HEAD" {
			continue
		}
		d, _ := m["detail"].(string)
		if !strings.Contains(d, c.detail) {
			t.Errorf("%s: detail %q, want it to mention %q", what, d, c.detail)
		}
		wantNoInternals(t, d)
		wantFields(t, m, map[string]any{"status": c.status, "type": "about:blank"})
	}
	if n := e.store.Len(); n != 0 {
		t.Errorf("refused requests created %d keys", n)
	}
}

// GET / lists the endpoints the listener serves, each of which answers
// its method, and GET /openapi.yaml is api/openapi.yaml.
func TestIndexListsEndpoints(t *testing.T) {
	e := newEnv(t, apiPolicy)
	spec, err := os.ReadFile("../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(spec, &doc); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name       string
		h          http.Handler
		want, lack []string
	}{
		{"one listener", e.gate.Handler(), []string{"POST /v1/take", "POST /v1/peek", "POST /v1/reset", "ANY /v1/auth", "GET /metrics", "GET /healthz", "GET /readyz", "GET /openapi.yaml", "GET /"}, nil},
		{"forward auth", e.gate.AuthHandler(), []string{"ANY /v1/auth", "GET /healthz", "GET /readyz", "GET /openapi.yaml", "GET /"}, []string{"POST /v1/take", "GET /metrics"}},
		{"decision API", e.gate.APIHandler(), []string{"POST /v1/take", "POST /v1/reset", "GET /metrics", "GET /"}, []string{"ANY /v1/auth"}},
	} {
		srv := httptest.NewServer(c.h)
		t.Cleanup(srv.Close)
		resp, err := http.Get(srv.URL + "/")
		if err != nil {
			t.Fatal(err)
		}
		var idx httpgate.Index
		err = json.NewDecoder(resp.Body).Decode(&idx)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || idx.OpenAPI != "/openapi.yaml" {
			t.Fatalf("%s: GET /: %d %q %+v %v", c.name, resp.StatusCode, resp.Header.Get("Content-Type"), idx, err)
		}
		listed := map[string]bool{}
		for _, ep := range idx.Endpoints {
			listed[ep.Method+" "+ep.Path] = true
			if ep.About == "" {
				t.Errorf("%s: %s %s has no description", c.name, ep.Method, ep.Path)
			}
			// Each listed endpoint is described and served: not a 404 or 405.
			m := ep.Method
			if m == "ANY" {
				m = "PATCH"
			}
			if _, ok := doc.Paths[ep.Path][strings.ToLower(m)]; !ok {
				t.Errorf("%s: %s %s is not in api/openapi.yaml", c.name, m, ep.Path)
			}
			req, _ := http.NewRequest(m, srv.URL+ep.Path, strings.NewReader(`{"rule":"per-org","key":"index"}`))
			r, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			r.Body.Close()
			if r.StatusCode == 404 || r.StatusCode == 405 {
				t.Errorf("%s: %s %s is listed but answers %d", c.name, m, ep.Path, r.StatusCode)
			}
		}
		for _, w := range c.want {
			if !listed[w] {
				t.Errorf("%s: index lacks %s: %+v", c.name, w, idx.Endpoints)
			}
		}
		for _, l := range c.lack {
			if listed[l] {
				t.Errorf("%s: index lists %s, which this listener does not serve", c.name, l)
			}
		}
		resp, err = http.Get(srv.URL + "/openapi.yaml")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/yaml" || !bytes.Equal(body, spec) {
			t.Errorf("%s: GET /openapi.yaml: %d %q, %d bytes (the file has %d)", c.name, resp.StatusCode, resp.Header.Get("Content-Type"), len(body), len(spec))
		}
	}
}

// An unknown rule's error lists the policy's limits, at most 20 of them,
// and suggests the closest.
func TestUnknownRuleListsLimits(t *testing.T) {
	var b strings.Builder
	b.WriteString("rules:\n")
	for i := range 30 {
		fmt.Fprintf(&b, "  - name: rule-%02d\n    algorithm_config: {rps: 1, burst: 1}\n", i)
	}
	b.WriteString("  - name: api\n    tiers:\n      - {name: gold, match: {header:x-plan: gold}, algorithm_config: {rps: 1, burst: 1}}\n      - {name: free, algorithm_config: {rps: 1, burst: 1}}\n")
	e := newEnv(t, b.String())
	resp, m := e.post("/v1/take", `{"rule":"rule-7","key":"u"}`)
	d, _ := m["detail"].(string)
	if resp.StatusCode != 400 || !strings.Contains(d, `unknown rule "rule-7" (did you mean "rule-07"?); the limits are: rule-00, rule-01,`) ||
		!strings.Contains(d, "rule-19 and 12 more") || strings.Contains(d, "rule-20") {
		t.Errorf("%d %q", resp.StatusCode, d)
	}
	// Case is not a typo worth a miss.
	if _, m := e.post("/v1/take", `{"rule":"RULE-07","key":"u"}`); !strings.Contains(m["detail"].(string), `did you mean "rule-07"?`) {
		t.Errorf("RULE-07: %v", m["detail"])
	}
	// A tiered rule without a limit of its own names its tiers.
	if _, m := e.post("/v1/take", `{"rule":"api","key":"u"}`); !strings.Contains(m["detail"].(string), "name a tier (api.gold, api.free)") {
		t.Errorf("api: %v", m["detail"])
	}
	if resp, m := e.post("/v1/take", `{"rule":"api.free","key":"u"}`); resp.StatusCode != 200 {
		t.Errorf("api.free: %d %v", resp.StatusCode, m)
	}
}

// A file in envoyproxy/ratelimit's format: /v1/take reaches its limits by
// the file's own names (per-address) and by their rule names
// (envoy.edge.remote_address.b8139932fb309819), an unknown name's error lists both, and a take under
// the key the Envoy service builds for a descriptor shares its bucket.
func TestReferenceFileNames(t *testing.T) {
	data, err := os.ReadFile("../examples/ratelimit-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := envoyrls.ParseReferenceConfig("ratelimit-config.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvPolicy(t, p, nil)
	const key = "remote_address=198.51.100.8"
	resp, m := e.post("/v1/take", `{"rule":"per-address","key":"`+key+`"}`)
	if resp.StatusCode != 200 {
		t.Fatalf("per-address: %d %v", resp.StatusCode, m)
	}
	wantFields(t, m, map[string]any{"allowed": true, "rule": "envoy.edge.remote_address.b8139932fb309819", "limit": 600, "remaining": 599})
	_, m = e.post("/v1/peek", `{"rule":"envoy.edge.remote_address.b8139932fb309819","key":"`+key+`"}`)
	wantFields(t, m, map[string]any{"allowed": true, "remaining": 598})
	// shadow_mode holds on the decision API too.
	_, m = e.post("/v1/take", `{"rule":"tenant-trial","key":"t"}`)
	wantFields(t, m, map[string]any{"allowed": true, "shadow": true, "rule": "envoy.edge.tenant.81040c135a462f13"})

	srv := envoyrls.New(p, e.gate.Limiter(), envoyrls.Options{})
	out, err := srv.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "198.51.100.8"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if st := out.Statuses[0]; st.LimitRemaining != 598 {
		t.Errorf("Envoy's call after one take: %d remaining, want 598 (one bucket)", st.LimitRemaining)
	}

	resp, m = e.post("/v1/take", `{"rule":"per-adress","key":"k"}`)
	d, _ := m["detail"].(string)
	if resp.StatusCode != 400 || !strings.Contains(d, `unknown rule "per-adress" (did you mean "per-address"?); the limits are: envoy.edge.remote_address.b8139932fb309819 (per-address), envoy.edge.client_id.5e4498c45d97a14d (search-per-client), envoy.edge.client_id_batch-importer.5a4a19c195d92c6c, envoy.edge.user_agent_bot-_.4e867b9753289f01 (bots)`) {
		t.Errorf("%d %q", resp.StatusCode, d)
	}
}

// Attack: anyone who reaches the decision API drains anyone's bucket.
// POST /v1/take {"rule":"per-ip","key":<victim's address>,"cost":<burst>}
// made the victim's next forward-auth call a 429 (and minted keys at will).
// With api_token_env set, a take without the token, or with a wrong one, is
// a 401 that charges nothing, so the victim is still admitted.
func TestAttackDrainAnothersBucketNeedsToken(t *testing.T) {
	e := newClosedEnv(t, closedPolicy)
	drain := `{"rule":"per-ip","key":"127.0.0.1","cost":2}`
	for _, hdr := range [][]string{
		nil,
		{"Authorization", "Bearer wrong-token-0123456789abcdef"},
		{"Authorization", "Bearer " + apiToken + "x"},
		{"Authorization", "Basic " + apiToken},
		{"Authorization", apiToken},
		// The forward-auth header does not open /v1/take: one way in per endpoint.
		{"X-Sluice-Token", apiToken},
	} {
		resp, m := e.post("/v1/take", drain, hdr...)
		wantUnauthorized(t, "take with "+strings.Join(hdr, ": "), resp, m)
		resp, m = e.post("/v1/peek", drain, hdr...)
		wantUnauthorized(t, "peek with "+strings.Join(hdr, ": "), resp, m)
	}
	if n := e.store.Len(); n != 0 {
		t.Fatalf("refused takes created %d keys", n)
	}
	// The victim (127.0.0.1 through forward auth) keeps its whole burst.
	for i := 0; i < 2; i++ {
		if resp, m := e.get("/v1/auth", "X-Sluice-Token", apiToken); resp.StatusCode != 200 {
			t.Fatalf("victim's request %d: %d %v", i, resp.StatusCode, m)
		}
	}

	// The token's holder is served; the scheme is case-insensitive.
	for _, scheme := range []string{"Bearer ", "bearer ", "BEARER  "} {
		resp, m := e.post("/v1/peek", `{"rule":"per-ip","key":"10.0.0.1"}`, "Authorization", scheme+apiToken)
		if resp.StatusCode != 200 || m["allowed"] != true {
			t.Errorf("peek with %q: %d %v", scheme, resp.StatusCode, m)
		}
	}
	resp, m := e.post("/v1/take", `{"rule":"per-ip","key":"10.0.0.1","cost":2}`, "Authorization", "Bearer "+apiToken)
	if resp.StatusCode != 200 || m["allowed"] != true {
		t.Errorf("take with the token: %d %v", resp.StatusCode, m)
	}
}

// Attack: without api_token_env the decision API's guard is its private
// address, which a browser inside the network crosses: a page's no-cors
// POST as text/plain needs no preflight, and DNS rebinding makes the page
// same-origin. Browsers send Origin with every POST, services none, so a
// take or peek with an Origin is refused there and charges nothing.
func TestAttackBrowserDrainsTokenlessAPI(t *testing.T) {
	e := newEnv(t, apiPolicy)
	drain := `{"rule":"per-user","key":"victim","cost":3}`
	for _, origin := range []string{"https://evil.example", "null", e.srv.URL} {
		for _, path := range []string{"/v1/take", "/v1/peek"} {
			if resp, m := e.post(path, drain, "Origin", origin, "Content-Type", "text/plain"); resp.StatusCode != http.StatusForbidden {
				t.Errorf("%s from Origin %s: %d %v, want 403", path, origin, resp.StatusCode, m)
			}
		}
	}
	if n := e.store.Len(); n != 0 {
		t.Fatalf("refused takes created %d keys", n)
	}
	if resp, m := e.post("/v1/take", drain); resp.StatusCode != 200 || m["allowed"] != true {
		t.Fatalf("a service's take: %d %v", resp.StatusCode, m)
	}
}

// Attack (RFC 9110 section 11.1: the auth scheme is case-insensitive):
// /v1/reset refused "bearer TOKEN" that /v1/auth's JWT reading accepts.
// One parser reads bearer tokens everywhere now.
func TestAttackLowercaseBearerReset(t *testing.T) {
	e := newEnv(t, apiPolicy)
	e.env["SLUICE_TEST_ADMIN"] = "s3cret-token"
	for _, auth := range []string{"bearer s3cret-token", "BEARER s3cret-token", "Bearer  s3cret-token"} {
		resp, m := e.post("/v1/reset", `{"rule":"per-user","key":"u1"}`, "Authorization", auth)
		if resp.StatusCode != 200 {
			t.Errorf("Authorization %q: %d %v", auth, resp.StatusCode, m)
		}
	}
	for _, auth := range []string{"bearers3cret-token", "Bearer", "Token s3cret-token"} {
		resp, m := e.post("/v1/reset", `{"rule":"per-user","key":"u1"}`, "Authorization", auth)
		if resp.StatusCode != 401 {
			t.Errorf("Authorization %q: %d %v", auth, resp.StatusCode, m)
		}
	}
}

// Attack: a finite cost too large for the arithmetic's range (1e308) got a
// 400 "invalid cost" where every other cost above the burst gets the 422
// that tells the caller no wait will ever help.
func TestAttackHugeFiniteCost(t *testing.T) {
	e := newEnv(t, apiPolicy)
	for _, body := range []string{
		`{"rule":"per-user","key":"u","cost":1e308}`,
		`{"rule":"per-user","key":"u","cost":1.7976931348623157e308}`,
		`{"rule":"per-user","key":"u","cost":1e20}`,
		`{"takes":[{"rule":"per-org","key":"x"},{"rule":"per-user","key":"u","cost":1e308}]}`,
	} {
		for _, path := range []string{"/v1/take", "/v1/peek"} {
			resp, m := e.post(path, body)
			if resp.StatusCode != 422 || resp.Header.Get("Content-Type") != "application/problem+json" ||
				!strings.Contains(m["detail"].(string), "can never succeed") {
				t.Errorf("%s %s: %d %v", path, body, resp.StatusCode, m)
			}
		}
	}
	if n := e.store.Len(); n != 0 {
		t.Errorf("refused costs created %d keys", n)
	}
}

// Attack: the decision API reachable wherever forward auth is. Split, the
// listener facing the front proxy serves forward auth and health only, and
// the decision API's listener serves no forward auth.
func TestAttackAPISplitServesOnlyItsEndpoints(t *testing.T) {
	e := newEnv(t, apiPolicy)
	e.env["SLUICE_TEST_ADMIN"] = "s3cret-token"
	auth := httptest.NewServer(e.gate.AuthHandler())
	t.Cleanup(auth.Close)
	api := httptest.NewServer(e.gate.APIHandler())
	t.Cleanup(api.Close)
	do := func(base, method, path, body string) int {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer s3cret-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	take := `{"rule":"per-user","key":"u1"}`
	for _, c := range []struct {
		base, method, path string
		want               int
	}{
		{auth.URL, "POST", "/v1/take", 404},
		{auth.URL, "POST", "/v1/peek", 404},
		{auth.URL, "POST", "/v1/reset", 404},
		{auth.URL, "GET", "/metrics", 404},
		{auth.URL, "GET", "/v1/auth", 200},
		{auth.URL, "GET", "/healthz", 200},
		{auth.URL, "GET", "/readyz", 200},
		{api.URL, "GET", "/v1/auth", 404},
		{api.URL, "POST", "/v1/auth", 404},
		{api.URL, "POST", "/v1/take", 200},
		{api.URL, "POST", "/v1/peek", 200},
		{api.URL, "POST", "/v1/reset", 200},
		{api.URL, "GET", "/metrics", 200},
		{api.URL, "GET", "/healthz", 200},
	} {
		if got := do(c.base, c.method, c.path, take); got != c.want {
			name := "auth"
			if c.base == api.URL {
				name = "api"
			}
			t.Errorf("%s listener: %s %s: %d, want %d", name, c.method, c.path, got, c.want)
		}
	}
}

// Attack: a take without a key shared one bucket with every other caller
// that left it out. {"rule":"per-org"} was the empty key's bucket: one
// caller's omission drained it for all of them (and a typo, "kye", is an
// unknown field, but a forgotten key was silently everyone's). A take or
// reset without a key, or with an empty one, is a 400 that charges
// nothing.
func TestAttackMissingKeySharesOneBucket(t *testing.T) {
	e := newEnv(t, apiPolicy)
	e.env["SLUICE_TEST_ADMIN"] = "s3cret-token"
	for _, c := range []struct{ path, body string }{
		{"/v1/take", `{"rule":"per-org","cost":10}`},
		{"/v1/take", `{"rule":"per-org","key":"","cost":10}`},
		{"/v1/take", `{"rule":"per-org","key":null,"cost":10}`},
		{"/v1/take", `{"takes":[{"rule":"per-user","key":"u"},{"rule":"per-org","cost":10}]}`},
		{"/v1/peek", `{"rule":"per-org"}`},
		{"/v1/reset", `{"rule":"per-org"}`},
	} {
		resp, m := e.post(c.path, c.body, "Authorization", "Bearer s3cret-token")
		if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/problem+json" ||
			!strings.Contains(m["detail"].(string), `"key" is required`) {
			t.Errorf("%s %s: %d %v", c.path, c.body, resp.StatusCode, m)
		}
	}
	if n := e.store.Len(); n != 0 {
		t.Errorf("takes without a key created %d keys", n)
	}
}

// Attack: the decision API repeated an unknown rule name whole: a 60 KiB
// name came back in a 60 KiB problem, from every request, to whatever
// reads the answers (or logs them). The name is cut to its start, and a
// name no edit could bring within reach of a rule costs no comparisons.
func TestAttackUnknownRuleReflected(t *testing.T) {
	e := newEnv(t, apiPolicy)
	e.env["SLUICE_TEST_ADMIN"] = "s3cret-token"
	long := strings.Repeat("<script>", 60<<10/8)
	for _, path := range []string{"/v1/take", "/v1/peek", "/v1/reset"} {
		resp, m := e.post(path, `{"rule":"`+long+`","key":"k"}`, "Authorization", "Bearer s3cret-token")
		d, _ := m["detail"].(string)
		if resp.StatusCode != 400 || len(d) > 1024 || !strings.Contains(d, "unknown rule") || !strings.Contains(d, "per-user") {
			t.Errorf("%s: %d, detail of %d bytes: %.200q", path, resp.StatusCode, len(d), d)
		}
	}
}

// Attack: on a sharded rule with on_store_error: allow, a caller of the
// decision API asks for a cost within the burst but above what two
// shards hold together. Judged against the burst alone, the limiter
// would refuse it, that refusal would be taken for a store failure, and
// on_store_error: allow would answer allowed, charging nothing, every
// time. It must be the 422 of a cost that can never succeed.
func TestAttackShardedCostAboveTwoShards(t *testing.T) {
	e := newEnv(t, `rules:
  - name: hot
    on_store_error: allow
    algorithm_config: {rps: 10, burst: 100, shards: 10}
`)
	for _, path := range []string{"/v1/take", "/v1/peek"} {
		resp, m := e.post(path, `{"rule":"hot","key":"*","cost":50}`)
		detail, _ := m["detail"].(string)
		if resp.StatusCode != 422 || !strings.Contains(detail, "what two of its 10 shards hold together (20") || !strings.Contains(detail, "can never succeed") {
			t.Errorf("%s cost 50 of 10 shards of 10: %d %v", path, resp.StatusCode, m)
		}
	}
	if n := e.store.Len(); n != 0 {
		t.Errorf("refused costs created %d keys", n)
	}
	if resp, m := e.post("/v1/take", `{"rule":"hot","key":"*","cost":20}`); resp.StatusCode != 200 || m["allowed"] != true || m["limit"] != float64(100) {
		t.Errorf("cost 20, what two full shards hold: %d %v", resp.StatusCode, m)
	}
}

// A decision's working memory is pooled (policy.Scratch, the decision
// API's read body): nothing of one request may reach the next. After a
// drained client's request, a new client, or one with no key at all, is
// judged as itself, never as the client before it, on forward auth and
// on the decision API alike.
func TestAttackPooledMemoryCarriesNothingOver(t *testing.T) {
	e := newEnv(t, `
rules:
  - name: per-user
    limit_keys: ["query:user", "header:X-Team"]
    missing_key: skip
    algorithm_config: {rps: 1, burst: 1}
`)
	auth := func(query string, hdr ...string) int {
		resp, _ := e.get("/v1/auth"+query, hdr...)
		return resp.StatusCode
	}
	if got := statuses(t, 2, func(int) int { return auth("?user=alice", "X-Team", "red") }); got != "200 429" {
		t.Fatalf("alice: %s, want 200 429", got)
	}
	for i := range 20 {
		if got := auth("?user=alice", "X-Team", "red"); got != 429 {
			t.Fatalf("round %d: drained alice %d, want 429", i, got)
		}
		if got := auth(fmt.Sprintf("?user=bob%d", i), "X-Team", "red"); got != 200 {
			t.Fatalf("round %d: a new user after alice: %d, want 200", i, got)
		}
		if got := auth("?user=alice", "X-Team", fmt.Sprintf("blue%d", i)); got != 200 {
			t.Fatalf("round %d: alice of a new team: %d, want 200", i, got)
		}
		if got := auth(""); got != 200 {
			t.Fatalf("round %d: no key after alice: %d, want 200 (skipped)", i, got)
		}
	}

	take := func(key string) string {
		resp, body := e.post("/v1/take", `{"rule":"per-user","key":"`+key+`"}`)
		return fmt.Sprint(resp.StatusCode, body["allowed"])
	}
	if got := take("carol"); got != "200 true" {
		t.Fatalf("carol's first take: %s", got)
	}
	for i := range 20 {
		if got := take("carol"); got != "200 false" {
			t.Fatalf("round %d: drained carol: %s, want 200 false", i, got)
		}
		if got := take(fmt.Sprintf("dave%d", i)); got != "200 true" {
			t.Fatalf("round %d: a new key after carol: %s, want 200 true", i, got)
		}
	}
}
