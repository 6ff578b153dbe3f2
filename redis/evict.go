package redis

import (
	"context"
	"fmt"
)

// EvictionWarning names a maxmemory-policy under which a client minting
// keys fills Redis to its gain, or is "": noeviction then fails every
// admitting take to on_store_error, and policies choosing by use or at
// random evict drained buckets (TestAttackKeyFloodEvictsDrainedBuckets).
// volatile-ttl evicts the buckets nearest to full, whose keys expire first.
func (s *Store) EvictionWarning(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	m, err := s.client.Do(ctx, s.client.B().ConfigGet().Parameter("maxmemory-policy").Build()).AsStrMap()
	p, what := m["maxmemory-policy"], "it evicts buckets that clients drained, which are full again"
	if err != nil || p == "" || p == "volatile-ttl" {
		return ""
	}
	if p == "noeviction" {
		what = "every take that admits fails and is answered by on_store_error"
	}
	return fmt.Sprintf("redis maxmemory-policy is %s: once Redis is full (a client minting keys can fill it), %s; set maxmemory with maxmemory-policy volatile-ttl, which evicts the buckets nearest to full", p, what)
}
