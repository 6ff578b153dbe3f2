package policy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/policy"
)

// burst_seconds is DynamoDB's burst credit: the burst is that many
// seconds of the rate, in either spelling of the rate, and sluice check
// is told what it came to.
func TestBurstSeconds(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       float64
		note       string
	}{
		{"per second", "      rps: 10\n      burst_seconds: 300\n", 3000, "c.yaml:6: rules[0].algorithm_config.burst_seconds: 300 seconds of 10 tokens/s give a burst of 3000 tokens"},
		{"rate and period", "      rate: 600\n      period: 1m\n      burst_seconds: 300\n", 3000, "c.yaml:7: rules[0].algorithm_config.burst_seconds: 300 seconds of 600 tokens per 1m give a burst of 3000 tokens"},
		{"seconds of a minute's rate", "      rate: 60\n      period: 1m\n      burst_seconds: 30\n", 30, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := policy.Parse("c.yaml", []byte(rule("", tc.body)))
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Rule("r").Limit.Capacity(); got != tc.want {
				t.Fatalf("burst %v, want %v", got, tc.want)
			}
			if tc.note != "" && (len(p.Notes) != 1 || p.Notes[0] != tc.note) {
				t.Fatalf("notes %q, want %q", p.Notes, tc.note)
			}
		})
	}
	for _, tc := range []struct{ name, body, want string }{
		{"with burst", "      rps: 10\n      burst: 20\n      burst_seconds: 300\n",
			"c.yaml:7: rules[0].algorithm_config.burst_seconds: gives the bucket size as seconds of the rate (burst = rate x seconds): give either burst or burst_seconds, not both"},
		{"with capacity", "      rate: 10\n      capacity: 20\n      burst_seconds: 300\n",
			"c.yaml:7: rules[0].algorithm_config.burst_seconds: gives the bucket size as seconds of the rate (burst = rate x seconds): give either capacity or burst_seconds, not both"},
		{"under a second", "      rps: 10\n      burst_seconds: 0.5\n",
			"c.yaml:6: rules[0].algorithm_config.burst_seconds: must be at least 1 (got 0.5): burst credit is at least a second of the rate; for a smaller bucket give burst, which may be below the rate"},
		{"zero", "      rps: 10\n      burst_seconds: 0\n",
			"c.yaml:6: rules[0].algorithm_config.burst_seconds: must be > 0 (got 0)"},
		{"a cost above it", "      rps: 1\n      burst_seconds: 2\n      fixed_cost: 3\n",
			"c.yaml:7: rules[0].algorithm_config.fixed_cost: 3 is above the limit's capacity (2): no request could ever pass"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := strings.Join(problems(t, rule("", tc.body)), "\n")
			if !strings.Contains(got, tc.want) {
				t.Fatalf("got:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
	got := strings.Join(problems(t, rule("    algorithm: leaky_bucket\n", "      rps: 10\n      burst_seconds: 30\n")), "\n")
	if !strings.Contains(got, "c.yaml:7: rules[0].algorithm_config.burst_seconds: does not apply to leaky_bucket") {
		t.Fatalf("leaky bucket: %s", got)
	}
}

const adaptiveRule = `proxy: {listen: "127.0.0.1:0", upstream: "http://127.0.0.1:9"}
rules:
  - name: upstream
    algorithm_config:
      rps: 50
      burst_seconds: 2
      adaptive:
        min: 10
        max: 100
        target_latency: 250ms
        error_statuses: [500, 503]
        error_ratio: 0
        latency_percentile: 99
        interval: 2s
        increase: 5
        decrease: 0.7
`

func TestAdaptiveConfig(t *testing.T) {
	p := mustParse(t, adaptiveRule)
	ms, _ := p.Match(&policy.Input{Method: "GET", Path: "/"})
	if len(ms) != 1 {
		t.Fatalf("matches %v", ms)
	}
	c := ms[0].Adaptive()
	want := adaptive.Config{Min: 10, Max: 100, Start: 50, Per: time.Second, TargetLatency: 250 * time.Millisecond,
		Percentile: 99, ErrorStatuses: []int{500, 503}, ErrorRatio: 0, Interval: 2 * time.Second, Increase: 5, Decrease: 0.7}
	if c == nil || c.Min != want.Min || c.Max != want.Max || c.Start != want.Start || c.Per != want.Per ||
		c.TargetLatency != want.TargetLatency || c.Percentile != want.Percentile || c.ErrorRatio != 0 ||
		c.Interval != want.Interval || c.Increase != want.Increase || c.Decrease != want.Decrease ||
		len(c.ErrorStatuses) != 2 || c.ErrorStatuses[0] != 500 || c.ErrorStatuses[1] != 503 {
		t.Fatalf("config %+v,\nwant %+v", c, want)
	}
	if len(p.Warnings) != 0 {
		t.Fatalf("warnings: %q", p.Warnings)
	}
	found := false
	for _, n := range p.Notes {
		found = found || strings.Contains(n, "rules[0].algorithm_config.adaptive: starts at 50 tokens/s and moves between 10 and 100")
	}
	if !found {
		t.Fatalf("notes %q", p.Notes)
	}

	// The defaults: error_ratio 0.1, 90th percentile, 1s, +5% of max, x0.5.
	p = mustParse(t, "rules:\n  - name: r\n    algorithm_config:\n      rate: 600\n      period: 1m\n      capacity: 600\n      adaptive: {min: 60, max: 1200}\n")
	ms, _ = p.Match(&policy.Input{Method: "GET", Path: "/"})
	c = ms[0].Adaptive()
	if c.Start != 600 || c.Per != time.Minute || c.ErrorRatio != policy.DefaultAdaptiveErrorRatio || c.Percentile != 90 ||
		c.Interval != time.Second || c.Increase != 60 || c.Decrease != 0.5 || len(c.ErrorStatuses) != len(adaptive.DefaultErrorStatuses) ||
		c.MinKeys != adaptive.DefaultMinKeys || c.MinKeyShare != adaptive.DefaultMinKeyShare {
		t.Fatalf("defaults %+v", c)
	}
	if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0], "no proxy section") {
		t.Fatalf("no warning of a file without a proxy: %q", p.Warnings)
	}
	// A rule with a fixed rate has none.
	p = mustParse(t, rule("", "      rps: 1\n      burst: 1\n"))
	ms, _ = p.Match(&policy.Input{Method: "GET", Path: "/"})
	if ms[0].Adaptive() != nil || ms[0].Scale() != 1 {
		t.Fatal("a fixed rate is adaptive")
	}
}

func TestAdaptiveConfigErrors(t *testing.T) {
	base := "      rps: 10\n      burst: 20\n"
	for _, tc := range []struct{ name, adapt, want string }{
		{"no bounds", "      adaptive: {}\n", "c.yaml:7: rules[0].algorithm_config.adaptive.min: is required: the lowest rate, in the unit of the limit's own (10 tokens/s)"},
		{"max below min", "      adaptive: {min: 5, max: 4}\n", "c.yaml:7: rules[0].algorithm_config.adaptive.max: must be a rate above min (5), got 4"},
		{"start outside", "      adaptive: {min: 11, max: 40}\n", "c.yaml:7: rules[0].algorithm_config.adaptive: the limit's rate (10) must lie between adaptive.min (11) and adaptive.max (40)"},
		{"decrease", "      adaptive: {min: 1, max: 40, decrease: 1.5}\n", "c.yaml:7: rules[0].algorithm_config.adaptive.decrease: must be a factor above 0 and below 1, such as 0.5 (got 1.5)"},
		{"interval", "      adaptive: {min: 1, max: 40, interval: 1ms}\n", "c.yaml:7: rules[0].algorithm_config.adaptive.interval: must be at least 100ms"},
		{"status", "      adaptive: {min: 1, max: 40, error_statuses: [500, 700]}\n", "c.yaml:7: rules[0].algorithm_config.adaptive.error_statuses[1]: must be an HTTP status from 100 to 599 (got 700)"},
		{"min_keys", "      adaptive: {min: 1, max: 40, min_keys: 0}\n", "c.yaml:7: rules[0].algorithm_config.adaptive.min_keys: must be at least 1 (got 0): how many distinct keys must see errors or slow answers in an interval to lower the rate"},
		{"min_key_share", "      adaptive: {min: 1, max: 40, min_key_share: 1.5}\n", "c.yaml:7: rules[0].algorithm_config.adaptive.min_key_share: must be above 0 and at most 1, such as 0.5 (got 1.5)"},
		{"ratio", "      adaptive: {min: 1, max: 40, error_ratio: 1}\n", "c.yaml:7: rules[0].algorithm_config.adaptive.error_ratio: must be at least 0 (any error) and below 1 (got 1)"},
		{"unknown", "      adaptive: {min: 1, max: 40, step: 3}\n", "c.yaml:7: rules[0].algorithm_config.adaptive.step: unknown field"},
		{"target", "      adaptive: {min: 1, max: 40, target_latency: 100}\n", "c.yaml:7: rules[0].algorithm_config.adaptive.target_latency: must be a duration with a unit"},
		// At min a request weighs 10/0.1 = 100 tokens: more than the burst.
		{"burst too small at min", "      adaptive: {min: 0.1, max: 40}\n", "c.yaml:7: rules[0].algorithm_config.adaptive.min: at min each request weighs 10/min = 100 times its fixed_cost (1): 100 tokens, above what the limit holds (20)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := strings.Join(problems(t, rule("", base+tc.adapt)), "\n")
			if !strings.Contains(got, tc.want) {
				t.Fatalf("got:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

// A match charged at an adaptive rate weighs Start/current times its
// cost, and its decisions are told in the rule's own units: at half the
// rate, a burst of 10 admits 5 and says so.
func TestEnforceAtScale(t *testing.T) {
	p := mustParse(t, rule("", "      rps: 10\n      burst: 10\n      adaptive: {min: 1, max: 20}\n"))
	lim, clk := newLimiter()
	in := fromIP("192.0.2.1")
	take := func(rate float64) policy.Verdict {
		ms, _ := p.Match(in)
		ms[0].AtScale(ms[0].Adaptive().Scale(rate))
		return policy.Enforce(context.Background(), lim, ms, policy.Options{})
	}
	for i := range 5 {
		v := take(5)
		if !v.Allowed || v.Overall.Capacity != 5 || v.Overall.Remaining != int64(4-i) {
			t.Fatalf("take %d at rate 5: %+v", i, v.Overall)
		}
	}
	v := take(5)
	if v.Allowed {
		t.Fatal("a sixth request at rate 5 with a burst of 5 seconds' worth... admitted")
	}
	// The wait is that of the current rate: one request at 5/s.
	if v.Overall.RetryAfter != 200*time.Millisecond {
		t.Fatalf("retry after %v, want 200ms", v.Overall.RetryAfter)
	}
	clk.Advance(time.Second) // 5 tokens at 5/s; 10 at the written 10/s
	// At rate 20 each request weighs half a token of the written limit.
	for i := range 20 {
		if v := take(20); !v.Allowed {
			t.Fatalf("take %d at rate 20 refused: %+v", i, v.Overall)
		}
	}
	if v := take(20); v.Allowed || v.Overall.Capacity != 20 {
		t.Fatalf("21st at rate 20: %+v", v.Overall)
	}
}

// The queue bounds: max_queue_delay caps each request's reservation, so
// the store refuses a later turn without charging (queue_delay_exceeded),
// and a match whose rule's queue is full takes no reservation at all
// (queue_full).
func TestQueueBounds(t *testing.T) {
	p := mustParse(t, rule("", "      rate: 10\n      capacity: 0\n      reserve: true\n      max_queue_delay: 300ms\n      max_queued: 3\n"))
	lim, _ := newLimiter()
	in := fromIP("192.0.2.1")
	ms, _ := p.Match(in)
	if holds, n := ms[0].Queue(); !holds || n != 3 {
		t.Fatalf("Queue() = %v, %d", holds, n)
	}
	if got := ms[0].Request.MaxReserved; got < 2.999999 || got > 3.000001 {
		t.Fatalf("MaxReserved %v, want 3 tokens (300ms at 10/s)", got)
	}
	var waits []time.Duration
	for range 3 {
		ms, _ := p.Match(in)
		v := policy.Enforce(context.Background(), lim, ms, policy.Options{})
		if !v.Allowed {
			t.Fatalf("refused: %+v", v)
		}
		waits = append(waits, v.Overall.RetryAfter)
	}
	for i, w := range waits {
		if want := time.Duration(i+1) * 100 * time.Millisecond; w != want {
			t.Fatalf("waits %v, want 100ms apart", waits)
		}
	}
	ms, _ = p.Match(in)
	v := policy.Enforce(context.Background(), lim, ms, policy.Options{})
	if v.Allowed || v.Reason() != policy.ReasonQueueDelayExceeded || v.Overall.RetryAfter <= 0 {
		t.Fatalf("a turn past max_queue_delay: allowed %v reason %q wait %v", v.Allowed, v.Reason(), v.Overall.RetryAfter)
	}
	before, _ := lim.Peek(context.Background(), sluice.Request{Limit: p.Rule("r").Limit, Key: ms[0].Request.Key, Reserve: true})

	ms, _ = p.Match(in)
	ms[0].QueueFull(time.Second)
	v = policy.Enforce(context.Background(), lim, ms, policy.Options{})
	if v.Allowed || v.Reason() != policy.ReasonQueueFull || v.Overall.RetryAfter != time.Second {
		t.Fatalf("queue full: allowed %v reason %q wait %v", v.Allowed, v.Reason(), v.Overall.RetryAfter)
	}
	after, _ := lim.Peek(context.Background(), sluice.Request{Limit: p.Rule("r").Limit, Key: ms[0].Request.Key, Reserve: true})
	if before.Tokens != after.Tokens {
		t.Fatalf("the refusals charged: tokens %v then %v", before.Tokens, after.Tokens)
	}
}

func TestQueueConfigErrors(t *testing.T) {
	for _, tc := range []struct{ name, extra, body, want string }{
		{"max_queued without reserve", "", "      rps: 10\n      burst: 10\n      max_queued: 5\n",
			"c.yaml:7: rules[0].algorithm_config.max_queued: applies only to a limit that holds requests for their turn: a leaky_bucket, or reserve: true"},
		{"max_queue_delay without reserve", "", "      rps: 10\n      burst: 10\n      max_queue_delay: 1s\n",
			"c.yaml:7: rules[0].algorithm_config.max_queue_delay: applies only to a limit that holds requests for their turn"},
		{"max_queue_delay on a leaky bucket", "    algorithm: leaky_bucket\n", "      rps: 10\n      max_queue_delay: 1s\n",
			"c.yaml:7: rules[0].algorithm_config.max_queue_delay: a leaky bucket's longest wait is its max_delay; set that instead"},
		{"max_queue_delay on a fixed window", "    algorithm: fixed_window\n", "      rate: 10\n      period: 1s\n      reserve: true\n      max_queue_delay: 1s\n",
			"c.yaml:9: rules[0].algorithm_config.max_queue_delay: does not apply to fixed_window"},
		{"max_queued zero", "    algorithm: leaky_bucket\n", "      rps: 10\n      max_queued: 0\n",
			"c.yaml:7: rules[0].algorithm_config.max_queued: must be at least 1 (got 0)"},
		{"cost beyond the delay", "", "      rps: 10\n      burst: 10\n      reserve: true\n      max_queue_delay: 100ms\n      fixed_cost: 12\n",
			"c.yaml:9: rules[0].algorithm_config.fixed_cost: 12 is above what a request may take within max_queue_delay (capacity 10 plus 1 tokens of debt): no request could ever pass"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := strings.Join(problems(t, rule(tc.extra, tc.body)), "\n")
			if !strings.Contains(got, tc.want) {
				t.Fatalf("got:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
	// max_reserved tighter than max_queue_delay: it binds, and check says so.
	p := mustParse(t, rule("", "      rps: 10\n      burst: 10\n      reserve: true\n      max_reserved: 1\n      max_queue_delay: 1s\n"))
	if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0], "max_reserved binds") {
		t.Fatalf("warnings %q", p.Warnings)
	}
	ms, _ := p.Match(fromIP("192.0.2.1"))
	if ms[0].Request.MaxReserved != 0 {
		t.Fatalf("MaxReserved %v: max_reserved should bind", ms[0].Request.MaxReserved)
	}
}
