package memory_test

import (
	"testing"

	"github.com/sluicehq/sluice/conformance"
)

// Settlements on one key from many goroutines end where the actual costs
// put the bucket: none lost, none doubled.
func TestSettle(t *testing.T) {
	conformance.RunSettle(t, newStore, conformance.SettleOptions{Goroutines: 16, PerCaller: 50})
}
