package policy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
)

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
		t.Run(name, func(t *testing.T) {
			cfg := "rules:\n  - name: budget\n    limit_keys: [\"header:x-api-key\"]\n    algorithm: " + alg[0] + "\n    algorithm_config: " + alg[1] + "\n"
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
		})
	}
}
