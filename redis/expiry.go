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
// Only the deadline is watched: a caller whose context is cancelled
// before it is waits for its call's answer, or for its deadline. A
// writer does not send a call whose context has ended, so such a caller
// waits at most for the script call in flight.
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
		e.timer.Reset(time.Until(c.deadline))
	}
	e.mu.Unlock()
}

// forget stops watching c, if it is still watched.
func (e *expiry) forget(c *call) {
	e.mu.Lock()
	if c.heapAt >= 0 {
		heap.Remove(&e.calls, c.heapAt)
	}
	e.mu.Unlock()
}

// fire wakes the calls whose deadlines have passed and sets the timer
// for the next.
func (e *expiry) fire() {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	for len(e.calls) > 0 && !e.calls[0].deadline.After(now) {
		c := heap.Pop(&e.calls).(*call)
		c.expired <- struct{}{} // buffered, and a call is popped once per watch
	}
	e.at = time.Time{}
	if len(e.calls) > 0 {
		e.at = e.calls[0].deadline
		e.timer.Reset(e.at.Sub(now))
	}
}

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
