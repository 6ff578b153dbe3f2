package redis_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/redis"
)

// A refund puts tokens back, so a rejection the store cached for the key
// must go: otherwise the cache would keep refusing takes Redis now admits.
func TestRefundClearsOverLimitCache(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(11_000_000_000_000))
	s := open(t, standaloneURL(t), redis.Options{Clock: clock})
	ctx := context.Background()
	lim := uniqueLimit(t, sluice.Spec{Name: "refund-cache", TokensPerSecond: 1, Burst: 2})
	req := func(cost float64) sluice.Request { return sluice.Request{Limit: lim, Key: "k", Cost: cost} }
	if d, err := conformance.Take(ctx, s, engine.OpTake, req(2)); err != nil || !d.Allowed {
		t.Fatalf("take 2: %v %+v", err, d)
	}
	if d, err := conformance.Take(ctx, s, engine.OpTake, req(1)); err != nil || d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("want a rejection for 1s: %v %+v", err, d)
	}
	d, err := conformance.Take(ctx, s, engine.OpRefund, req(1))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed || d.Remaining != 1 || d.Tokens != 1 || d.ResetAfter != time.Second {
		t.Fatalf("refund decision %+v, want allowed with 1 token, full in 1s", d)
	}
	if d, err := conformance.Take(ctx, s, engine.OpTake, req(1)); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("take after the refund: %v %+v, want admitted (the cached rejection must be gone)", err, d)
	}
	// The same through TakeAll.
	if d, err := conformance.Take(ctx, s, engine.OpTake, req(1)); err != nil || d.Allowed {
		t.Fatalf("want a rejection: %v %+v", err, d)
	}
	if _, err := conformance.TakeAll(ctx, s, engine.OpRefund, []sluice.Request{req(1)}, nil); err != nil {
		t.Fatal(err)
	}
	if d, err := conformance.Take(ctx, s, engine.OpTake, req(1)); err != nil || !d.Allowed {
		t.Fatalf("take after TakeAll's refund: %v %+v", err, d)
	}
}

// A refund of an absent key (a full bucket) writes nothing; any other sets
// the TTL to the time until full, and one that fills the bucket deletes it.
func TestRefundState(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(12_000_000_000_000))
	s := open(t, standaloneURL(t), redis.Options{Clock: clock, NoOverLimitCache: true})
	ctx := context.Background()
	c := s.Client()
	start := time.Duration(0)
	limits := []*sluice.Limit{
		uniqueLimit(t, sluice.Spec{Name: "rs-tb", TokensPerSecond: 10, Burst: 50}),
		uniqueLimit(t, sluice.Spec{Name: "rs-fw", Algorithm: sluice.FixedWindow, Rate: 5, Period: time.Second, Capacity: 10, Start: &start}),
		uniqueLimit(t, sluice.Spec{Name: "rs-fwh", Algorithm: sluice.FixedWindow, Rate: 5, Period: time.Second}),
		uniqueLimit(t, sluice.Spec{Name: "rs-sl", Algorithm: sluice.SlidingLog, Rate: 5, Period: time.Second}),
	}
	exists := func(key string) bool {
		t.Helper()
		n, err := c.Do(ctx, c.B().Exists().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	for _, lim := range limits {
		key := lim.StorageKey("k")
		req := func(cost float64) sluice.Request { return sluice.Request{Limit: lim, Key: "k", Cost: cost} }
		d, err := conformance.Take(ctx, s, engine.OpRefund, req(1))
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed || d.Tokens != lim.Capacity() || d.ResetAfter != 0 || exists(key) {
			t.Fatalf("%s: refund of an absent key: %+v, key written: %v", lim.Name(), d, exists(key))
		}
		if _, err := conformance.TakeAll(ctx, s, engine.OpRefund, []sluice.Request{req(1), req(2)}, nil); err != nil || exists(key) {
			t.Fatalf("%s: TakeAll refund of an absent key: %v, key written: %v", lim.Name(), err, exists(key))
		}
		if d, err := conformance.Take(ctx, s, engine.OpTake, req(3)); err != nil || !d.Allowed {
			t.Fatalf("%s: take: %v %+v", lim.Name(), err, d)
		}
		refunded := time.Now()
		d, err = conformance.Take(ctx, s, engine.OpRefund, req(1))
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed || d.Tokens != lim.Capacity()-2 {
			t.Fatalf("%s: refund: %+v, want %v tokens", lim.Name(), d, lim.Capacity()-2)
		}
		pttl, err := c.Do(ctx, c.B().Pttl().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		// The test clock pads every TTL by an hour (see Options.Clock); the
		// TTL has run since the refund set it, for at most what passed here.
		want := d.ResetAfter.Milliseconds() + 3_600_000
		if passed := time.Since(refunded).Milliseconds(); pttl > want+1 || pttl < want-passed-1 {
			t.Fatalf("%s: PTTL %dms %dms after the refund, want %d less that (reset after %v)", lim.Name(), pttl, passed, want, d.ResetAfter)
		}
		if d, err := conformance.Take(ctx, s, engine.OpRefund, req(5)); err != nil || d.Tokens != lim.Capacity() || d.ResetAfter != 0 {
			t.Fatalf("%s: refund to full: %v %+v", lim.Name(), err, d)
		}
		if exists(key) {
			t.Fatalf("%s: a full bucket is still stored", lim.Name())
		}
	}
}

// TakeAll with OpRefund refunds every request, on one Redis in one script
// and on a Cluster slot by slot; concurrent refunds go through batching
// and every bucket ends full again.
func TestRefundAll(t *testing.T) {
	for _, tc := range []struct {
		name string
		url  func(testing.TB) string
	}{{"standalone", standaloneURL}, {"cluster", clusterURL}} {
		t.Run(tc.name, func(t *testing.T) {
			clock := sluice.NewManualClock(time.UnixMicro(13_000_000_000_000))
			s := open(t, tc.url(t), redis.Options{Clock: clock})
			ctx := context.Background()
			start := time.Duration(0)
			limits := []*sluice.Limit{
				uniqueLimit(t, sluice.Spec{Name: "ra-tb", TokensPerSecond: 1, Burst: 20, MaxReserved: 5}),
				uniqueLimit(t, sluice.Spec{Name: "ra-fw", Algorithm: sluice.FixedWindow, Rate: 20, Period: time.Second, Start: &start}),
				uniqueLimit(t, sluice.Spec{Name: "ra-sl", Algorithm: sluice.SlidingLog, Rate: 20, Period: time.Second}),
				uniqueLimit(t, sluice.Spec{Name: "ra-fwh", Algorithm: sluice.FixedWindow, Rate: 20, Period: time.Second}),
			}
			reqs := func(cost float64) []sluice.Request {
				rs := make([]sluice.Request, len(limits))
				for i, l := range limits {
					rs[i] = sluice.Request{Limit: l, Key: "x", Cost: cost}
				}
				return rs
			}
			if ds, err := conformance.TakeAll(ctx, s, engine.OpTake, reqs(5), nil); err != nil || !sluice.Combine(ds).Allowed {
				t.Fatalf("take all: %v %+v", err, ds)
			}
			ds, err := conformance.TakeAll(ctx, s, engine.OpRefund, reqs(2), nil)
			if err != nil {
				t.Fatal(err)
			}
			for i, d := range ds {
				if !d.Allowed || d.Tokens != 17 || d.Rule != limits[i].Name() {
					t.Fatalf("refund %d: %+v, want allowed with 17 tokens", i, d)
				}
			}
			peek, err := conformance.TakeAll(ctx, s, engine.OpPeek, reqs(1), nil)
			if err != nil {
				t.Fatal(err)
			}
			for i, d := range peek {
				if d.Tokens != 16 {
					t.Fatalf("peek %d of 1 after the refund: %+v, want 16 tokens", i, d)
				}
			}

			// Concurrent takes and refunds, batched: every admitted take
			// is given back, so every bucket is full at the end.
			var wg sync.WaitGroup
			for range 32 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 10 {
						for _, r := range reqs(1) {
							d, err := conformance.Take(ctx, s, engine.OpTake, r)
							if err != nil {
								t.Error(err)
								return
							}
							if !d.Allowed {
								continue
							}
							if d, err := conformance.Take(ctx, s, engine.OpRefund, r); err != nil || !d.Allowed {
								t.Errorf("refund: %v %+v", err, d)
								return
							}
						}
					}
				}()
			}
			wg.Wait()
			if _, err := conformance.TakeAll(ctx, s, engine.OpRefund, reqs(3), nil); err != nil {
				t.Fatal(err)
			}
			end, err := conformance.TakeAll(ctx, s, engine.OpPeek, reqs(1), nil)
			if err != nil {
				t.Fatal(err)
			}
			for i, d := range end {
				if d.Tokens != 19 || !d.Allowed {
					t.Fatalf("%s at the end: %+v, want full (19 after a peek of 1)", limits[i].Name(), d)
				}
			}
		})
	}
}
