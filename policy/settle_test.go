package policy_test

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/settle"
)

const llmCfg = `rules:
  - name: tokens
    limit_keys: ["header:x-api-key"]
    algorithm_config:
      rate: 1000
      period: 1m
      capacity: 10000
      cost_source: "body:max_tokens"
      default_cost: 4000
      settle_from: "body:usage.total_tokens"
      stream_usage: include
  - name: by-header
    algorithm_config:
      rps: 10
      burst: 100
      settle_from: "header:x-usage-tokens"
      unsettled_cost: 25
  - name: tiered
    tiers:
      - name: gold
        match: {"header:x-plan": gold}
        algorithm_config: {rps: 10, burst: 100, settle_from: "trailer:x-cost"}
      - name: free
        algorithm_config: {rps: 1, burst: 10}
`

// The cost of a body:PATH rule is the number at the path of the request's
// JSON body: default_cost when the body is absent, not JSON, lacks the
// path or holds no number there; a key given twice costs the most of its
// values, and never less than default_cost then.
func TestBodyCost(t *testing.T) {
	p := mustParse(t, llmCfg)
	if !p.ReadsBody() {
		t.Fatal("ReadsBody is false for a body:PATH cost_source")
	}
	deep := strings.Repeat("[", 200) + strings.Repeat("]", 200)
	for body, want := range map[string]float64{
		`{"max_tokens": 250}`: 250,
		`{"model":"m","messages":[{"max_tokens":9}],"max_tokens":300}`: 300,
		`{"nested":{"max_tokens":9}}`:                                  4000,
		`{"max_tokens": "250"}`:                                        250, // as pydantic reads it
		`{"max_tokens": "many"}`:                                       4000,
		`{"max_tokens": null}`:                                         4000,
		`{"max_tokens": -5}`:                                           4000,
		`{"max_tokens": 0.5}`:                                          1,    // min_cost
		`{"max_tokens": 250`:                                           4000, // not JSON
		`{"max_tokens": 250} {"max_tokens": 1}`:                        4000, // two values
		`{"max_tokens": 250} x`:                                        4000,
		``:                                                             4000,
		`[{"max_tokens": 5}]`:                                          4000,
		`{"max_tokens": 1, "max_tokens": 900}`:                         4000,
		`{"max_tokens": 9000, "max_tokens": 1}`:                        9000,
		`{"max\u005ftokens": 700}`:                                     700,  // the key as JSON reads it
		`{"a":` + deep + `, "max_tokens": 20}`:                         4000, // nested beyond the bound
		`{"max_tokens": 1e400}`:                                        0,    // above any capacity: infinite
	} {
		in := fromIP("192.0.2.1")
		in.Header = http.Header{"X-Api-Key": {"k"}}
		if body != "" {
			in.Body = []byte(body)
		}
		ms, err := p.Match(in)
		if err != nil || len(ms) < 1 {
			t.Fatalf("match: %v %v", ms, err)
		}
		got := ms[0].Request.Cost
		if want == 0 {
			if got <= 1e308 {
				t.Errorf("body %q costs %v, want +Inf", body, got)
			}
			continue
		}
		if got != want {
			t.Errorf("body %q costs %v, want %v", body, got, want)
		}
	}
}

// Match carries each limit's settle_from, tiers' included; Rule.SettleFrom
// finds it for the decision API, and SettleHeaders lists the fields the
// proxy must not let a client send.
func TestSettleFromLoads(t *testing.T) {
	p := mustParse(t, llmCfg)
	in := fromIP("192.0.2.1")
	in.Header = http.Header{"X-Plan": {"gold"}, "X-Api-Key": {"k"}}
	ms, err := p.Match(in)
	if err != nil || len(ms) != 3 {
		t.Fatalf("match: %v %v", ms, err)
	}
	for i, want := range []settle.Source{
		// unsettled_cost defaults to the most one request may cost: the
		// capacity.
		{Kind: settle.Body, Path: []string{"usage", "total_tokens"}, Text: "body:usage.total_tokens", Unsettled: 10000, StreamUsage: true},
		{Kind: settle.Header, Name: "X-Usage-Tokens", Text: "header:x-usage-tokens", Unsettled: 25},
		{Kind: settle.Trailer, Name: "X-Cost", Text: "trailer:x-cost", Unsettled: 100},
	} {
		if ms[i].Settle == nil || !reflect.DeepEqual(*ms[i].Settle, want) {
			t.Errorf("match %d (%s) settles from %+v, want %+v", i, ms[i].Request.Limit.Name(), ms[i].Settle, want)
		}
	}
	in.Header.Set("X-Plan", "none")
	ms, _ = p.Match(in)
	if ms[2].Settle != nil {
		t.Errorf("the free tier settles from %v, want nothing", ms[2].Settle)
	}
	rule, lim, err := p.FindLimit("tiered.gold")
	if err != nil || rule.SettleFrom(lim) == nil || rule.SettleFrom(lim).Name != "X-Cost" {
		t.Errorf("FindLimit(tiered.gold): %v, settles from %v", err, rule.SettleFrom(lim))
	}
	rule, lim, _ = p.FindLimit("tiered.free")
	if rule.SettleFrom(lim) != nil {
		t.Errorf("tiered.free settles from %v", rule.SettleFrom(lim))
	}
	if got := p.SettleHeaders(); !reflect.DeepEqual(got, []string{"X-Usage-Tokens", "X-Cost"}) {
		t.Errorf("SettleHeaders %v", got)
	}
	m, ok := p.LimitMatch("tokens", "k")
	if !ok || m.Settle == nil || m.Settle.Kind != settle.Body {
		t.Errorf("LimitMatch: %+v", m)
	}
	if policy.Default().ReadsBody() || len(policy.Default().SettleHeaders()) > 0 {
		t.Error("the default policy reads bodies or settles")
	}
}

func TestSettleFromErrors(t *testing.T) {
	t.Setenv("SHORT_SETTLE", "short")
	t.Setenv("SLUICE_SETTLE_SECRET", strings.Repeat("k", 32))
	for cfg, want := range map[string]string{
		rule("", "      rps: 1\n      burst: 5\n      settle_from: usage\n"):                                       `c.yaml:7: rules[0].algorithm_config.settle_from: must be header:NAME, trailer:NAME, body:PATH (a JSON path such as usage.total_tokens) or caller (got "usage")`,
		rule("", "      rps: 1\n      burst: 5\n      settle_from: \"body:usage..total\"\n"):                       `c.yaml:7: rules[0].algorithm_config.settle_from: the JSON path "usage..total" must be object keys joined by dots, such as usage.total_tokens`,
		rule("", "      rps: 1\n      burst: 5\n      settle_from: \"header:x cost\"\n"):                           `c.yaml:7: rules[0].algorithm_config.settle_from: the header name "x cost" is not a valid HTTP field name`,
		rule("", "      rps: 1\n      burst: 5\n      settle_from: \"query:n\"\n"):                                 `c.yaml:7: rules[0].algorithm_config.settle_from: must be header:NAME, trailer:NAME, body:PATH (a JSON path such as usage.total_tokens) or caller (got "query:n")`,
		rule("", "      rps: 1\n      burst: 5\n      settle_from: \"body:a.b.c.d.e.f.g.h.i\"\n"):                  `c.yaml:7: rules[0].algorithm_config.settle_from: the JSON path "a.b.c.d.e.f.g.h.i" has more than 8 keys`,
		rule("", "      rps: 1\n      burst: 5\n      cost_source: \"body:\"\n"):                                   `c.yaml:7: rules[0].algorithm_config.cost_source: the JSON path "" must be object keys joined by dots, such as usage.total_tokens`,
		rule("", "      rps: 1\n      burst: 5\n      cost_source: \"bogus:x\"\n"):                                 `c.yaml:7: rules[0].algorithm_config.cost_source: must be fixed, header:NAME, query:NAME or body:PATH (got "bogus:x")`,
		rule("", "      rps: 1\n      burst: 5\n      unsettled_cost: 5\n"):                                        `c.yaml:7: rules[0].algorithm_config.unsettled_cost: unsettled_cost applies only with settle_from (it is what a request is charged when its response does not state the cost settle_from reads)`,
		rule("", "      rps: 1\n      burst: 5\n      settle_from: caller\n      unsettled_cost: 5\n"):             `c.yaml:8: rules[0].algorithm_config.unsettled_cost: unsettled_cost does not apply with settle_from: caller (the decision API's caller states every cost)`,
		rule("", "      rps: 1\n      burst: 5\n      settle_from: \"header:x-n\"\n      unsettled_cost: 0\n"):     `c.yaml:8: rules[0].algorithm_config.unsettled_cost: must be > 0 and at most 2e+09 (got 0)`,
		rule("", "      rps: 1\n      burst: 5\n      settle_from: \"header:x-n\"\n      stream_usage: include\n"): `c.yaml:8: rules[0].algorithm_config.stream_usage: applies only with settle_from: body:PATH (the usage an OpenAI-style stream sends is in its last event)`,
		rule("", "      rps: 1\n      burst: 5\n      settle_from: \"body:u\"\n      stream_usage: yes\n"):         `c.yaml:8: rules[0].algorithm_config.stream_usage: must be include (add stream_options.include_usage to requests whose JSON body sets "stream": true) or off (got "yes")`,
		"settle_secret_env: \"not a name\"\n" + rule("", "      rps: 1\n      burst: 5\n"):                         `c.yaml:1: settle_secret_env: must be the name of an environment variable, such as SLUICE_SETTLE_SECRET (got "not a name")`,
		"settle_secret_env: SLUICE_TEST_UNSET\n" + rule("", "      rps: 1\n      burst: 5\n"):                      `c.yaml:1: settle_secret_env: environment variable SLUICE_TEST_UNSET is not set or empty`,
		"settle_secret_env: SHORT_SETTLE\n" + rule("", "      rps: 1\n      burst: 5\n"):                           `c.yaml:1: settle_secret_env: the key in SHORT_SETTLE is 5 bytes; use at least 32 (random, such as: openssl rand -hex 32)`,
	} {
		got := problems(t, cfg)
		if len(got) != 1 || got[0] != want {
			t.Errorf("config\n%s\ngives %q\nwant  %q", cfg, got, want)
		}
	}
	p := mustParse(t, "settle_secret_env: SLUICE_SETTLE_SECRET\n"+rule("", "      rps: 1\n      burst: 5\n      settle_from: caller\n"))
	if !mustParse(t, rule("", "      rps: 1\n      burst: 5\n      settle_from: \"body:u\"\n      stream_usage: include\n")).ReadsBody() {
		t.Error("stream_usage: include does not read the request body it rewrites")
	}
	if p.Settings.SettleSecretEnv != "SLUICE_SETTLE_SECRET" {
		t.Errorf("settle_secret_env: %q", p.Settings.SettleSecretEnv)
	}
	if sf := p.Rules[0].SettleFrom(p.Rules[0].Limit); sf == nil || sf.Kind != settle.Caller {
		t.Errorf("settle_from: caller loads as %+v", sf)
	}
}

// The request a body cost builds is what the store is asked: the charge
// that a settlement later corrects.
func TestBodyCostCharges(t *testing.T) {
	p := mustParse(t, llmCfg)
	lim, _ := newLimiter()
	in := fromIP("192.0.2.1")
	in.Header = http.Header{"X-Api-Key": {"k"}}
	in.Body = []byte(`{"max_tokens": 2500}`)
	v := decide(t, p, lim, in, engine.OpTake, nil)
	if !v.Allowed || v.Results[0].Decision.Tokens != 7500 {
		t.Fatalf("verdict %+v, want 7500 tokens left of 10000", v.Results[0].Decision)
	}
}

// TestAttackSettleOvershootForgivenOnBillingWindows: a rule of the
// billing windows (a calendar month, a sliding window) with settle_from
// takes the client's estimate up front and settles the usage the
// response reports. docs/concepts.md promises that what a request used
// beyond its estimate is carried as debt ("zero [forgiven] on every limit
// but a sliding log"), so a key that used more is refused until it has
// paid it back. On these windows the extra is forgiven instead
// (settleDebt is 0 for Windowed limits): each month a client that
// declares max_tokens 1 and uses 1,000 tokens is charged at most its
// capacity of 100, and the next window starts afresh. Either the loader
// refuses settle_from on such a rule, or the overshoot must be carried.
func TestAttackSettleOvershootForgivenOnBillingWindows(t *testing.T) {
	for name, alg := range map[string][2]string{
		"calendar month": {"fixed_window", `{rate: 100, period: month, timezone: UTC, cost_source: "body:max_tokens", settle_from: "body:usage.total_tokens"}`},
		"sliding window": {"sliding_window", `{rate: 100, period: 720h, cost_source: "body:max_tokens", settle_from: "body:usage.total_tokens"}`},
	} {
		t.Run(name, func(t *testing.T) { overshootForgiven(t, alg[0], alg[1]) })
	}
}

// TestAttackSettleOvershootForgivenOnSlidingLog: a sliding log keeps no
// debt either (Limit.SettleDebt is 0 there): its entries leave the log
// at the window's end whatever the request went on to use, so a client
// declaring max_tokens 1 and using 1,000 was charged at most the log's
// 100 a window and forgiven the rest, the attack the loader already
// refuses on a sliding window, month after month.
func TestAttackSettleOvershootForgivenOnSlidingLog(t *testing.T) {
	overshootForgiven(t, "sliding_log", `{rate: 100, period: 720h, cost_source: "body:max_tokens", settle_from: "body:usage.total_tokens"}`)
}

// overshootForgiven runs the billing-window attack on a rule of
// algorithm alg with algorithm_config cfg: the loader refuses it, or
// nothing a request used beyond its estimate is forgiven over 12 windows.
func overshootForgiven(t *testing.T, alg, algCfg string) {
	t.Helper()
	cfg := "rules:\n  - name: budget\n    limit_keys: [\"header:x-api-key\"]\n    algorithm: " + alg + "\n    algorithm_config: " + algCfg + "\n"
	p, err := policy.Parse("test.yaml", []byte(cfg))
	if err != nil {
		if !strings.Contains(err.Error(), "settle_from") {
			t.Fatalf("parse: %v", err)
		}
		return // refused: settle on a token bucket or a fixed window
	}
	_, lim, err := p.FindLimit("budget")
	if err != nil {
		t.Fatal(err)
	}
	clk := sluice.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	l := sluice.New(memory.New(memory.Options{Clock: clk}))
	ctx := context.Background()
	var used, forgiven float64
	admitted := 0
	for month := 0; month < 12; month++ {
		req := sluice.Request{Limit: lim, Key: "attacker", Cost: 1}
		d, err := l.Take(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
			s, err := l.Settle(ctx, req, 1, 1000)
			if err != nil {
				t.Fatal(err)
			}
			used += 1000
			forgiven += s.Forgiven
		}
		clk.Set(time.Date(2026, time.Month(month+2), 1, 0, 0, 1, 0, time.UTC))
	}
	if forgiven > 0 {
		t.Errorf("%d requests admitted over 12 windows of 100 tokens used %v tokens; settlement forgave %v of them (Limit.SettleDebt() = %v), want the overshoot carried as debt",
			admitted, used, forgiven, lim.SettleDebt())
	}
}

// Attack: a client states its cost in a JSON body twice, once in the
// rule's spelling and once in another case. Go's encoding/json (the
// upstream of any Go service, OpenAI-compatible servers among them)
// matches object keys case-insensitively, Unicode folding included
// (K, the Kelvin sign, is k), and takes the last: the upstream reads
// 9000 where sluice reads only the lowercase 1. A key an upstream may
// read from either member is a key given twice: it must cost the most of
// its values (and at least default_cost), as an exact repeat does.
func TestAttackBodyCostCaseFoldedDuplicate(t *testing.T) {
	p := mustParse(t, llmCfg)
	for _, body := range []string{
		`{"max_tokens": 1, "MAX_TOKENS": 9000}`,
		`{"max_tokens": 1, "Max_Tokens": 9000}`,
		"{\"max_tokens\": 1, \"max_to\u212aens\": 9000}",
	} {
		// What a Go upstream reads.
		var up struct {
			MaxTokens float64 `json:"max_tokens"`
		}
		if err := json.Unmarshal([]byte(body), &up); err != nil || up.MaxTokens != 9000 {
			t.Fatalf("%s: encoding/json read %v (%v), want 9000", body, up.MaxTokens, err)
		}
		in := fromIP("192.0.2.1")
		in.Header = http.Header{"X-Api-Key": {"k"}}
		in.Body = []byte(body)
		ms, err := p.Match(in)
		if err != nil || len(ms) < 1 {
			t.Fatalf("match: %v %v", ms, err)
		}
		if got := ms[0].Request.Cost; got < up.MaxTokens {
			t.Errorf("body %s costs %v, but a Go upstream reads max_tokens %v", body, got, up.MaxTokens)
		}
	}
}
