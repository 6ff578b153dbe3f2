package httpgate_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// A calendar month in New York resets at local midnight on the 1st, the
// boundary /v1/take and /v1/peek answer with: reset_after_ms and a
// rejection's retry_at are that instant, however long the month.
func TestTakeAndPeekAnswerTheCalendarReset(t *testing.T) {
	e := newEnv(t, `
rules:
  - name: monthly
    algorithm: fixed_window
    algorithm_config: {rate: 3, period: month, timezone: America/New_York}
  - name: smooth
    algorithm: sliding_window
    algorithm_config: {rate: 2, period: day, timezone: Europe/Berlin}
`)
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2024, 2, 28, 18, 30, 0, 0, ny) // a leap February
	boundary := time.Date(2024, 3, 1, 0, 0, 0, 0, ny)
	e.clk.Set(now)
	ms := int(boundary.Sub(now).Milliseconds())
	_, m := e.post("/v1/peek", `{"rule":"monthly","key":"acct"}`)
	wantFields(t, m, map[string]any{"allowed": true, "remaining": 2, "reset_after_ms": ms})
	_, m = e.post("/v1/take", `{"rule":"monthly","key":"acct","cost":3}`)
	wantFields(t, m, map[string]any{"allowed": true, "remaining": 0, "reset_after_ms": ms})
	_, m = e.post("/v1/take", `{"rule":"monthly","key":"acct"}`)
	wantFields(t, m, map[string]any{"allowed": false, "retry_after_ms": ms, "reset_after_ms": ms,
		"retry_at": boundary.UTC().Format(sluice.RetryAtLayout), "reason": "fixed_window_exceeded"})
	_, m = e.post("/v1/peek", `{"rule":"monthly","key":"acct"}`)
	wantFields(t, m, map[string]any{"allowed": false, "retry_after_ms": ms})
	e.clk.Set(boundary)
	_, m = e.post("/v1/take", `{"rule":"monthly","key":"acct","cost":3}`)
	// March is 31 days less the hour summer time skips.
	april := time.Date(2024, 4, 1, 0, 0, 0, 0, ny)
	wantFields(t, m, map[string]any{"allowed": true, "remaining": 0, "reset_after_ms": int(april.Sub(boundary).Milliseconds())})

	// A sliding window over Berlin's days: two at 12:00 on the day summer
	// time begins (23 hours long) weigh into the next day until its end.
	ber, _ := time.LoadLocation("Europe/Berlin")
	e.clk.Set(time.Date(2024, 3, 31, 12, 0, 0, 0, ber))
	_, m = e.post("/v1/take", `{"rule":"smooth","key":"k","cost":2}`)
	end := time.Date(2024, 4, 2, 0, 0, 0, 0, ber)
	wantFields(t, m, map[string]any{"allowed": true, "remaining": 0, "reset_after_ms": int(end.Sub(time.Date(2024, 3, 31, 12, 0, 0, 0, ber)).Milliseconds())})
}
