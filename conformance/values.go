package conformance

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adaptive"
)

// RunValues checks a store's shared values (adaptive.Values, what an
// adaptive rate is shared through) on key "adaptive:x": absent until
// created, a swap only from the value kept, a create only where none is,
// and one winner among concurrent writers from the same old value. It
// returns the value kept at the end, the winner's.
func RunValues(t *testing.T, s adaptive.Values) string {
	t.Helper()
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
	winners := ConcurrentSwaps(t, s, "adaptive:x", "v1", "w", time.Minute)
	if v, _, _ := s.LoadValue(ctx, "adaptive:x"); len(winners) != 1 || v != winners[0] {
		t.Fatalf("winners %v, stored %q", winners, v)
	}
	return winners[0]
}

// ConcurrentSwaps has 16 writers swap key from old to values of their
// own (label and a number) at once, and returns the values of those that
// won.
func ConcurrentSwaps(t *testing.T, s adaptive.Values, key, old, label string, ttl time.Duration) []string {
	t.Helper()
	var wg sync.WaitGroup
	won := make(chan string, 16)
	for i := range 16 {
		wg.Go(func() {
			v := fmt.Sprintf("%s%d", label, i)
			if ok, err := s.CompareAndSwapValue(context.Background(), key, old, v, ttl); err != nil {
				t.Error(err)
			} else if ok {
				won <- v
			}
		})
	}
	wg.Wait()
	close(won)
	var winners []string
	for v := range won {
		winners = append(winners, v)
	}
	return winners
}
