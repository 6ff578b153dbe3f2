package sluice

import (
	"context"
	"time"
)

// WithTimeout is context.WithTimeout(ctx, d) for a store call, except that
// when ctx already ends within d it returns ctx itself and a no-op cancel:
// the shorter deadline governs either way, and the call skips a timer and
// its allocations. Envoy, for one, sends every call with a deadline of
// tens of milliseconds.
func WithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}
