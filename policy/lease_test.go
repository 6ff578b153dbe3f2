package policy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/quota"
)

// lease: {} leases with the defaults; its fields tune them; without it
// a rule is exact.
func TestLeaseSection(t *testing.T) {
	for _, tc := range []struct {
		name, extra, body string
		want              quota.Settings
	}{
		{"defaults", "", "      rate: 20000\n      lease: {}\n", quota.Settings{}},
		{"tokens", "", "      rate: 20000\n      lease: {max_slice: 50, term: 500ms, hot_after: 3}\n", quota.Settings{MaxSlice: 50, Term: 500 * time.Millisecond, HotAfter: 3}},
		{"share", "", "      rate: 20000\n      lease: {max_slice: \"0.5%\"}\n", quota.Settings{MaxShare: 0.005}},
		{"fixed window", "    algorithm: fixed_window\n", "      rate: 1000\n      period: 1m\n      lease: {}\n", quota.Settings{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := mustParse(t, rule(tc.extra, tc.body))
			got, ok := p.Leased()[p.Rule("r").Limit]
			if !ok || got != tc.want {
				t.Fatalf("leased %v %+v, want %+v", ok, got, tc.want)
			}
		})
	}
	if p := mustParse(t, rule("", "      rate: 20000\n")); len(p.Leased()) != 0 {
		t.Fatalf("a rule without lease: is leased: %v", p.Leased())
	}
}

// Each bad lease: names the file, line and field.
func TestLeaseErrors(t *testing.T) {
	for _, tc := range []struct{ name, extra, body, want string }{
		{"a duration on a token bucket", "", "      rate: 1000\n      lease: 30s\n",
			"c.yaml:6: rules[0].algorithm_config.lease: on a token_bucket is a section of fields (max_slice, term, hot_after; lease: {} takes the defaults), not \"30s\""},
		{"a section on a concurrency rule", "    algorithm: concurrency\n", "      max_in_flight: 4\n      lease: {term: 1s}\n",
			"c.yaml:7: rules[0].algorithm_config.lease: on a concurrency rule is the slot term, a duration such as \"30s\""},
		{"empty", "", "      rate: 1000\n      lease:\n",
			"c.yaml:6: rules[0].algorithm_config.lease: is empty: lease: {} leases with the defaults"},
		{"unknown field", "", "      rate: 1000\n      lease: {max_slize: 3}\n",
			"c.yaml:6: rules[0].algorithm_config.lease.max_slize: unknown field (did you mean \"max_slice\"?)"},
		{"negative slice", "", "      rate: 1000\n      lease:\n        max_slice: -3\n",
			"c.yaml:7: rules[0].algorithm_config.lease.max_slice: must be > 0 tokens (got -3)"},
		{"bad percentage", "", "      rate: 1000\n      lease: {max_slice: \"200%\"}\n",
			"c.yaml:6: rules[0].algorithm_config.lease.max_slice: must be a number of tokens or a percentage of the capacity"},
		{"term", "", "      rate: 1000\n      lease: {term: 2h}\n",
			"c.yaml:6: rules[0].algorithm_config.lease.term: must be from 1ms to 1h (got \"2h\")"},
		{"hot_after", "", "      rate: 1000\n      lease: {hot_after: 0}\n",
			"c.yaml:6: rules[0].algorithm_config.lease.hot_after: must be a whole number from 1 to 1000000 (got 0)"},
		{"reserve", "", "      rate: 1000\n      reserve: true\n      lease: {}\n",
			"c.yaml:7: rules[0].algorithm_config.lease: applies to a token_bucket or fixed_window of a fixed period without reserve"},
		{"shards", "", "      rate: 1000\n      shards: 4\n      lease: {}\n",
			"c.yaml:7: rules[0].algorithm_config.lease: applies to a token_bucket or fixed_window of a fixed period without reserve, shards"},
		{"sliding log", "    algorithm: sliding_log\n", "      rate: 10\n      period: 1s\n      lease: {}\n",
			"c.yaml:8: rules[0].algorithm_config.lease: does not apply to sliding_log"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := strings.Join(problems(t, rule(tc.extra, tc.body)), "\n")
			if !strings.Contains(got, tc.want) {
				t.Fatalf("got:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}
