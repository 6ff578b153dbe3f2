// Package deadline bounds the calls that leave the process: a store call
// gets a deadline of its own unless its caller's ends sooner, and none at
// all when the store answers in the process without waiting.
package deadline

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
	return ForStore(ctx, nil, d)
}

// ForStore is WithTimeout for a call on s, a store, except that a store
// whose calls never leave the process and never wait (one with an
// InProcess method that says so, as the memory store has) gets ctx as it
// is: a deadline cannot cut such a call short, and the timer it arms
// costs more than the call.
func ForStore(ctx context.Context, s any, d time.Duration) (context.Context, context.CancelFunc) {
	end, ok := Needed(ctx, s, d)
	if !ok {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, end)
}

// Needed is the deadline that a call on s (nil: any call that leaves the
// process), made now under ctx and bounded by d, needs of its own: ok is
// false when it needs none, because s answers in the process or ctx
// ends by then. The one rule of ForStore and of contexts that arm their
// timer lazily (the Envoy service's).
func Needed(ctx context.Context, s any, d time.Duration) (end time.Time, ok bool) {
	if p, in := s.(InProcess); in && p.InProcess() {
		return time.Time{}, false
	}
	end = time.Now().Add(d)
	if dl, has := ctx.Deadline(); has && !dl.After(end) {
		return time.Time{}, false
	}
	return end, true
}

// InProcess is a store that can say its calls never leave the process
// and never wait (the memory store, and wrappers that forward the
// answer of the store they wrap).
type InProcess interface {
	InProcess() bool
}

// Detached is ctx without its cancellation, ending at its deadline, or d
// from now when it has none: for a store call whose effect outlives the
// caller that makes it (a step a whole process shares, a slot the store
// may take before the caller hears of it), which a caller that gives up
// must not cut short after the store has acted. It keeps ctx's values.
func Detached(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if end, ok := ctx.Deadline(); ok {
		return context.WithDeadline(context.WithoutCancel(ctx), end)
	}
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}
