package engine

// SlidingState is one sliding-window key's state: the start of the window
// it last counted in (microseconds), the micro-tokens admitted in that
// window, and those admitted in the window before it. State holds it
// as Stamp, Tokens and Prev.
type SlidingState struct {
	Start, Count, Prev int64
}

// TakeSlidingWindow decides one request against a sliding-window counter
// at time now (microseconds), with the window bounds b (Windows).
//
// The counter keeps two numbers per key, the count of the current window
// and the count of the previous one, and estimates the count of the
// sliding period that ends at now as
//
//	used = count + ceil(prev × (end − now) / (end − start))
//
// the previous window's count weighted by the share of it that the
// sliding period still overlaps, as if its requests had been spread
// evenly over it. (For calendar windows of unequal lengths the share is
// the current window's part yet to come.) A request is admitted when used
// plus its cost is at most the capacity. The ceiling keeps the estimate
// from undercounting the weighted sum by a fraction of a micro-token.
// docs/sliding-window.md bounds the estimate's error against the exact
// sliding log: it admits at most twice the capacity in any one period,
// and that only when the previous window's requests all came at its end;
// it never admits more than a fixed window of the same windows would.
//
// A rejected request gets RetryAfter = the wait until the earliest time
// at which it would be admitted: within this window, once the previous
// window's weight has shrunk enough; else in the next window, where this
// window's count is the one weighted. ResetAfter is the wait until used
// is zero: the end of the next window while this window counted anything,
// the end of this one while only the previous window did. An absent key,
// or one last written two windows ago or earlier, has counted nothing; a
// clock that steps back counts in the window already written.
//
// With take set an admitted request's cost is added to the count and the
// returned state is the one to store; a peek gets the Outcome the take
// would. cost has been validated (0 < cost <= capacity); reservations are
// refused before this: a counter has no future turn to give.
func TakeSlidingWindow(p *Params, st SlidingState, present bool, now, cost int64, take bool, b Bounds) (SlidingState, Outcome) {
	w := rollSliding(st, present, now, &b)
	var o Outcome
	used := w.count + w.weighted
	if used+cost <= p.Capacity {
		o.Allowed = true
		used += cost
		w.count += cost
	} else {
		o.RetryAfter = w.wait(p.Capacity, cost, now)
	}
	o.Tokens = p.Capacity - used
	o.ResetAfter = w.reset(now)
	return SlidingState{Start: w.stamp, Count: w.count, Prev: w.prev}, o
}

// RefundSlidingWindow takes amount micro-tokens back out of a sliding
// window's counts at time now, from the current window's count first and
// then from the previous one's, after rolling them forward as a take
// would. An absent key has counted nothing: write is false.
func RefundSlidingWindow(p *Params, st SlidingState, present bool, now, amount int64, b Bounds) (SlidingState, Outcome, bool) {
	if !present {
		return st, Outcome{Allowed: true, Tokens: p.Capacity}, false
	}
	w := rollSliding(st, present, now, &b)
	back := min(amount, w.count)
	w.count -= back
	w.prev -= min(amount-back, w.prev)
	w.weighted = weigh(w.prev, now, w.start, w.end)
	o := Outcome{Allowed: true, Tokens: p.Capacity - w.count - w.weighted, ResetAfter: w.reset(now)}
	return SlidingState{Start: w.stamp, Count: w.count, Prev: w.prev}, o, true
}

// sliding is a sliding window's state rolled to a time: the counts, the
// bounds of the window the time counts in and of the one after it, the
// start to store and the previous count's weight.
type sliding struct {
	count, prev, weighted int64
	stamp, start, end     int64
	next                  int64
}

// rollSliding rolls st forward to now: a key last written in the window
// before now's has its count become the previous one.
func rollSliding(st SlidingState, present bool, now int64, b *Bounds) sliding {
	before, start, end, next := b.Pick(now)
	w := sliding{stamp: start, start: start, end: end, next: next}
	switch {
	case !present:
	case st.Start >= start: // this window, or a clock that stepped back
		w.count, w.prev, w.stamp = st.Count, st.Prev, st.Start
	case st.Start >= before:
		w.prev = st.Count
	}
	w.weighted = weigh(w.prev, now, start, end)
	return w
}

// weigh is ceil(prev × (end − now) / (end − start)), the previous
// window's count weighted by the share of the window [start, end) still
// to come at now (all of it for a time before start).
func weigh(prev, now, start, end int64) int64 {
	if prev == 0 {
		return 0
	}
	length := end - start
	elapsed := max(now-start, 0)
	return prev - MulDiv(prev, elapsed, length)
}

// wait is the wait from now until a request of cost would be admitted
// against a capacity of capacity (it is not now). Within the window,
// ceil(prev × r / length) <= room holds for the time r before the end
// when r <= floor(room × length / prev); past the end, the count becomes
// the weighted one of a window of next − end.
func (w *sliding) wait(capacity, cost, now int64) int64 {
	if room := capacity - w.count - cost; room >= 0 {
		// w.weighted > room, so prev > room >= 0.
		return w.end - MulDiv(room, w.end-w.start, w.prev) - now
	}
	room := capacity - cost
	if w.count <= room {
		return w.end - now
	}
	return w.next - MulDiv(room, w.next-w.end, w.count) - now
}

// reset is the wait from now until nothing is counted.
func (w *sliding) reset(now int64) int64 {
	switch {
	case w.count > 0:
		return w.next - now
	case w.weighted > 0:
		return w.end - now
	}
	return 0
}
