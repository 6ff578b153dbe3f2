package redis

import (
	"container/heap"
	"sync"
	"time"
)

// expiry wakes the callers of a batcher whose deadlines pass while they
// wait, with one timer for all of them: a caller that waited on its
// context's Done would make a context whose timer is armed only when
// asked (the Envoy service's store deadline) arm one for every queued
// call, with its registration in the parent context, for a deadline that
// almost never passes. Calls are kept in a heap by deadline; the timer
// is set for the earliest. Deadlines of calls made under one timeout
// arrive in order, so the timer is set again only as the earliest call
// leaves, not as calls come (BenchmarkShouldRateLimitRedis).
//
// A context cancelled before its deadline (a client that hung up) is
// found by a look at every watched call's Err at least every scanEvery
// while calls are watched, so that a flood of calls given up while Redis
// hangs does not keep a goroutine each until their deadlines
// (TestAttackCancelledCallersReturnWhileRedisHangs); a writer does not
// send a call whose context has ended.
type expiry struct {
	mu    sync.Mutex
	calls callHeap
	timer *time.Timer
	at    time.Time // when the timer fires; zero while it is stopped
}

func newExpiry() *expiry {
	e := &expiry{}
	e.timer = time.AfterFunc(time.Hour, e.fire)
	e.timer.Stop()
	return e
}

// watch wakes c (c.expired) once its deadline, c.deadline, has passed,
// unless forget comes first.
func (e *expiry) watch(c *call) {
	e.mu.Lock()
	heap.Push(&e.calls, c)
	if e.at.IsZero() || c.deadline.Before(e.at) {
		e.at = c.deadline
		if scan := time.Now().Add(scanEvery); scan.Before(e.at) {
			e.at = scan
		}
		e.timer.Reset(time.Until(e.at))
	}
	e.mu.Unlock()
}

// scanEvery is how long, at most, a watched caller whose context was
// cancelled before its deadline waits to be woken.
const scanEvery = 10 * time.Millisecond

// forget stops watching c, if it is still watched.
func (e *expiry) forget(c *call) {
	e.mu.Lock()
	if c.heapAt >= 0 {
		heap.Remove(&e.calls, c.heapAt)
	}
	e.mu.Unlock()
}

// fire wakes the calls whose deadlines have passed or whose contexts
// have ended, and sets the timer for the next deadline or scan.
func (e *expiry) fire() {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	for len(e.calls) > 0 && !e.calls[0].deadline.After(now) {
		e.wake(heap.Pop(&e.calls).(*call))
	}
	var ended []*call
	for _, c := range e.calls {
		if c.ctx.Err() != nil {
			ended = append(ended, c)
		}
	}
	for _, c := range ended {
		e.wake(heap.Remove(&e.calls, c.heapAt).(*call))
	}
	e.at = time.Time{}
	if len(e.calls) > 0 {
		e.at = e.calls[0].deadline
		if scan := now.Add(scanEvery); scan.Before(e.at) {
			e.at = scan
		}
		e.timer.Reset(e.at.Sub(now))
	}
}

// wake tells c's caller, once: c has left the heap, and a call is
// watched once per wait.
func (e *expiry) wake(c *call) { c.expired <- struct{}{} }

// callHeap orders watched calls by deadline (container/heap); a call
// knows its place (heapAt, -1 when not watched) so that it can leave.
type callHeap []*call

func (h callHeap) Len() int           { return len(h) }
func (h callHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }
func (h callHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapAt, h[j].heapAt = i, j
}
func (h *callHeap) Push(x any) {
	c := x.(*call)
	c.heapAt = len(*h)
	*h = append(*h, c)
}
func (h *callHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	c.heapAt = -1
	return c
}
