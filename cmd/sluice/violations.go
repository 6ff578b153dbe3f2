package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/postgres"
)

func init() {
	commands["violations"] = command{"list the newest rate-limit violations recorded in PostgreSQL", runViolations}
}

func runViolations(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("violations", "usage: sluice violations [--since 1h] [--limit 50] [--user ID] [--ip ADDR] [--url postgres://...]\n\nReads the rejections recorded by a postgres store with\nsluice_violations=true on its URL.", stderr)
	rawURL := fs.String("url", "", "PostgreSQL URL (default $SLUICE_POSTGRES_URL)")
	since := fs.Duration("since", time.Hour, "how far back to look")
	limit := fs.Int("limit", 50, "show at most this many, newest first")
	userID := fs.String("user", "", "only this user's violations")
	ip := fs.String("ip", "", "only this client IP's violations")
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sluice violations: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *since <= 0 {
		fmt.Fprintf(stderr, "sluice violations: --since must be positive, got %v\n", *since)
		return 2
	}
	if *limit <= 0 || *limit > 100000 {
		fmt.Fprintf(stderr, "sluice violations: --limit must be between 1 and 100000, got %d\n", *limit)
		return 2
	}
	q := postgres.ViolationQuery{Since: time.Now().Add(-*since), UserID: *userID, Limit: *limit}
	if *ip != "" {
		a, err := netip.ParseAddr(*ip)
		if err != nil {
			fmt.Fprintf(stderr, "sluice violations: --ip: %v\n", err)
			return 2
		}
		q.IP = a
	}
	u, err := postgresURL(*rawURL)
	if err != nil {
		fmt.Fprintf(stderr, "sluice violations: %v\n", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		fmt.Fprintf(stderr, "sluice violations: connect: %v\n", err)
		return 1
	}
	defer conn.Close(context.WithoutCancel(ctx))
	vs, err := postgres.ListViolations(ctx, conn, q)
	if err != nil {
		fmt.Fprintf(stderr, "sluice violations: %v\n", err)
		return 1
	}
	if len(vs) == 0 {
		fmt.Fprintf(stdout, "no violations in the last %v\n", *since)
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tRULE\tBUCKET\tUSER\tIP\tENDPOINT\tTOKENS")
	for _, v := range vs {
		addr := "-"
		if v.IP.IsValid() {
			addr = v.IP.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			v.At.Local().Format("2006-01-02 15:04:05.000"), printable(v.Rule), printable(v.BucketKey),
			dash(v.UserID), addr, dash(v.Endpoint), strconv.FormatFloat(v.Tokens, 'f', -1, 64))
	}
	if err := tw.Flush(); err != nil {
		fmt.Fprintf(stderr, "sluice violations: %v\n", err)
		return 1
	}
	if len(vs) == *limit {
		fmt.Fprintf(stdout, "(the newest %d; --limit shows more)\n", *limit)
	}
	return 0
}

// dash makes a field safe for a terminal: "-" when empty, and escapes in
// place of control characters, since keys and endpoints come from clients.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return printable(s)
}

func printable(s string) string {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			q := strconv.QuoteToGraphic(s)
			return q[1 : len(q)-1]
		}
	}
	return s
}
