package sluice

import (
	"fmt"
	"time"
)

// Calendar names the calendar unit a window follows: its periods are days,
// weeks, months or years as a clock on the wall in Spec.Timezone counts
// them (a day across a change to summer time is 23 hours, February 28 or
// 29 days), not a count of microseconds. The zero value is no calendar:
// windows of Spec.Period.
//
// A calendar window's bounds are computed in Go, where the time-zone
// database is (package engine's Windows), once per request, and passed to
// the store with it: Redis's Lua and PostgreSQL's SQL take them as given,
// so every store counts the same windows.
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

// calendarLongest is each unit's longest length, the Period its Params
// keep for bounds checks and the long-run rate (Limit.TokensPerSecond).
var calendarLongest = [...]time.Duration{0, 25 * time.Hour, 7*24*time.Hour + time.Hour, 31*24*time.Hour + time.Hour, 366*24*time.Hour + time.Hour}

// String returns the configuration name of c ("month"), or "" for none.
func (c Calendar) String() string {
	if int(c) < len(calendarNames) {
		return calendarNames[c]
	}
	return fmt.Sprintf("calendar(%d)", uint8(c))
}

// ParseCalendar reads a calendar period's name: day, week, month or year.
// ok is false for any other string (a duration, say).
func ParseCalendar(s string) (c Calendar, ok bool) {
	for i, n := range calendarNames[1:] {
		if n == s {
			return Calendar(i + 1), true
		}
	}
	return 0, false
}

// Location returns the zone a calendar window follows (UTC when
// Spec.Timezone is empty); nil for a limit without a calendar.
func (l *Limit) Location() *time.Location { return l.loc }

// calendarWindow validates s's calendar fields: the zone, loaded once here
// and kept by the Limit, and the nominal period that stands for the
// calendar unit in the checks that follow.
func (s *Spec) calendarWindow() (*time.Location, time.Duration, error) {
	bad := func(field, format string, a ...any) (*time.Location, time.Duration, error) {
		return nil, 0, &SpecError{Limit: s.Name, Field: field, Reason: fmt.Sprintf(format, a...)}
	}
	if s.Calendar == 0 {
		if s.Timezone != "" {
			return bad("timezone", "applies to calendar periods only (period: day, week, month or year)")
		}
		if s.Algorithm == SlidingWindow && s.Shards > 1 {
			return bad("shards", "do not apply to a sliding window: its estimate needs one key's two counts")
		}
		return nil, 0, nil
	}
	if int(s.Calendar) >= len(calendarNames) {
		return bad("period", "unknown calendar period %d", s.Calendar)
	}
	switch {
	case s.Algorithm != FixedWindow && s.Algorithm != SlidingWindow:
		return bad("period", "a calendar period (%s) needs a fixed_window or sliding_window, not %s", s.Calendar, s.Algorithm)
	case s.Period != 0:
		return bad("period", "give a calendar period or a duration, not both")
	case s.TokensPerSecond > 0:
		return bad("tokens_per_second", "is per second; a calendar period needs rate")
	case s.Shards > 1:
		return bad("shards", "do not apply to a calendar period")
	case s.Start != nil:
		return bad("start", "a calendar period starts at the calendar's boundaries")
	}
	loc := time.UTC
	if s.Timezone != "" {
		var err error
		if loc, err = time.LoadLocation(s.Timezone); err != nil || s.Timezone == "Local" {
			return bad("timezone", "%q is not an IANA time zone name (such as Europe/Berlin or UTC)", s.Timezone)
		}
	}
	return loc, calendarLongest[s.Calendar], nil
}

// calendarParams checks what a calendar window's arithmetic assumes of p;
// it returns why not, or "". A calendar fixed window refills to its
// capacity at every boundary (a capacity above the rate would carry tokens
// over a number of windows of unequal lengths, which the stores cannot
// count without the zone database); so its capacity is at most its rate.
func calendarParams(p *Params) string {
	if p.Calendar != 0 {
		p.Offset = 0
		if p.Algorithm == FixedWindow && p.Capacity > p.WindowRate {
			return fmt.Sprintf("a calendar fixed window refills to its capacity at each boundary: capacity (%v) must not exceed the rate (%v)", FromMicroTokens(p.Capacity), FromMicroTokens(p.WindowRate))
		}
	}
	return ""
}

// windowTake and windowRefund are package engine's Evaluate and Refund,
// for sliding and calendar windows (see RegisterWindows).
var (
	windowTake   func(l *Limit, st State, present bool, now int64, ch Charge, take bool) (State, Outcome, bool)
	windowRefund func(l *Limit, st State, present bool, now int64, ch Charge) (State, Outcome, bool)
)

// RegisterWindows is how package engine, which computes sliding and
// calendar windows, hands Limit.Evaluate and Limit.Refund its functions
// (engine builds on this package's types, so this package cannot call it
// directly). Importing engine registers them; every store does. They
// take and return the state by value: a pointer passed to a function
// variable escapes, and with it the caller's scratch states.
func RegisterWindows(take func(l *Limit, st State, present bool, now int64, ch Charge, take bool) (State, Outcome, bool), refund func(l *Limit, st State, present bool, now int64, ch Charge) (State, Outcome, bool)) {
	windowTake, windowRefund = take, refund
}

// windowed reports whether p's windows are engine's.
func (p *Params) windowed() bool { return p.Algorithm == SlidingWindow || p.Calendar != 0 }

// noWindows is the outcome where engine was not imported: a rejection
// that writes nothing.
var noWindows = Outcome{}
