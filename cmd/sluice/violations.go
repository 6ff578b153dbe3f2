package main

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/sluicehq/sluice/internal/duration"
	"github.com/sluicehq/sluice/postgres"
)

func init() {
	commands["violations"] = command{"list the newest rate-limit violations recorded in PostgreSQL", runViolations}
}

func runViolations(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("violations", "usage: sluice violations [--since 1h] [--limit 50] [--user SUB] [--key VALUE] [--ip ADDR] [--url postgres://...]\n\nReads the rejections recorded by a postgres store with\nsluice_violations=true on its URL, newest first. The filters combine.\n\n--user is the verified JWT subject (the sub claim of a token that the jwt\nsection verified) and nothing else: a user named by a header or a query\nparameter (X-User: alice) is part of the bucket key, found with --key alice.", stderr)
	rawURL := fs.String("url", "", "PostgreSQL URL (default $SLUICE_POSTGRES_URL)")
	since := sinceFlag{d: time.Hour, text: time.Hour.String()}
	fs.Var(&since, "since", "how far back to look: a `duration` (90m, 36h, 1d, 2w), an RFC 3339 time (2025-01-02T15:04:05Z) or a date (2025-01-02, local midnight)")
	limit := fs.Int("limit", 50, "show at most this many, newest first")
	userID := fs.String("user", "", "only the violations of this verified JWT subject (not a header's or query's user: see --key)")
	key := fs.String("key", "", "only buckets keyed by this value of a limit_keys source (alice for X-User: alice), or this whole bucket key")
	ip := fs.String("ip", "", "only this client IP's violations")
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long")
	if code, ok := parseFlags(fs, args, false); !ok {
		return code
	}
	now := time.Now()
	from := since.from(now)
	if !from.Before(now) {
		fmt.Fprintf(stderr, "sluice violations: --since must be in the past, got %s\n", since.text)
		return 2
	}
	if *limit <= 0 || *limit > 100000 {
		fmt.Fprintf(stderr, "sluice violations: --limit must be between 1 and 100000, got %d\n", *limit)
		return 2
	}
	q := postgres.ViolationQuery{Since: from, UserID: *userID, Key: *key, Limit: *limit}
	if *ip != "" {
		a, err := netip.ParseAddr(*ip)
		if err != nil {
			fmt.Fprintf(stderr, "sluice violations: --ip: %v\n", err)
			return 2
		}
		q.IP = a
	}
	ctx, conn, done, code := connectPostgres("violations", *rawURL, *timeout, stderr)
	if conn == nil {
		return code
	}
	defer done()
	vs, err := postgres.ListViolations(ctx, conn, q)
	if errors.Is(err, postgres.ErrNotMigrated) {
		migrate := "sluice migrate --url ..."
		if *rawURL == "" {
			migrate = "sluice migrate" // it reads $SLUICE_POSTGRES_URL too
		}
		fmt.Fprintf(stderr, "sluice violations: %v: run `%s` with the same database URL (or serve once with sluice_migrate=true on the store URL), and sluice_violations=true to record rejections\n", postgres.ErrNotMigrated, migrate)
		return 1
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice violations: %v\n", err)
		return 1
	}
	if len(vs) == 0 {
		fmt.Fprintf(stdout, "no violations %s\n", since.describe())
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

// sinceFlag is --since: how far back (d > 0) or from when (at set).
type sinceFlag struct {
	d    time.Duration
	at   time.Time
	text string // as given
}

func (f *sinceFlag) String() string { return f.text }

func (f *sinceFlag) Set(s string) error {
	s = strings.TrimSpace(s)
	// A date alone is local midnight; a time names its zone.
	for _, layout := range []string{time.RFC3339Nano, time.DateOnly} {
		if t, err := time.ParseInLocation(layout, s, time.Local); err == nil {
			*f = sinceFlag{at: t, text: s}
			return nil
		}
	}
	d, err := parseAge(s)
	if err != nil {
		return err
	}
	if d <= 0 {
		return fmt.Errorf("must be positive, got %s", s)
	}
	*f = sinceFlag{d: d, text: s}
	return nil
}

// from returns the earliest time --since selects.
func (f *sinceFlag) from(now time.Time) time.Time {
	if !f.at.IsZero() {
		return f.at
	}
	return now.Add(-f.d)
}

func (f *sinceFlag) describe() string {
	if !f.at.IsZero() {
		return "since " + f.text
	}
	return "in the last " + f.text
}

// parseAge reads --since's durations, with days and weeks: "1d", "2w",
// "1w3d", "1d12h".
func parseAge(s string) (time.Duration, error) {
	d, err := duration.Parse(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration or an RFC 3339 time: write 90m, 36h, 1d, 2w, 2025-01-02T15:04:05Z or 2025-01-02", s)
	}
	return d, nil
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
