package memory

import (
	"math/bits"

	"github.com/sluicehq/sluice"
)

// entry is one key's state, exactly one 64-byte cache line, with no
// pointers: a Take touches one line of memory and the garbage collector
// never scans the table.
//
// A key is identified by two independent 64-bit seeded hashes of its limit
// name and key (h and check) rather than by its bytes. Two keys would share
// a bucket only if both hashes collided; with n keys the chance is about
// n²/2^129, which at a billion keys is below 10^-20.
type entry struct {
	h      uint64 // 0 marks an empty entry
	check  uint64
	a, b   int64 // sluice.State.A and .B
	fullAt int64 // when the state becomes equivalent to absent (µs)
	used   int64 // last write (µs), for LRU eviction
	den    uint32
	alg    sluice.Algorithm
	_      [3]byte
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

func (t *table) home(h uint64) int {
	hi, _ := bits.Mul64(h, uint64(len(t.entries)))
	return int(hi)
}

// find returns the index of the entry for (h, check), or -1.
func (t *table) find(h, check uint64) int {
	n := len(t.entries)
	if n == 0 {
		return -1
	}
	for i := t.home(h); ; {
		e := &t.entries[i]
		if e.h == h && e.check == check {
			return i
		}
		if e.h == 0 {
			return -1
		}
		if i++; i == n {
			i = 0
		}
	}
}

// insert adds (h, check), which must be absent, and returns its index.
// limit caps the table's growth (the shard's key bound).
func (t *table) insert(h, check uint64, limit int) int {
	if (t.count+1)*8 > len(t.entries)*maxLoad {
		t.grow(limit)
	}
	n := len(t.entries)
	i := t.home(h)
	for t.entries[i].h != 0 {
		if i++; i == n {
			i = 0
		}
	}
	t.entries[i] = entry{h: h, check: check}
	t.count++
	return i
}

func (t *table) grow(limit int) {
	size := len(t.entries) * 2
	if size < 16 {
		size = 16
	}
	if ceiling := limit*8/maxLoad + 2; size > ceiling && ceiling > len(t.entries) {
		size = ceiling
	}
	old := t.entries
	t.entries = make([]entry, size)
	for i := range old {
		if e := &old[i]; e.h != 0 {
			j := t.home(e.h)
			for t.entries[j].h != 0 {
				if j++; j == size {
					j = 0
				}
			}
			t.entries[j] = *e
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
			t.entries[i] = *e
			i = j
		}
	}
	t.entries[i] = entry{}
	t.count--
}
