package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// Wait blocks until the request's turn. When the turn would come after
// the context's deadline it returns at once, having charged nothing.
func ExampleLimiter_Wait() {
	perJob := sluice.MustLimit(sluice.Spec{Name: "jobs", Rate: 1, Period: time.Minute, Capacity: 1})
	lim := sluice.New(memory.New(memory.Options{}))

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	fmt.Println("first:", lim.Wait(ctx, sluice.Request{Limit: perJob, Key: "tenant-7"}))

	// The next token is a minute away; the deadline is a second away.
	err := lim.Wait(ctx, sluice.Request{Limit: perJob, Key: "tenant-7"})
	fmt.Println("second beyond the deadline:", errors.Is(err, sluice.ErrBeyondDeadline))
	var le *sluice.LimitedError
	if errors.As(err, &le) {
		fmt.Println("retry in about", le.RetryAfter.Round(time.Minute))
	}
	// Output:
	// first: <nil>
	// second beyond the deadline: true
	// retry in about 1m0s
}

// A waiter that sleeps on a ManualClock wakes when the clock reaches its
// turn, which is how sluice's own tests wait without sleeping.
func ExampleLimiter_Wait_manualClock() {
	clk := sluice.NewManualClock(time.Date(2025, 1, 2, 15, 0, 0, 0, time.UTC))
	lim := sluice.NewWithOptions(memory.New(memory.Options{Clock: clk}), sluice.Options{Clock: clk})
	l := sluice.MustLimit(sluice.Spec{Name: "spaced", Rate: 1, Period: time.Minute, Capacity: 1})
	r := sluice.Request{Limit: l, Key: "k"}

	lim.Wait(context.Background(), r) // the token at hand
	done := make(chan error)
	go func() { done <- lim.Wait(context.Background(), r) }() // reserves the next
	for {
		n, changed := clk.PendingTimers()
		if n == 1 {
			break
		}
		<-changed
	}
	clk.Advance(time.Minute)
	fmt.Println("woke at", clk.Now().Format(time.TimeOnly), "with", <-done)
	// Output:
	// woke at 15:01:00 with <nil>
}

// TakeOrError makes a rejection an error that carries the rule, the key
// and when to retry.
func ExampleLimiter_TakeOrError() {
	clk := sluice.NewManualClock(time.Date(2025, 1, 2, 15, 4, 5, 0, time.UTC))
	lim := sluice.NewWithOptions(memory.New(memory.Options{Clock: clk}), sluice.Options{Clock: clk})
	signups := sluice.MustLimit(sluice.Spec{Name: "signups", Rate: 100, Period: time.Hour, Capacity: 1})
	r := sluice.Request{Limit: signups, Key: "global"}

	if _, err := lim.TakeOrError(context.Background(), r); err != nil {
		fmt.Println("unexpected:", err)
	}
	_, err := lim.TakeOrError(context.Background(), r)
	var le *sluice.LimitedError
	if errors.As(err, &le) {
		fmt.Println(le.Rule, le.Key, le.RetryAfter, le.RetryAt.Format(sluice.RetryAtLayout))
	}
	fmt.Println(errors.Is(err, sluice.ErrLimited))
	fmt.Println(err)
	// Output:
	// signups global 36s 2025-01-02T15:04:41.000Z
	// true
	// sluice: rate limited by "signups" for key "global"; retry after 36s (at 2025-01-02T15:04:41.000Z)
}

// Acquire holds one of a key's slots of a concurrency limit until the
// lease is released; a rejected caller gets the zero Lease, whose Release
// does nothing.
func ExampleLimiter_Acquire() {
	inflight := sluice.MustLimit(sluice.Spec{Name: "llm-inflight", Algorithm: sluice.Concurrency, MaxInFlight: 2, LeaseTerm: time.Minute})
	lim := sluice.New(memory.New(memory.Options{}))
	ctx := context.Background()
	r := sluice.Request{Limit: inflight, Key: "api-key-7"}

	first, d, _ := lim.Acquire(ctx, r)
	fmt.Println("first:", d.Allowed, "remaining", d.Remaining)
	second, d, _ := lim.Acquire(ctx, r)
	fmt.Println("second:", d.Allowed, "remaining", d.Remaining)
	third, d, _ := lim.Acquire(ctx, r)
	fmt.Println("third:", d.Allowed, "holds a slot:", third.Held())
	defer third.Release(ctx) // nothing to release, and no error

	first.Release(ctx)
	_, d, _ = lim.Acquire(ctx, r)
	fmt.Println("after a release:", d.Allowed)
	second.Release(ctx)
	// Output:
	// first: true remaining 1
	// second: true remaining 0
	// third: false holds a slot: false
	// after a release: true
}

// The concurrency snippet of docs/library.md, compiled: a slot held for the work,
// renewed while it runs.
func ExampleLimiter_Acquire_readme() {
	lim := sluice.New(memory.New(memory.Options{}))
	ctx := context.Background()
	apiKey := "api-key-7"
	inflight := sluice.MustLimit(sluice.Spec{Name: "llm-inflight", Algorithm: sluice.Concurrency, MaxInFlight: 4, LeaseTerm: 2 * time.Minute})

	lease, d, err := lim.Acquire(ctx, sluice.Request{Limit: inflight, Key: apiKey})
	if err != nil {
		return // a store error: no slot is held
	}
	if !d.Allowed {
		// d.RetryAfter: until enough leases end for a slot to be free (sooner if one is released)
	}
	defer lease.Release(ctx) // releasing the zero Lease of a rejection does nothing
	stop := lease.Keep(nil)  // renew every half lease while the work runs longer than a lease
	defer stop()
}
