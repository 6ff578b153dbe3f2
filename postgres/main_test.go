package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/postgres"
	"github.com/sluicehq/sluice/postgres/pgtest"
)

// server is the package's PostgreSQL, started once in TestMain.
var server *pgtest.Server

func TestMain(m *testing.M) { pgtest.Main(m, &server) }

var (
	sharedOnce sync.Once
	sharedPool *pgxpool.Pool
	sharedErr  error
	prefixSeq  atomic.Int64
)

// pool returns a pool on a migrated database shared by the package's store
// tests; each store gets its own key prefix, so each starts empty.
func pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pgtest.Require(t, server)
	sharedOnce.Do(func() {
		ctx := context.Background()
		var url string
		if url, sharedErr = server.NewDatabase(ctx); sharedErr != nil {
			return
		}
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			sharedErr = err
			return
		}
		cfg.MaxConns = 24
		if sharedPool, sharedErr = pgxpool.NewWithConfig(ctx, cfg); sharedErr != nil {
			return
		}
		_, sharedErr = postgres.MigratePool(ctx, sharedPool)
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return sharedPool
}

// newStore is a conformance.NewStore: a fresh (prefixed) store on the
// shared database reading its time from clock.
func newStore(t *testing.T, clock sluice.Clock) sluice.Store {
	return newStoreOpts(t, postgres.Options{Clock: clock})
}

func newStoreOpts(t *testing.T, opts postgres.Options) *postgres.Store {
	t.Helper()
	p := pool(t)
	opts.KeyPrefix = fmt.Sprintf("t%d/", prefixSeq.Add(1))
	if opts.HousekeepingInterval == 0 {
		opts.HousekeepingInterval = -1
	}
	if opts.Timeout == 0 {
		// Correctness tests pile 64 goroutines onto a few rows under -race
		// on 2 cores: their waits are not what they test.
		opts.Timeout = time.Minute
	}
	s, err := postgres.New(pgtest.Context(t), p, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}
