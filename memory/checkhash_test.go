package memory

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// Every byte of a key, at every length checkHash reads differently (the
// short forms, one and two words, and the loop over longer keys), changes
// its check hash, and so does the key's length and the store's key: two
// keys are confused only if both their hashes collide, which takes a
// collision of checkHash too.
func TestCheckHashSeesEveryByte(t *testing.T) {
	k := [2]uint64{0x243f6a8885a308d3, 0x13198a2e03707344}
	other := [2]uint64{k[0] + 1, k[1]}
	seen := map[uint64]string{}
	note := func(key string) {
		t.Helper()
		c := checkHash(&k, key)
		if prev, ok := seen[c]; ok && prev != key {
			t.Fatalf("checkHash(%q) = checkHash(%q)", key, prev)
		}
		seen[c] = key
	}
	for n := 0; n <= 70; n++ {
		base := strings.Repeat("a", n)
		note(base)
		if n > 0 && checkHash(&other, base) == checkHash(&k, base) {
			t.Fatalf("checkHash of %d bytes ignores the key", n)
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
		r := sluice.Request{Limit: lim, Key: key}
		if _, _, err := s.decideOne(engine.OpTake, r, false); err != nil {
			t.Fatal(err)
		}
		h, check := s.hashes(lim, key)
		sh := &s.shards[h&s.mask]
		if sh.t.find(h, check) < 0 {
			t.Fatalf("key %q is not where Store.hashes places it", key)
		}
	}
}
