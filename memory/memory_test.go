package memory_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/memory"
)

func newStore(t *testing.T, clock sluice.Clock) sluice.Store {
	return memory.New(memory.Options{Clock: clock})
}

func TestConformance(t *testing.T) { conformance.Run(t, newStore) }

func TestInvariants(t *testing.T) {
	conformance.RunInvariants(t, newStore, conformance.InvariantOptions{})
}

func TestWait(t *testing.T) { conformance.RunWait(t, newStore) }

// A small store, so that keys share shards and evictions happen.
func TestConformanceSmallStore(t *testing.T) {
	conformance.Run(t, func(t *testing.T, clock sluice.Clock) sluice.Store {
		return memory.New(memory.Options{Clock: clock, MaxKeys: 16, Shards: 1})
	})
}

var ctx = context.Background()

func TestMaxKeysBound(t *testing.T) {
	clock := sluice.NewManualClock(time.Unix(1000, 0))
	s := memory.New(memory.Options{Clock: clock, MaxKeys: 1000, Shards: 4})
	lim := sluice.MustLimit(sluice.Spec{Name: "bound", TokensPerSecond: 1, Burst: 5})
	for i := 0; i < 20000; i++ {
		clock.Advance(time.Microsecond)
		if _, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
		if n := s.Len(); n > 1000 {
			t.Fatalf("after %d keys the store holds %d, bound 1000", i+1, n)
		}
	}
}

// Evicting a key whose bucket has refilled changes no answer, so such keys
// go first: a drained hot key survives a flood of keys that refill at once.
func TestEvictsFullBucketsFirst(t *testing.T) {
	clock := sluice.NewManualClock(time.Unix(1000, 0))
	s := memory.New(memory.Options{Clock: clock, MaxKeys: 64, Shards: 1})
	slow := sluice.MustLimit(sluice.Spec{Name: "slow", Rate: 1, Period: time.Hour, Capacity: 3})
	fast := sluice.MustLimit(sluice.Spec{Name: "fast", TokensPerSecond: 1000, Burst: 1})
	for i := 0; i < 3; i++ {
		conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: slow, Key: "hot"})
	}
	for i := 0; i < 5000; i++ {
		clock.Advance(2 * time.Millisecond) // every fast bucket is full again by the next take
		conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: fast, Key: strconv.Itoa(i)})
	}
	d, _ := conformance.Take(ctx, s, engine.OpPeek, sluice.Request{Limit: slow, Key: "hot"})
	if d.Allowed {
		t.Fatalf("the drained key was evicted while full buckets were available: %+v", d)
	}
}

// With no full bucket to drop, the bucket closest to full goes: here the
// oldest keys, each one token short of a slow refill. A key drained and
// still asking (rejected, which writes nothing) is furthest from full and
// survives.
func TestEvictsClosestToFull(t *testing.T) {
	clock := sluice.NewManualClock(time.Unix(1000, 0))
	s := memory.New(memory.Options{Clock: clock, MaxKeys: 256, Shards: 1})
	lim := sluice.MustLimit(sluice.Spec{Name: "lru", Rate: 1, Period: time.Hour, Capacity: 2})
	survivors := 0
	for i := 0; i < 2000; i++ {
		clock.Advance(time.Millisecond)
		conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: strconv.Itoa(i)})
		// Key "keep" asks every round: drained after two, rejected since.
		conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "keep", Reserve: false})
	}
	d, _ := conformance.Take(ctx, s, engine.OpPeek, sluice.Request{Limit: lim, Key: "keep"})
	if d.Allowed {
		t.Fatalf("the drained key was evicted")
	}
	// Of the oldest keys almost none survive; of the newest most do. A
	// surviving key has one token left, so a peek of one leaves none; an
	// evicted one is full again.
	for i := 1900; i < 2000; i++ {
		if d, _ := conformance.Take(ctx, s, engine.OpPeek, sluice.Request{Limit: lim, Key: strconv.Itoa(i)}); d.Remaining == 0 {
			survivors++
		}
	}
	old := 0
	for i := 0; i < 100; i++ {
		if d, _ := conformance.Take(ctx, s, engine.OpPeek, sluice.Request{Limit: lim, Key: strconv.Itoa(i)}); d.Remaining == 0 {
			old++
		}
	}
	if survivors < 100 || old > 0 {
		t.Fatalf("eviction kept %d of the newest 100 and %d of the oldest 100", survivors, old)
	}
}

func TestResetAndLimitChange(t *testing.T) {
	clock := sluice.NewManualClock(time.Unix(1000, 0))
	s := memory.New(memory.Options{Clock: clock})
	a := sluice.MustLimit(sluice.Spec{Name: "r", TokensPerSecond: 1, Burst: 2})
	for i := 0; i < 2; i++ {
		conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: a, Key: "k"})
	}
	if d, _ := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: a, Key: "k"}); d.Allowed {
		t.Fatal("drained bucket admitted")
	}
	// A reloaded limit of the same name and shape keeps its state...
	a2 := sluice.MustLimit(sluice.Spec{Name: "r", TokensPerSecond: 1, Burst: 3})
	if d, _ := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: a2, Key: "k"}); d.Allowed {
		t.Fatal("state was lost across a reload of an unchanged-rate limit")
	}
	// ...a different algorithm under the same name starts afresh.
	b := sluice.MustLimit(sluice.Spec{Name: "r", Algorithm: sluice.SlidingLog, Rate: 2})
	if d, _ := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: b, Key: "k"}); !d.Allowed {
		t.Fatal("sliding log read token-bucket state")
	}
	if err := s.Reset(ctx, a, "k"); err != nil {
		t.Fatal(err)
	}
	if d, _ := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: a, Key: "k", Cost: 2}); !d.Allowed {
		t.Fatal("reset did not refill")
	}
}

func TestTakeAllSameBucketTwice(t *testing.T) {
	clock := sluice.NewManualClock(time.Unix(1000, 0))
	s := memory.New(memory.Options{Clock: clock})
	a := sluice.MustLimit(sluice.Spec{Name: "twice", TokensPerSecond: 1, Burst: 3})
	r := sluice.Request{Limit: a, Key: "k", Cost: 2}
	ds, err := conformance.TakeAll(ctx, s, engine.OpTake, []sluice.Request{r, r}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sluice.Combine(ds).Allowed {
		t.Fatal("two takes of 2 from a bucket of 3 were both admitted")
	}
	r.Cost = 1.5
	ds, _ = conformance.TakeAll(ctx, s, engine.OpTake, []sluice.Request{r, r}, nil)
	if !sluice.Combine(ds).Allowed || ds[1].Remaining != 0 {
		t.Fatalf("1.5 + 1.5 from 3: %+v", ds)
	}
}

// Concurrent TakeAlls naming the same shards in opposite orders must not
// deadlock (run with -race).
func TestTakeAllNoDeadlock(t *testing.T) {
	s := memory.New(memory.Options{Shards: 4})
	lims := []*sluice.Limit{
		sluice.MustLimit(sluice.Spec{Name: "d1", TokensPerSecond: 1e6, Burst: 1e6}),
		sluice.MustLimit(sluice.Spec{Name: "d2", TokensPerSecond: 1e6, Burst: 1e6}),
		sluice.MustLimit(sluice.Spec{Name: "d3", TokensPerSecond: 1e6, Burst: 1e6}),
	}
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for i := 0; i < 2000; i++ {
				rs := make([]sluice.Request, 3)
				for j := range rs {
					rs[j] = sluice.Request{Limit: lims[r.IntN(3)], Key: strconv.Itoa(r.IntN(8))}
				}
				if _, err := conformance.TakeAll(ctx, s, engine.OpTake, rs, nil); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("TakeAll deadlocked")
	}
}

func TestBadInputLeavesStateAlone(t *testing.T) {
	clock := sluice.NewManualClock(time.Unix(1000, 0))
	s := memory.New(memory.Options{Clock: clock})
	a := sluice.MustLimit(sluice.Spec{Name: "bad", TokensPerSecond: 1, Burst: 3})
	for _, c := range []float64{-1, 4, 1e300} {
		if _, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: a, Key: "k", Cost: c}); err == nil {
			t.Fatalf("cost %v accepted", c)
		}
	}
	if _, err := conformance.TakeAll(ctx, s, engine.OpTake, []sluice.Request{{Limit: a, Key: "k", Cost: 1}, {Limit: a, Key: "k", Cost: -2}}, nil); err == nil {
		t.Fatal("TakeAll with a negative cost accepted")
	}
	if d, _ := conformance.Take(ctx, s, engine.OpPeek, sluice.Request{Limit: a, Key: "k", Cost: 3}); !d.Allowed {
		t.Fatalf("bad input changed state: %+v", d)
	}
}

// With the precise clock, decisions against real time keep the bound to
// the token: burst + rate*elapsed.
func TestRealClockBound(t *testing.T) {
	s := memory.New(memory.Options{PreciseClock: true})
	lim := sluice.MustLimit(sluice.Spec{Name: "real", TokensPerSecond: 1000, Burst: 10})
	start := time.Now()
	admitted, takes := 0, 0
	for time.Since(start) < 50*time.Millisecond {
		takes++
		if d, _ := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"}); d.Allowed {
			admitted++
		}
	}
	elapsed := time.Since(start)
	bound := 10 + 1000*elapsed.Seconds()
	// At least the burst the bucket starts with, or every take when a
	// loaded machine made fewer.
	if float64(admitted) > bound || admitted < min(10, takes) {
		t.Fatalf("admitted %d of %d takes in %v, bound %.1f", admitted, takes, elapsed, bound)
	}
}

var sink sluice.Decision

// The Take benchmarks measure the store: each request is charged
// beforehand, as the Limiter charges it before it asks its store, so that
// the figure is Store.Take's and not the charging or the copies of a test
// helper's (conformance.Take) around it.

func BenchmarkTakeOneKey(b *testing.B) {
	s := memory.New(memory.Options{})
	c := charged(b, sluice.Request{Limit: sluice.MustLimit(sluice.Spec{Name: "one", TokensPerSecond: 100, Burst: 100}), Key: "user-1"})
	b.ReportAllocs()
	for b.Loop() {
		sink, _ = s.Take(ctx, engine.OpTake, c)
	}
}

func BenchmarkTakeManyKeysParallel(b *testing.B) {
	s := memory.New(memory.Options{})
	lim := sluice.MustLimit(sluice.Spec{Name: "many", TokensPerSecond: 100, Burst: 100})
	cs := make([]sluice.Charged, 1<<14)
	for i := range cs {
		cs[i] = charged(b, sluice.Request{Limit: lim, Key: "user-" + strconv.Itoa(i)})
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := rand.IntN(len(cs))
		for pb.Next() {
			s.Take(ctx, engine.OpTake, cs[i&(len(cs)-1)])
			i++
		}
	})
}

func BenchmarkTakeAllThree(b *testing.B) {
	s := memory.New(memory.Options{})
	cs, err := conformance.ChargeAll(engine.OpTake, []sluice.Request{
		{Limit: sluice.MustLimit(sluice.Spec{Name: "user", TokensPerSecond: 100, Burst: 100}), Key: "user-42"},
		{Limit: sluice.MustLimit(sluice.Spec{Name: "endpoint", TokensPerSecond: 1000, Burst: 1000}), Key: "/search"},
		{Limit: sluice.MustLimit(sluice.Spec{Name: "global", TokensPerSecond: 10000, Burst: 10000}), Key: ""},
	})
	if err != nil {
		b.Fatal(err)
	}
	dst := make([]sluice.Decision, 0, len(cs))
	b.ReportAllocs()
	for b.Loop() {
		s.TakeAll(ctx, engine.OpTake, cs, dst)
	}
}

func charged(b *testing.B, r sluice.Request) sluice.Charged {
	c, err := r.Charged(engine.OpTake)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkBytesPerKey fills a store with one million idle keys and reports
// the heap each key costs.
func BenchmarkBytesPerKey(b *testing.B) {
	const n = 1_000_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("user-%07d", i)
	}
	lim := sluice.MustLimit(sluice.Spec{Name: "idle", TokensPerSecond: 1, Burst: 10})
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		s := memory.New(memory.Options{MaxKeys: n})
		for _, k := range keys {
			conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: k})
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if s.Len() != n {
			b.Fatalf("holds %d keys, want %d", s.Len(), n)
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/key")
		runtime.KeepAlive(s)
	}
}

// Lock-free readers racing table growth and backward-shift deletion (one
// shard, so that every key shares the table): keys that are neither
// evicted nor reset keep exact counts.
func TestLockFreeReadsUnderChurn(t *testing.T) {
	clock := sluice.NewManualClock(time.Unix(1000, 0))
	s := memory.New(memory.Options{Clock: clock, Shards: 1, MaxKeys: 1 << 20})
	probe := sluice.MustLimit(sluice.Spec{Name: "probe", Rate: 1, Period: time.Hour, Capacity: 5})
	churn := sluice.MustLimit(sluice.Spec{Name: "churn", TokensPerSecond: 1, Burst: 1})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := strconv.Itoa(g*1_000_000 + i)
				conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: churn, Key: k})
				if i%3 == 0 {
					s.Reset(ctx, churn, k) // a removal shifts later entries back
				}
			}
		}()
	}
	var pw sync.WaitGroup
	counts := make([]int, 8)
	for g := range counts {
		pw.Add(1)
		go func() {
			defer pw.Done()
			for i := 0; i < 3000; i++ {
				if d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: probe, Key: "p" + strconv.Itoa(g)}); err == nil && d.Allowed {
					counts[g]++
				}
			}
		}()
	}
	pw.Wait()
	close(stop)
	wg.Wait()
	for g, n := range counts {
		if n != 5 {
			t.Errorf("probe %d admitted %d, want its capacity of 5", g, n)
		}
	}
}

// BenchmarkTakeNewKeyAtBound takes with a fresh key into a store at its
// bound of 100,000 keys, so that every take evicts: "full" keys refill
// within a millisecond (evictions of full keys), "partial" keys refill in
// an hour (every eviction is of the key closest to full).
func BenchmarkTakeNewKeyAtBound(b *testing.B) {
	keys := make([]string, 1<<20)
	for i := range keys {
		keys[i] = "user-" + strconv.Itoa(i)
	}
	for _, bc := range []struct {
		name string
		spec sluice.Spec
	}{
		{"full", sluice.Spec{Name: "fast", TokensPerSecond: 1000, Burst: 1}},
		{"partial", sluice.Spec{Name: "slow", Rate: 1, Period: time.Hour, Capacity: 2}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s := memory.New(memory.Options{MaxKeys: 100_000})
			lim := sluice.MustLimit(bc.spec)
			for i := range 100_000 {
				conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: keys[len(keys)-1-i]})
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				sink, _ = conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: keys[i&(len(keys)-1)]})
				i++
			}
		})
	}
}
