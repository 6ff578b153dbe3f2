package httpgate_test

import (
	"context"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// The decision API says when to retry as a point in time beside the wait:
// retry_at, RFC 3339 in UTC with milliseconds, never before the wait ends,
// absent when there is none.
func TestRetryAtInDecisionAPI(t *testing.T) {
	e := newEnv(t, apiPolicy)
	_, m := e.post("/v1/take", `{"rule":"per-user","key":"u1","cost":3}`)
	if _, ok := m["retry_at"]; ok || m["allowed"] != true {
		t.Fatalf("an admit without a wait: %v, want no retry_at", m)
	}
	_, m = e.post("/v1/take", `{"rule":"per-user","key":"u1"}`)
	wantFields(t, m, map[string]any{"allowed": false, "retry_after_ms": 1000, "retry_at": "2023-11-14T22:13:21.000Z"})

	// Off the millisecond: rounded up, so never early.
	e.clk.Advance(200500 * time.Microsecond)
	_, m = e.post("/v1/take", `{"takes":[{"rule":"per-user","key":"u1"},{"rule":"per-org","key":"o"}]}`)
	wantFields(t, m, map[string]any{"allowed": false, "retry_after_ms": 800})
	for _, got := range []any{m["retry_at"], m["takes"].([]any)[0].(map[string]any)["retry_at"]} {
		at, err := time.Parse(time.RFC3339Nano, got.(string))
		exact := e.clk.Now().Add(799500 * time.Microsecond)
		if err != nil || !strings.HasSuffix(got.(string), "Z") || len(got.(string)) != len("2023-11-14T22:13:21.000Z") || at.Before(exact) || at.Sub(exact) > 2*time.Millisecond {
			t.Fatalf("retry_at %v, want RFC 3339 in UTC with milliseconds, at or just after %v", got, exact)
		}
	}
	if _, ok := m["takes"].([]any)[1].(map[string]any)["retry_at"]; ok {
		t.Fatalf("a take that had room has a retry_at: %v", m)
	}
}

const jitterPolicy = `
rules:
  - name: spread
    limit_keys: ["header:x-user"]
    algorithm_config: {rate: 1, period: 1m, jitter: period}
`

// A rule's jitter spreads the advised retry of the decision API and of
// the headers alike, fixed per key and caller; it replaces the
// Retry-After header's own spread instead of adding to it.
func TestRuleJitter(t *testing.T) {
	e := newEnv(t, jitterPolicy)
	_, lim, err := e.gate.Policy().FindLimit("spread")
	if err != nil {
		t.Fatal(err)
	}
	if lim.Spec().Jitter != time.Minute {
		t.Fatalf("jitter: period of a 1m rate is %v", lim.Spec().Jitter)
	}
	// The decision API's caller is the test client, 127.0.0.1.
	caller := sluice.WithCaller(context.Background(), sluice.Caller{IP: netip.MustParseAddr("127.0.0.1")})
	for _, key := range []string{"u1", "u2", "u3"} {
		e.post("/v1/take", `{"rule":"spread","key":"`+key+`"}`)
		_, m := e.post("/v1/take", `{"rule":"spread","key":"`+key+`"}`)
		wait := time.Minute + lim.Jitter(caller, key)
		ms := math.Ceil(float64(wait) / float64(time.Millisecond))
		wantFields(t, m, map[string]any{"allowed": false, "retry_after_ms": ms,
			"retry_at": sluiceEpoch.Add(time.Duration(ms) * time.Millisecond).UTC().Format(sluice.RetryAtLayout)})
	}
	seen := map[string]bool{}
	for _, user := range []string{"a", "b", "c", "d", "e", "f"} {
		e.get("/v1/auth", "X-User", user)
		resp, _ := e.get("/v1/auth", "X-User", user)
		ra := resp.Header.Get("Retry-After")
		_, t1, _ := strings.Cut(resp.Header.Get("RateLimit"), ";t=")
		if n, _ := strconv.Atoi(ra); resp.StatusCode != 429 || ra != t1 || n < 60 || n > 120 {
			t.Fatalf("user %s: %d, Retry-After %q, RateLimit %q; want 429 with Retry-After = t, 60..120", user, resp.StatusCode, ra, resp.Header.Get("RateLimit"))
		}
		seen[ra] = true
	}
	if len(seen) < 3 {
		t.Fatalf("6 users were told %d Retry-After values: %v", len(seen), seen)
	}
}
