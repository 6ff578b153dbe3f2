package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A call whose deadline passes while it waits in this process for a busy
// writer never reaches Redis, and says so (errUnsent), so that the breaker
// does not blame Redis for this process's overload. The script call is a
// stand-in that blocks: local queueing cannot be produced on demand with a
// real server (TestHungRedis covers a hung one).
func TestUnsentCallsAreNotRedisFailures(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	sentKeys := map[string]bool{}
	exec := func(ctx context.Context, keys, _ []string) ([]int64, error) {
		mu.Lock()
		for _, k := range keys {
			sentKeys[k] = true
		}
		mu.Unlock()
		select {
		case <-release:
			return make([]int64, replyWidth*len(keys)), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	b := newBatcher(2, 256, 5*time.Second, "0", exec, func(int) {})
	defer b.close()

	call := func(key string, wait time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		_, err := b.do(ctx, []string{key}, []string{"t1", "tb 1 1 1", "1", ""})
		return err
	}
	var wg sync.WaitGroup
	errs := map[string]error{}
	var emu sync.Mutex
	start := func(key string, wait time.Duration) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := call(key, wait)
			emu.Lock()
			errs[key] = err
			emu.Unlock()
		}()
	}
	// "direct" goes straight to Redis (nothing in flight); "writer" is
	// taken by a writer into the second place, which then blocks; the rest
	// wait behind them for a place and run out of time there. The writer is released once they have
	// all returned, however long a loaded machine took to run them.
	start("direct", time.Minute)
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return sentKeys["direct"] })
	start("writer", time.Minute)
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return sentKeys["writer"] })
	for _, k := range []string{"q1", "q2", "q3"} {
		start(k, 100*time.Millisecond)
	}
	waitFor(t, func() bool {
		emu.Lock()
		defer emu.Unlock()
		_, q1 := errs["q1"]
		_, q2 := errs["q2"]
		_, q3 := errs["q3"]
		return q1 && q2 && q3
	})
	close(release)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	for _, k := range []string{"q1", "q2", "q3"} {
		if !errors.Is(errs[k], errUnsent) || !errors.Is(errs[k], context.DeadlineExceeded) {
			t.Errorf("%s: %v, want errUnsent and DeadlineExceeded", k, errs[k])
		}
		if sentKeys[k] {
			t.Errorf("%s was sent after its caller gave up", k)
		}
	}
	for _, k := range []string{"direct", "writer"} {
		if errs[k] != nil {
			t.Errorf("%s: %v, want its answer", k, errs[k])
		}
	}
}

// While a script call is in flight, the calls that arrive wait for it to
// end and then go to Redis together, in one script call: a writer that
// sent the first of them at once would make two script calls (two writes
// of this process, two calls for Redis) where one does. The script call
// is a stand-in that holds the first call until the rest have queued.
func TestCallsArrivingDuringAScriptCallGoTogether(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var sent [][]string
	exec := func(ctx context.Context, keys, _ []string) ([]int64, error) {
		mu.Lock()
		sent = append(sent, append([]string(nil), keys...))
		first := len(sent) == 1
		mu.Unlock()
		if first {
			<-release
		}
		return make([]int64, replyWidth*len(keys)), nil
	}
	b := newBatcher(1, 256, time.Minute, "0", exec, func(int) {})
	defer b.close()
	var wg sync.WaitGroup
	take := func(key string) {
		wg.Go(func() {
			if _, err := b.do(context.Background(), []string{key}, []string{"t1", "tb 1 1 1", "1", ""}); err != nil {
				t.Errorf("%s: %v", key, err)
			}
		})
	}
	take("lone")
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(sent) == 1 })
	later := []string{"a", "b", "c", "d", "e"}
	for _, k := range later {
		take(k)
	}
	// The writer holds one of them and the rest are queued.
	waitFor(t, func() bool { return len(b.q) == len(later)-1 })
	close(release)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 2 || len(sent[1]) != len(later) {
		t.Fatalf("script calls sent %v, want [lone] then the %d later calls in one", sent, len(later))
	}
}

// waitFor polls cond until it holds; its deadline only ends a test that
// would otherwise hang.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(time.Millisecond)
	}
}

// doneCounter is a context with a deadline that counts the calls of its
// Done, as a context that arms its timer only when asked would (the
// Envoy service's store deadline).
type doneCounter struct {
	context.Context
	asked *atomic.Int64
}

func (c doneCounter) Done() <-chan struct{} {
	c.asked.Add(1)
	return c.Context.Done()
}

// TestQueuedCallsDoNotAskForDone: a caller whose call waits for a writer
// is woken by the batcher's one timer at its deadline, not by its
// context's Done, which it asks for only once the deadline has passed;
// a call whose deadline passes while it is queued still returns, with
// the context's error.
func TestQueuedCallsDoNotAskForDone(t *testing.T) {
	release := make(chan struct{})
	var sent atomic.Int64
	exec := func(ctx context.Context, keys, _ []string) ([]int64, error) {
		if sent.Add(1) == 1 {
			<-release
		}
		return make([]int64, replyWidth*len(keys)), nil
	}
	b := newBatcher(1, 256, time.Minute, "0", exec, func(int) {})
	defer b.close()
	var asked atomic.Int64
	take := func(key string, d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_, err := b.do(doneCounter{ctx, &asked}, []string{key}, []string{"t1", "tb 1 1 1", "1", ""})
		return err
	}
	var wg sync.WaitGroup
	for _, k := range []string{"lone", "a", "b", "c"} {
		wg.Go(func() {
			if err := take(k, time.Minute); err != nil {
				t.Errorf("%s: %v", k, err)
			}
		})
		if k == "lone" {
			waitFor(t, func() bool { return sent.Load() == 1 })
		}
	}
	// Queued behind the script call in flight, until its deadline.
	if err := take("short", time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("short: got %v, want its deadline passed", err)
	}
	close(release)
	wg.Wait()
	if n := asked.Load(); n != 1 {
		t.Errorf("Done asked %d times, want once, by the call whose deadline passed", n)
	}
}

// heldBatcher is a batcher of one writer whose first script call, sent
// by a caller of its own, hangs until release (or the test's end): every
// later call waits for it. The script call is a stand-in, as a hung Redis
// is (TestHungRedis stops a real one); later ones answer at once.
func heldBatcher(t *testing.T) (b *batcher, args []string, release func()) {
	t.Helper()
	held := make(chan struct{})
	var sent atomic.Int64
	exec := func(ctx context.Context, keys, _ []string) ([]int64, error) {
		if sent.Add(1) == 1 {
			<-held
		}
		return make([]int64, replyWidth*len(keys)), nil
	}
	b = newBatcher(1, 256, time.Hour, "0", exec, func(int) {})
	release = sync.OnceFunc(func() { close(held) })
	t.Cleanup(func() { release(); b.close() })
	args = []string{"t1", "tb 1 1 1", "1", ""}
	go b.do(context.Background(), []string{"held"}, args)
	waitFor(t, func() bool { return sent.Load() == 1 })
	return b, args, release
}

// TestAttackCancelledCallersReturnWhileRedisHangs: clients that send
// calls and hang up while Redis does not answer must not keep a
// goroutine each until their deadlines: a caller whose context is
// cancelled returns, with Canceled, though its deadline is an hour off.
func TestAttackCancelledCallersReturnWhileRedisHangs(t *testing.T) {
	b, args, _ := heldBatcher(t)
	const n = 100
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := b.do(ctx, []string{strconv.Itoa(i)}, args)
			errs <- err
		}()
	}
	// All wait: one held by the writer, the rest queued.
	waitFor(t, func() bool { return len(b.q) == n-1 })
	cancel()
	for range n {
		select {
		case err := <-errs:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("a cancelled caller got %v, want Canceled", err)
			}
		case <-time.After(time.Minute): // only ends a build that would wait the hour
			t.Fatal("cancelled callers still wait for their deadline while Redis hangs")
		}
	}
}

// errCounter is a context that counts the calls of its Err.
type errCounter struct {
	context.Context
	n *atomic.Int64
}

func (c errCounter) Err() error {
	c.n.Add(1)
	return c.Context.Err()
}

// TestAttackShortDeadlinesDoNotRescanWaitingCallers: a client that sends
// calls whose deadlines are a moment away makes the batcher's timer fire
// for each; were every waiting caller's context looked at each time,
// each such call would cost a look at every other client's waiting call.
// The contexts are looked at once per scanEvery however often the timer
// fires: the bound below counts the looks the time taken allows, so it
// holds at any speed.
func TestAttackShortDeadlinesDoNotRescanWaitingCallers(t *testing.T) {
	b, args, release := heldBatcher(t)
	// Other clients' calls, waiting with an hour to go.
	const waiting = 50
	var looks atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	var wg sync.WaitGroup
	for i := range waiting {
		wg.Go(func() { b.do(errCounter{ctx, &looks}, []string{"w" + strconv.Itoa(i)}, args) })
	}
	waitFor(t, func() bool { return len(b.q) == waiting-1 })
	// The flood: calls whose deadlines pass as they are made.
	const flood = 300
	start := time.Now()
	for i := range flood {
		short, stop := context.WithTimeout(context.Background(), time.Nanosecond)
		if _, err := b.do(short, []string{"f" + strconv.Itoa(i)}, args); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a call past its deadline got %v", err)
		}
		stop()
	}
	scans := int64(time.Since(start)/scanEvery) + 2
	if n := looks.Load(); n > scans*waiting {
		t.Errorf("%d looks at the waiting callers' contexts in %v: at most %d scans of %d, not one per short call", n, time.Since(start), scans, waiting)
	}
	release()
	wg.Wait()
}

// TestAttackSpreadDeadlinesDoNotFireTheTimerForEach: while the script
// call in flight hangs, callers whose deadlines pass one after another (a
// client spacing its calls' deadlines, or a crowd behind a hung Redis)
// would fire the timer once each, and every firing walks every waiting
// call: a cost that grows as the square of the callers. The timer fires
// at most once per fireEvery: the bound counts the firings the time taken
// allows, so it holds at any speed.
func TestAttackSpreadDeadlinesDoNotFireTheTimerForEach(t *testing.T) {
	b, args, _ := heldBatcher(t)
	const callers = 300
	start := time.Now()
	first := start.Add(5 * time.Millisecond)
	var wg sync.WaitGroup
	for i := range callers {
		ctx, cancel := context.WithDeadline(context.Background(), first.Add(time.Duration(i)*20*time.Microsecond))
		wg.Go(func() {
			defer cancel()
			if _, err := b.do(ctx, []string{"s" + strconv.Itoa(i)}, args); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("a call past its deadline got %v", err)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.expiry.mu.Lock()
	fires := b.expiry.fires
	b.expiry.mu.Unlock()
	if bound := int(elapsed/fireEvery) + 2; fires > bound {
		t.Errorf("the timer fired %d times in %v for %d callers: at most %d", fires, elapsed, callers, bound)
	}
}

// TestRunsJoinLoneRequestsWithTheSameArguments: consecutive calls that
// are each one request in a group of its own, with the same op, time and
// arguments, go as one run; anything else breaks the run.
func TestRunsJoinLoneRequestsWithTheSameArguments(t *testing.T) {
	tb, fw := []string{"tb 5 1 1", "1", ""}, []string{"fw 5 5 1 0", "1", ""}
	lone := func(h string, a []string) []string { return append([]string{h}, a...) }
	calls := [][]string{
		lone("t1", tb), lone("t1", tb), lone("t1", tb), // a run of three
		lone("t1", fw),                     // another limit: alone
		lone("t1:7", fw), lone("t1:7", fw), // another time: a run of its own
		lone("p1:7", fw), // another op
		{"t2", "tb 5 1 1", "1", "", "tb 5 1 1", "1", ""}, // a group of two is never joined
		lone("t1", tb), lone("t1", []string{"tb 5 1 1", "2", ""}), // another cost
		lone("r1", tb), lone("r1", tb),
	}
	got := JoinRuns(calls)
	want := []string{"T3", "tb 5 1 1", "1", "", "t1", "fw 5 5 1 0", "1", "", "T2:7", "fw 5 5 1 0", "1", "",
		"p1:7", "fw 5 5 1 0", "1", "", "t2", "tb 5 1 1", "1", "", "tb 5 1 1", "1", "",
		"t1", "tb 5 1 1", "1", "", "t1", "tb 5 1 1", "2", "", "R2", "tb 5 1 1", "1", ""}
	if !slices.Equal(got, want) {
		t.Fatalf("runs\n got %q\nwant %q", got, want)
	}
}

// A batcher retired as its primary left the Cluster's slot table answers
// every call it has not sent with errRetired, at once, though the script
// call in flight hangs: the calls queued behind it, and those that reach
// it later, as a call the old table routed may. None waits for a
// deadline (these have none), and closing it again as the store closes
// is harmless (heldBatcher's cleanup).
func TestRetiredBatcherRefusesCalls(t *testing.T) {
	b, args, _ := heldBatcher(t)
	const n = 10
	errs := make(chan error, n+1)
	for i := range n {
		go func() {
			_, err := b.do(context.Background(), []string{strconv.Itoa(i)}, args)
			errs <- err
		}()
	}
	// One taken by the writer, waiting for the place the hung call holds;
	// the rest queued.
	waitFor(t, func() bool { return len(b.q) == n-1 })
	b.closeWith(fmt.Errorf("node 10.0.0.1:6379: %w", errRetired))
	go func() {
		_, err := b.do(context.Background(), []string{"late"}, args)
		errs <- err
	}()
	for range n + 1 {
		select {
		case err := <-errs:
			if !errors.Is(err, errRetired) {
				t.Fatalf("a call to a retired batcher got %v, want errRetired", err)
			}
		case <-time.After(time.Minute): // only ends a build that would wait for ever
			t.Fatal("calls to a retired batcher still wait")
		}
	}
}
