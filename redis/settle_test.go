package redis_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/redis"
)

// settleStore is a conformance.NewStore for settlements: as vectorStore,
// but with the over-limit cache on, as a server runs it.
func settleStore(url string) conformance.NewStore {
	return func(t *testing.T, clock sluice.Clock) sluice.Store {
		return open(t, url, redis.Options{Clock: clock, KeyPrefix: fmt.Sprintf("test%d-%d:", time.Now().UnixNano(), testSeq.Add(1))})
	}
}

// Settlements on one key from many goroutines end where the actual costs
// put the bucket, each refund and extra charge one script: none lost,
// none doubled.
func TestSettle(t *testing.T) {
	conformance.RunSettle(t, settleStore(standaloneURL(t)), conformance.SettleOptions{Goroutines: 8, PerCaller: 25})
}

func TestClusterSettle(t *testing.T) {
	conformance.RunSettle(t, settleStore(clusterURL(t)), conformance.SettleOptions{Goroutines: 8, PerCaller: 25})
}
