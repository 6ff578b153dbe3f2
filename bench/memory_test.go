package bench

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sethvargo "github.com/sethvargo/go-limiter/memorystore"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/throttled/throttled/v2"
	throttledmem "github.com/throttled/throttled/v2/store/memstore"
	"golang.org/x/time/rate"
)

// The shared workload: 10,000 keys drawn with a Zipf skew, so a few keys
// are hot and most are cold, at 100 requests per second per key with a
// burst of 100.
const (
	workloadKeys = 10_000
	ratePerSec   = 100
	burst        = 100
)

var (
	keys     = makeKeys()
	sequence = makeSequence(1 << 16)
)

func makeKeys() []string {
	ks := make([]string, workloadKeys)
	for i := range ks {
		ks[i] = "user-" + strconv.Itoa(i)
	}
	return ks
}

func makeSequence(n int) []string {
	z := rand.NewZipf(rand.New(rand.NewPCG(1, 2)), 1.1, 1, workloadKeys-1)
	seq := make([]string, n)
	for i := range seq {
		seq[i] = keys[z.Uint64()]
	}
	return seq
}

// allower is the one question every limiter is asked.
type allower func(key string) bool

// newSluice asks sluice's memory store the question every limiter here is
// asked, through Limiter.Allow: admitted or not.
func newSluice() allower {
	lim := sluice.New(memory.New(memory.Options{}))
	l := sluice.MustLimit(sluice.Spec{Name: "bench", TokensPerSecond: ratePerSec, Burst: burst})
	ctx := context.Background()
	return func(key string) bool { return lim.Allow(ctx, l, key) }
}

// newSluiceTake asks through Limiter.Take, which also answers the
// remaining tokens, the waits, RetryAt and the rule: an 88-byte Decision.
func newSluiceTake() allower { return sluiceTake(memory.Options{}) }

// newSluiceTakePrecise is newSluiceTake on a store that reads the precise
// clock for every decision (memory.Options.PreciseClock): the rows that
// say what the coarse clock (memory/clock.go) gains the library's Take.
func newSluiceTakePrecise() allower { return sluiceTake(memory.Options{PreciseClock: true}) }

func sluiceTake(opts memory.Options) allower {
	lim := sluice.New(memory.New(opts))
	l := sluice.MustLimit(sluice.Spec{Name: "bench", TokensPerSecond: ratePerSec, Burst: burst})
	ctx := context.Background()
	return func(key string) bool {
		d, _ := lim.Take(ctx, sluice.Request{Limit: l, Key: key, Cost: 1})
		return d.Allowed
	}
}

// newXrate is golang.org/x/time/rate kept in a mutex-guarded map, the
// pattern most services use.
func newXrate() allower {
	var mu sync.Mutex
	m := map[string]*rate.Limiter{}
	return func(key string) bool {
		mu.Lock()
		l, ok := m[key]
		if !ok {
			l = rate.NewLimiter(ratePerSec, burst)
			m[key] = l
		}
		mu.Unlock()
		return l.Allow()
	}
}

func newSethvargo() allower {
	s, err := sethvargo.New(&sethvargo.Config{Tokens: burst, Interval: time.Second})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	return func(key string) bool {
		_, _, _, ok, _ := s.Take(ctx, key)
		return ok
	}
}

func newThrottled() allower {
	st, err := throttledmem.NewCtx(65536)
	if err != nil {
		panic(err)
	}
	rl, err := throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{MaxRate: throttled.PerSec(ratePerSec), MaxBurst: burst - 1})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	return func(key string) bool {
		limited, _, _ := rl.RateLimitCtx(ctx, key, 1)
		return !limited
	}
}

var limiters = []struct {
	name string
	make func() allower
}{
	{"sluice", newSluice},
	{"sluice-take", newSluiceTake},
	{"sluice-take-precise", newSluiceTakePrecise},
	{"xrate", newXrate},
	{"sethvargo", newSethvargo},
	{"throttled", newThrottled},
}

var sink atomic.Int64

// BenchmarkMemory runs the workload through each limiter: serial (one
// goroutine over the Zipf sequence), parallel (GOMAXPROCS goroutines over
// it) and onekey (one goroutine, one key).
func BenchmarkMemory(b *testing.B) {
	for _, l := range limiters {
		b.Run(l.name+"/serial", func(b *testing.B) {
			allow := l.make()
			b.ReportAllocs()
			n := 0
			for i := 0; b.Loop(); i++ {
				if allow(sequence[i&(len(sequence)-1)]) {
					n++
				}
			}
			sink.Add(int64(n))
		})
		b.Run(l.name+"/parallel", func(b *testing.B) {
			allow := l.make()
			var seed atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seed.Add(7919))
				n := 0
				for pb.Next() {
					if allow(sequence[i&(len(sequence)-1)]) {
						n++
					}
					i++
				}
				sink.Add(int64(n))
			})
		})
		b.Run(l.name+"/onekey", func(b *testing.B) {
			allow := l.make()
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				if allow("user-1") {
					n++
				}
			}
			sink.Add(int64(n))
		})
	}
}

// BenchmarkClock times one time.Now() on this machine, the floor under any
// limiter that reads the wall clock per call.
func BenchmarkClock(b *testing.B) {
	var n int64
	for b.Loop() {
		n += time.Now().UnixNano()
	}
	sink.Add(n)
}

// BenchmarkMonotonic times the monotonic-only read sluice's memory store
// uses (time.Since on a fixed anchor).
func BenchmarkMonotonic(b *testing.B) {
	start := time.Now()
	var n int64
	for b.Loop() {
		n += int64(time.Since(start))
	}
	sink.Add(n)
}
