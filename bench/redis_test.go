package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/sluicehq/sluice"
	sredis "github.com/sluicehq/sluice/redis"
)

// redisLimiter builds one contender against the server at addr and
// returns its check and a function that releases it.
type redisLimiter struct {
	name string
	make func(b *testing.B, addr string) (allower, func())
}

func sluiceRedis(opts sredis.Options) func(b *testing.B, addr string) (allower, func()) {
	return func(b *testing.B, addr string) (allower, func()) {
		opts.Timeout = time.Second // measure throughput, not the breaker
		s, err := sredis.Open("redis://"+addr, opts)
		if err != nil {
			b.Fatal(err)
		}
		lim := sluice.New(s)
		l := sluice.MustLimit(sluice.Spec{Name: "bench", TokensPerSecond: ratePerSec, Burst: burst})
		ctx := context.Background()
		return func(key string) bool {
			d, err := lim.Take(ctx, sluice.Request{Limit: l, Key: key, Cost: 1})
			if err != nil {
				b.Error(err)
			}
			return d.Allowed
		}, func() { s.Close() }
	}
}

func redisRate(b *testing.B, addr string) (allower, func()) {
	rdb := goredis.NewClient(&goredis.Options{Addr: addr})
	l := redis_rate.NewLimiter(rdb)
	limit := redis_rate.PerSecond(ratePerSec) // burst = rate = 100
	ctx := context.Background()
	return func(key string) bool {
		res, err := l.Allow(ctx, key, limit)
		if err != nil {
			b.Error(err)
			return false
		}
		return res.Allowed > 0
	}, func() { rdb.Close() }
}

var redisLimiters = []redisLimiter{
	{"sluice", sluiceRedis(sredis.Options{})},
	{"sluice-nocache", sluiceRedis(sredis.Options{NoOverLimitCache: true})},
	{"sluice-nobatch-nocache", sluiceRedis(sredis.Options{NoOverLimitCache: true, NoBatch: true})},
	{"redis_rate", redisRate},
}

// BenchmarkRedis runs the Zipf workload (10,000 keys, 100/s, burst 100)
// through each Redis-backed limiter at 1, 16, 64 and 256 goroutines
// against one local redis-server, reporting checks/s, p50/p99 latency
// and the server's CPU and script calls per check (the INFO cpu and
// commandstats deltas over the checks: sluice's batches carry several
// checks in one script call).
func BenchmarkRedis(b *testing.B) {
	addr := redisAddr(b)
	admin := goredis.NewClient(&goredis.Options{Addr: addr})
	defer admin.Close()
	for _, l := range redisLimiters {
		for _, g := range []int{1, 16, 64, 256} {
			b.Run(fmt.Sprintf("%s/g%d", l.name, g), func(b *testing.B) {
				admin.FlushAll(context.Background())
				allow, done := l.make(b, addr)
				defer done()
				runRedis(b, admin, allow, g)
			})
		}
	}
}

// runRedis spreads b.N checks over g goroutines, each walking the Zipf
// sequence from its own offset.
func runRedis(b *testing.B, admin *goredis.Client, allow allower, g int) {
	// Warm up connections and scripts.
	for i := range 100 {
		allow(sequence[i])
	}
	var next atomic.Int64
	lats := make([][]time.Duration, g)
	var admitted atomic.Int64
	cpu0, scripts0 := redisCPU(b, admin), redisScriptCalls(b, admin)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([]time.Duration, 0, b.N/g+1)
			off := w * 7919
			n := 0
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					break
				}
				t0 := time.Now()
				if allow(sequence[(off+i)&(len(sequence)-1)]) {
					n++
				}
				mine = append(mine, time.Since(t0))
			}
			lats[w] = mine
			admitted.Add(int64(n))
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	cpu := redisCPU(b, admin) - cpu0
	scripts := redisScriptCalls(b, admin) - scripts0
	all := slices.Concat(lats...)
	slices.Sort(all)
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[int(float64(len(all)-1)*p)].Microseconds())
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "checks/s")
	b.ReportMetric(pct(0.50), "p50-us")
	b.ReportMetric(pct(0.99), "p99-us")
	b.ReportMetric(cpu*1e6/float64(b.N), "redis-cpu-us/check")
	b.ReportMetric(scripts/float64(b.N), "scripts/check")
	b.ReportMetric(float64(admitted.Load())/float64(b.N), "admitted/check")
	sink.Add(admitted.Load())
}

// BenchmarkRedisClient compares the two Go clients on the same work: one
// EVALSHA of sluice's script per check (no batching, no cache), at 64
// goroutines.
func BenchmarkRedisClient(b *testing.B) {
	addr := redisAddr(b)
	admin := goredis.NewClient(&goredis.Options{Addr: addr})
	defer admin.Close()
	src := sredis.ScriptSource()
	// One token-bucket take of 1 token at 100/s, burst 100 (see the
	// argument layout in redis/lua/main.lua).
	args := []string{"0", "t1", "tb 100000000 100 1", "1000000", ""}
	iargs := make([]any, len(args))
	for i, a := range args {
		iargs[i] = a
	}
	ctx := context.Background()
	clients := []struct {
		name string
		make func() (allower, func())
	}{
		{"rueidis", func() (allower, func()) {
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
			if err != nil {
				b.Fatal(err)
			}
			script := rueidis.NewLuaScript(src)
			return func(key string) bool {
				v, err := script.Exec(ctx, c, []string{"tb:client:" + key}, args).AsIntSlice()
				if err != nil {
					b.Error(err)
				}
				return len(v) > 0 && v[0] == 1
			}, c.Close
		}},
		{"go-redis", func() (allower, func()) {
			c := goredis.NewClient(&goredis.Options{Addr: addr})
			script := goredis.NewScript(src)
			return func(key string) bool {
				v, err := script.Run(ctx, c, []string{"tb:client:" + key}, iargs...).Int64Slice()
				if err != nil {
					b.Error(err)
				}
				return len(v) > 0 && v[0] == 1
			}, func() { c.Close() }
		}},
		{"go-redis-autopipeline", func() (allower, func()) {
			c := goredis.NewClient(&goredis.Options{Addr: addr})
			ap, err := c.AutoPipeline()
			if err != nil {
				b.Fatal(err)
			}
			script := goredis.NewScript(src)
			if err := script.Load(ctx, c).Err(); err != nil {
				b.Fatal(err)
			}
			return func(key string) bool {
				v, err := script.EvalSha(ctx, ap, []string{"tb:client:" + key}, iargs...).Int64Slice()
				if err != nil {
					b.Error(err)
				}
				return len(v) > 0 && v[0] == 1
			}, func() { ap.Close(); c.Close() }
		}},
	}
	for _, cl := range clients {
		b.Run(cl.name+"/g64", func(b *testing.B) {
			admin.FlushAll(ctx)
			allow, done := cl.make()
			defer done()
			runRedis(b, admin, allow, 64)
		})
	}
}
