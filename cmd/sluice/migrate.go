package main

import (
	"context"
	"errors"
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

// postgresURL picks the database URL of the postgres commands: the flag,
// else $SLUICE_POSTGRES_URL. sluice's own URL parameters are removed.
func postgresURL(flagURL string) (string, error) {
	raw := flagURL
	if raw == "" {
		raw = os.Getenv("SLUICE_POSTGRES_URL")
	}
	if raw == "" {
		return "", errors.New("no database: give --url postgres://... or set SLUICE_POSTGRES_URL")
	}
	u, _, err := postgres.SplitURL(raw)
	return u, err
}

func runMigrate(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("migrate", "usage: sluice migrate [--url postgres://...] [--timeout 1m]\n\nCreates or upgrades sluice's tables in PostgreSQL; running it again changes\nnothing. serve can do the same at start with sluice_migrate=true on the\nstore URL.", stderr)
	rawURL := fs.String("url", "", "PostgreSQL URL (default $SLUICE_POSTGRES_URL)")
	timeout := fs.Duration("timeout", time.Minute, "give up after this long")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sluice migrate: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	u, err := postgresURL(*rawURL)
	if err != nil {
		fmt.Fprintf(stderr, "sluice migrate: %v\n", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		fmt.Fprintf(stderr, "sluice migrate: connect: %v\n", err)
		return 1
	}
	defer conn.Close(context.WithoutCancel(ctx))
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
