package httpgate_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/memory"
)

// Attack: the rule settles from a response header, and the upstream
// echoes request headers (debug echo, CORS reflection, a framework that
// copies them). The client sends the header itself, "X-Usage-Tokens: 0",
// so that the upstream states a cost of nothing and the charge is
// refunded whole. The proxy drops every settle_from header and trailer
// from requests: the upstream never sees the client's, and the charge
// settles at what the upstream itself reports.
func TestAttackClientStatesItsOwnCost(t *testing.T) {
	e := newLLMEnv(t, strings.Replace(llmPolicy, "match: {path_prefix: /header}", "match: {path_prefix: /echo}", 1))
	for i := range 3 {
		status, body := call(t, e.proxy, "/echo", "", "X-Api-Key", "k1", "X-Estimate", "100", "X-Test-Usage", "90",
			"X-Usage-Tokens", "0", "x-usage-tokens", "0")
		if status != 200 {
			t.Fatalf("%d %s", status, body)
		}
		if got, want := e.level("by-header", "k1"), 1000-90*float64(i+1); got != want {
			t.Fatalf("request %d: the bucket holds %v, want %v: the client's own X-Usage-Tokens settled the charge", i, got, want)
		}
	}
	for _, h := range e.up.seen {
		if v := h.Values("X-Usage-Tokens"); len(v) > 0 {
			t.Fatalf("the upstream saw the client's X-Usage-Tokens %q", v)
		}
	}
}

// A stream's event too large to hold, or a JSON response too large, is
// not read for its cost: the request is charged unsettled_cost, and the
// response passes whole.
func TestSettleBounds(t *testing.T) {
	big := strings.Repeat("y", 70<<10)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/event":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: {\"usage\":{\"total_tokens\":3},\"pad\":\"%s\"}\n\n", big)
		case "/v1/line":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: {\"usage\":{\"total_tokens\":3}}\n\ndata: {\"pad\":\"%s\",\"usage\":{\"total_tokens\":5}}\n\n", big)
		case "/v1/json":
			fmt.Fprintf(w, "{\"pad\":\"%s\",\"usage\":{\"total_tokens\":3}}", strings.Repeat(big, 16))
		}
	})
	clk := sluice.NewManualClock(sluiceEpoch)
	lim := sluice.NewWithOptions(memory.New(memory.Options{Clock: clk}), sluice.Options{Clock: clk})
	p := mustPolicy(t, llmPolicy)
	srv := serve(t, httpgate.Middleware(p, lim, httpgate.Options{})(app))
	for path, want := range map[string]float64{"/v1/event": 2000, "/v1/line": 3, "/v1/json": 2000} {
		key := strings.TrimPrefix(path, "/v1/")
		_, body := call(t, srv, path, `{"max_tokens": 100}`, "X-Api-Key", key)
		if !strings.Contains(body, big) {
			t.Errorf("%s: the response did not pass whole", path)
		}
		if got := 10000 - conformance.Level(t, lim, p.Limit("tokens"), key); got != want {
			t.Errorf("%s: charged %v, want %v", path, got, want)
		}
	}
}
