package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	sredis "github.com/sluicehq/sluice/redis"
)

// A hot key on one Redis primary, decided by a fleet of hotProcs
// "processes": each its own Redis store (its own rueidis client and
// connection), its own Limiter, in this test's process. A mode builds one
// process of the fleet.
type hotMode struct {
	name string
	// open builds one process against addr for the limit spec.
	open func(b *testing.B, addr string, spec sluice.Spec) *hotProc
}

// hotProc is one process of the fleet.
type hotProc struct {
	take  func(ctx context.Context, key string, cost float64) (bool, error)
	stats func() leaseCounts // nil: no slices
	close func()
}

// leaseCounts are a leased process's slice operations, and the tokens
// its slices hold now.
type leaseCounts struct {
	taken, returned int64
	held            float64
}

const hotProcs = 3

var hotModes = []hotMode{
	{"exact", func(b *testing.B, addr string, spec sluice.Spec) *hotProc { return exactProc(b, addr, spec) }},
	{"sharded", func(b *testing.B, addr string, spec sluice.Spec) *hotProc {
		spec.Shards = hotShards
		return exactProc(b, addr, spec)
	}},
	{"leased", leasedProc},
}

// hotShards is the sharded mode's shards: enough that the power of two
// choices has somewhere to go, few enough that each shard holds more
// than a burst of one process's callers.
const hotShards = 8

func exactProc(b *testing.B, addr string, spec sluice.Spec) *hotProc {
	s, lim, l := openHot(b, addr, spec)
	return &hotProc{
		take: func(ctx context.Context, key string, cost float64) (bool, error) {
			return allowed(lim.Take(ctx, sluice.Request{Limit: l, Key: key, Cost: cost}))
		},
		close: func() { s.Close() },
	}
}

func openHot(b *testing.B, addr string, spec sluice.Spec) (*sredis.Store, *sluice.Limiter, *sluice.Limit) {
	s, err := sredis.Open("redis://"+addr, sredis.Options{Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	l, err := sluice.NewLimit(spec)
	if err != nil {
		b.Fatal(err)
	}
	return s, sluice.New(s), l
}

func allowed(d sluice.Decision, err error) (bool, error) { return d.Allowed, err }

// BenchmarkHotKey drives one key on one redis-server from a fleet of 3
// processes in each mode, one after the other in one run:
//
//   - same-traffic: 10,000 decisions a second offered (an open loop),
//     under a limit they never reach: the Redis CPU, Redis commands and
//     this process's CPU per decision;
//   - closed: every caller asks again as soon as answered, under the
//     same limit: the decisions a second the fleet serves;
//   - at-limit: 5,000 a second offered against a limit of 2,500 a
//     second with a burst of 2,500, so that from the first second on
//     the demand exceeds what the limit allows: how far the admissions
//     go beyond the exact limit over any interval (the overshoot, in
//     tokens, against exact token buckets this process keeps from the
//     answers, the decisions dated when asked in one and when answered
//     in the other: the store decided between), and the false
//     rejections: the tokens the limit allowed over the run (its burst
//     plus its rate times the run's length) that nobody was admitted,
//     less those still held in slices at the end, when more decisions
//     were asked than that. The exact mode's figures are the noise of
//     counting from outside the store;
//   - costly: the same limit and tokens a second, asked by requests of
//     100 tokens, 50 a second: a cost that a sharded request must find
//     in two of its 8 shards of 312, and that is above the leased max
//     slice (7 tokens), so decided exactly.
//
// SLUICE_HOTKEY_SECONDS sets each part's length (default 3).
func BenchmarkHotKey(b *testing.B) {
	addr := redisAddr(b)
	admin := goredis.NewClient(&goredis.Options{Addr: addr})
	defer admin.Close()
	secs := 3.0
	if v := os.Getenv("SLUICE_HOTKEY_SECONDS"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 {
			b.Fatalf("SLUICE_HOTKEY_SECONDS=%q: want seconds above 0", v)
		}
		secs = f
	}
	d := time.Duration(secs * float64(time.Second))
	roomy := sluice.Spec{Name: "hot", TokensPerSecond: 10_000_000, Burst: 10_000_000}
	tight := sluice.Spec{Name: "hot", TokensPerSecond: 2_500, Burst: 2_500}
	parts := []struct {
		name    string
		spec    sluice.Spec
		offered float64 // decisions a second; 0: a closed loop
		callers int     // per process
		cost    float64 // tokens per request
	}{
		{"same-traffic", roomy, 10_000, 16, 1},
		{"closed", roomy, 0, 32, 1},
		{"at-limit", tight, 5_000, 16, 1},
		{"costly", tight, 50, 4, 100},
	}
	for _, p := range parts {
		for _, m := range hotModes {
			b.Run(p.name+"/"+m.name, func(b *testing.B) {
				admin.FlushAll(context.Background())
				runHot(b, admin, addr, m, p.spec, p.offered, p.callers, p.cost, d)
			})
		}
	}
}

// hotRun is what one part of one mode counts.
type hotRun struct {
	decisions, admitted atomic.Int64
	// asked dates each decision when it was asked, answered when its
	// answer came: the store decided between the two, so the fleet's
	// overshoot lies between what answered and asked find (asked
	// charges admissions earlier than they happened: more; answered
	// later: less).
	asked, answered *refBucket
	lats            [][]time.Duration
}

func runHot(b *testing.B, admin *goredis.Client, addr string, m hotMode, spec sluice.Spec, offered float64, callers int, cost float64, d time.Duration) {
	ctx := context.Background()
	procs := make([]*hotProc, hotProcs)
	for i := range procs {
		procs[i] = m.open(b, addr, spec)
		defer procs[i].close()
	}
	// Warm up connections and scripts on another key.
	for _, p := range procs {
		for range 100 {
			if _, err := p.take(ctx, "warm", 1); err != nil {
				b.Fatal(err)
			}
		}
	}
	var run hotRun
	run.asked = newRefBucket(spec.TokensPerSecond, spec.Burst)
	run.answered = newRefBucket(spec.TokensPerSecond, spec.Burst)
	workers := hotProcs * callers
	run.lats = make([][]time.Duration, workers)
	cpu0, calls0 := redisCPU(b, admin), redisCalls(b, admin)
	own0 := ownCPU()
	b.ResetTimer()
	start := time.Now()
	run.asked.start(start)
	run.answered.start(start)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run.lats[w] = hotWorker(b, &run, procs[w%hotProcs], w, workers, offered, cost, start, d)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	cpu, calls, own := redisCPU(b, admin)-cpu0, redisCalls(b, admin)-calls0, ownCPU()-own0
	n := float64(run.decisions.Load())
	all := slices.Concat(run.lats...)
	slices.Sort(all)
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[int(float64(len(all)-1)*p)].Microseconds())
	}
	var lc leaseCounts
	for _, p := range procs {
		if p.stats != nil {
			s := p.stats()
			lc.taken += s.taken
			lc.returned += s.returned
			lc.held += s.held
		}
	}
	allowedByLimit := spec.Burst + spec.TokensPerSecond*elapsed.Seconds()
	falseRejections := 0.0
	if offered > 0 && n*cost > allowedByLimit {
		falseRejections = max(0, allowedByLimit-float64(run.admitted.Load())*cost-lc.held)
	}
	b.ReportMetric(n/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(pct(0.50), "p50-us")
	b.ReportMetric(pct(0.99), "p99-us")
	b.ReportMetric(cpu*1e6/n, "redis-cpu-us/decision")
	b.ReportMetric(float64(calls)/n, "redis-commands/decision")
	b.ReportMetric(own*1e6/n, "proc-cpu-us/decision")
	b.ReportMetric(float64(run.admitted.Load())/n, "admitted/decision")
	b.ReportMetric(run.asked.overshoot(), "overshoot-asked-tokens")
	b.ReportMetric(run.answered.overshoot(), "overshoot-answered-tokens")
	b.ReportMetric(falseRejections, "false-rejections")
	b.ReportMetric(float64(lc.taken), "slices-taken")
	b.ReportMetric(float64(lc.returned), "slices-returned")
}

// hotWorker is caller w of workers: in an open loop it asks at its turns
// of the offered rate (late turns asked at once, so the count offered
// holds), in a closed loop (offered 0) again as soon as answered, until d
// has passed; it returns the latencies it saw.
func hotWorker(b *testing.B, run *hotRun, p *hotProc, w, workers int, offered, cost float64, start time.Time, d time.Duration) []time.Duration {
	ctx := context.Background()
	var lats []time.Duration
	every := time.Duration(0)
	if offered > 0 {
		every = time.Duration(float64(workers) / offered * float64(time.Second))
	}
	for i := 0; ; i++ {
		due := start
		if every > 0 {
			due = start.Add(time.Duration(i)*every + time.Duration(w)*every/time.Duration(workers))
			if wait := time.Until(due); wait > 0 {
				time.Sleep(wait)
			}
		}
		t0 := time.Now()
		if t0.Sub(start) >= d || (every > 0 && due.Sub(start) >= d) {
			return lats
		}
		ok, err := p.take(ctx, "hot", cost)
		t1 := time.Now()
		lats = append(lats, t1.Sub(t0))
		if err != nil {
			b.Error(err)
			return lats
		}
		run.decisions.Add(1)
		if ok {
			run.admitted.Add(1)
		}
		run.asked.record(t0, ok, cost)
		run.answered.record(t1, ok, cost)
	}
}

// refBucket is the exact token bucket the fleet's admissions are held
// against: every admission is charged to it, even below zero, so that
// its lowest level is the most the fleet admitted beyond the exact
// limit over any interval that ends at an admission.
type refBucket struct {
	mu             sync.Mutex
	rate, capacity float64
	tokens, lowest float64
	at             time.Time
}

func newRefBucket(rate, capacity float64) *refBucket {
	return &refBucket{rate: rate, capacity: capacity, tokens: capacity}
}

func (r *refBucket) start(t time.Time) { r.at = t }

// record dates a decision at t (taken no earlier than the last).
func (r *refBucket) record(t time.Time, admitted bool, cost float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.After(r.at) {
		r.tokens = math.Min(r.capacity, r.tokens+t.Sub(r.at).Seconds()*r.rate)
		r.at = t
	}
	if admitted {
		r.tokens -= cost
		r.lowest = math.Min(r.lowest, r.tokens)
	}
}

// overshoot is the most tokens admitted beyond the exact bucket.
func (r *refBucket) overshoot() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return max(0, -r.lowest)
}

// redisCalls returns the commands the server has processed, from INFO
// stats: those its scripts run count too.
func redisCalls(b *testing.B, c *goredis.Client) int64 {
	b.Helper()
	info, err := c.Info(context.Background(), "stats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(fmt.Errorf("INFO stats total_commands_processed: %w", err))
			}
			return n
		}
	}
	b.Fatal("INFO stats has no total_commands_processed")
	return 0
}

// ownCPU is this process's CPU time (user + system) in seconds.
func ownCPU() float64 {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return math.NaN()
	}
	return float64(u.Utime.Nano()+u.Stime.Nano()) / 1e9
}
