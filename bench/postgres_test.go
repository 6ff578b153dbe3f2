package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/postgres"
)

// postgresBenchURL is the database the PostgreSQL benchmarks use:
// $SLUICE_POSTGRES_URL, else the machine's local server (database "test").
// Benchmarks are run by hand, so they may use it; tests never do.
func postgresBenchURL() string {
	if u := os.Getenv("SLUICE_POSTGRES_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// BenchmarkPostgres measures takes per second and their latency through
// the PostgreSQL store at 1, 16 and 64 goroutines, on the shared Zipf
// workload (zipf) and on one hot key (onekey), each take one round trip
// and one INSERT ... ON CONFLICT DO UPDATE. It reports takes/s, p50 and
// p99 (microseconds per take as one goroutine saw it).
func BenchmarkPostgres(b *testing.B) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(postgresBenchURL())
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 64
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		b.Skipf("no PostgreSQL at %s: %v", postgresBenchURL(), err)
	}
	defer pool.Close()
	store, err := postgres.New(ctx, pool, postgres.Options{Migrate: true, KeyPrefix: fmt.Sprintf("bench-%d/", time.Now().UnixNano())})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	lim := sluice.New(store)
	l := sluice.MustLimit(sluice.Spec{Name: "bench", TokensPerSecond: ratePerSec, Burst: burst})
	for _, shape := range []string{"zipf", "onekey"} {
		for _, g := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("%s/g%d", shape, g), func(b *testing.B) {
				var next atomic.Int64
				lat := make([][]time.Duration, g)
				var wg sync.WaitGroup
				var failed atomic.Int64
				b.ResetTimer()
				start := time.Now()
				for w := 0; w < g; w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						mine := make([]time.Duration, 0, b.N/g+1)
						for {
							i := next.Add(1) - 1
							if i >= int64(b.N) {
								break
							}
							key := "user-1"
							if shape == "zipf" {
								key = sequence[int(i)&(len(sequence)-1)]
							}
							t0 := time.Now()
							if _, err := lim.Take(ctx, sluice.Request{Limit: l, Key: key, Cost: 1}); err != nil {
								failed.Add(1)
							}
							mine = append(mine, time.Since(t0))
						}
						lat[w] = mine
					}()
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				if n := failed.Load(); n > 0 {
					b.Fatalf("%d takes failed", n)
				}
				all := slices.Concat(lat...)
				slices.Sort(all)
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "takes/s")
				b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
			})
		}
	}
}
