package redis_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adaptive"
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
			if _, ok, err := s.LoadValue(ctx, "adaptive:x"); err != nil || ok {
				t.Fatalf("absent key: ok %v, %v", ok, err)
			}
			if ok, err := s.CompareAndSwapValue(ctx, "adaptive:x", "stale", "v1", time.Minute); err != nil || ok {
				t.Fatalf("swap from a value that is not there: %v, %v", ok, err)
			}
			if ok, err := s.CompareAndSwapValue(ctx, "adaptive:x", "", "v1", time.Minute); err != nil || !ok {
				t.Fatalf("create: %v, %v", ok, err)
			}
			if v, ok, err := s.LoadValue(ctx, "adaptive:x"); err != nil || !ok || v != "v1" {
				t.Fatalf("load: %q %v %v", v, ok, err)
			}
			if ok, _ := s.CompareAndSwapValue(ctx, "adaptive:x", "", "v2", time.Minute); ok {
				t.Fatal("create over an existing value")
			}
			// Concurrent writers from the same old value: exactly one wins.
			var wins sync.WaitGroup
			won := make(chan string, 16)
			for i := range 16 {
				wins.Add(1)
				go func() {
					defer wins.Done()
					if ok, err := s.CompareAndSwapValue(ctx, "adaptive:x", "v1", fmt.Sprintf("w%d", i), time.Minute); err != nil {
						t.Error(err)
					} else if ok {
						won <- fmt.Sprintf("w%d", i)
					}
				}()
			}
			wins.Wait()
			close(won)
			var winners []string
			for w := range won {
				winners = append(winners, w)
			}
			if v, _, _ := s.LoadValue(ctx, "adaptive:x"); len(winners) != 1 || v != winners[0] {
				t.Fatalf("winners %v, stored %q", winners, v)
			}
			// The key lives under the prefix, with the TTL asked for.
			ttl, err := s.Client().Do(ctx, s.Client().B().Pttl().Key(prefix+"adaptive:x").Build()).AsInt64()
			if err != nil || ttl <= 0 || ttl > 60_000 {
				t.Fatalf("pttl %d, %v", ttl, err)
			}
		})
	}
}
