package duration_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/duration"
)

func TestParse(t *testing.T) {
	const day = 24 * time.Hour
	for s, want := range map[string]time.Duration{
		"90m": 90 * time.Minute, "36h": 36 * time.Hour, "0": 0, "1d": day, "7d": 7 * day,
		"2w": 14 * day, "1w3d": 10 * day, "1d12h": 36 * time.Hour, "1.5d": 36 * time.Hour, "1w2d12h": 9*day + 12*time.Hour,
	} {
		if got, err := duration.Parse(s); err != nil || got != want {
			t.Errorf("%q: %v, %v; want %v", s, got, err, want)
		}
	}
	for _, bad := range []string{"", "d", "soon", "1x", "3d2w", "1..5d", "9999999999w", "1d1e300h"} {
		if got, err := duration.Parse(bad); err == nil {
			t.Errorf("%q: %v, want an error", bad, got)
		}
	}
}
