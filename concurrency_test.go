package sluice_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
)

func TestLeasesPureArithmetic(t *testing.T) {
	conformance.RunLeases(t, newMapStore, conformance.LeaseOptions{})
}

func TestConcurrencySpec(t *testing.T) {
	ok := sluice.Spec{Name: "cc", Algorithm: sluice.Concurrency, MaxInFlight: 3}
	l, err := sluice.NewLimit(ok)
	if err != nil || l.MaxInFlight() != 3 || l.Lease() != sluice.DefaultLease || l.Capacity() != 3 {
		t.Fatalf("%v, %v; want 3 slots on the default lease", l, err)
	}
	start := time.Duration(0)
	for name, s := range map[string]sluice.Spec{
		"no slots":          {Name: "x", Algorithm: sluice.Concurrency},
		"too many slots":    {Name: "x", Algorithm: sluice.Concurrency, MaxInFlight: sluice.MaxInFlightLimit + 1},
		"negative slots":    {Name: "x", Algorithm: sluice.Concurrency, MaxInFlight: -1},
		"short lease":       {Name: "x", Algorithm: sluice.Concurrency, MaxInFlight: 1, Lease: time.Microsecond},
		"negative lease":    {Name: "x", Algorithm: sluice.Concurrency, MaxInFlight: 1, Lease: -time.Second},
		"long lease":        {Name: "x", Algorithm: sluice.Concurrency, MaxInFlight: 1, Lease: 25 * time.Hour},
		"a rate":            {Name: "x", Algorithm: sluice.Concurrency, MaxInFlight: 1, TokensPerSecond: 5},
		"a capacity":        {Name: "x", Algorithm: sluice.Concurrency, MaxInFlight: 1, Capacity: 5},
		"reserve":           {Name: "x", Algorithm: sluice.Concurrency, MaxInFlight: 1, Reserve: true},
		"start":             {Name: "x", Algorithm: sluice.Concurrency, MaxInFlight: 1, Start: &start},
		"shards":            {Name: "x", Algorithm: sluice.Concurrency, MaxInFlight: 1, Shards: 4},
		"slots on a bucket": {Name: "x", TokensPerSecond: 1, Burst: 1, MaxInFlight: 2},
		"lease on a window": {Name: "x", Algorithm: sluice.FixedWindow, Rate: 1, Period: time.Second, Lease: time.Second},
	} {
		if _, err := sluice.NewLimit(s); !errors.Is(err, sluice.ErrInvalidLimit) {
			t.Errorf("%s: %v, want ErrInvalidLimit", name, err)
		}
	}
}

func TestLeaseIDs(t *testing.T) {
	a, b := sluice.NewLeaseID(), sluice.NewLeaseID()
	if a == b || a.IsZero() || len(a.String()) != 32 {
		t.Fatalf("%s %s", a, b)
	}
	for _, s := range []string{a.String(), strings.ToUpper(a.String())} {
		if got, err := sluice.ParseLeaseID(s); err != nil || got != a {
			t.Errorf("ParseLeaseID(%q) = %s, %v", s, got, err)
		}
	}
	for _, s := range []string{"", "00", a.String() + "0", a.String()[:31] + "g", "-" + a.String()[1:]} {
		if _, err := sluice.ParseLeaseID(s); !errors.Is(err, sluice.ErrInvalidLease) {
			t.Errorf("ParseLeaseID(%q): %v, want ErrInvalidLease", s, err)
		}
	}
}

// A concurrency limit holds slots by lease: its takes, refunds and
// all-or-nothing takes are refused on every path, and an acquire of any
// other limit too.
func TestConcurrencyNeedsLease(t *testing.T) {
	ctx := context.Background()
	clk := sluice.NewManualClock(time.Unix(1000, 0))
	lim := sluice.New(newMapStore(t, clk))
	cc := sluice.MustLimit(sluice.Spec{Name: "cc", Algorithm: sluice.Concurrency, MaxInFlight: 1})
	tb := sluice.MustLimit(sluice.Spec{Name: "tb", TokensPerSecond: 1, Burst: 1})
	r := sluice.Request{Limit: cc, Key: "k"}
	if _, err := lim.Take(ctx, r); !errors.Is(err, sluice.ErrLeaseRequired) || !sluice.IsInputError(err) {
		t.Errorf("Take: %v", err)
	}
	if _, err := lim.Refund(ctx, r); !errors.Is(err, sluice.ErrLeaseRequired) {
		t.Errorf("Refund: %v", err)
	}
	if _, _, err := lim.TakeAll(ctx, r, sluice.Request{Limit: tb, Key: "k"}); !errors.Is(err, sluice.ErrLeaseRequired) {
		t.Errorf("TakeAll: %v", err)
	}
	if _, _, err := lim.Acquire(ctx, sluice.Request{Limit: tb, Key: "k"}); !errors.Is(err, sluice.ErrLeaseRequired) {
		t.Errorf("Acquire of a token bucket: %v", err)
	}
	for _, bad := range []sluice.Request{{Limit: cc, Key: "k", Cost: 0.5}, {Limit: cc, Key: "k", Cost: 2}, {Limit: cc, Key: "k", Reserve: true}, {Key: "k"}} {
		if _, _, err := lim.Acquire(ctx, bad); err == nil || !sluice.IsInputError(err) {
			t.Errorf("Acquire %+v: %v, want an input error", bad, err)
		}
	}
	var zero sluice.Lease
	if err := zero.Release(ctx); err != nil || zero.Held() {
		t.Errorf("the zero Lease: %v", err)
	}
	zero.Keep(nil)() // nothing to keep, nothing to stop
	if _, err := zero.Renew(ctx); !errors.Is(err, sluice.ErrLeaseRequired) {
		t.Errorf("renewing the zero Lease: %v", err)
	}
}

// Keep renews a lease every half lease on the limiter's clock, so the
// slot outlives its first lease while its holder lives; after stop, the
// slot ends with its last renewal.
func TestLeaseKeep(t *testing.T) {
	ctx := context.Background()
	clk := sluice.NewManualClock(time.Unix(1000, 0))
	lim := sluice.NewWithOptions(newMapStore(t, clk), sluice.Options{Clock: clk})
	cc := sluice.MustLimit(sluice.Spec{Name: "cc", Algorithm: sluice.Concurrency, MaxInFlight: 1, Lease: 10 * time.Second})
	r := sluice.Request{Limit: cc, Key: "k"}
	ls, d, err := lim.Acquire(ctx, r)
	if err != nil || !d.Allowed || ls.Key() != "k" || ls.Limit() != cc {
		t.Fatalf("%+v %+v %v", ls, d, err)
	}
	var lost []error
	stop := ls.Keep(func(_ sluice.Decision, err error) { lost = append(lost, err) })
	waitPending := func(n int) {
		for {
			got, changed := clk.PendingTimers()
			if got == n {
				return
			}
			<-changed
		}
	}
	for range 6 { // 30s, three leases
		waitPending(1)
		clk.Advance(5 * time.Second)
	}
	waitPending(1)
	if d, _ := lim.Peek(ctx, r); d.Allowed {
		t.Fatal("a kept lease lost its slot")
	}
	stop()
	stop()
	waitPending(0)
	if len(lost) != 0 {
		t.Fatalf("renewals lost the slot: %v", lost)
	}
	clk.Advance(10 * time.Second)
	if d, _ := lim.Peek(ctx, r); !d.Allowed {
		t.Fatal("the slot outlived its last renewal by a lease")
	}
}
