package sluice

// State is one key's state for any algorithm, for engines that evaluate the
// algorithms in Go (the memory store). A and B are BucketState's Tokens and
// Stamp, or WindowState's Tokens and Start; Log is a sliding log's entries.
type State struct {
	A, B int64
	Log  []LogEntry
}

// Evaluate decides ch against l at time now (microseconds) for key, whose
// state is st (present reports whether the key has state at all). With
// take set, an admitted request updates st in place and Evaluate returns
// true: the caller keeps st. A peek, or a rejection, leaves st as it was.
func (l *Limit) Evaluate(st *State, present bool, key string, now int64, ch Charge, take bool) (Outcome, bool) {
	p := &l.params
	switch p.Algorithm {
	case FixedWindow:
		offset := p.Offset
		if offset < 0 && !present {
			offset = WindowOffset(key, p.Period)
		}
		next, o := TakeFixedWindow(p, WindowState{Tokens: st.A, Start: st.B}, present, now, ch.Cost, offset)
		if take && o.Allowed {
			st.A, st.B = next.Tokens, next.Start
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
		next, o := TakeTokenBucket(p, BucketState{Tokens: st.A, Stamp: st.B}, present, now, ch.Cost, ch.Reserve, ch.MaxReserved)
		if take && o.Allowed {
			st.A, st.B = next.Tokens, next.Stamp
			return o, true
		}
		return o, false
	}
}

// Refund gives ch.Cost back to st at time now (see OpRefund), updating st
// in place; it reports whether st is to be kept (false for an absent key,
// which is full already).
func (l *Limit) Refund(st *State, present bool, key string, now int64, ch Charge) (Outcome, bool) {
	p := &l.params
	switch p.Algorithm {
	case FixedWindow:
		offset := p.Offset
		if offset < 0 && !present {
			offset = WindowOffset(key, p.Period)
		}
		next, o, write := RefundFixedWindow(p, WindowState{Tokens: st.A, Start: st.B}, present, now, ch.Cost, offset)
		st.A, st.B = next.Tokens, next.Start
		return o, write
	case SlidingLog:
		if !present {
			return Outcome{Allowed: true, Tokens: p.Capacity}, false
		}
		log, o := RefundSlidingLog(p, st.Log, now, ch.Cost)
		st.Log = log
		return o, true
	default:
		next, o, write := RefundTokenBucket(p, BucketState{Tokens: st.A, Stamp: st.B}, present, now, ch.Cost)
		st.A, st.B = next.Tokens, next.Stamp
		return o, write
	}
}
