package deadline

import (
	"context"
	"testing"
	"time"
)

func TestWithTimeout(t *testing.T) {
	// No deadline: one of d is set.
	before := time.Now()
	ctx, cancel := WithTimeout(context.Background(), time.Minute)
	dl, ok := ctx.Deadline()
	if !ok || dl.Before(before.Add(time.Minute)) || dl.After(time.Now().Add(time.Minute)) {
		t.Fatalf("no caller deadline: got %v, %v; want a minute from the call", dl, ok)
	}
	cancel()
	if ctx.Err() == nil {
		t.Fatal("cancel did not end the derived context")
	}

	// A caller's shorter deadline governs: the same context comes back.
	parent, pcancel := context.WithTimeout(context.Background(), time.Second)
	defer pcancel()
	ctx, cancel = WithTimeout(parent, time.Minute)
	if ctx != parent {
		t.Fatal("shorter caller deadline: a new context was made")
	}
	cancel() // a no-op: must not end the caller's context
	if parent.Err() != nil {
		t.Fatal("the no-op cancel ended the caller's context")
	}

	// A caller's longer deadline is shortened to d.
	long, lcancel := context.WithTimeout(context.Background(), time.Hour)
	defer lcancel()
	ctx, cancel = WithTimeout(long, time.Second)
	defer cancel()
	if dl, _ := ctx.Deadline(); time.Until(dl) > time.Second {
		t.Fatalf("longer caller deadline kept: %v", time.Until(dl))
	}
}

func TestDetached(t *testing.T) {
	// A cancelled caller: the detached context lives on, to its deadline.
	parent, pcancel := context.WithTimeout(context.Background(), time.Hour)
	want, _ := parent.Deadline()
	pcancel()
	ctx, cancel := Detached(parent, time.Second)
	defer cancel()
	if ctx.Err() != nil {
		t.Fatal("the caller's cancellation ended the detached context")
	}
	if dl, ok := ctx.Deadline(); !ok || !dl.Equal(want) {
		t.Fatalf("deadline %v, %v; want the caller's %v", dl, ok, want)
	}
	// No caller deadline: one of d.
	ctx, cancel = Detached(context.Background(), time.Minute)
	defer cancel()
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > time.Minute {
		t.Fatalf("no caller deadline: got %v, %v; want a minute from the call", dl, ok)
	}
}
