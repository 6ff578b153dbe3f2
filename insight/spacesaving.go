package insight

import (
	"cmp"
	"hash/maphash"
	"slices"
	"strings"
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
// It is kept as the paper's Stream-Summary, so that counting one more is
// a constant number of steps whatever the counts: the counters are in
// buckets of equal count, the buckets in a list by count, the smallest
// first; one more moves a counter to the next bucket. Items find their
// counter through an open-addressing table of twice k places (linear
// probing, deletion by backward shift, no tombstones). Everything is
// allocated up front as arrays of k, linked by index: the decision path
// allocates nothing, however the items churn, but the copy of a key that
// takes a counter (see add).
type spaceSaving struct {
	k int
	n int // counters in use

	// By counter (slot): its item and error, its item's hash, its bucket
	// and its neighbours there.
	slots        []counter
	hash         []uint64
	bucket       []int32
	snext, sprev []int32

	// By bucket: its count, its first counter, its neighbours in the list
	// (bnext also chains the free buckets).
	bcount       []uint64
	bfirst       []int32
	bnext, bprev []int32
	head, free   int32 // the smallest bucket; the first free one

	table []int32 // slot + 1 by hash, 0 for none
	mask  uint64
	total uint64 // N
}

// counter is one monitored item: its count is an upper bound of its true
// count, count-err a lower bound.
type counter struct {
	item  Item
	count uint64 // filled in by counter(); the bucket holds the live one
	err   uint64
}

// none is the null index of the lists.
const none = -1

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
	s := &spaceSaving{
		k: k, slots: make([]counter, k), hash: make([]uint64, k), bucket: make([]int32, k), snext: make([]int32, k), sprev: make([]int32, k),
		bcount: make([]uint64, k), bfirst: make([]int32, k), bnext: make([]int32, k), bprev: make([]int32, k),
		table: make([]int32, size), mask: uint64(size - 1),
	}
	s.reset()
	return s
}

func (s *spaceSaving) reset() {
	clear(s.slots[:s.n])
	s.n, s.total, s.head, s.free = 0, 0, none, 0
	for b := range s.bnext {
		s.bnext[b] = int32(b + 1)
	}
	s.bnext[len(s.bnext)-1] = none
	clear(s.table)
}

// clone copies s, so that a snapshot ranks the copy without holding the
// lock that decisions wait on.
func (s *spaceSaving) clone() *spaceSaving {
	c := *s
	c.slots, c.hash, c.bucket, c.snext, c.sprev = slices.Clone(s.slots), slices.Clone(s.hash), slices.Clone(s.bucket), slices.Clone(s.snext), slices.Clone(s.sprev)
	c.bcount, c.bfirst, c.bnext, c.bprev = slices.Clone(s.bcount), slices.Clone(s.bfirst), slices.Clone(s.bnext), slices.Clone(s.bprev)
	c.table = slices.Clone(s.table)
	return &c
}

// find returns it's slot and where the table holds it, or, when it has
// none, -1 and the free place it would take.
func (s *spaceSaving) find(it Item, h uint64) (slot int32, at uint64) {
	for i := h & s.mask; ; i = (i + 1) & s.mask {
		v := s.table[i]
		if v == 0 {
			return none, i
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

// newBucket takes a free bucket for count and links it after prev (at
// the head for none). There is always one free: there are never more
// buckets than counters in use.
func (s *spaceSaving) newBucket(count uint64, prev int32) int32 {
	b := s.free
	s.free = s.bnext[b]
	s.bcount[b], s.bfirst[b], s.bprev[b] = count, none, prev
	if prev == none {
		s.bnext[b], s.head = s.head, b
	} else {
		s.bnext[b], s.bnext[prev] = s.bnext[prev], b
	}
	if next := s.bnext[b]; next != none {
		s.bprev[next] = b
	}
	return b
}

// freeBucket unlinks the empty bucket b and frees it.
func (s *spaceSaving) freeBucket(b int32) {
	prev, next := s.bprev[b], s.bnext[b]
	if prev == none {
		s.head = next
	} else {
		s.bnext[prev] = next
	}
	if next != none {
		s.bprev[next] = prev
	}
	s.bnext[b], s.free = s.free, b
}

// attach puts slot in bucket b.
func (s *spaceSaving) attach(slot, b int32) {
	first := s.bfirst[b]
	s.snext[slot], s.sprev[slot], s.bucket[slot] = first, none, b
	if first != none {
		s.sprev[first] = slot
	}
	s.bfirst[b] = slot
}

// detach takes slot out of its bucket, which it leaves linked even when
// empty.
func (s *spaceSaving) detach(slot int32) {
	b, prev, next := s.bucket[slot], s.sprev[slot], s.snext[slot]
	if prev == none {
		s.bfirst[b] = next
	} else {
		s.snext[prev] = next
	}
	if next != none {
		s.sprev[next] = prev
	}
}

// increment counts one more for slot: to the next bucket when it has
// the count one more, else to a new one after its own (or its own,
// when it is alone there).
func (s *spaceSaving) increment(slot int32) {
	b := s.bucket[slot]
	c := s.bcount[b] + 1
	next := s.bnext[b]
	alone := s.bfirst[b] == slot && s.snext[slot] == none
	switch {
	case next != none && s.bcount[next] == c:
		s.detach(slot)
		s.attach(slot, next)
		if alone {
			s.freeBucket(b)
		}
	case alone:
		s.bcount[b] = c // the next bucket counts more still: the order holds
	default:
		s.detach(slot)
		s.attach(slot, s.newBucket(c, b))
	}
}

// add counts one more for it, whose hashItem is h, and returns it as the
// summary holds it. A key that takes a counter is copied first, unless
// owned says that it is a copy already (another summary's): a key may
// be a piece of a larger string, as a query parameter is of the request
// line (or of forward auth's header naming the original URI), up to
// max_header_bytes, which the counter would keep whole for as long as it
// counts the key, so that a client sending long request lines under
// fresh keys had every counter hold one
// (TestAttackLongRequestLinesHeldByRankings).
func (s *spaceSaving) add(it Item, h uint64, owned bool) Item {
	s.total++
	slot, at := s.find(it, h)
	if slot != none {
		s.increment(slot)
		return s.slots[slot].item
	}
	if !owned {
		it.Key = strings.Clone(it.Key)
	}
	switch {
	case s.n < s.k:
		slot = int32(s.n)
		s.n++
		s.slots[slot], s.hash[slot] = counter{item: it}, h
		s.table[at] = slot + 1
		if s.head != none && s.bcount[s.head] == 1 {
			s.attach(slot, s.head)
		} else {
			s.attach(slot, s.newBucket(1, none))
		}
	default:
		// Take over a smallest counter: it keeps its count (the new
		// item may have been seen that often while unmonitored), which
		// becomes the new item's error, and counts one more.
		slot = s.bfirst[s.head]
		_, old := s.find(s.slots[slot].item, s.hash[slot])
		s.remove(old)
		s.slots[slot], s.hash[slot] = counter{item: it, err: s.bcount[s.head]}, h
		_, at = s.find(it, h)
		s.table[at] = slot + 1
		s.increment(slot)
	}
	return it
}

// min is the smallest count while every counter is in use (an item
// without a counter was seen at most that often), else 0.
func (s *spaceSaving) min() uint64 {
	if s.n < s.k || s.n == 0 {
		return 0
	}
	return s.bcount[s.head]
}

// counter returns slot's counter with its count.
func (s *spaceSaving) counter(slot int32) counter {
	c := s.slots[slot]
	c.count = s.bcount[s.bucket[slot]]
	return c
}

// lookup returns it's counter, if it has one.
func (s *spaceSaving) lookup(it Item) (counter, bool) {
	if slot, _ := s.find(it, hashItem(it)); slot != none {
		return s.counter(slot), true
	}
	return counter{}, false
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
	seen := make(map[Item]bool, a.n+b.n)
	var out []HotKey
	for _, s := range []*spaceSaving{a, b} {
		for slot := range s.n {
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
	sortHot(out)
	out = out[:min(len(out), n)]
	return out
}

// sortHot orders hot keys by count, the largest first, then by limit and
// key, so that equal counts list the same way every time.
func sortHot(hs []HotKey) {
	slices.SortFunc(hs, func(x, y HotKey) int {
		return cmp.Or(cmp.Compare(y.Count, x.Count), cmp.Compare(x.Limit, y.Limit), cmp.Compare(x.Key, y.Key))
	})
}
