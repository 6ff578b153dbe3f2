// Package tick runs the module's periodic chores: a sweep, a poll, a
// recomputation, each until its context ends.
package tick

import (
	"context"
	"time"
)

// Every calls f every d until ctx ends, the first time d from now.
func Every(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}
