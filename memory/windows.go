package memory

import (
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// windowed reports whether p's windows are package engine's: a sliding
// window, or a window aligned to the calendar. Their state holds a third
// number (entry.prev), read under the shard's lock only.
func windowed(p *sluice.Params) bool {
	return p.Algorithm == sluice.SlidingWindow || p.Calendar != 0
}

// evaluate is lim.Evaluate, with engine's windows decided by engine on the
// bounds of the windows around now.
func evaluate(lim *sluice.Limit, st *sluice.State, present bool, key string, now int64, ch sluice.Charge, take bool) (sluice.Outcome, bool) {
	p := lim.Params()
	if !windowed(p) {
		return lim.Evaluate(st, present, key, now, ch, take)
	}
	b := engine.Windows(lim, now)
	var o sluice.Outcome
	if p.Algorithm == sluice.SlidingWindow {
		var next engine.SlidingState
		next, o = engine.TakeSlidingWindow(p, engine.SlidingState{Start: st.Stamp, Count: st.Tokens, Prev: st.Prev}, present, now, ch.Cost, take, b)
		if take && o.Allowed {
			st.Stamp, st.Tokens, st.Prev = next.Start, next.Count, next.Prev
			return o, true
		}
		return o, false
	}
	next, o := engine.TakeCalendarWindow(p, st.Window(), present, now, ch.Cost, b)
	if take && o.Allowed {
		st.Tokens, st.Stamp = next.Tokens, next.Start
		return o, true
	}
	return o, false
}

// refund is lim.Refund, with engine's windows refunded by engine.
func refund(lim *sluice.Limit, st *sluice.State, present bool, key string, now int64, ch sluice.Charge) (sluice.Outcome, bool) {
	p := lim.Params()
	if !windowed(p) {
		return lim.Refund(st, present, key, now, ch)
	}
	b := engine.Windows(lim, now)
	if p.Algorithm == sluice.SlidingWindow {
		next, o, write := engine.RefundSlidingWindow(p, engine.SlidingState{Start: st.Stamp, Count: st.Tokens, Prev: st.Prev}, present, now, ch.Cost, b)
		st.Stamp, st.Tokens, st.Prev = next.Start, next.Count, next.Prev
		return o, write
	}
	next, o, write := engine.RefundCalendarWindow(p, st.Window(), present, now, ch.Cost, b)
	st.Tokens, st.Stamp = next.Tokens, next.Start
	return o, write
}
