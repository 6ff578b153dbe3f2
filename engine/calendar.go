package engine

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// Calendar names the calendar unit a window follows: its periods are days,
// weeks, months or years as a clock on the wall in Params.Loc counts them
// (a day across a change to summer time is 23 hours, February 28 or 29
// days), not a count of microseconds. The zero value is no calendar:
// windows of Params.Period. Its values are those of Calendar.
//
// A calendar window's bounds are computed in Go, where the time-zone
// database is (Windows), once per request, and passed to the store with
// it: Redis's Lua and PostgreSQL's SQL take them as given, so every store
// counts the same windows.
type Calendar uint8

const (
	// CalendarDay is a day from local midnight to the next.
	CalendarDay Calendar = iota + 1
	// CalendarWeek is a week from Monday's local midnight (ISO 8601).
	CalendarWeek
	// CalendarMonth is a month from the first's local midnight.
	CalendarMonth
	// CalendarYear is a year from January 1's local midnight.
	CalendarYear
)

var calendarNames = [...]string{"", "day", "week", "month", "year"}

// calendarLongest is each unit's longest length, the Period a calendar
// window's Params keep for bounds checks and the long-run rate.
var calendarLongest = [...]time.Duration{0, 25 * time.Hour, 7*24*time.Hour + time.Hour, 31*24*time.Hour + time.Hour, 366*24*time.Hour + time.Hour}

// String returns the configuration name of c ("month"), or "" for none.
func (c Calendar) String() string {
	if int(c) < len(calendarNames) {
		return calendarNames[c]
	}
	return fmt.Sprintf("calendar(%d)", uint8(c))
}

// Valid reports whether c is no calendar or one of the units.
func (c Calendar) Valid() bool { return int(c) < len(calendarNames) }

// Longest returns the longest window of unit c (zero for none): 25 hours
// for a day, a week or a month of 31 days plus an hour, a year of 366
// days plus an hour.
func (c Calendar) Longest() time.Duration {
	if !c.Valid() {
		return 0
	}
	return calendarLongest[c]
}

// ParseCalendar reads a calendar period's name: day, week, month or year.
// ok is false for any other string (a duration, say).
func ParseCalendar(s string) (c Calendar, ok bool) {
	i := slices.Index(calendarNames[1:], s)
	return Calendar(i + 1), i >= 0
}

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

// Windows returns the bounds of the windows of a limit of parameters p
// around now (microseconds): those of its calendar in its zone (p.Loc)
// for a calendar window, else windows of p.Period aligned to the Unix
// epoch.
func Windows(p *Params, now int64) Bounds {
	if p.Calendar != 0 {
		return CalendarBounds(p.Calendar, p.Loc, now)
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
func CalendarBounds(c Calendar, loc *time.Location, now int64) Bounds {
	loc = cmp.Or(loc, time.UTC)
	t := time.UnixMicro(now).In(loc)
	y, m, d := t.Date()
	switch c {
	case CalendarWeek:
		d -= (int(t.Weekday()) + 6) % 7 // days since Monday
	case CalendarMonth:
		d = 1
	case CalendarYear:
		m, d = time.January, 1
	}
	var b Bounds
	for i := range b {
		k := i - 1
		yy, mm, dd := y, m, d
		switch c {
		case CalendarDay:
			dd += k
		case CalendarWeek:
			dd += 7 * k
		case CalendarMonth:
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

// TakeCalendarWindow decides one request against a fixed window aligned
// to the calendar (Params.Calendar) at time now (microseconds), with the
// window bounds b (Windows, computed in the process for the store).
//
// Each window admits up to the limit's capacity: at every boundary the
// window refills to the capacity (sluice.NewLimit keeps the capacity at most the
// rate, so no tokens carry over a boundary), and a rejected request waits
// for the end of the window, the calendar boundary, which is also when the
// window is full again. An absent key, or one last written in an earlier
// window, starts full; a clock that steps back stays in the window
// already counted. Reservations are refused before this (a debt would be
// paid over windows of unequal lengths).
func TakeCalendarWindow(p *Params, st WindowState, present bool, now, cost int64, b Bounds) (WindowState, Outcome) {
	tokens, start, end := rollCalendar(p, st, present, now, &b)
	var o Outcome
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
	return WindowState{Tokens: tokens, Start: start}, o
}

// rollCalendar returns a calendar window's tokens and start as of now,
// and the end of the window now counts in.
func rollCalendar(p *Params, st WindowState, present bool, now int64, b *Bounds) (tokens, start, end int64) {
	_, start, end, _ = b.Pick(now)
	if !present || st.Start < start {
		return p.Capacity, start, end
	}
	return min(st.Tokens, p.Capacity), st.Start, end
}

// RefundCalendarWindow gives amount micro-tokens back to a calendar
// window at time now, never above its capacity, after rolling it forward
// as a take would. An absent key is full: write is false.
func RefundCalendarWindow(p *Params, st WindowState, present bool, now, amount int64, b Bounds) (next WindowState, o Outcome, write bool) {
	tokens, start, end := rollCalendar(p, st, present, now, &b)
	if present {
		tokens = min(p.Capacity, tokens+min(amount, p.Capacity))
	}
	o.Allowed, o.Tokens = true, tokens
	if tokens < p.Capacity {
		o.ResetAfter = end - now
	}
	return WindowState{Tokens: tokens, Start: start}, o, present
}
