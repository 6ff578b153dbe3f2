// Package gcgoal keeps the garbage collector's heap goal from falling
// below a floor while the live heap is small.
//
// Go collects when the heap has grown by GOGC percent (100 by default)
// over what the last collection found live, so a server whose live heap
// is a few megabytes collects tens of times a second under load, and
// each collection costs about the same whatever the heap: marking,
// assists, and the regrowth of every idle goroutine's stack that the
// collector shrank. A limiter serving tens of thousands of decisions a
// second on a small heap spent a tenth of its CPU there. Raising GOGC
// while the live heap is small, and only then, spends a bounded amount
// of memory (the floor) to collect far less often; a heap above the
// floor is collected exactly as without this.
package gcgoal

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/tick"
)

// ServeFloor is sluice serve's floor: a server's few megabytes of live
// state would otherwise be collected tens of times a second under load.
const ServeFloor = 32 << 20

// minHeap is the runtime's minimum heap goal at GOGC 100: whatever the
// live heap, the collector's goal is never below minHeap*GOGC/100
// (runtime/mgcpacer.go, defaultHeapMinimum), before the first
// collection and after.
const minHeap = 4 << 20

// maxPercent is the largest GOGC whose minimum heap goal is at most
// floor: above it the runtime's minimum, not the live heap, sets the
// goal, and a GOGC picked for a nearly empty heap would put the goal far
// above the floor (10,000 meant a first collection at 400 MiB). It is
// never below 100.
func maxPercent(floor uint64) int { return int(max(floor*100/minHeap, 100)) }

// Percent is the GOGC that puts the heap goal at floor bytes, for a heap
// whose last collection found live bytes live and scan bytes of stacks
// and globals: the collector's goal is live + (live+scan)*GOGC/100. It is
// never below 100, Go's default, so a heap whose live part already
// reaches the floor is collected as it would be without this, and never
// above maxPercent(floor), at which the runtime's minimum heap goal is
// the floor: a nearly empty heap, or one that has not been collected yet,
// gets that minimum as its goal.
func Percent(live, scan, floor uint64) int {
	base := live + scan
	if live >= floor {
		return 100
	}
	top := maxPercent(floor)
	if base == 0 {
		return top
	}
	// Rounded up, so that the goal is at least the floor.
	p := ((floor-live)*100 + base - 1) / base
	return int(min(max(p, 100), uint64(top)))
}

// Start sets GOGC to Percent of the heap as the last collection found
// it, now and then every period, until the returned stop is called;
// stop puts back the GOGC that Start found. Start does nothing when the
// environment sets GOGC (that is the operator's choice) or floor is 0. A
// memory limit (GOMEMLIMIT) still applies: the collector runs as often
// as it must to stay under it, whatever GOGC says.
//
// GOGC is the process's: Starts that overlap (servers run side by side
// in one process, as tests do) share the first one's adjustment, and the
// last stop puts back what the first Start found.
func Start(floor uint64, period time.Duration) (stop func()) {
	if _, set := os.LookupEnv("GOGC"); set || floor == 0 {
		return func() {}
	}
	mu.Lock()
	defer mu.Unlock()
	if users == 0 {
		end = run(floor, period)
	}
	users++
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			defer mu.Unlock()
			if users--; users == 0 {
				end()
			}
		})
	}
}

var (
	mu    sync.Mutex
	users int    // Starts not yet stopped
	end   func() // ends the adjustment that the first of them began
)

// run adjusts GOGC now and every period until the returned function is
// called, which puts back the GOGC it found.
func run(floor uint64, period time.Duration) func() {
	samples := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"}}
	adjust := func() int {
		metrics.Read(samples)
		// Without the live heap's size, Go's default: floor reads as reached.
		live, stack, globals := valueOf(samples[0], floor), valueOf(samples[1], 0), valueOf(samples[2], 0)
		return debug.SetGCPercent(Percent(live, stack+globals, floor))
	}
	was := adjust()
	ctx, stop := context.WithCancel(context.Background())
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		tick.Every(ctx, period, func() { adjust() })
	}()
	return func() {
		stop()
		<-ended
		debug.SetGCPercent(was)
	}
}

// valueOf is a sample's value, or otherwise when the runtime does not
// have it (a metric's Uint64 panics on a value of another kind).
func valueOf(s metrics.Sample, otherwise uint64) uint64 {
	if s.Value.Kind() != metrics.KindUint64 {
		return otherwise
	}
	return s.Value.Uint64()
}
