package policy_test

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/policy"
)

func TestConcurrencyConfig(t *testing.T) {
	cc := "    algorithm: concurrency\n"
	for _, tc := range []struct {
		name, cfg string
		want      []string
	}{
		{"max_in_flight missing", rule(cc, "      lease: 1m\n"),
			[]string{"c.yaml:6: rules[0].algorithm_config.max_in_flight: is required: the most requests of a key in flight at once (1 to 65536)"}},
		{"max_in_flight zero", rule(cc, "      max_in_flight: 0\n"),
			[]string{"c.yaml:6: rules[0].algorithm_config.max_in_flight: must be a whole number from 1 to 65536 (got 0)"}},
		{"max_in_flight too many", rule(cc, "      max_in_flight: 65537\n"),
			[]string{"c.yaml:6: rules[0].algorithm_config.max_in_flight: must be a whole number from 1 to 65536 (got 65537)"}},
		{"max_in_flight fractional", rule(cc, "      max_in_flight: 2.5\n"),
			[]string{"c.yaml:6: rules[0].algorithm_config.max_in_flight: must be a whole number"}},
		{"lease zero", rule(cc, "      max_in_flight: 2\n      lease: 0s\n"),
			[]string{`c.yaml:7: rules[0].algorithm_config.lease: must be from 1ms to 24h (got "0s"): how long a slot stays held when its holder neither ends nor renews it`}},
		{"lease negative", rule(cc, "      max_in_flight: 2\n      lease: -5s\n"),
			[]string{`c.yaml:7: rules[0].algorithm_config.lease: must be from 1ms to 24h (got "-5s"): how long a slot stays held when its holder neither ends nor renews it`}},
		{"lease beyond a day", rule(cc, "      max_in_flight: 2\n      lease: 25h\n"),
			[]string{`c.yaml:7: rules[0].algorithm_config.lease: must be from 1ms to 24h (got "25h"): how long a slot stays held when its holder neither ends nor renews it`}},
		{"lease without a unit", rule(cc, "      max_in_flight: 2\n      lease: 30\n"),
			[]string{`c.yaml:7: rules[0].algorithm_config.lease: must be a duration with a unit, such as "30s" (got the number 30)`}},
		{"a rate", rule(cc, "      max_in_flight: 2\n      rps: 10\n      burst: 5\n"),
			[]string{
				"c.yaml:7: rules[0].algorithm_config.rps: does not apply to concurrency (it takes max_in_flight, lease)",
				"c.yaml:8: rules[0].algorithm_config.burst: does not apply to concurrency (it takes max_in_flight, lease)",
			}},
		{"a cost", rule(cc, "      max_in_flight: 2\n      cost_source: header:x-cost\n"),
			[]string{"c.yaml:7: rules[0].algorithm_config.cost_source: does not apply to concurrency (it takes max_in_flight, lease)"}},
		{"a reservation", rule(cc, "      max_in_flight: 2\n      reserve: true\n"),
			[]string{"c.yaml:7: rules[0].algorithm_config.reserve: does not apply to concurrency (it takes max_in_flight, lease)"}},
		{"shards", rule(cc, "      max_in_flight: 2\n      shards: 4\n"),
			[]string{"c.yaml:7: rules[0].algorithm_config.shards: does not apply to concurrency (it takes max_in_flight, lease)"}},
		{"an Envoy descriptor key", "rules:\n  - name: r\n    limit_keys: [descriptor:user]\n" + cc + "    algorithm_config:\n      max_in_flight: 2\n",
			[]string{`c.yaml:2: rules[0]: "r" is a concurrency rule that reads an Envoy descriptor or domain: Envoy's rate limit service is asked before a request and never told when it ends, so it cannot hold a slot; serve this rule through the reverse proxy or the Go middleware`}},
		{"an Envoy domain match", "rules:\n  - name: r\n    match: {domain: edge}\n" + cc + "    algorithm_config:\n      max_in_flight: 2\n",
			[]string{`c.yaml:2: rules[0]: "r" is a concurrency rule that reads an Envoy descriptor or domain: Envoy's rate limit service is asked before a request and never told when it ends, so it cannot hold a slot; serve this rule through the reverse proxy or the Go middleware`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := problems(t, tc.cfg); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got:\n%v\nwant:\n%v", got, tc.want)
			}
		})
	}

	fa := mustParse(t, "trusted_proxies: [10.0.0.0/8]\nforward_auth: {proxy: nginx}\n"+rule(cc, "      max_in_flight: 2\n"))
	if len(fa.Warnings) != 1 || !strings.Contains(fa.Warnings[0], `test.yaml:4: rules[0]: "r" is a concurrency rule, which forward auth (forward_auth: nginx) cannot hold a slot of`) {
		t.Errorf("with forward_auth: warnings %q", fa.Warnings)
	}

	p := mustParse(t, "rules:\n  - name: r\n    algorithm: concurrency\n    algorithm_config: {max_in_flight: 4}\n  - name: t\n    algorithm: concurrency\n    tiers:\n      - name: pro\n        match: {header:x-plan: pro}\n        algorithm_config: {max_in_flight: 8, lease: 2m, jitter: 1s}\n      - name: free\n        algorithm_config: {max_in_flight: 1}\n")
	for name, want := range map[string][2]any{"r": {4, sluice.DefaultLeaseTerm}, "t.pro": {8, 2 * time.Minute}, "t.free": {1, sluice.DefaultLeaseTerm}} {
		l := p.Limit(name)
		if l == nil || l.Algorithm() != sluice.Concurrency || l.MaxInFlight() != want[0] || l.LeaseTerm() != want[1] {
			t.Errorf("%s: %v; want a concurrency limit of %v slots on %v leases", name, l, want[0], want[1])
		}
	}
}

const slotAndRate = `rules:
  - name: slots
    algorithm: concurrency
    limit_keys: ["ip:address"]
    algorithm_config: {max_in_flight: 1}
  - name: rate
    limit_keys: ["ip:address"]
    algorithm_config: {rps: 1, burst: 1}
`

// Hold is all-or-nothing across slots and tokens: a slot is held only
// when the rate rules admit too, and tokens are charged only when every
// slot is free.
func TestHoldAllOrNothing(t *testing.T) {
	ctx := context.Background()
	p := mustParse(t, slotAndRate)
	lim, clk := newLimiter()
	hold := func() policy.Verdict {
		ms, err := p.Match(fromIP("192.0.2.1"))
		if err != nil {
			t.Fatal(err)
		}
		return policy.Enforce(ctx, lim, ms, policy.Options{Hold: true})
	}
	v := hold()
	if !v.Allowed || len(v.Leases()) != 1 {
		t.Fatalf("first: %+v; want allowed holding one slot", v)
	}
	// The slot is held: the next is refused by it, and the rate rule is
	// not charged.
	clk.Advance(time.Second)
	w := hold()
	if w.Allowed || w.Reason() != "concurrency_exceeded" || len(w.Leases()) != 0 {
		t.Fatalf("second, while the slot is held: %+v; want refused by the slot, nothing held", w)
	}
	if got := remaining(t, p, lim, "rate", "192.0.2.1"); got != 1 {
		t.Fatalf("a request refused by its slot was charged: %d tokens left, want 1", got)
	}
	if err := v.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Release(ctx); err != nil {
		t.Fatalf("a second release: %v", err)
	}
	// The slot is free and the rate rule admits: both taken. Then the
	// rate rule refuses, and the slot it would have held is given back.
	if x := hold(); !x.Allowed {
		t.Fatalf("after the release: %+v", x)
	} else {
		x.Release(ctx)
	}
	y := hold()
	if y.Allowed || y.Reason() != "token_bucket_exceeded" || len(y.Leases()) != 0 {
		t.Fatalf("with no token left: %+v; want refused by the rate rule, nothing held", y)
	}
	if r := y.Results[0]; r.Decision.Allowed || r.Violated {
		t.Fatalf("the slot of a request the rate rule refused: %+v; want not admitted, not a cause", r)
	}
	d, err := lim.Peek(ctx, sluice.Request{Limit: p.Limit("slots"), Key: "192.0.2.1"})
	if err != nil || !d.Allowed {
		t.Fatalf("the slot after a refusal by the rate rule: %+v, %v; want free", d, err)
	}
}

// Enforce cannot hold a slot: a take that a concurrency rule matches is
// refused, closed, with a reason of its own, and nothing is charged. A
// peek answers, and a refund (Envoy's negative hits) passes over it.
func TestEnforceRefusesSlots(t *testing.T) {
	ctx := context.Background()
	p := mustParse(t, slotAndRate)
	lim, _ := newLimiter()
	v := decide(t, p, lim, fromIP("192.0.2.1"), engine.OpTake, nil)
	if v.Allowed || v.Reason() != policy.ReasonConcurrencyUnsupported || !v.Results[0].Refused() {
		t.Fatalf("%+v; want refused: concurrency_unsupported", v)
	}
	if got := remaining(t, p, lim, "rate", "192.0.2.1"); got != 1 {
		t.Fatalf("the rate rule was charged: %d left", got)
	}
	if v := decide(t, p, lim, fromIP("192.0.2.1"), engine.OpPeek, nil); !v.Allowed {
		t.Fatalf("peek: %+v", v)
	}
	ms, _ := p.Match(fromIP("192.0.2.1"))
	if v := policy.Enforce(ctx, lim, ms, policy.Options{Op: engine.OpRefund}); !v.Allowed || v.Results[1].StoreErr != nil {
		t.Fatalf("refund: %+v", v)
	}
}
