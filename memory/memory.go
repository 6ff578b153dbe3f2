// Package memory is sluice's in-process Store: state in this process's
// memory, sharded and lock-striped, bounded by a maximum key count.
//
// A Take on an existing key allocates nothing. Keys hash to one of a
// power-of-two number of shards, each a mutex over an index map and a slab
// of fixed-size slots, so the garbage collector sees no pointer per key.
// TakeAll locks the shards it needs in ascending order, so concurrent
// multi-limit requests never deadlock.
//
// When a shard is full, inserting evicts a sampled key: first one whose
// bucket has refilled to full (such state is equivalent to no state, so
// dropping it changes no answer), else the least recently used of the
// sample, the way Redis approximates LRU. No goroutine runs per key.
package memory

import (
	"context"
	"fmt"
	"hash/maphash"
	"strings"
	"sync"

	"github.com/sluicehq/sluice"
)

// Options configures a Store.
type Options struct {
	// MaxKeys bounds the number of keys kept (default 1,000,000).
	MaxKeys int
	// Shards is the number of lock stripes, rounded up to a power of two
	// (default 256).
	Shards int
	// Clock overrides the time source (for tests and simulations). The
	// default is the process's monotonic clock, immune to wall-clock
	// steps, read as described in clock.go.
	Clock sluice.Clock
	// PreciseClock reads the precise clock for every decision instead of
	// the coarse one for token-bucket admits (see clock.go): about 25ns
	// more per Take, for bounds that hold to the microsecond in real time.
	PreciseClock bool
}

// evictionSample is how many keys an insert into a full shard inspects.
const evictionSample = 16

// Store is the in-memory Store. The zero value is not usable; use New.
type Store struct {
	shards  []shard
	mask    uint64
	seed    maphash.Seed
	clock   sluice.Clock
	precise bool
}

type key struct {
	limit string
	key   string
}

// slot is one key's state (72 bytes). The index maps a 64-bit hash of the
// limit name and key to a slot, so a Take hashes its key once; the slot
// holds the names to confirm the match.
type slot struct {
	limit, key string
	a, b       int64 // sluice.State.A and .B
	fullAt     int64 // when the state becomes equivalent to absent (µs)
	used       int64 // last write (µs), for LRU eviction
	den        uint32
	alg        sluice.Algorithm
}

// spilled is a spill entry: the slot and the hash it shares.
type spilled struct {
	i uint32
	h uint64
}

type shard struct {
	mu  sync.Mutex
	idx map[uint64]uint32
	// spill holds the rare keys whose hash equals another held key's. A key
	// is in spill only while that other key is in idx (remove promotes), so
	// a miss in idx is a miss.
	spill map[key]spilled
	slots []slot
	free  []uint32
	logs  map[uint32][]sluice.LogEntry // sliding logs, by slot
	max   int
	_     [64]byte // keep neighbouring shards' mutexes off one cache line
}

// New returns an empty Store.
func New(opts Options) *Store {
	if opts.MaxKeys <= 0 {
		opts.MaxKeys = 1_000_000
	}
	n := 1
	want := opts.Shards
	if want <= 0 {
		want = 256
	}
	for n < want {
		n <<= 1
	}
	for n > 1 && opts.MaxKeys/n < evictionSample {
		n >>= 1
	}
	coarse.once.Do(startCoarse)
	s := &Store{shards: make([]shard, n), mask: uint64(n - 1), seed: maphash.MakeSeed(), clock: opts.Clock, precise: opts.PreciseClock}
	per := (opts.MaxKeys + n - 1) / n
	for i := range s.shards {
		s.shards[i].idx = make(map[uint64]uint32)
		s.shards[i].spill = make(map[key]spilled)
		s.shards[i].logs = make(map[uint32][]sluice.LogEntry)
		s.shards[i].max = per
	}
	return s
}

// now returns the time for a decision by alg, and whether it came from
// the coarse clock (see clock.go).
func (s *Store) now(alg sluice.Algorithm) (int64, bool) {
	switch {
	case s.clock != nil:
		return s.clock.Now().UnixMicro(), false
	case s.precise || alg == sluice.FixedWindow || alg == sluice.SlidingLog:
		return preciseNow(), false
	}
	return coarseNow(), true
}

// hash is the one hash a key is looked up by: its shard and its index entry.
func (s *Store) hash(limit, k string) uint64 {
	return maphash.String(s.seed, k) ^ maphash.String(s.seed, limit)*0x9e3779b97f4a7c15
}

// find returns k's slot in sh.
func (sh *shard) find(h uint64, limit, k string) (uint32, bool) {
	i, ok := sh.idx[h]
	if !ok {
		return 0, false
	}
	if sl := &sh.slots[i]; sl.key == k && sl.limit == limit {
		return i, true
	}
	sp, ok := sh.spill[key{limit, k}]
	return sp.i, ok
}

// Len returns the number of keys held.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.slots) - len(sh.free)
		sh.mu.Unlock()
	}
	return n
}

// Take implements sluice.Store.
func (s *Store) Take(ctx context.Context, op sluice.Op, r sluice.Request) (sluice.Decision, error) {
	ch, err := r.Charge()
	if err != nil {
		return sluice.Decision{}, err
	}
	lim := r.Limit
	p := lim.Params()
	name := lim.Name()
	take := op == sluice.OpTake
	now, early := s.now(p.Algorithm)
	h := s.hash(name, r.Key)
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	i, present := sh.find(h, name, r.Key)
	var st sluice.State
	if present {
		sl := &sh.slots[i]
		if sl.alg != p.Algorithm || sl.den != uint32(p.RateDen) {
			present = false // the limit changed shape: its old state means nothing
		} else {
			st.A, st.B = sl.a, sl.b
			if p.Algorithm == sluice.SlidingLog {
				st.Log = sh.logs[i]
			}
		}
	}
	o, write := lim.Evaluate(&st, present, r.Key, now, ch, take)
	if early && !o.Allowed && o.RetryAfter <= recheckWithin {
		// Near the boundary, the precise clock decides (see clock.go).
		now = preciseNow()
		o, write = lim.Evaluate(&st, present, r.Key, now, ch, take)
	}
	if write {
		sh.store(h, name, r.Key, i, present, &st, o, p, now)
	}
	sh.mu.Unlock()
	return lim.Decide(o), nil
}

// store writes st for the key (limit, k) with hash h; i is its slot when
// it had one.
func (sh *shard) store(h uint64, limit, k string, i uint32, had bool, st *sluice.State, o sluice.Outcome, p *sluice.Params, now int64) {
	if !had {
		if j, ok := sh.find(h, limit, k); ok {
			i, had = j, true // held under another shape of the limit: reuse
		}
	}
	if !had {
		if len(sh.slots)-len(sh.free) >= sh.max {
			sh.evict(now)
		}
		if n := len(sh.free); n > 0 {
			i = sh.free[n-1]
			sh.free = sh.free[:n-1]
		} else {
			i = uint32(len(sh.slots))
			sh.slots = append(sh.slots, slot{})
		}
		k = strings.Clone(k) // do not pin a caller's larger buffer
		sh.slots[i].limit, sh.slots[i].key = limit, k
		if _, taken := sh.idx[h]; taken {
			sh.spill[key{limit, k}] = spilled{i, h}
		} else {
			sh.idx[h] = i
		}
	}
	sl := &sh.slots[i]
	sl.a, sl.b, sl.used = st.A, st.B, now
	sl.fullAt = now + o.ResetAfter
	sl.den, sl.alg = uint32(p.RateDen), p.Algorithm
	if p.Algorithm == sluice.SlidingLog {
		sh.logs[i] = st.Log
	} else if had && len(sh.logs) > 0 {
		delete(sh.logs, i) // the limit changed from a sliding log
	}
}

// evict drops one key: the first sampled one that is already full, else the
// least recently written of the sample.
func (sh *shard) evict(now int64) {
	var vh uint64
	var vi uint32
	oldest := int64(1<<63 - 1)
	n := 0
	for h, i := range sh.idx { // map iteration starts at a random place
		sl := &sh.slots[i]
		if sl.fullAt <= now {
			vh, vi = h, i
			break
		}
		if sl.used < oldest {
			oldest, vh, vi = sl.used, h, i
		}
		if n++; n >= evictionSample {
			break
		}
	}
	sh.remove(vh, vi)
}

// remove forgets slot i, whose hash is h.
func (sh *shard) remove(h uint64, i uint32) {
	sl := &sh.slots[i]
	k := key{sl.limit, sl.key}
	if sp, ok := sh.spill[k]; ok && sp.i == i {
		delete(sh.spill, k)
	} else {
		delete(sh.idx, h)
		for sk, sp := range sh.spill { // promote a key that shared the hash
			if sp.h == h {
				delete(sh.spill, sk)
				sh.idx[h] = sp.i
				break
			}
		}
	}
	delete(sh.logs, i)
	sh.slots[i] = slot{}
	sh.free = append(sh.free, i)
}

// Reset implements sluice.Store.
func (s *Store) Reset(ctx context.Context, l *sluice.Limit, k string) error {
	if l == nil {
		return fmt.Errorf("memory reset %q: %w", k, sluice.ErrInvalidLimit)
	}
	h := s.hash(l.Name(), k)
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	if i, ok := sh.find(h, l.Name(), k); ok {
		sh.remove(h, i)
	}
	sh.mu.Unlock()
	return nil
}

// work is one request of a TakeAll with its tentative state.
type work struct {
	ch      sluice.Charge
	h       uint64
	shard   int
	k       key
	slot    uint32
	present bool
	st      sluice.State
	same    int // index of an earlier request on the same bucket, or -1
}

// TakeAll implements sluice.Store: every bucket is decided on a scratch
// copy of its state while all the shards involved are locked; the copies
// are written back only if every request was admitted.
func (s *Store) TakeAll(ctx context.Context, op sluice.Op, rs []sluice.Request) ([]sluice.Decision, error) {
	ws := make([]work, len(rs))
	for i, r := range rs {
		ch, err := r.Charge()
		if err != nil {
			return nil, fmt.Errorf("take %d of %d: %w", i+1, len(rs), err)
		}
		h := s.hash(r.Limit.Name(), r.Key)
		ws[i] = work{ch: ch, h: h, shard: int(h & s.mask), k: key{limit: r.Limit.Name(), key: r.Key}, same: -1}
		for j := 0; j < i; j++ {
			if ws[j].k == ws[i].k {
				ws[i].same = j
			}
		}
	}
	locked := s.lockAll(ws)
	defer func() {
		for _, i := range locked {
			s.shards[i].mu.Unlock()
		}
	}()
	// One precise time for all: a coarse one would need a re-decision per
	// rejection, and TakeAll is not the path where 25ns matter.
	now := preciseNow()
	if s.clock != nil {
		now = s.clock.Now().UnixMicro()
	}
	out := make([]sluice.Outcome, len(rs))
	all := true
	for i := range ws {
		w := &ws[i]
		p := rs[i].Limit.Params()
		if w.same >= 0 { // the same bucket twice: continue from the earlier copy
			prev := &ws[w.same]
			w.present, w.st, w.slot = prev.present, prev.st, prev.slot
		} else {
			sh := &s.shards[w.shard]
			if si, ok := sh.find(w.h, w.k.limit, w.k.key); ok && sh.slots[si].alg == p.Algorithm && sh.slots[si].den == uint32(p.RateDen) {
				sl := &sh.slots[si]
				w.slot, w.present = si, true
				w.st.A, w.st.B = sl.a, sl.b
				if p.Algorithm == sluice.SlidingLog {
					w.st.Log = append([]sluice.LogEntry(nil), sh.logs[si]...)
				}
			}
		}
		var written bool
		out[i], written = rs[i].Limit.Evaluate(&w.st, w.present, rs[i].Key, now, w.ch, true)
		w.present = w.present || written
		all = all && out[i].Allowed
	}
	ds := make([]sluice.Decision, len(rs))
	for i := range rs {
		if !all {
			out[i].Allowed = false
		}
		ds[i] = rs[i].Limit.Decide(out[i])
	}
	if !all || op != sluice.OpTake {
		return ds, nil
	}
	for i := range ws {
		if laterSame(ws, i) {
			continue // the last request on a bucket carries its final state
		}
		w := &ws[i]
		sh := &s.shards[w.shard]
		_, had := sh.find(w.h, w.k.limit, w.k.key)
		sh.store(w.h, w.k.limit, w.k.key, w.slot, had, &w.st, out[i], rs[i].Limit.Params(), now)
	}
	return ds, nil
}

func laterSame(ws []work, i int) bool {
	for j := i + 1; j < len(ws); j++ {
		if ws[j].same == i || ws[j].k == ws[i].k {
			return true
		}
	}
	return false
}

// lockAll locks the distinct shards of ws in ascending order, the one order
// every caller uses, and returns them.
func (s *Store) lockAll(ws []work) []int {
	ids := make([]int, 0, len(ws))
	for _, w := range ws {
		dup := false
		for _, id := range ids {
			dup = dup || id == w.shard
		}
		if !dup {
			ids = append(ids, w.shard)
		}
	}
	for i := 1; i < len(ids); i++ { // insertion sort: a handful of ids
		for j := i; j > 0 && ids[j] < ids[j-1]; j-- {
			ids[j], ids[j-1] = ids[j-1], ids[j]
		}
	}
	for _, id := range ids {
		s.shards[id].mu.Lock()
	}
	return ids
}

var _ sluice.Store = (*Store)(nil)
