package insight

import (
	"cmp"
	"hash/maphash"
	"slices"
)

// Item is what the heavy-hitters rankings count: one bucket, named by its
// limit ("per-ip", or "api.free" for a tier) and its key.
type Item struct {
	Limit, Key string
}

// spaceSaving is the Space-Saving heavy-hitters summary (Metwally,
// Agrawal and El Abbadi, "Efficient Computation of Frequent and Top-k
// Elements in Data Streams", 2005) with k counters: fixed memory whatever
// the number of distinct items.
//
// An item with a counter has a count that overestimates its true count
// by at most err, and err is at most N/k, where N is the total weight
// added: the counter it took over was the smallest, and the k counters
// sum to N, so the smallest is at most N/k. Every item whose true count
// exceeds N/k has a counter. An item without one has a true count of at
// most the smallest counter (min, also at most N/k).
//
// It is not safe for concurrent use; the Collector locks it.
//
// The counters sit in slots that never move; the heap orders slot
// numbers, so that keeping it in order moves small integers. Items find
// their slot through an open-addressing table of a fixed size (twice k,
// linear probing, deletion by backward shift, no tombstones): the
// decision path never allocates, however the items churn.
type spaceSaving struct {
	k     int
	slots []counter // the counted items (their counts are in heap)
	hash  []uint64  // each slot's item's hash
	heap  []node    // a min-heap on count
	pos   []int32   // each slot's position in heap
	table []int32   // slot number + 1 by hash, 0 for none
	mask  uint64
	total uint64 // N
}

// counter is one monitored item: its count is an upper bound of its true
// count, count-err a lower bound.
type counter struct {
	item  Item
	count uint64 // filled in by counter(); heap holds the live one
	err   uint64
}

// node is a place in the heap: a slot's count, kept beside it so that
// ordering the heap reads one array.
type node struct {
	count uint64
	slot  int32
}

// seed keys the table's hashes: random per process, so that no client
// can choose keys that collide in it.
var seed = maphash.MakeSeed()

func hashItem(it Item) uint64 {
	return maphash.String(seed, it.Limit)*0x9e3779b97f4a7c15 ^ maphash.String(seed, it.Key)
}

func newSpaceSaving(k int) *spaceSaving {
	size := 1
	for size < 2*k {
		size *= 2
	}
	return &spaceSaving{
		k: k, slots: make([]counter, 0, k), hash: make([]uint64, 0, k), heap: make([]node, 0, k), pos: make([]int32, 0, k),
		table: make([]int32, size), mask: uint64(size - 1),
	}
}

// find returns it's slot and where the table holds it, or, when it has
// none, -1 and the free place it would take.
func (s *spaceSaving) find(it Item, h uint64) (slot int32, at uint64) {
	for i := h & s.mask; ; i = (i + 1) & s.mask {
		v := s.table[i]
		if v == 0 {
			return -1, i
		}
		if s.hash[v-1] == h && s.slots[v-1].item == it {
			return v - 1, i
		}
	}
}

// remove empties the table's place at, moving back the entries after it
// that probed past it, so that every entry stays reachable from its hash.
func (s *spaceSaving) remove(at uint64) {
	for {
		s.table[at] = 0
		j := at
		for {
			j = (j + 1) & s.mask
			v := s.table[j]
			if v == 0 {
				return
			}
			// The entry at j stays unless its home lies cyclically
			// outside (at, j]: then it probed past at, and moves there.
			home := s.hash[v-1] & s.mask
			if (j > at && (home <= at || home > j)) || (j < at && home <= at && home > j) {
				s.table[at] = v
				at = j
				break
			}
		}
	}
}

// add counts w more for it.
func (s *spaceSaving) add(it Item, w uint64) {
	s.total += w
	h := hashItem(it)
	slot, at := s.find(it, h)
	if slot >= 0 {
		i := s.pos[slot]
		s.heap[i].count += w
		s.down(int(i))
		return
	}
	if len(s.slots) < s.k {
		slot = int32(len(s.slots))
		s.slots = append(s.slots, counter{item: it})
		s.hash = append(s.hash, h)
		s.heap = append(s.heap, node{count: w, slot: slot})
		s.pos = append(s.pos, int32(len(s.heap)-1))
		s.table[at] = slot + 1
		s.up(len(s.heap) - 1)
		return
	}
	// Take over the smallest counter: it keeps its count (the new item
	// may have been seen that often while unmonitored), which becomes the
	// new item's error.
	slot, minc := s.heap[0].slot, s.heap[0].count
	c := &s.slots[slot]
	_, old := s.find(c.item, s.hash[slot])
	s.remove(old)
	*c = counter{item: it, err: minc}
	s.heap[0].count = minc + w
	s.hash[slot] = h
	_, at = s.find(it, h)
	s.table[at] = slot + 1
	s.down(0)
}

// min is the smallest count while every counter is in use (an item
// without a counter was seen at most that often), else 0.
func (s *spaceSaving) min() uint64 {
	if len(s.slots) < s.k || len(s.slots) == 0 {
		return 0
	}
	return s.heap[0].count
}

// counter returns slot's counter with its count.
func (s *spaceSaving) counter(slot int32) counter {
	c := s.slots[slot]
	c.count = s.heap[s.pos[slot]].count
	return c
}

// lookup returns it's counter, if it has one.
func (s *spaceSaving) lookup(it Item) (counter, bool) {
	if slot, _ := s.find(it, hashItem(it)); slot >= 0 {
		return s.counter(slot), true
	}
	return counter{}, false
}

// clone copies s, so that a snapshot ranks the copy without holding the
// lock that decisions wait on.
func (s *spaceSaving) clone() *spaceSaving {
	c := *s
	c.slots, c.hash, c.heap, c.pos, c.table = slices.Clone(s.slots), slices.Clone(s.hash), slices.Clone(s.heap), slices.Clone(s.pos), slices.Clone(s.table)
	return &c
}

func (s *spaceSaving) reset() {
	s.slots, s.hash, s.heap, s.pos = s.slots[:0], s.hash[:0], s.heap[:0], s.pos[:0]
	clear(s.table)
	s.total = 0
}

func (s *spaceSaving) less(i, j int) bool { return s.heap[i].count < s.heap[j].count }

func (s *spaceSaving) swap(i, j int) {
	s.heap[i], s.heap[j] = s.heap[j], s.heap[i]
	s.pos[s.heap[i].slot] = int32(i)
	s.pos[s.heap[j].slot] = int32(j)
}

func (s *spaceSaving) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *spaceSaving) down(i int) {
	n := len(s.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		c := l
		if r := l + 1; r < n && s.less(r, l) {
			c = r
		}
		if !s.less(c, i) {
			return
		}
		s.swap(i, c)
		i = c
	}
}

// HotKey is one item of a ranking. Its true count over the ranking's
// period lies within [Count-Error, Count+Error] (see Ranking).
type HotKey struct {
	Item
	Count, Error uint64
}

// merged ranks the items of two summaries of consecutive periods by their
// summed counts, the n largest first. An item absent from one summary
// contributes nothing to its count from there and that summary's min to
// its Error, as a counted item contributes its err: so Error is at most
// (N1+N2)/k, the bound of one summary of both periods.
func merged(a, b *spaceSaving, n int) []HotKey {
	seen := make(map[Item]bool, len(a.slots)+len(b.slots))
	var out []HotKey
	for _, s := range []*spaceSaving{a, b} {
		for slot := range s.slots {
			c := s.counter(int32(slot))
			if seen[c.item] {
				continue
			}
			seen[c.item] = true
			h := HotKey{Item: c.item}
			for _, t := range []*spaceSaving{a, b} {
				if tc, ok := t.lookup(c.item); ok {
					h.Count += tc.count
					h.Error += tc.err
				} else {
					h.Error += t.min()
				}
			}
			out = append(out, h)
		}
	}
	slices.SortFunc(out, func(x, y HotKey) int {
		if c := cmp.Compare(y.Count, x.Count); c != 0 {
			return c
		}
		if c := cmp.Compare(x.Limit, y.Limit); c != 0 {
			return c
		}
		return cmp.Compare(x.Key, y.Key)
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}
