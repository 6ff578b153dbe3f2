package sluice_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// Settle charges what a request turned out to cost: the estimate is
// charged up front, and the difference refunded, or charged into debt,
// once the actual cost is known.
func ExampleLimiter_Settle() {
	clk := sluice.NewManualClock(time.Date(2025, 1, 2, 15, 0, 0, 0, time.UTC))
	tokens := sluice.MustLimit(sluice.Spec{Name: "llm-tokens", Rate: 10000, Period: time.Minute, Capacity: 10000})
	lim := sluice.NewWithOptions(memory.New(memory.Options{Clock: clk}), sluice.Options{Clock: clk})
	ctx := context.Background()
	req := sluice.Request{Limit: tokens, Key: "key-42", Cost: 1000} // max_tokens
	if d, err := lim.Take(ctx, req); err != nil || !d.Allowed {
		return
	}
	s, _ := lim.Settle(ctx, req, 1000, 312) // the model used 312
	fmt.Printf("refunded %v, %v left\n", s.Refunded, s.Decision.Tokens)

	lim.Take(ctx, req)
	s, _ = lim.Settle(ctx, req, 1000, 12000) // used far more than it said
	fmt.Printf("extra %v, forgiven %v, %v left, %v s to pay back\n", s.Extra, s.Forgiven, s.Decision.Tokens, s.Decision.RetryAfter.Seconds())
	// Output:
	// refunded 688, 9688 left
	// extra 11000, forgiven 0, -2312 left, 0 s to pay back
}
