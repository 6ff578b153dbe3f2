package engine

// State is one key's state for any algorithm, for engines that evaluate the
// algorithms in Go (the memory store). Each algorithm reads its own fields:
//
//   - token and leaky buckets: Tokens and Stamp, BucketState's (Bucket):
//     scaled tokens and the microsecond up to which refill is counted;
//   - fixed windows: Tokens and Stamp, WindowState's Tokens and Start
//     (Window): micro-tokens and the start of the window they count in;
//   - sliding windows: Stamp, Tokens and Prev, SlidingState's Start, Count
//     and Prev: the window last counted in and the counts of it and of the
//     window before it;
//   - calendar windows: as fixed windows;
//   - sliding logs: Log, the admitted requests of the last period;
//   - concurrency limits: Leases, the slots held (see StepLease).
type State struct {
	Tokens int64
	Stamp  int64
	// Prev is a sliding window's count of the window before Stamp's.
	Prev   int64
	Log    []LogEntry
	Leases []LeaseEntry
}

// Bucket returns st as a token (or leaky) bucket's state.
func (st *State) Bucket() BucketState { return BucketState{Scaled: st.Tokens, Stamp: st.Stamp} }

// Window returns st as a fixed window's state.
func (st *State) Window() WindowState { return WindowState{Tokens: st.Tokens, Start: st.Stamp} }

// Evaluate decides ch against a limit of parameters p at time now (microseconds) for key, whose
// state is st (present reports whether the key has state at all). With
// take set, an admitted request updates st in place and Evaluate returns
// true: the caller keeps st. A peek, or a rejection, leaves st as it was.
func Evaluate(p *Params, st *State, present bool, key string, now int64, ch Charge, take bool) (Outcome, bool) {
	if p.Windowed() {
		return evaluateWindow(p, st, present, now, ch, take)
	}
	switch p.Algorithm {
	case FixedWindow:
		next, o := TakeFixedWindow(p, st.Window(), present, now, ch.Cost, windowOffset(p, present, key), ch.Reserve, ch.MaxReserved)
		if take && o.Allowed {
			st.Tokens, st.Stamp = next.Tokens, next.Start
			return o, true
		}
		return o, false
	case SlidingLog:
		log := st.Log
		if !present {
			log = nil
		}
		log, o := TakeSlidingLog(p, log, now, ch.Cost, take)
		if take {
			st.Log = log
			return o, true
		}
		return o, false
	default:
		next, o := TakeTokenBucket(p, st.Bucket(), present, now, ch.Cost, ch.Reserve, ch.MaxReserved)
		if take && o.Allowed {
			st.Tokens, st.Stamp = next.Scaled, next.Stamp
			return o, true
		}
		return o, false
	}
}

// Refund gives ch.Cost back to st at time now (see OpRefund), updating st
// in place; it reports whether st is to be kept (false for an absent key,
// which is full already).
func Refund(p *Params, st *State, present bool, key string, now int64, ch Charge) (Outcome, bool) {
	if p.Windowed() {
		return refundWindow(p, st, present, now, ch)
	}
	switch p.Algorithm {
	case FixedWindow:
		next, o, write := RefundFixedWindow(p, st.Window(), present, now, ch.Cost, windowOffset(p, present, key))
		st.Tokens, st.Stamp = next.Tokens, next.Start
		return o, write
	case SlidingLog:
		if !present {
			return Outcome{Allowed: true, Tokens: p.Capacity}, false
		}
		log, o := RefundSlidingLog(p, st.Log, now, ch.Cost)
		st.Log = log
		return o, true
	default:
		next, o, write := RefundTokenBucket(p, st.Bucket(), present, now, ch.Cost)
		st.Tokens, st.Stamp = next.Scaled, next.Stamp
		return o, write
	}
}

// Windowed reports whether p's windows have bounds of their own (Windows):
// a sliding window, or a window aligned to the calendar.
func (p *Params) Windowed() bool { return p.Algorithm == SlidingWindow || p.Calendar != 0 }

// evaluateWindow is Evaluate for a sliding or calendar window, on the
// bounds of p's windows around now. An admitted take updates st in place
// (Stamp, Tokens and, for a sliding window, Prev).
func evaluateWindow(p *Params, st *State, present bool, now int64, ch Charge, take bool) (Outcome, bool) {
	b := Windows(p, now)
	if p.Algorithm == SlidingWindow {
		next, o := TakeSlidingWindow(p, SlidingState{Start: st.Stamp, Count: st.Tokens, Prev: st.Prev}, present, now, ch.Cost, take, b)
		if take && o.Allowed {
			st.Stamp, st.Tokens, st.Prev = next.Start, next.Count, next.Prev
			return o, true
		}
		return o, false
	}
	next, o := TakeCalendarWindow(p, st.Window(), present, now, ch.Cost, b)
	if take && o.Allowed {
		st.Tokens, st.Stamp = next.Tokens, next.Start
		return o, true
	}
	return o, false
}

// refundWindow is Refund for a sliding or calendar window.
func refundWindow(p *Params, st *State, present bool, now int64, ch Charge) (Outcome, bool) {
	b := Windows(p, now)
	if p.Algorithm == SlidingWindow {
		next, o, write := RefundSlidingWindow(p, SlidingState{Start: st.Stamp, Count: st.Tokens, Prev: st.Prev}, present, now, ch.Cost, b)
		st.Stamp, st.Tokens, st.Prev = next.Start, next.Count, next.Prev
		return o, write
	}
	next, o, write := RefundCalendarWindow(p, st.Window(), present, now, ch.Cost, b)
	st.Tokens, st.Stamp = next.Tokens, next.Start
	return o, write
}

// windowOffset is the offset of a fixed window of key: p's, or the key's
// own (WindowOffset) for a window that has none and a key without state.
func windowOffset(p *Params, present bool, key string) int64 {
	if p.Offset < 0 && !present {
		return WindowOffset(key, p.Period)
	}
	return p.Offset
}
