package memory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// The memory store keeps buckets in the process, at most MaxKeys of them
// (store: {url: "memory://?max_keys=200000"} in a file).
func Example() {
	store := memory.New(memory.Options{MaxKeys: 200_000})
	lim := sluice.New(store)
	perIP := sluice.MustLimit(sluice.Spec{Name: "per-ip", Rate: 3, Period: time.Minute, Capacity: 3})

	ctx := context.Background()
	for _, ip := range []string{"192.0.2.1", "192.0.2.1", "192.0.2.2"} {
		d, err := lim.Take(ctx, sluice.Request{Limit: perIP, Key: ip})
		if err != nil {
			panic(err)
		}
		fmt.Println(ip, d.Allowed, d.Remaining)
	}
	fmt.Println("keys:", store.Len())
	// Output:
	// 192.0.2.1 true 2
	// 192.0.2.1 true 1
	// 192.0.2.2 true 2
	// keys: 2
}

// With a ManualClock, given to the store and the limiter alike, a test
// moves time itself: no sleeping, the same answer on every machine.
func Example_manualClock() {
	clk := sluice.NewManualClock(time.Date(2025, 1, 2, 15, 0, 0, 0, time.UTC))
	lim := sluice.NewWithOptions(memory.New(memory.Options{Clock: clk}), sluice.Options{Clock: clk})
	l := sluice.MustLimit(sluice.Spec{Name: "per-user", TokensPerSecond: 1, Burst: 1})
	r := sluice.Request{Limit: l, Key: "u"}

	ctx := context.Background()
	d, _ := lim.Take(ctx, r)
	fmt.Println(d.Allowed)
	d, _ = lim.Take(ctx, r)
	fmt.Println(d.Allowed, d.RetryAfter)
	clk.Advance(d.RetryAfter)
	d, _ = lim.Take(ctx, r)
	fmt.Println(d.Allowed)
	// Output:
	// true
	// false 1s
	// true
}
