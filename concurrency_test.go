package sluice_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
)

func TestLeasesPureArithmetic(t *testing.T) {
	conformance.RunLeases(t, newMapStore, conformance.LeaseOptions{})
}

func TestConcurrencySpec(t *testing.T) {
	ok := sluice.Spec{Name: "cc", Algorithm: sluice.Concurrency, MaxInFlight: 3}
	l, err := sluice.NewLimit(ok)
	if err != nil || l.MaxInFlight() != 3 || l.LeaseTerm() != sluice.DefaultLeaseTerm || l.Capacity() != 3 {
		t.Fatalf("%v, %v; want 3 slots on the default lease", l, err)
	}
	start := time.Duration(0)
	for name, s := range map[string]sluice.Spec{
		"no slots":          {Name: "x", Algorithm: sluice.Concurrency},
		"too many slots":    {Name: "x", Algorithm: sluice.Concurrency, MaxInFlight: sluice.MaxInFlightLimit + 1},
		"negative slots":    {Name: "x", Algorithm: sluice.Concurrency, MaxInFlight: -1},
		"short lease":       {Name: "x", Algorithm: sluice.Concurrency, MaxInFlight: 1, LeaseTerm: time.Microsecond},
		"negative lease":    {Name: "x", Algorithm: sluice.Concurrency, MaxInFlight: 1, LeaseTerm: -time.Second},
		"long lease":        {Name: "x", Algorithm: sluice.Concurrency, MaxInFlight: 1, LeaseTerm: 25 * time.Hour},
		"a rate":            {Name: "x", Algorithm: sluice.Concurrency, MaxInFlight: 1, TokensPerSecond: 5},
		"a capacity":        {Name: "x", Algorithm: sluice.Concurrency, MaxInFlight: 1, Capacity: 5},
		"reserve":           {Name: "x", Algorithm: sluice.Concurrency, MaxInFlight: 1, Reserve: true},
		"start":             {Name: "x", Algorithm: sluice.Concurrency, MaxInFlight: 1, Start: &start},
		"shards":            {Name: "x", Algorithm: sluice.Concurrency, MaxInFlight: 1, Shards: 4},
		"slots on a bucket": {Name: "x", TokensPerSecond: 1, Burst: 1, MaxInFlight: 2},
		"lease on a window": {Name: "x", Algorithm: sluice.FixedWindow, Rate: 1, Period: time.Second, LeaseTerm: time.Second},
	} {
		if _, err := sluice.NewLimit(s); !errors.Is(err, sluice.ErrInvalidLimit) {
			t.Errorf("%s: %v, want ErrInvalidLimit", name, err)
		}
	}
}

func TestLeaseIDs(t *testing.T) {
	a, b := engine.NewLeaseID(), engine.NewLeaseID()
	if a == b || a.IsZero() || len(a.String()) != 32 {
		t.Fatalf("%s %s", a, b)
	}
	for _, s := range []string{a.String(), strings.ToUpper(a.String())} {
		if got, err := engine.ParseLeaseID(s); err != nil || got != a {
			t.Errorf("ParseLeaseID(%q) = %s, %v", s, got, err)
		}
	}
	for _, s := range []string{"", "00", a.String() + "0", a.String()[:31] + "g", "-" + a.String()[1:]} {
		if _, err := engine.ParseLeaseID(s); !errors.Is(err, engine.ErrInvalidLease) {
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
	if _, err := lim.Renew(ctx, sluice.Request{Limit: tb, Key: "k"}, engine.NewLeaseID()); !errors.Is(err, sluice.ErrLeaseRequired) {
		t.Errorf("Renew of a token bucket: %v", err)
	}
	// OpRenew is a call on leases alone: a take of it is refused before
	// any state is read.
	if _, err := (sluice.Request{Limit: tb, Key: "k"}).Charged(engine.OpRenew); err == nil || !strings.Contains(err.Error(), "Store.Lease") {
		t.Errorf("a take with OpRenew: %v", err)
	}
	var zero sluice.Lease
	if err := zero.Release(ctx); err != nil || zero.Held() {
		t.Errorf("the zero Lease: %v", err)
	}
	zero.Keep(nil)() // nothing to keep, nothing to stop
	if _, err := zero.Reacquire(ctx); !errors.Is(err, sluice.ErrLeaseRequired) {
		t.Errorf("renewing the zero Lease: %v", err)
	}
}

// Limiter.Renew, for a caller with the lease id alone, renews a live
// lease and nothing else: unlike Lease.Reacquire it takes no slot for an id
// that holds none, even with one free.
func TestLimiterRenewNeverAcquires(t *testing.T) {
	ctx := context.Background()
	clk := sluice.NewManualClock(time.Unix(1000, 0))
	lim := sluice.New(newMapStore(t, clk))
	cc := sluice.MustLimit(sluice.Spec{Name: "cc", Algorithm: sluice.Concurrency, MaxInFlight: 2, LeaseTerm: 10 * time.Second})
	r := sluice.Request{Limit: cc, Key: "k"}
	lease, d, err := lim.Acquire(ctx, r)
	if err != nil || !d.Allowed {
		t.Fatalf("acquire: %+v, %v", d, err)
	}
	clk.Advance(8 * time.Second)
	if d, err := lim.Renew(ctx, r, lease.ID()); err != nil || !d.Allowed || d.ResetAfter != 10*time.Second {
		t.Fatalf("renewing a live lease: %+v, %v", d, err)
	}
	if d, err := lim.Renew(ctx, r, engine.NewLeaseID()); err != nil || d.Allowed || d.Remaining != 1 {
		t.Fatalf("renewing an id never acquired: %+v, %v; want refused, one slot still free", d, err)
	}
	clk.Advance(11 * time.Second) // past the renewed lease
	if d, err := lim.Renew(ctx, r, lease.ID()); err != nil || d.Allowed || d.Remaining != 2 {
		t.Fatalf("renewing an ended lease: %+v, %v; want refused, both slots free", d, err)
	}
	// Lease.Reacquire, by contrast, takes a free slot again.
	if d, err := lease.Reacquire(ctx); err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("Lease.Reacquire of an ended lease with slots free: %+v, %v", d, err)
	}
}

// Keep renews a lease every half lease on the limiter's clock, so the
// slot outlives its first lease while its holder lives; after stop, the
// slot ends with its last renewal.
func TestLeaseKeep(t *testing.T) {
	ctx := context.Background()
	clk := sluice.NewManualClock(time.Unix(1000, 0))
	lim := sluice.NewWithOptions(newMapStore(t, clk), sluice.Options{Clock: clk})
	cc := sluice.MustLimit(sluice.Spec{Name: "cc", Algorithm: sluice.Concurrency, MaxInFlight: 1, LeaseTerm: 10 * time.Second})
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

// StepLease on any sequence of acquires, peeks and releases of a few
// leases, with a clock that moves either way: never more leases than
// slots are added, an admitted acquire leaves its lease live for a whole
// lease, a release leaves it gone, a peek changes nothing and answers as
// the acquire after it does, and the outcome counts what is held.
func FuzzStepLease(f *testing.F) {
	f.Add(uint8(2), uint32(1000), []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add(uint8(1), uint32(1), []byte{0x10, 0x21, 0x32, 0x03, 0x14})
	f.Fuzz(func(t *testing.T, slots uint8, leaseUs uint32, ops []byte) {
		n := int(slots%8) + 1
		lease := time.Duration(leaseUs%5_000_000+1000) * time.Microsecond
		l := sluice.MustLimit(sluice.Spec{Name: "f", Algorithm: sluice.Concurrency, MaxInFlight: n, LeaseTerm: lease})
		p := l.Params()
		ids := [4]engine.LeaseID{engine.NewLeaseID(), engine.NewLeaseID(), engine.NewLeaseID(), engine.NewLeaseID()}
		var set []engine.LeaseEntry
		now := int64(1_000_000_000)
		live := func(set []engine.LeaseEntry, now int64) (count int, ends map[engine.LeaseID]int64) {
			ends = map[engine.LeaseID]int64{}
			for _, e := range set {
				if e.Expires > now {
					count++
					ends[e.ID] = e.Expires
				}
			}
			return count, ends
		}
		for _, b := range ops {
			now += int64(int8(b)) * 50_000 // the clock moves either way
			id := ids[b>>4&3]
			before, _ := live(set, now)
			switch b & 3 {
			case 1: // renew
				_, ends := live(set, now)
				_, held := ends[id]
				var o engine.Outcome
				set, o, _ = engine.StepLease(p, set, now, engine.OpRenew, id)
				after, ends := live(set, now)
				_, has := ends[id]
				if o.Allowed != held || has != held || after != before || o.RetryAfter != 0 {
					t.Fatalf("renew: %+v, held %v, holds after %v, %d held before and %d after", o, held, has, before, after)
				}
				if held && ends[id] < now+p.Period {
					t.Fatalf("a renewed lease ends at %d, before %d", ends[id], now+p.Period)
				}
				if o.Tokens != int64(n-after)*engine.TokenScale {
					t.Fatalf("tokens %d with %d of %d held", o.Tokens, after, n)
				}
			case 0: // acquire
				peekSet := append([]engine.LeaseEntry(nil), set...)
				_, po, pw := engine.StepLease(p, peekSet, now, engine.OpPeek, id)
				var o engine.Outcome
				set, o, _ = engine.StepLease(p, set, now, engine.OpTake, id)
				if pw || po != o {
					t.Fatalf("peek %+v (write %v), acquire %+v", po, pw, o)
				}
				after, ends := live(set, now)
				if o.Allowed && ends[id] < now+p.Period {
					t.Fatalf("an admitted acquire's lease ends at %d, before %d", ends[id], now+p.Period)
				}
				if !o.Allowed && (o.RetryAfter <= 0 || after != before) {
					t.Fatalf("a rejection: %+v, %d held before, %d after", o, before, after)
				}
				if after > max(n, before) {
					t.Fatalf("%d leases held with %d slots (%d before)", after, n, before)
				}
				if o.Tokens != int64(n-after)*engine.TokenScale {
					t.Fatalf("tokens %d with %d of %d held", o.Tokens, after, n)
				}
			case 2: // release
				var o engine.Outcome
				_, ends := live(set, now)
				_, held := ends[id]
				set, o, _ = engine.StepLease(p, set, now, engine.OpRelease, id)
				if _, ends := live(set, now); o.Allowed != held || ends[id] != 0 {
					t.Fatalf("release: %+v, held %v, still live %v", o, held, ends[id] != 0)
				}
			case 3: // a peek without a lease
				copySet := append([]engine.LeaseEntry(nil), set...)
				out, o, w := engine.StepLease(p, set, now, engine.OpPeek, engine.LeaseID{})
				if w || len(out) != len(copySet) || o.Allowed != (before < n) {
					t.Fatalf("peek: %+v write %v, %d held of %d", o, w, before, n)
				}
				for i := range out {
					if out[i] != copySet[i] {
						t.Fatal("a peek changed the set")
					}
				}
			}
		}
	})
}
