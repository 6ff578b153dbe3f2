package redis

import (
	"hash/maphash"
	"sync"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// overLimit remembers keys that Redis rejected: a plain take of at least
// the rejected cost cannot succeed before the rejection's RetryAfter has
// passed, because tokens only arrive with time (fixed windows only at the
// boundary, sliding logs only as entries expire). Such takes (Take, and a
// TakeAll of one request) are answered here, without a round trip, until
// then.
//
// The deadline is counted from when the request was sent, not when the
// answer came back, so it never runs past the server's own: the server
// decided at or after that moment. A Reset or a refund (engine.OpRefund)
// through this store drops its entry once Redis has applied it, and a
// rejection decided before that is not cached after it: every drop bumps
// its shard's generation, which put compares with the one get saw before
// the take was sent. A Reset or refund through another store on the same
// Redis (another process of a fleet), or a TakeAll rolled back on
// Cluster, reaches this cache as a published message (see drops.go): until
// it arrives, a round trip later, takes answered here are rejected
// although they would have passed. That conservative error is bounded by
// one RetryAfter when a message is lost.
type overLimit struct {
	seed   maphash.Seed
	shards [16]overShard
	per    int
}

type overShard struct {
	mu  sync.Mutex
	gen uint64 // bumped by every drop
	m   map[string]overEntry
}

type overEntry struct {
	at, until int64 // local microseconds
	cost      int64
	lim       *sluice.Limit // the limit Redis decided with
	d         sluice.Decision
}

func newOverLimit(size int) *overLimit {
	c := &overLimit{seed: maphash.MakeSeed(), per: max(1, size/16)}
	for i := range c.shards {
		c.shards[i].m = make(map[string]overEntry)
	}
	return c
}

func (c *overLimit) shard(key string) *overShard { return &c.shards[maphash.String(c.seed, key)&15] }

// get returns the cached rejection of key for a take of cost at now, and
// the generation to pass to put if the take is sent to Redis instead.
//
// An entry answers only takes of the limit it was decided with: a
// configuration reload makes new limits (perhaps with the same names and
// so the same keys, but other rates), whose takes go to Redis.
func (c *overLimit) get(key string, lim *sluice.Limit, cost, now int64) (sluice.Decision, uint64, bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	gen := sh.gen
	e, ok := sh.m[key]
	if ok && now >= e.until {
		delete(sh.m, key)
		ok = false
	}
	sh.mu.Unlock()
	if !ok || cost < e.cost || e.lim != lim {
		return sluice.Decision{}, gen, false
	}
	d := e.d
	d.RetryAfter = engine.Duration(e.until - now)
	d.ResetAfter = max(0, d.ResetAfter-engine.Duration(now-e.at))
	return d, gen, true
}

// put records that a take of cost, sent at at, was rejected until until.
// gen is what get returned before the take was sent: if the shard has
// seen a drop since, the rejection may predate a refund or a Reset of
// key, and is not recorded.
func (c *overLimit) put(key string, lim *sluice.Limit, gen uint64, cost, at, until int64, d sluice.Decision) {
	sh := c.shard(key)
	sh.mu.Lock()
	if sh.gen != gen {
		sh.mu.Unlock()
		return
	}
	if old, ok := sh.m[key]; ok && old.until > at && old.cost < cost && old.lim == lim {
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
	sh.m[key] = overEntry{at: at, until: until, cost: cost, lim: lim, d: d}
	sh.mu.Unlock()
}

// drop forgets the entries of keys, and keeps rejections decided before
// from being put after (see put). A store without a cache has nil.
func (c *overLimit) drop(keys ...string) {
	if c == nil {
		return
	}
	for _, key := range keys {
		sh := c.shard(key)
		sh.mu.Lock()
		sh.gen++
		delete(sh.m, key)
		sh.mu.Unlock()
	}
}

// clear forgets every entry, as if each had been dropped.
func (c *overLimit) clear() {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		sh.gen++
		clear(sh.m)
		sh.mu.Unlock()
	}
}
