package sluice_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
)

// setShards takes from shard i of key what leaves it holding tokens[i].
func setShards(t *testing.T, st sluice.Store, lim *sluice.Limit, key string, tokens ...float64) {
	t.Helper()
	sh := sluice.ShardLimit(lim)
	for i, left := range tokens {
		if take := sh.Capacity() - left; take > 0 {
			d, err := conformance.Take(context.Background(), st, engine.OpTake, sluice.Request{Limit: sh, Key: lim.ShardKey(key, i), Cost: take})
			if err != nil || !d.Allowed {
				t.Fatalf("draining shard %d: %v %+v", i, err, d)
			}
		}
	}
}

// shardTokens reads each shard's tokens.
func shardTokens(t *testing.T, st sluice.Store, lim *sluice.Limit, key string) []float64 {
	t.Helper()
	sh := sluice.ShardLimit(lim)
	out := make([]float64, lim.Shards())
	for i := range out {
		d, err := conformance.Take(context.Background(), st, engine.OpPeek, sluice.Request{Limit: sh, Key: lim.ShardKey(key, i), Cost: sh.Capacity()})
		if err != nil {
			t.Fatal(err)
		}
		out[i] = d.Tokens
		if d.Allowed {
			out[i] = sh.Capacity()
		}
	}
	return out
}

// spyStore records the keys of the requests its store is asked.
type spyStore struct {
	sluice.Store
	mu    sync.Mutex
	calls [][]string // "op key cost" per request, per call
	// before, when set, runs before each take with the requests.
	before func(op engine.Op, rs []sluice.Charged)
}

func (s *spyStore) record(op engine.Op, rs []sluice.Charged) {
	if s.before != nil {
		s.before(op, rs)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var call []string
	for _, r := range rs {
		call = append(call, fmt.Sprintf("%s %s %v", op, r.Key, engine.FromMicroTokens(r.Cost)))
	}
	s.calls = append(s.calls, call)
}

func (s *spyStore) Take(ctx context.Context, op engine.Op, r sluice.Charged) (sluice.Decision, error) {
	s.record(op, []sluice.Charged{r})
	return s.Store.Take(ctx, op, r)
}

func (s *spyStore) TakeAll(ctx context.Context, op engine.Op, rs []sluice.Charged, _ []sluice.Decision) ([]sluice.Decision, error) {
	s.record(op, rs)
	return s.Store.TakeAll(ctx, op, rs, nil)
}

// Of the two shards a take reads, it charges the fuller.
func TestShardsChargeTheFuller(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(1e12))
	st := newMapStore(t, clock)
	lim := sluice.MustLimit(sluice.Spec{Name: "p2c", Rate: 1, Period: time.Hour, Capacity: 40, Shards: 4})
	spy := &spyStore{Store: st}
	l := sluice.New(spy).WithShardSeed(1)
	setShards(t, st, lim, "k", 10, 2, 6, 4)
	shardOf := func(key string) int {
		for i := range lim.Shards() {
			if lim.ShardKey("k", i) == key {
				return i
			}
		}
		t.Fatalf("no shard has key %q", key)
		return -1
	}
	for i := 0; i < 12; i++ {
		before := shardTokens(t, st, lim, "k")
		spy.calls = nil
		d, err := l.Take(context.Background(), sluice.Request{Limit: lim, Key: "k"})
		if err != nil || !d.Allowed {
			t.Fatalf("take %d: %v %+v", i, err, d)
		}
		if len(spy.calls) != 2 || len(spy.calls[0]) != 2 || len(spy.calls[1]) != 1 {
			t.Fatalf("take %d: store calls %q, want a read of two shards and a take of one", i, spy.calls)
		}
		var read []int
		for _, c := range spy.calls[0] {
			read = append(read, shardOf(strings.Fields(c)[1]))
		}
		charged := shardOf(strings.Fields(spy.calls[1][0])[1])
		other := read[0]
		if other == charged {
			other = read[1]
		}
		if before[charged] < before[other] {
			t.Fatalf("take %d: charged shard %d (%v tokens) over shard %d (%v)", i, charged, before[charged], other, before[other])
		}
		if sum := d.Tokens; sum != before[charged]+before[other]-1 {
			t.Fatalf("take %d: decision tokens %v, want the two shards read, after: %v", i, sum, before[charged]+before[other]-1)
		}
	}
	got := shardTokens(t, st, lim, "k")
	if sum := got[0] + got[1] + got[2] + got[3]; sum != 10 || slices.Max(got)-slices.Min(got) >= 8 {
		t.Fatalf("after 12 takes from shards of 10, 2, 6 and 4: %v, want 10 in all, less uneven", got)
	}
}

// A take that finds the shard it planned on emptied by a concurrent
// caller between the read and the charge is decided once more on fresh
// shards; one rejected for want of tokens is not.
func TestShardsRaceIsRetriedOnce(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(1e12))
	st := newMapStore(t, clock)
	lim := sluice.MustLimit(sluice.Spec{Name: "race", Rate: 1, Period: time.Hour, Capacity: 8, Shards: 4})
	spy := &spyStore{Store: st}
	raced := false
	spy.before = func(op engine.Op, rs []sluice.Charged) {
		if op != engine.OpTake || raced {
			return
		}
		raced = true
		for _, r := range rs { // another caller empties the shard first
			if _, err := conformance.Take(context.Background(), st, engine.OpTake, sluice.Request{Limit: r.Limit, Key: r.Key, Cost: r.Limit.Capacity()}); err != nil {
				t.Error(err)
			}
		}
	}
	l := sluice.New(spy).WithShardSeed(7)
	d, err := l.Take(context.Background(), sluice.Request{Limit: lim, Key: "k"})
	if err != nil || !d.Allowed {
		t.Fatalf("take after a race: %v %+v, want admitted from another shard", err, d)
	}
	if len(spy.calls) != 4 {
		t.Fatalf("store calls %q, want read, take (lost the race), read, take", spy.calls)
	}
	if got := shardTokens(t, st, lim, "k"); got[0]+got[1]+got[2]+got[3] != 5 {
		t.Fatalf("shards %v: want 8 less the racer's 2 and this take's 1", got)
	}

	// Both shards empty: rejected at once (no race), told when the two
	// together hold the cost: half a token each at 2/h.
	spy.calls = nil
	lim2 := sluice.MustLimit(sluice.Spec{Name: "race2", Rate: 4, Period: time.Hour, Capacity: 2, Shards: 2})
	setShards(t, st, lim2, "k", 0, 0)
	d, err = l.Take(context.Background(), sluice.Request{Limit: lim2, Key: "k"})
	if err != nil || d.Allowed || d.RetryAfter != 15*time.Minute || len(spy.calls) != 2 {
		t.Fatalf("empty shards: %v %+v after %d calls; want rejected after 2, retry in 15m", err, d, len(spy.calls))
	}
}

// A refund goes to the emptier of two shards, then to the other; Reset
// refills every shard.
func TestShardsRefundAndReset(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(1e12))
	st := newMapStore(t, clock)
	lim := sluice.MustLimit(sluice.Spec{Name: "refund", Rate: 1, Period: time.Hour, Capacity: 10, Shards: 2})
	l := sluice.New(st)
	ctx := context.Background()
	setShards(t, st, lim, "k", 4, 1)
	d, err := l.Refund(ctx, sluice.Request{Limit: lim, Key: "k", Cost: 2})
	if err != nil || !d.Allowed || d.Tokens != 7 {
		t.Fatalf("refund of 2: %v %+v", err, d)
	}
	if got := shardTokens(t, st, lim, "k"); got[0] != 4 || got[1] != 3 {
		t.Fatalf("after a refund of 2 to shards of 4 and 1: %v, want 4 and 3", got)
	}
	if _, err := l.Refund(ctx, sluice.Request{Limit: lim, Key: "k", Cost: 4}); err != nil {
		t.Fatal(err)
	}
	if got := shardTokens(t, st, lim, "k"); got[0] != 5 || got[1] != 5 {
		t.Fatalf("after a refund of 4 to shards of 4 and 3: %v, want both full", got)
	}
	setShards(t, st, lim, "k", 0, 2)
	if err := l.Reset(ctx, lim, "k"); err != nil {
		t.Fatal(err)
	}
	if got := shardTokens(t, st, lim, "k"); got[0] != 5 || got[1] != 5 {
		t.Fatalf("after Reset: %v, want every shard full", got)
	}
}

// Two requests of one TakeAll on the same sharded key read each shard
// once, and the second is planned on what the first leaves.
func TestShardsSameKeyTwiceInTakeAll(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(1e12))
	st := newMapStore(t, clock)
	spy := &spyStore{Store: st}
	lim := sluice.MustLimit(sluice.Spec{Name: "twice", Rate: 1, Period: time.Hour, Capacity: 10, Shards: 2})
	l := sluice.New(spy)
	d, ds, err := l.TakeAll(context.Background(), sluice.Request{Limit: lim, Key: "k", Cost: 6}, sluice.Request{Limit: lim, Key: "k", Cost: 3})
	if err != nil || !d.Allowed || !ds[0].Allowed || !ds[1].Allowed {
		t.Fatalf("6 then 3 from shards of 5 and 5: %v %+v", err, ds)
	}
	if len(spy.calls) != 2 || len(spy.calls[0]) != 2 {
		t.Fatalf("store calls %q, want one read of the two shards, then the charge", spy.calls)
	}
	if got := shardTokens(t, st, lim, "k"); got[0] != 0.5 || got[1] != 0.5 {
		t.Fatalf("shards %v, want 0.5 and 0.5", got)
	}
}
