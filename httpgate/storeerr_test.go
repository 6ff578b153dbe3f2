package httpgate_test

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
)

func TestStoreErrorsFollowOnStoreError(t *testing.T) {
	var f *conformance.FaultyStore
	policy := `
rules:
  - name: open
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 5}
  - name: closed
    limit_keys: ["header:x-closed"]
    on_store_error: deny
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 5}
`
	e := newEnvStore(t, policy, func(s sluice.Store) sluice.Store { f = &conformance.FaultyStore{Store: s}; return f })
	f.Down.Store(true)

	// Fail open: allowed, no state written.
	_, m := e.post("/v1/take", `{"rule":"open","key":"k"}`)
	wantFields(t, m, map[string]any{"allowed": true, "store_error": true})
	// Fail closed.
	_, m = e.post("/v1/take", `{"rule":"closed","key":"k"}`)
	wantFields(t, m, map[string]any{"allowed": false, "store_error": true, "reason": "store_unavailable", "retry_after_ms": 1000})

	// Request-shaped: the open rule alone lets the request through...
	e2 := newEnvStore(t, policy[:strings.Index(policy, "  - name: closed")], func(s sluice.Store) sluice.Store {
		g := &conformance.FaultyStore{Store: s}
		g.Down.Store(true)
		return g
	})
	if resp, _ := e2.get("/v1/auth"); resp.StatusCode != 200 {
		t.Errorf("fail-open rule: %d", resp.StatusCode)
	}
	// ...while a deny rule rejects it with the store reason.
	resp, m := e.get("/v1/auth", "X-Closed", "c1")
	if resp.StatusCode != 429 || resp.Header.Get("X-Sluice-Reason") != "store_unavailable" || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("fail-closed rule: %d %v %v", resp.StatusCode, resp.Header, m)
	}
	if e.store.Len() != 0 {
		t.Errorf("store errors wrote %d keys", e.store.Len())
	}
	got := e.metrics()
	for _, want := range []string{
		`sluice_decisions_total{result="store_error",rule="open"}`,
		`sluice_decisions_total{result="store_error",rule="closed"}`,
		`sluice_store_errors_total{op="take_all"}`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("metrics lack %s:\n%s", want, grep(got, "sluice_"))
		}
	}
	// The counter is exported at zero from the start: the failures must
	// have moved it.
	if strings.Contains(got, `sluice_store_errors_total{op="take_all"} 0`+"\n") {
		t.Errorf("store errors of take_all still 0:\n%s", grep(got, "sluice_"))
	}
	if resp, _ := e.get("/readyz"); resp.StatusCode != 503 {
		t.Errorf("/readyz with the store down: %d", resp.StatusCode)
	}
	f.Down.Store(false)
	if resp, _ := e.get("/readyz"); resp.StatusCode != 200 {
		t.Errorf("/readyz with the store back: %d", resp.StatusCode)
	}
}
