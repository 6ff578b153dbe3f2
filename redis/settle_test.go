package redis_test

import (
	"testing"

	"github.com/sluicehq/sluice/conformance"
)

// Settlements on one key from many goroutines end where the actual costs
// put the bucket, each refund and extra charge one script: none lost,
// none doubled.
func TestSettle(t *testing.T) {
	conformance.RunSettle(t, servedStore(standaloneURL(t)), conformance.SettleOptions{Goroutines: 8, PerCaller: 25})
}

func TestClusterSettle(t *testing.T) {
	conformance.RunSettle(t, servedStore(clusterURL(t)), conformance.SettleOptions{Goroutines: 8, PerCaller: 25})
}
