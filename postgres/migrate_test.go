package postgres_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/postgres"
)

func TestMigrations(t *testing.T) {
	pool(t) // skips without a server
	ctx := pgtestContext(t)
	url, err := server.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := postgres.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	newest := ms[len(ms)-1].Version

	// Eight migrators at once: the advisory lock lets one apply each
	// migration, and the others find nothing to do.
	var wg sync.WaitGroup
	applied := make([]int, 8)
	errs := make([]error, 8)
	for i := range applied {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				errs[i] = err
				return
			}
			defer conn.Close(ctx)
			res, err := postgres.Migrate(ctx, conn)
			applied[i], errs[i] = len(res.Applied), err
			if err == nil && res.Current != newest {
				errs[i] = errVersion(res.Current)
			}
		}()
	}
	wg.Wait()
	total := 0
	for i := range applied {
		if errs[i] != nil {
			t.Fatalf("migrator %d: %v", i, errs[i])
		}
		total += applied[i]
	}
	if total != len(ms) {
		t.Fatalf("%d migrations applied in all, want each of the %d once", total, len(ms))
	}

	// Migrate at store start is idempotent too, and the store works.
	p, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s, err := postgres.New(ctx, p, postgres.Options{Migrate: true, HousekeepingInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	lim := sluice.MustLimit(sluice.Spec{Name: "m", TokensPerSecond: 1, Burst: 1})
	if d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"}); err != nil || !d.Allowed {
		t.Fatalf("take after migrate: %+v %v", d, err)
	}

	// A schema newer than the binary is refused rather than used.
	if _, err := p.Exec(ctx, "INSERT INTO sluice_schema_migrations (version, name) VALUES ($1, 'future')", newest+1); err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.MigratePool(ctx, p); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("migrating a newer schema: %v", err)
	}
}

type errVersion int

func (e errVersion) Error() string { return "ended at an older version" }

// A failed migration leaves nothing half-applied: its transaction rolls
// back and its version is not recorded.
func TestMigrationFailureRollsBack(t *testing.T) {
	pool(t)
	ctx := pgtestContext(t)
	conn := freshConn(t, ctx)
	// The rules migration (0002) will collide with this table.
	if _, err := conn.Exec(ctx, "CREATE TABLE sluice_rules (x int)"); err != nil {
		t.Fatal(err)
	}
	res, err := postgres.Migrate(ctx, conn)
	if err == nil || !strings.Contains(err.Error(), "0002_rules") {
		t.Fatalf("want the 0002 migration to fail, got %v", err)
	}
	if res.Current != 1 {
		t.Fatalf("schema at %d after the failure, want 1", res.Current)
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regproc('sluice_rules_notify') IS NOT NULL").Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatal("part of the failed migration was left behind")
	}
	if _, err := conn.Exec(ctx, "DROP TABLE sluice_rules"); err != nil {
		t.Fatal(err)
	}
	ms, err := postgres.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	if res, err := postgres.Migrate(ctx, conn); err != nil || len(res.Applied) != len(ms)-1 {
		t.Fatalf("retry applied %d, want %d: %v", len(res.Applied), len(ms)-1, err)
	}
}

// freshConn connects to a new, empty database of the test server (no
// migrations applied), closed when the test ends.
func freshConn(t *testing.T, ctx context.Context) *pgx.Conn {
	t.Helper()
	url, err := server.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
