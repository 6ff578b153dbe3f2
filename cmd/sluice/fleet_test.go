package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// Two sluice processes' worth of serve share one Redis and enforce one
// limit together: a burst of 5 is 5 across the fleet, not 5 each. The
// Redis store's metrics appear on /metrics.
//
// The count is of what Redis decided: a take whose store call failed is
// answered by on_store_error (store_error in the answer), and whether
// Redis charged it is unknown, so it bounds the count from below only.
// The store's deadline and the client's own dial and write timeouts are
// long, so that on a loaded machine such answers are rare rather than the
// rule (serve's cap on a decision, 2s, still applies).
func TestServeRedisFleet(t *testing.T) {
	addr := redistest.Server(t)
	t.Setenv("SLUICE_FLEET_ADMIN", "fleet-admin-token")
	conf := fmt.Sprintf(`store:
  url: redis://%s/0?timeout=10s&dial_timeout=30s&write_timeout=30s
admin_token_env: SLUICE_FLEET_ADMIN
rules:
  - name: shared
    algorithm_config: {rate: 1, period: 1h, capacity: 5}
`, addr)
	cfg := writePolicy(t, conf)
	a, _ := startServe(t, "--config", cfg)
	b, _ := startServe(t, "--config", cfg)
	admitted, storeErrors := 0, 0
	for i := 0; i < 12; i++ {
		api := a.API
		if i%2 == 1 {
			api = b.API
		}
		switch d := take(t, api, `{"rule":"shared","key":"k"}`); {
		case d["store_error"] == true:
			storeErrors++
		case d["allowed"] == true:
			admitted++
		}
	}
	if admitted > 5 || admitted < 5-storeErrors {
		t.Fatalf("Redis admitted %d (and %d takes were store errors), want the shared burst of 5", admitted, storeErrors)
	}
	// Both processes now answer the key from their over-limit caches (a
	// window of an hour). A reset through b reaches a's cache too.
	req, _ := http.NewRequest(http.MethodPost, "http://"+b.API+"/v1/reset", strings.NewReader(`{"rule":"shared","key":"k"}`))
	req.Header.Set("Authorization", "Bearer fleet-admin-token")
	rr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rr.Body.Close()
	if rr.StatusCode != http.StatusOK {
		t.Fatalf("reset: %s", rr.Status)
	}
	// The deadline only ends a test that would otherwise hang: the loop
	// ends as soon as the message arrives, however slow the machine.
	for deadline := time.Now().Add(time.Minute); !admittedByRedis(take(t, a.API, `{"rule":"shared","key":"k"}`)); {
		if time.Now().After(deadline) {
			t.Fatal("after a reset through b, a still rejects the key")
		}
		time.Sleep(10 * time.Millisecond) // waiting for the drop message, not for tokens
	}
	resp, err := http.Get("http://" + a.API + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "sluice_redis_breaker_state") {
		t.Fatalf("/metrics lacks the Redis store's metrics:\n%s", body)
	}
}

// admittedByRedis reports whether a decision API answer is an admission
// the store made, not one on_store_error made for a failed store.
func admittedByRedis(d map[string]any) bool {
	return d["allowed"] == true && d["store_error"] != true
}
