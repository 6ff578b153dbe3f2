// Package engine holds the arithmetic of sluice's window algorithms as
// pure functions: the state and the time are passed in, an Outcome comes
// out, and no clock is read. Every store evaluates a limit through them
// (the memory store directly, Redis's Lua and PostgreSQL's SQL as ports
// line for line), so that every store gives the same answers.
package engine

import (
	"math"
	"math/bits"
	"time"

	"github.com/sluicehq/sluice"
)

// Bounds are five consecutive window boundaries, in microseconds since
// the Unix epoch: the windows [B[0], B[1]), [B[1], B[2]), [B[2], B[3]) and
// [B[3], B[4]), computed for a time in the second of them. A store decides
// at its own clock's time, which may lie a little past B[2] (the store's
// clock ahead of the process that computed the bounds): it then counts in
// the third window (see Pick). Five bounds give either window its
// predecessor, which a sliding window weighs, and its successor, which a
// wait may reach into.
type Bounds [5]int64

// Pick returns the bounds of the window a decision at now counts in: its
// start and end, the start of the window before it and the end of the
// window after it. A time at or past B[2] counts in the window that
// starts there; any earlier time (one before B[1] included: a store's
// clock behind the process's) counts in [B[1], B[2]).
func (b *Bounds) Pick(now int64) (prev, start, end, next int64) {
	if now >= b[2] {
		return b[1], b[2], b[3], b[4]
	}
	return b[0], b[1], b[2], b[3]
}

// Windows returns the bounds of l's windows around now (microseconds):
// those of its calendar in its zone for a calendar window, else windows of
// l's Period aligned to the Unix epoch.
func Windows(l *sluice.Limit, now int64) Bounds {
	p := l.Params()
	if p.Calendar != 0 {
		return CalendarBounds(p.Calendar, l.Location(), now)
	}
	return UniformBounds(p.Period, now)
}

// UniformBounds returns the bounds of windows of period microseconds,
// aligned to the Unix epoch, around now.
func UniformBounds(period, now int64) Bounds {
	start := now - ((now%period)+period)%period
	return Bounds{start - period, start, start + period, start + 2*period, start + 3*period}
}

// CalendarBounds returns the bounds of calendar windows of unit c in loc
// around now (microseconds). A window starts at local midnight of its
// first day: a day, a week from Monday, a month from the first, a year
// from January 1. It is as long as the wall clock says: 23 or 25 hours
// for the day of a change to or from summer time, 28 to 31 days for a
// month, 365 or 366 for a year. Where a zone skips midnight itself (a
// change at 00:00), the day starts at the first instant that exists,
// the end of the skipped hour.
func CalendarBounds(c sluice.Calendar, loc *time.Location, now int64) Bounds {
	if loc == nil {
		loc = time.UTC
	}
	t := time.UnixMicro(now).In(loc)
	y, m, d := t.Date()
	switch c {
	case sluice.CalendarWeek:
		d -= (int(t.Weekday()) + 6) % 7 // days since Monday
	case sluice.CalendarMonth:
		d = 1
	case sluice.CalendarYear:
		m, d = time.January, 1
	}
	var b Bounds
	for i := range b {
		k := i - 1
		yy, mm, dd := y, m, d
		switch c {
		case sluice.CalendarDay:
			dd += k
		case sluice.CalendarWeek:
			dd += 7 * k
		case sluice.CalendarMonth:
			mm += time.Month(k)
		default:
			yy += k
		}
		b[i] = midnight(yy, mm, dd, loc)
	}
	return b
}

// midnight returns the first instant of the local date y-m-d (normalised
// as time.Date normalises it) in loc, in microseconds.
func midnight(y int, m time.Month, d int, loc *time.Location) int64 {
	t := time.Date(y, m, d, 0, 0, 0, 0, loc)
	want := time.Date(y, m, d, 0, 0, 0, 0, time.UTC) // the normalised date
	if ty, tm, td := t.Date(); ty != want.Year() || tm != want.Month() || td != want.Day() {
		// Midnight does not exist there: time.Date chose an instant of
		// the day before, in the skipped hour's old offset. The day
		// starts where that offset ends.
		_, end := t.ZoneBounds()
		t = end
	}
	return t.UnixMicro()
}

// mulDiv returns floor(a*b/c) for a, b >= 0 and c > 0 whose result fits
// in an int64 (every call here has b <= c, or a result below b); the
// product is kept in 128 bits.
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(q)
}

// TakeCalendarWindow decides one request against a fixed window aligned
// to the calendar (Spec.Calendar) at time now (microseconds), with the
// window bounds b (Windows, computed in the process for the store).
//
// Each window admits up to the limit's capacity: at every boundary the
// window refills to the capacity (NewLimit keeps the capacity at most the
// rate, so no tokens carry over a boundary), and a rejected request waits
// for the end of the window, the calendar boundary, which is also when the
// window is full again. An absent key, or one last written in an earlier
// window, starts full; a clock that steps back stays in the window
// already counted. Reservations are refused before this (a debt would be
// paid over windows of unequal lengths).
func TakeCalendarWindow(p *sluice.Params, st sluice.WindowState, present bool, now, cost int64, b Bounds) (sluice.WindowState, sluice.Outcome) {
	tokens, start, end := rollCalendar(p, st, present, now, &b)
	var o sluice.Outcome
	if tokens >= cost {
		o.Allowed = true
		tokens -= cost
	} else {
		o.RetryAfter = end - now
	}
	o.Tokens = tokens
	if tokens < p.Capacity {
		o.ResetAfter = end - now
	}
	return sluice.WindowState{Tokens: tokens, Start: start}, o
}

// rollCalendar returns a calendar window's tokens and start as of now,
// and the end of the window now counts in.
func rollCalendar(p *sluice.Params, st sluice.WindowState, present bool, now int64, b *Bounds) (tokens, start, end int64) {
	_, start, end, _ = b.Pick(now)
	if !present || st.Start < start {
		return p.Capacity, start, end
	}
	return min(st.Tokens, p.Capacity), st.Start, end
}

// RefundCalendarWindow gives amount micro-tokens back to a calendar
// window at time now, never above its capacity, after rolling it forward
// as a take would. An absent key is full: write is false.
func RefundCalendarWindow(p *sluice.Params, st sluice.WindowState, present bool, now, amount int64, b Bounds) (next sluice.WindowState, o sluice.Outcome, write bool) {
	tokens, start, end := rollCalendar(p, st, present, now, &b)
	if present {
		tokens = min(p.Capacity, tokens+min(amount, p.Capacity))
	}
	o.Allowed, o.Tokens = true, tokens
	if tokens < p.Capacity {
		o.ResetAfter = end - now
	}
	return sluice.WindowState{Tokens: tokens, Start: start}, o, present
}
