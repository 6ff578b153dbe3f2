package policy_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/policy"
)

// admittedOf sends n requests from one client declaring weight in
// x-request-weight, with no time passing, and counts the admitted ones.
func admittedOf(t *testing.T, cfg, weight string, n int) int {
	t.Helper()
	p := mustParse(t, cfg)
	lim, _ := newLimiter()
	admitted := 0
	for i := 0; i < n; i++ {
		in := fromIP("192.0.2.7")
		in.Header = http.Header{"X-Request-Weight": {weight}}
		if decide(t, p, lim, in, engine.OpTake, nil).Allowed {
			admitted++
		}
	}
	return admitted
}

const weightedCfg = `rules:
  - name: weighted
    limit_keys: ["ip:address"]
    algorithm_config: {rps: 10, burst: 100, cost_source: "header:x-request-weight"%s}
`

// Attack: with a client-declared cost, a client declares a tiny one
// (x-request-weight: 0.000001) so that a burst of 100 lets thousands of
// requests through. A declared cost is charged at least min_cost
// (default 1): at most burst/min_cost requests pass.
func TestAttackTinyDeclaredCost(t *testing.T) {
	if got := admittedOf(t, fmt.Sprintf(weightedCfg, ""), "0.000001", 300); got != 100 {
		t.Fatalf("%d of 300 requests declaring a cost of 0.000001 passed a burst of 100; want 100 (min_cost 1)", got)
	}
	if got := admittedOf(t, fmt.Sprintf(weightedCfg, ""), "1e-300", 300); got != 100 {
		t.Fatalf("%d of 300 requests declaring a cost of 1e-300 passed a burst of 100; want 100", got)
	}
}

// A configured min_cost lets declared costs go that low, and no lower.
func TestMinCost(t *testing.T) {
	cfg := fmt.Sprintf(weightedCfg, ", min_cost: 0.5")
	for weight, want := range map[string]int{"0.000001": 200, "0.5": 200, "2": 50, "": 100, "junk": 100} {
		if got := admittedOf(t, cfg, weight, 300); got != want {
			t.Errorf("weight %q: %d of 300 passed, want %d", weight, got, want)
		}
	}
}

// Attack: a bearer token without exp, once leaked (or minted for a trial),
// carries its plan forever. Such a token yields no claims unless the jwt
// section says require_exp: false.
func TestAttackJWTWithoutExp(t *testing.T) {
	t.Setenv("JWT_SECRET", testSecret)
	forever := jwt.MapClaims{"plan": "enterprise", "sub": "u1"}
	signed := sign(t, jwt.SigningMethodHS256, []byte(testSecret), forever)
	for _, section := range []string{"jwt:\n  hmac_secret_env: JWT_SECRET\n", "jwt:\n  verify: false\n"} {
		p := mustParse(t, section+tieredCfg)
		if got := limitFor(t, p, signed); got != "api-key.free" {
			t.Errorf("%q: a token without exp got %q, want api-key.free (no claims)", section, got)
		}
	}
	p := mustParse(t, "jwt:\n  hmac_secret_env: JWT_SECRET\n  require_exp: false\n"+tieredCfg)
	if got := limitFor(t, p, signed); got != "api-key.enterprise" {
		t.Errorf("require_exp: false: a token without exp got %q, want api-key.enterprise", got)
	}
}

// Attack: on a sharded rule with on_store_error: allow, a client declares
// a cost above what two shards hold together (2 x burst / shards) but
// within the burst. Judged against the whole burst, the request would go
// to the limiter, which can never serve it and fails it; taken for a
// store failure, on_store_error: allow would then admit it uncharged,
// every time. It must be rejected as cost_exceeds_limit, charging nothing.
func TestAttackShardedCostAboveTwoShards(t *testing.T) {
	p := mustParse(t, `rules:
  - name: hot
    on_store_error: allow
    algorithm_config: {rps: 10, burst: 100, shards: 10, cost_source: "header:x-request-weight"}
`)
	lim, _ := newLimiter()
	for i := 0; i < 5; i++ {
		in := fromIP("192.0.2.7")
		in.Header = http.Header{"X-Request-Weight": {"50"}}
		v := decide(t, p, lim, in, engine.OpTake, nil)
		r := v.Results[0]
		if v.Allowed || r.StoreErr != nil || r.Reason() != "cost_exceeds_limit" {
			t.Fatalf("request %d declaring 50 against 10 shards of 10: allowed %v, store error %v, reason %q; want rejected as cost_exceeds_limit",
				i+1, v.Allowed, r.StoreErr, r.Reason())
		}
	}
	if got := remaining(t, p, lim, "hot", "*"); got != 100 {
		t.Fatalf("the shards hold %d tokens, want all 100", got)
	}
	in := fromIP("192.0.2.7")
	in.Header = http.Header{"X-Request-Weight": {"20"}}
	if v := decide(t, p, lim, in, engine.OpTake, nil); !v.Allowed {
		t.Fatalf("a cost of 20, what two full shards hold, was rejected: %+v", v.Results[0])
	}
}

// Attack: a request the store refuses as the caller's fault (here a
// reservation on a sliding log, which cannot reserve) must not pass as a
// store failure: with on_store_error: allow it would be admitted with no
// limit at all. Enforce refuses it and charges nothing.
func TestAttackInputErrorIsNotAStoreFailure(t *testing.T) {
	lim, _ := newLimiter()
	log := sluice.MustLimit(sluice.Spec{Name: "log", Algorithm: sluice.SlidingLog, Rate: 1, Period: time.Minute, Capacity: 1})
	m := policy.Match{
		Rule:    &policy.Rule{Name: "log", OnStoreError: policy.AllowOnError, Limit: log, Algorithm: sluice.SlidingLog},
		Request: sluice.Request{Limit: log, Key: "k", Reserve: true},
	}
	for i := 0; i < 3; i++ {
		v := policy.Enforce(context.Background(), lim, engine.OpTake, []policy.Match{m}, nil)
		if v.Allowed || v.Results[0].StoreErr != nil {
			t.Fatalf("take %d: allowed %v, store error %v; want refused as the request's fault", i+1, v.Allowed, v.Results[0].StoreErr)
		}
	}
}
