package memory

import "math/bits"

// checkHash is a key's second hash (entry.check), seeded by k: the
// runtime's portable map hash (wyhash's multiply-mix over the key's
// words), computed here rather than through maphash, whose way to the
// runtime's hasher costs more than the hash of a short key. The first
// hash (h, which places the key) stays the runtime's seeded AES hash; a
// key is confused with another only if both collide.
func checkHash(k *[2]uint64, s string) uint64 {
	var a, b uint64
	seed, n := k[0], len(s)
	switch {
	case n == 0:
		return seed
	case n < 4:
		a = uint64(s[0]) | uint64(s[n>>1])<<8 | uint64(s[n-1])<<16
	case n < 8:
		a, b = le32(s), le32(s[n-4:])
	case n <= 16:
		a, b = le64(s), le64(s[n-8:])
	default:
		p := 0
		for ; n-p > 16; p += 16 {
			seed = mix(le64(s[p:])^k[1], le64(s[p+8:])^seed)
		}
		a, b = le64(s[n-16:]), le64(s[n-8:])
	}
	return mix(0x1d8e4e27c47d124f^uint64(n), mix(a^k[1], b^seed))
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
