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
		{0, 0, 32 * mib, 800},               // nothing live yet: the minimum heap is the floor
		{1000, 0, 32 * mib, 800},            // bounded by the minimum heap
		{1 * mib, 0, 32 * mib, 800},         // 3100 wanted: the minimum heap gets there at 800
		{3*mib + 1, 1 * mib, 32 * mib, 725}, // rounded up, not below the floor
		{0, 0, 2 * mib, 100},                // a floor below the minimum heap: the default
	} {
		got := Percent(c.live, c.scan, c.floor)
		if got != c.want {
			t.Errorf("Percent(%d, %d, %d) = %d, want %d", c.live, c.scan, c.floor, got, c.want)
		}
		// The runtime's goal: the live heap grown by GOGC percent of what
		// it scans, never below the minimum heap scaled by GOGC.
		base := c.live + c.scan
		goal := max(c.live+base*uint64(got)/100, minHeap*uint64(got)/100)
		// At 100, Go's default, the goal may be above the floor.
		if goal < c.floor || got > 100 && goal > c.floor+base/100+1 {
			t.Errorf("Percent(%d, %d, %d) = %d: heap goal %d, want the floor %d", c.live, c.scan, c.floor, got, goal, c.floor)
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
	const floor = 1 << 30
	stop := Start(floor, time.Hour)
	if p, want := gogc(), maxPercent(floor); p != want {
		t.Errorf("GOGC %d while started with a floor far above the heap, want %d", p, want)
	}
	other := Start(floor, time.Hour) // a second server in the process
	stop()
	stop() // twice is once
	if p, want := gogc(), maxPercent(floor); p != want {
		t.Errorf("GOGC %d while a second Start runs, want %d", p, want)
	}
	other()
	if p := gogc(); p != 77 {
		t.Errorf("GOGC %d after stop, want the 77 it found", p)
	}
}

// The goal the runtime holds once Start has run is the floor, not the
// runtime's minimum heap scaled by a GOGC picked for a nearly empty heap
// (a GOGC of 10,000 put it at 400 MiB: a server's memory grew to that
// before its first collection).
func TestStartPutsTheGoalAtTheFloor(t *testing.T) {
	t.Setenv("GOGC", "")
	os.Unsetenv("GOGC")
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	const floor = 64 << 20 // far above this test binary's live heap
	stop := Start(floor, time.Hour)
	defer stop()
	s := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	if goal := s[0].Value.Uint64(); goal < floor || goal > floor+floor/100 {
		t.Errorf("heap goal %d MiB after Start(%d MiB), want the floor", goal>>20, floor>>20)
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
