package memory_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// Attack: a key flood to reset a drained bucket. A client drains its
// bucket and keeps asking (rejected), while 2,000,000 fresh keys are
// pushed through a store bounded at 100,000. If eviction drops the drained
// bucket (a rejection writes nothing, so by recency it looks idle), the
// client gets a full bucket back each time. The drained key must stay
// drained: its admissions stay within burst + rate*elapsed, the store
// never holds more than its bound, and a well-behaved client is admitted
// throughout.
//
// Each fresh key takes one token of 5 (rate 1/s): for a second it is below
// full, then full again. On a manual clock, the first million keys come
// 2 µs apart, so the store holds only 0.2 s of them and every eviction is
// of a key below full (the one closest to full); the second million come
// 20 µs apart, so half the keys held are full and those go. Under the race
// detector the store and the flood are a fortieth of that, over the same
// simulated time.
func TestKeyFloodKeepsDrainedBucket(t *testing.T) {
	maxKeys, flood := 100_000, 2_000_000
	if raceDetector {
		maxKeys, flood = 2_500, 50_000
	}
	fast := 200 * time.Millisecond / time.Duration(maxKeys) // the store holds 0.2 s of keys
	slow := 10 * fast                                       // 2 s
	askEvery := flood / 2000                                // the drained client asks every 2 ms, then 20 ms
	clock := sluice.NewManualClock(time.Unix(1000, 0))
	s := memory.New(memory.Options{Clock: clock, MaxKeys: maxKeys})
	lim := sluice.MustLimit(sluice.Spec{Name: "per-client", TokensPerSecond: 1, Burst: 5})
	abuser := sluice.Request{Limit: lim, Key: "abuser"}
	legit := sluice.Request{Limit: lim, Key: "legit"}
	start := clock.Now()
	admitted := 0
	take := func(r sluice.Request) sluice.Decision {
		d, err := s.Take(ctx, sluice.OpTake, r)
		if err != nil {
			t.Fatalf("take %q: %v", r.Key, err)
		}
		return d
	}
	for take(abuser).Allowed {
		admitted++
	}
	var sinceLegit time.Duration
	key := make([]byte, 0, 16)
	for i := range flood {
		step := fast
		if i >= flood/2 {
			step = slow
		}
		clock.Advance(step)
		key = strconv.AppendInt(append(key[:0], "flood-"...), int64(i), 10)
		take(sluice.Request{Limit: lim, Key: string(key)})
		if i%askEvery == 0 {
			if take(abuser).Allowed {
				admitted++
			}
			if n := s.Len(); n > maxKeys {
				t.Fatalf("after %d fresh keys the store holds %d keys, bound %d", i+1, n, maxKeys)
			}
		}
		if sinceLegit += step; sinceLegit >= 1200*time.Millisecond { // within its limit
			sinceLegit = 0
			if d := take(legit); !d.Allowed {
				t.Fatalf("after %d fresh keys a client within its limit was rejected: %+v", i+1, d)
			}
		}
	}
	elapsed := clock.Now().Sub(start)
	// The client asked often enough to take each token as it arrived.
	bound := 5 + int(elapsed/time.Second)
	if admitted > bound {
		t.Fatalf("the drained client was admitted %d times in %v, bound burst 5 + 1/s = %d: its bucket was evicted and refilled", admitted, elapsed, bound)
	}
	if d, _ := s.Take(ctx, sluice.OpPeek, abuser); d.Remaining >= 1 {
		t.Fatalf("after the flood the drained key has %d tokens", d.Remaining)
	}
	if n := s.Len(); n > maxKeys {
		t.Fatalf("the store holds %d keys, bound %d", n, maxKeys)
	}
	full, partial := s.Evictions()
	if partial == 0 || full == 0 || full+partial < uint64(flood-maxKeys) {
		t.Fatalf("evictions: %d full, %d partial, for more than %d keys inserted", full, partial, flood)
	}
	t.Logf("abuser admitted %d in %v; evictions: %d full, %d partial", admitted, elapsed, full, partial)
}
