package redis_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redis"
)

// TestAttackKeyFloodEvictsDrainedBuckets: a client minting keys fills a
// Redis with maxmemory. Under allkeys-lru Redis then evicted a bucket
// another client had drained, which was full again; under noeviction it
// refused the writes of every take, answered by on_store_error. The store
// names such a policy (serve logs it); under volatile-ttl, which it does
// not name, the drained bucket stays drained.
func TestAttackKeyFloodEvictsDrainedBuckets(t *testing.T) {
	ctx := context.Background()
	lim := sluice.MustLimit(sluice.Spec{Name: "flood", TokensPerSecond: 0.001, Burst: 100})
	for _, c := range []struct {
		policy, warning string
		drained         bool
	}{
		{"allkeys-lru", "drained", false},
		{"noeviction", "on_store_error", true},
		{"volatile-ttl", "", true},
	} {
		p := redistest.New(t, "--maxmemory", "2mb", "--maxmemory-policy", c.policy)
		s := open(t, "redis://"+p.Addr(), redis.Options{NoOverLimitCache: true})
		l := sluice.New(s)
		if w := s.EvictionWarning(ctx); c.warning == "" && w != "" || !strings.Contains(w, c.warning) {
			t.Errorf("%s: warning %q, want one that says %q", c.policy, w, c.warning)
		}
		if _, err := l.Take(ctx, sluice.Request{Limit: lim, Key: "victim", Cost: 100}); err != nil {
			t.Fatal(err)
		}
		full := false
		for i := 0; i < 50000 && !full; i++ {
			_, err := l.Take(ctx, sluice.Request{Limit: lim, Key: fmt.Sprintf("mint-%d", i)})
			full = err != nil
		}
		d, err := l.Take(ctx, sluice.Request{Limit: lim, Key: "victim"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed == c.drained {
			t.Errorf("%s: after the flood the drained bucket admitted: %v, want %v", c.policy, d.Allowed, !c.drained)
		}
		if c.policy == "noeviction" && !full {
			t.Errorf("noeviction: the flood never filled Redis")
		}
	}
}
