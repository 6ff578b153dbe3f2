package redis

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/deadline"
)

// batcher carries several waiting calls in one script call. Callers
// enqueue; each of a few writer goroutines takes the first waiting call,
// waits for one of the places of script calls in flight (as many as
// writers) to be free, adds whatever else has queued by then, and sends
// them as one EVALSHA of independent groups. Redis pays its per-call cost
// (parsing, script lookup, TIME, reply framing) once per batch instead of
// once per take, which is where a Redis-bound limiter spends most of its
// CPU, and this process pays a write and a read per batch: on a host
// where each write wakes Redis on another processor, the write costs more
// than the rest of the call. Each group stays atomic on its own; a
// rejection in one group affects no other.
//
// A call that finds no script call in flight goes straight to Redis from
// its own goroutine: batching only starts when calls overlap, so a lone
// caller pays no hand-off to a writer. Under a steady stream of calls,
// the places stay taken and every call waits at most for the script call
// in flight before its own is sent: the calls that arrive during one
// round trip go in the next, one batch per round trip rather than a lone
// call and a batch (bench/'s BenchmarkRedis counts script calls per
// check).
//
// On a Cluster each primary has a batcher (node.batch), and a script may
// only touch keys of one slot: the writer groups the drained calls by slot
// and sends one script call per slot, all in one pipelined round (multi).
type batcher struct {
	active atomic.Int32 // script calls in flight, at most writers
	// overlapping says that the last batch carried more than one call:
	// calls are overlapping, and one that finds nothing in flight goes to
	// a writer rather than straight to Redis.
	overlapping atomic.Bool
	freed       chan struct{} // told each time a script call ends
	writers     int32
	q           chan *call
	exec        func(ctx context.Context, keys, args []string) ([]int64, error)
	slotOf      func(key string) uint16 // nil: one node, one script call per batch
	multi       func(ctx context.Context, keys, args [][]string) ([][]int64, []error)
	sizes       func(n int) // told the requests of each script call
	expiry      expiry      // wakes the queued callers whose deadlines pass
	timeout     time.Duration
	pad         string
	maxOps      int
	stop        chan struct{}
	wg          sync.WaitGroup
	// err answers the calls that find the batcher closed; it is set, once
	// (closeOnce), before stop is closed.
	err       error
	closeOnce sync.Once
	// entry is held, shared, by the callers putting a call in q, and
	// taken by close before it empties q, so that no call is put there
	// after: a call queued once the writers had gone would wait for an
	// answer that never comes. closed is under entry.
	entry  sync.RWMutex
	closed bool
	// retire is the timer that closes the batcher of a primary gone from
	// the Cluster's slot table (Store.retire); under Store.batchMu.
	retire *time.Timer
}

// call is one caller's groups, waiting for a writer.
type call struct {
	ctx  context.Context
	keys []string
	args []string // groups, without the script's leading TTL padding
	res  []int64
	err  error
	// done is sent one value once the writer is done with the call (see
	// finish).
	done chan struct{}
	// state is waiting until either a writer takes the call into a script
	// call (sent) or its caller gives up first (abandoned), never both, so
	// that an abandoned call is certain never to reach Redis.
	state atomic.Int32
	// deadline is ctx's: the batcher's expiry sends expired a value once
	// it passes or ctx ends; watchAt is the call's place there.
	deadline time.Time
	watchAt  int
	expired  chan struct{}
}

// calls keeps the calls whose callers were answered, for later calls:
// a call, with its channel, is two allocations per take otherwise. A call
// whose caller gave up is left to the collector, since the writer may
// still hold it.
var calls = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1), expired: make(chan struct{}, 1), watchAt: -1} }}

// finish tells c's caller that the writer is done with c: the writer
// touches c no more.
func (c *call) finish() { c.done <- struct{}{} }

const (
	callWaiting int32 = iota
	callSent
	callAbandoned
)

// errClosed answers the calls that find the store's batcher closed, and
// errRetired, wrapped with the node's address, those that find the
// batcher of a primary gone from the Cluster's slot table closed (see
// Store.retire). Neither call reached Redis.
var (
	errClosed  = errors.New("redis store closed")
	errRetired = errors.New("redis store: the node left the Cluster's slot table before the call was sent")
)

// errUnsent is returned, wrapped with the context's error, for a call
// whose deadline passed while it waited in this process for a writer or
// for a place in flight: Redis has not been asked, so the circuit breaker
// does not count it against Redis (the script calls in flight that kept
// it waiting count, if they fail).
var errUnsent = errors.New("redis store: deadline passed before the call was sent (this process is overloaded, or its script calls in flight are slow)")

func newBatcher(writers, maxOps int, timeout time.Duration, pad string, exec func(context.Context, []string, []string) ([]int64, error), sizes func(n int)) *batcher {
	b := &batcher{q: make(chan *call, 4*maxOps), freed: make(chan struct{}, writers), writers: int32(writers), exec: exec, timeout: timeout, pad: pad, maxOps: maxOps, stop: make(chan struct{}), sizes: sizes}
	for range writers {
		b.wg.Go(b.loop)
	}
	return b
}

// close closes b as the store closes.
func (b *batcher) close() { b.closeWith(errClosed) }

// closeWith stops b's writers and answers err to every call not sent:
// those queued now, and those that come later. Only the first close of b
// counts; a later one waits for it to be done.
func (b *batcher) closeWith(err error) {
	b.closeOnce.Do(func() {
		b.err = err
		close(b.stop) // wakes the writers, and the callers waiting for room in q
		b.entry.Lock()
		b.closed = true
		b.entry.Unlock()
		// No call is put in q from here on. The calls a writer takes are
		// answered by it; the rest, now.
	drain:
		for {
			select {
			case c := <-b.q:
				c.state.CompareAndSwap(callWaiting, callAbandoned)
				c.err = err
				c.finish()
			default:
				break drain
			}
		}
		b.wg.Wait()
	})
}

// stopped reports whether b is closed.
func (b *batcher) stopped() bool {
	select {
	case <-b.stop:
		return true
	default:
		return false
	}
}

// do runs c's groups in some batch and returns their replies. The
// store's deadline (timeout) runs from when the call is sent; until then
// only ctx's own deadline counts. Time spent waiting for a writer is this
// process's (a host short of CPU, a burst of calls), not Redis's, and a
// deadline that counted it would read a busy process as a failed store.
// The wait is bounded all the same: a writer takes every call queued
// (up to maxOps) into its next batch, and each batch ends by its deadline.
// A closed batcher (the store's, or a retired primary's) answers b.err
// to every call it has not sent, at once.
func (b *batcher) do(ctx context.Context, keys, args []string) ([]int64, error) {
	if b.stopped() {
		return nil, b.err
	}
	if !b.overlapping.Load() && b.active.Load() == 0 && b.active.CompareAndSwap(0, 1) {
		b.sizes(len(keys))
		full := make([]string, 0, len(args)+1)
		full = append(append(full, b.pad), args...)
		cctx, cancel := deadline.WithTimeout(ctx, b.timeout)
		res, err := b.exec(cctx, keys, full)
		cancel()
		b.release()
		if err == nil && len(res) != replyWidth*len(keys) {
			err = fmt.Errorf("redis store: script returned %d values for %d keys", len(res), len(keys))
		}
		return res, err
	}
	c := calls.Get().(*call)
	c.ctx, c.keys, c.args = ctx, keys, args
	if err := b.enqueue(ctx, c); err != nil {
		c.recycle()
		return nil, err
	}
	// A caller with a deadline waits for its answer or the expiry, and asks
	// for Done only once that has woken it; one without waits on Done.
	if dl, ok := ctx.Deadline(); ok {
		c.deadline = dl
		b.expiry.watch(c)
		select {
		case <-c.done:
			b.expiry.forget(c)
			return c.answer()
		case <-c.expired:
		}
	}
	select {
	case <-c.done:
		return c.answer()
	case <-ctx.Done():
		select {
		case <-c.done:
			// Answered as the deadline passed (a goroutine that waited for
			// a CPU finds both ready, and select picks at random): the
			// answer stands.
			return c.answer()
		default:
		}
		// The writer may still send the call; like any timed-out write, it
		// may or may not have been applied.
		if c.state.CompareAndSwap(callWaiting, callAbandoned) {
			return nil, fmt.Errorf("%w: %w", errUnsent, ctx.Err())
		}
		return nil, ctx.Err()
	}
}

// enqueue puts c in q for a writer, unless b is closed or ctx ends first.
func (b *batcher) enqueue(ctx context.Context, c *call) error {
	b.entry.RLock()
	defer b.entry.RUnlock()
	if b.closed {
		return b.err
	}
	select {
	case b.q <- c:
		return nil
	default:
	}
	select {
	case b.q <- c:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", errUnsent, ctx.Err())
	case <-b.stop:
		return b.err
	}
}

// answer is the reply of c, which the writer is done with, and gives c
// back for another call.
func (c *call) answer() ([]int64, error) {
	res, err := c.res, c.err
	c.recycle()
	return res, err
}

// recycle gives back c, which no writer holds.
func (c *call) recycle() {
	c.ctx, c.keys, c.args, c.res, c.err = nil, nil, nil, nil, nil
	c.state.Store(callWaiting)
	select {
	case <-c.expired: // expired as it was answered
	default:
	}
	calls.Put(c)
}

// acquire takes a place for a script call, if one is free.
func (b *batcher) acquire() bool {
	for {
		n := b.active.Load()
		if n >= b.writers {
			return false
		}
		if b.active.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// release gives back a script call's place and wakes a writer waiting
// for one.
func (b *batcher) release() {
	b.active.Add(-1)
	select {
	case b.freed <- struct{}{}:
	default: // as many wake-ups wait as there are writers
	}
}

// await waits for a place for a script call; false when the batcher is
// closed first.
func (b *batcher) await() bool {
	for !b.acquire() {
		select {
		case <-b.freed:
		case <-b.stop:
			return false
		}
	}
	return true
}

func (b *batcher) loop() {
	batch := make([]*call, 0, 64)
	var keys, args []string
	for {
		var first *call
		select {
		case first = <-b.q:
		case <-b.stop:
			return
		}
		if !b.await() {
			first.state.CompareAndSwap(callWaiting, callAbandoned)
			first.err = b.err
			first.finish()
			return
		}
		// The calls whose callers are ready to run join this batch rather
		// than the next: callers woken together by the last batch's replies
		// tend to come back together.
		runtime.Gosched()
		batch = append(batch[:0], first)
		ops := len(first.keys)
	drain:
		for ops < b.maxOps {
			select {
			case c := <-b.q:
				batch = append(batch, c)
				ops += len(c.keys)
			default:
				break drain
			}
		}
		// Calls whose caller has already given up are not sent.
		live := batch[:0]
		for _, c := range batch {
			if err := c.ctx.Err(); err != nil {
				c.state.CompareAndSwap(callWaiting, callAbandoned)
				c.err = fmt.Errorf("%w: %w", errUnsent, err)
				c.finish()
				continue
			}
			if !c.state.CompareAndSwap(callWaiting, callSent) {
				c.finish() // its caller gave up and has returned
				continue
			}
			live = append(live, c)
		}
		if len(live) == 0 {
			b.release()
			continue
		}
		b.overlapping.Store(len(live) > 1)
		if b.slotOf != nil {
			b.flushSlots(live)
			b.release()
			clear(batch)
			continue
		}
		keys, args = appendCalls(keys[:0], append(args[:0], b.pad), live)
		b.sizes(len(keys))
		ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
		res, err := b.exec(ctx, keys, args)
		cancel()
		b.release()
		deliver(live, len(keys), res, err)
		clear(batch)
	}
}

// flushSlots sends live as one script call per slot, pipelined.
func (b *batcher) flushSlots(live []*call) {
	var slots []uint16
	bySlot := map[uint16][]*call{}
	for _, c := range live {
		slot := b.slotOf(c.keys[0])
		if _, ok := bySlot[slot]; !ok {
			slots = append(slots, slot)
		}
		bySlot[slot] = append(bySlot[slot], c)
	}
	keys := make([][]string, len(slots))
	args := make([][]string, len(slots))
	for i, slot := range slots {
		keys[i], args[i] = appendCalls(nil, []string{b.pad}, bySlot[slot])
		b.sizes(len(keys[i]))
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	res, errs := b.multi(ctx, keys, args)
	cancel()
	for i, slot := range slots {
		deliver(bySlot[slot], len(keys[i]), res[i], errs[i])
	}
}

// appendCalls appends calls' keys and groups. Consecutive calls of one
// request with equal arguments and time go as a run that Redis parses
// once: a header ("T29") and one request's arguments (lua/main.lua).
func appendCalls(keys, args []string, calls []*call) ([]string, []string) {
	at, n, joins := 0, 0, false // the run: its header in args, its calls
	for i, c := range calls {
		keys = append(keys, c.keys...)
		if joins {
			n++
		} else {
			at, n = len(args), 1
			args = append(args, c.args...)
		}
		// Four arguments are one request (1 + 3n): only such a call joins.
		joins = i+1 < len(calls) && slices.Equal(calls[i+1].args, args[at:at+4])
		if n > 1 && !joins {
			args[at] = strings.ToUpper(args[at][:1]) + strconv.Itoa(n) + args[at][2:]
		}
	}
	return keys, args
}

// deliver hands each of calls its part of res, the replies of one script
// call over n keys, or the call's error.
func deliver(calls []*call, n int, res []int64, err error) {
	if err == nil && len(res) != replyWidth*n {
		err = fmt.Errorf("redis store: script returned %d values for %d keys", len(res), n)
	}
	off := 0
	for _, c := range calls {
		if err != nil {
			c.err = err
		} else {
			w := replyWidth * len(c.keys)
			c.res = res[off : off+w : off+w]
			off += w
		}
		c.finish()
	}
}
