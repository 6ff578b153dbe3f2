package httpgate_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestAlgorithmsThroughForwardAuth checks the fields and reasons of every
// algorithm. The manual clock stands at Unix 1700000000, 20 s into a
// minute.
func TestAlgorithmsThroughForwardAuth(t *testing.T) {
	for _, c := range []struct {
		name, config   string
		policy, first  string // RateLimit-Policy; RateLimit after one request
		reason         string
		wait, maxRetry int // Retry-After bounds of the 3rd request
	}{
		{
			name:   "fixed window",
			config: `{algorithm: fixed_window, algorithm_config: {rate: 2, period: 1m, start: 0s}}`,
			policy: `"r";q=2;w=60`, first: `"r";r=1;t=40`,
			reason: "fixed_window_exceeded", wait: 40, maxRetry: 60,
		},
		{
			name:   "sliding log",
			config: `{algorithm: sliding_log, algorithm_config: {rate: 2, period: 10s}}`,
			policy: `"r";q=2;w=10`, first: `"r";r=1;t=10`,
			reason: "sliding_log_exceeded", wait: 10, maxRetry: 15,
		},
		{
			name:   "token bucket",
			config: `{algorithm: token_bucket, algorithm_config: {rate: 1, period: 5s, capacity: 2}}`,
			policy: `"r";q=2;w=10`, first: `"r";r=1;t=5`,
			reason: "token_bucket_exceeded", wait: 5, maxRetry: 7,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, "rules:\n  - {name: r, "+c.config[1:]+"\n")
			resp, _ := e.get("/v1/auth")
			wantHeaders(t, resp.Header, map[string]string{"RateLimit-Policy": c.policy, "RateLimit": c.first})
			e.get("/v1/auth")
			resp, _ = e.get("/v1/auth")
			ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			if resp.StatusCode != 429 || resp.Header.Get("X-Sluice-Reason") != c.reason || ra < c.wait || ra > c.maxRetry {
				t.Errorf("3rd request: %d, reason %q, Retry-After %d (want %d..%d)", resp.StatusCode, resp.Header.Get("X-Sluice-Reason"), ra, c.wait, c.maxRetry)
			}
			if got, want := resp.Header.Get("RateLimit"), fmt.Sprintf(`"r";r=0;t=%d`, c.wait); got != want {
				t.Errorf("RateLimit %q, want %q", got, want)
			}
		})
	}
}

// TestLeakyBucketShapes: a leaky bucket admits requests 1/rate apart by
// holding each until its turn, and rejects those that would wait longer
// than max_delay.
func TestLeakyBucketShapes(t *testing.T) {
	e := newEnv(t, `
rules:
  - name: shaped
    algorithm: leaky_bucket
    algorithm_config: {rps: 10, max_delay: 300ms}
`)
	var codes []int
	for i := 0; i < 6; i++ {
		resp, _ := e.get("/v1/auth")
		codes = append(codes, resp.StatusCode)
	}
	if fmt.Sprint(codes) != "[200 200 200 200 429 429]" {
		t.Errorf("statuses %v", codes)
	}
	if got := fmt.Sprint(e.waits()); got != fmt.Sprint([]time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond}) {
		t.Errorf("held requests for %s, want 100ms 200ms 300ms", got)
	}
	resp, _ := e.get("/v1/auth")
	if resp.Header.Get("X-Sluice-Reason") != "leaky_bucket_exceeded" {
		t.Errorf("reason %q", resp.Header.Get("X-Sluice-Reason"))
	}
	// The decision API reports the turn instead of waiting.
	_, m := e.post("/v1/take", `{"rule":"shaped","key":"k"}`)
	wantFields(t, m, map[string]any{"allowed": true, "retry_after_ms": 0})
	_, m = e.post("/v1/take", `{"rule":"shaped","key":"k"}`)
	wantFields(t, m, map[string]any{"allowed": true, "retry_after_ms": 100})
}

func TestReserveInDecisionAPI(t *testing.T) {
	e := newEnv(t, `
rules:
  - name: credit
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1, max_reserved: 2}
  - name: window
    algorithm: fixed_window
    algorithm_config: {rate: 1, period: 1m, start: 0s}
  - name: log
    algorithm: sliding_log
    algorithm_config: {rate: 1, period: 1m}
`)
	e.post("/v1/take", `{"rule":"credit","key":"k"}`)
	_, m := e.post("/v1/take", `{"rule":"credit","key":"k","reserve":true}`)
	wantFields(t, m, map[string]any{"allowed": true, "retry_after_ms": 1000, "remaining": 0, "tokens": -1})
	_, m = e.post("/v1/take", `{"rule":"credit","key":"k","reserve":false}`)
	wantFields(t, m, map[string]any{"allowed": false, "reason": "token_bucket_exceeded"})
	// A reservation may cost more than the burst: up to burst + max_reserved.
	resp, m := e.post("/v1/take", `{"rule":"credit","key":"k2","cost":3,"reserve":true}`)
	if resp.StatusCode != 200 {
		t.Errorf("reservation of burst + max_reserved: %d %v", resp.StatusCode, m)
	}
	wantFields(t, m, map[string]any{"allowed": true, "retry_after_ms": 2000, "tokens": -2})
	resp, m = e.post("/v1/take", `{"rule":"credit","key":"k2","cost":3.5,"reserve":true}`)
	if resp.StatusCode != 422 || !strings.Contains(fmt.Sprint(m["detail"]), "max_reserved (2)") {
		t.Errorf("reservation above burst + max_reserved: %d %v", resp.StatusCode, m)
	}
	// Fixed windows reserve too: the debt is paid by the next window.
	e.post("/v1/take", `{"rule":"window","key":"k"}`)
	_, m = e.post("/v1/take", `{"rule":"window","key":"k","reserve":true}`)
	if m["allowed"] != true || m["tokens"] != float64(-1) || m["retry_after_ms"].(float64) <= 0 {
		t.Errorf("reservation on a fixed window: %v", m)
	}
	resp, m = e.post("/v1/take", `{"rule":"log","key":"k","reserve":true}`)
	if resp.StatusCode != 400 {
		t.Errorf("reservation on a sliding log: %d %v", resp.StatusCode, m)
	}
}
