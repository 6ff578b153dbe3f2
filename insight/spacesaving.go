package insight

import (
	"cmp"
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
type spaceSaving struct {
	k     int
	heap  []counter      // a min-heap on count: heap[0] is the smallest
	index map[Item]int32 // each counted item's position in heap
	total uint64         // N
}

// counter is one monitored item: its count is an upper bound of its true
// count, count-err a lower bound.
type counter struct {
	item  Item
	count uint64
	err   uint64
}

func newSpaceSaving(k int) *spaceSaving {
	return &spaceSaving{k: k, heap: make([]counter, 0, k), index: make(map[Item]int32, k)}
}

// add counts w more for it.
func (s *spaceSaving) add(it Item, w uint64) {
	s.total += w
	if i, ok := s.index[it]; ok {
		s.heap[i].count += w
		s.down(int(i))
		return
	}
	if len(s.heap) < s.k {
		s.heap = append(s.heap, counter{item: it, count: w})
		s.index[it] = int32(len(s.heap) - 1)
		s.up(len(s.heap) - 1)
		return
	}
	// Take over the smallest counter: it keeps its count (the new item
	// may have been seen that often while unmonitored), which becomes the
	// new item's error.
	minc := s.heap[0].count
	delete(s.index, s.heap[0].item)
	s.heap[0] = counter{item: it, count: minc + w, err: minc}
	s.index[it] = 0
	s.down(0)
}

// min is the smallest count while every counter is in use (an item
// without a counter was seen at most that often), else 0.
func (s *spaceSaving) min() uint64 {
	if len(s.heap) < s.k || len(s.heap) == 0 {
		return 0
	}
	return s.heap[0].count
}

// lookup returns it's counter, if it has one.
func (s *spaceSaving) lookup(it Item) (counter, bool) {
	if i, ok := s.index[it]; ok {
		return s.heap[i], true
	}
	return counter{}, false
}

func (s *spaceSaving) reset() {
	s.heap = s.heap[:0]
	clear(s.index)
	s.total = 0
}

func (s *spaceSaving) less(i, j int) bool { return s.heap[i].count < s.heap[j].count }

func (s *spaceSaving) swap(i, j int) {
	s.heap[i], s.heap[j] = s.heap[j], s.heap[i]
	s.index[s.heap[i].item] = int32(i)
	s.index[s.heap[j].item] = int32(j)
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
	seen := make(map[Item]bool, len(a.heap)+len(b.heap))
	var out []HotKey
	for _, s := range []*spaceSaving{a, b} {
		for _, c := range s.heap {
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
