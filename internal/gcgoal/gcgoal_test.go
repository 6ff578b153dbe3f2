package gcgoal

import (
	"os"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live, scan, floor uint64
		want              int
	}{
		{3 * mib, 1 * mib, 32 * mib, 725},   // 3 + 4*7.25 = 32
		{16 * mib, 0, 32 * mib, 100},        // doubling reaches the floor: Go's default
		{20 * mib, 0, 32 * mib, 100},        // never below the default
		{64 * mib, 0, 32 * mib, 100},        // above the floor: as without
		{0, 0, 32 * mib, MaxPercent},        // nothing live yet
		{1000, 0, 32 * mib, MaxPercent},     // bounded
		{3*mib + 1, 1 * mib, 32 * mib, 725}, // rounded up, not below the floor
	} {
		got := Percent(c.live, c.scan, c.floor)
		if got != c.want {
			t.Errorf("Percent(%d, %d, %d) = %d, want %d", c.live, c.scan, c.floor, got, c.want)
		}
		if goal := c.live + (c.live+c.scan)*uint64(got)/100; got < MaxPercent && c.live < c.floor && goal < c.floor {
			t.Errorf("Percent(%d, %d, %d) = %d: goal %d below the floor", c.live, c.scan, c.floor, got, goal)
		}
	}
}

// gogc is the collector's GOGC now.
func gogc() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// Start raises GOGC for a heap below the floor until stopped, and stop
// puts back what it found.
func TestStartRaisesAndStopRestores(t *testing.T) {
	t.Setenv("GOGC", "") // t.Setenv restores the environment; then unset it
	os.Unsetenv("GOGC")
	defer debug.SetGCPercent(debug.SetGCPercent(77))
	stop := Start(1<<40, time.Hour)
	if p := gogc(); p != MaxPercent {
		t.Errorf("GOGC %d while started with a floor far above the heap, want %d", p, MaxPercent)
	}
	other := Start(1<<40, time.Hour) // a second server in the process
	stop()
	stop() // twice is once
	if p := gogc(); p != MaxPercent {
		t.Errorf("GOGC %d while a second Start runs, want %d", p, MaxPercent)
	}
	other()
	if p := gogc(); p != 77 {
		t.Errorf("GOGC %d after stop, want the 77 it found", p)
	}
}

// With GOGC in the environment, Start leaves the collector alone.
func TestStartLeavesAnOperatorsGOGC(t *testing.T) {
	t.Setenv("GOGC", "150")
	defer debug.SetGCPercent(debug.SetGCPercent(150))
	stop := Start(1<<40, time.Millisecond)
	defer stop()
	if p := gogc(); p != 150 {
		t.Errorf("GOGC %d, want the environment's 150 untouched", p)
	}
}

// A metric the runtime lacks reads as the value given for it rather
// than panicking; one it has reads as itself.
func TestValueOfUnknownMetric(t *testing.T) {
	s := []metrics.Sample{{Name: "/gc/no-such-metric:bytes"}, {Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if v := valueOf(s[0], 42); v != 42 {
		t.Errorf("valueOf(unknown, 42) = %d, want 42", v)
	}
	if v := valueOf(s[1], 42); v == 42 || v == 0 {
		t.Errorf("valueOf(/gc/gogc:percent) = %d, want GOGC", v)
	}
}
