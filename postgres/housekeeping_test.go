package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/postgres"
)

// flood takes once from n distinct keys of each limit, from 16 goroutines.
func flood(t *testing.T, s *postgres.Store, round, n int, lims ...*sluice.Limit) {
	t.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 16 {
				for _, l := range lims {
					if _, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: l, Key: fmt.Sprintf("r%d-k%d", round, i)}); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// Under a key-cardinality flood (every round a thousand new keys per
// limit) the table holds only the buckets that are not yet full.
func TestHousekeepingFlood(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(5_000_000_000_000))
	s := newStoreOpts(t, postgres.Options{Clock: clock, HousekeepingBatch: 300})
	ctx := context.Background()
	start := time.Duration(0)
	lims := []*sluice.Limit{
		sluice.MustLimit(sluice.Spec{Name: "hk-tb", TokensPerSecond: 10, Burst: 5}),
		sluice.MustLimit(sluice.Spec{Name: "hk-fw", Algorithm: sluice.FixedWindow, Rate: 5, Period: time.Second, Start: &start}),
		sluice.MustLimit(sluice.Spec{Name: "hk-sl", Algorithm: sluice.SlidingLog, Rate: 5, Period: 300 * time.Millisecond}),
	}
	const perRound = 1000
	for round := 0; round < 3; round++ {
		flood(t, s, round, perRound, lims...)
		n, err := s.Len(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n > 2*perRound*int64(len(lims)) {
			t.Fatalf("round %d: %d rows, more than two rounds of keys", round, n)
		}
		// A bucket that is only partly refilled stays.
		clock.Advance(50 * time.Millisecond)
		if _, err := s.Housekeep(ctx); err != nil {
			t.Fatal(err)
		}
		if n2, _ := s.Len(ctx); n2 != n {
			t.Fatalf("round %d: housekeeping deleted %d rows of buckets that are not full", round, n-n2)
		}
		// All of them are full after a second.
		clock.Advance(time.Second)
		deleted, err := s.Housekeep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n, _ = s.Len(ctx); n != 0 {
			t.Fatalf("round %d: %d rows left after housekeeping (deleted %d)", round, n, deleted)
		}
	}
}

// A deleted row answers exactly as it did before it was deleted.
func TestHousekeepingChangesNoAnswer(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(6_000_000_000_000))
	s := newStoreOpts(t, postgres.Options{Clock: clock})
	ctx := context.Background()
	lim := sluice.MustLimit(sluice.Spec{Name: "hk-same", TokensPerSecond: 4, Burst: 2})
	req := sluice.Request{Limit: lim, Key: "k"}
	for i := 0; i < 2; i++ {
		if _, err := conformance.Take(ctx, s, engine.OpTake, req); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(500 * time.Millisecond) // exactly refilled
	before, err := conformance.Take(ctx, s, engine.OpPeek, req)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := s.Housekeep(ctx); err != nil || n != 1 {
		t.Fatalf("housekeeping deleted %d rows (%v), want the one full bucket", n, err)
	}
	after, err := conformance.Take(ctx, s, engine.OpPeek, req)
	if err != nil {
		t.Fatal(err)
	}
	if before != after {
		t.Fatalf("answer changed by housekeeping: before %+v after %+v", before, after)
	}
}

// The background loop runs by itself.
func TestHousekeepingLoop(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(7_000_000_000_000))
	s := newStoreOpts(t, postgres.Options{Clock: clock, HousekeepingInterval: 10 * time.Millisecond})
	lim := sluice.MustLimit(sluice.Spec{Name: "hk-loop", TokensPerSecond: 1, Burst: 1})
	flood(t, s, 0, 50, lim)
	clock.Advance(2 * time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := s.Len(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows left: the housekeeping loop did not run", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAttackHousekeepingHoldsFullBuckets: a transaction holding one full
// bucket's row (a TakeAll in flight, a WithTx caller) made housekeeping's
// DELETE, which had already deleted other full buckets, wait for it while
// holding those rows; every take of those keys then waited past its
// deadline and was answered by on_store_error (allow, by default).
func TestAttackHousekeepingHoldsFullBuckets(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(5_000_000_000_000))
	s := newStoreOpts(t, postgres.Options{Clock: clock, Timeout: 5 * time.Second})
	ctx := context.Background()
	lim := sluice.MustLimit(sluice.Spec{Name: "hk-held", TokensPerSecond: 1, Burst: 1})
	take := func(s sluice.Store, key string) error {
		_, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: key})
		return err
	}
	for _, k := range []string{"other", "held"} { // "other" first: the lower ctid
		if err := take(s, k); err != nil {
			t.Fatal(err)
		}
		clock.Advance(10 * time.Millisecond)
	}
	clock.Advance(2 * time.Second) // both full: housekeeping deletes them

	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := take(s.WithTx(tx), "held"); err != nil {
		t.Fatal(err)
	}

	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	hk := make(chan error, 1)
	go func() { _, err := s.Housekeep(hctx); hk <- err }()
	// Housekeeping is done, or waits for the held row's lock.
	for waiting := false; !waiting; {
		select {
		case err := <-hk:
			if err != nil {
				t.Fatal(err)
			}
			waiting = true
			hk <- nil
		default:
			if err := s.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
				WHERE datname = current_database() AND query LIKE 'DELETE FROM sluice_buckets%' AND wait_event_type = 'Lock')`).Scan(&waiting); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := take(s, "other"); err != nil {
		t.Fatalf("a take of a full bucket that housekeeping deleted waited for another key's transaction: %v", err)
	}
	tx.Rollback(ctx)
	if err := <-hk; err != nil {
		t.Fatal(err)
	}
}
