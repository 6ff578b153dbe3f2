package sluice_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/memory"
)

// callCounter counts the calls that reach the store it wraps.
type callCounter struct {
	sluice.Store
	calls atomic.Int64
}

func (c *callCounter) Take(ctx context.Context, op engine.Op, r sluice.Charged) (sluice.Decision, error) {
	c.calls.Add(1)
	return c.Store.Take(ctx, op, r)
}

func (c *callCounter) TakeAll(ctx context.Context, op engine.Op, rs []sluice.Charged, dst []sluice.Decision) ([]sluice.Decision, error) {
	c.calls.Add(1)
	return c.Store.TakeAll(ctx, op, rs, dst)
}

// The Limiter judges every request before its store is asked: a request
// that Request.Charged refuses is the Limiter's error, with the words a
// batch's error always had, and no store call is made.
func TestLimiterRefusesBeforeTheStore(t *testing.T) {
	ctx := context.Background()
	st := &callCounter{Store: memory.New(memory.Options{})}
	l := sluice.New(st)
	lim := sluice.MustLimit(sluice.Spec{Name: "c", TokensPerSecond: 1, Burst: 5})
	sharded := sluice.MustLimit(sluice.Spec{Name: "s", TokensPerSecond: 4, Burst: 8, Shards: 4})
	ok := sluice.Request{Limit: lim, Key: "k"}
	for _, c := range []struct {
		name string
		call func() error
		is   error
		says string
	}{
		{"take", func() error { _, err := l.Take(ctx, sluice.Request{Limit: lim, Key: "k", Cost: -1}); return err }, sluice.ErrInvalidCost, ""},
		{"peek", func() error { _, err := l.Peek(ctx, sluice.Request{Limit: lim, Key: "k", Cost: 6}); return err }, sluice.ErrCostExceedsLimit, ""},
		{"refund", func() error { _, err := l.Refund(ctx, sluice.Request{Limit: lim, Key: "k", Cost: -1}); return err }, sluice.ErrInvalidCost, ""},
		{"take all", func() error {
			_, _, err := l.TakeAll(ctx, ok, sluice.Request{Limit: lim, Key: "k", Cost: 6})
			return err
		}, sluice.ErrCostExceedsLimit, "take 2 of 2: "},
		{"sharded", func() error {
			_, _, err := l.TakeAll(ctx, sluice.Request{Limit: sharded, Key: "k"}, sluice.Request{Limit: lim, Key: "k", Cost: 6})
			return err
		}, sluice.ErrCostExceedsLimit, "take 2 of 2: "},
		{"refund all", func() error {
			_, err := l.RefundAll(ctx, ok, sluice.Request{Key: "k"})
			return err
		}, sluice.ErrInvalidLimit, "take 2 of 2: "},
		{"charged without a limit", func() error {
			_, err := l.AppendAll(ctx, engine.OpTake, nil, sluice.Charged{Key: "k"})
			return err
		}, sluice.ErrInvalidLimit, "take 1 of 1: "},
	} {
		err := c.call()
		if !errors.Is(err, c.is) || !sluice.IsInputError(err) || !strings.HasPrefix(err.Error(), c.says) {
			t.Errorf("%s: %v, want %v (an input error) saying %q", c.name, err, c.is, c.says)
		}
	}
	if n := st.calls.Load(); n != 0 {
		t.Fatalf("%d calls reached the store, want none", n)
	}
}

// A charged request is the request's limit and key with its cost in
// micro-tokens.
func TestChargedIsTheRequestInIntegers(t *testing.T) {
	lim := sluice.MustLimit(sluice.Spec{Name: "c", TokensPerSecond: 1, Burst: 5})
	for _, r := range []sluice.Request{{Limit: lim, Key: "k"}, {Limit: lim, Key: "k", Cost: 0.5}, {Limit: lim, Key: "k", Cost: 2, Reserve: true, MaxReserved: 3}} {
		c, err := r.Charged(engine.OpTake)
		if err != nil {
			t.Fatal(err)
		}
		cost := r.Cost
		if cost == 0 {
			cost = 1
		}
		want := engine.Charge{Cost: int64(cost * engine.TokenScale), Reserve: r.Reserve}
		if r.MaxReserved != 0 {
			want.MaxReserved = int64(r.MaxReserved * engine.TokenScale)
		} else {
			want.MaxReserved = lim.Params().MaxReserved
		}
		if c.Limit != lim || c.Key != "k" || c.Charge != want {
			t.Errorf("%+v charged as %+v, want %+v", r, c, want)
		}
	}
}

// AppendAll decides requests charged by the caller as TakeAll and
// PeekAll decide them, sharded limits included.
func TestAppendAllIsTakeAll(t *testing.T) {
	ctx := context.Background()
	clk := sluice.NewManualClock(time.UnixMicro(1e12))
	newLimiter := func() *sluice.Limiter {
		return sluice.NewWithOptions(memory.New(memory.Options{Clock: clk}), sluice.Options{Clock: clk}).WithShardSeed(3)
	}
	a, b := newLimiter(), newLimiter()
	plain := sluice.MustLimit(sluice.Spec{Name: "p", TokensPerSecond: 2, Burst: 3})
	sharded := sluice.MustLimit(sluice.Spec{Name: "s", TokensPerSecond: 4, Burst: 8, Shards: 4})
	rs := []sluice.Request{{Limit: plain, Key: "k"}, {Limit: sharded, Key: "k", Cost: 1.5}}
	for i := range 12 {
		for _, op := range []engine.Op{engine.OpPeek, engine.OpTake} {
			all := a.TakeAll
			if op == engine.OpPeek {
				all = a.PeekAll
			}
			_, want, werr := all(ctx, rs...)
			cs := make([]sluice.Charged, len(rs))
			for k, r := range rs {
				var err error
				if cs[k], err = r.Charged(engine.OpTake); err != nil {
					t.Fatal(err)
				}
			}
			got, gerr := b.AppendAll(ctx, op, nil, cs...)
			if werr != nil || gerr != nil {
				t.Fatalf("step %d %v: errors %v, %v", i, op, werr, gerr)
			}
			for k := range want {
				if got[k] != want[k] {
					t.Fatalf("step %d %v: decision %d = %+v, want %+v", i, op, k, got[k], want[k])
				}
			}
		}
		clk.Advance(300 * time.Millisecond)
	}
}

// TestAttackTinyCostsGrowSlidingLog: a sliding log keeps an entry per
// admitted take, its state O(capacity) only while each take costs a
// token. A caller of /v1/take (or of a rule whose min_cost lets costs be
// fractional) taking a micro-token at a time grew one key's log to a
// million entries per token of capacity, every take reading them all (in
// Redis, one value rewritten whole per call).
func TestAttackTinyCostsGrowSlidingLog(t *testing.T) {
	sl := sluice.MustLimit(sluice.Spec{Name: "sl", Algorithm: sluice.SlidingLog, Rate: 10, Period: time.Hour})
	lim := sluice.New(memory.New(memory.Options{Clock: sluice.NewManualClock(time.Unix(1e9, 0))}))
	admitted := 0
	for range 1000 {
		d, err := lim.Take(context.Background(), sluice.Request{Limit: sl, Key: "k", Cost: 0.000001})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted > 10 {
		t.Fatalf("%d takes of a micro-token admitted, each an entry of the log: want at most the capacity, 10", admitted)
	}
	// A log whose capacity is below a token still takes one take.
	half := sluice.MustLimit(sluice.Spec{Name: "half", Algorithm: sluice.SlidingLog, Rate: 0.5, Period: time.Hour})
	if d, err := lim.Take(context.Background(), sluice.Request{Limit: half, Key: "k", Cost: 0.000001}); err != nil || !d.Allowed {
		t.Fatalf("a micro-token of a half-token log: %+v %v", d, err)
	}
}
