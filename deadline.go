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

// WithStoreTimeout is WithTimeout for a call on s, except that a store
// whose calls never leave the process and never wait (one with an
// InProcess method that says so, as the memory store has) gets ctx as it
// is: a deadline cannot cut such a call short, and the timer it arms
// costs more than the call.
func WithStoreTimeout(ctx context.Context, s Store, d time.Duration) (context.Context, context.CancelFunc) {
	if p, ok := s.(inProcess); ok && p.InProcess() {
		return ctx, func() {}
	}
	return WithTimeout(ctx, d)
}

// inProcess is a store that can say its calls never leave the process
// and never wait (the memory store, and wrappers that forward the
// answer of the store they wrap).
type inProcess interface {
	InProcess() bool
}
