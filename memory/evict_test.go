package memory

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
)

type hashKey struct{ h, check uint64 }

// snapshot returns every entry's fullAt, by key, and the shard it is in.
func snapshot(s *Store) map[hashKey][2]int64 {
	m := make(map[hashKey][2]int64)
	for id := range s.shards {
		for _, e := range s.shards[id].t.entries {
			if e.h != 0 {
				m[hashKey{e.h, e.check}] = [2]int64{e.fullAt, int64(id)}
			}
		}
	}
	return m
}

// checkIndex checks the eviction index of every shard (see evict.go):
// every entry's fullAt is at least floor or at least one of its records,
// and the published bound is at most that.
func checkIndex(t *testing.T, s *Store) {
	t.Helper()
	for id := range s.shards {
		sh := &s.shards[id]
		rec := make(map[hashKey]int64)
		for j, c := range sh.cand {
			if j > 0 && sh.cand[j-1].fullAt > c.fullAt {
				t.Fatalf("shard %d: records out of order", id)
			}
			if c.fullAt > sh.floor {
				t.Fatalf("shard %d: record %d above floor %d", id, c.fullAt, sh.floor)
			}
			if v, ok := rec[hashKey{c.h, c.check}]; !ok || c.fullAt < v {
				rec[hashKey{c.h, c.check}] = c.fullAt
			}
		}
		for _, e := range sh.t.entries {
			if e.h == 0 {
				continue
			}
			v, ok := rec[hashKey{e.h, e.check}]
			if e.fullAt < sh.floor && (!ok || e.fullAt < v) {
				t.Fatalf("shard %d: entry with fullAt %d below floor %d and unrecorded (record %d, %v)", id, e.fullAt, sh.floor, v, ok)
			}
		}
		if got := s.earliest[id].Load(); got > sh.low() {
			t.Fatalf("shard %d: published %d above its bound %d", id, got, sh.low())
		}
	}
}

// The eviction guarantee, checked around every operation of a random
// workload on a small store of four shards (so that every insert evicts,
// and full keys often sit in another shard than the insert's): a key below
// full is evicted only when no full key of the store is left (the
// request's own keys aside), and then only the keys of its shard closest
// to full.
func TestEvictionNeverPartialWhileFullExists(t *testing.T) {
	clock := sluice.NewManualClock(time.Unix(1000, 0))
	s := New(Options{Clock: clock, MaxKeys: 64, Shards: 4})
	if len(s.shards) != 4 {
		t.Fatalf("want 4 shards, got %d", len(s.shards))
	}
	ctx := context.Background()
	lims := []*sluice.Limit{
		sluice.MustLimit(sluice.Spec{Name: "fast", TokensPerSecond: 1000, Burst: 2}),
		sluice.MustLimit(sluice.Spec{Name: "medium", TokensPerSecond: 10, Burst: 3}),
		sluice.MustLimit(sluice.Spec{Name: "slow", Rate: 1, Period: time.Hour, Capacity: 2}),
		sluice.MustLimit(sluice.Spec{Name: "window", Algorithm: sluice.FixedWindow, Rate: 3, Period: 50 * time.Millisecond}),
		sluice.MustLimit(sluice.Spec{Name: "log", Algorithm: sluice.SlidingLog, Rate: 2, Period: 20 * time.Millisecond}),
	}
	rng := rand.New(rand.NewPCG(1, 2))
	req := func() sluice.Request {
		k := rng.IntN(400)
		return sluice.Request{Limit: lims[k%len(lims)], Key: strconv.Itoa(k)}
	}
	var partials, fulls int
	for op := range 15_000 {
		clock.Advance(time.Duration(rng.IntN(3000)) * time.Microsecond)
		now := clock.Now().UnixMicro()
		var rs []sluice.Request
		kind := rng.IntN(20)
		switch {
		case kind < 14:
			rs = []sluice.Request{req()}
		case kind < 18:
			rs = []sluice.Request{req(), req(), req()}
		default:
			rs = []sluice.Request{req()}
		}
		own := make(map[hashKey]bool)
		for _, r := range rs {
			h, c := s.hashes(r.Limit, r.Key)
			own[hashKey{h, c}] = true
		}
		before := snapshot(s)
		var err error
		switch {
		case kind < 14:
			_, err = conformance.Take(ctx, s, engine.OpTake, rs[0])
		case kind < 18:
			_, err = conformance.TakeAll(ctx, s, engine.OpTake, rs, nil)
		case kind < 19:
			_, err = conformance.Take(ctx, s, engine.OpRefund, rs[0])
		default:
			err = s.Reset(ctx, rs[0].Limit, rs[0].Key)
		}
		if err != nil {
			t.Fatal(err)
		}
		if n := s.Len(); n > 64 {
			t.Fatalf("op %d: %d keys held, bound 64", op, n)
		}
		after := snapshot(s)
		// A full key (not the request's own) that the operation left in
		// place: while one exists, no key below full may go.
		fullLeft := false
		for k, v := range before {
			if _, ok := after[k]; ok && v[0] <= now && !own[k] {
				fullLeft = true
			}
		}
		for k, v := range before {
			if _, ok := after[k]; ok || own[k] {
				continue // kept, or removed by the request itself (a Reset)
			}
			if v[0] <= now {
				fulls++
				continue
			}
			partials++
			if fullLeft {
				t.Fatalf("op %d: a key %dµs from full was evicted while a full key was kept", op, v[0]-now)
			}
			for k2, v2 := range after {
				if v2[1] == v[1] && v2[0] < v[0] && !own[k2] {
					if _, was := before[k2]; was {
						t.Fatalf("op %d: evicted a key %dµs from full while its shard kept one %dµs from full", op, v[0]-now, v2[0]-now)
					}
				}
			}
		}
		checkIndex(t, s)
	}
	if partials == 0 || fulls == 0 {
		t.Fatalf("the workload evicted %d full and %d partial keys: it tests nothing", fulls, partials)
	}
	full, partial := s.Evictions()
	t.Logf("observed %d full and %d partial evictions; counted %d full, %d partial", fulls, partials, full, partial)
}

// A Store whose shards each hold one key below full, and one shard also a
// full key: an insert into any shard evicts the full key, though it is in
// another shard.
func TestEvictsFullKeyOfAnotherShard(t *testing.T) {
	clock := sluice.NewManualClock(time.Unix(1000, 0))
	slow := sluice.MustLimit(sluice.Spec{Name: "slow", Rate: 1, Period: time.Hour, Capacity: 2})
	fast := sluice.MustLimit(sluice.Spec{Name: "fast", TokensPerSecond: 1000, Burst: 1})
	ctx := context.Background()
	for trial := range 200 {
		s := New(Options{Clock: clock, MaxKeys: 64, Shards: 4})
		i := 0
		for s.Len() < 63 {
			conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: slow, Key: "p" + strconv.Itoa(i)})
			i++
		}
		conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: fast, Key: "f"})
		clock.Advance(2 * time.Millisecond) // "f" is full again
		fh, fc := s.hashes(fast, "f")
		conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: slow, Key: "new" + strconv.Itoa(trial)})
		if full, partial := s.Evictions(); full != 1 || partial != 0 {
			t.Fatalf("trial %d: evictions %d full, %d partial; want the full key alone", trial, full, partial)
		}
		if _, ok := snapshot(s)[hashKey{fh, fc}]; ok {
			t.Fatalf("trial %d: the full key is still held", trial)
		}
	}
}

// A TakeAll at the bound never evicts its own keys to make room for its
// other keys, even when its own key is the one closest to full; and one
// that needs more new keys than the store can evict passes the bound by
// those keys rather than failing.
func TestTakeAllAtBoundKeepsItsKeys(t *testing.T) {
	clock := sluice.NewManualClock(time.Unix(1000, 0))
	slow := sluice.MustLimit(sluice.Spec{Name: "slow", Rate: 1, Period: time.Hour, Capacity: 2})
	ctx := context.Background()
	s := New(Options{Clock: clock, MaxKeys: 32, Shards: 2})
	conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: slow, Key: "x"}) // closest to full of all
	for i := 0; s.Len() < 32; i++ {
		clock.Advance(time.Millisecond)
		conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: slow, Key: "p" + strconv.Itoa(i)})
	}
	ds, err := conformance.TakeAll(ctx, s, engine.OpTake, []sluice.Request{{Limit: slow, Key: "x"}, {Limit: slow, Key: "y"}}, nil)
	if err != nil || !sluice.Combine(ds).Allowed {
		t.Fatalf("TakeAll: %v %+v", err, ds)
	}
	if d, _ := conformance.Take(ctx, s, engine.OpPeek, sluice.Request{Limit: slow, Key: "x"}); d.Allowed {
		t.Fatalf("x was evicted to make room for y: %+v", d)
	}
	if n := s.Len(); n != 32 {
		t.Fatalf("%d keys held, bound 32", n)
	}

	small := New(Options{Clock: clock, MaxKeys: 16, Shards: 1})
	rs := make([]sluice.Request, 20)
	for i := range rs {
		rs[i] = sluice.Request{Limit: slow, Key: "k" + strconv.Itoa(i)}
	}
	if ds, err := conformance.TakeAll(ctx, small, engine.OpTake, rs, nil); err != nil || !sluice.Combine(ds).Allowed {
		t.Fatalf("TakeAll of 20 new keys into a store of 16: %v %+v", err, ds)
	}
	if n := small.Len(); n != 20 {
		t.Fatalf("%d keys held after a TakeAll of 20 new keys", n)
	}
	for i := range rs {
		if d, _ := conformance.Take(ctx, small, engine.OpPeek, rs[i]); !d.Allowed || d.Remaining != 0 { // one token left
			t.Fatalf("key %d: %+v", i, d)
		}
	}
}

// Inserts at the bound from many goroutines, across shards (reclaim takes
// other shards' locks) and with TakeAlls (several locks at once): no
// deadlock, no race (run with -race), and the bound holds.
func TestEvictionConcurrent(t *testing.T) {
	s := New(Options{MaxKeys: 64, Shards: 4})
	lims := []*sluice.Limit{
		sluice.MustLimit(sluice.Spec{Name: "fast", TokensPerSecond: 1e5, Burst: 1}),
		sluice.MustLimit(sluice.Spec{Name: "slow", Rate: 1, Period: time.Hour, Capacity: 2}),
	}
	ctx := context.Background()
	done := make(chan struct{})
	for g := range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			req := func() sluice.Request {
				k := rng.IntN(1000)
				return sluice.Request{Limit: lims[k%2], Key: strconv.Itoa(k)}
			}
			for range 3000 {
				switch rng.IntN(10) {
				case 0:
					conformance.TakeAll(ctx, s, engine.OpTake, []sluice.Request{req(), req(), req()}, nil)
				case 1:
					r := req()
					s.Reset(ctx, r.Limit, r.Key)
				default:
					conformance.Take(ctx, s, engine.OpTake, req())
				}
				if n := s.Len(); n > 64 {
					t.Errorf("%d keys held, bound 64", n)
					return
				}
			}
		}()
	}
	for range 8 {
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Fatal("deadlock")
		}
	}
}

// Without Options.Shards a store has 16 shards per GOMAXPROCS, at most
// 256, fewer when its key bound is small.
func TestDefaultShards(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, c := range []struct{ procs, maxKeys, want int }{
		{1, 0, 16}, {2, 0, 32}, {3, 0, 64}, {16, 0, 256}, {64, 0, 256}, {16, 64, 4},
	} {
		runtime.GOMAXPROCS(c.procs)
		if got := len(New(Options{MaxKeys: c.maxKeys}).shards); got != c.want {
			t.Errorf("GOMAXPROCS %d, MaxKeys %d: %d shards, want %d", c.procs, c.maxKeys, got, c.want)
		}
	}
}

// Attack: a key flood to reset a drained bucket. A client drains its
// bucket and keeps asking (rejected), while 2,000,000 fresh keys are
// pushed through a store bounded at 100,000. If eviction drops the drained
// bucket (a rejection writes nothing, so by recency it looks idle), the
// client gets a full bucket back each time. The drained key must stay
// drained: its admissions stay within burst + rate*elapsed, the store
// never holds more than its bound, and a well-behaved client is admitted
// throughout.
//
// Each fresh key takes one token of 5 (rate 1/s): for a second it is below
// full, then full again. On a manual clock, the first million keys come
// 2 µs apart, so the store holds only 0.2 s of them and every eviction is
// of a key below full (the one closest to full); the second million come
// 20 µs apart, so half the keys held are full and those go. Under the race
// detector the store and the flood are a fortieth of that, over the same
// simulated time.
func TestAttackKeyFloodKeepsDrainedBucket(t *testing.T) {
	maxKeys, flood := 100_000, 2_000_000
	if raceDetector {
		maxKeys, flood = 2_500, 50_000
	}
	fast := 200 * time.Millisecond / time.Duration(maxKeys) // the store holds 0.2 s of keys
	slow := 10 * fast                                       // 2 s
	askEvery := flood / 2000                                // the drained client asks every 2 ms, then 20 ms
	ctx := context.Background()
	clock := sluice.NewManualClock(time.Unix(1000, 0))
	s := New(Options{Clock: clock, MaxKeys: maxKeys})
	lim := sluice.MustLimit(sluice.Spec{Name: "per-client", TokensPerSecond: 1, Burst: 5})
	abuser := sluice.Request{Limit: lim, Key: "abuser"}
	legit := sluice.Request{Limit: lim, Key: "legit"}
	start := clock.Now()
	admitted := 0
	take := func(r sluice.Request) sluice.Decision {
		d, err := conformance.Take(ctx, s, engine.OpTake, r)
		if err != nil {
			t.Fatalf("take %q: %v", r.Key, err)
		}
		return d
	}
	for take(abuser).Allowed {
		admitted++
	}
	var sinceLegit time.Duration
	key := make([]byte, 0, 16)
	for i := range flood {
		step := fast
		if i >= flood/2 {
			step = slow
		}
		clock.Advance(step)
		key = strconv.AppendInt(append(key[:0], "flood-"...), int64(i), 10)
		take(sluice.Request{Limit: lim, Key: string(key)})
		if i%askEvery == 0 {
			if take(abuser).Allowed {
				admitted++
			}
			if n := s.Len(); n > maxKeys {
				t.Fatalf("after %d fresh keys the store holds %d keys, bound %d", i+1, n, maxKeys)
			}
		}
		if sinceLegit += step; sinceLegit >= 1200*time.Millisecond { // within its limit
			sinceLegit = 0
			if d := take(legit); !d.Allowed {
				t.Fatalf("after %d fresh keys a client within its limit was rejected: %+v", i+1, d)
			}
		}
	}
	elapsed := clock.Now().Sub(start)
	// The client asked often enough to take each token as it arrived.
	bound := 5 + int(elapsed/time.Second)
	if admitted > bound {
		t.Fatalf("the drained client was admitted %d times in %v, bound burst 5 + 1/s = %d: its bucket was evicted and refilled", admitted, elapsed, bound)
	}
	if d, _ := conformance.Take(ctx, s, engine.OpPeek, abuser); d.Remaining >= 1 {
		t.Fatalf("after the flood the drained key has %d tokens", d.Remaining)
	}
	if n := s.Len(); n > maxKeys {
		t.Fatalf("the store holds %d keys, bound %d", n, maxKeys)
	}
	full, partial := s.Evictions()
	if partial == 0 || full == 0 || full+partial < uint64(flood-maxKeys) {
		t.Fatalf("evictions: %d full, %d partial, for more than %d keys inserted", full, partial, flood)
	}
	t.Logf("abuser admitted %d in %v; evictions: %d full, %d partial", admitted, elapsed, full, partial)
}
