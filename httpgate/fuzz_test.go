package httpgate_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/memory"
)

// FuzzDecisionAPI feeds arbitrary bodies to /v1/take and /v1/peek: every
// answer is a 200 decision or a 4xx with a reason, never a 5xx or a panic.
// The seeds run as an ordinary test.
func FuzzDecisionAPI(f *testing.F) {
	for _, s := range []string{
		`{"rule":"per-user","key":"u1","cost":1}`,
		`{"rule":"per-user","key":"u1","cost":0.5,"reserve":true}`,
		`{"takes":[{"rule":"per-user","key":"a"},{"rule":"per-org","key":"b","cost":3}]}`,
		`{"rule":"watch","key":""}`,
		`{"rule":"per-user","key":"u","cost":4}`,
		`{"rule":"per-user","key":"u","cost":-0}`,
		`{"rule":"per-user","key":"u","cost":1e-7}`,
		`{"rule":"per-user","key":"u","cost":9007199254740993}`,
		`{"rule":"nope"}`,
		`{"takes":[]}`,
		`{"takes":null,"rule":"per-user"}`,
		`{"rule":"per-user","key":"\u0000{x}|:"}`,
		`{`, `[]`, `null`, `""`, ``,
	} {
		f.Add(s)
	}
	clk := sluice.NewManualClock(sluiceEpoch)
	g := httpgate.New(mustPolicy(f, apiPolicy), sluice.New(memory.New(memory.Options{Clock: clk})), httpgate.Options{})
	h := g.Handler()
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range []string{"/v1/take", "/v1/peek"} {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest("POST", path, bytes.NewBufferString(body)))
			switch {
			case w.Code == http.StatusOK:
			case w.Code >= 400 && w.Code < 500:
				if !bytes.Contains(w.Body.Bytes(), []byte(`"detail"`)) {
					t.Fatalf("%s %q: %d without a reason: %s", path, body, w.Code, w.Body)
				}
			default:
				t.Fatalf("%s %q: status %d: %s", path, body, w.Code, w.Body)
			}
		}
	})
}

// FuzzForwardAuth feeds arbitrary forwarded headers from a trusted proxy to
// /v1/auth: the answer is 200, 429 or a 400 with a reason, never a 5xx or a
// panic.
func FuzzForwardAuth(f *testing.F) {
	f.Add("/a?x=1", "GET", "203.0.113.7", "example.com")
	f.Add("http://[::1", "POST", "garbage, 10.0.0.1", "")
	f.Add("/%zz", "", "::1", "a,b")
	f.Add("*", "CONNECT", "2001:db8::1", "[::1]:80")
	f.Add("/"+string(make([]byte, 300)), "\x00", "unknown", "x:y:z")
	g := httpgate.New(mustPolicy(f, `
trusted_proxies: ["192.0.2.0/24"]
forward_auth: {proxy: traefik}
rules:
  - name: per-ip
    limit_keys: ["ip:address", "path", "method", "host"]
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
`), sluice.New(memory.New(memory.Options{Clock: sluice.NewManualClock(sluiceEpoch)})), httpgate.Options{})
	h := g.Handler()
	f.Fuzz(func(t *testing.T, uri, method, xff, host string) {
		req := httptest.NewRequest("GET", "/v1/auth", nil)
		req.RemoteAddr = "192.0.2.1:5000"
		// Header values a real proxy could not send are dropped by
		// net/http's client; set them raw here anyway.
		req.Header["X-Forwarded-Uri"] = []string{uri}
		req.Header["X-Forwarded-Method"] = []string{method}
		req.Header["X-Forwarded-For"] = []string{xff}
		req.Header["X-Forwarded-Host"] = []string{host}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		switch w.Code {
		case http.StatusOK, http.StatusTooManyRequests:
		case http.StatusBadRequest:
			if !bytes.Contains(w.Body.Bytes(), []byte(`"detail"`)) {
				t.Fatalf("400 without a reason: %s", w.Body)
			}
		default:
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
	})
}
