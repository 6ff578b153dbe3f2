package engine

import "github.com/sluicehq/sluice"

func init() {
	sluice.RegisterWindows(func(l *sluice.Limit, st sluice.State, present bool, now int64, ch sluice.Charge, take bool) (sluice.State, sluice.Outcome, bool) {
		o, write := Evaluate(l, &st, present, now, ch, take)
		return st, o, write
	}, func(l *sluice.Limit, st sluice.State, present bool, now int64, ch sluice.Charge) (sluice.State, sluice.Outcome, bool) {
		o, write := Refund(l, &st, present, now, ch)
		return st, o, write
	})
}

// Evaluate is sluice.Limit.Evaluate for the windows of this package (a
// sliding window, a calendar window): it decides ch against l at time now
// for a key whose state is st, on the bounds of l's windows around now.
// An admitted take updates st in place (Stamp, Tokens and, for a sliding
// window, Prev) and reports true.
func Evaluate(l *sluice.Limit, st *sluice.State, present bool, now int64, ch sluice.Charge, take bool) (sluice.Outcome, bool) {
	p := l.Params()
	b := Windows(l, now)
	if p.Algorithm == sluice.SlidingWindow {
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

// Refund is sluice.Limit.Refund for the windows of this package.
func Refund(l *sluice.Limit, st *sluice.State, present bool, now int64, ch sluice.Charge) (sluice.Outcome, bool) {
	p := l.Params()
	b := Windows(l, now)
	if p.Algorithm == sluice.SlidingWindow {
		next, o, write := RefundSlidingWindow(p, SlidingState{Start: st.Stamp, Count: st.Tokens, Prev: st.Prev}, present, now, ch.Cost, b)
		st.Stamp, st.Tokens, st.Prev = next.Start, next.Count, next.Prev
		return o, write
	}
	next, o, write := RefundCalendarWindow(p, st.Window(), present, now, ch.Cost, b)
	st.Tokens, st.Stamp = next.Tokens, next.Start
	return o, write
}
