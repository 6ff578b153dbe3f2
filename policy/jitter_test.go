package policy_test

import (
	"strings"
	"testing"
	"time"
)

// A rule's jitter: a duration, or the word period for up to one refill
// period, on every algorithm; anything else names file, line and field.
func TestJitterConfig(t *testing.T) {
	for _, c := range []struct {
		alg, cfg string
		want     time.Duration
	}{
		{"token_bucket", "{rps: 5, burst: 5, jitter: 250ms}", 250 * time.Millisecond},
		{"token_bucket", "{rps: 5, burst: 5, jitter: period}", time.Second},
		{"token_bucket", "{rate: 10, jitter: period}", time.Second},
		{"token_bucket", "{rate: 10, period: 1h, jitter: period}", time.Hour},
		{"fixed_window", "{rate: 10, period: 1m, jitter: period}", time.Minute},
		{"sliding_log", "{rate: 10, period: 1m, jitter: 5s}", 5 * time.Second},
		{"leaky_bucket", "{rate: 10, period: 1s, jitter: period}", time.Second},
		{"token_bucket", "{rps: 5, burst: 5, jitter: 0s}", 0},
		{"token_bucket", "{rps: 5, burst: 5}", 0},
	} {
		p := mustParse(t, "rules:\n  - name: r\n    algorithm: "+c.alg+"\n    algorithm_config: "+c.cfg+"\n")
		if got := p.Rules[0].Limit.Spec().Jitter; got != c.want {
			t.Errorf("%s %s: jitter %v, want %v", c.alg, c.cfg, got, c.want)
		}
	}
	for cfg, want := range map[string]string{
		"{rps: 5, burst: 5, jitter: -1s}":   `c.yaml:3: rules[0].algorithm_config.jitter: must not be negative (0 turns it off)`,
		"{rps: 5, burst: 5, jitter: 5}":     `c.yaml:3: rules[0].algorithm_config.jitter: must be a duration with a unit, such as "2s", or the word period (got the number 5)`,
		"{rps: 5, burst: 5, jitter: soon}":  `c.yaml:3: rules[0].algorithm_config.jitter: must be a duration such as "2s" or "500ms", or the word period (got "soon")`,
		"{rps: 5, burst: 5, jitter: [1s]}":  `c.yaml:3: rules[0].algorithm_config.jitter: must be a duration with a unit, such as "2s", or the word period (got a list)`,
		"{rps: 5, burst: 5, jiter: period}": `c.yaml:3: rules[0].algorithm_config.jiter: unknown field (did you mean "jitter"?)`,
	} {
		if got := strings.Join(problems(t, "rules:\n  - name: r\n    algorithm_config: "+cfg+"\n"), "\n"); got != want {
			t.Errorf("%s:\n got %s\nwant %s", cfg, got, want)
		}
	}
	// A tier takes its own.
	p := mustParse(t, "rules:\n  - name: r\n    tiers:\n      - name: t\n        match: {path: /x}\n        algorithm_config: {rps: 1, burst: 1, jitter: 3s}\n")
	if _, l, err := p.FindLimit("r.t"); err != nil || l.Spec().Jitter != 3*time.Second {
		t.Errorf("tier jitter: %v, %v", l, err)
	}
}
