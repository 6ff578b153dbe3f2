package postgres_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/postgres"
	"github.com/sluicehq/sluice/postgres/pgtest"
)

func TestLeases(t *testing.T) {
	conformance.RunLeases(t, newStore, conformance.LeaseOptions{Goroutines: 48})
}

// A key whose holders all died is a row whose last lease has ended:
// housekeeping deletes it like a full bucket, and not before.
func TestLeaseRowsHousekept(t *testing.T) {
	clock := sluice.NewManualClock(time.Unix(1000, 0))
	s := newStoreOpts(t, postgres.Options{Clock: clock})
	ctx := pgtest.Context(t)
	lim := sluice.NewWithOptions(s, sluice.Options{Clock: clock})
	cc := sluice.MustLimit(sluice.Spec{Name: "cc", Algorithm: sluice.Concurrency, MaxInFlight: 2, Lease: time.Second})
	for _, k := range []string{"a", "b"} {
		if _, d, err := lim.Acquire(ctx, sluice.Request{Limit: cc, Key: k}); err != nil || !d.Allowed {
			t.Fatalf("acquire %s: %+v, %v", k, d, err)
		}
	}
	clock.Advance(time.Second - time.Microsecond)
	if n, err := s.Housekeep(ctx); err != nil || n != 0 {
		t.Fatalf("housekeeping with live leases deleted %d rows (%v), want 0", n, err)
	}
	clock.Advance(time.Microsecond)
	if n, err := s.Housekeep(ctx); err != nil || n != 2 {
		t.Fatalf("housekeeping once the leases ended deleted %d rows (%v), want 2", n, err)
	}
}
