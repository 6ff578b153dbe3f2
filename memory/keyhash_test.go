package memory

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// Every byte of a key, at every length keyHashes reads differently (the
// short forms, one and two words, and the loop over longer keys), changes
// both its hashes, and so do the key's length and the store's key: two
// keys are confused only if both their hashes collide.
func TestKeyHashesSeeEveryByte(t *testing.T) {
	k := [4]uint64{0x243f6a8885a308d3, 0x13198a2e03707344, 0xa4093822299f31d0, 0x082efa98ec4e6c89}
	other := k
	for i := range other {
		other[i]++
	}
	seenH, seenC := map[uint64]string{}, map[uint64]string{}
	note := func(key string) {
		t.Helper()
		h, c := keyHashes(&k, key, 0)
		if prev, ok := seenH[h]; ok && prev != key {
			t.Fatalf("h(%q) = h(%q)", key, prev)
		}
		if prev, ok := seenC[c]; ok && prev != key {
			t.Fatalf("check(%q) = check(%q)", key, prev)
		}
		if h == c {
			t.Fatalf("h(%q) = check(%q): the two hashes are one", key, key)
		}
		seenH[h], seenC[c] = key, key
	}
	for n := 0; n <= 70; n++ {
		base := strings.Repeat("a", n)
		note(base)
		h, c := keyHashes(&k, base, 0)
		if oh, oc := keyHashes(&other, base, 0); n > 0 && (oh == h || oc == c) {
			t.Fatalf("the hashes of %d bytes ignore the store's key", n)
		}
		for i := 0; i < n; i++ {
			for _, b := range []byte{'b', 0, 0xff} {
				key := []byte(base)
				key[i] = b
				note(string(key))
			}
		}
	}
}

// The hashes decideOne writes out are Store.hashes' (the evictions and
// TakeAll find a key by the latter).
func TestDecideOneHashesAsHashes(t *testing.T) {
	s := New(Options{MaxKeys: 64, Shards: 4})
	lim := sluice.MustLimit(sluice.Spec{Name: "h", TokensPerSecond: 1, Burst: 2})
	for _, key := range []string{"a", "user-1", "a longer key than sixteen bytes", strings.Repeat("x", 100)} {
		c, err := sluice.Request{Limit: lim, Key: key}.Charged(engine.OpTake)
		if err != nil {
			t.Fatal(err)
		}
		s.decideOne(engine.OpTake, c, false)
		h, check := s.hashes(lim, key)
		sh := &s.shards[h&s.mask]
		if sh.t.find(h, check) < 0 {
			t.Fatalf("key %q is not where Store.hashes places it", key)
		}
	}
}

// Keys a client chooses without the store's key (numbered, or one byte
// apart) spread over the shards as random keys do: no shard holds more
// than twice its share, a bound that a spread as even as chance exceeds
// with a probability below 1e-15.
// A client that could compute the store's hashes could choose keys that
// all land in one shard (one lock, one table: a probe run as long as the
// flood). It cannot, because each store hashes under a key of its own: keys
// chosen to share a shard in one store, as if the hash's key were fixed
// and known, spread over the shards of another.
func TestAttackKeysChosenForOneStoreSpreadInAnother(t *testing.T) {
	known := New(Options{Shards: 16})
	target := New(Options{Shards: 16})
	lim := sluice.MustLimit(sluice.Spec{Name: "spread", TokensPerSecond: 1, Burst: 1})
	const keys = 2048
	chosen := make([]string, 0, keys)
	for i := 0; len(chosen) < keys; i++ {
		k := "user-" + strconv.Itoa(i)
		if h, _ := known.hashes(lim, k); h&15 == 0 {
			chosen = append(chosen, k)
		}
	}
	var per [16]int
	for _, k := range chosen {
		h, _ := target.hashes(lim, k)
		per[h&15]++
	}
	for sh, n := range per {
		if n > 2*keys/16 {
			t.Errorf("shard %d of the other store holds %d of the %d keys chosen for one shard of the first", sh, n, keys)
		}
	}
}

func TestAttackChosenKeysSpreadOverShards(t *testing.T) {
	s := New(Options{Shards: 16})
	lim := sluice.MustLimit(sluice.Spec{Name: "spread", TokensPerSecond: 1, Burst: 1})
	families := map[string]func(i int) string{
		"numbered":      func(i int) string { return "user-" + strconv.Itoa(i) },
		"one byte":      func(i int) string { return string([]byte{byte(i), byte(i >> 8)}) },
		"long, suffix":  func(i int) string { return strings.Repeat("x", 40) + strconv.Itoa(i) },
		"long, prefix":  func(i int) string { return strconv.Itoa(i) + strings.Repeat("x", 40) },
		"same length 8": func(i int) string { return fmt.Sprintf("%08d", i) },
	}
	const keys = 4096
	for name, key := range families {
		var per [16]int
		for i := range keys {
			h, _ := s.hashes(lim, key(i))
			per[h&15]++
		}
		for sh, n := range per {
			if n > 2*keys/16 {
				t.Errorf("%s: shard %d holds %d of %d keys", name, sh, n, keys)
			}
		}
	}
}
