package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// A limit, a store, and a Take per request: the README's first snippet,
// run. One request a minute per user, two at once.
func Example() {
	ctx := context.Background()
	perUser := sluice.MustLimit(sluice.Spec{Name: "per-user", Rate: 1, Period: time.Minute, Capacity: 2})
	lim := sluice.New(memory.New(memory.Options{}))

	for i := 1; i <= 3; i++ {
		d, err := lim.Take(ctx, sluice.Request{Limit: perUser, Key: "user-42", Cost: 1})
		if err != nil {
			log.Fatal(err) // a cost that can never succeed, or a store error
		}
		if !d.Allowed {
			// d.RetryAfter says how long to wait; d.Remaining, d.ResetAfter, d.Rule describe the bucket
			fmt.Printf("request %d: rejected by %s, retry in about %v\n", i, d.Rule, d.RetryAfter.Round(time.Minute))
			continue
		}
		fmt.Printf("request %d: allowed, %d left\n", i, d.Remaining)
	}
	// Output:
	// request 1: allowed, 1 left
	// request 2: allowed, 0 left
	// request 3: rejected by per-user, retry in about 1m0s
}

// TakeAll checks several limits at once and charges none of them when any
// rejects: the per-user bucket keeps its token when the global one is
// empty.
func ExampleLimiter_TakeAll() {
	ctx := context.Background()
	perUser := sluice.MustLimit(sluice.Spec{Name: "per-user", Rate: 10, Period: time.Hour, Capacity: 10})
	global := sluice.MustLimit(sluice.Spec{Name: "global", Rate: 1, Period: time.Hour, Capacity: 1})
	lim := sluice.New(memory.New(memory.Options{}))

	for _, user := range []string{"alice", "bob"} {
		d, _, err := lim.TakeAll(ctx,
			sluice.Request{Limit: perUser, Key: user},
			sluice.Request{Limit: global, Key: "all"},
		)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: allowed %v (decided by %s)\n", user, d.Allowed, d.Rule)
	}
	d, _ := lim.Peek(ctx, sluice.Request{Limit: perUser, Key: "bob"})
	fmt.Println("bob's bucket after the rejection:", d.Remaining+1, "of 10") // a peek answers as if it took one
	// Output:
	// alice: allowed true (decided by global)
	// bob: allowed false (decided by global)
	// bob's bucket after the rejection: 10 of 10
}

// The Wait snippet of docs/library.md: a turn beyond the context's deadline returns
// at once, charging nothing.
func ExampleLimiter_Wait_readme() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	perTenant := sluice.MustLimit(sluice.Spec{Name: "per-tenant", Rate: 1, Period: time.Hour, Capacity: 1})
	lim := sluice.New(memory.New(memory.Options{}))
	tenant := "acme"

	for range 2 {
		if err := lim.Wait(ctx, sluice.Request{Limit: perTenant, Key: tenant, Cost: 1}); err != nil {
			// ctx done, a cost that can never succeed, or a turn after ctx's deadline
			// (errors.Is(err, sluice.ErrBeyondDeadline), charging nothing)
			fmt.Println(errors.Is(err, sluice.ErrBeyondDeadline))
			continue
		}
		fmt.Println("admitted")
	}
	// Output:
	// admitted
	// true
}

// The TakeOrError snippet of docs/library.md: a rejection as an error.
func ExampleLimitedError() {
	signups := sluice.MustLimit(sluice.Spec{Name: "signups", Rate: 100, Period: time.Hour, Capacity: 1})
	lim := sluice.New(memory.New(memory.Options{}))
	signup := func(ctx context.Context) error {
		_, err := lim.TakeOrError(ctx, sluice.Request{Limit: signups, Key: "global"})
		var le *sluice.LimitedError
		if errors.As(err, &le) {
			return fmt.Errorf("signups are paused until %s: %w", le.RetryAt, err)
		}
		return err
	}
	fmt.Println(signup(context.Background()))
	err := signup(context.Background())
	fmt.Println(errors.Is(err, sluice.ErrLimited))
	// Output:
	// <nil>
	// true
}
