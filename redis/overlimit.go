package redis

import (
	"hash/maphash"
	"sync"

	"github.com/sluicehq/sluice"
)

// overLimit remembers keys that Redis rejected: a plain take of at least
// the rejected cost cannot succeed before the rejection's RetryAfter has
// passed, because tokens only arrive with time (fixed windows only at the
// boundary, sliding logs only as entries expire). Such takes are answered
// here, without a round trip, until then.
//
// The deadline is counted from when the request was sent, not when the
// answer came back, so it never runs past the server's own: the server
// decided at or after that moment. A Reset through this store drops its
// entry; a Reset through another process, or a TakeAll refund on Cluster,
// can put tokens back sooner, and takes answered here until the deadline
// are then rejected although they would have passed: a conservative error,
// bounded by one RetryAfter. The same holds for a limit redefined under
// the same name by a configuration reload.
type overLimit struct {
	seed   maphash.Seed
	shards [16]overShard
	per    int
}

type overShard struct {
	mu sync.Mutex
	m  map[string]overEntry
}

type overEntry struct {
	at, until int64 // local microseconds
	cost      int64
	d         sluice.Decision
}

func newOverLimit(size int) *overLimit {
	c := &overLimit{seed: maphash.MakeSeed(), per: max(1, size/16)}
	for i := range c.shards {
		c.shards[i].m = make(map[string]overEntry)
	}
	return c
}

func (c *overLimit) shard(key string) *overShard {
	return &c.shards[maphash.String(c.seed, key)&15]
}

// get returns the cached rejection of key for a take of cost at now.
func (c *overLimit) get(key string, cost, now int64) (sluice.Decision, bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	e, ok := sh.m[key]
	if ok && now >= e.until {
		delete(sh.m, key)
		ok = false
	}
	sh.mu.Unlock()
	if !ok || cost < e.cost {
		return sluice.Decision{}, false
	}
	d := e.d
	d.RetryAfter = sluice.Duration(e.until - now)
	d.ResetAfter = max(0, d.ResetAfter-sluice.Duration(now-e.at))
	return d, true
}

// put records that a take of cost, sent at at, was rejected until until.
func (c *overLimit) put(key string, cost, at, until int64, d sluice.Decision) {
	sh := c.shard(key)
	sh.mu.Lock()
	if old, ok := sh.m[key]; ok && old.until > at && old.cost < cost {
		// Keep the entry that answers more requests (the smaller cost).
		sh.mu.Unlock()
		return
	}
	if len(sh.m) >= c.per {
		n := 0
		for k, e := range sh.m { // random order: expired first, else any
			if e.until <= at || n >= 8 {
				delete(sh.m, k)
				if len(sh.m) < c.per {
					break
				}
			}
			n++
		}
	}
	sh.m[key] = overEntry{at: at, until: until, cost: cost, d: d}
	sh.mu.Unlock()
}

func (c *overLimit) drop(key string) {
	sh := c.shard(key)
	sh.mu.Lock()
	delete(sh.m, key)
	sh.mu.Unlock()
}
