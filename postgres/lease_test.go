package postgres_test

import (
	"context"
	"fmt"
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
	cc := sluice.MustLimit(sluice.Spec{Name: "cc", Algorithm: sluice.Concurrency, MaxInFlight: 2, LeaseTerm: time.Second})
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

// Attack: fill the table with rows by renewing (or releasing) leases of
// keys that hold none, which the API token lets any trusted service ask
// with any key. Neither writes a row: only an admitted acquire does.
func TestAttackLeaseRenewOfNothingWritesNothing(t *testing.T) {
	s := newStoreOpts(t, postgres.Options{})
	ctx := pgtest.Context(t)
	lim := sluice.New(s)
	name := fmt.Sprintf("renew%d", time.Now().UnixNano())
	cc := sluice.MustLimit(sluice.Spec{Name: name, Algorithm: sluice.Concurrency, MaxInFlight: 1, LeaseTerm: time.Minute})
	conformance.CallsOnNothing(ctx, t, lim, cc, 20)
	rows := func() int {
		t.Helper()
		var n int
		if err := pool(t).QueryRow(ctx, `SELECT count(*) FROM sluice_buckets WHERE key LIKE ('%'::bytea || $1::bytea || '%'::bytea)`, []byte(":"+name+":")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := rows(); n != 0 {
		t.Fatalf("%d rows written by renewals and releases of nothing", n)
	}
	if _, d, err := lim.Acquire(ctx, sluice.Request{Limit: cc, Key: "held"}); err != nil || !d.Allowed || rows() != 1 {
		t.Fatalf("an acquire: %+v, %v, %d rows; want its row", d, err, rows())
	}
}

// Attack: hold a concurrency slot past the request by hanging up (see
// the redis package's test of the same name).
func TestAttackHungUpClientKeepsItsSlot(t *testing.T) {
	lim := sluice.New(newStoreOpts(t, postgres.Options{}))
	cc := sluice.MustLimit(sluice.Spec{Name: fmt.Sprintf("hangup%d", time.Now().UnixNano()), Algorithm: sluice.Concurrency, MaxInFlight: 1, LeaseTerm: time.Hour})
	req := sluice.Request{Limit: cc, Key: "upstream"}
	ctx, hangUp := context.WithCancel(pgtest.Context(t))
	lease, d, err := lim.Acquire(ctx, req)
	if err != nil || !d.Allowed {
		t.Fatalf("acquire: %+v, %v", d, err)
	}
	hangUp()
	if err := lease.Release(ctx); err != nil {
		t.Errorf("release after the client hung up: %v", err)
	}
	if _, d, err := lim.Acquire(pgtest.Context(t), req); err != nil || !d.Allowed {
		t.Fatalf("the next client's acquire: %+v, %v; want the slot the hung-up client's request released", d, err)
	}
}
