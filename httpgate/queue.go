package httpgate

import (
	"container/heap"
	"sync"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// A limit that holds requests for their turns (a leaky bucket, reserve:
// true) queues them in this process: the proxy, the middleware and
// forward auth wait until each admitted request's turn (Options.Delay).
// Each such limit has a queue here, by name: the requests it holds now,
// at most its max_queued. A request takes a place before it is decided
// and keeps it until its turn, so the bound holds however many requests
// race for the last place; one that finds no place is decided without a
// reservation (sluice.Request.NoReserve, by the store in the same atomic
// step), so it passes only if it needs no wait, and is otherwise refused
// at once (queue_full) having been charged nothing. The wait a request
// is given is bounded by max_queue_delay in the store itself (see
// policy's queue_delay_exceeded).
//
// The queue is shared by every key of its limit, so it is shared fairly:
// a request takes a place only while its key holds fewer than its share,
// max_queued / (the keys holding places, its own counted, plus one), and
// at least one. The plus one keeps room for a key that holds none yet: a
// client that fills the queue with its own requests (each one its bucket
// allows) stops at half of it, and every other key still finds places.
// A rule without limit_keys has one key for every request, which the
// share cannot tell apart: its requests may fill the whole queue.

// ruleQueue is one limit's queue in this process.
//
// A refused request is told how long until a place frees (room), under
// the mutex every request of the limit takes: the queue, and each key's
// share of it, keep their places in order of turn (turns), so that
// answer costs the same however many places are held, by whichever
// keys. Were it a scan of the places, one client refused again and
// again would make every refusal cost max_queued steps, all of them
// holding up every other request of the limit.
type ruleQueue struct {
	name  string
	m     ShapingMetrics
	mu    sync.Mutex
	held  map[*place]struct{}
	all   turns             // every held place
	byKey map[string]*turns // the places each key holds
	// examined counts the places room has looked at, for tests.
	examined int
}

// place is one request's place in a queue: until its turn is known, at
// is zero.
type place struct {
	q   *ruleQueue
	key string
	at  time.Time
	// i is the place's index in the queue's turns (byQueue) and in its
	// key's (byOwnKey), while its turn is known.
	i [2]int
}

// The indexes of a place's position in its queue's turns and its key's.
const (
	byQueue = iota
	byOwnKey
)

func newRuleQueue(name string, m ShapingMetrics) *ruleQueue {
	return &ruleQueue{name: name, m: m, held: map[*place]struct{}{}, all: turns{which: byQueue}, byKey: map[string]*turns{}}
}

// queue returns the queue of the limit called name.
func (g *Gate) queue(name string) *ruleQueue {
	g.shaping.mu.Lock()
	defer g.shaping.mu.Unlock()
	q := g.shaping.queues[name]
	if q == nil {
		if g.shaping.queues == nil {
			g.shaping.queues = map[string]*ruleQueue{}
		}
		q = newRuleQueue(name, g.shapingMetrics())
		g.shaping.queues[name] = q
	}
	return q
}

// enter takes a place for a request of key when fewer than most (0: no
// bound) are held and, when fair, key holds fewer than its share
// (fairShare). Otherwise it returns nil and how long until the first
// place that would make room frees: the first held request's turn, or
// key's own first when its share is what refused it.
func (q *ruleQueue) enter(most int, key string, fair bool, now time.Time) (*place, time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	full := most > 0 && len(q.held) >= most
	if !full && most > 0 && fair {
		keys := len(q.byKey)
		own := q.byKey[key].len()
		if own == 0 {
			keys++
		}
		if own >= fairShare(most, keys) {
			return nil, q.room(key, now)
		}
	}
	if full {
		return nil, q.room("", now)
	}
	p := &place{q: q, key: key}
	q.held[p] = struct{}{}
	k := q.byKey[key]
	if k == nil {
		k = &turns{which: byOwnKey}
		q.byKey[key] = k
	}
	q.all.add(p)
	k.add(p)
	q.m.Queued(q.name, int64(len(q.held)))
	return p, 0
}

// fairShare is the most places one key may hold in a queue of most
// places that keys keys (the asking one counted) hold places in: an
// equal share with room kept for one more key, at least one place.
func fairShare(most, keys int) int { return max(1, most/(keys+1)) }

// room is how long until the first place of key (any key: "") frees, 0
// when a place's turn is not known yet (it leaves soon).
func (q *ruleQueue) room(key string, now time.Time) time.Duration {
	t := &q.all
	if key != "" {
		t = q.byKey[key]
	}
	if t == nil || t.unknown > 0 || len(t.known) == 0 {
		return 0
	}
	q.examined++
	return max(t.known[0].at.Sub(now), 0)
}

// setTurn records p's turn, at.
func (q *ruleQueue) setTurn(p *place, at time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.held[p]; !ok {
		p.at = at
		return
	}
	k := q.byKey[p.key]
	q.all.remove(p)
	k.remove(p)
	p.at = at
	q.all.add(p)
	k.add(p)
}

// leave gives p up.
func (q *ruleQueue) leave(p *place) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.held[p]; !ok {
		return
	}
	delete(q.held, p)
	q.all.remove(p)
	k := q.byKey[p.key]
	if k.remove(p); k.len() == 0 {
		delete(q.byKey, p.key)
	}
	q.m.Queued(q.name, int64(len(q.held)))
}

// queued is the places one request holds, one per limit of its that
// holds requests.
type queued struct {
	g      *Gate
	places []queuedMatch
}

type queuedMatch struct {
	i     int    // the match's index
	p     *place // nil: the queue was full
	limit string
}

// enqueue takes a place in the queue of every limit of ms that may hold
// the request; a match whose queue is full is marked so (QueueFull).
func (g *Gate) enqueue(ms []policy.Match) *queued {
	var q *queued
	for i := range ms {
		holds, most := ms[i].Queue()
		if !holds {
			continue
		}
		if q == nil {
			q = &queued{g: g}
		}
		name := ms[i].Request.Limit.Name()
		// A rule without limit_keys has one key: nothing to share fairly.
		fair := ms[i].Rule != nil && len(ms[i].Rule.LimitKeys) > 0
		p, room := g.queue(name).enter(most, ms[i].Request.Key, fair, g.lim.Now())
		if p == nil {
			ms[i].QueueFull(room)
		}
		q.places = append(q.places, queuedMatch{i: i, p: p, limit: name})
	}
	return q
}

// decided records the turns v gave: a place whose request was refused,
// or needs no wait, is given up now; the others are kept until release.
func (q *queued) decided(v *policy.Verdict) {
	if q == nil {
		return
	}
	now := q.g.lim.Now()
	kept := q.places[:0]
	for _, qm := range q.places {
		d := v.Results[qm.i].Decision
		if v.Allowed {
			q.g.shapingMetrics().QueueDelay(qm.limit, max(d.RetryAfter, 0))
		}
		if qm.p == nil {
			continue
		}
		if !v.Allowed || d.RetryAfter <= 0 {
			qm.p.q.leave(qm.p)
			continue
		}
		qm.p.q.setTurn(qm.p, now.Add(d.RetryAfter))
		kept = append(kept, qm)
	}
	q.places = kept
}

// release gives up every place still held: the request's turn has come,
// or it will not wait for it.
func (q *queued) release() {
	if q == nil {
		return
	}
	for _, qm := range q.places {
		if qm.p != nil {
			qm.p.q.leave(qm.p)
		}
	}
	q.places = nil
}

// turns is a set of places in order of turn: those whose turn is not
// known yet counted, the others in a heap by turn, the first at known[0].
type turns struct {
	which   int // which of a place's indexes (byQueue, byOwnKey) is this set's
	unknown int
	known   []*place
}

// len is the places in t; 0 for a nil t.
func (t *turns) len() int {
	if t == nil {
		return 0
	}
	return t.unknown + len(t.known)
}

func (t *turns) add(p *place) {
	if p.at.IsZero() {
		t.unknown++
		return
	}
	heap.Push((*turnHeap)(t), p)
}

func (t *turns) remove(p *place) {
	if p.at.IsZero() {
		t.unknown--
		return
	}
	heap.Remove((*turnHeap)(t), p.i[t.which])
}

// turnHeap is turns' known places as a heap.Interface.
type turnHeap turns

func (h *turnHeap) Len() int           { return len(h.known) }
func (h *turnHeap) Less(i, j int) bool { return h.known[i].at.Before(h.known[j].at) }
func (h *turnHeap) Swap(i, j int) {
	h.known[i], h.known[j] = h.known[j], h.known[i]
	h.known[i].i[h.which], h.known[j].i[h.which] = i, j
}

func (h *turnHeap) Push(x any) {
	p := x.(*place)
	p.i[h.which] = len(h.known)
	h.known = append(h.known, p)
}

func (h *turnHeap) Pop() any {
	n := len(h.known) - 1
	p := h.known[n]
	h.known[n] = nil
	h.known = h.known[:n]
	return p
}
