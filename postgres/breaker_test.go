package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/postgres"
)

// A server that does not answer (here: another session holds the bucket's
// row lock, so every take waits) costs each call its deadline until the
// breaker opens; then calls fail at once, and the first call after the
// backoff that the server answers closes it again.
func TestBreaker(t *testing.T) {
	// Three failures at 400 ms each take longer than a second: the
	// breaker must count them over a window that one caller's deadlines
	// fit in, or a hung server would never open it for a lone caller.
	const timeout = 400 * time.Millisecond
	s := newStoreOpts(t, postgres.Options{Timeout: timeout, BreakerFailures: 3, BreakerBackoff: 200 * time.Millisecond})
	ctx := context.Background()
	// A name of its own, so that the LIKE below finds this test's row only.
	lim := sluice.MustLimit(sluice.Spec{Name: fmt.Sprintf("breaker-%d", time.Now().UnixNano()), TokensPerSecond: 1e6, Burst: 1e6})
	take := func() (time.Duration, error) {
		start := time.Now()
		_, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"})
		return time.Since(start), err
	}
	if _, err := take(); err != nil {
		t.Fatal(err)
	}

	tx, err := pool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	tag, err := tx.Exec(ctx, `SELECT 1 FROM sluice_buckets WHERE key LIKE ('%'::bytea || $1::bytea) FOR UPDATE`, []byte(lim.StorageKey("k")))
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("locking the bucket's row: %v, %v rows", err, tag.RowsAffected())
	}
	for i := range 3 {
		d, err := take()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("take %d against a locked row: %v", i+1, err)
		}
		// At least most of the deadline (lower bounds hold at any speed);
		// at most the deadline and a slack no wait for a CPU reaches: a
		// take that ignored its deadline would wait on the row for ever.
		if d < timeout/2 || d > timeout+5*time.Second {
			t.Fatalf("take %d took %v, deadline %v", i+1, d, timeout)
		}
	}
	// The row is still locked: a take that reached it would end in
	// DeadlineExceeded. ErrBreakerOpen shows the breaker refused it
	// without a query, however long a loaded machine took to say so.
	if _, err := take(); !errors.Is(err, postgres.ErrBreakerOpen) {
		t.Fatalf("after 3 failures: %v, want ErrBreakerOpen at once", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, err := take(); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("no recovery after the lock was released: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // waiting for the backoff, not for tokens
	}
	// A store bound to a caller's transaction has no breaker: the
	// transaction decides.
	tx2, err := pool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback(ctx)
	if _, err := conformance.Take(ctx, s.WithTx(tx2), engine.OpTake, sluice.Request{Limit: lim, Key: "k"}); err != nil {
		t.Fatal(err)
	}
}
