package memory

import (
	"cmp"
	"math"
	"slices"
	"sync/atomic"
)

// Eviction.
//
// At its key bound the store must drop a key to take a new one, and which
// one decides whether the bound costs anything. A key whose bucket has
// refilled to full (fullAt <= now) is equivalent to no state: dropping it
// changes no answer. A key below full is not: dropping it gives its owner
// a full bucket back, an over-admission of what it still owed. So:
//
//   - A key below full is never evicted while any key of the store is
//     full (the keys of the request making room aside: a TakeAll never
//     evicts its own). Full keys go first, from any shard.
//   - When no key is full, the key of the inserting shard that becomes
//     full soonest goes (the earliest fullAt: the least time owed); it is
//     counted as a partial eviction.
//
// Recency plays no part: a client that is being rejected keeps its bucket
// because the bucket is below full, not because it was seen lately (a
// rejection writes nothing, see shard.seq).
//
// Finding full keys without scanning every table on every insert: each
// shard keeps an index of its entries with the earliest fullAt. cand
// holds up to maxCandidates (fullAt, key) records, sorted by fullAt, all
// at or below floor, and every entry's fullAt is at least floor or at
// least one of its records; records may be stale (the entry was rewritten
// or removed since) and are checked against the table when used. So the
// first valid record is the shard's earliest fullAt. A write whose fullAt
// is below floor adds a record (store); most writes are admitted takes,
// which only move a bucket's fullAt later, and leave the index alone.
// When the records run out (used by evictions, or found stale), sweep
// scans the shard once and rebuilds cand and floor exactly: its cost is
// spread over at least maxCandidates evictions or rewrites.
//
// Each shard publishes min(cand, floor), a lower bound on its entries'
// fullAt, in Store.earliest: an insert into a shard with no full key finds
// there (or in a hint that stands until some shard's bound comes down)
// whether another shard may hold one. If so, the insert releases its
// locks, evicts a full key of that shard (reclaim) and decides again:
// locks are only ever taken in ascending order or one at a time. One
// eviction per insert keeps each shard's table near its share of the keys.

// maxCandidates is the size of a shard's eviction index.
const maxCandidates = 64

// candidate records that the entry (h, check) becomes full at fullAt.
type candidate struct {
	fullAt   int64
	h, check uint64
}

// evictionStats counts evictions by the state of the bucket evicted, and
// holds what the shards share about the times their keys become full.
type evictionStats struct {
	full, partial atomic.Uint64
	// lowered counts the times a shard published an earlier bound in
	// Store.earliest. A pass over every shard's bound that saw no such
	// change while it ran leaves its minimum in hint, good for as long as
	// lowered stays the same: an insert then knows that no key is full
	// before that time by reading a few words instead of every shard's.
	lowered atomic.Uint64
	hintSeq atomic.Uint64 // a sequence lock over hintMin, hintGen: odd while written
	hintMin atomic.Int64
	hintGen atomic.Uint64
}

// noFloor is floor while every entry has a record in cand.
const noFloor = math.MaxInt64

// low is a lower bound on the fullAt of every entry of the shard.
func (sh *shard) low() int64 {
	if len(sh.cand) > 0 {
		return min(sh.cand[0].fullAt, sh.floor)
	}
	return sh.floor
}

func (sh *shard) publish() {
	v := sh.low()
	old := sh.earliest.Load()
	sh.earliest.Store(v)
	if v < old {
		sh.evictions.lowered.Add(1) // after the store: see noneFullBefore
	}
}

// noneFullBefore reports whether hint proves every key of the store to be
// below full at now (fullAt > now).
func (st *evictionStats) noneFullBefore(now int64) bool {
	seq := st.hintSeq.Load()
	if seq&1 != 0 {
		return false
	}
	m, g := st.hintMin.Load(), st.hintGen.Load()
	return st.hintSeq.Load() == seq && g == st.lowered.Load() && m > now
}

// setHint records m, the minimum of every shard's bound read after
// lowered was g. One writer at a time; a writer that finds another at work
// leaves the hint to it.
func (st *evictionStats) setHint(m int64, g uint64) {
	seq := st.hintSeq.Load()
	if seq&1 != 0 || !st.hintSeq.CompareAndSwap(seq, seq+1) {
		return
	}
	st.hintMin.Store(m)
	st.hintGen.Store(g)
	st.hintSeq.Store(seq + 2)
}

// note records that (h, check) was written with fullAt below floor.
func (sh *shard) note(c candidate) {
	sh.add(c)
	sh.publish()
}

// add puts c in cand, in order; when cand is at capacity the latest record
// goes instead and floor comes down to it.
func (sh *shard) add(c candidate) {
	if sh.cand == nil {
		sh.cand = make([]candidate, 0, maxCandidates)
	}
	n := len(sh.cand)
	if n == maxCandidates {
		last := sh.cand[n-1].fullAt
		if c.fullAt >= last {
			sh.floor = min(sh.floor, c.fullAt)
			return
		}
		sh.floor = min(sh.floor, last)
		n--
		sh.cand = sh.cand[:n]
	}
	// After every record not later than c: equal fullAt keep their order.
	at, _ := slices.BinarySearchFunc(sh.cand, c.fullAt, func(x candidate, t int64) int {
		if x.fullAt <= t {
			return -1
		}
		return 1
	})
	sh.cand = slices.Insert(sh.cand, at, c)
}

// drop removes record j from cand.
func (sh *shard) drop(j int) {
	copy(sh.cand[j:], sh.cand[j+1:])
	sh.cand = sh.cand[:len(sh.cand)-1]
}

// kept reports whether (h, check) is one of the keys a TakeAll in progress
// is deciding: those are about to be written and are never evicted by it.
func kept(keep []work, h, check uint64) bool {
	return slices.ContainsFunc(keep, func(w work) bool { return w.h == h && w.check == check })
}

// head returns the record index and table index of the entry with the
// earliest fullAt among those with a valid record, kept ones aside, or
// -1s when there is none; stale records are dropped or corrected on the
// way.
func (sh *shard) head(keep []work) (j, i int) {
	for j = 0; j < len(sh.cand); {
		c := sh.cand[j]
		i = sh.t.find(c.h, c.check)
		switch {
		case i < 0: // removed since
			sh.drop(j)
		case sh.t.entries[i].fullAt != c.fullAt: // rewritten since
			sh.drop(j)
			if f := sh.t.entries[i].fullAt; f < sh.floor {
				sh.add(candidate{fullAt: f, h: c.h, check: c.check})
			}
		case kept(keep, c.h, c.check):
			j++
		default:
			return j, i
		}
	}
	return -1, -1
}

// evict removes the entry of the shard that the index finds first, kept
// ones aside, and reports whether there was one. Without partial that is
// a full entry (fullAt <= now) or none; with it, for a caller that found
// no full entry anywhere, the entry that becomes full soonest. One
// eviction per insert, from the inserting shard when it can, keeps the
// shards' tables near their share of the keys.
func (sh *shard) evict(now int64, keep []work, partial bool) bool {
	sh.seq.Add(1) // odd: lock-free readers retry under the lock
	defer sh.seq.Add(1)
	defer sh.publish()
	if partial {
		now = math.MaxInt64 // any entry will do
	}
	j, i := sh.head(keep)
	if (j < 0 || sh.cand[j].fullAt > now) && sh.floor <= now && (!partial || sh.t.count > 0) {
		// An entry without a record may be full, or the index ran dry:
		// rebuild it.
		sh.sweep()
		j, i = sh.head(keep)
	}
	// Without a full entry at the head, the shard holds none: every other
	// entry becomes full no sooner than the head or floor.
	if j < 0 || sh.cand[j].fullAt > now {
		return false
	}
	sh.drop(j)
	sh.remove(i)
	if partial {
		sh.evictions.partial.Add(1)
	} else {
		sh.evictions.full.Add(1)
	}
	return true
}

// sweep rebuilds the index exactly from a pass over the shard's table:
// the maxCandidates entries with the earliest fullAt (kept ones among
// them, so that none is lost from the index), and floor, the earliest
// fullAt of the others. The pass keeps the records in a max-heap, sorted
// once at the end.
func (sh *shard) sweep() {
	if sh.cand == nil {
		sh.cand = make([]candidate, 0, maxCandidates)
	}
	c, rest := sh.cand[:0], int64(noFloor)
	for k := range sh.t.entries {
		e := &sh.t.entries[k]
		if e.h == 0 {
			continue
		}
		x := candidate{fullAt: e.fullAt, h: e.h, check: e.check}
		switch {
		case len(c) < maxCandidates:
			c = append(c, x)
			if len(c) == maxCandidates {
				for i := len(c)/2 - 1; i >= 0; i-- {
					siftDown(c, i)
				}
			}
		case x.fullAt >= c[0].fullAt:
			rest = min(rest, x.fullAt)
		default:
			rest = min(rest, c[0].fullAt)
			c[0] = x
			siftDown(c, 0)
		}
	}
	slices.SortFunc(c, func(a, b candidate) int { return cmp.Compare(a.fullAt, b.fullAt) })
	sh.cand, sh.floor = c, rest
}

// siftDown restores the max-heap order of c below i.
func siftDown(c []candidate, i int) {
	for {
		l := 2*i + 1
		if l >= len(c) {
			return
		}
		if r := l + 1; r < len(c) && c[r].fullAt > c[l].fullAt {
			l = r
		}
		if c[i].fullAt >= c[l].fullAt {
			return
		}
		c[i], c[l] = c[l], c[i]
		i = l
	}
}
