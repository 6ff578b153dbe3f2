package httpgate_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/policy"
)

// The example of the source format: 100 rps, burst 200.
const orgPolicy = `
rules:
  - name: per-org-rps
    limit_keys: ["header:x-org"]
    algorithm: token_bucket
    algorithm_config: {tokens_per_second: 100, burst: 200}
`

func TestForwardAuthAllowedHeaders(t *testing.T) {
	e := newEnv(t, orgPolicy)
	resp, _ := e.get("/v1/auth", "X-Org", "abc")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	wantHeaders(t, resp.Header, map[string]string{
		"RateLimit-Policy":    `"per-org-rps";q=200;w=2`,
		"RateLimit":           `"per-org-rps";r=199;t=1`,
		"RateLimit-Limit":     "200",
		"RateLimit-Remaining": "199",
		"RateLimit-Reset":     "1",
		"X-RateLimit-Limit":   "",
		"Retry-After":         "",
		"X-Sluice-Reason":     "",
	})
	// 87 left, as in the source format's example.
	for i := 0; i < 111; i++ {
		e.get("/v1/auth", "X-Org", "abc")
	}
	resp, _ = e.get("/v1/auth", "X-Org", "abc")
	wantHeaders(t, resp.Header, map[string]string{
		"RateLimit":           `"per-org-rps";r=87;t=2`,
		"RateLimit-Remaining": "87",
		"RateLimit-Reset":     "2",
	})
}

const tightPolicy = `
trusted_proxies: ["127.0.0.1/32", "::1/128"]
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 2}
`

// viaTraefik is what Traefik's ForwardAuth sends sluice for a GET of
// /orders from client.
func viaTraefik(client string) []string {
	return []string{"X-Forwarded-For", client, "X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/orders?id=7", "X-Forwarded-Host", "app.example"}
}

func TestForwardAuthRejection(t *testing.T) {
	e := newEnv(t, "forward_auth: {proxy: traefik}\n"+tightPolicy)
	for i := 0; i < 2; i++ {
		if resp, _ := e.get("/v1/auth", viaTraefik("203.0.113.7")...); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	resp, m := e.get("/v1/auth", viaTraefik("203.0.113.7")...)
	if resp.StatusCode != 429 {
		t.Fatalf("status %d, want 429", resp.StatusCode)
	}
	wantHeaders(t, resp.Header, map[string]string{
		"Content-Type":        "application/problem+json",
		"Retry-After":         "1",
		"X-Sluice-Reason":     "token_bucket_exceeded",
		"Cache-Control":       "no-store",
		"RateLimit-Policy":    `"per-ip";q=2;w=2`,
		"RateLimit":           `"per-ip";r=0;t=1`,
		"RateLimit-Limit":     "2",
		"RateLimit-Remaining": "0",
		"RateLimit-Reset":     "1",
	})
	wantFields(t, m, map[string]any{"type": httpgate.QuotaExceededType, "status": 429, "title": "Too Many Requests", "reason": "token_bucket_exceeded"})
	if vp, _ := json.Marshal(m["violated-policies"]); string(vp) != `["per-ip"]` {
		t.Errorf("violated-policies %s", vp)
	}

	// Another client behind the same trusted proxy has its own bucket.
	if resp, _ := e.get("/v1/auth", viaTraefik("203.0.113.8")...); resp.StatusCode != 200 {
		t.Errorf("another client: %d", resp.StatusCode)
	}
	// nginx asks for 403, which auth_request passes on.
	if resp, _ := e.get("/v1/auth?deny_status=403", viaTraefik("203.0.113.7")...); resp.StatusCode != 403 || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("deny_status=403: %d %v", resp.StatusCode, resp.Header)
	}
	if resp, _ := e.get("/v1/auth?deny_status=500", viaTraefik("203.0.113.9")...); resp.StatusCode != 400 {
		t.Errorf("deny_status=500: %d", resp.StatusCode)
	}
	e.clk.Advance(time.Second)
	if resp, _ := e.get("/v1/auth", viaTraefik("203.0.113.7")...); resp.StatusCode != 200 {
		t.Errorf("after a second: %d", resp.StatusCode)
	}
	// Every rejection is in the audit log.
	lines := strings.Split(strings.TrimSpace(e.audit.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("audit log has %d lines:\n%s", len(lines), e.audit.String())
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatal(err)
	}
	wantFields(t, rec, map[string]any{"rule": "per-ip", "client_ip": "203.0.113.7", "path": "/orders", "reason": "token_bucket_exceeded", "tokens": 0.0})
	if _, ok := rec["time"]; !ok {
		t.Errorf("audit record without time: %v", rec)
	}
	if k, _ := rec["key"].(string); !strings.Contains(k, "203.0.113.7") {
		t.Errorf("audit key %q", k)
	}
	if got := e.metrics(); !strings.Contains(got, `sluice_decisions_total{result="rejected",rule="per-ip"} 2`) ||
		!strings.Contains(got, `sluice_decisions_total{result="allowed",rule="per-ip"} 4`) ||
		!strings.Contains(got, "sluice_live_keys 2") || !strings.Contains(got, "sluice_store_latency_seconds_count") {
		t.Errorf("metrics:\n%s", grep(got, "sluice_"))
	}
}

func TestRetryAfterJitter(t *testing.T) {
	// One token per 10 s: a rejected client waits exactly 10 s (the clock
	// stands still), and Retry-After is 10..15.
	e := newEnv(t, `
trusted_proxies: ["127.0.0.1/32"]
forward_auth: {proxy: traefik}
rules:
  - name: slow
    limit_keys: ["ip:address"]
    algorithm: token_bucket
    algorithm_config: {rps: 0.1, burst: 1}
`)
	seen := map[string]bool{}
	for i := 0; i < 24; i++ {
		ip := "198.51.100." + strconv.Itoa(i+1)
		e.get("/v1/auth", viaTraefik(ip)...)
		var first string
		for j := 0; j < 3; j++ {
			resp, _ := e.get("/v1/auth", viaTraefik(ip)...)
			ra := resp.Header.Get("Retry-After")
			n, err := strconv.Atoi(ra)
			if resp.StatusCode != 429 || err != nil || n < 10 || n > 15 {
				t.Fatalf("%s: status %d, Retry-After %q, want 10..15", ip, resp.StatusCode, ra)
			}
			if j == 0 {
				first = ra
			} else if ra != first {
				t.Errorf("%s: Retry-After %s then %s: the same client must get the same offset", ip, first, ra)
			}
			if resp.Header.Get("RateLimit-Reset") != "10" {
				t.Errorf("RateLimit-Reset %q, want the unjittered 10", resp.Header.Get("RateLimit-Reset"))
			}
		}
		seen[first] = true
	}
	if len(seen) < 3 {
		t.Errorf("24 clients got only %d distinct Retry-After values: %v", len(seen), seen)
	}

	// The function itself: never before the wait, at most 50% after.
	for _, wait := range []time.Duration{time.Millisecond, time.Second, 1500 * time.Millisecond, 7 * time.Second, time.Hour} {
		base := int64((wait + time.Second - 1) / time.Second)
		for _, id := range []string{"ip:1.2.3.4", "ip:5.6.7.8", "sub:alice", ""} {
			got := policy.RetryAfterSeconds(wait, id, "/x")
			if got < base || got > base+base/2 {
				t.Errorf("RetryAfterSeconds(%v, %q) = %d, want %d..%d", wait, id, got, base, base+base/2)
			}
			if again := policy.RetryAfterSeconds(wait, id, "/x"); again != got {
				t.Errorf("not deterministic: %d then %d", got, again)
			}
		}
	}
}

func TestForwardAuthTrustedProxies(t *testing.T) {
	const rules = `
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
  - name: per-path
    limit_keys: ["path", "method"]
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
`
	t.Run("nginx", func(t *testing.T) {
		e := newEnv(t, "trusted_proxies: [\"127.0.0.1/32\", \"::1/128\"]\nforward_auth: {proxy: nginx}\n"+rules)
		orig := func(client, method, uri string) []string {
			return []string{"X-Real-IP", client, "X-Original-Method", method, "X-Original-URI", uri, "X-Original-Host", "app.example"}
		}
		// Different clients, different original URIs: all separate buckets.
		for i, h := range [][]string{
			orig("192.0.2.1", "GET", "/a?x=1"),
			orig("192.0.2.2", "GET", "/b"),
			orig("192.0.2.3", "POST", "/a"),
		} {
			if resp, m := e.get("/v1/auth", h...); resp.StatusCode != 200 {
				t.Errorf("request %d: %d %v", i, resp.StatusCode, m)
			}
		}
		resp, m := e.get("/v1/auth", orig("192.0.2.4", "GET", "/a/../a")...)
		if resp.StatusCode != 429 || !strings.Contains(resp.Header.Get("RateLimit"), `"per-path";r=0`) {
			t.Errorf("same path and method again: %d %v %v", resp.StatusCode, resp.Header, m)
		}
		if resp, _ := e.get("/v1/auth", orig("192.0.2.5", "GET", "http://[::1")...); resp.StatusCode != 400 {
			t.Errorf("garbage URI from a trusted proxy: %d", resp.StatusCode)
		}
	})
	t.Run("traefik", func(t *testing.T) {
		e := newEnv(t, "trusted_proxies: [\"127.0.0.1/32\", \"::1/128\"]\nforward_auth: {proxy: traefik}\n"+rules)
		fwd := func(client, method, uri string) []string {
			return []string{"X-Forwarded-For", client, "X-Forwarded-Method", method, "X-Forwarded-Uri", uri, "X-Forwarded-Host", "app.example"}
		}
		for i, h := range [][]string{
			fwd("192.0.2.1", "GET", "/a?x=1"),
			fwd("192.0.2.2", "GET", "/b"),
			fwd("192.0.2.3", "POST", "/a"),
		} {
			if resp, m := e.get("/v1/auth", h...); resp.StatusCode != 200 {
				t.Errorf("request %d: %d %v", i, resp.StatusCode, m)
			}
		}
		if resp, _ := e.get("/v1/auth", fwd("192.0.2.4", "GET", "/a")...); resp.StatusCode != 429 {
			t.Errorf("same path and method again: %d", resp.StatusCode)
		}
	})
	t.Run("untrusted", func(t *testing.T) {
		e := newEnv(t, "trusted_proxies: [\"10.0.0.0/8\"]\nforward_auth: {proxy: traefik}\n"+rules)
		if resp, _ := e.get("/v1/auth", "X-Forwarded-For", "192.0.2.1", "X-Original-URI", "/a"); resp.StatusCode != 200 {
			t.Fatalf("first: %d", resp.StatusCode)
		}
		// Spoofed headers from an untrusted peer change nothing: the same
		// peer, the same /v1/auth path, the same buckets.
		resp, _ := e.get("/v1/auth", "X-Forwarded-For", "192.0.2.2", "X-Forwarded-Uri", "/b", "X-Forwarded-Method", "PUT", "X-Forwarded-Host", "b.example")
		if resp.StatusCode != 429 || resp.Header.Get("X-Sluice-Reason") != "token_bucket_exceeded" {
			t.Errorf("spoofing client: %d", resp.StatusCode)
		}
		if rl := resp.Header.Get("RateLimit"); !strings.Contains(rl, `"per-ip";r=0`) || !strings.Contains(rl, `"per-path";r=0`) {
			t.Errorf("RateLimit %q", rl)
		}
	})
}

func TestSeveralRulesHeaders(t *testing.T) {
	e := newEnv(t, `
rules:
  - name: burst
    algorithm: token_bucket
    algorithm_config: {rps: 5, burst: 10}
  - name: sustained
    algorithm: token_bucket
    algorithm_config: {rate: 60, period: 1m, capacity: 3}
  - name: canary
    mode: shadow
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
headers: [draft, trio, legacy]
`)
	resp, _ := e.get("/v1/auth")
	wantHeaders(t, resp.Header, map[string]string{
		"RateLimit-Policy":      `"burst";q=10;w=2, "sustained";q=3;w=3`,
		"RateLimit":             `"burst";r=9;t=1, "sustained";r=2;t=1`,
		"RateLimit-Remaining":   "2", // the limit closest to rejecting
		"RateLimit-Limit":       "3",
		"X-RateLimit-Remaining": "2",
		"X-RateLimit-Limit":     "3",
	})
	e.get("/v1/auth")
	e.get("/v1/auth")
	resp, m := e.get("/v1/auth")
	if resp.StatusCode != 429 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	wantHeaders(t, resp.Header, map[string]string{
		"RateLimit":           `"burst";r=7;t=1, "sustained";r=0;t=1`,
		"RateLimit-Remaining": "0",
		"Retry-After":         "1",
	})
	if vp, _ := json.Marshal(m["violated-policies"]); string(vp) != `["sustained"]` {
		t.Errorf("violated-policies %s", vp)
	}
	// The shadow rule rejected silently twice (and was only peeked at the
	// rejected request).
	if got := e.metrics(); !strings.Contains(got, `sluice_decisions_total{result="shadow_rejected",rule="canary"} 3`) {
		t.Errorf("metrics:\n%s", grep(got, "canary"))
	}
}

func TestHeaderSets(t *testing.T) {
	for _, c := range []struct {
		sets string
		want map[string]string
	}{
		{"[legacy]", map[string]string{"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "1", "RateLimit": "", "RateLimit-Limit": ""}},
		{"[none]", map[string]string{"X-RateLimit-Limit": "", "RateLimit": "", "RateLimit-Policy": "", "RateLimit-Limit": ""}},
		{"[draft]", map[string]string{"RateLimit": `"per-ip";r=1;t=1`, "RateLimit-Limit": ""}},
	} {
		t.Run(c.sets, func(t *testing.T) {
			e := newEnv(t, "headers: "+c.sets+"\n"+tightPolicy)
			resp, _ := e.get("/v1/auth")
			wantHeaders(t, resp.Header, c.want)
			e.get("/v1/auth")
			resp, _ = e.get("/v1/auth")
			if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" || resp.Header.Get("X-Sluice-Reason") == "" {
				t.Errorf("rejection: %d %v", resp.StatusCode, resp.Header)
			}
		})
	}
}

func TestShadowModeEmitsNothing(t *testing.T) {
	e := newEnv(t, `
rules:
  - name: trial
    mode: shadow
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
`)
	for i := 0; i < 4; i++ {
		resp, _ := e.get("/v1/auth")
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
		for _, h := range []string{"RateLimit", "RateLimit-Policy", "RateLimit-Limit", "Retry-After", "X-Sluice-Reason"} {
			if v := resp.Header.Get(h); v != "" {
				t.Errorf("shadow rule emitted %s: %q", h, v)
			}
		}
	}
	got := e.metrics()
	if !strings.Contains(got, `sluice_decisions_total{result="shadow_rejected",rule="trial"} 3`) ||
		!strings.Contains(got, `sluice_decisions_total{result="allowed",rule="trial"} 1`) {
		t.Errorf("metrics:\n%s", grep(got, "trial"))
	}
	// Shadow rejections are audited, marked as such.
	if a := e.audit.String(); strings.Count(a, `"shadow":true`) != 3 {
		t.Errorf("audit:\n%s", a)
	}
}

var _ = http.StatusOK

// Attack: calling forward auth directly, past the front proxy. With
// api_token_env set, /v1/auth wants X-Sluice-Token, which the front proxy
// adds; the Authorization header is the client's own and opens nothing,
// even when it carries the API token.
func TestAttackForwardAuthNeedsToken(t *testing.T) {
	e := newClosedEnv(t, closedPolicy)
	for _, hdr := range [][]string{
		nil,
		{"X-Sluice-Token", "wrong-token-0123456789abcdef"},
		{"X-Sluice-Token", ""},
		{"Authorization", "Bearer " + apiToken},
	} {
		resp, m := e.get("/v1/auth", hdr...)
		wantUnauthorized(t, "auth with "+strings.Join(hdr, ": "), resp, m)
	}
	if n := e.store.Len(); n != 0 {
		t.Fatalf("refused calls created %d keys", n)
	}
	// Health stays open, for load balancers and probes.
	for _, p := range []string{"/healthz", "/readyz"} {
		if resp, _ := e.get(p); resp.StatusCode != 200 {
			t.Errorf("%s: %d", p, resp.StatusCode)
		}
	}
}

// The token for forward auth travels beside the client's Authorization
// header, so JWT rules still read the client's own token.
func TestForwardAuthTokenKeepsClientJWT(t *testing.T) {
	const secret = "test-secret-0123456789abcdef0123456789"
	t.Setenv("SLUICE_JWT_SECRET", secret)
	e := newClosedEnv(t, `
api_token_env: `+apiTokenEnv+`
jwt: {hmac_secret_env: SLUICE_JWT_SECRET}
rules:
  - name: per-user
    limit_keys: ["jwt:sub"]
    algorithm_config: {rps: 1, burst: 1}
`)
	exp := time.Now().Add(time.Hour).Unix()
	alice := signHS256(t, secret, jwt.MapClaims{"sub": "alice", "exp": exp})
	bob := signHS256(t, secret, jwt.MapClaims{"sub": "bob", "exp": exp})
	status := func(tok string) int {
		resp, _ := e.get("/v1/auth", "X-Sluice-Token", apiToken, "Authorization", "Bearer "+tok)
		return resp.StatusCode
	}
	if a1, a2, b1 := status(alice), status(alice), status(bob); a1 != 200 || a2 != 429 || b1 != 200 {
		t.Fatalf("alice %d then %d, bob %d: want 200, 429, 200 (one bucket per verified subject)", a1, a2, b1)
	}
}

// Attack: Envoy's ext_authz path, /v1/auth/..., was served before the
// token check and on every listener: with api_token_env set, GET
// /v1/auth/login without the token was judged (and charged) like a front
// proxy's call, and the decision API's own listener (api_listen), which
// serves no forward auth, answered it too. It needs the token, and is
// served only where /v1/auth is.
func TestAttackForwardAuthSubpathSkipsToken(t *testing.T) {
	e := newClosedEnv(t, closedPolicy)
	for _, hdr := range [][]string{nil, {"X-Sluice-Token", "wrong-token-0123456789abcdef"}, {"Authorization", "Bearer " + apiToken}} {
		for _, path := range []string{"/v1/auth/login", "/v1/auth//x", "/v1/auth/../v1/take"} {
			req, _ := http.NewRequest("GET", e.srv.URL+path, nil)
			req.URL.Opaque = path // as sent, not cleaned by the client
			for i := 0; i+1 < len(hdr); i += 2 {
				req.Header.Set(hdr[i], hdr[i+1])
			}
			resp, m := e.do(req)
			wantUnauthorized(t, path+" with "+strings.Join(hdr, ": "), resp, m)
		}
	}
	if n := e.store.Len(); n != 0 {
		t.Fatalf("refused calls created %d keys", n)
	}
	if resp, m := e.get("/v1/auth/login", "X-Sluice-Token", apiToken); resp.StatusCode != 200 {
		t.Errorf("with the token: %d %v", resp.StatusCode, m)
	}

	api := httptest.NewServer(e.gate.APIHandler())
	t.Cleanup(api.Close)
	before := e.store.Len()
	req, _ := http.NewRequest("GET", api.URL+"/v1/auth/login", nil)
	req.Header.Set("X-Sluice-Token", apiToken)
	if resp, m := e.do(req); resp.StatusCode != 404 || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("decision API listener: /v1/auth/login: %d %v", resp.StatusCode, m)
	}
	if n := e.store.Len(); n != before {
		t.Errorf("the decision API listener judged a forward-auth call (%d keys, %d before)", n, before)
	}
}
