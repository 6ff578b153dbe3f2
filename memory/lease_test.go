package memory_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/memory"
)

func TestLeases(t *testing.T) {
	conformance.RunLeases(t, newStore, conformance.LeaseOptions{})
}

// A key's leases count against max_keys: a key whose last lease is
// released leaves the store at once, one whose leases all ended is full
// and is evicted before any partial key, and a key with live leases is
// kept while a full one exists.
func TestLeaseKeysBounded(t *testing.T) {
	clock := sluice.NewManualClock(time.Unix(1000, 0))
	s := memory.New(memory.Options{Clock: clock, MaxKeys: 16, Shards: 1})
	lim := sluice.NewWithOptions(s, sluice.Options{Clock: clock})
	cc := sluice.MustLimit(sluice.Spec{Name: "cc", Algorithm: sluice.Concurrency, MaxInFlight: 1, LeaseTerm: time.Second})

	ls, d, err := lim.Acquire(ctx, sluice.Request{Limit: cc, Key: "released"})
	if err != nil || !d.Allowed || s.Len() != 1 {
		t.Fatalf("acquire: %+v, %v, %d keys", d, err, s.Len())
	}
	if err := ls.Release(ctx); err != nil || s.Len() != 0 {
		t.Fatalf("release: %v, %d keys; want the key gone", err, s.Len())
	}

	if _, d, err := lim.Acquire(ctx, sluice.Request{Limit: cc, Key: "held"}); err != nil || !d.Allowed {
		t.Fatalf("acquire: %+v, %v", d, err)
	}
	clock.Advance(time.Second / 2)
	for i := range 15 {
		if _, d, err := lim.Acquire(ctx, sluice.Request{Limit: cc, Key: string(rune('a' + i))}); err != nil || !d.Allowed {
			t.Fatalf("acquire %d: %+v, %v", i, d, err)
		}
	}
	// The first lease has ended; the 15 others have not. A new key must
	// take the full one's place, not a held one's.
	clock.Advance(time.Second / 2)
	if _, d, err := lim.Acquire(ctx, sluice.Request{Limit: cc, Key: "new"}); err != nil || !d.Allowed {
		t.Fatalf("acquire at the bound: %+v, %v", d, err)
	}
	if full, partial := s.Evictions(); full != 1 || partial != 0 {
		t.Fatalf("evictions: %d full, %d partial; want the ended lease's key, and no held one", full, partial)
	}
	for i := range 15 {
		if _, d, err := lim.Acquire(ctx, sluice.Request{Limit: cc, Key: string(rune('a' + i))}); err != nil || d.Allowed {
			t.Fatalf("key %d, still held: %+v, %v; want rejected", i, d, err)
		}
	}
}

// Attack: fill the store's key bound by renewing (or releasing) leases of
// keys that hold none, which the API token lets any trusted service ask
// with any key. Neither makes an entry: only an admitted acquire does.
func TestAttackLeaseRenewOfNothingStoresNothing(t *testing.T) {
	clock := sluice.NewManualClock(time.Unix(1000, 0))
	s := memory.New(memory.Options{Clock: clock})
	lim := sluice.NewWithOptions(s, sluice.Options{Clock: clock})
	cc := sluice.MustLimit(sluice.Spec{Name: "cc", Algorithm: sluice.Concurrency, MaxInFlight: 1, LeaseTerm: time.Minute})
	conformance.CallsOnNothing(ctx, t, lim, cc, 1000)
	if n := s.Len(); n != 0 {
		t.Fatalf("%d keys stored by renewals and releases of nothing", n)
	}
}
