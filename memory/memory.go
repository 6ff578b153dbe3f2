// Package memory is sluice's in-process Store: state in this process's
// memory, sharded and lock-striped, bounded by a maximum key count.
//
// A Take on an existing key allocates nothing. Keys hash to one of a
// power-of-two number of shards, each a mutex and a sequence lock over an
// open-addressing table of one-cache-line entries with no pointers (see
// table.go), so the garbage collector sees nothing per key. Rejections
// and peeks read without the mutex; admissions write under it. TakeAll
// locks the shards it needs in ascending order (takeall.go), so
// concurrent multi-limit requests never deadlock.
//
// When the store holds its maximum key count, inserting evicts a key whose
// bucket has refilled to full (such state is equivalent to no state, so
// dropping it changes no answer); a bucket below full is evicted only
// while no bucket of the store is full, and then the one of the new key's
// shard that becomes full soonest (see evict.go). No goroutine runs per key; one per process
// advances the coarse clock while the store is in use (see clock.go).
package memory

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/defaults"
)

// Options configures a Store.
type Options struct {
	// MaxKeys bounds the number of keys kept (default 1,000,000; the
	// memory each takes is BenchmarkBytesPerKey's, in
	// bench/README.md#memory-store-at-its-key-bound). At the bound an insert evicts a
	// key as described in evict.go.
	MaxKeys int
	// Shards is the number of lock stripes, rounded up to a power of two
	// (default 16 per GOMAXPROCS, at most 256: see defaultShards).
	Shards int
	// Clock overrides the time source (for tests and simulations). The
	// default is the process's monotonic clock, immune to wall-clock
	// steps, read as described in clock.go.
	Clock sluice.Clock
	// PreciseClock reads the precise clock for every decision instead of
	// the coarse one for token-bucket admits (see clock.go): one precise
	// clock read more per Take (BenchmarkMonotonic in the bench module),
	// for bounds that hold to the microsecond in real time. It also spares
	// the process the coarse clock's ticker, which wakes every coarseTick
	// while Takes come faster than about half a million a second, and
	// every probeEvery to probe while they come slower, each wake costing
	// a thread's wake-up (bench/results/2026-11-26.md#what-the-coarse-clock-costs-a-server-2026-11-26).
	// The servers' paths (TakeAll) read the precise clock either way.
	PreciseClock bool
}

// minShardKeys is the fewest keys a shard is sized for: a store with a
// small bound gets fewer shards.
const minShardKeys = 16

// defaultShards is the number of shards when Options.Shards is 0: 16 per
// core that may decide at once (GOMAXPROCS), so that they seldom want
// one shard's lock, up to 256. No more than that: each shard's header is
// a cache line that a decision reads first, and in a server, whose own
// work evicts them between decisions, every shard more is a miss more
// often, as frontdoor.sh's paired runs of a served gRPC call showed on
// one core (bench/results/2026-11-26.md#the-heap-floors-bound-and-counting-in-batches-2026-11-26-later).
func defaultShards() int { return min(256, 16*runtime.GOMAXPROCS(0)) }

// Store is the in-memory Store. The zero value is not usable; use New.
type Store struct {
	keys    atomic.Int64 // keys held, across shards
	maxKeys int64
	shards  []shard
	mask    uint64
	hashKey [4]uint64 // keyHashes' key, random
	clock   sluice.Clock
	precise bool
	// earliest[i] is a lower bound on the fullAt of shard i's entries
	// (see evict.go), one dense array so that an insert checks every shard
	// for a full key by reading a few cache lines.
	earliest  []atomic.Int64
	evictions evictionStats
}

type shard struct {
	mu sync.Mutex
	// seq is a sequence lock over the table: odd while a writer (holding
	// mu) changes it. A decision that changes nothing, a rejection or a
	// peek, reads the table without mu and stands only if seq was even and
	// unchanged across the read; otherwise it is decided again under mu.
	// Rejections are what an overloaded limiter mostly answers, so they
	// never wait for the lock or bounce its cache line between cores.
	seq   atomic.Uint64
	view  atomic.Pointer[[]entry] // t.entries, for lock-free readers
	t     table
	logs  map[[2]uint64][]engine.LogEntry // sliding logs, by (h, check)
	max   int                             // table sizing hint
	keys  *atomic.Int64                   // the store's key count
	calls uint32                          // decisions on the coarse clock, for refreshEvery
	// The eviction index (see evict.go).
	id        int
	cand      []candidate
	floor     int64
	earliest  *atomic.Int64 // Store.earliest[id]
	evictions *evictionStats

	// leases are the concurrency limits' held slots, by (h, check), made
	// on first use (see lease.go).
	leases map[[2]uint64][]engine.LeaseEntry

	_ [64]byte // keep neighbouring shards' mutexes off one cache line
}

// New returns an empty Store.
func New(opts Options) *Store {
	defaults.Set(&opts.MaxKeys, 1_000_000)
	n := 1
	want := opts.Shards
	defaults.Set(&want, defaultShards())
	for n < want {
		n <<= 1
	}
	for n > 1 && opts.MaxKeys/n < minShardKeys {
		n >>= 1
	}
	coarse.once.Do(startCoarse)
	s := &Store{shards: make([]shard, n), earliest: make([]atomic.Int64, n), mask: uint64(n - 1), hashKey: [4]uint64{rand.Uint64(), rand.Uint64(), rand.Uint64(), rand.Uint64()}, clock: opts.Clock, precise: opts.PreciseClock}
	s.maxKeys = int64(opts.MaxKeys)
	// A shard's table is sized for its share of the keys with room for an
	// uneven spread; the bound itself is the store-wide count.
	per := (opts.MaxKeys+n-1)/n + opts.MaxKeys/n/8 + 8
	for i := range s.shards {
		s.shards[i].view.Store(new([]entry))
		s.shards[i].logs = make(map[[2]uint64][]engine.LogEntry)
		s.shards[i].max = per
		s.shards[i].keys = &s.keys
		s.shards[i].id, s.shards[i].floor = i, noFloor
		s.shards[i].earliest, s.shards[i].evictions = &s.earliest[i], &s.evictions
		s.earliest[i].Store(noFloor)
	}
	return s
}

// now returns the time for a decision by alg, on the precise clock when
// precise is set, and whether it came from the coarse clock (see clock.go).
func (s *Store) now(alg engine.Algorithm, precise bool) (int64, bool) {
	if precise || s.clock != nil || s.precise || alg == engine.FixedWindow || alg == engine.SlidingLog || alg == engine.SlidingWindow {
		return s.preciseTime(), false
	}
	return coarseNow(), true
}

// preciseTime is the precise clock, or the test's.
func (s *Store) preciseTime() int64 {
	if s.clock != nil {
		return s.clock.Now().UnixMicro()
	}
	return preciseNow()
}

// hashes returns the two hashes that identify (l, key): h places it
// (shard and table position), check confirms it (see entry). Both mix in
// the limit's name, so one key under two limits is two buckets. The key's
// are keyHashes', one pass over its bytes for both.
func (s *Store) hashes(l *sluice.Limit, key string) (h, check uint64) {
	return keyHashes(&s.hashKey, key, l.NameID()) // inlined where a decision starts
}

// InProcess reports that the store's calls never leave the process and
// never wait on anything but its own locks, so callers need not arm a
// deadline for them (see deadline.ForStore).
func (s *Store) InProcess() bool { return true }

// Len returns the number of keys held.
func (s *Store) Len() int { return int(s.keys.Load()) }

// Evictions returns how many keys were evicted at the key bound since the
// store was created: full ones (whose state was equivalent to none) and
// partial ones (below full, evicted because no key of the store was
// full; each gave its owner back what it still owed).
func (s *Store) Evictions() (full, partial uint64) {
	return s.evictions.full.Load(), s.evictions.partial.Load()
}

// load reads the state at table index i into st, reporting whether it is
// state of p's algorithm (a limit that changed algorithm under the same
// name starts afresh; one that changed its rate keeps its state, converted:
// see loadEntry).
func (sh *shard) load(i int, p *engine.Params, st *engine.State) bool {
	if !loadEntry(sh.t.entries, i, p, st) {
		return false
	}
	if p.Algorithm == engine.SlidingLog {
		e := &sh.t.entries[i]
		st.Log = sh.logs[[2]uint64{e.h, e.check}]
	}
	st.Prev = sh.t.entries[i].prev // read under the lock: see decideUnlocked
	if p.Algorithm == engine.Concurrency {
		e := &sh.t.entries[i]
		st.Leases = sh.leases[[2]uint64{e.h, e.check}]
	}
	return true
}

// loadEntry reads the bucket state of entries[i] (i < 0: absent), with
// atomic loads so that it may run without the lock. State written under
// another rate denominator by a limit of the same name and algorithm (a
// reload that changed the rate, period or capacity) is converted to p's
// (engine.ConvertBucket): a drained key stays drained. A fixed window
// written under another capacity keeps what it used in its window
// (engine.ConvertWindow). The next write stores it in p's shape.
func loadEntry(entries []entry, i int, p *engine.Params, st *engine.State) bool {
	if i < 0 {
		return false
	}
	e := &entries[i]
	shape, want := atomic.LoadUint64(&e.shape), shapeOf(p)
	st.Tokens, st.Stamp = atomic.LoadInt64(&e.tokens), atomic.LoadInt64(&e.stamp)
	if shape == want {
		if p.Algorithm == engine.FixedWindow {
			st.Tokens = engine.ConvertWindow(p, st.Tokens, atomic.LoadInt64(&e.limit))
		}
		return true
	}
	if shape&0xff != want&0xff { // another algorithm: state of another kind
		return false
	}
	st.Tokens = engine.ConvertBucket(p, st.Tokens, int64(shape>>8))
	return true
}

// attempt is a decision made without the shard's lock.
type attempt struct {
	seq     uint64 // shard.seq when read; even
	valid   bool   // the read saw a stable table
	present bool
	i       int   // the key's entry, or -1
	tokens  int64 // the state after the decision (engine.State.Tokens)
	stamp   int64 // and engine.State.Stamp
	o       engine.Outcome
	now     int64 // the time it was decided at
	early   bool  // now is the coarse clock's
}

// decideUnlocked decides r without the lock, into at. The decision stands
// (true) when it changes nothing, a peek or a rejected take, and the table
// did not change while it was read. An admitted take needs the lock to
// write; it can reuse the attempt if the table is still unchanged once the
// lock is held. Sliding logs, whose entries live in a map, always take the
// lock.
func (sh *shard) decideUnlocked(at *attempt, lim *sluice.Limit, key string, ch engine.Charge, h, check uint64, now int64, early, take bool) bool {
	p := lim.Params()
	at.now, at.early = now, early
	at.seq = sh.seq.Load()
	// A sliding or calendar window's state holds a third number
	// (entry.prev), read under the shard's lock only.
	if p.Algorithm == engine.SlidingLog || p.Windowed() || at.seq&1 != 0 {
		return false
	}
	entries := *sh.view.Load()
	at.i = find(entries, h, check)
	var st engine.State
	at.present = loadEntry(entries, at.i, p, &st)
	if p.Algorithm == engine.FixedWindow {
		at.o, _ = engine.Evaluate(lim.Params(), &st, at.present, key, now, ch, take)
		at.tokens, at.stamp = st.Tokens, st.Stamp
	} else { // token and leaky buckets: the hot path, called directly
		next, o := engine.TakeTokenBucket(p, st.Bucket(), at.present, now, ch.Cost, ch.Reserve, ch.MaxReserved)
		at.o, at.tokens, at.stamp = o, next.Scaled, next.Stamp
	}
	at.valid = sh.seq.Load() == at.seq
	switch {
	case !at.valid || (take && at.o.Allowed):
		return false
	case !at.o.Allowed && early && at.o.RetryAfter <= recheckWithin:
		// Near the boundary the precise clock decides (see clock.go); its
		// rejection stands without the lock like any other.
		return sh.decideUnlocked(at, lim, key, ch, h, check, preciseNow(), false, take)
	}
	return true
}

// Take implements sluice.Store.
func (s *Store) Take(ctx context.Context, op engine.Op, c sluice.Charged) (sluice.Decision, error) {
	return s.take(op, c, false), nil
}

// take is Take, on the precise clock when precise is set.
func (s *Store) take(op engine.Op, c sluice.Charged, precise bool) sluice.Decision {
	o, _ := s.decideOne(op, c, precise)
	return c.Limit.Decide(o)
}

// Supports implements sluice.Store: the store computes in 64-bit
// integers, as NewLimit's bounds assume, so it takes every limit.
func (s *Store) Supports(*sluice.Limit) error { return nil }

// TakeOutcome implements sluice.OutcomeStore: Take answering in the
// algorithm's integers, from which sluice.Limiter builds the Decision.
// Its usual case, a token or leaky bucket on the coarse clock, is
// decide's hot path written out once more, so that the Limiter's call
// reaches the arithmetic through no frame but this one; every other case
// is decide's, and what the hot path does not settle is decideRest's, as
// in decide.
func (s *Store) TakeOutcome(_ context.Context, lim *sluice.Limit, key string, ch engine.Charge) (engine.Outcome, time.Duration, error) {
	var o engine.Outcome
	var now int64
	p := lim.Params()
	if w := coarse.word.Load(); (p.Algorithm != engine.TokenBucket && p.Algorithm != engine.LeakyBucket) || w&coarseFlags != 0 || s.clock != nil || s.precise {
		o, now = s.decide(engine.OpTake, &sluice.Charged{Limit: lim, Key: key, Charge: ch}, false)
	} else {
		now = w >> coarseShift
		h, check := s.hashes(lim, key)
		sh := &s.shards[h&s.mask]
		seq := sh.seq.Load()
		entries := *sh.view.Load()
		i := find(entries, h, check)
		var st engine.BucketState
		plain := true
		if i >= 0 {
			e := &entries[i]
			plain = atomic.LoadUint64(&e.shape) == shapeOf(p)
			st.Scaled, st.Stamp = atomic.LoadInt64(&e.tokens), atomic.LoadInt64(&e.stamp)
		}
		var next engine.BucketState
		if plain {
			next, o = engine.TakeTokenBucket(p, st, i >= 0, now, ch.Cost, ch.Reserve, ch.MaxReserved)
		}
		switch {
		case !plain || seq&1 != 0 || sh.seq.Load() != seq:
			o, now = s.decideRest(sh, &sluice.Charged{Limit: lim, Key: key, Charge: ch}, h, check, now, true, true)
		case o.Allowed: // to be written, under the lock
			// Field by field: a literal of the attempt is copied from a
			// zero one in static memory before its fields are written.
			var at attempt
			at.seq, at.valid, at.present, at.i = seq, true, i >= 0, i
			at.tokens, at.stamp, at.o, at.now, at.early = next.Scaled, next.Stamp, o, now, true
			o, now = s.decideLocked(sh, &at, lim, key, ch, h, check, true)
		case o.RetryAfter <= recheckWithin:
			// Near the boundary the precise clock decides (see clock.go).
			o, now = s.decideRest(sh, &sluice.Charged{Limit: lim, Key: key, Charge: ch}, h, check, preciseNow(), false, true)
		}
	}
	if o.RetryAfter <= 0 || s.clock != nil {
		return o, -1, nil
	}
	return o, sinceEpoch(now), nil
}

// Epoch implements sluice.OutcomeStore: the anchor of this package's
// clocks, from which TakeOutcome's readings count.
func (s *Store) Epoch() time.Time { return coarse.epoch }

// decideOne applies op to c, returning the outcome and the time it was
// decided at, on the precise clock when precise is set. Its results fit
// in registers, where a Decision would be returned through memory.
func (s *Store) decideOne(op engine.Op, c sluice.Charged, precise bool) (engine.Outcome, int64) {
	return s.decide(op, &c, precise)
}

// decide is decideOne of the Charged at c: a Charged is too large to
// be kept in registers, so a function handed one by value stores it in
// its frame, and a caller lends the one it holds (TakeOutcome builds
// one only off its hot path).
func (s *Store) decide(op engine.Op, c *sluice.Charged, precise bool) (engine.Outcome, int64) {
	lim := c.Limit
	p := lim.Params()
	bucket := p.Algorithm == engine.TokenBucket || p.Algorithm == engine.LeakyBucket
	var now int64
	var early bool
	if w := coarse.word.Load(); bucket && w&coarseFlags == 0 && !precise && s.clock == nil && !s.precise {
		now, early = w>>coarseShift, true // s.now's usual answer, without its calls
	} else {
		now, early = s.now(p.Algorithm, precise)
	}
	h, check := s.hashes(lim, c.Key)
	sh := &s.shards[h&s.mask]
	if op == engine.OpRefund {
		o, now := s.refund(sh, lim, c.Key, c.Charge, h, check)
		return o, now
	}
	if bucket {
		// The hot path: decideUnlocked's work for a bucket whose state
		// needs no conversion, written out here, so that a decision that
		// stands without the lock calls nothing but the arithmetic.
		seq := sh.seq.Load()
		entries := *sh.view.Load()
		i := find(entries, h, check)
		var st engine.BucketState
		plain := true
		if i >= 0 {
			e := &entries[i]
			plain = atomic.LoadUint64(&e.shape) == shapeOf(p)
			st.Scaled, st.Stamp = atomic.LoadInt64(&e.tokens), atomic.LoadInt64(&e.stamp)
		}
		if plain {
			next, o := engine.TakeTokenBucket(p, st, i >= 0, now, c.Cost, c.Reserve, c.MaxReserved)
			if seq&1 == 0 && sh.seq.Load() == seq {
				switch {
				case op == engine.OpTake && o.Allowed: // to be written, under the lock
					at := attempt{seq: seq, valid: true, present: i >= 0, i: i, tokens: next.Scaled, stamp: next.Stamp, o: o, now: now, early: early}
					o, now := s.decideLocked(sh, &at, lim, c.Key, c.Charge, h, check, true)
					return o, now
				case o.Allowed || !early || o.RetryAfter > recheckWithin:
					return o, now
				}
				// Near the boundary the precise clock decides (see clock.go).
				now, early = preciseNow(), false
			}
		}
	}
	o, now := s.decideRest(sh, c, h, check, now, early, op == engine.OpTake)
	return o, now
}

// decideRest is decide for the key (h, check) of sh at now after its hot
// path: the decision without the lock (decideUnlocked), and under it
// when that does not stand.
func (s *Store) decideRest(sh *shard, c *sluice.Charged, h, check uint64, now int64, early, take bool) (engine.Outcome, int64) {
	var at attempt
	if sh.decideUnlocked(&at, c.Limit, c.Key, c.Charge, h, check, now, early, take) {
		return at.o, at.now
	}
	o, now := s.decideLocked(sh, &at, c.Limit, c.Key, c.Charge, h, check, take)
	return o, now
}

// decideLocked is decideOne under the shard's lock, after the attempt at
// (decideUnlocked) did not stand: it writes an admitted take, reusing at
// when the table is unchanged since it was read. Apart from decideOne, so
// that a decision that stands without the lock pays for none of its frame.
func (s *Store) decideLocked(sh *shard, at *attempt, lim *sluice.Limit, key string, ch engine.Charge, h, check uint64, take bool) (engine.Outcome, int64) {
	p := lim.Params()
	now, early := at.now, at.early
	var force bool
	for {
		sh.mu.Lock()
		i, st, o, write := at.i, engine.State{Tokens: at.tokens, Stamp: at.stamp}, at.o, true
		if !at.valid || sh.seq.Load() != at.seq { // the attempt is stale: decide again
			if early {
				// Every refreshEvery-th locked decision of a shard reads the
				// precise clock, which also brings the coarse clock forward
				// when the ticker is late (a busy process): staleness stays
				// bounded by traffic, not by when the ticker gets a CPU.
				if sh.calls++; sh.calls%refreshEvery == 0 {
					now, early = preciseNow(), false
				}
			}
			i = sh.t.find(h, check)
			st = engine.State{}
			present := sh.load(i, p, &st)
			o, write = engine.Evaluate(lim.Params(), &st, present, key, now, ch, take)
			if early && !o.Allowed && o.RetryAfter <= recheckWithin {
				// Near the boundary, the precise clock decides (see clock.go).
				now = preciseNow()
				o, write = engine.Evaluate(lim.Params(), &st, present, key, now, ch, take)
			}
		}
		if write && i < 0 {
			if need := s.room(sh, now, nil, force); need != roomMade {
				// Another shard may hold a full key: free one there, with
				// no lock held, and decide again.
				sh.mu.Unlock()
				force = !s.reclaim(now, need, sh.id, nil)
				at.valid = false
				continue
			}
		}
		if write {
			sh.store(i, h, check, &st, o, p, now)
		}
		sh.mu.Unlock()
		return o, now
	}
}

// refund gives ch.Cost back to the key (h, check) of sh (see
// engine.OpRefund), at the precise time: a refund is no hot path.
func (s *Store) refund(sh *shard, lim *sluice.Limit, key string, ch engine.Charge, h, check uint64) (engine.Outcome, int64) {
	p := lim.Params()
	now := s.preciseTime()
	var force bool
	for {
		sh.mu.Lock()
		i := sh.t.find(h, check)
		var st engine.State
		present := sh.load(i, p, &st)
		o, write := engine.Refund(lim.Params(), &st, present, key, now, ch)
		if write && i < 0 { // not so today: a refund of an absent key writes nothing
			if need := s.room(sh, now, nil, force); need != roomMade {
				sh.mu.Unlock()
				force = !s.reclaim(now, need, sh.id, nil)
				continue
			}
		}
		if write {
			sh.store(i, h, check, &st, o, p, now)
		}
		sh.mu.Unlock()
		return o, now
	}
}

// Results of Store.room.
const (
	roomMade      = iota // a key is reserved for the insert
	roomFull             // another shard may hold a full key: reclaim it
	roomElsewhere        // the locked shards hold nothing to evict: evict in another
)

// room reserves one key of the store's bound for an insert into sh, whose
// lock the caller holds (with the locks of held, for a TakeAll), evicting
// to make one: a full key of the locked shards if there is one; else, if
// no other shard may hold a full key, the key of sh (or of another locked
// shard) that becomes full soonest. Keys of keep are never evicted. force
// reserves past the bound (see reclaim).
func (s *Store) room(sh *shard, now int64, held []int, force bool) int {
	return s.roomKeep(sh, now, held, nil, force)
}

func (s *Store) roomKeep(sh *shard, now int64, held []int, keep []work, force bool) int {
	for {
		if n := s.keys.Load(); n < s.maxKeys || force {
			if s.keys.CompareAndSwap(n, n+1) {
				return roomMade
			}
			continue
		}
		if s.evictHeld(sh, now, held, keep, false) {
			continue
		}
		if s.fullElsewhere(now, sh.id, held) {
			return roomFull
		}
		if !s.evictHeld(sh, now, held, keep, true) {
			return roomElsewhere
		}
	}
}

// evictHeld evicts a key (see shard.evict) of sh or, failing that, of
// another shard of held.
func (s *Store) evictHeld(sh *shard, now int64, held []int, keep []work, partial bool) bool {
	if sh.evict(now, keep, partial) {
		return true
	}
	for _, id := range held {
		if o := &s.shards[id]; o != sh && o.evict(now, keep, partial) {
			return true
		}
	}
	return false
}

// fullElsewhere reports whether a shard other than id and held may hold a
// full key.
func (s *Store) fullElsewhere(now int64, id int, held []int) bool {
	st := &s.evictions
	if st.noneFullBefore(now) {
		return false
	}
	g, m := st.lowered.Load(), int64(noFloor)
	for j := range s.earliest {
		e := s.earliest[j].Load()
		if e <= now && j != id && !slices.Contains(held, j) {
			return true
		}
		m = min(m, e)
	}
	st.setHint(m, g)
	return false
}

// reclaim is called with no lock held, after room found that another
// shard may hold a full key (need roomFull) or that the locked shards had
// nothing to evict (roomElsewhere). It evicts a full key of the first
// shard, other than id, found to have one; failing that, for
// roomElsewhere, the key that becomes full soonest of the shard whose
// keys become full soonest. Keys of keep (the request's own) are never
// evicted. It returns false when there was nothing to evict anywhere: the
// keys of one request alone are at the bound, and the caller may pass it.
func (s *Store) reclaim(now int64, need, id int, keep []work) bool {
	for k := 1; k < len(s.shards); k++ {
		j := (id + k) & int(s.mask)
		if s.earliest[j].Load() > now {
			continue
		}
		o := &s.shards[j]
		o.mu.Lock()
		freed := o.evict(now, keep, false)
		o.mu.Unlock()
		if freed {
			return true
		}
	}
	if need == roomFull {
		return true // every shard's bound is exact now: room evicts a partial key
	}
	tried := make([]bool, len(s.shards)) // a rare path: a store at its bound with nothing to evict where the key goes
	for {
		best, at := -1, int64(noFloor)
		for j := range s.shards {
			if e := s.earliest[j].Load(); !tried[j] && e < at {
				best, at = j, e
			}
		}
		if best < 0 {
			return false // no shard holds a key
		}
		tried[best] = true
		o := &s.shards[best]
		o.mu.Lock()
		freed := o.evict(now, keep, false) || o.evict(now, keep, true)
		o.mu.Unlock()
		if freed {
			return true
		}
	}
}

// store writes st for (h, check), whose table index is i or -1 if absent;
// an insert uses the key room reserved.
func (sh *shard) store(i int, h, check uint64, st *engine.State, o engine.Outcome, p *engine.Params, now int64) {
	sh.seq.Add(1) // odd: lock-free readers retry under the lock
	if i < 0 {
		n := len(sh.t.entries)
		i = sh.t.insert(h, check, sh.max)
		if len(sh.t.entries) != n { // grown: publish the new table
			entries := sh.t.entries
			sh.view.Store(&entries)
		}
	}
	e, shape, full := &sh.t.entries[i], shapeOf(p), now+o.ResetAfter
	if e.shape == shape { // the common write: the state of a key already held
		// Atomic stores are full barriers on amd64: write only what changes.
		atomic.StoreInt64(&e.tokens, st.Tokens)
		atomic.StoreInt64(&e.stamp, st.Stamp)
		if p.Algorithm == engine.FixedWindow && e.limit != p.Capacity {
			atomic.StoreInt64(&e.limit, p.Capacity)
		}
		e.fullAt, e.prev = full, st.Prev
	} else {
		e.set(&entry{h: h, check: check, tokens: st.Tokens, stamp: st.Stamp, shape: shape, fullAt: full, prev: st.Prev, limit: p.Capacity})
	}
	if full < sh.floor { // an entry the eviction index must know of (see evict.go)
		sh.note(candidate{fullAt: full, h: h, check: check})
	}
	if p.Algorithm == engine.SlidingLog {
		sh.logs[[2]uint64{h, check}] = st.Log
	} else if len(sh.logs) > 0 {
		delete(sh.logs, [2]uint64{h, check}) // the limit was a sliding log before
	}
	sh.storeLeases(h, check, p, st.Leases)
	// Even again, at the end rather than deferred: a panic here leaves
	// the shard's mutex held, which no even sequence would undo.
	sh.seq.Add(1)
}

func (sh *shard) remove(i int) {
	e := &sh.t.entries[i]
	if len(sh.logs) > 0 {
		delete(sh.logs, [2]uint64{e.h, e.check})
	}
	if len(sh.leases) > 0 {
		delete(sh.leases, [2]uint64{e.h, e.check})
	}
	sh.t.remove(i)
	sh.keys.Add(-1)
}

// Reset implements sluice.Store.
func (s *Store) Reset(ctx context.Context, l *sluice.Limit, k string) error {
	if l == nil {
		return fmt.Errorf("memory reset %q: %w", k, sluice.ErrInvalidLimit)
	}
	h, check := s.hashes(l, k)
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	if i := sh.t.find(h, check); i >= 0 {
		sh.seq.Add(1)
		sh.remove(i)
		sh.seq.Add(1)
	}
	sh.mu.Unlock()
	return nil
}

var _ sluice.Store = (*Store)(nil)
