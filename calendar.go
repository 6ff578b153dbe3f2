package sluice

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/engine"
)

// Calendar names the calendar unit a window follows (Spec.Calendar):
// days, weeks, months or years as a clock on the wall in Spec.Timezone
// counts them, not a count of microseconds. The zero value is no
// calendar: windows of Spec.Period. It is package engine's Calendar, whose
// Windows computes the bounds in Go, where the time-zone database is, once
// per request; every store is passed them with the request, so every
// store counts the same windows.
type Calendar = engine.Calendar

// The calendar units.
const (
	CalendarDay   = engine.CalendarDay   // local midnight to the next
	CalendarWeek  = engine.CalendarWeek  // from Monday's local midnight (ISO 8601)
	CalendarMonth = engine.CalendarMonth // from the first's local midnight
	CalendarYear  = engine.CalendarYear  // from January 1's local midnight
)

// Location returns the zone a calendar window follows (UTC when
// Spec.Timezone is empty); nil for a limit without a calendar.
func (l *Limit) Location() *time.Location { return l.params.Loc }

// calendarWindow validates s's calendar fields: the zone, loaded once here
// and kept by the Limit, and the nominal period that stands for the
// calendar unit in the checks that follow.
func (s *Spec) calendarWindow() (*time.Location, time.Duration, error) {
	if s.Calendar == 0 {
		if s.Timezone != "" {
			return nil, 0, specErr(*s, "timezone", "applies to calendar periods only (period: day, week, month or year)")
		}
		if s.Algorithm == SlidingWindow && s.Shards > 1 {
			return nil, 0, specErr(*s, "shards", "do not apply to a sliding window: its estimate needs one key's two counts")
		}
		return nil, 0, nil
	}
	if !s.Calendar.Valid() {
		return nil, 0, specErr(*s, "period", "unknown calendar period %d", s.Calendar)
	}
	switch {
	case s.Algorithm != FixedWindow && s.Algorithm != SlidingWindow:
		return nil, 0, specErr(*s, "period", "a calendar period (%s) needs a fixed_window or sliding_window, not %s", s.Calendar, s.Algorithm)
	case s.Period != 0:
		return nil, 0, specErr(*s, "period", "give a calendar period or a duration, not both")
	case s.TokensPerSecond > 0:
		return nil, 0, specErr(*s, "tokens_per_second", "is per second; a calendar period needs rate")
	case s.Shards > 1:
		return nil, 0, specErr(*s, "shards", "do not apply to a calendar period")
	case s.Start != nil:
		return nil, 0, specErr(*s, "start", "a calendar period starts at the calendar's boundaries")
	}
	loc := time.UTC
	if s.Timezone != "" {
		var err error
		if loc, err = time.LoadLocation(s.Timezone); err != nil || s.Timezone == "Local" {
			return nil, 0, specErr(*s, "timezone", "%q is not an IANA time zone name (such as Europe/Berlin or UTC)", s.Timezone)
		}
	}
	return loc, s.Calendar.Longest(), nil
}

// calendarParams checks what a calendar window's arithmetic assumes of p;
// it returns why not, or "". A calendar fixed window refills to its
// capacity at every boundary (a capacity above the rate would carry tokens
// over a number of windows of unequal lengths, which the stores cannot
// count without the zone database); so its capacity is at most its rate.
func calendarParams(p *engine.Params) string {
	if p.Calendar != 0 {
		p.Offset = 0
		if p.Algorithm == engine.FixedWindow && p.Capacity > p.WindowRate {
			return fmt.Sprintf("a calendar fixed window refills to its capacity at each boundary: capacity (%v) must not exceed the rate (%v)", engine.FromMicroTokens(p.Capacity), engine.FromMicroTokens(p.WindowRate))
		}
	}
	return ""
}
