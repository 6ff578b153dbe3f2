package postgres_test

import (
	"testing"

	"github.com/sluicehq/sluice/conformance"
)

func TestConformance(t *testing.T) { conformance.Run(t, newStore) }

// At most 24 goroutines: the pool's connections (pool in main_test.go).
// More would wait for a connection in this process, not for the row.
func TestInvariants(t *testing.T) {
	conformance.RunInvariants(t, newStore, conformance.InvariantOptions{Rounds: 40, Goroutines: []int{1, 8, 24}})
}
