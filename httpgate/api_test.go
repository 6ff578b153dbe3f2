package httpgate_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
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
		{"malformed", `{"rule":`, 400, "malformed JSON"},
		{"empty", ``, 400, "empty body"},
		{"not an object", `[1,2]`, 400, "malformed JSON"},
		{"unknown field", `{"rule":"per-user","key":"u","weight":2}`, 400, `unknown field "weight"`},
		{"trailing data", `{"rule":"per-user","key":"u"} {}`, 400, "after the JSON value"},
		{"unknown rule", `{"rule":"nope","key":"u"}`, 400, `unknown rule "nope"`},
		{"no rule", `{"key":"u"}`, 400, `"rule" is required`},
		{"zero cost", `{"rule":"per-user","key":"u","cost":0}`, 400, "cost must be a finite number > 0"},
		{"negative cost", `{"rule":"per-user","key":"u","cost":-1}`, 400, "cost must be a finite number > 0"},
		{"tiny cost", `{"rule":"per-user","key":"u","cost":1e-9}`, 400, "cost"},
		{"string cost", `{"rule":"per-user","key":"u","cost":"1"}`, 400, "malformed JSON"},
		{"overflowing cost", `{"rule":"per-user","key":"u","cost":1e999}`, 400, "malformed JSON"},
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
			if d, _ := m["detail"].(string); !strings.Contains(d, c.detail) {
				t.Errorf("detail %q, want it to mention %q", d, c.detail)
			}
			wantFields(t, m, map[string]any{"status": c.status})
		})
	}
	// Nothing above charged anything.
	_, m := e.post("/v1/peek", `{"rule":"per-user","key":"u"}`)
	wantFields(t, m, map[string]any{"remaining": 2})

	resp, _ := e.get("/v1/take")
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/take: %d", resp.StatusCode)
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
	e.gate.Drain()
	if resp, _ := e.get("/readyz"); resp.StatusCode != 503 {
		t.Errorf("draining /readyz: %d", resp.StatusCode)
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
