package redis_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/redis"
)

// The store keeps the shared values of adaptive rates: a compare-and-swap
// that only one of many concurrent writers wins, with a TTL, under the
// store's key prefix, on one Redis and on a Cluster.
func TestValues(t *testing.T) {
	for name, url := range map[string]func(testing.TB) string{"standalone": standaloneURL, "cluster": clusterURL} {
		t.Run(name, func(t *testing.T) {
			prefix := fmt.Sprintf("values%d-%d:", time.Now().UnixNano(), testSeq.Add(1))
			s := open(t, url(t), redis.Options{KeyPrefix: prefix})
			var _ adaptive.Values = s
			ctx := context.Background()
			conformance.RunValues(t, s)
			// The key lives under the prefix, with the TTL asked for.
			ttl, err := s.Client().Do(ctx, s.Client().B().Pttl().Key(prefix+"adaptive:x").Build()).AsInt64()
			if err != nil || ttl <= 0 || ttl > 60_000 {
				t.Fatalf("pttl %d, %v", ttl, err)
			}
		})
	}
}
