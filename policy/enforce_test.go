package policy_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
)

func newLimiter() (*sluice.Limiter, *sluice.ManualClock) {
	clk := sluice.NewManualClock(time.Unix(1_700_000_000, 0))
	return sluice.New(memory.New(memory.Options{Clock: clk})), clk
}

// counter is an Observer that counts results per rule.
type counter map[string]int

func (c counter) Observe(rule, result string) { c[rule+"/"+result]++ }

// decide matches in and enforces the matches.
func decide(t *testing.T, p *policy.Policy, lim *sluice.Limiter, in *policy.Input, op engine.Op, obs policy.Observer) policy.Verdict {
	t.Helper()
	ms, err := p.Match(in)
	if err != nil {
		t.Fatal(err)
	}
	return policy.Enforce(context.Background(), lim, ms, policy.Options{Op: op, Observer: obs})
}

func fromIP(ip string) *policy.Input {
	return &policy.Input{Method: "GET", Path: "/", Peer: netip.AddrPortFrom(netip.MustParseAddr(ip), 1)}
}

// remaining peeks at the tokens in limit's bucket for key.
func remaining(t *testing.T, p *policy.Policy, lim *sluice.Limiter, limit, key string) int64 {
	t.Helper()
	d, err := lim.Peek(context.Background(), sluice.Request{Limit: p.Limit(limit), Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed {
		return int64(d.Tokens) + 1 // the peek's token of cost 1
	}
	return int64(d.Tokens)
}

func TestEnforceAllOrNothing(t *testing.T) {
	p := mustParse(t, `rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm_config: {rps: 1, burst: 2}
  - name: global
    algorithm_config: {rps: 1, burst: 3}
`)
	lim, _ := newLimiter()
	for i := 0; i < 2; i++ {
		if v := decide(t, p, lim, fromIP("192.0.2.1"), engine.OpTake, nil); !v.Allowed {
			t.Fatalf("A request %d rejected: %+v", i+1, v)
		}
	}
	v := decide(t, p, lim, fromIP("192.0.2.1"), engine.OpTake, nil)
	if v.Allowed || v.Overall.Rule != "per-ip" || v.Overall.RetryAfter != time.Second || len(v.Results) != 2 ||
		!v.Results[0].Violated || v.Results[1].Violated {
		t.Fatalf("A's third request: %+v", v)
	}
	if got := remaining(t, p, lim, "global", "*"); got != 1 {
		t.Fatalf("a rejected request charged the global bucket: %d left, want 1", got)
	}
	if v := decide(t, p, lim, fromIP("192.0.2.2"), engine.OpTake, nil); !v.Allowed || v.Overall.Rule != "global" || v.Overall.Remaining != 0 {
		t.Fatalf("B's first request: %+v", v.Overall)
	}
	v = decide(t, p, lim, fromIP("192.0.2.2"), engine.OpTake, nil)
	if v.Allowed || v.Overall.Rule != "global" {
		t.Fatalf("B's second request: %+v", v.Overall)
	}
	if got := remaining(t, p, lim, "per-ip", "192.0.2.2"); got != 1 {
		t.Fatalf("a rejected request charged B's bucket: %d left, want 1", got)
	}
	// Only the limit that refused counts as rejecting.
	obs := counter{}
	decide(t, p, lim, fromIP("192.0.2.1"), engine.OpTake, obs)
	if obs["per-ip/rejected"] != 1 || obs["global/rejected"] != 1 || len(obs) != 2 {
		t.Fatalf("observed %v", obs)
	}
	// A limit with room that was not charged is neither.
	decide(t, p, lim, fromIP("192.0.2.3"), engine.OpTake, obs)
	if obs["per-ip/not_charged"] != 1 || obs["per-ip/allowed"] != 0 || obs["global/rejected"] != 2 {
		t.Fatalf("observed %v", obs)
	}
}

func TestEnforcePeek(t *testing.T) {
	p := mustParse(t, "rules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n")
	lim, _ := newLimiter()
	for i := 0; i < 3; i++ {
		if v := decide(t, p, lim, &policy.Input{}, engine.OpPeek, nil); !v.Allowed {
			t.Fatalf("peek %d rejected", i)
		}
	}
	if v := decide(t, p, lim, &policy.Input{}, engine.OpTake, nil); !v.Allowed {
		t.Fatal("peeks consumed tokens")
	}
	if v := decide(t, p, lim, &policy.Input{}, engine.OpPeek, nil); v.Allowed {
		t.Fatal("peek on an empty bucket allowed")
	}
}

func TestShadowNeverRejects(t *testing.T) {
	p := mustParse(t, `rules:
  - name: trial
    mode: shadow
    algorithm_config: {rps: 1, burst: 1}
  - name: real
    algorithm_config: {rps: 1, burst: 3}
`)
	lim, _ := newLimiter()
	obs := counter{}
	for i := 0; i < 3; i++ {
		v := decide(t, p, lim, &policy.Input{}, engine.OpTake, obs)
		if !v.Allowed {
			t.Fatalf("request %d rejected: %+v", i+1, v)
		}
		if v.Overall.Rule != "real" || !v.Results[0].Shadow || v.Results[1].Shadow {
			t.Fatalf("request %d: shadow decided overall: %+v", i+1, v)
		}
		if shadowOK := v.Results[0].Decision.Allowed; shadowOK != (i == 0) {
			t.Fatalf("request %d: shadow decision allowed=%v", i+1, shadowOK)
		}
	}
	if obs["trial/allowed"] != 1 || obs["trial/shadow_rejected"] != 2 || obs["real/allowed"] != 3 {
		t.Fatalf("observed %v", obs)
	}
	// Once the enforced rule rejects, the shadow rule is only peeked: its
	// counts stay what enforcing both would have produced.
	v := decide(t, p, lim, &policy.Input{}, engine.OpTake, obs)
	if v.Allowed || obs["real/rejected"] != 1 {
		t.Fatalf("fourth request: %+v %v", v, obs)
	}
	// Shadow-only policies allow everything.
	sp := mustParse(t, "rules:\n  - name: s\n    mode: shadow\n    algorithm_config: {rps: 1, burst: 1}\n")
	for i := 0; i < 3; i++ {
		if v := decide(t, sp, lim, &policy.Input{}, engine.OpTake, nil); !v.Allowed || v.Overall != (sluice.Decision{}) {
			t.Fatalf("shadow-only request %d: %+v", i+1, v)
		}
	}
}

func TestStoreErrors(t *testing.T) {
	p := mustParse(t, `rules:
  - name: open
    algorithm_config: {rps: 1, burst: 2}
  - name: closed
    on_store_error: deny
    match: {path_prefix: /pay}
    algorithm_config: {rps: 1, burst: 2}
  - name: shadow
    mode: shadow
    on_store_error: deny
    algorithm_config: {rps: 1, burst: 2}
`)
	clk := sluice.NewManualClock(time.Unix(1_700_000_000, 0))
	st := &conformance.FaultyStore{Store: memory.New(memory.Options{Clock: clk})}
	lim := sluice.New(st)
	st.Down.Store(true)
	obs := counter{}

	v := decide(t, p, lim, &policy.Input{Path: "/"}, engine.OpTake, obs)
	if !v.Allowed || len(v.Results) != 2 || !errors.Is(v.Results[0].StoreErr, conformance.ErrStoreDown) || !errors.Is(v.Results[1].StoreErr, conformance.ErrStoreDown) {
		t.Fatalf("on_store_error allow: %+v", v)
	}
	v = decide(t, p, lim, &policy.Input{Path: "/pay"}, engine.OpTake, obs)
	if v.Allowed || v.Overall.Rule != "closed" || v.Overall.RetryAfter != policy.StoreErrorRetry {
		t.Fatalf("on_store_error deny: %+v", v)
	}
	if obs["open/store_error"] != 2 || obs["closed/store_error"] != 1 || obs["shadow/store_error"] != 2 {
		t.Fatalf("observed %v", obs)
	}
	// Nothing was charged while the store was down.
	st.Down.Store(false)
	if got := remaining(t, p, lim, "open", "*"); got != 2 {
		t.Fatalf("state changed during the outage: %d left", got)
	}
}

func TestCostAboveCapacity(t *testing.T) {
	p := mustParse(t, `rules:
  - name: other
    algorithm_config: {rps: 1, burst: 5}
  - name: weighted
    algorithm_config: {rps: 1, burst: 10, cost_source: "header:x-weight"}
`)
	lim, _ := newLimiter()
	for _, w := range []string{"11", "1e400", "Inf"} {
		v := decide(t, p, lim, &policy.Input{Header: http.Header{"X-Weight": {w}}}, engine.OpTake, nil)
		if v.Allowed || v.Results[1].Decision.Allowed || v.Results[1].Decision.Rule != "weighted" {
			t.Fatalf("weight %s: %+v", w, v)
		}
	}
	if got := remaining(t, p, lim, "other", "*"); got != 5 {
		t.Fatalf("an impossible request charged another rule: %d left", got)
	}
	if v := decide(t, p, lim, &policy.Input{Header: http.Header{"X-Weight": {"-100"}}}, engine.OpTake, nil); !v.Allowed {
		t.Fatalf("negative weight (default cost 1) rejected: %+v", v)
	}
	if got := remaining(t, p, lim, "weighted", "*"); got != 9 {
		t.Fatalf("negative weight charged %d tokens, want the default 1", 10-got)
	}
}

func TestTiersEnforced(t *testing.T) {
	t.Setenv("SLUICE_JWT_SECRET", testSecret)
	p, err := policy.Load("../examples/tiered.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lim, clk := newLimiter()
	exp := time.Now().Add(time.Hour).Unix() // tokens are checked on the real clock
	enterprise := sign(t, jwt.SigningMethodHS256, []byte(testSecret), jwt.MapClaims{"plan": "enterprise", "sub": "acme", "exp": exp})
	forged := sign(t, jwt.SigningMethodHS256, []byte("not-the-secret-but-long-enough-0123456789"), jwt.MapClaims{"plan": "enterprise", "exp": exp})
	req := func(token string) *policy.Input {
		h := http.Header{"X-Api-Key": {"key-1"}}
		if token != "" {
			h.Set("Authorization", "Bearer "+token)
		}
		return &policy.Input{Method: "GET", Path: "/", Header: h, Peer: netip.MustParseAddrPort("192.0.2.1:1")}
	}
	// A free caller gets 20, then is rejected by the free tier.
	for i := 0; i < 20; i++ {
		if v := decide(t, p, lim, req(""), engine.OpTake, nil); !v.Allowed {
			t.Fatalf("free request %d rejected", i+1)
		}
	}
	v := decide(t, p, lim, req(""), engine.OpTake, nil)
	if v.Allowed || v.Overall.Rule != "api-key.free" || v.Overall.Capacity != 20 {
		t.Fatalf("free request 21: %+v", v.Overall)
	}
	// A forged enterprise token is a free caller.
	if v := decide(t, p, lim, req(forged), engine.OpTake, nil); v.Allowed || v.Overall.Rule != "api-key.free" {
		t.Fatalf("forged token: %+v", v.Overall)
	}
	// The same API key with a verified enterprise token is limited only by
	// the enterprise tier: the exhausted free bucket does not apply.
	for i := 0; i < 2000; i++ {
		v := decide(t, p, lim, req(enterprise), engine.OpTake, nil)
		if !v.Allowed || v.Overall.Rule != "api-key.enterprise" {
			t.Fatalf("enterprise request %d: %+v", i+1, v.Overall)
		}
		if i == 0 && (v.Results[0].Match.Identity != "sub:acme" || v.Results[0].Match.Tier.Name != "enterprise") {
			t.Fatalf("enterprise match: %+v", v.Results[0].Match)
		}
	}
	if v := decide(t, p, lim, req(enterprise), engine.OpTake, nil); v.Allowed || v.Overall.Capacity != 2000 {
		t.Fatalf("enterprise request 2001: %+v", v.Overall)
	}
	// And enterprise traffic never drained the free bucket: after one
	// second it holds the 10 tokens of refill.
	clk.Advance(time.Second)
	if got := remaining(t, p, lim, "api-key.free", "key-1"); got != 10 {
		t.Fatalf("free bucket holds %d, want 10", got)
	}
	if ms, _ := p.Match(req("")); ms[0].Identity != "ip:192.0.2.1" {
		t.Fatalf("identity without a token: %q", ms[0].Identity)
	}
}

func TestTierFallback(t *testing.T) {
	p := mustParse(t, `rules:
  - name: api
    tiers:
      - name: writes
        match: {method: [POST, PUT]}
        algorithm_config: {rps: 1, burst: 1}
    algorithm_config: {rps: 5, burst: 5}
  - name: tier-only
    tiers:
      - name: gets
        match: {method: GET}
        algorithm_config: {rps: 1, burst: 1}
`)
	ms, _ := p.Match(&policy.Input{Method: "DELETE"})
	if len(ms) != 1 || ms[0].Request.Limit.Name() != "api" || ms[0].Tier != nil {
		t.Fatalf("no tier matched: want the rule's own limit only, got %+v", ms)
	}
	ms, _ = p.Match(&policy.Input{Method: "GET"})
	if len(ms) != 2 || ms[1].Request.Limit.Name() != "tier-only.gets" {
		t.Fatalf("GET: %+v", ms)
	}
	if r := p.Rule("tier-only"); r.Limit != p.Limit("tier-only.gets") {
		t.Fatalf("Rule.Limit of a tier-only rule is its last tier's limit")
	}
}

func TestHandBuiltRule(t *testing.T) {
	lim := sluice.MustLimit(sluice.Spec{Name: "h", TokensPerSecond: 1, Burst: 1})
	p := &policy.Policy{Rules: []*policy.Rule{{Name: "h", Limit: lim}}}
	ms, err := p.Match(&policy.Input{})
	if err != nil || len(ms) != 1 || ms[0].Request.Limit != lim || ms[0].Request.Key != "*" || ms[0].Request.Cost != 1 {
		t.Fatalf("hand-built rule: %+v %v", ms, err)
	}
	if ls := p.Limits(); len(ls) != 1 || ls[0] != lim {
		t.Fatalf("Limits: %v", ls)
	}
	loaded := mustParse(t, "jwt: {verify: false}\n"+tieredCfg)
	var names []string
	for _, l := range loaded.Limits() {
		names = append(names, l.Name())
	}
	if got := fmt.Sprint(names); got != "[api-key.enterprise api-key.free]" {
		t.Fatalf("Limits of a tiered rule: %s", got)
	}
}

func BenchmarkMatchEnforce(b *testing.B) {
	p := mustParse(b, `trusted_proxies: ["10.0.0.0/8"]
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm_config: {rps: 1000000, burst: 1000000}
  - name: per-key
    limit_keys: ["header:x-api-key", "path"]
    match: {path_prefix: /api/}
    algorithm_config: {rps: 1000000, burst: 1000000}
  - name: global
    algorithm_config: {rps: 1000000000, burst: 1000000000}
`)
	lim, _ := newLimiter()
	in := &policy.Input{Method: "GET", Path: "/api/items", Peer: netip.MustParseAddrPort("10.0.0.1:5"),
		Header: http.Header{"X-Api-Key": {"key-123"}, "X-Forwarded-For": {"198.51.100.7"}}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		ms, _ := p.Match(in)
		if v := policy.Enforce(ctx, lim, ms, policy.Options{}); !v.Allowed {
			b.Fatal("rejected")
		}
	}
}

// LimitMatch asks the store what Match asks for a request reaching the
// same limit: the reservation and the cost of a request declaring none
// included, for a rule's own limit, a tier's and a hand-built rule's.
func TestLimitMatch(t *testing.T) {
	p := mustParse(t, `rules:
  - name: batch
    limit_keys: ["header:x-api-key"]
    algorithm_config: {rps: 10, burst: 10, reserve: true, max_reserved: 20, cost_source: "header:x-cost", default_cost: 2}
  - name: api
    limit_keys: ["header:x-api-key"]
    tiers:
      - name: writes
        match: {method: POST}
        algorithm_config: {rps: 1, burst: 5, cost_source: fixed, fixed_cost: 3}
`)
	ms, _ := p.Match(&policy.Input{Method: "POST", Header: http.Header{"X-Api-Key": {"k:1"}}})
	if len(ms) != 2 {
		t.Fatalf("Match: %+v", ms)
	}
	for _, m := range ms {
		got, ok := p.LimitMatch(m.Request.Limit.Name(), m.Request.Key)
		if !ok || got.Request != m.Request || got.Rule != m.Rule || got.Tier != m.Tier {
			t.Fatalf("LimitMatch(%q) = %+v, Match gave %+v", m.Request.Limit.Name(), got, m)
		}
	}
	if !ms[0].Request.Reserve || ms[0].Request.Cost != 2 || ms[1].Request.Cost != 3 {
		t.Fatalf("requests: %+v %+v", ms[0].Request, ms[1].Request)
	}
	if _, ok := p.LimitMatch("nope", "k"); ok {
		t.Fatal("LimitMatch found a limit that does not exist")
	}
	lim := sluice.MustLimit(sluice.Spec{Name: "h", TokensPerSecond: 1, Burst: 1})
	hand := &policy.Policy{Rules: []*policy.Rule{{Name: "h", Limit: lim}}}
	if m, ok := hand.LimitMatch("h", "k"); !ok || m.Request != (sluice.Request{Limit: lim, Key: "k", Cost: 1}) {
		t.Fatalf("hand-built rule: %+v", m)
	}
	// A key component is what Match puts in the key for the same value.
	if got := policy.KeyComponent("k:1"); got != ms[0].Request.Key {
		t.Fatalf("KeyComponent = %q, Match keyed %q", got, ms[0].Request.Key)
	}
}

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
		v := policy.Enforce(context.Background(), lim, []policy.Match{m}, policy.Options{})
		if v.Allowed || v.Results[0].StoreErr != nil {
			t.Fatalf("take %d: allowed %v, store error %v; want refused as the request's fault", i+1, v.Allowed, v.Results[0].StoreErr)
		}
	}
}

// readCounter is a store that counts the keys it is asked about.
type readCounter struct {
	sluice.Store
	keys int
}

func (c *readCounter) Take(ctx context.Context, op engine.Op, r sluice.Charged) (sluice.Decision, error) {
	c.keys++
	return c.Store.Take(ctx, op, r)
}

func (c *readCounter) TakeAll(ctx context.Context, op engine.Op, rs []sluice.Charged, dst []sluice.Decision) ([]sluice.Decision, error) {
	c.keys += len(rs)
	return c.Store.TakeAll(ctx, op, rs, dst)
}

// Attack: a request that another rule refuses without charging (a cost
// it can never be granted, here one the client declares, or a full
// concurrency limit) is answered with a peek of its other limits, and a
// peek of a sharded limit read every shard: each such request, free to
// the client, cost the store a read of all 64 shards of a hot limit, 30
// times what an admitted take reads. It reads two, as a take does.
func TestAttackRefusedRequestReadsEveryShard(t *testing.T) {
	p := mustParse(t, `rules:
  - name: per-client
    limit_keys: ["ip:address"]
    algorithm_config: {rps: 1, burst: 10, cost_source: "header:x-weight"}
  - name: hot
    algorithm_config: {rps: 6400, burst: 6400, shards: 64}
  - name: hot-shadow
    mode: shadow
    algorithm_config: {rps: 6400, burst: 6400, shards: 64}
`)
	clk := sluice.NewManualClock(time.Unix(1_700_000_000, 0))
	st := &readCounter{Store: memory.New(memory.Options{Clock: clk})}
	lim := sluice.New(st)
	in := fromIP("192.0.2.7")
	in.Header = http.Header{"X-Weight": {"1000"}}
	v := decide(t, p, lim, in, engine.OpTake, nil)
	if v.Allowed || v.Results[0].Reason() != "cost_exceeds_limit" {
		t.Fatalf("a cost of 1000 against a burst of 10: %+v", v.Results[0])
	}
	if st.keys > 2*(2+2) {
		t.Fatalf("a refused request read %d keys of the store; want at most the two shards of each sharded limit a take reads, and their charge", st.keys)
	}
}
