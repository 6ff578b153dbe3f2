package quota

import (
	"context"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// rule is one leased limit: its settings and the slices of its keys.
type rule struct {
	lim    *sluice.Limit
	set    Settings // with defaults
	most   int64    // max slice, micro-tokens; 0: exact
	least  int64    // a slice's first size, micro-tokens
	window bool     // a fixed window: slices end with it
	margin time.Duration

	mu     sync.Mutex
	keys   map[string]*slot
	closed bool

	taken, returned, dropped atomic.Int64
	held                     atomic.Int64 // micro-tokens in slices
}

// slot is one key's slice and what sizes the next one.
type slot struct {
	tokens  int64     // micro-tokens left in the slice
	size    int64     // the next slice's size
	gen     uint64    // counts slices, so that a put-back finds its own
	pending int64     // micro-tokens of the take in flight
	takenAt time.Time // when the slice's take was sent
	expires time.Time // takenAt + term
	// windowEnd is when a fixed window's slice stops being usable (see
	// WindowUseBy); zero for a token bucket.
	windowEnd  time.Time
	storeLeft  int64     // the store's tokens after the slice's take
	resetAt    time.Time // when the store's bucket would be full again
	hits       int       // requests in the term from termStart
	termStart  time.Time
	exactUntil time.Time // after a refused slice: exact until then
	// rejectUntil is when the store's last refusal of a request of this
	// key, of rejectCost, ends: until then requests of that cost or more
	// are refused here, as the store would refuse them (see refused).
	rejectUntil time.Time
	rejectCost  int64
	fetch       chan struct{} // closed when the take in flight is back
}

func newRule(lim *sluice.Limit, st Settings) *rule {
	st = st.WithDefaults()
	p := lim.Params()
	ru := &rule{lim: lim, set: st, most: MaxSlice(p.Capacity, st), keys: make(map[string]*slot)}
	ru.least = min(MinSlice*engine.TokenScale, ru.most)
	if p.Algorithm == engine.FixedWindow {
		ru.window = true
		ru.margin = windowMargin(p)
	}
	return ru
}

// usableUntil is when the slice stops answering.
func (sl *slot) usableUntil() time.Time {
	if !sl.windowEnd.IsZero() && sl.windowEnd.Before(sl.expires) {
		return sl.windowEnd
	}
	return sl.expires
}

// answered is a request a slice admitted, with the slice it came from.
type answered struct {
	sluice.Decision
	gen uint64
}

// local admits cost micro-tokens of key from its slice, taking a slice
// from the store when the key is hot and its slice is short. ok false:
// the request is to be decided exactly. An error is the store's, from
// taking a slice.
func (ru *rule) local(ctx context.Context, s *Store, key string, cost int64) (a answered, ok bool, err error) {
	if cost > ru.most {
		return a, false, nil // also every limit whose max slice is 0
	}
	counted := false
	for {
		now := s.now()
		ru.mu.Lock()
		sl := ru.keys[key]
		if ru.closed || sl == nil && !s.admitKey() {
			ru.mu.Unlock()
			return a, false, nil
		}
		if sl == nil {
			sl = &slot{size: ru.least, termStart: now}
			// A copy: a key may be a piece of a request line (a query
			// parameter), which the map would keep whole for as long as
			// it follows the key (TestAttackLongRequestLinesHeldByFollowedKeys).
			ru.keys[strings.Clone(key)] = sl
		}
		if !counted {
			counted = true
			if now.Sub(sl.termStart) >= ru.set.Term || now.Before(sl.termStart) {
				sl.termStart, sl.hits = now, 0
			}
			sl.hits++
		}
		var back int64
		if sl.tokens > 0 && !now.Before(sl.usableUntil()) {
			back = ru.end(sl, now)
		}
		var wait chan struct{} // a take in flight: this request's (take > 0) or another's
		var take int64
		switch {
		case sl.tokens < cost && cost >= sl.rejectCost && now.Before(sl.rejectUntil):
			a, ok = ru.refusal(sl, now), true
		case sl.tokens >= cost:
			sl.tokens -= cost
			ru.held.Add(-cost)
			a, ok = ru.answer(sl, now), true
		case sl.fetch == nil && (sl.hits < ru.set.HotAfter || now.Before(sl.exactUntil)):
		case sl.fetch != nil: // one take per key at a time: wait for it, then look again
			wait = sl.fetch
		default:
			take, wait = ru.topUp(sl, now, cost), make(chan struct{})
			sl.fetch, sl.pending = wait, take
		}
		ru.mu.Unlock()
		s.returnLeft(ctx, ru, key, back)
		switch {
		case take > 0:
			return ru.fetch(ctx, s, key, sl, wait, now, take, cost)
		case wait == nil:
			return a, ok, nil
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return a, false, ctx.Err()
		}
	}
}

// topUp sizes the take that refills sl for a request of cost: up to the
// slice's size (at least cost), counting what it still holds, so that a
// key never holds more than the max slice. Under ru.mu.
func (ru *rule) topUp(sl *slot, now time.Time, cost int64) int64 {
	if !sl.takenAt.IsZero() {
		// The slice ran short: it was used up, in so much of its term.
		sl.size = NextSize(sl.size, 0, ru.least, ru.most, now.Sub(sl.takenAt), ru.set.Term)
	}
	if ru.window {
		// Leftovers of a window's slice are not carried into a slice that
		// the store may charge to the next window: dropped. So are the
		// charges put back to it meanwhile (a new generation), which
		// the slice on its way would carry there too
		// (TestAttackPutBackCarriesWindowIntoNext).
		ru.discard(sl)
		sl.gen++
	}
	want := min(max(sl.size, cost), ru.most)
	return want - sl.tokens
}

// fetch takes a slice of take micro-tokens for key and answers the
// request of cost from it; a refused slice sends the request to the
// exact path (ok false) and shrinks the key's slices.
func (ru *rule) fetch(ctx context.Context, s *Store, key string, sl *slot, c chan struct{}, sent time.Time, take, cost int64) (a answered, ok bool, err error) {
	ch, err := sluice.Request{Limit: ru.lim, Key: key, Cost: engine.FromMicroTokens(take), NoReserve: true}.Charged(engine.OpTake)
	var d sluice.Decision
	if err == nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout) // as returnLeft's
		d, err = s.inner.Take(sctx, engine.OpTake, ch)
		cancel()
	}
	ru.mu.Lock()
	defer ru.mu.Unlock()
	sl.fetch, sl.pending = nil, 0
	close(c)
	if err != nil {
		return a, false, err
	}
	if !d.Allowed {
		sl.size = max(ru.least, sl.size/2)
		sl.exactUntil = sent.Add(min(d.RetryAfter, ru.set.Term))
		return a, false, nil
	}
	ru.taken.Add(1)
	sl.gen++
	sl.tokens += take
	ru.held.Add(take)
	sl.takenAt, sl.expires = sent, sent.Add(ru.set.Term)
	sl.storeLeft = int64(math.Round(d.Tokens * engine.TokenScale))
	sl.resetAt = sent.Add(d.ResetAfter)
	sl.windowEnd = time.Time{}
	if ru.window {
		sl.windowEnd = WindowUseBy(ru.lim.Params(), sent, d, ru.margin)
		if sl.windowEnd.IsZero() {
			sl.windowEnd = sent // usable for this request alone
		}
	}
	// The request that asked for the slice was admitted with it, inside
	// the store's window: it is answered whatever the slice's use-by.
	sl.tokens -= cost
	ru.held.Add(-cost)
	a = ru.answer(sl, sent)
	if now := s.now(); ru.closed || ru.keys[key] != sl || !now.Before(sl.usableUntil()) {
		// The slice ended while it was on its way (a reload, a reset,
		// a window's end): what is left is dropped, never kept.
		ru.discard(sl)
	}
	return a, true, nil
}

// answer is the Decision of a request a slice admitted. Remaining is an
// estimate: the store's tokens when the slice was taken plus the slice's
// own left, which counts neither what other processes took since nor
// the refill. Under ru.mu.
func (ru *rule) answer(sl *slot, now time.Time) answered {
	left := sl.storeLeft + sl.tokens
	return answered{gen: sl.gen, Decision: sluice.Decision{
		Allowed:    true,
		Capacity:   ru.lim.Params().Capacity / engine.TokenScale,
		Remaining:  max(left, 0) / engine.TokenScale,
		ResetAfter: max(sl.resetAt.Sub(now), 0),
		Rule:       ru.lim.Name(),
		Tokens:     engine.FromMicroTokens(left),
	}}
}

// end ends sl's slice at now and returns the micro-tokens to refund: a
// token bucket's leftovers always (tokens are tokens whenever they come
// back), a fixed window's only while at least a margin remains before
// the window's use-by, for a refund that lands in the next window would
// add tokens to it; past that they are dropped. It sizes the next slice
// from how much of this one went unused. Under ru.mu.
func (ru *rule) end(sl *slot, now time.Time) int64 {
	left := sl.tokens
	if left <= 0 {
		return 0
	}
	sl.size = NextSize(sl.size, left, ru.least, ru.most, now.Sub(sl.takenAt), ru.set.Term)
	sl.tokens = 0
	sl.gen++
	ru.held.Add(-left)
	if ru.window && !now.Add(ru.margin).Before(sl.windowEnd) {
		ru.dropped.Add(1)
		return 0
	}
	ru.returned.Add(1)
	return left
}

// putBack gives cost back to key's slice if it is still the slice gen
// it was charged to, as far as it and a take on its way stay within the
// max slice (TestAttackPutBackDuringTopUpExceedsMaxSlice).
func (ru *rule) putBack(key string, cost int64, gen uint64) {
	ru.mu.Lock()
	defer ru.mu.Unlock()
	if sl := ru.keys[key]; sl != nil && sl.gen == gen && !ru.closed {
		cost = max(min(cost, ru.most-sl.tokens-sl.pending), 0)
		sl.tokens += cost
		ru.held.Add(cost)
	}
}

// forgetRefusal ends the refusal kept for key (see refused).
func (ru *rule) forgetRefusal(key string) {
	ru.mu.Lock()
	defer ru.mu.Unlock()
	if sl := ru.keys[key]; sl != nil {
		sl.rejectUntil = time.Time{}
	}
}

// drop discards key's slice without returning it (a Reset refills the
// key anyway), and the refusal kept for it.
func (ru *rule) drop(key string) {
	ru.mu.Lock()
	defer ru.mu.Unlock()
	if sl := ru.keys[key]; sl != nil {
		sl.rejectUntil = time.Time{}
		if ru.discard(sl) {
			sl.gen++
		}
	}
}

// discard drops what is left in sl, not returned to the store, and
// reports whether there was any.
func (ru *rule) discard(sl *slot) bool {
	if sl.tokens <= 0 {
		return false
	}
	ru.held.Add(-sl.tokens)
	sl.tokens = 0
	ru.dropped.Add(1)
	return true
}

// refused records the store's refusal d of a request of key costing
// cost, sent at sent, when the key is hot: until its wait ends, requests
// of that cost or more are refused here without a store call. The store
// said none could pass before then; tokens another process returns
// meanwhile could only have admitted more, so the local refusal can
// under-admit, never over-admit (as the Redis store's over-limit cache).
func (ru *rule) refused(key string, cost int64, sent time.Time, d sluice.Decision) {
	if d.RetryAfter <= 0 {
		return
	}
	ru.mu.Lock()
	defer ru.mu.Unlock()
	sl := ru.keys[key]
	if sl == nil || sl.hits < ru.set.HotAfter {
		return
	}
	until := sent.Add(d.RetryAfter)
	if until.After(sl.rejectUntil) || cost < sl.rejectCost {
		sl.rejectUntil, sl.rejectCost = until, cost
	}
}

// refusal is the Decision of a request refused locally. Under ru.mu.
func (ru *rule) refusal(sl *slot, now time.Time) answered {
	return answered{gen: sl.gen, Decision: sluice.Decision{
		Capacity:   ru.lim.Params().Capacity / engine.TokenScale,
		RetryAfter: sl.rejectUntil.Sub(now),
		ResetAfter: max(sl.resetAt.Sub(now), 0),
		Rule:       ru.lim.Name(),
	}}
}
