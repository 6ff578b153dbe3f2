package postgres

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migration is one embedded schema change.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// migrationLock is the advisory lock key that serialises migrators: two
// processes starting at once apply each migration once.
const migrationLock = 0x736c75696365 // "sluice"

// lockReleaseTimeout bounds the advisory unlock after a failed migration.
const lockReleaseTimeout = 5 * time.Second

// Migrations returns the embedded migrations in version order. Their files
// are named NNNN_name.sql.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		return nil, fmt.Errorf("postgres migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		num, name, ok := strings.Cut(strings.TrimSuffix(e.Name(), ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("postgres migrations: file %q is not named NNNN_name.sql", e.Name())
		}
		body, err := migrationFS.ReadFile(path.Join("migrations", e.Name()))
		if err != nil {
			return nil, fmt.Errorf("postgres migrations: %w", err)
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("postgres migrations: version %d appears twice", out[i].Version)
		}
	}
	return out, nil
}

// MigrateResult lists what Migrate did.
type MigrateResult struct {
	Applied []Migration // applied by this call, in order
	Current int         // the schema version afterwards
}

// Migrate brings the schema of the database conn is connected to up to the
// newest embedded migration. It is idempotent: applied versions are
// recorded in sluice_schema_migrations and skipped. Each migration runs in
// its own transaction, and a session advisory lock keeps concurrent
// migrators from applying one twice. A database whose schema is newer
// than this binary's migrations is an error: an old binary must not run
// against a schema it does not know.
func Migrate(ctx context.Context, conn *pgx.Conn) (MigrateResult, error) {
	var res MigrateResult
	ms, err := Migrations()
	if err != nil {
		return res, err
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(migrationLock)); err != nil {
		return res, fmt.Errorf("postgres migrate: lock: %w", err)
	}
	defer func() {
		// A fresh context: the unlock must run even when ctx expired.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lockReleaseTimeout)
		defer cancel()
		conn.Exec(uctx, "SELECT pg_advisory_unlock($1)", int64(migrationLock))
	}()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS sluice_schema_migrations (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return res, fmt.Errorf("postgres migrate: create sluice_schema_migrations: %w", err)
	}
	applied := map[int]bool{}
	rows, err := conn.Query(ctx, "SELECT version FROM sluice_schema_migrations")
	if err != nil {
		return res, fmt.Errorf("postgres migrate: read versions: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return res, fmt.Errorf("postgres migrate: read versions: %w", err)
	}
	for _, v := range versions {
		applied[v] = true
		res.Current = max(res.Current, v)
	}
	if newest := ms[len(ms)-1].Version; res.Current > newest {
		return res, fmt.Errorf("postgres migrate: the database is at schema version %d, newer than this binary's %d", res.Current, newest)
	}
	for _, m := range ms {
		if applied[m.Version] {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO sluice_schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name)
			return err
		})
		if err != nil {
			return res, fmt.Errorf("postgres migrate: %04d_%s: %w", m.Version, m.Name, err)
		}
		res.Applied = append(res.Applied, m)
		// Versions may have gaps, filled by a later binary: the schema's
		// version is the newest applied, not the last.
		res.Current = max(res.Current, m.Version)
	}
	return res, nil
}

// MigratePool runs Migrate on a connection of pool.
func MigratePool(ctx context.Context, pool *pgxpool.Pool) (MigrateResult, error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return MigrateResult{}, fmt.Errorf("postgres migrate: connect: %w", err)
	}
	defer c.Release()
	return Migrate(ctx, c.Conn())
}
