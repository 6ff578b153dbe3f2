package httpgate_test

import (
	"strings"
	"testing"
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
