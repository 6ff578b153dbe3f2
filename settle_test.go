package sluice_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
)

func TestSettlePureArithmetic(t *testing.T) {
	conformance.RunSettle(t, newMapStore, conformance.SettleOptions{Goroutines: 4})
}

// Settle refuses what is no cost, and a request without a limit, before
// any store call.
func TestSettleRefusesBadInput(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(0))
	l := sluice.New(newMapStore(t, clock))
	lim := sluice.MustLimit(sluice.Spec{Name: "s", TokensPerSecond: 1, Burst: 10})
	r := sluice.Request{Limit: lim, Key: "k"}
	for _, c := range []struct{ charged, actual float64 }{
		{0, 1}, {-1, 1}, {math.NaN(), 1}, {math.Inf(1), 1},
		{1, -1}, {1, math.NaN()}, {1, math.Inf(1)}, {1, math.Inf(-1)},
	} {
		if _, err := l.Settle(context.Background(), r, c.charged, c.actual); !errors.Is(err, sluice.ErrInvalidCost) {
			t.Errorf("settle %v as %v: %v, want ErrInvalidCost", c.charged, c.actual, err)
		}
	}
	if _, err := l.Settle(context.Background(), sluice.Request{Key: "k"}, 1, 1); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("settle without a limit: %v, want ErrInvalidLimit", err)
	}
	if got := conformance.Level(t, l, lim, "k"); got != 10 {
		t.Fatalf("refused settlements changed the bucket: %v tokens, want 10", got)
	}
}

// The debt bound of an extra charge is what every store counts exactly,
// whatever max_reserved says (it bounds reservations, not what was used),
// up to two billion tokens; none on a sliding log.
func TestSettleDebt(t *testing.T) {
	for _, c := range []struct {
		spec sluice.Spec
		want float64
	}{
		{sluice.Spec{Name: "tb", TokensPerSecond: 1, Burst: 10}, 1 << 51 / 1e6},
		{sluice.Spec{Name: "tb-mr", TokensPerSecond: 1, Burst: 10, MaxReserved: 3}, 1 << 51 / 1e6},
		{sluice.Spec{Name: "tb-den", Rate: 7, Period: time.Hour, Capacity: 10}, ((1<<52-1)/3600 - 10e6) / 1e6},
		{sluice.Spec{Name: "fw", Algorithm: sluice.FixedWindow, Rate: 5, Period: time.Minute}, 375299955},
		{sluice.Spec{Name: "sl", Algorithm: sluice.SlidingLog, Rate: 5, Period: time.Minute}, 0},
		{sluice.Spec{Name: "lb", Algorithm: sluice.LeakyBucket, Rate: 10, MaxDelay: 2 * time.Second}, 1 << 51 / 1e6},
	} {
		if got := sluice.MustLimit(c.spec).SettleDebt(); got != c.want {
			t.Errorf("%s: SettleDebt %v, want %v", c.spec.Name, got, c.want)
		}
	}
}

// A sharded limit settles through the Limiter, which places the refund
// and the extra charge on its shards as it places any: an extra charge is
// charged whole, and a refund goes to two shards picked at random, each
// up to full, as every refund of a sharded limit does, so a refund that
// finds them full is dropped. The shards never hold more than the actual
// costs leave.
func TestSettleSharded(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(1_000_000_000_000))
	l := sluice.NewWithOptions(newMapStore(t, clock), sluice.Options{Clock: clock}).WithShardSeed(7)
	lim := sluice.MustLimit(sluice.Spec{Name: "sharded", Rate: 1, Period: time.Hour, Capacity: 800, Shards: 4})
	ctx := context.Background()
	exact, refunded := 800.0, 0.0
	for i, c := range []struct{ est, actual float64 }{{100, 40}, {100, 100}, {50, 180}, {200, 0}, {10, 150}} {
		req := sluice.Request{Limit: lim, Key: "k", Cost: c.est}
		if d, err := l.Take(ctx, req); err != nil || !d.Allowed {
			t.Fatalf("take %d: %+v %v", i, d, err)
		}
		s, err := l.Settle(ctx, req, c.est, c.actual)
		if err != nil || s.Forgiven != 0 || s.Extra != max(0, c.actual-c.est) || s.Refunded != max(0, c.est-c.actual) {
			t.Fatalf("settle %d: %+v %v", i, s, err)
		}
		exact -= c.actual
		refunded += s.Refunded
		if got := conformance.Level(t, l, lim, "k"); got > exact || got < exact-refunded {
			t.Fatalf("after settlement %d the shards hold %v, want at most %v and at least %v", i, got, exact, exact-refunded)
		}
	}
}

// At the edge of what the stores count, a limit of a billion tokens at a
// rate with a denominator, reserving without bound, settles a huge actual
// cost without an error: charged up to the bound, the rest forgiven.
func TestSettleHugeLimit(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(1_000_000_000_000))
	l := sluice.NewWithOptions(newMapStore(t, clock), sluice.Options{Clock: clock})
	lim := sluice.MustLimit(sluice.Spec{Name: "huge", TokensPerSecond: 0.7, Burst: 1e9, Reserve: true})
	req := sluice.Request{Limit: lim, Key: "k", Cost: 1}
	if _, err := l.Take(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	s, err := l.Settle(context.Background(), req, 1, 5e9)
	if err != nil {
		t.Fatalf("settle: %v", err)
	}
	if s.Extra+s.Forgiven != 5e9-1 || s.Extra <= 0 || s.Decision.Tokens > -lim.SettleDebt()+1 {
		t.Fatalf("settle: %+v (debt bound %v)", s, lim.SettleDebt())
	}
}
