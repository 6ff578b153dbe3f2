package conformance

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// InvariantOptions sizes the property tests; stores behind a network use
// fewer rounds.
type InvariantOptions struct {
	Rounds     int   // clock steps per stream (default 150)
	Goroutines []int // concurrency levels (default 1, 8, 64)
	Seed       uint64
}

func (o *InvariantOptions) defaults() {
	o.Rounds = cmp.Or(o.Rounds, 150)
	if len(o.Goroutines) == 0 {
		o.Goroutines = []int{1, 8, 64}
	}
	o.Seed = cmp.Or(o.Seed, 20261121)
}

// admission is what one clock round admitted of one bucket, in micro-tokens.
type admission struct {
	at    int64 // microseconds
	total int64
	// turns are the admitted requests of the round at their turns: now,
	// or now plus the wait of a reservation.
	turns []turn
}

// turn is one admitted request: when it may act (microseconds) and its
// cost (micro-tokens).
type turn struct{ at, cost int64 }

// RunInvariants drives random request streams (random clock steps, costs,
// reservations, 1 to 64 goroutines) against fresh stores and checks the
// bounds every algorithm promises over any interval [t1, t2]:
//
//   - token bucket: admitted <= burst + max_reserved + rate*(t2-t1), and
//     counted at their turns (a reservation acts when its turn comes,
//     whatever max_reserved, bounded or not) admitted <= burst +
//     rate*(t2-t1)
//   - fixed window: admitted within one window <= capacity
//   - sliding log: admitted within any period <= capacity
//   - sliding window: admitted within one aligned window <= capacity, and
//     within any period < 2 x capacity (docs/sliding-window.md)
//
// and that a rejected TakeAll charges none of its limits; then the same
// bounds for sharded limits driven through a Limiter (runShardInvariants):
// sharding adds nothing to them.
func RunInvariants(t *testing.T, newStore NewStore, opts InvariantOptions) {
	opts.defaults()
	start := engine.Duration(0)
	limits := []sluice.Spec{
		{Name: "inv-tb", Algorithm: sluice.TokenBucket, TokensPerSecond: 50, Burst: 20, MaxReserved: 5},
		{Name: "inv-tb-slow", Algorithm: sluice.TokenBucket, Rate: 7, Period: 3 * time.Second, Capacity: 4},
		{Name: "inv-fw", Algorithm: sluice.FixedWindow, Rate: 30, Period: 500 * time.Millisecond, Capacity: 45, Start: &start},
		{Name: "inv-sl", Algorithm: sluice.SlidingLog, Rate: 25, Period: 400 * time.Millisecond},
		{Name: "inv-lb", Algorithm: sluice.LeakyBucket, Rate: 40, MaxDelay: 200 * time.Millisecond},
		{Name: "inv-sw", Algorithm: sluice.SlidingWindow, Rate: 25, Period: 400 * time.Millisecond},
	}
	for _, spec := range limits {
		for _, g := range opts.Goroutines {
			t.Run(fmt.Sprintf("%s/g%d", spec.Name, g), func(t *testing.T) {
				lim := sluice.MustLimit(spec)
				rng := rand.New(rand.NewPCG(opts.Seed, uint64(g)))
				clock := sluice.NewManualClock(time.UnixMicro(1_000_000_000_000))
				store := newStore(t, clock)
				rounds := runStream(t, storeRequester{store}, clock, rng, opts.Rounds, g, func(r *rand.Rand) []sluice.Request {
					return []sluice.Request{randomRequest(r, lim, "k")}
				})
				checkBound(t, lim, rounds[0])
			})
		}
	}
	t.Run("takeall", func(t *testing.T) {
		for _, g := range opts.Goroutines {
			t.Run(fmt.Sprintf("g%d", g), func(t *testing.T) { runTakeAll(t, newStore, opts, g) })
		}
	})
	t.Run("takeall-rejected-charges-nothing", func(t *testing.T) { runRejectedTakeAll(t, newStore, opts) })
	t.Run("sharded", func(t *testing.T) { runShardInvariants(t, newStore, opts) })
}

func randomRequest(r *rand.Rand, lim *sluice.Limit, key string) sluice.Request {
	costs := []float64{0.5, 1, 1, 1, 2, 3}
	req := sluice.Request{Limit: lim, Key: key, Cost: costs[r.IntN(len(costs))]}
	if lim.Algorithm() == sluice.TokenBucket && r.IntN(4) == 0 {
		req.Reserve = true
	}
	req.Cost = min(req.Cost, lim.Capacity())
	return req
}

// runStream advances the clock by random steps; at each step g goroutines
// send the requests gen returns, as TakeAll when there are several. It
// returns, per request position, the cost admitted at each step.
func runStream(t *testing.T, store requester, clock *sluice.ManualClock, rng *rand.Rand, rounds, g int, gen func(*rand.Rand) []sluice.Request) [][]admission {
	t.Helper()
	ctx := context.Background()
	var out [][]admission
	steps := []time.Duration{0, time.Millisecond, 7 * time.Millisecond, 20 * time.Millisecond, 100 * time.Millisecond, 450 * time.Millisecond}
	for round := 0; round < rounds; round++ {
		clock.Advance(steps[rng.IntN(len(steps))])
		now := clock.Now().UnixMicro()
		perG := 1 + rng.IntN(3)
		width := len(gen(rng))
		if out == nil {
			out = make([][]admission, width)
		}
		var mu sync.Mutex
		totals := make([]int64, width)
		turns := make([][]turn, width)
		var wg sync.WaitGroup
		errs := make(chan error, g)
		for w := 0; w < g; w++ {
			reqs := make([][]sluice.Request, perG)
			for i := range reqs {
				reqs[i] = gen(rng)
			}
			wg.Go(func() {
				for _, rs := range reqs {
					var ds []sluice.Decision
					var err error
					if len(rs) == 1 {
						var d sluice.Decision
						d, err = store.Take(ctx, engine.OpTake, rs[0])
						ds = []sluice.Decision{d}
					} else {
						ds, err = store.TakeAll(ctx, engine.OpTake, rs)
					}
					if err != nil {
						errs <- err
						return
					}
					all := true
					for _, d := range ds {
						all = all && d.Allowed
					}
					if len(ds) > 1 {
						for i, d := range ds {
							if d.Allowed != all {
								errs <- fmt.Errorf("TakeAll decision %d allowed=%v but overall %v", i, d.Allowed, all)
								return
							}
						}
					}
					if all {
						mu.Lock()
						for i, r := range rs {
							c, _ := engine.ToMicroTokens(r.Cost)
							totals[i] += c
							turns[i] = append(turns[i], turn{at: now + engine.Micros(ds[i].RetryAfter), cost: c})
						}
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		for i := range totals {
			out[i] = append(out[i], admission{at: now, total: totals[i], turns: turns[i]})
		}
	}
	return out
}

// checkBound checks the algorithm's promise over every interval of rounds.
func checkBound(t *testing.T, lim *sluice.Limit, rounds []admission) {
	t.Helper()
	p := lim.Params()
	var admitted int64
	for _, r := range rounds {
		admitted += r.total
	}
	if admitted == 0 {
		t.Fatalf("%s: nothing was admitted; the stream tests nothing", lim.Name())
	}
	switch p.Algorithm {
	case engine.TokenBucket, engine.LeakyBucket:
		for i := range rounds {
			var sum int64
			for j := i; j < len(rounds); j++ {
				sum += rounds[j].total
				dt := rounds[j].at - rounds[i].at
				// sum <= capacity + max_reserved + dt*num/den, in scaled units.
				bound := float64(p.Capacity+p.MaxReserved)*float64(p.RateDen) + float64(dt)*float64(p.RateNum)
				if float64(sum)*float64(p.RateDen) > bound {
					t.Fatalf("%s: admitted %v tokens in [%d, %d]us, more than burst %v + reserved %v + rate*dt",
						lim.Name(), engine.FromMicroTokens(sum), rounds[i].at, rounds[j].at, lim.Capacity(), engine.FromMicroTokens(p.MaxReserved))
				}
			}
		}
		checkTurns(t, lim, rounds)
	case engine.FixedWindow:
		perWindow := map[int64]int64{}
		for _, r := range rounds {
			w := (r.at - p.Offset) / p.Period
			perWindow[w] += r.total
			if perWindow[w] > p.Capacity {
				t.Fatalf("%s: window %d admitted %v tokens, capacity %v", lim.Name(), w, engine.FromMicroTokens(perWindow[w]), lim.Capacity())
			}
		}
	case engine.SlidingWindow:
		perWindow := map[int64]int64{}
		for j, r := range rounds {
			w := r.at / p.Period // windows from the epoch
			perWindow[w] += r.total
			if perWindow[w] > p.Capacity {
				t.Fatalf("%s: window %d admitted %v tokens, capacity %v", lim.Name(), w, engine.FromMicroTokens(perWindow[w]), lim.Capacity())
			}
			var sum int64
			for i := j; i >= 0 && rounds[i].at > rounds[j].at-p.Period; i-- {
				sum += rounds[i].total
			}
			if sum >= 2*p.Capacity {
				t.Fatalf("%s: admitted %v tokens in the period ending %dus, twice the capacity %v or more", lim.Name(), engine.FromMicroTokens(sum), rounds[j].at, lim.Capacity())
			}
		}
	case engine.SlidingLog:
		for j := range rounds {
			var sum int64
			for i := j; i >= 0 && rounds[i].at > rounds[j].at-p.Period; i-- {
				sum += rounds[i].total
			}
			if sum > p.Capacity {
				t.Fatalf("%s: admitted %v tokens in the period ending %dus, capacity %v", lim.Name(), engine.FromMicroTokens(sum), rounds[j].at, lim.Capacity())
			}
		}
	}
}

// checkTurns checks a bucket's promise to reservations: the requests it
// admitted, each counted when its turn comes, never exceed
// max(burst, largest cost) plus the refill over any interval [t1, t2] of
// turns (plus one microsecond, as turns are rounded up to it), however
// deep the debt. A reservation above the burst acts in one piece at its
// turn, hence the largest cost. A limit of N shards keeps that promise
// per shard, so its turns may bunch: the allowance is N times one
// shard's, max(burst/N, largest cost) each (turnAllowance).
func checkTurns(t *testing.T, lim *sluice.Limit, rounds []admission) {
	t.Helper()
	p := lim.Params()
	var all []turn
	var largest int64
	for _, r := range rounds {
		all = append(all, r.turns...)
		for _, tu := range r.turns {
			largest = max(largest, tu.cost)
		}
	}
	allowance := turnAllowance(lim, largest)
	slices.SortFunc(all, func(a, b turn) int { return cmp.Compare(a.at, b.at) })
	for i := range all {
		var sum int64
		for j := i; j < len(all); j++ {
			sum += all[j].cost
			dt := all[j].at - all[i].at + 1
			if bound := float64(allowance)*float64(p.RateDen) + float64(dt)*float64(p.RateNum); float64(sum)*float64(p.RateDen) > bound {
				t.Fatalf("%s: %v tokens act at turns in [%d, %d]us, more than %v + rate*dt (burst %v, largest cost %v, %d shards)",
					lim.Name(), engine.FromMicroTokens(sum), all[i].at, all[j].at, engine.FromMicroTokens(allowance), lim.Capacity(), engine.FromMicroTokens(largest), lim.Shards())
			}
		}
	}
}

// turnAllowance is what may act at once at the turns of lim's
// reservations, in micro-tokens, when the largest request costs largest:
// max(capacity, largest) for one bucket; for N shards, N times
// max(capacity/N, largest), as each shard keeps the one-bucket promise on
// its own and their turns may coincide. Without reservations turns are
// takes and the bound is the burst's, sharded or not.
func turnAllowance(lim *sluice.Limit, largest int64) int64 {
	n := int64(max(lim.Shards(), 1))
	return n * max(lim.Params().Capacity/n, largest)
}

// runTakeAll charges per-user AND per-endpoint AND global limits together
// from g goroutines and checks each bucket's bound.
func runTakeAll(t *testing.T, newStore NewStore, opts InvariantOptions, g int) {
	start := time.Duration(0)
	user := sluice.MustLimit(sluice.Spec{Name: "all-user", TokensPerSecond: 20, Burst: 10})
	endpoint := sluice.MustLimit(sluice.Spec{Name: "all-endpoint", Algorithm: sluice.FixedWindow, Rate: 25, Period: 250 * time.Millisecond, Start: &start})
	global := sluice.MustLimit(sluice.Spec{Name: "all-global", Algorithm: sluice.SlidingLog, Rate: 30, Period: 300 * time.Millisecond})
	rng := rand.New(rand.NewPCG(opts.Seed, 1000+uint64(g)))
	clock := sluice.NewManualClock(time.UnixMicro(2_000_000_000_000))
	store := newStore(t, clock)
	// One user key so that its bucket sees the whole stream.
	rounds := runStream(t, storeRequester{store}, clock, rng, opts.Rounds, g, func(r *rand.Rand) []sluice.Request {
		cost := []float64{1, 1, 2}[r.IntN(3)]
		return []sluice.Request{
			{Limit: user, Key: "u1", Cost: cost},
			{Limit: endpoint, Key: "/search", Cost: cost},
			{Limit: global, Key: "", Cost: cost},
		}
	})
	checkBound(t, user, rounds[0])
	checkBound(t, endpoint, rounds[1])
	checkBound(t, global, rounds[2])
}

// runRejectedTakeAll checks, step by step, that a rejected TakeAll leaves
// every one of its buckets exactly as it was.
func runRejectedTakeAll(t *testing.T, newStore NewStore, opts InvariantOptions) {
	a := sluice.MustLimit(sluice.Spec{Name: "rej-a", TokensPerSecond: 10, Burst: 10})
	b := sluice.MustLimit(sluice.Spec{Name: "rej-b", TokensPerSecond: 2, Burst: 3})
	c := sluice.MustLimit(sluice.Spec{Name: "rej-c", Algorithm: sluice.SlidingLog, Rate: 5, Period: time.Second})
	rng := rand.New(rand.NewPCG(opts.Seed, 7))
	clock := sluice.NewManualClock(time.UnixMicro(3_000_000_000_000))
	checkRejectedTakeAll(t, storeRequester{newStore(t, clock)}, clock, rng, opts.Rounds*2, func(r *rand.Rand) []sluice.Request {
		return []sluice.Request{
			{Limit: a, Key: "x", Cost: float64(1 + r.IntN(3))},
			{Limit: b, Key: "x", Cost: float64(1 + r.IntN(3))},
			{Limit: c, Key: "x", Cost: 1},
		}
	})
}

// checkRejectedTakeAll sends rounds TakeAlls of next's requests to store,
// moving clock now and then, and checks that every rejected one left each
// bucket as a peek before it found it and reports none of them allowed.
func checkRejectedTakeAll(t *testing.T, store requester, clock *sluice.ManualClock, rng *rand.Rand, rounds int, next func(*rand.Rand) []sluice.Request) {
	t.Helper()
	ctx := context.Background()
	rejected := 0
	for i := 0; i < rounds; i++ {
		if rng.IntN(3) == 0 {
			clock.Advance(time.Duration(rng.IntN(300)) * time.Millisecond)
		}
		reqs := next(rng)
		before, err := store.TakeAll(ctx, engine.OpPeek, reqs)
		if err != nil {
			t.Fatal(err)
		}
		ds, err := store.TakeAll(ctx, engine.OpTake, reqs)
		if err != nil {
			t.Fatal(err)
		}
		after, err := store.TakeAll(ctx, engine.OpPeek, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if sluice.Combine(ds).Allowed {
			continue
		}
		rejected++
		for k := range reqs {
			if before[k].Tokens != after[k].Tokens || before[k].ResetAfter != after[k].ResetAfter {
				t.Fatalf("round %d: rejected TakeAll changed %s: before %+v after %+v", i, reqs[k].Limit.Name(), before[k], after[k])
			}
			if ds[k].Allowed {
				t.Fatalf("round %d: rejected TakeAll reports %s allowed", i, reqs[k].Limit.Name())
			}
		}
	}
	if rejected == 0 {
		t.Fatal("no TakeAll was rejected; the test tests nothing")
	}
}
