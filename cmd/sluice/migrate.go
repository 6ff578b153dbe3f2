package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/postgres"
)

func init() {
	commands["migrate"] = command{"apply the PostgreSQL schema migrations (--url or $SLUICE_POSTGRES_URL)", runMigrate}
}

// connectPostgres connects the postgres command cmd to the database that
// flagURL names, else $SLUICE_POSTGRES_URL (sluice's own URL parameters
// removed), for at most timeout. When it cannot, it writes why to stderr
// and conn is nil, with code the exit code; done closes the connection.
func connectPostgres(cmd, flagURL string, timeout time.Duration, stderr io.Writer) (ctx context.Context, conn *pgx.Conn, done func(), code int) {
	raw := cmp.Or(flagURL, os.Getenv("SLUICE_POSTGRES_URL"))
	if raw == "" {
		fmt.Fprintf(stderr, "sluice %s: no database: give --url postgres://... or set SLUICE_POSTGRES_URL\n", cmd)
		return nil, nil, nil, 2
	}
	u, _, err := postgres.SplitURL(raw)
	if err != nil {
		fmt.Fprintf(stderr, "sluice %s: %v\n", cmd, err)
		return nil, nil, nil, 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	if conn, err = pgx.Connect(ctx, u); err != nil {
		cancel()
		fmt.Fprintf(stderr, "sluice %s: connect: %v\n", cmd, err)
		return nil, nil, nil, 1
	}
	return ctx, conn, func() { conn.Close(context.WithoutCancel(ctx)); cancel() }, 0
}

func runMigrate(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("migrate", "usage: sluice migrate [--url postgres://...] [--timeout 1m]\n\nCreates or upgrades sluice's tables in PostgreSQL; running it again changes\nnothing. serve can do the same at start with sluice_migrate=true on the\nstore URL.", stderr)
	rawURL := fs.String("url", "", "PostgreSQL URL (default $SLUICE_POSTGRES_URL)")
	timeout := fs.Duration("timeout", time.Minute, "give up after this long")
	if code, ok := parseFlags(fs, args, false); !ok {
		return code
	}
	ctx, conn, done, code := connectPostgres("migrate", *rawURL, *timeout, stderr)
	if conn == nil {
		return code
	}
	defer done()
	res, err := postgres.Migrate(ctx, conn)
	for _, m := range res.Applied {
		fmt.Fprintf(stdout, "applied %04d_%s\n", m.Version, m.Name)
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice migrate: %v\n", err)
		return 1
	}
	if len(res.Applied) == 0 {
		fmt.Fprintf(stdout, "schema is up to date at version %d\n", res.Current)
	} else {
		fmt.Fprintf(stdout, "schema is at version %d\n", res.Current)
	}
	return 0
}
