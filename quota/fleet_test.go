package quota_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/postgres"
	"github.com/sluicehq/sluice/postgres/pgtest"
	"github.com/sluicehq/sluice/quota"
	"github.com/sluicehq/sluice/redis"
)

// The fleet tests: three processes, each a quota.Store over a client of
// its own, on one real store, hammer one key in steps of a ManualClock
// that the store's scripts and statements read too; over every window,
// what the fleet admitted stays within ExactAdmits + 3 x max slice.

func openRedis(t *testing.T, url string, clock sluice.Clock) func() sluice.Store {
	return func() sluice.Store {
		s, err := redis.Open(url, redis.Options{Clock: clock, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
}

func openPostgres(t *testing.T, url string, clock sluice.Clock) func() sluice.Store {
	return func() sluice.Store {
		s, err := postgres.Open(pgtest.Context(t), url, postgres.Options{Migrate: true, Clock: clock, HousekeepingInterval: -1, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
}

// fleetCase runs the hot-key fleet on a token bucket and a fixed window.
func fleetCase(t *testing.T, open func(clock sluice.Clock) func() sluice.Store, steps, perProc int) {
	t.Run("token_bucket", func(t *testing.T) {
		clock := sluice.NewManualClock(epoch)
		lim := limitTB(t, 20_000, 20_000)
		f := newFleet(t, clock, lim, quota.Settings{}, 3, open(clock))
		f.hammer(ctx, "global", steps, 5*time.Millisecond, perProc, nil)
		for _, d := range []time.Duration{20 * time.Millisecond, 200 * time.Millisecond, time.Second} {
			f.checkBound(d, 0)
		}
		f.checkTotal(0)
		f.close(ctx)
		t.Logf("%d store calls for %d requests", f.storeCalls(), steps*3*perProc)
	})
	t.Run("fixed_window", func(t *testing.T) {
		clock := sluice.NewManualClock(epoch)
		lim := sluice.MustLimit(sluice.Spec{Name: uniqueName(t, "fw"), Algorithm: sluice.FixedWindow, Rate: 2000, Period: 100 * time.Millisecond})
		f := newFleet(t, clock, lim, quota.Settings{MaxShare: 0.01, HotAfter: 1}, 3, open(clock))
		f.hammer(ctx, "global", steps, 7*time.Millisecond, perProc, nil)
		f.checkWindows("global")
		f.checkTotal(0)
		f.checkBound(100*time.Millisecond, 0)
		f.checkBound(time.Second, 0)
		f.close(ctx)
	})
}

func TestFleetRedis(t *testing.T) {
	url := "redis://" + redistest.Server(t)
	fleetCase(t, func(clock sluice.Clock) func() sluice.Store { return openRedis(t, url, clock) }, 300, 60)
}

func TestFleetRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of its own")
	}
	_, addrs := redistest.Primaries(t, 3)
	url := "redis+cluster://" + strings.Join(addrs, ",")
	fleetCase(t, func(clock sluice.Clock) func() sluice.Store { return openRedis(t, url, clock) }, 200, 60)
}

func TestFleetPostgres(t *testing.T) {
	srv := pgtest.ForTest(t)
	url, err := srv.NewDatabase(pgtest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	fleetCase(t, func(clock sluice.Clock) func() sluice.Store { return openPostgres(t, url, clock) }, 100, 40)
}

// A key below hot_after stays exact on Redis: every request is a store
// call, and no slice is taken.
func TestColdKeyStaysExactRedis(t *testing.T) {
	url := "redis://" + redistest.Server(t)
	clock := sluice.NewManualClock(epoch)
	coldCase(t, clock, openRedis(t, url, clock))
}

// TakeAll stays all-or-nothing with a leased member on Redis.
func TestTakeAllAllOrNothingRedis(t *testing.T) {
	url := "redis://" + redistest.Server(t)
	clock := sluice.NewManualClock(epoch)
	takeAllCase(t, clock, openRedis(t, url, clock)())
}

// A process that stops while holding a slice (killed: no Close) takes
// its slice with it: the rest of the fleet admits less, never more.
func TestFleetProcessDroppedHoldingSlice(t *testing.T) {
	url := "redis://" + redistest.Server(t)
	clock := sluice.NewManualClock(epoch)
	lim := limitTB(t, 20_000, 20_000)
	f := newFleet(t, clock, lim, quota.Settings{}, 3, openRedis(t, url, clock))
	live := func(step int) []bool { return []bool{step < 100, true, true} }
	f.hammer(ctx, "global", 300, 5*time.Millisecond, 60, live)
	if held := f.procs[0].Stats()[0].Held; held <= 0 {
		t.Logf("the dropped process held no slice when it stopped (%v)", held)
	}
	for _, d := range []time.Duration{20 * time.Millisecond, 200 * time.Millisecond, time.Second} {
		f.checkBound(d, 0)
	}
	f.checkTotal(0)
	for _, q := range f.procs[1:] {
		if err := q.Close(ctx); err != nil {
			t.Error(err)
		}
	}
}

// Redis restarted empty forgets every count, as in exact mode: over a
// window that spans the restart the fleet may admit one capacity more
// than the exact limit, plus the slices held (the bound's N x max
// slice): ExactAdmits + capacity + N x max slice.
func TestFleetRedisRestartedEmpty(t *testing.T) {
	proc := redistest.New(t)
	url := "redis://" + proc.Addr()
	clock := sluice.NewManualClock(epoch)
	lim := limitTB(t, 20_000, 20_000)
	f := newFleet(t, clock, lim, quota.Settings{}, 3, openRedis(t, url, clock))
	f.faults = true
	f.hammer(ctx, "global", 100, 5*time.Millisecond, 60, nil)
	proc.Stop()
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	f.hammer(ctx, "global", 200, 5*time.Millisecond, 60, nil)
	for _, d := range []time.Duration{20 * time.Millisecond, 200 * time.Millisecond, time.Second} {
		f.checkBound(d, lim.Capacity())
	}
	f.checkTotal(lim.Capacity())
	t.Logf("%d requests failed while Redis restarted", f.errors.Load())
	f.close(ctx)
}

// A client that hangs up as a key's slice ends makes the process drop
// the slice's leftovers: the give-back is sent under the hung-up
// request's context, which the store refuses to send, so the tokens are
// admitted by no one (every client of a global key loses them), at will
// and once per term, without the attacker being charged a token.
func TestAttackHungUpRequestDropsSliceLeftovers(t *testing.T) {
	url := "redis://" + redistest.Server(t)
	clock := sluice.NewManualClock(epoch)
	store := openRedis(t, url, clock)()
	lim := limitTB(t, 0.001, 1000)
	q := quota.New(store, quota.Options{Clock: clock})
	if err := q.Configure(map[*sluice.Limit]quota.Settings{lim: {MaxSlice: 50, HotAfter: 1, Term: time.Second}}); err != nil {
		t.Fatal(err)
	}
	for range 8 {
		if d, err := conformance.Take(ctx, q, engine.OpTake, sluice.Request{Limit: lim, Key: "g"}); err != nil || !d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
	}
	held := q.Stats()[0].Held
	if held <= 0 {
		t.Fatal("no slice held: the test shows nothing")
	}
	clock.Advance(1100 * time.Millisecond) // the slice's term is over
	gone, cancel := context.WithCancel(ctx)
	cancel() // the client hung up
	used := 8.0
	if hung, _ := conformance.Take(gone, q, engine.OpTake, sluice.Request{Limit: lim, Key: "g"}); hung.Allowed {
		used++ // the slice it took for itself reached the process
	}
	d, err := conformance.Take(ctx, store, engine.OpPeek, sluice.Request{Limit: lim, Key: "g"})
	if err != nil {
		t.Fatal(err)
	}
	// What was used is gone; the rest of the slice belongs to the store
	// or to the process. (A peek answers the tokens a take of one would
	// leave.)
	if have := d.Tokens + 1 + q.Stats()[0].Held; have < 1000-used-0.01 {
		t.Errorf("after a hung-up request the store and the process hold %v tokens, want %v: the %v tokens left in the slice were dropped (dropped slices: %d)", have, 1000-used, held, q.Stats()[0].Dropped)
	}
}
