package redis_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/redis"
)

// Attack: a loaded host makes a healthy Redis read as a failed one. When
// this process is short of CPU, every call waits for the scheduler at each
// hand-off (the caller, the client's writer, its reader), and a deadline
// shorter than those waits fails calls that Redis answered at once; enough
// of them open the circuit breaker, and then every decision is the rule's
// on_store_error for the backoff, with Redis up. Here the load is made
// inside the process, so that it does not depend on the machine: one P
// (GOMAXPROCS 1) shared with a goroutine that never blocks, so a goroutine
// that becomes runnable waits for the Go scheduler to preempt it (after
// 10 ms, whatever the machine's speed) before it runs. With the default
// options the calls succeed and the breaker stays closed; two failures of
// 40 are allowed in an attempt, and five attempts are made, for a machine
// that stalls this whole process meanwhile (with the former 10 ms default,
// 8 to 19 of 40 failed in every attempt).
func TestLoadedHostIsNotADeadStore(t *testing.T) {
	url := standaloneURL(t)
	// A machine loaded from outside (other processes on its cores) can
	// fail calls in any one attempt as well: that is its speed, not the
	// store's. Such load comes and goes; the load made here does not, and
	// with a deadline it defeats, every attempt fails.
	var tries []string
	for range 5 {
		failed, opens, last, slowest := loadedTakes(t, url)
		if failed <= 2 && opens == 0 {
			t.Logf("40 takes on a loaded process: %d failed, slowest %v (after %d attempts with more)", failed, slowest, len(tries))
			return
		}
		tries = append(tries, fmt.Sprintf("%d of 40 failed (last: %v), breaker opened %v times, slowest call %v", failed, last, opens, slowest))
	}
	t.Fatalf("takes against a healthy Redis failed in every attempt:\n%s", strings.Join(tries, "\n"))
}

// loadedTakes makes 40 takes from two goroutines on a process with one P
// shared with a goroutine that never blocks, on a store of its own with
// the default deadline and breaker, and returns how many failed, how
// often the breaker opened, the last error and the slowest call.
func loadedTakes(t *testing.T, url string) (failed int64, opens float64, last any, slowest time.Duration) {
	reg := prometheus.NewRegistry()
	s, err := redis.Open(url, redis.Options{Observer: observed(reg), NoOverLimitCache: true}) // the default deadline and breaker
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	lim := uniqueLimit(t, sluice.Spec{Name: "loaded", TokensPerSecond: 1e6, Burst: 1e6})
	if _, err := s.Take(ctx, sluice.OpTake, sluice.Request{Limit: lim, Key: "warm"}); err != nil {
		t.Fatal(err)
	}

	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var stop atomic.Bool
	var hogs sync.WaitGroup
	for range 1 {
		hogs.Add(1)
		go func() {
			defer hogs.Done()
			for n := 0; !stop.Load(); n++ {
			}
		}()
	}
	var nFailed atomic.Int64
	var callers sync.WaitGroup
	var lastErr atomic.Value
	var slowestNs atomic.Int64
	for c := range 2 {
		callers.Add(1)
		go func() {
			defer callers.Done()
			for i := range 20 {
				start := time.Now()
				_, err := s.Take(ctx, sluice.OpTake, sluice.Request{Limit: lim, Key: "k" + string(rune('a'+c)) + string(rune('a'+i))})
				if d := int64(time.Since(start)); d > slowestNs.Load() {
					slowestNs.Store(d)
				}
				if err != nil {
					nFailed.Add(1)
					lastErr.Store(err)
				}
			}
		}()
	}
	callers.Wait()
	stop.Store(true)
	hogs.Wait()
	return nFailed.Load(), metricValue(t, reg, "sluice_redis_breaker_opens_total"), lastErr.Load(), time.Duration(slowestNs.Load())
}
