package memory_test

import (
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/memory"
)

func newStore(t *testing.T, clock sluice.Clock) sluice.Store {
	return memory.New(memory.Options{Clock: clock})
}

func TestConformance(t *testing.T) { conformance.Run(t, newStore) }

func TestInvariants(t *testing.T) {
	conformance.RunInvariants(t, newStore, conformance.InvariantOptions{})
}
