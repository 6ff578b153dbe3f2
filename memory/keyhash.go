package memory

import "math/bits"

// keyHashes returns a key's two hashes (entry.h and entry.check), each
// the runtime's portable map hash (wyhash's multiply-mix over the key's
// words) under its own half of the store's random key k, from one pass
// over the key's bytes. Computed here rather than through maphash, whose
// way to the runtime's AES hasher costs more than the hash of a short
// key, twice. The runtime hashes every map with this function on
// processors without AES instructions: without the key, which never
// leaves the process, a client cannot choose keys that share a home in
// the table (a flood of one probe run) any more than it can for a map.
// Two keys are confused only if both hashes collide.
func keyHashes(k *[4]uint64, s string, id uint64) (h, check uint64) {
	var a, b uint64
	s1, s2, n := k[0], k[2], len(s)
	switch {
	case n == 0:
		return underName(s1, s2, id)
	case n < 4:
		a = uint64(s[0]) | uint64(s[n>>1])<<8 | uint64(s[n-1])<<16
	case n < 8:
		a, b = le32(s), le32(s[n-4:])
	case n <= 16:
		a, b = le64(s), le64(s[n-8:])
	default:
		p := 0
		for ; n-p > 16; p += 16 {
			x, y := le64(s[p:]), le64(s[p+8:])
			s1 = mix(x^k[1], y^s1)
			s2 = mix(x^k[3], y^s2)
		}
		a, b = le64(s[n-16:]), le64(s[n-8:])
	}
	const m5 = 0x1d8e4e27c47d124f
	return underName(mix(m5^uint64(n), mix(a^k[1], b^s1)), mix(m5^uint64(n), mix(a^k[3], b^s2)), id)
}

// underName mixes a limit's name (its NameID, id) into a key's hashes, so
// that one key under two limits is two buckets; h is never zero, the
// table's empty slot.
func underName(h, check, id uint64) (uint64, uint64) {
	return max(h^id*0x9e3779b97f4a7c15, 1), check + id
}

func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

func le32(s string) uint64 {
	_ = s[3]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24
}

func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}
