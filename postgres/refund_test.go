package postgres_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/postgres"
)

// level reads a bucket's tokens without changing them: a peek of one token
// reports what would be left after it, or, when rejected, what there is.
func level(t *testing.T, s sluice.Store, lim *sluice.Limit, key string) float64 {
	t.Helper()
	d, err := conformance.Take(context.Background(), s, engine.OpPeek, sluice.Request{Limit: lim, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed {
		return d.Tokens + 1
	}
	return d.Tokens
}

// A refund made in a caller's transaction is undone by its rollback and
// kept by its commit, through Take and TakeAll alike; a refund of a key
// with no state inserts no row, in a transaction or not.
func TestRefundRollsBackWithTx(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(1_000_000))
	s := newStoreOpts(t, postgres.Options{Clock: clock})
	ctx := context.Background()
	lim := sluice.MustLimit(sluice.Spec{Name: "refund-tx", TokensPerSecond: 1, Burst: 5})
	if d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k", Cost: 5}); err != nil || !d.Allowed {
		t.Fatalf("take: %+v %v", d, err)
	}

	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st := s.WithTx(tx)
	d, err := conformance.Take(ctx, st, engine.OpRefund, sluice.Request{Limit: lim, Key: "k", Cost: 3})
	if err != nil || !d.Allowed || d.Tokens != 3 {
		t.Fatalf("refund in tx: %+v %v, want allowed with 3 tokens", d, err)
	}
	ds, err := conformance.TakeAll(ctx, st, engine.OpRefund, []sluice.Request{{Limit: lim, Key: "k"}, {Limit: lim, Key: "absent"}}, nil)
	if err != nil || len(ds) != 2 || !ds[0].Allowed || ds[0].Tokens != 4 || !ds[1].Allowed || ds[1].Tokens != 5 {
		t.Fatalf("refund all in tx: %+v %v, want 4 and 5 (full) tokens", ds, err)
	}
	if got := level(t, st, lim, "k"); got != 4 {
		t.Fatalf("inside the transaction the bucket holds %v tokens, want 4", got)
	}
	if got := level(t, s, lim, "k"); got != 0 {
		t.Fatalf("outside the uncommitted transaction the bucket holds %v tokens, want 0", got)
	}
	if n, err := st.Len(ctx); err != nil || n != 1 {
		t.Fatalf("%d rows in the transaction (%v), want 1: a refund of an absent key inserted one", n, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := level(t, s, lim, "k"); got != 0 {
		t.Fatalf("after rollback the bucket holds %v tokens, want 0", got)
	}

	tx, err = s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conformance.Take(ctx, s.WithTx(tx), engine.OpRefund, sluice.Request{Limit: lim, Key: "k", Cost: 2}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := level(t, s, lim, "k"); got != 2 {
		t.Fatalf("after commit the bucket holds %v tokens, want 2", got)
	}
	if _, err := conformance.Take(ctx, s, engine.OpRefund, sluice.Request{Limit: lim, Key: "absent"}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Len(ctx); err != nil || n != 1 {
		t.Fatalf("%d rows (%v), want 1: a refund of an absent key inserted one", n, err)
	}
}

// A refund that fills a bucket keeps full_at in step: housekeeping deletes
// the row at once, and a partial refund's row stays until it has refilled.
func TestRefundHousekeeping(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(7_000_000_000_000))
	s := newStoreOpts(t, postgres.Options{Clock: clock})
	ctx := context.Background()
	start := time.Duration(0)
	lims := []*sluice.Limit{
		sluice.MustLimit(sluice.Spec{Name: "rh-tb", TokensPerSecond: 1, Burst: 4}),
		sluice.MustLimit(sluice.Spec{Name: "rh-fw", Algorithm: sluice.FixedWindow, Rate: 4, Period: time.Second, Start: &start}),
		sluice.MustLimit(sluice.Spec{Name: "rh-sl", Algorithm: sluice.SlidingLog, Rate: 4, Period: time.Second}),
	}
	for _, l := range lims {
		for _, key := range []string{"full", "part"} {
			if _, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: l, Key: key, Cost: 2}); err != nil {
				t.Fatal(err)
			}
		}
	}
	clock.Advance(100 * time.Millisecond)
	for _, l := range lims {
		if d, err := conformance.Take(ctx, s, engine.OpRefund, sluice.Request{Limit: l, Key: "full", Cost: 4}); err != nil || d.ResetAfter != 0 {
			t.Fatalf("%s: refund to full: %+v %v", l.Name(), d, err)
		}
		if d, err := conformance.Take(ctx, s, engine.OpRefund, sluice.Request{Limit: l, Key: "part", Cost: 1}); err != nil || d.ResetAfter == 0 {
			t.Fatalf("%s: partial refund: %+v %v", l.Name(), d, err)
		}
	}
	if n, err := s.Housekeep(ctx); err != nil || n != int64(len(lims)) {
		t.Fatalf("housekeeping deleted %d rows (%v), want the %d refilled ones", n, err, len(lims))
	}
	if n, err := s.Len(ctx); err != nil || n != int64(len(lims)) {
		t.Fatalf("%d rows left (%v), want the %d partly refunded ones", n, err, len(lims))
	}
	clock.Advance(2 * time.Second)
	if n, err := s.Housekeep(ctx); err != nil || n != int64(len(lims)) {
		t.Fatalf("housekeeping deleted %d rows (%v), want %d", n, err, len(lims))
	}
}

// Refunds racing takes on one key lose nothing: every goroutine takes and
// gives back, so the bucket ends where it started.
func TestRefundConcurrent(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(9_000_000_000_000)) // frozen: no refill
	s := newStoreOpts(t, postgres.Options{Clock: clock})
	ctx := context.Background()
	lims := []*sluice.Limit{
		sluice.MustLimit(sluice.Spec{Name: "rc-tb", TokensPerSecond: 1, Burst: 100}),
		sluice.MustLimit(sluice.Spec{Name: "rc-sl", Algorithm: sluice.SlidingLog, Rate: 100, Period: time.Hour}),
	}
	for _, l := range lims {
		if _, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: l, Key: "k", Cost: 50}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				rs := []sluice.Request{{Limit: lims[0], Key: "k"}, {Limit: lims[1], Key: "k"}}
				if ds, err := conformance.TakeAll(ctx, s, engine.OpTake, rs, nil); err != nil || !sluice.Combine(ds).Allowed {
					errs <- fmt.Errorf("take: %+v %v", ds, err)
					return
				}
				for _, r := range rs {
					if _, err := conformance.Take(ctx, s, engine.OpRefund, r); err != nil {
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
	for _, l := range lims {
		if got := level(t, s, l, "k"); got != 50 {
			t.Fatalf("%s: %v tokens after balanced takes and refunds, want 50", l.Name(), got)
		}
	}
}

// Random takes, peeks, refunds and resets, one at a time and in TakeAll,
// answer exactly as the memory store does, for every algorithm, with a
// clock that now and then steps back.
func TestRefundMatchesMemory(t *testing.T) {
	start := 250 * time.Millisecond
	lims := []*sluice.Limit{
		sluice.MustLimit(sluice.Spec{Name: "rm-tb", TokensPerSecond: 3, Burst: 5, MaxReserved: 4}),
		sluice.MustLimit(sluice.Spec{Name: "rm-tb-frac", TokensPerSecond: 0.7, Burst: 3.5}),
		sluice.MustLimit(sluice.Spec{Name: "rm-lb", Algorithm: sluice.LeakyBucket, Rate: 4, Capacity: 2, MaxDelay: time.Second}),
		sluice.MustLimit(sluice.Spec{Name: "rm-fw", Algorithm: sluice.FixedWindow, Rate: 2, Capacity: 5, Period: 700 * time.Millisecond}),
		sluice.MustLimit(sluice.Spec{Name: "rm-fw-start", Algorithm: sluice.FixedWindow, Rate: 3, Period: time.Second, Start: &start}),
		sluice.MustLimit(sluice.Spec{Name: "rm-sl", Algorithm: sluice.SlidingLog, Rate: 4, Period: 800 * time.Millisecond}),
	}
	costs := []float64{0, 0.5, 1, 1.5, 2, 3, 4}
	keys := []string{"a", "b"}
	for _, lim := range lims {
		t.Run(lim.Name(), func(t *testing.T) {
			clock := sluice.NewManualClock(time.UnixMicro(3_000_000_000_000))
			pg := newStore(t, clock)
			mem := memory.New(memory.Options{Clock: clock})
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(1, uint64(len(lim.Name()))))
			req := func() sluice.Request {
				return sluice.Request{Limit: lim, Key: keys[rng.IntN(len(keys))], Cost: costs[rng.IntN(len(costs))], Reserve: lim.Params().RateDen != 0 && rng.IntN(4) == 0}
			}
			for step := 0; step < 400; step++ {
				switch n := rng.IntN(10); {
				case n < 6:
					clock.Advance(time.Duration(rng.IntN(300_000)) * time.Microsecond)
				case n == 6:
					clock.Advance(-time.Duration(rng.IntN(50_000)) * time.Microsecond)
				}
				where := fmt.Sprintf("step %d at %dus", step, clock.Now().UnixMicro())
				if rng.IntN(40) == 0 {
					k := keys[rng.IntN(len(keys))]
					if err := pg.Reset(ctx, lim, k); err != nil {
						t.Fatal(err)
					}
					if err := mem.Reset(ctx, lim, k); err != nil {
						t.Fatal(err)
					}
					continue
				}
				op := []engine.Op{engine.OpTake, engine.OpPeek, engine.OpRefund}[rng.IntN(3)]
				if rng.IntN(4) == 0 {
					rs := []sluice.Request{req(), req(), req()}
					want, werr := conformance.TakeAll(ctx, mem, op, rs, nil)
					got, gerr := conformance.TakeAll(ctx, pg, op, rs, nil)
					if (werr != nil) != (gerr != nil) {
						t.Fatalf("%s: TakeAll op %d %+v: memory err %v, postgres err %v", where, op, rs, werr, gerr)
					}
					for i := range want {
						if got[i] != want[i] {
							t.Fatalf("%s: TakeAll op %d %+v: decision %d\n got  %+v\n want %+v", where, op, rs, i, got[i], want[i])
						}
					}
					continue
				}
				r := req()
				want, werr := conformance.Take(ctx, mem, op, r)
				got, gerr := conformance.Take(ctx, pg, op, r)
				if (werr != nil) != (gerr != nil) {
					t.Fatalf("%s: op %d %+v: memory err %v, postgres err %v", where, op, r, werr, gerr)
				}
				if got != want {
					t.Fatalf("%s: op %d key %s cost %v reserve %v:\n got  %+v\n want %+v", where, op, r.Key, r.Cost, r.Reserve, got, want)
				}
			}
		})
	}
}

// The migration that defines the refund function as it now is can run
// again over itself, and the migrator applies it once. (That is the newest
// migration defining sluice_refund: an older one cannot run over a newer
// one that renamed the function's parameters, which PostgreSQL refuses.)
func TestRefundMigrationRerunnable(t *testing.T) {
	pool(t)
	ctx := pgtestContext(t)
	conn := freshConn(t, ctx)
	if _, err := postgres.Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	ms, err := postgres.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var refund *postgres.Migration
	for i := range ms {
		if strings.Contains(ms[i].SQL, "FUNCTION sluice_refund(") {
			refund = &ms[i]
		}
	}
	if refund == nil {
		t.Fatal("no refund migration")
	}
	if _, err := conn.Exec(ctx, refund.SQL); err != nil {
		t.Fatalf("running %04d_%s again: %v", refund.Version, refund.Name, err)
	}
	if res, err := postgres.Migrate(ctx, conn); err != nil || len(res.Applied) != 0 {
		t.Fatalf("second migrate applied %d: %v", len(res.Applied), err)
	}
}
