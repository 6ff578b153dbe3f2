package memory

import (
	"math/bits"
	"sync/atomic"

	"github.com/sluicehq/sluice/engine"
)

// entry is one key's state, exactly one 64-byte cache line, with no
// pointers: a Take touches one line of memory and the garbage collector
// never scans the table.
//
// A key is identified by two independent 64-bit seeded hashes of its limit
// name and key (h and check) rather than by its bytes. Two keys would share
// a bucket only if both hashes collided; with n keys the chance is about
// n²/2^129, which at a billion keys is below 10^-20.
//
// Decisions that change nothing (rejections, peeks) read entries without
// the shard's lock (see shard.seq), so the fields such a reader reads (h,
// check, tokens, stamp, shape, limit) are read and written with atomic
// operations.
type entry struct {
	h      uint64 // 0 marks an empty entry
	check  uint64
	tokens int64  // engine.State.Tokens
	stamp  int64  // engine.State.Stamp
	shape  uint64 // the limit's RateDen<<8 | Algorithm: the units tokens are in
	fullAt int64  // when the state becomes equivalent to absent (µs)
	prev   int64  // engine.State.Prev: a sliding window's previous count
	// limit is the capacity a fixed (or calendar) window's tokens were
	// counted under (engine.ConvertWindow); unused by other algorithms.
	limit int64
}

func shapeOf(p *engine.Params) uint64 { return uint64(p.RateDen)<<8 | uint64(p.Algorithm) }

// set overwrites e with x, field by field, for lock-free readers.
func (e *entry) set(x *entry) {
	atomic.StoreUint64(&e.h, x.h)
	atomic.StoreUint64(&e.check, x.check)
	atomic.StoreInt64(&e.tokens, x.tokens)
	atomic.StoreInt64(&e.stamp, x.stamp)
	atomic.StoreUint64(&e.shape, x.shape)
	atomic.StoreInt64(&e.limit, x.limit)
	e.fullAt, e.prev = x.fullAt, x.prev
}

// table is an open-addressing hash table with linear probing and
// backward-shift deletion (no tombstones), sized exactly rather than to a
// power of two so that a full shard wastes little memory.
type table struct {
	entries []entry
	count   int
}

// maxLoad is the fill ratio at which a table grows (in 1/8ths).
const maxLoad = 7

func (t *table) home(h uint64) int { return home(h, len(t.entries)) }

func home(h uint64, n int) int {
	hi, _ := bits.Mul64(h, uint64(n))
	return int(hi)
}

// find returns the index of the entry for (h, check), or -1.
func (t *table) find(h, check uint64) int { return find(t.entries, h, check) }

// find looks (h, check) up in entries, with atomic loads so that it may
// run without the lock (a torn result is caught by shard.seq).
func find(entries []entry, h, check uint64) int {
	n := len(entries)
	if n == 0 {
		return -1
	}
	for i, probes := home(h, n), 0; probes < n; probes++ {
		e := &entries[i]
		eh := atomic.LoadUint64(&e.h)
		if eh == h && atomic.LoadUint64(&e.check) == check {
			return i
		}
		if eh == 0 {
			return -1
		}
		if i++; i == n {
			i = 0
		}
	}
	return -1
}

// insert adds (h, check), which must be absent, and returns its index.
// limit caps the table's growth (the shard's key bound).
func (t *table) insert(h, check uint64, limit int) int {
	if (t.count+1)*8 > len(t.entries)*maxLoad {
		t.grow(limit)
	}
	i := t.free(h)
	t.entries[i].set(&entry{h: h, check: check})
	t.count++
	return i
}

// free is the first empty entry of h's probe run.
func (t *table) free(h uint64) int {
	i := t.home(h)
	for t.entries[i].h != 0 {
		if i++; i == len(t.entries) {
			i = 0
		}
	}
	return i
}

func (t *table) grow(limit int) {
	size := max(len(t.entries)*2, 16)
	if ceiling := limit*8/maxLoad + 2; size > ceiling && ceiling > len(t.entries) {
		size = ceiling
	}
	old := t.entries
	t.entries = make([]entry, size) // published by the shard after the write
	for i := range old {
		if e := &old[i]; e.h != 0 {
			t.entries[t.free(e.h)] = *e
		}
	}
}

// remove deletes the entry at i, shifting later entries of its probe run
// back so that no lookup ever needs a tombstone.
func (t *table) remove(i int) {
	n := len(t.entries)
	for j := i; ; {
		if j++; j == n {
			j = 0
		}
		e := &t.entries[j]
		if e.h == 0 {
			break
		}
		// e may move to i if its home is not cyclically within (i, j].
		k := t.home(e.h)
		if (i <= j && (k <= i || k > j)) || (i > j && k <= i && k > j) {
			t.entries[i].set(e)
			i = j
		}
	}
	t.entries[i].set(&entry{})
	t.count--
}
