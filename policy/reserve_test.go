package policy_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/policy"
)

// Reservations in a config file: fixed windows take reserve and
// max_reserved, capacity 0 makes every request of the rule reserve, and a
// rule that reserves without max_reserved owes at most its capacity (the
// default max_reserved of a served rule), which check's notes tell.
func TestReservationConfig(t *testing.T) {
	p := mustParse(t, `rules:
  - name: fw
    algorithm: fixed_window
    algorithm_config: {rate: 10, period: 1m, reserve: true, max_reserved: 5}
  - name: spaced
    algorithm_config: {rate: 10, period: 1m, capacity: 0, reserve: true, max_reserved: 10}
  - name: open
    algorithm_config: {rate: 10, period: 1m, reserve: true}
  - name: plain
    algorithm_config: {rate: 10, period: 1m}
`)
	if fw := p.Rule("fw").Limit; fw.Params().MaxReserved != 5*engine.TokenScale || fw.Params().Reserve {
		t.Errorf("fixed window %+v", fw.Params())
	}
	if sp := p.Rule("spaced").Limit; sp.Capacity() != 0 || !sp.Params().Reserve {
		t.Errorf("capacity 0: %+v", sp.Params())
	}
	for _, name := range []string{"open", "plain"} {
		if got := p.Rule(name).Limit.Params().MaxReserved; got != 10*engine.TokenScale {
			t.Errorf("%s: max_reserved unset: %d micro-tokens, want the capacity (10 tokens)", name, got)
		}
	}
	if len(p.Warnings) != 0 {
		t.Errorf("warnings:\n%s", strings.Join(p.Warnings, "\n"))
	}
	want := []string{
		"test.yaml:4: rules[0].algorithm_config.reserve: a reservation owes at most 5 tokens (max_reserved): a turn is at most 30s ahead, and a client that leaves before its turn cannot lock its bucket's other clients out for longer",
		"test.yaml:6: rules[1].algorithm_config.reserve: a reservation owes at most 10 tokens (max_reserved): a turn is at most 1m0s ahead, and a client that leaves before its turn cannot lock its bucket's other clients out for longer",
		"test.yaml:8: rules[2].algorithm_config.reserve: a reservation owes at most 10 tokens (the default max_reserved: the capacity): a turn is at most 1m0s ahead, and a client that leaves before its turn cannot lock its bucket's other clients out for longer",
	}
	if !slices.Equal(p.Notes, want) {
		t.Errorf("notes:\n%s\nwant:\n%s", strings.Join(p.Notes, "\n"), strings.Join(want, "\n"))
	}
}

// A rule that reserves admits a declared cost above its capacity, up to
// capacity + max_reserved, and tells the request its turn; above that the
// request can never pass. Seed 003's numbers: 10 a minute, capacity 10,
// 5 taken, 6 s later 16 reserved: -10, the turn a minute away.
func TestEnforceReservationAboveCapacity(t *testing.T) {
	p := mustParse(t, `rules:
  - name: llm
    limit_keys: ["header:x-user"]
    algorithm_config: {rate: 10, period: 1m, reserve: true, max_reserved: 10, cost_source: "header:x-tokens"}
`)
	lim, clk := newLimiter()
	ctx := context.Background()
	take := func(cost string) policy.Verdict {
		ms, err := p.Match(&policy.Input{Method: "GET", Path: "/", Header: http.Header{"X-User": {"u"}, "X-Tokens": {cost}}})
		if err != nil || len(ms) != 1 {
			t.Fatalf("match: %v %v", ms, err)
		}
		return policy.Enforce(ctx, lim, ms, policy.Options{})
	}
	if v := take("5"); !v.Allowed || v.Overall.RetryAfter != 0 {
		t.Fatalf("take 5: %+v", v.Overall)
	}
	clk.Advance(6 * time.Second)
	if v := take("16"); !v.Allowed || v.Overall.Tokens != -10 || v.Overall.RetryAfter != time.Minute {
		t.Fatalf("reserve 16: %+v, want allowed at -10 with its turn in a minute", v.Overall)
	}
	v := take("21")
	if v.Allowed || v.Reason() != policy.ReasonCostExceedsLimit {
		t.Fatalf("reserve 21 (above 10 + 10): %+v, reason %q", v.Overall, v.Reason())
	}
}
