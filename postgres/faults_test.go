package postgres_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/postgres"
	"github.com/sluicehq/sluice/postgres/pgtest"
)

// countingObserver is a postgres.Observer that keeps what it is told.
type countingObserver struct {
	errors, opens atomic.Int64
	state         atomic.Int32
}

func (o *countingObserver) StoreError() { o.errors.Add(1) }
func (o *countingObserver) BreakerChanged(state int32, opened bool) {
	o.state.Store(state)
	if opened {
		o.opens.Add(1)
	}
}

// A row that another session holds locked (a long transaction, a
// SELECT ... FOR UPDATE left open) fails a take at lock_timeout, which
// Open sets to a quarter of the call's deadline, with lock_not_available:
// the take does not wait out its deadline, and the failure counts toward
// the breaker, which opens after BreakerFailures of them and then answers
// at once. Before, every take on that key cost the whole deadline and a
// server error counted as a success for the breaker.
func TestAttackLockedRowFailsAtLockTimeout(t *testing.T) {
	pgtest.Require(t, server)
	ctx := pgtest.Context(t)
	url, err := server.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const timeout = 4 * time.Second
	obs := &countingObserver{}
	s, err := postgres.Open(ctx, url, postgres.Options{Migrate: true, HousekeepingInterval: -1, Timeout: timeout,
		BreakerFailures: 3, BreakerBackoff: time.Hour, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var setting string
	if err := s.Pool().QueryRow(ctx, "SHOW lock_timeout").Scan(&setting); err != nil || setting != "1s" {
		t.Fatalf("lock_timeout on the store's connections: %q, %v; want 1s (a quarter of %v)", setting, err, timeout)
	}

	lim := sluice.MustLimit(sluice.Spec{Name: "locked", Rate: 1, Period: time.Hour, Capacity: 100})
	take := func() (time.Duration, error) {
		start := time.Now()
		_, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"})
		return time.Since(start), err
	}
	if _, err := take(); err != nil {
		t.Fatal(err)
	}
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	tag, err := tx.Exec(ctx, `SELECT 1 FROM sluice_buckets FOR UPDATE`)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("locking the bucket's row: %v, %v rows", err, tag.RowsAffected())
	}
	for i := range 3 {
		d, err := take()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55P03" || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("take %d against a locked row: %v; want lock_not_available (55P03), not the deadline", i+1, err)
		}
		// Implied by the code (past the deadline the call is cancelled
		// and fails with DeadlineExceeded), asserted for the record.
		if d >= timeout {
			t.Fatalf("take %d took %v, deadline %v", i+1, d, timeout)
		}
	}
	if _, err := take(); !errors.Is(err, postgres.ErrBreakerOpen) {
		t.Fatalf("after 3 lock waits past lock_timeout: %v, want ErrBreakerOpen", err)
	}
	if opens, state, errs := obs.opens.Load(), obs.state.Load(), obs.errors.Load(); opens != 1 || state != 1 || errs != 4 {
		t.Fatalf("observer: %d openings, state %d, %d errors; want 1, 1 (open), 4 (3 lock waits and the refusal)", opens, state, errs)
	}
	// A take that failed on the lock was cancelled by the server with its
	// statement: it charged nothing, unlike a timed-out take on Redis.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	peeker, err := postgres.New(ctx, s.Pool(), postgres.Options{HousekeepingInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer peeker.Close()
	d, err := conformance.Take(ctx, peeker, engine.OpPeek, sluice.Request{Limit: lim, Key: "k"})
	// One token taken before the lock; the peek reports what would remain
	// after its own cost of 1.
	if err != nil || d.Remaining != 98 {
		t.Fatalf("after the failed takes: %+v, %v; want 98 remaining (only the first take charged)", d, err)
	}
}

// Attack: a client over its own limit sends its requests while a shared
// limit's row is held (a flood of everyone's requests on one global
// limit holds it in turn). Its TakeAll answered the own limit's
// rejection, then failed on the shared row at lock_timeout, and the
// error, not the rejection, reached on_store_error, whose default
// admits: over its limit, the client was served whenever the shared row
// was contended. A take already rejected now stays rejected, charging
// nothing.
func TestAttackLockedSharedRowAdmitsRejected(t *testing.T) {
	pgtest.Require(t, server)
	ctx := pgtest.Context(t)
	url, err := server.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, err := postgres.Open(ctx, url, postgres.Options{Migrate: true, HousekeepingInterval: -1, Timeout: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The client's own limit sorts before the shared one, so the batch
	// asks it first.
	own := sluice.MustLimit(sluice.Spec{Name: "a-own", Rate: 1, Period: time.Hour, Capacity: 1})
	shared := sluice.MustLimit(sluice.Spec{Name: "z-shared", Rate: 1000, Period: time.Hour, Capacity: 1000})
	for _, r := range []sluice.Request{{Limit: own, Key: "mallory"}, {Limit: shared, Key: "all"}} {
		if d, err := conformance.Take(ctx, s, engine.OpTake, r); err != nil || !d.Allowed {
			t.Fatalf("%s: %+v, %v", r.Limit.Name(), d, err)
		}
	}
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if tag, err := tx.Exec(ctx, `SELECT 1 FROM sluice_buckets WHERE position('z-shared'::bytea in key) > 0 FOR UPDATE`); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("locking the shared row: %v, %v rows", err, tag.RowsAffected())
	}
	ds, err := conformance.TakeAll(ctx, s, engine.OpTake, []sluice.Request{{Limit: shared, Key: "all"}, {Limit: own, Key: "mallory"}}, nil)
	if err != nil {
		t.Fatalf("a take its own limit rejected failed instead (on_store_error: allow admits it): %v", err)
	}
	if ds[0].Allowed || ds[1].Allowed {
		t.Fatalf("admitted: %+v", ds)
	}
	if c := sluice.Combine(ds); c.Rule != "a-own" || c.RetryAfter <= 0 {
		t.Fatalf("the combined decision %+v, want a-own's rejection with its wait", c)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	d, err := conformance.Take(ctx, s, engine.OpPeek, sluice.Request{Limit: shared, Key: "all"})
	if err != nil || d.Remaining != 998 {
		t.Fatalf("the shared limit after the rejected take: %+v, %v; want 998 remaining (one take before, nothing charged by it)", d, err)
	}
}

// A server that stops (fast shutdown: its sessions end with
// admin_shutdown, new connections are refused) opens the breaker, and
// the observer, which serve exports as sluice_postgres_breaker_state and
// sluice_postgres_breaker_opens_total, is told.
func TestStoppedServerOpensBreaker(t *testing.T) {
	srv := pgtest.ForTest(t)
	ctx := pgtest.Context(t)
	url, err := srv.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	obs := &countingObserver{}
	s, err := postgres.Open(ctx, url, postgres.Options{Migrate: true, HousekeepingInterval: -1, Timeout: 2 * time.Second,
		BreakerFailures: 3, BreakerBackoff: time.Hour, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	lim := sluice.MustLimit(sluice.Spec{Name: "stopped", TokensPerSecond: 1e6, Burst: 1e6})
	req := sluice.Request{Limit: lim, Key: "k"}
	if _, err := conformance.Take(ctx, s, engine.OpTake, req); err != nil {
		t.Fatal(err)
	}
	if err := srv.Halt(); err != nil {
		t.Skip(err)
	}
	// Three failures against one success open it; the bound leaves room
	// for a window that forgot the success on a slow machine.
	var failed int
	for failed = 1; failed <= 10; failed++ {
		_, err := conformance.Take(ctx, s, engine.OpTake, req)
		if errors.Is(err, postgres.ErrBreakerOpen) {
			break
		}
		if err == nil {
			t.Fatalf("take %d on a stopped server succeeded", failed)
		}
	}
	if failed > 10 {
		t.Fatal("10 failed takes on a stopped server did not open the breaker")
	}
	if opens, state, errs := obs.opens.Load(), obs.state.Load(), obs.errors.Load(); opens != 1 || state != 1 || errs != int64(failed) {
		t.Fatalf("observer: %d openings, state %d, %d errors; want 1, 1 (open), %d", opens, state, errs, failed)
	}
}
