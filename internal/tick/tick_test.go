package tick_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/tick"
)

// Every calls f on each tick and returns once its context ends, without
// a call after it has ended.
func TestEvery(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	tick.Every(ctx, time.Millisecond, func() {
		if calls++; calls == 3 {
			cancel()
		}
	})
	if calls < 3 {
		t.Fatalf("returned after %d calls, before its context ended", calls)
	}
	tick.Every(ctx, time.Hour, func() { t.Error("called with its context ended") })
}
