package httpgate_test

import (
	"fmt"
	"strconv"
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
    algorithm_config: {rate: 1, period: 1m}
`)
	e.post("/v1/take", `{"rule":"credit","key":"k"}`)
	_, m := e.post("/v1/take", `{"rule":"credit","key":"k","reserve":true}`)
	wantFields(t, m, map[string]any{"allowed": true, "retry_after_ms": 1000})
	_, m = e.post("/v1/take", `{"rule":"credit","key":"k","reserve":false}`)
	wantFields(t, m, map[string]any{"allowed": false, "reason": "token_bucket_exceeded"})
	resp, m := e.post("/v1/take", `{"rule":"window","key":"k","reserve":true}`)
	if resp.StatusCode != 400 {
		t.Errorf("reservation on a fixed window: %d %v", resp.StatusCode, m)
	}
}
