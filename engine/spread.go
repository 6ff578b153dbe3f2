package engine

// Spread returns a number in [0, n] chosen by a hash (64-bit FNV-1a) of
// parts, each part followed by a zero byte but the last. The same parts
// always give the same number: a client told to come back later is told
// the same offset each time, so its retries stay predictable, while
// clients with other parts spread over [0, n] instead of coming back
// together. It is the one jitter of sluice: the Retry-After header's
// (policy.RetryAfterSeconds) and a limit's Spec.Jitter both draw from it.
func Spread(n uint64, parts ...string) uint64 {
	const (
		offset = 14695981039346656037
		prime  = 1099511628211
	)
	h := uint64(offset)
	for i, p := range parts {
		if i > 0 {
			h *= prime // the zero byte between parts: h ^= 0, then multiply
		}
		for j := 0; j < len(p); j++ {
			h ^= uint64(p[j])
			h *= prime
		}
	}
	if n == ^uint64(0) {
		return h
	}
	return h % (n + 1)
}
