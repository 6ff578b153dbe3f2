package sluice

import (
	"math"
	"testing"
	"time"
)

// waitEnds is the store's reading plus the wait, as two time.Time.Adds
// would give it, the monotonic reading included, for waits up to those
// beyond time.Duration.
func TestWaitEndsAsTwoAdds(t *testing.T) {
	l := &Limiter{epoch: time.Now()}
	for _, at := range []time.Duration{0, 5 * time.Microsecond, time.Hour, 365 * 24 * time.Hour} {
		for _, wait := range []time.Duration{0, time.Microsecond, time.Second, math.MaxInt64 - at - 1, math.MaxInt64 - at, math.MaxInt64 - at + 1, math.MaxInt64} {
			want := l.epoch.Add(at).Add(wait)
			if got := l.waitEnds(at, wait); !got.Equal(want) || got.Sub(l.epoch) != want.Sub(l.epoch) {
				t.Errorf("waitEnds(%v, %v) = %v, want %v", at, wait, got, want)
			}
		}
	}
}
