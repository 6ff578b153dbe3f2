package postgres_test

import (
	"testing"

	"github.com/sluicehq/sluice/conformance"
)

// Limiter.Wait, Decision.RetryAt and a limit's jitter: a turn past the
// deadline is refused in the statement that would have charged it, and a
// cancelled wait's reservation comes back.
func TestWait(t *testing.T) { conformance.RunWait(t, newStore) }
