package httpgate_test

// Attacks on an adaptive rate and on the queue of held requests.

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/redis"
)

// minorityPolicy is an adaptive rule with the file defaults (error_ratio
// 0.1, the 90th percentile), whose burst admits 20 requests an interval.
const minorityPolicy = `rules:
  - name: upstream
    algorithm_config:
      rps: 20
      burst_seconds: 1
      adaptive: {min: 2, max: 40, target_latency: 200ms, increase: 2}
`

// minorityUpstream fails /crash with a 500, answers /slow in 5s of the
// test's clock, and everything else at once.
func minorityUpstream(t *testing.T, clk *sluice.ManualClock) string {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/crash":
			http.Error(w, "boom", 500)
		case "/slow":
			clk.Advance(5 * time.Second)
		}
	}))
	t.Cleanup(up.Close)
	return up.URL
}

// Attack: a client whose own requests make the upstream fail (a body it
// crashes on) or answer slowly (a huge prompt) would drive the rate of
// every client of the rule down to min, if one error or one slow answer
// made an interval unhealthy. With error_ratio's default (0.1) and the
// 90th percentile, one such request among twenty moves nothing: the rate
// keeps rising. (An upstream failing a tenth of all requests, or slow for
// a tenth, is judged unhealthy: TestAdaptiveRateFollowsUpstream.)
func TestAttackMinorityCannotDriveRateDown(t *testing.T) {
	for _, bad := range []string{"/crash", "/slow"} {
		t.Run(bad, func(t *testing.T) {
			e := newEnv(t, minorityPolicy)
			proxy := proxyOf(t, e.gate, minorityUpstream(t, e.clk))
			start := e.gate.AdaptiveRates()[0].Rate
			for range 3 {
				for range 19 {
					if resp := proxy.get(t, "/ok"); resp.StatusCode != 200 {
						t.Fatalf("status %d", resp.StatusCode)
					}
				}
				proxy.get(t, bad)
				e.clk.Advance(time.Second)
			}
			proxy.get(t, "/ok")
			if got := e.gate.AdaptiveRates()[0].Rate; got <= start {
				t.Fatalf("rate %v after 3 intervals with one %s in 20: the minority drove it down (start %v)", got, bad, start)
			}
		})
	}
}

// Attack: a queue of held requests makes every request wait; if that wait
// counted as the upstream's latency, shaping itself would read as a slow
// upstream and collapse the rate (and a client could lengthen the queue
// on purpose to that end). The latency is measured from when the request
// leaves the queue.
func TestAttackQueueWaitIsNotUpstreamLatency(t *testing.T) {
	clk := sluice.NewManualClock(sluiceEpoch)
	m := metrics.New(prometheus.NewRegistry())
	lim := sluice.NewWithOptions(m.InstrumentStore(memory.New(memory.Options{Clock: clk})), sluice.Options{Clock: clk})
	g := httpgate.New(mustPolicy(t, `rules:
  - name: paced
    algorithm: leaky_bucket
    algorithm_config:
      rps: 10
      max_delay: 10s
      adaptive: {min: 1, max: 20, target_latency: 20ms, error_ratio: 0}
`), lim, httpgate.Options{
		Metrics: m,
		Logger:  slog.New(slog.NewTextHandler(t.Output(), nil)),
		// Each held request waits its turn on the test's clock.
		Delay: func(_ context.Context, d time.Duration) error { clk.Advance(d); return nil },
	})
	srv := serve(t, g.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	// Every request but the first waits its turn: 1/rate, at least 50ms,
	// more than twice the target.
	for range 5 {
		for range 20 {
			if resp := srv.get(t, "/"); resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
		}
	}
	if got := g.AdaptiveRates()[0].Rate; got < 10 {
		t.Fatalf("rate %v: the queue's own wait was taken for a slow upstream", got)
	}
}

// Attack: a flood of concurrent requests into a shaping rule holds one
// goroutine and one connection each for as long as its turn is away. At
// most max_queued are held; every other is refused at once, charged
// nothing, however they race for the last places.
func TestAttackQueueFlood(t *testing.T) {
	h := newHolding(t, strings.Replace(shapedPolicy, "max_queued: 3", "max_queued: 4", 1))
	<-h.send(context.Background()) // the bucket's one request: no wait
	const flood = 24
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	done := make(chan struct{})
	for range flood {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := <-h.send(context.Background())
			mu.Lock()
			defer mu.Unlock()
			if r == nil {
				codes[0]++
				return
			}
			codes[r.StatusCode]++
			if r.StatusCode == 429 && r.Header.Get("X-Sluice-Reason") != "queue_full" {
				codes[-1]++
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	// Exactly four reach their wait; the twenty others are refused
	// without waiting for the held ones.
	var waits []time.Duration
	for range 4 {
		waits = append(waits, h.wait(t))
	}
	for {
		mu.Lock()
		refused := codes[429]
		mu.Unlock()
		if refused == flood-4 {
			break
		}
		select {
		case d := <-h.entered:
			t.Fatalf("a fifth request was held (%v)", d)
		case <-time.After(10 * time.Millisecond): // the refusals are on their way
		}
	}
	close(h.release)
	<-done
	if codes[200] != 4 || codes[429] != flood-4 || codes[-1] != 0 || codes[0] != 0 {
		t.Fatalf("answers %v", codes)
	}
	// The refused took no turns: the held got 100..400ms, and the next
	// request's turn is the fifth.
	h.release = make(chan struct{})
	c := h.send(context.Background())
	if d := h.wait(t); d != 500*time.Millisecond {
		t.Fatalf("next turn %v, want 500ms (held: %v)", d, waits)
	}
	close(h.release)
	<-c
}

// Attack: whoever can write to the shared store (or an older sluice with
// other bounds) puts a rate there that the rule does not allow. A process
// adopts the shared rate only within its own min and max, and a value
// that is not a rate is written over.
func TestAttackSharedRateOutOfBounds(t *testing.T) {
	addr := redistest.Server(t)
	clk := sluice.NewManualClock(sluiceEpoch)
	st, err := redis.Open("redis://"+addr+"/0", redis.Options{Clock: clk, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	for _, v := range []string{"1e300 0 0", "0.0001 0 0", "not a rate"} {
		t.Run(v, func(t *testing.T) {
			if err := st.Client().Do(ctx, st.Client().B().Set().Key("adaptive:upstream").Value(v).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			g := httpgate.New(mustPolicy(t, adaptivePolicy), sluice.NewWithOptions(st, sluice.Options{Clock: clk}), httpgate.Options{Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
			srv := serve(t, g.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
			srv.get(t, "/")
			got := g.AdaptiveRates()[0]
			if got.Rate < got.Min || got.Rate > got.Max {
				t.Fatalf("rate %v outside [%v, %v]", got.Rate, got.Min, got.Max)
			}
			// At most the burst of the largest rate passes at once.
			passed := 0
			for range 100 {
				if srv.get(t, "/").StatusCode == 200 {
					passed++
				}
			}
			if passed > 20 {
				t.Fatalf("%d passed at once: more than a second of max", passed)
			}
		})
	}
}
