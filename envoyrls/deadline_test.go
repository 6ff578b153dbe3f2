package envoyrls

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/memory"
)

// TestStoreContextAnswersAsWithTimeout holds storeContext's context to
// what context.WithTimeout answers, whether or not its timer was armed.
func TestStoreContextAnswersAsWithTimeout(t *testing.T) {
	type key struct{}
	parent := context.WithValue(context.Background(), key{}, "v")

	ctx, dl := storeContext(parent, nil, time.Hour)
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) < 59*time.Minute {
		t.Fatalf("Deadline() = %v, %v; want about an hour ahead", dl, ok)
	}
	if ctx.Value(key{}) != "v" || ctx.Err() != nil {
		t.Fatalf("unarmed: Value %v, Err %v", ctx.Value(key{}), ctx.Err())
	}
	select {
	case <-ctx.Done():
		t.Fatal("Done closed before the deadline")
	default:
	}
	if ctx.Value(key{}) != "v" || ctx.Err() != nil {
		t.Fatalf("armed: Value %v, Err %v", ctx.Value(key{}), ctx.Err())
	}
	dl.end()
	<-ctx.Done()
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("ended after arming: Err = %v, want Canceled", ctx.Err())
	}

	// Ended before anything waited: cancelled, and Done closed when asked.
	ctx, dl = storeContext(parent, nil, time.Hour)
	dl.end()
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("ended unarmed: Err = %v, want Canceled", ctx.Err())
	}
	<-ctx.Done()
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("ended, then armed: Err = %v, want Canceled", ctx.Err())
	}

	// Past its deadline, armed or not.
	ctx, dl = storeContext(parent, nil, -time.Second)
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("past the deadline, unarmed: Err = %v", ctx.Err())
	}
	cparent, ccancel := context.WithCancel(parent)
	defer ccancel()
	cctx, cdl := storeContext(cparent, nil, -time.Second)
	if c := context.Cause(cctx); !errors.Is(c, context.DeadlineExceeded) {
		t.Fatalf("past the deadline, under a cancellable parent: Cause = %v", c)
	}
	cdl.end()
	<-ctx.Done()
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("past the deadline, armed: Err = %v", ctx.Err())
	}
	dl.end()

	// The parent's cancellation, before and after arming, and through a
	// context derived from it.
	pctx, pcancel := context.WithCancel(parent)
	ctx, dl = storeContext(pctx, nil, time.Hour)
	defer dl.end()
	derived, dcancel := context.WithCancel(ctx)
	defer dcancel()
	pcancel()
	<-derived.Done()
	<-ctx.Done()
	if !errors.Is(ctx.Err(), context.Canceled) || !errors.Is(derived.Err(), context.Canceled) {
		t.Fatalf("parent cancelled: Err = %v, derived %v", ctx.Err(), derived.Err())
	}
	pctx, pcancel = context.WithCancel(parent)
	ctx, dl = storeContext(pctx, nil, time.Hour)
	defer dl.end()
	pcancel()
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("parent cancelled, unarmed: Err = %v", ctx.Err())
	}
}

// TestStoreContextKeepsShorterDeadlines: a caller's earlier deadline, or
// a store in the process, leaves the context as it is.
func TestStoreContextKeepsShorterDeadlines(t *testing.T) {
	parent, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if ctx, dl := storeContext(parent, nil, time.Hour); ctx != parent {
		t.Fatal("a caller's earlier deadline was replaced")
	} else {
		dl.end()
	}
	if ctx, dl := storeContext(context.Background(), memory.New(memory.Options{}), time.Hour); ctx != context.Background() {
		t.Fatal("an in-process store got a deadline")
	} else {
		dl.end()
	}
}

// TestStoreContextConcurrent arms, reads and ends one context from
// several goroutines at once (go test -race).
func TestStoreContextConcurrent(t *testing.T) {
	for range 100 {
		ctx, dl := storeContext(context.Background(), nil, time.Hour)
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				switch i {
				case 0:
					dl.end()
				case 1:
					<-ctx.Done()
				default:
					_ = ctx.Err()
					_ = ctx.Value(i)
				}
			})
		}
		wg.Wait()
		if !errors.Is(ctx.Err(), context.Canceled) {
			t.Fatalf("Err = %v after end, want Canceled", ctx.Err())
		}
	}
}
