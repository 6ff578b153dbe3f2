package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// limiterStore presents a Limiter as a requester, so that the streams of
// runStream go through the Limiter, which expands sharded limits.
type limiterStore struct{ l *sluice.Limiter }

func (s limiterStore) Take(ctx context.Context, op engine.Op, r sluice.Request) (sluice.Decision, error) {
	switch op {
	case engine.OpPeek:
		return s.l.Peek(ctx, r)
	case engine.OpRefund:
		return s.l.Refund(ctx, r)
	}
	return s.l.Take(ctx, r)
}

func (s limiterStore) TakeAll(ctx context.Context, op engine.Op, rs []sluice.Request) ([]sluice.Decision, error) {
	var ds []sluice.Decision
	var err error
	switch op {
	case engine.OpPeek:
		_, ds, err = s.l.PeekAll(ctx, rs...)
	case engine.OpRefund:
		ds, err = s.l.RefundAll(ctx, rs...)
	default:
		_, ds, err = s.l.TakeAll(ctx, rs...)
	}
	return ds, err
}

// shardGoroutines are the concurrency levels of the sharded streams,
// whatever the store's options: many callers on few shards is where
// sharding is racy.
var shardGoroutines = []int{1, 8, 64}

// shardRounds is the clock steps of a sharded stream of g goroutines:
// fewer than the unsharded streams', as each request is two or three
// store calls, and fewer still with many goroutines, each step of which
// is already some hundred requests.
func shardRounds(opts InvariantOptions, g int) int {
	if g >= 64 {
		return max(15, opts.Rounds/4)
	}
	return max(20, opts.Rounds/2)
}

// runShardInvariants checks that a sharded limit keeps the bound of the
// unsharded one over every interval, with 1 to 64 goroutines, alone and
// inside TakeAll beside unsharded limits, and that a rejected TakeAll
// charges no shard; then that sharded decisions are exact (runShardExact).
func runShardInvariants(t *testing.T, newStore NewStore, opts InvariantOptions) {
	start := time.Duration(0)
	specs := []sluice.Spec{
		{Name: "inv-tb-sh", TokensPerSecond: 50, Burst: 20, MaxReserved: 6, Shards: 4},
		{Name: "inv-tb-sh-odd", Rate: 7, Period: 3 * time.Second, Capacity: 9, Shards: 3},
		{Name: "inv-fw-sh", Algorithm: sluice.FixedWindow, Rate: 30, Period: 500 * time.Millisecond, Capacity: 45, Start: &start, Shards: 5},
		{Name: "inv-sl-sh", Algorithm: sluice.SlidingLog, Rate: 24, Period: 400 * time.Millisecond, Shards: 8},
	}
	for _, spec := range specs {
		for _, g := range shardGoroutines {
			t.Run(fmt.Sprintf("%s/g%d", spec.Name, g), func(t *testing.T) {
				lim := sluice.MustLimit(spec)
				rng := rand.New(rand.NewPCG(opts.Seed, 500+uint64(g)))
				clock := sluice.NewManualClock(time.UnixMicro(4_000_000_000_000))
				ls := limiterStore{sluice.New(newStore(t, clock))}
				rounds := runStream(t, ls, clock, rng, shardRounds(opts, g), g, func(r *rand.Rand) []sluice.Request {
					return []sluice.Request{shardedRequest(r, lim, "k")}
				})
				checkBound(t, lim, rounds[0])
			})
		}
	}
	t.Run("takeall", func(t *testing.T) {
		for _, g := range []int{1, 16} {
			t.Run(fmt.Sprintf("g%d", g), func(t *testing.T) { runShardTakeAll(t, newStore, opts, g) })
		}
	})
	t.Run("takeall-rejected-charges-nothing", func(t *testing.T) { runShardRejectedTakeAll(t, newStore, opts) })
	t.Run("exact", func(t *testing.T) { runShardExact(t, newStore) })
}

// shardedRequest is a random request that a sharded limit may serve from
// one shard, from two, or on credit.
func shardedRequest(r *rand.Rand, lim *sluice.Limit, key string) sluice.Request {
	costs := []float64{0.5, 1, 1, 1, 2, 3, lim.MaxCost()}
	req := sluice.Request{Limit: lim, Key: key, Cost: min(costs[r.IntN(len(costs))], lim.MaxCost())}
	if lim.Algorithm() == sluice.TokenBucket && r.IntN(4) == 0 {
		req.Reserve = true
	}
	return req
}

// runShardTakeAll charges a sharded global limit, an unsharded per-user
// one and a sharded fixed window together and checks each one's bound.
func runShardTakeAll(t *testing.T, newStore NewStore, opts InvariantOptions, g int) {
	start := time.Duration(0)
	global := sluice.MustLimit(sluice.Spec{Name: "shall-global", TokensPerSecond: 40, Burst: 16, Shards: 4})
	user := sluice.MustLimit(sluice.Spec{Name: "shall-user", TokensPerSecond: 20, Burst: 10})
	window := sluice.MustLimit(sluice.Spec{Name: "shall-window", Algorithm: sluice.FixedWindow, Rate: 24, Period: 250 * time.Millisecond, Start: &start, Shards: 3})
	rng := rand.New(rand.NewPCG(opts.Seed, 1500+uint64(g)))
	clock := sluice.NewManualClock(time.UnixMicro(5_000_000_000_000))
	ls := limiterStore{sluice.New(newStore(t, clock))}
	rounds := runStream(t, ls, clock, rng, shardRounds(opts, g), g, func(r *rand.Rand) []sluice.Request {
		cost := []float64{1, 1, 2, 5}[r.IntN(4)]
		return []sluice.Request{
			{Limit: global, Key: "*", Cost: cost},
			{Limit: user, Key: "u1", Cost: min(cost, 2)},
			{Limit: window, Key: "/search", Cost: cost},
		}
	})
	checkBound(t, global, rounds[0])
	checkBound(t, user, rounds[1])
	checkBound(t, window, rounds[2])
}

// runShardRejectedTakeAll checks, step by step, that a rejected TakeAll
// with sharded limits leaves every shard as it was: a peek of a sharded
// limit sums all its shards.
func runShardRejectedTakeAll(t *testing.T, newStore NewStore, opts InvariantOptions) {
	a := sluice.MustLimit(sluice.Spec{Name: "shrej-a", TokensPerSecond: 10, Burst: 12, Shards: 3})
	b := sluice.MustLimit(sluice.Spec{Name: "shrej-b", TokensPerSecond: 2, Burst: 3})
	c := sluice.MustLimit(sluice.Spec{Name: "shrej-c", Algorithm: sluice.SlidingLog, Rate: 8, Period: time.Second, Shards: 2})
	rng := rand.New(rand.NewPCG(opts.Seed, 17))
	clock := sluice.NewManualClock(time.UnixMicro(6_000_000_000_000))
	ls := limiterStore{sluice.New(newStore(t, clock))}
	checkRejectedTakeAll(t, ls, clock, rng, opts.Rounds*2, func(r *rand.Rand) []sluice.Request {
		return []sluice.Request{
			{Limit: a, Key: "x", Cost: float64(1 + r.IntN(8))},
			{Limit: b, Key: "x", Cost: float64(1 + r.IntN(3))},
			{Limit: c, Key: "x", Cost: float64(1 + r.IntN(3))},
		}
	})
}

// shardStep is one request of an exact sharded scenario and its answer.
// With two shards every take reads both, so the answers do not depend on
// which shard is drawn first.
type shardStep struct {
	advance time.Duration
	op      string // "take" (default), "peek", "reset"
	cost    float64
	reserve bool
	want    *Want
	err     error
}

func want(allowed bool, tokens float64, retry, reset time.Duration) *Want {
	w := &Want{Allowed: allowed, Tokens: int64(tokens * engine.TokenScale), RetryAfterUs: retry.Microseconds(), ResetAfterUs: reset.Microseconds()}
	if tokens > 0 {
		w.Remaining = int64(tokens)
	}
	return w
}

// runShardExact checks sharded decisions exactly on the store: the
// fuller shard charged alone, a cost split over two shards so that both
// are left even, a rejection told the wait until two shards together
// hold the cost, a reservation from one shard, a peek that sums every
// shard, Reset of every shard, fixed windows in the unsharded key's
// windows, and the largest cost two shards can take.
func runShardExact(t *testing.T, newStore NewStore) {
	for _, c := range shardExactCases() {
		t.Run(c.name, func(t *testing.T) { runShardExactCase(t, newStore, c) })
	}
	t.Run("takeall-all-or-nothing", func(t *testing.T) { runShardTakeAllAllOrNothing(t, newStore) })
}

// shardExactCase is one sharded limit driven through steps with exact
// expected decisions.
type shardExactCase struct {
	name  string
	spec  sluice.Spec
	key   string
	steps []shardStep
}

// shardExactCases are runShardExact's limits, each with its steps.
func shardExactCases() []shardExactCase {
	const s = time.Second
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	offset := func(key string, period time.Duration) time.Duration {
		return engine.Duration(engine.WindowOffset(key, period.Microseconds()))
	}
	zero := time.Duration(0)
	return []shardExactCase{{
		// Two shards of 5 tokens refilling 1/s each.
		name: "token-bucket", key: "k",
		spec: sluice.Spec{TokensPerSecond: 2, Burst: 10, Shards: 2},
		steps: []shardStep{
			{cost: 3, want: want(true, 7, 0, 3*s)},             // the fuller alone: 2 and 5 left
			{cost: 6, want: want(true, 1, 0, ms(4500))},        // split 4.5 + 1.5: both left 0.5
			{cost: 2, want: want(false, 1, ms(500), ms(4500))}, // together 1 < 2: both short by 0.5
			{advance: ms(500), cost: 2, want: want(true, 0, 0, 5*s)},
			{op: "peek", cost: 1, want: want(false, 0, ms(500), 5*s)},
			{cost: 10.5, err: sluice.ErrCostExceedsLimit}, // above 2 x 10/2
			{op: "reset"},
			{op: "peek", cost: 1, want: want(true, 9, 0, s)},
			{cost: 10, want: want(true, 0, 0, 5*s)}, // the most two shards hold
		},
	}, {
		// Reservations come from one shard: 2 in debt at most each.
		name: "reserve", key: "k",
		spec: sluice.Spec{TokensPerSecond: 2, Burst: 10, MaxReserved: 4, Shards: 2},
		steps: []shardStep{
			{cost: 10, want: want(true, 0, 0, 5*s)},
			{cost: 2, reserve: true, want: want(true, -2, 2*s, 7*s)},
			{cost: 1, reserve: true, want: want(true, -3, s, 7*s)},  // the fuller shard, at 0
			{cost: 2, reserve: true, want: want(false, -3, s, 7*s)}, // -1 - 2 is beyond 2 in debt
			{advance: s, cost: 2, reserve: true, want: want(true, -3, 2*s, 7*s)},
		},
	}, {
		// Four shards of 2: a peek reads and sums them all.
		name: "peek-sums", key: "k",
		spec: sluice.Spec{TokensPerSecond: 4, Burst: 8, Shards: 4},
		steps: []shardStep{
			{op: "peek", cost: 1, want: want(true, 7, 0, s)},
			{cost: 4, want: want(true, 0, 0, 2*s)}, // two full shards, drained
			{op: "peek", cost: 1, want: want(true, 3, 0, 2*s)},
			{op: "peek", cost: 4, want: want(true, 0, 0, 2*s)},
			{op: "reset"},
			{op: "peek", cost: 1, want: want(true, 7, 0, s)},
		},
	}, {
		name: "fixed-window", key: "k",
		spec: sluice.Spec{Algorithm: sluice.FixedWindow, Rate: 10, Period: s, Start: &zero, Shards: 2},
		steps: []shardStep{
			{advance: ms(200), cost: 7, want: want(true, 3, 0, ms(800))},
			{cost: 4, want: want(false, 3, ms(800), ms(800))},
			{cost: 3, want: want(true, 0, 0, ms(800))},
			{advance: ms(800), cost: 10, want: want(true, 0, 0, s)},
		},
	}, {
		// Without a start, the shards count in the key's own windows.
		name: "fixed-window-key-offset", key: "tenant-7",
		spec: sluice.Spec{Algorithm: sluice.FixedWindow, Rate: 10, Period: s, Shards: 2},
		steps: []shardStep{
			{advance: offset("tenant-7", s) + ms(100), cost: 10, want: want(true, 0, 0, ms(900))},
			{cost: 1, want: want(false, 0, ms(900), ms(900))},
		},
	}, {
		name: "sliding-log", key: "k",
		spec: sluice.Spec{Algorithm: sluice.SlidingLog, Rate: 10, Period: s, Shards: 2},
		steps: []shardStep{
			{cost: 8, want: want(true, 2, 0, s)},
			{advance: ms(500), cost: 3, want: want(false, 2, ms(500), ms(500))},
			{advance: ms(500), cost: 3, want: want(true, 7, 0, s)},
		},
	}}
}

// runShardExactCase drives c's steps through a Limiter on a new store
// and a manual clock.
func runShardExactCase(t *testing.T, newStore NewStore, c shardExactCase) {
	spec := c.spec
	spec.Name = "exact-" + c.name
	lim := sluice.MustLimit(spec)
	clock := sluice.NewManualClock(time.UnixMicro(7_000_000_000_000))
	l := sluice.New(newStore(t, clock))
	ctx := context.Background()
	for i, st := range c.steps {
		clock.Advance(st.advance)
		where := fmt.Sprintf("step %d (%s cost=%v)", i, st.op, st.cost)
		if st.op == "reset" {
			if err := l.Reset(ctx, lim, c.key); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			continue
		}
		r := sluice.Request{Limit: lim, Key: c.key, Cost: st.cost, Reserve: st.reserve}
		var d sluice.Decision
		var err error
		if st.op == "peek" {
			d, err = l.Peek(ctx, r)
		} else {
			d, err = l.Take(ctx, r)
		}
		if st.err != nil {
			if !errors.Is(err, st.err) {
				t.Fatalf("%s: want %v, got %v (%+v)", where, st.err, err, d)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		CheckDecision(t, where, lim, d, *st.want)
	}
}

// runShardTakeAllAllOrNothing: a TakeAll of a sharded and an unsharded
// limit charges no shard when the unsharded one rejects.
func runShardTakeAllAllOrNothing(t *testing.T, newStore NewStore) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	global := sluice.MustLimit(sluice.Spec{Name: "exact-sh-global", TokensPerSecond: 2, Burst: 10, Shards: 2})
	user := sluice.MustLimit(sluice.Spec{Name: "exact-sh-user", TokensPerSecond: 1, Burst: 1})
	clock := sluice.NewManualClock(time.UnixMicro(8_000_000_000_000))
	l := sluice.New(newStore(t, clock))
	ctx := context.Background()
	reqs := []sluice.Request{{Limit: global, Key: "*", Cost: 7}, {Limit: user, Key: "u", Cost: 1}}
	d, ds, err := l.TakeAll(ctx, reqs...)
	if err != nil || !d.Allowed {
		t.Fatalf("first TakeAll: %v %+v", err, ds)
	}
	CheckDecision(t, "first TakeAll, global", global, ds[0], *want(true, 3, 0, ms(3500)))
	// The global shards hold 2 together; the user has none left.
	reqs[0].Cost = 2
	d, ds, err = l.TakeAll(ctx, reqs...)
	if err != nil || d.Allowed || ds[0].Allowed || ds[1].Allowed {
		t.Fatalf("second TakeAll: want all rejected, got %v %+v", err, ds)
	}
	p, err := l.Peek(ctx, sluice.Request{Limit: global, Key: "*", Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	CheckDecision(t, "peek after the rejected TakeAll", global, p, *want(true, 2, 0, ms(4500)))
}
