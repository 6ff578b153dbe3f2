package adaptive

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
)

// MaxKeys bounds the keys whose responses a Controller counts in one
// interval, and the keys of a fleet's tally of one interval. Past it a
// process keeps a uniform sample of the interval's keys (reservoir
// sampling: each new key replaces a random kept one with the chance that
// keeps the sample uniform), and a fleet's tally gives each report the
// share of its places that its keys are of all (merge): the verdict is a
// share of a sample of the keys, never of one key's or one process's.
const MaxKeys = 512

// keyHash is what a key is counted under: 64 bits of its SHA-256, the
// same in every process (a fleet's tally merges the counts of a key seen
// by several processes) and not one a client can steer onto another's.
func keyHash(key string) uint64 {
	sum := sha256.Sum256([]byte(key))
	return binary.BigEndian.Uint64(sum[:8])
}

// keyTable is one interval's counts by key, bounded by MaxKeys.
type keyTable struct {
	idx  map[uint64]int // key hash -> position in keys and wins
	keys []uint64
	wins []Window
	seen int // distinct keys offered this interval
}

// observe counts one response of the key hashed h.
func (t *keyTable) observe(h uint64, isErr, slow bool) {
	i, ok := t.idx[h]
	if !ok {
		if t.idx == nil {
			t.idx = map[uint64]int{}
		}
		t.seen++
		if len(t.keys) < MaxKeys {
			i = len(t.keys)
			t.keys, t.wins = append(t.keys, h), append(t.wins, Window{})
		} else {
			i = rand.IntN(t.seen)
			if i >= MaxKeys {
				return
			}
			delete(t.idx, t.keys[i])
			t.keys[i], t.wins[i] = h, Window{}
		}
		t.idx[h] = i
	}
	w := &t.wins[i]
	w.Responses++
	if isErr {
		w.Errors++
	}
	if slow {
		w.Slow++
	}
}

// take returns the interval's counts (of a sample of seen keys), emptying t.
func (t *keyTable) take() (out map[uint64]Window, seen int) {
	out, seen = make(map[uint64]Window, len(t.keys)), t.seen
	for i, h := range t.keys {
		out[h] = t.wins[i]
	}
	clear(t.idx)
	t.keys, t.wins, t.seen = t.keys[:0], t.wins[:0], 0
	return out, seen
}

// tallyOf judges each key of counts under c.
func tallyOf(c *Config, counts map[uint64]Window) Tally {
	var t Tally
	for _, w := range counts {
		switch c.Judge(w) {
		case Unhealthy:
			t.Keys++
			t.Unhealthy++
		case Healthy:
			t.Keys++
		}
	}
	return t
}

// merge adds counts, a uniform sample of seen keys, to into, one of had,
// and returns the keys the tally samples: past MaxKeys each side keeps as
// many random keys as its share of the keys sampled (one in both adds up).
func merge(into map[uint64]Window, had int64, counts map[uint64]Window, seen int) int64 {
	old, fresh := slices.Collect(maps.Keys(into)), []uint64{}
	for h, w := range counts {
		cur, ok := into[h]
		if !ok {
			fresh = append(fresh, h)
		}
		into[h] = Window{cur.Responses + w.Responses, cur.Errors + w.Errors, cur.Slow + w.Slow}
	}
	take := min(len(fresh), max(MaxKeys-len(old), int(MaxKeys*int64(seen)/max(had+int64(seen), 1))))
	for _, ks := range [][]uint64{old, fresh} {
		rand.Shuffle(len(ks), func(i, j int) { ks[i], ks[j] = ks[j], ks[i] })
	}
	for _, h := range append(old[:max(len(old)+take-MaxKeys, 0)], fresh[take:]...) {
		delete(into, h)
	}
	return had + int64(seen)
}

// shared is what a fleet keeps under a limit's key: the State and the
// tally of the interval that ends at End (Unix microseconds; zero: none
// yet), by key hash, a uniform sample of Seen keys.
type shared struct {
	State
	End, Seen int64
	Counts    map[uint64]Window
}

// String encodes s: State's "RATE CHANGED DECREASED", then, when there is
// a tally, "END/SEEN" and one "HASH:RESPONSES:ERRORS:SLOW" per key, in
// hash order (so that equal contents are equal strings).
func (s shared) String() string {
	if s.End == 0 {
		return s.State.String()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %d/%d", s.State, s.End, s.Seen)
	for _, h := range slices.Sorted(maps.Keys(s.Counts)) {
		w := s.Counts[h]
		fmt.Fprintf(&b, " %x:%d:%d:%d", h, w.Responses, w.Errors, w.Slow)
	}
	return b.String()
}

// parseShared decodes shared.String's form, and State.String's alone (a
// state without a tally).
func parseShared(v string) (shared, error) {
	f := strings.Fields(v)
	if len(f) < 3 {
		return shared{}, fmt.Errorf("adaptive state %q: want at least 3 fields", v)
	}
	st, err := ParseState(strings.Join(f[:3], " "))
	if err != nil {
		return shared{}, err
	}
	s := shared{State: st}
	if len(f) == 3 {
		return s, nil
	}
	end, seen, ok := strings.Cut(f[3], "/")
	if !ok { // written by an earlier version: a sample of the keys it holds
		seen = strconv.Itoa(len(f) - 4)
	}
	if s.End, err = strconv.ParseInt(end, 10, 64); err != nil || s.End <= 0 {
		return shared{}, fmt.Errorf("adaptive state: bad tally end %q", f[3])
	}
	if s.Seen, err = strconv.ParseInt(seen, 10, 64); err != nil || s.Seen < int64(len(f)-4) {
		return shared{}, fmt.Errorf("adaptive state: bad tally size %q", f[3])
	}
	if len(f)-4 > MaxKeys {
		return shared{}, fmt.Errorf("adaptive state: %d keys in a tally, more than %d", len(f)-4, MaxKeys)
	}
	s.Counts = make(map[uint64]Window, len(f)-4)
	for _, e := range f[4:] {
		p := strings.Split(e, ":")
		if len(p) != 4 {
			return shared{}, fmt.Errorf("adaptive state: bad tally entry %q", e)
		}
		h, err := strconv.ParseUint(p[0], 16, 64)
		var n [3]int
		for i := range n {
			if err == nil {
				n[i], err = strconv.Atoi(p[i+1])
			}
		}
		if err != nil || n[0] < 1 || n[1] < 0 || n[2] < 0 || n[1] > n[0] || n[2] > n[0] {
			return shared{}, fmt.Errorf("adaptive state: bad tally entry %q", e)
		}
		s.Counts[h] = Window{Responses: n[0], Errors: n[1], Slow: n[2]}
	}
	return s, nil
}
