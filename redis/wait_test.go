package redis_test

import (
	"testing"

	"github.com/sluicehq/sluice/conformance"
)

// Limiter.Wait, Decision.RetryAt and a limit's jitter, decided on the
// store's clock (a manual one, which the store passes to its scripts) and
// slept on the limiter's, the same clock.
func TestWait(t *testing.T) { conformance.RunWait(t, servedStore(standaloneURL(t))) }

func TestClusterWait(t *testing.T) { conformance.RunWait(t, servedStore(clusterURL(t))) }
