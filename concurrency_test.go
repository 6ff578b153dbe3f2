package sluice_test

import (
	"testing"

	"github.com/sluicehq/sluice/conformance"
)

func TestLeasesPureArithmetic(t *testing.T) {
	conformance.RunLeases(t, newMapStore, conformance.LeaseOptions{})
}
