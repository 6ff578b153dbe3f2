package policy_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/serverconf"
)

const testSecret = "0123456789abcdef0123456789abcdef-test-secret"

// mustParse parses cfg or fails the test with every problem.
func mustParse(t testing.TB, cfg string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte(cfg))
	if err != nil {
		t.Fatalf("parse:\n%v", err)
	}
	return p
}

// mustServer parses cfg, or fails the test with every problem, and
// returns the server's settings it gives.
func mustServer(t testing.TB, cfg string) serverconf.Settings {
	t.Helper()
	_, s, err := policy.ParseConfig("test.yaml", []byte(cfg))
	if err != nil {
		t.Fatalf("parse:\n%v", err)
	}
	return s
}

// problems parses cfg and returns its error lines.
func problems(t *testing.T, cfg string) []string {
	t.Helper()
	_, err := policy.Parse("c.yaml", []byte(cfg))
	if err == nil {
		return nil
	}
	var es *policy.Errors
	if !errors.As(err, &es) {
		t.Fatalf("error %T is not *policy.Errors: %v", err, err)
	}
	var out []string
	for _, e := range es.List {
		var pe *policy.Error
		if !errors.As(e, &pe) {
			t.Fatalf("item %T is not *policy.Error", e)
		}
		out = append(out, e.Error())
	}
	if strings.Join(out, "\n") != err.Error() {
		t.Fatalf("Error() %q does not list the items one per line", err.Error())
	}
	return out
}

// rule wraps an algorithm_config body (indented by 6) in a one-rule file
// whose config starts at line 5.
func rule(extra, body string) string {
	return "rules:\n  - name: r\n    limit_keys: []\n" + extra + "    algorithm_config:\n" + body
}

// validationCase is a file with problems and the errors it must report.
type validationCase struct {
	name string
	cfg  string
	want []string
}

func TestValidationErrors(t *testing.T) {
	t.Setenv("EMPTY_SECRET", "")
	t.Setenv("SHORT_SECRET", "short")
	cases := append(algorithmConfigCases(), ruleAndFileCases()...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := problems(t, tc.cfg)
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// algorithmConfigCases are the problems of a rule's algorithm_config.
func algorithmConfigCases() []validationCase {
	return []validationCase{
		{"burst below a micro-token", rule("", "      tokens_per_second: 100\n      burst: 0.0000001\n"),
			[]string{"c.yaml:6: rules[0].algorithm_config.burst: must be at least 0.000001 (one micro-token, the least every store counts), got 1e-07"}},
		{"burst out of range", rule("", "      rps: 10\n      burst: 1e12\n"),
			[]string{"c.yaml:6: rules[0].algorithm_config.burst: must be at most 9007199254.740992 (2^53 micro-tokens, the most every store counts exactly), got 1e+12"}},
		{"rps out of range", rule("", "      rps: 1e12\n      burst: 10\n"),
			[]string{"c.yaml:5: rules[0].algorithm_config.rps: must be at most 9007199254.740992 (2^53 micro-tokens, the most every store counts exactly), got 1e+12"}},
		{"capacity out of range", rule("", "      rate: 10\n      period: 1m\n      capacity: 1e12\n"),
			[]string{"c.yaml:7: rules[0].algorithm_config.capacity: must be at most 9007199254.740992 (2^53 micro-tokens, the most every store counts exactly), got 1e+12"}},
		{"both spellings of the rate", rule("", "      rps: 10\n      tokens_per_second: 10\n      burst: 20\n"),
			[]string{"c.yaml:5: rules[0].algorithm_config.rps: is an alias of tokens_per_second: give one of them"}},
		{"no rate", rule("", "      burst: 20\n"),
			[]string{"c.yaml:5: rules[0].algorithm_config: needs a rate: tokens_per_second (or its alias rps), or rate with period"}},
		{"burst missing", rule("", "      rps: 10\n"),
			[]string{"c.yaml:5: rules[0].algorithm_config.burst: is required with rps (the bucket size: how many requests may pass at once; or burst_seconds)"}},
		{"zero rate", rule("", "      rps: 0\n      burst: 1\n"),
			[]string{"c.yaml:5: rules[0].algorithm_config.rps: must be > 0 (got 0)"}},
		{"negative burst", rule("", "      rps: 1\n      burst: -1\n"),
			[]string{"c.yaml:6: rules[0].algorithm_config.burst: must be > 0 (got -1)"}},
		{"rate as a string", rule("", "      rps: \"10\"\n      burst: 20\n"),
			[]string{`c.yaml:5: rules[0].algorithm_config.rps: must be a number (got the string "10")`}},
		{"nan", rule("", "      rps: .nan\n      burst: 20\n"),
			[]string{"c.yaml:5: rules[0].algorithm_config.rps: must be a finite number"}},
		{"typo in algorithm_config", rule("", "      rps: 10\n      brust: 20\n"),
			[]string{
				`c.yaml:5: rules[0].algorithm_config.burst: is required with rps (the bucket size: how many requests may pass at once; or burst_seconds)`,
				`c.yaml:6: rules[0].algorithm_config.brust: unknown field (did you mean "burst"?)`,
			}},
		{"typo in a rule", "rules:\n  - name: r\n    limit_key: [ip:address]\n    algorithm_config: {rps: 1, burst: 1}\n",
			[]string{`c.yaml:3: rules[0].limit_key: unknown field (did you mean "limit_keys"?)`}},
		{"typo at the top", "listne: \":80\"\nrules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n",
			[]string{`c.yaml:1: listne: unknown field (did you mean "listen"?)`}},
		{"field of another algorithm", rule("    algorithm: fixed_window\n", "      rate: 10\n      period: 1m\n      burst: 20\n"),
			[]string{"c.yaml:8: rules[0].algorithm_config.burst: does not apply to fixed_window (it takes rate, period, capacity, start, reserve, max_reserved, shards, max_queued, timezone, lease, cost_source, fixed_cost, default_cost, min_cost, settle_from, unsettled_cost, stream_usage)"}},
		{"fixed window without period", rule("    algorithm: fixed_window\n", "      rate: 10\n"),
			[]string{"c.yaml:6: rules[0].algorithm_config.period: is required with rate for fixed_window (such as \"1m\")"}},
		{"bad period", rule("", "      rate: 10\n      period: 1 minute\n"),
			[]string{`c.yaml:6: rules[0].algorithm_config.period: must be a duration such as "1m" or "500ms" (got "1 minute")`}},
		{"period with rps", rule("", "      rps: 10\n      burst: 10\n      period: 1m\n"),
			[]string{"c.yaml:7: rules[0].algorithm_config.period: rps is per second; use rate with period for another period"}},
		{"burst with rate", rule("", "      rate: 10\n      period: 1m\n      burst: 10\n"),
			[]string{"c.yaml:7: rules[0].algorithm_config.burst: goes with tokens_per_second (rps); with rate and period, the bucket size is capacity"}},
		{"cost above burst", rule("", "      rps: 10\n      burst: 10\n      fixed_cost: 11\n"),
			[]string{"c.yaml:7: rules[0].algorithm_config.fixed_cost: 11 is above the limit's capacity (10): no request could ever pass"}},
		{"default cost zero", rule("", "      rps: 10\n      burst: 10\n      cost_source: header:x-weight\n      default_cost: 0\n"),
			[]string{"c.yaml:8: rules[0].algorithm_config.default_cost: must be > 0 (got 0)"}},
		{"fixed cost with a header source", rule("", "      rps: 10\n      burst: 10\n      cost_source: header:x-weight\n      fixed_cost: 2\n"),
			[]string{"c.yaml:8: rules[0].algorithm_config.fixed_cost: applies only with cost_source: fixed (the cost is read from header:x-weight; default_cost covers requests without it)"}},
		{"bad cost source", rule("", "      rps: 10\n      burst: 10\n      cost_source: cookie:weight\n"),
			[]string{`c.yaml:7: rules[0].algorithm_config.cost_source: must be fixed, header:NAME, query:NAME or body:PATH (got "cookie:weight")`}},
		{"reservation on a sliding log", rule("    algorithm: sliding_log\n", "      rate: 10\n      period: 1m\n      reserve: true\n"),
			[]string{"c.yaml:8: rules[0].algorithm_config.reserve: does not apply to sliding_log (it takes rate, period, capacity, shards, cost_source, fixed_cost, default_cost, min_cost, settle_from, unsettled_cost, stream_usage)"}},
		{"capacity 0 without reserve", rule("", "      rate: 10\n      period: 1m\n      capacity: 0\n"),
			[]string{"c.yaml:7: rules[0].algorithm_config.capacity: 0 needs reserve: true (every request then waits its turn, cost/rate after the one before); without it no request could pass"}},
		{"negative capacity", rule("", "      rate: 10\n      period: 1m\n      capacity: -1\n"),
			[]string{"c.yaml:7: rules[0].algorithm_config.capacity: must be >= 0 (got -1)"}},
		{"cost above what a reservation can take", rule("", "      rps: 10\n      burst: 10\n      reserve: true\n      max_reserved: 5\n      fixed_cost: 16\n"),
			[]string{"c.yaml:9: rules[0].algorithm_config.fixed_cost: 16 is above what a reservation can take (capacity 10 plus max_reserved 5): no request could ever pass"}},
		{"rate below a micro-token", rule("", "      rate: 0.0000001\n      period: 1h\n"),
			[]string{`c.yaml:5: rules[0].algorithm_config.rate: must be at least 0.000001 (one micro-token, the least every store counts), got 1e-07`}},
		{"unknown algorithm", "rules:\n  - name: r\n    algorithm: gcra\n    algorithm_config: {rps: 1, burst: 1}\n",
			[]string{`c.yaml:3: rules[0].algorithm: unknown algorithm "gcra" (want token_bucket, fixed_window, sliding_log, sliding_window, leaky_bucket or concurrency)`}},
		{"no algorithm_config", "rules:\n  - name: r\n    limit_keys: []\n",
			[]string{"c.yaml:2: rules[0].algorithm_config: is required (or tiers)"}},
	}
}

// ruleAndFileCases are the problems of a rule's other fields, of the
// top-level settings and of the file as a whole.
func ruleAndFileCases() []validationCase {
	return []validationCase{
		{"bad name and duplicate", "rules:\n  - name: a b\n    algorithm_config: {rps: 1, burst: 1}\n  - name: x\n    algorithm_config: {rps: 1, burst: 1}\n  - name: x\n    algorithm_config: {rps: 1, burst: 1}\n",
			[]string{
				`c.yaml:2: rules[0].name: "a b" must be 1 to 64 of A-Z a-z 0-9 _ . -`,
				`c.yaml:6: rules[2].name: "x" is already the name of the rule at line 4`,
			}},
		{"rule name clashes with a tier's limit", "rules:\n  - name: a\n    tiers:\n      - name: b\n        algorithm_config: {rps: 1, burst: 1}\n  - name: a.b\n    algorithm_config: {rps: 1, burst: 1}\n",
			[]string{`c.yaml:6: rules.a.b: limit name "a.b" is used twice (a rule named like another rule's tier); rename one, as their buckets would be shared`}},
		{"bad limit keys", "rules:\n  - name: r\n    limit_keys: [\"ip\", \"header:\", \"cookie:x\", \"path\", \"path\", \"domain\"]\n    algorithm_config: {rps: 1, burst: 1}\n",
			[]string{
				"c.yaml:3: rules[0].limit_keys[0]: ip takes only ip:address",
				"c.yaml:3: rules[0].limit_keys[1]: header needs a name: header:NAME",
				`c.yaml:3: rules[0].limit_keys[2]: unknown source "cookie:x" (want ip:address, header:NAME, query:NAME, jwt:CLAIM, path, method, host, descriptor:KEY or descriptor)`,
				`c.yaml:3: rules[0].limit_keys[4]: "path" is listed twice`,
				"c.yaml:3: rules[0].limit_keys[5]: domain can be matched but not used as a key",
			}},
		{"bad match", "rules:\n  - name: r\n    match:\n      path_prefix: api\n      method: []\n      verb: GET\n    algorithm_config: {rps: 1, burst: 1}\n",
			[]string{
				`c.yaml:4: rules[0].match.path_prefix: "api" must start with /`,
				"c.yaml:5: rules[0].match.method: an empty list matches nothing; give at least one value",
				`c.yaml:6: rules[0].match.verb: unknown source "verb" (want ip:address, header:NAME, query:NAME, jwt:CLAIM, path, method, host, descriptor:KEY or descriptor, domain or path_prefix)`,
			}},
		{"mode and on_store_error", "rules:\n  - name: r\n    mode: dry-run\n    on_store_error: open\n    missing_key: drop\n    algorithm_config: {rps: 1, burst: 1}\n",
			[]string{
				`c.yaml:3: rules[0].mode: must be enforce or shadow (got "dry-run")`,
				`c.yaml:4: rules[0].on_store_error: must be allow or deny (got "open")`,
				`c.yaml:5: rules[0].missing_key: must be shared or skip (got "drop")`,
			}},
		{"tiers", "rules:\n  - name: r\n    tiers:\n      - name: all\n        algorithm_config: {rps: 1, burst: 1}\n      - name: never\n        match: {method: GET}\n        algorithm_config: {rps: 1, burst: 1}\n      - match: {method: POST}\n        algorithm_config: {rps: 1, burst: 1}\n",
			[]string{
				"c.yaml:4: rules[0].tiers[0]: has no match, so it takes every request and the tiers after it are never used; give it a match or move it last",
				"c.yaml:9: rules[0].tiers[2].name: is required",
			}},
		{"jwt claims without a jwt section", "rules:\n  - name: r\n    limit_keys: [\"jwt:sub\"]\n    algorithm_config: {rps: 1, burst: 1}\n",
			[]string{"c.yaml:3: rules[0].limit_keys[0]: reads a JWT claim, but there is no jwt section: configure verification keys (hmac_secret_env, public_keys or jwks_file), or jwt: {verify: false} when a gateway in front has verified the token"}},
		{"jwt without keys", "jwt:\n  leeway: 5s\nrules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n",
			[]string{"c.yaml:2: jwt: needs a verification key: hmac_secret_env, public_keys or jwks_file (or verify: false when a gateway in front verifies tokens)"}},
		{"jwt secrets", "jwt:\n  hmac_secret_env: EMPTY_SECRET\nrules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n",
			[]string{"c.yaml:2: jwt.hmac_secret_env: environment variable EMPTY_SECRET is not set or empty"}},
		{"short jwt secret", "jwt:\n  hmac_secret_env: SHORT_SECRET\nrules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n",
			[]string{"c.yaml:2: jwt.hmac_secret_env: the secret in SHORT_SECRET is 5 bytes; HMAC keys need at least 32 (RFC 7518 section 3.2)"}},
		{"verify false with keys", "jwt:\n  verify: false\n  hmac_secret_env: SHORT_SECRET\nrules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n",
			[]string{"c.yaml:2: jwt.verify: is false, so the keys given are never used; remove them, or verify"}},
		{"missing key files", "jwt:\n  public_keys: [nope.pem]\n  jwks_file: nope.json\nrules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n",
			[]string{
				"c.yaml:2: jwt.public_keys[0]: open nope.pem: no such file or directory",
				"c.yaml:3: jwt.jwks_file: open nope.json: no such file or directory",
			}},
		{"settings", `listen: "8080"
grpc_listen: ":8080"
store: {url: "localhost"}
admin_token_env: "not a name"
trusted_proxies: ["10.0.0.1/8", "nonsense"]
proxy: {upstream: "ftp://x"}
headers: [draft, fancy, draft]
deny_status: 200
audit_log: ""
ipv6_prefix: 129
missing_key: maybe
rules:
  - name: r
    algorithm_config: {rps: 1, burst: 1}
`, []string{
			`c.yaml:1: listen: must be an address such as ":8080" or "127.0.0.1:8080" (got "8080")`,
			`c.yaml:3: store.url: must be a URL such as "memory://", "redis://host:6379" or "postgres://..." (not repeated: it may hold the store's password)`,
			`c.yaml:4: admin_token_env: must be the name of an environment variable, such as SLUICE_ADMIN_TOKEN (got "not a name")`,
			`c.yaml:5: trusted_proxies: "10.0.0.1/8" has host bits set; did you mean "10.0.0.0/8"?`,
			`c.yaml:5: trusted_proxies: must be a CIDR such as "10.0.0.0/8" or an address (got "nonsense")`,
			`c.yaml:6: proxy.upstream: must be an absolute http:// or https:// URL (got "ftp://x")`,
			`c.yaml:6: proxy.listen: is required with proxy.upstream (the address the proxy serves on, such as ":8000")`,
			`c.yaml:7: headers[1]: unknown header set "fancy" (want draft, trio, legacy or none)`,
			`c.yaml:7: headers[2]: "draft" is listed twice`,
			"c.yaml:8: deny_status: must be a 4xx or 5xx status, such as 429 (or 403 for nginx auth_request), got 200",
			"c.yaml:9: audit_log: must be a file path (leave the field out to write no audit log)",
			"c.yaml:10: ipv6_prefix: must be between 1 and 128 (got 129)",
			`c.yaml:11: missing_key: must be shared or skip (got "maybe")`,
		}},
		{"same address twice", "listen: \":9000\"\ngrpc_listen: \":9000\"\nrules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n",
			[]string{`c.yaml:2: grpc_listen: ":9000" is also listen's address`}},
		{"no rules", "listen: \":8080\"\n", []string{"c.yaml:1: rules: is required: at least one rule"}},
		{"empty rules", "rules: []\n", []string{"c.yaml:1: rules: must hold at least one rule"}},
		{"empty file", "# nothing\n", []string{"c.yaml: the file is empty"}},
		{"min cost with a fixed cost", rule("", "      rps: 10\n      burst: 10\n      min_cost: 0.5\n"),
			[]string{"c.yaml:7: rules[0].algorithm_config.min_cost: applies only with cost_source header:NAME, query:NAME or body:PATH (it bounds the costs clients declare; fixed_cost is the cost here)"}},
		{"min cost zero", rule("", "      rps: 10\n      burst: 10\n      cost_source: header:x-weight\n      min_cost: 0\n"),
			[]string{"c.yaml:8: rules[0].algorithm_config.min_cost: must be > 0 (got 0)"}},
		{"min cost above burst", rule("", "      rps: 10\n      burst: 10\n      cost_source: header:x-weight\n      default_cost: 10\n      min_cost: 11\n"),
			[]string{"c.yaml:9: rules[0].algorithm_config.min_cost: 11 is above the limit's capacity (10): no request could ever pass"}},
		{"min cost below a micro-token", rule("", "      rps: 10\n      burst: 10\n      cost_source: header:x-weight\n      min_cost: 1e-9\n"),
			[]string{"c.yaml:8: rules[0].algorithm_config.min_cost: 1e-09 is not a usable cost (at least 0.000001)"}},
		{"default cost below the default min cost", rule("", "      rps: 10\n      burst: 10\n      cost_source: header:x-weight\n      default_cost: 0.5\n"),
			[]string{"c.yaml:8: rules[0].algorithm_config.default_cost: default_cost (0.5) is below min_cost (1): a request without a usable cost would pay less than the least a declared one pays; raise default_cost or lower min_cost"}},
		{"min cost above the default cost", rule("", "      rps: 10\n      burst: 10\n      cost_source: query:w\n      min_cost: 5\n"),
			[]string{"c.yaml:8: rules[0].algorithm_config.min_cost: default_cost (1) is below min_cost (5): a request without a usable cost would pay less than the least a declared one pays; raise default_cost or lower min_cost"}},
		{"rules table sources", "rules_table:\n  plan: path\n  user: method\n  default_plan: \"a b\"\n  users: x\n" + rule("", "      rps: 1\n      burst: 1\n"),
			[]string{
				`c.yaml:2: rules_table.plan: must be jwt:CLAIM, header:NAME, query:NAME or descriptor:KEY (got "path")`,
				`c.yaml:3: rules_table.user: must be jwt:CLAIM, ip:address, header:NAME, query:NAME or descriptor:KEY (got "method")`,
				`c.yaml:4: rules_table.default_plan: "a b" must be 1 to 64 of A-Z a-z 0-9 _ . -`,
				`c.yaml:5: rules_table.users: unknown field (did you mean "user"?)`,
			}},
		{"rules table claim without a jwt section", "rules_table: {plan: \"jwt:plan\", user: ip:address}\n" + rule("", "      rps: 1\n      burst: 1\n"),
			[]string{"c.yaml:1: rules_table.plan: reads a JWT claim, but there is no jwt section: configure verification keys (hmac_secret_env, public_keys or jwks_file), or jwt: {verify: false} when a gateway in front has verified the token"}},
		{"not a mapping", "- a\n- b\n", []string{"c.yaml:1: must be a mapping of fields (got a list)"}},
		{"syntax error", "rules: [\n", []string{"c.yaml:1: syntax error: did not find expected node content"}},
		{"two documents", "rules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n---\nlisten: \":1\"\n", []string{"c.yaml:4: the file holds more than one YAML document"}},
		{"duplicate field", "rules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1, rps: 2}\n",
			[]string{"c.yaml:3: rules[0].algorithm_config.rps: appears twice"}},
		{"json with problems", "{\n\t\"rules\": [\n\t\t{\"name\": \"r\",\n\t\t \"algorithm_config\": {\"rps\": 100, \"burst\": 1e12}}\n\t]\n}\n",
			[]string{"c.yaml:4: rules[0].algorithm_config.burst: must be at most 9007199254.740992 (2^53 micro-tokens, the most every store counts exactly), got 1e+12"}},
	}
}

func TestBothSpellings(t *testing.T) {
	cases := []struct {
		name, body string
		rate, cap  float64
	}{
		{"tokens_per_second", "tokens_per_second: 100\n      burst: 200", 100, 200},
		{"rps", "rps: 100\n      burst: 200", 100, 200},
		{"rate per minute", "rate: 600\n      period: 1m\n      capacity: 50", 10, 50},
		{"capacity defaults to rate", "rate: 60\n      period: 1m", 1, 60},
		{"capacity below rate", "rate: 100\n      period: 1s\n      capacity: 10", 100, 10},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := mustParse(t, "rules:\n  - name: r\n    algorithm_config:\n      "+tc.body+"\n")
			l := p.Rule("r").Limit
			if l.TokensPerSecond() != tc.rate || l.Capacity() != tc.cap {
				t.Fatalf("rate %v capacity %v, want %v %v", l.TokensPerSecond(), l.Capacity(), tc.rate, tc.cap)
			}
		})
	}
	// The same policy in JSON.
	const json = `{"listen": ":9090", "rules": [{"name": "r", "limit_keys": ["ip:address"], "algorithm_config": {"rps": 5, "burst": 10}}]}`
	p := mustParse(t, json)
	if s := mustServer(t, json); s.Listen != ":9090" || p.Rule("r").Limit.Capacity() != 10 {
		t.Fatalf("JSON policy: %+v", s)
	}
}

func TestAlgorithms(t *testing.T) {
	p := mustParse(t, `rules:
  - name: fw
    algorithm: fixed_window
    algorithm_config: {rate: 5, period: 1m, capacity: 10, start: "2024-01-01T00:00:30Z"}
  - name: sl
    algorithm: sliding_log
    algorithm_config: {rate: 100, period: 1h}
  - name: lb
    algorithm: leaky_bucket
    algorithm_config: {rps: 10, max_delay: 2s}
  - name: tb
    algorithm_config: {rate: 10, period: 1s, capacity: 10, reserve: true, max_reserved: 5}
`)
	fw := p.Rule("fw").Limit
	if fw.Algorithm() != sluice.FixedWindow || fw.Params().Offset != 30_000_000 || fw.Capacity() != 10 {
		t.Errorf("fixed window %+v", fw.Params())
	}
	if sl := p.Rule("sl").Limit; sl.Algorithm() != sluice.SlidingLog || sl.Spec().Period != time.Hour {
		t.Errorf("sliding log %+v", sl.Spec())
	}
	if lb := p.Rule("lb").Limit; lb.Algorithm() != sluice.LeakyBucket || lb.Spec().MaxDelay != 2*time.Second {
		t.Errorf("leaky bucket %+v", lb.Spec())
	}
	if tb := p.Rule("tb").Limit; tb.Spec().MaxReserved != 5 {
		t.Errorf("token bucket %+v", tb.Spec())
	}
}

func TestDefaults(t *testing.T) {
	p := policy.Default()
	s := p.Settings
	if srv := mustServer(t, policy.DefaultYAML); srv.Listen != ":8080" || srv.GRPCListen != ":8081" || srv.StoreURL != "memory://" {
		t.Fatalf("default server settings: %+v", srv)
	}
	if p.Source != "embedded default" ||
		s.DenyStatus != 429 || s.IPv6Prefix != 64 || strings.Join(s.Headers, ",") != "draft,trio" || s.MissingKey != policy.MissingShared {
		t.Fatalf("defaults: %+v", p)
	}
	r := p.Rule("per-ip")
	if r == nil || r.Limit.TokensPerSecond() != 10 || r.Limit.Capacity() != 20 || r.Mode != policy.EnforceMode || r.OnStoreError != policy.AllowOnError {
		t.Fatalf("default rule: %+v", r)
	}
	if q := mustServer(t, "grpc_listen: \"\"\nrules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n"); q.GRPCListen != "" {
		t.Fatalf("grpc_listen \"\" should disable the gRPC listener, got %q", q.GRPCListen)
	}
}

func TestExamplesLoad(t *testing.T) {
	t.Setenv("SLUICE_JWT_SECRET", testSecret)
	t.Setenv("SLUICE_API_TOKEN", "0123456789abcdef0123456789abcdef")
	for _, f := range []string{"global-rps.yaml", "tiered.yaml", "policy.yaml"} {
		p, err := policy.Load(filepath.Join("..", "examples", f))
		if err != nil {
			t.Errorf("%s:\n%v", f, err)
			continue
		}
		if len(p.Rules) == 0 {
			t.Errorf("%s has no rules", f)
		}
	}
	p, _ := policy.Load("../examples/tiered.yaml")
	r := p.Rule("api-key")
	if len(r.Tiers) != 2 || r.Tiers[0].Limit.Name() != "api-key.enterprise" || r.Tiers[0].Limit.Capacity() != 2000 ||
		r.Tiers[1].Limit.Name() != "api-key.free" || r.Tiers[1].Limit.TokensPerSecond() != 10 {
		t.Fatalf("tiered example: %+v", r.Tiers)
	}
	if p.Limit("api-key.free") != r.Tiers[1].Limit || p.Limit("api-key") != nil || r.Limit != r.Tiers[1].Limit {
		t.Fatalf("limit lookup by name")
	}
	g, _ := policy.Load("../examples/global-rps.yaml")
	if l := g.Rule("global-rps").Limit; l.TokensPerSecond() != 5 || l.Capacity() != 10 {
		t.Fatalf("global-rps: %v %v", l.TokensPerSecond(), l.Capacity())
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := policy.Load(filepath.Join(t.TempDir(), "none.yaml"))
	if err == nil || !strings.Contains(err.Error(), "none.yaml: open") {
		t.Fatalf("err %v", err)
	}
}

func TestRelativeKeyPaths(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "jwks.json"), []byte(testJWKS(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := "jwt:\n  jwks_file: jwks.json\nrules:\n  - name: r\n    limit_keys: [\"jwt:sub\"]\n    algorithm_config: {rps: 1, burst: 1}\n"
	file := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := policy.Load(file); err != nil {
		t.Fatal(err)
	}
}

func TestMoreValidationErrors(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "x.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	ok := "    algorithm_config: {rps: 1, burst: 1}\n"
	cases := []struct {
		name string
		cfg  string
		want []string
	}{
		{"wrong kinds", "listen: 8080\nrules: {a: 1}\n", []string{
			"c.yaml:1: listen: must be a string (got the number 8080)",
			"c.yaml:2: rules: must be a list (got a mapping)",
		}},
		{"rule kinds", "rules:\n  - name: r\n    limit_keys: ip:address\n    mode: true\n    tiers: {a: 1}\n" + ok, []string{
			`c.yaml:3: rules[0].limit_keys: must be a list (got the string "ip:address")`,
			"c.yaml:4: rules[0].mode: must be a string (got true)",
			"c.yaml:5: rules[0].tiers: must be a list of tiers (got a mapping)",
		}},
		{"non-scalar field name", "rules:\n  - name: r\n    [a]: 1\n" + ok, []string{"c.yaml:3: rules[0]: field names must be plain strings"}},
		{"booleans and whole numbers", "deny_status: 429.5\nrules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1, reserve: \"yes\"}\n", []string{
			"c.yaml:1: deny_status: must be a whole number",
			`c.yaml:4: rules[0].algorithm_config.reserve: must be true or false (got the string "yes")`,
		}},
		{"null rule", "rules:\n  -\n", []string{"c.yaml:2: rules[0]: must be a mapping of fields (got nothing)"}},
		{"tier problems", `rules:
  - name: r
    tiers:
      - name: a
        match: {method: GET}
        algorithm_config: {rps: 1, burst: 1}
      - name: a
        match: {method: PUT}
      - name: c
        algorithm_config: {rps: 1, burst: 1}
    algorithm_config: {rps: 1, burst: 1}
`, []string{
			`c.yaml:7: rules[0].tiers[1].name: "a" is already a tier of this rule`,
			"c.yaml:7: rules[0].tiers[1].algorithm_config: is required",
			"c.yaml:9: rules[0].tiers[2]: has no match, so it takes every request and the rule's own algorithm_config is never used; give it a match or remove one of them",
		}},
		{"empty tiers", "rules:\n  - name: r\n    tiers: []\n", []string{"c.yaml:3: rules[0].tiers: must hold at least one tier (or leave tiers out)"}},
		{"match values", "rules:\n  - name: r\n    match:\n      method: {a: 1}\n      host: [a, [b]]\n      path: ~\n" + ok, []string{
			"c.yaml:4: rules[0].match.method: must be a value or a list of values (got a mapping)",
			"c.yaml:5: rules[0].match.host[1]: must be a value or a list of values (got a list)",
			"c.yaml:6: rules[0].match.path: must be a value or a list of values (got nothing)",
		}},
		{"sources", "rules:\n  - name: r\n    limit_keys: [\"ip:port\", \"header:a b\", \"descriptor:\", \"method:x\"]\n" + ok, []string{
			"c.yaml:3: rules[0].limit_keys[0]: ip takes only ip:address",
			"c.yaml:3: rules[0].limit_keys[1]: the name must not contain white space",
			"c.yaml:3: rules[0].limit_keys[2]: descriptor needs a key (descriptor:KEY), or none for the whole descriptor",
			"c.yaml:3: rules[0].limit_keys[3]: method takes no name",
		}},
		{"durations", `rules:
  - name: w
    algorithm: fixed_window
    algorithm_config: {rate: 1, period: 0s, start: "yesterday"}
  - name: l
    algorithm: leaky_bucket
    algorithm_config: {rps: 1, max_delay: -1s}
  - name: s
    algorithm: fixed_window
    algorithm_config: {rate: 1, period: 1s, start: -5s}
`, []string{
			`c.yaml:4: rules[0].algorithm_config.period: must be > 0 (got "0s")`,
			`c.yaml:4: rules[0].algorithm_config.start: must be a duration offset such as "30m" or an RFC 3339 time such as "2024-01-01T00:00:00Z" (got "yesterday")`,
			"c.yaml:7: rules[1].algorithm_config.max_delay: must be > 0",
			"c.yaml:10: rules[2].algorithm_config.start: must not be negative",
		}},
		{"rate without period for a window", "rules:\n  - name: s\n    algorithm: sliding_log\n    algorithm_config: {rps: 5}\n", []string{
			"c.yaml:4: rules[0].algorithm_config.rps: does not apply to sliding_log (it takes rate, period, capacity, shards, cost_source, fixed_cost, default_cost, min_cost, settle_from, unsettled_cost, stream_usage)",
			"c.yaml:4: rules[0].algorithm_config: needs rate and period",
		}},
		{"capacity with rps", "rules:\n  - name: r\n    algorithm_config: {rps: 5, capacity: 5}\n", []string{
			"c.yaml:3: rules[0].algorithm_config.capacity: goes with rate and period; with rps, the bucket size is burst",
		}},
		{"rate and rps", "rules:\n  - name: r\n    algorithm_config: {rps: 5, burst: 5, rate: 5}\n", []string{
			"c.yaml:3: rules[0].algorithm_config.rate: give either rps or rate (with period), not both",
		}},
		{"tiny fixed cost", "rules:\n  - name: r\n    algorithm_config: {rps: 5, burst: 5, fixed_cost: 0.0000001}\n", []string{
			"c.yaml:3: rules[0].algorithm_config.fixed_cost: 1e-07 is not a usable cost (at least 0.000001)",
		}},
		{"proxy and headers", "proxy: {listen: \":9000\"}\nheaders: [none, draft]\n" + "rules:\n  - name: r\n" + ok, []string{
			"c.yaml:1: proxy.upstream: is required with proxy.listen (the URL requests are forwarded to)",
			"c.yaml:2: headers: none must stand alone",
		}},
		{"empty headers", "headers: []\nrules:\n  - name: r\n" + ok, []string{
			"c.yaml:1: headers: must name at least one header set (draft, trio, legacy), or none",
		}},
		{"jwt settings", "jwt:\n  verify: false\n  leeway: 2h\nrules:\n  - name: r\n" + ok, []string{
			`c.yaml:3: jwt.leeway: must be between 0s and 1h (got "2h")`,
		}},
		{"key files", "jwt:\n  public_keys: [\"" + notPEM + "\", \"" + dir + "\"]\nrules:\n  - name: r\n" + ok, []string{
			"c.yaml:2: jwt.public_keys[0]: " + notPEM + " holds no PEM public key",
			"c.yaml:2: jwt.public_keys[1]: " + dir + " is not a regular file",
		}},
		{"jwks", "jwt:\n  jwks_file: \"" + notPEM + "\"\nrules:\n  - name: r\n" + ok, []string{
			"c.yaml:2: jwt.jwks_file: " + notPEM + " is not a JSON Web Key Set: invalid character 'h' looking for beginning of value",
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := problems(t, tc.cfg)
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
	if _, err := policy.Parse("big.yaml", make([]byte, policy.MaxFileSize+1)); err == nil || !strings.Contains(err.Error(), "big.yaml: the file is larger than") {
		t.Errorf("oversized file: %v", err)
	}
}

// The rules_table section names where the PostgreSQL rules table finds
// plans and users; its defaults are the jwt section's verified claims, or
// no source at all, never a header.
func TestRulesTableSettings(t *testing.T) {
	t.Setenv("JWT_SECRET", testSecret)
	body := "rules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n"
	for _, tc := range []struct {
		name, cfg string
		want      policy.RulesTable
		warnings  []string
	}{
		{"nothing trusted", body, policy.RulesTable{}, nil},
		{"jwt claims by default", "jwt: {hmac_secret_env: JWT_SECRET}\n" + body, policy.RulesTable{Plan: "jwt:plan", User: "jwt:sub"}, nil},
		{"written out", "jwt: {hmac_secret_env: JWT_SECRET}\nrules_table:\n  plan: jwt:tier\n  user: ip:address\n  default_plan: free\n" + body,
			policy.RulesTable{Plan: "jwt:tier", User: "ip:address", DefaultPlan: "free"}, nil},
		{"client headers", "rules_table:\n  plan: header:X-Plan\n  user: query:user\n" + body,
			policy.RulesTable{Plan: "header:X-Plan", User: "query:user"}, []string{
				"c.yaml:2: rules_table.plan: header:X-Plan is whatever the client sends and no trusted_proxies are configured, so nothing in front sets or strips it: any client can pick its plan (read it from a verified claim, jwt:CLAIM, or have the proxy in front set it on every request and list that proxy in trusted_proxies)",
				"c.yaml:3: rules_table.user: query:user is whatever the client sends and no trusted_proxies are configured, so nothing in front sets or strips it: any client can pick its user (read it from a verified claim, jwt:CLAIM, or have the proxy in front set it on every request and list that proxy in trusted_proxies)",
			}},
		{"headers set by a trusted proxy", "trusted_proxies: [10.0.0.1]\nforward_auth: {proxy: nginx}\nrules_table:\n  plan: header:X-Plan\n" + body,
			policy.RulesTable{Plan: "header:X-Plan"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := policy.Parse("c.yaml", []byte(tc.cfg))
			if err != nil {
				t.Fatal(err)
			}
			if p.Settings.RulesTable != tc.want {
				t.Errorf("RulesTable %+v, want %+v", p.Settings.RulesTable, tc.want)
			}
			if strings.Join(p.Warnings, "\n") != strings.Join(tc.warnings, "\n") {
				t.Errorf("warnings:\n%s\nwant:\n%s", strings.Join(p.Warnings, "\n"), strings.Join(tc.warnings, "\n"))
			}
			// RulesTableOf reads the same section the same way.
			got, err := policy.RulesTableOf("c.yaml", []byte(tc.cfg))
			if err != nil || got != tc.want {
				t.Errorf("RulesTableOf = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
	if got, err := policy.RulesTableOf("c.yaml", nil); err != nil || got != (policy.RulesTable{}) {
		t.Errorf("RulesTableOf(nil) = %+v, %v", got, err)
	}
	if _, err := policy.RulesTableOf("c.yaml", []byte("rules_table: {user: path}\n")); err == nil || !strings.Contains(err.Error(), "c.yaml:1: rules_table.user: must be") {
		t.Errorf("RulesTableOf of a bad section: %v", err)
	}
}

// shards: N in algorithm_config shards a token bucket, fixed window or
// sliding log; a count out of range, a leaky bucket's, or a cost above
// what two shards hold together is a config error at its line.
func TestShardsConfig(t *testing.T) {
	p := mustParse(t, `rules:
  - name: hot
    algorithm_config: {rps: 1000, burst: 2000, shards: 8}
  - name: fw
    algorithm: fixed_window
    algorithm_config: {rate: 100, period: 1m, shards: 4}
  - name: sl
    algorithm: sliding_log
    algorithm_config: {rate: 100, period: 1h, shards: 2}
  - name: one
    algorithm_config: {rps: 10, burst: 10, shards: 1}
`)
	for name, want := range map[string]int{"hot": 8, "fw": 4, "sl": 2, "one": 1} {
		if got := p.Rule(name).Limit.Shards(); got != want {
			t.Errorf("%s: %d shards, want %d", name, got, want)
		}
	}
	if got := p.Rule("hot").Limit.MaxCost(); got != 500 {
		t.Errorf("hot: largest cost %v, want 2 x 2000 / 8 = 500", got)
	}
	for _, c := range []struct {
		name, cfg string
		want      []string
	}{
		{"zero", rule("", "      rps: 10\n      burst: 10\n      shards: 0\n"),
			[]string{"c.yaml:7: rules[0].algorithm_config.shards: must be a whole number from 1 to 256 (got 0)"}},
		{"too many", rule("", "      rps: 10\n      burst: 10\n      shards: 1000\n"),
			[]string{"c.yaml:7: rules[0].algorithm_config.shards: must be a whole number from 1 to 256 (got 1000)"}},
		{"fraction", rule("", "      rps: 10\n      burst: 10\n      shards: 2.5\n"),
			[]string{"c.yaml:7: rules[0].algorithm_config.shards: must be a whole number"}},
		{"leaky bucket", rule("    algorithm: leaky_bucket\n", "      rps: 10\n      shards: 2\n"),
			[]string{"c.yaml:7: rules[0].algorithm_config.shards: does not apply to leaky_bucket (it takes tokens_per_second, rps, rate, period, max_delay, max_queue_delay, max_queued, cost_source, fixed_cost, default_cost, min_cost, settle_from, unsettled_cost, stream_usage)"}},
		{"fixed cost above two shards", rule("", "      rps: 10\n      burst: 100\n      shards: 10\n      fixed_cost: 21\n"),
			[]string{"c.yaml:8: rules[0].algorithm_config.fixed_cost: 21 is above what two of the limit's 10 shards hold together (2 x capacity / shards = 20): no request could ever pass"}},
		{"shards too small", rule("", "      rate: 1\n      period: 1h\n      capacity: 0.000002\n      shards: 4\n"),
			[]string{"c.yaml:5: rules[0].algorithm_config: capacity 2e-06 over 4 shards is below one micro-token each"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := problems(t, c.cfg); strings.Join(got, "\n") != strings.Join(c.want, "\n") {
				t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(c.want, "\n"))
			}
		})
	}
}
