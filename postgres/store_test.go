package postgres_test

import (
	"testing"

	"github.com/sluicehq/sluice/conformance"
)

func TestConformance(t *testing.T) { conformance.Run(t, newStore) }

func TestInvariants(t *testing.T) {
	conformance.RunInvariants(t, newStore, conformance.InvariantOptions{Rounds: 60, Goroutines: []int{1, 8, 64}})
}
