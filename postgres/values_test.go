package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/postgres"
)

// The store keeps the shared values of adaptive rates: a compare-and-swap
// that only one of many concurrent writers wins, under the store's key
// prefix, with an expiry after which the value is absent.
func TestValues(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(5_000_000_000_000))
	s := newStoreOpts(t, postgres.Options{Clock: clock})
	var _ adaptive.Values = s
	ctx := context.Background()
	cur := conformance.RunValues(t, s)
	if ok, _ := s.CompareAndSwapValue(ctx, "adaptive:x", "v0", "v2", time.Minute); ok {
		t.Fatal("swap from a value that is not the one kept")
	}
	if _, err := s.CompareAndSwapValue(ctx, "adaptive:x", cur, "", time.Minute); err == nil {
		t.Fatal("an empty value was accepted")
	}

	// Another prefix sees none of it.
	other := newStoreOpts(t, postgres.Options{Clock: clock})
	if _, ok, err := other.LoadValue(ctx, "adaptive:x"); err != nil || ok {
		t.Fatalf("another prefix: ok %v, %v", ok, err)
	}

	// Past its TTL the value is absent: a swap from it fails, a create
	// writes over it.
	clock.Advance(time.Minute)
	if _, ok, err := s.LoadValue(ctx, "adaptive:x"); err != nil || ok {
		t.Fatalf("expired: ok %v, %v", ok, err)
	}
	if ok, err := s.CompareAndSwapValue(ctx, "adaptive:x", cur, "late", time.Minute); err != nil || ok {
		t.Fatalf("swap from an expired value: %v, %v", ok, err)
	}
	// Concurrent creates over the expired row: exactly one wins.
	winners := conformance.ConcurrentSwaps(t, s, "adaptive:x", "", "c", time.Second)
	if v, ok, _ := s.LoadValue(ctx, "adaptive:x"); len(winners) != 1 || !ok || v != winners[0] {
		t.Fatalf("creates over an expired value: winners %v, stored %q", winners, v)
	}
	// A swap renews the TTL.
	clock.Advance(999 * time.Millisecond)
	if ok, err := s.CompareAndSwapValue(ctx, "adaptive:x", winners[0], "renewed", time.Second); err != nil || !ok {
		t.Fatalf("swap before expiry: %v, %v", ok, err)
	}
	clock.Advance(999 * time.Millisecond)
	if v, ok, _ := s.LoadValue(ctx, "adaptive:x"); !ok || v != "renewed" {
		t.Fatalf("after a renewal: %q %v", v, ok)
	}

	// Housekeeping deletes expired values, and only those.
	if ok, err := s.CompareAndSwapValue(ctx, "adaptive:y", "", "long", time.Hour); err != nil || !ok {
		t.Fatalf("create y: %v, %v", ok, err)
	}
	clock.Advance(time.Second)
	if n, err := s.Housekeep(ctx); err != nil || n != 1 {
		t.Fatalf("housekeeping deleted %d, want the one expired value: %v", n, err)
	}
	if v, ok, _ := s.LoadValue(ctx, "adaptive:y"); !ok || v != "long" {
		t.Fatalf("a live value after housekeeping: %q %v", v, ok)
	}
}

// A shared value is a call to the server like a take: a compare-and-swap
// that waits on a row another session holds fails at the store's
// deadline, with no deadline of the caller's, and failures open the
// circuit breaker.
func TestValuesDeadlineAndBreaker(t *testing.T) {
	const timeout = 300 * time.Millisecond
	s := newStoreOpts(t, postgres.Options{Timeout: timeout, BreakerFailures: 2, BreakerBackoff: time.Minute})
	ctx := context.Background()
	key := fmt.Sprintf("adaptive:held-%d", time.Now().UnixNano())
	if ok, err := s.CompareAndSwapValue(ctx, key, "", "v1", time.Hour); err != nil || !ok {
		t.Fatalf("create: %v, %v", ok, err)
	}
	tx, err := pool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	tag, err := tx.Exec(ctx, `SELECT 1 FROM sluice_values WHERE key LIKE ('%'::bytea || $1::bytea) FOR UPDATE`, []byte(key))
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("locking the value's row: %v, %v rows", err, tag.RowsAffected())
	}
	for i := range 2 {
		start := time.Now()
		_, err := s.CompareAndSwapValue(ctx, key, "v1", "v2", time.Hour)
		if d := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || d < timeout/2 {
			t.Fatalf("swap %d on a held row: %v after %v, want the %v deadline", i+1, err, d, timeout)
		}
	}
	if _, _, err := s.LoadValue(ctx, key); !errors.Is(err, postgres.ErrBreakerOpen) {
		t.Fatalf("after 2 failures: %v, want ErrBreakerOpen", err)
	}
}
